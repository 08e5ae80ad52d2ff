/*
 * queue.h - where jobs come from and where results go: one interface, a driver per URL scheme.
 *
 *   spool:DIR                                  worker/queue_spool.c  (embedded default)
 *   redis[s]://HOST:PORT/STREAM?group=G&dead=D&max_deliveries=N&result_ttl=S
 *                                              worker/queue_redis.c  (hiredis; rediss: TLS)
 *   sqs://HOST[:PORT]/ACCOUNT/QUEUE?region=R&results=RESULTQUEUE&tls=0|1&max_deliveries=N
 *                                              worker/queue_sqs.c    (libcurl, SigV4, JSON protocol)
 *   http(s)://.../job-take/...                 worker/queue_http.c   (RunPod's job API)
 *
 * A queue handle is used by one thread at a time (each thread opens its own). Every function
 * returns WK_OK or a negative WK_E* code and writes a one-line message into err.
 *
 * Delivery guarantees (copied into the README):
 *
 * | driver | delivery                        | lease (heartbeat)                                | reclaim of a dead worker's job                               | dead-letter                                  |
 * |--------|---------------------------------|--------------------------------------------------|--------------------------------------------------------------|----------------------------------------------|
 * | spool  | at-least-once; result file fsync'd (file+dir) before the claim is removed | expiry in the claim's name `claimed/<id>~<attempt>~<pid>~<expiry>`; queue_extend renames it | expiry passed, or the owner pid is gone (same machine); the taker renames the claim to itself | after max_deliveries (default 5): input to `failed/`, FAILED result in `done/` |
 * | redis  | at-least-once; result key SET before XACK | the entry's idle time; queue_extend re-XCLAIMs it (JUSTID) | XAUTOCLAIM of entries idle past the lease; own PEL re-read after a reconnect | after max_deliveries (XPENDING's count): entry XADDed to `STREAM:dead`, FAILED result key, XACK |
 * | sqs    | at-least-once; result sent to the results queue (SendMessageBatch) before DeleteMessageBatch | the message's visibility timeout (= lease); queue_extend calls ChangeMessageVisibilityBatch | SQS itself: the message turns visible again when the lease runs out | the queue's RedrivePolicy (SQS moves it to its DLQ after maxReceiveCount receives); without one, after max_deliveries (ApproximateReceiveCount): FAILED result, message deleted |
 *
 * spool and redis: a redelivered job whose result already exists is acknowledged inside
 * queue_take and never returned, so a crash between "store result" and "acknowledge" costs
 * nothing. Job ids are the idempotency key: one id, at most one stored result (the first one
 * stored wins on redis; on the spool a later complete replaces the file with an equal-status
 * result). sqs cannot look a result up, so a job redelivered after such a crash runs again
 * unless the same worker process completed it (it remembers its ids): with a `.fifo` results
 * queue the second result is dropped by SQS (MessageDeduplicationId = job id, 5-minute window);
 * with a standard one results are at-least-once and consumers key them by id.
 */
#ifndef QUEUE_H
#define QUEUE_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/job.h"

struct queue;

struct queue_opts {
	const char *consumer;  /* this worker's name; NULL: "<hostname>-<pid>" */
	double lease_s;        /* a claim's life without queue_extend; 0: 60 */
	int max_deliveries;    /* deliveries before dead-lettering; 0: 5 (the URL may override) */
	size_t max_body;       /* bytes of one job; 0: JOB_BODY_MAX. Larger jobs fail as invalid_input */
	double reconnect_s;    /* network drivers: how long to keep reconnecting; 0: 60
				* (queue_set_reconnect changes it between calls) */
	/* Optional: while *stop is nonzero, a network driver's retries give up at once (WK_EIO,
	 * "interrupted"), so a signal is not held up by an outage (the worker's got_signal). */
	const atomic_int *stop;
	/* http(s):// (RunPod job API) only; NULL: from RUNPOD_WEBHOOK_POST_OUTPUT,
	 * RUNPOD_WEBHOOK_PING and RUNPOD_WEBHOOK_POST_STREAM (no stream URL: no streaming) */
	const char *done_url, *ping_url, *stream_url;
	/* Optional: told of each input the driver ends by itself on sight instead of returning
	 * it from queue_take (too large, not a regular file, a name or id that is not a job id),
	 * so the caller can log and count it like a job it failed. id is the job's id, or NULL
	 * when the input has no valid one (then no result could be stored); why is one line
	 * naming the input and the reason, its untrusted parts escaped. Called on queue_take's
	 * thread. Not called for dead-letters: those jobs were returned (taken) before. */
	void (*on_refused)(void *ctx, const char *id, const char *why);
	void *on_refused_ctx;
};

