/*
 * http_openai.c - OpenAI's request and response shapes for the HTTP endpoint, and the API key
 * file. Pure: see http_int.h.
 *
 * A request becomes the contract's job document (job.h) and is then checked by job_decode,
 * so the HTTP path and the queue path share every limit and message. A request for several
 * choices (n, or a list of prompts) becomes one job a choice, which the server joins back into
 * one response. What the contract cannot express (suffix, best_of > 1) is refused with a 400
 * rather than silently ignored; each one's neutral value (best_of 1, penalties 0, an empty
 * logit_bias, ...) is accepted, as clients send them by default.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/http_int.h"
#include "worker/job.h"

#define IRE "invalid_request_error"

int oai_errf(struct oai_err *e, int status, const char *type, const char *code,
	     const char *param, const char *fmt, ...)
{
	e->status = status;
	e->type = type;
	e->code = code;
	e->param = param;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	return status;
}

json_t *oai_error_json(const struct oai_err *e)
{
	return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type",
			 e->type ? e->type : IRE, "param", e->param, "code", e->code);
}

/* ---- requests ---- */

/* A member that must be absent, null, or satisfy ok(v). */
static bool absent(const json_t *v)
{
	return !v || json_is_null(v);
}

/* Copies the job's message without the "input." prefixes (the HTTP request has no "input"). */
static void strip_input(char *dst, size_t n, const char *src)
{
	size_t o = 0;
	while (*src && o + 1 < n) {
		if (!strncmp(src, "input.", 6)) {
			src += 6;
			continue;
		}
		dst[o++] = *src++;
	}
	dst[o] = 0;
}

/* The request parameter a job error's message (after strip_input) begins with, as OpenAI's
 * "param" names it; NULL when it names none of them. */
static const char *error_param(const char *msg)
{
	static const char *const names[] = {"temperature", "top_p",    "top_k",  "seed",
					    "stop",        "max_tokens", "prompt", "messages",
					    "prediction",  "top_logprobs", "logprobs", "presence_penalty",
					    "frequency_penalty", "repetition_penalty", "logit_bias",
					    "response_format"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		size_t k = strlen(names[i]);
		if (!strncmp(msg, names[i], k) && !(isalnum((unsigned char)msg[k]) || msg[k] == '_'))
			return names[i];
	}
	return NULL;
}

/* Chat message m's content: a string or a list of {"type": "text", "text": S} parts,
 * concatenated. Absent or null only in an assistant message with tool_calls (or the older
 * function_call), as OpenAI allows: that is the one message whose text may be nothing, and it
 * renders as empty; in any other message it is a 400 naming the field, not an empty prompt.
 * Returns a new JSON string, or NULL with *e set. */
static json_t *content_text(const json_t *m, const char *role, const char *param,
			    const char *what, struct oai_err *e)
{
	const json_t *c = json_object_get(m, "content");
	if (absent(c)) {
		if (!strcmp(role, "assistant") && (!absent(json_object_get(m, "tool_calls")) ||
						   !absent(json_object_get(m, "function_call"))))
			return json_string("");
		oai_errf(e, 400, IRE, "invalid_input", param,
			 "%s.content: %s (role %.40s); it must be a string or a list of "
			 "text parts", what, c ? "null" : "missing", role);
		return NULL;
	}
	char full[64];
	snprintf(full, sizeof full, "%s.content", what);
	return oai_text_parts(c, param, full, "parts", e);
}

json_t *oai_text_parts(const json_t *c, const char *param, const char *what, const char *items,
		       struct oai_err *e)
{
	if (json_is_string(c))
		return json_stringn(json_string_value(c), json_string_length(c));
	if (!json_is_array(c)) {
		oai_errf(e, 400, IRE, "invalid_input", param,
			 "%s must be a string or a list of text %s", what, items);
		return NULL;
	}
	size_t total = 0, k;
	json_t *part;
	json_array_foreach(c, k, part) {
		const json_t *t = json_object_get(part, "text");
		if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
		    strcmp(json_string_value(json_object_get(part, "type")), "text") ||
		    !json_is_string(t)) {
			oai_errf(e, 400, IRE, "invalid_input", param,
				 "%s[%zu]: only {\"type\": \"text\", \"text\": STRING} %s are "
				 "supported", what, k, items);
			return NULL;
		}
		total += json_string_length(t);
		if (total > JOB_PROMPT_MAX) {
			oai_errf(e, 400, IRE, "prompt_too_long", param,
				 "%s holds more than %u bytes of text", what, JOB_PROMPT_MAX);
			return NULL;
		}
	}
	json_t *s = oai_join_text(c, total);
	if (!s)
		oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	return s;
}

json_t *oai_join_text(const json_t *parts, size_t total)
{
	char *buf = malloc(total + 1);
	if (!buf)
		return NULL;
	size_t o = 0, k;
	json_t *part;
	json_array_foreach(parts, k, part) {
		const json_t *t = json_object_get(part, "text");
		memcpy(buf + o, json_string_value(t), json_string_length(t));
		o += json_string_length(t);
	}
	json_t *s = json_stringn(buf, o);
	free(buf);
	return s;
}

/* OpenAI's predicted output, {"type": "content", "content": TEXT or text parts}, into
 * input.prediction: a source of speculative drafts (wick worker --speculate), never of the
 * output itself. */
static int prediction(const json_t *root, json_t *input, struct oai_err *e)
{
	const json_t *p = json_object_get(root, "prediction");
	if (absent(p))
		return 0;
	const json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
	if (!json_is_string(t) || strcmp(json_string_value(t), "content"))
		return oai_errf(e, 400, IRE, "invalid_input", "prediction",
				"prediction must be {\"type\": \"content\", \"content\": ...}");
	if (absent(json_object_get(p, "content")))
		return oai_errf(e, 400, IRE, "invalid_input", "prediction",
				"prediction.content must be a string or a list of text parts");
	json_t *text = content_text(p, "prediction", "prediction", "prediction", e);
	if (!text)
		return e->status;
	if (json_object_set_new(input, "prediction", text))
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	return 0;
}

