/*
 * devsim.c - the devsim test backend (devsim.h).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/comm.h"
#include "tests/unit/devsim.h"

struct region {
	void *p;
	size_t len;
};

/* A staging buffer of the snapshot restore and the copy from it not yet done: devsim's
 * copies are asynchronous in the strictest way, made only at stage_wait (or at the next put
 * from the same buffer), and the buffer's bytes are hashed at put and checked when the copy
 * is made, so refilling a buffer before waiting for it fails the test by name. */
struct stage {
	void *buf;
	void *dst; /* pending copy, or NULL */
	size_t bytes;
	uint64_t hash; /* of buf[0, bytes) at put */
	bool borrowed;  /* another devsim context allocated it (a sharded restore) */
};

/* A context's regions are carved in order from one reserved range (the arena), so that
 * regions allocated one after another are contiguous and the protection of all of them,
 * changed twice an op, takes one mprotect a run of them rather than one a region: with the
 * CPU backend's threads live, each call is a TLB shootdown across the cores, and one a
 * region was most of the unit tests' time. A region freed gives its pages back and stays
 * PROT_NONE (it leaves a gap between runs); past the arena, a region is a mapping of its
 * own. */
#define ARENA_BYTES ((size_t)64 << 30)

struct devsim {
	void *cpu; /* the CPU backend's context */
	struct region *r; /* in the order allocated (the arena's in address order) */
	int n, cap;
	char *arena;      /* ARENA_BYTES reserved, PROT_NONE; NULL when the reservation failed */
	size_t used;      /* the arena's bytes carved so far (never reused) */
	int ops, copies, uploads, stage_puts;
	pthread_mutex_t mu; /* the restore's reader threads */
	struct stage st[64];
	int n_st;
};

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

/* Every region's protection, one mprotect a run of regions that follow one another. */
static void protect_all(struct devsim *d, int prot)
{
	for (int i = 0, j; i < d->n; i = j) {
		size_t len = d->r[i].len;
		for (j = i + 1; j < d->n && (char *)d->r[j].p == (char *)d->r[i].p + len; j++)
			len += d->r[j].len;
		cr_assert_eq(mprotect(d->r[i].p, len, prot), 0);
	}
}

static bool in_arena(const struct devsim *d, const void *p)
{
	return d->arena && (const char *)p >= d->arena && (const char *)p < d->arena + ARENA_BYTES;
}

#define OPEN(d) protect_all(d, PROT_READ | PROT_WRITE)
#define CLOSE(d) protect_all(d, PROT_NONE)

/* Every live devsim context, for comm_devsim to find which one a buffer belongs to. The
 * lock covers the list and every context's region table while it changes size. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct devsim *live[64];
static int n_live;
static void *stage_bufs[256]; /* every context's staging buffers (lock order: mu, live_mu) */
static int n_stage_bufs;

static void *region_new(struct devsim *d, size_t bytes)
{
	size_t len = page_round(bytes ? bytes : 1);
	void *p = NULL;
	pthread_mutex_lock(&live_mu);
	if (d->arena && len <= ARENA_BYTES - d->used) {
		p = d->arena + d->used; /* already PROT_NONE, as every region is between ops */
		d->used += len;
	} else {
		p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			pthread_mutex_unlock(&live_mu);
			return NULL;
		}
	}
	if (d->n == d->cap) {
		d->cap = d->cap ? 2 * d->cap : 64;
		d->r = realloc(d->r, (size_t)d->cap * sizeof *d->r);
		cr_assert_not_null(d->r);
	}
	d->r[d->n++] = (struct region){p, len};
	pthread_mutex_unlock(&live_mu);
	return p;
}

static int ds_init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	struct devsim *d = calloc(1, sizeof *d);
	cr_assert_not_null(d);
	pthread_mutex_init(&d->mu, NULL);
	d->arena = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			-1, 0);
	if (d->arena == MAP_FAILED)
		d->arena = NULL; /* a mapping a region */
	int rc = be_cpu.init(&d->cpu, cfg, err, errsz);
	pthread_mutex_lock(&live_mu);
	cr_assert_lt(n_live, 64, "devsim: too many contexts");
	live[n_live++] = d;
	pthread_mutex_unlock(&live_mu);
	*ctx = d;
	return rc;
}

