/*
 * comm_nccl.cu - the collectives of engine/comm.h on GPUs through NCCL: one process drives
 * every local GPU, rank r is device r, one thread per rank (comm.h has the contract).
 *
 * init() creates all the ranks' communicators at once with ncclCommInitAll over devices
 * 0..world-1 (no MPI, no unique-id exchange), and one stream per rank. The stream is a
 * blocking one: the CUDA backend launches its kernels on the legacy default stream, and a
 * blocking stream's work starts only after the default stream's earlier work (and the
 * default stream's later work waits for it), so a collective reads what the kernels before it
 * wrote. A non-blocking stream would race them. With the kernels on the per-thread stream
 * instead (wk_cuda_set_stream, WICK_CUDA_STREAM=pt), which no blocking stream waits for, each
 * collective first makes the rank's stream wait for an event recorded on the compute stream
 * (the rank thread's own). Each op makes the rank's device current,
 * enqueues the NCCL call on the rank's stream and waits for the stream: blocking, as comm.h
 * promises.
 *
 * Never a hang: a rank whose device has failed (a sticky CUDA error) gets an error from its
 * next NCCL call at once, while its peers' collectives would wait on their GPUs forever for
 * its share. So the first rank to fail marks the communicator failed; every rank waits for
 * its stream by polling, and on seeing the mark (or after WICK_NCCL_TIMEOUT seconds, default
 * 600, with no completion) calls ncclCommAbort on its communicator, which ends the kernels
 * still waiting, and returns an error; later ops fail at once without enqueueing anything.
 * The engine then fails the step and the worker exits as for any device failure.
 *   all_reduce      ncclAllReduce(float, sum), in place
 *   all_gather      ncclAllGather of bytes (rank-major output, as comm.h says)
 *   reduce_scatter  ncclReduceScatter(float, sum)
 *   all_to_all(v)   ncclSend/ncclRecv pairs to every rank inside one ncclGroupStart/End
 *   barrier         an all_reduce of one float in a per-rank device word
 *   vote            the same word, holding 1 or 0
 *
 * libnccl.so.2 is loaded with dlopen when a communicator is created, not linked: NCCL is
 * ~200 MB that every `wick` start would otherwise map and relocate, including the CPU-only
 * commands and machines without it; there init() fails with a message instead. nccl.h is
 * used for the types and signatures only.
 *
 * comm_nccl_selftest() is the check scripts/gpu-check runs (tests/tools/nccl_check.c): every
 * op over `world` GPUs against values computed on the host.
 *
 * vote() goes through a device word (an all_reduce of 0/1 floats), so callers pass host ints.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "common/wk.h"
#include "engine/comm.h"

extern cudaStream_t wk_compute_stream; /* kernels.cu: 0 or cudaStreamPerThread */
}

struct nccl_api {
	void *lib;
	ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
	ncclResult_t (*CommDestroy)(ncclComm_t);
	ncclResult_t (*CommAbort)(ncclComm_t);
	ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
	ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				  ncclComm_t, cudaStream_t);
	ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
				  cudaStream_t);
	ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				      ncclComm_t, cudaStream_t);
	ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*GroupStart)(void);
	ncclResult_t (*GroupEnd)(void);
	const char *(*GetErrorString)(ncclResult_t);
	ncclResult_t (*GetVersion)(int *);
};

struct ncomm {
	int world;
	struct nccl_api api;
	ncclComm_t comm[COMM_MAX_WORLD];
	cudaStream_t stream[COMM_MAX_WORLD];
	cudaEvent_t ready[COMM_MAX_WORLD]; /* the compute stream's work before a collective */
	float *word[COMM_MAX_WORLD]; /* one float per device, for barrier() */
	bool aborted[COMM_MAX_WORLD]; /* ncclCommAbort freed comm[r] */
	int failed;                   /* a rank failed: atomically set, read by every rank */
	char why[WK_ERRSZ];           /* the first failure, written by the rank that set it */
	double timeout_s;
};

template <typename F> static bool sym(void *lib, const char *name, F *out)
{
	*out = reinterpret_cast<F>(dlsym(lib, name));
	return *out != NULL;
}

