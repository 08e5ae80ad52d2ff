/*
 * mma.cpp - the emulator's tensor-core instructions (simt.h, for kernels/cuda/mma.cuh):
 * mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, D = A . B + C for one warp, A 16x32,
 * B 32x8, C and D 16x8; and mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (A 16x16,
 * B 16x8; section 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type",
 * at the end of this file, the same way).
 *
 * The fragment layouts follow the PTX ISA, section 9.7.14.5.10 "Matrix Fragments for
 * mma.m16n8k32" (the .u8/.s8/.e4m3/.e5m2 multiplicands, .f32 accumulators), as published at
 * docs.nvidia.com/cuda/parallel-thread-execution (read in its PTX ISA 8.7 / 9.0 text). The
 * document gives, for each lane and each element i of its fragment, the element's row and
 * column; the functions a_at, b_at and c_at below are those formulas as written there, and
 * the elements of a fragment are packed low to high into its 32-bit registers (element i in
 * byte i % 4 of register i / 4), as its tables say.
 *
 * How it runs: once a process, the document's maps are inverted into tables that say, for
 * each element of A and of B, which lane holds it and where (checking that each element is
 * held exactly once). At each mma every lane hands its A and B registers to the warp
 * (simt_warp_gather) and computes the four elements of D its own fragment holds, fetching
 * row r of A and column c of B from the lanes the tables name. C and D share one layout, so
 * a lane's c[i] is the addend of its own d[i] and needs no exchange. Each element's 32
 * products (exact in double: e4m3 x e4m3 has at most 8 significant bits) are summed exactly,
 * added to c in double and rounded once to f32. The hardware accumulates FP8 products with
 * fewer bits than that (the reason the kernels promote every 128-deep block), so results
 * differ from a GPU's in the low bits; the tests compare with tolerances.
 *
 * What this proves: a kernel that puts the wrong bytes in a lane's registers, or reads the
 * wrong lane's result, fails here (tests/unit/test_cuda.c's gemm_fp8_matches_ref; swapping two
 * registers of A, or two columns of the C map here, was seen to fail it). What it cannot: if
 * we misread the document, emulator and kernel agree and are both wrong. Nor can any test see
 * the byte order inside a register: A and B pack k alike, so reversing it in both leaves
 * every product's sum unchanged. A GPU run of scripts/gpu-check is the judge.
 */
#include "simt.h"

#include <stdio.h>
#include <stdlib.h>

struct frag {
	uint32_t a[4], b[2];
};

/* The PTX ISA's maps, with groupID = lane >> 2 and threadID_in_group = lane % 4. */
static void a_at(int lane, int i, int *row, int *col)
{
	int group = lane >> 2, tig = lane % 4;
	*row = (i < 4 || (i >= 8 && i < 12)) ? group : group + 8;
	*col = i < 8 ? tig * 4 + (i & 0x3) : tig * 4 + (i & 0x3) + 16;
}

static void b_at(int lane, int i, int *row, int *col)
{
	int group = lane >> 2, tig = lane % 4;
	*row = i < 4 ? tig * 4 + (i & 0x3) : tig * 4 + (i & 0x3) + 16;
	*col = group;
}

static void c_at(int lane, int i, int *row, int *col)
{
	int group = lane >> 2, tig = lane % 4;
	*row = i < 2 ? group : group + 8;
	*col = tig * 2 + (i & 0x1);
}

static uint8_t elem(const uint32_t *regs, int i)
{
	return (uint8_t)(regs[i / 4] >> (8 * (i % 4)));
}

[[noreturn]] static void fail(const char *what)
{
	fprintf(stderr, "simt: mma: %s\n", what);
	abort();
}

/* where an element lives: lane, and element index in that lane's fragment */
struct src {
	uint8_t lane, i;
};
static src a_src[16][32], b_src[32][8];
static float e4m3[256];

typedef void (*frag_map)(int lane, int i, int *row, int *col);

/* The inverse of map (each lane's elements 0..per-1) into out[R][C] (out may be NULL: only
 * checked), failing unless it reaches every element of the R x C matrix exactly once (a slip
 * in the transcription of a map would otherwise leave holes that read stale bytes). */
