/*
 * lab.cu - the kernel lab's benchmark: each kernel's achieved bandwidth beside the ceiling
 * measured first in the same run, a large device-to-device cudaMemcpy (bytes read plus bytes
 * written). Decode is bound by reading the weights, so a GEMV's figure is the weight bytes it
 * read per second; the target on H200 is >= 75% of the copy figure. Prefill is bound by the
 * tensor cores, so the FP8 GEMM's figure is TFLOPS (2 n rows cols per call) on a prefill
 * shape, checked first against the CPU reference; the target is 1,000 (issue 9, wgmma).
 * Timed with CUDA events, median of 5 after a warm-up. Run by tests/tools/cuda_lab (and
 * scripts/gpu-check).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}

#define REPS 5

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Milliseconds of one call of what(), the median of REPS after a warm-up; < 0 on error. */
template <typename F> static float time_ms(F what)
{
	cudaEvent_t a, b;
	float ms[REPS];
	if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
		return -1.0f;
	if (what() != WK_OK || cudaDeviceSynchronize() != cudaSuccess)
		return -1.0f;
	for (int r = 0; r < REPS; r++) {
		cudaEventRecord(a);
		if (what() != WK_OK)
			return -1.0f;
		cudaEventRecord(b);
		if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms[r], a, b) != cudaSuccess)
			return -1.0f;
	}
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	qsort(ms, REPS, sizeof ms[0], cmp_float);
	return ms[REPS / 2];
}

static uint64_t lab_rng = 0x853c49e6748fea9bull;

static uint32_t lab_next(void)
{
	lab_rng ^= lab_rng << 13;
	lab_rng ^= lab_rng >> 7;
	lab_rng ^= lab_rng << 17;
	return (uint32_t)(lab_rng >> 32);
}

