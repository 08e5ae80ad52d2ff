/*
 * gen_glm.c - writes a randomly initialised GLM checkpoint in the exact Hugging Face layout of
 * the real ones, for tests and benchmarks that need the architecture but not a trained model.
 *
 *   gen_glm --family glm5|glm4 -o DIR [--seed S] [size flags] [--shards N] [--mtp]
 *           [--mtp-oracle]
 *   gen_glm --preset bench-1g -o DIR
 *
 * glm5 is GlmMoeDsaForCausalLM (GLM-5-FP8): MLA attention, the DSA lightning indexer, a
 * sigmoid noaux_tc MoE with shared experts after first_k_dense_replace dense layers. glm4 is
 * Glm4MoeForCausalLM (GLM-4.5/4.6/4.7): GQA with q/k/v bias, optional per-head qk RMSNorm,
 * partial RoPE, the same MoE. ../shared/reference/glm.md §1-2 lists every config key, tensor
 * name, shape and dtype written here; shapes are PyTorch [out, in].
 *
 * Storage, as GLM-5-FP8 keeps it (glm.md §2.2): the decoder layers' linear weights (q_a_proj,
 * q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, indexer.wq_b, indexer.wk, dense MLP, routed
 * and shared experts) are F8_E4M3, each with "<name>_scale_inv" F32 [ceil(out/128),
 * ceil(in/128)]: W = W_fp8 * scale_inv[r/128][c/128], scale = block amax / 448. Embeddings,
 * lm_head, every norm, the router gate, indexer.weights_proj and the MTP eh_proj stay BF16;
 * e_score_correction_bias is F32. `--dtype bf16` writes GLM-5 all BF16 (the BF16 release);
 * GLM-4.x is always BF16 (its FP8 release uses compressed-tensors, glm.md §2.3, not written).
 *
 * Values: linear weights ~N(0, 1/sqrt(in)) so activations stay O(1) through the layers,
 * embeddings ~N(0, 1), norm weights 1 + N(0, 0.1), biases N(0, 0.1), router biases
 * U[0, 0.5) (non-negative so that every biased choice score is positive, see below). Each
 * tensor draws from its own xorshift stream seeded by (seed, name), so the weights do not
 * depend on --shards: a sharded and a single-file model with one seed are the same model.
 *
 * Why the router bias is non-negative: transformers fills the choice scores of experts in
 * dropped groups with 0.0, the DeepSeek reference with -inf. With positive choice scores both
 * pick the same experts, so tests do not depend on that disagreement.
 *
 * --mtp-oracle (with --mtp): a model whose MTP layer is always right, the best case of its
 * drafts, for tests and benches: every decoder layer adds nothing (o_proj and every MLP's,
 * expert's and shared expert's down_proj are zero; the rest is read and computed as ever),
 * every norm weight is 1, and the MTP layer's eh_proj is [I | 0]. The model's hidden state is
 * then its token's embedding, its next token a function of the token alone, f(t) = argmax of
 * lm_head . rmsnorm(embed(t)); the MTP layer, given the token after (and its hidden state,
 * multiplied by 0), computes rmsnorm(rmsnorm(embed)) (the same but for eps), so its drafts are
 * f applied in turn: the tokens greedy decoding gives.
 *
 * --say T0,T1,...,Tn: a model that says T1..Tn in turn after a prompt that ends with T0 (for
 * tests of what the text becomes: tool calls, stop strings). Its layers add nothing, as
 * --mtp-oracle's, and its embedding and lm_head are zero but for Ti's row, the unit vector
 * e_i, and lm_head row T(i+1) column i (4): after Ti the largest logit is T(i+1)'s, after any
 * other token all are 0 (token 0). Each Ti before Tn appears once.
 *
 * The tool prints the bytes one decoded token reads (embedding row, attention and indexer,
 * router, the active routed experts only, shared experts, dense MLPs, lm_head; the MTP layer
 * is not run) against the last-level cache size, for the decode benchmark.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coldstart/safetensors.h"
#include "common/dtype.h"
#include "common/wk.h"

#define BLK 128          /* FP8 weight block edge, both dimensions */
#define E4M3_MAX 448.0f
#define MAX_NAME 192

enum family { GLM5, GLM4 };

struct dims {
	enum family fam;
	bool fp8;
	int hidden, layers, heads, vocab, max_pos, inter, moe_inter, experts, topk, shared;
	int n_group, topk_group, first_dense;
	int q_lora, kv_lora, nope, rope, v_head, index_heads, index_dim, index_topk; /* glm5 */
	int kv_heads, head_dim, qk_norm;                                            /* glm4 */
	double scaling, partial_rotary;
	int shards, mtp, oracle;
	int say[64], n_say; /* --say: the tokens greedy decoding gives in turn */
	uint64_t seed;
};

/* How often one decoded token reads a tensor. */
enum reads { RD_ALL, RD_EXPERT, RD_EMBED_ROW, RD_NONE };

enum init { I_LINEAR, I_EMBED, I_NORM, I_BIAS, I_ROUTER_BIAS };

/* One tensor to write; an FP8 weight is followed in the list by its scale_inv. */
struct spec {
	char name[MAX_NAME];
	enum dt_type dt;
	int rank;
	int64_t rows, cols; /* cols == 0 for a vector */
	enum init init;
	bool is_scale;      /* the scale_inv of the spec before it */
	enum reads reads;
	uint64_t nbytes;
};

