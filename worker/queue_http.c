/*
 * queue_http.c - http(s)://.../job-take/...: RunPod's serverless job API, through libcurl.
 *
 * The protocol is runpod-python 1.12's (../shared/reference/serverless.md, section 1):
 *   take  GET  TAKE?job_in_progress=0|1                 long-poll; 204 (or 400) = no job,
 *                                                       200 = {"id", "input", ...}
 *         GET  TAKE with /job-take/ -> /job-take-batch/ and &batch_size=N (N = the free slots,
 *              when more than one): 200 = [{"id", "input"}, ...]
 *   done  POST DONE?isStream=false  {"output": RESULT}, or for a job that did not complete
 *              {"error": "CODE: MESSAGE", "output": RESULT} (a string error: RunPod shows an
 *              error object, or a missing one, as COMPLETED: runpod-python#299, #309)
 *   ping  GET  PING?job_id=ID,ID,...&runpod_version=V  every RUNPOD_PING_INTERVAL ms (10000)
 *   stop  GET  TAKE with /job-take/ -> /job-stop/       long-poll; 200 = {"jobsToStop": [ids]}
 *   stream POST STREAM?isStream=false  {"output": {"text": "..."}} (a job with "stream": true)
 * TAKE is the --queue URL; DONE and PING come from queue_opts (--done-url, --ping-url), else
 * RUNPOD_WEBHOOK_POST_OUTPUT and RUNPOD_WEBHOOK_PING. "$ID" and "$RUNPOD_POD_ID" become the
 * worker id (RUNPOD_POD_ID when set, else the consumer name), except "$ID" in DONE, which
 * becomes the job id. RUNPOD_AI_API_KEY goes as it is into an Authorization header on every
 * call (no "Bearer", like runpod-python) and is never printed. RESULT is wick's result JSON
 * (job.h); RunPod's job input becomes wick's job as queue_http_decode_take says
 * (queue_impl.h).
 *
 * Streaming (STREAM from --stream-url, else RUNPOD_WEBHOOK_POST_STREAM; "$ID" the job id): a
 * job whose input has "stream": true has its text posted as it is made, each piece as
 * {"output": {"text": PIECE}}, which RunPod's /stream/ID hands to its client, as
 * runpod-python posts what a generator handler yields. One post a job is in flight at a
 * time; text made meanwhile goes in the next, so the pieces follow the network's pace and
 * arrive in order. A failed piece is retried with backoff for STREAM_RETRY_S (reconnect_s if
 * less); after that, or after a refusal, the job's stream ends there (noted once) and its
 * text is still whole in the result. The job-done post waits until the job's pieces were
 * answered (so the result never overtakes them) and goes with isStream=true, as a
 * generator's does; its output is the whole result, as for a job that did not stream
 * (runpod-python posts a list of the pieces, or an empty one, there).
 *
 * Threads: each handle has one network thread that runs every transfer on a curl multi
 * handle: the take long-poll (asking for the free slots the last queue_take reported; its
 * jobs wait in a buffer for the next queue_take), the stop long-poll (while jobs are held),
 * the pings, and the job-done posts that queue_complete and queue_release hand it and wait
 * for. The caller's thread blocks on the network only inside those two. Shared state is
 * under one mutex; the caller wakes the thread with curl_multi_wakeup. queue_complete may
 * be called from a second thread while the first takes, streams and checks (the worker's
 * committer posts results beside its engine's steps).
 *
 * Delivery: a job is held from its take until its job-done post ends, and every ping lists
 * the held ids: that is the lease a RunPod-like platform keeps (a job it handed out that
 * stops appearing in pings, without a result, belongs to a dead worker). Posts are retried
 * with backoff (network errors, 408, 429, 5xx) for up to reconnect_s. A result the server
 * refuses (another 4xx, e.g. too large) is replaced by {"error": "internal: ..."}, so a job
 * never ends COMPLETED without its output. After a post's last try the job leaves the pings
 * either way. Release (drain) posts {"error": "released: ...", "retry": true}: a server that
 * honours "retry" (tests/tools/runpod_server.py) queues the job again; RunPod itself records
 * a failure, which its /retry runs again, and the job is gone from the pings (a release post
 * retries for CLOSE_GRACE_S at most, once after one has failed: a drain must not hang on a
 * dead server). A stop signal
 * (jobsToStop) marks a held job cancelled for queue_check_cancel. At close a take long-poll
 * that has not started answering is dropped, jobs that arrive later or still sit in the
 * buffer are released, and posts still failing after CLOSE_GRACE_S are abandoned.
 * Stats: syncs counts job-done posts answered 2xx; reconnects, job-takes that worked again
 * after failing.
 */
#include "worker/queue_impl.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/wk.h"

#define POLL_S 90             /* a long-poll (take, stop) held longer is a dead server (runpod-python: 90) */
#define POST_TIMEOUT_S 30     /* one job-done attempt */
#define CONNECT_TIMEOUT_S 10
#define CLOSE_GRACE_S 5.0     /* close waits this long for the last posts; a release post
				* retries this long at most (the pings let the job go anyway) */
#define HOST_CONNECTIONS 16   /* parallel connections to one host; more transfers wait in curl */
#define TAKE_FLOOR_S 0.25     /* at most one empty take per this long (a server that does not hold the poll) */
#define STOP_FLOOR_S 1.0      /* between empty stop polls (runpod-python: 1 s) */
#define BACKOFF_MIN_S 0.1
#define TAKE_BACKOFF_MAX_S 5.0
#define TAKE_QUIET_S 2.0     /* takes failing this long (reconnect_s if less) are reported */
#define POST_BACKOFF_MAX_S 2.0
#define TOO_MANY_S 5.0        /* after a 429 (runpod-python's debounce) */
#define NO_STOP_S 30.0        /* after a 404 from job-stop: a server without the stop channel */
#define URL_MAX 8192          /* bytes of a configured URL */
#define PING_IDS_MAX 65536    /* bytes of the ping's job_id list (runpod-python's mirror: 64 KiB) */
#define SMALL_RESP 65536      /* bytes kept of a ping, stop or done answer */
#define TAKE_RESP_MAX (1024ull << 20)
#define RUNPOD_VERSION "wick-1"
#define STREAM_RETRY_S 10.0   /* how long a piece of a stream is retried */

/* ---- URLs and bodies: pure ---- */

static void sb_add(struct wk_buf *b, const char *s, size_t n) { wk_buf_add(b, s, n); }

static void sb_esc(struct wk_buf *b, const char *s)
{
	char *e = curl_easy_escape(NULL, s, 0);
	if (!e) {
		b->oom = true;
		return;
	}
	sb_add(b, e, strlen(e));
	curl_free(e);
}

