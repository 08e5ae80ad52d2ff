/*
 * dtype.h - element types of weights and activations, and their scalar conversions.
 *
 * Names follow safetensors ("F32", "BF16", "F16", "F8_E4M3", "F8_E5M2"). F8_E4M3 is
 * float8_e4m3fn: no infinities, 0x7f/0xff are NaN, max finite 448.
 * All functions are pure and thread-safe.
 */
#ifndef DTYPE_H
#define DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dt_type {
	DT_INVALID = -1,
	DT_F32 = 0,
	DT_BF16,
	DT_F16,
	DT_F8_E4M3,
	DT_F8_E5M2,
	DT_COUNT
};

size_t dt_size(enum dt_type t);            /* bytes per element; 0 for DT_INVALID */
const char *dt_name(enum dt_type t);       /* safetensors name, "?" when invalid */
enum dt_type dt_from_name(const char *s);  /* DT_INVALID for an unknown name */

static inline float dt_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t dt_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);
float dt_e4m3_to_f32(uint8_t b); /* dt_e4m3_table[b] */
/* Every float8_e4m3fn code as f32 (0x7f/0xff NaN): a constant table, built at compile time,
 * safe from any thread; the FP8 kernels index it directly (the AVX2 ones gather from it). */
extern const float dt_e4m3_table[256];
uint8_t dt_f32_to_e4m3(float f); /* round to nearest even, saturating to +-448 */
float dt_e5m2_to_f32(uint8_t b);

/* Converts n elements of type t at src to f32. Returns 0, or -1 for an unknown type. */
int dt_to_f32(float *dst, const void *src, enum dt_type t, size_t n);

#endif
