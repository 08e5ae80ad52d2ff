/*
 * cpu.h - CPU kernels: a plain reference for every op, and fast versions (threads + AVX2).
 *
 * The cpu_ref_* functions are the readable definition of each op. They are single-threaded,
 * scalar, and stay forever: every fast version (and later the CUDA kernels) is tested against
 * them with a tolerance suited to its precision.
 *
 * Conventions: activations are f32, row-major. Weights are row-major [rows][cols] in the
 * dtype given (DT_F32, DT_BF16 or DT_F16), i.e. the Hugging Face nn.Linear layout
 * [out_features][in_features]. No function allocates except cpu_pool_create and
 * cpu_read_bandwidth; none can fail once its arguments are valid.
 */
#ifndef CPU_H
#define CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/* The side of an FP8 weight_scale_inv block, and the width of an activation or FP8 KV
 * cache block with one scale. */
#define CPU_FP8_BLOCK 128

/* ---- thread pool ---------------------------------------------------------------------- */

struct cpu_pool; /* opaque; one caller at a time may run work on a pool */

/* nthreads <= 0 means one per online core. Returns WK_OK or WK_ENOMEM/WK_EIO. */
int cpu_pool_create(int nthreads, struct cpu_pool **out);
void cpu_pool_destroy(struct cpu_pool *p); /* NULL is fine */
int cpu_pool_size(const struct cpu_pool *p);
/* Runs fn(ctx, i, ntasks) for every i in [0, ntasks) on the pool's threads (the caller's
 * thread takes part) and returns when all are done. p may be NULL: runs inline. Tasks are
 * claimed dynamically, in no fixed thread order. Not reentrant: fn must not run work on the
 * same pool. Costs ~1 us when the workers are warm: after a job they spin for ~2 ms (yielding
 * when the machine is oversubscribed), then sleep until the next one. */
void cpu_pool_run(struct cpu_pool *p, void (*fn)(void *ctx, int task, int ntasks), void *ctx,
		  int ntasks);

/* ---- reference kernels ---------------------------------------------------------------- */

/* y[n][rows] = x[n][cols] . w[rows][cols]^T */
void cpu_ref_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		    int cols);
/* FP8 block-scaled weights (the GLM-5-FP8 / DeepSeek-V3 convention): w[rows][cols] holds
 * float8_e4m3fn bytes and scale[ceil(rows/128)][ceil(cols/128)] f32 block scales (the
 * checkpoint's `weight_scale_inv`); the dequantized weight is fp8(w[r][c]) * scale[r/128][c/128].
 * Edge blocks may be partial. y[n][rows] = x[n][cols] . dequant(w)^T */
void cpu_ref_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
			int rows, int cols);
/* FP8 x FP8 GEMM with block scales (the DeepGEMM scheme, the prefill path once activations
 * are quantized): xq [n][cols] e4m3 bytes with xs [n][ceil(cols/128)] f32, one scale per
 * token per 128 channels (cpu_ref_act_quant's blocks); w [rows][cols] e4m3 with ws
 * [ceil(rows/128)][ceil(cols/128)] as cpu_ref_matmul_fp8's scale. For each 128-column block
 * b (the last may be partial) s_b = the f32 sum, in column order, of e4m3(xq[t][c]) *
 * e4m3(w[r][c]) (each product exact); y[t][r] = the f32 sum over b, in order, of
 * s_b * (xs[t][b] * ws[r/128][b]). */
void cpu_ref_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		      const float *ws, int n, int rows, int cols);
/* Activation quantization for FP8 x FP8 matmuls (the DeepSeek-V3 / DeepGEMM scheme): each
 * token's row is cut into 128-channel blocks (the last may be partial), each block gets the
 * scale s = amax / 448 (1 when the block is all zeros), and y = e4m3(x / s) * s: the value
 * an FP8 GEMM with 1x128 activation scales multiplies, so an FP8-weight matmul over y is
 * that GEMM up to f32 rounding. y may equal x. */
