/*
 * glm_kernels.cu - the GLM families' CUDA kernels of cuda_kernels.h: LayerNorm, the sigmoid
 * noaux_tc MoE router, row gather/scatter for expert batches, MLA absorption and attention,
 * and the DSA lightning indexer's exact top-k. First versions, written for correctness; each
 * has the contract of its CPU reference in kernels/cpu/glm_ref.c (named at each kernel), and
 * tests/unit/test_cuda.c compares them on the same inputs wherever a GPU is present.
 *
 * Where the CPU reference makes a discrete choice (the router's experts, the indexer's
 * positions), the kernel reproduces its tie rule exactly, not just "a" top-k: the engine's
 * batching and the tests rely on identical indices.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
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
 * reference's order, each token's sum on its own. Both k_absorb_q (M = ABSORB_TOK) and
 * k_mla_absorbed (M = 1) compute each element with it, so they agree bit for bit. */
template <typename T, int M>
__device__ __forceinline__ void absorb_q_col(float *oh, size_t ostride, const float *qh,
					     size_t qstride, int m, const T *w, const float *scale,
					     int lora, size_t r0, int d_nope, int c)
{
	float acc[M];
#pragma unroll
	for (int t = 0; t < M; t++)
		acc[t] = 0.0f;
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

/* Block (x, y, z): columns c = x*128 + thread of qa's latent part, head h0 + y, token chunks
 * z, z + gridDim.z, ... of ABSORB_TOK tokens. Each thread walks W_uk,h's d_nope rows down its
 * column c (reads coalesced across the block) and accumulates
 *   qa[i][h][c] = sum_d q[i][h][d] * W[h*(d_nope+d_v) + d][c]
 * for the chunk's tokens, in the reference's order of d. Blocks x == 0 also copy q_pe. */
template <typename T>
__global__ void k_absorb_q(float *qa, const float *q, const T *w, const float *scale, int lora,
			   int n, int n_heads, int d_nope, int d_rope, int d_v, int h0)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x, h = h0 + blockIdx.y;
	size_t r0 = (size_t)h * (d_nope + d_v);
	size_t qstride = (size_t)n_heads * (d_nope + d_rope); /* one token to the next, in q */
	for (int i0 = blockIdx.z * ABSORB_TOK; i0 < n; i0 += gridDim.z * ABSORB_TOK) {
		int m = min(ABSORB_TOK, n - i0);
		const float *qh = q + ((size_t)i0 * n_heads + h) * (d_nope + d_rope);
		float *oh = qa + ((size_t)i0 * n_heads + h) * (lora + d_rope);
		size_t ostride = (size_t)n_heads * (lora + d_rope);
		if (c < lora)
			absorb_q_col<T, ABSORB_TOK>(oh, ostride, qh, qstride, m, w, scale, lora, r0,
						    d_nope, c);
		if (blockIdx.x == 0)
			for (int t = 0; t < m; t++)
				for (int d = threadIdx.x; d < d_rope; d += blockDim.x)
					oh[t * ostride + lora + d] = qh[t * qstride + d_nope + d];
	}
}

/* W[r] . l over lora columns by one warp: lane's columns c = lane, lane + 32, ... summed in
 * order, then across the warp (every lane gets the dot). k_absorb_out and k_mla_absorbed
 * both compute each output with it. */
template <typename T>
__device__ __forceinline__ float absorb_out_dot(const float *l, const T *w, const float *scale,
						int lora, size_t r, int lane)
{
	float acc = 0.0f;
	for (int c = lane; c < lora; c += 32)
		acc += l[c] * wget(w, scale, lora, r, c);
	return warp_sum(acc);
}

/* One warp per (head, value row d): o[i][h][d] = W[h*(d_nope+d_v) + d_nope + d] . lat[i][h]
 * for every token i (the row stays in L1/L2 after the first token). */
