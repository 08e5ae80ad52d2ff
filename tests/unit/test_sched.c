/*
 * The continuous-batching scheduler on the real stories260K model, checked through its own
 * step log (not wall-clock timing).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
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
	snprintf(dir, sizeof dir, "/tmp/wick-sched-XXXXXX");
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

TestSuite(sched, .init = setup, .fini = teardown);

static struct sched_req *req(const char *id, const char *prompt, int max_tokens)
{
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "%s", id);
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), prompt, strlen(prompt), true, &r->prompt,
				&r->n_prompt, err, sizeof err), WK_OK);
	r->max_tokens = max_tokens;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	return r;
}

struct finished {
	struct sched_req *r[64];
	int n;
};

static void on_done(void *ctx, struct sched_req *r)
{
	struct finished *f = ctx;
	f->r[f->n++] = r;
}

static int run_all(struct sched *s, struct finished *f)
{
	int steps = 0;
	while (sched_pending(s) > 0) {
		cr_assert_geq(sched_step(s, on_done, f), 0);
		cr_assert_lt(++steps, 1000);
	}
	return steps;
}

/* Parses the step log: for each step, how many items and how many in prefill. */
static int read_log(char *buf, int *items, int *prefill, int max)
{
	int n = 0;
	for (char *line = strtok(buf, "\n"); line && n < max; line = strtok(NULL, "\n"), n++) {
		items[n] = prefill[n] = 0;
		for (char *p = strstr(line, "\"phase\""); p; p = strstr(p + 1, "\"phase\"")) {
			items[n]++;
			prefill[n] += strncmp(p, "\"phase\": \"prefill\"", 18) == 0;
		}
	}
	return n;
}

Test(sched, eight_requests_share_decode_steps)
{
	char *logbuf;
	size_t loglen;
	FILE *log = open_memstream(&logbuf, &loglen);
	struct sched *s = sched_create(eng, log);
	char err[WK_ERRSZ];
	for (int i = 0; i < 8; i++) {
		char id[16];
		snprintf(id, sizeof id, "job-%d", i);
		cr_assert_eq(sched_submit(s, req(id, i % 2 ? "Once upon a time" : "The cat", 10), err,
					  sizeof err), WK_OK);
	}
	struct finished f = {0};
	int steps = run_all(s, &f);
	fclose(log);
	cr_expect_eq(f.n, 8);
	cr_expect_eq(steps, 10, "8 requests of 10 tokens took %d steps, not 10", steps);
	int items[64], prefill[64];
	int n = read_log(logbuf, items, prefill, 64);
	cr_expect_eq(n, steps);
	cr_expect_eq(items[0], 8);
	cr_expect_eq(prefill[0], 8);
	for (int i = 1; i < n; i++) {
		cr_expect_eq(items[i], 8, "step %d ran %d items", i, items[i]);
		cr_expect_eq(prefill[i], 0);
	}
	for (int i = 0; i < f.n; i++) {
		cr_expect_eq(f.r[i]->status, SCHED_DONE);
		cr_expect_eq(f.r[i]->finish, SCHED_FIN_LENGTH);
		cr_expect_eq(f.r[i]->n_out, 10);
		cr_expect_eq(f.r[i]->steps, 10);
		sched_req_free(f.r[i]);
	}
	free(logbuf);
	sched_free(s);
}

Test(sched, short_job_joins_a_running_batch_and_finishes_first)
{
	char *logbuf;
	size_t loglen;
	FILE *log = open_memstream(&logbuf, &loglen);
	struct sched *s = sched_create(eng, log);
	char err[WK_ERRSZ];
	struct finished f = {0};
	cr_assert_eq(sched_submit(s, req("long", "Once upon a time", 60), err, sizeof err), WK_OK);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(sched_step(s, on_done, &f), 1);
	cr_assert_eq(sched_submit(s, req("short", "The dog", 5), err, sizeof err), WK_OK);
	run_all(s, &f);
	fclose(log);
	cr_assert_eq(f.n, 2);
	cr_expect_str_eq(f.r[0]->id, "short", "the short job should finish first");
	cr_expect_str_eq(f.r[1]->id, "long");
	/* The step that prefilled "short" also decoded "long". */
	char *p = strstr(logbuf, "{\"id\": \"short\", \"phase\": \"prefill\"");
	cr_assert_not_null(p);
	char *bol = p;
	while (bol > logbuf && bol[-1] != '\n')
		bol--;
	char *eol = strchr(p, '\n');
	*eol = 0;
	cr_expect(strstr(bol, "{\"id\": \"long\", \"phase\": \"decode\"") != NULL, "%s", bol);
	cr_expect(strstr(bol, "\"step\": 5,") != NULL, "%s", bol);
	cr_expect_eq(f.r[0]->steps, 5);
	cr_expect_eq(f.r[1]->steps, 60);
	sched_req_free(f.r[0]);
	sched_req_free(f.r[1]);
	free(logbuf);
	sched_free(s);
}

/* Batched greedy output is the output alone, and the golden story comes out. */
Test(sched, batched_output_equals_alone)
{
	char err[WK_ERRSZ];
	struct finished f = {0};
	struct sched *s = sched_create(eng, NULL);
	cr_assert_eq(sched_submit(s, req("a", "", 30), err, sizeof err), WK_OK);
	run_all(s, &f);
	cr_assert_eq(f.n, 1);
	char *alone = strdup(f.r[0]->text);
	sched_req_free(f.r[0]);
	f.n = 0;
	for (int i = 0; i < 5; i++)
		cr_assert_eq(sched_submit(s, req(i == 2 ? "b" : "x", i == 2 ? "" : "A dog", 30), err,
					  sizeof err), WK_OK);
	run_all(s, &f);
	cr_assert_eq(f.n, 5);
	for (int i = 0; i < 5; i++) {
		if (!strcmp(f.r[i]->id, "b"))
			cr_expect_str_eq(f.r[i]->text, alone);
		sched_req_free(f.r[i]);
	}
	cr_expect(strncmp(alone, "Once upon a time, there was a little girl named Lily", 52) == 0,
		  "%s", alone);
	free(alone);
	sched_free(s);
}

Test(sched, stop_strings_cancel_and_deadline)
{
	char err[WK_ERRSZ];
	struct finished f = {0};
	struct sched *s = sched_create(eng, NULL);
	struct sched_req *stop = req("stop", "", 100);
	stop->stop[stop->n_stop++] = strdup("Lily");
	struct sched_req *cancel = req("cancel", "", 100);
	struct sched_req *late = req("late", "", 100);
	late->deadline = wk_now() - 1;
	cr_assert_eq(sched_submit(s, stop, err, sizeof err), WK_OK);
	cr_assert_eq(sched_submit(s, cancel, err, sizeof err), WK_OK);
	cr_assert_eq(sched_submit(s, late, err, sizeof err), WK_OK);
	cr_assert_geq(sched_step(s, on_done, &f), 0);
	sched_cancel(s, cancel);
	run_all(s, &f);
	cr_assert_eq(f.n, 3);
	for (int i = 0; i < 3; i++) {
		struct sched_req *r = f.r[i];
		if (!strcmp(r->id, "stop")) {
			cr_expect_eq(r->status, SCHED_DONE);
			cr_expect_eq(r->finish, SCHED_FIN_STOP);
			cr_expect_str_eq(r->text, "Once upon a time, there was a little girl named ");
		} else if (!strcmp(r->id, "cancel")) {
			cr_expect_eq(r->status, SCHED_CANCELLED);
		} else {
			cr_expect_eq(r->status, SCHED_TIMED_OUT);
		}
		sched_req_free(r);
	}
	/* A prompt as long as the context is refused up front. */
	struct sched_req *big = calloc(1, sizeof *big);
	big->n_prompt = 256;
	big->prompt = calloc(256, sizeof(int));
	cr_expect_eq(sched_submit(s, big, err, sizeof err), WK_EINVAL);
	sched_req_free(big);
	sched_free(s);
}

/* Conservation, as a property over random job mixes: the requests' gpu_seconds sum to the busy
 * time that this test measures itself, from its own clock, at the moments the scheduler goes
 * from empty to busy (just before the submit that finds it empty) and back (just after the
 * step that leaves nothing pending). Gaps between steps (sleeps here, standing in for
 * admission, sampling and storing results) and idle periods are part of the mix. */
static void done_collect(void *ctx, struct sched_req *r)
{
	double *sum = ctx;
	cr_assert(r->gpu_seconds >= 0, "%s: negative share", r->id);
	*sum += r->gpu_seconds;
	sched_req_free(r);
}

