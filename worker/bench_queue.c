/*
 * bench_queue.c - `wick bench queue MODEL`: what continuous batching buys. It times eight
 * equal requests run together at concurrency 8 against one of them alone, on the same engine,
 * through the scheduler the worker uses; the ratio is the cost of sharing the steps.
 * (The queue drivers' jobs/s with a null engine join this command with the worker.)
 */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/queue.h"
#include "worker/sched.h"

extern char **environ;

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench queue MODEL [-n TOKENS] [--jobs N] [options]\n"
		   "       wick bench queue MODEL --queue URL [--jobs N] [--concurrency C] [-n TOKENS]\n"
		   "                        [--stream] [--step-ms MS]\n\n"
		   "Times N equal requests (default 8) of TOKENS generated tokens (default 64) at\n"
		   "concurrency N against one request alone, through the worker's scheduler.\n"
		   "Target: N together take less than 2x one alone.\n\n"
		   "With --queue: submits N jobs (default 2000) of TOKENS tokens (default 1) to URL,\n"
		   "then runs a real `wick worker --backend null` child on it (the engine answers at\n"
		   "once, results are stored durably as in production) and reports jobs/s from ready\n"
		   "to exit, with the queue's syncs per job. Target: >= 2,000 jobs/s.\n"
		   "--stream: the same again with jobs that stream their text (redis://: a pipeline\n"
		   "after each step), beside the first run: the streaming's cost on the queue side.\n"
		   "--step-ms MS: each of the null engine's steps takes MS milliseconds, as a GPU's\n"
		   "decode step keeps the worker's thread waiting (what the queue's round trips on\n"
		   "that thread cost shows then).\n"
		   CMD_ENGINE_HELP);
}

long long bench_number_before(const char *msg, const char *word)
{
	const char *p = msg ? strstr(msg, word) : NULL;
	if (!p)
		return -1;
	while (p > msg && p[-1] == ' ')
		p--;
	const char *b = p;
	while (b > msg && b[-1] >= '0' && b[-1] <= '9')
		b--;
	return b < p ? atoll(b) : -1;
}

/* Submits `jobs` jobs of `tokens` tokens (streaming ones with stream), then times a `wick
 * worker --backend null` child draining them: its jobs/s into *rate. */
