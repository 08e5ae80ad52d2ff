/*
 * cuda_lab - the kernel lab's benchmark (kernels/cuda/lab.cu): a table of each CUDA kernel's
 * achieved bandwidth against the device's copy bandwidth, measured first in the same run,
 * then the FP8 GEMMs' TFLOPS on 4096 x 7168 x 2048 and 8192^3 (checked against the CPU
 * first): FP8 x FP8 beside cuBLASLt's FP8, and FP8 weights x f32 activations (gemm_fp8w.cu)
 * beside cuBLASLt's bf16.
 *
 *   cuda_lab [gemv|gemm|prefill]   the ceilings and then only that part (a profiler's short
 *                                  run; prefill: the prefill attention's tables)
 *
 * Exit 0 when it ran, 77 with no GPU (or a build without CUDA), 1 when a step failed, 2 on
 * a usage error.
 */
#include <stdio.h>
#include <string.h>

#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"

int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : NULL;
	if (argc > 2 ||
	    (only && strcmp(only, "gemv") && strcmp(only, "gemm") && strcmp(only, "prefill"))) {
		fprintf(stderr, "usage: cuda_lab [gemv|gemm|prefill]\n");
		return 2;
	}
	if (cuda_device_count() <= 0) {
		printf("NO GPU: no CUDA device visible (or a build without CUDA)\n");
		return 77;
	}
	return wk_cuda_lab(only) == WK_OK ? 0 : 1;
}
