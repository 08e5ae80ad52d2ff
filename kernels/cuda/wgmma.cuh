/*
 * wgmma.cuh - the Hopper (sm_90a) instructions of the wgmma GEMMs (gemm_wgmma.cu: e4m3 x
 * e4m3; gemm_fp8w.cu: bf16 x bf16), each behind a small device function: the warpgroup
 * matrix multiply from shared-memory descriptors (m64n128k32 and m64n160k32 e4m3,
 * m64n128k16 bf16), its fence / commit / wait, the proxy fence that orders ordinary
 * shared-memory writes before the tensor cores read them, and the shared-window address of
 * a pointer; plus what both GEMMs' tiles share: the 128-byte swizzle of a tile (wgmma_swz)
 * and the store of an m64nN accumulator fragment (wgmma_store_tile); the mbarriers and
 * tensor copies of the TMA kernels, the bulk tensor store and named barriers of the
 * TMA-store epilogue, and the cluster instructions of the 2-CTA one. Not for use outside
 * kernels/cuda/. The asynchronous copies that fill shared memory are mma.cuh's cp.async.
 *
 * On the device each is one PTX instruction (inline asm under __CUDA_ARCH__). Under the CPU
 * emulator (tests/simt, WICK_SIMT) each calls the emulator's version (tests/simt/wgmma.cpp),
 * written from the same PTX ISA sections: if our reading of them is wrong, kernel and
 * emulator are wrong together, and the GPU (scripts/gpu-check) is the judge.
 *
 * PTX ISA (9.0 text) sections followed:
 *   9.7.15.5.1.1.3  the accumulator fragment of wgmma.mma_async.m64nNk32 (f32: N/2 registers);
 *   9.7.15.5.1.2    shared-memory matrix layouts: K-major, 128-byte swizzle, the canonical
 *                   layout Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)) with T = 16
 *                   one-byte elements: a row of 128 bytes, 8 rows an atom of 1024 bytes, SBO
 *                   from one 8-row group to the next, LBO unused (1);
 *   9.7.15.5.1.2.2  the matrix descriptor (start, LBO, SBO encoded >> 4 in 14 bits each,
 *                   base offset bits 49-51, swizzle mode bits 62-63, 1 = 128B);
 *   "wgmma.mma_async" (D = A.B + D, or A.B when scale-d is false; A and B both from
 *                   descriptors, K-major: e4m3 has no transpose; .bf16 takes m64nNk16 and
 *                   the imm-trans-a / imm-trans-b operands, 0 for K-major), "wgmma.fence",
 *                   "wgmma.commit_group", "wgmma.wait_group" (same chapter, 9.7.15);
 *   "Register fragment for matrix A" (.bf16, m64nNk16): the RS form's A from registers,
 *                   mma.sync m16n8k16's A layout a warp (wgmma_m64n128k16_bf16_rs);
 *   "membar/fence"  fence.proxy.async: generic-proxy writes made visible to the async proxy,
 *                   through which the tensor cores read shared memory;
 *   "Cluster of Cooperative Thread Arrays", "mapa", "barrier.cluster", the special register
 *                   %cluster_ctarank, mbarrier.arrive's .shared::cluster form and
 *                   cp.async.bulk.tensor's .multicast::cluster (a ctaMask of 16 bits; the
 *                   copy lands at the same offset in each CTA of the mask and signals the
 *                   mbarrier at the same offset in each; an mbarrier's tx-count may go below
 *                   0 when bytes complete before they are expected).
 */
#ifndef WICK_WGMMA_CUH
#define WICK_WGMMA_CUH

#include <cuda.h> /* CUtensorMap: the type only; nothing links libcuda */
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh: wgmma needs sm_90a (the build targets -gencode arch=compute_90a,code=sm_90a)"
#endif

/* The shared-window address of a pointer into shared memory (what descriptors encode). */
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
#if defined(__CUDA_ARCH__)
	return (uint32_t)__cvta_generic_to_shared(p);
