/*
 * worker.c - `wick worker`: the production process. It cold-starts the engine, pulls jobs
 * from a queue, runs them continuously batched, stores each result before acknowledging its
 * job, and exits 0 when the queue has been quiet for --idle-timeout seconds (scale to zero).
 *
 * Lifecycle: STARTING (restore + engine init) -> READY -> BUSY <-> IDLE -> DRAINING -> exit.
 *   --startup-timeout  a watchdog ends the process (exit 1, reason logged) if start-up stalls
 *   --step-timeout     a step that never ends (a hung device, driver or kernel) is taken for
 *                      an engine failure: the watchdog hands the jobs back and exits 3
 *   SIGTERM/SIGINT     stop taking jobs, finish in-flight ones within --drain-timeout, hand
 *                      the rest back to the queue, exit 0
 *   --max-lifetime, --max-jobs   recycle: drain and exit 0
 *   an engine failure  (a failed step: a sticky device error, say) the jobs it held go back
 *                      to the queue for a healthy worker, and the worker exits 3 (unhealthy)
 *
 * One thread drives everything: take, schedule a step, store finished results (group commit),
 * extend leases, check cancels. Jobs that cannot run (bad JSON, missing input, prompt too
 * long...) end FAILED with the contract's error code and the worker keeps going.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/job.h"
#include "worker/prompt.h"
#include "worker/prefix_store.h"
#include "worker/ledger.h"
#include "worker/export.h"
#include "coldstart/snapshot.h"
#include <xxhash.h>
#include "worker/queue.h"
#include "worker/sched.h"
#include "worker/split.h"
#include "worker/http_api.h"
#include "worker/worker.h"


enum state { ST_STARTING, ST_READY, ST_BUSY, ST_IDLE, ST_DRAINING };
static const char *const state_names[] = {"STARTING", "READY", "BUSY", "IDLE", "DRAINING"};

struct held {               /* a job taken from the queue (or HTTP) and not yet finished */
	struct queue_job qj;
	struct sched_req *req;  /* NULL once finished */
	double taken_at;        /* wk_now() */
	double enqueued_wall;   /* unix seconds, 0 unknown */
	char tenant[JOB_ID_MAX + 1];
	bool used;
	struct http_flight *http; /* an HTTP request (http_api.h); NULL for a queue job */
	struct prep *prep;      /* being prepared by a preparer (or prepared, not yet admitted) */
	char *tools;            /* its input.tools (malloc'd JSON), to read its tool calls back */
	bool thinking;          /* its input.thinking: the text starts with its reasoning */
	bool one_call;          /* its input.parallel_tool_calls false: its first call only */
	char *forced;           /* its input.tool_choice's call opening, which the prompt ends
				 * with ("<tool_call>" NAME; malloc'd), or NULL */
	int lp_sent;            /* a streamed HTTP request with logprobs: the tokens whose
				 * logprobs went with its pieces */
	bool plp_sent;          /* ... with echo: its prompt's entries went first */
	bool split;             /* a streamed queue job with thinking or tools: its stream carries
				 * its content only (split.h), as its result's output.text */
	struct split sp;
	struct ledger_req bill;  /* its request line, filled when it finishes */
	char bill_status[16];
	/* what an attempt the engine failed had run, for its RELEASED line (req is gone) */
	double spent_gpu_s;
	int spent_prompt, spent_out;
};

struct worker {
	struct worker_opts o; /* as given (worker.h) */
	int cap;                /* slots: concurrency, twice that with a committer */
	int n_committing;       /* held slots whose results the committer has */
	double poll_s;          /* the main loop's reconnect budget (QUEUE_POLL_S) */
	/* usage accounting (worker/ledger.h): the ledger is always open; without --ledger it
	 * keeps the totals only */
	struct ledger *ledger;
	struct exporter *exporter; /* --usage-url */
	struct http_api *http;   /* the OpenAI endpoint (--listen; worker/http_api.h) */

	char name[160];
	struct engine *e;
	uint64_t cache_id;      /* eng_cache_id, with --prefix-cache-dir (prefix_store.h) */
	bool cache_kept;        /* ... known: the cache is written at exit */
	const struct tok *tok;
	enum chat_format chat;
	int think_end;          /* the id of "</think>" (one added token), or -1 */
	struct queue *q;
	struct sched *s;
	FILE *step_log;
	struct held *held;      /* [cap] */
	enum state state;
	double t_start, t_last_activity, t_drain_deadline;
	/* a queue outage: since when every call on it failed (0: it answers), the last log */
	double q_fail_since, q_fail_told;
	char q_fail_err[WK_ERRSZ];
	long jobs_taken, jobs_done, jobs_failed;
	long jobs_prepared;     /* by a preparer */
	/* finished results waiting to be stored (group commit) */
	struct queue_result *out;
	char **out_json;
	int n_out;
	/* The committer (spool, SQS and HTTP queues): a thread that writes the ledger lines and
	 * stores the results of one batch while this thread runs the next steps; the slots of a
	 * batch stay held until it is reaped. Its handle is its own (qc: spool, SQS), or the
	 * main one where the driver's calls may come from two threads (HTTP: qc NULL). */
	struct queue *qc;
	pthread_t committer;
	pthread_mutex_t cmu;
	pthread_cond_t ccv;
	struct commit *c_todo, *c_done; /* handed over, not started / finished, not reaped */
	bool c_busy, c_stop, have_committer;
	/* The preparers (--prepare-threads): a big job's document decoded and its prompt
	 * rendered and encoded beside the engine's steps, not between them */
	pthread_t preparer[WORKER_MAX_PREPARERS];
	int n_preparers;
	int n_preparing;        /* held slots with a prep (this thread's count) */
	pthread_mutex_t pmu;
	pthread_cond_t pcv, pdone; /* work or stop; a prep done */
	struct prep *p_todo, *p_todo_tail, *p_done; /* under pmu */
	int p_busy;
	bool p_stop;
};

static atomic_int got_signal; /* read by the HTTP and queue threads too: an atomic, not
				 * a sig_atomic_t (lock-free, so a handler may store it) */
/* "wick worker", or "wick dev" when cmd_dev runs it: what its messages are prefixed with */
static atomic_int startup_done; /* read by the watchdog thread */

static void on_signal(int sig)
{
	atomic_store_explicit(&got_signal, sig, memory_order_relaxed);
}

/* ---- logs: a human line on a TTY, one JSON object per line with --log-format json ---- */

static void wlog(struct worker *w, const char *event, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void wlog(struct worker *w, const char *event, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[64];
	snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
	if (w->o.json_logs) {
		json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s}", "ts", when, "worker", w->name,
				      "state", state_names[w->state], "event", event, "msg", msg);
		char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
		if (s)
			fprintf(stderr, "%s\n", s);
		free(s);
		json_decref(j);
	} else {
		fprintf(stderr, "%s wick worker [%s] %s: %s\n", when, state_names[w->state], event, msg);
	}
}

/* The HTTP server's own events (http_api_opts.log), from its thread. */
static void http_log(void *ctx, const char *event, const char *msg)
{
	wlog(ctx, event, "%s", msg);
}

static void set_state(struct worker *w, enum state st)
{
	if (w->state == st)
		return;
	enum state old = w->state;
	w->state = st;
	wlog(w, "state", "%s -> %s", state_names[old], state_names[st]);
	if (w->http)
		http_api_set_state(w->http, state_names[st]);
}

/* A URL as logs may show it: without user:password@ and without the query string, where
 * platforms put tokens. */
static const char *redact_url(const char *url, char *buf, size_t n)
{
	const char *scheme = strstr(url, "://");
	const char *auth = scheme ? scheme + 3 : url;
	const char *slash = strchr(auth, '/');
	const char *at = strchr(auth, '@');
	if (at && (!slash || at < slash))
		snprintf(buf, n, "%.*s%s", (int)(auth - url), url, at + 1);
	else
		snprintf(buf, n, "%s", url);
	char *q = strchr(buf, '?');
	if (q)
		snprintf(q, n - (size_t)(q - buf), "?...");
	return buf;
}

/* ---- watchdogs: a start-up that stalls, a step that never ends ---- */

/* The step running: the main thread marks its start and end (run_step) and holds step_mu
 * through each of its callbacks (on_done, on_token). When a step outlives --step-timeout,
 * the watchdog sets step_abandoned under step_mu and takes the worker over: the main thread,
 * stuck in the engine, parks at its next callback or at the step's end (step_park) and never
 * touches the worker's state again, so the watchdog hands the jobs back alone. */
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static double step_since; /* wk_now() when the step running began; 0 between steps */
static bool step_abandoned;
static atomic_int worker_done; /* the main thread is exiting: the watchdog too */

/* Under step_mu: once the watchdog has taken over, the main thread waits here for the
 * process to end. */
static void step_park(void)
{
	if (!step_abandoned)
		return;
	pthread_mutex_unlock(&step_mu);
	for (;;)
		pause();
}

static void step_hold(void)
{
	pthread_mutex_lock(&step_mu);
	step_park();
}

static void step_release(void)
{
	pthread_mutex_unlock(&step_mu);
}

static void on_done(void *ctx, struct sched_req *r);

/* The prefix cache's counts, for /metrics (after each step, and once the kept entries are
 * read). */
static void push_cache_stats(struct worker *w)
{
	if (w->http) {
		struct sched_cache_stats st;
		sched_cache_stats(w->s, &st);
		http_api_set_cache_stats(w->http, &st);
	}
}

static int run_step(struct worker *w)
{
	step_hold();
	step_since = wk_now();
	step_release();
	int rc = sched_step(w->s, on_done, w);
	step_hold();
	step_since = 0;
	step_release();
	push_cache_stats(w);
	return rc;
}

static void hand_back(struct worker *w, double now);
static void close_books(struct worker *w, const char *why);

/* The watchdog took over from a step that never ended: the jobs go back to the queue for a
 * healthy worker, HTTP requests get 503, the books are closed, and the process exits 3 as
 * after any engine failure (the engine itself cannot be closed: it is stuck). */
static _Noreturn void step_timed_out(struct worker *w, double ran_s)
{
	wlog(w, "unhealthy", "a step has run for %.0f s (--step-timeout %.0f): the engine is "
			     "taken for hung; handing the jobs back and exiting", ran_s,
	     w->o.step_timeout);
	hand_back(w, wk_now());
	wlog(w, "exit", "reason step_timeout; %ld jobs taken, %ld completed, %ld failed; "
			"lifetime %.1f s", w->jobs_taken, w->jobs_done, w->jobs_failed,
	     wk_now() - w->t_start);
	close_books(w, "step_timeout");
	fflush(NULL);
	_exit(3);
}