struct list {
	struct spec *v;
	size_t n, cap;
};

/* ---- random numbers ------------------------------------------------------------------------ */

struct rng {
	uint64_t s;
};

static uint64_t next_u64(struct rng *r) /* xorshift64* */
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545F4914F6CDD1Dull;
}

static struct rng rng_for(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the name, mixed with the seed */
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	uint64_t z = h ^ (seed * 0x9E3779B97F4A7C15ull) ^ 0x632BE59BD9B4E019ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64 finaliser */
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (struct rng){z ? z : 1};
}

/* Approximately N(0, 1): the sum of four 16-bit uniforms has mean 2 and variance 1/3. */
static float gauss(struct rng *r)
{
	uint64_t u = next_u64(r);
	float s = 0.0f;
	for (int i = 0; i < 4; i++)
		s += (float)((u >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
	return (s - 2.0f) * 1.7320508f;
}

static float draw(struct rng *r, enum init in, int64_t fan_in)
{
	switch (in) {
	case I_LINEAR: return gauss(r) / sqrtf((float)fan_in);
	case I_EMBED: return gauss(r);
	case I_NORM: return 1.0f + 0.1f * gauss(r);
	case I_BIAS: return 0.1f * gauss(r);
	case I_ROUTER_BIAS: return 0.5f * (float)(next_u64(r) >> 40) * (1.0f / 16777216.0f);
	}
	return 0.0f;
}

/* ---- the tensor list ----------------------------------------------------------------------- */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int push(struct list *l, const char *name, enum dt_type dt, int64_t rows, int64_t cols,
		enum init in, enum reads rd)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 256;
		struct spec *v = realloc(l->v, cap * sizeof *v);
		if (!v)
			return -1;
		l->v = v;
		l->cap = cap;
	}
	struct spec *s = &l->v[l->n++];
	memset(s, 0, sizeof *s);
	snprintf(s->name, sizeof s->name, "%s", name);
	s->dt = dt;
	s->rank = cols ? 2 : 1;
	s->rows = rows;
	s->cols = cols;
	s->init = in;
	s->reads = rd;
	s->nbytes = (uint64_t)rows * (uint64_t)(cols ? cols : 1) * dt_size(dt);
	return 0;
}

/* A linear weight [rows, cols]: FP8 plus its scale_inv when fp8, else BF16. */
static int linear(struct list *l, bool fp8, const char *name, int64_t rows, int64_t cols,
		  enum reads rd)
{
	if (push(l, name, fp8 ? DT_F8_E4M3 : DT_BF16, rows, cols, I_LINEAR, rd))
		return -1;
	if (!fp8)
		return 0;
	char sname[MAX_NAME];
	snprintf(sname, sizeof sname, "%s_scale_inv", name);
	if (push(l, sname, DT_F32, cdiv(rows, BLK), cdiv(cols, BLK), I_LINEAR, rd))
		return -1;
	l->v[l->n - 1].is_scale = true;
	return 0;
}

#define P(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

static int mlp(struct list *l, bool fp8, const char *pre, int64_t hidden, int64_t inter,
	       enum reads rd)
{
	char nm[MAX_NAME];
	return linear(l, fp8, P("%s.gate_proj.weight", pre), inter, hidden, rd) ||
	       linear(l, fp8, P("%s.up_proj.weight", pre), inter, hidden, rd) ||
	       linear(l, fp8, P("%s.down_proj.weight", pre), hidden, inter, rd);
}

