/*
 * backend.h - the table of operations the engine runs its models through.
 *
 * A backend is a const table of function pointers plus an opaque context made by init().
 * The engine never calls a kernel directly, so the CPU backend (kernels/cpu/) and the CUDA
 * backend (kernels/cuda/) are interchangeable, and supports() lets the engine refuse an op
 * a backend lacks with a message instead of a crash.
 *
 * Memory: `float *` arguments are activations in the backend's memory (host memory for the
 * CPU backend). Weights are described by struct be_weight and stay where the loader put them
 * (in the mmap'd checkpoint for the CPU backend). Optional members are marked; NULL means the
 * backend works on host memory directly.
 *
 * Shapes are in the comments of cpu.h, which holds the reference definition of every op.
 */
#ifndef BACKEND_H
#define BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "common/dtype.h"
#include "engine/sampler.h" /* struct samp_cand */

enum be_op {
	BE_OP_MATMUL,
	BE_OP_RMSNORM,
	BE_OP_ROPE,
	BE_OP_ATTENTION,
	BE_OP_SILU_MUL,
	BE_OP_ADD,
	/* GLM families */
	BE_OP_LAYERNORM,
	BE_OP_MOE_ROUTE,
	BE_OP_GATHER_ROWS,
	BE_OP_SCATTER_ADD_ROWS,
	BE_OP_MLA_ABSORB, /* mla_absorb_q and mla_absorb_out */
	BE_OP_MLA_ATTENTION,
	BE_OP_DSA_TOPK,
	BE_OP_CAST, /* cast_n */
	BE_OP_COUNT
};

/* A 2-D weight [rows][cols], row-major, in dtype. For DT_F8_E4M3, scale holds the
 * [ceil(rows/128)][ceil(cols/128)] f32 block scales (dequantized = fp8 * scale); else NULL. */
struct be_weight {
	enum dt_type dtype;
	int rows, cols;
	const void *data;
	const float *scale;
};

/* MoE router settings (see cpu_ref_moe_route in cpu.h). */
struct be_route {
	int n_experts, top_k, n_group, topk_group;
	bool norm;   /* divide the chosen weights by their sum */
	float scale; /* routed_scaling_factor */
};

/* Two-part-key attention for MLA (see struct cpu_mla in cpu.h for the full contract):
 * k = [k_a (d_a) | k_b (d_b)], k_b shared by all heads; sel NULL means dense causal. k_a, k_b
 * and v are elements of type kv (the KV cache's: DT_F32 or DT_BF16). An FP8 cache (kv
 * DT_F8_E4M3): v is k_a, rows d_a wide with their scales a_s (one f32 per 128 elements of
 * a row), and k_b is bf16. */
struct be_mla {
	int n_heads, d_a, d_b, d_v;
	enum dt_type kv;
	const void *k_a, *k_b, *v;
	const float *a_s;
	size_t ka_stride, ka_head, kb_stride, v_stride, v_head;
	const int *sel, *nsel;
	int sel_stride;
	float scale;
	const int *seq, *pos; /* several sequences at once (struct cpu_mla's) */
	size_t seq_rows;
	int keys_max;
};

/* Grouped-query attention's KV cache, in the backend's memory (struct cpu_gqa in
 * kernels/cpu/cpu.h: its fields and their meaning, seq and pos included). */
struct be_gqa {
	const void *k, *v;
	const float *ks, *vs;
	enum dt_type kv;
	int n_heads, n_kv, head_dim, kv_stride;
	float scale;
	const int *seq, *pos;
	size_t seq_rows;
	int keys_max;
};

/* The DSA indexer over a key cache, in the backend's memory (struct cpu_dsa in
 * kernels/cpu/cpu.h: its fields and their meaning, seq and pos included). */
struct be_dsa {
	const void *k;
	const float *ks;
	enum dt_type kv;
	int n_heads, head_dim, topk;
	float qk_scale, w_scale;
	const int *seq, *pos;
	size_t seq_rows;
	int keys_max;
};

/* One routed expert's weights as the backend holds them (the layout of struct cpu_expert in
 * kernels/cpu/cpu.h): gate, up [inter][dim], down [dim][inter]; FP8 block scales or NULL. */
struct be_expert {
	const void *gate, *up, *down;
	const float *gate_s, *up_s, *down_s;
};

