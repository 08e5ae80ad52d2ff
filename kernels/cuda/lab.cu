/*
 * lab.cu - the kernel lab's benchmark: each kernel's achieved rate beside the ceilings
 * measured first in the same run. The ceilings: a large device-to-device cudaMemcpy (bytes
 * read plus bytes written), and large cuBLASLt matrix products in bf16 and in FP8 (e4m3 x
 * e4m3, bf16 out, "TN", a heuristic-chosen algorithm) as TFLOPS. Decode is bound by reading
 * the weights, so a GEMV's figure is the weight bytes it read per second; the target on H200
 * is >= 75% of the copy figure. The GEMV rows are GLM-5 decode shapes in FP8 and bf16 at 1
 * and 8 tokens, each run by v0 (the first version, kept here as the baseline), v1
 * (kernels.cu's wk_cuda_matmul, the backend's at one token, launched as programmatic
 * dependents, and again as ordinary launches, "v1 no PDL", its baseline), v2
 * (wk_cuda_gemv_mma: tensor cores, the backend's at 2..8 tokens; its measured figures are in
 * its comment in kernels.cu) and v3 (wk_cuda_gemv_mma3: v2 software-pipelined, a programmatic
 * dependent, and again as ordinary launches, "v3 no PDL"; not yet run on a GPU), each
 * checked against the CPU reference on 256 rows first, over rotating
 * copies of the weights so that small shapes stream from HBM and not from L2. Prefill is bound by the tensor cores, so each FP8
 * GEMM's figure is TFLOPS (2 n rows cols per call) on a prefill shape and a larger one,
 * checked first against the CPU reference, printed beside cuBLASLt's FP8 on the same shape;
 * the target is 1,000 (issue 9). The f32-activation GEMM (gemm_fp8w.cu: FP8 weights, x split
 * into bf16 halves, bf16 wgmmas) is printed beside cuBLASLt's bf16 on the same shapes; it
 * does twice a bf16 GEMM's tensor-core work, so half that ceiling is its bound. The grouped
 * MoE experts' GEMMs (moe_kernels.cu) on a GLM-5 MoE layer (4,096 tokens, dim 6144,
 * moe_intermediate 2048, 256 experts, top 8; lab_moe) are printed beside the same bf16
 * ceiling (on an H200: 76 TFLOPS, untuned), and at 1 and 8 tokens, a decode step's experts,
 * as GB/s of the chosen experts' weights against the copy (the first version beside the
 * streaming path; the decode GEMV's part). Six one-token FP8 GEMVs chained into one launch
 * are timed against the same six as launches of their own (lab_chain): what a chained link's
 * boundary costs against a kernel's. Timed with CUDA events, median of 5 after a warm-up (the
 * matrix products: MM_CALLS calls per timing). Run by tests/tools/cuda_lab (and
 * scripts/gpu-check).
 *
 * Linked into build/tools/cuda_lab alone (the Makefile), so that only the lab depends on
 * cuBLASLt; WICK_CUBLASLT says the build found it (without it the ceilings print a line
 * saying so). Every cuBLASLt status is checked: a failure prints a line and the lab goes on.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(WICK_CUBLASLT)
#include <cublasLt.h>
#endif

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/lab.cuh"


/* Matrix products are timed MM_CALLS back to back between two events, so that the host's
 * work before each launch (tensor maps, attributes, cuBLASLt's checks) overlaps the device's
 * and only the device's time is counted. */
#define MM_CALLS 8

/* An FP8 block-scaled GEMM with wk_cuda_gemm_fp8's contract. */
typedef int (*gemm_fp8_fn)(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			   const float *ws, int n, int rows, int cols, char *err, size_t errsz);

static const struct {
	const char *name;
	gemm_fp8_fn fn;
} lab_gemms[] = {
	{"mma.sync", wk_cuda_gemm_fp8},
	{"wgmma", wk_cuda_gemm_fp8_wgmma},
	{"wgmma 2cta", wk_cuda_gemm_fp8_wgmma_mc2}, /* clusters of 2, the weight tile multicast */
	{"wgmma n160", wk_cuda_gemm_fp8_wgmma_n160}, /* 128 x 160 tiles */
	{"wgmma n160 2cta", wk_cuda_gemm_fp8_wgmma_n160_mc2},
	{"wgmma ovl", wk_cuda_gemm_fp8_wgmma_ovl}, /* the store overlapped with the next tile */
	{"wgmma st", wk_cuda_gemm_fp8_wgmma_st}, /* the store staged in shared memory, by TMA */
};

/* One GEMM row of the prefill table: run() (one call: WK_OK, or an error in err) once on a
 * NaN-poisoned dy [n][rows], tokens toks[0..4) compared with want [4][rows] (within tol of
 * each row's largest), then timed MM_CALLS calls at a time; prints name's line with its
 * TFLOPS (2 n rows cols a call) and their share of blas (<= 0: not measured). got: rows
 * floats of scratch. WK_OK, or WK_EIO with a FAILED line saying why. */
template <typename F>
static int lab_gemm_row(const char *name, F run, void *dy, const float *want, const int toks[4],
			int n, int rows, int cols, double tol, double blas, float *got, char *err,
			size_t errsz)
{
	double worst = 0;
	bool ok = cudaMemset(dy, 0xff, (size_t)n * rows * 4) == cudaSuccess && /* NaN: unwritten */
		  run() == WK_OK && wk_cuda_sync(err, errsz) == WK_OK;
	for (int k = 0; k < 4 && ok; k++) {
		const float *wk = want + (size_t)k * rows;
		if (wk_cuda_download(got, (const float *)dy + (size_t)toks[k] * rows,
				     (size_t)rows * 4, err, errsz)) {
			ok = false;
			break;
		}
		double d = 0, m = 0;
		for (int r = 0; r < rows; r++) {
			d = fmax(d, isfinite(got[r]) ? fabs((double)got[r] - wk[r]) : INFINITY);
			m = fmax(m, fabs((double)wk[r]));
		}
		worst = fmax(worst, m > 0 ? d / m : d);
	}
	if (ok && !(worst <= tol)) {
		snprintf(err, errsz, "WRONG: %.3g of the largest output off", worst);
		ok = false;
	}
	float ms = !ok ? -1.0f : time_ms([&] {
		int r = WK_OK;
		for (int c = 0; c < MM_CALLS && r == WK_OK; c++)
			r = run();
		return r;
	}) / MM_CALLS;
	if (ms <= 0) {
		printf("%-40s %10s   (%s)\n", name, "FAILED", err);
		return WK_EIO;
	}
	double tflops = 2.0 * n * rows * cols / (ms * 1e-3) / 1e12;
	char share[16] = "-";
	if (blas > 0)
		snprintf(share, sizeof share, "%.0f%%", 100.0 * tflops / blas);
	printf("%-40s %10.0f %12s   (%.3f ms; checked: %.1e of the largest)\n", name, tflops,
	       share, ms, worst);
	return WK_OK;
}

/* Each GEMM of lab_gemms on n x rows x cols (n tokens through a rows x cols weight; n, rows
 * and cols multiples of 128) on random finite codes and scales (never zeros: they can run
 * faster than data), after four tokens' rows were compared with cpu_ref_gemm_fp8 (1e-3 of
 * the largest). Prints one line per GEMM, with its TFLOPS as a share of blas (cuBLASLt's FP8
 * TFLOPS on the same shape; <= 0: not measured). WK_OK, or WK_EIO when a step or a check
 * failed. */