#define QUEUE_HANDLE_MAX 1024 /* bytes of a receipt; SQS receipt handles reach 1,024 */

/* One delivered job. The driver owns body until queue_job_free(). */
struct queue_job {
	char id[JOB_ID_MAX + 1];
	char *body;            /* the raw job JSON, NUL-terminated (malloc'd) */
	size_t len;
	int attempt;           /* 1 on the first delivery */
	double enqueued_at;    /* unix seconds when known, else 0 */
	bool cancelled;        /* set by queue_take / queue_check_cancel */
	char handle[QUEUE_HANDLE_MAX + 1]; /* the driver's receipt: claim name, stream entry id,
					 * SQS receipt handle, ... */
};
void queue_job_free(struct queue_job *j); /* frees body; safe twice */

/* Result of one job for queue_complete. */
struct queue_result {
	struct queue_job *job;
	const char *json;      /* the result JSON (job_encode_result) */
	size_t len;
	bool keep_input;       /* also keep the input for inspection (spool: failed/, redis: dead
				* stream); set for jobs that could not be parsed. Redis copies
				* job->body, so free bodies only after queue_complete */
	int rc;                /* out: WK_OK, or this job's own failure */
	bool replaced;         /* out: the queue refused this result and took a FAILED one in
				* its place (RunPod's job-done); the job has ended, rc says so */
	bool superseded;       /* out, with rc WK_OK: the job already had a result (another
				* attempt's: a worker that lost the lease, or a duplicate entry),
				* which stands; this one was dropped (redis, spool; SQS and HTTP
				* queues cannot tell) */
};

struct queue_stats {
	uint64_t taken, completed, redelivered_done, reclaimed, dead_lettered, released;
	uint64_t refused;      /* inputs ended on sight, not returned (see on_refused) */
	uint64_t syncs;        /* fsync/syncfs calls (spool) or round trips that store results (redis) */
	uint64_t reconnects;
};

/* ---- lifecycle ---- */

/* *n = the jobs queued or running (not finished), for a tool that must start from an empty
 * queue (wick bench queue). WK_OK, a driver's error, or WK_EUNSUPPORTED where the driver
 * cannot tell (HTTP). */
int queue_backlog(struct queue *q, long *n, char *err, size_t errsz);

/* Job j, taken through q, was completed through another handle of the same queue (the
 * worker's committer thread stores results on its own): what q keeps of it is updated (SQS:
 * the receipt it held is dropped, and a redelivery of the id is known as done). */
void queue_done_elsewhere(struct queue *q, const struct queue_job *j);

/* How long the next calls keep reconnecting (network drivers; > 0). The worker's main loop
 * takes and extends with a short budget, so an outage never holds up its engine steps for
 * long, and stores results with a long one. */
void queue_set_reconnect(struct queue *q, double seconds);
/* Whether a network driver should stop retrying now (queue_opts.stop, or queue_give_up). */
bool queue_stopping(const struct queue *q);
/* The caller has given up on the queue (the worker after --queue-outage): every retry and
 * every store still in flight on q, from any thread, gives up at its next try (WK_EIO), so
 * that nothing waits out its whole budget (HTTP: a job-done post that failed is not tried
 * again, which a signal alone does not stop). NULL is fine. */
void queue_give_up(struct queue *q);

/* Opens the queue named by url (see the top). Creates what is missing: spool directories
 * (mode 0700), the redis stream and group (XGROUP CREATE ... MKSTREAM from id 0), the SQS
 * job and results queues (CreateQueue). o may be NULL for defaults. */
int queue_open(const char *url, const struct queue_opts *o, struct queue **q, char *err, size_t errsz);
/* Checks url as queue_open would parse it, connecting to nothing: WK_OK, or WK_EINVAL naming
 * what is wrong (the worker checks before its model loads, so a typo is a usage error and not
 * a start-up failure after minutes of restore). */
