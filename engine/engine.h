/*
 * engine.h - load a model and run it: the only header the worker and the CLI need.
 *
 * MODEL is a Hugging Face directory (config.json + safetensors + tokenizer.json) or a snapshot
 * of one (coldstart/snapshot.h). The model
 * family comes from config.json's "architectures"; an unknown one is refused by name.
 * Supported now: LlamaForCausalLM (f32, bf16 or f16 weights); Glm4MoeForCausalLM and
 * GlmMoeDsaForCausalLM (also FP8 E4M3 weights with 128x128 block scales).
 *
 * An engine holds up to max_seqs sequences, each with its own KV cache (see eng_step). It is
 * not thread-safe: one caller at a time.
 *
 * A snapshot made with `--tp T --ep E` runs sharded over max(T, E) ranks, one thread each
 * (engine/shard.c: on the CPU backend with in-process collectives, on GPUs with NCCL); the
 * API is the same and the logits come back whole.
 */
#ifndef ENGINE_H
#define ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;

struct backend;
struct comm_ops;

struct eng_opts {
	const char *backend; /* "cpu", "cuda" or "auto" (NULL means auto) */
	int threads;         /* CPU threads; <= 0 means all cores (sharded: shared by the ranks) */
	int max_seq;         /* KV cache length; <= 0 means the model's max_position_embeddings */
	int max_seqs;        /* sequences held at once (continuous batching); <= 0 means 1 */
	bool no_verify;      /* snapshots: skip the chunk checksums */
	bool no_tokenizer;   /* leave tokenizer.json unread (eng_tokenizer NULL): for callers
			      * that take token ids only, as `wick logits` */
	size_t tok_memo;     /* bytes of the tokenizer's memo of long segments (tok_memo_set:
			      * a conversation's turns encoded once); 0: none */
	int tp, ep;          /* snapshots: the parallelism to run with; 0 means the manifest's */
	const char *source;  /* snapshots: when set, refuse if this checkpoint changed since */
	const struct backend *backend_ops; /* tests: this backend instead of o->backend */
	const struct comm_ops *comm_ops;   /* tests: these collectives instead of the
					    * backend's (sharded snapshots) */
	bool count_launches; /* count every op and copy (eng_launches; `wick bench launches`) */
	bool op_times;       /* with count_launches: time every op too (eng_launches) */
	bool experts_one_by_one; /* MoE: never the backend's grouped op (a baseline to compare) */
	bool unfused;            /* a baseline: one matmul per weight (never matmul_n), and
				  * the caches written through copies */
	bool fp8_act;            /* FP8 activations: the input of every FP8-weight matmul
				  * quantized per token per 128 channels (DeepGEMM's 1x128) */
	bool no_chain;           /* a baseline: every op its own launch, no chained launches
				  * (also WICK_NO_CHAIN=1 in the environment) */
	/* The KV caches' element type: "f32", "bf16", "fp8", or "auto" (NULL): bf16 when
	 * config.json's torch_dtype (or dtype) is bfloat16, as the checkpoint's own precision
	 * (GLM-5's), else f32 (llama2.c's f32 models). bf16 halves the cache: twice the context
	 * or the sequences in the same memory. "fp8" stores e4m3 codes with one f32 scale per
	 * 128 values of a row: for GLM-5 the latent and the indexer keys, the rope keys in bf16,
	 * FlashMLA's FP8 layout (656 bytes a token a layer at GLM-5's sizes against bf16's
	 * 1,152); for the GQA families (GLM-4.5, Llama) keys and values, a scale per kv head's
	 * row of head_dim (132 bytes a head of 128 against bf16's 256). */
	const char *kv_dtype;
	/* The model's MTP layer (GLM's num_nextn_predict_layers; DeepSeek-V3's multi-token
	 * prediction), for speculative decoding's drafts (eng_item.drafts): ENG_MTP_OFF leaves
	 * it unloaded; ENG_MTP_ON loads it, and a model without one (or a snapshot made
	 * without wick snapshot --mtp) is refused by name; ENG_MTP_AUTO loads it where the
	 * checkpoint or snapshot holds it (eng_info.mtp says). Sharded too. */
	int mtp;
};

enum { ENG_MTP_OFF, ENG_MTP_ON, ENG_MTP_AUTO };

