/*
 * http_api.c - the HTTP endpoint's server: its thread, connections, routes, and the two
 * queues that join it to the worker thread. The OpenAI shapes are in http_openai.c.
 *
 * Threads. The server thread owns the event_base, the evhttp and every evhttp object. The
 * worker thread only calls the http_api_* functions of http_api.h, which touch the shared
 * state below under h->mu:
 *   inbox     requests checked and waiting for a batch slot (http_api_take pops them; h->cv
 *             wakes a worker waiting in it)
 *   cancels   flights whose client went away while the worker held them
 *   outbox    pieces of text and final results for the server thread, which a byte written
 *             to a pipe wakes (written only when the outbox goes from empty to non-empty)
 *   metrics   counters, histograms, the state clock
 * A call is one completion request; a flight is one of its choices (one job: a request with n
 * or several prompts has several), which the worker runs as it would any other. Both are
 * created and freed by the server thread; the call lives until its last flight is freed.
 * Between http_api_take and http_api_finish the worker holds a flight; its immutable fields
 * (id, kind, stream, t_arrived) are read by both threads, n_seen/t_last only by the worker.
 * The call answers once every choice has its result, or at the first that fails (the others
 * are then cancelled); a stream sends each choice's chunks, with its index, as they come.
 *
 * Parsers. A completion request is made into its job documents (its body parsed, a
 * Responses API request joined to the conversation it goes on from, the documents written
 * and checked), and a token count or /tokenize rendered and encoded: on the server thread,
 * or, for a body of o.parse_min bytes or more, on one of o.parse_threads parser threads, so
 * that an agent's long conversation (13 ms at 150K tokens) does not hold up the other
 * clients' requests and the stream chunks this thread writes. The
 * parsers take their work from a queue and give it back through the outbox's pipe, under
 * h->mu; they read the kept responses (previous_response_id), which h->kept_mu guards.
 *
 * Connections. evhttp has no per-connection hooks for a limit or a whole-request deadline, so
 * the server makes each connection's bufferevent itself (evhttp_set_bevcb) and keeps a
 * reference to it. A sweep every 250 ms finds the connections evhttp has freed (bufferevent_free
 * clears the callbacks), drops its reference (which closes the socket: the bufferevent is
 * BEV_OPT_CLOSE_ON_FREE, so evhttp only shuts down the write side), and times out connections
 * that have not delivered a whole request within --http-timeout of opening or of their last
 * response, by raising a timeout on the bufferevent as libevent itself would. A connection
 * past --max-connections is closed at the next sweep (or answered 503 if its request arrives
 * first).
 */
#include "worker/http_api.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "worker/http_int.h"
#include "worker/job.h"
#include "worker/ledger.h"
#include "worker/plan.h"
#include "worker/prompt.h"
#include "worker/resp_store.h"
#include "worker/sched.h"
#include "worker/split.h"

/* A request body: a queue's job document's limit (JOB_BODY_MAX, 4 MiB), so that a prompt at
 * JOB_PROMPT_MAX (1 MiB of text: a 200K-token context) still fits when a client escapes it,
 * as Python's json.dumps does by default (\uXXXX: 6 bytes for a 3-byte CJK character). */
#define BODY_MAX JOB_BODY_MAX
/* What evhttp itself accepts. libevent 2.1 answers a body over its limit with its own HTML 413
 * (no hook runs between the headers and that check: a request's header_cb cannot be set on a
 * server's requests, and evhttp_set_errorcb is 2.2's), so evhttp's limit is set above ours
 * and the handler answers a body between the two with a JSON 413, the error every OpenAI
 * client parses. Only a body past twice the limit still gets evhttp's page; a connection
 * buffers at most this much. */
#define BODY_HARD_MAX (2 * BODY_MAX)
#define HEADERS_MAX (16u << 10)
#define SWEEP_S 0.25

enum { S_STARTING, S_READY, S_BUSY, S_IDLE, S_DRAINING, S_N };
static const char *const state_names[S_N] = {"STARTING", "READY", "BUSY", "IDLE", "DRAINING"};

/* ---- histograms (Prometheus: cumulative buckets, sum, count) ---- */

#define HIST_MAX 16
struct hist {
	const double *le;
	int n;
	uint64_t bucket[HIST_MAX + 1]; /* [n]: +Inf */
	uint64_t count;
	double sum;
};
static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double tpot_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
				 0.5, 1, 2.5};

static void hist_add(struct hist *h, double v)
{
	int i = 0;
	while (i < h->n && v > h->le[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum += v;
}

/* ---- types ---- */

struct hconn;
struct http_call;

struct http_flight {
	/* immutable once queued */
	char id[48];           /* its job's (oai_choice_id) */
	enum oai_kind kind;
	bool stream;
	bool max_given;        /* the request named max_tokens (OpenAI: its sum with the
				* prompt must fit the context) */
	bool tools;            /* a chat with tools: its stream holds back what may be a call */
	bool thinking;         /* a chat with thinking on: its stream starts with reasoning */
	bool logprobs;         /* logprobs asked for: its stream's chunks carry them */
	bool echo;             /* completions' echo: the prompt first */
	int echo_top, plp_top; /* oai_req's (oai_result's, set from them) */
	double t_arrived;      /* wk_now() */
	double wall_arrived;   /* unix seconds */
	char tenant[129];      /* whose (its API key's) */
	char *body;            /* the job document until http_flight_job moves it */
	size_t len;
	struct job *job;       /* ... decoded by the request's check, until the worker takes it
				* (http_flight_take_job); NULL: none */
	/* the worker thread's */
	int n_seen;
	double t_last;
	/* under h->mu */
	bool in_inbox, in_cancels, worker_done, piece_sent;
	int tix;               /* its tenant's entry in h->loads (-1: none, out of memory) */
	int load;              /* taken: tix, else -1 */
	struct http_flight *inbox_next, *cancel_next;
	/* the server thread's */
	struct http_call *call;     /* the request it is a choice of */
	int index;                  /* ... and which */
	bool echo_sent;             /* echo: the prompt's chunk is sent */
	struct split sp;            /* with tools or thinking: its reasoning and content so far */
	json_t *lp_pending;         /* logprobs: entries that came, for the next chunk sent */
	size_t lp_sent;             /* ... and the entries sent */
	size_t lp_offset;           /* ... and the characters they cover (text_offset) */
	struct http_flight *all_prev, *all_next;
};

/* One completion request (the server thread's). */
struct http_call {
	char id[48];                /* the response's */
	enum oai_kind kind;
	bool stream, include_usage;
	long created;
	struct evhttp_request *req; /* NULL once answered or when the client went away */
	struct hconn *conn;         /* NULL when the connection is gone */
	bool started;               /* the stream's headers are sent */
	int n, per_prompt;          /* choices, and of each prompt */
	int live;                   /* flights not yet freed (and holds while a loop runs) */
	int done;                   /* choices whose result came */
	struct http_flight **fl;    /* [n]: each choice's flight, NULL once freed */
	struct oai_result *res;     /* [n]: the results that came (have[i]) */
	bool *have;
	double t_sent;              /* wk_now() when its stream last sent bytes (or it came) */
	double ka_seen;             /* the sweep that last looked at it (keepalive) */
	const struct oai_api *api;  /* the Responses or Messages API (one choice), or NULL */
	json_t *skel;               /* ... the members of its response that say what was asked */
	struct oai_rstream rs;      /* ... and its stream */
	json_t *conv;               /* a response to keep: its conversation (chat messages, not
				     * the instructions), the answer still to come; else NULL */
	char tenant[129];           /* ... whose it is */
};

struct http_parse;

struct hconn {
	struct http_api *h;
	struct bufferevent *bev;   /* ours (a reference), evhttp's until it frees it */
	double deadline;           /* wk_now(): the whole request must be in by then */
	bool active;               /* a request is with us, not yet answered */
	bool reject;               /* over --max-connections */
	bool killed, closed, closecb_set;
	struct http_call *cur;
	struct http_parse *parse;  /* its request, being parsed beside the server thread */
	/* Watches the socket for the client's close while a request waits for its reply: evhttp
	 * stops reading once a request is whole and resumes only when a reply is being written,
	 * so without this a non-streamed request (or a stream before its first token) would run
	 * to the end for a client long gone. Added only while c->cur is set; NULL until needed. */
	struct event *eof_ev;
	struct hconn *prev, *next;
};

/* A request being parsed (parse_run): a completion made into its job documents, or a token
 * count or /tokenize answered; on the server thread, or beside it (a parser's). */
enum parse_what { P_COMPLETION, P_COUNT, P_TOKENIZE };
struct http_parse {
	struct evhttp_request *req; /* NULL once the client went away (the server thread's) */
	struct hconn *conn;
	enum parse_what what;
	const struct job_model *jm; /* P_COUNT, P_TOKENIZE: the model's tokenizer and format */
	enum oai_kind kind;
	const struct oai_api *api;  /* the Responses or Messages API, or NULL */
	char tenant[129];
	char id[48];
	const char *body;           /* the request's bytes, or (beside) moved out of its buffer */
	size_t len;
	double t_arrived;           /* wk_now() */
	struct timespec wall_arrived;
	bool beside;                /* a parser's: body, and this, are malloc'd */
	/* what it made: status 0 and r, skel and conv (a completion) or the answer (the
	 * others), or the error e to answer */
	int status;
	json_t *answer;
	struct oai_err e;
	struct oai_req r;
	json_t *skel, *conv;
	struct http_parse *next;
};

/* A tenant's choices taken by the worker and not yet finished, and when it was last served. */
struct tenant_load {
	char tenant[129];
	int held;
	uint64_t last; /* h->n_taken at its last take; 0: never */
};

enum msg_type { M_PIECE, M_LOGPROBS, M_PROMPT, M_DONE };
struct msg {
	struct msg *next;
	struct http_flight *f;
	enum msg_type type;
	size_t len;
	char data[];
};

struct http_api {
	struct http_api_opts o;
	char model[256];
	char names[256 + HTTP_ALIASES_MAX * 130]; /* model, then the aliases: oai_model_ok's */
	struct http_key *keys;
	int n_keys;
	double t_start;
	long created;

	/* the server thread's */
	struct event_base *base;
	struct evhttp *http;
	struct event *wake_ev, *sweep_ev;
	int wake[2];
	pthread_t thread;
	bool thread_started;
	struct hconn *conns;
	int n_conns;
	struct http_flight *flights; /* every live flight */
	int n_flights, n_calls;

	/* shared, under mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct http_flight *in_head, *in_tail, *cancels;
	int n_inbox;
	struct tenant_load *loads;   /* each tenant's choices the worker holds (take_fair) */
	int n_loads;
	uint64_t n_taken;
	struct msg *out_head, *out_tail;
	bool signalled, stopping;
	int state;
	double state_since, state_s[S_N];
	uint64_t by_code[600];
	uint64_t prompt_tokens, completion_tokens, cached_tokens;
	uint64_t draft_kept, draft_thrown; /* speculation's draft tokens */
	int64_t cost_micro;
	double gpu_seconds;
	struct hist ttft, tpot;
	/* the model's tokenizer and chat format (http_api_set_model), for /tokenize and
	 * /detokenize; set once (tok NULL until then) */
	struct job_model jm;
	int max_model_len;
	bool model_set;
	struct sched_cache_stats pc; /* http_api_set_cache_stats' */
	/* the parsers, and their queue and what they made (under mu) */
	pthread_t *parsers;
	int n_parsers;
	pthread_cond_t pcv;
	struct http_parse *p_head, *p_tail, *p_done, *p_done_tail;
	bool p_stop;
	int n_parsing;               /* requests queued or being parsed beside */
	uint64_t n_parsed_beside;
	/* the responses kept, under kept_mu (the server thread's and the parsers') */
	pthread_mutex_t kept_mu;
	struct oai_kept *kept;
	struct resp_store *store;    /* and on disk (--responses-dir), NULL: none */
	uint64_t store_errors;
};

/* What the kept responses may hold, at most: the most recently used are kept. */
#define KEPT_ENTRIES 4096
#define STR_(x) #x
#define STR(x) STR_(x)
#define KEPT_BYTES ((size_t)512 << 20)

/* ---- flags ---- */

int http_api_flag(struct http_api_opts *o, int c, const char *arg)
{
	char *end;
	double v;
	switch (c - HTTP_OPT_BASE) {
	case 0: o->listen = arg; return 0;
	case 1:
		if (!job_id_valid(arg)) {
			fprintf(stderr, "wick: --served-name must match [A-Za-z0-9._-]{1,128}\n");
			return 2;
		}
		o->served_name = arg;
		return 0;
	case 2: o->api_key = arg; return 0;
	case 3: o->api_keys_file = arg; return 0;
	case 4:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 1 && v <= 65536)) {
			fprintf(stderr, "wick: --max-connections wants 1 to 65536, not '%s'\n", arg);
			return 2;
		}
		o->max_connections = (int)v;
		return 0;
	case 5:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 0.1 && v <= 3600)) {
			fprintf(stderr, "wick: --http-timeout wants seconds in [0.1, 3600], not '%s'\n",
				arg);
			return 2;
		}
		o->timeout_s = v;
		return 0;
	case 6:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 1 && v <= JOB_MAX_TOKENS_MAX) || v != (int)v) {
			fprintf(stderr, "wick: --max-tokens-limit wants an integer 1 to %d, not '%s'\n",
				JOB_MAX_TOKENS_MAX, arg);
			return 2;
		}
		o->max_tokens_limit = (int)v;
		return 0;
	case 7:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 0 && v <= 3600)) {
			fprintf(stderr, "wick: --sse-keepalive wants seconds in [0, 3600] (0: never), "
				"not '%s'\n", arg);
			return 2;
		}
		o->keepalive_s = v > 0 ? v : -1;
		return 0;
	case 8: o->responses_dir = arg; return 0;
	case 12:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 0 && v <= HTTP_PARSERS_MAX) || v != (int)v) {
			fprintf(stderr, "wick: --http-parse-threads wants an integer 0 to %d, not "
				"'%s'\n", HTTP_PARSERS_MAX, arg);
			return 2;
		}
		o->parse_threads = (int)v;
		o->parse_threads_set = true;
		return 0;
	case 11:
		v = strtod(arg, &end);
		if (end == arg || *end || !(v >= 0 && v <= 10 * 365 * 86400.0)) {
			fprintf(stderr, "wick: --responses-max-age wants seconds in [0, 315360000] (0: "
				"no bound; 2592000 is 30 days), not '%s'\n", arg);
			return 2;
		}
		o->responses_max_age = v;
		return 0;
	case 10:
		if (o->n_model_aliases == HTTP_ALIASES_MAX || !*arg || strlen(arg) > 128 ||
		    strpbrk(arg, " \t\r\n")) {
			fprintf(stderr, "wick: --model-alias wants a pattern of 1 to 128 characters and "
				"no spaces, at most %d of them, not '%s'\n", HTTP_ALIASES_MAX, arg);
			return 2;
		}
		o->model_aliases[o->n_model_aliases++] = arg;
		return 0;
	case 9: {
		char perr[256];
		if (plan_parse_size(arg, &o->responses_max, perr, sizeof perr) != WK_OK) {
			fprintf(stderr, "wick: --responses-max: %s\n", perr);
			return 2;
		}
		return 0;
	}
	}
	fprintf(stderr, "wick: unknown HTTP option\n");
	return 2;
}

