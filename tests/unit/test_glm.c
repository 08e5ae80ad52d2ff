/*
 * GLM families (engine/glm*.c) on tiny random checkpoints written here with st_write in the
 * real Hugging Face layout: tensor names and dtypes of GLM-5-FP8 (FP8 E4M3 + 128x128
 * _scale_inv, BF16 norms/router/embeddings, F32 router bias) and GLM-4.5. Dimensions are small
 * but some exceed 128 and are not multiples of it, so FP8 edge blocks are partial.
 *
 * What is checked: incremental decode through the caches equals prefill at every position
 * (both families, FP8 weights, absorbed and expanded MLA); DSA top-k: a top-k that covers
 * every key is dense attention, and value/key vectors of unselected keys do not matter; the
 * router: the correction bias selects but does not weigh, group limiting changes the choice,
 * ties go to the lower index; config refusals; the CLI on these checkpoints.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/safetensors.h"
#include "coldstart/snapshot.h"
#include "common/dtype.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/glm_int.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h" /* cpu_force_scalar */
#include "kernels/cpu/glm_kernels.h"
#include "tests/unit/devsim.h"

/* ---- a tiny checkpoint writer --------------------------------------------------------------- */

#define MAXT 512

struct ckpt {
	struct st_out t[MAXT];
	void *bufs[MAXT];
	char *names[MAXT];
	size_t n, nb;
	uint64_t rng;
};

static float gauss(struct ckpt *c)
{
	float s = 0.0f;
	for (int i = 0; i < 4; i++) {
		c->rng ^= c->rng >> 12;
		c->rng ^= c->rng << 25;
		c->rng ^= c->rng >> 27;
		s += (float)((c->rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1u << 24);
	}
	return (s - 2.0f) * 1.7320508f;
}

static unsigned next_u8(struct ckpt *c)
{
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return (unsigned)((c->rng * 0x2545F4914F6CDD1Dull) >> 56);
}

static void push(struct ckpt *c, const char *name, enum dt_type dt, int rows, int cols,
		 void *data)
{
	cr_assert_lt(c->n, MAXT);
	struct st_out *o = &c->t[c->n];
	c->names[c->n] = strdup(name);
	o->name = c->names[c->n];
	o->dtype = dt;
	o->rank = cols ? 2 : 1;
	o->shape[0] = rows;
	o->shape[1] = cols;
	o->data = data;
	c->bufs[c->nb++] = data;
	c->n++;
}

/* A [rows][cols] (cols 0: vector) tensor of values mean + std * N(0,1) in dtype dt; FP8 gets
 * per-128x128-block scales in <name>_scale_inv. */
static void tensor(struct ckpt *c, const char *name, enum dt_type dt, int rows, int cols,
		   float mean, float std)
{
	size_t n = (size_t)rows * (cols ? cols : 1);
	float *f = malloc(n * sizeof *f);
	for (size_t i = 0; i < n; i++)
		f[i] = mean + std * gauss(c);
	if (dt == DT_F32) {
		push(c, name, dt, rows, cols, f);
		return;
	}
	if (dt == DT_BF16) {
		uint16_t *h = malloc(n * 2);
		for (size_t i = 0; i < n; i++)
			h[i] = dt_f32_to_bf16(f[i]);
		free(f);
		push(c, name, dt, rows, cols, h);
		return;
	}
	cr_assert_eq(dt, DT_F8_E4M3);
	int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
	float *scale = malloc((size_t)sr * sc * sizeof *scale);
	uint8_t *q = malloc(n);
	for (int br = 0; br < sr; br++)
		for (int bc = 0; bc < sc; bc++) {
			float amax = 0.0f;
			for (int r = br * 128; r < rows && r < br * 128 + 128; r++)
				for (int k = bc * 128; k < cols && k < bc * 128 + 128; k++)
					amax = fmaxf(amax, fabsf(f[(size_t)r * cols + k]));
			float s = amax > 0.0f ? amax / 448.0f : 1.0f;
			scale[br * sc + bc] = s;
			for (int r = br * 128; r < rows && r < br * 128 + 128; r++)
				for (int k = bc * 128; k < cols && k < bc * 128 + 128; k++)
					q[(size_t)r * cols + k] = dt_f32_to_e4m3(f[(size_t)r * cols + k] / s);
		}
	free(f);
	push(c, name, DT_F8_E4M3, rows, cols, q);
	char sn[512];
	snprintf(sn, sizeof sn, "%s_scale_inv", name);
	push(c, sn, DT_F32, sr, sc, scale);
}

/* A linear layer [out][in], unit-variance outputs for unit-variance inputs. */
static void linear(struct ckpt *c, const char *name, enum dt_type dt, int out, int in)
{
	tensor(c, name, dt, out, in, 0.0f, 1.0f / sqrtf((float)in));
}

static void norm(struct ckpt *c, const char *name, int dim)
{
	tensor(c, name, DT_BF16, dim, 0, 1.0f, 0.1f);
}

static void ckpt_write(struct ckpt *c, const char *dir, const char *config)
{
	char path[512], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	cr_assert_eq(st_write(path, c->t, c->n, NULL, err, sizeof err), WK_OK, "%s", err);
	snprintf(path, sizeof path, "%s/config.json", dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(config, f);
	fclose(f);
	for (size_t i = 0; i < c->nb; i++)
		free(c->bufs[i]);
	for (size_t i = 0; i < c->n; i++)
		free(c->names[i]);
	c->n = c->nb = 0;
}

static char *mkdir_tmp(void)
{
	char *d = strdup("/tmp/wick-glm-XXXXXX");
	cr_assert_not_null(mkdtemp(d));
	return d;
}

static void rm_rf(const char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
	cr_assert_eq(system(cmd), 0);
}

/* ---- the two tiny models ------------------------------------------------------------------- */

struct g5dims {
	int topk, n_group, topk_group;
	enum dt_type wdt; /* FP8 or BF16 for the quantizable weights */
	uint64_t seed;
	float bias_std;
};

enum { G5_DIM = 144, G5_H = 3, G5_QL = 40, G5_KVL = 24, G5_NOPE = 12, G5_ROPE = 8, G5_V = 40,
       G5_IH = 2, G5_ID = 16, G5_E = 8, G5_K = 2, G5_MI = 20, G5_I = 48, G5_L = 3,
       G5_VOCAB = 67 };

/* GLM-5 (GlmMoeDsaForCausalLM): 3 layers (1 dense, 2 MoE), all with indexers, + 1 MTP layer. */
static void write_glm5(const char *dir, const struct g5dims *d)
{
	struct ckpt c = {.rng = d->seed};
	enum dt_type w = d->wdt;
	char nm[256];
	tensor(&c, "model.embed_tokens.weight", DT_BF16, G5_VOCAB, G5_DIM, 0.0f, 1.0f);
	for (int l = 0; l < G5_L; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
		norm(&c, N("input_layernorm.weight"), G5_DIM);
		norm(&c, N("post_attention_layernorm.weight"), G5_DIM);
		linear(&c, N("self_attn.q_a_proj.weight"), w, G5_QL, G5_DIM);
		norm(&c, N("self_attn.q_a_layernorm.weight"), G5_QL);
		linear(&c, N("self_attn.q_b_proj.weight"), w, G5_H * (G5_NOPE + G5_ROPE), G5_QL);
		linear(&c, N("self_attn.kv_a_proj_with_mqa.weight"), w, G5_KVL + G5_ROPE, G5_DIM);
		norm(&c, N("self_attn.kv_a_layernorm.weight"), G5_KVL);
		linear(&c, N("self_attn.kv_b_proj.weight"), w, G5_H * (G5_NOPE + G5_V), G5_KVL);
		linear(&c, N("self_attn.o_proj.weight"), w, G5_DIM, G5_H * G5_V);
		linear(&c, N("self_attn.indexer.wq_b.weight"), w, G5_IH * G5_ID, G5_QL);
		linear(&c, N("self_attn.indexer.wk.weight"), w, G5_ID, G5_DIM);
		norm(&c, N("self_attn.indexer.k_norm.weight"), G5_ID);
		tensor(&c, N("self_attn.indexer.k_norm.bias"), DT_BF16, G5_ID, 0, 0.0f, 0.1f);
		linear(&c, N("self_attn.indexer.weights_proj.weight"), DT_BF16, G5_IH, G5_DIM);
		if (l == 0) {
			linear(&c, N("mlp.gate_proj.weight"), w, G5_I, G5_DIM);
			linear(&c, N("mlp.up_proj.weight"), w, G5_I, G5_DIM);
			linear(&c, N("mlp.down_proj.weight"), w, G5_DIM, G5_I);
			continue;
		}
		tensor(&c, N("mlp.gate.weight"), DT_BF16, G5_E, G5_DIM, 0.0f, 2.0f / sqrtf(G5_DIM));
		tensor(&c, N("mlp.gate.e_score_correction_bias"), DT_F32, G5_E, 0, 0.0f, d->bias_std);
		for (int e = 0; e < G5_E; e++) {
			char p[200];
			snprintf(p, sizeof p, "mlp.experts.%d.gate_proj.weight", e);
			linear(&c, N(p), w, G5_MI, G5_DIM);
			snprintf(p, sizeof p, "mlp.experts.%d.up_proj.weight", e);
			linear(&c, N(p), w, G5_MI, G5_DIM);
			snprintf(p, sizeof p, "mlp.experts.%d.down_proj.weight", e);
			linear(&c, N(p), w, G5_DIM, G5_MI);
		}
		linear(&c, N("mlp.shared_experts.gate_proj.weight"), w, G5_MI, G5_DIM);
		linear(&c, N("mlp.shared_experts.up_proj.weight"), w, G5_MI, G5_DIM);
		linear(&c, N("mlp.shared_experts.down_proj.weight"), w, G5_DIM, G5_MI);
#undef N
	}
	/* The MTP layer: present in the file, never loaded. */
	snprintf(nm, sizeof nm, "model.layers.%d.eh_proj.weight", G5_L);
	linear(&c, nm, DT_BF16, G5_DIM, 2 * G5_DIM);
	snprintf(nm, sizeof nm, "model.layers.%d.enorm.weight", G5_L);
	norm(&c, nm, G5_DIM);
	norm(&c, "model.norm.weight", G5_DIM);
	linear(&c, "lm_head.weight", DT_BF16, G5_VOCAB, G5_DIM);
	char cfg[4096];
	snprintf(cfg, sizeof cfg,
		 "{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\",\n"
		 " \"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
		 " \"num_key_value_heads\": %d, \"q_lora_rank\": %d, \"kv_lora_rank\": %d,\n"
		 " \"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, \"qk_head_dim\": %d,\n"
		 " \"v_head_dim\": %d, \"head_dim\": %d, \"rope_interleave\": true,\n"
		 " \"indexer_rope_interleave\": true, \"index_n_heads\": %d, \"index_head_dim\": %d,\n"
		 " \"index_topk\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d,\n"
		 " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"n_routed_experts\": %d,\n"
		 " \"n_shared_experts\": 1, \"num_experts_per_tok\": %d, \"n_group\": %d,\n"
		 " \"topk_group\": %d, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true,\n"
		 " \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\",\n"
		 " \"num_nextn_predict_layers\": 1, \"rms_norm_eps\": 1e-05,\n"
		 " \"rope_parameters\": {\"rope_theta\": 1000000, \"rope_type\": \"default\"},\n"
		 " \"attention_bias\": false, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\",\n"
		 " \"max_position_embeddings\": 64, \"vocab_size\": %d, \"bos_token_id\": 0,\n"
		 " \"eos_token_id\": [1, 2], \"pad_token_id\": 1, \"dtype\": \"bfloat16\",\n"
		 " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\",\n"
		 "   \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}\n",
		 G5_DIM, G5_L, G5_H, G5_H, G5_QL, G5_KVL, G5_NOPE, G5_ROPE, G5_NOPE + G5_ROPE, G5_V,
		 G5_ROPE, G5_IH, G5_ID, d->topk, G5_I, G5_MI, G5_E, G5_K, d->n_group, d->topk_group,
		 G5_VOCAB);
	ckpt_write(&c, dir, cfg);
}

enum { G4_DIM = 144, G4_H = 4, G4_KV = 2, G4_HD = 32, G4_E = 8, G4_K = 2, G4_MI = 24,
       G4_I = 40, G4_L = 2, G4_VOCAB = 61 };

/* GLM-4.5 (Glm4MoeForCausalLM): 2 layers (1 dense, 1 MoE), q/k/v bias, qk norm, partial
 * rope 0.5, group-limited routing, + 1 MTP layer. */
static void write_glm4(const char *dir, enum dt_type w, int n_group, int topk_group,
		       float bias_std)
{
	struct ckpt c = {.rng = 77};
	char nm[256];
	tensor(&c, "model.embed_tokens.weight", DT_BF16, G4_VOCAB, G4_DIM, 0.0f, 1.0f);
	for (int l = 0; l < G4_L; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
		norm(&c, N("input_layernorm.weight"), G4_DIM);
		norm(&c, N("post_attention_layernorm.weight"), G4_DIM);
		linear(&c, N("self_attn.q_proj.weight"), w, G4_H * G4_HD, G4_DIM);
		tensor(&c, N("self_attn.q_proj.bias"), DT_BF16, G4_H * G4_HD, 0, 0.0f, 0.2f);
		linear(&c, N("self_attn.k_proj.weight"), w, G4_KV * G4_HD, G4_DIM);
		tensor(&c, N("self_attn.k_proj.bias"), DT_BF16, G4_KV * G4_HD, 0, 0.0f, 0.2f);
		linear(&c, N("self_attn.v_proj.weight"), w, G4_KV * G4_HD, G4_DIM);
		tensor(&c, N("self_attn.v_proj.bias"), DT_BF16, G4_KV * G4_HD, 0, 0.0f, 0.2f);
		linear(&c, N("self_attn.o_proj.weight"), w, G4_DIM, G4_H * G4_HD);
		norm(&c, N("self_attn.q_norm.weight"), G4_HD);
		norm(&c, N("self_attn.k_norm.weight"), G4_HD);
		if (l == 0) {
			linear(&c, N("mlp.gate_proj.weight"), w, G4_I, G4_DIM);
			linear(&c, N("mlp.up_proj.weight"), w, G4_I, G4_DIM);
			linear(&c, N("mlp.down_proj.weight"), w, G4_DIM, G4_I);
			continue;
		}
		tensor(&c, N("mlp.gate.weight"), DT_F32, G4_E, G4_DIM, 0.0f, 2.0f / sqrtf(G4_DIM));
		tensor(&c, N("mlp.gate.e_score_correction_bias"), DT_F32, G4_E, 0, 0.0f, bias_std);
		for (int e = 0; e < G4_E; e++) {
			char p[200];
			snprintf(p, sizeof p, "mlp.experts.%d.gate_proj.weight", e);
			linear(&c, N(p), w, G4_MI, G4_DIM);
			snprintf(p, sizeof p, "mlp.experts.%d.up_proj.weight", e);
			linear(&c, N(p), w, G4_MI, G4_DIM);
			snprintf(p, sizeof p, "mlp.experts.%d.down_proj.weight", e);
			linear(&c, N(p), w, G4_DIM, G4_MI);
		}
		linear(&c, N("mlp.shared_experts.gate_proj.weight"), w, G4_MI, G4_DIM);
		linear(&c, N("mlp.shared_experts.up_proj.weight"), w, G4_MI, G4_DIM);
		linear(&c, N("mlp.shared_experts.down_proj.weight"), w, G4_DIM, G4_MI);
#undef N
	}
	snprintf(nm, sizeof nm, "model.layers.%d.eh_proj.weight", G4_L);
	linear(&c, nm, DT_BF16, G4_DIM, 2 * G4_DIM);
	norm(&c, "model.norm.weight", G4_DIM);
	linear(&c, "lm_head.weight", DT_BF16, G4_VOCAB, G4_DIM);
	char cfg[4096];
	snprintf(cfg, sizeof cfg,
		 "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\",\n"
		 " \"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
		 " \"num_key_value_heads\": %d, \"head_dim\": %d, \"partial_rotary_factor\": 0.5,\n"
		 " \"rope_theta\": 1000000, \"rope_scaling\": null, \"attention_bias\": true,\n"
		 " \"use_qk_norm\": true, \"intermediate_size\": %d, \"moe_intermediate_size\": %d,\n"
		 " \"first_k_dense_replace\": 1, \"n_routed_experts\": %d, \"n_shared_experts\": 1,\n"
		 " \"num_experts_per_tok\": %d, \"n_group\": %d, \"topk_group\": %d,\n"
		 " \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true,\n"
		 " \"num_nextn_predict_layers\": 1, \"rms_norm_eps\": 1e-05,\n"
		 " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\",\n"
		 " \"max_position_embeddings\": 64, \"vocab_size\": %d, \"eos_token_id\": [1, 2],\n"
		 " \"pad_token_id\": 1}\n",
		 G4_DIM, G4_L, G4_H, G4_KV, G4_HD, G4_I, G4_MI, G4_E, G4_K, n_group, topk_group,
		 G4_VOCAB);
	ckpt_write(&c, dir, cfg);
}

/* ---- helpers -------------------------------------------------------------------------------- */

static const int ids[] = {3, 17, 42, 5, 60, 11, 29, 8, 33, 50, 21, 7};
#define NIDS ((int)(sizeof ids / sizeof ids[0]))

/* The KV cache type the helpers open models with (eng_opts.kv_dtype; NULL: auto, f32 for
 * these checkpoints, which name no torch_dtype). */
static const char *kv_opt;

static struct engine *open_model(const char *dir)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .kv_dtype = kv_opt};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	return e;
}

