/*
 * engine_int.h - engine internals, shared by engine.c and the model families. Nothing
 * outside engine/ includes this.
 */
#ifndef ENGINE_INT_H
#define ENGINE_INT_H

#include <jansson.h>

#include "coldstart/hfmodel.h"
#include "coldstart/snapshot.h"
#include "engine/backend.h"
#include "engine/engine.h"

struct plan;

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
	const struct family *fam;
	void *model; /* the family's state */
	struct eng_info info;
	char arch[128];
	int max_seq_opt;
	int max_seqs;   /* sequences the family holds (1 without step) */
	int *seq_len;   /* [max_seqs] tokens in each sequence's cache */
	bool *seq_used; /* [max_seqs] */
};

extern const struct family fam_llama; /* engine/llama.c */
extern const struct family fam_glm4;  /* engine/glm4.c: Glm4MoeForCausalLM */
extern const struct family fam_glm5;  /* engine/glm5.c: GlmMoeDsaForCausalLM */

/* The family for config.json's architectures[0], or NULL. */
const struct family *eng_family(const char *arch);

/* A snapshot plan under construction (layout.c). */
struct plan {
	struct snap_spec *specs;
	size_t n, cap;
	struct hf_model *hf;
	enum dt_type cast; /* DT_INVALID: keep each tensor's dtype */
};

/* Adds a spec that copies source tensor `name` of hf whole, cast to plan->cast for floating
 * point weights of rank >= 2 when a cast is set. */
int plan_copy(struct plan *p, const char *name, int rank_file, char *err, size_t errsz);

/* The weight tensor `name` of the model, from whichever source it was opened from (rank 0
 * of a snapshot), or NULL. */
const struct st_tensor *eng_tensor(struct engine *e, const char *name);

/* ---- config helpers: each returns WK_OK or WK_EFORMAT naming the field ---- */

/* Reads integer key; absent -> def, or an error when required (def < 0 means required).
 * Values outside [lo, hi] are errors. */
int cfg_int(json_t *cfg, const char *key, long long def, long long lo, long long hi,
	    long long *out, char *err, size_t errsz);
int cfg_real(json_t *cfg, const char *key, double def, double *out, char *err, size_t errsz);
int cfg_bool(json_t *cfg, const char *key, int def, int *out, char *err, size_t errsz);

/* Binds a 2-D weight tensor by name, checking dtype (matmul-capable on the backend) and shape
 * [rows][cols]. */
int eng_weight(struct engine *e, const char *name, int rows, int cols, struct be_weight *w,
	       char *err, size_t errsz);
/* Copies a 1-D tensor of length len (any float dtype) into a new f32 array. */
int eng_vector(struct engine *e, const char *name, int len, float **out, char *err,
	       size_t errsz);

#endif
