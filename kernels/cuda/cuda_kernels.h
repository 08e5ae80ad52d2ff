/*
 * cuda_kernels.h - the CUDA kernels, callable from C, each with the contract of its CPU
 * reference in kernels/cpu/cpu.h (same shapes, same layouts; only the order of the sums
 * differs). Pointers are device memory (wk_cuda_alloc); pos arrays too. Each call launches
 * on the default stream and returns WK_OK, or WK_EIO with the CUDA error in err (a launch
 * error; an error inside the kernel shows at the next wk_cuda_sync). In a build without CUDA
 * (kernels/cuda/cuda_none.c) every call returns WK_EUNSUPPORTED.
 *
 * Most are first versions, written for correctness (one block per query head, one warp per
 * row); the matmuls (the decode GEMV, kernels.cu) are written to stream the weights at HBM
 * bandwidth. The kernel lab (lab.cu, tests/tools/cuda_lab.c) measures them against the
 * device's copy bandwidth, and faster variants replace them behind the same contracts.
 * Compiled here on every build with nvcc; run on one H200 by scripts/gpu-check (README,
 * "CUDA").
 */
#ifndef WICK_CUDA_KERNELS_H
#define WICK_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu.h" /* struct cpu_mla, cpu_expert: their pointers here are device memory */

int cuda_device_count(void);
/* Selects device d for the calling thread's allocations and launches (cudaSetDevice). */
int wk_cuda_set_device(int d, char *err, size_t errsz);

/* Device memory and copies (cudaMalloc / cudaMemcpy, synchronous). */
int wk_cuda_alloc(void **p, size_t bytes, char *err, size_t errsz);
void wk_cuda_free(void *p);
int wk_cuda_upload(void *dst, const void *src, size_t bytes, char *err, size_t errsz);
int wk_cuda_download(void *dst, const void *src, size_t bytes, char *err, size_t errsz);
/* Waits for the device; returns the first error of the kernels launched since. */
int wk_cuda_sync(char *err, size_t errsz);
/* y[0..bytes) = 0, queued on the default stream (cudaMemsetAsync) */
int wk_cuda_zero(void *y, size_t bytes, char *err, size_t errsz);

/* y[n][rows] = x[n][cols] . w[rows][cols]^T, w in DT_F32, DT_BF16 or DT_F16 */
int wk_cuda_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		   int cols, char *err, size_t errsz);
/* The same for 1..8 tokens on tensor cores (the kernel lab's GEMV v2, kernels.cu): bf16 or
 * FP8 weights (scale as wk_cuda_matmul_fp8's), x split into two bf16 (~1e-5 of the largest
 * output off the f32 reference), cols % 128 == 0, x and w 16-byte aligned; WK_EINVAL
 * otherwise. */
int wk_cuda_gemv_mma(float *y, const float *x, const void *w, enum dt_type wt,
		     const float *scale, int n, int rows, int cols, char *err, size_t errsz);
/* The same contract, software-pipelined (the lab's v3, kernels.cu; not yet run on a GPU): a
 * programmatic dependent launch unless wk_cuda_set_pdl(0), as wk_cuda_matmul. */
int wk_cuda_gemv_mma3(float *y, const float *x, const void *w, enum dt_type wt,
		      const float *scale, int n, int rows, int cols, char *err, size_t errsz);
/* FP8 e4m3 block-scaled weights: scale[ceil(rows/128)][ceil(cols/128)] (cpu_ref_matmul_fp8) */
int wk_cuda_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
		       int rows, int cols, char *err, size_t errsz);
/* Several weights over one input x [n][cols] in one launch: parts[k].y [n][parts[k].rows] =
 * x . parts[k].w^T, each row computed exactly as wk_cuda_matmul / wk_cuda_matmul_fp8 do
 * (scale: FP8 block scales, else NULL); count 1..WK_MATMUL_MAX. With rope_dim > 0 the output
 * is rotated before it is stored, bit for bit as wk_cuda_rope(y + rope_off, n, rope_pos,
 * rope_heads, rope_hd, rope_dim, rope_theta, interleaved) would after it: rows = rope_heads *
 * rope_hd, and rope_hd, rope_off, rope_dim even with rope_off + rope_dim <= rope_hd (so each
 * pair lies in one group of 4 rows); zero-initialised fields mean no rotation. */
#define WK_MATMUL_MAX 8
struct wk_mm {
	float *y;
	const void *w;
	const float *scale;
	enum dt_type dtype;
	int rows;
	const int *rope_pos;
	int rope_heads, rope_hd, rope_off, rope_dim;
	float rope_theta;
};
int wk_cuda_matmul_n(const struct wk_mm *parts, int count, const float *x, int n, int cols,
		     char *err, size_t errsz);
