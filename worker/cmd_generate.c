/*
 * cmd_generate.c - `wick generate` (stream text) and `wick logits` (raw logits as JSON).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"

static void gen_usage(FILE *f)
{
	fprintf(f,
		"usage: wick generate MODEL [-p TEXT | --tokens IDS] [-n N] [options]\n\n"
		"Streams the prompt and its continuation to stdout (statistics go to stderr).\n"
		"  -p, --prompt TEXT     text to continue (BOS is added); default: BOS alone\n"
		"      --tokens IDS      comma-separated token ids, used exactly as given\n"
		"      --chat            -p TEXT is one user message in the model's chat format\n"
		"                        (as the worker renders a job's messages: GLM's thinking off)\n"
		"  -n, --max-tokens N    tokens to generate (default 256); stops early at EOS/BOS\n"
		"      --temperature T   0 is greedy (default 1.0)\n"
		"      --top-p P         nucleus sampling mass (default 0.9; 1 disables)\n"
		"      --top-k K         keep the K most likely tokens (default 0: off)\n"
		"      --seed S          random seed (default: from the clock's nanoseconds and\n"
		"                        the process id)\n"
		CMD_ENGINE_HELP);
}

/* Prints the part of the decoded text not printed yet. While the text ends in U+FFFD it may
 * be an incomplete byte-fallback sequence, so that tail waits for the next token. */
static void stream(const struct tok *t, const int *ids, int n, size_t *printed, bool final)
{
	char *text;
	size_t len;
	if (tok_decode(t, ids, n, true, &text, &len, NULL, 0) != WK_OK)
		return;
	size_t end = len;
	while (!final && end >= 3 && !memcmp(text + end - 3, "\xef\xbf\xbd", 3))
		end -= 3;
	if (end > *printed) {
		fwrite(text + *printed, 1, end - *printed, stdout);
		fflush(stdout);
		*printed = end;
	}
	free(text);
}

/* --chat: prompt as the one user message, rendered in the model's chat format as the worker
 * renders a job's messages (worker.c: the format for the architecture, GLM's thinking off,
 * the template's own specials in place of BOS), then encoded. */
static int chat_prompt(const struct tok *t, const struct eng_info *info, const char *prompt,
		       int **ids, int *n, char *err, size_t errsz)
{
	enum chat_format f = chat_format_for(info->arch);
	struct chat_msg m = {.role = CHAT_USER, .content = prompt, .len = strlen(prompt)};
	char *text = NULL;
	size_t len = 0;
	int rc = chat_render(f, &m, 1, true, false, &text, &len, err, errsz);
	if (rc == WK_OK)
		rc = tok_encode(t, text, len, f == CHAT_PLAIN, ids, n, err, errsz);
	free(text);
	return rc;
}

