/*
 * usage.c - `wick usage LEDGER... [--by request|tenant|worker|day] [--format table|json|csv]`:
 * the bill, read back from usage ledgers (worker/ledger.h).
 *
 * Workers ("runs": one worker name + boot) are billed ceil(lifetime) seconds at their price.
 * A run that ended without worker_exit (killed -9, machine lost) is billed up to its last
 * event: ticks are written every second, so that is within a second of the truth.
 *
 * Requests: a job id is billed to its tenant once, for the attempt whose result stands: the
 * last request line with a terminal status (COMPLETED, FAILED, TIMED_OUT, CANCELLED) that no
 * "superseded" line of its run withdrew. A job runs again after a terminal line only when
 * that attempt's result was not stored (a queue that already holds a result acknowledges a
 * redelivery without running it), so the last one is the result that stands, except where
 * two attempts ran at once (a worker stalled past its lease while another took the job, or
 * a job id queued twice): the queue keeps the first result stored and the worker whose
 * result it dropped writes a superseded line for its attempt (ledger_superseded). Where
 * every terminal attempt was withdrawn (a store whose reply was lost and re-sent finds its
 * own result) the last one is billed. Every other attempt (RELEASED by a drain, an earlier
 * run whose result was lost, a withdrawn one) is overhead, shown as such. With
 * --bill-overhead proportional, each run's overhead (its billed cost minus its billed
 * requests' cost: start, idle and drain time, other attempts, and the rounding up to whole
 * seconds) is spread over that run's billed requests in proportion to their gpu_seconds, in
 * integer micro-dollars by largest remainder, so the tenants' costs add up to the workers'.
 *
 * Lines that are not JSON objects, or whose numbers are not of their kind or out of range (a
 * negative or non-finite time, a price above MONEY_MAX_DOLLARS an hour), are counted and
 * reported, never dropped silently and never billed; a book whose amounts add up past
 * BOOK_MAX_MICRO is refused as a whole.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <xxhash.h>

#include "common/wk.h"
#include "worker/cmd.h"
#include "worker/ledger.h"

struct run {
	char worker[160];
	long long boot;
	char start_ts[40], last_ts[40], gpu_type[32], reason[32];
	int gpus;
	int64_t price;
	double last_mono, closed_to; /* mono of the end of the last closed interval */
	double seconds[LEDGER_NSTATES];
	char open_state[16];         /* the state of the open interval: the latest tick's, or the
				      * next of a later state line */
	double open_mono;            /* the mono of the line that said it */
	bool exited;
	double lifetime;
	int64_t billed, cost;
	long requests;
	int64_t req_cost;            /* billed requests in this run */
	int64_t unallocated;         /* spread: overhead no billed request could carry */
	int64_t exit_price, exit_cost; /* from worker_exit (-1: absent): a run whose
					  * worker_start line is missing is priced from them */
	double busy_util;
};

struct req {
	char id[160], tenant[160], status[16], ts[40];
	int attempt, run;
	int prompt, cached, completion; /* cached: 0 in a ledger from before the prefix cache */
	double gpu, queue;
	int64_t cost, overhead_share;
	bool billed, superseded;
};

struct sup { /* a superseded line: applied once every file is read (lines may come in any order) */
	char id[160];
	int run, attempt;
};

struct book {
	struct run *runs;
	int n_runs, cap_runs;
	struct req *reqs;
	int n_reqs, cap_reqs;
	struct sup *sups;
	int n_sups, cap_sups;
	uint64_t *eids;              /* open addressing: hashes of the eids read (0: empty) */
	size_t cap_eids, n_eids;
	long bad_lines, recoveries, dup_lines, unpriced;
};

/* Whether the event id eid was read before (the same ledger given twice, or copies of lines
 * in two files); records it. A 64-bit hash stands for the id (a false match: ~1 in 10^13 for
 * a million lines). WK_OK, or WK_ENOMEM. */
static int seen_eid(struct book *b, const char *eid, bool *seen)
{
	uint64_t h = XXH3_64bits(eid, strlen(eid));
	h = h ? h : 1;
	if (2 * (b->n_eids + 1) > b->cap_eids) {
		size_t cap = b->cap_eids ? 2 * b->cap_eids : 1024;
		uint64_t *t = calloc(cap, sizeof *t);
		if (!t)
			return WK_ENOMEM;
		for (size_t i = 0; i < b->cap_eids; i++)
			if (b->eids[i])
				for (size_t k = b->eids[i] & (cap - 1);; k = (k + 1) & (cap - 1))
					if (!t[k]) {
						t[k] = b->eids[i];
						break;
					}
		free(b->eids);
		b->eids = t;
		b->cap_eids = cap;
	}
	for (size_t k = h & (b->cap_eids - 1);; k = (k + 1) & (b->cap_eids - 1)) {
		if (b->eids[k] == h) {
			*seen = true;
			return WK_OK;
		}
		if (!b->eids[k]) {
			b->eids[k] = h;
			b->n_eids++;
			*seen = false;
			return WK_OK;
		}
	}
}

static void book_free(struct book *b)
{
	free(b->runs);
	free(b->reqs);
	free(b->sups);
	free(b->eids);
}

/* Room for one more element in *arr (n used of *cap, each elem bytes; first: the capacity
 * of the first allocation): false when out of memory. */
