/*
 * queue_sqs.c - sqs://HOST[:PORT]/ACCOUNT/QUEUE?region=R&results=RESULTS&tls=0|1&max_deliveries=N
 *
 * Amazon SQS over libcurl, signed with AWS SigV4 (CURLOPT_AWS_SIGV4 "aws:amz:REGION:sqs"),
 * speaking SQS's JSON protocol: every action is a POST to the endpoint root with
 * `X-Amz-Target: AmazonSQS.<Action>`, `Content-Type: application/x-amz-json-1.0` and a JSON
 * body (jansson). One CURL handle per queue handle, so the connection is kept alive.
 *
 * Queues, for QUEUE = jobs:
 *   jobs            the job queue; a message's body is the job JSON and its String message
 *                   attribute `id` the job id (set by `wick submit`)
 *   jobs-results    the results queue (`results=`): one message per result, the result JSON as
 *                   the body, message attributes `id` and `status`. A name ending in `.fifo`
 *                   makes it a FIFO queue: MessageGroupId = MessageDeduplicationId = job id,
 *                   so SQS drops a second result for an id sent within its 5-minute window
 * Both are created when missing (GetQueueUrl, then CreateQueue), by workers and by submit.
 *
 * Credentials come from the chain of worker/aws_creds.h: the environment (AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), else the role of an EKS service account (web
 * identity), an ECS task or EKS Pod Identity (the container endpoint) or an EC2 instance
 * (IMDSv2). A session token goes as X-Amz-Security-Token. Temporary credentials are fetched
 * again 5 minutes before they expire (before the next request), and at once when SQS answers
 * ExpiredToken (that request is then sent again, once); a failed refresh keeps the old ones
 * while they last. They never appear in messages: any AWS error text is scrubbed of them
 * before it is written to err.
 *
 * Take: ReceiveMessage with long polling (WaitTimeSeconds = the wait, at most 20, rounded up
 * when that overshoots it by at most OVERSHOOT_MAX_S, else down and the rest slept: SQS waits
 * whole seconds, and an idle worker must exit on time), VisibilityTimeout = the lease, up to 10
 * messages a call, again while slots are free and messages keep coming. attempt = ApproximateReceiveCount. Empty
 * non-waiting polls are spaced by EMPTY_POLL_GAP_S: a busy worker asks SQS (which bills per
 * request) a few times a second, not once per decode step.
 * Complete: SendMessageBatch of the results, THEN DeleteMessageBatch of the jobs whose
 * results SQS accepted. Extend: ChangeMessageVisibilityBatch to the lease. Release:
 * ChangeMessageVisibilityBatch to 0, so any worker receives the job at once.
 *
 * Dead letters: when the job queue has a RedrivePolicy, SQS itself moves a message to its
 * dead-letter queue after maxReceiveCount receives; the driver never runs a delivery past
 * that count (it answers FAILED and deletes it, should SQS ever hand one out). Without a
 * policy the driver dead-letters by itself after max_deliveries receives: a FAILED result
 * (code internal) in the results queue, and the message deleted.
 *
 * Idempotency: SQS cannot look a result up by id, so the driver remembers the ids this
 * process completed (the last 2 x DONE_GEN) and deletes a redelivery of one of them without
 * returning it. A job redelivered to ANOTHER worker after a crash between "send result" and
 * "delete" runs again: with a .fifo results queue SQS drops the duplicate result (within 5
 * minutes); with a standard results queue results are at-least-once and the job id is the
 * consumer's key. SQS has no cancel channel: check_cancel finds nothing, cancel is refused.
 *
 * Failures: a network error, an HTTP 5xx or a throttling error is retried on the same handle
 * with backoff (50 ms doubling to 2 s) for up to reconnect_s (3 s when opening); each recovery
 * from a network error counts in stats.reconnects. A queue that vanished (SQS restarted empty,
 * or the queue was deleted) is created again and the action retried once, as redis re-creates
 * a lost group; the new queue has no RedrivePolicy until someone sets one. Other HTTP errors
 * fail at once with the action, the AWS error type and its message. Retried sends may
 * duplicate a message (at-least-once, as above). A result SQS refuses (larger than the queue's
 * maximum message size, most likely) is replaced by a FAILED result saying so.
 *
 * Not done: results larger than an SQS message (1 MiB; 256 KiB on older queues) are not
 * offloaded to S3 as the SQS Extended Client does; the job ends FAILED instead.
 */
#include "worker/queue_impl.h"

#include "worker/aws_creds.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/wk.h"

#define QNAME_MAX 80            /* SQS queue names, ".fifo" included */
#define IO_TIMEOUT_S 20         /* a reply slower than this (beyond a long poll) is a dead peer */
#define OPEN_RETRY_S 3.0        /* a wrong endpoint fails fast at open */
#define RESP_MAX (64u << 20)    /* bytes of one response: 10 messages of up to 1 MiB, escaped */
#define RESULT_MAX (16u << 20)  /* bytes of one result message read by wait_result */
#define BATCH_MAX 10            /* entries in one *Batch call (SQS's limit) */
#define BATCH_BYTES (256u << 10) /* payload of one SendMessageBatch (SQS's classic limit) */
#define VIS_MAX 43200           /* SQS's longest visibility timeout, 12 hours */
#define EMPTY_POLL_GAP_S 0.25   /* between two non-waiting polls that found nothing */
#define OVERSHOOT_MAX_S 0.55    /* a long poll may outlast the caller's wait by this much */
#define WAIT_VIS_S 10           /* wait_result: others' results stay hidden while we scan */
#define DONE_GEN 32768          /* completed ids per generation; two generations kept */

/* ---- URL: pure ---- */

static bool qname_ok(const char *s, size_t n)
{
	if (n == 0 || n > QNAME_MAX)
		return false;
	size_t base = n > 5 && !memcmp(s + n - 5, ".fifo", 5) ? n - 5 : n;
	for (size_t i = 0; i < base; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-'))
			return false;
	}
	return true;
}

static bool is_fifo(const char *name)
{
	size_t n = strlen(name);
	return n > 5 && !strcmp(name + n - 5, ".fifo");
}

static bool chars_ok(const char *s, size_t n, size_t max, const char *extra)
{
	if (n == 0 || n > max)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c && strchr(extra, c))))
			return false;
	}
	return true;
}

