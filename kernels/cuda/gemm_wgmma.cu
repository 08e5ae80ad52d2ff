/*
 * gemm_wgmma.cu - FP8 e4m3 x e4m3 block-scaled GEMM for prefill on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a): wk_cuda_gemm_fp8_wgmma, the contract of wk_cuda_gemm_fp8 (gemm_fp8.cu,
 * mma.sync) and cpu_ref_gemm_fp8. Activations carry 1x128 scales (xs [n][ceil(cols/128)]),
 * weights 128x128 block scales (ws [ceil(rows/128)][ceil(cols/128)]); each 128-deep k block
 * is summed by the tensor cores into fresh f32 accumulators (wgmma's scale-d = 0 on its first
 * k slice) and promoted: multiplied by its two scales and added to the f32 total in ordinary
 * registers (DeepGEMM's scheme; on Hopper the tensor cores' FP8 sums keep fewer bits than f32,
 * and promotion bounds that to 128 products).
 *
 * Two kernels share the tiles, the layout and the promotion:
 *   - a block computes a 128 (tokens) x 128 (weight rows) tile of y with two consumer
 *     warpgroups; the weight rows [128 blockIdx.y, +128) are one weight-scale block;
 *   - k runs in stages of 128 columns, exactly one scale block, through a ring in shared
 *     memory; a stage holds the token tile then the weight tile, each 128 rows of 128 bytes
 *     in the K-major 128-byte-swizzled layout wgmma reads (wgmma.cuh): row r at 128 r, its
 *     16-byte chunk c at chunk c ^ (r % 8), atoms of 8 rows 1024-byte aligned;
 *   - consumer warpgroup h multiplies tokens 64 h .. +64 by all 128 weight rows: per stage
 *     four wgmma.m64n128k32 (k slices 32 bytes apart inside the swizzled rows), commit,
 *     wait, promote; 64 f32 partials and 64 f32 totals a thread.
 * k_gemm_wgmma_tma (cols % 16 == 0 and 16-byte aligned operands, the prefill case): a third
 * warpgroup is the producer, its thread 0 filling a 5-deep ring with the bulk tensor copy
 * engine (TMA: cp.async.bulk.tensor through 128-byte-swizzled CUtensorMaps made by
 * cuTensorMapEncodeTiled, got from the driver via cudaGetDriverEntryPointByVersion, so no
 * -lcuda), on "full"/"empty" mbarriers; the consumers run free of each other (no block
 * barrier in the loop) and release a slot before promoting. setmaxnreg moves registers from
 * the producer to the consumers. Out-of-bounds rows and columns arrive as zeros. The grid is
 * persistent (a block per multiprocessor, each looping over tiles), so the producer fills
 * the next tile's first stages while the consumers store the last one's outputs, and each
 * consumer issues k block kb's wgmmas before it promotes block kb - 1 (two sets of partials,
 * wgmma_wait<1>), so its promotion overlaps its own tensor-core work.
 * k_gemm_wgmma_tma<2> (wk_cuda_gemm_fp8_wgmma_mc2): the same on clusters of two CTAs, which
 * take two token tiles of one weight tile; each CTA's producer loads half of the weight tile
 * (64 rows) and multicasts it into both CTAs' rings, so the weight tiles cost half their L2
 * traffic (per 128-deep stage a CTA fetches 24 KiB instead of 32: at 1,000 TFLOPS the
 * one-CTA kernel would need about 7.8 TB/s from L2 across the GPU, this one 5.9). A slot is
 * refilled in both CTAs at once, so it is empty only when both CTAs' consumers have
 * released it: each consumer warp arrives on both CTAs' "empty" mbarriers (lane r on rank
 * r's: 16 arrivals a phase). The mbarriers are initialised before a cluster barrier (a
 * peer's copy or arrival may come at once), and the producer thread stays until every
 * slot's last stage has been released by both CTAs (a peer's arrival on an exited CTA's
 * shared memory is undefined). The grid is the clusters that fit at once
 * (cudaOccupancyMaxActiveClusters: a GPC's multiprocessors need not pair up).
 * k_gemm_wgmma (any other shape or alignment): the two warpgroups also fill a 4-deep ring
 * themselves, with 16-byte cp.async copies (zero-filled past the edges) or, when cols % 16
 * != 0 or an operand is misaligned, ordinary byte loads; those are generic-proxy writes, so
 * each thread fences them to the async proxy (fence.proxy.async) before the __syncthreads
 * after which wgmma reads them.
 * Padded tokens get scale 0 and padded outputs are not stored.
 *
 * k_gemm_wgmma_tma<MC, 160> (wk_cuda_gemm_fp8_wgmma_n160, _n160_mc2): the TMA kernels with
 * tiles of 160 weight rows (below, at tma_ring).
 *
 * k_gemm_wgmma_tma_st (wk_cuda_gemm_fp8_wgmma_st, the lab's "wgmma st"; below, at ST_BOX):
 * k_gemm_wgmma_tma<1, 128> with a TMA-store epilogue. The plain kernel stores each tile's
 * 128 x 128 f32 totals (64 KiB) from registers with no wgmma in flight, so the tensor cores
 * idle through every epilogue (at 4096 x 7168 x 2048 a tile is only 16 k blocks; 844 TFLOPS
 * there on an H200, 974 at 8192^3). Here each consumer warpgroup writes its 64 x 128 totals
 * into its own 32 KiB of shared memory (the 128-byte-swizzled layout of the output's tensor
 * map, lanes staggered so that the float2 stores are free of bank conflicts), and one of
 * its threads hands them to the copy engine (cp.async.bulk.tensor ... bulk_group): the
 * warpgroup goes on with its next tile at once, and waits for the copy to have read its
 * staging area (cp.async.bulk.wait_group.read) only before its next epilogue. The 5-stage
 * ring and the 64 KiB of staging take 230,480 of the 232,448 bytes a block may have.
 * rows % 4 != 0 or a misaligned y (no tensor map of y) falls back to the plain kernel.
 * Tested under the emulator only: no GPU has run it yet, so neither its speed nor our
 * reading of the store's swizzle and bulk-group semantics is confirmed.
 *
 * What is not here yet (issue 9's 1,000 TFLOPS): any tuning on a GPU (stages, tile shape,
 * register split, the L2 panel size), and a GPU's verdict on the TMA-store epilogue.
 * tests/tools/cuda_lab times the TMA kernels beside the mma.sync kernel and cuBLASLt when
 * scripts/gpu-check runs on one; the backend runs the one-CTA 128-row kernel until that run
 * says which is faster.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

#define WM 128                       /* tokens per block tile: two warpgroups of 64 */
#define WN 128                       /* weight rows per block tile: one scale block */
#define WK 128                       /* columns per stage: one scale block, one swizzle row */
#define WS_STAGES 4                  /* the ring's depth */
#define WTHREADS 256                 /* two warpgroups */
#define WTILE (WM * WK)              /* bytes of one operand's tile in a stage: 16 KiB */
#define WSTAGE (2 * WTILE)           /* one stage: the token tile, then the weight tile */
#define WSMEM (WS_STAGES * WSTAGE + 1024) /* + room to align the ring to 1024 bytes */

