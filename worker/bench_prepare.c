/*
 * bench_prepare.c - `wick bench prepare MODEL --queue URL`: what the worker's preparers
 * (--prepare-threads) buy. A big job (an agent's long conversation) takes milliseconds to
 * decode and to render and encode; done between the engine's steps, every job in the batch
 * waits that long for its next token. The bench runs a real `wick worker` on URL with jobs
 * decoding while big jobs arrive, with --prepare-threads 0 and 1 in turn, and reads the gaps
 * between its steps from the step log.
 */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/job.h"
#include "worker/queue.h"

extern char **environ;

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench prepare MODEL --queue URL [--steady C] [-n TOKENS] [--big B]\n"
		   "                        [--kb K] [--every S] [--rounds R] [--backend B]\n"
		   "                        [--threads T]\n\n"
		   "Runs a real `wick worker` on URL (an empty spool, redis or sqs queue) with C\n"
		   "jobs of TOKENS tokens decoding (default 4 of 400, EOS banned) while B big jobs\n"
		   "arrive, one every S steps (default 8 every 40): documents of K KB (default\n"
		   "512; a long input.prediction, which the worker decodes and encodes as it would\n"
		   "a long conversation, and which does not take the model's context). Each round\n"
		   "runs the worker with --prepare-threads 0 (big jobs prepared between the\n"
		   "engine's steps) and 1 (by a preparer beside them), R rounds (default 2), and\n"
		   "reports from its step log the gaps between two steps that decode them (how\n"
		   "long the batch waited for a token): the median, the 99th percentile and the\n"
		   "longest. --threads T and --backend B go to the worker.\n");
}

struct bench_cfg {
	struct bench_load l;
	const char *url;
	int eos;
	const char *filler; /* K KB of text */
};

