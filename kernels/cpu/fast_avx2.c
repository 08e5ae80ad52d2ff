/*
 * fast_avx2.c - AVX2/FMA/F16C inner loops. Compiled with -mavx2 -mfma -mf16c; reached only
 * through fast.c and bandwidth.c after cpu_has_avx2().
 *
 * Matmul: a decode step is bound by reading the weights, so the loops aim to keep the loads
 * flowing: 4 rows at a time share each load of x, 16 columns per step, two accumulators per
 * row (8 independent FMA chains). Weights are widened to f32 in registers:
 *   bf16: a 256-bit load holds 16 values; unpacking its 16-bit words with zeros (lo, hi)
 *         puts each value in the top half of a 32-bit lane, which is its f32. The unpacks
 *         work within 128-bit lanes, so x is loaded as columns (0-3, 8-11) and (4-7, 12-15)
 *         to match (2 lane permutes per 16 columns, shared by the 4 rows). This measured a
 *         little faster here than shift+and or vpmovzxwd+shift.
 *   f16:  vcvtph2ps, 8 at a time.   f32: plain loads.
 * Columns past the last multiple of 16 are done in scalar code.
 */
#include <immintrin.h>
#include <string.h>
#include <math.h>

#include "kernels/cpu/cpu_int.h"

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

#define CONV_MAX_COLS 16384 /* 4 rows of f32 on the stack: 256 KiB */

/* Converts 4 rows of bf16/f16 weights to f32 in buf [4][cols], in natural column order. */
static ALWAYS_INLINE void convert_rows4(enum dt_type wt, float *buf, const void *w, int cols,
					size_t esz)
{
	for (int r = 0; r < 4; r++) {
		const uint16_t *row = (const uint16_t *)((const char *)w + (size_t)r * cols * esz);
		float *o = buf + (size_t)r * cols;
		int c = 0;
		for (; c + 8 <= cols; c += 8) {
			__m128i v = _mm_loadu_si128((const __m128i *)(row + c));
			__m256 f = wt == DT_BF16
					   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
					   : _mm256_cvtph_ps(v);
			_mm256_storeu_ps(o + c, f);
		}
		for (; c < cols; c++)
			o[c] = w_scalar(wt, row, c);
	}
}

/* y[t][r] for 4 rows of f32 weights (w [4][cols]) and T tokens (T = 1..3): 12 accumulators,
 * 3 x vectors and one weight vector fit the 16 ymm registers, so each weight load feeds T
 * FMAs and each x load feeds 4: the step is bound by FMAs, not loads. */
static ALWAYS_INLINE void dot4_f32(int T, float *y, size_t ystride, const float *x,
				   const float *w, int cols)
{
	__m256 acc[3][4];
#pragma GCC unroll 3
	for (int t = 0; t < 3; t++)
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			acc[t][r] = _mm256_setzero_ps();
	int c = 0;
	for (; c + 8 <= cols; c += 8) {
		__m256 xv[3];
#pragma GCC unroll 3
		for (int t = 0; t < T; t++)
			xv[t] = _mm256_loadu_ps(x + (size_t)t * cols + c);
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			__m256 wv = _mm256_loadu_ps(w + (size_t)r * cols + c);
#pragma GCC unroll 3
			for (int t = 0; t < T; t++)
				acc[t][r] = _mm256_fmadd_ps(wv, xv[t], acc[t][r]);
		}
	}
#pragma GCC unroll 3
	for (int t = 0; t < T; t++)
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			float sum = hsum(acc[t][r]);
			for (int cc = c; cc < cols; cc++)
				sum += x[(size_t)t * cols + cc] * w[(size_t)r * cols + cc];
			y[(size_t)t * ystride + r] = sum;
		}
}

/* Row blocks outermost and tokens inside, so each block of weights is read from memory once
 * and then from cache for the other tokens of a batched prompt. With 3 or more tokens a block
 * of bf16/f16 rows is converted to f32 once and every token reads the converted copy, since
 * conversion, not memory, is then what limits a batched step. */
static ALWAYS_INLINE void matmul_rows(enum dt_type wt, float *y, const float *x, const void *w,
				      int n, int rows, int cols, int r0, int r1)
{
	size_t esz = wt == DT_F32 ? 4 : 2;
	int r = r0;
	if (wt != DT_F32 && n >= 3 && cols <= CONV_MAX_COLS) {
		float buf[4 * CONV_MAX_COLS] __attribute__((aligned(32)));
		for (; r + 4 <= r1; r += 4) {
			convert_rows4(wt, buf, (const char *)w + (size_t)r * cols * esz, cols, esz);
			int t = 0;
			for (; t + 3 <= n; t += 3)
				dot4_f32(3, y + (size_t)t * rows + r, (size_t)rows, x + (size_t)t * cols,
					 buf, cols);
			if (n - t == 2)
				dot4_f32(2, y + (size_t)t * rows + r, (size_t)rows, x + (size_t)t * cols,
					 buf, cols);
			else if (n - t == 1)
				dot4_f32(1, y + (size_t)t * rows + r, (size_t)rows, x + (size_t)t * cols,
					 buf, cols);
		}
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

void cpu_matmul_rows_avx2(float *y, const float *x, const void *w, enum dt_type wt, int n,
			  int rows, int cols, int r0, int r1)
{
	switch (wt) {
	case DT_BF16: matmul_rows(DT_BF16, y, x, w, n, rows, cols, r0, r1); break;
	case DT_F16: matmul_rows(DT_F16, y, x, w, n, rows, cols, r0, r1); break;
	default: matmul_rows(DT_F32, y, x, w, n, rows, cols, r0, r1); break;
	}
}

/* ---- attention --------------------------------------------------------------------------- */

static ALWAYS_INLINE float dot_f32(const float *a, const float *b, int n)
{
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
	}
	for (; i + 8 <= n; i += 8)
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
	float s = hsum(_mm256_add_ps(acc0, acc1));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* y = y * f + p * v */
static ALWAYS_INLINE void scale_axpy(float *y, float f, float p, const float *v, int n)
{
	__m256 vf = _mm256_set1_ps(f), vp = _mm256_set1_ps(p);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i),
							_mm256_mul_ps(vf, _mm256_loadu_ps(y + i))));
	for (; i < n; i++)
		y[i] = y[i] * f + p * v[i];
}

/* The same online softmax as fast.c's attention_head_scalar, with vector dots and axpys. */
void cpu_attention_head_avx2(float *out, const float *q, const float *k, const float *v,
			     int len, int head_dim, int kv_stride, float scale)
{
	float s[CPU_ATTN_CHUNK];
	float max = -INFINITY, sum = 0.0f;
	for (int d = 0; d < head_dim; d++)
		out[d] = 0.0f;
	for (int t0 = 0; t0 < len; t0 += CPU_ATTN_CHUNK) {
		int m = len - t0 < CPU_ATTN_CHUNK ? len - t0 : CPU_ATTN_CHUNK;
		float cmax = -INFINITY;
		for (int t = 0; t < m; t++) {
			s[t] = dot_f32(q, k + (size_t)(t0 + t) * kv_stride, head_dim) * scale;
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
			scale_axpy(out, t == 0 ? f : 1.0f, pr, v + (size_t)(t0 + t) * kv_stride,
				   head_dim);
		}
	}
	float inv = 1.0f / sum;
	scale_axpy(out, inv, 0.0f, out, head_dim);
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