static int lab_gemm_fp8(int n, int rows, int cols, double blas)
{
	const int sc = cols / 128;
	const size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
	const size_t nxs = (size_t)n * sc * 4, nws = (size_t)(rows / 128) * sc * 4;
	char err[WK_ERRSZ] = "", name[64];
	uint8_t *xq = (uint8_t *)malloc(nx), *w = (uint8_t *)malloc(nw);
	float *xs = (float *)malloc(nxs), *ws = (float *)malloc(nws);
	float *want = (float *)malloc((size_t)4 * rows * 4), *got = (float *)malloc((size_t)rows * 4);
	void *dxq = NULL, *dw = NULL, *dxs = NULL, *dws = NULL, *dy = NULL;
	const int toks[] = {0, 1, n / 2 + 1, n - 1};
	int rc = WK_OK;
	bool ready = false;
	if (!xq || !w || !xs || !ws || !want || !got) {
		snprintf(err, sizeof err, "out of host memory");
		goto out;
	}
	for (size_t i = 0; i < nx; i++)
		xq[i] = lab_code();
	for (size_t i = 0; i < nw; i++)
		w[i] = lab_code();
	for (size_t i = 0; i < nxs / 4; i++)
		xs[i] = lab_scale(1.0f / 448.0f);
	for (size_t i = 0; i < nws / 4; i++)
		ws[i] = lab_scale(1e-3f);
	for (int k = 0; k < 4; k++)
		cpu_ref_gemm_fp8(want + (size_t)k * rows, xq + (size_t)toks[k] * cols,
				 xs + (size_t)toks[k] * sc, w, ws, 1, rows, cols);
	if (wk_cuda_alloc(&dxq, nx, err, sizeof err) || wk_cuda_alloc(&dw, nw, err, sizeof err) ||
	    wk_cuda_alloc(&dxs, nxs, err, sizeof err) || wk_cuda_alloc(&dws, nws, err, sizeof err) ||
	    wk_cuda_alloc(&dy, ny * 4, err, sizeof err) ||
	    wk_cuda_upload(dxq, xq, nx, err, sizeof err) ||
	    wk_cuda_upload(dw, w, nw, err, sizeof err) ||
	    wk_cuda_upload(dxs, xs, nxs, err, sizeof err) ||
	    wk_cuda_upload(dws, ws, nws, err, sizeof err))
		goto out;
	ready = true;
out:
	for (size_t g = 0; g < sizeof lab_gemms / sizeof lab_gemms[0]; g++) {
		gemm_fp8_fn fn = lab_gemms[g].fn;
		snprintf(name, sizeof name, "gemm fp8 %dx%dx%d %s", n, rows, cols, lab_gemms[g].name);
		if (!ready) {
			printf("%-40s %10s   (%s)\n", name, "FAILED", err);
			rc = WK_EIO;
			continue;
		}
		if (lab_gemm_row(name, [&] {
			    return fn((float *)dy, (const uint8_t *)dxq, (const float *)dxs,
				      (const uint8_t *)dw, (const float *)dws, n, rows, cols, err,
				      sizeof err);
		    }, dy, want, toks, n, rows, cols, 1e-3, blas, got, err, sizeof err) != WK_OK)
			rc = WK_EIO;
	}
	free(xq);
	free(w);
	free(xs);
	free(ws);
	free(want);
	free(got);
	wk_cuda_free(dxq);
	wk_cuda_free(dw);
	wk_cuda_free(dxs);
	wk_cuda_free(dws);
	wk_cuda_free(dy);
	return rc;
}

/* The f32-activation GEMM (gemm_fp8w.cu) on n x rows x cols (multiples of 128): what the
 * backend's matmul_fp8w runs, the split of x into bf16 halves and the GEMM, timed together,
 * on random finite f32 activations in [-1, 1), e4m3 codes and block scales, after four
 * tokens' rows were compared with cpu_ref_matmul_fp8 (1e-5 of the largest: the kernel's
 * contract). A line for each wk_cuda_fp8w_mode (as measured; "wf": the weight tiles fastest
 * in the grid; "rs": fp8w_tile_rs; both), its TFLOPS as a share of blas (cuBLASLt's bf16
 * TFLOPS on the same shape: the GEMM runs bf16 wgmmas, two per product); WK_OK or WK_EIO. */
static int lab_gemm_fp8w(int n, int rows, int cols, double blas)
{
	const size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
	const size_t nws = (size_t)(rows / 128) * (cols / 128) * 4;
	const size_t nxb = 2 * (size_t)n * WK_CUDA_SPLIT_COLS(cols) * 2;
	char err[WK_ERRSZ] = "", name[64];
	float *x = (float *)malloc(nx * 4), *ws = (float *)malloc(nws);
	uint8_t *w = (uint8_t *)malloc(nw);
	float *want = (float *)malloc((size_t)4 * rows * 4), *got = (float *)malloc((size_t)rows * 4);
	void *dx = NULL, *dxb = NULL, *dw = NULL, *dws = NULL, *dy = NULL;
	const int toks[] = {0, 1, n / 2 + 1, n - 1};
	int rc = WK_EIO;
	snprintf(name, sizeof name, "gemm fp8w %dx%dx%d (f32 x)", n, rows, cols);
	if (!x || !ws || !w || !want || !got) {
		snprintf(err, sizeof err, "out of host memory");
		goto fail;
	}
	for (size_t i = 0; i < nx; i++)
		x[i] = (float)(lab_next() >> 8) / 8388608.0f - 1.0f;
	for (size_t i = 0; i < nw; i++)
		w[i] = lab_code();
	for (size_t i = 0; i < nws / 4; i++)
		ws[i] = lab_scale(1e-3f);
	for (int k = 0; k < 4; k++)
		cpu_ref_matmul_fp8(want + (size_t)k * rows, x + (size_t)toks[k] * cols, w, ws, 1, rows,
				   cols);
	if (wk_cuda_alloc(&dx, nx * 4, err, sizeof err) || wk_cuda_alloc(&dxb, nxb, err, sizeof err) ||
	    wk_cuda_alloc(&dw, nw, err, sizeof err) || wk_cuda_alloc(&dws, nws, err, sizeof err) ||
	    wk_cuda_alloc(&dy, ny * 4, err, sizeof err) ||
	    wk_cuda_upload(dx, x, nx * 4, err, sizeof err) ||
	    wk_cuda_upload(dw, w, nw, err, sizeof err) ||
	    wk_cuda_upload(dws, ws, nws, err, sizeof err))
		goto fail;
	for (int mode = 0; mode < 4; mode++) { /* each wk_cuda_fp8w_mode, the measured one first */
		static const char *names[4] = {"", " wf", " rs", " rs wf"};
		snprintf(name, sizeof name, "gemm fp8w %dx%dx%d (f32 x)%s", n, rows, cols,
			 names[mode]);
		wk_cuda_fp8w_mode(mode);
		int r = lab_gemm_row(name, [&] {
			int e = wk_cuda_act_split((uint16_t *)dxb, (const float *)dx, n, cols, err,
						  sizeof err);
			return e ? e : wk_cuda_gemm_fp8w((float *)dy, (const uint16_t *)dxb,
							 (const uint8_t *)dw, (const float *)dws, n,
							 rows, cols, err, sizeof err);
		}, dy, want, toks, n, rows, cols, 1e-5, blas, got, err, sizeof err);
		wk_cuda_fp8w_mode(0);
		rc = mode ? (rc ? rc : r) : r;
	}
	goto out;
fail:
	printf("%-40s %10s   (%s)\n", name, "FAILED", err);
out:
	free(x);
	free(ws);
	free(w);
	free(want);
	free(got);
	wk_cuda_free(dx);
	wk_cuda_free(dxb);
	wk_cuda_free(dw);
	wk_cuda_free(dws);
	wk_cuda_free(dy);
	return rc;
}

/* A 32-bit hash of i (the finalizer of MurmurHash3): uniform bits for k_fill. */
__device__ __forceinline__ uint32_t fill_hash(uint32_t i)
{
	i ^= i >> 16;
	i *= 0x85ebca6bu;
	i ^= i >> 13;
	i *= 0xc2b2ae35u;
	i ^= i >> 16;
	return i;
}

