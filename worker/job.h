/*
 * job.h - the job JSON a queue delivers, and the result JSON a worker stores.
 *
 * Pure functions: no I/O, no globals, no clock. Safe to call from any thread, and the
 * decoder is the target a fuzzer drives.
 *
 * Job (the contract in BRIEF.md):
 *   {"id": "abc", "tenant": "t1", "timeout_s": 600,
 *    "input": {"prompt": "..." | [token ids]  |  "messages": [{"role": "user", ...}, ...],
 *              "max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
 *              "seed": 1, "stop": "\n" | ["a", "b"], "stream": false,
 *              "logprobs": false, "top_logprobs": 0, "presence_penalty": 0,
 *              "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {"ID": bias},
 *              "prompt_logprobs": N,
 *              "response_format": {"type": "text" | "json_object" | "json_schema",
 *                                  "json_schema": {"name", "schema", "strict"}}}}
 * Unknown members are ignored, so producers may add fields. Every input has a limit below.
 * A prompt of token ids is the model's input as it is (no BOS added; the worker checks each
 * id against the vocabulary). prompt_logprobs (0 to 20, vLLM's) scores the prompt: each of
 * its tokens' log probability after those before it, and N alternatives; with it max_tokens
 * may be 0 (the prompt scored, nothing generated).
 * "stream": true asks for the text as it is made, where the queue has a channel for it (Redis:
 * STREAM:stream:<id>; the RunPod job API's stream URL); the result is whole either way.
 *
 * Result:
 *   {"id", "status": "COMPLETED"|"FAILED"|"TIMED_OUT"|"CANCELLED",
 *    "output": {"text", "token_ids", "finish_reason"}, "error": {"code", "message"},
 *    (output.stop_sequence: the stop string that ended the text, where one did)
 *    (with input.logprobs, output.logprobs: {"content": [{"token", "logprob", "bytes",
 *    "top_logprobs": [{"token", "logprob", "bytes"}]}]}, OpenAI's chat shape, an entry for each
 *    of token_ids: the model's own log probabilities, before temperature and the filters;
 *    with input.prompt_logprobs, output.prompt_logprobs: the same entries for each token of
 *    the prompt as the model read it, the first with "logprob": null, and its token_ids
 *    output.prompt_token_ids; each of these entries also has "rank" (1 + the tokens the
 *    model found likelier, vLLM's), and each alternative its token's "id")
 *    "usage": {"prompt_tokens", "completion_tokens", "queue_seconds", "gpu_seconds",
 *              "cost_usd", "cost_micro_usd"}, "worker", "attempt"}
 * "error" is present exactly when status is not COMPLETED. cost_usd is cost_micro_usd / 1e6,
 * printed with 6 decimals from the integer, so the two never disagree.
 */
#ifndef JOB_H
#define JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits (bytes are UTF-8 bytes of the decoded string) ---- */
#define JOB_ID_MAX 128             /* id and tenant: [A-Za-z0-9._-]{1,128} */
#define JOB_BODY_MAX (4u << 20)    /* a whole job document */
#define JOB_PROMPT_MAX (1u << 20)  /* prompt, or the sum of all message contents */
#define JOB_PROMPT_IDS_MAX 262144  /* a prompt of token ids: 1 to this many */
#define JOB_MESSAGES_MAX 8192      /* messages in one chat (an agent's many tool calls) */
#define JOB_ROLE_MAX 32            /* bytes of a message role */
#define JOB_STOP_MAX 16            /* stop strings */
#define JOB_TOOLS_MAX 128          /* input.tools: functions */
#define JOB_CALLS_MAX 64           /* tool calls in one assistant message */
#define JOB_NAME_MAX 256           /* bytes of a function's name */
#define JOB_STOP_LEN_MAX 256       /* bytes of one stop string (at least 1) */
#define JOB_MAX_TOKENS_MAX 131072  /* max_tokens must be 1..this (0: prompt_logprobs) */
#define JOB_MAX_TOKENS_DEFAULT 256
#define JOB_TEMPERATURE_MAX 2.0    /* temperature in [0, 2]; 0 is greedy */
#define JOB_TOP_K_MAX 1000000      /* top_k in [0, this]; 0 disables */
#define JOB_TOP_LOGPROBS_MAX 20    /* top_logprobs in [0, this] (OpenAI's limit) */
#define JOB_PENALTY_MAX 2.0        /* presence and frequency penalties in [-this, this] */
#define JOB_REPETITION_MAX 10.0    /* repetition_penalty in (0, this] */
#define JOB_BIAS_MAX 100.0         /* a logit_bias value in [-this, this] */
#define JOB_BIAS_IDS_MAX 1024      /* ids in logit_bias */
#define JOB_TIMEOUT_MAX 86400.0    /* timeout_s in (0, one day] */
#define JOB_TIMEOUT_DEFAULT 600.0

