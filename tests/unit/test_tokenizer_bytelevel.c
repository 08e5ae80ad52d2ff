/*
 * Byte-level tokenizer tests (suite tokenizer): the hand-written pre-tokenizer regexes and
 * NFC against pieces and strings that Hugging Face tokenizers 0.23 produced (its
 * preTokenizeString and normalizeString on the same inputs), a small byte-level
 * tokenizer.json written here (alphabet, merges, added tokens, ByteLevel decoder and its
 * U+FFFD rules), refusals, and 100 KB inputs in bounded time. Agreement on real vocabularies
 * is tests/e2e/tokenizer_bytelevel.sh.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_int.h"
#include "tests/bytelevel.h"

/* Qwen2/3's pattern; GLM-4/5's is the same with \p{N}{1,3} */
#define QWEN_RE                                                                              \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+" \
	"[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GLM_RE                                                                               \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"   \
	"\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* The pieces of s, joined with "\x01". */
static void pieces_are(const struct tok_regex *re, const char *s, const char *want)
{
	char got[1024];
	size_t n = strlen(s), g = 0;
	for (size_t pos = 0, e; pos < n; pos = e) {
		e = tok_regex_next(re, (const unsigned char *)s, n, pos);
		cr_assert(e > pos && e <= n);
		if (g)
			got[g++] = '\x01';
		memcpy(got + g, s + pos, e - pos);
		g += e - pos;
	}
	got[g] = 0;
	cr_assert_str_eq(got, want, "pieces of '%s'", s);
}

Test(tokenizer, regex_families)
{
	struct tok_regex q, g, p;
	cr_assert(tok_regex_parse(QWEN_RE, &q));
	cr_assert(tok_regex_parse(GLM_RE, &g));
	cr_assert(tok_regex_parse(GPT2_RE, &p));
	cr_assert_eq(q.max_digits, 1);
	cr_assert_eq(g.max_digits, 3);
	cr_assert_eq(p.family, TOK_RE_GPT2);
	struct tok_regex l;
	cr_assert(tok_regex_parse("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
				  "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
				  "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", &l));
	cr_assert_eq(l.contractions, TOK_RE_CASE_ASCII);
	cr_assert(!tok_regex_parse("\\s+", &l));
	cr_assert(!tok_regex_parse(QWEN_RE "|x", &l));

	/* GPT-4 family, \p{N}{1,3} */
	pieces_are(&g, "  \n\n  x", "  \n\n\x01 \x01 x");
	pieces_are(&g, "hello   world  ", "hello\x01  \x01 world\x01  ");
	pieces_are(&g, "it's IT'S x'\xc5\xbf" "a 'Ll 'LL'd",
		   "it\x01's\x01 IT\x01'S\x01 x\x01'\xc5\xbf\x01" "a\x01 '\x01Ll\x01 '\x01LL\x01'd");
	pieces_are(&g, "1234567 ab12c", "123\x01" "456\x01" "7\x01 ab\x01" "12\x01" "c");
	pieces_are(&g, "a\xc2\xa0 b", "a\x01\xc2\xa0\x01 b");
	pieces_are(&g, "\r\n\r\nx", "\r\n\r\n\x01x");
	pieces_are(&g, "!!!\n\n y", "!!!\n\n\x01 y");
	pieces_are(&g, "  ?!x\t\ty", " \x01 ?!\x01x\x01\t\x01\ty");
	pieces_are(&g, "x  ", "x\x01  ");
	pieces_are(&g, "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c 42\xc2\xb2",
		   "\xe4\xbd\xa0\xe5\xa5\xbd\x01\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\x01 \x01"
		   "42\xc2\xb2");
	pieces_are(&g, "don't\n\n\n  \tfoo", "don\x01't\x01\n\n\n\x01  \x01\tfoo");
	pieces_are(&g, " 's", " '\x01s");
	/* Qwen: one digit at a time; U+00B2 is \p{N} */
	pieces_are(&q, "1234567 ab12c", "1\x01" "2\x01" "3\x01" "4\x01" "5\x01" "6\x01" "7\x01"
		   " ab\x01" "1\x01" "2\x01" "c");
	pieces_are(&q, " 42\xc2\xb2", " \x01" "4\x01" "2\x01\xc2\xb2");
	/* GPT-2 */
	pieces_are(&p, "  \n\n  x", "  \n\n \x01 x");
	pieces_are(&p, "it's IT'S x'\xc5\xbf" "a 'Ll 'LL'd",
		   "it\x01's\x01 IT\x01'\x01S\x01 x\x01'\x01\xc5\xbf" "a\x01 '\x01Ll\x01 '\x01"
		   "LL\x01'd");
	pieces_are(&p, "1234567 ab12c", "1234567\x01 ab\x01" "12\x01" "c");
	pieces_are(&p, "\r\n\r\nx", "\r\n\r\x01\n\x01x");
	pieces_are(&p, "!!!\n\n y", "!!!\x01\n\n\x01 y");
	pieces_are(&p, "  ?!x\t\ty", " \x01 ?!\x01x\x01\t\x01\t\x01y");
	pieces_are(&p, "don't\n\n\n  \tfoo", "don\x01't\x01\n\n\n  \x01\t\x01" "foo");
	/* bytes that are not UTF-8 are neither letters, digits nor space */
	pieces_are(&g, "a\xff\xfe b\x80", "a\x01\xff\xfe\x01 b\x01\x80");
}