template <typename T>
__global__ void k_absorb_out(float *o, const float *lat, const T *w, const float *scale, int lora,
			     int n, int n_heads, int d_nope, int d_v, int h0, int h1)
{
	size_t gw = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (gw >= (size_t)(h1 - h0) * d_v) /* whole warps leave together: gw is per warp */
		return;
	int h = h0 + (int)(gw / d_v), d = (int)(gw % d_v);
	size_t r = (size_t)h * (d_nope + d_v) + d_nope + d;
	for (int i = 0; i < n; i++) {
		const float *l = lat + ((size_t)i * n_heads + h) * lora;
		float acc = absorb_out_dot(l, w, scale, lora, r, lane);
		if (lane == 0)
			o[((size_t)i * n_heads + h) * d_v + d] = acc;
	}
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

/* ---- mla_attention (cpu_ref_mla_attention): one block per (token, head) ---------------------- */

#define MLA_THREADS 128
#define MLA_TILE 64 /* keys scored per step */
#define MLA_SMEM_MAX (48 * 1024) /* shared memory of a block without an opt-in */

/* Online softmax over tiles of MLA_TILE keys, so any number of keys fits:
 *   1. each warp scores keys of the tile (q . [k_a | k_b] * scale, lanes over dimensions);
 *   2. every thread reads the tile's scores, raises the running max m to mn and rescales by
 *      corr = exp(m - mn); the scores become p = exp(score - mn);
 *   3. thread d (and d + 128, ...) adds sum_j p_j v_j[d] to its running output acc[d], and
 *      every thread adds sum_j p_j to its copy of the running denominator l.
 * Shared memory (all dynamic): q [d_a + d_b], acc [d_v], p [MLA_TILE], the tile's key
 * positions tk [MLA_TILE].
 * mla_attend is query i, head h of it, run by the whole block (every thread calls it; sm:
 * that shared memory); k_mla_attention and k_mla_absorbed both run it. KV: the cache's
 * elements (s.k_a, s.v), float, bf16 bits or e4m3 (kv_rc; FP8: rows d_a wide with their
 * scales s.a_s, v is k_a); s.k_b's are kv_b<KV>'s. */
template <typename KV>
__device__ __forceinline__ void mla_attend(float *sm, float *out, const float *q,
					   const struct cpu_mla &s, int pos0, int i, int h)
{
	int dq = s.d_a + s.d_b;
	float *qs = sm, *acc = sm + dq, *p = acc + s.d_v;
	int *tk = (int *)(p + MLA_TILE);
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int *keys = s.sel ? s.sel + (size_t)i * s.sel_stride : NULL;
	int nk = s.sel ? s.nsel[i] : pos0 + i + 1;
	const float *qh = q + ((size_t)i * s.n_heads + h) * dq;
	const KV *vh = (const KV *)s.v + (size_t)h * s.v_head;
	for (int d = threadIdx.x; d < dq; d += blockDim.x)
		qs[d] = qh[d];
	for (int d = threadIdx.x; d < s.d_v; d += blockDim.x)
		acc[d] = 0.0f;
	float m = -INFINITY, l = 0.0f;
	for (int j0 = 0; j0 < nk; j0 += MLA_TILE) { /* block-uniform loop */
		int cnt = min(MLA_TILE, nk - j0);
		for (int j = threadIdx.x; j < cnt; j += blockDim.x)
			tk[j] = keys ? keys[j0 + j] : j0 + j;
		__syncthreads(); /* tk (and, the first time, qs) written */
		for (int j = wid; j < cnt; j += nw) { /* warp-uniform loop */
			size_t t = (size_t)tk[j];
			const KV *ka = (const KV *)s.k_a + t * s.ka_stride + (size_t)h * s.ka_head;
			const typename kv_b<KV>::t *kb = (const typename kv_b<KV>::t *)s.k_b +
							 t * s.kb_stride;
			const float *as = kv_scales(s.a_s, t, s.d_a);
			float dot = 0.0f;
			for (int d = lane; d < s.d_a; d += 32)
				dot += qs[d] * kv_rc(ka, as, d);
			for (int d = lane; d < s.d_b; d += 32)
				dot += qs[s.d_a + d] * kv_ld(kb, d);
			dot = warp_sum(dot);
			if (lane == 0)
				p[j] = dot * s.scale;
		}
		__syncthreads(); /* scores written */
		float mt = -INFINITY;
		for (int j = 0; j < cnt; j++)
			mt = fmaxf(mt, p[j]);
		float mn = fmaxf(m, mt); /* the same in every thread: same reads */
		/* all scores -inf so far: nothing to rescale, and exp(-inf - -inf) would be NaN */
		bool none = mn == -INFINITY;
		float corr = none ? 1.0f : expf(m - mn);
		__syncthreads(); /* every thread has read the scores before they become p */
		for (int j = threadIdx.x; j < cnt; j += blockDim.x)
			p[j] = none ? 0.0f : expf(p[j] - mn);
		__syncthreads(); /* p written */
		float ls = 0.0f;
		for (int j = 0; j < cnt; j++)
			ls += p[j];
		l = l * corr + ls;
		for (int d = threadIdx.x; d < s.d_v; d += blockDim.x) {
			float a = acc[d] * corr;
			for (int j = 0; j < cnt; j++)
				a += p[j] * kv_rc(vh + (size_t)tk[j] * s.v_stride,
						  kv_scales(s.a_s, (size_t)tk[j], s.d_a), d);
			acc[d] = a; /* only this thread touches acc[d] */
		}
		m = mn;
		__syncthreads(); /* p and tk are rewritten by the next tile */
	}
	/* no keys (nsel 0): 0/0, NaN, as the reference */
	float *oh = out + ((size_t)i * s.n_heads + h) * s.d_v;
	for (int d = threadIdx.x; d < s.d_v; d += blockDim.x)
		oh[d] = acc[d] / l;
}

template <typename KV>
__global__ void k_mla_attention(float *out, const float *q, struct cpu_mla s, int pos0, int i0,
				int h0)
{
	extern __shared__ float sm[];
	grid_dep_launch();
	mla_attend<KV>(sm, out, q, s, pos0, i0 + blockIdx.x, h0 + blockIdx.y);
}

/* The dynamic shared memory of mla_attend for *s; WK_EINVAL, naming what, past the limit, for
 * a cache of another type than f32, bf16 and FP8, or for an FP8 one outside struct cpu_mla's
 * contract (no scales, v not k_a's layout). */
static int mla_smem(const char *what, const struct cpu_mla *s, size_t *smem, char *err,
		    size_t errsz)
{
	if (s->kv != DT_F32 && s->kv != DT_BF16 && s->kv != DT_F8_E4M3)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: a %s KV cache (f32, bf16 or fp8)",
			       what, dt_name(s->kv));
	if (s->kv == DT_F8_E4M3 &&
	    (!s->a_s || s->d_v != s->d_a || s->ka_head || s->v_head ||
	     s->ka_stride != (size_t)s->d_a || s->v_stride != (size_t)s->d_a))
		return wk_errf(err, errsz, WK_EINVAL, "CUDA %s: an fp8 latent takes its scales "
			       "and v as k_a, rows d_a %d wide (d_v %d)", what, s->d_a, s->d_v);
	*smem = ((size_t)s->d_a + s->d_b + s->d_v + 2 * MLA_TILE) * sizeof(float);
	if (s->d_a < 0 || s->d_b < 0 || s->d_v < 0 || *smem > MLA_SMEM_MAX)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA %s: d_a %d + d_b %d + d_v %d floats (this kernel holds up to "
			       "%d in shared memory)",
			       what, s->d_a, s->d_b, s->d_v, MLA_SMEM_MAX / 4 - 2 * MLA_TILE);
	return WK_OK;
}

