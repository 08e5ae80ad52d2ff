/*
 * http_responses.c - OpenAI's Responses API (POST /v1/responses) on the chat path: a request
 * becomes the chat completions request that runs it, so every check, the chat template,
 * tools, thinking, logprobs and structured output are chat's; a result becomes a response
 * object, or a stream's typed events. Pure, as http_openai.c is (http_int.h).
 *
 * What maps to what:
 *   instructions                 a system message before the input
 *   input (a string)             one user message
 *   input items                  message (user, system, developer, assistant; text parts),
 *                                function_call (onto the assistant message before it),
 *                                function_call_output (a tool message), reasoning (its
 *                                reasoning_text, as the next assistant turn's
 *                                reasoning_content)
 *   max_output_tokens            max_completion_tokens
 *   tools, tool_choice           function tools, in chat's nested shape
 *   text.format                  response_format
 *   reasoning.effort             reasoning_effort (none and minimal: thinking off)
 *   include's message.output_text.logprobs, top_logprobs     logprobs, top_logprobs
 * previous_response_id goes on from a response the server kept (oai_kept: the route puts its
 * conversation before the input). Refused, each with a 400 naming it: conversation,
 * background, prompt (stored templates), truncation "auto", tools other than functions, and
 * parts other than text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "worker/http_int.h"
#include "worker/job.h"

#define IRE "invalid_request_error"

static bool absent(const json_t *v)
{
	return !v || json_is_null(v);
}

/* v's string, or "" */
static const char *str_or(const json_t *v)
{
	return json_is_string(v) ? json_string_value(v) : "";
}

static int nomem(struct oai_err *e)
{
	return oai_errf(e, 500, "server_error", "internal", NULL, "out of memory");
}

/* Text parts (input_text, output_text, or chat's text) into one string; NULL after an error.
 * what names the member ("input[2].content"). */
static json_t *parts_text(const json_t *c, const char *what, struct oai_err *e)
{
	if (json_is_string(c))
		return json_stringn(json_string_value(c), json_string_length(c));
	if (!json_is_array(c)) {
		oai_errf(e, 400, IRE, "invalid_input", "input",
			 "%s must be a string or a list of text parts", what);
		return NULL;
	}
	size_t total = 0, k;
	json_t *p;
	json_array_foreach(c, k, p) {
		const char *t = json_string_value(json_object_get(p, "type"));
		const json_t *s = json_object_get(p, "text");
		if (!t || !json_is_object(p)) {
			oai_errf(e, 400, IRE, "invalid_input", "input",
				 "%s[%zu] must be an object with a string \"type\"", what, k);
			return NULL;
		}
		if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text")) {
			oai_errf(e, 400, IRE, "invalid_input", "input",
				 "%s[%zu]: %.40s parts are not supported (the model reads text: "
				 "input_text and output_text parts)", what, k, t);
			return NULL;
		}
		if (!json_is_string(s)) {
			oai_errf(e, 400, IRE, "invalid_input", "input",
				 "%s[%zu].text must be a string", what, k);
			return NULL;
		}
		if ((total += json_string_length(s)) > JOB_PROMPT_MAX) {
			oai_errf(e, 400, IRE, "prompt_too_long", "input",
				 "%s holds more than %u bytes of text", what, JOB_PROMPT_MAX);
			return NULL;
		}
	}
	json_t *s = oai_join_text(c, total);
	if (!s)
		nomem(e);
	return s;
}

/* A string member of item i, or NULL after a 400. */
static const char *item_str(const json_t *item, size_t i, const char *key, struct oai_err *e)
{
	const char *s = json_string_value(json_object_get(item, key));
	if (!s)
		oai_errf(e, 400, IRE, "invalid_input", "input", "input[%zu].%s must be a string", i,
			 key);
	return s;
}

