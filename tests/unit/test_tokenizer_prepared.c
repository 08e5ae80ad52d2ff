/*
 * The prepared tokenizer (engine/tokenizer_prepared.c): a tokenizer written out and read back
 * must encode, decode and look up exactly as the tokenizer.json it came from, for each kind
 * (SentencePiece-BPE with Prepend/Replace or Metaspace, byte-level with NFC, added tokens of
 * every sort, a template post-processor); and a file that is stale, of another version,
 * damaged, truncated or malformed must be refused with the reason, never followed. The same
 * check on Qwen's 151k-token file, against Hugging Face, is tests/e2e/tokenizer_bytelevel.sh.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/tokenizer.h"

static char dir[512];

static void setup(void)
{
	const char *b = getenv("WICK_BUILD");
	snprintf(dir, sizeof dir, "%s/tmp", b ? b : "build");
	cr_assert(mkdir(dir, 0755) == 0 || access(dir, W_OK) == 0, "cannot use %s", dir);
	snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/tokp-XXXXXX");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

static void teardown(void)
{
	char cmd[700];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(tokenizer_prepared, .init = setup, .fini = teardown);

/* stories260K's tok512 as tokenizer.json (SentencePiece-BPE: Prepend + Replace normalizer,
 * byte fallback, the Replace/ByteFallback/Fuse/Strip decoder, a BOS template). */
static const char *stories_json(void)
{
	static char path[700];
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], err[WK_ERRSZ];
	snprintf(bin, sizeof bin, "%s/models/stories260K/tok512.bin", sh);
	snprintf(path, sizeof path, "%s/stories.json", dir);
	cr_assert_eq(tok_convert_llama2c(bin, 512, path, err, sizeof err), WK_OK, "%s", err);
	return path;
}

/* The same vocabulary the older way: no normalizer, a Metaspace pre-tokenizer and decoder. */
static const char *metaspace_json(void)
{
	static char path[700];
	json_error_t je;
	json_t *root = json_load_file(stories_json(), 0, &je);
	cr_assert_not_null(root, "%s", je.text);
	json_object_set_new(root, "normalizer", json_null());
	json_object_set_new(root, "pre_tokenizer",
			    json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement",
				      "\xe2\x96\x81", "prepend_scheme", "first", "split", 0));
	json_object_set_new(root, "decoder", json_pack("{s:s,s:s,s:s}", "type", "Metaspace",
						       "replacement", "\xe2\x96\x81",
						       "prepend_scheme", "first"));
	snprintf(path, sizeof path, "%s/metaspace.json", dir);
	cr_assert_eq(json_dump_file(root, path, 0), 0);
	json_decref(root);
	return path;
}

/* Byte-level: NFC, the Qwen Split regex then ByteLevel, a vocabulary of the 256 byte
 * characters and a few merges, a hole in the ids (265..299), added tokens special or not,
 * normalized or not, one listed twice (the later wins), and a [gMASK]<sop> prefix. */
static const char *bytelevel_json(void)
{
	static char path[700];
	json_t *vocab = json_object();
	int next = 0;
	for (int b = 0; b < 256; b++) {
		/* byte_level.rs's alphabet: printable bytes stand for themselves */
		bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
		int cp = self ? b : 256 + next++;
		char c[3] = {0};
		if (cp < 0x80) {
			c[0] = (char)cp;
		} else {
			c[0] = (char)(0xC0 | cp >> 6);
			c[1] = (char)(0x80 | (cp & 0x3F));
		}
		json_object_set_new(vocab, c, json_integer(b));
	}
	json_object_set_new(vocab, "\xc4\xa0t", json_integer(256));
	json_object_set_new(vocab, "he", json_integer(257));
	json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
	json_object_set_new(vocab, "ll", json_integer(259));
	json_object_set_new(vocab, "llo", json_integer(300));
	const char *re = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
			 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
	json_t *added = json_pack(
		"[{s:i,s:s,s:b,s:b},{s:i,s:s,s:b,s:b},{s:i,s:s,s:b,s:b},{s:i,s:s,s:b,s:b},"
		"{s:i,s:s,s:b,s:b}]",
		"id", 261, "content", "[gMASK]", "special", 1, "normalized", 0, "id", 262, "content",
		"<sop>", "special", 1, "normalized", 0, "id", 263, "content", "<think>", "special", 0,
		"normalized", 1, "id", 264, "content", "cafe\xcc\x81", "special", 0, "normalized", 1,
		"id", 261, "content", "[gMASK]", "special", 1, "normalized", 0);
	json_t *root = json_pack(
		"{s:o,s:{s:s},s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]},s:{s:s},"
		"s:{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i]},"
		"s:{s:s,s:[i]}}},s:{s:s,s:o,s:[s,s,s,s,s]}}",
		"added_tokens", added, "normalizer", "type", "NFC", "pre_tokenizer", "type",
		"Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", re, "behavior",
		"Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
		"decoder", "type", "ByteLevel", "post_processor", "type", "TemplateProcessing",
		"single", "SpecialToken", "id", "[gMASK]", "type_id", 0, "SpecialToken", "id",
		"<sop>", "type_id", 0, "Sequence", "id", "A", "type_id", 0, "special_tokens",
		"[gMASK]", "id", "[gMASK]", "ids", 261, "<sop>", "id", "<sop>", "ids", 262, "model",
		"type", "BPE", "vocab", vocab, "merges", "\xc4\xa0 t", "h e", "\xc4\xa0t he", "l l",
		"ll o");
	cr_assert_not_null(root);
	snprintf(path, sizeof path, "%s/bytelevel.json", dir);
	cr_assert_eq(json_dump_file(root, path, 0), 0);
	json_decref(root);
	return path;
}

