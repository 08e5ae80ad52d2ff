/*
 * test_devmem.c - the engine's side of a device backend, checked without a GPU: "devsim"
 * runs the CPU backend's kernels on memory that the host cannot touch. Its mem_alloc and
 * upload_weight hand out page-aligned regions kept PROT_NONE except while one of its own ops
 * or copies runs, so any place where the engine reads or writes activations, caches, norm
 * vectors or weights directly (instead of through eng_to_dev / eng_to_host / eng_dcopy and
 * the backend's ops) crashes the test with SIGSEGV. This is the plumbing the CUDA backend
 * relies on (device pointers are just as untouchable from the host there); stories260K through
 * devsim must give exactly the CPU backend's logits and text.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/backend.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/sampler.h"

struct region {
	void *p;
	size_t len;
};

struct devsim {
	void *cpu; /* the CPU backend's context */
	struct region *r;
	int n, cap;
	int ops, copies; /* counted, so the test knows the paths ran */
};

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

static void protect_all(struct devsim *d, int prot)
{
	for (int i = 0; i < d->n; i++)
		cr_assert_eq(mprotect(d->r[i].p, d->r[i].len, prot), 0);
}

#define OPEN(d) protect_all(d, PROT_READ | PROT_WRITE)
#define CLOSE(d) protect_all(d, PROT_NONE)

static void *region_new(struct devsim *d, size_t bytes)
{
	size_t len = page_round(bytes ? bytes : 1);
	void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (d->n == d->cap) {
		d->cap = d->cap ? 2 * d->cap : 64;
		d->r = realloc(d->r, (size_t)d->cap * sizeof *d->r);
		cr_assert_not_null(d->r);
	}
	d->r[d->n++] = (struct region){p, len};
	return p;
}

static int ds_init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	struct devsim *d = calloc(1, sizeof *d);
	cr_assert_not_null(d);
	int rc = be_cpu.init(&d->cpu, cfg, err, errsz);
	*ctx = d;
	return rc;
}

static void ds_shutdown(void *ctx)
{
	struct devsim *d = ctx;
	for (int i = 0; i < d->n; i++)
		munmap(d->r[i].p, d->r[i].len);
	free(d->r);
	be_cpu.shutdown(d->cpu);
	free(d);
}

static bool ds_supports(void *ctx, enum be_op op, enum dt_type wt)
{
	struct devsim *d = ctx;
	/* the ops devsim wraps: the Llama family's, as on CUDA */
	return op <= BE_OP_ADD && be_cpu.supports(d->cpu, op, wt);
}

static void ds_matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.matmul(d->cpu, y, x, w, n);
	CLOSE(d);
	d->ops++;
}

static void ds_rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim,
		       float eps)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.rmsnorm(d->cpu, y, x, w, n, dim, eps);
	CLOSE(d);
	d->ops++;
}

static void ds_rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		    int rot_dim, float theta, bool interleaved)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.rope(d->cpu, x, n, pos, n_heads, head_dim, rot_dim, theta, interleaved);
	CLOSE(d);
	d->ops++;
}

static void ds_attention(void *ctx, float *out, const float *q, const float *k, const float *v,
			 int n, int pos0, int n_heads, int n_kv, int head_dim, int kv_stride,
			 float scale)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.attention(d->cpu, out, q, k, v, n, pos0, n_heads, n_kv, head_dim, kv_stride, scale);
	CLOSE(d);
	d->ops++;
}

static void ds_silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.silu_mul(d->cpu, g, u, n);
	CLOSE(d);
	d->ops++;
}

static void ds_add(void *ctx, float *y, const float *x, size_t n)
{
	struct devsim *d = ctx;
	OPEN(d);
	be_cpu.add(d->cpu, y, x, n);
	CLOSE(d);
	d->ops++;
}

static void *ds_alloc(void *ctx, size_t bytes)
{
	return region_new(ctx, bytes);
}

static void ds_free(void *ctx, void *p)
{
	struct devsim *d = ctx;
	for (int i = 0; i < d->n; i++)
		if (d->r[i].p == p) {
			munmap(p, d->r[i].len);
			d->r[i] = d->r[--d->n];
			return;
		}
	cr_assert_fail("freeing %p, which devsim did not allocate", p);
}

static void ds_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct devsim *d = ctx;
	OPEN(d);
	memmove(dst, src, bytes);
	CLOSE(d);
	d->copies++;
}

static int ds_upload(void *ctx, struct be_weight *w, char *err, size_t errsz)
{
	(void)err;
	(void)errsz;
	struct devsim *d = ctx;
	size_t bytes = (size_t)w->rows * w->cols * dt_size(w->dtype);
	void *p = region_new(d, bytes);
	cr_assert_not_null(p);
	ds_copy(d, p, w->data, bytes);
	w->data = p;
	cr_assert_null(w->scale, "stories260K has no FP8 weights");
	return WK_OK;
}

