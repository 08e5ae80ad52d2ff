/*
 * fp8_avx2.c - AVX2/FMA/F16C inner loops of the FP8 block-scaled matmul. Compiled with
 * -mavx2 -mfma -mf16c; reached only through fp8.c after cpu_has_avx2().
 *
 * Decoding e4m3fn through f16. A code s eeee mmm, shifted left by 7 inside a 16-bit word,
 * is the f16 s 0eeee mmm0000000: the same number scaled by 2^(7-15) = 2^-8, because f16 has
 * the same mantissa layout and an exponent bias of 15 instead of 7. That holds for the
 * subnormals too (eeee = 0 is an f16 subnormal of the same mantissa), and vcvtph2ps turns
 * f16 subnormals into normal f32 exactly, in hardware and regardless of MXCSR.DAZ. So per
 * 16 codes: vpmovsxbw (sign-extend to words), vpsllw 7, vpand 0xbfff (clears the copy of
 * the sign that the extension left in bit 14), two vcvtph2ps. The 2^8 goes into the block
 * scale, which is applied once per 128-column block per row. The NaN codes 0x7f/0xff come
 * out as +-480 (f16 0x3f80 * 2^8); real weights never hold them.
 *
 * Alternatives, timed with `fp8_bench --variants` (tests/tools/fp8_bench.c) on the 2-core
 * AMD EPYC (Zen 3) this was written on, n = 1, one thread, weights in L2, random codes:
 *   f16 (this file)                                          ~10 GB/s of weights
 *   f32 bit trick: code << 20, sign to bit 31, x 2^120       ~7-8 GB/s: exact only without
 *     DAZ, and the subnormal codes become f32 denormals, which cost microcode assists
 *   256-entry f32 table with vpgatherdd                      ~1.7 GB/s (gathers are slow)
 *   exponent rebias in bf16 words, integer ops only          ~12-13 GB/s, but WRONG for
 *     zero and subnormal codes: the ceiling of any exact integer-only scheme, which needs
 *     extra work for those codes (a vpshufb-table version of it, exact, ran at ~9 GB/s)
 * The f16 loop seems bound by vcvtph2ps (the same loop without it ran ~40% faster); it
 * still decodes about one core's share of the memory bandwidth (~10 GB/s of ~20 with two
 * threads), so a decode step is limited by memory more than by the conversion.
 *
 * n <= FUSED_MAX_N (decode, and an MoE expert's few tokens of a prompt): 4 rows share each
 * load of x; the decoded weights go straight into FMAs, for one or two tokens at a time
 * (per-block accumulators, then acc += block * scale), with the group of rows 24 KiB ahead
 * prefetched.
 * n > FUSED_MAX_N (prefill): each 4-row x 1024-column tile is decoded once, scaled, into a
 * 16 KiB buffer in L1, and every token's dot products (two tokens at a time) are taken
 * against it, so the decode cost is paid once per weight and not once per token.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fp8_int.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define BLK CPU_FP8_BLOCK
/* How far ahead the kernels prefetch weights. The hardware prefetchers alone left a decode
 * step at ~0.5 of the read bandwidth here (worse for short rows, whose 4 streams restart
 * every row); prefetching the group of rows ~24 KiB ahead, block for block, raised it to
 * ~0.6-0.75 (tests/tools/fp8_bench.c; 16-64 KiB all did about as well). The prefetches go
 * to L2 (T1), which did a little better than T0: x (24 KiB at 6144 columns) stays in L1. */
#define PREFETCH_BYTES (24 << 10)
/* Up to this many tokens, decode in registers for each pair of tokens (dot_rows_t2); past
 * it, decode each tile once into L1 for all of them (tile_rows). Measured one thread, in
 * L2, 6144 columns: fused ~33 GFLOP/s at n = 2 (tile ~15-20), the two about even at 3-8
 * (25-33), tile ahead from 16 (33-45 against 30). */
#define FUSED_MAX_N 4