char *queue_http_url(const char *tmpl, const char *worker, const char *job, const char *query)
{
	struct wk_buf b = {0};
	static const char pod[] = "$RUNPOD_POD_ID", idv[] = "$ID";
	for (const char *p = tmpl; *p;) {
		if (!strncmp(p, pod, sizeof pod - 1)) {
			sb_esc(&b, worker);
			p += sizeof pod - 1;
		} else if (!strncmp(p, idv, sizeof idv - 1)) {
			sb_esc(&b, job ? job : worker);
			p += sizeof idv - 1;
		} else {
			sb_add(&b, p++, 1);
		}
	}
	sb_add(&b, "", 0);
	if (query && *query && !b.oom) {
		char last = b.len ? b.p[b.len - 1] : 0;
		if (last != '?' && last != '&')
			sb_add(&b, strchr(b.p, '?') ? "&" : "?", 1);
		sb_add(&b, query, strlen(query));
	}
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* tmpl with its first `from` replaced by `to`; NULL when from is not in it (or no memory). */
static char *replace_first(const char *tmpl, const char *from, const char *to)
{
	const char *at = strstr(tmpl, from);
	if (!at)
		return NULL;
	struct wk_buf b = {0};
	sb_add(&b, tmpl, (size_t)(at - tmpl));
	sb_add(&b, to, strlen(to));
	sb_add(&b, at + strlen(from), strlen(at + strlen(from)));
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

static void set_why(struct queue_http_job *x, int kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_why(struct queue_http_job *x, int kind, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->why, sizeof x->why, fmt, ap);
	va_end(ap);
	x->kind = kind;
}

/* One element of a take body. WK_OK or WK_ENOMEM. */
static int decode_one(const json_t *v, size_t max_body, struct queue_http_job *x)
{
	if (!json_is_object(v)) {
		set_why(x, QUEUE_HTTP_JOB_NO_ID, "a job that is not a JSON object");
		return WK_OK;
	}
	const json_t *id = json_object_get(v, "id");
	if (!json_is_string(id)) {
		set_why(x, QUEUE_HTTP_JOB_NO_ID, "a job without a string \"id\"");
		return WK_OK;
	}
	const char *s = json_string_value(id);
	size_t sl = json_string_length(id);
	if (sl == 0 || sl > QUEUE_HTTP_RAW_ID_MAX || memchr(s, 0, sl)) {
		set_why(x, QUEUE_HTTP_JOB_NO_ID, "a job id of %zu bytes (1 to %d, no NUL)", sl,
			QUEUE_HTTP_RAW_ID_MAX);
		return WK_OK;
	}
	memcpy(x->id, s, sl);
	x->id[sl] = 0;
	if (!job_id_valid(x->id)) {
		set_why(x, QUEUE_HTTP_JOB_BAD_ID, "job id '%.60s%s' must match [A-Za-z0-9._-]{1,%d}",
			x->id, sl > 60 ? "..." : "", JOB_ID_MAX);
		return WK_OK;
	}
	json_t *in = json_object_get(v, "input");
	if (!in) {
		set_why(x, QUEUE_HTTP_JOB_BAD_INPUT, "the job has no \"input\"");
		return WK_OK;
	}
	if (!json_is_object(in)) {
		set_why(x, QUEUE_HTTP_JOB_BAD_INPUT, "\"input\" must be an object");
		return WK_OK;
	}
	json_t *job;
	if (json_is_object(json_object_get(in, "input"))) {
		job = json_copy(in); /* a whole wick job: shallow, only "id" changes */
	} else {
		job = json_object();
		static const char *const lift[] = {"tenant", "timeout_s"};
		if (job)
			for (size_t i = 0; i < sizeof lift / sizeof *lift; i++) {
				json_t *m = json_object_get(in, lift[i]);
				if (m && json_object_set(job, lift[i], m))
					goto oom;
			}
		if (job && json_object_set(job, "input", in))
			goto oom;
	}
	if (!job || json_object_set_new(job, "id", json_stringn(x->id, sl)))
		goto oom;
	x->body = json_dumps(job, JSON_COMPACT);
	json_decref(job);
	if (!x->body)
		return WK_ENOMEM;
	x->len = strlen(x->body);
	if (x->len > max_body) {
		set_why(x, QUEUE_HTTP_JOB_TOO_BIG, "the job has %zu bytes; the limit is %zu", x->len,
			max_body);
		free(x->body);
		x->body = NULL;
		return WK_OK;
	}
	x->kind = QUEUE_HTTP_JOB_OK;
	return WK_OK;
oom:
	json_decref(job);
	return WK_ENOMEM;
}

void queue_http_jobs_free(struct queue_http_job *jobs, int n)
{
	for (int i = 0; jobs && i < n; i++)
		free(jobs[i].body);
	free(jobs);
}

int queue_http_decode_take(const char *body, size_t len, size_t max_body,
			   struct queue_http_job **jobs, int *n, char *err, size_t errsz)
{
	*jobs = NULL;
	*n = 0;
	size_t i = 0;
	while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
		i++;
	if (i == len)
		return WK_OK;
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &je);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "job-take answered something that is not JSON "
			       "(%s, at byte %d)", je.text, je.position);
	int rc = WK_OK;
	size_t cnt = json_is_array(root) ? json_array_size(root) : json_is_object(root) ? 1 : 0;
	if (!json_is_array(root) && !json_is_object(root) && !json_is_null(root))
		rc = wk_errf(err, errsz, WK_EFORMAT, "job-take answered a JSON %s, not a job or a "
			     "list of jobs", json_is_string(root) ? "string" : json_is_boolean(root) ? "boolean" : "number");
	else if (cnt > QUEUE_HTTP_TAKE_MAX)
		rc = wk_errf(err, errsz, WK_ELIMIT, "job-take answered %zu jobs; the limit is %d", cnt,
			     QUEUE_HTTP_TAKE_MAX);
	struct queue_http_job *out = NULL;
	if (rc == WK_OK && cnt > 0 && !(out = calloc(cnt, sizeof *out)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (size_t k = 0; rc == WK_OK && k < cnt; k++)
		if (decode_one(json_is_array(root) ? json_array_get(root, k) : root, max_body,
			       &out[k]) != WK_OK)
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	json_decref(root);
	if (rc != WK_OK) {
		queue_http_jobs_free(out, (int)cnt);
		return rc;
	}
	*jobs = out;
	*n = (int)cnt;
	return WK_OK;
}

/* {"output": RESULT} for COMPLETED, else {"error": "CODE: MESSAGE", "output": RESULT}. */
static char *done_body(const char *json, size_t len, size_t *out_len)
{
	json_t *res = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
	json_t *o = json_object();
	const char *st = json_string_value(json_object_get(res, "status"));
	char *s = NULL;
	if (!o)
		goto out;
	if (!res || !st) {
		if (json_object_set_new(o, "error", json_string("internal: the worker's result is unreadable")))
			goto out;
	} else {
		if (strcmp(st, "COMPLETED")) {
			const json_t *e = json_object_get(res, "error");
			const char *code = json_string_value(json_object_get(e, "code"));
			const char *msg = json_string_value(json_object_get(e, "message"));
			struct wk_buf b = {0};
			sb_add(&b, code ? code : "internal", strlen(code ? code : "internal"));
			sb_add(&b, ": ", 2);
			sb_add(&b, msg ? msg : st, strlen(msg ? msg : st));
			int bad = b.oom || json_object_set_new(o, "error", json_stringn(b.p, b.len));
			free(b.p);
			if (bad)
				goto out;
		}
		if (json_object_set(o, "output", res))
			goto out;
	}
	s = json_dumps(o, JSON_COMPACT);
out:
	json_decref(o);
	json_decref(res);
	if (s)
		*out_len = strlen(s);
	return s;
}

/* {"error": msg, ...}: retry adds "retry": true. */
static char *error_body(const char *msg, bool retry, size_t *out_len)
{
	json_t *o = json_pack("{s:s}", "error", msg);
	char *s = NULL;
	if (o && (!retry || !json_object_set_new(o, "retry", json_true())))
		s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (s)
		*out_len = strlen(s);
	return s;
}

/* ---- driver state ---- */

enum kind { R_TAKE, R_STOP, R_PING, R_DONE, R_STREAM };

struct req {
	enum kind kind;
	CURL *e;
	struct curl_slist *hdrs; /* owned for R_DONE; the shared GET list otherwise */
	char *url;
	char *resp;              /* the answer, NUL-terminated */
	size_t rn, rcap, rmax;
	bool too_big;            /* the answer passed rmax (take: aborted) */
	bool active;             /* in the multi handle */
	bool answering;          /* a header came: the server has started its answer */
	double started;
	char cerr[CURL_ERROR_SIZE];
	int asked;               /* R_TAKE: jobs asked for */
	/* R_DONE and R_STREAM */
	char id[QUEUE_HTTP_RAW_ID_MAX + 1];
	char *body;
	size_t body_len;
	bool can_fall_back, fell_back, detached, finished;
	long refused;            /* the status that refused the first body */
	double deadline, next_try, delay;
	double since;            /* when it was queued (posts) */
	int rc;
	char err[WK_ERRSZ];
	struct req *next;
};

struct idset {
	char (*v)[JOB_ID_MAX + 1];
	int n, cap;
};

/* A job that streams: its text not yet posted, and its one piece in flight or waiting to be
 * tried again. */
struct sjob {
	char id[JOB_ID_MAX + 1];
	struct wk_buf pending;
	struct req *post;     /* NULL when none */
	bool dead;            /* the channel failed or refused: nothing more is sent */
	bool over;            /* the job's job-done post ended: the network thread frees it */
	double retry_s;       /* how long a piece is retried (set on the worker's thread, which
			       * owns q->o.reconnect_s) */
	struct sjob *next;
};

struct hq {
	const struct queue *q;
	char worker[256];
	char *take_tmpl, *batch_tmpl, *stop_tmpl, *done_tmpl, *ping_tmpl; /* NULL: none */
	char *stream_tmpl;       /* NULL: no streaming */
	struct curl_slist *get_hdrs;
	char *auth;              /* "Authorization: KEY", NULL without a key */
	double ping_every;
	CURLM *multi;
	pthread_t th;
	bool th_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	/* the rest is under mu */
	bool closing;
	double close_deadline;
	struct queue_job *buf;   /* taken, not yet handed to the worker (FIFO) */
	int nbuf, capbuf;
	int free_slots;          /* the worker's, as of its last queue_take */
	struct idset held, stopped;
	struct req take, stop, ping;
	struct req *posts;       /* job-done posts: pending, in flight or finished */
	struct sjob *sjobs;      /* jobs that stream, until their job-done post ends */
	double take_next, stop_next, ping_next;
	double take_fail_since, take_delay;
	double ping_fail_since;       /* the pings failing since (0: the last one was answered) */
	char ping_err[WK_ERRSZ];
	double release_failed_at; /* a release post's last try failed then: the next try once */
	char take_err[WK_ERRSZ];
	char note[WK_ERRSZ];     /* a one-off problem for the next queue_take that returns nothing */
	uint64_t posts_ok, reconnects, pieces_ok;
	/* q->o.reconnect_s as of the worker's last call: queue_set_reconnect writes that on the
	 * worker's thread, so this thread reads the copy, which calls refresh under mu */
	double reconnect_s;
};

static int ids_find(const struct idset *s, const char *id)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->v[i], id))
			return i;
	return -1;
}