static int chat_messages(const json_t *msgs, json_t *input, struct oai_err *e)
{
	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return oai_errf(e, 400, IRE, "invalid_input", "messages",
				"messages must be a non-empty array of {\"role\", \"content\"}");
	json_t *out = json_array();
	if (!out || json_object_set_new(input, "messages", out))
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	size_t i;
	json_t *m;
	json_array_foreach(msgs, i, m) {
		const json_t *role = json_object_get(m, "role");
		if (!json_is_object(m) || !json_is_string(role))
			return oai_errf(e, 400, IRE, "invalid_input", "messages",
					"messages[%zu] must be an object with a string \"role\"", i);
		const char *r = json_string_value(role);
		if (!strcmp(r, "developer"))
			r = "system";
		if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
		    strcmp(r, "tool"))
			return oai_errf(e, 400, IRE, "invalid_input", "messages",
					"messages[%zu].role '%.40s' is not system, developer, user, "
					"assistant or tool", i, json_string_value(role));
		char what[32];
		snprintf(what, sizeof what, "messages[%zu]", i);
		json_t *text = content_text(m, json_string_value(role), "messages", what, e);
		if (!text)
			return e->status;
		/* an assistant's reasoning_content (what a thinking turn gave) goes back into its
		 * text as <think>...</think>, where the template finds it */
		const json_t *rc = json_object_get(m, "reasoning_content");
		if (!strcmp(r, "assistant") && json_is_string(rc) && json_string_length(rc)) {
			size_t a = json_string_length(rc), b = json_string_length(text);
			char *cat = malloc(a + b + 16);
			if (cat) {
				memcpy(cat, "<think>", 7);
				memcpy(cat + 7, json_string_value(rc), a);
				memcpy(cat + 7 + a, "</think>", 8);
				memcpy(cat + 15 + a, json_string_value(text), b);
			}
			json_decref(text);
			text = cat ? json_stringn(cat, a + b + 15) : NULL;
			free(cat);
			if (!text)
				return oai_errf(e, 500, "server_error", "internal", NULL,
						"out of memory");
		}
		json_t *msg = json_pack("{s:s, s:o}", "role", r, "content", text);
		/* an assistant's tool calls go as they are (job_decode checks them); a tool
		 * message's tool_call_id is not rendered (GLM's template has no place for it) */
		const json_t *calls = json_object_get(m, "tool_calls");
		if (!msg || (!absent(calls) && json_object_set(msg, "tool_calls", (json_t *)calls)) ||
		    json_array_append_new(out, msg))
			return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	return 0;
}

/* Whether p is one prompt: a string, or a non-empty list of token ids (job_decode checks
 * them). */
static bool one_prompt(const json_t *p)
{
	return json_is_string(p) || (json_array_size(p) && json_is_integer(json_array_get(p, 0)));
}

/* The completions' prompts, into *out (a new array): a string or a list of token ids, or a
 * list of those (lm-evaluation-harness sends a batch of id lists). */
static int completion_prompts(const json_t *p, json_t **out, struct oai_err *e)
{
	*out = NULL;
	if (!one_prompt(p) && !(json_array_size(p) && !json_is_integer(json_array_get(p, 0))))
		return oai_errf(e, 400, IRE, "invalid_input", "prompt",
				"prompt must be a string or a list of token ids, or a list of "
				"those");
	if (json_array_size(p) > OAI_CHOICES_MAX && !one_prompt(p))
		return oai_errf(e, 400, IRE, "invalid_input", "prompt",
				"prompt is a list of %zu prompts; this server takes at most %d a "
				"request", json_array_size(p), OAI_CHOICES_MAX);
	size_t i;
	const json_t *q;
	json_array_foreach(one_prompt(p) ? NULL : p, i, q)
		if (!one_prompt(q))
			return oai_errf(e, 400, IRE, "invalid_input", "prompt",
					"prompt[%zu] must be a string or a non-empty list of token "
					"ids", i);
	*out = one_prompt(p) ? json_pack("[O]", p) : json_copy((json_t *)p);
	if (!*out)
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	return 0;
}

/* Members the contract cannot honour: refused so the client is not misled. */
static int unsupported(enum oai_kind kind, const json_t *root, struct oai_err *e)
{
	const json_t *v;
	if (!absent(v = json_object_get(root, "n")) &&
	    !(json_is_integer(v) && json_integer_value(v) >= 1 &&
	      json_integer_value(v) <= OAI_CHOICES_MAX))
		return oai_errf(e, 400, IRE, "invalid_input", "n",
				"n is the number of choices: an integer from 1 to %d",
				OAI_CHOICES_MAX);
	if (kind == OAI_CHAT) {
		if (!absent(v = json_object_get(root, "tools")) && !json_is_array(v))
			return oai_errf(e, 400, IRE, "invalid_input", "tools",
					"tools must be an array of {\"type\": \"function\", "
					"\"function\": {...}}");
		/* the older names of tools, and the choice among them: the model chooses (auto) or
		 * calls none; "required" or a function by name (the answer then starts with the
		 * call: worker.c); the older function_call only auto or none */
		if (!absent(v = json_object_get(root, "functions")) &&
		    !(json_is_array(v) && json_array_size(v) == 0))
			return oai_errf(e, 400, IRE, "invalid_input", "functions",
					"functions (the older form) are not supported: give tools");
		if (!absent(v = json_object_get(root, "function_call")) &&
		    !(json_is_string(v) && (!strcmp(json_string_value(v), "none") ||
					    !strcmp(json_string_value(v), "auto"))))
			return oai_errf(e, 400, IRE, "invalid_input", "function_call",
					"function_call: only \"none\" or \"auto\" (give tools and "
					"tool_choice)");
		const char *name = json_string_value(
			json_object_get(json_object_get(v = json_object_get(root, "tool_choice"),
							"function"), "name"));
		if (!absent(v) && !(json_is_string(v) && (!strcmp(json_string_value(v), "none") ||
							  !strcmp(json_string_value(v), "auto") ||
							  !strcmp(json_string_value(v), "required"))) &&
		    !name)
			return oai_errf(e, 400, IRE, "invalid_input", "tool_choice",
					"tool_choice is \"none\", \"auto\", \"required\" or "
					"{\"type\": \"function\", \"function\": {\"name\": ...}}");
	} else {
		if (!absent(v = json_object_get(root, "echo")) && !json_is_boolean(v))
			return oai_errf(e, 400, IRE, "invalid_input", "echo",
					"echo must be true or false");
		if (!absent(json_object_get(root, "suffix")))
			return oai_errf(e, 400, IRE, "invalid_input", "suffix",
					"suffix is not supported");
		if (!absent(v = json_object_get(root, "best_of")) &&
		    !(json_is_integer(v) && json_integer_value(v) == 1))
			return oai_errf(e, 400, IRE, "invalid_input", "best_of",
					"only best_of = 1 is supported");
	}
	return 0;
}

/* Whether a chat reasons first (GLM's thinking): vLLM's and SGLang's
 * chat_template_kwargs.enable_thinking, Z.ai's thinking.type ("enabled" or "disabled"), or
 * OpenAI's reasoning_effort ("none" and "minimal" off, "low", "medium" and "high" on); off
 * when none is given. Into input.thinking. */