/* A MoE layer's routed experts on this rank, for the grouped op moe_experts, and optionally
 * its shared expert (every token's, weight 1: y = shared(x) + sum_j wt_j expert_j(x)). */
struct be_experts {
	int ex0, n_local;        /* experts [ex0, ex0 + n_local) live here */
	int top_k, dim, inter;
	enum dt_type dtype;      /* every expert's weights have this one */
	struct be_expert *experts; /* host array [n_local] of the backend's weight pointers */
	void *dev;               /* the backend's own copy of the table (moe_bind), or NULL */
	/* The shared expert (host struct, the backend's weight pointers; gate, up
	 * [shared_inter][dim], down [dim][shared_inter], all in shared_dtype: DT_F32, DT_BF16,
	 * DT_F16, or DT_F8_E4M3 with scales), or NULL: then shared_inter is 0. */
	const struct be_expert *shared;
	enum dt_type shared_dtype;
	int shared_inter;
};

/* The most weights one matmul_n takes, and the most tensors one rope_n rotates. */
#define BE_MATMUL_MAX 8
#define BE_ROPE_MAX 8
#define BE_NORM_MAX 8
#define BE_CAST_MAX 8

/* One conversion of a cast_n: n elements from src (type st) to dst (type dt), both
 * contiguous and not overlapping: f32 to bf16 (rounded to nearest even, as dt_f32_to_bf16),
 * bf16 to f32, or a plain copy when dt == st (DT_F32 or DT_BF16); f32 to DT_F8_E4M3
 * quantizes rows of w elements (n a multiple of w) with one scale per 128 elements of a
 * row into ds, and DT_F8_E4M3 to f32 dequantizes with the scales ss (cpu_ref_cast has the
 * arithmetic). How the engine writes a bf16 or FP8 KV cache (eng_kv_put) and reads it
 * back as f32 rows (a prefill's expansion). */
struct be_cast {
	void *dst;
	const void *src;
	size_t n;
	enum dt_type dt, st;
	float *ds;        /* to FP8: the scales [n / w][ceil(w / 128)] */
	const float *ss;  /* from FP8: the same */
	int w;            /* FP8: the row width */
};

/* One norm of a norm_n: y [n][dim] = rmsnorm(x) . w, or (layer) layernorm(x) . w + b; with
 * rope_dim > 0, each row's first rope_dim elements then rotated in place as rope(y, n,
 * rope_pos, 1, dim, rope_dim, theta, true) would (interleaved pairs; GLM-5's indexer keys:
 * normalised, then rotated). The rows may be heads: heads > 1 rows a token (n a multiple),
 * row r of token r / heads, so the rotation is rope(y, n / heads, rope_pos, heads, dim,
 * rope_dim, theta, !half)'s (half: rotate_half's pairs j and j + rope_dim / 2, GLM-4.5's).
 * add (optional, heads * dim floats: a token's row of a bias) is added first, x + add
 * rounded as add() rounds it, head h of each token taking add + h * dim; bare: no norm at
 * all (y = x + add, then the rotation; w unused). GLM-4.5's q and k: biased, normalised
 * per head and rotated, v biased, in one op. */
struct be_norm {
	float *y;
	const float *x, *w, *b;
	int n, dim;
	float eps;
	bool layer;
	const int *rope_pos;
	int rope_dim;
	float theta;
	const float *add;
	int heads; /* 0 or 1: a row a token */
	bool half, bare;
};

/* One tensor of a rope_n: x [n][n_heads * head_dim] in place, token i at position pos[i]. */
struct be_rope {
	float *x;
	int n;
	const int *pos;
	int n_heads, head_dim, rot_dim;
};

/* One op of a chain (backend member chain): a matmul_n / matmul_rope_n (BE_LINK_MATMUL:
 * count weights over x; with rope, rotated as matmul_rope_n rotates, r[k].rot_dim 0 for an
 * output left as it is; count 1 without rope is a plain matmul), an add_rmsnorm
 * (BE_LINK_ADD_RMSNORM: x += d, then y = rmsnorm(x) . w over n rows of dim), a norm_n
 * (BE_LINK_NORM), a moe_route_experts (BE_LINK_MOE, from fewer than ENG_GEMM_TOKENS
 * tokens: y_moe, x_moe, logits, bias, route, idx, wt, n, ex, scratch) or a cast_n
 * (BE_LINK_CAST: cast [n_cast]; a bf16 KV cache's writes). */
