/*
 * chat.c - chat templates (see chat.h for the formats and their sources), the choice of
 * format for a model directory, and messages from JSON.
 */
#include "engine/chat.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"

/* ---- output buffer ----------------------------------------------------------------------- */

struct out {
	char *p;
	size_t n, cap;
	bool over; /* past CHAT_MAX_TEXT */
	bool nomem;
	char *bad; /* malformed input: what (malloc'd), the first only */
};

static void bad(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(struct out *o, const char *fmt, ...)
{
	if (o->bad)
		return;
	char msg[WK_ERRSZ];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!(o->bad = strdup(msg)))
		o->nomem = true;
}

static void put(struct out *o, const char *s, size_t n)
{
	if (o->over || o->nomem)
		return;
	if (n > CHAT_MAX_TEXT - o->n) {
		o->over = true;
		return;
	}
	if (o->cap - o->n < n + 1) {
		size_t cap = o->cap ? o->cap : 256;
		while (cap - o->n < n + 1)
			cap *= 2;
		char *q = realloc(o->p, cap);
		if (!q) {
			o->nomem = true;
			return;
		}
		o->p = q;
		o->cap = cap;
	}
	memcpy(o->p + o->n, s, n);
	o->n += n;
	o->p[o->n] = 0;
}

static void puts_(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

/* ---- Python string helpers --------------------------------------------------------------- */

struct span {
	const char *p;
	size_t n;
};

/* Python's str.isspace() for the character at p[0..n): its length in *len when it is
 * whitespace, else 0. Bytes that are not valid UTF-8 are never whitespace. */
static size_t py_space(const unsigned char *p, size_t n)
{
	unsigned c = p[0];
	if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20))
		return 1;
	if (n >= 2 && c == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0))
		return 2;
	if (n >= 3 && c == 0xE1 && p[1] == 0x9A && p[2] == 0x80) /* U+1680 */
		return 3;
	if (n >= 3 && c == 0xE2 && p[1] == 0x80 &&
	    (p[2] <= 0x8A || p[2] == 0xA8 || p[2] == 0xA9 || p[2] == 0xAF)) /* U+2000..200A, */
		return 3;                                    /* U+2028, U+2029, U+202F */
	if (n >= 3 && c == 0xE2 && p[1] == 0x81 && p[2] == 0x9F) /* U+205F */
		return 3;
	if (n >= 3 && c == 0xE3 && p[1] == 0x80 && p[2] == 0x80) /* U+3000 */
		return 3;
	return 0;
}

/* Python's s.rstrip(). */
static struct span py_rstrip(struct span s)
{
	const unsigned char *u = (const unsigned char *)s.p;
	/* try each character length that ends at the end */
	for (;;) {
		bool cut = false;
		for (size_t len = 1; len <= 3 && len <= s.n; len++)
			if (py_space(u + s.n - len, len) == len) {
				s.n -= len;
				cut = true;
				break;
			}
		if (!cut)
			return s;
	}
}

size_t chat_rstrip_len(const char *s, size_t n)
{
	return py_rstrip((struct span){s, n}).n;
}

/* Python's s.strip(). */
static struct span py_strip(struct span s)
{
	const unsigned char *u = (const unsigned char *)s.p;
	size_t a = 0, k;
	while (a < s.n && (k = py_space(u + a, s.n - a)))
		a += k;
	return py_rstrip((struct span){s.p + a, s.n - a});
}

static struct span lstrip_nl(struct span s)
{
	while (s.n && s.p[0] == '\n')
		s.p++, s.n--;
	return s;
}

static struct span rstrip_nl(struct span s)
{
	while (s.n && s.p[s.n - 1] == '\n')
		s.n--;
	return s;
}

static const char *find(struct span s, const char *needle)
{
	return memmem(s.p, s.n, needle, strlen(needle));
}

/* The last occurrence of needle in s, or NULL. */
static const char *find_last(struct span s, const char *needle)
{
	const char *hit = NULL, *h;
	struct span rest = s;
	size_t nl = strlen(needle);
	while ((h = find(rest, needle))) {
		hit = h;
		rest.n -= (size_t)(h + nl - rest.p);
		rest.p = h + nl;
	}
	return hit;
}