int cmd_generate(int argc, char **argv)
{
	enum { O_TOKENS = 256, O_TEMP, O_TOPP, O_TOPK, O_SEED, O_CHAT };
	static const struct option opts[] = {
		{"prompt", required_argument, 0, 'p'}, {"tokens", required_argument, 0, O_TOKENS},
		{"max-tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, O_TEMP},
		{"top-p", required_argument, 0, O_TOPP}, {"top-k", required_argument, 0, O_TOPK},
		{"seed", required_argument, 0, O_SEED}, {"chat", no_argument, 0, O_CHAT},
		{"help", no_argument, 0, 'h'},
		CMD_ENGINE_OPTIONS, {0, 0, 0, 0}};
	const char *prompt = NULL, *tokens = NULL;
	bool chat = false;
	long steps = 256;
	struct cmd_engine ce = {0};
	struct samp_cfg sc = {.temperature = 1.0f, .top_p = 0.9f, .top_k = 0,
			      .seed = wk_random_seed()};
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "p:n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': prompt = optarg; break;
		case O_TOKENS: tokens = optarg; break;
		case 'n':
			steps = strtol(optarg, &end, 10);
			if (*end || steps < 0 || steps > 1 << 24) {
				fprintf(stderr, "wick generate: -n wants a count, not '%s'\n", optarg);
				return 2;
			}
			break;
		case O_TEMP: sc.temperature = strtof(optarg, &end); goto num;
		case O_TOPP: sc.top_p = strtof(optarg, &end); goto num;
		case O_TOPK: sc.top_k = (int)strtol(optarg, &end, 10); goto num;
		case O_SEED: sc.seed = strtoull(optarg, &end, 10); goto num;
		case O_CHAT: chat = true; break;
		case 'h': gen_usage(stdout); return 0;
		default:
			if (c < CMD_OPT_BASE || cmd_engine_flag(&ce, c, optarg)) {
				gen_usage(stderr);
				return 2;
			}
		}
		continue;
num:
		if (*end || end == optarg) {
			fprintf(stderr, "wick generate: '%s' is not a number\n", optarg);
			return 2;
		}
	}
	if (prompt && tokens) {
		fprintf(stderr, "wick generate: give -p TEXT or --tokens IDS, not both\n");
		return 2;
	}
	if (cmd_engine_model(&ce, argc, argv, optind, 0)) {
		gen_usage(stderr);
		return 2;
	}
	if (chat && !prompt) {
		fprintf(stderr, "wick generate: --chat needs the user's message as -p TEXT\n");
		return 2;
	}
	/* written so that NaN fails every test (it compares false) */
	if (!(sc.top_p > 0 && sc.top_p <= 1) || !(sc.temperature >= 0 && isfinite(sc.temperature)) ||
	    sc.top_k < 0) {
		fprintf(stderr, "wick generate: need 0 < top-p <= 1, a finite temperature >= 0 and "
				"top-k >= 0\n");
		return 2;
	}
	int *ids = NULL, n = 0;
	if (tokens && cmd_parse_ids(tokens, &ids, &n)) /* a usage error, as in logits */
		return 2;

	struct engine *e;
	if (cmd_engine_open(&ce, &e)) {
		free(ids);
		return 1;
	}
	const struct eng_info *info = eng_info(e);
	const struct tok *t = eng_tokenizer(e);
	char err[WK_ERRSZ];
	int rc = 1;
	float *logits = NULL;
	struct sampler *s = NULL;

	if (tokens) {
		/* parsed above */
	} else if (prompt && t && chat) {
		if (chat_prompt(t, info, prompt, &ids, &n, err, sizeof err)) {
			fprintf(stderr, "wick generate: --chat: %s\n", err);
			goto out;
		}
	} else if (prompt && t) {
		if (tok_encode(t, prompt, strlen(prompt), true, &ids, &n, err, sizeof err)) {
			fprintf(stderr, "wick generate: %s\n", err);
			goto out;
		}
	} else if (prompt) {
		fprintf(stderr, "wick generate: %s has no tokenizer.json; use --tokens\n", ce.model);
		goto out;
	} else {
		if (info->bos < 0) {
			fprintf(stderr, "wick generate: the model has no bos_token_id; give -p or --tokens\n");
			goto out;
		}
		ids = malloc(sizeof *ids);
		if (!ids)
			goto out;
		ids[0] = info->bos;
		n = 1;
	}
	if (n > info->max_seq || (n == info->max_seq && steps > 0)) {
		fprintf(stderr, "wick generate: the prompt is %d tokens; the context holds %d, with "
				"room to generate none\n", n, info->max_seq);
		goto out;
	}
	if (n + steps > info->max_seq) /* as many as fit: the statistics say how many ran */
		steps = info->max_seq - n;
	int *all = realloc(ids, (size_t)(n + steps + 1) * sizeof *ids);
	logits = malloc((size_t)info->vocab * sizeof *logits);
	s = samp_create(info->vocab, &sc);
	if (!all || !logits || !s) {
		fprintf(stderr, "wick generate: out of memory\n");
		goto out;
	}
	ids = all;

	size_t printed = 0;
	if (t)
		stream(t, ids, n, &printed, false);
	double t0 = wk_now(), t_first = t0;
	int pos = 0, generated = 0;
	while (generated < steps) {
		int chunk = n - pos;
		if (eng_forward(e, ids + pos, chunk, pos, logits, false, err, sizeof err)) {
			fprintf(stderr, "\nwick generate: %s\n", err);
			goto out;
		}
		pos = n;
		if (generated == 0)
			t_first = wk_now();
		int next = samp_next(s, logits);
		if (eng_is_stop(info, next))
			break;
		ids[n++] = next;
		generated++;
		if (t)
			stream(t, ids, n, &printed, false);
		else
			printf("%s%d", generated > 1 ? " " : "", next);
	}
	if (t)
		stream(t, ids, n, &printed, true);
	printf("\n");
	fflush(stdout);
	double t1 = wk_now();
	fprintf(stderr,
		"wick: %d prompt + %d generated tokens; prefill %.1f ms, decode %.1f tok/s (%s backend)\n",
		n - generated, generated, (t_first - t0) * 1e3,
		generated > 1 ? (generated - 1) / (t1 - t_first) : 0.0, info->backend);
	rc = 0;