static ALWAYS_INLINE float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* The four horizontal sums {sum a, sum b, sum c, sum d}. */
static ALWAYS_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
	__m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
	return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* The 16 codes at p as f32 values times 2^-8: columns 0-7 in *lo, 8-15 in *hi. */
static ALWAYS_INLINE void decode16(const uint8_t *p, __m256 *lo, __m256 *hi)
{
	__m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
	v = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xbfff));
	*lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
	*hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

/* decode16 of the len < 16 codes at p, zero padded (code 0 is +0). */
static ALWAYS_INLINE void decode16_tail(const uint8_t *p, int len, __m256 *lo, __m256 *hi)
{
	uint8_t b[16] = {0};
	memcpy(b, p, (size_t)len);
	decode16(b, lo, hi);
}

void cpu_fp8_decode_avx2(float *dst, const uint8_t *src, size_t n)
{
	const __m256 k = _mm256_set1_ps(256.0f);
	size_t i = 0;
	for (; i < n; i += 16) {
		__m256 lo, hi;
		float out[16];
		if (n - i >= 16)
			decode16(src + i, &lo, &hi);
		else
			decode16_tail(src + i, (int)(n - i), &lo, &hi);
		_mm256_storeu_ps(out, _mm256_mul_ps(lo, k));
		_mm256_storeu_ps(out + 8, _mm256_mul_ps(hi, k));
		memcpy(dst + i, out, (n - i >= 16 ? 16 : n - i) * sizeof *dst);
	}
}

/* ---- n = 1: decode fused into the dot product -------------------------------------------- */

/* y[0..R) = dot(x, dequant(row r)) for R = 1 or 4 consecutive rows at w, all in the scale
 * row srow (the caller keeps a group of 4 inside one 128-row block). pf, when not NULL, is
 * a later group of R rows (same cols) to prefetch, block for block. */
static ALWAYS_INLINE void dot_rows(int R, float *y, const float *x, const uint8_t *w,
				   const float *srow, int cols, const uint8_t *pf)
{
	__m256 acc[4];
	const uint8_t *row[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		acc[r] = _mm256_setzero_ps();
		row[r] = w + (size_t)r * cols;
	}
	for (int c0 = 0, b = 0; c0 < cols; c0 += BLK, b++) {
		int c1 = c0 + BLK < cols ? c0 + BLK : cols;
		__m256 b0[4], b1[4];
		if (pf) {
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				const char *q = (const char *)pf + (size_t)r * cols + c0;
				_mm_prefetch(q, _MM_HINT_T1);
				if (c1 - c0 > 64)
					_mm_prefetch(q + 64, _MM_HINT_T1);
			}
		}
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			b0[r] = b1[r] = _mm256_setzero_ps();
		int c = c0;
		for (; c + 16 <= c1; c += 16) {
			__m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				__m256 w0, w1;
				decode16(row[r] + c, &w0, &w1);
				b0[r] = _mm256_fmadd_ps(w0, x0, b0[r]);
				b1[r] = _mm256_fmadd_ps(w1, x1, b1[r]);
			}
		}
		if (c < c1) { /* the last block's columns past a multiple of 16, zero padded */
			float xt[16] = {0};
			memcpy(xt, x + c, (size_t)(c1 - c) * sizeof *xt);
			__m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				__m256 w0, w1;
				decode16_tail(row[r] + c, c1 - c, &w0, &w1);
				b0[r] = _mm256_fmadd_ps(w0, x0, b0[r]);
				b1[r] = _mm256_fmadd_ps(w1, x1, b1[r]);
			}
		}
		__m256 s = _mm256_set1_ps(srow[b] * 256.0f);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			acc[r] = _mm256_fmadd_ps(_mm256_add_ps(b0[r], b1[r]), s, acc[r]);
	}
	if (R == 4) {
		_mm_storeu_ps(y, hsum4(acc[0], acc[1], acc[2], acc[3]));
	} else {
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			y[r] = hsum(acc[r]);
	}
}

