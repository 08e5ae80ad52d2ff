/*
 * Tokenizer tests: tok512.bin (stories260K) converted to tokenizer.json at test time, encode
 * and decode against ids worked out independently, round trips over awkward bytes, and
 * malformed tokenizer.json files. Agreement with Hugging Face's own library on thousands of
 * strings is tests/e2e/tokenizer_hf.sh.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"

static char dir[512], json_path[600];

static const char *shared(void)
{
	const char *s = getenv("WICK_SHARED");
	return s ? s : "../shared";
}

static void setup(void)
{
	const char *b = getenv("WICK_BUILD");
	char bin[512], err[WK_ERRSZ];
	snprintf(dir, sizeof dir, "%s/tmp", b ? b : "build");
	cr_assert(mkdir(dir, 0755) == 0 || access(dir, W_OK) == 0, "cannot use %s", dir);
	snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/tok-XXXXXX");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
	snprintf(bin, sizeof bin, "%s/models/stories260K/tok512.bin", shared());
	snprintf(json_path, sizeof json_path, "%s/tokenizer.json", dir);
	int rc = tok_convert_llama2c(bin, 512, json_path, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "convert: %s", err);
}

static void teardown(void)
{
	char cmd[700];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(tokenizer, .init = setup, .fini = teardown);

static struct tok *load(void)
{
	struct tok *t;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_load(json_path, &t, err, sizeof err), WK_OK, "load: %s", err);
	return t;
}

static void expect_ids(const struct tok *t, const char *s, size_t len, bool special,
		       const int *want, int nwant)
{
	int *ids, n;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(t, s, len, special, &ids, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, nwant, "'%s': %d ids, want %d", s, n, nwant);
	for (int i = 0; i < n; i++)
		cr_assert_eq(ids[i], want[i], "'%s': id[%d] = %d, want %d", s, i, ids[i], want[i]);
	free(ids);
}

#define EXPECT(t, s, special, ...)                                                           \
	do {                                                                                 \
		const int want_[] = {__VA_ARGS__};                                           \
		expect_ids(t, s, strlen(s), special, want_, sizeof want_ / sizeof want_[0]); \
	} while (0)

Test(tokenizer, convert_and_load)
{
	struct tok *t = load();
	cr_assert_eq(tok_vocab_size(t), 512);
	cr_assert_eq(tok_bos(t), 1);
	cr_assert_eq(tok_eos(t), 2);
	cr_assert_str_eq(tok_piece(t, 0), "<unk>");
	cr_assert_str_eq(tok_piece(t, 1), "<s>");
	cr_assert_str_eq(tok_piece(t, 2), "</s>");
	cr_assert_str_eq(tok_piece(t, 3), "<0x00>");
	cr_assert_str_eq(tok_piece(t, 258), "<0xFF>");
	cr_assert_str_eq(tok_piece(t, 259), "\xE2\x96\x81t"); /* "▁t": spaces are "▁" again */
	cr_assert_str_eq(tok_piece(t, 403), "\xE2\x96\x81Once");
	cr_assert_null(tok_piece(t, 512));
	cr_assert_null(tok_piece(t, -1));
	cr_assert_eq(tok_id(t, "\xE2\x96\x81upon"), 407);
	cr_assert_eq(tok_id(t, "no such piece"), -1);
	cr_assert(tok_is_special(t, 1));
	cr_assert(tok_is_special(t, 2));
	cr_assert_not(tok_is_special(t, 3));
	cr_assert_not(tok_is_special(t, 403));
	tok_free(t);
	tok_free(NULL);
}

/* Expected ids come from llama2.c's own encode (add " ", look up characters, byte fallback
 * +3, then repeatedly merge the adjacent pair whose concatenation has the highest score)
 * run over tok512.bin by a throwaway script, and were checked by hand against the pieces:
 * 403 " Once", 407 " upon", 261 " a", 378 " time". */