__device__ __forceinline__ float fill_unit(uint32_t h) /* [0, 1) */
{
	return (float)(h >> 8) / 16777216.0f;
}

/* fill_random's values, made on the device from each 4-byte word's index and the seed. */
__global__ void k_fill(uint8_t *p, size_t words, bool f32, float lo, float hi, uint32_t seed)
{
	for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words;
	     w += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = fill_hash((uint32_t)w * 2u + seed + fill_hash((uint32_t)(w >> 31))), u;
		float v = lo + (hi - lo) * fill_unit(h);
		if (f32) {
			memcpy(&u, &v, 4);
		} else {
			float v2 = lo + (hi - lo) * fill_unit(fill_hash(h ^ 0x9e3779b9u));
			uint32_t a, b;
			memcpy(&a, &v, 4);
			memcpy(&b, &v2, 4);
			u = (a >> 16) | (b & 0xffff0000u); /* two bf16 */
			for (int j = 0; j < 4; j++) /* no byte an e4m3 NaN (x111 1111) */
				if (((u >> (8 * j)) & 0x7f) == 0x7f)
					u ^= 1u << (8 * j);
		}
		memcpy(p + 4 * w, &u, 4);
	}
}

/* lab.cuh. Made on the device (the host made 9.7 GB of MoE experts at a few hundred MB/s);
 * the seed from lab_next(), so that each buffer differs. The bytes past the last whole
 * 4-byte word are left as they are. */
int fill_random(void *dev, size_t bytes, bool f32, float lo, float hi)
{
	size_t words = bytes / 4;
	if (words == 0)
		return WK_OK;
	size_t want = (words + 255) / 256;
	unsigned grid = (unsigned)(want < 4096 ? want : 4096);
	k_fill<<<grid, 256>>>((uint8_t *)dev, words, f32, lo, hi, lab_next());
	return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess
		       ? WK_OK : WK_EIO;
}

/* The grouped MoE experts (moe_kernels.cu) on a GLM-5 MoE layer: n tokens, dim 6144,
 * moe_intermediate 2048, 256 experts (all on this device), top 8 chosen uniformly at random
 * per token (~128 slots an expert at 4,096 tokens), FP8 weights with block scales, no shared
 * expert, timed with a zeroing of y (the op adds to y). Checked first: up to four tokens' y
 * rows against cpu_ref_moe_experts on the downloaded weights of their experts (1e-4 of the
 * largest). From 64 tokens, what a prefill runs (the grouped GEMMs: the split of x, gate and
 * up, SiLU * up split, down, the combine): TFLOPS count 2 * 3 * dim * inter per slot, printed
 * beside blas (cuBLASLt's bf16 on the dense prefill shape; the GEMMs run bf16 wgmmas, two per
 * product, so half of it is their bound), two lines: the measured tile, then fp8w_tile_rs
 * ("rs"). Below 64, what a decode step runs (gate/up, then down with the combine): GB/s of
 * the chosen experts' weights and scales, each read once a call, against the copy ceil_gbs,
 * two lines: the first version ("v0", a warp a row; wk_cuda_moe_rows_v0), then the
 * streaming path (the default). 9.7 GB of weights; WK_OK or WK_EIO. */
