/*
 * bench_spec.c - `wick bench speculate`: what speculative decoding by prompt lookup
 * (sched_set_speculate) gives, against the same requests without it in the same run. The
 * requests are greedy and run through the scheduler one at a time (a lone user's latency,
 * where a step's cost is the weights read once) or --concurrency at once; each mode runs
 * --runs times, alternating, and the medians are compared. The outputs must be the same token
 * for token, else it exits 1.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/sched.h"

#define SPEC_MAX_PROMPTS 64

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick bench speculate MODEL [options]\n\n"
		"Runs greedy requests through the scheduler with speculative decoding (wick worker\n"
		"--speculate: prompt lookup or the MTP layer) and without, alternating, and prints\n"
		"tokens/s, steps and the draft tokens kept, then one JSON line. Exits 1 when the\n"
		"outputs differ.\n"
		"  -n, --tokens N        tokens a request (default 128)\n"
		"      --draft K         draft tokens a step at most (default 4)\n"
		"      --prompt TEXT     a request's prompt (repeatable; default: four of\n"
		"                        stories260K's kind, two that repeat themselves)\n"
		"      --prompt-ids LIST a prompt as token ids, 1,2,3 (repeatable; a model without\n"
		"                        a tokenizer)\n"
		"      --concurrency C   requests at once (default 1: one after another)\n"
		"      --runs R          runs of each mode (default 3)\n"
		"      --drafter D       mtp (the model's MTP layer), lookup, or auto (default: mtp\n"
		"                        where the model has one), as wick worker --drafter\n"
		"      --draft-cost C    a draft's cost against a step's (0-16), or auto (default:\n"
		"                        measured from the steps), as wick worker --draft-cost\n"
		"      --predict         the speculating runs get each request's output (from the\n"
		"                        first run without) as its prediction: an edit that changes\n"
		"                        nothing, the best case of OpenAI's predicted outputs\n"
		CMD_ENGINE_HELP);
}

struct run_out {
	double seconds, cost; /* cost: a draft's at the end (sched_draft_cost) */
	long steps;
	int tokens, drafted, accepted;
	int *out[SPEC_MAX_PROMPTS], n_out[SPEC_MAX_PROMPTS];
};

static void on_done(void *ctx, struct sched_req *r)
{
	struct run_out *o = ctx;
	int i = atoi(r->id);
	o->tokens += r->n_out;
	o->drafted += r->drafted;
	o->accepted += r->accepted;
	o->out[i] = r->out;
	o->n_out[i] = r->n_out;
	r->out = NULL;
	sched_req_free(r);
}

/* One run of every prompt, conc at a time, with max_draft (0: off); with pred, request i
 * gets the output pred->out[i] as its prediction. */
static int run(struct engine *e, int max_draft, double cost, int *const *ids, const int *n_ids,
	       int n, int tokens, int conc, const struct run_out *pred, struct run_out *o)
{
	memset(o, 0, sizeof *o);
	struct sched *s = sched_create(e, NULL);
	if (!s || sched_set_speculate(s, max_draft) != WK_OK ||
	    sched_set_draft_cost(s, cost) != WK_OK) {
		sched_free(s);
		return WK_ENOMEM;
	}
	char err[WK_ERRSZ];
	double t0 = wk_now();
	int next = 0, rc = WK_OK;
	while (rc == WK_OK && (next < n || sched_pending(s) > 0)) {
		while (next < n && sched_pending(s) < conc) {
			struct sched_req *r = calloc(1, sizeof *r);
			if (!r || !(r->prompt = malloc((size_t)n_ids[next] * sizeof(int)))) {
				free(r);
				rc = WK_ENOMEM;
				break;
			}
			snprintf(r->id, sizeof r->id, "%d", next);
			memcpy(r->prompt, ids[next], (size_t)n_ids[next] * sizeof(int));
			r->n_prompt = n_ids[next];
			r->max_tokens = tokens;
			r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
			if (pred && pred->n_out[next] > 1) { /* less the prefill's token */
				int np = pred->n_out[next] - 1;
				if (!(r->pred = malloc((size_t)np * sizeof(int)))) {
					sched_req_free(r);
					rc = WK_ENOMEM;
					break;
				}
				memcpy(r->pred, pred->out[next] + 1, (size_t)np * sizeof(int));
				r->n_pred = np;
			}
			if ((rc = sched_submit(s, r, err, sizeof err)) != WK_OK) {
				fprintf(stderr, "wick bench speculate: prompt %d: %s\n", next, err);
				sched_req_free(r);
				break;
			}
			next++;
		}
		if (rc == WK_OK && sched_step(s, on_done, o) < 0)
			rc = WK_EIO;
	}
	o->seconds = wk_now() - t0;
	o->steps = sched_steps(s);
	o->cost = sched_draft_cost(s);
	sched_free(s);
	return rc;
}

