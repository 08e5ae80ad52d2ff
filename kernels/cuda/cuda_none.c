/*
 * cuda_none.c - the CUDA backend's entry in a build without nvcc (or with CUDA=0): it exists
 * so that --backend cuda fails with a clear message instead of a missing symbol.
 */
#include "common/wk.h"
#include "engine/backend.h"

static int init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	(void)ctx;
	(void)cfg;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "this wick was built without CUDA (nvcc not found, or CUDA=0)");
}

static bool supports(void *ctx, enum be_op op, enum dt_type wt)
{
	(void)ctx;
	(void)op;
	(void)wt;
	return false;
}

const struct backend be_cuda = {.name = "cuda", .init = init, .supports = supports};

int cuda_device_count(void)
{
	return 0;
}
