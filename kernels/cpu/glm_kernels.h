/*
 * glm_kernels.h - internals of the GLM kernels shared by glm_ref.c, glm_avx2.c,
 * backend_cpu.c and the unit tests. Not for use elsewhere.
 *
 * The *_avx2 functions live in glm_avx2.c, compiled with -mavx2 -mfma -mf16c: call them only
 * when cpu_has_avx2() is true. They have the contracts of the references of the same name
 * in cpu.h and agree with them to f32 rounding (they sum in another order).
 */
#ifndef GLM_KERNELS_H
#define GLM_KERNELS_H

#include "kernels/cpu/cpu.h"

#define CPU_GLM_ROWBUF 1024 /* columns of a weight row dequantized at a time (on the stack) */

/* Columns [c0, c1) of row r of a [rows][cols] weight (any matmul dtype; FP8 with its 128x128
 * block scales) as f32 into dst. */
void cpu_glm_row_f32(float *dst, const void *w, enum dt_type wt, const float *scale, int cols,
		     size_t r, int c0, int c1);

void cpu_mla_absorb_q_avx2(float *qa, const float *q, const void *w, enum dt_type wt,
			   const float *scale, int lora, int n, int n_heads, int d_nope, int d_rope,
			   int d_v, int h0, int h1);
void cpu_mla_absorb_out_avx2(float *o, const float *lat, const void *w, enum dt_type wt,
			     const float *scale, int lora, int n, int n_heads, int d_nope, int d_v,
			     int h0, int h1);

/* cpu_ref_mla_attention with one pass over the keys (online softmax: a running maximum
 * rescales the running sum and output), 8-wide dot products and updates. */
void cpu_mla_attention_avx2(float *out, const float *q, const struct cpu_mla *s, int n,
			    int pos0, int i0, int i1, int h0, int h1);
/* cpu_ref_dsa_score, 8-wide. */
float cpu_dsa_score_avx2(const float *q, const void *k, enum dt_type kv, const float *ks,
			 const float *w, int n_heads, int head_dim, float qk_scale, float w_scale);

#endif
