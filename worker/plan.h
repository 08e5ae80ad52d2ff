/*
 * plan.h - memory planning from config.json alone: how a model splits over the GPUs of a
 * node under a TP/EP layout, and what is left for the KV cache (`wick plan`).
 *
 * Three steps, each a pure function (no I/O; thread-safe):
 *   plan_model_read  config.json (a jansson object) -> struct plan_model, the dimensions
 *   plan_compute     model + options (layout, memory, context, dtypes) -> struct plan_result
 *   plan_parse_size / plan_parse_dtype  the CLI's value parsers
 *
 * The layout rules are wick's snapshot rules (engine/layout.c; restated in plan.c's header
 * comment): world = max(tp, ep) and the smaller divides it; attention heads split over TP;
 * dense MLP and shared experts split TP; routed experts whole, n_routed / ep per rank; router,
 * norms, the MLA down-projections and the DSA indexer replicated; embeddings and lm_head
 * vocab-parallel over TP; copies when tp or ep < world run redundantly. MTP layers are
 * counted apart: the engine skips them at load.
 */
#ifndef PLAN_H
#define PLAN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum plan_dtype { PLAN_F32, PLAN_BF16, PLAN_F16, PLAN_FP8, PLAN_NDTYPE };

#define PLAN_MAX_WARN 6
#define PLAN_WARN_LEN 240

/* What plan_compute needs from config.json. */
struct plan_model {
	char arch[128], model_type[64];
	bool known_arch;         /* one wick's engine runs */
	int64_t dim, vocab, layers, heads, max_pos; /* max_pos 0: not given */
	/* attention: GQA (kv_heads, head_dim, biases, qk norm) or MLA (kv_lora_rank given) */
	bool mla;
	int64_t kv_heads, head_dim;
	bool attn_bias, qk_norm;
	int64_t q_lora;          /* 0: a plain q_proj (q_lora_rank null) */
	int64_t kv_lora, qk_nope, qk_rope, v_head;
	/* DSA lightning indexer (MLA only) */
	bool dsa;
	int64_t index_heads, index_dim, index_topk;
	int64_t index_full_layers; /* layers with their own indexer ("full"), the rest share */
	/* MLP / MoE */
	int64_t inter;           /* dense MLP width (intermediate_size) */
	int64_t moe_inter, n_routed, n_shared, top_k;
	int64_t dense_layers, moe_layers;
	int64_t mtp_layers;      /* num_nextn_predict_layers */
	bool tied;
	/* dtypes: the checkpoint's (torch_dtype / dtype) and its quantization */
	enum plan_dtype base;
	enum plan_dtype kv_auto; /* the engine's KV cache type by default (eng_kv_type's auto):
				  * bf16 for a bfloat16 checkpoint, else f32 */
	bool fp8;                /* quantization_config.quant_method "fp8" */
	int block_rows, block_cols; /* its weight_block_size; 0 0: one scale per tensor */
	char quant_note[96];     /* what quantization_config said, for the report */
	char warn[PLAN_MAX_WARN][PLAN_WARN_LEN];
	int nwarn;
};

struct plan_opts {
	int tp, ep, gpus;        /* gpus 0: the world size */
	uint64_t gpu_mem;        /* bytes per GPU */
	uint64_t reserve;        /* bytes per GPU kept back (CUDA context, NCCL, allocator) */
	int64_t context;         /* tokens per sequence; 0: max_position_embeddings */
	int64_t batch;           /* tokens in one forward step (workspace) */
	enum plan_dtype weights; /* PLAN_NDTYPE: the config's (quantization_config, else base) */
	enum plan_dtype kv;
	bool mtp;                /* the MTP layer loaded to draft (wick worker --speculate with
				  * its MTP drafter): in the totals and the KV cache */
};

enum plan_part_id {
	PLAN_ATTN, PLAN_INDEXER, PLAN_DENSE, PLAN_SHARED, PLAN_ROUTED, PLAN_ROUTER, PLAN_EMBED,
	PLAN_LM_HEAD, PLAN_NORMS, PLAN_NPARTS
};

struct plan_part {
	const char *name;  /* "attention", "indexer", ... */
	const char *split; /* how it is laid out: "tp", "ep", "replicated", ... */
	uint64_t params;   /* parameters in the model (scales not counted) */
	uint64_t bytes;    /* bytes in the model, unsharded, scales included */
	uint64_t gpu;      /* bytes one GPU holds (the largest rank's share) */
};

struct plan_result {
	int tp, ep, world;
	int attn_copies, expert_copies; /* world / tp, world / ep: ranks holding the same shard */
	int64_t heads_per_gpu, kv_heads_per_gpu, experts_per_gpu;
	enum plan_dtype weights, kv;
	int64_t context, batch;
	struct plan_part part[PLAN_NPARTS];
	uint64_t params, bytes, gpu, all_gpus; /* totals; all_gpus = gpu * world */
	struct plan_part mtp;        /* the MTP layers: in the totals only with plan_opts.mtp
				      * (then the one wick runs) */
	bool mtp_counted;
	struct {
		uint64_t hidden, attn, indexer, ffn, logits, total;
	} ws;                        /* workspace per GPU; see plan.c for the formula */
	/* KV cache bytes per token on one GPU: MLA latent (or GQA k+v), DSA indexer keys */
	uint64_t kv_main, kv_index, kv_gpu;
	uint64_t kv_node;            /* per token over all GPUs (kv_gpu * world) */
	bool kv_replicated;          /* MLA: every TP rank holds the whole latent */
	int64_t budget;              /* gpu_mem - weights - workspace - reserve; may be < 0 */
	uint64_t kv_tokens_gpu;      /* tokens one GPU's budget holds: also the node's, since
				      * every GPU holds every sequence (its heads' share) */
	uint64_t max_seqs;           /* sequences of `context` tokens */
	bool fits_weights;           /* weights + workspace + reserve <= gpu_mem */
	bool fits;                   /* and at least one sequence of `context` tokens */
	uint64_t shortfall;          /* when !fits: bytes per GPU missing for one sequence */
	char warn[PLAN_MAX_WARN][PLAN_WARN_LEN];
	int nwarn;
};

/* Reads the fields plan_compute needs. Errors (WK_EFORMAT, WK_EUNSUPPORTED) name the
 * config.json field; oddities that still allow a plan become m->warn lines. */
int plan_model_read(json_t *cfg, struct plan_model *m, char *err, size_t errsz);

/* Computes the plan. A layout that does not fit the model (tp not dividing the heads, ep not
 * dividing the experts, gpus != world, ...) or bad options give WK_EINVAL with a message
 * naming the flag. */
int plan_compute(const struct plan_model *m, const struct plan_opts *o, struct plan_result *r,
		 char *err, size_t errsz);

/* "141GB" (10^9), "141GiB" (2^30), also B, KB/KiB, MB/MiB, TB/TiB (units case-insensitive),
 * decimals allowed with a unit ("1.5TB"); a bare integer is bytes. WK_EINVAL with a message
 * quoting s on anything else, zero, or more than 2^60 bytes. */
int plan_parse_size(const char *s, uint64_t *out, char *err, size_t errsz);

/* "fp8", "bf16", "f16"/"fp16", "f32"/"fp32": WK_OK, else WK_EINVAL. */
int plan_parse_dtype(const char *s, enum plan_dtype *out);
const char *plan_dtype_name(enum plan_dtype d);

#endif