/* Whether wk_cuda_matmul, _fp8 and _n launch their one-dtype kernel (and wk_cuda_gemv_mma3
 * its kernel) as a programmatic dependent (PDL: its blocks start while the kernel before
 * ends and load their first weights then; x is read after that kernel's end). On by
 * default; the kernel lab turns it off to time the launches without it. Process-wide, not
 * thread-safe: set it before use. */
void wk_cuda_set_pdl(int on);
/* Where every kernel, memset and chained launch goes: the legacy default stream (0, the
 * default) or, with per_thread, each host thread's own default stream (cudaStreamPerThread),
 * which is an ordinary stream: whether programmatic dependent launch takes effect on the
 * legacy one is what the lab's launch-floor rows measure. Synchronous copies stay on the
 * legacy stream, which orders itself with both; the NCCL streams wait for the compute
 * stream's event before each collective (comm_nccl.cu). Process-wide: set it before use. */
void wk_cuda_set_stream(int per_thread);
/* For the tests of PDL: copies src [n] into x after sleeping about ns nanoseconds, in one
 * block that lets a programmatic dependent start at once (griddepcontrol.launch_dependents
 * first thing), so that a GEMV launched next reads x while this kernel still sleeps unless
 * it waits as it should. */
int wk_cuda_late_copy(float *x, const float *src, size_t n, unsigned ns, char *err,
		      size_t errsz);
int wk_cuda_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps,
		    char *err, size_t errsz);
int wk_cuda_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		 float theta, bool interleaved, char *err, size_t errsz);
/* Several rmsnorms (layer false) and layernorms (b optional) in one launch, each row as
 * wk_cuda_rmsnorm / wk_cuda_layernorm computes it; with rope_dim > 0, each row's first
 * rope_dim elements then rotated (interleaved pairs, row i at position rope_pos[i]) bit for
 * bit as wk_cuda_rope(y, n, rope_pos, 1, dim, rope_dim, rope_theta, true) would after it. */
#define WK_NORM_MAX 8
struct wk_norm { /* 72 bytes: a chained launch's parameters hold 8 in each of its links */
	float *y;
	const float *x, *w, *b;
	const int *rope_pos;
	const float *add; /* struct be_norm's: a bias first, rows as heads, half-split, no norm */
	int n, dim;
	float eps, rope_theta;
	int16_t rope_dim, heads;
	bool layer, half, bare;
};
int wk_cuda_norm_n(const struct wk_norm *r, int count, char *err, size_t errsz);
/* wk_cuda_rope over several tensors in one launch, each rotated exactly as alone */
#define WK_ROPE_MAX 8
struct wk_rope {
	float *x;
	int n;
	const int *pos;
	int n_heads, head_dim, rot_dim;
};
int wk_cuda_rope_n(const struct wk_rope *r, int count, float theta, bool interleaved, char *err,
		   size_t errsz);
/* Where wk_cuda_attention (and wk_cuda_mla_attention, wk_cuda_mla_absorbed) may split a
 * sequence's keys over several blocks (flash-decoding), when its blocks of (token, kv head)
 * are too few to fill the device: part [part_floats] of
 * device scratch for the blocks' partial results, and count [count_n] zeroed counters (left
 * zero), both the caller's. */
struct wk_att_split {
	float *part;
	size_t part_floats;
	unsigned *count;
	int count_n;
};
/* The floats of wk_att_split.part that a call of n tokens at pos0 (several sequences:
 * s->keys_max) would use at its widest split; pos0 < 0: at any number of positions (what a
 * scratch sized once for the shape needs). */
size_t wk_cuda_attention_part(const struct cpu_gqa *s, int n, int pos0);
/* Causal GQA over the cache *s (cpu_ref_attention; s itself host memory, its pointers device
 * memory), one sequence's tokens at pos0 .. or several sequences' (s->seq), any number of
 * positions (an online softmax), each key and value read once for up to 8 query heads of its
 * kv head, the keys split over blocks as sp allows (NULL: never); s->kv DT_F32, DT_BF16, or
 * DT_F8_E4M3 with the scales ks, vs of its rows of head_dim; WK_EINVAL for another type or
 * a head_dim past what a block's shared memory holds (734 at 8 query heads a kv head). One
 * launch either way: the last block of a split (token, kv head) merges the parts. */
int wk_cuda_attention(float *out, const float *q, const struct cpu_gqa *s, int n, int pos0,
		      const struct wk_att_split *sp, char *err, size_t errsz);
