/*
 * backend_cpu.c - the CPU backend: the engine's op table wired to the kernels of cpu.h.
 * Activations and weights are host memory, so the optional memory members stay NULL.
 */
#include <stdlib.h>

#include "common/wk.h"
#include "engine/backend.h"
#include "kernels/cpu/cpu.h"

struct cpu_ctx {
	struct cpu_pool *pool;
};

static int init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	struct cpu_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "cpu backend: out of memory");
	int rc = cpu_pool_create(cfg ? cfg->threads : 0, &c->pool);
	if (rc != WK_OK) {
		free(c);
		return wk_errf(err, errsz, rc, "cpu backend: cannot start the thread pool");
	}
	*ctx = c;
	return WK_OK;
}

static void shutdown(void *ctx)
{
	struct cpu_ctx *c = ctx;
	if (!c)
		return;
	cpu_pool_destroy(c->pool);
	free(c);
}

static bool supports(void *ctx, enum be_op op, enum dt_type wt)
{
	(void)ctx;
	if (op == BE_OP_MATMUL)
		return wt == DT_F32 || wt == DT_BF16 || wt == DT_F16 || wt == DT_F8_E4M3;
	return op >= 0 && op < BE_OP_COUNT;
}

static void matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	struct cpu_ctx *c = ctx;
	if (w->dtype == DT_F8_E4M3)
		cpu_matmul_fp8(c->pool, y, x, w->data, w->scale, n, w->rows, w->cols);
	else
		cpu_matmul(c->pool, y, x, w->data, w->dtype, n, w->rows, w->cols);
}

static void rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim, float eps)
{
	(void)ctx;
	cpu_ref_rmsnorm(y, x, w, n, dim, eps);
}

static void rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		 int rot_dim, float theta, bool interleaved)
{
	(void)ctx;
	cpu_ref_rope(x, n, pos, n_heads, head_dim, rot_dim, theta, interleaved);
}

static void attention(void *ctx, float *out, const float *q, const float *k, const float *v,
		      int n, int pos0, int n_heads, int n_kv, int head_dim, int kv_stride,
		      float scale)
{
	struct cpu_ctx *c = ctx;
	cpu_attention(c->pool, out, q, k, v, n, pos0, n_heads, n_kv, head_dim, kv_stride, scale);
}

static void silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	(void)ctx;
	cpu_ref_silu_mul(g, u, n);
}

static void add(void *ctx, float *y, const float *x, size_t n)
{
	(void)ctx;
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

const struct backend be_cpu = {
	.name = "cpu",
	.init = init,
	.shutdown = shutdown,
	.supports = supports,
	.matmul = matmul,
	.rmsnorm = rmsnorm,
	.rope = rope,
	.attention = attention,
	.silu_mul = silu_mul,
	.add = add,
};