Test(sched, busy_time_is_conserved_over_random_mixes)
{
	for (unsigned seed = 1; seed <= 6; seed++) {
		srand(seed);
		struct sched *s = sched_create(eng, NULL);
		cr_assert_not_null(s);
		double sum = 0, busy = 0, t_busy = 0;
		int submitted = 0;
		for (int round = 0; round < 12; round++) {
			int k = rand() % 5; /* a burst of 0..4 arrivals */
			for (int i = 0; i < k; i++) {
				struct sched_req *r = calloc(1, sizeof *r);
				snprintf(r->id, sizeof r->id, "s%u-%d", seed, submitted++);
				r->n_prompt = 1 + rand() % 20;
				r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt);
				for (int p = 0; p < r->n_prompt; p++)
					r->prompt[p] = 1 + rand() % 500;
				r->max_tokens = 1 + rand() % 40;
				r->samp = (struct samp_cfg){.temperature = 1.0f, .seed = (uint64_t)rand()};
				if (sched_pending(s) == 0)
					t_busy = wk_now();
				char err[WK_ERRSZ];
				cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
				if (rand() % 7 == 0)
					sched_cancel(s, r);
			}
			int steps = rand() % 30;
			for (int i = 0; i < steps && sched_pending(s) > 0; i++) {
				if (rand() % 3 == 0)
					usleep((useconds_t)(rand() % 2000)); /* a gap between steps */
				cr_assert_geq(sched_step(s, done_collect, &sum), 0);
				if (sched_pending(s) == 0)
					busy += wk_now() - t_busy;
			}
			if (sched_pending(s) == 0)
				usleep((useconds_t)(rand() % 3000)); /* idle: not busy time */
		}
		while (sched_pending(s) > 0) {
			cr_assert_geq(sched_step(s, done_collect, &sum), 0);
			if (sched_pending(s) == 0)
				busy += wk_now() - t_busy;
		}
		cr_assert(submitted == 0 || busy > 0);
		cr_assert(fabs(sum - busy) < 1e-3,
			  "seed %u: the requests' gpu_seconds sum to %.6f s, busy time was %.6f s",
			  seed, sum, busy);
		sched_free(s);
	}
}

/* ---- speculative decoding by prompt lookup (sched_set_speculate) ----
 * The same requests with it and without give the same tokens, texts, finishes and streamed
 * pieces, in fewer steps; drafts are kept and thrown away as the step log and the counts
 * say; sampled requests do not speculate; a prediction is drafted from in order. */

#define NREQ 8
/* A draft's cost, fixed (sched_set_draft_cost), as on a GPU where a step of a few tokens costs
 * about what one does: the counts below do not depend on this machine's timing. */
#define SPEC_COST 0.1

struct spec_run {
	struct sched_req *r[NREQ];
	int n;
	char streamed[NREQ][8192];
	size_t slen[NREQ];
};

static void spec_done(void *ctx, struct sched_req *r)
{
	struct spec_run *f = ctx;
	f->r[r->id[0] - 'a'] = r;
	f->n++;
}

static void spec_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	struct spec_run *f = ctx;
	int i = r->id[0] - 'a';
	cr_assert_lt(f->slen[i] + len, sizeof f->streamed[i]);
	memcpy(f->streamed[i] + f->slen[i], piece, len);
	f->slen[i] += len;
}

/* The requests: prompts that repeat themselves or not, a stop string that ends a request in
 * the middle of a kept draft or not, one that runs into the context's end, one sampled. */
static struct sched_req *spec_req(int i)
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
	if (i == 6) { /* (a stop string that never comes first) */
		r->stop[r->n_stop++] = strdup("zebra");
		r->stop[r->n_stop++] = strdup("play with the ball.\nBobo");
	}
	r->on_token = spec_token;
	return r;
}

static long spec_run_all(struct spec_run *f, int spec, char **log)
{
	size_t loglen;
	FILE *lf = open_memstream(log, &loglen);
	struct sched *s = sched_create(eng, lf);
	cr_assert_eq(sched_set_speculate(s, spec), WK_OK);
	cr_assert_eq(sched_set_draft_cost(s, SPEC_COST), WK_OK);
	char err[WK_ERRSZ];
	for (int i = 0; i < NREQ; i++)
		cr_assert_eq(sched_submit(s, spec_req(i), err, sizeof err), WK_OK, "%s", err);
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, spec_done, f), 0);
	long steps = sched_steps(s);
	cr_assert_eq(f->n, NREQ);
	sched_free(s);
	fclose(lf);
	return steps;
}

Test(sched, speculation_same_output_in_fewer_steps)
{
	static struct spec_run plain, spec;
	char *plog, *slog;
	long ps = spec_run_all(&plain, 0, &plog), ss = spec_run_all(&spec, 4, &slog);
	int drafted = 0, accepted = 0;
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *a = plain.r[i], *b = spec.r[i];
		cr_expect_eq(b->status, SCHED_DONE);
		if (i == 7) /* sampled: the same distribution, other draws (below) */
			continue;
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
	/* the sampled request speculates too: its drafts are kept or not by draws of its own
	 * (samp_pick_draft: the pick's distribution whatever the draft, test_sampler.c), so its
	 * text is another draw from the same distribution */
	cr_expect_gt(spec.r[7]->drafted, 0);
	cr_expect_eq(spec.r[7]->status, SCHED_DONE);
	/* the stop strings ended e and g, after repeats that drafts were kept from; the
	 * context's end f (256 positions: the last token is not run) */
	cr_expect_eq(spec.r[4]->finish, SCHED_FIN_STOP);
	cr_expect_eq(spec.r[6]->finish, SCHED_FIN_STOP);
	cr_expect_eq(spec.r[5]->finish, SCHED_FIN_LENGTH);
	cr_expect_eq(spec.r[4]->stop_hit, 1, "which stop string ended it (output.stop_sequence)");
	cr_expect_eq(spec.r[6]->stop_hit, 2);
	cr_expect_eq(spec.r[5]->stop_hit, 0);
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
	fprintf(stderr, "speculation: %ld steps against %ld, kept %d of %d drafts\n", ss, ps,
		accepted, drafted);
	for (int i = 0; i < NREQ; i++) {
		sched_req_free(plain.r[i]);
		sched_req_free(spec.r[i]);
	}
	free(plog);
	free(slog);
}

Test(sched, speculation_refusals)
{
	struct sched *s = sched_create(eng, NULL);
	cr_expect_eq(sched_set_speculate(s, -1), WK_EINVAL);
	cr_expect_eq(sched_set_speculate(s, SCHED_DRAFT_MAX + 1), WK_EINVAL);
	cr_expect_eq(sched_set_speculate(s, SCHED_DRAFT_MAX), WK_OK);
	cr_expect_eq(sched_set_speculate(s, 0), WK_OK);
	cr_expect_eq(sched_set_speculate_max_batch(s, -1), WK_EINVAL);
	cr_expect_eq(sched_set_speculate_max_batch(s, 3), WK_OK);
	cr_expect_eq(sched_set_draft_cost(s, -0.5), WK_EINVAL);
	cr_expect_eq(sched_set_draft_cost(s, SCHED_COST_MAX + 1), WK_EINVAL);
	cr_expect_eq(sched_set_draft_cost(s, NAN), WK_EINVAL);
	cr_expect_eq(sched_set_draft_cost(s, 0), WK_OK);
	cr_expect_eq(sched_set_draft_cost(s, SCHED_COST_AUTO), WK_OK);
	sched_free(s);
}

/* How many drafts pay: worked by hand from tokens (1 + alpha + ... + alpha^K) against time
 * (1 + cost K). */
Test(sched, draft_len_is_the_one_that_pays_most)
{
	cr_expect_eq(sched_draft_len(0, 0.01, 8), 0);   /* nothing is kept */
	cr_expect_eq(sched_draft_len(1, 0.5, 8), 8);    /* everything is: as many as allowed */
	cr_expect_eq(sched_draft_len(1, 1, 8), 0);      /* ... at a step's cost a draft: even */
	cr_expect_eq(sched_draft_len(0.9, 0, 16), 16);  /* free drafts */
	cr_expect_eq(sched_draft_len(0.9, 0.2, 0), 0);  /* off */
	/* 0.5 at 0.2: 1.25, 1.25, 1.17 for K = 1, 2, 3: the smaller of equals */
	cr_expect_eq(sched_draft_len(0.5, 0.2, 8), 1);
	/* 0.8 at 0.1: 1.64 2.03 2.27 2.40 2.459 2.469 2.448 for K = 1..7 */
	cr_expect_eq(sched_draft_len(0.8, 0.1, 16), 6);
	cr_expect_eq(sched_draft_len(0.8, 0.1, 4), 4);
	/* a draft is worth it alone when alpha > cost */
	cr_expect_eq(sched_draft_len(0.29, 0.3, 8), 0);
	cr_expect_eq(sched_draft_len(0.31, 0.3, 1), 1);
}