static int load_api(struct nccl_api *a, char *err, size_t errsz)
{
	a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!a->lib)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "comm nccl: cannot load libnccl.so.2 "
			       "(%s)", dlerror());
	if (!sym(a->lib, "ncclCommInitAll", &a->CommInitAll) ||
	    !sym(a->lib, "ncclCommDestroy", &a->CommDestroy) ||
	    !sym(a->lib, "ncclCommAbort", &a->CommAbort) ||
	    !sym(a->lib, "ncclCommGetAsyncError", &a->CommGetAsyncError) ||
	    !sym(a->lib, "ncclAllReduce", &a->AllReduce) ||
	    !sym(a->lib, "ncclAllGather", &a->AllGather) ||
	    !sym(a->lib, "ncclReduceScatter", &a->ReduceScatter) ||
	    !sym(a->lib, "ncclSend", &a->Send) || !sym(a->lib, "ncclRecv", &a->Recv) ||
	    !sym(a->lib, "ncclGroupStart", &a->GroupStart) ||
	    !sym(a->lib, "ncclGroupEnd", &a->GroupEnd) ||
	    !sym(a->lib, "ncclGetErrorString", &a->GetErrorString) ||
	    !sym(a->lib, "ncclGetVersion", &a->GetVersion)) {
		dlclose(a->lib);
		a->lib = NULL;
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "comm nccl: libnccl.so.2 lacks "
			       "ncclSend/ncclRecv or another symbol (NCCL >= 2.7 is needed)");
	}
	return WK_OK;
}

static void destroy(void *ctx)
{
	struct ncomm *c = (struct ncomm *)ctx;
	if (!c)
		return;
	for (int r = 0; r < c->world; r++) {
		cudaSetDevice(r);
		if (c->comm[r] && !c->aborted[r]) { /* after a failure, peers may be gone: abort */
			if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
				c->api.CommAbort(c->comm[r]);
			else
				c->api.CommDestroy(c->comm[r]);
		}
		if (c->stream[r])
			cudaStreamDestroy(c->stream[r]);
		if (c->ready[r])
			cudaEventDestroy(c->ready[r]);
		if (c->word[r])
			cudaFree(c->word[r]);
	}
	if (c->api.lib)
		dlclose(c->api.lib);
	free(c);
}

static int init(void **ctx, int world, char *err, size_t errsz)
{
	if (world < 1 || world > COMM_MAX_WORLD)
		return wk_errf(err, errsz, WK_EINVAL, "comm nccl: world %d is outside 1..%d", world,
			       COMM_MAX_WORLD);
	/* seconds a collective may wait: a positive number, or unset for 600; anything else is
	 * refused by name rather than taken for the default */
	const char *t = getenv("WICK_NCCL_TIMEOUT");
	char *end = NULL;
	double timeout_s = t && *t ? strtod(t, &end) : 600.0;
	if (t && *t && (*end || !(timeout_s > 0) || !isfinite(timeout_s)))
		return wk_errf(err, errsz, WK_EINVAL, "comm nccl: WICK_NCCL_TIMEOUT is '%.40s'; it "
			       "takes a positive number of seconds", t);
	int ndev = 0;
	cudaError_t ce = cudaGetDeviceCount(&ndev);
	if (ce != cudaSuccess || ndev < world)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "comm nccl: a world of %d needs %d "
			       "GPUs, %d visible%s%s", world, world, ce == cudaSuccess ? ndev : 0,
			       ce == cudaSuccess ? "" : ": ",
			       ce == cudaSuccess ? "" : cudaGetErrorString(ce));
	struct ncomm *c = (struct ncomm *)calloc(1, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "comm nccl: out of memory");
	c->world = world;
	int rc = load_api(&c->api, err, errsz);
	if (rc != WK_OK) {
		free(c);
		return rc;
	}
	ncclResult_t nr = c->api.CommInitAll(c->comm, world, NULL);
	if (nr != ncclSuccess) {
		memset(c->comm, 0, sizeof c->comm);
		rc = wk_errf(err, errsz, WK_EIO, "comm nccl: ncclCommInitAll over %d GPUs: %s", world,
			     c->api.GetErrorString(nr));
		destroy(c);
		return rc;
	}
	for (int r = 0; r < world; r++) {
		if ((ce = cudaSetDevice(r)) != cudaSuccess ||
		    (ce = cudaStreamCreateWithFlags(&c->stream[r], cudaStreamDefault)) !=
			    cudaSuccess || /* blocking: ordered with the kernels (see the top) */
		    (ce = cudaEventCreateWithFlags(&c->ready[r], cudaEventDisableTiming)) !=
			    cudaSuccess ||
		    (ce = cudaMalloc((void **)&c->word[r], sizeof(float))) != cudaSuccess) {
			rc = wk_errf(err, errsz, WK_EIO, "comm nccl: GPU %d: %s", r,
				     cudaGetErrorString(ce));
			destroy(c);
			return rc;
		}
	}
	c->timeout_s = timeout_s;
	*ctx = c;
	return WK_OK;
}

