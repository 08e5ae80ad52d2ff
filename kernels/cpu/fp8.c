/*
 * fp8.c - FP8 (float8_e4m3fn) block-scaled matmul on the CPU: the reference, the portable
 * fallback, and the split over the pool (the AVX2 inner loops are in fp8_avx2.c); the
 * reference of the FP8 x FP8 GEMM (cpu_ref_gemm_fp8) and of activation quantization.
 *
 * Weights are the GLM-5-FP8 / DeepSeek-V3 layout: w[rows][cols] e4m3fn bytes and
 * scale[ceil(rows/128)][ceil(cols/128)] f32 (`weight_scale_inv`); the weight is
 * fp8(w[r][c]) * scale[r/128][c/128], edge blocks partial.
 *
 * Accumulation (the definition the fast kernels match): each row's dot product is summed in
 * f32 one 128-column block at a time, and each block sum is multiplied by its scale and
 * added to an f32 total. This is the two-level "promotion" of DeepGEMM and the DeepSeek-V3
 * report, so a CUDA kernel can follow the same order. The fast kernels sum a block in
 * another order (SIMD lanes), so they agree with it to f32 rounding, not bit for bit.
 *
 * NaN codes (0x7f, 0xff) never occur in real checkpoints. The reference and the portable
 * fallback read them as NaN, so the output row is NaN; the AVX2 kernel reads them as +-480
 * (what its bit trick yields; see fp8_avx2.c). A loader that must reject them checks bytes.
 */
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fp8_int.h"

/* ---- reference ------------------------------------------------------------------------- */

void cpu_ref_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
			int rows, int cols)
{
	int sc = (cols + CPU_FP8_BLOCK - 1) / CPU_FP8_BLOCK; /* scale columns */
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		for (int r = 0; r < rows; r++) {
			const uint8_t *wr = w + (size_t)r * cols;
			const float *srow = scale + (size_t)(r / CPU_FP8_BLOCK) * sc;
			float acc = 0.0f;
			for (int b = 0; b < sc; b++) {
				int c0 = b * CPU_FP8_BLOCK;
				int c1 = c0 + CPU_FP8_BLOCK < cols ? c0 + CPU_FP8_BLOCK : cols;
				float bsum = 0.0f;
				for (int c = c0; c < c1; c++)
					bsum += xt[c] * dt_e4m3_to_f32(wr[c]);
				acc += bsum * srow[b];
			}
			y[(size_t)t * rows + r] = acc;
		}
	}
}

/* Both operands FP8: the order of cpu_ref_matmul_fp8 (a block sum, then its scales), with
 * the activation's scale joining the weight's. */
void cpu_ref_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		      const float *ws, int n, int rows, int cols)
{
	int sc = (cols + CPU_FP8_BLOCK - 1) / CPU_FP8_BLOCK;
	for (int t = 0; t < n; t++) {
		const uint8_t *xt = xq + (size_t)t * cols;
		const float *xst = xs + (size_t)t * sc;
		for (int r = 0; r < rows; r++) {
			const uint8_t *wr = w + (size_t)r * cols;
			const float *wsr = ws + (size_t)(r / CPU_FP8_BLOCK) * sc;
			float acc = 0.0f;
			for (int b = 0; b < sc; b++) {
				int c0 = b * CPU_FP8_BLOCK;
				int c1 = c0 + CPU_FP8_BLOCK < cols ? c0 + CPU_FP8_BLOCK : cols;
				float bsum = 0.0f;
				for (int c = c0; c < c1; c++)
					bsum += dt_e4m3_to_f32(xt[c]) * dt_e4m3_to_f32(wr[c]);
				acc += bsum * (xst[b] * wsr[b]);
			}
			y[(size_t)t * rows + r] = acc;
		}
	}
}

/* ---- activation quantization ---------------------------------------------------------- */

float cpu_e4m3_round(float v)
{
	float a = fabsf(v);
	if (!(a > 0.0f))
		return v; /* zeros (and NaN) */
	int ex;
	frexpf(a, &ex); /* a = m * 2^ex, m in [0.5, 1): the binade is 2^(ex - 1) */
	int e = ex - 1 < -6 ? -6 : ex - 1; /* below 2^-6: subnormal spacing 2^-9 */
	float q = ldexpf(1.0f, e - 3);     /* 3 mantissa bits */
	float r = rintf(a / q) * q;        /* ties to even in the default rounding mode */
	if (r > 448.0f)
		r = 448.0f;
	return v < 0 ? -r : r;
}