Test(tokenizer, once_upon_a_time)
{
	struct tok *t = load();
	EXPECT(t, "Once upon a time", false, 403, 407, 261, 378);
	EXPECT(t, "Once upon a time", true, 1, 403, 407, 261, 378);
	EXPECT(t, "Hello world", false, 346, 306, 414, 263, 304, 341);
	EXPECT(t, "Lily's dog, 42!", false, 317, 439, 419, 400, 428, 432, 410, 484, 479, 443);
	/* "é" is a piece; 你好 is not, so its six UTF-8 bytes fall back to <0xXX> (byte + 3) */
	EXPECT(t, "h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD", false, 270, 485, 306, 414, 410, 231, 192,
	       163, 232, 168, 192);
	int *ids, n;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(t, "", 0, true, &ids, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_assert_eq(ids[0], 1);
	free(ids);
	cr_assert_eq(tok_encode(t, "", 0, false, &ids, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 0);
	cr_assert_not_null(ids);
	free(ids);
	tok_free(t);
}

Test(tokenizer, added_tokens_split_segments)
{
	struct tok *t = load();
	/* "<s>" in the text is the BOS token; each side is its own segment with its own "▁" */
	EXPECT(t, "<s>Once", false, 1, 403);
	EXPECT(t, "Once</s>", false, 403, 2);
	EXPECT(t, "a<s>a", false, 261, 1, 261);
	/* "<s" alone is no added token: "▁", "<", "s" */
	EXPECT(t, "<s", false, 410, 504, 419);
	tok_free(t);
}

static void decode_is(const struct tok *t, const int *ids, int n, bool skip, bool utf8,
		      const char *want, size_t wlen)
{
	char *s, err[WK_ERRSZ];
	size_t len;
	int rc = utf8 ? tok_decode_utf8(t, ids, n, skip, &s, &len, err, sizeof err)
		      : tok_decode(t, ids, n, skip, &s, &len, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "%s", err);
	cr_assert_eq(len, wlen, "decoded %zu bytes '%s', want %zu '%s'", len, s, wlen, want);
	cr_assert(!memcmp(s, want, len), "decoded '%s', want '%s'", s, want);
	cr_assert_eq(s[len], 0);
	free(s);
}

Test(tokenizer, decode)
{
	struct tok *t = load();
	int ids[] = {1, 403, 407, 261, 378, 2};
	decode_is(t, ids, 6, true, false, "Once upon a time", 16);
	decode_is(t, ids, 6, false, true, "<s> Once upon a time</s>", 24);
	decode_is(t, ids, 0, true, false, "", 0);
	/* bytes that are not UTF-8: exact with tok_decode, U+FFFD per byte with _utf8 */
	int bad[] = {410, 258, 198}; /* "▁", <0xFF>, <0xC3> */
	decode_is(t, bad, 3, true, false, "\xFF\xC3", 2);
	decode_is(t, bad, 3, true, true, "\xEF\xBF\xBD\xEF\xBF\xBD", 6);
	int good[] = {231, 192, 163}; /* <0xE4> <0xBD> <0xA0>: 你 */
	decode_is(t, good, 3, true, true, "\xE4\xBD\xA0", 3);
	char *s, err[WK_ERRSZ];
	size_t len;
	int out_of_range[] = {403, 512};
	cr_assert_eq(tok_decode(t, out_of_range, 2, true, &s, &len, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "512"), "%s", err);
	int negative[] = {-1};
	cr_assert_eq(tok_decode_utf8(t, negative, 1, true, &s, &len, err, sizeof err), WK_EINVAL);
	tok_free(t);
}

Test(tokenizer, round_trip)
{
	static const struct {
		const char *s;
		size_t len;
	} cases[] = {
#define C(x) {x, sizeof x - 1}
		C("Once upon a time, there was a little girl named Lily."),
		C(" leading space"), C("trailing space "), C("  two  spaces  "), C(" "), C("   "),
		C("tab\there"), C("new\nline\r\n"), C("\n"), C("digits 0123456789 3.14"),
		C("punctuation!?.,;:'\"()[]{}<>@#$%^&*-_=+\\|/~`"),
		C("caf\xC3\xA9 na\xC3\xAFve \xC3\xBC\xC3\xB1\xC3\xAE\xC3\xA7\xC3\xB8" "d\xC3\xA9"),
		C("\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C"),       /* 你好世界 */
		C("\xF0\x9F\xA6\x99 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D"),       /* emoji */
		C("\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 mixed \xCE\xB1\xCE\xB2"),
		C("\xFF"), C("\xC3"), C("a\xE2\x82"), C("\xC0\xAF overlong"), C("\xED\xA0\x80 surrogate"),
		C("\xF4\x90\x80\x80 past U+10FFFF"), C("\x80\x80\x80"), C("mix \xFE\xE4\xBD\xA0\xBD!"),
		C("nul \0 inside"),
#undef C
	};
	struct tok *t = load();
	/* Not round-trip: "▁" in the text is a space after normalization, in HF too. */
	int *ids, n;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(t, "\xE2\x96\x81x", 4, false, &ids, &n, err, sizeof err), WK_OK);
	decode_is(t, ids, n, true, false, " x", 2);
	free(ids);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *s;
		size_t len;
		cr_assert_eq(tok_encode(t, cases[i].s, cases[i].len, false, &ids, &n, err,
					sizeof err), WK_OK, "%s", err);
		for (int k = 0; k < n; k++)
			cr_assert(ids[k] != 0, "case %zu: <unk> at %d", i, k);
		cr_assert_eq(tok_decode(t, ids, n, true, &s, &len, err, sizeof err), WK_OK, "%s",
			     err);
		cr_assert_eq(len, cases[i].len, "case %zu: %zu bytes back, want %zu ('%s')", i, len,
			     cases[i].len, s);
		cr_assert(!memcmp(s, cases[i].s, len), "case %zu: '%s' back", i, s);
		free(s);
		free(ids);
	}
	tok_free(t);
}