static const char UPPER[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

int queue_sqs_parse_url(const char *url, struct queue_sqs_url *u, char *err, size_t errsz)
{
	memset(u, 0, sizeof *u);
	u->tls = true;
	if (strncmp(url, "sqs://", 6))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: not an sqs:// URL", url);
	const char *p = url + 6, *slash = strchr(p, '/');
	if (!slash)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: no account and queue (sqs://HOST[:PORT]/ACCOUNT/QUEUE)",
			       url);
	const char *colon;
	size_t hl;
	int hrc = queue_split_host(url, &p, slash, &hl, &colon, err, errsz);
	if (hrc != WK_OK)
		return hrc;
	bool host_ok = hl > 0 && hl < sizeof u->host;
	for (size_t i = 0; host_ok && i < hl; i++) /* no user@, no spaces, nothing curl would misread */
		host_ok = (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') ||
			  (p[i] >= '0' && p[i] <= '9') || strchr(".-_:%", p[i]);
	if (!host_ok)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad host (credentials come from the environment, never the URL)",
			       url);
	memcpy(u->host, p, hl);
	if (colon) {
		char *end;
		long port = strtol(colon + 1, &end, 10);
		if (end != slash || colon + 1 == end || port < 1 || port > 65535)
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad port", url);
		u->port = (int)port;
	}
	const char *a = slash + 1, *q = strchr(a, '?');
	const char *pend = q ? q : a + strlen(a), *s2 = memchr(a, '/', (size_t)(pend - a));
	if (!s2)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: want sqs://HOST[:PORT]/ACCOUNT/QUEUE", url);
	size_t al = (size_t)(s2 - a);
	char acc_extra[64];
	snprintf(acc_extra, sizeof acc_extra, "%s_-", UPPER);
	if (!chars_ok(a, al, sizeof u->account - 1, acc_extra))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: the account must match [A-Za-z0-9_-]{1,64} "
			       "(the 12-digit AWS account id)", url);
	memcpy(u->account, a, al);
	const char *qn = s2 + 1;
	size_t ql = (size_t)(pend - qn);
	if (!qname_ok(qn, ql))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: the queue name must match [A-Za-z0-9_-]{1,80} "
			       "(\".fifo\" at the end for a FIFO queue, within the 80)", url);
	memcpy(u->queue, qn, ql);
	bool have_region = false, have_results = false;
	struct queue_param pr;
	int more;
	while ((more = queue_next_param(url, &q, &pr, err, errsz)) > 0) {
		if (queue_param_is(&pr, "region")) {
			if (!chars_ok(pr.v, pr.vl, sizeof u->region - 1, "-"))
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: the region must match [a-z0-9-]{1,32}", url);
			memset(u->region, 0, sizeof u->region);
			memcpy(u->region, pr.v, pr.vl);
			have_region = true;
		} else if (queue_param_is(&pr, "results")) {
			if (!qname_ok(pr.v, pr.vl))
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: the results queue name must match "
					       "[A-Za-z0-9_-]{1,80} (optionally ending in .fifo)", url);
			memset(u->results, 0, sizeof u->results);
			memcpy(u->results, pr.v, pr.vl);
			have_results = true;
		} else if (queue_param_is(&pr, "tls")) {
			if (!pr.isnum || (pr.num != 0 && pr.num != 1))
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: tls is 0 (http) or 1 (https)", url);
			u->tls = pr.num == 1;
		} else if (queue_param_is(&pr, "max_deliveries")) {
			if (!pr.isnum || pr.num < 1 || pr.num > 1000)
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: max_deliveries must be 1 to 1000", url);
			u->max_deliveries = (int)pr.num;
		} else {
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: unknown parameter '%.*s' (want region, "
				       "results, tls, max_deliveries)", url, (int)pr.kl, pr.k);
		}
	}
	if (more < 0)
		return more;
	if (!have_region) {
		/* sqs.<region>.amazonaws.com[.cn] names its region */
		const char *h = u->host, *dot = strchr(h + 4, '.');
		size_t rl = dot ? (size_t)(dot - h - 4) : 0;
		if (!strncmp(h, "sqs.", 4) && dot && strstr(dot, ".amazonaws.com") == dot &&
		    chars_ok(h + 4, rl, sizeof u->region - 1, "-"))
			memcpy(u->region, h + 4, rl);
		else
			snprintf(u->region, sizeof u->region, "us-east-1");
	}
	if (!have_results) {
		size_t base = strlen(u->queue) - (is_fifo(u->queue) ? 5 : 0);
		char name[QNAME_MAX + 32];
		snprintf(name, sizeof name, "%.*s-results%s", (int)base, u->queue, is_fifo(u->queue) ? ".fifo" : "");
		if (strlen(name) > QNAME_MAX)
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: the default results queue %s is longer than %d "
				       "characters; name one with results=", url, name, QNAME_MAX);
		memcpy(u->results, name, strlen(name) + 1);
	}
	if (!strcmp(u->results, u->queue))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: the results queue must differ from the job queue", url);
	return WK_OK;
}

/* ---- ReceiveMessage responses: pure ---- */

/* Copies s into id when it is a valid job id. */
static bool take_id(char *id, const json_t *s)
{
	size_t n = json_string_length(s);
	if (!json_is_string(s) || n == 0 || n > JOB_ID_MAX)
		return false;
	memcpy(id, json_string_value(s), n);
	id[n] = 0;
	if (strlen(id) != n || !job_id_valid(id)) {
		id[0] = 0;
		return false;
	}
	return true;
}

/* A valid job id from any text: [A-Za-z0-9._-] kept, anything else '_', at most JOB_ID_MAX. */
static void sanitize_id(char *id, const char *s, size_t n)
{
	if (n > JOB_ID_MAX)
		n = JOB_ID_MAX;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		id[i] = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
				c == '.' || c == '_' || c == '-' ? c : '_';
	}
	id[n] = 0;
	if (n == 0)
		snprintf(id, JOB_ID_MAX + 1, "message");
	if (!job_id_valid(id)) /* "." or ".." */
		for (char *p = id; *p; p++)
			*p = '_';
}

/* A count or timestamp attribute: SQS sends strings of digits; numbers are taken too. */
static bool attr_num(const json_t *v, long long *out)
{
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return true;
	}
	const char *s = json_string_value(v);
	if (!s || !*s || strlen(s) > 20)
		return false;
	char *end;
	*out = strtoll(s, &end, 10);
	return *end == 0;
}

void queue_sqs_msgs_free(struct queue_sqs_msg *m, int n)
{
	for (int i = 0; m && i < n; i++)
		free(m[i].body);
	free(m);
}

