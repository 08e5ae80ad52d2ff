/*
 * http_api.h - the OpenAI-compatible HTTP endpoint of `wick dev` and `wick worker --listen`.
 *
 * A libevent evhttp server runs on its own thread with its own event_base. It parses,
 * authenticates and checks each request, turns a completion request into a job document (the
 * contract in job.h, so the worker admits it exactly as it admits a queue job) and leaves it
 * in an inbox. The worker thread takes requests from the inbox into its batch, reports each
 * generated piece of text (streaming) and finally the request's result document; those go
 * back to the HTTP thread through a pipe, so no evhttp object is ever touched by the worker.
 *
 * Routes (every one but /health needs "Authorization: Bearer KEY" when keys are configured):
 *   POST /v1/chat/completions, POST /v1/completions   OpenAI request and response shapes;
 *        "stream": true answers with Server-Sent Events ending "data: [DONE]"
 *   POST /v1/responses (OpenAI's Responses API), GET and DELETE /v1/responses/ID (a kept
 *        response: in memory, and in --responses-dir), GET /v1/responses/ID/input_items
 *        (its input, paged), POST /v1/responses/input_tokens
 *   POST /v1/messages, POST /v1/messages/count_tokens   Anthropic's Messages API
 *   POST /tokenize, POST /detokenize                     vLLM's
 *   GET  /v1/models, GET /v1/models/ID                 one model (--served-name, else the
 *        model directory's name); a request naming another model (not a --model-alias)
 *        is a 404
 *   GET  /health    {"state": ...}: 200 in READY, IDLE, BUSY; 503 in STARTING, DRAINING
 *   GET  /metrics   Prometheus text: requests by status, tokens, time-to-first-token and
 *        per-token latency histograms, seconds per state, cost so far
 * Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}; the codes are the
 * contract's (invalid_json, invalid_input, max_tokens_range, ...) plus invalid_api_key,
 * model_not_found, not_found, method_not_allowed, request_too_large, too_many_connections and
 * unavailable.
 * A body over the limit is a 413 in that shape (request_too_large). Requests that libevent
 * refuses while parsing (a body over twice the limit: 413, a malformed request line or
 * headers over the limit: 400) get libevent's own short HTML error page.
 *
 * Limits, all fixed at start: body (1 MiB), headers (16 KiB), concurrent connections (the
 * extra ones are closed at once), max_tokens (--max-tokens-limit), and a slow-client timeout:
 * a request must arrive whole within --http-timeout seconds of its connection opening (or of
 * the previous response), and a connection that makes no read/write progress for that long
 * while a response is being sent is closed. A client that disconnects before its response is
 * complete (queued, running, or mid-stream) cancels its request, every choice of it (the
 * worker gets them from http_api_cancelled), as does the first choice that fails. API keys
 * are never logged.
 */
#ifndef HTTP_API_H
#define HTTP_API_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/queue.h"

/* ---- flags: `wick worker` and `wick dev` parse these with getopt_long ---- */

#define HTTP_OPT_BASE 1100
#define HTTP_API_OPTIONS                                                                    \
	{"listen", required_argument, 0, HTTP_OPT_BASE + 0},                                \
	{"served-name", required_argument, 0, HTTP_OPT_BASE + 1},                           \
	{"api-key", required_argument, 0, HTTP_OPT_BASE + 2},                               \
	{"api-keys", required_argument, 0, HTTP_OPT_BASE + 3},                              \
	{"max-connections", required_argument, 0, HTTP_OPT_BASE + 4},                       \
	{"http-timeout", required_argument, 0, HTTP_OPT_BASE + 5},                          \
	{"max-tokens-limit", required_argument, 0, HTTP_OPT_BASE + 6},                      \
	{"sse-keepalive", required_argument, 0, HTTP_OPT_BASE + 7},                         \
	{"responses-dir", required_argument, 0, HTTP_OPT_BASE + 8},                         \
	{"responses-max", required_argument, 0, HTTP_OPT_BASE + 9},                         \
	{"model-alias", required_argument, 0, HTTP_OPT_BASE + 10},                          \
	{"responses-max-age", required_argument, 0, HTTP_OPT_BASE + 11},                    \
	{"http-parse-threads", required_argument, 0, HTTP_OPT_BASE + 12}