static int ds_sync(void *ctx, char *err, size_t errsz)
{
	(void)ctx;
	(void)err;
	(void)errsz;
	return WK_OK;
}

static const struct backend be_devsim = {
	.name = "devsim",
	.init = ds_init,
	.shutdown = ds_shutdown,
	.supports = ds_supports,
	.matmul = ds_matmul,
	.rmsnorm = ds_rmsnorm,
	.rope = ds_rope,
	.attention = ds_attention,
	.silu_mul = ds_silu_mul,
	.add = ds_add,
	.mem_alloc = ds_alloc,
	.mem_free = ds_free,
	.to_device = ds_copy,
	.to_host = ds_copy,
	.copy = ds_copy,
	.upload_weight = ds_upload,
	.sync = ds_sync,
};

static char model_dir[256];

/* stories260K converted into a fresh directory (the unit stage runs before any e2e script
 * has converted it under build/). */
static void convert(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512], err[WK_ERRSZ];
	snprintf(model_dir, sizeof model_dir, "/tmp/wick-devmem-XXXXXX");
	cr_assert_not_null(mkdtemp(model_dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, model_dir, err, sizeof err), WK_OK, "convert: %s", err);
}

static void cleanup(void)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", model_dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(devmem, .init = convert, .fini = cleanup);

static struct engine *open_with(const struct backend *be, int max_seqs)
{
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = max_seqs,
			     .backend_ops = be};
	cr_assert_eq(eng_open(model_dir, &o, &e, err, sizeof err), WK_OK, "%s: %s", model_dir, err);
	return e;
}

Test(devmem, stories_through_untouchable_memory_matches_cpu)
{
	int toks[] = {1, 403, 407, 261, 378, 30, 411};
	int n = 7, V = 512;
	float *want = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
	char err[WK_ERRSZ];
	struct engine *cpu = open_with(NULL, 1), *dev = open_with(&be_devsim, 3);
	cr_assert_str_eq(eng_info(dev)->backend, "devsim");
	/* a prefill with every position's logits, then decode steps */
	cr_assert_eq(eng_forward(cpu, toks, n, 0, want, true, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(dev, toks, n, 0, got, true, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(memcmp(got, want, sizeof(float) * n * V), 0, "prefill logits differ");
	int t = 1;
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(eng_forward(cpu, &t, 1, i, want, false, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(dev, &t, 1, i, got, false, err, sizeof err), WK_OK, "%s", err);
		cr_expect_eq(memcmp(got, want, sizeof(float) * V), 0, "decode step %d differs", i);
		t = samp_argmax(want, V);
	}
	/* a batched step of two sequences (prefill and decode together) */
	eng_seq_free(dev, 0);
	int s0, s1;
	cr_assert_eq(eng_seq_alloc(dev, &s0), WK_OK);
	cr_assert_eq(eng_seq_alloc(dev, &s1), WK_OK);
	float g0[512], g1[512];
	struct eng_item a[2] = {{s0, toks, 4, g0}, {s1, toks, 2, g1}};
	cr_assert_eq(eng_step(dev, a, 2, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(cpu, toks, 4, 0, want, false, err, sizeof err), WK_OK, "%s", err);
	/* the batch's 6 tokens take another matmul path than 4 alone: the order of the sums
	 * differs, so within 1e-5 of the largest logit rather than bit for bit */
	float dmax = 0, lmax = 0;
	for (int v = 0; v < V; v++) {
		dmax = fmaxf(dmax, fabsf(g0[v] - want[v]));
		lmax = fmaxf(lmax, fabsf(want[v]));
	}
	cr_expect_leq(dmax, 1e-5f * lmax, "batched sequence 0 differs by %g", dmax);
	struct eng_item b[2] = {{s0, &t, 1, g0}, {s1, &t, 1, g1}};
	cr_assert_eq(eng_step(dev, b, 2, err, sizeof err), WK_OK, "%s", err);
	eng_close(cpu);
	eng_close(dev);
	free(want);
	free(got);
}

/* The probe works: touching devsim memory from the host is fatal. (Under ASan, whose own
 * handler turns the SIGSEGV into an abort, the release build's run of this test counts.) */
#ifdef __SANITIZE_ADDRESS__
Test(devmem, the_host_cannot_touch_devsim_memory)
{
	cr_skip_test("ASan handles the SIGSEGV itself; the release build checks this");
}
#else
Test(devmem, the_host_cannot_touch_devsim_memory, .signal = SIGSEGV)
{
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config cfg = {.threads = 1};
	cr_assert_eq(be_devsim.init(&ctx, &cfg, err, sizeof err), WK_OK);
	float *p = be_devsim.mem_alloc(ctx, 64);
	p[0] = 1.0f; /* SIGSEGV */
}
#endif