static void *watchdog(void *arg)
{
	struct worker *w = arg;
	double deadline = w->t_start + w->o.startup_timeout;
	while (!startup_done && wk_now() < deadline)
		usleep(20000);
	if (!startup_done) {
		wlog(w, "startup_timeout", "start-up did not finish within %.0f s (restore or "
					  "engine init stalled); exiting", w->o.startup_timeout);
		_exit(1);
	}
	while (!worker_done && w->o.step_timeout > 0) {
		usleep(20000);
		pthread_mutex_lock(&step_mu);
		double ran = step_since > 0 ? wk_now() - step_since : 0;
		bool hung = !worker_done && ran > w->o.step_timeout;
		step_abandoned = hung;
		pthread_mutex_unlock(&step_mu);
		if (hung)
			step_timed_out(w, ran);
	}
	return NULL;
}

/* ---- results ---- */

static int64_t cost_micro(const struct worker *w, double seconds)
{
	return money_cost_micro(seconds, w->o.price_micro);
}

/* The request line a finished job gets in the ledger, written before its result is stored. */
static void set_bill(struct held *h, enum job_status st, int prompt_tokens, int completion_tokens,
		     double queue_s, double gpu_s, int64_t cost)
{
	snprintf(h->bill_status, sizeof h->bill_status, "%s", job_status_name(st));
	h->bill = (struct ledger_req){.id = h->qj.id, .tenant = h->tenant,
				      .status = h->bill_status, .attempt = h->qj.attempt,
				      .queue_seconds = queue_s, .gpu_seconds = gpu_s,
				      .prompt_tokens = prompt_tokens,
				      .completion_tokens = completion_tokens,
				      .cost_micro_usd = cost};
}

/* Queues a result for the next group commit. Takes ownership of json. */
static void push_result(struct worker *w, struct held *h, char *json, size_t len, bool keep)
{
	if (!json) {
		wlog(w, "error", "job %s: out of memory encoding its result", h->qj.id);
		return;
	}
	w->out[w->n_out] = (struct queue_result){.job = &h->qj, .json = json, .len = len,
						 .keep_input = keep};
	w->out_json[w->n_out++] = json;
}

/* Moves the queue jobs' results to the front of out[] and returns their count. */
static int queue_results_first(struct worker *w)
{
	int nq = 0;
	for (int i = 0; i < w->n_out; i++) {
		struct held *h = (struct held *)((char *)w->out[i].job - offsetof(struct held, qj));
		if (h->http)
			continue;
		struct queue_result r = w->out[i];
		char *j = w->out_json[i];
		w->out[i] = w->out[nq];
		w->out_json[i] = w->out_json[nq];
		w->out[nq] = r;
		w->out_json[nq++] = j;
	}
	return nq;
}

/* Hands an HTTP request its result. One whose bill could not be written is not served. */
static void answer_http(struct worker *w, struct held *h, const char *json, size_t len, int rc)
{
	char *e = NULL;
	if (rc != WK_OK)
		e = job_encode_error(h->qj.id, JOB_FAILED, JOB_EINTERNAL, "the usage ledger could "
				     "not be written", w->name, h->qj.attempt, &len);
	http_api_finish(w->http, h->http, rc != WK_OK ? (e ? e : "{}") : json,
			rc != WK_OK && !e ? 2 : len);
	free(e);
	h->http = NULL;
}

/* Stores every pending result, then frees their jobs' slots. A result that could not be
 * stored leaves its job unacknowledged: the queue delivers it again after the lease. */
/* A result that did not stand: either the queue took a FAILED one in its place (the job
 * ended), or nothing was stored and the queue delivers the job again. */
static void log_unstored(struct worker *w, const struct queue_result *r, const char *id,
			 const char *err)
{
	if (r->replaced)
		wlog(w, "result_refused", "job %s: %s", id, err);
	else
		wlog(w, "error", "job %s: the result was not stored (%s); the queue will deliver "
				 "it again", id, err);
}

/* The main loop's calls on the queue (take, extend, cancel checks) keep reconnecting for
 * QUEUE_POLL_S only, so an outage holds up its engine steps and signals for seconds, not
 * reconnect_s; storing results and handing jobs back keep QUEUE_STORE_S. After
 * --queue-outage seconds (default 60) of nothing but failures the worker gives up (exit 4):
 * its jobs return to the queue when their leases expire, and another worker (or this one
 * restarted) takes them. */
#define QUEUE_POLL_S 2.0
#define QUEUE_STORE_S 60.0

/* The budget of a call that stores (results, hand-backs): QUEUE_STORE_S, or in an outage
 * what is left of --queue-outage (at least QUEUE_POLL_S), so the worker gives up in time. */
static double store_budget(const struct worker *w)
{
	if (!w->q_fail_since)
		return QUEUE_STORE_S;
	double left = w->o.queue_outage - (wk_now() - w->q_fail_since);
	return left > QUEUE_POLL_S ? left : QUEUE_POLL_S;
}

/* Notes a call on the queue: a failure starts or continues an outage (logged at its start
 * and every 10 s), a success ends one. */
static void queue_note(struct worker *w, int rc, const char *what, const char *err)
{
	double now = wk_now();
	if (rc == WK_OK) {
		if (w->q_fail_since)
			wlog(w, "queue_recovered", "the queue answers again after %.1f s",
			     now - w->q_fail_since);
		w->q_fail_since = 0;
		return;
	}
	snprintf(w->q_fail_err, sizeof w->q_fail_err, "%s: %s", what, err);
	if (!w->q_fail_since) {
		w->q_fail_since = w->q_fail_told = now;
		wlog(w, "queue_error", "%s", w->q_fail_err);
	} else if (now - w->q_fail_told >= 10) {
		w->q_fail_told = now;
		wlog(w, "queue_error", "failing for %.0f s: %s", now - w->q_fail_since, w->q_fail_err);
	}
}

/* A stored result that the queue dropped because the job already had one (another
 * attempt's: this worker lost the lease while it ran, or the queue held the id twice): said
 * in the log, and in the ledger, so that wick usage bills the attempt whose result stands. */
static void note_superseded(struct worker *w, const struct held *h)
{
	char err[WK_ERRSZ];
	wlog(w, "result_superseded", "job %s attempt %d: the job already had a result, which "
				      "stands; this one was dropped", h->qj.id, h->bill.attempt);
	if (ledger_superseded(w->ledger, h->qj.id, h->bill.attempt, err, sizeof err) != WK_OK)
		wlog(w, "ledger_error", "%s: job %s attempt %d may be billed in place of the result "
					"that stands", err, h->qj.id, h->bill.attempt);
}

/* ---- the committer ---- */

struct commit {
	int n;
	struct queue_result *r;   /* [n] */
	char **json;              /* [n] */
	struct ledger_req *bills; /* [n] */
	double budget;            /* the stores' reconnect budget (store_budget at the handoff) */
	int rc;
	char err[WK_ERRSZ];
	struct commit *next;
};

static void commit_free(struct commit *c)
{
	if (!c)
		return;
	free(c->r);
	free(c->json);
	free(c->bills);
	free(c);
}

static void *commit_main(void *arg)
{
	struct worker *w = arg;
	pthread_mutex_lock(&w->cmu);
	for (;;) {
		while (!w->c_todo && !w->c_stop)
			pthread_cond_wait(&w->ccv, &w->cmu);
		struct commit *c = w->c_todo;
		if (!c)
			break; /* stopping, nothing left */
		w->c_todo = NULL;
		w->c_busy = true;
		pthread_mutex_unlock(&w->cmu);
		/* bill first, then store: as flush_results does inline */
		c->rc = ledger_requests(w->ledger, c->bills, c->n, c->err, sizeof c->err);
		if (c->rc != WK_OK)
			for (int i = 0; i < c->n; i++)
				c->r[i].rc = c->rc;
		else
			c->rc = queue_complete_within(w->qc ? w->qc : w->q, c->r, c->n, c->budget,
						      c->err, sizeof c->err);
		pthread_mutex_lock(&w->cmu);
		c->next = w->c_done;
		w->c_done = c;
		w->c_busy = false;
		pthread_cond_broadcast(&w->ccv);
	}
	pthread_mutex_unlock(&w->cmu);
	return NULL;
}

/* Hands results [0, n) of w->out to the committer, appended to the batch it has not started
 * yet when there is one (so batches grow while it stores the previous one). */
static bool commit_handoff(struct worker *w, int n)
{
	pthread_mutex_lock(&w->cmu);
	struct commit *c = w->c_todo;
	int base = c ? c->n : 0;
	if (!c && !(c = calloc(1, sizeof *c))) {
		pthread_mutex_unlock(&w->cmu);
		return false;
	}
	struct queue_result *r = realloc(c->r, (size_t)(base + n) * sizeof *r);
	if (r)
		c->r = r;
	char **json = r ? realloc(c->json, (size_t)(base + n) * sizeof *json) : NULL;
	if (json)
		c->json = json;
	struct ledger_req *bills = json ? realloc(c->bills, (size_t)(base + n) * sizeof *bills) : NULL;
	if (bills)
		c->bills = bills;
	if (!bills) {
		if (!w->c_todo)
			commit_free(c);
		pthread_mutex_unlock(&w->cmu);
		return false;
	}
	for (int i = 0; i < n; i++) {
		struct held *h = (struct held *)((char *)w->out[i].job - offsetof(struct held, qj));
		c->r[base + i] = w->out[i];
		c->json[base + i] = w->out_json[i];
		c->bills[base + i] = h->bill;
	}
	c->n = base + n;
	c->budget = store_budget(w); /* (in an outage, what is left of --queue-outage) */
	w->c_todo = c;
	pthread_cond_broadcast(&w->ccv);
	pthread_mutex_unlock(&w->cmu);
	return true;
}

/* Frees what a held job keeps for reading its result back (its tools, its forced call). */
static void held_forget(struct held *h)
{
	free(h->tools);
	h->tools = NULL;
	free(h->forced);
	h->forced = NULL;
	if (h->split)
		split_free(&h->sp);
	h->split = false;
}

/* Frees the slots of the batches the committer finished. With wait, first waits until it
 * has nothing left (drain, exit). Returns the number of slots freed. */
