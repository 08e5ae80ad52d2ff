/*
 * kernels.cu - the CUDA kernels of cuda_kernels.h, first versions (see there), but for the GLM
 * families' (glm_kernels.cu); the helpers both use are in cuda_int.cuh. Each kernel's
 * comment names its CPU reference; tests/unit/test_cuda.c compares them on random inputs
 * wherever a GPU is present.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"

/* ---- memory ----------------------------------------------------------------------------- */

extern "C" int wk_cuda_alloc(void **p, size_t bytes, char *err, size_t errsz)
{
	*p = NULL;
	return check(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc", err, errsz);
}

extern "C" void wk_cuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

extern "C" int wk_cuda_upload(void *dst, const void *src, size_t bytes, char *err, size_t errsz)
{
	return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload", err, errsz);
}

extern "C" int wk_cuda_download(void *dst, const void *src, size_t bytes, char *err,
				size_t errsz)
{
	return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download", err, errsz);
}

extern "C" int wk_cuda_sync(char *err, size_t errsz)
{
	return check(cudaDeviceSynchronize(), "kernel", err, errsz);
}

extern "C" int wk_cuda_zero(void *y, size_t bytes, char *err, size_t errsz)
{
	if (bytes == 0)
		return WK_OK;
	return check(cudaMemsetAsync(y, 0, bytes, 0), "zero", err, errsz);
}

/* ---- matmul (cpu_ref_matmul, cpu_ref_matmul_fp8) ------------------------------------------ */

/* One warp per weight row, all n tokens: the row is read from memory once and from cache
 * for the other tokens. The row's work is a device function, so that k_matmul_n computes
 * every row exactly as k_matmul does. */
template <typename T>
__device__ void row_matmul(float *y, const float *x, const T *w, int n, int rows, int cols,
			   int row, int lane)
{
	const T *wr = w + (size_t)row * cols;
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		float s = 0.0f;
		for (int c = lane; c < cols; c += 32)
			s += load_w(wr, (size_t)c) * xt[c];
		s = warp_sum(s);
		if (lane == 0)
			y[(size_t)t * rows + row] = s;
	}
}

template <typename T>
__global__ void k_matmul(float *y, const float *x, const T *w, int n, int rows, int cols)
{
	int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row < rows)
		row_matmul(y, x, w, n, rows, cols, row, lane);
}

/* As row_matmul, the sum taken per 128-column block and scaled by the block's scale. */
__device__ void row_matmul_fp8(float *y, const float *x, const __nv_fp8_e4m3 *w,
			       const float *scale, int n, int rows, int cols, int row, int lane)
{
	int sc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
	const __nv_fp8_e4m3 *wr = w + (size_t)row * cols;
	const float *srow = scale + (size_t)(row / FP8_BLOCK) * sc;
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		float acc = 0.0f;
		for (int b = 0; b < sc; b++) {
			int c0 = b * FP8_BLOCK, c1 = min(c0 + FP8_BLOCK, cols);
			float s = 0.0f;
			for (int c = c0 + lane; c < c1; c += 32)
				s += float(wr[c]) * xt[c];
			acc += s * srow[b]; /* lanes' partials scale alike: one sum at the end */
		}
		acc = warp_sum(acc);
		if (lane == 0)
			y[(size_t)t * rows + row] = acc;
	}
}

__global__ void k_matmul_fp8(float *y, const float *x, const __nv_fp8_e4m3 *w,
			     const float *scale, int n, int rows, int cols)
{
	int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row < rows)
		row_matmul_fp8(y, x, w, scale, n, rows, cols, row, lane);
}

/* Several weights over one input in one launch (wk_cuda_matmul_n): warp g takes global row g
 * of the weights stacked in order; a warp never straddles two weights (one row per warp). */
struct mm_set {
	int count, cols;
	int start[WK_MATMUL_MAX + 1]; /* first global row of each weight; start[count]: total */
	struct wk_mm p[WK_MATMUL_MAX];
};

__global__ void k_matmul_n(struct mm_set s, const float *x, int n)
{
	int g = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (g >= s.start[s.count])
		return;
	int k = 0;
	while (g >= s.start[k + 1])
		k++;
	const struct wk_mm *p = &s.p[k];
	int row = g - s.start[k];
	switch (p->dtype) {
	case DT_F32:
		row_matmul(p->y, x, (const float *)p->w, n, p->rows, s.cols, row, lane);
		break;
	case DT_BF16:
		row_matmul(p->y, x, (const __nv_bfloat16 *)p->w, n, p->rows, s.cols, row, lane);
		break;
	case DT_F16:
		row_matmul(p->y, x, (const __half *)p->w, n, p->rows, s.cols, row, lane);
		break;
	default: /* DT_F8_E4M3, checked at launch */
		row_matmul_fp8(p->y, x, (const __nv_fp8_e4m3 *)p->w, p->scale, n, p->rows, s.cols,
			       row, lane);
		break;
	}
}