#define HTTP_API_HELP                                                                       \
	"  --listen HOST:PORT    also serve the OpenAI API over HTTP (wick dev: 127.0.0.1:8000)\n" \
	"  --served-name NAME    the model id the API shows (default: the model's directory name)\n" \
	"  --model-alias GLOB    a request may also name its model so (a shell pattern, repeatable\n" \
	"                        up to 16): 'claude-*' lets Claude Code come with its own model\n" \
	"                        names, '*' takes any; the API still shows NAME\n" \
	"  --api-key KEY         require \"Authorization: Bearer KEY\" (tenant \"default\"; also\n" \
	"                        the env var WICK_API_KEY); needed to listen on a non-loopback address\n" \
	"  --api-keys FILE       keys and their tenants, one \"KEY TENANT\" per line (# comments)\n" \
	"  --max-connections N   concurrent HTTP connections (default 256)\n"                 \
	"  --http-timeout S      slow clients: a request must arrive within S seconds, and a\n" \
	"                        response that makes no progress for S seconds is cut (default 30)\n" \
	"  --max-tokens-limit N  the largest max_tokens a request may ask for; also the default\n" \
	"                        (default 4096; generation also stops at the context's end)\n" \
	"  --sse-keepalive S     a stream that has sent nothing for S seconds (queued, or in a\n" \
	"                        long prefill) starts, and says it is alive every S seconds, so\n" \
	"                        that proxies with idle timeouts keep it (default 15; 0: never)\n" \
	"  --responses-dir DIR   the Responses API's kept responses are also files in DIR, so\n" \
	"                        previous_response_id goes on from them after a restart (the\n" \
	"                        worker scaled to zero, a dev session ended; default: memory)\n" \
	"  --responses-max SIZE  DIR's responses, at most (e.g. 4GB): the least recently used\n" \
	"                        go first (default 1GB)\n"                                   \
	"  --responses-max-age S a kept response not used for S seconds is removed from DIR\n" \
	"                        (2592000: 30 days; default 0: kept while within SIZE)\n" \
	"  --http-parse-threads N  threads that make a big request (16 KB or more: an agent's\n" \
	"                        long conversation) into its jobs beside the server's thread,\n" \
	"                        which streams the other requests' tokens meanwhile (0-16;\n" \
	"                        default: as many as --prepare-threads; 0: on its thread)\n"

#define HTTP_ALIASES_MAX 16

struct http_api_opts {
	const char *listen;        /* "HOST:PORT" ("[::1]:PORT" for IPv6); NULL: no server */
	const char *served_name;   /* NULL: the basename of model */
	const char *model_aliases[HTTP_ALIASES_MAX]; /* --model-alias: globs a request's model may
						      * match instead */
	int n_model_aliases;
	const char *model;         /* the model path (for the default name) */
	const char *api_key;       /* NULL: WICK_API_KEY when set */
	const char *api_keys_file;
	int max_connections;       /* 0: 256 */
	double timeout_s;          /* 0: 30 */
	int max_tokens_limit;      /* 0: 4096 */
	double keepalive_s;        /* --sse-keepalive: 0: 15; < 0: never */
	int64_t price_micro;       /* per hour of the whole machine, for /metrics' cost */
	const char *responses_dir; /* --responses-dir: NULL, kept in memory only */
	uint64_t responses_max;    /* --responses-max: 0, 1 GiB */
	double responses_max_age;  /* --responses-max-age: 0, none */
	/* where the server's own events go (a kept response that could not be written, ...),
	 * from the server thread: event names the kind, msg what happened; NULL: stderr */
	void (*log)(void *ctx, const char *event, const char *msg);
	void *log_ctx;
	/* set by a signal handler when the process is to drain: from then on the server acts
	 * as DRAINING (new completions 503, /health 503) before the worker thread has seen it,
	 * and http_api_take returns within ~10 ms; NULL: none */
	const atomic_int *stop;
	/* parser threads: a completion request of parse_min bytes or more (0: HTTP_PARSE_MIN) is
	 * made into its jobs by one of them, beside the server thread (wick worker
	 * --prepare-threads: as many as the worker's preparers); 0: by the server thread */
	int parse_threads;
	bool parse_threads_set;    /* --http-parse-threads given (else the worker's preparers) */
	size_t parse_min;
	/* called by a parser thread as it takes a request, before it parses it (tests hold it
	 * there); NULL: none */
	void (*parse_hook)(void *ctx);
	void *parse_hook_ctx;
};

/* A big request: an agent's long conversation, tens of thousands of tokens (13 ms to parse
 * at 150K). */
#define HTTP_PARSE_MIN ((size_t)16 << 10)
#define HTTP_PARSERS_MAX 16

