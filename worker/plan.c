/*
 * plan.c - memory planning from config.json alone (see plan.h).
 *
 * Layout rules, per GPU (world = max(tp, ep); the smaller of tp and ep divides it):
 *   attention   heads split over TP: q_b_proj / q_proj rows, kv_b_proj rows, o_proj columns
 *               (GQA: q rows by heads, k/v rows by kv heads, replicated when tp > kv heads).
 *               MLA's q_a_proj and kv_a_proj_with_mqa (the down-projections every head
 *               reads) are replicated, as vLLM and SGLang do.
 *   indexer     the DSA lightning indexer (wq_b, wk, k_norm, weights_proj) is replicated:
 *               its top-k needs the score summed over all index heads for every key, so each
 *               rank runs it whole instead of all-reducing a B x context score matrix.
 *   dense MLP, shared experts   split TP (gate/up rows, down columns).
 *   routed experts  n_routed / ep whole experts per rank, contiguous blocks (expert e on EP
 *               rank e / (n_routed / ep)).
 *   router      gate.weight and e_score_correction_bias replicated.
 *   embeddings, lm_head   vocab-parallel over TP (vocab / tp rows per rank; must divide).
 *   norms       replicated.
 * These are wick's snapshot rules (engine/layout.c, glm.c, glm5.c, shard.c): rank r holds TP
 * shard r mod tp and the experts of EP rank r mod ep. When tp < world the TP shards repeat on
 * world / tp ranks, and when ep < world the experts repeat on world / ep ranks; the engine
 * runs the copies redundantly (every rank sees every token), so the copies cost memory and
 * add no KV capacity: the node holds as many tokens as one GPU does.
 *
 * Dtypes. FP8 weights are float8_e4m3fn plus one f32 scale per weight block (GLM-5-FP8:
 * 128x128 blocks, weight_scale_inv), and cover every linear projection of the decoder
 * layers: attention, the indexer's wq_b and wk, dense MLP, shared and routed experts. A shard
 * of an FP8 checkpoint cut off the block grid (its slice of rows or columns not a multiple of
 * the block) is stored dequantized to f32, as engine/layout.c does. Kept in
 * the checkpoint dtype (glm.md 2.2): embeddings, lm_head, norms, the router gate, the
 * indexer's weights_proj, MTP eh_proj; e_score_correction_bias is f32. Scales are counted on
 * each rank's shard shape: ceil(rows/128) x ceil(cols/128) of the slice it holds.
 * Note: `wick snapshot --dtype fp8` (engine/layout.c fp8_candidate) quantizes only names
 * ending in _proj.weight, so a snapshot cast that way from a bf16 checkpoint keeps
 * kv_a_proj_with_mqa, indexer.wq_b and indexer.wk in bf16 (the FP8 release has them FP8).
 *
 * Workspace per GPU for B = --batch tokens in one step, C = --context, bf16 activations (2 B)
 * unless marked fp32 (4 B); buffers are reused layer to layer, so one layer's worth counts:
 *   hidden  = 4 x B x hidden_size x 4          (residual, normed input, attn and FFN out)
 *   attn    = MLA: B x 2 x (q_lora + Hg*qk_head + (kv_lora + rope) + Hg*(kv_lora + rope)
 *                          + Hg*kv_lora + Hg*v_head)   (Hg = heads / tp; absorbed decode form)
 *             GQA: B x 2 x ((Hg + 2*KVg) x head_dim + Hg x head_dim)
 *             (flash-style attention: no B x C score matrix)
 *   indexer = B x (2 x index_heads x index_dim + 4 x index_heads + 4 x C + 4 x index_topk)
 *             (its B x C fp32 logits dominate at long context)
 *   ffn     = max(dense: B x 2 x 2 x inter/tp,
 *                 MoE: B x (4 x n_routed + 2 x 2 x top_k x hidden_size
 *                           + 2 x 2 x top_k x moe_inter + 2 x 2 x shared/tp))
 *             (dispatch and combine buffers sized for the worst case: every routed copy of
 *             every token lands on this rank)
 *   logits  = B x 4 x (vocab/tp + vocab)       (the local fp32 shard plus the gathered rows)
 *   total   = hidden + max(attn + indexer, ffn) + logits
 *
 * KV cache bytes per token on one GPU:
 *   MLA: layers x (kv_lora + rope) x dtype, replicated on every TP rank (each rank's heads
 *        read the whole latent); fp8 uses the FlashMLA layout, kv_lora e4m3 + one f32 scale
 *        per 128 + rope in bf16 (656 B at GLM-5 sizes);
 *        + DSA keys: full indexer layers x index_dim x dtype (fp8: + one f32 scale per 128).
 *   GQA: layers x 2 x max(1, kv_heads / tp) x head_dim x dtype (fp8: e4m3 + one f32 scale
 *        per 128 of each kv head's row, 132 B a head of 128).
 */
#include "worker/plan.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"

/* ---- config.json ---------------------------------------------------------------------------- */

static void warn(char (*w)[PLAN_WARN_LEN], int *n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void warn(char (*w)[PLAN_WARN_LEN], int *n, const char *fmt, ...)
{
	if (*n >= PLAN_MAX_WARN)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w[*n], PLAN_WARN_LEN, fmt, ap);
	va_end(ap);
	(*n)++;
}

static bool present(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	return v && !json_is_null(v);
}