extern "C" int wk_cuda_matmul_n(const struct wk_mm *parts, int count, const float *x, int n,
				int cols, char *err, size_t errsz)
{
	if (count < 1 || count > WK_MATMUL_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA matmul_n: %d weights (1..%d)", count,
			       WK_MATMUL_MAX);
	struct mm_set s;
	memset(&s, 0, sizeof s);
	s.count = count;
	s.cols = cols;
	for (int k = 0; k < count; k++) {
		enum dt_type t = parts[k].dtype;
		if (t != DT_F32 && t != DT_BF16 && t != DT_F16 && t != DT_F8_E4M3)
			return wk_errf(err, errsz, WK_EUNSUPPORTED, "CUDA matmul_n: weights in %s",
				       dt_name(t));
		if (parts[k].rows < 0 || (t == DT_F8_E4M3 && !parts[k].scale))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA matmul_n: weight %d: %d rows%s",
				       k, parts[k].rows, t == DT_F8_E4M3 && !parts[k].scale
				       ? ", FP8 without block scales" : "");
		s.p[k] = parts[k];
		s.start[k + 1] = s.start[k] + parts[k].rows;
	}
	if (n <= 0 || s.start[count] == 0)
		return WK_OK;
	k_matmul_n<<<blocks((size_t)s.start[count] * 32, 256), 256>>>(s, x, n);
	return launched("matmul_n", err, errsz);
}

extern "C" int wk_cuda_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n,
			      int rows, int cols, char *err, size_t errsz)
{
	if (n <= 0 || rows <= 0)
		return WK_OK;
	unsigned b = blocks((size_t)rows * 32, 256);
	switch (wt) {
	case DT_F32: k_matmul<<<b, 256>>>(y, x, (const float *)w, n, rows, cols); break;
	case DT_BF16: k_matmul<<<b, 256>>>(y, x, (const __nv_bfloat16 *)w, n, rows, cols); break;
	case DT_F16: k_matmul<<<b, 256>>>(y, x, (const __half *)w, n, rows, cols); break;
	default:
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "CUDA matmul: weights in %s",
			       dt_name(wt));
	}
	return launched("matmul", err, errsz);
}

extern "C" int wk_cuda_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale,
				  int n, int rows, int cols, char *err, size_t errsz)
{
	if (n <= 0 || rows <= 0)
		return WK_OK;
	k_matmul_fp8<<<blocks((size_t)rows * 32, 256), 256>>>(
		y, x, (const __nv_fp8_e4m3 *)w, scale, n, rows, cols);
	return launched("matmul_fp8", err, errsz);
}

/* ---- rmsnorm (cpu_ref_rmsnorm): one block per row ------------------------------------------ */

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps)
{
	row_rmsnorm(y + (size_t)blockIdx.x * dim, x + (size_t)blockIdx.x * dim, w, dim, eps);
}

extern "C" int wk_cuda_rmsnorm(float *y, const float *x, const float *w, int n, int dim,
			       float eps, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_rmsnorm<<<n, 256>>>(y, x, w, dim, eps);
	return launched("rmsnorm", err, errsz);
}

/* ---- FP8 activations (cpu_ref_act_quant): one warp per token and 128-channel block ------- */

/* v on the float8_e4m3fn grid, nearest, ties to even, saturating (cpu_e4m3_round) */
__device__ float e4m3_round(float v)
{
	float a = fabsf(v);
	if (!(a > 0.0f))
		return v;
	int ex;
	frexpf(a, &ex);
	int e = ex - 1 < -6 ? -6 : ex - 1;
	float q = ldexpf(1.0f, e - 3);
	float r = rintf(a / q) * q;
	if (r > 448.0f)
		r = 448.0f;
	return v < 0 ? -r : r;
}

__global__ void k_act_quant(float *y, const float *x, int n, int cols)
{
	int g = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	int nb = (cols + 127) / 128;
	if (g >= n * nb)
		return;
	size_t at = (size_t)(g / nb) * cols + (size_t)(g % nb) * 128;
	int m = min(128, cols - (g % nb) * 128);
	float amax = 0.0f;
	for (int c = lane; c < m; c += 32)
		amax = fmaxf(amax, fabsf(x[at + c]));
	amax = warp_max(amax);
	float s = amax > 0.0f ? amax / 448.0f : 1.0f;
	for (int c = lane; c < m; c += 32)
		y[at + c] = e4m3_round(x[at + c] / s) * s;
}