static int commit_reap(struct worker *w, bool wait)
{
	if (!w->have_committer)
		return 0;
	pthread_mutex_lock(&w->cmu);
	while (wait && (w->c_todo || w->c_busy))
		pthread_cond_wait(&w->ccv, &w->cmu);
	struct commit *c = w->c_done;
	w->c_done = NULL;
	pthread_mutex_unlock(&w->cmu);
	int freed = 0;
	bool network = strcmp(queue_driver(w->q), "spool");
	while (c) {
		struct commit *next = c->next;
		if (network) /* an outage counts as it does for results stored inline */
			queue_note(w, c->rc, "storing results", c->err);
		for (int i = 0; i < c->n; i++) {
			struct held *h =
				(struct held *)((char *)c->r[i].job - offsetof(struct held, qj));
			if (c->r[i].rc == WK_OK)
				queue_done_elsewhere(w->q, &h->qj);
			if (c->r[i].rc != WK_OK)
				log_unstored(w, &c->r[i], h->qj.id, c->err);
			else if (c->r[i].superseded)
				note_superseded(w, h);
			free(c->json[i]);
			queue_job_free(&h->qj);
			held_forget(h);
			h->used = false;
			h->req = NULL;
			freed++;
		}
		commit_free(c);
		c = next;
	}
	w->n_committing -= freed;
	if (freed)
		w->t_last_activity = wk_now();
	return freed;
}

/* Sleeps until the committer finishes a batch (or timeout_s): for when every slot waits on
 * it and there is nothing else to do. */
static void commit_wait(struct worker *w, double timeout_s)
{
	pthread_mutex_lock(&w->cmu);
	if (!w->c_done && (w->c_todo || w->c_busy)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double at = ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
		ts.tv_sec = (time_t)at;
		ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&w->ccv, &w->cmu, &ts);
	}
	pthread_mutex_unlock(&w->cmu);
}

static void flush_results(struct worker *w)
{
	if (!w->n_out)
		return;
	char err[WK_ERRSZ];
	if (w->have_committer) {
		int nq = queue_results_first(w); /* HTTP requests are answered inline, below */
		if (nq && commit_handoff(w, nq)) {
			w->n_committing += nq;
			memmove(w->out, w->out + nq, (size_t)(w->n_out - nq) * sizeof *w->out);
			memmove(w->out_json, w->out_json + nq,
				(size_t)(w->n_out - nq) * sizeof *w->out_json);
			w->n_out -= nq;
			if (!w->n_out)
				return;
		}
	}
	/* Bill first: the request lines are fsync'd before any result is stored, so a crash can
	 * never leave a completed job unbilled. If the ledger cannot be written, no result is
	 * stored: the jobs stay unacknowledged and are delivered again. */
	struct ledger_req bills[2 * WORKER_MAX_CONCURRENCY];
	for (int i = 0; i < w->n_out; i++)
		bills[i] = ((struct held *)((char *)w->out[i].job - offsetof(struct held, qj)))->bill;
	int rc = ledger_requests(w->ledger, bills, w->n_out, err, sizeof err);
	if (rc != WK_OK) {
		wlog(w, "ledger_error", "%s: %d results not stored; their jobs will be delivered "
					"again", err, w->n_out);
		for (int i = 0; i < w->n_out; i++)
			w->out[i].rc = rc;
	} else {
		int nq = queue_results_first(w); /* HTTP requests are answered below */
		if (nq) { /* (with a committer: only when it could not be handed one) */
			rc = queue_complete_within(w->q, w->out, nq, store_budget(w), err,
						   sizeof err);
			queue_note(w, rc, "storing results", err);
		}
	}
	for (int i = 0; i < w->n_out; i++) {
		struct held *h = (struct held *)((char *)w->out[i].job - offsetof(struct held, qj));
		if (h->http)
			answer_http(w, h, w->out_json[i], w->out[i].len, w->out[i].rc);
		else if (w->out[i].rc != WK_OK)
			log_unstored(w, &w->out[i], h->qj.id, rc ? err : "?");
		else if (w->out[i].superseded)
			note_superseded(w, h);
		free(w->out_json[i]);
		queue_job_free(&h->qj);
		held_forget(h);
		h->used = false;
		h->req = NULL;
	}
	w->n_out = 0;
	w->t_last_activity = wk_now(); /* a slow store is not idle time */
}

static void fail_job(struct worker *w, struct held *h, enum job_status st, enum job_err code,
		     const char *msg, bool keep_input)
{
	size_t len;
	char *json = job_encode_error(h->qj.id, st, code, msg, w->name, h->qj.attempt, &len);
	wlog(w, "job_failed", "job %s: %s (%s)", h->qj.id, job_err_code(code), msg);
	w->jobs_failed++;
	set_bill(h, st, 0, 0, 0, 0, 0);
	push_result(w, h, json, len, keep_input);
}

/* queue_opts.on_refused: an input the driver ended on sight (too large, not a regular file,
 * no valid id) is logged and counted like a job failed here, so the exit line's "jobs taken"
 * accounts for every input this worker disposed of. */
static void job_refused(void *ctx, const char *id, const char *why)
{
	struct worker *w = ctx;
	if (id)
		wlog(w, "job_refused", "job %s: %s", id, why);
	else
		wlog(w, "job_refused", "%s", why);
	w->jobs_taken++;
	w->jobs_failed++;
}

/* r's logprobs for its tokens from..to as the job contract's entries (job.h), each token's
 * bytes and its alternatives' in strings of their own. */
struct lp_set {
	struct job_logprob *lp;
	struct job_top *top;
	int n, n_top;
};

static void lp_set_free(struct lp_set *o)
{
	for (int i = 0; i < o->n; i++)
		free((char *)o->lp[i].tok);
	for (int i = 0; i < o->n_top; i++)
		free((char *)o->top[i].tok);
	free(o->lp);
	free(o->top);
	*o = (struct lp_set){0};
}

static int lp_build(struct worker *w, const struct sched_req *r, int from, int to,
		    struct lp_set *o)
{
	*o = (struct lp_set){0};
	int tops = 0;
	for (int k = from > 0 ? from : 0; k < to; k++)
		tops += r->lp[k].n_top;
	if (from < 0) /* (-n_prompt: the prompt's tokens first, plp[k]; the first has none) */
		for (int k = 1; k < r->n_prompt; k++)
			tops += r->plp[k].n_top;
	o->lp = calloc((size_t)(to - from) + 1, sizeof *o->lp);
	o->top = calloc((size_t)tops + 1, sizeof *o->top);
	if (!o->lp || !o->top) {
		lp_set_free(o);
		return WK_ENOMEM;
	}
	for (int k = from; k < to; k++) {
		int p = r->n_prompt + k; /* k < 0: prompt token p */
		const struct sched_logprob none = {.lp = NAN},
					   *l = k >= 0 ? &r->lp[k] : p ? &r->plp[p] : &none;
		struct job_logprob *e = &o->lp[o->n];
		char *b;
		size_t len;
		int rc = k >= 0 ? sched_token_bytes(w->s, r, k, r->out[k], &b, &len)
				: sched_prompt_bytes(w->s, r, p, r->prompt[p], &b, &len);
		if (rc != WK_OK) {
			lp_set_free(o);
			return rc;
		}
		/* (the prompt's entries: the rank, and the alternatives' ids, vLLM's shape) */
		*e = (struct job_logprob){b, len, l->lp, l->n_top, o->top + o->n_top,
					  k < 0 && p ? l->rank : 0};
		o->n++;
		for (int t = 0; t < l->n_top; t++) {
			if ((rc = k >= 0 ? sched_token_bytes(w->s, r, k, l->top_id[t], &b, &len)
					 : sched_prompt_bytes(w->s, r, p, l->top_id[t], &b, &len)) !=
			    WK_OK) {
				lp_set_free(o);
				return rc;
			}
			o->top[o->n_top++] = (struct job_top){b, len, l->top_lp[t],
							      l->top_id[t]};
		}
	}
	return WK_OK;
}