/* The input items into chat messages (appended to msgs). */
static int input_items(const json_t *input, json_t *msgs, struct oai_err *e)
{
	json_t *asst = NULL;      /* the assistant message a function_call joins */
	json_t *reasoning = NULL; /* reasoning_text waiting for the next assistant turn */
	size_t i;
	json_t *item;
	int st = 0;
	json_array_foreach(input, i, item) {
		char what[48];
		snprintf(what, sizeof what, "input[%zu].content", i);
		if (!json_is_object(item)) {
			st = oai_errf(e, 400, IRE, "invalid_input", "input",
				      "input[%zu] must be an object", i);
			break;
		}
		const json_t *tv = json_object_get(item, "type");
		const char *type = json_string_value(tv);
		const json_t *role = json_object_get(item, "role");
		if (!absent(tv) && !type) {
			st = oai_errf(e, 400, IRE, "invalid_input", "input",
				      "input[%zu].type must be a string", i);
			break;
		}
		if (!absent(role) && (!type || !strcmp(type, "message"))) {
			const char *r = json_string_value(role);
			if (!r || (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") &&
				   strcmp(r, "assistant"))) {
				st = oai_errf(e, 400, IRE, "invalid_input", "input",
					      "input[%zu].role must be user, system, developer or "
					      "assistant", i);
				break;
			}
			json_t *text = parts_text(json_object_get(item, "content"), what, e);
			json_t *m = text ? json_pack("{s:s, s:o}", "role", r, "content", text) : NULL;
			if (!m) {
				st = text ? nomem(e) : e->status;
				break;
			}
			bool a = !strcmp(r, "assistant");
			if (a && reasoning) {
				json_object_set_new(m, "reasoning_content", reasoning);
				reasoning = NULL;
			}
			if (json_array_append_new(msgs, m)) {
				st = nomem(e);
				break;
			}
			asst = a ? m : NULL;
		} else if (type && !strcmp(type, "function_call")) {
			const char *id = item_str(item, i, "call_id", e), *name, *args;
			if (!id || !(name = item_str(item, i, "name", e)) ||
			    !(args = item_str(item, i, "arguments", e))) {
				st = e->status;
				break;
			}
			if (!asst) {
				asst = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
				if (!asst || json_array_append_new(msgs, asst)) {
					st = nomem(e);
					break;
				}
				if (reasoning) {
					json_object_set_new(asst, "reasoning_content", reasoning);
					reasoning = NULL;
				}
			}
			json_t *calls = json_object_get(asst, "tool_calls");
			if (!calls && json_object_set_new(asst, "tool_calls", calls = json_array())) {
				st = nomem(e);
				break;
			}
			if (json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id,
								   "type", "function", "function",
								   "name", name, "arguments",
								   args))) {
				st = nomem(e);
				break;
			}
		} else if (type && !strcmp(type, "function_call_output")) {
			const char *id = item_str(item, i, "call_id", e);
			snprintf(what, sizeof what, "input[%zu].output", i);
			json_t *out = id ? parts_text(json_object_get(item, "output"), what, e) : NULL;
			json_t *m = out ? json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id",
						    id, "content", out)
					: NULL;
			if (!m || json_array_append_new(msgs, m)) {
				st = out ? nomem(e) : e->status;
				break;
			}
			asst = NULL;
		} else if (type && !strcmp(type, "reasoning")) {
			/* its reasoning_text (a summary or encrypted_content alone is let be) */
			const json_t *c = json_object_get(item, "content");
			size_t k;
			json_t *p;
			json_array_foreach(json_is_array(c) ? c : NULL, k, p) {
				const char *t = json_string_value(json_object_get(p, "text"));
				const char *pt = json_string_value(json_object_get(p, "type"));
				if (!t || !pt || strcmp(pt, "reasoning_text"))
					continue;
				size_t a = reasoning ? json_string_length(reasoning) : 0;
				size_t b = json_string_length(json_object_get(p, "text"));
				char *cat = malloc(a + b + 1);
				if (!cat) {
					st = nomem(e);
					break;
				}
				if (a)
					memcpy(cat, json_string_value(reasoning), a);
				memcpy(cat + a, t, b);
				json_decref(reasoning);
				reasoning = json_stringn(cat, a + b);
				free(cat);
			}
			if (st)
				break;
		} else {
			st = oai_errf(e, 400, IRE, "invalid_input", "input",
				      "input[%zu].type '%.40s' is not supported (message, "
				      "function_call, function_call_output and reasoning items are)", i,
				      type ? type : "message");
			break;
		}
	}
	json_decref(reasoning);
	return st;
}

/* tool_choice (copied as given) into chat's shape: a function's name nests. */
static int tool_choice_chat(json_t *chat, struct oai_err *e)
{
	const json_t *tc = json_object_get(chat, "tool_choice");
	if (absent(tc) || json_is_string(tc))
		return 0;
	const char *type = json_string_value(json_object_get(tc, "type"));
	const char *name = json_string_value(json_object_get(tc, "name"));
	if (!type || strcmp(type, "function") || !name)
		return oai_errf(e, 400, IRE, "invalid_input", "tool_choice",
				"tool_choice is \"none\", \"auto\", \"required\" or {\"type\": "
				"\"function\", \"name\": ...}");
	if (json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function",
							       "function", "name", name)))
		return nomem(e);
	return 0;
}

/* Function tools into chat's shape. */
static int tools_chat(const json_t *tools, json_t *chat, struct oai_err *e)
{
	if (absent(tools))
		return tool_choice_chat(chat, e);
	if (!json_is_array(tools))
		return oai_errf(e, 400, IRE, "invalid_input", "tools",
				"tools must be an array of {\"type\": \"function\", \"name\", ...}");
	json_t *out = json_array();
	if (!out || json_object_set_new(chat, "tools", out))
		return nomem(e);
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		const char *type = json_string_value(json_object_get(t, "type"));
		if (!type || strcmp(type, "function"))
			return oai_errf(e, 400, IRE, "invalid_input", "tools",
					"tools[%zu].type '%.40s' is not supported: only function tools "
					"(this server runs no tools of its own)", i,
					type ? type : "(none)");
		if (!json_is_string(json_object_get(t, "name")))
			return oai_errf(e, 400, IRE, "invalid_input", "tools",
					"tools[%zu].name must be a string", i);
		json_t *fn = json_object();
		static const char *const keys[] = {"name", "description", "parameters", "strict"};
		for (size_t k = 0; fn && k < sizeof keys / sizeof keys[0]; k++) {
			json_t *v = json_object_get(t, keys[k]);
			if (!absent(v) && json_object_set(fn, keys[k], v)) {
				json_decref(fn);
				fn = NULL;
			}
		}
		if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function",
							      "function", fn)))
			return nomem(e);
	}
	return tool_choice_chat(chat, e);
}

