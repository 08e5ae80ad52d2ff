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
 * Lines that are not JSON objects are counted and reported, never dropped silently.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	char open_state[16];         /* the state the last tick reported */
	bool exited;
	double lifetime;
	int64_t billed, cost;
	long requests;
	int64_t req_cost;            /* billed requests in this run */
	double busy_util;
};

struct req {
	char id[160], tenant[160], status[16], ts[40];
	int attempt, run;
	int prompt, completion;
	double gpu, queue;
	int64_t cost, overhead_share;
	bool billed, superseded;
};

struct book {
	struct run *runs;
	int n_runs, cap_runs;
	struct req *reqs;
	int n_reqs, cap_reqs;
	long bad_lines, recoveries;
};

static int find_run(struct book *b, const char *worker, long long boot, bool create)
{
	for (int i = 0; i < b->n_runs; i++)
		if (b->runs[i].boot == boot && !strcmp(b->runs[i].worker, worker))
			return i;
	if (!create)
		return -1;
	if (b->n_runs == b->cap_runs) {
		int cap = b->cap_runs ? 2 * b->cap_runs : 16;
		struct run *r = realloc(b->runs, (size_t)cap * sizeof *r);
		if (!r)
			return -1;
		b->runs = r;
		b->cap_runs = cap;
	}
	struct run *r = &b->runs[b->n_runs];
	memset(r, 0, sizeof *r);
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
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	long lineno = 0;
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
				fprintf(stderr, "wick usage: %s:%ld: not a ledger event; skipped\n", path,
					lineno);
			}
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
		} else if (!strcmp(type, "tick")) {
			snprintf(r->open_state, sizeof r->open_state, "%s", jstr(j, "state"));
		} else if (!strcmp(type, "worker_exit")) {
			r->exited = true;
			r->lifetime = jnum(j, "lifetime_seconds");
			snprintf(r->reason, sizeof r->reason, "%s", jstr(j, "reason"));
		} else if (!strcmp(type, "recovery")) {
			b->recoveries++;
		} else if (!strcmp(type, "request")) {
			if (b->n_reqs == b->cap_reqs) {
				int c2 = b->cap_reqs ? 2 * b->cap_reqs : 64;
				struct req *q = realloc(b->reqs, (size_t)c2 * sizeof *q);
				if (!q) {
					json_decref(j);
					rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
					break;
				}
				b->reqs = q;
				b->cap_reqs = c2;
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
			q->completion = (int)json_integer_value(json_object_get(j, "completion_tokens"));
			q->gpu = jnum(j, "gpu_seconds");
			q->queue = jnum(j, "queue_seconds");
			q->cost = json_integer_value(json_object_get(j, "cost_micro_usd"));
		} else if (!strcmp(type, "superseded")) {
			/* withdraws the latest terminal line of that attempt in this run */
			int at = (int)json_integer_value(json_object_get(j, "attempt"));
			for (int k = b->n_reqs - 1; k >= 0; k--) {
				struct req *q = &b->reqs[k];
				if (q->run == ri && q->attempt == at && !q->superseded &&
				    terminal(q->status) && !strcmp(q->id, jstr(j, "id"))) {
					q->superseded = true;
					break;
				}
			}
		}
		json_decref(j);
	}
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

/* qsort's order for an index into by_id_reqs (time-sorted): by id, then by position */
static const struct req *by_id_reqs;

static int cmp_ix_by_id(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	int c = strcmp(by_id_reqs[x].id, by_id_reqs[y].id);
	return c ? c : x - y;
}

/* Settles runs (crashed ones up to their last event), picks the billed attempt of each job,
 * and spreads overhead when asked. WK_OK or WK_ENOMEM. */
