/*
 * moe_kernels.cu - a MoE layer's routed experts as one grouped op (wk_cuda_moe_experts, with
 * the contract of cpu_ref_moe_experts in kernels/cpu/glm_ref.c), in four launches whatever
 * the number of tokens:
 *
 *   1. plan (one block): count the slots of each local expert, prefix-sum the counts, list
 *      the active experts (count > 0) compactly and place every local slot into its expert's
 *      group: tok[g] = the token of grouped slot g, pos[t][j] = g, or -1 for a slot of
 *      another rank's expert;
 *   2. gate/up: block (x, y) computes rows x*MOE_ROWS .. of h[g] = silu(gate_e . x[tok[g]]) *
 *      (up_e . x[tok[g]]) for every slot g of active expert y (and y + gridDim.y, ...);
 *   3. down: the same over dim rows, z[g] = down_e . h[g];
 *   4. combine: one block per token, y[t] += wt[t][j] * z[pos[t][j]], j = 0, 1, ... as the
 *      reference adds them.
 *
 * The host never reads the plan back (that would cost a copy and a wait), so the grids of 2
 * and 3 are sized by what the plan could find: min(n_local, n * top_k) experts, blocks past
 * the active count leaving at once. Each grouped slot's row is computed from its own
 * (expert, token) alone, so the order of slots within a group, which the plan's atomics make
 * arbitrary, changes no value: the result is deterministic.
 *
 * First version, written for correctness: a warp per output row, MOE_TOK slots per pass
 * over the row so that it is read from memory once per MOE_TOK slots (and from cache
 * after the first pass); x and h are read from cache, not staged in shared memory.
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
#include "kernels/cuda/moe_route.cuh"

#define MOE_THREADS 256
#define MOE_ROWS (MOE_THREADS / 32) /* output rows per block of 2 and 3: a warp each */
#define MOE_TOK 4 /* slots per pass over a weight row, accumulated in registers */
#define PLAN_THREADS 1024
#define MAX_GRID_Y 65535

/* The plan in the caller's scratch, each part 256-byte aligned (see plan_layout). Slots
 * are numbered s = t * top_k + j; grouped slots g are the local ones, expert by expert. */
struct moe_plan {
	int *count; /* [n_local] slots of local expert e */
	int *start; /* [n_local] its first grouped slot */
	int *cur; /* [n_local] placement cursor; start + count once placed */
	int *active; /* [n_local] local experts with count > 0, ascending; n_active of them */
	int *n_active; /* [1] */
	int *tok; /* [n * top_k] token of grouped slot g */
	int *pos; /* [n * top_k] grouped slot of slot s, or -1 */
	float *h; /* [n * top_k][inter] SiLU(gate) * up of grouped slot g */
	float *z; /* [n * top_k][dim] the expert's output for grouped slot g */
};

static size_t al256(size_t b)
{
	return (b + 255) & ~(size_t)255;
}

/* The scratch's size; with base, also the parts' addresses in *p. Arguments are >= 0. */
static size_t plan_layout(char *base, int n, int top_k, int n_local, int dim, int inter,
			  struct moe_plan *p)
{
	size_t ns = (size_t)n * (size_t)top_k, nl = (size_t)n_local;
	size_t sz[9] = {nl * 4, nl * 4, nl * 4, nl * 4, 4, ns * 4, ns * 4,
			ns * (size_t)inter * 4, ns * (size_t)dim * 4};
	char *at[9];
	size_t off = 0;
	for (int i = 0; i < 9; i++) {
		at[i] = base ? base + off : NULL;
		off += al256(sz[i]);
	}
	if (p) {
		struct moe_plan q = {(int *)at[0], (int *)at[1], (int *)at[2],
				     (int *)at[3], (int *)at[4], (int *)at[5],
				     (int *)at[6], (float *)at[7], (float *)at[8]};
		*p = q;
	}
	return off;
}

/* ---- 1. plan: one block ---------------------------------------------------------------- */

/* The whole block (any size). scan: 32 ints of shared memory. */
__device__ void plan_block(struct moe_plan p, const int *idx, int nslots, int top_k, int ex0,
			   int n_local, int *scan)
{
	for (int e = threadIdx.x; e < n_local; e += blockDim.x)
		p.count[e] = 0;
	__syncthreads(); /* a block's global writes are visible to it after a barrier */
	for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
		int e = idx[s] - ex0;
		if (e >= 0 && e < n_local)
			atomicAdd(&p.count[e], 1);
	}
	__syncthreads();
	int off = 0, na = 0; /* grouped slots and active experts before this chunk */
	for (int c0 = 0; c0 < n_local; c0 += blockDim.x) { /* block-uniform loop */
		int e = c0 + (int)threadIdx.x;
		int c = e < n_local ? p.count[e] : 0, act = c > 0, tc, ta;
		int before = block_scan(c, scan, &tc) - c;
		int abefore = block_scan(act, scan, &ta) - act;
		if (e < n_local)
			p.start[e] = p.cur[e] = off + before;
		if (act)
			p.active[na + abefore] = e;
		off += tc;
		na += ta;
	}
	if (threadIdx.x == 0)
		*p.n_active = na;
	__syncthreads(); /* cur is complete */
	for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
		int e = idx[s] - ex0, g = -1;
		if (e >= 0 && e < n_local) {
			g = atomicAdd(&p.cur[e], 1);
			p.tok[g] = s / top_k;
		}
		p.pos[s] = g;
	}
}

