/*
 * tokenizer_codec.c - encode and decode: the Hugging Face pipeline stages around the model.
 *
 * Encode: split out added tokens (raw, then normalized), normalize, pre-tokenize, run the
 * model on each word, add the template's special tokens. Decode: map ids to strings and run
 * the decoder steps over the list of token strings, exactly as HF's decode_chain does.
 */
#include "engine/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer_int.h"

/* ---- normalizer -------------------------------------------------------------------------- */

/* Applies the normalizer steps to s[0..n) into out (cleared first). */
int tok_normalize(const struct tok *t, const char *s, size_t n, struct tok_buf *out,
		  struct tok_buf *tmp)
{
	out->n = 0;
	if (tok_buf_add(out, s, n) != WK_OK)
		return WK_ENOMEM;
	size_t cap = TOK_NORM_GROWTH * n + 65536;
	for (int k = 0; k < t->n_norm; k++) {
		const struct tok_step *st = &t->norm[k];
		if (out->n == 0)
			break; /* no normalizer step wick supports changes an empty string */
		tmp->n = 0;
		if (st->type == TOK_STEP_NFC) {
			if (tok_nfc(out->p, out->n, tmp) != WK_OK)
				return WK_ENOMEM;
		} else if (st->type == TOK_STEP_PREPEND) {
			if (tok_buf_add(tmp, st->s1, st->n1) != WK_OK ||
			    tok_buf_add(tmp, out->p, out->n) != WK_OK)
				return WK_ENOMEM;
		} else { /* TOK_STEP_REPLACE */
			size_t from = 0;
			const char *hit;
			while ((hit = memmem(out->p + from, out->n - from, st->s1, st->n1))) {
				size_t i = (size_t)(hit - out->p);
				if (tmp->n > cap)
					return WK_ELIMIT;
				if (tok_buf_add(tmp, out->p + from, i - from) != WK_OK ||
				    tok_buf_add(tmp, st->s2, st->n2) != WK_OK)
					return WK_ENOMEM;
				from = i + st->n1;
			}
			if (tok_buf_add(tmp, out->p + from, out->n - from) != WK_OK)
				return WK_ENOMEM;
		}
		if (tmp->n > cap)
			return WK_ELIMIT;
		struct tok_buf x = *out;
		*out = *tmp;
		*tmp = x;
	}
	return WK_OK;
}


/* ---- added-token matching ---------------------------------------------------------------- */

/* The code point of the valid UTF-8 character at p[0..n), or -1. */
static long codepoint(const unsigned char *p, size_t n)
{
	size_t len = tok_utf8_len(p, n);
	if (len == 0)
		return -1;
	if (len == 1)
		return p[0];
	long c = p[0] & (0x7F >> len);
	for (size_t i = 1; i < len; i++)
		c = c << 6 | (p[i] & 0x3F);
	return c;
}

/* Unicode White_Space, which is what Rust's regex \s matches. */
static bool is_space(long c)
{
	return tok_unicode_is_space(c);
}

static bool is_word(long c)
{
	return c >= 0 && tok_unicode_is_word(c);
}

/* Start of the character that ends at s[end) (a lone invalid byte counts as one). */
static size_t char_start_before(const unsigned char *s, size_t end)
{
	for (size_t k = 1; k <= 4 && k <= end; k++)
		if (tok_utf8_len(s + end - k, k) == k)
			return end - k;
	return end - 1;
}

/* Length of the whitespace run at the start of s[0..n). */
static size_t space_run_at_start(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		long c = codepoint(s + i, n - i);
		if (!is_space(c))
			break;
		i += tok_utf8_len(s + i, n - i);
	}
	return i;
}

/* Start of the whitespace run that ends s[0..n). */
static size_t space_run_at_end(const unsigned char *s, size_t n)
{
	while (n > 0) {
		size_t k = char_start_before(s, n);
		if (!is_space(codepoint(s + k, n - k)))
			break;
		n = k;
	}
	return n;
}

/* Leftmost-longest match of an added token in s[from..n): true with *start, *end, *idx. */
static bool find_added(const struct tok *t, const struct tok_matcher *m, const char *s,
		       size_t n, size_t from, size_t *start, size_t *end, int *idx)
{
	for (size_t i = from; i < n; i++) {
		unsigned char b = (unsigned char)s[i];
		for (int k = m->first[b]; k < m->first[b + 1]; k++) {
			const struct tok_added *a = &t->added[m->order[k]];
			if (a->plen <= n - i && !memcmp(s + i, a->pattern, a->plen)) {
				*start = i;
				*end = i + a->plen;
				*idx = m->order[k];
				return true;
			}
		}
	}
	return false;
}