#elif defined(WICK_SIMT)
	return simt_smem_addr(p);
#else
	(void)p;
	return 0;
#endif
}

/* A K-major, 128-byte-swizzled shared-memory matrix descriptor: rows of 128 bytes (128 e4m3
 * along k), 8-row groups sbo bytes apart, starting at shared address addr (16-byte aligned;
 * the atoms themselves 1024-byte aligned, so the base offset is 0; addr may sit 32, 64 or
 * 96 bytes into a row to pick the k slice of one m64nNk32). */
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr, uint32_t sbo)
{
	return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) /* LBO: unused, 1 */
	       | ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)1 << 62); /* 128B swizzle */
}

/* Orders this thread's earlier register accesses before the warpgroup's next wgmma. */
__device__ __forceinline__ void wgmma_fence(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(WICK_SIMT)
	simt_wgmma_fence();
#endif
}

/* Closes the group of this warpgroup's wgmmas issued since the last commit. */
__device__ __forceinline__ void wgmma_commit(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(WICK_SIMT)
	simt_wgmma_commit();
#endif
}

/* Waits until at most N of this warpgroup's committed groups are pending: only then are the
 * accumulators of the others readable, and their shared memory free to overwrite. */
template <int N> __device__ __forceinline__ void wgmma_wait(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(WICK_SIMT)
	simt_wgmma_wait(N);
#endif
}

/* Makes this thread's earlier ordinary (generic-proxy) shared-memory writes, cp.async's
 * included, visible to the async proxy: before a barrier after which wgmma reads them. */
__device__ __forceinline__ void fence_proxy_async(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Keeps the compiler from moving accesses of the accumulators across a wgmma fence/wait. */
__device__ __forceinline__ void wgmma_reg_fence(float &r)
{
#if defined(__CUDA_ARCH__)
	asm volatile("" : "+f"(r)::"memory");
#else
	(void)r;
#endif
}

/* The 64 f32 accumulators of an m64n128 wgmma as inline-asm operands %0..%63, and their
 * list in the instruction's text: shared by the e4m3 and bf16 forms below. */
#define WGMMA_D64_TEXT                                                                      \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
	"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "      \
	"%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "      \
	"%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "      \
	"%61, %62, %63}"
#define WGMMA_D64_OPS(d)                                                                    \
	"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),  \
	"+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),         \
	"+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),      \
	"+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
	"+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),      \
	"+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),      \
	"+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),      \
	"+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
	"+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),      \
	"+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),      \
	"+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* The same for the 80 f32 accumulators of an m64n160 wgmma: %0..%79. */
#define WGMMA_D80_TEXT                                                                      \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
	"%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "  \
	"%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "  \
	"%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "  \
	"%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"
#define WGMMA_D80_OPS(d)                                                                    \
	"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),             \
	"+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),           \
	"+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),       \
	"+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),       \
	"+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),       \
	"+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),       \
	"+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),       \
	"+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),       \
	"+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),       \
	"+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),       \
	"+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),       \
	"+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),       \
	"+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),       \
	"+f"(d[78]), "+f"(d[79])

/* d[64x128] (f32, this thread's 64 of them) = A[64x32] . B[128x32]^T (+ d when scale_d),
 * e4m3 x e4m3, A and B from descriptors (K-major). Issued by all 128 threads of a warpgroup
 * with the same descriptors; asynchronous: d and the shared memory may be touched only
 * after wgmma_commit and a wgmma_wait that retires it. The accumulator fragment (PTX ISA
 * 9.7.15.5.1.1.3): warp w of the warpgroup, lane l, g = l / 4, q = l % 4, register i:
 *   row 16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 q + i % 2. */
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db,
						      int scale_d)
{
#if defined(__CUDA_ARCH__)
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WGMMA_D64_TEXT
		     ", %64, %65, p, 1, 1;\n}\n"
		     : WGMMA_D64_OPS(d)
		     : "l"(da), "l"(db), "r"(scale_d));