/* text.format into response_format. */
static int text_format(const json_t *text, json_t *chat, struct oai_err *e)
{
	if (absent(text))
		return 0;
	const json_t *f = json_object_get(text, "format");
	if (!json_is_object(text) || (!absent(f) && !json_is_object(f)))
		return oai_errf(e, 400, IRE, "invalid_input", "text",
				"text must be an object; text.format {\"type\": \"text\"}, "
				"{\"type\": \"json_object\"} or {\"type\": \"json_schema\", ...}");
	const char *type = json_string_value(json_object_get(f, "type"));
	if (absent(f) || (type && !strcmp(type, "text")))
		return 0;
	json_t *rf = NULL;
	if (type && !strcmp(type, "json_object")) {
		rf = json_pack("{s:s}", "type", "json_object");
	} else if (type && !strcmp(type, "json_schema")) {
		if (!json_is_object(json_object_get(f, "schema")))
			return oai_errf(e, 400, IRE, "invalid_input", "text.format",
					"text.format.schema must be an object (a JSON schema)");
		json_t *js = json_object();
		static const char *const keys[] = {"name", "schema", "strict", "description"};
		for (size_t k = 0; js && k < sizeof keys / sizeof keys[0]; k++) {
			json_t *v = json_object_get(f, keys[k]);
			if (!absent(v) && json_object_set(js, keys[k], v)) {
				json_decref(js);
				js = NULL;
			}
		}
		rf = js ? json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js) : NULL;
	} else {
		return oai_errf(e, 400, IRE, "invalid_input", "text.format",
				"text.format.type is text, json_object or json_schema");
	}
	if (!rf || json_object_set_new(chat, "response_format", rf))
		return nomem(e);
	return 0;
}

/* Members this server cannot honour: refused so that the client is not misled. */
static int refused(const json_t *root, struct oai_err *e)
{
	const json_t *prev = json_object_get(root, "previous_response_id");
	if (!absent(prev) && !json_is_string(prev))
		return oai_errf(e, 400, IRE, "invalid_input", "previous_response_id",
				"previous_response_id must be a string (a response's id)");
	if (!absent(json_object_get(root, "conversation")))
		return oai_errf(e, 400, IRE, "invalid_input", "conversation",
				"conversation is not supported: this server keeps responses, not "
				"conversations; give previous_response_id, or the whole "
				"conversation in input");
	if (json_is_true(json_object_get(root, "background")))
		return oai_errf(e, 400, IRE, "invalid_input", "background",
				"background responses are not supported: ask with stream true, or "
				"through the worker's queue");
	if (!absent(json_object_get(root, "prompt")))
		return oai_errf(e, 400, IRE, "invalid_input", "prompt",
				"prompt (a stored prompt template) is not supported");
	const json_t *t = json_object_get(root, "truncation");
	if (!absent(t) && !(json_is_string(t) && !strcmp(json_string_value(t), "disabled")))
		return oai_errf(e, 400, IRE, "invalid_input", "truncation",
				"truncation must be \"disabled\": a conversation longer than the "
				"context is refused (prompt_too_long), never cut");
	const json_t *s = json_object_get(root, "store");
	if (!absent(s) && !json_is_boolean(s))
		return oai_errf(e, 400, IRE, "invalid_input", "store", "store must be true or false");
	return 0;
}

/* include and top_logprobs: logprobs. */
static int include(const json_t *root, json_t *chat, struct oai_err *e)
{
	const json_t *inc = json_object_get(root, "include"), *top;
	bool lp = false;
	if (!absent(inc) && !json_is_array(inc))
		return oai_errf(e, 400, IRE, "invalid_input", "include",
				"include must be an array of strings");
	static const char *const known[] = {
		"message.output_text.logprobs", "reasoning.encrypted_content",
		"file_search_call.results",     "web_search_call.results",
		"web_search_call.action.sources", "message.input_image.image_url",
		"computer_call_output.output.image_url", "code_interpreter_call.outputs"};
	size_t i, k;
	json_t *v;
	json_array_foreach(json_is_array(inc) ? inc : NULL, i, v) {
		const char *s = json_string_value(v);
		for (k = 0; s && k < sizeof known / sizeof known[0] && strcmp(s, known[k]); k++)
			;
		if (!s || k == sizeof known / sizeof known[0])
			return oai_errf(e, 400, IRE, "invalid_input", "include",
					"include[%zu] is not a value this server knows", i);
		lp |= k == 0;
	}
	top = json_object_get(root, "top_logprobs");
	if (!absent(top) && json_is_integer(top) && json_integer_value(top) > 0)
		lp = true;
	if (lp && (json_object_set_new(chat, "logprobs", json_true()) ||
		   (!absent(top) && json_object_set(chat, "top_logprobs", (json_t *)top))))
		return nomem(e);
	return 0;
}

/* The response's members that say what was asked. */
static json_t *skeleton(const json_t *root)
{
	const json_t *v;
	json_t *s = json_pack("{s:s, s:s, s:i, s:s, s:s, s:n, s:n, s:n, s:n, s:[], s:b, s:n, "
			      "s:n, s:b, s:f, s:{s:{s:s}}, s:s, s:[], s:f, s:s, s:n, s:{}}",
			      "id", "", "object", "response", "created_at", 0, "model", "",
			      "status", "in_progress", "error",
			      "incomplete_details", "instructions", "max_output_tokens", "output",
			      "parallel_tool_calls", 1, "previous_response_id", "reasoning",
			      "store", 1, "temperature", 1.0, "text", "format", "type", "text",
			      "tool_choice", "auto", "tools", "top_p", 1.0, "truncation", "disabled",
			      "usage", "metadata");
	static const char *const given[] = {"instructions", "max_output_tokens",
					    "parallel_tool_calls", "reasoning", "temperature",
					    "text", "tool_choice", "tools", "top_p", "metadata",
					    "user", "top_logprobs", "service_tier", "store",
					    "previous_response_id"};
	for (size_t i = 0; s && i < sizeof given / sizeof given[0]; i++)
		if (!absent(v = json_object_get(root, given[i])) &&
		    json_object_set(s, given[i], (json_t *)v)) {
			json_decref(s);
			return NULL;
		}
	return s;
}

