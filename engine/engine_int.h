/*
 * engine_int.h - engine internals, shared by engine.c, engine_open.c and the model families.
 * Nothing outside engine/ includes this.
 */
#ifndef ENGINE_INT_H
#define ENGINE_INT_H

#include <jansson.h>

#include "coldstart/hfmodel.h"
#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/engine.h"

struct plan;

/* One per-sequence array of a family's caches, laid out (max_seqs, layers, rows) rows of
 * row_bytes. rows is max_seq (a row a position: a sequence's first len positions are its
 * cache) or 1 (a row a sequence, taken whole: the MTP layer's waiting hidden state). A NULL
 * base is an array this model lacks (skipped). whole: every rank holds the same rows (MLA's
 * latent, which TP replicates), else rank r's are TP shard r % tp's (eng_seq_save keeps
 * each once). */
struct eng_cache {
	void *base;
	size_t row_bytes;
	int layers, rows;
	bool whole;
};
enum { ENG_CACHES = 8 };

/* A model family: how to check a config, load the weights and run a forward pass. */
struct family {
	const char *arch; /* config.json architectures[0] */
	/* Reads the config and binds the weights; stores its state in e->model. */
	int (*load)(struct engine *e, char *err, size_t errsz);
	int (*forward)(struct engine *e, const int *tokens, int n, int pos0, float *logits,
		       bool all, char *err, size_t errsz);
	void (*free)(struct engine *e);
	/* Optional: a batched step over several sequences (continuous batching). Families
	 * without it hold one sequence, and eng_step runs them through forward(). The items are
	 * validated; positions start at e->seq_len[item.seq]. */
	int (*step)(struct engine *e, const struct eng_item *items, int n, char *err,
		    size_t errsz);
	/* Optional (families with step): the per-sequence arrays of its caches, at most
	 * ENG_CACHES, returning how many (eng_seq_copy, eng_seq_save and eng_seq_load move
	 * them; on each rank). */
	int (*caches)(struct engine *e, struct eng_cache *c);
	/* Snapshot layout: which tensors a rank holds, in what dtype and shape. Appends specs
	 * to *plan (see layout.c). */
	int (*plan)(struct hf_model *hf, const struct eng_snap_opts *o, struct plan *plan,
		    char *err, size_t errsz);
};

struct engine {
	/* Weights come from exactly one of these: a Hugging Face directory or a restored
	 * snapshot. eng_tensor() hides which. */
	struct hf_model *hf;
	struct snap *snap;
	json_t *config; /* borrowed from hf or snap */
	char dir[4096];
	struct tok *tok;
	const struct backend *be;
	void *bctx;
	bool counting;      /* be is count.c's wrapper (eng_opts.count_launches) */
	long n_collectives; /* collectives issued (counted when counting) */
	const struct family *fam;
	void *model; /* the family's state */
	struct eng_info info;
	char arch[128];
	int max_seq_opt;
	bool experts_one_by_one; /* eng_opts: never the backend's grouped MoE op */
	bool unfused;            /* eng_opts: no matmul_n, caches written through copies */
	bool fp8_act;            /* eng_opts: FP8-weight matmuls read quantized activations */
	enum dt_type kv;         /* the KV caches' element type (eng_kv_type): DT_F32, DT_BF16 */
	/* eng_chain_begin .. eng_chain_end: the GEMVs and norms asked for, not yet run */
	bool no_chain; /* eng_opts */
	bool chaining;
	int n_chain;
	struct be_link chain[BE_CHAIN_MAX];
	float *aq;               /* fp8_act: the quantized input (backend memory), aq_cap floats */
	size_t aq_cap;
	int *tok_d, *tok_h;      /* eng_outputs: the step's argmax ids (backend / host memory) */
	int tok_cap;
	/* eng_outputs' sampled rows: sample_cand's settings [cand_rows] and its heads
	 * [cand_rows] then candidates [cand_rows][ENG_CAND_CAP] (backend / host memory); the
	 * host pick's scratch [vocab] and a logits row [vocab] (host memory) */
	struct be_samp *samp_d, *samp_h;
	void *cand_d, *cand_h;
	int cand_rows;
	int cand_cap; /* candidates per row; 0: ENG_CAND_CAP (tests set less before a step) */
	struct samp_cand *pick;
	float *pick_row;
	int step_rc;             /* a failure inside a step's ops (eng_sync returns it), or WK_OK */
	char step_err[WK_ERRSZ];
	int max_seqs;   /* sequences the family holds (1 without step) */
	int *seq_len;   /* [max_seqs] tokens in each sequence's cache */
	int *mtp_len;   /* [max_seqs] positions with MTP cache rows (glm.c), at most seq_len */
	int mtp_opt;    /* eng_opts.mtp */
	bool *seq_used; /* [max_seqs] */