#elif defined(WICK_SIMT)
	simt_wgmma_e4m3(d, 128, da, db, scale_d);
#else
	(void)d, (void)da, (void)db, (void)scale_d;
#endif
}

/* The same with 160 weight rows: d[64x160] (80 f32 a thread) = A[64x32] . B[160x32]^T (+ d
 * when scale_d); the fragment as m64n128's, register i at column 8 (i / 4) + 2 q + i % 2. */
__device__ __forceinline__ void wgmma_m64n160k32_e4m3(float (&d)[80], uint64_t da, uint64_t db,
						      int scale_d)
{
#if defined(__CUDA_ARCH__)
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 " WGMMA_D80_TEXT
		     ", %80, %81, p, 1, 1;\n}\n"
		     : WGMMA_D80_OPS(d)
		     : "l"(da), "l"(db), "r"(scale_d));
#elif defined(WICK_SIMT)
	simt_wgmma_e4m3(d, 160, da, db, scale_d);
#else
	(void)d, (void)da, (void)db, (void)scale_d;
#endif
}

/* m64nNk32 e4m3 for the N a kernel is instantiated with (128 or 160). */
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], uint64_t da, uint64_t db,
					   int scale_d)
{
	static_assert(N == 128 || N == 160, "wgmma_e4m3: m64n128k32 or m64n160k32");
	if constexpr (N == 128)
		wgmma_m64n128k32_e4m3(d, da, db, scale_d);
	else
		wgmma_m64n160k32_e4m3(d, da, db, scale_d);
}

/* The same for bf16: d[64x128] = A[64x16] . B[128x16]^T (+ d when scale_d), bf16 x bf16
 * with f32 accumulators, A and B from descriptors, both K-major (imm-trans-a = imm-trans-b =
 * 0). PTX ISA "wgmma.mma_async" (.bf16: shape m64nNk16; the descriptor form takes
 * imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b); the shared-memory layout is the same
 * 128-byte swizzle as e4m3's with T = 8 two-byte elements (rows of 64 bf16 = 128 bytes), so
 * wgmma_desc_sw128 describes it unchanged and a k16 slice is again 32 bytes along the row.
 * The accumulator fragment is read as the e4m3 one's: the ISA's figures draw D of
 * m64nNk16 as they draw it for m64nNk32 (D's layout depends on N, not on K or the types). */
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t da, uint64_t db,
						      int scale_d)
{
#if defined(__CUDA_ARCH__)
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_D64_TEXT
		     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
		     : WGMMA_D64_OPS(d)
		     : "l"(da), "l"(db), "r"(scale_d));
#elif defined(WICK_SIMT)
	simt_wgmma_bf16(d, 128, da, db, scale_d);
#else
	(void)d, (void)da, (void)db, (void)scale_d;
#endif
}

/* The same product with A from registers (the "RS" form): a[4] holds this thread's 8 bf16 of
 * the warpgroup's 64 x 16 A slice, B from a descriptor (K-major). The register fragment (PTX
 * ISA, wgmma "Register fragment for matrix A", .bf16): warp w of the warpgroup, lane l,
 * g = l / 4, q = l % 4: a[0] = row 16 w + g, columns 2 q, 2 q + 1 (the lower half first);
 * a[1] = row + 8, the same columns; a[2] and a[3] = those rows at columns 2 q + 8, 2 q + 9:
 * mma.sync m16n8k16's A layout, a warp a 16-row slice. The instruction reads a[] at some
 * time before the wait that retires it: the registers must not change until then (the
 * caller keeps them live past the wait with wgmma_reg_fence_u). No imm-trans-a operand. */
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4],
							 uint64_t db, int scale_d)
{
#if defined(__CUDA_ARCH__)
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_D64_TEXT
		     ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
		     : WGMMA_D64_OPS(d)
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
#elif defined(WICK_SIMT)
	simt_wgmma_bf16_rs(d, 128, a, db, scale_d);
#else
	(void)d, (void)a, (void)db, (void)scale_d;
#endif
}