/* The chat request of a Responses request (root) into chat and msgs. */
static int responses_fill(const json_t *root, json_t *c, json_t *msgs, struct oai_err *e)
{
	int st;
	const json_t *v;
	if ((st = refused(root, e)))
		return st;
	if (!absent(v = json_object_get(root, "instructions"))) {
		if (!json_is_string(v))
			return oai_errf(e, 400, IRE, "invalid_input", "instructions",
					"instructions must be a string");
		if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content",
							  v)))
			return nomem(e);
	}
	v = json_object_get(root, "input");
	if (json_is_string(v)) {
		if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content",
							  v)))
			return nomem(e);
	} else if (!json_array_size(v)) {
		return oai_errf(e, 400, IRE, "invalid_input", "input",
				"input must be a string or a non-empty list of input items");
	} else if ((st = input_items(v, msgs, e))) {
		return st;
	}
	/* chat's own members, checked there: those of the same name, and the extensions wick
	 * takes on chat (sampling, penalties, thinking's switches) */
	static const char *const same[][2] = {
		{"model", "model"}, {"stream", "stream"}, {"temperature", "temperature"},
		{"top_p", "top_p"}, {"top_k", "top_k"}, {"seed", "seed"}, {"stop", "stop"},
		{"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"},
		{"repetition_penalty", "repetition_penalty"}, {"logit_bias", "logit_bias"},
		{"parallel_tool_calls", "parallel_tool_calls"}, {"tool_choice", "tool_choice"},
		{"chat_template_kwargs", "chat_template_kwargs"}, {"thinking", "thinking"},
		{"max_output_tokens", "max_completion_tokens"}};
	if ((st = oai_copy_members(root, c, same, sizeof same / sizeof same[0], e)))
		return st;
	v = json_object_get(root, "reasoning");
	if (!absent(v)) {
		const json_t *eff = json_object_get(v, "effort");
		if (!json_is_object(v) || (!absent(eff) && !json_is_string(eff)))
			return oai_errf(e, 400, IRE, "invalid_input", "reasoning",
					"reasoning must be an object; reasoning.effort a string");
		const char *ef = json_string_value(eff);
		if (ef && json_object_set_new(c, "reasoning_effort",
					      json_string(!strcmp(ef, "xhigh") ? "high" : ef)))
			return nomem(e);
	}
	if ((st = tools_chat(json_object_get(root, "tools"), c, e)) ||
	    (st = text_format(json_object_get(root, "text"), c, e)))
		return st;
	return include(root, c, e);
}

int oai_responses_to_chat(const char *body, size_t len, json_t **chat, json_t **skel,
			  struct oai_err *e)
{
	return oai_api_chat(body, len, chat, skel, responses_fill, skeleton, e);
}

/* s with every "from" replaced by "to", into out (cut to n bytes). */
static void replace(char *out, size_t n, const char *s, const char *from, const char *to)
{
	size_t o = 0, fl = strlen(from), tl = strlen(to);
	while (*s && o + 1 < n) {
		if (!strncmp(s, from, fl) && o + tl + 1 < n) {
			memcpy(out + o, to, tl);
			o += tl;
			s += fl;
		} else {
			out[o++] = *s++;
		}
	}
	out[o] = 0;
}

void oai_responses_err(struct oai_err *e)
{
	static const char *const names[][2] = {{"max_completion_tokens", "max_output_tokens"},
					       {"response_format", "text.format"},
					       {"reasoning_effort", "reasoning.effort"},
					       {"messages", "input"}};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (i < 3) { /* (messages stays in the text: it names the chat rendered) */
			char m[sizeof e->message];
			replace(m, sizeof m, e->message, names[i][0], names[i][1]);
			memcpy(e->message, m, sizeof m);
		}
		if (e->param && !strcmp(e->param, names[i][0]))
			e->param = names[i][1];
	}
	char m[sizeof e->message]; /* (echo is the legacy completions') */
	replace(m, sizeof m, e->message, " (0 with echo)", "");
	memcpy(e->message, m, sizeof m);
}

/* ---- the response ---- */

/* An item's id: its kind's prefix and the response id's random part (resp_HEX). */
static void item_id(char *out, size_t n, const char *resp_id, const char *prefix, int index)
{
	const char *hex = strchr(resp_id, '_') ? strchr(resp_id, '_') + 1 : resp_id;
	if (index >= 0)
		snprintf(out, n, "%s_%s_%d", prefix, hex, index);
	else
		snprintf(out, n, "%s_%s", prefix, hex);
}

static json_t *reasoning_item(const char *id, const char *text, size_t len)
{
	return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "id", id, "type", "reasoning",
			 "summary", "content", "type", "reasoning_text", "text", text, len);
}

static json_t *text_part(const char *text, size_t len, const json_t *lp)
{
	json_t *p = json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text", text, len,
			      "annotations");
	if (p && lp && json_object_set(p, "logprobs", (json_t *)lp)) {
		json_decref(p);
		return NULL;
	}
	return p;
}

static json_t *message_item(const char *id, const char *status, json_t *part)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:[o]}", "id", id, "type", "message", "status",
			 status, "role", "assistant", "content", part);
}