#define MOE_DIM 6144
#define MOE_INTER 2048
#define MOE_EXPERTS 256
#define MOE_TOPK 8
static int lab_moe(int n, double blas, double ceil_gbs)
{
	const bool dec = n < 64; /* wk_cuda_moe_experts's grouped GEMMs from 64 tokens */
	const size_t mat = (size_t)MOE_DIM * MOE_INTER, nsc = (size_t)(MOE_DIM / 128) * (MOE_INTER / 128);
	const size_t ns = (size_t)n * MOE_TOPK, ny = (size_t)n * MOE_DIM;
	char err[WK_ERRSZ] = "", name[64];
	struct cpu_expert *tab = (struct cpu_expert *)calloc(MOE_EXPERTS, sizeof *tab);
	struct cpu_expert *host = (struct cpu_expert *)calloc(MOE_EXPERTS, sizeof *host);
	int *idx = (int *)malloc(ns * sizeof *idx);
	float *wt = (float *)malloc(ns * 4), *x = (float *)malloc(ny * 4);
	float *want = (float *)malloc(MOE_DIM * 4), *got = (float *)malloc(MOE_DIM * 4);
	float *cscr = (float *)malloc((2 * MOE_INTER + MOE_DIM) * 4);
	void *dw = NULL, *dws = NULL, *dtab = NULL, *didx = NULL, *dwt = NULL, *dx = NULL;
	void *dy = NULL, *dscr = NULL;
	const int toks[4] = {0, 1, n / 2 + 1, n - 1};
	struct wk_moe m = {};
	double worst = 0;
	float ms = -1.0f;
	int rc = WK_EIO;
	snprintf(name, sizeof name, "moe experts %s%d tok (GLM-5)", dec ? "" : "GEMM ", n);
	if (!tab || !host || !idx || !wt || !x || !want || !got || !cscr) {
		snprintf(err, sizeof err, "out of host memory");
		goto fail;
	}
	for (int t = 0; t < n; t++) { /* top 8 distinct of 256: a partial shuffle */
		int perm[MOE_EXPERTS];
		for (int e = 0; e < MOE_EXPERTS; e++)
			perm[e] = e;
		for (int j = 0; j < MOE_TOPK; j++) {
			int k = j + (int)(lab_next() % (uint32_t)(MOE_EXPERTS - j)), v = perm[j];
			perm[j] = perm[k];
			perm[k] = v;
			idx[(size_t)t * MOE_TOPK + j] = perm[j];
			wt[(size_t)t * MOE_TOPK + j] = lab_scale(0.125f);
		}
	}
	for (size_t i = 0; i < ny; i++)
		x[i] = (float)(lab_next() >> 8) / 8388608.0f - 1.0f;
	m.n_local = MOE_EXPERTS;
	m.wdt = DT_F8_E4M3;
	m.dim = MOE_DIM;
	m.inter = MOE_INTER;
	if (wk_cuda_alloc(&dw, 3 * MOE_EXPERTS * mat, err, sizeof err) ||
	    wk_cuda_alloc(&dws, 3 * MOE_EXPERTS * nsc * 4, err, sizeof err) ||
	    wk_cuda_alloc(&dtab, MOE_EXPERTS * sizeof *tab, err, sizeof err) ||
	    wk_cuda_alloc(&didx, ns * sizeof *idx, err, sizeof err) ||
	    wk_cuda_alloc(&dwt, ns * 4, err, sizeof err) || wk_cuda_alloc(&dx, ny * 4, err, sizeof err) ||
	    wk_cuda_alloc(&dy, ny * 4, err, sizeof err) ||
	    wk_cuda_alloc(&dscr, wk_cuda_moe_experts_scratch(n, MOE_TOPK, &m), err, sizeof err))
		goto fail;
	if (fill_random(dw, 3 * MOE_EXPERTS * mat, false, -1, 1) ||
	    fill_random(dws, 3 * MOE_EXPERTS * nsc * 4, true, 0.5e-3f, 1.5e-3f)) {
		snprintf(err, sizeof err, "cannot fill the weights");
		goto fail;
	}
	for (int e = 0; e < MOE_EXPERTS; e++) { /* gate, up [inter][dim]; down [dim][inter] */
		const uint8_t *w = (const uint8_t *)dw + 3 * e * mat;
		const float *sc = (const float *)dws + 3 * e * nsc;
		tab[e] = (struct cpu_expert){w, w + mat, w + 2 * mat, sc, sc + nsc, sc + 2 * nsc};
	}
	m.experts = (const struct cpu_expert *)dtab;
	for (int rs = 0; rs < 2; rs++) { /* fp8w_tile, then fp8w_tile_rs (WK_FP8W_RS); decode:
					   * v0, then the streaming path */
		if (dec)
			snprintf(name, sizeof name, "moe experts %d tok (GLM-5)%s", n, rs ? "" : " v0");
		else
			snprintf(name, sizeof name, "moe experts GEMM %d tok (GLM-5)%s", n,
				 rs ? " rs" : "");
		wk_cuda_fp8w_mode(rs && !dec ? WK_FP8W_RS : 0);
		wk_cuda_moe_rows_v0(dec && !rs);
		worst = 0;
		if (wk_cuda_upload(dtab, tab, MOE_EXPERTS * sizeof *tab, err, sizeof err) ||
		    wk_cuda_upload(didx, idx, ns * sizeof *idx, err, sizeof err) ||
		    wk_cuda_upload(dwt, wt, ns * 4, err, sizeof err) ||
		    wk_cuda_upload(dx, x, ny * 4, err, sizeof err) ||
		    wk_cuda_zero(dy, ny * 4, err, sizeof err) ||
		    wk_cuda_moe_experts((float *)dy, (const float *)dx, (const int *)didx,
					(const float *)dwt, n, MOE_TOPK, &m, dscr, err, sizeof err) ||
		    wk_cuda_sync(err, sizeof err))
			goto fail;
		for (int k = 0; k < 4; k++) {
			int t = toks[k] < n ? toks[k] : n - 1;
			for (int j = 0; j < MOE_TOPK; j++) { /* the token's experts' weights, once */
				int e = idx[(size_t)t * MOE_TOPK + j];
				if (host[e].gate)
					continue;
				uint8_t *w = (uint8_t *)malloc(3 * mat);
				float *sc = (float *)malloc(3 * nsc * 4);
				if (!w || !sc) {
					free(w);
					free(sc);
					snprintf(err, sizeof err, "out of host memory");
					goto fail;
				}
				host[e] = (struct cpu_expert){w, w + mat, w + 2 * mat, sc, sc + nsc, sc + 2 * nsc};
				if (wk_cuda_download(w, tab[e].gate, 3 * mat, err, sizeof err) ||
				    wk_cuda_download(sc, tab[e].gate_s, 3 * nsc * 4, err, sizeof err))
					goto fail;
			}
			memset(want, 0, MOE_DIM * 4);
			cpu_ref_moe_experts(want, x + (size_t)t * MOE_DIM, idx + (size_t)t * MOE_TOPK,
					    wt + (size_t)t * MOE_TOPK, 1, MOE_TOPK, host, 0, MOE_EXPERTS,
					    DT_F8_E4M3, MOE_DIM, MOE_INTER, NULL, cscr);
			if (wk_cuda_download(got, (const float *)dy + (size_t)t * MOE_DIM, MOE_DIM * 4, err,
					     sizeof err))
				goto fail;
			double d = 0, mx = 0;
			for (int c = 0; c < MOE_DIM; c++) {
				d = fmax(d, isfinite(got[c]) ? fabs((double)got[c] - want[c]) : INFINITY);
				mx = fmax(mx, fabs((double)want[c]));
			}
			worst = fmax(worst, mx > 0 ? d / mx : d);
		}
		if (!(worst <= 1e-4)) {
			snprintf(err, sizeof err, "WRONG: %.3g of the largest output off", worst);
			goto fail;
		}
		ms = time_ms([&] {
			int r = wk_cuda_zero(dy, ny * 4, err, sizeof err);
			return r ? r : wk_cuda_moe_experts((float *)dy, (const float *)dx,
							   (const int *)didx, (const float *)dwt, n,
							   MOE_TOPK, &m, dscr, err, sizeof err);
		});
		if (ms <= 0)
			goto fail;
		if (dec) { /* the distinct experts' bytes */
			int seen[MOE_EXPERTS] = {0}, ne = 0;
			for (size_t i = 0; i < ns; i++)
				ne += seen[idx[i]]++ == 0;
			double gbs = ne * 3.0 * (mat + nsc * 4) / (ms * 1e-3) / 1e9;
			printf("%-40s %10.0f %9.0f%%   (%.3f ms, %d experts; checked: %.1e of the "
			       "largest)\n", name, gbs, 100.0 * gbs / ceil_gbs, ms, ne, worst);
			continue;
		}
		{
			double tflops = 2.0 * ns * 3.0 * MOE_DIM * MOE_INTER / (ms * 1e-3) / 1e12;
			char share[16] = "-";
			if (blas > 0)
				snprintf(share, sizeof share, "%.0f%%", 100.0 * tflops / blas);
			printf("%-40s %10.0f %12s   (%.3f ms; checked: %.1e of the largest)\n", name,
			       tflops, share, ms, worst);
		}
	}
	rc = WK_OK;
	goto out;
fail:
	printf("%-40s %10s   (%s)\n", name, "FAILED", err);
out:
	wk_cuda_fp8w_mode(0);
	wk_cuda_moe_rows_v0(0);
	for (int e = 0; host && e < MOE_EXPERTS; e++) {
		free((void *)host[e].gate);
		free((void *)host[e].gate_s);
	}
	free(tab);
	free(host);
	free(idx);
	free(wt);
	free(x);
	free(want);
	free(got);
	free(cscr);
	wk_cuda_free(dw);
	wk_cuda_free(dws);
	wk_cuda_free(dtab);
	wk_cuda_free(didx);
	wk_cuda_free(dwt);
	wk_cuda_free(dx);
	wk_cuda_free(dy);
	wk_cuda_free(dscr);
	return rc;
}

/* ---- decode GEMV: v0 (the first version, the baseline) against v1, v2, v3 (kernels.cu) --- */

/* v0: one warp per weight row, each lane loading one element per iteration, the row read
 * again for every token (from cache after the first): the kernels.cu GEMV until the 16-byte
 * streaming version (v1) replaced it, kept here so that the table shows the two side by side. */
__device__ __forceinline__ float v0_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__global__ void k_gemv_bf16_v0(float *y, const float *x, const __nv_bfloat16 *w, int n, int rows,
			       int cols)
{
	int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	const __nv_bfloat16 *wr = w + (size_t)row * cols;
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		float s = 0.0f;
		for (int c = lane; c < cols; c += 32)
			s += __bfloat162float(wr[c]) * xt[c];
		s = v0_warp_sum(s);
		if (lane == 0)
			y[(size_t)t * rows + row] = s;
	}
}

__global__ void k_gemv_fp8_v0(float *y, const float *x, const __nv_fp8_e4m3 *w,
			      const float *scale, int n, int rows, int cols)
{
	int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	int sc = (cols + 127) / 128;
	const __nv_fp8_e4m3 *wr = w + (size_t)row * cols;
	const float *srow = scale + (size_t)(row / 128) * sc;
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		float acc = 0.0f;
		for (int b = 0; b < sc; b++) {
			int c0 = b * 128, c1 = min(c0 + 128, cols);
			float s = 0.0f;
			for (int c = c0 + lane; c < c1; c += 32)
				s += float(wr[c]) * xt[c];
			acc += s * srow[b];
		}
		acc = v0_warp_sum(acc);
		if (lane == 0)
			y[(size_t)t * rows + row] = acc;
	}
}

/* One GEMV call: v0 here, or v1, v2 and v3 through the public wrappers; v -1: v1 launched as
 * an ordinary kernel, not as a programmatic dependent (wk_cuda_set_pdl), v1's own baseline;
 * v 4 the same for v3 (wk_cuda_gemv_mma3), to tell its pipelining from its PDL.
 * WK_OK, or the error. */
