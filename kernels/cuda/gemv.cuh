/*
 * gemv.cuh - the decode GEMV's device code (cpu_ref_matmul, cpu_ref_matmul_fp8), shared by
 * its own kernels (kernels.cu: k_matmul, k_matmul_mixed) and the chained launch
 * (moe_kernels.cu: k_chain), so that a row computed in either is the same bit for bit; and
 * the host's side of a set of weights (mm_build, mm_check, mm_nt). Static or inline: each .cu
 * file gets its own copy. Not for use outside kernels/cuda/.
 */
#ifndef WICK_CUDA_GEMV_CUH
#define WICK_CUDA_GEMV_CUH

#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_int.cuh"
extern "C" {
#include "kernels/cuda/cuda_kernels.h"
}

/*
 * Decode reads every weight once per step and does little arithmetic per byte, so these
 * kernels are built to stream the weights at HBM bandwidth:
 *   - a team of tt threads (one to eight whole warps) takes a group of MM_R = 4 consecutive
 *     rows; its lanes stride over the rows in 16-byte chunks (4 f32, 8 bf16/f16 or 16 e4m3
 *     weights), so a warp's loads are 512 contiguous bytes of each row;
 *   - each lane issues MM_U = 2 chunks of each of its 4 rows before using any: 8 independent
 *     16-byte loads (128 bytes) in flight per lane, loaded past L1 (ld.global.nc,
 *     L1::no_allocate) so that L1 keeps x;
 *   - each weight is loaded once per call and used for up to MM_NT = 8 tokens with the
 *     accumulators in registers (more tokens: passes of 8, the team's rows read again from
 *     L2, not HBM); x is read through L1 in 16-byte pieces, once per chunk for all 4 rows;
 *   - an FP8 chunk lies inside one 128-column scale block, and the 4 rows inside one
 *     128-row block (4 divides 128), so its 16-product partial sums take the block's scale
 *     once (cpu_ref_matmul_fp8's per-block scale; the order of the sums differs). At 8
 *     tokens the chunk's 16 weights are scaled instead, to keep 32 partial sums out of the
 *     registers;
 *   - FP8 codes become f16 pairs (cvt.rn.f16x2.e4m3x2, one instruction per two weights)
 *     and then f32, exactly; bf16 becomes f32 by a shift or a mask;
 *   - the team's 4 x NT sums: a reduce-scatter over the warp (4 NT - 1 + 5 - log2(4 NT)
 *     shuffles: 6 for one token, 31 for eight, against 20 and 160 one value at a time), then
 *     across the team's warps through shared memory.
 *
 * Launch shape for H200 (132 SMs, ~4.8 TB/s, ~600-800 ns from load to use): by Little's law
 * 4.8 TB/s x 700 ns = 3.4 MB must be in flight, ~25 KB per SM. At 128 bytes per lane a warp
 * holds 4 KB, so ~7 streaming warps per SM suffice; we aim at 16 (2 x margin for the warps
 * that are summing or waiting: MM_WARPS, ~2,100 over the chip). Blocks are 256 threads (8
 * warps): at one token the registers are held to 64 so that 4 blocks (32 warps, up to 128
 * KB in flight) fit an SM, at more tokens to 128 (2 blocks). The team size is the smallest
 * that gives rows/4 x tt/32 >= MM_WARPS warps while each lane still gets MM_U chunks of its
 * rows: 18432 x 7168 FP8: 4,608 one-warp teams; 7168 x 2048 FP8 (128 chunks a row): 1,792
 * groups of two-warp teams, 2 chunks a lane; 2048 x 7168 FP8 (448 chunks): 512 groups, so
 * 4-warp teams, 3.5 chunks a lane.
 *
 * Fast path when w and x are 16-byte aligned and a row is a whole number of chunks (cols *
 * elem_size % 16 == 0); otherwise the same teams walk the row one element per lane (the
 * scalar path: any cols, misaligned rows). Every row is computed by mm_rows with the team
 * size of mm_team(rows, cols, elem_size) and the token pass of mm_nt(n), whichever kernel
 * runs it, so wk_cuda_matmul_n gives each row bit for bit what wk_cuda_matmul gives: a set of
 * one dtype runs in wk_cuda_matmul's own kernel (k_matmul), a mixed set in k_matmul_mixed.
 */
