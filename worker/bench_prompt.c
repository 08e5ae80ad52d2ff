/*
 * bench_prompt.c - `wick bench prompt MODEL`: what an agent's conversation costs the worker to
 * render and encode at each turn, with the tokenizer's memo (tok_memo_set, as the worker
 * runs) against without it, from the same run.
 *
 * An agent sends its whole conversation with every request, and the worker renders it in the
 * model's chat format and encodes it on its own thread, between engine steps: every other
 * request in the batch waits. The conversation here grows by a user message (a tool's output:
 * generated C-like code) and an assistant's answer a turn; each turn's prompt is made the
 * way the worker admits a job (job_prompt), by a tokenizer without the memo and by one with
 * it, kept across the turns as the worker keeps it. The ids must be the same. Beside them,
 * the job document's decode (job_decode), which a queue job's admission pays too; an HTTP
 * request's job comes decoded by the HTTP thread's check (http_flight_take_job).
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/job.h"
#include "worker/prompt.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench prompt MODEL [--turns N] [--bytes B]\n\n"
		   "An agent's conversation of N turns (default 40), each a user message of about B\n"
		   "bytes of code (default 12000: a tool's output) and a short answer, rendered in\n"
		   "MODEL's chat format and encoded as the worker admits a job, at every turn: with\n"
		   "the tokenizer's memo of long segments (as the worker runs) and without; prints\n"
		   "the milliseconds of the last turn and of all of them (and of decoding the job\n"
		   "document, which both pay), the ratio, then one JSON line. MODEL needs its\n"
		   "tokenizer.json.\n");
}

/* A deterministic stream of code-like text. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng >> 32);
}

static void ident(struct wk_buf *b)
{
	static const char *const syl[] = {"buf", "len", "ctx", "node", "head", "next", "key",
					  "val", "seq", "tok", "rank", "row", "step", "cache"};
	int n = 1 + (int)(next_rand() % 3);
	for (int i = 0; i < n; i++) {
		if (i)
			wk_buf_add(b, "_", 1);
		const char *s = syl[next_rand() % (sizeof syl / sizeof syl[0])];
		wk_buf_add(b, s, strlen(s));
	}
}

static char *code(size_t bytes)
{
	struct wk_buf b = {0};
	while (b.len < bytes) {
		char num[16];
		switch (next_rand() % 4) {
		case 0:
			wk_buf_add(&b, "static int ", 11);
			ident(&b);
			wk_buf_add(&b, "(struct ", 8);
			ident(&b);
			wk_buf_add(&b, " *p)\n{\n", 7);
			break;
		case 1:
			wk_buf_add(&b, "\tif (p->", 8);
			ident(&b);
			snprintf(num, sizeof num, " > %u)\n", next_rand() % 1000);
			wk_buf_add(&b, num, strlen(num));
			break;
		case 2:
			wk_buf_add(&b, "\t\treturn ", 9);
			ident(&b);
			wk_buf_add(&b, "(p);\n", 5);
			break;
		default:
			wk_buf_add(&b, "}\n\n/* ", 6);
			ident(&b);
			wk_buf_add(&b, ": the next one */\n", 18);
		}
	}
	return b.p;
}

/* One turn's prompt: its milliseconds into *ms, its ids into *ids (*n). */
static int turn(const struct job_model *jm, const struct job *j, double *ms, int **ids, int *n,
		char *err, size_t errsz)
{
	double t0 = wk_now();
	int rc = job_prompt(jm, j, true, ids, n, err, errsz);
	*ms = (wk_now() - t0) * 1e3;
	return rc;
}

/* The job document of the conversation so far, decoded as the worker decodes it: its
 * milliseconds into *ms. */
static int decode(const json_t *msgs, struct job *j, double *ms, char *err, size_t errsz)
{
	json_t *doc = json_pack("{s:s, s:{s:O, s:i}}", "id", "bench", "input", "messages", msgs,
				"max_tokens", 16);
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	if (!text)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	double t0 = wk_now();
	enum job_err je = job_decode(text, strlen(text), NULL, j, err, errsz);
	*ms = (wk_now() - t0) * 1e3;
	free(text);
	return je == JOB_OK ? WK_OK : WK_EINVAL;
}

