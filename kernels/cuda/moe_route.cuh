/*
 * moe_route.cuh - the MoE router on the device (cpu_ref_moe_route's contract), one block per
 * token: route_token and the argmax reductions it uses, for k_moe_route (glm_kernels.cu) and
 * the router fused with the grouped experts' plan (moe_kernels.cu). Static, as cuda_int.cuh:
 * each .cu file gets its own copy. Not for use outside kernels/cuda/.
 */
#ifndef WICK_CUDA_MOE_ROUTE_CUH
#define WICK_CUDA_MOE_ROUTE_CUH

#include "kernels/cuda/cuda_int.cuh"
extern "C" {
#include "kernels/cuda/cuda_kernels.h"
}

#ifndef NO_INDEX
#define NO_INDEX 0x7fffffff /* "no index" in the argmax reductions: above every real index */
#endif

/* The reference's argmax_ok is a sequential scan, best = first eligible i, replaced when
 * v[i] > v[best]. Its answer is the first eligible index when that one's value is NaN
 * (nothing compares greater than NaN), else the lowest index of the largest non-NaN value.
 * struct amax carries what a parallel reduction needs to give that same answer: the best
 * non-NaN (value, index), ties to the lower index, and the first eligible index. */
struct amax {
	float v; /* value at i; meaningless when i == NO_INDEX */
	int i; /* best non-NaN index so far, or NO_INDEX */
	int first; /* lowest eligible index seen, or NO_INDEX */
};

static __device__ __forceinline__ amax amax_none(void)
{
	amax a = {-INFINITY, NO_INDEX, NO_INDEX};
	return a;
}

/* Adds element i; one thread's calls come in ascending i. */
static __device__ __forceinline__ void amax_add(amax &a, float v, int i)
{
	if (a.first == NO_INDEX)
		a.first = i;
	if (!isnan(v) && (a.i == NO_INDEX || v > a.v)) {
		a.v = v;
		a.i = i;
	}
}

/* Commutative and associative (a max under a total order), so any reduction tree agrees. */
static __device__ __forceinline__ amax amax_join(amax a, amax b)
{
	bool take_b =
		b.i != NO_INDEX && (a.i == NO_INDEX || b.v > a.v || (b.v == a.v && b.i < a.i));
	amax r = take_b ? b : a;
	r.first = min(a.first, b.first);
	return r;
}

/* Every lane gets the warp's join. All 32 lanes must call it. */
static __device__ __forceinline__ amax warp_amax(amax a)
{
	for (int o = 16; o > 0; o >>= 1) {
		amax b;
		b.v = __shfl_xor_sync(0xffffffffu, a.v, o);
		b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
		b.first = __shfl_xor_sync(0xffffffffu, a.first, o);
		a = amax_join(a, b);
	}
	return a;
}

/* argmax_ok's answer from the reduction over all of v's eligible elements: -1 when none. */
static __device__ __forceinline__ int amax_result(amax a, const float *v)
{
	if (a.first == NO_INDEX)
		return -1;
	return isnan(v[a.first]) ? a.first : a.i;
}

/* argmax_ok(v, ok, n) over the block (ok NULL: all eligible); every thread gets the answer.
 * Every thread must call it: it synchronises first, so the caller's earlier writes of v and
 * ok (shared memory) are seen and the previous call's scratch is free. */