#define MM_THREADS 256 /* threads per block */
#define MM_R 4         /* rows per team; divides FP8_BLOCK */
#define MM_U 2         /* chunks per row in flight per lane */
#define MM_NT 8        /* tokens per pass over the weights */
#define MM_WARPS 2112  /* warps wanted over the chip: 132 SMs x 16 */
/* blocks per SM the registers must allow: 4 (64 registers) for 1 token, else 2 (128) */
#define MM_MINB(nt) ((nt) == 1 ? 4 : 2)

#ifdef WICK_SIMT
#include <stdio.h>
#include <stdlib.h>
/* A GPU faults on a misaligned 16-byte load; the emulator's memcpy would not: abort. */
static inline void simt_aligned16(const void *p)
{
	if ((uintptr_t)p & 15) {
		fprintf(stderr, "kernels.cu: 16-byte load from %p, not 16-byte aligned\n", p);
		abort();
	}
}
#endif

/* 16 bytes of weights, streamed: not kept in L1 (x lives there), L2 fetches 256 bytes */
__device__ __forceinline__ uint4 ld_stream16(const void *p)
{
	uint4 v;
#ifdef WICK_SIMT
	simt_aligned16(p);
	simt_ld_nc(&v, p, 16);
#else
	asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	    : "l"(p));
#endif
	return v;
}

/* A hint: the line holding p fetched into L2 (prefetch.global.L2), nothing loaded into a
 * register. The emulator reads a byte of p, so that an address outside device memory faults
 * there and is named. */
__device__ __forceinline__ void prefetch_l2(const void *p)
{
#ifdef WICK_SIMT
	simt_prefetch(p);
#else
	asm volatile("prefetch.global.L2 [%0];" : : "l"(p));
#endif
}

/* prmt.b32 (PTX's default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a} (a's
 * bytes 0..3, b's 4..7), or, when (sel >> 4i) & 8, that byte's sign bit copied over all 8 */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
#ifdef WICK_SIMT
	return simt_prmt(a, b, sel);
#else
	uint32_t d;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
	return d;
#endif
}

/* cvt.rn.bf16x2.f32: the bf16 pair (lo in the low half), each rounded to nearest even */
__device__ __forceinline__ uint32_t bf16x2_rn(float hi, float lo)
{
#ifdef WICK_SIMT
	return simt_cvt_rn_bf16x2_f32(hi, lo);
#else
	uint32_t d;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
	return d;
#endif
}

/* Two e4m3 codes of u as a bf16 pair, each exactly its value times 2^-120 (GM_E4M3_BF16):
 * sel 0x9180 takes bytes 0 and 1 (byte 0 in the low half), 0xb3a2 bytes 2 and 3. prmt
 * sign-extends each byte to 16 bits (s s s s s s s s | s e e e e m m m); shifted by 4 and
 * masked that is s at bit 15 and e4m3's 7 magnitude bits at bf16's bits 10..4: exponent
 * field e (0..15) and mantissa mmm0000, so a normal code 2^(e-7) (1 + m/8) becomes 2^(e-127)
 * (1 + m/8) and a subnormal 2^-6 m/8 the bf16 subnormal 2^-126 m/8. NaN (0x7f, 0xff)
 * becomes a finite 480 x 2^-120 (the weights hold none). Three instructions a pair. */
#define GM_E4M3_BF16 0x1p-120f
__device__ __forceinline__ uint32_t e4m3x2_bf16(uint32_t u, uint32_t sel)
{
	return (prmt(u, 0u, sel) << 4) & 0x87f087f0u;
}

/* f[0..4) = the 4 floats at p (16-byte aligned): read-only for the kernel, through the
 * read-only path; CO (coherent): written earlier in the same launch by other blocks (a
 * chained launch, k_chain), so a plain load after the acquire, never ld.global.nc */
