/*
 * comm_cpu.c - the in-process collectives: ranks are threads of this process, buffers are
 * host memory (comm.h has the contract).
 *
 * Every op has the same shape: each rank publishes its arguments in its slot, waits at a
 * barrier, checks that the ranks agree on the counts (all ranks read the same slots, so they
 * reach the same verdict and none is left waiting), does its part reading the other ranks'
 * buffers directly, and waits at a second barrier so no buffer changes while a peer reads it.
 * Two barriers per op, no copies through a staging buffer, no allocation.
 *
 * all_reduce: rank k owns the elements [k n / world, (k + 1) n / world); it sums them over
 * the ranks in order 0, 1, ..., world-1 and writes the sum into every rank's buffer. Each
 * element is summed by exactly one thread in a fixed order, so the result is the same bits on
 * every rank and every run, however the threads are scheduled. reduce_scatter sums the same
 * way. The barrier is pthread_barrier_wait (futex sleeps, no spinning): the machines that run
 * the CPU emulation often have fewer cores than ranks.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/comm.h"

struct slot {
	const void *send;
	void *recv;
	size_t n; /* elements or bytes, as the op takes them */
	const size_t *scount, *sdispl, *rcount, *rdispl;
};

struct ccomm {
	int world;
	pthread_barrier_t bar;
	struct slot s[COMM_MAX_WORLD];
};

static int init(void **ctx, int world, char *err, size_t errsz)
{
	if (world < 1 || world > COMM_MAX_WORLD)
		return wk_errf(err, errsz, WK_EINVAL, "comm cpu: world %d is outside 1..%d", world,
			       COMM_MAX_WORLD);
	struct ccomm *c = calloc(1, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "comm cpu: out of memory");
	c->world = world;
	if (pthread_barrier_init(&c->bar, NULL, (unsigned)world) != 0) {
		free(c);
		return wk_errf(err, errsz, WK_ENOMEM, "comm cpu: cannot create a barrier");
	}
	*ctx = c;
	return WK_OK;
}

static void destroy(void *ctx)
{
	struct ccomm *c = ctx;
	if (!c)
		return;
	pthread_barrier_destroy(&c->bar);
	free(c);
}

static void wait_all(struct ccomm *c)
{
	pthread_barrier_wait(&c->bar);
}

/* Publishes this rank's slot, waits for the others, and checks that every rank passed the
 * same n. Same verdict on every rank. */
static int enter(struct ccomm *c, int rank, const struct slot *mine, const char *op, char *err,
		 size_t errsz)
{
	c->s[rank] = *mine;
	wait_all(c);
	for (int r = 1; r < c->world; r++)
		if (c->s[r].n != c->s[0].n)
			return wk_errf(err, errsz, WK_EINVAL,
				       "comm cpu: %s: rank %d passed %zu, rank 0 passed %zu", op, r,
				       c->s[r].n, c->s[0].n);
	return WK_OK;
}

/* The second barrier, then the verdict. */
static int leave(struct ccomm *c, int rc)
{
	wait_all(c);
	return rc;
}

static int all_reduce(void *ctx, int rank, float *buf, size_t n, char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.recv = buf, .n = n};
	int rc = enter(c, rank, &me, "all_reduce", err, errsz);
	if (rc == WK_OK && c->world > 1) {
		size_t lo = n * (size_t)rank / (size_t)c->world;
		size_t hi = n * (size_t)(rank + 1) / (size_t)c->world;
		enum { BLK = 256 };
		float sum[BLK];
		for (size_t i0 = lo; i0 < hi; i0 += BLK) {
			size_t m = hi - i0 < BLK ? hi - i0 : BLK;
			memcpy(sum, (const float *)c->s[0].recv + i0, m * sizeof *sum);
			for (int r = 1; r < c->world; r++) {
				const float *x = (const float *)c->s[r].recv + i0;
				for (size_t i = 0; i < m; i++)
					sum[i] += x[i];
			}
			for (int r = 0; r < c->world; r++)
				memcpy((float *)c->s[r].recv + i0, sum, m * sizeof *sum);
		}
	}
	return leave(c, rc);
}

static int all_gather(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.send = send, .recv = recv, .n = bytes};
	int rc = enter(c, rank, &me, "all_gather", err, errsz);
	if (rc == WK_OK)
		for (int r = 0; r < c->world; r++)
			memcpy((char *)recv + (size_t)r * bytes, c->s[r].send, bytes);
	return leave(c, rc);
}

static int reduce_scatter(void *ctx, int rank, const float *send, float *recv, size_t n,
			  char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.send = send, .recv = recv, .n = n};
	int rc = enter(c, rank, &me, "reduce_scatter", err, errsz);
	if (rc == WK_OK) {
		size_t off = (size_t)rank * n;
		memcpy(recv, (const float *)c->s[0].send + off, n * sizeof *recv);
		for (int r = 1; r < c->world; r++) {
			const float *x = (const float *)c->s[r].send + off;
			for (size_t i = 0; i < n; i++)
				recv[i] += x[i];
		}
	}
	return leave(c, rc);
}

static int all_to_all(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.send = send, .recv = recv, .n = bytes};
	int rc = enter(c, rank, &me, "all_to_all", err, errsz);
	if (rc == WK_OK)
		for (int r = 0; r < c->world; r++)
			memcpy((char *)recv + (size_t)r * bytes,
			       (const char *)c->s[r].send + (size_t)rank * bytes, bytes);
	return leave(c, rc);
}

static int all_to_allv(void *ctx, int rank, const void *send, const size_t *scount,
		       const size_t *sdispl, void *recv, const size_t *rcount,
		       const size_t *rdispl, char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.send = send, .recv = recv, .scount = scount, .sdispl = sdispl,
			  .rcount = rcount, .rdispl = rdispl};
	int rc = enter(c, rank, &me, "all_to_allv", err, errsz);
	/* Every rank checks every pair, so all agree on the verdict. */
	for (int a = 0; rc == WK_OK && a < c->world; a++)
		for (int b = 0; b < c->world; b++)
			if (c->s[a].scount[b] != c->s[b].rcount[a]) {
				rc = wk_errf(err, errsz, WK_EINVAL,
					     "comm cpu: all_to_allv: rank %d sends %zu bytes to rank "
					     "%d, which expects %zu", a, c->s[a].scount[b], b,
					     c->s[b].rcount[a]);
				break;
			}
	if (rc == WK_OK)
		for (int r = 0; r < c->world; r++)
			memcpy((char *)recv + rdispl[r],
			       (const char *)c->s[r].send + c->s[r].sdispl[rank], rcount[r]);
	return leave(c, rc);
}

static int barrier(void *ctx, int rank, char *err, size_t errsz)
{
	(void)rank;
	(void)err;
	(void)errsz;
	wait_all(ctx);
	return WK_OK;
}

static int vote(void *ctx, int rank, int yes, int *all_yes, char *err, size_t errsz)
{
	struct ccomm *c = ctx;
	struct slot me = {.n = 0, .send = yes ? c : NULL}; /* non-NULL send: yes */
	int rc = enter(c, rank, &me, "vote", err, errsz);
	int all = 1;
	for (int r = 0; r < c->world; r++)
		all = all && c->s[r].send != NULL;
	*all_yes = all;
	return leave(c, rc);
}

const struct comm_ops comm_cpu = {
	.name = "cpu",
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

const struct comm_ops *comm_find(const char *name)
{
	if (!name)
		return NULL;
	if (!strcmp(name, "cpu"))
		return &comm_cpu;
	if (!strcmp(name, "nccl"))
		return &comm_nccl;
	return NULL;
}