/* ---- the shared queues (any thread, under mu) ---- */

static void wake_server_locked(struct http_api *h)
{
	if (h->signalled)
		return;
	h->signalled = true;
	ssize_t w = write(h->wake[1], "x", 1);
	(void)w; /* a full pipe already wakes the server */
}

static void post_locked(struct http_api *h, struct http_flight *f, enum msg_type t,
			const char *data, size_t len)
{
	struct msg *m = malloc(sizeof *m + len + 1);
	if (!m)
		return; /* a lost piece: the final result still carries the whole text */
	*m = (struct msg){.f = f, .type = t, .len = len};
	memcpy(m->data, data, len);
	m->data[len] = 0;
	if (h->out_tail)
		h->out_tail->next = m;
	else
		h->out_head = m;
	h->out_tail = m;
	wake_server_locked(h);
}

static void set_state_locked(struct http_api *h, int st, double now)
{
	h->state_s[h->state] += now - h->state_since;
	h->state_since = now;
	h->state = st;
}

/* ---- the worker side ---- */

/* The state, DRAINING once the stop flag is up (under h->mu) */
static int state_now(const struct http_api *h)
{
	return h->o.stop && atomic_load_explicit(h->o.stop, memory_order_relaxed) ? S_DRAINING
										    : h->state;
}

void http_api_set_state(struct http_api *h, const char *state)
{
	for (int i = 0; i < S_N; i++)
		if (!strcmp(state, state_names[i])) {
			pthread_mutex_lock(&h->mu);
			set_state_locked(h, i, wk_now());
			pthread_mutex_unlock(&h->mu);
			return;
		}
}

void http_api_set_model(struct http_api *h, const struct job_model *m, int max_model_len)
{
	pthread_mutex_lock(&h->mu);
	if (!h->model_set) {
		h->jm = *m;
		h->max_model_len = max_model_len;
		h->model_set = true;
	}
	pthread_mutex_unlock(&h->mu);
}

void http_api_set_cache_stats(struct http_api *h, const struct sched_cache_stats *st)
{
	pthread_mutex_lock(&h->mu);
	h->pc = *st;
	pthread_mutex_unlock(&h->mu);
}

/* Tenant's entry in h->loads, made where missing (a tenant is an API key's: a few); -1 when
 * out of memory (under mu). */
static int load_of(struct http_api *h, const char *tenant)
{
	for (int i = 0; i < h->n_loads; i++)
		if (!strcmp(h->loads[i].tenant, tenant))
			return i;
	struct tenant_load *l = realloc(h->loads, (size_t)(h->n_loads + 1) * sizeof *l);
	if (!l)
		return -1;
	h->loads = l;
	l[h->n_loads] = (struct tenant_load){.held = 0};
	snprintf(l[h->n_loads].tenant, sizeof l->tenant, "%s", tenant);
	return h->n_loads++;
}

/* The next choice to run, out of the inbox: the first to come of the tenant whose choices
 * the worker holds fewest of, and of those the one served longest ago, so that one tenant's
 * burst does not keep another's request waiting for a slot behind all of it (tenants take
 * turns); one tenant: first come, first served. NULL when the inbox is empty (under mu). */
static struct http_flight *take_fair(struct http_api *h)
{
	struct http_flight *best = NULL, *best_prev = NULL;
	int best_held = 0;
	uint64_t best_last = 0;
	for (struct http_flight *f = h->in_head, *prev = NULL; f; prev = f, f = f->inbox_next) {
		int l = f->tix, held = l >= 0 ? h->loads[l].held : 0;
		uint64_t last = l >= 0 ? h->loads[l].last : 0;
		if (!best || held < best_held || (held == best_held && last < best_last)) {
			best = f;
			best_prev = prev;
			best_held = held;
			best_last = last;
		}
		if (best_held == 0 && best_last == 0)
			break; /* (none goes before a tenant's first, never served) */
	}
	if (!best)
		return NULL;
	if (best_prev)
		best_prev->inbox_next = best->inbox_next;
	else
		h->in_head = best->inbox_next;
	if (h->in_tail == best)
		h->in_tail = best_prev;
	best->inbox_next = NULL;
	best->in_inbox = false;
	h->n_inbox--;
	if ((best->load = best->tix) >= 0) {
		h->loads[best->load].held++;
		h->loads[best->load].last = ++h->n_taken;
	}
	return best;
}

int http_api_take(struct http_api *h, struct http_flight **out, int max, double wait_s)
{
	pthread_mutex_lock(&h->mu);
	/* in slices of 10 ms when a signal may end the wait (a handler cannot signal cv) */
	double end = wk_now() + wait_s;
	while (!h->in_head && !h->stopping &&
	       !(h->o.stop && atomic_load_explicit(h->o.stop, memory_order_relaxed))) {
		double left = end - wk_now();
		if (left <= 0)
			break;
		if (h->o.stop && left > 0.01)
			left = 0.01;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		long ns = ts.tv_nsec + (long)((left - (long)left) * 1e9);
		ts.tv_sec += (time_t)left + ns / 1000000000L;
		ts.tv_nsec = ns % 1000000000L;
		pthread_cond_timedwait(&h->cv, &h->mu, &ts);
	}
	int n = 0;
	struct http_flight *f;
	while (n < max && (f = take_fair(h)) != NULL)
		out[n++] = f;
	pthread_mutex_unlock(&h->mu);
	return n;
}

bool http_flight_max_given(const struct http_flight *f)
{
	return f->max_given;
}

bool http_flight_stream(const struct http_flight *f)
{
	return f->stream;
}

int http_api_waiting(struct http_api *h)
{
	pthread_mutex_lock(&h->mu);
	int n = h->n_inbox + h->n_parsing;
	pthread_mutex_unlock(&h->mu);
	return n;
}

struct job *http_flight_take_job(struct http_flight *f)
{
	struct job *j = f->job;
	f->job = NULL;
	return j;
}

void http_flight_job(struct http_flight *f, struct queue_job *j)
{
	memset(j, 0, sizeof *j);
	snprintf(j->id, sizeof j->id, "%s", f->id);
	j->body = f->body;
	j->len = f->len;
	j->attempt = 1;
	j->enqueued_at = f->wall_arrived;
	f->body = NULL;
	f->len = 0;
}

int http_api_cancelled(struct http_api *h, struct http_flight **out, int max)
{
	int n = 0;
	pthread_mutex_lock(&h->mu);
	while (n < max && h->cancels) {
		struct http_flight *f = h->cancels;
		h->cancels = f->cancel_next;
		f->cancel_next = NULL;
		f->in_cancels = false;
		out[n++] = f;
	}
	pthread_mutex_unlock(&h->mu);
	return n;
}

void http_api_token(struct http_api *h, struct http_flight *f, int n_tokens, const char *piece,
		    size_t len)
{
	double now = wk_now();
	pthread_mutex_lock(&h->mu);
	if (n_tokens > f->n_seen) {
		if (f->n_seen == 0)
			hist_add(&h->ttft, now - f->t_arrived);
		else
			hist_add(&h->tpot, (now - f->t_last) / (n_tokens - f->n_seen));
		f->n_seen = n_tokens;
		f->t_last = now;
	}
	/* the first token starts the stream even when its text is held back */
	if (f->stream && (len > 0 || !f->piece_sent)) {
		f->piece_sent = true;
		post_locked(h, f, M_PIECE, piece, len);
	}
	pthread_mutex_unlock(&h->mu);
}

void http_api_logprobs(struct http_api *h, struct http_flight *f, const char *json,
		       size_t len)
{
	if (!f->stream || !f->logprobs)
		return;
	pthread_mutex_lock(&h->mu);
	post_locked(h, f, M_LOGPROBS, json, len);
	pthread_mutex_unlock(&h->mu);
}

void http_api_prompt(struct http_api *h, struct http_flight *f, const char *json, size_t len)
{
	if (!f->stream || !f->echo)
		return;
	pthread_mutex_lock(&h->mu);
	post_locked(h, f, M_PROMPT, json, len);
	pthread_mutex_unlock(&h->mu);
}

void http_api_finish(struct http_api *h, struct http_flight *f, const char *json, size_t len)
{
	pthread_mutex_lock(&h->mu);
	if (f->in_cancels) {
		struct http_flight **pp = &h->cancels;
		while (*pp && *pp != f)
			pp = &(*pp)->cancel_next;
		if (*pp)
			*pp = f->cancel_next;
		f->in_cancels = false;
	}
	f->worker_done = true;
	if (f->load >= 0) {
		h->loads[f->load].held--;
		f->load = -1;
	}
	post_locked(h, f, M_DONE, json, len);
	pthread_mutex_unlock(&h->mu);
}

/* ---- responses (the server thread) ---- */

static void count_code(struct http_api *h, int code)
{
	pthread_mutex_lock(&h->mu);
	if (code >= 100 && code < 600)
		h->by_code[code]++;
	pthread_mutex_unlock(&h->mu);
}

/* The connection is free for its next request, which must arrive within the timeout. */
static void conn_idle(struct hconn *c)
{
	if (!c)
		return;
	c->active = false;
	c->cur = NULL;
	c->deadline = wk_now() + c->h->o.timeout_s;
	if (c->eof_ev)
		event_del(c->eof_ev);
}

/* Tells keep-alive clients how long an idle connection lives, so that they do not send a
 * request on one the server is about to close. */
static void keepalive_header(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	char v[32];
	snprintf(v, sizeof v, "timeout=%d", (int)h->o.timeout_s > 1 ? (int)h->o.timeout_s : 1);
	struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
	if (c && c->reject)
		evhttp_add_header(hd, "Connection", "close");
	else
		evhttp_add_header(hd, "Keep-Alive", v);
	/* A server that asks for API keys may be called from a browser page on any origin (a
	 * playground): the key, not the origin, is the credential, as on OpenAI's API. One
	 * without keys is not opened to other origins' pages: any site the user visits could
	 * otherwise run requests on it and read the answers. */
	if (h->n_keys)
		evhttp_add_header(hd, "Access-Control-Allow-Origin", "*");
}

/* evhttp_send_reply, but a HEAD request gets the body's Content-Length and no body: libevent
 * 2.1 sends the body after a HEAD's headers, which a keep-alive client then reads as the
 * start of its next response. */
static void send_reply(struct evhttp_request *req, int code, const char *reason,
		       struct evbuffer *b)
{
	if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
		char n[32];
		snprintf(n, sizeof n, "%zu", b ? evbuffer_get_length(b) : (size_t)0);
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Length", n);
		if (b)
			evbuffer_drain(b, evbuffer_get_length(b));
	}
	evhttp_send_reply(req, code, reason, b);
}

static void reply_json(struct http_api *h, struct evhttp_request *req, struct hconn *c, int code,
		       json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
	json_decref(j);
	struct evbuffer *b = evbuffer_new();
	if (!s || !b) {
		free(s);
		if (b)
			evbuffer_free(b);
		evhttp_send_error(req, 500, NULL);
		count_code(h, 500);
		conn_idle(c);
		return;
	}
	evbuffer_add(b, s, strlen(s));
	evbuffer_add(b, "\n", 1);
	free(s);
	struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
	evhttp_add_header(hd, "Content-Type", "application/json");
	keepalive_header(h, req, c);
	send_reply(req, code, NULL, b);
	evbuffer_free(b);
	count_code(h, code);
	conn_idle(c);
}

/* Whether req is for Anthropic's Messages API (its errors take that API's shape). */
static bool anthropic_req(struct evhttp_request *req)
{
	const char *u = evhttp_request_get_uri(req);
	return u && !strncmp(u, "/v1/messages", 12) && strchr("/?", u[12]);
}

static void reply_err(struct http_api *h, struct evhttp_request *req, struct hconn *c,
		      const struct oai_err *e)
{
	reply_json(h, req, c, e->status,
		   anthropic_req(req) ? oai_messages_error(e) : oai_error_json(e));
}

static void reply_errf(struct http_api *h, struct evhttp_request *req, struct hconn *c,
		       int status, const char *type, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
static void reply_errf(struct http_api *h, struct evhttp_request *req, struct hconn *c,
		       int status, const char *type, const char *code, const char *fmt, ...)
{
	struct oai_err e = {.status = status, .type = type, .code = code};
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e.message, sizeof e.message, fmt, ap);
	va_end(ap);
	reply_err(h, req, c, &e);
}

/* Sends one SSE event "data: JSON" (or the literal text when j is NULL). */
static void sse_send(struct http_call *k, json_t *j, const char *literal)
{
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
	json_decref(j);
	if (!s && !literal)
		return;
	struct evbuffer *b = evbuffer_new();
	if (b) {
		evbuffer_add_printf(b, "data: %s\n\n", s ? s : literal);
		evhttp_send_reply_chunk(k->req, b);
		k->t_sent = wk_now();
		evbuffer_free(b);
	}
	free(s);
}

/* A response's stream's events (evs, taken): "event: TYPE" and "data: JSON" each. */
static void sse_events(struct http_call *k, json_t *evs)
{
	struct evbuffer *b = evbuffer_new();
	size_t i;
	json_t *ev;
	json_array_foreach(b ? evs : NULL, i, ev) {
		char *s = json_dumps(ev, JSON_COMPACT | JSON_REAL_PRECISION(9));
		if (s)
			evbuffer_add_printf(b, "event: %s\ndata: %s\n\n",
					    json_string_value(json_object_get(ev, "type")), s);
		free(s);
	}
	if (b && evbuffer_get_length(b)) {
		evhttp_send_reply_chunk(k->req, b);
		k->t_sent = wk_now();
	}
	if (b)
		evbuffer_free(b);
	json_decref(evs);
}

static void sse_start(struct http_api *h, struct http_call *k);

/* Streams that have sent nothing for --sse-keepalive seconds (queued behind others, or in a
 * long prefill): started, then an SSE comment (Anthropic's ping event on its API) every so
 * often, so that a proxy's idle timeout (100 s at some) does not cut them. A stream so
 * started reports a later failure as its last event, not as an HTTP status. */
