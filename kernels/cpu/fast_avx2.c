/*
 * fast_avx2.c - AVX2/FMA/F16C inner loops. Compiled with -mavx2 -mfma -mf16c; reached only
 * through fast.c and bandwidth.c after cpu_has_avx2().
 *
 * Matmul, one or two tokens (a decode step of one sequence): bound by reading the weights, so
 * the loops aim to keep the loads flowing: 4 rows at a time share each load of x, 16 columns
 * per step, two accumulators per row (8 independent FMA chains). Weights are widened to f32
 * in registers:
 *   bf16: a 256-bit load holds 16 values; unpacking its 16-bit words with zeros (lo, hi)
 *         puts each value in the top half of a 32-bit lane, which is its f32. The unpacks
 *         work within 128-bit lanes, so x is loaded as columns (0-3, 8-11) and (4-7, 12-15)
 *         to match (2 lane permutes per 16 columns, shared by the 4 rows).
 *   f16:  vcvtph2ps, 8 at a time.   f32: plain loads.
 * Three or more tokens (a batched step, a prompt): FMAs and the widening, not memory, limit,
 * so each weight is widened once and used for every token: blocks of 4 rows, 512 columns at
 * a time widened into an L1-resident f32 buffer (block4), x copied once per matmul in the
 * matching column order (cpu_pack_x_avx2), 3 tokens per pass over the buffer (12
 * accumulators), and the next chunk of weights prefetched meanwhile. On the 2-core test
 * machine this took eight sequences' decode step from 2.6x to about 2.0-2.2x the time of
 * one sequence's (`wick bench queue`).
 * Columns past the last multiple of 16 are done in scalar code.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/kv_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* x[c .. c+16) arranged to pair with load_w16's two halves. */
static ALWAYS_INLINE void load_x16(enum dt_type wt, const float *x, __m256 *x0, __m256 *x1)
{
	__m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
	if (wt == DT_BF16) {
		/* load_w16's unpacks work within 128-bit lanes: columns (0-3, 8-11), (4-7, 12-15) */
		*x0 = _mm256_permute2f128_ps(a, b, 0x20);
		*x1 = _mm256_permute2f128_ps(a, b, 0x31);
	} else {
		*x0 = a;
		*x1 = b;
	}
}

/* Weight columns [c, c+16) of one row as two f32 vectors. */
static ALWAYS_INLINE void load_w16(enum dt_type wt, const void *row, int c, __m256 *w0,
				   __m256 *w1)
{
	if (wt == DT_BF16) {
		__m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
		__m256i z = _mm256_setzero_si256();
		*w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
		*w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
	} else if (wt == DT_F16) {
		const uint16_t *p = (const uint16_t *)row + c;
		*w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
		*w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
	} else {
		const float *p = (const float *)row + c;
		*w0 = _mm256_loadu_ps(p);
		*w1 = _mm256_loadu_ps(p + 8);
	}
}

static ALWAYS_INLINE float w_scalar(enum dt_type wt, const void *row, int c)
{
	if (wt == DT_BF16)
		return dt_bf16_to_f32(((const uint16_t *)row)[c]);
	if (wt == DT_F16)
		return _cvtsh_ss(((const uint16_t *)row)[c]);
	return ((const float *)row)[c];
}

