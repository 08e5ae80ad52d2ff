/*
 * test_fp8.c - the FP8 (e4m3fn, 128x128 block-scaled) matmul: the decoders against
 * dt_e4m3_to_f32 for every code, the reference against hand-computed values, and the fast
 * kernel against the reference over odd shapes, with and without a pool, with AVX2 and with
 * the portable fallback.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/fp8_int.h"

static uint64_t fp8_rng;

static uint32_t fp8_next(void)
{
	fp8_rng ^= fp8_rng << 13;
	fp8_rng ^= fp8_rng >> 7;
	fp8_rng ^= fp8_rng << 17;
	return (uint32_t)(fp8_rng >> 32);
}

static float fp8_rnd(void) /* uniform in [-1, 1) */
{
	return (float)((fp8_next() >> 8) * (1.0 / (1 << 23))) - 1.0f;
}

static uint8_t fp8_rnd_code(void) /* any finite code, subnormals and negatives included */
{
	for (;;) {
		uint8_t b = (uint8_t)fp8_next();
		if ((b & 0x7f) != 0x7f)
			return b;
	}
}

static bool same_bits(float a, float b)
{
	return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- decoders ------------------------------------------------------------------------------ */

/* The table against e4m3fn's definition, worked out apart: sign, 4 exponent bits (bias 7),
 * 3 mantissa bits; exponent 0 is subnormal; 0x7f and 0xff are NaN, and there is no infinity. */
Test(fp8, table_matches_dtype)
{
	for (int b = 0; b < 256; b++) {
		int exp = (b >> 3) & 0xf, man = b & 7;
		float want = exp == 0 ? ldexpf((float)man, -9) : ldexpf((float)(man | 8), exp - 10);
		if (b & 0x80)
			want = -want;
		float got = dt_e4m3_table[b];
		if ((b & 0x7f) == 0x7f)
			cr_assert(isnan(got) && isnan(dt_e4m3_to_f32((uint8_t)b)), "code 0x%02x", b);
		else
			cr_assert(same_bits(got, want) && same_bits(dt_e4m3_to_f32((uint8_t)b), want),
				  "code 0x%02x: %a, want %a", b, got, want);
	}
}

Test(fp8, avx2_decoder_every_code)
{
	if (!cpu_has_avx2())
		cr_skip_test("no AVX2");
	uint8_t codes[256 + 16];
	float got[256 + 16];
	for (int b = 0; b < 256 + 16; b++)
		codes[b] = (uint8_t)b;
	/* at every offset mod 16 and every length mod 16, so the tail path decodes each code */
	for (int off = 0; off < 16; off++)
		for (int len = 256 - off - 15; len <= 256 - off; len++) {
			memset(got, 0xff, sizeof got);
			cpu_fp8_decode_avx2(got, codes + off, (size_t)len);
			for (int i = 0; i < len; i++) {
				uint8_t b = codes[off + i];
				float want = dt_e4m3_to_f32(b);
				if (isnan(want))
					cr_assert(got[i] == ((b & 0x80) ? -480.0f : 480.0f),
						  "NaN code 0x%02x reads %g, documented +-480", b,
						  got[i]);
				else
					cr_assert(same_bits(got[i], want), "code 0x%02x: %a, want %a",
						  b, got[i], want);
			}
			cr_assert(isnan(got[len]), "wrote past n");
		}
	/* the finite codes: 254, of which 14 nonzero subnormals and two zeros */
	int finite = 0, sub = 0;
	for (int b = 0; b < 256; b++) {
		float v = dt_e4m3_to_f32((uint8_t)b);
		finite += !isnan(v);
		sub += v != 0.0f && fabsf(v) < 0.015625f;
	}
	cr_assert_eq(finite, 254);
	cr_assert_eq(sub, 14);
}

/* ---- reference against hand-computed values ------------------------------------------------ */

Test(fp8, ref_known_small)
{
	/* codes: 0x38 = 1, 0x40 = 2, 0xb8 = -1, 0x3c = 1.5, 0x7e = 448, 0x01 = 2^-9 (smallest
	 * subnormal), 0x87 = -7 * 2^-9 (largest negative subnormal), 0x08 = 2^-6 (smallest
	 * normal), 0x80 = -0 */
	const uint8_t w[2][4] = {{0x38, 0x40, 0xb8, 0x01}, {0x3c, 0x7e, 0x87, 0x08}};
	const float x[2][4] = {{1, 2, 3, 512}, {-2, 0.5f, 512, 64}};
	const float scale[1] = {0.25f};
	float y[2][2];
	cpu_ref_matmul_fp8(&y[0][0], &x[0][0], &w[0][0], scale, 2, 2, 4);
	/* token 0: row 0 = (1 + 4 - 3 + 1) * 0.25; row 1 = (1.5 + 896 - 21/512 + 8) * 0.25 */
	cr_assert_eq(y[0][0], 0.75f);
	cr_assert_eq(y[0][1], (1.5f + 896.0f - 21.0f / 512.0f + 8.0f) * 0.25f);
	/* token 1: row 0 = (-2 + 1 - 512 + 64/512) * 0.25; row 1 = (-3 + 224 - 7 + 1) * 0.25 */
	cr_assert_eq(y[1][0], (-2.0f + 1.0f - 512.0f + 0.125f) * 0.25f);
	cr_assert_eq(y[1][1], (-3.0f + 224.0f - 7.0f + 1.0f) * 0.25f);

	const uint8_t wz[3] = {0x80, 0x00, 0x80};
	const float xz[3] = {1, 1, 1};
	float yz;
	cpu_ref_matmul_fp8(&yz, xz, wz, scale, 1, 1, 3);
	cr_assert_eq(yz, 0.0f);
}

/* A matrix that spans 2 x 2 scale blocks with partial edges: every weight is 1 (0x38) and
 * x is 1, so row r gives 128 * s[r/128][0] + 2 * s[r/128][1]. */
Test(fp8, ref_known_blocks)
{
	enum { ROWS = 131, COLS = 130 };
	uint8_t *w = malloc((size_t)ROWS * COLS);
	float x[COLS], y[ROWS];
	const float scale[2][2] = {{0.5f, 3.0f}, {-0.25f, 8.0f}};
	cr_assert(w);
	memset(w, 0x38, (size_t)ROWS * COLS);
	for (int c = 0; c < COLS; c++)
		x[c] = 1.0f;
	cpu_ref_matmul_fp8(y, x, w, &scale[0][0], 1, ROWS, COLS);
	for (int r = 0; r < ROWS; r++) {
		float want = r < 128 ? 128 * 0.5f + 2 * 3.0f : 128 * -0.25f + 2 * 8.0f;
		cr_assert_eq(y[r], want, "row %d: %g, want %g", r, y[r], want);
	}
	/* a subnormal in the partial block: w[129][129] = 0x85 = -5 * 2^-9 */
	w[(size_t)129 * COLS + 129] = 0x85;
	cpu_ref_matmul_fp8(y, x, w, &scale[0][0], 1, ROWS, COLS);
	cr_assert_eq(y[129], 128 * -0.25f + (1.0f - 5.0f / 512.0f) * 8.0f);
	cr_assert_eq(y[130], 128 * -0.25f + 2 * 8.0f);
	free(w);
}

Test(fp8, nan_codes)
{
	const uint8_t w[2][2] = {{0x7f, 0x38}, {0x38, 0x38}};
	const float x[2] = {1, 1}, scale[1] = {1};
	float y[2];
	cpu_ref_matmul_fp8(y, x, &w[0][0], scale, 1, 2, 2);
	cr_assert(isnan(y[0]));
	cr_assert_eq(y[1], 2.0f);
	cpu_force_scalar(true);
	cpu_matmul_fp8(NULL, y, x, &w[0][0], scale, 1, 2, 2);
	cpu_force_scalar(false);
	cr_assert(isnan(y[0]), "the portable fallback reads NaN codes as NaN");
	if (cpu_has_avx2()) {
		cpu_matmul_fp8(NULL, y, x, &w[0][0], scale, 1, 2, 2);
		cr_assert_eq(y[0], 481.0f, "the AVX2 kernel reads 0x7f as 480 (documented)");
	}
}

/* ---- fast against reference ---------------------------------------------------------------- */

static const int fp8_dims[] = {1, 7, 127, 128, 129, 300, 1030};
static const int fp8_ns[] = {1, 2, 3, 5}; /* 1-3: decode in registers; 5: via tiles */
#define NDIMS ((int)(sizeof fp8_dims / sizeof fp8_dims[0]))
#define NNS ((int)(sizeof fp8_ns / sizeof fp8_ns[0]))

/* Runs cpu_matmul_fp8 on every shape with a pool of `threads` (0: NULL) and compares it with
 * the reference. Returns the largest error seen as a fraction of the tolerance. */
static double check_fp8(int threads)
{
	struct cpu_pool *p = NULL;
	if (threads > 0)
		cr_assert_eq(cpu_pool_create(threads, &p), WK_OK);
	double worst = 0.0;
	fp8_rng = 0x2545f4914f6cdd1dull;
	for (int ri = 0; ri < NDIMS; ri++)
		for (int ci = 0; ci < NDIMS; ci++)
			for (int ni = 0; ni < NNS; ni++) {
				int rows = fp8_dims[ri], cols = fp8_dims[ci], n = fp8_ns[ni];
				int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
				uint8_t *w = malloc((size_t)rows * cols);
				float *x = malloc((size_t)n * cols * sizeof *x);
				float *s = malloc((size_t)sr * sc * sizeof *s);
				float *want = malloc((size_t)n * rows * sizeof *want);
				float *got = malloc((size_t)n * rows * sizeof *got);
				cr_assert(w && x && s && want && got);
				for (size_t i = 0; i < (size_t)rows * cols; i++)
					w[i] = fp8_rnd_code();
				for (size_t i = 0; i < (size_t)n * cols; i++)
					x[i] = fp8_rnd();
				for (int i = 0; i < sr * sc; i++) /* realistic: ~absmax / 448 */
					s[i] = (1.5f + fp8_rnd()) * 1e-3f;
				cpu_ref_matmul_fp8(want, x, w, s, n, rows, cols);
				for (size_t i = 0; i < (size_t)n * rows; i++)
					got[i] = NAN;
				cpu_matmul_fp8(p, got, x, w, s, n, rows, cols);
				float ymax = 0.0f;
				for (size_t i = 0; i < (size_t)n * rows; i++)
					ymax = fmaxf(ymax, fabsf(want[i]));
				for (int t = 0; t < n; t++)
					for (int r = 0; r < rows; r++) {
						/* 1e-5 of max |y|; but a shape with one output (rows = 1)
						 * may cancel to far below its terms, so also allow 1e-6 of
						 * the sum of the magnitudes of the terms */
						double mag = 0.0;
						for (int c = 0; c < cols; c++)
							mag += fabs((double)x[(size_t)t * cols + c] *
								    dt_e4m3_to_f32(w[(size_t)r * cols + c]) *
								    s[(r / 128) * sc + c / 128]);
						size_t i = (size_t)t * rows + r;
						double err = fabs((double)got[i] - want[i]);
						double tol = fmax(1e-5 * ymax, 1e-6 * mag);
						cr_assert(err <= tol,
							  "avx2=%d threads=%d n=%d rows=%d cols=%d: "
							  "y[%d][%d] = %.9g, want %.9g (max|y| %g, terms %g)",
							  cpu_has_avx2(), threads, n, rows, cols, t, r,
							  got[i], want[i], ymax, mag);
						if (tol > 0 && err / tol > worst)
							worst = err / tol;
					}
				free(w);
				free(x);
				free(s);
				free(want);
				free(got);
			}
	cpu_pool_destroy(p);
	return worst;
}

Test(fp8, fast_matches_ref)
{
	for (int threads = 0; threads <= 3; threads++) {
		if (threads == 1)
			continue;
		double worst = check_fp8(threads);
		cr_log_info("fp8 avx2=%d threads=%d: worst error / tolerance = %.3g",
			    cpu_has_avx2(), threads, worst);
	}
}

Test(fp8, scalar_fallback_matches_ref)
{
	cpu_force_scalar(true);
	for (int threads = 0; threads <= 3; threads++)
		if (threads != 1)
			check_fp8(threads);
	cpu_force_scalar(false);
}

/* Weights quantized the way the checkpoints are (per block absmax -> 448), plus x with a
 * few large outliers as real activations have. */
Test(fp8, fast_matches_ref_quantized)
{
	enum { ROWS = 300, COLS = 1030, N = 3 };
	int sr = (ROWS + 127) / 128, sc = (COLS + 127) / 128;
	float *wf = malloc((size_t)ROWS * COLS * sizeof *wf);
	uint8_t *w = malloc((size_t)ROWS * COLS);
	float *s = calloc((size_t)sr * sc, sizeof *s), x[N * COLS], want[N * ROWS], got[N * ROWS];
	cr_assert(wf && w && s);
	fp8_rng = 77;
	for (size_t i = 0; i < (size_t)ROWS * COLS; i++) {
		float u = fp8_rnd();
		wf[i] = u * u * u * 0.05f; /* heavy near zero: subnormal codes occur */
	}
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < COLS; c++) {
			float *m = &s[(r / 128) * sc + c / 128];
			*m = fmaxf(*m, fabsf(wf[(size_t)r * COLS + c]) / 448.0f);
		}
	int subnormal = 0;
	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < COLS; c++) {
			uint8_t b = dt_f32_to_e4m3(wf[(size_t)r * COLS + c] /
						   s[(r / 128) * sc + c / 128]);
			w[(size_t)r * COLS + c] = b;
			subnormal += (b & 0x78) == 0 && (b & 7) != 0;
		}
	cr_assert_gt(subnormal, 100);
	for (int i = 0; i < N * COLS; i++)
		x[i] = fp8_rnd() * (i % 97 == 0 ? 300.0f : 1.0f);
	cpu_ref_matmul_fp8(want, x, w, s, N, ROWS, COLS);
	for (int n = 1; n <= N; n++) {
		struct cpu_pool *p;
		cr_assert_eq(cpu_pool_create(2, &p), WK_OK);
		cpu_matmul_fp8(p, got, x, w, s, n, ROWS, COLS);
		cpu_pool_destroy(p);
		float ymax = 0.0f;
		for (int i = 0; i < n * ROWS; i++)
			ymax = fmaxf(ymax, fabsf(want[i]));
		for (int i = 0; i < n * ROWS; i++)
			cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * ymax, "n=%d y[%d] = %.9g, want %.9g",
				  n, i, got[i], want[i]);
	}
	free(wf);
	free(w);
	free(s);
}

