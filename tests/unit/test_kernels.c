/*
 * test_kernels.c - the CPU kernels: the references against hand-computed values, and every
 * fast kernel against its reference over odd shapes, with and without a pool, with AVX2
 * and with the portable fallback.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h"

static uint64_t rng_state;

static float rnd(void) /* uniform in [-1, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (float)((rng_state >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

static float *rnd_vec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	cr_assert(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rnd();
	return v;
}

/* Random weights [rows][cols] in dtype wt. */
static void *rnd_weights(enum dt_type wt, int rows, int cols)
{
	size_t n = (size_t)rows * cols;
	void *w = malloc(n * dt_size(wt));
	cr_assert(w);
	for (size_t i = 0; i < n; i++) {
		float f = rnd();
		if (wt == DT_F32)
			((float *)w)[i] = f;
		else if (wt == DT_BF16)
			((uint16_t *)w)[i] = dt_f32_to_bf16(f);
		else
			((uint16_t *)w)[i] = dt_f32_to_f16(f);
	}
	return w;
}

/* ---- references against known values ------------------------------------------------------ */

Test(kernels, ref_matmul_known)
{
	float w[6] = {1, 2, 3, 4, 5, 6}; /* [2][3] */
	float x[6] = {1, 0, -1, 2, 1, 0}; /* [2][3] */
	float y[4];
	cpu_ref_matmul(y, x, w, DT_F32, 2, 2, 3);
	cr_assert_float_eq(y[0], -2.0f, 1e-6);
	cr_assert_float_eq(y[1], -2.0f, 1e-6);
	cr_assert_float_eq(y[2], 4.0f, 1e-6);
	cr_assert_float_eq(y[3], 13.0f, 1e-6);

	uint16_t wb[6], wh[6];
	for (int i = 0; i < 6; i++) {
		wb[i] = dt_f32_to_bf16(w[i]);
		wh[i] = dt_f32_to_f16(w[i]);
	}
	float yb[4], yh[4];
	cpu_ref_matmul(yb, x, wb, DT_BF16, 2, 2, 3);
	cpu_ref_matmul(yh, x, wh, DT_F16, 2, 2, 3);
	for (int i = 0; i < 4; i++) {
		cr_assert_float_eq(yb[i], y[i], 1e-6);
		cr_assert_float_eq(yh[i], y[i], 1e-6);
	}
}

Test(kernels, ref_rmsnorm_known)
{
	float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, y[4];
	cpu_ref_rmsnorm(y, x, w, 1, 4, 0.0f);
	float inv = 1.0f / sqrtf(30.0f / 4.0f);
	cr_assert_float_eq(y[0], 1 * inv, 1e-6);
	cr_assert_float_eq(y[2], 6 * inv, 1e-6);
	cr_assert_float_eq(y[3], 2 * inv, 1e-6);
	cpu_ref_rmsnorm(x, x, w, 1, 4, 0.0f); /* in place */
	cr_assert_float_eq(x[1], y[1], 1e-7);
}

Test(kernels, ref_softmax_known)
{
	float x[3] = {1000.0f, 1000.0f, -INFINITY};
	cpu_ref_softmax(x, 3);
	cr_assert_float_eq(x[0], 0.5f, 1e-7);
	cr_assert_float_eq(x[1], 0.5f, 1e-7);
	cr_assert_float_eq(x[2], 0.0f, 1e-7);
	float y[2] = {0.0f, logf(3.0f)};
	cpu_ref_softmax(y, 2);
	cr_assert_float_eq(y[0], 0.25f, 1e-6);
	cr_assert_float_eq(y[1], 0.75f, 1e-6);
}

Test(kernels, ref_silu_mul_known)
{
	float g[3] = {0.0f, 1.0f, -2.0f}, u[3] = {5.0f, 2.0f, 1.0f};
	cpu_ref_silu_mul(g, u, 3);
	cr_assert_float_eq(g[0], 0.0f, 1e-7);
	cr_assert_float_eq(g[1], 2.0f / (1.0f + expf(-1.0f)), 1e-6);
	cr_assert_float_eq(g[2], -2.0f / (1.0f + expf(2.0f)), 1e-6);
}

