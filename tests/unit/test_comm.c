/*
 * The in-process collectives (engine/comm_cpu.c): every op at world 1, 2, 4 and 8, one thread
 * per rank, against a serial computation on the main thread. Reductions must equal the serial
 * sum in rank order 0..world-1 bit for bit (the inputs are random floats of mixed magnitude,
 * so another order would round differently), on every rank and on every run. Ranks that
 * disagree on a count all get WK_EINVAL instead of a deadlock.
 *
 * Criterion's asserts must run on the test's own thread, so the rank threads only record
 * their results; the checks come after the join.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/comm.h"

#define MAXW 8

enum op { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, ALL_TO_ALLV, BARRIER, VOTE };

struct rank {
	void *ctx;
	int rank, world;
	enum op op;
	size_t n;        /* elements per rank (per peer for the [world][n] ops) */
	size_t bad_n;    /* when nonzero, rank 1 passes this count instead */
	float *in, *out; /* in [world * n], out [world * n] */
	int rc;
	int yes, all_yes; /* VOTE */
	char err[WK_ERRSZ];
};

/* A random float of mixed magnitude for (rank, i, salt): sums depend on their order. */
static float val(int r, size_t i, unsigned salt)
{
	uint64_t z = ((uint64_t)r << 40) ^ (uint64_t)i ^ ((uint64_t)salt << 56);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	float m = (float)(z & 0xffffff) / (float)(1 << 24) - 0.5f;
	int e = (int)((z >> 24) % 24) - 12;
	return ldexpf(m, e);
}

static void *rank_main(void *arg)
{
	struct rank *k = arg;
	const struct comm_ops *c = &comm_cpu;
	size_t n = k->bad_n && k->rank == 1 ? k->bad_n : k->n, W = (size_t)k->world;
	switch (k->op) {
	case ALL_REDUCE:
		memcpy(k->out, k->in, n * sizeof(float));
		k->rc = c->all_reduce(k->ctx, k->rank, k->out, n, k->err, sizeof k->err);
		break;
	case ALL_GATHER:
		k->rc = c->all_gather(k->ctx, k->rank, k->in, k->out, n * sizeof(float), k->err,
				      sizeof k->err);
		break;
	case REDUCE_SCATTER:
		k->rc = c->reduce_scatter(k->ctx, k->rank, k->in, k->out, n, k->err, sizeof k->err);
		break;
	case ALL_TO_ALL:
		k->rc = c->all_to_all(k->ctx, k->rank, k->in, k->out, n * sizeof(float), k->err,
				      sizeof k->err);
		break;
	case ALL_TO_ALLV: {
		/* rank a sends (a + b) % 3 + (n ? n - 1 : 0) floats to rank b, from b * n */
		size_t sc[MAXW], sd[MAXW], rc[MAXW], rd[MAXW];
		for (size_t b = 0; b < W; b++) {
			sc[b] = ((size_t)k->rank + b) % 3 * sizeof(float);
			sd[b] = b * k->n * sizeof(float);
			rc[b] = (b + (size_t)k->rank) % 3 * sizeof(float);
			rd[b] = b * k->n * sizeof(float);
		}
		if (k->bad_n && k->rank == 1)
			rc[0] += sizeof(float);
		k->rc = c->all_to_allv(k->ctx, k->rank, k->in, sc, sd, k->out, rc, rd, k->err,
				       sizeof k->err);
		break;
	}
	case BARRIER:
		k->rc = c->barrier(k->ctx, k->rank, k->err, sizeof k->err);
		break;
	case VOTE:
		/* salt picks the rank that says no (salt >= world: nobody) */
		k->rc = c->vote(k->ctx, k->rank, k->rank != (int)k->bad_n, &k->all_yes, k->err,
				sizeof k->err);
		break;
	}
	return NULL;
}

