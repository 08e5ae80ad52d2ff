/*
 * backend_null.c - a backend that does no arithmetic: every op returns at once (outputs are
 * zeroed where a caller would read them). It exists to measure everything around the engine
 * (queues, scheduling, results) without the engine's cost: `wick worker --backend null`.
 * A model on it "generates" token 0 until max_tokens.
 *
 * Fault injection for tests: with WICK_NULL_FAIL_STEP=N in the environment, the Nth step
 * (counted by sync, which the engine calls at the end of each) and every later one fail, as
 * a device with a sticky error would (tests/e2e/engine_failure.sh). With WICK_NULL_HANG_STEP=N
 * the Nth step never ends, as on a hung device (the worker's --step-timeout).
 *
 * For benchmarks: with WICK_NULL_STEP_MS=M each step takes M milliseconds (its sync sleeps),
 * as a GPU's decode step keeps the engine's thread waiting (wick bench queue --step-ms).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/backend.h"

struct null_ctx {
	long steps, fail_at, hang_at; /* 0: never */
	long step_us;                  /* what a step takes (0: nothing) */
};

static int init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	(void)cfg;
	struct null_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	const char *f = getenv("WICK_NULL_FAIL_STEP");
	c->fail_at = f ? atol(f) : 0;
	const char *hang = getenv("WICK_NULL_HANG_STEP");
	c->hang_at = hang ? atol(hang) : 0;
	const char *ms = getenv("WICK_NULL_STEP_MS");
	c->step_us = ms ? (long)(atof(ms) * 1000) : 0;
	*ctx = c;
	return WK_OK;
}

static void shutdown(void *ctx)
{
	free(ctx);
}

static int null_sync(void *ctx, char *err, size_t errsz)
{
	struct null_ctx *c = ctx;
	if (++c->steps >= c->hang_at && c->hang_at > 0)
		for (;;)
			sleep(60);
	if (c->step_us > 0)
		usleep((useconds_t)c->step_us);
	if (c->steps >= c->fail_at && c->fail_at > 0)
		return wk_errf(err, errsz, WK_EIO, "injected device failure at step %ld "
			       "(WICK_NULL_FAIL_STEP=%ld)", c->steps, c->fail_at);
	return WK_OK;
}

/* The Llama family's ops, which it has; not the GLM families' (it has none of their members,
 * so a GLM model is refused by name, not run into a missing op). */
static bool supports(void *ctx, enum be_op op, enum dt_type wt)
{
	(void)ctx;
	(void)wt;
	return op == BE_OP_MATMUL || op == BE_OP_RMSNORM || op == BE_OP_ROPE ||
	       op == BE_OP_ATTENTION || op == BE_OP_SILU_MUL || op == BE_OP_ADD;
}

static void matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	(void)ctx;
	(void)x;
	memset(y, 0, (size_t)n * w->rows * sizeof *y);
}

static void rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim, float eps)
{
	(void)ctx;
	(void)x;
	(void)w;
	(void)eps;
	memset(y, 0, (size_t)n * dim * sizeof *y);
}

static void rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		 int rot_dim, float theta, bool interleaved)
{
	(void)ctx, (void)x, (void)n, (void)pos, (void)n_heads, (void)head_dim, (void)rot_dim;
	(void)theta, (void)interleaved;
}

static void attention(void *ctx, float *out, const float *q, const struct be_gqa *s, int n,
		      int pos0)
{
	(void)ctx, (void)q, (void)pos0;
	memset(out, 0, (size_t)n * s->n_heads * s->head_dim * sizeof *out);
}

static void silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	(void)ctx, (void)g, (void)u, (void)n;
}

static void add(void *ctx, float *y, const float *x, size_t n)
{
	(void)ctx, (void)y, (void)x, (void)n;
}

static void cast_n(void *ctx, const struct be_cast *c, int count)
{
	(void)ctx, (void)c, (void)count;
}

/* The Llama ops only: GLM's extra ops stay NULL, so a GLM model on this backend is refused
 * by name at load. */
const struct backend be_null = {
	.name = "null",
	.init = init,
	.shutdown = shutdown,
	.supports = supports,
	.matmul = matmul,
	.rmsnorm = rmsnorm,
	.rope = rope,
	.attention = attention,
	.silu_mul = silu_mul,
	.add = add,
	.cast_n = cast_n,
	.sync = null_sync,
};
