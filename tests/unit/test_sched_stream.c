/*
 * The scheduler's streaming hook (sched_req.on_token) on the real stories260K model: the
 * pieces add up to the final text exactly, one call per generated token, and text that could
 * still become a stop string is held back, never streamed and then cut.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/sched.h"

static char dir[256];
static struct engine *eng;

static void setup(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512], err[WK_ERRSZ];
	snprintf(dir, sizeof dir, "/tmp/wick-stream-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "%s", err);
	struct eng_opts o = {.backend = "cpu", .max_seq = 256, .max_seqs = 4};
	cr_assert_eq(eng_open(dir, &o, &eng, err, sizeof err), WK_OK, "%s", err);
}

static void teardown(void)
{
	eng_close(eng);
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(sched_stream, .init = setup, .fini = teardown);

struct stream {
	char text[4][4096];
	size_t len[4];
	int calls[4];
	int max_seen_tokens[4];
	struct sched_req *done[4];
	int n_done;
	const char *stop; /* no piece may end inside a prefix of it... checked at the end */
};

static int index_of(struct sched_req *r)
{
	return r->id[0] - 'a';
}

static void on_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	struct stream *s = ctx;
	int i = index_of(r);
	cr_assert_lt(s->len[i] + len, sizeof s->text[i]);
	memcpy(s->text[i] + s->len[i], piece, len);
	s->len[i] += len;
	s->text[i][s->len[i]] = 0;
	s->calls[i]++;
	s->max_seen_tokens[i] = r->n_out;
}

static void on_done(void *ctx, struct sched_req *r)
{
	struct stream *s = ctx;
	s->done[s->n_done++] = r;
}

/* Steps s until nothing is pending (at most 1000 steps), and expects all four done. */
static void run_to_end(struct sched *s, struct stream *st)
{
	for (int k = 0; sched_pending(s) > 0; k++) {
		cr_assert_geq(sched_step(s, on_done, st), 0);
		cr_assert_lt(k, 1000);
	}
	cr_assert_eq(st->n_done, 4);
}

static struct sched_req *req(const char *id, const char *prompt, int max_tokens)
{
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "%s", id);
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), prompt, strlen(prompt), true, &r->prompt,
				&r->n_prompt, err, sizeof err), WK_OK);
	r->max_tokens = max_tokens;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	r->on_token = on_token;
	return r;
}

Test(sched_stream, pieces_add_up_to_the_text)
{
	char err[WK_ERRSZ];
	struct sched *s = sched_create(eng, NULL);
	struct stream st = {0};
	/* a: no stop string, long enough for the decode window to slide many times;
	 * b: a stop string that appears ("Lily"); c: stop strings that never match but whose
	 * prefixes do ("Lil!", ". Z"); d: sampled, so pieces of odd tokens occur */
	struct sched_req *a = req("a", "", 200), *b = req("b", "", 200), *c = req("c", "", 120),
			 *d = req("d", "The cat", 150);
	b->stop[b->n_stop++] = strdup("Lily");
	c->stop[c->n_stop++] = strdup("Lil!");
	c->stop[c->n_stop++] = strdup(". Z");
	d->samp = (struct samp_cfg){.temperature = 1.0f, .top_p = 1, .seed = 7};
	struct sched_req *all[4] = {a, b, c, d};
	for (int i = 0; i < 4; i++)
		cr_assert_eq(sched_submit(s, all[i], err, sizeof err), WK_OK);
	run_to_end(s, &st);
	for (int k = 0; k < 4; k++) {
		struct sched_req *r = st.done[k];
		int i = index_of(r);
		cr_expect_eq(r->status, SCHED_DONE);
		cr_expect_eq(st.len[i], r->text_len, "%s: streamed %zu bytes, text %zu", r->id,
			     st.len[i], r->text_len);
		cr_expect_str_eq(st.text[i], r->text, "request %s", r->id);
		cr_expect_eq(st.max_seen_tokens[i], r->n_out);
		/* one call per generated token, plus at most one final flush */
		cr_expect(st.calls[i] >= r->n_out && st.calls[i] <= r->n_out + 1, "%s: %d calls for "
			  "%d tokens", r->id, st.calls[i], r->n_out);
		if (i == 1) {
			cr_expect_eq(r->finish, SCHED_FIN_STOP);
			cr_expect_str_eq(r->text, "Once upon a time, there was a little girl named ");
		}
		if (i == 0)
			cr_expect(strncmp(r->text, "Once upon a time, there was a little girl named "
					  "Lily", 52) == 0, "%s", r->text);
		sched_req_free(r);
	}
	sched_free(s);
}

