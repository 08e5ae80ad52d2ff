/*
 * ledger.h - the usage ledger: an append-only JSON Lines file that accounts for every second
 * of a worker's life and for each request's share of the busy time. `wick usage` reads it
 * (worker/usage.c) and --usage-url exports it (worker/export.c).
 *
 * Every line is one event, written with one write() on an O_APPEND descriptor under an
 * exclusive flock (several workers may share a ledger), then fsync'd. Every event has
 *   "type"   worker_start | state | tick | request | superseded | worker_exit | recovery
 *   "ts"     RFC 3339 UTC with milliseconds
 *   "eid"    "<worker>.<boot>.<seq>": unique, the export's idempotency id
 *   "worker" the worker's name, "boot" its start (unix ms), "mono" its monotonic clock (s)
 * and, by type:
 *   worker_start  snapshot, model, gpu_type, gpu_count, price_micro_usd_per_hour, price_usd_per_hour,
 *                 pid, host
 *   state         state (starting|idle|busy|draining), start, end (RFC 3339), mono_start,
 *                 mono_end, seconds: one closed interval of the worker's accounting state
 *   (state lines also carry next: the state that begins at their end, none at exit)
 *   tick          state, lifetime_seconds: written every tick_s seconds (default 1), so a
 *                 worker killed -9 leaves its lifetime up to the last tick
 *   request       id, tenant, attempt, status, queue_seconds, prompt_tokens, cached_tokens (of
 *                 the prompt's, those the prefix cache held: not run), completion_tokens,
 *                 gpu_seconds, cost_micro_usd, cost_usd
 *   superseded    id, attempt: that attempt's result was dropped, the job having one already
 *                 (ledger_superseded); wick usage bills the attempt whose result stands
 *   worker_exit   reason, lifetime_seconds, billed_seconds (= ceil(lifetime)), start_seconds,
 *                 busy_seconds, idle_seconds, drain_seconds, requests, request_gpu_seconds,
 *                 cost_micro_usd, cost_usd
 *   recovery      what was repaired at open: dropped_bytes and the dropped text of a torn last
 *                 line (a write cut by a crash), and the workers whose last run ended without
 *                 a worker_exit, with the lifetime their last event proves
 *
 * Money is integer micro-dollars; cost_usd is that value printed with 6 decimals. Prices are
 * per hour of the whole worker, in micro-dollars.
 */
#ifndef LEDGER_H
#define LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ledger_state { LEDGER_STARTING, LEDGER_IDLE, LEDGER_BUSY, LEDGER_DRAINING, LEDGER_NSTATES };
extern const char *const ledger_state_names[LEDGER_NSTATES]; /* "starting", ... */

/* ---- money: integers only ---- */

/* Parses a decimal dollar amount ("36.31", "0.001261") into micro-dollars, exactly (at most
 * 6 decimals, at most MONEY_MAX_DOLLARS). Returns WK_OK or WK_EINVAL. */
int money_parse_micro(const char *s, int64_t *micro);
#define MONEY_MAX_DOLLARS 1000000000LL  /* a price ($/h or $/GPU-s) above this is a typo */
#define MONEY_MAX_SECONDS 1e9           /* a lifetime or quote past ~31 years is one too */
/* seconds x price_micro_per_hour / 3600, rounded half up to a micro-dollar. seconds is first
 * rounded to a microsecond. */
int64_t money_cost_micro(double seconds, int64_t price_micro_per_hour);
/* "12.103333" (6 decimals) and "$12.10" (cents, half up) */
void money_fmt6(char *buf, size_t n, int64_t micro);
void money_fmt_cents(char *buf, size_t n, int64_t micro);
/* billed seconds of a lifetime: ceil, exact for whole seconds (within 1 us) */
int64_t money_billed_seconds(double lifetime_s);

/* ---- the writer ---- */

struct ledger_info {
	const char *worker;       /* name */
	const char *snapshot;     /* the snapshot id, or NULL */
	const char *model;        /* the model path */
	const char *gpu_type;     /* "H200", "cpu", ... */
	int gpu_count;
	int64_t price_micro_per_hour;
	double tick_s;            /* tick period; 0: 1 s */
	double t_start;           /* wk_now() at process start: the worker's lifetime begins here */
};

struct ledger_req {
	const char *id, *tenant, *status;
	int attempt;
	double queue_seconds, gpu_seconds;
	int prompt_tokens, completion_tokens;
	int cached_tokens;
	int64_t cost_micro_usd;
};

struct ledger_totals {      /* seconds per accounting state, from the state intervals */
	double seconds[LEDGER_NSTATES];
	double request_gpu_seconds;
	long requests;
};

struct ledger;

/* Opens (creating) path, repairs a torn last line and notes crashed workers (a recovery
 * event), writes worker_start, and starts the tick thread. The worker is in STARTING from
 * info->t_start. */
/* path NULL: no file, the totals only. */
int ledger_open(const char *path, const struct ledger_info *info, struct ledger **l, char *err,
		size_t errsz);
/* Closes the current state interval at t (wk_now() clock) and opens st. Written and fsync'd. */
int ledger_state(struct ledger *l, enum ledger_state st, double t, char *err, size_t errsz);
enum ledger_state ledger_current(const struct ledger *l);
/* Writes the request lines of n finished requests with one fsync (group commit). */
int ledger_requests(struct ledger *l, const struct ledger_req *r, int n, char *err, size_t errsz);
/* Records that the result of attempt `attempt` of job id, billed by ledger_requests, was not
 * stored because the job already had one (queue_result.superseded): wick usage bills the
 * attempt whose result stands instead. Written and fsync'd. */
int ledger_superseded(struct ledger *l, const char *id, int attempt, char *err, size_t errsz);
/* Closes the last interval at t and writes worker_exit; *tot (may be NULL) gets the totals. */
int ledger_exit(struct ledger *l, const char *reason, double t, struct ledger_totals *tot,
		char *err, size_t errsz);
void ledger_get_totals(const struct ledger *l, double t, struct ledger_totals *tot);
void ledger_close(struct ledger *l); /* stops the tick thread; NULL is fine */

/* Repairs path's torn tail in place (exclusive flock): a last line without its newline or
 * that is not a JSON object is cut off. *dropped gets its bytes (malloc'd, caller frees; NULL
 * when nothing was cut). Exposed for tests. */
int ledger_repair(int fd, char **dropped, size_t *n_dropped, char *err, size_t errsz);

/* "worker 20m00s on 8xH200 at $36.31/h: $12.10 (start 1.2s, busy 6m12s, idle 13m47s,
 * drain 0.0s)": the bill for billed = ceil(lifetime) seconds. */
void ledger_bill_line(char *buf, size_t n, const char *what, double lifetime_s,
		      const struct ledger_totals *t, int gpus, const char *gpu_type,
		      int64_t price_micro_per_hour);
/* "0.412s", "59.9s", "1m00s", "2h03m04s" */
void ledger_fmt_duration(char *buf, size_t n, double s);

/* RFC 3339 UTC with milliseconds for a unix time in seconds. buf: >= 32 bytes. */
void ledger_rfc3339(char *buf, size_t n, double unix_s);

#endif
