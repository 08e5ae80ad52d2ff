/*
 * glm_int.h - internals shared by the GLM families: glm.c (config, weights, the decoder
 * skeleton, dense MLP and MoE), glm4.c (Glm4MoeForCausalLM: GQA attention) and glm5.c
 * (GlmMoeDsaForCausalLM: MLA attention with the DSA indexer).
 *
 * Both families are the same decoder: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)); then
 * final norm and lm_head. Only the attention differs, so glm.c owns everything else and calls
 * the family's attention through struct glm_attn.
 */
#ifndef GLM_INT_H
#define GLM_INT_H

#include "engine/engine_int.h"

/* A SwiGLU MLP: down(silu(gate(x)) * up(x)). */
struct glm_mlp {
	struct be_weight gate, up; /* (inter, dim) */
	struct be_weight down;     /* (dim, inter) */
};

/* Routed experts + shared experts, sigmoid noaux_tc router. */
struct glm_moe {
	struct be_weight router; /* (n_experts, dim), F32 or BF16 as the checkpoint keeps it */
	float *bias;             /* (n_experts) e_score_correction_bias (backend memory) */
	struct glm_mlp *experts; /* [n_experts], each (moe_inter, dim) / (dim, moe_inter); only
				  * [ex0, ex1) are bound on a sharded rank */
	struct glm_mlp shared;   /* width l_shared (moe_inter * n_shared / tp); unused when
				  * n_shared == 0 */
	bool grouped;            /* the backend runs this rank's experts in one op (bex) */
	struct be_experts bex;   /* bex.shared: the shared expert inside that op (bex_shared) */
	struct be_expert bex_shared;
};

struct glm_layer {
	float *attn_norm, *mlp_norm; /* (dim), backend memory */
	bool moe;                    /* else the dense MLP */
	struct glm_mlp mlp;          /* dense layers: width l_inter (intermediate_size / tp) */
	struct glm_moe ffn;          /* MoE layers */
};

/* Config fields both families read. */
struct glm_cfg {
	int dim, vocab, n_layers, max_seq;
	int inter, moe_inter;                /* dense MLP width, one expert's width */
	int n_experts, n_shared, top_k, n_group, topk_group;
	bool norm_topk;
	float routed_scale;
	float eps, theta;                    /* rms_norm_eps, rope theta */
	bool tied;
	int mtp;                             /* num_nextn_predict_layers */
	int n_attn;                          /* layers with weights and caches: n_layers, +1
					      * with the MTP layer loaded (layers[n_layers]) */
	/* this rank's shard (shard.c; all of it when unsharded) */
	int l_inter, l_shared;               /* dense MLP and shared-expert widths here */
	int ex0, ex1;                        /* routed experts [ex0, ex1) live here */
	int vocab0, l_vocab;                 /* embedding / lm_head rows [vocab0, +l_vocab) */
};

struct glm_model;

/* A family's attention, over the T token rows of a step (continuous batching: several
 * sequences, each with its own caches, sequence s's at index s of max_seqs). forward writes
 * the attention output (before the residual add) out [T][dim] from the normalised input
 * x [T][dim] of layer l, and appends each segment's keys to its sequence's caches. The
 * projections see all T rows at once, so each weight is read once per step; attention runs
 * per segment. */
struct glm_attn {
	int (*load)(struct engine *e, struct glm_model *m, char *err, size_t errsz);
	/* scratch for a step of T rows in these segments; WK_ENOMEM */
	int (*grow)(struct glm_model *m, int T, const struct eng_seg *seg, int nseg);
	void (*forward)(struct engine *e, struct glm_model *m, int l, float *out, const float *x,
			int T, const struct eng_seg *seg, int nseg);
	/* the per-sequence arrays of its caches (family.caches), into c; returns how many */
	int (*caches)(struct engine *e, struct glm_model *m, struct eng_cache *c);
	void (*free)(struct glm_model *m);
};

/* Memory: weights, norm vectors, activations and caches are the backend's (eng_weight,
 * eng_vector, eng_alloc: device memory on a device backend, which the host never touches;
 * tests/unit/test_devmem.c checks that). Token ids, positions and the routing plan are built
 * on the host (the *_h arrays) and copied over; the routing choice comes back to the host
 * once per MoE layer to group tokens by expert. */