/* One decoder layer i. The MTP layer (i == layers) is a full MoE layer that decode never runs. */
static int layer(struct list *l, const struct dims *d, int i)
{
	char nm[MAX_NAME], pre[MAX_NAME];
	bool fp8 = d->fp8, mtp = i >= d->layers;
	enum reads rd = mtp ? RD_NONE : RD_ALL;
	int64_t H = d->hidden;
	int rc = 0;
	rc |= push(l, P("model.layers.%d.input_layernorm.weight", i), DT_BF16, H, 0, I_NORM, rd);
	if (d->fam == GLM5) {
		int64_t qk = d->nope + d->rope, nh = d->heads;
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.q_a_proj.weight", i), d->q_lora, H, rd);
		rc |= push(l, P("model.layers.%d.self_attn.q_a_layernorm.weight", i), DT_BF16,
			   d->q_lora, 0, I_NORM, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.q_b_proj.weight", i), nh * qk,
			     d->q_lora, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", i),
			     d->kv_lora + d->rope, H, rd);
		rc |= push(l, P("model.layers.%d.self_attn.kv_a_layernorm.weight", i), DT_BF16,
			   d->kv_lora, 0, I_NORM, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.kv_b_proj.weight", i),
			     nh * (d->nope + d->v_head), d->kv_lora, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.o_proj.weight", i), H,
			     nh * d->v_head, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.indexer.wq_b.weight", i),
			     (int64_t)d->index_heads * d->index_dim, d->q_lora, rd);
		rc |= linear(l, fp8, P("model.layers.%d.self_attn.indexer.wk.weight", i),
			     d->index_dim, H, rd);
		rc |= push(l, P("model.layers.%d.self_attn.indexer.k_norm.weight", i), DT_BF16,
			   d->index_dim, 0, I_NORM, rd);
		rc |= push(l, P("model.layers.%d.self_attn.indexer.k_norm.bias", i), DT_BF16,
			   d->index_dim, 0, I_BIAS, rd);
		rc |= push(l, P("model.layers.%d.self_attn.indexer.weights_proj.weight", i), DT_BF16,
			   d->index_heads, H, I_LINEAR, rd);
	} else {
		int64_t q = (int64_t)d->heads * d->head_dim, kv = (int64_t)d->kv_heads * d->head_dim;
		const struct {
			const char *p;
			int64_t rows;
		} qkv[] = {{"q", q}, {"k", kv}, {"v", kv}};
		for (int j = 0; j < 3; j++) {
			rc |= push(l, P("model.layers.%d.self_attn.%s_proj.weight", i, qkv[j].p), DT_BF16,
				   qkv[j].rows, H, I_LINEAR, rd);
			rc |= push(l, P("model.layers.%d.self_attn.%s_proj.bias", i, qkv[j].p), DT_BF16,
				   qkv[j].rows, 0, I_BIAS, rd);
		}
		rc |= push(l, P("model.layers.%d.self_attn.o_proj.weight", i), DT_BF16, H, q,
			   I_LINEAR, rd);
		if (d->qk_norm) {
			rc |= push(l, P("model.layers.%d.self_attn.q_norm.weight", i), DT_BF16,
				   d->head_dim, 0, I_NORM, rd);
			rc |= push(l, P("model.layers.%d.self_attn.k_norm.weight", i), DT_BF16,
				   d->head_dim, 0, I_NORM, rd);
		}
	}
	rc |= push(l, P("model.layers.%d.post_attention_layernorm.weight", i), DT_BF16, H, 0,
		   I_NORM, rd);
	if (i < d->first_dense) {
		snprintf(pre, sizeof pre, "model.layers.%d.mlp", i);
		rc |= mlp(l, fp8, pre, H, d->inter, rd);
	} else {
		rc |= push(l, P("model.layers.%d.mlp.gate.weight", i), DT_BF16, d->experts, H,
			   I_LINEAR, rd);
		rc |= push(l, P("model.layers.%d.mlp.gate.e_score_correction_bias", i), DT_F32,
			   d->experts, 0, I_ROUTER_BIAS, rd);
		for (int e = 0; e < d->experts; e++) {
			snprintf(pre, sizeof pre, "model.layers.%d.mlp.experts.%d", i, e);
			rc |= mlp(l, fp8, pre, H, d->moe_inter, mtp ? RD_NONE : RD_EXPERT);
		}
		snprintf(pre, sizeof pre, "model.layers.%d.mlp.shared_experts", i);
		rc |= mlp(l, fp8, pre, H, (int64_t)d->moe_inter * d->shared, rd);
	}
	if (mtp) { /* DeepSeek-V3 layout: glm.md §2.1 and §3.6 */
		rc |= push(l, P("model.layers.%d.enorm.weight", i), DT_BF16, H, 0, I_NORM, RD_NONE);
		rc |= push(l, P("model.layers.%d.hnorm.weight", i), DT_BF16, H, 0, I_NORM, RD_NONE);
		rc |= push(l, P("model.layers.%d.eh_proj.weight", i), DT_BF16, H, 2 * H, I_LINEAR,
			   RD_NONE);
		rc |= push(l, P("model.layers.%d.shared_head.norm.weight", i), DT_BF16, H, 0, I_NORM,
			   RD_NONE);
		rc |= push(l, P("model.layers.%d.embed_tokens.weight", i), DT_BF16, d->vocab, H,
			   I_EMBED, RD_NONE);
		rc |= push(l, P("model.layers.%d.shared_head.head.weight", i), DT_BF16, d->vocab, H,
			   I_LINEAR, RD_NONE);
	}
	return rc ? -1 : 0;
}

static int build(struct list *l, const struct dims *d)
{
	int rc = push(l, "model.embed_tokens.weight", DT_BF16, d->vocab, d->hidden, I_EMBED,
		      RD_EMBED_ROW);
	for (int i = 0; i < d->layers + (d->mtp ? 1 : 0) && !rc; i++)
		rc = layer(l, d, i);
	if (!rc)
		rc = push(l, "model.norm.weight", DT_BF16, d->hidden, 0, I_NORM, RD_ALL);
	if (!rc)
		rc = push(l, "lm_head.weight", DT_BF16, d->vocab, d->hidden, I_LINEAR, RD_ALL);
	return rc;
}

/* ---- tensor data --------------------------------------------------------------------------- */

static void put(void *dst, enum dt_type dt, size_t i, float f)
{
	if (dt == DT_F32)
		((float *)dst)[i] = f;
	else
		((uint16_t *)dst)[i] = dt_f32_to_bf16(f);
}

/* dt_f32_to_e4m3 (round to nearest even, saturating) with a bit-arithmetic path for normal
 * values: the generator converts a billion weights for the bench preset. */
static uint8_t to_e4m3(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t a = u & 0x7fffffffu;
	if (a < 0x3c800000u || a >= 0x43e00000u) /* below 2^-6 (subnormal) or >= 448 or NaN */
		return dt_f32_to_e4m3(f);
	a += 0x7ffffu + ((a >> 20) & 1u); /* round the mantissa to 3 bits, ties to even */
	uint32_t code = (((a >> 23) - 127 + 7) << 3) | ((a >> 20) & 7u);
	if (code > 0x7e)
		code = 0x7e;
	return (uint8_t)((u >> 24 & 0x80u) | code);
}

