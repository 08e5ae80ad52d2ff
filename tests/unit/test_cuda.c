/*
 * test_cuda.c - every CUDA kernel (kernels/cuda/cuda_kernels.h) against its CPU reference
 * (kernels/cpu/cpu.h) on the same random inputs: only the order of the sums differs, so the
 * results must agree within 1e-4 of the largest output (the bound is 1e-3). Where no
 * GPU is visible (this machine, or a build without CUDA) each test is skipped with a message;
 * scripts/gpu-check runs them on a GPU machine.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"

#define TOL 1e-4

static char err[WK_ERRSZ];

#define NEED_GPU()                                                                          \
	do {                                                                                \
		if (cuda_device_count() <= 0)                                               \
			cr_skip_test("no CUDA device visible (or a build without CUDA): the " \
				     "kernels are compared on a GPU by scripts/gpu-check");   \
	} while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void) /* uniform in [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rnd_vec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rnd();
	return v;
}

static void *to_dev(const void *host, size_t bytes)
{
	void *d;
	cr_assert_eq(wk_cuda_alloc(&d, bytes, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_upload(d, host, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

/* Waits for the kernels, then copies bytes from the device. */
static void from_dev(void *host, const void *dev, size_t bytes)
{
	cr_assert_eq(wk_cuda_sync(err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_download(host, dev, bytes, err, sizeof err), WK_OK, "%s", err);
}

/* max |got - want| / max |want| */
static double rel(const float *got, const float *want, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(isfinite(got[i]), "element %zu is %g", i, got[i]);
		d = fmax(d, fabs((double)got[i] - want[i]));
		m = fmax(m, fabs((double)want[i]));
	}
	return m > 0 ? d / m : d;
}

TestSuite(cuda_kernels);

Test(cuda_kernels, matmul_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 100}, {3, 130, 257}, {8, 256, 2048}, {2, 5, 7}};
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16};
	for (size_t ti = 0; ti < 3; ti++)
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
			int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
			size_t nw = (size_t)rows * cols, esz = dt_size(types[ti]);
			float *x = rnd_vec((size_t)n * cols), *wf = rnd_vec(nw);
			char *w = malloc(nw * esz);
			for (size_t i = 0; i < nw; i++) {
				if (types[ti] == DT_F32)
					memcpy(w + i * 4, &wf[i], 4);
				else {
					uint16_t h = types[ti] == DT_BF16 ? dt_f32_to_bf16(wf[i])
									  : dt_f32_to_f16(wf[i]);
					memcpy(w + i * 2, &h, 2);
				}
			}
			float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
			cpu_ref_matmul(want, x, w, types[ti], n, rows, cols);
			float *dx = to_dev(x, (size_t)n * cols * 4), *dy;
			void *dw = to_dev(w, nw * esz);
			cr_assert_eq(wk_cuda_alloc((void **)&dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
			cr_assert_eq(wk_cuda_matmul(dy, dx, dw, types[ti], n, rows, cols, err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dy, (size_t)n * rows * 4);
			double r = rel(got, want, (size_t)n * rows);
			cr_expect_leq(r, TOL, "%s n=%d rows=%d cols=%d: %g", dt_name(types[ti]), n, rows,
				      cols, r);
			wk_cuda_free(dx);
			wk_cuda_free(dw);
			wk_cuda_free(dy);
			free(x);
			free(wf);
			free(w);
			free(want);
			free(got);
		}
}

Test(cuda_kernels, matmul_fp8_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 200, 300}, {4, 256, 512}, {2, 130, 129}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
		int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
		size_t nw = (size_t)rows * cols;
		uint8_t *w = malloc(nw);
		for (size_t i = 0; i < nw; i++)
			w[i] = dt_f32_to_e4m3(rnd() * 400.0f);
		float *x = rnd_vec((size_t)n * cols), *scale = rnd_vec((size_t)sr * sc);
		float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
		cpu_ref_matmul_fp8(want, x, w, scale, n, rows, cols);
		float *dx = to_dev(x, (size_t)n * cols * 4), *ds = to_dev(scale, (size_t)sr * sc * 4), *dy;
		uint8_t *dw = to_dev(w, nw);
		cr_assert_eq(wk_cuda_alloc((void **)&dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_matmul_fp8(dy, dx, dw, ds, n, rows, cols, err, sizeof err), WK_OK,
			     "%s", err);
		from_dev(got, dy, (size_t)n * rows * 4);
		double r = rel(got, want, (size_t)n * rows);
		cr_expect_leq(r, TOL, "fp8 n=%d rows=%d cols=%d: %g", n, rows, cols, r);
		wk_cuda_free(dx);
		wk_cuda_free(ds);
		wk_cuda_free(dw);
		wk_cuda_free(dy);
		free(w);
		free(x);
		free(scale);
		free(want);
		free(got);
	}
}