/* ---- encode ------------------------------------------------------------------------------ */

struct enc {
	const struct tok *t;
	struct tok_ivec out;
	struct tok_scratch s;
	struct tok_buf nb, tmp, mb;
};

typedef int (*seg_fn)(struct enc *e, const char *s, size_t n, bool at_start);

/* Splits s[0..n) around the added tokens of matcher m, as HF's find_matches does: calls fn
 * on the text between tokens and appends each token's id. at_start: s begins the input. */
static int split_added(struct enc *e, const struct tok_matcher *m, bool use, const char *s,
		       size_t n, bool at_start, seg_fn fn)
{
	if (!use)
		return fn(e, s, n, at_start);
	const unsigned char *u = (const unsigned char *)s;
	size_t scan = 0, seg = 0, ms, me;
	int k;
	while (scan < n && find_added(e->t, m, s, n, scan, &ms, &me, &k)) {
		const struct tok_added *a = &e->t->added[k];
		scan = me;
		if (a->single_word) {
			bool before = ms > 0 && is_word(codepoint(u + char_start_before(u, ms),
							  ms - char_start_before(u, ms)));
			bool after = me < n && is_word(codepoint(u + me, n - me));
			if (before || after)
				continue;
		}
		size_t start = ms, stop = me;
		if (a->lstrip) {
			start = space_run_at_end(u, start);
			if (start < seg)
				start = seg;
		}
		if (a->rstrip)
			stop += space_run_at_start(u + stop, n - stop);
		if (seg < start) {
			int rc = fn(e, s + seg, start - seg, at_start && seg == 0);
			if (rc != WK_OK)
				return rc;
		}
		if (tok_ivec_push(&e->out, a->id) != WK_OK)
			return WK_ENOMEM;
		seg = stop;
		if (scan < stop)
			scan = stop;
	}
	return seg < n ? fn(e, s + seg, n - seg, at_start && seg == 0) : WK_OK;
}

/* Pre-tokenizer and model for one normalized piece of text. */
static int seg_model(struct enc *e, const char *s, size_t n, bool at_start)
{
	const struct tok *t = e->t;
	if (t->n_pre) /* s is in e->nb, so tmp and mb are free */
		return tok_bl_segment(t, s, n, &e->s, &e->tmp, &e->mb, &e->out);
	if (!t->metaspace)
		return tok_bpe_word(t, s, n, &e->s, &e->out);
	const char *r = t->meta_repl;
	size_t rn = t->meta_repl_len;
	struct tok_buf *b = &e->mb;
	b->n = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = s[i] == ' ' ? tok_buf_add(b, r, rn) : tok_buf_add(b, s + i, 1);
		if (rc != WK_OK)
			return rc;
	}
	bool starts = b->n >= rn && !memcmp(b->p, r, rn);
	if (!starts && b->n && (t->meta_scheme == TOK_PREPEND_ALWAYS ||
				(t->meta_scheme == TOK_PREPEND_FIRST && at_start))) {
		if (tok_buf_add(b, r, rn) != WK_OK)
			return WK_ENOMEM;
		memmove(b->p + rn, b->p, b->n - rn);
		memcpy(b->p, r, rn);
	}
	if (!t->meta_split)
		return tok_bpe_word(t, b->p, b->n, &e->s, &e->out);
	/* Split with the replacement merged into the word that follows it. */
	size_t from = 0;
	while (from < b->n) {
		size_t end = b->n;
		const char *hit = memmem(b->p + from + 1, b->n - from - 1, r, rn);
		if (hit)
			end = (size_t)(hit - b->p);
		int rc = tok_bpe_word(t, b->p + from, end - from, &e->s, &e->out);
		if (rc != WK_OK)
			return rc;
		from = end;
	}
	return WK_OK;
}

/* Normalizer, then the normalized added tokens, for one raw segment (its ids from the memo
 * when it holds them, and kept there when it may). */
static int seg_raw(struct enc *e, const char *s, size_t n, bool at_start)
{
	int rc = tok_memo_get(e->t, s, n, at_start, &e->out);
	if (rc)
		return rc > 0 ? WK_OK : rc;
	size_t from = e->out.n;
	rc = tok_normalize(e->t, s, n, &e->nb, &e->tmp);
	if (rc == WK_OK)
		rc = split_added(e, &e->t->norm_match, e->t->has_norm, e->nb.p, e->nb.n, at_start,
				 seg_model);
	if (rc == WK_OK)
		tok_memo_put(e->t, s, n, at_start, e->out.v ? e->out.v + from : NULL,
			     (int)(e->out.n - from));
	return rc;
}

