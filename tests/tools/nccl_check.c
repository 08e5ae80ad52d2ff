/*
 * nccl_check.c - the NCCL collectives on real GPUs, for scripts/gpu-check.
 *
 *   nccl_check [--world N | --all]
 *
 * Runs comm_nccl_selftest (kernels/cuda/comm_nccl.cu): init, all_reduce, all_gather,
 * reduce_scatter, all_to_all, all_to_allv, barrier and vote over N GPUs (default 1: the one-rank
 * smoke test; --all: every visible GPU, which must be at least 2). Exit status: 0 passed,
 * 1 failed, 77 skipped (no CUDA, no NCCL, or fewer GPUs than asked; the reason is printed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/comm.h"

int cuda_device_count(void); /* kernels/cuda: 0 without CUDA or GPUs */

int main(int argc, char **argv)
{
	int world = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--all")) {
			world = cuda_device_count();
			if (world < 2) {
				printf("SKIP: the multi-GPU NCCL test needs >= 2 GPUs; %d visible\n",
				       world);
				return 77;
			}
		} else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
			world = atoi(argv[++i]);
			if (world < 1 || world > COMM_MAX_WORLD) {
				fprintf(stderr, "nccl_check: --world wants 1..%d\n", COMM_MAX_WORLD);
				return 2;
			}
		} else {
			fprintf(stderr, "usage: nccl_check [--world N | --all]\n");
			return 2;
		}
	}
	char err[WK_ERRSZ];
	int rc = comm_nccl_selftest(world, err, sizeof err);
	if (rc == WK_EUNSUPPORTED) {
		printf("SKIP: %s\n", err);
		return 77;
	}
	if (rc != WK_OK) {
		printf("FAIL: %s\n", err);
		return 1;
	}
	printf("ok: NCCL all_reduce, all_gather, reduce_scatter, all_to_all, all_to_allv and "
	       "barrier and vote over %d GPU%s\n", world, world == 1 ? "" : "s");
	return 0;
}
