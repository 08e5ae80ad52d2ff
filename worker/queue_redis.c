/*
 * queue_redis.c - redis://HOST:PORT/STREAM?group=G&dead=DEAD&max_deliveries=N&result_ttl=S
 *
 * Redis Streams with a consumer group, through hiredis (blocking API, one connection per
 * queue handle). Names, for STREAM = jobs:
 *   jobs                 the job stream; an entry is {id: <job id>, job: <job JSON>}
 *   jobs:result:<id>     the result JSON (a string key, SET NX: the first result wins;
 *                        expires after result_ttl seconds, default 7 days, 0 = never)
 *   jobs:results         a stream announcing results: {id: <job id>}, capped near 100,000
 *   jobs:cancel:<id>     exists = cancel that job
 *   jobs:queued:<id>     set by submit (with the result's ttl): one enqueue per id
 *   jobs:dead            dead letters: {id, job, reason, entry} (the `dead` parameter),
 *                        capped near 100,000
 *   jobs:stream:<id>     a streaming job's text as it is made ("stream": true): entries
 *                        {text, attempt}, expiring an hour after the last (or result_ttl)
 * Group G (default "wick") is created from id 0 with MKSTREAM by every opener, so jobs
 * submitted before any worker existed are seen.
 *
 * Take: our own pending entries first after a (re)connect (a reply lost with the connection
 * left them in our PEL), then XAUTOCLAIM of entries idle longer than the lease (their worker
 * died or stalled), then XREADGROUP ... BLOCK for new ones. The attempt number is XPENDING's
 * delivery count. Complete: one script stores the result key (SET NX) and XADDs the
 * announcement only when it stored it, then XACK, pipelined in that order on one connection.
 * A redelivered entry whose result key exists is XACKed without being returned.
 * Each pipeline that acknowledges entries ends with a trim (trim_lua): the job stream keeps
 * only what a group may still need, from the oldest entry any group has pending (or, with
 * none pending, from its last-delivered entry) on, so that it does not grow without bound
 * with every job ever submitted. XTRIM MINID, not XDEL: deleting an entry at or after a
 * group's last-delivered id makes XINFO GROUPS' lag unknown until the next read, and the
 * backlog (autoscaling) reads that lag.
 *
 * Authentication: WICK_REDIS_PASSWORD (and WICK_REDIS_USERNAME for an ACL user, Redis 6+) is
 * sent with AUTH on every connection before anything else; never in the URL, which is logged
 * (a URL with user:password@ is refused, saying where they go). A server that wants a
 * password and got none, or refuses the one given, fails the open at once, by name. Or
 * WICK_REDIS_PASSWORD_FILE names a file holding the password (trailing line ends dropped),
 * read again for every new connection: a rotated secret (a Kubernetes Secret's mounted file
 * is replaced in place) is taken at the next reconnect, with no restart. Rotation moves the
 * server and the file at different moments, so after the first connection a refused AUTH
 * (or a file missing for a moment) is retried with the reconnect's backoff.
 *
 * TLS: rediss://HOST:PORT/... (worker/redis_conn.c: OpenSSL under hiredis's protocol). The
 * server's certificate is verified against WICK_REDIS_CA_FILE (a PEM bundle) or else the
 * system's CAs, and its name against HOST; there is no switch to skip that.
 * WICK_REDIS_CERT_FILE and WICK_REDIS_KEY_FILE are a client certificate, for a server that
 * asks for one (tls-auth-clients). The files are read on every connection, so rotated ones
 * are taken at the next reconnect. Any of the three with a plain redis:// URL is refused: a
 * deployment that meant TLS must not fall back to plain text. On the first connection an
 * untrusted certificate or a refused client certificate fails the open at once, by name;
 * later, as with the password file, it is retried with the reconnect's backoff.
 *
 * Streaming: queue_stream only buffers; queue_flush_streams, which the worker calls after
 * each step, sends what each job made in that step as one entry, all jobs in one pipeline,
 * and queue_complete flushes first, so a job's pieces are in before its result. A reader
 * (queue_wait_stream, `wick submit --stream`) XREADs the job's stream and the announcements
 * together, and once the result is there reads the pieces left. A job run again (a lease
 * lost, a drain) streams again from its start under the next attempt number.
 *
 * Failures: any I/O error, or a -LOADING reply (Redis replaying its log), drops the
 * connection; the operation is retried on a new one with backoff (50 ms doubling to 2 s)
 * for up to reconnect_s. Every operation is idempotent (the announcement rides on SET NX in
 * the script), so retrying a whole pipeline after a lost reply is safe.
 * A -NOGROUP reply (Redis restarted without its data) re-creates the group.
 */
#include "worker/queue_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "worker/redis_conn.h"

#define NAME_LEN 100          /* stream, group and dead-letter stream names */
#define ENTRY_ID_MAX 48       /* "<ms>-<seq>" */
#define RESULTS_MAXLEN 100000 /* approximate cap of the announcement stream */
#define DEAD_MAXLEN 100000    /* approximate cap of the dead-letter stream */
#define IO_TIMEOUT_S 10       /* a reply slower than this (beyond a BLOCK) is a dead server */
#define STREAM_TTL_S 3600     /* a job's stream key lives this long after its last piece */

struct rq {
	struct queue_redis_url u;
	struct rconn *c;
	double io_extra_s;     /* added to IO_TIMEOUT_S while a BLOCK is in flight */
	bool scan_own;         /* re-read our own PEL before new entries */
	bool connected_once;   /* a later connect is a reconnect */
	char cursor[ENTRY_ID_MAX];
	double next_reclaim;   /* wk_now() seconds */
	char (*held)[ENTRY_ID_MAX]; /* entries taken and not yet completed or released */
	int n_held, cap_held;
	char *user, *pass;     /* WICK_REDIS_USERNAME, WICK_REDIS_PASSWORD (malloc'd, wiped) */
	char *pass_file;       /* WICK_REDIS_PASSWORD_FILE: pass is read from it on a connect */
	struct rconn_tls tls;  /* rediss://: WICK_REDIS_CA_FILE, _CERT_FILE, _KEY_FILE (malloc'd) */
	struct rstream *streams; /* jobs that stream, until completed or released */
};

/* A streaming job's text made since the last flush. */
struct rstream {
	char id[JOB_ID_MAX + 1];
	int attempt;
	struct wk_buf pending;
	struct rstream *next;
};

/* ---- URL: pure ---- */

static bool name_ok(const char *s, size_t n)
{
	if (n == 0 || n > NAME_LEN)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-' || c == ':'))
			return false;
	}
	return true;
}