/* The templates' reasoning split of an assistant message: with a "</think>" in the content,
 *   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *   content   = content.split('</think>')[-1].lstrip('\n')
 * else no reasoning. */
static void split_reasoning(struct span c, struct span *reasoning, struct span *content)
{
	const char *first = find(c, "</think>");
	*reasoning = (struct span){c.p, 0};
	*content = c;
	if (!first)
		return;
	struct span r = rstrip_nl((struct span){c.p, (size_t)(first - c.p)});
	const char *open = find_last(r, "<think>");
	if (open)
		r = (struct span){open + 7, r.n - (size_t)(open + 7 - r.p)};
	*reasoning = lstrip_nl(r);
	const char *last = find_last(c, "</think>");
	*content = lstrip_nl((struct span){last + 8, c.n - (size_t)(last + 8 - c.p)});
}

/* ---- Python's json.dumps(ensure_ascii=False) -------------------------------------------- */

/* Python's repr of a float: the fewest digits that read back as v, in fixed notation for
 * exponents -4 to 15 (with ".0" when whole), else d.ddde+XX. */
static void py_float(struct out *o, double v)
{
	char buf[48], digits[24];
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	char *e = strchr(buf, 'e');
	int exp = atoi(e + 1), nd = 0;
	*e = 0;
	bool neg = buf[0] == '-';
	for (const char *q = buf + neg; *q && nd < (int)sizeof digits; q++)
		if (*q != '.')
			digits[nd++] = *q;
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	if (neg)
		puts_(o, "-");
	if (exp >= -4 && exp < 16) {
		if (exp >= 0) {
			for (int i = 0; i <= exp; i++)
				put(o, i < nd ? &digits[i] : "0", 1);
			puts_(o, ".");
			if (nd > exp + 1)
				put(o, digits + exp + 1, (size_t)(nd - exp - 1));
			else
				puts_(o, "0");
		} else {
			puts_(o, "0.");
			for (int i = 0; i < -exp - 1; i++)
				puts_(o, "0");
			put(o, digits, (size_t)nd);
		}
	} else {
		put(o, digits, 1);
		if (nd > 1) {
			puts_(o, ".");
			put(o, digits + 1, (size_t)(nd - 1));
		}
		snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
		puts_(o, buf);
	}
}

static void py_string(struct out *o, const char *p, size_t n)
{
	puts_(o, "\"");
	size_t run = 0; /* bytes copied as they are, waiting */
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
				  : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
				  : c == '\f' ? "\\f" : NULL;
		char u[8];
		if (!esc && c < 0x20) {
			snprintf(u, sizeof u, "\\u%04x", c);
			esc = u;
		}
		if (!esc) {
			run++;
			continue;
		}
		put(o, p + i - run, run);
		run = 0;
		puts_(o, esc);
	}
	put(o, p + n - run, run);
	puts_(o, "\"");
}

static void py_json(struct out *o, const json_t *v)
{
	char buf[32];
	size_t i;
	const char *k;
	json_t *x;
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		puts_(o, "{");
		i = 0;
		json_object_foreach((json_t *)v, k, x) {
			puts_(o, i++ ? ", " : "");
			py_string(o, k, strlen(k));
			puts_(o, ": ");
			py_json(o, x);
		}
		puts_(o, "}");
		break;
	case JSON_ARRAY:
		puts_(o, "[");
		json_array_foreach(v, i, x) {
			puts_(o, i ? ", " : "");
			py_json(o, x);
		}
		puts_(o, "]");
		break;
	case JSON_STRING: py_string(o, json_string_value(v), json_string_length(v)); break;
	case JSON_INTEGER:
		snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		puts_(o, buf);
		break;
	case JSON_REAL: py_float(o, json_real_value(v)); break;
	case JSON_TRUE: puts_(o, "true"); break;
	case JSON_FALSE: puts_(o, "false"); break;
	case JSON_NULL: puts_(o, "null"); break;
	}
}

