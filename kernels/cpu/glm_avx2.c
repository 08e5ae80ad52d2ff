/*
 * glm_avx2.c - AVX2/FMA versions of the GLM kernels (see glm_kernels.h): MLA absorption, MLA
 * attention and the DSA indexer score.
 *
 * Absorption: the loop
 * structure is the reference's (glm_ref.c): each kv_b_proj row is dequantized once per call
 * into a stack buffer (FP8 with bit arithmetic, 8 codes at a time), then used for every token
 * with 8-wide FMAs.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/glm_kernels.h"
#include "kernels/cpu/kv_avx2.h"

/* 8 e4m3fn codes (the low 8 bytes of b) as f32: the 7 magnitude bits placed at the top of
 * an f32 mantissa/exponent (bits 20..26) and the sign at bit 31 give the value times 2^-120,
 * subnormal codes included; one multiply by 2^120 restores it. The NaN codes 0x7f/0xff come
 * out as +-480 (they do not occur in checkpoints), as in the FP8 matmul. */
static __m256 e4m3x8(__m128i b)
{
	__m256i x = _mm256_cvtepu8_epi32(b);
	__m256i mag = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7f)), 20);
	__m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
	return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)),
			     _mm256_set1_ps(0x1p120f));
}

/* Like cpu_glm_row_f32; FP8 and BF16 vectorised, the rest through the scalar version. c0 is
 * a multiple of 128 (a block edge), as the callers step by CPU_GLM_ROWBUF. */
static void row_f32(float *dst, const void *w, enum dt_type wt, const float *scale, int cols,
		    size_t r, int c0, int c1)
{
	size_t at = r * (size_t)cols;
	if (wt == DT_F8_E4M3) {
		const float *srow = scale + (r / 128) * (((size_t)cols + 127) / 128);
		const uint8_t *b = (const uint8_t *)w + at;
		for (int k0 = c0; k0 < c1; k0 += 128) {
			int k1 = k0 + 128 < c1 ? k0 + 128 : c1, c = k0;
			__m256 s = _mm256_set1_ps(srow[k0 / 128]);
			for (; c + 8 <= k1; c += 8) {
				__m128i by = _mm_loadl_epi64((const __m128i *)(b + c));
				_mm256_storeu_ps(dst + (c - c0), _mm256_mul_ps(e4m3x8(by), s));
			}
			for (; c < k1; c++)
				dst[c - c0] = dt_e4m3_table[b[c]] * srow[k0 / 128];
		}
		return;
	}
	if (wt == DT_BF16) {
		const uint16_t *h = (const uint16_t *)w + at;
		int c = c0;
		for (; c + 8 <= c1; c += 8) {
			__m128i x = _mm_loadu_si128((const __m128i *)(h + c));
			__m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16);
			_mm256_storeu_ps(dst + (c - c0), _mm256_castsi256_ps(u));
		}
		for (; c < c1; c++)
			dst[c - c0] = dt_bf16_to_f32(h[c]);
		return;
	}
	cpu_glm_row_f32(dst, w, wt, scale, cols, r, c0, c1);
}

static void axpy(float *y, float a, const float *x, int n)
{
	__m256 va = _mm256_set1_ps(a);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
							_mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] += a * x[i];
}

static float dot(const float *a, const float *b, int n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	s0 = _mm256_add_ps(s0, s1);
	__m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
	h = _mm_add_ps(h, _mm_movehl_ps(h, h));
	h = _mm_add_ss(h, _mm_movehdup_ps(h));
	float acc = _mm_cvtss_f32(h);
	for (; i < n; i++)
		acc += a[i] * b[i];
	return acc;
}

void cpu_mla_absorb_q_avx2(float *qa, const float *q, const void *w, enum dt_type wt,
			   const float *scale, int lora, int n, int n_heads, int d_nope, int d_rope,
			   int d_v, int h0, int h1)
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
				row_f32(buf, w, wt, scale, lora, r0 + d, c0, c1);
				for (int i = 0; i < n; i++)
					axpy(qa + ((size_t)i * n_heads + h) * (lora + d_rope) + c0,
					     q[((size_t)i * n_heads + h) * (d_nope + d_rope) + d], buf,
					     c1 - c0);
			}
		}
	}
}

void cpu_mla_absorb_out_avx2(float *o, const float *lat, const void *w, enum dt_type wt,
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
				row_f32(buf, w, wt, scale, lora, r0 + d, c0, c1);
				for (int i = 0; i < n; i++)
					o[((size_t)i * n_heads + h) * d_v + d] +=
						dot(lat + ((size_t)i * n_heads + h) * lora + c0, buf,
						    c1 - c0);
			}
		}
	}
}

