/*
 * queue_impl.h - what a queue driver implements. Only worker/queue*.c include this.
 *
 * A driver is a table of functions plus its own state in q->impl. Every member is required
 * except where marked optional; queue.c answers WK_EUNSUPPORTED for a missing optional one.
 * The arguments are checked by queue.c (counts, ids) before a driver sees them.
 */
#ifndef QUEUE_IMPL_H
#define QUEUE_IMPL_H

#include "worker/queue.h"

struct queue_ops {
	const char *name;
	/* rest: the URL after "scheme:" (spool) or the whole URL (network drivers) */
	int (*open)(struct queue *q, const char *url, char *err, size_t errsz);
	void (*close)(struct queue *q);
	int (*take)(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n,
		    char *err, size_t errsz);
	int (*complete)(struct queue *q, struct queue_result *r, int n, char *err, size_t errsz);
	/* optional: complete with its own budget, for a handle shared between threads; without
	 * it queue_complete_within sets the handle's budget around the call */
	int (*complete_within)(struct queue *q, struct queue_result *r, int n, double budget_s,
			       char *err, size_t errsz);
	int (*extend)(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc,
		      char *err, size_t errsz);
	int (*release)(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz);
	int (*check_cancel)(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz);
	int (*submit)(struct queue *q, const char *id, const char *json, size_t len, char *err,
		      size_t errsz);
	int (*wait_result)(struct queue *q, const char *id, double timeout_s, char **json,
			   size_t *len, char *err, size_t errsz); /* optional */
	int (*cancel)(struct queue *q, const char *id, char *err, size_t errsz); /* optional */
	int (*backlog)(struct queue *q, long *n, char *err, size_t errsz); /* optional */
	void (*done_elsewhere)(struct queue *q, const struct queue_job *j); /* optional */
	/* optional: NULL, or false from streams, where the queue has no stream channel */
	bool (*streams)(const struct queue *q);
	void (*stream)(struct queue *q, const struct queue_job *j, const char *text, size_t len);
	int (*flush_streams)(struct queue *q, char *err, size_t errsz); /* optional */
	int (*wait_stream)(struct queue *q, const char *id, double timeout_s,
			   void (*on_piece)(void *ctx, const char *text, size_t len, int attempt),
			   void *ctx, char **json, size_t *len, char *err, size_t errsz); /* optional */
};

struct queue {
	const struct queue_ops *ops;
	struct queue_opts o;   /* defaults filled in */
	char consumer[128];    /* o.consumer points here */
	struct queue_stats st;
	atomic_int given_up;   /* queue_give_up: queue_stopping from then on */
	void *impl;
};

extern const struct queue_ops queue_spool_ops;
extern const struct queue_ops queue_redis_ops;
extern const struct queue_ops queue_sqs_ops;  /* worker/queue_sqs.c */
extern const struct queue_ops queue_http_ops; /* worker/queue_http.c (RunPod job API) */

/* The last '@' of url before its query (user:password@ a password with a '/' in it
 * included), or NULL: a URL with one is refused before any message echoes it (messages and
 * logs print URLs), naming only what follows the '@' (queue_url_at_end: the query or the
 * end). */
const char *queue_url_at(const char *url);
const char *queue_url_at_end(const char *url);

/* Splits the authority of a network queue URL: *p points just after "scheme://" and slash at
 * the '/' that ends the authority. On WK_OK *p is the host's first byte ([v6] brackets
 * dropped), *hl its length, and *colon the ':' before the port or NULL. */
int queue_split_host(const char *url, const char **p, const char *slash, size_t *hl,
		     const char **colon, char *err, size_t errsz);

/* The parameters of a network queue URL, "?k=v&k2=v2", one at a time: *q points at the '?'
 * or '&' before the next one (NULL or "" at the end). Returns 1 with *p filled and *q moved
 * on, 0 at the end, or WK_EINVAL for a parameter without a value. */
struct queue_param {
	const char *k, *v;    /* not NUL-terminated: kl and vl bytes */
	size_t kl, vl;
	bool isnum;           /* v is a whole decimal number, in num */
	long long num;
};
int queue_next_param(const char *url, const char **q, struct queue_param *p, char *err,
		     size_t errsz);