#define BE_CHAIN_MAX 6
enum be_link_kind { BE_LINK_MATMUL, BE_LINK_ADD_RMSNORM, BE_LINK_NORM, BE_LINK_MOE,
		    BE_LINK_CAST };
struct be_link {
	enum be_link_kind kind;
	int n;
	/* BE_LINK_MATMUL */
	float *y[BE_MATMUL_MAX];
	const struct be_weight *w[BE_MATMUL_MAX];
	struct be_rope r[BE_MATMUL_MAX];
	const float *x_in;
	int count;
	bool rope;
	float theta;
	/* BE_LINK_ADD_RMSNORM */
	float *x, *y_norm;
	const float *d, *w_norm;
	int dim;
	float eps;
	/* BE_LINK_NORM */
	struct be_norm norm[BE_NORM_MAX];
	int n_norm;
	/* BE_LINK_MOE */
	float *y_moe, *wt;
	const float *x_moe, *logits, *bias;
	struct be_route route;
	int *idx;
	const struct be_experts *ex;
	void *scratch;
	/* BE_LINK_CAST */
	struct be_cast cast[BE_CAST_MAX];
	int n_cast;
};

/* sample_cand's per-row settings and result (struct cpu_samp, cpu_cand_head in cpu.h). */
#define BE_CAND_MAX 1024 /* = WK_CUDA_CAND_MAX */
struct be_samp {
	float temperature, top_p;
	int top_k, draft; /* draft: the drafted id + 1 (0: none) */
	double u, u_acc;
};
struct be_cand_head {
	double mass;
	int count, pad;
};

struct be_config {
	int threads; /* CPU threads; <= 0 means all cores */
	int device;  /* GPU ordinal for device backends */
	/* the engine quantizes activations to FP8 before its GEMVs (eng_opts.fp8_act): a
	 * backend keeps those GEMVs as close to f32 as it can, since a 1e-5 difference flips
	 * later e4m3 roundings (the CUDA backend: no bf16-split tensor-core GEMV) */
	bool fp8_act;
};

struct backend {
	const char *name;
	/* Creates the context. Returns WK_OK, or a WK_E* code with a message (for example,
	 * "no CUDA device" or "built without CUDA"). */
	int (*init)(void **ctx, const struct be_config *cfg, char *err, size_t errsz);
	void (*shutdown)(void *ctx);
	/* Whether op runs on this backend for weights of type wt (wt is ignored by ops that
	 * take no weight; for BE_OP_ATTENTION, BE_OP_MLA_ATTENTION and BE_OP_DSA_TOPK it is
	 * the KV cache's element type, DT_F32 or DT_BF16). */
	bool (*supports)(void *ctx, enum be_op op, enum dt_type wt);