static void ids_add(struct idset *s, const char *id)
{
	if (strlen(id) > JOB_ID_MAX || ids_find(s, id) >= 0)
		return;
	if (s->n == s->cap) {
		int cap = s->cap ? s->cap * 2 : 64;
		void *p = realloc(s->v, (size_t)cap * sizeof *s->v);
		if (!p)
			return; /* costs a ping that misses the id, or a lost stop signal */
		s->v = p;
		s->cap = cap;
	}
	snprintf(s->v[s->n++], sizeof s->v[0], "%s", id);
}

static void ids_del(struct idset *s, const char *id)
{
	int i = ids_find(s, id);
	if (i >= 0 && i != --s->n)
		memcpy(s->v[i], s->v[s->n], sizeof s->v[0]);
}

/* ---- requests (network thread, under mu) ---- */

static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
	(void)p;
	((struct req *)ud)->answering = true;
	return sz * nm;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
	struct req *r = ud;
	size_t n = sz * nm;
	r->answering = true;
	if (r->rn + n > r->rmax) {
		r->too_big = true;
		if (r->kind == R_TAKE)
			return 0; /* abort: the jobs in it cannot be read */
		n = r->rmax - r->rn; /* keep the start of a small answer, drop the rest */
	}
	if (r->rn + n + 1 > r->rcap) {
		size_t cap = r->rcap ? r->rcap : 4096;
		while (cap < r->rn + n + 1)
			cap *= 2;
		char *q = realloc(r->resp, cap);
		if (!q)
			return 0;
		r->resp = q;
		r->rcap = cap;
	}
	memcpy(r->resp + r->rn, p, n);
	r->rn += n;
	r->resp[r->rn] = 0;
	return sz * nm;
}

/* Starts r (its url, hdrs and, for a post, body set). False when curl refused it. */
static bool start(struct hq *h, struct req *r, long timeout_s, size_t rmax)
{
	CURL *e = r->e;
	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, r->url);
	curl_easy_setopt(e, CURLOPT_PRIVATE, r);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->cerr);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "wick");
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	if (r->hdrs)
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
	if (r->kind == R_DONE || r->kind == R_STREAM) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
	}
	r->rn = 0;
	if (r->resp)
		r->resp[0] = 0;
	r->rmax = rmax;
	r->too_big = r->answering = false;
	r->cerr[0] = 0;
	r->started = wk_now();
	if (curl_multi_add_handle(h->multi, e) != CURLM_OK)
		return false;
	r->active = true;
	return true;
}

static void stop_transfer(struct hq *h, struct req *r)
{
	if (r->active)
		curl_multi_remove_handle(h->multi, r->e);
	r->active = false;
}

/* What went wrong with a transfer, for messages: curl's words, or the status. */
static const char *what(const struct req *r, CURLcode cc, long status, char *tmp, size_t n)
{
	if (cc != CURLE_OK)
		snprintf(tmp, n, "%s", r->cerr[0] ? r->cerr : curl_easy_strerror(cc));
	else
		snprintf(tmp, n, "HTTP %ld", status);
	return tmp;
}

static void free_post(struct req *r)
{
	if (r->e)
		curl_easy_cleanup(r->e);
	curl_slist_free_all(r->hdrs);
	free(r->url);
	free(r->body);
	free(r->resp);
	free(r);
}

static void unlink_post(struct hq *h, struct req *r)
{
	for (struct req **p = &h->posts; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			return;
		}
}

static void finish_post(struct hq *h, struct req *r, int rc)
{
	r->finished = true;
	r->rc = rc;
	if (r->detached) {
		if (rc != WK_OK)
			snprintf(h->note, sizeof h->note, "%s", r->err);
		unlink_post(h, r);
		free_post(r);
	} else {
		pthread_cond_broadcast(&h->cv);
	}
}

/* A post for job id with body (owned) to tmpl (the job-done or stream URL) with query, its
 * deadline for the one who queues it to set (under mu). NULL when out of memory (body
 * freed). Any thread: reads only what does not change after open. */
static struct req *new_post_to(struct hq *h, enum kind kind, const char *tmpl, const char *query,
			       const char *id, char *body, size_t len, bool fall_back)
{
	struct req *r = calloc(1, sizeof *r);
	if (!r || !body) {
		free(r);
		free(body);
		return NULL;
	}
	r->kind = kind;
	snprintf(r->id, sizeof r->id, "%s", id);
	r->body = body;
	r->body_len = len;
	r->can_fall_back = fall_back;
	r->url = queue_http_url(tmpl, h->worker, id, query);
	r->e = curl_easy_init();
	/* runpod-python sends the JSON with this content type; X-Request-ID is the job id */
	struct wk_buf rid = {0};
	sb_add(&rid, "X-Request-ID: ", 14);
	sb_esc(&rid, id);
	const char *lines[] = {"Content-Type: application/x-www-form-urlencoded", h->auth,
			       "Expect:" /* no 100-continue round trip */, rid.p};
	bool ok = !rid.oom;
	for (size_t i = 0; ok && i < sizeof lines / sizeof *lines; i++) {
		struct curl_slist *l = lines[i] ? curl_slist_append(r->hdrs, lines[i]) : r->hdrs;
		ok = l != NULL;
		if (ok)
			r->hdrs = l;
	}
	free(rid.p);
	if (!r->url || !r->e || !ok) {
		free_post(r);
		return NULL;
	}
	return r;
}