bool queue_param_is(const struct queue_param *p, const char *name);

/* The FAILED result a driver stores by itself (dead-letter, oversized body). malloc'd. */
char *queue_error_result(const struct queue *q, const char *id, enum job_err e, const char *msg,
			 int attempt, size_t *len);

/* Counts an input the driver refused on sight and tells q->o.on_refused (when set): id is
 * NULL when the input has no valid id. See queue_opts. */
void queue_refused(struct queue *q, const char *id, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Copies s[0..len) into out for a message, pure: printable ASCII as it is, other bytes (and
 * ' and \) as \xHH, cut with "..." to fit outsz. Untrusted names and ids are quoted with it
 * so a log line stays one line. */
void queue_quote(char *out, size_t outsz, const char *s, size_t len);

/* The spool's file names, pure (fuzzed). A claim is "<id>~<attempt>~<pid>~<expiry_ms>"; a
 * queued job is "<id>.json" or "<id>~<n>.json" with n earlier deliveries. id needs
 * JOB_ID_MAX + 1 bytes. False when name is not one. */
bool queue_spool_parse_claim(const char *name, char *id, int *attempt, long *pid,
			     long long *expiry_ms);
bool queue_spool_parse_new(const char *name, char *id, int *prev);

/* redis:// and rediss:// URLs, pure (fuzzed). Defaults: port 6379, group "wick", dead
 * "STREAM:dead", max_deliveries 0 (= the queue_opts value), result_ttl 7 days. */
struct queue_redis_url {
	char host[256];
	int port;
	bool tls; /* rediss:// */
	char stream[101], group[101], dead[112];
	int max_deliveries;
	long long result_ttl; /* seconds; 0 = results never expire */
};
int queue_redis_parse_url(const char *url, struct queue_redis_url *u, char *err, size_t errsz);

/* One stream entry ([entry-id, [field, value, ...]]) as delivered, pure (fuzzed). body and
 * raw_id point into the reply, and are kept whenever the fields exist, also for BAD and
 * BAD_ID entries (for the dead-letter record). BAD: not an entry, or no id or job field;
 * BAD_ID: both fields, but the id is not a job id ([A-Za-z0-9._-]{1,JOB_ID_MAX}). */
enum { QUEUE_REDIS_ENTRY_OK, QUEUE_REDIS_ENTRY_BAD, QUEUE_REDIS_ENTRY_GONE, QUEUE_REDIS_ENTRY_TOO_BIG,
       QUEUE_REDIS_ENTRY_BAD_ID };
struct queue_redis_entry {
	char entry[48];        /* the stream entry id, "" when unreadable */
	char id[JOB_ID_MAX + 1]; /* "" unless valid */
	const char *raw_id;    /* the id field as sent; NULL when absent */
	size_t raw_id_len;
	const char *body;
	size_t len;
	double enqueued_at;    /* from the entry id's milliseconds */
};
struct redisReply;
int queue_redis_decode_entry(const struct redisReply *e, size_t max_body, struct queue_redis_entry *out);

/* sqs:// URLs, pure (fuzzed). sqs://HOST[:PORT]/ACCOUNT/QUEUE?region=R&results=Q&tls=0|1&
 * max_deliveries=N. Defaults: tls 1, the scheme's port, region from a sqs.R.amazonaws.com
 * host else us-east-1, results "<QUEUE>-results" (".fifo" kept last), max_deliveries 0 (= the
 * queue_opts value). Queue names match [A-Za-z0-9_-]{1,80} with an optional ".fifo" inside
 * the 80; the results queue must differ from the job queue. */
struct queue_sqs_url {
	char host[256];
	int port;             /* 0: 443 with tls, else 80 */
	bool tls;
	char account[65], queue[81], results[81], region[33];
	int max_deliveries;
};
int queue_sqs_parse_url(const char *url, struct queue_sqs_url *u, char *err, size_t errsz);

/* An http(s) URL the RunPod driver is given (what_ names it in the message): http(s), at most
 * its length limit, no spaces or control characters. WK_OK or WK_EINVAL. */
int queue_http_check_url(const char *what_, const char *u, char *err, size_t errsz);

/* One message of a ReceiveMessage response (SQS JSON protocol), pure (fuzzed). The id is the
 * String message attribute "id", else the body's "id", else the MessageId with characters
 * outside [A-Za-z0-9._-] replaced by '_': always a valid job id. Messages without a usable
 * ReceiptHandle (missing, empty, longer than QUEUE_HANDLE_MAX) cannot be acknowledged and are
 * left out; they come back after their visibility timeout. */
enum { QUEUE_SQS_MSG_OK, QUEUE_SQS_MSG_BAD, QUEUE_SQS_MSG_TOO_BIG };
#define QUEUE_SQS_RECEIVE_MAX 10 /* messages in one ReceiveMessage (SQS's own limit) */
struct queue_sqs_msg {
	int kind;             /* QUEUE_SQS_MSG_*: BAD = no string Body */
	char id[JOB_ID_MAX + 1];
	char receipt[QUEUE_HANDLE_MAX + 1];
	char *body;           /* malloc'd, NUL-terminated; NULL unless kind is OK */
	size_t len;           /* bytes of the body (also when TOO_BIG) */
	int attempt;          /* ApproximateReceiveCount; 1 when absent or unreadable */
	double sent_at;       /* SentTimestamp in unix seconds; 0 when absent */
};
/* Decodes resp[0..len) into *msgs (malloc'd; NULL when *n == 0; free with queue_sqs_msgs_free).
 * Bodies over max_body are TOO_BIG. Returns WK_OK, WK_EFORMAT (not a JSON object, or
 * "Messages" not an array) or WK_ENOMEM, with *n == 0 on failure. */
int queue_sqs_decode_receive(const char *resp, size_t len, size_t max_body,
			     struct queue_sqs_msg **msgs, int *n, char *err, size_t errsz);
void queue_sqs_msgs_free(struct queue_sqs_msg *m, int n);

/* RunPod job-take bodies (http(s):// queues), pure (fuzzed). A body is one job {"id", "input",
 * ...} (job-take) or a list of them (job-take-batch); empty, whitespace or null means no job.
 * An OK job becomes wick's job JSON: {"id": ID, "input": INPUT}, plus INPUT's "tenant" and
 * "timeout_s" when it has them; an INPUT that itself holds an "input" object is a whole wick
 * job, used as it is with its "id" set to ID. The others are answered FAILED (invalid_input)
 * by the driver under their id (BAD_*), or cannot be answered at all (NO_ID). */
enum { QUEUE_HTTP_JOB_OK, QUEUE_HTTP_JOB_NO_ID, QUEUE_HTTP_JOB_BAD_ID, QUEUE_HTTP_JOB_BAD_INPUT,
       QUEUE_HTTP_JOB_TOO_BIG };
#define QUEUE_HTTP_RAW_ID_MAX 512 /* bytes of an id kept to answer it; longer ones are NO_ID */
#define QUEUE_HTTP_TAKE_MAX 4096  /* jobs in one body */
struct queue_http_job {
	int kind;             /* QUEUE_HTTP_JOB_* */
	char id[QUEUE_HTTP_RAW_ID_MAX + 1]; /* as sent (valid per job_id_valid only when OK); "" for NO_ID */
	char *body;           /* OK: wick's job JSON, malloc'd, NUL-terminated; else NULL */
	size_t len;
	char why[200];        /* not OK: what is wrong, one line */
};
/* Decodes body[0..len) into *jobs (malloc'd; NULL when *n == 0; free with queue_http_jobs_free).
 * Returns WK_OK, WK_EFORMAT (not JSON, or neither a job object nor a list), WK_ELIMIT (more
 * than QUEUE_HTTP_TAKE_MAX jobs) or WK_ENOMEM, with *n == 0 on failure. */
int queue_http_decode_take(const char *body, size_t len, size_t max_body,
			   struct queue_http_job **jobs, int *n, char *err, size_t errsz);
void queue_http_jobs_free(struct queue_http_job *jobs, int n);

/* A RunPod URL from a template, pure: "$RUNPOD_POD_ID" becomes worker and "$ID" becomes job
 * (worker when job is NULL), both percent-escaped; then query ("k=v&k2=v2", NULL for none) is
 * appended after '?' or '&'. malloc'd; NULL when out of memory. */
char *queue_http_url(const char *tmpl, const char *worker, const char *job, const char *query);

#endif
