/*
 * count.c - the launch counter (eng_opts.count_launches): a backend that wraps the engine's
 * own and counts every op and copy before passing it on. On the CUDA backend each op is one
 * kernel launch and each copy or zero one cudaMemcpyAsync / cudaMemsetAsync, so these counts
 * are the launches of a step, with the grouped MoE op weighed by the kernels it launches
 * there (eng_launch_kind: moe_experts 3, the plan, gate/up and down with the combine; dsa_topk is one for a decoding query); on the CPU
 * backend they are what the same step would launch on a GPU (the families issue the same
 * ops on every backend). A chain (backend member chain) is one launch on the CUDA backend
 * and counts one here on every backend, unless the backend's chain_plan says it splits it
 * (c_chain). `wick bench launches` reports them per decode step.
 *
 * The wrapper keeps the inner backend's optional members optional: a member the inner
 * backend lacks stays NULL, so host-memory backends stay host-memory (eng_host_mem). Copies
 * and zeroing are counted where the engine asks for them (eng_to_dev, eng_to_host,
 * eng_dcopy, eng_dzero), so that a host-memory backend, where they are a memcpy or nothing,
 * counts what a device would do.
 */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine_int.h"

/* The op times (eng_opts.op_times): each op's host time around its call into the inner
 * backend and, where that backend has the device's clock (mark, marks_ms), a mark before and
 * after the op on the device's timeline: the time from an op's first mark to its second is
 * the op's on the device, from one op's second to the next op's first the device's time
 * between ops (waiting for the host to issue the next, or for the host's own work). A
 * host-memory backend runs each op before returning, so there its host time is its time. */
#define OT_CAP 8192 /* marks held between reads */
#define OT_GAP (-1) /* the interval ending at a mark is between ops */
struct op_clock {
	bool on;
	int n;              /* marks made since the last read, the carried mark 0 included */
	short what[OT_CAP]; /* the interval ending at mark i (i >= 1): its op's kind, or OT_GAP */
	float ms[OT_CAP];
	long ops[ENG_LAUNCH_KINDS];
	double host_ms[ENG_LAUNCH_KINDS], dev_ms[ENG_LAUNCH_KINDS], gap_ms;
	int rc; /* WK_OK until reading the device's clock fails (then the clock stops) */
};

struct counter {
	struct backend be; /* what the engine calls: the inner backend's members, counted */
	const struct backend *in;
	void *ctx;
	long n[ENG_LAUNCH_KINDS];
	long chained[ENG_LAUNCH_KINDS]; /* ops run inside chains (not launches of their own) */
	struct op_clock ot;
};


static const char *const kind_names[ENG_LAUNCH_KINDS] = {
	"matmul", "rmsnorm", "rope", "attention", "silu_mul", "add", "layernorm", "moe_route",
	"gather_rows", "scatter_add_rows", "mla_absorb_q", "mla_absorb_out", "mla_attention",
	"dsa_topk", "moe_experts", "zero", "add_rmsnorm", "act_quant", "argmax", "mla_absorbed",
	"sample_cand", "act_split", "cast", "chain", "to_device", "to_host", "copy",
};
_Static_assert(ENG_K_COPY + 1 == ENG_LAUNCH_KINDS, "a launch kind without its name");

const char *eng_launch_kind(int k, bool *is_copy, int *launches)
{
	if (k < 0 || k >= ENG_LAUNCH_KINDS)
		return NULL;
	if (is_copy)
		*is_copy = k >= ENG_K_TO_DEVICE;
	if (launches) /* kernels per op on the CUDA backend (kernels/cuda) */
		*launches = k == ENG_K_MOE_EXPERTS ? 3 : 1;
	return kind_names[k];
}

#define IN(ctx) ((struct counter *)(ctx))

/* Attributes the marks made to their intervals, the last kept as the next ones' mark 0. */
static void ot_read(struct counter *k)
{
	struct op_clock *o = &k->ot;
	char err[WK_ERRSZ];
	if (o->n < 1)
		return;
	if (k->in->marks_ms(k->ctx, o->ms, o->n, err, sizeof err) != WK_OK) {
		o->rc = WK_EIO;
		o->on = false;
		o->n = 0;
		return;
	}
	for (int i = 1; i < o->n; i++)
		*(o->what[i] == OT_GAP ? &o->gap_ms : &o->dev_ms[o->what[i]]) += o->ms[i - 1];
	o->n = 1;
}