static int lab_gemv_call(int v, bool fp8, float *y, const float *x, const void *w,
			 const float *scale, int n, int rows, int cols, char *err, size_t errsz)
{
	if (v == -1) {
		wk_cuda_set_pdl(0);
		int rc = lab_gemv_call(1, fp8, y, x, w, scale, n, rows, cols, err, errsz);
		wk_cuda_set_pdl(1);
		return rc;
	}
	if (v == 4) {
		wk_cuda_set_pdl(0);
		int rc = lab_gemv_call(3, fp8, y, x, w, scale, n, rows, cols, err, errsz);
		wk_cuda_set_pdl(1);
		return rc;
	}
	if (v == 3)
		return wk_cuda_gemv_mma3(y, x, w, fp8 ? DT_F8_E4M3 : DT_BF16, scale, n, rows, cols,
					 err, errsz);
	if (v == 2)
		return wk_cuda_gemv_mma(y, x, w, fp8 ? DT_F8_E4M3 : DT_BF16, scale, n, rows, cols,
					err, errsz);
	if (v == 1)
		return fp8 ? wk_cuda_matmul_fp8(y, x, (const uint8_t *)w, scale, n, rows, cols, err,
						errsz)
			   : wk_cuda_matmul(y, x, w, DT_BF16, n, rows, cols, err, errsz);
	unsigned b = (unsigned)(((size_t)rows * 32 + 255) / 256);
	if (fp8)
		k_gemv_fp8_v0<<<b, 256>>>(y, x, (const __nv_fp8_e4m3 *)w, scale, n, rows, cols);
	else
		k_gemv_bf16_v0<<<b, 256>>>(y, x, (const __nv_bfloat16 *)w, n, rows, cols);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		return WK_OK;
	snprintf(err, errsz, "v0 launch: %s", cudaGetErrorString(e));
	return WK_EIO;
}

/* Decode-shaped weights of GLM-5 (rows x cols, y = x . w^T): an expert's down and gate/up
 * projections, and a dense MLP's up and down. */
static const struct {
	const char *what;
	int rows, cols;
} gemv_shapes[] = {{"7168x2048", 7168, 2048},
		   {"2048x7168", 2048, 7168},
		   {"18432x7168", 18432, 7168},
		   {"7168x18432", 7168, 18432}};
#define GEMV_MAX_ROWS 18432
#define GEMV_MAX_COLS 18432
#define GEMV_SCALES (144 * 144) /* >= ceil(rows / 128) * ceil(cols / 128) of every shape */
/* The weights: copies of a small shape side by side, the calls of a timed run taking the
 * next copy each, so that they stream from HBM rather than from the 60 MB L2 (METHOD.md;
 * 20 calls of the smallest shape, 14.7 MB each, span 294 MB). */
#define GEMV_W_BYTES ((size_t)512 << 20)
#define GEMV_CALLS 20 /* back-to-back calls per timed run: per-call time, launch gaps included */

/* lab.cuh */
double lab_rel(const float *got, const float *want, int n, int rows, int r0, int nr)
{
	double d = 0, m = 0;
	for (int t = 0; t < n; t++)
		for (int r = 0; r < nr; r++) {
			double g = got[(size_t)t * rows + r0 + r], w = want[(size_t)t * nr + r];
			d = fmax(d, isfinite(g) ? fabs(g - w) : INFINITY);
			m = fmax(m, fabs(w));
		}
	return m > 0 ? d / m : d;
}

/* ---- the floor under a small GEMV: a launch that does nothing ----------------------------
 * The grid of v1 at one token on 7168 x 2048 FP8 (448 blocks of 256 threads), launched
 * GEMV_CALLS times back to back as the GEMV rows are timed: what a call costs before it
 * reads a byte. PDL: launched as a programmatic dependent, and letting the next start at
 * once (griddepcontrol), as k_matmul is. Each on the legacy default stream (stream 0, where
 * the backend launches) and on a stream of its own (cudaStreamNonBlocking): if PDL cuts the
 * floor only on the latter, the backend's compute belongs on such a stream. */
__global__ void k_lab_empty(int *never)
{
	grid_dep_launch();
	grid_dep_wait();
	if (never && threadIdx.x == 1024) /* never: blocks are 256 threads */
		*never = 0;
}

static int lab_empty_call(bool pdl, cudaStream_t st)
{
	cudaLaunchAttribute at;
	cudaLaunchConfig_t cfg = pdl_config(448, 256, pdl, &at, st);
	return cudaLaunchKernelEx(&cfg, k_lab_empty, (int *)NULL) == cudaSuccess ? WK_OK : WK_EIO;
}

/* Prints the four floors' rows (us a call); 0 or 1 when a launch failed. */
static int lab_launch_floor(void)
{
	int failed = 0;
	cudaStream_t own = NULL;
	if (cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) != cudaSuccess) {
		printf("%-40s %10s (cudaStreamCreateWithFlags)\n", "empty launch, own stream", "FAILED");
		own = NULL;
		failed = 1;
	}
	for (int v = 0; v < 4; v++) {
		bool pdl = v & 1, mine = v >= 2;
		if (mine && !own)
			continue;
		cudaStream_t st = mine ? own : 0;
		float ms = time_ms([&]() -> int {
			for (int i = 0; i < GEMV_CALLS; i++)
				if (lab_empty_call(pdl, st) != WK_OK)
					return WK_EIO;
			return WK_OK;
		}, st);
		static const char *const names[4] = {
			"empty launch 448 x 256", "empty launch 448 x 256, PDL",
			"empty launch, own stream", "empty launch, own stream, PDL"};
		const char *name = names[v];
		if (ms <= 0) {
			printf("%-40s %10s\n", name, "FAILED");
			failed = 1;
		} else {
			printf("%-40s %10s %10s   %.2f us a call (the floor under a small GEMV)\n", name,
			       "", "", 1e3 * ms / GEMV_CALLS);
		}
	}
	if (own)
		cudaStreamDestroy(own);
	return failed;
}

/* For every shape, FP8 and bf16, 1 and 8 tokens, v0 .. v3: one call checked against the CPU
 * reference on the first and the last 128 rows (1e-4 of the largest output there), then timed
 * whatever the check said; a row per variant: the weight bytes read per second, their share
 * of the copy, v1, v2 and v3 marked against the 75% target, and the check. w: GEMV_W_BYTES of random
 * finite data (bf16 and e4m3 alike), scale: GEMV_SCALES positive floats, x: 8 x GEMV_MAX_COLS
 * floats, all device memory. WK_OK, or WK_EIO when a step or a check failed (printed). */