/* A result's tool call (chat's shape) as a function_call item. */
static json_t *call_item(const char *id, const json_t *call, const char *status)
{
	const json_t *fn = json_object_get(call, "function");
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call",
			 "status", status, "call_id", str_or(json_object_get(call, "id")), "name",
			 str_or(json_object_get(fn, "name")), "arguments",
			 str_or(json_object_get(fn, "arguments")));
}

static bool incomplete(const struct oai_result *r)
{
	return r->finish_reason && !strcmp(r->finish_reason, "length");
}

static json_t *resp_usage(const struct oai_result *r)
{
	const json_t *det = json_object_get(json_object_get(r->root, "usage"),
					    "completion_tokens_details");
	return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I, s:f, s:f, s:I}", "input_tokens",
			 (json_int_t)r->prompt_tokens, "input_tokens_details", "cached_tokens",
			 (json_int_t)r->cached_tokens, "output_tokens",
			 (json_int_t)r->completion_tokens, "output_tokens_details",
			 "reasoning_tokens",
			 json_integer_value(json_object_get(det, "reasoning_tokens")),
			 "total_tokens", (json_int_t)(r->prompt_tokens + r->completion_tokens),
			 "queue_seconds", r->queue_seconds, "gpu_seconds", r->gpu_seconds,
			 "cost_micro_usd", (json_int_t)r->cost_micro_usd);
}

/* The skeleton made whole: id, times, model, status; output empty. */
static json_t *resp_base(const json_t *skel, const char *id, long created, const char *model,
			 const char *status)
{
	json_t *o = json_deep_copy(skel);
	if (!o || json_object_set_new(o, "id", json_string(id)) ||
	    json_object_set_new(o, "created_at", json_integer(created)) ||
	    json_object_set_new(o, "model", json_string(model)) ||
	    json_object_set_new(o, "status", json_string(status))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* The finished response: r's status, usage and output (items: a stream's, else built from
 * r: its reasoning, its message (unless it is only calls), its calls). */
static json_t *resp_done(const json_t *skel, const char *id, long created, const char *model,
			 const struct oai_result *r, json_t *items)
{
	bool inc = incomplete(r);
	json_t *o = resp_base(skel, id, created, model, inc ? "incomplete" : "completed");
	if (!o)
		return NULL;
	if (!items) {
		items = json_array();
		char iid[64];
		if (items && r->reasoning_len) {
			item_id(iid, sizeof iid, id, "rs", -1);
			json_array_append_new(items, reasoning_item(iid, r->reasoning,
								    r->reasoning_len));
		}
		if (items && (r->text_len || !r->tool_calls)) {
			item_id(iid, sizeof iid, id, "msg", -1);
			json_array_append_new(items, message_item(iid, inc ? "incomplete"
									  : "completed",
								  text_part(r->text, r->text_len,
									    r->logprobs)));
		}
		size_t i;
		json_t *c;
		json_array_foreach(items ? r->tool_calls : NULL, i, c) {
			item_id(iid, sizeof iid, id, "fc", (int)i);
			json_array_append_new(items, call_item(iid, c, "completed"));
		}
	} else {
		json_incref(items);
	}
	if (!items || json_object_set_new(o, "output", items) ||
	    json_object_set_new(o, "usage", resp_usage(r)) ||
	    (inc && json_object_set_new(o, "incomplete_details",
					json_pack("{s:s}", "reason", "max_output_tokens")))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *oai_responses_object(const json_t *skel, const char *id, long created,
			     const char *model, const struct oai_result *r)
{
	return resp_done(skel, id, created, model, r, NULL);
}

/* ---- the stream ---- */

enum { RS_NONE, RS_REASONING, RS_MESSAGE };

int oai_rstream_init(struct oai_rstream *s, const json_t *skel, const char *id, long created,
		     const char *model, bool logprobs)
{
	memset(s, 0, sizeof *s);
	s->skel = skel;
	snprintf(s->id, sizeof s->id, "%s", id);
	s->created = created;
	snprintf(s->model, sizeof s->model, "%s", model);
	s->items = json_array();
	s->lp = logprobs ? json_array() : NULL;
	return s->items && (!logprobs || s->lp) ? WK_OK : WK_ENOMEM;
}

void oai_rstream_free(struct oai_rstream *s)
{
	json_decref(s->items);
	json_decref(s->lp);
	free(s->acc);
	s->items = s->lp = NULL;
	s->acc = NULL;
}

/* Appends event type (its members in ev, taken) with its sequence number. */
static void push(struct oai_rstream *s, json_t *evs, const char *type, json_t *ev)
{
	json_t *o = ev ? json_pack("{s:s, s:i}", "type", type, "sequence_number", s->seq++) : NULL;
	if (o && !json_object_update(o, ev))
		json_array_append(evs, o);
	json_decref(o);
	json_decref(ev);
}

static void acc_add(struct oai_rstream *s, const char *t, size_t n)
{
	if (s->acc_len + n + 1 > s->acc_cap) {
		size_t cap = (s->acc_len + n + 1) * 2;
		char *p = realloc(s->acc, cap);
		if (!p)
			return; /* (the done event then holds less; the result holds all) */
		s->acc = p;
		s->acc_cap = cap;
	}
	memcpy(s->acc + s->acc_len, t, n);
	s->acc_len += n;
}

/* The open item's part and item, done. */
static void close_item(struct oai_rstream *s, json_t *evs, const char *status)
{
	if (s->open == RS_NONE)
		return;
	int oi = s->n_items - 1;
	const char *t = s->acc ? s->acc : "";
	json_t *item;
	if (s->open == RS_REASONING) {
		push(s, evs, "response.reasoning_text.done",
		     json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item, "output_index", oi,
			       "content_index", 0, "text", t, s->acc_len));
		push(s, evs, "response.content_part.done",
		     json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", s->item,
			       "output_index", oi, "content_index", 0, "part", "type",
			       "reasoning_text", "text", t, s->acc_len));
		item = reasoning_item(s->item, t, s->acc_len);
	} else {
		json_t *ev = json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item, "output_index",
				       oi, "content_index", 0, "text", t, s->acc_len);
		if (ev && s->lp)
			json_object_set(ev, "logprobs", s->lp);
		push(s, evs, "response.output_text.done", ev);
		push(s, evs, "response.content_part.done",
		     json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item, "output_index", oi,
			       "content_index", 0, "part", text_part(t, s->acc_len, s->lp)));
		item = message_item(s->item, status, text_part(t, s->acc_len, s->lp));
	}
	push(s, evs, "response.output_item.done",
	     json_pack("{s:i, s:O}", "output_index", oi, "item", item));
	json_array_append_new(s->items, item);
	s->open = RS_NONE;
	s->acc_len = 0;
}