int queue_redis_parse_url(const char *url, struct queue_redis_url *u, char *err, size_t errsz)
{
	memset(u, 0, sizeof *u);
	u->port = 6379;
	u->max_deliveries = 0;
	u->result_ttl = 7 * 86400;
	snprintf(u->group, sizeof u->group, "wick");
	const char *at = queue_url_at(url); /* user:password@: never echoed */
	if (at)
		return wk_errf(err, errsz, WK_EINVAL, "redis://...@%.*s: credentials do not go in the "
			       "URL (it is logged): set WICK_REDIS_PASSWORD, and WICK_REDIS_USERNAME "
			       "for an ACL user", (int)(queue_url_at_end(url) - at - 1), at + 1);
	u->tls = !strncmp(url, "rediss://", 9);
	if (!u->tls && strncmp(url, "redis://", 8))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: not a redis:// or rediss:// URL", url);
	const char *p = url + 8 + u->tls, *slash = strchr(p, '/');
	if (!slash)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: no stream (redis://HOST:PORT/STREAM)", url);
	const char *colon;
	size_t hl;
	int hrc = queue_split_host(url, &p, slash, &hl, &colon, err, errsz);
	if (hrc != WK_OK)
		return hrc;
	if (hl == 0 || hl >= sizeof u->host)
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad host", url);
	memcpy(u->host, p, hl);
	if (colon) {
		char *end;
		long port = strtol(colon + 1, &end, 10);
		if (end != slash || port < 1 || port > 65535)
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad port", url);
		u->port = (int)port;
	}
	const char *s = slash + 1, *q = strchr(s, '?');
	size_t sl = q ? (size_t)(q - s) : strlen(s);
	if (!name_ok(s, sl))
		return wk_errf(err, errsz, WK_EINVAL, "%.200s: the stream name must match [A-Za-z0-9._:-]{1,%d}",
			       url, NAME_LEN);
	memcpy(u->stream, s, sl);
	snprintf(u->dead, sizeof u->dead, "%s:dead", u->stream);
	struct queue_param pr;
	int more;
	while ((more = queue_next_param(url, &q, &pr, err, errsz)) > 0) {
		if (queue_param_is(&pr, "group")) {
			if (!name_ok(pr.v, pr.vl))
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad group name", url);
			memset(u->group, 0, sizeof u->group);
			memcpy(u->group, pr.v, pr.vl);
		} else if (queue_param_is(&pr, "dead")) {
			if (!name_ok(pr.v, pr.vl))
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: bad dead-letter stream name", url);
			memset(u->dead, 0, sizeof u->dead);
			memcpy(u->dead, pr.v, pr.vl);
		} else if (queue_param_is(&pr, "max_deliveries")) {
			if (!pr.isnum || pr.num < 1 || pr.num > 1000)
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: max_deliveries must be 1 to 1000", url);
			u->max_deliveries = (int)pr.num;
		} else if (queue_param_is(&pr, "result_ttl")) {
			if (!pr.isnum || pr.num < 0 || pr.num > 365LL * 86400)
				return wk_errf(err, errsz, WK_EINVAL, "%.200s: result_ttl must be 0 to one year in seconds", url);
			u->result_ttl = pr.num;
		} else {
			return wk_errf(err, errsz, WK_EINVAL, "%.200s: unknown parameter '%.*s'", url, (int)pr.kl, pr.k);
		}
	}
	if (more < 0)
		return more;
	return WK_OK;
}

/* ---- entries: pure ---- */

int queue_redis_decode_entry(const struct redisReply *e, size_t max_body, struct queue_redis_entry *out)
{
	memset(out, 0, sizeof *out);
	if (!e || e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
	    e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= ENTRY_ID_MAX)
		return QUEUE_REDIS_ENTRY_BAD;
	memcpy(out->entry, e->element[0]->str, e->element[0]->len);
	char *end;
	unsigned long long ms = strtoull(out->entry, &end, 10);
	if (*end != '-')
		return QUEUE_REDIS_ENTRY_BAD;
	out->enqueued_at = (double)ms / 1000.0;
	const redisReply *f = e->element[1];
	if (f->type == REDIS_REPLY_NIL)
		return QUEUE_REDIS_ENTRY_GONE; /* deleted or trimmed while pending */
	if (f->type != REDIS_REPLY_ARRAY || f->elements % 2)
		return QUEUE_REDIS_ENTRY_BAD;
	const redisReply *id = NULL, *job = NULL;
	for (size_t i = 0; i + 1 < f->elements; i += 2) {
		const redisReply *k = f->element[i], *v = f->element[i + 1];
		if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			return QUEUE_REDIS_ENTRY_BAD;
		if (k->len == 2 && !memcmp(k->str, "id", 2))
			id = v;
		else if (k->len == 3 && !memcmp(k->str, "job", 3))
			job = v;
	}
	if (id)
		out->raw_id = id->str, out->raw_id_len = id->len;
	if (job)
		out->body = job->str, out->len = job->len;
	if (!id || !job)
		return QUEUE_REDIS_ENTRY_BAD;
	if (id->len <= JOB_ID_MAX && memchr(id->str, 0, id->len) == NULL) {
		memcpy(out->id, id->str, id->len);
		out->id[id->len] = 0;
		if (!job_id_valid(out->id))
			out->id[0] = 0;
	}
	if (!out->id[0])
		return QUEUE_REDIS_ENTRY_BAD_ID;
	return job->len > max_body ? QUEUE_REDIS_ENTRY_TOO_BIG : QUEUE_REDIS_ENTRY_OK;
}

/* ---- commands ---- */

struct args {
	int n;
	const char *v[16];
	size_t l[16];
	char num[4][24];
	int nn;
};

static void a_s(struct args *a, const char *s) { a->v[a->n] = s, a->l[a->n++] = strlen(s); }
static void a_b(struct args *a, const char *s, size_t l) { a->v[a->n] = s, a->l[a->n++] = l; }
static void a_ll(struct args *a, long long x)
{
	snprintf(a->num[a->nn], sizeof a->num[0], "%lld", x);
	a_s(a, a->num[a->nn++]);
}
static void send_args(struct rconn *c, struct args *a)
{
	rconn_append_argv(c, a->n, a->v, a->l);
}

static bool is_err(const redisReply *r, const char *prefix)
{
	return r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, prefix, strlen(prefix));
}

static void drop(struct rq *r)
{
	rconn_free(r->c);
	r->c = NULL;
}

static void set_timeout(struct rq *r)
{
	if (!r->c)
		return;
	rconn_set_timeout(r->c, IO_TIMEOUT_S + r->io_extra_s);
}

/* A command on a new connection failed: why, and whether to retry. A TLS server that
 * refuses our client certificate says so only after the handshake, at the first command: on
 * the first connection that is WK_EINVAL (the settings are wrong), later WK_EIO (a rotation
 * may be under way). Frees the connection. */
static int lost(struct rq *r, char *err, size_t errsz)
{
	int rc = rconn_tls_refused(r->c) && !r->connected_once
		 ? wk_errf(err, errsz, WK_EINVAL, "redis %s:%d: %s%s", r->u.host, r->u.port,
			   rconn_errstr(r->c), r->tls.cert_file ? "" : " (does it want a client "
			   "certificate? set WICK_REDIS_CERT_FILE and WICK_REDIS_KEY_FILE)")
		 : wk_errf(err, errsz, WK_EIO, "connection lost: %s%s", rconn_errstr(r->c),
			   r->u.tls || r->connected_once ? ""
			   : " (a server that speaks only TLS drops plain text: rediss://)");
	drop(r);
	return rc;
}

/* XGROUP CREATE stream group 0 MKSTREAM; BUSYGROUP (it exists) is success. */
static int create_group(struct rq *r, char *err, size_t errsz)
{
	redisReply *rep = rconn_command(r->c, "XGROUP CREATE %s %s 0 MKSTREAM", r->u.stream, r->u.group);
	if (!rep)
		return lost(r, err, errsz);
	int rc = WK_OK;
	if (is_err(rep, "NOAUTH"))
		rc = wk_errf(err, errsz, WK_EINVAL, "redis %s:%d wants a password (%.60s): set "
			     "WICK_REDIS_PASSWORD, and WICK_REDIS_USERNAME for an ACL user",
			     r->u.host, r->u.port, rep->str);
	else if (rep->type == REDIS_REPLY_ERROR && !is_err(rep, "BUSYGROUP"))
		rc = wk_errf(err, errsz, is_err(rep, "LOADING") ? WK_EIO : WK_EFORMAT,
			     "redis XGROUP CREATE %s %s: %s", r->u.stream, r->u.group, rep->str);
	freeReplyObject(rep);
	return rc;
}

/* r->pass from r->pass_file: its contents less trailing line ends (a password may end in a
 * blank). */
static int read_pass(struct rq *r, char *err, size_t errsz)
{
	char *buf, e[160];
	size_t n, len;
	if (wk_read_file(r->pass_file, 4096, &buf, &len, e, sizeof e) != WK_OK)
		return wk_errf(err, errsz, WK_EINVAL, "WICK_REDIS_PASSWORD_FILE: %s", e);
	n = len;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = '\0';
	if (n == 0 || memchr(buf, '\0', n)) {
		explicit_bzero(buf, len); /* all of it: wk_free_secret stops at a NUL */
		free(buf);
		return wk_errf(err, errsz, WK_EINVAL, "WICK_REDIS_PASSWORD_FILE %.200s: %s",
			       r->pass_file, n ? "holds a NUL byte" : "is empty");
	}
	wk_free_secret(r->pass);
	r->pass = buf;
	return WK_OK;
}

/* AUTH [user] password on a new connection, when WICK_REDIS_PASSWORD or _FILE is set.
 * WK_EIO: the connection failed, or (after the first connection, with a password file, which
 * a rotation may not have reached yet) the file or the password failed: retried;
 * WK_EINVAL: refused (not retried). */