static bool grow(void *arr, int n, int *cap, size_t elem, int first)
{
	if (n < *cap)
		return true;
	int c2 = *cap ? 2 * *cap : first;
	void *p = realloc(*(void **)arr, (size_t)c2 * elem);
	if (!p)
		return false;
	*(void **)arr = p;
	*cap = c2;
	return true;
}

static int find_run(struct book *b, const char *worker, long long boot, bool create)
{
	for (int i = 0; i < b->n_runs; i++)
		if (b->runs[i].boot == boot && !strcmp(b->runs[i].worker, worker))
			return i;
	if (!create)
		return -1;
	if (!grow(&b->runs, b->n_runs, &b->cap_runs, sizeof *b->runs, 16))
		return -1;
	struct run *r = &b->runs[b->n_runs];
	memset(r, 0, sizeof *r);
	r->exit_price = r->exit_cost = -1;
	snprintf(r->worker, sizeof r->worker, "%s", worker);
	r->boot = boot;
	snprintf(r->open_state, sizeof r->open_state, "starting");
	return b->n_runs++;
}

static const char *jstr(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "";
}

static double jnum(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* The most the amounts of one book (runs' and requests' costs) may add up to, about $1.15
 * trillion, so that no sum or share of them overflows an int64_t. */
#define BOOK_MAX_MICRO ((int64_t)1 << 60)

/* The numbers the reader takes from an event: where present, each must be of its kind and in
 * its range, else the line is not read. */
static const struct field {
	const char *key;
	bool integer;
	double max;
} fields[] = {
	{"mono", false, MONEY_MAX_SECONDS},
	{"seconds", false, MONEY_MAX_SECONDS},
	{"mono_end", false, MONEY_MAX_SECONDS},
	{"lifetime_seconds", false, MONEY_MAX_SECONDS},
	{"gpu_seconds", false, MONEY_MAX_SECONDS},
	{"queue_seconds", false, MONEY_MAX_SECONDS},
	{"price_micro_usd_per_hour", true, MONEY_MAX_DOLLARS * 1e6},
	{"cost_micro_usd", true, (double)BOOK_MAX_MICRO},
	{"attempt", true, INT_MAX},
	{"prompt_tokens", true, INT_MAX},
	{"cached_tokens", true, INT_MAX},
	{"completion_tokens", true, INT_MAX},
	{"gpu_count", true, INT_MAX},
};

/* The first of fields that j holds out of kind or range (NULL: none); *what says how. */
static const char *bad_field(json_t *j, const char **what)
{
	for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
		const struct field *f = &fields[i];
		json_t *v = json_object_get(j, f->key);
		if (!v)
			continue;
		double x = json_number_value(v);
		if (f->integer ? !json_is_integer(v) || json_integer_value(v) < 0 ||
					 (double)json_integer_value(v) > f->max
			       : !json_is_number(v) || !(x >= 0 && x <= f->max)) {
			*what = f->integer ? "not a whole number in range" :
					     "not a number of seconds in [0, 1e9]";
			return f->key;
		}
	}
	return NULL;
}

static int state_index(const char *s)
{
	for (int i = 0; i < LEDGER_NSTATES; i++)
		if (!strcmp(s, ledger_state_names[i]))
			return i;
	return -1;
}

static bool terminal(const char *st)
{
	return !strcmp(st, "COMPLETED") || !strcmp(st, "FAILED") || !strcmp(st, "TIMED_OUT") ||
	       !strcmp(st, "CANCELLED");
}