/* A new item of kind open, with its one part, empty. */
static void open_item(struct oai_rstream *s, json_t *evs, int open)
{
	int oi = s->n_items++;
	json_t *item, *part;
	if (open == RS_REASONING) {
		item_id(s->item, sizeof s->item, s->id, "rs", -1);
		item = json_pack("{s:s, s:s, s:[], s:[]}", "id", s->item, "type", "reasoning",
				 "summary", "content");
		part = json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "");
	} else {
		item_id(s->item, sizeof s->item, s->id, "msg", -1);
		item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", s->item, "type", "message",
				 "status", "in_progress", "role", "assistant", "content");
		json_t *none = s->lp ? json_array() : NULL;
		part = text_part("", 0, none);
		json_decref(none);
	}
	push(s, evs, "response.output_item.added",
	     json_pack("{s:i, s:o}", "output_index", oi, "item", item));
	push(s, evs, "response.content_part.added",
	     json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item, "output_index", oi,
		       "content_index", 0, "part", part));
	s->open = open;
	s->acc_len = 0;
}

json_t *oai_rstream_start(struct oai_rstream *s)
{
	json_t *evs = json_array();
	if (!evs)
		return NULL;
	json_t *o = resp_base(s->skel, s->id, s->created, s->model, "in_progress");
	push(s, evs, "response.created", json_pack("{s:O}", "response", o));
	push(s, evs, "response.in_progress", json_pack("{s:o}", "response", o));
	return evs;
}

json_t *oai_rstream_text(struct oai_rstream *s, bool reasoning, const char *text, size_t len,
			 const json_t *lp)
{
	json_t *evs = json_array();
	if (!evs || (!len && !json_array_size(lp)))
		return evs;
	int want = reasoning ? RS_REASONING : RS_MESSAGE;
	if (s->open != want) {
		close_item(s, evs, "completed");
		open_item(s, evs, want);
	}
	acc_add(s, text, len);
	int oi = s->n_items - 1;
	json_t *ev;
	if (reasoning) {
		ev = json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item, "output_index", oi,
			       "content_index", 0, "delta", text, len);
		push(s, evs, "response.reasoning_text.delta", ev);
		return evs;
	}
	ev = json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", s->item, "output_index", oi,
		       "content_index", 0, "delta", text, len, "logprobs");
	if (ev && lp) {
		json_array_extend(json_object_get(ev, "logprobs"), (json_t *)lp);
		if (s->lp)
			json_array_extend(s->lp, (json_t *)lp);
	}
	push(s, evs, "response.output_text.delta", ev);
	return evs;
}

json_t *oai_rstream_end(struct oai_rstream *s, const struct oai_result *r)
{
	json_t *evs = json_array();
	if (!evs)
		return NULL;
	bool inc = incomplete(r);
	const char *status = inc ? "incomplete" : "completed";
	if (s->open == RS_REASONING)
		close_item(s, evs, status);
	bool message = s->open == RS_MESSAGE;
	for (size_t i = 0; !message && i < json_array_size(s->items); i++)
		message = !strcmp(json_string_value(json_object_get(json_array_get(s->items, i),
								      "type")), "message");
	if (!message && !r->tool_calls)
		open_item(s, evs, RS_MESSAGE); /* (an empty answer is still a message) */
	close_item(s, evs, status);
	size_t i;
	json_t *c;
	json_array_foreach(r->tool_calls, i, c) {
		char iid[64];
		item_id(iid, sizeof iid, s->id, "fc", (int)i);
		int oi = s->n_items++;
		json_t *item = call_item(iid, c, "completed");
		json_t *open = json_deep_copy(item);
		if (open) {
			json_object_set_new(open, "status", json_string("in_progress"));
			json_object_set_new(open, "arguments", json_string(""));
		}
		const char *args = str_or(json_object_get(item, "arguments"));
		push(s, evs, "response.output_item.added",
		     json_pack("{s:i, s:o}", "output_index", oi, "item", open));
		push(s, evs, "response.function_call_arguments.delta",
		     json_pack("{s:s, s:i, s:s}", "item_id", iid, "output_index", oi, "delta",
			       args));
		push(s, evs, "response.function_call_arguments.done",
		     json_pack("{s:s, s:i, s:s, s:s}", "item_id", iid, "output_index", oi, "name",
			       str_or(json_object_get(item, "name")), "arguments", args));
		push(s, evs, "response.output_item.done",
		     json_pack("{s:i, s:O}", "output_index", oi, "item", item));
		json_array_append_new(s->items, item);
	}
	push(s, evs, inc ? "response.incomplete" : "response.completed",
	     json_pack("{s:o}", "response", resp_done(s->skel, s->id, s->created, s->model, r,
						       s->items)));
	return evs;
}