int queue_sqs_decode_receive(const char *resp, size_t len, size_t max_body,
			     struct queue_sqs_msg **msgs, int *n, char *err, size_t errsz)
{
	*msgs = NULL;
	*n = 0;
	json_error_t je;
	json_t *root = json_loadb(resp, len, JSON_ALLOW_NUL, &je);
	if (!root || !json_is_object(root)) {
		json_decref(root);
		return wk_errf(err, errsz, WK_EFORMAT, "sqs ReceiveMessage: the response is not a JSON object%s%.100s",
			       root ? "" : ": ", root ? "" : je.text);
	}
	json_t *arr = json_object_get(root, "Messages");
	if (arr && !json_is_array(arr)) {
		json_decref(root);
		return wk_errf(err, errsz, WK_EFORMAT, "sqs ReceiveMessage: \"Messages\" is not an array");
	}
	size_t cnt = json_array_size(arr);
	if (cnt > QUEUE_SQS_RECEIVE_MAX)
		cnt = QUEUE_SQS_RECEIVE_MAX; /* never asked for more; the rest come back later */
	struct queue_sqs_msg *m = cnt ? calloc(cnt, sizeof *m) : NULL;
	if (cnt && !m) {
		json_decref(root);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	int k = 0;
	for (size_t i = 0; i < cnt; i++) {
		const json_t *e = json_array_get(arr, i);
		const json_t *rh = json_object_get(e, "ReceiptHandle");
		size_t rl = json_string_length(rh);
		if (!json_is_string(rh) || rl == 0 || rl > QUEUE_HANDLE_MAX ||
		    memchr(json_string_value(rh), 0, rl))
			continue; /* cannot be acknowledged: it comes back after its visibility timeout */
		struct queue_sqs_msg *x = &m[k];
		memcpy(x->receipt, json_string_value(rh), rl);
		const json_t *attrs = json_object_get(e, "Attributes");
		long long v;
		x->attempt = attr_num(json_object_get(attrs, "ApproximateReceiveCount"), &v) && v >= 1 &&
					     v <= 1000000
				     ? (int)v
				     : 1;
		if (attr_num(json_object_get(attrs, "SentTimestamp"), &v) && v > 0 && v < 100000000000000LL)
			x->sent_at = (double)v / 1000.0;
		const json_t *body = json_object_get(e, "Body");
		if (!json_is_string(body)) {
			x->kind = QUEUE_SQS_MSG_BAD;
		} else {
			x->len = json_string_length(body);
			if (x->len > max_body) {
				x->kind = QUEUE_SQS_MSG_TOO_BIG;
			} else {
				if (!(x->body = malloc(x->len + 1))) {
					json_decref(root);
					queue_sqs_msgs_free(m, k);
					return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
				}
				memcpy(x->body, json_string_value(body), x->len);
				x->body[x->len] = 0;
				x->kind = QUEUE_SQS_MSG_OK;
			}
		}
		const json_t *ma = json_object_get(json_object_get(e, "MessageAttributes"), "id");
		const char *dt = json_string_value(json_object_get(ma, "DataType"));
		bool got = dt && !strncmp(dt, "String", 6) && (dt[6] == 0 || dt[6] == '.') &&
			   take_id(x->id, json_object_get(ma, "StringValue"));
		if (!got && x->kind == QUEUE_SQS_MSG_OK) {
			json_t *b = json_loadb(x->body, x->len, 0, NULL);
			got = take_id(x->id, json_object_get(b, "id"));
			json_decref(b);
		}
		if (!got) {
			const json_t *mid = json_object_get(e, "MessageId");
			if (json_is_string(mid) && json_string_length(mid) > 0)
				sanitize_id(x->id, json_string_value(mid), json_string_length(mid));
			else
				sanitize_id(x->id, x->receipt, rl);
		}
		k++;
	}
	json_decref(root);
	if (k == 0) {
		free(m);
		m = NULL;
	}
	*msgs = m;
	*n = k;
	return WK_OK;
}

/* ---- the driver's state ---- */

struct idset {           /* open addressing, never deletes; cap = 2 x DONE_GEN */
	char **slot;
	size_t n;
};

struct hold {            /* a job taken and not yet completed or released */
	char id[JOB_ID_MAX + 1];
	char *receipt;       /* the newest receipt handle for it (malloc'd) */
};

struct sq {
	struct queue_sqs_url u;
	CURL *c;
	char endpoint[300], sigv4[64];
	struct aws_creds cr;  /* the request signing's (aws_creds_free wipes them) */
	char *token_hdr;      /* "X-Amz-Security-Token: ..." or NULL; malloc'd, wiped */
	time_t creds_retry;   /* after a failed refresh: no other try before this */
	char *qurl, *rurl;   /* the queue URLs SQS returned */
	bool fifo_jobs, fifo_results;
	int max_receive;     /* the job queue's RedrivePolicy maxReceiveCount; 0 none */
	double retry_s;      /* how long call() retries while opening; 0 after: reconnect_s */
	bool resolving;      /* inside resolve_queues: no second re-creation */
	double next_poll;    /* wk_now() before which a non-waiting take does not ask SQS */
	char *rbuf;          /* the last response, NUL-terminated */
	size_t rlen, rcap;
	bool rtoo_big;
	char cerr[CURL_ERROR_SIZE];
	struct hold *held;
	int n_held, cap_held;
	struct idset done[2];
};


/* Blanks out every copy of a credential in s (an error message): same length, '*'. */
static void redact(const struct sq *s, char *msg)
{
	const char *secrets[3] = {s->cr.key, s->cr.secret, s->cr.token};
	for (int i = 0; i < 3; i++) {
		size_t n = secrets[i] ? strlen(secrets[i]) : 0;
		if (n == 0)
			continue;
		for (char *p = strstr(msg, secrets[i]); p; p = strstr(p + n, secrets[i]))
			memset(p, '*', n);
	}
}

/* ---- the done set ---- */

static uint64_t fnv(const char *s)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return h;
}

static bool idset_has(const struct idset *h, const char *id)
{
	if (!h->slot)
		return false;
	size_t cap = 2 * DONE_GEN;
	for (size_t i = fnv(id) & (cap - 1);; i = (i + 1) & (cap - 1)) {
		if (!h->slot[i])
			return false;
		if (!strcmp(h->slot[i], id))
			return true;
	}
}

static void idset_free(struct idset *h)
{
	for (size_t i = 0; h->slot && i < 2 * DONE_GEN; i++)
		free(h->slot[i]);
	free(h->slot);
	h->slot = NULL;
	h->n = 0;
}

/* Remembers id as completed here. Memory runs out quietly: forgetting costs a rerun at most. */
static void done_add(struct sq *s, const char *id)
{
	if (idset_has(&s->done[0], id) || idset_has(&s->done[1], id))
		return;
	if (s->done[0].n >= DONE_GEN) {
		idset_free(&s->done[1]);
		s->done[1] = s->done[0];
		s->done[0] = (struct idset){0};
	}
	struct idset *h = &s->done[0];
	size_t cap = 2 * DONE_GEN;
	if (!h->slot && !(h->slot = calloc(cap, sizeof *h->slot)))
		return;
	size_t i = fnv(id) & (cap - 1);
	while (h->slot[i])
		i = (i + 1) & (cap - 1);
	if ((h->slot[i] = strdup(id)))
		h->n++;
}

static bool done_has(const struct sq *s, const char *id)
{
	return idset_has(&s->done[0], id) || idset_has(&s->done[1], id);
}

/* ---- held jobs ---- */

static struct hold *held_find(struct sq *s, const char *id)
{
	for (int i = 0; i < s->n_held; i++)
		if (!strcmp(s->held[i].id, id))
			return &s->held[i];
	return NULL;
}

static void held_put(struct sq *s, const char *id, const char *receipt)
{
	struct hold *h = held_find(s, id);
	char *r = strdup(receipt);
	if (!r)
		return; /* the job's own handle is used instead */
	if (!h) {
		if (s->n_held == s->cap_held) {
			int cap = s->cap_held ? s->cap_held * 2 : 32;
			void *p = realloc(s->held, (size_t)cap * sizeof *s->held);
			if (!p) {
				free(r);
				return;
			}
			s->held = p;
			s->cap_held = cap;
		}
		h = &s->held[s->n_held++];
		snprintf(h->id, sizeof h->id, "%s", id);
		h->receipt = NULL;
	}
	free(h->receipt);
	h->receipt = r;
}

static void held_del(struct sq *s, const char *id)
{
	struct hold *h = held_find(s, id);
	if (!h)
		return;
	free(h->receipt);
	*h = s->held[--s->n_held];
}

/* The newest receipt for a job: SQS may have handed it to us again since it was returned. */
static const char *receipt_of(struct sq *s, const struct queue_job *j)
{
	struct hold *h = held_find(s, j->id);
	return h && h->receipt ? h->receipt : j->handle;
}

/* ---- HTTP ---- */

static size_t on_write(char *p, size_t sz, size_t nm, void *ud)
{
	struct sq *s = ud;
	size_t n = sz * nm;
	if (s->rlen + n > RESP_MAX) {
		s->rtoo_big = true;
		return 0;
	}
	if (s->rlen + n + 1 > s->rcap) {
		size_t cap = s->rcap ? s->rcap : 16384;
		while (cap < s->rlen + n + 1)
			cap *= 2;
		char *b = realloc(s->rbuf, cap);
		if (!b)
			return 0;
		s->rbuf = b;
		s->rcap = cap;
	}
	memcpy(s->rbuf + s->rlen, p, n);
	s->rlen += n;
	s->rbuf[s->rlen] = 0;
	return n;
}

static void sleep_s(double s)
{
	struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
	nanosleep(&ts, NULL);
}

static bool net_error(CURLcode c)
{
	switch (c) {
	case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_CONNECT: case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR: case CURLE_RECV_ERROR: case CURLE_GOT_NOTHING: case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2: case CURLE_HTTP2_STREAM:
		return true;
	default:
		return false;
	}
}

/* The AWS error type ("QueueDoesNotExist", from "__type" after its '#') and message of an
 * error response, when it is JSON. */