static int authenticate(struct rq *r, char *err, size_t errsz)
{
	int frc = r->pass_file ? read_pass(r, err, errsz) : WK_OK;
	if (frc != WK_OK)
		return r->connected_once ? WK_EIO : frc;
	if (!r->pass)
		return WK_OK;
	redisReply *rep = r->user ? rconn_command(r->c, "AUTH %s %s", r->user, r->pass)
				  : rconn_command(r->c, "AUTH %s", r->pass);
	if (!rep)
		return lost(r, err, errsz);
	int rc = WK_OK;
	bool retry = is_err(rep, "LOADING") || (r->pass_file && r->connected_once);
	if (rep->type == REDIS_REPLY_ERROR)
		rc = wk_errf(err, errsz, retry ? WK_EIO : WK_EINVAL,
			     "redis %s:%d: AUTH%s%s (WICK_REDIS_PASSWORD%s%s) refused: %.120s",
			     r->u.host, r->u.port, r->user ? " as " : "", r->user ? r->user : "",
			     r->pass_file ? "_FILE" : "", r->user ? ", WICK_REDIS_USERNAME" : "",
			     rep->str);
	freeReplyObject(rep);
	return rc;
}

static void sleep_s(double s)
{
	struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
	nanosleep(&ts, NULL);
}

/* Connects (when not connected), retrying with backoff until deadline (wk_now() seconds).
 * A server that answers -LOADING counts as not there yet. */
static int ensure(struct queue *q, double deadline, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	double delay = 0.05, t0 = wk_now();
	while (!r->c) {
		char why[WK_ERRSZ] = "";
		int orc = rconn_open(r->u.host, r->u.port, r->u.tls ? &r->tls : NULL, 2.0, &r->c, why,
				     sizeof why);
		if (orc == WK_ENOMEM || (orc == WK_EINVAL && !r->connected_once))
			return wk_errf(err, errsz, orc, "redis %s:%d: %s", r->u.host, r->u.port, why);
		if (orc == WK_OK) {
			set_timeout(r);
			int rc = authenticate(r, why, sizeof why);
			if (rc == WK_OK)
				rc = create_group(r, why, sizeof why);
			if (rc == WK_OK) {
				r->scan_own = true;
				q->st.reconnects += r->connected_once;
				r->connected_once = true;
				return WK_OK;
			}
			if (rc != WK_EIO) {
				drop(r);
				return wk_errf(err, errsz, rc, "%s", why);
			}
			drop(r);
		}
		if (wk_now() + delay > deadline || queue_stopping(q))
			return wk_errf(err, errsz, WK_EIO, "redis %s:%d: %s (gave up after %.1f s%s)",
				       r->u.host, r->u.port, why[0] ? why : "unavailable", wk_now() - t0,
				       queue_stopping(q) ? ", interrupted"
				       : r->connected_once ? "" : "; a first connection is tried for 1 s");
		sleep_s(delay);
		delay = delay * 2 < 2 ? delay * 2 : 2;
	}
	return WK_OK;
}

/* Runs a pipeline: fn appends ncmd commands, their replies land in rep[0..ncmd) (caller frees
 * with free_replies). A lost connection or -LOADING reconnects and runs it again; -NOGROUP
 * re-creates the group and runs it again. */
typedef void (*append_fn)(struct queue *q, void *ctx);

static void free_replies(redisReply **rep, int n)
{
	for (int i = 0; i < n; i++) {
		if (rep[i])
			freeReplyObject(rep[i]);
		rep[i] = NULL;
	}
}

static int exec(struct queue *q, append_fn fn, void *ctx, int ncmd, redisReply **rep, char *err,
		size_t errsz)
{
	struct rq *r = q->impl;
	double deadline = wk_now() + q->o.reconnect_s;
	int nogroup = 0;
	char why[200] = "";
	for (;;) {
		int rc = ensure(q, deadline, err, errsz);
		if (rc != WK_OK)
			return rc;
		fn(q, ctx);
		bool broken = false, loading = false, nog = false;
		for (int i = 0; i < ncmd; i++) {
			rep[i] = NULL;
			if (broken || rconn_get_reply(r->c, &rep[i]) != WK_OK) {
				if (!broken)
					snprintf(why, sizeof why, ": %s", rconn_errstr(r->c));
				broken = true;
				continue;
			}
			loading |= is_err(rep[i], "LOADING");
			nog |= is_err(rep[i], "NOGROUP");
		}
		if (!broken && !loading && !(nog && nogroup++ < 3))
			return WK_OK;
		free_replies(rep, ncmd);
		if (broken || loading)
			drop(r);
		else if ((rc = create_group(r, err, errsz)) != WK_OK && rc != WK_EIO)
			return rc;
		if (wk_now() > deadline || queue_stopping(q))
			return wk_errf(err, errsz, WK_EIO, "redis %s:%d: lost the connection%s (gave up "
				       "after %.1f s)", r->u.host, r->u.port, why,
				       wk_now() - (deadline - q->o.reconnect_s));
	}
}

/* One command, no pipeline. */
struct one {
	struct args a;
};
static void append_one(struct queue *q, void *ctx)
{
	send_args(((struct rq *)q->impl)->c, &((struct one *)ctx)->a);
}
static int exec1(struct queue *q, struct args *a, redisReply **rep, char *err, size_t errsz)
{
	return exec(q, append_one, a, 1, rep, err, errsz);
}

static void key(char *out, size_t outsz, const struct rq *r, const char *what, const char *id)
{
	snprintf(out, outsz, "%s:%s%s%s", r->u.stream, what, id ? ":" : "", id ? id : "");
}

/* ---- held entries ---- */

static int held_find(struct rq *r, const char *entry)
{
	for (int i = 0; i < r->n_held; i++)
		if (!strcmp(r->held[i], entry))
			return i;
	return -1;
}

static void held_add(struct rq *r, const char *entry)
{
	if (held_find(r, entry) >= 0)
		return;
	if (r->n_held == r->cap_held) {
		int cap = r->cap_held ? r->cap_held * 2 : 64;
		void *p = realloc(r->held, (size_t)cap * sizeof *r->held);
		if (!p)
			return; /* only costs a possible duplicate delivery to ourselves */
		r->held = p;
		r->cap_held = cap;
	}
	snprintf(r->held[r->n_held++], ENTRY_ID_MAX, "%s", entry);
}

static void held_del(struct rq *r, const char *entry)
{
	int i = held_find(r, entry);
	if (i >= 0)
		memcpy(r->held[i], r->held[--r->n_held], ENTRY_ID_MAX);
}

/* ---- open / close ---- */


static void redis_close(struct queue *q)
{
	struct rq *r = q->impl;
	if (!r)
		return;
	drop(r);
	free(r->held);
	wk_free_secret(r->user);
	wk_free_secret(r->pass);
	free(r->pass_file);
	free((char *)r->tls.ca_file);
	free((char *)r->tls.cert_file);
	free((char *)r->tls.key_file);
	for (struct rstream *x = r->streams, *next; x; x = next) {
		next = x->next;
		free(x->pending.p);
		free(x);
	}
	free(r);
	q->impl = NULL;
}

/* WICK_REDIS_CA_FILE, _CERT_FILE and _KEY_FILE into r->tls: only with rediss://, and the
 * certificate and its key together. The files themselves are read at each connection. */