template <bool CO>
__device__ __forceinline__ void ld_x4(float *f, const float *p)
{
#ifdef WICK_SIMT
	simt_aligned16(p);
	if (CO)
		memcpy(f, p, 16);
	else
		simt_ld_nc(f, p, 16);
#else
	float4 v = CO ? *(const float4 *)p : __ldg((const float4 *)p);
	f[0] = v.x;
	f[1] = v.y;
	f[2] = v.z;
	f[3] = v.w;
#endif
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float f32_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* f[0..4) = weights 4q .. 4q + 3 of a 16-byte chunk (little-endian: the lowest address
 * first), widened to f32 exactly; q is a compile-time constant after unrolling. */
__device__ __forceinline__ void quad(const uint4 &v, int q, float *f, const float *)
{
	f[0] = f32_bits(word_of(v, 0));
	f[1] = f32_bits(word_of(v, 1));
	f[2] = f32_bits(word_of(v, 2));
	f[3] = f32_bits(word_of(v, 3));
	(void)q;
}

__device__ __forceinline__ void quad(const uint4 &v, int q, float *f, const __nv_bfloat16 *)
{
	uint32_t a = word_of(v, 2 * q), b = word_of(v, 2 * q + 1);
	f[0] = f32_bits(a << 16);
	f[1] = f32_bits(a & 0xffff0000u);
	f[2] = f32_bits(b << 16);
	f[3] = f32_bits(b & 0xffff0000u);
}

__device__ __forceinline__ void quad(const uint4 &v, int q, float *f, const __half *)
{
	__half h[4];
	uint32_t u[2] = {word_of(v, 2 * q), word_of(v, 2 * q + 1)};
	memcpy(h, u, 8);
	for (int i = 0; i < 4; i++)
		f[i] = __half2float(h[i]);
}

__device__ __forceinline__ void quad(const uint4 &v, int q, float *f, const __nv_fp8_e4m3 *)
{
	uint32_t u = word_of(v, q);
#ifdef WICK_SIMT
	for (int i = 0; i < 4; i++)
		f[i] = dt_e4m3_to_f32((uint8_t)(u >> (8 * i)));
#else
	__half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
	__half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
	float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
	f[0] = a.x;
	f[1] = a.y;
	f[2] = b.x;
	f[3] = b.y;
#endif
}

template <typename T> struct mm_fp8 {
	static constexpr bool v = false;
};
template <> struct mm_fp8<__nv_fp8_e4m3> {
	static constexpr bool v = true;
};

/* d[r * NT + t] += the E weights of chunk wv[r] (times sc when SW) . x[t][c ..] for t < nv
 * (xc: x[0] + c) */
template <typename T, int NT, bool SW, bool CO>
__device__ __forceinline__ void mm_chunk(float *d, const uint4 *wv, const float *xc, int cols,
					 int nv, float sc)
{
	const T *tag = NULL;
#pragma unroll
	for (int q = 0; q < 16 / (int)sizeof(T) / 4; q++) {
		float f[MM_R][4];
#pragma unroll
		for (int r = 0; r < MM_R; r++) {
			quad(wv[r], q, f[r], tag);
			if constexpr (SW)
#pragma unroll
				for (int e = 0; e < 4; e++)
					f[r][e] *= sc;
		}
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t == 0 || t < nv) { /* nv >= 1 */
				float xv[4];
				ld_x4<CO>(xv, xc + (size_t)t * cols + 4 * q);
#pragma unroll
				for (int r = 0; r < MM_R; r++)
#pragma unroll
					for (int e = 0; e < 4; e++)
						d[r * NT + t] = fmaf(f[r][e], xv[e], d[r * NT + t]);
			}
		}
	}
}

/* The fast path over one team's rows wr[MM_R] for tokens t0 .. t0 + nv - 1 (nv <= NT):
 * acc[r * NT + t] += row r . x[t0 + t], this lane's chunks only. PDL: the lane's first
 * loads of weights are issued before grid_dep_wait, x is read after it. */
