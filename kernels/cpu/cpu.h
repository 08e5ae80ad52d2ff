/*
 * cpu.h - CPU kernels: a plain reference for every op, and fast versions (threads + AVX2).
 *
 * The cpu_ref_* functions are the readable definition of each op. They are single-threaded,
 * scalar, and stay forever: every fast version (and later the CUDA kernels) is tested against
 * them with a tolerance suited to its precision.
 *
 * Conventions: activations are f32, row-major. Weights are row-major [rows][cols] in the
 * dtype given (DT_F32, DT_BF16 or DT_F16), i.e. the Hugging Face nn.Linear layout
 * [out_features][in_features]. No function allocates except cpu_pool_create and
 * cpu_read_bandwidth; none can fail once its arguments are valid.
 */
#ifndef CPU_H
#define CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/* ---- thread pool ---------------------------------------------------------------------- */

struct cpu_pool; /* opaque; one caller at a time may run work on a pool */

/* nthreads <= 0 means one per online core. Returns WK_OK or WK_ENOMEM/WK_EIO. */
int cpu_pool_create(int nthreads, struct cpu_pool **out);
void cpu_pool_destroy(struct cpu_pool *p); /* NULL is fine */
int cpu_pool_size(const struct cpu_pool *p);
/* Runs fn(ctx, i, ntasks) for every i in [0, ntasks) on the pool's threads (the caller's
 * thread takes part) and returns when all are done. p may be NULL: runs inline. Tasks are
 * claimed dynamically, in no fixed thread order. Not reentrant: fn must not run work on the
 * same pool. Costs ~1 us when the workers are warm: after a job they spin for ~2 ms (yielding
 * when the machine is oversubscribed), then sleep until the next one. */
void cpu_pool_run(struct cpu_pool *p, void (*fn)(void *ctx, int task, int ntasks), void *ctx,
		  int ntasks);

/* ---- reference kernels ---------------------------------------------------------------- */

/* y[n][rows] = x[n][cols] . w[rows][cols]^T */
void cpu_ref_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		    int cols);
/* FP8 block-scaled weights (the GLM-5-FP8 / DeepSeek-V3 convention): w[rows][cols] holds
 * float8_e4m3fn bytes and scale[ceil(rows/128)][ceil(cols/128)] f32 block scales (the
 * checkpoint's `weight_scale_inv`); the dequantized weight is fp8(w[r][c]) * scale[r/128][c/128].
 * Edge blocks may be partial. y[n][rows] = x[n][cols] . dequant(w)^T */
void cpu_ref_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
			int rows, int cols);
/* y[n][dim] = x / rms(x) * w, rms over each row, eps inside the sqrt. y may equal x. */
void cpu_ref_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps);
/* Rotary embedding in place on x[n][n_heads * head_dim]: for token i at position pos[i],
 * the first rot_dim dims of each head are rotated with frequencies theta^(-2j/rot_dim).
 * interleaved=false: Hugging Face rotate_half (pairs j and j + rot_dim/2);
 * interleaved=true: GPT-J style (pairs 2j and 2j+1). */
void cpu_ref_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		  float theta, bool interleaved);
void cpu_ref_softmax(float *x, int n); /* in place, numerically stable */
/* Causal grouped-query attention for n new tokens whose keys/values are already in the
 * cache at positions pos0 .. pos0+n-1.
 *   q   [n][n_heads * head_dim]
 *   k,v [pos0 + n][kv_stride]: the cache; kv head g sits at columns g*head_dim
 *   out [n][n_heads * head_dim]
 * Query head h uses kv head h / (n_heads / n_kv). Token i attends to 0 .. pos0 + i.
 * scores are q.k * scale. */
void cpu_ref_attention(float *out, const float *q, const float *k, const float *v, int n,
		       int pos0, int n_heads, int n_kv, int head_dim, int kv_stride, float scale);
/* g[i] = silu(g[i]) * u[i] for i < n */
void cpu_ref_silu_mul(float *g, const float *u, size_t n);

/* ---- fast kernels (same contracts; pool may be NULL) ------------------------------------- */

/* Splits rows over the pool; AVX2+FMA inner loops when the CPU has them. */
void cpu_matmul(struct cpu_pool *p, float *y, const float *x, const void *w, enum dt_type wt,
		int n, int rows, int cols);
/* Same contract as cpu_ref_matmul_fp8: dequantizes per 128-block inside the dot product
 * (no full-precision copy of the weights), SIMD when the CPU has AVX2. */
void cpu_matmul_fp8(struct cpu_pool *p, float *y, const float *x, const uint8_t *w,
		    const float *scale, int n, int rows, int cols);
/* Splits (token, head) pairs over the pool. */
void cpu_attention(struct cpu_pool *p, float *out, const float *q, const float *k,
		   const float *v, int n, int pos0, int n_heads, int n_kv, int head_dim,
		   int kv_stride, float scale);
bool cpu_has_avx2(void); /* AVX2, FMA and F16C, checked once at run time */

/* ---- machine roofline ----------------------------------------------------------------- */

/* Read bandwidth in GB/s (1e9 bytes/s): every pool thread streams its share of a buffer of
 * `bytes` (>= 1 GiB for a meaningful figure) with AVX2 loads, summing what it reads, for
 * at least `seconds`. Returns a negative value if the buffer cannot be allocated. */
double cpu_read_bandwidth(struct cpu_pool *p, size_t bytes, double seconds);

#endif
