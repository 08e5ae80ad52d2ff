/*
 * Speculative decoding by prompt lookup (sched_set_speculate) on the real stories260K model:
 * the same requests with it and without give the same tokens, texts, finishes and streamed
 * pieces, in fewer steps; drafts are kept and thrown away as the step log and the counts
 * say; sampled requests do not speculate.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
	snprintf(dir, sizeof dir, "/tmp/wick-spec-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "%s", err);
	struct eng_opts o = {.backend = "cpu", .max_seq = 256, .max_seqs = 8};
	cr_assert_eq(eng_open(dir, &o, &eng, err, sizeof err), WK_OK, "%s", err);
}

static void teardown(void)
{
	eng_close(eng);
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(sched_spec, .init = setup, .fini = teardown);

#define NREQ 8

struct run {
	struct sched_req *r[NREQ];
	int n;
	char streamed[NREQ][8192];
	size_t slen[NREQ];
};

static void on_done(void *ctx, struct sched_req *r)
{
	struct run *f = ctx;
	f->r[r->id[0] - 'a'] = r;
	f->n++;
}

static void on_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	struct run *f = ctx;
	int i = r->id[0] - 'a';
	cr_assert_lt(f->slen[i] + len, sizeof f->streamed[i]);
	memcpy(f->streamed[i] + f->slen[i], piece, len);
	f->slen[i] += len;
}

/* The requests: prompts that repeat themselves or not, a stop string that ends a request in
 * the middle of a kept draft or not, one that runs into the context's end, one sampled. */
static struct sched_req *req(int i)
{
	static const char *const prompts[NREQ] = {
		"",
		"Lily and Ben went to the park. Lily and Ben played with a ball. Lily and Ben",
		"Once upon a time",
		"The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
		"Tom had a red ball. Tom had a red ball. Tom",
		"",
		"One day, a little bird",
		"Sue liked to sing.",
	};
	static const int max_tokens[NREQ] = {200, 60, 7, 80, 150, 9999, 100, 100};
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "%c", 'a' + i);
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), prompts[i], strlen(prompts[i]), true,
				&r->prompt, &r->n_prompt, err, sizeof err), WK_OK);
	r->max_tokens = max_tokens[i];
	r->samp = (struct samp_cfg){.temperature = i == 7 ? 0.8f : 0, .top_p = 1, .seed = 5};
	if (i == 4)
		r->stop[r->n_stop++] = strdup("with his ball.\nOne");
	if (i == 6)
		r->stop[r->n_stop++] = strdup("play with the ball.\nBobo");
	r->on_token = on_token;
	return r;
}

static long run_all(struct run *f, int spec, char **log)
{
	size_t loglen;
	FILE *lf = open_memstream(log, &loglen);
	struct sched *s = sched_create(eng, lf);
	cr_assert_eq(sched_set_speculate(s, spec), WK_OK);
	char err[WK_ERRSZ];
	for (int i = 0; i < NREQ; i++)
		cr_assert_eq(sched_submit(s, req(i), err, sizeof err), WK_OK, "%s", err);
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, on_done, f), 0);
	long steps = sched_steps(s);
	cr_assert_eq(f->n, NREQ);
	sched_free(s);
	fclose(lf);
	return steps;
}

Test(sched_spec, same_output_in_fewer_steps)
{
	static struct run plain, spec;
	char *plog, *slog;
	long ps = run_all(&plain, 0, &plog), ss = run_all(&spec, 4, &slog);
	int drafted = 0, accepted = 0;
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *a = plain.r[i], *b = spec.r[i];
		cr_expect_eq(b->status, SCHED_DONE);
		cr_expect_eq(a->finish, b->finish, "request %c", 'a' + i);
		cr_expect_eq(a->n_out, b->n_out, "request %c", 'a' + i);
		cr_expect(a->n_out == b->n_out && !memcmp(a->out, b->out, a->n_out * sizeof(int)),
			  "request %c: the tokens differ", 'a' + i);
		cr_expect_str_eq(b->text, a->text, "request %c", 'a' + i);
		cr_expect(spec.slen[i] == b->text_len && !memcmp(spec.streamed[i], b->text,
								b->text_len),
			  "request %c: the streamed pieces are not the text", 'a' + i);
		cr_expect_leq(b->accepted, b->drafted);
		cr_expect_eq(a->drafted, 0);
		drafted += b->drafted;
		accepted += b->accepted;
		if (i != 2 && i != 7)
			cr_expect_lt(b->steps, a->steps, "request %c took %d steps against %d",
				     'a' + i, b->steps, a->steps);
	}
	/* the sampled request: no drafts, and its seeded draws make the same text */
	cr_expect_eq(spec.r[7]->drafted, 0);
	/* the stop strings ended e and g, after repeats that drafts were kept from; the
	 * context's end f (256 positions: the last token is not run) */
	cr_expect_eq(spec.r[4]->finish, SCHED_FIN_STOP);
	cr_expect_eq(spec.r[6]->finish, SCHED_FIN_STOP);
	cr_expect_eq(spec.r[5]->finish, SCHED_FIN_LENGTH);
	cr_expect_eq(spec.r[5]->n_prompt + spec.r[5]->n_out, 256);
	cr_expect_lt(ss, ps, "%ld steps with speculation against %ld", ss, ps);
	cr_expect_gt(accepted, drafted / 4, "kept %d of %d drafts", accepted, drafted);
	/* the step log: decode items with a draft ran 1 + draft tokens */
	int with = 0;
	for (char *p = strstr(slog, "\"draft\": "); p; p = strstr(p + 1, "\"draft\": ")) {
		char *q = p;
		while (q > slog && strncmp(q, "\"tokens\": ", 10))
			q--;
		cr_assert(q > slog);
		cr_expect_eq(atoi(q + 10), 1 + atoi(p + 9));
		with++;
	}
	cr_expect_gt(with, 0);
	cr_expect_null(strstr(plog, "\"draft\""));
	cr_expect_null(strstr(slog, "{\"id\": \"h\", \"phase\": \"decode\", \"tokens\": 2"));
	fprintf(stderr, "speculation: %ld steps against %ld, kept %d of %d drafts\n", ss, ps,
		accepted, drafted);
	for (int i = 0; i < NREQ; i++) {
		sched_req_free(plain.r[i]);
		sched_req_free(spec.r[i]);
	}
	free(plog);
	free(slog);
}

