/*
 * wgmma.cpp - the emulator's Hopper instructions (simt.h, for kernels/cuda/wgmma.cuh):
 * wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3 and m64nNk16.f32.bf16.bf16 with A and
 * B from shared-memory descriptors (both K-major), wgmma.fence, wgmma.commit_group and
 * wgmma.wait_group; and, at the end,
 * mbarriers, cp.async.bulk.tensor.2d (loads, multicast too, and the bulk-group store) and
 * the driver's cuTensorMapEncodeTiled.
 *
 * Written from the PTX ISA (docs.nvidia.com/cuda/parallel-thread-execution, its 9.0 text):
 *   - 9.7.15.5.1.2.2 "Matrix Descriptor Format": start address, leading and stride byte
 *     offsets each (x & 0x3FFFF) >> 4 in bits 0-13, 16-29 and 32-45; base offset in bits
 *     49-51; swizzle mode in bits 62-63 (1: 128-byte). Only what the kernels use is
 *     emulated: the 128-byte swizzle with base offset 0 (the atoms on 1024-byte boundaries);
 *     any other descriptor aborts.
 *   - 9.7.15.5.1.2 "Shared Memory Matrix Layout", K-major, 128-byte swizzle: the canonical
 *     layout Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)), T = 16 one-byte elements
 *     (e4m3) or T = 8 two-byte ones (bf16): the same bytes either way, 128 a row.
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
 *     columns). The bf16 form m64nNk16 is read with the same D fragment (the ISA draws D
 *     of m64nNk16 as of m64nNk32) and its k16 slice as the 32 bytes of the e4m3 one's k32.
 *   - "wgmma.mma_async": D = A . B + D, or A . B when scale-d is false; A is M x K
 *     row-major (K-major), B K x N column-major (K-major); asynchronous: its registers and
 *     shared memory may be accessed only after a wgmma.wait_group retires its group, and
 *     wgmma.fence must come before the first wgmma and between a register access and a
 *     wgmma that uses the register.
 *   - "Register fragment for matrix A" (.bf16, m64nNk16, the RS form: A from registers, B
 *     from a descriptor): warp w holds rows 16 w .. + 15 as mma.sync m16n8k16's A, lane
 *     4 g + q: register 0 row g, columns 2 q, 2 q + 1 (the lower half first), register 1
 *     row g + 8, registers 2 and 3 the same rows at columns 2 q + 8, 2 q + 9 (cute's
 *     ALayout_64x16 says the same). The registers are read at the issue (gathered from the
 *     warp's lanes) and must be unchanged at the retiring wait: each thread's are compared
 *     there, and a change aborts by name.
 *
 * How it runs: a wgmma call only records the operation (the thread's accumulator array, the
 * descriptors, scale-d) in the thread's open group, after checking that the warp's 32 lanes
 * issued it with the same descriptors and that the thread called wgmma.fence since its last
 * wait. wgmma.wait_group computes the retired operations then, in order: each thread its own
 * N/2 elements of D, reading A and B from shared memory as they are AT THE WAIT. So a kernel
 * that reads its accumulators before the wait sees old values, and a missing commit or wait
 * drops the result: each fails the test. The hardware may read the operands at any time
 * between the issue and the wait, so the products are also computed AT THE ISSUE and the
 * wait aborts when shared memory gave other ones: a stage refilled, or a tile rewritten,
 * before the wait, and one issued before every thread finished writing it (a missing
 * barrier, as far as the scheduler's warp orders expose it), are reported by name. Each element's 32 e4m3 products (exact in double: e4m3 x e4m3 has at most
 * 8 significant bits) are summed exactly, added to D in double and rounded once to f32; the
 * hardware accumulates FP8 products with fewer bits, so results differ in the low bits.
 * The 16 bf16 products of an m64nNk16 (16 significant bits each) are summed in double the
 * same way (exact unless their exponents spread over more than ~37 binades) and rounded
 * once; the hardware's order and rounding inside one bf16 wgmma are not modelled either.
 *
 * What it cannot prove: if we misread the document (the swizzle, the descriptor's fields,
 * the accumulator figure), emulator and kernel agree and are both wrong; the GPU run of
 * scripts/gpu-check is the judge. Nor does it model the async proxy: a missing
 * fence.proxy.async passes here. For bf16 in particular it cannot tell whether the
 * hardware wants the imm-trans flags we pass (0: both K-major) or whether T = 8 two-byte
 * elements really puts a bf16 row's k16 slices 32 bytes apart under the 128-byte swizzle:
 * both are our reading, and a wrong one would show only on a GPU.
 */
