/*
 * fp8.c - FP8 (float8_e4m3fn) block-scaled matmul on the CPU.
 * PLACEHOLDER until the FP8 kernels land: the reference dequantizes per element.
 */
#include "kernels/cpu/cpu.h"

void cpu_ref_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
			int rows, int cols)
{
	int sc = (cols + 127) / 128;
	for (int t = 0; t < n; t++)
		for (int r = 0; r < rows; r++) {
			float acc = 0;
			for (int c = 0; c < cols; c++)
				acc += x[(size_t)t * cols + c] * dt_e4m3_to_f32(w[(size_t)r * cols + c]) *
				       scale[(size_t)(r / 128) * sc + c / 128];
			y[(size_t)t * rows + r] = acc;
		}
}

void cpu_matmul_fp8(struct cpu_pool *p, float *y, const float *x, const uint8_t *w,
		    const float *scale, int n, int rows, int cols)
{
	(void)p;
	cpu_ref_matmul_fp8(y, x, w, scale, n, rows, cols);
}