template <typename T, int NT, bool CO, bool PDL = false>
__device__ __forceinline__ void mm_vec(float *acc, const T *const *wr, const float *x,
				       const float *srow, int cols, int t0, int nv, int tl, int tt)
{
	const int E = 16 / (int)sizeof(T), nch = (int)((size_t)cols * sizeof(T) / 16);
	const float *xt = x + (size_t)t0 * cols;
	constexpr int U = MM_U;
	for (int k0 = tl; k0 < nch; k0 += tt * U) {
		/* all U x MM_R loads issued before any use, without branches: a chunk past the
		 * row's end loads the row's last chunk again and is not used */
		uint4 wv[U][MM_R];
#pragma unroll
		for (int u = 0; u < U; u++) {
			size_t k = (size_t)min(k0 + u * tt, nch - 1) * E;
#pragma unroll
			for (int r = 0; r < MM_R; r++)
				wv[u][r] = ld_stream16(wr[r] + k);
		}
		if constexpr (PDL)
			if (k0 == tl) /* the first batch: in flight while the kernel before ends */
				grid_dep_wait();
#pragma unroll
		for (int u = 0; u < U; u++) {
			if (k0 + u * tt >= nch)
				continue;
			int c = (k0 + u * tt) * E;
			if constexpr (mm_fp8<T>::v && NT < MM_NT) { /* the chunk's sum, then its scale */
				float s[MM_R * NT];
#pragma unroll
				for (int i = 0; i < MM_R * NT; i++)
					s[i] = 0.0f;
				mm_chunk<T, NT, false, CO>(s, wv[u], xt + c, cols, nv, 0.0f);
				float sc = srow[c / FP8_BLOCK];
#pragma unroll
				for (int i = 0; i < MM_R * NT; i++)
					acc[i] = fmaf(s[i], sc, acc[i]);
			} else if constexpr (mm_fp8<T>::v) { /* 8 tokens: the weights scaled */
				mm_chunk<T, NT, true, CO>(acc, wv[u], xt + c, cols, nv,
							  srow[c / FP8_BLOCK]);
			} else {
				mm_chunk<T, NT, false, CO>(acc, wv[u], xt + c, cols, nv, 0.0f);
			}
		}
	}
}

/* The scalar path (any cols, any alignment): one weight of each row per lane per step. */
template <typename T, int NT>
__device__ __forceinline__ void mm_scalar(float *acc, const T *const *wr, const float *x,
					  const float *srow, int cols, int t0, int nv, int tl,
					  int tt)
{
	for (int c = tl; c < cols; c += tt) {
		float f[MM_R];
#pragma unroll
		for (int r = 0; r < MM_R; r++) {
			f[r] = load_w(wr[r], (size_t)c);
			if constexpr (mm_fp8<T>::v)
				f[r] *= srow[c / FP8_BLOCK];
		}
#pragma unroll
		for (int t = 0; t < NT; t++) {
			if (t >= nv)
				break;
			float xv = x[(size_t)(t0 + t) * cols + c];
#pragma unroll
			for (int r = 0; r < MM_R; r++)
				acc[r * NT + t] = fmaf(f[r], xv, acc[r * NT + t]);
		}
	}
}

/* One reduce-scatter step over the warp: lanes o apart swap halves of their 2h values, so
 * that each keeps h sums; then the next step on those (h = 0: done). */
template <int H>
__device__ __forceinline__ void warp_halve(float *v, int lane, int o)
{
	if constexpr (H > 0) {
		const bool up = (lane & o) != 0;
#pragma unroll
		for (int i = 0; i < H; i++) {
			float send = up ? v[i] : v[i + H], keep = up ? v[i + H] : v[i];
			v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
		}
		warp_halve<H / 2>(v, lane, o / 2);
	}
}

