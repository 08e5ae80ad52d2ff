/*
 * job.c - decode a job, encode a result. Pure: see job.h.
 *
 * Decoding uses jansson. Encoding is written out by hand: the result must print cost_usd
 * with exactly 6 decimals from an integer, and engine text may hold invalid UTF-8 (a token
 * that ends mid-character), which jansson refuses but a result must still carry.
 */
#include "worker/job.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/grammar.h"

const char *job_err_code(enum job_err e)
{
	switch (e) {
	case JOB_OK: return "ok";
	case JOB_EINVALID_JSON: return "invalid_json";
	case JOB_EINVALID_INPUT: return "invalid_input";
	case JOB_EPROMPT_TOO_LONG: return "prompt_too_long";
	case JOB_EMAX_TOKENS: return "max_tokens_range";
	case JOB_ETIMEOUT: return "timeout";
	case JOB_ECANCELLED: return "cancelled";
	case JOB_EENGINE: return "engine_error";
	case JOB_EINTERNAL: return "internal";
	}
	return "internal";
}

const char *job_status_name(enum job_status s)
{
	switch (s) {
	case JOB_COMPLETED: return "COMPLETED";
	case JOB_FAILED: return "FAILED";
	case JOB_TIMED_OUT: return "TIMED_OUT";
	case JOB_CANCELLED: return "CANCELLED";
	}
	return "FAILED";
}

bool job_id_valid(const char *s)
{
	size_t n = 0;
	if (!s)
		return false;
	for (; s[n]; n++) {
		char c = s[n];
		if (n >= JOB_ID_MAX)
			return false;
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	/* "." and ".." would name directories in the spool */
	return n > 0 && strcmp(s, ".") && strcmp(s, "..");
}

/* ---- decoding ---- */

static enum job_err fail(char *err, size_t errsz, enum job_err e, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static enum job_err fail(char *err, size_t errsz, enum job_err e, const char *fmt, ...)
{
	if (err && errsz) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errsz, fmt, ap);
		va_end(ap);
	}
	return e;
}

/* Copies a JSON string of 1..max bytes with no NUL into a new buffer. */
static char *dup_string(const json_t *v, size_t max, size_t *len);

/* dup_string for a member named what: a NUL byte blames the job; a failed malloc does not. */
static enum job_err dup_member(const json_t *v, size_t max, char **out, const char *what,
			       char *err, size_t errsz)
{
	if ((*out = dup_string(v, max, NULL)))
		return JOB_OK;
	if (memchr(json_string_value(v), 0, json_string_length(v)))
		return fail(err, errsz, JOB_EINVALID_INPUT, "%s contains a NUL byte", what);
	return fail(err, errsz, JOB_EINTERNAL, "out of memory copying %s", what);
}

static char *dup_string(const json_t *v, size_t max, size_t *len)
{
	size_t n = json_string_length(v);
	if (n > max || memchr(json_string_value(v), 0, n))
		return NULL;
	char *p = malloc(n + 1);
	if (p) {
		memcpy(p, json_string_value(v), n);
		p[n] = 0;
	}
	if (len)
		*len = n;
	return p;
}