static int thinking(const json_t *root, json_t *input, struct oai_req *r, struct oai_err *e)
{
	const json_t *kw = json_object_get(root, "chat_template_kwargs"), *v;
	int on = -1;
	if (!absent(kw) && !json_is_object(kw))
		return oai_errf(e, 400, IRE, "invalid_input", "chat_template_kwargs",
				"chat_template_kwargs must be an object");
	if (!absent(v = json_object_get(kw, "enable_thinking"))) {
		if (!json_is_boolean(v))
			return oai_errf(e, 400, IRE, "invalid_input", "chat_template_kwargs",
					"chat_template_kwargs.enable_thinking must be true or false");
		on = json_is_true(v);
	}
	if (!absent(v = json_object_get(root, "thinking"))) {
		const char *t = json_string_value(json_object_get(v, "type"));
		if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled")))
			return oai_errf(e, 400, IRE, "invalid_input", "thinking",
					"thinking must be {\"type\": \"enabled\"} or "
					"{\"type\": \"disabled\"}");
		on = !strcmp(t, "enabled");
	}
	if (!absent(v = json_object_get(root, "reasoning_effort"))) {
		static const char *const names[] = {"none", "minimal", "low", "medium", "high"};
		const char *t = json_string_value(v);
		int k = 0;
		while (t && k < 5 && strcmp(t, names[k]))
			k++;
		if (!t || k == 5)
			return oai_errf(e, 400, IRE, "invalid_input", "reasoning_effort",
					"reasoning_effort is none, minimal, low, medium or high");
		on = k >= 2;
	}
	if (on > 0) {
		r->thinking = true;
		if (json_object_set_new(input, "thinking", json_true()))
			return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	return 0;
}

/* Log probabilities: chat's logprobs (true or false) and top_logprobs (0 to 20, with logprobs
 * true); the legacy completions' logprobs, the number of top tokens (0 to 20: OpenAI allows 5,
 * vLLM 20), on for any integer. Into input.logprobs and input.top_logprobs (job_decode checks
 * chat's). */
static int logprobs(enum oai_kind kind, const json_t *root, json_t *input, struct oai_req *r,
		    struct oai_err *e)
{
	const json_t *v = json_object_get(root, "logprobs");
	const json_t *top = kind == OAI_CHAT ? json_object_get(root, "top_logprobs") : v;
	if (kind == OAI_COMPLETION) {
		if (absent(v) || json_is_false(v))
			return 0;
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > JOB_TOP_LOGPROBS_MAX)
			return oai_errf(e, 400, IRE, "invalid_input", "logprobs",
					"logprobs is the number of most likely tokens to list with "
					"each token: an integer from 0 to %d", JOB_TOP_LOGPROBS_MAX);
		v = json_true();
	} else if (!absent(v)) {
		json_incref((json_t *)v);
	}
	r->logprobs = json_is_true(v);
	if ((!absent(v) && json_object_set_new(input, "logprobs", (json_t *)v)) ||
	    (!absent(top) && json_object_set(input, "top_logprobs", (json_t *)top)))
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	return 0;
}

static int stream_flags(const json_t *root, struct oai_req *r, struct oai_err *e)
{
	const json_t *v = json_object_get(root, "stream");
	if (!absent(v)) {
		if (!json_is_boolean(v))
			return oai_errf(e, 400, IRE, "invalid_input", "stream",
					"stream must be true or false");
		r->stream = json_is_true(v);
	}
	v = json_object_get(root, "stream_options");
	if (!absent(v)) {
		const json_t *u = json_object_get(v, "include_usage");
		if (!json_is_object(v) || (!absent(u) && !json_is_boolean(u)))
			return oai_errf(e, 400, IRE, "invalid_input", "stream_options",
					"stream_options must be an object; include_usage a boolean");
		r->include_usage = json_is_true(u);
		if (!r->stream)
			return oai_errf(e, 400, IRE, "invalid_input", "stream_options",
					"stream_options is only allowed when stream is true");
	}
	return 0;
}

/* OpenAI's legacy completions stop at 16 tokens unless told (vLLM's too); chat runs on */
#define COMPLETION_DEFAULT_MAX 16

static int max_tokens(enum oai_kind kind, const json_t *root, int limit, json_t *input,
		      bool echo, bool *given, struct oai_err *e)
{
	const char *name = "max_tokens";
	const json_t *v = json_object_get(root, name);
	/* chat's newer name, taken on /v1/completions too rather than ignored there */
	if (!absent(json_object_get(root, "max_completion_tokens"))) {
		name = "max_completion_tokens";
		v = json_object_get(root, name);
	}
	json_int_t n = kind == OAI_COMPLETION && limit > COMPLETION_DEFAULT_MAX
			       ? COMPLETION_DEFAULT_MAX : limit;
	*given = !absent(v);
	if (!absent(v)) {
		if (!json_is_integer(v))
			return oai_errf(e, 400, IRE, "invalid_input", name, "%s must be an integer",
					name);
		n = json_integer_value(v);
		if (n < !echo || n > limit) /* (0 with echo: the prompt scored) */
			return oai_errf(e, 400, IRE, "max_tokens_range", name,
					"%s is %lld; this server allows %d to %d%s", name,
					(long long)n, !echo, limit, echo ? "" : " (0 with echo)");
	}
	if (json_object_set_new(input, "max_tokens", json_integer(n)))
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	return 0;
}

void oai_choice_id(char *out, size_t size, const char *id, int index, int n_choices)
{
	if (n_choices > 1)
		snprintf(out, size, "%s-%d", id, index);
	else
		snprintf(out, size, "%s", id);
}

void oai_req_free(struct oai_req *r)
{
	for (int i = 0; i < r->n_choices && r->jobs; i++)
		free(r->jobs[i]);
	for (int i = 0; i < r->n_choices && r->decoded; i++) {
		job_free(r->decoded[i]);
		free(r->decoded[i]);
	}
	free(r->jobs);
	free(r->job_lens);
	free(r->decoded);
	r->jobs = NULL;
	r->job_lens = NULL;
	r->decoded = NULL;
	r->n_choices = 0;
}

/* The job documents of a request's choices: input with prompt p (prompts: NULL for chat),
 * for each of n choices of each prompt, in that order; with a seed, the choice i of each
 * prompt draws from seed + i (so a prompt's first choice is the one a lone request gives).
 * Not streamed, and generating, only a prompt's first choice scores the prompt
 * (prompt_logprobs, echo): the response gives the others its entries (oai_response_n), and
 * they copy its prefill rather than run every prompt row again. The first choice of each
 * prompt is checked with job_decode: the others differ only in their id, seed and scoring. */
