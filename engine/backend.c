#include <string.h>

#include "coldstart/snapshot.h"
#include "engine/backend.h"

const struct backend *be_find(const char *name)
{
	/* auto: cpu. The CUDA backend has been compiled but never run on a GPU; it becomes the
	 * default where a device is present once scripts/gpu-check has passed on one. */
	if (!name || !strcmp(name, "auto"))
		return &be_cpu;
	if (!strcmp(name, "cpu"))
		return &be_cpu;
	if (!strcmp(name, "cuda"))
		return &be_cuda;
	if (!strcmp(name, "null"))
		return &be_null;
	return NULL;
}

/* ---- a coldstart sink over a backend's memory and stage ops ---- */

static bool sink_accept(void *ctx, int world)
{
	(void)ctx;
	return world == 1;
}

static void *sink_image(void *ctx, int rank, size_t size)
{
	struct be_sink *k = ctx;
	(void)rank;
	return k->be->mem_alloc(k->ctx, size);
}

static void sink_release(void *ctx, int rank, void *image)
{
	struct be_sink *k = ctx;
	(void)rank;
	k->be->mem_free(k->ctx, image);
}

static void *sink_stage_alloc(void *ctx, size_t size)
{
	struct be_sink *k = ctx;
	return k->be->stage_alloc(k->ctx, size);
}

static void sink_stage_free(void *ctx, void *buf)
{
	struct be_sink *k = ctx;
	k->be->stage_free(k->ctx, buf);
}

static int sink_put(void *ctx, int rank, void *dst, const void *buf, size_t bytes, char *err,
		    size_t errsz)
{
	struct be_sink *k = ctx;
	(void)rank;
	return k->be->stage_put(k->ctx, dst, buf, bytes, err, errsz);
}

static int sink_wait(void *ctx, const void *buf, char *err, size_t errsz)
{
	struct be_sink *k = ctx;
	return k->be->stage_wait(k->ctx, buf, err, errsz);
}

bool be_streams(const struct backend *b)
{
	return b && b->mem_alloc && b->mem_free && b->to_host && b->stage_alloc &&
	       b->stage_free && b->stage_put && b->stage_wait;
}

struct snap_sink be_snap_sink(struct be_sink *k)
{
	return (struct snap_sink){.accept = sink_accept, .image = sink_image,
				  .release = sink_release, .stage_alloc = sink_stage_alloc,
				  .stage_free = sink_stage_free, .put = sink_put,
				  .wait = sink_wait, .ctx = k};
}