void cpu_ref_act_quant(float *y, const float *x, int n, int cols);
/* The scale of one block x [m] (m <= 128) of cpu_ref_act_quant: amax / 448, 1 when all zero. */
float cpu_act_scale(const float *x, int m);
/* v rounded to the float8_e4m3fn grid (nearest, ties to even; saturating at +-448): what
 * dt_e4m3_to_f32(dt_f32_to_e4m3(v)) gives, computed without the byte. */
float cpu_e4m3_round(float v);
/* y[n][dim] = x / rms(x) * w, rms over each row, eps inside the sqrt. y may equal x. */
void cpu_ref_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps);
/* Rotary embedding in place on x[n][n_heads * head_dim]: for token i at position pos[i],
 * the first rot_dim dims of each head are rotated with frequencies theta^(-2j/rot_dim).
 * interleaved=false: Hugging Face rotate_half (pairs j and j + rot_dim/2);
 * interleaved=true: GPT-J style (pairs 2j and 2j+1). */
void cpu_ref_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		  float theta, bool interleaved);
void cpu_ref_softmax(float *x, int n); /* in place, numerically stable */
/* KV caches hold DT_F32 or DT_BF16 elements, or FP8: DT_F8_E4M3 codes with one f32 scale
 * per 128 elements of a row (the last block of a row may be partial), as cpu_ref_act_quant
 * cuts a token's row: a cache of rows w wide keeps row r's scales at s[r * cpu_kv_blocks(w)],
 * and its element (r, c) is e4m3(code) * s[r * cpu_kv_blocks(w) + c / 128]. An FP8 cache's
 * MLA rope keys (k_b) are bf16 (cpu_kv_b_type), as FlashMLA's FP8 layout keeps them. */
static inline int cpu_kv_blocks(int w)
{
	return (w + CPU_FP8_BLOCK - 1) / CPU_FP8_BLOCK;
}
static inline enum dt_type cpu_kv_b_type(enum dt_type kv)
{
	return kv == DT_F8_E4M3 ? DT_BF16 : kv;
}
/* Row r's scales in an FP8 cache's scales s, rows w wide; NULL for a cache without (s NULL). */
static inline const float *cpu_kv_scales(const float *s, size_t r, int w)
{
	return s ? s + r * (size_t)cpu_kv_blocks(w) : NULL;
}
/* Element i of a DT_F32 or DT_BF16 cache as f32. */
static inline float cpu_kv_at(const void *c, enum dt_type t, size_t i)
{
	return t == DT_BF16 ? dt_bf16_to_f32(((const uint16_t *)c)[i]) : ((const float *)c)[i];
}
/* Element c of row r of a cache of any KV type, rows w wide (s: an FP8 cache's scales). */
static inline float cpu_kv_rc(const void *p, enum dt_type t, const float *s, int w, size_t r,
			      int c)
{
	size_t i = r * (size_t)w + (size_t)c;
	if (t == DT_F8_E4M3)
		return dt_e4m3_table[((const uint8_t *)p)[i]] *
		       cpu_kv_scales(s, r, w)[c / CPU_FP8_BLOCK];
	return cpu_kv_at(p, t, i);
}
/* The start of row-element i of a cache of type t (byte arithmetic on the element size). */
static inline const void *cpu_kv_ptr(const void *c, enum dt_type t, size_t i)
{
	return (const char *)c + i * dt_size(t);
}
/* dst [n] (type dt) = src [n] (type st): f32 -> bf16 rounds to nearest even
 * (dt_f32_to_bf16), bf16 -> f32 is exact, equal types copy (struct be_cast). FP8: f32 ->
 * DT_F8_E4M3 quantizes rows of w elements (n a multiple of w) as cpu_ref_act_quant does
 * (scale = amax / 448 a 128-element block, 1 for an all-zero block; code =
 * dt_f32_to_e4m3(x / scale)), the scales into ds [n / w][cpu_kv_blocks(w)];
 * DT_F8_E4M3 -> f32 is e4m3(code) * the block's scale from ss. */
