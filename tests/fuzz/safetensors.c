/* Fuzz target: the safetensors header parser (st_parse) on arbitrary bytes. Whatever it
 * accepts must describe tensors that lie inside the buffer. */
#include <stdlib.h>
#include <string.h>

#include "coldstart/safetensors.h"
#include "common/wk.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* An exact-size copy, so a one-byte overread is caught by the sanitizer. */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	struct st_file *f;
	char err[WK_ERRSZ];
	if (st_parse(buf, size, "fuzz", &f, err, sizeof err) == WK_OK) {
		for (size_t i = 0; i < st_count(f); i++) {
			const struct st_tensor *t = st_at(f, i);
			if ((const uint8_t *)t->data < buf || t->nbytes > size ||
			    (const uint8_t *)t->data + t->nbytes > buf + size)
				abort();
			if (st_find(f, t->name) == NULL)
				abort();
		}
		st_close(f);
	} else if (!err[0]) {
		abort(); /* a refusal always says why */
	}
	free(buf);
	return 0;
}