__global__ void k_moe_plan(struct moe_plan p, const int *idx, int nslots, int top_k, int ex0,
			   int n_local)
{
	__shared__ int scan[32];
	plan_block(p, idx, nslots, top_k, ex0, n_local, scan);
}

/* The router and the plan in one launch: block t routes token t (moe_route.cuh, as
 * k_moe_route), and the last block to finish (a counter, the routing fenced before it is
 * bumped, left zero) plans the grouped slots from every token's choice, as k_moe_plan. */
struct route_args {
	const float *logits, *bias;
	int n_experts, n_group, topk_group;
	bool norm;
	float scale;
	int *idx;
	float *wt;
	unsigned *count;
};

__global__ void k_moe_route_plan(struct route_args r, struct moe_plan p, int nslots, int top_k,
				 int ex0, int n_local)
{
	__shared__ int scan[32];
	__shared__ int s_last;
	route_token(r.idx, r.wt, r.logits, r.bias, r.n_experts, top_k, r.n_group, r.topk_group,
		    r.norm, r.scale, (int)blockIdx.x);
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		s_last = atomicAdd(r.count, 1u) == gridDim.x - 1;
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	plan_block(p, r.idx, nslots, top_k, ex0, n_local, scan);
	if (threadIdx.x == 0)
		*r.count = 0;
}

/* ---- 2, 3. the experts' matmuls: a warp per output row ------------------------------------- */

/* The block scale of w's element block i: 1 but for FP8. An FP8 expert without scales (the
 * host cannot see the device's table to refuse it) gives NaN, not a fault. */
template <typename T>
__device__ __forceinline__ float scale_at(const T *w, const float *s, size_t i)
{
	(void)w, (void)s, (void)i;
	return 1.0f;
}
__device__ __forceinline__ float scale_at(const __nv_fp8_e4m3 *w, const float *s, size_t i)
{
	(void)w;
	return s ? s[i] : NAN;
}

/* acc[k] = w[r] . in[k] for k < m (m <= MOE_TOK, warp-uniform), w [rows][cols] with FP8
 * block scales s [ceil(rows/128)][ceil(cols/128)] as cpu_ref_matmul_fp8 applies them: each
 * 128-column block's sum times its scale. Every lane of the warp must call it and gets the
 * sums. in[k] for k >= m is not read. */
template <typename T>
__device__ void warp_dots(float *acc, const T *w, const float *s, int r, int cols,
			  const float *const *in, int m)
{
	int lane = threadIdx.x & 31, nb = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
	const T *wr = w + (size_t)r * cols;
	for (int k = 0; k < MOE_TOK; k++)
		acc[k] = 0.0f;
	for (int b = 0; b < nb; b++) {
		int c0 = b * FP8_BLOCK, c1 = min(c0 + FP8_BLOCK, cols);
		float part[MOE_TOK];
#pragma unroll
		for (int k = 0; k < MOE_TOK; k++)
			part[k] = 0.0f;
		for (int c = c0 + lane; c < c1; c += 32) {
			float wv = load_w(wr, (size_t)c);
#pragma unroll
			for (int k = 0; k < MOE_TOK; k++)
				if (k < m)
					part[k] += wv * in[k][c];
		}
		float sc = scale_at(w, s, (size_t)(r / FP8_BLOCK) * nb + b);
#pragma unroll
		for (int k = 0; k < MOE_TOK; k++)
			acc[k] += part[k] * sc; /* lanes' partials scale alike: one sum at the end */
	}
#pragma unroll
	for (int k = 0; k < MOE_TOK; k++)
		if (k < m)
			acc[k] = warp_sum(acc[k]);
}

/* h[g][r] = silu(gate_e[r] . x[tok[g]]) * (up_e[r] . x[tok[g]]) for the slots g of the
 * block's experts, with silu(v) = v / (1 + exp(-v)) as cpu_ref_silu_mul. Warps whose row is
 * past inter leave at once (no block barriers here). */