int bench_prompt(int argc, char **argv)
{
	int turns = 40;
	long bytes = 12000;
	static const struct option opts[] = {{"turns", required_argument, 0, 't'},
					     {"bytes", required_argument, 0, 'b'},
					     {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 't':
			turns = (int)strtol(optarg, &end, 10);
			if (*end || turns < 1 || turns > 1000) {
				fprintf(stderr, "wick bench prompt: --turns wants 1 to 1000\n");
				return 2;
			}
			break;
		case 'b':
			bytes = strtol(optarg, &end, 10);
			if (*end || bytes < 1 || bytes > (1 << 20)) {
				fprintf(stderr, "wick bench prompt: --bytes wants 1 to 1048576\n");
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	const char *model = argv[optind];
	char err[WK_ERRSZ];
	struct tok *plain = NULL, *memo = NULL;
	bool prepared;
	enum chat_format cf;
	if (tok_load_dir(model, &plain, &prepared, err, sizeof err) != WK_OK ||
	    tok_load_dir(model, &memo, &prepared, err, sizeof err) != WK_OK ||
	    chat_format_for_model(model, &cf, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench prompt: %s\n", err);
		tok_free(plain);
		tok_free(memo);
		return 1;
	}
	int rc = tok_memo_set(memo, (size_t)64 << 20);
	json_t *msgs = json_pack("[{s:s, s:s}]", "role", "system", "content",
				 "You are a coding agent. Read the files, then answer.");
	if (rc != WK_OK || !msgs) {
		fprintf(stderr, "wick bench prompt: out of memory\n");
		tok_free(plain);
		tok_free(memo);
		json_decref(msgs);
		return 1;
	}
	double last[3] = {0, 0, 0}, total[3] = {0, 0, 0}; /* plain, memo, decode */
	int n_last = 0, status = 0;
	for (int t = 0; t < turns && !status; t++) {
		char *c = code((size_t)bytes);
		if (json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
							  c ? c : ""))) {
			fprintf(stderr, "wick bench prompt: out of memory\n");
			status = 1;
		}
		free(c);
		struct job j = {0};
		int *ids[2] = {NULL, NULL}, n[2] = {0, 0};
		double ms[3] = {0, 0, 0};
		if (!status && decode(msgs, &j, &ms[2], err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench prompt: turn %d: %s\n", t + 1, err);
			status = 1;
		}
		for (int k = 0; k < 2 && !status; k++) {
			struct job_model jm = {k ? memo : plain, cf, tok_vocab_size(plain)};
			if (turn(&jm, &j, &ms[k], &ids[k], &n[k], err, sizeof err) != WK_OK) {
				fprintf(stderr, "wick bench prompt: turn %d: %s\n", t + 1, err);
				status = 1;
			}
		}
		if (!status && (n[0] != n[1] || memcmp(ids[0], ids[1], (size_t)n[0] * sizeof(int)))) {
			fprintf(stderr, "wick bench prompt: turn %d: the memo's ids differ (%d and %d "
				"tokens)\n", t + 1, n[0], n[1]);
			status = 1;
		}
		for (int k = 0; k < 3 && !status; k++) {
			total[k] += ms[k];
			last[k] = ms[k];
		}
		n_last = n[0];
		free(ids[0]);
		free(ids[1]);
		job_free(&j);
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
						      "I read it. Next, the file that calls it."));
	}
	struct tok_memo_stats st;
	tok_memo_stats(memo, &st);
	if (!status) {
		printf("%d turns, the last one's prompt %d tokens (%s chat format)\n", turns, n_last,
		       chat_format_name(cf));
		printf("prompt (render + encode)  last turn ms   all turns ms\n");
		printf("  without memo            %12.2f   %12.2f\n", last[0], total[0]);
		printf("  with memo               %12.2f   %12.2f\n", last[1], total[1]);
		printf("  ratio                   %11.1fx   %11.1fx   (memo: %zu segments, %.1f MB; "
		       "%llu hits)\n", last[0] / last[1], total[0] / total[1], st.entries,
		       (double)st.bytes / 1e6, (unsigned long long)st.hits);
		printf("job document decode       %12.2f   %12.2f\n", last[2], total[2]);
		printf("on the worker's thread, the last turn: %.2f ms without the memo (decode and\n"
		       "prompt); a queue job's %.2f with it (%.1fx), an HTTP request's %.2f (%.1fx: its\n"
		       "document was decoded by the HTTP thread's check)\n", last[2] + last[0],
		       last[2] + last[1], (last[2] + last[0]) / (last[2] + last[1]), last[1],
		       (last[2] + last[0]) / last[1]);
		printf("{\"turns\": %d, \"tokens\": %d, \"last_ms\": {\"plain\": %.3f, \"memo\": %.3f, "
		       "\"decode\": %.3f}, \"total_ms\": {\"plain\": %.3f, \"memo\": %.3f, "
		       "\"decode\": %.3f}}\n", turns, n_last, last[0], last[1], last[2], total[0],
		       total[1], total[2]);
	}
	json_decref(msgs);
	tok_free(plain);
	tok_free(memo);
	return status;
}