/* Which kernel wk_cuda_attention runs for n tokens at pos0: 1, a block a token (its heads
 * of a kv head), the keys split as sp allows; 2 and 3, blocks of 64 query rows (consecutive
 * tokens of one sequence times their heads of a kv head) that read each key and value once
 * for all of them, on the f32 pipes (2) or on the tensor cores (3: bf16 hi + lo products,
 * f32 within about 2^-16). 3 for a prefill of one sequence (s->seq NULL) of at least 32
 * tokens, head_dim <= 128, unless pos0 >= n and those blocks would be fewer than 132 (a
 * short chunk after a long context, whose keys the first splits over blocks); else 1.
 * wk_cuda_attention_force(1, 2 or 3) makes every call take that path where it can (2 or 3
 * where the tiles can run, else 1); 0, the rule above (tests and the kernel lab). */
int wk_cuda_attention_path(const struct cpu_gqa *s, int n, int pos0);
void wk_cuda_attention_force(int path);
/* Several conversions in one launch (cpu_ref_cast, bit for bit): c[k].n elements from src (type
 * st) to dst (type dt), contiguous and not overlapping; f32 to bf16 rounded to nearest even
 * (dt_f32_to_bf16, NaN kept NaN), bf16 to f32, or a copy when dt == st (DT_F32 or DT_BF16);
 * f32 to DT_F8_E4M3 quantizes rows of w (scales into ds), DT_F8_E4M3 to f32 dequantizes
 * (scales ss), n a multiple of w. count 1..WK_CAST_MAX; WK_EINVAL for another type or count,
 * FP8 without its scales, or n not rows of w > 0. The layout is struct be_cast's. */
#define WK_CAST_MAX 8
struct wk_cast {
	void *dst;
	const void *src;
	size_t n;
	enum dt_type dt, st;
	float *ds;       /* FP8 (struct be_cast) */
	const float *ss;
	int w;
};
int wk_cuda_cast_n(const struct wk_cast *c, int count, char *err, size_t errsz);
int wk_cuda_silu_mul(float *g, const float *u, size_t n, char *err, size_t errsz);
int wk_cuda_add(float *y, const float *x, size_t n, char *err, size_t errsz); /* y += x */
/* y [n][cols] = x quantized to FP8 per token per 128 channels and back (cpu_ref_act_quant,
 * bit for bit); y may equal x */
int wk_cuda_act_quant(float *y, const float *x, int n, int cols, char *err, size_t errsz);
/* The same quantization as codes: xq [n][cols] e4m3 and xs [n][ceil(cols/128)] scales, with
 * xq * xs (per block) bit for bit wk_cuda_act_quant's y; what the FP8 GEMMs take. */
int wk_cuda_act_codes(uint8_t *xq, float *xs, const float *x, int n, int cols, char *err,
		      size_t errsz);
/* x [n][dim] += d, then y = rmsnorm(x) . w: wk_cuda_add and wk_cuda_rmsnorm in one launch */
int wk_cuda_add_rmsnorm(float *x, const float *d, float *y, const float *w, int n, int dim,
			float eps, char *err, size_t errsz);
/* idx[i] = argmax of logits[i][0..vocab), ties to the lower index (samp_argmax) */
int wk_cuda_argmax(int *idx, const float *logits, int n, int vocab, char *err, size_t errsz);
/* Sampling candidates (sample_kernels.cu; cpu_ref_sample_cand): cand [n][cap], head [n] for
 * logits [n][vocab] with settings s [n] (device memory); cap 1..WK_CUDA_CAND_MAX */
#define WK_CUDA_CAND_MAX 1024
int wk_cuda_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head, const float *logits,
			const struct cpu_samp *s, int n, int vocab, int cap, char *err,
			size_t errsz);

/* ---- GLM families (glm_kernels.cu; references in kernels/cpu/glm_ref.c) ---- */

/* cpu_ref_layernorm; b may be NULL; y may equal x */
int wk_cuda_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim,
		      float eps, char *err, size_t errsz);
/* cpu_ref_moe_route: idx [n][top_k] and wt [n][top_k], bias may be NULL. The experts and
 * their order equal the reference's, ties to the lower index; the sigmoid may differ from
 * the CPU's in the last bit in rare cases, so experts within an ulp could swap. WK_EINVAL
 * unless n_experts <= WK_CUDA_MOE_MAX_EXPERTS, n_experts % n_group == 0,
 * 1 <= topk_group <= n_group and top_k <= topk_group * n_experts / n_group. */
int wk_cuda_moe_route(int *idx, float *wt, const float *logits, const float *bias, int n,
		      int n_experts, int top_k, int n_group, int topk_group, bool norm,
		      float scale, char *err, size_t errsz);