/* A mark on the device's timeline, ending an interval of `what` (a kind or OT_GAP). */
static void ot_mark(struct counter *k, int what)
{
	struct op_clock *o = &k->ot;
	if (o->n >= OT_CAP)
		ot_read(k);
	int i = o->on ? k->in->mark(k->ctx) : -1;
	if (i < 0 && o->on) { /* the backend's marks are full: read them, then mark again */
		ot_read(k);
		i = o->on ? k->in->mark(k->ctx) : -1;
	}
	if (i < 0 || i >= OT_CAP || i != o->n) {
		o->rc = o->rc != WK_OK ? o->rc : WK_EIO;
		o->on = false;
		return;
	}
	o->what[i] = (short)what;
	o->n = i + 1;
}

/* Around one op's call into the inner backend: ot_begin before (a mark ending the time
 * between ops; the host's clock), ot_end after (a mark ending the op's time). */
static double ot_begin(struct counter *k)
{
	if (!k->ot.on)
		return 0.0;
	if (k->in->mark)
		ot_mark(k, OT_GAP);
	return wk_now();
}

static void ot_end(struct counter *k, int kind, double t0)
{
	if (!k->ot.on)
		return;
	k->ot.host_ms[kind] += (wk_now() - t0) * 1e3;
	k->ot.ops[kind]++;
	if (k->in->mark)
		ot_mark(k, kind);
}

/* An op already counted (or counted where the engine asks for it: copies), timed as kind. */
#define TIMED(ctx, kind, call)                              \
	do {                                                \
		struct counter *k_ = IN(ctx);               \
		double t_ = ot_begin(k_);                   \
		k_->in->call;                               \
		ot_end(k_, kind, t_);                       \
	} while (0)
/* An op counted as one of kind, and timed. */
#define COUNT(ctx, kind, call)                    \
	do {                                      \
		IN(ctx)->n[kind]++;               \
		TIMED(ctx, kind, call);           \
	} while (0)

static void c_matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	COUNT(ctx, ENG_K_MATMUL, matmul(IN(ctx)->ctx, y, x, w, n));
}

static void c_add_rmsnorm(void *ctx, float *x, const float *d, float *y, const float *w, int n,
			  int dim, float eps)
{
	COUNT(ctx, ENG_K_ADD_RMSNORM, add_rmsnorm(IN(ctx)->ctx, x, d, y, w, n, dim, eps));
}

static void c_norm_n(void *ctx, const struct be_norm *r, int count)
{
	COUNT(ctx, ENG_K_RMSNORM, norm_n(IN(ctx)->ctx, r, count));
}

static void c_rope_n(void *ctx, const struct be_rope *r, int count, float theta,
		     bool interleaved)
{
	COUNT(ctx, ENG_K_ROPE, rope_n(IN(ctx)->ctx, r, count, theta, interleaved));
}

static void c_argmax(void *ctx, int *idx, const float *logits, int n, int vocab)
{
	COUNT(ctx, ENG_K_ARGMAX, argmax(IN(ctx)->ctx, idx, logits, n, vocab));
}

static void c_sample_cand(void *ctx, struct samp_cand *cand, struct be_cand_head *head,
			  const float *logits, const struct be_samp *s, int n, int vocab, int cap)
{
	COUNT(ctx, ENG_K_SAMPLE_CAND, sample_cand(IN(ctx)->ctx, cand, head, logits, s, n, vocab, cap));
}

static void c_act_quant(void *ctx, float *y, const float *x, int n, int cols)
{
	COUNT(ctx, ENG_K_ACT_QUANT, act_quant(IN(ctx)->ctx, y, x, n, cols));
}

/* A matmul_n or matmul_rope_n's launches: one, or what the inner backend's matmul_launches
 * says (the CUDA backend's tensor-core GEMVs one a weight, a rope_n its store cannot make). */
static void count_matmuls(struct counter *k, float *const *y, const float *x,
			  const struct be_weight *const *w, int count, int n,
			  const struct be_rope *r)
{
	int mm = 1, rot = 0;
	if (k->in->matmul_launches)
		k->in->matmul_launches(k->ctx, y, x, w, count, n, r, &mm, &rot);
	k->n[ENG_K_MATMUL] += mm;
	k->n[ENG_K_ROPE] += rot;
}