static enum job_err decode_stop(const json_t *stop, struct job *j, char *err, size_t errsz)
{
	const json_t *one[1] = {stop};
	const json_t *const *items = one;
	size_t n = 1;
	json_t *arr_items[JOB_STOP_MAX];
	if (json_is_array(stop)) {
		n = json_array_size(stop);
		if (n > JOB_STOP_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.stop has %zu strings; at most %d are allowed", n, JOB_STOP_MAX);
		for (size_t i = 0; i < n; i++)
			arr_items[i] = json_array_get(stop, i);
		items = (const json_t *const *)arr_items;
	} else if (!json_is_string(stop)) {
		return fail(err, errsz, JOB_EINVALID_INPUT,
			    "input.stop must be a string or an array of strings");
	}
	for (size_t i = 0; i < n; i++) {
		if (!json_is_string(items[i]))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.stop[%zu] is not a string", i);
		size_t len = json_string_length(items[i]);
		if (len == 0 || len > JOB_STOP_LEN_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.stop[%zu] has %zu bytes; each stop string needs 1 to %d", i,
				    len, JOB_STOP_LEN_MAX);
		char what[48];
		snprintf(what, sizeof what, "input.stop[%zu]", i);
		enum job_err e = dup_member(items[i], JOB_STOP_LEN_MAX, &j->stop[j->n_stop], what, err,
					    errsz);
		if (e != JOB_OK)
			return e;
		j->n_stop++;
	}
	return JOB_OK;
}

/* An assistant message's tool_calls: [{"type": "function", "function": {"name": S,
 * "arguments": S or an object}}] (OpenAI's; "arguments" a JSON object's text), each counted
 * in total (the bytes of the messages). */
static enum job_err decode_calls(const json_t *calls, struct job_message *m, size_t i,
				 size_t *total, char *err, size_t errsz)
{
	size_t n = json_array_size(calls);
	if (!json_is_array(calls) || n > JOB_CALLS_MAX)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages[%zu].tool_calls must be "
			    "an array of at most %d calls", i, JOB_CALLS_MAX);
	if (n && !(m->calls = calloc(n, sizeof *m->calls)))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	for (size_t k = 0; k < n; k++) {
		const json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
		const json_t *ty = json_object_get(c, "type"), *name = json_object_get(f, "name");
		const json_t *args = json_object_get(f, "arguments");
		if (!json_is_object(c) || (ty && !(json_is_string(ty) &&
						   !strcmp(json_string_value(ty), "function"))) ||
		    !json_is_string(name) || json_string_length(name) == 0 ||
		    json_string_length(name) > JOB_NAME_MAX ||
		    strlen(json_string_value(name)) != json_string_length(name))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages[%zu].tool_calls"
				    "[%zu] must be {\"type\": \"function\", \"function\": {\"name\": "
				    "a string of 1 to %d bytes, \"arguments\": ...}}", i, k,
				    JOB_NAME_MAX);
		json_t *obj = NULL;
		if (json_is_string(args))
			obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
		else if (json_is_object(args))
			obj = json_incref((json_t *)args);
		else if (!args || json_is_null(args))
			obj = json_object();
		char *text = json_is_object(obj) ? json_dumps(obj, JSON_COMPACT) : NULL;
		json_decref(obj);
		if (!text)
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages[%zu].tool_calls"
				    "[%zu].function.arguments must be a JSON object (or its text)", i,
				    k);
		m->calls[k].arguments = text;
		m->n_calls = (int)k + 1;
		if (!(m->calls[k].name = strdup(json_string_value(name))))
			return fail(err, errsz, JOB_EINTERNAL, "out of memory");
		*total += strlen(text) + json_string_length(name);
		if (*total > JOB_PROMPT_MAX)
			return fail(err, errsz, JOB_EPROMPT_TOO_LONG,
				    "input.messages hold more than %u bytes of content", JOB_PROMPT_MAX);
	}
	return JOB_OK;
}

/* input.tools: [{"type": "function", "function": {"name": S, ...}}], at most JOB_TOOLS_MAX,
 * kept as compact JSON text (their keys in order). */
static enum job_err decode_tools(const json_t *tools, struct job *j, char *err, size_t errsz)
{
	size_t n = json_array_size(tools);
	if (!json_is_array(tools) || n > JOB_TOOLS_MAX)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.tools must be an array of at most "
			    "%d tools", JOB_TOOLS_MAX);
	if (!j->messages)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.tools needs input.messages (a "
			    "chat): a prompt is the model's text as it is");
	for (size_t k = 0; k < n; k++) {
		const json_t *t = json_array_get(tools, k), *ty = json_object_get(t, "type");
		const json_t *f = json_object_get(t, "function"), *name = json_object_get(f, "name");
		const json_t *params = json_object_get(f, "parameters");
		if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
		    !json_is_object(f) || !json_is_string(name) || json_string_length(name) == 0 ||
		    json_string_length(name) > JOB_NAME_MAX || (params && !json_is_object(params)))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.tools[%zu] must be "
				    "{\"type\": \"function\", \"function\": {\"name\": a string of 1 "
				    "to %d bytes, \"parameters\": an object, ...}}", k, JOB_NAME_MAX);
	}
	if (!n)
		return JOB_OK;
	if (!(j->tools = json_dumps(tools, JSON_COMPACT)))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	if (strlen(j->tools) > JOB_PROMPT_MAX)
		return fail(err, errsz, JOB_EPROMPT_TOO_LONG, "input.tools hold more than %u bytes",
			    JOB_PROMPT_MAX);
	return JOB_OK;
}

/* input.tool_choice: "auto" (the default), "none" (the tools are left out), "required" or
 * {"type": "function", "function": {"name": one of the tools'}}: j->forced. */
static enum job_err decode_choice(const json_t *c, struct job *j, char *err, size_t errsz)
{
	const char *s = json_string_value(c);
	if (!c || json_is_null(c) || (s && !strcmp(s, "auto")))
		return JOB_OK;
	if (s && !strcmp(s, "none")) {
		free(j->tools);
		j->tools = NULL;
		return JOB_OK;
	}
	const json_t *f = json_object_get(c, "function"), *ty = json_object_get(c, "type");
	const char *name = json_string_value(json_object_get(f, "name"));
	if (!(s && !strcmp(s, "required")) &&
	    !(name && json_is_string(ty) && !strcmp(json_string_value(ty), "function")))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.tool_choice is \"auto\", "
			    "\"none\", \"required\" or {\"type\": \"function\", \"function\": "
			    "{\"name\": ...}}");
	json_t *tools = j->tools ? json_loads(j->tools, 0, NULL) : NULL;
	bool found = false;
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		const char *n = json_string_value(json_object_get(json_object_get(t, "function"),
								  "name"));
		found |= name && n && !strcmp(n, name);
	}
	json_decref(tools);
	if (!j->tools || (name && !found))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.tool_choice: %s%.*s%s is not "
			    "among input.tools", name ? "the function '" : "a call",
			    name ? JOB_NAME_MAX : 0, name ? name : "", name ? "'" : "");
	if (!(j->forced = strdup(name ? name : "")))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	return JOB_OK;
}

