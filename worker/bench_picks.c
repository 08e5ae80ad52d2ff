/*
 * bench_picks.c - `wick bench picks MODEL`: what the host's part of a pick costs a token. A
 * request with logprobs, logit processing (penalties, logit_bias) or structured output has
 * each row's logits copied to the host, where the scheduler works over the whole vocabulary
 * (a log-softmax, the penalties, a grammar's mask); a plain request has only its token back.
 * Each kind of request runs alone through the scheduler the worker uses (on the CPU backend
 * by default: the engine's cost is in every row alike), and its seconds a token are printed
 * beside the plain request's, with what it adds to them, from the same run: the host's part.
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
	fprintf(f, "usage: wick bench picks MODEL [-n TOKENS] [--runs N] [--backend B]\n\n"
		   "Runs one request of each kind, TOKENS tokens (default 200) each, best of N runs\n"
		   "(default 3), through the scheduler on the cpu backend (or B), greedy: plain,\n"
		   "logprobs (top 20), penalties (frequency, presence, repetition), logit_bias (ten\n"
		   "ids), json_object, a json_schema, and a string with a pattern (a class, and\n"
		   "\"holds a q\", where most tokens may come); prints each one's milliseconds a token,\n"
		   "what it adds to the plain request's and the ratio, then one JSON line. MODEL\n"
		   "needs its tokenizer.\n");
}

static const char *const schema =
	"{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"}, \"ok\": "
	"{\"type\": \"boolean\"}, \"kind\": {\"enum\": [\"a\", \"b\", \"c\"]}, \"tags\": {\"type\": "
	"\"array\", \"items\": {\"type\": \"integer\"}}}, \"required\": [\"id\", \"ok\", \"kind\", "
	"\"tags\"]}";

/* a string of 150 or more characters: of a class (the automaton rules most tokens out at
 * their first byte), and holding a "q" somewhere (most tokens may come at every step: the
 * trie walked nearly whole) */
static const char *const pattern = "{\"type\": \"string\", \"minLength\": 150, "
				   "\"pattern\": \"^[a-z ,.]*$\"}";
static const char *const pattern_any = "{\"type\": \"string\", \"minLength\": 150, "
				       "\"pattern\": \"q\"}";
/* dates, one after another: the automaton's state changes at every character, through a cycle
 * of a dozen states */
static const char *const pattern_dates = "{\"type\": \"string\", \"minLength\": 150, "
					 "\"pattern\": \"^(\\\\d{4}-\\\\d{2}-\\\\d{2} )*$\"}";

enum { K_PLAIN, K_LOGPROBS, K_PENALTIES, K_BIAS, K_OBJECT, K_SCHEMA, K_PATTERN, K_PATTERN_ANY,
       K_PATTERN_DATES, K_N };
static const char *const names[K_N] = {"plain",	   "logprobs",	  "penalties",
				      "logit_bias",  "json_object", "json_schema",
				      "pattern",     "pattern_any", "pattern_dates"};

static void done(void *ctx, struct sched_req *r)
{
	*(struct sched_req **)ctx = r;
}

/* One request of kind k: its seconds a token (the scheduler's steps, admission to finish),
 * and the tokens it made into *made. Negative on an error (printed). */