static void ds_shutdown(void *ctx)
{
	struct devsim *d = ctx;
	pthread_mutex_lock(&live_mu);
	for (int i = 0; i < n_live; i++)
		if (live[i] == d)
			live[i] = live[--n_live];
	pthread_mutex_unlock(&live_mu);
	for (int i = 0; i < d->n; i++)
		if (!in_arena(d, d->r[i].p))
			munmap(d->r[i].p, d->r[i].len);
	if (d->arena)
		munmap(d->arena, ARENA_BYTES);
	free(d->r);
	cr_assert_eq(d->n_st, 0, "devsim: %d staging buffers not freed", d->n_st);
	pthread_mutex_destroy(&d->mu);
	be_cpu.shutdown(d->cpu);
	free(d);
}

void devsim_counts(void *ctx, struct devsim_counts *out)
{
	struct devsim *d = ctx;
	*out = (struct devsim_counts){.ops = d->ops, .copies = d->copies, .regions = d->n,
				      .uploads = d->uploads, .stage_puts = d->stage_puts};
}

static bool ds_supports(void *ctx, enum be_op op, enum dt_type wt)
{
	struct devsim *d = ctx;
	return be_cpu.supports(d->cpu, op, wt);
}

/* The other direction: an op may only be handed device memory (a host pointer would crash a
 * GPU kernel). NULL passes: optional arguments. */
static void dev(void *ctx, const void *p, const char *what)
{
	struct devsim *d = ctx;
	if (!p)
		return;
	for (int i = 0; i < d->n; i++)
		if ((const char *)p >= (const char *)d->r[i].p &&
		    (const char *)p < (const char *)d->r[i].p + d->r[i].len)
			return;
	cr_assert_fail("devsim: %s (%p) is not device memory", what, p);
}

static void dev_w(void *ctx, const struct be_weight *w, const char *what)
{
	dev(ctx, w->data, what);
	dev(ctx, w->scale, what);
}

/* Each op: the regions open only while the CPU kernel runs. */
#define WRAP(call)                      \
	do {                            \
		struct devsim *d = ctx; \
		OPEN(d);                \
		be_cpu.call;            \
		CLOSE(d);               \
		d->ops++;               \
	} while (0)
#define CPU ((struct devsim *)ctx)->cpu

static void ds_matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	dev(ctx, y, "matmul y");
	dev(ctx, x, "matmul x");
	dev_w(ctx, w, "matmul weight");
	WRAP(matmul(CPU, y, x, w, n));
}

static void ds_add_rmsnorm(void *ctx, float *x, const float *dx, float *y, const float *w,
			   int n, int dim, float eps)
{
	dev(ctx, x, "add_rmsnorm x");
	dev(ctx, dx, "add_rmsnorm d");
	dev(ctx, y, "add_rmsnorm y");
	dev(ctx, w, "add_rmsnorm w");
	WRAP(add_rmsnorm(CPU, x, dx, y, w, n, dim, eps)); /* (WRAP's d is devsim) */
}

static void ds_norm_n(void *ctx, const struct be_norm *r, int count)
{
	for (int k = 0; k < count; k++) {
		dev(ctx, r[k].y, "norm_n y");
		dev(ctx, r[k].x, "norm_n x");
		dev(ctx, r[k].w, "norm_n w");
		dev(ctx, r[k].b, "norm_n b");
		dev(ctx, r[k].rope_pos, "norm_n rope_pos");
		dev(ctx, r[k].add, "norm_n add");
	}
	WRAP(norm_n(CPU, r, count));
}

static void ds_rope_n(void *ctx, const struct be_rope *r, int count, float theta,
		      bool interleaved)
{
	for (int k = 0; k < count; k++) {
		dev(ctx, r[k].x, "rope_n x");
		dev(ctx, r[k].pos, "rope_n pos");
	}
	WRAP(rope_n(CPU, r, count, theta, interleaved));
}

static void ds_argmax(void *ctx, int *idx, const float *logits, int n, int vocab)
{
	dev(ctx, idx, "argmax idx");
	dev(ctx, logits, "argmax logits");
	WRAP(argmax(CPU, idx, logits, n, vocab));
}