struct eng_info {
	const char *arch;          /* config.json architectures[0] */
	const char *backend;       /* the backend in use */
	int vocab;                 /* config.json vocab_size: the logits' length */
	int max_seq;               /* positions the KV cache holds, per sequence */
	int max_seqs;              /* sequences the engine holds at once */
	const char *kv_dtype;      /* the KV caches' element type: "f32", "bf16" or "fp8" */
	int bos, eos;              /* from config.json (eos: the first of a list); -1 when absent */
	int n_stop, stop[8];       /* the ids that end a generation: every eos_token_id of
				    * config.json (GLM's is a list: <|endoftext|>, <|user|>,
				    * <|observation|>) and bos_token_id (llama2.c's models begin
				    * their next story with it) */
	int64_t params;            /* parameters in the checkpoint */
	uint64_t weight_bytes;     /* bytes of weights in the checkpoint */
	uint64_t bytes_per_token;  /* weight bytes one batch-1 decode step reads (sharded: on
				    * rank 0, as the ranks read in parallel) */
	int mtp_layers_skipped;    /* MTP (num_nextn_predict_layers) layers left unloaded */
	int mtp;                   /* MTP layers loaded (eng_opts.mtp): 0 or 1 */
	int unused_tensors;        /* other tensors of the checkpoint the model never read (a
				    * config that does not match the weights, e.g. biases with
				    * attention_bias false); sharded: each name once */
	const char *unused_example; /* the first of them (name order), or NULL */
	struct eng_startup {       /* where eng_open's time went (seconds, CLOCK_MONOTONIC) */
		bool snapshot;         /* the weights came from a snapshot */
		double weights_s;      /* opening the checkpoint or restoring the snapshot */
		double read_s;         /* of which moving bytes (snapshot reads; 0 for mmap) */
		double verify_s;       /* checksum time, summed over reader threads */
		double tokenizer_s;    /* loading the tokenizer, beside the weights (on a thread
					* of its own from the start) */
		bool tokenizer_prepared; /* it came from a snapshot's tokenizer.prepared, not
					  * from parsing tokenizer.json */
		double init_s;         /* backend, binding weights, KV cache, and the wait for the
					* tokenizer where it took longer than the weights */
		double total_s;        /* all of eng_open */
		double ready_mono;     /* wk_now() when eng_open returned */
		uint64_t bytes;        /* bytes restored */
		bool to_device;        /* restored straight into the backend's device memory
					* (the snapshot streamed through pinned staging) */
		/* sharded (world > 1): */
		double ranks_s;        /* starting the further ranks' device contexts, at once
					* (a restore into device memory; 0 otherwise) */
		double comm_s;         /* making the ranks' communicator: beside the restore where
					* it streamed into device memory, else after it */
		double comm_wait_s;    /* of which the start waited for after the weights */
	} startup;
};

struct engine;

/* Opens model_dir and prepares the backend and KV cache. Errors name the file, tensor or
 * config field at fault. Free with eng_close(). */
int eng_open(const char *model_dir, const struct eng_opts *opts, struct engine **out,
	     char *err, size_t errsz);

/* What a GPU would launch (eng_opts.count_launches, engine/count.c): the backend ops and the
 * copies the engine has issued since eng_open, per kind, and the collectives (all_reduce,
 * all_gather, votes) of a sharded rank. Sharded: rank `rank`'s (one GPU's); unsharded: rank
 * 0. WK_EINVAL when the engine does not count or there is no such rank. */
#define ENG_LAUNCH_KINDS 27
struct eng_launches {
	long n[ENG_LAUNCH_KINDS];
	long chained[ENG_LAUNCH_KINDS]; /* ops of each kind run inside chains (kind "chain") */
	long collectives;
	/* With eng_opts.op_times: the ops of each kind timed (a matmul_n is one, a chain one
	 * "chain"), their time in ms on the host around each call, and where the backend has
	 * the device's clock (dev_clock: the CUDA backend's events) on the device, with the
	 * device's time between ops (gap_ms); a host-memory backend runs an op before
	 * returning, so there host_ms is the op's time. Reading waits for the device.
	 * op_times_rc: WK_OK, or WK_EIO once reading the device's clock failed (it stopped). */
	long timed[ENG_LAUNCH_KINDS];
	double host_ms[ENG_LAUNCH_KINDS], dev_ms[ENG_LAUNCH_KINDS], gap_ms;
	bool dev_clock;
	int op_times_rc;
};
int eng_launches(const struct engine *e, int rank, struct eng_launches *out);
/* The name of kind k ("matmul", "to_host", ...), whether it is a copy rather than a kernel,
 * and how many launches one op of the kind is on the CUDA backend (moe_experts: 3; the rest
 * 1); NULL past the last kind. */
const char *eng_launch_kind(int k, bool *is_copy, int *launches);
void eng_close(struct engine *e); /* NULL is fine */

const struct eng_info *eng_info(const struct engine *e);
/* Whether id ends a generation (in->stop). */
bool eng_is_stop(const struct eng_info *in, int id);
/* The model's tokenizer (tokenizer.json beside the weights), or NULL when there is none. */
const struct tok *eng_tokenizer(const struct engine *e);