int tok_encode(const struct tok *t, const char *text, size_t len, bool add_special,
	       int **ids, int *n, char *err, size_t errsz)
{
	*ids = NULL;
	*n = 0;
	if (len > TOK_MAX_TEXT)
		return wk_errf(err, errsz, WK_ELIMIT, "text of %zu bytes, more than the limit of %u",
			       len, TOK_MAX_TEXT);
	struct enc e = {.t = t};
	int rc = WK_OK;
	for (int i = 0; add_special && i < t->n_prefix && rc == WK_OK; i++)
		rc = tok_ivec_push(&e.out, t->prefix[i]);
	if (rc == WK_OK)
		rc = split_added(&e, &t->raw_match, t->has_raw, text, len, true, seg_raw);
	for (int i = 0; add_special && i < t->n_suffix && rc == WK_OK; i++)
		rc = tok_ivec_push(&e.out, t->suffix[i]);
	if (rc == WK_OK && !e.out.v)
		rc = tok_ivec_push(&e.out, 0) == WK_OK ? (e.out.n = 0, WK_OK) : WK_ENOMEM;
	tok_scratch_free(&e.s);
	free(e.nb.p);
	free(e.tmp.p);
	free(e.mb.p);
	if (rc != WK_OK) {
		free(e.out.v);
		if (rc == WK_ELIMIT)
			return wk_errf(err, errsz, rc, "tokenizer: the normalizer grew %zu bytes of "
				       "text past %d times their size (Replace steps whose content is "
				       "longer than their pattern)", len, TOK_NORM_GROWTH);
		return wk_errf(err, errsz, rc, "tokenizer: out of memory encoding %zu bytes", len);
	}
	*ids = e.out.v;
	*n = (int)e.out.n;
	return WK_OK;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* A list of token strings, stored back to back in b. */
struct tlist {
	struct tok_buf b;
	struct span {
		size_t off, len;
	} *sp;
	size_t n, cap;
};

static int tl_new(struct tlist *l)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct span *p = realloc(l->sp, cap * sizeof *p);
		if (!p)
			return WK_ENOMEM;
		l->sp = p;
		l->cap = cap;
	}
	l->sp[l->n++] = (struct span){.off = l->b.n, .len = 0};
	return WK_OK;
}

/* Appends bytes to the last token. */
static int tl_cat(struct tlist *l, const char *p, size_t n)
{
	if (tok_buf_add(&l->b, p, n) != WK_OK)
		return WK_ENOMEM;
	l->sp[l->n - 1].len += n;
	return WK_OK;
}

static int tl_add(struct tlist *l, const char *p, size_t n)
{
	return tl_new(l) == WK_OK ? tl_cat(l, p, n) : WK_ENOMEM;
}

static void tl_free(struct tlist *l)
{
	free(l->b.p);
	free(l->sp);
}

static int byte_token(const char *p, size_t n);

bool tok_is_byte_fallback(const struct tok *t, int id)
{
	const char *p = tok_piece(t, id);
	if (!p || byte_token(p, strlen(p)) < 0)
		return false;
	for (int k = 0; k < t->n_dec; k++)
		if (t->dec[k].type == TOK_STEP_BYTE_FALLBACK)
			return true;
	return false;
}

bool tok_is_skipped(const struct tok *t, int id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_F_SKIP);
}

/* The byte of a "<0xXX>" token, or -1. Mirrors HF: the token is 6 bytes, "<0x" .. ">",
 * and the middle parses as u8 in base 16 (Rust's from_str_radix takes a leading '+'). */
static int byte_token(const char *p, size_t n)
{
	if (n != 6 || memcmp(p, "<0x", 3) || p[5] != '>')
		return -1;
	int v = 0;
	for (int i = 3; i < 5; i++) {
		char c = p[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
			c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0) {
			if (i == 3 && c == '+')
				continue;
			return -1;
		}
		v = v * 16 + d;
	}
	return v;
}

/* Appends p[0..n) to out as Rust's String::from_utf8_lossy does: each maximal prefix of a
 * valid sequence that does not complete (or a byte that starts none) becomes one U+FFFD. */
