/*
 * moe_kernels.cu - a MoE layer's routed experts, and optionally its shared expert, as one
 * grouped op (wk_cuda_moe_experts, with the contract of cpu_ref_moe_experts in
 * kernels/cpu/glm_ref.c), in three launches whatever the number of tokens:
 *
 *   1. plan (one block): count the slots of each local expert, prefix-sum the counts, list
 *      the active experts (count > 0) compactly and place every local slot into its expert's
 *      group: tok[g] = the token of grouped slot g, pos[t][j] = g, or -1 for a slot of
 *      another rank's expert; zero the per-token counters of 3;
 *   2. gate/up: block (x, y) computes rows x*MOE_ROWS .. of h[g] = silu(gate_e . x[tok[g]]) *
 *      (up_e . x[tok[g]]) for every slot g of active expert y (and y + gridDim.y, ...); the
 *      shared expert is one more group, after the active experts, whose slot t is token t
 *      (its rows in hs);
 *   3. down: the same over dim rows, z[g] = down_e . h[g] (the shared expert's zs[t]); then
 *      the combine: each block, once a group's rows are written and fenced, counts them on
 *      the group's tokens, and the block that completes a token (every row block of every
 *      group of the token counted) writes y[t] = (zs[t] or y[t]) + wt[t][j] * z[pos[t][j]],
 *      j = 0, 1, ... as the reference adds them, and puts its counter back to zero.
 *
 * The host never reads the plan back (that would cost a copy and a wait), so the grids of 2
 * and 3 are sized by what the plan could find: min(n_local, n * top_k) experts (one more
 * with the shared expert), blocks past the active count leaving at once. Each grouped slot's
 * row is computed from its own (expert, token) alone, so the order of slots within a group,
 * which the plan's atomics make arbitrary, changes no value; nor does which block combines a
 * token, which the atomics also decide: the result is deterministic. With split_combine the
 * combine is a fourth launch, one block per token, with the same device code.
 *
 * Decode (below the grouped GEMMs): a warp takes MOE_R = 4 rows of an expert's matrix and
 * streams them in 16-byte chunks, as the decode GEMV does (stream_rows), one grouped slot a
 * pass (a decode step's experts have one slot or a few; the next pass reads the rows from
 * L2); x and h are read through L1, each 16-byte piece once for the 4 rows. Where a matrix's
 * rows are not whole 16-byte chunks (or x is misaligned) it goes a row at a time, as the
 * first version did everything: a warp per output row, a byte of it a lane at a time (a
 * warp's load 32 bytes), MOE_TOK slots per pass (wk_cuda_moe_rows_v0 keeps that version for
 * the lab's baseline). Not yet run on a GPU: the lab's "moe experts 1 tok" and "8 tok" rows
 * print both as GB/s of the chosen experts against the copy.
 *
 * Prefill (n >= MOE_GEMM_TOKENS = 64 tokens, FP8 e4m3 weights with 128x128 block scales for
 * the routed experts and the shared one; other dtypes keep the path above): 2 and 3 run as
 * grouped GEMMs on the tensor cores with gemm_fp8w.cu's tile machinery (fp8w_tile.cuh: f32
 * activations as bf16 hi + lo, bf16 wgmma, per-block weight-scale promotion), in six
 * launches: the plan (it also lays out tiles: tstart[e], ceil(count_e / 128) tiles each, and
 * the totals), x split into bf16 halves once per token (wk_cuda_act_split), gate and up
 * (grid z) on tiles of 128 grouped slots of one expert (or of the shared expert's tokens),
 * the token rows gathered through tok[] by cp.async into the swizzled tile, then SiLU(gate) *
 * up split into bf16 halves per grouped slot (k_moe_silu_split), down on the same tiles
 * (rows are the slots themselves), then the combine as its own launch (k_moe_combine: the
 * shared expert's output first, then the slots in order j, as above: the result is
 * deterministic). A block finds its tile by bisection over tstart; the grid is the most
 * tiles the plan could find, sum ceil(c_e / 128) <= (n top_k + 127 A) / 128 + 1 for A =
 * min(n_local, n top_k) active experts, plus ceil(n / 128) for the shared expert, blocks
 * past the work leaving at once. The scratch then also holds the split x, up, and the split
 * h. Only the CPU emulator has run it (tests/unit/test_cuda_moe.c's moe_experts_gemm_matches_ref
 * within 1e-5 of cpu_ref_moe_experts, cuda_emulated.sh's 150-token GLM-5 prefill within 1e-3
 * of the CPU's logits); no GPU yet: the lab's "moe experts GEMM" row times it on GLM-5's
 * shape. ptxas (sm_90a): gate/up 232 registers, down 248, no stack frame, no spills (the
 * shared expert's weights read from the parameter by value: taking &a.sh put a on the
 * stack; down's two calls of gemm_tile, one per source, spilled less than one with selects).
 * Not yet: gate and up in one tile with SiLU in the epilogue (two accumulators do not fit
 * beside the pipeline's registers), the combine inside down, any tuning.
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
#include "kernels/cuda/fp8w_tile.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/moe_route.cuh"

#define MOE_THREADS 256
#define MOE_ROWS (MOE_THREADS / 32) /* warps per block of 2 and 3 */
#define MOE_TOK 4 /* slots per pass over a weight row, accumulated in registers */
#define MOE_R 4   /* rows of a warp on the streaming path (moe_args.wr; the first version 1) */
#define MOE_U 1   /* 16-byte chunks of each of those rows a lane loads before using any */
#define PLAN_THREADS 1024
#define MAX_GRID_Y 65535
#define MOE_GEMM_TOKENS 64 /* from these tokens FP8 experts take the grouped GEMMs */

/* The plan in the caller's scratch, each part 256-byte aligned (see plan_layout). Slots
 * are numbered s = t * top_k + j; grouped slots g are the local ones, expert by expert. */
struct moe_plan {
	int *count; /* [n_local] slots of local expert e */
	int *start; /* [n_local] its first grouped slot */
	int *cur; /* [n_local] placement cursor; start + count once placed */
	int *active; /* [n_local] local experts with count > 0, ascending; n_active of them */
	int *n_active; /* [1] */
	int *n_tiles; /* [1] the grouped GEMM's 128-slot tiles of the active experts (sum of tiles) */
	int *n_slots; /* [1] local slots: grouped slots 0 .. n_slots - 1 are in use */
	int *tstart; /* [n_local] expert e's first tile (ceil(count / 128) tiles each) */
	int *tok; /* [n * top_k] token of grouped slot g */
	int *pos; /* [n * top_k] grouped slot of slot s, or -1 */
	float *h; /* [n * top_k][inter] SiLU(gate) * up of grouped slot g */
	float *z; /* [n * top_k][dim] the expert's output for grouped slot g */
	unsigned *done; /* [n] row blocks of token t's groups written (3's combine) */
	float *hs; /* [n][shared_inter] the shared expert's SiLU(gate) * up (empty without it) */
	float *zs; /* [n][dim] its output */
	/* the grouped GEMM's (gemm_layout; NULL without it): */
	uint16_t *xb; /* [2][n][SPLIT(dim)] x as bf16 hi, lo (wk_cuda_act_split) */
	float *u; /* [n * top_k][inter] up_e . x[tok[g]]; gate's in h */
	float *us; /* [n][shared_inter] the shared expert's, gate's in hs */
	uint16_t *hb; /* [2][n * top_k][SPLIT(inter)] SiLU(gate) * up as bf16 hi, lo */
	uint16_t *hsb; /* [2][n][SPLIT(shared_inter)] the shared expert's */
};