/* dot_rows for two tokens (x rows and y rows `cols` and `ystride` apart): each decoded
 * weight vector feeds two FMAs. The loop is bound by the conversion, so the second token
 * costs little: small batches (an MoE expert's share of a prompt) run at about the
 * speed of one token. */
static ALWAYS_INLINE void dot_rows_t2(int R, float *y, size_t ystride, const float *x,
				      const uint8_t *w, const float *srow, int cols,
				      const uint8_t *pf)
{
	__m256 acc[4][2];
	const uint8_t *row[4];
	const float *xb = x + cols;
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
		row[r] = w + (size_t)r * cols;
	}
	for (int c0 = 0, b = 0; c0 < cols; c0 += BLK, b++) {
		int c1 = c0 + BLK < cols ? c0 + BLK : cols;
		__m256 ba[4], bb[4];
		if (pf) {
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				const char *q = (const char *)pf + (size_t)r * cols + c0;
				_mm_prefetch(q, _MM_HINT_T1);
				if (c1 - c0 > 64)
					_mm_prefetch(q + 64, _MM_HINT_T1);
			}
		}
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			ba[r] = bb[r] = _mm256_setzero_ps();
		int c = c0;
		for (; c + 16 <= c1; c += 16) {
			__m256 xa0 = _mm256_loadu_ps(x + c), xa1 = _mm256_loadu_ps(x + c + 8);
			__m256 xb0 = _mm256_loadu_ps(xb + c), xb1 = _mm256_loadu_ps(xb + c + 8);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				__m256 w0, w1;
				decode16(row[r] + c, &w0, &w1);
				ba[r] = _mm256_fmadd_ps(w0, xa0, ba[r]);
				bb[r] = _mm256_fmadd_ps(w0, xb0, bb[r]);
				ba[r] = _mm256_fmadd_ps(w1, xa1, ba[r]);
				bb[r] = _mm256_fmadd_ps(w1, xb1, bb[r]);
			}
		}
		if (c < c1) {
			float xta[16] = {0}, xtb[16] = {0};
			memcpy(xta, x + c, (size_t)(c1 - c) * sizeof *xta);
			memcpy(xtb, xb + c, (size_t)(c1 - c) * sizeof *xtb);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				__m256 w0, w1;
				decode16_tail(row[r] + c, c1 - c, &w0, &w1);
				ba[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xta), ba[r]);
				bb[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xtb), bb[r]);
				ba[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xta + 8), ba[r]);
				bb[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xtb + 8), bb[r]);
			}
		}
		__m256 s = _mm256_set1_ps(srow[b] * 256.0f);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			acc[r][0] = _mm256_fmadd_ps(ba[r], s, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(bb[r], s, acc[r][1]);
		}
	}
	if (R == 4) {
		_mm_storeu_ps(y, hsum4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]));
		_mm_storeu_ps(y + ystride, hsum4(acc[0][1], acc[1][1], acc[2][1], acc[3][1]));
	} else {
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			y[r] = hsum(acc[r][0]);
			y[ystride + r] = hsum(acc[r][1]);
		}
	}
}

/* ---- n > 1: decode a tile once, use it for every token ----------------------------------- */

#define CHUNK 1024 /* columns per tile: 4 rows x 1024 f32 = 16 KiB, half of L1 */

/* buf[r][0 .. len rounded up to 16) = dequantized weights of rows r < R, columns
 * [c0, c0 + len) (c0 a multiple of 128), block scales applied, zero padded. pf as in
 * dot_rows. */
