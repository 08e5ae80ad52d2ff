/*
 * kernels.cu - the CUDA kernels of cuda_kernels.h, first versions (see there), but for the GLM
 * families' (glm_kernels.cu) and attention (attention.cu); the helpers they share are in
 * cuda_int.cuh. Each kernel's
 * comment names its CPU reference; tests/unit/test_cuda*.c compare them on random inputs
 * wherever a GPU is present.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
#include "kernels/cuda/gemv.cuh"

/* ---- memory ----------------------------------------------------------------------------- */

extern "C" int wk_cuda_alloc(void **p, size_t bytes, char *err, size_t errsz)
{
	*p = NULL;
	return check(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc", err, errsz);
}

extern "C" int wk_cuda_set_device(int d, char *err, size_t errsz)
{
	return check(cudaSetDevice(d), "set device", err, errsz);
}

extern "C" void wk_cuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

extern "C" int wk_cuda_upload(void *dst, const void *src, size_t bytes, char *err, size_t errsz)
{
	return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload", err, errsz);
}

extern "C" int wk_cuda_download(void *dst, const void *src, size_t bytes, char *err,
				size_t errsz)
{
	return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download", err, errsz);
}

extern "C" int wk_cuda_sync(char *err, size_t errsz)
{
	return check(cudaDeviceSynchronize(), "kernel", err, errsz);
}

extern "C" int wk_cuda_zero(void *y, size_t bytes, char *err, size_t errsz)
{
	if (bytes == 0)
		return WK_OK;
	return check(cudaMemsetAsync(y, 0, bytes, wk_st()), "zero", err, errsz);
}

/* ---- matmul (cpu_ref_matmul, cpu_ref_matmul_fp8): the decode GEMV of gemv.cuh --------------- */

/* Every weight of s in T: wk_cuda_matmul, wk_cuda_matmul_fp8, and wk_cuda_matmul_n when
 * its weights share a dtype (the usual case). Launched as a programmatic dependent (mm_pdl):
 * its blocks may start while the kernel before is ending and load their first weights
 * then; and it lets the next such launch start at once (grid_dep_launch: that one waits
 * for this one's end before it reads x or writes y, whatever it was allowed). */
template <typename T, int NT>
__global__ void __launch_bounds__(MM_THREADS, MM_MINB(NT))
	k_matmul(struct mm_set s, const float *x, int n)
{
	__shared__ float red[MM_THREADS];
	grid_dep_launch();
	struct mm_at a = mm_where(s, (int)blockIdx.x);
	const struct wk_mm *p = &s.p[a.k];
	mm_rows<T, NT, false, true>(p->y, x, (const T *)p->w, p->scale, n, p->rows, s.cols, a.g, a.tl, a.tt,
		       a.live, red, p);
}

/* wk_cuda_matmul_n over weights of several dtypes (mm_mixed). The four paths together need
 * more registers than one, so this kernel is not held to k_matmul's register bound. */
template <int NT>
__global__ void __launch_bounds__(MM_THREADS, 1) k_matmul_mixed(struct mm_set s, const float *x, int n)
{
	__shared__ float red[MM_THREADS];
	mm_mixed<NT, false>(s, x, n, (int)blockIdx.x, red);
}

/* k_matmul's and k_gemv_mma3's launches are programmatic dependents (PDL) unless
 * wk_cuda_set_pdl(0) */
static int mm_pdl = 1;

cudaStream_t wk_compute_stream = 0;

extern "C" void wk_cuda_set_stream(int per_thread)
{
	wk_compute_stream = per_thread ? cudaStreamPerThread : (cudaStream_t)0;
}

extern "C" void wk_cuda_set_pdl(int on)
{
	mm_pdl = on != 0;
}

template <typename T, int NT>
static cudaError_t launch_nt(const struct mm_set &s, unsigned b, const float *x, int n)
{
	cudaLaunchAttribute at;
	cudaLaunchConfig_t cfg = pdl_config(b, MM_THREADS, mm_pdl, &at, wk_st());
	return cudaLaunchKernelEx(&cfg, (k_matmul<T, NT>), s, x, n);
}

template <typename T>
static cudaError_t launch_one(const struct mm_set &s, unsigned b, const float *x, int n)
{
	switch (mm_nt(n)) {
	case 1: return launch_nt<T, 1>(s, b, x, n);
	case 2: return launch_nt<T, 2>(s, b, x, n);
	case 4: return launch_nt<T, 4>(s, b, x, n);
	default: return launch_nt<T, MM_NT>(s, b, x, n);
	}
}

/* Launches the set (parts checked by the caller); nothing when it has no rows or n <= 0. */
static int mm_launch(const struct wk_mm *parts, int count, const float *x, int n, int cols,
		     const char *what, char *err, size_t errsz)
{
	struct mm_set s;
	bool mixed;
	mm_build(&s, parts, count, cols, &mixed);
	if (n <= 0 || s.bstart[count] == 0)
		return WK_OK;
	unsigned b = (unsigned)s.bstart[count];
	if (mixed) {
		switch (mm_nt(n)) {
		case 1: k_matmul_mixed<1><<<b, MM_THREADS, 0, wk_st()>>>(s, x, n); break;
		case 2: k_matmul_mixed<2><<<b, MM_THREADS, 0, wk_st()>>>(s, x, n); break;
		case 4: k_matmul_mixed<4><<<b, MM_THREADS, 0, wk_st()>>>(s, x, n); break;
		default: k_matmul_mixed<MM_NT><<<b, MM_THREADS, 0, wk_st()>>>(s, x, n); break;
		}
	} else {
		cudaError_t e;
		switch (parts[0].dtype) {
		case DT_F32: e = launch_one<float>(s, b, x, n); break;
		case DT_BF16: e = launch_one<__nv_bfloat16>(s, b, x, n); break;
		case DT_F16: e = launch_one<__half>(s, b, x, n); break;
		default: e = launch_one<__nv_fp8_e4m3>(s, b, x, n); break;
		}
		if (e != cudaSuccess) {
			cudaGetLastError(); /* read, so that the next call does not see it */
			return check(e, what, err, errsz);
		}
	}
	return launched(what, err, errsz);
}

extern "C" int wk_cuda_matmul_n(const struct wk_mm *parts, int count, const float *x, int n,
				int cols, char *err, size_t errsz)
{
	int rc = mm_check(parts, count, err, errsz);
	if (rc != WK_OK)
		return rc;
	return mm_launch(parts, count, x, n, cols, "matmul_n", err, errsz);
}

extern "C" int wk_cuda_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n,
			      int rows, int cols, char *err, size_t errsz)
{
	if (n <= 0 || rows <= 0)
		return WK_OK;
	if (wt != DT_F32 && wt != DT_BF16 && wt != DT_F16)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "CUDA matmul: weights in %s",
			       dt_name(wt));
	struct wk_mm p = {y, w, NULL, wt, rows, NULL, 0, 0, 0, 0, 0};
	return mm_launch(&p, 1, x, n, cols, "matmul", err, errsz);
}