	/* ---- sharding (shard.c) ----
	 * Every engine is rank `rank` of `world`: 0 of 1 (tp 1, ep 1) when unsharded. A sharded
	 * model is a top engine (the one eng_open returns: the snapshot, tokenizer and sequence
	 * table, no model and no backend) owning `world` rank engines, each with its own backend,
	 * its shard of the model and a thread. Rank engines borrow snap, config and the sequence
	 * table from the top. */
	int rank, world, tp, ep;
	const struct comm_ops *comm; /* rank engines of a sharded model; else NULL */
	void *comm_ctx;
	int comm_rc;                 /* the first failed collective of this rank, or WK_OK */
	char comm_err[WK_ERRSZ];
	bool failed_elsewhere;       /* eng_agree failed because another rank did */
	struct shard *shard;         /* the top engine of a sharded model; else NULL */
	struct engine *top;          /* rank engines: the top; else NULL */
	/* Tensors this engine looked up (eng_tensor), for eng_rank_stats and eng_count_unused. */
	bool *used;                  /* [snap_tensor_count(snap, rank)], or the checkpoint's
				      * tensors in name order (hf_tensor_sorted) */
	size_t n_used;
	uintptr_t bound_lo, bound_hi; /* the byte range their data spans */
	/* A snapshot restored into device memory (snap_on_sink): host copies of the tensors
	 * read on the host (the embedding, vectors), made once by eng_tensor_host. */
	struct host_copy *host_copies;
	struct be_sink sink;          /* the restore's sink context */
};

extern const struct family fam_llama; /* engine/llama.c */
extern const struct family fam_glm4;  /* engine/glm4.c: Glm4MoeForCausalLM */
extern const struct family fam_glm5;  /* engine/glm5.c: GlmMoeDsaForCausalLM */

/* ---- sharded execution (shard.c) ----------------------------------------------------------
 * Rank r holds TP shard r % tp and the routed experts of EP rank r % ep (layout.c). When tp
 * (or ep) is less than world, world / tp ranks hold each TP shard: every rank computes its
 * shard for every token (activations are replicated), and only the "lead" copy, ranks
 * 0..tp-1, adds its partial sums into a reduction; the others add zeros. Likewise experts. */

static inline int eng_tp_rank(const struct engine *e) { return e->rank % e->tp; }
static inline int eng_ep_rank(const struct engine *e) { return e->rank % e->ep; }
static inline bool eng_tp_lead(const struct engine *e) { return e->rank < e->tp; }
static inline bool eng_ep_lead(const struct engine *e) { return e->rank < e->ep; }

/* Attention heads of TP shard k: query heads [q0, q0 + nq), kv heads [kv0, kv0 + nkv). */
struct shard_heads {
	int q0, nq, kv0, nkv;
};
/* Query heads split evenly (heads % tp == 0). KV heads split evenly when kv % tp == 0;
 * when tp is a multiple of kv instead, shard k holds the one kv head its query heads share
 * (kv head k * kv / tp), replicated over tp / kv shards. Anything else is refused (WK_EINVAL
 * naming the numbers). */
int shard_heads(int heads, int kv, int tp, int k, struct shard_heads *out, char *err,
		size_t errsz);
/* [*lo, *hi) of n split evenly into `parts` parts, part k; WK_EINVAL naming `what` and
 * `over` ("tp", "ep") when parts does not divide n. */
int shard_even(long long n, int parts, int k, const char *what, const char *over, int *lo,
	       int *hi, char *err, size_t errsz);

/* Collectives of a rank engine over the world; nothing at world 1. A failure is kept in
 * e->comm_rc (the run then fails; comm_cpu cannot fail with valid arguments). */