static int tls_settings(struct rq *r, char *err, size_t errsz)
{
	static const char *const names[3] = {"WICK_REDIS_CA_FILE", "WICK_REDIS_CERT_FILE",
					      "WICK_REDIS_KEY_FILE"};
	const char *v[3] = {getenv("WICK_REDIS_CA_FILE"), getenv("WICK_REDIS_CERT_FILE"),
			    getenv("WICK_REDIS_KEY_FILE")};
	const char **dst[3] = {&r->tls.ca_file, &r->tls.cert_file, &r->tls.key_file};
	for (int i = 0; i < 3; i++) {
		if (!v[i] || !*v[i])
			continue;
		if (!r->u.tls)
			return wk_errf(err, errsz, WK_EINVAL, "%s is set but the queue URL is redis:// "
				       "(plain text): use rediss:// for TLS, or unset it", names[i]);
		if (!(*dst[i] = strdup(v[i])))
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	if (!r->tls.cert_file != !r->tls.key_file)
		return wk_errf(err, errsz, WK_EINVAL, "%s is set without %s: a client certificate "
			       "needs both", names[r->tls.cert_file ? 1 : 2],
			       names[r->tls.cert_file ? 2 : 1]);
	return WK_OK;
}

static int redis_open(struct queue *q, const char *url, char *err, size_t errsz)
{
	struct rq *r = calloc(1, sizeof *r);
	if (!r)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	q->impl = r;
	int rc = queue_redis_parse_url(url, &r->u, err, errsz);
	const char *user = getenv("WICK_REDIS_USERNAME"), *pass = getenv("WICK_REDIS_PASSWORD");
	const char *pf = getenv("WICK_REDIS_PASSWORD_FILE");
	bool has_pass = pass && *pass, has_file = pf && *pf;
	if (rc == WK_OK && has_pass && has_file)
		rc = wk_errf(err, errsz, WK_EINVAL, "both WICK_REDIS_PASSWORD and "
			     "WICK_REDIS_PASSWORD_FILE are set: set one");
	if (rc == WK_OK && user && *user && !has_pass && !has_file)
		rc = wk_errf(err, errsz, WK_EINVAL, "WICK_REDIS_USERNAME is set without "
			     "WICK_REDIS_PASSWORD or WICK_REDIS_PASSWORD_FILE");
	if (rc == WK_OK &&
	    ((has_pass && !(r->pass = strdup(pass))) || (has_file && !(r->pass_file = strdup(pf))) ||
	     (user && *user && !(r->user = strdup(user)))))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if (rc == WK_OK)
		rc = tls_settings(r, err, errsz);
	if (rc == WK_OK) {
		if (r->u.max_deliveries > 0)
			q->o.max_deliveries = r->u.max_deliveries;
		snprintf(r->cursor, sizeof r->cursor, "0-0");
		/* the first connection: fail fast (a wrong URL should not hang for a minute) */
		rc = ensure(q, wk_now() + 1.0, err, errsz);
	}
	if (rc != WK_OK)
		redis_close(q);
	return rc;
}

/* ---- take ---- */

/* A candidate entry, between reading it and returning it. */
struct cand {
	struct queue_redis_entry e;
	int kind;            /* QUEUE_REDIS_ENTRY_* */
	bool fresh;          /* from '>': first delivery, no XPENDING needed */
};

struct take_ctx {
	struct cand *c;
	int n;
	const char *const *extra; /* unused */
};

static void append_checks(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	struct take_ctx *t = ctx;
	char k[NAME_LEN + JOB_ID_MAX + 16];
	for (int i = 0; i < t->n; i++) {
		struct args a = {0};
		a_s(&a, "XPENDING"), a_s(&a, r->u.stream), a_s(&a, r->u.group);
		a_s(&a, t->c[i].e.entry), a_s(&a, t->c[i].e.entry), a_s(&a, "1");
		send_args(r->c, &a);
		const char *id = t->c[i].e.id[0] ? t->c[i].e.id : "-";
		key(k, sizeof k, r, "result", id);
		a = (struct args){0};
		a_s(&a, "EXISTS"), a_s(&a, k);
		send_args(r->c, &a);
		key(k, sizeof k, r, "cancel", id);
		a = (struct args){0};
		a_s(&a, "EXISTS"), a_s(&a, k);
		send_args(r->c, &a);
	}
}

/* Trims the job stream (KEYS[1]) to what its groups may still need: MINID, the oldest of
 * each group's oldest pending entry, or its last-delivered entry when it has none pending
 * (kept, as is everything after it). No group, nothing trimmed. Returns the entries trimmed;
 * the caller ignores the reply (an error here costs a longer stream, not a job). */
static const char trim_lua[] =
	"local lo, lo_ms, lo_seq "
	"for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do "
	"local f = {} for i = 1, #g, 2 do f[g[i]] = g[i + 1] end "
	"local m = f['last-delivered-id'] "
	"if f['pending'] > 0 then m = redis.call('XPENDING', KEYS[1], f['name'])[2] end "
	"local a, b = string.match(m, '^(%d+)-(%d+)$') "
	"a, b = tonumber(a), tonumber(b) "
	"if not lo or a < lo_ms or (a == lo_ms and b < lo_seq) then lo, lo_ms, lo_seq = m, a, b end "
	"end "
	"if not lo then return 0 end "
	"return redis.call('XTRIM', KEYS[1], 'MINID', lo)";

static void append_trim(struct rq *r)
{
	struct args a = {0};
	a_s(&a, "EVAL"), a_s(&a, trim_lua), a_s(&a, "1"), a_s(&a, r->u.stream);
	send_args(r->c, &a);
}

/* What to do with an entry that is not returned. */
struct settle {
	const struct cand *c;
	const char *result;  /* SET NX first, when not NULL */
	size_t rlen;
	const char *reason;  /* XADD to the dead stream, when not NULL */
	char why[256];       /* a reason composed for this entry */
	bool refused;        /* tell queue_refused once settled: why, under c->e.id when set */
};
struct settle_ctx {
	struct settle *s;
	int n;
};

static void append_settle(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	struct settle_ctx *t = ctx;
	char k[NAME_LEN + JOB_ID_MAX + 16];
	for (int i = 0; i < t->n; i++) {
		const struct settle *s = &t->s[i];
		struct args a = {0};
		if (s->result) {
			key(k, sizeof k, r, "result", s->c->e.id);
			a_s(&a, "SET"), a_s(&a, k), a_b(&a, s->result, s->rlen), a_s(&a, "NX");
			if (r->u.result_ttl > 0)
				a_s(&a, "EX"), a_ll(&a, r->u.result_ttl);
			send_args(r->c, &a);
			a = (struct args){0};
			key(k, sizeof k, r, "results", NULL);
			a_s(&a, "XADD"), a_s(&a, k), a_s(&a, "MAXLEN"), a_s(&a, "~"), a_ll(&a, RESULTS_MAXLEN);
			a_s(&a, "*"), a_s(&a, "id"), a_s(&a, s->c->e.id);
			send_args(r->c, &a);
		}
		if (s->reason) {
			a = (struct args){0};
			a_s(&a, "XADD"), a_s(&a, r->u.dead), a_s(&a, "MAXLEN"), a_s(&a, "~");
			a_ll(&a, DEAD_MAXLEN), a_s(&a, "*");
			/* an invalid id is kept as it was sent: the dead stream is data, not a key */
			if (s->c->e.id[0])
				a_s(&a, "id"), a_s(&a, s->c->e.id);
			else if (s->c->e.raw_id)
				a_s(&a, "id"), a_b(&a, s->c->e.raw_id, s->c->e.raw_id_len);
			else
				a_s(&a, "id"), a_s(&a, "-");
			a_s(&a, "job"), a_b(&a, s->c->e.body ? s->c->e.body : "", s->c->e.body ? s->c->e.len : 0);
			a_s(&a, "reason"), a_s(&a, s->reason), a_s(&a, "entry"), a_s(&a, s->c->e.entry);
			send_args(r->c, &a);
		}
		a = (struct args){0};
		a_s(&a, "XACK"), a_s(&a, r->u.stream), a_s(&a, r->u.group), a_s(&a, s->c->e.entry);
		send_args(r->c, &a);
	}
	append_trim(r); /* one reply more than settle_cmds count (settle_ctx's users add it) */
}

static int settle_cmds(const struct settle *s) { return (s->result ? 2 : 0) + (s->reason ? 1 : 0) + 1; }

/* Appends the entries of an XREADGROUP/XAUTOCLAIM entry list to cands. */
static void collect(struct queue *q, const redisReply *list, bool fresh, struct cand *c, int *n, int max)
{
	struct rq *r = q->impl;
	for (size_t i = 0; list && list->type == REDIS_REPLY_ARRAY && i < list->elements && *n < max; i++) {
		struct cand *x = &c[*n];
		x->kind = queue_redis_decode_entry(list->element[i], q->o.max_body, &x->e);
		x->fresh = fresh;
		if (!x->e.entry[0] || held_find(r, x->e.entry) >= 0)
			continue; /* unreadable id, or one we are running: our own PEL re-read */
		(*n)++;
	}
}

/* XREADGROUP's reply [[stream, [entries]]] → the entries list. */
static const redisReply *xread_entries(const redisReply *rep)
{
	if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1)
		return NULL;
	const redisReply *s = rep->element[0];
	if (s->type != REDIS_REPLY_ARRAY || s->elements != 2)
		return NULL;
	return s->element[1];
}

/* Our own pending entries, as an XREADGROUP entry list ([id, fields], fields nil for an entry
 * deleted from the stream), without delivering them again: XREADGROUP ... 0 would add one to
 * each entry's delivery count at every reconnect, and a flapping Redis would then dead-letter
 * healthy jobs. KEYS[1] stream; ARGV: group, consumer, count. */