extern "C" int wk_cuda_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale,
				  int n, int rows, int cols, char *err, size_t errsz)
{
	if (n <= 0 || rows <= 0)
		return WK_OK;
	struct wk_mm p = {y, w, scale, DT_F8_E4M3, rows, NULL, 0, 0, 0, 0, 0};
	return mm_launch(&p, 1, x, n, cols, "matmul_fp8", err, errsz);
}

__global__ void k_late_copy(float *x, const float *src, size_t n, unsigned ns)
{
	grid_dep_launch(); /* the GEMV after it may start now */
#ifndef WICK_SIMT /* the emulator runs launches one after another: nothing to wait out */
	for (unsigned t = 0; t < ns; t += 1000)
		__nanosleep(1000);
#else
	(void)ns;
#endif
	for (size_t i = threadIdx.x; i < n; i += blockDim.x)
		x[i] = src[i];
}

extern "C" int wk_cuda_late_copy(float *x, const float *src, size_t n, unsigned ns, char *err,
				 size_t errsz)
{
	k_late_copy<<<1, 256, 0, wk_st()>>>(x, src, n, ns);
	return launched("late_copy", err, errsz);
}

/* ---- gemv_mma: the decode GEMV of up to 8 tokens on tensor cores (the lab's v2) ------------
 *
 * Run on an H200 (2026-12-04, x scaled by 2^100 then, 2^64 since; the backend's GEMV of
 * 2..8 tokens since that run): gemv_mma_matches_ref
 * and gemv_mma_every_e4m3_code pass there, and the lab measured, of the 4,250 GB/s copy, at
 * 8 tokens: FP8 18432x7168 60 %, 7168x18432 70 %, 7168x2048 37 %, 2048x7168 33 %; bf16
 * 18432x7168 78 %, 7168x18432 78 %, 7168x2048 54 %, 2048x7168 49 % (v1: 13-30 %); at 1
 * token about v1's (FP8 38-78 %, bf16 57-89 %). The small shapes (14.7 MB, ~9 us a call)
 * are latency-bound: a warp loads, then computes, with no load of its next step in
 * flight. Tried and measured worse: 64 rows a warp for FP8 (164 registers, 8 warps an SM):
 * 18432x7168 at 1 token 73 % -> 61 %.
 *
 * The lab measured v1 on an H200 at 13-30 % of the copy bandwidth for 8 tokens: there each
 * weight takes 8 f32 FMAs plus its share of x's loads, by count ~9 instructions a byte, past
 * what the schedulers issue at HBM rate (~0.25 warp instructions a byte over the chip, so
 * the aim is <= ~0.15). Here a warp's 16 RT rows times 8 tokens are RT mma.sync.m16n8k16
 * (bf16 in, f32 out) per 16 columns: the weights as A, the tokens as B, each x split in two
 * bf16, hi = bf16(x) and lo = bf16(x - hi), and multiplied twice (|x - hi - lo| <= 2^-16 |x|,
 * as gemm_fp8w.cu does), so the result keeps f32's accuracy to ~1e-5 of the largest output.
 * What each mma costs in other instructions, per lane:
 *   - x: one 16-byte load of 4 floats of token g and its split by cvt.rn.bf16x2.f32 (hi;
 *     then x - hi, exact, rounded again: lo), ~13 instructions, shared by the RT tiles;
 *   - e4m3 weights: widened to bf16 by integers, prmt + shift + and a pair (e4m3x2_bf16 in
 *     gemv.cuh: exactly the value times 2^-120, subnormals included), 12 a tile; bf16
 *     weights are A as loaded.
 * The 2^-120 would leave the f32 sums of small products near f32's subnormals, so FP8's x is
 * scaled by GM_XS = 2^64 before the split (exact; |x| up to 2^63 stays finite in bf16: the
 * H200 run had 2^100, which overflowed past |x| = 2^27, an activation GLM can reach in
 * principle) and the block's scale by 2^56 after: every product is its true value times
 * 2^-56, normal in f32 down to true values of 2^-70. A GPU that
 * flushed bf16 subnormal inputs would lose the e4m3 subnormals (|w| < 2^-6): the test
 * gemv_mma_every_e4m3_code (tests/unit/test_cuda.c) checks each of the 254 codes exactly.
 *
 * A dot product does not care in which order its columns come, so the fragment's k order is
 * chosen to fit 16-byte loads: lane (g, q) of a warp streams columns 16q .. 16q + 15 of each
 * 64-column step of its rows g + 8i (i < 2 RT), and its four k slots of mma j (0..3) are
 * columns 16q + 4j .. 16q + 4j + 3 (slots 2q, 2q + 1 the first two, 2q + 8, 2q + 9 the
 * others); B's matching slots are x[g][the same columns] (token g, one float4). Rows past
 * the end and tokens past n repeat the last (their sums are never stored).
 *
 * A block of W warps (16 where there are few row groups, else 8) takes 16 RT rows (RT = 2,
 * 32 rows, when there are >= 132 such groups, else 1), each warp a run of 128-column blocks
 * (one weight-scale block: its two steps' products are promoted with the block's scale),
 * loading NB blocks' weights before using any (ld.global.nc, no L1: x lives there; 4 KB a
 * warp in flight, 8 KB for bf16 at RT = 2: FP8 at RT = 2 with two blocks in flight spilled
 * at 128 registers); the warps' sums meet in shared memory, added in warp order.
 *
 * Instructions per weight byte, counted in sm_90a SASS (cuobjdump -sass) over the main loop
 * (the longest backward branch's body holding the HMMAs, NOPs left out) over the bytes one
 * pass of it reads: FP8 RT = 2 409 / 4096 = 0.10, RT = 1 558 / 4096 = 0.14; bf16 RT = 2
 * 300 / 8192 = 0.037, RT = 1 188 / 4096 = 0.046. The first version of this kernel (16 rows,
 * an integer bf16 split of x per mma, e4m3 -> f16 -> f32 -> bf16): FP8 1630 / 4096 = 0.40,
 * bf16 872 / 4096 = 0.21. Registers (ptxas): FP8 108 (RT 2), 124 (RT 1); bf16 128, 92; no
 * spills. */