/* y[0..R) = dot(x, row r) for R consecutive rows starting at w (R = 1 or 4). */
static ALWAYS_INLINE void dot_rows(enum dt_type xt, enum dt_type wt, int R, float *y,
				   const float *x, const void *w, int cols, size_t esz)
{
	__m256 acc0[4], acc1[4];
	const void *row[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		acc0[r] = _mm256_setzero_ps();
		acc1[r] = _mm256_setzero_ps();
		row[r] = (const char *)w + (size_t)r * cols * esz;
	}
	int c = 0;
	for (; c + 16 <= cols; c += 16) {
		__m256 x0, x1;
		load_x16(xt, x + c, &x0, &x1);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			__m256 w0, w1;
			load_w16(wt, row[r], c, &w0, &w1);
			acc0[r] = _mm256_fmadd_ps(w0, x0, acc0[r]);
			acc1[r] = _mm256_fmadd_ps(w1, x1, acc1[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		float s = hsum(_mm256_add_ps(acc0[r], acc1[r]));
		for (int cc = c; cc < cols; cc++)
			s += x[cc] * w_scalar(wt, row[r], cc);
		y[r] = s;
	}
}

/* y[t][r] = dot(x[t], row r) for 4 rows and 2 tokens (x rows and y rows `cols` and `ystride`
 * apart): each converted weight vector feeds two FMAs, which roughly doubles the speed of a
 * batched prompt, where the weights come from cache and conversion is the bottleneck. */
static ALWAYS_INLINE void dot_rows_t2(enum dt_type xt, enum dt_type wt, float *y,
				      size_t ystride, const float *x, const void *w, int cols,
				      size_t esz)
{
	__m256 acc[4][2];
	const void *row[4];
#pragma GCC unroll 4
	for (int r = 0; r < 4; r++) {
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
		row[r] = (const char *)w + (size_t)r * cols * esz;
	}
	const float *xb = x + cols;
	int c = 0;
	for (; c + 16 <= cols; c += 16) {
		__m256 xa0, xa1, xb0, xb1;
		load_x16(xt, x + c, &xa0, &xa1);
		load_x16(xt, xb + c, &xb0, &xb1);
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			__m256 w0, w1;
			load_w16(wt, row[r], c, &w0, &w1);
			acc[r][0] = _mm256_fmadd_ps(w0, xa0, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(w0, xb0, acc[r][1]);
			acc[r][0] = _mm256_fmadd_ps(w1, xa1, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(w1, xb1, acc[r][1]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < 4; r++) {
		float sa = hsum(acc[r][0]), sb = hsum(acc[r][1]);
		for (int cc = c; cc < cols; cc++) {
			float wv = w_scalar(wt, row[r], cc);
			sa += x[cc] * wv;
			sb += xb[cc] * wv;
		}
		y[r] = sa;
		y[ystride + r] = sb;
	}
}

#define KC 512 /* columns per chunk: 4 rows of f32 weights, 8 KiB, stay in L1 */
#define TB 24  /* tokens per block4 call: x for a block of them stays in L2 */
#define WS (KC + 16) /* buf's row stride: rows 64 bytes off one another's L1 sets */

/* Weight columns [c, c+16) of one bf16/f16 row as two f32 vectors, in the order copy_x puts
 * x in. bf16: one 256-bit load holds 16 values, two to each 32-bit lane; shifting a lane
 * left by 16 gives its even column as f32, masking off the low half its odd one, so w0 holds
 * columns 0, 2, ..., 14 and w1 columns 1, 3, ..., 15 (no zero register needed, which the
 * converting kernel cannot spare). f16: vcvtph2ps, in natural order. */
static ALWAYS_INLINE void widen16(enum dt_type wt, const uint16_t *row, int c, __m256i hi,
				  __m256 *w0, __m256 *w1)
{
	if (wt == DT_BF16) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(row + c));
		*w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
		*w1 = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
	} else {
		*w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + c)));
		*w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + c + 8)));
	}
}

/* Converts columns [c0, c0 + kc) of 4 rows of bf16/f16 weights (`cols` apart) to f32 in
 * buf [4][WS], 16 columns at a time in widen16's order; kc is a multiple of 16. (Widening in
 * natural order, vpmovzxwd + shift, cost twice as much here.) */
static ALWAYS_INLINE void convert_chunk4(enum dt_type wt, float *buf, const void *w, int cols,
					 int c0, int kc)
{
	__m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
#pragma GCC unroll 4
	for (int r = 0; r < 4; r++) {
		const uint16_t *row = (const uint16_t *)w + (size_t)r * cols + c0;
		float *o = buf + r * WS;
		for (int c = 0; c < kc; c += 16) {
			__m256 w0, w1;
			widen16(wt, row, c, hi, &w0, &w1);
			_mm256_store_ps(o + c, w0);
			_mm256_store_ps(o + c + 8, w1);
		}
	}
}