/* Keeps a register live, unchanged, up to this point (an RS wgmma's A operand past the wait
 * that retires it: otherwise the compiler may reuse it once the asm that names it is
 * issued, while the tensor cores may still read it). */
__device__ __forceinline__ void wgmma_reg_fence_u(uint32_t &r)
{
#if defined(__CUDA_ARCH__)
	asm volatile("" : "+r"(r)::"memory");
#else
	(void)r;
#endif
}

/* Where byte k (0..127) of row r (0..127) of a 128-row tile of 128-byte rows lives in the
 * 128-byte swizzle (16-byte chunk k / 16 at chunk (k / 16) ^ (r % 8)); the tile 1024-byte
 * aligned. One byte is one e4m3 or half a bf16. */
__device__ __forceinline__ int wgmma_swz(int r, int k)
{
	return r * 128 + ((((k >> 4) ^ r) & 7) << 4) + (k & 15);
}

/* Stores the NA accumulators of an m64n(2 NA) fragment (register i: row t0 + 8 ((i / 2) % 2),
 * column r0 + 8 (i / 4) + 2 q + i % 2; t0 = the thread's first token, q = lane % 4) into
 * y [n][rows], skipping rows >= n and columns >= rows. Registers i and i + 1 are adjacent
 * columns: where rows is even and y 8-byte aligned they go as one 8-byte store, so a warp's
 * store fills whole 32-byte sectors (8 rows x 4 lanes x 8 bytes) instead of every other
 * 4 bytes of them in two instructions. Under the emulator a misaligned 8-byte store traps,
 * as it faults on a GPU. */
template <int NA>
__device__ __forceinline__ void wgmma_store_tile(float *y, const float (&acc)[NA], int t0, int r0,
						 int q, int n, int rows)
{
	bool pairs = rows % 2 == 0 && (uintptr_t)y % 8 == 0;
#pragma unroll
	for (int i = 0; i < NA; i += 2) {
		int t = t0 + ((i & 2) ? 8 : 0), r = r0 + (i >> 2) * 8 + q * 2;
		if (t >= n || r >= rows)
			continue;
		float *p = y + (size_t)t * rows + r;
		if (pairs) { /* r even, rows even: r + 1 < rows too, and p 8-byte aligned */
#if defined(WICK_SIMT)
			if ((uintptr_t)p % 8)
				simt_trap("wgmma_store_tile: a misaligned 8-byte store");
#endif
			*(float2 *)p = make_float2(acc[i], acc[i + 1]);
		} else {
			p[0] = acc[i];
			if (r + 1 < rows)
				p[1] = acc[i + 1];
		}
	}
}

/* ---- mbarriers and the bulk tensor copy (TMA) ------------------------------------------
 * PTX ISA "mbarrier" (init, arrive, arrive.expect_tx, try_wait.parity; a phase
 * completes when its pending arrivals reach 0 and its transaction count is back to 0, then
 * the next phase starts with the init count) and "cp.async.bulk.tensor" (a 2-D
 * box of the tensor map's global tensor copied to shared memory, out-of-bounds elements
 * filled with zeros, the box's bytes signalled to the mbarrier by complete_tx; with the
 * map's 128-byte swizzle, box row r's 16-byte chunk c lands at chunk c ^ (r % 8) of its
 * 128-byte row, the destination 1024-byte aligned: the layout wgmma_desc_sw128 describes). */

/* Initialises the mbarrier at shared address bar (8 bytes, 8-aligned) for count arrivals.
 * One thread; then mbar_init_fence and a __syncthreads before anyone uses it. */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
#if defined(__CUDA_ARCH__)
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#elif defined(WICK_SIMT)
	simt_mbar_init(bar, count);
#else
	(void)bar, (void)count;
#endif
}

/* Makes the initialised mbarriers visible to the async proxy (the copy engine). */
__device__ __forceinline__ void mbar_init_fence(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* One arrival on bar that also expects bytes more of transactions (the copies it starts). */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, unsigned bytes)
{
#if defined(__CUDA_ARCH__)
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
		     "r"(bytes)
		     : "memory");