/* A 100 KB segment is one BPE word (SentencePiece-BPE has no pre-tokenizer split): the heap
 * merge keeps it fast. */
Test(tokenizer, long_input, .timeout = 60)
{
	struct tok *t = load();
	size_t len = 100 * 1000;
	char *s = malloc(len + 1);
	static const char words[] = "Once upon a time there was a little dog named Tim. ";
	for (size_t i = 0; i < len; i++)
		s[i] = words[i % (sizeof words - 1)];
	s[len] = 0;
	int *ids, n;
	char *back, err[WK_ERRSZ];
	size_t blen;
	double t0 = wk_now();
	cr_assert_eq(tok_encode(t, s, len, false, &ids, &n, err, sizeof err), WK_OK, "%s", err);
	double dt = wk_now() - t0;
	cr_assert_lt(dt, 10.0, "encoding 100 KB took %.2f s", dt);
	cr_assert_gt(n, 1000);
	cr_assert_lt(n, 40000);
	cr_assert_eq(tok_decode(t, ids, n, true, &back, &blen, err, sizeof err), WK_OK);
	cr_assert_eq(blen, len);
	cr_assert(!memcmp(back, s, len));
	free(back);
	free(ids);
	cr_assert_eq(tok_encode(t, s, (size_t)TOK_MAX_TEXT + 1, false, &ids, &n, err, sizeof err),
		     WK_ELIMIT);
	free(s);
	tok_free(t);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

#define BPE_HEAD "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "

/* Replace steps whose content is longer than their pattern multiply the text, step after
 * step: four of "a" -> 256 a's would turn "a" into 4 GiB. The normalizer stops a step's
 * output at 16x the input plus 64 KiB, for the text (encode) and for a normalized added token
 * (load), and says why: two such steps take "a" to 64 KiB (inside) and "aaaa" to 256 KiB
 * (past it). */
Test(tokenizer, normalizer_growth_is_bounded)
{
	char a256[257], path[700], err[WK_ERRSZ], json[4096], one[400];
	memset(a256, 'a', 256);
	a256[256] = 0;
	snprintf(one, sizeof one, "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, "
		 "\"content\": \"%s\"}", a256);
	for (int steps = 2; steps <= 4; steps += 2) {
		int k = snprintf(json, sizeof json, BPE_HEAD "\"merges\": []}, \"normalizer\": "
				 "{\"type\": \"Sequence\", \"normalizers\": [");
		for (int i = 0; i < steps; i++)
			k += snprintf(json + k, sizeof json - (size_t)k, "%s%s", i ? ", " : "", one);
		snprintf(json + k, sizeof json - (size_t)k, "]}}");
		snprintf(path, sizeof path, "%s/grow%d.json", dir, steps);
		write_file(path, json);
		struct tok *t;
		cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_OK, "%s", err);
		int *ids, n;
		int rc = tok_encode(t, "a", 1, false, &ids, &n, err, sizeof err);
		if (steps == 2) {
			cr_assert_eq(rc, WK_OK, "%s", err);
			cr_assert_eq(n, 65536);
			free(ids);
			rc = tok_encode(t, "aaaa", 4, false, &ids, &n, err, sizeof err);
		}
		cr_assert_eq(rc, WK_ELIMIT, "%d steps: rc %d (%s)", steps, rc, err);
		cr_assert(strstr(err, "normalizer"), "%s", err);
		tok_free(t);
		if (steps == 2)
			continue;
		/* the same normalizer on a normalized added token, at load */
		snprintf(json + k, sizeof json - (size_t)k, "]}, \"added_tokens\": [{\"id\": 3, "
			 "\"content\": \"<x>a\", \"normalized\": true}]}");
		write_file(path, json);
		cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_ELIMIT, "%s", err);
		cr_assert(strstr(err, "added_tokens[0]") && strstr(err, "normalizer"), "%s", err);
	}
}