static_assert(WK == FP8_BLOCK && WN == FP8_BLOCK, "a stage is one scale block");
static_assert(2 * WTILE / 16 == 8 * WTHREADS, "each thread fills 8 chunks of 16 bytes a stage");

/* Fills stage st with columns [k0, k0 + 128) of the token rows [m0, m0 + 128) of xq [n][cols]
 * and the weight rows [r0, r0 + 128) of w [rows][cols], zero outside. VEC: cols % 16 == 0
 * and both 16-byte aligned: cp.async (lands at cp_async_wait); else ordinary stores. */
template <bool VEC>
__device__ __forceinline__ void fill_stage(uint8_t *st, const uint8_t *xq, const uint8_t *w,
					   int m0, int n, int r0, int rows, int k0, int cols)
{
#pragma unroll
	for (int h = 0; h < 8; h++) {
		int c = (int)threadIdx.x + h * WTHREADS; /* chunk: tile c / 1024, row, 16 bytes */
		int t = c >> 10, row = (c >> 3) & 127, ch = c & 7;
		const uint8_t *src = t ? w : xq;
		int r = (t ? r0 : m0) + row, nr = t ? rows : n, col = k0 + ch * 16;
		uint8_t *d = st + t * WTILE + wgmma_swz(row, ch * 16);
		if (VEC) {
			bool in = r < nr && col < cols;
			cp_async16(d, in ? src + (size_t)r * cols + col : src, in ? 16 : 0);
		} else {
			copy16_bytes(d, src + (size_t)r * cols, r < nr, col, cols);
		}
	}
}

template <bool VEC>
__global__ void __launch_bounds__(WTHREADS, 1)
	k_gemm_wgmma(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		     const float *ws, int n, int rows, int cols)
{
	extern __shared__ uint4 wgmma_smem[];
	/* the ring, 1024-byte aligned in the shared window (the swizzle atoms' alignment) */
	uint8_t *raw = (uint8_t *)wgmma_smem;
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	int tid = (int)threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
	int g = lane >> 2, q = lane & 3;
	int m0 = (int)blockIdx.x * WM, r0 = (int)blockIdx.y * WN;
	int kbs = (cols + WK - 1) / WK;

	float acc[64], part[64];
#pragma unroll
	for (int i = 0; i < 64; i++)
		acc[i] = 0.0f;

#pragma unroll
	for (int s = 0; s < WS_STAGES - 1; s++) {
		if (s < kbs)
			fill_stage<VEC>(ring + s * WSTAGE, xq, w, m0, n, r0, rows, s * WK, cols);
		cp_async_commit();
	}
	int t0 = m0 + wg * 64 + warp * 16 + g; /* this thread's tokens: t0 and t0 + 8 */
	for (int kb = 0; kb < kbs; kb++) {
		cp_async_wait<WS_STAGES - 2>(); /* this thread's copies of stage kb have landed */
		fence_proxy_async();            /* ... visible to the tensor cores */
		__syncthreads();                /* everyone's; and stage kb - 1 is read by all */
		if (kb + WS_STAGES - 1 < kbs)
			fill_stage<VEC>(ring + ((kb + WS_STAGES - 1) % WS_STAGES) * WSTAGE, xq, w,
					m0, n, r0, rows, (kb + WS_STAGES - 1) * WK, cols);
		cp_async_commit();
		float sw = ws[(size_t)blockIdx.y * kbs + kb];
		float s0 = t0 < n ? xs[(size_t)t0 * kbs + kb] * sw : 0.0f;
		float s1 = t0 + 8 < n ? xs[(size_t)(t0 + 8) * kbs + kb] * sw : 0.0f;

		uint32_t a = smem_u32(ring + (kb % WS_STAGES) * WSTAGE) + wg * 64 * 128;
		uint32_t b = smem_u32(ring + (kb % WS_STAGES) * WSTAGE + WTILE);
		wgmma_fence();
#pragma unroll
		for (int ks = 0; ks < WK / 32; ks++)
			wgmma_m64n128k32_e4m3(part, wgmma_desc_sw128(a + ks * 32, 1024),
					      wgmma_desc_sw128(b + ks * 32, 1024), ks > 0);
		wgmma_commit();
		wgmma_wait<0>();
#pragma unroll
		for (int i = 0; i < 64; i++) {
			wgmma_reg_fence(part[i]);
			acc[i] += part[i] * ((i & 2) ? s1 : s0);
		}
	}

	wgmma_store_tile(y, acc, t0, r0, q, n, rows);
}

/* ---- the TMA version: a producer warpgroup, two consumer warpgroups, mbarriers ----------
 *
 * The same stages, layout and promotion as k_gemm_wgmma, but the ring (tma_ring) is filled
 * by the bulk tensor copy engine: thread 0 of warpgroup 0 (the producer; the warpgroup gives
 * its registers back with setmaxnreg) waits for a slot to be empty, expects the stage's bytes
 * on the slot's "full" mbarrier and starts two box copies, 128 token rows and BN weight
 * rows of 128 bytes (tx, tw: 128-byte-swizzled tensor maps; out-of-bounds rows and columns
 * arrive as zeros). Warpgroups 1 and 2 (the consumers, 64 tokens each) wait for "full" and
 * issue their four wgmmas; once the group has retired they arrive on the slot's "empty"
 * mbarrier (all 256 consumer threads) and promote while the producer refills it: no
 * __syncthreads in the loop, so the two consumers run free of each other. Persistent:
 * block b takes tiles b, b + gridDim.x, ... (tile t's token and weight tiles from
 * tma_tile_coords: panels of token tiles whose activations fill about a quarter of L2, a
 * panel's token tiles next to each other for each weight tile in turn), and both sides count
 * k blocks over all their tiles (it), which is what keeps the ring's slots and mbarrier
 * phases in step. Needs cols % 16 == 0 and 16-byte aligned
 * operands (the tensor maps' stride and address rules); the launcher falls back to
 * k_gemm_wgmma otherwise.
 * BN = 160 (wk_cuda_gemm_fp8_wgmma_n160, DeepGEMM's kind of tile for 1 x 128 / 128 x 128
 * scales): a weight tile of 160 rows spans two weight-scale blocks (its rows from
 * 160 t % 128 on in the first), so each 8-row group of the accumulators is promoted with
 * its block's scale. A stage feeds 10 % more products a byte than 128 rows' (128 + 160
 * bytes a k for 128 x 160 products, against 128 + 128 for 128 x 128), and 4,096 x 7,168 makes
 * 32 x 45 tiles (10.9 waves on 132 multiprocessors) rather than 32 x 56 (13.6). */
