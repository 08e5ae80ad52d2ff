/*
 * glm_kernels.cu - the GLM families' CUDA kernels of cuda_kernels.h: LayerNorm, the sigmoid
 * noaux_tc MoE router, row gather/scatter for expert batches, MLA absorption and attention,
 * and the DSA lightning indexer's exact top-k. First versions, written for correctness; each
 * has the contract of its CPU reference in kernels/cpu/glm_ref.c (named at each kernel), and
 * tests/unit/test_cuda_glm.c compares them on the same inputs wherever a GPU is present.
 *
 * Where the CPU reference makes a discrete choice (the router's experts, the indexer's
 * positions), the kernel reproduces its tie rule exactly, not just "a" top-k: the engine's
 * batching and the tests rely on identical indices.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_route.cuh"


/* ---- weights: element (r, c) of kv_b_proj as f32, as cpu_glm_row_f32 dequantizes it ---------- */

template <typename T>
__device__ __forceinline__ float wget(const T *w, const float *scale, int cols, size_t r, int c)
{
	(void)scale;
	return load_w(w, r * (size_t)cols + (size_t)c);
}

/* FP8: scale [ceil(rows/128)][ceil(cols/128)], one f32 per 128x128 block */
__device__ __forceinline__ float wget(const __nv_fp8_e4m3 *w, const float *scale, int cols,
				      size_t r, int c)
{
	size_t sc = ((size_t)cols + FP8_BLOCK - 1) / FP8_BLOCK;
	return load_w(w, r * (size_t)cols + (size_t)c) *
	       scale[(r / FP8_BLOCK) * sc + c / FP8_BLOCK];
}

/* ---- layernorm (cpu_ref_layernorm): one block per row ---------------------------------------- */

/* Two passes like the reference (mean, then the variance about it). In place is safe: each
 * thread writes only the elements it alone reads, after both reductions. */
__global__ void k_layernorm(float *y, const float *x, const float *w, const float *b, int dim,
			    float eps)
{
	grid_dep_launch(); /* a GEMV after it may start (kernels before a GEMV do this) */
	row_layernorm(y + (size_t)blockIdx.x * dim, x + (size_t)blockIdx.x * dim, w, b, dim, eps);
}

extern "C" int wk_cuda_layernorm(float *y, const float *x, const float *w, const float *b, int n,
				 int dim, float eps, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_layernorm<<<n, 256, 0, wk_st()>>>(y, x, w, b, dim, eps);
	return launched("layernorm", err, errsz);
}

/* ---- norm_n: several rmsnorms and layernorms in one launch, one block per row --------------- */

__global__ void k_norm_n(struct norm_set s)
{
	grid_dep_launch();
	norm_row(s, (int)blockIdx.x);
}

extern "C" int wk_cuda_norm_n(const struct wk_norm *r, int count, char *err, size_t errsz)
{
	struct norm_set s;
	int rc = norm_build(&s, r, count, err, errsz);
	if (rc != WK_OK || s.start[count] == 0)
		return rc;
	k_norm_n<<<s.start[count], 256, 0, wk_st()>>>(s);
	return launched("norm_n", err, errsz);
}

/* ---- moe_route (cpu_ref_moe_route): one block per token (moe_route.cuh) ---------------------- */

__global__ void k_moe_route(int *idx, float *wt, const float *logits, const float *bias,
			    int n_experts, int top_k, int n_group, int topk_group, bool norm,
			    float scale)
{
	route_token(idx, wt, logits, bias, n_experts, top_k, n_group, topk_group, norm, scale,
		    (int)blockIdx.x);
}

extern "C" int wk_cuda_moe_route_check(int n_experts, int top_k, int n_group, int topk_group,
				       char *err, size_t errsz)
{
	if (n_experts < 1 || n_experts > WK_CUDA_MOE_MAX_EXPERTS || n_group < 1 ||
	    n_experts % n_group != 0 || topk_group < 1 || topk_group > n_group || top_k < 0 ||
	    top_k > topk_group * (n_experts / n_group))
		return wk_errf(
			err, errsz, WK_EINVAL,
			"CUDA moe_route: %d experts in %d groups, top %d of the best %d groups "
			"(at most %d experts, in equal groups)",
			n_experts, n_group, top_k, topk_group, WK_CUDA_MOE_MAX_EXPERTS);
	return WK_OK;
}

extern "C" int wk_cuda_moe_route(int *idx, float *wt, const float *logits, const float *bias, int n,
				 int n_experts, int top_k, int n_group, int topk_group, bool norm,
				 float scale, char *err, size_t errsz)
{
	int rc = wk_cuda_moe_route_check(n_experts, top_k, n_group, topk_group, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (n <= 0 || top_k == 0)
		return WK_OK;
	k_moe_route<<<n, ROUTE_THREADS, 0, wk_st()>>>(idx, wt, logits, bias, n_experts, top_k, n_group,
					  topk_group, norm, scale);
	return launched("moe_route", err, errsz);
}

/* ---- gather_rows, scatter_add_rows (cpu_ref_gather_rows, _scatter_add_rows): a block per row - */

__global__ void k_gather_rows(float *dst, const float *src, const int *rows, int dim)
{
	const float *s = src + (size_t)rows[blockIdx.x] * dim;
	float *d = dst + (size_t)blockIdx.x * dim;
	for (int c = threadIdx.x; c < dim; c += blockDim.x)
		d[c] = s[c];
}

/* Block i adds row i into y[rows[i]], with no atomics: the rows must be distinct (see
 * cuda_kernels.h), and then the reference's "in order of i" does not matter. */
__global__ void k_scatter_add_rows(float *y, const float *x, const int *rows, const float *scale,
				   int dim)
{
	float *yr = y + (size_t)rows[blockIdx.x] * dim;
	const float *xr = x + (size_t)blockIdx.x * dim;
	float a = scale[blockIdx.x];
	for (int c = threadIdx.x; c < dim; c += blockDim.x)
		yr[c] += a * xr[c];
}

extern "C" int wk_cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int dim,
				   char *err, size_t errsz)
{
	if (n <= 0 || dim <= 0)
		return WK_OK;
	k_gather_rows<<<n, 256, 0, wk_st()>>>(dst, src, rows, dim);
	return launched("gather_rows", err, errsz);
}

extern "C" int wk_cuda_scatter_add_rows(float *y, const float *x, const int *rows,
					const float *scale, int n, int dim, char *err, size_t errsz)
{
	if (n <= 0 || dim <= 0)
		return WK_OK;
	k_scatter_add_rows<<<n, 256, 0, wk_st()>>>(y, x, rows, scale, dim);
	return launched("scatter_add_rows", err, errsz);
}

/* ---- MLA absorption (cpu_ref_mla_absorb_q, cpu_ref_mla_absorb_out) --------------------------- */

#define ABSORB_TOK 8 /* tokens per block of k_absorb_q, accumulated in registers */
#define ABSORB_THREADS 128
#define MAX_GRID_YZ 65535 /* gridDim.y and .z limit */

/* Latent column c of qa for m <= M tokens (q and qa advance by qstride and ostride from one
 * token to the next): qa[t][c] = sum_d q[t][d] * W[r0 + d][c], d = 0 .. d_nope-1 in the
 * reference's order, each token's sum on its own. absorb_q_block computes each element
 * with it, whichever block runs it, so k_absorb_q and k_mla_absorbed agree bit for bit. */
template <typename T, int M>
__device__ __forceinline__ void absorb_q_col(float *oh, size_t ostride, const float *qh,
					     size_t qstride, int m, const T *w, const float *scale,
					     int lora, size_t r0, int d_nope, int c)
{
	float acc[M];
#pragma unroll
	for (int t = 0; t < M; t++)
		acc[t] = 0.0f;
#pragma unroll 8 /* the rows' weights loaded ahead of the sums (their order unchanged) */
	for (int d = 0; d < d_nope; d++) {
		float wv = wget(w, scale, lora, r0 + d, c);
#pragma unroll
		for (int t = 0; t < M; t++)
			if (t < m)
				acc[t] += qh[t * qstride + d] * wv;
	}
#pragma unroll
	for (int t = 0; t < M; t++)
		if (t < m)
			oh[t * ostride + c] = acc[t];
}

/* The decode step's absorb_q (one token, m == 1) for the block's columns c0 .. c0 +
 * blockDim.x - 1 of qa's latent part (none past lora), head h; every thread of the block
 * calls it, blockDim.x a multiple of 128 (k_absorb_q's 128, mla_absorbed's 256). Each warp
 * takes 128 columns, 4 adjacent ones a lane (one load of 4 weights: 128 bytes a warp a row in
 * FP8, where a thread a column loaded 32), and one of AQ_RG groups of W_uk,h's d_nope rows, so
 * that AQ_RG times as many rows are in flight; the groups' sums meet in shared memory, added
 * in group order, so each column's sum is the same whichever of the two kernels runs it. Each
 * weight times its block's scale, as wget. Needs lora % 4 == 0 and w 16-byte aligned. */
#define AQ_RG 4
#define AQ_COLS 256 /* the most columns a block: MLA_THREADS */

/* 4 weights at p (4 * sizeof(T)-byte aligned) in the low bytes of a uint4, read-only */
template <typename T>
__device__ __forceinline__ uint4 ld_w4(const T *p)
{
	uint4 v = {0u, 0u, 0u, 0u};
#ifdef WICK_SIMT
	if ((uintptr_t)p % (4 * sizeof(T))) {
		fprintf(stderr, "glm_kernels.cu: a %zu-byte load from %p, misaligned\n",
			4 * sizeof(T), (const void *)p);
		abort();
	}
	simt_ld_nc(&v, p, 4 * sizeof(T));
#else
	if constexpr (sizeof(T) == 1) {
		v.x = __ldg((const unsigned *)p);
	} else if constexpr (sizeof(T) == 2) {
		uint2 u = __ldg((const uint2 *)p);
		v.x = u.x;
		v.y = u.y;
	} else {
		v = __ldg((const uint4 *)p);
	}
#endif
	return v;
}

template <typename T>
__device__ __forceinline__ void absorb_q_quad(float *oh, const float *qh, const T *w,
					      const float *scale, int lora, size_t r0, int d_nope,
					      int c0)
{
	__shared__ float part[AQ_RG][AQ_COLS];
	const T *tag = NULL;
	int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
	int cg = warp / AQ_RG, rg = warp % AQ_RG, cb = 128 * cg + 4 * lane, c = c0 + cb;
	int per = (d_nope + AQ_RG - 1) / AQ_RG, d0 = rg * per, d1 = min(d0 + per, d_nope);
	size_t nb = ((size_t)lora + FP8_BLOCK - 1) / FP8_BLOCK;
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	if (c < lora) {
#pragma unroll 8
		for (int d = d0; d < d1; d++) {
			const T *wp = w + (r0 + d) * (size_t)lora + c;
			uint4 v = ld_w4(wp);
			float f[4], sc = 1.0f, qv = qh[d];
			quad(v, 0, f, tag);
			if constexpr (mm_fp8<T>::v)
				sc = scale[((r0 + d) / FP8_BLOCK) * nb + c / FP8_BLOCK];
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[e] += qv * (mm_fp8<T>::v ? f[e] * sc : f[e]);
		}
	}
#pragma unroll
	for (int e = 0; e < 4; e++)
		part[rg][cb + e] = acc[e];
	__syncthreads();
	int t = (int)threadIdx.x;
	if (c0 + t < lora) {
		float sum = 0.0f;
#pragma unroll
		for (int k = 0; k < AQ_RG; k++)
			sum += part[k][t];
		oh[c0 + t] = sum;
	}
	__syncthreads(); /* part is the next call's */
}

