/*
 * cuda_kernels.h - the CUDA kernels, callable from C, each with the contract of its CPU
 * reference in kernels/cpu/cpu.h (same shapes, same layouts; only the order of the sums
 * differs). Pointers are device memory (wk_cuda_alloc); pos arrays too. Each call launches
 * on the default stream and returns WK_OK, or WK_EIO with the CUDA error in err (a launch
 * error; an error inside the kernel shows at the next wk_cuda_sync). In a build without CUDA
 * (kernels/cuda/cuda_none.c) every call returns WK_EUNSUPPORTED.
 *
 * These are the first versions, written for correctness (one warp per output row, one
 * block per query head): the kernel lab (tests/tools/cuda_lab.c) measures them against the
 * device's copy bandwidth, and faster variants replace them behind the same contracts.
 * Compiled here on every build with nvcc; not yet run on a GPU.
 */
#ifndef WICK_CUDA_KERNELS_H
#define WICK_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

int cuda_device_count(void);

/* Device memory and copies (cudaMalloc / cudaMemcpy, synchronous). */
int wk_cuda_alloc(void **p, size_t bytes, char *err, size_t errsz);
void wk_cuda_free(void *p);
int wk_cuda_upload(void *dst, const void *src, size_t bytes, char *err, size_t errsz);
int wk_cuda_download(void *dst, const void *src, size_t bytes, char *err, size_t errsz);
/* Waits for the device; returns the first error of the kernels launched since. */
int wk_cuda_sync(char *err, size_t errsz);

/* y[n][rows] = x[n][cols] . w[rows][cols]^T, w in DT_F32, DT_BF16 or DT_F16 */
int wk_cuda_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		   int cols, char *err, size_t errsz);
/* FP8 e4m3 block-scaled weights: scale[ceil(rows/128)][ceil(cols/128)] (cpu_ref_matmul_fp8) */
int wk_cuda_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
		       int rows, int cols, char *err, size_t errsz);
int wk_cuda_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps,
		    char *err, size_t errsz);
int wk_cuda_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		 float theta, bool interleaved, char *err, size_t errsz);
/* Causal GQA over the cache (cpu_ref_attention); pos0 + n <= WK_CUDA_ATTN_MAX */
int wk_cuda_attention(float *out, const float *q, const float *k, const float *v, int n,
		      int pos0, int n_heads, int n_kv, int head_dim, int kv_stride, float scale,
		      char *err, size_t errsz);
#define WK_CUDA_ATTN_MAX 8192
int wk_cuda_silu_mul(float *g, const float *u, size_t n, char *err, size_t errsz);
int wk_cuda_add(float *y, const float *x, size_t n, char *err, size_t errsz); /* y += x */
/* idx[i] = argmax of logits[i][0..vocab), ties to the lower index (samp_argmax) */
int wk_cuda_argmax(int *idx, const float *logits, int n, int vocab, char *err, size_t errsz);

/* The kernel lab's benchmark (lab.cu): prints each kernel's GB/s beside the device's copy
 * bandwidth measured first. WK_OK, or WK_EIO when a step failed (printed). */
int wk_cuda_lab(void);

#endif