static void aws_error(const char *body, size_t len, char *type, size_t typesz, char *msg, size_t msgsz)
{
	type[0] = msg[0] = 0;
	json_t *j = json_loadb(body, len, 0, NULL);
	const char *t = json_string_value(json_object_get(j, "__type"));
	const char *m = json_string_value(json_object_get(j, "message"));
	if (!m)
		m = json_string_value(json_object_get(j, "Message"));
	if (t) {
		const char *h = strrchr(t, '#');
		snprintf(type, typesz, "%s", h ? h + 1 : t);
	}
	if (m)
		snprintf(msg, msgsz, "%s", m);
	json_decref(j);
}

static bool throttled(const char *type)
{
	return strstr(type, "Throttl") || !strcmp(type, "RequestThrottled") ||
	       !strcmp(type, "ServiceUnavailable") || !strcmp(type, "InternalError") ||
	       !strcmp(type, "KmsThrottled");
}

/* Signs with c from now on (taken: *c is zeroed); the old credentials are wiped. */
static int creds_use(struct sq *s, struct aws_creds *c, char *err, size_t errsz)
{
	char *hdr = NULL;
	if (c->token) {
		size_t n = strlen(c->token) + 32;
		if (!(hdr = malloc(n))) {
			aws_creds_free(c);
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		}
		snprintf(hdr, n, "X-Amz-Security-Token: %s", c->token);
	}
	aws_creds_free(&s->cr);
	wk_free_secret(s->token_hdr);
	s->cr = *c;
	memset(c, 0, sizeof *c);
	s->token_hdr = hdr;
	curl_easy_setopt(s->c, CURLOPT_USERNAME, s->cr.key);
	curl_easy_setopt(s->c, CURLOPT_PASSWORD, s->cr.secret);
	return WK_OK;
}

#define CREDS_RETRY_S 30 /* between refresh tries while the old credentials last */

/* Fetches the credentials again when they are due (aws_creds_due) or when force (SQS said
 * they expired). A failed fetch keeps the old ones while they have not expired: WK_OK, and
 * no other try for CREDS_RETRY_S (a slow STS would otherwise stall every request, lease
 * extensions among them); past their expiry it is the error. A fetch that brings credentials
 * due at once (a source handing out ones within 5 minutes of expiry) waits as long. */
static int creds_fresh(struct sq *s, bool force, char *err, size_t errsz)
{
	time_t now = time(NULL);
	if (!force && (!aws_creds_due(&s->cr, now) ||
		       (now < s->creds_retry && now < s->cr.expires)))
		return WK_OK;
	struct aws_creds c;
	char e2[WK_ERRSZ];
	int rc = aws_creds_load(&c, s->u.region, e2, sizeof e2);
	s->creds_retry = now + CREDS_RETRY_S; /* also after a success that is due at once */
	if (rc == WK_OK)
		return creds_use(s, &c, err, errsz);
	if (!force && now < s->cr.expires)
		return WK_OK;
	return wk_errf(err, errsz, rc, "sqs: refreshing the %s credentials: %s", s->cr.source, e2);
}

/* POSTs body as action, retrying network failures, 5xx and throttling until the retry budget
 * (s->retry_s while opening, then the queue's reconnect_s) has passed, or queue_stopping. On WK_OK the response is in s->rbuf. *gone is set when SQS says the queue does not
 * exist. */
