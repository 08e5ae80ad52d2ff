/*
 * tok_fuzz.h - what the tokenizer fuzz targets do with ids a tokenizer gave: decode them both
 * ways (tok_decode keeping or skipping the special tokens, tok_decode_utf8 the other), and
 * free them. Only no crash, leak or bad read is asked of the decoders.
 */
#ifndef TOK_FUZZ_H
#define TOK_FUZZ_H

#include <stdbool.h>
#include <stdlib.h>

#include "common/wk.h"
#include "engine/tokenizer.h"

static inline void decode_both_and_free(const struct tok *t, int *ids, int n, bool special)
{
	char *s;
	size_t len;
	if (tok_decode(t, ids, n, !special, &s, &len, NULL, 0) == WK_OK)
		free(s);
	if (tok_decode_utf8(t, ids, n, special, &s, &len, NULL, 0) == WK_OK)
		free(s);
	free(ids);
}

#endif
