/*
 * tokenizer_nfc.c - Unicode NFC (UAX #15), the normalizer Qwen and GLM tokenizer.json files
 * name ({"type": "NFC"}).
 *
 * Canonical decomposition (full, from tokenizer_nfc_data.c; Hangul algorithmically), then
 * canonical ordering of each run of non-starters by combining class (stable), then canonical
 * composition with the primary composites. The tables are Unicode 9.0, as in the crate
 * Hugging Face tokenizers normalizes with (see scripts/gen_unicode_nfc.py), so characters
 * assigned after 9.0 pass through as starters that never compose: exactly what HF does.
 *
 * Text is processed in chunks that end before a "safe" character (below U+0300, a CJK
 * ideograph or a Hangul syllable): such a character has combining class 0, and nothing
 * before it can reorder past it or compose with anything after it, so chunks are
 * independent and the scratch memory stays small for ordinary text.
 */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer_int.h"

#define S_BASE 0xAC00
#define L_BASE 0x1100
#define V_BASE 0x1161
#define T_BASE 0x11A7
#define L_COUNT 19
#define V_COUNT 21
#define T_COUNT 28
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)
#define CHUNK 4096 /* code points in a chunk before it may be cut */

static int ccc(long c)
{
	if (c < 0x300)
		return 0;
	size_t lo = 0, hi = tok_nfc_ccc_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uint32_t)c < tok_nfc_ccc[mid][0])
			hi = mid;
		else if ((uint32_t)c > tok_nfc_ccc[mid][1])
			lo = mid + 1;
		else
			return (int)tok_nfc_ccc[mid][2];
	}
	return 0;
}

/* The full canonical decomposition of c in tok_nfc_pool, or NULL. */
static const uint32_t *decomp(long c, size_t *n)
{
	size_t lo = 0, hi = tok_nfc_decomp_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uint32_t)c < tok_nfc_decomp[mid][0]) {
			hi = mid;
		} else if ((uint32_t)c > tok_nfc_decomp[mid][0]) {
			lo = mid + 1;
		} else {
			*n = tok_nfc_decomp[mid][2];
			return tok_nfc_pool + tok_nfc_decomp[mid][1];
		}
	}
	return NULL;
}

/* The primary composite of (a, b), or -1. */
static long compose(long a, long b)
{
	if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
		return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
	if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 &&
	    b > T_BASE && b < T_BASE + T_COUNT)
		return a + (b - T_BASE);
	if (a < 0 || b < 0)
		return -1;
	size_t lo = 0, hi = tok_nfc_comp_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const uint32_t *e = tok_nfc_comp[mid];
		if ((uint32_t)a < e[0] || ((uint32_t)a == e[0] && (uint32_t)b < e[1]))
			hi = mid;
		else if ((uint32_t)a > e[0] || (uint32_t)b > e[1])
			lo = mid + 1;
		else
			return e[2];
	}
	return -1;
}

static bool is_safe(long c)
{
	return (c >= 0 && c < 0x300) || (c >= 0x3400 && c <= 0x4DBF) ||
	       (c >= 0x4E00 && c <= 0x9FFF) || (c >= S_BASE && c < S_BASE + S_COUNT);
}

struct cpbuf {
	long *v;
	size_t n, cap;
};

static int cp_push(struct cpbuf *b, long c)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 1024;
		long *p = realloc(b->v, cap * sizeof *p);
		if (!p)
			return WK_ENOMEM;
		b->v = p;
		b->cap = cap;
	}
	b->v[b->n++] = c;
	return WK_OK;
}

static int decompose_into(struct cpbuf *b, long c)
{
	if (c >= S_BASE && c < S_BASE + S_COUNT) {
		long s = c - S_BASE;
		int rc = cp_push(b, L_BASE + s / N_COUNT);
		if (rc == WK_OK)
			rc = cp_push(b, V_BASE + (s % N_COUNT) / T_COUNT);
		if (rc == WK_OK && s % T_COUNT)
			rc = cp_push(b, T_BASE + s % T_COUNT);
		return rc;
	}
	size_t n;
	const uint32_t *d = c >= 0xC0 ? decomp(c, &n) : NULL;
	if (!d)
		return cp_push(b, c);
	for (size_t i = 0; i < n; i++)
		if (cp_push(b, (long)d[i]) != WK_OK)
			return WK_ENOMEM;
	return WK_OK;
}

/* Stable sort of v[0..n) by combining class: insertion sort for the short runs of real
 * text, a counting sort (classes are 1..254) for long ones, which only crafted input has. */