int chat_py_json(const char *json, size_t len, char **out, size_t *out_len, char *err,
		 size_t errsz)
{
	*out = NULL;
	*out_len = 0;
	json_error_t jerr;
	json_t *v = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!v)
		return wk_errf(err, errsz, WK_EFORMAT, "not JSON: %d:%d: %s", jerr.line,
			       jerr.column, jerr.text);
	struct out o = {0};
	put(&o, "", 0);
	py_json(&o, v);
	json_decref(v);
	if (o.over || o.nomem) {
		free(o.p);
		return wk_errf(err, errsz, o.over ? WK_ELIMIT : WK_ENOMEM, "chat: out of room");
	}
	*out = o.p;
	*out_len = o.n;
	return WK_OK;
}

/* ---- rendering --------------------------------------------------------------------------- */

/* The system block that lists the tools (an array, not empty), as both GLM templates write
 * it; v45: GLM-4.5/4.6's call format, a line each. */
static void render_tools(struct out *o, const json_t *tools, bool v45)
{
	size_t i;
	json_t *t;
	puts_(o, "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the "
		 "user query.\n\nYou are provided with function signatures within <tools></tools> "
		 "XML tags:\n<tools>\n");
	json_array_foreach(tools, i, t) {
		py_json(o, t);
		puts_(o, "\n");
	}
	puts_(o, "</tools>\n\nFor each function call, output the function name and arguments "
		 "within the following XML format:\n");
	puts_(o, v45 ? "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
		       "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
		       "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
		     : "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>"
		       "{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>"
		       "{arg-value-2}</arg_value>...</tool_call>");
}