#define TTHREADS 384

/* A TMA kernel's ring for BN weight rows a tile: a stage is the token tile (WTILE bytes)
 * then the weight tile (BN rows of 128 bytes, 1024-byte aligned since BN % 8 == 0); as
 * deep as fits (BN 128: 5, as first written; 160: 6 of 36 KiB), then the "full" and
 * "empty" mbarriers. */
template <int BN> struct tma_ring {
	static constexpr int stage = WTILE + BN * WK;
	static constexpr int stages = BN == 128 ? 5 : 6;
	static constexpr int smem = stages * stage + 1024 + 2 * stages * 8;
	static_assert(smem <= 232448, "the ring fits in a block's 227 KiB of shared memory");
};

/* The scales of k block kb for a consumer thread's tokens t0 and t0 + 8 times the weight
 * blocks nb and nb + 1 (a tile of more than 128 rows spans two): s[h] = token h's times
 * nb's, s[2 + h] times nb + 1's (0 past n, past the sr weight blocks, and for the padding
 * block kb == kbs). */
template <int BN>
__device__ __forceinline__ void tma_block_scales(float s[4], const float *xs, const float *ws,
						 int t0, int n, int nb, int sr, int kbs, int kb)
{
	float sw0 = kb < kbs ? ws[(size_t)nb * kbs + kb] : 0.0f;
	float sw1 = BN > 128 && kb < kbs && nb + 1 < sr ? ws[(size_t)(nb + 1) * kbs + kb] : 0.0f;
	float x0 = t0 < n && kb < kbs ? xs[(size_t)t0 * kbs + kb] : 0.0f;
	float x1 = t0 + 8 < n && kb < kbs ? xs[(size_t)(t0 + 8) * kbs + kb] : 0.0f;
	s[0] = x0 * sw0;
	s[1] = x1 * sw0;
	s[2] = x0 * sw1;
	s[3] = x1 * sw1;
}

/* Waits for slot it % stages to be full, then issues and commits its four wgmmas into p
 * (fresh: scale-d 0 first), consumer warpgroup cw's 64 token rows by the BN weight rows. */
template <int BN>
__device__ __forceinline__ void tma_block_issue(float (&p)[BN / 2], uint32_t ring0,
						uint32_t full0, int it, int cw)
{
	typedef tma_ring<BN> R;
	int s = it % R::stages;
	mbar_wait(full0 + 8 * s, (unsigned)(it / R::stages) & 1);
	uint32_t a = ring0 + s * R::stage + cw * 64 * 128, b = ring0 + s * R::stage + WTILE;
	wgmma_fence();
#pragma unroll
	for (int ks = 0; ks < WK / 32; ks++)
		wgmma_e4m3<BN>(p, wgmma_desc_sw128(a + ks * 32, 1024),
			       wgmma_desc_sw128(b + ks * 32, 1024), ks > 0);
	wgmma_commit();
}

/* After a wgmma_wait that retired block it's group: frees its slot for the producer and
 * promotes p into acc, register i (row half h = (i / 2) % 2, 8-row group j = i / 4 of the
 * weight rows) with s[h] when j < jb (the groups of the tile's first scale block), else
 * s[2 + h]. One CTA (MC 1): every consumer thread arrives on the slot's "empty" mbarrier. A
 * cluster of MC: the slot is refilled in every CTA of the cluster at once (the weight tile
 * is multicast), so each consumer warp arrives on the "empty" mbarrier of every CTA, lane r
 * on rank r's (the wait before retired the whole warpgroup's wgmmas: wgmma.wait_group is
 * warp-synchronous). */
template <int MC, int BN>
__device__ __forceinline__ void tma_block_retire(float (&acc)[BN / 2], float (&p)[BN / 2],
						 const float s[4], int jb, uint32_t empty0, int it,
						 int lane)
{
	uint32_t e = empty0 + 8 * (it % tma_ring<BN>::stages);
	if (MC == 1)
		mbar_arrive(e);
	else
		mbar_arrive_cluster(smem_map_rank(e, (unsigned)(lane < MC ? lane : 0)), lane < MC);
#pragma unroll
	for (int i = 0; i < BN / 2; i++) {
		wgmma_reg_fence(p[i]);
		int h = (i >> 1) & 1;
		acc[i] += p[i] * (BN == 128 || (i >> 2) < jb ? s[h] : s[2 + h]);
	}
}

/* The consumers of a 128-row tile: two sets of partials, pa for even k blocks and pb for
 * odd ones; block kb's wgmmas are issued before block kb - 1 is promoted (wgmma_wait<1>), so
 * a warpgroup's promotion overlaps its own tensor-core work. kbe = kbs rounded up to even:
 * an odd kbs runs one more block, a copy of the last one (finite codes) with scales 0, so
 * that the loop has no branch around a wgmma (ptxas serializes wgmmas on divergent paths:
 * C7518, seen with such a branch). it: the ring's clock, advanced by kbe. */
/* Block 0 of a tile: its scales into sa and its wgmmas into pa (in flight). */
__device__ __forceinline__ void tma_tile_first(float (&pa)[64], float (&sa)[4], const float *xs,
					       const float *ws, int t0, int n, int nb, int sr,
					       int kbs, uint32_t ring0, uint32_t full0, int it,
					       int cw)
{
	tma_block_scales<128>(sa, xs, ws, t0, n, nb, sr, kbs, 0);
	tma_block_issue<128>(pa, ring0, full0, it, cw);
}