#define WK_CUDA_MOE_MAX_EXPERTS 1024 /* as CPU_MOE_MAX_EXPERTS */
/* wk_cuda_moe_route's refusals, without launching anything. */
int wk_cuda_moe_route_check(int n_experts, int top_k, int n_group, int topk_group, char *err,
			    size_t errsz);
/* cpu_ref_gather_rows: dst[i] = src[rows[i]] */
int wk_cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int dim,
			char *err, size_t errsz);
/* cpu_ref_scatter_add_rows: y[rows[i]] += scale[i] * x[i]. rows[0..n) must be distinct (no
 * atomics; the engine's moe_forward passes one expert's tokens, each once). */
int wk_cuda_scatter_add_rows(float *y, const float *x, const int *rows, const float *scale,
			     int n, int dim, char *err, size_t errsz);
/* cpu_ref_mla_absorb_q / _out: w = kv_b_proj in DT_F32, DT_BF16, DT_F16 or DT_F8_E4M3 (scale:
 * its [ceil(rows/128)][ceil(lora/128)] block scales, else NULL); heads h0 <= h < h1 only. */
int wk_cuda_mla_absorb_q(float *qa, const float *q, const void *w, enum dt_type wt,
			 const float *scale, int lora, int n, int n_heads, int d_nope, int d_rope,
			 int d_v, int h0, int h1, char *err, size_t errsz);
int wk_cuda_mla_absorb_out(float *o, const float *lat, const void *w, enum dt_type wt,
			   const float *scale, int lora, int n, int n_heads, int d_nope, int d_v,
			   int h0, int h1, char *err, size_t errsz);
/* cpu_ref_mla_attention, online softmax: any number of keys; the pointers in *s are device
 * memory (s itself is not), the cache's elements of type s->kv (DT_F32, DT_BF16, or
 * DT_F8_E4M3 as struct cpu_mla has it: v is k_a, rows d_a wide, scales a_s, k_b bf16).
 * Where every head reads the same latent rows (ka_head, v_head 0) and the blocks are many
 * enough to fill the device, each key and value is read once for up to 8 heads a block
 * (else a head a block: a decode's keys are read once per head, from L2 after the first);
 * each query's keys split over blocks as sp allows (NULL: never; part rows: i1 *
 * n_heads), as wk_cuda_attention splits. One launch either way.
 * WK_EINVAL when d_a + d_b + d_v > 12149 (shared memory), for another s->kv, or for an FP8
 * one outside that layout. */
int wk_cuda_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
			  int i0, int i1, int h0, int h1, const struct wk_att_split *sp, char *err,
			  size_t errsz);
/* Whether wk_cuda_mla_attention runs as query tiles (wk_cuda_attention's paths 2 and 3, 32
 * query rows of a head a block, each key and value read once for them; on the tensor cores
 * but where wk_cuda_attention_force(2) asks for the f32 pipes): the expanded form's
 * dense prefill (per-head k_a and v in f32, no selection, one sequence, all of tokens 0..n
 * and every head) of at least 32 tokens, d_a + d_b and d_v at most 256, under the same rule
 * for pos0 as wk_cuda_attention_path; as wk_cuda_attention_force says where it is set.
 * wk_cuda_mla_tiled runs it. */
bool wk_cuda_mla_tiles(const struct cpu_mla *s, int n, int pos0, int i0, int i1, int h0,
		       int h1);
int wk_cuda_mla_tiled(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
		      char *err, size_t errsz);
/* Whether wk_cuda_mla_attention runs the absorbed layout's latent attention as tiles on the
 * tensor cores (one token's heads, 8 a block, reading each of its keys' latent rows once for
 * them; its DSA selection or dense): every token and head of the call (of one sequence, or
 * of several: s->seq), v the latent k_a itself (d_v = d_a <= 512, d_a + d_b <= 576), under
 * wk_cuda_attention_path's rule for n and pos0; forced, only by wk_cuda_attention_force(3).
 * wk_cuda_mla_latent runs it. */
bool wk_cuda_mla_latent_tiles(const struct cpu_mla *s, int n, int pos0, int i0, int i1,
			      int h0, int h1);
int wk_cuda_mla_latent(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
		       char *err, size_t errsz);
/* The floats of wk_att_split.part that wk_cuda_mla_attention over tokens 0..n and all heads
 * (or wk_cuda_mla_absorbed of n tokens) at pos0 would use at its widest split; pos0 < 0: at
 * any number of positions. */
size_t wk_cuda_mla_part(const struct cpu_mla *s, int n, int pos0);
/* How wk_cuda_mla_attention over n tokens (from 0) and nh heads at pos0 would run, given
 * scratch enough: *gm heads a block, each query's keys in *split parts (what the lab prints
 * and the tests check). */
