/* Fuzz target: tokenizer.json as a model directory gives it (tok_load_buf: the BPE model,
 * normalizers, pre-tokenizers, post-processor, decoder and added tokens, whatever the bytes).
 * A tokenizer that loads is used as a worker would (fixed texts encoded with and without the
 * template, their ids decoded both ways), then written in the prepared form a snapshot holds
 * and read back: the prepared tokenizer must load and encode every text to the same ids,
 * since a cold start from a snapshot takes it in place of the tokenizer.json. No crash, no
 * leak; encode gives ids inside the vocabulary. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/tok_fuzz.h"

#define T(s) {s, sizeof s - 1}
static const struct {
	const char *s;
	size_t n;
} texts[] = {
	T(""), T("Hello world"), T("  two  spaces\n\nand lines\t"),
	T("h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd"), T("<s></s><unk><|endoftext|><|im_start|>"),
	T("abc'll 123456 !?"), T("\xff\xfe\xc3"), T("a\0b"),
};

/* Encodes texts[i] with t; NULL on failure (out of memory). *n its length. */
static int *encode(const struct tok *t, size_t i, bool special, int *n)
{
	int *ids = NULL;
	if (tok_encode(t, texts[i].s, texts[i].n, special, &ids, n, NULL, 0) != WK_OK) {
		free(ids);
		return NULL;
	}
	return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tok *t = NULL, *p = NULL;
	char err[WK_ERRSZ], *buf = NULL;
	size_t len;
	if (tok_load_buf("fuzz.json", (const char *)data, size, &t, err, sizeof err) != WK_OK) {
		if (t)
			abort(); /* a refusal gives no tokenizer */
		return 0;
	}
	if (tok_prepare(t, data, size, &buf, &len, err, sizeof err) == WK_OK &&
	    tok_load_prepared_mem(buf, len, data, size, &p, err, sizeof err) != WK_OK &&
	    !strstr(err, "out of memory"))
		abort(); /* what tok_prepare wrote must load */
	int vocab = tok_vocab_size(t);
	if (p && tok_vocab_size(p) != vocab)
		abort();
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
		for (int special = 0; special < 2; special++) {
			int n, m;
			int *ids = encode(t, i, special, &n);
			if (!ids)
				continue;
			for (int k = 0; k < n; k++)
				if (ids[k] < 0 || ids[k] >= vocab)
					abort();
			int *again = p ? encode(p, i, special, &m) : NULL;
			if (again && (m != n || memcmp(again, ids, (size_t)n * sizeof *ids)))
				abort(); /* the prepared form tokenizes as its tokenizer.json does */
			free(again);
			decode_both_and_free(t, ids, n, special);
		}
	free(buf);
	tok_free(p);
	tok_free(t);
	return 0;
}