Test(kernels, ref_rope_known)
{
	/* 2 heads of 6 dims, rot_dim 4: dims 4 and 5 of each head are left alone. */
	rng_state = 7;
	float x[12], orig[12];
	for (int i = 0; i < 12; i++)
		x[i] = orig[i] = rnd();
	int pos0 = 0;
	cpu_ref_rope(x, 1, &pos0, 2, 6, 4, 10000.0f, false);
	for (int i = 0; i < 12; i++)
		cr_assert_float_eq(x[i], orig[i], 1e-7, "position 0 is the identity");

	int pos = 3;
	float theta = 100.0f;
	for (int il = 0; il < 2; il++) {
		memcpy(x, orig, sizeof x);
		cpu_ref_rope(x, 1, &pos, 2, 6, 4, theta, il);
		for (int h = 0; h < 2; h++) {
			const float *o = orig + h * 6;
			float *v = x + h * 6;
			for (int j = 0; j < 2; j++) {
				float ang = 3.0f * powf(theta, -(float)(2 * j) / 4.0f);
				int i0 = il ? 2 * j : j, i1 = il ? 2 * j + 1 : j + 2;
				cr_assert_float_eq(v[i0], o[i0] * cosf(ang) - o[i1] * sinf(ang), 1e-5);
				cr_assert_float_eq(v[i1], o[i1] * cosf(ang) + o[i0] * sinf(ang), 1e-5);
			}
			cr_assert_eq(v[4], o[4]);
			cr_assert_eq(v[5], o[5]);
		}
	}
}

Test(kernels, ref_attention_known)
{
	/* One token at position 0 sees only itself: out = v[0]. Two equal keys average. */
	float q[4] = {1, 2, 3, 4}, k[8] = {1, 1, 1, 1, 1, 1, 1, 1}, v[8] = {1, 2, 3, 4, 3, 4, 5, 6};
	float out[4];
	struct cpu_gqa c = {.k = k, .v = v, .kv = DT_F32, .n_heads = 1, .n_kv = 1, .head_dim = 4,
			    .kv_stride = 4, .scale = 0.5f};
	cpu_ref_attention(out, q, &c, 1, 0);
	for (int d = 0; d < 4; d++)
		cr_assert_float_eq(out[d], v[d], 1e-6);
	cpu_ref_attention(out, q, &c, 1, 1);
	for (int d = 0; d < 4; d++)
		cr_assert_float_eq(out[d], (v[d] + v[4 + d]) / 2, 1e-6);
}

/* ---- pool ---------------------------------------------------------------------------------- */

struct count_ctx {
	atomic_int hits[1000];
	atomic_int calls;
};

static void count_task(void *ctx, int task, int ntasks)
{
	struct count_ctx *c = ctx;
	cr_assert(task >= 0 && task < ntasks);
	atomic_fetch_add(&c->hits[task], 1);
	atomic_fetch_add(&c->calls, 1);
}

static void check_pool(struct cpu_pool *p, int rounds)
{
	static struct count_ctx c;
	for (int r = 0; r < rounds; r++) {
		int ntasks = (r * 7) % 40 + (r % 5 == 0 ? 0 : 1); /* 0 .. 40 */
		memset(&c, 0, sizeof c);
		cpu_pool_run(p, count_task, &c, ntasks);
		cr_assert_eq(atomic_load(&c.calls), ntasks);
		for (int i = 0; i < ntasks; i++)
			cr_assert_eq(atomic_load(&c.hits[i]), 1, "round %d task %d", r, i);
	}
}

Test(kernels, pool_runs_each_task_once)
{
	check_pool(NULL, 50);
	for (int threads = 1; threads <= 4; threads++) {
		struct cpu_pool *p;
		cr_assert_eq(cpu_pool_create(threads, &p), WK_OK);
		cr_assert_eq(cpu_pool_size(p), threads);
		check_pool(p, 3000);
		cpu_pool_destroy(p);
	}
	cpu_pool_destroy(NULL);
}

Test(kernels, pool_wakes_sleeping_workers)
{
	struct cpu_pool *p;
	cr_assert_eq(cpu_pool_create(3, &p), WK_OK);
	for (int i = 0; i < 3; i++) {
		usleep(10000); /* past the spin: workers are asleep on the condvar */
		check_pool(p, 5);
	}
	cpu_pool_destroy(p);

	cr_assert_eq(cpu_pool_create(0, &p), WK_OK);
	cr_assert_eq(cpu_pool_size(p), (int)sysconf(_SC_NPROCESSORS_ONLN));
	cpu_pool_destroy(p);
}

