/* Fuzz target: the scheduler's stream (sched_req.on_token) on arbitrary output tokens. The
 * input names the tokens a request generates and up to three stop strings (each the text of
 * one to three of those ids, so that they occur); the stream's pieces must each be valid
 * UTF-8 and add up to the request's final text exactly, whatever runs of <0xXX> byte tokens,
 * skipped specials (<unk>, <s>) and stop strings come. The model is stories260K (its
 * tokenizer has byte fallback) on the null backend, whose logits are all zero: a bias of 1 on
 * the next input id, moved before each step, makes the greedy pick that id. The same model
 * also runs under a small byte-level tokenizer (GLM's kind: a character's bytes may come in
 * several tokens, and a decode makes U+FFFD of what is cut). Input: a byte (bits 0-1: how
 * many stop strings; bits 2-3: how many ids go to the prompt, after its BOS, as the text
 * the first pieces follow; bit 4: the byte-level tokenizer), a byte for each stop string
 * (where in the output ids, and how many), then the ids, two bytes each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "tests/bytelevel.h"
#include "tests/fuzz/fuzz.h"
#include "worker/sched.h"

#define MAX_OUT 160

static struct engine *engs[2]; /* stories260K's tokenizer (byte fallback); a byte-level one */

/* A byte-level BPE tokenizer.json (GLM's kind) at path: specials at 0-2 (<|endoftext|> at
 * 2, the model's EOS), the 256 bytes at 3-258, pieces that hold parts of UTF-8 characters
 * (as GLM's and Qwen's vocabularies do: a CJK character in two tokens) at 259-266, and added
 * tokens <think>, </think> (not special) and <|user|> (special: a decode skips it). */
static int write_byte_level(const char *path, char *err, size_t errsz)
{
	static const char *const pieces[][2] = { /* (as bytes) */
		{" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xE4", "\xBD"}, /* e4 bd: U+4F60 but a0 */
		{"\xA0", "\xE5"}, {"\xE2", "\x82"}, {"\xAC", " "}, {"\xF0", "\x9F"}};
	json_t *vocab = json_object(), *merges = json_array();
	const char *special[] = {"<unk>", "<s>", "<|endoftext|>"};
	for (int i = 0; i < 3; i++)
		json_object_set_new(vocab, special[i], json_integer(i));
	for (int b = 0; b < 256; b++) {
		char c[3];
		bl_char(b, c);
		json_object_set_new(vocab, c, json_integer(3 + b));
	}
	for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
		char part[2][12] = {"", ""}, joined[24], merge[26];
		for (int k = 0; k < 2; k++)
			for (const char *b = pieces[i][k]; *b; b++) {
				char c[3];
				bl_char((unsigned char)*b, c);
				strcat(part[k], c);
			}
		snprintf(joined, sizeof joined, "%s%s", part[0], part[1]);
		snprintf(merge, sizeof merge, "%s %s", part[0], part[1]);
		json_object_set_new(vocab, joined, json_integer(259 + (json_int_t)i));
		json_array_append_new(merges, json_string(merge));
	}
	json_t *added = json_pack("[{s:i,s:s,s:b},{s:i,s:s,s:b},{s:i,s:s,s:b},{s:i,s:s,s:b},"
				  "{s:i,s:s,s:b},{s:i,s:s,s:b}]",
				  "id", 0, "content", "<unk>", "special", 1, "id", 1, "content",
				  "<s>", "special", 1, "id", 2, "content", "<|endoftext|>", "special",
				  1, "id", 267, "content", "<think>", "special", 0, "id", 268,
				  "content", "</think>", "special", 0, "id", 269, "content",
				  "<|user|>", "special", 1);
	json_t *root = json_pack("{s:o,s:{s:s,s:b},s:{s:s},s:{s:s,s:o,s:o}}", "added_tokens",
				 added, "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
				 "decoder", "type", "ByteLevel", "model", "type", "BPE", "vocab",
				 vocab, "merges", merges);
	int rc = root && json_dump_file(root, path, 0) == 0
			 ? WK_OK
			 : wk_errf(err, errsz, WK_EIO, "%s: the tokenizer could not be written", path);
	json_decref(root);
	return rc;
}