/* Logits [n][vocab] of a prefill of ids[0..n). */
static float *prefill(struct engine *e, int n)
{
	int V = eng_info(e)->vocab;
	char err[WK_ERRSZ];
	float *all = malloc(sizeof(float) * n * V);
	cr_assert_eq(eng_forward(e, ids, n, 0, all, true, err, sizeof err), WK_OK, "%s", err);
	return all;
}

/* max |a - b| / max |b| over one row */
static double rel(const float *a, const float *b, int n)
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
static void check_decode(struct engine *e, const float *ref, int n, const char *what)
{
	int V = eng_info(e)->vocab;
	char err[WK_ERRSZ];
	float *one = malloc(sizeof(float) * V);
	double worst = 0;
	for (int i = 0; i < n; i++) {
		cr_assert_eq(eng_forward(e, ids + i, 1, i, one, false, err, sizeof err), WK_OK, "%s",
			     err);
		worst = fmax(worst, rel(one, ref + (size_t)i * V, V));
	}
	cr_log_info("%s: decode vs prefill, worst relative difference %g", what, worst);
	cr_expect_leq(worst, 1e-4, "%s: decode vs prefill differ by %g (relative)", what, worst);
	free(one);
}

static void set_mla(const char *mode)
{
	if (mode)
		setenv("WICK_GLM_MLA", mode, 1);
	else
		unsetenv("WICK_GLM_MLA");
}

TestSuite(glm);

/* ---- (2) incremental decode == prefill ------------------------------------------------------ */

Test(glm, glm5_fp8_decode_matches_prefill)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 1234, .bias_std = 0.1f};
	write_glm5(dir, &d);
	int n = NIDS;
	/* The reference: prefill with kv_b_proj expanded over every position. */
	set_mla("expand");
	struct engine *e = open_model(dir);
	const struct eng_info *in = eng_info(e);
	cr_assert_eq(in->vocab, G5_VOCAB);
	cr_assert_eq(in->max_seq, 64);
	cr_assert_eq(in->mtp_layers_skipped, 1);
	cr_assert_eq(in->bos, 0);
	cr_assert_eq(in->eos, 1);
	float *ref = prefill(e, n);
	check_decode(e, ref, n, "expanded decode");
	struct glm5_debug dbg;
	cr_assert_eq(glm5_debug(e, &dbg), WK_OK);
	cr_assert(dbg.sparse, "index_topk 4 < %d positions: the indexer must be selecting", n);
	eng_close(e);

	/* Absorbed decode (the production decode path) and absorbed prefill. */
	set_mla("absorb");
	e = open_model(dir);
	check_decode(e, ref, n, "absorbed decode");
	float *ab = prefill(e, n);
	for (int i = 0; i < n; i++)
		cr_expect_leq(rel(ab + (size_t)i * G5_VOCAB, ref + (size_t)i * G5_VOCAB, G5_VOCAB),
			      1e-4, "absorbed prefill, position %d", i);
	eng_close(e);

	/* The default choice, with a prefill split in chunks (pos0 > 0 in the middle). */
	set_mla(NULL);
	e = open_model(dir);
	char err[WK_ERRSZ];
	float *chunk = malloc(sizeof(float) * n * G5_VOCAB);
	cr_assert_eq(eng_forward(e, ids, 5, 0, chunk, true, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, ids + 5, n - 5, 5, chunk + 5 * G5_VOCAB, true, err, sizeof err),
		     WK_OK, "%s", err);
	for (int i = 0; i < n; i++)
		cr_expect_leq(rel(chunk + (size_t)i * G5_VOCAB, ref + (size_t)i * G5_VOCAB, G5_VOCAB),
			      1e-4, "chunked prefill, position %d", i);
	eng_close(e);
	free(chunk);
	free(ab);
	free(ref);
	rm_rf(dir);
	free(dir);
}

Test(glm, glm4_decode_matches_prefill)
{
	enum dt_type dts[] = {DT_BF16, DT_F8_E4M3};
	for (int k = 0; k < 2; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, dts[k], 4, 2, 0.1f);
		struct engine *e = open_model(dir);
		cr_assert_eq(eng_info(e)->vocab, G4_VOCAB);
		cr_assert_eq(eng_info(e)->mtp_layers_skipped, 1);
		cr_assert_eq(eng_info(e)->unused_tensors, 0, "%s", eng_info(e)->unused_example);
		/* every id of the eos_token_id list ends a generation (GLM's <|user|> too), and
		 * nothing else does (no bos_token_id here) */
		const struct eng_info *in = eng_info(e);
		cr_assert(in->n_stop == 2 && eng_is_stop(in, 1) && eng_is_stop(in, 2) &&
				  !eng_is_stop(in, 0) && !eng_is_stop(in, 3),
			  "stop ids: %d", in->n_stop);
		float *ref = prefill(e, NIDS);
		check_decode(e, ref, NIDS, dts[k] == DT_BF16 ? "glm4 bf16" : "glm4 fp8");
		eng_close(e);
		free(ref);
		rm_rf(dir);
		free(dir);
	}
}

/* Weights the config turns off are reported, not silently dropped: GLM-4.5's q/k/v biases
 * under attention_bias false (transformers warns of unused weights the same way). */
Test(glm, unused_tensors_reported)
{
	char *dir = mkdir_tmp(), path[600], *text;
	size_t len;
	char err[WK_ERRSZ];
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	snprintf(path, sizeof path, "%s/config.json", dir);
	cr_assert_eq(wk_read_file(path, 1 << 20, &text, &len, err, sizeof err), WK_OK, "%s", err);
	char *at = strstr(text, "\"attention_bias\": true");
	cr_assert_not_null(at);
	size_t head = (size_t)(at - text) + strlen("\"attention_bias\": ");
	FILE *f = fopen(path, "w");
	cr_assert(f && fwrite(text, 1, head, f) == head && fputs("false", f) >= 0 &&
		  fputs(text + head + 4, f) >= 0 && fclose(f) == 0);
	free(text);
	struct engine *e = open_model(dir);
	const struct eng_info *in = eng_info(e);
	cr_expect_eq(in->unused_tensors, 3 * G4_L, "%d", in->unused_tensors);
	cr_expect(in->unused_example && wk_ends_with(in->unused_example, "_proj.bias"), "%s",
		  in->unused_example ? in->unused_example : "(none)");
	eng_close(e);
	rm_rf(dir);
	free(dir);
}