void cpu_ref_cast(void *dst, enum dt_type dt, const void *src, enum dt_type st, size_t n,
		  float *ds, const float *ss, int w);
/* Causal grouped-query attention over a KV cache (cpu_ref_attention):
 *   k,v  the cache, rows of kv_stride elements of type kv (DT_F32, DT_BF16 or DT_F8_E4M3,
 *        read as f32: the same arithmetic as an f32 cache holding the same values), row t
 *        position t; kv head g sits at columns g * head_dim. FP8: the cache is rows of
 *        head_dim elements (one a position and kv head; kv_stride a multiple of head_dim)
 *        with their scales ks, vs (cpu_kv_rc, w = head_dim: position t's head g is row
 *        t * kv_stride / head_dim + g); else ks, vs are ignored
 * Query head h uses kv head h / (n_heads / n_kv); scores are q.k * scale.
 * The tokens of several sequences at once (seq NULL: all of one, token i at pos0 + i): token
 * i's position t is row seq[i] * seq_rows + t (each sequence's cache seq_rows rows apart),
 * and it attends to 0 .. pos[i]. keys_max: the most keys a token has (the largest pos[i] + 1),
 * for a kernel's plan. */
struct cpu_gqa {
	const void *k, *v;
	const float *ks, *vs;
	enum dt_type kv;
	int n_heads, n_kv, head_dim, kv_stride;
	float scale;
	const int *seq, *pos;
	size_t seq_rows;
	int keys_max;
};
/* Token i's first cache row (its sequence's position 0), and its number of keys. */
static inline size_t cpu_gqa_base(const struct cpu_gqa *s, int i)
{
	return s->seq ? (size_t)s->seq[i] * s->seq_rows : 0;
}
static inline int cpu_gqa_len(const struct cpu_gqa *s, int i, int pos0)
{
	return (s->seq ? s->pos[i] : pos0 + i) + 1;
}
/* n new tokens whose keys and values are already in the cache *s:
 * q [n][n_heads * head_dim] -> out [n][n_heads * head_dim]. */
void cpu_ref_attention(float *out, const float *q, const struct cpu_gqa *s, int n, int pos0);
/* g[i] = silu(g[i]) * u[i] for i < n */
void cpu_ref_silu_mul(float *g, const float *u, size_t n);

/* ---- fast kernels (same contracts; pool may be NULL) ------------------------------------- */

/* Splits rows over the pool; AVX2+FMA inner loops when the CPU has them. */
void cpu_matmul(struct cpu_pool *p, float *y, const float *x, const void *w, enum dt_type wt,
		int n, int rows, int cols);
/* Same contract as cpu_ref_matmul_fp8: dequantizes per 128-block inside the dot product
 * (no full-precision copy of the weights), SIMD when the CPU has AVX2. */
void cpu_matmul_fp8(struct cpu_pool *p, float *y, const float *x, const uint8_t *w,
		    const float *scale, int n, int rows, int cols);
/* Splits (token, head) pairs over the pool. */
void cpu_attention(struct cpu_pool *p, float *out, const float *q, const struct cpu_gqa *s,
		   int n, int pos0);
bool cpu_has_avx2(void); /* AVX2, FMA and F16C, checked once at run time */

/* ---- GLM families: reference kernels (glm_ref.c) ---------------------------------------- */

#define CPU_MOE_MAX_EXPERTS 1024 /* routed experts per MoE layer the router handles */

/* LayerNorm per row: y = (x - mean) / sqrt(var + eps) * w + b (b may be NULL). y may equal x. */
void cpu_ref_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim,
		       float eps);
/* Sigmoid MoE router with noaux_tc selection (DeepSeek-V3 / GLM). For each token t:
 * s = sigmoid(logits[t]) [n_experts]; choice = s + bias (bias may be NULL: zeros);
 * when n_group > 1 each of the n_group equal groups scores the sum of its two best choice
 * values and only the topk_group best groups stay eligible; idx[t][0..top_k) are the top_k
 * eligible experts by choice, best first, the lower index winning ties; wt[t][k] =
 * s[idx] (the bias only selects), divided by (sum + 1e-20) when norm, times scale.
 * n_experts <= CPU_MOE_MAX_EXPERTS, n_experts % n_group == 0, topk_group <= n_group,
 * top_k <= topk_group * n_experts / n_group. */
