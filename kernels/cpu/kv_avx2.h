/*
 * kv_avx2.h - reading a KV cache of f32 or bf16 elements 8 at a time, for the *_avx2.c
 * files only (compiled with -mavx2 -mfma). The cache type is a parameter the callers pass
 * as a constant, so each inlined loop is specialised for one type. An FP8 cache's elements
 * are read as their e4m3 values, unscaled: the callers apply each 128-block's scale.
 */
#ifndef KV_AVX2_H
#define KV_AVX2_H

#include <immintrin.h>

#include "kernels/cpu/cpu.h"

#define KV_INLINE static inline __attribute__((always_inline))

/* Element i of cache c (type t) as f32 (FP8: unscaled). */
KV_INLINE float kv_el(const void *c, enum dt_type t, size_t i)
{
	return t == DT_F8_E4M3 ? dt_e4m3_table[((const uint8_t *)c)[i]] : cpu_kv_at(c, t, i);
}

/* Elements i .. i+7 of cache c (type t) as f32: bf16 widens by a 16-bit shift, e4m3 codes
 * look their values up (unscaled). */
KV_INLINE __m256 kv_ld8(const void *c, enum dt_type t, size_t i)
{
	if (t == DT_F8_E4M3) {
		__m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)c + i));
		return _mm256_i32gather_ps(dt_e4m3_table, _mm256_cvtepu8_epi32(b), 4);
	}
	if (t == DT_BF16) {
		__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)c + i));
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	}
	return _mm256_loadu_ps((const float *)c + i);
}

KV_INLINE float kv_hsum(__m256 v)
{
	__m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	h = _mm_add_ps(h, _mm_movehl_ps(h, h));
	h = _mm_add_ss(h, _mm_movehdup_ps(h));
	return _mm_cvtss_f32(h);
}

/* q [n] . the cache's elements at .. at+n-1 */
KV_INLINE float kv_dot(const float *q, const void *c, enum dt_type t, size_t at, int n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv_ld8(c, t, at + (size_t)i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), kv_ld8(c, t, at + (size_t)i + 8),
				     s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv_ld8(c, t, at + (size_t)i), s0);
	float acc = kv_hsum(_mm256_add_ps(s0, s1));
	for (; i < n; i++)
		acc += q[i] * kv_el(c, t, at + (size_t)i);
	return acc;
}

/* y [n] = y * f + p * the cache's elements at .. at+n-1 */
KV_INLINE void kv_scale_axpy(float *y, float f, float p, const void *c, enum dt_type t,
			     size_t at, int n)
{
	__m256 vf = _mm256_set1_ps(f), vp = _mm256_set1_ps(p);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, kv_ld8(c, t, at + (size_t)i),
							_mm256_mul_ps(vf, _mm256_loadu_ps(y + i))));
	for (; i < n; i++)
		y[i] = y[i] * f + p * kv_el(c, t, at + (size_t)i);
}

/* q [n] . an FP8 row of n elements at c, block by block, each times its scale s[b] */
KV_INLINE float kv8_dot(const float *q, const void *c, const float *s, int n)
{
	float acc = 0.0f;
	for (int c0 = 0, b = 0; c0 < n; c0 += CPU_FP8_BLOCK, b++) {
		int m = n - c0 < CPU_FP8_BLOCK ? n - c0 : CPU_FP8_BLOCK;
		acc += s[b] * kv_dot(q + c0, c, DT_F8_E4M3, (size_t)c0, m);
	}
	return acc;
}

/* y [n] = y * f + p * an FP8 row's values (n elements at c, scales s), block by block */
KV_INLINE void kv8_scale_axpy(float *y, float f, float p, const void *c, const float *s, int n)
{
	for (int c0 = 0, b = 0; c0 < n; c0 += CPU_FP8_BLOCK, b++) {
		int m = n - c0 < CPU_FP8_BLOCK ? n - c0 : CPU_FP8_BLOCK;
		kv_scale_axpy(y + c0, f, p * s[b], c, DT_F8_E4M3, (size_t)c0, m);
	}
}

#endif
