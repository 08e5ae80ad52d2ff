/*
 * ledger.c - the usage ledger's writer (format in ledger.h) and the integer money helpers.
 *
 * Durability: each event is one write() on an O_APPEND descriptor under an exclusive flock,
 * then fsync (request lines of one group commit share one fsync). The tick thread writes a
 * tick every tick_s, so a worker killed -9 leaves its lifetime to within tick_s.
 */
#include "worker/ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"

const char *const ledger_state_names[LEDGER_NSTATES] = {"starting", "idle", "busy", "draining"};

/* ---- money ---- */

int money_parse_micro(const char *s, int64_t *micro)
{
	const char *p = s;
	int64_t whole = 0, frac = 0;
	int nd = 0, nf = 0;
	if (!s)
		return WK_EINVAL;
	for (; *p >= '0' && *p <= '9'; p++, nd++) {
		whole = whole * 10 + (*p - '0');
		if (whole > MONEY_MAX_DOLLARS) /* and so no product of prices and times overflows */
			return WK_EINVAL;
	}
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++, nf++) {
			if (nf >= 6)
				return WK_EINVAL; /* finer than a micro-dollar */
			frac = frac * 10 + (*p - '0');
		}
	if (*p || (nd == 0 && nf == 0))
		return WK_EINVAL;
	for (int i = nf; i < 6; i++)
		frac *= 10;
	*micro = whole * 1000000 + frac;
	return WK_OK;
}

int64_t money_cost_micro(double seconds, int64_t price_micro_per_hour)
{
	if (!(seconds > 0) || price_micro_per_hour <= 0)
		return 0;
	if (seconds > MONEY_MAX_SECONDS) /* callers refuse these; never an overflow here */
		seconds = MONEY_MAX_SECONDS;
	__int128 us = (__int128)llround(seconds * 1e6);
	__int128 num = us * price_micro_per_hour;
	__int128 den = (__int128)3600 * 1000000;
	return (int64_t)((num + den / 2) / den);
}

void money_fmt6(char *buf, size_t n, int64_t micro)
{
	const char *sign = micro < 0 ? "-" : "";
	uint64_t m = micro < 0 ? (uint64_t)0 - (uint64_t)micro : (uint64_t)micro;
	snprintf(buf, n, "%s%" PRIu64 ".%06" PRIu64, sign, m / 1000000, m % 1000000);
}

void money_fmt_cents(char *buf, size_t n, int64_t micro)
{
	const char *sign = micro < 0 ? "-" : "";
	uint64_t m = micro < 0 ? (uint64_t)0 - (uint64_t)micro : (uint64_t)micro;
	uint64_t cents = (m + 5000) / 10000;
	snprintf(buf, n, "%s$%" PRIu64 ".%02" PRIu64, sign, cents / 100, cents % 100);
}

int64_t money_billed_seconds(double lifetime_s)
{
	if (!(lifetime_s > 0))
		return 0;
	if (lifetime_s > MONEY_MAX_SECONDS)
		lifetime_s = MONEY_MAX_SECONDS;
	int64_t us = llround(lifetime_s * 1e6);
	return (us + 999999) / 1000000;
}