void wk_cuda_mla_shape(const struct cpu_mla *s, int n, int nh, int pos0, int *gm, int *split);
/* The kernel lab's knob: from now on, gm (1, 2, 4 or 8) heads a block wherever the latent is
 * shared and shared memory holds them, whether or not the blocks fill the device (the
 * split still fills it as it can); 0 (or another value): the plan's own choice. Not for
 * the backend: it changes what every later call does (not thread-safe). */
void wk_cuda_mla_force(int gm);
/* wk_cuda_mla_absorb_q, wk_cuda_mla_attention and wk_cuda_mla_absorb_out over all n tokens
 * and s->n_heads heads as one launch of three stages, each spread over the device: qa
 * [n][n_heads][lora + s->d_b] from q, lat [n][n_heads][lora] = the attention *s over qa, o
 * [n][n_heads][d_v] from lat; w and scale as for absorb. The stages count on sp's first 4
 * counters, the split's on those after them; without sp or its counters, the three kernels
 * one after another. Each of qa, lat and o is bit for bit what the three write where they
 * split alike: mla_attention given the same part scratch and sp's counters past the first
 * 4. *s is the absorbed (latent) attention: s->d_a and s->d_v must be lora. WK_EINVAL when
 * they are not, or where absorb or mla_attention would refuse. */
int wk_cuda_mla_absorbed(float *o, float *qa, float *lat, const float *q, const void *w,
			 enum dt_type wt, const float *scale, int lora, const struct cpu_mla *s,
			 int n, int pos0, int d_nope, int d_v, const struct wk_att_split *sp,
			 char *err, size_t errsz);
/* cpu_ref_dsa_topk over d (its key cache of element type DT_F32, DT_BF16, or DT_F8_E4M3
 * with its scales; WK_EINVAL otherwise, FP8 without scales included; d->seq and d->pos, as
 * q, w, sel and nsel, in device memory); sel/nsel equal the reference's for equal scores
 * (exact top-k, ties to the lower position); the scores themselves are summed in another
 * order. The queries run in groups of up to max_group (<= 65535) whose score rows, one a
 * query of the most keys (pos0 + n, or d->keys_max with d->seq), fit in scores
 * (score_floats >= one row): one launch a group on paths 1 and 3 (wk_cuda_dsa_path),
 * scoring and then selecting (the last block of each query selects, or takes every key of a
 * query within topk), so a decode step's queries, one sequence's or several's, are one launch
 * and a prefill's are a few (two a group on path 2). count:
 * max_group unsigned ints of device memory, zero before and left zero. hist: NULL, or
 * hist_rows x WK_DSA_BINS unsigned ints of device memory, zero before and left zero: a group
 * of at most hist_rows queries on path 3 (a decode step's) then has its scoring blocks count
 * the top bits of their scores there for the select, which is then one pass over the scores
 * (wk_cuda_dsa_cap), not two. */
#define WK_DSA_BINS 4096
int wk_cuda_dsa_topk(int *sel, int *nsel, const float *q, const float *w,
		     const struct cpu_dsa *d, int n, int pos0, float *scores, size_t score_floats,
		     unsigned *count, int max_group, unsigned *hist, int hist_rows, char *err,
		     size_t errsz);
/* Which kernels score wk_cuda_dsa_topk's queries: 1, k_dsa_topk_n on the f32 pipes (a warp a
 * query and key, the select in the same launch); 2, k_dsa_score_mma on the tensor cores (a
 * block runs 128 rows of (query, head) over each key read, bf16 hi + lo products, f32 within
 * about 2^-16), then the select, two launches a group; 3, k_dsa_topk_tc, path 1's launch with
 * a query's keys on the tensor cores (16 keys a warp against all of its heads). 2 for one
 * sequence (d->seq NULL) whose queries past topk are at least 16, n_heads <= 128 and
 * head_dim <= 128; else 3 (a decode step, one sequence's or several's) for n_heads <= 32 and
 * head_dim <= 128; both need head_dim a multiple of 8 and d->k 16-byte aligned; else 1.
 * wk_cuda_dsa_force(1, 2 or 3) makes every call take that path where it can (else 1); 0,
 * the rule above (tests and the kernel lab). */
int wk_cuda_dsa_path(const struct cpu_dsa *d, int n, int pos0);
void wk_cuda_dsa_force(int path);
/* The select's candidate list (the tests' and the kernel lab's knob; not thread-safe): a
 * query's top-k is chosen in two passes over its scores, not five, when the keys at or above
 * its top-k boundary's bin (an eighth of an octave) number at most cap (default and most
 * DSA_CAP, 12,288, in 112 KiB of the launch's dynamic shared memory); else, or with cap 0, by
 * the radix select of five passes. A negative cap restores the default. */