static void keepalive(struct http_api *h, double now)
{
	if (h->o.keepalive_s <= 0)
		return;
	for (struct http_flight *f = h->flights; f; f = f->all_next) {
		struct http_call *k = f->call;
		if (!k || k->ka_seen == now || !k->stream || !k->req ||
		    now - k->t_sent < h->o.keepalive_s)
			continue;
		k->ka_seen = now;
		if (!k->started)
			sse_start(h, k);
		struct evbuffer *b = evbuffer_new();
		if (!b)
			continue;
		evbuffer_add_printf(b, "%s", k->api == &oai_messages_api
				    ? "event: ping\ndata: {\"type\":\"ping\"}\n\n" : ": keepalive\n\n");
		evhttp_send_reply_chunk(k->req, b);
		evbuffer_free(b);
		k->t_sent = now;
	}
}

/* A choice's chunk, with its index. */
static void send_choice(struct http_flight *f, json_t *chunk)
{
	if (chunk)
		oai_chunk_index(chunk, f->index);
	sse_send(f->call, chunk, NULL);
}

static void sse_start(struct http_api *h, struct http_call *k)
{
	struct evkeyvalq *hd = evhttp_request_get_output_headers(k->req);
	evhttp_add_header(hd, "Content-Type", "text/event-stream");
	evhttp_add_header(hd, "Cache-Control", "no-cache");
	keepalive_header(h, k->req, k->conn);
	evhttp_send_reply_start(k->req, 200, NULL);
	k->started = true;
	if (k->conn && k->conn->eof_ev)
		event_del(k->conn->eof_ev); /* evhttp reads for the close itself while it writes */
	count_code(h, 200);
	if (k->api) {
		sse_events(k, k->api->start(&k->rs));
		return;
	}
	for (int i = 0; k->kind == OAI_CHAT && i < k->n; i++) { /* each choice's role */
		json_t *c = oai_chunk(k->kind, k->id, k->created, h->model, "", 0, true, NULL);
		if (c)
			oai_chunk_index(c, i);
		sse_send(k, c, NULL);
	}
}

static void call_free(struct http_api *h, struct http_call *k)
{
	if (k->conn && k->conn->cur == k)
		k->conn->cur = NULL;
	for (int i = 0; i < k->n; i++)
		if (k->have[i])
			oai_result_free(&k->res[i]);
	free(k->fl);
	free(k->res);
	free(k->have);
	if (k->api) {
		json_decref(k->skel);
		json_decref(k->conv);
		oai_rstream_free(&k->rs);
	}
	h->n_calls--;
	free(k);
}

static void call_unref(struct http_api *h, struct http_call *k)
{
	if (--k->live == 0)
		call_free(h, k);
}

static void flight_free(struct http_api *h, struct http_flight *f)
{
	if (f->all_prev)
		f->all_prev->all_next = f->all_next;
	else
		h->flights = f->all_next;
	if (f->all_next)
		f->all_next->all_prev = f->all_prev;
	h->n_flights--;
	free(f->body);
	job_free(f->job);
	free(f->job);
	split_free(&f->sp);
	json_decref(f->lp_pending);
	struct http_call *k = f->call;
	int index = f->index;
	free(f);
	if (k) {
		k->fl[index] = NULL;
		call_unref(h, k);
	}
}

/* A chunk of text with the logprobs that came since the last one (none: null). */
static json_t *with_lp(struct http_flight *f, json_t *chunk)
{
	if (chunk && json_array_size(f->lp_pending)) {
		json_t *lp = oai_logprobs(f->kind, f->lp_pending, &f->lp_offset);
		oai_chunk_logprobs(chunk, lp);
		json_decref(lp);
		f->lp_sent += json_array_size(f->lp_pending);
		json_array_clear(f->lp_pending);
	}
	return chunk;
}

static void on_logprobs(struct http_flight *f, const char *json, size_t len)
{
	json_t *a = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
	if (!f->lp_pending)
		f->lp_pending = json_array();
	if (json_is_array(a) && f->lp_pending)
		json_array_extend(f->lp_pending, a);
	json_decref(a);
}

/* Takes f back: out of the inbox (true: the caller frees it), or onto the cancels for the
 * worker, unless the worker is done with it. */
static bool flight_cancel(struct http_api *h, struct http_flight *f)
{
	bool unqueued = false;
	pthread_mutex_lock(&h->mu);
	if (f->in_inbox) {
		struct http_flight **pp = &h->in_head, *prev = NULL;
		while (*pp && *pp != f) {
			prev = *pp;
			pp = &(*pp)->inbox_next;
		}
		if (*pp) {
			*pp = f->inbox_next;
			if (h->in_tail == f)
				h->in_tail = prev;
		}
		f->in_inbox = false;
		h->n_inbox--;
		unqueued = true;
	} else if (!f->worker_done && !f->in_cancels) {
		f->in_cancels = true;
		f->cancel_next = h->cancels;
		h->cancels = f;
	}
	pthread_mutex_unlock(&h->mu);
	return unqueued;
}

/* Every choice of k still to run is taken back (k may be freed by the time this returns). */
static void call_cancel(struct http_api *h, struct http_call *k)
{
	k->live++; /* held: freeing its last flight would free k inside the loop */
	for (int i = 0; i < k->n; i++)
		if (k->fl[i] && flight_cancel(h, k->fl[i]))
			flight_free(h, k->fl[i]);
	call_unref(h, k);
}

/* The client went away (its connection closed) while k was pending. */
static void client_gone(struct http_api *h, struct http_call *k)
{
	pthread_mutex_lock(&h->mu);
	h->by_code[499]++;
	pthread_mutex_unlock(&h->mu);
	call_cancel(h, k);
}

/* A response's text (reasoning or the answer's), with the answer's logprobs that came; a
 * reasoning's entries wait for the answer's next text (the message holds every token's). */
static void resp_text(struct http_flight *f, bool reasoning, const char *text, size_t n)
{
	struct http_call *k = f->call;
	json_t *lp = !reasoning && json_array_size(f->lp_pending) ? f->lp_pending : NULL;
	sse_events(k, k->api->text(&k->rs, reasoning, text, n, lp));
	if (lp) {
		f->lp_sent += json_array_size(lp);
		json_array_clear(lp);
	}
}

/* split_piece's emit for a stream: a reasoning or content chunk (with the logprobs that came). */
struct emit_ctx {
	struct http_api *h;
	struct http_flight *f;
};

static void emit_chunk(void *ctx, bool reasoning, const char *text, size_t n)
{
	struct emit_ctx *e = ctx;
	struct http_flight *f = e->f;
	struct http_call *k = f->call;
	if (k->api) {
		resp_text(f, reasoning, text, n);
		return;
	}
	send_choice(f, with_lp(f, reasoning ? oai_reasoning_chunk(k->id, k->created, e->h->model,
								  text, n)
					    : oai_chunk(f->kind, k->id, k->created, e->h->model,
							text, n, false, NULL)));
}

/* echo: the prompt's chunk, first (entries: output.prompt_logprobs') */
static void send_echo(struct http_api *h, struct http_flight *f, const json_t *entries)
{
	struct http_call *k = f->call;
	if (!k->started)
		sse_start(h, k);
	send_choice(f, oai_echo_chunk(k->id, k->created, h->model, entries, f->logprobs,
				      &f->lp_offset));
	f->echo_sent = true;
}

static void on_prompt(struct http_api *h, struct http_flight *f, const char *json, size_t len)
{
	if (!f->call->req || !f->stream || f->echo_sent)
		return;
	json_t *a = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
	if (json_is_array(a))
		send_echo(h, f, a);
	json_decref(a);
}

static void on_piece(struct http_api *h, struct http_flight *f, const char *text, size_t len)
{
	struct http_call *k = f->call;
	if (!k->req || !f->stream)
		return;
	if (!k->started)
		sse_start(h, k);
	if (f->tools || f->thinking)
		split_piece(&f->sp, text, len, emit_chunk, &(struct emit_ctx){h, f});
	else if (len && k->api)
		resp_text(f, false, text, len);
	else if (len)
		send_choice(f, with_lp(f, oai_chunk(f->kind, k->id, k->created, h->model, text, len,
						    false, NULL)));
}

/* A streamed choice's end: its echo where no token came (max_tokens 0), the logprobs not
 * sent yet, what a split held back and the tool calls, and its finish_reason. */
static void stream_choice_end(struct http_api *h, struct http_flight *f,
			      const struct oai_result *r)
{
	struct http_call *k = f->call;
	if (f->echo && !f->echo_sent && r->prompt_logprobs)
		send_echo(h, f, r->prompt_logprobs);
	if (r->logprobs) { /* the rest: those not sent yet */
		json_decref(f->lp_pending);
		f->lp_pending = json_array();
		for (size_t i = f->lp_sent; i < json_array_size(r->logprobs); i++)
			json_array_append(f->lp_pending, json_array_get(r->logprobs, i));
	}
	if (k->api) { /* what was held, the logprobs not sent, the items done */
		if (r->reasoning && r->reasoning_len > f->sp.rsent)
			resp_text(f, true, r->reasoning + f->sp.rsent, r->reasoning_len - f->sp.rsent);
		size_t sent = f->tools || f->thinking ? f->sp.sent : r->text_len;
		resp_text(f, false, r->text + sent, r->text_len - sent);
		sse_events(k, k->api->end(&k->rs, r));
		return;
	}
	if (f->tools || f->thinking) { /* what was held, then the calls */
		if (r->reasoning && r->reasoning_len > f->sp.rsent)
			send_choice(f, with_lp(f, oai_reasoning_chunk(k->id, k->created, h->model,
								      r->reasoning + f->sp.rsent,
								      r->reasoning_len -
									      f->sp.rsent)));
		if (r->text_len > f->sp.sent)
			send_choice(f, with_lp(f, oai_chunk(f->kind, k->id, k->created, h->model,
							    r->text + f->sp.sent,
							    r->text_len - f->sp.sent, false, NULL)));
		if (r->tool_calls)
			send_choice(f, oai_calls_chunk(k->id, k->created, h->model, r));
	}
	send_choice(f, with_lp(f, oai_chunk(f->kind, k->id, k->created, h->model, "", 0, false,
					    r->finish_reason ? r->finish_reason : "stop")));
}

/* The server's own event: to the worker's log (http_api_opts.log), else stderr. */
static void server_log(struct http_api *h, const char *event, const char *msg)
{
	if (h->o.log)
		h->o.log(h->o.log_ctx, event, msg);
	else
		fprintf(stderr, "wick: %s: %s\n", event, msg);
}

/* The writer of --responses-dir's failed writes (from its thread). */
static void store_log(void *ctx, const char *msg)
{
	server_log(ctx, "responses_dir", msg);
}

/* Where responses are kept, for the errors that name one not kept. */
static const char *kept_where(const struct http_api *h)
{
	return h->store ? "in this server's memory (the last " STR(KEPT_ENTRIES) " at most) and in "
			  "--responses-dir (within --responses-max)"
			: "in this server's memory, the last " STR(KEPT_ENTRIES) " at most, and not "
			  "across restarts: see --responses-dir";
}

/* Response id of tenant, kept in memory or (--responses-dir) on disk, read back into memory:
 * its conversation and object as oai_kept_get's (good while kept_mu is held). */
static bool kept_get(struct http_api *h, const char *id, const char *tenant,
		     const json_t **conv, const json_t **obj)
{
	if (oai_kept_get(h->kept, id, tenant, conv, obj))
		return true;
	json_t *c, *o;
	char err[WK_ERRSZ];
	int rc = h->store ? resp_store_get(h->store, id, tenant, &c, &o, err, sizeof err)
			  : WK_ENOTFOUND;
	if (rc != WK_OK) {
		if (rc != WK_ENOTFOUND) {
			h->store_errors++;
			server_log(h, "responses_dir", err);
		}
		return false;
	}
	rc = oai_kept_put(h->kept, id, tenant, c, o);
	json_decref(c);
	json_decref(o);
	return rc == WK_OK && oai_kept_get(h->kept, id, tenant, conv, obj);
}

/* kept_get's conversation and object, each a reference of the caller's (either may be NULL). */
static bool kept_take(struct http_api *h, const char *id, const char *tenant, json_t **conv,
		      json_t **obj)
{
	const json_t *c, *o;
	pthread_mutex_lock(&h->kept_mu);
	bool found = kept_get(h, id, tenant, &c, &o);
	if (conv)
		*conv = found ? json_incref((json_t *)c) : NULL;
	if (obj)
		*obj = found ? json_incref((json_t *)o) : NULL;
	pthread_mutex_unlock(&h->kept_mu);
	return found;
}

/* A kept response's object holds, under ANSWERS_KEY (never shown), the answers its
 * conversation holds before its own, each named by its response: [[i, id], ...], message i
 * the answer of response id. So its input items name each answer as that response's output
 * did, from this one response read (in memory, or one file of --responses-dir), however long
 * the chain before it. Files written without it give the answers hashed ids. */
#define ANSWERS_KEY "_wick_answers"

/* obj's answers (ANSWERS_KEY): its previous response's, and that one's own answer (the last
 * message of its conversation); none where it has no previous one kept. Under kept_mu. */
static json_t *answers_through(struct http_api *h, const char *tenant, const json_t *obj)
{
	const char *prev = json_string_value(json_object_get(obj, "previous_response_id"));
	const json_t *c, *o;
	if (!prev || !kept_get(h, prev, tenant, &c, &o) || !json_array_size(c))
		return json_array();
	const json_t *before = json_object_get(o, ANSWERS_KEY);
	json_t *a = json_is_array(before) ? json_copy((json_t *)before) : json_array();
	if (a && json_array_append_new(a, json_pack("[I, s]", (json_int_t)json_array_size(c) - 1,
						    prev))) {
		json_decref(a);
		return NULL;
	}
	return a;
}

/* A response kept (store): its conversation, with the answer, and its object; in memory, and
 * with --responses-dir as a file (one that cannot be written is logged, and kept in memory). */
static void keep_response(struct http_api *h, struct http_call *k)
{
	json_t *conv = json_copy(k->conv); /* (the messages are shared, not copied) */
	json_t *answer = oai_result_message(&k->res[0]);
	json_t *obj = k->api->object(k->skel, k->id, k->created, h->model, &k->res[0]);
	char err[WK_ERRSZ];
	if (conv && answer && obj && !json_array_append(conv, answer)) {
		pthread_mutex_lock(&h->kept_mu);
		json_object_set_new(obj, ANSWERS_KEY, answers_through(h, k->tenant, obj));
		oai_kept_put(h->kept, k->id, k->tenant, conv, obj); /* (out of memory: not kept) */
		if (h->store &&
		    resp_store_put(h->store, k->id, k->tenant, conv, obj, err, sizeof err) != WK_OK) {
			h->store_errors++;
			server_log(h, "responses_dir", err);
		}
		pthread_mutex_unlock(&h->kept_mu);
	}
	json_decref(conv);
	json_decref(answer);
	json_decref(obj);
}