void eng_all_reduce(struct engine *e, float *buf, size_t n);
/* Every rank's rc to all: WK_OK when all ranks passed WK_OK. Else this rank's own rc, or
 * (when it was fine but another was not) WK_EINVAL with e->failed_elsewhere set. Called by
 * families after the steps that can fail on one rank (scratch allocation), before the first
 * collective, so no rank waits for one that gave up. */
int eng_agree(struct engine *e, int rc, char *err, size_t errsz);
/* Vocab-parallel embedding: x [n][dim] (the backend's memory) = rows tokens[i] of the
 * embedding, whose shard embed holds rows [vocab0, vocab0 + embed rows) of the whole, read on
 * the host into xh [n][dim] (NULL on host-memory backends: straight into x), moved to x, and
 * summed over the ranks there (each row is non-zero on exactly one lead rank, so the sum is
 * exact). */
void eng_embed(struct engine *e, float *x, float *xh, const int *tokens, int n,
	       const struct st_tensor *embed, int vocab0, int dim);
/* Vocab-parallel lm_head output: local [rows][lv] on every rank becomes out [rows][lv * tp]
 * (out may be NULL, and may equal local: it is written after the gather). out is host memory
 * when out_host, else the backend's. gbuf: rows * lv * world floats of the backend's memory
 * (unused at world 1, where out receives a copy of local). */
void eng_gather_vocab(struct engine *e, float *out, bool out_host, const float *local,
		      int rows, int lv, float *gbuf);

/* Bytes of KV cache one sequence takes on one rank, from the config alone, as the family's
 * load allocates them at the max_seq it chooses (*max_seq, max_seq_opt capping the model's
 * max_position_embeddings), in elements of type kv: Llama and GLM-4.5 keys and values, 2 x
 * num_hidden_layers x max_seq x (the rank's KV heads, shard_heads) x head_dim; GLM-5 the MLA
 * latent and its rotated key, num_hidden_layers x max_seq x (kv_lora_rank +
 * qk_rope_head_dim), and the indexer's key on its full layers (glm5_indexer_full) x max_seq x
 * index_head_dim, whole on every rank; mtp: and the MTP layer's (a full layer) where the
 * model has one. For eng_open's check before a restore; each family's load holds its own
 * allocation to it (eng_cache_agrees), so they cannot drift. */
int eng_seq_cache_bytes(const char *arch, json_t *cfg, int max_seq_opt, int tp,
			enum dt_type kv, bool mtp, int *max_seq, uint64_t *bytes, char *err,
			size_t errsz);
/* GLM-5's layers with their own DSA indexer, as GlmMoeDsaConfig derives indexer_types
 * (indexer_types, else index_topk_pattern, else index_topk_freq / index_skip_topk_offset):
 * full [n_layers], and how many (*n_full); the others reuse the previous full layer's
 * selection and cache no indexer keys. WK_EFORMAT naming the field that is wrong. */
int glm5_indexer_full(json_t *cfg, int n_layers, bool *full, int *n_full, char *err,
		      size_t errsz);
/* The KV caches' element type eng_opts.kv_dtype asks for (opt: "f32", "bf16", "fp8",
 * "auto" or NULL; see engine.h) for the model of config cfg: DT_F32, DT_BF16 or DT_F8_E4M3
 * (FP8: e4m3 codes with one f32 scale per 128 elements of a row, struct be_cast); WK_EINVAL
 * naming opt when it is none of those. */
int eng_kv_type(const char *opt, json_t *cfg, enum dt_type *kv, char *err, size_t errsz);
/* Bytes of one KV cache element (FP8: a code; its scales are apart), and element i of a
 * cache (the families keep their caches as void *). */
static inline size_t eng_kv_size(const struct engine *e)
{
	return dt_size(e->kv);
}
/* The type of MLA's rope keys beside a latent of e's KV type: bf16 beside FP8 (FlashMLA's
 * FP8 layout keeps them so), else the same. */
