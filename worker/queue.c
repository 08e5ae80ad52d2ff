/*
 * queue.c - picks the driver from the URL scheme, fills in defaults, checks arguments.
 */
#include "worker/queue_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"

#define QUEUE_BATCH_MAX 4096 /* jobs in one take/complete/extend call */

int queue_split_host(const char *url, const char **p, const char *slash, size_t *hl,
		     const char **colon, char *err, size_t errsz)
{
	const char *h = *p, *hend = slash;
	*colon = NULL;
	if (*h == '[') { /* [v6 address] */
		const char *rb = memchr(h, ']', (size_t)(slash - h));
		if (!rb)
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: unclosed [ in the host", url);
		if (rb + 1 < slash && rb[1] == ':')
			*colon = rb + 1;
		else if (rb + 1 != slash)
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: junk after ]", url);
		h++;
		hend = rb;
	} else {
		*colon = memchr(h, ':', (size_t)(slash - h));
		if (*colon)
			hend = *colon;
	}
	*p = h;
	*hl = (size_t)(hend - h);
	return WK_OK;
}

int queue_next_param(const char *url, const char **q, struct queue_param *p, char *err,
		     size_t errsz)
{
	if (!*q || !**q)
		return 0;
	const char *k = *q + 1, *amp = strchr(k, '&'), *eq = strchr(k, '=');
	size_t kl = amp ? (size_t)(amp - k) : strlen(k);
	if (!eq || eq > k + kl)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: parameter without a value", url);
	*p = (struct queue_param){.k = k, .kl = (size_t)(eq - k), .v = eq + 1};
	p->vl = (size_t)(k + kl - p->v);
	char num[24] = "", *end;
	if (p->vl < sizeof num)
		memcpy(num, p->v, p->vl);
	p->num = strtoll(num, &end, 10);
	p->isnum = p->vl > 0 && p->vl < sizeof num && *end == 0;
	*q = amp;
	return 1;
}

bool queue_param_is(const struct queue_param *p, const char *name)
{
	return p->kl == strlen(name) && !strncmp(p->k, name, p->kl);
}

void queue_job_free(struct queue_job *j)
{
	if (!j)
		return;
	free(j->body);
	j->body = NULL;
	j->len = 0;
}

/* The driver of url by its scheme, and what its open takes (*rest: past "spool:", else the
 * whole URL); NULL with a message for no URL or an unknown scheme. */
static const struct queue_ops *driver_of(const char *url, const char **rest, char *err,
					 size_t errsz)
{
	*rest = url;
	if (!url || !*url) {
		wk_errf(err, errsz, WK_EINVAL, "no queue URL given");
		return NULL;
	}
	if (!strncmp(url, "spool:", 6)) {
		*rest = url + 6;
		return &queue_spool_ops;
	}
	const char *auth = strstr(url, "://"), *at = queue_url_at(url);
	if (auth && at) {
		wk_errf(err, errsz, WK_EINVAL, "%.*s...@%.*s: credentials do not go in a queue "
			"URL (it is logged): for redis:// set WICK_REDIS_PASSWORD (and "
			"WICK_REDIS_USERNAME), for sqs:// AWS_ACCESS_KEY_ID or a role, for RunPod "
			"RUNPOD_AI_API_KEY", (int)(auth + 3 - url), url,
			(int)(queue_url_at_end(url) - at - 1), at + 1);
		return NULL;
	}
	if (!strncmp(url, "redis://", 8) || !strncmp(url, "rediss://", 9))
		return &queue_redis_ops;
	if (!strncmp(url, "sqs://", 6))
		return &queue_sqs_ops;
	if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
		return &queue_http_ops;
	wk_errf(err, errsz, WK_EINVAL, "%.200s: unknown queue URL (want spool:DIR, "
		"redis://HOST:PORT/STREAM, sqs://..., or http(s)://...)", url);
	return NULL;
}

const char *queue_url_at_end(const char *url)
{
	const char *qm = strchr(url, '?');
	return qm ? qm : url + strlen(url);
}

const char *queue_url_at(const char *url)
{
	return memrchr(url, '@', (size_t)(queue_url_at_end(url) - url));
}

int queue_check_url(const char *url, char *err, size_t errsz)
{
	const char *rest;
	const struct queue_ops *ops = driver_of(url, &rest, err, errsz);
	if (!ops)
		return WK_EINVAL;
	if (ops == &queue_spool_ops)
		return *rest ? WK_OK : wk_errf(err, errsz, WK_EINVAL, "spool: names no directory");
	if (ops == &queue_redis_ops) {
		struct queue_redis_url u;
		return queue_redis_parse_url(url, &u, err, errsz);
	}
	if (ops == &queue_sqs_ops) {
		struct queue_sqs_url u;
		return queue_sqs_parse_url(url, &u, err, errsz);
	}
	return queue_http_check_url("job-take (--queue)", url, err, errsz);
}