/* x [n][cols] into xp [n][xs] (64-byte aligned rows), each 16 columns in widen16's order;
 * a dot product does not mind the order, as long as x and w agree. */
static ALWAYS_INLINE void copy_x(enum dt_type wt, float *xp, size_t xs, const float *x, int n,
				 int cols)
{
	for (int t = 0; t < n; t++) {
		const float *s = x + (size_t)t * cols;
		float *d = xp + (size_t)t * xs;
		int c = 0;
		for (; wt == DT_BF16 && c + 16 <= cols; c += 16) {
			__m256 a = _mm256_loadu_ps(s + c), b = _mm256_loadu_ps(s + c + 8);
			/* per lane (a0 a2 b0 b2 | a4 a6 b4 b6), then the 64-bit pairs put in order */
			__m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
			__m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
			ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
			od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8));
			_mm256_store_ps(d + c, ev);
			_mm256_store_ps(d + c + 8, od);
		}
		memcpy(d + c, s + c, (size_t)(cols - c) * 4);
	}
}

/* acc[t][r] += x[t][0..kc) * w[r][0..kc) as 8-lane partial sums, for 4 rows of f32 weights
 * (buf [4][WS]) and T = 1..3 tokens (`xs` apart): 12 accumulators, 3 x vectors and one
 * weight vector fill the 16 ymm registers, so each weight load feeds T FMAs and each x load
 * feeds 4, and the loop is bound by FMAs (unrolled twice: 95% of peak here for T = 2 against
 * 79% without). With pf, also prefetches 2 rows of the next chunk (kc / 4 bytes of each). */
static ALWAYS_INLINE void kernel4(int T, __m256 *acc, const float *x, size_t xs,
				  const float *w, int kc, const char *pf0, const char *pf1)
{
	__m256 a[3][4];
#pragma GCC unroll 3
	for (int t = 0; t < T; t++)
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			a[t][r] = acc[t * 4 + r];
#pragma GCC unroll 2
	for (int c = 0; c < kc; c += 8) {
		__m256 xv[3];
		if (pf0 && !(c & 31)) {
			_mm_prefetch(pf0 + c * 2, _MM_HINT_T0);
			_mm_prefetch(pf1 + c * 2, _MM_HINT_T0);
		}
#pragma GCC unroll 3
		for (int t = 0; t < T; t++)
			xv[t] = _mm256_loadu_ps(x + (size_t)t * xs + c);
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			__m256 wv = _mm256_load_ps(w + r * WS + c);
#pragma GCC unroll 3
			for (int t = 0; t < T; t++)
				a[t][r] = _mm256_fmadd_ps(wv, xv[t], a[t][r]);
		}
	}
#pragma GCC unroll 3
	for (int t = 0; t < T; t++)
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			acc[t * 4 + r] = a[t][r];
}

/* kernel4 for T = 1 or 2 tokens that reads the bf16/f16 weights themselves (4 rows `cols`
 * apart, from column c0) and leaves them converted in buf for the other tokens: the
 * conversion's loads, unpacks and stores then fill slots the FMAs leave free, instead of
 * taking a pass of their own (8 accumulators, 4 x vectors, the mask and 2 for the weights
 * fit the 16 registers; 3 tokens would not). Prefetches the 4 rows of the next chunk from pf[]. */