void wk_cuda_dsa_cap(int cap);

/* ---- grouped MoE experts (moe_kernels.cu) ---- */

/* A layer's grouped experts as the kernels read them. experts: a DEVICE array of n_local
 * struct cpu_expert ([ex0, ex0 + n_local) of the layer's experts) whose pointers are device
 * memory, gate/up [inter][dim] and down [dim][inter], all weights in wdt (DT_F32, DT_BF16,
 * DT_F16 or DT_F8_E4M3 with its block scales). shared: the layer's shared expert, a HOST
 * struct whose pointers are device memory (the kernels take it by value), of width
 * shared_inter, its weights in shared_wdt (one of the same four: a TP slice that cuts FP8
 * blocks is stored dequantized); NULL for none. split_combine: the combine as a launch of
 * its own after down, the unfused path the tests hold the fused one to. */
struct wk_moe {
	const struct cpu_expert *experts;
	int ex0, n_local;
	enum dt_type wdt;
	int dim, inter;
	const struct cpu_expert *shared;
	enum dt_type shared_wdt;
	int shared_inter;
	bool split_combine;
};

/* cpu_ref_moe_experts (with m's shared expert, if any) on the device in 3 launches: the
 * plan, gate/up + SiLU, and down with the combine (the last block to finish a token's rows
 * adds them: a counter per token, every block's rows fenced before it counts, the counters
 * left zero); 4 with split_combine. From 64 tokens with FP8 weights throughout (routed and
 * shared), grouped GEMMs on the tensor cores instead, within ~1e-5 of the reference, in 6
 * launches: the plan, the split of x, gate and up, SiLU * up split, down, the combine
 * (moe_kernels.cu). None when n is 0, or top_k or n_local is 0
 * and there is no shared expert. y [n][dim] += the local experts' outputs for the routing
 * idx, wt [n][top_k] (device memory), or with a shared expert y = its output, then the slots
 * added; slots whose expert is outside [ex0, ex0 + n_local) are skipped. The host never
 * reads the table, so it cannot refuse an FP8 expert without scales: that expert's outputs
 * become NaN (the engine checks the scales when it builds the table). scratch:
 * wk_cuda_moe_experts_scratch() bytes of device memory, in use until the kernels finish.
 * Results do not depend on the grouping or on which block combines (each token's slots are
 * added in order j, after the shared expert's output). WK_EINVAL for another wdt, negative
 * sizes, dim or inter <= 0, shared_inter <= 0 with a shared expert, n * top_k > INT_MAX, or
 * a NULL table or scratch when there is work; the same for shared_wdt. */
size_t wk_cuda_moe_experts_scratch(int n, int top_k, const struct wk_moe *m);
int wk_cuda_moe_experts(float *y, const float *x, const int *idx, const float *wt, int n,
			int top_k, const struct wk_moe *m, void *scratch, char *err,
			size_t errsz);
/* wk_cuda_moe_route into idx, wt (device, [n][top_k]) and then wk_cuda_moe_experts with that
 * routing, in 3 launches instead of 4: the router's blocks and the plan are one launch (the
 * last router block to finish plans), each computing exactly what the two ops do, so idx,
 * wt and y equal theirs bit for bit. count: one unsigned of device memory, zero before and
 * left zero. Refuses what either would. */
int wk_cuda_moe_route_experts(float *y, const float *x, const float *logits, const float *bias,
			      int n_experts, int n_group, int topk_group, bool norm, float scale,
			      int *idx, float *wt, int n, int top_k, const struct wk_moe *m,
			      void *scratch, unsigned *count, char *err, size_t errsz);


/* Chained launches: ops that follow one another, as one launch. Each link runs exactly as its
 * own call would (wk_cuda_matmul_n, wk_cuda_add_rmsnorm, wk_cuda_norm_n, wk_cuda_cast_n), bit
 * for bit, and entirely after the links before it: each block takes a ticket from a counter
 * as it starts, the tickets are dealt to the links in order, and a link's blocks wait until
 * every block of the link before it has finished. A block waits only for blocks that took
 * smaller tickets, so have started and hold their SMs: no co-residency is assumed (no
 * cooperative launch) and nothing can wait on a block that has not started. Reads of what
 * earlier links wrote are plain loads after an acquire (never the read-only path). The matmul
 * links' n must give one token pass (1, 2, 3-4, 5+). sync: WK_CHAIN_SYNC zeroed counters of
 * device memory, which each launch leaves zero; one chain at a time on them. At most
 * WK_CHAIN_MAX links, a MoE op counting WK_CHAIN_MOE_LINKS (moe_kernels.cu, where every op's
 * device code is). */