/* Integer key in [lo, hi]; absent or null -> def, or an error when def < 0 (required). */
static int get_int(json_t *cfg, const char *key, long long def, long long lo, long long hi,
		   int64_t *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v)) {
		if (def < 0)
			return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' is missing", key);
		*out = def;
		return WK_OK;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: '%s' must be an integer from %lld to %lld", key, lo, hi);
	*out = json_integer_value(v);
	return WK_OK;
}

static int get_bool(json_t *cfg, const char *key, bool *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v)) {
		*out = false;
		return WK_OK;
	}
	if (!json_is_boolean(v))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' must be true or false", key);
	*out = json_is_true(v);
	return WK_OK;
}

static bool streq(json_t *v, const char *s)
{
	return json_is_string(v) && !strcmp(json_string_value(v), s);
}

/* Layers 0..layers-1 that are MoE: mlp_layer_types ("dense"/"sparse") when given, else
 * l >= first_k_dense_replace and l % moe_layer_freq == 0 (the DeepSeek rule). */
static int layer_kinds(json_t *cfg, struct plan_model *m, char *err, size_t errsz)
{
	int64_t fkd, freq;
	int rc;
	if ((rc = get_int(cfg, "first_k_dense_replace", 0, 0, m->layers, &fkd, err, errsz)) ||
	    (rc = get_int(cfg, "moe_layer_freq", 1, 1, 4096, &freq, err, errsz)))
		return rc;
	json_t *types = json_object_get(cfg, "mlp_layer_types");
	bool listed = types && !json_is_null(types);
	if (listed && (!json_is_array(types) || (int64_t)json_array_size(types) != m->layers))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: 'mlp_layer_types' must list num_hidden_layers (%lld) "
			       "entries", (long long)m->layers);
	m->moe_layers = 0;
	for (int64_t l = 0; l < m->layers; l++) {
		bool moe = l >= fkd && l % freq == 0;
		if (listed) {
			json_t *t = json_array_get(types, (size_t)l);
			if (!streq(t, "dense") && !streq(t, "sparse"))
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: mlp_layer_types[%lld] must be \"dense\" "
					       "or \"sparse\"", (long long)l);
			moe = streq(t, "sparse");
		}
		m->moe_layers += moe;
	}
	m->dense_layers = m->layers - m->moe_layers;
	return WK_OK;
}

/* Layers with their own indexer, as GlmMoeDsaConfig derives indexer_types (engine/glm5.c
 * indexer_kinds): indexer_types, else index_topk_pattern, else index_topk_freq/offset
 * (default: every layer full). */
static int indexer_layers(json_t *cfg, struct plan_model *m, char *err, size_t errsz)
{
	json_t *types = json_object_get(cfg, "indexer_types");
	json_t *pattern = json_object_get(cfg, "index_topk_pattern");
	int64_t freq, offset;
	int rc;
	if ((rc = get_int(cfg, "index_topk_freq", 1, -4096, 4096, &freq, err, errsz)) ||
	    (rc = get_int(cfg, "index_skip_topk_offset", 2, -4096, 4096, &offset, err, errsz)))
		return rc;
	if (freq < 1)
		freq = 1;
	m->index_full_layers = 0;
	for (int64_t l = 0; l < m->layers; l++) {
		const char *t;
		if (types && !json_is_null(types)) {
			if (!json_is_array(types) || (int64_t)json_array_size(types) != m->layers)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'indexer_types' must list "
					       "num_hidden_layers (%lld) entries", (long long)m->layers);
			t = json_string_value(json_array_get(types, (size_t)l));
		} else if (json_is_string(pattern)) {
			const char *p = json_string_value(pattern);
			if ((int64_t)strlen(p) != m->layers)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'index_topk_pattern' must have "
					       "num_hidden_layers (%lld) letters", (long long)m->layers);
			t = p[l] == 'F' ? "full" : p[l] == 'S' ? "shared" : "?";
		} else if (pattern && !json_is_null(pattern)) {
			if (!json_is_array(pattern) || (int64_t)json_array_size(pattern) != m->layers)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'index_topk_pattern' must list "
					       "num_hidden_layers (%lld) entries", (long long)m->layers);
			t = json_string_value(json_array_get(pattern, (size_t)l));
		} else {
			int64_t k = l - offset + 1;
			t = (k > 0 ? k : 0) % freq == 0 ? "full" : "shared";
		}
		if (!t || (strcmp(t, "full") && strcmp(t, "shared")))
			return wk_errf(err, errsz, WK_EFORMAT,
				       "config.json: indexer type of layer %lld must be \"full\" or "
				       "\"shared\"", (long long)l);
		m->index_full_layers += !strcmp(t, "full");
	}
	return WK_OK;
}