static int lab_gemv(double ceil_gbs, const void *w, const float *scale, const float *x)
{
	char err[WK_ERRSZ] = "";
	const int nr = 128; /* rows checked at each end: every shape's rows are a multiple */
	size_t ny = (size_t)8 * GEMV_MAX_ROWS;
	float *y = NULL, *got = (float *)malloc(ny * 4), *want = (float *)malloc((size_t)8 * nr * 4);
	float *hx = (float *)malloc((size_t)8 * GEMV_MAX_COLS * 4);
	float *hs = (float *)malloc((size_t)GEMV_SCALES * 4);
	unsigned char *hw = (unsigned char *)malloc((size_t)nr * GEMV_MAX_COLS * 2);
	int failed = 0;
	if (!got || !want || !hx || !hs || !hw || wk_cuda_alloc((void **)&y, ny * 4, err, sizeof err) ||
	    wk_cuda_download(hx, x, (size_t)8 * GEMV_MAX_COLS * 4, err, sizeof err) ||
	    wk_cuda_download(hs, scale, (size_t)GEMV_SCALES * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "gemv", "FAILED", err[0] ? err : "out of host memory");
		failed = 1;
		goto out;
	}
	printf("%-40s %10s %10s   (target: v1, v2, v3 >= 75%% of the copy)\n", "kernel (decode GEMV)", "GB/s",
	       "of copy");
	failed |= lab_launch_floor();
	for (size_t si = 0; si < sizeof gemv_shapes / sizeof gemv_shapes[0]; si++)
		for (int fp8 = 1; fp8 >= 0; fp8--)
			for (int n = 1; n <= 8; n += 7)
				for (int v = -1; v < 5; v++) {
					int rows = gemv_shapes[si].rows, cols = gemv_shapes[si].cols;
					size_t esz = fp8 ? 1 : 2, bytes = (size_t)rows * cols * esz;
					size_t copies = GEMV_W_BYTES / bytes;
					int sc = (cols + 127) / 128;
					char name[64];
					snprintf(name, sizeof name, "%s %s, %d token%s, %s",
						 fp8 ? "fp8" : "bf16", gemv_shapes[si].what, n,
						 n > 1 ? "s" : "", v < 0 ? "v1 no PDL" : v == 0 ? "v0"
						 : v == 1 ? "v1" : v == 2 ? "v2" : v == 3 ? "v3"
						 : "v3 no PDL");
					/* the check: rows [0, nr) and [rows - nr, rows) of the first copy */
					double worst = 0;
					if (lab_gemv_call(v, fp8, y, x, w, scale, n, rows, cols, err,
							  sizeof err) ||
					    wk_cuda_sync(err, sizeof err) ||
					    wk_cuda_download(got, y, (size_t)n * rows * 4, err, sizeof err)) {
						printf("%-40s %10s   (%s)\n", name, "FAILED", err);
						failed = 1;
						continue;
					}
					for (int end = 0; end < 2; end++) {
						int r0 = end ? rows - nr : 0;
						if (wk_cuda_download(hw, (const char *)w + (size_t)r0 * cols * esz,
								     (size_t)nr * cols * esz, err, sizeof err)) {
							worst = INFINITY;
							break;
						}
						if (fp8)
							cpu_ref_matmul_fp8(want, hx, hw, hs + (size_t)(r0 / 128) * sc,
									   n, nr, cols);
						else
							cpu_ref_matmul(want, hx, hw, DT_BF16, n, nr, cols);
						worst = fmax(worst, lab_rel(got, want, n, rows, r0, nr));
					}
					size_t call = 0;
					float ms = time_ms([&]() -> int {
						for (int i = 0; i < GEMV_CALLS; i++, call++) {
							const char *wc = (const char *)w +
									 call % copies * bytes;
							int r = lab_gemv_call(v, fp8, y, x, wc, scale, n,
									      rows, cols, err, sizeof err);
							if (r != WK_OK)
								return r;
						}
						return WK_OK;
					});
					bool ok = worst <= 1e-4;
					failed |= !ok;
					if (ms <= 0) {
						printf("%-40s %10s   (%s)\n", name, "FAILED", err);
						failed = 1;
						continue;
					}
					double gbs = (double)bytes * GEMV_CALLS / (ms * 1e-3) / 1e9;
					double pct = 100.0 * gbs / ceil_gbs;
					printf("%-40s %10.0f %9.0f%%   %s%.1f us a call; %s %.1e off the CPU\n",
					       name, gbs, pct, v <= 0 ? "" : pct >= 75.0 ? "ok, " : "BELOW 75%, ",
					       1e3 * ms / GEMV_CALLS, ok ? "checked:" : "WRONG:", worst);
				}
out:
	wk_cuda_free(y);
	free(got);
	free(want);
	free(hx);
	free(hs);
	free(hw);
	return failed ? WK_EIO : WK_OK;
}

/* ---- what a link boundary costs: a chained launch against launches of their own -----------
 * CHAIN_LINKS FP8 GEMVs at one token, 7168 x 2048 and 2048 x 7168 in turn, each link's y the
 * next one's x (as a decode layer's projections follow one another), each with weights of its
 * own (CHAIN_STRIDE apart, and the whole run's CHAIN_SET apart from one run to the next, so
 * that they stream from HBM, not L2), run three ways: as one chained launch (wk_cuda_chain:
 * a link's blocks wait on counters in device memory for the link before, its first weights
 * sent to L2 meanwhile), as launches of their own that are programmatic dependents (k_matmul,
 * as the backend runs an op outside a chain), and as ordinary launches. The three compute
 * every row with the same code (gemv.cuh), so the last link's outputs must be the same bits
 * each way: checked first. A row: the weights' GB/s over a run and the time a link. */
#define CHAIN_LINKS 6
#define CHAIN_STRIDE ((size_t)16 << 20)
#define CHAIN_SET (CHAIN_LINKS * CHAIN_STRIDE)
#define CHAIN_RUNS 4 /* chains (or runs of CHAIN_LINKS launches) a timing */

/* One run, the way v says (0 chained, 1 launches with PDL, 2 without), on weight set set of
 * those at w. */
static int lab_chain_run(int v, struct wk_link *l, unsigned *sync, const void *w, size_t set,
			 char *err, size_t errsz)
{
	size_t off = set % (GEMV_W_BYTES / CHAIN_SET) * CHAIN_SET;
	for (int i = 0; i < CHAIN_LINKS; i++)
		l[i].mm[0].w = (const char *)w + off + (size_t)i * CHAIN_STRIDE;
	if (v == 0)
		return wk_cuda_chain(l, CHAIN_LINKS, sync, err, errsz);
	wk_cuda_set_pdl(v == 1);
	int rc = WK_OK;
	for (int i = 0; i < CHAIN_LINKS && rc == WK_OK; i++)
		rc = wk_cuda_matmul_fp8(l[i].mm[0].y, l[i].x, (const uint8_t *)l[i].mm[0].w,
					l[i].mm[0].scale, 1, l[i].mm[0].rows, l[i].cols, err, errsz);
	wk_cuda_set_pdl(1);
	return rc;
}

/* Prints the three rows, on GLM-5's decode shapes (7168 x 2048 and 2048 x 7168) or, tiny,
 * on 128 x 128 (a link's cost with next to nothing to read: the boundary alone); WK_OK, or
 * WK_EIO when a step failed or the outputs differ. w: GEMV_W_BYTES of random finite e4m3
 * codes, scale: GEMV_SCALES positive floats, x: at least 2048 floats, all device memory. */
