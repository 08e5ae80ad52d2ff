/*
 * The continuous-batching scheduler on the real stories260K model, checked through its own
 * step log (not wall-clock timing).
 */
#include <criterion/criterion.h>
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