/* A job-done post (isStream=false: see http_complete for a streaming job's). */
static struct req *new_post(struct hq *h, const char *id, char *body, size_t len, bool fall_back)
{
	return new_post_to(h, R_DONE, h->done_tmpl, "isStream=false", id, body, len, fall_back);
}

/* Answers a job the worker will never see (bad input, surplus, close), in the background. */
static void post_detached(struct hq *h, const char *id, char *body, size_t len)
{
	struct req *r = new_post(h, id, body, len, false);
	if (!r) {
		snprintf(h->note, sizeof h->note, "job %.140s: out of memory answering it", id);
		return;
	}
	r->detached = true;
	r->since = wk_now();
	r->deadline = r->since + h->reconnect_s;
	r->next = h->posts;
	h->posts = r;
}

static void release_detached(struct hq *h, const char *id, const char *why)
{
	char msg[400];
	size_t len = 0;
	snprintf(msg, sizeof msg, "released: worker %s %s; the job may run again", h->worker, why);
	char *body = error_body(msg, true, &len);
	post_detached(h, id, body, len);
}

/* ---- the take long-poll ---- */

/* "WHAT URL: why" into out, the URL tmpl's without its query (a query may carry tokens). */
static void fail_msg(const struct hq *h, char *out, size_t n, const char *what, const char *tmpl,
		     const char *why)
{
	char *u = queue_http_url(tmpl, h->worker, NULL, NULL);
	if (u)
		u[strcspn(u, "?")] = 0;
	snprintf(out, n, "%s %.300s: %s", what, u ? u : "", why);
	free(u);
}

static void take_failed(struct hq *h, const char *why, double delay)
{
	double now = wk_now();
	if (h->take_fail_since == 0)
		h->take_fail_since = now;
	h->take_delay = h->take_delay ? h->take_delay * 2 : BACKOFF_MIN_S;
	if (h->take_delay > TAKE_BACKOFF_MAX_S)
		h->take_delay = TAKE_BACKOFF_MAX_S;
	h->take_next = now + (delay > 0 ? delay : h->take_delay);
	fail_msg(h, h->take_err, sizeof h->take_err, "job-take", h->take_tmpl, why);
}

static void take_ok(struct hq *h)
{
	if (h->take_fail_since)
		h->reconnects++;
	h->take_fail_since = 0;
	h->take_delay = 0;
}

static void start_take(struct hq *h, int want)
{
	struct req *r = &h->take;
	char q[64];
	bool batch = want > 1 && h->batch_tmpl;
	if (batch)
		snprintf(q, sizeof q, "batch_size=%d&job_in_progress=%d", want, h->held.n > 0);
	else
		snprintf(q, sizeof q, "job_in_progress=%d", h->held.n > 0);
	free(r->url);
	r->url = queue_http_url(batch ? h->batch_tmpl : h->take_tmpl, h->worker, NULL, q);
	r->asked = batch ? want : 1;
	uint64_t max = (uint64_t)r->asked * (h->q->o.max_body + 4096) + 65536;
	if (!r->url || !start(h, r, POLL_S, max > TAKE_RESP_MAX ? TAKE_RESP_MAX : (size_t)max))
		take_failed(h, "could not start the request", 1.0);
}

static void took(struct hq *h, struct req *r)
{
	struct queue_http_job *x;
	int n;
	char err[WK_ERRSZ];
	if (queue_http_decode_take(r->resp ? r->resp : "", r->rn, h->q->o.max_body, &x, &n, err,
				   sizeof err) != WK_OK) {
		snprintf(h->note, sizeof h->note, "%.400s; the jobs in it cannot be answered", err);
		return;
	}
	int room = h->free_slots - h->nbuf;
	for (int i = 0; i < n; i++) {
		size_t len = 0;
		switch (x[i].kind) {
		case QUEUE_HTTP_JOB_OK:
			if (ids_find(&h->held, x[i].id) >= 0)
				break; /* sent again while we hold it: one copy runs */
			if (h->closing || room <= 0) {
				release_detached(h, x[i].id, h->closing ? "is closing" : "has no free slot");
				break;
			}
			if (h->nbuf == h->capbuf) {
				int cap = h->capbuf ? h->capbuf * 2 : 16;
				void *p = realloc(h->buf, (size_t)cap * sizeof *h->buf);
				if (!p) {
					release_detached(h, x[i].id, "ran out of memory");
					break;
				}
				h->buf = p;
				h->capbuf = cap;
			}
			struct queue_job *j = &h->buf[h->nbuf++];
			memset(j, 0, sizeof *j);
			snprintf(j->id, sizeof j->id, "%.*s", JOB_ID_MAX, x[i].id); /* valid: fits */
			j->body = x[i].body;
			j->len = x[i].len;
			x[i].body = NULL;
			j->attempt = 1;
			snprintf(j->handle, sizeof j->handle, "runpod");
			ids_add(&h->held, j->id);
			room--;
			break;
		case QUEUE_HTTP_JOB_NO_ID:
			snprintf(h->note, sizeof h->note, "job-take sent %s; it cannot be answered",
				 x[i].why);
			break;
		default: {
			char *res = queue_error_result(h->q, x[i].id, JOB_EINVALID_INPUT, x[i].why, 1, &len);
			char *body = res ? done_body(res, len, &len) : NULL;
			free(res);
			post_detached(h, x[i].id, body, len);
		}
		}
	}
	queue_http_jobs_free(x, n);
	pthread_cond_broadcast(&h->cv);
}

static void take_done(struct hq *h, struct req *r, CURLcode cc, long status)
{
	double now = wk_now();
	char tmp[300];
	if (cc == CURLE_OPERATION_TIMEDOUT && !r->answering) {
		h->take_next = now; /* a long-poll nobody answered: ask again */
	} else if (cc != CURLE_OK) {
		take_failed(h, r->too_big ? "the answer is too large" : what(r, cc, status, tmp, sizeof tmp), 0);
		if (r->answering)
			snprintf(h->note, sizeof h->note, "%.400s (the jobs in the answer cannot be answered)",
				 h->take_err);
	} else if (status == 204 || status == 400) { /* 400: "expected when FlashBoot is enabled" */
		take_ok(h);
		h->take_next = r->started + TAKE_FLOOR_S;
	} else if (status == 429) {
		take_failed(h, "HTTP 429 (too many requests)", TOO_MANY_S);
	} else if (status / 100 != 2) {
		take_failed(h, what(r, cc, status, tmp, sizeof tmp), 0);
	} else {
		take_ok(h);
		int before = h->nbuf;
		took(h, r);
		h->take_next = h->nbuf > before ? now : r->started + TAKE_FLOOR_S;
	}
}

/* ---- the stop long-poll and the ping ---- */

