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
 * k_gemm_wgmma, through wgmma.cuh):
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
 * What is not here yet: a producer warpgroup on TMA and mbarriers with a persistent grid
 * (gemm_wgmma.cu's k_gemm_wgmma_tma), a second set of partials so that promotion overlaps
 * the next stage's wgmmas, the conversion in registers (weights as the A operand, the
 * Marlin/Machete layout), and any tuning on a GPU. The tensor-core work is twice
 * a bf16 GEMM's (the two halves). Nothing has run on a GPU yet: tests/tools/cuda_lab times it
 * beside cuBLASLt's bf16 GEMM when scripts/gpu-check runs on one. Under the emulator
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

/* f32 -> bf16 bits, nearest, ties to even (dt_f32_to_bf16); NaN stays NaN. */
__device__ __forceinline__ uint32_t bf16_rn(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (u >> 16) | 0x40u;
	return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

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
		uint32_t hi = bf16_rn(v);
		xb[i] = (uint16_t)hi;
		xb[total + i] = (uint16_t)bf16_rn(v - __uint_as_float(hi << 16));
	}
}

/* e4m3 code b -> bf16 bits, exact (dt_e4m3_to_f32's value; 0x7f / 0xff are NaN). The
 * magnitude is built as an f32 with exponent field e + 120 (bias 127 - 7); a subnormal
 * code (e == 0) is built as e == 1 and 2^-6 taken off, exact, so no f32 subnormal (and no
 * flush-to-zero) is involved. */
__device__ __forceinline__ uint32_t e4m3_bf16(uint32_t b)
{
	uint32_t em = b & 0x7fu, s = (b & 0x80u) << 8;
	float f = __uint_as_float(((em | (em < 8 ? 8u : 0u)) << 20) + (120u << 23));
	if (em < 8)
		f -= 0x1p-6f;
	return em == 0x7fu ? s | 0x7fc0u : s | (__float_as_uint(f) >> 16);
}

/* Fills stage st with columns [k0, k0 + 64): the hi and lo token rows [m0, m0 + 128) of xb
 * [2][n][colsp] (swizzled; zeros past n) and the codes of weight rows [r0, r0 + 128) of w
 * [rows][cols] (plain, 64 bytes a row; zeros outside). VEC: cols % 16 == 0 and w 16-byte
 * aligned, all by cp.async; else the weight codes by ordinary loads. */
template <bool VEC>
__device__ __forceinline__ void fill_stage(uint8_t *st, const uint16_t *xb, const uint8_t *w,
					   int m0, int n, int colsp, int r0, int rows, int k0,
					   int cols)
{
#pragma unroll
	for (int h = 0; h < 10; h++) {
		int c = (int)threadIdx.x + h * FTHREADS;
		if (c < 2 * FXT / 16) { /* a token chunk: half c / 1024, row, 8 bf16 */
			int half = c >> 10, row = (c >> 3) & 127, ch = c & 7, t = m0 + row;
			bool in = t < n;
			const uint16_t *src = xb + ((size_t)half * n + t) * colsp + k0 + ch * 8;
			cp_async16(st + half * FXT + wgmma_swz(row, ch * 16), in ? src : xb,
				   in ? 16 : 0);
		} else { /* a weight chunk: row, 16 codes */
			int cw = c - 2 * FXT / 16, row = cw >> 2, col = k0 + (cw & 3) * 16;
			int r = r0 + row;
			uint8_t *d = st + 2 * FXT + row * FK + (cw & 3) * 16;
			if (VEC) {
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

/* Stage j's pipeline: its wgmmas read slot j % FSTAGES and bf16 weight tile wb[j % 2]; while
 * they run, the block waits for stage j + 1's copies, starts stage j + FSTAGES - 1's into
 * the slot stage j - 1 used, and converts stage j + 1's codes into wb[(j + 1) % 2] (both
 * freed by stage j - 1's wgmmas, retired before the barrier that opens stage j's copies
 * wait); then waits for its own wgmmas, promotes after a scale block's second stage (or the
 * last), and a barrier makes wb[(j + 1) % 2] whole before stage j + 1 is issued. */
template <bool VEC>
__global__ void __launch_bounds__(FTHREADS, 1)
	k_gemm_fp8w(float *y, const uint16_t *xb, const uint8_t *w, const float *ws, int n,
		    int rows, int cols)
{
	extern __shared__ uint4 fp8w_smem[];
	uint8_t *raw = (uint8_t *)fp8w_smem;
	uint8_t *ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
	uint8_t *wb = ring + FSTAGES * FSTAGE; /* two bf16 weight tiles */
	int tid = (int)threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
	int m0 = (int)blockIdx.x * FM, r0 = (int)blockIdx.y * FN;
	int colsp = WK_CUDA_SPLIT_COLS(cols), stages = colsp / FK, kbs = (cols + 127) / 128;

	float acc[64], part[64];
#pragma unroll
	for (int i = 0; i < 64; i++)
		acc[i] = 0.0f;

#pragma unroll
	for (int s = 0; s < FSTAGES - 1; s++) {
		if (s < stages)
			fill_stage<VEC>(ring + s * FSTAGE, xb, w, m0, n, colsp, r0, rows, s * FK, cols);
		cp_async_commit();
	}
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
			fill_stage<VEC>(ring + ((j + FSTAGES - 1) % FSTAGES) * FSTAGE, xb, w, m0, n,
					colsp, r0, rows, (j + FSTAGES - 1) * FK, cols);
		cp_async_commit();
		if (j + 1 < stages)
			convert_weights(wb + ((j + 1) & 1) * FWB,
					ring + ((j + 1) % FSTAGES) * FSTAGE + 2 * FXT);
		fence_proxy_async(); /* stage j + 1's token tiles and weight tile */
		wgmma_wait<0>();
		if ((j & 1) || j == stages - 1) { /* the scale block's last stage: promote */
			float sw = ws[(size_t)blockIdx.y * kbs + j / 2];
#pragma unroll
			for (int i = 0; i < 64; i++) {
				wgmma_reg_fence(part[i]);
				acc[i] += part[i] * sw;
			}
		}
		__syncthreads(); /* wb[(j + 1) % 2] whole before stage j + 1 is issued */
	}
	wgmma_store_tile(y, acc, m0 + wg * 64 + warp * 16 + (lane >> 2), r0, lane & 3, n, rows);
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
	k_act_split<<<nb < 8192 ? nb : 8192, 256>>>(xb, x, n, cols, WK_CUDA_SPLIT_COLS(cols));
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
	dim3 grid((unsigned)(n / FM + (n % FM != 0)), (unsigned)(rows / FN + (rows % FN != 0)));
	bool vec = cols % 16 == 0 && (uintptr_t)w % 16 == 0;
	cudaError_t e = vec ? cudaFuncSetAttribute(k_gemm_fp8w<true>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, FSMEM)
			    : cudaFuncSetAttribute(k_gemm_fp8w<false>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize, FSMEM);
	if (e != cudaSuccess)
		return check(e, "gemm_fp8w shared memory", err, errsz);
	if (vec)
		k_gemm_fp8w<true><<<grid, FTHREADS, FSMEM>>>(y, xb, w, ws, n, rows, cols);
	else
		k_gemm_fp8w<false><<<grid, FTHREADS, FSMEM>>>(y, xb, w, ws, n, rows, cols);
	return launched("gemm_fp8w", err, errsz);
}