Test(tokenizer, malformed_json)
{
	static const struct {
		const char *json;
		int rc;
		const char *msg; /* a word the message must contain */
	} cases[] = {
		{"", WK_EFORMAT, ":1:"},
		{"{\"model\": ", WK_EFORMAT, ":1:"},
		{"[1, 2]", WK_EFORMAT, "object"},
		{"{}", WK_EFORMAT, "model"},
		{"{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", WK_EFORMAT,
		 "vocab"},
		{"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
		 WK_EFORMAT, "vocab"},
		{"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
		 WK_EFORMAT, "vocab"},
		{"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}, \"merges\": []}}",
		 WK_ELIMIT, "vocab"},
		{BPE_HEAD "\"merges\": [\"a c\"]}}", WK_EFORMAT, "merges[0]"},
		{BPE_HEAD "\"merges\": [\"a b c\"]}}", WK_EFORMAT, "merges[0]"},
		{BPE_HEAD "\"merges\": [[\"a\"]]}}", WK_EFORMAT, "merges[0]"},
		{BPE_HEAD "\"merges\": [], \"unk_token\": \"<unk>\"}}", WK_EFORMAT, "unk_token"},
		{BPE_HEAD "\"merges\": [], \"dropout\": 0.1}}", WK_EUNSUPPORTED, "dropout"},
		{"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", WK_EUNSUPPORTED, "Unigram"},
		{BPE_HEAD "\"merges\": []}, \"pre_tokenizer\": {\"type\": \"Digits\"}}",
		 WK_EUNSUPPORTED, "Digits"},
		{BPE_HEAD "\"merges\": []}, \"normalizer\": {\"type\": \"ByteLevel\"}}",
		 WK_EUNSUPPORTED, "ByteLevel"},
		{BPE_HEAD "\"merges\": []}, \"decoder\": {\"type\": \"WordPiece\"}}",
		 WK_EUNSUPPORTED, "WordPiece"},
		{BPE_HEAD "\"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}", WK_EUNSUPPORTED,
		 "NFKC"},
		{BPE_HEAD "\"merges\": []}, \"normalizer\": {\"type\": \"Replace\", \"pattern\": "
		 "{\"Regex\": \" +\"}, \"content\": \" \"}}", WK_EUNSUPPORTED, "Regex"},
		{BPE_HEAD "\"merges\": []}, \"added_tokens\": [{\"id\": 7, \"content\": \"ab\"}]}",
		 WK_EFORMAT, "id 7"},
		{BPE_HEAD "\"merges\": []}, \"added_tokens\": [{\"content\": \"x\"}]}", WK_EFORMAT,
		 "no id"},
		{BPE_HEAD "\"merges\": []}, \"post_processor\": {\"type\": \"TemplateProcessing\", "
		 "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
		 " \"special_tokens\": {}}}", WK_EFORMAT, "<s>"},
		{BPE_HEAD "\"merges\": []}, \"post_processor\": {\"type\": \"RobertaProcessing\"}}",
		 WK_EUNSUPPORTED, "RobertaProcessing"},
		{BPE_HEAD "\"merges\": []}, \"decoder\": {\"type\": \"Strip\", \"content\": \"ab\", "
		 "\"start\": 1, \"stop\": 0}}", WK_EFORMAT, "Strip"},
	};
	char path[700], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/bad.json", dir);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_file(path, cases[i].json);
		struct tok *t = (struct tok *)1;
		err[0] = 0;
		int rc = tok_load(path, &t, err, sizeof err);
		cr_assert_eq(rc, cases[i].rc, "case %zu: rc %d (%s), want %d", i, rc, err,
			     cases[i].rc);
		cr_assert_null(t, "case %zu", i);
		cr_assert(strstr(err, cases[i].msg), "case %zu: message '%s' lacks '%s'", i, err,
			  cases[i].msg);
		cr_assert(strstr(err, "bad.json"), "case %zu: message '%s' names no file", i, err);
	}
	struct tok *t;
	snprintf(path, sizeof path, "%s/missing.json", dir);
	cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_ENOTFOUND);
	cr_assert(strstr(err, "missing.json"));
	/* a minimal valid file still loads: no normalizer, decoder or post-processor */
	snprintf(path, sizeof path, "%s/ok.json", dir);
	write_file(path, BPE_HEAD "\"merges\": [\"a b\"]}}");
	cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_OK, "%s", err);
	EXPECT(t, "abab", false, 2, 2);
	EXPECT(t, "abab", true, 2, 2);
	/* 'c' has no piece, no byte fallback and no unk: dropped, as in HF, so a and b meet */
	EXPECT(t, "acb", false, 2);
	cr_assert_eq(tok_bos(t), -1);
	int ids[] = {2, 0};
	decode_is(t, ids, 2, false, true, "ab a", 4); /* no decoder: joined with " " as in HF */
	tok_free(t);
}