/* The measured cost: what a unit of draft work adds to a step, against a step without; the
 * prior until steps with and without drafts have both been seen; the recent steps weigh
 * most. */
Test(sched, draft_cost_is_measured_from_the_steps)
{
	struct sched_cost c = {0};
	cr_expect_float_eq(sched_cost_ratio(&c), 0.2, 1e-12); /* nothing measured: the prior */
	for (int i = 0; i < 40; i++) /* no step with drafts: still the prior */
		sched_cost_add(&c, 0, 0.010);
	cr_expect_float_eq(sched_cost_ratio(&c), 0.2, 1e-12);
	struct sched_cost one = c; /* one step of 2 units at 13 ms: 0.15 a unit, and the prior */
	sched_cost_add(&one, 2, 0.013);
	cr_expect_float_eq(sched_cost_ratio(&one), (0.15 + 0.2 * 2) / 3, 1e-9);
	/* 10 ms a step and 3 ms a unit of work, 5 % noise, one step in three with 2 units */
	unsigned x = 7;
	for (int i = 0; i < 200; i++) {
		x = x * 1103515245u + 12345u;
		double z = i % 3 == 0 ? 2 : 0, noise = 1 + 0.05 * ((double)(x >> 16 & 0x7fff) / 0x7fff
								  - 0.5) * 2;
		sched_cost_add(&c, z, (0.010 + 0.003 * z) * noise);
	}
	double r = sched_cost_ratio(&c);
	cr_expect(r > 0.25 && r < 0.35, "measured %.3f, want about 0.3", r);
	struct sched_cost slow = c; /* a step with drafts that stalled 100x: counted as 4x */
	sched_cost_add(&slow, 2, 1.6);
	r = sched_cost_ratio(&slow);
	cr_expect(r > 0.25 && r < 0.45, "after a stall %.3f, want about 0.3", r);
	/* then drafts get cheap (a GPU): the old steps fade */
	for (int i = 0; i < 300; i++)
		sched_cost_add(&c, i % 2 ? 4 : 0, 0.010 + 0.0002 * (i % 2 ? 4 : 0));
	r = sched_cost_ratio(&c);
	cr_expect(r > 0.01 && r < 0.04, "measured %.3f, want about 0.02", r);
	/* steps with drafts faster than without: drafts cost nothing (less the prior's pull),
	 * not less; steps without that take no time: the most */
	struct sched_cost d = {0};
	for (int i = 0; i < 200; i++)
		sched_cost_add(&d, i % 2, 0.010 - 0.001 * (i % 2));
	cr_expect_lt(sched_cost_ratio(&d), 0.01);
	struct sched_cost f = {0};
	for (int i = 0; i < 200; i++)
		sched_cost_add(&f, i % 2, 0.001 * (i % 2));
	cr_expect_gt(sched_cost_ratio(&f), 0.9 * SCHED_COST_MAX);
}

/* One greedy request of max_tokens on prompt with prediction pred[0..np) (copied; NULL:
 * none), speculating up to spec tokens; returns it finished. */
static struct sched_req *spec_one_cfg(const char *prompt, int max_tokens, const int *pred,
				      int np, int spec, struct samp_cfg cfg);
static struct sched_req *proc_run_pred(const char *prompt, int max_tokens, int spec,
				       struct samp_cfg cfg, float pres, float freq, float repn,
				       const int *bias_id, const float *bias, int n_bias,
				       const int *pred, int np);

static struct sched_req *spec_one(const char *prompt, int max_tokens, const int *pred, int np,
			     int spec)
{
	return spec_one_cfg(prompt, max_tokens, pred, np, spec,
			    (struct samp_cfg){.temperature = 0, .top_p = 1});
}

static struct sched_req *run_req(struct sched_req *r, const char *prompt, int max_tokens,
				 int spec, char **pieces, size_t *plen);

static struct sched_req *spec_one_cfg(const char *prompt, int max_tokens, const int *pred,
				      int np, int spec, struct samp_cfg cfg)
{
	return proc_run_pred(prompt, max_tokens, spec, cfg, 0, 0, 1, NULL, NULL, 0, pred, np);
}

/* A prediction of the output (OpenAI's predicted outputs: an edit's original text) is drafted
 * from in order: a right one is kept nearly whole, a wrong one costs drafts but not tokens. */
Test(sched, speculation_a_prediction_is_drafted_from)
{
	const char *p = "One day, a little bird";
	struct sched_req *plain = spec_one(p, 120, NULL, 0, 0);
	cr_assert_eq(plain->n_out, 120);
	/* right: the output itself, with the first token (the prefill's) left out */
	struct sched_req *right = spec_one(p, 120, plain->out + 1, plain->n_out - 1, 8);
	cr_expect(!memcmp(right->out, plain->out, sizeof(int) * 120), "right: the tokens differ");
	cr_expect_geq(right->accepted, 100, "kept %d of %d", right->accepted, right->drafted);
	cr_expect_leq(right->steps, 25, "%d steps for 120 tokens", right->steps);
	/* wrong: the output backwards */
	int rev[120];
	for (int i = 0; i < 120; i++)
		rev[i] = plain->out[119 - i];
	struct sched_req *wrong = spec_one(p, 120, rev, 120, 8);
	cr_expect(!memcmp(wrong->out, plain->out, sizeof(int) * 120), "wrong: the tokens differ");
	cr_expect_lt(wrong->accepted * 2, wrong->drafted);
	/* off: a prediction drafts nothing */
	struct sched_req *off = spec_one(p, 120, plain->out + 1, plain->n_out - 1, 0);
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

/* A sampled request whose filters leave one token (top_k 1) is greedy in all but name: with
 * speculation it gives the greedy tokens and keeps the drafts greedy decoding keeps (each
 * draft's probability is 1 or 0); on a wider distribution it keeps some drafts too. */
Test(sched, speculation_sampled_keeps_what_the_distribution_allows)
{
	const char *p = "Lily and Ben went to the park. Lily and Ben";
	struct sched_req *g = spec_one(p, 100, NULL, 0, 4);
	struct sched_req *k1 = spec_one_cfg(p, 100, NULL, 0, 4,
					    (struct samp_cfg){.temperature = 0.8f, .top_p = 1,
							      .top_k = 1, .seed = 3});
	cr_expect_eq(k1->n_out, g->n_out);
	cr_expect(k1->n_out == g->n_out && !memcmp(k1->out, g->out, sizeof(int) * g->n_out),
		  "top_k 1 with speculation: not the greedy tokens");
	cr_expect_eq(k1->drafted, g->drafted);
	cr_expect_eq(k1->accepted, g->accepted);
	struct sched_req *t = spec_one_cfg(p, 100, NULL, 0, 4,
					   (struct samp_cfg){.temperature = 0.5f, .top_p = 0.9f,
							     .seed = 3});
	cr_expect_gt(t->accepted, 0, "temperature 0.5: kept %d of %d", t->accepted, t->drafted);
	cr_expect_lt(t->steps, t->n_out);
	fprintf(stderr, "sampled speculation: top_k 1 kept %d of %d (greedy %d of %d); "
		"temperature 0.5 kept %d of %d, %d steps for %d tokens\n", k1->accepted,
		k1->drafted, g->accepted, g->drafted, t->accepted, t->drafted, t->steps, t->n_out);
	sched_req_free(g);
	sched_req_free(k1);
	sched_req_free(t);
}

/* ---- logprobs ---- */

Test(sched, logprob_of_is_the_log_softmax)
{
	const float l[5] = {1, 3, 3, -INFINITY, 0};
	double lse = log(exp(1.0) + 2 * exp(3.0) + 1);
	struct sched_logprob o;
	sched_logprob_of(&o, l, 5, 0, 3);
	cr_expect_float_eq(o.lp, 1 - lse, 1e-6);
	cr_assert_eq(o.n_top, 3);
	cr_expect_eq(o.top_id[0], 1, "equal logits: the lower id first");
	cr_expect_eq(o.top_id[1], 2);
	cr_expect_eq(o.top_id[2], 0);
	cr_expect_float_eq(o.top_lp[0], 3 - lse, 1e-6);
	cr_expect_float_eq(o.top_lp[2], 1 - lse, 1e-6);
	sched_logprob_of(&o, l, 5, 3, 50);
	cr_expect_eq(o.n_top, 5, "top is clamped to the vocabulary");
	cr_expect(isinf(o.lp) && o.lp < 0, "a -inf logit: %f", o.lp);
	cr_expect_eq(o.top_id[3], 4);
	cr_expect_eq(o.top_id[4], 3);
	sched_logprob_of(&o, l, 5, 4, 0);
	cr_expect_eq(o.n_top, 0);
	cr_expect_float_eq(o.lp, -lse, 1e-6);
}

static int run_prompt_rows; /* run_req: sched_set_prompt_rows (0: the default) */

/* Runs r (its settings filled in) on prompt through a scheduler that speculates spec drafts;
 * with pieces, each token's bytes (sched_token_bytes), concatenated. */
static struct sched_req *run_req(struct sched_req *r, const char *prompt, int max_tokens,
				 int spec, char **pieces, size_t *plen)
{
	struct sched *s = sched_create(eng, NULL);
	cr_assert_eq(sched_set_speculate(s, spec), WK_OK);
	if (run_prompt_rows)
		cr_assert_eq(sched_set_prompt_rows(s, run_prompt_rows), WK_OK);
	cr_assert_eq(sched_set_draft_cost(s, SPEC_COST), WK_OK);
	snprintf(r->id, sizeof r->id, "a");
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), prompt, strlen(prompt), true, &r->prompt,
				&r->n_prompt, err, sizeof err), WK_OK);
	r->max_tokens = max_tokens;
	cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	struct spec_run f = {0};
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, spec_done, &f), 0);
	if (pieces) {
		*pieces = calloc(1, 1);
		*plen = 0;
		for (int k = r->prompt_logprobs ? -r->n_prompt : 0; k < r->n_out; k++) {
			char *b; /* (with prompt logprobs, the prompt's pieces first) */
			size_t n;
			cr_assert_eq(k < 0 ? sched_prompt_bytes(s, r, r->n_prompt + k,
								r->prompt[r->n_prompt + k], &b, &n)
					   : sched_token_bytes(s, r, k, r->out[k], &b, &n), WK_OK);
			*pieces = realloc(*pieces, *plen + n + 1);
			memcpy(*pieces + *plen, b, n);
			*plen += n;
			free(b);
		}
	}
	sched_free(s);
	return f.r[0];
}