template <typename T>
__global__ void k_moe_gate_up(struct moe_plan p, const float *x,
			      const struct cpu_expert *experts, int dim, int inter)
{
	int r = blockIdx.x * MOE_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= inter)
		return;
	int na = *p.n_active;
	for (int a = blockIdx.y; a < na; a += gridDim.y) {
		int e = p.active[a];
		struct cpu_expert ex = experts[e];
		int g1 = p.start[e] + p.count[e];
		for (int g0 = p.start[e]; g0 < g1; g0 += MOE_TOK) {
			int m = min(MOE_TOK, g1 - g0);
			const float *in[MOE_TOK];
#pragma unroll
			for (int k = 0; k < MOE_TOK; k++)
				in[k] = k < m ? x + (size_t)p.tok[g0 + k] * dim : NULL;
			float gs[MOE_TOK], us[MOE_TOK];
			warp_dots(gs, (const T *)ex.gate, ex.gate_s, r, dim, in, m);
			warp_dots(us, (const T *)ex.up, ex.up_s, r, dim, in, m);
			if (lane == 0)
				for (int k = 0; k < m; k++)
					p.h[(size_t)(g0 + k) * inter + r] =
						gs[k] / (1.0f + expf(-gs[k])) * us[k];
		}
	}
}

/* z[g][r] = down_e[r] . h[g] for the slots g of the block's experts. */
template <typename T>
__global__ void k_moe_down(struct moe_plan p, const struct cpu_expert *experts, int dim,
			   int inter)
{
	int r = blockIdx.x * MOE_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= dim)
		return;
	int na = *p.n_active;
	for (int a = blockIdx.y; a < na; a += gridDim.y) {
		int e = p.active[a];
		struct cpu_expert ex = experts[e];
		int g1 = p.start[e] + p.count[e];
		for (int g0 = p.start[e]; g0 < g1; g0 += MOE_TOK) {
			int m = min(MOE_TOK, g1 - g0);
			const float *in[MOE_TOK];
#pragma unroll
			for (int k = 0; k < MOE_TOK; k++)
				in[k] = k < m ? p.h + (size_t)(g0 + k) * inter : NULL;
			float zs[MOE_TOK];
			warp_dots(zs, (const T *)ex.down, ex.down_s, r, inter, in, m);
			if (lane == 0)
				for (int k = 0; k < m; k++)
					p.z[(size_t)(g0 + k) * dim + r] = zs[k];
		}
	}
}

/* ---- 4. combine: one block per token ------------------------------------------------------- */

/* y[t][c] += wt[t][j] * z[pos[t][j]][c] for j = 0, 1, ... with pos >= 0, one addition at a
 * time in the reference's order. */
__global__ void k_moe_combine(float *y, const int *pos, const float *wt, const float *z,
			      int top_k, int dim)
{
	size_t t = blockIdx.x;
	const int *pt = pos + t * top_k;
	const float *wv = wt + t * top_k;
	float *yt = y + t * dim;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) {
		float v = yt[c];
		for (int j = 0; j < top_k; j++) {
			int g = pt[j];
			if (g >= 0)
				v += wv[j] * z[(size_t)g * dim + c];
		}
		yt[c] = v;
	}
}

/* ---- entry points ---------------------------------------------------------------------------- */

extern "C" size_t wk_cuda_moe_experts_scratch(int n, int top_k, int n_local, int dim, int inter)
{
	return plan_layout(NULL, n > 0 ? n : 0, top_k > 0 ? top_k : 0, n_local > 0 ? n_local : 0,
			   dim > 0 ? dim : 0, inter > 0 ? inter : 0, NULL);
}

template <typename T>
static int experts_launch(const struct moe_plan &p, const float *x,
			  const struct cpu_expert *experts, dim3 gu, dim3 dn, int dim, int inter,
			  char *err, size_t errsz)
{
	k_moe_gate_up<T><<<gu, MOE_THREADS>>>(p, x, experts, dim, inter);
	int rc = launched("moe_experts gate/up", err, errsz);
	if (rc != WK_OK)
		return rc;
	k_moe_down<T><<<dn, MOE_THREADS>>>(p, experts, dim, inter);
	return launched("moe_experts down", err, errsz);
}

static int after_plan(const struct moe_plan &p, float *y, const float *x, const float *wt,
		      int n, int top_k, const struct cpu_expert *experts, int n_local,
		      enum dt_type wdt, int dim, int inter, char *err, size_t errsz);

/* The checks both entry points make; *skip when there is nothing to do. */
static int experts_args(int n, int top_k, int n_local, enum dt_type wdt, int dim, int inter,
			const struct cpu_expert *experts, const void *scratch, bool *skip,
			char *err, size_t errsz);

