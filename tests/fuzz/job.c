/* Fuzz target: the job JSON decoder every queue driver uses, then the result encoder on what
 * it decoded: no crash, and every result encodes to valid JSON. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct job j;
	char err[WK_ERRSZ];
	enum job_err e = job_decode((const char *)data, size, NULL, &j, err, sizeof err);
	struct job_result r = {.id = j.id[0] ? j.id : "x",
			       .status = e == JOB_OK ? JOB_COMPLETED : JOB_FAILED,
			       .text = j.prompt ? j.prompt : "", .err = e, .message = err,
			       .worker = "fuzz", .attempt = 1};
	size_t len;
	char *json = job_encode_result(&r, &len);
	if (json) {
		json_t *back = json_loadb(json, len, 0, NULL);
		if (!back)
			abort(); /* the encoder must always produce valid JSON */
		json_decref(back);
		free(json);
	}
	job_free(&j);
	return 0;
}
