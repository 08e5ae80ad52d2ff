/*
 * comm_none.c - the NCCL collectives' entry in a build without nvcc (or with CUDA=0): init
 * fails with a clear message, so a sharded engine on GPUs is refused instead of missing a
 * symbol. The CPU collectives (engine/comm_cpu.c) are always built.
 */
#include "common/wk.h"
#include "engine/comm.h"

static int init(void **ctx, int world, char *err, size_t errsz)
{
	(void)ctx;
	(void)world;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "comm nccl: this wick was built without CUDA (nvcc not found, or CUDA=0)");
}

const struct comm_ops comm_nccl = {.name = "nccl", .init = init};

int comm_nccl_selftest(int world, char *err, size_t errsz)
{
	return init(NULL, world, err, errsz);
}