int queue_open(const char *url, const struct queue_opts *o, struct queue **qp, char *err, size_t errsz)
{
	*qp = NULL;
	const char *rest;
	const struct queue_ops *ops = driver_of(url, &rest, err, errsz);
	if (!ops)
		return WK_EINVAL;
	if (o && o->consumer && *o->consumer && !job_id_valid(o->consumer))
		return wk_errf(err, errsz, WK_EINVAL,
			       "consumer name '%.128s' must match [A-Za-z0-9._-]{1,128}", o->consumer);
	struct queue *q = calloc(1, sizeof *q);
	if (!q)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	q->ops = ops;
	if (o)
		q->o = *o;
	if (q->o.consumer && *q->o.consumer) {
		snprintf(q->consumer, sizeof q->consumer, "%s", q->o.consumer);
	} else {
		char host[64] = "host";
		gethostname(host, sizeof host - 1);
		host[sizeof host - 1] = 0;
		for (char *p = host; *p; p++)
			if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
			      (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
				*p = '_';
		snprintf(q->consumer, sizeof q->consumer, "%s-%ld", host, (long)getpid());
	}
	q->o.consumer = q->consumer;
	if (!(q->o.lease_s > 0))
		q->o.lease_s = 60;
	if (q->o.max_deliveries <= 0)
		q->o.max_deliveries = 5;
	if (q->o.max_body == 0 || q->o.max_body > JOB_BODY_MAX)
		q->o.max_body = JOB_BODY_MAX;
	if (!(q->o.reconnect_s > 0))
		q->o.reconnect_s = 60;
	int rc = ops->open(q, rest, err, errsz);
	if (rc != WK_OK) {
		free(q);
		return rc;
	}
	*qp = q;
	return WK_OK;
}

void queue_close(struct queue *q)
{
	if (!q)
		return;
	q->ops->close(q);
	free(q);
}

const char *queue_driver(const struct queue *q) { return q->ops->name; }

static int check_n(int n, char *err, size_t errsz)
{
	if (n < 0 || n > QUEUE_BATCH_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "%d jobs in one call; the limit is %d", n,
			       QUEUE_BATCH_MAX);
	return WK_OK;
}

int queue_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n, char *err,
	       size_t errsz)
{
	*n = 0;
	int rc = check_n(max, err, errsz);
	if (rc != WK_OK || max == 0)
		return rc;
	if (!(wait_s >= 0))
		wait_s = 0;
	memset(jobs, 0, (size_t)max * sizeof *jobs);
	rc = q->ops->take(q, jobs, max, wait_s, n, err, errsz);
	q->st.taken += (uint64_t)*n;
	return rc;
}

/* queue_complete's, with budget_s (< 0: the handle's own). */
static int complete(struct queue *q, struct queue_result *r, int n, double budget_s, char *err,
		    size_t errsz)
{
	int rc = check_n(n, err, errsz);
	if (rc != WK_OK || n == 0)
		return rc;
	for (int i = 0; i < n; i++) {
		r[i].rc = WK_OK;
		if (!r[i].job || !r[i].json)
			return wk_errf(err, errsz, WK_EINVAL, "result %d has no job or no JSON", i);
	}
	if (budget_s >= 0 && q->ops->complete_within) {
		rc = q->ops->complete_within(q, r, n, budget_s, err, errsz);
	} else if (budget_s >= 0) {
		double own = q->o.reconnect_s;
		queue_set_reconnect(q, budget_s);
		rc = q->ops->complete(q, r, n, err, errsz);
		q->o.reconnect_s = own;
	} else {
		rc = q->ops->complete(q, r, n, err, errsz);
	}
	for (int i = 0; i < n; i++)
		q->st.completed += r[i].rc == WK_OK;
	return rc;
}

int queue_complete(struct queue *q, struct queue_result *r, int n, char *err, size_t errsz)
{
	return complete(q, r, n, -1, err, errsz);
}

int queue_complete_within(struct queue *q, struct queue_result *r, int n, double budget_s,
			  char *err, size_t errsz)
{
	return complete(q, r, n, budget_s > 0 ? budget_s : 0, err, errsz);
}

int queue_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc_, char *err,
		 size_t errsz)
{
	int rc = check_n(n, err, errsz);
	if (rc != WK_OK || n == 0)
		return rc;
	if (!(lease_s > 0))
		lease_s = q->o.lease_s;
	return q->ops->extend(q, jobs, n, lease_s, rc_, err, errsz);
}

int queue_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	int rc = check_n(n, err, errsz);
	if (rc != WK_OK || n == 0)
		return rc;
	rc = q->ops->release(q, jobs, n, err, errsz);
	if (rc == WK_OK)
		q->st.released += (uint64_t)n;
	return rc;
}