	/* y[n][w->rows] = x[n][w->cols] . w^T */
	void (*matmul)(void *ctx, float *y, const float *x, const struct be_weight *w, int n);
	/* The matmuls that read one input, as one op (one launch on a GPU): y[k] = x . w[k]^T
	 * for k < count (2 .. BE_MATMUL_MAX; every w[k]->cols the same, dtypes may differ),
	 * each exactly as matmul computes it. Optional (NULL: the engine calls matmul). */
	void (*matmul_n)(void *ctx, float *const *y, const float *x,
			 const struct be_weight *const *w, int count, int n);
	/* matmul_n (count 1 .. BE_MATMUL_MAX) with output k then rotated as rope(r[k].x, r[k].n,
	 * r[k].pos, r[k].n_heads, r[k].head_dim, r[k].rot_dim, theta, true) would (interleaved
	 * pairs, GLM-5's), where
	 * r[k].rot_dim > 0 (r[k].x inside y[k]: its rope slices); bit for bit matmul_n, then
	 * rope_n. The CUDA GEMV rotates in its store, so the rotations cost no launch. Optional
	 * (NULL: matmul_n, then rope_n). */
	void (*matmul_rope_n)(void *ctx, float *const *y, const float *x,
			      const struct be_weight *const *w, int count, int n,
			      const struct be_rope *r, float theta);
	/* The kernel launches matmul_n (r NULL) or matmul_rope_n (r its rotations) makes for
	 * these arguments: matmul launches into *mm, rotation launches into *rot. For the launch
	 * counter (engine/count.c). Optional (NULL: one matmul launch, no rotation). */
	void (*matmul_launches)(void *ctx, float *const *y, const float *x,
				const struct be_weight *const *w, int count, int n,
				const struct be_rope *r, int *mm, int *rot);
	void (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int n, int dim,
			float eps);
	void (*rope)(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		     int rot_dim, float theta, bool interleaved);
	/* Several rmsnorms and layernorms (count 1 .. BE_NORM_MAX) as one op, each exactly as
	 * rmsnorm / layernorm computes it, then its rotation if it has one (struct be_norm).
	 * Optional (NULL: the engine calls them, and rope, one by one). */
	void (*norm_n)(void *ctx, const struct be_norm *r, int count);
	/* rope over several tensors (count 2 .. BE_ROPE_MAX, one theta and style) as one op,
	 * each exactly as rope rotates it. Optional (NULL: the engine calls rope). */
	void (*rope_n)(void *ctx, const struct be_rope *r, int count, float theta,
		       bool interleaved);
	/* n queries over the cache *s (cpu_ref_attention's contract in cpu.h): the tokens of one
	 * sequence at pos0 .., or with s->seq of several */
	void (*attention)(void *ctx, float *out, const float *q, const struct be_gqa *s, int n,
			  int pos0);
	void (*silu_mul)(void *ctx, float *g, const float *u, size_t n);
	void (*add)(void *ctx, float *y, const float *x, size_t n); /* y += x */
	/* Several conversions (count 1 .. BE_CAST_MAX, struct be_cast) as one op. */
	void (*cast_n)(void *ctx, const struct be_cast *c, int count);
	/* idx[i] = argmax of logits [n][vocab] row i, lowest index on ties (greedy sampling on
	 * the device: only the ids cross to the host). Optional. */
	void (*argmax)(void *ctx, int *idx, const float *logits, int n, int vocab);
	/* Sampling candidates (cpu_ref_sample_cand's contract in cpu.h; layouts: struct
	 * be_samp, be_cand_head here, samp_cand in sampler.h): for logits [n][vocab] with
	 * settings s [n], the list engine/sampler.c's pick needs into cand [n][cap] and head [n]
	 * (count -1: longer than cap). All in the backend's memory; cap <= BE_CAND_MAX. Only
	 * the candidates then cross to the host. Optional. */
	void (*sample_cand)(void *ctx, struct samp_cand *cand, struct be_cand_head *head,
			    const float *logits, const struct be_samp *s, int n, int vocab,
			    int cap);
	/* FP8 activations (eng_opts.fp8_act): y [n][cols] = x quantized per token per 128
	 * channels and back (cpu_ref_act_quant), what FP8-weight matmuls then read. Optional:
	 * without it the engine refuses fp8_act. */
	void (*act_quant)(void *ctx, float *y, const float *x, int n, int cols);
	/* FP8 activations on FP8 weights for a step of many tokens (a prefill, eng_opts.fp8_act):
	 * y[k] [n][w[k]->rows] = x quantized as act_quant does, times w[k]^T, for k < count
	 * (1 .. BE_MATMUL_MAX, every w[k] DT_F8_E4M3 with the same cols): the quantized codes
	 * and scales straight into the tensor cores' GEMM. Optional (NULL: act_quant, then
	 * matmul_n); the engine uses it from ENG_GEMM_TOKENS tokens up. */
	void (*matmul_fp8act)(void *ctx, float *const *y, const float *x,
			      const struct be_weight *const *w, int count, int n);
	/* f32 activations on FP8 weights for a step of many tokens (a prefill without
	 * fp8_act): y[k] [n][w[k]->rows] = x . w[k]^T for k < count (1 .. BE_MATMUL_MAX, every
	 * w[k] DT_F8_E4M3 with the same cols), matmul's result (cpu_ref_matmul_fp8) within
	 * ~1e-5 of its largest output: on the tensor cores, x split once into bf16 hi and lo
	 * halves (the CUDA backend: gemm_fp8w.cu). Optional (NULL: matmul_n, the decode GEMV);
	 * the engine uses it from ENG_GEMM_TOKENS tokens up. */
	void (*matmul_fp8w)(void *ctx, float *const *y, const float *x,
			    const struct be_weight *const *w, int count, int n);
	/* The residual add and the norm after it as one op: x [n][dim] += d, then y = rmsnorm(x)
	 * . w, each exactly as add and rmsnorm compute it. Optional (NULL: add, then rmsnorm). */
	void (*add_rmsnorm)(void *ctx, float *x, const float *d, float *y, const float *w, int n,
			    int dim, float eps);
	/* Ops that follow one another (l [count], 2 .. BE_CHAIN_MAX), each exactly as its own
	 * op computes it, in order: what be_chain_each does, as one launch on a GPU (the CUDA
	 * backend's chained launch, kernels/cuda/moe_kernels.cu k_chain). The engine builds
	 * chains of the decode step's GEMVs, norms and MoE op (eng_chain_begin). Optional (NULL:
	 * the ops one by one). */
	void (*chain)(void *ctx, const struct be_link *l, int count);
	/* How chain runs l [count] (1 .. BE_CHAIN_MAX) when it does not make them one launch:
	 * seg[i] = the chained launch link i runs in (0, 1, ... in order, each over consecutive
	 * links; chain on exactly those links makes that one launch), or -1 where link i runs as
	 * be_chain_each runs it; returns the number of chained launches. For the launch counter
	 * (engine/count.c). Optional (NULL: chain is always one launch); only with chain. */
	int (*chain_plan)(void *ctx, const struct be_link *l, int count, int *seg);

