/*
 * glm_ref.c - reference kernels for the GLM families: LayerNorm, the sigmoid noaux_tc MoE
 * router, row gather/scatter for expert batches, MLA (multi-head latent attention) with the
 * kv_b_proj absorption, and the DSA lightning indexer's exact top-k.
 *
 * Scalar and written to be read, like ref.c; the contracts are in cpu.h. Weights passed as
 * (w, wt, scale) may be F32, BF16, F16 or FP8 E4M3 with 128x128 block scales; they are
 * dequantized one element at a time, never copied.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/glm_kernels.h"

void cpu_glm_row_f32(float *dst, const void *w, enum dt_type wt, const float *scale, int cols,
		     size_t r, int c0, int c1)
{
	size_t at = r * (size_t)cols;
	switch (wt) {
	case DT_F32:
		memcpy(dst, (const float *)w + at + c0, (size_t)(c1 - c0) * sizeof(float));
		return;
	case DT_BF16:
		for (int c = c0; c < c1; c++)
			dst[c - c0] = dt_bf16_to_f32(((const uint16_t *)w)[at + c]);
		return;
	case DT_F16:
		for (int c = c0; c < c1; c++)
			dst[c - c0] = dt_f16_to_f32(((const uint16_t *)w)[at + c]);
		return;
	case DT_F8_E4M3: {
		const float *srow = scale + (r / 128) * (((size_t)cols + 127) / 128);
		const uint8_t *b = (const uint8_t *)w + at;
		for (int c = c0; c < c1; c++)
			dst[c - c0] = dt_e4m3_table[b[c]] * srow[c / 128];
		return;
	}
	default:
		for (int c = c0; c < c1; c++)
			dst[c - c0] = NAN;
	}
}

void cpu_ref_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim,
		       float eps)
{
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * dim;
		float *yt = y + (size_t)t * dim;
		float mean = 0.0f, var = 0.0f;
		for (int i = 0; i < dim; i++)
			mean += xt[i];
		mean /= (float)dim;
		for (int i = 0; i < dim; i++)
			var += (xt[i] - mean) * (xt[i] - mean);
		var /= (float)dim;
		float inv = 1.0f / sqrtf(var + eps);
		for (int i = 0; i < dim; i++)
			yt[i] = (xt[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
	}
}

/* ---- MoE router --------------------------------------------------------------------------- */

/* Index of the largest v[i] among i < n with ok[i], lower index on ties; -1 when none. */
static int argmax_ok(const float *v, const unsigned char *ok, int n)
{
	int best = -1;
	for (int i = 0; i < n; i++)
		if (ok[i] && (best < 0 || v[i] > v[best]))
			best = i;
	return best;
}

void cpu_ref_moe_route(int *idx, float *wt, const float *logits, const float *bias, int n,
		       int n_experts, int top_k, int n_group, int topk_group, bool norm,
		       float scale)
{
	float s[CPU_MOE_MAX_EXPERTS], choice[CPU_MOE_MAX_EXPERTS], gscore[CPU_MOE_MAX_EXPERTS];
	unsigned char ok[CPU_MOE_MAX_EXPERTS], gok[CPU_MOE_MAX_EXPERTS];
	int gsize = n_experts / n_group;
	for (int t = 0; t < n; t++) {
		const float *lt = logits + (size_t)t * n_experts;
		for (int e = 0; e < n_experts; e++) {
			s[e] = 1.0f / (1.0f + expf(-lt[e]));
			choice[e] = s[e] + (bias ? bias[e] : 0.0f);
			ok[e] = 1;
		}
		if (n_group > 1) {
			/* A group scores the sum of its two best biased scores; keep topk_group
			 * groups, then pick experts only inside them. */
			for (int g = 0; g < n_group; g++) {
				const float *c = choice + (size_t)g * gsize;
				int a = argmax_ok(c, ok + (size_t)g * gsize, gsize);
				float sum = c[a];
				if (gsize > 1) {
					ok[g * gsize + a] = 0;
					sum += c[argmax_ok(c, ok + (size_t)g * gsize, gsize)];
					ok[g * gsize + a] = 1;
				}
				gscore[g] = sum;
				gok[g] = 1;
			}
			unsigned char keep[CPU_MOE_MAX_EXPERTS];
			memset(keep, 0, (size_t)n_group);
			for (int k = 0; k < topk_group; k++) {
				int g = argmax_ok(gscore, gok, n_group);
				keep[g] = 1;
				gok[g] = 0;
			}
			for (int e = 0; e < n_experts; e++)
				ok[e] = keep[e / gsize];
		}
		int *it = idx + (size_t)t * top_k;
		float *wv = wt + (size_t)t * top_k;
		float sum = 0.0f;
		for (int k = 0; k < top_k; k++) {
			int e = argmax_ok(choice, ok, n_experts);
			ok[e] = 0;
			it[k] = e;
			wv[k] = s[e]; /* the unbiased score: the bias only chooses */
			sum += s[e];
		}
		for (int k = 0; k < top_k; k++)
			wv[k] = (norm ? wv[k] / (sum + 1e-20f) : wv[k]) * scale;
	}
}

