/*
 * attention.cu - GQA attention (cpu_ref_attention) and the tiled prefill attention that GQA
 * and MLA's expanded form share (cpu_ref_mla_attention; glm_kernels.cu routes MLA here): a
 * block a token for decode, with flash-decoding's split of long contexts, and query tiles for
 * a prefill, on the f32 pipes (k_att_tiled) or on the tensor cores (k_att_mma). Which runs
 * is chosen per call (wk_cuda_attention_path, wk_cuda_mla_tiles); tests/unit/test_cuda.c and
 * test_cuda_glm.c compare each with the CPU reference.
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

#define AP_GQA_ROWS 64
#define AP_GQA_HD 128 /* 16 columns of 8 apart */

template <typename KV>
static cudaError_t ap_launch_gqa(int gm, float *out, const float *q, const struct cpu_gqa *s,
				 int n, int pos0)
{
	struct ap_gqa<KV> src = {(const KV *)s->k, (const KV *)s->v, s->ks, s->vs, s->kv_stride,
				 s->head_dim, (size_t)(s->kv_stride / s->head_dim)};
	int group = s->n_heads / s->n_kv, qt = AP_GQA_ROWS / gm, hd = s->head_dim;
	dim3 grid((unsigned)((n + qt - 1) / qt), (unsigned)s->n_kv,
		  (unsigned)((group + gm - 1) / gm));
#define AP(G)                                                                                  \
	ap_launch_gm<AP_GQA_ROWS, G>(grid, src, out, q, s->n_heads, group, n, pos0, s->scale, hd, \
				     hd)
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

extern "C" int wk_cuda_mla_tiled(float *out, const float *q, const struct cpu_mla *s, int n,
				 int pos0, char *err, size_t errsz)
{
	struct ap_mla src = {(const float *)s->k_a, (const float *)s->k_b, (const float *)s->v,
			     s->ka_stride, s->ka_head, s->kb_stride, s->v_stride, s->v_head,
			     s->d_a, s->d_b, s->d_v};
	dim3 grid((unsigned)((n + AP_MLA_ROWS - 1) / AP_MLA_ROWS), (unsigned)s->n_heads, 1);
	cudaError_t e = ap_launch_gm<AP_MLA_ROWS, 1>(grid, src, out, q, s->n_heads, 1, n, pos0,
						     s->scale, s->d_a + s->d_b, s->d_v);
	if (e != cudaSuccess)
		return check(e, "mla_attention (tiled) shared memory", err, errsz);
	return launched("mla_attention", err, errsz);
}

static int att_forced; /* wk_cuda_attention_force */

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
		return can && att_forced == 2;
	return can && ap_worth(n, pos0, (long)((n + AP_MLA_ROWS - 1) / AP_MLA_ROWS) * s->n_heads);
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
		return att_forced == 2 && can ? 2 : 1;
	if (!can)
		return 1;
	int group = s->n_heads / s->n_kv, gm = att_gm(group), qt = AP_GQA_ROWS / gm;
	long blocks = (long)((n + qt - 1) / qt) * s->n_kv * ((group + gm - 1) / gm);
	return ap_worth(n, pos0, blocks) ? 2 : 1;
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
	if (wk_cuda_attention_path(s, n, pos0) == 2) {
		cudaError_t e;
		if (kv == DT_F8_E4M3)
			e = ap_launch_gqa<__nv_fp8_e4m3>(gm, out, q, s, n, pos0);
		else if (kv == DT_BF16)
			e = ap_launch_gqa<uint16_t>(gm, out, q, s, n, pos0);
		else
			e = ap_launch_gqa<float>(gm, out, q, s, n, pos0);
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