/* A thread's column c of qa's latent part (none past lora), head h, token chunks z, z +
 * zstep, ... of ABSORB_TOK tokens:
 *   qa[i][h][c] = sum_d q[i][h][d] * W[h*(d_nope+d_v) + d][c].
 * A chunk of one token (a decode step's) goes through absorb_q_quad where lora and w allow
 * (the whole block: 4 columns a lane, the rows in AQ_RG groups); otherwise each thread walks
 * W_uk,h's d_nope rows down its column c (reads coalesced across the block) for the chunk's
 * tokens, in the reference's order of d. pe: the block also copies q_pe.
 * k_absorb_q's block (x, y, z): columns x*128 + thread, head h0 + y, chunks z, z + gridDim.z,
 * ... */
template <typename T>
__device__ __forceinline__ void absorb_q_block(float *qa, const float *q, const T *w,
					       const float *scale, int lora, int n, int n_heads,
					       int d_nope, int d_rope, int d_v, int h, int c,
					       bool pe, int z, int zstep)
{
	size_t r0 = (size_t)h * (d_nope + d_v);
	size_t qstride = (size_t)n_heads * (d_nope + d_rope); /* one token to the next, in q */
	for (int i0 = z * ABSORB_TOK; i0 < n; i0 += zstep * ABSORB_TOK) {
		int m = min(ABSORB_TOK, n - i0);
		const float *qh = q + ((size_t)i0 * n_heads + h) * (d_nope + d_rope);
		float *oh = qa + ((size_t)i0 * n_heads + h) * (lora + d_rope);
		size_t ostride = (size_t)n_heads * (lora + d_rope);
		if (m == 1 && lora % 4 == 0 && (uintptr_t)w % 16 == 0) /* block-uniform */
			absorb_q_quad<T>(oh, qh, w, scale, lora, r0, d_nope, c - (int)threadIdx.x);
		else if (c < lora && m == 1) /* no registers for 7 more tokens */
			absorb_q_col<T, 1>(oh, ostride, qh, qstride, m, w, scale, lora, r0, d_nope,
					   c);
		else if (c < lora)
			absorb_q_col<T, ABSORB_TOK>(oh, ostride, qh, qstride, m, w, scale, lora, r0,
						    d_nope, c);
		if (pe)
			for (int t = 0; t < m; t++)
				for (int d = threadIdx.x; d < d_rope; d += blockDim.x)
					oh[t * ostride + lora + d] = qh[t * qstride + d_nope + d];
	}
}

template <typename T>
__global__ void k_absorb_q(float *qa, const float *q, const T *w, const float *scale, int lora,
			   int n, int n_heads, int d_nope, int d_rope, int d_v, int h0)
{
	absorb_q_block<T>(qa, q, w, scale, lora, n, n_heads, d_nope, d_rope, d_v,
			  h0 + (int)blockIdx.y, (int)(blockIdx.x * blockDim.x + threadIdx.x),
			  blockIdx.x == 0, (int)blockIdx.z, (int)gridDim.z);
}

/* W[r] . l over lora columns by one warp, every lane getting the dot; k_absorb_out and
 * k_mla_absorbed both compute each output with it. Where W's rows are whole 16-byte chunks
 * and both are 16-byte aligned (GLM-5's lora of 512: an FP8 row is one 512-byte load of the
 * warp), each lane streams chunks k = lane, lane + 32, ... (16 e4m3, 8 bf16 or f16, 4 f32
 * weights; past L1, which keeps l) and sums its chunk's products before the FP8 block's
 * scale; l is read with plain loads (mla_absorbed's stage B wrote it in the same launch).
 * Otherwise a lane takes columns c = lane, lane + 32, ... one weight at a time, each times
 * its scale. The lanes' sums then meet across the warp. */
template <typename T>
__device__ __forceinline__ float absorb_out_dot(const float *l, const T *w, const float *scale,
						int lora, size_t r, int lane)
{
	constexpr int E = 16 / (int)sizeof(T);
	const T *wr = w + r * (size_t)lora;
	float acc = 0.0f;
	if (lora % E == 0 && ((uintptr_t)wr % 16) == 0 && ((uintptr_t)l % 16) == 0) {
		const T *tag = NULL;
		size_t nb = ((size_t)lora + FP8_BLOCK - 1) / FP8_BLOCK;
		const float *srow = mm_fp8<T>::v ? scale + (r / FP8_BLOCK) * nb : NULL;
		for (int k = lane; k < lora / E; k += 32) {
			uint4 v = ld_stream16(wr + (size_t)k * E);
			float p = 0.0f;
#pragma unroll
			for (int q = 0; q < E / 4; q++) {
				float f[4], xv[4];
				quad(v, q, f, tag);
				ld_x4<true>(xv, l + (size_t)k * E + 4 * q);
#pragma unroll
				for (int e = 0; e < 4; e++)
					p = fmaf(f[e], xv[e], p);
			}
			acc += srow ? p * srow[k * E / FP8_BLOCK] : p;
		}
		return warp_sum(acc);
	}
	for (int c = lane; c < lora; c += 32)
		acc += l[c] * wget(w, scale, lora, r, c);
	return warp_sum(acc);
}

/* Warp gw of (head h = h0 + gw / d_v, value row d = gw % d_v): o[i][h][d] =
 * W[h*(d_nope+d_v) + d_nope + d] . lat[i][h] for every token i (the row stays in L1/L2 after
 * the first token). k_absorb_out: one warp a (head, row). */
template <typename T>
__device__ __forceinline__ void absorb_out_warp(float *o, const float *lat, const T *w,
						const float *scale, int lora, int n, int n_heads,
						int d_nope, int d_v, int h0, size_t gw, int lane)
{
	int h = h0 + (int)(gw / d_v), d = (int)(gw % d_v);
	size_t r = (size_t)h * (d_nope + d_v) + d_nope + d;
	for (int i = 0; i < n; i++) {
		const float *l = lat + ((size_t)i * n_heads + h) * lora;
		float acc = absorb_out_dot(l, w, scale, lora, r, lane);
		if (lane == 0)
			o[((size_t)i * n_heads + h) * d_v + d] = acc;
	}
}

template <typename T>
__global__ void k_absorb_out(float *o, const float *lat, const T *w, const float *scale, int lora,
			     int n, int n_heads, int d_nope, int d_v, int h0, int h1)
{
	size_t gw = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	if (gw < (size_t)(h1 - h0) * d_v) /* whole warps leave together: gw is per warp */
		absorb_out_warp<T>(o, lat, w, scale, lora, n, n_heads, d_nope, d_v, h0, gw,
				   threadIdx.x & 31);
}

/* Shared checks of the two absorb calls; WK_OK or WK_EINVAL. */
static int absorb_args(const char *what, enum dt_type wt, const float *scale, int lora, int n_heads,
		       int h0, int h1, char *err, size_t errsz)
{
	if (wt != DT_F32 && wt != DT_BF16 && wt != DT_F16 && wt != DT_F8_E4M3)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "CUDA %s: kv_b in %s", what,
			       dt_name(wt));
	if (wt == DT_F8_E4M3 && !scale)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: FP8 kv_b without its scales", what);
	if (lora <= 0 || h0 < 0 || h1 > n_heads || h1 - h0 > MAX_GRID_YZ)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: heads %d..%d of %d, lora %d", what,
			       h0, h1, n_heads, lora);
	return WK_OK;
}

template <typename T>
static void absorb_q_launch(float *qa, const float *q, const void *w, const float *scale, int lora,
			    int n, int n_heads, int d_nope, int d_rope, int d_v, int h0, int h1)
{
	int chunks = (n + ABSORB_TOK - 1) / ABSORB_TOK;
	dim3 grid(blocks((size_t)lora, ABSORB_THREADS), (unsigned)(h1 - h0),
		  (unsigned)(chunks < MAX_GRID_YZ ? chunks : MAX_GRID_YZ));
	k_absorb_q<T><<<grid, ABSORB_THREADS, 0, wk_st()>>>(qa, q, (const T *)w, scale, lora, n, n_heads,
						d_nope, d_rope, d_v, h0);
}

template <typename T>
static void absorb_out_launch(float *o, const float *lat, const void *w, const float *scale,
			      int lora, int n, int n_heads, int d_nope, int d_v, int h0, int h1)
{
	k_absorb_out<T><<<blocks((size_t)(h1 - h0) * d_v * 32, 256), 256, 0, wk_st()>>>(
		o, lat, (const T *)w, scale, lora, n, n_heads, d_nope, d_v, h0, h1);
}

extern "C" int wk_cuda_mla_absorb_q(float *qa, const float *q, const void *w, enum dt_type wt,
				    const float *scale, int lora, int n, int n_heads, int d_nope,
				    int d_rope, int d_v, int h0, int h1, char *err, size_t errsz)
{
	int rc = absorb_args("mla_absorb_q", wt, scale, lora, n_heads, h0, h1, err, errsz);
	if (rc != WK_OK || n <= 0 || h1 <= h0)
		return rc;
	switch (wt) {
	case DT_F32:
		absorb_q_launch<float>(qa, q, w, scale, lora, n, n_heads, d_nope, d_rope, d_v, h0,
				       h1);
		break;
	case DT_BF16:
		absorb_q_launch<__nv_bfloat16>(qa, q, w, scale, lora, n, n_heads, d_nope, d_rope,
					       d_v, h0, h1);
		break;
	case DT_F16:
		absorb_q_launch<__half>(qa, q, w, scale, lora, n, n_heads, d_nope, d_rope, d_v, h0,
					h1);
		break;
	default: /* DT_F8_E4M3, checked above */
		absorb_q_launch<__nv_fp8_e4m3>(qa, q, w, scale, lora, n, n_heads, d_nope, d_rope,
					       d_v, h0, h1);
	}
	return launched("mla_absorb_q", err, errsz);
}

extern "C" int wk_cuda_mla_absorb_out(float *o, const float *lat, const void *w, enum dt_type wt,
				      const float *scale, int lora, int n, int n_heads, int d_nope,
				      int d_v, int h0, int h1, char *err, size_t errsz)
{
	int rc = absorb_args("mla_absorb_out", wt, scale, lora, n_heads, h0, h1, err, errsz);
	if (rc != WK_OK || n <= 0 || h1 <= h0 || d_v <= 0)
		return rc;
	switch (wt) {
	case DT_F32:
		absorb_out_launch<float>(o, lat, w, scale, lora, n, n_heads, d_nope, d_v, h0, h1);
		break;
	case DT_BF16:
		absorb_out_launch<__nv_bfloat16>(o, lat, w, scale, lora, n, n_heads, d_nope, d_v,
						 h0, h1);
		break;
	case DT_F16:
		absorb_out_launch<__half>(o, lat, w, scale, lora, n, n_heads, d_nope, d_v, h0, h1);
		break;
	default:
		absorb_out_launch<__nv_fp8_e4m3>(o, lat, w, scale, lora, n, n_heads, d_nope, d_v,
						 h0, h1);
	}
	return launched("mla_absorb_out", err, errsz);
}