/* Message i's tool calls after its text. */
static void render_calls(struct out *o, const struct chat_msg *m, size_t i, bool v45)
{
	for (size_t c = 0; c < m->n_calls; c++) {
		const struct chat_call *k = &m->calls[c];
		json_t *args = NULL;
		if (k->args && k->args_len) {
			json_error_t jerr;
			args = json_loadb(k->args, k->args_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
			if (!args || !(json_is_object(args) || json_is_null(args))) {
				bad(o, "message %zu: tool call %zu's arguments are not a JSON object",
				    i, c);
				json_decref(args);
				return;
			}
		}
		puts_(o, v45 ? "\n<tool_call>" : "<tool_call>");
		put(o, k->name ? k->name : "", k->name_len);
		const char *key;
		json_t *v;
		json_object_foreach(args, key, v) {
			puts_(o, v45 ? "\n<arg_key>" : "<arg_key>");
			puts_(o, key);
			puts_(o, v45 ? "</arg_key>\n<arg_value>" : "</arg_key><arg_value>");
			if (json_is_string(v))
				put(o, json_string_value(v), json_string_length(v));
			else
				py_json(o, v);
			puts_(o, "</arg_value>");
		}
		puts_(o, v45 ? "\n</tool_call>" : "</tool_call>");
		json_decref(args);
	}
}

static bool ends_with(struct span s, const char *suffix)
{
	size_t k = strlen(suffix);
	return s.n >= k && !memcmp(s.p + s.n - k, suffix, k);
}

static void render_glm(struct out *o, const struct chat_msg *m, size_t n, const json_t *tools,
		       bool gen, bool thinking, bool v45)
{
	const char *nl = v45 ? "\n" : "";
	size_t last_user = (size_t)-1;
	for (size_t i = 0; i < n; i++)
		if (m[i].role == CHAT_USER)
			last_user = i;
	puts_(o, "[gMASK]<sop>");
	if (json_array_size(tools))
		render_tools(o, tools, v45);
	for (size_t i = 0; i < n; i++) {
		struct span c = {m[i].content ? m[i].content : "", m[i].len};
		switch (m[i].role) {
		case CHAT_SYSTEM:
			puts_(o, "<|system|>");
			puts_(o, nl);
			put(o, c.p, c.n);
			break;
		case CHAT_USER:
			puts_(o, "<|user|>");
			puts_(o, nl);
			put(o, c.p, c.n);
			if (v45 && !thinking && !ends_with(c, "/nothink"))
				puts_(o, "/nothink");
			break;
		case CHAT_ASSISTANT: {
			struct span r, text;
			split_reasoning(c, &r, &text);
			puts_(o, "<|assistant|>");
			bool show = (last_user == (size_t)-1 || i > last_user) && r.n > 0;
			if (show) {
				struct span rs = py_strip(r);
				puts_(o, nl);
				puts_(o, "<think>");
				put(o, rs.p, rs.n);
				puts_(o, "</think>");
			} else {
				puts_(o, v45 ? "\n<think></think>" : "</think>");
			}
			text = py_strip(text);
			if (text.n) {
				puts_(o, nl);
				put(o, text.p, text.n);
			}
			render_calls(o, &m[i], i, v45);
			break;
		}
		case CHAT_TOOL:
			if (i == 0 || m[i - 1].role != CHAT_TOOL)
				puts_(o, "<|observation|>");
			puts_(o, v45 ? "\n<tool_response>\n" : "<tool_response>");
			put(o, c.p, c.n);
			puts_(o, v45 ? "\n</tool_response>" : "</tool_response>");
			break;
		}
	}
	if (gen) {
		puts_(o, "<|assistant|>");
		if (v45)
			puts_(o, thinking ? "" : "\n<think></think>");
		else
			puts_(o, thinking ? "<think>" : "</think>");
	}
}

int chat_render(enum chat_format f, const struct chat_msg *m, size_t n,
		bool add_generation_prompt, bool thinking, char **out, size_t *len, char *err,
		size_t errsz)
{
	return chat_render_tools(f, m, n, NULL, 0, add_generation_prompt, thinking, out, len, err,
				 errsz);
}

int chat_render_tools(enum chat_format f, const struct chat_msg *m, size_t n,
		      const char *tools_json, size_t tools_len, bool add_generation_prompt,
		      bool thinking, char **out, size_t *len, char *err, size_t errsz)
{
	*out = NULL;
	*len = 0;
	if (f != CHAT_PLAIN && f != CHAT_GLM && f != CHAT_GLM45)
		return wk_errf(err, errsz, WK_EINVAL, "chat: unknown format %d", (int)f);
	if (n > CHAT_MAX_MESSAGES)
		return wk_errf(err, errsz, WK_ELIMIT, "chat: %zu messages, more than %d", n,
			       CHAT_MAX_MESSAGES);
	for (size_t i = 0; i < n; i++)
		if (m[i].role < CHAT_SYSTEM || m[i].role > CHAT_TOOL || (!m[i].content && m[i].len) ||
		    (m[i].n_calls && (!m[i].calls || m[i].role != CHAT_ASSISTANT)))
			return wk_errf(err, errsz, WK_EINVAL, "chat: message %zu: bad role, content "
				       "or tool calls", i);
	json_t *tools = NULL;
	if (tools_json) {
		json_error_t jerr;
		tools = json_loadb(tools_json, tools_len, JSON_ALLOW_NUL, &jerr);
		if (!json_is_array(tools)) {
			json_decref(tools);
			return wk_errf(err, errsz, WK_EFORMAT, "chat: the tools are not a JSON array");
		}
	}
	struct out o = {0};
	put(&o, "", 0);
	if (f == CHAT_PLAIN)
		for (size_t i = 0; i < n; i++)
			put(&o, m[i].content ? m[i].content : "", m[i].len);
	else
		render_glm(&o, m, n, tools, add_generation_prompt, thinking, f == CHAT_GLM45);
	json_decref(tools);
	if (o.over || o.nomem || o.bad) {
		int rc = o.bad && !o.nomem ? wk_errf(err, errsz, WK_EFORMAT, "chat: %s", o.bad)
			 : o.over	  ? wk_errf(err, errsz, WK_ELIMIT, "chat: the prompt is longer "
						    "than %u bytes", CHAT_MAX_TEXT)
					  : wk_errf(err, errsz, WK_ENOMEM, "chat: out of memory");
		free(o.p);
		free(o.bad);
		return rc;
	}
	*out = o.p;
	*len = o.n;
	return WK_OK;
}

/* ---- choosing the format ----------------------------------------------------------------- */

enum chat_format chat_format_for(const char *arch)
{
	if (arch && (!strcmp(arch, "GlmMoeDsaForCausalLM") || !strcmp(arch, "Glm4MoeForCausalLM")))
		return CHAT_GLM;
	return CHAT_PLAIN;
}

const char *chat_format_name(enum chat_format f)
{
	switch (f) {
	case CHAT_PLAIN: return "plain";
	case CHAT_GLM: return "glm";
	case CHAT_GLM45: return "glm45";
	}
	return "?";
}

int chat_format_parse(const char *name, enum chat_format *f, char *err, size_t errsz)
{
	for (int i = CHAT_PLAIN; i <= CHAT_GLM45; i++)
		if (!strcmp(name, chat_format_name((enum chat_format)i))) {
			*f = (enum chat_format)i;
			return WK_OK;
		}
	return wk_errf(err, errsz, WK_EINVAL, "unknown chat format '%.40s' (plain, glm, glm45)",
		       name);
}

int chat_role_parse(const char *name, enum chat_role *r, char *err, size_t errsz)
{
	static const char *const names[] = {"system", "user", "assistant", "tool"};
	for (int i = 0; i < 4; i++)
		if (!strcmp(name, names[i])) {
			*r = (enum chat_role)i;
			return WK_OK;
		}
	return wk_errf(err, errsz, WK_EINVAL, "unknown chat role '%.40s' (system, user, "
		       "assistant, tool)", name);
}

/* Reads dir/name into *buf; WK_ENOTFOUND when it does not exist. */
static int read_in(const char *dir, const char *name, char **buf, size_t *len, char *err,
		   size_t errsz)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return wk_errf(err, errsz, WK_EINVAL, "%s: path too long", dir);
	FILE *f = fopen(path, "rb");
	if (!f)
		return WK_ENOTFOUND;
	fclose(f);
	return wk_read_file(path, CHAT_MAX_FILE, buf, len, err, errsz);
}

