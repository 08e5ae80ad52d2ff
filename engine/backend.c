#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "kernels/cuda/cuda_kernels.h"

const struct backend *be_find(const char *name)
{
	/* auto: cuda where a CUDA device is visible (scripts/gpu-check passed on an H200 on
	 * 2026-12-04), else cpu; a cuda that cannot start falls back to cpu (eng_open_backend,
	 * shard.c). cuda_device_count is 0 in a build without CUDA. */
	if (!name || !strcmp(name, "auto"))
		return cuda_device_count() > 0 ? &be_cuda : &be_cpu;
	if (!strcmp(name, "cpu"))
		return &be_cpu;
	if (!strcmp(name, "cuda"))
		return &be_cuda;
	if (!strcmp(name, "null"))
		return &be_null;
	return NULL;
}

/* ---- a coldstart sink over a backend's memory and stage ops ---- */

int be_rank_threads(int threads, int world)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int t = threads > 0 ? threads : cores > 0 ? (int)cores : 1;
	return t / world > 0 ? t / world : 1;
}

/* Rank r's backend and context. */
static const struct backend *rbe(const struct be_sink *k, int rank)
{
	return rank == 0 ? k->be : k->raw;
}

/* A further rank's context, started on a thread of its own. */
struct rank_start {
	const struct backend *be;
	struct be_config c;
	void *ctx;
	int rc;
	bool threaded;
	pthread_t th;
};

static void *rank_start_main(void *arg)
{
	struct rank_start *s = arg;
	char err[WK_ERRSZ]; /* the rank engine that finds no context names the problem */
	s->rc = s->be->init(&s->ctx, &s->c, err, sizeof err);
	return NULL;
}

/* The communicator accept starts (be_sink.cs). */
struct be_sink_comm {
	const struct comm_ops *ops;
	int world;
	pthread_t th;
	void *ctx;
	int rc;
	double t0, init_s;
	char err[WK_ERRSZ];
};

static void *comm_start_main(void *arg)
{
	struct be_sink_comm *cs = arg;
	cs->rc = cs->ops->init(&cs->ctx, cs->world, cs->err, sizeof cs->err);
	cs->init_s = wk_now() - cs->t0;
	return NULL;
}

/* Starts k->comm's init for world ranks on a thread; none where the thread cannot start
 * (the sharded engine then makes the communicator itself). */
static void comm_start(struct be_sink *k, int world)
{
	struct be_sink_comm *cs = calloc(1, sizeof *cs);
	if (!cs)
		return;
	*cs = (struct be_sink_comm){.ops = k->comm, .world = world, .t0 = wk_now()};
	if (pthread_create(&cs->th, NULL, comm_start_main, cs) != 0) {
		free(cs);
		return;
	}
	k->cs = cs;
}

/* Waits for the communicator accept started and destroys it. */
static void comm_drop(struct be_sink *k)
{
	struct be_sink_comm *cs = k->cs;
	if (!cs)
		return;
	pthread_join(cs->th, NULL);
	if (cs->rc == WK_OK && cs->ops->destroy)
		cs->ops->destroy(cs->ctx);
	free(cs);
	k->cs = NULL;
}

/* The further ranks' contexts not yet started are started at once, a thread each (inline
 * where a thread cannot start); false, with every context not taken shut down, when any
 * cannot start. */
static bool start_ranks(struct be_sink *k, int world)
{
	struct rank_start st[BE_SINK_MAX];
	bool ok = true;
	for (int r = 1; r < world; r++) {
		st[r] = (struct rank_start){.be = k->raw, .ctx = k->rctx[r], .rc = WK_OK,
					    .c = {.threads = be_rank_threads(k->threads, world),
						  .device = r, .fp8_act = k->fp8_act}};
		if (k->rctx[r] && !k->taken[r])
			continue; /* started by an earlier restore through this sink */
		st[r].ctx = NULL;
		st[r].threaded = pthread_create(&st[r].th, NULL, rank_start_main, &st[r]) == 0;
		if (!st[r].threaded)
			rank_start_main(&st[r]);
	}
	for (int r = 1; r < world; r++) {
		if (st[r].threaded)
			pthread_join(st[r].th, NULL);
		if (st[r].rc == WK_OK)
			k->rctx[r] = st[r].ctx;
		else
			ok = false;
	}
	if (ok)
		return true;
	/* too few devices, say: restored into host memory, and the rank engines starting their
	 * own backends name the problem */
	for (int q = 1; q < BE_SINK_MAX; q++)
		if (k->rctx[q] && !k->taken[q])
			k->raw->shutdown(k->rctx[q]);
	memset(k->rctx + 1, 0, sizeof k->rctx - sizeof k->rctx[0]);
	memset(k->taken, 0, sizeof k->taken);
	return false;
}

static bool sink_accept(void *ctx, int world)
{
	struct be_sink *k = ctx;
	_Static_assert(BE_SINK_MAX == COMM_MAX_WORLD, "a sink holds every rank");
	if (world < 1 || world > BE_SINK_MAX || (world > 1 && (!k->raw || !k->raw->init)))
		return false;
	k->rctx[0] = k->ctx;
	double t0 = wk_now();
	if (!start_ranks(k, world)) {
		k->world = 1;
		return false;
	}
	k->ranks_s = wk_now() - t0;
	k->world = world;
	if (k->comm && world > 1 && !k->cs)
		comm_start(k, world);
	return true;
}