Test(fp8, empty_shapes)
{
	float y[2] = {5, 5};
	const float x[2] = {1, 1}, s[1] = {1};
	const uint8_t w[2] = {0x38, 0x38};
	cpu_matmul_fp8(NULL, y, x, w, s, 0, 2, 1);
	cpu_matmul_fp8(NULL, y, x, w, s, 1, 0, 1);
	cr_assert(y[0] == 5 && y[1] == 5);
	cpu_matmul_fp8(NULL, y, x, w, s, 1, 2, 0); /* no columns: zero */
	cr_assert(y[0] == 0 && y[1] == 0);
}

/* ---- activation quantization ------------------------------------------------------------- */

/* cpu_e4m3_round is the byte round trip (dt_f32_to_e4m3: nearest, ties to even, saturating)
 * without the byte: every code's value and the midpoints between neighbours (the ties), a
 * hair either side of them, and random values over 2^-12 .. 2^10. */
Test(fp8, e4m3_round_is_the_byte_round_trip)
{
	int checked = 0;
	for (int c = 0; c < 0x7e; c++) {
		float a = dt_e4m3_to_f32((uint8_t)c), b = dt_e4m3_to_f32((uint8_t)(c + 1));
		float mid = (a + b) / 2;
		float vs[] = {a, mid, nextafterf(mid, 0), nextafterf(mid, 1e9f), -a, -mid};
		for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++, checked++) {
			float want = dt_e4m3_to_f32(dt_f32_to_e4m3(vs[k]));
			cr_assert(same_bits(cpu_e4m3_round(vs[k]), want), "%a: %a, want %a", vs[k],
				  cpu_e4m3_round(vs[k]), want);
		}
	}
	for (int i = 0; i < 100000; i++, checked++) {
		float v = fp8_rnd() * ldexpf(1.0f, (int)(fp8_next() % 22) - 12);
		float want = dt_e4m3_to_f32(dt_f32_to_e4m3(v));
		cr_assert(same_bits(cpu_e4m3_round(v), want), "%a: %a, want %a", v, cpu_e4m3_round(v),
			  want);
	}
	cr_assert_eq(cpu_e4m3_round(1e6f), 448.0f);
	cr_assert_eq(cpu_e4m3_round(-500.0f), -448.0f);
	cr_assert(checked > 100000);
}