/* ---- mla_attention (cpu_ref_mla_attention): blocks of (token, heads, part of the keys) ------- */

#define MLA_THREADS 256
static_assert(MLA_THREADS <= AQ_COLS && MLA_THREADS % 128 == 0 && ABSORB_THREADS % 128 == 0,
	      "absorb_q_quad's blocks");
#define MLA_TILE 64 /* keys scored per step */
#define MLA_GM 8    /* heads a block at most (of a latent that every head reads) */
#define MLA_SMEM_MAX (48 * 1024) /* shared memory of a block without an opt-in */
#define MLA_SPLIT_MIN (2 * MLA_TILE) /* keys a split part scores at least */
#define MLA_SYNC 4 /* k_mla_absorbed's counters before its parts' */
#define MLA_STATIC 16 /* the kernels' static shared memory (ptxas: 16 bytes for their ints) */

/* Online softmax over tiles of MLA_TILE keys, so any number of keys fits, for nh heads of
 * token i at once (more than one only where every head reads the same latent rows: s.ka_head
 * and s.v_head 0, the absorbed layout, where each key and value is then read once for all):
 *   1. each warp scores keys of the tile (q . [k_a | k_b] * scale, lanes over dimensions,
 *      each key element loaded once for the nh queries);
 *   2. thread g < nh raises head g's running max m[g] to mn over the tile's scores and keeps
 *      corr[g] = exp(m - mn); the scores become p = exp(score - mn);
 *   3. thread d (and d + 256, ...) adds sum_j p[g][j] v_j[d] to the running output acc[g][d]
 *      of every head g, each value loaded once; thread g < nh keeps l[g], the denominator.
 * Each head's sums run in the same order whatever nh, so nh changes no result.
 * Shared memory (all dynamic, mla_smem_of): q [nh][d_a + d_b], acc [nh][d_v], p [nh][MLA_TILE],
 * m, l and corr [nh], the tile's key positions tk [MLA_TILE].
 * The block runs part sp of split of the token's keys (part_keys); split > 1: it leaves its
 * m, l and acc in part and the last of the split blocks, counted on *c, merges them
 * (part_put, part_merge). Every thread calls it; *last: an int of the block's shared memory.
 * KV: the cache's elements (s.k_a, s.v), float, bf16 bits or e4m3 (kv_rc; FP8: rows d_a wide
 * with their scales s.a_s, v is k_a); s.k_b's are kv_b<KV>'s. */
template <typename KV>
__device__ void mla_attend(float *sm, int *last, float *out, const float *q,
			   const struct cpu_mla &s, int pos0, int i, int h0, int nh, int split,
			   int sp, float *part, unsigned *c)
{
	int dq = s.d_a + s.d_b, dv = s.d_v;
	float *qs = sm, *acc = qs + (size_t)nh * dq, *p = acc + (size_t)nh * dv;
	float *ms = p + nh * MLA_TILE, *ls = ms + nh, *cr = ls + nh;
	int *tk = (int *)(cr + nh);
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int *keys = s.sel ? s.sel + (size_t)i * s.sel_stride : NULL;
	int k0, k1;
	part_keys(s.sel ? s.nsel[i] : (s.seq ? s.pos[i] : pos0 + i) + 1, MLA_TILE, split, sp, &k0,
		  &k1);
	size_t base = s.seq ? (size_t)s.seq[i] * s.seq_rows : 0; /* the token's sequence's rows */
	const KV *ka0 = (const KV *)s.k_a + (size_t)h0 * s.ka_head;
	const KV *v0 = (const KV *)s.v + (size_t)h0 * s.v_head;
	typedef typename kv_b<KV>::t KB;
	for (int x = threadIdx.x; x < nh * dq; x += blockDim.x)
		qs[x] = q[((size_t)i * s.n_heads + h0 + x / dq) * dq + x % dq];
	for (int x = threadIdx.x; x < nh * dv; x += blockDim.x)
		acc[x] = 0.0f;
	if (threadIdx.x < nh) {
		ms[threadIdx.x] = -INFINITY;
		ls[threadIdx.x] = 0.0f;
	}
	for (int j0 = k0; j0 < k1; j0 += MLA_TILE) { /* block-uniform loop */
		int cnt = min(MLA_TILE, k1 - j0);
		__syncthreads(); /* qs, acc, ms and ls written; the last tile's p and tk read */
		for (int j = threadIdx.x; j < cnt; j += blockDim.x)
			tk[j] = keys ? keys[j0 + j] : j0 + j;
		__syncthreads(); /* tk written */
		for (int j = wid; j < cnt; j += nw) { /* warp-uniform loop */
			size_t t = base + (size_t)tk[j];
			const KV *ka = ka0 + t * s.ka_stride;
			const KB *kb = (const KB *)s.k_b + t * s.kb_stride;
			const float *as = kv_scales(s.a_s, t, s.d_a);
			float pt[MLA_GM];
#pragma unroll
			for (int g = 0; g < MLA_GM; g++)
				pt[g] = 0.0f;
			for (int d = lane; d < s.d_a; d += 32) {
				float kd = kv_rc(ka, as, d);
#pragma unroll
				for (int g = 0; g < MLA_GM; g++)
					if (g < nh)
						pt[g] += qs[g * dq + d] * kd;
			}
			for (int d = lane; d < s.d_b; d += 32) {
				float kd = kv_ld(kb, d);
#pragma unroll
				for (int g = 0; g < MLA_GM; g++)
					if (g < nh)
						pt[g] += qs[g * dq + s.d_a + d] * kd;
			}
#pragma unroll
			for (int g = 0; g < MLA_GM; g++)
				if (g < nh) { /* block-uniform */
					float sc = warp_sum(pt[g]);
					if (lane == 0)
						p[g * MLA_TILE + j] = sc * s.scale;
				}
		}
		__syncthreads(); /* scores written */
		tile_softmax(p, ms, ls, cr, nh, cnt, MLA_TILE);
		for (int d = threadIdx.x; d < dv; d += blockDim.x) {
			float a[MLA_GM];
#pragma unroll
			for (int g = 0; g < MLA_GM; g++)
				a[g] = g < nh ? acc[g * dv + d] * cr[g] : 0.0f;
			for (int j = 0; j < cnt; j++) {
				size_t t = base + (size_t)tk[j];
				const float *vs = kv_scales(s.a_s, t, s.d_a);
				float vd = kv_rc(v0 + t * s.v_stride, vs, d);
#pragma unroll
				for (int g = 0; g < MLA_GM; g++)
					if (g < nh)
						a[g] += p[g * MLA_TILE + j] * vd;
			}
#pragma unroll
			for (int g = 0; g < MLA_GM; g++)
				if (g < nh)
					acc[g * dv + d] = a[g]; /* only this thread touches it */
		}
	}
	__syncthreads(); /* ls and acc written */
	size_t row0 = (size_t)i * s.n_heads + h0;
	if (split == 1) { /* no keys (nsel 0): 0/0, NaN, as the reference */
		for (int x = threadIdx.x; x < nh * dv; x += blockDim.x)
			out[(row0 + x / dv) * dv + x % dv] = acc[x] / ls[x / dv];
		return;
	}
	if (part_put(part, row0, split, sp, nh, dv, acc, ms, ls, c, last))
		part_merge(out, part, row0, split, nh, dv);
}

/* Block (x, y, z): token i0 + x, heads h0 + y * gm .. (up to gm of them, before h1), part z
 * of split (counted on count[x * gridDim.y + y]). */
template <typename KV>
__global__ void __launch_bounds__(MLA_THREADS, 2) k_mla_attention(float *out, const float *q,
							       struct cpu_mla s, int pos0, int i0,
							       int h0, int h1, int gm, int split,
							       float *part, unsigned *count)
{
	extern __shared__ float sm[];
	__shared__ int last;
	grid_dep_launch();
	int hs = h0 + (int)blockIdx.y * gm;
	mla_attend<KV>(sm, &last, out, q, s, pos0, i0 + (int)blockIdx.x, hs, min(gm, h1 - hs),
		       split, (int)blockIdx.z, part, count + blockIdx.x * gridDim.y + blockIdx.y);
}

/* The dynamic shared memory of mla_attend for gm heads a block, and 4 floats of slack (as
 * att_smem's). */
static size_t mla_smem_of(int gm, const struct cpu_mla *s)
{
	return ((size_t)gm * ((size_t)s->d_a + s->d_b + s->d_v + MLA_TILE + 3) + MLA_TILE + 4) *
	       sizeof(float);
}

/* Checks *s for mla_attend; WK_EINVAL, naming what, for a cache of another type than f32,
 * bf16 and FP8, an FP8 one outside struct cpu_mla's contract (no scales, v not k_a's layout),
 * or one head past a block's shared memory (and the kernels' static ints). */
static int mla_check(const char *what, const struct cpu_mla *s, char *err, size_t errsz)
{
	if (s->kv != DT_F32 && s->kv != DT_BF16 && s->kv != DT_F8_E4M3)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: a %s KV cache (f32, bf16 or fp8)",
			       what, dt_name(s->kv));
	if (s->kv == DT_F8_E4M3 &&
	    (!s->a_s || s->d_v != s->d_a || s->ka_head || s->v_head ||
	     s->ka_stride != (size_t)s->d_a || s->v_stride != (size_t)s->d_a))
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: an fp8 latent takes its scales "
			       "and v as k_a, rows d_a %d wide (d_v %d)", what, s->d_a, s->d_v);
	if (s->d_a < 0 || s->d_b < 0 || s->d_v < 0 ||
	    mla_smem_of(1, s) + MLA_STATIC > MLA_SMEM_MAX)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA %s: d_a %d + d_b %d + d_v %d floats (this kernel holds up to "
			       "%d in shared memory)",
			       what, s->d_a, s->d_b, s->d_v,
			       (int)((MLA_SMEM_MAX - MLA_STATIC) / sizeof(float)) -
				       (2 * MLA_TILE + 7));
	return WK_OK;
}

/* How a call of n tokens and nh heads over *s runs (whose longest query has keys keys; < 0:
 * any number): *gm heads a block (up to MLA_GM where every head reads the same latent rows,
 * fewer where the blocks would not fill the device, or would not fit shared memory) and
 * each query's keys in *split parts (enough blocks to fill the device, each part at least
 * MLA_SPLIT_MIN keys, at most ATT_SPLIT_MAX parts). A function of its arguments (and of
 * wk_cuda_mla_force's setting), so that mla_attention and mla_absorbed split alike. */
static int mla_gm_forced; /* wk_cuda_mla_force: 0, or the heads a block wanted */

static void mla_plan(const struct cpu_mla *s, int n, int nh, long keys, int *gm, int *split)
{
	long smax = split_max(keys, MLA_SPLIT_MIN);
	int g = s->ka_head || s->v_head ? 1 : mla_gm_forced ? mla_gm_forced : MLA_GM;
	while (g > 1 && mla_smem_of(g, s) + MLA_STATIC > MLA_SMEM_MAX)
		g /= 2;
	while (!mla_gm_forced && g > 1 && (long)n * ((nh + g - 1) / g) * smax < ATT_FILL)
		g /= 2;
	*gm = g;
	*split = split_parts((long)n * ((nh + g - 1) / g), smax);
}

/* The keys of the longest query of tokens up to i1 at pos0 (pos0 < 0: any number; several
 * sequences: s->keys_max, any number where it is not given). */