extern "C" int wk_cuda_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n,
				     int pos0, int i0, int i1, int h0, int h1, char *err,
				     size_t errsz)
{
	(void)n;
	size_t smem;
	int rc = mla_smem("mla_attention", s, &smem, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (i0 < 0 || h0 < 0 || h1 > s->n_heads || h1 - h0 > MAX_GRID_YZ)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA mla_attention: tokens %d..%d, heads %d..%d of %d", i0, i1, h0,
			       h1, s->n_heads);
	if (i1 <= i0 || h1 <= h0 || s->d_v == 0)
		return WK_OK;
	dim3 grid((unsigned)(i1 - i0), (unsigned)(h1 - h0));
	if (s->kv == DT_F8_E4M3)
		k_mla_attention<__nv_fp8_e4m3><<<grid, MLA_THREADS, smem, wk_st()>>>(
			out, q, *s, pos0, i0, h0);
	else if (s->kv == DT_BF16)
		k_mla_attention<uint16_t><<<grid, MLA_THREADS, smem, wk_st()>>>(out, q, *s, pos0,
										i0, h0);
	else
		k_mla_attention<float><<<grid, MLA_THREADS, smem, wk_st()>>>(out, q, *s, pos0, i0,
									     h0);
	return launched("mla_attention", err, errsz);
}

