/*
 * gemm_fp8w.cu - FP8 e4m3 weights times f32 activations on Hopper's warpgroup tensor cores
 * (wgmma, sm_90a), for prefill with f32 activations (the default path): wk_cuda_act_split
 * and wk_cuda_gemm_fp8w, together cpu_ref_matmul_fp8's contract (y [n][rows] = x [n][cols] .
 * w^T, w e4m3 [rows][cols] with 128x128 block scales ws) within ~1e-5 of its f32 result.
 * Without it such a prefill runs the decode GEMV (kernels.cu) in passes of 8 tokens, reading
 * every weight once per 8 tokens.
 *
 * The precision: e4m3 converts to bf16 exactly (3 mantissa bits, exponents 2^-9 .. 2^8 all
 * inside bf16's), and each f32 activation is split into two bf16, hi = bf16(x) (nearest)
 * and lo = bf16(x - hi), so |x - hi - lo| <= 2^-16 |x|. The tensor cores multiply both
 * halves by the same weight tile (bf16 x bf16 products are exact in f32) into one set of
 * f32 partials per 128-deep k block, which is promoted into the f32 totals with the
 * weight's block scale (DeepGEMM's scheme, as gemm_wgmma.cu). So the result differs from
 * cpu_ref_matmul_fp8's by the split's 2^-16 per product and the order of the f32 sums.
 *
 * wk_cuda_act_split, a pre-pass: x [n][cols] f32 into xb [2][n][colsp] bf16 (hi rows, then
 * lo rows; colsp = cols rounded up to 64, zeros past cols), so the GEMM reads 16-byte
 * aligned, zero-padded rows whatever cols is.
 *
 * k_gemm_fp8w, the GEMM (the tiles, swizzle, descriptors and store of gemm_wgmma.cu's
 * k_gemm_wgmma, through wgmma.cuh; the tile's pipeline is fp8w_tile.cuh's fp8w_tile, which
 * moe_kernels.cu's grouped MoE GEMMs share, the tile's token rows named by an index array
 * in shared memory: here m0 + i, there a gather through the MoE plan's tok[]):
 *   - a block computes a 128 (tokens) x 128 (weight rows) tile of y with two warpgroups; the
 *     weight rows [128 blockIdx.y, +128) are one weight-scale block;
 *   - k runs in stages of 64 columns (one 128-byte swizzle row of bf16; two stages a scale
 *     block) through a 4-deep ring filled by cp.async: a stage holds the hi and lo token
 *     tiles (128 rows of 128 bytes each, K-major, 128-byte swizzled: what wgmma reads) and
 *     the weight tile's e4m3 codes (128 rows of 64 bytes, plain; ordinary byte loads when
 *     cols % 16 != 0 or w is not 16-byte aligned);
 *   - the codes of a stage are converted by all 256 threads into one of two bf16 weight
 *     tiles in the swizzled layout; warpgroup h issues, for tokens 64 h .. +64 and all 128
 *     weight rows, four k16 slices x two halves = eight wgmma.m64n128k16.bf16 into its
 *     partials (scale-d 0 on a scale block's first stage) and commits; while they run, the
 *     block waits for the next stage's copies, starts the copies FSTAGES - 1 stages ahead
 *     and converts the next stage's codes into the other bf16 tile (fence.proxy.async);
 *     then each warpgroup waits for its wgmmas and, after a scale block's second stage (or
 *     the last), promotes: acc += part * ws. Two barriers a stage (see k_gemm_fp8w).
 * Padded tokens and columns are zeros (the split's padding, cp.async's zero fill) and
 * padded outputs are not stored.
 *
 * wk_cuda_fp8w_mode(WK_FP8W_RS) runs fp8w_tile_rs instead (fp8w_tile.cuh): the conversion
 * in registers, the weights as wgmma's A operand from registers and the tokens its B operand
 * (the Marlin / Machete layout), one barrier a stage and a 5-deep ring. WK_FP8W_WF puts the
 * weight tiles fastest in the grid: the blocks resident at once then share a few token tiles
 * (hi + lo, 4 bytes an activation) and read the weights (1 byte an element) across, instead
 * of every token tile for a few weight tiles. Neither has run on a GPU yet.
 * What is not here yet: a producer warpgroup on TMA and mbarriers with a persistent grid
 * (gemm_wgmma.cu's k_gemm_wgmma_tma), a second set of partials so that promotion overlaps
 * the next stage's wgmmas, and any tuning on a GPU. The tensor-core work is twice
 * a bf16 GEMM's (the two halves). On the H200 fp8w_tile ran at 100 TFLOPS on 4096 x 7168 x
 * 2048 (13 % of cuBLASLt's bf16, about a fifth of its bound; not profiled); tests/tools/cuda_lab
 * times every mode beside cuBLASLt's bf16 GEMM when scripts/gpu-check runs. Under the emulator
 * (tests/simt/wgmma.cpp) the test checks the split, the swizzled bf16 layout, the
 * descriptors, the accumulator fragment and the promotion against our reading of the PTX
 * ISA; the hardware's own accumulation order and rounding inside a wgmma is not modelled.
 * The emulator reads a wgmma's operands at its issue and at its wait and aborts when they
 * differ, so converting into the tile being read, or dropping the barrier at the end of a
 * stage (the other tile whole before the next issue), fails there by name; reading a stage
 * before its copies' wait reads poison.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/fp8w_tile.cuh"

/* xb [2][n][colsp]: hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in f32), zeros past
 * cols. A thread an element, grid-stride. */
