/*
 * cpu_int.h - internals shared by the CPU kernel files (ref.c, fast.c, fast_avx2.c,
 * bandwidth.c). Not for use outside kernels/cpu/.
 *
 * The *_avx2 functions live in fast_avx2.c, which is compiled with -mavx2 -mfma -mf16c;
 * call them only when cpu_has_avx2() is true.
 */
#ifndef CPU_INT_H
#define CPU_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"

/* x [n][cols] copied for the batched matmul (3 or more tokens, bf16/f16 weights): rows *xs
 * floats apart, columns in the order the weights are widened in. NULL when the matmul does
 * without (f32 weights, fewer tokens) or out of memory; free() it after the matmul. */
float *cpu_pack_x_avx2(const float *x, enum dt_type wt, int n, int cols, size_t *xs);

/* Rows [r0, r1) of y[n][rows] = x[n][cols] . w[rows][cols]^T, for DT_F32/BF16/F16. xp/xs:
 * from cpu_pack_x_avx2 for the same x, or NULL (then x alone serves, more slowly). */
void cpu_matmul_rows_avx2(float *y, const float *x, const float *xp, size_t xs, const void *w,
			  enum dt_type wt, int n, int rows, int cols, int r0, int r1);

/* Attention for one query row (token i, head h): out[head_dim] = softmax(q.K^T * scale) V
 * over cache rows 0 .. len-1, whose vectors start at element t*kv_stride of k/v (type kv,
 * DT_F32, DT_BF16 or DT_F8_E4M3; FP8: position t's scales at ks + t*ss and vs + t*ss, one a
 * 128-block of the head's row). */
void cpu_attention_head_avx2(float *out, const float *q, const void *k, const void *v,
			     const float *ks, const float *vs, size_t ss, enum dt_type kv, int len,
			     int head_dim, int kv_stride, float scale);

/* Sums bytes (a multiple of 256) at buf, 32-byte aligned, as 64-bit lanes: a load-bound loop
 * whose result only exists so that the loads cannot be optimised away. */
uint64_t cpu_stream_sum_avx2(const void *buf, size_t bytes);

/* Tests only: makes cpu_has_avx2() report false (on) or the truth (off), so the portable
 * fallbacks can be checked on an AVX2 machine. Not thread-safe against running kernels. */
void cpu_force_scalar(bool on);

/* The number of scores the online-softmax attention kernels keep on the stack at a time. */
#define CPU_ATTN_CHUNK 256

#endif