static void stop_done(struct hq *h, struct req *r, CURLcode cc, long status)
{
	double now = wk_now(), floor_at = r->started + STOP_FLOOR_S;
	h->stop_next = floor_at > now ? floor_at : now;
	if (cc == CURLE_OPERATION_TIMEDOUT && !r->answering)
		h->stop_next = now;
	else if (cc != CURLE_OK || status == 429)
		h->stop_next = now + (status == 429 ? TOO_MANY_S : STOP_FLOOR_S);
	else if (status == 404)
		h->stop_next = now + NO_STOP_S;
	else if (status / 100 == 2 && status != 204 && r->rn && !r->too_big) {
		json_t *o = json_loadb(r->resp, r->rn, 0, NULL);
		const json_t *ids = json_object_get(o, "jobsToStop");
		size_t i;
		const json_t *v;
		json_array_foreach(ids, i, v)
			if (json_is_string(v) && ids_find(&h->held, json_string_value(v)) >= 0) {
				ids_add(&h->stopped, json_string_value(v));
				h->stop_next = now;
			}
		json_decref(o);
	}
}

static void start_ping(struct hq *h)
{
	struct req *r = &h->ping;
	struct wk_buf q = {0};
	if (h->held.n > 0) {
		sb_add(&q, "job_id=", 7);
		for (int i = 0; i < h->held.n; i++) {
			size_t l = strlen(h->held.v[i]);
			if (q.len + l + 1 > PING_IDS_MAX)
				break; /* like runpod-python's 64 KiB mirror */
			if (i)
				sb_add(&q, ",", 1);
			sb_add(&q, h->held.v[i], l);
		}
		sb_add(&q, "&", 1);
	}
	sb_add(&q, "runpod_version=" RUNPOD_VERSION, strlen("runpod_version=" RUNPOD_VERSION));
	free(r->url);
	r->url = q.oom ? NULL : queue_http_url(h->ping_tmpl, h->worker, NULL, q.p);
	free(q.p);
	long timeout = (long)(2 * h->ping_every + 0.999); /* runpod-python: twice the interval */
	if (r->url)
		start(h, r, timeout < 1 ? 1 : timeout, SMALL_RESP);
}

/* A ping answered or failed: a failure is tried again soon, not a whole interval later, and
 * its time counted for http_check_cancel. */
static void ping_done(struct hq *h, struct req *r, CURLcode cc, long status)
{
	double now = wk_now();
	if (cc == CURLE_OK && status / 100 == 2) {
		h->ping_fail_since = 0;
		return;
	}
	double soon = now + (h->ping_every < 1 ? h->ping_every : 1);
	if (soon < h->ping_next)
		h->ping_next = soon;
	if (!h->ping_fail_since)
		h->ping_fail_since = now;
	char tmp[300];
	fail_msg(h, h->ping_err, sizeof h->ping_err, "ping", h->ping_tmpl,
		 what(r, cc, status, tmp, sizeof tmp));
}

/* The platform unreachable: the takes or the pings failing for TAKE_QUIET_S (reconnect_s if
 * less), their error into err; WK_OK otherwise. Reported on every take and cancel check while
 * it lasts, so that the caller's outage clock runs whichever it calls (an OK from the other
 * would say "recovered"). Under mu. */
static int unreachable(struct hq *h, char *err, size_t errsz)
{
	double now = wk_now(), quiet = fmin(h->q->o.reconnect_s, TAKE_QUIET_S);
	if (h->take_fail_since && now - h->take_fail_since > quiet)
		return wk_errf(err, errsz, WK_EIO, "%s (failing for %.0f s)", h->take_err,
			       now - h->take_fail_since);
	if (h->ping_fail_since && now - h->ping_fail_since > quiet)
		return wk_errf(err, errsz, WK_EIO, "%s (failing for %.0f s)", h->ping_err,
			       now - h->ping_fail_since);
	return WK_OK;
}

/* ---- job-done posts ---- */

/* queue_give_up was called: a post that failed is not tried again. (A signal alone is not
 * enough: a drain's results and hand-backs keep their retries.) */
static bool given_up(const struct hq *h)
{
	return atomic_load_explicit(&h->q->given_up, memory_order_relaxed);
}

/* A failed post: 1 when it is tried again later (a network error, 408, 429 or 5xx, with
 * backoff until its deadline or the close's), 0 when such a failure ran out of time, -1 when
 * the server refused it. */
static int backoff(struct hq *h, struct req *r, CURLcode cc, long status)
{
	double now = wk_now();
	if (!(cc != CURLE_OK || status == 408 || status == 429 || status >= 500))
		return -1;
	r->delay = r->delay ? r->delay * 2 : BACKOFF_MIN_S;
	if (r->delay > POST_BACKOFF_MAX_S)
		r->delay = POST_BACKOFF_MAX_S;
	if (now + r->delay >= r->deadline || (h->closing && now > h->close_deadline) ||
	    given_up(h))
		return 0;
	r->next_try = now + r->delay;
	return 1;
}

static void post_done(struct hq *h, struct req *r, CURLcode cc, long status)
{
	double now = wk_now();
	char tmp[300];
	if (cc == CURLE_OK && status / 100 == 2) {
		h->posts_ok++;
		if (r->fell_back)
			snprintf(r->err, sizeof r->err, "job %.140s: job-done refused the result (HTTP %ld); "
				 "it was reported FAILED (internal) instead", r->id, r->refused);
		finish_post(h, r, r->fell_back ? WK_EFORMAT : WK_OK);
		return;
	}
	int b = backoff(h, r, cc, status);
	if (b > 0)
		return;
	if (b == 0) {
		snprintf(r->err, sizeof r->err, "job %.140s: job-done failed for %.1f s: %.250s", r->id,
			 now - r->since, what(r, cc, status, tmp, sizeof tmp));
		finish_post(h, r, WK_EIO);
		return;
	}
	if (r->can_fall_back && !r->fell_back) {
		/* refused (too large, malformed, ...): the job must still end, as a failure */
		char msg[200];
		size_t len = 0;
		snprintf(msg, sizeof msg, "internal: job-done refused the result (HTTP %ld)", status);
		char *b = error_body(msg, false, &len);
		if (b) {
			free(r->body);
			r->body = b;
			r->body_len = len;
			r->fell_back = true;
			r->refused = status;
			r->next_try = now;
			return;
		}
	}
	snprintf(r->err, sizeof r->err, "job %.140s: job-done answered HTTP %ld%s", r->id, status,
		 r->fell_back ? " (also to the FAILED replacement)" : "");
	finish_post(h, r, WK_EIO);
}

/* ---- streams ---- */

/* Job id's stream, while its job runs; NULL when it does not stream. */
static struct sjob *sjob_find(struct hq *h, const char *id)
{
	for (struct sjob *s = h->sjobs; s; s = s->next)
		if (!s->over && !strcmp(s->id, id))
			return s;
	return NULL;
}

/* Whether job id still has pieces to post: its job-done post waits for them. */
static bool stream_busy(struct hq *h, const char *id)
{
	struct sjob *s = sjob_find(h, id);
	return s && !s->dead && (s->post || s->pending.len);
}

static void drop_piece(struct hq *h, struct sjob *s)
{
	if (s->post) {
		stop_transfer(h, s->post);
		free_post(s->post);
		s->post = NULL;
	}
}

/* The job's stream ends here (said once, through the note); its result is whole anyway. */
static void stream_dead(struct hq *h, struct sjob *s, const char *why)
{
	drop_piece(h, s);
	free(s->pending.p);
	s->pending = (struct wk_buf){0};
	s->dead = true;
	snprintf(h->note, sizeof h->note, "job %.140s: its stream stopped (%.250s); its whole text "
		 "is in its result", s->id, why);
}

