/*
 * attention.cu - GQA attention (cpu_ref_attention), the tiled prefill attention that GQA and
 * MLA's expanded form share, and MLA's absorbed prefill (cpu_ref_mla_attention;
 * glm_kernels.cu routes MLA here): a block a token for decode, with flash-decoding's split of
 * long contexts; query tiles for a prefill, on the f32 pipes (k_att_tiled) or on the tensor
 * cores (k_att_mma); and one token's heads a block over its latent rows on the tensor cores
 * (k_mla_lat). Which runs is chosen per call (wk_cuda_attention_path, wk_cuda_mla_tiles,
 * wk_cuda_mla_latent_tiles); tests/unit/test_cuda.c and test_cuda_glm.c compare each with
 * the CPU reference.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/mma.cuh"

/* ---- attention (cpu_ref_attention): one block per (token, kv head, its query heads) ---------- */

#define ATT_THREADS 128
#define ATT_TILE 64		  /* keys scored per step */
#define ATT_SMEM_MAX (48 * 1024) /* shared memory of a block without an opt-in */
#define ATT_SPLIT_MIN (4 * ATT_TILE) /* keys a split part scores at least */

/* Online softmax over tiles of ATT_TILE keys (mla_attend's scheme), so any number of keys
 * fits, for up to GM query heads of one kv head at once, so that each key and value is read
 * once for all of them:
 *   1. each warp scores keys of the tile, lanes over dimensions, each key element loaded once
 *      for the GM queries (registers part[GM]);
 *   2. thread g < nh raises head g's running max m[g] to mn over the tile's scores and keeps
 *      corr[g] = exp(m - mn); the scores become p = exp(score - mn);
 *   3. thread d (and d + 128, ...) adds sum_j p[g][j] v_j[d] to the running output acc[g][d]
 *      of every head g, each value loaded once; thread g < nh keeps l[g], the denominator.
 * Shared memory (dynamic): q [GM][head_dim], acc [GM][head_dim], p [GM][ATT_TILE], m, l and
 * corr [GM]. KV: the cache's elements, float, bf16 bits or e4m3 codes (kv_rc; FP8: ks, vs the
 * scales of rows of head_dim, one a position and kv head); several sequences (s.seq): token
 * i over its own sequence's rows, keys 0 .. s.pos[i] (struct cpu_gqa). Block (i, g, z) runs
 * token i's query heads g * group + (z / split) * GM .. (nh of them) over kv head g, and of
 * their keys part z % split (split > 1, flash-decoding: when the blocks are too few to fill
 * the device, each scores a contiguous part of the keys and leaves its m, l and acc in part;
 * the last of a (token, kv head, heads) to count itself on its counter merges them and zeroes
 * it). */
template <typename KV, int GM>
__global__ void k_attention(float *out, const float *q, struct cpu_gqa s, int pos0, int split,
			    float *part, unsigned *count)
{
	extern __shared__ float sm[];
	__shared__ int last;
	grid_dep_launch();
	int n_heads = s.n_heads, kv_stride = s.kv_stride;
	int group = n_heads / s.n_kv, i = blockIdx.x, g = blockIdx.y;
	int chunk = (int)blockIdx.z / split, sp = (int)blockIdx.z % split;
	int h0 = g * group + chunk * GM, nh = min(GM, (g + 1) * group - h0);
	int hd = s.head_dim, k0, k1;
	float scale = s.scale;
	part_keys(s.seq ? s.pos[i] + 1 : pos0 + i + 1, ATT_TILE, split, sp, &k0, &k1);
	float *qs = sm, *acc = qs + GM * hd, *p = acc + GM * hd, *ms = p + GM * ATT_TILE;
	float *ls = ms + GM, *cr = ls + GM;
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	size_t rows = (size_t)(kv_stride / hd), koff = (size_t)g * hd;
	/* the token's sequence's position 0 (several sequences: s.seq_rows rows apart) */
	size_t r0 = s.seq ? (size_t)s.seq[i] * s.seq_rows : 0;
	const KV *k = (const KV *)s.k + r0 * kv_stride, *v = (const KV *)s.v + r0 * kv_stride;
	const float *ks = kv_scales(s.ks, r0 * rows, hd), *vs = kv_scales(s.vs, r0 * rows, hd);
	for (int x = threadIdx.x; x < GM * hd; x += blockDim.x) {
		int hq = x / hd;
		qs[x] = hq < nh ? q[((size_t)i * n_heads + h0 + hq) * hd + x % hd] : 0.0f;
		acc[x] = 0.0f;
	}
	if (threadIdx.x < GM) {
		ms[threadIdx.x] = -INFINITY;
		ls[threadIdx.x] = 0.0f;
	}
	for (int j0 = k0; j0 < k1; j0 += ATT_TILE) { /* block-uniform loop */
		int cnt = min(ATT_TILE, k1 - j0);
		__syncthreads(); /* qs, ms and ls written; the last tile's p read */
		for (int j = wid; j < cnt; j += nw) { /* warp-uniform loop */
			size_t t = (size_t)(j0 + j);
			const KV *kt = k + t * kv_stride + koff;
			const float *rs = kv_scales(ks, t * rows + (size_t)g, hd);
			float pt[GM];
#pragma unroll
			for (int hq = 0; hq < GM; hq++)
				pt[hq] = 0.0f;
			for (int d = lane; d < hd; d += 32) {
				float kd = kv_rc(kt, rs, d);
#pragma unroll
				for (int hq = 0; hq < GM; hq++)
					pt[hq] += qs[hq * hd + d] * kd;
			}
#pragma unroll
			for (int hq = 0; hq < GM; hq++) {
				float sc = warp_sum(pt[hq]);
				if (lane == 0)
					p[hq * ATT_TILE + j] = sc * scale;
			}
		}
		__syncthreads(); /* scores written */
		tile_softmax(p, ms, ls, cr, nh, cnt, ATT_TILE);
		for (int d = threadIdx.x; d < hd; d += blockDim.x) {
			float a[GM];
#pragma unroll
			for (int hq = 0; hq < GM; hq++)
				a[hq] = hq < nh ? acc[hq * hd + d] * cr[hq] : 0.0f;
			for (int j = 0; j < cnt; j++) {
				size_t t = (size_t)(j0 + j);
				float vd = kv_rc(v + t * kv_stride + koff,
						 kv_scales(vs, t * rows + (size_t)g, hd), d);
#pragma unroll
				for (int hq = 0; hq < GM; hq++)
					a[hq] += hq < nh ? p[hq * ATT_TILE + j] * vd : 0.0f;
			}
#pragma unroll
			for (int hq = 0; hq < GM; hq++)
				if (hq < nh)
					acc[hq * hd + d] = a[hq]; /* only this thread touches it */
		}
	}
	__syncthreads(); /* ls and acc written */
	if (split == 1) {
		for (int x = threadIdx.x; x < nh * hd; x += blockDim.x)
			out[((size_t)i * n_heads + h0 + x / hd) * hd + x % hd] = acc[x] / ls[x / hd];
		return;
	}
	size_t row0 = (size_t)i * n_heads + h0;
	unsigned *c = count + ((size_t)i * gridDim.y + g) * (gridDim.z / split) + chunk;
	if (part_put(part, row0, split, sp, nh, hd, acc, ms, ls, c, &last))
		part_merge(out, part, row0, split, nh, hd);
}