/* The first failure marks the communicator for every rank; returns the error. */
static int fail_all(struct ncomm *c, int rank, const char *op, const char *what, char *err,
		    size_t errsz)
{
	int rc = wk_errf(err, errsz, WK_EIO, "comm nccl: %s on GPU %d: %s", op, rank, what);
	if (__atomic_exchange_n(&c->failed, 1, __ATOMIC_ACQ_REL) == 0)
		snprintf(c->why, sizeof c->why, "%s", err ? err : what);
	return rc;
}

/* Makes the rank's GPU current: rank threads are the callers' own. Refuses once any rank
 * failed: a collective enqueued then could never complete. */
static int enter(struct ncomm *c, int rank, const char *op, char *err, size_t errsz)
{
	if (rank < 0 || rank >= c->world)
		return wk_errf(err, errsz, WK_EINVAL, "comm nccl: %s: rank %d of %d", op, rank,
			       c->world);
	if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
		return wk_errf(err, errsz, WK_EIO, "comm nccl: %s on GPU %d: the communicator "
			       "failed earlier", op, rank);
	cudaError_t ce = cudaSetDevice(rank);
	if (ce == cudaSuccess && wk_compute_stream) /* not the legacy stream: order explicitly */
		if ((ce = cudaEventRecord(c->ready[rank], wk_compute_stream)) == cudaSuccess)
			ce = cudaStreamWaitEvent(c->stream[rank], c->ready[rank], 0);
	if (ce != cudaSuccess)
		return fail_all(c, rank, op, cudaGetErrorString(ce), err, errsz);
	return WK_OK;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Checks the NCCL result, then waits for the rank's stream: polling, so that a peer's
 * failure or the timeout aborts the wait instead of hanging (see the top). The first
 * millisecond spins (a decode step's collectives take microseconds), then it sleeps 50 us
 * between polls. */
static int finish(struct ncomm *c, int rank, ncclResult_t nr, const char *op, char *err,
		  size_t errsz)
{
	if (nr != ncclSuccess)
		return fail_all(c, rank, op, c->api.GetErrorString(nr), err, errsz);
	double t0 = now_s();
	for (long polls = 0;; polls++) {
		cudaError_t ce = cudaStreamQuery(c->stream[rank]);
		if (ce == cudaSuccess)
			return WK_OK;
		if (ce != cudaErrorNotReady)
			return fail_all(c, rank, op, cudaGetErrorString(ce), err, errsz);
		ncclResult_t ae = ncclSuccess;
		if (c->api.CommGetAsyncError(c->comm[rank], &ae) == ncclSuccess && ae != ncclSuccess &&
		    ae != ncclInProgress)
			fail_all(c, rank, op, c->api.GetErrorString(ae), err, errsz);
		bool late = now_s() - t0 > c->timeout_s;
		if (late)
			fail_all(c, rank, op, "timed out (WICK_NCCL_TIMEOUT)", err, errsz);
		if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE)) {
			c->api.CommAbort(c->comm[rank]); /* ends this rank's waiting kernels */
			c->aborted[rank] = true;
			cudaStreamSynchronize(c->stream[rank]);
			cudaGetLastError();
			return wk_errf(err, errsz, WK_EIO, "comm nccl: %s on GPU %d aborted: %s", op,
				       rank, c->why);
		}
		if (polls > 2000 && now_s() - t0 > 1e-3) {
			struct timespec ts = {0, 50000};
			nanosleep(&ts, NULL);
		}
	}
}

static int all_reduce(void *ctx, int rank, float *buf, size_t n, char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	int rc = enter(c, rank, "all_reduce", err, errsz);
	if (rc != WK_OK)
		return rc;
	ncclResult_t nr = c->api.AllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm[rank],
					   c->stream[rank]);
	return finish(c, rank, nr, "all_reduce", err, errsz);
}

