/*
 * grammar_re.c - a pattern parsed into a tree whose leaves are positions (a character class
 * each), then Glushkov's construction over it: the positions that may begin and end a match,
 * and those that may follow each. A state is the set of positions the last code point matched
 * (GRE_START before the first). See grammar_re.h for the subset.
 */
#include "worker/grammar_re.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/wk.h"

enum { R_LEAF, R_EMPTY, R_CAT, R_ALT, R_STAR, R_PLUS, R_OPT };

#define NODES_MAX 512

struct rnode {
	uint8_t k;
	int a, b; /* children; a leaf's position in a */
};

struct rc {
	const unsigned char *p, *end;
	struct gre *r;
	struct rnode node[NODES_MAX];
	int n_node;
	char *err;
	size_t errsz;
	int rc;
};

static int rfail(struct rc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rfail(struct rc *c, const char *fmt, ...)
{
	if (c->rc == WK_OK) {
		char msg[WK_ERRSZ];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof msg, fmt, ap);
		va_end(ap);
		c->rc = wk_errf(c->err, c->errsz, WK_EINVAL, "pattern: %s", msg);
	}
	return -1;
}

static int node(struct rc *c, int k, int a, int b)
{
	if (c->n_node == NODES_MAX)
		return rfail(c, "too large (more than %d parts)", NODES_MAX);
	c->node[c->n_node] = (struct rnode){.k = (uint8_t)k, .a = a, .b = b};
	return c->n_node++;
}

static int leaf(struct rc *c, const struct gre_cls *cls)
{
	if (c->r->n == GRE_POS_MAX)
		return rfail(c, "more than %d characters to match (a repetition's copies count)",
			     GRE_POS_MAX);
	c->r->cls[c->r->n] = *cls;
	return node(c, R_LEAF, c->r->n++, 0);
}

/* ---- classes ---- */

/* Unicode's spaces and line terminators beyond ASCII (\s's): GRE_WIDE_ALL leaves them out. */
static bool wide_space(uint32_t cp)
{
	return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
	       cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

static void add_ascii(struct gre_cls *k, uint32_t lo, uint32_t hi)
{
	for (uint32_t c = lo; c <= hi && c < 128; c++)
		k->ascii[c >> 6] |= 1ull << (c & 63);
}

static bool cls_has(const struct gre_cls *k, uint32_t cp)
{
	if (cp < 128)
		return k->ascii[cp >> 6] >> (cp & 63) & 1;
	if (k->wide == GRE_WIDE_ALL)
		return !wide_space(cp) && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
	for (int i = 0; k->wide == GRE_WIDE_RANGES && i < k->n_ranges; i++)
		if (cp >= k->lo[i] && cp <= k->hi[i])
			return true;
	return false;
}

/* Whether k holds some code point in [lo, hi]. */
static bool cls_meets(const struct gre_cls *k, uint32_t lo, uint32_t hi)
{
	for (uint32_t c = lo; c <= hi && c < 128; c++)
		if (cls_has(k, c))
			return true;
	if (hi < 128)
		return false;
	if (lo < 128)
		lo = 128;
	if (k->wide == GRE_WIDE_ALL) {
		if (lo >= 0xD800 && hi <= 0xDFFF) /* surrogates are no characters */
			return false;
		/* (the spaces left out are single points and one run of 11) */
		if (hi - lo >= 16 && !(lo >= 0xD800 && lo <= 0xDFFF))
			return true;
		for (uint32_t c = lo; c <= hi; c++)
			if (cls_has(k, c))
				return true;
		return false;
	}
	for (int i = 0; k->wide == GRE_WIDE_RANGES && i < k->n_ranges; i++)
		if (lo <= k->hi[i] && hi >= k->lo[i])
			return true;
	return false;
}

/* The next code point of the pattern's UTF-8 (a malformed byte is refused). */
static int next_cp(struct rc *c, uint32_t *cp)
{
	const unsigned char *p = c->p;
	if (p >= c->end)
		return rfail(c, "ends too soon");
	int n = p[0] < 0x80 ? 1 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC0 ? 2 : 0;
	if (!n || p + n > c->end)
		return rfail(c, "not UTF-8");
	uint32_t v = n == 1 ? p[0] : (uint32_t)(p[0] & (0x7F >> n));
	for (int i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return rfail(c, "not UTF-8");
		v = v << 6 | (p[i] & 0x3F);
	}
	c->p += n;
	*cp = v;
	return 0;
}

static int hexval(struct rc *c, int digits, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < digits; i++) {
		if (c->p >= c->end)
			return rfail(c, "a \\x or \\u escape ends too soon");
		unsigned char h = *c->p++;
		int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f'
							  ? (h | 0x20) - 'a' + 10 : -1;
		if (d < 0)
			return rfail(c, "a \\x or \\u escape wants hex digits");
		*v = *v << 4 | (uint32_t)d;
	}
	return 0;
}

