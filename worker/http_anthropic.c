/*
 * http_anthropic.c - Anthropic's Messages API (POST /v1/messages, and
 * /v1/messages/count_tokens) on the chat path, as http_responses.c puts OpenAI's Responses
 * API there: a request becomes the chat completions request that runs it, and a result a
 * message, or a stream's events. So a coding agent that speaks Anthropic's API (pointed at
 * this server by its base URL) runs GLM with chat's template, tools and thinking. Pure.
 *
 * What maps to what:
 *   system (a string or text blocks)         a system message first
 *   messages: user text and tool_result       a user message; each tool_result a tool message
 *     blocks                                  (before the user's text, as they answer the
 *                                             turn before)
 *   messages: assistant text, thinking and    the assistant's content, reasoning_content and
 *     tool_use blocks                         tool_calls (the input as JSON arguments)
 *   max_tokens (required, as Anthropic's)     max_tokens
 *   stop_sequences                            stop
 *   tools ({name, description, input_schema}) function tools
 *   tool_choice auto, any, tool, none;        auto, required, a function, none;
 *     disable_parallel_tool_use               parallel_tool_calls false
 *   thinking enabled (or adaptive), disabled  thinking on, off (budget_tokens is not kept to)
 *   temperature, top_p, top_k                 the same
 * Refused by name: image and document blocks in a turn, server tools (web search, code
 * execution, computer use: this server runs no tools), and anything not an object where one
 * must be. An image or document in a tool's result stands as a note saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/http_int.h"
#include "worker/job.h"

#define IRE "invalid_request_error"

static bool absent(const json_t *v)
{
	return !v || json_is_null(v);
}

static int nomem(struct oai_err *e)
{
	return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
}

/* A tool_result's content: as oai_text_parts, but an image or document a tool returned (a
 * screenshot, a file read) stands as a note, not a refusal: an agent's loop goes on, and the
 * model knows something was there that it cannot read. */
#define UNREAD_NOTE "[%s the tool returned, left out: this model reads text]"
static json_t *tool_result_text(const json_t *c, const char *what, struct oai_err *e)
{
	if (!json_is_array(c))
		return oai_text_parts(c, "messages", what, "blocks", e);
	json_t *as_text = json_array();
	size_t k;
	json_t *b;
	json_array_foreach(as_text ? c : NULL, k, b) {
		const char *t = json_string_value(json_object_get(b, "type"));
		char note[96];
		if (t && (!strcmp(t, "image") || !strcmp(t, "document"))) {
			snprintf(note, sizeof note, UNREAD_NOTE, *t == 'i' ? "an image" : "a document");
			json_array_append_new(as_text, json_pack("{s:s, s:s}", "type", "text", "text",
								  note));
		} else {
			json_array_append(as_text, b);
		}
	}
	if (!as_text || json_array_size(as_text) != json_array_size(c)) {
		json_decref(as_text);
		nomem(e);
		return NULL;
	}
	json_t *s = oai_text_parts(as_text, "messages", what, "blocks", e);
	json_decref(as_text);
	return s;
}

/* Appends text to *acc (a string, NULL at first). */
static int cat(json_t **acc, const char *t, size_t n)
{
	size_t a = *acc ? json_string_length(*acc) : 0;
	char *buf = malloc(a + n + 1);
	if (!buf)
		return WK_ENOMEM;
	if (a)
		memcpy(buf, json_string_value(*acc), a);
	memcpy(buf + a, t, n);
	json_t *s = json_stringn(buf, a + n);
	free(buf);
	if (!s)
		return WK_ENOMEM;
	json_decref(*acc);
	*acc = s;
	return WK_OK;
}

/* A user turn's blocks: tool_result blocks as tool messages, then its text as a user
 * message. */