/* Continuous batching: three sequences stepped together (prefills of different lengths mixed
 * with decodes; MLA absorbed (at these sizes, auto absorbs prefills too; "expand" forced by
 * WICK_GLM_MLA elsewhere); the DSA indexer selecting in one segment and dense in another;
 * then all three decoding: GLM-5's latent attention one op over the three sequences'
 * caches, all selecting or, with a wide index_topk, all dense, as every step of that run)
 * give the logits each gets alone. */
static void check_batched(const char *dir, int V, const char *what)
{
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seqs = 3, .kv_dtype = kv_opt};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_info(e)->max_seqs, 3, "%s: the family must batch", what);
	/* prompts: ids[0..7), ids[2..4), ids[4..9); then each decodes three tokens */
	const int *p[3] = {ids, ids + 2, ids + 4};
	int len[3] = {7, 2, 5}, dec[3] = {9, 13, 17};
	float *want = malloc(sizeof(float) * 3 * 4 * V), *got = malloc(sizeof(float) * 3 * 4 * V);
	cr_assert(want && got);
#define W(s, k) (want + ((size_t)(s) * 4 + (k)) * V)
#define G(s, k) (got + ((size_t)(s) * 4 + (k)) * V)
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(eng_forward(e, p[s], len[s], 0, W(s, 0), false, err, sizeof err), WK_OK,
			     "%s", err);
		for (int k = 0; k < 3; k++)
			cr_assert_eq(eng_forward(e, &dec[k], 1, len[s] + k, W(s, k + 1), false, err,
						 sizeof err), WK_OK, "%s", err);
	}
	eng_seq_free(e, 0);
	int seq[3];
	for (int s = 0; s < 3; s++)
		cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
	/* step 1: 0 and 1 prefill; step 2: 2 prefills while 0 and 1 decode; step 3: all decode;
	 * step 4: 2 decodes alone */
	struct eng_item s1[2] = {{seq[0], p[0], len[0], G(0, 0), NULL, {}}, {seq[1], p[1], len[1], G(1, 0), NULL, {}}};
	cr_assert_eq(eng_step(e, s1, 2, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s2[3] = {{seq[2], p[2], len[2], G(2, 0), NULL, {}}, {seq[0], &dec[0], 1, G(0, 1), NULL, {}},
				 {seq[1], &dec[0], 1, G(1, 1), NULL, {}}};
	cr_assert_eq(eng_step(e, s2, 3, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s3[3] = {{seq[1], &dec[1], 1, G(1, 2), NULL, {}}, {seq[2], &dec[0], 1, G(2, 1), NULL, {}},
				 {seq[0], &dec[1], 1, G(0, 2), NULL, {}}};
	cr_assert_eq(eng_step(e, s3, 3, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s4 = {seq[2], &dec[1], 1, G(2, 2), NULL, {}};
	cr_assert_eq(eng_step(e, &s4, 1, err, sizeof err), WK_OK, "%s", err);
	/* step 5: all three decode (sequences 2, 0 and 1, at positions 7, 9 and 4) */
	struct eng_item s5[3] = {{seq[2], &dec[2], 1, G(2, 3), NULL, {}},
				 {seq[0], &dec[2], 1, G(0, 3), NULL, {}},
				 {seq[1], &dec[2], 1, G(1, 3), NULL, {}}};
	cr_assert_eq(eng_step(e, s5, 3, err, sizeof err), WK_OK, "%s", err);
	double worst = 0;
	for (int s = 0; s < 3; s++)
		for (int k = 0; k < 4; k++) {
			double r = rel(G(s, k), W(s, k), V);
			cr_expect_leq(r, 1e-4, "%s: sequence %d, logits %d: batched vs alone %g", what,
				      s, k, r);
			worst = r > worst ? r : worst;
		}
	fprintf(stderr, "glm batched: %s: worst relative difference %.2g\n", what, worst);
#undef W
#undef G
	free(want);
	free(got);
	eng_close(e);
}

Test(glm, batched_sequences_match_single)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 99, .bias_std = 0.1f};
	write_glm5(dir, &d);
	set_mla(NULL);
	check_batched(dir, G5_VOCAB, "glm5 fp8, index_topk 4");
	set_mla("absorb");
	check_batched(dir, G5_VOCAB, "glm5 fp8, absorbed");
	set_mla(NULL);
	rm_rf(dir);
	free(dir);
	/* BF16: kv_a_proj_with_mqa bound as two weights, c_kv and k_pe written straight into the
	 * caches for one sequence, through the step's rows for several */
	dir = mkdir_tmp();
	d.wdt = DT_BF16;
	write_glm5(dir, &d);
	check_batched(dir, G5_VOCAB, "glm5 bf16, index_topk 4");
	rm_rf(dir);
	free(dir);
	/* every query dense (index_topk past every sequence's length) */
	dir = mkdir_tmp();
	d.topk = 64;
	write_glm5(dir, &d);
	check_batched(dir, G5_VOCAB, "glm5 bf16, index_topk 64");
	d.topk = 4;
	rm_rf(dir);
	free(dir);
	dir = mkdir_tmp();
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	check_batched(dir, G4_VOCAB, "glm4 bf16");
	rm_rf(dir);
	free(dir);
}

/* The GLM families on a device backend's memory: through devsim (devsim.h) every weight,
 * vector, cache and activation is memory the host cannot touch outside the backend's ops and
 * copies (a stray host access is a SIGSEGV, a host pointer handed to an op a failure), and
 * the logits are bit for bit the CPU backend's: a prefill of every position, decode steps,
 * and batched steps of two sequences (a prefill beside a decode). Also without the grouped
 * MoE op (the experts one by one, gathered and scattered): the same within float rounding
 * (the experts' outputs are summed in another order). This is the engine side of GLM on
 * CUDA. */
static void check_devsim(const char *dir, int V, const char *what)
{
	enum { NE = 3 }; /* cpu, devsim, devsim without grouped MoE */
	const struct backend *bes[NE] = {NULL, &be_devsim, &be_devsim_ungrouped};
	char err[WK_ERRSZ];
	struct engine *e[NE];
	float *lg[NE];
	for (int k = 0; k < NE; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seqs = 2,
				     .backend_ops = bes[k], .kv_dtype = kv_opt};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s: %s", what, err);
		lg[k] = malloc(sizeof(float) * NIDS * V);
		cr_assert_not_null(lg[k]);
	}
	cr_assert_str_eq(eng_info(e[1])->backend, "devsim");
	/* compares the first rows * V logits of every engine with the CPU's */
#define SAME(rows, ...)                                                                      \
	do {                                                                                  \
		cr_expect_eq(memcmp(lg[0], lg[1], sizeof(float) * (rows) * V), 0, __VA_ARGS__); \
		for (int r_ = 0; r_ < (rows); r_++)                                           \
			cr_expect_leq(rel(lg[2] + (size_t)r_ * V, lg[0] + (size_t)r_ * V, V),  \
				      1e-5, __VA_ARGS__);                                     \
	} while (0)
	for (int k = 0; k < NE; k++)
		cr_assert_eq(eng_forward(e[k], ids, NIDS, 0, lg[k], true, err, sizeof err), WK_OK,
			     "%s: %s", what, err);
	SAME(NIDS, "%s: prefill logits differ on devsim", what);
	for (int i = 0; i < 3; i++) {
		for (int k = 0; k < NE; k++)
			cr_assert_eq(eng_forward(e[k], ids + i, 1, NIDS + i, lg[k], false, err,
						 sizeof err), WK_OK, "%s: %s", what, err);
		SAME(1, "%s: decode step %d differs on devsim", what, i);
	}
	/* sequence 0 decodes on while sequence 1 prefills, then both decode */
	for (int k = 0; k < NE; k++) {
		int s1;
		cr_assert_eq(eng_seq_alloc(e[k], &s1), WK_OK);
		struct eng_item a[2] = {{0, ids + 3, 1, lg[k], NULL, {}}, {s1, ids, 6, lg[k] + V, NULL, {}}};
		cr_assert_eq(eng_step(e[k], a, 2, err, sizeof err), WK_OK, "%s: %s", what, err);
		struct eng_item b[2] = {{s1, ids + 6, 1, lg[k] + 2 * V, NULL, {}}, {0, ids + 4, 1, lg[k] + 3 * V, NULL, {}}};
		cr_assert_eq(eng_step(e[k], b, 2, err, sizeof err), WK_OK, "%s: %s", what, err);
	}
	SAME(4, "%s: batched steps differ on devsim", what);
#undef SAME
	struct devsim_counts n[2];
	devsim_counts(e[1]->bctx, &n[0]);
	devsim_counts(e[2]->bctx, &n[1]);
	cr_expect_gt(n[0].ops, 100, "%s: only %d ops ran on devsim", what, n[0].ops);
	/* from a snapshot the weights stream into devsim's memory and are used where they land;
	 * from a checkpoint they are uploaded one by one */
	bool snap = snap_is_snapshot(dir);
	cr_expect_eq(eng_info(e[1])->startup.to_device, snap, "%s", what);
	cr_expect(snap ? n[0].uploads == 0 && n[0].stage_puts > 0 : n[0].uploads > 0,
		  "%s: %d uploads, %d staged copies", what, n[0].uploads, n[0].stage_puts);
	cr_expect_gt(n[1].ops, n[0].ops, "%s: the experts one by one took no more ops (%d, %d)",
		     what, n[1].ops, n[0].ops);
	cr_log_info("%s on devsim: %d ops, %d copies, %d regions; experts one by one: %d ops, "
		    "%d copies", what, n[0].ops, n[0].copies, n[0].regions, n[1].ops, n[1].copies);
	for (int k = 0; k < NE; k++) {
		eng_close(e[k]);
		free(lg[k]);
	}
}

Test(glm, device_memory_only_through_the_backend)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 2, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	write_glm5(dir, &d);
	set_mla("expand");
	check_devsim(dir, G5_VOCAB, "glm5 fp8, expanded");
	set_mla("absorb");
	check_devsim(dir, G5_VOCAB, "glm5 fp8, absorbed");
	set_mla(NULL);
	/* a snapshot restored straight into devsim's memory (lz4, small chunks) */
	char *sd = mkdir_tmp(), out[600], err[WK_ERRSZ];
	snprintf(out, sizeof out, "%s/s", sd);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .lz4 = true, .chunk_size = 64 << 10};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	check_devsim(out, G5_VOCAB, "glm5 fp8 snapshot, streamed");
	rm_rf(sd);
	free(sd);
	rm_rf(dir);
	free(dir);
	enum dt_type dts[] = {DT_BF16, DT_F8_E4M3};
	for (int k = 0; k < 2; k++) {
		dir = mkdir_tmp();
		write_glm4(dir, dts[k], 4, 2, 0.1f);
		check_devsim(dir, G4_VOCAB, dts[k] == DT_BF16 ? "glm4 bf16" : "glm4 fp8");
		rm_rf(dir);
		free(dir);
	}
}

/* ---- (3) DSA ------------------------------------------------------------------------------- */

/* index_topk >= the sequence: the indexer selects every causal key, i.e. dense attention.
 * Model level: index_topk = the prompt length gives the same logits as an index_topk no
 * prompt reaches. Kernel level: the top-k of a query with <= topk keys is all of them, and
 * attention restricted to that selection is bit-identical to dense causal attention. */