/* A piece longer than TOK_MAX_PIECE is refused with WK_ELIMIT. */
Test(tokenizer, piece_limit)
{
	char path[700], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/long.json", dir);
	size_t n = TOK_MAX_PIECE + 1;
	char *json = malloc(n + 200);
	strcpy(json, "{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"");
	size_t off = strlen(json);
	memset(json + off, 'x', n);
	strcpy(json + off + n, "\": 0}}}");
	write_file(path, json);
	free(json);
	struct tok *t;
	cr_assert_eq(tok_load(path, &t, err, sizeof err), WK_ELIMIT, "%s", err);
}

Test(tokenizer, convert_errors)
{
	char bin[512], out[700], err[WK_ERRSZ];
	snprintf(bin, sizeof bin, "%s/models/stories260K/tok512.bin", shared());
	snprintf(out, sizeof out, "%s/x.json", dir);
	cr_assert_eq(tok_convert_llama2c(bin, 511, out, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "vocab_size"), "%s", err);
	cr_assert_eq(tok_convert_llama2c(bin, 513, out, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "token 512"), "%s", err);
	cr_assert_eq(tok_convert_llama2c(bin, 0, out, err, sizeof err), WK_EINVAL);
	cr_assert_eq(tok_convert_llama2c("/nonexistent/tok.bin", 512, out, err, sizeof err),
		     WK_ENOTFOUND);
	/* the stories260K weights are no tokenizer */
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", shared());
	cr_assert_neq(tok_convert_llama2c(bin, 512, out, err, sizeof err), WK_OK);
	cr_assert_eq(access(out, F_OK), -1);
}

/* The memo of long segments (tok_memo_set): the same ids as without it, a segment that
 * begins the text kept apart from the same bytes after an added token (a metaspace that
 * prepends "▁" to the first word only encodes them apart), bounded, and shared by threads. */
static char *story(size_t bytes, const char *tail)
{
	static const char *const s = "Once upon a time, there was a little girl named Lily. ";
	char *p = malloc(bytes + strlen(tail) + 64);
	size_t n = 0;
	while (n < bytes)
		n += (size_t)sprintf(p + n, "%s", s);
	strcpy(p + n, tail);
	return p;
}

static void expect_same(const struct tok *plain, const struct tok *memo, const char *s)
{
	int *a, *b, na, nb;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(plain, s, strlen(s), true, &a, &na, err, sizeof err), WK_OK);
	for (int k = 0; k < 2; k++) { /* kept, then read back */
		cr_assert_eq(tok_encode(memo, s, strlen(s), true, &b, &nb, err, sizeof err), WK_OK);
		cr_assert(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "%.40s: %d against %d ids",
			  s, na, nb);
		free(b);
	}
	free(a);
}