static int read_ledger(struct book *b, const char *path, char *err, size_t errsz)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st)) {
		int e = errno;
		fclose(f);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", path, strerror(e));
	}
	if (S_ISDIR(st.st_mode)) { /* pipes (<(...), /dev/stdin) are read like files */
		fclose(f);
		return wk_errf(err, errsz, WK_EINVAL, "%s: not a ledger file (a directory)", path);
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	long lineno = 0, events = 0, skipped = b->bad_lines;
	int rc = WK_OK;
	while ((n = getline(&line, &cap, f)) > 0 && rc == WK_OK) {
		lineno++;
		json_t *j = json_loadb(line, (size_t)n, 0, NULL);
		const char *type = json_string_value(json_object_get(j, "type"));
		json_t *boot = json_object_get(j, "boot");
		if (!json_is_object(j) || !type || !json_is_integer(boot) ||
		    !json_string_value(json_object_get(j, "worker"))) {
			if (!(n == 1 && line[0] == '\n')) {
				b->bad_lines++;
				if (b->bad_lines - skipped <= 5)
					fprintf(stderr, "wick usage: %s:%ld: not a ledger event; "
						"skipped\n", path, lineno);
			}
			json_decref(j);
			continue;
		}
		const char *what, *bad = bad_field(j, &what);
		if (bad) {
			b->bad_lines++;
			if (b->bad_lines - skipped <= 5)
				fprintf(stderr, "wick usage: %s:%ld: \"%s\" is %s; line skipped\n", path,
					lineno, bad, what);
			json_decref(j);
			continue;
		}
		events++;
		const char *eid = json_string_value(json_object_get(j, "eid"));
		bool dup = false;
		if (eid && seen_eid(b, eid, &dup) != WK_OK) {
			json_decref(j);
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			break;
		}
		if (dup) { /* counted once: the same file given twice, or a line copied */
			b->dup_lines++;
			json_decref(j);
			continue;
		}
		int ri = find_run(b, jstr(j, "worker"), json_integer_value(boot), true);
		if (ri < 0) {
			json_decref(j);
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			break;
		}
		struct run *r = &b->runs[ri];
		double mono = jnum(j, "mono");
		if (mono > r->last_mono) {
			r->last_mono = mono;
			snprintf(r->last_ts, sizeof r->last_ts, "%s", jstr(j, "ts"));
		}
		if (!strcmp(type, "worker_start")) {
			snprintf(r->start_ts, sizeof r->start_ts, "%s", jstr(j, "ts"));
			if (!*r->last_ts)
				snprintf(r->last_ts, sizeof r->last_ts, "%s", jstr(j, "ts"));
			snprintf(r->gpu_type, sizeof r->gpu_type, "%s", jstr(j, "gpu_type"));
			r->gpus = (int)json_integer_value(json_object_get(j, "gpu_count"));
			r->price = json_integer_value(json_object_get(j, "price_micro_usd_per_hour"));
		} else if (!strcmp(type, "state")) {
			int si = state_index(jstr(j, "state"));
			if (si >= 0)
				r->seconds[si] += jnum(j, "seconds");
			if (jnum(j, "mono_end") > r->closed_to)
				r->closed_to = jnum(j, "mono_end");
			if (*jstr(j, "next") && mono >= r->open_mono) {
				snprintf(r->open_state, sizeof r->open_state, "%s", jstr(j, "next"));
				r->open_mono = mono;
			}
		} else if (!strcmp(type, "tick")) {
			if (mono >= r->open_mono) { /* lines may come in any order */
				snprintf(r->open_state, sizeof r->open_state, "%s", jstr(j, "state"));
				r->open_mono = mono;
			}
		} else if (!strcmp(type, "worker_exit")) {
			r->exited = true;
			r->lifetime = jnum(j, "lifetime_seconds");
			snprintf(r->reason, sizeof r->reason, "%s", jstr(j, "reason"));
			json_t *p = json_object_get(j, "price_micro_usd_per_hour");
			json_t *c = json_object_get(j, "cost_micro_usd");
			if (json_is_integer(p))
				r->exit_price = json_integer_value(p);
			if (json_is_integer(c))
				r->exit_cost = json_integer_value(c);
		} else if (!strcmp(type, "recovery")) {
			b->recoveries++;
		} else if (!strcmp(type, "request")) {
			if (!grow(&b->reqs, b->n_reqs, &b->cap_reqs, sizeof *b->reqs, 64)) {
				json_decref(j);
				rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
				break;
			}
			struct req *q = &b->reqs[b->n_reqs++];
			memset(q, 0, sizeof *q);
			snprintf(q->id, sizeof q->id, "%s", jstr(j, "id"));
			snprintf(q->tenant, sizeof q->tenant, "%s", jstr(j, "tenant"));
			snprintf(q->status, sizeof q->status, "%s", jstr(j, "status"));
			snprintf(q->ts, sizeof q->ts, "%s", jstr(j, "ts"));
			q->attempt = (int)json_integer_value(json_object_get(j, "attempt"));
			q->run = ri;
			q->prompt = (int)json_integer_value(json_object_get(j, "prompt_tokens"));
			q->cached = (int)json_integer_value(json_object_get(j, "cached_tokens"));
			q->completion = (int)json_integer_value(json_object_get(j, "completion_tokens"));
			q->gpu = jnum(j, "gpu_seconds");
			q->queue = jnum(j, "queue_seconds");
			q->cost = json_integer_value(json_object_get(j, "cost_micro_usd"));
		} else if (!strcmp(type, "superseded")) {
			if (!grow(&b->sups, b->n_sups, &b->cap_sups, sizeof *b->sups, 16)) {
				json_decref(j);
				rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
				break;
			}
			struct sup *s = &b->sups[b->n_sups++];
			snprintf(s->id, sizeof s->id, "%s", jstr(j, "id"));
			s->run = ri;
			s->attempt = (int)json_integer_value(json_object_get(j, "attempt"));
		}
		json_decref(j);
	}
	if (rc == WK_OK && ferror(f))
		rc = wk_errf(err, errsz, WK_EIO, "%s: read failed: %s", path, strerror(errno));
	else if (rc == WK_OK && lineno > 0 && events == 0)
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: not a ledger: none of its %ld lines is a "
			     "ledger event", path, lineno);
	else if (rc == WK_OK && lineno == 0)
		fprintf(stderr, "wick usage: %s: empty; nothing billed from it\n", path);
	if (rc == WK_OK && b->bad_lines - skipped > 5)
		fprintf(stderr, "wick usage: %s: %ld more unreadable lines skipped\n",
			path, b->bad_lines - skipped - 5);
	free(line);
	fclose(f);
	return rc;
}

static int cmp_req_time(const void *a, const void *b)
{
	const struct req *x = a, *y = b;
	int c = strcmp(x->ts, y->ts);
	return c ? c : x->attempt - y->attempt;
}

/* qsort's order for an index into by_id_reqs (time-sorted): by tenant and id (two tenants'
 * jobs may share an id: queues are theirs), then by position */
static const struct req *by_id_reqs;

static int cmp_ix_by_id(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	int c = strcmp(by_id_reqs[x].tenant, by_id_reqs[y].tenant);
	if (!c)
		c = strcmp(by_id_reqs[x].id, by_id_reqs[y].id);
	return c ? c : x - y;
}

/* qsort's order for an index into by_id_reqs: by run, then by position */
static int cmp_ix_by_run(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	int c = by_id_reqs[x].run - by_id_reqs[y].run;
	return c ? c : x - y;
}

struct frac {
	__int128 r; /* the remainder of a share's division */
	int k;
};