/* Whether n tokens take the grouped GEMM: enough of them (prefill) and FP8 weights throughout
 * (other dtypes keep the warp-per-row path). */
static bool use_gemm(int n, const struct wk_moe *m)
{
	return n >= MOE_GEMM_TOKENS && m->wdt == DT_F8_E4M3 &&
	       (!m->shared || m->shared_wdt == DT_F8_E4M3);
}

/* What 2 and 3 read besides the plan: the routing's weights, the layer (m, with the shared
 * expert by value: sh_inter 0 for none) and y. */
struct moe_args {
	const float *x, *wt;
	float *y;
	const struct cpu_expert *experts;
	struct cpu_expert sh;
	enum dt_type wdt, sh_wdt;
	int n, top_k, dim, inter, sh_inter, n_local;
	int wr;       /* rows a warp: MOE_R (streaming), or 1 (the first version, a baseline) */
	bool combine; /* 3 combines (else the combine launch does) */
};

static size_t al256(size_t b)
{
	return (b + 255) & ~(size_t)255;
}

/* The scratch's size; with base, also the parts' addresses in *p. n, top_k >= 0 and m's
 * sizes checked (experts_args) or clamped (the size alone). */
static size_t plan_layout(char *base, int n, int top_k, const struct wk_moe *m,
			  struct moe_plan *p)
{
	size_t ns = (size_t)n * (size_t)top_k, nl = m->n_local > 0 ? (size_t)m->n_local : 0;
	size_t dim = m->dim > 0 ? (size_t)m->dim : 0, inter = m->inter > 0 ? (size_t)m->inter : 0;
	size_t sh = m->shared && m->shared_inter > 0 ? (size_t)m->shared_inter : 0;
	size_t nt = (size_t)n, nsh = sh ? nt : 0, gm = use_gemm(n, m);
	size_t sz[18] = {nl * 4, nl * 4, nl * 4, nl * 4, 16, ns * 4, ns * 4,
			 ns * inter * 4, ns * dim * 4, nt * 4, nsh * sh * 4, nsh * dim * 4,
			 nl * 4,
			 gm * 4 * nt * WK_CUDA_SPLIT_COLS(dim), gm * ns * inter * 4,
			 gm * nsh * sh * 4, gm * 4 * ns * WK_CUDA_SPLIT_COLS(inter),
			 gm * 4 * nsh * WK_CUDA_SPLIT_COLS(sh)};
	char *at[18];
	size_t off = 0;
	for (int i = 0; i < 18; i++) {
		at[i] = base ? base + off : NULL;
		off += al256(sz[i]);
	}
	if (p) {
		int *sums = (int *)at[4];
		struct moe_plan q = {(int *)at[0], (int *)at[1], (int *)at[2], (int *)at[3],
				     sums, sums ? sums + 1 : NULL, sums ? sums + 2 : NULL,
				     (int *)at[12], (int *)at[5], (int *)at[6], (float *)at[7],
				     (float *)at[8], (unsigned *)at[9], (float *)at[10],
				     (float *)at[11], NULL, NULL, NULL, NULL, NULL};
		if (gm) {
			q.xb = (uint16_t *)at[13];
			q.u = (float *)at[14];
			q.us = (float *)at[15];
			q.hb = (uint16_t *)at[16];
			q.hsb = (uint16_t *)at[17];
		}
		*p = q;
	}
	return off;
}

/* ---- 1. plan: one block ---------------------------------------------------------------- */

/* The whole block (any size), for n tokens of top_k slots. scan: 32 ints of shared memory. */
__device__ void plan_block(struct moe_plan p, const int *idx, int n, int top_k, int ex0,
			   int n_local, int *scan)
{
	int nslots = n * top_k;
	for (int e = threadIdx.x; e < n_local; e += blockDim.x)
		p.count[e] = 0;
	for (int t = threadIdx.x; t < n; t += blockDim.x)
		p.done[t] = 0;
	__syncthreads(); /* a block's global writes are visible to it after a barrier */
	for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
		int e = idx[s] - ex0;
		if (e >= 0 && e < n_local)
			atomicAdd(&p.count[e], 1);
	}
	__syncthreads();
	int off = 0, na = 0, nt = 0; /* grouped slots, active experts, tiles before this chunk */
	for (int c0 = 0; c0 < n_local; c0 += blockDim.x) { /* block-uniform loop */
		int e = c0 + (int)threadIdx.x;
		int c = e < n_local ? p.count[e] : 0, act = c > 0, tiles = (c + FM - 1) / FM;
		int tc, ta, tt;
		int before = block_scan(c, scan, &tc) - c;
		int abefore = block_scan(act, scan, &ta) - act;
		int tbefore = block_scan(tiles, scan, &tt) - tiles;
		if (e < n_local) {
			p.start[e] = p.cur[e] = off + before;
			p.tstart[e] = nt + tbefore;
		}
		if (act)
			p.active[na + abefore] = e;
		off += tc;
		na += ta;
		nt += tt;
	}
	if (threadIdx.x == 0) {
		*p.n_active = na;
		*p.n_tiles = nt;
		*p.n_slots = off;
	}
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