/* ---- fast against reference ---------------------------------------------------------------- */

struct shape {
	int n, rows, cols;
};

static const struct shape mm_shapes[] = {
	{1, 1, 1},    {1, 13, 37},  {7, 13, 37},   {1, 64, 16},   {7, 29, 100},
	{1, 130, 129}, {3, 5, 15},  {7, 67, 264},  {1, 260, 1030}, {2, 8, 2048},
	/* the batched path: n % 3 = 2, 0, 1; chunks of 512 columns and a tail; a token block
	 * of 24 and a remainder */
	{8, 12, 1030}, {9, 16, 530}, {4, 9, 48},  {30, 8, 520},  {26, 5, 2048},
};

static void check_matmul(struct cpu_pool *p, enum dt_type wt)
{
	rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)wt;
	for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
		struct shape sh = mm_shapes[s];
		float *x = rnd_vec((size_t)sh.n * sh.cols);
		void *w = rnd_weights(wt, sh.rows, sh.cols);
		size_t ny = (size_t)sh.n * sh.rows;
		float *want = malloc(ny * sizeof *want), *got = malloc(ny * sizeof *got);
		float *wf = malloc((size_t)sh.rows * sh.cols * sizeof *wf);
		cr_assert(want && got && wf);
		dt_to_f32(wf, w, wt, (size_t)sh.rows * sh.cols);
		cpu_ref_matmul(want, x, w, wt, sh.n, sh.rows, sh.cols);
		for (size_t i = 0; i < ny; i++)
			got[i] = NAN;
		cpu_matmul(p, got, x, w, wt, sh.n, sh.rows, sh.cols);
		for (int t = 0; t < sh.n; t++)
			for (int r = 0; r < sh.rows; r++) {
				/* Weights convert to f32 exactly, so only the order of the sum differs:
				 * bound the error by the sum of the magnitudes of its terms. */
				float mag = 0.0f;
				for (int c = 0; c < sh.cols; c++)
					mag += fabsf(x[(size_t)t * sh.cols + c] * wf[(size_t)r * sh.cols + c]);
				size_t i = (size_t)t * sh.rows + r;
				cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * mag + 1e-6f,
					  "%s n=%d rows=%d cols=%d threads=%d: y[%d][%d] = %g, want %g",
					  dt_name(wt), sh.n, sh.rows, sh.cols, cpu_pool_size(p), t, r,
					  got[i], want[i]);
			}
		free(x);
		free(w);
		free(wf);
		free(want);
		free(got);
	}
}

static void check_matmul_all(void)
{
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16};
	for (int ti = 0; ti < 3; ti++) {
		check_matmul(NULL, types[ti]);
		for (int threads = 2; threads <= 3; threads++) {
			struct cpu_pool *p;
			cr_assert_eq(cpu_pool_create(threads, &p), WK_OK);
			check_matmul(p, types[ti]);
			cpu_pool_destroy(p);
		}
	}
}

Test(kernels, matmul_fast_matches_ref)
{
	check_matmul_all();
}

Test(kernels, matmul_scalar_fallback_matches_ref)
{
	cpu_force_scalar(true);
	check_matmul_all();
	cpu_force_scalar(false);
}

struct attn_shape {
	int n, pos0, n_heads, n_kv, head_dim;
};

static const struct attn_shape attn_shapes[] = {
	{1, 0, 1, 1, 8},   {1, 0, 4, 2, 64},  {7, 0, 4, 2, 64},  {1, 300, 4, 1, 12},
	{7, 250, 6, 3, 20}, {3, 600, 8, 8, 128}, {1, 5, 2, 2, 3},  {2, 130, 4, 2, 200},
};

/* An FP8 cache (rows of head_dim with their scales, cpu_ref_attention's contract): each head
 * row of f32 [len][s8] scaled by a factor of its own (0.5 .. 2), so that every row has its
 * own scales (a scale read from another row is far off), quantized into c / cs and
 * dequantized back into f (what the reference must read the codes as). */
static void fp8_cache(float *f, uint8_t *c, float *cs, int len, int s8, int head_dim)
{
	size_t n = (size_t)len * s8;
	for (size_t r = 0; r < n / (size_t)head_dim; r++)
		for (int d = 0; d < head_dim; d++)
			f[r * head_dim + d] *= 0.5f + (float)(r * 7 % 13) / 8.0f;
	cpu_ref_cast(c, DT_F8_E4M3, f, DT_F32, n, cs, NULL, head_dim);
	cpu_ref_cast(f, DT_F32, c, DT_F8_E4M3, n, NULL, cs, head_dim);
}

