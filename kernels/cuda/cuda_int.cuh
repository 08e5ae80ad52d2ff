/*
 * cuda_int.cuh - internals shared by the CUDA kernel files (kernels.cu, glm_kernels.cu,
 * moe_kernels.cu): the launch-error checks, the warp/block reductions and scan, and the
 * weight loads. Not for use outside kernels/cuda/.
 *
 * Everything here is static or inline, so each .cu file gets its own copy (block_sum's
 * shared scratch included); nothing is exported from a translation unit.
 */
#ifndef WICK_CUDA_INT_CUH
#define WICK_CUDA_INT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}

#define FP8_BLOCK 128 /* the block of the FP8 weight scales (CPU_FP8_BLOCK) */

/* WK_OK, or WK_EIO with "CUDA <what>: <CUDA's message>" in err. */
static inline int check(cudaError_t e, const char *what, char *err, size_t errsz)
{
	if (e == cudaSuccess)
		return WK_OK;
	return wk_errf(err, errsz, WK_EIO, "CUDA %s: %s", what, cudaGetErrorString(e));
}

/* after a launch: the launch's own error (bad configuration), not the kernel's outcome */
static inline int launched(const char *what, char *err, size_t errsz)
{
	return check(cudaGetLastError(), what, err, errsz);
}

static inline unsigned blocks(size_t threads, unsigned per)
{
	return (unsigned)((threads + per - 1) / per);
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. Every
 * thread of the block must call it (it synchronises). */
static __device__ float block_sum(float v)
{
	__shared__ float part[32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum(v);
	__syncthreads(); /* part may still be read by a previous call */
	if (lane == 0)
		part[wid] = v;
	__syncthreads();
	v = lane < nw ? part[lane] : 0.0f;
	return warp_sum(v);
}

static __device__ float block_max(float v)
{
	__shared__ float part[32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		part[wid] = v;
	__syncthreads();
	v = lane < nw ? part[lane] : -INFINITY;
	return warp_max(v);
}

/* The row norms below round each product and sum on its own (__fmul_rn, __fadd_rn): left to
 * the compiler, a product and a sum may become one FMA in one kernel and not in another
 * (seen on an H200: norm_n's layernorm differed from k_layernorm's in the last bits), and
 * the fused launches promise the single kernels' bits. */

/* One row of rmsnorm (cpu_ref_rmsnorm) by a whole block: k_rmsnorm's and k_norm_n's code. */
static __device__ void row_rmsnorm(float *yr, const float *xr, const float *w, int dim,
				   float eps)
{
	float ss = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
	float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

/* One row of layernorm (cpu_ref_layernorm), b optional: k_layernorm's and k_norm_n's code. */
static __device__ void row_layernorm(float *yr, const float *xr, const float *w, const float *b,
				     int dim, float eps)
{
	float s = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		s += xr[i];
	float mean = block_sum(s) / (float)dim;
	float v = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x) {
		float d = __fsub_rn(xr[i], mean);
		v = __fadd_rn(v, __fmul_rn(d, d));
	}
	float inv = 1.0f / sqrtf(block_sum(v) / (float)dim + eps);
	for (int i = threadIdx.x; i < dim; i += blockDim.x) {
		float y = __fmul_rn(__fmul_rn(__fsub_rn(xr[i], mean), inv), w[i]);
		yr[i] = b ? __fadd_rn(y, b[i]) : y;
	}
}

/* ---- rope's arithmetic, shared by k_rope, k_rope_n, matmul_n's rotated outputs and
 * norm_n's rotated rows, so that a rotation fused into another launch gives the bits of the
 * rope launch. The products and sums are rounded one by one (no FMA contraction, which the
 * compiler may otherwise choose differently in each kernel). ---- */

/* sin and cos of position pos for pair j of a rot_dim slice */
__device__ __forceinline__ void rope_cs(int pos, int j, int rot_dim, float theta, float *s,
					float *c)
{
	float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)rot_dim);
	sincosf((float)pos * inv_freq, s, c);
}

/* the pair (a, b) rotated: a c - b s, b c + a s */
__device__ __forceinline__ float rope_first(float a, float b, float c, float s)
{
	return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}

__device__ __forceinline__ float rope_second(float a, float b, float c, float s)
{
	return __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

/* Rotates pair i (token, head, j) of x: k_rope's thread, also k_rope_n's
 * and norm_n's rotated rows'. */
static __device__ void rope_pair(float *x, const int *pos, int n_heads, int head_dim, int rot_dim,
			  float theta, bool interleaved, size_t i)
{
	int half = rot_dim / 2;
	int j = (int)(i % half);
	size_t th = i / half; /* token * n_heads + head */
	int t = (int)(th / n_heads);
	float *v = x + th * head_dim;
	float s, c;
	rope_cs(pos[t], j, rot_dim, theta, &s, &c);
	int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
	float a = v[i0], b = v[i1];
	v[i0] = rope_first(a, b, c, s);
	v[i1] = rope_second(a, b, c, s);
}

/* Inclusive prefix sum of v over the block (blockDim.x a multiple of 32); *total gets the
 * block's sum. Every thread must call it. scratch: 32 ints of shared memory. */
static __device__ int block_scan(int v, int *scratch, int *total)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int o = 1; o < 32; o <<= 1) {
		int u = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= o)
			v += u;
	}
	if (lane == 31)
		scratch[wid] = v;
	__syncthreads();
	if (wid == 0) { /* the warps' totals, scanned in place */
		int x = lane < nw ? scratch[lane] : 0;
		for (int o = 1; o < 32; o <<= 1) {
			int u = __shfl_up_sync(0xffffffffu, x, o);
			if (lane >= o)
				x += u;
		}
		scratch[lane] = x;
	}
	__syncthreads();
	if (wid > 0)
		v += scratch[wid - 1];
	*total = scratch[nw - 1];
	__syncthreads(); /* scratch is free for the next call */
	return v;
}