/* The rest of a tile whose block 0 is in flight in pa (tma_tile_first), into acc. */
template <int MC>
__device__ __forceinline__ void tma_tile_rest(float (&acc)[64], float (&pa)[64], float (&pb)[64],
					      float (&sa)[4], float (&sb)[4], const float *xs,
					      const float *ws, int t0, int n, int nb, int sr,
					      int kbs, uint32_t ring0, uint32_t full0,
					      uint32_t empty0, int &it, int cw, int lane)
{
	int kbe = kbs + (kbs & 1);
	for (int kb = 1; kb < kbe - 1; kb += 2, it += 2) {
		tma_block_scales<128>(sb, xs, ws, t0, n, nb, sr, kbs, kb);
		tma_block_issue<128>(pb, ring0, full0, it + 1, cw);
		wgmma_wait<1>();
		tma_block_retire<MC, 128>(acc, pa, sa, 16, empty0, it, lane);
		tma_block_scales<128>(sa, xs, ws, t0, n, nb, sr, kbs, kb + 1);
		tma_block_issue<128>(pa, ring0, full0, it + 2, cw);
		wgmma_wait<1>();
		tma_block_retire<MC, 128>(acc, pb, sb, 16, empty0, it + 1, lane);
	}
	tma_block_scales<128>(sb, xs, ws, t0, n, nb, sr, kbs, kbe - 1);
	tma_block_issue<128>(pb, ring0, full0, it + 1, cw);
	wgmma_wait<1>();
	tma_block_retire<MC, 128>(acc, pa, sa, 16, empty0, it, lane);
	wgmma_wait<0>();
	tma_block_retire<MC, 128>(acc, pb, sb, 16, empty0, it + 1, lane);
	it += 2;
}

template <int MC>
__device__ __forceinline__ void tma_tile_pipelined(float (&acc)[64], const float *xs,
						   const float *ws, int t0, int n, int nb, int sr,
						   int kbs, uint32_t ring0, uint32_t full0,
						   uint32_t empty0, int &it, int cw, int lane)
{
	float pa[64], pb[64];
	float sa[4], sb[4]; /* the scales of the blocks in pa and pb */
	tma_tile_first(pa, sa, xs, ws, t0, n, nb, sr, kbs, ring0, full0, it, cw);
	tma_tile_rest<MC>(acc, pa, pb, sa, sb, xs, ws, t0, n, nb, sr, kbs, ring0, full0, empty0,
			  it, cw, lane);
}

/* The consumers of a wider tile (BN 160: 80 partials and 80 totals a thread leave no room
 * for a second set): each block's wgmmas retired (wgmma_wait<0>) before its promotion; the
 * other consumer warpgroup's wgmmas keep the tensor cores busy meanwhile (DeepGEMM's
 * choice). it advances by kbs. */
template <int MC, int BN>
__device__ __forceinline__ void tma_tile_serial(float (&acc)[BN / 2], const float *xs,
						const float *ws, int t0, int n, int nb, int jb,
						int sr, int kbs, uint32_t ring0, uint32_t full0,
						uint32_t empty0, int &it, int cw, int lane)
{
	float p[BN / 2], s[4];
	for (int kb = 0; kb < kbs; kb++, it++) {
		tma_block_scales<BN>(s, xs, ws, t0, n, nb, sr, kbs, kb);
		tma_block_issue<BN>(p, ring0, full0, it, cw);
		wgmma_wait<0>();
		tma_block_retire<MC, BN>(acc, p, s, jb, empty0, it, lane);
	}
}

/* Tile t of the persistent order: token group *mg (MC token tiles) and weight tile *nt. The
 * tiles go in panels of `group` token groups: a panel's weight tiles one after another, each
 * with the panel's token groups next to each other, so the tiles running at once share a
 * few token tiles and a few weight tiles, and both stay in L2 (with every token group in
 * one panel, a large K made every pair of weight tiles read the whole activation matrix
 * from memory again: 64 MiB of it for 8192^3, 2 GiB in all). */
__device__ __forceinline__ void tma_tile_coords(int t, int mgroups, int ntiles, int group,
						int &mg, int &nt)
{
	int span = group * ntiles, first = t / span * group, w = t % span;
	int gs = mgroups - first < group ? mgroups - first : group;
	mg = first + w % gs;
	nt = w / gs;
}

/* A consumer thread's place in tile t of BN weight rows: its first token t0 (its tokens are
 * t0 and t0 + 8), the tile's first weight row r0 and first weight-scale block nb. */
template <int MC, int BN>
__device__ __forceinline__ void tma_place(int t, int mgroups, int tiles, int group, int rank,
					  int cw, int warp, int lane, int &t0, int &r0, int &nb)
{
	int mg, nt;
	tma_tile_coords(t, mgroups, tiles / mgroups, group, mg, nt);
	r0 = nt * BN;
	nb = r0 / WN;
	t0 = (mg * MC + rank) * WM + cw * 64 + warp * 16 + (lane >> 2);
}

/* The k blocks a tile runs through the ring: the pipelined consumers' count is even. */
template <int BN> __device__ __forceinline__ int tma_tile_blocks(int kbs)
{
	return BN == 128 ? kbs + (kbs & 1) : kbs;
}

/* The consumers of 128-row tiles with each tile's store overlapped (wk_cuda_gemm_fp8_wgmma_ovl,
 * the lab's "wgmma ovl"): tma_tile_pipelined's schedule, but block 0 of the next tile is
 * issued into pa before this tile's totals are stored, so the tensor cores multiply while
 * the epilogue's 64 KiB leave (else they idle through it: at 4096 x 7168 x 2048 a tile is 16
 * k blocks). acc, pa and pb stay 64 registers each, as in tma_tile_pipelined. */
template <int MC>
__device__ __forceinline__ void tma_consumer_ovl(float *y, const float *xs, const float *ws,
						 int n, int rows, int cols, int mgroups, int tiles,
						 int group, int first, int step, int rank,
						 uint32_t ring0, uint32_t full0, uint32_t empty0,
						 int cw, int warp, int lane)
{
	int kbs = (cols + WK - 1) / WK, sr = (rows + WN - 1) / WN;
	float acc[64], pa[64], pb[64], sa[4], sb[4];
	int it = 0, tile = first, t0 = 0, r0 = 0, nb = 0;
	if (tile < tiles) {
		tma_place<MC, 128>(tile, mgroups, tiles, group, rank, cw, warp, lane, t0, r0, nb);
		tma_tile_first(pa, sa, xs, ws, t0, n, nb, sr, kbs, ring0, full0, it, cw);
	}
	while (tile < tiles) {
#pragma unroll
		for (int i = 0; i < 64; i++)
			acc[i] = 0.0f;
		tma_tile_rest<MC>(acc, pa, pb, sa, sb, xs, ws, t0, n, nb, sr, kbs, ring0, full0,
				  empty0, it, cw, lane);
		int t0c = t0, r0c = r0, next = tile + step;
		if (next < tiles) { /* the next tile's first block, in flight during the store */
			tma_place<MC, 128>(next, mgroups, tiles, group, rank, cw, warp, lane, t0, r0, nb);
			tma_tile_first(pa, sa, xs, ws, t0, n, nb, sr, kbs, ring0, full0, it, cw);
		}
		wgmma_store_tile(y, acc, t0c, r0c, lane & 3, n, rows);
		tile = next;
	}
}