static int user_blocks(const json_t *blocks, size_t i, json_t *msgs, struct oai_err *e)
{
	json_t *text = NULL;
	size_t k;
	json_t *b;
	int st = 0;
	json_array_foreach(blocks, k, b) {
		const char *t = json_string_value(json_object_get(b, "type"));
		char what[96];
		if (t && !strcmp(t, "text") && json_is_string(json_object_get(b, "text"))) {
			const json_t *s = json_object_get(b, "text");
			if (cat(&text, json_string_value(s), json_string_length(s))) {
				st = nomem(e);
				break;
			}
		} else if (t && !strcmp(t, "tool_result")) {
			const char *id = json_string_value(json_object_get(b, "tool_use_id"));
			const json_t *c = json_object_get(b, "content");
			snprintf(what, sizeof what, "messages[%zu].content[%zu].content", i, k);
			json_t *out = absent(c) ? json_string("") : tool_result_text(c, what, e);
			if (!id) {
				json_decref(out);
				st = oai_errf(e, 400, IRE, "invalid_input", "messages",
					      "messages[%zu].content[%zu].tool_use_id must be a "
					      "string", i, k);
				break;
			}
			json_t *m = out ? json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id",
						    id, "content", out)
					: NULL;
			if (!m || json_array_append_new(msgs, m)) {
				st = out ? nomem(e) : e->status;
				break;
			}
		} else {
			st = oai_errf(e, 400, IRE, "invalid_input", "messages",
				      "messages[%zu].content[%zu]: %.40s blocks are not supported in a "
				      "user turn (text and tool_result are)", i, k,
				      t ? t : "untyped");
			break;
		}
	}
	if (!st && text && json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user",
								 "content", text)))
		st = nomem(e);
	json_decref(text);
	return st;
}

/* An assistant turn's blocks: its text, thinking (reasoning_content) and tool_use
 * (tool_calls). */
static int assistant_blocks(const json_t *blocks, size_t i, json_t *msgs, struct oai_err *e)
{
	json_t *text = NULL, *thinking = NULL, *calls = NULL;
	size_t k;
	json_t *b;
	int st = 0;
	json_array_foreach(blocks, k, b) {
		const char *t = json_string_value(json_object_get(b, "type"));
		const json_t *s;
		if (t && !strcmp(t, "text") && json_is_string(s = json_object_get(b, "text"))) {
			if (cat(&text, json_string_value(s), json_string_length(s)))
				st = nomem(e);
		} else if (t && !strcmp(t, "thinking") &&
			   json_is_string(s = json_object_get(b, "thinking"))) {
			if (cat(&thinking, json_string_value(s), json_string_length(s)))
				st = nomem(e);
		} else if (t && !strcmp(t, "redacted_thinking")) {
			continue; /* (another server's, unreadable here) */
		} else if (t && !strcmp(t, "tool_use")) {
			const char *id = json_string_value(json_object_get(b, "id"));
			const char *name = json_string_value(json_object_get(b, "name"));
			const json_t *in = json_object_get(b, "input");
			if (!id || !name || !json_is_object(in)) {
				st = oai_errf(e, 400, IRE, "invalid_input", "messages",
					      "messages[%zu].content[%zu]: a tool_use block has a "
					      "string id and name and an object input", i, k);
				break;
			}
			char *args = json_dumps(in, JSON_COMPACT);
			json_t *call = args ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
							"function", "function", "name", name,
							"arguments", args)
					    : NULL;
			free(args);
			if (!calls)
				calls = json_array();
			if (!call || !calls || json_array_append_new(calls, call))
				st = nomem(e);
		} else {
			st = oai_errf(e, 400, IRE, "invalid_input", "messages",
				      "messages[%zu].content[%zu]: %.40s blocks are not supported in an "
				      "assistant turn (text, thinking and tool_use are)", i, k,
				      t ? t : "untyped");
		}
		if (st)
			break;
	}
	json_t *m = st ? NULL : json_pack("{s:s, s:s}", "role", "assistant", "content", "");
	if (!st && (!m || (text && json_object_set(m, "content", text)) ||
		    (thinking && json_object_set(m, "reasoning_content", thinking)) ||
		    (calls && json_object_set(m, "tool_calls", calls)) ||
		    json_array_append(msgs, m)))
		st = nomem(e);
	json_decref(m);
	json_decref(text);
	json_decref(thinking);
	json_decref(calls);
	return st;
}

