/*
 * grammar.c - a JSON Schema compiled into nodes, a byte-at-a-time recognizer over them (a
 * stack of frames: the values the bytes are inside), and a vocabulary's trie walked with it.
 * See grammar.h for what is supported.
 */
#include "worker/grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/grammar_re.h"

/* ---- the compiled schema ---- */

enum gn { GN_ANY, GN_OBJECT, GN_ARRAY, GN_STRING, GN_NUMBER, GN_INTEGER, GN_LIT, GN_ANYOF };

struct gnode {
	uint8_t kind;
	bool free_keys;       /* object: any keys (their values of node items), not props */
	int first, n;         /* object: props[first..+n); lit: lits; anyof: alts */
	uint64_t required;    /* object: the props that must come */
	int items;            /* array: the items' node; an object with free keys: its values' */
	int min_items, max_items; /* array: max -1 for none; a string: its characters' */
	bool bounded;         /* integer: lo, hi and mult apply; number: dlo, dhi and frac */
	int64_t lo, hi;       /* integer: its range, both ends in */
	int64_t mult;         /* integer: a multiple of it (multipleOf; 1 for any) */
	int frac;             /* number: at most this many digits after the point (multipleOf
			       * 10^-frac; 17 for any) */
	double dlo, dhi;      /* number: its range, each end in unless dlo_x, dhi_x */
	bool dlo_x, dhi_x;
	int re;               /* string: its pattern's (or format's) automaton + 1; 0: none */
};

struct gram {
	struct gnode *nodes;
	int n_nodes, cap_nodes;
	char **text;          /* props: a key's JSON text with its quotes; lits: a value's */
	size_t *len;
	int *val;             /* props: the value's node; alts: the alternative's node */
	int n_items, cap_items;
	int root;
	struct gre *re;       /* the strings' patterns */
	int n_re;
};

/* The nodes every grammar has: any value, and its parts. */
enum { N_ANY, N_ANY_OBJECT, N_ANY_ARRAY, N_STRING, N_NUMBER, N_WORDS, N_FIXED };

static int add_node(struct gram *g, struct gnode n)
{
	if (g->n_nodes == g->cap_nodes) {
		int cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
		struct gnode *p = realloc(g->nodes, (size_t)cap * sizeof *p);
		if (!p)
			return -1;
		g->nodes = p;
		g->cap_nodes = cap;
	}
	if (g->n_nodes >= UINT16_MAX)
		return -1;
	g->nodes[g->n_nodes] = n;
	return g->n_nodes++;
}

/* Appends an item (a text and a node) and returns its index, or -1. text is taken. */
static int add_item(struct gram *g, char *text, int val)
{
	if (g->n_items == g->cap_items) {
		int cap = g->cap_items ? 2 * g->cap_items : 32;
		char **t = realloc(g->text, (size_t)cap * sizeof *t);
		if (t)
			g->text = t;
		size_t *l = t ? realloc(g->len, (size_t)cap * sizeof *l) : NULL;
		if (l)
			g->len = l;
		int *v = l ? realloc(g->val, (size_t)cap * sizeof *v) : NULL;
		if (!v) {
			free(text);
			return -1;
		}
		g->val = v;
		g->cap_items = cap;
	}
	g->text[g->n_items] = text;
	g->len[g->n_items] = text ? strlen(text) : 0;
	g->val[g->n_items] = val;
	return g->n_items++;
}

struct compile {
	struct gram *g;
	json_t *doc;
	const json_t *seen[256]; /* schema objects compiled (for $ref's recursion) */
	int seen_node[256], n_seen;
	char *err;
	size_t errsz;
	int rc;
	int depth;
};

static int cfail(struct compile *c, const char *path, const char *fmt, ...)
{
	char msg[WK_ERRSZ];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (c->rc == WK_OK)
		c->rc = wk_errf(c->err, c->errsz, WK_EINVAL, "%s (at %s)", msg, *path ? path : "/");
	return -1;
}

static int lit_node(struct gram *g, const char *const *words, int n)
{
	int first = g->n_items;
	for (int i = 0; i < n; i++) {
		char *t = strdup(words[i]);
		if (!t || add_item(g, t, -1) < 0)
			return -1;
	}
	return add_node(g, (struct gnode){.kind = GN_LIT, .first = first, .n = n});
}

/* The first bytes a node's values may begin with, as a 256-bit set. */
static void first_bytes(const struct gram *g, int node, uint64_t set[4], int depth)
{
	const struct gnode *n = &g->nodes[node];
	const char *s = NULL;
	switch (n->kind) {
	case GN_ANY:
		s = "{[\"-0123456789tfn";
		break;
	case GN_OBJECT:
		s = "{";
		break;
	case GN_ARRAY:
		s = "[";
		break;
	case GN_STRING:
		s = "\"";
		break;
	case GN_NUMBER:
	case GN_INTEGER:
		s = "-0123456789";
		break;
	case GN_LIT:
		for (int i = 0; i < n->n; i++) {
			unsigned char c = (unsigned char)g->text[n->first + i][0];
			set[c >> 6] |= 1ull << (c & 63);
		}
		return;
	case GN_ANYOF:
		for (int i = 0; i < n->n && depth < 16; i++)
			first_bytes(g, g->val[n->first + i], set, depth + 1);
		return;
	}
	for (; *s; s++)
		set[(unsigned char)*s >> 6] |= 1ull << ((unsigned char)*s & 63);
}

static int compile_node(struct compile *c, const json_t *sch, const char *path);

/* anyOf/oneOf (or a list of types): alternatives whose first bytes differ. */
static int anyof_node(struct compile *c, int *alt, int n, const char *path, const char *what)
{
	struct gram *g = c->g;
	uint64_t all[4] = {0};
	for (int i = 0; i < n; i++) {
		uint64_t one[4] = {0};
		first_bytes(g, alt[i], one, 0);
		for (int k = 0; k < 4; k++) {
			if (all[k] & one[k])
				return cfail(c, path, "%s: alternatives %d and another can begin with the "
					     "same character (a type each is supported)", what, i);
			all[k] |= one[k];
		}
	}
	int first = g->n_items;
	for (int i = 0; i < n; i++)
		if (add_item(g, NULL, alt[i]) < 0)
			return -1;
	return add_node(g, (struct gnode){.kind = GN_ANYOF, .first = first, .n = n});
}

/* The formats, as patterns. Where a validator checks more than the syntax (a date's day
 * against its month) the pattern is narrower: every month's days, but February's 29th. */
#define RE_DATE                                                                             \
	"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|" \
	"02-(0[1-9]|1[0-9]|2[0-8]))"
#define RE_TIME                                                                             \
	"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