static char *slurp(const char *path, size_t *len)
{
	char *buf, err[WK_ERRSZ];
	cr_assert_eq(wk_read_file(path, 1u << 26, &buf, len, err, sizeof err), WK_OK, "%s", err);
	return buf;
}

/* The prepared form of the tokenizer.json at path, in a malloc'd buffer. */
static char *prepare(const char *path, struct tok **from_json, size_t *len)
{
	char err[WK_ERRSZ], *buf;
	size_t jl;
	char *json = slurp(path, &jl);
	cr_assert_eq(tok_load(path, from_json, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(tok_prepare(*from_json, json, jl, &buf, len, err, sizeof err), WK_OK, "%s",
		     err);
	free(json);
	return buf;
}

static const char *const texts[] = {
	"Hello world, hello there!",
	"  leading spaces, trailing   ",
	"I'm sure they'll say it's 12345 or 3.14159.",
	"caf\xc3\xa9 cafe\xcc\x81 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
	"<s>one</s> two <unk> three",
	"[gMASK]<sop><think>the llama says hello</think>",
	"line one\nline two\r\n\n\ttabbed",
	"bytes \xff\xfe\xc3 and \xe2\x96\x81 a lower one-eighth block",
	"",
};

static void same_ids(const struct tok *a, const struct tok *b, const char *s, bool special)
{
	int *x, *y, nx, ny;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(a, s, strlen(s), special, &x, &nx, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(tok_encode(b, s, strlen(s), special, &y, &ny, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(nx, ny, "'%s': %d ids from the JSON, %d prepared", s, nx, ny);
	for (int i = 0; i < nx; i++)
		cr_assert_eq(x[i], y[i], "'%s': id %d: %d from the JSON, %d prepared", s, i, x[i],
			     y[i]);
	free(x);
	free(y);
}

static void same_text(const struct tok *a, const struct tok *b, const int *ids, int n,
		      bool utf8, bool skip)
{
	char *x, *y, err[WK_ERRSZ];
	size_t nx, ny;
	int (*dec)(const struct tok *, const int *, int, bool, char **, size_t *, char *,
		   size_t) = utf8 ? tok_decode_utf8 : tok_decode;
	cr_assert_eq(dec(a, ids, n, skip, &x, &nx, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(dec(b, ids, n, skip, &y, &ny, err, sizeof err), WK_OK, "%s", err);
	cr_assert(nx == ny && !memcmp(x, y, nx), "decode of %d ids from id %d: '%s' against "
		  "'%s'", n, ids[0], x, y);
	free(x);
	free(y);
}

/* a and b agree on every lookup, every text and every id decoded alone and all together. */
static void same(const struct tok *a, const struct tok *b)
{
	int n = tok_vocab_size(a);
	cr_assert_eq(n, tok_vocab_size(b));
	cr_assert_eq(tok_bos(a), tok_bos(b));
	cr_assert_eq(tok_eos(a), tok_eos(b));
	int *all = malloc(sizeof(int) * (size_t)n);
	int m = 0;
	for (int id = 0; id < n; id++) {
		const char *p = tok_piece(a, id), *q = tok_piece(b, id);
		cr_assert((!p && !q) || (p && q && !strcmp(p, q)), "id %d: piece '%s' against '%s'",
			  id, p ? p : "(none)", q ? q : "(none)");
		cr_assert_eq(tok_is_special(a, id), tok_is_special(b, id), "id %d", id);
		if (!p)
			continue;
		cr_assert_eq(tok_id(a, p), tok_id(b, p), "piece '%s'", p);
		all[m++] = id;
		same_text(a, b, &id, 1, false, false);
		same_text(a, b, &id, 1, true, true);
	}
	same_text(a, b, all, m, false, false);
	same_text(a, b, all, m, true, true);
	free(all);
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
		same_ids(a, b, texts[i], false);
		same_ids(a, b, texts[i], true);
	}
}

static void round_trip(const char *path)
{
	struct tok *a, *b;
	size_t len, jl;
	char err[WK_ERRSZ];
	char *buf = prepare(path, &a, &len);
	char *json = slurp(path, &jl);
	cr_assert_eq(tok_load_prepared_mem(buf, len, json, jl, &b, err, sizeof err), WK_OK, "%s",
		     err);
	same(a, b);
	/* written again, the prepared form is the same bytes */
	char *again;
	size_t alen;
	cr_assert_eq(tok_prepare(b, json, jl, &again, &alen, err, sizeof err), WK_OK, "%s", err);
	cr_assert(alen == len && !memcmp(again, buf, len), "a reloaded tokenizer prepares to "
		  "other bytes (%zu against %zu)", alen, len);
	free(again);
	tok_free(a);
	tok_free(b);
	free(buf);
	free(json);
}

Test(tokenizer_prepared, sentencepiece_round_trip)
{
	round_trip(stories_json());
}

Test(tokenizer_prepared, metaspace_round_trip)
{
	round_trip(metaspace_json());
}

Test(tokenizer_prepared, byte_level_round_trip)
{
	round_trip(bytelevel_json());
}

/* The file API: written with wk_write_file, loaded with and without its tokenizer.json. */
Test(tokenizer_prepared, from_a_file_checked_against_its_json)
{
	const char *path = bytelevel_json();
	struct tok *a, *b;
	size_t len;
	char err[WK_ERRSZ], prep[800], other[800];
	char *buf = prepare(path, &a, &len);
	snprintf(prep, sizeof prep, "%s/tokenizer.prepared", dir);
	cr_assert_eq(wk_write_file(prep, buf, len, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(tok_load_prepared(prep, path, &b, err, sizeof err), WK_OK, "%s", err);
	same(a, b);
	tok_free(b);
	cr_assert_eq(tok_load_prepared(prep, NULL, &b, err, sizeof err), WK_OK, "%s", err);
	tok_free(b);

	/* beside another tokenizer.json: stale, so the caller reads the JSON */
	snprintf(other, sizeof other, "%s", stories_json());
	cr_assert_eq(tok_load_prepared(prep, other, &b, err, sizeof err), WK_EUNSUPPORTED);
	cr_assert_null(b);
	cr_assert(strstr(err, prep) && strstr(err, "stale"), "%s", err);
	/* the same size, one byte changed */
	size_t jl;
	char *json = slurp(path, &jl);
	json[jl - 2] = json[jl - 2] == ' ' ? '\t' : ' ';
	snprintf(other, sizeof other, "%s/edited.json", dir);
	cr_assert_eq(wk_write_file(other, json, jl, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(tok_load_prepared(prep, other, &b, err, sizeof err), WK_EUNSUPPORTED, "%s",
		     err);
	/* no tokenizer.json to check against */
	snprintf(other, sizeof other, "%s/absent.json", dir);
	cr_assert_neq(tok_load_prepared(prep, other, &b, err, sizeof err), WK_OK);
	cr_assert(strstr(err, "absent.json"), "%s", err);
	free(json);
	tok_free(a);
	free(buf);
}


static void put64(char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (char)(unsigned char)(v >> (8 * i));
}

/* Refusals that name the reason: each a copy of a good file with one thing wrong. */
Test(tokenizer_prepared, refusals)
{
	struct tok *a, *b = (struct tok *)1;
	size_t len;
	char err[WK_ERRSZ];
	char *buf = prepare(bytelevel_json(), &a, &len);
	char *c = malloc(len);
	struct {
		const char *what;
		size_t at; /* byte to change (xor 0x5a), or the length to keep */
		bool cut;
		int rc;
		const char *msg;
	} cases[] = {
		{"magic", 3, false, WK_EFORMAT, "magic"},
		{"version", 8, false, WK_EUNSUPPORTED, "version"},
		{"payload size", 33, false, WK_EFORMAT, "truncated"},
		{"payload byte", len - 1, false, WK_EFORMAT, "checksum"},
		{"payload byte", 48 + 20, false, WK_EFORMAT, "checksum"},
		{"cut in the header", 20, true, WK_EFORMAT, "header"},
		{"cut in the payload", len - 7, true, WK_EFORMAT, "truncated"},
		{"empty", 0, true, WK_EFORMAT, "magic"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		memcpy(c, buf, len);
		size_t n = cases[i].cut ? cases[i].at : len;
		if (!cases[i].cut)
			c[cases[i].at] ^= 0x5a;
		cr_assert_eq(tok_load_prepared_mem(c, n, NULL, 0, &b, err, sizeof err), cases[i].rc,
			     "%s: %s", cases[i].what, err);
		cr_assert_null(b, "%s", cases[i].what);
		cr_assert(strstr(err, cases[i].msg), "%s: '%s' does not say %s", cases[i].what, err,
			  cases[i].msg);
	}
	/* past the checksum: the vocabulary's strings start after the scalars and byte_id; a
	 * byte of them that makes invalid UTF-8 (which tok_decode_utf8 would pass on) */
	size_t strs = 48 + 1 + 4 + 4 + 3 + 256 * 4 + 4;
	memcpy(c, buf, len);
	cr_assert_neq(c[strs], 0, "the layout moved: byte %zu is not a piece's", strs);
	c[strs] = (char)0xff;
	put64(c + 40, XXH3_64bits(c + 48, len - 48));
	cr_assert_eq(tok_load_prepared_mem(c, len, NULL, 0, &b, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "bad field"), "%s", err);
	free(c);
	tok_free(a);
	free(buf);
}

/* Past the checksum: every byte of the payload changed in turn, the checksum made to match,
 * so that the field checks alone stand between the bytes and the tables. Each load either
 * refuses the file or gives a tokenizer that encodes and decodes without fault (ASan and
 * UBSan watch this under the asan stage). Some changes must be refused. */
Test(tokenizer_prepared, every_payload_byte_changed, .timeout = 60)
{
	struct tok *a, *b;
	size_t len;
	char err[WK_ERRSZ];
	char *buf = prepare(bytelevel_json(), &a, &len);
	char *c = malloc(len);
	int refused = 0, loaded = 0;
	for (size_t at = 48; at < len; at++) {
		memcpy(c, buf, len);
		c[at] ^= (char)(at % 3 == 0 ? 0x01 : at % 3 == 1 ? 0x80 : 0xff);
		put64(c + 40, XXH3_64bits(c + 48, len - 48));
		int rc = tok_load_prepared_mem(c, len, NULL, 0, &b, err, sizeof err);
		if (rc != WK_OK) {
			cr_assert_eq(rc, WK_EFORMAT, "byte %zu: %s", at, err);
			cr_assert(strstr(err, "bad field"), "byte %zu: %s", at, err);
			refused++;
			continue;
		}
		loaded++;
		for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
			int *ids, n;
			if (tok_encode(b, texts[i], strlen(texts[i]), true, &ids, &n, err,
				       sizeof err) == WK_OK) {
				char *s;
				size_t sl;
				if (tok_decode_utf8(b, ids, n, false, &s, &sl, err, sizeof err) ==
				    WK_OK)
					free(s);
				free(ids);
			}
		}
		tok_free(b);
	}
	cr_assert_gt(refused, 100, "only %d of %zu changed payloads refused", refused, len - 48);
	cr_log_info("%d refused, %d loaded\n", refused, loaded);
	free(c);
	tok_free(a);
	free(buf);
}

/* The memo (tok_memo_set) keeps a segment that begins the text apart from the same bytes
 * after an added token: with a Metaspace that prepends "▁" to the first word only, their ids
 * differ, and the memo's are the plain tokenizer's for both. */
Test(tokenizer_prepared, the_memo_keeps_the_first_segment_apart)
{
	struct tok *plain, *memo;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_load(metaspace_json(), &plain, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(tok_load(metaspace_json(), &memo, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(tok_memo_set(memo, 1 << 20), WK_OK);
	char seg[1400] = "";
	while (strlen(seg) < 1200)
		strcat(seg, "Once upon a time there was a girl. ");
	char both[3000];
	snprintf(both, sizeof both, "%s</s>%s", seg, seg);
	int *a, *b, na, nb;
	/* the second copy's ids, after </s>, are not the first's */
	cr_assert_eq(tok_encode(plain, both, strlen(both), false, &a, &na, err, sizeof err), WK_OK);
	cr_assert_eq(na % 2, 1, "%d ids", na);
	cr_expect(memcmp(a, a + na / 2 + 1, (size_t)(na / 2) * sizeof *a) != 0 ||
		  tok_id(plain, "</s>") != a[na / 2], "no ▁ before the first word only?");
	for (int k = 0; k < 3; k++) { /* (both copies' keys, then hits) */
		const char *s = k == 1 ? seg : both;
		int *p, np;
		cr_assert_eq(tok_encode(plain, s, strlen(s), false, &p, &np, err, sizeof err), WK_OK);
		cr_assert_eq(tok_encode(memo, s, strlen(s), false, &b, &nb, err, sizeof err), WK_OK);
		cr_expect(np == nb && !memcmp(p, b, (size_t)np * sizeof *p), "pass %d: %d and %d ids",
			  k, np, nb);
		free(p);
		free(b);
	}
	struct tok_memo_stats st;
	tok_memo_stats(memo, &st);
	cr_expect_eq(st.entries, 2);
	cr_expect_eq(st.hits, 3);
	free(a);
	tok_free(plain);
	tok_free(memo);
}