static void ds_sample_cand(void *ctx, struct samp_cand *cand, struct be_cand_head *head,
			   const float *logits, const struct be_samp *s, int n, int vocab, int cap)
{
	dev(ctx, cand, "sample_cand cand");
	dev(ctx, head, "sample_cand head");
	dev(ctx, logits, "sample_cand logits");
	dev(ctx, s, "sample_cand settings");
	WRAP(sample_cand(CPU, cand, head, logits, s, n, vocab, cap));
}

static void ds_act_quant(void *ctx, float *y, const float *x, int n, int cols)
{
	dev(ctx, y, "act_quant y");
	dev(ctx, x, "act_quant x");
	WRAP(act_quant(CPU, y, x, n, cols));
}

/* The CPU has no matmul_fp8w; its contract is matmul's result (within ~1e-5), which the
 * CPU's matmul gives exactly, so devsim runs that for each weight after the checks: what
 * this tests is the engine's choice of the op and its arguments (FP8 weights of one width,
 * device memory), and the logits stay the CPU's bit for bit. */
static void ds_matmul_fp8w(void *ctx, float *const *y, const float *x,
			   const struct be_weight *const *w, int count, int n)
{
	cr_assert(count >= 1 && count <= BE_MATMUL_MAX, "devsim: matmul_fp8w of %d weights",
		  count);
	dev(ctx, x, "matmul_fp8w x");
	for (int k = 0; k < count; k++) {
		cr_assert(w[k]->dtype == DT_F8_E4M3 && w[k]->cols == w[0]->cols,
			  "devsim: matmul_fp8w weight %d is %s with %d columns", k,
			  dt_name(w[k]->dtype), w[k]->cols);
		dev(ctx, y[k], "matmul_fp8w y");
		dev_w(ctx, w[k], "matmul_fp8w weight");
	}
	WRAP(matmul_n(CPU, y, x, w, count, n));
}

static void ds_matmul_n(void *ctx, float *const *y, const float *x,
			const struct be_weight *const *w, int count, int n)
{
	dev(ctx, x, "matmul_n x");
	for (int k = 0; k < count; k++) {
		dev(ctx, y[k], "matmul_n y");
		dev_w(ctx, w[k], "matmul_n weight");
	}
	WRAP(matmul_n(CPU, y, x, w, count, n));
}

static void ds_matmul_rope_n(void *ctx, float *const *y, const float *x,
			     const struct be_weight *const *w, int count, int n,
			     const struct be_rope *r, float theta)
{
	dev(ctx, x, "matmul_rope_n x");
	for (int k = 0; k < count; k++) {
		dev(ctx, y[k], "matmul_rope_n y");
		dev_w(ctx, w[k], "matmul_rope_n weight");
		if (r[k].rot_dim > 0) {
			dev(ctx, r[k].x, "matmul_rope_n rotated");
			dev(ctx, r[k].pos, "matmul_rope_n pos");
		}
	}
	WRAP(matmul_rope_n(CPU, y, x, w, count, n, r, theta));
}

static void ds_rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim,
		       float eps)
{
	dev(ctx, y, "rmsnorm y");
	dev(ctx, x, "rmsnorm x");
	dev(ctx, w, "rmsnorm weight");
	WRAP(rmsnorm(CPU, y, x, w, n, dim, eps));
}

static void ds_rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		    int rot_dim, float theta, bool interleaved)
{
	dev(ctx, x, "rope x");
	dev(ctx, pos, "rope positions");
	WRAP(rope(CPU, x, n, pos, n_heads, head_dim, rot_dim, theta, interleaved));
}

static void ds_attention(void *ctx, float *out, const float *q, const struct be_gqa *s, int n,
			 int pos0)
{
	dev(ctx, out, "attention out");
	dev(ctx, q, "attention q");
	dev(ctx, s->k, "attention k");
	dev(ctx, s->v, "attention v");
	if (s->kv == DT_F8_E4M3) {
		dev(ctx, s->ks, "attention k scales");
		dev(ctx, s->vs, "attention v scales");
	}
	dev(ctx, s->seq, "attention seq");
	dev(ctx, s->pos, "attention pos");
	WRAP(attention(CPU, out, q, s, n, pos0));
}

static void ds_cast_n(void *ctx, const struct be_cast *c, int count)
{
	for (int k = 0; k < count; k++) {
		dev(ctx, c[k].dst, "cast dst");
		dev(ctx, c[k].src, "cast src");
		if (c[k].ds)
			dev(ctx, c[k].ds, "cast dst scales");
		if (c[k].ss)
			dev(ctx, c[k].ss, "cast src scales");
	}
	WRAP(cast_n(CPU, c, count));
}