Test(glm, dsa_full_topk_is_dense)
{
	/* Three models with the same weights: index_topk 4 (sparse from the fifth position on),
	 * the prompt length (every query keeps all its keys), and one no prompt reaches. */
	int n = NIDS;
	float *out[3];
	int topks[3] = {4, NIDS, 1 << 20};
	set_mla("expand"); /* the same attention path for all three */
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		struct g5dims d = {.topk = topks[k], .n_group = 1, .topk_group = 1,
				   .wdt = DT_F8_E4M3, .seed = 99, .bias_std = 0.1f};
		write_glm5(dir, &d);
		struct engine *e = open_model(dir);
		out[k] = prefill(e, n);
		eng_close(e);
		rm_rf(dir);
		free(dir);
	}
	set_mla(NULL);
	size_t V = G5_VOCAB;
	cr_expect_eq(memcmp(out[1], out[2], sizeof(float) * n * V), 0);
	/* With index_topk 4 the first four queries go through the indexer's selection, which
	 * keeps all of their keys: exactly dense. Later ones attend to 4 of their keys. */
	for (int i = 0; i < 4; i++) /* not bitwise: the MoE batches other tokens differently */
		cr_expect_leq(rel(out[0] + i * V, out[2] + i * V, (int)V), 1e-6, "position %d: %g", i,
			      rel(out[0] + i * V, out[2] + i * V, (int)V));
	cr_expect_gt(rel(out[0] + (n - 1) * V, out[2] + (n - 1) * V, (int)V), 1e-4,
		     "index_topk 4 changed nothing at position %d", n - 1);
	for (int k = 0; k < 3; k++)
		free(out[k]);

	/* Kernels: a random MLA problem of 9 queries, 3 heads, 20 cached positions. */
	enum { T = 20, NQ = 9, P0 = T - NQ, H = 3, DA = 6, DB = 4, DV = 5, IH = 2, ID = 8 };
	struct ckpt r = {.rng = 5};
	float q[NQ * H * (DA + DB)], ka[T * H * DA], kb[T * DB], v[T * H * DV];
	float iq[NQ * IH * ID], ik[T * ID], iw[NQ * IH], scores[T];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r);
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof v / 4; i++) v[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	int sel[NQ * T], nsel[NQ];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ik, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = T,
			     .qk_scale = 0.3f, .w_scale = 0.7f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	for (int i = 0; i < NQ; i++) {
		cr_assert_eq(nsel[i], P0 + i + 1);
		for (int j = 0; j < nsel[i]; j++)
			cr_assert_eq(sel[i * T + j], j);
	}
	struct cpu_mla s = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb,
			    .v = v, .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB,
			    .v_stride = H * DV, .v_head = DV, .sel = sel, .nsel = nsel,
			    .sel_stride = T, .scale = 0.4f};
	float o1[NQ * H * DV], o2[NQ * H * DV];
	cpu_ref_mla_attention(o1, q, &s, NQ, P0, 0, NQ, 0, H);
	s.sel = NULL;
	cpu_ref_mla_attention(o2, q, &s, NQ, P0, 0, NQ, 0, H);
	cr_expect_eq(memcmp(o1, o2, sizeof o1), 0);
	/* The pooled backend op agrees with the reference (to rounding: it may be the AVX2
	 * version). */
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config bc = {.threads = 3};
	cr_assert_eq(be_cpu.init(&ctx, &bc, err, sizeof err), WK_OK);
	struct be_mla bs = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb,
			    .v = v, .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB,
			    .v_stride = H * DV, .v_head = DV, .sel = NULL, .nsel = nsel,
			    .sel_stride = T, .scale = 0.4f};
	be_cpu.mla_attention(ctx, o1, q, &bs, NQ, P0); /* AVX2 when the CPU has it */
	cr_expect_leq(rel(o1, o2, NQ * H * DV), 1e-5);
	be_cpu.shutdown(ctx);
}

/* Element i of a KV cache of type t (f32 or bf16) set to v. */
static void put_kv(void *c, enum dt_type t, size_t i, float v)
{
	if (t == DT_BF16)
		((uint16_t *)c)[i] = dt_f32_to_bf16(v);
	else
		((float *)c)[i] = v;
}

/* A small index_topk: the keys (c_kv) and values of positions the indexer did not select can
 * be anything. After a prefill, the last layer's compressed cache rows that the final
 * query's selection left out are overwritten with garbage and the final step re-run: its
 * logits do not change (both MLA paths). Garbage in one selected row does change them. */
Test(glm, dsa_unselected_keys_do_not_matter)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 3, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 4321, .bias_std = 0.1f};
	write_glm5(dir, &d);
	const char *modes[] = {"absorb", "expand"};
	int n = NIDS, last = n - 1;
	for (int k = 0; k < 2; k++) {
		set_mla(modes[k]);
		struct engine *e = open_model(dir);
		char err[WK_ERRSZ];
		float *base = malloc(sizeof(float) * G5_VOCAB), *again = malloc(sizeof(float) * G5_VOCAB);
		float *pre = malloc(sizeof(float) * n * G5_VOCAB);
		cr_assert_eq(eng_forward(e, ids, last, 0, pre, true, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, base, false, err, sizeof err), WK_OK);
		struct glm5_debug g;
		cr_assert_eq(glm5_debug(e, &g), WK_OK);
		cr_assert(g.sparse);
		cr_assert_eq(g.nsel[0], 3);
		bool chosen[64] = {false};
		for (int j = 0; j < g.nsel[0]; j++)
			chosen[g.sel[j]] = true;
		int dropped = 0, kept = -1;
		for (int t = 0; t < last; t++) {
			if (chosen[t]) {
				kept = t;
				continue;
			}
			dropped++;
			for (int c = 0; c < g.lora; c++)
				put_kv(g.ckv, g.kv, (size_t)t * g.lora + c,
				       1e3f * (float)(c + t) - 7.0f);
			for (int c = 0; c < g.rope; c++)
				put_kv(g.kpe, g.kv, (size_t)t * g.rope + c, -5e2f * (float)(c + 1));
		}
		cr_assert_geq(dropped, n - 1 - 3);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, again, false, err, sizeof err), WK_OK);
		cr_expect_eq(memcmp(base, again, sizeof(float) * G5_VOCAB), 0,
			     "%s: unselected cache rows changed the output", modes[k]);
		/* Sanity: the same garbage in a selected row (not the query's own) matters. */
		cr_assert_geq(kept, 0, "the selection holds only the query itself");
		for (int c = 0; c < g.lora; c++)
			put_kv(g.ckv, g.kv, (size_t)kept * g.lora + c,
			       3.0f * (float)(c % 5) - 6.0f);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, again, false, err, sizeof err), WK_OK);
		cr_expect_gt(rel(again, base, G5_VOCAB), 1e-3, "%s: a selected row did not matter",
			     modes[k]);
		free(base);
		free(again);
		free(pre);
		eng_close(e);
	}
	set_mla(NULL);
	rm_rf(dir);
	free(dir);
}

/* Exact top-k with deterministic ties: equal scores go to the lower position. */
Test(glm, dsa_topk_ties)
{
	float scores[8] = {1, 3, 2, 3, 3, 0, 2, NAN};
	int sel[8], nsel;
	char work[64];
	cpu_ref_dsa_select(sel, &nsel, scores, 8, 4, work);
	cr_assert_eq(nsel, 4);
	int want[4] = {1, 2, 3, 4}; /* 3, 3, 3 at 1, 3, 4; then 2 at 2 (not 6) */
	for (int j = 0; j < 4; j++)
		cr_expect_eq(sel[j], want[j], "sel[%d] = %d", j, sel[j]);
}

/* The AVX2 absorption kernels against the reference: FP8 (heads crossing 128-row blocks,
 * lora past the row buffer and not a multiple of 8) and BF16. */
Test(glm, absorb_avx2_matches_ref)
{
	if (!cpu_has_avx2())
		cr_skip_test("no AVX2");
	enum { H = 3, NOPE = 70, ROPE = 6, DV = 50, LORA = 1100, N = 3 };
	int rows = H * (NOPE + DV);
	struct ckpt c = {.rng = 3};
	tensor(&c, "w8", DT_F8_E4M3, rows, LORA, 0.0f, 0.1f);
	tensor(&c, "w16", DT_BF16, rows, LORA, 0.0f, 0.1f);
	float *q = malloc(sizeof(float) * N * H * (NOPE + ROPE));
	float *lat = malloc(sizeof(float) * N * H * LORA);
	for (int i = 0; i < N * H * (NOPE + ROPE); i++) q[i] = gauss(&c);
	for (int i = 0; i < N * H * LORA; i++) lat[i] = gauss(&c);
	size_t qa = sizeof(float) * N * H * (LORA + ROPE);
	float *a = malloc(qa), *b = malloc(qa);
	for (int k = 0; k < 2; k++) {
		const struct st_out *w = &c.t[k == 0 ? 0 : 2];
		const float *sc = k == 0 ? c.t[1].data : NULL;
		cpu_ref_mla_absorb_q(a, q, w->data, w->dtype, sc, LORA, N, H, NOPE, ROPE, DV, 0, H);
		cpu_mla_absorb_q_avx2(b, q, w->data, w->dtype, sc, LORA, N, H, NOPE, ROPE, DV, 0, H);
		cr_expect_leq(rel(b, a, N * H * (LORA + ROPE)), 1e-5, "absorb_q %s", dt_name(w->dtype));
		cpu_ref_mla_absorb_out(a, lat, w->data, w->dtype, sc, LORA, N, H, NOPE, DV, 0, H);
		cpu_mla_absorb_out_avx2(b, lat, w->data, w->dtype, sc, LORA, N, H, NOPE, DV, 0, H);
		cr_expect_leq(rel(b, a, N * H * DV), 1e-5, "absorb_out %s", dt_name(w->dtype));
	}
	free(q);
	free(lat);
	free(a);
	free(b);
	for (size_t i = 0; i < c.nb; i++)
		free(c.bufs[i]);
	for (size_t i = 0; i < c.n; i++)
		free(c.names[i]);
}

/* The AVX2 MLA attention (one pass, online softmax) and indexer score against the
 * references, with a selection and dense, in both the expanded and the absorbed layouts. */
Test(glm, attention_avx2_matches_ref)
{
	if (!cpu_has_avx2())
		cr_skip_test("no AVX2");
	enum { T = 40, NQ = 7, P0 = T - NQ, H = 4, DA = 37, DB = 10, DV = 29, IH = 3, ID = 21,
	       TOPK = 9 };
	struct ckpt r = {.rng = 17};
	static float q[NQ * H * (DA + DB)], ka[T * H * DA], kb[T * DB], v[T * H * DV];
	static float iq[NQ * IH * ID], ik[T * ID], iw[NQ * IH];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r);
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof v / 4; i++) v[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	for (int i = 0; i < NQ; i++)
		for (int t = 0; t < T; t++) {
			float a = cpu_ref_dsa_score(iq + i * IH * ID, ik + t * ID, DT_F32, NULL,
						    iw + i * IH, IH, ID, 0.2f, 0.6f);
			float b = cpu_dsa_score_avx2(iq + i * IH * ID, ik + t * ID, DT_F32, NULL,
						     iw + i * IH, IH, ID, 0.2f, 0.6f);
			cr_expect_leq(fabsf(a - b), 1e-5f * (1.0f + fabsf(a)), "score %d %d", i, t);
		}
	int sel[NQ * TOPK], nsel[NQ];
	float scores[T];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ik, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = TOPK,
			     .qk_scale = 0.2f, .w_scale = 0.6f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	/* expanded layout: per-head keys; absorbed: one key and value for all heads */
	struct cpu_mla lay[2] = {
		{.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb, .v = v,
		 .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB, .v_stride = H * DV,
		 .v_head = DV, .sel_stride = TOPK, .scale = 0.3f},
		{.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DA, .k_a = ka, .k_b = kb, .v = ka,
		 .ka_stride = DA, .ka_head = 0, .kb_stride = DB, .v_stride = DA, .v_head = 0,
		 .sel_stride = TOPK, .scale = 0.3f},
	};
	static float o1[NQ * H * DA], o2[NQ * H * DA];
	for (int k = 0; k < 4; k++) {
		struct cpu_mla s = lay[k / 2];
		if (k % 2) {
			s.sel = sel;
			s.nsel = nsel;
		}
		cpu_ref_mla_attention(o1, q, &s, NQ, P0, 0, NQ, 0, H);
		cpu_mla_attention_avx2(o2, q, &s, NQ, P0, 0, NQ, 0, H);
		cr_expect_leq(rel(o2, o1, NQ * H * s.d_v), 1e-5, "layout %d, sel %d", k / 2, k % 2);
	}
}