static enum job_err decode_messages(const json_t *msgs, struct job *j, char *err, size_t errsz)
{
	if (!json_is_array(msgs))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages must be an array");
	size_t n = json_array_size(msgs), total = 0;
	if (n == 0)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages is empty");
	if (n > JOB_MESSAGES_MAX)
		return fail(err, errsz, JOB_EINVALID_INPUT,
			    "input.messages has %zu messages; at most %d are allowed", n,
			    JOB_MESSAGES_MAX);
	if (!(j->messages = calloc(n, sizeof *j->messages)))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *m = json_array_get(msgs, i);
		if (!json_is_object(m))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.messages[%zu] is not an object", i);
		const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
		if (!json_is_string(role) || json_string_length(role) == 0 ||
		    json_string_length(role) > JOB_ROLE_MAX || strlen(json_string_value(role)) != json_string_length(role))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.messages[%zu].role must be a string of 1 to %d bytes", i,
				    JOB_ROLE_MAX);
		const json_t *calls = json_object_get(m, "tool_calls");
		bool has_calls = calls && !json_is_null(calls);
		if (has_calls && strcmp(json_string_value(role), "assistant"))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.messages[%zu].tool_calls: only an assistant message has them",
				    i);
		if (!json_is_string(content) && !(has_calls && (!content || json_is_null(content))))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.messages[%zu].content must be a string", i);
		size_t len = json_string_length(content);
		total += len;
		if (total > JOB_PROMPT_MAX)
			return fail(err, errsz, JOB_EPROMPT_TOO_LONG,
				    "input.messages hold more than %u bytes of content", JOB_PROMPT_MAX);
		memcpy(j->messages[i].role, json_string_value(role), json_string_length(role) + 1);
		j->n_messages = (int)i + 1;
		char what[48];
		snprintf(what, sizeof what, "input.messages[%zu].content", i);
		enum job_err e = JOB_OK;
		if (json_is_string(content))
			e = dup_member(content, JOB_PROMPT_MAX, &j->messages[i].content, what, err,
				       errsz);
		else if (!(j->messages[i].content = strdup(""))) /* null beside tool_calls */
			e = fail(err, errsz, JOB_EINTERNAL, "out of memory");
		if (e == JOB_OK && has_calls)
			e = decode_calls(calls, &j->messages[i], i, &total, err, errsz);
		if (e != JOB_OK)
			return e;
	}
	return JOB_OK;
}

/* A JSON number as a double; false when v is not a number. */
static bool number(const json_t *v, double *out)
{
	if (!json_is_number(v))
		return false;
	*out = json_number_value(v);
	return true;
}

/* input.response_format: text, json_object, or json_schema with its schema (compiled here,
 * so that a schema wick cannot honour is refused with the job). */
static enum job_err decode_format(const json_t *v, struct job *j, char *err, size_t errsz)
{
	const char *t = json_string_value(json_object_get(v, "type"));
	if (!json_is_object(v) || !t ||
	    (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema")))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.response_format must be "
			    "{\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
			    "\"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}");
	if (!strcmp(t, "text"))
		return JOB_OK;
	j->json = true;
	const json_t *js = json_object_get(v, "json_schema");
	if (!strcmp(t, "json_object"))
		return JOB_OK;
	const json_t *sch = json_object_get(js, "schema");
	if (!json_is_object(js) || !(json_is_object(sch) || json_is_boolean(sch)))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.response_format.json_schema "
			    "must be an object with a \"schema\" (a JSON Schema)");
	if (!(j->schema = json_dumps(sch, JSON_COMPACT | JSON_ENCODE_ANY)))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	struct gram *g;
	char msg[WK_ERRSZ];
	int rc = gram_compile(j->schema, strlen(j->schema), &g, msg, sizeof msg);
	gram_free(g);
	if (rc != WK_OK)
		return fail(err, errsz, rc == WK_ENOMEM ? JOB_EINTERNAL : JOB_EINVALID_INPUT,
			    "input.response_format.json_schema.schema: %s", msg);
	return JOB_OK;
}

