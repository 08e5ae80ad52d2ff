/*
 * backend_cpu.c - the CPU backend: the engine's op table wired to the kernels of cpu.h.
 * Activations and weights are host memory, so the optional memory members stay NULL.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/glm_kernels.h"

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
	if (op == BE_OP_ATTENTION || op == BE_OP_MLA_ATTENTION || op == BE_OP_DSA_TOPK)
		return wt == DT_F32 || wt == DT_BF16 || wt == DT_F8_E4M3; /* the KV cache's */
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

static void rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim,
		    float eps);
static void add(void *ctx, float *y, const float *x, size_t n);

static void add_rmsnorm(void *ctx, float *x, const float *d, float *y, const float *w, int n,
			int dim, float eps)
{
	add(ctx, x, d, (size_t)n * dim);
	rmsnorm(ctx, y, x, w, n, dim, eps);
}

static void layernorm(void *ctx, float *y, const float *x, const float *w, const float *b, int n,
		      int dim, float eps);

static void norm_n(void *ctx, const struct be_norm *r, int count)
{
	for (int k = 0; k < count; k++) {
		const struct be_norm *q = &r[k];
		int H = q->heads > 1 ? q->heads : 1;
		size_t w = (size_t)H * q->dim, all = (size_t)q->n * q->dim;
		const float *x = q->x;
		if (q->add) { /* each token's row of the bias: y = x + add */
			for (size_t i = 0; i < all; i++)
				q->y[i] = x[i] + q->add[i % w];
			x = q->y;
		} else if (q->bare && q->y != x) {
			memcpy(q->y, x, all * sizeof *x);
		}
		if (!q->bare && q->layer)
			layernorm(ctx, q->y, x, q->w, q->b, q->n, q->dim, q->eps);
		else if (!q->bare)
			rmsnorm(ctx, q->y, x, q->w, q->n, q->dim, q->eps);
		if (q->rope_dim > 0)
			cpu_ref_rope(q->y, q->n / H, q->rope_pos, H, q->dim, q->rope_dim, q->theta,
				     !q->half);
	}
}

static void rope_n(void *ctx, const struct be_rope *r, int count, float theta,
		   bool interleaved)
{
	(void)ctx;
	for (int k = 0; k < count; k++)
		cpu_ref_rope(r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim, r[k].rot_dim,
			     theta, interleaved);
}

static void argmax(void *ctx, int *idx, const float *logits, int n, int vocab)
{
	(void)ctx;
	for (int i = 0; i < n; i++)
		idx[i] = samp_argmax(logits + (size_t)i * vocab, vocab);
}

/* The reference, with its scratch allocated per call: out of memory flags every row as
 * overflowing, which the engine then samples from the logits. */
static void sample_cand(void *ctx, struct samp_cand *cand, struct be_cand_head *head,
			const float *logits, const struct be_samp *s, int n, int vocab, int cap)
{
	_Static_assert(sizeof(struct samp_cand) == sizeof(struct cpu_cand) &&
			       sizeof(struct be_cand_head) == sizeof(struct cpu_cand_head) &&
			       sizeof(struct be_samp) == sizeof(struct cpu_samp),
		       "sample_cand layouts differ");
	(void)ctx;
	struct cpu_cand *work = malloc((size_t)vocab * sizeof *work);
	if (!work) {
		for (int i = 0; i < n; i++)
			head[i] = (struct be_cand_head){0, -1, 0};
		return;
	}
	cpu_ref_sample_cand((struct cpu_cand *)cand, (struct cpu_cand_head *)head, logits,
			    (const struct cpu_samp *)s, n, vocab, cap, work);
	free(work);
}

static void act_quant(void *ctx, float *y, const float *x, int n, int cols)
{
	(void)ctx;
	cpu_ref_act_quant(y, x, n, cols);
}

static void matmul_n(void *ctx, float *const *y, const float *x,
		     const struct be_weight *const *w, int count, int n)
{
	for (int k = 0; k < count; k++)
		matmul(ctx, y[k], x, w[k], n);
}