static int read_dtypes(json_t *cfg, struct plan_model *m, char *err, size_t errsz)
{
	json_t *td = json_object_get(cfg, "torch_dtype");
	if (!json_is_string(td))
		td = json_object_get(cfg, "dtype");
	const char *s = json_string_value(td);
	m->kv_auto = s && !strcmp(s, "bfloat16") ? PLAN_BF16 : PLAN_F32;
	if (!s) {
		m->base = PLAN_BF16;
		warn(m->warn, &m->nwarn, "config.json has no torch_dtype/dtype: bf16 assumed");
	} else if (!strcmp(s, "bfloat16")) {
		m->base = PLAN_BF16;
	} else if (!strcmp(s, "float16")) {
		m->base = PLAN_F16;
	} else if (!strcmp(s, "float32")) {
		m->base = PLAN_F32;
	} else {
		m->base = PLAN_BF16;
		warn(m->warn, &m->nwarn, "config.json: torch_dtype '%s' is not a float dtype wick "
		     "knows: bf16 assumed", s);
	}
	json_t *qc = json_object_get(cfg, "quantization_config");
	if (!qc || json_is_null(qc))
		return WK_OK;
	if (!json_is_object(qc))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: 'quantization_config' must be an object");
	const char *qm = json_string_value(json_object_get(qc, "quant_method"));
	if (!qm || strcmp(qm, "fp8") != 0) {
		snprintf(m->quant_note, sizeof m->quant_note, "quant_method %s (not read)",
			 qm ? qm : "?");
		warn(m->warn, &m->nwarn, "quantization_config.quant_method '%s' is not read by "
		     "wick plan: weights default to torch_dtype; pass --weights-dtype",
		     qm ? qm : "?");
		return WK_OK;
	}
	m->fp8 = true;
	json_t *bs = json_object_get(qc, "weight_block_size");
	if (!bs || json_is_null(bs)) {
		m->block_rows = m->block_cols = 0;
		snprintf(m->quant_note, sizeof m->quant_note,
			 "quant_method fp8, one scale per tensor (no weight_block_size)");
		return WK_OK;
	}
	json_t *r = json_array_get(bs, 0), *c = json_array_get(bs, 1);
	if (json_array_size(bs) != 2 || !json_is_integer(r) || !json_is_integer(c) ||
	    json_integer_value(r) < 1 || json_integer_value(r) > 65536 ||
	    json_integer_value(c) < 1 || json_integer_value(c) > 65536)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: quantization_config.weight_block_size must be [rows, "
			       "cols] (positive integers)");
	m->block_rows = (int)json_integer_value(r);
	m->block_cols = (int)json_integer_value(c);
	snprintf(m->quant_note, sizeof m->quant_note, "quant_method fp8, weight_block_size [%d, %d]",
		 m->block_rows, m->block_cols);
	return WK_OK;
}

int plan_model_read(json_t *cfg, struct plan_model *m, char *err, size_t errsz)
{
	int rc;
	memset(m, 0, sizeof *m);
	if (!json_is_object(cfg))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: not a JSON object");
	const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
	const char *mt = json_string_value(json_object_get(cfg, "model_type"));
	snprintf(m->arch, sizeof m->arch, "%s", arch ? arch : "?");
	snprintf(m->model_type, sizeof m->model_type, "%s", mt ? mt : "?");
	static const char *const known[] = {"LlamaForCausalLM", "Glm4MoeForCausalLM",
					    "GlmMoeDsaForCausalLM"};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		m->known_arch |= arch && !strcmp(arch, known[i]);
	if (!m->known_arch)
		warn(m->warn, &m->nwarn, "architecture '%s' is not one wick's engine runs: the plan "
		     "uses the generic decoder (GQA or MLA, dense MLP or DeepSeek-style MoE)", m->arch);

	if ((rc = get_int(cfg, "hidden_size", -1, 1, 1 << 20, &m->dim, err, errsz)) ||
	    (rc = get_int(cfg, "vocab_size", -1, 1, 1 << 26, &m->vocab, err, errsz)) ||
	    (rc = get_int(cfg, "num_hidden_layers", -1, 1, 4096, &m->layers, err, errsz)) ||
	    (rc = get_int(cfg, "num_attention_heads", -1, 1, 1 << 16, &m->heads, err, errsz)) ||
	    (rc = get_int(cfg, "max_position_embeddings", 0, 0, 1LL << 32, &m->max_pos, err,
			  errsz)) ||
	    (rc = get_int(cfg, "num_nextn_predict_layers", 0, 0, 64, &m->mtp_layers, err, errsz)) ||
	    (rc = get_bool(cfg, "tie_word_embeddings", &m->tied, err, errsz)) ||
	    (rc = get_bool(cfg, "attention_bias", &m->attn_bias, err, errsz)) ||
	    (rc = read_dtypes(cfg, m, err, errsz)))
		return rc;

	/* attention */
	m->mla = present(cfg, "kv_lora_rank");
	if (m->mla) {
		json_t *ql = json_object_get(cfg, "q_lora_rank");
		if ((rc = get_int(cfg, "kv_lora_rank", -1, 1, 1 << 20, &m->kv_lora, err, errsz)) ||
		    (rc = get_int(cfg, "q_lora_rank", 0, 1, 1 << 20, &m->q_lora, err, errsz)) ||
		    (rc = get_int(cfg, "qk_nope_head_dim", -1, 0, 1 << 16, &m->qk_nope, err, errsz)) ||
		    (rc = get_int(cfg, "qk_rope_head_dim", -1, 0, 1 << 16, &m->qk_rope, err, errsz)) ||
		    (rc = get_int(cfg, "v_head_dim", -1, 1, 1 << 16, &m->v_head, err, errsz)))
			return rc;
		if (!ql || json_is_null(ql))
			m->q_lora = 0; /* a plain q_proj */
		m->kv_heads = m->heads; /* MLA: every head reads the one latent */
		m->dsa = present(cfg, "index_n_heads");
		if (m->dsa &&
		    ((rc = get_int(cfg, "index_n_heads", -1, 1, 1 << 16, &m->index_heads, err,
				   errsz)) ||
		     (rc = get_int(cfg, "index_head_dim", -1, 1, 1 << 16, &m->index_dim, err,
				   errsz)) ||
		     (rc = get_int(cfg, "index_topk", -1, 1, 1LL << 32, &m->index_topk, err, errsz)) ||
		     (rc = indexer_layers(cfg, m, err, errsz))))
			return rc;
		if (m->attn_bias)
			warn(m->warn, &m->nwarn, "attention_bias with MLA: biases not counted");
	} else {
		if ((rc = get_int(cfg, "num_key_value_heads", m->heads, 1, m->heads, &m->kv_heads, err,
				  errsz)) ||
		    (rc = get_int(cfg, "head_dim", m->dim / m->heads, 1, 1 << 16, &m->head_dim, err,
				  errsz)) ||
		    (rc = get_bool(cfg, "use_qk_norm", &m->qk_norm, err, errsz)))
			return rc;
		if (m->heads % m->kv_heads != 0)
			return wk_errf(err, errsz, WK_EFORMAT,
				       "config.json: num_attention_heads %lld is not a multiple of "
				       "num_key_value_heads %lld", (long long)m->heads,
				       (long long)m->kv_heads);
	}

	/* MLP / MoE */
	if (!present(cfg, "n_routed_experts") &&
	    (present(cfg, "num_local_experts") || present(cfg, "num_experts")))
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: '%s' (Mixtral/Qwen-style MoE) is not understood by "
			       "wick plan; it reads DeepSeek/GLM-style n_routed_experts",
			       present(cfg, "num_local_experts") ? "num_local_experts"
								 : "num_experts");
	if ((rc = get_int(cfg, "n_routed_experts", 0, 0, 1 << 20, &m->n_routed, err, errsz)))
		return rc;
	if (m->n_routed > 0) {
		if ((rc = get_int(cfg, "moe_intermediate_size", -1, 1, 1 << 24, &m->moe_inter, err,
				  errsz)) ||
		    (rc = get_int(cfg, "n_shared_experts", 1, 0, 1024, &m->n_shared, err, errsz)) ||
		    (rc = get_int(cfg, "num_experts_per_tok", -1, 1, m->n_routed, &m->top_k, err,
				  errsz)) ||
		    (rc = layer_kinds(cfg, m, err, errsz)))
			return rc;
	} else {
		m->dense_layers = m->layers;
	}
	if (m->dense_layers > 0 || m->mtp_layers > 0) {
		if ((rc = get_int(cfg, "intermediate_size", m->dense_layers > 0 ? -1 : 0, 0, 1 << 24,
				  &m->inter, err, errsz)))
			return rc;
	}
	return WK_OK;
}