static int submit(struct queue *q, const char *id, const char *body, size_t len)
{
	char err[WK_ERRSZ];
	if (queue_submit(q, id, body, len, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench prepare: submit: %s\n", err);
		return 1;
	}
	return 0;
}

/* A big job's document: a short prompt, one token, and the filler (numbered, so that no two
 * are alike) as its prediction. NULL when out of memory. */
static char *big_doc(const struct bench_cfg *c, const char *id, size_t *len)
{
	json_t *d = json_pack("{s:s, s:{s:s, s:i, s:s++}}", "id", id, "input", "prompt",
			      "Once upon a time", "max_tokens", 1, "prediction", id, " ",
			      c->filler);
	char *s = d ? json_dumps(d, JSON_COMPACT) : NULL;
	json_decref(d);
	*len = s ? strlen(s) : 0;
	return s;
}

/* One worker run with `preparers`: its step gaps into *o. */
static int one_run(const struct bench_cfg *c, int preparers, int round, struct bench_gaps *o)
{
	char err[WK_ERRSZ];
	struct queue *q;
	if (queue_open(c->url, NULL, &q, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench prepare: %s\n", err);
		return 1;
	}
	long backlog = 0;
	int rc;
	if (queue_backlog(q, &backlog, err, sizeof err) != WK_OK || backlog > 0) {
		fprintf(stderr, "wick bench prepare: %s: %s\n", c->url,
			backlog > 0 ? "the queue holds jobs; give the benchmark an empty one" : err);
		queue_close(q);
		return 1;
	}
	for (int i = 0; i < c->l.steady; i++) {
		char id[64];
		snprintf(id, sizeof id, "steady-%d-%d-%d-%d", (int)getpid(), round, preparers, i);
		json_t *in = json_pack("{s:s, s:i, s:i, s:i}", "prompt", "Once upon a time",
				       "max_tokens", c->l.tokens, "temperature", 1, "seed", i);
		if (in && c->eos >= 0) { /* it runs its tokens to the end */
			char eos[16];
			snprintf(eos, sizeof eos, "%d", c->eos);
			json_object_set_new(in, "logit_bias", json_pack("{s:i}", eos, -100));
		}
		json_t *d = in ? json_pack("{s:s, s:o}", "id", id, "input", in) : NULL;
		char *body = d ? json_dumps(d, JSON_COMPACT) : NULL;
		json_decref(d);
		rc = !body || submit(q, id, body, strlen(body));
		free(body);
		if (rc) {
			queue_close(q);
			return 1;
		}
	}
	char dir[] = "/tmp/wick-bench-prepare-XXXXXX";
	if (!mkdtemp(dir)) {
		queue_close(q);
		return 1;
	}
	char steplog[128], logpath[128], njobs[16], nconc[16], nprep[16];
	snprintf(steplog, sizeof steplog, "%s/steps.jsonl", dir);
	snprintf(logpath, sizeof logpath, "%s/worker.log", dir);
	snprintf(njobs, sizeof njobs, "%d", c->l.steady + c->l.big);
	snprintf(nconc, sizeof nconc, "%d", c->l.steady + c->l.big);
	snprintf(nprep, sizeof nprep, "%d", preparers);
	char *args[] = {"wick", "worker", "--model", (char *)c->l.model, "--queue", (char *)c->url,
			"--backend", (char *)c->l.backend, "--max-jobs", njobs, "--concurrency",
			nconc, "--idle-timeout", "30", "--log-format", "json", "--step-log",
			steplog, "--prepare-threads", nprep, NULL, NULL, NULL};
	if (c->l.threads) {
		args[sizeof args / sizeof *args - 3] = "--threads";
		args[sizeof args / sizeof *args - 2] = (char *)c->l.threads;
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 2, logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	pid_t pid;
	double t0 = wk_now();
	rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		queue_close(q);
		return 1;
	}
	/* the big jobs, paced by the step log's lines */
	FILE *sl = NULL;
	long steps = 0;
	int sent = 0, st = 0;
	bool exited = false;
	char line[65536];
	while (!exited) {
		if (!sl)
			sl = fopen(steplog, "r");
		while (sl && fgets(line, sizeof line, sl))
			steps += strchr(line, '\n') != NULL;
		if (sl)
			clearerr(sl);
		while (sent < c->l.big && steps >= (long)(sent + 1) * c->l.every) {
			char id[64];
			size_t len;
			snprintf(id, sizeof id, "big-%d-%d-%d-%d", (int)getpid(), round, preparers,
				 sent);
			char *doc = big_doc(c, id, &len);
			rc = !doc || submit(q, id, doc, len);
			free(doc);
			if (rc) {
				kill(pid, SIGTERM);
				break;
			}
			sent++;
		}
		exited = waitpid(pid, &st, WNOHANG) == pid;
		if (!exited)
			usleep(200);
	}
	double run_s = wk_now() - t0;
	if (sl)
		fclose(sl);
	queue_close(q);
	/* the gaps between two steps that both decode a steady job (the batch waiting on
	 * something else), and the exit line's counts */
	double *t = NULL, prev = -1;
	size_t nt = 0, cap = 0, n_steps = 0;
	FILE *f = fopen(steplog, "r");
	while (f && fgets(line, sizeof line, f)) {
		json_t *j = json_loads(line, 0, NULL), *it;
		size_t k;
		bool decoding = false;
		json_array_foreach(json_object_get(j, "items"), k, it)
			decoding |= !strncmp(json_string_value(json_object_get(it, "id")) ?: "",
					     "steady-", 7) &&
				    !strcmp(json_string_value(json_object_get(it, "phase")) ?: "",
					    "decode");
		double now = json_number_value(json_object_get(j, "t"));
		n_steps += j != NULL;
		json_decref(j);
		if (decoding && prev >= 0) {
			if (nt == cap) {
				cap = cap ? 2 * cap : 1024;
				double *t2 = realloc(t, cap * sizeof *t);
				if (!t2)
					break;
				t = t2;
			}
			t[nt++] = (now - prev) * 1e3;
		}
		prev = decoding ? now : -1;
	}
	if (f)
		fclose(f);
	*o = (struct bench_gaps){.run_s = run_s, .beside = -1, .count = (long)n_steps};
	long long completed = -1;
	char last[4096] = "";
	if ((f = fopen(logpath, "r"))) {
		while (fgets(line, sizeof line, f)) {
			json_t *j = json_loads(line, 0, NULL);
			const char *ev = json_string_value(json_object_get(j, "event"));
			const char *msg = json_string_value(json_object_get(j, "msg"));
			if (ev && !strcmp(ev, "exit")) {
				completed = bench_number_before(msg, "completed");
				o->beside = bench_number_before(msg, "prepared beside");
			}
			snprintf(last, sizeof last, "%.4000s", line);
			json_decref(j);
		}
		fclose(f);
	}
	unlink(steplog);
	unlink(logpath);
	rmdir(dir);
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && sent == c->l.big &&
		  completed == c->l.steady + c->l.big && nt > 1;
	if (!ok) {
		last[strcspn(last, "\n")] = 0;
		fprintf(stderr, "wick bench prepare: the worker (--prepare-threads %d) did not run "
				"the %d jobs (%d big ones sent, %lld completed, %zu steps; its last "
				"line: %s)\n", preparers, c->l.steady + c->l.big, sent,
			completed, n_steps, last);
		free(t);
		return 1;
	}
	bench_gaps_of(t, nt, o);
	free(t);
	return 0;
}

int bench_prepare(int argc, char **argv)
{
	static const struct option opts[] = {{"queue", required_argument, 0, 'q'},
					     BENCH_LOAD_OPTIONS,
					     {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	struct bench_cfg c = {.l = BENCH_LOAD_DEFAULT, .eos = -1};
	int ch;
	while ((ch = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		if (ch == 'q') {
			c.url = optarg;
		} else if (ch == 'h') {
			usage(stdout);
			return 0;
		} else if (bench_load_flag(&c.l, ch, optarg, "prepare")) {
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1 || !c.url) {
		usage(stderr);
		return 2;
	}
	struct tok *tk;
	int rc = bench_load_model(&c.l, argv[optind], "prepare", 1024, "jobs", &tk);
	if (rc)
		return rc;
	char err[WK_ERRSZ];
	c.eos = tok_eos(tk);
	char *filler = bench_filler(c.l.kb);
	if (!filler) {
		tok_free(tk);
		return 1;
	}
	c.filler = filler;
	/* a big job's preparing, timed here: its prediction's encode */
	int *ids = NULL, nids = 0;
	double te = wk_now();
	rc = tok_encode(tk, filler, strlen(filler), false, &ids, &nids, err, sizeof err);
	te = wk_now() - te;
	free(ids);
	tok_free(tk);
	if (rc != WK_OK) {
		fprintf(stderr, "wick bench prepare: %s\n", err);
		free(filler);
		return 1;
	}
	struct bench_gaps r[2][BENCH_ROUNDS_MAX];
	int rounds = c.l.rounds;
	for (int i = 0; i < rounds; i++)
		for (int m = 0; m < 2; m++)
			if (one_run(&c, m, i, &r[m][i])) {
				free(filler);
				return 1;
			}
	free(filler);
	printf("model            %s (worker backend %s), queue %s\n", c.l.model, c.l.backend,
	       c.url);
	printf("load             %d jobs of %d tokens decoding; %d jobs of %d KB (a prediction "
	       "of %d tokens, encoded here in %.1f ms) arriving every %d steps\n", c.l.steady,
	       c.l.tokens, c.l.big, c.l.kb, nids, te * 1e3, c.l.every);
	printf("gaps between two steps that decode the steady jobs, ms (median of %d rounds):\n",
	       rounds);
	static const char *const names[2] = {"--prepare-threads 0", "--prepare-threads 1"};
	double mx[2];
	bench_gaps_table(names, "steps", "prepared beside", r, rounds, mx);
	printf("longest gap      %.2fx with a preparer (%.2f ms against %.2f)\n", mx[1] / mx[0],
	       mx[1], mx[0]);
	printf("{\"bench\":\"prepare\",\"steady\":%d,\"tokens\":%d,\"big\":%d,\"kb\":%d,"
	       "\"encode_ms\":%.3f,\"longest_ms_inline\":%.3f,\"longest_ms_preparer\":%.3f,"
	       "\"ratio\":%.4f,\"rounds\":%d}\n", c.l.steady, c.l.tokens, c.l.big, c.l.kb,
	       te * 1e3, mx[0], mx[1], mx[1] / mx[0], rounds);
	return 0;
}