struct glm_model {
	struct engine *e;
	struct glm_cfg c;
	const struct glm_attn *attn_ops;
	void *attn;                    /* the family's attention state */
	const struct st_tensor *embed; /* (l_vocab, dim) */
	struct be_weight lm_head;      /* (l_vocab, dim); the embedding when tied */
	float *final_norm;             /* (dim), backend memory */
	struct glm_layer *layers;      /* [n_layers] */
	uint64_t attn_bytes;           /* attention weight bytes one decode step reads */
	void **owned;                  /* host allocations freed with the model */
	size_t n_owned, cap_owned;
	void **downed;                 /* backend allocations (eng_alloc) freed with it */
	size_t n_downed, cap_downed;
	int max_seqs;                      /* sequences held (e->max_seqs): caches are per seq */
	/* scratch for `cap` tokens; backend memory unless marked host */
	int cap;
	int *pos, *pos_h;                  /* (2 cap) a step's T positions, then each token's
					    * sequence; pos_h host */
	int *tok;                          /* (cap) host */
	struct eng_seg *seg;               /* (max_seqs) host: the current step's segments */
	int keys_max;                      /* the current step's most keys a token has (the
					    * largest pos0 + n of its segments) */
	float *x, *xb, *tmp;               /* (cap, dim) */
	float *xh;                         /* (cap, dim) host: the embedded tokens, when the
					    * backend's memory is not the host's (else NULL) */
	float *g, *u;                      /* (cap, widest MLP) */
	float *logits;                     /* (cap, n_experts) */
	int *idx, *idx_h;                  /* (cap, top_k) the experts chosen; idx_h host */
	float *wt, *wt_h;                  /* (cap, top_k) their gate values; wt_h host */
	int *rows, *rows_h;                /* (cap * top_k) tokens grouped by expert */
	float *rw, *rw_h;                  /* (cap * top_k) their gate values */
	float *xg, *yg;                    /* (cap, dim) one expert's batch */
	int *count;                        /* (n_experts + 1) host */
	float *lg;                         /* (lg_cap, vocab) logits */
	float *gath;                       /* host, sharded: (world, lg_cap, l_vocab) for the
					    * all_gather */
	int lg_cap;
	const struct be_experts *bex0;     /* a grouped MoE layer's (one with the shared expert
					    * if any has it), for sizing moe_scr */
	void *moe_scr;                     /* moe_experts' scratch for cap tokens */
	/* The MTP layer (eng_opts.mtp; glm.c "MTP drafts"): layers[n_layers] its decoder layer.
	 * Per sequence, e->mtp_len positions have their MTP cache rows; pend holds the main
	 * model's hidden state at the last of them when its next token was not known yet. */
	bool mtp;
	struct be_weight eh_proj;          /* (dim, 2 dim) */
	float *enorm, *hnorm, *head_norm;  /* (dim) the embedding's, the hidden state's and
					    * shared_head's norms */
	float *hid;                        /* (cap, dim) the step's hidden states after the
					    * final norm, where the decode path does not keep
					    * them in xb */
	float *mh;                         /* (cap, dim) an MTP pass's hidden input rows */
	float *mcat;                       /* (cap, 2 dim) [enorm(embedding) | hnorm(hidden)] */
	float *pend;                       /* (max_seqs, dim) */
	struct eng_seg *mseg;              /* (max_seqs) host: an MTP pass's segments */
	int *mtok, *dtok, *dj, *di, *q0;   /* (cap), then (max_seqs) host: a pass's tokens;
					    * a chain step's drafts, their segments, their items;
					    * each item's e->mtp_len at the step's start */
	struct eng_item *ditem;            /* (max_seqs) host: the argmax of each draft row */
};

/* Keeps p (malloc'd) until the model is freed. Returns p, or NULL (and frees p) when the list
 * cannot grow. */
void *glm_own(struct glm_model *m, void *p);
/* eng_weight, plus: data that is not aligned for its dtype (or FP8 block scales that are not
 * 4-aligned) is copied into owned aligned memory, so kernels may load it directly. */
int glm_weight(struct engine *e, struct glm_model *m, const char *name, int rows, int cols,
	       struct be_weight *w, char *err, size_t errsz);
/* eng_vector, kept until the model is freed. */
int glm_vector(struct engine *e, struct glm_model *m, const char *name, int len, float **out,
	       char *err, size_t errsz);
/* Bytes a weight occupies (with its block scales). */
uint64_t glm_weight_bytes(const struct be_weight *w);
/* Reads the rope settings: theta from rope_parameters.rope_theta or rope_theta (default
 * def_theta); partial_rotary_factor from rope_parameters or the top level (default
 * def_partial); any rope_type but "default" (and rope_scaling) is refused by name. */
int glm_rope_cfg(json_t *cfg, double def_theta, double def_partial, double *theta,
		 double *partial, char *err, size_t errsz);
/* WK_OK when string field key is absent, null or equal to want; else WK_EUNSUPPORTED with a
 * message naming the field. */
int glm_require_str(json_t *cfg, const char *key, const char *want, char *err, size_t errsz);

/* Opens a GLM model: config, embeddings, norms, MLP/MoE per layer, then ops->load. */
int glm_load(struct engine *e, const struct glm_attn *ops, char *err, size_t errsz);
int glm_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits, bool all,
		char *err, size_t errsz);
int glm_step(struct engine *e, const struct eng_item *items, int n, char *err, size_t errsz);
int glm_caches(struct engine *e, struct eng_cache *c);
void glm_free(struct engine *e);
/* The snapshot layout of both families. Sharded, a family's attention tensors follow its
 * own rule: attn() plans the tensor `name` of layer l whose name ends in self_attn.<leaf>. */
typedef int (*glm_attn_plan)(struct plan *p, json_t *cfg, const char *name, const char *leaf,
			     char *err, size_t errsz);
int glm_plan(struct hf_model *hf, struct plan *p, glm_attn_plan attn, bool mtp, char *err,
	     size_t errsz);

/* Test hook (glm5.c): sequence 0's MLA cache of the last layer, (max_seq, lora) and
 * (max_seq, rope), and the DSA selection that the last full layer made for the first segment
 * of the latest step (sparse false: it attended densely). Returns WK_EINVAL when e is not a
 * GLM-5 engine. */
struct glm5_debug {
	void *ckv, *kpe; /* the last layer's caches of sequence 0: ckv of type kv (FP8: its
			  * scales cks, a row's together), kpe of type kv_b */
	const float *cks;
	enum dt_type kv, kv_b;
	int lora, rope;
	const int *sel, *nsel;
	int sel_stride;
	bool sparse;
};
int glm5_debug(struct engine *e, struct glm5_debug *d);

#endif
