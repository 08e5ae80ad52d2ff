/*
 * comm.h - collectives for sharded execution: one interface, two implementations.
 *
 * A communicator joins `world` ranks of ONE process: the worker drives every local device
 * itself, one thread per rank, so the worker stays a single process (no MPI, no launcher).
 * Implementations:
 *   comm_cpu   engine/comm_cpu.c: ranks are threads on the CPU backend, buffers are host
 *              memory; deterministic (see below). Always available.
 *   comm_nccl  kernels/cuda/comm_nccl.cu: rank r is GPU r, buffers are device memory; one
 *              ncclCommInitAll over devices 0..world-1. Its init fails with a message in a
 *              build without CUDA, or where libnccl.so.2 or enough GPUs are missing.
 *
 * Contract for every collective:
 *   - each of the world ranks calls it, from its own thread, with its own rank, and every rank
 *     calls the communicator's collectives in the same order with the same counts;
 *   - it is blocking: when it returns, this rank's output is in place and its input may be
 *     reused (the NCCL version synchronizes its stream);
 *   - buffers of different ranks must not overlap, and an output must not overlap an input
 *     unless the op says "in place";
 *   - counts of f32 ops are elements, the others move bytes;
 *   - reductions are sums in a fixed order, ranks 0, 1, ..., world-1: comm_cpu gives the same
 *     bits on every rank and on every run (NCCL's order is its own, deterministic for a fixed
 *     algorithm and topology but not ours to choose).
 * An op returns WK_OK, or a WK_E* code with a message: WK_EINVAL when the ranks disagree on a
 * count (every rank then returns it, none deadlocks), WK_EIO for a failure inside NCCL/CUDA,
 * after which the communicator is unusable. Ops never allocate in comm_cpu.
 */
#ifndef COMM_H
#define COMM_H

#include <stddef.h>

#define COMM_MAX_WORLD 64 /* ranks in one communicator (= SNAP_MAX_RANKS) */

struct comm_ops {
	const char *name;
	/* Creates a communicator of world ranks (1..COMM_MAX_WORLD). Not a collective: called
	 * once, from any one thread, before the ranks use it. */
	int (*init)(void **ctx, int world, char *err, size_t errsz);
	void (*destroy)(void *ctx); /* after every rank is done with it; NULL is fine */

	/* buf [n] on every rank becomes the sum over ranks of buf (in place). */
	int (*all_reduce)(void *ctx, int rank, float *buf, size_t n, char *err, size_t errsz);
	/* recv [world][bytes]: recv[r] = rank r's send [bytes]. */
	int (*all_gather)(void *ctx, int rank, const void *send, void *recv, size_t bytes,
			  char *err, size_t errsz);
	/* send [world][n]; recv [n] = sum over ranks r of r's send[rank]. */
	int (*reduce_scatter)(void *ctx, int rank, const float *send, float *recv, size_t n,
			      char *err, size_t errsz);
	/* send [world][bytes], recv [world][bytes]: recv[r] = rank r's send[rank]. */
	int (*all_to_all)(void *ctx, int rank, const void *send, void *recv, size_t bytes,
			  char *err, size_t errsz);
	/* Variable sizes, all in bytes, arrays of world entries: this rank sends scount[r]
	 * bytes at send + sdispl[r] to rank r, and receives rcount[r] bytes from rank r at
	 * recv + rdispl[r]; rcount[r] must equal rank r's scount[rank]. */
	int (*all_to_allv)(void *ctx, int rank, const void *send, const size_t *scount,
			   const size_t *sdispl, void *recv, const size_t *rcount,
			   const size_t *rdispl, char *err, size_t errsz);
	/* Returns when every rank has called it. */
	int (*barrier)(void *ctx, int rank, char *err, size_t errsz);
	/* *all_yes = 1 when every rank passed yes != 0, else 0 (same on every rank): how ranks
	 * agree to stop when one of them failed on its own, e.g. out of memory, before a
	 * collective would leave the others waiting for it. Host ints, on every implementation. */
	int (*vote)(void *ctx, int rank, int yes, int *all_yes, char *err, size_t errsz);
};

extern const struct comm_ops comm_cpu;  /* engine/comm_cpu.c */
extern const struct comm_ops comm_nccl; /* kernels/cuda/comm_nccl.cu, or comm_none.c */

/* "cpu" or "nccl"; NULL for another name. */
const struct comm_ops *comm_find(const char *name);

/* The NCCL check that scripts/gpu-check runs (tests/tools/nccl_check): every op of comm_nccl
 * over GPUs 0..world-1, one thread each, against values computed on the host. Returns WK_OK;
 * WK_EUNSUPPORTED when there is no CUDA, no NCCL or fewer than world GPUs (the message says
 * which); WK_EIO naming the op, GPU and element that came out wrong. */
int comm_nccl_selftest(int world, char *err, size_t errsz);

#endif