/* The fast kernel's out [nq] against the reference's: 1e-5 + 1e-4 of each value. */
static void expect_close(const float *got, const float *want, size_t nq, size_t s,
			 struct cpu_pool *p, const char *what)
{
	for (size_t i = 0; i < nq; i++)
		cr_assert(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i]),
			  "shape %zu threads %d: %s out[%zu] = %g, want %g", s, cpu_pool_size(p),
			  what, i, got[i], want[i]);
}

/* Shape a's cache: k, v of type kv, rows of stride elements (FP8: scales ks, vs). */
static struct cpu_gqa gqa_of(const struct attn_shape *a, const void *k, const void *v,
			     const float *ks, const float *vs, enum dt_type kv, int stride)
{
	return (struct cpu_gqa){.k = k, .v = v, .ks = ks, .vs = vs, .kv = kv,
				.n_heads = a->n_heads, .n_kv = a->n_kv, .head_dim = a->head_dim,
				.kv_stride = stride, .scale = 1.0f / sqrtf((float)a->head_dim)};
}

static void check_attention(struct cpu_pool *p)
{
	rng_state = 12345;
	for (size_t s = 0; s < sizeof attn_shapes / sizeof attn_shapes[0]; s++) {
		struct attn_shape a = attn_shapes[s];
		int kv_stride = a.n_kv * a.head_dim + 3; /* a padded cache row */
		int len = a.pos0 + a.n;
		size_t nq = (size_t)a.n * a.n_heads * a.head_dim;
		float *q = rnd_vec(nq);
		float *k = rnd_vec((size_t)len * kv_stride);
		float *v = rnd_vec((size_t)len * kv_stride);
		for (size_t i = 0; i < nq; i++)
			q[i] *= 3.0f; /* peaky enough that the running max changes between chunks */
		float *want = malloc(nq * sizeof *want), *got = malloc(nq * sizeof *got);
		cr_assert(want && got);
		struct cpu_gqa g = gqa_of(&a, k, v, NULL, NULL, DT_F32, kv_stride);
		cpu_ref_attention(want, q, &g, a.n, a.pos0);
		cpu_attention(p, got, q, &g, a.n, a.pos0);
		expect_close(got, want, nq, s, p, "f32");
		/* a bf16 cache: the reference reads it as the f32 cache of its values would be
		 * read (bit for bit), and the fast kernel agrees with that */
		size_t nk = (size_t)len * kv_stride;
		uint16_t *k16 = malloc(nk * 2), *v16 = malloc(nk * 2);
		cr_assert(k16 && v16);
		cpu_ref_cast(k16, DT_BF16, k, DT_F32, nk, NULL, NULL, 0);
		cpu_ref_cast(v16, DT_BF16, v, DT_F32, nk, NULL, NULL, 0);
		cpu_ref_cast(k, DT_F32, k16, DT_BF16, nk, NULL, NULL, 0);
		cpu_ref_cast(v, DT_F32, v16, DT_BF16, nk, NULL, NULL, 0);
		cpu_ref_attention(want, q, &g, a.n, a.pos0);
		g = gqa_of(&a, k16, v16, NULL, NULL, DT_BF16, kv_stride);
		cpu_ref_attention(got, q, &g, a.n, a.pos0);
		cr_assert_arr_eq(got, want, nq * sizeof *got, "shape %zu: bf16 reference", s);
		cpu_attention(p, got, q, &g, a.n, a.pos0);
		expect_close(got, want, nq, s, p, "bf16");
		free(k16);
		free(v16);
		/* an FP8 cache, rows one kv head wider than the heads: the reference reads it as
		 * the f32 cache of its dequantized values (bit for bit), the fast kernel agrees */
		int s8 = (a.n_kv + 1) * a.head_dim;
		size_t n8 = (size_t)len * s8;
		size_t ns = n8 / a.head_dim * cpu_kv_blocks(a.head_dim) * sizeof(float);
		float *kf = rnd_vec(n8), *vf = rnd_vec(n8), *ks = malloc(ns), *vs = malloc(ns);
		uint8_t *k8 = malloc(n8), *v8 = malloc(n8);
		cr_assert(ks && vs && k8 && v8);
		fp8_cache(kf, k8, ks, len, s8, a.head_dim);
		fp8_cache(vf, v8, vs, len, s8, a.head_dim);
		g = gqa_of(&a, kf, vf, NULL, NULL, DT_F32, s8);
		cpu_ref_attention(want, q, &g, a.n, a.pos0);
		g = gqa_of(&a, k8, v8, ks, vs, DT_F8_E4M3, s8);
		cpu_ref_attention(got, q, &g, a.n, a.pos0);
		cr_assert_arr_eq(got, want, nq * sizeof *got, "shape %zu: fp8 reference", s);
		cpu_attention(p, got, q, &g, a.n, a.pos0);
		expect_close(got, want, nq, s, p, "fp8");
		free(kf);
		free(vf);
		free(ks);
		free(vs);
		free(k8);
		free(v8);
		free(q);
		free(k);
		free(v);
		free(want);
		free(got);
	}
}