void ledger_rfc3339(char *buf, size_t n, double unix_s)
{
	time_t sec = (time_t)floor(unix_s);
	int ms = (int)((unix_s - (double)sec) * 1000.0);
	if (ms > 999)
		ms = 999;
	struct tm tm;
	gmtime_r(&sec, &tm);
	snprintf(buf, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
		 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

void ledger_fmt_duration(char *buf, size_t n, double s)
{
	if (!(s >= 0))
		s = 0;
	if (s < 60) {
		snprintf(buf, n, s < 10 ? "%.3fs" : "%.1fs", s);
		return;
	}
	long t = lround(s);
	if (t < 3600)
		snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(buf, n, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
}

void ledger_bill_line(char *buf, size_t n, const char *what, double lifetime_s,
		      const struct ledger_totals *t, int gpus, const char *gpu_type,
		      int64_t price_micro_per_hour)
{
	char life[32], st[32], busy[32], idle[32], drain[32], price[32], cost[32];
	int64_t billed = money_billed_seconds(lifetime_s);
	ledger_fmt_duration(life, sizeof life, lifetime_s);
	ledger_fmt_duration(st, sizeof st, t->seconds[LEDGER_STARTING]);
	ledger_fmt_duration(busy, sizeof busy, t->seconds[LEDGER_BUSY]);
	ledger_fmt_duration(idle, sizeof idle, t->seconds[LEDGER_IDLE]);
	ledger_fmt_duration(drain, sizeof drain, t->seconds[LEDGER_DRAINING]);
	money_fmt_cents(price, sizeof price, price_micro_per_hour);
	money_fmt_cents(cost, sizeof cost, money_cost_micro((double)billed, price_micro_per_hour));
	snprintf(buf, n, "%s %s on %d\u00d7%s at %s/h: %s for %lld billed seconds (start %s, busy %s, "
		 "idle %s, drain %s)", what, life, gpus, gpu_type, price, cost, (long long)billed,
		 st, busy, idle, drain);
}

/* ---- the writer ---- */

struct ledger {
	int fd;
	char *path;
	char worker[160], host[64];
	long long boot_ms;        /* unix ms at t_start: with worker, names this run */
	uint64_t seq;
	double wall_minus_mono;   /* unix seconds - wk_now() at open */
	double t_start, tick_s;
	int64_t price;

	pthread_mutex_t mu;
	enum ledger_state st;
	double t_state;           /* wk_now() when st began */
	double seconds[LEDGER_NSTATES];
	double req_gpu;
	long reqs;
	bool exited;

	pthread_t tick;
	pthread_cond_t cv;
	bool stop, have_tick;
};

static double wall_of(const struct ledger *l, double t) { return t + l->wall_minus_mono; }

/* Adds the common fields to ev (stolen) and appends it; caller holds l->mu. */
/* Appends whole lines (one write under the lock; on failure what was written is cut off
 * again, so a live writer never leaves a torn line), then fsyncs when sync. */
static int append_lines(struct ledger *l, const char *buf, size_t len, bool sync, char *err,
			size_t errsz)
{
	int rc = WK_OK;
	flock(l->fd, LOCK_EX);
	size_t done = 0;
	while (done < len) {
		ssize_t w = write(l->fd, buf + done, len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = wk_errf(err, errsz, WK_EIO, "%s: writing the ledger: %s", l->path,
				     w < 0 ? strerror(errno) : "write returned 0");
			break;
		}
		done += (size_t)w;
	}
	if (rc != WK_OK && done > 0)
		if (ftruncate(l->fd, lseek(l->fd, 0, SEEK_END) - (off_t)done) != 0)
			rc = WK_EIO;
	flock(l->fd, LOCK_UN);
	if (rc == WK_OK && sync && fsync(l->fd) != 0)
		rc = wk_errf(err, errsz, WK_EIO, "%s: fsync: %s", l->path, strerror(errno));
	return rc;
}

/* Adds the common fields to ev (stolen) and appends it as a line: to *batch when given (the
 * caller writes the batch with append_lines), else to the file at once. Caller holds l->mu. */
static int emit_to(struct ledger *l, const char *type, json_t *ev, double t, bool sync,
		   char **batch, size_t *batch_len, char *err, size_t errsz)
{
	if (l->fd < 0) { /* no file: totals only */
		json_decref(ev);
		return WK_OK;
	}
	char ts[40], eid[240];
	ledger_rfc3339(ts, sizeof ts, wall_of(l, t));
	snprintf(eid, sizeof eid, "%s.%lld.%" PRIu64, l->worker, l->boot_ms, ++l->seq);
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:f}", "type", type, "ts", ts, "eid", eid,
			      "worker", l->worker, "boot", (json_int_t)l->boot_ms, "mono",
			      round((t - l->t_start) * 1e6) / 1e6);
	if (!o) {
		json_decref(ev);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	json_object_update(o, ev);
	json_decref(ev);
	/* 15 significant digits: seconds keep their microseconds up to 10^9 s (10 lost them
	 * from 10^4 s on, and wick usage recomputes bills from them) */
	char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
	json_decref(o);
	if (!line)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	size_t len = strlen(line);
	line[len] = '\n'; /* json_dumps' NUL becomes the newline */
	int rc = WK_OK;
	if (batch) {
		char *nb = realloc(*batch, *batch_len + len + 1);
		if (!nb) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		} else {
			memcpy(nb + *batch_len, line, len + 1);
			*batch = nb;
			*batch_len += len + 1;
		}
	} else {
		rc = append_lines(l, line, len + 1, sync, err, errsz);
	}
	free(line);
	return rc;
}

static int emit(struct ledger *l, const char *type, json_t *ev, double t, bool sync, char *err,
		size_t errsz)
{
	return emit_to(l, type, ev, t, sync, NULL, NULL, err, errsz);
}

static json_t *jsec(double s) { return json_real(round(s * 1e6) / 1e6); }

static json_t *money(json_t *o, int64_t micro)
{
	char b[40];
	money_fmt6(b, sizeof b, micro);
	json_object_set_new(o, "cost_micro_usd", json_integer(micro));
	json_object_set_new(o, "cost_usd", json_string(b));
	return o;
}

int ledger_repair(int fd, char **dropped, size_t *n_dropped, char *err, size_t errsz)
{
	*dropped = NULL;
	*n_dropped = 0;
	off_t end = lseek(fd, 0, SEEK_END);
	if (end <= 0)
		return WK_OK;
	/* find the start of the last line (after the last newline that is not the final byte) */
	char buf[4096];
	off_t pos = end, line_start = 0;
	bool ends_nl = false, first = true;
	while (pos > 0) {
		size_t chunk = pos > (off_t)sizeof buf ? sizeof buf : (size_t)pos;
		pos -= (off_t)chunk;
		if (pread(fd, buf, chunk, pos) != (ssize_t)chunk)
			return wk_errf(err, errsz, WK_EIO, "reading the ledger: %s", strerror(errno));
		size_t i = chunk;
		if (first) {
			ends_nl = buf[chunk - 1] == '\n';
			if (ends_nl)
				i--;
			first = false;
		}
		bool found = false;
		while (i > 0)
			if (buf[--i] == '\n') {
				line_start = pos + (off_t)i + 1;
				found = true;
				break;
			}
		if (found)
			break;
	}
	size_t len = (size_t)(end - line_start);
	char *line = malloc(len + 1);
	if (!line)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if (pread(fd, line, len, line_start) != (ssize_t)len) {
		free(line);
		return wk_errf(err, errsz, WK_EIO, "reading the ledger: %s", strerror(errno));
	}
	line[len] = 0;
	bool good = false;
	if (ends_nl) {
		json_t *j = json_loadb(line, len - 1, 0, NULL);
		good = j && json_is_object(j);
		json_decref(j);
	}
	if (good) {
		free(line);
		return WK_OK;
	}
	if (ftruncate(fd, line_start) != 0 || fsync(fd) != 0) {
		free(line);
		return wk_errf(err, errsz, WK_EIO, "cutting the torn ledger line: %s", strerror(errno));
	}
	*dropped = line;
	*n_dropped = len;
	return WK_OK;
}

/* Workers on this host whose last run has no worker_exit and whose pid is gone: each gets
 * an entry in crashed (the lifetime their last event proves). Runs under the open flock. */
static json_t *find_crashed(int fd, const char *host)
{
	json_t *runs = json_object(); /* "worker.boot" -> {worker, boot, pid, host, last_mono, ...} */
	json_t *crashed = json_array();
	FILE *f = fdopen(dup(fd), "r");
	if (!f || !runs || !crashed) {
		if (f)
			fclose(f);
		json_decref(runs);
		return crashed;
	}
	fseeko(f, 0, SEEK_SET);
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, f)) > 0) {
		json_t *j = json_loadb(line, (size_t)n, 0, NULL);
		const char *type = json_string_value(json_object_get(j, "type"));
		const char *wk = json_string_value(json_object_get(j, "worker"));
		json_t *boot = json_object_get(j, "boot");
		if (!type || !wk || !json_is_integer(boot)) {
			json_decref(j);
			continue;
		}
		char key[256];
		snprintf(key, sizeof key, "%s.%" JSON_INTEGER_FORMAT, wk, json_integer_value(boot));
		json_t *run = json_object_get(runs, key);
		if (!strcmp(type, "worker_start")) {
			run = json_pack("{s:s, s:I, s:O, s:O, s:f, s:s, s:O}", "worker", wk, "boot",
					json_integer_value(boot), "pid", json_object_get(j, "pid"),
					"host", json_object_get(j, "host"), "last_mono", 0.0,
					"last_state", "starting", "start_ts", json_object_get(j, "ts"));
			if (run)
				json_object_set_new(runs, key, run);
		} else if (run) {
			json_object_set(run, "last_mono", json_object_get(j, "mono"));
			json_object_set(run, "last_ts", json_object_get(j, "ts"));
			if (!strcmp(type, "worker_exit"))
				json_object_del(runs, key);
		}
		/* a recovery already noted for a run: settled */
		if (!strcmp(type, "recovery")) {
			size_t i;
			json_t *c;
			json_array_foreach(json_object_get(j, "crashed"), i, c) {
				char k2[256];
				snprintf(k2, sizeof k2, "%s.%" JSON_INTEGER_FORMAT,
					 json_string_value(json_object_get(c, "worker")),
					 json_integer_value(json_object_get(c, "boot")));
				json_object_del(runs, k2);
			}
		}
		json_decref(j);
	}
	free(line);
	fclose(f);
	const char *key;
	json_t *run;
	json_object_foreach(runs, key, run) {
		const char *h = json_string_value(json_object_get(run, "host"));
		json_int_t pid = json_integer_value(json_object_get(run, "pid"));
		if (!h || strcmp(h, host) || pid <= 0)
			continue; /* another machine's worker: cannot tell; usage still bills it */
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue; /* alive */
		double life = json_number_value(json_object_get(run, "last_mono"));
		json_t *c = json_pack("{s:O, s:O, s:O, s:f, s:I}", "worker",
				      json_object_get(run, "worker"), "boot",
				      json_object_get(run, "boot"), "last_ts",
				      json_object_get(run, "last_ts") ? json_object_get(run, "last_ts")
								     : json_object_get(run, "start_ts"),
				      "lifetime_seconds", life,
				      "billed_seconds", (json_int_t)money_billed_seconds(life));
		if (c)
			json_array_append_new(crashed, c);
	}
	json_decref(runs);
	return crashed;
}