static void ds_silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	dev(ctx, g, "silu_mul g");
	dev(ctx, u, "silu_mul u");
	WRAP(silu_mul(CPU, g, u, n));
}

static void ds_add(void *ctx, float *y, const float *x, size_t n)
{
	dev(ctx, y, "add y");
	dev(ctx, x, "add x");
	WRAP(add(CPU, y, x, n));
}

static void ds_layernorm(void *ctx, float *y, const float *x, const float *w, const float *b,
			 int n, int dim, float eps)
{
	dev(ctx, y, "layernorm y");
	dev(ctx, x, "layernorm x");
	dev(ctx, w, "layernorm w");
	dev(ctx, b, "layernorm b");
	WRAP(layernorm(CPU, y, x, w, b, n, dim, eps));
}

static void ds_moe_route(void *ctx, int *idx, float *wt, const float *logits, const float *bias,
			 int n, const struct be_route *r)
{
	dev(ctx, idx, "moe_route idx");
	dev(ctx, wt, "moe_route wt");
	dev(ctx, logits, "moe_route logits");
	dev(ctx, bias, "moe_route bias");
	WRAP(moe_route(CPU, idx, wt, logits, bias, n, r));
}

static void ds_gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n,
			   int dim)
{
	dev(ctx, dst, "gather dst");
	dev(ctx, src, "gather src");
	dev(ctx, rows, "gather rows");
	WRAP(gather_rows(CPU, dst, src, rows, n, dim));
}

static void ds_scatter_add_rows(void *ctx, float *y, const float *x, const int *rows,
				const float *scale, int n, int dim)
{
	dev(ctx, y, "scatter y");
	dev(ctx, x, "scatter x");
	dev(ctx, rows, "scatter rows");
	dev(ctx, scale, "scatter scale");
	WRAP(scatter_add_rows(CPU, y, x, rows, scale, n, dim));
}

static void ds_mla_absorb_q(void *ctx, float *qa, const float *q, const struct be_weight *kv_b,
			    int n, int n_heads, int d_nope, int d_rope, int d_v)
{
	dev(ctx, qa, "absorb_q qa");
	dev(ctx, q, "absorb_q q");
	dev_w(ctx, kv_b, "absorb_q kv_b");
	WRAP(mla_absorb_q(CPU, qa, q, kv_b, n, n_heads, d_nope, d_rope, d_v));
}

static void ds_mla_absorb_out(void *ctx, float *o, const float *lat,
			      const struct be_weight *kv_b, int n, int n_heads, int d_nope, int d_v)
{
	dev(ctx, o, "absorb_out o");
	dev(ctx, lat, "absorb_out lat");
	dev_w(ctx, kv_b, "absorb_out kv_b");
	WRAP(mla_absorb_out(CPU, o, lat, kv_b, n, n_heads, d_nope, d_v));
}

static void ds_mla_attention(void *ctx, float *out, const float *q, const struct be_mla *s,
			     int n, int pos0)
{
	dev(ctx, out, "mla out");
	dev(ctx, q, "mla q");
	dev(ctx, s->k_a, "mla k_a");
	dev(ctx, s->k_b, "mla k_b");
	dev(ctx, s->v, "mla v");
	dev(ctx, s->a_s, "mla k_a scales");
	dev(ctx, s->sel, "mla sel");
	dev(ctx, s->nsel, "mla nsel");
	dev(ctx, s->seq, "mla seq");
	dev(ctx, s->pos, "mla pos");
	WRAP(mla_attention(CPU, out, q, s, n, pos0));
}

static void ds_mla_absorbed(void *ctx, float *o, float *qa, float *lat, const float *q,
			    const struct be_weight *kv_b, const struct be_mla *s, int n, int pos0,
			    int d_nope, int d_v)
{
	dev(ctx, o, "mla_absorbed o");
	dev(ctx, qa, "mla_absorbed qa");
	dev(ctx, lat, "mla_absorbed lat");
	dev(ctx, q, "mla_absorbed q");
	dev_w(ctx, kv_b, "mla_absorbed kv_b");
	dev(ctx, s->k_a, "mla_absorbed k_a");
	dev(ctx, s->k_b, "mla_absorbed k_b");
	dev(ctx, s->v, "mla_absorbed v");
	dev(ctx, s->a_s, "mla_absorbed k_a scales");
	dev(ctx, s->sel, "mla_absorbed sel");
	dev(ctx, s->nsel, "mla_absorbed nsel");
	WRAP(mla_absorbed(CPU, o, qa, lat, q, kv_b, s, n, pos0, d_nope, d_v));
}