static int messages_chat(const json_t *in, json_t *msgs, struct oai_err *e)
{
	if (!json_array_size(in))
		return oai_errf(e, 400, IRE, "invalid_input", "messages",
				"messages must be a non-empty list of {\"role\", \"content\"}");
	size_t i;
	json_t *m;
	json_array_foreach(in, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		const json_t *c = json_object_get(m, "content");
		if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
			return oai_errf(e, 400, IRE, "invalid_input", "messages",
					"messages[%zu].role must be user or assistant (system is a "
					"member of its own)", i);
		bool user = !strcmp(role, "user");
		if (json_is_string(c)) {
			if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role,
								  "content", c)))
				return nomem(e);
			continue;
		}
		if (!json_is_array(c))
			return oai_errf(e, 400, IRE, "invalid_input", "messages",
					"messages[%zu].content must be a string or a list of blocks", i);
		int st = user ? user_blocks(c, i, msgs, e) : assistant_blocks(c, i, msgs, e);
		if (st)
			return st;
	}
	return 0;
}

static int tools_chat(const json_t *root, json_t *chat, struct oai_err *e)
{
	const json_t *tools = json_object_get(root, "tools");
	if (!absent(tools)) {
		if (!json_is_array(tools))
			return oai_errf(e, 400, IRE, "invalid_input", "tools",
					"tools must be a list of {\"name\", \"input_schema\", ...}");
		json_t *out = json_array();
		if (!out || json_object_set_new(chat, "tools", out))
			return nomem(e);
		size_t i;
		json_t *t;
		json_array_foreach(tools, i, t) {
			const char *type = json_string_value(json_object_get(t, "type"));
			const json_t *name = json_object_get(t, "name");
			const json_t *schema = json_object_get(t, "input_schema");
			if (type && strcmp(type, "custom"))
				return oai_errf(e, 400, IRE, "invalid_input", "tools",
						"tools[%zu].type '%.60s' is not supported: only custom "
						"tools (this server runs no tools of its own)", i, type);
			if (!json_is_string(name) || !json_is_object(schema))
				return oai_errf(e, 400, IRE, "invalid_input", "tools",
						"tools[%zu] must have a string name and an object "
						"input_schema", i);
			/* (in chat's order: the prompt writes the tools' JSON as it is) */
			const json_t *d = json_object_get(t, "description");
			json_t *fn = json_is_string(d)
				? json_pack("{s:O, s:O, s:O}", "name", name, "description", d,
					    "parameters", schema)
				: json_pack("{s:O, s:O}", "name", name, "parameters", schema);
			if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type",
								      "function", "function", fn)))
				return nomem(e);
		}
	}
	const json_t *tc = json_object_get(root, "tool_choice");
	if (absent(tc))
		return 0;
	const char *type = json_string_value(json_object_get(tc, "type"));
	const char *name = json_string_value(json_object_get(tc, "name"));
	json_t *v = NULL;
	if (type && !strcmp(type, "auto"))
		v = json_string("auto");
	else if (type && !strcmp(type, "any"))
		v = json_string("required");
	else if (type && !strcmp(type, "none"))
		v = json_string("none");
	else if (type && !strcmp(type, "tool") && name)
		v = json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name);
	else
		return oai_errf(e, 400, IRE, "invalid_input", "tool_choice",
				"tool_choice is {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": "
				"\"none\"} or {\"type\": \"tool\", \"name\": ...}");
	if (!v || json_object_set_new(chat, "tool_choice", v) ||
	    (json_is_true(json_object_get(tc, "disable_parallel_tool_use")) &&
	     json_object_set_new(chat, "parallel_tool_calls", json_false())))
		return nomem(e);
	return 0;
}

/* A last message of the assistant's is a prefill: the answer's start, continued (chat's
 * continue_final_message). Not with thinking, a forced tool, or its own tool calls. */