static void job_done(struct worker *w, struct sched_req *r)
{
	struct held *h = r->user;
	if (r->status == SCHED_FAILED && !h->http && sched_engine_failed(w->s, NULL) != WK_OK) {
		/* the engine failed, not the job: it goes back to the queue (release_all) for a
		 * healthy worker, and this one exits; the queue's delivery count still ends a job
		 * that fails everywhere */
		wlog(w, "job_engine_failed", "job %s: the engine failed; it will be handed back",
		     h->qj.id);
		h->spent_gpu_s = r->gpu_seconds;
		h->spent_prompt = r->n_prompt;
		h->spent_out = r->n_out;
		h->req = NULL;
		sched_req_free(r);
		return;
	}
	static const enum job_status map[] = {
		[SCHED_RUNNING] = JOB_FAILED, [SCHED_DONE] = JOB_COMPLETED,
		[SCHED_FAILED] = JOB_FAILED, [SCHED_TIMED_OUT] = JOB_TIMED_OUT,
		[SCHED_CANCELLED] = JOB_CANCELLED};
	enum job_status st = map[r->status];
	enum job_err code = r->status == SCHED_TIMED_OUT  ? JOB_ETIMEOUT
			    : r->status == SCHED_CANCELLED ? JOB_ECANCELLED
			    : r->status == SCHED_FAILED && r->gram_dead ? JOB_EINVALID_INPUT
			    : r->status == SCHED_FAILED    ? JOB_EENGINE
							   : JOB_OK;
	double queue_s = r->t_admit - h->taken_at;
	if (h->enqueued_wall > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double wall_now = ts.tv_sec + ts.tv_nsec * 1e-9;
		queue_s += (wall_now - (wk_now() - h->taken_at)) - h->enqueued_wall;
	}
	if (queue_s < 0)
		queue_s = 0;
	struct job_result jr = {
		.id = h->qj.id, .status = st, .text = r->text ? r->text : "",
		.text_len = r->text_len, .token_ids = r->out, .n_tokens = r->n_out,
		.finish_reason = r->finish == SCHED_FIN_STOP ? "stop"
				 : r->finish == SCHED_FIN_LENGTH ? "length" : NULL,
		.stop_sequence = r->stop_hit > 0 && r->stop_hit <= r->n_stop
					 ? r->stop[r->stop_hit - 1] : NULL,
		.err = code,
		.message = r->status == SCHED_FAILED ? r->error
			   : r->status == SCHED_TIMED_OUT ? "the job ran past its timeout_s"
			   : r->status == SCHED_CANCELLED ? "cancelled" : NULL,
		.prompt_tokens = r->n_prompt, .completion_tokens = r->n_out,
		.cached_tokens = r->cached,
		.accepted_prediction_tokens = r->accepted,
		.rejected_prediction_tokens = r->drafted - r->accepted,
		.queue_seconds = queue_s, .gpu_seconds = r->gpu_seconds,
		.cost_micro_usd = cost_micro(w, r->gpu_seconds), .worker = w->name,
		.attempt = h->qj.attempt};
	size_t text_len = r->text_len; /* (what follows its reasoning, with thinking) */
	if (h->thinking) { /* its reasoning: all until "</think>" (all of it when none came) */
		struct split_cut cut;
		split_whole(jr.text, text_len, true, &cut);
		jr.has_reasoning = true;
		jr.reasoning = cut.reasoning;
		jr.reasoning_len = cut.reasoning_len;
		jr.text = cut.text;
		jr.text_len = text_len = cut.text_len;
		jr.reasoning_tokens = r->n_out;
		for (int k = 0; k < r->n_out && w->think_end >= 0; k++)
			if (r->out[k] == w->think_end) {
				jr.reasoning_tokens = k;
				break;
			}
		if (!text_len)
			jr.text = "";
	}
	char *calls = NULL; /* with tools: the calls in its text, and the content before them */
	size_t content = 0;
	char *whole = NULL; /* a forced call: its opening (from the prompt) and the text */
	if (h->forced && (whole = malloc(strlen(h->forced) + text_len + 1))) {
		memcpy(whole, h->forced, strlen(h->forced));
		memcpy(whole + strlen(h->forced), jr.text, text_len);
		text_len += strlen(h->forced);
		jr.text = whole;
		jr.text_len = text_len;
	}
	if (h->tools && st == JOB_COMPLETED &&
	    chat_tool_calls(w->chat, jr.text, text_len, h->tools, strlen(h->tools),
			    h->one_call ? 1 : 0, &content, &calls, NULL, 0) == WK_OK && calls) {
		jr.tool_calls = calls;
		/* a function named by tool_choice ends "stop", as OpenAI's API ends it */
		jr.finish_reason = h->forced && strlen(h->forced) > 11 ? "stop" : "tool_calls";
		jr.text_len = content;
		if (!content)
			jr.text = "";
	}
	if (h->split && st == JOB_COMPLETED && jr.text_len > h->sp.sent) /* what it held back */
		queue_stream(w->q, &h->qj, jr.text + h->sp.sent, jr.text_len - h->sp.sent);
	held_forget(h);
	struct lp_set lp = {0}, plp = {0};
	if (r->logprobs && r->lp && lp_build(w, r, 0, r->n_out, &lp) == WK_OK) {
		jr.has_logprobs = true;
		jr.logprobs = lp.lp;
		jr.n_logprobs = lp.n;
	} else if (r->logprobs && st == JOB_COMPLETED) {
		jr.has_logprobs = r->n_out == 0; /* (none to give; else out of memory: left out) */
	}
	if (r->prompt_logprobs && st == JOB_COMPLETED && r->plp &&
	    lp_build(w, r, -r->n_prompt, 0, &plp) == WK_OK) {
		jr.has_prompt_logprobs = true;
		jr.prompt_logprobs = plp.lp;
		jr.prompt_ids = r->prompt;
		jr.n_prompt_logprobs = plp.n;
	}
	size_t len;
	char *json = job_encode_result(&jr, &len);
	lp_set_free(&lp);
	lp_set_free(&plp);
	free(calls);
	free(whole);
	set_bill(h, st, r->n_prompt, r->n_out, queue_s, r->gpu_seconds, jr.cost_micro_usd);
	h->bill.cached_tokens = r->cached;
	if (st == JOB_COMPLETED)
		w->jobs_done++;
	else
		w->jobs_failed++;
	char spec[96] = "";
	if (r->drafted)
		snprintf(spec, sizeof spec, " (%d of %d draft tokens kept)", r->accepted,
			 r->drafted);
	wlog(w, "job_done", "job %s: %s, %d prompt + %d completion tokens, %d steps%s, %.3f s",
	     h->qj.id, job_status_name(st), r->n_prompt, r->n_out, r->steps, spec,
	     r->t_done - r->t_admit);
	h->req = NULL;
	sched_req_free(r);
	push_result(w, h, json, len, false);
}

/* sched_step's callbacks run under step_mu (see run_step) */
static void on_done(void *ctx, struct sched_req *r)
{
	step_hold();
	job_done(ctx, r);
	step_release();
}

/* ---- admitting a job ---- */

static int render_prompt(struct worker *w, const struct job *j, int **ids, int *n, char *err,
			 size_t errsz)
{
	struct job_model jm = {w->tok, w->chat, eng_info(w->e)->vocab};
	return job_prompt(&jm, j, true, ids, n, err, errsz);
}

/* A queue job that asked to stream ("stream": true): its text as it is made, to the
 * queue's stream channel (Redis: sent by the flush after the step; RunPod's stream URL: by
 * the driver's thread). */
struct stream_ctx {
	struct worker *w;
	struct held *h;
};

/* split_piece's emit for a queue stream: the content; the reasoning stays in the result */
static void emit_content(void *ctx, bool reasoning, const char *bytes, size_t n)
{
	struct stream_ctx *c = ctx;
	if (!reasoning)
		queue_stream(c->w->q, &c->h->qj, bytes, n);
}

static void on_job_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	struct worker *w = ctx;
	struct held *h = r->user;
	if (h->split)
		split_piece(&h->sp, piece, len, emit_content, &(struct stream_ctx){w, h});
	else if (len)
		queue_stream(w->q, &h->qj, piece, len);
}

/* What admitting a job needs that reads only the job and the model, not the scheduler: its
 * document decoded, its prompt rendered and encoded, its prediction encoded. A preparer thread
 * does it for a big job while the engine steps; a small one is prepared where it is taken. */
struct prep {
	struct held *h;
	struct job *pre;  /* an HTTP request's job, decoded by its check (NULL: decode qj's) */
	struct job j;
	enum job_err je;  /* the decode's */
	int rc;           /* the prompt's and the prediction's: WK_OK, else the error in err */
	int *prompt, n_prompt, *pred, n_pred;
	char err[WK_ERRSZ];
	struct prep *next;
};

/* Touches nothing of the worker's but the model (the tokenizer and its memo are shared
 * with the HTTP thread already) and p's job. */
static void prepare(struct worker *w, struct prep *p)
{
	struct held *h = p->h;
	if (p->pre) { /* not again here (a long conversation's document takes milliseconds) */
		p->j = *p->pre;
		free(p->pre);
		p->pre = NULL;
		p->je = JOB_OK;
	} else {
		p->je = job_decode(h->qj.body, h->qj.len, h->qj.id, &p->j, p->err, sizeof p->err);
	}
	if (p->je != JOB_OK)
		return;
	p->rc = render_prompt(w, &p->j, &p->prompt, &p->n_prompt, p->err, sizeof p->err);
	if (p->rc == WK_OK && p->j.prediction && w->tok && p->j.prediction[0])
		p->rc = tok_encode(w->tok, p->j.prediction, strlen(p->j.prediction), false,
				   &p->pred, &p->n_pred, p->err, sizeof p->err);
}

static void prep_free(struct prep *p)
{
	if (p->pre) {
		job_free(p->pre);
		free(p->pre);
	}
	job_free(&p->j);
	free(p->prompt);
	free(p->pred);
	free(p);
}

static void on_token(void *ctx, struct sched_req *r, const char *piece, size_t len);

/* The rest of a job's admission, on this thread: a scheduler request from p (its job and ids
 * taken; p itself is the caller's), or the job failed. */
