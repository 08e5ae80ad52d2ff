/* Fuzz target: the tokenizer on arbitrary bytes (encode, then decode must give the bytes back)
 * and on arbitrary ids (decode never fails on ids inside the vocabulary). The tokenizer is
 * wick's conversion of stories260K's tok512 (from $WICK_SHARED, default ../shared), made once
 * per process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static struct tok *tok;

static void load(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[1024], out[64];
	snprintf(bin, sizeof bin, "%s/models/stories260K/tok512.bin", sh);
	snprintf(out, sizeof out, "/tmp/wick-fuzz-tok-%d.json", (int)getpid());
	char err[WK_ERRSZ];
	if (tok_convert_llama2c(bin, 512, out, err, sizeof err) != WK_OK ||
	    tok_load(out, &tok, err, sizeof err) != WK_OK) {
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