static long mla_keys(const struct cpu_mla *s, int i1, int pos0)
{
	if (pos0 < 0 || (s->seq && s->keys_max <= 0))
		return -1;
	long dense = s->seq ? s->keys_max : (long)pos0 + i1;
	return s->sel && s->sel_stride < dense ? s->sel_stride : dense;
}

extern "C" void wk_cuda_mla_force(int gm)
{
	mla_gm_forced = gm == 1 || gm == 2 || gm == 4 || gm == MLA_GM ? gm : 0;
}

extern "C" void wk_cuda_mla_shape(const struct cpu_mla *s, int n, int nh, int pos0, int *gm,
				  int *split)
{
	mla_plan(s, n, nh, mla_keys(s, n, pos0), gm, split);
}

extern "C" size_t wk_cuda_mla_part(const struct cpu_mla *s, int n, int pos0)
{
	int gm, split;
	if (n < 1 || s->n_heads < 1 || s->d_v < 0)
		return 0;
	mla_plan(s, n, s->n_heads, mla_keys(s, n, pos0), &gm, &split);
	return split > 1 ? (size_t)n * s->n_heads * split * ((size_t)s->d_v + 2) : 0;
}

extern "C" int wk_cuda_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n,
				     int pos0, int i0, int i1, int h0, int h1,
				     const struct wk_att_split *sp, char *err, size_t errsz)
{
	int rc = mla_check("mla_attention", s, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (i0 < 0 || h0 < 0 || h1 > s->n_heads || h1 - h0 > MAX_GRID_YZ)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA mla_attention: tokens %d..%d, heads %d..%d of %d", i0, i1, h0,
			       h1, s->n_heads);
	if (i1 <= i0 || h1 <= h0 || s->d_v == 0)
		return WK_OK;
	if (wk_cuda_mla_tiles(s, n, pos0, i0, i1, h0, h1)) /* the expanded form's dense prefill */
		return wk_cuda_mla_tiled(out, q, s, n, pos0, err, errsz);
	if (wk_cuda_mla_latent_tiles(s, n, pos0, i0, i1, h0, h1)) /* the absorbed form's prefill */
		return wk_cuda_mla_latent(out, q, s, n, pos0, err, errsz);
	int gm, split;
	mla_plan(s, i1 - i0, h1 - h0, mla_keys(s, i1, pos0), &gm, &split);
	int chunks = (h1 - h0 + gm - 1) / gm;
	split = split_fit(split, sp, (size_t)i1 * s->n_heads * ((size_t)s->d_v + 2),
			  (long)(i1 - i0) * chunks, 0);
	dim3 grid((unsigned)(i1 - i0), (unsigned)chunks, (unsigned)split);
	size_t smem = mla_smem_of(gm, s);
	float *part = split > 1 ? sp->part : NULL;
	unsigned *count = split > 1 ? sp->count : NULL;
	if (s->kv == DT_F8_E4M3)
		k_mla_attention<__nv_fp8_e4m3><<<grid, MLA_THREADS, smem, wk_st()>>>(
			out, q, *s, pos0, i0, h0, h1, gm, split, part, count);
	else if (s->kv == DT_BF16)
		k_mla_attention<uint16_t><<<grid, MLA_THREADS, smem, wk_st()>>>(
			out, q, *s, pos0, i0, h0, h1, gm, split, part, count);
	else
		k_mla_attention<float><<<grid, MLA_THREADS, smem, wk_st()>>>(
			out, q, *s, pos0, i0, h0, h1, gm, split, part, count);
	return launched("mla_attention", err, errsz);
}

/* ---- mla_absorbed: absorb_q, mla_attention and absorb_out in one launch --------------------- */

struct mla_abs {
	float *o, *qa, *lat;
	const float *q;
	const void *w;
	const float *scale;
	int lora, n, pos0, d_nope, d_v, gm, chunks, split;
	int ax, na, nb, nc; /* absorb_q's column blocks; the stages' blocks */
	float *part;
	unsigned *sync; /* MLA_SYNC counters, then the parts' */
};

/* Three stages of one launch (wait_blocks), each spread over the device:
 *   A. qa = absorb_q(q): na blocks of (MLA_THREADS latent columns, head, ABSORB_TOK tokens),
 *      absorb_q_block as k_absorb_q runs it;
 *   B. lat = the latent attention over qa: nb blocks of (token, heads, part), mla_attend as
 *      k_mla_attention runs it with the same gm and split (the merge is done before the
 *      block counts itself done);
 *   C. o = absorb_out(lat): nc blocks of MLA_THREADS / 32 warps of (head, value row),
 *      absorb_out_warp as k_absorb_out runs it.
 * So qa, lat and o equal the three kernels' bit for bit. sync: [0] the next ticket, [1], [2]
 * the finished blocks of A and B, [3] all finished blocks, the last of which zeroes them for
 * the next launch; then the parts' counters. s: the latent attention, d_a = d_v = lora, d_b
 * = d_rope. */
template <typename T, typename KV>
__global__ void __launch_bounds__(MLA_THREADS, 2) k_mla_absorbed(struct mla_abs a,
							      struct cpu_mla s)
{
	extern __shared__ float sm[];
	__shared__ int s_ticket, last;
	grid_dep_launch();
	if (threadIdx.x == 0)
		s_ticket = (int)atomicAdd(&a.sync[0], 1u);
	__syncthreads();
	int t = s_ticket, H = s.n_heads;
	const T *w = (const T *)a.w;
	if (t < a.na) {
		int x = t % a.ax, h = t / a.ax % H, z = t / a.ax / H;
		absorb_q_block<T>(a.qa, a.q, w, a.scale, a.lora, a.n, H, a.d_nope, s.d_b, a.d_v, h,
				  x * MLA_THREADS + (int)threadIdx.x, x == 0, z,
				  (a.n + ABSORB_TOK - 1) / ABSORB_TOK);
	} else if (t < a.na + a.nb) {
		wait_blocks(&a.sync[1], (unsigned)a.na);
		int b = t - a.na, sp = b % a.split, chunk = b / a.split % a.chunks;
		int i = b / a.split / a.chunks, hs = chunk * a.gm;
		mla_attend<KV>(sm, &last, a.lat, a.qa, s, a.pos0, i, hs, min(a.gm, H - hs),
			       a.split, sp, a.part, a.sync + MLA_SYNC + i * a.chunks + chunk);
	} else {
		wait_blocks(&a.sync[2], (unsigned)a.nb);
		size_t gw = (size_t)(t - a.na - a.nb) * (MLA_THREADS / 32) + (threadIdx.x >> 5);
		if (gw < (size_t)H * a.d_v) /* whole warps: gw is per warp */
			absorb_out_warp<T>(a.o, a.lat, w, a.scale, a.lora, a.n, H, a.d_nope,
					   a.d_v, 0, gw, threadIdx.x & 31);
	}
	__syncthreads(); /* the block's writes are done */
	if (threadIdx.x == 0) {
		__threadfence(); /* release: they are visible before the count moves */
		if (t < a.na + a.nb)
			atomicAdd(&a.sync[t < a.na ? 1 : 2], 1u);
		if (atomicAdd(&a.sync[3], 1u) == (unsigned)(a.na + a.nb + a.nc) - 1)
			for (int k = 0; k < MLA_SYNC; k++) /* no block is left to read them */
				a.sync[k] = 0;
	}
}

template <typename T>
static void absorbed_launch(const struct mla_abs &a, const struct cpu_mla *s, size_t smem)
{
	unsigned g = (unsigned)(a.na + a.nb + a.nc);
	if (s->kv == DT_F8_E4M3)
		k_mla_absorbed<T, __nv_fp8_e4m3><<<g, MLA_THREADS, smem, wk_st()>>>(a, *s);
	else if (s->kv == DT_BF16)
		k_mla_absorbed<T, uint16_t><<<g, MLA_THREADS, smem, wk_st()>>>(a, *s);
	else
		k_mla_absorbed<T, float><<<g, MLA_THREADS, smem, wk_st()>>>(a, *s);
}

extern "C" int wk_cuda_mla_absorbed(float *o, float *qa, float *lat, const float *q,
				    const void *w, enum dt_type wt, const float *scale, int lora,
				    const struct cpu_mla *s, int n, int pos0, int d_nope, int d_v,
				    const struct wk_att_split *sp, char *err, size_t errsz)
{
	int H = s->n_heads;
	int rc = absorb_args("mla_absorbed", wt, scale, lora, H, 0, H, err, errsz);
	if (rc != WK_OK || (rc = mla_check("mla_absorbed", s, err, errsz)) != WK_OK)
		return rc;
	if (s->d_a != lora || s->d_v != lora || d_nope < 0 || d_v < 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA mla_absorbed: the latent attention's d_a %d and d_v %d must "
			       "both be kv_b's lora %d (d_nope %d, d_v %d)",
			       s->d_a, s->d_v, lora, d_nope, d_v);
	if (n <= 0 || H <= 0)
		return WK_OK;
	/* three launches where there are no counters, or where the attention is a prefill's
	 * latent tiles (wk_cuda_mla_attention runs them) */
	if (!sp || !sp->count || sp->count_n < MLA_SYNC ||
	    wk_cuda_mla_latent_tiles(s, n, pos0, 0, n, 0, H)) {
		if ((rc = wk_cuda_mla_absorb_q(qa, q, w, wt, scale, lora, n, H, d_nope, s->d_b, d_v,
					       0, H, err, errsz)) != WK_OK ||
		    (rc = wk_cuda_mla_attention(lat, qa, s, n, pos0, 0, n, 0, H, sp, err, errsz)) !=
			    WK_OK)
			return rc;
		return wk_cuda_mla_absorb_out(o, lat, w, wt, scale, lora, n, H, d_nope, d_v, 0, H,
					      err, errsz);
	}
	struct mla_abs a = {o, qa, lat, q, w, scale, lora, n, pos0, d_nope, d_v, 0, 0, 0,
			    0, 0, 0, 0, NULL, sp->count};
	mla_plan(s, n, H, mla_keys(s, n, pos0), &a.gm, &a.split);
	a.chunks = (H + a.gm - 1) / a.gm;
	a.split = split_fit(a.split, sp, (size_t)n * H * ((size_t)lora + 2), (long)n * a.chunks,
			    MLA_SYNC);
	a.ax = (int)blocks((size_t)lora, MLA_THREADS);
	long na = (long)a.ax * H * ((n + ABSORB_TOK - 1) / ABSORB_TOK);
	long nb = (long)n * a.chunks * a.split;
	long nc = ((long)H * d_v + MLA_THREADS / 32 - 1) / (MLA_THREADS / 32);
	if (na + nb + nc > INT32_MAX / 2)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA mla_absorbed: %d tokens of %d heads "
			       "(%ld blocks)", n, H, na + nb + nc);
	a.na = (int)na;
	a.nb = (int)nb;
	a.nc = (int)nc;
	a.part = a.split > 1 ? sp->part : NULL;
	size_t smem = mla_smem_of(a.gm, s);
	switch (wt) {
	case DT_F32:
		absorbed_launch<float>(a, s, smem);
		break;
	case DT_BF16:
		absorbed_launch<__nv_bfloat16>(a, s, smem);
		break;
	case DT_F16:
		absorbed_launch<__half>(a, s, smem);
		break;
	default: /* DT_F8_E4M3, checked above */
		absorbed_launch<__nv_fp8_e4m3>(a, s, smem);
	}
	return launched("mla_absorbed", err, errsz);
}

