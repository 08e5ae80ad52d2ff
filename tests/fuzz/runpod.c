/* Fuzz target: the RunPod job-take decoder (worker/queue_http.c) with a small body limit, then
 * the wick job decoder on every job it accepts. Checks the decoder's promises: an OK job has
 * a valid id and a JSON object body carrying that id; the others have a reason and no body,
 * and only NO_ID has no id. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/job.h"
#include "worker/queue_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct queue_http_job *x;
	int n;
	char err[WK_ERRSZ];
	if (queue_http_decode_take((const char *)data, size, 2048, &x, &n, err, sizeof err) != WK_OK) {
		if (n != 0 || x != NULL || !err[0])
			abort();
		return 0;
	}
	for (int i = 0; i < n; i++) {
		if (x[i].kind == QUEUE_HTTP_JOB_OK) {
			if (!job_id_valid(x[i].id) || !x[i].body || x[i].len != strlen(x[i].body) || x[i].len > 2048)
				abort();
			json_t *o = json_loadb(x[i].body, x[i].len, 0, NULL);
			const char *id = json_string_value(json_object_get(o, "id"));
			if (!json_is_object(o) || !id || strcmp(id, x[i].id))
				abort();
			json_decref(o);
			struct job j;
			job_decode(x[i].body, x[i].len, x[i].id, &j, err, sizeof err);
			job_free(&j);
		} else {
			if (x[i].body || !x[i].why[0] || (x[i].kind == QUEUE_HTTP_JOB_NO_ID) != !x[i].id[0])
				abort();
		}
	}
	queue_http_jobs_free(x, n);
	return 0;
}