static void check_attention_all(void)
{
	check_attention(NULL);
	struct cpu_pool *p;
	cr_assert_eq(cpu_pool_create(3, &p), WK_OK);
	check_attention(p);
	cpu_pool_destroy(p);
}

Test(kernels, attention_fast_matches_ref)
{
	check_attention_all();
}

Test(kernels, attention_scalar_fallback_matches_ref)
{
	cpu_force_scalar(true);
	check_attention_all();
	cpu_force_scalar(false);
}

/* Tokens of several sequences in one call (struct cpu_gqa's seq and pos), each sequence's
 * rows SQ_ROWS apart, in no particular order, some at position 0, some past a chunk of keys:
 * the reference gives each token bit for bit what a call of its own sequence alone gives it,
 * and the fast kernel (pooled and not, SIMD and scalar) agrees with the reference, on f32,
 * bf16 and FP8 caches. */
#define SQ_ROWS 300
Test(kernels, attention_over_several_sequences)
{
	enum { N = 7, SEQS = 3 };
	static const int seq[N] = {2, 0, 0, 1, 2, 2, 0}, pos[N] = {5, 0, 1, 270, 6, 7, 2};
	const struct attn_shape a = {N, 0, 6, 2, 20};
	rng_state = 777;
	int stride = (a.n_kv + 1) * a.head_dim; /* FP8's rows of head_dim; a spare kv head */
	size_t hr = (size_t)(a.n_kv + 1); /* FP8's rows a position */
	size_t nq = (size_t)N * a.n_heads * a.head_dim, row = (size_t)a.n_heads * a.head_dim;
	size_t nk = (size_t)SEQS * SQ_ROWS * stride;
	size_t ns = nk / a.head_dim * cpu_kv_blocks(a.head_dim);
	float *q = rnd_vec(nq), *k = rnd_vec(nk), *v = rnd_vec(nk), *ks = malloc(ns * 4);
	float *vs = malloc(ns * 4), *want = malloc(nq * 4), *got = malloc(nq * 4);
	float *one = malloc(row * 4);
	uint16_t *k16 = malloc(nk * 2), *v16 = malloc(nk * 2);
	uint8_t *k8 = malloc(nk), *v8 = malloc(nk);
	struct cpu_pool *p;
	cr_assert(ks && vs && want && got && one && k16 && v16 && k8 && v8);
	cr_assert_eq(cpu_pool_create(3, &p), WK_OK);
	for (size_t i = 0; i < nq; i++)
		q[i] *= 3.0f;
	cpu_ref_cast(k16, DT_BF16, k, DT_F32, nk, NULL, NULL, 0);
	cpu_ref_cast(v16, DT_BF16, v, DT_F32, nk, NULL, NULL, 0);
	fp8_cache(k, k8, ks, SEQS * SQ_ROWS, stride, a.head_dim);
	fp8_cache(v, v8, vs, SEQS * SQ_ROWS, stride, a.head_dim);
	const void *kc[3] = {k, k16, k8}, *vc[3] = {v, v16, v8};
	const enum dt_type types[3] = {DT_F32, DT_BF16, DT_F8_E4M3};
	for (int c = 0; c < 3; c++) {
		bool f8 = types[c] == DT_F8_E4M3;
		struct cpu_gqa g = gqa_of(&a, kc[c], vc[c], f8 ? ks : NULL, f8 ? vs : NULL, types[c],
					  stride);
		g.seq = seq;
		g.pos = pos;
		g.seq_rows = SQ_ROWS;
		g.keys_max = 271;
		cpu_ref_attention(want, q, &g, N, 0);
		for (int i = 0; i < N; i++) { /* token i alone, over its own sequence's rows */
			size_t r0 = (size_t)seq[i] * SQ_ROWS, es = dt_size(types[c]);
			struct cpu_gqa o = gqa_of(&a, (const char *)kc[c] + r0 * stride * es,
						  (const char *)vc[c] + r0 * stride * es,
						  f8 ? cpu_kv_scales(ks, r0 * hr, a.head_dim) : NULL,
						  f8 ? cpu_kv_scales(vs, r0 * hr, a.head_dim) : NULL,
						  types[c], stride);
			cpu_ref_attention(one, q + i * row, &o, 1, pos[i]);
			cr_assert_arr_eq(one, want + i * row, row * 4, "%s: token %d",
					 dt_name(types[c]), i);
		}
		for (int scalar = 0; scalar < 2; scalar++) {
			cpu_force_scalar(scalar);
			cpu_attention(NULL, got, q, &g, N, 0);
			expect_close(got, want, nq, (size_t)c, NULL, "several sequences");
			cpu_attention(p, got, q, &g, N, 0);
			expect_close(got, want, nq, (size_t)c, p, "several sequences");
			cpu_force_scalar(false);
		}
	}
	cpu_pool_destroy(p);
	free(q), free(k), free(v), free(ks), free(vs), free(want), free(got), free(one);
	free(k16), free(v16), free(k8), free(v8);
}