static ALWAYS_INLINE void decode_tile(int R, float (*buf)[CHUNK], const uint8_t *w,
				      const float *srow, int cols, int c0, int len,
				      const uint8_t *pf)
{
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		const uint8_t *p = w + (size_t)r * cols + c0;
		if (pf)
			for (int c = 0; c < len; c += 64)
				_mm_prefetch((const char *)pf + (size_t)r * cols + c0 + c, _MM_HINT_T1);
		for (int b0 = 0; b0 < len; b0 += BLK) {
			int b1 = b0 + BLK < len ? b0 + BLK : len;
			__m256 s = _mm256_set1_ps(srow[(c0 + b0) / BLK] * 256.0f);
			for (int c = b0; c < b1; c += 16) {
				__m256 w0, w1;
				if (b1 - c >= 16)
					decode16(p + c, &w0, &w1);
				else
					decode16_tail(p + c, b1 - c, &w0, &w1);
				_mm256_store_ps(buf[r] + c, _mm256_mul_ps(w0, s));
				_mm256_store_ps(buf[r] + c + 8, _mm256_mul_ps(w1, s));
			}
		}
	}
}

/* y[0..R) += x[0..len) . buf[r][0..len) for one token; two accumulators per row. */
static ALWAYS_INLINE void tile_dot1(int R, float *y, const float *x, float (*buf)[CHUNK],
				    int len)
{
	__m256 a0[4], a1[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		a0[r] = a1[r] = _mm256_setzero_ps();
	int c = 0;
	for (; c + 16 <= len; c += 16) {
		__m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			a0[r] = _mm256_fmadd_ps(_mm256_load_ps(buf[r] + c), x0, a0[r]);
			a1[r] = _mm256_fmadd_ps(_mm256_load_ps(buf[r] + c + 8), x1, a1[r]);
		}
	}
	float s[4];
	if (R == 4) {
		_mm_storeu_ps(s, hsum4(_mm256_add_ps(a0[0], a1[0]), _mm256_add_ps(a0[1], a1[1]),
				       _mm256_add_ps(a0[2], a1[2]), _mm256_add_ps(a0[3], a1[3])));
	} else {
		for (int r = 0; r < R; r++)
			s[r] = hsum(_mm256_add_ps(a0[r], a1[r]));
	}
	for (int r = 0; r < R; r++) {
		for (int cc = c; cc < len; cc++)
			s[r] += x[cc] * buf[r][cc];
		y[r] += s[r];
	}
}

/* tile_dot1 for two tokens at once (x rows xstride apart, y rows ystride apart): each load
 * of the tile feeds two FMAs, and 4 rows x 2 tokens are 8 independent chains. */
static ALWAYS_INLINE void tile_dot2(int R, float *y, size_t ystride, const float *x,
				    size_t xstride, float (*buf)[CHUNK], int len)
{
	__m256 a[4][2];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		a[r][0] = a[r][1] = _mm256_setzero_ps();
	const float *xb = x + xstride;
	int c = 0;
	for (; c + 8 <= len; c += 8) {
		__m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(xb + c);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			__m256 wv = _mm256_load_ps(buf[r] + c);
			a[r][0] = _mm256_fmadd_ps(wv, x0, a[r][0]);
			a[r][1] = _mm256_fmadd_ps(wv, x1, a[r][1]);
		}
	}
	float s[2][4];
	if (R == 4) {
		_mm_storeu_ps(s[0], hsum4(a[0][0], a[1][0], a[2][0], a[3][0]));
		_mm_storeu_ps(s[1], hsum4(a[0][1], a[1][1], a[2][1], a[3][1]));
	} else {
		for (int r = 0; r < R; r++) {
			s[0][r] = hsum(a[r][0]);
			s[1][r] = hsum(a[r][1]);
		}
	}
	for (int r = 0; r < R; r++) {
		for (int cc = c; cc < len; cc++) {
			s[0][r] += x[cc] * buf[r][cc];
			s[1][r] += xb[cc] * buf[r][cc];
		}
		y[r] += s[0][r];
		y[ystride + r] += s[1][r];
	}
}

/* y[t][0..R) += x[t][c0 .. c0+len) . dequant(rows)[c0 .. c0+len)^T for t < n (rows of x
 * `cols` and of y `ystride` apart), R = 1 or 4: the tile is decoded once, then every token
 * uses it. */