static int prefill(json_t *c, const json_t *msgs, bool thinking, struct oai_err *e)
{
	const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
	const char *role = json_string_value(json_object_get(last, "role"));
	if (!role || strcmp(role, "assistant"))
		return 0;
	const json_t *tc = json_object_get(c, "tool_choice");
	if (json_object_get(last, "tool_calls"))
		return oai_errf(e, 400, IRE, "invalid_input", "messages",
				"messages: the last message is the assistant's with tool_use "
				"blocks; their tool_result is to follow in a user message");
	if (thinking)
		return oai_errf(e, 400, IRE, "invalid_input", "thinking",
				"thinking cannot be on when the last message is the assistant's "
				"(a prefill: the answer's start, continued)");
	if (json_is_object(tc) || (json_is_string(tc) && !strcmp(json_string_value(tc), "required")))
		return oai_errf(e, 400, IRE, "invalid_input", "tool_choice",
				"tool_choice cannot force a tool when the last message is the "
				"assistant's (a prefill: the answer's start, continued)");
	if (json_object_set_new(c, "continue_final_message", json_true()))
		return nomem(e);
	return 0;
}

/* The chat request of a Messages request (root) into chat and msgs. */
static int messages_fill(const json_t *root, json_t *c, json_t *msgs, struct oai_err *e)
{
	int st;
	const json_t *v;
	if (!absent(v = json_object_get(root, "system"))) {
		json_t *s = oai_text_parts(v, "system", "system", "blocks", e);
		if (!s)
			return e->status;
		if (json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
							  s)))
			return nomem(e);
	}
	if ((st = messages_chat(json_object_get(root, "messages"), msgs, e)) ||
	    (st = tools_chat(root, c, e)))
		return st;
	static const char *const same[][2] = {
		{"model", "model"}, {"stream", "stream"}, {"max_tokens", "max_tokens"},
		{"temperature", "temperature"}, {"top_p", "top_p"}, {"top_k", "top_k"},
		{"stop_sequences", "stop"}};
	if ((st = oai_copy_members(root, c, same, sizeof same / sizeof same[0], e)))
		return st;
	v = json_object_get(root, "thinking");
	const char *t = json_string_value(json_object_get(v, "type"));
	if (!absent(v) &&
	    (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive"))))
		return oai_errf(e, 400, IRE, "invalid_input", "thinking",
				"thinking must be {\"type\": \"enabled\", ...}, {\"type\": "
				"\"adaptive\"} or {\"type\": \"disabled\"}");
	bool thinking = t && strcmp(t, "disabled");
	if (t && json_object_set_new(c, "thinking", json_pack("{s:s}", "type", thinking
								       ? "enabled" : "disabled")))
		return nomem(e);
	return prefill(c, msgs, thinking, e);
}

static json_t *no_skeleton(const json_t *root)
{
	(void)root;
	return json_object();
}

/* ... as a request to run: max_tokens required, as Anthropic's API requires it */
static int messages_run_fill(const json_t *root, json_t *c, json_t *msgs, struct oai_err *e)
{
	if (absent(json_object_get(root, "max_tokens")))
		return oai_errf(e, 400, IRE, "invalid_input", "max_tokens",
				"max_tokens: field required");
	return messages_fill(root, c, msgs, e);
}

int oai_messages_to_chat(const char *body, size_t len, json_t **chat, json_t **skel,
			 struct oai_err *e)
{
	return oai_api_chat(body, len, chat, skel, messages_run_fill, no_skeleton, e);
}

int oai_messages_count_chat(const char *body, size_t len, json_t **chat, struct oai_err *e)
{
	json_t *skel;
	int st = oai_api_chat(body, len, chat, &skel, messages_fill, no_skeleton, e);
	json_decref(skel);
	return st;
}

void oai_messages_err(struct oai_err *e)
{
	if (e->param && !strcmp(e->param, "stop"))
		e->param = "stop_sequences";
	if (!strncmp(e->message, "stop", 4) && strncmp(e->message, "stop_sequences", 14)) {
		char m[sizeof e->message];
		snprintf(m, sizeof m, "stop_sequences%s", e->message + 4);
		memcpy(e->message, m, sizeof m);
	}
}

json_t *oai_messages_error(const struct oai_err *e)
{
	const char *type = e->status == 400   ? "invalid_request_error"
			   : e->status == 401 ? "authentication_error"
			   : e->status == 403 ? "permission_error"
			   : e->status == 404 ? "not_found_error"
			   : e->status == 405 ? "invalid_request_error"
			   : e->status == 413 ? "request_too_large"
			   : e->status == 429 ? "rate_limit_error"
			   : e->status == 503 ? "overloaded_error"
			   : e->status == 504 ? "timeout_error"
					      : "api_error";
	return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
			 e->message);
}