/* ---- sizes and dtypes ----------------------------------------------------------------------- */

int plan_parse_size(const char *s, uint64_t *out, char *err, size_t errsz)
{
	static const struct {
		const char *unit;
		double mult;
	} units[] = {
		{"B", 1},      {"KB", 1e3},       {"KiB", 1024.0},       {"MB", 1e6},
		{"MiB", 1048576.0}, {"GB", 1e9},  {"GiB", 1073741824.0}, {"TB", 1e12},
		{"TiB", 1099511627776.0},
	};
	const char *p = s;
	if (!s || !*s)
		return wk_errf(err, errsz, WK_EINVAL, "empty size (want e.g. 141GB or 140GiB)");
	while (isdigit((unsigned char)*p))
		p++;
	bool frac = *p == '.';
	if (frac) {
		p++;
		while (isdigit((unsigned char)*p))
			p++;
	}
	if (p == s || (frac && p == s + 1))
		return wk_errf(err, errsz, WK_EINVAL,
			       "'%s' is not a size (want a number and a unit: 141GB, 140GiB, 2TB; a "
			       "bare number is bytes)", s);
	const char *unit = p;
	if (*unit == ' ')
		unit++;
	double mult = 0;
	if (!*unit) {
		if (frac)
			return wk_errf(err, errsz, WK_EINVAL,
				       "'%s': a fractional size needs a unit (GB, GiB, ...)", s);
		mult = 1;
	} else {
		for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
			if (!strcasecmp(unit, units[i].unit))
				mult = units[i].mult;
		if (mult == 0)
			return wk_errf(err, errsz, WK_EINVAL,
				       "'%s': unknown unit '%s' (use B, KB, KiB, MB, MiB, GB, GiB, TB "
				       "or TiB; GB = 10^9 bytes, GiB = 2^30)", s, unit);
	}
	errno = 0;
	double v = strtod(s, NULL) * mult;
	if (errno || !(v >= 1) || v > (double)(1ULL << 60))
		return wk_errf(err, errsz, WK_EINVAL, "'%s' is out of range (1 byte to 1 EiB)", s);
	*out = (uint64_t)v;
	return WK_OK;
}

static const char *const dtype_names[PLAN_NDTYPE] = {"f32", "bf16", "f16", "fp8"};

int plan_parse_dtype(const char *s, enum plan_dtype *out)
{
	static const struct {
		const char *name;
		enum plan_dtype d;
	} names[] = {{"fp8", PLAN_FP8}, {"bf16", PLAN_BF16}, {"f16", PLAN_F16}, {"fp16", PLAN_F16},
		     {"f32", PLAN_F32}, {"fp32", PLAN_F32}};
	for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(s, names[i].name)) {
			*out = names[i].d;
			return WK_OK;
		}
	return WK_EINVAL;
}

const char *plan_dtype_name(enum plan_dtype d)
{
	return (int)d >= 0 && (int)d < PLAN_NDTYPE ? dtype_names[d] : "?";
}

static uint64_t dsize(enum plan_dtype d)
{
	return d == PLAN_F32 ? 4 : d == PLAN_FP8 ? 1 : 2;
}

/* ---- weights -------------------------------------------------------------------------------- */

enum wclass {
	W_LINEAR, /* a decoder linear projection: FP8 (with block scales) when the weights are */
	W_KEEP,   /* a matrix kept in the checkpoint dtype under FP8 (embeddings, router, ...) */
	W_VEC,    /* norms and biases: the checkpoint dtype */
	W_F32,    /* e_score_correction_bias */
};

