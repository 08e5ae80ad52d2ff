/*
 * tokenizer_bytelevel.c - the byte-level kind (GPT-2, Qwen, GLM): the pre-tokenizer regexes,
 * matched by hand, and the byte alphabet.
 *
 * Hugging Face runs these regexes with Oniguruma (pre_tokenizers/split.rs, byte_level.rs).
 * wick recognises the two pattern families written out in tokenizer_int.h, by their exact
 * text, and matches them with code that follows the backtracking semantics of each
 * alternative (leftmost alternative that matches wins; greedy quantifiers give back only what
 * a later item needs). Every pattern of both families matches a non-empty string at every
 * position, so a find_iter is a walk from one match end to the next and the Isolated Split
 * leaves no gaps. Character classes come from tokenizer_unicode.c (Unicode 16.0, as HF's
 * Oniguruma); a byte that is not valid UTF-8 counts as a character outside \p{L}, \p{N} and
 * \s (HF only takes valid Unicode, so this only decides what wick does with such input).
 *
 * The byte alphabet (byte_level.rs bytes_char): the printable bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF stand for themselves; the other 68 bytes, in order, are U+0100 onwards.
 */
#include <stdio.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer_int.h"

/* ---- the byte alphabet ------------------------------------------------------------------- */

void tok_bl_alphabet(struct tok *t)
{
	int next = 256;
	for (int c = 0; c < 0x144; c++)
		t->bl_byte[c] = -1;
	for (int b = 0; b < 256; b++) {
		bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
		int c = printable ? b : next++;
		t->bl_cp[b] = (uint16_t)c;
		t->bl_byte[c] = (int16_t)b;
		if (c < 0x80) {
			t->bl_utf8[b][0] = (char)c;
			t->bl_len[b] = 1;
		} else {
			t->bl_utf8[b][0] = (char)(0xC0 | c >> 6);
			t->bl_utf8[b][1] = (char)(0x80 | (c & 0x3F));
			t->bl_len[b] = 2;
		}
	}
}

int tok_bl_decode_token(const struct tok *t, const char *p, size_t n, struct tok_buf *out)
{
	size_t start = out->n;
	const unsigned char *u = (const unsigned char *)p;
	for (size_t i = 0; i < n;) {
		size_t len;
		long c = tok_utf8_decode(u + i, n - i, &len);
		if (c < 0 || c >= 0x144 || t->bl_byte[c] < 0) {
			out->n = start; /* a character outside the alphabet: the token as it is */
			return tok_buf_add(out, p, n);
		}
		unsigned char b = (unsigned char)t->bl_byte[c];
		if (tok_buf_add(out, &b, 1) != WK_OK)
			return WK_ENOMEM;
		i += len;
	}
	return WK_OK;
}

/* ---- recognising a pattern --------------------------------------------------------------- */

static const struct {
	const char *text;
	enum tok_re_case mode;
} contraction_forms[] = {
	{"'s|'t|'re|'ve|'m|'ll|'d", TOK_RE_CASE_EXACT},
	{"(?:'s|'t|'re|'ve|'m|'ll|'d)", TOK_RE_CASE_EXACT},
	{"(?i:'s|'t|'re|'ve|'m|'ll|'d)", TOK_RE_CASE_FOLD},
	{"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])", TOK_RE_CASE_ASCII},
	{"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]", TOK_RE_CASE_ASCII},
};
static const char *const digit_forms[] = {"\\p{N}", "\\p{N}{1,3}", "\\p{N}+"};
static const int digit_max[] = {1, 3, 0};
static const char gpt2_rest[] =
	"| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char gpt4_letters[] = "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
static const char gpt4_rest[] = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool tok_regex_parse(const char *pattern, struct tok_regex *re)
{
	char want[512];
	size_t nc = sizeof contraction_forms / sizeof contraction_forms[0];
	for (size_t i = 0; i < nc; i++) {
		const char *c = contraction_forms[i].text;
		enum tok_re_case mode = contraction_forms[i].mode;
		snprintf(want, sizeof want, "%s%s", c, gpt2_rest);
		if (!strcmp(pattern, want)) {
			*re = (struct tok_regex){.family = TOK_RE_GPT2, .contractions = mode,
						 .max_digits = 0};
			return true;
		}
		for (size_t d = 0; d < 3; d++) {
			snprintf(want, sizeof want, "%s%s%s%s", c, gpt4_letters, digit_forms[d],
				 gpt4_rest);
			if (!strcmp(pattern, want)) {
				*re = (struct tok_regex){.family = TOK_RE_GPT4, .contractions = mode,
							 .max_digits = digit_max[d]};
				return true;
			}
		}
	}
	return false;
}