static int lab_chain(double ceil_gbs, const void *w, const float *scale, const float *x,
		     bool tiny)
{
	static const int shapes[2][2][2] = {{{7168, 2048}, {2048, 7168}}, {{128, 128}, {128, 128}}};
	static const char *const names[2][3] = {
		{"6 fp8 GEMVs, 1 token, chained", "6 fp8 GEMVs, 1 token, launches",
		 "6 fp8 GEMVs, 1 token, no PDL"},
		{"6 fp8 128 x 128, 1 token, chained", "6 fp8 128 x 128, 1 token, launches",
		 "6 fp8 128 x 128, 1 token, no PDL"}};
	const int(*shape)[2] = shapes[tiny];
	char err[WK_ERRSZ] = "";
	struct wk_link *l = (struct wk_link *)calloc(CHAIN_LINKS, sizeof *l);
	float *y[CHAIN_LINKS] = {}, *got[3] = {};
	unsigned *sync = NULL;
	int failed = 0, last = shape[(CHAIN_LINKS - 1) % 2][0];
	size_t bytes = 0;
	if (!tiny)
		printf("\n%-40s %10s %10s   (7168 x 2048 and 2048 x 7168 in turn, y the next x: a "
		       "link's cost, chained or launched)\n", "kernel (chained GEMVs)", "GB/s",
		       "of copy");
	bool ok = l && wk_cuda_alloc((void **)&sync, WK_CHAIN_SYNC * sizeof *sync, err,
				     sizeof err) == WK_OK &&
		  wk_cuda_zero(sync, WK_CHAIN_SYNC * sizeof *sync, err, sizeof err) == WK_OK;
	for (int i = 0; ok && i < CHAIN_LINKS; i++) {
		const int *sh = shape[i % 2];
		ok = wk_cuda_alloc((void **)&y[i], (size_t)sh[0] * 4, err, sizeof err) == WK_OK;
		l[i].kind = WK_LINK_MATMUL;
		l[i].n = 1;
		l[i].mm_count = 1;
		l[i].cols = sh[1];
		l[i].x = i ? y[i - 1] : x;
		l[i].mm[0].y = y[i];
		l[i].mm[0].scale = scale;
		l[i].mm[0].dtype = DT_F8_E4M3;
		l[i].mm[0].rows = sh[0];
		bytes += (size_t)sh[0] * sh[1];
	}
	for (int v = 0; ok && v < 3; v++)
		ok = (got[v] = (float *)malloc((size_t)last * 4)) &&
		     lab_chain_run(v, l, sync, w, 0, err, sizeof err) == WK_OK &&
		     wk_cuda_sync(err, sizeof err) == WK_OK &&
		     wk_cuda_download(got[v], y[CHAIN_LINKS - 1], (size_t)last * 4, err,
				      sizeof err) == WK_OK;
	if (!ok) {
		printf("%-40s %10s   (%s)\n", "chained GEMVs", "FAILED", err[0] ? err : "out of host "
		       "memory");
		failed = 1;
		goto out;
	}
	for (int v = 0; v < 3; v++) {
		bool same = !memcmp(got[v], got[0], (size_t)last * 4);
		size_t set = 0;
		float ms = time_ms([&]() -> int {
			for (int r = 0; r < CHAIN_RUNS; r++) {
				int rc = lab_chain_run(v, l, sync, w, set++, err, sizeof err);
				if (rc != WK_OK)
					return rc;
			}
			return WK_OK;
		});
		if (ms <= 0 || !same) {
			printf("%-40s %10s   (%s)\n", names[tiny][v], "FAILED", ms <= 0 ? err :
			       "the last link's outputs differ from the chained run's");
			failed = 1;
			continue;
		}
		double gbs = (double)bytes * CHAIN_RUNS / (ms * 1e-3) / 1e9;
		printf("%-40s %10.0f %9.0f%%   %.2f us a link%s\n", names[tiny][v], gbs,
		       100.0 * gbs / ceil_gbs, 1e3 * ms / (CHAIN_RUNS * CHAIN_LINKS),
		       v ? "" : "; the same bits as launched");
	}
out:
	for (int i = 0; i < CHAIN_LINKS; i++)
		wk_cuda_free(y[i]);
	for (int v = 0; v < 3; v++)
		free(got[v]);
	wk_cuda_free(sync);
	free(l);
	return failed ? WK_EIO : WK_OK;
}

/* cuBLASLt's FP8 and bf16 TFLOPS on the GEMM lab's two shapes: the matrix ceilings of its
 * table (bf16 for the f32-activation GEMM, whose tensor-core work is bf16). */
struct blas_ceilings {
	double fp8_prefill, fp8_large; /* <= 0: not measured */
	double bf16_prefill, bf16_large;
};

#define PREFILL_N 4096 /* tokens x weight rows x columns of the prefill shape (issue 9) */
#define PREFILL_ROWS 7168
#define PREFILL_COLS 2048
#define LARGE 8192 /* the larger shape: LARGE^3 */

#if defined(WICK_CUBLASLT)
/* Checks one cuBLASLt call; on failure names it and its status in why and jumps to out. */
#define LT_CHECK(call)                                                                     \
	do {                                                                               \
		cublasStatus_t st_ = (call);                                               \
		if (st_ != CUBLAS_STATUS_SUCCESS) {                                        \
			snprintf(why, sizeof why, "%s: %s", #call, cublasLtGetStatusString(st_)); \
			goto out;                                                          \
		}                                                                          \
	} while (0)

/* One cuBLASLt product in the "TN" layout FP8 needs on Hopper: D[m x n] = A^T . B with A
 * stored k x m column-major (lda = k: a weight's rows x cols row-major) and B k x n (ldb =
 * k: tokens x cols row-major), D m x n (ldd = m: tokens x rows row-major), f32 compute and
 * scale, bf16 D. fp8: A and B e4m3 with A and B scale pointers (one, a device float 1.0)
 * and fast_accum as CUBLASLT_MATMUL_DESC_FAST_ACCUM; else A and B bf16. The algorithm is
 * cuBLASLt's first heuristic choice within wsz bytes of workspace ws. a, b and d hold
 * random finite data, and at least m k, n k and m n elements of 2 bytes. Prints one line,
 * named name; returns the TFLOPS, or 0 when a call failed (the line says which). */
static double lab_blas(cublasLtHandle_t lt, const char *name, bool fp8, bool fast_accum, int m,
		       int n, int k, const void *a, const void *b, void *d, const float *one,
		       void *ws, size_t wsz)
{
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
	int8_t fast = fast_accum ? 1 : 0;
	int found = 0;
	float alpha = 1.0f, beta = 0.0f, ms = -1.0f;
	char why[WK_ERRSZ] = "";
	double tflops = 0;
	memset(&heur, 0, sizeof heur);
	LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
	LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
	if (fp8) {
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &one,
							sizeof one));
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one,
							sizeof one));
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
							sizeof fast));
	}
	LT_CHECK(cublasLtMatrixLayoutCreate(&la, in, (uint64_t)k, (uint64_t)m, (int64_t)k));
	LT_CHECK(cublasLtMatrixLayoutCreate(&lb, in, (uint64_t)k, (uint64_t)n, (int64_t)k));
	LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, (int64_t)m));
	LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						      &wsz, sizeof wsz));
	LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
	if (found < 1) {
		snprintf(why, sizeof why, "cublasLtMatmulAlgoGetHeuristic found no algorithm");
		goto out;
	}
	{
		cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
		ms = time_ms([&] {
			for (int c = 0; c < MM_CALLS && st == CUBLAS_STATUS_SUCCESS; c++)
				st = cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d,
						    ld, &heur.algo, ws, wsz, 0);
			return st == CUBLAS_STATUS_SUCCESS ? WK_OK : WK_EIO;
		}) / MM_CALLS;
		if (st != CUBLAS_STATUS_SUCCESS) {
			snprintf(why, sizeof why, "cublasLtMatmul: %s", cublasLtGetStatusString(st));
			goto out;
		}
		if (ms <= 0) {
			snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
			goto out;
		}
	}
	tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
	printf("%-40s %10.0f   (%.3f ms)\n", name, tflops, ms);
out:
	if (tflops <= 0)
		printf("%-40s %10s   (%s)\n", name, "FAILED", why);
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (ld)
		cublasLtMatrixLayoutDestroy(ld);
	if (lb)
		cublasLtMatrixLayoutDestroy(lb);
	if (la)
		cublasLtMatrixLayoutDestroy(la);
	if (op)
		cublasLtMatmulDescDestroy(op);
	return tflops;
}

/* The matrix ceilings: cuBLASLt bf16 and FP8 on the prefill and LARGE^3 shapes (and
 * FP8 with fast accumulation on LARGE^3, for reference), on random finite inputs. Prints a
 * line each; a failure prints its line and leaves that ceiling unmeasured. */