/* ---- dsa_topk (cpu_ref_dsa_topk): scores per query, then an exact radix select --------------- */

/* One warp, key kt: *out = cpu_ref_dsa_score(q, kt, ks, w, ...), heads summed in the
 * reference's order (lane 0 writes); KV: the cache's elements, float, bf16 bits or e4m3 with
 * the key's scales ks (kv_rc). */
template <typename KV>
__device__ void dsa_score_warp(float *out, const float *q, const KV *kt, const float *ks,
			       const float *w, int n_heads, int head_dim, float qk_scale,
			       float w_scale, int lane)
{
	float total = 0.0f;
	for (int h = 0; h < n_heads; h++) {
		const float *qh = q + (size_t)h * head_dim;
		float dot = 0.0f;
		for (int d = lane; d < head_dim; d += 32)
			dot += qh[d] * kv_rc(kt, ks, d);
		dot = warp_sum(dot) * qk_scale;
		total += w[h] * w_scale * (dot > 0.0f ? dot : 0.0f);
	}
	if (lane == 0)
		*out = total;
}

/* A 32-bit key whose unsigned order is the reference's order of scores: NaN counts as -inf
 * and -0 equals +0 (so they tie, and the lower position wins as there). */
__device__ __forceinline__ unsigned order_key(float f)
{
	unsigned u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
		u = 0xff800000u; /* -inf */
	if ((u & 0x7fffffffu) == 0)
		u = 0; /* +0 */
	return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

#define DSA_THREADS 1024 /* a block: 32 keys scored, then (the last block) the select */
#define DSA_ILP 8 /* the select's scores a thread a step: its loads in flight at once (one at a
		   * time, a pass over 100K scores could wait on L2 about 100 times a thread) */

struct dsa_smem { /* the select's shared memory */
	unsigned hist[256];
	unsigned prefix;
	int need;
	int list; /* dsa_digit: the keys in the chosen digit and above */
	int scratch[32];
	int last; /* dsa_finish: this block is its query's last */
};

/* One chunk of the walk that writes a selection in position order, for the whole block:
 * this thread's nv (<= DSA_ILP) consecutive keys of the chunk, key[0..nv), at positions
 * at[u] (p0 + u where at is NULL). Every key above K is chosen, and the first need equal to
 * it, each written at its rank among the chosen: (keys > K before it) + min(keys == K
 * before it, need); *gt_base and *eq_base carry the chunks before. */
__device__ __forceinline__ void dsa_emit(int *sel, const unsigned *key, int nv, const int *at,
					 int p0, unsigned K, int need, int *gt_base, int *eq_base,
					 struct dsa_smem *sm)
{
	int gt = 0, eq = 0, total;
#pragma unroll
	for (int u = 0; u < DSA_ILP; u++) {
		gt += u < nv && key[u] > K;
		eq += u < nv && key[u] == K;
	}
	/* a chunk counts at most DSA_ILP x 1,024 of each: no carry into eq's half */
	int packed = gt | eq << 16;
	int excl = block_scan(packed, sm->scratch, &total) - packed;
	int gt_before = *gt_base + (excl & 0xffff), eq_before = *eq_base + (excl >> 16);
#pragma unroll
	for (int u = 0; u < DSA_ILP; u++) {
		bool g = u < nv && key[u] > K, e = u < nv && key[u] == K;
		if (g || (e && eq_before < need))
			sel[gt_before + min(eq_before, need)] = at ? at[u] : p0 + u;
		gt_before += g;
		eq_before += e;
	}
	*gt_base += total & 0xffff;
	*eq_base += total >> 16;
}

/* The whole block (blockDim.x >= 256): the reference's top-k of scores[0..len) (len > topk),
 * positions ascending. The order is (key desc, position asc) with key = order_key(score), a
 * total order, so the chosen set is unique: every key above the k-th largest key K, then the
 * lowest positions among those equal to K. K comes from a radix select, 8 bits a pass from
 * the top: a histogram of the next digit among keys matching the digits fixed so far, and the
 * digit where the count from the top reaches the number still needed. Then one pass in
 * position order writes each chosen position at its rank among the chosen: (keys > K before
 * it) + min(keys == K before it, need), a thread DSA_ILP consecutive positions of a chunk. No
 * scratch beyond shared memory. The scores are read with __ldcg (from L2, not this SM's L1:
 * other blocks of the launch wrote them, and a line of them cached here, by a block that
 * selected for a neighbouring row, could be stale; the CUDA guide's last-block example reads
 * its partial sums volatile for the same reason); dsa_select_compact reads them so too. */
__device__ void dsa_select_block(int *sel, int *nsel, const float *scores, int len, int topk,
				 struct dsa_smem *sm)
{
	unsigned prefix = 0, mask = 0;
	int need = topk; /* still to take among the keys that match prefix under mask */
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x)
			sm->hist[b] = 0;
		__syncthreads();
		for (int c0 = 0; c0 < len; c0 += DSA_ILP * blockDim.x) {
			float v[DSA_ILP]; /* all loads first: DSA_ILP in flight, not one */
#pragma unroll
			for (int u = 0; u < DSA_ILP; u++) {
				int t = c0 + u * (int)blockDim.x + (int)threadIdx.x;
				v[u] = t < len ? __ldcg(scores + t) : 0.0f;
			}
#pragma unroll
			for (int u = 0; u < DSA_ILP; u++) {
				unsigned key = order_key(v[u]);
				if (c0 + u * (int)blockDim.x + (int)threadIdx.x < len &&
				    (key & mask) == prefix)
					atomicAdd(&sm->hist[(key >> shift) & 255u], 1u);
			}
		}
		__syncthreads();
		/* at least need keys match: the digit b with above < need <= above + hist[b],
		 * above the count in the digits past b: a scan of the counts from the top, thread
		 * t taking digit 255 - t (a loop of 256 dependent steps in one thread was a
		 * latency a pass) */
		int t = threadIdx.x, hb = t < 256 ? (int)sm->hist[255 - t] : 0, all;
		int upto = block_scan(hb, sm->scratch, &all); /* digits 255 - t .. 255 */
		if (t < 256 && upto - hb < need && need <= upto) {
			sm->prefix = prefix | ((unsigned)(255 - t) << shift);
			sm->need = need - (upto - hb);
		}
		__syncthreads();
		prefix = sm->prefix; /* rewritten only after the next pass's two barriers */
		need = sm->need;
		mask |= 255u << shift;
	}
	/* prefix is K; topk - need keys are above it, need of those equal to it are taken */
	int gt_base = 0, eq_base = 0; /* counts in the chunks before this one */
	for (int c0 = 0; c0 < len; c0 += DSA_ILP * blockDim.x) { /* block-uniform loop */
		int t0 = c0 + DSA_ILP * (int)threadIdx.x; /* this thread's run of positions */
		unsigned key[DSA_ILP];
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++)
			key[u] = t0 + u < len ? order_key(__ldcg(scores + t0 + u)) : 0;
		dsa_emit(sel, key, min(DSA_ILP, max(0, len - t0)), NULL, t0, prefix, need, &gt_base,
			 &eq_base, sm);
	}
	if (threadIdx.x == 0)
		*nsel = topk;
}

/* dsa_select_block's answer in two passes over the scores, not five, when the candidates fit
 * the block's dynamic shared memory (dsa_dyn: DSA_HBINS counts, then cap keys and cap
 * positions); in one when gh holds pass 1's counts already (made by the scoring blocks,
 * dsa_bins_add: taken and left zero here, whatever the answer). Pass 1 counts the keys' top
 * DSA_HB bits (DSA_HBINS digits: a bin is an eighth
 * of an octave of the scores, where 256 bins of 8 bits are two octaves, which may hold most
 * of a long context's keys at the top-k boundary); the digit b where the count from the top
 * reaches topk leaves a list of the keys in digits >= b, at most topk plus b's count. When
 * that list fits (cap entries), pass 2 copies its keys and positions into shared memory in
 * position order (a block scan a chunk, DSA_ILP consecutive positions a thread); two radix
 * passes of 10 bits over the list's keys in digit b fix K; and one walk of the list in order
 * writes the chosen positions as dsa_select_block's last pass does. False (nothing written)
 * when the list would not fit: the caller then runs dsa_select_block. blockDim.x must be
 * DSA_THREADS (DSA_HBINS / blockDim.x digits a thread in the digit scans). Every branch is
 * block-uniform (it depends on shared values only). */
#define DSA_HB 12
#define DSA_HBINS (1 << DSA_HB)
static_assert(DSA_HBINS == WK_DSA_BINS, "cuda_kernels.h's count of the select's bins");
#define DSA_CAP 12288 /* the list's default capacity: 112 KiB of dynamic shared memory */
#define DSA_DYN(cap) ((size_t)DSA_HBINS * 4 + (size_t)(cap) * 8)

/* The digit where the count from the top of hist[0, nb) reaches need (>= 1, at most the
 * total), for the whole block: sm->prefix = prefix | digit << shift, sm->need = need less the
 * keys in the digits above, sm->list = those keys plus the digit's own. */
__device__ void dsa_digit(const unsigned *hist, int nb, int need, unsigned prefix, int shift,
			  struct dsa_smem *sm)
{
	int per = nb / (int)blockDim.x, t = threadIdx.x, top = nb - 1 - per * t, hb = 0, all;
	for (int j = 0; j < per; j++) /* this thread's digits, from the top: top .. top - per + 1 */
		hb += (int)hist[top - j];
	if (t == 0) /* counts of fewer than need keys (never, unless a caller's bug): no list */
		sm->list = INT_MAX;
	int upto = block_scan(hb, sm->scratch, &all); /* the keys in digits >= top - per + 1 */
	if (upto - hb < need && need <= upto) {
		int above = upto - hb;
		for (int j = 0; j < per; j++) {
			int c = (int)hist[top - j];
			if (above + c >= need) {
				sm->prefix = prefix | ((unsigned)(top - j) << shift);
				sm->need = need - above;
				sm->list = above + c;
				break;
			}
			above += c;
		}
	}
	__syncthreads();
}

__device__ __noinline__ bool dsa_select_compact(int *sel, int *nsel, const float *scores, int len,
				   int topk, struct dsa_smem *sm, int cap, unsigned *gh)
{
	extern __shared__ uint4 dsa_dyn[];
	unsigned *hist = (unsigned *)dsa_dyn, *lk = hist + DSA_HBINS;
	int *lp = (int *)(lk + cap);
	const int step = DSA_ILP * (int)blockDim.x, sh = 32 - DSA_HB;
	for (int b = threadIdx.x; b < DSA_HBINS; b += blockDim.x) /* atomics: past L1 */
		hist[b] = gh ? atomicExch(&gh[b], 0u) : 0;
	__syncthreads();
	for (int c0 = 0; !gh && c0 < len; c0 += step) { /* pass 1: the top DSA_HB bits */
		float v[DSA_ILP];
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++) {
			int t = c0 + u * (int)blockDim.x + (int)threadIdx.x;
			v[u] = t < len ? __ldcg(scores + t) : 0.0f;
		}
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++)
			if (c0 + u * (int)blockDim.x + (int)threadIdx.x < len)
				atomicAdd(&hist[order_key(v[u]) >> sh], 1u);
	}
	__syncthreads();
	dsa_digit(hist, DSA_HBINS, topk, 0, sh, sm);
	unsigned lo = sm->prefix; /* the list: keys >= lo */
	int need = sm->need, n = sm->list;
	if (n > cap)
		return false;
	int base = 0; /* pass 2: the list, in position order */
	for (int c0 = 0; c0 < len; c0 += step) {
		int t0 = c0 + DSA_ILP * (int)threadIdx.x, in = 0, total;
		unsigned key[DSA_ILP];
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++)
			key[u] = t0 + u < len ? order_key(__ldcg(scores + t0 + u)) : 0;
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++)
			in += t0 + u < len && key[u] >= lo;
		int at = base + block_scan(in, sm->scratch, &total) - in;
