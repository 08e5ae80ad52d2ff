/*
 * mma.cuh - the tensor-core and asynchronous-copy instructions the GEMM kernels use
 * (gemm_fp8.cu; the cp.async ones also gemm_wgmma.cu and gemm_fp8w.cu), each behind a small
 * device function, and copy16_bytes, the byte-by-byte fill for operands cp.async cannot
 * take. Not for use outside kernels/cuda/.
 *
 * On the device each is one PTX instruction (inline asm under __CUDA_ARCH__). Under the CPU
 * emulator (tests/simt, which defines WICK_SIMT) each calls the emulator's version: the mma
 * is computed from the whole warp's fragments by the PTX ISA's documented layout
 * (tests/simt/mma.cpp), and cp.async copies are held back until cp.async.wait_group says
 * they must have landed (tests/simt/simt.cpp), so a read before the wait sees poison. That
 * checks our use of the documented semantics, not the hardware: a GPU run of
 * scripts/gpu-check is the judge. In nvcc's host pass none of these is called.
 */
#ifndef WICK_MMA_CUH
#define WICK_MMA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "mma.cuh: e4m3 mma.sync needs sm_89 or later (the build targets sm_90a)"
#endif

/* d[16x8] += a[16x32] . b[32x8], e4m3 operands, f32 accumulators, one warp: every lane of a
 * converged warp calls it. Fragments as PTX ISA 9.7.14.5.10 (matrix fragments for
 * mma.m16n8k32, 8-bit types), with g = lane / 4 and q = lane % 4, bytes low to high in each
 * register:
 *   a[0]: A[g][4q .. 4q+3]       a[1]: A[g+8][4q .. 4q+3]
 *   a[2]: A[g][16+4q .. 16+4q+3] a[3]: A[g+8][16+4q .. 16+4q+3]
 *   b[0]: B[4q .. 4q+3][g]       b[1]: B[16+4q .. 16+4q+3][g]   (B "col": column g's k run)
 *   d[0], d[1]: D[g][2q], D[g][2q+1]; d[2], d[3]: D[g+8][2q], D[g+8][2q+1]
 * So with A row-major [m][k] and B stored as [n][k] (a weight's own layout), each register
 * is one aligned 32-bit load of four consecutive k. */
__device__ __forceinline__ void mma_e4m3_16832(float d[4], const uint32_t a[4],
					       const uint32_t b[2])
{
#if defined(__CUDA_ARCH__)
	asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(WICK_SIMT)
	simt_mma_e4m3_16832(d, a, b);
#else
	(void)d, (void)a, (void)b;
#endif
}

/* d[16x8] += a[16x16] . b[16x8], bf16 operands, f32 accumulators, one warp. Fragments as PTX
 * ISA 9.7.14.5.8 (matrix fragments for mma.m16n8k16, .f16/.bf16), g = lane / 4, q = lane %
 * 4, each register two elements, the lower-numbered in its low 16 bits:
 *   a[0]: A[g][2q, 2q+1]     a[1]: A[g+8][2q, 2q+1]
 *   a[2]: A[g][2q+8, 2q+9]   a[3]: A[g+8][2q+8, 2q+9]
 *   b[0]: B[2q, 2q+1][g]     b[1]: B[2q+8, 2q+9][g]
 *   d as mma_e4m3_16832's. */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4],
					       const uint32_t b[2])
{
#if defined(__CUDA_ARCH__)
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(WICK_SIMT)
	simt_mma_bf16_16816(d, a, b);
#else
	(void)d, (void)a, (void)b;
#endif
}

/* Starts an asynchronous copy of 16 bytes global -> shared (cp.async.cg: through L2 only):
 * the first src_bytes (0 or 16 here) from src, the rest zeros; src_bytes 0 reads nothing
 * (src must still be a valid address). Both addresses 16-byte aligned. The bytes are in
 * smem only after cp_async_wait has retired the copy's group, and visible to other threads
 * only after a barrier that follows the wait. */
__device__ __forceinline__ void cp_async16(void *smem, const void *src, int src_bytes)
{
#if defined(__CUDA_ARCH__)
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
		     "r"(src_bytes)
		     : "memory");
#elif defined(WICK_SIMT)
	simt_cp_async(smem, src, 16, src_bytes);
#else
	(void)smem, (void)src, (void)src_bytes;
#endif
}

/* cp_async16's slow twin for unaligned or ragged operands: stores the 16 bytes row[col ..
 * col + 16) to smem (4-byte aligned) with ordinary loads and stores, zeros past cols and
 * all zeros when !in (row is then not read). Done at once, so no wait; a wgmma reader still
 * needs fence.proxy.async before its barrier. */
__device__ __forceinline__ void copy16_bytes(uint8_t *smem, const uint8_t *row, bool in, int col,
					     int cols)
{
#pragma unroll
	for (int q = 0; q < 4; q++) {
		uint32_t v = 0;
#pragma unroll
		for (int b = 0; b < 4; b++) {
			int k = col + q * 4 + b;
			if (in && k < cols)
				v |= (uint32_t)row[k] << (8 * b);
		}
		*(uint32_t *)(smem + q * 4) = v;
	}
}

/* Closes the group of this thread's copies started since the last commit (may be empty). */
__device__ __forceinline__ void cp_async_commit(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(WICK_SIMT)
	simt_cp_async_commit();
#endif
}

/* Waits until at most N of this thread's committed groups, the newest, are still pending. */
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(WICK_SIMT)
	simt_cp_async_wait(N);
#endif
}

#endif
