/*
 * gemm_fp8.cu - FP8 e4m3 x e4m3 GEMM with block scales for prefill (wk_cuda_gemm_fp8, the
 * contract of cpu_ref_gemm_fp8), on the tensor cores through mma.sync (sm_89+).
 *
 * The DeepGEMM / DeepSeek-V3 scheme: activations quantized per token per 128 channels (xs
 * [n][ceil(cols/128)]), weights per 128x128 block (ws [ceil(rows/128)][ceil(cols/128)]).
 * Each 128-deep k block is summed by the tensor cores in a fresh f32 fragment, then
 * "promoted": multiplied by its two scales and added to the f32 accumulator in ordinary
 * registers. The promotion is what makes the scales exact, and it also bounds the tensor
 * cores' own accumulation (on Hopper their FP8 accumulator keeps fewer bits than f32, the
 * reason DeepSeek-V3 promotes) to 128 products.
 *
 * Tiling (first version, mma.sync; wgmma is the goal, see below):
 *   - a block computes a 128 (tokens) x 128 (weight rows) tile of y with 8 warps; weight
 *     rows [128 * blockIdx.y, +128) are one weight-scale block, so the block's weight scale
 *     is one number per k block;
 *   - warp w owns tokens 64 * (w % 2) .. +64 and weight rows 32 * (w / 2) .. +32: 4 x 4
 *     m16n8k32 tiles, 16 mma per 32 columns, 64 f32 accumulators and 64 f32 partials a lane;
 *   - k runs in stages of 64 columns (two per scale block) through a two-stage shared-memory
 *     ring filled by cp.async (16-byte copies, zero-filled past the edges) while the other
 *     stage is multiplied. Rows are padded from 64 to 80 bytes, so the 32-bit fragment loads
 *     of a warp (8 rows x 4 words) land in 32 different banks;
 *   - when cols % 16 != 0 or an operand is not 16-byte aligned, the stages are filled byte by
 *     byte instead (same tiles, same zero padding), slower but any shape.
 * Partial tiles in every dimension are zero-padded in shared memory; padded tokens get scale
 * 0 and padded outputs are not stored.
 *
 * What remains for the 1,000 TFLOPS target (issue 9): wgmma (sm_90a) from shared memory with
 * a 128B-swizzled layout, the bulk tensor copy engine (TMA) on mbarriers with a deeper ring,
 * warp specialisation (a producer warp, two consumer warpgroups) and a persistent grid.
 * tests/tools/cuda_lab measures this version on 4096 x 7168 x 2048.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/mma.cuh"

#define GM 128                    /* tokens per block tile */
#define GN 128                    /* weight rows per block tile: one weight-scale block */
#define GK 64                     /* columns per stage */
#define GLD (GK + 16)             /* bytes per row of a stage in shared memory (padded) */
#define GTHREADS 256              /* 8 warps: 2 (tokens) x 4 (weight rows) */
#define GSTAGE ((GM + GN) * GLD)  /* one stage: the token tile, then the weight tile */
#define GSMEM (2 * GSTAGE)        /* 40,960 bytes: under the 48 KB needing no opt-in */

static_assert(GK * 2 == FP8_BLOCK, "two stages per scale block");
static_assert(GM * GK / 16 == 2 * GTHREADS && GN * GK / 16 == 2 * GTHREADS,
	      "each thread fills two 16-byte chunks of each tile per stage");

/* Fills one tile of a stage: rows [r0, r0 + 128) of src [nrows][cols] bytes, columns
 * [k0, k0 + 64), zero outside. dst: the tile in shared memory, row stride GLD. VEC: cols
 * % 16 == 0 and src 16-byte aligned, so a 16-byte chunk lies wholly inside or outside. */
template <bool VEC>
__device__ __forceinline__ void fill_tile(uint8_t *dst, const uint8_t *src, int r0, int nrows,
					  int k0, int cols)
{
#pragma unroll
	for (int h = 0; h < 2; h++) {
		int c = (int)threadIdx.x + h * GTHREADS; /* chunk: row c / 4, 16 bytes c % 4 */
		int row = c >> 2, col = k0 + (c & 3) * 16;
		uint8_t *d = dst + row * GLD + (c & 3) * 16;
		bool in_row = r0 + row < nrows;
		if (VEC) {
			bool in = in_row && col < cols;
			cp_async16(d, in ? src + (size_t)(r0 + row) * cols + col : src, in ? 16 : 0);
		} else {
			const uint8_t *s = src + (size_t)(r0 + row) * cols;
#pragma unroll
			for (int w = 0; w < 4; w++) {
				uint32_t v = 0;
#pragma unroll
				for (int b = 0; b < 4; b++) {
					int k = col + w * 4 + b;
					if (in_row && k < cols)
						v |= (uint32_t)s[k] << (8 * b);
				}
				*(uint32_t *)(d + w * 4) = v;
			}
		}
	}
}