	/* ---- GLM families (reference definitions: kernels/cpu/glm_ref.c, contracts in cpu.h).
	 * Optional: NULL on backends that do not run GLM; supports() says which. ---- */
	void (*layernorm)(void *ctx, float *y, const float *x, const float *w, const float *b,
			  int n, int dim, float eps);
	/* idx [n][top_k], wt [n][top_k] from router logits [n][n_experts]; bias may be NULL */
	void (*moe_route)(void *ctx, int *idx, float *wt, const float *logits, const float *bias,
			  int n, const struct be_route *r);
	void (*gather_rows)(void *ctx, float *dst, const float *src, const int *rows, int n,
			    int dim);
	void (*scatter_add_rows)(void *ctx, float *y, const float *x, const int *rows,
				 const float *scale, int n, int dim);
	/* kv_b = kv_b_proj [n_heads * (d_nope + d_v)][lora]:
	 * qa [n][n_heads][lora + d_rope] = [q_nope . W_uk,h | q_pe] from q [n][n_heads][d_nope + d_rope] */
	void (*mla_absorb_q)(void *ctx, float *qa, const float *q, const struct be_weight *kv_b,
			     int n, int n_heads, int d_nope, int d_rope, int d_v);
	/* o [n][n_heads][d_v] = W_uv,h . lat, lat [n][n_heads][lora] */
	void (*mla_absorb_out)(void *ctx, float *o, const float *lat, const struct be_weight *kv_b,
			       int n, int n_heads, int d_nope, int d_v);
	/* out [n][n_heads][d_v] from q [n][n_heads][d_a + d_b] for tokens at pos0 .. pos0+n-1
	 * (s->seq set: tokens of several sequences, each at its s->pos, pos0 unused) */
	void (*mla_attention)(void *ctx, float *out, const float *q, const struct be_mla *s, int n,
			      int pos0);
	/* The absorbed chain as one op (one launch on a GPU), each stage exactly as its single
	 * op computes it: mla_absorb_q (q -> qa), mla_attention over the latent cache as s
	 * describes it (qa -> lat), mla_absorb_out (lat -> o [n][n_heads][d_v]). s: d_a = d_v =
	 * kv_b->cols (lora), d_b = d_rope; s->n_heads heads. qa [n][n_heads][lora + d_rope] and
	 * lat [n][n_heads][lora] are the caller's scratch in the backend's memory, left holding
	 * the stages' results. Optional (NULL: the engine calls the three). */
	void (*mla_absorbed)(void *ctx, float *o, float *qa, float *lat, const float *q,
			     const struct be_weight *kv_b, const struct be_mla *s, int n, int pos0,
			     int d_nope, int d_v);
	/* DSA indexer top-k (cpu_ref_dsa_topk): sel [n][d->topk] (ascending positions), nsel
	 * [n] for the queries q [n][n_heads][head_dim] with head weights w [n][n_heads] over
	 * d's key cache; scores: as many floats as the most keys of a query (pos0 + n, or
	 * d->keys_max with d->seq) and work: 8 bytes each of scratch, in the backend's
	 * memory. */
	void (*dsa_topk)(void *ctx, int *sel, int *nsel, const float *q, const float *w,
			 const struct be_dsa *d, int n, int pos0, float *scores, void *work);