int queue_check_url(const char *url, char *err, size_t errsz);
void queue_close(struct queue *q); /* NULL is fine; jobs still held stay claimed until reclaim */
const char *queue_driver(const struct queue *q); /* "spool", "redis", "sqs", "http" */

/* ---- the worker's side ---- */

/* Takes up to max jobs into jobs[0..*n), waiting up to wait_s seconds for the first one
 * (0: do not wait). Before new jobs it reclaims the expired leases of dead workers. Jobs past
 * max_deliveries are dead-lettered, and jobs that already have a result are acknowledged;
 * neither is returned. A job over max_body is answered FAILED (invalid_input) and not
 * returned. *n == 0 with WK_OK means nothing came in time. jobs[i].cancelled is set for jobs
 * already cancelled. Network drivers reconnect with backoff for up to reconnect_s before
 * giving up with WK_EIO. */
int queue_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n,
	       char *err, size_t errsz);

/* Stores each result durably, THEN acknowledges its job. Group commit: one call stores n
 * results with a few syncs. Returns WK_OK when every r[i].rc is WK_OK, else the first
 * failure (the others may still have succeeded: see r[i].rc). Does not free the jobs. */
int queue_complete(struct queue *q, struct queue_result *r, int n, char *err, size_t errsz);
/* queue_complete with a reconnect budget of budget_s for this call alone (the handle's own
 * stays): what a second thread that stores on a shared handle uses (the worker's committer
 * on HTTP's), since queue_set_reconnect would change the other thread's calls too. */
int queue_complete_within(struct queue *q, struct queue_result *r, int n, double budget_s,
			  char *err, size_t errsz);

/* Extends the lease of each job by lease_s from now. A job whose lease was lost (reclaimed by
 * another worker) gets WK_ENOTFOUND in rc[i] (rc may be NULL); the call then returns
 * WK_ENOTFOUND. Finishing such a job is still safe: results are idempotent. */
int queue_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc,
		 char *err, size_t errsz);

/* Hands jobs back undone (drain): they are delivered again at once, to any worker. */
int queue_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz);

/* Sets jobs[i].cancelled for each job cancelled through the queue's channel. The marks set
 * stand even when it fails (HTTP: the stop signals came, while the pings fail). */
int queue_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz);

/* Streaming: whether the queue has a channel for a job's text as it is made (Redis: the key
 * STREAM:stream:<id>; the RunPod job API with a stream URL), and text[0..len) handed on to
 * it for job j, after the text before. Never blocks. RunPod: the driver sends in the
 * background, at most one post a job in flight, so text that arrives meanwhile goes out
 * together in the next. Redis: buffered until queue_flush_streams, which the worker calls
 * after each step (one pipeline for all jobs). Best effort: what the channel loses is still
 * in the result, which queue_complete stores only after the job's last piece. len 0 only
 * registers the job. */
bool queue_streams(const struct queue *q);
void queue_stream(struct queue *q, const struct queue_job *j, const char *text, size_t len);
int queue_flush_streams(struct queue *q, char *err, size_t errsz);

/* wait_result that hands on job id's pieces as they come (Redis; WK_EUNSUPPORTED elsewhere):
 * on_piece gets each piece with the attempt that made it (a job run again streams again
 * from its start under the next attempt). */
int queue_wait_stream(struct queue *q, const char *id, double timeout_s,
		      void (*on_piece)(void *ctx, const char *text, size_t len, int attempt),
		      void *ctx, char **json, size_t *len, char *err, size_t errsz);

/* ---- the producer's side (wick submit) ---- */

/* Enqueues a job whose id is id (valid per job_id_valid) and whose JSON is json. Refuses with
 * WK_EINVAL an id that is already queued (spool) or already has a result. */
int queue_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
		 size_t errsz);

/* Waits up to timeout_s for the result of id; on WK_OK *json (malloc'd, caller frees) holds
 * it. WK_ENOTFOUND when none came in time. */
int queue_wait_result(struct queue *q, const char *id, double timeout_s, char **json, size_t *len,
		      char *err, size_t errsz);

/* Asks that job id be cancelled (spool: cancel/<id>; redis: key STREAM:cancel:<id>). */
int queue_cancel(struct queue *q, const char *id, char *err, size_t errsz);

void queue_get_stats(const struct queue *q, struct queue_stats *s);

#endif