#define GM_MAXW 16
#define GM_THREADS 512 /* GM_MAXW warps */
#define GM_XS 0x1p64f /* FP8: x's scale before the split */
#define GM_WS 0x1p56f /* FP8: 1 / (GM_E4M3_BF16 GM_XS), on the block's scale */

/* B's registers from token g's 4 floats at xp: hi = bf16(x), lo = bf16(x - hi), x scaled by
 * xs first; CO: x read with plain loads, not the read-only path (ld_x4's: a programmatic
 * dependent, v3, whose x the kernel before wrote while it was already resident) */
template <bool CO = false>
__device__ __forceinline__ void gm_x(uint32_t hi[2], uint32_t lo[2], const float *xp, float xs)
{
	float f[4];
	ld_x4<CO>(f, xp);
#pragma unroll
	for (int e = 0; e < 4; e++)
		f[e] *= xs;
#pragma unroll
	for (int h = 0; h < 2; h++) {
		hi[h] = bf16x2_rn(f[2 * h + 1], f[2 * h]);
		lo[h] = bf16x2_rn(f[2 * h + 1] - __uint_as_float(hi[h] & 0xffff0000u),
				  f[2 * h] - __uint_as_float(hi[h] << 16));
	}
}

/* a[0..3] of mma j from the lane's two rows' chunks: e4m3 (one uint4 a row a step: word j is
 * columns 4j .. 4j + 3; the first two are slots 2q, 2q + 1) */
__device__ __forceinline__ void gm_a(uint32_t a[4], const uint4 *ra, const uint4 *rb, int j,
				     const __nv_fp8_e4m3 *)
{
	uint32_t ua = word_of(ra[0], j), ub = word_of(rb[0], j);
	a[0] = e4m3x2_bf16(ua, 0x9180u);
	a[1] = e4m3x2_bf16(ub, 0x9180u);
	a[2] = e4m3x2_bf16(ua, 0xb3a2u);
	a[3] = e4m3x2_bf16(ub, 0xb3a2u);
}

/* bf16 (two uint4 a row a step: columns 4j .. 4j + 3 are words 2j and 2j + 1) */
__device__ __forceinline__ void gm_a(uint32_t a[4], const uint4 *ra, const uint4 *rb, int j,
				     const __nv_bfloat16 *)
{
	a[0] = word_of(ra[j >> 1], (2 * j) & 3);
	a[1] = word_of(rb[j >> 1], (2 * j) & 3);
	a[2] = word_of(ra[j >> 1], (2 * j + 1) & 3);
	a[3] = word_of(rb[j >> 1], (2 * j + 1) & 3);
}

/* The warps' sums of a block's 16 RT rows x 8 tokens met in shared memory red (a row of
 * 16 RT x 8 floats a warp), added in warp order, and stored: y[t][r0 + r] for the rows and
 * tokens that exist. Every thread of the block calls it (it synchronises). Tile t of a
 * lane's acc: d[0], d[1] row 16t + g, tokens 2q and 2q + 1; d[2], d[3] row 16t + g + 8. */
