/*
 * wgmma.cpp - the emulator's warpgroup tensor-core instructions (simt.h, for
 * kernels/cuda/wgmma.cuh): wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3 with A and B
 * from shared-memory descriptors, wgmma.fence, wgmma.commit_group and wgmma.wait_group.
 *
 * Written from the PTX ISA (docs.nvidia.com/cuda/parallel-thread-execution, its 9.0 text):
 *   - 9.7.15.5.1.2.2 "Matrix Descriptor Format": start address, leading and stride byte
 *     offsets each (x & 0x3FFFF) >> 4 in bits 0-13, 16-29 and 32-45; base offset in bits
 *     49-51; swizzle mode in bits 62-63 (1: 128-byte). Only what the kernels use is
 *     emulated: the 128-byte swizzle with base offset 0 (the atoms on 1024-byte boundaries);
 *     any other descriptor aborts.
 *   - 9.7.15.5.1.2 "Shared Memory Matrix Layout", K-major, 128-byte swizzle: the canonical
 *     layout Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)), T = 16 one-byte elements.
 *     So element (row r, k) of an operand is at start + (r / 8) SBO + (r % 8) 128 + k, and
 *     Swizzle<3,4,3> XORs that address's bits 4-6 with its bits 7-9 (we read the swizzle as
 *     one of the address, which is what "base offset 0 when the pattern starts on a
 *     1024-byte boundary" implies; it is also why a k slice is picked by adding 32 bytes to
 *     the start address). LBO is unused for swizzled K-major layouts.
 *   - 9.7.15.5.1.1.3 "Matrix Fragments for wgmma.mma_async.m64nNk32": the f32 accumulator
 *     is N/2 registers a thread. The layout is a figure (153) in the document; we read it as
 *     the figures for the other shapes draw it: warp w of the warpgroup holds rows 16 w ..
 *     16 w + 15; lane l (g = l / 4, q = l % 4), register i holds row 16 w + g + 8 ((i / 2) %
 *     2), column 8 (i / 4) + 2 q + i % 2 (the mma.m16n8 accumulator repeated every 8
 *     columns).
 *   - "wgmma.mma_async": D = A . B + D, or A . B when scale-d is false; A is M x K
 *     row-major (K-major), B K x N column-major (K-major); asynchronous: its registers and
 *     shared memory may be accessed only after a wgmma.wait_group retires its group, and
 *     wgmma.fence must come before the first wgmma and between a register access and a
 *     wgmma that uses the register.
 *
 * How it runs: a wgmma call only records the operation (the thread's accumulator array, the
 * descriptors, scale-d) in the thread's open group, after checking that the warp's 32 lanes
 * issued it with the same descriptors and that the thread called wgmma.fence since its last
 * wait. wgmma.wait_group computes the retired operations then, in order: each thread its own
 * N/2 elements of D, reading A and B from shared memory as they are AT THE WAIT. So a kernel
 * that reads its accumulators before the wait sees old values, one that refills a stage
 * before the wait feeds the new bytes, and a missing commit or wait drops the result: each
 * fails the test. Each element's 32 products (exact in double: e4m3 x e4m3 has at most 8
 * significant bits) are summed exactly, added to D in double and rounded once to f32; the
 * hardware accumulates FP8 products with fewer bits, so results differ in the low bits.
 *
 * What it cannot prove: if we misread the document (the swizzle, the descriptor's fields,
 * the accumulator figure), emulator and kernel agree and are both wrong; the GPU run of
 * scripts/gpu-check is the judge. Nor does it model the async proxy: a missing
 * fence.proxy.async passes here.
 */
#include "simt.h"

#include <stdio.h>
#include <stdlib.h>
#include <vector>

enum { MAX_THREADS = 1024 };

struct wgmma_op {
	float *d;
	int n;
	uint64_t da, db;
	int scale_d;
};

/* one thread's wgmma state; reset lazily when a new block starts */
struct wg_thread {
	unsigned long serial;
	bool fenced;
	std::vector<wgmma_op> ops;      /* recorded, not yet computed */
	std::vector<size_t> group_ends; /* committed group k: ops[..group_ends[k]) */
};
static wg_thread threads[MAX_THREADS];
static float e4m3[256];

[[noreturn]] static void fail(const char *what)
{
	fprintf(stderr, "simt: wgmma: %s (block %u,%u,%u, thread %d)\n", what, blockIdx.x,
		blockIdx.y, blockIdx.z, simt_thread_index());
	abort();
}

static wg_thread &me(void)
{
	wg_thread &t = threads[simt_thread_index()];
	if (t.serial != simt_block_serial()) { /* a returned thread's pending work never lands */
		t.serial = simt_block_serial();
		t.fenced = false;
		t.ops.clear();
		t.group_ends.clear();
	}
	return t;
}