extern "C" int wk_cuda_act_quant(float *y, const float *x, int n, int cols, char *err,
				 size_t errsz)
{
	if (n <= 0 || cols <= 0)
		return WK_OK;
	size_t warps = (size_t)n * ((cols + 127) / 128);
	k_act_quant<<<blocks(warps * 32, 256), 256>>>(y, x, n, cols);
	return launched("act_quant", err, errsz);
}

/* k_add, then k_rmsnorm, in one pass over the row: each thread's elements and partial sum
 * are k_rmsnorm's, so the result is the same bit for bit. */
__global__ void k_add_rmsnorm(float *x, const float *d, float *y, const float *w, int dim,
			      float eps)
{
	float *xr = x + (size_t)blockIdx.x * dim, *yr = y + (size_t)blockIdx.x * dim;
	const float *dr = d + (size_t)blockIdx.x * dim;
	float ss = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x) {
		float v = xr[i] + dr[i];
		xr[i] = v;
		ss += v * v;
	}
	float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		yr[i] = xr[i] * inv * w[i];
}

extern "C" int wk_cuda_add_rmsnorm(float *x, const float *d, float *y, const float *w, int n,
				   int dim, float eps, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_add_rmsnorm<<<n, 256>>>(x, d, y, w, dim, eps);
	return launched("add_rmsnorm", err, errsz);
}

/* ---- rope (cpu_ref_rope): one thread per rotated pair ---------------------------------------- */

/* Rotates pair i (token, head, j) of x: k_rope's thread, also k_rope_n's. */
__device__ void rope_pair(float *x, const int *pos, int n_heads, int head_dim, int rot_dim,
			  float theta, bool interleaved, size_t i)
{
	int half = rot_dim / 2;
	int j = (int)(i % half);
	size_t th = i / half; /* token * n_heads + head */
	int t = (int)(th / n_heads);
	float *v = x + th * head_dim;
	float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)rot_dim);
	float s, c;
	sincosf((float)pos[t] * inv_freq, &s, &c);
	int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
	float a = v[i0], b = v[i1];
	v[i0] = a * c - b * s;
	v[i1] = b * c + a * s;
}

__global__ void k_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		       float theta, bool interleaved)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < (size_t)n * n_heads * (rot_dim / 2))
		rope_pair(x, pos, n_heads, head_dim, rot_dim, theta, interleaved, i);
}

/* Several tensors in one launch: thread g takes pair g of the tensors' pairs in order. */
struct rope_set {
	int count;
	size_t start[WK_ROPE_MAX + 1];
	struct wk_rope r[WK_ROPE_MAX];
};

__global__ void k_rope_n(struct rope_set s, float theta, bool interleaved)
{
	size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (g >= s.start[s.count])
		return;
	int k = 0;
	while (g >= s.start[k + 1])
		k++;
	const struct wk_rope *r = &s.r[k];
	rope_pair(r->x, r->pos, r->n_heads, r->head_dim, r->rot_dim, theta, interleaved,
		  g - s.start[k]);
}

extern "C" int wk_cuda_rope_n(const struct wk_rope *r, int count, float theta,
			      bool interleaved, char *err, size_t errsz)
{
	if (count < 1 || count > WK_ROPE_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA rope_n: %d tensors (1..%d)", count,
			       WK_ROPE_MAX);
	struct rope_set s;
	memset(&s, 0, sizeof s);
	s.count = count;
	for (int k = 0; k < count; k++) {
		s.r[k] = r[k];
		s.start[k + 1] = s.start[k] + (size_t)r[k].n * r[k].n_heads * (r[k].rot_dim / 2);
	}
	if (s.start[count] == 0)
		return WK_OK;
	k_rope_n<<<blocks(s.start[count], 256), 256>>>(s, theta, interleaved);
	return launched("rope_n", err, errsz);
}

extern "C" int wk_cuda_rope(float *x, int n, const int *pos, int n_heads, int head_dim,
			    int rot_dim, float theta, bool interleaved, char *err, size_t errsz)
{
	size_t pairs = (size_t)n * n_heads * (rot_dim / 2);
	if (pairs == 0)
		return WK_OK;
	k_rope<<<blocks(pairs, 256), 256>>>(x, n, pos, n_heads, head_dim, rot_dim, theta,
					    interleaved);
	return launched("rope", err, errsz);
}

/* ---- attention (cpu_ref_attention): one block per (token, query head) ------------------------ */