static int settle(struct book *b, bool spread, char *err, size_t errsz)
{
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
		r->cost = money_cost_micro((double)r->billed, r->price);
	}
	qsort(b->reqs, (size_t)b->n_reqs, sizeof *b->reqs, cmp_req_time);
	/* each id's attempts in time order (the index sorted by id, then position) */
	int *ix = malloc((size_t)(b->n_reqs ? b->n_reqs : 1) * sizeof *ix);
	if (!ix)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; i < b->n_reqs; i++)
		ix[i] = i;
	by_id_reqs = b->reqs;
	qsort(ix, (size_t)b->n_reqs, sizeof *ix, cmp_ix_by_id);
	for (int g = 0, e; g < b->n_reqs; g = e) {
		for (e = g + 1; e < b->n_reqs && !strcmp(b->reqs[ix[e]].id, b->reqs[ix[g]].id); e++)
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
	free(ix);
	if (!spread)
		return WK_OK;
	for (int i = 0; i < b->n_runs; i++) {
		struct run *r = &b->runs[i];
		int64_t over = r->cost - r->req_cost;
		double gsum = 0;
		int cnt = 0;
		for (int k = 0; k < b->n_reqs; k++)
			if (b->reqs[k].billed && b->reqs[k].run == i) {
				gsum += b->reqs[k].gpu;
				cnt++;
			}
		if (over <= 0 || cnt == 0)
			continue;
		/* largest remainder: floors first, then one micro-dollar to the largest fractions */
		int64_t given = 0;
		for (int k = 0; k < b->n_reqs; k++) {
			struct req *q = &b->reqs[k];
			if (!q->billed || q->run != i)
				continue;
			double share = gsum > 0 ? q->gpu / gsum : 1.0 / cnt;
			q->overhead_share = (int64_t)floor(share * (double)over);
			given += q->overhead_share;
		}
		while (given < over) {
			int best = -1;
			double bestf = -1;
			for (int k = 0; k < b->n_reqs; k++) {
				struct req *q = &b->reqs[k];
				if (!q->billed || q->run != i)
					continue;
				double share = gsum > 0 ? q->gpu / gsum : 1.0 / cnt;
				double frac = share * (double)over - (double)q->overhead_share;
				if (frac > bestf) {
					bestf = frac;
					best = k;
				}
			}
			b->reqs[best].overhead_share++;
			given++;
		}
	}
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
			bool q = strpbrk(v, ",\"\n") != NULL;
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
	long long prompt, completion;
	double gpu, overhead_gpu;
	int64_t cost, overhead_cost;
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

static void usage_help(FILE *f)
{
	fprintf(f,
		"usage: wick usage LEDGER... [--by request|tenant|worker|day] [--format table|json|csv]\n"
		"                  [--bill-overhead none|proportional]\n"
		"       wick usage --quote SECONDS [--price-per-hour USD]\n\n"
		"Reads usage ledgers written by `wick worker --ledger` and prints the bill: totals,\n"
		"the start/busy/idle/drain split, utilisation, and cost by request, tenant, worker\n"
		"or day. Workers are billed ceil(lifetime) seconds. A job is billed once, for the\n"
		"attempt that finished it; other attempts are overhead. --bill-overhead proportional\n"
		"spreads each worker's overhead over its requests by gpu_seconds.\n");
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
		if (end == quote || *end || !(secs >= 0)) {
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
			free(b.runs);
			free(b.reqs);
			return 1;
		}
	if (settle(&b, spread, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick usage: %s\n", err);
		free(b.runs);
		free(b.reqs);
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
				g->completion += q->completion;
				g->gpu += q->gpu;
				g->cost += q->cost + q->overhead_share;
				g->overhead_cost += q->overhead_share;
			} else {
				g->overhead_attempts++;
				g->overhead_gpu += q->gpu;
			}
		}
		if (day) /* the workers' billed cost goes to the day each started */
			for (int i = 0; i < b.n_runs; i++) {
				char key[16];
				snprintf(key, sizeof key, "%.10s", b.runs[i].start_ts);
				if (!agg_get(&a, &na, key))
					break;
			}
		for (int i = 0; i < na; i++) {
			struct agg *g = &a[i];
			nc = 0;
			setc(&cols[nc++], day ? "day" : "tenant", "%s", g->key);
			setc(&cols[nc++], "requests", "%ld", g->requests);
			setc(&cols[nc++], "prompt_tokens", "%lld", g->prompt);
			setc(&cols[nc++], "completion_tokens", "%lld", g->completion);
			setc(&cols[nc++], "gpu_seconds", "%.6f", g->gpu);
			setm(&cols[nc++], "cost_usd", g->cost);
			if (spread)
				setm(&cols[nc++], "of_which_overhead_usd", g->overhead_cost);
			setc(&cols[nc++], "overhead_attempts", "%ld", g->overhead_attempts);
			setc(&cols[nc++], "overhead_gpu_seconds", "%.6f", g->overhead_gpu);
			if (day) {
				int64_t wc = 0;
				for (int k = 0; k < b.n_runs; k++)
					if (!strncmp(b.runs[k].start_ts, g->key, 10))
						wc += b.runs[k].cost;
				setm(&cols[nc++], "workers_cost_usd", wc);
			}
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
			"s:s, s:s, s:I, s:I}",
			"workers", b.n_runs, "lifetime_seconds", life, "billed_seconds",
			(json_int_t)billed_s, "start_seconds", secs[LEDGER_STARTING], "busy_seconds",
			secs[LEDGER_BUSY], "idle_seconds", secs[LEDGER_IDLE], "drain_seconds",
			secs[LEDGER_DRAINING], "utilisation", util, "requests", (int)nreq,
			"request_gpu_seconds", billed_gpu, "overhead_attempts", (int)nover,
			"overhead_gpu_seconds", over_gpu, "cost_micro_usd", (json_int_t)cost, "cost_usd",
			c6, "cost_display", cc, "requests_cost_usd", rq, "overhead_attempts_cost_usd",
			orq, "bad_lines", (json_int_t)b.bad_lines, "recoveries",
			(json_int_t)b.recoveries);
		json_t *out = json_pack("{s:s, s:o, s:o}", "by", by, "rows", arr, "totals", tot);
		char *s = json_dumps(out, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
		if (s)
			puts(s);
		free(s);
		json_decref(out);
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
		}
	}
	free(b.runs);
	free(b.reqs);
	return 0;
}