/* Seconds of a step of n tokens with the argmax after each (a verification of n - 1 drafts),
 * the median of reps, in one sequence after its prompt ids[0..np): what a step of drafts costs
 * against a step of one token, the other half of what speculation gives. */
static double step_cost(struct engine *e, const int *ids, int np, int n, int drafts, int reps)
{
	int seq, tok[SCHED_DRAFT_MAX + 1], in[SCHED_DRAFT_MAX + 1], dr[SCHED_DRAFT_MAX];
	double t[9];
	char err[WK_ERRSZ];
	if (eng_seq_alloc(e, &seq) != WK_OK)
		return -1;
	struct eng_item it = {.seq = seq, .tokens = ids, .n = np, .token = tok};
	for (int k = 0; k < n; k++)
		in[k] = ids[k % np];
	int rc = eng_step(e, &it, 1, err, sizeof err);
	for (int r = 0; r < reps && rc == WK_OK; r++) {
		it = (struct eng_item){.seq = seq, .tokens = in, .n = n, .token = tok, .rows = n,
				       .drafts = drafts, .draft = dr};
		double t0 = wk_now();
		rc = eng_step(e, &it, 1, err, sizeof err);
		t[r] = wk_now() - t0;
		eng_seq_truncate(e, seq, np);
	}
	eng_seq_free(e, seq);
	return rc == WK_OK ? cmd_median(t, reps) : -1;
}

static void free_out(struct run_out *o)
{
	for (int i = 0; i < SPEC_MAX_PROMPTS; i++)
		free(o->out[i]);
}


static int parse(const char *arg, const char *flag, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(arg, &end, 10);
	if (end == arg || *end || v < lo || v > hi) {
		fprintf(stderr, "wick bench speculate: %s wants a number from %d to %d, not '%s'\n",
			flag, lo, hi, arg);
		return 2;
	}
	*out = (int)v;
	return 0;
}