static void admit_prepared(struct worker *w, struct held *h, struct prep *p)
{
	char err[WK_ERRSZ];
	struct job j = p->j;
	memset(&p->j, 0, sizeof p->j);
	enum job_err je = p->je;
	snprintf(h->tenant, sizeof h->tenant, "%s", j.tenant);
	if (je != JOB_OK) {
		fail_job(w, h, JOB_FAILED, je, p->err, je == JOB_EINVALID_JSON);
		job_free(&j);
		return;
	}
	if (h->qj.cancelled) {
		fail_job(w, h, JOB_CANCELLED, JOB_ECANCELLED, "cancelled before it ran", false);
		job_free(&j);
		return;
	}
	if (p->rc != WK_OK) {
		fail_job(w, h, JOB_FAILED, p->rc == WK_EINVAL ? JOB_EINVALID_INPUT : JOB_EINTERNAL,
			 p->err, false);
		job_free(&j);
		return;
	}
	struct sched_req *r = calloc(1, sizeof *r);
	if (!r) {
		fail_job(w, h, JOB_FAILED, JOB_EINTERNAL, "out of memory", false);
		job_free(&j);
		return;
	}
	r->prompt = p->prompt;
	r->n_prompt = p->n_prompt;
	r->pred = p->pred;
	r->n_pred = p->n_pred;
	p->prompt = p->pred = NULL;
	snprintf(r->id, sizeof r->id, "%s", h->qj.id);
	r->max_tokens = j.max_tokens;
	/* a tenant's prefixes are its own (no tenant: "default", as the ledger bills it) */
	const char *tenant = *j.tenant ? j.tenant : "default";
	r->cache_key = XXH3_64bits(tenant, strlen(tenant));
	r->samp = (struct samp_cfg){.temperature = j.temperature, .top_p = j.top_p,
				    .top_k = j.top_k,
				    .seed = j.has_seed ? j.seed : wk_random_seed()};
	for (int i = 0; i < j.n_stop && i < SCHED_MAX_STOP; i++) {
		r->stop[i] = j.stop[i];
		j.stop[i] = NULL;
		r->n_stop++;
	}
	r->deadline = h->taken_at + j.timeout_s;
	r->logprobs = j.logprobs;
	r->top_logprobs = j.top_logprobs;
	r->prompt_logprobs = j.prompt_logprobs;
	r->prompt_top = j.prompt_top;
	r->presence_penalty = j.presence_penalty;
	r->frequency_penalty = j.frequency_penalty;
	r->repetition_penalty = j.repetition_penalty;
	r->bias_id = j.bias_id;
	r->bias = j.bias;
	r->n_bias = j.n_bias;
	j.bias_id = NULL;
	j.bias = NULL;
	r->user = h;
	const struct eng_info *in = eng_info(w->e);
	int bad = -1;
	if (j.json && j.thinking && !j.forced && w->think_end >= 0)
		r->gram_after = w->think_end + 1; /* the reasoning is free, the answer JSON */
	if (j.json && gram_compile(j.schema, j.schema ? strlen(j.schema) : 0, &r->gram, err,
				   sizeof err) != WK_OK) { /* (job_decode compiled it: memory) */
		fail_job(w, h, JOB_FAILED, JOB_EINTERNAL, err, false);
		sched_req_free(r);
		job_free(&j);
		return;
	}
	for (int k = 0; k < r->n_bias && bad < 0; k++)
		if (r->bias_id[k] >= in->vocab)
			bad = r->bias_id[k];
	if (bad >= 0) {
		snprintf(err, sizeof err, "input.logit_bias: token id %d is outside the vocabulary "
			 "(ids 0 to %d)", bad, in->vocab - 1);
		fail_job(w, h, JOB_FAILED, JOB_EINVALID_INPUT, err, false);
		sched_req_free(r);
	} else if (r->n_prompt + 1 > in->max_seq) {
		snprintf(err, sizeof err, "the prompt is %d tokens; the context holds %d, so a "
			 "prompt may have at most %d (one position for a generated token)",
			 r->n_prompt, in->max_seq, in->max_seq - 1);
		fail_job(w, h, JOB_FAILED, JOB_EPROMPT_TOO_LONG, err, false);
		sched_req_free(r);
	} else if (h->http && http_flight_max_given(h->http) &&
		   (int64_t)r->n_prompt + r->max_tokens > in->max_seq) {
		snprintf(err, sizeof err, "the prompt is %d tokens and max_tokens %d: %lld together, "
			 "past the context of %d; ask for at most %d", r->n_prompt, r->max_tokens,
			 (long long)r->n_prompt + r->max_tokens, in->max_seq,
			 in->max_seq - r->n_prompt);
		fail_job(w, h, JOB_FAILED, JOB_EPROMPT_TOO_LONG, err, false);
		sched_req_free(r);
	} else if (sched_submit(w->s, r, err, sizeof err) != WK_OK) {
		fail_job(w, h, JOB_FAILED, JOB_EPROMPT_TOO_LONG, err, false);
		sched_req_free(r);
	} else {
		h->req = r;
		h->tools = j.tools; /* its tool calls are read back when it finishes */
		j.tools = NULL;
		h->thinking = j.thinking && !j.forced;
		h->one_call = j.one_call;
		if (j.forced && (h->forced = malloc(strlen(j.forced) + 12)))
			sprintf(h->forced, "<tool_call>%s", j.forced);
		if (j.stream && !h->http && queue_streams(w->q)) {
			r->on_token = on_job_token;
			queue_stream(w->q, &h->qj, "", 0);
			if ((h->split = h->thinking || h->tools || h->forced))
				split_init(&h->sp, h->thinking, h->tools != NULL, h->forced != NULL);
		}
		if (h->http)
			r->on_token = on_token;
		if (ledger_current(w->ledger) != LEDGER_BUSY) /* the scheduler was empty */
			ledger_state(w->ledger, LEDGER_BUSY, sched_mark(w->s), err, sizeof err);
	}
	job_free(&j);
}

/* A job taken: prepared by a preparer where it is big and the engine has work its preparing
 * here would hold up (its steps' tokens), else here and now. */
static void admit(struct worker *w, struct held *h)
{
	struct prep *p = calloc(1, sizeof *p);
	struct job *pre = h->http ? http_flight_take_job(h->http) : NULL;
	if (!p) {
		struct prep q = {.h = h, .je = JOB_EINTERNAL, .pre = pre};
		snprintf(q.err, sizeof q.err, "out of memory");
		admit_prepared(w, h, &q);
		if (pre) {
			job_free(pre);
			free(pre);
		}
		return;
	}
	p->h = h;
	p->pre = pre;
	if (w->n_preparers && h->qj.len >= WORKER_PREPARE_MIN && sched_pending(w->s) > 0) {
		h->prep = p;
		w->n_preparing++;
		pthread_mutex_lock(&w->pmu);
		if (w->p_todo_tail)
			w->p_todo_tail->next = p;
		else
			w->p_todo = p;
		w->p_todo_tail = p;
		pthread_cond_signal(&w->pcv);
		pthread_mutex_unlock(&w->pmu);
		return;
	}
	prepare(w, p);
	admit_prepared(w, h, p);
	prep_free(p);
}

static void *prep_main(void *arg)
{
	struct worker *w = arg;
	/* below the engine's threads: where they take every core (the CPU backend), a job's
	 * preparing waits for them, not they for it (Linux's nice is a thread's own) */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	pthread_mutex_lock(&w->pmu);
	for (;;) {
		while (!w->p_todo && !w->p_stop)
			pthread_cond_wait(&w->pcv, &w->pmu);
		if (w->p_stop)
			break;
		struct prep *p = w->p_todo;
		if (!(w->p_todo = p->next))
			w->p_todo_tail = NULL;
		w->p_busy++;
		pthread_mutex_unlock(&w->pmu);
		prepare(w, p);
		pthread_mutex_lock(&w->pmu);
		p->next = w->p_done;
		w->p_done = p;
		w->p_busy--;
		pthread_cond_broadcast(&w->pdone);
	}
	pthread_mutex_unlock(&w->pmu);
	return NULL;
}

/* Admits the jobs the preparers finished; with wait_s, first waits that long at most for one
 * when none is. */
static void prep_reap(struct worker *w, double wait_s)
{
	if (!w->n_preparing)
		return;
	pthread_mutex_lock(&w->pmu);
	if (!w->p_done && wait_s > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		long ns = ts.tv_nsec + (long)(wait_s * 1e9);
		ts.tv_sec += ns / 1000000000L;
		ts.tv_nsec = ns % 1000000000L;
		pthread_cond_timedwait(&w->pdone, &w->pmu, &ts);
	}
	struct prep *done = w->p_done, *rev = NULL;
	w->p_done = NULL;
	pthread_mutex_unlock(&w->pmu);
	while (done) { /* in the order they finished */
		struct prep *n = done->next;
		done->next = rev;
		rev = done;
		done = n;
	}
	while (rev) {
		struct prep *n = rev->next;
		rev->h->prep = NULL;
		w->n_preparing--;
		w->jobs_prepared++;
		admit_prepared(w, rev->h, rev);
		prep_free(rev);
		rev = n;
	}
}

/* The preparers stopped (each finishes the job it has), and every prep not admitted dropped:
 * its slot goes back as a job not begun. */
static void prep_stop(struct worker *w)
{
	if (!w->n_preparers)
		return;
	pthread_mutex_lock(&w->pmu);
	w->p_stop = true;
	pthread_cond_broadcast(&w->pcv);
	while (w->p_busy)
		pthread_cond_wait(&w->pdone, &w->pmu);
	struct prep *lists[2] = {w->p_todo, w->p_done};
	w->p_todo = w->p_todo_tail = w->p_done = NULL;
	pthread_mutex_unlock(&w->pmu);
	int dropped = 0;
	for (int k = 0; k < 2; k++)
		for (struct prep *p = lists[k], *n; p; p = n) {
			n = p->next;
			p->h->prep = NULL;
			w->n_preparing--;
			prep_free(p);
			dropped++;
		}
	if (dropped)
		wlog(w, "prepare", "%d job(s) taken and not yet admitted go back as not begun",
		     dropped);
}

/* A snapshot's id for the ledger: its directory name and the xxh64 of its manifest. */
static void snapshot_id(const char *model, char *out, size_t n)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/manifest.json", model);
	char *buf = NULL;
	size_t len = 0;
	char err[WK_ERRSZ];
	if (!snap_is_snapshot(model) ||
	    wk_read_file(path, SNAP_MAX_MANIFEST, &buf, &len, err, sizeof err) != WK_OK)
		return;
	const char *base;
	size_t bl = strlen(model);
	while (bl > 1 && model[bl - 1] == '/')
		bl--;
	base = model;
	for (size_t i = 0; i + 1 < bl; i++)
		if (model[i] == '/')
			base = model + i + 1;
	snprintf(out, n, "%.*s@%016llx", (int)(bl - (size_t)(base - model)), base,
		 (unsigned long long)XXH64(buf, len, 0));
	free(buf);
}

/* After a step: once nothing is pending the busy time ends where the last slice ended. */
static void account_step_end(struct worker *w)
{
	char err[WK_ERRSZ];
	if (sched_pending(w->s) == 0 && ledger_current(w->ledger) == LEDGER_BUSY &&
	    ledger_state(w->ledger, w->state == ST_DRAINING ? LEDGER_DRAINING : LEDGER_IDLE,
			 sched_mark(w->s), err, sizeof err) != WK_OK)
		wlog(w, "ledger_error", "%s", err);
}

static int held_count(const struct worker *w)
{
	int n = 0;
	for (int i = 0; i < w->cap; i++)
		n += w->held[i].used;
	return n;
}

/* Jobs that may be taken now: the engine runs `concurrency` at once; slots whose results the
 * committer is storing do not count against it, only against the slot array. */
static int free_slots_now(const struct worker *w)
{
	int held = held_count(w);
	int active = held - w->n_committing;
	int n = w->o.concurrency - active;
	if (n > w->cap - held)
		n = w->cap - held;
	return n;
}

static void take_jobs(struct worker *w, double wait_s)
{
	int free_slots = free_slots_now(w);
	if (w->o.max_jobs > 0 && free_slots > w->o.max_jobs - w->jobs_taken)
		free_slots = (int)(w->o.max_jobs - w->jobs_taken);
	if (free_slots <= 0)
		return;
	struct queue_job *jobs = calloc((size_t)free_slots, sizeof *jobs);
	if (!jobs)
		return;
	char err[WK_ERRSZ];
	int n = 0;
	int rc = queue_take(w->q, jobs, free_slots, wait_s, &n, err, sizeof err);
	queue_note(w, rc, "take", err);
	if (rc != WK_OK) {
		free(jobs);
		if (sched_pending(w->s) == 0) /* (running jobs' steps pace the loop) */
			usleep(200000);
		return;
	}
	double now = wk_now();
	for (int k = 0; k < n; k++) {
		struct held *h = NULL;
		for (int i = 0; i < w->cap && !h; i++)
			if (!w->held[i].used)
				h = &w->held[i];
		*h = (struct held){.qj = jobs[k], .taken_at = now,
				   .enqueued_wall = jobs[k].enqueued_at, .used = true};
		w->jobs_taken++;
		w->t_last_activity = now;
		admit(w, h);
	}
	free(jobs);
}