static int all_gather(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	int rc = enter(c, rank, "all_gather", err, errsz);
	if (rc != WK_OK)
		return rc;
	ncclResult_t nr = c->api.AllGather(send, recv, bytes, ncclUint8, c->comm[rank],
					   c->stream[rank]);
	return finish(c, rank, nr, "all_gather", err, errsz);
}

static int reduce_scatter(void *ctx, int rank, const float *send, float *recv, size_t n,
			  char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	int rc = enter(c, rank, "reduce_scatter", err, errsz);
	if (rc != WK_OK)
		return rc;
	ncclResult_t nr = c->api.ReduceScatter(send, recv, n, ncclFloat32, ncclSum, c->comm[rank],
					       c->stream[rank]);
	return finish(c, rank, nr, "reduce_scatter", err, errsz);
}

/* Point-to-point exchange with every rank in one group. */
static int exchange(struct ncomm *c, int rank, const void *send, const size_t *scount,
		    const size_t *sdispl, void *recv, const size_t *rcount, const size_t *rdispl,
		    const char *op, char *err, size_t errsz)
{
	int rc = enter(c, rank, op, err, errsz);
	if (rc != WK_OK)
		return rc;
	ncclResult_t nr = c->api.GroupStart();
	for (int r = 0; nr == ncclSuccess && r < c->world; r++) {
		if (scount[r])
			nr = c->api.Send((const char *)send + sdispl[r], scount[r], ncclUint8, r,
					 c->comm[rank], c->stream[rank]);
		if (nr == ncclSuccess && rcount[r])
			nr = c->api.Recv((char *)recv + rdispl[r], rcount[r], ncclUint8, r,
					 c->comm[rank], c->stream[rank]);
	}
	ncclResult_t ne = c->api.GroupEnd();
	return finish(c, rank, nr != ncclSuccess ? nr : ne, op, err, errsz);
}

static int all_to_all(void *ctx, int rank, const void *send, void *recv, size_t bytes,
		      char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	size_t count[COMM_MAX_WORLD], displ[COMM_MAX_WORLD];
	for (int r = 0; r < c->world; r++) {
		count[r] = bytes;
		displ[r] = (size_t)r * bytes;
	}
	return exchange(c, rank, send, count, displ, recv, count, displ, "all_to_all", err, errsz);
}

static int all_to_allv(void *ctx, int rank, const void *send, const size_t *scount,
		       const size_t *sdispl, void *recv, const size_t *rcount,
		       const size_t *rdispl, char *err, size_t errsz)
{
	return exchange((struct ncomm *)ctx, rank, send, scount, sdispl, recv, rcount, rdispl,
			"all_to_allv", err, errsz);
}

static int barrier(void *ctx, int rank, char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	if (rank < 0 || rank >= c->world)
		return wk_errf(err, errsz, WK_EINVAL, "comm nccl: barrier: rank %d of %d", rank,
			       c->world);
	return all_reduce(ctx, rank, c->word[rank], 1, err, errsz);
}

static int vote(void *ctx, int rank, int yes, int *all_yes, char *err, size_t errsz)
{
	struct ncomm *c = (struct ncomm *)ctx;
	int rc = enter(c, rank, "vote", err, errsz);
	if (rc != WK_OK)
		return rc;
	float v = yes ? 1.0f : 0.0f;
	cudaError_t ce = cudaMemcpy(c->word[rank], &v, sizeof v, cudaMemcpyHostToDevice);
	if (ce != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "comm nccl: vote on GPU %d: %s", rank,
			       cudaGetErrorString(ce));
	if ((rc = all_reduce(ctx, rank, c->word[rank], 1, err, errsz)) != WK_OK)
		return rc;
	if ((ce = cudaMemcpy(&v, c->word[rank], sizeof v, cudaMemcpyDeviceToHost)) != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "comm nccl: vote on GPU %d: %s", rank,
			       cudaGetErrorString(ce));
	*all_yes = v == (float)c->world;
	return WK_OK;
}

extern "C" const struct comm_ops comm_nccl = {
	"nccl", init, destroy, all_reduce, all_gather, reduce_scatter, all_to_all, all_to_allv,
	barrier, vote,
};