static uint8_t lab_code(void) /* any e4m3 code but the NaNs (0x7f, 0xff) */
{
	uint8_t b = (uint8_t)lab_next();
	return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

static float lab_scale(float mid) /* mid * [0.5, 1.5) */
{
	return mid * (0.5f + (float)(lab_next() >> 8) / 16777216.0f);
}

/* wk_cuda_gemm_fp8 on n x rows x cols = 4096 x 7168 x 2048 (a prefill of 4096 tokens through
 * a 7168-wide projection) on random finite codes and scales (never zeros: they can run
 * faster than data), after four tokens' rows were compared with cpu_ref_gemm_fp8 (1e-3 of
 * the largest). Prints one line; WK_OK, or WK_EIO when a step failed or the check did. */
static int lab_gemm_fp8(void)
{
	const int n = 4096, rows = 7168, cols = 2048, sc = cols / 128;
	const size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
	const char *name = "gemm fp8 4096x7168x2048 mma.sync";
	char err[WK_ERRSZ] = "";
	uint8_t *xq = (uint8_t *)malloc(nx), *w = (uint8_t *)malloc(nw);
	float *xs = (float *)malloc((size_t)n * sc * 4), *ws = (float *)malloc((size_t)(rows / 128) * sc * 4);
	float *want = (float *)malloc((size_t)rows * 4), *got = (float *)malloc((size_t)rows * 4);
	void *dxq = NULL, *dw = NULL, *dxs = NULL, *dws = NULL, *dy = NULL;
	int rc = WK_EIO;
	double worst = 0;
	if (!xq || !w || !xs || !ws || !want || !got) {
		snprintf(err, sizeof err, "out of host memory");
		goto out;
	}
	for (size_t i = 0; i < nx; i++)
		xq[i] = lab_code();
	for (size_t i = 0; i < nw; i++)
		w[i] = lab_code();
	for (int i = 0; i < n * sc; i++)
		xs[i] = lab_scale(1.0f / 448.0f);
	for (int i = 0; i < rows / 128 * sc; i++)
		ws[i] = lab_scale(1e-3f);
	if (wk_cuda_alloc(&dxq, nx, err, sizeof err) || wk_cuda_alloc(&dw, nw, err, sizeof err) ||
	    wk_cuda_alloc(&dxs, (size_t)n * sc * 4, err, sizeof err) ||
	    wk_cuda_alloc(&dws, (size_t)(rows / 128) * sc * 4, err, sizeof err) ||
	    wk_cuda_alloc(&dy, ny * 4, err, sizeof err) ||
	    wk_cuda_upload(dxq, xq, nx, err, sizeof err) ||
	    wk_cuda_upload(dw, w, nw, err, sizeof err) ||
	    wk_cuda_upload(dxs, xs, (size_t)n * sc * 4, err, sizeof err) ||
	    wk_cuda_upload(dws, ws, (size_t)(rows / 128) * sc * 4, err, sizeof err) ||
	    wk_cuda_gemm_fp8((float *)dy, (const uint8_t *)dxq, (const float *)dxs,
			     (const uint8_t *)dw, (const float *)dws, n, rows, cols, err,
			     sizeof err) ||
	    wk_cuda_sync(err, sizeof err))
		goto out;
	{
		const int toks[] = {0, 1, 2049, n - 1};
		for (int k = 0; k < 4; k++) {
			int t = toks[k];
			cpu_ref_gemm_fp8(want, xq + (size_t)t * cols, xs + (size_t)t * sc, w, ws, 1, rows,
					 cols);
			if (wk_cuda_download(got, (const float *)dy + (size_t)t * rows, (size_t)rows * 4,
					     err, sizeof err))
				goto out;
			double d = 0, m = 0;
			for (int r = 0; r < rows; r++) {
				d = fmax(d, isfinite(got[r]) ? fabs((double)got[r] - want[r]) : INFINITY);
				m = fmax(m, fabs((double)want[r]));
			}
			worst = fmax(worst, m > 0 ? d / m : d);
		}
		if (!(worst <= 1e-3)) {
			snprintf(err, sizeof err, "WRONG: %.3g of the largest output off", worst);
			goto out;
		}
		float ms = time_ms([&] {
			return wk_cuda_gemm_fp8((float *)dy, (const uint8_t *)dxq, (const float *)dxs,
						(const uint8_t *)dw, (const float *)dws, n, rows, cols,
						err, sizeof err);
		});
		if (ms <= 0)
			goto out;
		double tflops = 2.0 * n * rows * cols / (ms * 1e-3) / 1e12;
		printf("%-34s %10.0f   (%.3f ms; checked: %.1e of the largest)\n", name, tflops, ms,
		       worst);
		rc = WK_OK;
	}
out:
	if (rc != WK_OK)
		printf("%-34s %10s   (%s)\n", name, "FAILED", err);
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

/* Fills dev (bytes) with random data, never zeros (they can time faster than real data,
 * METHOD.md): f32 values in [lo, hi) (f32), or bf16 values in [-1, 1) (!f32) whose bytes are
 * also finite e4m3 codes (no 0x7f / 0xff), so one buffer serves the bf16 and the FP8 cases.
 * Uploaded in 64 MiB pieces. Returns WK_OK or WK_EIO. */
static int fill_random(void *dev, size_t bytes, bool f32, float lo, float hi)
{
	const size_t piece = (size_t)64 << 20;
	unsigned char *h = (unsigned char *)malloc(piece);
	if (!h)
		return WK_EIO;
	int rc = WK_OK;
	for (size_t off = 0; off < bytes && rc == WK_OK; off += piece) {
		size_t n = bytes - off < piece ? bytes - off : piece;
		for (size_t i = 0; i + 4 <= n; i += 4) {
			float v = lo + (hi - lo) * (float)(lab_next() >> 8) / 16777216.0f;
			if (f32) {
				memcpy(h + i, &v, 4);
				continue;
			}
			uint32_t u;
			memcpy(&u, &v, 4);
			for (int k = 0; k < 2; k++) { /* two bf16 per 4 bytes */
				uint16_t b = (uint16_t)((k ? lab_next() : u) >> 16);
				for (int j = 0; j < 2; j++) {
					unsigned char c = (unsigned char)(b >> (8 * j));
					h[i + 2 * k + j] = (c & 0x7f) == 0x7f ? (unsigned char)(c ^ 1) : c;
				}
			}
		}
		if (cudaMemcpy((char *)dev + off, h, n, cudaMemcpyHostToDevice) != cudaSuccess)
			rc = WK_EIO;
	}
	free(h);
	return rc;
}

extern "C" int wk_cuda_lab(void)
{
	char err[WK_ERRSZ];
	size_t copy_bytes = (size_t)2 << 30; /* 2 GiB each way */
	int rows = 16384, cols = 8192;        /* 256 MiB of bf16, 128 MiB of fp8 */
	void *src = NULL, *dst = NULL, *w = NULL, *scale = NULL, *x = NULL, *y = NULL;
	int rc = WK_EIO;
	if (wk_cuda_alloc(&src, copy_bytes, err, sizeof err) ||
	    wk_cuda_alloc(&dst, copy_bytes, err, sizeof err) ||
	    wk_cuda_alloc(&w, (size_t)rows * cols * 2, err, sizeof err) ||
	    wk_cuda_alloc(&scale, (size_t)(rows / 128) * (cols / 128) * 4, err, sizeof err) ||
	    wk_cuda_alloc(&x, (size_t)8 * cols * 4, err, sizeof err) ||
	    wk_cuda_alloc(&y, (size_t)8 * rows * 4, err, sizeof err)) {
		fprintf(stderr, "cuda_lab: %s\n", err);
		goto out;
	}
	/* random, finite inputs: never time on zeros */
	if (fill_random(src, copy_bytes, false, -1, 1) || fill_random(w, (size_t)rows * cols * 2,
								      false, -1, 1) ||
	    fill_random(scale, (size_t)(rows / 128) * (cols / 128) * 4, true, 0.5f, 1.5f) ||
	    fill_random(x, (size_t)8 * cols * 4, true, -1, 1)) {
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
		printf("%-34s %10s %10s\n", "kernel", "GB/s", "of copy");
		printf("%-34s %10.0f %9.0f%%\n", "device copy (read + write)", ceil_gbs, 100.0);
		struct {
			const char *name;
			int n, fp8;
		} cases[] = {{"matmul bf16, 1 token (decode)", 1, 0}, {"matmul bf16, 8 tokens", 8, 0},
			     {"matmul fp8, 1 token (decode)", 1, 1}, {"matmul fp8, 8 tokens", 8, 1}};
		rc = WK_OK;
		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
			int n = cases[i].n, fp8 = cases[i].fp8;
			float ms = time_ms([&] {
				return fp8 ? wk_cuda_matmul_fp8((float *)y, (const float *)x,
								(const uint8_t *)w, (const float *)scale,
								n, rows, cols, err, sizeof err)
					   : wk_cuda_matmul((float *)y, (const float *)x, w, DT_BF16,
							    n, rows, cols, err, sizeof err);
			});
			if (ms <= 0) {
				printf("%-34s %10s   (%s)\n", cases[i].name, "FAILED", err);
				rc = WK_EIO;
				continue;
			}
			double gbs = (double)rows * cols * (fp8 ? 1 : 2) / (ms * 1e-3) / 1e9;
			printf("%-34s %10.0f %9.0f%%\n", cases[i].name, gbs, 100.0 * gbs / ceil_gbs);
		}
		printf("\n%-34s %10s\n", "kernel (prefill)", "TFLOPS");
		if (lab_gemm_fp8() != WK_OK)
			rc = WK_EIO;
	}
out:
	wk_cuda_free(src);
	wk_cuda_free(dst);
	wk_cuda_free(w);
	wk_cuda_free(scale);
	wk_cuda_free(x);
	wk_cuda_free(y);
	return rc;
}
