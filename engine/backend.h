/*
 * backend.h - the table of operations the engine runs its models through.
 *
 * A backend is a const table of function pointers plus an opaque context made by init().
 * The engine never calls a kernel directly, so the CPU backend (kernels/cpu/) and the CUDA
 * backend (kernels/cuda/) are interchangeable, and supports() lets the engine refuse an op
 * a backend lacks with a message instead of a crash.
 *
 * Memory: `float *` arguments are activations in the backend's memory (host memory for the
 * CPU backend). Weights are described by struct be_weight and stay where the loader put them
 * (in the mmap'd checkpoint for the CPU backend). Optional members are marked; NULL means the
 * backend works on host memory directly.
 *
 * Shapes are in the comments of cpu.h, which holds the reference definition of every op.
 */
#ifndef BACKEND_H
#define BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "common/dtype.h"

enum be_op {
	BE_OP_MATMUL,
	BE_OP_RMSNORM,
	BE_OP_ROPE,
	BE_OP_ATTENTION,
	BE_OP_SILU_MUL,
	BE_OP_ADD,
	BE_OP_COUNT
};

/* A 2-D weight [rows][cols], row-major, in dtype. For DT_F8_E4M3, scale holds the
 * [ceil(rows/128)][ceil(cols/128)] f32 block scales (dequantized = fp8 * scale); else NULL. */
struct be_weight {
	enum dt_type dtype;
	int rows, cols;
	const void *data;
	const float *scale;
};

struct be_config {
	int threads; /* CPU threads; <= 0 means all cores */
	int device;  /* GPU ordinal for device backends */
};

struct backend {
	const char *name;
	/* Creates the context. Returns WK_OK, or a WK_E* code with a message (for example,
	 * "no CUDA device" or "built without CUDA"). */
	int (*init)(void **ctx, const struct be_config *cfg, char *err, size_t errsz);
	void (*shutdown)(void *ctx);
	/* Whether op runs on this backend for weights of type wt (wt is ignored by ops that
	 * take no weight). */
	bool (*supports)(void *ctx, enum be_op op, enum dt_type wt);

	/* y[n][w->rows] = x[n][w->cols] . w^T */
	void (*matmul)(void *ctx, float *y, const float *x, const struct be_weight *w, int n);
	void (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int n, int dim,
			float eps);
	void (*rope)(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		     int rot_dim, float theta, bool interleaved);
	void (*attention)(void *ctx, float *out, const float *q, const float *k, const float *v,
			  int n, int pos0, int n_heads, int n_kv, int head_dim, int kv_stride,
			  float scale);
	void (*silu_mul)(void *ctx, float *g, const float *u, size_t n);
	void (*add)(void *ctx, float *y, const float *x, size_t n); /* y += x */
};

extern const struct backend be_cpu;  /* kernels/cpu/backend_cpu.c */
extern const struct backend be_cuda; /* kernels/cuda/ (init fails when built without CUDA) */

/* The backend named name ("cpu", "cuda"), or NULL. "auto" picks cuda when a device is
 * present, else cpu. */
const struct backend *be_find(const char *name);

#endif