#elif defined(WICK_SIMT)
	simt_mbar_arrive(bar, bytes);
#else
	(void)bar, (void)bytes;
#endif
}

/* One arrival on bar. */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
#if defined(__CUDA_ARCH__)
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#elif defined(WICK_SIMT)
	simt_mbar_arrive(bar, 0);
#else
	(void)bar;
#endif
}

/* Waits until the phase of parity `parity` of bar has completed (a fresh barrier counts the
 * phase before its first, parity 1, as complete). Never hangs on the device: after about
 * 2^24 failed tries (far beyond any stage's time) it traps, so a protocol bug is a launch
 * error instead of a hung GPU. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity)
{
#if defined(__CUDA_ARCH__)
	for (unsigned tries = 0;; tries++) {
		unsigned done;
		asm volatile("{\n.reg .pred p;\n"
			     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
			     "selp.u32 %0, 1, 0, p;\n}\n"
			     : "=r"(done)
			     : "r"(bar), "r"(parity)
			     : "memory");
		if (done)
			return;
		if (tries > (1u << 24))
			__trap();
	}
#elif defined(WICK_SIMT)
	simt_mbar_wait(bar, parity);
#else
	(void)bar, (void)parity;
#endif
}

/* Starts the copy of the box at (c0 = column, c1 = row) of map's tensor to shared address
 * dst (1024-byte aligned), completing on bar with the box's bytes. One thread issues it. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
					    uint32_t bar)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
		     "l"(map), "r"(c0), "r"(c1), "r"(bar)
		     : "memory");
#elif defined(WICK_SIMT)
	simt_tma_load_2d(dst, map, c0, c1, bar);
#else
	(void)dst, (void)map, (void)c0, (void)c1, (void)bar;
#endif
}

/* ---- the bulk tensor store (TMA, shared memory to global) and named barriers ----------
 * PTX ISA "cp.async.bulk.tensor" (.global.shared::cta.bulk_group: the box at (c0, c1) of the
 * tensor map's global tensor written from shared memory, out-of-bounds elements not
 * written; with the map's 128-byte swizzle, box row r's 16-byte chunk c is read from chunk
 * c ^ (r % 8) of its 128-byte row, the source 1024-byte aligned), "cp.async.bulk.commit_group"
 * (closes this thread's bulk stores issued since the last commit into a group) and
 * "cp.async.bulk.wait_group" (waits until at most N of this thread's groups are pending;
 * .read: only until their shared memory has been read, so it may be written again; without
 * .read, until the writes to global memory are done); "bar.sync" (a barrier of `count`
 * threads, whole warps, on barrier id; 0 is __syncthreads'). Ordinary shared-memory writes
 * that a bulk store reads need fence.proxy.async in each writing thread before the barrier
 * after which the store is issued. */

/* Starts the store of the box at (c0 = column, c1 = row) of map's tensor from shared address
 * src (1024-byte aligned with the 128-byte swizzle) in this thread's open bulk group. */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
		     " [%0, {%1, %2}], [%3];\n" ::"l"(map),
		     "r"(c0), "r"(c1), "r"(src)
		     : "memory");
#elif defined(WICK_SIMT)
	simt_tma_store_2d(map, c0, c1, src);
#else
	(void)map, (void)c0, (void)c1, (void)src;
#endif
}

/* Closes this thread's bulk group (the stores issued since the last commit). */
__device__ __forceinline__ void bulk_commit(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#elif defined(WICK_SIMT)
	simt_bulk_commit();
#endif
}

/* Waits until at most N of this thread's bulk groups still read their shared memory. */
template <int N> __device__ __forceinline__ void bulk_wait_read(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#elif defined(WICK_SIMT)
	simt_bulk_wait(N, true);
#endif
}

/* Waits until at most N of this thread's bulk groups are incomplete (their global writes
 * done). */
