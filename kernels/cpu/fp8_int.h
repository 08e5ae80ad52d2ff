/*
 * fp8_int.h - internals of the FP8 (float8_e4m3fn, 128x128 block-scaled) matmul, shared by
 * fp8.c, fp8_avx2.c, the unit tests and tests/tools/fp8_bench.c. Not for use elsewhere.
 *
 * The *_avx2 functions live in fp8_avx2.c, compiled with -mavx2 -mfma -mf16c: call them
 * only when cpu_has_avx2() is true.
 */
#ifndef FP8_INT_H
#define FP8_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h" /* CPU_FP8_BLOCK */

/* Rows [r0, r1) of cpu_matmul_fp8 (same arguments as cpu_ref_matmul_fp8). r0 should be a
 * multiple of 4 for speed; any value is correct. */
void cpu_fp8_rows_avx2(float *y, const float *x, const uint8_t *w, const float *scale, int n,
		       int rows, int cols, int r0, int r1);

/* dst[i] = the value the AVX2 matmul uses for code src[i], for tests: equal to
 * dt_e4m3_to_f32 for the 254 finite codes; the NaN codes 0x7f/0xff read as +-480. */
void cpu_fp8_decode_avx2(float *dst, const uint8_t *src, size_t n);

#endif