static const char own_pending_lua[] =
	"local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', ARGV[3], ARGV[2]) "
	"local out = {} "
	"for i, e in ipairs(p) do "
	"local r = redis.call('XRANGE', KEYS[1], e[1], e[1]) "
	"if r[1] then out[#out + 1] = r[1] else out[#out + 1] = {e[1], false} end end "
	"return out";

static int redis_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n,
		      char *err, size_t errsz)
{
	struct rq *r = q->impl;
	double deadline = wk_now() + wait_s;
	redisReply *reps[3] = {0}; /* replies that own the candidates' strings */
	int nrep = 0, rc = WK_OK;
	struct cand *c = calloc((size_t)max, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	int nc = 0;
	struct args a;
	char cnt[24];

	for (;;) {
		nc = 0;
		/* 1. our own pending entries, after a (re)connect */
		if (r->scan_own) {
			a = (struct args){0};
			snprintf(cnt, sizeof cnt, "%d", max);
			a_s(&a, "EVAL"), a_s(&a, own_pending_lua), a_s(&a, "1"), a_s(&a, r->u.stream);
			a_s(&a, r->u.group), a_s(&a, q->consumer), a_s(&a, cnt);
			if ((rc = exec1(q, &a, &reps[nrep], err, errsz)) != WK_OK)
				goto out;
			if (reps[nrep]->type == REDIS_REPLY_ERROR) {
				rc = wk_errf(err, errsz, WK_EFORMAT, "redis: reading our pending entries: %s",
					     reps[nrep]->str);
				nrep++;
				goto out;
			}
			const redisReply *list = reps[nrep];
			collect(q, list, false, c, &nc, max);
			size_t got = list && list->type == REDIS_REPLY_ARRAY ? list->elements : 0;
			nrep++;
			if ((int)got < max)
				r->scan_own = false;
		}
		/* 2. entries idle past the lease: their worker died */
		if (nc < max && wk_now() >= r->next_reclaim) {
			a = (struct args){0};
			snprintf(cnt, sizeof cnt, "%d", max - nc);
			a_s(&a, "XAUTOCLAIM"), a_s(&a, r->u.stream), a_s(&a, r->u.group), a_s(&a, q->consumer);
			a_ll(&a, (long long)(q->o.lease_s * 1000)), a_s(&a, r->cursor);
			a_s(&a, "COUNT"), a_s(&a, cnt);
			if ((rc = exec1(q, &a, &reps[nrep], err, errsz)) != WK_OK)
				goto out;
			redisReply *x = reps[nrep++];
			if (x->type == REDIS_REPLY_ERROR) {
				rc = wk_errf(err, errsz, WK_EFORMAT, "redis XAUTOCLAIM: %s (Redis 6.2 or newer is needed)",
					     x->str);
				goto out;
			}
			if (x->type == REDIS_REPLY_ARRAY && x->elements >= 2 &&
			    x->element[0]->type == REDIS_REPLY_STRING && x->element[0]->len < ENTRY_ID_MAX) {
				int before = nc;
				collect(q, x->element[1], false, c, &nc, max);
				q->st.reclaimed += (uint64_t)(nc - before);
				memcpy(r->cursor, x->element[0]->str, x->element[0]->len);
				r->cursor[x->element[0]->len] = 0;
			}
			if (!strcmp(r->cursor, "0-0")) {
				double step = q->o.lease_s / 4;
				r->next_reclaim = wk_now() + (step < 1 ? step : 1);
			}
		}
		/* 3. new entries, blocking for the first one */
		if (nc < max) {
			double left = deadline - wk_now();
			double until = r->next_reclaim - wk_now();
			if (until < left)
				left = until;
			long long block = nc == 0 && left > 0.001 ? (long long)(left * 1000) : -1;
			a = (struct args){0};
			snprintf(cnt, sizeof cnt, "%d", max - nc);
			a_s(&a, "XREADGROUP"), a_s(&a, "GROUP"), a_s(&a, r->u.group), a_s(&a, q->consumer);
			a_s(&a, "COUNT"), a_s(&a, cnt);
			if (block > 0)
				a_s(&a, "BLOCK"), a_ll(&a, block);
			a_s(&a, "STREAMS"), a_s(&a, r->u.stream), a_s(&a, ">");
			r->io_extra_s = block > 0 ? (double)block / 1000 : 0;
			set_timeout(r);
			rc = exec1(q, &a, &reps[nrep], err, errsz);
			r->io_extra_s = 0;
			set_timeout(r);
			if (rc != WK_OK)
				goto out;
			collect(q, xread_entries(reps[nrep]), true, c, &nc, max);
			nrep++;
		}
		if (nc > 0)
			break;
		free_replies(reps, nrep);
		nrep = 0;
		if (wk_now() >= deadline)
			goto out;
	}

	/* 4. delivery counts, done and cancel checks, in one round trip */
	redisReply **chk = calloc((size_t)nc * 3, sizeof *chk);
	struct settle *st = calloc((size_t)nc, sizeof *st);
	char **owned = calloc((size_t)nc, sizeof *owned);
	if (!chk || !st || !owned) {
		free(chk), free(st), free(owned);
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto out;
	}
	struct take_ctx tc = {.c = c, .n = nc};
	if ((rc = exec(q, append_checks, &tc, nc * 3, chk, err, errsz)) != WK_OK) {
		free(chk), free(st), free(owned);
		goto out;
	}
	int nst = 0, nset_cmds = 0;
	for (int i = 0; i < nc; i++) {
		struct cand *x = &c[i];
		const redisReply *p = chk[3 * i], *done = chk[3 * i + 1], *can = chk[3 * i + 2];
		int count = 1;
		if (p->type == REDIS_REPLY_ARRAY && p->elements == 1 && p->element[0]->type == REDIS_REPLY_ARRAY &&
		    p->element[0]->elements == 4 && p->element[0]->element[3]->type == REDIS_REPLY_INTEGER)
			count = (int)p->element[0]->element[3]->integer;
		else if (!x->fresh)
			continue; /* no longer pending (acked by someone meanwhile) */
		if (count < 1)
			count = 1;
		char msg[200];
		struct settle *s = &st[nst];
		s->c = x;
		if (x->kind == QUEUE_REDIS_ENTRY_BAD_ID) {
			char quoted[3 * 64];
			size_t l = x->e.raw_id_len;
			queue_quote(quoted, sizeof quoted, x->e.raw_id, l);
			snprintf(s->why, sizeof s->why,
				 "invalid job id '%s' (%zu bytes; must match [A-Za-z0-9._-]{1,%d})", quoted, l,
				 JOB_ID_MAX);
			s->reason = s->why;
			s->refused = true;
			nset_cmds += settle_cmds(s), nst++;
			continue;
		}
		if (x->kind == QUEUE_REDIS_ENTRY_BAD || x->kind == QUEUE_REDIS_ENTRY_GONE) {
			s->reason = x->kind == QUEUE_REDIS_ENTRY_BAD ? "malformed entry (needs fields id and job)"
								      : "entry deleted while pending";
			s->refused = x->kind == QUEUE_REDIS_ENTRY_BAD;
			snprintf(s->why, sizeof s->why, "%s", s->reason);
			nset_cmds += settle_cmds(s), nst++;
			continue;
		}
		if (done->type == REDIS_REPLY_INTEGER && done->integer > 0) {
			nset_cmds += settle_cmds(s), nst++;
			q->st.redelivered_done++;
			continue;
		}
		if (count > q->o.max_deliveries || x->kind == QUEUE_REDIS_ENTRY_TOO_BIG) {
			bool big = x->kind == QUEUE_REDIS_ENTRY_TOO_BIG;
			if (big)
				snprintf(msg, sizeof msg, "the job has %zu bytes; the limit is %zu", x->e.len,
					 q->o.max_body);
			else
				snprintf(msg, sizeof msg,
					 "dead-lettered: delivered %d times without a result (max_deliveries %d)",
					 count - 1, q->o.max_deliveries);
			owned[i] = queue_error_result(q, x->e.id, big ? JOB_EINVALID_INPUT : JOB_EINTERNAL, msg,
						      big ? count : count - 1, &s->rlen);
			s->result = owned[i];
			s->reason = big ? "too large" : "max_deliveries";
			if (big) {
				s->refused = true;
				snprintf(s->why, sizeof s->why, "%s; FAILED (invalid_input) stored", msg);
			} else {
				q->st.dead_lettered++;
			}
			nset_cmds += settle_cmds(s), nst++;
			continue;
		}
		struct queue_job *j = &jobs[*n];
		memset(j, 0, sizeof *j);
		if (!(j->body = malloc(x->e.len + 1)))
			continue; /* stays pending; reclaimed later */
		memcpy(j->body, x->e.body, x->e.len);
		j->body[x->e.len] = 0;
		j->len = x->e.len;
		snprintf(j->id, sizeof j->id, "%s", x->e.id);
		snprintf(j->handle, sizeof j->handle, "%s", x->e.entry);
		j->attempt = count;
		j->enqueued_at = x->e.enqueued_at;
		j->cancelled = can->type == REDIS_REPLY_INTEGER && can->integer > 0;
		held_add(r, x->e.entry);
		(*n)++;
	}
	if (nst > 0) {
		nset_cmds++; /* append_settle's trim */
		redisReply **sr = calloc((size_t)nset_cmds, sizeof *sr);
		struct settle_ctx sc = {.s = st, .n = nst};
		if (sr && exec(q, append_settle, &sc, nset_cmds, sr, err, errsz) == WK_OK) {
			free_replies(sr, nset_cmds);
			for (int i = 0; i < nst; i++)
				if (st[i].refused)
					queue_refused(q, st[i].c->e.id[0] ? st[i].c->e.id : NULL,
						      "stream entry %s: %s; moved to %s", st[i].c->e.entry,
						      st[i].why, r->u.dead);
		}
		free(sr); /* a failure here is harmless: those entries are settled on a later delivery */
	}
	free_replies(chk, nc * 3);
	free(chk);
	for (int i = 0; i < nc; i++)
		free(owned[i]);
	free(owned);
	free(st);
out:
	free_replies(reps, nrep);
	free(c);
	return rc;
}

/* ---- streaming: the worker's side (the reader's is with the producer's) ---- */

static bool redis_streams(const struct queue *q)
{
	(void)q;
	return true;
}

static struct rstream *rstream_find(struct rq *r, const char *id)
{
	for (struct rstream *x = r->streams; x; x = x->next)
		if (!strcmp(x->id, id))
			return x;
	return NULL;
}

static void redis_stream(struct queue *q, const struct queue_job *j, const char *text, size_t len)
{
	struct rq *r = q->impl;
	struct rstream *x = rstream_find(r, j->id);
	if (!x && (x = calloc(1, sizeof *x))) {
		snprintf(x->id, sizeof x->id, "%s", j->id);
		x->next = r->streams;
		r->streams = x;
	}
	if (x) {
		x->attempt = j->attempt;
		wk_buf_add(&x->pending, text, len);
	}
}

/* Forgets job id's stream when it ended or went back (what it had not sent is lost: the
 * result has it, or the next attempt makes it again). */
static void rstream_drop(struct rq *r, const char *id)
{
	for (struct rstream **p = &r->streams; *p; p = &(*p)->next)
		if (!strcmp((*p)->id, id)) {
			struct rstream *x = *p;
			*p = x->next;
			free(x->pending.p);
			free(x);
			return;
		}
}

static void append_pieces(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	(void)ctx;
	char k[NAME_LEN + JOB_ID_MAX + 16];
	long long ttl = r->u.result_ttl > 0 && r->u.result_ttl < STREAM_TTL_S ? r->u.result_ttl
									      : STREAM_TTL_S;
	for (struct rstream *x = r->streams; x; x = x->next) {
		if (!x->pending.len)
			continue;
		struct args a = {0};
		key(k, sizeof k, r, "stream", x->id);
		a_s(&a, "XADD"), a_s(&a, k), a_s(&a, "*"), a_s(&a, "text");
		a_b(&a, x->pending.p, x->pending.len), a_s(&a, "attempt"), a_ll(&a, x->attempt);
		send_args(r->c, &a);
		a = (struct args){0};
		a_s(&a, "EXPIRE"), a_s(&a, k), a_ll(&a, ttl);
		send_args(r->c, &a);
	}
}

static int redis_flush_streams(struct queue *q, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	int n = 0;
	for (struct rstream *x = r->streams; x; x = x->next)
		n += x->pending.len > 0;
	if (!n)
		return WK_OK;
	/* not connected (Redis gone): the pieces are dropped rather than a step held up by a
	 * reconnect; the next take or complete reconnects */
	redisReply **rep = r->c ? calloc((size_t)n * 2, sizeof *rep) : NULL;
	int rc = !r->c ? wk_errf(err, errsz, WK_EIO, "redis %s:%d: not connected; the pieces of "
				 "%d streaming job%s were dropped", r->u.host, r->u.port, n,
				 n == 1 ? "" : "s")
		 : rep ? exec(q, append_pieces, NULL, n * 2, rep, err, errsz)
		 : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; rc == WK_OK && rep && i < n; i++)
		if (rep[2 * i]->type == REDIS_REPLY_ERROR)
			rc = wk_errf(err, errsz, WK_EIO, "redis XADD of a job's stream: %s",
				     rep[2 * i]->str);
	if (rep)
		free_replies(rep, n * 2);
	free(rep);
	/* sent or not, the pieces are gone: the results hold the whole texts */
	for (struct rstream *x = r->streams; x; x = x->next) {
		free(x->pending.p);
		x->pending = (struct wk_buf){0};
	}
	return rc;
}