/* Adds the class escape e (d, D, w, W, s, S) to k. */
static void add_escape_class(struct gre_cls *k, unsigned char e)
{
	struct gre_cls t = {0};
	unsigned char low = e | 0x20;
	if (low == 'd') {
		add_ascii(&t, '0', '9');
	} else if (low == 'w') {
		add_ascii(&t, 'a', 'z');
		add_ascii(&t, 'A', 'Z');
		add_ascii(&t, '0', '9');
		add_ascii(&t, '_', '_');
	} else {
		add_ascii(&t, '\t', '\r'); /* \t \n \v \f \r */
		add_ascii(&t, ' ', ' ');
	}
	if (e >= 'A' && e <= 'Z') { /* negated: the rest of ASCII, and beyond it all but spaces */
		t.ascii[0] = ~t.ascii[0];
		t.ascii[1] = ~t.ascii[1];
		t.wide = GRE_WIDE_ALL;
	}
	k->ascii[0] |= t.ascii[0];
	k->ascii[1] |= t.ascii[1];
	if (t.wide == GRE_WIDE_ALL)
		k->wide = GRE_WIDE_ALL;
}

/* An escape after its backslash, as one code point (*cp) or a class (*is_cls, added to k). */
static int escape(struct rc *c, bool in_class, uint32_t *cp, bool *is_cls, struct gre_cls *k)
{
	*is_cls = false;
	if (c->p >= c->end)
		return rfail(c, "ends with a backslash");
	unsigned char e = *c->p++;
	switch (e) {
	case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
		add_escape_class(k, e);
		*is_cls = true;
		return 0;
	case 't': *cp = '\t'; return 0;
	case 'n': *cp = '\n'; return 0;
	case 'r': *cp = '\r'; return 0;
	case 'f': *cp = '\f'; return 0;
	case 'v': *cp = '\v'; return 0;
	case '0': *cp = 0; return 0;
	case 'x': return hexval(c, 2, cp);
	case 'u':
		if (hexval(c, 4, cp))
			return -1;
		if (*cp >= 0xD800 && *cp <= 0xDFFF)
			return rfail(c, "a \\u escape of a surrogate is not supported");
		return 0;
	case 'b':
		if (in_class) {
			*cp = '\b';
			return 0;
		}
		return rfail(c, "\\b (a word boundary) is not supported");
	}
	if (e >= '1' && e <= '9')
		return rfail(c, "backreferences (\\%c) are not supported", e);
	if (e < 0x80 && !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') ||
			  (e >= '0' && e <= '9'))) {
		*cp = e; /* escaped punctuation: itself */
		return 0;
	}
	return rfail(c, "the escape \\%c is not supported", e);
}

static int add_range(struct rc *c, struct gre_cls *k, uint32_t lo, uint32_t hi)
{
	if (lo > hi)
		return rfail(c, "a class range is out of order");
	add_ascii(k, lo, hi);
	if (hi < 128 || k->wide == GRE_WIDE_ALL)
		return 0;
	if (k->n_ranges == GRE_RANGES_MAX)
		return rfail(c, "a class has more than %d ranges beyond ASCII", GRE_RANGES_MAX);
	k->wide = GRE_WIDE_RANGES;
	k->lo[k->n_ranges] = lo < 128 ? 128 : lo;
	k->hi[k->n_ranges++] = hi;
	return 0;
}