static int perform_once(struct queue *q, const char *action, const char *body, double wait_s,
			bool *gone, bool *expired, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	char target[96];
	snprintf(target, sizeof target, "X-Amz-Target: AmazonSQS.%s", action);
	struct curl_slist *h = NULL, *h2;
	const char *hdrs[] = {"Content-Type: application/x-amz-json-1.0", target, "Expect:", s->token_hdr};
	for (int i = 0; i < 4; i++) {
		if (!hdrs[i])
			continue;
		if (!(h2 = curl_slist_append(h, hdrs[i]))) {
			curl_slist_free_all(h);
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		}
		h = h2;
	}
	curl_easy_setopt(s->c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(s->c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(s->c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
	curl_easy_setopt(s->c, CURLOPT_TIMEOUT_MS, (long)((IO_TIMEOUT_S + wait_s) * 1000));
	/* past open, the queue's current budget (queue_set_reconnect) */
	double budget = s->retry_s > 0 ? s->retry_s : q->o.reconnect_s;
	double t0 = wk_now(), deadline = t0 + budget, delay = 0.05;
	bool net_failed = false;
	int rc;
	char why[300];
	*gone = false;
	for (;;) {
		s->rlen = 0;
		s->rtoo_big = false;
		s->cerr[0] = 0;
		if (s->rbuf)
			s->rbuf[0] = 0;
		CURLcode cc = curl_easy_perform(s->c);
		long code = 0;
		curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &code);
		char type[128] = "", msg[300] = "";
		if (cc == CURLE_OK && code != 200 && s->rlen)
			aws_error(s->rbuf, s->rlen, type, sizeof type, msg, sizeof msg);
		if (cc == CURLE_OK) { /* the server answers (again) */
			q->st.reconnects += net_failed;
			net_failed = false;
		}
		if (cc == CURLE_OK && code == 200) {
			rc = WK_OK;
			break;
		}
		if (cc == CURLE_WRITE_ERROR) {
			rc = wk_errf(err, errsz, s->rtoo_big ? WK_ELIMIT : WK_ENOMEM, "sqs %s: %s", action,
				     s->rtoo_big ? "the response is larger than 64 MiB" : "out of memory");
			break;
		}
		if (cc != CURLE_OK && !net_error(cc)) {
			rc = wk_errf(err, errsz, WK_EIO, "sqs %s %s: %s", action, s->endpoint,
				     s->cerr[0] ? s->cerr : curl_easy_strerror(cc));
			break;
		}
		if (cc == CURLE_OK && code < 500 && !throttled(type)) {
			*gone = !strcmp(type, "QueueDoesNotExist") || strstr(type, "NonExistentQueue");
			*expired = strstr(type, "ExpiredToken") != NULL;
			rc = wk_errf(err, errsz, *gone ? WK_ENOTFOUND : WK_EINVAL, "sqs %s: %s: %s (HTTP %ld)", action,
				     type[0] ? type : "error", msg[0] ? msg : "no message", code);
			break;
		}
		if (cc == CURLE_OK)
			snprintf(why, sizeof why, "%.100s: %.150s (HTTP %ld)", type[0] ? type : "error", msg, code);
		else
			snprintf(why, sizeof why, "%s", s->cerr[0] ? s->cerr : curl_easy_strerror(cc));
		net_failed |= cc != CURLE_OK;
		if (wk_now() + delay > deadline || queue_stopping(q)) {
			rc = wk_errf(err, errsz, WK_EIO, "sqs %s %s: %s (gave up after %.1f s%s)", action,
				     s->endpoint, why, wk_now() - t0,
				     queue_stopping(q) ? ", interrupted" : "");
			break;
		}
		sleep_s(delay);
		delay = delay * 2 < 2 ? delay * 2 : 2;
	}
	curl_easy_setopt(s->c, CURLOPT_HTTPHEADER, NULL);
	curl_easy_setopt(s->c, CURLOPT_POSTFIELDS, NULL);
	curl_slist_free_all(h);
	if (rc != WK_OK && err)
		redact(s, err);
	return rc;
}

/* perform_once with credentials that are fresh (creds_fresh), and once more with new ones
 * when SQS says they expired. */
static int perform(struct queue *q, const char *action, const char *body, double wait_s, bool *gone,
		   char *err, size_t errsz)
{
	struct sq *s = q->impl;
	bool expired = false;
	int rc = creds_fresh(s, false, err, errsz);
	if (rc == WK_OK)
		rc = perform_once(q, action, body, wait_s, gone, &expired, err, errsz);
	if (rc != WK_OK && expired && creds_fresh(s, true, err, errsz) == WK_OK)
		rc = perform_once(q, action, body, wait_s, gone, &expired, err, errsz);
	return rc;
}

static int resolve_queues(struct queue *q, char *err, size_t errsz);

/* Runs one action: POSTs req (consumed) and, on WK_OK, leaves the response in s->rbuf and
 * (when out != NULL) its decoded object in *out (caller decrefs). wait_s: seconds SQS may
 * hold the request (long polling). Network failures, 5xx and throttling are retried until
 * reconnect_s has passed; other HTTP errors are returned at once: WK_ENOTFOUND for a queue
 * that does not exist, WK_EINVAL otherwise, with "sqs ACTION: TYPE: message" in err. A queue
 * that vanished after open (SQS restarted empty, or the queue was deleted) is created again
 * and the action run once more, as redis re-creates a lost group. */
static int call(struct queue *q, const char *action, json_t *req, double wait_s, json_t **out,
		char *err, size_t errsz)
{
	struct sq *s = q->impl;
	if (out)
		*out = NULL;
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!body)
		return wk_errf(err, errsz, WK_ENOMEM, "sqs %s: out of memory (or a string that is not UTF-8)",
			       action);
	bool gone;
	int rc = perform(q, action, body, wait_s, &gone, err, errsz);
	if (rc == WK_ENOTFOUND && gone && s->rurl && !s->resolving && resolve_queues(q, err, errsz) == WK_OK)
		rc = perform(q, action, body, wait_s, &gone, err, errsz);
	free(body);
	if (rc == WK_OK && out && !(*out = json_loadb(s->rbuf ? s->rbuf : "", s->rlen, JSON_ALLOW_NUL, NULL)))
		rc = wk_errf(err, errsz, WK_EFORMAT, "sqs %s: the response (%zu bytes) is not JSON", action, s->rlen);
	return rc;
}

/* ---- batches ---- */

/* Marks rc[0..n) from a *Batch response: entries named in Successful get WK_OK,
 * those in Failed WK_ENOTFOUND (the receipt is no longer valid) or WK_EINVAL (another
 * sender fault) or WK_EIO, anything not named WK_EIO. Entry ids are "e<index>". Returns the
 * first failure, with its message in err. */
static int batch_rcs(struct sq *s, const char *action, json_t *resp, int n, int *rc,
		     char *err, size_t errsz)
{
	for (int i = 0; i < n; i++)
		rc[i] = WK_EIO;
	size_t k;
	json_t *e;
	json_array_foreach(json_object_get(resp, "Successful"), k, e) {
		const char *id = json_string_value(json_object_get(e, "Id"));
		int i = id && id[0] == 'e' ? atoi(id + 1) : -1;
		if (i >= 0 && i < n)
			rc[i] = WK_OK;
	}
	int ret = WK_OK;
	json_array_foreach(json_object_get(resp, "Failed"), k, e) {
		const char *id = json_string_value(json_object_get(e, "Id"));
		const char *code = json_string_value(json_object_get(e, "Code"));
		const char *msg = json_string_value(json_object_get(e, "Message"));
		int i = id && id[0] == 'e' ? atoi(id + 1) : -1;
		if (i < 0 || i >= n)
			continue;
		code = code ? code : "error";
		bool gone = !strcmp(code, "ReceiptHandleIsInvalid") || strstr(code, "MessageNotInflight") ||
			    (msg && strstr(msg, "does not exist"));
		bool sender = json_is_true(json_object_get(e, "SenderFault"));
		rc[i] = gone ? WK_ENOTFOUND : sender ? WK_EINVAL : WK_EIO;
		if (ret == WK_OK) {
			ret = wk_errf(err, errsz, rc[i], "sqs %s: %s: %s", action, code, msg ? msg : "");
			redact(s, err);
		}
	}
	for (int i = 0; i < n && ret == WK_OK; i++)
		if (rc[i] != WK_OK)
			ret = wk_errf(err, errsz, WK_EIO, "sqs %s: entry %d missing from the reply", action, i);
	return ret;
}

/* Deletes (vis < 0) or changes the visibility of messages by receipt, in batches of 10, in
 * the job queue or (results) the results queue. rc[i] per message (may be NULL). Returns the
 * first failure. */
static int by_receipt(struct queue *q, bool results, const char *const *receipts, int n, int vis,
		      int *rc, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	const char *action = vis < 0 ? "DeleteMessageBatch" : "ChangeMessageVisibilityBatch";
	int ret = WK_OK, tmp[BATCH_MAX];
	for (int at = 0; at < n; at += BATCH_MAX) {
		int m = n - at < BATCH_MAX ? n - at : BATCH_MAX;
		json_t *entries = json_array();
		for (int i = 0; i < m; i++) {
			char eid[16];
			snprintf(eid, sizeof eid, "e%d", i);
			json_t *e = json_pack("{s:s, s:s}", "Id", eid, "ReceiptHandle", receipts[at + i]);
			if (e && vis >= 0)
				json_object_set_new(e, "VisibilityTimeout", json_integer(vis));
			json_array_append_new(entries, e);
		}
		json_t *resp = NULL;
		const char *qurl = results ? s->rurl : s->qurl; /* call() may have renewed them */
		int r = call(q, action, json_pack("{s:s, s:o}", "QueueUrl", qurl, "Entries", entries), 0, &resp,
			     err, errsz);
		if (r == WK_OK)
			r = batch_rcs(s, action, resp, m, tmp, err, errsz);
		else
			for (int i = 0; i < m; i++)
				tmp[i] = r;
		json_decref(resp);
		if (rc)
			memcpy(rc + at, tmp, (size_t)m * sizeof *rc);
		if (ret == WK_OK && r != WK_OK)
			ret = r;
	}
	return ret;
}

/* One result to send. */
struct out {
	const char *id, *json;
	size_t len;
	int rc;
};

static json_t *result_entry(struct sq *s, int i, const struct out *o)
{
	char eid[16];
	snprintf(eid, sizeof eid, "e%d", i);
	json_t *r = json_loadb(o->json, o->len, JSON_ALLOW_NUL, NULL);
	const char *status = json_string_value(json_object_get(r, "status"));
	json_t *attrs = json_pack("{s:{s:s, s:s}}", "id", "DataType", "String", "StringValue", o->id);
	if (status && attrs)
		json_object_set_new(attrs, "status", json_pack("{s:s, s:s}", "DataType", "String", "StringValue", status));
	json_decref(r);
	json_t *e = json_pack("{s:s, s:s%, s:o}", "Id", eid, "MessageBody", o->json, o->len, "MessageAttributes", attrs);
	if (e && s->fifo_results) {
		json_object_set_new(e, "MessageGroupId", json_string(o->id));
		json_object_set_new(e, "MessageDeduplicationId", json_string(o->id));
	}
	return e;
}

/* Sends results to the results queue: SendMessageBatch of up to per_call messages and about
 * BATCH_BYTES (a larger result goes alone). o[i].rc per result. One round trip is one sync. */
static int send_batches(struct queue *q, struct out *o, int n, int per_call, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	int ret = WK_OK;
	for (int at = 0; at < n;) {
		int m = 0;
		size_t bytes = 0;
		while (at + m < n && m < per_call && (m == 0 || bytes + o[at + m].len + 256 <= BATCH_BYTES))
			bytes += o[at + m++].len + 256;
		json_t *entries = json_array();
		for (int i = 0; i < m; i++)
			json_array_append_new(entries, result_entry(s, i, &o[at + i]));
		json_t *resp = NULL;
		int rcs[BATCH_MAX];
		int r = call(q, "SendMessageBatch", json_pack("{s:s, s:o}", "QueueUrl", s->rurl, "Entries", entries),
			     0, &resp, err, errsz);
		q->st.syncs++;
		if (r == WK_EINVAL && m > 1) { /* the whole batch refused: find the culprit one by one */
			int r1 = send_batches(q, o + at, m, 1, err, errsz);
			if (ret == WK_OK)
				ret = r1;
			at += m;
			continue;
		}
		if (r == WK_OK)
			r = batch_rcs(s, "SendMessageBatch", resp, m, rcs, err, errsz);
		else
			for (int i = 0; i < m; i++)
				rcs[i] = r;
		json_decref(resp);
		for (int i = 0; i < m; i++)
			o[at + i].rc = rcs[i];
		if (ret == WK_OK && r != WK_OK)
			ret = r;
		at += m;
	}
	return ret;
}

static int send_results(struct queue *q, struct out *o, int n, char *err, size_t errsz)
{
	return send_batches(q, o, n, BATCH_MAX, err, errsz);
}

/* ---- queues ---- */

/* The URL of queue name, created when missing. */
static int queue_url(struct queue *q, const char *name, char **url, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	json_t *resp = NULL;
	int rc = call(q, "GetQueueUrl", json_pack("{s:s, s:s}", "QueueName", name, "QueueOwnerAWSAccountId", s->u.account),
		      0, &resp, err, errsz);
	if (rc == WK_ENOTFOUND) {
		json_t *req = json_pack("{s:s}", "QueueName", name);
		if (req && is_fifo(name))
			json_object_set_new(req, "Attributes", json_pack("{s:s}", "FifoQueue", "true"));
		rc = call(q, "CreateQueue", req, 0, &resp, err, errsz);
	}
	const char *u = json_string_value(json_object_get(resp, "QueueUrl"));
	if (rc == WK_OK && !u)
		rc = wk_errf(err, errsz, WK_EFORMAT, "sqs GetQueueUrl %s: no QueueUrl in the reply", name);
	if (rc == WK_OK && !(*url = strdup(u)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	json_decref(resp);
	return rc;
}

/* Looks up (creating when missing) both queues and replaces their URLs. */
static int resolve_queues(struct queue *q, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	char *qu = NULL, *ru = NULL;
	s->resolving = true;
	int rc = queue_url(q, s->u.queue, &qu, err, errsz);
	if (rc == WK_OK)
		rc = queue_url(q, s->u.results, &ru, err, errsz);
	s->resolving = false;
	if (rc != WK_OK) {
		free(qu);
		return rc;
	}
	free(s->qurl);
	free(s->rurl);
	s->qurl = qu;
	s->rurl = ru;
	return WK_OK;
}

/* The job queue's RedrivePolicy maxReceiveCount, 0 without one. */
static int read_redrive(struct queue *q, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	json_t *resp = NULL;
	int rc = call(q, "GetQueueAttributes",
		      json_pack("{s:s, s:[s]}", "QueueUrl", s->qurl, "AttributeNames", "RedrivePolicy"), 0, &resp,
		      err, errsz);
	if (rc != WK_OK)
		return rc;
	const char *pol = json_string_value(json_object_get(json_object_get(resp, "Attributes"), "RedrivePolicy"));
	json_t *p = pol ? json_loads(pol, 0, NULL) : NULL;
	long long v = 0;
	if (p && attr_num(json_object_get(p, "maxReceiveCount"), &v) && v >= 1 && v <= 1000)
		s->max_receive = (int)v;
	else if (pol && *pol)
		rc = wk_errf(err, errsz, WK_EFORMAT, "sqs %s: unreadable RedrivePolicy %.100s", s->u.queue, pol);
	json_decref(p);
	json_decref(resp);
	return rc;
}

/* The jobs queued or running: SQS's ApproximateNumberOfMessages (visible) and
 * ...NotVisible (taken, within their visibility timeout), the figure an autoscaler reads;
 * approximate (SQS's word: it may lag for a minute), and it counts messages, not jobs. */
static int sqs_backlog(struct queue *q, long *n, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	json_t *resp = NULL;
	int rc = call(q, "GetQueueAttributes",
		      json_pack("{s:s, s:[s, s]}", "QueueUrl", s->qurl, "AttributeNames",
				"ApproximateNumberOfMessages",
				"ApproximateNumberOfMessagesNotVisible"), 0, &resp, err, errsz);
	if (rc != WK_OK)
		return rc;
	const json_t *a = json_object_get(resp, "Attributes");
	long long vis = 0, hidden = 0;
	if (!attr_num(json_object_get(a, "ApproximateNumberOfMessages"), &vis) ||
	    !attr_num(json_object_get(a, "ApproximateNumberOfMessagesNotVisible"), &hidden) ||
	    vis < 0 || hidden < 0)
		rc = wk_errf(err, errsz, WK_EFORMAT, "sqs %s: GetQueueAttributes gave no message "
			     "counts", s->u.queue);
	else
		*n = (long)(vis + hidden);
	json_decref(resp);
	return rc;
}

/* A job this handle took was completed (deleted) through another handle (the worker's
 * committer): its receipt is no longer held here, and a redelivery of it is known as done. */
static void sqs_done_elsewhere(struct queue *q, const struct queue_job *j)
{
	struct sq *s = q->impl;
	done_add(s, j->id);
	held_del(s, j->id);
}

/* ---- open / close ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static void sqs_close(struct queue *q)
{
	struct sq *s = q->impl;
	if (!s)
		return;
	if (s->c)
		curl_easy_cleanup(s->c);
	aws_creds_free(&s->cr);
	wk_free_secret(s->token_hdr);
	free(s->qurl);
	free(s->rurl);
	free(s->rbuf);
	for (int i = 0; i < s->n_held; i++)
		free(s->held[i].receipt);
	free(s->held);
	idset_free(&s->done[0]);
	idset_free(&s->done[1]);
	free(s);
	q->impl = NULL;
}

static int sqs_open(struct queue *q, const char *url, char *err, size_t errsz)
{
	struct sq *s = calloc(1, sizeof *s);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	q->impl = s;
	int rc = queue_sqs_parse_url(url, &s->u, err, errsz);
	if (rc != WK_OK)
		goto fail;
	pthread_once(&curl_once, curl_init);
	if (!(s->c = curl_easy_init())) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto fail;
	}
	struct aws_creds cr;
	char e2[WK_ERRSZ];
	if ((rc = aws_creds_load(&cr, s->u.region, e2, sizeof e2)) != WK_OK) {
		rc = wk_errf(err, errsz, rc, "sqs: %s", e2);
		goto fail;
	}
	if ((rc = creds_use(s, &cr, err, errsz)) != WK_OK)
		goto fail;
	s->fifo_jobs = is_fifo(s->u.queue);
	s->fifo_results = is_fifo(s->u.results);
	bool v6 = strchr(s->u.host, ':') != NULL;
	char port[16] = "";
	if (s->u.port)
		snprintf(port, sizeof port, ":%d", s->u.port);
	snprintf(s->endpoint, sizeof s->endpoint, "%s://%s%s%s%s/", s->u.tls ? "https" : "http", v6 ? "[" : "",
		 s->u.host, v6 ? "]" : "", port);
	snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:sqs", s->u.region);
	CURL *c = s->c;
	curl_easy_setopt(c, CURLOPT_URL, s->endpoint);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, s->u.tls ? "https" : "http");
	curl_easy_setopt(c, CURLOPT_POST, 1L);
	curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, s->cerr);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
	curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
	s->retry_s = q->o.reconnect_s < OPEN_RETRY_S ? q->o.reconnect_s : OPEN_RETRY_S;
	if ((rc = resolve_queues(q, err, errsz)) != WK_OK || (rc = read_redrive(q, err, errsz)) != WK_OK)
		goto fail;
	s->retry_s = 0; /* from now on the queue's current budget */
	if (s->u.max_deliveries > 0)
		q->o.max_deliveries = s->u.max_deliveries;
	return WK_OK;
fail:
	sqs_close(q);
	return rc;
}

/* ---- take ---- */

static int secs_up(double s, int lo, int hi)
{
	double c = ceil(s);
	return c < lo ? lo : c > hi ? hi : (int)c;
}

/* What to do with a message that is not returned: send result (when not NULL), then delete. */
struct settle {
	char id[JOB_ID_MAX + 1];
	const char *receipt;
	char *result;
	size_t rlen;
};

static void settle(struct queue *q, struct settle *st, int n)
{
	char err[WK_ERRSZ];
	struct out o[QUEUE_SQS_RECEIVE_MAX];
	const char *del[QUEUE_SQS_RECEIVE_MAX];
	int no = 0, nd = 0;
	for (int i = 0; i < n; i++)
		if (st[i].result)
			o[no++] = (struct out){.id = st[i].id, .json = st[i].result, .len = st[i].rlen};
	if (no)
		send_results(q, o, no, err, sizeof err);
	for (int i = 0, k = 0; i < n; i++) {
		if (st[i].result && o[k++].rc != WK_OK)
			continue; /* not stored: the message comes back and is settled again */
		del[nd++] = st[i].receipt;
	}
	if (nd)
		by_receipt(q, false, del, nd, -1, NULL, err, sizeof err); /* a failure: settled next time */
}

static int sqs_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n, char *err,
		    size_t errsz)
{
	struct sq *s = q->impl;
	double now = wk_now(), deadline = now + wait_s;
	if (wait_s <= 0 && now < s->next_poll)
		return WK_OK;
	int vis = secs_up(q->o.lease_s, 1, VIS_MAX), rc = WK_OK;
	for (int round = 0; round < 64 && *n < max; round++) {
		int want = max - *n < QUEUE_SQS_RECEIVE_MAX ? max - *n : QUEUE_SQS_RECEIVE_MAX;
		double left = deadline - wk_now(), w = left < 20 ? left : 20;
		/* SQS waits whole seconds: round up, unless that overshoots the caller's wait by more
		 * than about half a second (then round down, and sleep the rest below). The worker
		 * asks for 0.5 s while idle: that becomes a 1 s long poll. */
		int wait = *n == 0 && left > 0 ? secs_up(w, 0, 20) : 0;
		if (wait - w > OVERSHOOT_MAX_S)
			wait = (int)floor(w);
		json_t *req = json_pack("{s:s, s:i, s:i, s:i, s:[s,s], s:[s,s], s:[s]}", "QueueUrl", s->qurl,
					"MaxNumberOfMessages", want, "WaitTimeSeconds", wait, "VisibilityTimeout", vis,
					"AttributeNames", "ApproximateReceiveCount", "SentTimestamp",
					"MessageSystemAttributeNames", "ApproximateReceiveCount", "SentTimestamp",
					"MessageAttributeNames", "All");
		if ((rc = call(q, "ReceiveMessage", req, wait, NULL, err, errsz)) != WK_OK)
			break;
		struct queue_sqs_msg *m;
		int nm;
		if ((rc = queue_sqs_decode_receive(s->rbuf, s->rlen, q->o.max_body, &m, &nm, err, errsz)) != WK_OK)
			break;
		struct settle st[QUEUE_SQS_RECEIVE_MAX];
		const char *extra[QUEUE_SQS_RECEIVE_MAX];
		int ns = 0, nx = 0;
		for (int i = 0; i < nm; i++) {
			struct queue_sqs_msg *x = &m[i];
			if (held_find(s, x->id)) { /* ours already, running: keep the newest receipt */
				held_put(s, x->id, x->receipt);
				continue;
			}
			if (*n >= max) { /* more than asked for: handed straight back */
				extra[nx++] = x->receipt;
				continue;
			}
			struct settle *t = &st[ns];
			*t = (struct settle){.receipt = x->receipt};
			snprintf(t->id, sizeof t->id, "%s", x->id);
			char msg[200];
			if (done_has(s, x->id)) {
				q->st.redelivered_done++;
				ns++;
				continue;
			}
			int limit = s->max_receive ? s->max_receive : q->o.max_deliveries;
			if (x->kind == QUEUE_SQS_MSG_TOO_BIG) {
				snprintf(msg, sizeof msg, "the job has %zu bytes; the limit is %zu", x->len, q->o.max_body);
				t->result = queue_error_result(q, x->id, JOB_EINVALID_INPUT, msg, x->attempt, &t->rlen);
			} else if (x->kind == QUEUE_SQS_MSG_BAD) {
				t->result = queue_error_result(q, x->id, JOB_EINVALID_JSON, "the SQS message has no body",
							       x->attempt, &t->rlen);
			} else if (x->attempt > limit) {
				snprintf(msg, sizeof msg, "dead-lettered: delivered %d times without a result (%s %d)",
					 x->attempt - 1, s->max_receive ? "maxReceiveCount" : "max_deliveries", limit);
				t->result = queue_error_result(q, x->id, JOB_EINTERNAL, msg, x->attempt - 1, &t->rlen);
				q->st.dead_lettered++;
			} else {
				struct queue_job *j = &jobs[(*n)++];
				memset(j, 0, sizeof *j);
				j->body = x->body;
				j->len = x->len;
				x->body = NULL;
				snprintf(j->id, sizeof j->id, "%s", x->id);
				snprintf(j->handle, sizeof j->handle, "%s", x->receipt);
				j->attempt = x->attempt;
				j->enqueued_at = x->sent_at;
				q->st.reclaimed += x->attempt > 1; /* a lease ran out, or it was released */
				held_put(s, x->id, x->receipt);
				continue;
			}
			if (t->result) /* out of memory: left for its next delivery */
				ns++;
		}
		if (ns)
			settle(q, st, ns);
		if (nx) {
			char e2[WK_ERRSZ];
			by_receipt(q, false, extra, nx, 0, NULL, e2, sizeof e2);
		}
		for (int i = 0; i < ns; i++)
			free(st[i].result);
		queue_sqs_msgs_free(m, nm);
		if (nm == 0 && (*n > 0 || wk_now() >= deadline))
			break;
		if (nm == 0 && wait == 0) { /* the fraction of a second SQS cannot wait */
			sleep_s(deadline - wk_now());
			break;
		}
		if (nm > 0 && nm < want && *n > 0)
			break; /* fewer than asked: nothing more is waiting */
	}
	if (*n > 0)
		rc = WK_OK; /* jobs in hand are returned; the error comes back on the next call */
	if (*n == 0 && wait_s <= 0)
		s->next_poll = wk_now() + EMPTY_POLL_GAP_S;
	return rc;
}

/* ---- complete, extend, release ---- */

static int sqs_complete(struct queue *q, struct queue_result *r, int n, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	struct out *o = calloc((size_t)n, sizeof *o);
	const char **del = calloc((size_t)n, sizeof *del);
	int *idx = calloc((size_t)n, sizeof *idx);
	if (!o || !del || !idx) {
		free(o), free(del), free(idx);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++)
		o[i] = (struct out){.id = r[i].job->id, .json = r[i].json, .len = r[i].len};
	send_results(q, o, n, err, errsz); /* each result's outcome in o[i].rc */
	/* A result SQS refused as such (too large, most likely) is replaced by a small FAILED one,
	 * so the job does not come back for ever. */
	for (int i = 0; i < n; i++) {
		if (o[i].rc != WK_EINVAL)
			continue;
		char msg[WK_ERRSZ + 64];
		snprintf(msg, sizeof msg, "the result (%zu bytes) was refused by the results queue: %s", r[i].len, err);
		size_t len;
		char *fb = queue_error_result(q, r[i].job->id, JOB_EINTERNAL, msg, r[i].job->attempt, &len);
		if (!fb)
			continue;
		struct out one = {.id = r[i].job->id, .json = fb, .len = len};
		char e2[WK_ERRSZ];
		send_results(q, &one, 1, e2, sizeof e2);
		o[i].rc = one.rc;
		free(fb);
	}
	int nd = 0;
	for (int i = 0; i < n; i++) {
		r[i].rc = o[i].rc;
		if (o[i].rc == WK_OK) {
			idx[nd] = i;
			del[nd++] = receipt_of(s, r[i].job);
		}
	}
	int rc = WK_OK; /* else the first failure; err still holds what SQS said about it */
	for (int i = 0; i < n && rc == WK_OK; i++)
		rc = r[i].rc;
	if (nd) {
		/* A failed delete is not the job's failure: its result is stored, and a redelivery
		 * to this process is recognised as done. */
		char e2[WK_ERRSZ];
		by_receipt(q, false, del, nd, -1, NULL, e2, sizeof e2);
		for (int k = 0; k < nd; k++) {
			done_add(s, r[idx[k]].job->id);
			held_del(s, r[idx[k]].job->id);
		}
	}
	free(o), free(del), free(idx);
	return rc;
}

static int change_jobs(struct queue *q, struct queue_job *jobs, int n, int vis, int *rcs, char *err,
		       size_t errsz)
{
	struct sq *s = q->impl;
	const char **rec = calloc((size_t)n, sizeof *rec);
	if (!rec)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		rec[i] = receipt_of(s, &jobs[i]);
		if (rec[i] != jobs[i].handle) /* hand the newest receipt back to the caller */
			snprintf(jobs[i].handle, sizeof jobs[i].handle, "%s", rec[i]);
		rec[i] = jobs[i].handle;
	}
	int rc = by_receipt(q, false, rec, n, vis, rcs, err, errsz);
	free(rec);
	return rc;
}