static int make_jobs(struct oai_req *r, const char *id, const char *tenant, const json_t *input,
		     const json_t *prompts, int n, struct oai_err *e)
{
	const json_t *mt = json_object_get(input, "max_tokens");
	bool once = !r->stream && json_object_get(input, "prompt_logprobs") &&
		    !(json_is_integer(mt) && json_integer_value(mt) == 0); /* (a job of max_tokens 0
									       * scores or is refused) */
	int np = prompts ? (int)json_array_size(prompts) : 1;
	if ((long)np * n > OAI_CHOICES_MAX)
		return oai_errf(e, 400, IRE, "invalid_input", "n",
				"%d prompts with n %d are %ld choices; this server makes at most %d "
				"a request", np, n, (long)np * n, OAI_CHOICES_MAX);
	r->per_prompt = n;
	r->jobs = calloc((size_t)(np * n), sizeof *r->jobs);
	r->job_lens = calloc((size_t)(np * n), sizeof *r->job_lens);
	r->decoded = calloc((size_t)(np * n), sizeof *r->decoded);
	if (!r->jobs || !r->job_lens || !r->decoded) {
		oai_req_free(r);
		return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	const json_t *seed = json_object_get(input, "seed");
	size_t total = 0;
	for (int c = 0; c < np * n; c++) {
		char cid[64];
		oai_choice_id(cid, sizeof cid, id, c, np * n);
		json_t *in = json_copy((json_t *)input), *job = NULL;
		bool ok = in && (!prompts || !json_object_set(in, "prompt",
							       json_array_get(prompts,
									      (size_t)(c / n))));
		if (ok && c % n && json_is_integer(seed) && json_integer_value(seed) >= 0)
			ok = !json_object_set_new(in, "seed", json_integer((json_int_t)(
				((uint64_t)json_integer_value(seed) + (uint64_t)(c % n)) &
				(uint64_t)INT64_MAX)));
		if (ok && c % n && once)
			ok = !json_object_del(in, "prompt_logprobs");
		if (ok)
			job = json_pack("{s:s, s:s, s:o}", "id", cid, "tenant", tenant, "input", in);
		else
			json_decref(in);
		r->jobs[c] = job ? json_dumps(job, JSON_COMPACT) : NULL;
		json_decref(job);
		r->n_choices = c + 1;
		if (!r->jobs[c]) {
			oai_req_free(r);
			return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
		}
		r->job_lens[c] = strlen(r->jobs[c]);
		if ((total += r->job_lens[c]) > OAI_JOBS_BYTES_MAX) {
			oai_req_free(r);
			return oai_errf(e, 400, IRE, "request_too_large", "n",
					"the request's %d choices come to more than %d bytes of "
					"jobs (each holds its prompt); ask for fewer", np * n,
					OAI_JOBS_BYTES_MAX);
		}
		if (c % n)
			continue;
		struct job j;
		char msg[WK_ERRSZ], clean[WK_ERRSZ];
		enum job_err jerr = job_decode(r->jobs[c], r->job_lens[c], NULL, &j, msg, sizeof msg);
		if (jerr == JOB_OK && (r->decoded[c] = malloc(sizeof j))) {
			*r->decoded[c] = j; /* (kept: the worker takes it, not the document again) */
			continue;
		}
		job_free(&j);
		if (jerr == JOB_OK)
			continue;
		oai_req_free(r);
		strip_input(clean, sizeof clean, msg);
		if (jerr == JOB_EINTERNAL)
			return oai_errf(e, 500, "server_error", job_err_code(jerr), NULL, "%s", clean);
		const char *param = error_param(clean);
		if (np > 1 && param && !strcmp(param, "prompt"))
			return oai_errf(e, 400, IRE, job_err_code(jerr), param, "prompt[%d]: %s",
					c / n, clean);
		return oai_errf(e, 400, IRE, job_err_code(jerr), param, "%s", clean);
	}
	return 0;
}

json_t *oai_load_object(const char *body, size_t len, struct oai_err *e)
{
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		oai_errf(e, 400, IRE, "invalid_json", NULL,
			 "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
			 je.column);
	} else if (!json_is_object(root)) {
		oai_errf(e, 400, IRE, "invalid_json", NULL, "the body must be a JSON object");
		json_decref(root);
		root = NULL;
	}
	return root;
}

int oai_api_chat(const char *body, size_t len, json_t **chat, json_t **skel,
		 int (*fill)(const json_t *root, json_t *chat, json_t *msgs, struct oai_err *e),
		 json_t *(*skeleton)(const json_t *root), struct oai_err *e)
{
	*chat = *skel = NULL;
	json_t *root = oai_load_object(body, len, e);
	if (!root)
		return e->status;
	json_t *c = json_object(), *msgs = json_array();
	int st = !c || !msgs || json_object_set(c, "messages", msgs)
			 ? oai_errf(e, 500, "server_error", "internal", NULL, "out of memory")
			 : fill(root, c, msgs, e);
	if (!st && !(*skel = skeleton(root)))
		st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	if (!st) {
		*chat = c;
		c = NULL;
	}
	json_decref(msgs);
	json_decref(c);
	json_decref(root);
	return st;
}

int oai_copy_members(const json_t *root, json_t *chat, const char *const (*names)[2], size_t n,
		     struct oai_err *e)
{
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_object_get(root, names[i][0]);
		if (!absent(v) && json_object_set(chat, names[i][1], v))
			return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
	}
	return 0;
}

int oai_to_job(enum oai_kind kind, const char *body, size_t len, const char *model_name,
	       const char *id, const char *tenant, int max_tokens_limit, struct oai_req *r,
	       struct oai_err *e)
{
	memset(r, 0, sizeof *r);
	json_t *root = oai_load_object(body, len, e);
	if (!root)
		return e->status;
	int st = oai_json_to_job(kind, root, model_name, id, tenant, max_tokens_limit, r, e);
	json_decref(root);
	return st;
}

bool oai_model_ok(const char *names, const char *model)
{
	size_t n = strcspn(names, "\n");
	if (strlen(model) == n && !strncmp(names, model, n))
		return true;
	char pat[256];
	for (const char *p = names + n; *p == '\n'; p += n) {
		p++;
		n = strcspn(p, "\n");
		snprintf(pat, sizeof pat, "%.*s", (int)n, p);
		if (n < sizeof pat && !fnmatch(pat, model, 0))
			return true;
	}
	return false;
}