/* Sums acc[MM_R * NT] over the team and stores y[t0 + t][row0 + r] for the rows and tokens
 * that exist. Every thread of the block calls it (a team of more than one warp
 * synchronises the block; tt is the same for the whole block). red: MM_THREADS floats of
 * shared memory. rp (block-uniform; NULL or rope_dim 0: none): the rows of its rope slices
 * rotated before the store, as wk_cuda_rope would (interleaved pairs: rows 2j, 2j + 1 of a
 * slice, both in the team's group of 4 since the slices start at even rows; the pair's
 * other sum is one shuffle away, in the lane holding row r ^ 1 of the same token). */
template <int NT>
__device__ __forceinline__ void mm_store(float *acc, float *y, int n, int rows, int t0,
					 int row0, int tl, int tt, float *red,
					 const struct wk_mm *rp)
{
	constexpr int V = MM_R * NT; /* 4 .. 32, a power of two */
	const int lane = threadIdx.x & 31;
	/* reduce-scatter: after log2(V) halvings (offsets 16, 8, ...) a lane holds value
	 * lane / (32 / V) summed over the lanes that share its top log2(V) bits; plain
	 * butterflies over the rest of the warp finish the sums */
	warp_halve<V / 2>(acc, lane, 16);
#pragma unroll
	for (int o = 16 / V; o >= 1; o /= 2)
		acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
	float v = acc[0];
	int idx = lane / (32 / V);
	bool mine = lane % (32 / V) == 0;
	if (tt > 32) {
		if (mine)
			red[(threadIdx.x >> 5) * V + idx] = v;
		__syncthreads();
		idx = tl;
		mine = tl < V;
		if (mine) {
			const float *p = red + ((threadIdx.x - tl) >> 5) * V + tl;
			v = p[0];
			for (int w = 1; w < tt / 32; w++)
				v += p[w * V];
		}
		__syncthreads(); /* red is free for the next token group */
	}
	if (rp && rp->rope_dim > 0) { /* every lane of the warp: the shuffle */
		float other = __shfl_xor_sync(0xffffffffu, v, NT * (tt > 32 ? 1 : 32 / V));
		int r = idx / NT, t = idx % NT, row = row0 + r;
		int j = row % rp->rope_hd - rp->rope_off;
		if (mine && row < rows && t0 + t < n && j >= 0 && j < rp->rope_dim) {
			float s, c;
			rope_cs(rp->rope_pos[t0 + t], j / 2, rp->rope_dim, rp->rope_theta, &s, &c);
			v = j & 1 ? rope_second(other, v, c, s) : rope_first(v, other, c, s);
		}
	}
	if (mine) {
		int r = idx / NT, t = idx % NT;
		if (row0 + r < rows && t0 + t < n)
			y[(size_t)(t0 + t) * rows + row0 + r] = v;
	}
}

/* Row group g (rows 4g .. 4g + 3) of y[n][rows] = x[n][cols] . w^T by one team; tl: the
 * thread's index in its team of tt; live: the group exists (a team past the last group
 * still joins the block's barriers). scale: FP8 block scales, else unused. PDL: launched
 * as a programmatic dependent (grid_dep_wait): x is read and y written only after the
 * wait, the fast path's first weights loaded before it. */
template <typename T, int NT, bool CO = false, bool PDL = false>
__device__ void mm_rows(float *y, const float *x, const T *w, const float *scale, int n,
			int rows, int cols, int g, int tl, int tt, bool live, float *red,
			const struct wk_mm *rp)
{
	const int row0 = g * MM_R;
	const T *wr[MM_R];
#pragma unroll
	for (int r = 0; r < MM_R; r++) /* a missing row re-reads the last one, never stored */
		wr[r] = w + (size_t)min(row0 + r, rows - 1) * cols;
	const float *srow =
		mm_fp8<T>::v ? scale + (size_t)(row0 / FP8_BLOCK) * ((cols + FP8_BLOCK - 1) / FP8_BLOCK)
			     : NULL;
	const bool vec = ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0 &&
			 (size_t)cols * sizeof(T) % 16 == 0;
	for (int t0 = 0; t0 < n; t0 += NT) {
		float acc[MM_R * NT];
#pragma unroll
		for (int i = 0; i < MM_R * NT; i++)
			acc[i] = 0.0f;
		int nv = min(NT, n - t0);
		if (live) {
			if (vec) {
				/* PDL: x with plain loads, not the read-only path, since the
				 * kernel before wrote it while this grid was already resident */
				mm_vec<T, NT, CO || PDL, PDL>(acc, wr, x, srow, cols, t0, nv, tl, tt);
			} else {
				if constexpr (PDL)
					grid_dep_wait();
				mm_scalar<T, NT>(acc, wr, x, srow, cols, t0, nv, tl, tt);
			}
		}
		if constexpr (PDL) /* a lane with no chunk, a team with no rows */
			grid_dep_wait();
		mm_store<NT>(acc, y, n, rows, t0, row0, tl, tt, red, rp);
	}
}