/* Every choice came: the response, or the stream's usage and end. */
static void call_end(struct http_api *h, struct http_call *k)
{
	if (k->conv)
		keep_response(h, k);
	if (k->stream && k->api) { /* (its last event was its choice's end) */
		evhttp_send_reply_end(k->req);
		conn_idle(k->conn);
	} else if (k->api) {
		reply_json(h, k->req, k->conn, 200, k->api->object(k->skel, k->id, k->created,
								    h->model, &k->res[0]));
	} else if (k->stream) {
		struct oai_result sum;
		if (k->include_usage && oai_usage_sum(k->res, k->n, k->per_prompt, &sum) == WK_OK) {
			sse_send(k, oai_usage_chunk(k->kind, k->id, k->created, h->model,
						    k->n == 1 ? &k->res[0] : &sum), NULL);
			oai_result_free(&sum);
		}
		sse_send(k, NULL, "[DONE]");
		evhttp_send_reply_end(k->req);
		conn_idle(k->conn);
	} else {
		reply_json(h, k->req, k->conn, 200, oai_response_n(k->kind, k->id, k->created,
								   h->model, k->res, k->n,
								   k->per_prompt));
	}
	k->req = NULL;
	k->conn = NULL; /* the connection is its next request's (and may be freed before k) */
}

/* A started stream's end with an error: its last event (a response's response.failed). */
static void stream_fail(struct http_call *k, const struct oai_err *e)
{
	if (k->api) {
		sse_events(k, k->api->fail(&k->rs, e));
	} else {
		sse_send(k, oai_error_json(e), NULL);
		sse_send(k, NULL, "[DONE]");
	}
	evhttp_send_reply_end(k->req);
}

/* A choice failed: the request's answer is its error (a stream's last event), and the other
 * choices are cancelled. */
static void call_fail(struct http_api *h, struct http_call *k, const struct oai_err *e)
{
	if (k->stream && k->started) {
		stream_fail(k, e);
		conn_idle(k->conn);
	} else {
		reply_err(h, k->req, k->conn, e);
	}
	k->req = NULL;
	k->conn = NULL; /* (as in call_end: its other choices may outlive the connection) */
	call_cancel(h, k);
}

static void on_done(struct http_api *h, struct http_flight *f, const char *json, size_t len)
{
	struct oai_result r;
	bool parsed = oai_result_parse(json, len, &r) == WK_OK;
	if (parsed) {
		pthread_mutex_lock(&h->mu);
		h->prompt_tokens += (uint64_t)r.prompt_tokens;
		h->completion_tokens += (uint64_t)r.completion_tokens;
		h->cached_tokens += (uint64_t)r.cached_tokens;
		h->draft_kept += (uint64_t)r.accepted_prediction_tokens;
		h->draft_thrown += (uint64_t)r.rejected_prediction_tokens;
		h->gpu_seconds += r.gpu_seconds;
		h->cost_micro += r.cost_micro_usd;
		pthread_mutex_unlock(&h->mu);
	}
	struct http_call *k = f->call;
	if (k->req) {
		struct oai_err e;
		if (!parsed)
			oai_errf(&e, 500, "server_error", "internal", NULL, "the result was unreadable");
		else if (!r.completed)
			oai_result_error(&r, &e);
		if (!parsed || !r.completed) {
			call_fail(h, k, &e); /* (f holds k) */
		} else {
			if (f->stream) {
				if (!k->started)
					sse_start(h, k);
				stream_choice_end(h, f, &r);
			}
			r.echo = f->echo;
			r.echo_top = f->echo_top;
			r.plp = f->plp_top >= 0;
			r.plp_top = f->plp_top;
			k->res[f->index] = r; /* the call's now */
			k->have[f->index] = true;
			parsed = false;
			if (++k->done == k->n)
				call_end(h, k);
		}
	}
	if (parsed)
		oai_result_free(&r);
	flight_free(h, f);
}

/* Drains the outbox (the pipe woke us). */
static void parse_end(struct http_api *h, struct http_parse *p);
static void parse_reap(struct http_api *h);

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct http_api *h = arg;
	char buf[256];
	while (read(fd, buf, sizeof buf) > 0)
		;
	pthread_mutex_lock(&h->mu);
	struct msg *m = h->out_head;
	h->out_head = h->out_tail = NULL;
	h->signalled = false;
	bool stopping = h->stopping;
	pthread_mutex_unlock(&h->mu);
	parse_reap(h);
	while (m) {
		struct msg *next = m->next;
		if (m->type == M_PIECE)
			on_piece(h, m->f, m->data, m->len);
		else if (m->type == M_LOGPROBS)
			on_logprobs(m->f, m->data, m->len);
		else if (m->type == M_PROMPT)
			on_prompt(h, m->f, m->data, m->len);
		else
			on_done(h, m->f, m->data, m->len);
		free(m);
		m = next;
	}
	if (!stopping)
		return;
	/* The worker is done: whatever is left will not run; a request still being parsed is
	 * answered when its parser gives it back (parse_end), or dropped at the loop's end. */
	pthread_mutex_lock(&h->mu);
	struct http_parse *queued = h->p_head;
	h->p_head = h->p_tail = NULL;
	h->p_stop = true;
	pthread_cond_broadcast(&h->pcv);
	for (struct http_parse *q = queued; q; q = q->next)
		h->n_parsing--;
	pthread_mutex_unlock(&h->mu);
	while (queued) {
		struct http_parse *next = queued->next;
		parse_end(h, queued);
		queued = next;
	}
	while (h->flights) {
		struct http_flight *f = h->flights;
		struct http_call *k = f->call;
		if (k->req) {
			if (k->started) {
				struct oai_err e;
				oai_errf(&e, 503, "server_error", "unavailable", NULL,
					 "the server is shutting down");
				stream_fail(k, &e);
			} else {
				reply_errf(h, k->req, k->conn, 503, "server_error", "unavailable",
					   "the server is shutting down");
			}
			k->req = NULL;
			k->conn = NULL;
		}
		pthread_mutex_lock(&h->mu);
		if (f->in_inbox) {
			f->in_inbox = false; /* the inbox is abandoned as a whole below */
			h->n_inbox--;
		}
		pthread_mutex_unlock(&h->mu);
		flight_free(h, f);
	}
	pthread_mutex_lock(&h->mu);
	h->in_head = h->in_tail = NULL;
	h->cancels = NULL;
	pthread_mutex_unlock(&h->mu);
	struct timeval tv = {0, 300000}; /* let the last responses go out */
	event_base_loopexit(h->base, &tv);
}

/* ---- connections ---- */

static void sweep(evutil_socket_t fd, short what, void *arg);

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	struct http_api *h = arg;
	if (h->n_conns >= h->o.max_connections)
		sweep(-1, 0, h); /* count only the connections still open */
	struct hconn *c = calloc(1, sizeof *c);
	struct bufferevent *bev = c ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;
	if (!bev) {
		free(c);
		return NULL; /* evhttp makes its own; this connection goes untracked */
	}
	bufferevent_incref(bev);
	c->h = h;
	c->bev = bev;
	c->reject = h->n_conns >= h->o.max_connections;
	c->deadline = c->reject ? 0 : wk_now() + h->o.timeout_s;
	c->next = h->conns;
	if (h->conns)
		h->conns->prev = c;
	h->conns = c;
	h->n_conns++;
	return bev;
}

static struct hconn *conn_of(struct http_api *h, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
	for (struct hconn *c = h->conns; c && bev; c = c->next)
		if (c->bev == bev && !c->closed)
			return c;
	return NULL;
}

/* A request whose client went away mid-request: evhttp has detached it, and then it is ours
 * to free. */
static void req_gone(struct evhttp_request *req)
{
	if (req && !evhttp_request_get_connection(req))
		evhttp_request_free(req);
}

/* evhttp is freeing the connection (client gone, timeout, error, or shutdown). */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
	(void)evcon;
	struct hconn *c = arg;
	c->closed = true;
	if (c->eof_ev)
		event_del(c->eof_ev); /* the socket stays open (our reference) until the sweep */
	struct http_parse *p = c->parse;
	c->parse = NULL;
	if (p) { /* its parser goes on; parse_end finds no one to answer */
		p->conn = NULL;
		req_gone(p->req);
		p->req = NULL;
	}
	struct http_call *k = c->cur;
	c->cur = NULL;
	if (!k)
		return;
	k->conn = NULL;
	req_gone(k->req);
	k->req = NULL;
	client_gone(c->h, k);
}

/* The socket of a connection whose request waits for its reply became readable: a close
 * (or an error) is reported to evhttp as its own read would have, which frees the
 * connection and so runs on_conn_close, the path a stream's disconnect takes. Bytes are a
 * pipelined request, which evhttp reads after this reply; the watch ends there, as a client
 * that pipelines is not one that has gone. */
static void on_peer_readable(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct hconn *c = arg;
	char b;
	ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	event_del(c->eof_ev);
	if (n > 0)
		return;
	bufferevent_trigger_event(c->bev, BEV_EVENT_READING |
				  (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), 0);
}

/* Watches c's socket for the client's close until the reply starts (conn_idle, sse_start
 * and on_conn_close end the watch). Without the watch a request still runs and is answered
 * as before, so a failure here costs only the early cancel. */
static void watch_close(struct http_api *h, struct hconn *c)
{
	if (!c->eof_ev) {
		evutil_socket_t fd = bufferevent_getfd(c->bev);
		if (fd < 0 || !(c->eof_ev = event_new(h->base, fd, EV_READ | EV_PERSIST,
						     on_peer_readable, c)))
			return;
	}
	event_add(c->eof_ev, NULL);
}

static void sweep(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct http_api *h = arg;
	double now = wk_now();
	for (struct hconn *c = h->conns, *next; c; c = next) {
		next = c->next;
		bufferevent_event_cb eventcb = NULL;
		bufferevent_getcb(c->bev, NULL, NULL, &eventcb, NULL);
		if (!eventcb) { /* evhttp freed it: drop our reference, which closes the socket */
			if (c->parse) { /* (as for k) */
				c->parse->conn = NULL;
				c->parse->req = NULL;
				c->parse = NULL;
			}
			struct http_call *k = c->cur;
			if (k) { /* not expected: on_conn_close runs first and takes it */
				k->conn = NULL;
				k->req = NULL; /* freed with the connection, or leaked: never reused */
				c->cur = NULL;
				client_gone(h, k);
			}
			if (c->prev)
				c->prev->next = c->next;
			else
				h->conns = c->next;
			if (c->next)
				c->next->prev = c->prev;
			h->n_conns--;
			if (c->eof_ev)
				event_free(c->eof_ev);
			bufferevent_decref(c->bev);
			free(c);
			continue;
		}
		if (!c->active && !c->killed && now >= c->deadline) {
			c->killed = true;
			bufferevent_trigger_event(c->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, 0);
		}
	}
	if (fd != -1 || what) /* (the timer's sweep, not make_bev's count) */
		keepalive(h, now);
}

/* ---- routes ---- */

/* The tenant of the request's key, or NULL after answering 401. */
static const char *authenticate(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	if (h->n_keys == 0)
		return "default";
	struct evkeyvalq *hd = evhttp_request_get_input_headers(req);
	const char *a = evhttp_find_header(hd, "Authorization");
	const char *x = evhttp_find_header(hd, "x-api-key"); /* (Anthropic's clients') */
	if (!a && !x) {
		reply_errf(h, req, c, 401, "invalid_request_error", "invalid_api_key",
			   "no API key: send \"Authorization: Bearer KEY\" (or \"x-api-key: KEY\")");
		return NULL;
	}
	while (a && *a == ' ')
		a++;
	if (a && strncasecmp(a, "Bearer ", 7)) {
		reply_errf(h, req, c, 401, "invalid_request_error", "invalid_api_key",
			   "the Authorization header must be \"Bearer KEY\"");
		return NULL;
	}
	a = a ? a + 7 : x;
	while (*a == ' ')
		a++;
	size_t len = strlen(a);
	while (len && (a[len - 1] == ' ' || a[len - 1] == '\t'))
		len--;
	const char *tenant = http_keys_find(h->keys, h->n_keys, a, len);
	if (!tenant)
		reply_errf(h, req, c, 401, "invalid_request_error", "invalid_api_key",
			   "incorrect API key provided");
	return tenant;
}

/* The model's card: OpenAI's members, and once the model is loaded vLLM's max_model_len (the
 * context a prompt and its completion share), which clients read to fit their prompts. */
/* The model, in OpenAI's shape and Anthropic's at once (type, display_name, created_at), so
 * that either's client lists it. */
static void model_json_add(struct http_api *h, json_t *arr)
{
	char when[32];
	struct tm tm;
	time_t t = (time_t)h->created;
	gmtime_r(&t, &tm);
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
	json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s}", "id", h->model, "object",
			      "model", "created", (json_int_t)h->created, "owned_by", "wick",
			      "type", "model", "display_name", h->model, "created_at", when);
	pthread_mutex_lock(&h->mu);
	int ctx = h->model_set ? h->max_model_len : 0;
	pthread_mutex_unlock(&h->mu);
	if (m && ctx > 0)
		json_object_set_new(m, "max_model_len", json_integer(ctx));
	json_array_append_new(arr, m);
}

static void route_models(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			 const char *path)
{
	if (!strcmp(path, "/v1/models")) {
		json_t *arr = json_array();
		if (arr)
			model_json_add(h, arr);
		reply_json(h, req, c, 200, json_pack("{s:s, s:o, s:b, s:s, s:s}", "object", "list",
						     "data", arr, "has_more", 0, "first_id", h->model,
						     "last_id", h->model));
		return;
	}
	const char *id = path + strlen("/v1/models/");
	if (!oai_model_ok(h->names, id)) {
		reply_errf(h, req, c, 404, "invalid_request_error", "model_not_found",
			   "The model '%.200s' does not exist; this server serves '%s'", id, h->model);
		return;
	}
	json_t *arr = json_array();
	if (arr)
		model_json_add(h, arr);
	reply_json(h, req, c, 200, json_incref(json_array_get(arr, 0)));
	json_decref(arr);
}

/* The model, once http_api_set_model has given it (else a 503 answered). */
static const struct job_model *model_of(struct http_api *h, struct evhttp_request *req,
					struct hconn *c)
{
	pthread_mutex_lock(&h->mu);
	bool set = h->model_set;
	pthread_mutex_unlock(&h->mu);
	if (!set) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
		reply_errf(h, req, c, 503, "server_error", "unavailable",
			   "the model is still loading");
		return NULL;
	}
	if (!h->jm.tok) {
		reply_errf(h, req, c, 400, "invalid_request_error", "no_tokenizer",
			   "the model has no tokenizer.json");
		return NULL;
	}
	return &h->jm;
}