/* One request with logprobs (top 5), or without. */
static struct sched_req *lp_run(const char *prompt, int max_tokens, int spec, bool logprobs,
				struct samp_cfg cfg, char **pieces, size_t *plen)
{
	struct sched_req *r = calloc(1, sizeof *r);
	r->samp = cfg;
	r->logprobs = logprobs;
	r->top_logprobs = 5;
	return run_req(r, prompt, max_tokens, spec, pieces, plen);
}

/* The engine's logits lg after r's prompt and its first k output tokens (ids: the two, in
 * order), from a prefill of their own. */
static void before(const struct sched_req *r, const int *ids, int k, float *lg)
{
	int seq;
	char err[WK_ERRSZ];
	cr_assert_eq(eng_seq_alloc(eng, &seq), WK_OK);
	struct eng_item it = {.seq = seq, .tokens = ids, .n = r->n_prompt + k, .logits = lg};
	cr_assert_eq(eng_step(eng, &it, 1, err, sizeof err), WK_OK, "%s", err);
	eng_seq_free(eng, seq);
}

/* Each token's logprob and top 5 against the engine's own logits for the same text, one
 * prefill each (another path: no scheduler, no speculation, a step of its own). */
static void lp_check(const struct sched_req *r, const char *what)
{
	int vocab = eng_info(eng)->vocab, *ids = malloc((size_t)(r->n_prompt + r->n_out) *
							 sizeof *ids);
	float *lg = malloc((size_t)vocab * sizeof *lg);
	memcpy(ids, r->prompt, (size_t)r->n_prompt * sizeof *ids);
	memcpy(ids + r->n_prompt, r->out, (size_t)r->n_out * sizeof *ids);
	double worst = 0;
	for (int k = 0; k < r->n_out; k++) {
		before(r, ids, k, lg);
		double m = -INFINITY, sum = 0;
		for (int v = 0; v < vocab; v++)
			m = lg[v] > m ? lg[v] : m;
		for (int v = 0; v < vocab; v++)
			sum += exp((double)lg[v] - m);
		double lse = m + log(sum), d = fabs(r->lp[k].lp - (lg[r->out[k]] - lse));
		worst = d > worst ? d : worst;
		cr_assert_eq(r->lp[k].n_top, 5);
		for (int t = 0; t < 5; t++) {
			int id = r->lp[k].top_id[t], above = 0;
			for (int v = 0; v < vocab; v++)
				above += lg[v] > lg[id] || (lg[v] == lg[id] && v < id);
			cr_expect_eq(above, t, "%s: token %d, top %d is id %d, the %dth", what, k, t,
				     id, above);
			cr_expect_float_eq(r->lp[k].top_lp[t], lg[id] - lse, 1e-3);
		}
	}
	cr_expect_lt(worst, 1e-3, "%s: logprobs off by %g", what, worst);
	fprintf(stderr, "logprobs (%s): %d tokens, max |d| %.2g against the engine's logits\n",
		what, r->n_out, worst);
	free(lg);
	free(ids);
}

Test(sched, logprobs_are_the_models)
{
	const char *p = "Lily and Ben went to the park. Lily and Ben";
	struct samp_cfg greedy = {.temperature = 0, .top_p = 1};
	char *text;
	size_t tlen;
	struct sched_req *off = lp_run(p, 40, 0, false, greedy, NULL, NULL);
	struct sched_req *on = lp_run(p, 40, 0, true, greedy, &text, &tlen);
	cr_assert_null(off->lp);
	cr_assert_eq(on->n_out, off->n_out);
	cr_expect(!memcmp(on->out, off->out, sizeof(int) * (size_t)on->n_out),
		  "logprobs changed the tokens");
	cr_expect(tlen == on->text_len && !memcmp(text, on->text, tlen),
		  "the tokens' bytes do not make the text: [%.*s] [%s]", (int)tlen, text, on->text);
	lp_check(on, "greedy");
	for (int k = 0; k < on->n_out; k++)
		cr_expect_eq(on->lp[k].top_id[0], on->out[k], "greedy: the token is the top one");
	/* speculation: the same tokens, and each logprob from its row of the verification */
	struct sched_req *spec = lp_run(p, 40, 4, true, greedy, NULL, NULL);
	cr_expect_gt(spec->accepted, 0, "no draft kept: the rows past the first are not tested");
	cr_expect(spec->n_out == on->n_out &&
		  !memcmp(spec->out, on->out, sizeof(int) * (size_t)on->n_out));
	lp_check(spec, "speculating");
	/* sampled: the model's distribution, not the sampler's (temperature, top_k) */
	struct sched_req *hot = lp_run(p, 40, 4, true,
				       (struct samp_cfg){.temperature = 1.5f, .top_p = 1,
							 .top_k = 3, .seed = 7}, NULL, NULL);
	lp_check(hot, "sampled at 1.5, top_k 3");
	free(text);
	sched_req_free(off);
	sched_req_free(on);
	sched_req_free(spec);
	sched_req_free(hot);
}

/* ---- prompt logprobs ---- */

/* r's prompt logprobs (top 4) against the engine's own logits for each prefix of its prompt,
 * a prefill each. */
