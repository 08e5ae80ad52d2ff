/*
 * engine_int.h - engine internals, shared by engine.c and the model families. Nothing
 * outside engine/ includes this.
 */
#ifndef ENGINE_INT_H
#define ENGINE_INT_H

#include <jansson.h>

#include "coldstart/hfmodel.h"
#include "engine/backend.h"
#include "engine/engine.h"

/* A model family: how to check a config, load the weights and run a forward pass. */
struct family {
	const char *arch; /* config.json architectures[0] */
	/* Reads the config and binds the weights; stores its state in e->model. */
	int (*load)(struct engine *e, char *err, size_t errsz);
	int (*forward)(struct engine *e, const int *tokens, int n, int pos0, float *logits,
		       bool all, char *err, size_t errsz);
	void (*free)(struct engine *e);
};

struct engine {
	struct hf_model *hf;
	struct tok *tok;
	const struct backend *be;
	void *bctx;
	const struct family *fam;
	void *model; /* the family's state */
	struct eng_info info;
	char arch[128];
	int max_seq_opt;
};

extern const struct family fam_llama; /* engine/llama.c */

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