static void lab_ceilings(struct blas_ceilings *c)
{
	const size_t big = (size_t)LARGE * LARGE * 2, wsz = (size_t)64 << 20;
	void *a = NULL, *b = NULL, *d = NULL, *ws = NULL, *one = NULL;
	cublasLtHandle_t lt = NULL;
	char err[WK_ERRSZ] = "", name[64];
	const float one_h = 1.0f;
	cublasStatus_t st = cublasLtCreate(&lt);
	c->fp8_prefill = c->fp8_large = c->bf16_prefill = c->bf16_large = 0;
	if (st != CUBLAS_STATUS_SUCCESS) {
		printf("%-40s %10s   (cublasLtCreate: %s)\n", "cuBLASLt", "FAILED",
		       cublasLtGetStatusString(st));
		return;
	}
	if (wk_cuda_alloc(&a, big, err, sizeof err) || wk_cuda_alloc(&b, big, err, sizeof err) ||
	    wk_cuda_alloc(&d, big, err, sizeof err) || wk_cuda_alloc(&ws, wsz, err, sizeof err) ||
	    wk_cuda_alloc(&one, 4, err, sizeof err) || wk_cuda_upload(one, &one_h, 4, err, sizeof err) ||
	    fill_random(a, big, false, -1, 1) || fill_random(b, big, false, -1, 1)) {
		printf("%-40s %10s   (%s)\n", "cuBLASLt", "FAILED", err[0] ? err : "cannot fill the inputs");
		goto out;
	}
	snprintf(name, sizeof name, "cuBLASLt bf16 %dx%dx%d", PREFILL_N, PREFILL_ROWS, PREFILL_COLS);
	c->bf16_prefill = lab_blas(lt, name, false, false, PREFILL_ROWS, PREFILL_N, PREFILL_COLS, a,
				   b, d, (const float *)one, ws, wsz);
	snprintf(name, sizeof name, "cuBLASLt bf16 %dx%dx%d", LARGE, LARGE, LARGE);
	c->bf16_large = lab_blas(lt, name, false, false, LARGE, LARGE, LARGE, a, b, d,
				 (const float *)one, ws, wsz);
	snprintf(name, sizeof name, "cuBLASLt fp8 %dx%dx%d", PREFILL_N, PREFILL_ROWS, PREFILL_COLS);
	c->fp8_prefill = lab_blas(lt, name, true, false, PREFILL_ROWS, PREFILL_N, PREFILL_COLS, a, b,
				  d, (const float *)one, ws, wsz);
	snprintf(name, sizeof name, "cuBLASLt fp8 %dx%dx%d", LARGE, LARGE, LARGE);
	c->fp8_large = lab_blas(lt, name, true, false, LARGE, LARGE, LARGE, a, b, d,
				(const float *)one, ws, wsz);
	snprintf(name, sizeof name, "cuBLASLt fp8 fast-accum %d^3", LARGE);
	lab_blas(lt, name, true, true, LARGE, LARGE, LARGE, a, b, d, (const float *)one, ws, wsz);
out:
	wk_cuda_free(a);
	wk_cuda_free(b);
	wk_cuda_free(d);
	wk_cuda_free(ws);
	wk_cuda_free(one);
	cublasLtDestroy(lt);
}
#else
static void lab_ceilings(struct blas_ceilings *c)
{
	c->fp8_prefill = c->fp8_large = c->bf16_prefill = c->bf16_large = 0;
	printf("%-40s %10s   (built without cuBLASLt: no libcublasLt in the CUDA toolkit)\n",
	       "cuBLASLt", "SKIPPED");
}
#endif

extern "C" int wk_cuda_lab(const char *only)
{
	char err[WK_ERRSZ];
	if (only && strcmp(only, "gemv") && strcmp(only, "gemm") && strcmp(only, "prefill"))
		return WK_EINVAL;
	bool gemv = !only || !strcmp(only, "gemv"), gemm = !only || !strcmp(only, "gemm");
	bool prefill = !only || !strcmp(only, "prefill");
	size_t copy_bytes = (size_t)2 << 30; /* 2 GiB each way */
	void *src = NULL, *dst = NULL, *w = NULL, *scale = NULL, *x = NULL;
	int rc = WK_EIO;
	if (wk_cuda_alloc(&src, copy_bytes, err, sizeof err) ||
	    wk_cuda_alloc(&dst, copy_bytes, err, sizeof err) ||
	    wk_cuda_alloc(&w, GEMV_W_BYTES, err, sizeof err) ||
	    wk_cuda_alloc(&scale, (size_t)GEMV_SCALES * 4, err, sizeof err) ||
	    wk_cuda_alloc(&x, (size_t)8 * GEMV_MAX_COLS * 4, err, sizeof err)) {
		fprintf(stderr, "cuda_lab: %s\n", err);
		goto out;
	}
	/* random, finite inputs: never time on zeros */
	if (fill_random(src, copy_bytes, false, -1, 1) || fill_random(w, GEMV_W_BYTES, false, -1, 1) ||
	    fill_random(scale, (size_t)GEMV_SCALES * 4, true, 0.5f, 1.5f) ||
	    fill_random(x, (size_t)8 * GEMV_MAX_COLS * 4, true, -1, 1)) {
		fprintf(stderr, "cuda_lab: cannot fill the inputs\n");
		goto out;
	}
	{
		float copy = time_ms([&] {
			return cudaMemcpy(dst, src, copy_bytes, cudaMemcpyDeviceToDevice) == cudaSuccess
				       ? WK_OK : WK_EIO;
		});
		if (copy <= 0) {
			fprintf(stderr, "cuda_lab: the copy failed\n");
			goto out;
		}
		double ceil_gbs = 2.0 * copy_bytes / (copy * 1e-3) / 1e9;
		struct blas_ceilings blas;
		printf("%-40s %10s\n", "ceiling", "GB/s");
		printf("%-40s %10.0f\n", "device copy (read + write)", ceil_gbs);
		printf("%-40s %10s\n", "ceiling", "TFLOPS");
		lab_ceilings(&blas);
		printf("\n");
		rc = gemv ? lab_gemv(ceil_gbs, w, (const float *)scale, (const float *)x) : WK_OK;
		for (int tiny = 0; gemv && tiny < 2; tiny++)
			if (lab_chain(ceil_gbs, w, (const float *)scale, (const float *)x, tiny))
				rc = WK_EIO;
		if (gemv)
			printf("\n%-40s %10s %10s   (a decode step's routed experts: top 8 of 256, "
			       "6144 x 2048)\n", "kernel (decode MoE experts)", "GB/s", "of copy");
		if (gemv && (lab_moe(1, 0, ceil_gbs) != WK_OK || lab_moe(8, 0, ceil_gbs) != WK_OK))
			rc = WK_EIO;
		if (gemv && lab_attention(ceil_gbs) != WK_OK)
			rc = WK_EIO;
		if (gemv && lab_mla(ceil_gbs) != WK_OK)
			rc = WK_EIO;
		if (gemv && lab_dsa_decode(ceil_gbs) != WK_OK)
			rc = WK_EIO;
		if (gemm)
			printf("\n%-40s %10s %12s\n", "kernel (prefill)", "TFLOPS", "of cuBLASLt");
		if (gemm && (lab_gemm_fp8(PREFILL_N, PREFILL_ROWS, PREFILL_COLS,
					  blas.fp8_prefill) != WK_OK ||
			     lab_gemm_fp8(LARGE, LARGE, LARGE, blas.fp8_large) != WK_OK ||
			     lab_gemm_fp8w(PREFILL_N, PREFILL_ROWS, PREFILL_COLS,
					   blas.bf16_prefill) != WK_OK ||
			     lab_gemm_fp8w(LARGE, LARGE, LARGE, blas.bf16_large) != WK_OK ||
			     lab_moe(PREFILL_N, blas.bf16_prefill, ceil_gbs) != WK_OK))
			rc = WK_EIO;
		if (prefill && lab_attention_prefill() != WK_OK)
			rc = WK_EIO;
		if (prefill && lab_mla_prefill() != WK_OK)
			rc = WK_EIO;
		if (prefill && lab_mla_latent() != WK_OK)
			rc = WK_EIO;
		if (prefill && lab_dsa_prefill() != WK_OK)
			rc = WK_EIO;
	}
out:
	wk_cuda_free(src);
	wk_cuda_free(dst);
	wk_cuda_free(w);
	wk_cuda_free(scale);
	wk_cuda_free(x);
	return rc;
}
