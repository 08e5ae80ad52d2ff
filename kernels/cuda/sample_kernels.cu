/*
 * sample_kernels.cu - sampling on the device: the candidates a non-greedy pick needs
 * (cpu_ref_sample_cand's contract, kernels/cpu/cpu.h), selected where the logits are, so
 * that a few kilobytes per row cross to the host instead of the whole row (151,552 floats
 * for GLM). The pick itself (engine/sampler.c, samp_pick_cand) runs on the host with the
 * request's own draw, but for temperature alone (no top_k, no top_p), where every id is a
 * candidate: the kernel makes that pick with the draw (pick_id_order) and sends the one id.
 *
 * One block per row. Every element's order key is 64 bits, (bits of p) << 32 | ~id: p >= 0,
 * so its bits order as it does, and unsigned order of the keys is the filters' order (p
 * descending, then id ascending) reversed, a total order. A set "the first m in that order"
 * is then "every key >= K" for one K, found by a radix select, 8 bits a pass from the top (as
 * the DSA top-k in glm_kernels.cu, by count, or here also by mass). p is recomputed from the
 * logits in each pass instead of stored: the row's logits stay in L2 between passes.
 */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"

#define CAND_THREADS 256

__device__ __forceinline__ float cand_p(float l, float mx, float temperature)
{
	return expf((l - mx) / temperature);
}

__device__ __forceinline__ unsigned long long cand_key(float p, int id)
{
	return (unsigned long long)__float_as_uint(p) << 32 | (0xffffffffu - (unsigned)id);
}

__device__ __forceinline__ int key_id(unsigned long long key)
{
	return (int)(0xffffffffu - (unsigned)(key & 0xffffffffu));
}

/* Sum over the block of doubles (blockDim.x a multiple of 32); every thread gets it, and the
 * order is fixed by blockDim, so the result is the same on every run. */
static __device__ double block_sum_d(double v)
{
	__shared__ double part[32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads(); /* part may still be read by a previous call */
	if (lane == 0)
		part[wid] = v;
	__syncthreads();
	v = lane < nw ? part[lane] : 0.0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* The largest K such that the keys >= K, among the row's keys >= lo, hold at least `need`:
 * that many keys (by_mass false), or that much p (by_mass true). So "keys >= K" is the
 * shortest head of the filters' order that reaches need. A pass histograms the next 8 bits
 * of the keys that match the bits fixed so far; the digit where the running count (mass)
 * from the top reaches need is fixed. It stops early once the digit's bucket is taken whole
 * (count) or holds one key (mass): then K with the lower bits 0 selects the same set. If
 * rounding leaves need above the whole (mass), K ends at the lowest keys: a longer list,
 * never a shorter one. Every thread of the block calls it and gets K. */
static __device__ unsigned long long select_key(const float *r, float mx, float temperature,
						int vocab, unsigned long long lo, bool by_mass,
						double need)
{
	__shared__ unsigned hist[256];
	__shared__ double hmass[256];
	__shared__ unsigned long long s_prefix;
	__shared__ double s_need;
	__shared__ int s_done;
	unsigned long long prefix = 0, mask = 0;
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x) {
			hist[b] = 0;
			hmass[b] = 0;
		}
		__syncthreads();
		for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
			float p = cand_p(r[j], mx, temperature);
			unsigned long long key = cand_key(p, j);
			if (key < lo || (key & mask) != prefix)
				continue;
			unsigned d = (unsigned)(key >> shift) & 255u;
			atomicAdd(&hist[d], 1u);
			if (by_mass)
				atomicAdd(&hmass[d], (double)p);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			double above = 0;
			int b = 255;
			for (; b > 0; b--) {
				double v = by_mass ? hmass[b] : (double)hist[b];
				if (above + v >= need)
					break;
				above += v;
			}
			s_prefix = prefix | (unsigned long long)b << shift;
			s_need = need - above;
			s_done = by_mass ? hist[b] == 1 : above + (double)hist[b] == need;
		}
		__syncthreads();
		prefix = s_prefix; /* rewritten only after the next pass's two barriers */
		need = s_need;
		mask |= 255ull << shift;
		if (s_done)
			break;
	}
	return prefix;
}

/* Temperature alone: the id samp_pick draws with u over the row in id order, the first whose
 * running sum of p passes u times the whole. Thread t sums a contiguous run of ids (so the
 * runs, in thread order, are id order); thread 0 turns the runs' sums into where each starts;
 * the one thread whose run holds u times the whole walks it. The sums group the additions
 * otherwise than the host's single running sum (double: the last bits), so only a draw that
 * close to a boundary could land on the neighbour; with none found (rounding at the very top)
 * the last id, as the host. Every thread of the block calls it and gets the id, and the
 * row's whole mass (the runs' sums added in order) in *total. With a draft d >= 0
 * (samp_pick_draft's rule): d when u_acc times the whole is below p_d; else the pick over
 * the ids but d with u * (whole - p_d), which is the pick over every id with that target,
 * moved past d's own mass where it lies at or after the mass before d. */