out:
	samp_free(s);
	free(logits);
	free(ids);
	eng_close(e);
	return rc;
}

static void logits_usage(FILE *f)
{
	fprintf(f,
		"usage: wick logits MODEL --tokens 1,2,3 [--all-positions] [options]\n"
		"       wick logits MODEL --tokens 1,2,3 --mtp N [--drafts K] [options]\n\n"
		"Runs the ids exactly as given (nothing is added) and prints\n"
		"{\"vocab\": V, \"positions\": [...], \"logits\": [[...], ...]}: raw f32 logits, %%.9g,\n"
		"for the last position (0-based) or, with --all-positions, for every one.\n"
		"--mtp N: the model's MTP layer (speculative decoding's drafter) instead. N greedy\n"
		"steps from the ids, each with K drafts (default 1); prints the tokens generated and,\n"
		"per step, the MTP layer's position q (it reads the hidden state at q and the token\n"
		"at q + 1), \"logits\": its logits there, \"chain\": the K - 1 further drafts' logits,\n"
		"\"drafts\": the K drafts.\n"
		CMD_ENGINE_HELP);
}

static void print_row(const float *x, int V)
{
	printf("[");
	for (int i = 0; i < V; i++) {
		if (isfinite(x[i]))
			printf(i ? ", %.9g" : "%.9g", x[i]);
		else
			printf(i ? ", null" : "null");
	}
	printf("]");
}

/* A whole number in [lo, hi] for flag, or a message and -1. */
static int parse_count(const char *flag, const char *arg, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(arg, &end, 10);
	if (end == arg || *end || errno || v < lo || v > hi) {
		fprintf(stderr, "wick logits: %s wants a whole number in [%ld, %ld], not '%s'\n", flag,
			lo, hi, arg);
		return -1;
	}
	*out = v;
	return 0;
}