/* ---- bandwidth ----------------------------------------------------------------------------- */

Test(kernels, read_bandwidth_is_positive)
{
	struct cpu_pool *p;
	cr_assert_eq(cpu_pool_create(2, &p), WK_OK);
	double gbps = cpu_read_bandwidth(p, 16u << 20, 0.05);
	cr_assert(gbps > 0.1 && gbps < 10000, "%g GB/s", gbps);
	cpu_force_scalar(true);
	gbps = cpu_read_bandwidth(NULL, 1u << 20, 0.02);
	cpu_force_scalar(false);
	cr_assert(gbps > 0.1 && gbps < 10000, "%g GB/s", gbps);
	cpu_pool_destroy(p);
}

/* The CPU backend's norm_n as GLM-4.5's attention uses it (struct be_norm's add, heads,
 * half, bare): q biased per head (each token's row of the bias, head h its slice),
 * rmsnormed per head and rotated half-split at its token's position; v biased only, into
 * another y. Bit for bit the same steps written out here one by one. */
Test(kernels, norm_n_bias_heads_matches_the_steps)
{
	enum { T = 3, H = 4, HD = 8, ROT = 4, W = H * HD };
	int pos[T] = {0, 5, 300};
	rng_state = 0x9e3779b97f4a7c15ull;
	float *x = rnd_vec(T * W), *b = rnd_vec(W), *w = rnd_vec(HD), *v = rnd_vec(T * W);
	float q[T * W], want[T * W], vy[T * W], vwant[T * W];
	memcpy(q, x, sizeof q);
	for (int t = 0; t < T; t++)
		for (int i = 0; i < W; i++) {
			want[t * W + i] = x[t * W + i] + b[i];
			vwant[t * W + i] = v[t * W + i] + b[i];
		}
	cpu_ref_rmsnorm(want, want, w, T * H, HD, 1e-5f);
	cpu_ref_rope(want, T, pos, H, HD, ROT, 10000.0f, false);
	struct be_norm r[2] = {
		{.y = q, .x = q, .w = w, .n = T * H, .dim = HD, .eps = 1e-5f, .rope_pos = pos,
		 .rope_dim = ROT, .theta = 10000.0f, .add = b, .heads = H, .half = true},
		{.y = vy, .x = v, .n = T * H, .dim = HD, .add = b, .heads = H, .bare = true}};
	be_cpu.norm_n(NULL, r, 2);
	cr_expect_eq(memcmp(q, want, sizeof q), 0, "q: biased, normed and rotated differs");
	cr_expect_eq(memcmp(vy, vwant, sizeof vy), 0, "v: biased differs");
	free(x);
	free(b);
	free(w);
	free(v);
}
