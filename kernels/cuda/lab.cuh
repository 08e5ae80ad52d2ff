/*
 * lab.cuh - what the kernel lab's files share: the timing (the median of REPS runs, by
 * events), the random inputs (one xorshift state for the whole lab, so that a run draws the
 * same inputs whichever tables it prints), the relative error against a reference, and the
 * tables each file prints. lab.cu holds the ceilings, the GEMMs and the GEMVs and runs them
 * all (wk_cuda_lab); lab_attention.cu holds the attention tables and the DSA indexer's.
 * Linked into build/tools/cuda_lab only.
 */
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "common/wk.h"
}

#define REPS 5

static inline int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Milliseconds of one call of what(), the median of REPS after a warm-up, timed by events on
 * stream st (what() launches there); < 0 on error. */
template <typename F> static inline float time_ms(F what, cudaStream_t st = 0)
{
	cudaEvent_t a, b;
	float ms[REPS];
	if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
		return -1.0f;
	if (what() != WK_OK || cudaDeviceSynchronize() != cudaSuccess)
		return -1.0f;
	for (int r = 0; r < REPS; r++) {
		cudaEventRecord(a, st);
		if (what() != WK_OK)
			return -1.0f;
		cudaEventRecord(b, st);
		if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms[r], a, b) != cudaSuccess)
			return -1.0f;
	}
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	qsort(ms, REPS, sizeof ms[0], cmp_float);
	return ms[REPS / 2];
}

inline uint64_t lab_rng = 0x853c49e6748fea9bull;

static inline uint32_t lab_next(void)
{
	lab_rng ^= lab_rng << 13;
	lab_rng ^= lab_rng >> 7;
	lab_rng ^= lab_rng << 17;
	return (uint32_t)(lab_rng >> 32);
}

static inline uint8_t lab_code(void) /* any e4m3 code but the NaNs (0x7f, 0xff) */
{
	uint8_t b = (uint8_t)lab_next();
	return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

static inline float lab_scale(float mid) /* mid * [0.5, 1.5) */
{
	return mid * (0.5f + (float)(lab_next() >> 8) / 16777216.0f);
}

/* Fills dev (bytes) with random data, never zeros (they can time faster than real data,
 * METHOD.md): f32 values in [lo, hi) (f32), or bf16 values in [-1, 1) (!f32) whose bytes are
 * also finite e4m3 codes (no 0x7f / 0xff), so one buffer serves the bf16 and the FP8 cases.
 * Made on the device, from a hash of each word's index. Returns WK_OK or WK_EIO. */
int fill_random(void *dev, size_t bytes, bool f32, float lo, float hi);

/* max |got - want| / max |want| over rows [r0, r0 + nr) of got [n][rows] against want [n][nr];
 * a non-finite output counts as infinitely far */
double lab_rel(const float *got, const float *want, int n, int rows, int r0, int nr);

/* The attention tables (lab_attention.cu), each checked against the CPU reference before it
 * is timed; WK_OK, or WK_EIO after a FAILED line. Decode: GB/s of the cache read beside
 * ceil_gbs (the device copy). Prefill: TFLOPS of the tiled kernel beside the per-token one. */
int lab_attention(double ceil_gbs);
int lab_mla(double ceil_gbs);
int lab_attention_prefill(void);
int lab_mla_prefill(void);
int lab_mla_latent(void);
int lab_dsa_prefill(void);
int lab_dsa_decode(double ceil_gbs);