static double run_one(struct engine *e, int k, int n, int *made)
{
	struct sched *s = sched_create(e, NULL);
	struct sched_req *r = calloc(1, sizeof *r);
	char err[WK_ERRSZ];
	if (!s || !r) {
		sched_free(s);
		free(r);
		return -1;
	}
	snprintf(r->id, sizeof r->id, "%s", names[k]);
	r->prompt = malloc(4 * sizeof *r->prompt);
	for (int i = 0; r->prompt && i < 4; i++)
		r->prompt[i] = 1 + i;
	r->n_prompt = 4;
	r->max_tokens = n;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	r->logprobs = k == K_LOGPROBS;
	r->top_logprobs = k == K_LOGPROBS ? SCHED_TOP_LOGPROBS_MAX : 0;
	if (k == K_PENALTIES) {
		r->frequency_penalty = 0.5f;
		r->presence_penalty = 0.5f;
		r->repetition_penalty = 1.1f;
	}
	if (k == K_BIAS && (r->bias_id = malloc(10 * sizeof *r->bias_id)) &&
	    (r->bias = malloc(10 * sizeof *r->bias))) { /* ten ids favoured, the last most */
		for (int i = 0; i < 10; i++) {
			r->bias_id[i] = 3 + i;
			r->bias[i] = 1 + i;
		}
		r->n_bias = 10;
	}
	const char *sch = k == K_SCHEMA ? schema : k == K_PATTERN ? pattern
			: k == K_PATTERN_ANY ? pattern_any : k == K_PATTERN_DATES ? pattern_dates
			: NULL;
	if (k >= K_OBJECT && gram_compile(sch, sch ? strlen(sch) : 0, &r->gram, err,
					  sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench picks: %s\n", err);
		sched_req_free(r);
		sched_free(s);
		return -1;
	}
	if (!r->prompt || sched_submit(s, r, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench picks: %s\n", r->prompt ? err : "out of memory");
		sched_req_free(r);
		sched_free(s);
		return -1;
	}
	struct sched_req *fin = NULL;
	while (sched_pending(s) > 0)
		if (sched_step(s, done, &fin) < 0)
			break;
	double secs = -1;
	if (fin && fin->status == SCHED_DONE && fin->n_out > 0) {
		secs = (fin->t_done - fin->t_admit) / fin->n_out;
		*made = fin->n_out;
	} else {
		fprintf(stderr, "wick bench picks: the %s request failed: %s\n", names[k],
			fin ? fin->error : "no result");
	}
	sched_req_free(fin);
	sched_free(s);
	return secs;
}

int bench_picks(int argc, char **argv)
{
	int n = 200, runs = 3;
	const char *backend = "cpu";
	static const struct option opts[] = {{"runs", required_argument, 0, 'r'},
					     {"backend", required_argument, 0, 'b'},
					     {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n': n = atoi(optarg); break;
		case 'r': runs = atoi(optarg); break;
		case 'b': backend = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || n < 1 || n > 100000 || runs < 1 || runs > 100) {
		usage(stderr);
		return 2;
	}
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = backend, .max_seq = n + 8, .max_seqs = 1};
	struct engine *e;
	if (eng_open(argv[optind], &o, &e, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench picks: %s\n", err);
		return 1;
	}
	if (!eng_tokenizer(e)) {
		fprintf(stderr, "wick bench picks: %s has no tokenizer\n", argv[optind]);
		eng_close(e);
		return 1;
	}
	double best[K_N];
	int made[K_N] = {0};
	for (int k = 0; k < K_N; k++) {
		best[k] = -1;
		for (int i = 0; i < runs + 1; i++) { /* (the first run also warms: json's vocabulary) */
			double t = run_one(e, k, n, &made[k]);
			if (t < 0) {
				eng_close(e);
				return 1;
			}
			if (i > 0 && (best[k] < 0 || t < best[k]))
				best[k] = t;
		}
	}
	int vocab = eng_info(e)->vocab;
	eng_close(e);
	printf("the host's part of a pick, backend %s, a vocabulary of %d (best of %d runs):\n",
	       backend, vocab, runs);
	printf("  %-12s %8s %10s %10s %8s\n", "request", "tokens", "ms/token", "+ms/token",
	       "x plain");
	json_t *j = json_pack("{s:s, s:i, s:{}}", "backend", backend, "vocab", vocab, "ms_per_token");
	for (int k = 0; k < K_N; k++) {
		printf("  %-12s %8d %10.3f %10.3f %8.2f\n", names[k], made[k], best[k] * 1e3,
		       (best[k] - best[K_PLAIN]) * 1e3, best[k] / best[K_PLAIN]);
		json_object_set_new(json_object_get(j, "ms_per_token"), names[k],
				    json_real(best[k] * 1e3));
	}
	char *line = json_dumps(j, JSON_COMPACT);
	printf("%s\n", line ? line : "{}");
	free(line);
	json_decref(j);
	return 0;
}