/* ---- matching ---------------------------------------------------------------------------- */

#define END_CP (-1000) /* past the end of the text; no class */

struct text {
	const unsigned char *s;
	size_t n;
};

static long cp_at(const struct text *x, size_t i, size_t *len)
{
	if (i >= x->n) {
		*len = 0;
		return END_CP;
	}
	return tok_utf8_decode(x->s + i, x->n - i, len);
}

static int cls(long c)
{
	return c == END_CP ? -1 : (int)tok_unicode_class(c);
}

/* End of the run of characters of class k that starts at i; at most max of them (0: any). */
static size_t run_end(const struct text *x, size_t i, int k, int max)
{
	int count = 0;
	while (i < x->n && (max == 0 || count < max)) {
		size_t len;
		if (cls(cp_at(x, i, &len)) != k)
			break;
		i += len;
		count++;
	}
	return i;
}

/* The contraction's letter, folded as the pattern's case mode allows, or 0. */
static int fold(long c, enum tok_re_case mode)
{
	if (c >= 'a' && c <= 'z')
		return (int)c;
	if (mode == TOK_RE_CASE_EXACT)
		return 0;
	if (c >= 'A' && c <= 'Z')
		return (int)(c - 'A' + 'a');
	if (mode == TOK_RE_CASE_FOLD && c == 0x17F) /* LATIN SMALL LETTER LONG S folds to s */
		return 's';
	return 0;
}

/* Length of 's 't 're 've 'm 'll 'd at i (s[i] is '\''), or 0. */
static size_t contraction(const struct text *x, size_t i, enum tok_re_case mode)
{
	size_t l1, l2;
	int a = fold(cp_at(x, i + 1, &l1), mode);
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return 1 + l1;
	if (a != 'r' && a != 'v' && a != 'l')
		return 0;
	int b = fold(cp_at(x, i + 1 + l1, &l2), mode);
	if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
		return 1 + l1 + l2;
	return 0;
}

/* The \s alternatives at i, where a whitespace run starts:
 *   GPT-4 only: \s*[\r\n]+  -> up to and including the run's last \r or \n;
 *   \s+(?!\S)               -> the whole run at the end of the text, else all but its last
 *                              character when it has two or more;
 *   \s+                     -> the whole run. */
static size_t space_alts(const struct text *x, size_t i, bool newline_alt)
{
	size_t j = i, last = i, nl_end = 0, count = 0, len;
	while (j < x->n) {
		long c = cp_at(x, j, &len);
		if (cls(c) != TOK_UC_SPACE)
			break;
		last = j;
		j += len;
		count++;
		if (c == '\r' || c == '\n')
			nl_end = j;
	}
	if (newline_alt && nl_end)
		return nl_end;
	if (j == x->n)
		return j;
	return count >= 2 ? last : j;
}

static size_t next_gpt4(const struct tok_regex *re, const struct text *x, size_t i)
{
	size_t l0, l1;
	long c0 = cp_at(x, i, &l0);
	if (c0 == '\'') {
		size_t m = contraction(x, i, re->contractions);
		if (m)
			return i + m;
	}
	int k0 = cls(c0);
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	if (k0 != TOK_UC_LETTER && k0 != TOK_UC_NUMBER && c0 != '\r' && c0 != '\n' &&
	    cls(cp_at(x, i + l0, &l1)) == TOK_UC_LETTER)
		return run_end(x, i + l0, TOK_UC_LETTER, 0);
	if (k0 == TOK_UC_LETTER)
		return run_end(x, i, TOK_UC_LETTER, 0);
	/* \p{N}, \p{N}{1,3} or \p{N}+ */
	if (k0 == TOK_UC_NUMBER)
		return run_end(x, i, TOK_UC_NUMBER, re->max_digits);
	/* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
	size_t j = i;
	if (c0 == ' ' && cls(cp_at(x, i + 1, &l1)) == TOK_UC_OTHER)
		j = i + 1;
	if (j > i || k0 == TOK_UC_OTHER) {
		j = run_end(x, j, TOK_UC_OTHER, 0);
		while (j < x->n && (x->s[j] == '\r' || x->s[j] == '\n'))
			j++;
		return j;
	}
	return space_alts(x, i, true); /* c0 is whitespace */
}