int oai_json_to_job(enum oai_kind kind, const json_t *root, const char *model_name,
		    const char *id, const char *tenant, int max_tokens_limit, struct oai_req *r,
		    struct oai_err *e)
{
	memset(r, 0, sizeof *r);
	int st = 0;
	json_t *input = json_object(), *prompts = NULL;
	const json_t *v;
	if (!input) {
		st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
		goto out;
	}
	if (!absent(v = json_object_get(root, "model"))) {
		if (!json_is_string(v)) {
			st = oai_errf(e, 400, IRE, "invalid_input", "model", "model must be a string");
			goto out;
		}
		if (!oai_model_ok(model_name, json_string_value(v)) ||
		    strlen(json_string_value(v)) != json_string_length(v)) {
			st = oai_errf(e, 404, IRE, "model_not_found", "model",
				      "The model '%.200s' does not exist; this server serves '%.*s'",
				      json_string_value(v), (int)strcspn(model_name, "\n"),
				      model_name);
			goto out;
		}
	}
	if ((st = stream_flags(root, r, e)) || (st = unsupported(kind, root, e)))
		goto out;
	if (kind == OAI_CHAT)
		st = chat_messages(json_object_get(root, "messages"), input, e);
	else
		st = completion_prompts(json_object_get(root, "prompt"), &prompts, e);
	r->echo = kind == OAI_COMPLETION && json_is_true(json_object_get(root, "echo"));
	if (st || (st = max_tokens(kind, root, max_tokens_limit, input,
				   r->echo || !absent(json_object_get(root, "prompt_logprobs")),
				   &r->max_given, e)) ||
	    (st = prediction(root, input, e)))
		goto out;
	if ((kind == OAI_CHAT && (st = thinking(root, input, r, e))) ||
	    (st = logprobs(kind, root, input, r, e)))
		goto out;
	/* echo: the prompt's tokens as the model read them, scored where logprobs are asked;
	 * vLLM's prompt_logprobs: the prompt scored, with that many alternatives */
	v = json_object_get(root, "logprobs");
	r->echo_top = r->echo && r->logprobs ? (int)json_integer_value(v) : 0;
	r->plp_top = -1;
	if (!absent(v = json_object_get(root, "prompt_logprobs"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > JOB_TOP_LOGPROBS_MAX) {
			st = oai_errf(e, 400, IRE, "invalid_input", "prompt_logprobs",
				      "prompt_logprobs is the number of most likely tokens to list "
				      "with each prompt token: an integer from 0 to %d",
				      JOB_TOP_LOGPROBS_MAX);
			goto out;
		}
		if (r->stream) {
			st = oai_errf(e, 400, IRE, "invalid_input", "prompt_logprobs",
				      "prompt_logprobs is not available with stream: true");
			goto out;
		}
		r->plp_top = (int)json_integer_value(v);
	}
	int plp = r->echo && r->echo_top > r->plp_top ? r->echo_top : r->plp_top;
	if (plp >= 0 &&
	    json_object_set_new(input, "prompt_logprobs", json_integer(plp > 0 ? plp : 0))) {
		st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
		goto out;
	}
	v = json_object_get(root, "tool_choice");
	const json_t *tools = json_object_get(root, "tools");
	if (kind == OAI_CHAT && json_array_size(tools) &&
	    !(json_is_string(v) && !strcmp(json_string_value(v), "none"))) {
		const json_t *par = json_object_get(root, "parallel_tool_calls");
		if (json_object_set(input, "tools", (json_t *)tools) ||
		    (!absent(v) && json_object_set(input, "tool_choice", (json_t *)v)) ||
		    (!absent(par) && json_object_set(input, "parallel_tool_calls", (json_t *)par))) {
			st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
			goto out;
		}
		r->tools = true;
		r->forced = !absent(v) && !(json_is_string(v) && !strcmp(json_string_value(v),
									  "auto"));
	} else if (kind == OAI_CHAT && !absent(v) &&
		   (json_is_object(v) ||
		    (json_is_string(v) && !strcmp(json_string_value(v), "required")))) {
		st = oai_errf(e, 400, IRE, "invalid_input", "tool_choice",
			      "tool_choice asks for a call, and there are no tools");
		goto out;
	}
	static const char *const copied[] = {"temperature",	  "top_p",
					     "top_k",		  "seed",
					     "stop",		  "presence_penalty",
					     "frequency_penalty", "repetition_penalty",
					     "logit_bias",	  "response_format",
					     "continue_final_message"};
	for (size_t i = 0; i < sizeof copied / sizeof copied[0]; i++)
		if (!absent(v = json_object_get(root, copied[i])) &&
		    json_object_set(input, copied[i], (json_t *)v)) {
			st = oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
			goto out;
		}
	v = json_object_get(root, "n");
	st = make_jobs(r, id, tenant, input, prompts, absent(v) ? 1 : (int)json_integer_value(v), e);
out:
	json_decref(prompts);
	json_decref(input);
	return st;
}

/* ---- results ---- */

int oai_result_parse(const char *json, size_t len, struct oai_result *r)
{
	memset(r, 0, sizeof *r);
	/* a model can emit byte 0 (a byte-fallback token): the text may hold \u0000 */
	r->root = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
	if (!json_is_object(r->root)) {
		json_decref(r->root);
		r->root = NULL;
		return WK_EFORMAT;
	}
	const json_t *st = json_object_get(r->root, "status");
	const json_t *out = json_object_get(r->root, "output");
	const json_t *err = json_object_get(r->root, "error");
	const json_t *u = json_object_get(r->root, "usage");
	const json_t *t = json_object_get(out, "text");
	r->completed = json_is_string(st) && !strcmp(json_string_value(st), "COMPLETED");
	r->text = json_is_string(t) ? json_string_value(t) : "";
	r->text_len = json_is_string(t) ? json_string_length(t) : 0;
	r->finish_reason = json_string_value(json_object_get(out, "finish_reason"));
	r->stop_sequence = json_string_value(json_object_get(out, "stop_sequence"));
	const json_t *rs = json_object_get(out, "reasoning_content");
	r->reasoning = json_string_value(rs);
	r->reasoning_len = json_string_length(rs);
	const json_t *lp = json_object_get(json_object_get(out, "logprobs"), "content");
	r->logprobs = json_is_array(lp) ? lp : NULL;
	lp = json_object_get(out, "prompt_logprobs");
	r->prompt_logprobs = json_is_array(lp) ? lp : NULL;
	r->prompt_ids = json_object_get(out, "prompt_token_ids");
	r->tool_calls = json_array_size(json_object_get(out, "tool_calls"))
				? json_object_get(out, "tool_calls")
				: NULL;
	r->err_code = json_string_value(json_object_get(err, "code"));
	r->err_message = json_string_value(json_object_get(err, "message"));
	r->prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
	r->completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
	r->cached_tokens = json_integer_value(json_object_get(
		json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
	const json_t *det = json_object_get(u, "completion_tokens_details");
	r->accepted_prediction_tokens =
		json_integer_value(json_object_get(det, "accepted_prediction_tokens"));
	r->rejected_prediction_tokens =
		json_integer_value(json_object_get(det, "rejected_prediction_tokens"));
	r->cost_micro_usd = json_integer_value(json_object_get(u, "cost_micro_usd"));
	r->gpu_seconds = json_number_value(json_object_get(u, "gpu_seconds"));
	r->queue_seconds = json_number_value(json_object_get(u, "queue_seconds"));
	return WK_OK;
}

void oai_result_free(struct oai_result *r)
{
	json_decref(r->root);
	r->root = NULL;
}

void oai_result_error(const struct oai_result *r, struct oai_err *e)
{
	const char *code = r->err_code ? r->err_code : "internal";
	const char *msg = r->err_message ? r->err_message : "the request failed";
	int status = 500;
	const char *type = "server_error";
	if (!strcmp(code, "invalid_json") || !strcmp(code, "invalid_input") ||
	    !strcmp(code, "prompt_too_long") || !strcmp(code, "max_tokens_range")) {
		status = 400;
		type = IRE;
	} else if (!strcmp(code, "timeout")) {
		status = 504;
	} else if (!strcmp(code, "cancelled")) {
		status = 503;
	}
	oai_errf(e, status, type, code, NULL, "%s", msg);
}

static json_t *usage_json(const struct oai_result *r)
{
	json_t *u = json_pack("{s:I, s:I, s:I, s:f, s:f, s:I}", "prompt_tokens",
			      (json_int_t)r->prompt_tokens, "completion_tokens",
			      (json_int_t)r->completion_tokens, "total_tokens",
			      (json_int_t)(r->prompt_tokens + r->completion_tokens), "queue_seconds",
			      r->queue_seconds, "gpu_seconds", r->gpu_seconds, "cost_micro_usd",
			      (json_int_t)r->cost_micro_usd);
	/* speculative decoding's drafts, kept and not (OpenAI's names, as for its predicted
	 * outputs) */
	json_t *d = json_object_get(json_object_get(r->root, "usage"), "completion_tokens_details");
	if (u && json_is_object(d))
		json_object_set(u, "completion_tokens_details", d);
	/* the prompt's tokens a prefix cache held (OpenAI's name) */
	if (u && r->cached_tokens > 0)
		json_object_set_new(u, "prompt_tokens_details",
				    json_pack("{s:I}", "cached_tokens",
					      (json_int_t)r->cached_tokens));
	return u;
}

/* Characters of UTF-8 bytes s[0..n): the bytes that do not continue a sequence (a token that
 * ends inside a character counts it once, where it begins). */
static size_t chars(const char *s, size_t n)
{
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xC0) != 0x80;
	return c;
}

/* The legacy completions' shape of entries (output.logprobs.content's), each with at most
 * `most` alternatives (-1: all). */
static json_t *legacy_logprobs_n(const json_t *content, size_t *offset, int most)
{
	json_t *o = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
			      "top_logprobs", "text_offset");
	json_t *tokens = json_object_get(o, "tokens"), *lps = json_object_get(o, "token_logprobs");
	json_t *tops = json_object_get(o, "top_logprobs"), *offs = json_object_get(o, "text_offset");
	size_t i, k;
	const json_t *en, *t;
	if (!o)
		return NULL;
	json_array_foreach(content, i, en) {
		const json_t *tok = json_object_get(en, "token");
		/* (a prompt's first token: null, and no alternatives) */
		bool none = json_is_null(json_object_get(en, "logprob"));
		json_t *top = none ? json_null() : json_object();
		json_array_foreach(json_object_get(en, "top_logprobs"), k, t)
			if (most < 0 || (int)k < most)
				json_object_set(top, json_string_value(json_object_get(t, "token")),
						json_object_get(t, "logprob"));
		if (!top || json_array_append_new(tops, top) /* (which takes top either way) */ ||
		    json_array_append(tokens, (json_t *)tok) ||
		    json_array_append(lps, json_object_get(en, "logprob")) ||
		    json_array_append_new(offs, json_integer((json_int_t)*offset))) {
			json_decref(o);
			return NULL;
		}
		*offset += chars(json_string_value(tok), json_string_length(tok));
	}
	return o;
}

static json_t *legacy_logprobs(const json_t *content, size_t *offset)
{
	return legacy_logprobs_n(content, offset, -1);
}

/* vLLM's prompt_logprobs from entries (output.prompt_logprobs') and their token ids
 * (output.prompt_token_ids): [null, {"ID": {"logprob", "rank", "decoded_token"}, ...}, ...],
 * each position's token first (its rank among the vocabulary), then its `most` likeliest
 * tokens (ranks 1, 2, ...), the token itself once. NULL when out of memory. */
static json_t *vllm_prompt_logprobs(const json_t *entries, const json_t *ids, int most)
{
	json_t *out = json_array();
	size_t i, k;
	const json_t *en, *t;
	json_array_foreach(entries, i, en) {
		if (!out)
			return NULL;
		const json_t *lp = json_object_get(en, "logprob");
		json_t *pos = json_is_null(lp) ? json_null() : json_object();
		char key[24];
		snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_array_get(ids, i)));
		bool ok = pos && !json_array_append_new(out, pos);
		if (ok && !json_is_null(lp))
			ok = !json_object_set_new(pos, key, json_pack("{s:O, s:O, s:O}", "logprob", lp,
								       "rank", json_object_get(en, "rank"),
								       "decoded_token",
								       json_object_get(en, "token")));
		json_array_foreach(json_object_get(en, "top_logprobs"), k, t) {
			if (!ok || (int)k >= most)
				break;
			snprintf(key, sizeof key, "%lld",
				 (long long)json_integer_value(json_object_get(t, "id")));
			if (!json_object_get(pos, key))
				ok = !json_object_set_new(pos, key,
							  json_pack("{s:O, s:I, s:O}", "logprob",
								    json_object_get(t, "logprob"),
								    "rank", (json_int_t)k + 1,
								    "decoded_token",
								    json_object_get(t, "token")));
		}
		if (!ok) {
			json_decref(out);
			return NULL;
		}
	}
	return out;
}