/* The request's JSON object body, or NULL with the error answered. */
static json_t *body_object(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t len = evbuffer_get_length(in);
	const char *body = len ? (const char *)evbuffer_pullup(in, -1) : NULL;
	json_error_t je;
	json_t *j = body ? json_loadb(body, len, 0, &je) : NULL;
	if (!json_is_object(j)) {
		json_decref(j);
		reply_errf(h, req, c, 400, "invalid_request_error", "invalid_json", "%s",
			   !len ? "the request has no body"
				: body ? "the body is not a JSON object" : "out of memory");
		return NULL;
	}
	return j;
}

/* The prompt of a chat request (an object), its own job's, rendered as the worker renders it
 * (gen: with the assistant's header); 0, or the HTTP status of the error in *e. */
static int chat_prompt(struct http_api *h, const struct job_model *jm, const json_t *chat,
		       bool gen, const char *tenant, int **ids, int *n, struct oai_err *e)
{
	struct oai_req r = {0};
	int st = oai_json_to_job(OAI_CHAT, chat, h->names, "tokenize", tenant, 1, &r, e);
	if (st)
		return st;
	struct job j = {0};
	char err[WK_ERRSZ];
	int rc = r.decoded[0] ? job_prompt(jm, r.decoded[0], gen, ids, n, err, sizeof err)
		 : job_decode(r.jobs[0], r.job_lens[0], NULL, &j, err, sizeof err) == JOB_OK
			 ? job_prompt(jm, &j, gen, ids, n, err, sizeof err)
			 : WK_EINVAL;
	job_free(&j);
	oai_req_free(&r);
	if (rc != WK_OK)
		return oai_errf(e, rc == WK_ENOMEM ? 500 : 400, rc == WK_ENOMEM ? "server_error"
				: "invalid_request_error", rc == WK_ENOMEM ? "internal"
				: "invalid_input", NULL, "%s", err);
	return 0;
}

static int respond_from(struct http_api *h, const char *tenant, json_t *chat, const json_t *skel,
			json_t **conv, struct oai_err *e);

/* Anthropic's POST /v1/messages/count_tokens and OpenAI's POST /v1/responses/input_tokens
 * (p->api): a request's prompt tokens, as the request bills them (a response's with the
 * conversation of its previous_response_id): {"input_tokens"} into p->answer. Any thread. */
static void count_run(struct http_api *h, struct http_parse *p)
{
	const struct oai_api *api = p->api;
	json_t *chat = NULL, *skel = NULL, *conv = NULL;
	struct oai_err *e = &p->e;
	int st = api == &oai_messages_api ? oai_messages_count_chat(p->body, p->len, &chat, e)
					  : api->to_chat(p->body, p->len, &chat, &skel, e);
	if (!st && api == &oai_responses_api)
		st = respond_from(h, p->tenant, chat, skel, &conv, e);
	int *ids = NULL, n = 0;
	if (!st && chat) { /* (counting runs nothing) */
		json_object_del(chat, "max_tokens");
		json_object_del(chat, "max_completion_tokens");
		json_object_del(chat, "stream");
	}
	if (!st && (st = chat_prompt(h, p->jm, chat, true, p->tenant, &ids, &n, e)))
		api->err(e);
	json_decref(chat);
	json_decref(skel);
	json_decref(conv);
	free(ids);
	if (!st)
		p->answer = api == &oai_messages_api
				    ? json_pack("{s:i}", "input_tokens", n)
				    : json_pack("{s:s, s:i}", "object", "response.input_tokens",
						"input_tokens", n);
	p->status = st;
}

/* vLLM's /tokenize: {"prompt": TEXT} (add_special_tokens, default true: the BOS a Llama
 * tokenizer adds) or a chat's {"messages": [...]} (tools, chat_template_kwargs;
 * add_generation_prompt, default true), the tokens a completion request with them runs:
 * {"count", "max_model_len", "tokens", "token_strs" (with return_token_strs, else null)}
 * into p->answer. Any thread. */
static void tokenize_run(struct http_api *h, struct http_parse *p)
{
	const struct job_model *jm = p->jm;
	struct oai_err *e = &p->e;
	json_error_t je;
	json_t *b = json_loadb(p->body, p->len, 0, &je);
	if (!json_is_object(b)) {
		json_decref(b);
		p->status = oai_errf(e, 400, "invalid_request_error", "invalid_json", NULL, "%s",
				     !p->len ? "the request has no body"
					     : "the body is not a JSON object");
		return;
	}
	const json_t *msgs = json_object_get(b, "messages"), *pr = json_object_get(b, "prompt");
	const json_t *gen = json_object_get(b, "add_generation_prompt");
	const json_t *spec = json_object_get(b, "add_special_tokens");
	const json_t *strs = json_object_get(b, "return_token_strs");
	const json_t *model = json_object_get(b, "model");
	const char *bad = !json_is_string(pr) == !msgs ? "give a prompt (a string) or messages"
			: json_string_length(pr) > JOB_PROMPT_MAX
				? "the prompt is over 1 MiB, a job's limit"
			: (gen && !json_is_boolean(gen)) ? "add_generation_prompt must be true or false"
			: (spec && !json_is_boolean(spec)) ? "add_special_tokens must be true or false"
			: (strs && !json_is_boolean(strs) && !json_is_null(strs))
				? "return_token_strs must be true or false"
				: NULL;
	int *ids = NULL, n = 0, rc;
	char err[WK_ERRSZ];
	if (bad)
		p->status = oai_errf(e, 400, "invalid_request_error", "invalid_input", NULL, "%s",
				     bad);
	else if (json_is_string(model) && !oai_model_ok(h->names, json_string_value(model)))
		p->status = oai_errf(e, 404, "invalid_request_error", "model_not_found", NULL,
				     "The model '%.200s' does not exist; this server serves '%s'",
				     json_string_value(model), h->model);
	else if (msgs)
		p->status = chat_prompt(h, jm, b, !json_is_false(gen), p->tenant, &ids, &n, e);
	else if ((rc = tok_encode(jm->tok, json_string_value(pr), json_string_length(pr),
				  !json_is_false(spec), &ids, &n, err, sizeof err)) != WK_OK)
		p->status = oai_errf(e, rc == WK_ENOMEM ? 500 : 400, rc == WK_ENOMEM
				     ? "server_error" : "invalid_request_error", rc == WK_ENOMEM
				     ? "internal" : "invalid_input", NULL, "%s", err);
	json_t *toks = p->status ? NULL : json_array();
	json_t *ts = !toks ? NULL : json_is_true(strs) ? json_array() : json_null();
	for (int i = 0; toks && ts && i < n; i++) {
		json_array_append_new(toks, json_integer(ids[i]));
		if (json_is_array(ts)) { /* (the vocabulary's string: a byte-level one's as it is) */
			const char *piece = tok_piece(jm->tok, ids[i]);
			json_array_append_new(ts, piece ? json_string(piece) : json_null());
		}
	}
	free(ids);
	json_decref(b);
	if (!p->status)
		p->answer = json_pack("{s:i, s:i, s:o, s:o}", "count", n, "max_model_len",
				      h->max_model_len, "tokens", toks, "token_strs", ts);
}

/* vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": TEXT}, the ids decoded as they are
 * (special tokens kept; bytes that are not UTF-8 as U+FFFD). */
static void route_detokenize(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	const struct job_model *jm = model_of(h, req, c);
	json_t *b = jm ? body_object(h, req, c) : NULL;
	if (!b)
		return;
	const json_t *t = json_object_get(b, "tokens"), *v;
	size_t n = json_array_size(t), i;
	int *ids = malloc((n ? n : 1) * sizeof *ids);
	const char *bad = !json_is_array(t) ? "tokens must be a list of token ids" : NULL;
	json_array_foreach(t, i, v) {
		if (bad || !ids)
			break;
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= jm->vocab)
			bad = "tokens: each is a token id of the vocabulary";
		else
			ids[i] = (int)json_integer_value(v);
	}
	char err[WK_ERRSZ], *text = NULL;
	size_t len = 0;
	int rc = bad || !ids ? WK_EINVAL
			     : tok_decode_utf8(jm->tok, ids, (int)n, false, &text, &len, err, sizeof err);
	free(ids);
	json_decref(b);
	if (rc != WK_OK) {
		reply_errf(h, req, c, 400, "invalid_request_error", "invalid_input", "%s",
			   bad ? bad : err);
		return;
	}
	reply_json(h, req, c, 200, json_pack("{s:s%}", "prompt", text, len));
	free(text);
}

static void route_health(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	pthread_mutex_lock(&h->mu);
	int st = state_now(h), queued = h->n_inbox;
	pthread_mutex_unlock(&h->mu);
	json_t *j = json_pack("{s:s, s:s, s:f, s:i, s:i}", "state", state_names[st], "model",
			      h->model, "uptime_s", wk_now() - h->t_start, "requests_in_flight",
			      h->n_calls, "requests_queued", queued);
	reply_json(h, req, c, st == S_STARTING || st == S_DRAINING ? 503 : 200, j);
}

static void put_hist(struct evbuffer *b, const char *name, const char *help,
		     const struct hist *hs)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	uint64_t cum = 0;
	for (int i = 0; i < hs->n; i++) {
		cum += hs->bucket[i];
		evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hs->le[i],
				    (unsigned long long)cum);
	}
	evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
			    (unsigned long long)hs->count, name, hs->sum, name,
			    (unsigned long long)hs->count);
}

/* Each tenant's choices the worker holds and those waiting for a slot (take_fair's view),
 * under mu. A tenant is a keys file's name ([A-Za-z0-9._-]: a label as it is). */
static void tenant_metrics(struct http_api *h, struct evbuffer *b)
{
	evbuffer_add_printf(b, "# HELP wick_http_tenant_choices Choices of completion requests "
			       "by tenant (its API key's): held by the worker, or waiting for a "
			       "batch slot (tenants take turns at the slots).\n"
			       "# TYPE wick_http_tenant_choices gauge\n");
	for (int i = 0; i < h->n_loads; i++) {
		int waiting = 0;
		for (struct http_flight *f = h->in_head; f; f = f->inbox_next)
			waiting += f->tix == i;
		evbuffer_add_printf(b, "wick_http_tenant_choices{tenant=\"%s\",state=\"held\"} %d\n"
				       "wick_http_tenant_choices{tenant=\"%s\",state=\"waiting\"} "
				       "%d\n", h->loads[i].tenant, h->loads[i].held,
				    h->loads[i].tenant, waiting);
	}
}