/* The chat template text of dir into *tmpl (malloc'd), or NULL when it has none. */
static int find_template(const char *dir, char **tmpl, char *err, size_t errsz)
{
	char *buf;
	size_t len;
	*tmpl = NULL;
	int rc = read_in(dir, "chat_template.jinja", &buf, &len, err, errsz);
	if (rc == WK_OK) {
		*tmpl = buf;
		return WK_OK;
	}
	if (rc != WK_ENOTFOUND)
		return rc;
	rc = read_in(dir, "tokenizer_config.json", &buf, &len, err, errsz);
	if (rc == WK_ENOTFOUND)
		return WK_OK;
	if (rc != WK_OK)
		return rc;
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, 0, &jerr);
	free(buf);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "%s/tokenizer_config.json:%d: %s", dir,
			       jerr.line, jerr.text);
	json_t *ct = json_object_get(root, "chat_template");
	if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: take "default" */
		size_t i;
		json_t *v, *pick = NULL;
		json_array_foreach(ct, i, v) {
			const char *nm = json_string_value(json_object_get(v, "name"));
			if (nm && !strcmp(nm, "default"))
				pick = json_object_get(v, "template");
		}
		ct = pick;
	}
	if (json_is_string(ct)) {
		*tmpl = strdup(json_string_value(ct));
		if (!*tmpl)
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	json_decref(root);
	return rc;
}

int chat_format_for_model(const char *dir, enum chat_format *f, char *err, size_t errsz)
{
	char *tmpl;
	int rc = find_template(dir, &tmpl, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (tmpl) {
		bool glm = strstr(tmpl, "[gMASK]<sop>") != NULL;
		bool v45 = strstr(tmpl, "/nothink") != NULL;
		free(tmpl);
		if (!glm)
			return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: the model's chat template is "
				       "not one wick renders (GLM-4.5 to GLM-5)", dir);
		*f = v45 ? CHAT_GLM45 : CHAT_GLM;
		return WK_OK;
	}
	char *buf;
	size_t len;
	rc = read_in(dir, "config.json", &buf, &len, err, errsz);
	if (rc == WK_ENOTFOUND) {
		*f = CHAT_PLAIN;
		return WK_OK;
	}
	if (rc != WK_OK)
		return rc;
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, 0, &jerr);
	free(buf);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "%s/config.json:%d: %s", dir, jerr.line,
			       jerr.text);
	*f = chat_format_for(json_string_value(json_array_get(json_object_get(root,
									      "architectures"), 0)));
	json_decref(root);
	return WK_OK;
}

/* ---- messages from JSON ------------------------------------------------------------------ */