__global__ void __launch_bounds__(PLAN_THREADS)
	k_moe_plan(struct moe_plan p, const int *idx, int n, int top_k, int ex0, int n_local)
{
	__shared__ int scan[32];
	plan_block(p, idx, n, top_k, ex0, n_local, scan);
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

/* Block t of n: k_moe_route_plan's body, and a chained launch's. */
__device__ void route_plan_block(const struct route_args &r, const struct moe_plan &p,
				 int top_k, int ex0, int n_local, int t, int n)
{
	__shared__ int scan[32];
	__shared__ int s_last;
	route_token(r.idx, r.wt, r.logits, r.bias, r.n_experts, top_k, r.n_group, r.topk_group,
		    r.norm, r.scale, t);
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		s_last = atomicAdd(r.count, 1u) == (unsigned)n - 1;
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	plan_block(p, r.idx, n, top_k, ex0, n_local, scan);
	if (threadIdx.x == 0)
		*r.count = 0;
}

__global__ void k_moe_route_plan(struct route_args r, struct moe_plan p, int top_k, int ex0,
				 int n_local)
{
	route_plan_block(r, p, top_k, ex0, n_local, (int)blockIdx.x, (int)gridDim.x);
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

/* f(w as a pointer to its element type), dt one of the four experts_args lets through
 * (warp-uniform) */
template <typename F>
__device__ __forceinline__ void by_dtype(enum dt_type dt, const void *w, F f)
{
	switch (dt) {
	case DT_F32:
		f((const float *)w);
		break;
	case DT_BF16:
		f((const __nv_bfloat16 *)w);
		break;
	case DT_F16:
		f((const __half *)w);
		break;
	default: /* DT_F8_E4M3 */
		f((const __nv_fp8_e4m3 *)w);
	}
}

/* warp_dots on w of dtype dt */
__device__ __forceinline__ void dots(float *acc, enum dt_type dt, const void *w, const float *s,
				     int r, int cols, const float *const *in, int m)
{
	by_dtype(dt, w, [&](auto wt) { warp_dots(acc, wt, s, r, cols, in, m); });
}

/* The streaming path: acc[i] = w[r0 + i] . x for i < MOE_R, one input row x, as warp_dots
 * computes each row, for 16-byte aligned w and x and cols a whole number of 16-byte chunks
 * (moe_vec). Built like the decode GEMV (gemv.cuh): the lanes stride over the warp's MOE_R
 * rows in 16-byte chunks (16 e4m3, 8 bf16 or f16, 4 f32 weights; a warp's load is 512
 * contiguous bytes of a row), each lane loading MOE_U chunks of every row before it uses any
 * (4 loads of 16 bytes in flight, past L1: ld.global.nc, so that L1 keeps x), and each x
 * piece, 4 floats, is read once for the MOE_R rows. An FP8 chunk lies in one 128-column
 * scale block, so its sum takes the block's scale once. x is read with plain loads: in a
 * chained launch another block wrote it earlier in the same launch. Rows past rows read row
 * rows - 1 (the caller stores only rows that exist). One input row a pass: an expert's second
 * slot reads the rows again, from L2 (a decode step's experts have one slot or a few), which
 * keeps the registers to what the chained launch's GEMVs need (k_chain holds both; not
 * inlined for the same reason: inlined, k_chain<1> took 212-248 registers against its 128,
 * and with MOE_U 2, 144: an SM then holds one block of it, not two). The first
 * version read a byte of one row a lane at a time (a warp's load 32 bytes) and x once a
 * weight: on an H200 the GEMV built that way (the lab's v0) read FP8 7168 x 2048 at 16 % of
 * the copy bandwidth at 1 token, 4 % at 8. */
template <typename T>
__device__ __noinline__ void stream_rows(float (&acc)[MOE_R], const T *w, const float *s,
					    int r0, int rows, int cols, const float *x)
{
	constexpr bool FP8 = mm_fp8<T>::v;
	constexpr int E = 16 / (int)sizeof(T);
	const T *tag = NULL;
	int lane = threadIdx.x & 31, nch = cols / E, nb = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
	const T *wr[MOE_R];
	const float *sr[MOE_R];
#pragma unroll
	for (int i = 0; i < MOE_R; i++) {
		int r = min(r0 + i, rows - 1);
		wr[i] = w + (size_t)r * cols;
		sr[i] = FP8 && s ? s + (size_t)(r / FP8_BLOCK) * nb : NULL;
		acc[i] = 0.0f;
	}
	for (int k0 = lane; k0 < nch; k0 += 32 * MOE_U) {
		uint4 wv[MOE_U][MOE_R]; /* a chunk past the row's end loads its last, unused */
#pragma unroll
		for (int u = 0; u < MOE_U; u++)
#pragma unroll
			for (int i = 0; i < MOE_R; i++)
				wv[u][i] = ld_stream16(wr[i] + (size_t)min(k0 + 32 * u, nch - 1) * E);
#pragma unroll
		for (int u = 0; u < MOE_U; u++) {
			if (k0 + 32 * u >= nch)
				break;
			int c = (k0 + 32 * u) * E;
			float p[MOE_R] = {};
#pragma unroll
			for (int q = 0; q < E / 4; q++) {
				float xv[4];
				ld_x4<true>(xv, x + c + 4 * q);
#pragma unroll
				for (int i = 0; i < MOE_R; i++) {
					float f[4];
					quad(wv[u][i], q, f, tag);
#pragma unroll
					for (int e = 0; e < 4; e++)
						p[i] = fmaf(f[e], xv[e], p[i]);
				}
			}
#pragma unroll
			for (int i = 0; i < MOE_R; i++)
				acc[i] = FP8 ? fmaf(p[i], sr[i] ? sr[i][c / FP8_BLOCK] : NAN, acc[i])
					     : acc[i] + p[i];
		}
	}
#pragma unroll
	for (int i = 0; i < MOE_R; i++)
		acc[i] = warp_sum(acc[i]);
}

/* Whether the streaming path takes a weight of dtype dt at w with cols columns against input
 * rows at x, stride floats apart (warp-uniform). */
__device__ __forceinline__ bool moe_vec(enum dt_type dt, const void *w, int cols, const float *x,
					size_t stride)
{
	int e = dt == DT_F32 ? 4 : dt == DT_F8_E4M3 ? 16 : 8; /* elements in 16 bytes */
	return ((uintptr_t)w % 16) == 0 && cols % e == 0 && ((uintptr_t)x % 16) == 0 &&
	       stride % 4 == 0;
}

/* stream_rows on w of dtype dt */
__device__ __forceinline__ void stream(float (&acc)[MOE_R], enum dt_type dt, const void *w,
				       const float *s, int r0, int rows, int cols, const float *x)
{
	by_dtype(dt, w, [&](auto wt) { stream_rows(acc, wt, s, r0, rows, cols, x); });
}

/* Group i of 2 and 3: active expert i's grouped slots, or (i == n_active) the shared
 * expert's, one slot per token. */
struct moe_group {
	struct cpu_expert ex;
	enum dt_type dt;
	int g0, g1, inter;
	const int *tok; /* token of slot g; NULL: g itself */
	float *h, *z;   /* [g][inter], [g][dim] */
};

__device__ __forceinline__ struct moe_group group_at(const struct moe_plan &p,
						     const struct moe_args &a, int i, int na)
{
	struct moe_group gr;
	if (i < na) {
		int e = p.active[i];
		gr.ex = a.experts[e];
		gr.dt = a.wdt;
		gr.g0 = p.start[e];
		gr.g1 = gr.g0 + p.count[e];
		gr.inter = a.inter;
		gr.tok = p.tok;
		gr.h = p.h;
		gr.z = p.z;
	} else {
		gr.ex = a.sh;
		gr.dt = a.sh_wdt;
		gr.g0 = 0;
		gr.g1 = a.n;
		gr.inter = a.sh_inter;
		gr.tok = NULL;
		gr.h = p.hs;
		gr.z = p.zs;
	}
	return gr;
}

/* h[g][r] = silu(gate_e[r] . x[tok[g]]) * (up_e[r] . x[tok[g]]) for the slots g of the
 * block's groups, with silu(v) = v / (1 + exp(-v)) as cpu_ref_silu_mul. Warps whose row is
 * past a group's width skip it (no block barriers here). */
__device__ void gate_up_block(const struct moe_plan &p, const struct moe_args &a, int bx, int by,
			      int gy)
{
	int r0 = (bx * MOE_ROWS + (threadIdx.x >> 5)) * a.wr, lane = threadIdx.x & 31;
	int na = *p.n_active, ng = na + (a.sh_inter > 0);
	for (int i = by; i < ng; i += gy) {
		struct moe_group gr = group_at(p, a, i, na);
		if (r0 >= gr.inter)
			continue;
		if (a.wr == MOE_R && moe_vec(gr.dt, gr.ex.gate, a.dim, a.x, (size_t)a.dim) &&
		    moe_vec(gr.dt, gr.ex.up, a.dim, a.x, (size_t)a.dim)) {
			for (int g = gr.g0; g < gr.g1; g++) { /* the streaming path: a slot a pass */
				const float *x = a.x + (size_t)(gr.tok ? gr.tok[g] : g) * a.dim;
				float gs[MOE_R], us[MOE_R];
				stream(gs, gr.dt, gr.ex.gate, gr.ex.gate_s, r0, gr.inter, a.dim, x);
				stream(us, gr.dt, gr.ex.up, gr.ex.up_s, r0, gr.inter, a.dim, x);
				if (lane == 0)
#pragma unroll
					for (int j = 0; j < MOE_R; j++)
						if (r0 + j < gr.inter)
							gr.h[(size_t)g * gr.inter + r0 + j] =
								gs[j] / (1.0f + expf(-gs[j])) * us[j];
			}
			continue;
		}
		for (int r = r0; r < r0 + a.wr && r < gr.inter; r++) /* a row at a time */
			for (int g0 = gr.g0; g0 < gr.g1; g0 += MOE_TOK) {
				int m = min(MOE_TOK, gr.g1 - g0);
				const float *in[MOE_TOK];
#pragma unroll
				for (int k = 0; k < MOE_TOK; k++)
					in[k] = k < m ? a.x + (size_t)(gr.tok ? gr.tok[g0 + k] : g0 + k) *
								      a.dim
						      : NULL;
				float gs[MOE_TOK], us[MOE_TOK];
				dots(gs, gr.dt, gr.ex.gate, gr.ex.gate_s, r, a.dim, in, m);
				dots(us, gr.dt, gr.ex.up, gr.ex.up_s, r, a.dim, in, m);
				if (lane == 0)
					for (int k = 0; k < m; k++)
						gr.h[(size_t)(g0 + k) * gr.inter + r] =
							gs[k] / (1.0f + expf(-gs[k])) * us[k];
			}
	}
}

__global__ void k_moe_gate_up(struct moe_plan p, struct moe_args a)
{
	gate_up_block(p, a, (int)blockIdx.x, (int)blockIdx.y, (int)gridDim.y);
}

/* y[t][c] = (zs[t][c] with a shared expert, else y[t][c]) + wt[t][j] * z[pos[t][j]][c] for
 * j = 0, 1, ... with pos >= 0, one addition at a time in the reference's order; columns c =
 * c0, c0 + step, ... z and zs are read volatile (from L2, not this SM's L1): inside 3 other
 * blocks wrote them, and a line this SM cached for an earlier token may hold a neighbouring
 * row from before its writes (the CUDA guide's condition for __threadfence ordering). */
__device__ void combine_token(const struct moe_plan &p, const struct moe_args &a, int t, int c0,
			      int step)
{
	const int *pt = p.pos + (size_t)t * a.top_k;
	const float *wv = a.wt + (size_t)t * a.top_k;
	const volatile float *z = p.z;
	const volatile float *zs = a.sh_inter > 0 ? p.zs + (size_t)t * a.dim : NULL;
	float *yt = a.y + (size_t)t * a.dim;
	for (int c = c0; c < a.dim; c += step) {
		float v = zs ? zs[c] : yt[c];
		for (int j = 0; j < a.top_k; j++) {
			int g = pt[j];
			if (g >= 0)
				v += wv[j] * z[(size_t)g * a.dim + c];
		}
		yt[c] = v;
	}
}

/* After the block wrote its rows of group gr (the whole block; gr block-uniform): each slot's
 * token counts the block's part, and the block that counts a token's last part (gridDim.x
 * row blocks for each of its local slots and its shared expert) combines it and zeroes its
 * counter. gx: the row blocks of a group (the launch's gridDim.x). ready: blockDim.x ints,
 * n_ready: one, of shared memory. */
__device__ void count_and_combine(const struct moe_plan &p, const struct moe_args &a,
				  const struct moe_group &gr, int *ready, int *n_ready, int gx)
{
	__threadfence(); /* this block's z rows are visible before any counter moves */
	__syncthreads();
	for (int c0 = gr.g0; c0 < gr.g1; c0 += blockDim.x) { /* block-uniform */
		if (threadIdx.x == 0)
			*n_ready = 0;
		__syncthreads();
		int g = c0 + (int)threadIdx.x;
		if (g < gr.g1) {
			int t = gr.tok ? gr.tok[g] : g;
			unsigned parts = a.sh_inter > 0;
			for (int j = 0; j < a.top_k; j++)
				parts += p.pos[(size_t)t * a.top_k + j] >= 0;
			if (atomicAdd(&p.done[t], 1u) == parts * (unsigned)gx - 1)
				ready[atomicAdd(n_ready, 1)] = t;
		}
		__syncthreads();
		int nr = *n_ready;
		if (nr > 0)
			__threadfence(); /* then every other block's rows of these tokens */
		for (int k = 0; k < nr; k++) {
			combine_token(p, a, ready[k], (int)threadIdx.x, (int)blockDim.x);
			if (threadIdx.x == 0)
				p.done[ready[k]] = 0;
		}
		__syncthreads(); /* ready and n_ready are reused */
	}
}

/* z[g][r] = down_e[r] . h[g] for the slots g of the block's groups, then (a.combine) the
 * combine of the tokens this block completes. */
__device__ void down_block(const struct moe_plan &p, const struct moe_args &a, int bx, int by,
			   int gx, int gy)
{
	__shared__ int ready[MOE_THREADS];
	__shared__ int n_ready;
	int r0 = (bx * MOE_ROWS + (threadIdx.x >> 5)) * a.wr, lane = threadIdx.x & 31;
	int na = *p.n_active, ng = na + (a.sh_inter > 0);
	for (int i = by; i < ng; i += gy) { /* block-uniform */
		struct moe_group gr = group_at(p, a, i, na);
		if (r0 < a.dim && a.wr == MOE_R &&
		    moe_vec(gr.dt, gr.ex.down, gr.inter, gr.h, (size_t)gr.inter)) {
			for (int g = gr.g0; g < gr.g1; g++) { /* the streaming path: a slot a pass */
				float zs[MOE_R];
				stream(zs, gr.dt, gr.ex.down, gr.ex.down_s, r0, a.dim, gr.inter,
				       gr.h + (size_t)g * gr.inter);
				if (lane == 0)
#pragma unroll
					for (int j = 0; j < MOE_R; j++)
						if (r0 + j < a.dim)
							gr.z[(size_t)g * a.dim + r0 + j] = zs[j];
			}
		} else {
			for (int r = r0; r < r0 + a.wr && r < a.dim; r++) /* a row at a time */
				for (int g0 = gr.g0; g0 < gr.g1; g0 += MOE_TOK) {
					int m = min(MOE_TOK, gr.g1 - g0);
					const float *in[MOE_TOK];
#pragma unroll
					for (int k = 0; k < MOE_TOK; k++)
						in[k] = k < m ? gr.h + (size_t)(g0 + k) * gr.inter : NULL;
					float zs[MOE_TOK];
					dots(zs, gr.dt, gr.ex.down, gr.ex.down_s, r, gr.inter, in, m);
					if (lane == 0)
						for (int k = 0; k < m; k++)
							gr.z[(size_t)(g0 + k) * a.dim + r] = zs[k];
				}
		}
		if (a.combine)
			count_and_combine(p, a, gr, ready, &n_ready, gx);
	}
}

__global__ void k_moe_down(struct moe_plan p, struct moe_args a)
{
	down_block(p, a, (int)blockIdx.x, (int)blockIdx.y, (int)gridDim.x, (int)gridDim.y);
}

/* split_combine: one block per token */
__global__ void k_moe_combine(struct moe_plan p, struct moe_args a)
{
	grid_dep_launch(); /* a GEMV after it may start (kernels before a GEMV do this) */
	combine_token(p, a, (int)blockIdx.x, (int)threadIdx.x, (int)blockDim.x);
}

/* ---- 2, 3 for many tokens: grouped GEMMs on the tensor cores (fp8w_tile.cuh) -------------- */

/* Tile b of a grouped GEMM (block-uniform): a routed expert's 128 grouped slots from g0
 * (b < n_tiles: the expert whose tiles [tstart, tstart + ceil(count / 128)) hold b, found by
 * bisection over tstart, non-decreasing), or the shared expert's tokens from g0 (b - n_tiles
 * below ceil(n / 128)); false past both: the block has nothing to do. */
struct moe_tile {
	int e, g0, g1; /* e: local expert, -1 for the shared one; slots [g0, g1) */
};

__device__ __forceinline__ bool tile_at(const struct moe_plan &p, const struct moe_args &a,
					int b, struct moe_tile *t)
{
	int nt = *p.n_tiles;
	if (b < nt) {
		int lo = 0, hi = a.n_local - 1; /* the last e with tstart[e] <= b: it has tiles */
		while (lo < hi) {
			int mid = (lo + hi + 1) / 2;
			if (p.tstart[mid] <= b)
				lo = mid;
			else
				hi = mid - 1;
		}
		t->e = lo;
		t->g0 = p.start[lo] + (b - p.tstart[lo]) * FM;
		t->g1 = min(t->g0 + FM, p.start[lo] + p.count[lo]);
		return true;
	}
	b -= nt;
	if (a.sh_inter <= 0 || b >= (a.n + FM - 1) / FM)
		return false;
	t->e = -1;
	t->g0 = b * FM;
	t->g1 = min(t->g0 + FM, a.n);
	return true;
}

/* The tile's weight: w [rows][cols] with scales ws, filled by cp.async when cols % 16 == 0
 * and w is 16-byte aligned, else by ordinary loads (FILL_EITHER). Without scales
 * (an FP8 expert the host could not refuse, see scale_at) the tile's outputs are NaN. */
template <bool RS>
__device__ __forceinline__ void gemm_tile(const int *srow, float *y, int n_out,
					  const uint16_t *xb, int nsrc, const void *w,
					  const float *ws, int r0, int rows, int cols)
{
	extern __shared__ uint4 moe_smem[];
	if (!ws) { /* block-uniform */
		int wr = min(FN, rows - r0);
		for (int i = (int)threadIdx.x; i < n_out * wr; i += FTHREADS)
			y[(size_t)(i / wr) * rows + r0 + i % wr] = NAN;
		return;
	}
	bool vec = cols % 16 == 0 && (uintptr_t)w % 16 == 0;
	if constexpr (RS)
		fp8w_tile_rs<FILL_EITHER>((uint8_t *)moe_smem, srow, y, n_out, xb, nsrc,
					  (const uint8_t *)w, ws, r0, rows, cols, vec);
	else
		fp8w_tile<FILL_EITHER>((uint8_t *)moe_smem, srow, y, n_out, xb, nsrc,
				       (const uint8_t *)w, ws, r0, rows, cols, vec);
}

/* gate (blockIdx.z 0, into h / hs) or up (1, into u / us) = x[tok[g]] . w^T for tile
 * blockIdx.x's slots g and weight rows [128 blockIdx.y, +128): the token rows gathered
 * from the split x through tok[]. */
template <bool RS>
__global__ void __launch_bounds__(FTHREADS, 1)
	k_moe_gemm_gate_up(struct moe_plan p, struct moe_args a)
{
	__shared__ int srow[FM];
	struct moe_tile t;
	if (!tile_at(p, a, (int)blockIdx.x, &t))
		return;
	bool up = blockIdx.z != 0, sh = t.e < 0;
	int rows = sh ? a.sh_inter : a.inter, r0 = (int)blockIdx.y * FN;
	if (r0 >= rows)
		return;
	for (int i = (int)threadIdx.x; i < FM; i += FTHREADS)
		srow[i] = t.g0 + i < t.g1 ? (sh ? t.g0 + i : p.tok[t.g0 + i]) : -1;
	__syncthreads();
	float *y = sh ? (up ? p.us : p.hs) : (up ? p.u : p.h);
	const void *w; /* the parameter a.sh by value: its address would put a on the stack */
	const float *ws;
	if (sh) {
		w = up ? a.sh.up : a.sh.gate;
		ws = up ? a.sh.up_s : a.sh.gate_s;
	} else {
		const struct cpu_expert *ex = &a.experts[t.e];
		w = up ? ex->up : ex->gate;
		ws = up ? ex->up_s : ex->gate_s;
	}
	gemm_tile<RS>(srow, y + (size_t)t.g0 * rows, t.g1 - t.g0, p.xb, a.n, w, ws, r0, rows,
		      a.dim);
}

/* hb / hsb = the bf16 halves of silu(gate) * up (as k_moe_gate_up's epilogue), per grouped
 * slot in use and per token for the shared expert, zeros past inter. Grid-stride. */
__global__ void k_moe_silu_split(struct moe_plan p, struct moe_args a)
{
	size_t ns = (size_t)a.n * a.top_k, nr = (size_t)*p.n_slots * WK_CUDA_SPLIT_COLS(a.inter);
	size_t nsh = a.sh_inter > 0 ? (size_t)a.n * WK_CUDA_SPLIT_COLS(a.sh_inter) : 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nr + nsh;
	     i += (size_t)gridDim.x * blockDim.x) {
		bool sh = i >= nr;
		size_t k = sh ? i - nr : i;
		int w = sh ? a.sh_inter : a.inter, wp = WK_CUDA_SPLIT_COLS(w);
		size_t g = k / (size_t)wp, half = (sh ? (size_t)a.n : ns) * wp;
		int c = (int)(k % (size_t)wp);
		float v = 0.0f;
		if (c < w) {
			size_t at = g * w + c;
			float gs = sh ? p.hs[at] : p.h[at], us = sh ? p.us[at] : p.u[at];
			v = gs / (1.0f + expf(-gs)) * us;
		}
		uint16_t *hb = sh ? p.hsb : p.hb;
		uint32_t hi, lo;
		bf16_split(v, &hi, &lo);
		hb[k] = (uint16_t)hi;
		hb[half + k] = (uint16_t)lo;
	}
}

/* z / zs = h[g] . down^T for tile blockIdx.x's slots g (its own rows of hb / hsb) and dim
 * rows [128 blockIdx.y, +128). */
template <bool RS>
__global__ void __launch_bounds__(FTHREADS, 1)
	k_moe_gemm_down(struct moe_plan p, struct moe_args a)
{
	__shared__ int srow[FM];
	struct moe_tile t;
	int r0 = (int)blockIdx.y * FN;
	if (!tile_at(p, a, (int)blockIdx.x, &t) || r0 >= a.dim)
		return;
	bool sh = t.e < 0;
	for (int i = (int)threadIdx.x; i < FM; i += FTHREADS)
		srow[i] = t.g0 + i < t.g1 ? t.g0 + i : -1;
	__syncthreads();
	const void *w = sh ? a.sh.down : a.experts[t.e].down;
	const float *ws = sh ? a.sh.down_s : a.experts[t.e].down_s;
	float *y = (sh ? p.zs : p.z) + (size_t)t.g0 * a.dim;
	if (sh)
		gemm_tile<RS>(srow, y, t.g1 - t.g0, p.hsb, a.n, w, ws, r0, a.dim, a.sh_inter);
	else
		gemm_tile<RS>(srow, y, t.g1 - t.g0, p.hb, a.n * a.top_k, w, ws, r0, a.dim, a.inter);
}

/* ---- entry points ---------------------------------------------------------------------------- */

extern "C" size_t wk_cuda_moe_experts_scratch(int n, int top_k, const struct wk_moe *m)
{
	return m ? plan_layout(NULL, n > 0 ? n : 0, top_k > 0 ? top_k : 0, m, NULL) : 0;
}

static int after_plan(const struct moe_plan &p, float *y, const float *x, const float *wt,
		      int n, int top_k, const struct wk_moe *m, char *err, size_t errsz);

/* The checks both entry points make; *skip when there is nothing to do. */
static int experts_args(int n, int top_k, const struct wk_moe *m, const void *scratch,
			bool *skip, char *err, size_t errsz);

extern "C" int wk_cuda_moe_experts(float *y, const float *x, const int *idx, const float *wt,
				   int n, int top_k, const struct wk_moe *m, void *scratch,
				   char *err, size_t errsz)
{
	bool skip;
	int rc = experts_args(n, top_k, m, scratch, &skip, err, errsz);
	if (rc != WK_OK || skip)
		return rc;
	struct moe_plan p;
	plan_layout((char *)scratch, n, top_k, m, &p);
	k_moe_plan<<<1, PLAN_THREADS, 0, wk_st()>>>(p, idx, n, top_k, m->ex0, m->n_local);
	if ((rc = launched("moe_experts plan", err, errsz)) != WK_OK)
		return rc;
	return after_plan(p, y, x, wt, n, top_k, m, err, errsz);
}

extern "C" int wk_cuda_moe_route_experts(float *y, const float *x, const float *logits,
					 const float *bias, int n_experts, int n_group,
					 int topk_group, bool norm, float scale, int *idx, float *wt,
					 int n, int top_k, const struct wk_moe *m, void *scratch,
					 unsigned *count, char *err, size_t errsz)
{
	bool skip;
	int rc = wk_cuda_moe_route_check(n_experts, top_k, n_group, topk_group, err, errsz);
	if (rc == WK_OK)
		rc = experts_args(n, top_k, m, scratch, &skip, err, errsz);
	if (rc != WK_OK || skip)
		return rc;
	if (!count)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA moe_route_experts: no counter");
	struct moe_plan p;
	plan_layout((char *)scratch, n, top_k, m, &p);
	struct route_args r = {logits, bias, n_experts, n_group, topk_group, norm, scale, idx, wt,
			       count};
	k_moe_route_plan<<<n, ROUTE_THREADS, 0, wk_st()>>>(r, p, top_k, m->ex0, m->n_local);
	if ((rc = launched("moe_experts route and plan", err, errsz)) != WK_OK)
		return rc;
	return after_plan(p, y, x, wt, n, top_k, m, err, errsz);
}

static int experts_args(int n, int top_k, const struct wk_moe *m, const void *scratch,
			bool *skip, char *err, size_t errsz)
{
	*skip = false;
	if (!m)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA moe_experts: no layer");
	for (int k = 0; k < 2; k++) {
		enum dt_type wdt = k ? m->shared_wdt : m->wdt;
		if (k && !m->shared)
			break;
		if (wdt != DT_F32 && wdt != DT_BF16 && wdt != DT_F16 && wdt != DT_F8_E4M3)
			return wk_errf(err, errsz, WK_EINVAL,
				       "CUDA moe_experts: %s weights in %s (F32, BF16, F16 or "
				       "F8_E4M3 only)",
				       k ? "the shared expert's" : "expert", dt_name(wdt));
	}
	if (n < 0 || top_k < 0 || m->n_local < 0 || m->dim <= 0 || m->inter <= 0 ||
	    (m->shared && m->shared_inter <= 0) || (size_t)n * (size_t)top_k > INT_MAX)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA moe_experts: %d tokens, top %d, %d local experts, dim %d, "
			       "inter %d, shared expert's inter %d",
			       n, top_k, m->n_local, m->dim, m->inter,
			       m->shared ? m->shared_inter : 0);
	if (n == 0 || (!m->shared && (top_k == 0 || m->n_local == 0))) {
		*skip = true; /* no slot is local and no shared expert: y stays as it is */
		return WK_OK;
	}
	if ((m->n_local > 0 && !m->experts) || !scratch)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA moe_experts: no %s",
			       scratch ? "expert table" : "scratch");
	return WK_OK;
}