static int sqs_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc, char *err,
		      size_t errsz)
{
	int tmp[n > 0 ? n : 1];
	int r = change_jobs(q, jobs, n, secs_up(lease_s, 1, VIS_MAX), rc ? rc : tmp, err, errsz);
	if (r == WK_ENOTFOUND)
		for (int i = 0; i < n; i++)
			if ((rc ? rc : tmp)[i] == WK_ENOTFOUND) {
				wk_errf(err, errsz, WK_ENOTFOUND, "job %s: lease lost (its receipt is no longer valid)",
					jobs[i].id);
				break;
			}
	return r;
}

static int sqs_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	struct sq *s = q->impl;
	int tmp[n > 0 ? n : 1];
	int rc = change_jobs(q, jobs, n, 0, tmp, err, errsz);
	for (int i = 0; i < n; i++)
		held_del(s, jobs[i].id);
	return rc == WK_ENOTFOUND ? WK_OK : rc; /* gone already: nothing to hand back */
}

/* SQS has no cancel channel. queue.c calls this unconditionally every half second, so it
 * succeeds with nothing cancelled rather than failing each time. */
static int sqs_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	(void)q, (void)jobs, (void)n, (void)err, (void)errsz;
	return WK_OK;
}

/* ---- producer side ---- */

static int sqs_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
		      size_t errsz)
{
	struct sq *s = q->impl;
	json_t *body = json_stringn(json, len);
	if (!body)
		return wk_errf(err, errsz, WK_EINVAL, "job %s is not valid UTF-8 text, which SQS messages must be", id);
	json_t *req = json_pack("{s:s, s:o, s:{s:{s:s, s:s}}}", "QueueUrl", s->qurl, "MessageBody", body,
				"MessageAttributes", "id", "DataType", "String", "StringValue", id);
	if (req && s->fifo_jobs) {
		json_object_set_new(req, "MessageGroupId", json_string(id));
		json_object_set_new(req, "MessageDeduplicationId", json_string(id));
	}
	return call(q, "SendMessage", req, 0, NULL, err, errsz);
}