/* The producer of a TMA kernel (thread 0 of warpgroup 0): fills the ring of the tiles
 * first, first + step, ... through the bulk tensor copy engine, kbe k blocks a tile (the
 * pipelined consumers' padding block a copy of the last), waiting for each slot to be empty
 * in every CTA of the cluster. */
template <int MC, int BN>
__device__ __forceinline__ void tma_produce(const CUtensorMap *tx, const CUtensorMap *tw,
					    uint32_t ring0, uint32_t full0, uint32_t empty0,
					    int kbs, int kbe, int first, int step, int tiles,
					    int mgroups, int group, int rank)
{
	typedef tma_ring<BN> R;
	int it = 0; /* k blocks issued so far, over all the tiles: the ring's clock */
	for (int tile = first; tile < tiles; tile += step) {
		int mg, nt;
		tma_tile_coords(tile, mgroups, tiles / mgroups, group, mg, nt);
		int m0 = (mg * MC + rank) * WM, r0 = nt * BN;
		/* the pipelined consumers' padding block is a copy of the last */
		for (int kb = 0; kb < kbe; kb++, it++) {
			int s = it % R::stages, kc = (kb < kbs ? kb : kbs - 1) * WK;
			unsigned ph = (unsigned)(it / R::stages) & 1;
			uint32_t st = ring0 + s * R::stage, full = full0 + 8 * s;
			/* empty in every CTA of the cluster: its consumers arrive on all */
			mbar_wait(empty0 + 8 * s, ph ^ 1);
			/* the whole stage lands here: the token tile, the weight tile's slice of
			 * each CTA of the cluster */
			mbar_arrive_expect_tx(full, R::stage);
			tma_load_2d(st, tx, kc, m0, full);
			if (MC == 1)
				tma_load_2d(st + WTILE, tw, kc, r0, full);
			else /* this CTA's BN / MC weight rows, into every CTA */
				tma_load_2d_mc(st + WTILE + rank * (BN / MC) * WK, tw, kc,
					       r0 + rank * (BN / MC), full,
					       (uint16_t)((1u << MC) - 1));
		}
	}
	/* No CTA of a cluster may leave while a peer's consumers can still arrive on its
	 * barriers: this thread waits until every slot's last stage has been released by all of
	 * them (a slot never filled is through at once). */
	for (int k = 0; MC > 1 && k < R::stages; k++, it++)
		mbar_wait(empty0 + 8 * (it % R::stages), ((unsigned)(it / R::stages) & 1) ^ 1);
}

template <int MC, int BN, bool OVL = false>
__global__ void __launch_bounds__(TTHREADS, 1)
	k_gemm_wgmma_tma(float *y, const __grid_constant__ CUtensorMap tx,
			 const __grid_constant__ CUtensorMap tw, const float *xs, const float *ws,
			 int n, int rows, int cols, int mgroups, int tiles, int group)
{
	typedef tma_ring<BN> R;
	extern __shared__ uint4 wgmma_tma_smem[];
	uint8_t *raw = (uint8_t *)wgmma_tma_smem;
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	uint32_t ring0 = smem_u32(ring), full0 = ring0 + R::stages * R::stage;
	uint32_t empty0 = full0 + 8 * R::stages;
	int tid = (int)threadIdx.x, wg = tid >> 7;
	int kbs = (cols + WK - 1) / WK, kbe = tma_tile_blocks<BN>(kbs);
	/* the cluster's rank and its tiles: group g of MC token tiles (this CTA's the rank-th)
	 * of one weight tile, clusters taking them gridDim.x / MC apart */
	int rank = MC > 1 ? (int)cluster_rank() : 0;
	int first = (int)blockIdx.x / MC, step = (int)gridDim.x / MC;

	if (tid == 0) {
		for (int s = 0; s < R::stages; s++) {
			mbar_init(full0 + 8 * s, 1);
			mbar_init(empty0 + 8 * s, MC == 1 ? 2 * 128 : MC * 8);
		}
		mbar_init_fence();
	}
	if (MC > 1)
		cluster_sync(); /* the peers' mbarriers too, before any arrival or copy reaches them */
	else
		__syncthreads();

	if (wg == 0) { /* the producer */
		regs_dec<40>();
		if (tid == 0)
			tma_produce<MC, BN>(&tx, &tw, ring0, full0, empty0, kbs, kbe, first, step,
					    tiles, mgroups, group, rank);
		return;
	}

	regs_inc<232>();
	int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, q = lane & 3;
	if constexpr (OVL) {
		tma_consumer_ovl<MC>(y, xs, ws, n, rows, cols, mgroups, tiles, group, first, step,
				     rank, ring0, full0, empty0, cw, warp, lane);
		return;
	}
	int sr = (rows + WN - 1) / WN; /* weight scale blocks */
	int it = 0;
	for (int tile = first; tile < tiles; tile += step) {
		int t0, r0, nb;
		tma_place<MC, BN>(tile, mgroups, tiles, group, rank, cw, warp, lane, t0, r0, nb);
		int jb = ((nb + 1) * WN - r0) / 8; /* the 8-row groups in the first scale block */
		float acc[BN / 2];
#pragma unroll
		for (int i = 0; i < BN / 2; i++)
			acc[i] = 0.0f;
		if constexpr (BN == 128)
			tma_tile_pipelined<MC>(acc, xs, ws, t0, n, nb, sr, kbs, ring0, full0, empty0,
					       it, cw, lane);
		else
			tma_tile_serial<MC, BN>(acc, xs, ws, t0, n, nb, jb, sr, kbs, ring0, full0,
						empty0, it, cw, lane);
		wgmma_store_tile(y, acc, t0, r0, q, n, rows);
	}
}