extern "C" int wk_cuda_moe_experts(float *y, const float *x, const int *idx, const float *wt,
				   int n, int top_k, const struct cpu_expert *experts, int ex0,
				   int n_local, enum dt_type wdt, int dim, int inter,
				   void *scratch, char *err, size_t errsz)
{
	bool skip;
	int rc = experts_args(n, top_k, n_local, wdt, dim, inter, experts, scratch, &skip, err,
			      errsz);
	if (rc != WK_OK || skip)
		return rc;
	int nslots = n * top_k;
	struct moe_plan p;
	plan_layout((char *)scratch, n, top_k, n_local, dim, inter, &p);
	k_moe_plan<<<1, PLAN_THREADS>>>(p, idx, nslots, top_k, ex0, n_local);
	if ((rc = launched("moe_experts plan", err, errsz)) != WK_OK)
		return rc;
	return after_plan(p, y, x, wt, n, top_k, experts, n_local, wdt, dim, inter, err, errsz);
}

extern "C" int wk_cuda_moe_route_experts(float *y, const float *x, const float *logits,
					 const float *bias, int n_experts, int n_group,
					 int topk_group, bool norm, float scale, int *idx, float *wt,
					 int n, int top_k, const struct cpu_expert *experts, int ex0,
					 int n_local, enum dt_type wdt, int dim, int inter,
					 void *scratch, unsigned *count, char *err, size_t errsz)
{
	bool skip;
	int rc = wk_cuda_moe_route_check(n_experts, top_k, n_group, topk_group, err, errsz);
	if (rc == WK_OK)
		rc = experts_args(n, top_k, n_local, wdt, dim, inter, experts, scratch, &skip, err,
				  errsz);
	if (rc != WK_OK || skip)
		return rc;
	if (!count)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA moe_route_experts: no counter");
	int nslots = n * top_k;
	struct moe_plan p;
	plan_layout((char *)scratch, n, top_k, n_local, dim, inter, &p);
	struct route_args r = {logits, bias, n_experts, n_group, topk_group, norm, scale, idx, wt,
			       count};
	k_moe_route_plan<<<n, ROUTE_THREADS>>>(r, p, nslots, top_k, ex0, n_local);
	if ((rc = launched("moe_experts route and plan", err, errsz)) != WK_OK)
		return rc;
	return after_plan(p, y, x, wt, n, top_k, experts, n_local, wdt, dim, inter, err, errsz);
}

static int experts_args(int n, int top_k, int n_local, enum dt_type wdt, int dim, int inter,
			const struct cpu_expert *experts, const void *scratch, bool *skip,
			char *err, size_t errsz)
{
	*skip = false;
	if (wdt != DT_F32 && wdt != DT_BF16 && wdt != DT_F16 && wdt != DT_F8_E4M3)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA moe_experts: expert weights in %s (F32, BF16, F16 or F8_E4M3 "
			       "only)",
			       dt_name(wdt));
	if (n < 0 || top_k < 0 || n_local < 0 || dim <= 0 || inter <= 0 ||
	    (size_t)n * (size_t)top_k > INT_MAX)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA moe_experts: %d tokens, top %d, %d local experts, dim %d, "
			       "inter %d",
			       n, top_k, n_local, dim, inter);
	if (n == 0 || top_k == 0 || n_local == 0) {
		*skip = true; /* no slot is local: y stays as it is */
		return WK_OK;
	}
	if (!experts || !scratch)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA moe_experts: no %s",
			       experts ? "scratch" : "expert table");
	return WK_OK;
}

/* The experts' launches once the plan is in the scratch: gate/up, down, combine. */
static int after_plan(const struct moe_plan &p, float *y, const float *x, const float *wt,
		      int n, int top_k, const struct cpu_expert *experts, int n_local,
		      enum dt_type wdt, int dim, int inter, char *err, size_t errsz)
{
	int nslots = n * top_k, rc;
	/* the most experts the plan can find active; blocks beyond loop, above MAX_GRID_Y */
	int most = n_local < nslots ? n_local : nslots;
	unsigned ey = (unsigned)(most < MAX_GRID_Y ? most : MAX_GRID_Y);
	dim3 gu(blocks((size_t)inter, MOE_ROWS), ey), dn(blocks((size_t)dim, MOE_ROWS), ey);
	switch (wdt) {
	case DT_F32:
		rc = experts_launch<float>(p, x, experts, gu, dn, dim, inter, err, errsz);
		break;
	case DT_BF16:
		rc = experts_launch<__nv_bfloat16>(p, x, experts, gu, dn, dim, inter, err, errsz);
		break;
	case DT_F16:
		rc = experts_launch<__half>(p, x, experts, gu, dn, dim, inter, err, errsz);
		break;
	default: /* DT_F8_E4M3, checked above */
		rc = experts_launch<__nv_fp8_e4m3>(p, x, experts, gu, dn, dim, inter, err, errsz);
	}
	if (rc != WK_OK)
		return rc;
	k_moe_combine<<<n, MOE_THREADS>>>(y, p.pos, wt, p.z, top_k, dim);
	return launched("moe_experts combine", err, errsz);
}
