/*
 * fp8w_tile.cuh - the tile machinery of gemm_fp8w.cu's f32-activation GEMM (FP8 e4m3
 * weights, f32 activations split into bf16 hi + lo, bf16 wgmma, per-128-block weight-scale
 * promotion; the scheme is described at the top of gemm_fp8w.cu), shared by the dense GEMM
 * there and the grouped MoE GEMMs of moe_kernels.cu. A tile's 128 token rows are named by an
 * index array in shared memory (srow), so the same pipeline serves a dense row range and a
 * gather through a MoE plan's tok[]. Not for use outside kernels/cuda/.
 */
#ifndef WICK_FP8W_TILE_CUH
#define WICK_FP8W_TILE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

#define FM 128                    /* tokens per block tile: two warpgroups of 64 */
#define FN 128                    /* weight rows per block tile: one scale block */
#define FK 64                     /* columns per stage: 64 bf16, one 128-byte swizzle row */
#define FSTAGES 4                 /* the ring's depth */
#define FTHREADS 256              /* two warpgroups */
#define FXT (FM * FK * 2)         /* bytes of one half's token tile: 16 KiB */
#define FWR (FN * FK)             /* bytes of the weight tile's codes: 8 KiB */
#define FSTAGE (2 * FXT + FWR)    /* a stage: hi tokens, lo tokens, weight codes */
#define FWB (FN * FK * 2)         /* the weight tile as bf16: 16 KiB, two of them */
#define FSMEM (FSTAGES * FSTAGE + 2 * FWB + 1024) /* + room to align to 1024 bytes */

static_assert(2 * FK == 128 && FN == FP8_BLOCK && 2 * FK == FP8_BLOCK,
	      "a bf16 stage is one swizzle row; two stages a scale block");
static_assert(FSTAGE % 1024 == 0 && FXT % 1024 == 0 && FWB % 1024 == 0,
	      "the swizzled tiles stay 1024-aligned");
static_assert(FSTAGES >= 3, "stage j + 1 lands while stage j is multiplied");
static_assert((2 * FXT + FWR) / 16 == 10 * FTHREADS, "each thread fills 10 chunks a stage");
static_assert(FWB / 16 == 4 * FTHREADS, "each thread converts 4 chunks a stage");
static_assert(WK_CUDA_SPLIT_COLS(1) == FK, "the split pads rows to a stage");

/* Fills stage st with columns [k0, k0 + 64): the hi and lo halves of the tile's 128 token
 * rows, row i being xb's row srow[i] of nsrc ([2][nsrc][colsp]; zeros for srow[i] < 0: the
 * gather of moe_kernels.cu's grouped GEMM, or m0 + i for a dense one), swizzled, and the
 * codes of weight rows [r0, r0 + 128) of w [rows][cols] (plain, 64 bytes a row WS bytes
 * apart; zeros outside). FILL: FILL_ASYNC (cols % 16 == 0 and w 16-byte aligned) all by cp.async;
 * FILL_BYTES the weight codes by ordinary loads; FILL_EITHER decides by vec at run time
 * (block-uniform), one pipeline for both (the grouped GEMMs, whose weights the host cannot
 * see). */
enum fp8w_fill { FILL_BYTES, FILL_ASYNC, FILL_EITHER };
template <int FILL, int WS = FK>
__device__ __forceinline__ void fill_stage(uint8_t *st, const uint16_t *xb, const int *srow,
					   int nsrc, const uint8_t *w, int colsp, int r0, int rows,
					   int k0, int cols, bool vec)
{
#pragma unroll
	for (int h = 0; h < 10; h++) {
		int c = (int)threadIdx.x + h * FTHREADS;
		if (c < 2 * FXT / 16) { /* a token chunk: half c / 1024, row, 8 bf16 */
			int half = c >> 10, row = (c >> 3) & 127, ch = c & 7, t = srow[row];
			bool in = t >= 0;
			const uint16_t *src = xb + ((size_t)half * nsrc + t) * colsp + k0 + ch * 8;
			cp_async16(st + half * FXT + wgmma_swz(row, ch * 16), in ? src : xb,
				   in ? 16 : 0);
		} else { /* a weight chunk: row, 16 codes */
			int cw = c - 2 * FXT / 16, row = cw >> 2, col = k0 + (cw & 3) * 16;
			int r = r0 + row;
			uint8_t *d = st + 2 * FXT + row * WS + (cw & 3) * 16;
			if (FILL == FILL_ASYNC || (FILL == FILL_EITHER && vec)) {
				bool in = r < rows && col < cols;
				cp_async16(d, in ? w + (size_t)r * cols + col : w, in ? 16 : 0);
			} else {
				copy16_bytes(d, w + (size_t)r * cols, r < rows, col, cols);
			}
		}
	}
}