static int order_run(long *v, size_t n)
{
	if (n <= 32) {
		for (size_t i = 1; i < n; i++) {
			long x = v[i];
			int cx = ccc(x);
			size_t j = i;
			while (j > 0 && ccc(v[j - 1]) > cx) {
				v[j] = v[j - 1];
				j--;
			}
			v[j] = x;
		}
		return WK_OK;
	}
	size_t start[257] = {0};
	long *tmp = malloc(n * sizeof *tmp);
	if (!tmp)
		return WK_ENOMEM;
	for (size_t i = 0; i < n; i++)
		start[ccc(v[i]) + 1]++;
	for (int k = 1; k < 257; k++)
		start[k] += start[k - 1];
	for (size_t i = 0; i < n; i++)
		tmp[start[ccc(v[i])]++] = v[i];
	memcpy(v, tmp, n * sizeof *v);
	free(tmp);
	return WK_OK;
}

static int put_utf8(struct tok_buf *out, long c)
{
	unsigned char b[4];
	size_t n;
	if (c < 0) {
		b[0] = (unsigned char)(-1 - c); /* an invalid byte, passed through */
		n = 1;
	} else if (c < 0x80) {
		b[0] = (unsigned char)c;
		n = 1;
	} else if (c < 0x800) {
		b[0] = (unsigned char)(0xC0 | c >> 6);
		b[1] = (unsigned char)(0x80 | (c & 0x3F));
		n = 2;
	} else if (c < 0x10000) {
		b[0] = (unsigned char)(0xE0 | c >> 12);
		b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[2] = (unsigned char)(0x80 | (c & 0x3F));
		n = 3;
	} else {
		b[0] = (unsigned char)(0xF0 | c >> 18);
		b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
		b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[3] = (unsigned char)(0x80 | (c & 0x3F));
		n = 4;
	}
	return tok_buf_add(out, b, n);
}

/* Orders and composes the decomposed chunk b, then appends it to out as UTF-8. */
static int flush(struct cpbuf *b, struct tok_buf *out)
{
	long *v = b->v;
	size_t n = b->n;
	for (size_t i = 0; i < n;) {
		if (v[i] < 0 || ccc(v[i]) == 0) {
			i++;
			continue;
		}
		size_t j = i;
		while (j < n && v[j] >= 0 && ccc(v[j]) != 0)
			j++;
		if (order_run(v + i, j - i) != WK_OK)
			return WK_ENOMEM;
		i = j;
	}
	/* Composition in place: v[0..k) is the output so far, v[st] its last starter. */
	size_t k = 0;
	long st = -1;
	for (size_t i = 0; i < n; i++) {
		long c = v[i];
		int cc = c < 0 ? 0 : ccc(c);
		if (st >= 0 && c >= 0) {
			/* blocked unless adjacent to the starter, or the last kept character has a
			 * lower non-zero class (starters always become st, so ccc > 0 there) */
			bool adjacent = (size_t)st == k - 1;
			if (adjacent || ccc(v[k - 1]) < cc) {
				long x = compose(v[st], c);
				if (x >= 0) {
					v[st] = x;
					continue;
				}
			}
		}
		if (cc == 0)
			st = c < 0 ? -1 : (long)k;
		v[k++] = c;
	}
	for (size_t i = 0; i < k; i++)
		if (put_utf8(out, v[i]) != WK_OK)
			return WK_ENOMEM;
	b->n = 0;
	return WK_OK;
}

int tok_nfc(const char *s, size_t n, struct tok_buf *out)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0;
	/* Characters below U+0300 are all NFC and compose with nothing before them. */
	while (i < n && u[i] < 0xCC)
		i++;
	if (i == n)
		return tok_buf_add(out, s, n);
	/* Back up to the start of the character before the first one at or past U+0300, which
	 * it may compose with; everything before that is copied as it is. */
	size_t start = i;
	if (start > 0) {
		start--;
		while (start > 0 && (u[start] & 0xC0) == 0x80)
			start--;
	}
	if (tok_buf_add(out, s, start) != WK_OK)
		return WK_ENOMEM;
	struct cpbuf b = {0};
	int rc = WK_OK;
	for (i = start; i < n && rc == WK_OK;) {
		size_t len;
		long c = tok_utf8_decode(u + i, n - i, &len);
		if (b.n >= CHUNK && is_safe(c))
			rc = flush(&b, out);
		if (rc == WK_OK)
			rc = c < 0 ? cp_push(&b, c) : decompose_into(&b, c);
		i += len;
	}
	if (rc == WK_OK)
		rc = flush(&b, out);
	free(b.v);
	return rc;
}