/* The error codes of the contract, in its order. JOB_OK is not an error. */
enum job_err {
	JOB_OK = 0,
	JOB_EINVALID_JSON,    /* not JSON, or not a JSON object */
	JOB_EINVALID_INPUT,   /* a member missing, of the wrong type, or past a limit */
	JOB_EPROMPT_TOO_LONG, /* the engine's verdict (context length); also prompts > JOB_PROMPT_MAX */
	JOB_EMAX_TOKENS,      /* max_tokens outside 1..JOB_MAX_TOKENS_MAX */
	JOB_ETIMEOUT,         /* the job ran past timeout_s */
	JOB_ECANCELLED,       /* cancelled through the queue's channel */
	JOB_EENGINE,          /* the engine failed */
	JOB_EINTERNAL,        /* anything else, dead-lettering included */
};

/* "invalid_json", ...; "internal" for an unknown value. Never NULL. */
const char *job_err_code(enum job_err e);

enum job_status { JOB_COMPLETED, JOB_FAILED, JOB_TIMED_OUT, JOB_CANCELLED };
/* "COMPLETED", ...; never NULL. */
const char *job_status_name(enum job_status s);

struct job_call {        /* an assistant message's tool call */
	char *name;      /* malloc'd, NUL-terminated */
	char *arguments; /* malloc'd: a JSON object's text */
};

struct job_message {
	char role[JOB_ROLE_MAX + 1];
	char *content; /* malloc'd, NUL-terminated (a NUL inside is refused) */
	struct job_call *calls; /* an assistant's tool_calls [n_calls] (malloc'd), or NULL */
	int n_calls;
};

struct job {
	char id[JOB_ID_MAX + 1];
	char tenant[JOB_ID_MAX + 1]; /* "" when absent */
	char *prompt;                /* malloc'd; NULL when messages or token ids are given */
	int *prompt_ids;             /* input.prompt as token ids [n_prompt_ids], malloc'd */
	int n_prompt_ids;
	struct job_message *messages;
	int n_messages;
	int max_tokens;
	float temperature; /* default 1.0 */
	float top_p;       /* (0, 1], default 1.0 */
	int top_k;         /* default 0 (off) */
	uint64_t seed;     /* default 0; has_seed says whether the job gave one */
	bool has_seed;
	char *stop[JOB_STOP_MAX]; /* malloc'd, NUL-terminated */
	int n_stop;
	double timeout_s;
	bool stream; /* input.stream: the text as it is made, where the queue can carry it */
	bool logprobs; /* input.logprobs: each token's log probability in the result */
	int top_logprobs; /* input.top_logprobs: and the most likely tokens in its place */
	bool prompt_logprobs; /* input.prompt_logprobs given: the prompt's tokens' too, */
	int prompt_top;       /* ... with this many alternatives */
	/* OpenAI's penalties (0: off) and vLLM's repetition_penalty (1: off): sched_req's */
	float presence_penalty, frequency_penalty, repetition_penalty;
	/* input.response_format: json (json_object or json_schema), schema the json_schema's
	 * text (malloc'd; NULL: any JSON object); checked by gram_compile (grammar.h) */
	bool json;
	char *schema;
	int *bias_id;     /* input.logit_bias: {"ID": bias} as ids (< 2^31; the worker checks
			   * them against the vocabulary) and biases [n_bias], malloc'd */
	float *bias;
	int n_bias;
	bool one_call; /* input.parallel_tool_calls false: a result has its first tool call only */
	bool thinking; /* input.thinking (a chat): the model reasons first (GLM's thinking on);
			* the result's output.reasoning_content holds what it reasoned */
	bool continue_final; /* input.continue_final_message (vLLM's; Anthropic's prefill): the
			      * last message, the assistant's, is the answer's start, continued
			      * (no generation prompt after it); thinking off, no forced call */
	char *prediction; /* input.prediction: text the output is expected to repeat (malloc'd;
			   * NULL: none), a source of speculative drafts (wick worker --speculate) */
	char *tools;      /* input.tools: OpenAI's function tools as a JSON array's text (malloc'd;
			   * NULL: none), rendered into the chat prompt (engine/chat.h) */
	char *forced;     /* input.tool_choice "required" ("") or {"type": "function", "function":
			   * {"name": NAME}} (NAME): the answer starts with that call (malloc'd;
			   * NULL: "auto", the model chooses) */
};

/* True when s is a valid id: [A-Za-z0-9._-]{1,JOB_ID_MAX}, and not "." or "..". */
bool job_id_valid(const char *s);

/* Decodes body[0..len) into *j (which it clears first). queue_id is the id the queue
 * delivered the job under, or NULL: when given, a body without "id" takes it, and a body
 * whose "id" differs is invalid_input.
 * Returns JOB_OK, or the contract's error code with a one-line message in err. On error
 * j->id is still filled when an id is known (the body's valid id, else queue_id), so the
 * caller can store a FAILED result under it; the caller calls job_free() either way. */