static int lossy_utf8(const char *p, size_t n, struct tok_buf *out)
{
	const unsigned char *u = (const unsigned char *)p;
	size_t i = 0, from = 0;
	while (i < n) {
		size_t k = tok_utf8_len(u + i, n - i);
		if (k) {
			i += k;
			continue;
		}
		/* how much of a valid sequence u[i..] starts: the lead byte, then the bytes in
		 * the ranges tok_utf8_len allows */
		size_t bad = 1;
		unsigned c = u[i], lo = 0x80, hi = 0xBF, need = 0;
		if (c >= 0xC2 && c <= 0xDF)
			need = 1;
		else if (c >= 0xE0 && c <= 0xEF)
			need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
		else if (c >= 0xF0 && c <= 0xF4)
			need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
		if (need && i + 1 < n && u[i + 1] >= lo && u[i + 1] <= hi) {
			bad = 2;
			while (bad <= need && i + bad < n && (u[i + bad] & 0xC0) == 0x80)
				bad++;
		}
		if (tok_buf_add(out, p + from, i - from) != WK_OK ||
		    tok_buf_add(out, "\xEF\xBF\xBD", 3) != WK_OK)
			return WK_ENOMEM;
		i += bad;
		from = i;
	}
	return tok_buf_add(out, p + from, n - from);
}

/* ByteLevel: every token's characters back to bytes, fused into one token. */
static int step_byte_level(const struct tok *t, const struct tlist *in, struct tlist *out,
			   bool utf8)
{
	struct tok_buf raw = {0};
	int rc = WK_OK;
	for (size_t i = 0; i < in->n && rc == WK_OK; i++)
		rc = tok_bl_decode_token(t, in->b.p + in->sp[i].off, in->sp[i].len, &raw);
	if (rc == WK_OK)
		rc = tl_new(out);
	if (rc == WK_OK) {
		size_t start = out->b.n;
		rc = utf8 ? lossy_utf8(raw.p ? raw.p : "", raw.n, &out->b)
			  : tok_buf_add(&out->b, raw.p ? raw.p : "", raw.n);
		out->sp[out->n - 1].len = out->b.n - start;
	}
	free(raw.p);
	return rc;
}

static bool valid_utf8(const char *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		size_t k = tok_utf8_len((const unsigned char *)p + i, n - i);
		if (!k)
			return false;
		i += k;
	}
	return true;
}

/* Emits a run of byte-fallback bytes as one token; with utf8, an invalid run becomes one
 * U+FFFD per byte as in HF. */
static int flush_bytes(struct tlist *out, struct tok_buf *run, bool utf8)
{
	int rc = WK_OK;
	if (!run->n)
		return WK_OK;
	if (!utf8 || valid_utf8(run->p, run->n))
		rc = tl_add(out, run->p, run->n);
	else
		for (size_t i = 0; i < run->n && rc == WK_OK; i++)
			rc = tl_add(out, "\xEF\xBF\xBD", 3);
	run->n = 0;
	return rc;
}

static int step_byte_fallback(const struct tlist *in, struct tlist *out, bool utf8)
{
	struct tok_buf run = {0};
	int rc = WK_OK;
	for (size_t i = 0; i < in->n && rc == WK_OK; i++) {
		const char *p = in->b.p + in->sp[i].off;
		int b = byte_token(p, in->sp[i].len);
		if (b >= 0) {
			unsigned char c = (unsigned char)b;
			rc = tok_buf_add(&run, &c, 1);
		} else {
			rc = flush_bytes(out, &run, utf8);
			if (rc == WK_OK)
				rc = tl_add(out, p, in->sp[i].len);
		}
	}
	if (rc == WK_OK)
		rc = flush_bytes(out, &run, utf8);
	free(run.p);
	return rc;
}

/* Length of the "character" at p: a valid UTF-8 sequence, or one stray byte. */
static size_t char_len(const char *p, size_t n)
{
	size_t k = tok_utf8_len((const unsigned char *)p, n);
	return k ? k : 1;
}

static int step_strip(const struct tok_step *st, const struct tlist *in, struct tlist *out)
{
	for (size_t i = 0; i < in->n; i++) {
		const char *p = in->b.p + in->sp[i].off;
		size_t a = 0, z = in->sp[i].len;
		for (int k = 0; k < st->start && a < z; k++) {
			if (z - a < st->n1 || memcmp(p + a, st->s1, st->n1))
				break;
			a += st->n1;
		}
		for (int k = 0; k < st->stop && z > a; k++) {
			if (z - a < st->n1 || memcmp(p + z - st->n1, st->s1, st->n1))
				break;
			z -= st->n1;
		}
		if (tl_add(out, p + a, z - a) != WK_OK)
			return WK_ENOMEM;
	}
	return WK_OK;
}