static void plp_check(const struct sched_req *r, const char *what)
{
	int vocab = eng_info(eng)->vocab;
	float *lg = malloc((size_t)vocab * sizeof *lg);
	double worst = 0;
	cr_assert_not_null(r->plp, "%s: no prompt logprobs", what);
	for (int k = 1; k < r->n_prompt; k++) {
		int seq;
		char err[WK_ERRSZ];
		cr_assert_eq(eng_seq_alloc(eng, &seq), WK_OK);
		struct eng_item it = {.seq = seq, .tokens = r->prompt, .n = k, .logits = lg};
		cr_assert_eq(eng_step(eng, &it, 1, err, sizeof err), WK_OK, "%s", err);
		eng_seq_free(eng, seq);
		double m = -INFINITY, sum = 0;
		for (int v = 0; v < vocab; v++)
			m = lg[v] > m ? lg[v] : m;
		for (int v = 0; v < vocab; v++)
			sum += exp((double)lg[v] - m);
		double lse = m + log(sum), d = fabs(r->plp[k].lp - (lg[r->prompt[k]] - lse));
		worst = d > worst ? d : worst;
		cr_assert_eq(r->plp[k].n_top, r->prompt_top, "%s: position %d", what, k);
		int above = 0; /* vLLM's rank: 1 + the tokens with a higher logit */
		for (int v = 0; v < vocab; v++)
			above += lg[v] > lg[r->prompt[k]];
		cr_expect_eq(r->plp[k].rank, 1 + above, "%s: position %d's rank", what, k);
		for (int t = 0; t < r->prompt_top; t++) {
			int id = r->plp[k].top_id[t], above = 0;
			for (int v = 0; v < vocab; v++)
				above += lg[v] > lg[id] || (lg[v] == lg[id] && v < id);
			cr_expect_eq(above, t, "%s: position %d, top %d is id %d, the %dth", what, k,
				     t, id, above);
			cr_expect_float_eq(r->plp[k].top_lp[t], lg[id] - lse, 1e-3);
		}
	}
	cr_expect_lt(worst, 1e-3, "%s: prompt logprobs off by %g", what, worst);
	fprintf(stderr, "prompt logprobs (%s): %d positions, max |d| %.2g\n", what,
		r->n_prompt - 1, worst);
	free(lg);
}

static struct sched_req *plp_run(const char *prompt, int max_tokens, int spec, bool plp,
				 struct samp_cfg cfg, float freq, char **pieces, size_t *plen)
{
	struct sched_req *r = calloc(1, sizeof *r);
	r->samp = cfg;
	r->logprobs = true;
	r->top_logprobs = 2;
	r->prompt_logprobs = plp;
	r->prompt_top = 4;
	r->frequency_penalty = freq;
	return run_req(r, prompt, max_tokens, spec, pieces, plen);
}

static void same_tokens(const struct sched_req *a, const struct sched_req *b, const char *what)
{
	cr_assert_eq(a->n_out, b->n_out, "%s: %d tokens against %d", what, a->n_out, b->n_out);
	cr_expect(!memcmp(a->out, b->out, sizeof(int) * (size_t)a->n_out),
		  "%s: prompt logprobs changed the tokens", what);
	for (int k = 0; k < a->n_out; k++)
		cr_expect_float_eq(a->lp[k].lp, b->lp[k].lp, 1e-4, "%s: token %d's logprob", what,
				   k);
}

/* Each prompt token's logprob is the model's, whatever the chunks its prefill is cut into,
 * and asking for them changes nothing else: not the tokens, their draws, their logprobs. */
Test(sched, prompt_logprobs_are_the_models)
{
	const char *p = "Lily and Ben went to the park. They saw a big dog and a small cat. "
			"Lily and Ben";
	struct samp_cfg greedy = {.temperature = 0, .top_p = 1};
	struct samp_cfg hot = {.temperature = 1.2f, .top_p = 0.9f, .top_k = 20, .seed = 11};
	char *text, *ptext;
	size_t tlen, plen;
	struct sched_req *off = plp_run(p, 30, 0, false, greedy, 0, &text, &tlen);
	cr_expect_null(off->plp);
	int rows[] = {0, 1, 7, 1000};
	for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++) {
		run_prompt_rows = rows[c];
		char what[64];
		snprintf(what, sizeof what, "greedy, %d rows a step", rows[c]);
		struct sched_req *on = plp_run(p, 30, 0, true, greedy, 0, &ptext, &plen);
		plp_check(on, what);
		same_tokens(on, off, what);
		int chunks = rows[c] ? (on->n_prompt + rows[c] - 1) / rows[c] : 1;
		cr_expect_eq(on->steps, chunks + on->n_out - 1, "%s: %d steps", what, on->steps);
		/* the prompt's pieces (after the first, BOS) and the output's make its text */
		char *pt = NULL;
		size_t pn = 0;
		cr_assert_eq(tok_decode_utf8(eng_tokenizer(eng), on->prompt, on->n_prompt, true, &pt,
					     &pn, NULL, 0), WK_OK);
		cr_expect(plen == pn + tlen && !memcmp(ptext, pt, pn) &&
			  !memcmp(ptext + pn, text, tlen), "%s: the pieces [%.*s]", what, (int)plen,
			  ptext);
		free(pt);
		free(ptext);
		sched_req_free(on);
	}
	run_prompt_rows = 5;
	/* sampled, speculating, and with a penalty (the host picks every token) */
	struct sched_req *a = plp_run(p, 30, 3, false, hot, 0, NULL, NULL);
	struct sched_req *b = plp_run(p, 30, 3, true, hot, 0, NULL, NULL);
	plp_check(b, "sampled, speculating");
	same_tokens(b, a, "sampled, speculating");
	struct sched_req *c = plp_run(p, 30, 0, false, hot, 0.7f, NULL, NULL);
	struct sched_req *d = plp_run(p, 30, 0, true, hot, 0.7f, NULL, NULL);
	plp_check(d, "sampled, frequency 0.7");
	same_tokens(d, c, "sampled, frequency 0.7");
	/* max_tokens 0: the prompt scored, nothing generated */
	struct sched_req *z = plp_run(p, 0, 0, true, greedy, 0, NULL, NULL);
	cr_expect_eq(z->status, SCHED_DONE);
	cr_expect_eq(z->finish, SCHED_FIN_LENGTH);
	cr_expect_eq(z->n_out, 0);
	cr_expect_eq(z->steps, (z->n_prompt + 4) / 5);
	cr_expect_str_eq(z->text, "");
	plp_check(z, "max_tokens 0");
	run_prompt_rows = 0;
	free(text);
	sched_req_free(off);
	sched_req_free(a);
	sched_req_free(b);
	sched_req_free(c);
	sched_req_free(d);
	sched_req_free(z);
}

/* ---- logit processing: logit_bias, the repetition penalty, OpenAI's penalties ---- */

static struct sched_req *proc_run_pred(const char *prompt, int max_tokens, int spec,
				       struct samp_cfg cfg, float pres, float freq, float repn,
				       const int *bias_id, const float *bias, int n_bias,
				       const int *pred, int np)
{
	struct sched_req *r = calloc(1, sizeof *r);
	r->samp = cfg;
	r->presence_penalty = pres;
	r->frequency_penalty = freq;
	r->repetition_penalty = repn;
	if (pred) {
		r->pred = malloc((size_t)np * sizeof *r->pred);
		memcpy(r->pred, pred, (size_t)np * sizeof *r->pred);
		r->n_pred = np;
	}
	if (n_bias) {
		r->bias_id = malloc(sizeof(int) * (size_t)n_bias);
		r->bias = malloc(sizeof(float) * (size_t)n_bias);
		memcpy(r->bias_id, bias_id, sizeof(int) * (size_t)n_bias);
		memcpy(r->bias, bias, sizeof(float) * (size_t)n_bias);
		r->n_bias = n_bias;
	}
	return run_req(r, prompt, max_tokens, spec, NULL, NULL);
}

static struct sched_req *proc_run(const char *prompt, int max_tokens, int spec,
				  struct samp_cfg cfg, float pres, float freq, float repn,
				  const int *bias_id, const float *bias, int n_bias)
{
	return proc_run_pred(prompt, max_tokens, spec, cfg, pres, freq, repn, bias_id, bias,
			     n_bias, NULL, 0);
}

/* Each greedy token is the argmax of the engine's logits for its text (a prefill of its own)
 * after the processing, written out here again from its definition. */
static void proc_check(const struct sched_req *r, const char *what)
{
	int vocab = eng_info(eng)->vocab, *counts = calloc((size_t)vocab, sizeof(int));
	int *ids = malloc((size_t)(r->n_prompt + r->n_out) * sizeof *ids);
	bool *seen = calloc((size_t)vocab, sizeof(bool));
	float *lg = malloc((size_t)vocab * sizeof *lg);
	memcpy(ids, r->prompt, (size_t)r->n_prompt * sizeof *ids);
	memcpy(ids + r->n_prompt, r->out, (size_t)r->n_out * sizeof *ids);
	for (int k = 0; k < r->n_prompt; k++)
		seen[r->prompt[k]] = true;
	for (int k = 0; k < r->n_out; k++) {
		before(r, ids, k, lg);
		for (int b = 0; b < r->n_bias; b++)
			lg[r->bias_id[b]] += r->bias[b];
		int best = 0;
		for (int v = 0; v < vocab; v++) {
			if (r->repetition_penalty != 1 && (seen[v] || counts[v]))
				lg[v] = lg[v] > 0 ? lg[v] / r->repetition_penalty
						  : lg[v] * r->repetition_penalty;
			lg[v] -= counts[v] * r->frequency_penalty + (counts[v] > 0) * r->presence_penalty;
			best = lg[v] > lg[best] ? v : best;
		}
		cr_assert_eq(r->out[k], best, "%s: token %d is %d, the processed argmax %d", what, k,
			     r->out[k], best);
		counts[r->out[k]]++;
	}
	free(lg);
	free(seen);
	free(ids);
	free(counts);
}