/* Handles one of the HTTP_API_OPTIONS (c >= HTTP_OPT_BASE). Returns 0, or 2 with a usage
 * message on stderr. */
int http_api_flag(struct http_api_opts *o, int c, const char *arg);

/* ---- life cycle (the worker thread) ---- */

struct http_api;
struct http_flight; /* one choice of an HTTP request, handed to the worker as a job: a
		     * request has one, or n for each of its prompts; the server joins their
		     * results into its one response */

/* Loads the keys, binds, and starts the server thread (in state STARTING). Fails with
 * WK_EINVAL for a bad option (a malformed address or key file, or a non-loopback address
 * without any key), WK_EIO when the address cannot be bound, WK_ENOMEM. *bound gets the
 * address actually bound (HOST:PORT; port 0 picks a free one). */
int http_api_start(const struct http_api_opts *o, struct http_api **out, char *bound,
		   size_t boundsz, char *err, size_t errsz);

/* Ends the server: requests still in the inbox and any flight never finished are answered
 * 503, pending output is flushed (up to about a second), connections are closed and the
 * thread joined. NULL is fine. */
void http_api_stop(struct http_api *h);

/* "STARTING", "READY", "BUSY", "IDLE" or "DRAINING": what /health answers, and the clock of
 * /metrics' seconds per state. New completion requests get 503 while DRAINING. */
void http_api_set_state(struct http_api *h, const char *state);
/* The model the worker opened: its tokenizer (m->tok, NULL for none; the caller's, kept until
 * http_api_stop) and chat format for /tokenize and /detokenize, which answer 503 before this,
 * and max_model_len (the context) for /tokenize's answer. Once. */
struct job_model;
void http_api_set_model(struct http_api *h, const struct job_model *m, int max_model_len);
/* The scheduler's prefix cache counts (all its requests', queue jobs' too), for /metrics. */
struct sched_cache_stats;
void http_api_set_cache_stats(struct http_api *h, const struct sched_cache_stats *st);

/* ---- requests (the worker thread) ---- */

/* Takes up to max new requests, waiting up to wait_s seconds for the first. Each flight is
 * the worker's until it hands it back with http_api_finish. Returns the number taken. */
int http_api_take(struct http_api *h, struct http_flight **out, int max, double wait_s);

/* Choices accepted and not yet taken, and requests still being parsed beside the server
 * thread (a draining worker still serves them, and an idle one does not exit on them). */
int http_api_waiting(struct http_api *h);

/* Whether the request named max_tokens (or max_completion_tokens): then, as OpenAI does, a
 * prompt and max_tokens past the context are refused rather than cut short. */
bool http_flight_max_given(const struct http_flight *f);

/* The flight's job as the request's check decoded it from its document (the caller's: then
 * job_free and free it), or NULL (decode the document). Once. */
struct job;
struct job *http_flight_take_job(struct http_flight *f);

/* Moves a flight's job document into j (id, body, len, attempt 1, enqueued_at), as a queue
 * would deliver it; j's body is then the caller's (queue_job_free). */
void http_flight_job(struct http_flight *f, struct queue_job *j);

/* The flights whose clients went away since the last call (up to max); the worker cancels
 * them. Returns how many. */
int http_api_cancelled(struct http_api *h, struct http_flight **out, int max);

/* After each generated token: n_tokens is the count so far, piece the text that became final
 * (see sched_req.on_token). Streams the piece to its client and times the tokens. */
void http_api_token(struct http_api *h, struct http_flight *f, int n_tokens, const char *piece,
		    size_t len);

/* Whether the client asked for a stream. */
bool http_flight_stream(const struct http_flight *f);
/* Before the piece of http_api_token: the logprobs of the tokens since the last call, as the
 * JSON array of output.logprobs.content (job_logprobs_json; copied); they go with the next
 * chunk of the stream. Nothing unless the request streams with logprobs. */
void http_api_logprobs(struct http_api *h, struct http_flight *f, const char *json,
		       size_t len);
/* Before the first piece: the prompt's entries (output.prompt_logprobs' JSON array; copied),
 * which a streamed completion with echo sends first. Nothing unless the request streams with
 * echo. */
void http_api_prompt(struct http_api *h, struct http_flight *f, const char *json, size_t len);

/* The request's end: json is its result document (job_encode_result/job_encode_error;
 * copied). The client gets the OpenAI response or error built from it, and f is no longer
 * the worker's. */
void http_api_finish(struct http_api *h, struct http_flight *f, const char *json, size_t len);

#endif