static const char *const formats[][2] = {
	{"date", "^" RE_DATE "$"},
	{"time", "^" RE_TIME "$"},
	{"date-time", "^" RE_DATE "T" RE_TIME "$"},
	{"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
	{"email", "^[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9]+(-[A-Za-z0-9]+)*"
		  "(\\.[A-Za-z0-9]+(-[A-Za-z0-9]+)*)*\\.[A-Za-z]{2,}$"},
	{"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
		 "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
};

/* A string's "pattern" or "format", compiled: its automaton's index + 1 (0: neither). */
static int string_re(struct compile *c, const json_t *sch, const char *path)
{
	const json_t *pat = json_object_get(sch, "pattern"), *fmt = json_object_get(sch, "format");
	if (!pat && !fmt)
		return 0;
	if (pat && fmt)
		return cfail(c, path, "a pattern and a format together are not supported");
	const char *text = json_string_value(pat);
	size_t len = json_string_length(pat);
	if (pat && !text)
		return cfail(c, path, "pattern must be a string");
	if (fmt) {
		const char *f = json_string_value(fmt);
		size_t i = 0, n = sizeof formats / sizeof formats[0];
		while (f && i < n && strcmp(f, formats[i][0]))
			i++;
		if (i == n || !f)
			return cfail(c, path, "the format \"%.40s\" is not supported in structured "
				     "output (date, time, date-time, uuid, email and ipv4 are)",
				     f ? f : "?");
		text = formats[i][1];
		len = strlen(text);
	}
	struct gre *re = realloc(c->g->re, (size_t)(c->g->n_re + 1) * sizeof *re);
	if (!re) {
		c->rc = WK_ENOMEM;
		return -1;
	}
	c->g->re = re;
	char msg[WK_ERRSZ];
	int rc = gre_compile(text, len, &re[c->g->n_re], msg, sizeof msg);
	if (rc == WK_ENOMEM) {
		c->rc = rc;
		return -1;
	}
	if (rc != WK_OK)
		return cfail(c, path, "%s", msg);
	return ++c->g->n_re;
}

/* A string, with minLength and maxLength (characters: code points), and a pattern or format,
 * where given. */
static int string_node(struct compile *c, const json_t *sch, const char *path)
{
	const json_t *mn = json_object_get(sch, "minLength"), *mx = json_object_get(sch, "maxLength");
	int re = string_re(c, sch, path);
	if (re < 0)
		return -1;
	if (!mn && !mx && !re)
		return N_STRING;
	int lo = 0, hi = -1;
	if (mn) {
		if (!json_is_integer(mn) || json_integer_value(mn) < 0 ||
		    json_integer_value(mn) > GRAM_LEN_MAX)
			return cfail(c, path, "minLength must be an integer from 0 to %d",
				     GRAM_LEN_MAX);
		lo = (int)json_integer_value(mn);
	}
	if (mx) {
		if (!json_is_integer(mx) || json_integer_value(mx) < lo ||
		    json_integer_value(mx) > GRAM_LEN_MAX)
			return cfail(c, path, "maxLength must be an integer from minLength to %d",
				     GRAM_LEN_MAX);
		hi = (int)json_integer_value(mx);
	}
	return add_node(c->g, (struct gnode){.kind = GN_STRING, .min_items = lo, .max_items = hi,
					     .re = re});
}

/* An integer bound: minimum and exclusiveMinimum (a number, or draft 4's boolean beside
 * minimum) raise lo, maximum and exclusiveMaximum lower hi. false: not a number. */
static bool int_bound(const json_t *sch, const char *name, const char *excl, bool low,
		      int64_t *v)
{
	const json_t *b = json_object_get(sch, name), *x = json_object_get(sch, excl);
	bool ok = true;
	for (int k = 0; k < 2; k++) {
		const json_t *e = k ? x : b;
		bool strict = k == 1 || json_is_true(x);
		if (!e || json_is_boolean(e))
			continue;
		if (!json_is_number(e)) {
			ok = false;
			continue;
		}
		double d = json_number_value(e); /* the integers within: ceil or floor, then past */
		double r = low ? (strict ? floor(d) + 1 : ceil(d)) : (strict ? ceil(d) - 1 : floor(d));
		int64_t i = r >= 9.2e18 ? INT64_MAX : r <= -9.2e18 ? INT64_MIN : (int64_t)r;
		if (json_is_integer(e)) { /* exactly, where a double would round */
			int64_t n = json_integer_value(e);
			i = !strict ? n : low ? (n == INT64_MAX ? n : n + 1)
					      : (n == INT64_MIN ? n : n - 1);
		}
		if (low ? i > *v : i < *v)
			*v = i;
	}
	return ok && !(x && json_is_boolean(x) && !b);
}

/* Whether some multiple of m lies in [lo, hi]. */
static bool has_multiple(__int128 lo, __int128 hi, int64_t m)
{
	__int128 q = lo / m; /* (toward 0: one multiple up where lo is positive) */
	if (q * m < lo)
		q++;
	return lo <= hi && q * m <= hi;
}

/* A schema's multipleOf: *m a positive integer it is, *k where it is 10^-k (k 1..9), else 0
 * each; false when it is not a positive number. */
static bool multiple_of(const json_t *sch, int64_t *m, int *k)
{
	const json_t *v = json_object_get(sch, "multipleOf");
	*m = 1;
	*k = 0;
	if (!v)
		return true;
	double d = json_number_value(v);
	if (!json_is_number(v) || !(d > 0))
		return false;
	*m = 0;
	if (json_is_integer(v))
		*m = json_integer_value(v);
	else if (d == floor(d) && d < 9e18)
		*m = (int64_t)d;
	for (int j = 1; j <= 9 && !*m; j++)
		if (fabs(d * pow(10, j) - 1) < 1e-9)
			*k = j;
	return true;
}

/* An integer, in [minimum, maximum] (or their exclusive forms) where given, and a multiple
 * of multipleOf (a positive integer). */
static int integer_node(struct compile *c, const json_t *sch, const char *path)
{
	int64_t lo = INT64_MIN, hi = INT64_MAX, m;
	int k;
	if (!int_bound(sch, "minimum", "exclusiveMinimum", true, &lo) ||
	    !int_bound(sch, "maximum", "exclusiveMaximum", false, &hi))
		return cfail(c, path, "minimum, maximum, exclusiveMinimum and exclusiveMaximum "
			     "must be numbers (exclusive ones also true or false beside theirs)");
	if (!multiple_of(sch, &m, &k))
		return cfail(c, path, "multipleOf must be a number greater than 0");
	if (k) /* every integer is a multiple of 10^-k */
		m = 1;
	if (!m)
		return cfail(c, path, "an integer's multipleOf is supported as a positive integer "
			     "(or 10^-k) only");
	if (lo > hi || !has_multiple(lo, hi, m))
		return cfail(c, path, "no integer is within its minimum and maximum%s",
			     m > 1 ? " and a multiple of its multipleOf" : "");
	bool bounded = lo != INT64_MIN || hi != INT64_MAX || m > 1;
	return add_node(c->g, (struct gnode){.kind = GN_INTEGER, .bounded = bounded, .lo = lo,
					     .hi = hi, .mult = m});
}

/* A number's bound: minimum (or maximum) and its exclusive form, a number or draft 4's
 * boolean beside it, into *v and *x (the end left out). false: not a number. */
static bool num_bound(const json_t *sch, const char *name, const char *excl, bool low,
		      double *v, bool *x)
{
	const json_t *b = json_object_get(sch, name), *e = json_object_get(sch, excl);
	if ((b && !json_is_number(b)) || (e && !json_is_number(e) && !json_is_boolean(e)) ||
	    (json_is_boolean(e) && !b))
		return false;
	if (b) {
		*v = json_number_value(b);
		*x = json_is_true(e);
	}
	if (json_is_number(e)) {
		double d = json_number_value(e);
		if (!b || (low ? d >= *v : d <= *v)) {
			*v = d;
			*x = true;
		}
	}
	return true;
}

/* A number, in its minimum and maximum (or their exclusive forms) where given: a decimal
 * then, without an exponent, of at most 18 digits before its point and 17 after. With
 * multipleOf 10^-k (0.01: cents), at most k digits after the point; with a positive integer
 * multipleOf, an integer of its multiples in that range (as integer_node). */
static int number_node(struct compile *c, const json_t *sch, const char *path)
{
	struct gnode n = {.kind = GN_NUMBER, .dlo = -INFINITY, .dhi = INFINITY, .frac = 17};
	int64_t m;
	int k;
	if (!num_bound(sch, "minimum", "exclusiveMinimum", true, &n.dlo, &n.dlo_x) ||
	    !num_bound(sch, "maximum", "exclusiveMaximum", false, &n.dhi, &n.dhi_x))
		return cfail(c, path, "minimum, maximum, exclusiveMinimum and exclusiveMaximum "
			     "must be numbers (exclusive ones also true or false beside theirs)");
	if (!multiple_of(sch, &m, &k))
		return cfail(c, path, "multipleOf must be a number greater than 0");
	if (!m && !k)
		return cfail(c, path, "a number's multipleOf is supported as a positive integer or "
			     "as 10^-k (0.1, 0.01, ... 1e-9) only");
	if (n.dlo > n.dhi || (n.dlo == n.dhi && (n.dlo_x || n.dhi_x)))
		return cfail(c, path, "no number is within its minimum and maximum");
	if (m > 1 || (m == 1 && json_object_get(sch, "multipleOf")))
		return integer_node(c, sch, path); /* (its bounds read as an integer's) */
	n.frac = k ? k : 17;
	n.bounded = n.dlo != -INFINITY || n.dhi != INFINITY || k;
	return n.bounded ? add_node(c->g, n) : N_NUMBER;
}

static int type_node(struct compile *c, const json_t *sch, const char *type, const char *path)
{
	struct gram *g = c->g;
	static const char *const tf[] = {"true", "false"}, *const nul[] = {"null"};
	if (!strcmp(type, "string"))
		return string_node(c, sch, path);
	if (!strcmp(type, "number"))
		return number_node(c, sch, path);
	if (!strcmp(type, "integer"))
		return integer_node(c, sch, path);
	if (!strcmp(type, "boolean"))
		return lit_node(g, tf, 2);
	if (!strcmp(type, "null"))
		return lit_node(g, nul, 1);
	char sub[512];
	if (!strcmp(type, "array")) {
		const json_t *it = json_object_get(sch, "items"), *mn, *mx;
		int items = N_ANY;
		snprintf(sub, sizeof sub, "%s/items", path);
		if (it && (items = compile_node(c, it, sub)) < 0)
			return -1;
		int lo = 0, hi = -1;
		if ((mn = json_object_get(sch, "minItems"))) {
			if (!json_is_integer(mn) || json_integer_value(mn) < 0 ||
			    json_integer_value(mn) > 65535)
				return cfail(c, path, "minItems must be an integer from 0 to 65535");
			lo = (int)json_integer_value(mn);
		}
		if ((mx = json_object_get(sch, "maxItems"))) {
			if (!json_is_integer(mx) || json_integer_value(mx) < lo ||
			    json_integer_value(mx) > 65535)
				return cfail(c, path, "maxItems must be an integer from minItems to "
					     "65535");
			hi = (int)json_integer_value(mx);
		}
		return add_node(g, (struct gnode){.kind = GN_ARRAY, .items = items,
						  .min_items = lo, .max_items = hi});
	}
	if (!strcmp(type, "object")) {
		const json_t *props = json_object_get(sch, "properties"), *req, *v;
		const json_t *addl = json_object_get(sch, "additionalProperties");
		if (props && !json_is_object(props))
			return cfail(c, path, "properties must be an object");
		size_t n = json_object_size(props);
		if (!props && json_is_object(addl) && json_object_size(addl)) { /* its values' */
			snprintf(sub, sizeof sub, "%s/additionalProperties", path);
			int val = compile_node(c, addl, sub);
			return val < 0 ? -1
				       : add_node(g, (struct gnode){.kind = GN_OBJECT,
								    .free_keys = true, .items = val});
		}
		if (!props && !json_is_false(addl))
			return N_ANY_OBJECT;
		if (n > GRAM_ALTS_MAX)
			return cfail(c, path, "an object has %zu properties; at most %d are supported",
				     n, GRAM_ALTS_MAX);
		int *vals = malloc((n + 1) * sizeof *vals);
		const char **keys = malloc((n + 1) * sizeof *keys);
		if (!vals || !keys) {
			free(vals);
			free(keys);
			c->rc = WK_ENOMEM;
			return -1;
		}
		const char *key;
		size_t k = 0;
		json_object_foreach((json_t *)props, key, v) {
			snprintf(sub, sizeof sub, "%s/properties/%s", path, key);
			keys[k] = key;
			if ((vals[k++] = compile_node(c, v, sub)) < 0) {
				free(vals);
				free(keys);
				return -1;
			}
		}
		uint64_t required = 0;
		if ((req = json_object_get(sch, "required"))) {
			size_t i;
			if (!json_is_array(req)) {
				free(vals);
				free(keys);
				return cfail(c, path, "required must be an array of names");
			}
			json_array_foreach(req, i, v) {
				size_t j = 0;
				while (j < n && (!json_is_string(v) || strcmp(keys[j], json_string_value(v))))
					j++;
				if (j == n) {
					free(vals);
					free(keys);
					return cfail(c, path, "required names \"%s\", which is not among "
						     "the properties", json_is_string(v)
						     ? json_string_value(v) : "?");
				}
				required |= 1ull << j;
			}
		}
		int first = g->n_items;
		for (k = 0; k < n; k++) {
			json_t *s = json_string(keys[k]);
			char *t = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
			json_decref(s);
			if (!t || add_item(g, t, vals[k]) < 0) {
				free(vals);
				free(keys);
				c->rc = WK_ENOMEM;
				return -1;
			}
		}
		free(vals);
		free(keys);
		return add_node(g, (struct gnode){.kind = GN_OBJECT, .first = first, .n = (int)n,
						  .required = required});
	}
	return cfail(c, path, "type \"%s\" is not a JSON Schema type", type);
}

static const char *const annotations[] = {
	"title",    "description", "default",  "examples",  "$schema",  "$id",
	"$comment", "strict",      "readOnly", "writeOnly", "deprecated", "name",
	"$defs",    "definitions", "additionalProperties"};
static const char *const handled[] = {"type",  "properties", "required", "items", "minItems",
				      "maxItems", "enum", "const",   "anyOf", "oneOf", "$ref"};
/* handled by the types they bound (string_node, integer_node): where no type says which, they
 * are refused rather than left unchecked */
static const char *const bounds[] = {"minLength", "maxLength", "minimum", "maximum",
				     "exclusiveMinimum", "exclusiveMaximum", "pattern", "format",
				     "multipleOf"};

static int compile_one(struct compile *c, const json_t *sch, const char *path);

static int compile_node(struct compile *c, const json_t *sch, const char *path)
{
	if (c->depth >= 64)
		return cfail(c, path, "the schema is nested more than 64 deep");
	c->depth++;
	int n = compile_one(c, sch, path);
	c->depth--;
	return n;
}

static int compile_one(struct compile *c, const json_t *sch, const char *path)
{
	struct gram *g = c->g;
	if (json_is_true(sch) || (json_is_object(sch) && json_object_size(sch) == 0))
		return N_ANY;
	if (!json_is_object(sch))
		return cfail(c, path, "a schema must be an object or true");
	const char *key;
	const json_t *v;
	json_object_foreach((json_t *)sch, key, v) {
		bool ok = false;
		for (size_t i = 0; i < sizeof annotations / sizeof *annotations && !ok; i++)
			ok = !strcmp(key, annotations[i]);
		for (size_t i = 0; i < sizeof handled / sizeof *handled && !ok; i++)
			ok = !strcmp(key, handled[i]);
		for (size_t i = 0; i < sizeof bounds / sizeof *bounds && !ok; i++)
			if (!strcmp(key, bounds[i])) {
				if (!json_object_get(sch, "type") || json_object_get(sch, "enum") ||
				    json_object_get(sch, "const") || json_object_get(sch, "anyOf") ||
				    json_object_get(sch, "oneOf") || json_object_get(sch, "$ref"))
					return cfail(c, path, "\"%s\" is supported beside a \"type\" "
						     "only (not with enum, const, anyOf, oneOf or $ref)",
						     key);
				ok = true;
			}
		if (!ok)
			return cfail(c, path, "the keyword \"%s\" is not supported in structured "
				     "output", key);
	}
	v = json_object_get(sch, "additionalProperties");
	if (v && !json_is_boolean(v) && !json_is_object(v))
		return cfail(c, path, "additionalProperties must be a boolean or a schema");
	char sub[512];
	if ((v = json_object_get(sch, "$ref"))) {
		const char *ref = json_string_value(v), *name = NULL;
		const json_t *defs = NULL;
		if (ref && !strncmp(ref, "#/$defs/", 8))
			defs = json_object_get(c->doc, "$defs"), name = ref + 8;
		else if (ref && !strncmp(ref, "#/definitions/", 14))
			defs = json_object_get(c->doc, "definitions"), name = ref + 14;
		const json_t *target = name ? json_object_get(defs, name) : NULL;
		if (!target)
			return cfail(c, path, "$ref \"%s\": only \"#/$defs/NAME\" or "
				     "\"#/definitions/NAME\" of this schema", ref ? ref : "?");
		for (int i = 0; i < c->n_seen; i++)
			if (c->seen[i] == target)
				return c->seen_node[i];
		if (c->n_seen == 256)
			return cfail(c, path, "too many schemas");
		/* a node of its own, filled once the target is compiled: recursion sees it */
		int self = add_node(g, (struct gnode){.kind = GN_ANYOF, .n = 0});
		if (self < 0) {
			c->rc = WK_ENOMEM;
			return -1;
		}
		c->seen[c->n_seen] = target;
		c->seen_node[c->n_seen++] = self;
		snprintf(sub, sizeof sub, "%s", ref + 1);
		int t = compile_node(c, target, sub);
		if (t < 0)
			return -1;
		g->nodes[self] = g->nodes[t];
		return self;
	}
	if ((v = json_object_get(sch, "const")) || (v = json_object_get(sch, "enum"))) {
		bool one = json_object_get(sch, "const") != NULL;
		size_t n = one ? 1 : json_array_size(v);
		if (!one && (!json_is_array(v) || n == 0))
			return cfail(c, path, "enum must be a non-empty array");
		if (n > GRAM_ALTS_MAX)
			return cfail(c, path, "enum has %zu values; at most %d are supported", n,
				     GRAM_ALTS_MAX);
		int first = g->n_items;
		for (size_t i = 0; i < n; i++) {
			char *t = json_dumps(one ? v : json_array_get(v, i),
					     JSON_ENCODE_ANY | JSON_COMPACT);
			if (!t || add_item(g, t, -1) < 0) {
				c->rc = WK_ENOMEM;
				return -1;
			}
		}
		return add_node(g, (struct gnode){.kind = GN_LIT, .first = first, .n = (int)n});
	}
	const json_t *alts = json_object_get(sch, "anyOf");
	const char *what = "anyOf";
	if (!alts && (alts = json_object_get(sch, "oneOf")))
		what = "oneOf";
	if (alts) {
		size_t n = json_array_size(alts);
		if (!json_is_array(alts) || n == 0 || n > 8)
			return cfail(c, path, "%s must be an array of 1 to 8 schemas", what);
		int alt[8];
		for (size_t i = 0; i < n; i++) {
			snprintf(sub, sizeof sub, "%s/%s/%zu", path, what, i);
			if ((alt[i] = compile_node(c, json_array_get(alts, i), sub)) < 0)
				return -1;
		}
		return n == 1 ? alt[0] : anyof_node(c, alt, (int)n, path, what);
	}
	v = json_object_get(sch, "type");
	if (!v)
		return json_object_get(sch, "properties") ? type_node(c, sch, "object", path)
		       : json_object_get(sch, "items")    ? type_node(c, sch, "array", path)
							   : N_ANY;
	if (json_is_string(v))
		return type_node(c, sch, json_string_value(v), path);
	size_t n = json_array_size(v);
	if (!json_is_array(v) || n == 0 || n > 8)
		return cfail(c, path, "type must be a string or a list of 1 to 8 types");
	int alt[8];
	for (size_t i = 0; i < n; i++) {
		const char *t = json_string_value(json_array_get(v, i));
		if (!t)
			return cfail(c, path, "type must be a string or a list of 1 to 8 types");
		if ((alt[i] = type_node(c, sch, t, path)) < 0)
			return -1;
	}
	return n == 1 ? alt[0] : anyof_node(c, alt, (int)n, path, "type");
}

void gram_free(struct gram *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n_items; i++)
		free(g->text[i]);
	free(g->text);
	free(g->len);
	free(g->val);
	free(g->nodes);
	free(g->re);
	free(g);
}

int gram_compile(const char *schema, size_t len, struct gram **out, char *err, size_t errsz)
{
	*out = NULL;
	struct gram *g = calloc(1, sizeof *g);
	if (!g)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	static const char *const words[] = {"true", "false", "null"};
	/* N_ANY, N_ANY_OBJECT, N_ANY_ARRAY, N_STRING, N_NUMBER, N_WORDS, in that order */
	if (add_node(g, (struct gnode){.kind = GN_ANY}) != N_ANY ||
	    add_node(g, (struct gnode){.kind = GN_OBJECT, .free_keys = true, .items = N_ANY}) !=
		    N_ANY_OBJECT ||
	    add_node(g, (struct gnode){.kind = GN_ARRAY, .items = N_ANY, .max_items = -1}) !=
		    N_ANY_ARRAY ||
	    add_node(g, (struct gnode){.kind = GN_STRING, .max_items = -1}) != N_STRING ||
	    add_node(g, (struct gnode){.kind = GN_NUMBER}) != N_NUMBER ||
	    lit_node(g, words, 3) != N_WORDS) {
		gram_free(g);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	g->root = N_ANY_OBJECT;
	if (schema) {
		json_error_t je;
		json_t *doc = json_loadb(schema, len, JSON_DECODE_ANY, &je);
		if (!doc) {
			gram_free(g);
			return wk_errf(err, errsz, WK_EINVAL, "the schema is not JSON: %s", je.text);
		}
		struct compile c = {.g = g, .doc = doc, .err = err, .errsz = errsz, .rc = WK_OK};
		g->root = compile_node(&c, doc, "");
		for (int i = N_FIXED; g->root >= 0 && i < g->n_nodes; i++) {
			uint64_t set[4] = {0};
			first_bytes(g, i, set, 0);
			if (!(set[0] | set[1] | set[2] | set[3]))
				g->root = cfail(&c, "", "a schema can match no value (a $ref that "
					       "refers only to itself)");
		}
		json_decref(doc);
		if (g->root < 0) {
			int rc = c.rc != WK_OK ? c.rc : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			gram_free(g);
			return rc;
		}
	}
	*out = g;
	return WK_OK;
}

/* ---- the recognizer ---- */

enum fk { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { OB_OPEN, OB_KEY, OB_COLON, OB_VAL, OB_AFTER, OB_NEXT };     /* F_OBJ phases */
enum { AR_OPEN, AR_VAL, AR_AFTER, AR_NEXT };                       /* F_ARR */
enum { ST_IN, ST_ESC, ST_HEX, ST_UTF };                            /* F_STR */
enum { NU_MINUS, NU_ZERO, NU_INT, NU_DOT, NU_FRAC, NU_E, NU_ESIGN, NU_EXP }; /* F_NUM */

static bool is_ws(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void gram_start(const struct gram *g, struct gram_state *s)
{
	s->depth = 1;
	s->done = false;
	s->f[0] = (struct gram_frame){.node = (uint16_t)g->root, .kind = F_VALUE};
}

static bool push(struct gram_state *s, struct gram_frame f)
{
	if (s->depth == GRAM_DEPTH)
		return false;
	s->f[s->depth++] = f;
	return true;
}

/* The value on top is whole: its frame goes, and its parent moves on. */
static void value_done(const struct gram *g, struct gram_state *s)
{
	s->depth--;
	if (s->depth == 0) {
		s->done = true;
		return;
	}
	struct gram_frame *p = &s->f[s->depth - 1];
	if (p->kind == F_OBJ && p->phase == OB_KEY) { /* a free key's string */
		p->phase = OB_COLON;
	} else if (p->kind == F_OBJ) {
		if (!g->nodes[p->node].free_keys)
			p->seen |= 1ull << p->aux;
		p->phase = OB_AFTER;
	} else if (p->kind == F_ARR) {
		p->pos += p->pos < UINT16_MAX;
		p->phase = AR_AFTER;
	}
	p->ws = 0;
}

/* Whitespace c where it may be: one space or tab, or a newline and then up to GRAM_WS_MAX
 * spaces or tabs (f->ws: 0 none yet, 1 after a space, 2 + k after a newline and k more). */
static bool ws(struct gram_frame *f, unsigned char c)
{
	if (f->ws == 0) {
		f->ws = c == '\n' ? 2 : 1;
		return c != '\r';
	}
	if (f->ws == 1 || c == '\n' || c == '\r' || f->ws - 2 >= GRAM_WS_MAX)
		return false;
	f->ws++;
	return true;
}

/* A value of node begins with c: the frame f (which held F_VALUE) becomes its kind. */
static bool value_begin(const struct gram *g, struct gram_state *s, int node, unsigned char c,
			int depth);

static bool lit_cand_begin(const struct gram *g, struct gram_frame *f, int node,
			   unsigned char c)
{
	const struct gnode *n = &g->nodes[node];
	uint64_t cand = 0;
	for (int i = 0; i < n->n; i++)
		if ((unsigned char)g->text[n->first + i][0] == c)
			cand |= 1ull << i;
	if (!cand)
		return false;
	*f = (struct gram_frame){.node = (uint16_t)node, .kind = F_LIT, .pos = 1, .cand = cand};
	return true;
}

/* Whether a literal candidate is whole at f->pos. */
static bool lit_whole(const struct gram *g, const struct gram_frame *f, bool *longer)
{
	const struct gnode *n = &g->nodes[f->node];
	bool whole = false;
	*longer = false;
	for (int i = 0; i < n->n; i++)
		if (f->cand >> i & 1) {
			if (g->len[n->first + i] == f->pos)
				whole = true;
			else
				*longer = true;
		}
	return whole;
}

/* A bounded integer's digits so far (f->cand: their value; f->aux 1: after a '-') and
 * whether some multiple of n->mult in [n->lo, n->hi] begins with them: the value itself, or
 * it followed by j more digits (none after a lone 0). */
static bool int_viable(const struct gnode *n, bool neg, bool digits, uint64_t p)
{
	if (!digits) /* "-": a negative integer, or -0 */
		return n->lo <= 0 && has_multiple(n->lo, n->hi < 0 ? n->hi : 0, n->mult);
	for (int j = 0; j <= 19; j++) {
		__int128 span = 1;
		for (int k = 0; k < j; k++)
			span *= 10;
		__int128 a = (__int128)p * span, b = a + span - 1; /* the magnitudes */
		if (a > (__int128)INT64_MAX + 1)
			break;
		__int128 lo = neg ? -b : a, hi = neg ? -a : b;
		if (has_multiple(lo > n->lo ? lo : n->lo, hi < n->hi ? hi : n->hi, n->mult))
			return true;
		if (p == 0)
			break; /* no digit may follow a leading 0 */
	}
	return false;
}

static bool int_digit(const struct gnode *n, struct gram_frame *f, unsigned char c)
{
	if (c == '-') {
		f->aux = 1;
		return int_viable(n, true, false, 0);
	}
	if (f->cand > (UINT64_MAX - 9) / 10)
		return false;
	f->cand = f->cand * 10 + (uint64_t)(c - '0');
	return int_viable(n, f->aux == 1, true, f->cand);
}

/* Whether a bounded integer's value is in its range. */
static bool int_in(const struct gnode *n, const struct gram_frame *f)
{
	__int128 v = f->aux == 1 ? -(__int128)f->cand : (__int128)f->cand;
	return v >= n->lo && v <= n->hi && v % n->mult == 0;
}

/* A bounded number's digits so far: f->cand the integer part's value, f->seen the fraction's,
 * f->aux bit 0 a '-', bits 8.. the fraction's digits. */
#define NUM_FRAC(f) ((uint16_t)(f)->aux >> 8)

/* The magnitude of a bounded number's digits so far, as a validator reads it: the double
 * nearest the decimal (strtod's). */
static double num_mag(const struct gram_frame *f)
{
	char t[64];
	if (NUM_FRAC(f))
		snprintf(t, sizeof t, "%llu.%0*llu", (unsigned long long)f->cand, NUM_FRAC(f),
			 (unsigned long long)f->seen);
	else
		snprintf(t, sizeof t, "%llu", (unsigned long long)f->cand);
	return strtod(t, NULL);
}

/* Whether the values the digits so far may still become meet n's range. The magnitudes
 * reachable are [a, b): a the digits' own value (in the validator's doubles, so that a bound
 * such as 0.3 is met by "0.3"), b past every longer decimal; an end the range leaves out is
 * not met by a value on it. */
static bool num_viable(const struct gnode *n, const struct gram_frame *f)
{
	bool neg = f->aux & 1;
	double a = 0, b = INFINITY;
	if (f->phase != NU_MINUS) {
		a = num_mag(f);
		if (f->phase == NU_FRAC || f->phase == NU_DOT)
			b = a + pow(10, -(int)NUM_FRAC(f));
		else if (!f->cand) /* a leading 0: only a fraction may follow */
			b = 1;
	}
	if (!neg) /* [a, b): a itself, or what lies above it */
		return (n->dhi_x ? a < n->dhi : a <= n->dhi) &&
		       ((!n->dlo_x && a >= n->dlo) || b > n->dlo);
	return (n->dlo_x ? -a > n->dlo : -a >= n->dlo) && /* (-b, -a] */
	       ((!n->dhi_x && -a <= n->dhi) || -b < n->dhi);
}

static bool num_digit(const struct gnode *n, struct gram_frame *f, unsigned char c)
{
	if (c == '-') {
		f->aux |= 1;
	} else if (c >= '0' && c <= '9' && f->phase == NU_FRAC) {
		if (NUM_FRAC(f) >= n->frac)
			return false;
		f->seen = f->seen * 10 + (uint64_t)(c - '0');
		f->aux = (int16_t)(uint16_t)(((uint16_t)f->aux & 0xFF) | (NUM_FRAC(f) + 1) << 8);
	} else if (c >= '0' && c <= '9') {
		if (f->cand >= 100000000000000000ull)
			return false; /* 18 digits before the point */
		f->cand = f->cand * 10 + (uint64_t)(c - '0');
	}
	return num_viable(n, f);
}

/* Whether a bounded number's value is in its range: as a validator reads it, the double
 * nearest the decimal (strtod's), compared with the bounds' doubles. */
static bool num_in(const struct gnode *n, const struct gram_frame *f)
{
	double v = f->aux & 1 ? -num_mag(f) : num_mag(f);
	return (n->dlo_x ? v > n->dlo : v >= n->dlo) && (n->dhi_x ? v < n->dhi : v <= n->dhi);
}

/* A bounded number's or integer's digit: still viable. */
static bool bound_digit(const struct gnode *n, struct gram_frame *f, unsigned char c)
{
	return !n->bounded || (n->kind == GN_INTEGER ? int_digit(n, f, c) : num_digit(n, f, c));
}

/* A bounded number's or integer's value: in range. */
static bool bound_in(const struct gnode *n, const struct gram_frame *f)
{
	return !n->bounded || (n->kind == GN_INTEGER ? int_in(n, f) : num_in(n, f));
}

static bool value_begin(const struct gram *g, struct gram_state *s, int node, unsigned char c,
			int depth)
{
	struct gram_frame *f = &s->f[s->depth - 1];
	const struct gnode *n = &g->nodes[node];
	switch (n->kind) {
	case GN_ANY:
		return value_begin(g, s,
				   c == '{'   ? N_ANY_OBJECT
				   : c == '[' ? N_ANY_ARRAY
				   : c == '"' ? N_STRING
				   : c == 't' || c == 'f' || c == 'n' ? N_WORDS
								       : N_NUMBER,
				   c, depth);
	case GN_ANYOF: /* (a $ref to itself among the alternatives: the depth ends it) */
		for (int i = 0; i < n->n && depth < 16; i++) {
			uint64_t set[4] = {0};
			int alt = g->val[n->first + i];
			first_bytes(g, alt, set, 0);
			if ((set[c >> 6] >> (c & 63) & 1) && value_begin(g, s, alt, c, depth + 1))
				return true;
		}
		return false;
	case GN_OBJECT:
		if (c != '{')
			return false;
		*f = (struct gram_frame){.node = (uint16_t)node, .kind = F_OBJ, .phase = OB_OPEN};
		return true;
	case GN_ARRAY:
		if (c != '[')
			return false;
		*f = (struct gram_frame){.node = (uint16_t)node, .kind = F_ARR, .phase = AR_OPEN};
		return true;
	case GN_STRING:
		if (c != '"')
			return false;
		*f = (struct gram_frame){.node = (uint16_t)node, .kind = F_STR, .phase = ST_IN,
					 .cand = GRE_START};
		return true;
	case GN_NUMBER:
	case GN_INTEGER:
		if (c != '-' && !(c >= '0' && c <= '9'))
			return false;
		*f = (struct gram_frame){.node = (uint16_t)node, .kind = F_NUM, .pos = 1,
					 .phase = c == '-' ? NU_MINUS : c == '0' ? NU_ZERO : NU_INT};
		return bound_digit(n, f, c);
	case GN_LIT:
		if (!lit_cand_begin(g, f, node, c))
			return false;
		bool longer, whole = lit_whole(g, f, &longer);
		if (whole && !longer)
			value_done(g, s);
		return true;
	}
	return false;
}

static uint64_t all_props(const struct gnode *n)
{
	return n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
}

/* The next property key's first byte (after its opening quote) in an object frame. */
static bool key_begin(const struct gram *g, struct gram_state *s, struct gram_frame *f)
{
	const struct gnode *n = &g->nodes[f->node];
	f->phase = OB_KEY;
	f->ws = 0;
	if (n->free_keys) /* any keys: a string of its own */
		return push(s, (struct gram_frame){.node = N_STRING, .kind = F_STR});
	f->cand = all_props(n) & ~f->seen;
	f->pos = 1;
	return f->cand != 0;
}

static bool number_byte(struct gram_frame *f, unsigned char c, bool integer, bool exp_ok,
			bool *end)
{
	bool digit = c >= '0' && c <= '9';
	*end = false;
	switch (f->phase) {
	case NU_MINUS:
		if (!digit)
			return false;
		f->phase = c == '0' ? NU_ZERO : NU_INT;
		break;
	case NU_ZERO:
	case NU_INT:
	case NU_FRAC:
	case NU_EXP:
		if (digit && f->phase != NU_ZERO) {
			break;
		} else if (c == '.' && !integer && (f->phase == NU_ZERO || f->phase == NU_INT)) {
			f->phase = NU_DOT;
		} else if ((c == 'e' || c == 'E') && !integer && exp_ok && f->phase != NU_EXP) {
			f->phase = NU_E;
		} else {
			*end = true; /* the number is over: c is the parent's */
			return true;
		}
		break;
	case NU_DOT:
		if (!digit)
			return false;
		f->phase = NU_FRAC;
		break;
	case NU_E:
		if (c == '+' || c == '-')
			f->phase = NU_ESIGN;
		else if (digit)
			f->phase = NU_EXP;
		else
			return false;
		break;
	case NU_ESIGN:
		if (!digit)
			return false;
		f->phase = NU_EXP;
		break;
	}
	return ++f->pos <= GRAM_NUM_MAX;
}

static bool hex(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A string's frame: f->seen's low 32 bits count its characters (code points), its high 32
 * hold a UTF-8 sequence's bits so far (ST_UTF: f->pos bytes to come, f->aux its length);
 * f->aux a \u's value; f->cand, with a pattern, the automaton's state. */
#define STR_COUNT(f) ((uint32_t)(f)->seen)
#define STR_PART(f) ((uint32_t)((f)->seen >> 32))

/* Code point cp of the string: the pattern's automaton steps (false: it cannot come). */
static bool str_cp(const struct gram *g, const struct gnode *n, struct gram_frame *f,
		   uint32_t cp)
{
	if (!n->re)
		return true;
	uint64_t t = gre_step(&g->re[n->re - 1], f->cand, cp);
	f->cand = t;
	return t != 0;
}

/* With a pattern, a UTF-8 sequence is checked as it comes: its code point must be one the
 * automaton may take, so no byte leads where none can follow. */
static bool str_utf8(const struct gram *g, const struct gnode *n, struct gram_frame *f,
		     unsigned char c)
{
	uint32_t part;
	int left, total;
	if (f->phase != ST_UTF) { /* a lead byte */
		if (c < 0xC2 || c > 0xF4)
			return false;
		total = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
		left = total - 1;
		part = c & (0x7Fu >> total);
		f->phase = ST_UTF;
		f->aux = (int16_t)total;
	} else {
		if ((c & 0xC0) != 0x80)
			return false;
		total = f->aux;
		left = f->pos - 1;
		part = STR_PART(f) << 6 | (c & 0x3Fu);
	}
	f->pos = (uint16_t)left;
	f->seen = (uint64_t)STR_COUNT(f) | (uint64_t)part << 32;
	if (!left) {
		f->phase = ST_IN;
		return part >= (total == 2 ? 0x80u : total == 3 ? 0x800u : 0x10000u) &&
		       !(part >= 0xD800 && part <= 0xDFFF) && part <= 0x10FFFF &&
		       str_cp(g, n, f, part);
	}
	uint32_t lo = part << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
	uint32_t least = total == 2 ? 0x80u : total == 3 ? 0x800u : 0x10000u;
	if (lo < least)
		lo = least;
	if (hi > 0x10FFFF)
		hi = 0x10FFFF;
	return lo <= hi && gre_may(&g->re[n->re - 1], f->cand, lo, hi);
}

/* With a pattern, a \u escape is checked as its hex digits come: some code point they may
 * still make, [lo, hi], must be one the automaton may take (a pattern's strings take no
 * surrogate escapes), so no digit, and no backslash, leads where none can follow. */
static bool str_hex_may(const struct gram *g, const struct gnode *n, const struct gram_frame *f,
			uint32_t lo, uint32_t hi)
{
	if (!n->re)
		return true;
	const struct gre *re = &g->re[n->re - 1];
	return (lo < 0xD800 && gre_may(re, f->cand, lo, hi < 0xD7FF ? hi : 0xD7FF)) ||
	       (hi > 0xDFFF && gre_may(re, f->cand, lo > 0xE000 ? lo : 0xE000, hi));
}

static bool str_byte(const struct gram *g, struct gram_state *s, struct gram_frame *f,
		     const struct gnode *n, unsigned char c)
{
	if (f->phase == ST_ESC) {
		static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
		if (c == 'u') {
			f->phase = ST_HEX;
			f->pos = 0;
			f->aux = 0;
			return str_hex_may(g, n, f, 0, 0xFFFF);
		}
		const char *k = c ? strchr(from, c) : NULL;
		f->phase = ST_IN;
		f->seen++;
		return k && str_cp(g, n, f, (unsigned char)to[k - from]);
	}
	if (f->phase == ST_HEX) {
		if (!hex(c))
			return false;
		f->aux = (int16_t)(uint16_t)((uint16_t)f->aux << 4 |
					     (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10));
		if (++f->pos < 4) {
			uint32_t lo = (uint32_t)(uint16_t)f->aux << (4 * (4 - f->pos));
			return str_hex_may(g, n, f, lo, lo | ((1u << (4 * (4 - f->pos))) - 1));
		}
		f->phase = ST_IN;
		/* a high surrogate's \u is half of one character: the low's counts; a pattern's
		 * strings take no surrogate escapes (raw UTF-8 says the same) */
		uint16_t u = (uint16_t)f->aux;
		f->seen += !(u >= 0xD800 && u <= 0xDBFF);
		return !(n->re && u >= 0xD800 && u <= 0xDFFF) && str_cp(g, n, f, u);
	}
	if (f->phase == ST_UTF)
		return str_utf8(g, n, f, c);
	if (c == '"') {
		if (STR_COUNT(f) < (uint32_t)n->min_items ||
		    (n->re && !gre_accepts(&g->re[n->re - 1], f->cand)))
			return false; /* minLength, or the pattern not matched yet */
		value_done(g, s);
		return true;
	}
	if (c < 0x80 || c >= 0xC0) { /* a character begins (not a UTF-8 continuation) */
		if (n->max_items >= 0 && STR_COUNT(f) >= (uint32_t)n->max_items)
			return false; /* maxLength */
		if (c != '\\')
			f->seen++; /* (an escape counts once its kind is known) */
	}
	if (c == '\\') { /* (with a pattern: where some escape's character may come) */
		f->phase = ST_ESC;
		return !n->re || str_hex_may(g, n, f, 0, 0xFFFF);
	}
	if (c < 0x20)
		return false;
	if (!n->re || c < 0x80)
		return str_cp(g, n, f, c);
	return str_utf8(g, n, f, c);
}

static bool step(const struct gram *g, struct gram_state *s, unsigned char c)
{
	for (;;) { /* again when a value ends on a byte that is its parent's */
		if (s->done || s->depth == 0)
			return false;
		struct gram_frame *f = &s->f[s->depth - 1];
		const struct gnode *n = &g->nodes[f->node];
		switch (f->kind) {
		case F_VALUE:
			if (is_ws(c))
				return ws(f, c);
			return value_begin(g, s, f->node, c, 0);
		case F_STR:
			return str_byte(g, s, f, n, c);
		case F_NUM: {
			bool end;
			if (!number_byte(f, c, n->kind == GN_INTEGER, !n->bounded, &end))
				return false;
			if (!end)
				return bound_digit(n, f, c);
			if (f->phase == NU_MINUS || f->phase == NU_DOT || f->phase == NU_E ||
			    f->phase == NU_ESIGN || !bound_in(n, f))
				return false;
			value_done(g, s);
			continue;
		}
		case F_LIT: {
			uint64_t next = 0;
			for (int i = 0; i < n->n; i++)
				if ((f->cand >> i & 1) && g->len[n->first + i] > f->pos &&
				    (unsigned char)g->text[n->first + i][f->pos] == c)
					next |= 1ull << i;
			if (!next) {
				bool longer;
				if (!lit_whole(g, f, &longer))
					return false;
				value_done(g, s); /* (a number that may have gone on: 1 of 1, 10) */
				continue;
			}
			f->cand = next;
			f->pos++;
			bool longer, whole = lit_whole(g, f, &longer);
			if (whole && !longer)
				value_done(g, s);
			return true;
		}
		case F_OBJ:
			switch (f->phase) {
			case OB_OPEN:
			case OB_NEXT:
				if (is_ws(c))
					return ws(f, c);
				if (c == '"')
					return key_begin(g, s, f);
				if (c != '}' || f->phase == OB_NEXT ||
				    (f->seen & n->required) != n->required)
					return false;
				value_done(g, s);
				return true;
			case OB_KEY: { /* a listed key: its JSON text, the closing quote included */
				uint64_t next = 0;
				int hit = -1;
				for (int i = 0; i < n->n; i++)
					if ((f->cand >> i & 1) && g->len[n->first + i] > f->pos &&
					    (unsigned char)g->text[n->first + i][f->pos] == c) {
						next |= 1ull << i;
						if (g->len[n->first + i] == (size_t)f->pos + 1u)
							hit = i;
					}
				if (!next)
					return false;
				f->cand = next;
				f->pos++;
				if (hit >= 0) {
					f->aux = (int16_t)hit;
					f->phase = OB_COLON;
					f->ws = 0;
				}
				return true;
			}
			case OB_COLON:
				if (is_ws(c))
					return ws(f, c);
				if (c != ':')
					return false;
				f->phase = OB_VAL;
				f->ws = 0;
				return push(s, (struct gram_frame){
						       .node = (uint16_t)(n->free_keys
									      ? n->items
									      : g->val[n->first + f->aux]),
						       .kind = F_VALUE});
			case OB_AFTER:
				if (is_ws(c))
					return ws(f, c);
				if (c == '}') {
					if ((f->seen & n->required) != n->required)
						return false;
					value_done(g, s);
					return true;
				}
				if (c != ',')
					return false;
				if (!n->free_keys && (f->seen & all_props(n)) == all_props(n))
					return false; /* every key is there */
				f->phase = OB_NEXT;
				f->ws = 0;
				return true;
			}
			return false;
		case F_ARR:
			switch (f->phase) {
			case AR_OPEN:
			case AR_NEXT:
				if (is_ws(c))
					return ws(f, c);
				if (c == ']' && f->phase == AR_OPEN) {
					if (f->pos < n->min_items)
						return false;
					value_done(g, s);
					return true;
				}
				if (n->max_items >= 0 && f->pos >= n->max_items)
					return false;
				f->phase = AR_VAL;
				f->ws = 0;
				if (!push(s, (struct gram_frame){.node = (uint16_t)n->items,
								 .kind = F_VALUE}))
					return false;
				continue; /* c begins the item */
			case AR_AFTER:
				if (is_ws(c))
					return ws(f, c);
				if (c == ']') {
					if (f->pos < n->min_items)
						return false;
					value_done(g, s);
					return true;
				}
				if (c != ',')
					return false;
				f->phase = AR_NEXT;
				f->ws = 0;
				return true;
			}
			return false;
		}
		return false;
	}
}

bool gram_feed(const struct gram *g, struct gram_state *s, const char *bytes, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!step(g, s, (unsigned char)bytes[i]))
			return false;
	return true;
}

bool gram_complete(const struct gram *g, const struct gram_state *s)
{
	if (s->done)
		return true;
	if (s->depth != 1)
		return false;
	const struct gram_frame *f = &s->f[0];
	if (f->kind == F_NUM)
		return (f->phase == NU_ZERO || f->phase == NU_INT || f->phase == NU_FRAC ||
			f->phase == NU_EXP) &&
		       bound_in(&g->nodes[f->node], f);
	bool longer;
	return f->kind == F_LIT && lit_whole(g, f, &longer);
}

/* ---- the vocabulary ---- */

struct tnode {
	int child, sibling; /* first child, next sibling (-1: none) */
	int tok;            /* the first token whose bytes end here (-1: none); same[] chains */
	unsigned char byte;
};

struct gram_vocab {
	int n;
	struct tnode *t;
	int n_t, cap_t;
	int *same;          /* [n]: the next token with the same bytes */
	unsigned char *plain; /* [n]: no '"', '\\' or control byte: a string's text whole */
	int *chars;         /* [n]: a plain token's characters (its bytes not continuing one) */
	int *other;         /* the tokens with bytes but not plain */
	int n_other, n_plain;
	const char *const *pieces;
	size_t *lens;
	int max_len;
	/* inside a pattern's strings: the plain tokens each automaton state takes, for the
	 * states seen last (a copy of the automaton is the key, with the state) */
	struct re_mask {
		struct gre re;
		uint64_t set;
		unsigned char *mask; /* [n]: 1 for a plain token the state takes */
		int count;
		long used;
		bool valid;
	} cache[GRAM_RE_CACHE];
	long tick;
};

static int tnode_new(struct gram_vocab *v, unsigned char b)
{
	if (v->n_t == v->cap_t) {
		int cap = v->cap_t ? 2 * v->cap_t : 1024;
		struct tnode *p = realloc(v->t, (size_t)cap * sizeof *p);
		if (!p)
			return -1;
		v->t = p;
		v->cap_t = cap;
	}
	v->t[v->n_t] = (struct tnode){-1, -1, -1, b};
	return v->n_t++;
}

void gram_vocab_free(struct gram_vocab *v)
{
	if (!v)
		return;
	free(v->t);
	free(v->same);
	free(v->plain);
	free(v->chars);
	free(v->other);
	free(v->lens);
	for (int i = 0; i < GRAM_RE_CACHE; i++)
		free(v->cache[i].mask);
	free(v);
}

int gram_vocab_new(const char *const *pieces, const size_t *lens, int n,
		   struct gram_vocab **out)
{
	*out = NULL;
	struct gram_vocab *v = calloc(1, sizeof *v);
	if (!v)
		return WK_ENOMEM;
	v->n = n;
	v->pieces = pieces;
	v->same = malloc((size_t)(n + 1) * sizeof *v->same);
	v->plain = calloc((size_t)n + 1, 1);
	v->chars = calloc((size_t)n + 1, sizeof *v->chars);
	v->other = malloc((size_t)(n + 1) * sizeof *v->other);
	v->lens = malloc((size_t)(n + 1) * sizeof *v->lens);
	if (!v->same || !v->plain || !v->chars || !v->other || !v->lens ||
	    tnode_new(v, 0) != 0) {
		gram_vocab_free(v);
		return WK_ENOMEM;
	}
	for (int id = 0; id < n; id++) {
		size_t len = pieces[id] ? lens[id] : 0;
		v->lens[id] = len;
		v->same[id] = -1;
		if (!len)
			continue;
		bool plain = true;
		for (size_t k = 0; k < len; k++) {
			unsigned char c = (unsigned char)pieces[id][k];
			plain &= c != '"' && c != '\\' && c >= 0x20;
			v->chars[id] += c < 0x80 || c >= 0xC0;
		}
		v->plain[id] = plain;
		v->n_plain += plain;
		if (!plain)
			v->other[v->n_other++] = id;
		v->max_len = len > (size_t)v->max_len ? (int)len : v->max_len;
		int at = 0;
		for (size_t k = 0; k < len; k++) {
			unsigned char c = (unsigned char)pieces[id][k];
			int ch = v->t[at].child, prev = -1;
			while (ch >= 0 && v->t[ch].byte != c) {
				prev = ch;
				ch = v->t[ch].sibling;
			}
			if (ch < 0) {
				if ((ch = tnode_new(v, c)) < 0) {
					gram_vocab_free(v);
					return WK_ENOMEM;
				}
				if (prev >= 0)
					v->t[prev].sibling = ch;
				else
					v->t[at].child = ch;
			}
			at = ch;
		}
		v->same[id] = v->t[at].tok;
		v->t[at].tok = id;
	}
	*out = v;
	return WK_OK;
}

/* Marks the tokens below trie node `at` whose bytes s (a state after the bytes down to it)
 * accepts; st: a state for each depth below. */
static int walk(const struct gram *g, const struct gram_vocab *v, int at,
		const struct gram_state *s, struct gram_state *st, unsigned char *allowed)
{
	int count = 0;
	for (int ch = v->t[at].child; ch >= 0; ch = v->t[ch].sibling) {
		struct gram_state *t = st;
		t->depth = s->depth;
		t->done = s->done;
		memcpy(t->f, s->f, (size_t)s->depth * sizeof *s->f);
		if (!step(g, t, v->t[ch].byte))
			continue;
		for (int id = v->t[ch].tok; id >= 0; id = v->same[id]) {
			allowed[id] = 1;
			count++;
		}
		count += walk(g, v, ch, t, st + 1, allowed);
	}
	return count;
}

/* The plain tokens below trie node `at` that a pattern's string takes from frame f: the trie
 * walked with that one frame, the branches through '"', '\\' or control bytes left out (no
 * plain token is down them). n: the string's node without its length bounds. */
static void walk_str(const struct gram *g, const struct gram_vocab *v, const struct gnode *n,
		     int at, const struct gram_frame *f, unsigned char *mask, int *count)
{
	for (int ch = v->t[at].child; ch >= 0; ch = v->t[ch].sibling) {
		unsigned char b = v->t[ch].byte;
		struct gram_frame t = *f;
		if (b == '"' || b == '\\' || b < 0x20 || !str_byte(g, NULL, &t, n, b))
			continue;
		for (int id = v->t[ch].tok; id >= 0; id = v->same[id]) {
			mask[id] = 1;
			(*count)++;
		}
		walk_str(g, v, n, ch, &t, mask, count);
	}
}

/* The cached plain-token mask of a pattern's string in frame top (ST_IN), made on a miss;
 * NULL when out of memory. */
static const struct re_mask *re_mask(const struct gram *g, struct gram_vocab *v,
				     const struct gram_frame *top)
{
	const struct gnode *n = &g->nodes[top->node];
	const struct gre *re = &g->re[n->re - 1];
	struct re_mask *e = NULL;
	v->tick++;
	for (int i = 0; i < GRAM_RE_CACHE; i++) {
		struct re_mask *c = &v->cache[i];
		if (c->valid && c->set == top->cand && !memcmp(&c->re, re, sizeof *re)) {
			c->used = v->tick;
			return c;
		}
		if (!e || !c->valid || (e->valid && c->used < e->used))
			e = c; /* the slot to fill: a free one, else the least recently used */
	}
	if (!e->mask && !(e->mask = malloc((size_t)v->n)))
		return NULL;
	memset(e->mask, 0, (size_t)v->n);
	memcpy(&e->re, re, sizeof *re); /* (bytes, padding too: the key is compared as bytes) */
	e->set = top->cand;
	e->count = 0;
	struct gnode free_len = *n;
	free_len.min_items = 0;
	free_len.max_items = -1;
	struct gram_frame f = {.node = top->node, .kind = F_STR, .phase = ST_IN, .cand = top->cand};
	walk_str(g, v, &free_len, 0, &f, e->mask, &e->count);
	e->valid = true;
	e->used = v->tick;
	return e;
}

int gram_allowed(const struct gram *g, struct gram_vocab *v, const struct gram_state *s,
		 unsigned char *allowed)
{
	int count = 0;
	const struct gram_frame *top = s->depth ? &s->f[s->depth - 1] : NULL;
	const struct re_mask *m = NULL;
	if (!s->done && top && top->kind == F_STR && top->phase == ST_IN &&
	    (!g->nodes[top->node].re || (m = re_mask(g, v, top)))) {
		memcpy(allowed, m ? m->mask : v->plain, (size_t)v->n);
		count = m ? m->count : v->n_plain;
		int max = g->nodes[top->node].max_items; /* maxLength: the plain tokens that fit */
		for (int id = 0; max >= 0 && id < v->n; id++)
			if (allowed[id] && STR_COUNT(top) + (uint32_t)v->chars[id] > (uint32_t)max) {
				allowed[id] = 0;
				count--;
			}
		for (int k = 0; k < v->n_other; k++) {
			int id = v->other[k];
			struct gram_state t = *s;
			allowed[id] = gram_feed(g, &t, v->pieces[id], v->lens[id]);
			count += allowed[id];
		}
		return count;
	}
	memset(allowed, 0, (size_t)v->n);
	if (s->done)
		return 0;
	struct gram_state *st = malloc((size_t)(v->max_len + 1) * sizeof *st);
	if (!st)
		return 0;
	count = walk(g, v, 0, s, st, allowed);
	free(st);
	return count;
}