template <int N> __device__ __forceinline__ void bulk_wait(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(WICK_SIMT)
	simt_bulk_wait(N, false);
#endif
}

/* A barrier of COUNT threads (a multiple of 32: whole warps) on barrier ID (1..15); both
 * immediates (with a register id ptxas reserves all 16 barriers). */
template <int ID, int COUNT> __device__ __forceinline__ void named_bar_sync(void)
{
	static_assert(ID >= 1 && ID <= 15 && COUNT % 32 == 0, "bar.sync: id 1..15, whole warps");
#if defined(__CUDA_ARCH__)
	asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory");
#elif defined(WICK_SIMT)
	simt_named_bar(ID, COUNT);
#endif
}

/* ---- thread block clusters (PTX ISA "Cluster of Cooperative Thread Arrays"): the CTAs of
 * a cluster run at once on one GPC and reach each other's shared memory through the
 * shared::cluster window. What the 2-CTA GEMM (gemm_wgmma.cu) uses: its rank, a peer's
 * address of a shared variable (mapa), an arrival on a peer's mbarrier, a tensor copy
 * multicast into every CTA of a mask (each CTA's mbarrier at the same offset gets the bytes
 * that land in it), and the cluster-wide barrier. */

/* This CTA's rank in its cluster (%cluster_ctarank). */
__device__ __forceinline__ unsigned cluster_rank(void)
{
#if defined(__CUDA_ARCH__)
	unsigned r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
	return r;
#elif defined(WICK_SIMT)
	return simt_cluster_rank();
#else
	return 0;
#endif
}

/* The shared::cluster address of the variable at shared address addr in the CTA of rank
 * `rank` of this cluster (mapa). */
__device__ __forceinline__ uint32_t smem_map_rank(uint32_t addr, unsigned rank)
{
#if defined(__CUDA_ARCH__)
	uint32_t r;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
	return r;
#elif defined(WICK_SIMT)
	return simt_mapa(addr, rank);
#else
	(void)rank;
	return addr;
#endif
}

/* One arrival on the mbarrier at shared::cluster address bar (smem_map_rank's: this CTA's
 * or a peer's), with release semantics at cluster scope, when `when` is true: a predicated
 * instruction rather than a branch (a branch among in-flight wgmmas costs registers). */
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, bool when)
{
#if defined(__CUDA_ARCH__)
	asm volatile("{\n.reg .pred p;\n"
		     "setp.ne.u32 p, %1, 0;\n"
		     "@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n}\n" ::"r"(bar),
		     "r"((unsigned)when)
		     : "memory");
#elif defined(WICK_SIMT)
	if (when)
		simt_mbar_arrive(bar, 0);
#else
	(void)bar, (void)when;
#endif
}

/* tma_load_2d into the CTAs of `mask` (bit r: rank r), each at shared address dst and
 * completing on its own mbarrier at bar with the bytes that land in it. */
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap *map, int c0,
					       int c1, uint32_t bar, uint16_t mask)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
		     "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
		     : "memory");
#elif defined(WICK_SIMT)
	simt_tma_load_2d_mc(dst, map, c0, c1, bar, mask);
#else
	(void)dst, (void)map, (void)c0, (void)c1, (void)bar, (void)mask;
#endif
}

/* Every thread of every CTA of the cluster: none goes on until all have arrived; writes
 * before it (shared memory and mbarrier inits included) are visible to all after it. */
__device__ __forceinline__ void cluster_sync(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("barrier.cluster.arrive.release;\n"
		     "barrier.cluster.wait.acquire;\n" ::: "memory");
#elif defined(WICK_SIMT)
	simt_cluster_sync();
#endif
}

/* setmaxnreg (sm_90a): a warpgroup gives registers back (dec) or takes them (inc); every
 * thread of the warpgroup executes it. Nothing under the emulator. */
template <int N> __device__ __forceinline__ void regs_dec(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N> __device__ __forceinline__ void regs_inc(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

#endif