/* ---- mla_absorbed: absorb_q, mla_attention and absorb_out in one launch --------------------- */

/* One block of MLA_THREADS per (token i0 + x, head y), its three stages apart by barriers:
 *   1. qa[i][h] (absorb_q_col per latent column, then q_pe copied), to global memory;
 *   2. mla_attend over it (reading qa back, as k_mla_attention reads q) into lat[i][h];
 *   3. o[i][h][d] = absorb_out_dot(W_uv row d, lat[i][h]), one warp per row d.
 * Each element comes from the single kernels' own device code, so qa, lat and o equal theirs
 * bit for bit. The block reads back only what its own threads wrote before a __syncthreads,
 * which makes those global writes visible to the block. s: the latent attention, d_a = d_v
 * = lora, d_b = d_rope. */
template <typename T, typename KV>
__global__ void k_mla_absorbed(float *o, float *qa, float *lat, const float *q, const T *w,
			       const float *scale, struct cpu_mla s, int pos0, int d_nope, int d_v)
{
	extern __shared__ float sm[];
	grid_dep_launch();
	int i = blockIdx.x, h = blockIdx.y, lora = s.d_a, d_rope = s.d_b, H = s.n_heads;
	size_t r0 = (size_t)h * (d_nope + d_v), ih = (size_t)i * H + h;
	const float *qh = q + ih * (d_nope + d_rope);
	float *qah = qa + ih * (lora + d_rope);
	for (int c = threadIdx.x; c < lora; c += blockDim.x)
		absorb_q_col<T, 1>(qah, 0, qh, 0, 1, w, scale, lora, r0, d_nope, c);
	for (int d = threadIdx.x; d < d_rope; d += blockDim.x)
		qah[lora + d] = qh[d_nope + d];
	__syncthreads(); /* qa[i][h] written */
	mla_attend<KV>(sm, lat, qa, s, pos0, i, h);
	__syncthreads(); /* lat[i][h] written */
	const float *lh = lat + ih * lora;
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int d = wid; d < d_v; d += nw) { /* warp-uniform loop */
		float v = absorb_out_dot(lh, w, scale, lora, r0 + d_nope + d, lane);
		if (lane == 0)
			o[ih * d_v + d] = v;
	}
}

template <typename T>
static void absorbed_launch(float *o, float *qa, float *lat, const float *q, const void *w,
			    const float *scale, const struct cpu_mla *s, int n, int pos0,
			    int d_nope, int d_v, size_t smem)
{
	dim3 grid((unsigned)n, (unsigned)s->n_heads);
	if (s->kv == DT_F8_E4M3)
		k_mla_absorbed<T, __nv_fp8_e4m3><<<grid, MLA_THREADS, smem, wk_st()>>>(
			o, qa, lat, q, (const T *)w, scale, *s, pos0, d_nope, d_v);
	else if (s->kv == DT_BF16)
		k_mla_absorbed<T, uint16_t><<<grid, MLA_THREADS, smem, wk_st()>>>(
			o, qa, lat, q, (const T *)w, scale, *s, pos0, d_nope, d_v);
	else
		k_mla_absorbed<T, float><<<grid, MLA_THREADS, smem, wk_st()>>>(
			o, qa, lat, q, (const T *)w, scale, *s, pos0, d_nope, d_v);
}