static void c_matmul_n(void *ctx, float *const *y, const float *x,
		       const struct be_weight *const *w, int count, int n)
{
	count_matmuls(IN(ctx), y, x, w, count, n, NULL);
	TIMED(ctx, ENG_K_MATMUL, matmul_n(IN(ctx)->ctx, y, x, w, count, n));
}

static void c_matmul_rope_n(void *ctx, float *const *y, const float *x,
			    const struct be_weight *const *w, int count, int n,
			    const struct be_rope *r, float theta)
{
	count_matmuls(IN(ctx), y, x, w, count, n, r);
	TIMED(ctx, ENG_K_MATMUL, matmul_rope_n(IN(ctx)->ctx, y, x, w, count, n, r, theta));
}

static void c_rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim,
		      float eps)
{
	COUNT(ctx, ENG_K_RMSNORM, rmsnorm(IN(ctx)->ctx, y, x, w, n, dim, eps));
}

static void c_rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		   int rot_dim, float theta, bool interleaved)
{
	COUNT(ctx, ENG_K_ROPE, rope(IN(ctx)->ctx, x, n, pos, n_heads, head_dim, rot_dim, theta,
				interleaved));
}

static void c_attention(void *ctx, float *out, const float *q, const struct be_gqa *s, int n,
			int pos0)
{
	COUNT(ctx, ENG_K_ATTENTION, attention(IN(ctx)->ctx, out, q, s, n, pos0));
}

static void c_cast_n(void *ctx, const struct be_cast *r, int count)
{
	COUNT(ctx, ENG_K_CAST, cast_n(IN(ctx)->ctx, r, count));
}

static void c_silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	COUNT(ctx, ENG_K_SILU_MUL, silu_mul(IN(ctx)->ctx, g, u, n));
}

static void c_add(void *ctx, float *y, const float *x, size_t n)
{
	COUNT(ctx, ENG_K_ADD, add(IN(ctx)->ctx, y, x, n));
}

static void c_layernorm(void *ctx, float *y, const float *x, const float *w, const float *b,
			int n, int dim, float eps)
{
	COUNT(ctx, ENG_K_LAYERNORM, layernorm(IN(ctx)->ctx, y, x, w, b, n, dim, eps));
}

static void c_moe_route(void *ctx, int *idx, float *wt, const float *logits, const float *bias,
			int n, const struct be_route *r)
{
	COUNT(ctx, ENG_K_MOE_ROUTE, moe_route(IN(ctx)->ctx, idx, wt, logits, bias, n, r));
}

static void c_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n,
			  int dim)
{
	COUNT(ctx, ENG_K_GATHER_ROWS, gather_rows(IN(ctx)->ctx, dst, src, rows, n, dim));
}

static void c_scatter_add_rows(void *ctx, float *y, const float *x, const int *rows,
			       const float *scale, int n, int dim)
{
	COUNT(ctx, ENG_K_SCATTER_ADD_ROWS, scatter_add_rows(IN(ctx)->ctx, y, x, rows, scale, n, dim));
}

static void c_mla_absorb_q(void *ctx, float *qa, const float *q, const struct be_weight *kv_b,
			   int n, int n_heads, int d_nope, int d_rope, int d_v)
{
	COUNT(ctx, ENG_K_MLA_ABSORB_Q, mla_absorb_q(IN(ctx)->ctx, qa, q, kv_b, n, n_heads, d_nope,
						d_rope, d_v));
}

static void c_mla_absorb_out(void *ctx, float *o, const float *lat, const struct be_weight *kv_b,
			     int n, int n_heads, int d_nope, int d_v)
{
	COUNT(ctx, ENG_K_MLA_ABSORB_OUT, mla_absorb_out(IN(ctx)->ctx, o, lat, kv_b, n, n_heads, d_nope,
						    d_v));
}

static void c_mla_attention(void *ctx, float *out, const float *q, const struct be_mla *s, int n,
			    int pos0)
{
	COUNT(ctx, ENG_K_MLA_ATTENTION, mla_attention(IN(ctx)->ctx, out, q, s, n, pos0));
}