/* ---- the TMA-store epilogue (wk_cuda_gemm_fp8_wgmma_st, the lab's "wgmma st") ----------
 *
 * k_gemm_wgmma_tma<1, 128>'s producer and consumers, but each tile's totals leave through
 * shared memory and the bulk tensor copy engine instead of from registers: consumer
 * warpgroup cw writes its 64 x 128 f32 totals into its own 32 KiB staging area (after the
 * ring), fences them to the async proxy and meets its 128 threads at named barrier 1 + cw;
 * then its first thread starts four box stores (ty: y [n][rows] f32, boxes of 64 token rows
 * x 32 weight rows, 128-byte swizzled; out-of-bounds rows and columns are not written) and
 * commits them as one bulk group, and the warpgroup goes straight on to its next tile's k
 * loop while the copy engine reads the staging area. Before the warpgroup writes it again
 * (its next tile's epilogue), that thread waits until the group has read it
 * (cp.async.bulk.wait_group.read 0) and the warpgroup meets at the barrier; before it
 * returns, until its stores are complete (wait_group 0). So each warpgroup's store costs it
 * 32 float2 shared-memory stores instead of 32 8-byte global ones whose latency it waited
 * through, and the other warpgroup's wgmmas keep the tensor cores busy meanwhile.
 * The staging layout is the tensor map's: box b (weight rows 32 b .. +32) at 8 KiB b, token
 * row r at 128 r in it, its 16-byte chunk c at chunk c ^ (r % 8). Needs rows % 4 == 0 and y
 * 16-byte aligned (the map's stride and address rules); the launcher falls back to
 * k_gemm_wgmma_tma<1, 128> otherwise. */
#define ST_BOX 32                  /* weight rows of a store box: 128 bytes of f32, a swizzle row */
#define ST_AREA (64 * WN * 4)      /* bytes of a consumer warpgroup's staging area: 32 KiB */

/* The shared memory of the TMA-store kernel: the ring (from ring0), the two staging areas
 * (1024-byte aligned: the ring's stages are 32 KiB), then the mbarriers. */
struct tma_st_smem {
	typedef tma_ring<128> R;
	static constexpr int staging = R::stages * R::stage; /* from ring0 */
	static constexpr int bars = staging + 2 * ST_AREA;
	static constexpr int smem = bars + 2 * R::stages * 8 + 1024;
	static_assert(staging % 1024 == 0, "the staging areas are 1024-byte aligned");
	static_assert(smem <= 232448, "ring and staging fit in a block's 227 KiB");
};

/* Writes a consumer thread's totals acc (the m64n128 fragment: register i at row
 * 16 warp + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 q + i % 2) into its warpgroup's staging
 * area st, one float2 a register pair. Banks: the row's XOR (r % 8 = g) moves a lane's pair
 * of chunks only to the neighbouring pair for g ^ 1, so if every lane stored column group j
 * together, lanes g and g ^ 1 would share banks (two wavefronts a half-warp's 128 bytes,
 * under the half-warp rule for 8-byte accesses). Lanes with odd g store group j ^ 2 while
 * the others store j: then a half-warp's 16 lanes (g 0..3, q 0..3) write chunks
 * 2 (j % 4) ^ (q / 2) ^ g ^ 4 (g % 2), which are all 8 chunks, each half by one lane: all 32
 * banks, one wavefront (likewise g 4..7). */
__device__ __forceinline__ void st_stage_tile(uint8_t *st, const float (&acc)[64], int warp,
					      int lane)
{
	int g = lane >> 2, q = lane & 3, odd = g & 1;
	int lx = (q >> 1) ^ g ^ (odd << 2); /* the lane's part of the swizzled chunk */
	uint8_t *base = st + (16 * warp + g) * 128 + (q & 1) * 8;
#pragma unroll
	for (int j = 0; j < 16; j++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int i = 4 * j + 2 * h, io = 4 * (j ^ 2) + 2 * h;
			float v0 = odd ? acc[io] : acc[i], v1 = odd ? acc[io + 1] : acc[i + 1];
			/* group jl = j ^ 2 odd: box j / 4, chunk 2 (jl % 4) + q / 2, XOR g */
			int c = (2 * (j & 3)) ^ lx;
			*(float2 *)(base + (j >> 2) * (64 * 128) + h * 8 * 128 + c * 16) =
				make_float2(v0, v1);
		}
}

/* Consumer warpgroup cw's 128 threads meet (named barrier 1 + cw). */
__device__ __forceinline__ void st_bar(int cw)
{
	if (cw == 0)
		named_bar_sync<1, 128>();
	else
		named_bar_sync<2, 128>();
}

/* The epilogue of consumer warpgroup cw for its tokens m (64 from m) and weight rows r0
 * (128 from r0): waits for its staging area to be free, fills it, and starts its store;
 * after the block's last tile (last), waits for the stores to complete, so none is left
 * when the block exits. (That wait after the tile loop instead, the natural place, made
 * ptxas spill 736 bytes of the consumers' registers.) */
__device__ __forceinline__ void st_epilogue(const CUtensorMap *ty, const float (&acc)[64],
					    uint8_t *st, int cw, int warp, int lane, int m, int r0,
					    bool last)
{
	bool lead = warp == 0 && lane == 0;
	if (lead)
		bulk_wait_read<0>(); /* the last tile's store has read the staging area */
	st_bar(cw);
	st_stage_tile(st, acc, warp, lane);
	fence_proxy_async(); /* the copy engine reads what these ordinary stores wrote */
	st_bar(cw);
	if (lead) {
#pragma unroll
		for (int b = 0; b < WN / ST_BOX; b++)
			tma_store_2d(ty, r0 + b * ST_BOX, m, smem_u32(st) + b * 64 * 128);
		bulk_commit();
		if (last)
			bulk_wait<0>();
	}
}