/* Threads per team for a weight of rows x cols elements of esz bytes (see above). */
static inline int mm_team(int rows, int cols, size_t esz)
{
	long long groups = (rows + MM_R - 1) / MM_R, chunks = (long long)cols * (long long)esz / 16;
	int tt = 32;
	while (tt < MM_THREADS && groups * (tt / 32) < MM_WARPS && chunks >= 2LL * tt * MM_U)
		tt *= 2;
	return tt;
}

/* Up to WK_MATMUL_MAX weights over one input in one launch: blocks [bstart[k], bstart[k +
 * 1]) take weight k's row groups with its own team size. A single matmul is the set of one,
 * launched through the same kernel. */
struct mm_set {
	int count, cols;
	int bstart[WK_MATMUL_MAX + 1]; /* first block of each weight; bstart[count]: total */
	int tt[WK_MATMUL_MAX];
	struct wk_mm p[WK_MATMUL_MAX];
};

/* Block b's weight k, row group g, and the thread's place in its team. */
struct mm_at {
	int k, g, tl, tt;
	bool live;
};

__device__ __forceinline__ struct mm_at mm_where(const struct mm_set &s, int b)
{
	struct mm_at a;
	a.k = 0;
	while (b >= s.bstart[a.k + 1])
		a.k++;
	a.tt = s.tt[a.k];
	a.g = (b - s.bstart[a.k]) * (MM_THREADS / a.tt) + (int)threadIdx.x / a.tt;
	a.tl = (int)threadIdx.x % a.tt;
	a.live = a.g < (s.p[a.k].rows + MM_R - 1) / MM_R;
	return a;
}

/* Block b of a set whose weights' dtypes are chosen at run time, each row computed by the
 * same mm_rows as k_matmul's: k_matmul_mixed's body, and a chained launch's (CO: x written
 * earlier in that launch). red: MM_THREADS floats of shared memory. */
template <int NT, bool CO>
__device__ void mm_mixed(const struct mm_set &s, const float *x, int n, int b, float *red)
{
	struct mm_at a = mm_where(s, b);
	const struct wk_mm *p = &s.p[a.k];
	switch (p->dtype) {
	case DT_F32:
		mm_rows<float, NT, CO>(p->y, x, (const float *)p->w, NULL, n, p->rows, s.cols, a.g,
				       a.tl, a.tt, a.live, red, p);
		break;
	case DT_BF16:
		mm_rows<__nv_bfloat16, NT, CO>(p->y, x, (const __nv_bfloat16 *)p->w, NULL, n,
					       p->rows, s.cols, a.g, a.tl, a.tt, a.live, red, p);
		break;
	case DT_F16:
		mm_rows<__half, NT, CO>(p->y, x, (const __half *)p->w, NULL, n, p->rows, s.cols,
					a.g, a.tl, a.tt, a.live, red, p);
		break;
	default: /* DT_F8_E4M3, checked at launch */
		mm_rows<__nv_fp8_e4m3, NT, CO>(p->y, x, (const __nv_fp8_e4m3 *)p->w, p->scale, n,
					       p->rows, s.cols, a.g, a.tl, a.tt, a.live, red, p);
		break;
	}
}