static void nfc_is(const char *s, const char *want)
{
	struct tok_buf b = {0};
	cr_assert_eq(tok_nfc(s, strlen(s), &b), WK_OK);
	cr_assert_eq(b.n, strlen(want), "NFC of '%s' is '%.*s'", s, (int)b.n, b.p);
	cr_assert_eq(memcmp(b.p, want, b.n), 0, "NFC of '%s'", s);
	free(b.p);
}

Test(tokenizer, nfc)
{
	nfc_is("", "");
	nfc_is("plain ascii", "plain ascii");
	nfc_is("e\xcc\x81", "\xc3\xa9");                         /* e + U+0301 -> U+00E9 */
	nfc_is("\xe2\x84\xab", "\xc3\x85");                      /* U+212B -> U+00C5 */
	nfc_is("a\xcc\x96\xcc\x81", "\xc3\xa1\xcc\x96");         /* reordered, then composed */
	nfc_is("a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96");
	nfc_is("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); /* jamo -> U+AC01 */
	nfc_is("\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81");     /* LV + T */
	nfc_is("\xe1\xba\x9b\xcc\xa3", "\xe1\xba\x9b\xcc\xa3"); /* U+1E9B U+0323 stays */
	nfc_is("\xe0\xad\x87\xe0\xac\xbe", "\xe0\xad\x8b");     /* U+0B47 U+0B3E -> U+0B4B */
	nfc_is("x\xcd\x84", "\xe1\xba\x8d\xcc\x81");            /* x U+0344 -> U+1E8D U+0301 */
	/* U+1DF6 has no combining class in Unicode 9.0 (HF's data): it blocks, no reordering */
	nfc_is("a\xe1\xb7\xb6\xcc\x96", "a\xe1\xb7\xb6\xcc\x96");
	/* invalid bytes pass through and block composition */
	nfc_is("e\xff\xcc\x81\xc3", "e\xff\xcc\x81\xc3");
	/* a long run of non-starters (the counting sort) */
	char *s = malloc(3 * 200 + 2), *w = malloc(3 * 200 + 2);
	size_t k = 0, m = 0;
	s[k++] = 'a';
	for (int i = 0; i < 100; i++) { /* U+0301 (230) U+0316 (220) alternating */
		memcpy(s + k, "\xcc\x81\xcc\x96", 4);
		k += 4;
	}
	s[k] = 0;
	memcpy(w + m, "\xc3\xa1", 2); /* a + the first U+0301 */
	m += 2;
	for (int i = 0; i < 100; i++, m += 2)
		memcpy(w + m, "\xcc\x96", 2);
	for (int i = 0; i < 99; i++, m += 2)
		memcpy(w + m, "\xcc\x81", 2);
	w[m] = 0;
	nfc_is(s, w);
	free(s);
	free(w);
}

/* ---- a small byte-level tokenizer.json ---------------------------------------------------- */

static char dir[512];

static void tmpdir(void)
{
	const char *b = getenv("WICK_BUILD");
	snprintf(dir, sizeof dir, "%s/tmp", b ? b : "build");
	mkdir(dir, 0755);
	snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/bl-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void rmdir_all(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

/* vocab: byte b is id b; merges "Ġ t", "h e", "Ġt he"; added <|user|> (special) and
 * <think>; pre is the pre_tokenizer. Returns the file's path in a static buffer. */
static const char *write_bl(json_t *pre, const char *name)
{
	static char path[700];
	json_t *vocab = json_object();
	for (int b = 0; b < 256; b++) {
		char c[3];
		bl_char(b, c);
		json_object_set_new(vocab, c, json_integer(b));
	}
	json_object_set_new(vocab, "\xc4\xa0t", json_integer(256));
	json_object_set_new(vocab, "he", json_integer(257));
	json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
	json_t *root = json_pack(
		"{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:{s:s},s:o,s:{s:s},s:{s:s},"
		"s:{s:s,s:o,s:[s,s,s]}}",
		"added_tokens", "id", 259, "content", "<|user|>", "special", 1, "id", 260, "content",
		"<think>", "special", 0, "normalizer", "type", "NFC", "pre_tokenizer", pre,
		"decoder", "type", "ByteLevel", "post_processor", "type", "ByteLevel", "model",
		"type", "BPE", "vocab", vocab, "merges", "\xc4\xa0 t", "h e", "\xc4\xa0t he");
	cr_assert_not_null(root);
	snprintf(path, sizeof path, "%s/%s.json", dir, name);
	cr_assert_eq(json_dump_file(root, path, 0), 0);
	json_decref(root);
	return path;
}

static json_t *qwen_pre(void)
{
	return json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]}", "type", "Sequence",
			 "pretokenizers", "type", "Split", "pattern", "Regex", QWEN_RE, "behavior",
			 "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
			 "use_regex", 0);
}