/* grouped_gemms' gate/up GEMM, SiLU split and down GEMM, on fp8w_tile or (RS)
 * fp8w_tile_rs (wk_cuda_fp8w_mode's WK_FP8W_RS). */
template <bool RS>
static int grouped_launches(const struct moe_plan &p, const struct moe_args &a, size_t tiles,
			    int wide, size_t ns, char *err, size_t errsz)
{
	int smem = RS ? FSMEM_RS : FSMEM, rc;
	cudaError_t e = cudaFuncSetAttribute((k_moe_gemm_gate_up<RS>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	if (e == cudaSuccess)
		e = cudaFuncSetAttribute((k_moe_gemm_down<RS>),
					 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	if (e != cudaSuccess)
		return check(e, "moe_experts GEMM shared memory", err, errsz);
	dim3 gu((unsigned)tiles, blocks((size_t)wide, FN), 2);
	k_moe_gemm_gate_up<RS><<<gu, FTHREADS, smem, wk_st()>>>(p, a);
	if ((rc = launched("moe_experts gate/up GEMM", err, errsz)) != WK_OK)
		return rc;
	size_t elems = ns * WK_CUDA_SPLIT_COLS(a.inter) +
		       (a.sh_inter > 0 ? (size_t)a.n * WK_CUDA_SPLIT_COLS(a.sh_inter) : 0);
	unsigned sb = blocks(elems, 256);
	k_moe_silu_split<<<sb < 8192 ? sb : 8192, 256, 0, wk_st()>>>(p, a);
	if ((rc = launched("moe_experts SiLU split", err, errsz)) != WK_OK)
		return rc;
	dim3 dn((unsigned)tiles, blocks((size_t)a.dim, FN));
	k_moe_gemm_down<RS><<<dn, FTHREADS, smem, wk_st()>>>(p, a);
	return launched("moe_experts down GEMM", err, errsz);
}

/* The experts' launches once the plan is in the scratch: gate/up, down with the combine (or
 * down, then the combine). */
static int grouped_gemms(const struct moe_plan &p, const struct moe_args &a, char *err,
			 size_t errsz);

/* wk_cuda_moe_rows_v0: the warp-per-row decode path (the first version: the lab's baseline) */
static bool moe_rows_v0;

extern "C" void wk_cuda_moe_rows_v0(int on)
{
	moe_rows_v0 = on != 0;
}

/* What 2 and 3 read, and (below the grouped GEMMs) their grids. */
static struct moe_args make_args(float *y, const float *x, const float *wt, int n, int top_k,
				 const struct wk_moe *m)
{
	struct moe_args a = {};
	a.x = x;
	a.wt = wt;
	a.y = y;
	a.experts = m->experts;
	a.wdt = m->wdt;
	if (m->shared) {
		a.sh = *m->shared;
		a.sh_wdt = m->shared_wdt;
		a.sh_inter = m->shared_inter;
	}
	a.n = n;
	a.top_k = top_k;
	a.dim = m->dim;
	a.inter = m->inter;
	a.n_local = m->n_local;
	a.combine = !m->split_combine;
	a.wr = moe_rows_v0 ? 1 : MOE_R;
	return a;
}

static void moe_grids(const struct moe_args &a, dim3 *gu, dim3 *dn)
{
	/* the most groups the plan can find active (and the shared expert's); blocks beyond
	 * loop, above MAX_GRID_Y */
	int nslots = a.n * a.top_k;
	int most = (a.n_local < nslots ? a.n_local : nslots) + (a.sh_inter > 0);
	int wide = a.sh_inter > a.inter ? a.sh_inter : a.inter;
	unsigned ey = (unsigned)(most < MAX_GRID_Y ? most : MAX_GRID_Y);
	*gu = dim3(blocks((size_t)wide, (unsigned)(MOE_ROWS * a.wr)), ey);
	*dn = dim3(blocks((size_t)a.dim, (unsigned)(MOE_ROWS * a.wr)), ey);
}

static int after_plan(const struct moe_plan &p, float *y, const float *x, const float *wt,
		      int n, int top_k, const struct wk_moe *m, char *err, size_t errsz)
{
	int rc;
	struct moe_args a = make_args(y, x, wt, n, top_k, m);
	if (use_gemm(n, m))
		return grouped_gemms(p, a, err, errsz);
	dim3 gu, dn;
	moe_grids(a, &gu, &dn);
	k_moe_gate_up<<<gu, MOE_THREADS, 0, wk_st()>>>(p, a);
	if ((rc = launched("moe_experts gate/up", err, errsz)) != WK_OK)
		return rc;
	k_moe_down<<<dn, MOE_THREADS, 0, wk_st()>>>(p, a);
	rc = launched(a.combine ? "moe_experts down and combine" : "moe_experts down", err, errsz);
	if (rc != WK_OK || a.combine)
		return rc;
	k_moe_combine<<<n, MOE_THREADS, 0, wk_st()>>>(p, a);
	return launched("moe_experts combine", err, errsz);
}

/* use_gemm's launches once the plan is in the scratch: the split of x, gate and up (grid z),
 * SiLU(gate) * up split, down, then the combine (the split_combine launch, whatever
 * a.combine says: the GEMMs' blocks do not count tokens). The grids are what the plan could
 * find: sum over experts of ceil(count / 128) tiles is below (n * top_k + 127 A) / 128 + 1
 * for A = min(n_local, n * top_k) active experts, plus the shared expert's ceil(n / 128). */
static int grouped_gemms(const struct moe_plan &p, const struct moe_args &a, char *err,
			 size_t errsz)
{
	size_t ns = (size_t)a.n * (size_t)a.top_k, na = (size_t)a.n_local < ns ? a.n_local : ns;
	size_t tiles = (ns + (FM - 1) * na + FM - 1) / FM + (a.sh_inter > 0 ? blocks(a.n, FM) : 0);
	int wide = a.sh_inter > a.inter ? a.sh_inter : a.inter, rc;
	if (tiles > INT_MAX || blocks((size_t)wide, FN) > MAX_GRID_Y ||
	    blocks((size_t)a.dim, FN) > MAX_GRID_Y)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA moe_experts: %d tokens, top %d, dim %d, inter %d: past the "
			       "grouped GEMM's grid",
			       a.n, a.top_k, a.dim, wide);
	if ((rc = wk_cuda_act_split(p.xb, a.x, a.n, a.dim, err, errsz)) != WK_OK)
		return rc;
	rc = (wk_cuda_fp8w_mode_now() & WK_FP8W_RS)
		     ? grouped_launches<true>(p, a, tiles, wide, ns, err, errsz)
		     : grouped_launches<false>(p, a, tiles, wide, ns, err, errsz);
	if (rc != WK_OK)
		return rc;
	k_moe_combine<<<a.n, MOE_THREADS, 0, wk_st()>>>(p, a);
	return launched("moe_experts combine", err, errsz);
}

/* ---- chained launches (wk_cuda_chain): here, where every op's device code is ----------------- */

/* One link as the kernel sees it: the set its own launch would run. */
struct chain_mm {
	struct mm_set s;
	const float *x;
};
struct chain_an {
	float *x, *y;
	const float *d, *w;
	int dim;
	float eps;
};
/* a MoE op's three parts (route and plan, gate/up, down with the combine); gx, gy: the grid
 * of its own gate/up or down launch, whose blocks b = bx + gx * by become the link's */
struct chain_moe {
	struct route_args r;
	struct moe_plan p;
	struct moe_args a;
	int top_k, ex0, n_local, gx, gy;
};
enum { CH_MATMUL, CH_ADD_RMSNORM, CH_NORM, CH_ROUTE_PLAN, CH_GATE_UP, CH_DOWN, CH_CAST };
struct chain_link {
	int kind, n;
	union {
		struct chain_mm mm;
		struct chain_an an;
		struct norm_set nm;
		struct chain_moe moe;
		struct cast_set cs;
	};
};
struct chain_set {
	int count;
	int bstart[WK_CHAIN_MAX + 1]; /* the tickets of link k: [bstart[k], bstart[k + 1]) */
	struct chain_link l[WK_CHAIN_MAX];
};
static_assert(sizeof(struct chain_set) + sizeof(unsigned *) <= 4096,
	      "a chain's parameters must fit a launch's 4 KB");

/* sync[0]: the next ticket; sync[1 + k]: link k's finished blocks; sync[1 + WK_CHAIN_MAX]:
 * all finished blocks, the last of which zeroes them all for the next chain. The matmul links
 * run mm_mixed (any dtypes: GLM-5's indexer weights_proj and router are not FP8), so the
 * kernel takes k_matmul_mixed's register bound, not k_matmul's: ptxas gives 121 registers at
 * one token (2 blocks an SM, not 4; held to 64 it spills), 255 at 8. Whether the launches it
 * saves outweigh that is for a GPU to measure (scripts/gpu-check). */
template <int NT>
__global__ void __launch_bounds__(MM_THREADS, 1) k_chain(struct chain_set c, unsigned *sync)
{
	__shared__ float red[MM_THREADS];
	__shared__ int s_ticket;
	if (threadIdx.x == 0)
		s_ticket = (int)atomicAdd(&sync[0], 1u);
	__syncthreads();
	int t = s_ticket, k = set_part(c.bstart, t);
	int b = t - c.bstart[k];
	if (k > 0) { /* every block of link k - 1 has finished (and so, of every link before) */
		if (c.l[k].kind == CH_MATMUL) /* its first weights on their way meanwhile */
			mm_prefetch(c.l[k].mm.s, b);
		wait_blocks(sync + k, (unsigned)(c.bstart[k] - c.bstart[k - 1]));
	}
	const struct chain_link &l = c.l[k];
	const struct chain_moe &m = l.moe;
	switch (l.kind) {
	case CH_MATMUL:
		mm_mixed<NT, true>(l.mm.s, l.mm.x, l.n, b, red);
		break;
	case CH_ADD_RMSNORM: {
		size_t at = (size_t)b * l.an.dim;
		row_add_rmsnorm(l.an.x + at, l.an.d + at, l.an.y + at, l.an.w, l.an.dim, l.an.eps);
		break;
	}
	case CH_NORM:
		norm_row(l.nm, b);
		break;
	case CH_ROUTE_PLAN:
		route_plan_block(m.r, m.p, m.top_k, m.ex0, m.n_local, b, l.n);
		break;
	case CH_GATE_UP:
		gate_up_block(m.p, m.a, b % m.gx, b / m.gx, m.gy);
		break;
	case CH_CAST:
		cast_block(l.cs, b);
		break;
	default:
		down_block(m.p, m.a, b % m.gx, b / m.gx, m.gx, m.gy);
		break;
	}
	__syncthreads(); /* the block's writes are done */
	if (threadIdx.x == 0) {
		__threadfence(); /* release: they are visible before the count moves */
		atomicAdd(&sync[1 + k], 1u);
		if (atomicAdd(&sync[1 + WK_CHAIN_MAX], 1u) == (unsigned)c.bstart[c.count] - 1)
			for (int i = 0; i < WK_CHAIN_SYNC; i++) /* no block is left to read them */
				sync[i] = 0;
	}
}

/* Takes c's next link, filled by the caller, with nb blocks; nothing to do (nb 0): no
 * blocks, and no link waits on it. */
static void chain_add(struct chain_set *c, int nb)
{
	if (nb <= 0)
		return;
	c->bstart[c->count + 1] = c->bstart[c->count] + nb;
	c->count++;
}

extern "C" bool wk_cuda_chain_moe(int n, const struct wk_moe *m)
{
	return m && !use_gemm(n, m) && !m->split_combine;
}

/* A MoE op as wk_cuda_moe_route_experts runs it on its warp-per-row path, as three links
 * (none when it has nothing to do). */
static int chain_moe(struct chain_set *c, const struct wk_link *k, char *err, size_t errsz)
{
	bool skip;
	const struct wk_moe *m = &k->moe;
	int rc = wk_cuda_moe_route_check(k->n_experts, k->top_k, k->n_group, k->topk_group, err,
					 errsz);
	if (rc == WK_OK)
		rc = experts_args(k->n, k->top_k, m, k->scratch, &skip, err, errsz);
	if (rc != WK_OK || skip)
		return rc;
	if (!k->count || !wk_cuda_chain_moe(k->n, m))
		return wk_errf(err, errsz, WK_EINVAL, "CUDA chain: a MoE op of %d tokens %s", k->n,
			       k->count ? "takes the grouped GEMMs or a combine of its own, not a "
					  "chain's link" : "without its counter");
	struct chain_moe q = {};
	plan_layout((char *)k->scratch, k->n, k->top_k, m, &q.p);
	q.r = {k->logits, k->bias, k->n_experts, k->n_group, k->topk_group, k->norm_w, k->scale,
	       k->idx, k->wt, k->count};
	q.a = make_args(k->moe_y, k->moe_x, k->wt, k->n, k->top_k, m);
	q.top_k = k->top_k;
	q.ex0 = m->ex0;
	q.n_local = m->n_local;
	dim3 gu, dn;
	moe_grids(q.a, &gu, &dn);
	static const int kinds[WK_CHAIN_MOE_LINKS] = {CH_ROUTE_PLAN, CH_GATE_UP, CH_DOWN};
	for (int j = 0; j < WK_CHAIN_MOE_LINKS; j++) {
		struct chain_link *l = &c->l[c->count];
		dim3 g = j == 1 ? gu : dn;
		l->kind = kinds[j];
		l->n = k->n;
		l->moe = q;
		l->moe.gx = (int)g.x;
		l->moe.gy = (int)g.y;
		chain_add(c, j == 0 ? k->n : (int)(g.x * g.y));
	}
	return WK_OK;
}

extern "C" int wk_cuda_chain(const struct wk_link *l, int count, unsigned *sync, char *err,
			     size_t errsz)
{
	if (count < 1 || count > WK_CHAIN_MAX || !sync)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA chain: %d links (1..%d)%s", count,
			       WK_CHAIN_MAX, sync ? "" : ", no counters");
	struct chain_set c;
	memset(&c, 0, sizeof c);
	int nt = 0, rc, nk = 0;
	for (int i = 0; i < count; i++)
		nk += l[i].kind == WK_LINK_MOE ? WK_CHAIN_MOE_LINKS : 1;
	if (nk > WK_CHAIN_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA chain: %d links (a MoE op counts %d; "
			       "1..%d)", nk, WK_CHAIN_MOE_LINKS, WK_CHAIN_MAX);
	for (int i = 0; i < count; i++) {
		struct chain_link *q = &c.l[c.count];
		int nb = 0;
		q->n = l[i].n;
		if (l[i].kind == WK_LINK_MOE) {
			if ((rc = chain_moe(&c, &l[i], err, errsz)) != WK_OK)
				return rc;
			continue;
		}
		q->kind = l[i].kind == WK_LINK_MATMUL	  ? CH_MATMUL
			  : l[i].kind == WK_LINK_ADD_RMSNORM ? CH_ADD_RMSNORM
			  : l[i].kind == WK_LINK_CAST	  ? CH_CAST
							     : CH_NORM;
		if (l[i].kind == WK_LINK_MATMUL) {
			bool mixed;
			if ((rc = mm_check(l[i].mm, l[i].mm_count, err, errsz)) != WK_OK)
				return rc;
			if (nt && l[i].n > 0 && mm_nt(l[i].n) != nt)
				return wk_errf(err, errsz, WK_EINVAL, "CUDA chain: link %d's %d tokens "
					       "take another pass than the links before", i, l[i].n);
			if (l[i].n > 0)
				nt = mm_nt(l[i].n);
			mm_build(&q->mm.s, l[i].mm, l[i].mm_count, l[i].cols, &mixed);
			q->mm.x = l[i].x;
			nb = l[i].n > 0 ? q->mm.s.bstart[l[i].mm_count] : 0;
		} else if (l[i].kind == WK_LINK_ADD_RMSNORM) {
			q->an = {l[i].ax, l[i].ay, l[i].d, l[i].w, l[i].dim, l[i].eps};
			nb = l[i].n > 0 ? l[i].n : 0;
		} else if (l[i].kind == WK_LINK_NORM) {
			if ((rc = norm_build(&q->nm, l[i].norm, l[i].norm_count, err, errsz)) != WK_OK)
				return rc;
			nb = q->nm.start[l[i].norm_count];
		} else if (l[i].kind == WK_LINK_CAST) {
			rc = cast_build(&q->cs, l[i].cast, l[i].cast_count, err, errsz);
			if (rc != WK_OK)
				return rc;
			nb = q->cs.start[l[i].cast_count];
		} else {
			return wk_errf(err, errsz, WK_EINVAL, "CUDA chain: link %d of kind %d", i,
				       (int)l[i].kind);
		}
		chain_add(&c, nb);
	}
	if (c.count == 0)
		return WK_OK;
	unsigned b = (unsigned)c.bstart[c.count];
	switch (nt) {
	case 0:
	case 1: k_chain<1><<<b, MM_THREADS, 0, wk_st()>>>(c, sync); break;
	case 2: k_chain<2><<<b, MM_THREADS, 0, wk_st()>>>(c, sync); break;
	case 4: k_chain<4><<<b, MM_THREADS, 0, wk_st()>>>(c, sync); break;
	default: k_chain<MM_NT><<<b, MM_THREADS, 0, wk_st()>>>(c, sync); break;
	}
	return launched("chain", err, errsz);
}