json_t *oai_logprobs(enum oai_kind kind, const json_t *content, size_t *offset)
{
	if (kind == OAI_COMPLETION)
		return legacy_logprobs(content, offset);
	return json_pack("{s:o}", "content", json_copy((json_t *)content)); /* (its own array) */
}

void oai_chunk_logprobs(json_t *chunk, json_t *lp)
{
	json_t *c = json_array_get(json_object_get(chunk, "choices"), 0);
	if (c && lp)
		json_object_set(c, "logprobs", lp);
}

/* The text of entries (output.prompt_logprobs'): their bytes, or where those are not UTF-8
 * (a prompt of token ids may cut a character) their tokens. */
static json_t *entries_text(const json_t *entries)
{
	size_t n = 0, nt = 0, i, k;
	const json_t *en, *b;
	json_array_foreach(entries, i, en) {
		n += json_array_size(json_object_get(en, "bytes"));
		nt += json_string_length(json_object_get(en, "token"));
	}
	char *t = malloc((n > nt ? n : nt) + 1);
	if (!t)
		return NULL;
	n = 0;
	json_array_foreach(entries, i, en)
		json_array_foreach(json_object_get(en, "bytes"), k, b)
			t[n++] = (char)json_integer_value(b);
	json_t *s = json_stringn(t, n);
	if (!s) {
		n = 0;
		json_array_foreach(entries, i, en) {
			const json_t *tok = json_object_get(en, "token");
			if (json_is_string(tok))
				memcpy(t + n, json_string_value(tok), json_string_length(tok));
			n += json_string_length(tok);
		}
		s = json_stringn(t, n);
	}
	free(t);
	return s;
}