static ALWAYS_INLINE void kernel4_convert(int T, enum dt_type wt, __m256 *acc, const float *x,
					  size_t xs, const void *w, int cols, int c0, int kc,
					  float *buf, const char *const *pf)
{
	__m256 a[2][4];
	const uint16_t *row[4];
	__m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
#pragma GCC unroll 4
	for (int r = 0; r < 4; r++) {
		row[r] = (const uint16_t *)w + (size_t)r * cols + c0;
#pragma GCC unroll 2
		for (int t = 0; t < T; t++)
			a[t][r] = acc[t * 4 + r];
	}
	for (int c = 0; c < kc; c += 16) {
		__m256 x0[2], x1[2];
		if (!(c & 31))
#pragma GCC unroll 4
			for (int r = 0; r < 4; r++)
				_mm_prefetch(pf[r] + c * 2, _MM_HINT_T0);
#pragma GCC unroll 2
		for (int t = 0; t < T; t++) {
			x0[t] = _mm256_loadu_ps(x + (size_t)t * xs + c);
			x1[t] = _mm256_loadu_ps(x + (size_t)t * xs + c + 8);
		}
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			__m256 w0, w1;
			widen16(wt, row[r], c, hi, &w0, &w1);
			_mm256_store_ps(buf + r * WS + c, w0);
			_mm256_store_ps(buf + r * WS + c + 8, w1);
#pragma GCC unroll 2
			for (int t = 0; t < T; t++) {
				a[t][r] = _mm256_fmadd_ps(w0, x0[t], a[t][r]);
				a[t][r] = _mm256_fmadd_ps(w1, x1[t], a[t][r]);
			}
		}
	}
#pragma GCC unroll 2
	for (int t = 0; t < T; t++)
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			acc[t * 4 + r] = a[t][r];
}

/* y for 4 rows starting at w and all n tokens, bf16/f16 weights: the columns go by in
 * chunks of KC, each chunk of the 4 rows converted to f32 once into an L1-resident buffer
 * that every token then reads, while the next chunk is prefetched. The first n % 3 tokens
 * convert as they go (kernel4_convert), the rest go 3 at a time. The partial sums stay
 * vectors in acc [n][4] until the last chunk. */
static ALWAYS_INLINE void block4(enum dt_type wt, float *y, int rows, const float *x,
				 size_t xs, __m256 *acc, const void *w, int cols, int r, int n)
{
	float buf[4 * WS] __attribute__((aligned(32)));
	int c16 = cols & ~15, rem = n % 3;
	for (int i = 0; i < n * 4; i++)
		acc[i] = _mm256_setzero_ps();
	for (int c0 = 0; c0 < c16; c0 += KC) {
		int kc = c16 - c0 < KC ? c16 - c0 : KC;
		/* the next chunk (after the last, the next block's first); prefetches past the
		 * end of the weights never fault */
		const char *pf[4];
		for (int i = 0; i < 4; i++)
			pf[i] = (const char *)((const uint16_t *)w +
					       (c0 + KC < c16 ? (size_t)i * cols + c0 + KC
							     : (size_t)(4 + i) * cols));
		if (rem == 2)
			kernel4_convert(2, wt, acc, x + c0, xs, w, cols, c0, kc, buf, pf);
		else if (rem == 1)
			kernel4_convert(1, wt, acc, x + c0, xs, w, cols, c0, kc, buf, pf);
		else
			convert_chunk4(wt, buf, w, cols, c0, kc);
		for (int t = rem, g = 0; t + 3 <= n; t += 3, g++) {
			bool p = !rem && g < 2; /* rows 2g, 2g + 1 of the next chunk */
			kernel4(3, acc + t * 4, x + (size_t)t * xs + c0, xs, buf, kc,
				p ? pf[2 * g] : NULL, p ? pf[2 * g + 1] : NULL);
		}
	}
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * xs;
		for (int i = 0; i < 4; i++) {
			float sum = hsum(acc[t * 4 + i]);
			const void *row = (const uint16_t *)w + (size_t)i * cols;
			for (int c = c16; c < cols; c++)
				sum += xt[c] * w_scalar(wt, row, c);
			y[(size_t)t * rows + r + i] = sum;
		}
	}
}