/* --mtp-oracle: what tensor `name` holds instead of random values: 0 zero, 1 ones (a norm),
 * 2 [I | 0] (eh_proj); -1 random as ever. */
static int oracle_kind(const struct dims *d, const char *name, enum init in)
{
	if (d->n_say && (!strcmp(name, "model.embed_tokens.weight") ||
			 !strcmp(name, "lm_head.weight")))
		return 3;
	if (!d->oracle && !d->n_say)
		return -1;
	if (wk_ends_with(name, "self_attn.o_proj.weight") || wk_ends_with(name, "down_proj.weight"))
		return 0;
	if (in == I_NORM)
		return 1;
	return wk_ends_with(name, "eh_proj.weight") ? 2 : -1;
}

/* --say: the embedding's or lm_head's value at (row, col). */
static float say_value(const struct dims *d, const char *name, int64_t row, int64_t col)
{
	bool head = !strcmp(name, "lm_head.weight");
	for (int i = 0; i + 1 < d->n_say; i++)
		if (col == i && row == d->say[i + (head ? 1 : 0)])
			return head ? 4.0f : 1.0f;
	return 0.0f;
}

/* Fills s's data (and, for an FP8 weight, its scale_inv at *scale) into fresh buffers. */
static int materialize(const struct dims *d, const struct spec *s, void **data, void **scale)
{
	struct rng r = rng_for(d->seed, s->name);
	int64_t rows = s->rows, cols = s->cols ? s->cols : 1;
	int ok = oracle_kind(d, s->name, s->init);
	*data = malloc(s->nbytes ? s->nbytes : 1);
	*scale = NULL;
	if (!*data)
		return -1;
	if (s->dt != DT_F8_E4M3) {
		for (size_t i = 0; i < (size_t)(rows * cols); i++) {
			float v = draw(&r, s->init, cols);
			if (ok >= 0)
				v = ok == 1 ? 1.0f : ok == 2 && (int64_t)i % cols == (int64_t)i / cols;
			if (ok == 3)
				v = say_value(d, s->name, (int64_t)i / cols, (int64_t)i % cols);
			put(*data, s->dt, i, v);
		}
		return 0;
	}
	/* FP8: one strip of up to 128 rows at a time; scale = block amax / 448. */
	int64_t br = cdiv(rows, BLK), bc = cdiv(cols, BLK);
	float *sc = malloc((size_t)(br * bc) * sizeof *sc);
	float *strip = malloc((size_t)(BLK * cols) * sizeof *strip);
	if (!sc || !strip) {
		free(sc);
		free(strip);
		return -1;
	}
	uint8_t *q = *data;
	for (int64_t b = 0; b < br; b++) {
		int64_t r0 = b * BLK, nr = rows - r0 < BLK ? rows - r0 : BLK;
		for (int64_t i = 0; i < nr * cols; i++)
			strip[i] = ok == 0 ? 0.0f : draw(&r, I_LINEAR, cols);
		for (int64_t c = 0; c < bc; c++) {
			int64_t c0 = c * BLK, nc = cols - c0 < BLK ? cols - c0 : BLK;
			float amax = 0.0f;
			for (int64_t i = 0; i < nr; i++)
				for (int64_t j = 0; j < nc; j++)
					amax = fmaxf(amax, fabsf(strip[i * cols + c0 + j]));
			float scl = amax > 0.0f ? amax / E4M3_MAX : 1.0f, inv = 1.0f / scl;
			sc[b * bc + c] = scl;
			for (int64_t i = 0; i < nr; i++)
				for (int64_t j = 0; j < nc; j++)
					q[(r0 + i) * cols + c0 + j] =
						to_e4m3(strip[i * cols + c0 + j] * inv);
		}
	}
	free(strip);
	*scale = sc;
	return 0;
}

/* ---- files --------------------------------------------------------------------------------- */

static int write_json(const char *dir, const char *file, json_t *j)
{
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
	if (!s)
		return -1;
	char path[4096], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	int rc = wk_write_file(path, s, strlen(s), err, sizeof err);
	free(s);
	if (rc)
		fprintf(stderr, "gen_glm: %s\n", err);
	return rc;
}

#define SETI(k, v) json_object_set_new(c, k, json_integer(v))
#define SETR(k, v) json_object_set_new(c, k, json_real(v))
#define SETB(k, v) json_object_set_new(c, k, json_boolean(v))
#define SETS(k, v) json_object_set_new(c, k, json_string(v))