/* ---- the HTTP endpoint (--listen): its requests share the batch with queue jobs ---- */

static void on_token(void *ctx, struct sched_req *r, const char *piece, size_t len)
{
	struct worker *w = ctx;
	struct held *h = r->user;
	step_hold();
	struct lp_set lp;
	if (r->prompt_logprobs && !h->plp_sent && http_flight_stream(h->http) &&
	    lp_build(w, r, -r->n_prompt, 0, &lp) == WK_OK) { /* echo: the prompt goes first */
		size_t n;
		char *json = job_logprobs_json(lp.lp, lp.n, &n);
		if (json)
			http_api_prompt(w->http, h->http, json, n);
		h->plp_sent = true;
		free(json);
		lp_set_free(&lp);
	}
	if (r->logprobs && r->n_out > h->lp_sent && http_flight_stream(h->http) &&
	    lp_build(w, r, h->lp_sent, r->n_out, &lp) == WK_OK) { /* they go with the piece */
		size_t n;
		char *json = job_logprobs_json(lp.lp, lp.n, &n);
		if (json)
			http_api_logprobs(w->http, h->http, json, n);
		h->lp_sent = r->n_out;
		free(json);
		lp_set_free(&lp);
	}
	http_api_token(w->http, h->http, r->n_out, piece, len);
	step_release();
}

static void take_http(struct worker *w, double wait_s)
{
	int free_slots = free_slots_now(w);
	if (w->o.max_jobs > 0 && free_slots > w->o.max_jobs - w->jobs_taken)
		free_slots = (int)(w->o.max_jobs - w->jobs_taken);
	if (free_slots <= 0)
		return;
	struct http_flight *f[2 * WORKER_MAX_CONCURRENCY];
	int n = http_api_take(w->http, f, free_slots, wait_s);
	double now = wk_now();
	for (int k = 0; k < n; k++) {
		struct held *h = NULL;
		for (int i = 0; i < w->cap && !h; i++)
			if (!w->held[i].used)
				h = &w->held[i];
		*h = (struct held){.taken_at = now, .used = true, .http = f[k]};
		http_flight_job(f[k], &h->qj);
		h->enqueued_wall = h->qj.enqueued_at;
		w->jobs_taken++;
		w->t_last_activity = now;
		admit(w, h);
	}
}

/* Cancels the requests whose clients went away: their slots free at the next step. */
static void http_cancels(struct worker *w)
{
	struct http_flight *f[64];
	int n;
	while ((n = http_api_cancelled(w->http, f, 64)) > 0)
		for (int k = 0; k < n; k++)
			for (int i = 0; i < w->cap; i++)
				if (w->held[i].used && w->held[i].http == f[k] &&
				    (w->held[i].req || w->held[i].prep)) {
					wlog(w, "client_gone", "request %s: the client went away; "
							       "cancelled", w->held[i].qj.id);
					if (w->held[i].req)
						sched_cancel(w->s, w->held[i].req);
					else /* being prepared: it ends when it is admitted */
						w->held[i].qj.cancelled = true;
				}
}

/* At exit with HTTP requests still running (the drain timed out): they cannot be handed
 * back, so they end CANCELLED through one more step, billed for what they ran. */
static void cancel_http(struct worker *w)
{
	bool any = false;
	for (int i = 0; i < w->cap; i++)
		if (w->held[i].used && w->held[i].http && w->held[i].req) {
			sched_cancel(w->s, w->held[i].req);
			any = true;
		}
	if (any && run_step(w) < 0)
		wlog(w, "engine_error", "the engine failed a step; its jobs failed");
}

/* Lease heartbeats and cancel checks for the jobs held, every lease/3 and 0.5 s. */
static void housekeeping(struct worker *w, double *t_lease, double *t_cancel)
{
	double now = wk_now();
	int n = 0;
	struct queue_job *jobs[2 * WORKER_MAX_CONCURRENCY];
	for (int i = 0; i < w->cap; i++)
		if (w->held[i].used && w->held[i].req && !w->held[i].http)
			jobs[n++] = &w->held[i].qj;
	if (!n)
		return;
	char err[WK_ERRSZ];
	struct queue_job *tmp = malloc((size_t)n * sizeof *tmp);
	if (!tmp)
		return;
	for (int i = 0; i < n; i++)
		tmp[i] = *jobs[i];
	if (now - *t_lease > w->o.lease_s / 3) {
		*t_lease = now;
		int rc = queue_extend(w->q, tmp, n, w->o.lease_s, NULL, err, sizeof err);
		if (rc != WK_OK && rc != WK_ENOTFOUND) /* ENOTFOUND: a lease lost, said by the driver */
			queue_note(w, rc, "lease", err);
		else if (rc == WK_ENOTFOUND)
			wlog(w, "lease", "%s", err);
	}
	if (now - *t_cancel > 0.5) {
		*t_cancel = now;
		int rc = queue_check_cancel(w->q, tmp, n, err, sizeof err);
		if (rc != WK_OK) /* (the marks it set still stand: HTTP's pings may fail alone) */
			queue_note(w, rc, "cancel check", err);
		for (int i = 0; i < n; i++)
			if (tmp[i].cancelled && !jobs[i]->cancelled) {
				jobs[i]->cancelled = true;
				struct held *h =
					(struct held *)((char *)jobs[i] - offsetof(struct held, qj));
				if (h->req)
					sched_cancel(w->s, h->req);
			}
	}
	for (int i = 0; i < n; i++) /* the driver may have renamed a claim: keep its receipt */
		memcpy(jobs[i]->handle, tmp[i].handle, sizeof tmp[i].handle);
	free(tmp);
}

/* Hands every job still held back to the queue (drain). */
static void release_all(struct worker *w)
{
	char err[WK_ERRSZ];
	for (int i = 0; i < w->cap; i++) {
		struct held *h = &w->held[i];
		if (!h->used || h->http) /* HTTP requests were cancelled (cancel_http) */
			continue;
		/* the attempt's GPU time so far is billed (as overhead: it did not finish) */
		struct sched_req *r = h->req;
		double gpu_s = r ? r->gpu_seconds : h->spent_gpu_s;
		snprintf(h->bill_status, sizeof h->bill_status, "RELEASED");
		h->bill = (struct ledger_req){
			.id = h->qj.id, .tenant = h->tenant, .status = h->bill_status,
			.attempt = h->qj.attempt, .gpu_seconds = gpu_s,
			.prompt_tokens = r ? r->n_prompt : h->spent_prompt,
			.completion_tokens = r ? r->n_out : h->spent_out,
			.cost_micro_usd = cost_micro(w, gpu_s)};
		if (ledger_requests(w->ledger, &h->bill, 1, err, sizeof err) != WK_OK)
			wlog(w, "ledger_error", "job %s: %s", h->qj.id, err);
		bool lost = w->q_fail_since && wk_now() - w->q_fail_since > w->o.queue_outage;
		queue_set_reconnect(w->q, store_budget(w));
		int rc = lost ? WK_EIO : queue_release(w->q, &h->qj, 1, err, sizeof err);
		queue_set_reconnect(w->q, w->poll_s);
		if (lost)
			wlog(w, "release", "job %s: not handed back (the queue is unreachable); it "
					   "returns to the queue when its lease expires", h->qj.id);
		else if (rc != WK_OK)
			wlog(w, "release", "job %s: %s", h->qj.id, err);
		else
			wlog(w, "released", "job %s handed back to the queue", h->qj.id);
		queue_job_free(&h->qj);
		held_forget(h);
		h->used = false;
	}
}

/* At the end (the main thread, or the watchdog after a hung step): the results of finished
 * jobs stored, every batch handed to the committer stored, then every job still held handed
 * back, and the HTTP server ended (a request not finished gets 503). now: the ledger's clock. */
static void hand_back(struct worker *w, double now)
{
	char err[WK_ERRSZ];
	flush_results(w);
	commit_reap(w, true); /* every batch handed over is stored before anything is released */
	if (ledger_current(w->ledger) == LEDGER_BUSY) /* drain timed out with jobs running */
		ledger_state(w->ledger, LEDGER_DRAINING, now, err, sizeof err);
	prep_stop(w); /* a job being prepared goes back as one not begun */
	if (held_count(w))
		release_all(w);
	http_api_stop(w->http); /* every HTTP request has had its answer */
	w->http = NULL;
}

/* The ledger's exit record and the bill line, and the usage export's last posts. */
static void close_books(struct worker *w, const char *why)
{
	char err[WK_ERRSZ];
	if (w->ledger) {
		struct ledger_totals tot;
		double t_end = wk_now();
		if (ledger_exit(w->ledger, why, t_end, &tot, err, sizeof err) != WK_OK)
			wlog(w, "ledger_error", "%s", err);
		char bill[256];
		ledger_bill_line(bill, sizeof bill, w->o.queue_url ? "worker" : "session",
				 t_end - w->t_start, &tot, w->o.gpus, w->o.gpu_type, w->o.price_micro);
		wlog(w, "bill", "%s", bill);
		ledger_close(w->ledger);
		w->ledger = NULL;
	}
	if (w->exporter) {
		struct export_stats es;
		if (exporter_finish(w->exporter, 10, &es, err, sizeof err) != WK_OK)
			wlog(w, "usage_export", "%s", err);
		else
			wlog(w, "usage_export", "%llu events sent in %llu posts (%llu failed and "
						"retried)", (unsigned long long)es.events,
			     (unsigned long long)es.posts, (unsigned long long)es.failed_posts);
		w->exporter = NULL;
	}
}

/* The command line's name for the worker, or HOST-PID (the host's name made safe for a job's
 * worker field). */
static void name_worker(struct worker *w)
{
	char host[64] = "host";
	gethostname(host, sizeof host - 1);
	for (char *p = host; *p; p++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *p))
			*p = '-';
	if (w->o.name_opt)
		snprintf(w->name, sizeof w->name, "%s", w->o.name_opt);
	else
		snprintf(w->name, sizeof w->name, "%.100s-%d", host, (int)getpid());
}

/* The start: the HTTP endpoint first (its /health answers 503 while the engine starts), the
 * ledger and its exporter, the engine, the scheduler and the queue (on a spool, with the
 * committer's handle and thread). Returns 0, or the exit status (1, or 2 for a --listen that
 * cannot be served) after a startup_failed line; *why: the reason the books close with. */