#include "simt.h"
#include "cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <map>
#include <vector>

enum { MAX_THREADS = 1024 };

enum wgmma_type { WG_E4M3, WG_BF16 }; /* A's and B's element type */

struct wgmma_op {
	float *d;
	int n;
	uint64_t da, db;
	int scale_d;
	wgmma_type type;
	std::vector<double> at_issue; /* A . B from shared memory as it was at the issue */
	std::vector<uint8_t> rows;     /* and the operand rows it came from (operand_bytes) */
	const uint32_t *areg;          /* A from registers (RS): this thread's 4, else NULL */
	uint32_t aval[4];              /* and their values at the issue */
};

/* one thread's wgmma state; reset lazily when a new block starts in its slot */
struct wg_thread {
	unsigned long serial;
	bool fenced;
	std::vector<wgmma_op> ops;      /* recorded, not yet computed */
	std::vector<size_t> group_ends; /* committed group k: ops[..group_ends[k]) */
};
static wg_thread threads[SIMT_SLOTS][MAX_THREADS]; /* by the block's slot: a cluster's CTAs */
static float e4m3[256];

[[noreturn]] static void fail(const char *what)
{
	fprintf(stderr, "simt: wgmma: %s (block %u,%u,%u, thread %d)\n", what, blockIdx.x,
		blockIdx.y, blockIdx.z, simt_thread_index());
	abort();
}