struct ctx {
	const struct plan_model *m;
	struct plan_result *r;
	int64_t tp;
	enum plan_dtype w;            /* weights dtype */
	int64_t br, bc;               /* fp8 block; 0 0: one scale per tensor */
	bool dequant;                 /* FP8 source: off-grid shards become f32 */
	bool *overflow;               /* set when a count does not fit in 64 bits */
};

/* a * b and *sum += v, saturating and flagging a count past 64 bits (the config's ranges
 * allow models whose byte counts would wrap: negative sizes in the plan) */
static uint64_t mul(const struct ctx *c, uint64_t a, uint64_t b)
{
	uint64_t r;
	if (__builtin_mul_overflow(a, b, &r)) {
		*c->overflow = true;
		return UINT64_MAX;
	}
	return r;
}

static void acc(const struct ctx *c, uint64_t *sum, uint64_t v)
{
	if (__builtin_add_overflow(*sum, v, sum)) {
		*c->overflow = true;
		*sum = UINT64_MAX;
	}
}

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

static uint64_t mbytes(const struct ctx *c, int64_t rows, int64_t cols, enum wclass k)
{
	uint64_t n = mul(c, (uint64_t)rows, (uint64_t)cols), s = 0;
	switch (k) {
	case W_LINEAR:
		if (c->w != PLAN_FP8)
			return mul(c, n, dsize(c->w));
		acc(c, &s, n);
		acc(c, &s, c->br == 0 ? 4
				      : mul(c, mul(c, (uint64_t)cdiv(rows, c->br),
						   (uint64_t)cdiv(cols, c->bc)), 4));
		return s;
	case W_KEEP:
		return mul(c, n, dsize(c->w == PLAN_FP8 ? c->m->base : c->w));
	case W_VEC:
		return mul(c, n, dsize(c->m->base));
	case W_F32:
		return mul(c, n, 4);
	}
	return 0;
}

/* n copies of a [rows][cols] tensor in the model; one GPU holds ng copies of [grows][gcols]. */
static void add(const struct ctx *c, struct plan_part *p, int64_t n, int64_t ng, int64_t rows,
		int64_t cols, int64_t grows, int64_t gcols, enum wclass k)
{
	acc(c, &p->params, mul(c, mul(c, (uint64_t)n, (uint64_t)rows), (uint64_t)cols));
	acc(c, &p->bytes, mul(c, (uint64_t)n, mbytes(c, rows, cols, k)));
	bool off_grid = c->dequant && k == W_LINEAR &&
			((grows != rows && grows % c->br != 0) || (gcols != cols && gcols % c->bc != 0));
	acc(c, &p->gpu, mul(c, (uint64_t)ng,
			    off_grid ? mul(c, mul(c, (uint64_t)grows, (uint64_t)gcols), 4)
				     : mbytes(c, grows, gcols, k)));
}

/* A replicated tensor. */
static void rep(const struct ctx *c, struct plan_part *p, int64_t n, int64_t rows, int64_t cols,
		enum wclass k)
{
	add(c, p, n, n, rows, cols, rows, cols, k);
}

/* A SwiGLU MLP of width w split over `split` ranks (gate/up rows, down columns). */
static void mlp(const struct ctx *c, struct plan_part *p, int64_t n, int64_t ng, int64_t w,
		int64_t split)
{
	int64_t d = c->m->dim;
	add(c, p, 2 * n, 2 * ng, w, d, w / split, d, W_LINEAR);
	add(c, p, n, ng, d, w, d, w / split, W_LINEAR);
}

/* n decoder layers' attention (with full_idx of them running their own indexer). */
static void attention(const struct ctx *c, struct plan_part *parts, int64_t n, int64_t full_idx)
{
	const struct plan_model *m = c->m;
	struct plan_part *a = &parts[PLAN_ATTN], *ix = &parts[PLAN_INDEXER],
			 *nm = &parts[PLAN_NORMS];
	int64_t d = m->dim, H = m->heads, Hg = H / c->tp;
	if (m->mla) {
		int64_t qk = m->qk_nope + m->qk_rope, L = m->kv_lora;
		if (m->q_lora) {
			rep(c, a, n, m->q_lora, d, W_LINEAR);                     /* q_a_proj */
			rep(c, nm, n, m->q_lora, 1, W_VEC);                       /* q_a_layernorm */
			add(c, a, n, n, H * qk, m->q_lora, Hg * qk, m->q_lora, W_LINEAR); /* q_b */
		} else {
			add(c, a, n, n, H * qk, d, Hg * qk, d, W_LINEAR);         /* q_proj */
		}
		rep(c, a, n, L + m->qk_rope, d, W_LINEAR);                        /* kv_a_proj */
		rep(c, nm, n, L, 1, W_VEC);                                       /* kv_a_layernorm */
		add(c, a, n, n, H * (m->qk_nope + m->v_head), L, Hg * (m->qk_nope + m->v_head), L,
		    W_LINEAR);                                                    /* kv_b_proj */
		add(c, a, n, n, d, H * m->v_head, d, Hg * m->v_head, W_LINEAR);   /* o_proj */
		if (m->dsa && full_idx > 0) {
			int64_t qin = m->q_lora ? m->q_lora : d;
			rep(c, ix, full_idx, m->index_heads * m->index_dim, qin, W_LINEAR); /* wq_b */
			rep(c, ix, full_idx, m->index_dim, d, W_LINEAR);                    /* wk */
			rep(c, nm, full_idx, 2 * m->index_dim, 1, W_VEC);     /* k_norm weight, bias */
			rep(c, ix, full_idx, m->index_heads, d, W_KEEP);      /* weights_proj */
		}
	} else {
		int64_t hd = m->head_dim, KV = m->kv_heads;
		int64_t KVg = KV >= c->tp ? KV / c->tp : 1;
		add(c, a, n, n, H * hd, d, Hg * hd, d, W_LINEAR);                 /* q_proj */
		add(c, a, 2 * n, 2 * n, KV * hd, d, KVg * hd, d, W_LINEAR);       /* k_proj, v_proj */
		add(c, a, n, n, d, H * hd, d, Hg * hd, W_LINEAR);                 /* o_proj */
		if (m->attn_bias) {
			add(c, a, n, n, H * hd, 1, Hg * hd, 1, W_VEC);
			add(c, a, 2 * n, 2 * n, KV * hd, 1, KVg * hd, 1, W_VEC);
		}
		if (m->qk_norm)
			rep(c, nm, 2 * n, hd, 1, W_VEC);
	}
	rep(c, nm, 2 * n, d, 1, W_VEC); /* input_layernorm, post_attention_layernorm */
}