/* The accumulator fragment: register i of lane `lane` of warp w (of the warpgroup). */
static void d_at(int w, int lane, int i, int *row, int *col)
{
	int g = lane >> 2, q = lane & 3;
	*row = 16 * w + g + 8 * ((i >> 1) & 1);
	*col = 8 * (i >> 2) + 2 * q + (i & 1);
}

/* Once a process: the e4m3 table, and the check that the fragment map covers a 64 x 256 D
 * exactly once (a slip in d_at would otherwise leave holes). */
static void init(void)
{
	static int seen[64][256];
	for (int w = 0; w < 4; w++)
		for (int lane = 0; lane < 32; lane++)
			for (int i = 0; i < 128; i++) {
				int r, c;
				d_at(w, lane, i, &r, &c);
				if (r < 0 || r >= 64 || c < 0 || c >= 256)
					fail("the accumulator map leaves the matrix");
				seen[r][c]++;
			}
	for (int r = 0; r < 64; r++)
		for (int c = 0; c < 256; c++)
			if (seen[r][c] != 1)
				fail("the accumulator map does not cover D exactly once");
	for (int v = 0; v < 256; v++)
		e4m3[v] = dt_e4m3_to_f32((uint8_t)v);
}

/* The 32 bytes (k = 0..31) of row r of the operand that desc describes. */
static void operand_row(uint64_t desc, int r, uint8_t out[32])
{
	uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
	uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
	if ((desc >> 62) != 1 || ((desc >> 49) & 7) != 0)
		fail("only the 128-byte swizzle with base offset 0 is emulated");
	for (int k = 0; k < 32; k++) {
		uint32_t a = start + (uint32_t)(r >> 3) * sbo + (uint32_t)(r & 7) * 128 + (uint32_t)k;
		a ^= ((a >> 7) & 7) << 4;
		out[k] = *(const uint8_t *)simt_smem_ptr(a, 1);
	}
}

static void compute(const wgmma_op &op)
{
	int t = simt_thread_index(), w = (t >> 5) & 3, lane = t & 31;
	uint8_t arow[2][32], brow[32];
	int r0, c;
	d_at(w, lane, 0, &r0, &c);
	operand_row(op.da, r0, arow[0]);
	operand_row(op.da, r0 + 8, arow[1]);
	for (int i = 0; i < op.n / 2; i++) {
		int r;
		d_at(w, lane, i, &r, &c);
		operand_row(op.db, c, brow);
		const uint8_t *a = arow[r == r0 ? 0 : 1];
		double s = 0;
		for (int k = 0; k < 32; k++)
			s += (double)e4m3[a[k]] * e4m3[brow[k]];
		op.d[i] = (float)(op.scale_d ? s + op.d[i] : s);
	}
}

void simt_wgmma_fence(void)
{
	me().fenced = true;
}

void simt_wgmma_e4m3(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
	static bool ready;
	if (!ready) {
		init();
		ready = true;
	}
	if (n < 8 || n > 256 || n % 8 != 0)
		fail("an N that m64nNk32 does not have");
	if ((blockDim.x * blockDim.y * blockDim.z) % 128 != 0)
		fail("wgmma in a block that is not whole warpgroups");
	wg_thread &t = me();
	if (!t.fenced)
		fail("wgmma.mma_async without a wgmma.fence since the last wait");
	uint64_t mine[2] = {desc_a, desc_b}, all[32][2];
	if (simt_warp_gather(mine, all, sizeof mine) != 32)
		fail("wgmma in a warp of fewer than 32 threads");
	for (int l = 0; l < 32; l++)
		if (all[l][0] != desc_a || all[l][1] != desc_b)
			fail("the lanes of a warp gave different descriptors");
	t.ops.push_back({d, n, desc_a, desc_b, scale_d});
}

void simt_wgmma_commit(void)
{
	wg_thread &t = me();
	t.group_ends.push_back(t.ops.size());
}

void simt_wgmma_wait(int pending)
{
	wg_thread &t = me();
	t.fenced = false;
	size_t groups = t.group_ends.size();
	if (pending < 0 || groups <= (size_t)pending)
		return;
	size_t done = groups - (size_t)pending, end = t.group_ends[done - 1];
	for (size_t i = 0; i < end; i++)
		compute(t.ops[i]);
	t.ops.erase(t.ops.begin(), t.ops.begin() + (long)end);
	t.group_ends.erase(t.group_ends.begin(), t.group_ends.begin() + (long)done);
	for (size_t &e : t.group_ends)
		e -= end;
}