static struct tok *load(const char *path)
{
	struct tok *t;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_OK, "%s", err);
	return t;
}

static void enc_is(const struct tok *t, const char *s, size_t len, const int *want, int nwant)
{
	int *ids, n;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(t, s, len, false, &ids, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, nwant, "'%s': %d ids, want %d", s, n, nwant);
	for (int i = 0; i < n; i++)
		cr_assert_eq(ids[i], want[i], "'%s': id %d is %d, want %d", s, i, ids[i], want[i]);
	free(ids);
}

#define ENC(t, s, ...)                                                                       \
	do {                                                                                 \
		const int w_[] = {__VA_ARGS__};                                              \
		enc_is((t), (s), strlen(s), w_, (int)(sizeof w_ / sizeof w_[0]));            \
	} while (0)

static void dec_is(const struct tok *t, const int *ids, int n, bool utf8, bool skip,
		   const char *want, size_t wlen)
{
	char *text, err[WK_ERRSZ];
	size_t len;
	int rc = utf8 ? tok_decode_utf8(t, ids, n, skip, &text, &len, err, sizeof err)
		      : tok_decode(t, ids, n, skip, &text, &len, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "%s", err);
	cr_assert_eq(len, wlen, "decoded %zu bytes '%s', want %zu", len, text, wlen);
	cr_assert_eq(memcmp(text, want, len), 0, "decoded '%s'", text);
	free(text);
}

#define DEC(t, utf8, skip, want, ...)                                                        \
	do {                                                                                 \
		const int i_[] = {__VA_ARGS__};                                              \
		dec_is((t), i_, (int)(sizeof i_ / sizeof i_[0]), (utf8), (skip), (want),      \
		       sizeof(want) - 1);                                                    \
	} while (0)