static void scale_row(float *o, float a, int n)
{
	__m256 va = _mm256_set1_ps(a);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(o + i, _mm256_mul_ps(va, _mm256_loadu_ps(o + i)));
	for (; i < n; i++)
		o[i] *= a;
}

/* q . row t of k_a (at element ka) */
static inline __attribute__((always_inline)) float
ka_dot(const float *q, const struct cpu_mla *s, enum dt_type kv, size_t ka, size_t t)
{
	if (kv != DT_F8_E4M3)
		return kv_dot(q, s->k_a, kv, ka, s->d_a);
	return kv8_dot(q, (const uint8_t *)s->k_a + ka, cpu_kv_scales(s->a_s, t, s->d_a),
		      s->d_a);
}

/* o += p * row t of v (at element vt), FP8 block by block as ka_dot */
static inline __attribute__((always_inline)) void
v_axpy(float *o, float p, const struct cpu_mla *s, enum dt_type kv, size_t vt, size_t t)
{
	if (kv != DT_F8_E4M3) {
		kv_scale_axpy(o, 1.0f, p, s->v, kv, vt, s->d_v);
		return;
	}
	kv8_scale_axpy(o, 1.0f, p, (const uint8_t *)s->v + vt,
		       cpu_kv_scales(s->a_s, t, s->d_a), s->d_v);
}

/* kv a constant in each call of cpu_mla_attention_avx2: the loops specialised per cache type */
static inline __attribute__((always_inline)) void
mla_attention(float *out, const float *q, const struct cpu_mla *s, enum dt_type kv, int pos0,
	      int i0, int i1, int h0, int h1)
{
	int dq = s->d_a + s->d_b;
	for (int i = i0; i < i1; i++) {
		const int *keys = s->sel ? s->sel + (size_t)i * s->sel_stride : NULL;
		int nk = cpu_mla_keys(s, i, pos0);
		for (int h = h0; h < h1; h++) {
			const float *qh = q + ((size_t)i * s->n_heads + h) * dq;
			float *oh = out + ((size_t)i * s->n_heads + h) * s->d_v;
			float max = -INFINITY, sum = 0.0f;
			memset(oh, 0, (size_t)s->d_v * sizeof(float));
			for (int j = 0; j < nk; j++) {
				size_t t = cpu_mla_row(s, i, keys ? keys[j] : j);
				size_t ka = t * s->ka_stride + (size_t)h * s->ka_head;
				size_t kb = t * s->kb_stride;
				float sc = (ka_dot(qh, s, kv, ka, t) +
					    kv_dot(qh + s->d_a, s->k_b, cpu_kv_b_type(kv), kb,
						   s->d_b)) *
					   s->scale;
				if (sc > max) { /* rescale what was summed under the old maximum */
					float r = expf(max - sc);
					sum *= r;
					scale_row(oh, r, s->d_v);
					max = sc;
				}
				float p = expf(sc - max);
				sum += p;
				size_t vt = t * s->v_stride + (size_t)h * s->v_head;
				v_axpy(oh, p, s, kv, vt, t);
			}
			scale_row(oh, 1.0f / sum, s->d_v);
		}
	}
}

void cpu_mla_attention_avx2(float *out, const float *q, const struct cpu_mla *s, int n,
			    int pos0, int i0, int i1, int h0, int h1)
{
	(void)n;
	if (s->kv == DT_F8_E4M3)
		mla_attention(out, q, s, DT_F8_E4M3, pos0, i0, i1, h0, h1);
	else if (s->kv == DT_BF16)
		mla_attention(out, q, s, DT_BF16, pos0, i0, i1, h0, h1);
	else
		mla_attention(out, q, s, DT_F32, pos0, i0, i1, h0, h1);
}

float cpu_dsa_score_avx2(const float *q, const void *k, enum dt_type kv, const float *ks,
			 const float *w, int n_heads, int head_dim, float qk_scale, float w_scale)
{
	float total = 0.0f;
	for (int h = 0; h < n_heads; h++) {
		const float *qh = q + (size_t)h * head_dim;
		float d = (kv == DT_F8_E4M3 ? kv8_dot(qh, k, ks, head_dim)
			   : kv == DT_BF16  ? kv_dot(qh, k, DT_BF16, 0, head_dim)
					    : kv_dot(qh, k, DT_F32, 0, head_dim)) *
			  qk_scale;
		total += w[h] * w_scale * (d > 0.0f ? d : 0.0f);
	}
	return total;
}