static void route_metrics(struct http_api *h, struct evhttp_request *req, struct hconn *c)
{
	struct evbuffer *b = evbuffer_new();
	if (!b) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	double now = wk_now();
	pthread_mutex_lock(&h->kept_mu);
	int kept_n = oai_kept_count(h->kept);
	uint64_t store_errors = h->store_errors;
	pthread_mutex_unlock(&h->kept_mu);
	pthread_mutex_lock(&h->mu);
	evbuffer_add_printf(b, "# HELP wick_http_requests_total HTTP requests answered, by "
			       "status code (499: the client went away first).\n"
			       "# TYPE wick_http_requests_total counter\n");
	for (int i = 100; i < 600; i++)
		if (h->by_code[i])
			evbuffer_add_printf(b, "wick_http_requests_total{code=\"%d\"} %llu\n", i,
					    (unsigned long long)h->by_code[i]);
	evbuffer_add_printf(b,
		"# HELP wick_http_requests_in_flight Completion requests queued or running.\n"
		"# TYPE wick_http_requests_in_flight gauge\nwick_http_requests_in_flight %d\n"
		"# HELP wick_http_requests_queued Choices of completion requests (one each "
		"unless n or a list of prompts asks for more) waiting for a batch slot.\n"
		"# TYPE wick_http_requests_queued gauge\nwick_http_requests_queued %d\n"
		"# HELP wick_http_connections Open HTTP connections.\n"
		"# TYPE wick_http_connections gauge\nwick_http_connections %d\n"
		"# HELP wick_http_requests_parsing Requests of 16 KB or more (an agent's long "
		"conversation: completions, token counts, /tokenize) queued or being parsed by a "
		"parser thread, beside the server's (--http-parse-threads).\n"
		"# TYPE wick_http_requests_parsing gauge\nwick_http_requests_parsing %d\n"
		"# TYPE wick_http_requests_parsed_beside_total counter\n"
		"wick_http_requests_parsed_beside_total %llu\n"
		"# HELP wick_prompt_tokens_total Prompt tokens of finished HTTP requests.\n"
		"# TYPE wick_prompt_tokens_total counter\nwick_prompt_tokens_total %llu\n"
		"# HELP wick_completion_tokens_total Generated tokens of finished HTTP requests.\n"
		"# TYPE wick_completion_tokens_total counter\nwick_completion_tokens_total %llu\n"
		"# HELP wick_prompt_cached_tokens_total Prompt tokens of finished HTTP requests "
		"whose KV cache an earlier request left (--prefix-cache): not run.\n"
		"# TYPE wick_prompt_cached_tokens_total counter\nwick_prompt_cached_tokens_total "
		"%llu\n"
		"# HELP wick_draft_tokens_total Speculative decoding's draft tokens in finished HTTP "
		"requests (wick worker --speculate), by whether they were kept.\n"
		"# TYPE wick_draft_tokens_total counter\nwick_draft_tokens_total{kept=\"true\"} %llu\n"
		"wick_draft_tokens_total{kept=\"false\"} %llu\n"
		"# HELP wick_request_gpu_seconds_total GPU seconds billed to HTTP requests.\n"
		"# TYPE wick_request_gpu_seconds_total counter\nwick_request_gpu_seconds_total %.6f\n"
		"# HELP wick_request_cost_usd_total What HTTP requests were billed.\n"
		"# TYPE wick_request_cost_usd_total counter\nwick_request_cost_usd_total %.6f\n",
		h->n_calls, h->n_inbox, h->n_conns, h->n_parsing,
		(unsigned long long)h->n_parsed_beside, (unsigned long long)h->prompt_tokens,
		(unsigned long long)h->completion_tokens, (unsigned long long)h->cached_tokens,
		(unsigned long long)h->draft_kept,
		(unsigned long long)h->draft_thrown, h->gpu_seconds, h->cost_micro / 1e6);
	tenant_metrics(h, b);
	const struct sched_cache_stats *pc = &h->pc;
	evbuffer_add_printf(b,
		"# HELP wick_prefix_cache_admissions_total Requests (queue jobs too) admitted with "
		"the prefix cache on and no prompt logprobs, by how they began: with an entry's "
		"sequence taken, with a prefix copied (from an entry or a running request), or "
		"with nothing cached.\n"
		"# TYPE wick_prefix_cache_admissions_total counter\n"
		"wick_prefix_cache_admissions_total{result=\"taken\"} %ld\n"
		"wick_prefix_cache_admissions_total{result=\"copied\"} %ld\n"
		"wick_prefix_cache_admissions_total{result=\"miss\"} %ld\n"
		"# HELP wick_prefix_cache_tokens_total Prompt tokens those admissions did not run.\n"
		"# TYPE wick_prefix_cache_tokens_total counter\nwick_prefix_cache_tokens_total %ld\n"
		"# HELP wick_prefix_cache_waits_total Steps a request waited for a running "
		"request's prefill, to copy it (--prefix-wait).\n"
		"# TYPE wick_prefix_cache_waits_total counter\nwick_prefix_cache_waits_total %ld\n"
		"# HELP wick_prefix_cache_evictions_total Entries freed for a request that needed "
		"a sequence.\n"
		"# TYPE wick_prefix_cache_evictions_total counter\n"
		"wick_prefix_cache_evictions_total %ld\n"
		"# HELP wick_prefix_cache_entries Finished requests' sequences kept, and the tokens "
		"they hold.\n"
		"# TYPE wick_prefix_cache_entries gauge\nwick_prefix_cache_entries %d\n"
		"# TYPE wick_prefix_cache_entry_tokens gauge\nwick_prefix_cache_entry_tokens %ld\n",
		pc->hits - pc->copies, pc->copies, pc->misses, pc->hit_tokens, pc->waits,
		pc->evicted, pc->entries, pc->tokens);
	uint64_t disk_bytes = 0, disk_errors = 0;
	int on_disk = resp_store_count(h->store, &disk_bytes, &disk_errors);
	evbuffer_add_printf(b,
		"# HELP wick_responses_kept The Responses API's kept responses (store), in memory and "
		"in --responses-dir.\n# TYPE wick_responses_kept gauge\n"
		"wick_responses_kept{where=\"memory\"} %d\nwick_responses_kept{where=\"disk\"} %d\n"
		"# TYPE wick_responses_kept_disk_bytes gauge\nwick_responses_kept_disk_bytes %llu\n"
		"# HELP wick_responses_dir_errors_total Kept responses not written to or read from "
		"--responses-dir (each logged).\n# TYPE wick_responses_dir_errors_total counter\n"
		"wick_responses_dir_errors_total %llu\n",
		kept_n, on_disk, (unsigned long long)disk_bytes,
		(unsigned long long)(store_errors + disk_errors));
	const struct tok *tok = h->model_set ? h->jm.tok : NULL; /* (under mu) */
	struct tok_memo_stats ms = {0};
	if (tok)
		tok_memo_stats(tok, &ms);
	evbuffer_add_printf(b,
		"# HELP wick_tokenizer_memo_segments_total Long text segments (a message, a tool's "
		"output) the tokenizer encoded, by whether its memo held their ids.\n"
		"# TYPE wick_tokenizer_memo_segments_total counter\n"
		"wick_tokenizer_memo_segments_total{result=\"hit\"} %llu\n"
		"wick_tokenizer_memo_segments_total{result=\"miss\"} %llu\n"
		"# TYPE wick_tokenizer_memo_hit_bytes_total counter\n"
		"wick_tokenizer_memo_hit_bytes_total %llu\n"
		"# TYPE wick_tokenizer_memo_bytes gauge\nwick_tokenizer_memo_bytes %zu\n",
		(unsigned long long)ms.hits, (unsigned long long)ms.misses,
		(unsigned long long)ms.hit_bytes, ms.bytes);
	put_hist(b, "wick_time_to_first_token_seconds",
		 "From a request's arrival to its first generated token.", &h->ttft);
	put_hist(b, "wick_time_per_output_token_seconds",
		 "Between consecutive generated tokens of a request.", &h->tpot);
	evbuffer_add_printf(b, "# HELP wick_state_seconds_total Seconds spent in each state.\n"
			       "# TYPE wick_state_seconds_total counter\n");
	for (int i = 0; i < S_N; i++)
		evbuffer_add_printf(b, "wick_state_seconds_total{state=\"%s\"} %.3f\n",
				    state_names[i],
				    h->state_s[i] + (i == h->state ? now - h->state_since : 0));
	evbuffer_add_printf(b, "# HELP wick_state The current state (1).\n# TYPE wick_state gauge\n");
	for (int i = 0; i < S_N; i++)
		evbuffer_add_printf(b, "wick_state{state=\"%s\"} %d\n", state_names[i],
				    i == h->state);
	double up = now - h->t_start;
	char cost[32];
	money_fmt6(cost, sizeof cost, money_cost_micro(up, h->o.price_micro));
	evbuffer_add_printf(b,
		"# HELP wick_uptime_seconds Seconds since the process started.\n"
		"# TYPE wick_uptime_seconds gauge\nwick_uptime_seconds %.3f\n"
		"# HELP wick_price_usd_per_hour The machine's price.\n"
		"# TYPE wick_price_usd_per_hour gauge\nwick_price_usd_per_hour %.6f\n"
		"# HELP wick_cost_usd_total The session's cost so far: uptime at the price.\n"
		"# TYPE wick_cost_usd_total counter\nwick_cost_usd_total %s\n",
		up, h->o.price_micro / 1e6, cost);
	pthread_mutex_unlock(&h->mu);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4");
	keepalive_header(h, req, c);
	send_reply(req, 200, NULL, b);
	evbuffer_free(b);
	count_code(h, 200);
	conn_idle(c);
}

static void new_id(char *out, size_t n, const char *prefix)
{
	unsigned char r[12] = {0};
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* unique, if not unguessable */
		static unsigned long long seq;
		unsigned long long x = ++seq ^ (unsigned long long)time(NULL) << 20;
		memcpy(r, &x, sizeof x);
	}
	int o = snprintf(out, n, "%s", prefix);
	for (size_t i = 0; i < sizeof r && o + 2 < (int)n; i++)
		o += snprintf(out + o, n - (size_t)o, "%02x", r[i]);
}

static int respond_after(json_t *chat, const json_t *skel, const json_t *before, json_t **conv,
			 struct oai_err *e);

/* A response's chat request (chat, its skel) going on from previous_response_id: that
 * response's conversation put after the instructions and before the input; *conv the
 * conversation to keep with this one (store), else NULL. 0, or the HTTP status of the error
 * in *e. */
static int respond_from(struct http_api *h, const char *tenant, json_t *chat, const json_t *skel,
			json_t **conv, struct oai_err *e)
{
	const char *prev = json_string_value(json_object_get(skel, "previous_response_id"));
	const json_t *before = NULL;
	pthread_mutex_lock(&h->kept_mu); /* (its messages are shared from here, not copied) */
	if (prev && !kept_get(h, prev, tenant, &before, NULL)) {
		pthread_mutex_unlock(&h->kept_mu);
		return oai_errf(e, 400, "invalid_request_error", "previous_response_not_found",
				"previous_response_id", "previous_response_id: no response '%.60s' "
				"is kept here (responses are kept %s)", prev, kept_where(h));
	}
	int rc = respond_after(chat, skel, before, conv, e);
	pthread_mutex_unlock(&h->kept_mu);
	return rc;
}