/* [...] after its '[' */
static int bracket(struct rc *c)
{
	struct gre_cls k = {0};
	bool neg = c->p < c->end && *c->p == '^';
	c->p += neg;
	bool first = true;
	for (;;) {
		if (c->p >= c->end)
			return rfail(c, "a class has no closing ]");
		if (*c->p == ']' && !first) {
			c->p++;
			break;
		}
		first = false;
		uint32_t lo, hi;
		bool is_cls;
		if (*c->p == '\\') {
			c->p++;
			if (escape(c, true, &lo, &is_cls, &k))
				return -1;
			if (is_cls)
				continue;
		} else if (next_cp(c, &lo)) {
			return -1;
		}
		hi = lo;
		if (c->p + 1 < c->end && *c->p == '-' && c->p[1] != ']') {
			c->p++;
			if (*c->p == '\\') {
				c->p++;
				if (escape(c, true, &hi, &is_cls, &k))
					return -1;
				if (is_cls)
					return rfail(c, "a class range ends in a class escape");
			} else if (next_cp(c, &hi)) {
				return -1;
			}
		}
		if (add_range(c, &k, lo, hi))
			return -1;
	}
	if (neg) {
		if (k.wide == GRE_WIDE_RANGES)
			return rfail(c, "a negated class with characters beyond ASCII is not "
				     "supported");
		k.ascii[0] = ~k.ascii[0];
		k.ascii[1] = ~k.ascii[1];
		k.wide = k.wide == GRE_WIDE_ALL ? GRE_WIDE_NONE : GRE_WIDE_ALL;
	}
	return leaf(c, &k);
}

/* ---- the tree ---- */

static int alt(struct rc *c, int depth);

/* A copy of subtree n with positions of its own. */
static int clone(struct rc *c, int n)
{
	struct rnode x = c->node[n];
	if (x.k == R_LEAF)
		return leaf(c, &c->r->cls[x.a]);
	int a = x.k == R_EMPTY ? 0 : clone(c, x.a), b = 0;
	if (a < 0 || ((x.k == R_CAT || x.k == R_ALT) && (b = clone(c, x.b)) < 0))
		return -1;
	return node(c, x.k, a, b);
}

static int atom(struct rc *c, int depth)
{
	unsigned char ch = *c->p;
	if (ch == '(') {
		c->p++;
		if (c->p < c->end && *c->p == '?') {
			if (c->p + 1 < c->end && c->p[1] == ':') {
				c->p += 2;
			} else if (c->p + 2 < c->end && c->p[1] == '<' && c->p[2] != '=' &&
				   c->p[2] != '!') { /* a named group: its name skipped */
				const unsigned char *gt = memchr(c->p, '>', (size_t)(c->end - c->p));
				if (!gt)
					return rfail(c, "a group name has no closing >");
				c->p = gt + 1;
			} else {
				return rfail(c, "lookaround ((?=, (?!, (?<=, (?<!) is not supported");
			}
		}
		int n = alt(c, depth + 1);
		if (n < 0)
			return -1;
		if (c->p >= c->end || *c->p != ')')
			return rfail(c, "a group has no closing )");
		c->p++;
		return n;
	}
	if (ch == '[') {
		c->p++;
		return bracket(c);
	}
	struct gre_cls k = {0};
	uint32_t cp;
	if (ch == '.') {
		c->p++;
		add_ascii(&k, 0, 127);
		k.ascii[0] &= ~(1ull << '\n' | 1ull << '\r');
		k.wide = GRE_WIDE_ALL;
		return leaf(c, &k);
	}
	if (ch == '\\') {
		c->p++;
		bool is_cls;
		if (escape(c, false, &cp, &is_cls, &k))
			return -1;
		if (is_cls)
			return leaf(c, &k);
	} else if (ch == '^' || ch == '$') {
		return rfail(c, "%c only at the pattern's %s is supported", ch,
			     ch == '^' ? "start" : "end");
	} else if (ch == '*' || ch == '+' || ch == '?' || ch == '{' || ch == '}' || ch == ']') {
		return rfail(c, "'%c' with nothing to repeat (escape it to match it)", ch);
	} else if (next_cp(c, &cp)) {
		return -1;
	}
	if (add_range(c, &k, cp, cp))
		return -1;
	return leaf(c, &k);
}

