/*
 * bench_queue.c - `wick bench queue MODEL`: what continuous batching buys. It times eight
 * equal requests run together at concurrency 8 against one of them alone, on the same engine,
 * through the scheduler the worker uses; the ratio is the cost of sharing the steps.
 * (The queue drivers' jobs/s with a null engine join this command with the worker.)
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/sched.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench queue MODEL [-n TOKENS] [--jobs N] [options]\n\n"
		   "Times N equal requests (default 8) of TOKENS generated tokens (default 64) at\n"
		   "concurrency N against one request alone, through the worker's scheduler.\n"
		   "Target: N together take less than 2x one alone.\n" CMD_ENGINE_HELP);
}

static void on_done(void *ctx, struct sched_req *r)
{
	(*(int *)ctx)++;
	sched_req_free(r);
}

/* Seconds for `jobs` requests of `tokens` tokens each, submitted together. */
static double run(struct engine *e, int jobs, int tokens, long *steps)
{
	struct sched *s = sched_create(e, NULL);
	if (!s)
		return -1;
	int bos = eng_info(e)->bos >= 0 ? eng_info(e)->bos : 0;
	for (int i = 0; i < jobs; i++) {
		struct sched_req *r = calloc(1, sizeof *r);
		if (!r || !(r->prompt = malloc(2 * sizeof(int)))) {
			free(r);
			sched_free(s);
			return -1;
		}
		snprintf(r->id, sizeof r->id, "bench-%d", i);
		r->prompt[0] = bos;
		r->prompt[1] = 3 + i % 5; /* different prompts, same length */
		r->n_prompt = 2;
		r->max_tokens = tokens;
		r->samp = (struct samp_cfg){.temperature = 1.0f, .top_p = 1, .seed = (uint64_t)i};
		char err[WK_ERRSZ];
		if (sched_submit(s, r, err, sizeof err) != WK_OK) {
			sched_req_free(r);
			sched_free(s);
			return -1;
		}
	}
	int done = 0;
	double t0 = wk_now();
	while (sched_pending(s) > 0)
		if (sched_step(s, on_done, &done) < 0)
			break;
	double dt = wk_now() - t0;
	*steps = sched_steps(s);
	sched_free(s);
	return done == jobs ? dt : -1;
}

int bench_queue(int argc, char **argv)
{
	static const struct option opts[] = {{"tokens", required_argument, 0, 'n'},
					     {"jobs", required_argument, 0, 'j'},
					     {"help", no_argument, 0, 'h'}, CMD_ENGINE_OPTIONS,
					     {0, 0, 0, 0}};
	int tokens = 64, jobs = 8, c;
	struct cmd_engine ce = {.o = {.backend = "cpu"}};
	while ((c = getopt_long(argc, argv, "n:j:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n': tokens = atoi(optarg); break;
		case 'j': jobs = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default:
			if (c < CMD_OPT_BASE || cmd_engine_flag(&ce, c, optarg)) {
				usage(stderr);
				return 2;
			}
		}
	}
	if (cmd_engine_model(&ce, argc, argv, optind, 0) || tokens < 1 || tokens > 100000 ||
	    jobs < 1 || jobs > 4096) {
		usage(stderr);
		return 2;
	}
	ce.o.max_seqs = jobs;
	ce.o.max_seq = tokens + 4;
	struct engine *e;
	if (cmd_engine_open(&ce, &e))
		return 1;
	long s1 = 0, sn = 0;
	run(e, 1, tokens, &s1); /* warm-up */
	double one = run(e, 1, tokens, &s1), all = run(e, jobs, tokens, &sn);
	eng_close(e);
	if (one <= 0 || all <= 0) {
		fprintf(stderr, "wick bench queue: a run failed\n");
		return 1;
	}
	printf("model            %s (%s backend)\n", ce.model, ce.o.backend);
	printf("one request      %.3f s (%ld steps, %d tokens)\n", one, s1, tokens);
	printf("%d requests       %.3f s (%ld steps, %d tokens each, concurrency %d)\n", jobs, all,
	       sn, tokens, jobs);
	printf("ratio            %.2fx the time of one, for %dx the tokens (target < 2x)\n",
	       all / one, jobs);
	printf("{\"bench\":\"queue\",\"mode\":\"batching\",\"jobs\":%d,\"tokens\":%d,\"one_s\":%.6f,"
	       "\"all_s\":%.6f,\"ratio\":%.4f,\"steps_one\":%ld,\"steps_all\":%ld}\n",
	       jobs, tokens, one, all, all / one, s1, sn);
	return 0;
}