/* ---- self test: every op over `world` GPUs, checked on the host --------------------------- */

struct st_rank {
	const struct comm_ops *ops;
	void *ctx;
	int rank, world;
	int rc;
	char err[WK_ERRSZ];
};

#define ST_N 1000 /* floats per rank and per peer */

/* The value rank r puts at index i of its input: small integers, so every sum is exact. */
static float val(int r, size_t i)
{
	return (float)(r + 1) * 1000.0f + (float)(i % 997);
}

static int st_check(const float *got, const float *want, size_t n, const char *op, int rank,
		    char *err, size_t errsz)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			return wk_errf(err, errsz, WK_EIO, "%s on GPU %d: element %zu is %g, want %g",
				       op, rank, i, (double)got[i], (double)want[i]);
	return WK_OK;
}

static int st_run(struct st_rank *s)
{
	int W = s->world, R = s->rank, rc = WK_OK;
	size_t n = ST_N, all = (size_t)W * n;
	float *h = (float *)malloc(all * sizeof(float)), *want = (float *)malloc(all * sizeof(float));
	float *d_in = NULL, *d_out = NULL;
	char *err = s->err;
	size_t es = sizeof s->err;
	cudaError_t ce = cudaSetDevice(R);
	if (ce == cudaSuccess)
		ce = cudaMalloc((void **)&d_in, all * sizeof(float));
	if (ce == cudaSuccess)
		ce = cudaMalloc((void **)&d_out, all * sizeof(float));
	if (!h || !want || ce != cudaSuccess) {
		rc = wk_errf(err, es, WK_EIO, "GPU %d: %s", R,
			     ce != cudaSuccess ? cudaGetErrorString(ce) : "out of memory");
		goto out;
	}
#define UP(src, bytes) cudaMemcpy(d_in, src, bytes, cudaMemcpyHostToDevice)
#define DOWN(dst, p, bytes) cudaMemcpy(dst, p, bytes, cudaMemcpyDeviceToHost)
	/* all_reduce: sum over ranks of val(r, i) */
	for (size_t i = 0; i < n; i++) {
		h[i] = val(R, i);
		want[i] = 0;
		for (int r = 0; r < W; r++)
			want[i] += val(r, i);
	}
	UP(h, n * sizeof(float));
	if ((rc = s->ops->all_reduce(s->ctx, R, d_in, n, err, es)))
		goto out;
	DOWN(h, d_in, n * sizeof(float));
	if ((rc = st_check(h, want, n, "all_reduce", R, err, es)))
		goto out;
	/* all_gather: recv[r][i] = val(r, i) */
	for (size_t i = 0; i < n; i++)
		h[i] = val(R, i);
	for (int r = 0; r < W; r++)
		for (size_t i = 0; i < n; i++)
			want[(size_t)r * n + i] = val(r, i);
	UP(h, n * sizeof(float));
	if ((rc = s->ops->all_gather(s->ctx, R, d_in, d_out, n * sizeof(float), err, es)))
		goto out;
	DOWN(h, d_out, all * sizeof(float));
	if ((rc = st_check(h, want, all, "all_gather", R, err, es)))
		goto out;
	/* reduce_scatter: send[q][i] = val(R, q * n + i); recv[i] = sum_r val(r, R * n + i) */
	for (size_t i = 0; i < all; i++)
		h[i] = val(R, i);
	for (size_t i = 0; i < n; i++) {
		want[i] = 0;
		for (int r = 0; r < W; r++)
			want[i] += val(r, (size_t)R * n + i);
	}
	UP(h, all * sizeof(float));
	if ((rc = s->ops->reduce_scatter(s->ctx, R, d_in, d_out, n, err, es)))
		goto out;
	DOWN(h, d_out, n * sizeof(float));
	if ((rc = st_check(h, want, n, "reduce_scatter", R, err, es)))
		goto out;
	/* all_to_all: send[q][i] = val(R, q * n + i); recv[r][i] = val(r, R * n + i) */
	for (size_t i = 0; i < all; i++)
		h[i] = val(R, i);
	for (int r = 0; r < W; r++)
		for (size_t i = 0; i < n; i++)
			want[(size_t)r * n + i] = val(r, (size_t)R * n + i);
	UP(h, all * sizeof(float));
	if ((rc = s->ops->all_to_all(s->ctx, R, d_in, d_out, n * sizeof(float), err, es)))
		goto out;
	DOWN(h, d_out, all * sizeof(float));
	if ((rc = st_check(h, want, all, "all_to_all", R, err, es)))
		goto out;
	/* all_to_allv: rank R sends (q + 1) floats to rank q from offset q * n */
	{
		size_t sc[COMM_MAX_WORLD], sd[COMM_MAX_WORLD], rcn[COMM_MAX_WORLD], rd[COMM_MAX_WORLD];
		for (int q = 0; q < W; q++) {
			sc[q] = (size_t)(q + 1) * sizeof(float);
			sd[q] = (size_t)q * n * sizeof(float);
			rcn[q] = (size_t)(R + 1) * sizeof(float);
			rd[q] = (size_t)q * n * sizeof(float);
		}
		for (size_t i = 0; i < all; i++) {
			h[i] = val(R, i);
			want[i] = -1.0f;
		}
		for (int r = 0; r < W; r++)
			for (int k = 0; k <= R; k++)
				want[(size_t)r * n + (size_t)k] = val(r, (size_t)R * n + (size_t)k);
		UP(h, all * sizeof(float));
		for (size_t i = 0; i < all; i++)
			h[i] = -1.0f; /* what the bytes nobody sends must still hold */
		cudaMemcpy(d_out, h, all * sizeof(float), cudaMemcpyHostToDevice);
		if ((rc = s->ops->all_to_allv(s->ctx, R, d_in, sc, sd, d_out, rcn, rd, err, es)))
			goto out;
		DOWN(h, d_out, all * sizeof(float));
		if ((rc = st_check(h, want, all, "all_to_allv", R, err, es)))
			goto out;
	}
	if ((rc = s->ops->barrier(s->ctx, R, err, es)))
		goto out;
	/* vote: every rank yes, then rank W-1 says no */
	{
		int all = 0;
		if ((rc = s->ops->vote(s->ctx, R, 1, &all, err, es)))
			goto out;
		if (!all) {
			rc = wk_errf(err, es, WK_EIO, "vote on GPU %d: all said yes, got no", R);
			goto out;
		}
		if ((rc = s->ops->vote(s->ctx, R, R != W - 1, &all, err, es)))
			goto out;
		if (all)
			rc = wk_errf(err, es, WK_EIO, "vote on GPU %d: rank %d said no, got yes", R,
				     W - 1);
	}
#undef UP
#undef DOWN
out:
	cudaFree(d_in);
	cudaFree(d_out);
	free(h);
	free(want);
	return rc;
}

