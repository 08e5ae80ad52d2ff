/* Fuzz target: structured output's grammar (worker/grammar.h). The input is a schema's text,
 * a newline, then a document (an empty first line: json_object). The schema compiles or is
 * refused with a message; the document is fed a byte at a time, and at each prefix the tokens
 * gram_allowed marks are exactly those a copy of the state accepts (a vocabulary of every
 * byte, every pair of the document's next bytes, and a few JSON pieces): else abort. */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/grammar.h"

static const char *const extra[] = {"{\"", "\":", "\": \"", "\",", ", \"", "true", "null",
				    "\"}", "}]", "\n  ", "-0.5e+3", "\\u00e9", "[]", "{}"};
#define N_EXTRA (sizeof extra / sizeof *extra)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *nl = memchr(data, '\n', size);
	if (!nl)
		return 0;
	size_t slen = (size_t)(nl - (const char *)data);
	const char *doc = nl + 1;
	size_t dlen = size - slen - 1;
	struct gram *g;
	char err[WK_ERRSZ];
	int rc = gram_compile(slen ? (const char *)data : NULL, slen, &g, err, sizeof err);
	if (rc != WK_OK) {
		if (!err[0])
			abort();
		return 0;
	}
	/* the vocabulary: 256 single bytes, the extras, then pairs of the document's bytes */
	int n = 256 + (int)N_EXTRA + (int)(dlen > 64 ? 64 : dlen);
	char (*pieces)[2] = malloc(sizeof *pieces * 256 + 1);
	const char **ptr = malloc(sizeof *ptr * (size_t)n);
	size_t *lens = malloc(sizeof *lens * (size_t)n);
	unsigned char *allowed = malloc((size_t)n);
	if (!pieces || !ptr || !lens || !allowed)
		abort();
	for (int i = 0; i < 256; i++) {
		pieces[i][0] = (char)i;
		ptr[i] = pieces[i];
		lens[i] = 1;
	}
	for (size_t i = 0; i < N_EXTRA; i++) {
		ptr[256 + i] = extra[i];
		lens[256 + i] = strlen(extra[i]);
	}
	for (int i = 256 + (int)N_EXTRA, k = 0; i < n; i++, k++) {
		ptr[i] = doc + k;
		lens[i] = (size_t)k + 1 < dlen ? 2 : 1;
	}
	struct gram_vocab *v;
	if (gram_vocab_new(ptr, lens, n, &v) != WK_OK)
		abort();
	struct gram_state s;
	gram_start(g, &s);
	for (size_t at = 0; at <= dlen && at < 256; at++) {
		int count = gram_allowed(g, v, &s, allowed), ones = 0;
		for (int id = 0; id < n; id++) {
			struct gram_state t = s;
			bool ok = gram_feed(g, &t, ptr[id], lens[id]);
			if (ok != (allowed[id] == 1))
				abort();
			ones += allowed[id];
		}
		if (ones != count)
			abort();
		(void)gram_complete(g, &s);
		if (at == dlen || !gram_feed(g, &s, doc + at, 1))
			break;
	}
	gram_vocab_free(v);
	free(allowed);
	free(lens);
	free(ptr);
	free(pieces);
	gram_free(g);
	return 0;
}
