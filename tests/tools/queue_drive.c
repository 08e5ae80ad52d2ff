/*
 * queue_drive - drives the queue API directly, without the worker loop.
 *
 *   queue_drive submit ARGS...            runs `wick submit ARGS...` (cmd_submit)
 *   queue_drive bench URL N [BATCH]       N null jobs through submit -> take -> complete:
 *                                         all are submitted, then taken and completed BATCH
 *                                         at a time (default 64); each side is timed
 *   queue_drive drain URL [WAIT_S]        takes and completes COMPLETED null results until
 *                                         nothing comes for WAIT_S (default 1) seconds
 *
 * bench prints one JSON line: jobs/s end to end, submit rate, take+complete rate, and the
 * syncs (fsync/syncfs, or result round trips on redis) per job on each side.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/job.h"
#include "worker/queue.h"

int cmd_submit(int argc, char **argv); /* worker/cmd_submit.c */

struct producer {
	const char *url;
	int n;
	double seconds;
	int rc;
	struct queue_stats st;
	char run[32];
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	char err[WK_ERRSZ];
	struct queue *q;
	struct queue_opts o = {.consumer = "producer"};
	if (queue_open(p->url, &o, &q, err, sizeof err) != WK_OK) {
		fprintf(stderr, "queue_drive: %s\n", err);
		p->rc = 1;
		return NULL;
	}
	double t0 = wk_now();
	for (int i = 0; i < p->n; i++) {
		char id[64], body[160];
		snprintf(id, sizeof id, "b%s-%d", p->run, i);
		int len = snprintf(body, sizeof body, "{\"id\":\"%s\",\"input\":{\"prompt\":\"x\",\"max_tokens\":1}}", id);
		if (queue_submit(q, id, body, (size_t)len, err, sizeof err) != WK_OK) {
			fprintf(stderr, "queue_drive: %s\n", err);
			p->rc = 1;
			break;
		}
	}
	p->seconds = wk_now() - t0;
	queue_get_stats(q, &p->st);
	queue_close(q);
	return NULL;
}

/* Takes and completes null jobs until `want` are done (want < 0: until idle for wait_s). */
static int consume(const char *url, int want, int batch, double wait_s, double *busy_s,
		   struct queue_stats *st)
{
	char err[WK_ERRSZ];
	struct queue *q;
	struct queue_opts o = {.consumer = "drive"};
	if (queue_open(url, &o, &q, err, sizeof err) != WK_OK) {
		fprintf(stderr, "queue_drive: %s\n", err);
		return -1;
	}
	struct queue_job *j = calloc((size_t)batch, sizeof *j);
	struct queue_result *r = calloc((size_t)batch, sizeof *r);
	char **res = calloc((size_t)batch, sizeof *res);
	int done = 0;
	double busy = 0;
	while (want < 0 || done < want) {
		int n;
		if (queue_take(q, j, batch, wait_s, &n, err, sizeof err) != WK_OK) {
			fprintf(stderr, "queue_drive: %s\n", err);
			done = -1;
			break;
		}
		if (n == 0) {
			if (want < 0)
				break;
			continue;
		}
		double t = wk_now();
		for (int i = 0; i < n; i++) {
			struct job jb;
			char msg[WK_ERRSZ];
			enum job_err e = job_decode(j[i].body, j[i].len, j[i].id, &jb, msg, sizeof msg);
			job_free(&jb);
			struct job_result jr = {.id = j[i].id, .status = e == JOB_OK ? JOB_COMPLETED : JOB_FAILED,
						.err = e, .message = msg, .text = "", .finish_reason = "length",
						.worker = "drive", .attempt = j[i].attempt};
			res[i] = job_encode_result(&jr, &r[i].len);
			r[i].job = &j[i];
			r[i].json = res[i];
			r[i].keep_input = e == JOB_EINVALID_JSON;
		}
		if (queue_complete(q, r, n, err, sizeof err) != WK_OK)
			fprintf(stderr, "queue_drive: %s\n", err);
		busy += wk_now() - t;
		for (int i = 0; i < n; i++) {
			free(res[i]);
			queue_job_free(&j[i]);
		}
		done += n;
	}
	if (busy_s)
		*busy_s = busy;
	if (st)
		queue_get_stats(q, st);
	free(j);
	free(r);
	free(res);
	queue_close(q);
	return done;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "submit"))
		return cmd_submit(argc - 1, argv + 1);
	if (argc >= 3 && !strcmp(argv[1], "drain")) {
		int n = consume(argv[2], -1, 64, argc > 3 ? atof(argv[3]) : 1.0, NULL, NULL);
		if (n < 0)
			return 1;
		printf("%d\n", n);
		return 0;
	}
	if (argc >= 4 && !strcmp(argv[1], "bench")) {
		struct producer p = {.url = argv[2], .n = atoi(argv[3])};
		int batch = argc > 4 ? atoi(argv[4]) : 64;
		if (p.n <= 0 || batch <= 0 || batch > 4096) {
			fprintf(stderr, "queue_drive: bench URL N [BATCH]\n");
			return 2;
		}
		snprintf(p.run, sizeof p.run, "%lx", (unsigned long)(wk_now() * 1000));
		/* the producer first, then the worker: each side's rate on its own */
		double t0 = wk_now(), busy = 0;
		produce(&p);
		double t1 = wk_now();
		struct queue_stats st = {0};
		int done = consume(p.url, p.n, batch, 1.0, &busy, &st);
		double wall = wk_now() - t0, take_s = wk_now() - t1;
		if (done != p.n || p.rc) {
			fprintf(stderr, "queue_drive: %d of %d jobs done\n", done, p.n);
			return 1;
		}
		printf("{\"driver\": \"%.*s\", \"jobs\": %d, \"batch\": %d, \"wall_s\": %.3f, "
		       "\"jobs_per_s\": %.0f, \"submit_per_s\": %.0f, \"take_complete_per_s\": %.0f, "
		       "\"complete_per_s\": %.0f, \"worker_syncs_per_job\": %.3f, \"submit_syncs_per_job\": %.3f}\n",
		       (int)strcspn(p.url, ":"), p.url, p.n, batch, wall, p.n / wall, p.n / p.seconds,
		       p.n / take_s, busy > 0 ? p.n / busy : 0.0, (double)st.syncs / p.n,
		       (double)p.st.syncs / p.n);
		return 0;
	}
	fprintf(stderr, "usage: queue_drive submit ARGS... | bench URL N [BATCH] | drain URL [WAIT_S]\n");
	return 2;
}
