/*
 * cuda_test.c - the CUDA kernels' tests' shared helpers (cuda_test.h): random inputs, device
 * copies, caches in bf16 and FP8, random weights and one rank's MoE experts.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

static uint64_t rng = 0x2545f4914f6cdd1dull;

float rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

float *rnd_vec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rnd();
	return v;
}

void *to_dev(const void *host, size_t bytes)
{
	void *d;
	cr_assert_eq(wk_cuda_alloc(&d, bytes, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_upload(d, host, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

void *to_dev_off(const void *host, size_t bytes, int off)
{
	char *d;
	cr_assert_eq(wk_cuda_alloc((void **)&d, bytes + (size_t)off, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(wk_cuda_upload(d + off, host, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

void from_dev(void *host, const void *dev, size_t bytes)
{
	cr_assert_eq(wk_cuda_sync(err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_download(host, dev, bytes, err, sizeof err), WK_OK, "%s", err);
}

double rel(const float *got, const float *want, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(isfinite(got[i]), "element %zu is %g", i, got[i]);
		d = fmax(d, fabs((double)got[i] - want[i]));
		m = fmax(m, fabs((double)want[i]));
	}
	return m > 0 ? d / m : d;
}

uint16_t *to_bf16(const float *x, size_t n)
{
	uint16_t *h = malloc(n * sizeof *h);
	cr_assert_not_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = dt_f32_to_bf16(x[i]);
	return h;
}

const void *kv_host(const float *x, size_t n, enum dt_type kv, void **own)
{
	*own = kv == DT_BF16 ? to_bf16(x, n) : NULL;
	return *own ? *own : x;
}

uint8_t *to_fp8(const float *x, size_t rows, int w, float **scales)
{
	uint8_t *c = malloc(rows * (size_t)w);
	*scales = malloc(rows * (size_t)cpu_kv_blocks(w) * sizeof(float));
	cr_assert(c && *scales);
	cpu_ref_cast(c, DT_F8_E4M3, x, DT_F32, rows * (size_t)w, *scales, NULL, w);
	return c;
}

void *dev_alloc(size_t bytes)
{
	void *d;
	cr_assert_eq(wk_cuda_alloc(&d, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

float *fill_vec(size_t n, float v)
{
	float *x = malloc(n * sizeof *x);
	cr_assert_not_null(x);
	for (size_t i = 0; i < n; i++)
		x[i] = v;
	return x;
}

int rnd_int(int n)
{
	int r = (int)((rnd() + 1.0f) * 0.5f * (float)n);
	return r < n ? r : n - 1;
}

void *rnd_weight(enum dt_type t, int rows, int cols, float **scale)
{
	size_t nw = (size_t)rows * cols;
	char *w = malloc(nw * dt_size(t));
	cr_assert_not_null(w);
	*scale = NULL;
	for (size_t i = 0; i < nw; i++) {
		float f = rnd();
		uint16_t h;
		switch (t) {
		case DT_F32: memcpy(w + i * 4, &f, 4); break;
		case DT_BF16:
			h = dt_f32_to_bf16(f);
			memcpy(w + i * 2, &h, 2);
			break;
		case DT_F16:
			h = dt_f32_to_f16(f);
			memcpy(w + i * 2, &h, 2);
			break;
		default: ((uint8_t *)w)[i] = dt_f32_to_e4m3(f * 400.0f); break;
		}
	}
	if (t == DT_F8_E4M3) {
		size_t ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
		*scale = rnd_vec(ns);
		for (size_t i = 0; i < ns; i++)
			(*scale)[i] = (*scale)[i] / 400.0f + 1.0f / 256.0f; /* distinct per block */
	}
	return w;
}

void rnd_sel(int *sel, int *nsel, int n, int pos0, int topk)
{
	for (int i = 0; i < n; i++) {
		int len = pos0 + i + 1, want = rnd_int(topk < len ? topk : len) + 1, got = 0;
		for (int t = 0; t < len && got < want; t++) /* each position with odds want/len */
			if (rnd_int(len) < want || len - t == want - got)
				sel[i * topk + got++] = t;
		nsel[i] = got;
	}
}

void poison_parts(float *dev, size_t n)
{
	float *x = fill_vec(n, NAN);
	cr_assert_eq(wk_cuda_upload(dev, x, n * 4, err, sizeof err), WK_OK, "%s", err);
	free(x);
}

size_t parts_written(const float *dev, size_t n)
{
	float *x = malloc(n * 4);
	size_t w = 0;
	cr_assert(x);
	from_dev(x, dev, n * 4);
	for (size_t i = 0; i < n; i++)
		w += !isnan(x[i]);
	free(x);
	return w;
}

void moe_set_make(struct moe_set *m, enum dt_type t, int n_local, int dim, int inter)
{
	m->n_local = n_local;
	m->host = calloc((size_t)n_local, sizeof *m->host);
	m->dev = calloc((size_t)n_local, sizeof *m->dev);
	cr_assert(m->host && m->dev);
	int rows[3] = {inter, inter, dim}, cols[3] = {dim, dim, inter}; /* gate, up, down */
	for (int e = 0; e < n_local; e++) {
		const void **hw[3] = {&m->host[e].gate, &m->host[e].up, &m->host[e].down};
		const float **hs[3] = {&m->host[e].gate_s, &m->host[e].up_s, &m->host[e].down_s};
		const void **dw[3] = {&m->dev[e].gate, &m->dev[e].up, &m->dev[e].down};
		const float **ds[3] = {&m->dev[e].gate_s, &m->dev[e].up_s, &m->dev[e].down_s};
		for (int k = 0; k < 3; k++) {
			float *s;
			void *w = rnd_weight(t, rows[k], cols[k], &s);
			size_t ns = (size_t)((rows[k] + 127) / 128) * ((cols[k] + 127) / 128);
			*hw[k] = w;
			*hs[k] = s;
			*dw[k] = to_dev(w, (size_t)rows[k] * cols[k] * dt_size(t));
			*ds[k] = s ? to_dev(s, ns * 4) : NULL;
		}
	}
	m->tab = to_dev(m->dev, (size_t)n_local * sizeof *m->dev);
}

void moe_set_free(struct moe_set *m)
{
	for (int e = 0; e < m->n_local; e++) {
		const struct cpu_expert *h = &m->host[e], *d = &m->dev[e];
		free((void *)h->gate), free((void *)h->up), free((void *)h->down);
		free((void *)h->gate_s), free((void *)h->up_s), free((void *)h->down_s);
		wk_cuda_free((void *)d->gate), wk_cuda_free((void *)d->up);
		wk_cuda_free((void *)d->down), wk_cuda_free((void *)d->gate_s);
		wk_cuda_free((void *)d->up_s), wk_cuda_free((void *)d->down_s);
	}
	wk_cuda_free(m->tab);
	free(m->host);
	free(m->dev);
}

struct wk_moe moe_of(const struct moe_set *m, enum dt_type t, int ex0, int dim, int inter)
{
	return (struct wk_moe){.experts = m->tab, .ex0 = ex0, .n_local = m->n_local, .wdt = t,
			       .dim = dim, .inter = inter};
}