static __device__ int block_argmax_ok(const float *v, const unsigned char *ok, int n)
{
	__shared__ float pv[32];
	__shared__ int pi[32], pf[32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	amax a = amax_none();
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		if (!ok || ok[i])
			amax_add(a, v[i], i);
	a = warp_amax(a);
	if (lane == 0) {
		pv[wid] = a.v;
		pi[wid] = a.i;
		pf[wid] = a.first;
	}
	__syncthreads();
	a = amax_none();
	if (lane < nw) {
		a.v = pv[lane];
		a.i = pi[lane];
		a.first = pf[lane];
	}
	return amax_result(warp_amax(a), v);
}

/* argmax_ok(v, ok, n) by one warp, no block barrier; every lane gets the answer. */
static __device__ int warp_argmax_ok(const float *v, const unsigned char *ok, int n)
{
	amax a = amax_none();
	for (int i = threadIdx.x & 31; i < n; i += 32)
		if (ok[i])
			amax_add(a, v[i], i);
	return amax_result(warp_amax(a), v);
}

/* argmax_ok over one warp's elements v[0..n) except skip (-1: none); every lane gets it. */
static __device__ int warp_argmax_skip(const float *v, int n, int skip)
{
	amax a = amax_none();
	for (int i = threadIdx.x & 31; i < n; i += 32)
		if (i != skip)
			amax_add(a, v[i], i);
	return amax_result(warp_amax(a), v);
}

#define ROUTE_THREADS 256

/* Step by step as the reference, on shared copies of the token's scores:
 *   1. s = sigmoid(logits), choice = s + bias;
 *   2. (n_group > 1) a warp per group sums its two best choices; topk_group block argmaxes
 *      keep the best groups; experts of the other groups become ineligible;
 *   3. top_k argmaxes by warp 0 pick the experts, best first (a lane scans n_experts / 32 of
 *      them each time: at one token this block is the whole launch, or a chain's link that
 *      every later one waits for, and a block argmax each would put two block barriers and
 *      two warp reductions in that path 8 times over); thread 0 normalises the weights in
 *      the reference's order of additions.
 * Every float operation is the reference's, in its order, so idx and wt equal the reference's
 * bit for bit but where the sigmoid's exp rounds differently (see there). */
static __device__ void route_token(int *idx, float *wt, const float *logits, const float *bias,
				  int n_experts, int top_k, int n_group, int topk_group, bool norm,
				  float scale, int t)
{
	__shared__ float s[WK_CUDA_MOE_MAX_EXPERTS], choice[WK_CUDA_MOE_MAX_EXPERTS];
	__shared__ float gscore[WK_CUDA_MOE_MAX_EXPERTS]; /* [n_group], then the chosen s */
	__shared__ unsigned char ok[WK_CUDA_MOE_MAX_EXPERTS], gok[WK_CUDA_MOE_MAX_EXPERTS];
	__shared__ unsigned char keep[WK_CUDA_MOE_MAX_EXPERTS];
	const float *lt = logits + (size_t)t * n_experts;
	int gsize = n_experts / n_group;
	for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
		/* The reference calls glibc's expf, within 0.502 ulp of exact; CUDA's expf is
		 * within 2 ulp. exp in double rounded to float is the correctly rounded expf, so s
		 * equals the reference's in all but rare last-bit cases; near-equal experts
		 * could still swap there, never equal ones (equal inputs, equal s). */
		float ex = (float)exp(-(double)lt[e]);
		s[e] = 1.0f / (1.0f + ex);
		choice[e] = s[e] + (bias ? bias[e] : 0.0f);
		ok[e] = 1;
	}
	if (n_group > 1) {
		__syncthreads(); /* choice is complete */
		int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
		for (int g = wid; g < n_group; g += nw) { /* warp-uniform loop */
			const float *c = choice + (size_t)g * gsize;
			int a = warp_argmax_skip(c, gsize, -1);
			float sum = c[a];
			if (gsize > 1)
				sum += c[warp_argmax_skip(c, gsize, a)];
			if (lane == 0) {
				gscore[g] = sum;
				gok[g] = 1;
				keep[g] = 0;
			}
		}
		for (int k = 0; k < topk_group; k++) { /* block_argmax_ok syncs first */
			int g = block_argmax_ok(gscore, gok, n_group);
			if (threadIdx.x == 0) {
				keep[g] = 1;
				gok[g] = 0;
			}
		}
		__syncthreads(); /* keep is complete */
		for (int e = threadIdx.x; e < n_experts; e += blockDim.x)
			ok[e] = keep[e / gsize];
	}
	int *it = idx + (size_t)t * top_k;
	float *wv = wt + (size_t)t * top_k;
	float *chosen = gscore; /* free again: its last reads were before the barrier below */
	__syncthreads(); /* choice and ok are complete */
	if (threadIdx.x < 32) { /* warp 0 alone: the top_k argmaxes with no block barrier between */
		for (int k = 0; k < top_k; k++) {
			int e = warp_argmax_ok(choice, ok, n_experts);
			if (threadIdx.x == 0) {
				ok[e] = 0; /* e >= 0: the host checked top_k <= eligible experts */
				it[k] = e;
				chosen[k] = s[e]; /* the unbiased score: the bias only chooses */
			}
			__syncwarp(); /* ok[e] = 0 seen by the warp's next pass */
		}
	}
	if (threadIdx.x == 0) {
		float sum = 0.0f;
		for (int k = 0; k < top_k; k++)
			sum += chosen[k];
		for (int k = 0; k < top_k; k++)
			wv[k] = (norm ? chosen[k] / (sum + 1e-20f) : chosen[k]) * scale;
	}
}


#endif