/* Block b of a set, before it waits for the work before it (a chained launch's link waiting
 * for the link before, k_chain): the weight bytes its lanes' first batch of fast-path loads
 * will read (mm_vec: MM_U chunks of each of the team's MM_R rows) fetched into L2, as a
 * programmatic dependent issues those loads before its grid_dep_wait (k_matmul). Weights
 * only: x may not be written yet. The same rows and chunks as mm_vec's first batch, clamped
 * the same way to the last row and the row's last chunk; nothing where the rows are not whole
 * aligned chunks (mm_scalar's rows). */
__device__ __forceinline__ void mm_prefetch(const struct mm_set &s, int b)
{
	struct mm_at a = mm_where(s, b);
	const struct wk_mm *p = &s.p[a.k];
	size_t esz = p->dtype == DT_F32 ? 4 : p->dtype == DT_F8_E4M3 ? 1 : 2;
	size_t row = (size_t)s.cols * esz;
	const uint8_t *w = (const uint8_t *)p->w;
	if (!a.live || row < 16 || row % 16 || ((uintptr_t)w & 15))
		return;
	int nch = (int)(row / 16);
#pragma unroll
	for (int u = 0; u < MM_U; u++)
#pragma unroll
		for (int r = 0; r < MM_R; r++)
			prefetch_l2(w + (size_t)min(a.g * MM_R + r, p->rows - 1) * row +
				    (size_t)min(a.tl + u * a.tt, nch - 1) * 16);
}

/* tokens per pass: 1, 2, 4 or 8 (n = 3 runs as 4 with one masked, n > 8 in groups of 8) */
static inline int mm_nt(int n)
{
	return n <= 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : MM_NT;
}

/* The set of parts over x [n][cols] (parts checked by the caller); its blocks in
 * s->bstart[count] (0: nothing to do); *mixed when the dtypes differ. */
static inline void mm_build(struct mm_set *s, const struct wk_mm *parts, int count, int cols,
		     bool *mixed)
{
	memset(s, 0, sizeof *s);
	s->count = count;
	s->cols = cols;
	*mixed = false;
	for (int k = 0; k < count; k++) {
		s->p[k] = parts[k];
		s->tt[k] = mm_team(parts[k].rows, cols, dt_size(parts[k].dtype));
		s->bstart[k + 1] = s->bstart[k] + (int)blocks((size_t)(parts[k].rows + MM_R - 1) / MM_R,
							      MM_THREADS / s->tt[k]);
		*mixed |= parts[k].dtype != parts[0].dtype;
	}
}

/* wk_cuda_matmul_n's checks of its parts */
static inline int mm_check(const struct wk_mm *parts, int count, char *err, size_t errsz)
{
	if (count < 1 || count > WK_MATMUL_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA matmul_n: %d weights (1..%d)", count,
			       WK_MATMUL_MAX);
	for (int k = 0; k < count; k++) {
		enum dt_type t = parts[k].dtype;
		if (t != DT_F32 && t != DT_BF16 && t != DT_F16 && t != DT_F8_E4M3)
			return wk_errf(err, errsz, WK_EUNSUPPORTED, "CUDA matmul_n: weights in %s",
				       dt_name(t));
		if (parts[k].rows < 0 || (t == DT_F8_E4M3 && !parts[k].scale))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA matmul_n: weight %d: %d rows%s",
				       k, parts[k].rows, t == DT_F8_E4M3 && !parts[k].scale
				       ? ", FP8 without block scales" : "");
		const struct wk_mm *p = &parts[k];
		if (p->rope_dim > 0 &&
		    (!p->rope_pos || p->rope_heads < 1 || p->rope_hd < 2 || p->rope_off < 0 ||
		     (p->rope_hd | p->rope_off | p->rope_dim) & 1 ||
		     p->rope_off + p->rope_dim > p->rope_hd ||
		     (long long)p->rope_heads * p->rope_hd != p->rows))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA matmul_n: weight %d's rotation "
				       "(%d heads of %d, %d rotated from %d) does not fit its %d rows "
				       "in even pairs", k, p->rope_heads, p->rope_hd, p->rope_dim,
				       p->rope_off, p->rows);
	}
	return WK_OK;
}

#endif