static void c_mla_absorbed(void *ctx, float *o, float *qa, float *lat, const float *q,
			   const struct be_weight *kv_b, const struct be_mla *s, int n, int pos0,
			   int d_nope, int d_v)
{
	COUNT(ctx, ENG_K_MLA_ABSORBED, mla_absorbed(IN(ctx)->ctx, o, qa, lat, q, kv_b, s, n, pos0,
						    d_nope, d_v));
}

/* One chained launch of l [count]: its ops are tallied apart (eng_launches' chained). */
static void chained(struct counter *k, const struct be_link *l, int count)
{
	k->n[ENG_K_CHAIN]++;
	for (int i = 0; i < count; i++)
		k->chained[l[i].kind == BE_LINK_MATMUL	       ? ENG_K_MATMUL
			   : l[i].kind == BE_LINK_ADD_RMSNORM ? ENG_K_ADD_RMSNORM
			   : l[i].kind == BE_LINK_MOE	      ? ENG_K_MOE_EXPERTS
			   : l[i].kind == BE_LINK_CAST	      ? ENG_K_CAST
							      : ENG_K_RMSNORM]++;
}

/* One launch on a GPU for the whole chain, unless the inner backend's chain_plan says it
 * runs some links another way: then each chained run is one launch and each other link runs
 * through this wrapper's own ops, counted as they are (a matmul_n as its matmul_launches).
 * A backend without chain (the CPU's) runs the ops one by one, uncounted: the count is what
 * the CUDA backend launches for the same step. */
static void c_chain(void *ctx, const struct be_link *l, int count)
{
	struct counter *k = IN(ctx);
	int seg[BE_CHAIN_MAX];
	if (!k->in->chain || !k->in->chain_plan || count < 1 || count > BE_CHAIN_MAX ||
	    (k->in->chain_plan(k->ctx, l, count, seg) == 1 && seg[0] == 0 &&
	     seg[count - 1] == 0)) {
		chained(k, l, count);
		double t = ot_begin(k);
		if (k->in->chain)
			k->in->chain(k->ctx, l, count);
		else
			be_chain_each(k->in, k->ctx, l, count);
		ot_end(k, ENG_K_CHAIN, t);
		return;
	}
	for (int i = 0, j; i < count; i = j) {
		for (j = i + 1; seg[i] >= 0 && j < count && seg[j] == seg[i]; j++)
			;
		if (seg[i] >= 0) {
			chained(k, l + i, j - i);
			TIMED(k, ENG_K_CHAIN, chain(k->ctx, l + i, j - i));
		} else {
			be_chain_each(&k->be, k, l + i, 1);
		}
	}
}

static void c_matmul_fp8act(void *ctx, float *const *y, const float *x,
			    const struct be_weight *const *w, int count, int n)
{ /* the quantization, then a GEMM per weight */
	IN(ctx)->n[ENG_K_ACT_QUANT]++;
	IN(ctx)->n[ENG_K_MATMUL] += count;
	TIMED(ctx, ENG_K_MATMUL, matmul_fp8act(IN(ctx)->ctx, y, x, w, count, n));
}

static void c_matmul_fp8w(void *ctx, float *const *y, const float *x,
			  const struct be_weight *const *w, int count, int n)
{ /* the bf16 split, then a GEMM per weight */
	IN(ctx)->n[ENG_K_ACT_SPLIT]++;
	IN(ctx)->n[ENG_K_MATMUL] += count;
	TIMED(ctx, ENG_K_MATMUL, matmul_fp8w(IN(ctx)->ctx, y, x, w, count, n));
}

static void c_moe_route_experts(void *ctx, float *y, const float *x, const float *logits,
				const float *bias, const struct be_route *r, int *idx, float *wt,
				int n, const struct be_experts *ex, void *scratch)
{ /* the grouped op's 3 launches, the router inside the first */
	COUNT(ctx, ENG_K_MOE_EXPERTS,
	      moe_route_experts(IN(ctx)->ctx, y, x, logits, bias, r, idx, wt, n, ex, scratch));
}

static void c_dsa_topk(void *ctx, int *sel, int *nsel, const float *q, const float *w,
		       const struct be_dsa *d, int n, int pos0, float *scores, void *work)
{
	COUNT(ctx, ENG_K_DSA_TOPK, dsa_topk(IN(ctx)->ctx, sel, nsel, q, w, d, n, pos0, scores,
					    work));
}