/* The stage's weight codes wr [128][64] into wb, the bf16 tile in the swizzled layout: a
 * thread converts 4 chunks of 8 codes. */
__device__ __forceinline__ void convert_weights(uint8_t *wb, const uint8_t *wr)
{
#pragma unroll
	for (int h = 0; h < 4; h++) {
		int c = (int)threadIdx.x + h * FTHREADS, row = c >> 3, ch = c & 7;
		const uint32_t *s = (const uint32_t *)(wr + row * FK + ch * 8);
		uint32_t v[2] = {s[0], s[1]}, o[4];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			uint32_t b = v[j >> 1] >> (16 * (j & 1));
			o[j] = e4m3_bf16(b & 0xffu) | e4m3_bf16((b >> 8) & 0xffu) << 16;
		}
		*(uint4 *)(wb + wgmma_swz(row, ch * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

/* Issues stage st's eight wgmmas (four k16 slices, hi then lo tokens, the same bf16 weight
 * slice) for warpgroup wg's 64 tokens into part, fresh when first (a scale block's first
 * stage), and commits them. */
__device__ __forceinline__ void stage_issue(float (&part)[64], uint32_t st, uint32_t wbt, int wg,
					    bool first)
{
	uint32_t a = st + wg * 64 * 128;
	wgmma_fence();
#pragma unroll
	for (int ks = 0; ks < FK / 16; ks++) {
		uint64_t db = wgmma_desc_sw128(wbt + ks * 32, 1024);
		wgmma_m64n128k16_bf16(part, wgmma_desc_sw128(a + ks * 32, 1024), db, !first || ks > 0);
		wgmma_m64n128k16_bf16(part, wgmma_desc_sw128(a + FXT + ks * 32, 1024), db, 1);
	}
	wgmma_commit();
}

/* The ring's first NS - 1 stages (of SS bytes, code rows WS apart), each its own cp.async
 * group, committed whether or not the stage exists (the waits count groups). */
template <int FILL, int WS, int NS, int SS>
__device__ __forceinline__ void fill_first(uint8_t *ring, const uint16_t *xb, const int *srow,
					   int nsrc, const uint8_t *w, int colsp, int r0,
					   int rows, int cols, int stages, bool vec)
{
#pragma unroll
	for (int s = 0; s < NS - 1; s++) {
		if (s < stages)
			fill_stage<FILL, WS>(ring + s * SS, xb, srow, nsrc, w, colsp, r0, rows,
					     s * FK, cols, vec);
		cp_async_commit();
	}
}

/* After stage j's wgmmas are retired: on a scale block's last stage (the second, or the
 * last of all), acc += part * the weight block's scale. */
__device__ __forceinline__ void promote(float (&acc)[64], float (&part)[64], const float *ws,
					int r0, int kbs, int j, int stages)
{
	if ((j & 1) || j == stages - 1) {
		float sw = ws[(size_t)(r0 / FN) * kbs + j / 2];
#pragma unroll
		for (int i = 0; i < 64; i++) {
			wgmma_reg_fence(part[i]);
			acc[i] += part[i] * sw;
		}
	}
}

/* One block's tile, the whole block (FTHREADS) from the kernel's top: y [n_out][rows] (the
 * tile's first token row; rows i >= n_out not stored) gets weight rows [r0, r0 + 128) of w
 * [rows][cols] (block scales ws [ceil(rows/128)][ceil(cols/128)]) times the token rows srow
 * (FM entries in shared memory, written and fenced by a barrier before the call) of xb
 * [2][nsrc][colsp]. raw: the dynamic shared memory, FSMEM bytes. FILL, vec: fill_stage's.
 * Stage j's pipeline: its wgmmas read slot j % FSTAGES and bf16 weight tile wb[j % 2]; while
 * they run, the block waits for stage j + 1's copies, starts stage j + FSTAGES - 1's into
 * the slot stage j - 1 used, and converts stage j + 1's codes into wb[(j + 1) % 2] (both
 * freed by stage j - 1's wgmmas, retired before the barrier that opens stage j's copies
 * wait); then waits for its own wgmmas, promotes after a scale block's second stage (or the
 * last), and a barrier makes wb[(j + 1) % 2] whole before stage j + 1 is issued. */
template <int FILL>
__device__ __forceinline__ void fp8w_tile(uint8_t *raw, const int *srow, float *y, int n_out,
					  const uint16_t *xb, int nsrc, const uint8_t *w,
					  const float *ws, int r0, int rows, int cols, bool vec)
{
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	uint8_t *wb = ring + FSTAGES * FSTAGE; /* two bf16 weight tiles */
	int tid = (int)threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
	int colsp = WK_CUDA_SPLIT_COLS(cols), stages = colsp / FK, kbs = (cols + 127) / 128;

	float acc[64], part[64];
#pragma unroll
	for (int i = 0; i < 64; i++)
		acc[i] = 0.0f;

	fill_first<FILL, FK, FSTAGES, FSTAGE>(ring, xb, srow, nsrc, w, colsp, r0, rows, cols,
					      stages, vec);
	if (stages > 0) { /* stage 0's codes into wb[0] */
		cp_async_wait<FSTAGES - 2>();
		__syncthreads();
		convert_weights(wb, ring + 2 * FXT);
		fence_proxy_async(); /* stage 0's token tiles and wb[0], for the tensor cores */
		__syncthreads();
	}
	for (int j = 0; j < stages; j++) {
		stage_issue(part, smem_u32(ring + (j % FSTAGES) * FSTAGE), smem_u32(wb + (j & 1) * FWB),
			    wg, (j & 1) == 0);
		cp_async_wait<FSTAGES - 3>(); /* this thread's copies of stage j + 1 have landed */
		__syncthreads(); /* everyone's; stage j - 1's slot and wb[(j + 1) % 2] are free */
		if (j + FSTAGES - 1 < stages)
			fill_stage<FILL>(ring + ((j + FSTAGES - 1) % FSTAGES) * FSTAGE, xb, srow,
					 nsrc, w, colsp, r0, rows, (j + FSTAGES - 1) * FK, cols, vec);
		cp_async_commit();
		if (j + 1 < stages)
			convert_weights(wb + ((j + 1) & 1) * FWB,
					ring + ((j + 1) % FSTAGES) * FSTAGE + 2 * FXT);
		fence_proxy_async(); /* stage j + 1's token tiles and weight tile */
		wgmma_wait<0>();
		promote(acc, part, ws, r0, kbs, j, stages);
		__syncthreads(); /* wb[(j + 1) % 2] whole before stage j + 1 is issued */
	}
	wgmma_store_tile(y, acc, wg * 64 + warp * 16 + (lane >> 2), r0, lane & 3, n_out, rows);
}

/* ---- the same tile with the weights as the register operand (the "RS" form) --------------
 *
 * fp8w_tile_rs has fp8w_tile's contract and fill, but the weights are wgmma's A operand
 * from registers and the tokens its B operand from shared memory: warpgroup h computes
 * weight rows 64 h .. + 63 of the tile for all 128 tokens (D is y's tile transposed). Each
 * thread loads its own A fragment's e4m3 codes from the stage (16 two-byte loads a stage;
 * code rows FWS = 80 bytes apart, so a warp's loads fall in 16 different banks) and widens
 * them to bf16 in registers (exact, as convert_weights), so there is no bf16 weight tile in
 * shared memory: no conversion pass through it, nothing of it for the tensor cores to read
 * (they read the two token tiles only), and one barrier a stage instead of two. The next
 * stage's fragments are built while this stage's wgmmas run, into a second set of
 * registers, and move over after the wait that retires them (the wgmma may read its A
 * registers until then). The 32 KiB of the bf16 tiles go to a fifth stage. The Marlin /
 * Machete layout for mixed-input GEMMs on Hopper; written without a GPU: the lab's "fp8w rs"
 * row says whether it beats fp8w_tile. */
extern "C" int wk_cuda_fp8w_mode_now(void); /* wk_cuda_fp8w_mode's setting (gemm_fp8w.cu) */

#define FWS 80                              /* bytes between code rows in a stage */
#define FSTAGES_RS 5
#define FSTAGE_RS (2 * FXT + FN * FWS)      /* 42 KiB */
#define FSMEM_RS (FSTAGES_RS * FSTAGE_RS + 1024)

static_assert(FSTAGE_RS % 1024 == 0, "the swizzled token tiles stay 1024-aligned");
static_assert(FSMEM_RS <= 227 * 1024, "the ring fits the opt-in shared memory");

/* Two e4m3 codes (the lower byte first) as two bf16 (the lower half first), exactly. */
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v)
{
#ifdef WICK_SIMT
	return e4m3_bf16(v & 0xffu) | e4m3_bf16((v >> 8) & 0xffu) << 16;
#else
	__half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
	float2 f = __half22float2(__half2(h));
	return bf16_rn(f.x) | bf16_rn(f.y) << 16;
#endif
}

/* This thread's A fragments for a stage's four k16 slices (wgmma_m64n128k16_bf16_rs's
 * layout) from its codes wr [128][FWS]: rows 64 wg + 16 warp + g (+ 8), columns 16 ks + 2 q
 * (+ 1) and + 8 (+ 9). */
__device__ __forceinline__ void rs_fragments(uint32_t (&a)[4][4], const uint8_t *wr, int wg,
					     int warp, int lane)
{
	const uint8_t *p = wr + (64 * wg + 16 * warp + (lane >> 2)) * FWS + 2 * (lane & 3);
#pragma unroll
	for (int ks = 0; ks < FK / 16; ks++) {
		const uint8_t *c = p + 16 * ks;
		a[ks][0] = e4m3x2_bf16x2(*(const uint16_t *)c);
		a[ks][1] = e4m3x2_bf16x2(*(const uint16_t *)(c + 8 * FWS));
		a[ks][2] = e4m3x2_bf16x2(*(const uint16_t *)(c + 8));
		a[ks][3] = e4m3x2_bf16x2(*(const uint16_t *)(c + 8 * FWS + 8));
	}
}

/* The stage's eight wgmmas (four k16 slices, hi then lo tokens, the same A registers) for
 * warpgroup wg's 64 weight rows into part, fresh when first; committed. */
__device__ __forceinline__ void rs_issue(float (&part)[64], const uint32_t (&a)[4][4],
					 uint32_t st, bool first)
{
	wgmma_fence();
#pragma unroll
	for (int ks = 0; ks < FK / 16; ks++) {
		wgmma_m64n128k16_bf16_rs(part, a[ks], wgmma_desc_sw128(st + ks * 32, 1024),
					 !first || ks > 0);
		wgmma_m64n128k16_bf16_rs(part, a[ks], wgmma_desc_sw128(st + FXT + ks * 32, 1024), 1);
	}
	wgmma_commit();
}

/* fp8w_tile's contract (see there); stage j: issue its wgmmas from a[] (built from its
 * codes), wait for stage j + 1's copies (a proxy fence, then the stage's one barrier: every
 * thread's copies in, and stage j - 1's slot free, its wgmmas retired by each warpgroup
 * before the barrier), start stage j + FSTAGES_RS - 1's copies into that slot, build stage
 * j + 1's fragments into an[], wait for this stage's wgmmas, promote after a scale block's
 * second stage (or the last), and move an[] into a[]. */
template <int FILL>
__device__ __forceinline__ void fp8w_tile_rs(uint8_t *raw, const int *srow, float *y, int n_out,
					     const uint16_t *xb, int nsrc, const uint8_t *w,
					     const float *ws, int r0, int rows, int cols, bool vec)
{
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	int tid = (int)threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
	int colsp = WK_CUDA_SPLIT_COLS(cols), stages = colsp / FK, kbs = (cols + 127) / 128;

	float acc[64], part[64];
#pragma unroll
	for (int i = 0; i < 64; i++)
		acc[i] = 0.0f;
	uint32_t a[4][4], an[4][4];

	fill_first<FILL, FWS, FSTAGES_RS, FSTAGE_RS>(ring, xb, srow, nsrc, w, colsp, r0, rows,
						     cols, stages, vec);
	if (stages > 0) {
		cp_async_wait<FSTAGES_RS - 2>(); /* stage 0 */
		fence_proxy_async();
		__syncthreads();
		rs_fragments(a, ring + 2 * FXT, wg, warp, lane);
	}
	for (int j = 0; j < stages; j++) {
		rs_issue(part, a, smem_u32(ring + (j % FSTAGES_RS) * FSTAGE_RS), (j & 1) == 0);
		cp_async_wait<FSTAGES_RS - 3>(); /* this thread's copies of stage j + 1 */
		fence_proxy_async();             /* its token tiles, for the tensor cores */
		__syncthreads(); /* everyone's; stage j - 1's slot is free */
		if (j + FSTAGES_RS - 1 < stages)
			fill_stage<FILL, FWS>(ring + ((j + FSTAGES_RS - 1) % FSTAGES_RS) * FSTAGE_RS,
					      xb, srow, nsrc, w, colsp, r0, rows,
					      (j + FSTAGES_RS - 1) * FK, cols, vec);
		cp_async_commit();
		if (j + 1 < stages)
			rs_fragments(an, ring + ((j + 1) % FSTAGES_RS) * FSTAGE_RS + 2 * FXT, wg,
				     warp, lane);
		wgmma_wait<0>();
#pragma unroll
		for (int ks = 0; ks < 4; ks++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				wgmma_reg_fence_u(a[ks][e]); /* live until the wgmmas are retired */
				if (j + 1 < stages)
					a[ks][e] = an[ks][e];
			}
		promote(acc, part, ws, r0, kbs, j, stages);
	}
	/* acc[i]: weight row 64 wg + 16 warp + g + 8 ((i / 2) % 2), token 8 (i / 4) + 2 q + i % 2 */
	int m = 64 * wg + 16 * warp + (lane >> 2), q = lane & 3;
#pragma unroll
	for (int i = 0; i < 64; i++) {
		int r = r0 + m + 8 * ((i >> 1) & 1), t = 8 * (i >> 2) + 2 * q + (i & 1);
		if (t < n_out && r < rows)
			y[(size_t)t * rows + r] = acc[i];
	}
}

#endif