/* Element i of a weight, widened to f32 (exactly: bf16, f16 and e4m3 all fit in f32). An
 * FP8 element still needs its block scale (see wk_cuda_matmul_fp8). */
__device__ __forceinline__ float load_w(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const __nv_bfloat16 *w, size_t i)
{
	return __bfloat162float(w[i]);
}
__device__ __forceinline__ float load_w(const __half *w, size_t i) { return __half2float(w[i]); }
__device__ __forceinline__ float load_w(const __nv_fp8_e4m3 *w, size_t i) { return float(w[i]); }

/* f32 -> bf16 bits, nearest, ties to even (dt_f32_to_bf16); NaN stays NaN. */
__device__ __forceinline__ uint32_t bf16_rn(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (u >> 16) | 0x40u;
	return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* Element i of a KV cache, f32 or bf16 (bits), as f32: exactly (cpu_kv_at). */
__device__ __forceinline__ float kv_ld(const float *c, size_t i) { return c[i]; }
__device__ __forceinline__ float kv_ld(const uint16_t *c, size_t i)
{
	return __uint_as_float((unsigned)c[i] << 16);
}

/* Element c of a cache row (cpu_kv_rc): f32 or bf16 as kv_ld reads it; an FP8 row's e4m3
 * code times the scale of its 128-element block, rs the row's scales (kv_scales; NULL and
 * unread for the others). The kernels that read a cache are templates over the three. */
template <typename KV>
__device__ __forceinline__ float kv_rc(const KV *row, const float *rs, int c)
{
	(void)rs;
	return kv_ld(row, (size_t)c);
}
__device__ __forceinline__ float kv_rc(const __nv_fp8_e4m3 *row, const float *rs, int c)
{
	return float(row[c]) * rs[c / FP8_BLOCK];
}

/* Row r's scales in an FP8 cache's scales s, rows w wide (cpu_kv_blocks(w) a row); NULL for
 * a cache without (s NULL). */
__device__ __forceinline__ const float *kv_scales(const float *s, size_t r, int w)
{
	return s ? s + r * (size_t)((w + FP8_BLOCK - 1) / FP8_BLOCK) : s;
}

/* The type of an MLA cache's rope keys k_b (cpu_kv_b_type): the cache's, bf16 for FP8. */
template <typename KV> struct kv_b { typedef KV t; };
template <> struct kv_b<__nv_fp8_e4m3> { typedef uint16_t t; };

/* ---- split attention (flash-decoding) ----------------------------------------------------------
 *
 * An attention kernel whose blocks are too few to fill the device splits each query's keys
 * over several blocks. Each leaves its part's running max m, denominator l and output acc in
 * a scratch part [rows][split][2 + w] (row: token * n_heads + head, w: the output row's
 * width); the last block of a (token, heads) to count itself on its counter merges them, so
 * the split costs no launch. ATT_FILL: the blocks that fill an H200 (2 on each of 132 SMs). */
#define ATT_FILL 264
#define ATT_SPLIT_MAX 64 /* parts a query's keys go in, at most */

/* The most parts the longest query's keys (keys < 0: any number) may go in, each at least
 * min_keys of them: 1 to ATT_SPLIT_MAX. */
static inline long split_max(long keys, int min_keys)
{
	long m = keys < 0 ? ATT_SPLIT_MAX : keys / min_keys;
	return m < 1 ? 1 : m > ATT_SPLIT_MAX ? ATT_SPLIT_MAX : m;
}

/* The parts for a launch of that many blocks (token, heads) to fill the device, at most
 * smax (split_max). */
static inline int split_parts(long blocks, long smax)
{
	long s = blocks >= ATT_FILL ? 1 : (ATT_FILL + blocks - 1) / blocks;
	return (int)(s < smax ? s : smax);
}

/* The parts split may have within the caller's scratch sp: per floats of parts a part,
 * counters for blocks (token, heads) beyond the first skip; 1 without a scratch. */
static inline int split_fit(int split, const struct wk_att_split *sp, size_t per, long blocks,
			    int skip)
{
	if (split < 2 || !sp || !sp->part || !sp->count || blocks > (long)sp->count_n - skip)
		return 1;
	if ((size_t)split * per > sp->part_floats)
		split = (int)(sp->part_floats / per);
	return split < 1 ? 1 : split;
}

/* Block-wide, every thread calls it: part sp of split of nh rows from row0 (acc [nh][w], ms,
 * ls [nh], in shared memory); then counts the block on *c. True in every thread of the last
 * of the split blocks, which has zeroed *c and may then read every part (part_merge); *last:
 * an int of the block's shared memory. */
__device__ __forceinline__ bool part_put(float *part, size_t row0, int split, int sp, int nh,
					 int w, const float *acc, const float *ms, const float *ls,
					 unsigned *c, int *last)
{
	size_t pw = (size_t)w + 2;
	for (int x = threadIdx.x; x < nh * w; x += blockDim.x)
		part[((row0 + x / w) * split + sp) * pw + 2 + x % w] = acc[x];
	if (threadIdx.x < nh) {
		float *ph = part + ((row0 + threadIdx.x) * split + sp) * pw;
		ph[0] = ms[threadIdx.x];
		ph[1] = ls[threadIdx.x];
	}
	__threadfence(); /* this block's part is visible before its counter moves */
	__syncthreads();
	if (threadIdx.x == 0) {
		*last = atomicAdd(c, 1u) == (unsigned)split - 1;
		if (*last)
			*c = 0;
	}
	__syncthreads();
	bool r = *last;
	if (r)
		__threadfence(); /* then every other block's parts */
	return r;
}

/* The last block's merge: out[(row0 + r) * w + d] for r < nh, d < w, the parts' acc weighted
 * by exp(m_s - max m) over the same weighted sum of their l (an empty part, m -inf, weighs
 * nothing; all empty: 0/0, NaN, as the references give for no keys). The parts are read
 * volatile, from L2, not this SM's L1: other blocks wrote them. */
__device__ __forceinline__ void part_merge(float *out, const float *part, size_t row0, int split,
					   int nh, int w)
{
	size_t pw = (size_t)w + 2;
	const volatile float *pv = part;
	for (int x = threadIdx.x; x < nh * w; x += blockDim.x) {
		size_t row = (row0 + x / w) * split;
		float m = -INFINITY, l = 0.0f, o = 0.0f;
		for (int s = 0; s < split; s++)
			m = fmaxf(m, pv[(row + s) * pw]);
		for (int s = 0; s < split; s++) {
			float ms = pv[(row + s) * pw];
			float wt = ms == -INFINITY ? 0.0f : expf(ms - m);
			l += pv[(row + s) * pw + 1] * wt;
			o += pv[(row + s) * pw + 2 + x % w] * wt;
		}
		out[(row0 + x / w) * w + x % w] = o / l;
	}
}

/* ---- stages of one launch (k_chain, k_mla_absorbed) -------------------------------------------
 *
 * Blocks take tickets (an atomic counter) in the order they start, and a block of a later
 * stage waits for every block of the stage before it: those took earlier tickets, so they
 * are running or done, and the wait cannot deadlock. A wait polls at most WAIT_POLLS_MAX
 * times, a __nanosleep(100) between (a stage takes well under a millisecond); then it traps, as
 * mbar_wait does: a launch that can never go on is a sticky launch error (the engine fails,
 * the worker hands its jobs back and exits), not a GPU spinning for ever. */
#define WAIT_POLLS_MAX (1u << 26)

/* Block-wide, every thread calls it: until *done reaches need (thread 0 polls, then fences:
 * acquire, the earlier blocks' writes before this block's reads). */
__device__ __forceinline__ void wait_blocks(const unsigned *done, unsigned need)
{
	if (threadIdx.x == 0) {
		const volatile unsigned *d = done;
		for (unsigned polls = 0; *d < need; polls++) {
			if (polls == WAIT_POLLS_MAX) /* over ~7 s: never a hung GPU */
				__trap();
			__nanosleep(100);
		}
		__threadfence();
	}
	__syncthreads();
}

/* Block-wide, every thread calls it, once the tile's scores p [nh][tile] (cnt of each row)
 * are written: the online softmax's step over them. Thread g < nh raises head g's running max
 * ms[g] to mn over its scores and keeps cr[g] = exp(m - mn) (1 while every score is -inf:
 * exp(-inf - -inf) would be NaN); the scores become p = exp(score - mn) (0 while mn is
 * -inf); thread g then keeps ls[g] = ls[g] * cr[g] + the sum of its p. On return p and cr
 * are written (ls only to thread g: the caller's next barrier makes it the block's). */
__device__ __forceinline__ void tile_softmax(float *p, float *ms, float *ls, float *cr, int nh,
					     int cnt, int tile)
{
	if (threadIdx.x < nh) {
		const float *ph = p + threadIdx.x * tile;
		float mt = -INFINITY, m = ms[threadIdx.x];
		for (int j = 0; j < cnt; j++)
			mt = fmaxf(mt, ph[j]);
		float mn = fmaxf(m, mt);
		cr[threadIdx.x] = mn == -INFINITY ? 1.0f : expf(m - mn);
		ms[threadIdx.x] = mn;
	}
	__syncthreads(); /* every head's scores read, ms and cr written */
	for (int x = threadIdx.x; x < nh * tile; x += blockDim.x) {
		float mn = ms[x / tile];
		if (x % tile < cnt)
			p[x] = mn == -INFINITY ? 0.0f : expf(p[x] - mn);
	}
	__syncthreads(); /* p written */
	if (threadIdx.x < nh) {
		const float *ph = p + threadIdx.x * tile;
		float l = 0.0f;
		for (int j = 0; j < cnt; j++)
			l += ph[j];
		ls[threadIdx.x] = ls[threadIdx.x] * cr[threadIdx.x] + l;
	}
}

/* The keys [*k0, *k1) of part sp of split of a query with len keys: whole tiles shared out
 * evenly (a part may be empty where another query of the launch has more keys). */
__device__ __forceinline__ void part_keys(int len, int tile, int split, int sp, int *k0, int *k1)
{
	int tiles = (len + tile - 1) / tile;
	*k0 = min(len, sp * tiles / split * tile);
	*k1 = min(len, (sp + 1) * tiles / split * tile);
}

/* x as two bf16 (bits): hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in f32), so hi + lo
 * is x within 2^-16 |x|: the split of the FP8 x f32 GEMMs (act_split, the MoE GEMMs' SiLU
 * split) and of the tensor-core GEMV. */
__device__ __forceinline__ void bf16_split(float x, uint32_t *hi, uint32_t *lo)
{
	*hi = bf16_rn(x);
	*lo = bf16_rn(x - __uint_as_float(*hi << 16));
}

/* The bf16 operands of the split tensor-core kernels (attention.cu's k_att_mma and k_mla_lat,
 * glm_kernels.cu's k_dsa_score_mma and k_dsa_topk_tc): an f32 is split into hi and lo
 * (bf16_split), held as bf16 bits, and the mma.sync m16n8k16 fragments are 32-bit loads of
 * two of them. */

/* Two bf16 (bits) as an mma operand register: a in the low half (the lower k). */
__device__ __forceinline__ uint32_t am_pack(uint32_t a, uint32_t b) { return a | b << 16; }

/* v split into bf16 hi (at hi[i]) and lo (at lo[i]) */
__device__ __forceinline__ void am_put(uint16_t *hi, uint16_t *lo, int i, float v)
{
	uint32_t h, l;
	bf16_split(v, &h, &l);
	hi[i] = (uint16_t)h;
	lo[i] = (uint16_t)l;
}

/* N m16n8 accumulators (4 floats a thread each) zeroed */
template <int N> __device__ __forceinline__ void am_zero(float (&a)[N][4])
{
#pragma unroll
	for (int c = 0; c < N; c++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			a[c][e] = 0.0f;
}

__device__ __forceinline__ uint32_t am_ld(const uint16_t *p) /* p: 4-byte aligned */
{
	return *(const uint32_t *)p;
}

/* e4m3 code b -> bf16 bits, exact (dt_e4m3_to_f32's value; 0x7f / 0xff are NaN). The
 * magnitude is built as an f32 with exponent field e + 120 (bias 127 - 7); a subnormal
 * code (e == 0) is built as e == 1 and 2^-6 taken off, exact, so no f32 subnormal (and no
 * flush-to-zero) is involved. */
__device__ __forceinline__ uint32_t e4m3_bf16(uint32_t b)
{
	uint32_t em = b & 0x7fu, s = (b & 0x80u) << 8;
	float f = __uint_as_float(((em | (em < 8 ? 8u : 0u)) << 20) + (120u << 23));
	if (em < 8)
		f -= 0x1p-6f;
	return em == 0x7fu ? s | 0x7fc0u : s | (__float_as_uint(f) >> 16);
}

/* Whether a cache's elements are bf16 already (their lo terms are zero: skipped). */
template <typename KV> struct kv_bf16 { static constexpr bool v = false; };
template <> struct kv_bf16<uint16_t> { static constexpr bool v = true; };

/* Programmatic dependent launch (PDL, sm_90): a kernel launched with the attribute
 * cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it on
 * the stream is still running, once every block of that one has run grid_dep_launch (or
 * exited). Until its grid_dep_wait returns it may read only what no earlier kernel writes
 * (weights) and write nothing; grid_dep_wait returns once the earlier kernels have finished
 * and their writes are visible. In a kernel launched without the attribute both are no-ops.
 * The emulator runs launches one after another, so both are no-ops there. */
__device__ __forceinline__ void grid_dep_wait(void)
{
#ifndef WICK_SIMT
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_launch(void)
{
#ifndef WICK_SIMT
	asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* The stream compute goes to (wk_cuda_set_stream): 0, the legacy default stream, unless
 * WICK_CUDA_STREAM=pt made it cudaStreamPerThread. Every launch names it. */
extern cudaStream_t wk_compute_stream;
static inline cudaStream_t wk_st(void)
{
	return wk_compute_stream;
}

/* The configuration of a launch of grid blocks of block threads on stream st that runs as a
 * programmatic dependent when pdl (the attribute above, in *at, which must outlive the
 * cudaLaunchKernelEx), as an ordinary launch otherwise. */
static inline cudaLaunchConfig_t pdl_config(unsigned grid, unsigned block, bool pdl,
					    cudaLaunchAttribute *at, cudaStream_t st = 0)
{
	*at = {};
	at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at->val.programmaticStreamSerializationAllowed = 1;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = dim3(grid);
	cfg.blockDim = dim3(block);
	cfg.stream = st;
	cfg.attrs = at;
	cfg.numAttrs = pdl ? 1 : 0;
	return cfg;
}

/* ---- e4m3 quantization (cpu_ref_act_quant's, dt_f32_to_e4m3's codes): act_quant's and
 * act_codes' device code (kernels.cu) and cast_n's FP8 stores ---- */

/* v on the float8_e4m3fn grid, nearest, ties to even, saturating (cpu_e4m3_round); an
 * infinity too (cast_n's block of scale 0 divides by it: frexpf gives it exponent 0, and
 * rintf(inf) * q > 448). */
static __device__ float e4m3_round(float v)
{
	float a = fabsf(v);
	if (!(a > 0.0f))
		return v;
	int ex;
	frexpf(a, &ex);
	int e = ex - 1 < -6 ? -6 : ex - 1;
	float q = ldexpf(1.0f, e - 3);
	float r = rintf(a / q) * q;
	if (r > 448.0f)
		r = 448.0f;
	return v < 0 ? -r : r;
}

/* The float8_e4m3fn byte of r, a value on its grid (e4m3_round's): sign, 4 exponent bits
 * (bias 7; 0 for the subnormals, steps of 2^-9), 3 mantissa bits. */
static __device__ uint8_t e4m3_bits(float r)
{
	uint8_t sign = r < 0.0f || (r == 0.0f && signbit(r)) ? 0x80 : 0;
	float a = fabsf(r);
	if (a == 0.0f)
		return sign;
	int ex;
	frexpf(a, &ex);
	int e = ex - 1; /* a in [2^e, 2^(e + 1)) */
	if (e < -6)
		return sign | (uint8_t)(a * 512.0f); /* subnormal: a = m * 2^-9 */
	int mant = (int)((ldexpf(a, -e) - 1.0f) * 8.0f);
	return sign | (uint8_t)((e + 7) << 3) | (uint8_t)mant;
}

/* dt_f32_to_e4m3(v): rounded onto the grid (the conversion of a value on it is exact), NaN
 * 0x7f. */
__device__ __forceinline__ uint8_t e4m3_code(float v)
{
	return isnan(v) ? (uint8_t)0x7f : e4m3_bits(e4m3_round(v));
}

/* A warp's block g of x [rows][cols] (128 elements of a row, its last one short): its first
 * element's offset, its width, and its scale amax / 448 (1 when all zero). Every lane of the
 * warp must call it (a shuffle). */
static __device__ float act_block(const float *x, int cols, int nb, size_t g, int lane,
				  size_t *at, int *m)
{
	int b = (int)(g % (size_t)nb);
	*at = g / (size_t)nb * (size_t)cols + (size_t)b * FP8_BLOCK;
	*m = min(FP8_BLOCK, cols - b * FP8_BLOCK);
	float amax = 0.0f;
	for (int c = lane; c < *m; c += 32)
		amax = fmaxf(amax, fabsf(x[*at + c]));
	amax = warp_max(amax);
	return amax > 0.0f ? amax / 448.0f : 1.0f;
}

/* ---- whole-block row ops, also run inside chained launches (kernels.cu's k_chain) ---- */

/* k_add, then k_rmsnorm, over row xr [dim] by the block: each thread's elements and partial
 * sum are k_rmsnorm's, so the result is the same bit for bit (k_add_rmsnorm's code). */
static __device__ void row_add_rmsnorm(float *xr, const float *dr, float *yr, const float *w,
				       int dim, float eps)
{
	float ss = 0.0f;
	for (int i = threadIdx.x; i < dim; i += blockDim.x) {
		float v = xr[i] + dr[i];
		xr[i] = v;
		ss = __fadd_rn(ss, __fmul_rn(v, v));
	}
	float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

/* The part k of a set of launches in one whose blocks [start[k], start[k + 1]) hold block g
 * (g < start[count]): norm_n's norms, cast_n's casts, a chained launch's links. */
__device__ __forceinline__ int set_part(const int *start, int g)
{
	int k = 0;
	while (g >= start[k + 1])
		k++;
	return k;
}

/* norm_n's rows: block g of the set takes row g of the norms' rows in order. */
struct norm_set {
	int count;
	int start[WK_NORM_MAX + 1]; /* first block of each norm; start[count]: all rows */
	struct wk_norm r[WK_NORM_MAX];
};

static __device__ void norm_row(const struct norm_set &s, int g)
{
	int k = set_part(s.start, g);
	const struct wk_norm *r = &s.r[k];
	int row = g - s.start[k], heads = r->heads > 1 ? r->heads : 1;
	size_t at = (size_t)row * r->dim;
	const float *x = r->x + at;
	if (r->add || (r->bare && r->y != r->x)) { /* y = x + the row's head of the bias */
		const float *b = r->add ? r->add + (size_t)(row % heads) * r->dim : NULL;
		for (int i = threadIdx.x; i < r->dim; i += blockDim.x)
			r->y[at + i] = b ? __fadd_rn(x[i], b[i]) : x[i];
		x = r->y + at; /* each thread reads back only its own elements below */
	}
	if (!r->bare && r->layer)
		row_layernorm(r->y + at, x, r->w, r->b, r->dim, r->eps);
	else if (!r->bare)
		row_rmsnorm(r->y + at, x, r->w, r->dim, r->eps);
	if (r->rope_dim <= 0)
		return;
	__syncthreads(); /* the row's normalised values, written by the block, are visible */
	for (int j = threadIdx.x; j < r->rope_dim / 2; j += blockDim.x)
		rope_pair(r->y + at, r->rope_pos + row / heads, 1, r->dim, r->rope_dim,
			  r->rope_theta, !r->half, (size_t)j);
}

/* norm_n's set from r [count], checked: its blocks (rows) in s->start[count]. */
static inline int norm_build(struct norm_set *s, const struct wk_norm *r, int count, char *err,
			     size_t errsz)
{
	if (count < 1 || count > WK_NORM_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA norm_n: %d norms (1..%d)", count,
			       WK_NORM_MAX);
	memset(s, 0, sizeof *s);
	s->count = count;
	for (int k = 0; k < count; k++) {
		s->r[k] = r[k];
		s->start[k + 1] = s->start[k] + (r[k].n > 0 ? r[k].n : 0);
		if (r[k].rope_dim > 0 && (!r[k].rope_pos || r[k].rope_dim & 1 || r[k].rope_dim > r[k].dim))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA norm_n: norm %d rotates %d of %d "
				       "(an even count at most dim, with positions)", k,
				       r[k].rope_dim, r[k].dim);
		if (r[k].heads > 1 && r[k].n % r[k].heads)
			return wk_errf(err, errsz, WK_EINVAL, "CUDA norm_n: norm %d has %d rows, "
				       "not a multiple of its %d heads", k, r[k].n, r[k].heads);
	}
	return WK_OK;
}

/* cast_n's work (cpu_ref_cast): block g of the set takes part j = g - start[k] of the cast k
 * whose blocks hold g: elements [j * CAST_BLOCK, (j + 1) * CAST_BLOCK) of a plain conversion
 * or an FP8 load (f32 = code times its block's scale, elementwise), or an FP8 store's
 * 128-element blocks [j * CAST_QBLOCKS, (j + 1) * CAST_QBLOCKS) in row order, one warp a
 * block: its amax is a warp's reduction, then act_codes' arithmetic (act_block, e4m3_code).
 * Plain loads, never the read-only path: in a chained launch the rows were just written by a
 * link before. */
#define CAST_BLOCK 2048
#define CAST_QBLOCKS 16 /* CAST_BLOCK elements where rows are a multiple of 128 */
struct cast_set {
	int count;
	int start[WK_CAST_MAX + 1]; /* first block of each cast; start[count]: all blocks */
	struct wk_cast c[WK_CAST_MAX];
};

static __device__ void cast_quant(const struct wk_cast &c, size_t j)
{
	int nb = (c.w + FP8_BLOCK - 1) / FP8_BLOCK, lane = threadIdx.x & 31, m;
	size_t q1 = c.n / (size_t)c.w * (size_t)nb, at;
	if (q1 > (j + 1) * CAST_QBLOCKS)
		q1 = (j + 1) * CAST_QBLOCKS;
	const float *x = (const float *)c.src;
	for (size_t q = j * CAST_QBLOCKS + (threadIdx.x >> 5); q < q1; q += blockDim.x >> 5) {
		float sc = act_block(x, c.w, nb, q, lane, &at, &m); /* warp-uniform loop */
		for (int i = lane; i < m; i += 32)
			((uint8_t *)c.dst)[at + i] = e4m3_code(x[at + i] / sc);
		if (lane == 0)
			c.ds[q] = sc; /* block q is row q / nb's block q % nb */
	}
}

static __device__ void cast_block(const struct cast_set &s, int g)
{
	int k = set_part(s.start, g);
	const struct wk_cast &c = s.c[k];
	size_t j = (size_t)(g - s.start[k]);
	if (c.dt == DT_F8_E4M3) {
		cast_quant(c, j);
		return;
	}
	size_t i0 = j * CAST_BLOCK;
	size_t i1 = c.n - i0 < CAST_BLOCK ? c.n : i0 + CAST_BLOCK;
	for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
		if (c.st == DT_F8_E4M3) {
			size_t r = i / (size_t)c.w;
			((float *)c.dst)[i] = kv_rc((const __nv_fp8_e4m3 *)c.src + r * (size_t)c.w,
						    kv_scales(c.ss, r, c.w), (int)(i % (size_t)c.w));
		} else if (c.dt == DT_BF16 && c.st == DT_F32) {
			((uint16_t *)c.dst)[i] = (uint16_t)bf16_rn(((const float *)c.src)[i]);
		} else if (c.dt == DT_F32 && c.st == DT_BF16) {
			((float *)c.dst)[i] = kv_ld((const uint16_t *)c.src, i);
		} else if (c.dt == DT_F32) {
			((float *)c.dst)[i] = ((const float *)c.src)[i];
		} else {
			((uint16_t *)c.dst)[i] = ((const uint16_t *)c.src)[i];
		}
	}
}

/* cast_n's set from c [count], checked: its blocks in s->start[count] (0: nothing to do). */
static inline int cast_build(struct cast_set *s, const struct wk_cast *c, int count, char *err,
			     size_t errsz)
{
	if (count < 1 || count > WK_CAST_MAX)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA cast_n: %d casts (1..%d)", count,
			       WK_CAST_MAX);
	memset(s, 0, sizeof *s);
	s->count = count;
	for (int k = 0; k < count; k++) {
		enum dt_type dt = c[k].dt, st = c[k].st;
		bool plain = (dt == DT_F32 || dt == DT_BF16) && (st == DT_F32 || st == DT_BF16);
		bool store = dt == DT_F8_E4M3 && st == DT_F32 && c[k].ds;
		bool load = dt == DT_F32 && st == DT_F8_E4M3 && c[k].ss;
		if (!plain && !store && !load)
			return wk_errf(err, errsz, WK_EINVAL, "CUDA cast_n: cast %d, %s to %s (f32 "
				       "or bf16, or f32 to and from fp8 with its scales)", k,
				       dt_name(st), dt_name(dt));
		if (!plain && (c[k].w <= 0 || c[k].n % (size_t)c[k].w))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA cast_n: cast %d, %zu fp8 "
				       "elements in rows of %d", k, c[k].n, c[k].w);
		size_t nb = store ? (c[k].n / (size_t)c[k].w * (size_t)((c[k].w + FP8_BLOCK - 1) /
									  FP8_BLOCK) +
				     CAST_QBLOCKS - 1) / CAST_QBLOCKS
				  : (c[k].n + CAST_BLOCK - 1) / CAST_BLOCK;
		if (nb > (size_t)(0x7fffffff - s->start[k]))
			return wk_errf(err, errsz, WK_EINVAL, "CUDA cast_n: cast %d, %zu elements "
				       "(too many blocks)", k, c[k].n);
		s->c[k] = c[k];
		s->start[k + 1] = s->start[k] + (int)nb;
	}
	return WK_OK;
}

#endif