/* input.logit_bias: {"ID": bias}, ID a token id's decimal digits. */
static enum job_err decode_bias(const json_t *v, struct job *j, char *err, size_t errsz)
{
	if (!json_is_object(v))
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.logit_bias must be an object of "
			    "token ids (as strings) to biases");
	size_t n = json_object_size(v);
	if (n > JOB_BIAS_IDS_MAX)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.logit_bias has %zu ids; the "
			    "limit is %d", n, JOB_BIAS_IDS_MAX);
	j->bias_id = malloc((n + 1) * sizeof *j->bias_id);
	j->bias = malloc((n + 1) * sizeof *j->bias);
	if (!j->bias_id || !j->bias)
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	const char *key;
	const json_t *b;
	double d;
	json_object_foreach((json_t *)v, key, b) {
		char *end;
		errno = 0;
		long id = strtol(key, &end, 10);
		if (!*key || *end || !isdigit((unsigned char)*key) || errno || id > INT32_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.logit_bias: \"%.40s\" is "
				    "not a token id", key);
		if (!number(b, &d) || d < -JOB_BIAS_MAX || d > JOB_BIAS_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.logit_bias[\"%s\"] must be "
				    "a number from %g to %g", key, -JOB_BIAS_MAX, JOB_BIAS_MAX);
		j->bias_id[j->n_bias] = (int)id;
		j->bias[j->n_bias++] = (float)d;
	}
	return JOB_OK;
}

/* input.prompt as token ids. */
static enum job_err decode_ids(const json_t *a, struct job *j, char *err, size_t errsz)
{
	size_t n = json_array_size(a), i;
	const json_t *v;
	if (n == 0)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input.prompt has no token ids");
	if (n > JOB_PROMPT_IDS_MAX)
		return fail(err, errsz, JOB_EPROMPT_TOO_LONG,
			    "input.prompt has %zu token ids; the limit is %d", n, JOB_PROMPT_IDS_MAX);
	if (!(j->prompt_ids = malloc(n * sizeof *j->prompt_ids)))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory");
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > INT32_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.prompt[%zu] must be a "
				    "token id (an integer from 0)", i);
		j->prompt_ids[i] = (int)json_integer_value(v);
	}
	j->n_prompt_ids = (int)n;
	return JOB_OK;
}