static int start(struct worker *w, const char **why)
{
	char err[WK_ERRSZ];
	if (w->o.ho.listen) { /* first: /health answers 503 while the engine starts */
		char bound[300];
		w->o.ho.model = w->o.ce.model;
		w->o.ho.price_micro = w->o.price_micro;
		w->o.ho.stop = &got_signal;
		w->o.ho.log = http_log;
		w->o.ho.log_ctx = w;
		if (!w->o.ho.parse_threads_set) /* (a big request's, beside) */
			w->o.ho.parse_threads = w->o.prepare_threads;
		int hrc = http_api_start(&w->o.ho, &w->http, bound, sizeof bound, err, sizeof err);
		if (hrc != WK_OK) {
			wlog(w, "startup_failed", "%s", err);
			return hrc == WK_EINVAL ? 2 : 1;
		}
		wlog(w, "listen", "serving the OpenAI API at http://%s/v1", bound);
	}
	char snap_id[300] = "";
	snapshot_id(w->o.ce.model, snap_id, sizeof snap_id);
	struct ledger_info li = {.worker = w->name, .model = w->o.ce.model, .gpu_type = w->o.gpu_type,
				 .snapshot = *snap_id ? snap_id : NULL,
				 .gpu_count = w->o.gpus, .price_micro_per_hour = w->o.price_micro,
				 .tick_s = w->o.tick_s, .t_start = w->t_start};
	if (ledger_open(w->o.ledger_path, &li, &w->ledger, err, sizeof err) != WK_OK) {
		wlog(w, "startup_failed", "%s", err);
		return 1;
	}
	*why = "startup_failed";
	if (w->o.usage_url && exporter_start(w->o.ledger_path, w->o.usage_url, &w->exporter, err,
					  sizeof err) != WK_OK) {
		wlog(w, "startup_failed", "%s", err);
		return 1;
	}
	w->o.ce.o.max_seqs = w->o.concurrency;
	if (!w->o.ce.o.tok_memo) /* an agent's conversation is encoded again at every turn */
		w->o.ce.o.tok_memo = (size_t)64 << 20;
	w->cap = 2 * w->o.concurrency; /* a committer may hold a batch while the engine runs the next */
	w->held = calloc((size_t)w->cap, sizeof *w->held);
	w->out = calloc((size_t)w->cap, sizeof *w->out);
	w->out_json = calloc((size_t)w->cap, sizeof *w->out_json);
	if (!w->held || !w->out || !w->out_json)
		return 1;
	if (eng_open(w->o.ce.model, &w->o.ce.o, &w->e, err, sizeof err) != WK_OK) {
		wlog(w, "startup_failed", "%s", err);
		return 1;
	}
	if (eng_info(w->e)->unused_tensors)
		wlog(w, "unused_tensors", "%d tensors of the checkpoint are not used by the model, "
		     "e.g. '%s': does config.json match the weights?", eng_info(w->e)->unused_tensors,
		     eng_info(w->e)->unused_example);
	w->tok = eng_tokenizer(w->e);
	/* the chat format from the model's own template (GLM-4.5/4.6's is not GLM-4.7's, with
	 * one architecture), else from its architecture */
	char ferr[WK_ERRSZ];
	enum chat_format cf;
	if (chat_format_for_model(w->o.ce.model, &cf, ferr, sizeof ferr) == WK_OK) {
		w->chat = cf;
	} else {
		w->chat = chat_format_for(eng_info(w->e)->arch);
		wlog(w, "chat_format", "%s; rendering chats as %s (its architecture's)", ferr,
		     chat_format_name(w->chat));
	}
	int *te = NULL, nte = 0;
	w->think_end = w->tok && w->chat != CHAT_PLAIN &&
				       tok_encode(w->tok, "</think>", 8, false, &te, &nte, NULL, 0) ==
					       WK_OK && nte == 1
			       ? te[0]
			       : -1;
	free(te);
	if (w->http) /* /tokenize and /detokenize */
		http_api_set_model(w->http, &(struct job_model){w->tok, w->chat,
								eng_info(w->e)->vocab},
				   eng_info(w->e)->max_seq);
	if (w->o.step_log_path && !(w->step_log = fopen(w->o.step_log_path, "a"))) {
		wlog(w, "startup_failed", "%s: %s", w->o.step_log_path, strerror(errno));
		return 1;
	}
	w->s = sched_create(w->e, w->step_log);
	if (w->s && (sched_set_speculate(w->s, w->o.speculate) != WK_OK ||
		     sched_set_prefix_cache(w->s, !w->o.no_prefix_cache) != WK_OK ||
		     (w->o.prefix_wait >= 0 &&
		      sched_set_prefix_wait(w->s, w->o.prefix_wait) != WK_OK) ||
		     sched_set_speculate_max_batch(w->s, w->o.speculate_max_batch) != WK_OK ||
		     sched_set_draft_cost(w->s, w->o.draft_cost) != WK_OK)) {
		sched_free(w->s);
		w->s = NULL;
	}
	struct queue_opts qo = {.consumer = w->name, .lease_s = w->o.lease_s, .done_url = w->o.done_url,
				.ping_url = w->o.ping_url, .stream_url = w->o.stream_url,
				.on_refused = job_refused, .on_refused_ctx = w,
				.reconnect_s = QUEUE_STORE_S, .stop = &got_signal};
	if (!w->s ||
	    (w->o.queue_url && queue_open(w->o.queue_url, &qo, &w->q, err, sizeof err) != WK_OK)) {
		wlog(w, "startup_failed", "%s", w->s ? err : "out of memory");
		return 1;
	}
	/* the main loop's calls (see QUEUE_POLL_S): redis and SQS calls block it; the HTTP
	 * (RunPod) driver's run on its own threads and keep their budget */
	w->poll_s = w->q && (!strcmp(queue_driver(w->q), "redis") || !strcmp(queue_driver(w->q), "sqs"))
			   ? QUEUE_POLL_S : QUEUE_STORE_S;
	queue_set_reconnect(w->q, w->poll_s);
	/* On a spool the file-system work of storing results, on SQS its round trips
	 * (SendMessageBatch, DeleteMessageBatch) and on the RunPod job API its job-done posts
	 * are done by a committer thread, overlapped with the next steps: on its own handle
	 * (spool, SQS), or on the main one (HTTP: the driver's network thread does the posts,
	 * its calls are safe from two threads, and a streaming job's done post must wait for
	 * the pieces that handle sent; a second handle would also ping without the jobs).
	 * (Redis stores on the main handle: a step's stream pieces go first on the same
	 * connection, and a result never overtakes them.) */
	const char *drv = w->q ? queue_driver(w->q) : "";
	if (!strcmp(drv, "spool") || !strcmp(drv, "sqs") || !strcmp(drv, "http")) {
		if (strcmp(drv, "http") &&
		    queue_open(w->o.queue_url, &qo, &w->qc, err, sizeof err) != WK_OK) {
			wlog(w, "startup_failed", "%s", err);
			return 1;
		}
		pthread_mutex_init(&w->cmu, NULL);
		pthread_cond_init(&w->ccv, NULL);
		w->have_committer = pthread_create(&w->committer, NULL, commit_main, w) == 0;
	}
	pthread_mutex_init(&w->pmu, NULL);
	pthread_cond_init(&w->pcv, NULL);
	pthread_cond_init(&w->pdone, NULL);
	while (w->n_preparers < w->o.prepare_threads &&
	       !pthread_create(&w->preparer[w->n_preparers], NULL, prep_main, w))
		w->n_preparers++;
	return 0;
}

/* --prefix-cache-dir: the entries a worker of this model left at its exit, read back (a
 * damaged or unreadable file is said and passed over: the start goes on, and the exit
 * writes the file again). */
static void prefix_load(struct worker *w)
{
	char err[WK_ERRSZ];
	struct prefix_store_stats st;
	if (!w->o.prefix_dir || w->o.no_prefix_cache)
		return;
	if (eng_cache_id(w->e, &w->cache_id, err, sizeof err) != WK_OK) {
		wlog(w, "prefix_cache", "not kept across restarts: %s", err);
		return;
	}
	w->cache_kept = true;
	int rc = prefix_store_load(w->s, w->e, w->o.prefix_dir, w->cache_id, &st, err,
				   sizeof err);
	push_cache_stats(w); /* (the entries read are gauges in /metrics from the start) */
	if (rc != WK_OK)
		wlog(w, "prefix_cache", "%s; %d entries read before it, the rest passed over", err,
		     st.entries);
	else if (st.entries || st.skipped)
		wlog(w, "prefix_cache", "read %d entries (%ld tokens, %.3f MB) from %s in %.1f ms%s",
		     st.entries, st.tokens, st.bytes / 1e6, st.path, st.seconds * 1e3,
		     st.skipped ? "; some not: no sequence free or past the context" : "");
	else
		wlog(w, "prefix_cache", "none kept at %s yet", st.path);
}

/* ... and written at the exit, unless the engine failed (its caches are not trusted):
 * within --prefix-cache-max, and after a drain within what is left of its deadline (the
 * platform's kill follows its grace period). */
static void prefix_save(struct worker *w)
{
	char err[WK_ERRSZ];
	struct prefix_store_stats st;
	if (!w->cache_kept || sched_engine_failed(w->s, NULL) != WK_OK)
		return;
	struct prefix_store_limits lim = {
		.max_bytes = w->o.prefix_max,
		.deadline = w->state == ST_DRAINING ? w->t_drain_deadline : 0};
	if (prefix_store_save(w->s, w->e, w->o.prefix_dir, w->cache_id, &lim, &st, err,
			      sizeof err) != WK_OK)
		wlog(w, "prefix_cache", "not written: %s", err);
	else if (!st.entries && st.skipped)
		wlog(w, "prefix_cache", "none of %d entries written: past %s; %s stays as it was",
		     st.skipped, lim.max_bytes ? "--prefix-cache-max or the drain's deadline"
					       : "the drain's deadline", st.path);
	else if (!st.entries)
		wlog(w, "prefix_cache", "no entries of its own: %s left as it was", st.path);
	else
		wlog(w, "prefix_cache", "wrote %d entries, %d of them kept from the file it "
		     "replaced (%ld tokens, %.3f MB) to %s in %.1f ms%s", st.entries, st.merged,
		     st.tokens, st.bytes / 1e6, st.path, st.seconds * 1e3,
		     st.skipped ? "; the older ones left out: past --prefix-cache-max or the "
				  "drain's deadline" : "");
}