/* matmul_n, then each output's rotation (the op a GPU runs as one launch) */
static void matmul_rope_n(void *ctx, float *const *y, const float *x,
			  const struct be_weight *const *w, int count, int n,
			  const struct be_rope *r, float theta)
{
	matmul_n(ctx, y, x, w, count, n);
	for (int k = 0; k < count; k++)
		if (r[k].rot_dim > 0)
			cpu_ref_rope(r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim,
				     r[k].rot_dim, theta, true);
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

static void attention(void *ctx, float *out, const float *q, const struct be_gqa *b, int n,
		      int pos0)
{
	struct cpu_ctx *c = ctx;
	const struct cpu_gqa s = {b->k, b->v, b->ks, b->vs, b->kv, b->n_heads, b->n_kv,
				  b->head_dim, b->kv_stride, b->scale, b->seq, b->pos,
				  b->seq_rows, b->keys_max};
	cpu_attention(c->pool, out, q, &s, n, pos0);
}

static void cast_n(void *ctx, const struct be_cast *r, int count)
{
	(void)ctx;
	for (int k = 0; k < count; k++)
		cpu_ref_cast(r[k].dst, r[k].dt, r[k].src, r[k].st, r[k].n, r[k].ds, r[k].ss,
			     r[k].w);
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

/* ---- GLM families: the reference kernels of glm_ref.c, split over the pool where the work
 * is per head or per (token, head) ---- */

static void layernorm(void *ctx, float *y, const float *x, const float *w, const float *b, int n,
		      int dim, float eps)
{
	(void)ctx;
	cpu_ref_layernorm(y, x, w, b, n, dim, eps);
}

static void moe_route(void *ctx, int *idx, float *wt, const float *logits, const float *bias,
		      int n, const struct be_route *r)
{
	(void)ctx;
	cpu_ref_moe_route(idx, wt, logits, bias, n, r->n_experts, r->top_k, r->n_group,
			  r->topk_group, r->norm, r->scale);
}

static void gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
	(void)ctx;
	cpu_ref_gather_rows(dst, src, rows, n, dim);
}

static void scatter_add_rows(void *ctx, float *y, const float *x, const int *rows,
			     const float *scale, int n, int dim)
{
	(void)ctx;
	cpu_ref_scatter_add_rows(y, x, rows, scale, n, dim);
}

/* Grouped MoE: the slots of local experts grouped by expert (tokens ascending within each),
 * each expert's batch multiplied once (gate, up, SiLU, down, threaded matmuls), the outputs
 * z kept per slot and added to each token in slot order, as cpu_ref_moe_experts does. A
 * shared expert runs over all n tokens first with the same matmuls, its down projection
 * straight into y (as the engine's matmul_n, silu_mul and matmul would). */

_Static_assert(sizeof(struct be_expert) == sizeof(struct cpu_expert) &&
		       offsetof(struct be_expert, down_s) == offsetof(struct cpu_expert, down_s),
	       "struct be_expert must have struct cpu_expert's layout");

static size_t al64(size_t b)
{
	return (b + 63) & ~(size_t)63;
}

/* The scratch's parts: start [n_local + 1], cur [n_local], gtok [nk], gpos [nk] ints; xg
 * [nk][dim], g and u [nk][inter], z [nk][dim] floats; the shared expert's gs and us [n]
 * [shared_inter] (empty without one). */
struct moe_parts {
	int *start, *cur, *gtok, *gpos;
	float *xg, *g, *u, *z, *gs, *us;
};

static size_t moe_layout(const struct be_experts *ex, int n, void *base, struct moe_parts *p)
{
	size_t nk = (size_t)n * ex->top_k, off = 0;
	size_t ns = ex->shared ? (size_t)n * ex->shared_inter : 0;
	char *b = base;
	size_t sz[10] = {((size_t)ex->n_local + 1) * sizeof(int), (size_t)ex->n_local * sizeof(int),
			 nk * sizeof(int), nk * sizeof(int), nk * ex->dim * sizeof(float),
			 nk * ex->inter * sizeof(float), nk * ex->inter * sizeof(float),
			 nk * ex->dim * sizeof(float), ns * sizeof(float), ns * sizeof(float)};
	void *at[10];
	for (int i = 0; i < 10; i++) {
		at[i] = b ? b + off : NULL;
		off += al64(sz[i]);
	}
	if (p)
		*p = (struct moe_parts){at[0], at[1], at[2], at[3], at[4],
					at[5], at[6], at[7], at[8], at[9]};
	return off;
}

static size_t moe_scratch(void *ctx, int n, const struct be_experts *ex)
{
	(void)ctx;
	return moe_layout(ex, n, NULL, NULL);
}

static void expert_mm(struct cpu_pool *pool, float *y, const float *x, const void *w,
		      const float *scale, enum dt_type wdt, int n, int rows, int cols)
{
	if (wdt == DT_F8_E4M3)
		cpu_matmul_fp8(pool, y, x, w, scale, n, rows, cols);
	else
		cpu_matmul(pool, y, x, w, wdt, n, rows, cols);
}

/* z [n][dim] = down(silu(gate . x) * up . x) for x [n][dim]; g, u [n][inter] scratch */
static void expert_mlp(struct cpu_pool *pool, float *z, const float *x, float *g, float *u,
		       const struct be_expert *w, enum dt_type wdt, int n, int dim, int inter)
{
	expert_mm(pool, g, x, w->gate, w->gate_s, wdt, n, inter, dim);
	expert_mm(pool, u, x, w->up, w->up_s, wdt, n, inter, dim);
	cpu_ref_silu_mul(g, u, (size_t)n * inter);
	expert_mm(pool, z, g, w->down, w->down_s, wdt, n, dim, inter);
}

static void moe_experts(void *ctx, float *y, const float *x, const int *idx, const float *wt,
			int n, const struct be_experts *ex, void *scratch)
{
	struct cpu_ctx *c = ctx;
	struct moe_parts p;
	moe_layout(ex, n, scratch, &p);
	int k = ex->top_k, dim = ex->dim, inter = ex->inter, nl = ex->n_local;
	size_t nk = (size_t)n * k;
	memset(p.start, 0, ((size_t)nl + 1) * sizeof *p.start);
	for (size_t i = 0; i < nk; i++) {
		int e = idx[i] - ex->ex0;
		if (e >= 0 && e < nl)
			p.start[e + 1]++;
	}
	for (int e = 0; e < nl; e++) {
		p.start[e + 1] += p.start[e];
		p.cur[e] = p.start[e];
	}
	for (size_t i = 0; i < nk; i++) {
		int e = idx[i] - ex->ex0;
		if (e < 0 || e >= nl) {
			p.gpos[i] = -1;
			continue;
		}
		int at = p.cur[e]++;
		p.gtok[at] = (int)(i / k);
		p.gpos[i] = at;
	}
	cpu_ref_gather_rows(p.xg, x, p.gtok, p.start[nl], dim);
	if (ex->shared && n > 0)
		expert_mlp(c->pool, y, x, p.gs, p.us, ex->shared, ex->shared_dtype, n, dim,
			   ex->shared_inter);
	for (int e = 0; e < nl; e++) {
		int s = p.start[e], cnt = p.start[e + 1] - s;
		if (cnt == 0)
			continue;
		expert_mlp(c->pool, p.z + (size_t)s * dim, p.xg + (size_t)s * dim,
			   p.g + (size_t)s * inter, p.u + (size_t)s * inter, &ex->experts[e],
			   ex->dtype, cnt, dim, inter);
	}
	for (int t = 0; t < n; t++) {
		float *yt = y + (size_t)t * dim;
		for (int j = 0; j < k; j++) {
			int at = p.gpos[(size_t)t * k + j];
			if (at < 0)
				continue;
			float s = wt[(size_t)t * k + j];
			const float *z = p.z + (size_t)at * dim;
			for (int d = 0; d < dim; d++)
				yt[d] += s * z[d];
		}
	}
}

static void moe_route_experts(void *ctx, float *y, const float *x, const float *logits,
			      const float *bias, const struct be_route *r, int *idx, float *wt,
			      int n, const struct be_experts *ex, void *scratch)
{
	moe_route(ctx, idx, wt, logits, bias, n, r);
	moe_experts(ctx, y, x, idx, wt, n, ex, scratch);
}

struct absorb_job {
	float *out;
	const float *in;
	const struct be_weight *w;
	int n, n_heads, d_nope, d_rope, d_v;
	bool q;    /* absorb_q, else absorb_out */
	bool avx2; /* the AVX2 versions (glm_avx2.c) */
};

static void absorb_task(void *ctx, int h, int ntasks)
{
	const struct absorb_job *j = ctx;
	const struct be_weight *w = j->w;
	(void)ntasks;
	if (j->q)
		(j->avx2 ? cpu_mla_absorb_q_avx2 : cpu_ref_mla_absorb_q)(
			j->out, j->in, w->data, w->dtype, w->scale, w->cols, j->n, j->n_heads,
			j->d_nope, j->d_rope, j->d_v, h, h + 1);
	else
		(j->avx2 ? cpu_mla_absorb_out_avx2 : cpu_ref_mla_absorb_out)(
			j->out, j->in, w->data, w->dtype, w->scale, w->cols, j->n, j->n_heads,
			j->d_nope, j->d_v, h, h + 1);
}

static void mla_absorb_q(void *ctx, float *qa, const float *q, const struct be_weight *kv_b,
			 int n, int n_heads, int d_nope, int d_rope, int d_v)
{
	struct cpu_ctx *c = ctx;
	struct absorb_job j = {qa, q, kv_b, n, n_heads, d_nope, d_rope, d_v, true, cpu_has_avx2()};
	cpu_pool_run(c->pool, absorb_task, &j, n_heads);
}

static void mla_absorb_out(void *ctx, float *o, const float *lat, const struct be_weight *kv_b,
			   int n, int n_heads, int d_nope, int d_v)
{
	struct cpu_ctx *c = ctx;
	struct absorb_job j = {o, lat, kv_b, n, n_heads, d_nope, 0, d_v, false, cpu_has_avx2()};
	cpu_pool_run(c->pool, absorb_task, &j, n_heads);
}

struct mla_job {
	float *out;
	const float *q;
	struct cpu_mla s;
	int n, pos0;
	bool avx2;
};

static void mla_task(void *ctx, int task, int ntasks)
{
	const struct mla_job *j = ctx;
	(void)ntasks;
	int i = task / j->s.n_heads, h = task % j->s.n_heads;
	(j->avx2 ? cpu_mla_attention_avx2 : cpu_ref_mla_attention)(j->out, j->q, &j->s, j->n,
								   j->pos0, i, i + 1, h, h + 1);
}

static void mla_attention(void *ctx, float *out, const float *q, const struct be_mla *s, int n,
			  int pos0)
{
	struct cpu_ctx *c = ctx;
	struct mla_job j = {
		.out = out, .q = q, .n = n, .pos0 = pos0, .avx2 = cpu_has_avx2(),
		.s = {.n_heads = s->n_heads, .d_a = s->d_a, .d_b = s->d_b, .d_v = s->d_v,
		      .kv = s->kv, .k_a = s->k_a, .k_b = s->k_b, .v = s->v, .a_s = s->a_s,
		      .ka_stride = s->ka_stride,
		      .ka_head = s->ka_head, .kb_stride = s->kb_stride, .v_stride = s->v_stride,
		      .v_head = s->v_head, .sel = s->sel, .nsel = s->nsel,
		      .sel_stride = s->sel_stride, .scale = s->scale, .seq = s->seq,
		      .pos = s->pos, .seq_rows = s->seq_rows, .keys_max = s->keys_max},
	};
	cpu_pool_run(c->pool, mla_task, &j, n * s->n_heads);
}

/* The three ops in turn: the CPU gains nothing from one op, and this keeps their results. */
static void mla_absorbed(void *ctx, float *o, float *qa, float *lat, const float *q,
			 const struct be_weight *kv_b, const struct be_mla *s, int n, int pos0,
			 int d_nope, int d_v)
{
	mla_absorb_q(ctx, qa, q, kv_b, n, s->n_heads, d_nope, s->d_b, d_v);
	mla_attention(ctx, lat, qa, s, n, pos0);
	mla_absorb_out(ctx, o, lat, kv_b, n, s->n_heads, d_nope, d_v);
}

struct dsa_job {
	float *scores;
	const float *q, *w;
	const struct cpu_dsa *d;
	size_t base; /* the query's first cache row */
	int len;
	bool avx2;
};

enum { DSA_KEYS_PER_TASK = 64 };

static void dsa_task(void *ctx, int task, int ntasks)
{
	const struct dsa_job *j = ctx;
	const struct cpu_dsa *d = j->d;
	(void)ntasks;
	int t1 = (task + 1) * DSA_KEYS_PER_TASK < j->len ? (task + 1) * DSA_KEYS_PER_TASK : j->len;
	for (int t = task * DSA_KEYS_PER_TASK; t < t1; t++) {
		size_t r = j->base + (size_t)t;
		j->scores[t] = (j->avx2 ? cpu_dsa_score_avx2 : cpu_ref_dsa_score)(
			j->q, cpu_kv_ptr(d->k, d->kv, r * d->head_dim), d->kv,
			cpu_kv_scales(d->ks, r, d->head_dim), j->w, d->n_heads, d->head_dim,
			d->qk_scale, d->w_scale);
	}
}

static void dsa_topk(void *ctx, int *sel, int *nsel, const float *q, const float *w,
		     const struct be_dsa *b, int n, int pos0, float *scores, void *work)
{
	struct cpu_ctx *c = ctx;
	const struct cpu_dsa d = {b->k, b->ks, b->kv, b->n_heads, b->head_dim, b->topk,
				  b->qk_scale, b->w_scale, b->seq, b->pos, b->seq_rows,
				  b->keys_max};
	int H = d.n_heads, D = d.head_dim;
	for (int i = 0; i < n; i++) {
		struct dsa_job j = {scores, q + (size_t)i * H * D, w + (size_t)i * H, &d,
				    cpu_dsa_base(&d, i), cpu_dsa_len(&d, i, pos0), cpu_has_avx2()};
		if (j.len > d.topk)
			cpu_pool_run(c->pool, dsa_task, &j,
				     (j.len + DSA_KEYS_PER_TASK - 1) / DSA_KEYS_PER_TASK);
		cpu_ref_dsa_select(sel + (size_t)i * d.topk, nsel + i, scores, j.len, d.topk, work);
	}
}

const struct backend be_cpu = {
	.name = "cpu",
	.init = init,
	.shutdown = shutdown,
	.supports = supports,
	.matmul = matmul,
	.matmul_n = matmul_n,
	.matmul_rope_n = matmul_rope_n,
	.add_rmsnorm = add_rmsnorm,
	.act_quant = act_quant,
	.argmax = argmax,
	.sample_cand = sample_cand,
	.rope_n = rope_n,
	.norm_n = norm_n,
	.rmsnorm = rmsnorm,
	.rope = rope,
	.attention = attention,
	.silu_mul = silu_mul,
	.add = add,
	.cast_n = cast_n,
	.layernorm = layernorm,
	.moe_route = moe_route,
	.gather_rows = gather_rows,
	.scatter_add_rows = scatter_add_rows,
	.moe_scratch = moe_scratch,
	.moe_experts = moe_experts,
	.moe_route_experts = moe_route_experts,
	.mla_absorb_q = mla_absorb_q,
	.mla_absorb_out = mla_absorb_out,
	.mla_attention = mla_attention,
	.mla_absorbed = mla_absorbed,
	.dsa_topk = dsa_topk,
};