/* respond_from's after the kept conversation before (or NULL) is found. */
static int respond_after(json_t *chat, const json_t *skel, const json_t *before, json_t **conv,
			 struct oai_err *e)
{
	json_t *msgs = json_object_get(chat, "messages");
	size_t head = json_is_string(json_object_get(skel, "instructions")) ? 1 : 0;
	json_t *all = json_array(), *tail = json_array();
	for (size_t i = 0; all && tail && i < json_array_size(msgs); i++)
		json_array_append(i < head ? all : tail, json_array_get(msgs, i));
	if (!all || !tail || (before && json_array_extend(all, (json_t *)before)) ||
	    json_array_extend(all, tail) || json_object_set(chat, "messages", all)) {
		json_decref(all);
		json_decref(tail);
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	if (json_is_true(json_object_get(skel, "store"))) { /* the conversation, less the head */
		*conv = json_array();
		if (*conv && before)
			json_array_extend(*conv, (json_t *)before);
		if (*conv)
			json_array_extend(*conv, tail);
	}
	json_decref(all);
	json_decref(tail);
	return 0;
}

/* An API on the chat path (POST /v1/responses, /v1/messages): p's body as the chat request
 * that runs it (*chat), and the members of its response that say what was asked (p->skel);
 * 0, or the HTTP status of the error in p->e. Any thread. */
static int api_chat(struct http_api *h, struct http_parse *p, json_t **chat)
{
	struct oai_err *e = &p->e;
	int st = p->api->to_chat(p->body, p->len, chat, &p->skel, e);
	if (!st && p->api == &oai_responses_api)
		st = respond_from(h, p->tenant, *chat, p->skel, &p->conv, e);
	if (!st && p->api->hold_max_tokens) {
		const json_t *mt = json_object_get(*chat, "max_tokens");
		if (json_integer_value(mt) > h->o.max_tokens_limit)
			json_object_set_new(*chat, "max_tokens",
					    json_integer(h->o.max_tokens_limit));
		mt = json_object_get(*chat, "max_tokens");
		if (mt && /* (what it ran with, for why it stopped) */
		    json_object_set(p->skel, "max_tokens", (json_t *)mt))
			st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	if (st) {
		json_decref(*chat);
		*chat = NULL;
	}
	return st;
}

/* Makes p's request into its job documents (p->r; for an API on the chat path also p->skel
 * and p->conv), or the error to answer (p->status, p->e). Any thread: reads only p and h's
 * constants, and the kept responses under kept_mu. */
static void parse_run(struct http_api *h, struct http_parse *p)
{
	if (p->what == P_COUNT) {
		count_run(h, p);
		return;
	}
	if (p->what == P_TOKENIZE) {
		tokenize_run(h, p);
		return;
	}
	json_t *chat = NULL;
	int lim = h->o.max_tokens_limit;
	p->status = p->api ? api_chat(h, p, &chat) : 0;
	if (!p->status) {
		p->status = chat ? oai_json_to_job(p->kind, chat, h->names, p->id, p->tenant, lim,
						   &p->r, &p->e)
				 : oai_to_job(p->kind, p->body, p->len, h->names, p->id, p->tenant,
					      lim, &p->r, &p->e);
		if (p->status && p->api)
			p->api->err(&p->e);
	}
	json_decref(chat);
	if (p->status) {
		json_decref(p->skel);
		json_decref(p->conv);
		p->skel = p->conv = NULL;
	}
}

/* The request p made (parse_run) starts as a call: its flights go to the inbox. Takes p's r,
 * skel and conv. */
static void call_start(struct http_api *h, struct http_parse *p)
{
	struct evhttp_request *req = p->req;
	struct hconn *c = p->conn;
	struct oai_req r = p->r;
	json_t *skel = p->skel, *conv = p->conv;
	enum oai_kind kind = p->kind;
	const struct oai_api *api = p->api;
	const char *id = p->id, *tenant = p->tenant;
	p->skel = p->conv = NULL;
	memset(&p->r, 0, sizeof p->r);
	int n = r.n_choices;
	struct http_call *k = calloc(1, sizeof *k);
	bool ok = k && (k->fl = calloc((size_t)n, sizeof *k->fl)) &&
		  (k->res = calloc((size_t)n, sizeof *k->res)) &&
		  (k->have = calloc((size_t)n, sizeof *k->have));
	for (int i = 0; ok && i < n; i++)
		ok = (k->fl[i] = calloc(1, sizeof *k->fl[i])) != NULL;
	if (!ok) {
		for (int i = 0; k && k->fl && i < n; i++)
			free(k->fl[i]);
		if (k) {
			free(k->fl);
			free(k->res);
			free(k->have);
		}
		free(k);
		oai_req_free(&r);
		json_decref(skel);
		json_decref(conv);
		reply_errf(h, req, c, 500, "server_error", "internal", "out of memory");
		return;
	}
	struct timespec ts = p->wall_arrived;
	snprintf(k->id, sizeof k->id, "%s", id);
	if (api) {
		k->api = api;
		k->skel = skel; /* (freed with k from here) */
		k->conv = conv;
		snprintf(k->tenant, sizeof k->tenant, "%s", tenant);
		if (oai_rstream_init(&k->rs, skel, id, (long)ts.tv_sec, h->model, r.logprobs)) {
			oai_rstream_free(&k->rs);
			json_decref(skel);
			json_decref(conv);
			free(k->fl[0]);
			free(k->fl);
			free(k->res);
			free(k->have);
			free(k);
			oai_req_free(&r);
			reply_errf(h, req, c, 500, "server_error", "internal", "out of memory");
			return;
		}
	}
	k->kind = kind;
	k->t_sent = wk_now();
	k->stream = r.stream;
	k->include_usage = r.include_usage;
	k->created = (long)ts.tv_sec;
	k->n = n;
	k->per_prompt = r.per_prompt;
	k->live = n;
	k->req = req;
	k->conn = c;
	c->cur = k;
	watch_close(h, c);
	h->n_calls++;
	double now = p->t_arrived;
	for (int i = 0; i < n; i++) {
		struct http_flight *f = k->fl[i];
		oai_choice_id(f->id, sizeof f->id, id, i, n);
		f->call = k;
		f->index = i;
		f->kind = kind;
		f->stream = r.stream;
		/* (held: it runs to the context's end) */
		f->max_given = r.max_given && !(api && api->hold_max_tokens);
		f->tools = r.tools;
		f->logprobs = r.logprobs;
		f->echo = r.echo;
		f->echo_top = r.echo_top;
		f->plp_top = r.plp_top;
		f->thinking = r.thinking && !r.forced; /* (forced: thinking off) */
		split_init(&f->sp, f->thinking, r.tools, r.forced); /* forced: no content */
		f->wall_arrived = ts.tv_sec + ts.tv_nsec * 1e-9;
		snprintf(f->tenant, sizeof f->tenant, "%s", tenant);
		f->load = -1;
		f->t_arrived = now;
		f->body = r.jobs[i];
		f->len = r.job_lens[i];
		r.jobs[i] = NULL;
		f->job = r.decoded[i];
		r.decoded[i] = NULL;
		f->all_next = h->flights;
		if (h->flights)
			h->flights->all_prev = f;
		h->flights = f;
		h->n_flights++;
	}
	oai_req_free(&r);
	pthread_mutex_lock(&h->mu);
	for (int i = 0; i < n; i++) {
		struct http_flight *f = k->fl[i];
		f->in_inbox = true;
		f->tix = load_of(h, f->tenant);
		if (h->in_tail)
			h->in_tail->inbox_next = f;
		else
			h->in_head = f;
		h->in_tail = f;
		h->n_inbox++;
	}
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* p's parse is over (on this thread): the call starts, or its error is answered; nothing
 * when the client went away. Frees what p holds, and p itself when it was a parser's. */
static void parse_end(struct http_api *h, struct http_parse *p)
{
	if (p->conn)
		p->conn->parse = NULL;
	pthread_mutex_lock(&h->mu); /* (a drain serves what was accepted before it) */
	bool stopping = p->beside && p->what == P_COMPLETION && h->stopping;
	pthread_mutex_unlock(&h->mu);
	if (!p->req)
		; /* (the client went away while it was parsed) */
	else if (p->status)
		reply_err(h, p->req, p->conn, &p->e);
	else if (p->what != P_COMPLETION && p->answer)
		reply_json(h, p->req, p->conn, 200, json_incref(p->answer));
	else if (p->what != P_COMPLETION)
		reply_errf(h, p->req, p->conn, 500, "server_error", "internal", "out of memory");
	else if (stopping) /* (no worker will take it) */
		reply_errf(h, p->req, p->conn, 503, "server_error", "unavailable",
			   "the server is shutting down");
	else
		call_start(h, p);
	json_decref(p->answer);
	oai_req_free(&p->r);
	json_decref(p->skel);
	json_decref(p->conv);
	if (p->beside) {
		free((char *)p->body);
		free(p);
	}
}

/* A parser thread: parses the queued requests (beside the server thread) until p_stop. */
static void *parser_main(void *arg)
{
	struct http_api *h = arg;
	/* below the engine's threads, as the worker's preparers are */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->p_head && !h->p_stop)
			pthread_cond_wait(&h->pcv, &h->mu);
		if (h->p_stop)
			break; /* (what is queued is answered by the server thread) */
		struct http_parse *p = h->p_head;
		if (!(h->p_head = p->next))
			h->p_tail = NULL;
		pthread_mutex_unlock(&h->mu);
		if (h->o.parse_hook)
			h->o.parse_hook(h->o.parse_hook_ctx);
		parse_run(h, p);
		pthread_mutex_lock(&h->mu);
		p->next = NULL;
		if (h->p_done_tail)
			h->p_done_tail->next = p;
		else
			h->p_done = p;
		h->p_done_tail = p;
		wake_server_locked(h);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* The requests the parsers finished (on_wake): each started or answered. */
static void parse_reap(struct http_api *h)
{
	pthread_mutex_lock(&h->mu);
	struct http_parse *p = h->p_done;
	h->p_done = h->p_done_tail = NULL;
	for (struct http_parse *q = p; q; q = q->next) {
		h->n_parsing--;
		h->n_parsed_beside++;
	}
	pthread_mutex_unlock(&h->mu);
	while (p) {
		struct http_parse *next = p->next;
		parse_end(h, p);
		p = next;
	}
}

/* A big request goes to a parser, its body moved out of the request's buffer (in): true, or
 * false when there is none to take it (or no memory), and the server thread parses it. */
static bool parse_beside(struct http_api *h, const struct http_parse *on_stack,
			 struct evbuffer *in)
{
	if (!h->n_parsers || !on_stack->conn || on_stack->len < h->o.parse_min)
		return false;
	struct http_parse *p = malloc(sizeof *p);
	char *body = malloc(on_stack->len + 1);
	if (!p || !body || evbuffer_remove(in, body, on_stack->len) != (int)on_stack->len) {
		free(p);
		free(body);
		return false;
	}
	body[on_stack->len] = 0;
	*p = *on_stack;
	p->body = body;
	p->beside = true;
	p->conn->parse = p;
	watch_close(h, p->conn); /* a client that leaves now is not answered */
	pthread_mutex_lock(&h->mu);
	if (h->p_tail)
		h->p_tail->next = p;
	else
		h->p_head = p;
	h->p_tail = p;
	h->n_parsing++;
	pthread_cond_signal(&h->pcv);
	pthread_mutex_unlock(&h->mu);
	return true;
}

/* A request whose body is parsed (parse_run): beside the server thread when it is big and
 * there are parsers, else here. */
static void route_parse(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			const struct http_parse *what)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	struct http_parse p = *what;
	p.req = req;
	p.conn = c;
	p.len = evbuffer_get_length(in);
	p.t_arrived = wk_now();
	clock_gettime(CLOCK_REALTIME, &p.wall_arrived);
	if (parse_beside(h, &p, in))
		return;
	if (!(p.body = p.len ? (const char *)evbuffer_pullup(in, -1) : "")) {
		reply_errf(h, req, c, 500, "server_error", "internal", "out of memory");
		return;
	}
	parse_run(h, &p);
	parse_end(h, &p);
}

static void route_completion(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			     enum oai_kind kind, const struct oai_api *api, const char *tenant)
{
	pthread_mutex_lock(&h->mu);
	int st = state_now(h);
	pthread_mutex_unlock(&h->mu);
	if (st == S_DRAINING) {
		reply_errf(h, req, c, 503, "server_error", "unavailable",
			   "the server is shutting down");
		return;
	}
	if (!c) {
		reply_errf(h, req, c, 503, "server_error", "unavailable", "out of memory");
		return;
	}
	if (evbuffer_get_length(evhttp_request_get_input_buffer(req)) == 0) {
		reply_errf(h, req, c, 400, "invalid_request_error", "invalid_json",
			   "the request has no body");
		return;
	}
	struct http_parse p = {.what = P_COMPLETION, .kind = kind, .api = api};
	snprintf(p.tenant, sizeof p.tenant, "%s", tenant);
	new_id(p.id, sizeof p.id, api ? api->id_prefix : kind == OAI_CHAT ? "chatcmpl-" : "cmpl-");
	route_parse(h, req, c, &p);
}

/* A token count (api: Anthropic's or the Responses API's) or /tokenize (api NULL). */
static void route_tokens(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			 const struct oai_api *api, const char *tenant)
{
	const struct job_model *jm = model_of(h, req, c);
	if (!jm)
		return;
	struct http_parse p = {.what = api ? P_COUNT : P_TOKENIZE, .api = api, .jm = jm};
	snprintf(p.tenant, sizeof p.tenant, "%s", tenant);
	route_parse(h, req, c, &p);
}

/* A kept response's object o as shown (o's reference taken; NULL when out of memory). */
static json_t *shown(json_t *o)
{
	json_t *s = json_copy(o);
	json_decref(o);
	if (s)
		json_object_del(s, ANSWERS_KEY);
	return s;
}

/* GET /v1/responses/ID: a kept response (tenant's); DELETE drops it. */
static void route_kept(struct http_api *h, struct evhttp_request *req, struct hconn *c,
		       const char *id, const char *tenant, bool del)
{
	json_t *o = NULL;
	bool found;
	if (del) {
		pthread_mutex_lock(&h->kept_mu);
		found = oai_kept_delete(h->kept, id, tenant);
		if (h->store)
			found = resp_store_delete(h->store, id, tenant) || found;
		pthread_mutex_unlock(&h->kept_mu);
	} else {
		found = kept_take(h, id, tenant, NULL, &o);
	}
	if (!found)
		reply_errf(h, req, c, 404, "invalid_request_error", "not_found",
			   "no response '%.60s' is kept here (responses are kept %s)", id,
			   kept_where(h));
	else if (del)
		reply_json(h, req, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object",
						     "response", "deleted", 1));
	else /* (a shallow copy, less what is never shown) */
		reply_json(h, req, c, 200, shown(o));
}

/* GET /v1/responses/ID/input_items: a kept response's input items, a page of them (the
 * query's limit, 1 to 100, default 20; order asc or desc, the default; after, an item's id;
 * include is let be: an item holds all it has). */
static void route_input_items(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			      const char *id, const char *tenant)
{
	const char *target = evhttp_request_get_uri(req), *q = target ? strchr(target, '?') : NULL;
	char query[2048];
	snprintf(query, sizeof query, "%.*s", q ? (int)strcspn(q + 1, "#") : 0, q ? q + 1 : "");
	struct evkeyvalq kv;
	TAILQ_INIT(&kv);
	if (q && (strlen(q + 1) >= sizeof query || evhttp_parse_query_str(query, &kv))) {
		evhttp_clear_headers(&kv);
		reply_errf(h, req, c, 400, "invalid_request_error", "invalid_value",
			   "the query '%.100s' is not a well-formed one of at most %zu bytes", q + 1,
			   sizeof query - 1);
		return;
	}
	const char *lim = evhttp_find_header(&kv, "limit"), *order = evhttp_find_header(&kv, "order");
	char *end = NULL;
	long limit = lim ? strtol(lim, &end, 10) : 20;
	struct oai_err e = {0};
	json_t *list = NULL, *conv, *obj;
	if (lim && (end == lim || *end || limit < 1 || limit > 100))
		oai_errf(&e, 400, "invalid_request_error", "invalid_value", "limit",
			 "limit must be an integer from 1 to 100, not '%.40s'", lim);
	else if (order && strcmp(order, "asc") && strcmp(order, "desc"))
		oai_errf(&e, 400, "invalid_request_error", "invalid_value", "order",
			 "order must be \"asc\" or \"desc\", not '%.40s'", order);
	else if (!kept_take(h, id, tenant, &conv, &obj))
		oai_errf(&e, 404, "invalid_request_error", "not_found", NULL,
			 "no response '%.60s' is kept here (responses are kept %s)", id,
			 kept_where(h));
	else {
		size_t n = json_array_size(conv), i;
		const char **answer_of = calloc(n + 1, sizeof *answer_of);
		const json_t *pair;
		json_array_foreach(answer_of ? json_object_get(obj, ANSWERS_KEY) : NULL, i, pair) {
			json_int_t at = json_integer_value(json_array_get(pair, 0));
			const char *rid = json_string_value(json_array_get(pair, 1));
			if (rid && at >= 0 && (size_t)at + 1 < n) /* (a file edited: let be) */
				answer_of[at] = rid;
		}
		if (answer_of)
			list = oai_input_items_list(conv, answer_of, (int)limit,
						    order && !strcmp(order, "asc"),
						    evhttp_find_header(&kv, "after"), &e);
		else
			oai_errf(&e, 500, "server_error", "internal", NULL, "out of memory");
		free(answer_of);
		json_decref(conv);
		json_decref(obj);
	}
	evhttp_clear_headers(&kv);
	if (list)
		reply_json(h, req, c, 200, list);
	else
		reply_err(h, req, c, &e);
}

/* A kept response's route, /v1/responses/ID or /v1/responses/ID/input_items: the id's length
 * (0: neither), and whether it is the second. */
static size_t kept_route(const char *path, bool *items)
{
	if (strncmp(path, "/v1/responses/", 14) || !path[14] ||
	    !strcmp(path, "/v1/responses/input_tokens"))
		return 0;
	size_t n = strcspn(path + 14, "/");
	*items = path[14 + n] != 0;
	return n && (!*items || !strcmp(path + 14 + n, "/input_items")) ? n : 0;
}

/* The methods a route takes, NULL for no route. */
static const char *route_methods(const char *path)
{
	bool items;
	if (kept_route(path, &items))
		return items ? "GET, HEAD, OPTIONS" : "GET, HEAD, DELETE, OPTIONS";
	if (!strcmp(path, "/health") || !strcmp(path, "/v1/models") ||
	    !strncmp(path, "/v1/models/", 11) || !strcmp(path, "/metrics"))
		return "GET, HEAD, OPTIONS";
	if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions") ||
	    !strcmp(path, "/v1/responses") || !strcmp(path, "/v1/messages") ||
	    !strcmp(path, "/v1/messages/count_tokens") || !strcmp(path, "/tokenize") ||
	    !strcmp(path, "/detokenize") || !strcmp(path, "/v1/responses/input_tokens"))
		return "POST, OPTIONS";
	return NULL;
}

/* OPTIONS, a browser's CORS preflight among them: no key (a preflight carries none), 204 with
 * the route's methods, and where the server takes keys (keepalive_header) the headers a
 * cross-origin call may send: the ones the preflight names (the openai package sends its
 * own X-Stainless-* headers beside Authorization), when they are plain header names. */