/* ---- complete ---- */

struct complete_ctx {
	struct queue_result *r;
	int n;
};

/* Stores a result and announces it only when this call stored it: a pipeline re-sent after a
 * lost reply, or a second worker finishing a job it lost the lease of, finds the key and
 * announces nothing. KEYS[1] result key, KEYS[2] results stream; ARGV: json, ttl (0: none),
 * job id, results maxlen. Returns 1 when stored, 0 when a result was already there. */
static const char store_result_lua[] =
	"local ok "
	"if tonumber(ARGV[2]) > 0 then ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) "
	"else ok = redis.call('SET', KEYS[1], ARGV[1], 'NX') end "
	"if ok then redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[3]) "
	"return 1 end return 0";

static void append_complete(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	struct complete_ctx *t = ctx;
	char k[NAME_LEN + JOB_ID_MAX + 16], ks[NAME_LEN + 16];
	for (int i = 0; i < t->n; i++) {
		struct queue_result *x = &t->r[i];
		struct args a = {0};
		key(k, sizeof k, r, "result", x->job->id);
		key(ks, sizeof ks, r, "results", NULL);
		a_s(&a, "EVAL"), a_s(&a, store_result_lua), a_s(&a, "2"), a_s(&a, k), a_s(&a, ks);
		a_b(&a, x->json, x->len), a_ll(&a, r->u.result_ttl > 0 ? r->u.result_ttl : 0);
		a_s(&a, x->job->id), a_ll(&a, RESULTS_MAXLEN);
		send_args(r->c, &a);
		a = (struct args){0};
		a_s(&a, "PING"); /* keeps four replies per job */
		send_args(r->c, &a);
		a = (struct args){0};
		if (x->keep_input) {
			a_s(&a, "XADD"), a_s(&a, r->u.dead), a_s(&a, "MAXLEN"), a_s(&a, "~");
			a_ll(&a, DEAD_MAXLEN), a_s(&a, "*"), a_s(&a, "id"), a_s(&a, x->job->id);
			a_s(&a, "job"), a_b(&a, x->job->body ? x->job->body : "", x->job->body ? x->job->len : 0);
			a_s(&a, "reason"), a_s(&a, "failed input"), a_s(&a, "entry"), a_s(&a, x->job->handle);
		} else {
			a_s(&a, "PING"); /* keeps four replies per job */
		}
		send_args(r->c, &a);
		a = (struct args){0};
		a_s(&a, "XACK"), a_s(&a, r->u.stream), a_s(&a, r->u.group), a_s(&a, x->job->handle);
		send_args(r->c, &a);
	}
	append_trim(r); /* the reply after the 4 per job */
}

static int redis_complete(struct queue *q, struct queue_result *res, int n, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	redisReply **rep = calloc((size_t)n * 4 + 1, sizeof *rep);
	if (!rep)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct complete_ctx t = {.r = res, .n = n};
	/* a job's last pieces go before its result (best effort: the result is whole anyway) */
	char ferr[WK_ERRSZ];
	redis_flush_streams(q, ferr, sizeof ferr);
	for (int i = 0; i < n; i++)
		rstream_drop(r, res[i].job->id);
	int rc = exec(q, append_complete, &t, n * 4 + 1, rep, err, errsz);
	q->st.syncs++;
	if (rc == WK_OK) {
		for (int i = 0; i < n; i++) {
			const redisReply *set = rep[4 * i];
			if (set->type == REDIS_REPLY_ERROR) {
				res[i].rc = wk_errf(err, errsz, WK_EIO, "redis SET result of %s: %s", res[i].job->id,
						    set->str);
				if (rc == WK_OK)
					rc = res[i].rc;
			} else {
				/* 0: a result was there already (store_result_lua) */
				res[i].superseded = set->type == REDIS_REPLY_INTEGER && set->integer == 0;
				held_del(r, res[i].job->handle);
			}
		}
	} else {
		for (int i = 0; i < n; i++)
			res[i].rc = rc;
	}
	free_replies(rep, n * 4 + 1);
	free(rep);
	return rc;
}