/* The stream never shows text that a stop string later removes: after each call, what was
 * streamed is a prefix of the final text. */
struct prefix_check {
	char seen[4096];
	size_t len;
	char snap[300][4096];
	int n;
	struct sched_req *done;
};

static void on_token_snap(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	(void)r;
	struct prefix_check *p = ctx;
	memcpy(p->seen + p->len, piece, len);
	p->len += len;
	p->seen[p->len] = 0;
	if (p->n < 300)
		memcpy(p->snap[p->n++], p->seen, p->len + 1);
}

static void on_done_snap(void *ctx, struct sched_req *r)
{
	((struct prefix_check *)ctx)->done = r;
}

Test(sched_stream, held_back_text_is_never_streamed_then_cut)
{
	char err[WK_ERRSZ];
	struct sched *s = sched_create(eng, NULL);
	static struct prefix_check p;
	memset(&p, 0, sizeof p);
	struct sched_req *r = req("a", "", 200);
	r->on_token = on_token_snap;
	r->stop[r->n_stop++] = strdup("little girl named Lily"); /* its prefixes come first */
	cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK);
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, on_done_snap, &p), 0);
	cr_assert_not_null(p.done);
	cr_expect_str_eq(p.done->text, "Once upon a time, there was a ");
	for (int i = 0; i < p.n; i++)
		cr_expect(strncmp(p.snap[i], p.done->text, strlen(p.snap[i])) == 0,
			  "streamed '%s', then the text became '%s'", p.snap[i], p.done->text);
	sched_req_free(p.done);
	sched_free(s);
}

/* Random weights (tests/tools/gen_llama) with stories260K's tokenizer generate runs of
 * <0xXX> byte tokens that are not valid UTF-8, which HF's ByteFallback decodes as one U+FFFD a
 * byte for the whole run: a later byte turns an earlier, valid one into U+FFFD. The stream
 * holds a run's text back until it ends, so the pieces still add up to the text exactly
 * (before, they parted from it at the first such run). */
static struct engine *open_random(void)
{
	const char *tools = getenv("WICK_TOOLS");
	char def[512], rnd[300], cmd[2048], err[WK_ERRSZ];
	if (!tools) {
		snprintf(def, sizeof def, "%s/tools", getenv("WICK_BUILD") ? getenv("WICK_BUILD")
									   : "build");
		tools = def;
	}
	snprintf(rnd, sizeof rnd, "%s/random", dir);
	snprintf(cmd, sizeof cmd, "'%s/gen_llama' -o '%s' --vocab 512 --max-pos 256 --dtype f32 "
		 "--seed 9 >/dev/null && cp '%s/tokenizer.json' '%s/'", tools, rnd, dir, rnd);
	cr_assert_eq(system(cmd), 0, "%s failed (is $WICK_TOOLS/gen_llama built?)", cmd);
	struct engine *re;
	struct eng_opts o = {.backend = "cpu", .max_seq = 256, .max_seqs = 4};
	cr_assert_eq(eng_open(rnd, &o, &re, err, sizeof err), WK_OK, "%s", err);
	return re;
}