static void load(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[1024], tok[1024], dir[64], path[128], cmd[128], err[WK_ERRSZ];
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	snprintf(dir, sizeof dir, "/tmp/wick-fuzz-stream-%d", (int)getpid());
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	struct eng_opts o = {.backend = "null", .max_seq = 256, .max_seqs = 1};
	int rc = conv_llama2c(bin, tok, dir, err, sizeof err);
	if (rc == WK_OK)
		rc = eng_open(dir, &o, &engs[0], err, sizeof err);
	if (rc == WK_OK)
		rc = write_byte_level(path, err, sizeof err);
	if (rc == WK_OK)
		rc = eng_open(dir, &o, &engs[1], err, sizeof err);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0 || rc != WK_OK) {
		fprintf(stderr, "fuzz stream: %s\n", err);
		abort();
	}
}

/* Whether s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t k = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
			 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
		if (!k || i + k > n)
			return false;
		unsigned cp = k == 1 ? c : c & (0x7F >> k);
		for (size_t j = 1; j < k; j++) {
			if ((s[i + j] & 0xC0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3F);
		}
		if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) ||
		    (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
			return false;
		i += k;
	}
	return true;
}

struct seen {
	char text[MAX_OUT * 16 + 1];
	size_t len;
	struct sched_req *done;
};

static void on_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	(void)r;
	struct seen *s = ctx;
	if (!utf8_ok((const unsigned char *)piece, len) || s->len + len >= sizeof s->text)
		abort();
	memcpy(s->text + s->len, piece, len);
	s->len += len;
}

static void on_done(void *ctx, struct sched_req *r)
{
	((struct seen *)ctx)->done = r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!engs[0])
		load();
	if (size < 1)
		return 0;
	struct engine *eng = engs[data[0] >> 4 & 1];
	const struct tok *tk = eng_tokenizer(eng);
	int vocab = tok_vocab_size(tk), ids[MAX_OUT], n = 0;
	size_t at = 1;
	int n_stop = data[0] & 3;
	struct { int first, count; } stops[3];
	for (int i = 0; i < n_stop && at < size; i++) { /* where in the ids, and how many */
		stops[i].first = data[at] >> 2;
		stops[i].count = 1 + (data[at] & 3) % 3;
		at++;
	}
	n_stop = n_stop < (int)(at - 1) ? n_stop : (int)(at - 1);
	for (; at + 1 < size && n < MAX_OUT; at += 2)
		ids[n++] = (data[at] | data[at + 1] << 8) % vocab;
	int np = (data[0] >> 2) & 3; /* the first np ids are the prompt's, after its BOS */
	if (np >= n)
		return 0;
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "fuzz");
	r->prompt = malloc((size_t)(1 + np) * sizeof *r->prompt);
	r->bias_id = malloc(sizeof *r->bias_id);
	r->bias = malloc(sizeof *r->bias);
	if (!r->prompt || !r->bias_id || !r->bias)
		abort();
	r->prompt[0] = tok_bos(tk) >= 0 ? tok_bos(tk) : 1;
	memcpy(r->prompt + 1, ids, (size_t)np * sizeof *ids);
	r->n_prompt = 1 + np;
	const int *want = ids + np;
	n -= np;
	r->max_tokens = n;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	r->bias_id[0] = want[0];
	r->bias[0] = 1;
	r->n_bias = 1;
	r->on_token = on_token;
	for (int i = 0; i < n_stop; i++) {
		int f = stops[i].first % n, c = stops[i].count < n - f ? stops[i].count : n - f;
		char *t;
		size_t len;
		if (tok_decode_utf8(tk, want + f, c, true, &t, &len, NULL, 0) != WK_OK)
			abort();
		if (len && strlen(t) == len)
			r->stop[r->n_stop++] = t;
		else
			free(t);
	}
	struct sched *s = sched_create(eng, NULL);
	char err[WK_ERRSZ];
	if (!s || sched_submit(s, r, err, sizeof err) != WK_OK) {
		fprintf(stderr, "fuzz stream: %s\n", s ? err : "out of memory");
		abort();
	}
	static struct seen seen;
	memset(&seen, 0, sizeof seen);
	for (int k = 0; sched_pending(s) > 0; k++) {
		if (k > MAX_OUT + 4)
			abort(); /* a step that picked no token */
		if (!seen.done && r->n_out < n)
			r->bias_id[0] = want[r->n_out];
		if (sched_step(s, on_done, &seen) < 0)
			abort();
	}
	if (seen.done != r || r->status != SCHED_DONE || seen.len != r->text_len ||
	    memcmp(seen.text, r->text, r->text_len))
		abort();
	/* the request generated the input's ids, up to an end-of-sequence or a stop */
	for (int i = 0; i < r->n_out; i++)
		if (r->out[i] != want[i])
			abort();
	sched_req_free(r);
	sched_free(s);
	return 0;
}