#define WK_CHAIN_MAX 6
#define WK_CHAIN_SYNC (WK_CHAIN_MAX + 2)
enum wk_link_kind { WK_LINK_MATMUL, WK_LINK_ADD_RMSNORM, WK_LINK_NORM, WK_LINK_MOE,
		    WK_LINK_CAST };
struct wk_link {
	enum wk_link_kind kind;
	int n; /* tokens: the rows of x (matmul, add_rmsnorm) */
	/* WK_LINK_MATMUL: wk_cuda_matmul_n(mm, mm_count, x, n, cols) */
	struct wk_mm mm[WK_MATMUL_MAX];
	int mm_count, cols;
	const float *x;
	/* WK_LINK_ADD_RMSNORM: wk_cuda_add_rmsnorm(ax, d, ay, w, n, dim, eps) */
	float *ax, *ay;
	const float *d, *w;
	int dim;
	float eps;
	/* WK_LINK_NORM: wk_cuda_norm_n(norm, norm_count) */
	struct wk_norm norm[WK_NORM_MAX];
	int norm_count;
	/* WK_LINK_MOE: wk_cuda_moe_route_experts(moe_y, moe_x, logits, bias, n_experts, n_group,
	 * topk_group, norm_w, scale, idx, wt, n, top_k, &moe, scratch, count), its warp-per-row
	 * path only (wk_cuda_chain_moe says which): 3 of the chain's WK_CHAIN_MAX links (the
	 * router's blocks with the plan, gate/up, down with the combine) */
	float *moe_y, *wt;
	const float *moe_x, *logits, *bias;
	int n_experts, n_group, topk_group, top_k;
	bool norm_w;
	float scale;
	int *idx;
	struct wk_moe moe;
	void *scratch;
	unsigned *count;
	/* WK_LINK_CAST: wk_cuda_cast_n(cast, cast_count) (a bf16 KV cache's writes) */
	struct wk_cast cast[WK_CAST_MAX];
	int cast_count;
};
int wk_cuda_chain(const struct wk_link *l, int count, unsigned *sync, char *err, size_t errsz);
/* Whether a MoE op of n tokens over m can be a chain's link (the grouped GEMMs and the split
 * combine cannot), and the chain links it takes. */
bool wk_cuda_chain_moe(int n, const struct wk_moe *m);
#define WK_CHAIN_MOE_LINKS 3

/* ---- FP8 GEMM for prefill (gemm_fp8.cu) ---- */

/* cpu_ref_gemm_fp8 on the tensor cores (mma.sync, sm_89+): y [n][rows] = the e4m3 tokens xq
 * [n][cols] with their per-token 1x128 scales xs [n][ceil(cols/128)] times the e4m3 weight
 * w [rows][cols] with its 128x128 block scales ws [ceil(rows/128)][ceil(cols/128)]^T, each
 * 128-deep block summed on its own and promoted to the f32 total with its scales (the
 * DeepGEMM scheme). Any shape; cols % 16 == 0 with 16-byte aligned xq and w is the fast
 * path. Nothing happens when n or rows is 0; WK_EINVAL for cols < 0 or rows > 8,388,480. */
int wk_cuda_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		     const float *ws, int n, int rows, int cols, char *err, size_t errsz);

/* wk_cuda_gemm_fp8's contract on Hopper's warpgroup tensor cores (wgmma, sm_90a;
 * gemm_wgmma.cu): the same inputs, outputs, shapes and errors. */
int wk_cuda_gemm_fp8_wgmma(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			   const float *ws, int n, int rows, int cols, char *err, size_t errsz);
/* The same on clusters of two CTAs that share each weight tile: each CTA's copy engine
 * loads half of it into both (TMA multicast), halving the weight tiles' traffic from L2.
 * Where the TMA kernel does not apply (cols % 16 != 0, misaligned operands) it is
 * wk_cuda_gemm_fp8_wgmma; WK_EIO when no 2-CTA cluster fits on the device. The kernel lab
 * times both; on an H200 the one-CTA kernel was the faster (844 against 557 TFLOPS at
 * 4096 x 7168 x 2048), so the backend runs wk_cuda_gemm_fp8_wgmma. */
int wk_cuda_gemm_fp8_wgmma_mc2(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			       const float *ws, int n, int rows, int cols, char *err,
			       size_t errsz);
/* The same with tiles of 160 weight rows (each spanning two weight-scale blocks) instead of
 * 128, one CTA a tile (_n160) or clusters of two (_n160_mc2); the kernel lab times them
 * beside the 128-row ones. */