json_t *oai_rstream_fail(struct oai_rstream *s, const struct oai_err *e)
{
	json_t *evs = json_array();
	json_t *o = resp_base(s->skel, s->id, s->created, s->model, "failed");
	if (!evs || !o || json_object_set(o, "output", s->items) ||
	    json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code",
						       e->code ? e->code : "server_error",
						       "message", e->message))) {
		json_decref(o);
		return evs;
	}
	push(s, evs, "response.failed", json_pack("{s:o}", "response", o));
	return evs;
}

const struct oai_api oai_responses_api = {
	.name = "responses",
	.id_prefix = "resp_",
	.to_chat = oai_responses_to_chat,
	.err = oai_responses_err,
	.error = oai_error_json,
	.object = oai_responses_object,
	.start = oai_rstream_start,
	.text = oai_rstream_text,
	.end = oai_rstream_end,
	.fail = oai_rstream_fail,
};

/* ---- kept responses ---- */

struct kept_entry {
	char id[48];
	char tenant[129];
	json_t *conversation, *object;
	size_t bytes;
	struct wk_node lru;
};

struct oai_kept {
	int max_entries, n;
	size_t max_bytes, bytes;
	struct wk_lru lru; /* most recently used first */
};

struct oai_kept *oai_kept_new(int max_entries, size_t max_bytes)
{
	struct oai_kept *k = calloc(1, sizeof *k);
	if (k) {
		k->max_entries = max_entries;
		k->max_bytes = max_bytes;
	}
	return k;
}

static void kept_drop(struct oai_kept *k, struct kept_entry *e)
{
	wk_lru_unlink(&k->lru, &e->lru);
	k->n--;
	k->bytes -= e->bytes;
	json_decref(e->conversation);
	json_decref(e->object);
	free(e);
}

void oai_kept_free(struct oai_kept *k)
{
	while (k && k->lru.head)
		kept_drop(k, WK_OF(k->lru.head, struct kept_entry, lru));
	free(k);
}

static struct kept_entry *kept_find(struct oai_kept *k, const char *id, const char *tenant)
{
	for (struct wk_node *n = k ? k->lru.head : NULL; n; n = n->next) {
		struct kept_entry *e = WK_OF(n, struct kept_entry, lru);
		if (!strcmp(e->id, id))
			return strcmp(e->tenant, tenant) ? NULL : e; /* (another tenant's: none) */
	}
	return NULL;
}

/* The bytes a JSON value takes written out (what an entry is counted as). */
static size_t json_bytes(const json_t *v)
{
	return json_dumpb(v, NULL, 0, JSON_COMPACT);
}

int oai_kept_put(struct oai_kept *k, const char *id, const char *tenant, json_t *conversation,
		 json_t *object)
{
	struct kept_entry *e = calloc(1, sizeof *e);
	if (!e)
		return WK_ENOMEM;
	snprintf(e->id, sizeof e->id, "%s", id);
	snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
	e->conversation = json_incref(conversation);
	e->object = json_incref(object);
	e->bytes = json_bytes(conversation) + json_bytes(object);
	struct kept_entry *old = kept_find(k, id, tenant);
	if (old)
		kept_drop(k, old);
	wk_lru_push(&k->lru, &e->lru);
	k->n++;
	k->bytes += e->bytes;
	while (k->lru.tail && k->lru.tail != &e->lru &&
	       (k->n > k->max_entries || k->bytes > k->max_bytes))
		kept_drop(k, WK_OF(k->lru.tail, struct kept_entry, lru));
	return WK_OK;
}

bool oai_kept_get(struct oai_kept *k, const char *id, const char *tenant,
		  const json_t **conversation, const json_t **object)
{
	struct kept_entry *e = kept_find(k, id, tenant);
	if (!e)
		return false;
	wk_lru_unlink(&k->lru, &e->lru); /* (the most recently used now) */
	wk_lru_push(&k->lru, &e->lru);
	if (conversation)
		*conversation = e->conversation;
	if (object)
		*object = e->object;
	return true;
}

bool oai_kept_delete(struct oai_kept *k, const char *id, const char *tenant)
{
	struct kept_entry *e = kept_find(k, id, tenant);
	if (e)
		kept_drop(k, e);
	return e != NULL;
}

int oai_kept_count(const struct oai_kept *k)
{
	return k ? k->n : 0;
}

json_t *oai_result_message(const struct oai_result *r)
{
	json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", r->text, r->text_len);
	if (m && r->reasoning_len &&
	    json_object_set_new(m, "reasoning_content",
				json_stringn(r->reasoning, r->reasoning_len))) {
		json_decref(m);
		return NULL;
	}
	if (m && r->tool_calls && json_object_set(m, "tool_calls", (json_t *)r->tool_calls)) {
		json_decref(m);
		return NULL;
	}
	return m;
}

/* ---- a kept response's input items (GET /v1/responses/ID/input_items) ---- */

/* The hash chain's next link: h over s's bytes and their length. */
static uint64_t chain(uint64_t h, const json_t *s)
{
	size_t n = json_is_string(s) ? json_string_length(s) : 0;
	h = XXH3_64bits_withSeed(n ? json_string_value(s) : "", n, h);
	return XXH3_64bits_withSeed(&n, sizeof n, h);
}