/* --mtp: steps greedy steps from ids, each asking the MTP layer for k drafts. */
static int logits_mtp(struct engine *e, const int *ids, int n, int steps, int k)
{
	int V = eng_info(e)->vocab, seq, rc = 1;
	char err[WK_ERRSZ];
	float *dl = malloc((size_t)steps * k * V * sizeof *dl);
	int *tok = malloc((size_t)steps * sizeof *tok), *dr = malloc((size_t)steps * k * sizeof *dr);
	if (!dl || !tok || !dr) {
		fprintf(stderr, "wick logits: out of memory\n");
		goto out;
	}
	if (eng_seq_alloc(e, &seq) != WK_OK)
		goto out;
	for (int s = 0; s < steps; s++) {
		struct eng_item it = {.seq = seq, .tokens = s ? &tok[s - 1] : ids, .n = s ? 1 : n,
				      .token = &tok[s], .drafts = k, .draft = dr + (size_t)s * k,
				      .draft_logits = dl + (size_t)s * k * V};
		if (eng_step(e, &it, 1, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick logits: step %d: %s\n", s, err);
			goto out;
		}
	}
	printf("{\"vocab\": %d, \"tokens\": [", V);
	for (int s = 0; s < steps; s++)
		printf("%s%d", s ? ", " : "", tok[s]);
	printf("], \"positions\": [");
	for (int s = 0; s < steps; s++)
		printf("%s%d", s ? ", " : "", n - 1 + s);
	printf("], \"drafts\": [");
	for (int s = 0; s < steps; s++) {
		printf("%s[", s ? ", " : "");
		for (int j = 0; j < k; j++)
			printf("%s%d", j ? ", " : "", dr[(size_t)s * k + j]);
		printf("]");
	}
	printf("], \"logits\": [");
	for (int s = 0; s < steps; s++) {
		printf(s ? ", " : "");
		print_row(dl + (size_t)s * k * V, V);
	}
	printf("], \"chain\": [");
	for (int s = 0; s < steps; s++) {
		printf("%s[", s ? ", " : "");
		for (int j = 1; j < k; j++) {
			printf(j > 1 ? ", " : "");
			print_row(dl + ((size_t)s * k + j) * V, V);
		}
		printf("]");
	}
	printf("]}\n");
	rc = 0;
out:
	free(dl);
	free(tok);
	free(dr);
	return rc;
}

int cmd_logits(int argc, char **argv)
{
	enum { O_TOKENS = 256, O_ALL, O_MTP, O_DRAFTS };
	static const struct option opts[] = {
		{"tokens", required_argument, 0, O_TOKENS}, {"all-positions", no_argument, 0, O_ALL},
		{"mtp", required_argument, 0, O_MTP}, {"drafts", required_argument, 0, O_DRAFTS},
		{"help", no_argument, 0, 'h'}, CMD_ENGINE_OPTIONS, {0, 0, 0, 0}};
	const char *tokens = NULL;
	bool all = false;
	int c;
	long mtp = 0, drafts = 1;
	struct cmd_engine ce = {0};
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_TOKENS: tokens = optarg; break;
		case O_ALL: all = true; break;
		case O_MTP:
			if (parse_count("--mtp", optarg, 1, 4096, &mtp))
				return 2;
			break;
		case O_DRAFTS:
			if (parse_count("--drafts", optarg, 1, ENG_DRAFT_MAX, &drafts))
				return 2;
			break;
		case 'h': logits_usage(stdout); return 0;
		default:
			if (c < CMD_OPT_BASE || cmd_engine_flag(&ce, c, optarg)) {
				logits_usage(stderr);
				return 2;
			}
		}
	}
	if (!tokens) {
		fprintf(stderr, "wick logits: --tokens IDS is required (comma-separated token ids)\n");
		logits_usage(stderr);
		return 2;
	}
	if (mtp && all) {
		fprintf(stderr, "wick logits: --mtp and --all-positions do not go together\n");
		return 2;
	}
	if (cmd_engine_model(&ce, argc, argv, optind, 0)) {
		logits_usage(stderr);
		return 2;
	}
	int *ids, n;
	if (cmd_parse_ids(tokens, &ids, &n))
		return 2;
	ce.o.no_tokenizer = true; /* ids only: a tokenizer.json wick cannot read is no obstacle */
	if (mtp)
		ce.o.mtp = ENG_MTP_ON;
	struct engine *e;
	if (cmd_engine_open(&ce, &e)) {
		free(ids);
		return 1;
	}
	int V = eng_info(e)->vocab, rows = all ? n : 1, rc = 1;
	char err[WK_ERRSZ];
	float *lg = NULL;
	if (mtp) {
		rc = logits_mtp(e, ids, n, (int)mtp, (int)drafts);
		goto out;
	}
	lg = malloc((size_t)rows * V * sizeof *lg);
	if (!lg) {
		fprintf(stderr, "wick logits: out of memory\n");
		goto out;
	}
	if (eng_forward(e, ids, n, 0, lg, all, err, sizeof err)) {
		fprintf(stderr, "wick logits: %s\n", err);
		goto out;
	}
	printf("{\"vocab\": %d, \"positions\": [", V);
	for (int r = 0; r < rows; r++)
		printf("%s%d", r ? ", " : "", all ? r : n - 1);
	printf("], \"logits\": [");
	for (int r = 0; r < rows; r++) {
		printf(r ? ", " : "");
		print_row(lg + (size_t)r * V, V);
	}
	printf("]}\n");
	rc = 0;
out:
	free(lg);
	free(ids);
	eng_close(e);
	return rc;
}
