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
 * Tiling:
 *   - a block of 256 threads (two warpgroups) computes a 128 (tokens) x 128 (weight rows)
 *     tile of y; the weight rows [128 blockIdx.y, +128) are one weight-scale block;
 *   - k runs in stages of 128 columns, exactly one scale block, through a WS_STAGES-deep ring
 *     in shared memory; a stage holds the token tile then the weight tile, each 128 rows of
 *     128 bytes in the K-major 128-byte-swizzled layout wgmma reads (wgmma.cuh): row r at
 *     128 r, its 16-byte chunk c at chunk c ^ (r % 8), atoms of 8 rows 1024-byte aligned;
 *   - warpgroup h multiplies tokens 64 h .. +64 by all 128 weight rows: per stage four
 *     wgmma.m64n128k32 (k slices 32 bytes apart inside the swizzled rows), commit, wait,
 *     promote; 64 f32 partials and 64 f32 totals a thread;
 *   - every thread also fills the ring: 16-byte cp.async copies (zero-filled past the
 *     edges), issued WS_STAGES - 1 stages ahead, written straight to their swizzled places;
 *     when cols % 16 != 0 or an operand is not 16-byte aligned, the stage is filled by
 *     ordinary byte loads instead (same layout and zeros), slower but any shape. Either way
 *     the writes are ordinary (generic-proxy) ones, so each thread fences them to the async
 *     proxy (fence.proxy.async) before the barrier after which wgmma reads them.
 * Partial tiles in every dimension are zero in shared memory; padded tokens get scale 0 and
 * padded outputs are not stored.
 *
 * What is not here yet (issue 9's 1,000 TFLOPS): the bulk tensor copy engine (TMA,
 * cp.async.bulk.tensor with a CUtensorMap) completing on mbarriers, a producer warp with the
 * two consumer warpgroups free-running on their own barriers (here all threads load, and one
 * __syncthreads per stage keeps the warpgroups in step, so the promotion's FMAs are not
 * overlapped with the other warpgroup's wgmma), setmaxnreg, a persistent grid and a
 * TMA-store epilogue. tests/tools/cuda_lab times this version beside the mma.sync one and
 * cuBLASLt.
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

/* Where byte k (0..127) of row r (0..127) of a tile lives: the 128-byte swizzle. */
__device__ __forceinline__ int swz(int r, int k)
{
	return r * 128 + ((((k >> 4) ^ r) & 7) << 4) + (k & 15);
}

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
		uint8_t *d = st + t * WTILE + swz(row, ch * 16);
		if (VEC) {
			bool in = r < nr && col < cols;
			cp_async16(d, in ? src + (size_t)r * cols + col : src, in ? 16 : 0);
		} else {
			const uint8_t *s = src + (size_t)r * cols;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				uint32_t v = 0;
#pragma unroll
				for (int b = 0; b < 4; b++) {
					int k = col + q * 4 + b;
					if (r < nr && k < cols)
						v |= (uint32_t)s[k] << (8 * b);
				}
				*(uint32_t *)(d + q * 4) = v;
			}
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

	/* register i: row t0 + 8 ((i / 2) % 2), column r0 + 8 (i / 4) + 2 q + i % 2 */
#pragma unroll
	for (int i = 0; i < 64; i++) {
		int t = t0 + ((i & 2) ? 8 : 0), r = r0 + (i >> 2) * 8 + q * 2 + (i & 1);
		if (t < n && r < rows)
			y[(size_t)t * rows + r] = acc[i];
	}
}

extern "C" int wk_cuda_gemm_fp8_wgmma(float *y, const uint8_t *xq, const float *xs,
				      const uint8_t *w, const float *ws, int n, int rows, int cols,
				      char *err, size_t errsz)
{
	if (cols < 0 || rows > 65535 * WN) /* gridDim.y <= 65535 */
		return wk_errf(err, errsz, WK_EINVAL, "CUDA gemm_fp8_wgmma: rows %d, cols %d", rows,
			       cols);
	if (n <= 0 || rows <= 0)
		return WK_OK;
	dim3 grid((unsigned)(n / WM + (n % WM != 0)), (unsigned)(rows / WN + (rows % WN != 0)));
	bool vec = cols % 16 == 0 && ((uintptr_t)xq | (uintptr_t)w) % 16 == 0;
	cudaError_t e = vec ? cudaFuncSetAttribute(k_gemm_wgmma<true>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, WSMEM)
			    : cudaFuncSetAttribute(k_gemm_wgmma<false>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, WSMEM);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8_wgmma shared memory", err, errsz);
	if (vec)
		k_gemm_wgmma<true><<<grid, WTHREADS, WSMEM>>>(y, xq, xs, w, ws, n, rows, cols);
	else
		k_gemm_wgmma<false><<<grid, WTHREADS, WSMEM>>>(y, xq, xs, w, ws, n, rows, cols);
	return launched("gemm_fp8_wgmma", err, errsz);
}