__global__ void __launch_bounds__(TTHREADS, 1)
	k_gemm_wgmma_tma_st(const __grid_constant__ CUtensorMap ty,
			    const __grid_constant__ CUtensorMap tx,
			    const __grid_constant__ CUtensorMap tw, const float *xs,
			    const float *ws, int n, int rows, int cols, int mgroups, int tiles,
			    int group)
{
	typedef tma_ring<128> R;
	typedef tma_st_smem S;
	extern __shared__ uint4 wgmma_st_smem[];
	uint8_t *raw = (uint8_t *)wgmma_st_smem;
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	uint32_t ring0 = smem_u32(ring), full0 = ring0 + S::bars;
	uint32_t empty0 = full0 + 8 * R::stages;
	int tid = (int)threadIdx.x, wg = tid >> 7;
	int kbs = (cols + WK - 1) / WK, kbe = tma_tile_blocks<128>(kbs);
	int first = (int)blockIdx.x, step = (int)gridDim.x;

	if (tid == 0) {
		for (int s = 0; s < R::stages; s++) {
			mbar_init(full0 + 8 * s, 1);
			mbar_init(empty0 + 8 * s, 2 * 128);
		}
		mbar_init_fence();
	}
	__syncthreads();

	if (wg == 0) { /* the producer */
		regs_dec<40>();
		if (tid == 0)
			tma_produce<1, 128>(&tx, &tw, ring0, full0, empty0, kbs, kbe, first, step,
					    tiles, mgroups, group, 0);
		return;
	}

	regs_inc<232>();
	int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31;
	uint8_t *st = ring + S::staging + cw * ST_AREA;
	int sr = (rows + WN - 1) / WN; /* weight scale blocks */
	int it = 0;
	for (int tile = first; tile < tiles; tile += step) {
		int t0, r0, nb;
		tma_place<1, 128>(tile, mgroups, tiles, group, 0, cw, warp, lane, t0, r0, nb);
		float acc[64];
#pragma unroll
		for (int i = 0; i < 64; i++)
			acc[i] = 0.0f;
		tma_tile_pipelined<1>(acc, xs, ws, t0, n, nb, sr, kbs, ring0, full0, empty0, it, cw,
				      lane);
		st_epilogue(&ty, acc, st, cw, warp, lane, t0 - 16 * warp - (lane >> 2), r0,
			    tile + step >= tiles);
	}
}

/* cuTensorMapEncodeTiled, from the driver through the runtime (no -lcuda); NULL when the
 * driver has none. */
typedef decltype(&cuTensorMapEncodeTiled) encode_tiled_fn;

static encode_tiled_fn encode_tiled(void)
{
	static encode_tiled_fn fn;
	static bool tried;
	if (!tried) { /* a race here only looks the entry point up twice */
		void *p = NULL;
		cudaDriverEntryPointQueryResult q;
		if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
						     cudaEnableDefault, &q) == cudaSuccess &&
		    q == cudaDriverEntryPointSuccess)
			fn = (encode_tiled_fn)p;
		tried = true;
	}
	return fn;
}

/* The tensor map of a [nrows][cols] e4m3 matrix at p read in boxes of box_rows rows of 128
 * bytes, 128-byte swizzled, zeros out of bounds. cols % 16 == 0, p 16-byte aligned. WK_OK or
 * WK_EIO. */
static int tensor_map(CUtensorMap *m, const uint8_t *p, int nrows, int cols, int box_rows,
		      char *err, size_t errsz)
{
	encode_tiled_fn enc = encode_tiled();
	if (!enc)
		return wk_errf(err, errsz, WK_EIO, "CUDA gemm_fp8_wgmma: no cuTensorMapEncodeTiled");
	cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)nrows}, strides[1] = {(cuuint64_t)cols};
	cuuint32_t box[2] = {WK, (cuuint32_t)box_rows}, one[2] = {1, 1};
	CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box, one,
			 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
			 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (r != CUDA_SUCCESS)
		return wk_errf(err, errsz, WK_EIO, "CUDA gemm_fp8_wgmma: cuTensorMapEncodeTiled: %d",
			       (int)r);
	return WK_OK;
}

/* The tensor map of the output y [n][rows] f32 written in boxes of 64 rows of ST_BOX floats,
 * 128-byte swizzled (k_gemm_wgmma_tma_st's staging layout). rows % 4 == 0, y 16-byte aligned.
 * WK_OK or WK_EIO. */
static int tensor_map_y(CUtensorMap *m, float *y, int n, int rows, char *err, size_t errsz)
{
	encode_tiled_fn enc = encode_tiled();
	if (!enc)
		return wk_errf(err, errsz, WK_EIO, "CUDA gemm_fp8_wgmma: no cuTensorMapEncodeTiled");
	cuuint64_t dims[2] = {(cuuint64_t)rows, (cuuint64_t)n};
	cuuint64_t strides[1] = {(cuuint64_t)rows * 4};
	cuuint32_t box[2] = {ST_BOX, 64}, one[2] = {1, 1};
	CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)y, dims, strides, box, one,
			 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
			 CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (r != CUDA_SUCCESS)
		return wk_errf(err, errsz, WK_EIO,
			       "CUDA gemm_fp8_wgmma: cuTensorMapEncodeTiled of y: %d", (int)r);
	return WK_OK;
}

/* The persistent TMA kernel with clusters of MC CTAs (1 or 2) and tiles of BN weight rows
 * (128 or 160) on the mtiles x ntiles tiles; OVL: the store overlapped (tma_consumer_ovl);
 * ST: the TMA-store epilogue (k_gemm_wgmma_tma_st, MC 1 and BN 128 only). */