/* Appends the visible text of a content value to o (string, null, or a list of parts). */
static int content_text(json_t *c, struct out *o)
{
	if (json_is_string(c)) {
		put(o, json_string_value(c), json_string_length(c));
		return WK_OK;
	}
	if (json_is_null(c) || !c)
		return WK_OK;
	if (!json_is_array(c))
		return WK_EFORMAT;
	size_t i;
	json_t *v;
	json_array_foreach(c, i, v) {
		if (json_is_string(v)) {
			put(o, json_string_value(v), json_string_length(v));
		} else if (json_is_object(v)) {
			const char *ty = json_string_value(json_object_get(v, "type"));
			json_t *text = json_object_get(v, "text");
			if (ty && !strcmp(ty, "text") && json_is_string(text))
				put(o, json_string_value(text), json_string_length(text));
		}
	}
	return WK_OK;
}

/* A tool call's name and arguments text (appended to o), from OpenAI's {"type": "function",
 * "function": {"name": S, "arguments": S or an object}} (or the function's members alone);
 * offsets into o in off[0..4): name, its end, args, their end. */
static int call_text(const json_t *c, struct out *o, size_t off[4])
{
	const json_t *f = json_object_get(c, "function");
	if (!f)
		f = c;
	const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
	if (!json_is_object(f) || !json_is_string(name))
		return WK_EFORMAT;
	off[0] = o->n;
	put(o, json_string_value(name), json_string_length(name));
	off[1] = off[2] = o->n;
	if (json_is_string(args)) {
		put(o, json_string_value(args), json_string_length(args));
	} else if (json_is_object(args)) {
		char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
		if (!a)
			return WK_ENOMEM;
		puts_(o, a);
		free(a);
	} else if (args && !json_is_null(args)) {
		return WK_EFORMAT;
	}
	off[3] = o->n;
	return WK_OK;
}

int chat_parse_json(const char *json, size_t len, struct chat_msg **msgs, size_t *n,
		    char *err, size_t errsz)
{
	char *tools;
	size_t tools_len;
	int rc = chat_parse_json_tools(json, len, msgs, n, &tools, &tools_len, err, errsz);
	free(tools);
	return rc;
}