/* w [rows][cols] . x, one row of output per weight row: the matmul references for one token */
static void mv(float *y, const float *x, const void *w, const float *scale, enum dt_type wdt,
	       int rows, int cols)
{
	if (wdt == DT_F8_E4M3)
		cpu_ref_matmul_fp8(y, x, w, scale, 1, rows, cols);
	else
		cpu_ref_matmul(y, x, w, wdt, 1, rows, cols);
}

/* z [dim] = down(silu(gate . x) * up . x) for one token; g, u: inter floats of scratch */
static void expert_mv(float *z, const float *x, const struct cpu_expert *ex, enum dt_type wdt,
		      int dim, int inter, float *g, float *u)
{
	mv(g, x, ex->gate, ex->gate_s, wdt, inter, dim);
	mv(u, x, ex->up, ex->up_s, wdt, inter, dim);
	cpu_ref_silu_mul(g, u, (size_t)inter);
	mv(z, g, ex->down, ex->down_s, wdt, dim, inter);
}

void cpu_ref_moe_experts(float *y, const float *x, const int *idx, const float *wt, int n,
			 int top_k, const struct cpu_expert *experts, int ex0, int n_local,
			 enum dt_type wdt, int dim, int inter,
			 const struct cpu_shared_expert *shared, float *scratch)
{
	int wide = shared && shared->inter > inter ? shared->inter : inter;
	float *g = scratch, *u = g + wide, *z = u + wide;
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * dim;
		float *yt = y + (size_t)t * dim;
		if (shared)
			expert_mv(yt, xt, &shared->w, shared->dtype, dim, shared->inter, g, u);
		for (int j = 0; j < top_k; j++) {
			int e = idx[(size_t)t * top_k + j] - ex0;
			if (e < 0 || e >= n_local)
				continue;
			expert_mv(z, xt, &experts[e], wdt, dim, inter, g, u);
			float s = wt[(size_t)t * top_k + j];
			for (int d = 0; d < dim; d++)
				yt[d] += s * z[d];
		}
	}
}