/* ---- extend, release: re-XCLAIM an entry only while we still own it ---- */

/* KEYS[1] stream; ARGV: group, consumer, entry, idle_ms. Returns 1 when we owned it. */
static const char owned_claim_lua[] =
	"local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1) "
	"if p[1] and p[1][2] == ARGV[2] then "
	"redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'JUSTID') "
	"return 1 end return 0";

struct claim_ctx {
	struct queue_job *jobs;
	int n;
	long long idle_ms;
};

static void append_claims(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	struct claim_ctx *t = ctx;
	for (int i = 0; i < t->n; i++) {
		struct args a = {0};
		a_s(&a, "EVAL"), a_s(&a, owned_claim_lua), a_s(&a, "1"), a_s(&a, r->u.stream);
		a_s(&a, r->u.group), a_s(&a, q->consumer), a_s(&a, t->jobs[i].handle), a_ll(&a, t->idle_ms);
		send_args(r->c, &a);
	}
}

static int claims(struct queue *q, struct queue_job *jobs, int n, long long idle_ms, int *rcs,
		  char *err, size_t errsz)
{
	redisReply **rep = calloc((size_t)n, sizeof *rep);
	if (!rep)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct claim_ctx t = {.jobs = jobs, .n = n, .idle_ms = idle_ms};
	int rc = exec(q, append_claims, &t, n, rep, err, errsz);
	for (int i = 0; i < n && rc == WK_OK; i++) {
		int r1 = WK_OK;
		if (rep[i]->type == REDIS_REPLY_ERROR)
			r1 = wk_errf(err, errsz, WK_EIO, "redis: %s", rep[i]->str);
		else if (rep[i]->type != REDIS_REPLY_INTEGER || rep[i]->integer != 1)
			r1 = wk_errf(err, errsz, WK_ENOTFOUND, "job %s: lease lost (claimed by another consumer)",
				     jobs[i].id);
		if (rcs)
			rcs[i] = r1;
	}
	if (rc == WK_OK && rcs)
		for (int i = 0; i < n; i++)
			if (rcs[i] != WK_OK && rc == WK_OK)
				rc = rcs[i];
	if (rep)
		free_replies(rep, n);
	free(rep);
	return rc;
}

static int redis_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc,
			char *err, size_t errsz)
{
	(void)lease_s; /* the idle clock restarts; reclaimers use their own lease_s as the limit */
	int tmp[n > 0 ? n : 1];
	return claims(q, jobs, n, 0, rc ? rc : tmp, err, errsz);
}

static int redis_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	int tmp[n > 0 ? n : 1];
	/* an idle time far past any lease: the next XAUTOCLAIM by anyone takes it */
	int rc = claims(q, jobs, n, 1000LL * 86400 * 365, tmp, err, errsz);
	for (int i = 0; i < n; i++) {
		held_del(r, jobs[i].handle);
		rstream_drop(r, jobs[i].id);
	}
	return rc == WK_ENOTFOUND ? WK_OK : rc;
}

static void append_cancel_checks(struct queue *q, void *ctx)
{
	struct rq *r = q->impl;
	struct claim_ctx *t = ctx;
	char k[NAME_LEN + JOB_ID_MAX + 16];
	for (int i = 0; i < t->n; i++) {
		struct args a = {0};
		key(k, sizeof k, r, "cancel", t->jobs[i].id);
		a_s(&a, "EXISTS"), a_s(&a, k);
		send_args(r->c, &a);
	}
}

static int redis_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	redisReply **rep = calloc((size_t)n, sizeof *rep);
	if (!rep)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct claim_ctx t = {.jobs = jobs, .n = n};
	int rc = exec(q, append_cancel_checks, &t, n, rep, err, errsz);
	for (int i = 0; i < n && rc == WK_OK; i++)
		if (rep[i]->type == REDIS_REPLY_INTEGER && rep[i]->integer > 0)
			jobs[i].cancelled = true;
	if (rc == WK_OK)
		free_replies(rep, n);
	free(rep);
	return rc;
}

/* ---- producer side ---- */

/* KEYS: stream, result key, queued key; ARGV: id, job, ttl (0 = none). Refuses an id that
 * already has a result (-1) or was already queued (-2); else XADDs and returns the entry id. */
static const char submit_lua[] =
	"if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end "
	"local ok "
	"if ARGV[3] == '0' then ok = redis.call('SET', KEYS[3], '1', 'NX') "
	"else ok = redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[3]) end "
	"if not ok then return -2 end "
	"return redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'job', ARGV[2])";