#pragma unroll
		for (int u = 0; u < DSA_ILP; u++)
			if (t0 + u < len && key[u] >= lo) {
				lk[at] = key[u];
				lp[at++] = t0 + u;
			}
		base += total;
	}
	/* K's last 20 bits: two radix passes over the list's keys in digit lo >> sh */
	unsigned prefix = lo, mask = ~0u << sh;
	for (int shift = sh - 10; shift >= 0; shift -= 10) {
		for (int b = threadIdx.x; b < 1024; b += blockDim.x)
			hist[b] = 0;
		__syncthreads(); /* also: the list is complete */
		for (int j = threadIdx.x; j < n; j += blockDim.x)
			if ((lk[j] & mask) == prefix)
				atomicAdd(&hist[(lk[j] >> shift) & 1023u], 1u);
		__syncthreads();
		dsa_digit(hist, 1024, need, prefix, shift, sm);
		prefix = sm->prefix;
		need = sm->need;
		mask |= 1023u << shift;
	}
	/* prefix is K: every listed key above it, and the first need equal to it */
	int gt_base = 0, eq_base = 0;
	for (int c0 = 0; c0 < n; c0 += step) {
		int j0 = c0 + DSA_ILP * (int)threadIdx.x;
		dsa_emit(sel, lk + j0, min(DSA_ILP, max(0, n - j0)), lp + j0, 0, prefix, need,
			 &gt_base, &eq_base, sm);
	}
	if (threadIdx.x == 0)
		*nsel = topk;
	return true;
}

/* A scoring block's counts of its keys' top DSA_HB bits (dsa_select_compact's pass 1, made
 * by the scoring blocks), in the dynamic shared memory: dsa_bins_zero before the block's
 * first count (and a barrier), dsa_bin for each score it computes (from the register, not
 * read back from global memory: a line of another block's scores cached in this SM's L1
 * could go stale before the select reads it), then dsa_bins_add adds them to the query's row
 * in global memory (gh): a global atomic a bin the block's keys fall in, not one a key. */
__device__ __forceinline__ void dsa_bins_zero(void)
{
	extern __shared__ uint4 dsa_dyn[];
	for (int b = threadIdx.x; b < DSA_HBINS; b += blockDim.x)
		((unsigned *)dsa_dyn)[b] = 0;
}

__device__ __forceinline__ void dsa_bin(float score)
{
	extern __shared__ uint4 dsa_dyn[];
	atomicAdd((unsigned *)dsa_dyn + (order_key(score) >> (32 - DSA_HB)), 1u);
}

__device__ void dsa_bins_add(unsigned *gh)
{
	extern __shared__ uint4 dsa_dyn[];
	const unsigned *h = (const unsigned *)dsa_dyn;
	__syncthreads(); /* every count of the block */
	for (int b = threadIdx.x; b < DSA_HBINS; b += blockDim.x)
		if (h[b])
			atomicAdd(&gh[b], h[b]);
}

struct dsa_args {
	int *sel, *nsel;
	float *scores; /* [group][stride] */
	size_t stride;
	const float *q, *w;
	struct cpu_dsa d; /* d.k of type KV, k_dsa_topk_n's */
	int pos0, i0;
	unsigned *count; /* [group], zero, left zero */
	int scored;      /* k_dsa_topk_n: the scores are in already (k_dsa_score_mma's) */
	int ng, qb;      /* k_dsa_score_mma: the group's queries, and a block's; */
	int chunk;       /* and a block's keys (a multiple of DM_KT) */
	int cap;         /* dsa_select_compact's list (the launch's DSA_DYN(cap) bytes); 0: not */
	unsigned *hist;  /* [group][DSA_HBINS], zero, left zero: k_dsa_topk_tc's blocks count
			  * their keys' top bits there for the select (only with cap > 0); or NULL */
};

/* The end of a block of k_dsa_topk_n or k_dsa_topk_tc, query i (group row g) of len keys
 * whose scores are sc: the last of the query's blocks to finish (a counter per query, the
 * block's writes fenced before it is bumped) selects its top-k from sc, or takes all of its
 * keys when they are no more than topk; that block leaves the counter zero. */
__device__ void dsa_finish(const struct dsa_args &a, int g, int i, int len, const float *sc,
			   struct dsa_smem *sm)
{
	const struct cpu_dsa &d = a.d;
	__threadfence(); /* this block's scores are visible before the counter moves */
	__syncthreads();
	if (threadIdx.x == 0)
		sm->last = atomicAdd(&a.count[g], 1u) == gridDim.x - 1;
	__syncthreads();
	if (!sm->last)
		return;
	__threadfence();
	int *sel = a.sel + (size_t)i * d.topk;
	unsigned *gh = a.hist ? a.hist + (size_t)g * DSA_HBINS : NULL;
	if (len > d.topk) {
		if (a.cap <= 0 || blockDim.x != DSA_THREADS ||
		    !dsa_select_compact(sel, a.nsel + i, sc, len, d.topk, sm, a.cap, gh))
			dsa_select_block(sel, a.nsel + i, sc, len, d.topk, sm);
	} else {
		for (int j = threadIdx.x; j < len; j += blockDim.x)
			sel[j] = j;
		if (threadIdx.x == 0)
			a.nsel[i] = len;
	}
	if (threadIdx.x == 0)
		a.count[g] = 0; /* ready for the next launch */
}

/* A group of queries in one launch: blockIdx.y is query i0 + y, whose keys [0, len) (its
 * sequence's rows, cpu_dsa_base on) are scored one warp each across gridDim.x blocks; the
 * last of those blocks selects (dsa_finish), so scoring and selecting cost one launch, not
 * two. A query with no more keys than topk takes them all (nothing scored). */
template <typename KV>
__global__ void __launch_bounds__(DSA_THREADS) k_dsa_topk_n(struct dsa_args a)
{
	__shared__ struct dsa_smem sm;
	const struct cpu_dsa &d = a.d;
	int g = blockIdx.y, i = a.i0 + g, len = (d.seq ? d.pos[i] : a.pos0 + i) + 1;
	size_t base = d.seq ? (size_t)d.seq[i] * d.seq_rows : 0;
	float *sc = a.scores + (size_t)g * a.stride;
	size_t t = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	if (!a.scored && len > d.topk && t < (size_t)len) /* whole warps alike */
		dsa_score_warp(sc + t, a.q + (size_t)i * d.n_heads * d.head_dim,
			       (const KV *)d.k + (base + t) * d.head_dim,
			       kv_scales(d.ks, base + t, d.head_dim), a.w + (size_t)i * d.n_heads,
			       d.n_heads, d.head_dim, d.qk_scale, d.w_scale, threadIdx.x & 31);
	dsa_finish(a, g, i, len, sc, &sm);
}

/* One sequence's queries with no more keys than topk take them all: sel[i][j] = j, nsel[i] =
 * pos0 + i + 1 (a block of 128 threads each, not k_dsa_topk_n's 1,024). */
__global__ void k_dsa_all(int *sel, int *nsel, int pos0, int topk)
{
	int i = blockIdx.x, len = pos0 + i + 1;
	for (int j = threadIdx.x; j < len; j += blockDim.x)
		sel[(size_t)i * topk + j] = j;
	if (threadIdx.x == 0)
		nsel[i] = len;
}

/* ---- a prefill's scores on the tensor cores: k_dsa_score_mma ------------------------------
 *
 * The scores are a product: S[(query, head)][key] = q . k over head_dim, then query i's score
 * of key t is the sum over its heads of (w[i][h] w_scale) relu(S qk_scale) (cpu_ref_dsa_score).
 * k_dsa_topk_n runs that on the f32 pipes, a warp a (query, key), so a query's rows (GLM-5:
 * 32 heads of 128, 16 KB) are read again for every key: at 8,192 tokens about 137 G
 * multiply-adds a layer, on the slowest pipes. Here a block holds DM_ROWS rows of (query,
 * head), qb = DM_ROWS / n_heads consecutive queries with all of their heads, as mma.sync
 * m16n8k16 A fragments in registers (head_dim <= 16 DM_DK), and runs them over a chunk of
 * a.chunk keys (dm_launch's: DM_CHUNK, or fewer where the blocks would not fill the device)
 * in tiles of DM_KT:
 *   1. the tile's keys go through shared memory once for all of those rows, as bf16 (dm_cvt8);
 *   2. warp w multiplies rows 16 w .. + 15 by the tile's 8 n-tiles of keys;
 *   3. each (row, key) becomes (w[h] w_scale) relu(dot qk_scale), in shared memory;
 *   4. a thread a (query, key) adds its query's heads in the reference's order, and writes
 *      the score.
 * f32 within 2^-16 as k_att_mma: each f32 is split into bf16 hi + lo (bf16_split) and a
 * product is hi.hi + lo.hi + hi.lo. A bf16 cache's keys are exact, and so are an FP8 cache's
 * e4m3 codes (3 bits of mantissa): for those the lo terms are skipped, and an FP8 key's scale
 * (one a row: head_dim <= 128) multiplies its dot product (the reference multiplies each
 * element: the same within rounding). Block (x, y): the group's query tile tiles - 1 - x (the
 * last, with the most keys, first), keys a.chunk y .. + a.chunk - 1 (a block past its last
 * query's keys returns). Shared memory: the tile [DM_KT][DM_KS] hi and lo, the products
 * [DM_ROWS][DM_PS] f32, the rows' weights [DM_ROWS] and the keys' scales [DM_KT]: 70 KB. One
 * sequence's queries, past topk (k_dsa_topk_n then selects from the scores, scored set);
 * head_dim % 8 == 0 and the cache 16-byte aligned (8 columns a load). */