__global__ void k_act_split(uint16_t *xb, const float *x, int n, int cols, int colsp)
{
	size_t total = (size_t)n * colsp;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t t = i / (size_t)colsp;
		int c = (int)(i % (size_t)colsp);
		float v = c < cols ? x[t * (size_t)cols + c] : 0.0f;
		uint32_t hi, lo;
		bf16_split(v, &hi, &lo);
		xb[i] = (uint16_t)hi;
		xb[total + i] = (uint16_t)lo;
	}
}

/* A 128 x 128 tile of y = x . w^T: tokens [128 blockIdx.x, +128), weight rows
 * [128 blockIdx.y, +128), or (wf) the other way round (fp8w_tile, or fp8w_tile_rs when RS). */
template <bool VEC, bool RS>
__global__ void __launch_bounds__(FTHREADS, 1)
	k_gemm_fp8w(float *y, const uint16_t *xb, const uint8_t *w, const float *ws, int n,
		    int rows, int cols, bool wf)
{
	extern __shared__ uint4 fp8w_smem[];
	__shared__ int srow[FM];
	int m0 = (int)(wf ? blockIdx.y : blockIdx.x) * FM;
	int r0 = (int)(wf ? blockIdx.x : blockIdx.y) * FN;
	for (int i = (int)threadIdx.x; i < FM; i += FTHREADS)
		srow[i] = m0 + i < n ? m0 + i : -1;
	__syncthreads();
	constexpr int FILL = VEC ? FILL_ASYNC : FILL_BYTES;
	if constexpr (RS)
		fp8w_tile_rs<FILL>((uint8_t *)fp8w_smem, srow, y + (size_t)m0 * rows, n - m0, xb,
				   n, w, ws, r0, rows, cols, VEC);
	else
		fp8w_tile<FILL>((uint8_t *)fp8w_smem, srow, y + (size_t)m0 * rows, n - m0, xb, n,
				w, ws, r0, rows, cols, VEC);
}

static int fp8w_mode; /* wk_cuda_fp8w_mode */

extern "C" void wk_cuda_fp8w_mode(int mode)
{
	fp8w_mode = mode;
}

extern "C" int wk_cuda_fp8w_mode_now(void)
{
	return fp8w_mode;
}

template <bool VEC, bool RS>
static cudaError_t fp8w_launch(dim3 grid, float *y, const uint16_t *xb, const uint8_t *w,
			       const float *ws, int n, int rows, int cols, bool wf)
{
	int smem = RS ? FSMEM_RS : FSMEM;
	cudaError_t e = cudaFuncSetAttribute((k_gemm_fp8w<VEC, RS>),
					     cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	if (e == cudaSuccess)
		k_gemm_fp8w<VEC, RS><<<grid, FTHREADS, smem, wk_st()>>>(y, xb, w, ws, n, rows, cols,
									 wf);
	return e;
}

extern "C" int wk_cuda_act_split(uint16_t *xb, const float *x, int n, int cols, char *err,
				 size_t errsz)
{
	if (n < 0 || cols < 0 || cols > 0x7fffffff - FK)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA act_split: n %d, cols %d", n, cols);
	size_t total = (size_t)n * WK_CUDA_SPLIT_COLS(cols);
	if (total == 0)
		return WK_OK;
	unsigned nb = blocks(total, 256);
	k_act_split<<<nb < 8192 ? nb : 8192, 256, 0, wk_st()>>>(xb, x, n, cols, WK_CUDA_SPLIT_COLS(cols));
	return launched("act_split", err, errsz);
}

extern "C" int wk_cuda_gemm_fp8w(float *y, const uint16_t *xb, const uint8_t *w, const float *ws,
				 int n, int rows, int cols, char *err, size_t errsz)
{
	if (cols < 0 || cols > 0x7fffffff - FK || rows > 65535 * FN) /* gridDim.y <= 65535 */
		return wk_errf(err, errsz, WK_EINVAL, "CUDA gemm_fp8w: rows %d, cols %d", rows,
			       cols);
	if ((uintptr_t)xb % 16 != 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA gemm_fp8w: the split activations are not 16-byte aligned");
	if (n <= 0 || rows <= 0)
		return WK_OK;
	unsigned tt = (unsigned)(n / FM + (n % FM != 0)), wt = (unsigned)(rows / FN + (rows % FN != 0));
	bool wf = (fp8w_mode & WK_FP8W_WF) && tt <= 65535; /* gridDim.y */
	dim3 grid(wf ? wt : tt, wf ? tt : wt);
	bool vec = cols % 16 == 0 && (uintptr_t)w % 16 == 0, rs = fp8w_mode & WK_FP8W_RS;
	cudaError_t e =
		rs ? (vec ? fp8w_launch<true, true>(grid, y, xb, w, ws, n, rows, cols, wf)
			  : fp8w_launch<false, true>(grid, y, xb, w, ws, n, rows, cols, wf))
		   : (vec ? fp8w_launch<true, false>(grid, y, xb, w, ws, n, rows, cols, wf)
			  : fp8w_launch<false, false>(grid, y, xb, w, ws, n, rows, cols, wf));
	if (e != cudaSuccess)
		return check(e, "gemm_fp8w shared memory", err, errsz);
	return launched("gemm_fp8w", err, errsz);
}