Test(sched_stream, byte_token_runs_add_up_too)
{
	char err[WK_ERRSZ];
	struct engine *re = open_random();
	struct engine *saved = eng;
	eng = re; /* req() encodes with eng's tokenizer */
	struct sched *s = sched_create(re, NULL);
	struct stream st = {0};
	struct sched_req *all[4] = {req("a", "", 240), req("b", "", 240), req("c", "Once", 240),
				    req("d", "", 240)};
	for (int i = 0; i < 4; i++) {
		all[i]->samp = (struct samp_cfg){.temperature = i == 3 ? 0 : 1.0f, .top_p = 1,
						 .seed = 11 + (uint64_t)i};
		cr_assert_eq(sched_submit(s, all[i], err, sizeof err), WK_OK);
	}
	run_to_end(s, &st);
	int runs = 0;
	for (int k = 0; k < 4; k++) {
		struct sched_req *r = st.done[k];
		int i = index_of(r);
		for (int t = 1; t < r->n_out; t++)
			runs += tok_is_byte_fallback(eng_tokenizer(re), r->out[t - 1]) &&
				tok_is_byte_fallback(eng_tokenizer(re), r->out[t]);
		cr_expect_eq(st.len[i], r->text_len, "%s: streamed %zu bytes, text %zu", r->id,
			     st.len[i], r->text_len);
		cr_expect(st.len[i] == r->text_len && !memcmp(st.text[i], r->text, r->text_len),
			  "request %s: the stream parted from the text", r->id);
		sched_req_free(r);
	}
	cr_expect_gt(runs, 10, "only %d adjacent byte tokens: the case is not exercised", runs);
	sched_free(s);
	eng = saved;
	eng_close(re);
}

/* A token the decoder drops (stories260K's <unk>: skipped as special) does not end a run of
 * byte tokens: HF's ByteFallback sees the bytes on both sides of it as one run, so
 * <0x14> <unk> <0x8D> is two U+FFFD, not "\x14" and one. The stream must not send the first
 * byte's text when the <unk> comes (the pieces parted from the text there, and the final
 * flush began inside a character). On random weights a bias makes the sampler pick among a
 * few byte tokens, <unk> and one word, about uniformly. */
Test(sched_stream, a_skipped_token_does_not_end_a_byte_run)
{
	char err[WK_ERRSZ];
	struct engine *re = open_random(), *saved = eng;
	eng = re; /* req() encodes with eng's tokenizer */
	const struct tok *tk = eng_tokenizer(re);
	int ids[] = {tok_id(tk, "<unk>"), tok_id(tk, "<0x14>"), tok_id(tk, "<0x8D>"),
		     tok_id(tk, "<0xE2>"), tok_id(tk, "<0x80>"), tok_id(tk, "<0x94>"),
		     tok_id(tk, "\xE2\x96\x81" "a")};
	int n = (int)(sizeof ids / sizeof ids[0]);
	for (int i = 0; i < n; i++)
		cr_assert_geq(ids[i], 0, "token %d is not in stories260K's vocabulary", i);
	cr_assert(!tok_is_byte_fallback(tk, ids[0]) && tok_is_byte_fallback(tk, ids[1]));
	struct sched *s = sched_create(re, NULL);
	struct stream st = {0};
	struct sched_req *all[4];
	for (int i = 0; i < 4; i++) {
		char id[2] = {(char)('a' + i), 0};
		struct sched_req *r = all[i] = req(id, "", 200);
		r->samp = (struct samp_cfg){.temperature = 1.0f, .top_p = 1, .seed = 21 + (uint64_t)i};
		r->bias_id = malloc(sizeof ids);
		r->bias = malloc((size_t)n * sizeof *r->bias);
		cr_assert(r->bias_id && r->bias);
		memcpy(r->bias_id, ids, sizeof ids);
		for (int k = 0; k < n; k++)
			r->bias[k] = 100;
		r->n_bias = n;
		cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	}
	run_to_end(s, &st);
	int across = 0;
	for (int k = 0; k < 4; k++) {
		struct sched_req *r = st.done[k];
		int i = index_of(r);
		for (int t = 2; t < r->n_out; t++)
			across += tok_is_byte_fallback(tk, r->out[t - 2]) && r->out[t - 1] == ids[0] &&
				  tok_is_byte_fallback(tk, r->out[t]);
		cr_expect_eq(r->n_out, 200);
		cr_expect(st.len[i] == r->text_len && !memcmp(st.text[i], r->text, r->text_len),
			  "request %s: the stream (%zu bytes) parted from the text (%zu bytes)", r->id,
			  st.len[i], r->text_len);
		sched_req_free(r);
	}
	cr_expect_gt(across, 10, "only %d <unk> between byte tokens: the case is not exercised",
		     across);
	sched_free(s);
	eng = saved;
	eng_close(re);
}