#define DM_ROWS 128 /* (query, head) rows a block: 8 warps of an m-tile */
#define DM_THREADS 256
#define DM_KT 64 /* keys a tile: 8 n-tiles */
#define DM_DK 8  /* k-steps of 16: head_dim <= 128 */
#define DM_KS (16 * DM_DK + 8) /* a key's row in shared memory, 8 bf16 past it for the banks */
#define DM_PS (DM_KT + 8)
#define DM_CHUNK 1024 /* keys a block, at most */
#define DM_MIN 16     /* scored queries from which a call takes this kernel: a guess until a
		       * GPU times both (cuda_lab's dsa rows) */
#define DM_SMEM                                                                               \
	(2 * DM_KT * DM_KS * sizeof(uint16_t) + (DM_PS + 1) * DM_ROWS * sizeof(float) +        \
	 DM_KT * sizeof(float))

/* 8 consecutive elements of a key row (src 16-byte aligned; FP8 8-byte) as 4 bf16 pairs each
 * (the lower element in the low half): f32, hi and lo (bf16_split); bf16, the bits (lo
 * untouched); FP8, the codes' values, exact (the row's scale left out; lo untouched). */
__device__ __forceinline__ void dm_cvt8(const float *src, uint4 *hi, uint4 *lo)
{
	float4 a = ((const float4 *)src)[0], b = ((const float4 *)src)[1];
	float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	uint32_t h[8], l[8];
#pragma unroll
	for (int u = 0; u < 8; u++)
		bf16_split(v[u], &h[u], &l[u]);
	*hi = make_uint4(am_pack(h[0], h[1]), am_pack(h[2], h[3]), am_pack(h[4], h[5]),
			 am_pack(h[6], h[7]));
	*lo = make_uint4(am_pack(l[0], l[1]), am_pack(l[2], l[3]), am_pack(l[4], l[5]),
			 am_pack(l[6], l[7]));
}
__device__ __forceinline__ void dm_cvt8(const uint16_t *src, uint4 *hi, uint4 *lo)
{
	(void)lo;
	*hi = *(const uint4 *)src;
}
__device__ __forceinline__ void dm_cvt8(const __nv_fp8_e4m3 *src, uint4 *hi, uint4 *lo)
{
	(void)lo;
	uint2 c = *(const uint2 *)src;
	uint32_t h[8];
#pragma unroll
	for (int u = 0; u < 8; u++)
		h[u] = e4m3_bf16(((u < 4 ? c.x : c.y) >> (8 * (u & 3))) & 0xffu);
	*hi = make_uint4(am_pack(h[0], h[1]), am_pack(h[2], h[3]), am_pack(h[4], h[5]),
			 am_pack(h[6], h[7]));
}

template <typename KV>
__global__ void __launch_bounds__(DM_THREADS) k_dsa_score_mma(struct dsa_args a)
{
	extern __shared__ uint16_t sb[];
	constexpr bool F8 = sizeof(KV) == 1, EX = kv_bf16<KV>::v || F8; /* keys exact in bf16 */
	const struct cpu_dsa &d = a.d;
	int H = d.n_heads, D = d.head_dim, ksteps = (D + 15) / 16, qb = a.qb;
	int tiles = (a.ng + qb - 1) / qb, g0 = (tiles - 1 - (int)blockIdx.x) * qb;
	int nq = min(qb, a.ng - g0), first = a.pos0 + a.i0 + g0; /* query g0's last key */
	int t0 = (int)blockIdx.y * a.chunk, t1 = min(first + nq, t0 + a.chunk);
	if (t0 >= t1)
		return;
	uint16_t *kh = sb, *kl = kh + DM_KT * DM_KS;
	float *p = (float *)(kl + DM_KT * DM_KS), *wr = p + DM_ROWS * DM_PS, *ksc = wr + DM_ROWS;
	int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, qq = lane % 4;
	for (int r = threadIdx.x; r < DM_ROWS; r += blockDim.x)
		wr[r] = r / H < nq ? a.w[(size_t)(a.i0 + g0 + r / H) * H + r % H] * d.w_scale
				   : 0.0f;
	/* the warp's rows as A fragments: register e holds row gq (+ 8 for odd e), columns 2 qq
	 * and 2 qq + 1 (+ 8 for e >= 2) of each k-step; zeros past the rows and head_dim */
	uint32_t ah[DM_DK][4], al[DM_DK][4];
#pragma unroll
	for (int k = 0; k < DM_DK; k++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int r = warp * 16 + gq + (e & 1) * 8, c = k * 16 + 2 * qq + (e >> 1) * 8;
			uint32_t h2[2] = {0, 0}, l2[2] = {0, 0};
#pragma unroll
			for (int u = 0; u < 2; u++)
				if (k < ksteps && r / H < nq && c + u < D)
					bf16_split(a.q[((size_t)(a.i0 + g0 + r / H) * H + r % H) * D +
						       c + u],
						   &h2[u], &l2[u]);
			ah[k][e] = am_pack(h2[0], h2[1]);
			al[k][e] = am_pack(l2[0], l2[1]);
		}
	int c8 = ksteps * 2; /* 8-column pieces of a key's row in the tile */
	float acc[8][4];
	for (int t = t0; t < t1; t += DM_KT) { /* block-uniform loop */
		__syncthreads(); /* the last tile's keys and products read; wr written */
		for (int x = threadIdx.x; x < DM_KT * c8; x += blockDim.x) {
			int j = x / c8, c = (x % c8) * 8, key = t + j, o = j * DM_KS + c;
			uint4 h = make_uint4(0, 0, 0, 0), l = h;
			if (key < t1 && c < D)
				dm_cvt8((const KV *)d.k + (size_t)key * D + c, &h, &l);
			*(uint4 *)(kh + o) = h;
			if (!EX)
				*(uint4 *)(kl + o) = l;
		}
		if (F8 && threadIdx.x < DM_KT)
			ksc[threadIdx.x] = t + (int)threadIdx.x < t1 ? d.ks[t + threadIdx.x] : 0.0f;
		__syncthreads(); /* the tile */
		am_zero(acc);
#pragma unroll
		for (int k = 0; k < DM_DK; k++) {
			if (k >= ksteps)
				break;
#pragma unroll
			for (int nt = 0; nt < 8; nt++) { /* B [d][key]: key 8 nt + gq's run of d */
				int o = (nt * 8 + gq) * DM_KS + k * 16 + 2 * qq;
				uint32_t bh[2] = {am_ld(kh + o), am_ld(kh + o + 8)};
				mma_bf16_16816(acc[nt], ah[k], bh);
				mma_bf16_16816(acc[nt], al[k], bh);
				if (!EX) {
					uint32_t bl[2] = {am_ld(kl + o), am_ld(kl + o + 8)};
					mma_bf16_16816(acc[nt], ah[k], bl);
				}
			}
		}
		/* acc[nt][e]: row gq (+ 8 for e >= 2) of the warp's, key 8 nt + 2 qq (+ 1, odd e);
		 * a pair of keys a float2 store (a half-warp's 16 in distinct banks) */
#pragma unroll
		for (int nt = 0; nt < 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e += 2) {
				int r = warp * 16 + gq + (e >> 1) * 8, j = nt * 8 + 2 * qq;
				float v[2];
#pragma unroll
				for (int u = 0; u < 2; u++) {
					float dot = (F8 ? acc[nt][e + u] * ksc[j + u] : acc[nt][e + u]) *
						    d.qk_scale;
					v[u] = wr[r] * (dot > 0.0f ? dot : 0.0f);
				}
				*(float2 *)(p + r * DM_PS + j) = make_float2(v[0], v[1]);
			}
		__syncthreads(); /* the products */
		for (int x = threadIdx.x; x < nq * DM_KT; x += blockDim.x) {
			int ql = x / DM_KT, j = x % DM_KT, key = t + j;
			if (key > first + ql) /* past query g0 + ql's keys */
				continue;
			float total = 0.0f;
			for (int h = 0; h < H; h++)
				total += p[(ql * H + h) * DM_PS + j];
			a.scores[(size_t)(g0 + ql) * a.stride + key] = total;
		}
	}
}

/* The scores of a's group (a.ng queries from a.i0) on the tensor cores, then its select
 * (k_dsa_topk_n, scored, a block a query). */
template <typename KV> static cudaError_t dm_launch(struct dsa_args a, int longest)
{
	cudaError_t e = cudaFuncSetAttribute((k_dsa_score_mma<KV>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize,
					     (int)DM_SMEM);
	if (e != cudaSuccess)
		return e;
	a.qb = DM_ROWS / a.d.n_heads;
	/* halved down to 2 tiles while the blocks would not fill the device (a short chunk of
	 * a prompt after a long context: few query tiles over many keys) */
	long tiles = (a.ng + a.qb - 1) / a.qb;
	for (a.chunk = DM_CHUNK; a.chunk > 2 * DM_KT &&
				 tiles * ((longest + a.chunk - 1) / a.chunk) < ATT_FILL;)
		a.chunk /= 2;
	dim3 grid((unsigned)tiles, (unsigned)((longest + a.chunk - 1) / a.chunk));
	k_dsa_score_mma<KV><<<grid, DM_THREADS, DM_SMEM, wk_st()>>>(a);
	a.scored = 1;
	size_t dyn = a.cap > 0 ? DSA_DYN(a.cap) : 0; /* allowed up to DSA_CAP's: dsa_group */
	k_dsa_topk_n<KV><<<dim3(1, (unsigned)a.ng), DSA_THREADS, dyn, wk_st()>>>(a);
	return cudaSuccess;
}

/* ---- a decode's scores on the tensor cores: k_dsa_topk_tc ---------------------------------
 *
 * k_dsa_topk_n's launch (blocks of DSA_THREADS over a query's keys, the last one selecting:
 * one launch a group) with the keys scored on mma.sync m16n8k16: S^T [key][head] = K Q^T, the
 * keys the m16 side (a query has few heads to fill it: GLM-5's 32), each warp DT_KEYS keys
 * against up to DT_HEADS heads (4 n-tiles) over head_dim <= DT_DIM. At 100K keys the warp a
 * key of k_dsa_topk_n spends about 1,000 instructions a key (a warp sum a head); here a key
 * costs 4 mma.sync (bf16 and FP8 keys; 6 on f32): the pass should be bound by reading keys.
 * A lane reads 8 consecutive elements of each of its two key rows (gq, gq + 8) at once, for
 * two k-steps: a dot product may sum its d in any order, so k-step 2 p + s takes d = 32 p +
 * 8 qq + 4 s .. + 3 in lane qq's slots (A's columns 2 qq, 2 qq + 1 and 2 qq + 8, 2 qq + 9),
 * and the query's rows in shared memory are read in the same order (B's rows alike). The
 * query is split into bf16 hi + lo; a bf16 or FP8 key is exact in bf16 (an FP8 key's scale,
 * one a row, multiplies its dot product), an f32 key is split too: 2 or 3 products each.
 * Then each lane adds (w[h] w_scale) relu(dot qk_scale) over its 8 heads and 4 lanes their
 * sums (another order of the heads than the reference's: equal within rounding). One
 * sequence's queries or several's (a batched decode step's), each over its own keys. */
#define DT_KEYS 16
#define DT_HEADS 32
#define DT_DIM 128
#define DT_QS (DT_DIM + 32) /* a head's row in shared memory (bf16): a quarter-warp's 16-byte
			     * reads of two rows fall in distinct banks */
#define DT_BLOCK (DSA_THREADS / 32 * DT_KEYS) /* keys a block: 512 */

template <typename KV>
__global__ void __launch_bounds__(DSA_THREADS) k_dsa_topk_tc(struct dsa_args a)
{
	__shared__ struct dsa_smem sm;
	__shared__ uint4 sq[2 * DT_HEADS * DT_QS / 8]; /* the query's hi rows, then its lo rows */
	constexpr bool F8 = sizeof(KV) == 1, EX = kv_bf16<KV>::v || F8; /* keys exact in bf16 */
	const struct cpu_dsa &d = a.d;
	int g = blockIdx.y, i = a.i0 + g, len = (d.seq ? d.pos[i] : a.pos0 + i) + 1;
	size_t base = d.seq ? (size_t)d.seq[i] * d.seq_rows : 0;
	float *sc = a.scores + (size_t)g * a.stride;
	int H = d.n_heads, D = d.head_dim, k0 = (int)blockIdx.x * DT_BLOCK;
	if (len > d.topk && k0 < len) { /* block-uniform */
		uint16_t *qh = (uint16_t *)sq, *ql = qh + DT_HEADS * DT_QS;
		const float *q = a.q + (size_t)i * H * D, *w = a.w + (size_t)i * H;
		for (int x = threadIdx.x; x < DT_HEADS * DT_DIM; x += blockDim.x) {
			int h = x / DT_DIM, c = x % DT_DIM;
			am_put(qh, ql, h * DT_QS + c, h < H && c < D ? q[(size_t)h * D + c] : 0.0f);
		}
		if (a.hist)
			dsa_bins_zero();
		__syncthreads(); /* the query, and the bins zero */
		int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, qq = lane % 4;
		int key = k0 + warp * DT_KEYS + gq; /* and key + 8 */
		bool in0 = key < len, in1 = key + 8 < len;
		const KV *r0 = (const KV *)d.k + (base + (size_t)key) * D, *r1 = r0 + (size_t)8 * D;
		float acc[DT_HEADS / 8][4];
		am_zero(acc);
		for (int c = qq * 8; c - qq * 8 < D; c += 32) { /* two k-steps a pass */
			uint4 uh = make_uint4(0, 0, 0, 0), ul = uh, vh = uh, vl = uh;
			if (in0 && c < D)
				dm_cvt8(r0 + c, &uh, &ul);
			if (in1 && c < D)
				dm_cvt8(r1 + c, &vh, &vl);
#pragma unroll
			for (int nt = 0; nt < DT_HEADS / 8; nt++) {
				int o = (nt * 8 + gq) * DT_QS + c;
				uint4 bh4 = *(const uint4 *)(qh + o), bl4 = *(const uint4 *)(ql + o);
#pragma unroll
				for (int st = 0; st < 2; st++) { /* d = c + 4 st .. + 3 */
					uint32_t ah[4] = {st ? uh.z : uh.x, st ? vh.z : vh.x,
							  st ? uh.w : uh.y, st ? vh.w : vh.y};
					uint32_t bh[2] = {st ? bh4.z : bh4.x, st ? bh4.w : bh4.y};
					uint32_t bl[2] = {st ? bl4.z : bl4.x, st ? bl4.w : bl4.y};
					mma_bf16_16816(acc[nt], ah, bh);
					mma_bf16_16816(acc[nt], ah, bl);
					if (!EX) {
						uint32_t al[4] = {st ? ul.z : ul.x, st ? vl.z : vl.x,
								  st ? ul.w : ul.y, st ? vl.w : vl.y};
						mma_bf16_16816(acc[nt], al, bh);
					}
				}
			}
		}
		/* acc[nt][e]: key gq (+ 8 for e >= 2), head 8 nt + 2 qq (+ 1 for odd e) */
		float s0 = F8 && in0 ? kv_scales(d.ks, base + key, D)[0] : 1.0f;
		float s1 = F8 && in1 ? kv_scales(d.ks, base + key + 8, D)[0] : 1.0f;
		float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
		for (int nt = 0; nt < DT_HEADS / 8; nt++)
#pragma unroll
			for (int u = 0; u < 2; u++) {
				int h = nt * 8 + 2 * qq + u;
				float wh = h < H ? w[h] * d.w_scale : 0.0f;
				float x0 = (F8 ? acc[nt][u] * s0 : acc[nt][u]) * d.qk_scale;
				float x1 = (F8 ? acc[nt][2 + u] * s1 : acc[nt][2 + u]) * d.qk_scale;
				t0 += wh * (x0 > 0.0f ? x0 : 0.0f);
				t1 += wh * (x1 > 0.0f ? x1 : 0.0f);
			}
#pragma unroll
		for (int x = 1; x < 4; x <<= 1) {
			t0 += __shfl_xor_sync(0xffffffffu, t0, x);
			t1 += __shfl_xor_sync(0xffffffffu, t1, x);
		}
		if (qq == 0 && in0)
			sc[key] = t0;
		if (qq == 0 && in1)
			sc[key + 8] = t1;
		if (a.hist && qq == 0 && in0)
			dsa_bin(t0);
		if (a.hist && qq == 0 && in1)
			dsa_bin(t1);
		if (a.hist)
			dsa_bins_add(a.hist + (size_t)g * DSA_HBINS);
	}
	dsa_finish(a, g, i, len, sc, &sm);
}

static int dsa_forced; /* wk_cuda_dsa_force */
static int dsa_cap = DSA_CAP; /* wk_cuda_dsa_cap */

extern "C" void wk_cuda_dsa_force(int path)
{
	dsa_forced = path;
}

extern "C" void wk_cuda_dsa_cap(int cap)
{
	dsa_cap = cap < 0 ? DSA_CAP : cap > DSA_CAP ? DSA_CAP : cap;
}

/* The queries of one sequence's n at pos0 with no more keys than topk (they take them all). */
static int dsa_all(const struct cpu_dsa *d, int n, int pos0)
{
	if (d->seq)
		return 0;
	return d->topk - pos0 < n ? (d->topk > pos0 ? d->topk - pos0 : 0) : n;
}

extern "C" int wk_cuda_dsa_path(const struct cpu_dsa *d, int n, int pos0)
{
	/* both tensor-core paths: 8 columns a load */
	bool mma = d->n_heads >= 1 && d->head_dim >= 8 && d->head_dim % 8 == 0 &&
		   (uintptr_t)d->k % 16 == 0;
	bool can2 = mma && !d->seq && d->n_heads <= DM_ROWS && d->head_dim <= 16 * DM_DK;
	bool can3 = mma && d->n_heads <= DT_HEADS && d->head_dim <= DT_DIM;
	if (dsa_forced)
		return dsa_forced == 2 && can2 ? 2 : dsa_forced == 3 && can3 ? 3 : 1;
	return can2 && n - dsa_all(d, n, pos0) >= DM_MIN ? 2 : can3 ? 3 : 1;
}

/* One group's launches on path (wk_cuda_dsa_path) over keys of up to longest: the scores
 * and the select (paths 1 and 3: one launch; 2: dm_launch's two). hist: the group's rows of
 * counts for path 3's blocks to fill (a.hist), or NULL. */
template <typename KV>
static cudaError_t dsa_group(int path, struct dsa_args a, int longest, unsigned *hist)
{
	/* The selecting kernels' dynamic shared memory allowed up to the largest list, once a
	 * device (a decode step's call, one a layer: not a driver call each; path 2's select is
	 * k_dsa_topk_n); a bit a device < 64 */
	static unsigned long long opted[2];
	int dev = 0;
	cudaError_t e = cudaGetDevice(&dev);
	unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
	const cudaFuncAttribute max_dyn = cudaFuncAttributeMaxDynamicSharedMemorySize;
	if (e == cudaSuccess && !(__atomic_load_n(&opted[path == 3], __ATOMIC_ACQUIRE) & bit)) {
		e = path == 3 ? cudaFuncSetAttribute((k_dsa_topk_tc<KV>), max_dyn,
						     (int)DSA_DYN(DSA_CAP))
			      : cudaFuncSetAttribute((k_dsa_topk_n<KV>), max_dyn,
						     (int)DSA_DYN(DSA_CAP));
		if (e == cudaSuccess)
			__atomic_fetch_or(&opted[path == 3], bit, __ATOMIC_RELEASE);
	}
	if (e != cudaSuccess)
		return e;
	dim3 grid((unsigned)((longest + DT_BLOCK - 1) / DT_BLOCK), (unsigned)a.ng);
	a.cap = dsa_cap; /* the select's list in dynamic shared memory */
	size_t dyn = a.cap > 0 ? DSA_DYN(a.cap) : 0;
	a.hist = path == 3 && a.cap > 0 ? hist : NULL;
	if (path == 2)
		return dm_launch<KV>(a, longest);
	if (path == 3) {
		k_dsa_topk_tc<KV><<<grid, DSA_THREADS, dyn, wk_st()>>>(a);
	} else {
		grid.x = (unsigned)(((size_t)longest * 32 + DSA_THREADS - 1) / DSA_THREADS);
		k_dsa_topk_n<KV><<<grid, DSA_THREADS, dyn, wk_st()>>>(a);
	}
	return cudaSuccess;
}

extern "C" int wk_cuda_dsa_topk(int *sel, int *nsel, const float *q, const float *w,
				const struct cpu_dsa *d, int n, int pos0, float *scores,
				size_t score_floats, unsigned *count, int max_group, unsigned *hist,
				int hist_rows, char *err, size_t errsz)
{
	enum dt_type kv = d->kv;
	if (d->topk < 0 || pos0 < 0 || d->n_heads < 0 || d->head_dim < 0 || max_group < 1 ||
	    (d->seq && (!d->pos || d->keys_max < 1)) ||
	    (kv != DT_F32 && kv != DT_BF16 && !(kv == DT_F8_E4M3 && d->ks)))
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA dsa_topk: topk %d, pos0 %d, %d heads of %d, groups of %d, "
			       "%s, a %s key cache (f32, bf16, or fp8 with its scales)", d->topk,
			       pos0, d->n_heads, d->head_dim, max_group,
			       d->seq ? "several sequences" : "one sequence", dt_name(kv));
	if (n <= 0)
		return WK_OK;
	/* a score row holds the most keys of any query */
	size_t stride = d->seq ? (size_t)d->keys_max : (size_t)pos0 + (size_t)n;
	if (score_floats < stride)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA dsa_topk: %zu floats of scores for "
			       "queries of up to %zu keys", score_floats, stride);
	/* One sequence: query i has pos0 + i + 1 keys, so the first max(0, topk - pos0) take
	 * them all, in a launch of their own (a long prefill's first topk queries would
	 * otherwise each hold the grid's blocks for nothing). Several: each query's own. */
	int all = dsa_all(d, n, pos0), path = wk_cuda_dsa_path(d, n, pos0);
	if (all > 0) {
		k_dsa_all<<<all, 128, 0, wk_st()>>>(sel, nsel, pos0, d->topk);
		int rc = launched("dsa_topk", err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	/* The rest in groups whose score rows fit the scratch: one launch a group. */
	size_t fit = score_floats / stride;
	int group = fit < (size_t)max_group ? (int)fit : max_group;
	if (group > 65535)
		group = 65535;
	for (int i0 = all; i0 < n; i0 += group) {
		int g = n - i0 < group ? n - i0 : group;
		size_t len = d->seq ? stride : (size_t)pos0 + i0 + g; /* the longest here */
		struct dsa_args a = {sel, nsel, scores, stride, q, w, *d, pos0, i0, count, 0, g,
				     0, 0, 0, NULL};
		unsigned *h = hist && g <= hist_rows ? hist : NULL; /* rows for the group's */
		cudaError_t e = kv == DT_F8_E4M3 ? dsa_group<__nv_fp8_e4m3>(path, a, (int)len, h)
				: kv == DT_BF16	 ? dsa_group<uint16_t>(path, a, (int)len, h)
						 : dsa_group<float>(path, a, (int)len, h);
		if (e != cudaSuccess)
			return check(e, "dsa_topk (tensor cores) shared memory", err, errsz);
		int rc = launched("dsa_topk", err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}