template <int R, int C> static void invert(frag_map map, int per, src (*out)[C])
{
	int seen[R][C] = {};
	for (int lane = 0; lane < 32; lane++)
		for (int i = 0; i < per; i++) {
			int r, c;
			map(lane, i, &r, &c);
			if (r < 0 || r >= R || c < 0 || c >= C)
				fail("a fragment map reaches outside its matrix");
			seen[r][c]++;
			if (out)
				out[r][c] = {(uint8_t)lane, (uint8_t)i};
		}
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			if (seen[r][c] != 1)
				fail("a fragment map does not cover its matrix exactly once");
}

/* Once a process: the inverse maps, checked, and the e4m3 table. */
static void init(void)
{
	invert<16, 32>(a_at, 16, a_src);
	invert<32, 8>(b_at, 8, b_src);
	invert<16, 8>(c_at, 4, NULL);
	for (int v = 0; v < 256; v++)
		e4m3[v] = dt_e4m3_to_f32((uint8_t)v);
}

/* One mma over K: every lane hands its A and B registers to the warp, then computes the four
 * elements of D its own fragment holds from row r of A and column c of B, fetched from the
 * lanes the inverse maps name (value: element i of a fragment's registers). Its elements are
 * rows g, g + 8 by columns c0, c0 + 1 (c_at), so those two rows and two columns are fetched
 * once, then multiplied in the same order as element by element. */
template <int K, float (*value)(const uint32_t *regs, int i)>
static void mma_run(float d[4], const uint32_t a[4], const uint32_t b[2], const src (*as)[K],
		    const src (*bs)[8])
{
	frag mine, all[32];
	memset(&mine, 0, sizeof mine);
	memcpy(mine.a, a, sizeof mine.a);
	memcpy(mine.b, b, sizeof mine.b);
	if (simt_warp_gather(&mine, all, sizeof mine) != 32)
		fail("mma.sync in a warp of fewer than 32 threads");
	int lane = simt_lane(), r0, c0;
	c_at(lane, 0, &r0, &c0);
	double av[2][K], bv[2][K];
	for (int h = 0; h < 2; h++)
		for (int k = 0; k < K; k++) {
			src x = as[r0 + 8 * h][k], y = bs[k][c0 + h];
			av[h][k] = value(all[x.lane].a, x.i);
			bv[h][k] = value(all[y.lane].b, y.i);
		}
	for (int i = 0; i < 4; i++) {
		int r, c;
		c_at(lane, i, &r, &c);
		const double *x = av[r == r0 ? 0 : 1], *y = bv[c - c0];
		double s = 0;
		for (int k = 0; k < K; k++)
			s += x[k] * y[k];
		d[i] = (float)(s + d[i]);
	}
}

static float e4m3_elem(const uint32_t *regs, int i)
{
	return e4m3[elem(regs, i)];
}

void simt_mma_e4m3_16832(float d[4], const uint32_t a[4], const uint32_t b[2])
{
	static bool ready;
	if (!ready) {
		init();
		ready = true;
	}
	mma_run<32, e4m3_elem>(d, a, b, a_src, b_src);
}

/* ---- m16n8k16, bf16: PTX ISA 9.7.14.5.8. A's eight elements a0..a7 and B's four b0..b3 per
 * lane, two a register (element i in the low half of register i / 2 when i is even). ---- */

static void a16_at(int lane, int i, int *row, int *col)
{
	int group = lane >> 2, tig = lane % 4;
	*row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
	*col = tig * 2 + (i & 0x1) + (i >= 4 ? 8 : 0);
}

static void b16_at(int lane, int i, int *row, int *col)
{
	int group = lane >> 2, tig = lane % 4;
	*row = tig * 2 + (i & 0x1) + (i >= 2 ? 8 : 0);
	*col = group;
}

static float bf16_elem(const uint32_t *regs, int i)
{
	uint32_t u = (regs[i / 2] >> (16 * (i % 2))) << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static src a16_src[16][16], b16_src[16][8];

static void init16(void)
{
	invert<16, 16>(a16_at, 8, a16_src);
	invert<16, 8>(b16_at, 4, b16_src);
}

/* Each element's 16 products (exact in double: bf16 x bf16 has at most 16 significant bits)
 * summed exactly, added to c in double and rounded once to f32 (a GPU rounds along the way;
 * the tests compare with tolerances). */
void simt_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
	static bool ready;
	if (!ready) {
		init16();
		ready = true;
	}
	mma_run<16, bf16_elem>(d, a, b, a16_src, b16_src);
}