/* FP8 KV caches at the kernels: cpu_ref_cast's quantization is cpu_ref_act_quant's (codes and
 * scales back to f32 bit for bit, partial blocks and an all-zero block included); MLA
 * attention over an FP8 latent (bf16 k_pe) and indexer scores over FP8 keys are the f32
 * references' over the dequantized values bit for bit, and the AVX2 versions are within 1e-5
 * of them, dense and with a selection. */
Test(glm, fp8_cache_kernels)
{
	enum { T = 40, NQ = 7, P0 = T - NQ, H = 3, DA = 200, DB = 10, IH = 3, ID = 150, TOPK = 9 };
	struct ckpt r = {.rng = 23};
	static float q[NQ * H * (DA + DB)], ka[T * DA], kaq[T * DA], kb[T * DB], kbq[T * DB];
	static float iq[NQ * IH * ID], ik[T * ID], ikq[T * ID], iw[NQ * IH], want[T * DA];
	static uint8_t ka8[T * DA], ik8[T * ID];
	static uint16_t kb16[T * DB];
	static float kas[T * 2], iks[T * 2];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r) * (i % DA < 128 ? 1 : 30);
	for (int c = 128; c < DA; c++) /* row 3's second block: all zeros */
		ka[3 * DA + c] = 0;
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	cpu_ref_cast(ka8, DT_F8_E4M3, ka, DT_F32, T * DA, kas, NULL, DA);
	cpu_ref_cast(kaq, DT_F32, ka8, DT_F8_E4M3, T * DA, NULL, kas, DA);
	cpu_ref_act_quant(want, ka, T, DA);
	cr_expect_eq(memcmp(kaq, want, sizeof want), 0, "FP8 cache rows are not act_quant's");
	cr_expect(kas[3 * 2 + 1] == 1.0f && ka8[3 * DA + 150] == 0, "an all-zero block: scale %g",
		  kas[3 * 2 + 1]);
	cpu_ref_cast(kb16, DT_BF16, kb, DT_F32, T * DB, NULL, NULL, 0);
	cpu_ref_cast(kbq, DT_F32, kb16, DT_BF16, T * DB, NULL, NULL, 0);
	cpu_ref_cast(ik8, DT_F8_E4M3, ik, DT_F32, T * ID, iks, NULL, ID);
	cpu_ref_cast(ikq, DT_F32, ik8, DT_F8_E4M3, T * ID, NULL, iks, ID);
	for (int i = 0; i < NQ; i++)
		for (int t = 0; t < T; t++) {
			const float *qi = iq + i * IH * ID, *wi = iw + i * IH;
			float a = cpu_ref_dsa_score(qi, ikq + t * ID, DT_F32, NULL, wi, IH, ID, 0.2f,
						    0.6f);
			float b = cpu_ref_dsa_score(qi, ik8 + t * ID, DT_F8_E4M3, iks + t * 2, wi, IH,
						    ID, 0.2f, 0.6f);
			cr_expect_eq(a, b, "score %d %d: %g on the FP8 keys, %g dequantized", i, t,
				     b, a);
			if (cpu_has_avx2()) {
				float c = cpu_dsa_score_avx2(qi, ik8 + t * ID, DT_F8_E4M3,
							     iks + t * 2, wi, IH, ID, 0.2f, 0.6f);
				cr_expect_leq(fabsf(c - a), 1e-5f * (1.0f + fabsf(a)), "avx2 score "
					      "%d %d: %g, not %g", i, t, c, a);
			}
		}
	int sel[NQ * TOPK], nsel[NQ], sel8[NQ * TOPK], nsel8[NQ];
	float scores[T];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ikq, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = TOPK,
			     .qk_scale = 0.2f, .w_scale = 0.6f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	dd.k = ik8;
	dd.ks = iks;
	dd.kv = DT_F8_E4M3;
	cpu_ref_dsa_topk(sel8, nsel8, iq, iw, &dd, NQ, P0, scores, work);
	cr_expect_eq(memcmp(sel, sel8, sizeof sel), 0, "FP8 keys select differently");
	cr_expect_eq(memcmp(nsel, nsel8, sizeof nsel), 0);
	/* the absorbed layout: one latent key and value for all heads */
	struct cpu_mla f = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DA, .kv = DT_F32,
			    .k_a = kaq, .k_b = kbq, .v = kaq, .ka_stride = DA, .kb_stride = DB,
			    .v_stride = DA, .sel_stride = TOPK, .scale = 0.05f};
	struct cpu_mla e8 = f;
	e8.kv = DT_F8_E4M3;
	e8.k_a = e8.v = ka8;
	e8.a_s = kas;
	e8.k_b = kb16;
	static float o1[NQ * H * DA], o2[NQ * H * DA], o3[NQ * H * DA];
	for (int k = 0; k < 2; k++) {
		f.sel = e8.sel = k ? sel : NULL;
		f.nsel = e8.nsel = k ? nsel : NULL;
		cpu_ref_mla_attention(o1, q, &f, NQ, P0, 0, NQ, 0, H);
		cpu_ref_mla_attention(o2, q, &e8, NQ, P0, 0, NQ, 0, H);
		cr_expect_eq(memcmp(o1, o2, sizeof o1), 0, "sel %d: MLA over the FP8 latent is not "
			     "the reference over its values", k);
		if (cpu_has_avx2()) {
			cpu_mla_attention_avx2(o3, q, &e8, NQ, P0, 0, NQ, 0, H);
			cr_expect_leq(rel(o3, o1, NQ * H * DA), 1e-5, "sel %d: avx2 MLA over the FP8 "
				      "latent", k);
		}
	}
}

/* ---- (4) router ----------------------------------------------------------------------------- */

static float logit(float p)
{
	return logf(p / (1.0f - p));
}

/* The correction bias changes which experts are chosen, but the gate values are the chosen
 * experts' unbiased sigmoid scores, normalised and scaled. */
/* The CPU backend's grouped MoE op (experts batched, threaded matmuls) against
 * cpu_ref_moe_experts (token by token): FP8 with partial 128-blocks and BF16, 16 local
 * experts of 24 (ex0 4: slots naming experts 0..3 and 20..23 are another rank's and skipped),
 * several tokens on one expert, y accumulated onto non-zero values. With a shared expert
 * (expert 0's weights) the op's y is also bit for bit what the engine's unfused path gives:
 * the shared expert's matmuls and silu_mul into y, then the routed experts added. */
Test(glm, grouped_experts_match_reference)
{
	enum { DIM = 200, INTER = 144, NL = 16, EX0 = 4, K = 8, N = 37 };
	struct ckpt c = {.rng = 4242};
	enum dt_type dts[] = {DT_F8_E4M3, DT_BF16};
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config bc = {.threads = 2};
	cr_assert_eq(be_cpu.init(&ctx, &bc, err, sizeof err), WK_OK);
	float *x = malloc(sizeof(float) * N * DIM), *wt = malloc(sizeof(float) * N * K);
	float *y0 = malloc(sizeof(float) * N * DIM), *y1 = malloc(sizeof(float) * N * DIM);
	int *idx = malloc(sizeof(int) * N * K);
	float *ref_scr = malloc(sizeof(float) * (2 * INTER + DIM));
	cr_assert(x && wt && y0 && y1 && idx && ref_scr);
	for (int i = 0; i < N * DIM; i++) {
		x[i] = gauss(&c);
		y0[i] = y1[i] = 0.5f * gauss(&c);
	}
	for (int t = 0; t < N; t++)
		for (int j = 0; j < K; j++) {
			/* distinct experts per token from 24; tokens 0..9 all choose the same ones */
			idx[t * K + j] = ((t < 10 ? 7 : t * 5) + j * 3) % 24;
			wt[t * K + j] = 0.1f + 0.05f * (float)j;
		}
	for (int t = 0; t < N; t++)
		for (int j = 0; j < K; j++)
			for (int i = 0; i < j; i++)
				cr_assert_neq(idx[t * K + i], idx[t * K + j], "test setup: token %d", t);
	for (int d = 0; d < 2; d++) {
		enum dt_type w = dts[d];
		struct be_expert ex[NL];
		void *bufs[NL * 6];
		int nb = 0;
		for (int e = 0; e < NL; e++) {
			int shape[3][2] = {{INTER, DIM}, {INTER, DIM}, {DIM, INTER}};
			const void *data[3];
			const float *scale[3] = {NULL, NULL, NULL};
			for (int k = 0; k < 3; k++) {
				int r = shape[k][0], cc = shape[k][1];
				size_t nel = (size_t)r * cc;
				void *p = malloc(nel * dt_size(w));
				cr_assert_not_null(p);
				bufs[nb++] = p;
				if (w == DT_F8_E4M3) {
					uint8_t *b = p;
					for (size_t i = 0; i < nel; i++) {
						uint8_t v = (uint8_t)(next_u8(&c));
						b[i] = (v & 0x7f) == 0x7f ? 0x30 : v; /* no NaN codes */
					}
					size_t ns = (size_t)((r + 127) / 128) * ((cc + 127) / 128);
					float *sc = malloc(ns * sizeof *sc);
					cr_assert_not_null(sc);
					bufs[nb++] = sc;
					for (size_t i = 0; i < ns; i++)
						sc[i] = 0.002f * (1.0f + (float)i);
					scale[k] = sc;
				} else {
					float *f = malloc(nel * sizeof *f);
					cr_assert_not_null(f);
					for (size_t i = 0; i < nel; i++)
						f[i] = gauss(&c) / sqrtf((float)cc);
					uint16_t *h = p;
					for (size_t i = 0; i < nel; i++)
						h[i] = dt_f32_to_bf16(f[i]);
					free(f);
				}
				data[k] = p;
			}
			ex[e] = (struct be_expert){data[0], data[1], data[2], scale[0], scale[1], scale[2]};
		}
		struct be_experts be = {.ex0 = EX0, .n_local = NL, .top_k = K, .dim = DIM,
					.inter = INTER, .dtype = w, .experts = ex,
					.shared = &ex[0], .shared_dtype = w, .shared_inter = INTER};
		float *a = malloc(sizeof(float) * N * DIM), *b = malloc(sizeof(float) * N * DIM);
		void *scr = malloc(be_cpu.moe_scratch(ctx, N, &be));
		cr_assert(a && b && scr);
		/* one token, then all; then with expert 0's weights as a shared expert too */
		for (int it = 0, n = 1, sh = 0; it < 4; it++, n = it % 2 ? N : 1, sh = it >= 2) {
			struct cpu_shared_expert rsh = {{ex[0].gate, ex[0].up, ex[0].down,
							 ex[0].gate_s, ex[0].up_s, ex[0].down_s},
							w, INTER};
			be.shared = sh ? &ex[0] : NULL;
			be.shared_dtype = w;
			be.shared_inter = sh ? INTER : 0;
			memcpy(a, y0, sizeof(float) * N * DIM);
			memcpy(b, y0, sizeof(float) * N * DIM);
			cpu_ref_moe_experts(a, x, idx, wt, n, K, (const struct cpu_expert *)ex, EX0, NL,
					    w, DIM, INTER, sh ? &rsh : NULL, ref_scr);
			be_cpu.moe_experts(ctx, b, x, idx, wt, n, &be, scr);
			if (sh) {
				struct be_weight gw = {w, INTER, DIM, ex[0].gate, ex[0].gate_s};
				struct be_weight uw = {w, INTER, DIM, ex[0].up, ex[0].up_s};
				struct be_weight dw = {w, DIM, INTER, ex[0].down, ex[0].down_s};
				float *g = malloc(sizeof(float) * N * INTER), *u = malloc(sizeof(float) * N * INTER);
				float *un = malloc(sizeof(float) * N * DIM);
				cr_assert(g && u && un);
				be_cpu.matmul(ctx, g, x, &gw, n);
				be_cpu.matmul(ctx, u, x, &uw, n);
				be_cpu.silu_mul(ctx, g, u, (size_t)n * INTER);
				be_cpu.matmul(ctx, un, g, &dw, n);
				be.shared = NULL;
				be_cpu.moe_experts(ctx, un, x, idx, wt, n, &be, scr);
				be.shared = &ex[0];
				cr_expect_eq(memcmp(un, b, sizeof(float) * n * DIM), 0,
					     "%s, %d tokens: the shared expert inside the op differs "
					     "from it apart", dt_name(w), n);
				free(g);
				free(u);
				free(un);
			}
			double worst = 0;
			for (int t = 0; t < n; t++)
				worst = fmax(worst, rel(b + (size_t)t * DIM, a + (size_t)t * DIM, DIM));
			cr_expect_leq(worst, 1e-5, "%s, %d tokens, shared %d: grouped vs reference %g",
				      dt_name(w), n, sh, worst);
			cr_expect_neq(memcmp(a, y0, sizeof(float) * n * DIM), 0, "nothing was added");
		}
		free(a);
		free(b);
		free(scr);
		for (int i = 0; i < nb; i++)
			free(bufs[i]);
	}
	be_cpu.shutdown(ctx);
	free(x);
	free(wt);
	free(y0);
	free(y1);
	free(idx);
	free(ref_scr);
}