static inline enum dt_type eng_kv_b_type(const struct engine *e)
{
	return e->kv == DT_F8_E4M3 ? DT_BF16 : e->kv;
}
/* An FP8 cache's scales a row of w elements: one per 128. */
static inline size_t eng_kv_blocks(int w)
{
	return ((size_t)w + 127) / 128;
}
static inline void *eng_kv_at(const struct engine *e, void *cache, size_t i)
{
	return (char *)cache + i * eng_kv_size(e);
}
/* WK_OK when e's backend runs op (BE_OP_ATTENTION, BE_OP_MLA_ATTENTION, BE_OP_DSA_TOPK) over
 * e's KV cache type and can write it; else WK_EUNSUPPORTED naming both. */
int eng_kv_check(struct engine *e, enum be_op op, char *err, size_t errsz);
/* The same for a KV type and architecture before the engine has either (the fit check). */
int eng_kv_check_arch(const struct engine *e, const char *arch, enum be_op op, enum dt_type kv,
		      char *err, size_t errsz);
const char *eng_kv_name(enum dt_type kv); /* "f32", "bf16" or "fp8" */
/* n f32 values from src (the backend's memory) into a cache of type t at dst: a copy for
 * f32, rounded to bf16 (backend op cast_n) for bf16, FP8 rows of w elements quantized with
 * their scales into ds (eng_kv_blocks(w) a row); held as a chain link while a chain is open
 * (consecutive stores share one link; f32's then a cast_n that copies). */
void eng_kv_put(struct engine *e, enum dt_type t, void *dst, float *ds, int w,
		const float *src, size_t n);
/* dst [n] f32 (the backend's memory) = n elements of src, a cache of type t (FP8: rows of w
 * elements, their scales ss): a prefill expanding the MLA latent reads it back so. */
void eng_kv_get(struct engine *e, float *dst, enum dt_type t, const void *src, const float *ss,
		int w, size_t n);
/* A GQA family's KV caches (llama.c, glm4.c): k and v [max_seqs][n_layers][max_seq][n_kv *
 * head_dim] of e's KV type, one row of head_dim a position and kv head; FP8: ks, vs their
 * scales, eng_kv_blocks(head_dim) a row, as be->attention reads them. */
struct eng_gqa {
	void *k, *v;
	float *ks, *vs;
	int n_layers, max_seq, n_kv, head_dim;
};
/* Checks that e's backend attends over e's KV type (eng_kv_check) and that the caches' bytes
 * are eng_seq_cache_bytes' (eng_cache_agrees), then allocates them, zeroed, for e->max_seqs
 * sequences. WK_ENOMEM naming their size. */
int eng_gqa_alloc(struct engine *e, struct eng_gqa *g, int n_layers, int max_seq, int n_kv,
		  int head_dim, char *err, size_t errsz);
void eng_gqa_free(struct engine *e, struct eng_gqa *g);
/* g's four arrays (k, v and the FP8 scales'), into c; returns 4. */
int eng_gqa_caches(const struct engine *e, const struct eng_gqa *g, struct eng_cache *c);
/* eng_seq_copy, eng_seq_save and eng_seq_load on one rank (validated): every array of the
 * family's caches, len positions of sequence seq (or src into dst) to or from host bytes.
 * The bytes (eng_caches_bytes, the same on every rank) hold tp sections: the first every
 * array of TP shard 0, each other shard's the arrays that are not whole. Rank 0 and ranks
 * 1 .. tp-1 save their sections; every rank loads what it holds from them. */
void eng_caches_copy(struct engine *e, int dst, int src, int len);
size_t eng_caches_bytes(struct engine *e, int len);
void eng_caches_io(struct engine *e, int seq, int len, void *host, bool save);
/* An f32 cache's keys (v: values) at position pos of sequence seq's layer l, where a step
 * may write its new rows directly; NULL for any other cache type. */
float *eng_gqa_f32(const struct engine *e, const struct eng_gqa *g, bool v, int seq, int l,
		   int pos);
/* kt, vt [n][n_kv * head_dim] (the backend's memory) into sequence seq's layer l at positions
 * pos0.. (eng_kv_put: FP8 rows quantized with their scales; a chain link while one is open). */
void eng_gqa_store(struct engine *e, const struct eng_gqa *g, int seq, int l, int pos0,
		   const float *kt, const float *vt, int n);