Test(tokenizer, byte_level_small)
{
	tmpdir();
	struct tok *t = load(write_bl(qwen_pre(), "q"));
	cr_assert_eq(tok_vocab_size(t), 261);
	ENC(t, " the", 258);
	ENC(t, "the", 't', 257);
	ENC(t, "the the", 't', 257, 258);
	ENC(t, "<|user|>the<think>", 259, 't', 257, 260);
	ENC(t, "e\xcc\x81", 0xC3, 0xA9); /* NFC first: U+00E9 */
	ENC(t, "\n\n  x", '\n', '\n', ' ', ' ', 'x');
	/* exact bytes back, even when they are not UTF-8 */
	const char raw[] = "a\xff\xe4\xbd the\x80 \xe4\xbd\xa0";
	int *ids, n;
	char err[WK_ERRSZ], *text;
	size_t len;
	cr_assert_eq(tok_encode(t, raw, sizeof raw - 1, false, &ids, &n, err, sizeof err), WK_OK);
	cr_assert_eq(tok_decode(t, ids, n, false, &text, &len, err, sizeof err), WK_OK);
	cr_assert_eq(len, sizeof raw - 1);
	cr_assert_eq(memcmp(text, raw, len), 0);
	free(text);
	free(ids);
	/* HF's decode: Rust's from_utf8_lossy, one U+FFFD per maximal invalid subpart */
	DEC(t, true, false, "\xef\xbf\xbd", 0xE4, 0xBD);
	DEC(t, true, false, "\xef\xbf\xbd" "A", 0xE4, 0xBD, 'A');
	DEC(t, true, false, "\xef\xbf\xbd", 0xF0, 0x9F, 0x98);
	DEC(t, true, false, "\xef\xbf\xbd\xef\xbf\xbd", 0x80, 0x80);
	DEC(t, true, false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0xED, 0xA0, 0x80);
	DEC(t, true, false, "\xe4\xbd\xa0 the", 0xE4, 0xBD, 0xA0, 258);
	DEC(t, false, false, "\xe4\xbd", 0xE4, 0xBD);
	DEC(t, true, true, "the<think>", 259, 't', 257, 260);
	DEC(t, true, false, "<|user|>the<think>", 259, 't', 257, 260);
	tok_free(t);

	/* GPT-2's ByteLevel with add_prefix_space: a space before each segment */
	t = load(write_bl(json_pack("{s:s,s:b}", "type", "ByteLevel", "add_prefix_space", 1), "g"));
	ENC(t, "the", 258);
	ENC(t, "<|user|>the", 259, 258);
	ENC(t, " the", 258);
	ENC(t, "x the", ' ', 'x', 258);
	tok_free(t);
	rmdir_all();
}

Test(tokenizer, byte_level_refusals)
{
	tmpdir();
	static const struct {
		const char *pre;
		int rc;
		const char *msg;
	} cases[] = {
		{"{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+\"}, \"behavior\": "
		 "\"Isolated\"}", WK_EUNSUPPORTED, "\\p{L}+"},
		{"{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}",
		 WK_EUNSUPPORTED, "Regex"},
		{"{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": "
		 "\"Removed\"}", WK_EUNSUPPORTED, "Removed"},
		{"{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": "
		 "\"Isolated\", \"invert\": true}", WK_EUNSUPPORTED, "invert"},
		{"{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}}", WK_EFORMAT, "behavior"},
		{"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
		 "{\"type\": \"Digits\"}]}", WK_EUNSUPPORTED, "after ByteLevel"},
		{"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}",
		 WK_EUNSUPPORTED, "Digits"},
		{"{\"type\": \"Whitespace\"}", WK_EUNSUPPORTED, "Whitespace"},
	};
	char path[700], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/bad.json", dir);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_error_t je;
		json_t *pre = json_loads(cases[i].pre, 0, &je);
		cr_assert_not_null(pre, "case %zu: %s", i, je.text);
		const char *p = write_bl(pre, "bad");
		struct tok *t = (struct tok *)1;
		int rc = tok_load(p, &t, err, sizeof err);
		cr_assert_eq(rc, cases[i].rc, "case %zu: rc %d (%s)", i, rc, err);
		cr_assert_null(t);
		cr_assert(strstr(err, cases[i].msg), "case %zu: '%s' lacks '%s'", i, err,
			  cases[i].msg);
	}
	rmdir_all();
}

/* 100 KB inputs that stress one stage each, all well under a second (the timeout). */
Test(tokenizer, byte_level_long_inputs, .timeout = 10)
{
	tmpdir();
	struct tok *t = load(write_bl(qwen_pre(), "q"));
	size_t n = 100000;
	char *s = malloc(n + 4);
	const char *fills[] = {"a", " ", "7", "\xcc\x81", "\xcc\x81\xcc\x96", "\xe4\xbd\xa0",
			       "the ", "'s\n"};
	for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
		size_t k = strlen(fills[f]), len = 0;
		while (len + k <= n) {
			memcpy(s + len, fills[f], k);
			len += k;
		}
		int *ids, nids;
		char err[WK_ERRSZ], *text;
		size_t tl;
		double t0 = wk_now();
		cr_assert_eq(tok_encode(t, s, len, false, &ids, &nids, err, sizeof err), WK_OK);
		double dt = wk_now() - t0;
		cr_assert(dt < 1.0, "fill %zu: %.3f s", f, dt);
		cr_assert_eq(tok_decode(t, ids, nids, false, &text, &tl, err, sizeof err), WK_OK);
		if (f != 4) /* NFC reorders that one */
			cr_assert(tl == len && !memcmp(text, s, len), "fill %zu round trip", f);
		free(text);
		free(ids);
	}
	free(s);
	tok_free(t);
	rmdir_all();
}