void cpu_ref_moe_route(int *idx, float *wt, const float *logits, const float *bias, int n,
		       int n_experts, int top_k, int n_group, int topk_group, bool norm,
		       float scale);
/* dst[i][dim] = src[rows[i]][dim] for i < n */
void cpu_ref_gather_rows(float *dst, const float *src, const int *rows, int n, int dim);
/* y[rows[i]][dim] += scale[i] * x[i][dim] for i < n, in order of i */
void cpu_ref_scatter_add_rows(float *y, const float *x, const int *rows, const float *scale,
			      int n, int dim);
/* One routed expert's SwiGLU MLP: gate, up [inter][dim] and down [dim][inter] in one dtype
 * (FP8: each with its [ceil(rows/128)][ceil(cols/128)] block scales, else the scales NULL). */
struct cpu_expert {
	const void *gate, *up, *down;
	const float *gate_s, *up_s, *down_s;
};
/* The routed experts of an MoE layer in one op (grouped): for token t < n and slot j < top_k
 * whose expert e = idx[t*top_k + j] lies in [ex0, ex0 + n_local), with z = down_e(silu(
 * gate_e(x[t])) * up_e(x[t])): y[t] += wt[t*top_k + j] * z, the slots of a token added in
 * order j = 0, 1, ... (so the result does not depend on how tokens are grouped); slots of
 * other experts (another rank's) are skipped. experts[e - ex0] are expert e's weights, of
 * dtype wdt. Each z is computed as cpu_ref_matmul / cpu_ref_matmul_fp8 and cpu_ref_silu_mul
 * compute it for one row. shared (NULL: none): the layer's shared expert; with it y[t] is
 * first overwritten with its output for x[t] (every token, weight 1), then the slots are
 * added to that. scratch: 2 * max(inter, shared->inter) + dim floats. */
struct cpu_shared_expert {
	struct cpu_expert w; /* gate, up [inter][dim], down [dim][inter] */
	enum dt_type dtype;
	int inter;
};
void cpu_ref_moe_experts(float *y, const float *x, const int *idx, const float *wt, int n,
			 int top_k, const struct cpu_expert *experts, int ex0, int n_local,
			 enum dt_type wdt, int dim, int inter,
			 const struct cpu_shared_expert *shared, float *scratch);
/* MLA absorption (DeepSeek-V2/V3, GLM-5). w = kv_b_proj [n_heads * (d_nope + d_v)][lora] in
 * dtype wt (scale: FP8 block scales, else NULL); head h's rows are d_nope k rows (W_uk,h)
 * then d_v value rows (W_uv,h). Heads h0 <= h < h1 only (the rest are left alone).
 * absorb_q: q [n][n_heads][d_nope + d_rope] -> qa [n][n_heads][lora + d_rope] =
 *           [q_nope . W_uk,h | q_pe].
 * absorb_out: lat [n][n_heads][lora] -> o [n][n_heads][d_v] = W_uv,h . lat. */
void cpu_ref_mla_absorb_q(float *qa, const float *q, const void *w, enum dt_type wt,
			  const float *scale, int lora, int n, int n_heads, int d_nope,
			  int d_rope, int d_v, int h0, int h1);
void cpu_ref_mla_absorb_out(float *o, const float *lat, const void *w, enum dt_type wt,
			    const float *scale, int lora, int n, int n_heads, int d_nope, int d_v,
			    int h0, int h1);