/* be->attention of n queries q [n][n_heads * head_dim] at positions pos0.. of sequence seq
 * over its layer l caches into out, scores scaled by 1 / sqrt(head_dim). */
void eng_gqa_attend(struct engine *e, const struct eng_gqa *g, int seq, int l, int pos0,
		    float *out, const float *q, int n, int n_heads);
/* The same over the n tokens of several sequences at once (struct cpu_gqa's seq and pos):
 * token i, query row i, at position pos[i] of sequence seq[i] (both arrays in the backend's
 * memory); keys_max the largest pos[i] + 1. */
void eng_gqa_attend_seqs(struct engine *e, const struct eng_gqa *g, int l, const int *seq,
			 const int *pos, int keys_max, float *out, const float *q, int n,
			 int n_heads);

/* One sequence's part of a step: token rows [off, off + n) of the step append to sequence
 * seq at positions pos0 .. pos0 + n - 1. */
struct eng_seg {
	int seq, pos0, n, off;
};
/* A segment this long gets an attention call of its own in a batched step (a prefill: a
 * device may read each key once for many of its tokens, its query tiles, which a call over
 * several sequences' tokens cannot; the CUDA backend's tiles start at 32 tokens). */
#define ENG_ATT_OWN 32
/* The attention of a step's nseg segments of T tokens over layer l: each segment of at least
 * ENG_ATT_OWN tokens (and, unfused or alone, every segment) by eng_gqa_attend, each run of
 * shorter ones as one eng_gqa_attend_seqs (pos [2 T]: each token's position, then its
 * sequence, in the backend's memory; keys_max the step's most keys). The same outputs either
 * way: a token's attention does not depend on the call it is in. */
void eng_gqa_attend_step(struct engine *e, const struct eng_gqa *g, int l,
			 const struct eng_seg *seg, int nseg, const int *pos, int keys_max,
			 float *out, const float *q, int T, int n_heads);
/* WK_OK when per_seq (bytes a family's load allocates per sequence) is what
 * eng_seq_cache_bytes says for e; else an error naming both. */
int eng_cache_agrees(const struct engine *e, uint64_t per_seq, char *err, size_t errsz);

/* The top engine of a sharded snapshot: starts the world's rank engines (backend, family
 * load) and threads. Fills e->info from rank 0. */
int shard_open(struct engine *e, const struct eng_opts *o, char *err, size_t errsz);
void shard_close(struct engine *e); /* nothing when e is not a sharded top engine */
/* Opens o->backend ("auto": see be_find; a device backend that fails to start falls back to
 * cpu with a note on stderr) with that many threads on that device into e->be / e->bctx
 * (engine.c). */
/* count.c: wraps e's started backend in the launch counter; reads the counts; eng_count
 * adds one of a kind (the copy helpers below count themselves). */
enum eng_kind {
	ENG_K_MATMUL, ENG_K_RMSNORM, ENG_K_ROPE, ENG_K_ATTENTION, ENG_K_SILU_MUL, ENG_K_ADD,
	ENG_K_LAYERNORM, ENG_K_MOE_ROUTE, ENG_K_GATHER_ROWS, ENG_K_SCATTER_ADD_ROWS,
	ENG_K_MLA_ABSORB_Q, ENG_K_MLA_ABSORB_OUT, ENG_K_MLA_ATTENTION, ENG_K_DSA_TOPK,
	ENG_K_MOE_EXPERTS, ENG_K_ZERO, ENG_K_ADD_RMSNORM, ENG_K_ACT_QUANT, ENG_K_ARGMAX,
	ENG_K_MLA_ABSORBED, ENG_K_SAMPLE_CAND, ENG_K_ACT_SPLIT, ENG_K_CAST,
	ENG_K_CHAIN, ENG_K_TO_DEVICE,
	ENG_K_TO_HOST, ENG_K_COPY,
};
int eng_count_wrap(struct engine *e, bool op_times, char *err, size_t errsz);
void eng_count(struct engine *e, enum eng_kind kind);
int eng_count_read(const struct engine *e, struct eng_launches *out);
/* Counts the tensors e's family did not look up into e->info.unused_tensors; eng_unused_at:
 * the name of tensor i (of e's rank) when it is one of them (engine.c). */