/* Runs tokens[0..n) at positions pos0 .. pos0+n-1, after the cached positions 0 .. pos0-1.
 * Writes the logits [vocab] of the last token to logits, or with all=true the logits
 * [n][vocab] of every token. Returns WK_OK, WK_EINVAL (a token id outside the vocabulary, or
 * pos0 + n past max_seq), or a backend failure. */
int eng_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits, bool all,
		char *err, size_t errsz);

/* ---- sequences: continuous batching ----
 *
 * The engine holds up to max_seqs sequences, each with its own KV cache. One eng_step runs a
 * batch in which each item appends tokens to its sequence (a whole prompt, a chunk of one, or
 * one decoded token) and gets the logits of its last token; the weights are read once for the
 * whole batch. Sequence 0 is the one eng_forward() uses. */

struct eng_item {
	int seq;           /* from eng_seq_alloc */
	const int *tokens; /* [n] appended at positions eng_seq_len(seq) .. +n-1 */
	int n;
	float *logits;     /* [vocab]: the logits of the last token, or NULL */
	int *token;        /* or NULL: the argmax of those logits (lowest id on ties), chosen on
			    * the backend's device where it can, so that only the id crosses to
			    * the host (greedy decoding); with logits NULL they are not copied */
	/* With token and sample.temperature > 0, *token is sampled instead: samp_pick's token
	 * (engine/sampler.h) for these settings and the draw u (the request's samp_draw), so
	 * what samp_next would give. Where the logits are in device memory and the backend
	 * has sample_cand, the device selects the candidates and only they cross to the host
	 * (temperature alone: the device makes the pick with u, and one candidate crosses; a
	 * filtered list longer than ENG_CAND_CAP copies its logits instead); the device's expf
	 * and sums may differ from the host's in the last bits, which moves a draw that close
	 * to a boundary. */
	struct eng_sample {
		float temperature, top_p;
		int top_k;
		double u;
		/* rows > 1, sampled: two draws a row, [2 * rows]; row j < rows - 1 is followed by
		 * a draft (tokens[n - rows + j + 1]), kept when draw 2j says so and else replaced by
		 * a pick with draw 2j + 1 (samp_pick_draft: the pick's distribution whatever the
		 * draft); the last row's token is an ordinary pick with draw 2 * rows - 1 */
		const double *u_rows;
	} sample;
	/* Outputs for the last `rows` tokens (0 or 1: the last only), in order: logits
	 * [rows][vocab] and token [rows], the argmax of each, or with temperature > 0 the picks
	 * of sample.u_rows. Speculative decoding's verification: the token after each draft. */
	int rows;
	/* With the MTP layer loaded (eng_info.mtp) and token set: `drafts` (up to
	 * ENG_DRAFT_MAX) tokens the MTP layer predicts after this item's next token, into
	 * draft[drafts] (-1 where the context ends first). The next token is token[a], after
	 * the a drafts among the last rows that equal the output before them (the kept
	 * drafts of a verification). Each draft is the MTP layer's argmax: the first from the
	 * main model's hidden state, each further one from the MTP layer's own (chained, as
	 * vLLM and SGLang run DeepSeek-V3's one MTP layer for k drafts). draft_logits, or NULL:
	 * [drafts][vocab] the MTP layer's logits of each. */
	int drafts;
	int *draft;
	float *draft_logits;
	/* With the MTP layer loaded, token set and drafts 0: the MTP layer still runs over this
	 * item's rows (no lm_head, no drafts), so that its caches keep up and a later step's
	 * drafts attend to these positions. A caller that drafts only now and then sets it on
	 * the steps between (a pass of one layer, against the drafts' layer and lm_head each). */
	bool mtp_cache;
};
#define ENG_DRAFT_MAX 16
/* The most candidates per row a device's sample_cand sends to the host: 8 KiB per row (at
 * batch 64, 0.5 MiB a step instead of GLM's 38 MiB of logits), enough for any top_k up to
 * 1024 and for top_p on a trained model's usual distributions; one block of the CUDA kernel
 * sorts them in shared memory (8 KiB of keys). */
#define ENG_CAND_CAP 1024

/* Takes a free sequence (empty cache). WK_ELIMIT when all max_seqs are in use. */
int eng_seq_alloc(struct engine *e, int *seq);
void eng_seq_free(struct engine *e, int seq);
int eng_seq_len(const struct engine *e, int seq);
/* Forgets the tokens of sequence seq past its first len (the drafts a verification
 * rejected): the next step appends at position len. WK_EINVAL unless 0 <= len <= its length.
 */