static void ds_dsa_topk(void *ctx, int *sel, int *nsel, const float *q, const float *w,
			const struct be_dsa *x, int n, int pos0, float *scores, void *work)
{
	dev(ctx, sel, "dsa sel");
	dev(ctx, nsel, "dsa nsel");
	dev(ctx, q, "dsa q");
	dev(ctx, x->k, "dsa k");
	dev(ctx, x->ks, "dsa k scales");
	dev(ctx, x->seq, "dsa seq");
	dev(ctx, x->pos, "dsa pos");
	dev(ctx, w, "dsa w");
	dev(ctx, scores, "dsa scores");
	dev(ctx, work, "dsa work");
	WRAP(dsa_topk(CPU, sel, nsel, q, w, x, n, pos0, scores, work));
}

static size_t ds_moe_scratch(void *ctx, int n, const struct be_experts *ex)
{
	struct devsim *d = ctx;
	return be_cpu.moe_scratch(d->cpu, n, ex);
}

/* Every weight pointer of a layer's local experts and its shared expert is device memory. */
static void dev_experts(void *ctx, const struct be_experts *ex, const char *what)
{
	for (int i = -1; i < ex->n_local; i++) {
		const struct be_expert *w = i < 0 ? ex->shared : &ex->experts[i];
		if (!w)
			continue;
		const void *p[6] = {w->gate, w->up, w->down, w->gate_s, w->up_s, w->down_s};
		for (int k = 0; k < 6; k++)
			dev(ctx, p[k], what);
	}
}

static void ds_moe_experts(void *ctx, float *y, const float *x, const int *idx, const float *wt,
			   int n, const struct be_experts *ex, void *scratch)
{
	dev(ctx, y, "moe_experts y");
	dev(ctx, x, "moe_experts x");
	dev(ctx, idx, "moe_experts idx");
	dev(ctx, wt, "moe_experts wt");
	dev(ctx, scratch, "moe_experts scratch");
	dev_experts(ctx, ex, "moe_experts weight");
	WRAP(moe_experts(CPU, y, x, idx, wt, n, ex, scratch));
}

static void ds_moe_route_experts(void *ctx, float *y, const float *x, const float *logits,
				 const float *bias, const struct be_route *r, int *idx, float *wt,
				 int n, const struct be_experts *ex, void *scratch)
{
	dev(ctx, logits, "moe_route_experts logits");
	dev(ctx, bias, "moe_route_experts bias");
	dev(ctx, idx, "moe_route_experts idx");
	dev(ctx, wt, "moe_route_experts wt");
	dev(ctx, y, "moe_route_experts y");
	dev(ctx, x, "moe_route_experts x");
	dev(ctx, scratch, "moe_route_experts scratch");
	dev_experts(ctx, ex, "moe_route_experts weight");
	WRAP(moe_route_experts(CPU, y, x, logits, bias, r, idx, wt, n, ex, scratch));
}

static void *ds_alloc(void *ctx, size_t bytes)
{
	return region_new(ctx, bytes);
}

static void ds_free(void *ctx, void *p)
{
	struct devsim *d = ctx;
	pthread_mutex_lock(&live_mu);
	for (int i = 0; i < d->n; i++)
		if (d->r[i].p == p) {
			/* in the arena: its pages given back, the range kept PROT_NONE */
			if (in_arena(d, p))
				cr_assert_neq(mmap(p, d->r[i].len, PROT_NONE, MAP_PRIVATE |
						   MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0),
					      MAP_FAILED);
			else
				munmap(p, d->r[i].len);
			memmove(d->r + i, d->r + i + 1, (size_t)(d->n - i - 1) * sizeof *d->r);
			d->n--;
			pthread_mutex_unlock(&live_mu);
			return;
		}
	pthread_mutex_unlock(&live_mu);
	cr_assert_fail("freeing %p, which devsim did not allocate", p);
}