static wg_thread &me(void)
{
	wg_thread &t = threads[simt_block_slot()][simt_thread_index()];
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

/* The 32 bytes (k = 0..31) of row r of the operand that desc describes. The window is
 * checked once for the span they cover (one byte outside it fails as before): a 16-byte
 * chunk on a 16-byte boundary stays whole under the swizzle (it moves bits 4-6 only), and
 * any other row's 32 addresses lie within 144 bytes of each other. */
static void operand_row(uint64_t desc, int r, uint8_t out[32])
{
	uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
	uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
	if ((desc >> 62) != 1 || ((desc >> 49) & 7) != 0)
		fail("only the 128-byte swizzle with base offset 0 is emulated");
	uint32_t base = start + (uint32_t)(r >> 3) * sbo + (uint32_t)(r & 7) * 128;
	auto swz = [](uint32_t a) { return a ^ ((a >> 7) & 7) << 4; };
	if (base % 16 == 0) {
		uint32_t a0 = swz(base), a1 = swz(base + 16);
		uint32_t lo = a0 < a1 ? a0 : a1, hi = (a0 < a1 ? a1 : a0) + 15;
		if (lo >> 24 == hi >> 24) {
			const uint8_t *p = (const uint8_t *)simt_smem_ptr(lo, hi - lo + 1);
			memcpy(out, p + (a0 - lo), 16);
			memcpy(out + 16, p + (a1 - lo), 16);
			return;
		}
	}
	uint32_t at[32], lo = UINT32_MAX, hi = 0;
	for (int k = 0; k < 32; k++) {
		at[k] = swz(base + (uint32_t)k);
		lo = at[k] < lo ? at[k] : lo;
		hi = at[k] > hi ? at[k] : hi;
	}
	if (lo >> 24 != hi >> 24) { /* across a CTA's address range: byte by byte, as it fails */
		for (int k = 0; k < 32; k++)
			out[k] = *(const uint8_t *)simt_smem_ptr(at[k], 1);
		return;
	}
	const uint8_t *p = (const uint8_t *)simt_smem_ptr(lo, hi - lo + 1);
	for (int k = 0; k < 32; k++)
		out[k] = p[at[k] - lo];
}

/* The k values of a row's 32 bytes, by element type: 32 e4m3, or 16 bf16 (little-endian
 * pairs; k16). Returns how many. */
static int row_values(const uint8_t b[32], wgmma_type type, double out[32])
{
	if (type == WG_E4M3) {
		for (int k = 0; k < 32; k++)
			out[k] = e4m3[b[k]];
		return 32;
	}
	for (int k = 0; k < 16; k++) {
		uint32_t u = (uint32_t)(b[2 * k] | b[2 * k + 1] << 8) << 16;
		float f;
		memcpy(&f, &u, 4);
		out[k] = f;
	}
	return 16;
}

/* The operand rows the thread's n / 2 elements of D use, as shared memory holds them now:
 * A's rows r0 and r0 + 8, then B's rows (D's columns) in pairs c, c + 1 for registers
 * 4j .. 4j + 3, which are columns c, c + 1, c, c + 1 (d_at); (2 + n / 4) x 32 bytes. */
static void operand_bytes(const wgmma_op &op, uint8_t *rows)
{
	int t = simt_thread_index(), w = (t >> 5) & 3, lane = t & 31, r0, c;
	d_at(w, lane, 0, &r0, &c);
	if (op.areg) { /* A's two rows, as the warp's registers gave them at the issue */
		if (rows != op.rows.data())
			memcpy(rows, op.rows.data(), 64);
	} else {
		operand_row(op.da, r0, rows);
		operand_row(op.da, r0 + 8, rows + 32);
	}
	for (int j = 0; j < op.n / 8; j++) {
		d_at(w, lane, 4 * j, &r0, &c);
		operand_row(op.db, c, rows + 64 + 64 * j);
		operand_row(op.db, c + 1, rows + 96 + 64 * j);
	}
}

/* The thread's n / 2 elements of A . B from operand_bytes' rows, into s. */
static void products(const wgmma_op &op, const uint8_t *rows, double *s)
{
	double arow[2][32], brow[2][32];
	int kn = row_values(rows, op.type, arow[0]);
	row_values(rows + 32, op.type, arow[1]);
	for (int i = 0; i < op.n / 2; i++) {
		if (i % 4 == 0) {
			row_values(rows + 64 + 16 * i, op.type, brow[0]);
			row_values(rows + 96 + 16 * i, op.type, brow[1]);
		}
		/* register i: A's row r0 + 8 ((i / 2) % 2), column c + i % 2 (d_at) */
		const double *a = arow[(i >> 1) & 1], *b = brow[i & 1];
		double sum = 0;
		for (int k = 0; k < kn; k++)
			sum += a[k] * b[k];
		s[i] = sum;
	}
}

/* At the wait: the products from shared memory as it is now, against those at the issue
 * (the same bytes give the same products, so only changed bytes are multiplied again). */
static void compute(const wgmma_op &op)
{
	double s[128];
	uint8_t rows[(2 + 256 / 4) * 32];
	operand_bytes(op, rows);
	const double *now = op.at_issue.data();
	if (memcmp(rows, op.rows.data(), op.rows.size()) != 0) {
		products(op, rows, s);
		now = s;
	}
	if (op.areg && memcmp(op.areg, op.aval, sizeof op.aval) != 0)
		fail("a wgmma's A registers changed between its issue and the wait that retired it "
		     "(the tensor cores may read them at any time in between)");
	for (int i = 0; i < op.n / 2; i++) {
		if (memcmp(&now[i], &op.at_issue[i], sizeof now[i]) != 0)
			fail("a wgmma's operands in shared memory changed between its issue and the "
			     "wait that retired it (the tensor cores may read them at any time in "
			     "between)");
		op.d[i] = (float)(op.scale_d ? now[i] + op.d[i] : now[i]);
	}
}

void simt_wgmma_fence(void)
{
	me().fenced = true;
}

/* A's rows r0 and r0 + 8 of this thread's warp slice (r0 = the lane's g) from the warp's A
 * registers (all: 4 a lane), as operand_row gives a descriptor's rows: 16 bf16 a row,
 * little-endian. Lane 4 g + q holds columns 2 q, 2 q + 1 in registers 0 (row g) and 1
 * (row g + 8), and 2 q + 8, 2 q + 9 in registers 2 and 3, the lower column in the lower
 * half. */
static void rows_from_regs(const uint32_t all[32][4], int lane, uint8_t out[64])
{
	int g = lane >> 2;
	for (int half = 0; half < 2; half++)
		for (int q = 0; q < 4; q++)
			for (int hi8 = 0; hi8 < 2; hi8++) {
				uint32_t v = all[4 * g + q][half + 2 * hi8];
				int k = 2 * q + 8 * hi8;
				uint8_t *p = out + 32 * half + 2 * k;
				p[0] = (uint8_t)v;
				p[1] = (uint8_t)(v >> 8);
				p[2] = (uint8_t)(v >> 16);
				p[3] = (uint8_t)(v >> 24);
			}
}

static void issue(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d,
		  wgmma_type type, const uint32_t *areg = NULL)
{
	static bool ready;
	if (!ready) {
		init();
		ready = true;
	}
	if (n < 8 || n > 256 || n % 8 != 0)
		fail("an N that m64nNk32 / m64nNk16 does not have");
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
	uint32_t aregs[4] = {0, 0, 0, 0}, alla[32][4];
	if (areg) {
		memcpy(aregs, areg, sizeof aregs);
		simt_warp_gather(aregs, alla, sizeof aregs);
	}
	t.ops.push_back({d, n, desc_a, desc_b, scale_d, type, std::vector<double>((size_t)n / 2),
			 std::vector<uint8_t>((size_t)(2 + n / 4) * 32), areg,
			 {aregs[0], aregs[1], aregs[2], aregs[3]}});
	wgmma_op &op = t.ops.back();
	if (areg)
		rows_from_regs(alla, simt_thread_index() & 31, op.rows.data());
	operand_bytes(op, op.rows.data());
	products(op, op.rows.data(), op.at_issue.data());
}

void simt_wgmma_e4m3(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
	issue(d, n, desc_a, desc_b, scale_d, WG_E4M3);
}

void simt_wgmma_bf16(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d)
{
	issue(d, n, desc_a, desc_b, scale_d, WG_BF16);
}

void simt_wgmma_bf16_rs(float *d, int n, const uint32_t *a, uint64_t desc_b, int scale_d)
{
	issue(d, n, 0, desc_b, scale_d, WG_BF16, a);
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

/* ---- mbarriers, the bulk tensor copy and its tensor map ---------------------------------
 *
 * From the PTX ISA's "mbarrier" section: an mbarrier counts pending arrivals (from its init
 * count) and a transaction count (bytes expected by arrive.expect_tx, less those delivered
 * by complete_tx); when both are 0 its current phase completes and the next begins with the
 * init count. try_wait.parity(P) succeeds when the phase of parity P has completed, i.e. the
 * current phase's parity is not P (so on a fresh barrier, P = 1 succeeds at once). From
 * "cp.async.bulk.tensor" and the driver's cuTensorMapEncodeTiled: the box at (c0, c1) of a
 * 2-D tensor is copied to shared memory row after row (boxDim[0] bytes a row here, one-byte
 * elements), elements outside the tensor as zeros, the whole box's bytes counted to the
 * mbarrier; with the 128-byte swizzle, the destination is 1024-byte aligned and each 16-byte
 * chunk's address has bits 4-6 XORed with bits 7-9 (the same Swizzle<3,4,3> as the wgmma
 * layout above; our reading). A copy is recorded on its mbarrier and lands when a thread
 * next waits on that mbarrier: so bytes read before the wait are still poison. In a
 * cluster, mbarriers and copies are per CTA (by the block's slot, simt.h): a shared::cluster
 * address names a peer's, a multicast copy is one copy per CTA of its mask, and since a
 * peer's bytes may complete before this CTA's arrive.expect_tx, the transaction count may go
 * below 0 (the ISA's range: down to -(2^20 - 1)). Only what gemm_wgmma.cu uses is here;
 * anything else aborts. */

struct tmap { /* the emulator's CUtensorMap contents */
	const uint8_t *base;
	uint64_t dim[2], stride; /* dim in elements, stride in bytes */
	uint32_t box[2];         /* in elements */
	int swizzle;
	uint32_t esize; /* bytes an element: 1 (UINT8) or 4 (FLOAT32) */
};
static_assert(sizeof(tmap) <= sizeof(CUtensorMap), "a tensor map holds a tmap");

struct tma_copy {
	uint32_t dst; /* a shared::cluster address (simt_mapa's) for a multicast's */
	tmap map;
	int c0, c1;
};

struct mbar {
	unsigned count, pending;
	long tx;
	unsigned phase;
	std::vector<tma_copy> copies; /* not yet landed */
};

/* each slot's block's mbarriers, by offset in its shared memory */
static std::map<uint32_t, mbar> mbars[SIMT_SLOTS];
static unsigned long mbars_serial[SIMT_SLOTS];

/* The mbarrier at bar: a shared::cta address (the running block's) or a shared::cluster one
 * (simt_mapa's: a peer's, or its own). */
static mbar &mbar_at(uint32_t bar, bool init)
{
	(void)simt_block_serial(); /* not in an interleaved launch */
	uint32_t off;
	int slot = simt_smem_slot(bar, &off);
	if (mbars_serial[slot] != simt_slot_serial(slot)) { /* they live in a block's shared memory */
		mbars[slot].clear();
		mbars_serial[slot] = simt_slot_serial(slot);
	}
	if (off % 8 != 0)
		fail("an mbarrier not 8-byte aligned");
	simt_smem_ptr(bar, 8); /* inside the shared memory */
	auto it = mbars[slot].find(off);
	if (it == mbars[slot].end() && !init)
		fail("an mbarrier used before mbarrier.init");
	return mbars[slot][off];
}

static void complete_if_done(mbar &b)
{
	if (b.pending == 0 && b.tx == 0) {
		b.phase++;
		b.pending = b.count;
		simt_progress();
	}
}

static void land(mbar &b)
{
	for (const tma_copy &c : b.copies) {
		const tmap &m = c.map;
		uint32_t bytes = m.box[0] * m.box[1] * m.esize;
		uint8_t *smem = (uint8_t *)simt_smem_ptr(c.dst, bytes);
		for (uint32_t r = 0; r < m.box[1]; r++)
			for (uint32_t k = 0; k < m.box[0] * m.esize; k++) {
				int64_t x = (int64_t)c.c0 + k / m.esize, y = (int64_t)c.c1 + r;
				bool in = x >= 0 && y >= 0 && (uint64_t)x < m.dim[0] && (uint64_t)y < m.dim[1];
				uint32_t a = c.dst + r * m.box[0] * m.esize + k;
				if (m.swizzle)
					a ^= ((a >> 7) & 7) << 4;
				smem[a - c.dst] =
					in ? m.base[(uint64_t)y * m.stride + (uint64_t)x * m.esize + k % m.esize]
					   : 0;
			}
		b.tx -= (long)bytes;
	}
	b.copies.clear();
	/* a copy may complete before its bytes are expected (a peer's multicast before this
	 * CTA's arrive.expect_tx): the count may go below 0, down to -(2^20 - 1) */
	if (b.tx < -((1l << 20) - 1))
		fail("an mbarrier's transaction count below -(2^20 - 1)");
	complete_if_done(b);
}

void simt_mbar_init(uint32_t bar, unsigned count)
{
	if (bar >> 24)
		fail("mbarrier.init.shared::cta of a shared::cluster address");
	if (count == 0)
		fail("mbarrier.init with a count of 0");
	mbar &b = mbar_at(bar, true);
	b = mbar{count, count, 0, 0, {}};
}

void simt_mbar_arrive(uint32_t bar, unsigned tx)
{
	mbar &b = mbar_at(bar, false);
	if (b.pending == 0)
		fail("an arrival on an mbarrier with none pending");
	b.tx += tx;
	b.pending--;
	simt_progress();
	complete_if_done(b);
}

void simt_mbar_wait(uint32_t bar, unsigned parity)
{
	for (;;) {
		mbar &b = mbar_at(bar, false);
		land(b);
		if ((b.phase & 1) != (parity & 1))
			return;
		simt_yield();
	}
}

void simt_tma_load_2d(uint32_t dst, const void *map, int c0, int c1, uint32_t bar)
{
	tma_copy c;
	memcpy(&c.map, map, sizeof c.map);
	if (!c.map.base)
		fail("cp.async.bulk.tensor with a tensor map cuTensorMapEncodeTiled did not fill");
	if (c.map.swizzle && dst % 1024 != 0)
		fail("a 128-byte-swizzled bulk tensor copy to shared memory not 1024-byte aligned");
	if (dst % 128 != 0)
		fail("a bulk tensor copy to shared memory not 128-byte aligned");
	c.dst = dst;
	c.c0 = c0;
	c.c1 = c1;
	mbar_at(bar, false).copies.push_back(c);
}

void simt_tma_load_2d_mc(uint32_t dst, const void *map, int c0, int c1, uint32_t bar,
			 uint16_t mask)
{
	if (mask == 0)
		fail("a multicast bulk tensor copy to no CTA");
	for (unsigned r = 0; r < 16; r++)
		if (mask >> r & 1) /* simt_mapa aborts for a rank the cluster does not have */
			simt_tma_load_2d(simt_mapa(dst, r), map, c0, c1, simt_mapa(bar, r));
}

/* ---- the bulk tensor store: cp.async.bulk.tensor.2d.global.shared::cta.bulk_group --------
 *
 * From "cp.async.bulk.tensor" (.global.shared::cta): the box at (c0, c1) is written to the
 * tensor from shared memory laid out as a load's destination (box row r at r times the
 * box's row bytes, 16-byte chunks swizzled the same way with the 128-byte swizzle), and
 * elements outside the tensor are not written; "cp.async.bulk.commit_group" and
 * "cp.async.bulk.wait_group" (.read: until the groups have read their shared memory) make
 * a thread's bulk groups, as cp.async's. Here a store records its box's shared-memory bytes
 * at the issue and does everything when a wait retires its group: it reads the shared
 * memory again, aborting if it changed since the issue (so a staging area rewritten before
 * the wait_group.read that frees it, or a store issued before every thread had written its
 * part, as far as the warp orders expose it, is named), and writes global memory. A store
 * never waited for never lands, and a thread returning with one aborts. The async proxy
 * (the fence.proxy.async before the barrier) is not modelled. */

struct bulk_store {
	tmap map;
	int c0, c1;
	uint32_t src;
	std::vector<uint8_t> at_issue; /* the box's shared-memory bytes when it was issued */
};

struct bulk_thread {
	unsigned long serial;
	std::vector<bulk_store> open;                /* issued since the last commit */
	std::vector<std::vector<bulk_store>> groups; /* committed, oldest first */
};
static bulk_thread bulk_threads[SIMT_SLOTS][MAX_THREADS];

static bulk_thread &bulk_me(void)
{
	bulk_thread &t = bulk_threads[simt_block_slot()][simt_thread_index()];
	if (t.serial != simt_block_serial()) {
		t.serial = simt_block_serial();
		t.open.clear();
		t.groups.clear();
	}
	return t;
}

static void bulk_land(const bulk_store &b)
{
	const tmap &m = b.map;
	uint32_t row = m.box[0] * m.esize, bytes = row * m.box[1];
	const uint8_t *smem = (const uint8_t *)simt_smem_ptr(b.src, bytes);
	if (memcmp(smem, b.at_issue.data(), bytes) != 0)
		fail("the shared memory of a bulk tensor store changed between its issue and the "
		     "cp.async.bulk.wait_group that retired it");
	uint8_t *base = (uint8_t *)m.base;
	for (uint32_t r = 0; r < m.box[1]; r++)
		for (uint32_t k = 0; k < m.box[0]; k++) {
			int64_t x = (int64_t)b.c0 + k, y = (int64_t)b.c1 + r;
			if (x < 0 || y < 0 || (uint64_t)x >= m.dim[0] || (uint64_t)y >= m.dim[1])
				continue;
			uint32_t a = b.src + r * row + k * m.esize;
			if (m.swizzle)
				a ^= ((a >> 7) & 7) << 4;
			memcpy(base + (uint64_t)y * m.stride + (uint64_t)x * m.esize, smem + (a - b.src),
			       m.esize);
		}
}

void simt_tma_store_2d(const void *map, int c0, int c1, uint32_t src)
{
	bulk_store b;
	memcpy(&b.map, map, sizeof b.map);
	if (!b.map.base)
		fail("cp.async.bulk.tensor with a tensor map cuTensorMapEncodeTiled did not fill");
	if (src >> 24)
		fail("a bulk tensor store from a shared::cluster address");
	if (b.map.swizzle && src % 1024 != 0)
		fail("a 128-byte-swizzled bulk tensor store from shared memory not 1024-byte aligned");
	if (src % 128 != 0)
		fail("a bulk tensor store from shared memory not 128-byte aligned");
	uint32_t bytes = b.map.box[0] * b.map.box[1] * b.map.esize;
	const uint8_t *smem = (const uint8_t *)simt_smem_ptr(src, bytes);
	b.at_issue.assign(smem, smem + bytes);
	b.c0 = c0;
	b.c1 = c1;
	b.src = src;
	bulk_me().open.push_back(std::move(b));
}

void simt_bulk_commit(void)
{
	bulk_thread &t = bulk_me();
	t.groups.push_back(std::move(t.open));
	t.open.clear();
}

void simt_bulk_wait(int pending, bool read)
{
	(void)read; /* the global writes land with the reads: nothing in the kernel sees them */
	bulk_thread &t = bulk_me();
	while ((int)t.groups.size() > pending) {
		for (const bulk_store &b : t.groups.front())
			bulk_land(b);
		t.groups.erase(t.groups.begin());
	}
}

void simt_bulk_on_return(void)
{
	bulk_thread &t = bulk_threads[simt_block_slot()][simt_thread_index()];
	if (t.serial == simt_block_serial() && (!t.open.empty() || !t.groups.empty()))
		fail("a thread returned with bulk tensor stores not waited for "
		     "(cp.async.bulk.wait_group)");
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
				cuuint32_t tensorRank, void *globalAddress,
				const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
				const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
				CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
				CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
	(void)l2Promotion;
	/* the driver's rules for what is used here: a 16-byte aligned address, strides
	 * multiples of 16 bytes, boxes of 1..256 elements, a 128-byte swizzle's inner box at
	 * most 128 bytes */
	uint32_t esize = tensorDataType == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 1;
	if ((tensorDataType != CU_TENSOR_MAP_DATA_TYPE_UINT8 &&
	     tensorDataType != CU_TENSOR_MAP_DATA_TYPE_FLOAT32) ||
	    tensorRank != 2 ||
	    interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || oobFill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ||
	    (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_128B) ||
	    (uintptr_t)globalAddress % 16 != 0 || globalStrides[0] % 16 != 0 ||
	    globalDim[0] == 0 || globalDim[1] == 0 || boxDim[0] == 0 || boxDim[0] > 256 ||
	    boxDim[1] == 0 || boxDim[1] > 256 || boxDim[0] * esize % 16 != 0 ||
	    (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && boxDim[0] * esize > 128) ||
	    elementStrides[0] != 1 ||
	    elementStrides[1] != 1)
		return CUDA_ERROR_INVALID_VALUE;
	tmap m = {(const uint8_t *)globalAddress, {globalDim[0], globalDim[1]}, globalStrides[0],
		  {boxDim[0], boxDim[1]}, swizzle == CU_TENSOR_MAP_SWIZZLE_128B, esize};
	memset(tensorMap, 0, sizeof *tensorMap);
	memcpy(tensorMap, &m, sizeof m);
	return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
					     unsigned long long flags,
					     cudaDriverEntryPointQueryResult *status)
{
	(void)version, (void)flags;
	bool found = strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
	*fn = found ? (void *)&cuTensorMapEncodeTiled : NULL;
	if (status)
		*status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

/* The runtime's multiprocessor count (simt.h), here as only gemm_wgmma.cu's persistent
 * kernel asks for it: 3, fewer than most tests' tiles, so its blocks loop over tiles; and
 * the clusters that fit on them (3 / the cluster's size: 1 of 2). */
cudaError_t simt_max_active_clusters(int *n, const cudaLaunchConfig_t *cfg)
{
	unsigned size = 1;
	for (unsigned i = 0; i < cfg->numAttrs; i++)
		if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension)
			size = cfg->attrs[i].val.clusterDim.x * cfg->attrs[i].val.clusterDim.y *
			       cfg->attrs[i].val.clusterDim.z;
	if (size == 0)
		return cudaErrorInvalidValue;
	*n = (int)(3 / size);
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
	(void)device;
	if (attr == cudaDevAttrMultiProcessorCount)
		*value = 3;
	else if (attr == cudaDevAttrL2CacheSize)
		*value = 512 << 10;
	else
		return cudaErrorInvalidValue;
	return cudaSuccess;
}