/* ---- attention over a prefill's tokens: query tiles -------------------------------------------
 *
 * k_attention runs one token's query heads a block, so a prefill of n tokens reads each of its
 * keys and values n times over (up to 8 heads sharing each read): O(n^2) bytes from L2, where
 * the arithmetic is O(n^2) too but with far more reuse to take. k_att_tiled runs ROWS query
 * rows a block: ROWS / GM consecutive tokens of one sequence, each with up to GM heads that
 * read the same keys (row r: token i0 + r / GM, head h0 + r % GM), and moves every key and
 * value it scores through shared memory once for all of them, AP_KT keys a tile (flash
 * attention's scheme, on the f32 pipes: the same arithmetic as the reference, in f32):
 *   1. the tile's keys and values are read (SRC: a GQA cache through kv_rc, or MLA's
 *      expanded f32 rows) into shared memory;
 *   2. the threads are RG = ROWS / 4 groups of 4 rows times KG = 128 / RG groups of keys:
 *      thread t scores rows 4 (t / KG) .. + 3 against keys t % KG + KG b (b < AP_KT / KG),
 *      each q and k element read from shared memory once for several products; a key past
 *      the row's token (causal) or past the block's last token scores -inf;
 *   3. 128 / ROWS threads a row take the tile's max, raise the row's running max m, keep
 *      corr = exp(m_old - m) and turn the scores into p = exp(score - m), adding them to l;
 *   4. thread t keeps the output of its 4 rows, columns t % KG + KG c (c < 16), in registers:
 *      scaled by corr, then each p times each value column added.
 * Shared memory: q [ROWS][qp], k [AP_KT][qp], v [AP_KT][dv], p [ROWS][AP_KT + 1], m, l and
 * corr [ROWS]; qp = the query's width made odd, so the keys a warp reads fall in distinct
 * banks. ROWS 64 (GQA, head_dim <= 128: 8 key groups, 16 columns of 8 apart) or 32 (MLA,
 * dv <= 256: 16 key groups, 16 columns of 16 apart). One sequence's tokens. */
#define AP_KT 32
#define AP_THREADS 128
#define AP_MIN_N 32 /* tokens from which the tiles are taken (a guess until a GPU times both:
		     * the lab's prefill rows) */

/* The keys and values of a GQA cache (struct cpu_gqa, one sequence), kv head g's. */
template <typename KV> struct ap_gqa {
	static constexpr bool exact = kv_bf16<KV>::v; /* each key and value a bf16 */
	const KV *k, *v;
	const float *ks, *vs;
	int kv_stride, hd;
	size_t rows; /* kv heads a position */
	__device__ int qk() const { return hd; }
	__device__ int dv() const { return hd; }
	__device__ float key(size_t t, int d, int g) const
	{
		return kv_rc(k + t * kv_stride + (size_t)g * hd, kv_scales(ks, t * rows + g, hd), d);
	}
	__device__ float val(size_t t, int d, int g) const
	{
		return kv_rc(v + t * kv_stride + (size_t)g * hd, kv_scales(vs, t * rows + g, hd), d);
	}
};

/* MLA's expanded rows (struct cpu_mla in f32, one sequence, dense), head g's: its keys are
 * [k_a (per head) | k_b (shared)], its values v. */
struct ap_mla {
	static constexpr bool exact = false;
	const float *k_a, *k_b, *v;
	size_t ka_stride, ka_head, kb_stride, v_stride, v_head;
	int d_a, d_b, d_v;
	__device__ int qk() const { return d_a + d_b; }
	__device__ int dv() const { return d_v; }
	__device__ float key(size_t t, int d, int g) const
	{
		return d < d_a ? k_a[t * ka_stride + (size_t)g * ka_head + d]
			       : k_b[t * kb_stride + (size_t)(d - d_a)];
	}
	__device__ float val(size_t t, int d, int g) const
	{
		return v[t * v_stride + (size_t)g * v_head + d];
	}
};

static size_t ap_smem(int rows, int qk, int dv)
{
	int qp = qk | 1;
	return ((size_t)rows * qp + (size_t)AP_KT * qp + (size_t)AP_KT * dv +
		(size_t)rows * (AP_KT + 1) + 3 * (size_t)rows) * sizeof(float);
}

/* Block (x, kv head y, head chunk z) of X token tiles: tokens (X - 1 - x) * ROWS / GM .. of
 * n (token i at position pos0 + i), heads y * group + z * GM .. (group = n_heads / kv heads);
 * q [n][n_heads][qk], out [n][n_heads][dv]. */
