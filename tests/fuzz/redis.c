/* Fuzz target: what the Redis Streams driver decodes from the server, and the spool's file
 * names. The input is RESP bytes (as redis-server would send them) parsed by hiredis's own
 * reader into replies; each reply that is an array goes through queue_redis_decode_entry, the
 * pure decoder of one stream entry. The same bytes, cut at NULs, are tried as spool claim and
 * queued-job names. No crash, and a decoded entry's id is always a valid job id. */
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/job.h"
#include "worker/queue_impl.h"

static void entry(const redisReply *r)
{
	struct queue_redis_entry e;
	int k = queue_redis_decode_entry(r, 4096, &e);
	if (k == QUEUE_REDIS_ENTRY_OK && (!job_id_valid(e.id) || !e.body))
		abort();
	if (r->type == REDIS_REPLY_ARRAY) /* XREADGROUP nests entries in arrays */
		for (size_t i = 0; i < r->elements && i < 64; i++)
			if (r->element[i])
				entry(r->element[i]);
}

/* hiredis 0.14's reader allocates what a header announces (*N elements, $N bytes) before the
 * data arrives; the server is trusted to announce sane sizes, so inputs announcing more than
 * 64 Ki are not fed to it (libFuzzer would stop on the allocation, not on our code). */
static bool sane_headers(const uint8_t *d, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if ((i == 0 || d[i - 1] == '\n') && (d[i] == '*' || d[i] == '$')) {
			long long v = 0;
			size_t k = i + 1;
			if (k < n && d[k] == '-')
				continue;
			for (; k < n && d[k] >= '0' && d[k] <= '9' && v <= 65536; k++)
				v = v * 10 + (d[k] - '0');
			if (v > 65536)
				return false;
		}
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!sane_headers(data, size))
		return 0;
	redisReader *rd = redisReaderCreate();
	if (!rd)
		return 0;
	if (redisReaderFeed(rd, (const char *)data, size) == REDIS_OK) {
		void *reply;
		for (int n = 0; n < 16 && redisReaderGetReply(rd, &reply) == REDIS_OK && reply; n++) {
			entry(reply);
			freeReplyObject(reply);
		}
	}
	redisReaderFree(rd);

	char name[512], id[JOB_ID_MAX + 1];
	size_t n = size < sizeof name - 1 ? size : sizeof name - 1;
	memcpy(name, data, n);
	name[n] = 0;
	int attempt, prev;
	long pid;
	long long exp;
	if (queue_spool_parse_claim(name, id, &attempt, &pid, &exp) && !job_id_valid(id))
		abort();
	if (queue_spool_parse_new(name, id, &prev) && !job_id_valid(id))
		abort();
	return 0;
}
