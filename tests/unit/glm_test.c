/*
 * glm_test.c - the GLM families' tests' shared helpers (glm_test.h): the checkpoint writer, the
 * two tiny models, and opening, prefilling and decoding them.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coldstart/safetensors.h"
#include "common/dtype.h"
#include "common/wk.h"
#include "engine/engine.h"
#include "tests/unit/glm_test.h"

/* ---- a tiny checkpoint writer --------------------------------------------------------------- */

float gauss(struct ckpt *c)
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

void tensor(struct ckpt *c, const char *name, enum dt_type dt, int rows, int cols,
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

char *mkdir_tmp(void)
{
	char *d = strdup("/tmp/wick-glm-XXXXXX");
	cr_assert_not_null(mkdtemp(d));
	return d;
}

void rm_rf(const char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
	cr_assert_eq(system(cmd), 0);
}

char *gen_glm_dir(const char *fam, const char *args)
{
	const char *tools = getenv("WICK_TOOLS") ? getenv("WICK_TOOLS") : "build/tools";
	char *dir = mkdir_tmp(), cmd[2048];
	snprintf(cmd, sizeof cmd, "'%s/gen_glm' --family %s -o '%s' %s >/dev/null", tools, fam,
		 dir, args);
	cr_assert_eq(system(cmd), 0, "%s failed (is $WICK_TOOLS/gen_glm built?)", cmd);
	return dir;
}

/* ---- the two tiny models ------------------------------------------------------------------- */

void write_glm5(const char *dir, const struct g5dims *d)
{
	struct ckpt c = {.rng = d->seed};
	enum dt_type w = d->wdt;
	int kvl = d->kvl ? d->kvl : G5_KVL;
	char nm[256];
	tensor(&c, "model.embed_tokens.weight", DT_BF16, G5_VOCAB, G5_DIM, 0.0f, 1.0f);
	for (int l = 0; l < G5_L; l++) {
#define N(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
		norm(&c, N("input_layernorm.weight"), G5_DIM);
		norm(&c, N("post_attention_layernorm.weight"), G5_DIM);
		linear(&c, N("self_attn.q_a_proj.weight"), w, G5_QL, G5_DIM);
		norm(&c, N("self_attn.q_a_layernorm.weight"), G5_QL);
		linear(&c, N("self_attn.q_b_proj.weight"), w, G5_H * (G5_NOPE + G5_ROPE), G5_QL);
		linear(&c, N("self_attn.kv_a_proj_with_mqa.weight"), w, kvl + G5_ROPE, G5_DIM);
		norm(&c, N("self_attn.kv_a_layernorm.weight"), kvl);
		linear(&c, N("self_attn.kv_b_proj.weight"), w, G5_H * (G5_NOPE + G5_V), kvl);
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
		 G5_DIM, G5_L, G5_H, G5_H, G5_QL, kvl, G5_NOPE, G5_ROPE, G5_NOPE + G5_ROPE, G5_V,
		 G5_ROPE, G5_IH, G5_ID, d->topk, G5_I, G5_MI, G5_E, G5_K, d->n_group, d->topk_group,
		 G5_VOCAB);
	ckpt_write(&c, dir, cfg);
}


void write_glm4(const char *dir, enum dt_type w, int n_group, int topk_group,
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

const char *kv_opt;

struct engine *open_model(const char *dir)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .kv_dtype = kv_opt};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	return e;
}

float *prefill(struct engine *e, int n)
{
	int V = eng_info(e)->vocab;
	char err[WK_ERRSZ];
	float *all = malloc(sizeof(float) * n * V);
	cr_assert_eq(eng_forward(e, ids, n, 0, all, true, err, sizeof err), WK_OK, "%s", err);
	return all;
}

void check_decode(struct engine *e, const float *ref, int n, const char *what)
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

void set_mla(const char *mode)
{
	if (mode)
		setenv("WICK_GLM_MLA", mode, 1);
	else
		unsetenv("WICK_GLM_MLA");
}