extern "C" int wk_cuda_mla_absorbed(float *o, float *qa, float *lat, const float *q,
				    const void *w, enum dt_type wt, const float *scale, int lora,
				    const struct cpu_mla *s, int n, int pos0, int d_nope, int d_v,
				    char *err, size_t errsz)
{
	size_t smem;
	int rc = absorb_args("mla_absorbed", wt, scale, lora, s->n_heads, 0, s->n_heads, err,
			     errsz);
	if (rc != WK_OK || (rc = mla_smem("mla_absorbed", s, &smem, err, errsz)) != WK_OK)
		return rc;
	if (s->d_a != lora || s->d_v != lora || d_nope < 0 || d_v < 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA mla_absorbed: the latent attention's d_a %d and d_v %d must "
			       "both be kv_b's lora %d (d_nope %d, d_v %d)",
			       s->d_a, s->d_v, lora, d_nope, d_v);
	if (n <= 0 || s->n_heads <= 0)
		return WK_OK;
	switch (wt) {
	case DT_F32:
		absorbed_launch<float>(o, qa, lat, q, w, scale, s, n, pos0, d_nope, d_v, smem);
		break;
	case DT_BF16:
		absorbed_launch<__nv_bfloat16>(o, qa, lat, q, w, scale, s, n, pos0, d_nope, d_v,
					       smem);
		break;
	case DT_F16:
		absorbed_launch<__half>(o, qa, lat, q, w, scale, s, n, pos0, d_nope, d_v, smem);
		break;
	default: /* DT_F8_E4M3, checked above */
		absorbed_launch<__nv_fp8_e4m3>(o, qa, lat, q, w, scale, s, n, pos0, d_nope, d_v,
					       smem);
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

struct dsa_smem { /* the select's shared memory */
	unsigned hist[256];
	unsigned prefix;
	int need;
	int scratch[32];
};

/* The whole block: the reference's top-k of scores[0..len) (len > topk), positions
 * ascending. The order is (key desc, position asc) with key = order_key(score), a total
 * order, so the chosen set is unique: every key above the k-th largest key K, then the lowest
 * positions among those equal to K. K comes from a radix select, 8 bits a pass from the top:
 * a histogram of the next digit among keys matching the digits fixed so far, and the digit
 * where the count from the top reaches the number still needed. Then one pass in position
 * order writes each chosen position at its rank among the chosen: (keys > K before it) +
 * min(keys == K before it, need). No scratch beyond shared memory. */
__device__ void dsa_select_block(int *sel, int *nsel, const float *scores, int len, int topk,
				 struct dsa_smem *sm)
{
	unsigned prefix = 0, mask = 0;
	int need = topk; /* still to take among the keys that match prefix under mask */
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x)
			sm->hist[b] = 0;
		__syncthreads();
		for (int t = threadIdx.x; t < len; t += blockDim.x) {
			unsigned key = order_key(scores[t]);
			if ((key & mask) == prefix)
				atomicAdd(&sm->hist[(key >> shift) & 255u], 1u);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			/* at least need keys match: find b with above < need <= above + hist[b] */
			int above = 0, b = 255;
			for (; b > 0; b--) {
				if (above + (int)sm->hist[b] >= need)
					break;
				above += (int)sm->hist[b];
			}
			sm->prefix = prefix | ((unsigned)b << shift);
			sm->need = need - above;
		}
		__syncthreads();
		prefix = sm->prefix; /* rewritten only after the next pass's two barriers */
		need = sm->need;
		mask |= 255u << shift;
	}
	/* prefix is K; topk - need keys are above it, need of those equal to it are taken */
	int gt_base = 0, eq_base = 0; /* counts in the chunks before this one */
	for (int c0 = 0; c0 < len; c0 += blockDim.x) { /* block-uniform loop */
		int t = c0 + (int)threadIdx.x;
		unsigned key = t < len ? order_key(scores[t]) : 0;
		int gt = t < len && key > prefix, eq = t < len && key == prefix;
		int packed = gt | eq << 16, total; /* a chunk counts <= 1024 each: no carry */
		int excl = block_scan(packed, sm->scratch, &total) - packed;
		int gt_before = gt_base + (excl & 0xffff), eq_before = eq_base + (excl >> 16);
		if (gt || (eq && eq_before < need))
			sel[gt_before + min(eq_before, need)] = t;
		gt_base += total & 0xffff;
		eq_base += total >> 16;
	}
	if (threadIdx.x == 0)
		*nsel = topk;
}

struct dsa_args {
	int *sel, *nsel;
	float *scores; /* [group][stride] */
	size_t stride;
	const float *q, *w;
	const void *k;   /* of type KV, k_dsa_topk_n's */
	const float *ks; /* FP8: the keys' scales */
	int pos0, i0, n_heads, head_dim, topk;
	float qk_scale, w_scale;
	unsigned *count; /* [group], zero, left zero */
};