/* Replace, and Metaspace (which drops the replacement in token 0 unless scheme never). */
static int step_replace(const struct tok_step *st, const struct tlist *in, struct tlist *out)
{
	bool meta = st->type == TOK_STEP_METASPACE;
	for (size_t i = 0; i < in->n; i++) {
		const char *p = in->b.p + in->sp[i].off;
		size_t n = in->sp[i].len;
		const char *to = meta ? " " : st->s2;
		size_t ton = meta ? (i == 0 && !st->prepend_never ? 0 : 1) : st->n2;
		if (tl_new(out) != WK_OK)
			return WK_ENOMEM;
		size_t j = 0;
		while (j < n) {
			if (n - j >= st->n1 && !memcmp(p + j, st->s1, st->n1)) {
				if (tl_cat(out, to, ton) != WK_OK)
					return WK_ENOMEM;
				j += st->n1;
			} else {
				size_t k = char_len(p + j, n - j);
				if (tl_cat(out, p + j, k) != WK_OK)
					return WK_ENOMEM;
				j += k;
			}
		}
	}
	return WK_OK;
}

static int decode(const struct tok *t, const int *ids, int n, bool skip_special, bool utf8,
		  char **text, size_t *len, char *err, size_t errsz)
{
	*text = NULL;
	*len = 0;
	if (n < 0)
		return wk_errf(err, errsz, WK_EINVAL, "tokenizer: negative token count");
	struct tlist a = {0}, b = {0};
	int rc = WK_OK;
	for (int i = 0; i < n; i++) {
		int id = ids[i];
		if (id < 0 || id >= t->n_ids || t->dec_off[id] == TOK_NO_PIECE) {
			tl_free(&a);
			return wk_errf(err, errsz, WK_EINVAL, "token id %d is not in the vocabulary "
				       "(size %d)", id, t->n_ids);
		}
		if (skip_special && (t->flags[id] & TOK_F_SKIP))
			continue;
		if (tl_add(&a, t->strs.p + t->dec_off[id], t->dec_len[id]) != WK_OK) {
			rc = WK_ENOMEM;
			break;
		}
	}
	for (int k = 0; k < t->n_dec && rc == WK_OK; k++) {
		const struct tok_step *st = &t->dec[k];
		b.b.n = 0;
		b.n = 0;
		switch (st->type) {
		case TOK_STEP_BYTE_FALLBACK:
			rc = step_byte_fallback(&a, &b, utf8);
			break;
		case TOK_STEP_FUSE:
			rc = tl_new(&b);
			if (rc == WK_OK)
				rc = tl_cat(&b, a.b.p ? a.b.p : "", a.b.n);
			break;
		case TOK_STEP_STRIP:
			rc = step_strip(st, &a, &b);
			break;
		case TOK_STEP_BYTE_LEVEL:
			rc = step_byte_level(t, &a, &b, utf8);
			break;
		default: /* TOK_STEP_REPLACE, TOK_STEP_METASPACE */
			rc = step_replace(st, &a, &b);
			break;
		}
		struct tlist x = a;
		a = b;
		b = x;
	}
	/* The tokens are joined: with "" after a decoder, with " " when there is none. */
	struct tok_buf res = {0};
	for (size_t i = 0; i < a.n && rc == WK_OK; i++) {
		if (i && !t->has_decoder)
			rc = tok_buf_add(&res, " ", 1);
		if (rc == WK_OK)
			rc = tok_buf_add(&res, a.b.p + a.sp[i].off, a.sp[i].len);
	}
	if (rc == WK_OK && !res.p)
		rc = tok_buf_add(&res, "", 0);
	tl_free(&a);
	tl_free(&b);
	if (rc != WK_OK) {
		free(res.p);
		return wk_errf(err, errsz, WK_ENOMEM, "tokenizer: out of memory decoding %d ids", n);
	}
	*text = res.p;
	*len = res.n;
	return WK_OK;
}

int tok_decode(const struct tok *t, const int *ids, int n, bool skip_special, char **text,
	       size_t *len, char *err, size_t errsz)
{
	return decode(t, ids, n, skip_special, false, text, len, err, errsz);
}

int tok_decode_utf8(const struct tok *t, const int *ids, int n, bool skip_special,
		    char **text, size_t *len, char *err, size_t errsz)
{
	return decode(t, ids, n, skip_special, true, text, len, err, errsz);
}