/* ---- the message ---- */

/* Why it stopped; skel holds the max_tokens it ran with (held to the server's limit): cut
 * short of them, it met the context's end. */
static const char *stop_reason(const json_t *skel, const struct oai_result *r)
{
	if (r->tool_calls)
		return "tool_use";
	json_int_t max = json_integer_value(json_object_get(skel, "max_tokens"));
	if (r->finish_reason && !strcmp(r->finish_reason, "length"))
		return r->completion_tokens < max ? "model_context_window_exceeded" : "max_tokens";
	return r->stop_sequence ? "stop_sequence" : "end_turn";
}

/* Anthropic's usage: input_tokens are those not read from the cache. */
static json_t *usage(const struct oai_result *r)
{
	return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens",
			 (json_int_t)(r->prompt_tokens - r->cached_tokens),
			 "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
			 (json_int_t)r->cached_tokens, "output_tokens",
			 (json_int_t)r->completion_tokens);
}

/* A result's tool call (chat's shape) as a tool_use block (its arguments parsed; {} where
 * they are not a JSON object). */
static json_t *tool_use(const json_t *call, bool empty)
{
	const json_t *fn = json_object_get(call, "function");
	const char *args = json_string_value(json_object_get(fn, "arguments"));
	json_t *in = empty || !args ? NULL : json_loads(args, 0, NULL);
	if (!json_is_object(in)) {
		json_decref(in);
		in = json_object();
	}
	const char *id = json_string_value(json_object_get(call, "id"));
	const char *name = json_string_value(json_object_get(fn, "name"));
	return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id ? id : "", "name",
			 name ? name : "", "input", in);
}

json_t *oai_messages_object(const json_t *skel, const char *id, long created,
			    const char *model, const struct oai_result *r)
{
	(void)created;
	json_t *content = json_array();
	if (content && r->reasoning_len)
		json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking",
							 "thinking", r->reasoning,
							 r->reasoning_len, "signature", ""));
	if (content && r->text_len)
		json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
							 r->text, r->text_len));
	size_t i;
	json_t *c;
	json_array_foreach(content ? r->tool_calls : NULL, i, c)
		json_array_append_new(content, tool_use(c, false));
	return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:s?, s:o}", "id", id, "type", "message",
			 "role", "assistant", "model", model, "content", content, "stop_reason",
			 stop_reason(skel, r), "stop_sequence", r->stop_sequence, "usage",
			 usage(r));
}

/* ---- the stream ---- */

enum { MS_NONE, MS_THINKING, MS_TEXT };

static void push(json_t *evs, const char *type, json_t *ev)
{
	json_t *o = ev ? json_pack("{s:s}", "type", type) : NULL; /* (type first, as Anthropic's) */
	if (o && !json_object_update(o, ev))
		json_array_append(evs, o);
	json_decref(o);
	json_decref(ev);
}

static void block_stop(struct oai_rstream *s, json_t *evs)
{
	if (s->open == MS_NONE)
		return;
	if (s->open == MS_THINKING) /* (no signature: wick signs nothing) */
		push(evs, "content_block_delta",
		     json_pack("{s:i, s:{s:s, s:s}}", "index", s->n_items - 1, "delta", "type",
			       "signature_delta", "signature", ""));
	push(evs, "content_block_stop", json_pack("{s:i}", "index", s->n_items - 1));
	s->open = MS_NONE;
}