struct memo_run {
	const struct tok *plain, *memo;
	char *texts[4];
};

static void *memo_thread(void *arg)
{
	struct memo_run *r = arg;
	for (int i = 0; i < 40; i++)
		expect_same(r->plain, r->memo, r->texts[i % 4]);
	return NULL;
}

Test(tokenizer, memo_gives_the_same_ids)
{
	struct tok *plain = load(), *memo = load();
	cr_assert_eq(tok_memo_set(memo, 1 << 20), WK_OK);
	char *seg = story(2000, "");
	char *texts[4];
	size_t sl = strlen(seg);
	texts[0] = strdup(seg);
	texts[1] = malloc(2 * sl + 16);
	sprintf(texts[1], "%s</s>%s", seg, seg);
	texts[2] = malloc(sl + 16);
	sprintf(texts[2], "<s>%s", seg);
	texts[3] = malloc(3 * sl + 32);
	sprintf(texts[3], "%s<s>%s<unk>%s", seg, seg, seg);
	for (int i = 0; i < 4; i++)
		expect_same(plain, memo, texts[i]);
	struct tok_memo_stats st;
	tok_memo_stats(memo, &st);
	cr_expect_eq(st.entries, 2, "the segment at the start and after a token: %zu", st.entries);
	cr_expect_geq(st.hits, 8);
	cr_expect_gt(st.bytes, 0);
	/* a short segment is not kept */
	tok_memo_stats(memo, &st);
	size_t before = st.entries;
	expect_same(plain, memo, "Once upon a time</s>there was");
	tok_memo_stats(memo, &st);
	cr_expect_eq(st.entries, before);
	/* bounded: room for one entry and a half, the least recently used going */
	cr_assert_eq(tok_memo_set(memo, 1 << 20), WK_OK);
	expect_same(plain, memo, seg);
	tok_memo_stats(memo, &st);
	size_t one = st.bytes;
	cr_assert_eq(tok_memo_set(memo, one + one / 2), WK_OK);
	char *other = story(2000, "The end.");
	expect_same(plain, memo, seg);
	expect_same(plain, memo, other);
	expect_same(plain, memo, seg);
	tok_memo_stats(memo, &st);
	cr_expect_eq(st.entries, 1);
	cr_expect_eq(st.evicted, 2);
	cr_expect_leq(st.bytes, one + one / 2);
	/* threads share it */
	cr_assert_eq(tok_memo_set(memo, 1 << 20), WK_OK);
	struct memo_run r = {plain, memo, {texts[0], texts[1], texts[2], texts[3]}};
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, memo_thread, &r), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(tok_memo_set(memo, 0), WK_OK); /* dropped */
	tok_memo_stats(memo, &st);
	cr_expect_eq(st.entries, 0);
	expect_same(plain, memo, texts[3]);
	for (int i = 0; i < 4; i++)
		free(texts[i]);
	free(seg);
	free(other);
	tok_free(plain);
	tok_free(memo);
}
