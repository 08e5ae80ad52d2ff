/*
 * cuda_lab - the kernel lab's benchmark (kernels/cuda/lab.cu): a table of each CUDA kernel's
 * achieved bandwidth against the device's copy bandwidth, measured first in the same run,
 * then the FP8 GEMM's TFLOPS on 4096 x 7168 x 2048 (checked against the CPU first).
 * Exit 0 when it ran, 77 with no GPU (or a build without CUDA), 1 when a step failed.
 */
#include <stdio.h>

#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"

int main(void)
{
	if (cuda_device_count() <= 0) {
		printf("NO GPU: no CUDA device visible (or a build without CUDA)\n");
		return 77;
	}
	return wk_cuda_lab() == WK_OK ? 0 : 1;
}
