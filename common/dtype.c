#include "common/dtype.h"

#include <math.h>

static const struct {
	const char *name;
	size_t size;
} types[DT_COUNT] = {
	[DT_F32] = {"F32", 4},
	[DT_BF16] = {"BF16", 2},
	[DT_F16] = {"F16", 2},
	[DT_F8_E4M3] = {"F8_E4M3", 1},
	[DT_F8_E5M2] = {"F8_E5M2", 1},
};

size_t dt_size(enum dt_type t)
{
	return (t >= 0 && t < DT_COUNT) ? types[t].size : 0;
}

const char *dt_name(enum dt_type t)
{
	return (t >= 0 && t < DT_COUNT) ? types[t].name : "?";
}

enum dt_type dt_from_name(const char *s)
{
	for (int i = 0; i < DT_COUNT; i++)
		if (strcmp(s, types[i].name) == 0)
			return (enum dt_type)i;
	return DT_INVALID;
}

float dt_f16_to_f32(uint16_t h)
{
	int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	float v;
	if (exp == 0)
		v = ldexpf((float)man, -24);
	else if (exp == 31)
		v = man ? NAN : INFINITY;
	else
		v = ldexpf((float)(man | 0x400), exp - 25);
	return sign ? -v : v;
}

uint16_t dt_f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	if (isnan(f))
		return sign | 0x7e00;
	float a = fabsf(f);
	if (a >= 65520.0f)
		return sign | 0x7c00;
	if (a < 6.103515625e-05f) { /* subnormal: units of 2^-24 */
		float q = nearbyintf(a * 16777216.0f);
		return sign | (uint16_t)q;
	}
	int e;
	float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
	float q = nearbyintf(m * 2048.0f); /* 11 significant bits */
	if (q >= 2048.0f) {
		q /= 2;
		e++;
	}
	return sign | (uint16_t)(((e + 14) << 10) | ((int)q - 1024));
}

/* dt_e4m3_table, built at compile time (no initialisation, safe from any thread): the
 * emulated CUDA kernels' tests and the FP8 references decode every weight and activation,
 * and a table answers in a load where ldexpf took most of their time. |code|
 * m = eeee mmm is (8 + mmm) * 2^(eeee - 10), or mmm * 2^-9 when eeee = 0 (both exact in
 * f32); 0x7f and 0xff are NaN. */
#define E4M3_MAG(m)                                                                        \
	(((m) >> 3) == 0 ? (float)((m) & 7) / 512.0f                                        \
			 : (float)(8 + ((m) & 7)) * (float)(1u << ((m) >> 3)) / 1024.0f)
#define E4M3(b)                                                                            \
	(((b) & 0x7f) == 0x7f ? NAN                                                         \
			      : ((b) & 0x80 ? -E4M3_MAG((b) & 0x7f) : E4M3_MAG((b) & 0x7f)))
#define T4(b) E4M3(b), E4M3((b) + 1), E4M3((b) + 2), E4M3((b) + 3)
#define T16(b) T4(b), T4((b) + 4), T4((b) + 8), T4((b) + 12)
#define T64(b) T16(b), T16((b) + 16), T16((b) + 32), T16((b) + 48)
const float dt_e4m3_table[256] = {T64(0), T64(64), T64(128), T64(192)};

float dt_e4m3_to_f32(uint8_t b)
{
	return dt_e4m3_table[b];
}

uint8_t dt_f32_to_e4m3(float f)
{
	if (isnan(f))
		return 0x7f;
	uint8_t sign = signbit(f) ? 0x80 : 0;
	float a = fabsf(f);
	if (a >= 448.0f)
		return sign | 0x7e;
	if (a < 0.015625f) { /* subnormal: units of 2^-9 */
		int q = (int)nearbyintf(a * 512.0f);
		return sign | (uint8_t)q; /* q == 8 is the smallest normal, encoded the same way */
	}
	int e;
	float m = frexpf(a, &e);
	int q = (int)nearbyintf(m * 16.0f); /* 4 significant bits */
	if (q >= 16) {
		q /= 2;
		e++;
	}
	int code = ((e + 6) << 3) | (q - 8);
	if (code > 0x7e)
		code = 0x7e;
	return sign | (uint8_t)code;
}

float dt_e5m2_to_f32(uint8_t b)
{
	return dt_f16_to_f32((uint16_t)b << 8);
}

int dt_to_f32(float *dst, const void *src, enum dt_type t, size_t n)
{
	const uint8_t *b = src;
	switch (t) {
	case DT_F32:
		memcpy(dst, src, n * 4);
		return 0;
	case DT_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, b + 2 * i, 2);
			dst[i] = dt_bf16_to_f32(h);
		}
		return 0;
	case DT_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, b + 2 * i, 2);
			dst[i] = dt_f16_to_f32(h);
		}
		return 0;
	case DT_F8_E4M3:
		for (size_t i = 0; i < n; i++)
			dst[i] = dt_e4m3_to_f32(b[i]);
		return 0;
	case DT_F8_E5M2:
		for (size_t i = 0; i < n; i++)
			dst[i] = dt_e5m2_to_f32(b[i]);
		return 0;
	default:
		return -1;
	}
}