/* The ready line: how long the start took and where its time went. */
static void log_ready(struct worker *w)
{
	char err[WK_ERRSZ];
	const struct eng_startup *su = &eng_info(w->e)->startup;
	const struct eng_info *ei = eng_info(w->e);
	char comm[96] = ""; /* sharded: the ranks' communicator, made beside the restore */
	if (su->comm_s > 0)
		snprintf(comm, sizeof comm, "; communicator %.1f ms, %.1f ms of it after them",
			 su->comm_s * 1e3, su->comm_wait_s * 1e3);
	char spec_cap[128] = ""; /* --draft-cost, --speculate-max-batch */
	if (w->o.speculate) {
		int n = w->o.draft_cost == SCHED_COST_AUTO
				? snprintf(spec_cap, sizeof spec_cap, ", drafts where they pay (their "
					   "cost measured)")
				: snprintf(spec_cap, sizeof spec_cap, ", drafts where they pay (%.3g of a "
					   "step each)", w->o.draft_cost);
		if (w->o.speculate_max_batch)
			snprintf(spec_cap + n, sizeof spec_cap - (size_t)n,
				 ", none in a step of more than %d jobs", w->o.speculate_max_batch);
	}
	wlog(w, "ready", "started in %.1f ms (weights %.1f ms, %.1f MB%s; tokenizer %.1f ms%s "
	     "beside them%s), backend %s, %d x %d positions of %s KV cache, chat format %s%s%s",
	     (wk_now() - w->t_start) * 1e3, su->weights_s * 1e3, su->bytes / 1e6,
	     su->snapshot ? " restored from a snapshot" : "", su->tokenizer_s * 1e3,
	     su->tokenizer_prepared ? " prepared" : "", comm, ei->backend,
	     ei->max_seqs, ei->max_seq, ei->kv_dtype, chat_format_name(w->chat),
	     !w->o.speculate ? ""
	     : ei->mtp	     ? ", speculative decoding on (the MTP layer drafts)"
			     : ", speculative decoding on (prompt lookup drafts)",
	     spec_cap);
	set_state(w, ST_READY);
	w->t_last_activity = wk_now();
	if (ledger_state(w->ledger, LEDGER_IDLE, w->t_last_activity, err, sizeof err) != WK_OK)
		wlog(w, "ledger_error", "%s", err);
}

/* The main loop, from READY to the reason it ends ("idle", "signal", "max_lifetime",
 * "max_jobs", "queue_lost", "engine_failed"): takes jobs and HTTP requests, steps the batch,
 * stores the results, extends the leases, drains when told. */
static const char *serve(struct worker *w)
{
	char err[WK_ERRSZ];
	const char *why = "idle";
	double t_lease = wk_now(), t_cancel = wk_now();
	for (;;) {
		double now = wk_now();
		if (atomic_load_explicit(&got_signal, memory_order_relaxed) &&
		    w->state != ST_DRAINING) {
			wlog(w, "signal", "signal %d: draining (up to %.0f s)", atomic_load(&got_signal),
			     w->o.drain_timeout);
			set_state(w, ST_DRAINING);
			w->t_drain_deadline = now + w->o.drain_timeout;
			why = "signal";
			account_step_end(w);
			if (sched_pending(w->s) == 0)
				ledger_state(w->ledger, LEDGER_DRAINING, now, err, sizeof err);
		}
		if (w->state != ST_DRAINING && w->o.max_lifetime > 0 && now - w->t_start > w->o.max_lifetime) {
			set_state(w, ST_DRAINING);
			w->t_drain_deadline = now + w->o.drain_timeout;
			why = "max_lifetime";
			if (sched_pending(w->s) == 0)
				ledger_state(w->ledger, LEDGER_DRAINING, now, err, sizeof err);
		}
		if (w->q_fail_since && now - w->q_fail_since > w->o.queue_outage) {
			wlog(w, "unhealthy", "every call on the queue has failed for %.0f s (%s): "
					      "exiting; the jobs held go back to the queue when their "
					      "leases expire", now - w->q_fail_since, w->q_fail_err);
			why = "queue_lost";
			queue_give_up(w->q); /* (the committer's store in flight too) */
			queue_give_up(w->qc);
			break;
		}
		int held = held_count(w);
		if (w->state != ST_DRAINING && w->o.max_jobs > 0 && w->jobs_taken >= w->o.max_jobs && held == 0) {
			why = "max_jobs";
			break;
		}
		/* draining: what is held, and the HTTP requests already accepted (they have no
		 * queue to go back to; new ones get 503), until the drain's deadline */
		bool may_take = w->o.max_jobs <= 0 || w->jobs_taken < w->o.max_jobs;
		if (w->state == ST_DRAINING &&
		    ((held == 0 && !(w->http && may_take && http_api_waiting(w->http) > 0)) ||
		     now > w->t_drain_deadline))
			break;
		if (w->state != ST_DRAINING) {
			double idle_left = w->o.idle_timeout > 0
						   ? w->o.idle_timeout - (now - w->t_last_activity) : 1.0;
			if (held == 0 && w->o.idle_timeout > 0 && idle_left <= 0 &&
			    !(w->http && http_api_waiting(w->http) > 0)) /* (being parsed) */
				break;
			double wait = held ? 0 : (idle_left < 0.5 ? (idle_left > 0 ? idle_left : 0) : 0.5);
			if (w->http) /* alone it waits on its inbox; with a queue, the queue is polled */
				take_http(w, w->q ? 0 : wait);
			if (w->q)
				take_jobs(w, w->http && wait > 0.05 ? 0.05 : wait);
		} else if (w->http) {
			take_http(w, 0);
		}
		if (w->http)
			http_cancels(w);
		/* jobs the preparers finished (waiting a little for them when nothing else runs) */
		prep_reap(w, sched_pending(w->s) ? 0 : 0.01);
		held = held_count(w);
		if (held && w->state != ST_DRAINING)
			set_state(w, ST_BUSY);
		if (sched_pending(w->s) > 0) {
			if (run_step(w) < 0)
				wlog(w, "engine_error", "the engine failed a step; its jobs failed");
			w->t_last_activity = wk_now();
			account_step_end(w);
			/* the step's pieces of streaming jobs (Redis: one pipeline), before any of
			 * those jobs' results */
			if (w->q && queue_streams(w->q)) {
				int src = queue_flush_streams(w->q, err, sizeof err);
				if (src != WK_OK) /* said once, then every 10 s, as a queue failure */
					queue_note(w, src, "stream (the results hold the whole texts)",
						   err);
			}
			const char *what;
			if (sched_engine_failed(w->s, &what) != WK_OK) {
				/* a failed engine is not trusted again (a sticky device error) */
				wlog(w, "unhealthy", "the engine failed (%s): handing the jobs back "
						      "and exiting", what);
				why = "engine_failed";
				break;
			}
		}
		flush_results(w);
		if (w->have_committer && !commit_reap(w, false) && sched_pending(w->s) == 0 &&
		    held_count(w) > w->n_preparing)
			commit_wait(w, 0.05); /* every held slot waits on the committer */
		housekeeping(w, &t_lease, &t_cancel);
		if (held_count(w) == 0 && w->state == ST_BUSY)
			set_state(w, ST_IDLE);
	}
	return why;
}

/* After the loop: the HTTP requests cancelled, what is held handed back to the queue, the exit
 * line. Returns the exit status: 3 for a failed engine, 4 for a lost queue, else 0. */
static int finish(struct worker *w, const char *why)
{
	if (w->http)
		cancel_http(w);
	hand_back(w, sched_mark(w->s));
	prefix_save(w);
	struct queue_stats qs = {0}, qcs = {0};
	if (w->q)
		queue_get_stats(w->q, &qs);
	if (w->qc) {
		queue_get_stats(w->qc, &qcs);
		qs.syncs += qcs.syncs;
	}
	wlog(w, "exit", "reason %s; %ld jobs taken, %ld completed, %ld failed; lifetime %.1f s; "
			 "%llu syncs; %ld prepared beside the engine's steps", why, w->jobs_taken,
	     w->jobs_done, w->jobs_failed, wk_now() - w->t_start, (unsigned long long)qs.syncs,
	     w->jobs_prepared);
	return sched_engine_failed(w->s, NULL) != WK_OK ? 3 : !strcmp(why, "queue_lost") ? 4 : 0;
}

/* Closes everything start() opened, whatever it reached (the books with why), and joins the
 * committer. */
static void teardown(struct worker *w, const char *why)
{
	http_api_stop(w->http);
	close_books(w, why);
	if (w->n_preparers) {
		pthread_mutex_lock(&w->pmu);
		w->p_stop = true;
		pthread_cond_broadcast(&w->pcv);
		pthread_mutex_unlock(&w->pmu);
		for (int i = 0; i < w->n_preparers; i++)
			pthread_join(w->preparer[i], NULL);
	}
	if (w->have_committer) {
		pthread_mutex_lock(&w->cmu);
		w->c_stop = true;
		pthread_cond_broadcast(&w->ccv);
		pthread_mutex_unlock(&w->cmu);
		pthread_join(w->committer, NULL);
		commit_reap(w, false);
	}
	sched_free(w->s);
	queue_close(w->qc);
	queue_close(w->q);
	eng_close(w->e);
	if (w->step_log)
		fclose(w->step_log);
	free(w->held);
	free(w->out);
	free(w->out_json);
}

int worker_run(const struct worker_opts *o)
{
	struct worker w = {.o = *o};
	name_worker(&w);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	w.t_start = wk_now();
	w.state = ST_STARTING;
	char shown[512];
	wlog(&w, "start", "model %s, queue %s, concurrency %d", w.o.ce.model,
	     w.o.queue_url ? redact_url(w.o.queue_url, shown, sizeof shown) : "none",
	     w.o.concurrency);
	pthread_t wd;
	bool have_wd = pthread_create(&wd, NULL, watchdog, &w) == 0;

	const char *why = "idle";
	int rc = start(&w, &why);
	startup_done = 1;
	if (rc == 0) {
		prefix_load(&w);
		log_ready(&w);
		why = serve(&w);
		rc = finish(&w, why);
	}
	worker_done = 1;
	if (have_wd)
		pthread_join(wd, NULL);
	teardown(&w, why);
	return rc;
}