enum job_err job_decode(const char *body, size_t len, const char *queue_id, struct job *j,
			char *err, size_t errsz);
void job_free(struct job *j); /* frees what job_decode allocated; safe twice, and on {0} */

/* A generated token's log probability (output.logprobs.content[i]): its text (bytes, which
 * may cut a UTF-8 sequence: "token" has U+FFFD for each invalid byte, "bytes" the bytes
 * themselves), and the n_top most likely tokens in its place, in the same form. */
struct job_top {
	const char *tok;
	size_t len;
	float lp;
	int id;        /* written as "id" where its entry has a rank */
};
struct job_logprob {
	const char *tok;
	size_t len;
	float lp;
	int n_top;
	const struct job_top *top;
	int rank;      /* written as "rank" where > 0, with the alternatives' ids
			* (output.prompt_logprobs') */
};

/* lp[0..n) as the JSON array of output.logprobs.content (OpenAI's entries), malloc'd and
 * NUL-terminated: what a stream's chunk carries for its tokens. NULL only when out of
 * memory. A logprob that is not finite is written as -9999 (JSON has no -Infinity). */
char *job_logprobs_json(const struct job_logprob *lp, int n, size_t *len);

/* A result to encode. Strings may be NULL (encoded as "" except where noted). */
struct job_result {
	const char *id;
	enum job_status status;
	const char *text;           /* output text */
	size_t text_len;            /* bytes of text; 0 with text != NULL means strlen(text) */
	const int *token_ids;       /* may be NULL when n_tokens == 0 */
	int n_tokens;
	const char *finish_reason;  /* "stop", "length", ...; NULL: null */
	const char *stop_sequence;  /* the stop string that ended it (output.stop_sequence), or
				     * NULL: none did */
	/* the tool calls the text made (chat_tool_calls' JSON: [{"name", "arguments"}], with
	 * text the content before them), or NULL: output.tool_calls, OpenAI's
	 * [{"id", "type": "function", "function": {"name", "arguments"}}], ids call_ID_N */
	const char *tool_calls;
	/* with has_logprobs: output.logprobs {"content": [logprobs[0..n_logprobs)]} */
	bool has_logprobs;
	const struct job_logprob *logprobs;
	int n_logprobs;
	/* with has_prompt_logprobs: output.prompt_logprobs [n_prompt_logprobs] (entry 0's
	 * logprob written null) and output.prompt_token_ids [n_prompt_logprobs] */
	bool has_prompt_logprobs;
	const struct job_logprob *prompt_logprobs;
	const int *prompt_ids;
	int n_prompt_logprobs;
	/* a chat with thinking on: its reasoning (the text before </think>), encoded as
	 * output.reasoning_content, and its tokens as usage.completion_tokens_details
	 * .reasoning_tokens (OpenAI's name); text is then what follows */
	bool has_reasoning;
	const char *reasoning;
	size_t reasoning_len;
	int reasoning_tokens;
	enum job_err err;           /* used when status != COMPLETED (JOB_OK then means internal) */
	const char *message;        /* error message */
	int prompt_tokens, completion_tokens;
	/* prompt tokens whose KV cache an earlier job left (the prefix cache: not run, and so not
	 * billed as run): usage.prompt_tokens_details.cached_tokens, OpenAI's name; 0: none */
	int cached_tokens;
	/* speculative decoding's drafts (sched.h), kept and thrown away; both 0: none (and
	 * not encoded), else usage.completion_tokens_details as OpenAI names them */
	int accepted_prediction_tokens, rejected_prediction_tokens;
	double queue_seconds, gpu_seconds;
	int64_t cost_micro_usd;
	const char *worker;
	int attempt;
};

/* Encodes r as one line of JSON (no newline), malloc'd and NUL-terminated; *len (when not
 * NULL) gets its length. Returns NULL only when out of memory. Strings that are not valid
 * UTF-8 are encoded with U+FFFD in place of each bad byte, so a result always encodes. */
char *job_encode_result(const struct job_result *r, size_t *len);

/* A piece of a streamed job's text as the chunk a stream channel carries:
 * {"output": {"text": "..."}}, with "attempt": N after it when attempt > 0; invalid UTF-8 as
 * in job_encode_result. malloc'd, NULL only when out of memory. */
char *job_stream_chunk(const char *text, size_t len, int attempt, size_t *len_out);

/* A FAILED (or other non-COMPLETED) result with no output: the shortcut for jobs that never
 * ran. Same return contract as job_encode_result. */
char *job_encode_error(const char *id, enum job_status status, enum job_err e, const char *message,
		       const char *worker, int attempt, size_t *len);

#endif