Test(glm, router_bias_selects_not_weighs)
{
	float p[8] = {0.9f, 0.85f, 0.3f, 0.2f, 0.5f, 0.1f, 0.05f, 0.4f};
	float lg[8], zero[8] = {0}, bias[8] = {0};
	for (int e = 0; e < 8; e++)
		lg[e] = logit(p[e]);
	int idx[2];
	float wt[2];
	cpu_ref_moe_route(idx, wt, lg, zero, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 0 && idx[1] == 1);
	bias[2] = 0.7f; /* 1.0 */
	bias[3] = 0.75f; /* 0.95 */
	cpu_ref_moe_route(idx, wt, lg, bias, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 2 && idx[1] == 3, "bias must choose 2, 3; got %d, %d", idx[0], idx[1]);
	float s2 = 1 / (1 + expf(-lg[2])), s3 = 1 / (1 + expf(-lg[3]));
	cr_expect_float_eq(wt[0], s2 / (s2 + s3 + 1e-20f) * 2.5f, 1e-6);
	cr_expect_float_eq(wt[1], s3 / (s2 + s3 + 1e-20f) * 2.5f, 1e-6);
	/* A different bias that chooses the same experts: the same weights, bit for bit. */
	float w2[2];
	bias[2] = 5.0f;
	bias[3] = 4.0f;
	cpu_ref_moe_route(idx, w2, lg, bias, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 2 && idx[1] == 3);
	cr_expect(w2[0] == wt[0] && w2[1] == wt[1]);
	/* Without norm_topk_prob: the raw scores times the factor. */
	cpu_ref_moe_route(idx, w2, lg, bias, 1, 8, 2, 1, 1, false, 2.5f);
	cr_expect_float_eq(w2[0], s2 * 2.5f, 1e-6);
	/* Ties: the lower index first. */
	float flat[8] = {0};
	cpu_ref_moe_route(idx, wt, flat, NULL, 1, 8, 2, 1, 1, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 1);
	cr_expect_float_eq(wt[0], 0.5f, 1e-6);
}

/* Group limiting: 4 groups of 2; the best single experts (0, 1) are in groups whose top-2 sums
 * lose to groups 2 and 3, so with topk_group 2 the choice moves there. */
Test(glm, router_group_limited)
{
	float p[8] = {0.9f, 0.01f, 0.8f, 0.01f, 0.6f, 0.6f, 0.55f, 0.56f};
	float lg[8];
	for (int e = 0; e < 8; e++)
		lg[e] = logit(p[e]);
	int idx[2];
	float wt[2];
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 4, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 2, "all groups: %d %d", idx[0], idx[1]);
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 2, true, 1.0f);
	cr_expect(idx[0] == 4 && idx[1] == 5, "2 groups: %d %d", idx[0], idx[1]);
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 1, true, 1.0f);
	cr_expect(idx[0] == 4 && idx[1] == 5, "1 group: %d %d", idx[0], idx[1]);
	/* The bias takes part in the group scores too: lift group 0's weak expert. */
	float bias[8] = {0, 0.7f, 0, 0, 0, 0, 0, 0};
	cpu_ref_moe_route(idx, wt, lg, bias, 1, 8, 2, 4, 1, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 1, "biased group 0: %d %d", idx[0], idx[1]);
	float s0 = p[0], s1 = p[1];
	cr_expect_float_eq(wt[1], s1 / (s0 + s1), 1e-5);

	/* Model level: topk_group and the correction bias both change a GLM-4.5's logits. */
	float *out[3];
	int tg[3] = {4, 1, 4};
	float bstd[3] = {0.0f, 0.0f, 1.0f};
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, DT_BF16, 4, tg[k], bstd[k]);
		struct engine *e = open_model(dir);
		out[k] = prefill(e, NIDS);
		eng_close(e);
		rm_rf(dir);
		free(dir);
	}
	cr_expect_gt(rel(out[1], out[0], NIDS * G4_VOCAB), 1e-3, "topk_group had no effect");
	cr_expect_gt(rel(out[2], out[0], NIDS * G4_VOCAB), 1e-3, "the bias had no effect");
	for (int k = 0; k < 3; k++)
		free(out[k]);
}

/* ---- config refusals ------------------------------------------------------------------------ */

static void expect_refused(const char *dir, const char *from, const char *to, const char *needle)
{
	char path[512], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/config.json", dir);
	char *buf;
	size_t len;
	cr_assert_eq(wk_read_file(path, 1 << 20, &buf, &len, err, sizeof err), WK_OK);
	char *at = strstr(buf, from);
	cr_assert_not_null(at, "%s not in config", from);
	char out[8192];
	snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
	FILE *f = fopen(path, "w");
	fputs(out, f);
	fclose(f);
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 1};
	int rc = eng_open(dir, &o, &e, err, sizeof err);
	cr_expect_neq(rc, WK_OK, "%s -> %s was accepted", from, to);
	cr_expect_not_null(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
	/* nor is a snapshot of it written: the refusal comes at `wick snapshot`, not at a
	 * worker's cold start */
	char snap[600];
	snprintf(snap, sizeof snap, "%s.snap", dir);
	struct eng_snap_opts so = {.tp = 1, .ep = 1};
	rc = eng_snapshot(dir, snap, &so, err, sizeof err);
	cr_expect_neq(rc, WK_OK, "a snapshot of %s -> %s was written", from, to);
	cr_expect_not_null(strstr(err, needle), "snapshot message '%s' lacks '%s'", err, needle);
	cr_expect_eq(access(snap, F_OK), -1, "%s -> %s: %s was left behind", from, to, snap);
	f = fopen(path, "w");
	fputs(buf, f);
	fclose(f);
	free(buf);
}

Test(glm, config_refusals)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_BF16, .seed = 1,
			   .bias_std = 0.1f};
	write_glm5(dir, &d);
	expect_refused(dir, "\"qk_head_dim\": 20", "\"qk_head_dim\": 21", "qk_head_dim");
	expect_refused(dir, "\"n_group\": 1", "\"n_group\": 3", "n_group");
	expect_refused(dir, "\"topk_group\": 1", "\"topk_group\": 2", "topk_group");
	expect_refused(dir, "\"rope_interleave\": true", "\"rope_interleave\": false",
		       "rope_interleave");
	expect_refused(dir, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_type");
	expect_refused(dir, "\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"",
		       "scoring_func");
	expect_refused(dir, "\"kv_lora_rank\": 24", "\"kv_lora_rank\": 25", "kv_a_proj_with_mqa");
	expect_refused(dir, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9",
		       "num_experts_per_tok");
	expect_refused(dir, "\"quant_method\": \"fp8\"", "\"quant_method\": \"compressed-tensors\"",
		       "quant_method");
	expect_refused(dir, "[128, 128]", "[64, 64]", "weight_block_size");
	rm_rf(dir);
	free(dir);
}

/* ---- snapshots ------------------------------------------------------------------------------ */

/* A snapshot (with --dtype bf16, which must leave FP8 block scales F32) runs the same. The
 * MTP layer is left out of it. */
Test(glm, snapshot_roundtrip)
{
	char *dir = mkdir_tmp(), *snap = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 11, .bias_std = 0.1f};
	write_glm5(dir, &d);
	char err[WK_ERRSZ], out[600];
	snprintf(out, sizeof out, "%s/s", snap);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .dtype = "bf16"};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	struct engine *a = open_model(dir), *b = open_model(out);
	cr_expect_eq(eng_info(b)->mtp_layers_skipped, 1);
	/* every tensor read but the MTP layer's, from the checkpoint and from the snapshot */
	cr_expect_eq(eng_info(a)->unused_tensors, 0, "%s", eng_info(a)->unused_example);
	cr_expect_eq(eng_info(b)->unused_tensors, 0, "%s", eng_info(b)->unused_example);
	float *la = prefill(a, NIDS), *lb = prefill(b, NIDS);
	for (int i = 0; i < NIDS; i++)
		cr_expect_leq(rel(lb + (size_t)i * G5_VOCAB, la + (size_t)i * G5_VOCAB, G5_VOCAB), 1e-5,
			      "position %d", i);
	free(la);
	free(lb);
	eng_close(a);
	eng_close(b);
	rm_rf(dir);
	rm_rf(snap);
	free(dir);
	free(snap);
}

/* ---- the CLI on these checkpoints ------------------------------------------------------------ */

static bool find_wick(char *out, size_t n)
{
	char self[PATH_MAX];
	ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
	if (k <= 0)
		return false;
	self[k] = 0;
	char *slash = strrchr(self, '/'); /* .../BUILD/tests/unit */
	if (!slash)
		return false;
	*slash = 0;
	slash = strrchr(self, '/');
	if (!slash)
		return false;
	*slash = 0;
	if (strlen(self) + 6 > n)
		return false;
	memcpy(out, self, strlen(self));
	memcpy(out + strlen(self), "/wick", 6);
	return access(out, X_OK) == 0;
}

static int run(const char *cmd, char *out, size_t n)
{
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t got = fread(out, 1, n - 1, p);
	out[got] = 0;
	return pclose(p);
}