static enum job_err decode_input(const json_t *in, struct job *j, char *err, size_t errsz)
{
	if (!in)
		return fail(err, errsz, JOB_EINVALID_INPUT, "the job has no \"input\"");
	if (!json_is_object(in))
		return fail(err, errsz, JOB_EINVALID_INPUT, "\"input\" must be an object");
	const json_t *prompt = json_object_get(in, "prompt"), *msgs = json_object_get(in, "messages");
	enum job_err e;
	if (prompt && msgs)
		return fail(err, errsz, JOB_EINVALID_INPUT,
			    "input has both \"prompt\" and \"messages\"; give one");
	if (!prompt && !msgs)
		return fail(err, errsz, JOB_EINVALID_INPUT, "input needs \"prompt\" or \"messages\"");
	if (json_is_array(prompt)) {
		if ((e = decode_ids(prompt, j, err, errsz)) != JOB_OK)
			return e;
	} else if (prompt) {
		if (!json_is_string(prompt))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.prompt must be a string "
				    "or an array of token ids");
		size_t len = json_string_length(prompt);
		if (len > JOB_PROMPT_MAX)
			return fail(err, errsz, JOB_EPROMPT_TOO_LONG,
				    "input.prompt has %zu bytes; the limit is %u", len, JOB_PROMPT_MAX);
		if ((e = dup_member(prompt, JOB_PROMPT_MAX, &j->prompt, "input.prompt", err, errsz)) !=
		    JOB_OK)
			return e;
	} else if ((e = decode_messages(msgs, j, err, errsz)) != JOB_OK) {
		return e;
	}
	const json_t *tools = json_object_get(in, "tools");
	if (tools && !json_is_null(tools) && (e = decode_tools(tools, j, err, errsz)) != JOB_OK)
		return e;
	if ((e = decode_choice(json_object_get(in, "tool_choice"), j, err, errsz)) != JOB_OK)
		return e;
	const json_t *par = json_object_get(in, "parallel_tool_calls");
	if (par && !json_is_null(par) && !json_is_boolean(par))
		return fail(err, errsz, JOB_EINVALID_INPUT,
			    "input.parallel_tool_calls must be true or false");
	j->one_call = json_is_false(par);

	const json_t *v;
	double d;
	if ((v = json_object_get(in, "max_tokens")) && !json_is_null(v)) {
		if (json_is_real(v)) {
			/* 16.0 is a whole number some JSON writers produce; 1.5 is not */
			d = json_real_value(v);
			if (d != (double)(long long)d)
				return fail(err, errsz, JOB_EINVALID_INPUT, "input.max_tokens must be an integer");
		} else if (json_is_integer(v)) {
			d = (double)json_integer_value(v);
		} else {
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.max_tokens must be an integer");
		}
		if (d < 0 || d > JOB_MAX_TOKENS_MAX ||
		    (d == 0 && !json_is_integer(json_object_get(in, "prompt_logprobs"))))
			return fail(err, errsz, JOB_EMAX_TOKENS, "input.max_tokens is %.0f; it must be "
				    "1 to %d (0 only with input.prompt_logprobs: the prompt scored)",
				    d, JOB_MAX_TOKENS_MAX);
		j->max_tokens = (int)d;
	}
	if ((v = json_object_get(in, "temperature")) && !json_is_null(v)) {
		if (!number(v, &d) || d < 0 || d > JOB_TEMPERATURE_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.temperature must be a number from 0 to %g", JOB_TEMPERATURE_MAX);
		j->temperature = (float)d;
	}
	if ((v = json_object_get(in, "top_p")) && !json_is_null(v)) {
		if (!number(v, &d) || !(d > 0) || d > 1)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.top_p must be a number in (0, 1]");
		j->top_p = (float)d;
	}
	if ((v = json_object_get(in, "top_k")) && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > JOB_TOP_K_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.top_k must be an integer from 0 to %d", JOB_TOP_K_MAX);
		j->top_k = (int)json_integer_value(v);
	}
	if ((v = json_object_get(in, "seed")) && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.seed must be a non-negative integer");
		j->seed = (uint64_t)json_integer_value(v);
		j->has_seed = true;
	}
	if ((v = json_object_get(in, "stream")) && !json_is_null(v)) {
		if (!json_is_boolean(v))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.stream must be true or false");
		j->stream = json_is_true(v);
	}
	static const char *const pen[] = {"presence_penalty", "frequency_penalty"};
	float *pv[] = {&j->presence_penalty, &j->frequency_penalty};
	for (int k = 0; k < 2; k++)
		if ((v = json_object_get(in, pen[k])) && !json_is_null(v)) {
			if (!number(v, &d) || d < -JOB_PENALTY_MAX || d > JOB_PENALTY_MAX)
				return fail(err, errsz, JOB_EINVALID_INPUT,
					    "input.%s must be a number from %g to %g", pen[k],
					    -JOB_PENALTY_MAX, JOB_PENALTY_MAX);
			*pv[k] = (float)d;
		}
	if ((v = json_object_get(in, "repetition_penalty")) && !json_is_null(v)) {
		if (!number(v, &d) || !(d > 0) || d > JOB_REPETITION_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.repetition_penalty must be a number in (0, %g] (1: off)",
				    JOB_REPETITION_MAX);
		j->repetition_penalty = (float)d;
	}
	if ((v = json_object_get(in, "logit_bias")) && !json_is_null(v) &&
	    (e = decode_bias(v, j, err, errsz)) != JOB_OK)
		return e;
	if ((v = json_object_get(in, "response_format")) && !json_is_null(v) &&
	    (e = decode_format(v, j, err, errsz)) != JOB_OK)
		return e;
	if ((v = json_object_get(in, "logprobs")) && !json_is_null(v)) {
		if (!json_is_boolean(v))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.logprobs must be true or false");
		j->logprobs = json_is_true(v);
	}
	if ((v = json_object_get(in, "top_logprobs")) && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > JOB_TOP_LOGPROBS_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.top_logprobs must be an integer from 0 to %d",
				    JOB_TOP_LOGPROBS_MAX);
		j->top_logprobs = (int)json_integer_value(v);
		if (j->top_logprobs && !j->logprobs)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.top_logprobs needs input.logprobs true");
	}
	if ((v = json_object_get(in, "prompt_logprobs")) && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > JOB_TOP_LOGPROBS_MAX)
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.prompt_logprobs must be an integer from 0 to %d",
				    JOB_TOP_LOGPROBS_MAX);
		j->prompt_logprobs = true;
		j->prompt_top = (int)json_integer_value(v);
	}
	if ((v = json_object_get(in, "thinking")) && !json_is_null(v)) {
		if (!json_is_boolean(v))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.thinking must be true or false");
		if (json_is_true(v) && !j->messages)
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.thinking needs "
				    "input.messages (a chat): a prompt is the model's text as it is");
		j->thinking = json_is_true(v);
	}
	if ((v = json_object_get(in, "continue_final_message")) && !json_is_null(v)) {
		const struct job_message *last = j->messages ? &j->messages[j->n_messages - 1] : NULL;
		if (!json_is_boolean(v))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.continue_final_message must be true or false");
		j->continue_final = json_is_true(v);
		if (j->continue_final &&
		    (!last || strcmp(last->role, "assistant") || last->n_calls))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.continue_final_message: "
				    "the last message must be the assistant's, without tool calls (the "
				    "answer's start, continued)");
		if (j->continue_final && (j->thinking || j->forced))
			return fail(err, errsz, JOB_EINVALID_INPUT, "input.continue_final_message: "
				    "the answer's start is given, so thinking must be off and no call "
				    "forced (tool_choice)");
	}
	if ((v = json_object_get(in, "prediction")) && !json_is_null(v)) {
		if (!json_is_string(v))
			return fail(err, errsz, JOB_EINVALID_INPUT,
				    "input.prediction must be a string");
		if (json_string_length(v) > JOB_PROMPT_MAX)
			return fail(err, errsz, JOB_EPROMPT_TOO_LONG,
				    "input.prediction has %zu bytes; the limit is %u",
				    json_string_length(v), JOB_PROMPT_MAX);
		if ((e = dup_member(v, JOB_PROMPT_MAX, &j->prediction, "input.prediction", err,
				    errsz)) != JOB_OK)
			return e;
	}
	if ((v = json_object_get(in, "stop")) && !json_is_null(v))
		return decode_stop(v, j, err, errsz);
	return JOB_OK;
}