/* Per token per 128 channels: each block's largest |x| comes back exactly (it maps to 448),
 * every value is on its block's e4m3 grid and within half a step of x, a zero block stays
 * zero, the partial last block has its own scale. */
Test(fp8, act_quant_blocks)
{
	enum { N = 3, C = 300 };
	float x[N * C], y[N * C];
	for (int i = 0; i < N * C; i++)
		x[i] = fp8_rnd() * (i % C < 128 ? 1.0f : i % C < 256 ? 100.0f : 0.01f);
	for (int c = 128; c < 256; c++)
		x[C + c] = 0.0f; /* token 1's second block */
	cpu_ref_act_quant(y, x, N, C);
	for (int t = 0; t < N; t++)
		for (int c0 = 0; c0 < C; c0 += 128) {
			int m = C - c0 < 128 ? C - c0 : 128;
			const float *xb = x + t * C + c0, *yb = y + t * C + c0;
			float amax = 0;
			for (int c = 0; c < m; c++)
				amax = fmaxf(amax, fabsf(xb[c]));
			float s = amax > 0 ? amax / 448.0f : 1.0f;
			for (int c = 0; c < m; c++) {
				cr_assert(same_bits(yb[c], cpu_e4m3_round(xb[c] / s) * s));
				if (fabsf(xb[c]) == amax)
					cr_assert_float_eq(yb[c], xb[c], amax * 1e-6f);
				/* e4m3 has 3 mantissa bits: |error| <= 2^-4 |x| (normal) or 2^-10 s */
				cr_assert_leq(fabsf(yb[c] - xb[c]),
					      fmaxf(fabsf(xb[c]) / 16.0f, s / 1024.0f) * 1.0001f);
			}
			if (amax == 0)
				for (int c = 0; c < m; c++)
					cr_assert_eq(yb[c], 0.0f);
		}
	cpu_ref_act_quant(x, x, N, C); /* in place */
	cr_assert_eq(memcmp(x, y, sizeof x), 0);
}