/* config.json with every key the real release carries (glm.md §1.2, §1.3), tiny values. */
static int write_config(const char *dir, const struct dims *d, const struct list *l)
{
	json_t *c = json_object();
	bool g5 = d->fam == GLM5;
	json_object_set_new(c, "architectures",
			    json_pack("[s]", g5 ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"));
	SETS("model_type", g5 ? "glm_moe_dsa" : "glm4_moe");
	SETB("attention_bias", !g5);
	SETR("attention_dropout", 0.0);
	/* the real stop ids (GLM-5's <|endoftext|>, <|user|>, <|observation|>) where the
	 * vocabulary is GLM-5's; past a tiny one, its last ids instead */
	bool real = g5 && d->vocab >= 154880;
	json_object_set_new(c, "eos_token_id",
			    real ? json_pack("[i,i,i]", 154820, 154827, 154829)
				 : json_pack("[i,i,i]", d->vocab - 4, d->vocab - 3, d->vocab - 2));
	SETI("pad_token_id", real ? 154820 : d->vocab - 4);
	SETI("first_k_dense_replace", d->first_dense);
	SETS("hidden_act", "silu");
	SETI("hidden_size", d->hidden);
	SETR("initializer_range", 0.02);
	SETI("intermediate_size", d->inter);
	SETI("max_position_embeddings", d->max_pos);
	SETI("moe_intermediate_size", d->moe_inter);
	SETI("n_group", d->n_group);
	SETI("n_routed_experts", d->experts);
	SETI("n_shared_experts", d->shared);
	SETB("norm_topk_prob", 1);
	SETI("num_attention_heads", d->heads);
	SETI("num_experts_per_tok", d->topk);
	SETI("num_hidden_layers", d->layers);
	SETI("num_nextn_predict_layers", d->mtp ? 1 : 0);
	SETR("rms_norm_eps", 1e-5);
	SETR("routed_scaling_factor", d->scaling);
	SETB("tie_word_embeddings", 0);
	SETI("topk_group", d->topk_group);
	SETB("use_cache", 1);
	SETI("vocab_size", d->vocab);
	if (g5) {
		SETI("num_key_value_heads", d->heads);
		SETI("q_lora_rank", d->q_lora);
		SETI("kv_lora_rank", d->kv_lora);
		SETI("qk_nope_head_dim", d->nope);
		SETI("qk_rope_head_dim", d->rope);
		SETI("qk_head_dim", d->nope + d->rope);
		SETI("v_head_dim", d->v_head);
		SETI("head_dim", d->rope);
		json_object_set_new(c, "rope_parameters",
				    json_pack("{s:i,s:s}", "rope_theta", 1000000, "rope_type",
					      "default"));
		SETB("rope_interleave", 1);
		SETB("indexer_rope_interleave", 1);
		SETI("moe_layer_freq", 1);
		SETS("scoring_func", "sigmoid");
		SETS("topk_method", "noaux_tc");
		SETI("index_n_heads", d->index_heads);
		SETI("index_head_dim", d->index_dim);
		SETI("index_topk", d->index_topk);
		SETI("ep_size", 1);
		SETI("pretraining_tp", 1);
		SETS("dtype", "bfloat16");
		SETS("transformers_version", "5.0.2.dev0");
		if (d->fp8) {
			/* DeepSeek-style block FP8 (glm.md §2.2). modules_to_not_convert lists the
			 * BF16 linear modules; the real list is not established (§6). */
			json_t *keep = json_pack("[s,s]", "model.embed_tokens", "lm_head");
			for (size_t i = 0; i < l->n; i++) {
				const char *n = l->v[i].name;
				size_t len = strlen(n);
				if (l->v[i].rank == 2 && l->v[i].dt == DT_BF16 && len > 7 &&
				    !strcmp(n + len - 7, ".weight") &&
				    strncmp(n, "model.embed", 11) && strcmp(n, "lm_head.weight"))
					json_array_append_new(keep, json_stringn(n, len - 7));
			}
			json_object_set_new(
				c, "quantization_config",
				json_pack("{s:s,s:s,s:s,s:[i,i],s:o}", "activation_scheme", "dynamic",
					  "fmt", "e4m3", "quant_method", "fp8", "weight_block_size",
					  BLK, BLK, "modules_to_not_convert", keep));
		}
	} else {
		SETI("num_key_value_heads", d->kv_heads);
		SETI("head_dim", d->head_dim);
		SETR("partial_rotary_factor", d->partial_rotary);
		json_object_set_new(c, "rope_scaling", json_null());
		SETI("rope_theta", 1000000);
		SETB("use_qk_norm", d->qk_norm);
		SETS("torch_dtype", "bfloat16");
		SETS("transformers_version", "4.54.0");
	}
	int rc = write_json(dir, "config.json", c);
	json_decref(c);
	return rc;
}

/* Splits the list into d->shards files of about equal bytes (a weight and its scale_inv
 * stay together), writes them and, for more than one, model.safetensors.index.json. */
static int write_weights(const char *dir, const struct dims *d, const struct list *l)
{
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++)
		total += l->v[i].nbytes;
	int ns = d->shards;
	size_t *start = calloc((size_t)ns + 1, sizeof *start);
	struct st_out *o = calloc(l->n, sizeof *o);
	json_t *map = json_object();
	int rc = start && o && map ? 0 : -1;
	/* shard k starts at the first group whose running byte count passes k * total / ns */
	uint64_t run = 0;
	int k = 1;
	for (size_t i = 0; i < l->n && !rc; i++) {
		if (!l->v[i].is_scale && k < ns && run >= (uint64_t)((double)total * k / ns))
			start[k++] = i;
		run += l->v[i].nbytes;
	}
	if (!rc && k < ns) {
		fprintf(stderr, "gen_glm: too few tensors for %d shards\n", ns);
		rc = -1;
	}
	if (!rc)
		start[ns] = l->n;
	for (int s = 0; s < ns && !rc; s++) {
		char file[64], path[4096], err[WK_ERRSZ];
		if (ns == 1)
			snprintf(file, sizeof file, "model.safetensors");
		else
			snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, ns);
		size_t a = start[s], b = start[s + 1];
		for (size_t i = a; i < b; i++) {
			const struct spec *sp = &l->v[i];
			o[i] = (struct st_out){.name = sp->name, .dtype = sp->dt, .rank = sp->rank,
					       .shape = {sp->rows, sp->cols}};
			json_object_set_new(map, sp->name, json_string(file));
		}
		for (size_t i = a; i < b && !rc; i++) {
			if (l->v[i].is_scale)
				continue; /* filled with its weight, the tensor before it */
			void *data, *scale;
			rc = materialize(d, &l->v[i], &data, &scale);
			o[i].data = data;
			if (scale)
				o[i + 1].data = scale;
			if (rc)
				fprintf(stderr, "gen_glm: out of memory\n");
		}
		snprintf(path, sizeof path, "%s/%s", dir, file);
		if (!rc && st_write(path, o + a, b - a, "{\"format\":\"pt\"}", err, sizeof err)) {
			fprintf(stderr, "gen_glm: %s\n", err);
			rc = -1;
		}
		for (size_t i = a; i < b; i++) {
			free((void *)o[i].data);
			o[i].data = NULL;
		}
	}
	if (!rc && ns > 1) {
		json_t *idx = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)total,
					"weight_map", map);
		rc = idx ? write_json(dir, "model.safetensors.index.json", idx) : -1;
		json_decref(idx);
	}
	json_decref(map);
	free(o);
	free(start);
	return rc;
}