enum job_err job_decode(const char *body, size_t len, const char *queue_id, struct job *j,
			char *err, size_t errsz)
{
	memset(j, 0, sizeof *j);
	j->max_tokens = JOB_MAX_TOKENS_DEFAULT;
	j->temperature = 1.0f;
	j->top_p = 1.0f;
	j->repetition_penalty = 1.0f;
	j->timeout_s = JOB_TIMEOUT_DEFAULT;
	if (queue_id && job_id_valid(queue_id))
		strcpy(j->id, queue_id);
	if (err && errsz)
		err[0] = 0;

	if (!body)
		return fail(err, errsz, JOB_EINVALID_JSON, "the job has no body");
	if (len > JOB_BODY_MAX)
		return fail(err, errsz, JOB_EINVALID_INPUT, "the job has %zu bytes; the limit is %u", len,
			    JOB_BODY_MAX);
	json_error_t jerr;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	/* jansson's lexer reports a failed allocation as a syntax error ("string or '}'
	 * expected"), so a job is called invalid only when a second parse fails the same way:
	 * a transient allocation failure must not fail a good job for good. */
	if (!root)
		root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	/* it reports others as out_of_memory, or (in lex_init) not at all */
	if (!root && (json_error_code(&jerr) == json_error_out_of_memory || !jerr.text[0]))
		return fail(err, errsz, JOB_EINTERNAL, "out of memory parsing the job");
	if (!root)
		return fail(err, errsz, JOB_EINVALID_JSON, "the job is not valid JSON: %s (line %d, column %d)",
			    jerr.text, jerr.line, jerr.column);
	enum job_err e = JOB_OK;
	if (!json_is_object(root)) {
		e = fail(err, errsz, JOB_EINVALID_JSON, "the job must be a JSON object");
		goto out;
	}
	const json_t *v = json_object_get(root, "id");
	if (v) {
		if (!json_is_string(v) || !job_id_valid(json_string_value(v)) ||
		    strlen(json_string_value(v)) != json_string_length(v)) {
			e = fail(err, errsz, JOB_EINVALID_INPUT,
				 "\"id\" must be a string matching [A-Za-z0-9._-]{1,%d}", JOB_ID_MAX);
			goto out;
		}
		if (queue_id && strcmp(queue_id, json_string_value(v))) {
			e = fail(err, errsz, JOB_EINVALID_INPUT,
				 "\"id\" is '%s' but the queue delivered the job as '%.128s'",
				 json_string_value(v), queue_id);
			goto out;
		}
		strcpy(j->id, json_string_value(v));
	} else if (!j->id[0]) {
		e = fail(err, errsz, JOB_EINVALID_INPUT, "the job has no \"id\"");
		goto out;
	}
	if ((v = json_object_get(root, "tenant")) && !json_is_null(v)) {
		if (!json_is_string(v) || !job_id_valid(json_string_value(v)) ||
		    strlen(json_string_value(v)) != json_string_length(v)) {
			e = fail(err, errsz, JOB_EINVALID_INPUT,
				 "\"tenant\" must be a string matching [A-Za-z0-9._-]{1,%d}", JOB_ID_MAX);
			goto out;
		}
		strcpy(j->tenant, json_string_value(v));
	}
	if ((v = json_object_get(root, "timeout_s")) && !json_is_null(v)) {
		double d;
		if (!number(v, &d) || !(d > 0) || d > JOB_TIMEOUT_MAX) {
			e = fail(err, errsz, JOB_EINVALID_INPUT,
				 "\"timeout_s\" must be a number in (0, %.0f]", JOB_TIMEOUT_MAX);
			goto out;
		}
		j->timeout_s = d;
	}
	e = decode_input(json_object_get(root, "input"), j, err, errsz);
	if (e == JOB_OK && j->json && j->tools)
		e = fail(err, errsz, JOB_EINVALID_INPUT, "input.response_format: a JSON format "
			 "cannot be combined with input.tools");
out:
	json_decref(root);
	return e;
}