void cpu_ref_gather_rows(float *dst, const float *src, const int *rows, int n, int dim)
{
	for (int i = 0; i < n; i++)
		memcpy(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
}

void cpu_ref_scatter_add_rows(float *y, const float *x, const int *rows, const float *scale,
			      int n, int dim)
{
	for (int i = 0; i < n; i++) {
		float *yr = y + (size_t)rows[i] * dim;
		const float *xr = x + (size_t)i * dim;
		for (int d = 0; d < dim; d++)
			yr[d] += scale[i] * xr[d];
	}
}

/* ---- MLA ------------------------------------------------------------------------------------ */

/* Each weight row is dequantized once per call and used for all n tokens. */
void cpu_ref_mla_absorb_q(float *qa, const float *q, const void *w, enum dt_type wt,
			  const float *scale, int lora, int n, int n_heads, int d_nope,
			  int d_rope, int d_v, int h0, int h1)
{
	float buf[CPU_GLM_ROWBUF];
	for (int h = h0; h < h1; h++) {
		size_t r0 = (size_t)h * (d_nope + d_v);
		for (int i = 0; i < n; i++) {
			const float *qn = q + ((size_t)i * n_heads + h) * (d_nope + d_rope);
			float *o = qa + ((size_t)i * n_heads + h) * (lora + d_rope);
			memset(o, 0, (size_t)lora * sizeof(float));
			memcpy(o + lora, qn + d_nope, (size_t)d_rope * sizeof(float));
		}
		for (int c0 = 0; c0 < lora; c0 += CPU_GLM_ROWBUF) {
			int c1 = c0 + CPU_GLM_ROWBUF < lora ? c0 + CPU_GLM_ROWBUF : lora;
			for (int d = 0; d < d_nope; d++) {
				cpu_glm_row_f32(buf, w, wt, scale, lora, r0 + d, c0, c1);
				for (int i = 0; i < n; i++) {
					float a = q[((size_t)i * n_heads + h) * (d_nope + d_rope) + d];
					float *o = qa + ((size_t)i * n_heads + h) * (lora + d_rope);
					for (int c = c0; c < c1; c++)
						o[c] += a * buf[c - c0];
				}
			}
		}
	}
}

void cpu_ref_mla_absorb_out(float *o, const float *lat, const void *w, enum dt_type wt,
			    const float *scale, int lora, int n, int n_heads, int d_nope, int d_v,
			    int h0, int h1)
{
	float buf[CPU_GLM_ROWBUF];
	for (int h = h0; h < h1; h++) {
		size_t r0 = (size_t)h * (d_nope + d_v) + d_nope;
		for (int d = 0; d < d_v; d++) {
			for (int i = 0; i < n; i++)
				o[((size_t)i * n_heads + h) * d_v + d] = 0.0f;
			for (int c0 = 0; c0 < lora; c0 += CPU_GLM_ROWBUF) {
				int c1 = c0 + CPU_GLM_ROWBUF < lora ? c0 + CPU_GLM_ROWBUF : lora;
				cpu_glm_row_f32(buf, w, wt, scale, lora, r0 + d, c0, c1);
				for (int i = 0; i < n; i++) {
					const float *l = lat + ((size_t)i * n_heads + h) * lora;
					float acc = 0.0f;
					for (int c = c0; c < c1; c++)
						acc += l[c] * buf[c - c0];
					o[((size_t)i * n_heads + h) * d_v + d] += acc;
				}
			}
		}
	}
}

/* Element d of k_a's (or v's, at offset i of cache row t) row: an FP8 cache's rows are d_a
 * wide, each with its scales. */
static float mla_el(const struct cpu_mla *s, const void *c, size_t i, size_t t, int d)
{
	if (s->kv == DT_F8_E4M3)
		return cpu_kv_rc(c, s->kv, s->a_s, s->d_a, t, d);
	return cpu_kv_at(c, s->kv, i + (size_t)d);
}

static float mla_score(const float *qh, const struct cpu_mla *s, int h, size_t t, float scale)
{
	size_t ka = t * s->ka_stride + (size_t)h * s->ka_head;
	size_t kb = t * s->kb_stride;
	float acc = 0.0f;
	for (int d = 0; d < s->d_a; d++)
		acc += qh[d] * mla_el(s, s->k_a, ka, t, d);
	for (int d = 0; d < s->d_b; d++)
		acc += qh[s->d_a + d] * cpu_kv_at(s->k_b, cpu_kv_b_type(s->kv), kb + (size_t)d);
	return acc * scale;
}

void cpu_ref_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n,
			   int pos0, int i0, int i1, int h0, int h1)
{
	int dq = s->d_a + s->d_b;
	for (int i = i0; i < i1; i++) {
		const int *keys = s->sel ? s->sel + (size_t)i * s->sel_stride : NULL;
		int nk = cpu_mla_keys(s, i, pos0);
		for (int h = h0; h < h1; h++) {
			const float *qh = q + ((size_t)i * s->n_heads + h) * dq;
			float *oh = out + ((size_t)i * s->n_heads + h) * s->d_v;
			float max = -INFINITY;
			for (int j = 0; j < nk; j++) {
				size_t t = cpu_mla_row(s, i, keys ? keys[j] : j);
				float sc = mla_score(qh, s, h, t, s->scale);
				if (sc > max)
					max = sc;
			}
			for (int d = 0; d < s->d_v; d++)
				oh[d] = 0.0f;
			float sum = 0.0f;
			for (int j = 0; j < nk; j++) {
				size_t t = cpu_mla_row(s, i, keys ? keys[j] : j);
				float p = expf(mla_score(qh, s, h, t, s->scale) - max);
				size_t vt = t * s->v_stride + (size_t)h * s->v_head;
				sum += p;
				for (int d = 0; d < s->d_v; d++)
					oh[d] += p * mla_el(s, s->v, vt, t, d);
			}
			for (int d = 0; d < s->d_v; d++)
				oh[d] /= sum;
		}
	}
	(void)n;
}