Test(sched, penalties_and_bias_are_applied_before_the_pick)
{
	const char *p = "Lily and Ben went to the park. Lily and Ben";
	struct samp_cfg greedy = {.temperature = 0, .top_p = 1};
	struct sched_req *plain = proc_run(p, 60, 0, greedy, 0, 0, 1, NULL, NULL, 0);
	int ban[2] = {plain->out[1], plain->out[3]}; /* two of the plain text's tokens */
	float bias[2] = {-100, -100};
	struct {
		float pres, freq, repn;
		int n_bias;
		const char *what;
	} c[] = {{0, 0.8f, 1, 0, "frequency 0.8"}, {1.5f, 0, 1, 0, "presence 1.5"},
		 {0, 0, 1.4f, 0, "repetition 1.4"}, {0, 0, 1, 2, "two ids banned"},
		 {0.3f, 0.5f, 1.2f, 2, "all four"}};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		struct sched_req *a = proc_run(p, 60, 0, greedy, c[i].pres, c[i].freq, c[i].repn,
					       ban, bias, c[i].n_bias);
		cr_expect(a->n_out != plain->n_out ||
			  memcmp(a->out, plain->out, sizeof(int) * (size_t)a->n_out),
			  "%s: the same text as without", c[i].what);
		proc_check(a, c[i].what);
		/* speculating: the same tokens (each draft's row sees the drafts before it) */
		struct sched_req *b = proc_run(p, 60, 4, greedy, c[i].pres, c[i].freq, c[i].repn,
					       ban, bias, c[i].n_bias);
		cr_expect(b->n_out == a->n_out &&
			  !memcmp(b->out, a->out, sizeof(int) * (size_t)a->n_out),
			  "%s: speculating changed the tokens", c[i].what);
		/* the output itself as the prediction: most drafts kept, so a row's pick sees the
		 * kept drafts before it in the same step */
		struct sched_req *e = proc_run_pred(p, 60, 8, greedy, c[i].pres, c[i].freq,
						    c[i].repn, ban, bias, c[i].n_bias, a->out + 1,
						    a->n_out - 1);
		cr_expect(e->n_out == a->n_out &&
			  !memcmp(e->out, a->out, sizeof(int) * (size_t)a->n_out),
			  "%s: a right prediction changed the tokens", c[i].what);
		cr_expect_gt(e->accepted, 30, "%s: kept %d", c[i].what, e->accepted);
		fprintf(stderr, "processing (%s): %d tokens, the processed argmax each; speculating "
			"the same, %d of %d drafts kept (%d of %d with the output as the "
			"prediction)\n", c[i].what, a->n_out, b->accepted, b->drafted, e->accepted,
			e->drafted);
		sched_req_free(a);
		sched_req_free(b);
		sched_req_free(e);
	}
	/* sampled, speculating: a banned id never comes; a favoured one always does */
	struct samp_cfg hot = {.temperature = 1.0f, .top_p = 1, .seed = 11};
	struct sched_req *h = proc_run(p, 60, 4, hot, 0, 0, 1, ban, bias, 2);
	for (int k = 0; k < h->n_out; k++)
		cr_expect(h->out[k] != ban[0] && h->out[k] != ban[1], "sampled: a banned id came");
	float up = 100;
	struct sched_req *u = proc_run(p, 20, 4, hot, 0, 0, 1, ban, &up, 1);
	cr_expect_eq(u->n_out, 20);
	for (int k = 0; k < u->n_out; k++)
		cr_expect_eq(u->out[k], ban[0], "a +100 bias: token %d is %d", k, u->out[k]);
	sched_req_free(h);
	sched_req_free(u);
	sched_req_free(plain);
}

/* ---- structured output ---- */

static const char *const person =
	"{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\"}, \"happy\": "
	"{\"type\": \"boolean\"}, \"pet\": {\"enum\": [\"cat\", \"dog\"]}, \"name\": {\"type\": "
	"\"string\"}}, \"required\": [\"age\", \"happy\", \"pet\", \"name\"]}";

/* The same with the name one of three: a tiny model sampled hot writes stories in a free
 * string and runs into the context's end before it closes it. */
static const char *const person3 =
	"{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\"}, \"happy\": "
	"{\"type\": \"boolean\"}, \"pet\": {\"enum\": [\"cat\", \"dog\"]}, \"name\": {\"enum\": "
	"[\"Lily\", \"Ben\", \"Tom\"]}}, \"required\": [\"age\", \"happy\", \"pet\", \"name\"]}";

static struct sched_req *json_run(const char *schema, int spec, struct samp_cfg cfg,
				  int max_tokens)
{
	struct sched_req *r = calloc(1, sizeof *r);
	char err[WK_ERRSZ];
	cr_assert_eq(gram_compile(schema, schema ? strlen(schema) : 0, &r->gram, err, sizeof err),
		     WK_OK, "%s", err);
	r->samp = cfg;
	return run_req(r, "Once upon a time", max_tokens, spec, NULL, NULL);
}

/* The person schema's document: its four keys, each of its type. */
static void expect_person(const struct sched_req *r, const char *what)
{
	cr_assert_eq(r->status, SCHED_DONE, "%s: %s", what, r->error);
	cr_assert_eq(r->finish, SCHED_FIN_STOP, "%s: not ended by the document (%d tokens): %s",
		     what, r->n_out, r->text);
	json_error_t je;
	/* (as reals: an integer of 30 digits is JSON, but past jansson's integers) */
	json_t *v = json_loadb(r->text, r->text_len, JSON_DECODE_INT_AS_REAL, &je);
	cr_assert_not_null(v, "%s: not JSON (%s): %s", what, je.text, r->text);
	cr_expect_eq(json_object_size(v), 4, "%s: %s", what, r->text);
	double age = json_number_value(json_object_get(v, "age"));
	cr_expect(json_is_number(json_object_get(v, "age")) && age == floor(age), "%s: %s", what,
		  r->text);
	cr_expect(json_is_boolean(json_object_get(v, "happy")), "%s: %s", what, r->text);
	const char *pet = json_string_value(json_object_get(v, "pet"));
	cr_expect(pet && (!strcmp(pet, "cat") || !strcmp(pet, "dog")), "%s: %s", what, r->text);
	cr_expect(json_is_string(json_object_get(v, "name")), "%s: %s", what, r->text);
	json_decref(v);
}

Test(sched, structured_output_follows_the_schema)
{
	struct samp_cfg greedy = {.temperature = 0, .top_p = 1};
	struct sched_req *a = json_run(person, 0, greedy, 600);
	expect_person(a, "greedy");
	struct sched_req *b = json_run(person, 4, greedy, 600); /* speculating: the same tokens */
	expect_person(b, "greedy, speculating");
	cr_expect(b->n_out == a->n_out && !memcmp(b->out, a->out, sizeof(int) * (size_t)a->n_out),
		  "speculation changed the document");
	fprintf(stderr, "structured output, greedy: %d tokens, %s (speculating: %d of %d drafts "
		"kept)\n", a->n_out, a->text, b->accepted, b->drafted);
	for (int seed = 1; seed <= 4; seed++) {
		struct samp_cfg hot = {.temperature = 0.4f + 0.1f * seed, .top_p = 0.9f,
				       .seed = (uint64_t)seed};
		char what[64];
		snprintf(what, sizeof what, "seed %d, temperature %.1f", seed, hot.temperature);
		struct sched_req *h = json_run(person3, seed % 2 ? 4 : 0, hot, 600);
		expect_person(h, what);
		fprintf(stderr, "structured output, %s: %d tokens, %s\n", what, h->n_out, h->text);
		sched_req_free(h);
	}
	/* json_object: any object; cut short by max_tokens, the bytes so far still a prefix */
	struct sched_req *o = json_run(NULL, 0, greedy, 40);
	cr_expect_eq(o->n_out, 40);
	struct gram *g;
	char err[WK_ERRSZ];
	cr_assert_eq(gram_compile(NULL, 0, &g, err, sizeof err), WK_OK);
	struct gram_state st;
	gram_start(g, &st);
	cr_expect(gram_feed(g, &st, o->text, o->text_len), "json_object: not a prefix: %s",
		  o->text);
	gram_free(g);
	sched_req_free(a);
	sched_req_free(b);
	sched_req_free(o);
}

