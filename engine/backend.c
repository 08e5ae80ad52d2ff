#include <string.h>

#include "engine/backend.h"

int cuda_device_count(void); /* kernels/cuda: 0 when built without CUDA or with no GPU */

const struct backend *be_find(const char *name)
{
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
