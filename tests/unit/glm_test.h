/*
 * glm_test.h - what the GLM families' tests (test_glm.c, test_glm_kernels.c,
 * test_glm_paths.c) share: tiny random checkpoints of both families, written with st_write in
 * the real Hugging Face layout: tensor names and dtypes of GLM-5-FP8 (FP8 E4M3 + 128x128
 * _scale_inv, BF16 norms/router/embeddings, F32 router bias) and GLM-4.5. Dimensions are small
 * but some exceed 128 and are not multiples of it, so FP8 edge blocks are partial. Also the
 * prompt they run (ids), and opening, prefilling and decoding them on the CPU backend. Defined
 * in glm_test.c. The helpers report a failure by failing the Criterion test (cr_assert), never
 * by returning: tests only. Not thread-safe: kv_opt and WICK_GLM_MLA (set_mla) are process-wide.
 */
#ifndef WICK_TEST_GLM_TEST_H
#define WICK_TEST_GLM_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "coldstart/safetensors.h"
#include "common/dtype.h"
#include "engine/engine.h"

/* ---- a tiny checkpoint writer --------------------------------------------------------------- */

#define MAXT 512

struct ckpt {
	struct st_out t[MAXT];
	void *bufs[MAXT];
	char *names[MAXT];
	size_t n, nb;
	uint64_t rng;
};

/* A draw of N(0,1) (approximately: a sum of four uniforms) from c's xorshift state. */
float gauss(struct ckpt *c);

/* A [rows][cols] (cols 0: vector) tensor of values mean + std * N(0,1) in dtype dt; FP8 gets
 * per-128x128-block scales in <name>_scale_inv. */
void tensor(struct ckpt *c, const char *name, enum dt_type dt, int rows, int cols, float mean,
	    float std);

/* A fresh directory under /tmp (to free), and rm -rf of one. */
char *mkdir_tmp(void);
void rm_rf(const char *d);
/* gen_glm --family fam -o DIR args (tests/tools/gen_glm.c, from $WICK_TOOLS) into a new
 * directory, returned (malloc'd). */
char *gen_glm_dir(const char *fam, const char *args);

/* ---- the two tiny models ------------------------------------------------------------------- */

struct g5dims {
	int topk, n_group, topk_group;
	int kvl; /* kv_lora_rank; 0: G5_KVL */
	enum dt_type wdt; /* FP8 or BF16 for the quantizable weights */
	uint64_t seed;
	float bias_std;
};

enum { G5_DIM = 144, G5_H = 3, G5_QL = 40, G5_KVL = 24, G5_NOPE = 12, G5_ROPE = 8, G5_V = 40,
       G5_IH = 2, G5_ID = 16, G5_E = 8, G5_K = 2, G5_MI = 20, G5_I = 48, G5_L = 3,
       G5_VOCAB = 67 };

/* GLM-5 (GlmMoeDsaForCausalLM): 3 layers (1 dense, 2 MoE), all with indexers, + 1 MTP layer. */
void write_glm5(const char *dir, const struct g5dims *d);

enum { G4_DIM = 144, G4_H = 4, G4_KV = 2, G4_HD = 32, G4_E = 8, G4_K = 2, G4_MI = 24,
       G4_I = 40, G4_L = 2, G4_VOCAB = 61 };

/* GLM-4.5 (Glm4MoeForCausalLM): 2 layers (1 dense, 1 MoE), q/k/v bias, qk norm, partial
 * rope 0.5, group-limited routing, + 1 MTP layer. */
void write_glm4(const char *dir, enum dt_type w, int n_group, int topk_group, float bias_std);

/* ---- helpers -------------------------------------------------------------------------------- */

static const int ids[] = {3, 17, 42, 5, 60, 11, 29, 8, 33, 50, 21, 7};
#define NIDS ((int)(sizeof ids / sizeof ids[0]))

/* The KV cache type the helpers open models with (eng_opts.kv_dtype; NULL: auto, f32 for
 * these checkpoints, which name no torch_dtype). */
extern const char *kv_opt;

/* An engine on the CPU backend (2 threads, KV caches of kv_opt) on the model in dir. */
struct engine *open_model(const char *dir);

/* Logits [n][vocab] of a prefill of ids[0..n). */
float *prefill(struct engine *e, int n);

/* max |a - b| / max |b| over one row (both asserted finite). Static inline, not in glm_test.c:
 * cuda_test.c, linked into the same binary, exports a rel of its own. */
static inline double rel(const float *a, const float *b, int n)
{
	double d = 0, m = 0;
	for (int i = 0; i < n; i++) {
		cr_assert(isfinite(a[i]) && isfinite(b[i]));
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return m > 0 ? d / m : d;
}

/* Token-by-token decode of ids[0..n) on e matches ref [n][vocab] at every position. */
void check_decode(struct engine *e, const float *ref, int n, const char *what);

/* WICK_GLM_MLA set to mode ("absorb" or "expand"), or unset (NULL: the engine chooses). */
void set_mla(const char *mode);

#endif