static int number(struct rc *c, int *v)
{
	if (c->p >= c->end || *c->p < '0' || *c->p > '9')
		return -1;
	long n = 0;
	while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
		n = n * 10 + (*c->p++ - '0');
		if (n > 1000)
			return rfail(c, "a repetition count over 1000");
	}
	*v = (int)n;
	return 0;
}

/* An atom and its quantifier. */
static int piece(struct rc *c, int depth)
{
	int a = atom(c, depth);
	if (a < 0 || c->p >= c->end)
		return a;
	unsigned char q = *c->p;
	int r;
	if (q == '*' || q == '+' || q == '?') {
		c->p++;
		r = node(c, q == '*' ? R_STAR : q == '+' ? R_PLUS : R_OPT, a, 0);
	} else if (q == '{') {
		c->p++;
		int lo, hi;
		if (number(c, &lo))
			return rfail(c, "'{' that is not a repetition {n}, {n,} or {n,m} (escape it "
				     "to match it)");
		hi = lo;
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			hi = -1;
			if (c->p < c->end && *c->p != '}' && number(c, &hi))
				return rfail(c, "a repetition {n,m} wants numbers");
		}
		if (c->p >= c->end || *c->p != '}')
			return rfail(c, "a repetition has no closing }");
		c->p++;
		if (hi >= 0 && hi < lo)
			return rfail(c, "a repetition {%d,%d} is out of order", lo, hi);
		/* a{lo,hi}: lo copies, then hi - lo optional ones (or a* for no hi) */
		r = lo == 0 ? node(c, R_EMPTY, 0, 0) : a;
		for (int i = 1; r >= 0 && i < lo; i++) {
			int x = clone(c, a);
			r = x < 0 ? -1 : node(c, R_CAT, r, x);
		}
		int more = hi < 0 ? 1 : hi - lo;
		for (int i = 0; r >= 0 && i < more; i++) {
			int x = lo == 0 && i == 0 ? a : clone(c, a);
			x = x < 0 ? -1 : node(c, hi < 0 ? R_STAR : R_OPT, x, 0);
			r = x < 0 ? -1 : node(c, R_CAT, r, x);
		}
		if (lo == 0 && hi == 0) /* a{0}: a is never matched: its positions stay unused */
			r = node(c, R_EMPTY, 0, 0);
	} else {
		return a;
	}
	if (r >= 0 && c->p < c->end && *c->p == '?')
		c->p++; /* lazy: the same strings */
	return r;
}

static int cat(struct rc *c, int depth)
{
	int r = node(c, R_EMPTY, 0, 0);
	while (r >= 0 && c->p < c->end && *c->p != '|' && *c->p != ')') {
		int x = piece(c, depth);
		r = x < 0 ? -1 : node(c, R_CAT, r, x);
	}
	return r;
}

static int alt(struct rc *c, int depth)
{
	if (depth > 32)
		return rfail(c, "groups nested more than 32 deep");
	int r = cat(c, depth);
	while (r >= 0 && c->p < c->end && *c->p == '|') {
		c->p++;
		int x = cat(c, depth);
		r = x < 0 ? -1 : node(c, R_ALT, r, x);
	}
	return r;
}