void eng_count_unused(struct engine *e, int layers);
const char *eng_unused_at(const struct engine *e, size_t i, int layers);

int eng_open_backend(struct engine *e, const struct eng_opts *o, int threads, int device,
		     char *err, size_t errsz);
/* A rank engine takes over a context started for it (a sharded restore's sink): be and ctx
 * become its own to shut down; counted says ctx is already eng_count_wrap's (else it is
 * wrapped when o asks to count). */
int eng_adopt_backend(struct engine *e, const struct backend *be, void *ctx, bool counted,
		      const struct eng_opts *o, char *err, size_t errsz);
void eng_free_host_copies(struct engine *e); /* eng_tensor_host's copies */
/* Rank engine `rank` of a sharded top engine. */
struct engine *shard_rank(struct engine *e, int rank);
/* A rank engine's step: the caller's items, whose outputs (token, draft) rank 0 writes, for
 * the other ranks to read after a collective that follows the writes (glm.c's MTP drafts);
 * NULL when e is not a rank engine or runs no step. */
const struct eng_item *shard_items(const struct engine *e);
/* eng_forward / eng_step of a sharded model: the family's forward (or step) on every rank at
 * once; rank 0 writes the logits. */
int shard_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits,
		  bool all, char *err, size_t errsz);
int shard_step(struct engine *e, const struct eng_item *items, int n, char *err,
	       size_t errsz);
/* eng_seq_copy of a sharded model: eng_caches_copy on every rank. */
int shard_seq_copy(struct engine *e, int dst, int src, int len, char *err, size_t errsz);
/* eng_seq_save and eng_seq_load of a sharded model: rank 0's eng_caches_bytes (every rank's
 * are alike), and eng_caches_io on every rank. */
size_t shard_seq_bytes(struct engine *e, int len);
int shard_seq_io(struct engine *e, int seq, int len, void *host, bool save, char *err,
		 size_t errsz);

/* Test hook: what rank engine `rank` bound from its snapshot file. */
struct eng_rank_stats {
	size_t tensors;            /* in its rank file */
	size_t used;               /* of which it looked up */
	const void *image;         /* its rank's image (snap_image) */
	uint64_t image_size;
	uintptr_t lo, hi;          /* the byte range of the data it looked up */
};
/* WK_EINVAL when e has no such rank or was not opened from a snapshot. */
int eng_rank_stats(struct engine *e, int rank, struct eng_rank_stats *st);

/* The family for config.json's architectures[0], or NULL. */
const struct family *eng_family(const char *arch);

/* A snapshot plan under construction (layout.c). */
struct plan {
	struct snap_spec *specs;
	size_t n, cap;
	struct hf_model *hf;
	enum dt_type cast; /* DT_INVALID: keep each tensor's dtype */
	int tp, ep, world; /* world = max(tp, ep); 1, 1, 1: layout version 1 */
};

/* Adds a spec that copies source tensor `name` of hf whole, cast to plan->cast for floating
 * point weights of rank >= 2 when a cast is set. Layout version 1 (unsharded). */
int plan_copy(struct plan *p, const char *name, int rank_file, char *err, size_t errsz);

/* ---- sharded layouts (version 2; the rules are at the top of layout.c) ----
 * Each adds specs under the tensor's own name, tagged with its rule; an FP8 weight brings its
 * _scale_inv along (a family's plan skips the _scale_inv names). All return WK_OK, or
 * WK_ENOTFOUND/WK_EINVAL/WK_EFORMAT/WK_ENOMEM naming the tensor. */

/* Rows [lo, hi) of dim 0 (axis 0) or columns of dim 1 (axis 1) into rank_file. */
int plan_slice(struct plan *p, const char *name, int rank_file, int axis, int64_t lo,
	       int64_t hi, const char *tag, char *err, size_t errsz);
/* The whole tensor on every rank. */
int plan_replicated(struct plan *p, const char *name, char *err, size_t errsz);
/* An even split of the axis into tp parts: rank r gets part r % tp. */
int plan_tp(struct plan *p, const char *name, int axis, char *err, size_t errsz);
/* TP shard k (= rank % tp) gets [lo[k], hi[k]) of the axis; ranges may repeat (GQA kv heads
 * replicated over the ranks that share them). */