static void ds_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	dev(ctx, dst, "copy dst");
	dev(ctx, src, "copy src");
	struct devsim *d = ctx;
	OPEN(d);
	memmove(dst, src, bytes);
	CLOSE(d);
	d->copies++;
}

static void ds_copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
		       size_t width, size_t height)
{
	if (!width || !height)
		return;
	dev(ctx, dst, "copy_2d dst");
	dev(ctx, (const char *)dst + (height - 1) * dpitch + width - 1, "copy_2d dst end");
	dev(ctx, src, "copy_2d src");
	dev(ctx, (const char *)src + (height - 1) * spitch + width - 1, "copy_2d src end");
	struct devsim *d = ctx;
	OPEN(d);
	for (size_t r = 0; r < height; r++)
		memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
	CLOSE(d);
	d->copies++;
}

static void ds_zero(void *ctx, void *dst, size_t bytes)
{
	dev(ctx, dst, "zero dst");
	struct devsim *d = ctx;
	OPEN(d);
	memset(dst, 0, bytes);
	CLOSE(d);
	d->copies++;
}

static void ds_to_device(void *ctx, void *dst, const void *host, size_t bytes)
{
	dev(ctx, dst, "to_device dst");
	struct devsim *d = ctx;
	OPEN(d);
	memmove(dst, host, bytes);
	CLOSE(d);
	d->copies++;
}

static void ds_to_host(void *ctx, void *host, const void *src, size_t bytes)
{
	dev(ctx, src, "to_host src");
	struct devsim *d = ctx;
	OPEN(d);
	memmove(host, src, bytes);
	CLOSE(d);
	d->copies++;
}

static void *upload(struct devsim *d, const void *host, size_t bytes)
{
	void *p = region_new(d, bytes);
	cr_assert_not_null(p);
	ds_to_device(d, p, host, bytes);
	return p;
}

static int ds_upload(void *ctx, struct be_weight *w, char *err, size_t errsz)
{
	(void)err;
	(void)errsz;
	struct devsim *d = ctx;
	d->uploads++;
	w->data = upload(d, w->data, (size_t)w->rows * w->cols * dt_size(w->dtype));
	if (w->scale)
		w->scale = upload(d, w->scale,
				  (size_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128) *
					  sizeof(float));
	return WK_OK;
}

static void *ds_stage_alloc(void *ctx, size_t bytes)
{
	struct devsim *d = ctx;
	void *p = aligned_alloc(4096, page_round(bytes));
	pthread_mutex_lock(&d->mu);
	cr_assert_lt(d->n_st, 64, "devsim: too many staging buffers");
	d->st[d->n_st++] = (struct stage){.buf = p};
	pthread_mutex_lock(&live_mu);
	cr_assert_lt(n_stage_bufs, 256, "devsim: too many staging buffers");
	stage_bufs[n_stage_bufs++] = p;
	pthread_mutex_unlock(&live_mu);
	pthread_mutex_unlock(&d->mu);
	return p;
}

/* The buffer's entry; one another context allocated is registered by its first put (add),
 * else NULL. A buffer no devsim context allocated fails the test. (Under mu.) */
static struct stage *stage_of(struct devsim *d, const void *buf, bool add)
{
	for (int i = 0; i < d->n_st; i++)
		if (d->st[i].buf == buf)
			return &d->st[i];
	bool known = false;
	pthread_mutex_lock(&live_mu);
	for (int i = 0; i < n_stage_bufs && !known; i++)
		known = stage_bufs[i] == buf;
	pthread_mutex_unlock(&live_mu);
	cr_assert(known, "devsim: %p is not a staging buffer", buf);
	if (!add)
		return NULL;
	cr_assert_lt(d->n_st, 64, "devsim: too many staging buffers");
	d->st[d->n_st] = (struct stage){.buf = (void *)buf, .borrowed = true};
	return &d->st[d->n_st++];
}

/* The pending copy from s, if any (under mu). */
static void stage_flush(struct devsim *d, struct stage *s)
{
	if (!s->dst)
		return;
	cr_assert_eq(XXH3_64bits(s->buf, s->bytes), s->hash, "devsim: a staging buffer was "
		     "refilled before stage_wait (its copy could still be reading it)");
	OPEN(d);
	memcpy(s->dst, s->buf, s->bytes);
	CLOSE(d);
	s->dst = NULL;
}