static size_t next_gpt2(const struct tok_regex *re, const struct text *x, size_t i)
{
	size_t l0, l1;
	long c0 = cp_at(x, i, &l0);
	if (c0 == '\'') {
		size_t m = contraction(x, i, re->contractions);
		if (m)
			return i + m;
	}
	/* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the optional space goes with a run of any
	 * of the three classes */
	size_t j = i;
	int k = cls(c0);
	if (c0 == ' ') {
		int k1 = cls(cp_at(x, i + 1, &l1));
		if (k1 == TOK_UC_LETTER || k1 == TOK_UC_NUMBER || k1 == TOK_UC_OTHER) {
			j = i + 1;
			k = k1;
		}
	}
	if (k != TOK_UC_SPACE)
		return run_end(x, j, k, 0);
	return space_alts(x, i, false);
}

size_t tok_regex_next(const struct tok_regex *re, const unsigned char *s, size_t n, size_t pos)
{
	struct text x = {.s = s, .n = n};
	size_t e = re->family == TOK_RE_GPT4 ? next_gpt4(re, &x, pos) : next_gpt2(re, &x, pos);
	return e > pos ? e : pos + 1; /* never happens: every position matches */
}

/* ---- pre-tokenizing a segment ------------------------------------------------------------ */

struct bl_ctx {
	const struct tok *t;
	struct tok_scratch *sc;
	struct tok_buf *pre, *map;
	struct tok_ivec *out;
};

/* One word through the byte alphabet (when the last step is ByteLevel) and BPE. */
static int word(struct bl_ctx *c, const char *w, size_t n, bool byte_level)
{
	if (!byte_level)
		return tok_bpe_word(c->t, w, n, c->sc, c->out);
	struct tok_buf *m = c->map;
	m->n = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char b = (unsigned char)w[i];
		if (tok_buf_add(m, c->t->bl_utf8[b], c->t->bl_len[b]) != WK_OK)
			return WK_ENOMEM;
	}
	return tok_bpe_word(c->t, m->p, m->n, c->sc, c->out);
}

static int step(struct bl_ctx *c, int k, const char *s, size_t n)
{
	const struct tok *t = c->t;
	if (n == 0)
		return WK_OK;
	if (k == t->n_pre)
		return word(c, s, n, false);
	const struct tok_pre *p = &t->pre[k];
	const unsigned char *u = (const unsigned char *)s;
	if (p->type == TOK_PRE_SPLIT) {
		for (size_t pos = 0, e; pos < n; pos = e) {
			e = tok_regex_next(&p->re, u, n, pos);
			int rc = step(c, k + 1, s + pos, e - pos);
			if (rc != WK_OK)
				return rc;
		}
		return WK_OK;
	}
	/* ByteLevel, the last step: HF prepends the space to each piece it is given. */
	if (p->prefix_space && s[0] != ' ') {
		c->pre->n = 0;
		if (tok_buf_add(c->pre, " ", 1) != WK_OK || tok_buf_add(c->pre, s, n) != WK_OK)
			return WK_ENOMEM;
		s = c->pre->p;
		n = c->pre->n;
		u = (const unsigned char *)s;
	}
	if (!p->use_regex)
		return word(c, s, n, true);
	for (size_t pos = 0, e; pos < n; pos = e) {
		e = tok_regex_next(&p->re, u, n, pos);
		int rc = word(c, s + pos, e - pos, true);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

int tok_bl_segment(const struct tok *t, const char *s, size_t n, struct tok_scratch *sc,
		   struct tok_buf *pre, struct tok_buf *map, struct tok_ivec *out)
{
	struct bl_ctx c = {.t = t, .sc = sc, .pre = pre, .map = map, .out = out};
	return step(&c, 0, s, n);
}