float cpu_act_scale(const float *x, int m)
{
	float amax = 0.0f;
	for (int c = 0; c < m; c++)
		amax = fmaxf(amax, fabsf(x[c]));
	return amax > 0.0f ? amax / 448.0f : 1.0f;
}

void cpu_ref_act_quant(float *y, const float *x, int n, int cols)
{
	for (int t = 0; t < n; t++)
		for (int c0 = 0; c0 < cols; c0 += CPU_FP8_BLOCK) {
			const float *xb = x + (size_t)t * cols + c0;
			float *yb = y + (size_t)t * cols + c0;
			int m = cols - c0 < CPU_FP8_BLOCK ? cols - c0 : CPU_FP8_BLOCK;
			float s = cpu_act_scale(xb, m);
			for (int c = 0; c < m; c++)
				yb[c] = cpu_e4m3_round(xb[c] / s) * s;
		}
}

/* ---- fast: split over the pool --------------------------------------------------------- */

struct fp8_job {
	float *y;
	const float *x;
	const uint8_t *w;
	const float *scale;
	int n, rows, cols;
	int rows_per_task;
	bool avx2;
};

/* The portable fallback: the reference's arithmetic in the same order, with the table for
 * decoding and rows outside tokens, so each weight row comes from memory once per call. */
static void rows_scalar(const struct fp8_job *j, int r0, int r1)
{
	int cols = j->cols, sc = (cols + CPU_FP8_BLOCK - 1) / CPU_FP8_BLOCK;
	for (int r = r0; r < r1; r++) {
		const uint8_t *wr = j->w + (size_t)r * cols;
		const float *srow = j->scale + (size_t)(r / CPU_FP8_BLOCK) * sc;
		for (int t = 0; t < j->n; t++) {
			const float *xt = j->x + (size_t)t * cols;
			float acc = 0.0f;
			for (int b = 0; b < sc; b++) {
				int c0 = b * CPU_FP8_BLOCK;
				int c1 = c0 + CPU_FP8_BLOCK < cols ? c0 + CPU_FP8_BLOCK : cols;
				float bsum = 0.0f;
				for (int c = c0; c < c1; c++)
					bsum += xt[c] * dt_e4m3_table[wr[c]];
				acc += bsum * srow[b];
			}
			j->y[(size_t)t * j->rows + r] = acc;
		}
	}
}

static void fp8_task(void *ctx, int task, int ntasks)
{
	(void)ntasks;
	const struct fp8_job *j = ctx;
	int r0 = task * j->rows_per_task;
	int r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
	if (r0 >= r1)
		return;
	if (j->avx2)
		cpu_fp8_rows_avx2(j->y, j->x, j->w, j->scale, j->n, j->rows, j->cols, r0, r1);
	else
		rows_scalar(j, r0, r1);
}

/* Tasks as in cpu_matmul: contiguous row ranges, a multiple of 4 rows (the AVX2 row group,
 * which then never straddles a 128-row scale block), about 4 per thread, and at least
 * ~32 KiB of weight work each. */
void cpu_matmul_fp8(struct cpu_pool *p, float *y, const float *x, const uint8_t *w,
		    const float *scale, int n, int rows, int cols)
{
	if (n <= 0 || rows <= 0)
		return;
	struct fp8_job j = {y, x, w, scale, n, rows, cols, rows, cpu_has_avx2()};
	int threads = cpu_pool_size(p);
	if (threads > 1) {
		size_t row_bytes = (size_t)cols * (size_t)n;
		int min_rows = (int)(32768 / (row_bytes ? row_bytes : 1)) + 1;
		int per = (rows + threads * 4 - 1) / (threads * 4);
		if (per < min_rows)
			per = min_rows;
		per = (per + 3) & ~3;
		j.rows_per_task = per;
	}
	int ntasks = (rows + j.rows_per_task - 1) / j.rows_per_task;
	cpu_pool_run(p, fp8_task, &j, ntasks);
}
