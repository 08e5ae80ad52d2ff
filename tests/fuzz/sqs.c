/* Fuzz target: the sqs driver's pure parts. The bytes are a ReceiveMessage response for
 * queue_sqs_decode_receive (with a small and a large body limit), and, when short, an
 * sqs:// URL for queue_sqs_parse_url. Every decoded message must have a valid job id and a
 * receipt, and a body exactly when it is OK. */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/queue_impl.h"

static void check(const uint8_t *data, size_t size, size_t max_body)
{
	struct queue_sqs_msg *m;
	int n;
	char err[WK_ERRSZ];
	if (queue_sqs_decode_receive((const char *)data, size, max_body, &m, &n, err, sizeof err) != WK_OK) {
		if (n != 0 || m)
			abort();
		return;
	}
	if (n < 0 || n > QUEUE_SQS_RECEIVE_MAX)
		abort();
	for (int i = 0; i < n; i++) {
		const struct queue_sqs_msg *x = &m[i];
		if (!job_id_valid(x->id) || !x->receipt[0] || strlen(x->receipt) > QUEUE_HANDLE_MAX ||
		    x->attempt < 1)
			abort();
		if ((x->kind == QUEUE_SQS_MSG_OK) != (x->body != NULL))
			abort();
		if (x->body && (x->len > max_body || x->body[x->len] != 0))
			abort();
		if (x->kind == QUEUE_SQS_MSG_TOO_BIG && x->len <= max_body)
			abort();
	}
	queue_sqs_msgs_free(m, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check(data, size, 16);
	check(data, size, JOB_BODY_MAX);
	if (size < 1024) {
		char url[1024];
		memcpy(url, data, size);
		url[size] = 0;
		struct queue_sqs_url u;
		char err[WK_ERRSZ];
		if (queue_sqs_parse_url(url, &u, err, sizeof err) == WK_OK) {
			if (!u.host[0] || !u.account[0] || !u.queue[0] || !u.results[0] || !u.region[0] ||
			    !strcmp(u.queue, u.results) || u.port < 0 || u.port > 65535)
				abort();
		} else if (!err[0]) {
			abort();
		}
	}
	return 0;
}