/* n MoE blocks: router, routed experts, shared experts. */
static void moe(const struct ctx *c, struct plan_part *parts, int64_t n)
{
	const struct plan_model *m = c->m;
	rep(c, &parts[PLAN_ROUTER], n, m->n_routed, m->dim, W_KEEP);   /* gate.weight */
	rep(c, &parts[PLAN_ROUTER], n, m->n_routed, 1, W_F32);         /* e_score_correction_bias */
	mlp(c, &parts[PLAN_ROUTED], n * m->n_routed, n * c->r->experts_per_gpu, m->moe_inter, 1);
	if (m->n_shared > 0)
		mlp(c, &parts[PLAN_SHARED], n, n, m->moe_inter * m->n_shared, c->tp);
}

static const struct {
	const char *name, *split;
} part_info[PLAN_NPARTS] = {
	[PLAN_ATTN] = {"attention", "heads over TP; MLA down-projections replicated"},
	[PLAN_INDEXER] = {"indexer", "replicated"},
	[PLAN_DENSE] = {"dense_mlp", "TP"},
	[PLAN_SHARED] = {"shared_experts", "TP"},
	[PLAN_ROUTED] = {"routed_experts", "EP"},
	[PLAN_ROUTER] = {"router", "replicated"},
	[PLAN_EMBED] = {"embeddings", "vocab over TP"},
	[PLAN_LM_HEAD] = {"lm_head", "vocab over TP"},
	[PLAN_NORMS] = {"norms", "replicated"},
};

/* ---- the plan ------------------------------------------------------------------------------- */

static int check_layout(const struct plan_model *m, const struct plan_opts *o,
			struct plan_result *r, char *err, size_t errsz)
{
	int tp = o->tp, ep = o->ep;
	if (tp < 1 || ep < 1)
		return wk_errf(err, errsz, WK_EINVAL, "--tp and --ep must be at least 1");
	r->tp = tp;
	r->ep = ep;
	r->world = tp > ep ? tp : ep;
	int lo = tp < ep ? tp : ep;
	if (r->world % lo != 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "--tp %d --ep %d: the smaller must divide the larger (the world size "
			       "is max(tp, ep) = %d)", tp, ep, r->world);
	if (r->world > SNAP_MAX_RANKS)
		return wk_errf(err, errsz, WK_EINVAL,
			       "--tp %d --ep %d: a world of %d ranks is more than %d (a snapshot's "
			       "limit: no such layout can be written or run)", tp, ep, r->world,
			       SNAP_MAX_RANKS);
	if (o->gpus != 0 && o->gpus != r->world)
		return wk_errf(err, errsz, WK_EINVAL,
			       "--gpus %d: the layout --tp %d --ep %d runs on exactly max(tp, ep) = "
			       "%d GPUs", o->gpus, tp, ep, r->world);
	r->attn_copies = r->world / tp;
	r->expert_copies = r->world / ep;
	if (m->heads % tp != 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "--tp %d does not divide num_attention_heads %lld", tp,
			       (long long)m->heads);
	r->heads_per_gpu = m->heads / tp;
	if (!m->mla) {
		if (m->kv_heads % tp != 0 && tp % m->kv_heads != 0)
			return wk_errf(err, errsz, WK_EINVAL,
				       "--tp %d and num_key_value_heads %lld: one must divide the "
				       "other", tp, (long long)m->kv_heads);
		r->kv_heads_per_gpu = m->kv_heads >= tp ? m->kv_heads / tp : 1;
	} else {
		r->kv_heads_per_gpu = 1; /* the latent */
	}
	if (m->vocab % tp != 0)
		return wk_errf(err, errsz, WK_EINVAL, "--tp %d does not divide vocab_size %lld", tp,
			       (long long)m->vocab);
	if (m->dense_layers > 0 && m->inter % tp != 0)
		return wk_errf(err, errsz, WK_EINVAL, "--tp %d does not divide intermediate_size %lld",
			       tp, (long long)m->inter);
	if (m->n_routed == 0) {
		if (ep > 1)
			return wk_errf(err, errsz, WK_EINVAL,
				       "--ep %d: the model has no routed experts (use --ep 1)", ep);
		return WK_OK;
	}
	if (m->n_routed % ep != 0)
		return wk_errf(err, errsz, WK_EINVAL, "--ep %d does not divide n_routed_experts %lld",
			       ep, (long long)m->n_routed);
	r->experts_per_gpu = m->n_routed / ep;
	if ((m->moe_inter * m->n_shared) % tp != 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "--tp %d does not divide the shared experts' width %lld "
			       "(moe_intermediate_size x n_shared_experts)", tp,
			       (long long)(m->moe_inter * m->n_shared));
	return WK_OK;
}