int bench_spec(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tokens", required_argument, 0, 'n'}, {"draft", required_argument, 0, 'd'},
		{"prompt", required_argument, 0, 'p'}, {"concurrency", required_argument, 0, 'c'},
		{"runs", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'},
		{"prompt-ids", required_argument, 0, 'i'}, {"predict", no_argument, 0, 'P'},
		{"drafter", required_argument, 0, 'D'}, {"draft-cost", required_argument, 0, 'C'},
		CMD_ENGINE_OPTIONS, {0, 0, 0, 0}};
	static const char *const dflt[] = {
		"Lily and Ben went to the park. Lily and Ben played with a ball. Lily and Ben",
		"Once upon a time",
		"Tom had a red ball. Tom had a red ball. Tom",
		"One day, a little bird",
	};
	const char *prompts[SPEC_MAX_PROMPTS];
	int *ids[SPEC_MAX_PROMPTS] = {0}, n_ids[SPEC_MAX_PROMPTS] = {0}, rc = 0;
	int np = 0, tokens = 128, draft = 4, conc = 1, runs = 3, c, bad = 0;
	bool predict = false;
	double cost = SCHED_COST_AUTO;
	struct cmd_engine ce = {.o = {.backend = "cpu", .mtp = ENG_MTP_AUTO}};
	while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n': bad = parse(optarg, "-n", 1, 100000, &tokens); break;
		case 'd': bad = parse(optarg, "--draft", 1, SCHED_DRAFT_MAX, &draft); break;
		case 'c': bad = parse(optarg, "--concurrency", 1, SPEC_MAX_PROMPTS, &conc); break;
		case 'r': bad = parse(optarg, "--runs", 1, 99, &runs); break;
		case 'p':
		case 'i':
			if (np == SPEC_MAX_PROMPTS) {
				fprintf(stderr, "wick bench speculate: at most %d prompts\n",
					SPEC_MAX_PROMPTS);
				return 2;
			}
			prompts[np] = c == 'p' ? optarg : NULL;
			if (c == 'i' && cmd_parse_ids(optarg, &ids[np], &n_ids[np])) {
				bad = 2;
				break;
			}
			np++;
			break;
		case 'P': predict = true; break;
		case 'C':
			if (strcmp(optarg, "auto")) {
				char *end;
				cost = strtod(optarg, &end);
				if (end == optarg || *end || !(cost >= 0 && cost <= SCHED_COST_MAX)) {
					fprintf(stderr, "wick bench speculate: --draft-cost wants auto or "
						"a number from 0 to %g, not '%s'\n", SCHED_COST_MAX, optarg);
					bad = 2;
				}
			}
			break;
		case 'D':
			if (strcmp(optarg, "auto") && strcmp(optarg, "mtp") && strcmp(optarg, "lookup")) {
				fprintf(stderr, "wick bench speculate: --drafter is auto, mtp or lookup, "
					"not '%s'\n", optarg);
				bad = 2;
			}
			ce.o.mtp = !strcmp(optarg, "mtp")      ? ENG_MTP_ON
				   : !strcmp(optarg, "lookup") ? ENG_MTP_OFF
							       : ENG_MTP_AUTO;
			break;
		case 'h': usage(stdout); return 0;
		default:
			if (c < CMD_OPT_BASE || cmd_engine_flag(&ce, c, optarg)) {
				usage(stderr);
				return 2;
			}
		}
		if (bad)
			break;
	}
	if (bad || cmd_engine_model(&ce, argc, argv, optind, 0)) {
		for (int i = 0; i < np; i++)
			free(ids[i]);
		return 2;
	}
	if (!np)
		for (; np < (int)(sizeof dflt / sizeof *dflt); np++)
			prompts[np] = dflt[np];
	if (!ce.o.max_seqs)
		ce.o.max_seqs = conc;
	struct engine *e;
	if (cmd_engine_open(&ce, &e)) {
		for (int i = 0; i < np; i++)
			free(ids[i]);
		return 1;
	}
	const struct tok *tk = eng_tokenizer(e);
	char err[WK_ERRSZ];
	for (int i = 0; i < np && !rc; i++) {
		if (prompts[i] && !tk) {
			fprintf(stderr, "wick bench speculate: %s has no tokenizer: give "
					"--prompt-ids\n", ce.model);
			rc = 1;
		} else if (prompts[i]) {
			int trc = tok_encode(tk, prompts[i], strlen(prompts[i]), true, &ids[i],
					     &n_ids[i], err, sizeof err);
			if (trc != WK_OK || n_ids[i] == 0) {
				fprintf(stderr, "wick bench speculate: prompt %d: %s\n", i,
					trc != WK_OK ? err : "no tokens (a tokenizer without BOS?)");
				rc = 1;
			}
		}
		for (int k = 0; !rc && k < n_ids[i]; k++)
			if (ids[i][k] < 0 || ids[i][k] >= eng_info(e)->vocab) {
				fprintf(stderr, "wick bench speculate: prompt %d: token id %d is outside "
						"the vocabulary (0..%d)\n", i, ids[i][k],
					eng_info(e)->vocab - 1);
				rc = 1;
			}
	}
	double tps[2][99], steps[2] = {0};
	struct run_out ref = {0}, o = {0};
	int drafted = 0, accepted = 0, differ = -1;
	double cost_end = 0; /* the last speculating run's draft cost */
	/* a warm-up run, untimed: the first touches of the weights and buffers */
	if (!rc && run(e, 0, cost, ids, n_ids, np, tokens < 8 ? tokens : 8, conc, NULL, &o) != WK_OK) {
		fprintf(stderr, "wick bench speculate: a run failed\n");
		rc = 1;
	}
	free_out(&o);
	for (int k = 0; k < runs && !rc; k++)
		for (int mode = 0; mode < 2 && !rc; mode++) {
			if (run(e, mode ? draft : 0, cost, ids, n_ids, np, tokens, conc,
				mode && predict ? &ref : NULL, &o) != WK_OK) {
				fprintf(stderr, "wick bench speculate: a run failed\n");
				rc = 1;
				free_out(&o);
				break;
			}
			tps[mode][k] = o.tokens / o.seconds;
			steps[mode] = (double)o.steps;
			if (mode) {
				drafted = o.drafted;
				accepted = o.accepted;
				cost_end = o.cost;
			}
			if (k == 0 && mode == 0) {
				ref = o;
				continue;
			}
			for (int i = 0; i < np && differ < 0; i++)
				if (o.n_out[i] != ref.n_out[i] ||
				    memcmp(o.out[i], ref.out[i], (size_t)o.n_out[i] * sizeof(int)))
					differ = i;
			free_out(&o);
		}
	if (!rc && differ >= 0) {
		fprintf(stderr, "wick bench speculate: prompt %d's output differs with speculation\n",
			differ);
		rc = 1;
	}
	double c1 = rc ? -1 : step_cost(e, ids[0], n_ids[0], 1, 0, 9);
	double cn = rc ? -1 : step_cost(e, ids[0], n_ids[0], draft + 1, 0, 9);
	/* with the MTP layer: that step, and the MTP layer's draft tokens for the next */
	bool mtp = eng_info(e)->mtp;
	double cm = rc || !mtp ? 0 : step_cost(e, ids[0], n_ids[0], draft + 1, draft, 9);
	if (!rc && (c1 <= 0 || cn <= 0 || cm < 0)) {
		fprintf(stderr, "wick bench speculate: timing a step failed\n");
		rc = 1;
	}
	if (!rc) {
		double p = cmd_median(tps[0], runs), s = cmd_median(tps[1], runs);
		printf("%d greedy requests of %d tokens, %d at a time, on %s (%s), %s drafts%s\n", np,
		       tokens, conc, ce.model, eng_info(e)->backend,
		       eng_info(e)->mtp ? "MTP" : "prompt lookup",
		       predict ? ", each predicted by its own output" : "");
		printf("%-22s %12s %8s\n", "", "tokens/s", "steps");
		printf("%-22s %12.1f %8.0f\n", "plain", p, steps[0]);
		printf("%-22s %12.1f %8.0f\n", "speculate", s, steps[1]);
		printf("ratio %.2fx in tokens/s, %.2fx fewer steps; kept %d of %d draft tokens "
		       "(%.0f%%); the outputs are the same\n", s / p, steps[0] / steps[1], accepted,
		       drafted, drafted ? 100.0 * accepted / drafted : 0.0);
		printf("a draft costs %.3f of a step (%s), drafted where that pays\n", cost_end,
		       cost == SCHED_COST_AUTO ? "measured from the steps, at the end" : "--draft-cost");
		printf("a step of %d tokens (one and %d drafts) takes %.2fx a step of one "
		       "(%.2f ms against %.2f, medians of 9)\n", draft + 1, draft, cn / c1, cn * 1e3,
		       c1 * 1e3);
		if (mtp)
			printf("that step and the MTP layer's %d drafts for the next: %.2fx a step of "
			       "one (%.2f ms)\n", draft, cm / c1, cm * 1e3);
		printf("{\"bench\": \"speculate\", \"drafter\": \"%s\", \"predict\": %s, "
		       "\"requests\": %d, \"tokens\": %d, "
		       "\"concurrency\": %d, \"draft\": %d, \"runs\": %d, \"plain_tokens_per_s\": %.2f, "
		       "\"speculate_tokens_per_s\": %.2f, \"ratio\": %.3f, \"plain_steps\": %.0f, "
		       "\"speculate_steps\": %.0f, \"drafted\": %d, \"accepted\": %d, "
		       "\"step_ms\": %.3f, \"verify_step_ms\": %.3f, \"mtp_step_ms\": %.3f, "
		       "\"draft_cost\": %.4f, \"draft_cost_measured\": %s}\n",
		       eng_info(e)->mtp ? "mtp" : "lookup", predict ? "true" : "false", np,
		       tokens, conc, draft, runs,
		       p, s, s / p, steps[0], steps[1], drafted, accepted, c1 * 1e3, cn * 1e3,
		       cm * 1e3, cost_end, cost == SCHED_COST_AUTO ? "true" : "false");
	}
	free_out(&ref);
	for (int i = 0; i < np; i++)
		free(ids[i]);
	eng_close(e);
	return rc;
}
