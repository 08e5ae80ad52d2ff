#include <string.h>

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