static void stream_done(struct hq *h, struct req *r, CURLcode cc, long status)
{
	struct sjob *s = h->sjobs;
	while (s && s->post != r)
		s = s->next;
	if (!s) { /* not expected: a piece always belongs to its job's stream */
		free_post(r);
		return;
	}
	char tmp[300];
	if (cc == CURLE_OK && status / 100 == 2) {
		h->pieces_ok++;
		drop_piece(h, s);
	} else if (backoff(h, r, cc, status) <= 0) {
		stream_dead(h, s, what(r, cc, status, tmp, sizeof tmp));
	}
}

/* Starts each stream's next piece, frees the streams of finished jobs, and lowers *next to
 * the earliest retry. */
static void schedule_streams(struct hq *h, double now, double *next)
{
	for (struct sjob **p = &h->sjobs; *p;) {
		struct sjob *s = *p;
		bool closed = h->closing && (now > h->close_deadline || !s->post || !s->post->active);
		if (s->over || closed) {
			*p = s->next;
			drop_piece(h, s);
			free(s->pending.p);
			free(s);
			continue;
		}
		p = &s->next;
		if (!s->dead && !s->post && s->pending.len) {
			size_t len = 0;
			char *body = s->pending.oom ? NULL
				     : job_stream_chunk(s->pending.p, s->pending.len, 0, &len);
			free(s->pending.p);
			s->pending = (struct wk_buf){0};
			s->post = new_post_to(h, R_STREAM, h->stream_tmpl, "isStream=false", s->id, body,
					      len, false);
			if (!s->post) {
				stream_dead(h, s, "out of memory");
				continue;
			}
			s->post->deadline = now + s->retry_s;
		}
		if (!s->post || s->post->active)
			continue;
		if (now >= s->post->next_try) {
			if (!start(h, s->post, POST_TIMEOUT_S, SMALL_RESP))
				stream_dead(h, s, "could not start the post");
		} else if (s->post->next_try < *next) {
			*next = s->post->next_try;
		}
	}
}

/* ---- the network thread ---- */

/* Starts what is due and says how long to sleep. True when the thread should end. */
static bool schedule(struct hq *h, double now, int *wait_ms)
{
	double next = now + 1.0;
	if (h->closing) {
		if (h->take.active && !h->take.answering)
			stop_transfer(h, &h->take);
		stop_transfer(h, &h->stop);
		stop_transfer(h, &h->ping);
		if (now > h->close_deadline) {
			stop_transfer(h, &h->take);
			while (h->posts) {
				struct req *r = h->posts;
				stop_transfer(h, r);
				snprintf(r->err, sizeof r->err, "job %.140s: job-done abandoned at close", r->id);
				if (!r->detached) /* not expected: close and complete share a thread */
					unlink_post(h, r);
				finish_post(h, r, WK_EIO);
			}
		}
		schedule_streams(h, now, &next);
		if (!h->take.active && !h->posts && !h->sjobs)
			return true;
		if (h->close_deadline < next)
			next = h->close_deadline;
	} else {
		int want = h->free_slots - h->nbuf;
		if (!h->take.active && want > 0) {
			if (now >= h->take_next)
				start_take(h, want);
			else if (h->take_next < next)
				next = h->take_next;
		}
		if (h->stop_tmpl && !h->stop.active && h->held.n > 0) {
			if (now >= h->stop_next) {
				free(h->stop.url);
				h->stop.url = queue_http_url(h->stop_tmpl, h->worker, NULL, NULL);
				if (!h->stop.url || !start(h, &h->stop, POLL_S, SMALL_RESP))
					h->stop_next = now + STOP_FLOOR_S;
			} else if (h->stop_next < next) {
				next = h->stop_next;
			}
		}
		if (h->ping_tmpl) {
			if (now >= h->ping_next && !h->ping.active) {
				h->ping_next = now + h->ping_every;
				start_ping(h);
			}
			if (h->ping_next < next)
				next = h->ping_next;
		}
		schedule_streams(h, now, &next);
	}
	for (struct req *r = h->posts; r; r = r->next) {
		if (r->active || r->finished || stream_busy(h, r->id))
			continue;
		if (r->delay > 0 && given_up(h)) { /* waiting to try again: no more */
			snprintf(r->err, sizeof r->err, "job %.140s: job-done given up after %.1f s "
				 "(the worker gave up on the queue)", r->id, now - r->since);
			finish_post(h, r, WK_EIO);
			break; /* the list may have changed */
		}
		if (now >= r->next_try) {
			if (!start(h, r, POST_TIMEOUT_S, SMALL_RESP)) {
				snprintf(r->err, sizeof r->err, "job %.140s: could not start the job-done post", r->id);
				finish_post(h, r, WK_EIO);
				break; /* the list may have changed */
			}
		} else if (r->next_try < next) {
			next = r->next_try;
		}
	}
	double ms = (next - now) * 1000 + 1;
	*wait_ms = ms < 0 ? 0 : ms > 1000 ? 1000 : (int)ms;
	return false;
}

static void *net_main(void *arg)
{
	struct hq *h = arg;
	pthread_mutex_lock(&h->mu);
	for (;;) {
		int wait_ms = 0, running = 0;
		if (schedule(h, wk_now(), &wait_ms))
			break;
		pthread_mutex_unlock(&h->mu);
		curl_multi_perform(h->multi, &running);
		curl_multi_poll(h->multi, NULL, 0, wait_ms, NULL);
		curl_multi_perform(h->multi, &running);
		pthread_mutex_lock(&h->mu);
		CURLMsg *m;
		int left;
		while ((m = curl_multi_info_read(h->multi, &left))) {
			if (m->msg != CURLMSG_DONE)
				continue;
			CURL *e = m->easy_handle;
			CURLcode cc = m->data.result;
			struct req *r = NULL;
			long status = 0;
			curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&r);
			curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
			curl_multi_remove_handle(h->multi, e);
			r->active = false;
			switch (r->kind) {
			case R_TAKE: take_done(h, r, cc, status); break;
			case R_STOP: stop_done(h, r, cc, status); break;
			case R_PING: ping_done(h, r, cc, status); break;
			case R_DONE: post_done(h, r, cc, status); break;
			case R_STREAM: stream_done(h, r, cc, status); break;
			}
		}
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* ---- open / close ---- */

static void wake(struct hq *h)
{
	curl_multi_wakeup(h->multi);
}

static void http_close(struct queue *q)
{
	struct hq *h = q->impl;
	if (!h)
		return;
	if (h->th_started) {
		pthread_mutex_lock(&h->mu);
		h->closing = true;
		h->close_deadline = wk_now() + CLOSE_GRACE_S;
		for (int i = 0; i < h->nbuf; i++) {
			release_detached(h, h->buf[i].id, "closed before handing the job out");
			queue_job_free(&h->buf[i]);
		}
		h->nbuf = 0;
		wake(h);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->th, NULL);
	}
	for (struct req *r = h->posts, *next; r; r = next) { /* none unless the thread never ran */
		next = r->next;
		free_post(r);
	}
	for (struct sjob *s = h->sjobs, *next; s; s = next) {
		next = s->next;
		drop_piece(h, s);
		free(s->pending.p);
		free(s);
	}
	struct req *fixed[] = {&h->take, &h->stop, &h->ping};
	for (int i = 0; i < 3; i++) {
		if (fixed[i]->e) {
			stop_transfer(h, fixed[i]);
			curl_easy_cleanup(fixed[i]->e);
		}
		free(fixed[i]->url);
		free(fixed[i]->resp);
	}
	if (h->multi)
		curl_multi_cleanup(h->multi);
	for (int i = 0; i < h->nbuf; i++)
		queue_job_free(&h->buf[i]);
	free(h->buf);
	free(h->held.v);
	free(h->stopped.v);
	curl_slist_free_all(h->get_hdrs);
	free(h->auth);
	free(h->take_tmpl);
	free(h->batch_tmpl);
	free(h->stop_tmpl);
	free(h->done_tmpl);
	free(h->ping_tmpl);
	free(h->stream_tmpl);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	free(h);
	q->impl = NULL;
}