/* ---- DSA lightning indexer ------------------------------------------------------------------ */

struct scored {
	float score;
	int pos;
};

/* Higher score first; the lower position wins a tie. */
static int by_score(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;
	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

static int by_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

float cpu_ref_dsa_score(const float *q, const void *k, enum dt_type kv, const float *ks,
			const float *w, int n_heads, int head_dim, float qk_scale, float w_scale)
{
	float total = 0.0f;
	for (int h = 0; h < n_heads; h++) {
		const float *qh = q + (size_t)h * head_dim;
		float dot = 0.0f;
		for (int d = 0; d < head_dim; d++)
			dot += qh[d] * cpu_kv_rc(k, kv, ks, head_dim, 0, d);
		dot *= qk_scale;
		total += w[h] * w_scale * (dot > 0.0f ? dot : 0.0f);
	}
	return total;
}

void cpu_ref_dsa_select(int *sel, int *nsel, float *scores, int len, int topk, void *work)
{
	if (len <= topk) {
		for (int t = 0; t < len; t++)
			sel[t] = t;
		*nsel = len;
		return;
	}
	struct scored *sc = work;
	for (int t = 0; t < len; t++)
		sc[t] = (struct scored){.score = isnan(scores[t]) ? -INFINITY : scores[t], .pos = t};
	qsort(sc, (size_t)len, sizeof *sc, by_score);
	for (int j = 0; j < topk; j++)
		sel[j] = sc[j].pos;
	qsort(sel, (size_t)topk, sizeof *sel, by_int);
	*nsel = topk;
}

void cpu_ref_dsa_topk(int *sel, int *nsel, const float *q, const float *w,
		      const struct cpu_dsa *d, int n, int pos0, float *scores, void *work)
{
	int H = d->n_heads, D = d->head_dim;
	for (int i = 0; i < n; i++) {
		int len = cpu_dsa_len(d, i, pos0);
		size_t base = cpu_dsa_base(d, i);
		for (int t = 0; len > d->topk && t < len; t++) {
			size_t r = base + (size_t)t;
			scores[t] = cpu_ref_dsa_score(q + (size_t)i * H * D,
						      cpu_kv_ptr(d->k, d->kv, r * D), d->kv,
						      cpu_kv_scales(d->ks, r, D), w + (size_t)i * H,
						      H, D, d->qk_scale, d->w_scale);
		}
		cpu_ref_dsa_select(sel + (size_t)i * d->topk, nsel + i, scores, len, d->topk,
				   work);
	}
}