/* gram_after: the output is free text up to that token (GLM's reasoning up to "</think>"),
 * then the document; here the token is the first one of the free text's own output. */
Test(sched, structured_output_after_a_token)
{
	struct samp_cfg greedy = {.temperature = 0, .top_p = 1};
	struct sched_req *plain = lp_run("Once upon a time", 8, 0, false, greedy, NULL, NULL);
	int mark = plain->out[2]; /* ", there was": the third token ends the free part */
	for (int spec = 0; spec <= 4; spec += 4) {
		struct sched_req *r = calloc(1, sizeof *r);
		char err[WK_ERRSZ];
		cr_assert_eq(gram_compile(person3, strlen(person3), &r->gram, err, sizeof err), WK_OK);
		r->gram_after = mark + 1;
		r->samp = greedy;
		r = run_req(r, "Once upon a time", 400, spec, NULL, NULL);
		cr_assert_geq(r->n_out, 3);
		cr_expect(!memcmp(r->out, plain->out, 3 * sizeof(int)),
			  "the free part is not the model's own text");
		char *rest = NULL;
		size_t n = 0;
		cr_assert_eq(tok_decode(eng_tokenizer(eng), r->out + 3, r->n_out - 3, true, &rest, &n,
					err, sizeof err), WK_OK);
		struct sched_req view = *r;
		view.text = rest;
		view.text_len = n;
		expect_person(&view, spec ? "after a token, speculating" : "after a token");
		fprintf(stderr, "structured output after token %d (spec %d): %s | %s\n", mark, spec,
			r->text, rest);
		free(rest);
		sched_req_free(r);
	}
	sched_req_free(plain);
}

/* ---- the prefix cache ---- */

static struct sched_req *run_in(struct sched *s, struct sched_req *r)
{
	char err[WK_ERRSZ];
	cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	struct finished f = {0};
	run_all(s, &f);
	cr_assert_eq(f.n, 1);
	cr_assert_eq(f.r[0]->status, SCHED_DONE, "%s", f.r[0]->error);
	return f.r[0];
}

static struct sched_req *ids_req(const char *id, const int *ids, int n, int max_tokens)
{
	struct sched_req *r = calloc(1, sizeof *r);
	snprintf(r->id, sizeof r->id, "%s", id);
	r->prompt = malloc((size_t)n * sizeof *r->prompt);
	memcpy(r->prompt, ids, (size_t)n * sizeof *ids);
	r->n_prompt = n;
	r->max_tokens = max_tokens;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	r->logprobs = true;
	return r;
}

static void same_out(const struct sched_req *a, const struct sched_req *b, const char *what)
{
	cr_expect_eq(a->n_out, b->n_out, "%s: %d tokens against %d", what, a->n_out, b->n_out);
	for (int k = 0; k < a->n_out && k < b->n_out; k++)
		cr_expect_eq(a->out[k], b->out[k], "%s: token %d", what, k);
}

/* Runs r alone in a scheduler of its own without the cache: what a fresh prefill gives. */
static struct sched_req *alone(struct sched_req *r)
{
	struct sched *s = sched_create(eng, NULL);
	r = run_in(s, r);
	sched_free(s);
	return r;
}

static struct sched_req *seeded(const char *id, const char *p, int max_tokens, int seed)
{
	struct sched_req *r = req(id, p, max_tokens);
	if (seed)
		r->samp = (struct samp_cfg){.temperature = 1.0f, .top_p = 0.95f, .seed = seed};
	return r;
}

/* The steps an id's lines show, in the log: each step's "tokens" for it (0: not in it). */
static int id_tokens(const char *log, const char *id, int *tok, int max)
{
	char key[64];
	snprintf(key, sizeof key, "{\"id\": \"%s\", ", id);
	int n = 0;
	for (const char *line = log; line && *line && n < max; n++) {
		const char *end = strchr(line, '\n'), *at = strstr(line, key);
		tok[n] = 0;
		if (at && (!end || at < end))
			sscanf(strstr(at, "\"tokens\": ") + 10, "%d", &tok[n]);
		line = end ? end + 1 : NULL;
	}
	return n;
}

/* A running request's cache is a prefix too. Four choices of one prompt submitted at once
 * (greedy and sampled, as an OpenAI request's n): the first prefills; the other three wait
 * that one step, then copy its prompt and run only the last token, and each gives what it
 * gives alone. A request whose prompt begins with a running one's (a shared system prompt)
 * copies it while that one decodes, and neither's tokens move. An entry that holds more than
 * the prefix is copied and stays; one that holds no more is taken, as before. */
Test(sched, prefix_cache_shares_a_running_prefill)
{
	char *logbuf;
	size_t loglen;
	FILE *log = open_memstream(&logbuf, &loglen);
	struct sched *s = sched_create(eng, log);
	cr_assert_eq(sched_set_prefix_cache(s, true), WK_OK);
	cr_expect_eq(sched_set_prefix_wait(s, -1), WK_EINVAL); /* (the CPU's default: from 2) */
	char err[WK_ERRSZ];
	const char *p = "Once upon a time, there was a little girl named Lily. She liked to";
	const int seeds[4] = {0, 7, 8, 9};
	for (int i = 0; i < 4; i++) {
		char id[16];
		snprintf(id, sizeof id, "n%d", i);
		cr_assert_eq(sched_submit(s, seeded(id, p, 12, seeds[i]), err, sizeof err), WK_OK);
	}
	/* u, behind them, is admitted past the three that wait; v comes after that step */
	cr_assert_eq(sched_submit(s, seeded("u", "The dog ran", 3, 0), err, sizeof err), WK_OK);
	struct finished f = {0};
	cr_assert_geq(sched_step(s, on_done, &f), 0);
	cr_assert_eq(sched_submit(s, seeded("v", "A big red", 3, 0), err, sizeof err), WK_OK);
	run_all(s, &f);
	cr_assert_eq(f.n, 6);
	for (int i = 0; i < 6; i++)
		if (f.r[i]->id[0] != 'n') { /* (u and v: not needed below) */
			sched_req_free(f.r[i]);
			f.r[i--] = f.r[--f.n];
		}
	struct sched_cache_stats st;
	sched_cache_stats(s, &st);
	cr_expect_eq(st.copies, 3, "%ld copies", st.copies);
	cr_expect_eq(st.waits, 3, "%ld waits", st.waits);
	for (int i = 0; i < 4; i++) {
		struct sched_req *r = f.r[i];
		int k = r->id[1] - '0';
		cr_expect_eq(r->cached, k ? r->n_prompt - 1 : 0, "%s: %d cached", r->id, r->cached);
		struct sched_req *a = alone(seeded("a", p, 12, seeds[k]));
		same_out(r, a, r->id);
		sched_req_free(a);
	}
	/* a shared system prompt: x decodes while y, whose prompt begins with x's, copies it */
	const char *sys = "Tom had a big red ball. He liked to play with it in the park. One day,";
	char longer[256];
	snprintf(longer, sizeof longer, "%s a dog came", sys);
	struct sched_req *x = seeded("x", sys, 20, 0), *y = seeded("y", longer, 10, 0);
	cr_assert_eq(sched_submit(s, x, err, sizeof err), WK_OK);
	for (int i = 0; i < 3; i++)
		cr_assert_geq(sched_step(s, on_done, &f), 0);
	cr_assert_eq(sched_submit(s, y, err, sizeof err), WK_OK);
	run_all(s, &f);
	cr_assert_eq(f.n, 6);
	cr_expect_eq(y->cached, x->n_prompt, "a shared system prompt: %d of %d", y->cached,
		     x->n_prompt);
	/* an entry: y's holds its prompt and output. A prompt that goes another way after y's
	 * prompt copies it, and y's entry stays: another is evicted (every sequence is held by
	 * the 8 entries). Prompts that go on from y's output, and from z's, take theirs. */
	sched_cache_stats(s, &st);
	long copies = st.copies, evicted = st.evicted;
	cr_expect_eq(st.entries, 8);
	char other[300];
	snprintf(other, sizeof other, "%s and a cat sat", longer);
	struct sched_req *z = run_in(s, seeded("z", other, 4, 0));
	sched_cache_stats(s, &st);
	cr_expect_eq(z->cached, y->n_prompt, "%d cached", z->cached);
	cr_expect_eq(st.copies, copies + 1);
	cr_expect_eq(st.evicted, evicted + 1);
	struct sched_req *w[2];
	for (int k = 0; k < 2; k++) {
		const struct sched_req *from = k ? z : y;
		int ids[256], n = 0;
		memcpy(ids, from->prompt, (size_t)from->n_prompt * sizeof *ids);
		n = from->n_prompt;
		memcpy(ids + n, from->out, (size_t)from->n_out * sizeof *ids);
		n += from->n_out;
		ids[n++] = z->prompt[1];
		w[k] = run_in(s, ids_req(k ? "w1" : "w0", ids, n, 4));
		sched_cache_stats(s, &st);
		cr_expect_eq(w[k]->cached, n - 2, "%s: %d cached", w[k]->id, w[k]->cached);
		cr_expect_eq(st.copies, copies + 1, "an entry that holds no more is taken");
	}
	/* (alone() runs on the same engine: the entries give their sequences back first) */
	cr_assert_eq(sched_set_prefix_cache(s, false), WK_OK);
	struct sched_req *x0 = alone(seeded("x0", sys, 20, 0)),
			 *y0 = alone(seeded("y0", longer, 10, 0));
	same_out(x, x0, "the running request that lent its prefix");
	same_out(y, y0, "the one that copied it");
	fclose(log);
	/* n1..n3 were in no step before n0's prefill, then ran 1 token each */
	int t0[64], t1[64];
	int steps = id_tokens(logbuf, "n0", t0, 64);
	cr_expect_gt(t0[0], 1, "n0 prefills first");
	for (int k = 1; k < 4; k++) {
		char id[16];
		snprintf(id, sizeof id, "n%d", k);
		id_tokens(logbuf, id, t1, 64);
		cr_expect_eq(t1[0], 0, "%s ran beside n0's prefill", id);
		cr_expect_eq(t1[1], 1, "%s's prefill ran %d tokens", id, t1[1]);
	}
	cr_expect_gt(steps, 10);
	for (int i = 0; i < f.n; i++)
		sched_req_free(f.r[i]);
	struct sched_req *all[] = {x0, y0, z, w[0], w[1]};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		sched_req_free(all[i]);
	sched_free(s);
	free(logbuf);
}