static __device__ int pick_id_order(const float *r, float mx, float temperature, int vocab,
				    double u, int d, double u_acc, double *total)
{
	__shared__ double start[CAND_THREADS + 1];
	__shared__ double s_before;
	__shared__ int s_id;
	int per = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
	int j0 = min((int)threadIdx.x * per, vocab), j1 = min(j0 + per, vocab);
	double run = 0;
	for (int j = j0; j < j1; j++)
		run += cand_p(r[j], mx, temperature);
	start[threadIdx.x] = run;
	__syncthreads();
	if (threadIdx.x == 0) {
		double acc = 0;
		for (int t = 0; t < (int)blockDim.x; t++) {
			double v = start[t];
			start[t] = acc;
			acc += v;
		}
		start[blockDim.x] = acc;
		s_id = d == vocab - 1 && vocab > 1 ? vocab - 2 : vocab - 1;
	}
	__syncthreads();
	*total = start[blockDim.x];
	double pd = d >= 0 ? cand_p(r[d], mx, temperature) : 0;
	if (d >= 0 && u_acc * *total < pd)
		return d; /* the same on every thread: the draft kept */
	double want = u * (*total - pd), acc = start[threadIdx.x];
	if (d >= 0) { /* the mass before d, summed as the walk below sums it */
		if (d >= j0 && d < j1) {
			double b = acc;
			for (int j = j0; j < d; j++)
				b += cand_p(r[j], mx, temperature);
			s_before = b;
		}
		__syncthreads();
		if (want >= s_before)
			want += pd;
	}
	if (j0 < j1 && want >= acc && want < start[threadIdx.x + 1]) {
		int id = j1 - 1 == d && j1 - 2 >= j0 ? j1 - 2 : j1 - 1;
		for (int j = j0; j < j1; j++)
			if (want < (acc += cand_p(r[j], mx, temperature))) {
				id = j;
				break;
			}
		s_id = id;
	}
	__syncthreads();
	return s_id;
}

/* Row blockIdx.x of logits [n][vocab]: cand [n][cap], head [n] as cpu_ref_sample_cand. */
__global__ void k_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head,
			      const float *logits, const struct cpu_samp *sp, int vocab, int cap)
{
	__shared__ unsigned long long keys[WK_CUDA_CAND_MAX];
	__shared__ int s_count;
	int row = blockIdx.x;
	const float *r = logits + (size_t)row * vocab;
	struct cpu_samp s = sp[row];
	struct cpu_cand_head *h = head + row;
	cand += (size_t)row * cap;
	if (!(s.temperature > 0)) {
		if (threadIdx.x == 0)
			*h = cpu_cand_head{0, 0, 0};
		return;
	}
	float mx = -INFINITY;
	for (int j = threadIdx.x; j < vocab; j += blockDim.x)
		mx = fmaxf(mx, r[j]);
	mx = block_max(mx);
	bool top_k = s.top_k > 0 && s.top_k < vocab, top_p = s.top_p > 0 && s.top_p < 1;
	double total;
	if (!top_k && !top_p) { /* the pick itself; its runs' sums give the mass */
		int d = s.draft > 0 && s.draft <= vocab ? s.draft - 1 : -1;
		int id = pick_id_order(r, mx, s.temperature, vocab, s.u, d, s.u_acc, &total);
		if (threadIdx.x == 0) {
			cand[0] = cpu_cand{cand_p(r[id], mx, s.temperature), id};
			*h = cpu_cand_head{total, 1, 0};
		}
		return;
	}
	total = 0;
	for (int j = threadIdx.x; j < vocab; j += blockDim.x)
		total += cand_p(r[j], mx, s.temperature);
	total = block_sum_d(total);
	unsigned long long lo = 0;
	double mass = total;
	if (top_k) {
		lo = select_key(r, mx, s.temperature, vocab, 0, false, (double)s.top_k);
		double m = 0;
		for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
			float p = cand_p(r[j], mx, s.temperature);
			if (cand_key(p, j) >= lo)
				m += p;
		}
		mass = block_sum_d(m);
	}
	if (top_p) { /* K's lower bits may be 0 below lo: the keys < lo stay out */
		unsigned long long k = select_key(r, mx, s.temperature, vocab, lo, true,
						  fmin(mass, (s.top_p + CPU_CAND_SLACK) * mass));
		lo = k > lo ? k : lo;
	}
	/* the keys >= lo into shared memory in any order (the sort orders them), while they fit */
	if (threadIdx.x == 0)
		s_count = 0;
	__syncthreads();
	for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
		unsigned long long key = cand_key(cand_p(r[j], mx, s.temperature), j);
		if (key >= lo) {
			int at = atomicAdd(&s_count, 1);
			if (at < cap)
				keys[at] = key;
		}
	}
	__syncthreads();
	int count = s_count;
	if (count > cap) {
		if (threadIdx.x == 0)
			*h = cpu_cand_head{mass, -1, 0};
		return;
	}
	/* bitonic sort, descending, over the next power of two (keys past count: 0, below every
	 * real key, whose low half is ~id > 0) */
	int size = 1;
	while (size < count)
		size <<= 1;
	for (int i = count + (int)threadIdx.x; i < size; i += blockDim.x)
		keys[i] = 0;
	__syncthreads();
	for (int k = 2; k <= size; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			for (int i = threadIdx.x; i < size; i += blockDim.x) {
				int o = i ^ j;
				if (o <= i)
					continue;
				unsigned long long a = keys[i], b = keys[o];
				if ((i & k) == 0 ? a < b : a > b) {
					keys[i] = b;
					keys[o] = a;
				}
			}
			__syncthreads();
		}
	for (int i = threadIdx.x; i < count; i += blockDim.x) {
		int id = key_id(keys[i]);
		cand[i] = cpu_cand{cand_p(r[id], mx, s.temperature), id};
	}
	if (threadIdx.x == 0)
		*h = cpu_cand_head{mass, count, 0};
}

extern "C" int wk_cuda_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head,
				   const float *logits, const struct cpu_samp *s, int n, int vocab,
				   int cap, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	if (cap < 1 || cap > WK_CUDA_CAND_MAX || vocab < 1)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA sample_cand: cap %d outside 1..%d, or vocab %d", cap,
			       WK_CUDA_CAND_MAX, vocab);
	k_sample_cand<<<n, CAND_THREADS, 0, wk_st()>>>(cand, head, logits, s, vocab, cap);
	return launched("sample_cand", err, errsz);
}