static void *sink_image(void *ctx, int rank, size_t size)
{
	struct be_sink *k = ctx;
	return rbe(k, rank)->mem_alloc(k->rctx[rank], size);
}

static void sink_release(void *ctx, int rank, void *image)
{
	struct be_sink *k = ctx;
	rbe(k, rank)->mem_free(k->rctx[rank], image);
}

static void *sink_stage_alloc(void *ctx, size_t size)
{
	struct be_sink *k = ctx;
	return k->be->stage_alloc(k->ctx, size);
}

/* The other ranks forget the buffer, then rank 0, which allocated it, frees it. */
static void sink_stage_free(void *ctx, void *buf)
{
	struct be_sink *k = ctx;
	for (int r = k->world - 1; r >= 1; r--)
		k->raw->stage_free(k->rctx[r], buf);
	k->be->stage_free(k->ctx, buf);
}

static int sink_put(void *ctx, int rank, void *dst, const void *buf, size_t bytes, char *err,
		    size_t errsz)
{
	struct be_sink *k = ctx;
	return rbe(k, rank)->stage_put(k->rctx[rank], dst, buf, bytes, err, errsz);
}

static int sink_wait(void *ctx, const void *buf, char *err, size_t errsz)
{
	struct be_sink *k = ctx;
	int rc = k->be->stage_wait(k->ctx, buf, err, errsz);
	for (int r = 1; r < k->world && rc == WK_OK; r++)
		rc = k->raw->stage_wait(k->rctx[r], buf, err, errsz);
	return rc;
}

bool be_streams(const struct backend *b)
{
	return b && b->mem_alloc && b->mem_free && b->to_host && b->stage_alloc &&
	       b->stage_free && b->stage_put && b->stage_wait;
}

struct snap_sink be_snap_sink(struct be_sink *k)
{
	k->world = 1;
	k->rctx[0] = k->ctx;
	return (struct snap_sink){.accept = sink_accept, .image = sink_image,
				  .release = sink_release, .stage_alloc = sink_stage_alloc,
				  .stage_free = sink_stage_free, .put = sink_put,
				  .wait = sink_wait, .ctx = k};
}

void *be_sink_take(struct be_sink *k, int rank)
{
	if (rank < 0 || rank >= k->world || k->taken[rank] || !k->rctx[rank])
		return NULL;
	k->taken[rank] = true;
	return k->rctx[rank];
}

int be_sink_comm(struct be_sink *k, const struct comm_ops *ops, int world, void **ctx,
		 double *init_s, double *wait_s, char *err, size_t errsz)
{
	struct be_sink_comm *cs = k->cs;
	*ctx = NULL;
	*init_s = *wait_s = 0;
	if (!cs || cs->ops != ops || cs->world != world)
		return WK_ENOTFOUND;
	double t = wk_now();
	pthread_join(cs->th, NULL);
	/* the part of the making after t (not the thread's exit and join: with an init of
	 * microseconds those alone would outlast it) */
	*wait_s = cs->t0 + cs->init_s > t ? cs->t0 + cs->init_s - t : 0;
	*init_s = cs->init_s;
	k->cs = NULL;
	int rc = cs->rc;
	if (rc == WK_OK)
		*ctx = cs->ctx;
	else
		wk_errf(err, errsz, rc, "%s", cs->err);
	free(cs);
	return rc;
}

void be_sink_close(struct be_sink *k)
{
	comm_drop(k); /* before the contexts it may use */
	for (int r = 1; r < BE_SINK_MAX; r++)
		if (k->rctx[r] && !k->taken[r])
			k->raw->shutdown(k->rctx[r]);
	memset(k->rctx + 1, 0, sizeof k->rctx - sizeof k->rctx[0]);
	memset(k->taken, 0, sizeof k->taken);
	k->world = 1;
}

void be_chain_each(const struct backend *b, void *ctx, const struct be_link *l, int count)
{
	for (int i = 0; i < count; i++) {
		const struct be_link *k = &l[i];
		switch (k->kind) {
		case BE_LINK_MATMUL:
			if (k->rope)
				b->matmul_rope_n(ctx, k->y, k->x_in, k->w, k->count, k->n, k->r,
						 k->theta);
			else if (k->count > 1 && b->matmul_n)
				b->matmul_n(ctx, k->y, k->x_in, k->w, k->count, k->n);
			else
				for (int j = 0; j < k->count; j++)
					b->matmul(ctx, k->y[j], k->x_in, k->w[j], k->n);
			break;
		case BE_LINK_ADD_RMSNORM:
			b->add_rmsnorm(ctx, k->x, k->d, k->y_norm, k->w_norm, k->n, k->dim, k->eps);
			break;
		case BE_LINK_NORM:
			b->norm_n(ctx, k->norm, k->n_norm);
			break;
		case BE_LINK_MOE:
			b->moe_route_experts(ctx, k->y_moe, k->x_moe, k->logits, k->bias, &k->route,
					     k->idx, k->wt, k->n, k->ex, k->scratch);
			break;
		case BE_LINK_CAST:
			b->cast_n(ctx, k->cast, k->n_cast);
			break;
		}
	}
}