int wk_cuda_gemm_fp8_wgmma_n160(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
				const float *ws, int n, int rows, int cols, char *err,
				size_t errsz);
int wk_cuda_gemm_fp8_wgmma_n160_mc2(float *y, const uint8_t *xq, const float *xs,
				    const uint8_t *w, const float *ws, int n, int rows, int cols,
				    char *err, size_t errsz);
/* wk_cuda_gemm_fp8_wgmma with each tile's store overlapped with the next tile's first k block
 * (the lab's "wgmma ovl"; not yet run on a GPU); the same contract. */
int wk_cuda_gemm_fp8_wgmma_ovl(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			       const float *ws, int n, int rows, int cols, char *err, size_t errsz);
/* wk_cuda_gemm_fp8_wgmma with each tile's totals staged in shared memory and stored by the
 * bulk tensor copy engine (TMA), so the consumers go on to the next tile at once (the lab's
 * "wgmma st"; not yet run on a GPU); the same contract. Where rows % 4 != 0 or y is not
 * 16-byte aligned (the output's tensor map), it is wk_cuda_gemm_fp8_wgmma. */
int wk_cuda_gemm_fp8_wgmma_st(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			      const float *ws, int n, int rows, int cols, char *err, size_t errsz);

/* ---- FP8 weights x f32 activations for prefill (gemm_fp8w.cu) ---- */

/* Columns of a row of wk_cuda_act_split's output: cols rounded up to 64 (a GEMM stage). */
#define WK_CUDA_SPLIT_COLS(cols) (((cols) + 63) / 64 * 64)
/* x [n][cols] f32 as two bf16 halves for wk_cuda_gemm_fp8w: xb [2][n][WK_CUDA_SPLIT_COLS(cols)]
 * (bf16 bits), xb[0] = hi = bf16(x) (nearest, ties to even), xb[1] = lo = bf16(x - hi), zeros
 * past cols; hi + lo is x within 2^-16 of |x|. WK_EINVAL for n < 0 or cols < 0. */
int wk_cuda_act_split(uint16_t *xb, const float *x, int n, int cols, char *err, size_t errsz);
/* cpu_ref_matmul_fp8 on Hopper's warpgroup tensor cores (wgmma, sm_90a): y [n][rows] =
 * x . w^T, x given as wk_cuda_act_split's xb (same n and cols, 16-byte aligned), w e4m3
 * [rows][cols] with block scales ws [ceil(rows/128)][ceil(cols/128)]; each 128-deep block
 * summed on the tensor cores (both halves, weights converted to bf16 exactly) and promoted
 * with its scale. Within ~1e-5 of the f32 reference's largest output. Any shape; cols % 16
 * == 0 with w 16-byte aligned is the fast path. Nothing happens when n or rows is 0;
 * WK_EINVAL for cols < 0, rows > 8,388,480 or a misaligned xb. */
int wk_cuda_gemm_fp8w(float *y, const uint16_t *xb, const uint8_t *w, const float *ws, int n,
		      int rows, int cols, char *err, size_t errsz);
/* How wk_cuda_gemm_fp8w and the MoE experts' grouped GEMMs run, process-wide: 0 as measured
 * on the H200 (the weights converted into a bf16 tile in shared memory, fp8w_tile; the token
 * tiles fastest in the grid); WK_FP8W_RS the weights as wgmma's register operand
 * (fp8w_tile_rs, both); WK_FP8W_WF the dense GEMM's weight tiles fastest in the grid
 * (consecutive blocks share a token tile; the MoE GEMMs keep their order). Neither yet run on
 * a GPU. Set before use (the backend from WICK_CUDA_FP8W=rs, wf or rs,wf; the tests and the
 * lab). */
#define WK_FP8W_RS 1
#define WK_FP8W_WF 2
void wk_cuda_fp8w_mode(int mode);
/* How the MoE experts run below the grouped GEMMs (decode), process-wide: 0 (the default)
 * streaming, 4 rows a warp in 16-byte chunks as the decode GEMV reads its weights; 1 the first
 * version, a warp per row reading a byte a lane (the lab's baseline; the tests run both).
 * Set before use. */
void wk_cuda_moe_rows_v0(int on);

/* The kernel lab's benchmark (lab.cu): prints each kernel's GB/s beside the device's copy
 * bandwidth measured first, and the FP8 GEMM's and the prefill attention's TFLOPS. only:
 * NULL for every part, else "gemv" (with decode attention), "gemm" or "prefill" (its
 * attention) (the ceilings, then that part alone: a profiler's short run). WK_OK,
 * WK_EINVAL for another only, or WK_EIO when a step failed (printed). */
int wk_cuda_lab(const char *only);

#endif