static ALWAYS_INLINE void tile_rows(int R, float *y, size_t ystride, const float *x, int n,
				    const uint8_t *w, const float *srow, int cols, int c0, int len,
				    const uint8_t *pf)
{
	float buf[4][CHUNK] __attribute__((aligned(32)));
	decode_tile(R, buf, w, srow, cols, c0, len, pf);
	int t = 0;
	for (; t + 2 <= n; t += 2)
		tile_dot2(R, y + (size_t)t * ystride, ystride, x + (size_t)t * cols + c0,
			  (size_t)cols, buf, len);
	if (t < n)
		tile_dot1(R, y + (size_t)t * ystride, x + (size_t)t * cols + c0, buf, len);
}

/* ---- rows of the matmul ------------------------------------------------------------------ */

/* A group of 4 rows shares each load of x, but only inside one 128-row scale block. */
static bool group_of_4(int r, int r1)
{
	return r + 4 <= r1 && r / BLK == (r + 3) / BLK;
}

/* Every token's y for R = 1 or 4 rows: pairs of tokens through dot_rows_t2, the last odd one
 * through dot_rows. The rows come from memory on the first pass and from cache after. */
static ALWAYS_INLINE void fused_rows(int R, float *y, int rows, const float *x, int n,
				     const uint8_t *w, const float *srow, int cols,
				     const uint8_t *pf)
{
	int t = 0;
	for (; t + 2 <= n; t += 2, pf = NULL)
		dot_rows_t2(R, y + (size_t)t * rows, (size_t)rows, x + (size_t)t * cols, w, srow,
			    cols, pf);
	if (t < n)
		dot_rows(R, y + (size_t)t * rows, x + (size_t)t * cols, w, srow, cols, pf);
}

void cpu_fp8_rows_avx2(float *y, const float *x, const uint8_t *w, const float *scale, int n,
		       int rows, int cols, int r0, int r1)
{
	int sc = (cols + BLK - 1) / BLK;
	/* groups of 4 rows between the one being read and the one being prefetched */
	size_t group_bytes = (size_t)4 * (size_t)(cols > 0 ? cols : 1);
	int ahead = (int)((PREFETCH_BYTES + group_bytes - 1) / group_bytes);
	if (n <= FUSED_MAX_N) {
		for (int r = r0; r < r1;) {
			const uint8_t *wr = w + (size_t)r * cols;
			const float *srow = scale + (size_t)(r / BLK) * sc;
			if (group_of_4(r, r1)) {
				const uint8_t *pf = r + 4 * ahead + 4 <= r1
							    ? wr + (size_t)4 * ahead * cols
							    : NULL;
				fused_rows(4, y + r, rows, x, n, wr, srow, cols, pf);
				r += 4;
			} else {
				fused_rows(1, y + r, rows, x, n, wr, srow, cols, NULL);
				r++;
			}
		}
		return;
	}
	/* Column chunks outermost, so the tokens' x slices of a chunk stay in L2 while every
	 * row of the range uses them; each weight is still read from memory once. */
	for (int t = 0; t < n; t++)
		for (int r = r0; r < r1; r++)
			y[(size_t)t * rows + r] = 0.0f;
	for (int c0 = 0; c0 < cols; c0 += CHUNK) {
		int len = cols - c0 < CHUNK ? cols - c0 : CHUNK;
		for (int r = r0; r < r1;) {
			const uint8_t *wr = w + (size_t)r * cols;
			const float *srow = scale + (size_t)(r / BLK) * sc;
			if (group_of_4(r, r1)) {
				const uint8_t *pf = r + 4 * ahead + 4 <= r1
							    ? wr + (size_t)4 * ahead * cols
							    : NULL;
				tile_rows(4, y + r, (size_t)rows, x, n, wr, srow, cols, c0, len, pf);
				r += 4;
			} else {
				tile_rows(1, y + r, (size_t)rows, x, n, wr, srow, cols, c0, len,
					  NULL);
				r++;
			}
		}
	}
}