	/* Grouped MoE. Optional (NULL: the engine runs the experts one by one with gather_rows,
	 * matmul, silu_mul and scatter_add_rows). moe_bind (itself optional) prepares a layer's
	 * table once at load; moe_scratch: the bytes of backend memory moe_experts needs for n
	 * tokens; moe_experts: y [n][dim] += the routed experts' outputs for the routing idx, wt
	 * [n][top_k] (cpu_ref_moe_experts's contract: the slots of a token added in order); with
	 * ex->shared, y is overwritten instead: y = the shared expert's output, then each token's
	 * slots added to it in order (what matmul_n, silu_mul and matmul into y, then the routed
	 * op, compute). */
	int (*moe_bind)(void *ctx, struct be_experts *ex, char *err, size_t errsz);
	size_t (*moe_scratch)(void *ctx, int n, const struct be_experts *ex);
	void (*moe_experts)(void *ctx, float *y, const float *x, const int *idx, const float *wt,
			    int n, const struct be_experts *ex, void *scratch);
	/* moe_route into idx, wt [n][top_k] (the backend's memory), then moe_experts with that
	 * routing, as one op (3 launches on CUDA instead of 4), each exactly as those compute
	 * it. Optional (NULL: the engine calls the two). */
	void (*moe_route_experts)(void *ctx, float *y, const float *x, const float *logits,
				  const float *bias, const struct be_route *r, int *idx, float *wt,
				  int n, const struct be_experts *ex, void *scratch);

	/* ---- device memory. Optional: NULL on backends that work on host memory (then the
	 * engine uses malloc/free and memcpy). ---- */
	void *(*mem_alloc)(void *ctx, size_t bytes); /* NULL when out of memory */
	/* The device's memory: what is free now and its size (cudaMemGetInfo). Optional (NULL:
	 * unknown; the engine's fit check before a restore is skipped). */
	int (*mem_info)(void *ctx, size_t *free_b, size_t *total_b, char *err, size_t errsz);
	void (*mem_free)(void *ctx, void *p);
	void (*to_device)(void *ctx, void *dst, const void *host, size_t bytes);
	void (*to_host)(void *ctx, void *host, const void *src, size_t bytes); /* waits */
	void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);   /* device to device */
	/* height rows of width bytes, device to device, row r from src + r * spitch to dst +
	 * r * dpitch, as one copy. Optional (NULL: the engine copies row by row). */
	void (*copy_2d)(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
			size_t width, size_t height);
	void (*zero)(void *ctx, void *dst, size_t bytes);
	/* Replaces w->data (and w->scale) with the backend's own copy, freed at shutdown. */
	int (*upload_weight)(void *ctx, struct be_weight *w, char *err, size_t errsz);
	/* Restoring a snapshot straight into device memory (coldstart's snap_sink), with the
	 * weights then used where they landed (no upload_weight). Optional, all four or none;
	 * called from the restore's reader threads at once. stage_alloc: pinned host memory,
	 * 4 KiB-aligned (NULL when out of memory); stage_put starts a copy of bytes from the
	 * start of a staging buffer to device memory and returns; stage_wait returns once every
	 * copy from that buffer is done. Another context of the same backend (another device)
	 * may be handed a staging buffer this one allocated: its stage_put registers it,
	 * stage_wait returns at once if it made no copy from it, and stage_free forgets it
	 * without freeing it (a sharded restore shares its buffers among the ranks). */
	void *(*stage_alloc)(void *ctx, size_t bytes);
	void (*stage_free)(void *ctx, void *stage);
	int (*stage_put)(void *ctx, void *dst, const void *stage, size_t bytes, char *err,
			 size_t errsz);
	int (*stage_wait)(void *ctx, const void *stage, char *err, size_t errsz);
	/* Makes the context's device the calling thread's current one (the current device is
	 * per thread): a sharded engine calls it on each rank's thread before the rank's ops,
	 * and before closing the rank. Optional. */
	void (*attach)(void *ctx);
	/* Waits for the device; WK_EIO with the message once any op has failed (sticky). */
	int (*sync)(void *ctx, char *err, size_t errsz);
	/* The device's own clock, for timing ops where they run (engine/count.c's op times,
	 * `wick bench launches --op-times`). mark records a point on the device's timeline
	 * after the work issued so far (a cudaEventRecord on the compute stream) and returns
	 * its number, 0, 1, ... since the last marks_ms, or -1 when it holds no more (then
	 * read them and mark again). marks_ms waits for the last mark and writes ms[i] = the
	 * device time from mark i to mark i + 1 for i < n - 1, n the marks made; the last
	 * mark becomes mark 0 of the next ones. Returns WK_OK, or an error (sticky as sync's).
	 * Optional, both or neither (NULL: the ops run on the host; their host time is theirs). */
	int (*mark)(void *ctx);
	int (*marks_ms)(void *ctx, float *ms, int n, char *err, size_t errsz);
};