template <int ROWS, int GM, typename SRC>
__global__ void __launch_bounds__(AP_THREADS)
k_att_tiled(float *out, const float *q, SRC src, int n_heads, int group, int n, int pos0,
	    float scale)
{
	extern __shared__ float sm[];
	grid_dep_launch();
	constexpr int QT = ROWS / GM, RG = ROWS / 4, KG = AP_THREADS / RG, KB = AP_KT / KG;
	constexpr int NC = 16, RT = AP_THREADS / ROWS; /* threads a row in the softmax */
	int qk = src.qk(), dv = src.dv(), qp = qk | 1;
	/* the last tokens' tiles first: they have the most keys, so the short ones fill the
	 * tail of the launch instead of the long ones trailing it */
	int g = blockIdx.y, i0 = (int)(gridDim.x - 1 - blockIdx.x) * QT;
	int h0 = g * group + (int)blockIdx.z * GM, nh = min(GM, (g + 1) * group - h0);
	int k1 = pos0 + min(i0 + QT, n); /* the keys of the block's last token */
	float *qs = sm, *ks_ = qs + ROWS * qp, *vs_ = ks_ + AP_KT * qp;
	float *ps = vs_ + AP_KT * dv, *ms = ps + ROWS * (AP_KT + 1), *ls = ms + ROWS;
	float *cr = ls + ROWS;
	for (int x = threadIdx.x; x < ROWS * qk; x += blockDim.x) {
		int r = x / qk, d = x % qk, i = i0 + r / GM, hq = r % GM;
		qs[r * qp + d] = hq < nh && i < n ? q[((size_t)i * n_heads + h0 + hq) * qk + d] : 0.0f;
	}
	if (threadIdx.x < ROWS) {
		ms[threadIdx.x] = -INFINITY;
		ls[threadIdx.x] = 0.0f;
	}
	int t = threadIdx.x, rg = t / KG, kg = t % KG;
	float acc[4][NC];
#pragma unroll
	for (int a = 0; a < 4; a++)
#pragma unroll
		for (int c = 0; c < NC; c++)
			acc[a][c] = 0.0f;
	for (int j0 = 0; j0 < k1; j0 += AP_KT) { /* block-uniform loop */
		int cnt = min(AP_KT, k1 - j0);
		__syncthreads(); /* q, m and l written; the last tile's p and v read */
		for (int x = threadIdx.x; x < AP_KT * qk; x += blockDim.x) {
			int j = x / qk, d = x % qk;
			ks_[j * qp + d] = j < cnt ? src.key((size_t)(j0 + j), d, g) : 0.0f;
		}
		for (int x = threadIdx.x; x < AP_KT * dv; x += blockDim.x) {
			int j = x / dv, d = x % dv;
			vs_[j * dv + d] = j < cnt ? src.val((size_t)(j0 + j), d, g) : 0.0f;
		}
		__syncthreads(); /* the tile's keys and values in place */
		float sc[4][KB];
#pragma unroll
		for (int a = 0; a < 4; a++)
#pragma unroll
			for (int b = 0; b < KB; b++)
				sc[a][b] = 0.0f;
		for (int d = 0; d < qk; d++) {
			float qa[4], kb[KB];
#pragma unroll
			for (int a = 0; a < 4; a++)
				qa[a] = qs[(rg * 4 + a) * qp + d];
#pragma unroll
			for (int b = 0; b < KB; b++)
				kb[b] = ks_[(kg + KG * b) * qp + d];
#pragma unroll
			for (int a = 0; a < 4; a++)
#pragma unroll
				for (int b = 0; b < KB; b++)
					sc[a][b] += qa[a] * kb[b];
		}
#pragma unroll
		for (int a = 0; a < 4; a++) {
			int r = rg * 4 + a, last = pos0 + i0 + r / GM; /* the row's last key */
#pragma unroll
			for (int b = 0; b < KB; b++) {
				int j = kg + KG * b, key = j0 + j;
				ps[r * (AP_KT + 1) + j] =
					j < cnt && key <= last ? sc[a][b] * scale : -INFINITY;
			}
		}
		__syncthreads(); /* scores written */
		{
			constexpr int PER = AP_KT / RT;
			int r = t / RT, part = t % RT;
			float *pr = ps + r * (AP_KT + 1) + part * PER;
			float mt = -INFINITY;
			for (int j = 0; j < PER; j++)
				mt = fmaxf(mt, pr[j]);
#pragma unroll
			for (int o = 1; o < RT; o <<= 1)
				mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
			float m = ms[r], mn = fmaxf(m, mt), l = 0.0f;
			for (int j = 0; j < PER; j++) {
				float e = mn == -INFINITY ? 0.0f : expf(pr[j] - mn);
				pr[j] = e;
				l += e;
			}
#pragma unroll
			for (int o = 1; o < RT; o <<= 1)
				l += __shfl_xor_sync(0xffffffffu, l, o);
			if (!part) {
				float c = mn == -INFINITY ? 1.0f : expf(m - mn);
				cr[r] = c;
				ms[r] = mn;
				ls[r] = ls[r] * c + l;
			}
		}
		__syncthreads(); /* p, corr written */
		float c4[4];
#pragma unroll
		for (int a = 0; a < 4; a++)
			c4[a] = cr[rg * 4 + a];
#pragma unroll
		for (int a = 0; a < 4; a++)
#pragma unroll
			for (int c = 0; c < NC; c++)
				acc[a][c] *= c4[a];
		for (int j = 0; j < cnt; j++) {
			float pa[4];
#pragma unroll
			for (int a = 0; a < 4; a++)
				pa[a] = ps[(rg * 4 + a) * (AP_KT + 1) + j];
#pragma unroll
			for (int c = 0; c < NC; c++) {
				int col = kg + KG * c;
				float vd = col < dv ? vs_[j * dv + col] : 0.0f;
#pragma unroll
				for (int a = 0; a < 4; a++)
					acc[a][c] += pa[a] * vd;
			}
		}
	}
	__syncthreads(); /* l final */
#pragma unroll
	for (int a = 0; a < 4; a++) {
		int r = rg * 4 + a, i = i0 + r / GM, hq = r % GM;
		if (i >= n || hq >= nh)
			continue;
		float inv = 1.0f / ls[r];
		float *o = out + ((size_t)i * n_heads + h0 + hq) * dv;
#pragma unroll
		for (int c = 0; c < NC; c++) {
			int col = kg + KG * c;
			if (col < dv)
				o[col] = acc[a][c] * inv;
		}
	}
}