/* Runs op on world threads; in[r] is filled from val(r, ., salt), out[r] with NaN-free -7. */
static void run(struct rank *k, int world, enum op op, size_t n, size_t bad_n, unsigned salt)
{
	void *ctx;
	char err[WK_ERRSZ];
	cr_assert_eq(comm_cpu.init(&ctx, world, err, sizeof err), WK_OK, "%s", err);
	pthread_t th[MAXW];
	size_t all = (size_t)world * (n ? n : 1);
	for (int r = 0; r < world; r++) {
		k[r] = (struct rank){.ctx = ctx, .rank = r, .world = world, .op = op, .n = n,
				     .bad_n = bad_n};
		k[r].in = malloc(all * sizeof(float));
		k[r].out = malloc(all * sizeof(float));
		cr_assert(k[r].in && k[r].out);
		for (size_t i = 0; i < all; i++) {
			k[r].in[i] = val(r, i, salt);
			k[r].out[i] = -7.0f;
		}
	}
	for (int r = 0; r < world; r++)
		cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &k[r]), 0);
	for (int r = 0; r < world; r++)
		pthread_join(th[r], NULL);
	comm_cpu.destroy(ctx);
}

static void release(struct rank *k, int world)
{
	for (int r = 0; r < world; r++) {
		free(k[r].in);
		free(k[r].out);
	}
}

static const int worlds[] = {1, 2, 4, 8};
static const size_t sizes[] = {1, 3, 7, 256, 1000, 4099};

#define EACH(body)                                                              \
	for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++)            \
		for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {    \
			int W = worlds[wi];                                       \
			size_t n = sizes[si];                                     \
			struct rank k[MAXW];                                      \
			body release(k, W);                                       \
		}

static void all_ok(struct rank *k, int W)
{
	for (int r = 0; r < W; r++)
		cr_assert_eq(k[r].rc, WK_OK, "rank %d of %d: %s", r, W, k[r].err);
}

Test(comm, all_reduce_is_the_serial_sum_in_rank_order)
{
	EACH({
		run(k, W, ALL_REDUCE, n, 0, 1);
		all_ok(k, W);
		for (size_t i = 0; i < n; i++) {
			float want = k[0].in[i];
			for (int r = 1; r < W; r++)
				want += k[r].in[i];
			for (int r = 0; r < W; r++)
				cr_assert(memcmp(&k[r].out[i], &want, sizeof want) == 0,
					  "world %d n %zu rank %d elem %zu: %a, serial %a", W, n, r, i,
					  (double)k[r].out[i], (double)want);
		}
	})
}

Test(comm, all_reduce_same_bits_every_run)
{
	/* 40 runs at world 8 with the same inputs: scheduling must not change a bit. */
	size_t n = 5003;
	struct rank k[MAXW];
	run(k, 8, ALL_REDUCE, n, 0, 9);
	all_ok(k, 8);
	float *first = malloc(n * sizeof *first);
	memcpy(first, k[0].out, n * sizeof *first);
	release(k, 8);
	for (int it = 0; it < 40; it++) {
		run(k, 8, ALL_REDUCE, n, 0, 9);
		all_ok(k, 8);
		for (int r = 0; r < 8; r++)
			cr_assert(memcmp(k[r].out, first, n * sizeof *first) == 0, "run %d rank %d", it,
				  r);
		release(k, 8);
	}
	free(first);
}

Test(comm, all_gather_concatenates_in_rank_order)
{
	EACH({
		run(k, W, ALL_GATHER, n, 0, 2);
		all_ok(k, W);
		for (int r = 0; r < W; r++)
			for (int q = 0; q < W; q++)
				cr_assert(memcmp(k[r].out + (size_t)q * n, k[q].in, n * sizeof(float)) == 0,
					  "world %d n %zu: rank %d's block %d", W, n, r, q);
	})
}

Test(comm, reduce_scatter_is_the_serial_sum_of_each_block)
{
	EACH({
		run(k, W, REDUCE_SCATTER, n, 0, 3);
		all_ok(k, W);
		for (int r = 0; r < W; r++)
			for (size_t i = 0; i < n; i++) {
				float want = k[0].in[(size_t)r * n + i];
				for (int q = 1; q < W; q++)
					want += k[q].in[(size_t)r * n + i];
				cr_assert(memcmp(&k[r].out[i], &want, sizeof want) == 0,
					  "world %d n %zu rank %d elem %zu", W, n, r, i);
			}
	})
}