int plan_tp_ranges(struct plan *p, const char *name, int axis, const int64_t *lo,
		   const int64_t *hi, char *err, size_t errsz);
/* The whole tensor on the ranks of EP rank ep_rank (r % ep == ep_rank). */
int plan_expert(struct plan *p, const char *name, int ep_rank, char *err, size_t errsz);

/* The weight tensor `name` of the model, from whichever source it was opened from (rank 0
 * of a snapshot), or NULL. */
const struct st_tensor *eng_tensor(struct engine *e, const char *name);
/* eng_tensor, with data the host can read: the same tensor, or, when the snapshot was
 * restored into device memory, a host copy kept until eng_close. *out NULL when missing;
 * WK_ENOMEM. */
int eng_tensor_host(struct engine *e, const char *name, const struct st_tensor **out,
		    char *err, size_t errsz);

/* ---- config helpers: each returns WK_OK or WK_EFORMAT naming the field ---- */

/* Reads integer key; absent -> def, or an error when required (def < 0 means required).
 * Values outside [lo, hi] are errors. */
int cfg_int(json_t *cfg, const char *key, long long def, long long lo, long long hi,
	    long long *out, char *err, size_t errsz);
int cfg_real(json_t *cfg, const char *key, double def, double *out, char *err, size_t errsz);
int cfg_bool(json_t *cfg, const char *key, int def, int *out, char *err, size_t errsz);

/* Binds a 2-D weight tensor by name, checking dtype (matmul-capable on the backend) and shape
 * [rows][cols]. On a device backend the weight is copied to the device (upload_weight). */
int eng_weight(struct engine *e, const char *name, int rows, int cols, struct be_weight *w,
	       char *err, size_t errsz);
/* eng_weight's checks, but w stays the host copy (the embedding: its rows are read on the
 * host, so a device backend does not hold it twice). */
int eng_weight_host(struct engine *e, const char *name, int rows, int cols,
		    struct be_weight *w, char *err, size_t errsz);
/* Copies a 1-D tensor of length len (any float dtype) into a new f32 array in the backend's
 * memory (eng_alloc: release it with eng_release). */
int eng_vector(struct engine *e, const char *name, int len, float **out, char *err,
	       size_t errsz);

/* The backend's memory (engine.c): activations and caches live where the backend's ops read
 * them. On a host-memory backend (cpu, null) these are malloc, free and memcpy. */
bool eng_host_mem(const struct engine *e);
void *eng_alloc(struct engine *e, size_t bytes); /* NULL when out of memory */
void *eng_calloc(struct engine *e, size_t bytes);  /* eng_alloc, zeroed (host: calloc) */
void eng_release(struct engine *e, void *p);
void eng_to_dev(struct engine *e, void *dst, const void *host, size_t bytes);
void eng_to_host(struct engine *e, void *host, const void *src, size_t bytes);
void eng_dcopy(struct engine *e, void *dst, const void *src, size_t bytes);
/* height rows of width bytes between the backend's buffers with pitches: one copy where the
 * backend has copy_2d, else one a row. */
void eng_dcopy_2d(struct engine *e, void *dst, size_t dpitch, const void *src, size_t spitch,
		  size_t width, size_t height);
void eng_dzero(struct engine *e, void *dst, size_t bytes);
/* *p = eng_alloc(bytes) when that succeeds (the old block, if any, released: contents are
 * not kept, this is for scratch); false, *p unchanged, when out of memory. */
bool eng_regrow(struct engine *e, void *p, size_t bytes);
/* y[k] = x . w[k]^T for k < count (<= BE_MATMUL_MAX, the same cols): one matmul_n where the
 * backend has it (and eng_opts.unfused is off), else count matmuls; from ENG_GEMM_TOKENS
 * (engine.c) tokens up, the FP8 weights through the backend's GEMM where it has one
 * (matmul_fp8act with fp8_act, else matmul_fp8w). */
void eng_matmul_n(struct engine *e, float *const *y, const float *x,
		  const struct be_weight *const *w, int count, int n);