static int redis_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
			size_t errsz)
{
	struct rq *r = q->impl;
	char rk[NAME_LEN + JOB_ID_MAX + 16], qk[NAME_LEN + JOB_ID_MAX + 16];
	redisReply *rep = NULL;
	struct args a = {0};
	key(rk, sizeof rk, r, "result", id);
	key(qk, sizeof qk, r, "queued", id);
	a_s(&a, "EVAL"), a_s(&a, submit_lua), a_s(&a, "3"), a_s(&a, r->u.stream), a_s(&a, rk), a_s(&a, qk);
	a_s(&a, id), a_b(&a, json, len), a_ll(&a, r->u.result_ttl);
	int rc = exec1(q, &a, &rep, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (rep->type == REDIS_REPLY_INTEGER)
		rc = wk_errf(err, errsz, WK_EINVAL, "job %s %s", id,
			     rep->integer == -1 ? "already has a result" : "was already queued");
	else if (rep->type != REDIS_REPLY_STRING)
		rc = wk_errf(err, errsz, WK_EIO, "redis XADD %s: %s", r->u.stream,
			     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
	freeReplyObject(rep);
	return rc;
}

static int redis_cancel(struct queue *q, const char *id, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	char k[NAME_LEN + JOB_ID_MAX + 16];
	redisReply *rep = NULL;
	struct args a = {0};
	key(k, sizeof k, r, "cancel", id);
	a_s(&a, "SET"), a_s(&a, k), a_s(&a, "1"), a_s(&a, "EX"), a_ll(&a, 7 * 86400);
	int rc = exec1(q, &a, &rep, err, errsz);
	if (rc == WK_OK)
		freeReplyObject(rep);
	return rc;
}

/* The id of list's last entry into last (unchanged when list is empty). */
static void pieces_last(const redisReply *list, char *last)
{
	if (!list || list->type != REDIS_REPLY_ARRAY || list->elements == 0)
		return;
	const redisReply *e = list->element[list->elements - 1];
	if (e->type == REDIS_REPLY_ARRAY && e->elements == 2 &&
	    e->element[0]->type == REDIS_REPLY_STRING && e->element[0]->len < ENTRY_ID_MAX)
		memcpy(last, e->element[0]->str, e->element[0]->len + 1);
}

/* XREAD BLOCK (left seconds, 2 s at most) on n streams from their ids; the connection's
 * timeout stretched by the block meanwhile. */
static int xread_block(struct queue *q, const char *const *keys, char *const *ids, int n,
		       double left, redisReply **rep, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	long long block = (long long)(left * 1000) + 1;
	if (block > 2000)
		block = 2000;
	struct args a = {0};
	a_s(&a, "XREAD"), a_s(&a, "COUNT"), a_s(&a, "1000"), a_s(&a, "BLOCK"), a_ll(&a, block);
	a_s(&a, "STREAMS");
	for (int i = 0; i < n; i++)
		a_s(&a, keys[i]);
	for (int i = 0; i < n; i++)
		a_s(&a, ids[i]);
	r->io_extra_s = (double)block / 1000;
	set_timeout(r);
	int rc = exec1(q, &a, rep, err, errsz);
	r->io_extra_s = 0;
	set_timeout(r);
	return rc;
}

/* The announcement stream's last id into last (unchanged when it is empty), before a first
 * look for a result: an announcement after it is not missed. */
static int last_announcement(struct queue *q, const char *ann, char *last, char *err,
			     size_t errsz)
{
	redisReply *rep = NULL;
	struct args a = {0};
	a_s(&a, "XREVRANGE"), a_s(&a, ann), a_s(&a, "+"), a_s(&a, "-"), a_s(&a, "COUNT"), a_s(&a, "1");
	int rc = exec1(q, &a, &rep, err, errsz);
	if (rc == WK_OK) {
		pieces_last(rep, last);
		freeReplyObject(rep);
	}
	return rc;
}

/* Job id's result, when stored: WK_OK with *json (malloc'd), or WK_ENOTFOUND. */
static int get_result(struct queue *q, const char *id, char **json, size_t *len, char *err,
		      size_t errsz)
{
	char k[NAME_LEN + JOB_ID_MAX + 16];
	key(k, sizeof k, q->impl, "result", id);
	redisReply *rep = NULL;
	struct args a = {0};
	a_s(&a, "GET"), a_s(&a, k);
	int rc = exec1(q, &a, &rep, err, errsz);
	if (rc != WK_OK)
		return rc;
	rc = WK_ENOTFOUND;
	if (rep->type == REDIS_REPLY_STRING) {
		rc = (*json = malloc(rep->len + 1)) ? WK_OK
						     : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		if (rc == WK_OK) {
			memcpy(*json, rep->str, rep->len);
			(*json)[rep->len] = 0;
			if (len)
				*len = rep->len;
		}
	}
	freeReplyObject(rep);
	return rc;
}

/* The entries of XREAD's answer for key, or NULL. */
static const redisReply *xread_key(const redisReply *rep, const char *key)
{
	for (size_t i = 0; rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
		const redisReply *s = rep->element[i];
		if (s->type == REDIS_REPLY_ARRAY && s->elements == 2 &&
		    s->element[0]->type == REDIS_REPLY_STRING && !strcmp(s->element[0]->str, key))
			return s->element[1];
	}
	return NULL;
}

/* Hands on each {text, attempt} entry of list and moves *last past it. */
static void pieces(const redisReply *list, char *last,
		   void (*on_piece)(void *ctx, const char *text, size_t len, int attempt), void *ctx)
{
	for (size_t i = 0; list && list->type == REDIS_REPLY_ARRAY && i < list->elements; i++) {
		const redisReply *e = list->element[i];
		if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
		    e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= ENTRY_ID_MAX)
			continue;
		memcpy(last, e->element[0]->str, e->element[0]->len + 1);
		const redisReply *f = e->element[1];
		const redisReply *text = NULL;
		int attempt = 0;
		for (size_t k = 0; f->type == REDIS_REPLY_ARRAY && k + 1 < f->elements; k += 2) {
			const redisReply *n = f->element[k], *v = f->element[k + 1];
			if (n->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
				continue;
			if (!strcmp(n->str, "text"))
				text = v;
			else if (!strcmp(n->str, "attempt"))
				attempt = atoi(v->str);
		}
		if (text)
			on_piece(ctx, text->str, text->len, attempt);
	}
}

/* Waits for job id's result, handing on its pieces as they come when on_piece is not NULL:
 * XREAD on the announcements (and the job's stream) from ids read before the first look, so
 * nothing is missed between; once the result is there, the pieces left are read first. */
static int redis_wait_stream(struct queue *q, const char *id, double timeout_s,
			     void (*on_piece)(void *ctx, const char *text, size_t len, int attempt),
			     void *ctx, char **json, size_t *len, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	char sk[NAME_LEN + JOB_ID_MAX + 16], ann[NAME_LEN + 16];
	char last[ENTRY_ID_MAX] = "0-0", last_ann[ENTRY_ID_MAX] = "0-0";
	key(sk, sizeof sk, r, "stream", id);
	key(ann, sizeof ann, r, "results", NULL);
	double deadline = wk_now() + timeout_s;
	redisReply *rep = NULL;
	int rc0 = last_announcement(q, ann, last_ann, err, errsz);
	if (rc0 != WK_OK)
		return rc0;
	for (;;) {
		/* the result first: when it is there, every piece is in */
		int rc = get_result(q, id, json, len, err, errsz);
		if (rc != WK_ENOTFOUND) {
			if (rc != WK_OK || !on_piece)
				return rc;
			struct args a = {0};
			char from[ENTRY_ID_MAX + 1];
			snprintf(from, sizeof from, "(%s", last);
			a_s(&a, "XRANGE"), a_s(&a, sk), a_s(&a, from), a_s(&a, "+");
			if (exec1(q, &a, &rep, err, errsz) == WK_OK) {
				pieces(rep, last, on_piece, ctx);
				freeReplyObject(rep);
			}
			return WK_OK;
		}
		double left = deadline - wk_now();
		if (left <= 0)
			return wk_errf(err, errsz, WK_ENOTFOUND, "no result for job %s after %.1f s", id,
				       timeout_s);
		const char *keys[2] = {ann, sk};
		char *ids[2] = {last_ann, last};
		if ((rc = xread_block(q, keys, ids, on_piece ? 2 : 1, left, &rep, err, errsz)) != WK_OK)
			return rc;
		if (on_piece)
			pieces(xread_key(rep, sk), last, on_piece, ctx);
		pieces_last(xread_key(rep, ann), last_ann); /* any announcement (or none): GET again */
		freeReplyObject(rep);
	}
}

static int redis_wait_result(struct queue *q, const char *id, double timeout_s, char **json,
			     size_t *len, char *err, size_t errsz)
{
	return redis_wait_stream(q, id, timeout_s, NULL, NULL, json, len, err, errsz);
}

/* The group's pending entries and lag (XINFO GROUPS: entries not yet delivered to it; Redis
 * 7), or the stream's length when the group does not exist yet (it is created from id 0). */
static int redis_backlog(struct queue *q, long *n, char *err, size_t errsz)
{
	struct rq *r = q->impl;
	redisReply *rep = NULL;
	struct args a = {0};
	a_s(&a, "XINFO"), a_s(&a, "GROUPS"), a_s(&a, r->u.stream);
	int rc = exec1(q, &a, &rep, err, errsz);
	if (rc != WK_OK)
		return rc;
	*n = 0;
	bool found = false;
	for (size_t g = 0; rep->type == REDIS_REPLY_ARRAY && g < rep->elements; g++) {
		const redisReply *e = rep->element[g];
		long pending = 0, lag = 0;
		bool mine = false, has_lag = false;
		for (size_t k = 0; e->type == REDIS_REPLY_ARRAY && k + 1 < e->elements; k += 2) {
			const redisReply *f = e->element[k], *v = e->element[k + 1];
			if (f->type != REDIS_REPLY_STRING && f->type != REDIS_REPLY_STATUS)
				continue;
			if (!strcmp(f->str, "name"))
				mine = v->str && !strcmp(v->str, r->u.group);
			else if (!strcmp(f->str, "pending") && v->type == REDIS_REPLY_INTEGER)
				pending = (long)v->integer;
			else if (!strcmp(f->str, "lag") && v->type == REDIS_REPLY_INTEGER)
				lag = (long)v->integer, has_lag = true;
		}
		if (mine) {
			found = true;
			*n = pending + lag;
			if (!has_lag) /* Redis < 7, or a lag it cannot know: say so */
				rc = wk_errf(err, errsz, WK_EUNSUPPORTED, "redis: the group's lag is unknown");
		}
	}
	freeReplyObject(rep);
	if (found || rc != WK_OK)
		return rc;
	a = (struct args){0};
	a_s(&a, "XLEN"), a_s(&a, r->u.stream);
	if ((rc = exec1(q, &a, &rep, err, errsz)) != WK_OK)
		return rc;
	*n = rep->type == REDIS_REPLY_INTEGER ? (long)rep->integer : 0;
	freeReplyObject(rep);
	return WK_OK;
}

const struct queue_ops queue_redis_ops = {
	.name = "redis",
	.open = redis_open,
	.close = redis_close,
	.take = redis_take,
	.complete = redis_complete,
	.extend = redis_extend,
	.release = redis_release,
	.check_cancel = redis_check_cancel,
	.submit = redis_submit,
	.wait_result = redis_wait_result,
	.cancel = redis_cancel,
	.backlog = redis_backlog,
	.streams = redis_streams,
	.stream = redis_stream,
	.flush_streams = redis_flush_streams,
	.wait_stream = redis_wait_stream,
};
