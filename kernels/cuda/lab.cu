/*
 * lab.cu - the kernel lab's benchmark: each kernel's achieved bandwidth beside the ceiling
 * measured first in the same run, a large device-to-device cudaMemcpy (bytes read plus bytes
 * written). Decode is bound by reading the weights, so a GEMV's figure is the weight bytes it
 * read per second; the target on H200 is >= 75% of the copy figure. Timed with CUDA events,
 * median of 5 after a warm-up. Run by tests/tools/cuda_lab (and scripts/gpu-check).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

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
	/* contents do not matter for timing, but NaN inputs could: zero them */
	cudaMemset(src, 0, copy_bytes);
	cudaMemset(w, 0, (size_t)rows * cols * 2);
	cudaMemset(scale, 0, (size_t)(rows / 128) * (cols / 128) * 4);
	cudaMemset(x, 0, (size_t)8 * cols * 4);
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