static void *tick_main(void *arg)
{
	struct ledger *l = arg;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double at = ts.tv_sec + ts.tv_nsec * 1e-9 + l->tick_s;
		ts.tv_sec = (time_t)at;
		ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&l->cv, &l->mu, &ts);
		if (l->stop || l->exited)
			break;
		double t = wk_now();
		char err[WK_ERRSZ];
		emit(l, "tick", json_pack("{s:s, s:o}", "state", ledger_state_names[l->st],
					  "lifetime_seconds", jsec(t - l->t_start)),
		     t, true, err, sizeof err);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int ledger_open(const char *path, const struct ledger_info *in, struct ledger **lp, char *err,
		size_t errsz)
{
	*lp = NULL;
	struct ledger *l = calloc(1, sizeof *l);
	if (!l || !(l->path = strdup(path ? path : ""))) {
		free(l);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	l->fd = path ? open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
	if (path && l->fd < 0) {
		int rc = wk_errf(err, errsz, WK_EIO, "%s: opening the ledger: %s", path,
				 strerror(errno));
		free(l->path);
		free(l);
		return rc;
	}
	snprintf(l->worker, sizeof l->worker, "%s", in->worker);
	gethostname(l->host, sizeof l->host - 1);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	double wall = ts.tv_sec + ts.tv_nsec * 1e-9;
	l->wall_minus_mono = wall - wk_now();
	l->t_start = in->t_start;
	l->boot_ms = llround(wall_of(l, in->t_start) * 1e3);
	l->tick_s = in->tick_s > 0 ? in->tick_s : 1.0;
	l->price = in->price_micro_per_hour;
	l->st = LEDGER_STARTING;
	l->t_state = in->t_start;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);

	/* repair, under the lock every writer takes */
	int rc = WK_OK;
	char *dropped = NULL;
	size_t n_dropped = 0;
	json_t *crashed = NULL;
	if (l->fd >= 0) {
		flock(l->fd, LOCK_EX);
		rc = ledger_repair(l->fd, &dropped, &n_dropped, err, errsz);
		crashed = rc == WK_OK ? find_crashed(l->fd, l->host) : NULL;
		flock(l->fd, LOCK_UN);
	}
	double now = wk_now();
	if (rc == WK_OK && (dropped || json_array_size(crashed))) {
		json_t *ev = json_pack("{s:I, s:s%, s:O}", "dropped_bytes", (json_int_t)n_dropped,
				       "dropped_text", dropped ? dropped : "", n_dropped, "crashed",
				       crashed);
		if (!ev)
			ev = json_pack("{s:I, s:s, s:O}", "dropped_bytes", (json_int_t)n_dropped,
				       "dropped_text", "(not valid UTF-8)", "crashed", crashed);
		rc = emit(l, "recovery", ev, now, true, err, errsz);
	}
	free(dropped);
	json_decref(crashed);
	if (rc == WK_OK) {
		json_t *ev = json_pack("{s:s?, s:s?, s:s, s:i, s:I, s:s, s:i, s:s}", "snapshot",
				       in->snapshot, "model", in->model, "gpu_type",
				       in->gpu_type ? in->gpu_type : "unknown", "gpu_count",
				       in->gpu_count, "price_micro_usd_per_hour",
				       (json_int_t)in->price_micro_per_hour, "price_usd_per_hour", "",
				       "pid", (int)getpid(), "host", l->host);
		char b[40];
		money_fmt6(b, sizeof b, in->price_micro_per_hour);
		json_object_set_new(ev, "price_usd_per_hour", json_string(b));
		rc = emit(l, "worker_start", ev, in->t_start, true, err, errsz);
	}
	if (rc == WK_OK && l->fd >= 0 && pthread_create(&l->tick, NULL, tick_main, l) == 0)
		l->have_tick = true;
	if (rc != WK_OK) {
		ledger_close(l);
		return rc;
	}
	*lp = l;
	return WK_OK;
}