/* One aligned 32-bit load from shared memory: four consecutive k of one row. */
__device__ __forceinline__ uint32_t lds32(const uint8_t *p)
{
	return *(const uint32_t *)p;
}

template <bool VEC>
__global__ void __launch_bounds__(GTHREADS, 1)
	k_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		   const float *ws, int n, int rows, int cols)
{
	extern __shared__ uint4 gemm_smem[]; /* uint4: 16-byte aligned, as cp.async needs */
	uint8_t *smem = (uint8_t *)gemm_smem;
	int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
	int g = lane >> 2, q = lane & 3; /* the fragment coordinates of mma.cuh */
	int wm = (warp & 1) * 64, wn = (warp >> 1) * 32;
	int m0 = (int)blockIdx.x * GM, n0 = (int)blockIdx.y * GN;
	int kbs = (cols + FP8_BLOCK - 1) / FP8_BLOCK, kts = (cols + GK - 1) / GK;

	float acc[4][4][4], part[4][4][4];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[i][j][e] = part[i][j][e] = 0.0f;
	float sx[4][2], sw = 0.0f; /* this k block's scales: the lane's 8 tokens, the weight's */

	if (kts > 0) {
		fill_tile<VEC>(smem, xq, m0, n, 0, cols);
		fill_tile<VEC>(smem + GM * GLD, w, n0, rows, 0, cols);
	}
	cp_async_commit();
	for (int kt = 0; kt < kts; kt++) {
		if (kt + 1 < kts) { /* the next stage fills while this one is multiplied */
			uint8_t *next = smem + ((kt + 1) & 1) * GSTAGE;
			fill_tile<VEC>(next, xq, m0, n, (kt + 1) * GK, cols);
			fill_tile<VEC>(next + GM * GLD, w, n0, rows, (kt + 1) * GK, cols);
		}
		cp_async_commit();
		if ((kt & 1) == 0) { /* a k block starts: its scales, loaded while the copy lands */
			int kb = kt >> 1;
			sw = ws[(size_t)blockIdx.y * kbs + kb];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int h = 0; h < 2; h++) {
					int t = m0 + wm + i * 16 + g + h * 8;
					sx[i][h] = t < n ? xs[(size_t)t * kbs + kb] : 0.0f;
				}
		}
		cp_async_wait<1>(); /* this thread's copies of stage kt have landed */
		__syncthreads();    /* and everyone's */
		const uint8_t *sa = smem + (kt & 1) * GSTAGE, *sb = sa + GM * GLD;
#pragma unroll 1
		for (int ks = 0; ks < GK; ks += 32) {
			uint32_t b[4][2];
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const uint8_t *p = sb + (wn + j * 8 + g) * GLD + ks + q * 4;
				b[j][0] = lds32(p);
				b[j][1] = lds32(p + 16);
			}
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const uint8_t *p = sa + (wm + i * 16 + g) * GLD + ks + q * 4;
				uint32_t a[4] = {lds32(p), lds32(p + 8 * GLD), lds32(p + 16),
						 lds32(p + 8 * GLD + 16)};
#pragma unroll
				for (int j = 0; j < 4; j++)
					mma_e4m3_16832(part[i][j], a, b[j]);
			}
		}
		if ((kt & 1) || kt == kts - 1) { /* the k block is complete: promote it */
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						acc[i][j][e] += part[i][j][e] * (sx[i][e >> 1] * sw);
						part[i][j][e] = 0.0f;
					}
		}
		__syncthreads(); /* stage kt is read: the next iteration refills it */
	}

#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int t = m0 + wm + i * 16 + g + (e >> 1) * 8;
				int r = n0 + wn + j * 8 + q * 2 + (e & 1);
				if (t < n && r < rows)
					y[(size_t)t * rows + r] = acc[i][j][e];
			}
}

extern "C" int wk_cuda_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
				const float *ws, int n, int rows, int cols, char *err,
				size_t errsz)
{
	if (cols < 0 || rows > 65535 * GN) /* gridDim.y <= 65535 */
		return wk_errf(err, errsz, WK_EINVAL, "CUDA gemm_fp8: rows %d, cols %d", rows, cols);
	if (n <= 0 || rows <= 0)
		return WK_OK;
	dim3 grid((unsigned)(n / GM + (n % GM != 0)), (unsigned)(rows / GN + (rows % GN != 0)));
	bool vec = cols % 16 == 0 && ((uintptr_t)xq | (uintptr_t)w) % 16 == 0;
	if (vec)
		k_gemm_fp8<true><<<grid, GTHREADS, GSMEM, wk_st()>>>(y, xq, xs, w, ws, n, rows, cols);
	else
		k_gemm_fp8<false><<<grid, GTHREADS, GSMEM, wk_st()>>>(y, xq, xs, w, ws, n, rows, cols);
	return launched("gemm_fp8", err, errsz);
}