/* eng_matmul_n, then output k rotated by r[k] where r[k].rot_dim > 0 (r[k].x inside y[k];
 * interleaved pairs, theta): one matmul_rope_n where the backend has it and the matmuls run
 * its GEMV (no fp8_act, fewer than ENG_GEMM_TOKENS tokens, not unfused), else eng_matmul_n
 * and one eng_rope_n. */
void eng_matmul_rope_n(struct engine *e, float *const *y, const float *x,
		       const struct be_weight *const *w, int count, int n,
		       const struct be_rope *r, float theta);
/* the norms r[0..count) (count <= BE_NORM_MAX), each with its rotation if it has one: one
 * norm_n where the backend has it (and eng_opts.unfused is off), else one rmsnorm or
 * layernorm (and rope) each. */
void eng_norm_n(struct engine *e, const struct be_norm *r, int count);
/* rope over r[0..count) (count <= BE_ROPE_MAX): one rope_n where the backend has it (and
 * eng_opts.unfused is off), else count ropes. */
void eng_rope_n(struct engine *e, const struct be_rope *r, int count, float theta,
		bool interleaved);
/* The output rows of a step's items: each item's last max(rows, 1) tokens. */
int eng_out_rows(const struct eng_item *items, int n);
/* Copies the items' output rows of x [T][dim] (the step's tokens, item after item) to y
 * [eng_out_rows][dim], in order. */
void eng_pick_rows(struct engine *e, float *y, const float *x, const struct eng_item *items,
		   int n, int dim);
/* A step's outputs from lg [eng_out_rows(items, n)][vocab] (backend memory; rank 0 of a
 * sharded model, where the gathered rows are host memory; an item of several rows has them
 * one after another): each row's logits to items[i].logits when set, its
 * argmax to *items[i].token when set (on the backend when it has argmax and lg is device
 * memory: one launch and n ids copied), or with temperature > 0 its sampled token (with
 * sample_cand and lg device memory: one launch, one copy of the candidates, and a logits row
 * for each row with more than ENG_CAND_CAP). WK_ENOMEM. */
int eng_outputs(struct engine *e, const struct eng_item *items, int n, const float *lg,
		int vocab, char *err, size_t errsz);
/* y = x . w^T as be->matmul, with fp8_act's quantized input for an FP8 weight; an FP8 weight
 * in a step of ENG_GEMM_TOKENS tokens or more through the backend's GEMM, as eng_matmul_n. */
void eng_matmul(struct engine *e, float *y, const float *x, const struct be_weight *w, int n);
/* Chained launches (backend member chain). Between eng_chain_begin and eng_chain_end, the
 * GEMVs (eng_matmul, eng_matmul_n and eng_matmul_rope_n where they would run the backend's
 * matmul, matmul_n or matmul_rope_n), eng_add_rmsnorm, eng_norm_n and a decode step's
 * eng_moe_route_experts are held and then run as
 * one op (up to BE_CHAIN_MAX of them; one held alone runs as itself). Any other eng_ op that
 * touches the backend runs what is held first. The caller must not call the backend itself
 * while ops are held: it ends the chain first. Nothing is held where the backend lacks chain,
 * or with eng_opts.unfused, fp8_act or no_chain. eng_chain_end with nothing held does nothing. */
void eng_chain_begin(struct engine *e);
void eng_chain_end(struct engine *e);
void eng_chain_flush(struct engine *e); /* runs what is held; the chain goes on */
/* be->moe_route_experts (the caller checked the backend has it), held in a chain from fewer
 * than ENG_GEMM_TOKENS tokens. */
void eng_moe_route_experts(struct engine *e, float *y, const float *x, const float *logits,
			   const float *bias, const struct be_route *r, int *idx, float *wt, int n,
			   const struct be_experts *ex, void *scratch);
/* x [n][dim] += d, then y = rmsnorm(x) . w: one add_rmsnorm where the backend has it (and
 * eng_opts.unfused is off), else add and rmsnorm. */
void eng_add_rmsnorm(struct engine *e, float *x, const float *d, float *y, const float *w,
		     int n, int dim, float eps);
/* After a step: WK_OK, or the backend's sticky error (a failed kernel), which fails the
 * step and every later one. */
int eng_sync(struct engine *e, char *err, size_t errsz);

#endif