/* ---- FP8 x FP8 GEMM (cpu_ref_gemm_fp8) ------------------------------------------------------ */

/* Exact on powers of two: every token code 1 (0x38), every weight code 2 (0x40), 2 x 2 scale
 * blocks with partial edges, so y[t][r] = 128 * 2 * xs[t][0] * ws[r/128][0] + 2 * 2 *
 * xs[t][1] * ws[r/128][1]. */
Test(fp8, gemm_ref_known_blocks)
{
	enum { N = 2, ROWS = 131, COLS = 130 };
	uint8_t xq[N * COLS], *w = malloc((size_t)ROWS * COLS);
	const float xs[N][2] = {{0.5f, 4.0f}, {-2.0f, 0.125f}};
	const float ws[2][2] = {{0.25f, 8.0f}, {-1.0f, 0.5f}};
	float y[N * ROWS];
	cr_assert(w);
	memset(xq, 0x38, sizeof xq);
	memset(w, 0x40, (size_t)ROWS * COLS);
	cpu_ref_gemm_fp8(y, xq, &xs[0][0], w, &ws[0][0], N, ROWS, COLS);
	for (int t = 0; t < N; t++)
		for (int r = 0; r < ROWS; r++) {
			int rb = r / 128;
			float want = 256 * xs[t][0] * ws[rb][0] + 4 * xs[t][1] * ws[rb][1];
			cr_assert_eq(y[t * ROWS + r], want, "y[%d][%d] = %g, want %g", t, r,
				     y[t * ROWS + r], want);
		}
	free(w);
}