json_t *oai_echo_chunk(const char *id, long created, const char *model, const json_t *entries,
		       bool logprobs, size_t *offset)
{
	json_t *text = entries_text(entries);
	json_t *c = text ? oai_chunk(OAI_COMPLETION, id, created, model, json_string_value(text),
				     json_string_length(text), false, NULL)
			 : NULL;
	json_decref(text);
	if (c && logprobs) {
		json_t *lp = legacy_logprobs(entries, offset);
		oai_chunk_logprobs(c, lp);
		json_decref(lp);
	}
	return c;
}

/* echo: the prompt's entries and the output's, one array */
static json_t *echoed(const json_t *prompt, const json_t *content)
{
	json_t *all = json_copy((json_t *)prompt);
	if (all && content && json_array_extend(all, (json_t *)content)) {
		json_decref(all);
		return NULL;
	}
	return all;
}

/* With vLLM's prompt_logprobs asked (r->plp), o's "prompt_logprobs" from r's; returns o,
 * or NULL (o freed) when out of memory. */
static json_t *prompt_logprobs_set(json_t *o, const struct oai_result *r)
{
	if (!o || !r->plp)
		return o;
	json_t *v = r->prompt_logprobs ? vllm_prompt_logprobs(r->prompt_logprobs, r->prompt_ids,
							      r->plp_top)
				       : json_null();
	if (!v || json_object_set_new(o, "prompt_logprobs", v)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* A choice of the response: r's text (after its prompt with echo), logprobs, reasoning and
 * tool calls; a completion's prompt_logprobs (vLLM's). */
static json_t *choice_json(enum oai_kind kind, const struct oai_result *r, int index)
{
	const char *fin = r->finish_reason ? r->finish_reason : "stop";
	if (kind == OAI_COMPLETION && r->echo && r->prompt_logprobs) { /* the prompt first */
		json_t *pt = entries_text(r->prompt_logprobs);
		size_t pl = json_string_length(pt), offset = 0;
		char *t = pt ? malloc(pl + r->text_len + 1) : NULL;
		json_t *all = r->logprobs ? echoed(r->prompt_logprobs, r->logprobs) : NULL;
		json_t *choice = NULL;
		if (t && (all || !r->logprobs)) {
			memcpy(t, json_string_value(pt), pl);
			memcpy(t + pl, r->text, r->text_len);
			choice = json_pack("{s:i, s:s%, s:o?, s:s}", "index", index, "text", t,
					   pl + r->text_len, "logprobs",
					   all ? legacy_logprobs_n(all, &offset,
								   r->plp ? r->echo_top : -1)
					       : json_null(),
					   "finish_reason", fin);
		}
		free(t);
		json_decref(pt);
		json_decref(all);
		return prompt_logprobs_set(choice, r);
	}
	json_t *choice = kind == OAI_CHAT
		? json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s}", "index", index, "message", "role",
			    "assistant", "content", r->text, r->text_len, "logprobs", "finish_reason",
			    fin)
		: json_pack("{s:i, s:s%, s:n, s:s}", "index", index, "text", r->text, r->text_len,
			    "logprobs", "finish_reason", fin);
	if (!choice)
		return NULL;
	size_t offset = 0;
	if (r->logprobs)
		json_object_set_new(choice, "logprobs", oai_logprobs(kind, r->logprobs, &offset));
	if (kind == OAI_CHAT && r->reasoning) /* vLLM's and DeepSeek's name */
		json_object_set_new(json_object_get(choice, "message"), "reasoning_content",
				    json_stringn(r->reasoning, r->reasoning_len));
	if (kind == OAI_CHAT && r->tool_calls) { /* OpenAI's: content null when there is none */
		json_t *msg = json_object_get(choice, "message");
		if (!r->text_len)
			json_object_set_new(msg, "content", json_null());
		json_object_set(msg, "tool_calls", (json_t *)r->tool_calls);
	}
	return kind == OAI_COMPLETION ? prompt_logprobs_set(choice, r) : choice;
}

int oai_usage_sum(const struct oai_result *rs, int n, int per_prompt, struct oai_result *sum)
{
	memset(sum, 0, sizeof *sum);
	json_int_t kept = 0, thrown = 0;
	bool details = false;
	for (int i = 0; i < n; i++) {
		const struct oai_result *r = &rs[i];
		if (per_prompt < 1 || i % per_prompt == 0) {
			sum->prompt_tokens += r->prompt_tokens;
			sum->cached_tokens += r->cached_tokens;
		}
		sum->completion_tokens += r->completion_tokens;
		sum->cost_micro_usd += r->cost_micro_usd;
		sum->gpu_seconds += r->gpu_seconds;
		if (r->queue_seconds > sum->queue_seconds)
			sum->queue_seconds = r->queue_seconds;
		kept += r->accepted_prediction_tokens;
		thrown += r->rejected_prediction_tokens;
		details |= json_is_object(json_object_get(json_object_get(r->root, "usage"),
							  "completion_tokens_details"));
	}
	sum->accepted_prediction_tokens = kept;
	sum->rejected_prediction_tokens = thrown;
	sum->completed = true;
	sum->root = details ? json_pack("{s:{s:{s:I, s:I}}}", "usage", "completion_tokens_details",
					"accepted_prediction_tokens", kept,
					"rejected_prediction_tokens", thrown)
			    : json_object();
	return sum->root ? WK_OK : WK_ENOMEM;
}