int eng_seq_truncate(struct engine *e, int seq, int len);
/* Sequence dst (allocated) becomes what src would be truncated to its first len tokens: the
 * caches of those positions are copied into dst's (every layer's, the MTP layer's too, on every
 * rank), and src is unchanged. So several sequences may share one prompt's prefill: the next
 * step appends to dst at position len. The copy is queued on the device like a step's work.
 * WK_EINVAL (a sequence not allocated, dst == src, len outside 1 .. src's length) or
 * WK_EUNSUPPORTED (a family that holds one sequence), with a message. */
int eng_seq_copy(struct engine *e, int dst, int src, int len, char *err, size_t errsz);
/* A sequence's caches as host bytes, so that a prefix outlives the process (the prefix cache
 * written at exit and read at start). eng_seq_bytes: the bytes of len positions' (every
 * array of every layer, the MTP layer's waiting state, every rank's), or 0 where the family
 * holds one sequence or len is outside 1 .. max_seq. eng_seq_save writes sequence seq's
 * first len positions into buf (n must be eng_seq_bytes(len)); eng_seq_load makes sequence
 * seq (allocated) hold what such bytes hold, at their length. The bytes name their length;
 * they mean something only to an engine of the same eng_cache_id. WK_EINVAL, WK_EFORMAT
 * (bytes that do not hold what they name) or a device error, with a message. */
size_t eng_seq_bytes(struct engine *e, int len);
int eng_seq_save(struct engine *e, int seq, int len, void *buf, size_t n, char *err,
		 size_t errsz);
int eng_seq_load(struct engine *e, int seq, const void *buf, size_t n, char *err,
		 size_t errsz);
/* What eng_seq_load checks before it copies: that the bytes hold what they name (*len: their
 * positions). WK_EFORMAT with a message. */
int eng_seq_check(struct engine *e, const void *buf, size_t n, int *len, char *err,
		  size_t errsz);
/* What saved caches mean (*id): the weights (a snapshot's manifest, or a checkpoint's sampled
 * source identity), config.json, the KV cache's type, the backend, FP8 activations, the MTP
 * layer, and the world's tp x ep. Saved bytes load only into an engine of the same id. */
int eng_cache_id(struct engine *e, uint64_t *id, char *err, size_t errsz);

/* Runs one batched step. Each sequence may appear once. Returns WK_OK, or WK_EINVAL (a bad
 * sequence, an id outside the vocabulary, or a sequence past max_seq) before any work. */
int eng_step(struct engine *e, const struct eng_item *items, int n, char *err, size_t errsz);

/* ---- snapshots ---- */

struct eng_snap_opts {
	int tp, ep;          /* tensor / expert parallelism: world max(tp, ep) rank files (the
			      * layout rules are at the top of engine/layout.c) */
	const char *dtype;   /* "keep", "bf16", "f32" ("fp8" arrives with the FP8 kernels) */
	bool lz4;            /* compress chunks with lz4 where that saves >= 10% */
	size_t chunk_size;   /* 0: the default */
	bool mtp;            /* the MTP layer too (num_nextn_predict_layers), so that the
			      * snapshot can draft (eng_opts.mtp); default: left out, as
			      * transformers leaves it. Its copies of the embedding and
			      * lm_head are never stored (the model's serve) */
	struct eng_snap_report { /* optional, filled on success: what opening the model found */
		int unused_tensors;    /* eng_info.unused_tensors (stored in the snapshot all the
					* same: the checkpoint's every tensor is) */
		char unused_example[256];
	} *report;
};

/* Writes a snapshot of the Hugging Face model in hf_dir to out_dir: every tensor in the
 * layout this engine's kernels read, per rank, in the format of coldstart/snapshot.h. The
 * model family decides the layout; an unsupported architecture or option is refused by name.
 */
int eng_snapshot(const char *hf_dir, const char *out_dir, const struct eng_snap_opts *o,
		 char *err, size_t errsz);

/* The naive load path, for `wick bench restore`: what a loader does with no snapshot, as the
 * default loaders of the big serving engines do. It maps the Hugging Face safetensors files
 * (MADV_SEQUENTIAL), then tensor by tensor in file order applies the same transform the
 * snapshot applies and copies the result into fresh memory. The result holds each tensor's
 * final bytes, so it can be compared with a restored snapshot. */
struct eng_naive;
int eng_naive_load(const char *hf_dir, const struct eng_snap_opts *o, struct eng_naive **out,
		   char *err, size_t errsz);
size_t eng_naive_count(const struct eng_naive *n);
/* Tensor i's name, bytes and size; returns NULL past the end. */
const char *eng_naive_tensor(const struct eng_naive *n, size_t i, const void **data,
			     uint64_t *nbytes);
/* The rank whose snapshot file holds tensor i (a sharded layout has one name on several
 * ranks), or -1 past the end. */
int eng_naive_rank(const struct eng_naive *n, size_t i);
uint64_t eng_naive_bytes(const struct eng_naive *n);
void eng_naive_free(struct eng_naive *n);

#endif