/* ---- bytes per decoded token --------------------------------------------------------------- */

static uint64_t llc_bytes(void)
{
	uint64_t best = 0;
	for (int i = 0; i < 8; i++) {
		char path[128], buf[64];
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof buf, f)) {
			char *end;
			uint64_t v = strtoull(buf, &end, 10);
			if (*end == 'K')
				v <<= 10;
			else if (*end == 'M')
				v <<= 20;
			if (v > best)
				best = v;
		}
		fclose(f);
	}
	return best;
}

static void report(const char *dir, const struct dims *d, const struct list *l)
{
	uint64_t total = 0, all = 0, expert = 0, embed_row = 0;
	for (size_t i = 0; i < l->n; i++) {
		const struct spec *s = &l->v[i];
		total += s->nbytes;
		if (s->reads == RD_ALL)
			all += s->nbytes;
		else if (s->reads == RD_EXPERT)
			expert += s->nbytes;
		else if (s->reads == RD_EMBED_ROW)
			embed_row = (uint64_t)s->cols * dt_size(s->dt);
	}
	/* every expert of a layer has the same size, so the active share is topk / experts */
	uint64_t active = expert / (uint64_t)d->experts * (uint64_t)d->topk;
	uint64_t per_token = all + active + embed_row, llc = llc_bytes();
	printf("gen_glm: wrote %s: %s %s, %zu tensors, %.1f MiB in %d file(s)\n", dir,
	       d->fam == GLM5 ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM",
	       d->fp8 ? "FP8" : "BF16", l->n, total / 1048576.0, d->shards);
	printf("gen_glm: bytes read per decoded token: %llu (%.1f MiB: %.1f MiB of active routed "
	       "experts, %.1f MiB of everything else)",
	       (unsigned long long)per_token, per_token / 1048576.0, active / 1048576.0,
	       (all + embed_row) / 1048576.0);
	if (llc)
		printf("; last-level cache %.0f MiB, ratio %.1fx", llc / 1048576.0,
		       (double)per_token / (double)llc);
	printf("\n");
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gen_glm --family glm5|glm4 -o DIR [--seed S] [--shards N] [--mtp] [sizes]\n"
		"       gen_glm --preset bench-1g|glm5-structure -o DIR [--seed S] [--shards N]\n"
		"--mtp-oracle (with --mtp): layers that add nothing and an MTP layer that is always\n"
		"  right (the best case of its drafts; see the top of gen_glm.c)\n"
		"--say T0,T1,...: a model that says T1, T2, ... after a prompt that ends with T0\n"
		"sizes (tiny defaults in brackets, glm5 / glm4 where they differ):\n"
		"  --hidden 200  --layers 4  --first-dense 1  --heads 4/6  --vocab 300  --max-pos 256\n"
		"  --intermediate 320  --moe-intermediate 80  --experts 16  --experts-per-tok 4\n"
		"  --shared-experts 1  --n-group 4  --topk-group 2  --routed-scaling 2.5\n"
		"  glm5: --q-lora-rank 96  --kv-lora-rank 136  --qk-nope-dim 24  --qk-rope-dim 16\n"
		"        --v-head-dim 32  --index-heads 4  --index-head-dim 32  --index-topk 4\n"
		"        --dtype fp8|bf16 (fp8)\n"
		"  glm4: --kv-heads 2  --head-dim 40  --partial-rotary 0.5  --no-qk-norm\n"
		"--preset bench-1g: GLM-5 FP8, ~1.4 GiB, ~340 MiB read per decoded token, 4 shards.\n"
		"--preset glm5-structure: GLM-5's 78 layers, 256 experts (top 8) and indexers at\n"
		"  tiny sizes, for counting launches (wick bench launches).\n");
}