/* max |got - want| / max |want| */
static double fp8_rel(const float *got, const float *want, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(isfinite(got[i]), "element %zu is %g", i, got[i]);
		d = fmax(d, fabs((double)got[i] - want[i]));
		m = fmax(m, fabs((double)want[i]));
	}
	return m > 0 ? d / m : d;
}

/* The GEMM is the f32 matmul of its dequantized operands (e4m3(xq) * xs, e4m3(w) * ws) and
 * also cpu_ref_matmul_fp8 over the dequantized tokens (the --fp8-act path), up to f32
 * rounding: random codes (subnormals and negatives included) and scales, partial blocks. */
Test(fp8, gemm_ref_matches_dequantized)
{
	static const int shapes[][3] = {{1, 1, 1}, {3, 130, 300}, {2, 257, 129}, {5, 64, 128},
					{4, 200, 512}};
	fp8_rng = 0x9e3779b97f4a7c15ull;
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
		int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
		uint8_t *xq = malloc((size_t)n * cols), *w = malloc((size_t)rows * cols);
		float *xs = malloc((size_t)n * sc * 4), *ws = malloc((size_t)sr * sc * 4);
		float *x = malloc((size_t)n * cols * 4), *wf = malloc((size_t)rows * cols * 4);
		float *got = malloc((size_t)n * rows * 4), *want = malloc((size_t)n * rows * 4);
		float *want8 = malloc((size_t)n * rows * 4);
		cr_assert(xq && w && xs && ws && x && wf && got && want && want8);
		for (int i = 0; i < n * sc; i++)
			xs[i] = (fp8_rnd() + 1.5f) / 448.0f; /* amax / 448 of some block */
		for (int i = 0; i < sr * sc; i++)
			ws[i] = (fp8_rnd() + 1.5f) * 1e-3f;
		for (int t = 0; t < n; t++)
			for (int c = 0; c < cols; c++) {
				xq[t * cols + c] = fp8_rnd_code();
				x[t * cols + c] = dt_e4m3_to_f32(xq[t * cols + c]) * xs[t * sc + c / 128];
			}
		for (int r = 0; r < rows; r++)
			for (int c = 0; c < cols; c++) {
				size_t i = (size_t)r * cols + c;
				w[i] = fp8_rnd_code();
				wf[i] = dt_e4m3_to_f32(w[i]) * ws[(r / 128) * sc + c / 128];
			}
		cpu_ref_gemm_fp8(got, xq, xs, w, ws, n, rows, cols);
		cpu_ref_matmul(want, x, wf, DT_F32, n, rows, cols);
		cpu_ref_matmul_fp8(want8, x, w, ws, n, rows, cols);
		double r1 = fp8_rel(got, want, (size_t)n * rows);
		double r2 = fp8_rel(got, want8, (size_t)n * rows);
		cr_expect_leq(r1, 1e-5, "n=%d rows=%d cols=%d: %g against the dequantized matmul", n,
			      rows, cols, r1);
		cr_expect_leq(r2, 1e-5, "n=%d rows=%d cols=%d: %g against matmul_fp8", n, rows, cols,
			      r2);
		free(xq);
		free(w);
		free(xs);
		free(ws);
		free(x);
		free(wf);
		free(got);
		free(want);
		free(want8);
	}
}