Test(glm, cli)
{
	char wick[PATH_MAX];
	if (!find_wick(wick, sizeof wick))
		cr_skip_test("no wick binary beside the test binary");
	char *d5 = mkdir_tmp(), *d4 = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3, .seed = 7,
			   .bias_std = 0.1f};
	write_glm5(d5, &d);
	write_glm4(d4, DT_BF16, 4, 2, 0.1f);
	const char *dirs[2] = {d5, d4};
	static char out[1 << 16];
	for (int k = 0; k < 2; k++) {
		char cmd[2 * PATH_MAX];
		snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
		cr_expect_not_null(strstr(out, k == 0 ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"),
				   "%s", out);
		snprintf(cmd, sizeof cmd, "%s logits %s --tokens 3,17,42,5,60,11 --all-positions 2>&1",
			 wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
		snprintf(cmd, sizeof cmd, "%s generate %s --tokens 3,17,42 -n 8 --temperature 0 2>&1",
			 wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
	}
	if (!getenv("WICK_GLM_KEEP")) { /* set it to look at the checkpoints afterwards */
		rm_rf(d5);
		rm_rf(d4);
	} else {
		cr_log_warn("kept %s (GLM-5) and %s (GLM-4.5)", d5, d4);
	}
	free(d5);
	free(d4);
}

/* A step's act_split launches (the f32-activation GEMM's split: one per matmul_fp8w op). */
static long act_splits(const struct engine *e)
{
	struct eng_launches L;
	long n = 0;
	cr_assert_eq(eng_launches(e, 0, &L), WK_OK);
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++)
		n += strcmp(eng_launch_kind(k, NULL, NULL), "act_split") ? 0 : L.n[k];
	return n;
}

/* A CPU backend with a chain (its links one by one) whose chain_plan says each MoE link runs
 * on its own and the links around it chained, as the CUDA backend does with a MoE op its
 * chained launch cannot take; and the same without the plan (chain one launch, as before). */
static int plan_moe_apart(void *ctx, const struct be_link *l, int count, int *seg)
{
	(void)ctx;
	int runs = 0;
	for (int i = 0; i < count; i++)
		seg[i] = l[i].kind == BE_LINK_MOE ? -1 : i > 0 && seg[i - 1] >= 0 ? seg[i - 1] : runs++;
	return runs;
}

static void chain_cpu(void *ctx, const struct be_link *l, int count)
{
	be_chain_each(&be_cpu, ctx, l, count);
}

/* Every matmul_n and matmul_rope_n two launches and a rotation's (as the CUDA backend's
 * tensor-core GEMVs would make them). */
static void two_matmuls(void *ctx, float *const *y, const float *x,
			const struct be_weight *const *w, int count, int n, const struct be_rope *r,
			int *mm, int *rot)
{
	(void)ctx, (void)y, (void)x, (void)w, (void)count, (void)n, (void)r;
	*mm = 2;
	*rot = 1;
}

/* The launch counter counts what chain_plan says: with the MoE links apart, each is a
 * moe_experts op of its own (3 launches on the CUDA backend) instead of a link inside a
 * chain, the chains around them as many, and the logits the same bit for bit. And what
 * matmul_launches says: each matmul_n / matmul_rope_n outside a chain one more matmul and a
 * rotation. */
Test(glm, launch_count_follows_chain_plan)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 23, .bias_std = 0.1f};
	write_glm5(dir, &d);
	struct backend be[3] = {be_cpu, be_cpu, be_cpu};
	be[0].chain = be[1].chain = be[2].chain = chain_cpu;
	be[1].chain_plan = plan_moe_apart;
	be[2].matmul_launches = two_matmuls;
	struct eng_launches L[3];
	float *lg[3];
	int V = G5_VOCAB, tok = 5;
	char err[WK_ERRSZ];
	for (int k = 0; k < 3; k++) {
		struct engine *e;
		struct eng_opts o = {.backend = "cpu", .threads = 2, .backend_ops = &be[k],
				     .count_launches = true};
		cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
		lg[k] = malloc(sizeof(float) * V);
		cr_assert_eq(eng_forward(e, ids, NIDS, 0, lg[k], false, err, sizeof err), WK_OK, "%s",
			     err);
		cr_assert_eq(eng_forward(e, &tok, 1, NIDS, lg[k], false, err, sizeof err), WK_OK,
			     "%s", err);
		cr_assert_eq(eng_launches(e, 0, &L[k]), WK_OK);
		eng_close(e);
	}
	int moe = -1, chain = -1, mm = -1, rope = -1;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *nm = eng_launch_kind(k, NULL, NULL);
		moe = strcmp(nm, "moe_experts") ? moe : k;
		chain = strcmp(nm, "chain") ? chain : k;
		mm = strcmp(nm, "matmul") ? mm : k;
		rope = strcmp(nm, "rope") ? rope : k;
	}
	cr_assert(moe >= 0 && chain >= 0 && mm >= 0 && rope >= 0);
	long dm = L[2].n[mm] - L[0].n[mm], dr = L[2].n[rope] - L[0].n[rope];
	cr_log_info("matmul ops %ld / %ld, rope %ld / %ld", L[0].n[mm], L[2].n[mm], L[0].n[rope],
		    L[2].n[rope]);
	cr_expect(dm > 0 && dr == dm, "matmul_launches: %ld more matmuls, %ld more ropes", dm,
		  dr);
	cr_expect_eq(L[2].n[chain], L[0].n[chain]);
	cr_log_info("chained MoE ops %ld, MoE ops %ld / %ld, chains %ld / %ld",
		    L[0].chained[moe], L[0].n[moe], L[1].n[moe], L[0].n[chain], L[1].n[chain]);
	cr_expect_gt(L[0].chained[moe], 0, "no MoE op ran inside a chain");
	cr_expect_eq(L[1].chained[moe], 0, "a MoE link counted inside a chain");
	cr_expect_eq(L[1].n[moe], L[0].n[moe] + L[0].chained[moe]);
	cr_expect_eq(L[1].n[chain], L[0].n[chain]);
	cr_expect_eq(memcmp(lg[0], lg[1], sizeof(float) * V), 0);
	cr_expect_eq(memcmp(lg[0], lg[2], sizeof(float) * V), 0);
	for (int k = 0; k < 3; k++)
		free(lg[k]);
	rm_rf(dir);
	free(dir);
}

/* With f32 activations a step of ENG_GEMM_TOKENS (64) tokens or more sends its FP8 matmuls
 * to the backend's GEMM (matmul_fp8w; devsim runs it as the CPU's matmul, so the logits stay
 * the CPU's bit for bit), one of 63 tokens to the GEMV; an unfused engine never uses it, nor
 * one with FP8 activations (whose GEMM is matmul_fp8act, which devsim lacks). Counted on
 * devsim over a tiny GLM-5 FP8. */
Test(glm, f32_prefill_fp8_weights_take_the_gemm)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 23, .bias_std = 0.1f};
	write_glm5(dir, &d);
	enum { LEN = 64 };
	struct engine *cpu, *e[3]; /* devsim: fused, unfused, FP8 activations */
	char err[WK_ERRSZ];
	struct eng_opts oc = {.backend = "cpu", .threads = 2};
	cr_assert_eq(eng_open(dir, &oc, &cpu, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < 3; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .backend_ops = &be_devsim,
				     .count_launches = true, .unfused = k == 1, .fp8_act = k == 2};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s", err);
	}
	cr_assert_eq(eng_info(cpu)->max_seq, LEN);
	int V = G5_VOCAB, tok[LEN];
	for (int i = 0; i < LEN; i++)
		tok[i] = (i * 37 + 11) % V;
	float *want = malloc(sizeof(float) * LEN * V), *got = malloc(sizeof(float) * LEN * V);
	cr_assert(want && got);
	cr_assert_eq(eng_forward(cpu, tok, LEN, 0, want, true, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < 3; k++)
		cr_assert_eq(eng_forward(e[k], tok, LEN, 0, got, true, err, sizeof err), WK_OK, "%s",
			     err);
	long splits = act_splits(e[0]);
	cr_assert_eq(eng_forward(e[0], tok, LEN, 0, got, true, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(memcmp(got, want, sizeof(float) * LEN * V), 0,
		     "devsim's GEMM prefill differs from the CPU's");
	cr_log_info("a %d-token GLM-5 prefill: %ld act_split ops", LEN, splits);
	cr_expect_geq(splits, (long)G5_L, "a %d-token prefill ran %ld matmul_fp8w ops", LEN, splits);
	cr_expect_eq(act_splits(e[0]), 2 * splits, "a second prefill ran another count");
	cr_assert_eq(eng_forward(e[0], tok, LEN - 1, 0, got, true, err, sizeof err), WK_OK, "%s",
		     err);
	cr_expect_eq(act_splits(e[0]), 2 * splits, "a %d-token step took the GEMM", LEN - 1);
	cr_expect_eq(act_splits(e[1]), 0, "the unfused engine took the GEMM");
	cr_expect_eq(act_splits(e[2]), 0, "the f32 GEMM ran with FP8 activations");
	eng_close(cpu);
	for (int k = 0; k < 3; k++)
		eng_close(e[k]);
	free(want);
	free(got);
	rm_rf(dir);
	free(dir);
}

/* ---- FP8 activations ------------------------------------------------------------------------ */

/* eng_opts.fp8_act quantizes the input of every FP8-weight matmul per token per 128 channels
 * (the quantizer itself is tested in test_fp8.c). Here: over 320 positions of a tiny GLM-5 FP8
 * the quantization runs (act_quant before the FP8 matmuls, the experts one by one so that
 * they read quantized input too, logits finite and changed) and devsim's logits are the
 * CPU's bit for bit (act_quant and its scratch live in device memory). How far FP8
 * activations move the logits of random tiny weights is logged, not bounded: a flipped
 * e4m3 rounding changes MoE and DSA choices and cascades (issue 9's gross-error gate, GPU
 * against CPU with FP8 activations on both, runs in scripts/gpu-check). */
Test(glm, fp8_activations)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 21, .bias_std = 0.1f};
	write_glm5(dir, &d);
	enum { SEQS = 5, LEN = 64 };
	const struct backend *bes[3] = {NULL, NULL, &be_devsim};
	struct engine *e[3];
	char err[WK_ERRSZ];
	for (int k = 0; k < 3; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .fp8_act = k > 0,
				     .backend_ops = bes[k], .count_launches = k == 1};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s", err);
	}
	cr_assert_eq(eng_info(e[0])->max_seq, LEN);
	int V = G5_VOCAB, tok[LEN], top1 = 0, n = 0;
	float *lg[3];
	for (int k = 0; k < 3; k++)
		lg[k] = malloc(sizeof(float) * LEN * V);
	double cos_sum = 0, maxd = 0;
	uint64_t r = 12345;
	for (int s = 0; s < SEQS; s++) {
		for (int i = 0; i < LEN; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			tok[i] = (int)((r >> 33) % (uint64_t)V);
		}
		for (int k = 0; k < 3; k++)
			cr_assert_eq(eng_forward(e[k], tok, LEN, 0, lg[k], true, err, sizeof err),
				     WK_OK, "%s", err);
		cr_expect_eq(memcmp(lg[1], lg[2], sizeof(float) * LEN * V), 0,
			     "devsim differs from the CPU with FP8 activations");
		for (int i = 0; i < LEN; i++, n++) {
			const float *a = lg[0] + (size_t)i * V, *b = lg[1] + (size_t)i * V;
			double ab = 0, aa = 0, bb = 0;
			int ia = 0, ib = 0;
			for (int v = 0; v < V; v++) {
				cr_assert(isfinite(b[v]));
				ab += (double)a[v] * b[v];
				aa += (double)a[v] * a[v];
				bb += (double)b[v] * b[v];
				ia = a[v] > a[ia] ? v : ia;
				ib = b[v] > b[ib] ? v : ib;
				maxd = fmax(maxd, fabs((double)a[v] - b[v]));
			}
			cos_sum += ab / sqrt(aa * bb);
			top1 += ia == ib;
		}
	}
	struct eng_launches L;
	cr_assert_eq(eng_launches(e[1], 0, &L), WK_OK);
	long aq = 0, mx = 0;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *name = eng_launch_kind(k, NULL, NULL);
		aq += strcmp(name, "act_quant") ? 0 : L.n[k];
		mx += strcmp(name, "moe_experts") ? 0 : L.n[k];
	}
	cr_log_info("fp8 activations vs f32 over %d positions: mean cosine %.4f, top-1 %.3f, max "
		    "|d| %.3g; %ld act_quant ops", n, cos_sum / n, (double)top1 / n, maxd, aq);
	cr_expect_geq(aq, (long)SEQS * G5_L, "only %ld act_quant ops", aq);
	cr_expect_eq(mx, 0, "the grouped MoE op ran with FP8 activations");
	cr_expect_gt(maxd, 1e-4, "FP8 activations changed nothing (max |d| %g)", maxd);
	for (int k = 0; k < 3; k++) {
		eng_close(e[k]);
		free(lg[k]);
	}
	rm_rf(dir);
	free(dir);
}