/* Closes the interval of the current state at t; caller holds mu. */
static int close_interval(struct ledger *l, double t, int next, char *err, size_t errsz)
{
	if (t < l->t_state)
		t = l->t_state;
	double secs = t - l->t_state;
	l->seconds[l->st] += secs;
	char a[40], b[40];
	ledger_rfc3339(a, sizeof a, wall_of(l, l->t_state));
	ledger_rfc3339(b, sizeof b, wall_of(l, t));
	json_t *ev = json_pack("{s:s, s:s, s:s, s:o, s:o, s:o}", "state",
			       ledger_state_names[l->st], "start", a, "end", b, "mono_start",
			       jsec(l->t_state - l->t_start), "mono_end", jsec(t - l->t_start),
			       "seconds", jsec(secs));
	/* the state that begins here, so a crash before the next tick still says what the
	 * open interval was (wick usage) */
	if (ev && next >= 0)
		json_object_set_new(ev, "next", json_string(ledger_state_names[next]));
	l->t_state = t;
	return emit(l, "state", ev, t, true, err, errsz);
}

int ledger_state(struct ledger *l, enum ledger_state st, double t, char *err, size_t errsz)
{
	if (!l)
		return WK_OK;
	pthread_mutex_lock(&l->mu);
	int rc = WK_OK;
	if (st != l->st && !l->exited) {
		rc = close_interval(l, t, (int)st, err, errsz);
		l->st = st;
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

enum ledger_state ledger_current(const struct ledger *l) { return l ? l->st : LEDGER_STARTING; }

int ledger_requests(struct ledger *l, const struct ledger_req *r, int n, char *err, size_t errsz)
{
	if (!l || n <= 0)
		return WK_OK;
	pthread_mutex_lock(&l->mu);
	int rc = WK_OK;
	double t = wk_now();
	char *batch = NULL; /* all n lines, written at once: a group is billed whole or not at all */
	size_t blen = 0;
	for (int i = 0; i < n && rc == WK_OK; i++) {
		json_t *ev = json_pack("{s:s, s:s, s:i, s:s, s:o, s:i, s:i, s:i, s:o}", "id", r[i].id,
				       "tenant", r[i].tenant && *r[i].tenant ? r[i].tenant : "default",
				       "attempt", r[i].attempt, "status", r[i].status,
				       "queue_seconds", jsec(r[i].queue_seconds), "prompt_tokens",
				       r[i].prompt_tokens, "cached_tokens", r[i].cached_tokens,
				       "completion_tokens", r[i].completion_tokens,
				       "gpu_seconds", jsec(r[i].gpu_seconds));
		if (!ev) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			break;
		}
		rc = emit_to(l, "request", money(ev, r[i].cost_micro_usd), t, true, &batch, &blen, err,
			     errsz);
	}
	if (rc == WK_OK && blen)
		rc = append_lines(l, batch, blen, true, err, errsz);
	free(batch);
	if (rc == WK_OK)
		for (int i = 0; i < n; i++) {
			l->req_gpu += r[i].gpu_seconds;
			l->reqs++;
		}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

int ledger_superseded(struct ledger *l, const char *id, int attempt, char *err, size_t errsz)
{
	if (!l)
		return WK_OK;
	json_t *ev = json_pack("{s:s, s:i}", "id", id, "attempt", attempt);
	if (!ev)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	pthread_mutex_lock(&l->mu);
	int rc = emit(l, "superseded", ev, wk_now(), true, err, errsz);
	pthread_mutex_unlock(&l->mu);
	return rc;
}

void ledger_get_totals(const struct ledger *l, double t, struct ledger_totals *tot)
{
	struct ledger *m = (struct ledger *)l;
	pthread_mutex_lock(&m->mu);
	memcpy(tot->seconds, l->seconds, sizeof tot->seconds);
	if (!l->exited && t > l->t_state)
		tot->seconds[l->st] += t - l->t_state;
	tot->request_gpu_seconds = l->req_gpu;
	tot->requests = l->reqs;
	pthread_mutex_unlock(&m->mu);
}

int ledger_exit(struct ledger *l, const char *reason, double t, struct ledger_totals *tot,
		char *err, size_t errsz)
{
	if (!l)
		return WK_OK;
	pthread_mutex_lock(&l->mu);
	int rc = WK_OK;
	if (!l->exited) {
		rc = close_interval(l, t, -1, err, errsz);
		l->exited = true;
		double life = t - l->t_start;
		int64_t billed = money_billed_seconds(life);
		json_t *ev = json_pack("{s:s, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:I, s:o}",
				       "reason", reason, "lifetime_seconds", jsec(life),
				       "billed_seconds", (json_int_t)billed,
				       "price_micro_usd_per_hour", (json_int_t)l->price, "start_seconds",
				       jsec(l->seconds[LEDGER_STARTING]), "busy_seconds",
				       jsec(l->seconds[LEDGER_BUSY]), "idle_seconds",
				       jsec(l->seconds[LEDGER_IDLE]), "drain_seconds",
				       jsec(l->seconds[LEDGER_DRAINING]), "requests",
				       (json_int_t)l->reqs, "request_gpu_seconds", jsec(l->req_gpu));
		int rc2 = emit(l, "worker_exit",
			       money(ev, money_cost_micro((double)billed, l->price)), t, true, err,
			       errsz);
		if (rc == WK_OK)
			rc = rc2;
		pthread_cond_broadcast(&l->cv);
	}
	pthread_mutex_unlock(&l->mu);
	if (tot)
		ledger_get_totals(l, t, tot);
	return rc;
}

void ledger_close(struct ledger *l)
{
	if (!l)
		return;
	if (l->have_tick) {
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->mu);
		pthread_join(l->tick, NULL);
	}
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	if (l->fd >= 0)
		close(l->fd);
	free(l->path);
	free(l);
}