static void ds_stage_free(void *ctx, void *buf)
{
	struct devsim *d = ctx;
	pthread_mutex_lock(&d->mu);
	struct stage *s = stage_of(d, buf, false);
	bool own = s && !s->borrowed;
	if (s) {
		cr_assert_null(s->dst, "devsim: a staging buffer freed with a copy not waited for");
		*s = d->st[--d->n_st];
	}
	if (own) {
		pthread_mutex_lock(&live_mu);
		for (int i = 0; i < n_stage_bufs; i++)
			if (stage_bufs[i] == buf)
				stage_bufs[i] = stage_bufs[--n_stage_bufs];
		pthread_mutex_unlock(&live_mu);
	}
	pthread_mutex_unlock(&d->mu);
	if (own)
		free(buf);
}

static int ds_stage_put(void *ctx, void *dst, const void *buf, size_t bytes, char *err,
			size_t errsz)
{
	(void)err;
	(void)errsz;
	struct devsim *d = ctx;
	pthread_mutex_lock(&d->mu);
	dev(ctx, dst, "stage_put dst");
	dev(ctx, (char *)dst + bytes - 1, "stage_put dst end");
	struct stage *s = stage_of(d, buf, true);
	stage_flush(d, s); /* copies still in flight from the same, unchanged buffer */
	*s = (struct stage){.buf = s->buf, .dst = dst, .bytes = bytes,
			    .hash = XXH3_64bits(buf, bytes), .borrowed = s->borrowed};
	d->stage_puts++;
	pthread_mutex_unlock(&d->mu);
	return WK_OK;
}

static int ds_stage_wait(void *ctx, const void *buf, char *err, size_t errsz)
{
	(void)err;
	(void)errsz;
	struct devsim *d = ctx;
	pthread_mutex_lock(&d->mu);
	struct stage *s = stage_of(d, buf, false);
	if (s) /* none: this context made no copy from it */
		stage_flush(d, s);
	pthread_mutex_unlock(&d->mu);
	return WK_OK;
}

static int ds_sync(void *ctx, char *err, size_t errsz)
{
	(void)ctx;
	(void)err;
	(void)errsz;
	return WK_OK;
}

#define DEVSIM_OPS \
	.name = "devsim", \
	.init = ds_init, \
	.shutdown = ds_shutdown, \
	.supports = ds_supports, \
	.matmul = ds_matmul, \
	.matmul_n = ds_matmul_n, \
	.matmul_rope_n = ds_matmul_rope_n, \
	.matmul_fp8w = ds_matmul_fp8w, \
	.add_rmsnorm = ds_add_rmsnorm, \
	.act_quant = ds_act_quant, \
	.argmax = ds_argmax, \
	.sample_cand = ds_sample_cand, \
	.rope_n = ds_rope_n, \
	.norm_n = ds_norm_n, \
	.rmsnorm = ds_rmsnorm, \
	.rope = ds_rope, \
	.attention = ds_attention, \
	.silu_mul = ds_silu_mul, \
	.add = ds_add, \
	.cast_n = ds_cast_n, \
	.layernorm = ds_layernorm, \
	.moe_route = ds_moe_route, \
	.gather_rows = ds_gather_rows, \
	.scatter_add_rows = ds_scatter_add_rows, \
	.mla_absorb_q = ds_mla_absorb_q, \
	.mla_absorb_out = ds_mla_absorb_out, \
	.mla_attention = ds_mla_attention, \
	.mla_absorbed = ds_mla_absorbed, \
	.dsa_topk = ds_dsa_topk, \
	.mem_alloc = ds_alloc, \
	.mem_free = ds_free, \
	.to_device = ds_to_device, \
	.to_host = ds_to_host, \
	.copy = ds_copy, \
	.copy_2d = ds_copy_2d, \
	.zero = ds_zero, \
	.upload_weight = ds_upload,  \
	.stage_alloc = ds_stage_alloc, \
	.stage_free = ds_stage_free, \
	.stage_put = ds_stage_put, \
	.stage_wait = ds_stage_wait, \
	.sync = ds_sync

const struct backend be_devsim = {
	DEVSIM_OPS,
	.moe_scratch = ds_moe_scratch,
	.moe_experts = ds_moe_experts,
	.moe_route_experts = ds_moe_route_experts,
};

