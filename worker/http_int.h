/*
 * http_int.h - internals of the HTTP endpoint shared by http_api.c (the server) and
 * http_openai.c (the OpenAI request and response shapes). Only those two files and their unit
 * tests include it.
 *
 * http_openai.c is pure (no I/O, no clock, no globals): it turns an OpenAI request body into
 * the contract's job document, and a result document back into OpenAI's response, stream
 * chunk or error objects.
 */
#ifndef HTTP_INT_H
#define HTTP_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/wk.h"

enum oai_kind { OAI_CHAT, OAI_COMPLETION };

/* An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}. */
struct oai_err {
	int status;          /* the HTTP status: 400, 401, 404, 500, 503, ... */
	const char *type;    /* "invalid_request_error", "authentication_error", "server_error" */
	const char *code;    /* "invalid_json", "model_not_found", ...; NULL: null */
	const char *param;   /* the request member at fault, or NULL */
	char message[WK_ERRSZ];
};

/* Sets *e and returns e->status. */
int oai_errf(struct oai_err *e, int status, const char *type, const char *code,
	     const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* {"error": {...}}; NULL only when out of memory. */
json_t *oai_error_json(const struct oai_err *e);

struct job;

struct oai_req {
	bool stream;
	bool include_usage;  /* stream_options.include_usage */
	bool max_given;      /* max_tokens or max_completion_tokens was in the request */
	bool tools;          /* chat with tools (and tool_choice not "none"): input.tools */
	bool thinking;       /* chat with thinking on: input.thinking */
	bool forced;         /* tool_choice "required" or a function: the answer is a call */
	bool logprobs;       /* logprobs asked for: the stream's chunks carry them */
	bool echo;           /* completions' echo: the prompt comes first in the text (and its
			      * tokens in the logprobs): input.prompt_logprobs */
	int echo_top;        /* ... with logprobs: its alternatives (the legacy logprobs N) */
	int plp_top;         /* vLLM's prompt_logprobs: its alternatives (0 to 20), or -1 when
			      * not asked: input.prompt_logprobs, the larger of the two */
	int n_choices;       /* the jobs: n for each prompt, 1 to OAI_CHOICES_MAX */
	int per_prompt;      /* n: job c is choice c % n of prompt c / n */
	char **jobs;         /* [n_choices]: the job documents (job.h), malloc'd */
	size_t *job_lens;
	struct job **decoded; /* [n_choices]: each job as job_decode made it when checking it
			       * (malloc'd), or NULL: the worker need not decode it again */
};

/* The most choices a request may ask for (n times its prompts), and the most bytes their job
 * documents may come to (each copies its prompt). */
#define OAI_CHOICES_MAX 128
#define OAI_JOBS_BYTES_MAX (16 << 20)

/* A request body parsed: a JSON object, or NULL after a 400 in *e (invalid_json). */
json_t *oai_load_object(const char *body, size_t len, struct oai_err *e);

/* The frame of an API on the chat path (oai_responses_to_chat, oai_messages_to_chat): the
 * body parsed, the chat request {"messages": msgs} made and filled by fill, *skel made by
 * skeleton. 0, or the HTTP status of the error in *e (*chat and *skel NULL). */
int oai_api_chat(const char *body, size_t len, json_t **chat, json_t **skel,
		 int (*fill)(const json_t *root, json_t *chat, json_t *msgs, struct oai_err *e),
		 json_t *(*skeleton)(const json_t *root), struct oai_err *e);
/* Copies root's members names[i][0] (those present and not null) into chat as names[i][1]. */
int oai_copy_members(const json_t *root, json_t *chat, const char *const (*names)[2], size_t n,
		     struct oai_err *e);

/* Frees r's jobs (NULL and 0 after). */
void oai_req_free(struct oai_req *r);

/* Choice index's job id: the request's id when it has one choice, else "ID-index". */
void oai_choice_id(char *out, size_t size, const char *id, int index, int n_choices);

/* Checks an OpenAI request body for kind and writes its job documents into r, one for each
 * choice: ids from id (oai_choice_id) and tenant as given, input from messages (chat; content
 * as a string or text parts, null only in an assistant message with tool_calls) or prompt (a
 * string or a list of token ids, or a list of those: one prompt each), max_tokens
 * (max_completion_tokens for chat wins; absent means max_tokens_limit), temperature, top_p,
 * top_k, seed (choice i of a prompt draws from seed + i), stop, ...; n choices of each
 * prompt. model, when present, must be model_name (oai_model_ok). The job documents are then checked with
 * job_decode, so every limit of the contract applies. Returns 0 (the caller then calls
 * oai_req_free), or the HTTP status of the error in *e (400, or 404 for another model); r
 * holds no jobs then. */
int oai_to_job(enum oai_kind kind, const char *body, size_t len, const char *model_name,
	       const char *id, const char *tenant, int max_tokens_limit, struct oai_req *r,
	       struct oai_err *e);
/* As oai_to_job, for a body already parsed (an object; not taken): the chat request an API on
 * the chat path made. */
int oai_json_to_job(enum oai_kind kind, const json_t *root, const char *model_name,
		    const char *id, const char *tenant, int max_tokens_limit, struct oai_req *r,
		    struct oai_err *e);
/* Whether a request's model is the one served. names is model_name as oai_to_job takes it:
 * the served name, then its aliases (--model-alias), each after a newline and each a shell
 * glob (fnmatch: "claude-*", "*"). */
bool oai_model_ok(const char *names, const char *model);

/* The "text" members of parts (each a string, checked), total bytes in all, joined; NULL
 * when out of memory. */
json_t *oai_join_text(const json_t *parts, size_t total);
/* The text of c, a string or a list of {"type": "text", "text": STRING} items (what names c
 * in a message, items what its entries are called: "parts", "blocks"), joined; NULL after a
 * 400 naming param (over JOB_PROMPT_MAX bytes: prompt_too_long) or a 500 in *e. */
json_t *oai_text_parts(const json_t *c, const char *param, const char *what, const char *items,
		       struct oai_err *e);

/* A result document (job.h), parsed. Strings point into root. */
struct oai_result {
	json_t *root;
	bool completed;
	const char *text;
	size_t text_len;
	const char *finish_reason; /* "stop", "length", "tool_calls", or NULL */
	const json_t *tool_calls;  /* output.tool_calls (OpenAI's), or NULL when none; text is
				    * then the content before them */
	const json_t *logprobs;    /* output.logprobs.content (an array), or NULL */
	const json_t *prompt_logprobs; /* output.prompt_logprobs (an array), or NULL */
	const json_t *prompt_ids;      /* output.prompt_token_ids, or NULL */
	bool echo;                 /* set by the caller: the request's echo (oai_response puts
				    * the prompt first, from prompt_logprobs) */
	int echo_top;              /* ... and oai_req's echo_top (read with plp: the prompt's
				    * entries may then hold more alternatives than echo shows) */
	bool plp;                  /* ... and whether its plp_top is >= 0: the response has
				    * prompt_logprobs (vLLM's shape) with plp_top alternatives */
	int plp_top;
	const char *stop_sequence; /* output.stop_sequence: the stop string that ended it, or NULL */
	const char *reasoning;     /* output.reasoning_content (thinking on), or NULL */
	size_t reasoning_len;
	const char *err_code, *err_message;
	int64_t prompt_tokens, completion_tokens, cost_micro_usd;
	int64_t cached_tokens;     /* usage.prompt_tokens_details.cached_tokens (0: none) */
	int64_t accepted_prediction_tokens, rejected_prediction_tokens; /* speculation's */
	double gpu_seconds, queue_seconds;
};

/* Returns WK_OK or WK_EFORMAT; on success the caller calls oai_result_free. */
int oai_result_parse(const char *json, size_t len, struct oai_result *r);
void oai_result_free(struct oai_result *r);

/* The HTTP error for a result that did not complete (contract code -> status). */
void oai_result_error(const struct oai_result *r, struct oai_err *e);

/* The whole response of a completed request: chat.completion or text_completion. */
json_t *oai_response(enum oai_kind kind, const char *id, long created, const char *model,
		     const struct oai_result *r);
/* ... of n choices (rs[i] is choice i's result, per_prompt choices of each prompt): the
 * choices in order, and their usage summed (oai_usage_sum). */
json_t *oai_response_n(enum oai_kind kind, const char *id, long created, const char *model,
		       const struct oai_result *rs, int n, int per_prompt);
/* The usage of n choices as one result's (only its usage members are set; oai_result_free
 * it): the prompt tokens of each prompt once (its first choice's, and its cached tokens), and
 * the completion tokens, drafts, GPU seconds and cost of every choice summed; queue_seconds
 * the longest wait. */
int oai_usage_sum(const struct oai_result *rs, int n, int per_prompt, struct oai_result *sum);
/* Sets a stream chunk's choice index (the chunk builders make index 0). */
void oai_chunk_index(json_t *chunk, int index);

/* One stream chunk: text[0..len) as delta.content (chat) or text (completion), with the
 * assistant role on a chat's first chunk, and finish_reason (NULL: null). NULL when out of
 * memory or text is not valid UTF-8. */
json_t *oai_chunk(enum oai_kind kind, const char *id, long created, const char *model,
		  const char *text, size_t len, bool role, const char *finish_reason);

/* A choice's logprobs for the entries content (output.logprobs.content's): chat's
 * {"content": [...]}, or the legacy completions' {"tokens", "token_logprobs",
 * "top_logprobs" ({token: logprob} each), "text_offset"}, the offsets in characters from
 * *offset on, which it advances past them. NULL when out of memory. */
json_t *oai_logprobs(enum oai_kind kind, const json_t *content, size_t *offset);
/* Sets a chunk's choice's logprobs to lp (a reference of its own; NULL: leaves null). */
void oai_chunk_logprobs(json_t *chunk, json_t *lp);
/* The completions stream's first chunk with echo: the prompt's text (its entries' bytes,
 * output.prompt_logprobs'), and with logprobs their legacy shape from *offset on. NULL when
 * out of memory. */
json_t *oai_echo_chunk(const char *id, long created, const char *model, const json_t *entries,
		       bool logprobs, size_t *offset);

/* The usage chunk of stream_options.include_usage: "choices": [] and "usage". */
/* A chat stream's chunk of reasoning (delta.reasoning_content). */
json_t *oai_reasoning_chunk(const char *id, long created, const char *model, const char *text,
			    size_t len);
/* A chat stream's chunk with the result's tool calls (r->tool_calls, not NULL), each whole
 * with its index, as one delta. */
json_t *oai_calls_chunk(const char *id, long created, const char *model,
			const struct oai_result *r);
json_t *oai_usage_chunk(enum oai_kind kind, const char *id, long created, const char *model,
			const struct oai_result *r);

/* ---- the Responses API (http_responses.c) ---- */

/* A POST /v1/responses body into the chat completions request that runs it (*chat, for
 * oai_to_job's OAI_CHAT) and the response's members that say what was asked (*skel:
 * instructions, tools, text, temperature, ...). Returns 0, or the HTTP status of the error in
 * *e; both NULL then. */
int oai_responses_to_chat(const char *body, size_t len, json_t **chat, json_t **skel,
			  struct oai_err *e);
/* An error of oai_to_job on such a chat request, named as the Responses API names its
 * members (max_output_tokens, text.format, reasoning.effort, input). */
void oai_responses_err(struct oai_err *e);
/* The response object of a completed result (status completed, or incomplete at
 * max_output_tokens): output items reasoning, message (unless the answer is calls alone) and
 * function_call; usage in the Responses API's names. Item ids come from id (resp_HEX). */
json_t *oai_responses_object(const json_t *skel, const char *id, long created,
			     const char *model, const struct oai_result *r);

/* A response's stream: the typed events (each {"type", "sequence_number", ...}) in the order
 * OpenAI's clients accumulate them. Each call returns an array of events to send (NULL only
 * when out of memory). */
struct oai_rstream {
	const json_t *skel;
	char id[48];
	long created;
	char model[256];
	int seq;       /* the next sequence_number */
	int n_items;   /* output items begun */
	int open;      /* the item open: none, reasoning or message */
	char item[64]; /* ... and its id */
	char *acc;     /* ... and its text so far */
	size_t acc_len, acc_cap;
	json_t *items; /* the items done */
	json_t *lp;    /* the message's logprobs so far (NULL: not asked) */
};
int oai_rstream_init(struct oai_rstream *s, const json_t *skel, const char *id, long created,
		     const char *model, bool logprobs);
void oai_rstream_free(struct oai_rstream *s);
/* response.created and response.in_progress */
json_t *oai_rstream_start(struct oai_rstream *s);
/* Text of the reasoning or of the answer (closing the item open when it is the other's, and
 * opening its own), with the logprobs entries that came with it (NULL: none). */
json_t *oai_rstream_text(struct oai_rstream *s, bool reasoning, const char *text, size_t len,
			 const json_t *lp);
/* The end: the items open done, the function calls, and response.completed (or
 * response.incomplete) with the whole response, its output the items streamed. */
json_t *oai_rstream_end(struct oai_rstream *s, const struct oai_result *r);
/* response.failed, with the error. */
json_t *oai_rstream_fail(struct oai_rstream *s, const struct oai_err *e);

/* Kept responses (POST /v1/responses with store, the default): previous_response_id goes on
 * from one, GET and DELETE /v1/responses/ID read and drop one. In the server's memory, the
 * most recently used first, bounded by entries and bytes; a tenant sees only its own. */
struct oai_kept;
struct oai_kept *oai_kept_new(int max_entries, size_t max_bytes);
void oai_kept_free(struct oai_kept *k);
/* Keeps response id of tenant: the conversation through it (chat messages: the input and the
 * answer, not the instructions) and its response object (references taken); the least
 * recently used go past the bounds (never the one just kept). WK_OK or WK_ENOMEM. */
int oai_kept_put(struct oai_kept *k, const char *id, const char *tenant, json_t *conversation,
		 json_t *object);
/* Whether tenant has response id kept: then its conversation and object (either pointer may
 * be NULL), borrowed until the next put or delete. */
bool oai_kept_get(struct oai_kept *k, const char *id, const char *tenant,
		  const json_t **conversation, const json_t **object);
bool oai_kept_delete(struct oai_kept *k, const char *id, const char *tenant);
int oai_kept_count(const struct oai_kept *k);
/* The first n chat messages as the Responses API's items: a message each (user, system and
 * developer with an input_text part, assistant with an output_text part), an assistant's
 * reasoning_content as a reasoning item before its message and its tool_calls as
 * function_call items after it (the message left out when the turn is calls alone after
 * another role's message), a tool message as a function_call_output. What
 * oai_responses_to_chat reads back as the same messages. An answer's items (answer_of[i]: the
 * id of the response whose answer message i is; answer_of NULL, or an entry NULL: none
 * known) have the ids that response's output gave them; another item's id hashes the
 * messages up to it, so that it is the same in every response whose conversation holds it.
 * NULL when out of memory. */
json_t *oai_messages_items(const json_t *msgs, size_t n, const char *const *answer_of);
/* A kept response's input items (its conversation less the answer, which ends it; answer_of
 * as oai_messages_items'): a list object {"object": "list", "data", "first_id", "last_id",
 * "has_more"} of at most limit items, in order (asc) or newest first, those after item id
 * after (NULL: from the first); NULL after the error in *e (a 400 for an after that names no
 * item). */
json_t *oai_input_items_list(const json_t *conversation, const char *const *answer_of, int limit,
			     bool asc, const char *after, struct oai_err *e);
/* A result as the assistant's chat message: its content, reasoning_content and tool_calls. */
json_t *oai_result_message(const struct oai_result *r);

/* ---- Anthropic's Messages API (http_anthropic.c) ---- */

/* As oai_responses_to_chat, for a POST /v1/messages body (*skel is an empty object). */
int oai_messages_to_chat(const char *body, size_t len, json_t **chat, json_t **skel,
			 struct oai_err *e);
/* ... for POST /v1/messages/count_tokens: the same, max_tokens not required, no skeleton
 * (the route drops the members that counting does not run: max_tokens, stream). */
int oai_messages_count_chat(const char *body, size_t len, json_t **chat, struct oai_err *e);
/* chat's error named as Anthropic's API names its members (stop_sequences) */
void oai_messages_err(struct oai_err *e);
/* An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}. */
json_t *oai_messages_error(const struct oai_err *e);
/* The message of a completed result: content blocks thinking, text and tool_use;
 * stop_reason end_turn, max_tokens, stop_sequence or tool_use; usage in Anthropic's names
 * (input_tokens those not read from the cache). */
json_t *oai_messages_object(const json_t *skel, const char *id, long created,
			    const char *model, const struct oai_result *r);

/* An API served on the chat path: its request into chat's, and chat's results in its
 * shapes, whole or streamed (an oai_rstream, oai_rstream_init'd). */
struct oai_api {
	const char *name;
	const char *id_prefix; /* its ids': "resp_", "msg_" */
	bool hold_max_tokens;  /* a max_tokens over the server's limit is held to it, and one past
				* the context runs to its end, not refused (Anthropic's clients ask
				* 32,000 and more by default) */
	int (*to_chat)(const char *body, size_t len, json_t **chat, json_t **skel,
		       struct oai_err *e);
	void (*err)(struct oai_err *e);            /* chat's error in its names */
	json_t *(*error)(const struct oai_err *e); /* an error's body */
	json_t *(*object)(const json_t *skel, const char *id, long created, const char *model,
			  const struct oai_result *r);
	json_t *(*start)(struct oai_rstream *s);
	json_t *(*text)(struct oai_rstream *s, bool reasoning, const char *text, size_t len,
			const json_t *lp);
	json_t *(*end)(struct oai_rstream *s, const struct oai_result *r);
	json_t *(*fail)(struct oai_rstream *s, const struct oai_err *e);
};
extern const struct oai_api oai_responses_api, oai_messages_api;

/* ---- API keys ---- */

#define HTTP_KEYS_MAX 10000
#define HTTP_KEY_LEN_MAX 256

struct http_key {
	char *key;
	size_t len;
	char tenant[129];
};

/* Parses a keys file's text: one "KEY TENANT" per line, blank lines and lines starting with
 * '#' skipped; tenants as job ids ([A-Za-z0-9._-]{1,128}); a repeated key is an error. The
 * keys are appended to *keys (realloc'd; *n counts them). Messages name the line, never the
 * key. WK_OK, WK_EFORMAT, WK_ELIMIT or WK_ENOMEM. */
int http_keys_parse(const char *text, size_t len, const char *path, struct http_key **keys,
		    int *n, char *err, size_t errsz);

/* The tenant of a key (compared in constant time over every key), or NULL. */
const char *http_keys_find(const struct http_key *keys, int n, const char *key, size_t len);

#endif