/* y[t][r] for rows [r0, r1) and n tokens. One or two tokens read the weights straight from
 * memory (that step is bound by memory). With xp (x packed by cpu_pack_x_avx2, for three or
 * more tokens and bf16/f16 weights) blocks of 4 rows go through block4, each block's weights
 * read from memory and converted once for all the tokens, since conversion and FMAs, not
 * memory, then limit; TB tokens at a time, so that their x stays in L2. */
static ALWAYS_INLINE void matmul_rows(enum dt_type wt, float *y, const float *x,
				      const float *xp, size_t xs, const void *w, int n, int rows,
				      int cols, int r0, int r1)
{
	size_t esz = wt == DT_F32 ? 4 : 2;
	int r = r0;
	if (xp && wt != DT_F32) {
		__m256 acc[TB * 4];
		for (; r + 4 <= r1; r += 4)
			for (int t0 = 0; t0 < n; t0 += TB)
				block4(wt, y + (size_t)t0 * rows, rows, xp + (size_t)t0 * xs, xs, acc,
				       (const char *)w + (size_t)r * cols * esz, cols, r,
				       n - t0 < TB ? n - t0 : TB);
	}
	for (; r + 4 <= r1; r += 4) {
		const void *wr = (const char *)w + (size_t)r * cols * esz;
		int t = 0;
		for (; t + 2 <= n; t += 2)
			dot_rows_t2(wt, wt, y + (size_t)t * rows + r, (size_t)rows,
				    x + (size_t)t * cols, wr, cols, esz);
		for (; t < n; t++) {
			float out[4];
			dot_rows(wt, wt, 4, out, x + (size_t)t * cols, wr, cols, esz);
			float *yt = y + (size_t)t * rows + r;
			yt[0] = out[0];
			yt[1] = out[1];
			yt[2] = out[2];
			yt[3] = out[3];
		}
	}
	for (; r < r1; r++) {
		const void *wr = (const char *)w + (size_t)r * cols * esz;
		for (int t = 0; t < n; t++)
			dot_rows(wt, wt, 1, y + (size_t)t * rows + r, x + (size_t)t * cols, wr, cols,
				 esz);
	}
}

float *cpu_pack_x_avx2(const float *x, enum dt_type wt, int n, int cols, size_t *xs)
{
	if (wt == DT_F32 || n < 3)
		return NULL;
	/* rows a multiple of 64 bytes, plus 64, so that the tokens' vectors for one column do
	 * not all fall in one L1 set (rows of 2^k floats would) */
	*xs = (((size_t)cols + 15) & ~(size_t)15) + 16;
	float *xp = aligned_alloc(64, (size_t)n * *xs * sizeof *xp);
	if (xp)
		copy_x(wt, xp, *xs, x, n, cols);
	return xp;
}

void cpu_matmul_rows_avx2(float *y, const float *x, const float *xp, size_t xs, const void *w,
			  enum dt_type wt, int n, int rows, int cols, int r0, int r1)
{
	switch (wt) {
	case DT_BF16: matmul_rows(DT_BF16, y, x, xp, xs, w, n, rows, cols, r0, r1); break;
	case DT_F16: matmul_rows(DT_F16, y, x, xp, xs, w, n, rows, cols, r0, r1); break;
	default: matmul_rows(DT_F32, y, x, NULL, 0, w, n, rows, cols, r0, r1); break;
	}
}

/* ---- attention --------------------------------------------------------------------------- */

/* q . position t's head row (at element at); FP8 block by block, ks the scales at position 0
 * and ss their stride a position */
static ALWAYS_INLINE float head_dot(const float *q, const void *k, enum dt_type kv,
				   const float *ks, size_t ss, int t, size_t at, int head_dim)
{
	if (kv == DT_F8_E4M3)
		return kv8_dot(q, (const uint8_t *)k + at, ks + (size_t)t * ss, head_dim);
	return kv_dot(q, k, kv, at, head_dim);
}