static int queue_run(const char *model, const char *url, int jobs, int conc, int tokens,
		     bool stream, double *rate)
{
	char err[WK_ERRSZ];
	struct queue *q;
	if (queue_open(url, NULL, &q, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench queue: %s\n", err);
		return 1;
	}
	/* the worker it starts runs every job in the queue on the null engine: never a queue
	 * that holds someone's jobs */
	long backlog = 0;
	if (queue_backlog(q, &backlog, err, sizeof err) != WK_OK || backlog > 0) {
		if (backlog > 0)
			fprintf(stderr, "wick bench queue: %s holds %ld job(s) queued or running; the "
					"benchmark's worker would run them on the null engine: give it an "
					"empty queue\n", url, backlog);
		else
			fprintf(stderr, "wick bench queue: %s (the benchmark needs a spool, redis or sqs queue "
					"it can see is empty)\n", err);
		queue_close(q);
		return 1;
	}
	double t0 = wk_now();
	for (int i = 0; i < jobs; i++) {
		char id[64], body[256];
		snprintf(id, sizeof id, "bench-%d-%s%d", (int)getpid(), stream ? "s" : "", i);
		int len = snprintf(body, sizeof body, "{\"id\": \"%s\", \"input\": {\"prompt\": "
				   "\"Once upon a time\", \"max_tokens\": %d%s}}", id, tokens,
				   stream ? ", \"stream\": true" : "");
		if (queue_submit(q, id, body, (size_t)len, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench queue: submit: %s\n", err);
			queue_close(q);
			return 1;
		}
	}
	double t_submit = wk_now() - t0;
	queue_close(q);

	char njobs[32], nconc[32];
	snprintf(njobs, sizeof njobs, "%d", jobs);
	snprintf(nconc, sizeof nconc, "%d", conc);
	char *args[] = {"wick", "worker", "--model", (char *)model, "--queue", (char *)url,
			"--backend", "null", "--max-jobs", njobs, "--concurrency", nconc,
			"--idle-timeout", "5", "--log-format", "json", NULL};
	int pfd[2];
	if (pipe(pfd) != 0)
		return 1;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
	posix_spawn_file_actions_addclose(&fa, pfd[0]);
	pid_t pid;
	double t1 = wk_now();
	int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	if (rc != 0) {
		close(pfd[0]);
		return 1;
	}
	/* Read the child's JSON log lines: the "ready" line's time marks the start. */
	FILE *f = fdopen(pfd[0], "r");
	char line[4096], last[4096] = "";
	double t_ready = 0;
	long long syncs = -1, completed = -1;
	while (f && fgets(line, sizeof line, f)) {
		snprintf(last, sizeof last, "%s", line);
		json_t *j = json_loads(line, 0, NULL);
		const char *ev = json_string_value(json_object_get(j, "event"));
		if (ev && !strcmp(ev, "ready"))
			t_ready = wk_now();
		if (ev && !strcmp(ev, "exit")) {
			const char *msg = json_string_value(json_object_get(j, "msg"));
			completed = bench_number_before(msg, "completed");
			syncs = bench_number_before(msg, "syncs");
		}
		json_decref(j);
	}
	if (f)
		fclose(f);
	int st;
	waitpid(pid, &st, 0);
	double t_end = wk_now();
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || t_ready == 0 || completed != jobs) {
		last[strcspn(last, "\n")] = 0;
		fprintf(stderr, "wick bench queue: the worker did not finish the %d jobs (completed "
				"%lld; %s %d%s; its last line: %s)\n", jobs, completed,
			WIFEXITED(st) ? "exit status" : "signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), t_ready ? "" : ", never ready",
			last);
		return 1;
	}
	double run = t_end - t_ready;
	*rate = jobs / run;
	printf("queue            %s%s\n", url, stream ? " (jobs that stream)" : "");
	printf("submit           %d jobs in %.3f s (%.0f jobs/s)\n", jobs, t_submit, jobs / t_submit);
	printf("worker (null)    %d jobs of %d tokens in %.3f s from ready to exit: %.0f jobs/s "
	       "(target >= 2000), %.3f syncs per job, start-up %.1f ms\n", jobs, tokens, run,
	       jobs / run, syncs >= 0 ? (double)syncs / jobs : -1.0, (t_ready - t1) * 1e3);
	printf("{\"bench\":\"queue\",\"mode\":\"throughput\",\"queue\":\"%s\",\"jobs\":%d,"
	       "\"tokens\":%d,\"stream\":%s,\"worker_s\":%.6f,\"jobs_per_s\":%.1f,"
	       "\"syncs_per_job\":%.4f,\"submit_per_s\":%.1f}\n", url, jobs, tokens,
	       stream ? "true" : "false", run, jobs / run,
	       syncs >= 0 ? (double)syncs / jobs : -1.0, jobs / t_submit);
	const char *ms = getenv("WICK_NULL_STEP_MS");
	if (ms && atof(ms) > 0) { /* each job's tokens take a step each, conc jobs a step */
		double bound = (conc < jobs ? conc : jobs) / (tokens * atof(ms) / 1e3);
		printf("steps' bound     %.0f jobs/s at %s ms a step (%d at once): the worker ran "
		       "at %.2fx of it\n", bound, ms, conc < jobs ? conc : jobs, jobs / run / bound);
	}
	return 0;
}

/* The throughput, and with stream the same with streaming jobs after it, and their ratio. */
static int queue_throughput(const char *model, const char *url, int jobs, int conc, int tokens,
			    bool stream)
{
	double plain = 0, streamed = 0;
	if (stream) { /* before the first run: it would run on a queue the second refuses */
		char err[WK_ERRSZ];
		struct queue *q;
		if (queue_open(url, NULL, &q, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench queue: %s\n", err);
			return 1;
		}
		bool ok = queue_streams(q);
		if (!ok)
			fprintf(stderr, "wick bench queue: --stream: a %s queue has no stream channel "
					"(redis:// has)\n", queue_driver(q));
		queue_close(q);
		if (!ok)
			return 1;
	}
	if (queue_run(model, url, jobs, conc, tokens, false, &plain))
		return 1;
	if (!stream)
		return 0;
	if (queue_run(model, url, jobs, conc, tokens, true, &streamed))
		return 1;
	printf("streaming        %.0f jobs/s against %.0f without: %.2fx\n", streamed, plain,
	       streamed / plain);
	return 0;
}

static void on_done(void *ctx, struct sched_req *r)
{
	(*(int *)ctx)++;
	sched_req_free(r);
}

static double median3(const double v[3])
{
	double a = v[0], b = v[1], c = v[2];
	return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
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
					     {"queue", required_argument, 0, 'q'},
					     {"concurrency", required_argument, 0, 'c'},
					     {"stream", no_argument, 0, 's'},
					     {"step-ms", required_argument, 0, 'm'},
					     {"help", no_argument, 0, 'h'}, CMD_ENGINE_OPTIONS,
					     {0, 0, 0, 0}};
	int tokens = -1, jobs = -1, conc = 64, step_ms = -1, c;
	bool stream = false;
	const char *url = NULL;
	struct cmd_engine ce = {.o = {.backend = "cpu"}};
	while ((c = getopt_long(argc, argv, "n:j:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
		case 'j':
		case 'c':
		case 'm': {
			char *end;
			long v = strtol(optarg, &end, 10);
			long lo = c == 'm' ? 0 : 1;
			long hi = c == 'n' ? 100000 : c == 'j' ? 1000000 : c == 'm' ? 10000 : 1024;
			if (end == optarg || *end || v < lo || v > hi) {
				fprintf(stderr, "wick bench queue: %s wants a number from %ld to %ld, not "
						"'%s'\n", c == 'n' ? "-n" : c == 'j' ? "--jobs" :
						c == 'm' ? "--step-ms" : "--concurrency", lo, hi, optarg);
				return 2;
			}
			*(c == 'n' ? &tokens : c == 'j' ? &jobs : c == 'm' ? &step_ms : &conc) = (int)v;
			break;
		}
		case 'q': url = optarg; break;
		case 's': stream = true; break;
		case 'h': usage(stdout); return 0;
		default:
			if (c < CMD_OPT_BASE || cmd_engine_flag(&ce, c, optarg)) {
				usage(stderr);
				return 2;
			}
		}
	}
	if (jobs < 0)
		jobs = url ? 2000 : 8;
	if (tokens < 0)
		tokens = url ? 1 : 64;
	if ((stream || step_ms >= 0) && !url) {
		fprintf(stderr, "wick bench queue: %s goes with --queue URL\n",
			stream ? "--stream" : "--step-ms");
		return 2;
	}
	if (step_ms >= 0) { /* (read by the null backend of the worker it starts) */
		char v[16];
		snprintf(v, sizeof v, "%d", step_ms);
		setenv("WICK_NULL_STEP_MS", v, 1);
	}
	if (!url && jobs > 4096) {
		fprintf(stderr, "wick bench queue: --jobs %d: at most 4096 without --queue (they "
				"share one engine)\n", jobs);
		return 2;
	}
	if (cmd_engine_model(&ce, argc, argv, optind, 0)) {
		usage(stderr);
		return 2;
	}
	if (url)
		return queue_throughput(ce.model, url, jobs, conc, tokens, stream);
	ce.o.max_seqs = jobs;
	ce.o.max_seq = tokens + 4;
	struct engine *e;
	if (cmd_engine_open(&ce, &e))
		return 1;
	/* one alone and all together in turn, ROUNDS times after a warm-up: medians, and the
	 * median of each round's ratio, so that a noisy moment on a shared machine weighs
	 * little */
	enum { ROUNDS = 3 };
	long s1 = 0, sn = 0;
	double one[ROUNDS], all[ROUNDS], ratio[ROUNDS];
	bool ok = run(e, 1, tokens, &s1) > 0;
	for (int i = 0; ok && i < ROUNDS; i++) {
		one[i] = run(e, 1, tokens, &s1);
		all[i] = run(e, jobs, tokens, &sn);
		ok = one[i] > 0 && all[i] > 0;
		if (ok)
			ratio[i] = all[i] / one[i];
	}
	eng_close(e);
	if (!ok) {
		fprintf(stderr, "wick bench queue: a run failed\n");
		return 1;
	}
	double m1 = median3(one), mn = median3(all), mr = median3(ratio);
	printf("model            %s (%s backend)\n", ce.model, ce.o.backend);
	printf("one request      %.3f s (%ld steps, %d tokens; median of %d)\n", m1, s1, tokens,
	       ROUNDS);
	printf("%d requests       %.3f s (%ld steps, %d tokens each, concurrency %d)\n", jobs, mn,
	       sn, tokens, jobs);
	printf("ratio            %.2fx the time of one, for %dx the tokens (target < 2x; rounds "
	       "%.2f %.2f %.2f)\n", mr, jobs, ratio[0], ratio[1], ratio[2]);
	printf("{\"bench\":\"queue\",\"mode\":\"batching\",\"jobs\":%d,\"tokens\":%d,\"one_s\":%.6f,"
	       "\"all_s\":%.6f,\"ratio\":%.4f,\"steps_one\":%ld,\"steps_all\":%ld,\"rounds\":%d}\n",
	       jobs, tokens, m1, mn, mr, s1, sn, ROUNDS);
	return 0;
}