static int cmp_frac_desc(const void *a, const void *b)
{
	const struct frac *x = a, *y = b;
	return x->r < y->r ? 1 : x->r > y->r ? -1 : x->k - y->k;
}

/* Spreads over (positive or negative: the requests' own costs are each rounded, so they may
 * add up to a few micro-dollars more than the run's) over the requests ix[0..n) in proportion
 * to their gpu_seconds, in integer micro-dollars by largest remainder. The weights are whole
 * nanoseconds and the shares exact integer divisions, so they add up to over exactly (a
 * floating-point quotient can round a share's floor up past it). Returns false when none has
 * gpu time to weigh by (the caller keeps it unallocated). */
static bool spread_run(struct req *reqs, const int *ix, int n, int64_t over, struct frac *fr)
{
	__int128 wsum = 0; /* each weight at most 1e18 (gpu_seconds <= 1e9), mag below 2^61 */
	for (int k = 0; k < n; k++)
		wsum += reqs[ix[k]].gpu > 0 ? llround(reqs[ix[k]].gpu * 1e9) : 0;
	if (wsum <= 0)
		return false;
	int64_t mag = over < 0 ? -over : over, given = 0;
	for (int k = 0; k < n; k++) {
		__int128 w = reqs[ix[k]].gpu > 0 ? llround(reqs[ix[k]].gpu * 1e9) : 0;
		__int128 num = w * mag;
		reqs[ix[k]].overhead_share = (int64_t)(num / wsum);
		given += reqs[ix[k]].overhead_share;
		fr[k] = (struct frac){num % wsum, k};
	}
	qsort(fr, (size_t)n, sizeof *fr, cmp_frac_desc);
	for (int k = 0; given < mag; k = (k + 1) % n, given++)
		reqs[ix[fr[k].k]].overhead_share++;
	if (over < 0)
		for (int k = 0; k < n; k++)
			reqs[ix[k]].overhead_share = -reqs[ix[k]].overhead_share;
	return true;
}

/* Settles runs (crashed ones up to their last event), picks the billed attempt of each job,
 * and spreads overhead when asked. WK_OK, WK_ELIMIT (amounts past BOOK_MAX_MICRO) or
 * WK_ENOMEM. */