/* sched_set_prefix_wait: choices whose shared prompt is under the threshold (0: never) prefill
 * together, as a device's default lets short prompts do; at or over it, they wait and copy. */
Test(sched, prefix_wait_sets_how_long_a_prefix_is_worth_a_step)
{
	const char *p = "Once upon a time, there was a little girl named Lily. She liked to";
	struct sched_req *probe = seeded("p", p, 4, 0);
	int n_prompt = probe->n_prompt, shared = n_prompt - 1; /* (the last token runs) */
	sched_req_free(probe);
	for (int k = 0; k < 4; k++) {
		struct sched *s = sched_create(eng, NULL);
		cr_assert_eq(sched_set_prefix_cache(s, true), WK_OK);
		int wait = k == 0 ? 0 : k == 1 ? 1000 : k == 2 ? shared + 1 : shared;
		cr_assert_eq(sched_set_prefix_wait(s, wait), WK_OK);
		char err[WK_ERRSZ];
		for (int i = 0; i < 3; i++)
			cr_assert_eq(sched_submit(s, seeded(i ? "b" : "a", p, 4, 0), err, sizeof err),
				     WK_OK);
		struct finished f = {0};
		run_all(s, &f);
		struct sched_cache_stats st;
		sched_cache_stats(s, &st);
		bool waits = k == 3;
		cr_expect_eq(st.waits, waits ? 2 : 0, "wait %d: %ld waits", wait, st.waits);
		for (int i = 0; i < f.n; i++) {
			cr_expect_eq(f.r[i]->cached, waits && f.r[i]->id[0] == 'b' ? n_prompt - 1 : 0,
				     "wait %d: %s: %d cached", wait, f.r[i]->id, f.r[i]->cached);
			sched_req_free(f.r[i]);
		}
		sched_free(s);
	}
}

/* A request that begins with what an earlier one left in the cache runs only the rest: the same
 * prompt again its last token, a conversation's next turn its new tokens; its tokens are those
 * a fresh prefill gives. Another key, and prompt logprobs, take nothing; a full batch evicts. */
Test(sched, prefix_cache_reuses_what_a_request_left)
{
	char *logbuf;
	size_t loglen;
	FILE *log = open_memstream(&logbuf, &loglen);
	struct sched *s = sched_create(eng, log), *fresh = sched_create(eng, NULL);
	cr_assert_eq(sched_set_prefix_cache(s, true), WK_OK);
	const char *p = "Once upon a time, there was a little girl named Lily. She";
	struct sched_req *a = run_in(s, req("a", p, 12));
	cr_expect_eq(a->cached, 0);
	struct sched_req *b = run_in(s, req("b", p, 12));
	cr_expect_eq(b->cached, b->n_prompt - 1, "the same prompt again: %d of %d cached",
		     b->cached, b->n_prompt);
	same_out(a, b, "the same prompt again");
	/* the next turn: b's prompt and output, and more */
	int ids[256], n = 0, *more, nm;
	char err[WK_ERRSZ];
	cr_assert_eq(tok_encode(eng_tokenizer(eng), " The end.", 9, false, &more, &nm, err,
				sizeof err), WK_OK);
	memcpy(ids, b->prompt, (size_t)b->n_prompt * sizeof *ids);
	n = b->n_prompt;
	memcpy(ids + n, b->out, (size_t)b->n_out * sizeof *ids);
	n += b->n_out;
	memcpy(ids + n, more, (size_t)nm * sizeof *ids);
	n += nm;
	free(more);
	struct sched_req *c = run_in(s, ids_req("c", ids, n, 10));
	struct sched_req *c0 = run_in(fresh, ids_req("c0", ids, n, 10));
	cr_expect_eq(c->cached, b->n_prompt + b->n_out - 1, "the next turn: %d cached", c->cached);
	cr_expect_eq(c0->cached, 0);
	same_out(c, c0, "the next turn against a fresh prefill");
	float worst = 0;
	for (int k = 0; k < c->n_out && k < c0->n_out; k++)
		worst = fmaxf(worst, fabsf(c->lp[k].lp - c0->lp[k].lp));
	cr_expect_lt(worst, 1e-4, "logprobs %g from a fresh prefill's", worst);
	/* another key, and prompt logprobs: nothing taken */
	struct sched_req *d = req("d", p, 4);
	d->cache_key = 7;
	d = run_in(s, d);
	cr_expect_eq(d->cached, 0, "another key's prefix was taken");
	struct sched_req *e = req("e", p, 2);
	e->prompt_logprobs = true;
	e = run_in(s, e);
	cr_expect_eq(e->cached, 0);
	/* sampled and seeded: the same draws and tokens from the cache */
	struct sched_req *g[2];
	for (int i = 0; i < 2; i++) {
		g[i] = req(i ? "g1" : "g0", "The dog ran to the", 16);
		g[i]->samp = (struct samp_cfg){.temperature = 0.9f, .top_p = 0.95f, .seed = 42};
		g[i] = run_in(s, g[i]);
	}
	cr_expect_eq(g[1]->cached, g[1]->n_prompt - 1);
	same_out(g[0], g[1], "sampled, seeded");
	struct sched_cache_stats st;
	sched_cache_stats(s, &st);
	cr_expect_eq(st.hits, 3, "%ld hits", st.hits);
	cr_expect_eq(st.hit_tokens, b->cached + c->cached + g[1]->cached);
	/* 8 at once: every sequence is needed, the entries give theirs */
	char id[16];
	for (int i = 0; i < 8; i++) {
		snprintf(id, sizeof id, "h%d", i);
		cr_assert_eq(sched_submit(s, req(id, i % 2 ? "Tom had a" : "A big red", 3), err,
					  sizeof err), WK_OK);
	}
	struct finished f = {0};
	run_all(s, &f);
	cr_expect_eq(f.n, 8);
	sched_cache_stats(s, &st);
	cr_expect_gt(st.evicted, 0);
	cr_expect_eq(st.entries, 8);
	fclose(log);
	/* b's first step ran one token: its prompt's last */
	char *line = strstr(logbuf, "\"id\": \"b\"");
	cr_assert_not_null(line, "%s", logbuf);
	cr_expect(strncmp(line, "\"id\": \"b\", \"phase\": \"prefill\", \"tokens\": 1}", 42) == 0,
		  "%.80s", line);
	for (int i = 0; i < f.n; i++)
		sched_req_free(f.r[i]);
	struct sched_req *all[] = {a, b, c, c0, d, e, g[0], g[1]};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		sched_req_free(all[i]);
	sched_free(s);
	sched_free(fresh);
	free(logbuf);
}