static void c_zero(void *ctx, void *dst, size_t bytes)
{
	TIMED(ctx, ENG_K_ZERO, zero(IN(ctx)->ctx, dst, bytes));
}

static void c_to_device(void *ctx, void *dst, const void *host, size_t bytes)
{
	TIMED(ctx, ENG_K_TO_DEVICE, to_device(IN(ctx)->ctx, dst, host, bytes));
}

static void c_to_host(void *ctx, void *host, const void *src, size_t bytes)
{
	TIMED(ctx, ENG_K_TO_HOST, to_host(IN(ctx)->ctx, host, src, bytes));
}

static void c_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	TIMED(ctx, ENG_K_COPY, copy(IN(ctx)->ctx, dst, src, bytes));
}

static void c_copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
		      size_t width, size_t height)
{ /* counted by eng_dcopy_2d, as eng_dcopy counts copy */
	TIMED(ctx, ENG_K_COPY, copy_2d(IN(ctx)->ctx, dst, dpitch, src, spitch, width, height));
}

static void c_moe_experts(void *ctx, float *y, const float *x, const int *idx, const float *wt,
			  int n, const struct be_experts *ex, void *scratch)
{
	COUNT(ctx, ENG_K_MOE_EXPERTS, moe_experts(IN(ctx)->ctx, y, x, idx, wt, n, ex, scratch));
}

static int c_moe_bind(void *ctx, struct be_experts *ex, char *err, size_t errsz)
{
	return IN(ctx)->in->moe_bind(IN(ctx)->ctx, ex, err, errsz);
}

static size_t c_moe_scratch(void *ctx, int n, const struct be_experts *ex)
{
	return IN(ctx)->in->moe_scratch(IN(ctx)->ctx, n, ex);
}

static bool c_supports(void *ctx, enum be_op op, enum dt_type wt)
{
	return IN(ctx)->in->supports(IN(ctx)->ctx, op, wt);
}

static void *c_mem_alloc(void *ctx, size_t bytes)
{
	return IN(ctx)->in->mem_alloc(IN(ctx)->ctx, bytes);
}

static int c_mem_info(void *ctx, size_t *free_b, size_t *total_b, char *err, size_t errsz)
{
	return IN(ctx)->in->mem_info(IN(ctx)->ctx, free_b, total_b, err, errsz);
}

static void c_mem_free(void *ctx, void *p)
{
	IN(ctx)->in->mem_free(IN(ctx)->ctx, p);
}

static int c_upload_weight(void *ctx, struct be_weight *w, char *err, size_t errsz)
{
	return IN(ctx)->in->upload_weight(IN(ctx)->ctx, w, err, errsz);
}

static int c_sync(void *ctx, char *err, size_t errsz)
{
	return IN(ctx)->in->sync(IN(ctx)->ctx, err, errsz);
}

static void c_attach(void *ctx) /* not a launch */
{
	IN(ctx)->in->attach(IN(ctx)->ctx);
}

/* The restore's staging (load time, from the reader threads): passed through, not counted. */
static void *c_stage_alloc(void *ctx, size_t bytes)
{
	return IN(ctx)->in->stage_alloc(IN(ctx)->ctx, bytes);
}

static void c_stage_free(void *ctx, void *stage)
{
	IN(ctx)->in->stage_free(IN(ctx)->ctx, stage);
}

static int c_stage_put(void *ctx, void *dst, const void *stage, size_t bytes, char *err,
		       size_t errsz)
{
	return IN(ctx)->in->stage_put(IN(ctx)->ctx, dst, stage, bytes, err, errsz);
}

static int c_stage_wait(void *ctx, const void *stage, char *err, size_t errsz)
{
	return IN(ctx)->in->stage_wait(IN(ctx)->ctx, stage, err, errsz);
}

static void c_shutdown(void *ctx)
{
	struct counter *k = ctx;
	k->in->shutdown(k->ctx);
	free(k);
}

/* Replaces the engine's started backend with the counting wrapper around it (and with
 * op_times, timing each op as well). */