static void route_options(struct http_api *h, struct evhttp_request *req, struct hconn *c,
			  const char *path)
{
	const char *methods = route_methods(path);
	if (!methods) {
		reply_errf(h, req, c, 404, "invalid_request_error", "not_found", "no route %.200s",
			   path);
		return;
	}
	struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
	evhttp_add_header(hd, "Allow", methods);
	keepalive_header(h, req, c);
	if (h->n_keys) {
		const char *want = evhttp_find_header(evhttp_request_get_input_headers(req),
						      "Access-Control-Request-Headers");
		bool plain = want && strlen(want) <= 1024 &&
			     strspn(want, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
					  "0123456789-_, ") == strlen(want);
		evhttp_add_header(hd, "Access-Control-Allow-Methods", methods);
		evhttp_add_header(hd, "Access-Control-Allow-Headers",
				  plain ? want : "Authorization, Content-Type");
		evhttp_add_header(hd, "Access-Control-Max-Age", "600");
	}
	evhttp_send_reply(req, 204, "No Content", NULL);
	count_code(h, 204);
	conn_idle(c);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct http_api *h = arg;
	struct hconn *c = conn_of(h, req);
	if (c) {
		c->active = true;
		if (!c->closecb_set) {
			evhttp_connection_set_closecb(evhttp_request_get_connection(req),
						      on_conn_close, c);
			c->closecb_set = true;
		}
		if (c->reject) {
			reply_errf(h, req, c, 503, "server_error", "too_many_connections",
				   "the server has %d connections open, its limit",
				   h->o.max_connections);
			return;
		}
	}
	/* The route is the request-target up to its query, as sent: evhttp's parsed URI reads
	 * "//v1/completions" as a network-path reference (authority "v1", path "/completions"),
	 * which would name a route the client never asked for. An absolute-form target
	 * ("http://host/v1/...", from proxies) is left to that parser. */
	const char *target = evhttp_request_get_uri(req);
	size_t body_len = evbuffer_get_length(evhttp_request_get_input_buffer(req));
	if (body_len > BODY_MAX) {
		reply_errf(h, req, c, 413, "invalid_request_error", "request_too_large",
			   "the request body is %zu bytes; the limit is %u", body_len, BODY_MAX);
		return;
	}
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	char pathbuf[2048];
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	if (target && target[0] == '/') {
		size_t n = strcspn(target, "?#");
		if (n >= sizeof pathbuf) {
			reply_errf(h, req, c, 404, "invalid_request_error", "not_found",
				   "no route %.200s... (a path of %zu bytes)", target, n);
			return;
		}
		memcpy(pathbuf, target, n);
		pathbuf[n] = 0;
		path = pathbuf;
	}
	if (!path || !*path)
		path = "/";
	enum evhttp_cmd_type m = evhttp_request_get_command(req);
	/* HEAD is GET without the body (evhttp leaves it out) */
	bool get = m == EVHTTP_REQ_GET || m == EVHTTP_REQ_HEAD, post = m == EVHTTP_REQ_POST;
	if (m == EVHTTP_REQ_OPTIONS) {
		route_options(h, req, c, path);
		return;
	}
	if (!strcmp(path, "/health")) {
		if (get)
			route_health(h, req, c);
		else {
			evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
					  route_methods(path));
			reply_errf(h, req, c, 405, "invalid_request_error", "method_not_allowed",
				   "%s wants GET", path);
		}
		return;
	}
	const char *tenant = authenticate(h, req, c);
	if (!tenant)
		return;
	bool models = !strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11);
	bool chat = !strcmp(path, "/v1/chat/completions");
	bool compl = !strcmp(path, "/v1/completions");
	bool resp = !strcmp(path, "/v1/responses"), msgs = !strcmp(path, "/v1/messages");
	bool rcount = !strcmp(path, "/v1/responses/input_tokens");
	bool items;
	size_t kept = kept_route(path, &items);
	bool count = !strcmp(path, "/v1/messages/count_tokens") || rcount;
	bool metrics = !strcmp(path, "/metrics");
	bool tokenize = !strcmp(path, "/tokenize"), detokenize = !strcmp(path, "/detokenize");
	bool posts = chat || compl || resp || msgs || count || tokenize || detokenize;
	if (kept) {
		char id[sizeof pathbuf];
		snprintf(id, sizeof id, "%.*s", (int)kept, path + 14);
		if (get && items) {
			route_input_items(h, req, c, id, tenant);
		} else if (get || (m == EVHTTP_REQ_DELETE && !items)) {
			route_kept(h, req, c, id, tenant, m == EVHTTP_REQ_DELETE);
		} else {
			evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
					  route_methods(path));
			reply_errf(h, req, c, 405, "invalid_request_error", "method_not_allowed",
				   "%s wants GET%s", path, items ? "" : " or DELETE");
		}
		return;
	}
	if (!models && !metrics && !posts) {
		reply_errf(h, req, c, 404, "invalid_request_error", "not_found",
			   "no route %.200s (try /v1/chat/completions, /v1/completions, "
			   "/v1/responses, /v1/messages, /v1/models, /tokenize, /detokenize, "
			   "/health, /metrics)", path);
		return;
	}
	if (((models || metrics) && !get) || (posts && !post)) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
				  route_methods(path));
		reply_errf(h, req, c, 405, "invalid_request_error", "method_not_allowed", "%s wants %s",
			   path, models || metrics ? "GET" : "POST");
		return;
	}
	if (models)
		route_models(h, req, c, path);
	else if (metrics)
		route_metrics(h, req, c);
	else if (tokenize)
		route_tokens(h, req, c, NULL, tenant);
	else if (detokenize)
		route_detokenize(h, req, c);
	else if (count)
		route_tokens(h, req, c, rcount ? &oai_responses_api : &oai_messages_api, tenant);
	else
		route_completion(h, req, c, compl ? OAI_COMPLETION : OAI_CHAT,
				 resp ? &oai_responses_api : msgs ? &oai_messages_api : NULL, tenant);
}

/* ---- life cycle ---- */

static void *server_main(void *arg)
{
	struct http_api *h = arg;
	event_base_dispatch(h->base);
	return NULL;
}

/* Splits "HOST:PORT" ("[V6]:PORT"). */
static int split_listen(const char *s, char *host, size_t hostsz, int *port, char *err,
			size_t errsz)
{
	const char *colon = strrchr(s, ':');
	const char *h0 = s, *h1 = colon;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':')
			return wk_errf(err, errsz, WK_EINVAL, "--listen '%s': want [IPV6]:PORT", s);
		h0 = s + 1;
		h1 = close;
		colon = close + 1;
	}
	if (!colon || h1 == h0 || (size_t)(h1 - h0) >= hostsz)
		return wk_errf(err, errsz, WK_EINVAL, "--listen '%s': want HOST:PORT, e.g. "
			       "127.0.0.1:8000", s);
	char *end;
	long p = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || p < 0 || p > 65535)
		return wk_errf(err, errsz, WK_EINVAL, "--listen '%s': the port must be 0 to 65535", s);
	memcpy(host, h0, (size_t)(h1 - h0));
	host[h1 - h0] = 0;
	*port = (int)p;
	return WK_OK;
}

/* True when every address host resolves to is a loopback one. */
static bool loopback_only(const char *host)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE}, *res = NULL;
	if (getaddrinfo(host, NULL, &hints, &res) || !res)
		return false;
	bool ok = true;
	for (struct addrinfo *a = res; a; a = a->ai_next) {
		if (a->ai_family == AF_INET) {
			uint32_t ip = ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr);
			ok = ok && (ip >> 24) == 127;
		} else if (a->ai_family == AF_INET6) {
			const struct in6_addr *ip = &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
			ok = ok && (IN6_IS_ADDR_LOOPBACK(ip) ||
				    (IN6_IS_ADDR_V4MAPPED(ip) && ip->s6_addr[12] == 127));
		} else {
			ok = false;
		}
	}
	freeaddrinfo(res);
	return ok;
}

static int load_keys(struct http_api *h, char *err, size_t errsz)
{
	const char *key = h->o.api_key ? h->o.api_key : getenv("WICK_API_KEY");
	if (key && *key) {
		size_t kl = strlen(key);
		if (kl > HTTP_KEY_LEN_MAX)
			return wk_errf(err, errsz, WK_EINVAL, "the API key is longer than %d bytes",
				       HTTP_KEY_LEN_MAX);
		for (size_t i = 0; i < kl; i++)
			if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e)
				return wk_errf(err, errsz, WK_EINVAL, "the API key must be printable "
					       "ASCII without spaces");
		if (!(h->keys = calloc(1, sizeof *h->keys)) || !(h->keys[0].key = strdup(key)))
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		h->keys[0].len = kl;
		snprintf(h->keys[0].tenant, sizeof h->keys[0].tenant, "default");
		h->n_keys = 1;
	}
	if (h->o.api_keys_file) {
		char *buf = NULL;
		size_t len = 0;
		int rc = wk_read_file(h->o.api_keys_file, 1u << 20, &buf, &len, err, errsz);
		if (rc == WK_OK)
			rc = http_keys_parse(buf, len, h->o.api_keys_file, &h->keys, &h->n_keys, err,
					     errsz);
		free(buf);
		if (rc != WK_OK)
			return rc == WK_ENOMEM ? rc : WK_EINVAL;
		if (h->n_keys == 0)
			return wk_errf(err, errsz, WK_EINVAL, "%s holds no keys", h->o.api_keys_file);
	}
	return WK_OK;
}

static void free_api(struct http_api *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->p_stop = true;
	pthread_cond_broadcast(&h->pcv);
	pthread_mutex_unlock(&h->mu);
	for (int i = 0; i < h->n_parsers; i++)
		pthread_join(h->parsers[i], NULL);
	free(h->parsers);
	if (h->http)
		evhttp_free(h->http); /* closes the connections: their closecbs run */
	for (int l = 0; l < 2; l++) /* the parses left: no one to answer */
		for (struct http_parse *p = l ? h->p_done : h->p_head, *next; p; p = next) {
			next = p->next;
			p->req = NULL;
			p->conn = NULL;
			parse_end(h, p);
		}
	for (struct hconn *c = h->conns, *next; c; c = next) {
		next = c->next;
		if (c->eof_ev)
			event_free(c->eof_ev);
		bufferevent_decref(c->bev);
		free(c);
	}
	while (h->flights)
		flight_free(h, h->flights);
	for (struct msg *m = h->out_head, *next; m; m = next) {
		next = m->next;
		free(m);
	}
	if (h->base)
		event_base_loop(h->base, EVLOOP_NONBLOCK); /* run the bufferevents' finalizers */
	if (h->wake_ev)
		event_free(h->wake_ev);
	if (h->sweep_ev)
		event_free(h->sweep_ev);
	if (h->base)
		event_base_free(h->base);
	if (h->wake[0] >= 0)
		close(h->wake[0]);
	if (h->wake[1] >= 0)
		close(h->wake[1]);
	for (int i = 0; i < h->n_keys; i++)
		free(h->keys[i].key);
	free(h->keys);
	oai_kept_free(h->kept);
	resp_store_close(h->store);
	free(h->loads);
	pthread_mutex_destroy(&h->mu);
	pthread_mutex_destroy(&h->kept_mu);
	pthread_cond_destroy(&h->cv);
	pthread_cond_destroy(&h->pcv);
	free(h);
}

int http_api_start(const struct http_api_opts *o, struct http_api **out, char *bound,
		   size_t boundsz, char *err, size_t errsz)
{
	*out = NULL;
	struct http_api *h = calloc(1, sizeof *h);
	if (!h)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	h->o = *o;
	h->wake[0] = h->wake[1] = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->kept_mu, NULL);
	pthread_cond_init(&h->pcv, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (!h->o.max_connections)
		h->o.max_connections = 256;
	if (!(h->o.timeout_s > 0))
		h->o.timeout_s = 30;
	if (!h->o.max_tokens_limit)
		h->o.max_tokens_limit = 4096;
	if (!h->o.keepalive_s)
		h->o.keepalive_s = 15;
	if (!h->o.parse_min)
		h->o.parse_min = HTTP_PARSE_MIN;
	if (!(h->kept = oai_kept_new(KEPT_ENTRIES, KEPT_BYTES))) {
		free_api(h);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	if (h->o.responses_dir) {
		char serr[WK_ERRSZ];
		int src = resp_store_open(h->o.responses_dir, h->o.responses_max,
					  h->o.responses_max_age, store_log, h, &h->store, serr,
					  sizeof serr);
		if (src != WK_OK) {
			free_api(h);
			return wk_errf(err, errsz, src == WK_ENOMEM ? src : WK_EINVAL,
				       "--responses-dir: %s", serr);
		}
		uint64_t bytes;
		int n = resp_store_count(h->store, &bytes, NULL);
		snprintf(serr, sizeof serr, "%s: %d kept responses (%.1f MB) to go on from",
			 h->o.responses_dir, n, (double)bytes / 1e6);
		server_log(h, "responses_dir", serr);
	}
	h->t_start = h->state_since = wk_now();
	h->created = (long)time(NULL);
	h->ttft = (struct hist){.le = ttft_le, .n = sizeof ttft_le / sizeof ttft_le[0]};
	h->tpot = (struct hist){.le = tpot_le, .n = sizeof tpot_le / sizeof tpot_le[0]};

	/* the model's name: --served-name, else the model directory's */
	if (h->o.served_name) {
		snprintf(h->model, sizeof h->model, "%s", h->o.served_name);
	} else {
		char real[PATH_MAX];
		const char *p = o->model && realpath(o->model, real) ? real : o->model ? o->model : "model";
		const char *base = strrchr(p, '/');
		snprintf(h->model, sizeof h->model, "%.255s", base && base[1] ? base + 1 : p);
	}
	size_t nl = (size_t)snprintf(h->names, sizeof h->names, "%s", h->model);
	for (int i = 0; i < h->o.n_model_aliases && nl < sizeof h->names; i++)
		nl += (size_t)snprintf(h->names + nl, sizeof h->names - nl, "\n%s",
				       h->o.model_aliases[i]);

	char host[256];
	int port = 0, rc;
	if ((rc = split_listen(o->listen ? o->listen : "", host, sizeof host, &port, err, errsz)) ||
	    (rc = load_keys(h, err, errsz)))
		goto fail;
	if (h->n_keys == 0 && !loopback_only(host)) {
		rc = wk_errf(err, errsz, WK_EINVAL, "--listen %s is not a loopback address: give "
			     "an API key (--api-key, WICK_API_KEY or --api-keys) to serve on it",
			     o->listen);
		goto fail;
	}
	if (!(h->base = event_base_new()) || !(h->http = evhttp_new(h->base))) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto fail;
	}
	evhttp_set_max_body_size(h->http, BODY_HARD_MAX);
	evhttp_set_max_headers_size(h->http, HEADERS_MAX);
	struct timeval tv = {(time_t)h->o.timeout_s,
			     (suseconds_t)((h->o.timeout_s - (time_t)h->o.timeout_s) * 1e6)};
	evhttp_set_timeout_tv(h->http, &tv);
	/* every method reaches on_request, which answers an unknown one 405 in JSON */
	evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
				   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
				   EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_bevcb(h->http, make_bev, h);
	evhttp_set_gencb(h->http, on_request, h);
	struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(h->http, host,
									(ev_uint16_t)port);
	if (!bs) {
		rc = wk_errf(err, errsz, WK_EIO, "cannot listen on %s: %s", o->listen,
			     strerror(errno));
		goto fail;
	}
	struct sockaddr_storage ss = {0}; /* AF_UNSPEC where getsockname fails */
	socklen_t sl = sizeof ss;
	char addr[INET6_ADDRSTRLEN] = "?";
	int bport = port;
	if (!getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl)) {
		if (ss.ss_family == AF_INET6) {
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr, sizeof addr);
			bport = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		} else {
			inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr, sizeof addr);
			bport = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		}
	}
	snprintf(bound, boundsz, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", addr, bport);
	if (pipe2(h->wake, O_NONBLOCK | O_CLOEXEC) ||
	    !(h->wake_ev = event_new(h->base, h->wake[0], EV_READ | EV_PERSIST, on_wake, h)) ||
	    !(h->sweep_ev = event_new(h->base, -1, EV_PERSIST, sweep, h))) {
		rc = wk_errf(err, errsz, WK_EIO, "cannot make the server's wake-up pipe: %s",
			     strerror(errno));
		goto fail;
	}
	struct timeval sw = {0, (suseconds_t)(SWEEP_S * 1e6)};
	event_add(h->wake_ev, NULL);
	event_add(h->sweep_ev, &sw);
	/* signals go to the worker thread, which drains on SIGTERM */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int prc = 0;
	if (h->o.parse_threads > 0 &&
	    !(h->parsers = calloc((size_t)h->o.parse_threads, sizeof *h->parsers)))
		prc = ENOMEM;
	while (!prc && h->n_parsers < h->o.parse_threads &&
	       !(prc = pthread_create(&h->parsers[h->n_parsers], NULL, parser_main, h)))
		h->n_parsers++;
	if (!prc)
		prc = pthread_create(&h->thread, NULL, server_main, h);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (prc) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "cannot start the server's threads: %s",
			     strerror(prc));
		goto fail;
	}
	h->thread_started = true;
	*out = h;
	return WK_OK;
fail:
	free_api(h);
	return rc;
}

void http_api_stop(struct http_api *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stopping = true;
	wake_server_locked(h);
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (h->thread_started)
		pthread_join(h->thread, NULL);
	free_api(h);
}