Test(cuda_kernels, rmsnorm_silu_add_match_ref)
{
	NEED_GPU();
	int n = 5, dim = 1000;
	size_t N = (size_t)n * dim;
	float *x = rnd_vec(N), *w = rnd_vec(dim), *u = rnd_vec(N);
	float *want = malloc(N * 4), *got = malloc(N * 4);
	float *dx = to_dev(x, N * 4), *dw = to_dev(w, dim * 4), *du = to_dev(u, N * 4);
	/* rmsnorm in place, as the engine calls it */
	cpu_ref_rmsnorm(want, x, w, n, dim, 1e-5f);
	cr_assert_eq(wk_cuda_rmsnorm(dx, dx, dw, n, dim, 1e-5f, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "rmsnorm");
	/* silu_mul on the normalised rows */
	memcpy(x, want, N * 4);
	cpu_ref_silu_mul(want, u, N);
	cr_assert_eq(wk_cuda_silu_mul(dx, du, N, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "silu_mul");
	/* add: y += x */
	for (size_t i = 0; i < N; i++)
		want[i] += u[i];
	cr_assert_eq(wk_cuda_add(dx, du, N, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "add");
	wk_cuda_free(dx);
	wk_cuda_free(dw);
	wk_cuda_free(du);
	free(x);
	free(w);
	free(u);
	free(want);
	free(got);
}

Test(cuda_kernels, rope_matches_ref)
{
	NEED_GPU();
	int n = 6, heads = 4, hd = 64, pos[6] = {0, 1, 7, 100, 2047, 5};
	int *dpos = to_dev(pos, sizeof pos);
	for (int mode = 0; mode < 4; mode++) {
		bool inter = mode & 1;
		int rot = mode & 2 ? hd / 2 : hd; /* partial rotation too (GLM-4.5) */
		size_t N = (size_t)n * heads * hd;
		float *x = rnd_vec(N), *got = malloc(N * 4);
		float *dx = to_dev(x, N * 4);
		cpu_ref_rope(x, n, pos, heads, hd, rot, 10000.0f, inter);
		cr_assert_eq(wk_cuda_rope(dx, n, dpos, heads, hd, rot, 10000.0f, inter, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dx, N * 4);
		double r = rel(got, x, N);
		cr_expect_leq(r, TOL, "rope interleaved=%d rot=%d: %g", inter, rot, r);
		wk_cuda_free(dx);
		free(x);
		free(got);
	}
	wk_cuda_free(dpos);
}

Test(cuda_kernels, attention_matches_ref)
{
	NEED_GPU();
	/* decode (n = 1 at pos0 300), a prefill (n = 7 from 0), a chunk (n = 4 at 9); GQA 8:2,
	 * a kv_stride wider than the kv heads (rows of a larger cache) */
	static const int cases[][2] = {{1, 300}, {7, 0}, {4, 9}};
	int heads = 8, kvh = 2, hd = 64, stride = kvh * hd + 16;
	for (size_t c = 0; c < 3; c++) {
		int n = cases[c][0], pos0 = cases[c][1], len = pos0 + n;
		size_t nq = (size_t)n * heads * hd, nk = (size_t)len * stride;
		float *q = rnd_vec(nq), *k = rnd_vec(nk), *v = rnd_vec(nk);
		float *want = malloc(nq * 4), *got = malloc(nq * 4);
		float scale = 1.0f / sqrtf((float)hd);
		cpu_ref_attention(want, q, k, v, n, pos0, heads, kvh, hd, stride, scale);
		float *dq = to_dev(q, nq * 4), *dk = to_dev(k, nk * 4), *dv = to_dev(v, nk * 4), *dout;
		cr_assert_eq(wk_cuda_alloc((void **)&dout, nq * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_attention(dout, dq, dk, dv, n, pos0, heads, kvh, hd, stride, scale,
					       err, sizeof err), WK_OK, "%s", err);
		from_dev(got, dout, nq * 4);
		double r = rel(got, want, nq);
		cr_expect_leq(r, TOL, "attention n=%d pos0=%d: %g", n, pos0, r);
		wk_cuda_free(dq);
		wk_cuda_free(dk);
		wk_cuda_free(dv);
		wk_cuda_free(dout);
		free(q);
		free(k);
		free(v);
		free(want);
		free(got);
	}
	float dummy;
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &dummy, &dummy, 1, WK_CUDA_ATTN_MAX, 1, 1, 1,
				       1, 1.0f, err, sizeof err), WK_EUNSUPPORTED,
		     "past the kernel's context the call is refused before any launch");
}

Test(cuda_kernels, argmax_matches_samp_argmax)
{
	NEED_GPU();
	int n = 3, vocab = 50000;
	float *lg = rnd_vec((size_t)n * vocab);
	lg[1 * vocab + 777] = 5.0f; /* a tie: the lower index wins, as samp_argmax */
	lg[1 * vocab + 40000] = 5.0f;
	lg[2 * vocab + vocab - 1] = 9.0f;
	float *dl = to_dev(lg, (size_t)n * vocab * 4);
	int *di, got[3];
	cr_assert_eq(wk_cuda_alloc((void **)&di, sizeof got, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_argmax(di, dl, n, vocab, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, di, sizeof got);
	for (int i = 0; i < n; i++)
		cr_expect_eq(got[i], samp_argmax(lg + (size_t)i * vocab, vocab), "row %d", i);
	wk_cuda_free(dl);
	wk_cuda_free(di);
	free(lg);
}

/* Without a GPU the calls must fail cleanly, never crash: a build without CUDA refuses them,
 * a CUDA build with no device reports the CUDA error. */
Test(cuda_kernels, without_a_gpu_calls_fail_cleanly)
{
	if (cuda_device_count() > 0)
		cr_skip_test("a GPU is visible");
	void *p = (void *)1;
	cr_expect_neq(wk_cuda_alloc(&p, 64, err, sizeof err), WK_OK);
	cr_expect_null(p);
	cr_expect(err[0] != 0, "no message");
	cr_expect_neq(wk_cuda_sync(err, sizeof err), WK_OK);
}