static void *st_main(void *arg)
{
	struct st_rank *s = (struct st_rank *)arg;
	s->rc = st_run(s);
	return NULL;
}

/* Runs every op over world GPUs (threads, one per rank). Returns WK_OK, WK_EUNSUPPORTED when
 * there are fewer than world GPUs or no NCCL (the message says which), or WK_EIO naming the
 * op, the GPU and the element that came out wrong. A rank that fails mid-way leaves its peers
 * waiting inside NCCL: the caller should run this under a timeout. */
extern "C" int comm_nccl_selftest(int world, char *err, size_t errsz)
{
	void *ctx = NULL;
	int rc = comm_nccl.init(&ctx, world, err, errsz);
	if (rc != WK_OK)
		return rc;
	struct st_rank *s = (struct st_rank *)calloc((size_t)world, sizeof *s);
	pthread_t *th = (pthread_t *)calloc((size_t)world, sizeof *th);
	if (!s || !th) {
		free(s);
		free(th);
		destroy(ctx);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	int started = 0;
	for (int r = 0; r < world; r++) {
		s[r] = (struct st_rank){&comm_nccl, ctx, r, world, WK_OK, {0}};
		if (pthread_create(&th[r], NULL, st_main, &s[r]) != 0)
			break;
		started++;
	}
	for (int r = 0; r < started; r++)
		pthread_join(th[r], NULL);
	rc = started == world ? WK_OK : wk_errf(err, errsz, WK_ENOMEM, "cannot start threads");
	for (int r = 0; r < world && rc == WK_OK; r++)
		if (s[r].rc != WK_OK)
			rc = wk_errf(err, errsz, s[r].rc, "%s", s[r].err);
	free(s);
	free(th);
	destroy(ctx);
	return rc;
}