/* item, its id "PREFIX_HEX" (h), or the one response resp gave it in its output (index: a
 * call's), appended to items; false when out of memory. */
static bool put_item(json_t *items, const char *prefix, uint64_t h, const char *resp, int index,
		     json_t *item)
{
	char id[80];
	if (resp)
		item_id(id, sizeof id, resp, prefix, index);
	else
		snprintf(id, sizeof id, "%s_%016llx", prefix, (unsigned long long)h);
	return item && !json_object_set_new(item, "id", json_string(id)) &&
	       !json_array_append_new(items, item);
}

/* One chat message's items (h: the chain through it; after_assistant: the message before it
 * is an assistant's; resp: the response whose answer it is, NULL unknown). */
static bool message_items(json_t *items, const json_t *m, uint64_t h, bool after_assistant,
			  const char *resp)
{
	const char *role = str_or(json_object_get(m, "role"));
	const json_t *content = json_object_get(m, "content");
	const char *text = str_or(content);
	size_t len = json_is_string(content) ? json_string_length(content) : 0;
	if (!strcmp(role, "tool"))
		return put_item(items, "fco", h, NULL, -1,
				json_pack("{s:s, s:s, s:s%, s:s}", "type", "function_call_output",
					  "call_id", str_or(json_object_get(m, "tool_call_id")),
					  "output", text, len, "status", "completed"));
	if (strcmp(role, "assistant"))
		return put_item(items, "msg", h, NULL, -1,
				json_pack("{s:s, s:s, s:s, s:[{s:s, s:s%}]}", "type", "message",
					  "role", role, "status", "completed", "content", "type",
					  "input_text", "text", text, len));
	const json_t *rc = json_object_get(m, "reasoning_content");
	const json_t *calls = json_object_get(m, "tool_calls");
	if (json_is_string(rc) && json_string_length(rc)) {
		json_t *it = reasoning_item("", json_string_value(rc), json_string_length(rc));
		if (!put_item(items, "rs", XXH3_64bits_withSeed("rs", 2, h), resp, -1, it))
			return false;
	}
	/* the message unless the turn is calls alone (an empty one stays: the model said it),
	 * and one to open the turn where the calls would join the assistant's turn before */
	if (len || !json_array_size(calls) || after_assistant) {
		json_t *it = message_item("", "completed", text_part(text, len, NULL));
		if (!put_item(items, "msg", h, resp, -1, it))
			return false;
	}
	size_t i;
	const json_t *call;
	json_array_foreach(calls, i, call) {
		uint64_t hc = XXH3_64bits_withSeed(&i, sizeof i, h);
		if (!put_item(items, "fc", hc, resp, (int)i, call_item("", call, "completed")))
			return false;
	}
	return true;
}

json_t *oai_messages_items(const json_t *msgs, size_t n, const char *const *answer_of)
{
	json_t *items = json_array();
	uint64_t h = 0x77696b6bULL; /* "wikk" */
	for (size_t i = 0; items && i < n && i < json_array_size(msgs); i++) {
		const json_t *m = json_array_get(msgs, i);
		static const char *const keys[] = {"role", "content", "reasoning_content",
						   "tool_call_id"};
		for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
			h = chain(h, json_object_get(m, keys[k]));
		size_t c;
		const json_t *call;
		json_array_foreach(json_object_get(m, "tool_calls"), c, call) {
			const json_t *fn = json_object_get(call, "function");
			h = chain(chain(chain(h, json_object_get(call, "id")),
					json_object_get(fn, "name")),
				  json_object_get(fn, "arguments"));
		}
		const char *prev = str_or(json_object_get(json_array_get(msgs, i - 1), "role"));
		if (!message_items(items, m, h, i && !strcmp(prev, "assistant"),
				   answer_of ? answer_of[i] : NULL)) {
			json_decref(items);
			items = NULL;
		}
	}
	return items;
}

json_t *oai_input_items_list(const json_t *conversation, const char *const *answer_of, int limit,
			     bool asc, const char *after, struct oai_err *e)
{
	size_t n = json_array_size(conversation);
	/* less the answer */
	json_t *items = oai_messages_items(conversation, n ? n - 1 : 0, answer_of);
	if (!items) {
		nomem(e);
		return NULL;
	}
	long total = (long)json_array_size(items), at = asc ? 0 : total - 1, step = asc ? 1 : -1;
	if (after) {
		for (at = 0; at < total; at++)
			if (!strcmp(str_or(json_object_get(json_array_get(items, (size_t)at), "id")),
				    after))
				break;
		if (at == total) {
			json_decref(items);
			oai_errf(e, 400, IRE, "invalid_value", "after",
				 "after: the response's input items hold no item '%.60s'", after);
			return NULL;
		}
		at += step;
	}
	json_t *data = json_array();
	for (; data && at >= 0 && at < total && (long)json_array_size(data) < limit; at += step)
		if (json_array_append(data, json_array_get(items, (size_t)at))) {
			json_decref(data);
			data = NULL;
		}
	json_decref(items);
	size_t got = json_array_size(data);
	json_t *first = got ? json_object_get(json_array_get(data, 0), "id") : NULL;
	json_t *last = got ? json_object_get(json_array_get(data, got - 1), "id") : NULL;
	json_t *list = data ? json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data",
					data, "first_id", first, "last_id", last, "has_more",
					at >= 0 && at < total)
			    : NULL;
	if (!list)
		nomem(e);
	return list;
}