/* The prefill logits [NIDS][vocab] of the model in dir on KV caches of type kv (*V: vocab). */
static float *prefill_kv(const char *dir, const char *kv, int *V)
{
	kv_opt = kv;
	struct engine *e = open_model(dir);
	cr_assert_str_eq(eng_info(e)->kv_dtype, kv);
	*V = eng_info(e)->vocab;
	float *lg = prefill(e, NIDS);
	eng_close(e);
	return lg;
}

/* A KV cache type's consistency on the model in dir (e: open on it, closed here; got: its
 * prefill): decoding token by token matches the prefill, in the chosen MLA form and the
 * absorbed one (it reads the cache itself; these sizes choose expanded), batched steps match
 * each sequence alone, and device memory (devsim) matches bit for bit. */
static void check_cache_paths(struct engine *e, const char *dir, const float *got, int V,
			      const char *what)
{
	check_decode(e, got, NIDS, what);
	eng_close(e);
	set_mla("absorb");
	e = open_model(dir);
	check_decode(e, got, NIDS, what);
	eng_close(e);
	set_mla(NULL);
	check_batched(dir, V, what);
	check_devsim(dir, V, what);
}

/* The worst rel() over NIDS rows of logits. */
static double worst_rel(const float *a, const float *b, int V)
{
	double w = 0;
	for (int i = 0; i < NIDS; i++)
		w = fmax(w, rel(a + (size_t)i * V, b + (size_t)i * V, V));
	return w;
}

/* bf16 KV caches on every family and both ways GLM-5 writes its latent (FP8 kv_a whole, bf16
 * kv_a split in two): the logits stay within bf16's rounding of the f32 caches' and differ
 * from them (the caches do round); decoding token by token matches the prefill; batched steps
 * (the step's rows rounded into several sequences' caches) match each sequence alone; and on
 * device memory (devsim) the logits are the CPU backend's bit for bit. */
Test(glm, kv_bf16)
{
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	const char *what[3] = {"glm5 fp8", "glm5 bf16", "glm4 bf16"};
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		d.wdt = k == 0 ? DT_F8_E4M3 : DT_BF16;
		if (k < 2)
			write_glm5(dir, &d);
		else
			write_glm4(dir, DT_BF16, 4, 2, 0.1f);
		int V;
		float *ref = prefill_kv(dir, "f32", &V), *got = prefill_kv(dir, "bf16", &V);
		struct engine *e = open_model(dir);
		double worst = worst_rel(got, ref, V);
		fprintf(stderr, "glm kv bf16: %s: bf16 vs f32 caches, worst relative difference "
			"%.2g\n", what[k], worst);
		cr_expect(worst > 0 && worst <= 1.5e-2, "%s: bf16 vs f32 caches differ by %g",
			  what[k], worst);
		check_cache_paths(e, dir, got, V, what[k]);
		kv_opt = NULL;
		free(ref);
		free(got);
		rm_rf(dir);
		free(dir);
	}
}

/* Mean cosine and top-1 agreement of n rows of logits against ref's. */
static void agreement(const float *a, const float *ref, int n, int V, double *cos, double *top1)
{
	*cos = *top1 = 0;
	for (int i = 0; i < n; i++) {
		const float *x = a + (size_t)i * V, *y = ref + (size_t)i * V;
		double xy = 0, xx = 0, yy = 0;
		int bx = 0, by = 0;
		for (int j = 0; j < V; j++) {
			xy += (double)x[j] * y[j], xx += (double)x[j] * x[j], yy += (double)y[j] * y[j];
			bx = x[j] > x[bx] ? j : bx;
			by = y[j] > y[by] ? j : by;
		}
		*cos += xy / sqrt(xx * yy) / n;
		*top1 += (double)(bx == by) / n;
	}
}

/* fp8 caches on the model in dir against f32 and bf16 ones: printed, the logits differing from
 * the bf16 caches' (the cache does quantize) and, bounded, the mean cosine and top-1 against
 * f32 held to a gross-error gate; then check_cache_paths. Returns the fp8 prefill's logits
 * (to free), V its vocabulary. */
static float *check_fp8_cache(const char *dir, const char *what, bool bounded, int *V)
{
	float *ref = prefill_kv(dir, "f32", V), *b16 = prefill_kv(dir, "bf16", V);
	float *got = prefill_kv(dir, "fp8", V);
	struct engine *e = open_model(dir);
	double worst = worst_rel(got, ref, *V), worst16 = worst_rel(got, b16, *V), cos, top1;
	agreement(got, ref, NIDS, *V, &cos, &top1);
	fprintf(stderr, "glm kv fp8: %s: fp8 vs f32 caches, worst relative difference %.2g, "
		"mean cosine %.6f, top-1 %.2f (vs bf16 caches: %.2g)\n", what, worst, cos, top1,
		worst16);
	cr_expect(!bounded || (cos >= 0.998 && top1 >= 0.8), "%s: fp8 vs f32 caches: mean "
		  "cosine %g, top-1 %g", what, cos, top1);
	cr_expect(worst16 > 1e-3, "%s: the fp8 caches' logits are the bf16 caches' (%g)", what,
		  worst16);
	check_cache_paths(e, dir, got, *V, what);
	kv_opt = NULL;
	free(ref);
	free(b16);
	return got;
}

/* FP8 KV caches (GLM-5: the latent and the indexer keys e4m3 with a scale per 128, k_pe
 * bf16), with kv_a whole (FP8 weights) and split (bf16). Dense (index_topk 16 over 12
 * positions): the logits stay near the f32 caches' (a gross-error gate: e4m3 keeps 3 mantissa
 * bits) and differ from the bf16 caches' (the cache does quantize). Sparse (index_topk 4, so
 * the indexer reads its FP8 keys; on random tiny weights one flipped choice moves a logit far,
 * so no bound against f32 there): decoding token by token reads the same quantized rows as
 * the prefill's expansion, so it matches it to f32 rounding; batched = alone; devsim bit for
 * bit. A KV dtype wick does not have is refused by name. */
Test(glm, kv_fp8)
{
	struct g5dims d = {.topk = 16, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	const char *what[4] = {"glm5 fp8 dense", "glm5 bf16 dense", "glm5 fp8", "glm5 bf16"};
	for (int k = 0; k < 4; k++) {
		char *dir = mkdir_tmp();
		d.wdt = k % 2 == 0 ? DT_F8_E4M3 : DT_BF16;
		d.topk = k < 2 ? 16 : 4;
		write_glm5(dir, &d);
		int V;
		free(check_fp8_cache(dir, what[k], k < 2, &V));
		rm_rf(dir);
		free(dir);
	}
	char *dir = mkdir_tmp();
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	struct engine *e;
	char err[WK_ERRSZ] = "";
	struct eng_opts o = {.backend = "cpu", .threads = 2, .kv_dtype = "fp4"};
	cr_expect_eq(eng_open(dir, &o, &e, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "'fp4'"), "%s", err);
	rm_rf(dir);
	free(dir);
}

/* FP8 KV caches on GLM-4.5 (GQA: keys and values e4m3 with one f32 scale per 128 of each
 * position's kv-head row, head_dim 32 here), FP8 and bf16 weights: the logits stay near the f32
 * caches' (a gross-error gate: e4m3 keeps 3 mantissa bits) and differ from the bf16 caches'
 * (the cache does quantize); decoding token by token reads the same quantized rows as the
 * prefill, so it matches it to f32 rounding; batched = alone; devsim bit for bit; the scalar
 * kernels match AVX2 (tp 2: engine/kv_fp8_tells_the_story, on stories260K). */
Test(glm, kv_fp8_gqa)
{
	const char *what[2] = {"glm4 fp8", "glm4 bf16"};
	for (int k = 0; k < 2; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, k == 0 ? DT_F8_E4M3 : DT_BF16, 4, 2, 0.1f);
		int V;
		float *got = check_fp8_cache(dir, what[k], true, &V);
		cpu_force_scalar(true);
		float *sc = prefill_kv(dir, "fp8", &V);
		cpu_force_scalar(false);
		cr_expect_leq(worst_rel(sc, got, V), 1e-4, "%s: scalar vs AVX2: %g", what[k],
			      worst_rel(sc, got, V));
		kv_opt = NULL;
		free(sc);
		free(got);
		rm_rf(dir);
		free(dir);
	}
}

/* FP8 caches whose rows span several 128-blocks with a partial last one (gen_glm: kv_lora_rank
 * and index_head_dim 136 = 128 + 8, so the per-block scales are indexed past the first): the
 * cache paths as kv_fp8 checks them; a prefill in two chunks (the second expanding over the
 * first's quantized rows) matches the whole one in either MLA form; the scalar kernels match
 * the AVX2 ones; and tp 2 matches tp 1 (each rank caches the whole latent). */
Test(glm, kv_fp8_blocks)
{
	const char *tools = getenv("WICK_TOOLS");
	char *dir = mkdir_tmp(), cmd[1024], err[WK_ERRSZ];
	snprintf(cmd, sizeof cmd, "'%s/gen_glm' --family glm5 -o '%s' --kv-lora-rank 136 "
		 "--index-head-dim 136 --index-topk 4 >/dev/null", tools ? tools : "build/tools", dir);
	cr_assert_eq(system(cmd), 0, "%s (is $WICK_TOOLS/gen_glm built?)", cmd);
	int V;
	float *got = prefill_kv(dir, "fp8", &V);
	check_cache_paths(open_model(dir), dir, got, V, "glm5 fp8 cache, 136-wide rows");
	float *two = malloc(sizeof(float) * NIDS * V);
	cr_assert_not_null(two);
	for (int m = 0; m < 2; m++) {
		set_mla(m ? "expand" : "absorb");
		struct engine *e = open_model(dir);
		cr_assert_eq(eng_forward(e, ids, 6, 0, two, true, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(e, ids + 6, NIDS - 6, 6, two + (size_t)6 * V, true, err,
					 sizeof err), WK_OK, "%s", err);
		eng_close(e);
		cr_expect_leq(worst_rel(two, got, V), 1e-4, "%s: a chunked prefill differs by %g",
			      m ? "expand" : "absorb", worst_rel(two, got, V));
	}
	set_mla(NULL);
	cpu_force_scalar(true);
	float *sc = prefill_kv(dir, "fp8", &V);
	cpu_force_scalar(false);
	cr_expect_leq(worst_rel(sc, got, V), 1e-4, "scalar vs AVX2: %g", worst_rel(sc, got, V));
	char *sd = mkdir_tmp(), out[600];
	snprintf(out, sizeof out, "%s/s", sd);
	struct eng_snap_opts so = {.tp = 2, .ep = 1};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	float *tp2 = prefill_kv(out, "fp8", &V);
	double d = worst_rel(tp2, got, V);
	fprintf(stderr, "glm kv fp8 blocks: tp 2 vs tp 1 on fp8 caches %.2g\n", d);
	cr_expect_leq(d, 1e-4, "tp 2 vs tp 1: %g", d);
	kv_opt = NULL;
	free(got), free(two), free(sc), free(tp2);
	rm_rf(sd), free(sd);
	rm_rf(dir), free(dir);
}