static void workspace(const struct plan_model *m, struct plan_result *r)
{
	uint64_t B = (uint64_t)r->batch, C = (uint64_t)r->context, d = (uint64_t)m->dim;
	uint64_t Hg = (uint64_t)r->heads_per_gpu, tp = (uint64_t)r->tp;
	r->ws.hidden = 4 * B * d * 4;
	if (m->mla) {
		uint64_t L = (uint64_t)m->kv_lora, rope = (uint64_t)m->qk_rope;
		uint64_t qk = (uint64_t)(m->qk_nope + m->qk_rope), v = (uint64_t)m->v_head;
		r->ws.attn = B * 2 * ((uint64_t)m->q_lora + Hg * qk + (L + rope) + Hg * (L + rope) +
				      Hg * L + Hg * v);
		if (m->dsa)
			r->ws.indexer = B * (2 * (uint64_t)(m->index_heads * m->index_dim) +
					     4 * (uint64_t)m->index_heads + 4 * C +
					     4 * (uint64_t)m->index_topk);
	} else {
		uint64_t hd = (uint64_t)m->head_dim, KVg = (uint64_t)r->kv_heads_per_gpu;
		r->ws.attn = B * 2 * ((Hg + 2 * KVg) * hd + Hg * hd);
	}
	uint64_t dense = m->dense_layers ? B * 2 * 2 * ((uint64_t)m->inter / tp) : 0, sparse = 0;
	if (m->n_routed) {
		uint64_t k = (uint64_t)m->top_k;
		sparse = B * (4 * (uint64_t)m->n_routed + 2 * 2 * k * d +
			      2 * 2 * k * (uint64_t)m->moe_inter +
			      2 * 2 * (uint64_t)(m->moe_inter * m->n_shared) / tp);
	}
	r->ws.ffn = dense > sparse ? dense : sparse;
	uint64_t V = (uint64_t)m->vocab;
	r->ws.logits = B * 4 * ((uint64_t)cdiv((int64_t)V, (int64_t)tp) + V);
	uint64_t at = r->ws.attn + r->ws.indexer;
	r->ws.total = r->ws.hidden + (at > r->ws.ffn ? at : r->ws.ffn) + r->ws.logits;
}

/* Bytes of a cache row of w values of type k: FP8 as the engine holds it, e4m3 codes and one
 * f32 scale per 128. */
static uint64_t kv_row(int64_t w, enum plan_dtype k)
{
	return k == PLAN_FP8 ? (uint64_t)w + (uint64_t)cdiv(w, 128) * 4 : (uint64_t)w * dsize(k);
}

static void kv_cache(const struct plan_model *m, struct plan_result *r)
{
	enum plan_dtype k = r->kv;
	uint64_t extra = r->mtp_counted ? 1 : 0; /* the MTP layer: a full layer's caches */
	if (m->mla) { /* FP8: the rope keys in bf16 */
		uint64_t rope = (uint64_t)m->qk_rope * (k == PLAN_FP8 ? 2 : dsize(k));
		r->kv_main = ((uint64_t)m->layers + extra) * (kv_row(m->kv_lora, k) + rope);
		if (m->dsa)
			r->kv_index = ((uint64_t)m->index_full_layers + extra) *
				      kv_row(m->index_dim, k);
		r->kv_replicated = true;
	} else {
		r->kv_main = ((uint64_t)m->layers + extra) * 2 * (uint64_t)r->kv_heads_per_gpu *
			     kv_row(m->head_dim, k);
		r->kv_replicated = m->kv_heads < r->tp;
	}
	r->kv_gpu = r->kv_main + r->kv_index;
	r->kv_node = r->kv_gpu * (uint64_t)r->world;
}