static int settle(struct book *b, bool spread, char *err, size_t errsz)
{
	__int128 total = 0; /* every amount of the book, each at most BOOK_MAX_MICRO */
	for (int i = 0; i < b->n_reqs; i++)
		total += b->reqs[i].cost;
	for (int i = 0; i < b->n_runs; i++) {
		struct run *r = &b->runs[i];
		if (!r->exited) { /* crashed: the open interval runs to the last event */
			r->lifetime = r->last_mono;
			int si = state_index(r->open_state);
			if (si >= 0 && r->last_mono > r->closed_to)
				r->seconds[si] += r->last_mono - r->closed_to;
			snprintf(r->reason, sizeof r->reason, "crashed");
		}
		r->billed = money_billed_seconds(r->lifetime);
		if (!*r->start_ts && r->exit_price >= 0) /* no worker_start: the exit's price */
			r->price = r->exit_price;
		if ((__int128)r->billed * r->price > (__int128)BOOK_MAX_MICRO * 3600)
			return wk_errf(err, errsz, WK_ELIMIT, "worker %s (boot %lld): %" PRId64 " s at "
				       "%" PRId64 " micro-dollars an hour is more than a bill can hold",
				       r->worker, r->boot, r->billed, r->price);
		r->cost = money_cost_micro((double)r->billed, r->price);
		if (!*r->start_ts && r->exit_price < 0 && r->exit_cost >= 0) {
			r->cost = r->exit_cost; /* an older exit line: its cost as written */
		} else if (!*r->start_ts && r->exit_price < 0) {
			b->unpriced++;
			fprintf(stderr, "wick usage: worker %s (boot %lld) has no worker_start line and "
					"no worker_exit to price it (a ledger cut or rotated?): its %" PRId64
					" s are billed $0\n", r->worker, r->boot, r->billed);
		}
		total += r->cost;
	}
	if (total > BOOK_MAX_MICRO)
		return wk_errf(err, errsz, WK_ELIMIT, "the ledgers' amounts add up to more than $%"
			       PRId64 ": not a bill (a damaged or edited ledger?)",
			       BOOK_MAX_MICRO / 1000000);
	if (b->n_reqs) /* reqs is NULL in a ledger without request lines */
		qsort(b->reqs, (size_t)b->n_reqs, sizeof *b->reqs, cmp_req_time);
	/* superseded lines withdraw the latest terminal line of their attempt in their run */
	for (int k = 0; k < b->n_sups; k++)
		for (int i = b->n_reqs - 1; i >= 0; i--) {
			struct req *q = &b->reqs[i];
			if (q->run == b->sups[k].run && q->attempt == b->sups[k].attempt &&
			    !q->superseded && terminal(q->status) && !strcmp(q->id, b->sups[k].id)) {
				q->superseded = true;
				break;
			}
		}
	/* each job's attempts in time order (the index sorted by tenant and id, then position) */
	int *ix = malloc((size_t)(b->n_reqs ? b->n_reqs : 1) * sizeof *ix);
	struct frac *fr = malloc((size_t)(b->n_reqs ? b->n_reqs : 1) * sizeof *fr);
	if (!ix || !fr) {
		free(ix);
		free(fr);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	for (int i = 0; i < b->n_reqs; i++)
		ix[i] = i;
	by_id_reqs = b->reqs;
	qsort(ix, (size_t)b->n_reqs, sizeof *ix, cmp_ix_by_id);
	for (int g = 0, e; g < b->n_reqs; g = e) {
		const struct req *q0 = &b->reqs[ix[g]];
		for (e = g + 1; e < b->n_reqs && !strcmp(b->reqs[ix[e]].id, q0->id) &&
				!strcmp(b->reqs[ix[e]].tenant, q0->tenant);
		     e++)
			;
		/* the last terminal attempt not withdrawn; failing that, the last terminal one */
		int pick = -1;
		for (int k = e - 1; k >= g && pick < 0; k--)
			if (terminal(b->reqs[ix[k]].status) && !b->reqs[ix[k]].superseded)
				pick = ix[k];
		for (int k = e - 1; k >= g && pick < 0; k--)
			if (terminal(b->reqs[ix[k]].status))
				pick = ix[k];
		if (pick >= 0) {
			struct req *q = &b->reqs[pick];
			q->billed = true;
			b->runs[q->run].requests++;
			b->runs[q->run].req_cost += q->cost;
		}
	}
	if (spread) {
		/* each run's billed requests, by run: its overhead (its cost less theirs; start,
		 * idle and drain time, other attempts, the rounding up to whole seconds) over
		 * them by gpu_seconds; a run with none (or none with gpu time) keeps it
		 * unallocated, shown as such, so the tenants' costs and it add up to the runs' */
		int m = 0;
		for (int i = 0; i < b->n_reqs; i++)
			if (b->reqs[i].billed)
				ix[m++] = i;
		qsort(ix, (size_t)m, sizeof *ix, cmp_ix_by_run);
		int g = 0;
		for (int ri = 0; ri < b->n_runs; ri++) {
			int e = g;
			while (e < m && b->reqs[ix[e]].run == ri)
				e++;
			struct run *r = &b->runs[ri];
			int64_t over = r->cost - r->req_cost;
			if (over != 0 && !spread_run(b->reqs, ix + g, e - g, over, fr))
				r->unallocated = over;
			g = e;
		}
	}
	free(ix);
	free(fr);
	return WK_OK;
}

/* ---- output ---- */

enum fmt { F_TABLE, F_JSON, F_CSV };

struct col { const char *name; char val[200]; };

/* One row: a table line, a CSV line, or a JSON object appended to arr. Numeric columns are
 * those whose name ends in _seconds, _tokens, _usd, _count or is requests/attempt. */
static bool numeric(const char *name, const char *val)
{
	if (!*val)
		return false;
	char *end;
	strtod(val, &end);
	return !*end && strcmp(name, "id") && strcmp(name, "tenant") && strcmp(name, "worker") &&
	       strcmp(name, "day");
}

static void row(enum fmt f, struct col *c, int n, bool header, json_t *arr)
{
	if (f == F_JSON) {
		if (header)
			return;
		json_t *o = json_object();
		for (int i = 0; i < n; i++) {
			size_t nl = strlen(c[i].name);
			bool money = nl > 4 && !strcmp(c[i].name + nl - 4, "_usd");
			if (numeric(c[i].name, c[i].val) && !money)
				json_object_set_new(o, c[i].name,
						    strchr(c[i].val, '.')
							    ? json_real(strtod(c[i].val, NULL))
							    : json_integer(strtoll(c[i].val, NULL, 10)));
			else
				json_object_set_new(o, c[i].name, json_string(c[i].val));
		}
		json_array_append_new(arr, o);
		return;
	}
	for (int i = 0; i < n; i++) {
		const char *v = header ? c[i].name : c[i].val;
		if (f == F_CSV) {
			bool q = strpbrk(v, ",\"\n\r") != NULL;
			fputs(i ? "," : "", stdout);
			if (q) {
				putchar('"');
				for (const char *p = v; *p; p++) {
					if (*p == '"')
						putchar('"');
					putchar(*p);
				}
				putchar('"');
			} else {
				fputs(v, stdout);
			}
		} else {
			int w = (int)strlen(c[i].name);
			if (w < 10)
				w = 10;
			printf(i ? "  %*s" : "%-*s", i ? w : 24, v);
		}
	}
	putchar('\n');
}

static void setc(struct col *c, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void setc(struct col *c, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	c->name = name;
	vsnprintf(c->val, sizeof c->val, fmt, ap);
	va_end(ap);
}

static void setm(struct col *c, const char *name, int64_t micro)
{
	c->name = name;
	money_fmt6(c->val, sizeof c->val, micro);
}

struct agg {
	char key[160];
	long requests, overhead_attempts;
	long long prompt, cached, completion;
	double gpu, overhead_gpu;
	int64_t cost, overhead_cost, workers_cost;
};

static struct agg *agg_get(struct agg **a, int *n, const char *key)
{
	for (int i = 0; i < *n; i++)
		if (!strcmp((*a)[i].key, key))
			return &(*a)[i];
	struct agg *g = realloc(*a, (size_t)(*n + 1) * sizeof *g);
	if (!g)
		return NULL;
	*a = g;
	memset(&g[*n], 0, sizeof g[*n]);
	snprintf(g[*n].key, sizeof g[*n].key, "%s", key);
	return &g[(*n)++];
}

/* Seconds since the epoch of an RFC 3339 UTC time as the ledger writes it
 * ("2026-12-04T08:56:13.575Z"); NAN when it is not one. */
static double ts_unix(const char *ts)
{
	struct tm tm = {0};
	double frac = 0;
	int n = 0;
	if (sscanf(ts, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6)
		return NAN;
	if (ts[n] == '.')
		frac = strtod(ts + n, NULL);
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (double)timegm(&tm) + frac;
}

/* A run's billed cost over the UTC days its life spans, in proportion to its seconds in
 * each, floored, with what the floors left (fewer micro-dollars than days) to the day of the
 * largest fraction, so the days add up to the run exactly; added to those days' rows. A run
 * without a worker_start line is placed by its last event. WK_OK or WK_ENOMEM. */
static int run_days(const struct run *r, struct agg **a, int *na)
{
	double start = *r->start_ts ? ts_unix(r->start_ts) : ts_unix(r->last_ts) - r->lifetime;
	if (isnan(start))
		start = 0;
	double end = start + (r->lifetime > 0 ? r->lifetime : 0);
	long long d0 = (long long)floor(start / 86400), d1 = (long long)floor(end / 86400);
	if (end > start && end == (double)d1 * 86400)
		d1--; /* a life ending at midnight spends nothing in the next day */
	int nd = (int)(d1 - d0 + 1 > 0 && d1 - d0 < 100000 ? d1 - d0 + 1 : 1);
	int64_t given = 0;
	int best = -1;
	double bestf = -1;
	for (int k = 0; k < nd; k++) {
		double lo = fmax(start, (double)(d0 + k) * 86400), hi = fmin(end, (double)(d0 + k + 1) * 86400);
		double exact = end > start ? (hi - lo) / (end - start) * (double)r->cost : (double)r->cost;
		int64_t fl = (int64_t)floor(exact);
		char key[16];
		time_t t = (time_t)((d0 + k) * 86400);
		struct tm tm;
		gmtime_r(&t, &tm);
		strftime(key, sizeof key, "%Y-%m-%d", &tm);
		struct agg *g = agg_get(a, na, key);
		if (!g)
			return WK_ENOMEM;
		g->workers_cost += fl;
		given += fl;
		if (exact - (double)fl > bestf) {
			bestf = exact - (double)fl;
			best = (int)(g - *a);
		}
	}
	if (given < r->cost && best >= 0)
		(*a)[best].workers_cost += r->cost - given;
	return WK_OK;
}

static void usage_help(FILE *f)
{
	fprintf(f,
		"usage: wick usage LEDGER... [--by request|tenant|worker|day] [--format table|json|csv]\n"
		"                  [--bill-overhead none|proportional]\n"
		"       wick usage --quote SECONDS [--price-per-hour USD]\n\n"
		"Reads usage ledgers written by `wick worker --ledger` and prints the bill: totals,\n"
		"the start/busy/idle/drain split, utilisation, and cost by request, tenant, worker\n"
		"or day. Workers are billed ceil(lifetime) seconds. A job (tenant, id) is billed\n"
		"once, for the attempt whose result stands; other attempts are overhead.\n"
		"--bill-overhead proportional spreads each worker's overhead over its requests by\n"
		"gpu_seconds (a worker with none keeps it in a \"(no requests)\" row). A line read\n"
		"twice (a ledger given twice) counts once.\n");
}

int cmd_usage(int argc, char **argv)
{
	enum { O_BY = 256, O_FMT, O_OVER, O_QUOTE, O_PRICE };
	static const struct option opts[] = {
		{"by", required_argument, 0, O_BY}, {"format", required_argument, 0, O_FMT},
		{"bill-overhead", required_argument, 0, O_OVER},
		{"quote", required_argument, 0, O_QUOTE},
		{"price-per-hour", required_argument, 0, O_PRICE}, {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	const char *by = "tenant";
	enum fmt f = F_TABLE;
	bool spread = false;
	const char *quote = NULL;
	int64_t price = 36310000;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_BY:
			if (strcmp(optarg, "request") && strcmp(optarg, "tenant") &&
			    strcmp(optarg, "worker") && strcmp(optarg, "day")) {
				fprintf(stderr, "wick usage: --by is request, tenant, worker or day, not '%s'\n", optarg);
				return 2;
			}
			by = optarg;
			break;
		case O_FMT:
			if (!strcmp(optarg, "table"))
				f = F_TABLE;
			else if (!strcmp(optarg, "json"))
				f = F_JSON;
			else if (!strcmp(optarg, "csv"))
				f = F_CSV;
			else {
				fprintf(stderr, "wick usage: --format is table, json or csv, not '%s'\n", optarg);
				return 2;
			}
			break;
		case O_OVER:
			if (strcmp(optarg, "none") && strcmp(optarg, "proportional")) {
				fprintf(stderr, "wick usage: --bill-overhead is none or proportional, not '%s'\n", optarg);
				return 2;
			}
			spread = !strcmp(optarg, "proportional");
			break;
		case O_QUOTE: quote = optarg; break;
		case O_PRICE:
			if (money_parse_micro(optarg, &price) != WK_OK) {
				fprintf(stderr, "wick usage: --price-per-hour wants a dollar amount like 36.31, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'h': usage_help(stdout); return 0;
		default: usage_help(stderr); return 2;
		}
	}
	if (quote) {
		char *end;
		double secs = strtod(quote, &end);
		if (end == quote || *end || !(secs >= 0 && secs <= MONEY_MAX_SECONDS)) {
			fprintf(stderr, "wick usage: --quote wants seconds, not '%s'\n", quote);
			return 2;
		}
		int64_t billed = money_billed_seconds(secs);
		int64_t cost = money_cost_micro((double)billed, price);
		char p6[40], c6[40], cc[40], pc[40];
		money_fmt6(p6, sizeof p6, price);
		money_fmt_cents(pc, sizeof pc, price);
		money_fmt6(c6, sizeof c6, cost);
		money_fmt_cents(cc, sizeof cc, cost);
		printf("%" PRId64 " billed seconds at %s/h: %s (%s before rounding to cents)\n", billed,
		       pc, cc, c6);
		(void)p6;
		return 0;
	}
	if (optind >= argc) {
		fprintf(stderr, "wick usage: give at least one LEDGER file\n");
		usage_help(stderr);
		return 2;
	}
	struct book b = {0};
	char err[WK_ERRSZ];
	for (int i = optind; i < argc; i++)
		if (read_ledger(&b, argv[i], err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick usage: %s\n", err);
			book_free(&b);
			return 1;
		}
	if (settle(&b, spread, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick usage: %s\n", err);
		book_free(&b);
		return 1;
	}

	/* totals */
	double life = 0, secs[LEDGER_NSTATES] = {0}, billed_gpu = 0, over_gpu = 0;
	int64_t billed_s = 0, cost = 0, req_cost = 0, over_req_cost = 0;
	long nreq = 0, nover = 0;
	for (int i = 0; i < b.n_runs; i++) {
		life += b.runs[i].lifetime;
		billed_s += b.runs[i].billed;
		cost += b.runs[i].cost;
		for (int s = 0; s < LEDGER_NSTATES; s++)
			secs[s] += b.runs[i].seconds[s];
	}
	for (int i = 0; i < b.n_reqs; i++) {
		if (b.reqs[i].billed) {
			nreq++;
			billed_gpu += b.reqs[i].gpu;
			req_cost += b.reqs[i].cost;
		} else {
			nover++;
			over_gpu += b.reqs[i].gpu;
			over_req_cost += b.reqs[i].cost;
		}
	}

	json_t *arr = json_array();
	struct col cols[16];
	int nc = 0;
	if (!strcmp(by, "request")) {
		for (int i = 0; i < b.n_reqs; i++) {
			struct req *q = &b.reqs[i];
			nc = 0;
			setc(&cols[nc++], "id", "%s", q->id);
			setc(&cols[nc++], "tenant", "%s", q->tenant);
			setc(&cols[nc++], "attempt", "%d", q->attempt);
			setc(&cols[nc++], "status", "%s", q->status);
			setc(&cols[nc++], "billed", "%s", q->billed ? "yes" : "overhead");
			setc(&cols[nc++], "prompt_tokens", "%d", q->prompt);
			setc(&cols[nc++], "cached_tokens", "%d", q->cached);
			setc(&cols[nc++], "completion_tokens", "%d", q->completion);
			setc(&cols[nc++], "gpu_seconds", "%.6f", q->gpu);
			setm(&cols[nc++], "cost_usd", q->billed ? q->cost + q->overhead_share : 0);
			setm(&cols[nc++], "overhead_cost_usd", q->billed ? q->overhead_share : q->cost);
			if (i == 0)
				row(f, cols, nc, true, arr);
			row(f, cols, nc, false, arr);
		}
	} else if (!strcmp(by, "worker")) {
		for (int i = 0; i < b.n_runs; i++) {
			struct run *r = &b.runs[i];
			nc = 0;
			setc(&cols[nc++], "worker", "%s", r->worker);
			setc(&cols[nc++], "start", "%s", r->start_ts);
			setc(&cols[nc++], "exit", "%s", r->reason);
			setc(&cols[nc++], "lifetime_seconds", "%.3f", r->lifetime);
			setc(&cols[nc++], "billed_seconds", "%" PRId64, r->billed);
			setc(&cols[nc++], "start_seconds", "%.3f", r->seconds[LEDGER_STARTING]);
			setc(&cols[nc++], "busy_seconds", "%.3f", r->seconds[LEDGER_BUSY]);
			setc(&cols[nc++], "idle_seconds", "%.3f", r->seconds[LEDGER_IDLE]);
			setc(&cols[nc++], "drain_seconds", "%.3f", r->seconds[LEDGER_DRAINING]);
			setc(&cols[nc++], "utilisation", "%.3f",
			     r->lifetime > 0 ? r->seconds[LEDGER_BUSY] / r->lifetime : 0);
			setc(&cols[nc++], "requests", "%ld", r->requests);
			setm(&cols[nc++], "cost_usd", r->cost);
			if (i == 0)
				row(f, cols, nc, true, arr);
			row(f, cols, nc, false, arr);
		}
	} else {
		bool day = !strcmp(by, "day");
		struct agg *a = NULL;
		int na = 0;
		for (int i = 0; i < b.n_reqs; i++) {
			struct req *q = &b.reqs[i];
			char key[160];
			snprintf(key, sizeof key, "%.*s", day ? 10 : 159, day ? q->ts : q->tenant);
			struct agg *g = agg_get(&a, &na, key);
			if (!g)
				break;
			if (q->billed) {
				g->requests++;
				g->prompt += q->prompt;
				g->cached += q->cached;
				g->completion += q->completion;
				g->gpu += q->gpu;
				g->cost += q->cost + q->overhead_share;
				g->overhead_cost += q->overhead_share;
			} else {
				g->overhead_attempts++;
				g->overhead_gpu += q->gpu;
			}
		}
		/* the workers' billed cost over the days of their lives; with --bill-overhead
		 * proportional, what no request could carry (a run with no billed request, or
		 * none with gpu time) to its start day, or to a "(no requests)" tenant */
		for (int i = 0; i < b.n_runs; i++) {
			struct run *r = &b.runs[i];
			if (day && run_days(r, &a, &na) != WK_OK)
				break;
			if (!r->unallocated)
				continue;
			char key[16];
			snprintf(key, sizeof key, "%.10s", *r->start_ts ? r->start_ts : r->last_ts);
			struct agg *g = agg_get(&a, &na, day ? key : "(no requests)");
			if (!g)
				break;
			g->cost += r->unallocated;
			g->overhead_cost += r->unallocated;
		}
		for (int i = 0; i < na; i++) {
			struct agg *g = &a[i];
			nc = 0;
			setc(&cols[nc++], day ? "day" : "tenant", "%s", g->key);
			setc(&cols[nc++], "requests", "%ld", g->requests);
			setc(&cols[nc++], "prompt_tokens", "%lld", g->prompt);
			setc(&cols[nc++], "cached_tokens", "%lld", g->cached);
			setc(&cols[nc++], "completion_tokens", "%lld", g->completion);
			setc(&cols[nc++], "gpu_seconds", "%.6f", g->gpu);
			setm(&cols[nc++], "cost_usd", g->cost);
			if (spread)
				setm(&cols[nc++], "of_which_overhead_usd", g->overhead_cost);
			setc(&cols[nc++], "overhead_attempts", "%ld", g->overhead_attempts);
			setc(&cols[nc++], "overhead_gpu_seconds", "%.6f", g->overhead_gpu);
			if (day)
				setm(&cols[nc++], "workers_cost_usd", g->workers_cost);
			if (i == 0)
				row(f, cols, nc, true, arr);
			row(f, cols, nc, false, arr);
		}
		free(a);
	}

	char c6[40], cc[40], rq[40], orq[40];
	money_fmt6(c6, sizeof c6, cost);
	money_fmt_cents(cc, sizeof cc, cost);
	money_fmt6(rq, sizeof rq, req_cost);
	money_fmt6(orq, sizeof orq, over_req_cost);
	double util = life > 0 ? secs[LEDGER_BUSY] / life : 0;
	if (f == F_JSON) {
		json_t *tot = json_pack(
			"{s:i, s:f, s:I, s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:i, s:f, s:I, s:s, s:s, "
			"s:s, s:s, s:I, s:I, s:I, s:I}",
			"workers", b.n_runs, "lifetime_seconds", life, "billed_seconds",
			(json_int_t)billed_s, "start_seconds", secs[LEDGER_STARTING], "busy_seconds",
			secs[LEDGER_BUSY], "idle_seconds", secs[LEDGER_IDLE], "drain_seconds",
			secs[LEDGER_DRAINING], "utilisation", util, "requests", (int)nreq,
			"request_gpu_seconds", billed_gpu, "overhead_attempts", (int)nover,
			"overhead_gpu_seconds", over_gpu, "cost_micro_usd", (json_int_t)cost, "cost_usd",
			c6, "cost_display", cc, "requests_cost_usd", rq, "overhead_attempts_cost_usd",
			orq, "bad_lines", (json_int_t)b.bad_lines, "recoveries",
			(json_int_t)b.recoveries, "duplicate_lines", (json_int_t)b.dup_lines,
			"unpriced_runs", (json_int_t)b.unpriced);
		json_t *out = json_pack("{s:s, s:o, s:o}", "by", by, "rows", arr, "totals", tot);
		char *s = json_dumps(out, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
		json_decref(out);
		if (!s) {
			fprintf(stderr, "wick usage: out of memory\n");
			book_free(&b);
			return 1;
		}
		puts(s);
		free(s);
	} else {
		json_decref(arr);
		if (f == F_TABLE) {
			char l[32], st[32], bu[32], id[32], dr[32];
			ledger_fmt_duration(l, sizeof l, life);
			ledger_fmt_duration(st, sizeof st, secs[LEDGER_STARTING]);
			ledger_fmt_duration(bu, sizeof bu, secs[LEDGER_BUSY]);
			ledger_fmt_duration(id, sizeof id, secs[LEDGER_IDLE]);
			ledger_fmt_duration(dr, sizeof dr, secs[LEDGER_DRAINING]);
			printf("\n%d worker run(s): lifetime %s, billed %" PRId64 " s, %s ($%s)\n",
			       b.n_runs, l, billed_s, cc, c6);
			printf("  start %s, busy %s, idle %s, drain %s; utilisation %.1f%%\n", st, bu,
			       id, dr, 100 * util);
			printf("  %ld billed requests: %.6f gpu-seconds, $%s; %ld overhead attempts: "
			       "%.6f gpu-seconds, $%s\n",
			       nreq, billed_gpu, rq, nover, over_gpu, orq);
			if (b.bad_lines || b.recoveries)
				printf("  %ld unreadable line(s) skipped, %ld recovery event(s)\n",
				       b.bad_lines, b.recoveries);
			if (b.dup_lines)
				printf("  %ld line(s) read twice, counted once (a ledger given twice?)\n",
				       b.dup_lines);
			if (b.unpriced)
				printf("  %ld run(s) without a price (no worker_start or worker_exit line), "
				       "billed $0\n", b.unpriced);
		}
	}
	book_free(&b);
	return 0;
}