/* A configured URL: http(s), at most URL_MAX bytes, no spaces or control characters. */
int queue_http_check_url(const char *what_, const char *u, char *err, size_t errsz)
{
	if (strncmp(u, "http://", 7) && strncmp(u, "https://", 8))
		return wk_errf(err, errsz, WK_EINVAL, "the %s URL must start with http:// or https://",
			       what_);
	if (strlen(u) > URL_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "the %s URL is longer than %d bytes", what_, URL_MAX);
	for (const unsigned char *p = (const unsigned char *)u; *p; p++)
		if (*p <= ' ' || *p == 0x7f)
			return wk_errf(err, errsz, WK_EINVAL, "the %s URL contains a space or a control "
				       "character", what_);
	return WK_OK;
}

static char *dup_str(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = malloc(n);
	if (p)
		memcpy(p, s, n);
	return p;
}

static int http_open(struct queue *q, const char *url, char *err, size_t errsz)
{
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		return wk_errf(err, errsz, WK_EIO, "libcurl did not initialise");
	struct hq *h = calloc(1, sizeof *h);
	if (!h)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	q->impl = h;
	h->q = q;
	h->reconnect_s = q->o.reconnect_s;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, &ca);
	pthread_condattr_destroy(&ca);
	int rc = WK_OK;
	const char *pod = getenv("RUNPOD_POD_ID");
	snprintf(h->worker, sizeof h->worker, "%s", pod && *pod ? pod : q->consumer);
	const char *done = q->o.done_url && *q->o.done_url ? q->o.done_url : getenv("RUNPOD_WEBHOOK_POST_OUTPUT");
	const char *ping = q->o.ping_url && *q->o.ping_url ? q->o.ping_url : getenv("RUNPOD_WEBHOOK_PING");
	const char *stream = q->o.stream_url && *q->o.stream_url ? q->o.stream_url
				: getenv("RUNPOD_WEBHOOK_POST_STREAM");
	const char *every = getenv("RUNPOD_PING_INTERVAL");
	const char *key = getenv("RUNPOD_AI_API_KEY");
	h->ping_every = 10.0;
	if ((rc = queue_http_check_url("job-take (--queue)", url, err, errsz)) != WK_OK)
		goto fail;
	if (!done || !*done) {
		rc = wk_errf(err, errsz, WK_EINVAL, "%.200s: no job-done URL: give --done-url or set "
			     "RUNPOD_WEBHOOK_POST_OUTPUT", url);
		goto fail;
	}
	if ((rc = queue_http_check_url("job-done", done, err, errsz)) != WK_OK)
		goto fail;
	if (ping && *ping && (rc = queue_http_check_url("ping", ping, err, errsz)) != WK_OK)
		goto fail;
	if (stream && *stream && (rc = queue_http_check_url("stream", stream, err, errsz)) != WK_OK)
		goto fail;
	if (every && *every) {
		char *end;
		long ms = strtol(every, &end, 10);
		if (*end || ms < 1 || ms > 3600000) {
			rc = wk_errf(err, errsz, WK_EINVAL, "RUNPOD_PING_INTERVAL must be milliseconds "
				     "(1 to 3600000), not '%.40s'", every);
			goto fail;
		}
		h->ping_every = (double)ms / 1000.0;
	}
	if (key && *key) {
		if (strpbrk(key, "\r\n")) { /* never echo the key itself */
			rc = wk_errf(err, errsz, WK_EINVAL, "RUNPOD_AI_API_KEY contains a line break");
			goto fail;
		}
		struct wk_buf a = {0};
		sb_add(&a, "Authorization: ", 15);
		sb_add(&a, key, strlen(key));
		if (a.oom)
			goto oom;
		h->auth = a.p;
		if (!(h->get_hdrs = curl_slist_append(NULL, h->auth)))
			goto oom;
	}
	if (!(h->take_tmpl = dup_str(url)) || !(h->done_tmpl = dup_str(done)) ||
	    (ping && *ping && !(h->ping_tmpl = dup_str(ping))) ||
	    (stream && *stream && !(h->stream_tmpl = dup_str(stream))))
		goto oom;
	/* batch take and the stop channel need the standard path; without it, one job per take
	 * and no stop signals */
	h->batch_tmpl = replace_first(url, "/job-take/", "/job-take-batch/");
	h->stop_tmpl = replace_first(url, "/job-take/", "/job-stop/");
	if (!(h->multi = curl_multi_init()) || !(h->take.e = curl_easy_init()) ||
	    !(h->stop.e = curl_easy_init()) || !(h->ping.e = curl_easy_init()))
		goto oom;
	curl_multi_setopt(h->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)HOST_CONNECTIONS);
	h->take.kind = R_TAKE, h->stop.kind = R_STOP, h->ping.kind = R_PING;
	h->take.hdrs = h->stop.hdrs = h->ping.hdrs = h->get_hdrs;
	/* signals go to the worker's own threads, never to this one */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int prc = pthread_create(&h->th, NULL, net_main, h);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (prc != 0) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "could not start the network thread");
		goto fail;
	}
	h->th_started = true;
	return WK_OK;
oom:
	rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
fail:
	http_close(q);
	return rc;
}

/* ---- the worker's side ---- */

static void sync_stats(struct queue *q)
{
	struct hq *h = q->impl;
	q->st.syncs = h->posts_ok;
	q->st.reconnects = h->reconnects;
}

static int http_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n,
		     char *err, size_t errsz)
{
	struct hq *h = q->impl;
	int rc = WK_OK;
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	long long ns = until.tv_nsec + (long long)(wait_s * 1e9);
	until.tv_sec += (time_t)(ns / 1000000000LL);
	until.tv_nsec = (long)(ns % 1000000000LL);
	double deadline = wk_now() + wait_s;
	pthread_mutex_lock(&h->mu);
	h->reconnect_s = q->o.reconnect_s;
	sync_stats(q);
	for (;;) {
		int k = h->nbuf < max - *n ? h->nbuf : max - *n;
		for (int i = 0; i < k; i++) {
			jobs[*n] = h->buf[i];
			jobs[*n].cancelled = ids_find(&h->stopped, jobs[*n].id) >= 0;
			(*n)++;
		}
		if (k > 0)
			memmove(h->buf, h->buf + k, (size_t)(h->nbuf - k) * sizeof *h->buf);
		h->nbuf -= k;
		if (h->free_slots != max - *n) {
			h->free_slots = max - *n;
			wake(h);
		}
		if (*n > 0 || wk_now() >= deadline)
			break;
		if (pthread_cond_timedwait(&h->cv, &h->mu, &until) != 0 && h->nbuf == 0)
			break;
	}
	if (*n == 0 && h->note[0]) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s", h->note);
		h->note[0] = 0;
	} else if (*n == 0) {
		rc = unreachable(h, err, errsz);
	}
	pthread_mutex_unlock(&h->mu);
	return rc;
}

/* Posts, waits for every one to end, and forgets the jobs (held, stopped). Each is tried
 * for the reconnect budget, cap_s at most. rcs[i] per job; returns the first failure with
 * its message. posts[i] may be NULL (out of memory). Called from the worker's thread and its
 * committer's, at once. */