/* Attention whose key has two parts, k = [k_a (d_a) | k_b (d_b)], k_b shared by all heads
 * (MLA's rope key). Key position t of head h: k_a + t*ka_stride + h*ka_head (ka_head 0: one
 * key for all heads), k_b + t*kb_stride; value v + t*v_stride + h*v_head; all three of
 * element type kv (DT_F32 or DT_BF16; offsets and strides in elements). An FP8 cache
 * (kv DT_F8_E4M3) is MLA's latent read as absorbed attention reads it: v is k_a
 * (v_stride = ka_stride = d_a = d_v, ka_head = v_head = 0), a_s its scales (rows d_a
 * wide, cpu_kv_rc), and k_b is bf16 (cpu_kv_b_type). */
struct cpu_mla {
	int n_heads, d_a, d_b, d_v;
	enum dt_type kv;
	const void *k_a, *k_b, *v;
	const float *a_s;
	size_t ka_stride, ka_head, kb_stride, v_stride, v_head;
	/* Token i attends to positions sel[i*sel_stride + j], j < nsel[i] (ascending); when sel
	 * is NULL, to 0 .. pos0 + i (dense causal). */
	const int *sel, *nsel;
	int sel_stride;
	float scale; /* score = q.k * scale */
	/* The tokens of several sequences at once (seq NULL: all of one, at pos0 ..): token i's
	 * position t is row seq[i] * seq_rows + t of k_a, k_b, v and a_s (each sequence's
	 * caches seq_rows rows apart), and dense, it attends to 0 .. pos[i]. keys_max: the
	 * most keys a token has (dense: the largest pos[i] + 1), for a kernel's plan. */
	const int *seq, *pos;
	size_t seq_rows;
	int keys_max;
};
/* The cache row of token i's position t, and token i's number of keys (cpu_mla). */
static inline size_t cpu_mla_row(const struct cpu_mla *s, int i, int t)
{
	return (s->seq ? (size_t)s->seq[i] * s->seq_rows : 0) + (size_t)t;
}
static inline int cpu_mla_keys(const struct cpu_mla *s, int i, int pos0)
{
	return s->sel ? s->nsel[i] : (s->seq ? s->pos[i] : pos0 + i) + 1;
}
/* q [n][n_heads][d_a + d_b] -> out [n][n_heads][d_v], for tokens i0 <= i < i1 and heads
 * h0 <= h < h1 only. */
void cpu_ref_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n,
			   int pos0, int i0, int i1, int h0, int h1);
/* DSA lightning indexer score of one query against one key: sum over heads h of
 * w[h] * w_scale * relu(q[h] . k * qk_scale). q [n_heads][head_dim], k [head_dim] of type
 * kv (DT_F32, DT_BF16, or DT_F8_E4M3 with its row's scales ks, cpu_kv_rc). */
float cpu_ref_dsa_score(const float *q, const void *k, enum dt_type kv, const float *ks,
			const float *w, int n_heads, int head_dim, float qk_scale, float w_scale);
/* Exact top-k of scores[0..len): when len <= topk all positions, else the topk best scores
 * with the lower position winning ties (NaN counts as -inf). Writes the chosen positions to
 * sel in ascending order and their count to *nsel. work: len * 8 bytes. */
void cpu_ref_dsa_select(int *sel, int *nsel, float *scores, int len, int topk, void *work);
/* The indexer over a key cache: k [rows][head_dim] of type kv (DT_F32, DT_BF16, or
 * DT_F8_E4M3 with its scales ks [rows][cpu_kv_blocks(head_dim)]); score = cpu_ref_dsa_score
 * with n_heads, head_dim, qk_scale and w_scale; each query keeps its topk best keys. The
 * queries belong to one sequence at pos0 .. (seq NULL: query i at position pos0 + i over
 * rows 0 ..) or to several, as struct cpu_mla's: query i at position pos[i] of sequence
 * seq[i], whose rows start seq[i] * seq_rows rows on; keys_max >= every pos[i] + 1 (a
 * kernel's plan and scratch). */