/* Scores in shared memory (len floats), the softmax over them, then each thread sums the
 * values of its output dimensions. */
__global__ void k_attention(float *out, const float *q, const float *k, const float *v,
			    int pos0, int n_heads, int n_kv, int head_dim, int kv_stride,
			    float scale)
{
	extern __shared__ float sc[];
	int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
	int len = pos0 + i + 1, group = n_heads / n_kv;
	const float *qh = q + ((size_t)i * n_heads + h) * head_dim;
	size_t koff = (size_t)(h / group) * head_dim;
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int t = wid; t < len; t += nw) { /* a warp per key */
		const float *kt = k + (size_t)t * kv_stride + koff;
		float s = 0.0f;
		for (int d = lane; d < head_dim; d += 32)
			s += qh[d] * kt[d];
		s = warp_sum(s);
		if (lane == 0)
			sc[t] = s * scale;
	}
	__syncthreads();
	float m = -INFINITY;
	for (int t = threadIdx.x; t < len; t += blockDim.x)
		m = fmaxf(m, sc[t]);
	m = block_max(m);
	float sum = 0.0f;
	for (int t = threadIdx.x; t < len; t += blockDim.x) {
		float p = expf(sc[t] - m);
		sc[t] = p;
		sum += p;
	}
	sum = block_sum(sum); /* its __syncthreads also orders the writes of sc above */
	float *oh = out + ((size_t)i * n_heads + h) * head_dim;
	for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
		float o = 0.0f;
		for (int t = 0; t < len; t++)
			o += sc[t] * v[(size_t)t * kv_stride + koff + d];
		oh[d] = o / sum;
	}
}

extern "C" int wk_cuda_attention(float *out, const float *q, const float *k, const float *v,
				 int n, int pos0, int n_heads, int n_kv, int head_dim,
				 int kv_stride, float scale, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	if (pos0 + n > WK_CUDA_ATTN_MAX)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "CUDA attention: %d positions (this kernel holds up to %d)", pos0 + n,
			       WK_CUDA_ATTN_MAX);
	k_attention<<<n * n_heads, 128, (size_t)(pos0 + n) * sizeof(float)>>>(
		out, q, k, v, pos0, n_heads, n_kv, head_dim, kv_stride, scale);
	return launched("attention", err, errsz);
}

/* ---- elementwise (cpu_ref_silu_mul, add) ---------------------------------------------------- */

__global__ void k_silu_mul(float *g, const float *u, size_t n)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n) {
		float a = g[i];
		g[i] = a / (1.0f + expf(-a)) * u[i];
	}
}

__global__ void k_add(float *y, const float *x, size_t n)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n)
		y[i] += x[i];
}

extern "C" int wk_cuda_silu_mul(float *g, const float *u, size_t n, char *err, size_t errsz)
{
	if (n == 0)
		return WK_OK;
	k_silu_mul<<<blocks(n, 256), 256>>>(g, u, n);
	return launched("silu_mul", err, errsz);
}

extern "C" int wk_cuda_add(float *y, const float *x, size_t n, char *err, size_t errsz)
{
	if (n == 0)
		return WK_OK;
	k_add<<<blocks(n, 256), 256>>>(y, x, n);
	return launched("add", err, errsz);
}

/* ---- argmax (greedy sampling on the device): one block per row ------------------------------ */

__global__ void k_argmax(int *idx, const float *logits, int vocab)
{
	__shared__ float bv[32];
	__shared__ int bi[32];
	const float *r = logits + (size_t)blockIdx.x * vocab;
	float best = -INFINITY;
	int at = 0x7fffffff;
	for (int j = threadIdx.x; j < vocab; j += blockDim.x)
		if (r[j] > best) { /* strided ascending: the first of equals stays */
			best = r[j];
			at = j;
		}
	for (int o = 16; o > 0; o >>= 1) {
		float ob = __shfl_xor_sync(0xffffffffu, best, o);
		int oi = __shfl_xor_sync(0xffffffffu, at, o);
		if (ob > best || (ob == best && oi < at)) {
			best = ob;
			at = oi;
		}
	}
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) {
		bv[wid] = best;
		bi[wid] = at;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < nw; w++)
			if (bv[w] > best || (bv[w] == best && bi[w] < at)) {
				best = bv[w];
				at = bi[w];
			}
		idx[blockIdx.x] = at == 0x7fffffff ? 0 : at;
	}
}

extern "C" int wk_cuda_argmax(int *idx, const float *logits, int n, int vocab, char *err,
			      size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_argmax<<<n, 256>>>(idx, logits, vocab);
	return launched("argmax", err, errsz);
}
