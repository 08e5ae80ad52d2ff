/*
 * chat.c - chat templates (see chat.h for the formats and their sources), the choice of
 * format for a model directory, and messages from JSON.
 */
#include "engine/chat.h"

#include <jansson.h>
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
};

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

/* Python's s.strip(). */
static struct span py_strip(struct span s)
{
	const unsigned char *u = (const unsigned char *)s.p;
	size_t a = 0, z = s.n, k;
	while (a < z && (k = py_space(u + a, z - a)))
		a += k;
	/* from the right: try each character length that ends at z */
	for (;;) {
		bool cut = false;
		for (size_t len = 1; len <= 3 && len <= z - a; len++)
			if (py_space(u + z - len, len) == len) {
				z -= len;
				cut = true;
				break;
			}
		if (!cut)
			break;
	}
	return (struct span){s.p + a, z - a};
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

/* ---- rendering --------------------------------------------------------------------------- */

static bool ends_with(struct span s, const char *suffix)
{
	size_t k = strlen(suffix);
	return s.n >= k && !memcmp(s.p + s.n - k, suffix, k);
}

static void render_glm(struct out *o, const struct chat_msg *m, size_t n, bool gen,
		       bool thinking, bool v45)
{
	const char *nl = v45 ? "\n" : "";
	size_t last_user = (size_t)-1;
	for (size_t i = 0; i < n; i++)
		if (m[i].role == CHAT_USER)
			last_user = i;
	puts_(o, "[gMASK]<sop>");
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
	*out = NULL;
	*len = 0;
	if (f != CHAT_PLAIN && f != CHAT_GLM && f != CHAT_GLM45)
		return wk_errf(err, errsz, WK_EINVAL, "chat: unknown format %d", (int)f);
	if (n > CHAT_MAX_MESSAGES)
		return wk_errf(err, errsz, WK_ELIMIT, "chat: %zu messages, more than %d", n,
			       CHAT_MAX_MESSAGES);
	for (size_t i = 0; i < n; i++)
		if (m[i].role < CHAT_SYSTEM || m[i].role > CHAT_TOOL || (!m[i].content && m[i].len))
			return wk_errf(err, errsz, WK_EINVAL, "chat: message %zu: bad role or "
				       "content", i);
	struct out o = {0};
	put(&o, "", 0);
	if (f == CHAT_PLAIN)
		for (size_t i = 0; i < n; i++)
			put(&o, m[i].content ? m[i].content : "", m[i].len);
	else
		render_glm(&o, m, n, add_generation_prompt, thinking, f == CHAT_GLM45);
	if (o.over || o.nomem) {
		free(o.p);
		return o.over ? wk_errf(err, errsz, WK_ELIMIT, "chat: the prompt is longer than "
					"%u bytes", CHAT_MAX_TEXT)
			      : wk_errf(err, errsz, WK_ENOMEM, "chat: out of memory");
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

int chat_parse_json(const char *json, size_t len, struct chat_msg **msgs, size_t *n,
		    char *err, size_t errsz)
{
	*msgs = NULL;
	*n = 0;
	json_error_t jerr;
	json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "messages: %d:%d: %s", jerr.line,
			       jerr.column, jerr.text);
	json_t *list = json_is_object(root) ? json_object_get(root, "messages") : root;
	int rc = WK_OK;
	size_t count = json_array_size(list);
	struct out text = {0};
	size_t *off = NULL;
	if (!json_is_array(list))
		rc = wk_errf(err, errsz, WK_EFORMAT, "messages: expected a list of messages, or an "
			     "object with one under \"messages\"");
	else if (count > CHAT_MAX_MESSAGES)
		rc = wk_errf(err, errsz, WK_ELIMIT, "messages: %zu messages, more than %d", count,
			     CHAT_MAX_MESSAGES);
	else if (!(off = malloc((count + 1) * sizeof *off)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	enum chat_role *roles = NULL;
	if (rc == WK_OK && !(roles = malloc((count + 1) * sizeof *roles)))
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	put(&text, "", 0);
	for (size_t i = 0; i < count && rc == WK_OK; i++) {
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
		off[i] = text.n;
		if (content_text(json_object_get(m, "content"), &text) != WK_OK)
			rc = wk_errf(err, errsz, WK_EFORMAT, "messages[%zu]: content must be a "
				     "string or a list of parts", i);
	}
	if (off)
		off[count] = text.n;
	if (rc == WK_OK && (text.over || text.nomem))
		rc = text.over ? wk_errf(err, errsz, WK_ELIMIT, "messages: more than %u bytes of "
					 "content", CHAT_MAX_TEXT)
			       : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct chat_msg *out = NULL;
	if (rc == WK_OK) {
		out = malloc((count ? count : 1) * sizeof *out + text.n + 1);
		if (!out)
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	if (rc == WK_OK) {
		char *base = (char *)(out + (count ? count : 1));
		memcpy(base, text.p, text.n + 1);
		for (size_t i = 0; i < count; i++)
			out[i] = (struct chat_msg){.role = roles[i], .content = base + off[i],
						   .len = off[i + 1] - off[i]};
		*msgs = out;
		*n = count;
	}
	free(text.p);
	free(off);
	free(roles);
	json_decref(root);
	return rc;
}
