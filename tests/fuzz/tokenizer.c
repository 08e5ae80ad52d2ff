/* Fuzz target: the tokenizer on arbitrary bytes (encode, then decode must give the bytes back)
 * and on arbitrary ids (decode never fails on ids inside the vocabulary); the bytes repeated
 * past TOK_MEMO_MIN, twice around an added token, encode to the same ids through the memo
 * (tok_memo_set, small enough to evict) as without it. The tokenizer is
 * wick's conversion of stories260K's tok512 (from $WICK_SHARED, default ../shared), made once
 * per process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static struct tok *tok, *memo;

static void load(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[1024], out[64];
	snprintf(bin, sizeof bin, "%s/models/stories260K/tok512.bin", sh);
	snprintf(out, sizeof out, "/tmp/wick-fuzz-tok-%d.json", (int)getpid());
	char err[WK_ERRSZ];
	if (tok_convert_llama2c(bin, 512, out, err, sizeof err) != WK_OK ||
	    tok_load(out, &tok, err, sizeof err) != WK_OK ||
	    tok_load(out, &memo, err, sizeof err) != WK_OK ||
	    tok_memo_set(memo, 16 << 10) != WK_OK) {
		fprintf(stderr, "fuzz tokenizer: %s\n", err);
		abort();
	}
	unlink(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!tok)
		load();
	int *ids, n;
	char *text;
	size_t len;
	if (tok_encode(tok, (const char *)data, size, false, &ids, &n, NULL, 0) == WK_OK) {
		if (tok_decode(tok, ids, n, false, &text, &len, NULL, 0) != WK_OK)
			abort();
		/* Round trip, except where the input spells an added token such as "<s>". */
		if (!memmem(data, size, "<s>", 3) && !memmem(data, size, "</s>", 4) &&
		    !memmem(data, size, "<unk>", 5) && !memmem(data, size, "\xe2\x96\x81", 3) &&
		    (len != size || memcmp(text, data, size)))
			abort();
		free(text);
		free(ids);
	}
	/* Long segments, through the memo and without it. */
	if (size) {
		size_t reps = TOK_MEMO_MIN / size + 1, seg = reps * size, tl = 2 * seg + 4;
		char *t = malloc(tl);
		for (size_t r = 0; r < reps; r++)
			memcpy(t + r * size, data, size);
		memcpy(t + seg, "</s>", 4);
		memcpy(t + seg + 4, t, seg);
		int *a, *b, na, nb;
		int ra = tok_encode(tok, t, tl, true, &a, &na, NULL, 0);
		int rb = tok_encode(memo, t, tl, true, &b, &nb, NULL, 0);
		if (ra != rb || (ra == WK_OK && (na != nb || memcmp(a, b, (size_t)na * sizeof *a))))
			abort();
		if (ra == WK_OK) {
			free(a);
			free(b);
		}
		free(t);
	}
	/* The same bytes as ids. */
	int m = (int)(size / 2);
	int *raw = malloc(sizeof(int) * (size_t)(m ? m : 1));
	for (int i = 0; i < m; i++)
		raw[i] = (data[2 * i] | data[2 * i + 1] << 8) % tok_vocab_size(tok);
	if (tok_decode_utf8(tok, raw, m, true, &text, &len, NULL, 0) != WK_OK)
		abort();
	free(text);
	free(raw);
	return 0;
}