static int parse_int(const char *s, const char *what, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v <= 0 || v > (1 << 24)) {
		fprintf(stderr, "gen_glm: --%s wants a positive integer, not '%s'\n", what, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

static void defaults(struct dims *d, enum family fam)
{
	*d = (struct dims){.fam = fam, .fp8 = fam == GLM5, .hidden = 200, .layers = 4,
			   .heads = fam == GLM5 ? 4 : 6, .vocab = 300, .max_pos = 256,
			   .inter = 320, .moe_inter = 80, .experts = 16, .topk = 4, .shared = 1,
			   .n_group = 4, .topk_group = 2, .first_dense = 1, .q_lora = 96,
			   .kv_lora = 136, .nope = 24, .rope = 16, .v_head = 32, .index_heads = 4,
			   .index_dim = 32, .index_topk = 4, .kv_heads = 2, .head_dim = 40,
			   .qk_norm = 1, .scaling = 2.5, .partial_rotary = 0.5, .shards = 1,
			   .seed = 1};
}

/* GLM-5 architecture at a size whose decode reads ~340 MiB per token (> 8x a 32 MiB L3). */
static void preset_bench(struct dims *d)
{
	defaults(d, GLM5);
	d->hidden = 2048;
	d->layers = 7;
	d->first_dense = 1;
	d->heads = 16;
	d->vocab = 16384;
	d->max_pos = 4096;
	d->inter = 4096;
	d->moe_inter = 512;
	d->experts = 64;
	d->topk = 8;
	d->n_group = 1;
	d->topk_group = 1;
	d->q_lora = 768;
	d->kv_lora = 512;
	d->nope = 128;
	d->rope = 64;
	d->v_head = 128;
	d->index_heads = 16;
	d->index_dim = 128;
	d->index_topk = 256;
	d->shards = 4;
}

/* GLM-5's structure (glm.md 1: 78 layers, the first 3 dense; 256 routed experts, 8 per token,
 * no group limit; one shared expert; an indexer on every layer) at tiny dimensions, for
 * counting what a decode step launches (`wick bench launches`): the count follows the
 * structure, not the sizes. index_topk 64 instead of 2048, so that a context past 64 runs
 * the sparse (selecting) path as GLM-5 does past 2048. */
static void preset_structure(struct dims *d)
{
	defaults(d, GLM5);
	d->hidden = 64;
	d->layers = 78;
	d->first_dense = 3;
	d->heads = 8;
	d->vocab = 256;
	d->max_pos = 512;
	d->inter = 64;
	d->moe_inter = 32;
	d->experts = 256;
	d->topk = 8;
	d->n_group = 1;
	d->topk_group = 1;
	d->q_lora = 32;
	d->kv_lora = 128; /* a whole FP8 block, as GLM-5's 512 */
	d->nope = 16;
	d->rope = 8;
	d->v_head = 16;
	d->index_heads = 4;
	d->index_dim = 16;
	d->index_topk = 64;
}

static const char *check(const struct dims *d)
{
	if (d->oracle && !d->mtp)
		return "--mtp-oracle needs --mtp (it is about the MTP layer)";
	for (int i = 0; i < d->n_say; i++) {
		if (d->say[i] < 0 || d->say[i] >= d->vocab)
			return "--say: a token id outside --vocab";
		for (int k = 0; k < i && i + 1 < d->n_say; k++)
			if (d->say[k] == d->say[i])
				return "--say: a token before the last appears twice";
	}
	if (d->n_say > d->hidden)
		return "--say: more tokens than --hidden";
	if (d->first_dense > d->layers)
		return "--first-dense is more than --layers";
	if (d->experts % d->n_group || d->experts / d->n_group < 2)
		return "--experts must split into --n-group groups of at least 2 experts";
	if (d->topk_group > d->n_group)
		return "--topk-group is more than --n-group";
	if (d->topk > d->topk_group * (d->experts / d->n_group))
		return "--experts-per-tok is more than the experts in --topk-group groups";
	if (d->vocab < 8)
		return "--vocab must be at least 8";
	if (d->fam == GLM5 && (d->rope % 2 || d->index_dim <= d->rope))
		return "--qk-rope-dim must be even and less than --index-head-dim";
	if (d->fam == GLM4) {
		if (d->heads % d->kv_heads)
			return "--heads must be a multiple of --kv-heads";
		int rot = (int)(d->head_dim * d->partial_rotary);
		if (rot < 2 || rot % 2 || rot > d->head_dim)
			return "--head-dim * --partial-rotary must be even and within the head";
		if (d->fp8)
			return "--dtype fp8 is GLM-5 only (GLM-4.x FP8 is compressed-tensors)";
	}
	return NULL;
}

int main(int argc, char **argv)
{
	enum { O_FAMILY = 256, O_PRESET, O_SEED, O_SHARDS, O_MTP, O_DTYPE, O_NOQKN, O_SCALING,
	       O_PARTIAL, O_ORACLE, O_SAY, O_INT };
	static const char *int_names[] = {
		"hidden", "layers", "first-dense", "heads", "vocab", "max-pos", "intermediate",
		"moe-intermediate", "experts", "experts-per-tok", "shared-experts", "n-group",
		"topk-group", "q-lora-rank", "kv-lora-rank", "qk-nope-dim", "qk-rope-dim",
		"v-head-dim", "index-heads", "index-head-dim", "index-topk", "kv-heads", "head-dim",
	};
	enum { NI = sizeof int_names / sizeof int_names[0] };
	struct option opts[NI + 14];
	int n = 0;
	opts[n++] = (struct option){"family", required_argument, NULL, O_FAMILY};
	opts[n++] = (struct option){"preset", required_argument, NULL, O_PRESET};
	opts[n++] = (struct option){"seed", required_argument, NULL, O_SEED};
	opts[n++] = (struct option){"shards", required_argument, NULL, O_SHARDS};
	opts[n++] = (struct option){"mtp", no_argument, NULL, O_MTP};
	opts[n++] = (struct option){"mtp-oracle", no_argument, NULL, O_ORACLE};
	opts[n++] = (struct option){"say", required_argument, NULL, O_SAY};
	opts[n++] = (struct option){"dtype", required_argument, NULL, O_DTYPE};
	opts[n++] = (struct option){"no-qk-norm", no_argument, NULL, O_NOQKN};
	opts[n++] = (struct option){"routed-scaling", required_argument, NULL, O_SCALING};
	opts[n++] = (struct option){"partial-rotary", required_argument, NULL, O_PARTIAL};
	opts[n++] = (struct option){"out", required_argument, NULL, 'o'};
	opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
	for (int i = 0; i < NI; i++)
		opts[n++] = (struct option){int_names[i], required_argument, NULL, O_INT + i};
	opts[n] = (struct option){NULL, 0, NULL, 0};

	/* Family or preset first, so the size flags override its defaults in any order. */
	struct dims d;
	const char *fam = NULL, *preset = NULL, *dir = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--family") && i + 1 < argc)
			fam = argv[i + 1];
		else if (!strncmp(argv[i], "--family=", 9))
			fam = argv[i] + 9;
		else if (!strcmp(argv[i], "--preset") && i + 1 < argc)
			preset = argv[i + 1];
		else if (!strncmp(argv[i], "--preset=", 9))
			preset = argv[i] + 9;
	}
	if (preset) {
		if (strcmp(preset, "bench-1g") && strcmp(preset, "glm5-structure")) {
			fprintf(stderr, "gen_glm: unknown --preset '%s' (there are bench-1g and "
					"glm5-structure)\n", preset);
			return 2;
		}
		if (fam && strcmp(fam, "glm5")) {
			fprintf(stderr, "gen_glm: --preset %s is a glm5 model\n", preset);
			return 2;
		}
		if (!strcmp(preset, "bench-1g"))
			preset_bench(&d);
		else
			preset_structure(&d);
	} else if (fam && (!strcmp(fam, "glm5") || !strcmp(fam, "glm4"))) {
		defaults(&d, !strcmp(fam, "glm5") ? GLM5 : GLM4);
	} else {
		if (fam)
			fprintf(stderr, "gen_glm: --family is glm5 or glm4, not '%s'\n", fam);
		usage(stderr);
		return 2;
	}

	int *ints[NI] = {&d.hidden, &d.layers, &d.first_dense, &d.heads, &d.vocab, &d.max_pos,
			 &d.inter, &d.moe_inter, &d.experts, &d.topk, &d.shared, &d.n_group,
			 &d.topk_group, &d.q_lora, &d.kv_lora, &d.nope, &d.rope, &d.v_head,
			 &d.index_heads, &d.index_dim, &d.index_topk, &d.kv_heads, &d.head_dim};
	int c, bad = 0;
	char *end;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': dir = optarg; break;
		case 'h': usage(stdout); return 0;
		case O_FAMILY: case O_PRESET: break;
		case O_SEED: d.seed = strtoull(optarg, NULL, 10); break;
		case O_SHARDS: bad |= parse_int(optarg, "shards", &d.shards); break;
		case O_MTP: d.mtp = 1; break;
		case O_ORACLE: d.oracle = 1; break;
		case O_SAY:
			for (char *p = optarg; *p;) {
				long v = strtol(p, &end, 10);
				if (end == p || d.n_say == 64 || (*end && *end != ',')) {
					fprintf(stderr, "gen_glm: --say wants up to 64 ids, 1,2,3\n");
					bad = 1;
					break;
				}
				d.say[d.n_say++] = (int)v;
				p = *end ? end + 1 : end;
			}
			break;
		case O_NOQKN: d.qk_norm = 0; break;
		case O_DTYPE:
			if (!strcmp(optarg, "fp8") || !strcmp(optarg, "bf16")) {
				d.fp8 = !strcmp(optarg, "fp8");
			} else {
				fprintf(stderr, "gen_glm: --dtype is fp8 or bf16\n");
				bad = 1;
			}
			break;
		case O_SCALING:
		case O_PARTIAL: {
			double v = strtod(optarg, &end);
			if (*end || !(v > 0) || v > 100) {
				fprintf(stderr, "gen_glm: bad number '%s'\n", optarg);
				bad = 1;
			} else if (c == O_SCALING) {
				d.scaling = v;
			} else {
				d.partial_rotary = v;
			}
			break;
		}
		default:
			if (c >= O_INT && c < O_INT + NI) {
				bad |= parse_int(optarg, int_names[c - O_INT], ints[c - O_INT]);
				break;
			}
			usage(stderr);
			return 2;
		}
	}
	if (bad)
		return 2;
	if (!dir || optind != argc) {
		usage(stderr);
		return 2;
	}
	const char *why = check(&d);
	if (why) {
		fprintf(stderr, "gen_glm: %s\n", why);
		return 2;
	}
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "gen_glm: mkdir %s: %s\n", dir, strerror(errno));
		return 1;
	}
	struct list l = {0};
	int rc = build(&l, &d);
	if (rc)
		fprintf(stderr, "gen_glm: out of memory\n");
	if (!rc)
		rc = write_weights(dir, &d, &l);
	if (!rc)
		rc = write_config(dir, &d, &l);
	if (!rc)
		report(dir, &d, &l);
	free(l.v);
	return rc ? 1 : 0;
}