int eng_count_wrap(struct engine *e, bool op_times, char *err, size_t errsz)
{
	struct counter *k = calloc(1, sizeof *k);
	if (!k)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	const struct backend *in = e->be;
	k->in = in;
	k->ctx = e->bctx;
	k->ot.on = op_times;
	k->ot.rc = WK_OK;
	if (op_times && !in->mark != !in->marks_ms) {
		free(k);
		return wk_errf(err, errsz, WK_EINVAL, "the %s backend has only one of mark and "
			       "marks_ms", in->name);
	}
	struct backend *b = &k->be;
	b->name = in->name;
	b->init = NULL; /* already started */
	b->shutdown = c_shutdown;
	b->supports = c_supports;
	/* every member the inner backend has, counted; the rest stay NULL */
#define KEEP(m, f) b->m = in->m ? f : NULL
	KEEP(matmul, c_matmul);
	KEEP(matmul_n, c_matmul_n);
	KEEP(matmul_rope_n, c_matmul_rope_n);
	KEEP(add_rmsnorm, c_add_rmsnorm);
	b->chain = c_chain; /* always: the GPU's count, whatever the inner backend */
	b->chain_plan = NULL; /* c_chain asks the inner one */
	b->matmul_launches = NULL; /* c_matmul_n and c_matmul_rope_n ask the inner one */
	KEEP(act_quant, c_act_quant);
	KEEP(argmax, c_argmax);
	KEEP(sample_cand, c_sample_cand);
	KEEP(rope_n, c_rope_n);
	KEEP(norm_n, c_norm_n);
	KEEP(rmsnorm, c_rmsnorm);
	KEEP(rope, c_rope);
	KEEP(attention, c_attention);
	KEEP(silu_mul, c_silu_mul);
	KEEP(add, c_add);
	KEEP(cast_n, c_cast_n);
	KEEP(layernorm, c_layernorm);
	KEEP(moe_route, c_moe_route);
	KEEP(gather_rows, c_gather_rows);
	KEEP(scatter_add_rows, c_scatter_add_rows);
	KEEP(mla_absorb_q, c_mla_absorb_q);
	KEEP(mla_absorb_out, c_mla_absorb_out);
	KEEP(mla_attention, c_mla_attention);
	KEEP(mla_absorbed, c_mla_absorbed);
	KEEP(dsa_topk, c_dsa_topk);
	KEEP(moe_bind, c_moe_bind);
	KEEP(moe_scratch, c_moe_scratch);
	KEEP(moe_experts, c_moe_experts);
	KEEP(moe_route_experts, c_moe_route_experts);
	KEEP(matmul_fp8act, c_matmul_fp8act);
	KEEP(matmul_fp8w, c_matmul_fp8w);
	KEEP(mem_alloc, c_mem_alloc);
	KEEP(mem_free, c_mem_free);
	KEEP(mem_info, c_mem_info); /* no launch: passed on, not counted */
	KEEP(to_device, c_to_device);
	KEEP(to_host, c_to_host);
	KEEP(copy, c_copy);
	KEEP(copy_2d, c_copy_2d);
	KEEP(zero, c_zero);
	KEEP(upload_weight, c_upload_weight);
	KEEP(stage_alloc, c_stage_alloc);
	KEEP(stage_free, c_stage_free);
	KEEP(stage_put, c_stage_put);
	KEEP(stage_wait, c_stage_wait);
	KEEP(sync, c_sync);
	KEEP(attach, c_attach);
#undef KEEP
	e->be = b;
	e->bctx = k;
	e->counting = true;
	return WK_OK;
}

void eng_count(struct engine *e, enum eng_kind kind)
{
	if (e->counting)
		IN(e->bctx)->n[kind]++;
}

int eng_count_read(const struct engine *e, struct eng_launches *out)
{
	if (!e->counting)
		return WK_EINVAL;
	struct counter *k = e->bctx;
	if (k->ot.on && k->in->mark) /* waits for the device: its marks so far, attributed */
		ot_read(k);
	memset(out, 0, sizeof *out);
	memcpy(out->n, k->n, sizeof out->n);
	memcpy(out->chained, k->chained, sizeof out->chained);
	out->collectives = e->n_collectives;
	memcpy(out->timed, k->ot.ops, sizeof out->timed);
	memcpy(out->host_ms, k->ot.host_ms, sizeof out->host_ms);
	memcpy(out->dev_ms, k->ot.dev_ms, sizeof out->dev_ms);
	out->gap_ms = k->ot.gap_ms;
	out->dev_clock = k->in->mark != NULL;
	out->op_times_rc = k->ot.rc;
	return WK_OK;
}