Test(sched_spec, refusals)
{
	struct sched *s = sched_create(eng, NULL);
	cr_expect_eq(sched_set_speculate(s, -1), WK_EINVAL);
	cr_expect_eq(sched_set_speculate(s, SCHED_DRAFT_MAX + 1), WK_EINVAL);
	cr_expect_eq(sched_set_speculate(s, SCHED_DRAFT_MAX), WK_OK);
	cr_expect_eq(sched_set_speculate(s, 0), WK_OK);
	sched_free(s);
}

/* One greedy request of max_tokens on prompt with prediction pred[0..np) (copied; NULL:
 * none), speculating up to spec tokens; returns it finished. */
static struct sched_req *one(const char *prompt, int max_tokens, const int *pred, int np,
			     int spec)
{
	struct sched *s = sched_create(eng, NULL);
	cr_assert_eq(sched_set_speculate(s, spec), WK_OK);
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "a");
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), prompt, strlen(prompt), true, &r->prompt,
				&r->n_prompt, err, sizeof err), WK_OK);
	r->max_tokens = max_tokens;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	if (pred) {
		r->pred = malloc((size_t)np * sizeof *r->pred);
		memcpy(r->pred, pred, (size_t)np * sizeof *r->pred);
		r->n_pred = np;
	}
	cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	struct run f = {0};
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, on_done, &f), 0);
	sched_free(s);
	return f.r[0];
}

/* A prediction of the output (OpenAI's predicted outputs: an edit's original text) is drafted
 * from in order: a right one is kept nearly whole, a wrong one costs drafts but not tokens. */
Test(sched_spec, a_prediction_is_drafted_from)
{
	const char *p = "One day, a little bird";
	struct sched_req *plain = one(p, 120, NULL, 0, 0);
	cr_assert_eq(plain->n_out, 120);
	/* right: the output itself, with the first token (the prefill's) left out */
	struct sched_req *right = one(p, 120, plain->out + 1, plain->n_out - 1, 8);
	cr_expect(!memcmp(right->out, plain->out, sizeof(int) * 120), "right: the tokens differ");
	cr_expect_geq(right->accepted, 100, "kept %d of %d", right->accepted, right->drafted);
	cr_expect_leq(right->steps, 25, "%d steps for 120 tokens", right->steps);
	/* wrong: the output backwards */
	int rev[120];
	for (int i = 0; i < 120; i++)
		rev[i] = plain->out[119 - i];
	struct sched_req *wrong = one(p, 120, rev, 120, 8);
	cr_expect(!memcmp(wrong->out, plain->out, sizeof(int) * 120), "wrong: the tokens differ");
	cr_expect_lt(wrong->accepted * 2, wrong->drafted);
	/* off: a prediction drafts nothing */
	struct sched_req *off = one(p, 120, plain->out + 1, plain->n_out - 1, 0);
	cr_expect_eq(off->drafted, 0);
	cr_expect_eq(off->steps, 120);
	fprintf(stderr, "prediction: right %d steps, kept %d of %d; wrong %d steps, kept %d of "
		"%d; without %d steps\n", right->steps, right->accepted, right->drafted,
		wrong->steps, wrong->accepted, wrong->drafted, plain->steps);
	sched_req_free(plain);
	sched_req_free(right);
	sched_req_free(wrong);
	sched_req_free(off);
}