/* out = out * f + p * position t's head row of v, as head_dot reads it */
static ALWAYS_INLINE void head_axpy(float *out, float f, float p, const void *v, enum dt_type kv,
				    const float *vs, size_t ss, int t, size_t at, int head_dim)
{
	if (kv == DT_F8_E4M3)
		kv8_scale_axpy(out, f, p, (const uint8_t *)v + at, vs + (size_t)t * ss, head_dim);
	else
		kv_scale_axpy(out, f, p, v, kv, at, head_dim);
}

/* The same online softmax as fast.c's attention_head_scalar, with vector dots and axpys;
 * kv a constant in each caller below, so the loops are specialised per cache type. */
static ALWAYS_INLINE void attention_head(float *out, const float *q, const void *k,
					 const void *v, const float *ks, const float *vs,
					 size_t ss, enum dt_type kv, int len, int head_dim,
					 int kv_stride, float scale)
{
	float s[CPU_ATTN_CHUNK];
	float max = -INFINITY, sum = 0.0f;
	for (int d = 0; d < head_dim; d++)
		out[d] = 0.0f;
	for (int t0 = 0; t0 < len; t0 += CPU_ATTN_CHUNK) {
		int m = len - t0 < CPU_ATTN_CHUNK ? len - t0 : CPU_ATTN_CHUNK;
		float cmax = -INFINITY;
		for (int t = 0; t < m; t++) {
			s[t] = head_dot(q, k, kv, ks, ss, t0 + t, (size_t)(t0 + t) * kv_stride,
					head_dim) *
			       scale;
			if (s[t] > cmax)
				cmax = s[t];
		}
		float f = 1.0f;
		if (cmax > max) {
			f = expf(max - cmax); /* 0 on the first chunk */
			sum *= f;
			max = cmax;
		}
		for (int t = 0; t < m; t++) {
			float pr = expf(s[t] - max);
			sum += pr;
			head_axpy(out, t == 0 ? f : 1.0f, pr, v, kv, vs, ss, t0 + t,
				  (size_t)(t0 + t) * kv_stride, head_dim);
		}
	}
	float inv = 1.0f / sum;
	kv_scale_axpy(out, inv, 0.0f, out, DT_F32, 0, head_dim);
}

void cpu_attention_head_avx2(float *out, const float *q, const void *k, const void *v,
			     const float *ks, const float *vs, size_t ss, enum dt_type kv, int len,
			     int head_dim, int kv_stride, float scale)
{
	if (kv == DT_F8_E4M3)
		attention_head(out, q, k, v, ks, vs, ss, DT_F8_E4M3, len, head_dim, kv_stride,
			       scale);
	else if (kv == DT_BF16)
		attention_head(out, q, k, v, NULL, NULL, 0, DT_BF16, len, head_dim, kv_stride,
			       scale);
	else
		attention_head(out, q, k, v, NULL, NULL, 0, DT_F32, len, head_dim, kv_stride,
			       scale);
}

/* ---- bandwidth --------------------------------------------------------------------------- */

uint64_t cpu_stream_sum_avx2(const void *buf, size_t bytes)
{
	const __m256i *p = buf;
	size_t nvec = bytes / 32;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
		a6 = a0, a7 = a0;
	for (size_t i = 0; i + 8 <= nvec; i += 8) {
		a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i + 0));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 2));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 3));
		a4 = _mm256_add_epi64(a4, _mm256_load_si256(p + i + 4));
		a5 = _mm256_add_epi64(a5, _mm256_load_si256(p + i + 5));
		a6 = _mm256_add_epi64(a6, _mm256_load_si256(p + i + 6));
		a7 = _mm256_add_epi64(a7, _mm256_load_si256(p + i + 7));
	}
	__m256i s = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1),
						      _mm256_add_epi64(a2, a3)),
				     _mm256_add_epi64(_mm256_add_epi64(a4, a5),
						      _mm256_add_epi64(a6, a7)));
	uint64_t lanes[4];
	_mm256_storeu_si256((__m256i *)lanes, s);
	return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