struct cpu_dsa {
	const void *k;
	const float *ks;
	enum dt_type kv;
	int n_heads, head_dim, topk;
	float qk_scale, w_scale;
	const int *seq, *pos;
	size_t seq_rows;
	int keys_max;
};
/* Query i's first cache row and its number of keys (0 .. its position). */
static inline size_t cpu_dsa_base(const struct cpu_dsa *d, int i)
{
	return d->seq ? (size_t)d->seq[i] * d->seq_rows : 0;
}
static inline int cpu_dsa_len(const struct cpu_dsa *d, int i, int pos0)
{
	return (d->seq ? d->pos[i] : pos0 + i) + 1;
}
/* The indexer's selection for n queries: q [n][n_heads][head_dim], w [n][n_heads]
 * (weights_proj output). Query i scores its keys 0 .. cpu_dsa_len - 1 and selects
 * (cpu_ref_dsa_select) into sel [n][topk], nsel [n]. scores: that many floats (the most of
 * any query) and work: 8 bytes each of scratch. */
void cpu_ref_dsa_topk(int *sel, int *nsel, const float *q, const float *w,
		      const struct cpu_dsa *d, int n, int pos0, float *scores, void *work);

/* ---- sampling candidates (sample_ref.c; backend.h's sample_cand) --------------------------
 *
 * What engine/sampler.c's pick (samp_pick_cand) needs from a logits row, selected where the
 * logits are so that only the candidates cross to the host. For row i with settings s[i]:
 * temperature <= 0: nothing (count 0). Else p_j = expf((l_j - max_l) / temperature) (f32)
 * and, in the order (p descending, then id ascending):
 *   - 0 < top_k < vocab: the first top_k; mass = their sum (double) in that order;
 *     else all ids; mass = the sum of every p in id order;
 *   - 0 < top_p < 1: of those, only the shortest head whose running sum (double) reaches
 *     min(mass, (top_p + CPU_CAND_SLACK) * mass) (all of them when none does);
 *   - neither filter: the pick itself, with the row's draw u, as samp_pick makes it over
 *     every id in id order: the first id j whose running sum (double, id order) of p exceeds
 *     u * mass (the last id when rounding leaves none), a list of one; so temperature alone
 *     over a vocabulary of any size sends one candidate, not the whole row. With a draft d
 *     (draft = d + 1; speculative decoding, samp_pick_draft's rule): d when u_acc * mass <
 *     p_d, else that pick over the ids but d with u * (mass - p_d). With a filter on, the
 *     draft is ignored here: the host applies the rule to the list (samp_pick_cand_draft).
 * cand[i][0..count) = {p, id} of that list in that order, head[i] = {mass, count}; count =
 * -1 (overflow; cand[i] unspecified) when the list is longer than cap. The slack makes the
 * list reach a little past top_p, so that the pick's own cut (its running sum of p / mass,
 * in another order, on p a device computed with its own expf) falls inside the list. */
#define CPU_CAND_SLACK (1.0 / 1048576) /* 2^-20 of the mass */
struct cpu_samp {
	float temperature, top_p;
	int32_t top_k;
	int32_t draft; /* the drafted id + 1 (0: none): used where neither filter is on */
	double u;      /* the request's draw in [0, 1): used where neither filter is on */
	double u_acc;  /* with a draft: the draw that keeps it or not */
};
struct cpu_cand {
	float p;
	int32_t id;
};
struct cpu_cand_head {
	double mass;
	int32_t count, pad;
};
/* logits [n][vocab], s [n], cand [n][cap], head [n]; work: vocab candidates of scratch. */
void cpu_ref_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head, const float *logits,
			 const struct cpu_samp *s, int n, int vocab, int cap,
			 struct cpu_cand *work);

/* ---- machine roofline ----------------------------------------------------------------- */

/* Read bandwidth in GB/s (1e9 bytes/s): every pool thread streams its share of a buffer of
 * `bytes` (>= 1 GiB for a meaningful figure) with AVX2 loads, summing what it reads, for
 * at least `seconds`. Returns a negative value if the buffer cannot be allocated. */
double cpu_read_bandwidth(struct cpu_pool *p, size_t bytes, double seconds);

#endif