template <int MC, int BN, bool OVL = false, bool ST = false>
static int launch_tma(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		      const float *ws, int n, int rows, int cols, int mtiles, int ntiles,
		      char *err, size_t errsz)
{
	static_assert(!ST || (MC == 1 && BN == 128 && !OVL), "the TMA-store kernel: 1 x 128");
	typedef tma_ring<BN> R;
	const int smem = ST ? tma_st_smem::smem : R::smem;
	CUtensorMap tx, tw, ty;
	if (tensor_map(&tx, xq, n, cols, WM, err, errsz) ||
	    tensor_map(&tw, w, rows, cols, BN / MC, err, errsz) ||
	    (ST && tensor_map_y(&ty, y, n, rows, err, errsz)))
		return WK_EIO;
	const cudaFuncAttribute max_dyn = cudaFuncAttributeMaxDynamicSharedMemorySize;
	cudaError_t e = ST ? cudaFuncSetAttribute(k_gemm_wgmma_tma_st, max_dyn, smem)
			   : cudaFuncSetAttribute((k_gemm_wgmma_tma<MC, BN, OVL>), max_dyn, smem);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8_wgmma shared memory", err, errsz);
	/* the token tiles of one weight tile next to each other, MC to a cluster, in panels of
	 * `group` token groups whose activations fill about a quarter of L2 (tma_tile_coords) */
	int mgroups = (mtiles + MC - 1) / MC, tiles = mgroups * ntiles; /* checked */
	int dev = 0, l2 = 0;
	e = cudaGetDevice(&dev);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8_wgmma L2 size", err, errsz);
	long long per_group = (long long)MC * WM * cols; /* bytes of one group's token rows */
	int group = (int)(l2 / 4 / per_group);
	group = group < 1 ? 1 : group > mgroups ? mgroups : group;
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute attr[1];
	cfg.blockDim = dim3(TTHREADS);
	cfg.dynamicSmemBytes = (size_t)smem;
	cfg.stream = wk_st();
	int places = 0; /* clusters (or blocks) resident at once: the persistent grid */
	if (MC == 1) {
		e = cudaDeviceGetAttribute(&places, cudaDevAttrMultiProcessorCount, dev);
		if (e != cudaSuccess)
			return check(e, "gemm_fp8_wgmma multiprocessors", err, errsz);
	} else {
		/* a cluster's CTAs share a GPC, and a GPC's multiprocessors need not pair up: ask
		 * how many clusters fit rather than halve the multiprocessors (a cluster past
		 * them would run its tiles after all the others) */
		attr[0].id = cudaLaunchAttributeClusterDimension;
		attr[0].val.clusterDim.x = MC;
		attr[0].val.clusterDim.y = 1;
		attr[0].val.clusterDim.z = 1;
		cfg.attrs = attr;
		cfg.numAttrs = 1;
		cfg.gridDim = dim3((unsigned)(MC * tiles));
		e = cudaOccupancyMaxActiveClusters(&places, (k_gemm_wgmma_tma<MC, BN, OVL>), &cfg);
		if (e != cudaSuccess)
			return check(e, "gemm_fp8_wgmma clusters", err, errsz);
		if (places < 1)
			return wk_errf(err, errsz, WK_EIO,
				       "CUDA gemm_fp8_wgmma: no %d-CTA cluster fits on the device", MC);
	}
	cfg.gridDim = dim3((unsigned)(MC * (tiles < places ? tiles : places > 0 ? places : 1)));
	if constexpr (ST)
		e = cudaLaunchKernelEx(&cfg, k_gemm_wgmma_tma_st, ty, tx, tw, xs, ws, n, rows, cols,
				       mgroups, tiles, group);
	else
		e = cudaLaunchKernelEx(&cfg, (k_gemm_wgmma_tma<MC, BN, OVL>), y, tx, tw, xs, ws, n,
				       rows, cols, mgroups, tiles, group);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8_wgmma launch", err, errsz);
	return launched("gemm_fp8_wgmma", err, errsz);
}

/* wk_cuda_gemm_fp8_wgmma (mc 1, bn 128) and its variants: clusters of mc = 2 CTAs, tiles of
 * bn = 160 weight rows, the store overlapped (ovl, with mc 1 and bn 128), the TMA-store
 * epilogue (st, with mc 1 and bn 128; where rows % 4 == 0 and y is 16-byte aligned, else as
 * neither) (the TMA kernel only; otherwise the cp.async kernel's 128 x 128). */
static int gemm_wgmma(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		      const float *ws, int n, int rows, int cols, int mc, int bn, bool ovl,
		      bool st, char *err, size_t errsz)
{
	if (cols < 0 || rows > 65535 * WN) /* gridDim.y <= 65535 */
		return wk_errf(err, errsz, WK_EINVAL, "CUDA gemm_fp8_wgmma: rows %d, cols %d", rows,
			       cols);
	if (n <= 0 || rows <= 0)
		return WK_OK;
	dim3 grid((unsigned)(n / WM + (n % WM != 0)), (unsigned)(rows / WN + (rows % WN != 0)));
	bool vec = cols % 16 == 0 && ((uintptr_t)xq | (uintptr_t)w) % 16 == 0;
	if (vec && cols > 0 && (int64_t)grid.x * grid.y <= 0x7fffffff / 2) {
		int mt = (int)grid.x, nt = bn == 160 ? (rows + 159) / 160 : (int)grid.y;
		if (bn == 160)
			return mc == 2 ? launch_tma<2, 160>(y, xq, xs, w, ws, n, rows, cols, mt, nt,
							    err, errsz)
				       : launch_tma<1, 160>(y, xq, xs, w, ws, n, rows, cols, mt, nt,
							    err, errsz);
		if (ovl)
			return launch_tma<1, 128, true>(y, xq, xs, w, ws, n, rows, cols, mt, nt, err,
							errsz);
		if (st && rows % 4 == 0 && (uintptr_t)y % 16 == 0)
			return launch_tma<1, 128, false, true>(y, xq, xs, w, ws, n, rows, cols, mt,
							       nt, err, errsz);
		return mc == 2 ? launch_tma<2, 128>(y, xq, xs, w, ws, n, rows, cols, mt, nt, err,
						    errsz)
			       : launch_tma<1, 128>(y, xq, xs, w, ws, n, rows, cols, mt, nt, err,
						    errsz);
	}
	cudaError_t e = vec ? cudaFuncSetAttribute(k_gemm_wgmma<true>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, WSMEM)
			    : cudaFuncSetAttribute(k_gemm_wgmma<false>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, WSMEM);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8_wgmma shared memory", err, errsz);
	if (vec)
		k_gemm_wgmma<true><<<grid, WTHREADS, WSMEM, wk_st()>>>(y, xq, xs, w, ws, n, rows, cols);
	else
		k_gemm_wgmma<false><<<grid, WTHREADS, WSMEM, wk_st()>>>(y, xq, xs, w, ws, n, rows, cols);
	return launched("gemm_fp8_wgmma", err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma(float *y, const uint8_t *xq, const float *xs,
				      const uint8_t *w, const float *ws, int n, int rows, int cols,
				      char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 1, 128, false, false, err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma_mc2(float *y, const uint8_t *xq, const float *xs,
					  const uint8_t *w, const float *ws, int n, int rows,
					  int cols, char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 2, 128, false, false, err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma_n160(float *y, const uint8_t *xq, const float *xs,
					   const uint8_t *w, const float *ws, int n, int rows,
					   int cols, char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 1, 160, false, false, err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma_n160_mc2(float *y, const uint8_t *xq, const float *xs,
					       const uint8_t *w, const float *ws, int n,
					       int rows, int cols, char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 2, 160, false, false, err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma_ovl(float *y, const uint8_t *xq, const float *xs,
					  const uint8_t *w, const float *ws, int n, int rows,
					  int cols, char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 1, 128, true, false, err, errsz);
}

extern "C" int wk_cuda_gemm_fp8_wgmma_st(float *y, const uint8_t *xq, const float *xs,
					 const uint8_t *w, const float *ws, int n, int rows,
					 int cols, char *err, size_t errsz)
{
	return gemm_wgmma(y, xq, xs, w, ws, n, rows, cols, 1, 128, false, true, err, errsz);
}