template <int RT>
__device__ __forceinline__ void gm_store(float (*red)[16 * RT * 8], const float (&acc)[RT][4],
					 float *y, int n, int rows, int r0, int warp, int g, int q)
{
	constexpr int M = 16 * RT;
#pragma unroll
	for (int t = 0; t < RT; t++) {
		red[warp][(16 * t + g) * 8 + 2 * q] = acc[t][0];
		red[warp][(16 * t + g) * 8 + 2 * q + 1] = acc[t][1];
		red[warp][(16 * t + g + 8) * 8 + 2 * q] = acc[t][2];
		red[warp][(16 * t + g + 8) * 8 + 2 * q + 1] = acc[t][3];
	}
	__syncthreads();
	int nw = (int)blockDim.x >> 5;
	for (int i = (int)threadIdx.x; i < M * 8; i += (int)blockDim.x) {
		int r = i / 8, t = i % 8;
		float s = 0.0f;
		for (int k = 0; k < nw; k++)
			s += red[k][i];
		if (t < n && r0 + r < rows)
			y[(size_t)t * rows + r0 + r] = s;
	}
}

template <typename T, int RT>
__global__ void __launch_bounds__(GM_THREADS, 1)
	k_gemv_mma(float *y, const float *x, const T *w, const float *scale, int n, int rows,
		   int cols, int per_warp)
{
	constexpr bool FP8 = mm_fp8<T>::v;
	constexpr int U = FP8 ? 1 : 2;  /* uint4 a row a 64-column step */
	constexpr int NB = FP8 && RT == 1 ? 2 : 1; /* 128-column blocks loaded at once: 4 KB a
						     * warp, 8 KB for bf16 at RT = 2 */
	constexpr int R = 2 * RT;       /* the lane's rows, g + 8i */
	constexpr int M = 16 * RT;      /* the block's rows */
	__shared__ float red[GM_MAXW][M * 8];
	const T *tag = NULL;
	int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	int r0 = (int)blockIdx.x * M, kb = cols / 128;
	int b0 = warp * per_warp, b1 = b0 + per_warp < kb ? b0 + per_warp : kb;
	/* a row past the end reads the last row, a token past n the last token: their sums land
	 * in rows and columns of D that are never stored (an mma's row r of D is row r of A
	 * times B, its column t A times column t of B), and no branch or zeroing is spent */
	const uint8_t *wr[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		wr[r] = (const uint8_t *)w +
			((size_t)min(r0 + g + 8 * r, rows - 1) * cols + 16 * q) * sizeof(T);
	const float *xg = x + (size_t)min(g, n - 1) * cols + 16 * q;
	const float *sc = scale + (size_t)(r0 / FP8_BLOCK) * kb;
	const float xs = FP8 ? GM_XS : 1.0f;
	float acc[RT][4];
#pragma unroll
	for (int t = 0; t < RT; t++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[t][e] = 0.0f;
	for (int b = b0; b < b1; b += NB) {
		uint4 c[NB][2][R][U]; /* [block][step][row][piece] */
#pragma unroll
		for (int i = 0; i < NB; i++)
#pragma unroll
			for (int st = 0; st < 2; st++)
#pragma unroll
				for (int r = 0; r < R; r++)
#pragma unroll
					for (int u = 0; u < U; u++) {
						/* a block past the run (NB = 2) reads the run's last again:
						 * its products are scaled by 0 below */
						int bi = min(b + i, b1 - 1);
						size_t at = ((size_t)bi * 128 + st * 64) * sizeof(T) + u * 16;
						c[i][st][r][u] = ld_stream16(wr[r] + at);
					}
#pragma unroll
		for (int i = 0; i < NB; i++) {
			float p[RT][4];
#pragma unroll
			for (int t = 0; t < RT; t++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					p[t][e] = 0.0f;
#pragma unroll
			for (int st = 0; st < 2; st++)
#pragma unroll
				for (int j = 0; j < 4; j++) {
					uint32_t hi[2], lo[2];
					gm_x(hi, lo, xg + (size_t)min(b + i, b1 - 1) * 128 + st * 64 + 4 * j,
					     xs);
#pragma unroll
					for (int t = 0; t < RT; t++) {
						uint32_t a[4];
						gm_a(a, c[i][st][2 * t], c[i][st][2 * t + 1], j, tag);
						mma_bf16_16816(p[t], a, hi);
						mma_bf16_16816(p[t], a, lo);
					}
				}
			float s = FP8 ? (b + i < b1 ? sc[b + i] * GM_WS : 0.0f) : 1.0f;
#pragma unroll
			for (int t = 0; t < RT; t++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[t][e] += FP8 ? p[t][e] * s : p[t][e];
		}
	}
	gm_store<RT>(red, acc, y, n, rows, r0, warp, g, q);
}

template <typename T>
static void gm_launch(float *y, const float *x, const T *w, const float *scale, int n, int rows,
		      int cols)
{
	/* 32 rows a block where that still gives a block to each of the 132 multiprocessors;
	 * 16 warps a block where the blocks are fewer than that (2048 rows: 128), else 8; never
	 * more warps than 128-column blocks */
	int rt = (rows + 31) / 32 >= 132 ? 2 : 1;
	int groups = (rows + 16 * rt - 1) / (16 * rt), kb = cols / 128;
	int wpb = groups < 132 ? GM_MAXW : 8;
	if (wpb > kb)
		wpb = kb;
	int per = (kb + wpb - 1) / wpb;
	wpb = (kb + per - 1) / per;
	if (rt == 2)
		k_gemv_mma<T, 2><<<groups, wpb * 32, 0, wk_st()>>>(y, x, w, scale, n, rows, cols, per);
	else
		k_gemv_mma<T, 1><<<groups, wpb * 32, 0, wk_st()>>>(y, x, w, scale, n, rows, cols, per);
}

/* The contract of wk_cuda_gemv_mma and _mma3 (what names the caller): WK_OK or WK_EINVAL. */
static int gm_check(const char *what, const float *x, const void *w, enum dt_type wt,
		    const float *scale, int n, int rows, int cols, char *err, size_t errsz)
{
	if ((wt != DT_BF16 && wt != DT_F8_E4M3) || n < 1 || n > 8 || rows < 0 || cols <= 0 ||
	    cols % 128 || ((uintptr_t)x | (uintptr_t)w) % 16 || (wt == DT_F8_E4M3 && !scale))
		return wk_errf(err, errsz, WK_EINVAL,
			       "CUDA %s: %s weights, %d tokens, %d x %d (bf16 or FP8, 1..8 "
			       "tokens, cols a multiple of 128, 16-byte aligned)", what, dt_name(wt),
			       n, rows, cols);
	return WK_OK;
}

extern "C" int wk_cuda_gemv_mma(float *y, const float *x, const void *w, enum dt_type wt,
				const float *scale, int n, int rows, int cols, char *err,
				size_t errsz)
{
	int rc = gm_check("gemv_mma", x, w, wt, scale, n, rows, cols, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (rows == 0)
		return WK_OK;
	if (wt == DT_F8_E4M3)
		gm_launch(y, x, (const __nv_fp8_e4m3 *)w, scale, n, rows, cols);
	else
		gm_launch(y, x, (const __nv_bfloat16 *)w, scale, n, rows, cols);
	return launched("gemv_mma", err, errsz);
}

/* ---- gemv_mma3: v2 software-pipelined (the lab's v3; not yet run on a GPU) -------------------
 *
 * What: v2's math exactly (the same fragments, gm_x's hi/lo split of x, gm_a's e4m3 widening,
 * GM_XS and GM_WS, a block's two steps summed in p and promoted with its scale, the warps'
 * sums met in shared memory in warp order), so its results equal v2's bit for bit wherever
 * the warps' runs of blocks are the same, and are otherwise only added in another grouping.
 * Three things differ, all aimed at v2's small shapes (7168x2048, 2048x7168: 33-37 % of the
 * copy for FP8 at 8 tokens, ~9-11 us a call where the copy takes 3.5 us):
 *   - pipelined: a warp's run of 64-column steps is streamed through two register stages
 *     of NS steps each (double-buffered, indexed only by constants: the loop is unrolled
 *     two stages a pass); the loads of the next stage are issued before the mmas of the
 *     current one, so every warp has weights in flight while it computes, where v2 loaded
 *     NB blocks and then waited for them with nothing else in flight. A block's scale is
 *     loaded with its second step's weights, not beside the mmas;
 *   - the grid: as many warps a block as still lets every row group be resident at once
 *     (16 warps an SM at <= 128 registers, 132 SMs: the largest W with floor(16 / W) x 132 >=
 *     groups, never more than the 128-column blocks), so a small matrix still fills the
 *     chip (7168x2048: 8 warps, 224 blocks of 32 rows in one wave; 2048x7168: 14 warps of 4
 *     blocks, 128 blocks of 16 rows; 18432x7168: 3 warps of 19 blocks, 576 blocks in one
 *     wave where v2's 8-warp blocks took 2.2 waves);
 *   - a programmatic dependent (PDL, as v1; off with wk_cuda_set_pdl(0)): the first stage's
 *     weights and scales are loaded before grid_dep_wait, x is read and y written after it,
 *     so that back-to-back calls overlap one call's tail and the next one's launch and
 *     first loads; x with plain loads (gm_x<true>), not the read-only path, since the
 *     kernel before may write it while this grid is resident. The lab prints v3 both ways
 *     ("v3 no PDL") to tell the two effects apart.
 * A stage is NS = 4 / (RT U) steps, 8 uint4 a lane whatever the dtype and RT (32 registers,
 * 4 KB a warp: FP8 RT = 2 two steps, RT = 1 four; bf16 RT = 2 one, RT = 1 two), v2's NB
 * blocks' worth, so 4 KB a warp is in flight while it computes on the 4 KB before. ptxas
 * (13.0, sm_90a, the cap of 128 that launch bounds of 512 threads set): FP8 125 registers
 * (RT 2), 122 (RT 1); bf16 121, 110; no spills, no stack frame (x through the read-only
 * path instead: 120, 118, 120, 106; FP8 RT = 2 so with stages of one step: 96). The SASS of
 * the loop is not counted: no cuobjdump on the build machine.
 * Expected (a guess until the H200 runs the lab's v3 rows): the small shapes gain most
 * (all of a warp's 2..4 blocks in flight from its start, the next call's blocks loading
 * while this one ends); 2048x7168 keeps RT = 1, its x read from L2 twice its weight bytes,
 * which a k split over a 2-CTA cluster (RT = 2, the halves' sums met over distributed
 * shared memory) would halve: not done here. */
#define GM3_SMS 132  /* H200's multiprocessors: the grid's target */
#define GM3_WARPS_SM 16 /* warps an SM holds at <= 128 registers a thread */

template <typename T, int RT> struct gm3_ns {
	static constexpr int v = 4 / (RT * (mm_fp8<T>::v ? 1 : 2));
};

/* a stage: NS steps of the lane's 2 RT rows (U uint4 a row a step), the scales (times GM_WS)
 * of the blocks whose second step is among them */
template <typename T, int RT, int NS> struct gm3_stage {
	uint4 w[NS][2 * RT][mm_fp8<T>::v ? 1 : 2];
	float s[NS];
};

/* c = steps k .. k + NS - 1 of the lane's rows wr (those before k1, the run's end); par: k's
 * parity (a constant: a step is a block's second where (par + i) is odd) */
template <typename T, int RT, int NS>
__device__ __forceinline__ void gm3_load(gm3_stage<T, RT, NS> &c, const uint8_t *const *wr,
					 const float *sc, int k, int k1, int par)
{
	constexpr int U = mm_fp8<T>::v ? 1 : 2;
#pragma unroll
	for (int i = 0; i < NS; i++)
		if (k + i < k1) {
#pragma unroll
			for (int r = 0; r < 2 * RT; r++)
#pragma unroll
				for (int u = 0; u < U; u++)
					c.w[i][r][u] = ld_stream16(wr[r] + (size_t)(k + i) * 64 * sizeof(T) +
								   u * 16);
			if (mm_fp8<T>::v && ((par + i) & 1))
				c.s[i] = sc[(k + i) >> 1] * GM_WS;
		}
}

/* p += stage c's products (the steps before k1); at a block's second step acc += p times the
 * block's scale, p = 0 (v2's order of additions) */
template <typename T, int RT, int NS>
__device__ __forceinline__ void gm3_mma(float (&acc)[RT][4], float (&p)[RT][4],
					const gm3_stage<T, RT, NS> &c, const float *xg, int k, int k1,
					int par)
{
	constexpr bool FP8 = mm_fp8<T>::v;
	const T *tag = NULL;
#pragma unroll
	for (int i = 0; i < NS; i++)
		if (k + i < k1) {
#pragma unroll
			for (int j = 0; j < 4; j++) {
				uint32_t hi[2], lo[2];
				gm_x<true>(hi, lo, xg + (size_t)(k + i) * 64 + 4 * j, FP8 ? GM_XS : 1.0f);
#pragma unroll
				for (int t = 0; t < RT; t++) {
					uint32_t a[4];
					gm_a(a, c.w[i][2 * t], c.w[i][2 * t + 1], j, tag);
					mma_bf16_16816(p[t], a, hi);
					mma_bf16_16816(p[t], a, lo);
				}
			}
			if ((par + i) & 1) {
#pragma unroll
				for (int t = 0; t < RT; t++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						acc[t][e] += FP8 ? p[t][e] * c.s[i] : p[t][e];
						p[t][e] = 0.0f;
					}
			}
		}
}

template <typename T, int RT>
__global__ void __launch_bounds__(GM_THREADS, 1)
	k_gemv_mma3(float *y, const float *x, const T *w, const float *scale, int n, int rows,
		    int cols, int per_warp)
{
	constexpr int NS = gm3_ns<T, RT>::v;
	constexpr int R = 2 * RT, M = 16 * RT;
	__shared__ float red[GM_MAXW][M * 8];
	grid_dep_launch();
	int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	int r0 = (int)blockIdx.x * M, kb = cols / 128;
	int b0 = warp * per_warp, b1 = b0 + per_warp < kb ? b0 + per_warp : kb;
	int k0 = 2 * b0, k1 = 2 * b1; /* the warp's 64-column steps */
	const uint8_t *wr[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		wr[r] = (const uint8_t *)w +
			((size_t)min(r0 + g + 8 * r, rows - 1) * cols + 16 * q) * sizeof(T);
	const float *xg = x + (size_t)min(g, n - 1) * cols + 16 * q;
	const float *sc = scale + (size_t)(r0 / FP8_BLOCK) * kb;
	float acc[RT][4], p[RT][4];
#pragma unroll
	for (int t = 0; t < RT; t++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[t][e] = p[t][e] = 0.0f;
	/* zeroed only so that no path reads an unset register (a stage past k1 is never used) */
	gm3_stage<T, RT, NS> c0 = {}, c1 = {};
	gm3_load(c0, wr, sc, k0, k1, 0); /* weights and scales: no earlier kernel writes them */
	grid_dep_wait();
	/* each pass: stage c1's loads, c0's mmas, c0's next loads, c1's mmas (k even at each
	 * pass: a run starts at a block) */
	for (int k = k0; k < k1; k += 2 * NS) {
		gm3_load(c1, wr, sc, k + NS, k1, NS & 1);
		gm3_mma(acc, p, c0, xg, k, k1, 0);
		gm3_load(c0, wr, sc, k + 2 * NS, k1, 0);
		gm3_mma(acc, p, c1, xg, k + NS, k1, NS & 1);
	}
	gm_store<RT>(red, acc, y, n, rows, r0, warp, g, q);
}

template <typename T, int RT>
static cudaError_t gm3_launch_rt(unsigned groups, int wpb, float *y, const float *x,
				 const T *w, const float *scale, int n, int rows, int cols, int per)
{
	cudaLaunchAttribute at;
	cudaLaunchConfig_t cfg = pdl_config(groups, (unsigned)wpb * 32, mm_pdl, &at, wk_st());
	return cudaLaunchKernelEx(&cfg, (k_gemv_mma3<T, RT>), y, x, w, scale, n, rows, cols, per);
}

template <typename T>
static cudaError_t gm3_launch(float *y, const float *x, const T *w, const float *scale, int n,
			      int rows, int cols)
{
	/* v2's rows a block; then the most warps a block with which every block is resident at
	 * once (floor(16 / W) blocks an SM), never more than the 128-column blocks, and each
	 * warp a run of `per` of them */
	int rt = (rows + 31) / 32 >= GM3_SMS ? 2 : 1;
	int groups = (rows + 16 * rt - 1) / (16 * rt), kb = cols / 128;
	int wpb = GM_MAXW;
	while (wpb > 1 && GM3_WARPS_SM / wpb * GM3_SMS < groups)
		wpb--;
	if (wpb > kb)
		wpb = kb;
	int per = (kb + wpb - 1) / wpb;
	wpb = (kb + per - 1) / per;
	if (rt == 2)
		return gm3_launch_rt<T, 2>((unsigned)groups, wpb, y, x, w, scale, n, rows, cols, per);
	return gm3_launch_rt<T, 1>((unsigned)groups, wpb, y, x, w, scale, n, rows, cols, per);
}

extern "C" int wk_cuda_gemv_mma3(float *y, const float *x, const void *w, enum dt_type wt,
				 const float *scale, int n, int rows, int cols, char *err,
				 size_t errsz)
{
	int rc = gm_check("gemv_mma3", x, w, wt, scale, n, rows, cols, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (rows == 0)
		return WK_OK;
	cudaError_t e = wt == DT_F8_E4M3
				? gm3_launch(y, x, (const __nv_fp8_e4m3 *)w, scale, n, rows, cols)
				: gm3_launch(y, x, (const __nv_bfloat16 *)w, scale, n, rows, cols);
	if (e != cudaSuccess) {
		cudaGetLastError(); /* read, so that the next call does not see it */
		return check(e, "gemv_mma3 launch", err, errsz);
	}
	return launched("gemv_mma3", err, errsz);
}

/* ---- rmsnorm (cpu_ref_rmsnorm): one block per row ------------------------------------------ */

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps)
{
	grid_dep_launch(); /* a GEMV after it may start (kernels before a GEMV do this) */
	row_rmsnorm(y + (size_t)blockIdx.x * dim, x + (size_t)blockIdx.x * dim, w, dim, eps);
}

extern "C" int wk_cuda_rmsnorm(float *y, const float *x, const float *w, int n, int dim,
			       float eps, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_rmsnorm<<<n, 256, 0, wk_st()>>>(y, x, w, dim, eps);
	return launched("rmsnorm", err, errsz);
}

/* ---- FP8 activations (cpu_ref_act_quant): one warp per token and 128-channel block ------- */

/* (e4m3_round, e4m3_code and act_block, the quantizer's arithmetic, are in cuda_int.cuh:
 * cast_n's FP8 stores run it too) */

__global__ void k_act_quant(float *y, const float *x, int n, int cols)
{
	int g = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	int nb = (cols + 127) / 128, m;
	if (g >= n * nb)
		return;
	size_t at;
	float s = act_block(x, cols, nb, g, lane, &at, &m);
	for (int c = lane; c < m; c += 32)
		y[at + c] = e4m3_round(x[at + c] / s) * s;
}

/* The same quantization kept as e4m3 codes and scales, what the FP8 GEMMs read. */
__global__ void k_act_codes(uint8_t *xq, float *xs, const float *x, int n, int cols)
{
	int g = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	int nb = (cols + 127) / 128, m;
	if (g >= n * nb)
		return;
	size_t at;
	float s = act_block(x, cols, nb, g, lane, &at, &m);
	for (int c = lane; c < m; c += 32)
		xq[at + c] = e4m3_code(x[at + c] / s);
	if (lane == 0)
		xs[g] = s;
}

extern "C" int wk_cuda_act_quant(float *y, const float *x, int n, int cols, char *err,
				 size_t errsz)
{
	if (n <= 0 || cols <= 0)
		return WK_OK;
	size_t warps = (size_t)n * ((cols + 127) / 128);
	k_act_quant<<<blocks(warps * 32, 256), 256, 0, wk_st()>>>(y, x, n, cols);
	return launched("act_quant", err, errsz);
}

extern "C" int wk_cuda_act_codes(uint8_t *xq, float *xs, const float *x, int n, int cols,
				 char *err, size_t errsz)
{
	if (n <= 0 || cols <= 0)
		return WK_OK;
	size_t warps = (size_t)n * ((cols + 127) / 128);
	k_act_codes<<<blocks(warps * 32, 256), 256, 0, wk_st()>>>(xq, xs, x, n, cols);
	return launched("act_codes", err, errsz);
}

/* k_add, then k_rmsnorm, in one pass over the row: each thread's elements and partial sum
 * are k_rmsnorm's, so the result is the same bit for bit. */
__global__ void k_add_rmsnorm(float *x, const float *d, float *y, const float *w, int dim,
			      float eps)
{
	grid_dep_launch();
	size_t at = (size_t)blockIdx.x * dim;
	row_add_rmsnorm(x + at, d + at, y + at, w, dim, eps);
}

extern "C" int wk_cuda_add_rmsnorm(float *x, const float *d, float *y, const float *w, int n,
				   int dim, float eps, char *err, size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_add_rmsnorm<<<n, 256, 0, wk_st()>>>(x, d, y, w, dim, eps);
	return launched("add_rmsnorm", err, errsz);
}

/* ---- rope (cpu_ref_rope): one thread per rotated pair ---------------------------------------- */

__global__ void k_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		       float theta, bool interleaved)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < (size_t)n * n_heads * (rot_dim / 2))
		rope_pair(x, pos, n_heads, head_dim, rot_dim, theta, interleaved, i);
}

/* Several tensors in one launch: thread g takes pair g of the tensors' pairs in order. */
struct rope_set {
	int count;
	size_t start[WK_ROPE_MAX + 1];
	struct wk_rope r[WK_ROPE_MAX];
};

__global__ void k_rope_n(struct rope_set s, float theta, bool interleaved)
{
	size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (g >= s.start[s.count])
		return;
	int k = 0;
	while (g >= s.start[k + 1])
		k++;
	const struct wk_rope *r = &s.r[k];
	rope_pair(r->x, r->pos, r->n_heads, r->head_dim, r->rot_dim, theta, interleaved,
		  g - s.start[k]);
}

extern "C" int wk_cuda_rope_n(const struct wk_rope *r, int count, float theta,
			      bool interleaved, char *err, size_t errsz)
{
	if (count < 1 || count > WK_ROPE_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA rope_n: %d tensors (1..%d)", count,
			       WK_ROPE_MAX);
	struct rope_set s;
	memset(&s, 0, sizeof s);
	s.count = count;
	for (int k = 0; k < count; k++) {
		s.r[k] = r[k];
		s.start[k + 1] = s.start[k] + (size_t)r[k].n * r[k].n_heads * (r[k].rot_dim / 2);
	}
	if (s.start[count] == 0)
		return WK_OK;
	k_rope_n<<<blocks(s.start[count], 256), 256, 0, wk_st()>>>(s, theta, interleaved);
	return launched("rope_n", err, errsz);
}

extern "C" int wk_cuda_rope(float *x, int n, const int *pos, int n_heads, int head_dim,
			    int rot_dim, float theta, bool interleaved, char *err, size_t errsz)
{
	size_t pairs = (size_t)n * n_heads * (rot_dim / 2);
	if (pairs == 0)
		return WK_OK;
	k_rope<<<blocks(pairs, 256), 256, 0, wk_st()>>>(x, n, pos, n_heads, head_dim, rot_dim, theta,
					    interleaved);
	return launched("rope", err, errsz);
}

/* ---- cast_n (cpu_ref_cast): CAST_BLOCK elements a block (cuda_int.cuh's cast_block) -------- */

__global__ void k_cast_n(struct cast_set s)
{
	grid_dep_launch();
	cast_block(s, (int)blockIdx.x);
}

extern "C" int wk_cuda_cast_n(const struct wk_cast *c, int count, char *err, size_t errsz)
{
	struct cast_set s;
	int rc = cast_build(&s, c, count, err, errsz);
	if (rc != WK_OK || s.start[count] == 0)
		return rc;
	k_cast_n<<<s.start[count], 256, 0, wk_st()>>>(s);
	return launched("cast_n", err, errsz);
}

/* ---- elementwise (cpu_ref_silu_mul, add) ---------------------------------------------------- */

__global__ void k_silu_mul(float *g, const float *u, size_t n)
{
	grid_dep_launch();
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n) {
		float a = g[i];
		g[i] = a / (1.0f + expf(-a)) * u[i];
	}
}

__global__ void k_add(float *y, const float *x, size_t n)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n)
		y[i] += x[i];
}

extern "C" int wk_cuda_silu_mul(float *g, const float *u, size_t n, char *err, size_t errsz)
{
	if (n == 0)
		return WK_OK;
	k_silu_mul<<<blocks(n, 256), 256, 0, wk_st()>>>(g, u, n);
	return launched("silu_mul", err, errsz);
}

extern "C" int wk_cuda_add(float *y, const float *x, size_t n, char *err, size_t errsz)
{
	if (n == 0)
		return WK_OK;
	k_add<<<blocks(n, 256), 256, 0, wk_st()>>>(y, x, n);
	return launched("add", err, errsz);
}

/* ---- argmax (greedy sampling on the device): one block per row ------------------------------ */

__global__ void k_argmax(int *idx, const float *logits, int vocab)
{
	__shared__ float bv[32];
	__shared__ int bi[32];
	const float *r = logits + (size_t)blockIdx.x * vocab;
	float best = -INFINITY;
	int at = 0x7fffffff;
	for (int j = threadIdx.x; j < vocab; j += blockDim.x)
		if (r[j] > best) { /* strided ascending: the first of equals stays */
			best = r[j];
			at = j;
		}
	for (int o = 16; o > 0; o >>= 1) {
		float ob = __shfl_xor_sync(0xffffffffu, best, o);
		int oi = __shfl_xor_sync(0xffffffffu, at, o);
		if (ob > best || (ob == best && oi < at)) {
			best = ob;
			at = oi;
		}
	}
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) {
		bv[wid] = best;
		bi[wid] = at;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < nw; w++)
			if (bv[w] > best || (bv[w] == best && bi[w] < at)) {
				best = bv[w];
				at = bi[w];
			}
		idx[blockIdx.x] = at == 0x7fffffff ? 0 : at;
	}
}

extern "C" int wk_cuda_argmax(int *idx, const float *logits, int n, int vocab, char *err,
			      size_t errsz)
{
	if (n <= 0)
		return WK_OK;
	k_argmax<<<n, 256, 0, wk_st()>>>(idx, logits, vocab);
	return launched("argmax", err, errsz);
}