/* Glushkov: nullable, first and last of subtree n; follow filled in. */
static void sets(struct rc *c, int n, bool *nul, uint64_t *first, uint64_t *last)
{
	struct rnode x = c->node[n];
	bool n1, n2;
	uint64_t f1, l1, f2, l2;
	switch (x.k) {
	case R_LEAF:
		*nul = false;
		*first = *last = 1ull << x.a;
		return;
	case R_EMPTY:
		*nul = true;
		*first = *last = 0;
		return;
	case R_CAT:
	case R_ALT:
		sets(c, x.a, &n1, &f1, &l1);
		sets(c, x.b, &n2, &f2, &l2);
		if (x.k == R_ALT) {
			*nul = n1 || n2;
			*first = f1 | f2;
			*last = l1 | l2;
			return;
		}
		for (int p = 0; p < c->r->n; p++)
			if (l1 >> p & 1)
				c->r->follow[p] |= f2;
		*nul = n1 && n2;
		*first = f1 | (n1 ? f2 : 0);
		*last = l2 | (n2 ? l1 : 0);
		return;
	default: /* R_STAR, R_PLUS, R_OPT */
		sets(c, x.a, &n1, &f1, &l1);
		if (x.k != R_OPT)
			for (int p = 0; p < c->r->n; p++)
				if (l1 >> p & 1)
					c->r->follow[p] |= f1;
		*nul = x.k == R_PLUS ? n1 : true;
		*first = f1;
		*last = l1;
		return;
	}
}

int gre_compile(const char *pat, size_t len, struct gre *r, char *err, size_t errsz)
{
	struct rc cc = {0}, *c = &cc; /* (6 KiB of tree on the stack) */
	memset(r, 0, sizeof *r);
	c->r = r;
	c->err = err;
	c->errsz = errsz;
	c->p = (const unsigned char *)pat;
	c->end = c->p + len;
	bool head = c->p < c->end && *c->p == '^';
	c->p += head;
	/* a '$' that ends it (not escaped: an even run of backslashes before it) */
	bool tail = false;
	if (c->end > c->p && c->end[-1] == '$') {
		size_t bs = 0;
		while (c->end - 1 - bs > c->p && c->end[-2 - (ptrdiff_t)bs] == '\\')
			bs++;
		if (bs % 2 == 0) {
			tail = true;
			c->end--;
		}
	}
	struct gre_cls any = {.ascii = {~0ull, ~0ull}, .wide = GRE_WIDE_ALL};
	int root = head ? node(c, R_EMPTY, 0, 0) : node(c, R_STAR, leaf(c, &any), 0);
	int body = root >= 0 ? alt(c, 0) : -1;
	if (body >= 0 && c->p < c->end)
		body = rfail(c, "an unmatched )");
	root = body < 0 ? -1 : node(c, R_CAT, root, body);
	if (root >= 0 && !tail) {
		int rest = leaf(c, &any);
		rest = rest < 0 ? -1 : node(c, R_STAR, rest, 0);
		root = rest < 0 ? -1 : node(c, R_CAT, root, rest);
	}
	int rc = c->rc;
	if (root >= 0 && rc == WK_OK)
		sets(c, root, &r->nullable, &r->first, &r->last);
	else if (rc == WK_OK)
		rc = wk_errf(err, errsz, WK_EINVAL, "pattern: not supported");
	return rc;
}

/* ---- matching ---- */

static uint64_t next_set(const struct gre *r, uint64_t set)
{
	uint64_t cand = set & GRE_START ? r->first : 0;
	for (int p = 0; p < r->n; p++)
		if (set >> p & 1)
			cand |= r->follow[p];
	return cand;
}

uint64_t gre_step(const struct gre *r, uint64_t set, uint32_t cp)
{
	uint64_t cand = next_set(r, set), out = 0;
	for (int p = 0; p < r->n; p++)
		if ((cand >> p & 1) && cls_has(&r->cls[p], cp))
			out |= 1ull << p;
	return out;
}

bool gre_may(const struct gre *r, uint64_t set, uint32_t lo, uint32_t hi)
{
	uint64_t cand = next_set(r, set);
	for (int p = 0; p < r->n; p++)
		if ((cand >> p & 1) && cls_meets(&r->cls[p], lo, hi))
			return true;
	return false;
}

bool gre_accepts(const struct gre *r, uint64_t set)
{
	return ((set & GRE_START) && r->nullable) || (set & r->last & ~GRE_START);
}