Test(comm, all_to_all_transposes_blocks)
{
	EACH({
		run(k, W, ALL_TO_ALL, n, 0, 4);
		all_ok(k, W);
		for (int r = 0; r < W; r++)
			for (int q = 0; q < W; q++)
				cr_assert(memcmp(k[r].out + (size_t)q * n, k[q].in + (size_t)r * n,
						 n * sizeof(float)) == 0,
					  "world %d n %zu: rank %d's block from %d", W, n, r, q);
	})
}

Test(comm, all_to_allv_moves_variable_blocks)
{
	EACH({
		if (n < 3)
			continue;
		run(k, W, ALL_TO_ALLV, n, 0, 5);
		all_ok(k, W);
		for (int r = 0; r < W; r++)
			for (int q = 0; q < W; q++) {
				size_t cnt = (size_t)(q + r) % 3;
				const float *got = k[r].out + (size_t)q * n;
				cr_assert(memcmp(got, k[q].in + (size_t)r * n, cnt * sizeof(float)) == 0,
					  "world %d: rank %d from %d", W, r, q);
				for (size_t i = cnt; i < n; i++)
					cr_assert_eq(got[i], -7.0f, "bytes past the count were written");
			}
	})
}

Test(comm, barrier_returns_on_every_rank)
{
	for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
		struct rank k[MAXW];
		run(k, worlds[wi], BARRIER, 1, 0, 6);
		all_ok(k, worlds[wi]);
		release(k, worlds[wi]);
	}
}

Test(comm, vote_is_yes_only_when_every_rank_says_yes)
{
	for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
		int W = worlds[wi];
		for (int no = 0; no <= W; no++) { /* no == W: everyone says yes */
			struct rank k[MAXW];
			run(k, W, VOTE, 1, (size_t)no, 0);
			all_ok(k, W);
			for (int r = 0; r < W; r++)
				cr_assert_eq(k[r].all_yes, no == W, "world %d, rank %d said no: rank %d got %d",
					     W, no, r, k[r].all_yes);
			release(k, W);
		}
	}
}

/* Mismatched counts: every rank returns WK_EINVAL with a message naming the ranks, and the
 * communicator still works afterwards (no rank was left inside a barrier). */
Test(comm, disagreeing_ranks_all_fail_without_deadlock)
{
	enum op ops[] = {ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, ALL_TO_ALLV};
	for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
		struct rank k[MAXW];
		run(k, 4, ops[o], 16, 12, 7);
		for (int r = 0; r < 4; r++) {
			cr_expect_eq(k[r].rc, WK_EINVAL, "op %zu rank %d: rc %d", o, r, k[r].rc);
			cr_expect(strstr(k[r].err, "rank 1") != NULL, "op %zu: %s", o, k[r].err);
		}
		release(k, 4);
	}
	char err[WK_ERRSZ];
	void *ctx;
	cr_expect_eq(comm_cpu.init(&ctx, 0, err, sizeof err), WK_EINVAL);
	cr_expect_eq(comm_cpu.init(&ctx, COMM_MAX_WORLD + 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "world") != NULL, "%s", err);
}

Test(comm, lookup_by_name)
{
	cr_expect_eq(comm_find("cpu"), &comm_cpu);
	cr_expect_eq(comm_find("nccl"), &comm_nccl);
	cr_expect_null(comm_find("mpi"));
	/* In a build without a usable NCCL (this machine has no GPU), init says why. */
	void *ctx = NULL;
	char err[WK_ERRSZ] = "";
	int rc = comm_nccl.init(&ctx, 1, err, sizeof err);
	if (rc == WK_OK)
		comm_nccl.destroy(ctx);
	else
		cr_expect(strstr(err, "comm nccl") != NULL, "%s", err);
}