json_t *oai_response_n(enum oai_kind kind, const char *id, long created, const char *model,
		       const struct oai_result *rs, int n, int per_prompt)
{
	struct oai_result sum = {0};
	json_t *choices = json_array();
	bool ok = choices && oai_usage_sum(rs, n, per_prompt, &sum) == WK_OK;
	for (int i = 0; ok && i < n; i++) {
		struct oai_result ri = rs[i]; /* (a prompt's first choice scored it for all) */
		if (!ri.prompt_logprobs && per_prompt > 0) {
			ri.prompt_logprobs = rs[i - i % per_prompt].prompt_logprobs;
			ri.prompt_ids = rs[i - i % per_prompt].prompt_ids;
		}
		ok = !json_array_append_new(choices, choice_json(kind, &ri, i));
	}
	json_t *resp = ok ? json_pack("{s:s, s:s, s:I, s:s, s:O, s:o}", "id", id, "object",
				      kind == OAI_CHAT ? "chat.completion" : "text_completion",
				      "created", (json_int_t)created, "model", model, "choices",
				      choices, "usage", usage_json(n == 1 ? &rs[0] : &sum))
			  : NULL;
	json_decref(choices);
	oai_result_free(&sum);
	/* (a chat's one prompt: vLLM puts its prompt_logprobs beside the choices) */
	return kind == OAI_CHAT && n > 0 ? prompt_logprobs_set(resp, &rs[0]) : resp;
}

json_t *oai_response(enum oai_kind kind, const char *id, long created, const char *model,
		     const struct oai_result *r)
{
	return oai_response_n(kind, id, created, model, r, 1, 1);
}

void oai_chunk_index(json_t *chunk, int index)
{
	json_t *c = json_array_get(json_object_get(chunk, "choices"), 0);
	if (c)
		json_object_set_new(c, "index", json_integer(index));
}

json_t *oai_chunk(enum oai_kind kind, const char *id, long created, const char *model,
		  const char *text, size_t len, bool role, const char *finish_reason)
{
	json_t *choice;
	if (kind == OAI_CHAT) {
		json_t *delta = json_object();
		if (!delta)
			return NULL;
		if (role)
			json_object_set_new(delta, "role", json_string("assistant"));
		if (len || role) {
			json_t *s = json_stringn(text, len);
			if (!s) {
				json_decref(delta);
				return NULL;
			}
			json_object_set_new(delta, "content", s);
		}
		choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta,
				   "logprobs", "finish_reason", finish_reason);
	} else {
		choice = json_pack("{s:i, s:s%, s:n, s:s?}", "index", 0, "text", text, len,
				   "logprobs", "finish_reason", finish_reason);
	}
	if (!choice)
		return NULL;
	return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
			 kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)created, "model", model, "choices", choice);
}

json_t *oai_reasoning_chunk(const char *id, long created, const char *model, const char *text,
			    size_t len)
{
	json_t *s = json_stringn(text, len);
	if (!s)
		return NULL;
	json_t *choice = json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta",
				   "reasoning_content", s, "logprobs", "finish_reason");
	if (!choice)
		return NULL;
	return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object", "chat.completion.chunk",
			 "created", (json_int_t)created, "model", model, "choices", choice);
}

json_t *oai_calls_chunk(const char *id, long created, const char *model,
			const struct oai_result *r)
{
	json_t *calls = json_array();
	size_t i;
	json_t *c;
	json_array_foreach(r->tool_calls, i, c) { /* each whole, with its index */
		json_t *d = json_deep_copy(c);
		if (!d || json_object_set_new(d, "index", json_integer((json_int_t)i))) {
			json_decref(d);
			json_decref(calls);
			return NULL;
		}
		if (json_array_append_new(calls, d)) { /* (which took d) */
			json_decref(calls);
			return NULL;
		}
	}
	json_t *choice = json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta", "tool_calls",
				   calls, "logprobs", "finish_reason");
	if (!choice)
		return NULL;
	return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object", "chat.completion.chunk",
			 "created", (json_int_t)created, "model", model, "choices", choice);
}

json_t *oai_usage_chunk(enum oai_kind kind, const char *id, long created, const char *model,
			const struct oai_result *r)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
			 kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)created, "model", model, "choices", "usage", usage_json(r));
}

/* ---- API keys ---- */

int http_keys_parse(const char *text, size_t len, const char *path, struct http_key **keys,
		    int *n, char *err, size_t errsz)
{
	int line = 0;
	size_t i = 0;
	while (i < len) {
		size_t e = i;
		while (e < len && text[e] != '\n')
			e++;
		line++;
		char buf[1024];
		size_t l = e - i;
		if (l >= sizeof buf)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: line %d is longer than %zu bytes",
				       path, line, sizeof buf - 1);
		memcpy(buf, text + i, l);
		buf[l] = 0;
		i = e + 1;
		char *save = NULL, *key = strtok_r(buf, " \t\r", &save);
		if (!key || key[0] == '#')
			continue;
		char *tenant = strtok_r(NULL, " \t\r", &save);
		if (!tenant || strtok_r(NULL, " \t\r", &save))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: line %d: want \"KEY TENANT\"",
				       path, line);
		size_t kl = strlen(key);
		if (kl > HTTP_KEY_LEN_MAX)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: line %d: the key is longer than "
				       "%d bytes", path, line, HTTP_KEY_LEN_MAX);
		for (size_t k = 0; k < kl; k++)
			if ((unsigned char)key[k] < 0x21 || (unsigned char)key[k] > 0x7e)
				return wk_errf(err, errsz, WK_EFORMAT, "%s: line %d: a key is "
					       "printable ASCII", path, line);
		if (!job_id_valid(tenant))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: line %d: the tenant must match "
				       "[A-Za-z0-9._-]{1,128}", path, line);
		if (http_keys_find(*keys, *n, key, kl))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: line %d: a key given twice",
				       path, line);
		if (*n >= HTTP_KEYS_MAX)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: more than %d keys", path,
				       HTTP_KEYS_MAX);
		struct http_key *k = realloc(*keys, (size_t)(*n + 1) * sizeof *k);
		if (!k)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		*keys = k;
		k[*n] = (struct http_key){.key = strdup(key), .len = kl};
		if (!k[*n].key)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		snprintf(k[*n].tenant, sizeof k[*n].tenant, "%s", tenant);
		(*n)++;
	}
	return WK_OK;
}

const char *http_keys_find(const struct http_key *keys, int n, const char *key, size_t len)
{
	const char *found = NULL;
	for (int i = 0; i < n; i++) {
		unsigned char d = keys[i].len != len;
		for (size_t k = 0; k < keys[i].len; k++)
			d |= (unsigned char)(keys[i].key[k] ^ (k < len ? key[k] : 0));
		if (!d && !found)
			found = keys[i].tenant;
	}
	return found;
}