void job_free(struct job *j)
{
	if (!j)
		return;
	free(j->prompt);
	j->prompt = NULL;
	free(j->prompt_ids);
	j->prompt_ids = NULL;
	free(j->prediction);
	j->prediction = NULL;
	free(j->tools);
	j->tools = NULL;
	free(j->forced);
	j->forced = NULL;
	free(j->bias_id);
	j->bias_id = NULL;
	free(j->schema);
	j->schema = NULL;
	free(j->bias);
	j->bias = NULL;
	j->n_bias = 0;
	for (int i = 0; i < j->n_messages; i++) {
		free(j->messages[i].content);
		for (int k = 0; k < j->messages[i].n_calls; k++) {
			free(j->messages[i].calls[k].name);
			free(j->messages[i].calls[k].arguments);
		}
		free(j->messages[i].calls);
	}
	free(j->messages);
	j->messages = NULL;
	j->n_messages = 0;
	for (int i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	j->n_stop = 0;
}

/* ---- encoding ---- */

static void put(struct wk_buf *b, const char *s, size_t n) { wk_buf_add(b, s, n); }

static void puts_(struct wk_buf *b, const char *s) { put(b, s, strlen(s)); }

static void putf(struct wk_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct wk_buf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n > 0)
		put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned min;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		len = 2, min = 0x80;
	else if (c >= 0xE0 && c <= 0xEF)
		len = 3, min = 0x800;
	else if (c >= 0xF0 && c <= 0xF4)
		len = 4, min = 0x10000;
	else
		return 0;
	if (n < len)
		return 0;
	unsigned cp = c & (0x7F >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return len;
}

/* A JSON string; invalid UTF-8 bytes become U+FFFD. NULL is encoded as "". */
static void put_str(struct wk_buf *b, const char *s, size_t n)
{
	put(b, "\"", 1);
	const unsigned char *u = (const unsigned char *)(s ? s : "");
	size_t i = 0, run = 0;
	while (i < n) {
		unsigned c = u[i];
		size_t k = c >= 0x20 && c != '"' && c != '\\' ? utf8_seq(u + i, n - i) : 0;
		if (k) {
			i += k;
			run += k;
			continue;
		}
		put(b, (const char *)u + i - run, run);
		run = 0;
		if (c == '"')
			puts_(b, "\\\"");
		else if (c == '\\')
			puts_(b, "\\\\");
		else if (c == '\n')
			puts_(b, "\\n");
		else if (c == '\t')
			puts_(b, "\\t");
		else if (c == '\r')
			puts_(b, "\\r");
		else if (c < 0x20)
			putf(b, "\\u%04x", c);
		else
			puts_(b, "\xEF\xBF\xBD"); /* U+FFFD for an invalid byte */
		i++;
	}
	put(b, (const char *)u + i - run, run);
	put(b, "\"", 1);
}

static void put_cstr(struct wk_buf *b, const char *s) { put_str(b, s, s ? strlen(s) : 0); }

char *job_stream_chunk(const char *text, size_t len, int attempt, size_t *out_len)
{
	struct wk_buf b = {0};
	puts_(&b, "{\"output\": {\"text\": ");
	put_str(&b, text, len);
	puts_(&b, "}");
	if (attempt > 0)
		putf(&b, ", \"attempt\": %d", attempt);
	puts_(&b, "}");
	put(&b, "", 1);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	if (out_len)
		*out_len = b.len - 1;
	return b.p;
}

/* One token's text, logprob and bytes (the members an entry and its alternatives share). */
static void put_token(struct wk_buf *b, const char *tok, size_t len, float lp)
{
	puts_(b, "{\"token\": ");
	put_str(b, tok, len);
	if (isnan(lp)) /* (a prompt's first token: nothing before it) */
		puts_(b, ", \"logprob\": null, \"bytes\": [");
	else
		putf(b, ", \"logprob\": %.9g, \"bytes\": [", isfinite(lp) ? lp : -9999.0);
	for (size_t i = 0; i < len; i++)
		putf(b, i ? ", %u" : "%u", (unsigned)(unsigned char)tok[i]);
	puts_(b, "]");
}

static void put_logprobs(struct wk_buf *b, const struct job_logprob *lp, int n)
{
	puts_(b, "[");
	for (int i = 0; i < n; i++) {
		if (i)
			puts_(b, ", ");
		put_token(b, lp[i].tok, lp[i].len, lp[i].lp);
		if (lp[i].rank > 0)
			putf(b, ", \"rank\": %d", lp[i].rank);
		puts_(b, ", \"top_logprobs\": [");
		for (int k = 0; k < lp[i].n_top; k++) {
			if (k)
				puts_(b, ", ");
			put_token(b, lp[i].top[k].tok, lp[i].top[k].len, lp[i].top[k].lp);
			if (lp[i].rank > 0)
				putf(b, ", \"id\": %d", lp[i].top[k].id);
			puts_(b, "}");
		}
		puts_(b, "]}");
	}
	puts_(b, "]");
}

char *job_logprobs_json(const struct job_logprob *lp, int n, size_t *len)
{
	struct wk_buf b = {0};
	put_logprobs(&b, lp, n);
	put(&b, "", 1);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	if (len)
		*len = b.len - 1;
	return b.p;
}

/* A finite double for JSON (JSON has no NaN or infinity: those print as 0). */
static void put_seconds(struct wk_buf *b, double x)
{
	if (!(x == x) || x > 1e15 || x < -1e15)
		x = 0;
	putf(b, "%.6f", x);
}

char *job_encode_result(const struct job_result *r, size_t *len)
{
	struct wk_buf b = {0};
	puts_(&b, "{\"id\": ");
	put_cstr(&b, r->id);
	puts_(&b, ", \"status\": \"");
	puts_(&b, job_status_name(r->status));
	puts_(&b, "\", \"output\": {\"text\": ");
	put_str(&b, r->text, r->text ? (r->text_len ? r->text_len : strlen(r->text)) : 0);
	puts_(&b, ", \"token_ids\": [");
	for (int i = 0; r->token_ids && i < r->n_tokens; i++)
		putf(&b, i ? ", %d" : "%d", r->token_ids[i]);
	puts_(&b, "], \"finish_reason\": ");
	if (r->finish_reason)
		put_cstr(&b, r->finish_reason);
	else
		puts_(&b, "null");
	if (r->stop_sequence) {
		puts_(&b, ", \"stop_sequence\": ");
		put_cstr(&b, r->stop_sequence);
	}
	if (r->has_reasoning) {
		puts_(&b, ", \"reasoning_content\": ");
		put_str(&b, r->reasoning, r->reasoning_len);
	}
	json_t *calls = r->tool_calls ? json_loads(r->tool_calls, 0, NULL) : NULL;
	if (json_array_size(calls)) { /* OpenAI's shape, an id each */
		puts_(&b, ", \"tool_calls\": [");
		size_t k;
		json_t *c;
		json_array_foreach(calls, k, c) {
			const json_t *nm = json_object_get(c, "name"), *a = json_object_get(c, "arguments");
			puts_(&b, k ? ", {\"id\": \"call_" : "{\"id\": \"call_");
			puts_(&b, r->id ? r->id : "");
			putf(&b, "_%zu\", \"type\": \"function\", \"function\": {\"name\": ", k);
			put_str(&b, json_string_value(nm), json_string_length(nm));
			puts_(&b, ", \"arguments\": ");
			put_str(&b, json_string_value(a), json_string_length(a));
			puts_(&b, "}}");
		}
		puts_(&b, "]");
	}
	json_decref(calls);
	if (r->has_logprobs) {
		puts_(&b, ", \"logprobs\": {\"content\": ");
		put_logprobs(&b, r->logprobs, r->n_logprobs);
		puts_(&b, "}");
	}
	if (r->has_prompt_logprobs) {
		puts_(&b, ", \"prompt_logprobs\": ");
		put_logprobs(&b, r->prompt_logprobs, r->n_prompt_logprobs);
		puts_(&b, ", \"prompt_token_ids\": [");
		for (int i = 0; r->prompt_ids && i < r->n_prompt_logprobs; i++)
			putf(&b, i ? ", %d" : "%d", r->prompt_ids[i]);
		puts_(&b, "]");
	}
	puts_(&b, "}");
	if (r->status != JOB_COMPLETED) {
		enum job_err e = r->err == JOB_OK ? JOB_EINTERNAL : r->err;
		puts_(&b, ", \"error\": {\"code\": \"");
		puts_(&b, job_err_code(e));
		puts_(&b, "\", \"message\": ");
		put_cstr(&b, r->message);
		puts_(&b, "}");
	}
	int64_t micro = r->cost_micro_usd;
	uint64_t mag = micro < 0 ? (uint64_t)0 - (uint64_t)micro : (uint64_t)micro;
	putf(&b, ", \"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, \"queue_seconds\": ",
	     r->prompt_tokens, r->completion_tokens);
	put_seconds(&b, r->queue_seconds);
	if (r->cached_tokens)
		putf(&b, ", \"prompt_tokens_details\": {\"cached_tokens\": %d}", r->cached_tokens);
	bool spec = r->accepted_prediction_tokens || r->rejected_prediction_tokens;
	if (spec || r->has_reasoning) {
		puts_(&b, ", \"completion_tokens_details\": {");
		if (spec)
			putf(&b, "\"accepted_prediction_tokens\": %d, \"rejected_prediction_tokens\": "
			     "%d", r->accepted_prediction_tokens, r->rejected_prediction_tokens);
		if (r->has_reasoning)
			putf(&b, "%s\"reasoning_tokens\": %d", spec ? ", " : "", r->reasoning_tokens);
		puts_(&b, "}");
	}
	puts_(&b, ", \"gpu_seconds\": ");
	put_seconds(&b, r->gpu_seconds);
	putf(&b, ", \"cost_usd\": %s%" PRIu64 ".%06" PRIu64 ", \"cost_micro_usd\": %" PRId64 "}",
	     micro < 0 ? "-" : "", mag / 1000000, mag % 1000000, micro);
	puts_(&b, ", \"worker\": ");
	put_cstr(&b, r->worker);
	putf(&b, ", \"attempt\": %d}", r->attempt);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	if (len)
		*len = b.len;
	return b.p;
}

char *job_encode_error(const char *id, enum job_status status, enum job_err e, const char *message,
		       const char *worker, int attempt, size_t *len)
{
	struct job_result r = {.id = id, .status = status, .err = e, .message = message,
			       .worker = worker, .attempt = attempt};
	return job_encode_result(&r, len);
}