static json_t *ms_start(struct oai_rstream *s)
{
	json_t *evs = json_array();
	if (evs)
		push(evs, "message_start",
		     json_pack("{s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}}", "message",
			       "id", s->id, "type", "message", "role", "assistant", "model",
			       s->model, "content", "stop_reason", "stop_sequence", "usage",
			       "input_tokens", 0, "output_tokens", 0));
	return evs;
}

static json_t *ms_text(struct oai_rstream *s, bool reasoning, const char *text, size_t len,
		       const json_t *lp)
{
	(void)lp; /* (Anthropic's API has no logprobs) */
	json_t *evs = json_array();
	if (!evs || !len)
		return evs;
	int want = reasoning ? MS_THINKING : MS_TEXT;
	if (s->open != want) {
		block_stop(s, evs);
		push(evs, "content_block_start",
		     reasoning ? json_pack("{s:i, s:{s:s, s:s, s:s}}", "index", s->n_items,
					   "content_block", "type", "thinking", "thinking", "",
					   "signature", "")
			       : json_pack("{s:i, s:{s:s, s:s}}", "index", s->n_items,
					   "content_block", "type", "text", "text", ""));
		s->n_items++;
		s->open = want;
	}
	push(evs, "content_block_delta",
	     reasoning ? json_pack("{s:i, s:{s:s, s:s%}}", "index", s->n_items - 1, "delta", "type",
				   "thinking_delta", "thinking", text, len)
		       : json_pack("{s:i, s:{s:s, s:s%}}", "index", s->n_items - 1, "delta", "type",
				   "text_delta", "text", text, len));
	return evs;
}

static json_t *ms_end(struct oai_rstream *s, const struct oai_result *r)
{
	json_t *evs = json_array();
	if (!evs)
		return NULL;
	block_stop(s, evs);
	size_t i;
	json_t *c;
	json_array_foreach(r->tool_calls, i, c) {
		int index = s->n_items++;
		const char *args = json_string_value(json_object_get(json_object_get(c, "function"),
								     "arguments"));
		json_t *whole = tool_use(c, false);
		char *partial = whole ? json_dumps(json_object_get(whole, "input"), JSON_COMPACT)
				      : NULL;
		push(evs, "content_block_start", json_pack("{s:i, s:o}", "index", index,
							   "content_block", tool_use(c, true)));
		push(evs, "content_block_delta",
		     json_pack("{s:i, s:{s:s, s:s}}", "index", index, "delta", "type",
			       "input_json_delta", "partial_json",
			       partial ? partial : args ? args : "{}"));
		push(evs, "content_block_stop", json_pack("{s:i}", "index", index));
		free(partial);
		json_decref(whole);
	}
	json_t *u = usage(r);
	push(evs, "message_delta", json_pack("{s:{s:s, s:s?}, s:o}", "delta", "stop_reason",
					     stop_reason(s->skel, r), "stop_sequence", r->stop_sequence,
					     "usage", u));
	push(evs, "message_stop", json_object());
	return evs;
}

static json_t *ms_fail(struct oai_rstream *s, const struct oai_err *e)
{
	(void)s;
	json_t *evs = json_array();
	json_t *err = oai_messages_error(e);
	if (evs && err)
		json_array_append(evs, err); /* ({"type": "error", "error": {...}}) */
	json_decref(err);
	return evs;
}

const struct oai_api oai_messages_api = {
	.name = "messages",
	.id_prefix = "msg_",
	.hold_max_tokens = true,
	.to_chat = oai_messages_to_chat,
	.err = oai_messages_err,
	.error = oai_messages_error,
	.object = oai_messages_object,
	.start = ms_start,
	.text = ms_text,
	.end = ms_end,
	.fail = ms_fail,
};
