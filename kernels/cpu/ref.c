/*
 * ref.c - the reference CPU kernels: scalar, single-threaded, written to be read.
 *
 * These define what each op computes (see cpu.h for shapes). Fast versions elsewhere are
 * tested against them; keep them plain. Accumulation is in float, as the fast kernels and
 * PyTorch's f32 path do, except where noted.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static float weight_at(const void *w, enum dt_type wt, size_t i)
{
	switch (wt) {
	case DT_F32: return ((const float *)w)[i];
	case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)w)[i]);
	case DT_F16: return dt_f16_to_f32(((const uint16_t *)w)[i]);
	default: return NAN; /* callers only pass the three types above */
	}
}

void cpu_ref_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		    int cols)
{
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		for (int r = 0; r < rows; r++) {
			float acc = 0.0f;
			for (int c = 0; c < cols; c++)
				acc += xt[c] * weight_at(w, wt, (size_t)r * cols + c);
			y[(size_t)t * rows + r] = acc;
		}
	}
}

void cpu_ref_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
{
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * dim;
		float *yt = y + (size_t)t * dim;
		float ss = 0.0f;
		for (int i = 0; i < dim; i++)
			ss += xt[i] * xt[i];
		float inv = 1.0f / sqrtf(ss / (float)dim + eps);
		for (int i = 0; i < dim; i++)
			yt[i] = xt[i] * inv * w[i];
	}
}

/* The frequencies are computed as Hugging Face does, in float: inv_freq = 1 / theta^(2j/rot),
 * angle = (float)pos * inv_freq; so positions far into the context round the same way. */
void cpu_ref_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		  float theta, bool interleaved)
{
	int half = rot_dim / 2;
	for (int t = 0; t < n; t++) {
		for (int h = 0; h < n_heads; h++) {
			float *v = x + ((size_t)t * n_heads + h) * head_dim;
			for (int j = 0; j < half; j++) {
				float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)rot_dim);
				float angle = (float)pos[t] * inv_freq;
				float c = cosf(angle), s = sinf(angle);
				int i0 = interleaved ? 2 * j : j;
				int i1 = interleaved ? 2 * j + 1 : j + half;
				float a = v[i0], b = v[i1];
				v[i0] = a * c - b * s;
				v[i1] = b * c + a * s;
			}
		}
	}
}

void cpu_ref_softmax(float *x, int n)
{
	if (n <= 0)
		return;
	float max = x[0];
	for (int i = 1; i < n; i++)
		if (x[i] > max)
			max = x[i];
	float sum = 0.0f;
	for (int i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	for (int i = 0; i < n; i++)
		x[i] /= sum;
}

/* Rows of w f32 into e4m3 codes and their scales, cpu_ref_act_quant's blocks. */
static void quant_rows(uint8_t *dst, float *ds, const float *src, size_t n, int w)
{
	for (size_t r = 0; r < n / (size_t)w; r++)
		for (int c0 = 0, b = 0; c0 < w; c0 += CPU_FP8_BLOCK, b++) {
			const float *x = src + r * (size_t)w + (size_t)c0;
			uint8_t *y = dst + r * (size_t)w + (size_t)c0;
			int m = w - c0 < CPU_FP8_BLOCK ? w - c0 : CPU_FP8_BLOCK;
			float s = cpu_act_scale(x, m);
			ds[r * (size_t)cpu_kv_blocks(w) + (size_t)b] = s;
			for (int c = 0; c < m; c++)
				y[c] = dt_f32_to_e4m3(x[c] / s);
		}
}

void cpu_ref_cast(void *dst, enum dt_type dt, const void *src, enum dt_type st, size_t n,
		  float *ds, const float *ss, int w)
{
	if (dt == DT_F8_E4M3) {
		quant_rows(dst, ds, src, n, w);
		return;
	}
	if (st == DT_F8_E4M3) {
		for (size_t r = 0; r < n / (size_t)w; r++)
			for (int c = 0; c < w; c++)
				((float *)dst)[r * (size_t)w + (size_t)c] = cpu_kv_rc(src, st, ss, w, r, c);
		return;
	}
	if (dt == st) {
		memcpy(dst, src, n * dt_size(dt));
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (dt == DT_BF16)
			((uint16_t *)dst)[i] = dt_f32_to_bf16(((const float *)src)[i]);
		else
			((float *)dst)[i] = cpu_kv_at(src, st, i);
}

/* Attention: two passes over the cache, so that no score buffer is needed: the first finds
 * the largest score, the second sums exp(score - max) and the weighted values into the
 * output row. */

/* Element d of the head_dim-wide GQA cache row that starts at element at (FP8: its scales
 * in s, cpu_ref_attention's rows of head_dim) */
static float gqa_el(const void *c, enum dt_type t, const float *s, size_t at, int head_dim,
		    int d)
{
	if (t == DT_F8_E4M3)
		return cpu_kv_rc(c, t, s, head_dim, at / (size_t)head_dim, d);
	return cpu_kv_at(c, t, at + (size_t)d);
}

static float gqa_dot(const float *q, const void *c, enum dt_type t, const float *s, size_t at,
		     int head_dim)
{
	float acc = 0.0f;
	for (int d = 0; d < head_dim; d++)
		acc += q[d] * gqa_el(c, t, s, at, head_dim, d);
	return acc;
}

void cpu_ref_attention(float *out, const float *q, const struct cpu_gqa *s, int n, int pos0)
{
	int group = s->n_heads / s->n_kv, hd = s->head_dim;
	for (int i = 0; i < n; i++) {
		int len = cpu_gqa_len(s, i, pos0);
		size_t base = cpu_gqa_base(s, i);
		for (int h = 0; h < s->n_heads; h++) {
			const float *qh = q + ((size_t)i * s->n_heads + h) * hd;
			float *oh = out + ((size_t)i * s->n_heads + h) * hd;
			size_t koff = (size_t)(h / group) * hd;

			float max = -INFINITY;
			for (int t = 0; t < len; t++) {
				size_t kt = (base + (size_t)t) * s->kv_stride + koff;
				float sc = gqa_dot(qh, s->k, s->kv, s->ks, kt, hd) * s->scale;
				if (sc > max)
					max = sc;
			}
			for (int d = 0; d < hd; d++)
				oh[d] = 0.0f;
			float sum = 0.0f;
			for (int t = 0; t < len; t++) {
				size_t kt = (base + (size_t)t) * s->kv_stride + koff;
				float sc = gqa_dot(qh, s->k, s->kv, s->ks, kt, hd) * s->scale;
				float p = expf(sc - max);
				sum += p;
				for (int d = 0; d < hd; d++)
					oh[d] += p * gqa_el(s->v, s->kv, s->vs, kt, hd, d);
			}
			for (int d = 0; d < hd; d++)
				oh[d] /= sum;
		}
	}
}

void cpu_ref_silu_mul(float *g, const float *u, size_t n)
{
	for (size_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