static int post_and_wait(struct hq *h, struct req **posts, struct queue_job **jobs, int n,
			 double cap_s, int *rcs, char *err, size_t errsz)
{
	int rc = WK_OK;
	pthread_mutex_lock(&h->mu);
	h->reconnect_s = h->q->o.reconnect_s;
	double now = wk_now(), budget = h->reconnect_s < cap_s ? h->reconnect_s : cap_s;
	for (int i = 0; i < n; i++)
		if (posts[i]) {
			posts[i]->since = now;
			posts[i]->deadline = now + budget;
			posts[i]->next = h->posts;
			h->posts = posts[i];
		}
	wake(h);
	for (;;) {
		bool all = true;
		for (int i = 0; i < n && all; i++)
			all = !posts[i] || posts[i]->finished;
		if (all)
			break;
		pthread_cond_wait(&h->cv, &h->mu);
	}
	for (int i = 0; i < n; i++) {
		rcs[i] = posts[i] ? posts[i]->rc : WK_ENOMEM;
		if (rcs[i] != WK_OK && rc == WK_OK)
			rc = posts[i] ? wk_errf(err, errsz, rcs[i], "%s", posts[i]->err)
				      : wk_errf(err, errsz, WK_ENOMEM, "job %s: out of memory", jobs[i]->id);
		ids_del(&h->held, jobs[i]->id);
		ids_del(&h->stopped, jobs[i]->id);
		struct sjob *sj = sjob_find(h, jobs[i]->id);
		if (sj)
			sj->over = true; /* freed by the network thread, which owns its transfer */
		if (posts[i]) {
			unlink_post(h, posts[i]);
			free_post(posts[i]);
		}
	}
	wake(h);
	pthread_mutex_unlock(&h->mu);
	return rc;
}

static int http_complete_within(struct queue *q, struct queue_result *res, int n, double budget_s,
				char *err, size_t errsz)
{
	struct hq *h = q->impl;
	struct req **posts = calloc((size_t)n, sizeof *posts);
	struct queue_job **jobs = calloc((size_t)n, sizeof *jobs);
	int *rcs = calloc((size_t)n, sizeof *rcs);
	if (!posts || !jobs || !rcs) {
		free(posts), free(jobs), free(rcs);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		size_t len = 0;
		char *body = done_body(res[i].json, res[i].len, &len);
		jobs[i] = res[i].job;
		pthread_mutex_lock(&h->mu);
		bool streamed = sjob_find(h, res[i].job->id) != NULL;
		pthread_mutex_unlock(&h->mu);
		/* a streaming job's end, as runpod-python posts a generator's */
		posts[i] = new_post_to(h, R_DONE, h->done_tmpl, streamed ? "isStream=true"
				       : "isStream=false", res[i].job->id, body, len, true);
	}
	int rc = post_and_wait(h, posts, jobs, n, budget_s, rcs, err, errsz);
	for (int i = 0; i < n; i++) {
		res[i].rc = rcs[i];
		res[i].replaced = rcs[i] == WK_EFORMAT; /* post_done: the FAILED fallback stood */
	}
	pthread_mutex_lock(&h->mu);
	sync_stats(q);
	pthread_mutex_unlock(&h->mu);
	free(posts), free(jobs), free(rcs);
	return rc;
}

static int http_complete(struct queue *q, struct queue_result *res, int n, char *err, size_t errsz)
{
	return http_complete_within(q, res, n, HUGE_VAL, err, errsz);
}

static int http_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc,
		       char *err, size_t errsz)
{
	/* nothing to call: the pings keep held jobs alive */
	(void)q, (void)jobs, (void)lease_s, (void)err, (void)errsz;
	for (int i = 0; rc && i < n; i++)
		rc[i] = WK_OK;
	return WK_OK;
}

static int http_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	struct hq *h = q->impl;
	struct req **posts = calloc((size_t)n, sizeof *posts);
	struct queue_job **jp = calloc((size_t)n, sizeof *jp);
	int *rcs = calloc((size_t)n, sizeof *rcs);
	if (!posts || !jp || !rcs) {
		free(posts), free(jp), free(rcs);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	/* a drain must not hang on a dead server: the job leaves the pings either way */
	pthread_mutex_lock(&h->mu);
	double grace = h->release_failed_at && wk_now() - h->release_failed_at < 10 ? 0
										      : CLOSE_GRACE_S;
	pthread_mutex_unlock(&h->mu);
	for (int i = 0; i < n; i++) {
		char msg[400];
		size_t len = 0;
		snprintf(msg, sizeof msg, "released: worker %s stopped before the job finished "
			 "(drain); the job may run again", h->worker);
		jp[i] = &jobs[i];
		char *body = error_body(msg, true, &len);
		posts[i] = new_post(h, jobs[i].id, body, len, false);
	}
	int rc = post_and_wait(h, posts, jp, n, grace, rcs, err, errsz);
	if (rc != WK_OK) {
		pthread_mutex_lock(&h->mu);
		h->release_failed_at = wk_now();
		pthread_mutex_unlock(&h->mu);
	}
	free(posts), free(jp), free(rcs);
	return rc;
}

static bool http_streams(const struct queue *q)
{
	return ((const struct hq *)q->impl)->stream_tmpl != NULL;
}

static void http_stream(struct queue *q, const struct queue_job *j, const char *text, size_t len)
{
	struct hq *h = q->impl;
	pthread_mutex_lock(&h->mu);
	h->reconnect_s = q->o.reconnect_s;
	struct sjob *s = sjob_find(h, j->id);
	if (!s && (s = calloc(1, sizeof *s))) {
		snprintf(s->id, sizeof s->id, "%s", j->id);
		s->retry_s = q->o.reconnect_s < STREAM_RETRY_S ? q->o.reconnect_s : STREAM_RETRY_S;
		s->next = h->sjobs;
		h->sjobs = s;
	}
	if (!s) {
		snprintf(h->note, sizeof h->note, "job %.140s: out of memory for its stream", j->id);
	} else if (!s->dead && len) {
		wk_buf_add(&s->pending, text, len);
		wake(h);
	}
	pthread_mutex_unlock(&h->mu);
}

static int http_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err,
			     size_t errsz)
{
	struct hq *h = q->impl;
	int rc = WK_OK;
	pthread_mutex_lock(&h->mu);
	for (int i = 0; i < n; i++)
		if (ids_find(&h->stopped, jobs[i].id) >= 0)
			jobs[i].cancelled = true;
	/* (the pings fail too while every slot is busy and no take asks; the marks above stand) */
	rc = unreachable(h, err, errsz);
	pthread_mutex_unlock(&h->mu);
	return rc;
}

/* ---- the producer's side: not part of the worker protocol ---- */

static int http_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
		       size_t errsz)
{
	(void)q, (void)id, (void)json, (void)len;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "the RunPod job API has no submit; use the platform's /run");
}

static int http_wait_result(struct queue *q, const char *id, double timeout_s, char **json,
			    size_t *len, char *err, size_t errsz)
{
	(void)q, (void)id, (void)timeout_s, (void)json, (void)len;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "the RunPod job API has no results for workers; use the platform's /status");
}

static int http_cancel(struct queue *q, const char *id, char *err, size_t errsz)
{
	(void)q, (void)id;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "the RunPod job API cannot cancel from a worker; use the platform's /cancel");
}

const struct queue_ops queue_http_ops = {
	.name = "http",
	.open = http_open,
	.close = http_close,
	.take = http_take,
	.complete = http_complete,
	.complete_within = http_complete_within,
	.extend = http_extend,
	.release = http_release,
	.check_cancel = http_check_cancel,
	.submit = http_submit,
	.wait_result = http_wait_result,
	.cancel = http_cancel,
	.streams = http_streams,
	.stream = http_stream,
};
