/* Fuzz target: the prepared tokenizer's loader (engine/tokenizer_prepared.c) on arbitrary
 * tables. The input is taken as a payload and given a valid header (magic, version, its size
 * and XXH3), so that the field checks, not the checksum, stand between the bytes and the
 * tables; an input that starts with the magic is taken as a whole file instead, so that the
 * header's checks are fuzzed too. A refusal must say why and give no tokenizer. A tokenizer
 * that loads is then used as a worker would: fixed texts encoded with and without the
 * template, their ids decoded both ways, ids taken from the input decoded, pieces and ids
 * looked up. A fuzzed table need not round trip: only no crash, no leak, no read out of
 * bounds is required, and that encode gives ids inside the vocabulary. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/tok_fuzz.h"

#define HDR 48     /* tokenizer_prepared.c's header */
#define VERSION 1  /* and its format version */
static const char magic[8] = "WICKTOKN";

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

#define T(s) {s, sizeof s - 1}
static const struct {
	const char *s;
	size_t n;
} texts[] = {
	T("Once upon a time, there was a little dog. I'm sure they'll say 12345!"),
	T("caf\xc3\xa9 cafe\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 "
	  "\xe2\x96\x81x \xc5\xbf"),
	T("bytes \xff\xfe\xc3 \xe2\x96 \xed\xa0\x80 \xf4\x90\x80\x80 and a \0 NUL"),
	T("<s>hi</s> <unk>[gMASK]<sop><think>x</think><|endoftext|><0x41>"),
	T("  \n\t\r\n  x  \r\n"),
	T(""),
};

/* Encodes and decodes through t; aborts only on an id outside the vocabulary. */
static void use(const struct tok *t, const uint8_t *data, size_t size)
{
	int nv = tok_vocab_size(t);
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
		for (int special = 0; special < 2; special++) {
			int *ids, n;
			if (tok_encode(t, texts[i].s, texts[i].n, special, &ids, &n, NULL, 0) != WK_OK)
				continue;
			for (int k = 0; k < n; k++)
				if (ids[k] < 0 || ids[k] >= nv)
					abort(); /* every id in the tables is checked at load */
			decode_both_and_free(t, ids, n, special);
		}
	/* ids from the input's first bytes, and their pieces looked up and back */
	int raw[64], m = 0;
	for (size_t i = 0; nv > 0 && m < 64 && i + 1 < size; i += 2)
		raw[m++] = (data[i] | data[i + 1] << 8) % nv;
	for (int k = 0; k < m; k++) {
		const char *p = tok_piece(t, raw[k]);
		if (p)
			tok_id(t, p);
		tok_is_special(t, raw[k]);
	}
	char *s;
	size_t len;
	if (tok_decode(t, raw, m, false, &s, &len, NULL, 0) == WK_OK)
		free(s);
	if (tok_decode_utf8(t, raw, m, true, &s, &len, NULL, 0) == WK_OK)
		free(s);
	int edge[] = {-1, nv, nv - 1, 0, tok_bos(t), tok_eos(t)};
	for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) {
		tok_piece(t, edge[k]);
		if (tok_decode(t, &edge[k], 1, true, &s, &len, NULL, 0) == WK_OK)
			free(s);
	}
	static const char *const names[] = {"<s>", "</s>", "<unk>", "<0x41>", "\xe2\x96\x81", ""};
	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
		tok_id(t, names[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bool whole = size >= 8 && !memcmp(data, magic, 8);
	size_t len = whole ? size : HDR + size;
	/* An exact-size copy, so a one-byte overread is caught by the sanitizer. */
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return 0;
	if (whole) {
		memcpy(buf, data, size);
	} else {
		memcpy(buf, magic, 8);
		put_le(buf + 8, VERSION, 4);
		put_le(buf + 12, 0, 4);
		put_le(buf + 16, 0, 8); /* the tokenizer.json's size and hash: unchecked (json NULL) */
		put_le(buf + 24, 0, 8);
		put_le(buf + 32, size, 8);
		put_le(buf + 40, XXH3_64bits(data, size), 8);
		if (size)
			memcpy(buf + HDR, data, size);
	}
	struct tok *t = (struct tok *)1; /* must be set to NULL on a refusal */
	char err[WK_ERRSZ] = "";
	int rc = tok_load_prepared_mem(buf, len, NULL, 0, &t, err, sizeof err);
	/* the tokenizer holds nothing of the file (tok_load_prepared unmaps it after loading):
	 * freed now, ASan sees any use of it */
	free(buf);
	if (rc != WK_OK) {
		if (t || !err[0] || (rc != WK_EFORMAT && rc != WK_EUNSUPPORTED && rc != WK_ENOMEM))
			abort(); /* a refusal gives no tokenizer and says why */
		return 0;
	}
	use(t, data, size);
	tok_free(t);
	return 0;
}