/* Restoring a snapshot into a backend's memory (engine/backend.c): be_streams says whether b
 * has what it takes (device memory, to_host and the four stage ops); be_snap_sink makes the
 * coldstart sink that does it, on the started backend k->be whose context is k->ctx, rank 0's
 * (k must outlive the restore). A sharded snapshot (world > 1): accept starts a context of
 * k->raw (the backend itself: k->be may be a wrapper that cannot start one) on device r for
 * each further rank r, with be_rank_threads(k->threads, world) threads; each rank file lands
 * in its own device's memory, through staging buffers the ranks share (stage ops, above).
 * The rank engines then take their contexts (be_sink_take); be_sink_close shuts down those
 * never taken. A later restore through the same sink reuses the contexts still held (wick
 * bench restore times restores, not context starts).
 * The further ranks' contexts start at once, a thread each (7 on an 8-GPU node). Where
 * k->comm is set, accept also starts a communicator of the world's ranks on a thread of its
 * own, so that it is made (NCCL over 8 GPUs: seconds) while the snapshot streams, not after
 * it; the sharded engine takes it with be_sink_comm. */
#define BE_SINK_MAX 64 /* = COMM_MAX_WORLD */
struct snap_sink;
struct comm_ops;
struct be_sink {
	const struct backend *be;
	void *ctx;
	const struct backend *raw;
	int threads; /* as be_config's, for the whole process */
	bool fp8_act; /* as be_config's */
	const struct comm_ops *comm; /* the collectives to start at accept; NULL: none */
	int world;   /* set by accept */
	void *rctx[BE_SINK_MAX]; /* rank r's context; [0] = ctx */
	bool taken[BE_SINK_MAX];
	double ranks_s; /* accept's wait for the further ranks' contexts to start */
	struct be_sink_comm *cs; /* the communicator accept started, until taken */
};
bool be_streams(const struct backend *b);
struct snap_sink be_snap_sink(struct be_sink *k);
/* Rank r's context, now the caller's to shut down; NULL when the sink started none. */
void *be_sink_take(struct be_sink *k, int rank);
/* The communicator of world ranks that accept started with ops (k->comm): waits for its init
 * and hands it over (*ctx, the caller's to destroy), or returns its init's error.
 * WK_ENOTFOUND when accept started none of those ops and that world (the caller makes its
 * own). *init_s: how long the init took; *wait_s: how much of it ran after this call began
 * (what the caller waited for, not counting the thread's exit). */
int be_sink_comm(struct be_sink *k, const struct comm_ops *ops, int world, void **ctx,
		 double *init_s, double *wait_s, char *err, size_t errsz);
void be_sink_close(struct be_sink *k);
/* CPU threads for each of world ranks out of threads (<= 0: all cores): at least one. */
int be_rank_threads(int threads, int world);

extern const struct backend be_cpu;  /* kernels/cpu/backend_cpu.c */
extern const struct backend be_cuda; /* kernels/cuda/ (init fails when built without CUDA) */
extern const struct backend be_null; /* kernels/backend_null.c: no arithmetic, for benchmarks */

/* The backend named name ("cpu", "cuda", "null"), or NULL. "auto" picks cpu: the CUDA
 * backend is chosen by name until it has passed scripts/gpu-check on a GPU. */
const struct backend *be_find(const char *name);

/* The links of a chain run one by one through b's own ops (matmul, matmul_n or
 * matmul_rope_n; add_rmsnorm; norm_n; moe_route_experts; cast_n): the chain op's meaning, and its
 * fallback (the engine holds a link only where b has its op). */
void be_chain_each(const struct backend *b, void *ctx, const struct be_link *l, int count);

#endif
