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

static bool sink_accept(void *ctx, int world)
{
	struct be_sink *k = ctx;
	_Static_assert(BE_SINK_MAX == COMM_MAX_WORLD, "a sink holds every rank");
	if (world < 1 || world > BE_SINK_MAX || (world > 1 && (!k->raw || !k->raw->init)))
		return false;
	k->rctx[0] = k->ctx;
	for (int r = 1; r < world; r++) {
		if (k->rctx[r] && !k->taken[r])
			continue; /* started by an earlier restore through this sink */
		char err[WK_ERRSZ];
		struct be_config c = {.threads = be_rank_threads(k->threads, world), .device = r,
				      .fp8_act = k->fp8_act};
		if (k->raw->init(&k->rctx[r], &c, err, sizeof err) != WK_OK) {
			/* too few devices, say: restored into host memory, and the rank engines
			 * starting their own backends name the problem */
			for (int q = 1; q < BE_SINK_MAX; q++)
				if (k->rctx[q] && !k->taken[q])
					k->raw->shutdown(k->rctx[q]);
			memset(k->rctx + 1, 0, sizeof k->rctx - sizeof k->rctx[0]);
			memset(k->taken, 0, sizeof k->taken);
			k->world = 1;
			return false;
		}
	}
	k->world = world;
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

void be_sink_close(struct be_sink *k)
{
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