int chat_parse_json_tools(const char *json, size_t len, struct chat_msg **msgs, size_t *n,
			  char **tools, size_t *tools_len, char *err, size_t errsz)
{
	*msgs = NULL;
	*n = 0;
	*tools = NULL;
	*tools_len = 0;
	json_error_t jerr;
	json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "messages: %d:%d: %s", jerr.line,
			       jerr.column, jerr.text);
	json_t *list = json_is_object(root) ? json_object_get(root, "messages") : root;
	json_t *tl = json_is_object(root) ? json_object_get(root, "tools") : NULL;
	int rc = WK_OK;
	size_t count = json_array_size(list), n_calls = 0;
	struct out text = {0};
	size_t *off = NULL, *coff = NULL, *ncall = NULL;
	if (!json_is_array(list))
		rc = wk_errf(err, errsz, WK_EFORMAT, "messages: expected a list of messages, or an "
			     "object with one under \"messages\"");
	else if (count > CHAT_MAX_MESSAGES)
		rc = wk_errf(err, errsz, WK_ELIMIT, "messages: %zu messages, more than %d", count,
			     CHAT_MAX_MESSAGES);
	else if (tl && !json_is_array(tl))
		rc = wk_errf(err, errsz, WK_EFORMAT, "tools: expected a list");
	else if (!(off = malloc((2 * count + 1) * sizeof *off)) ||
		 !(ncall = calloc(count + 1, sizeof *ncall)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (size_t i = 0; i < count && rc == WK_OK; i++) {
		size_t k = json_array_size(json_object_get(json_array_get(list, i), "tool_calls"));
		n_calls += ncall[i] = k;
	}
	if (rc == WK_OK && !(coff = malloc((4 * n_calls + 1) * sizeof *coff)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	enum chat_role *roles = NULL;
	if (rc == WK_OK && !(roles = malloc((count + 1) * sizeof *roles)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	put(&text, "", 0);
	for (size_t i = 0, c = 0; i < count && rc == WK_OK; i++) {
		json_t *m = json_array_get(list, i);
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!json_is_object(m) || !role) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "messages[%zu]: expected an object with "
				     "a role", i);
			break;
		}
		char e2[WK_ERRSZ];
		if (chat_role_parse(role, &roles[i], e2, sizeof e2) != WK_OK) {
			rc = wk_errf(err, errsz, WK_EINVAL, "messages[%zu]: %s", i, e2);
			break;
		}
		off[2 * i] = text.n;
		if (content_text(json_object_get(m, "content"), &text) != WK_OK) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "messages[%zu]: content must be a "
				     "string or a list of parts", i);
			break;
		}
		off[2 * i + 1] = text.n; /* (its calls' names and arguments after it) */
		json_t *calls = json_object_get(m, "tool_calls");
		if (ncall[i] && roles[i] != CHAT_ASSISTANT) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "messages[%zu]: only an assistant "
				     "message has tool_calls", i);
			break;
		}
		size_t j;
		json_t *tc;
		json_array_foreach(calls, j, tc) {
			int r = call_text(tc, &text, coff + 4 * c++);
			if (r != WK_OK) {
				rc = r == WK_ENOMEM ? wk_errf(err, errsz, r, "out of memory")
						    : wk_errf(err, errsz, r, "messages[%zu].tool_calls"
							      "[%zu]: expected {\"function\": {\"name\""
							      ": S, \"arguments\": S or an object}}",
							      i, j);
				break;
			}
		}
	}
	char *tj = NULL;
	if (rc == WK_OK && tl && !(tj = json_dumps(tl, JSON_COMPACT)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if (rc == WK_OK && (text.over || text.nomem))
		rc = text.over ? wk_errf(err, errsz, WK_ELIMIT, "messages: more than %u bytes of "
					 "content", CHAT_MAX_TEXT)
			       : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct chat_msg *out = NULL;
	size_t head = (count ? count : 1) * sizeof *out + n_calls * sizeof(struct chat_call);
	if (rc == WK_OK) {
		out = malloc(head + text.n + 1);
		if (!out)
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	if (rc == WK_OK) {
		struct chat_call *calls = (struct chat_call *)(out + (count ? count : 1));
		char *base = (char *)out + head;
		memcpy(base, text.p, text.n + 1);
		for (size_t c = 0; c < n_calls; c++)
			calls[c] = (struct chat_call){
				.name = base + coff[4 * c], .name_len = coff[4 * c + 1] - coff[4 * c],
				.args = base + coff[4 * c + 2],
				.args_len = coff[4 * c + 3] - coff[4 * c + 2]};
		for (size_t i = 0, c = 0; i < count; i++) {
			out[i] = (struct chat_msg){.role = roles[i], .content = base + off[2 * i],
						   .len = off[2 * i + 1] - off[2 * i],
						   .calls = ncall[i] ? calls + c : NULL,
						   .n_calls = ncall[i]};
			c += ncall[i];
		}
		*msgs = out;
		*n = count;
		*tools = tj;
		*tools_len = tj ? strlen(tj) : 0;
		tj = NULL;
	}
	free(tj);
	free(text.p);
	free(off);
	free(coff);
	free(ncall);
	free(roles);
	json_decref(root);
	return rc;
}

/* ---- tool calls out of generated text ---------------------------------------------------- */

/* The schema type tools_json gives function name's parameter key ("" when none). */
static const char *param_type(const json_t *tools, struct span name, const char *key)
{
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		const json_t *f = json_object_get(t, "function");
		const char *nm = json_string_value(json_object_get(f, "name"));
		if (!nm || strlen(nm) != name.n || memcmp(nm, name.p, name.n))
			continue;
		const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
		const char *ty = json_string_value(json_object_get(json_object_get(props, key),
								  "type"));
		return ty ? ty : "";
	}
	return "";
}

/* s after its leading whitespace; NULL when it does not then start with tag. */
static const char *expect(struct span s, const char *tag)
{
	size_t k;
	while (s.n && (k = py_space((const unsigned char *)s.p, s.n)))
		s.p += k, s.n -= k;
	size_t t = strlen(tag);
	return s.n >= t && !memcmp(s.p, tag, t) ? s.p + t : NULL;
}

/* One call's body (between "<tool_call>" and "</tool_call>") into {"name", "arguments"};
 * NULL when it is not in the form. */
static json_t *parse_call(struct span b, const json_t *tools)
{
	const char *k0 = find(b, "<arg_key>");
	struct span name = py_strip((struct span){b.p, k0 ? (size_t)(k0 - b.p) : b.n});
	json_t *args = json_object(), *call = NULL;
	struct span rest = {k0 ? k0 : b.p + b.n, k0 ? b.n - (size_t)(k0 - b.p) : 0};
	while (args && name.n) {
		const char *p = expect(rest, "<arg_key>");
		if (!p) {
			if (py_strip(rest).n == 0) /* only whitespace left: done */
				call = json_pack("{s:s%, s:o}", "name", name.p, name.n, "arguments", args);
			else
				json_decref(args);
			return call;
		}
		struct span r = {p, rest.n - (size_t)(p - rest.p)};
		const char *ke = find(r, "</arg_key>");
		if (!ke)
			break;
		struct span key = py_strip((struct span){p, (size_t)(ke - p)});
		r = (struct span){ke + 10, r.n - (size_t)(ke + 10 - p)};
		const char *v = expect(r, "<arg_value>");
		if (!v)
			break;
		r = (struct span){v, r.n - (size_t)(v - r.p)};
		const char *ve = find(r, "</arg_value>");
		if (!ve)
			break;
		char kz[256];
		if (key.n == 0 || key.n >= sizeof kz)
			break;
		memcpy(kz, key.p, key.n);
		kz[key.n] = 0;
		json_t *val = NULL;
		if (strcmp(param_type(tools, name, kz), "string")) { /* JSON where it is JSON */
			struct span vs = py_strip((struct span){v, (size_t)(ve - v)});
			val = json_loadb(vs.p, vs.n, JSON_DECODE_ANY, NULL);
		}
		if (!val)
			val = json_stringn(v, (size_t)(ve - v));
		if (!val || json_object_set_new(args, kz, val))
			break;
		rest = (struct span){ve + 12, r.n - (size_t)(ve + 12 - r.p)};
	}
	json_decref(args);
	return NULL;
}

int chat_tool_calls(enum chat_format f, const char *text, size_t len, const char *tools_json,
		    size_t tools_len, size_t max_calls, size_t *content_len, char **calls,
		    char *err, size_t errsz)
{
	*calls = NULL;
	*content_len = len;
	struct span t = {text, len};
	const char *first = f == CHAT_PLAIN ? NULL : find(t, "<tool_call>");
	if (!first)
		return WK_OK;
	json_t *tools = tools_json ? json_loadb(tools_json, tools_len, 0, NULL) : NULL;
	json_t *list = json_array();
	struct span rest = {first, len - (size_t)(first - text)};
	bool whole = list != NULL;
	while (whole && rest.n) {
		const char *p = expect(rest, "<tool_call>");
		if (!p) {
			whole = py_strip(rest).n == 0; /* text after the calls: not calls */
			break;
		}
		struct span r = {p, rest.n - (size_t)(p - rest.p)};
		const char *e = find(r, "</tool_call>");
		json_t *call = e ? parse_call((struct span){p, (size_t)(e - p)}, tools) : NULL;
		if (!call || json_array_append_new(list, call)) {
			whole = false;
			break;
		}
		rest = (struct span){e + 12, r.n - (size_t)(e + 12 - p)};
	}
	json_decref(tools);
	int rc = WK_OK;
	while (whole && max_calls && json_array_size(list) > max_calls)
		json_array_remove(list, json_array_size(list) - 1);
	if (whole && json_array_size(list)) {
		size_t i;
		json_t *c;
		json_array_foreach(list, i, c) { /* the arguments as OpenAI's string */
			char *a = json_dumps(json_object_get(c, "arguments"), JSON_COMPACT);
			if (!a || json_object_set_new(c, "arguments", json_string(a)))
				rc = WK_ENOMEM;
			free(a);
		}
		if (rc == WK_OK && !(*calls = json_dumps(list, JSON_COMPACT)))
			rc = WK_ENOMEM;
		if (rc == WK_OK)
			*content_len = py_rstrip((struct span){text, (size_t)(first - text)}).n;
	} else if (!list) {
		rc = WK_ENOMEM;
	}
	json_decref(list);
	if (rc != WK_OK) {
		free(*calls);
		*calls = NULL;
		*content_len = len;
		return wk_errf(err, errsz, rc, "out of memory");
	}
	return WK_OK;
}