const struct backend be_devsim_ungrouped = {DEVSIM_OPS};

/* ---- comm_devsim: the collectives of a sharded engine on devsim ranks --------------------------
 * comm_cpu's, with each rank's buffers checked to be devsim memory of one context (NCCL takes
 * device pointers only) and that context's regions open while the collective runs: a rank
 * opens its own on entry and closes them on return, and comm_cpu's barriers keep every peer
 * inside the op while it reads or writes another rank's buffer. */

static struct devsim *owner(const void *p, const char *what)
{
	pthread_mutex_lock(&live_mu);
	for (int k = 0; k < n_live; k++) {
		struct devsim *d = live[k];
		for (int i = 0; i < d->n; i++)
			if ((const char *)p >= (const char *)d->r[i].p &&
			    (const char *)p < (const char *)d->r[i].p + d->r[i].len) {
				pthread_mutex_unlock(&live_mu);
				return d;
			}
	}
	pthread_mutex_unlock(&live_mu);
	cr_assert_fail("devsim comm: %s (%p) is not device memory", what, p);
	return NULL;
}

static struct devsim *owner2(const void *a, const void *b, const char *what)
{
	struct devsim *d = owner(a, what);
	cr_assert_eq(owner(b, what), d, "devsim comm: %s: send and recv on different devices",
		     what);
	return d;
}

static int dc_init(void **ctx, int world, char *err, size_t errsz)
{
	return comm_cpu.init(ctx, world, err, errsz);
}

static void dc_destroy(void *ctx)
{
	comm_cpu.destroy(ctx);
}

#define IN_OPEN(d, call)             \
	do {                         \
		OPEN(d);             \
		int rc_ = comm_cpu.call; \
		CLOSE(d);            \
		return rc_;          \
	} while (0)

static int dc_all_reduce(void *ctx, int rank, float *buf, size_t n, char *err, size_t errsz)
{
	struct devsim *d = owner(buf, "all_reduce buf");
	IN_OPEN(d, all_reduce(ctx, rank, buf, n, err, errsz));
}

static int dc_all_gather(void *ctx, int rank, const void *send, void *recv, size_t bytes,
			 char *err, size_t errsz)
{
	struct devsim *d = owner2(send, recv, "all_gather");
	IN_OPEN(d, all_gather(ctx, rank, send, recv, bytes, err, errsz));
}

static int dc_reduce_scatter(void *ctx, int rank, const float *send, float *recv, size_t n,
			     char *err, size_t errsz)
{
	struct devsim *d = owner2(send, recv, "reduce_scatter");
	IN_OPEN(d, reduce_scatter(ctx, rank, send, recv, n, err, errsz));
}

static int dc_all_to_all(void *ctx, int rank, const void *send, void *recv, size_t bytes,
			 char *err, size_t errsz)
{
	struct devsim *d = owner2(send, recv, "all_to_all");
	IN_OPEN(d, all_to_all(ctx, rank, send, recv, bytes, err, errsz));
}

static int dc_all_to_allv(void *ctx, int rank, const void *send, const size_t *scount,
			  const size_t *sdispl, void *recv, const size_t *rcount,
			  const size_t *rdispl, char *err, size_t errsz)
{
	struct devsim *d = owner2(send, recv, "all_to_allv");
	IN_OPEN(d, all_to_allv(ctx, rank, send, scount, sdispl, recv, rcount, rdispl, err, errsz));
}

static int dc_barrier(void *ctx, int rank, char *err, size_t errsz)
{
	return comm_cpu.barrier(ctx, rank, err, errsz);
}

static int dc_vote(void *ctx, int rank, int yes, int *all_yes, char *err, size_t errsz)
{
	return comm_cpu.vote(ctx, rank, yes, all_yes, err, errsz);
}

const struct comm_ops comm_devsim = {
	.name = "devsim",
	.init = dc_init,
	.destroy = dc_destroy,
	.all_reduce = dc_all_reduce,
	.all_gather = dc_all_gather,
	.reduce_scatter = dc_reduce_scatter,
	.all_to_all = dc_all_to_all,
	.all_to_allv = dc_all_to_allv,
	.barrier = dc_barrier,
	.vote = dc_vote,
};