/* A group of queries in one launch: blockIdx.y is query i0 + y, whose keys [0, len) are
 * scored one warp each across gridDim.x blocks; the last of those blocks to finish (a
 * counter per query, the writes fenced before it is bumped) selects that query's top-k from
 * the scores, so scoring and selecting cost one launch, not two. */
template <typename KV>
__global__ void __launch_bounds__(DSA_THREADS) k_dsa_topk_n(struct dsa_args a)
{
	__shared__ struct dsa_smem sm;
	__shared__ int s_last;
	int g = blockIdx.y, i = a.i0 + g, len = a.pos0 + i + 1;
	float *sc = a.scores + (size_t)g * a.stride;
	size_t t = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	if (t < (size_t)len) /* whole warps alike */
		dsa_score_warp(sc + t, a.q + (size_t)i * a.n_heads * a.head_dim,
			       (const KV *)a.k + t * a.head_dim, kv_scales(a.ks, t, a.head_dim),
			       a.w + (size_t)i * a.n_heads, a.n_heads, a.head_dim, a.qk_scale,
			       a.w_scale, threadIdx.x & 31);
	__threadfence(); /* this block's scores are visible before the counter moves */
	__syncthreads();
	if (threadIdx.x == 0)
		s_last = atomicAdd(&a.count[g], 1u) == gridDim.x - 1;
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	dsa_select_block(a.sel + (size_t)i * a.topk, a.nsel + i, sc, len, a.topk, &sm);
	if (threadIdx.x == 0)
		a.count[g] = 0; /* ready for the next launch */
}

/* Queries with no more keys than topk take them all: sel[i][j] = j, nsel[i] = pos0 + i + 1. */
__global__ void k_dsa_all(int *sel, int *nsel, int pos0, int topk)
{
	int i = blockIdx.x, len = pos0 + i + 1;
	for (int j = threadIdx.x; j < len; j += blockDim.x)
		sel[(size_t)i * topk + j] = j;
	if (threadIdx.x == 0)
		nsel[i] = len;
}

extern "C" int wk_cuda_dsa_topk(int *sel, int *nsel, const float *q, const void *k,
				enum dt_type kv, const float *ks, const float *w, int n, int pos0,
				int n_heads, int head_dim, int topk, float qk_scale, float w_scale,
				float *scores, size_t score_floats, unsigned *count, int max_group,
				char *err, size_t errsz)
{
	if (topk < 0 || pos0 < 0 || n_heads < 0 || head_dim < 0 || max_group < 1 ||
	    (kv != DT_F32 && kv != DT_BF16 && !(kv == DT_F8_E4M3 && ks)))
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA dsa_topk: topk %d, pos0 %d, %d heads of %d, groups of %d, "
			       "a %s key cache (f32, bf16, or fp8 with its scales)", topk, pos0,
			       n_heads, head_dim, max_group, dt_name(kv));
	if (n <= 0)
		return WK_OK;
	size_t stride = (size_t)pos0 + (size_t)n; /* the longest query's keys */
	if (score_floats < stride)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA dsa_topk: %zu floats of scores for "
			       "queries of up to %zu keys", score_floats, stride);
	/* query i has pos0 + i + 1 keys: the first max(0, topk - pos0) queries take them all */
	int all = topk - pos0 < n ? (topk - pos0 > 0 ? topk - pos0 : 0) : n;
	if (all > 0) {
		k_dsa_all<<<all, 128, 0, wk_st()>>>(sel, nsel, pos0, topk);
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
		int g = n - i0 < group ? n - i0 : group, len = pos0 + i0 + g; /* longest here */
		struct dsa_args a = {sel, nsel, scores, stride, q, w, k, ks, pos0, i0, n_heads,
				     head_dim, topk, qk_scale, w_scale, count};
		dim3 grid((unsigned)(((size_t)len * 32 + DSA_THREADS - 1) / DSA_THREADS), (unsigned)g);
		if (kv == DT_F8_E4M3)
			k_dsa_topk_n<__nv_fp8_e4m3><<<grid, DSA_THREADS, 0, wk_st()>>>(a);
		else if (kv == DT_BF16)
			k_dsa_topk_n<uint16_t><<<grid, DSA_THREADS, 0, wk_st()>>>(a);
		else
			k_dsa_topk_n<float><<<grid, DSA_THREADS, 0, wk_st()>>>(a);
		int rc = launched("dsa_topk", err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}
