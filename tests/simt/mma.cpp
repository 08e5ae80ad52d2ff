/*
 * mma.cpp - the emulator's tensor-core instruction (simt.h, for kernels/cuda/mma.cuh):
 * mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, D = A . B + C for one warp, A 16x32,
 * B 32x8, C and D 16x8.
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

/* Once a process: the inverse maps, and the check that each map reaches every element of
 * its matrix exactly once (a slip in the transcription above would otherwise leave holes
 * that read stale bytes). */
static void init(void)
{
	int na[16][32] = {}, nb[32][8] = {}, nc[16][8] = {};
	for (int lane = 0; lane < 32; lane++) {
		int r, c;
		for (int i = 0; i < 16; i++) {
			a_at(lane, i, &r, &c);
			na[r][c]++;
			a_src[r][c] = {(uint8_t)lane, (uint8_t)i};
		}
		for (int i = 0; i < 8; i++) {
			b_at(lane, i, &r, &c);
			nb[r][c]++;
			b_src[r][c] = {(uint8_t)lane, (uint8_t)i};
		}
		for (int i = 0; i < 4; i++) {
			c_at(lane, i, &r, &c);
			nc[r][c]++;
		}
	}
	for (int r = 0; r < 32; r++)
		for (int c = 0; c < 32; c++)
			if ((r < 16 && na[r][c] != 1) || (c < 8 && nb[r][c] != 1) ||
			    (r < 16 && c < 8 && nc[r][c] != 1))
				fail("a fragment map does not cover its matrix exactly once");
	for (int v = 0; v < 256; v++)
		e4m3[v] = dt_e4m3_to_f32((uint8_t)v);
}

void simt_mma_e4m3_16832(float d[4], const uint32_t a[4], const uint32_t b[2])
{
	static bool ready;
	if (!ready) {
		init();
		ready = true;
	}
	frag mine, all[32];
	memcpy(mine.a, a, sizeof mine.a);
	memcpy(mine.b, b, sizeof mine.b);
	if (simt_warp_gather(&mine, all, sizeof mine) != 32)
		fail("mma.sync in a warp of fewer than 32 threads");
	int lane = simt_lane();
	for (int i = 0; i < 4; i++) {
		int r, c;
		c_at(lane, i, &r, &c);
		double s = 0;
		for (int k = 0; k < 32; k++) {
			src x = a_src[r][k], y = b_src[k][c];
			s += (double)e4m3[elem(all[x.lane].a, x.i)] * e4m3[elem(all[y.lane].b, y.i)];
		}
		d[i] = (float)(s + d[i]);
	}
}
