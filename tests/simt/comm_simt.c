/*
 * comm_simt.c - the NCCL collectives' entry in the emulated wick (build/simt/wick): the
 * emulator's devices all live in the one host memory, so the in-process collectives of
 * engine/comm_cpu.c do what NCCL does between GPUs, and a sharded engine on --backend cuda
 * runs there with a thread per rank, rank r on emulated device r (WICK_SIMT_DEVICES). This
 * checks the CUDA backend's part of a sharded run (each rank's kernels on its shard, experts
 * of its own range, device selection per rank thread), not NCCL itself: nccl_check on a GPU
 * machine does that (scripts/gpu-check). comm_cpu's collectives touch every rank's buffers
 * from the host, so each opens every device's memory while it runs (simt_device_access: the
 * emulator keeps a device's memory closed to the host and to other devices' kernels,
 * simt_mem.cpp), as NCCL's kernels would reach it; only once every rank has arrived (a barrier
 * first: no rank is launching a kernel then, so the open memory cannot hide one rank's
 * kernel reading another's), and closed by all before any goes on (a barrier after).
 */
#include "common/wk.h"
#include "engine/comm.h"

void simt_device_access(int open); /* simt_mem.cpp */

/* every rank here, then every device's memory open */
static int open_all(void *ctx, int rank, char *err, size_t errsz)
{
	int rc = comm_cpu.barrier(ctx, rank, err, errsz);
	simt_device_access(1);
	return rc;
}

/* closed again, then every rank here: rc or the barrier's error */
static int close_all(void *ctx, int rank, int rc, char *err, size_t errsz)
{
	simt_device_access(0);
	int rc2 = comm_cpu.barrier(ctx, rank, err, errsz);
	return rc != WK_OK ? rc : rc2;
}

static int init(void **ctx, int world, char *err, size_t errsz)
{
	return comm_cpu.init(ctx, world, err, errsz);
}

static void destroy(void *ctx)
{
	comm_cpu.destroy(ctx);
}

static int all_reduce(void *ctx, int rank, float *buf, size_t n, char *err, size_t errsz)
{
	int rc = open_all(ctx, rank, err, errsz);
	int rc2 = comm_cpu.all_reduce(ctx, rank, buf, n, err, errsz);
	return close_all(ctx, rank, rc != WK_OK ? rc : rc2, err, errsz);
}

static int all_gather(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	int rc = open_all(ctx, rank, err, errsz);
	int rc2 = comm_cpu.all_gather(ctx, rank, send, recv, bytes, err, errsz);
	return close_all(ctx, rank, rc != WK_OK ? rc : rc2, err, errsz);
}

static int reduce_scatter(void *ctx, int rank, const float *send, float *recv, size_t n,
			  char *err, size_t errsz)
{
	int rc = open_all(ctx, rank, err, errsz);
	int rc2 = comm_cpu.reduce_scatter(ctx, rank, send, recv, n, err, errsz);
	return close_all(ctx, rank, rc != WK_OK ? rc : rc2, err, errsz);
}

static int all_to_all(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	int rc = open_all(ctx, rank, err, errsz);
	int rc2 = comm_cpu.all_to_all(ctx, rank, send, recv, bytes, err, errsz);
	return close_all(ctx, rank, rc != WK_OK ? rc : rc2, err, errsz);
}

static int all_to_allv(void *ctx, int rank, const void *send, const size_t *scount,
		       const size_t *sdispl, void *recv, const size_t *rcount,
		       const size_t *rdispl, char *err, size_t errsz)
{
	int rc = open_all(ctx, rank, err, errsz);
	int rc2 = comm_cpu.all_to_allv(ctx, rank, send, scount, sdispl, recv, rcount, rdispl, err,
				    errsz);
	return close_all(ctx, rank, rc != WK_OK ? rc : rc2, err, errsz);
}

static int barrier(void *ctx, int rank, char *err, size_t errsz)
{
	return comm_cpu.barrier(ctx, rank, err, errsz);
}

static int vote(void *ctx, int rank, int yes, int *all_yes, char *err, size_t errsz)
{
	return comm_cpu.vote(ctx, rank, yes, all_yes, err, errsz);
}

const struct comm_ops comm_nccl = {
	.name = "nccl (emulated: comm_cpu)",
	.init = init,
	.destroy = destroy,
	.all_reduce = all_reduce,
	.all_gather = all_gather,
	.reduce_scatter = reduce_scatter,
	.all_to_all = all_to_all,
	.all_to_allv = all_to_allv,
	.barrier = barrier,
	.vote = vote,
};

int comm_nccl_selftest(int world, char *err, size_t errsz)
{
	(void)world;
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "NCCL is not emulated (run nccl_check on a GPU)");
}