int queue_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	int rc = check_n(n, err, errsz);
	if (rc != WK_OK || n == 0)
		return rc;
	return q->ops->check_cancel(q, jobs, n, err, errsz);
}

bool queue_streams(const struct queue *q)
{
	return q->ops->streams && q->ops->stream && q->ops->streams(q);
}

void queue_stream(struct queue *q, const struct queue_job *j, const char *text, size_t len)
{
	if (queue_streams(q))
		q->ops->stream(q, j, text, len);
}

int queue_flush_streams(struct queue *q, char *err, size_t errsz)
{
	return q->ops->flush_streams ? q->ops->flush_streams(q, err, errsz) : WK_OK;
}

int queue_wait_stream(struct queue *q, const char *id, double timeout_s,
		      void (*on_piece)(void *ctx, const char *text, size_t len, int attempt),
		      void *ctx, char **json, size_t *len, char *err, size_t errsz)
{
	if (!q->ops->wait_stream)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s queues have no stream a client can "
			       "read (redis:// has)", q->ops->name);
	return q->ops->wait_stream(q, id, timeout_s, on_piece, ctx, json, len, err, errsz);
}

int queue_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
		 size_t errsz)
{
	if (!job_id_valid(id))
		return wk_errf(err, errsz, WK_EINVAL, "job id '%.140s' must match [A-Za-z0-9._-]{1,%d}",
			       id ? id : "", JOB_ID_MAX);
	if (len > q->o.max_body)
		return wk_errf(err, errsz, WK_ELIMIT, "job %s has %zu bytes; the limit is %zu", id, len,
			       q->o.max_body);
	return q->ops->submit(q, id, json, len, err, errsz);
}

int queue_wait_result(struct queue *q, const char *id, double timeout_s, char **json, size_t *len,
		      char *err, size_t errsz)
{
	*json = NULL;
	if (!job_id_valid(id))
		return wk_errf(err, errsz, WK_EINVAL, "job id '%.140s' is not valid", id ? id : "");
	if (!q->ops->wait_result)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "the %s driver cannot wait for results",
			       q->ops->name);
	return q->ops->wait_result(q, id, timeout_s, json, len, err, errsz);
}

int queue_cancel(struct queue *q, const char *id, char *err, size_t errsz)
{
	if (!job_id_valid(id))
		return wk_errf(err, errsz, WK_EINVAL, "job id '%.140s' is not valid", id ? id : "");
	if (!q->ops->cancel)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "the %s driver cannot cancel jobs",
			       q->ops->name);
	return q->ops->cancel(q, id, err, errsz);
}

void queue_get_stats(const struct queue *q, struct queue_stats *s) { *s = q->st; }

int queue_backlog(struct queue *q, long *n, char *err, size_t errsz)
{
	*n = 0;
	if (!q->ops->backlog)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "a %s queue cannot say how many jobs it "
							  "holds", q->ops->name);
	return q->ops->backlog(q, n, err, errsz);
}

void queue_done_elsewhere(struct queue *q, const struct queue_job *j)
{
	if (q && q->ops->done_elsewhere)
		q->ops->done_elsewhere(q, j);
}

void queue_set_reconnect(struct queue *q, double seconds)
{
	if (q && seconds > 0)
		q->o.reconnect_s = seconds;
}

bool queue_stopping(const struct queue *q)
{
	return (q->o.stop && atomic_load_explicit(q->o.stop, memory_order_relaxed)) ||
	       atomic_load_explicit(&q->given_up, memory_order_relaxed);
}

void queue_give_up(struct queue *q)
{
	if (q)
		atomic_store_explicit(&q->given_up, 1, memory_order_relaxed);
}

void queue_refused(struct queue *q, const char *id, const char *fmt, ...)
{
	q->st.refused++;
	if (!q->o.on_refused)
		return;
	char why[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	q->o.on_refused(q->o.on_refused_ctx, id, why);
}

void queue_quote(char *out, size_t outsz, const char *s, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	if (!outsz)
		return;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		bool plain = c >= 0x20 && c < 0x7f && c != '\'' && c != '\\';
		size_t need = plain ? 1 : 4;
		/* room for this byte, and for "..." should a later one not fit */
		if (o + need + (i + 1 < len ? 3 : 0) >= outsz) {
			if (o + 3 < outsz)
				memcpy(out + o, "...", 3), o += 3;
			break;
		}
		if (plain) {
			out[o++] = (char)c;
		} else {
			out[o++] = '\\', out[o++] = 'x';
			out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
		}
	}
	out[o] = 0;
}

char *queue_error_result(const struct queue *q, const char *id, enum job_err e, const char *msg,
			 int attempt, size_t *len)
{
	return job_encode_error(id, JOB_FAILED, e, msg, q->consumer, attempt, len);
}