int plan_compute(const struct plan_model *m, const struct plan_opts *o, struct plan_result *r,
		 char *err, size_t errsz)
{
	memset(r, 0, sizeof *r);
	memcpy(r->warn, m->warn, sizeof r->warn);
	r->nwarn = m->nwarn;
	int rc = check_layout(m, o, r, err, errsz);
	if (rc)
		return rc;
	if (o->gpu_mem == 0)
		return wk_errf(err, errsz, WK_EINVAL, "--gpu-mem must be positive");
	if (o->batch < 1)
		return wk_errf(err, errsz, WK_EINVAL, "--batch must be at least 1");
	if (o->context < 0)
		return wk_errf(err, errsz, WK_EINVAL, "--context must be at least 1");
	r->context = o->context ? o->context : m->max_pos;
	if (r->context < 1)
		return wk_errf(err, errsz, WK_EINVAL,
			       "config.json has no max_position_embeddings: pass --context N");
	if (m->max_pos > 0 && r->context > m->max_pos)
		warn(r->warn, &r->nwarn, "--context %lld is more than max_position_embeddings %lld",
		     (long long)r->context, (long long)m->max_pos);
	r->batch = o->batch;
	r->weights = o->weights == PLAN_NDTYPE ? (m->fp8 ? PLAN_FP8 : m->base) : o->weights;
	if ((int)r->weights < 0 || (int)r->weights >= PLAN_NDTYPE || (int)o->kv < 0 ||
	    (int)o->kv >= PLAN_NDTYPE)
		return wk_errf(err, errsz, WK_EINVAL, "unknown dtype");
	r->kv = o->kv;

	/* FP8 blocks: the checkpoint's, or wick snapshot --dtype fp8's 128x128. */
	bool overflow = false;
	struct ctx c = {.m = m, .r = r, .tp = r->tp, .w = r->weights,
			.br = m->fp8 ? m->block_rows : 128, .bc = m->fp8 ? m->block_cols : 128,
			.overflow = &overflow};
	c.dequant = m->fp8 && r->weights == PLAN_FP8 && c.br > 0;
	for (int i = 0; i < PLAN_NPARTS; i++) {
		r->part[i].name = part_info[i].name;
		r->part[i].split = part_info[i].split;
	}
	if (!m->mla)
		r->part[PLAN_ATTN].split = "heads over TP";
	if (r->attn_copies > 1)
		r->part[PLAN_ATTN].split = m->mla ? "heads over TP, repeated world/tp times; MLA "
						    "down-projections replicated"
						  : "heads over TP, repeated world/tp times";
	if (r->expert_copies > 1)
		r->part[PLAN_ROUTED].split = "EP, repeated world/ep times";
	attention(&c, r->part, m->layers, m->dsa ? m->index_full_layers : 0);
	if (m->dense_layers)
		mlp(&c, &r->part[PLAN_DENSE], m->dense_layers, m->dense_layers, m->inter, c.tp);
	if (m->moe_layers)
		moe(&c, r->part, m->moe_layers);
	int64_t vg = cdiv(m->vocab, c.tp);
	add(&c, &r->part[PLAN_EMBED], 1, 1, m->vocab, m->dim, vg, m->dim, W_KEEP);
	if (!m->tied)
		add(&c, &r->part[PLAN_LM_HEAD], 1, 1, m->vocab, m->dim, vg, m->dim, W_KEEP);
	else
		r->part[PLAN_LM_HEAD].split = "tied to the embeddings";
	rep(&c, &r->part[PLAN_NORMS], 1, m->dim, 1, W_VEC); /* model.norm */
	for (int i = 0; i < PLAN_NPARTS; i++) {
		acc(&c, &r->params, r->part[i].params);
		acc(&c, &r->bytes, r->part[i].bytes);
		acc(&c, &r->gpu, r->part[i].gpu);
	}
	r->all_gpus = mul(&c, r->gpu, (uint64_t)r->world);

	/* MTP: full decoder layers (MoE when the model has experts; indexer on), eh_proj
	 * [dim][2 dim] and enorm, hnorm, shared_head.norm; embed and head shared with the
	 * model's. Counted (o->mtp): the one layer wick runs, in the totals. */
	if (o->mtp && !m->mtp_layers)
		return wk_errf(err, errsz, WK_EINVAL, "--mtp: the model has no MTP layer "
			       "(num_nextn_predict_layers is 0)");
	if (m->mtp_layers) {
		struct plan_part t[PLAN_NPARTS];
		memset(t, 0, sizeof t);
		int64_t n = o->mtp ? 1 : m->mtp_layers;
		attention(&c, t, n, m->dsa ? n : 0);
		if (m->n_routed)
			moe(&c, t, n);
		else
			mlp(&c, &t[PLAN_DENSE], n, n, m->inter, c.tp);
		rep(&c, &t[PLAN_ATTN], n, m->dim, 2 * m->dim, W_KEEP); /* eh_proj */
		rep(&c, &t[PLAN_NORMS], 3 * n, m->dim, 1, W_VEC);
		r->mtp.name = "mtp";
		r->mtp.split = o->mtp ? "loaded to draft (--mtp): in the totals"
				      : "not loaded (wick loads it only to draft: --mtp)";
		for (int i = 0; i < PLAN_NPARTS; i++) {
			r->mtp.params += t[i].params;
			r->mtp.bytes += t[i].bytes;
			r->mtp.gpu += t[i].gpu;
		}
		if (o->mtp) {
			r->mtp_counted = true;
			acc(&c, &r->params, r->mtp.params);
			acc(&c, &r->bytes, r->mtp.bytes);
			acc(&c, &r->gpu, r->mtp.gpu);
			r->all_gpus = mul(&c, r->gpu, (uint64_t)r->world);
		}
	}

	if (overflow || r->all_gpus > (UINT64_MAX >> 2))
		return wk_errf(err, errsz, WK_EINVAL,
			       "config.json: a model this large cannot be planned (its weight counts "
			       "pass 2^62 bytes); check hidden_size, the expert counts and sizes, and "
			       "num_hidden_layers");
	workspace(m, r);
	kv_cache(m, r);
	if (r->kv_gpu == 0 || r->context <= 0) /* a config with no layers or no head width */
		return wk_errf(err, errsz, WK_EINVAL,
			       "the config gives %s: check num_hidden_layers, the head dimensions and "
			       "max_position_embeddings (or --context)",
			       r->kv_gpu == 0 ? "no KV-cache bytes per token" : "no context length");
	uint64_t used = r->gpu + r->ws.total + o->reserve;
	r->budget = (int64_t)o->gpu_mem - (int64_t)used;
	r->fits_weights = r->budget >= 0;
	r->kv_tokens_gpu = r->budget > 0 ? (uint64_t)r->budget / r->kv_gpu : 0;
	r->max_seqs = r->kv_tokens_gpu / (uint64_t)r->context;
	r->fits = r->max_seqs >= 1;
	if (!r->fits)
		r->shortfall = (uint64_t)((int64_t)((uint64_t)r->context * r->kv_gpu) - r->budget);
	return WK_OK;
}