template <int ROWS, int GM, typename SRC>
static cudaError_t ap_launch_gm(dim3 grid, const SRC &src, float *out, const float *q,
				int n_heads, int group, int n, int pos0, float scale, int qk, int dv)
{
	size_t smem = ap_smem(ROWS, qk, dv);
	cudaError_t e = cudaFuncSetAttribute((k_att_tiled<ROWS, GM, SRC>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize,
					     (int)smem);
	if (e != cudaSuccess)
		return e;
	k_att_tiled<ROWS, GM, SRC><<<grid, AP_THREADS, smem, wk_st()>>>(out, q, src, n_heads, group,
									 n, pos0, scale);
	return cudaSuccess;
}

/* ---- the same tiles on the tensor cores ---------------------------------------------------
 *
 * k_att_mma runs k_att_tiled's blocks (the same rows, grid and order, so the routing is
 * shared) with both products on mma.sync m16n8k16 (bf16 operands, f32 accumulators),
 * flash attention 2's way: warp w holds query rows 16 (w / WPR) .. + 15 and output columns
 * AM_DVW (w % WPR) .. + AM_DVW - 1 (WPR warps a row group, each scoring the rows' keys again,
 * when the values are wider than a warp's columns: MLA's 256), and keeps its scores, its
 * softmax's m and l and its output in registers; the scores of a tile become the A operand
 * of P V without leaving them (an m16n8 accumulator's layout is an m16k16 A fragment's).
 * f32 stays f32 within 2^-16: each f32 operand is split into bf16 hi + lo (bf16_split) and a
 * product is hi.hi + lo.hi + hi.lo (the lo.lo term is below 2^-16 of it). A bf16 cache's
 * keys and values are bf16 already, so their lo terms are skipped (SRC::exact). The tensor
 * cores do 3 (bf16: 2) products for each of k_att_tiled's, several times the rate of the f32
 * pipes. Shared memory, as bf16 hi and lo each: q [ROWS][QKP + AM_PAD], the tile's keys
 * [AM_KT][QKP + AM_PAD] and its values transposed [DVP][AM_KT + AM_PAD] (a B fragment's
 * register is two consecutive keys of one column); QKP, DVP: the widths rounded up to 16 and
 * 8, zeros past them; AM_PAD puts the 8 rows a fragment load reads in distinct banks. */
#define AM_KT 32  /* keys a tile: 4 n-tiles of the scores, 2 k-steps of P V */
#define AM_PAD 8  /* bf16 past each shared row */
#define AM_DVW 128 /* output columns a warp: 16 n-tiles of 8 (64 accumulators a thread) */

__host__ __device__ __forceinline__ int am_qkp(int qk) { return (qk + 15) / 16 * 16; }
__host__ __device__ __forceinline__ int am_dvp(int dv) { return (dv + 7) / 8 * 8; }

static size_t am_smem(int rows, int qk, int dv)
{
	size_t qs = (size_t)am_qkp(qk) + AM_PAD;
	return 2 * sizeof(uint16_t) *
	       ((size_t)rows * qs + (size_t)AM_KT * qs + (size_t)am_dvp(dv) * (AM_KT + AM_PAD));
}

/* Rows (ROWS = 16 RW) and heads as k_att_tiled<ROWS, GM, SRC>'s; 32 RW WPR = AP_THREADS. */
template <int RW, int WPR, int GM, typename SRC>
__global__ void __launch_bounds__(AP_THREADS)
k_att_mma(float *out, const float *q, SRC src, int n_heads, int group, int n, int pos0,
	  float scale)
{
	extern __shared__ uint16_t sb[];
	grid_dep_launch();
	constexpr int ROWS = 16 * RW, QT = ROWS / GM, VS = AM_KT + AM_PAD;
	constexpr bool EX = SRC::exact;
	static_assert(RW * WPR * 32 == AP_THREADS, "the warps cover the rows and the columns");
	int qk = src.qk(), dv = src.dv(), qkp = am_qkp(qk), dvp = am_dvp(dv), qs = qkp + AM_PAD;
	int g = blockIdx.y, i0 = (int)(gridDim.x - 1 - blockIdx.x) * QT;
	int h0 = g * group + (int)blockIdx.z * GM, nh = min(GM, (g + 1) * group - h0);
	int k1 = pos0 + min(i0 + QT, n);
	uint16_t *qh = sb, *ql = qh + ROWS * qs, *kh = ql + ROWS * qs, *kl = kh + AM_KT * qs;
	uint16_t *vh = kl + AM_KT * qs, *vl = vh + dvp * VS;
	for (int x = threadIdx.x; x < ROWS * qkp; x += blockDim.x) {
		int r = x / qkp, d = x % qkp, i = i0 + r / GM, hq = r % GM;
		am_put(qh, ql, r * qs + d,
		       hq < nh && i < n && d < qk ? q[((size_t)i * n_heads + h0 + hq) * qk + d] : 0.0f);
	}
	int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, qq = lane % 4;
	int r0 = warp / WPR * 16, c0 = warp % WPR * AM_DVW;
	int ntc = min(AM_DVW, dvp - c0) / 8; /* the warp's n-tiles of output (may be <= 0) */
	int last[2] = {pos0 + i0 + (r0 + gq) / GM, pos0 + i0 + (r0 + gq + 8) / GM};
	int wlast = pos0 + i0 + (r0 + 15) / GM; /* no row of the warp has a later key */
	float o[AM_DVW / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
	am_zero(o);
	for (int j0 = 0; j0 < k1; j0 += AM_KT) { /* block-uniform loop */
		int cnt = min(AM_KT, k1 - j0);
		__syncthreads(); /* q written; the last tile's keys and values read */
		for (int x = threadIdx.x; x < AM_KT * qkp; x += blockDim.x) {
			int j = x / qkp, d = x % qkp;
			am_put(kh, kl, j * qs + d,
			       j < cnt && d < qk ? src.key((size_t)(j0 + j), d, g) : 0.0f);
		}
		for (int x = threadIdx.x; x < AM_KT * dvp; x += blockDim.x) {
			int j = x / dvp, d = x % dvp;
			am_put(vh, vl, d * VS + j,
			       j < cnt && d < dv ? src.val((size_t)(j0 + j), d, g) : 0.0f);
		}
		__syncthreads(); /* the tile in place */
		if (j0 > wlast || ntc <= 0) /* every key past the warp's rows (p 0: nothing
					     * changes), or no columns of the values left to it */
			continue;
		float s[4][4];
		am_zero(s);
		for (int kk = 0; kk < qkp; kk += 16) {
			const uint16_t *pa = qh + (r0 + gq) * qs + kk + 2 * qq;
			const uint16_t *pl = ql + (r0 + gq) * qs + kk + 2 * qq;
			uint32_t ah[4] = {am_ld(pa), am_ld(pa + 8 * qs), am_ld(pa + 8),
					  am_ld(pa + 8 * qs + 8)};
			uint32_t al[4] = {am_ld(pl), am_ld(pl + 8 * qs), am_ld(pl + 8),
					  am_ld(pl + 8 * qs + 8)};
#pragma unroll
			for (int t = 0; t < 4; t++) {
				const uint16_t *pb = kh + (t * 8 + gq) * qs + kk + 2 * qq;
				uint32_t bh[2] = {am_ld(pb), am_ld(pb + 8)};
				mma_bf16_16816(s[t], ah, bh);
				mma_bf16_16816(s[t], al, bh);
				if (!EX) {
					const uint16_t *pc = kl + (t * 8 + gq) * qs + kk + 2 * qq;
					uint32_t bl[2] = {am_ld(pc), am_ld(pc + 8)};
					mma_bf16_16816(s[t], ah, bl);
				}
			}
		}
		/* s[t][e]: row r0 + gq (+ 8 for e >= 2), key j0 + 8 t + 2 qq + (e & 1) */
		float corr[2];
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float mt = -INFINITY;
#pragma unroll
			for (int t = 0; t < 4; t++)
#pragma unroll
				for (int e = 2 * h; e < 2 * h + 2; e++) {
					int j = t * 8 + 2 * qq + (e & 1);
					s[t][e] = j < cnt && j0 + j <= last[h] ? s[t][e] * scale
									       : -INFINITY;
					mt = fmaxf(mt, s[t][e]);
				}
			mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
			mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
			float mn = fmaxf(m[h], mt), sum = 0.0f;
			corr[h] = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
#pragma unroll
			for (int t = 0; t < 4; t++)
#pragma unroll
				for (int e = 2 * h; e < 2 * h + 2; e++) {
					s[t][e] = mn == -INFINITY ? 0.0f : expf(s[t][e] - mn);
					sum += s[t][e];
				}
			m[h] = mn;
			l[h] = l[h] * corr[h] + sum; /* this thread's keys; the quad's summed at the end */
		}
#pragma unroll
		for (int c = 0; c < AM_DVW / 8; c++) {
			o[c][0] *= corr[0];
			o[c][1] *= corr[0];
			o[c][2] *= corr[1];
			o[c][3] *= corr[1];
		}
#pragma unroll
		for (int ks = 0; ks < 2; ks++) { /* keys 16 ks .. + 15: n-tiles 2 ks, 2 ks + 1 */
			uint32_t ph[4], pl[4], h2[8], l2[8];
#pragma unroll
			for (int e = 0; e < 4; e++) {
				bf16_split(s[2 * ks][e], &h2[e], &l2[e]);
				bf16_split(s[2 * ks + 1][e], &h2[4 + e], &l2[4 + e]);
			}
			ph[0] = am_pack(h2[0], h2[1]);
			ph[1] = am_pack(h2[2], h2[3]);
			ph[2] = am_pack(h2[4], h2[5]);
			ph[3] = am_pack(h2[6], h2[7]);
			pl[0] = am_pack(l2[0], l2[1]);
			pl[1] = am_pack(l2[2], l2[3]);
			pl[2] = am_pack(l2[4], l2[5]);
			pl[3] = am_pack(l2[6], l2[7]);
#pragma unroll
			for (int c = 0; c < AM_DVW / 8; c++) {
				if (c >= ntc)
					break;
				int off = (c0 + c * 8 + gq) * VS + ks * 16 + 2 * qq;
				uint32_t bh[2] = {am_ld(vh + off), am_ld(vh + off + 8)};
				mma_bf16_16816(o[c], ph, bh);
				mma_bf16_16816(o[c], pl, bh);
				if (!EX) {
					uint32_t bl[2] = {am_ld(vl + off), am_ld(vl + off + 8)};
					mma_bf16_16816(o[c], ph, bl);
				}
			}
		}
	}
#pragma unroll
	for (int h = 0; h < 2; h++) {
		l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
		l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
		int r = r0 + gq + 8 * h, i = i0 + r / GM, hq = r % GM;
		if (i >= n || hq >= nh)
			continue;
		float inv = 1.0f / l[h], *orow = out + ((size_t)i * n_heads + h0 + hq) * dv;
#pragma unroll
		for (int c = 0; c < AM_DVW / 8; c++) {
			if (c >= ntc)
				break;
			int col = c0 + c * 8 + 2 * qq;
			if (col < dv)
				orow[col] = o[c][2 * h] * inv;
			if (col + 1 < dv)
				orow[col + 1] = o[c][2 * h + 1] * inv;
		}
	}
}

template <int RW, int WPR, int GM, typename SRC>
static cudaError_t am_launch(dim3 grid, const SRC &src, float *out, const float *q,
			     int n_heads, int group, int n, int pos0, float scale, int qk, int dv)
{
	size_t smem = am_smem(16 * RW, qk, dv);
	cudaError_t e = cudaFuncSetAttribute((k_att_mma<RW, WPR, GM, SRC>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize,
					     (int)smem);
	if (e != cudaSuccess)
		return e;
	k_att_mma<RW, WPR, GM, SRC><<<grid, AP_THREADS, smem, wk_st()>>>(out, q, src, n_heads,
									  group, n, pos0, scale);
	return cudaSuccess;
}

#define AP_GQA_ROWS 64
#define AP_GQA_HD 128 /* 16 columns of 8 apart */

/* path 2 (k_att_tiled) or 3 (k_att_mma) for a GQA cache of KV */
template <typename KV>
static cudaError_t ap_launch_gqa(int path, int gm, float *out, const float *q,
				 const struct cpu_gqa *s, int n, int pos0)
{
	struct ap_gqa<KV> src = {(const KV *)s->k, (const KV *)s->v, s->ks, s->vs, s->kv_stride,
				 s->head_dim, (size_t)(s->kv_stride / s->head_dim)};
	int group = s->n_heads / s->n_kv, qt = AP_GQA_ROWS / gm, hd = s->head_dim;
	dim3 grid((unsigned)((n + qt - 1) / qt), (unsigned)s->n_kv,
		  (unsigned)((group + gm - 1) / gm));
#define AP(G)                                                                                  \
	(path == 3 ? am_launch<AP_GQA_ROWS / 16, 1, G>(grid, src, out, q, s->n_heads, group, n,   \
						       pos0, s->scale, hd, hd)                 \
		   : ap_launch_gm<AP_GQA_ROWS, G>(grid, src, out, q, s->n_heads, group, n, pos0,   \
						  s->scale, hd, hd))
	switch (gm) {
	case 1: return AP(1);
	case 2: return AP(2);
	case 4: return AP(4);
	default: return AP(8);
	}
#undef AP
}

#define AP_MLA_ROWS 32
#define AP_MLA_D 256 /* 16 columns of 16 apart; and the query's width at most */

static int att_forced; /* wk_cuda_attention_force */

extern "C" int wk_cuda_mla_tiled(float *out, const float *q, const struct cpu_mla *s, int n,
				 int pos0, char *err, size_t errsz)
{
	struct ap_mla src = {(const float *)s->k_a, (const float *)s->k_b, (const float *)s->v,
			     s->ka_stride, s->ka_head, s->kb_stride, s->v_stride, s->v_head,
			     s->d_a, s->d_b, s->d_v};
	dim3 grid((unsigned)((n + AP_MLA_ROWS - 1) / AP_MLA_ROWS), (unsigned)s->n_heads, 1);
	int qk = s->d_a + s->d_b;
	cudaError_t e;
	if (att_forced == 2) /* the f32 tiles, for the tests and the lab */
		e = ap_launch_gm<AP_MLA_ROWS, 1>(grid, src, out, q, s->n_heads, 1, n, pos0,
						 s->scale, qk, s->d_v);
	else /* 2 row groups of 16, 2 warps each: 128 columns of the values a warp */
		e = am_launch<AP_MLA_ROWS / 16, 2, 1>(grid, src, out, q, s->n_heads, 1, n, pos0,
						      s->scale, qk, s->d_v);
	if (e != cudaSuccess)
		return check(e, "mla_attention (tiled) shared memory", err, errsz);
	return launched("mla_attention", err, errsz);
}

/* Whether query tiles beat a block a token for n tokens at pos0, the tiles being that many
 * blocks: from AP_MIN_N tokens, unless the earlier positions outnumber the tokens and the
 * tiles are too few to fill the device (a short chunk after a long context: the per-token
 * kernel splits each query's keys over blocks, the tiles cannot). A guess until a GPU times
 * both (the lab's prefill rows); wick's prefills start at position 0. */
static int att_gm(int group); /* below */

static bool ap_worth(int n, int pos0, long blocks)
{
	return n >= AP_MIN_N && (pos0 < n || blocks >= ATT_FILL / 2);
}

extern "C" bool wk_cuda_mla_tiles(const struct cpu_mla *s, int n, int pos0, int i0, int i1,
				  int h0, int h1)
{
	bool can = n >= 1 && i0 == 0 && i1 == n && h0 == 0 && h1 == s->n_heads && !s->seq &&
		   !s->sel && s->kv == DT_F32 && s->ka_head && s->v_head &&
		   s->d_a + s->d_b <= AP_MLA_D && s->d_v <= AP_MLA_D && s->d_v > 0 &&
		   s->n_heads <= 65535;
	if (att_forced)
		return can && att_forced >= 2;
	return can && ap_worth(n, pos0, (long)((n + AP_MLA_ROWS - 1) / AP_MLA_ROWS) * s->n_heads);
}

/* ---- MLA's absorbed (latent) attention over a prefill, on the tensor cores -----------------
 *
 * In the absorbed form every head of a token reads the same keys: the token's latent rows
 * [c_kv | k_pe] (d_a + d_b wide: 576 at GLM-5's sizes) of the positions it attends to (its
 * DSA selection, or every earlier one), and the values are the same rows' c_kv (d_v = d_a:
 * 512). k_mla_lat runs one token's heads, up to ML_H = 8 of them, a block, so each selected row
 * is read once for all of them, and both products on mma.sync m16n8k16 with the keys as the
 * 16-row side (8 heads are an n-tile, none wasted), per tile of ML_KT = 32 keys:
 *   1. the tile's rows are gathered (through the selection) into shared memory as bf16 hi and
 *      lo (one copy: keys and values are the same rows);
 *   2. S^T [32 keys][8 heads] = K Q^T: warp w scores keys 16 (w & 1) .. + 15 over half of the
 *      widths' k-steps (w >> 1), and the two halves add in shared memory;
 *   3. 16 threads a head take the tile's max, raise the head's running max, and write
 *      p = exp(score - max) as bf16 hi and lo, and the head's correction;
 *   4. O^T [d_v][8 heads] += V^T P^T: warp w holds value columns 128 w .. + 127 (8 m-tiles)
 *      for the 8 heads in registers, V^T's fragments read from the key rows in shared memory.
 * f32 within 2^-16 as k_att_mma (hi.hi + lo.hi + hi.lo; a bf16 cache's lo terms skipped).
 * Shared memory: q [ML_H][QKP + AM_PAD] and the tile [ML_KT][QKP + AM_PAD], each hi and lo
 * (QKP: the width rounded up to 16); the partial scores [4][16][ML_H] f32; p [ML_H][ML_KT +
 * AM_PAD] hi and lo; m, l and corr [ML_H]; the tile's positions [ML_KT]. 97 KB at GLM-5's
 * sizes. Values are the key rows' first d_v = d_a columns (the absorbed layout). Every head;
 * the tokens of one sequence, or of several (s.seq: a batched step's, a prefill's beside
 * decodes, each token over its own sequence's rows); block (x, z): token n - 1 - x (the last,
 * with the most keys when dense, first), heads 8 z ... A token without keys (nsel 0) gives
 * 0/0, NaN, as the reference. */
#define ML_KT 32
#define ML_H 8
#define ML_DV 512 /* value columns: 4 warps of 128 */

#define ML_QK 576 /* the widest keys: d_a + d_b */

static size_t ml_smem(int qk)
{
	size_t qs = (size_t)am_qkp(qk) + AM_PAD;
	return 2 * sizeof(uint16_t) *
		       ((size_t)ML_H * qs + (size_t)ML_KT * qs + (size_t)ML_H * (ML_KT + AM_PAD)) +
	       sizeof(float) * (4 * 16 * ML_H + 3 * ML_H) + sizeof(int) * ML_KT;
}

template <typename KV>
__global__ void __launch_bounds__(AP_THREADS)
k_mla_lat(float *out, const float *q, struct cpu_mla s, int n, int pos0)
{
	extern __shared__ uint16_t sb[];
	grid_dep_launch();
	typedef typename kv_b<KV>::t KB;
	constexpr bool EX = kv_bf16<KV>::v;
	int qk = s.d_a + s.d_b, dv = s.d_v, qkp = am_qkp(qk), qs = qkp + AM_PAD;
	constexpr int PS = ML_KT + AM_PAD;
	int i = n - 1 - (int)blockIdx.x, h0 = (int)blockIdx.z * ML_H, nh = min(ML_H, s.n_heads - h0);
	uint16_t *qh = sb, *ql = qh + ML_H * qs, *kh = ql + ML_H * qs, *kl = kh + ML_KT * qs;
	uint16_t *ph = kl + ML_KT * qs, *pl = ph + ML_H * PS;
	float *sp = (float *)(pl + ML_H * PS), *ms = sp + 4 * 16 * ML_H, *ls = ms + ML_H, *cr = ls + ML_H;
	int *tk = (int *)(cr + ML_H);
	for (int x = threadIdx.x; x < ML_H * qkp; x += blockDim.x) {
		int h = x / qkp, d = x % qkp;
		am_put(qh, ql, h * qs + d,
		       h < nh && d < qk ? q[((size_t)i * s.n_heads + h0 + h) * qk + d] : 0.0f);
	}
	if (threadIdx.x < ML_H) {
		ms[threadIdx.x] = -INFINITY;
		ls[threadIdx.x] = 0.0f;
	}
	int keys = s.sel ? s.nsel[i] : (s.seq ? s.pos[i] : pos0 + i) + 1;
	size_t base = s.seq ? (size_t)s.seq[i] * s.seq_rows : 0; /* its sequence's rows */
	const int *sel = s.sel ? s.sel + (size_t)i * s.sel_stride : NULL;
	int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, qq = lane % 4;
	int ksteps = qkp / 16, kh0 = (warp >> 1) * (ksteps / 2), kh1 = (warp >> 1) ? ksteps
										  : ksteps / 2;
	int c0 = warp * 128, ntc = (max(0, min(128, dv - c0)) + 15) / 16; /* its m-tiles of V^T */
	float o[8][4];
	am_zero(o);
	for (int j0 = 0; j0 < keys; j0 += ML_KT) { /* block-uniform loop */
		int cnt = min(ML_KT, keys - j0);
		__syncthreads(); /* q, m, l written; the last tile's rows and p read */
		if (threadIdx.x < ML_KT)
			tk[threadIdx.x] = threadIdx.x < cnt ? (sel ? sel[j0 + threadIdx.x]
								   : j0 + (int)threadIdx.x)
							    : -1;
		__syncthreads(); /* the positions */
		for (int x = threadIdx.x; x < ML_KT * qkp; x += blockDim.x) {
			int j = x / qkp, d = x % qkp;
			size_t t = base + (size_t)tk[j];
			float v = 0.0f;
			if (tk[j] >= 0 && d < s.d_a)
				v = kv_rc((const KV *)s.k_a + t * s.ka_stride,
					  kv_scales(s.a_s, t, s.d_a), d);
			else if (tk[j] >= 0 && d < qk)
				v = kv_ld((const KB *)s.k_b + t * s.kb_stride, (size_t)(d - s.d_a));
			am_put(kh, kl, j * qs + d, v);
		}
		__syncthreads(); /* the tile's rows */
		{ /* 2. the scores, half the k-steps a warp */
			float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			int r0 = (warp & 1) * 16;
			for (int k = kh0; k < kh1; k++) {
				int kk = k * 16;
				const uint16_t *pa = kh + (r0 + gq) * qs + kk + 2 * qq;
				uint32_t a[4] = {am_ld(pa), am_ld(pa + 8 * qs), am_ld(pa + 8),
						 am_ld(pa + 8 * qs + 8)};
				const uint16_t *pb = qh + gq * qs + kk + 2 * qq;
				const uint16_t *pc = ql + gq * qs + kk + 2 * qq;
				uint32_t bh[2] = {am_ld(pb), am_ld(pb + 8)};
				uint32_t bl[2] = {am_ld(pc), am_ld(pc + 8)};
				mma_bf16_16816(acc, a, bh);
				mma_bf16_16816(acc, a, bl);
				if (!EX) {
					const uint16_t *pd = kl + (r0 + gq) * qs + kk + 2 * qq;
					uint32_t al[4] = {am_ld(pd), am_ld(pd + 8 * qs), am_ld(pd + 8),
							  am_ld(pd + 8 * qs + 8)};
					mma_bf16_16816(acc, al, bh);
				}
			}
			/* acc: S^T [key r0 + gq (+ 8 for e >= 2)][head 2 qq + (e & 1)] */
			float *w = sp + warp * 16 * ML_H;
			w[gq * ML_H + 2 * qq] = acc[0];
			w[gq * ML_H + 2 * qq + 1] = acc[1];
			w[(gq + 8) * ML_H + 2 * qq] = acc[2];
			w[(gq + 8) * ML_H + 2 * qq + 1] = acc[3];
		}
		__syncthreads(); /* the partial scores */
		{ /* 3. 16 threads a head, 2 keys each */
			int h = threadIdx.x / 16, j = (threadIdx.x % 16) * 2;
			float sc[2], mt = -INFINITY;
#pragma unroll
			for (int u = 0; u < 2; u++) {
				int jj = j + u, wl = jj >> 4, r = jj & 15; /* warps wl and wl + 2 */
				float v = sp[(wl * 16 + r) * ML_H + h] + sp[((wl + 2) * 16 + r) * ML_H + h];
				sc[u] = jj < cnt ? v * s.scale : -INFINITY;
				mt = fmaxf(mt, sc[u]);
			}
#pragma unroll
			for (int x = 1; x < 16; x <<= 1)
				mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
			float m = ms[h], mn = fmaxf(m, mt), sum = 0.0f;
#pragma unroll
			for (int u = 0; u < 2; u++) {
				float e = mn == -INFINITY ? 0.0f : expf(sc[u] - mn);
				sum += e;
				am_put(ph, pl, h * PS + j + u, e);
			}
#pragma unroll
			for (int x = 1; x < 16; x <<= 1)
				sum += __shfl_xor_sync(0xffffffffu, sum, x);
			if (threadIdx.x % 16 == 0) {
				float c = mn == -INFINITY ? 1.0f : expf(m - mn);
				cr[h] = c;
				ms[h] = mn;
				ls[h] = ls[h] * c + sum;
			}
		}
		__syncthreads(); /* p and corr */
		float c2[2] = {cr[2 * qq], cr[2 * qq + 1]};
#pragma unroll
		for (int c = 0; c < 8; c++) {
			o[c][0] *= c2[0];
			o[c][1] *= c2[1];
			o[c][2] *= c2[0];
			o[c][3] *= c2[1];
		}
#pragma unroll
		for (int ks = 0; ks < 2; ks++) { /* keys 16 ks .. + 15 */
			const uint16_t *pb = ph + gq * PS + ks * 16 + 2 * qq;
			const uint16_t *pc = pl + gq * PS + ks * 16 + 2 * qq;
			uint32_t bh[2] = {am_ld(pb), am_ld(pb + 8)};
			uint32_t bl[2] = {am_ld(pc), am_ld(pc + 8)};
			/* V^T [col][key]: the rows' column col at keys 2 qq, 2 qq + 1 (+ 8) */
			const uint16_t *v0 = kh + (ks * 16 + 2 * qq) * qs;
			const uint16_t *w0 = kl + (ks * 16 + 2 * qq) * qs;
#pragma unroll
			for (int c = 0; c < 8; c++) {
				if (c >= ntc)
					break;
				int col = c0 + c * 16 + gq;
				uint32_t a[4] = {am_pack(v0[col], v0[qs + col]),
						 am_pack(v0[col + 8], v0[qs + col + 8]),
						 am_pack(v0[8 * qs + col], v0[9 * qs + col]),
						 am_pack(v0[8 * qs + col + 8], v0[9 * qs + col + 8])};
				mma_bf16_16816(o[c], a, bh);
				mma_bf16_16816(o[c], a, bl);
				if (!EX) {
					uint32_t al[4] = {am_pack(w0[col], w0[qs + col]),
							  am_pack(w0[col + 8], w0[qs + col + 8]),
							  am_pack(w0[8 * qs + col], w0[9 * qs + col]),
							  am_pack(w0[8 * qs + col + 8],
								  w0[9 * qs + col + 8])};
					mma_bf16_16816(o[c], al, bh);
				}
			}
		}
	}
	__syncthreads(); /* l final */
	/* o[c]: O^T [col c0 + 16 c + gq (+ 8 for e >= 2)][head 2 qq + (e & 1)] */
#pragma unroll
	for (int c = 0; c < 8; c++) {
		if (c >= ntc)
			break;
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int h = 2 * qq + (e & 1), col = c0 + c * 16 + gq + (e >= 2 ? 8 : 0);
			if (h < nh && col < dv)
				out[((size_t)i * s.n_heads + h0 + h) * dv + col] = o[c][e] / ls[h];
		}
	}
}


extern "C" bool wk_cuda_mla_latent_tiles(const struct cpu_mla *s, int n, int pos0, int i0,
					 int i1, int h0, int h1)
{
	bool can = n >= 1 && i0 == 0 && i1 == n && h0 == 0 && h1 == s->n_heads &&
		   !s->ka_head && !s->v_head && s->v == s->k_a && s->d_v == s->d_a &&
		   s->d_v > 0 && s->d_v <= ML_DV && s->d_a + s->d_b <= ML_QK &&
		   (s->n_heads + ML_H - 1) / ML_H <= 65535;
	if (att_forced)
		return can && att_forced == 3;
	return can && ap_worth(n, pos0, (long)n * ((s->n_heads + ML_H - 1) / ML_H));
}

template <typename KV>
static cudaError_t ml_launch(dim3 grid, size_t smem, float *out, const float *q,
			     const struct cpu_mla *s, int n, int pos0)
{
	cudaError_t e = cudaFuncSetAttribute((k_mla_lat<KV>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize,
					     (int)smem);
	if (e != cudaSuccess)
		return e;
	k_mla_lat<KV><<<grid, AP_THREADS, smem, wk_st()>>>(out, q, *s, n, pos0);
	return cudaSuccess;
}

extern "C" int wk_cuda_mla_latent(float *out, const float *q, const struct cpu_mla *s, int n,
				  int pos0, char *err, size_t errsz)
{
	dim3 grid((unsigned)n, 1, (unsigned)((s->n_heads + ML_H - 1) / ML_H));
	size_t smem = ml_smem(s->d_a + s->d_b);
	cudaError_t e = s->kv == DT_F8_E4M3 ? ml_launch<__nv_fp8_e4m3>(grid, smem, out, q, s, n, pos0)
			: s->kv == DT_BF16  ? ml_launch<uint16_t>(grid, smem, out, q, s, n, pos0)
					    : ml_launch<float>(grid, smem, out, q, s, n, pos0);
	if (e != cudaSuccess)
		return check(e, "mla_attention (latent tiles) shared memory", err, errsz);
	return launched("mla_attention", err, errsz);
}

extern "C" void wk_cuda_attention_force(int path)
{
	att_forced = path;
}

extern "C" int wk_cuda_attention_path(const struct cpu_gqa *s, int n, int pos0)
{
	bool can = !s->seq && s->head_dim >= 1 && s->head_dim <= AP_GQA_HD && n >= 1 &&
		   s->n_kv >= 1 && s->n_heads % s->n_kv == 0;
	if (att_forced)
		return att_forced >= 2 && can ? att_forced : 1;
	if (!can)
		return 1;
	int group = s->n_heads / s->n_kv, gm = att_gm(group), qt = AP_GQA_ROWS / gm;
	long blocks = (long)((n + qt - 1) / qt) * s->n_kv * ((group + gm - 1) / gm);
	return ap_worth(n, pos0, blocks) ? 3 : 1;
}

/* The dynamic shared memory of k_attention<., gm> for head_dim hd, and 4 floats of slack:
 * ptxas may merge a loop remainder's last scalar reads into one wider read past the end (what
 * compute-sanitizer's memcheck caught in the earlier kernel, at 301 positions). */
static size_t att_smem(int gm, int hd)
{
	return ((size_t)2 * gm * hd + (size_t)gm * ATT_TILE + 3 * (size_t)gm + 4) * sizeof(float);
}

/* Query heads a block of a group of that many runs. */
static int att_gm(int group)
{
	return group >= 8 ? 8 : group > 2 ? 4 : group;
}

/* The keys of the longest of n queries at pos0 (pos0 < 0: any number; several sequences:
 * s->keys_max, any number where it is not given). */
static long att_keys(const struct cpu_gqa *s, int n, int pos0)
{
	if (pos0 < 0 || (s->seq && s->keys_max <= 0))
		return -1;
	return s->seq ? s->keys_max : (long)pos0 + n;
}

/* The parts the keys of the longest query go in, its blocks (token, kv head, heads) being
 * that many: enough blocks to fill the device, each part at least ATT_SPLIT_MIN keys, at most
 * ATT_SPLIT_MAX parts. */
static int att_split(int blocks, long keys)
{
	return split_parts(blocks, split_max(keys, ATT_SPLIT_MIN));
}

extern "C" size_t wk_cuda_attention_part(const struct cpu_gqa *s, int n, int pos0)
{
	if (n < 1 || s->n_kv < 1 || s->n_heads % s->n_kv || s->head_dim < 1)
		return 0;
	int group = s->n_heads / s->n_kv, gm = att_gm(group);
	int sp = att_split(n * s->n_kv * ((group + gm - 1) / gm), att_keys(s, n, pos0));
	return sp > 1 ? (size_t)n * s->n_heads * sp * ((size_t)s->head_dim + 2) : 0;
}

template <typename KV>
static void att_launch(int gm, dim3 grid, size_t smem, float *out, const float *q,
		       const struct cpu_gqa *s, int pos0, int split, float *part, unsigned *count)
{
#define ATT(G)                                                                                 \
	k_attention<KV, G><<<grid, ATT_THREADS, smem, wk_st()>>>(out, q, *s, pos0, split, part, \
								 count)
	switch (gm) {
	case 1: ATT(1); break;
	case 2: ATT(2); break;
	case 4: ATT(4); break;
	default: ATT(8); break;
	}
#undef ATT
}

extern "C" int wk_cuda_attention(float *out, const float *q, const struct cpu_gqa *s, int n,
				 int pos0, const struct wk_att_split *sp, char *err, size_t errsz)
{
	enum dt_type kv = s->kv;
	int n_heads = s->n_heads, n_kv = s->n_kv, head_dim = s->head_dim;
	if (kv != DT_F32 && kv != DT_BF16 && kv != DT_F8_E4M3)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA attention: a %s KV cache (f32, bf16 or fp8)", dt_name(kv));
	if (kv == DT_F8_E4M3 && (!s->ks || !s->vs || s->kv_stride % head_dim))
		return wk_errf(err, errsz, WK_EINVAL, "CUDA attention: an fp8 KV cache needs its "
			       "scales and rows of head_dim (stride %d, head_dim %d)", s->kv_stride,
			       head_dim);
	if (n_kv < 1 || n_heads % n_kv || head_dim < 1 || n_kv > 65535)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA attention: %d heads over %d kv heads of "
			       "%d", n_heads, n_kv, head_dim);
	if (s->seq && !s->pos)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA attention: sequences without positions");
	if (n <= 0)
		return WK_OK;
	int group = n_heads / n_kv, gm = att_gm(group), chunks = (group + gm - 1) / gm;
	int path = wk_cuda_attention_path(s, n, pos0);
	if (path >= 2) {
		cudaError_t e;
		if (kv == DT_F8_E4M3)
			e = ap_launch_gqa<__nv_fp8_e4m3>(path, gm, out, q, s, n, pos0);
		else if (kv == DT_BF16)
			e = ap_launch_gqa<uint16_t>(path, gm, out, q, s, n, pos0);
		else
			e = ap_launch_gqa<float>(path, gm, out, q, s, n, pos0);
		if (e != cudaSuccess)
			return check(e, "attention (tiled) shared memory", err, errsz);
		return launched("attention", err, errsz);
	}
	size_t smem = att_smem(gm, head_dim);
	if (smem + sizeof(int) > ATT_SMEM_MAX) /* and the static `last` */
		return wk_errf(err, errsz, WK_EINVAL, "CUDA attention: head_dim %d (this kernel "
			       "holds up to %d)", head_dim,
			       (int)((ATT_SMEM_MAX / sizeof(float) - (size_t)gm * (ATT_TILE + 3) - 5) /
				     (2 * (size_t)gm)));
	int blocks = n * n_kv * chunks;
	int split = split_fit(att_split(blocks, att_keys(s, n, pos0)), sp,
			      (size_t)n * n_heads * ((size_t)head_dim + 2), blocks, 0);
	dim3 grid((unsigned)n, (unsigned)n_kv, (unsigned)(chunks * split));
	float *part = split > 1 ? sp->part : NULL;
	unsigned *count = split > 1 ? sp->count : NULL;
	if (kv == DT_F8_E4M3)
		att_launch<__nv_fp8_e4m3>(gm, grid, smem, out, q, s, pos0, split, part, count);
	else if (kv == DT_BF16)
		att_launch<uint16_t>(gm, grid, smem, out, q, s, pos0, split, part, count);
	else
		att_launch<float>(gm, grid, smem, out, q, s, pos0, split, part, count);
	return launched("attention", err, errsz);
}