/* Scans the results queue for id's result. Others' results are kept hidden (WAIT_VIS_S) while
 * the scan goes on, so it moves past them, then made visible again at once (visibility 0) so
 * other waiters see them. */
static int sqs_wait_result(struct queue *q, const char *id, double timeout_s, char **json, size_t *len,
			   char *err, size_t errsz)
{
	struct sq *s = q->impl;
	double deadline = wk_now() + timeout_s;
	char **others = NULL;
	int n_others = 0, cap = 0, rc = WK_OK;
	bool found = false;
	while (!found) {
		double left = deadline - wk_now();
		if (left <= 0) {
			rc = wk_errf(err, errsz, WK_ENOTFOUND, "no result for job %s after %.1f s", id, timeout_s);
			break;
		}
		int wait = n_others ? 0 : secs_up(left < 20 ? left : 20, 1, 20);
		json_t *req = json_pack("{s:s, s:i, s:i, s:i, s:[s]}", "QueueUrl", s->rurl, "MaxNumberOfMessages",
					QUEUE_SQS_RECEIVE_MAX, "WaitTimeSeconds", wait, "VisibilityTimeout", WAIT_VIS_S,
					"MessageAttributeNames", "All");
		if ((rc = call(q, "ReceiveMessage", req, wait, NULL, err, errsz)) != WK_OK)
			break;
		struct queue_sqs_msg *m;
		int nm;
		if ((rc = queue_sqs_decode_receive(s->rbuf, s->rlen, RESULT_MAX, &m, &nm, err, errsz)) != WK_OK)
			break;
		for (int i = 0; i < nm; i++) {
			if (!found && m[i].kind == QUEUE_SQS_MSG_OK && !strcmp(m[i].id, id)) {
				found = true;
				const char *rec = m[i].receipt;
				rc = by_receipt(q, true, &rec, 1, -1, NULL, err, errsz);
				*json = m[i].body;
				if (len)
					*len = m[i].len;
				m[i].body = NULL;
				continue;
			}
			if (n_others == cap) {
				int nc = cap ? cap * 2 : 64;
				char **p = realloc(others, (size_t)nc * sizeof *p);
				if (!p)
					continue; /* it reappears after WAIT_VIS_S */
				others = p;
				cap = nc;
			}
			if ((others[n_others] = strdup(m[i].receipt)))
				n_others++;
		}
		queue_sqs_msgs_free(m, nm);
		if (found || nm == 0 || n_others >= 1000) {
			if (n_others) {
				char e2[WK_ERRSZ];
				by_receipt(q, true, (const char *const *)others, n_others, 0, NULL, e2, sizeof e2);
				for (int i = 0; i < n_others; i++)
					free(others[i]);
				n_others = 0;
				if (!found && nm == 0) { /* scanned them all: pause before scanning again */
					double l = deadline - wk_now();
					sleep_s(l < 0.5 ? (l > 0 ? l : 0) : 0.5);
				}
			}
		}
	}
	for (int i = 0; i < n_others; i++)
		free(others[i]);
	free(others);
	if (found && rc != WK_OK) { /* the result is in hand; the delete failing only leaves a copy */
		rc = WK_OK;
	}
	return rc;
}

const struct queue_ops queue_sqs_ops = {
	.name = "sqs",
	.open = sqs_open,
	.close = sqs_close,
	.take = sqs_take,
	.complete = sqs_complete,
	.extend = sqs_extend,
	.release = sqs_release,
	.check_cancel = sqs_check_cancel,
	.submit = sqs_submit,
	.wait_result = sqs_wait_result,
	.backlog = sqs_backlog,
	.done_elsewhere = sqs_done_elsewhere,
	/* .cancel: SQS has no cancel channel; queue.c answers WK_EUNSUPPORTED */
};
