/*
 * glm.c - what the GLM families share: config reading, the decoder skeleton (embedding,
 * pre-norm residual layers, final norm, lm_head), the dense SwiGLU MLP of the first
 * first_k_dense_replace layers and the MoE block of the rest.
 *
 * MoE (Hugging Face Glm4MoeMoE / DeepseekV3MoE, glm.md section 3.4): router logits
 * x . gate.weight^T in f32; sigmoid scores; noaux_tc selection on scores +
 * e_score_correction_bias, group-limited when n_group > 1; gate values are the unbiased
 * scores of the chosen experts, normalised (norm_topk_prob) and times routed_scaling_factor;
 * plus the shared experts (one MLP of width moe_intermediate_size * n_shared_experts) on
 * every token. Only the chosen experts run: tokens are grouped per expert and each expert
 * multiplies its batch once.
 *
 * Group limiting: groups other than the topk_group best are excluded from the choice. The
 * Hugging Face code fills their scores with 0.0 instead of -inf (the DeepSeek reference and
 * vLLM use -inf); the two agree unless a kept expert's biased score is negative. We exclude.
 *
 * The MTP layer (num_nextn_predict_layers, stored as model.layers.{num_hidden_layers}.*) is
 * loaded only for speculative decoding's drafts (eng_opts.mtp; "MTP drafts" below), as
 * transformers never loads it; eng_info.mtp_layers_skipped says how many were left.
 *
 * Sharded (shard.c): a rank holds its vocabulary rows, its slice of the dense MLP and shared
 * experts, its routed experts [ex0, ex1) and its attention heads (glm4.c, glm5.c); the
 * attention and FFN outputs are partial sums completed by an all_reduce. glm_plan says how
 * the snapshot is cut.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/glm_int.h"

#define GLM_MAX_EXPERTS 1024 /* the CPU router's limit (CPU_MOE_MAX_EXPERTS) */

void *glm_own(struct glm_model *m, void *p)
{
	if (!p)
		return NULL;
	if (m->n_owned == m->cap_owned) {
		size_t cap = m->cap_owned ? 2 * m->cap_owned : 256;
		void **o = realloc(m->owned, cap * sizeof *o);
		if (!o) {
			free(p);
			return NULL;
		}
		m->owned = o;
		m->cap_owned = cap;
	}
	m->owned[m->n_owned++] = p;
	return p;
}

/* glm_own for backend memory (eng_alloc'd): released with eng_release. */
static void *own_dev(struct glm_model *m, void *p)
{
	if (!p)
		return NULL;
	if (m->n_downed == m->cap_downed) {
		size_t cap = m->cap_downed ? 2 * m->cap_downed : 256;
		void **o = realloc(m->downed, cap * sizeof *o);
		if (!o) {
			eng_release(m->e, p);
			return NULL;
		}
		m->downed = o;
		m->cap_downed = cap;
	}
	m->downed[m->n_downed++] = p;
	return p;
}

static void *owned_copy(struct glm_model *m, const void *src, size_t bytes)
{
	void *p = glm_own(m, malloc(bytes ? bytes : 1));
	if (p)
		memcpy(p, src, bytes);
	return p;
}

int glm_weight(struct engine *e, struct glm_model *m, const char *name, int rows, int cols,
	       struct be_weight *w, char *err, size_t errsz)
{
	int rc = eng_weight(e, name, rows, cols, w, err, errsz);
	if (rc != WK_OK || !eng_host_mem(e))
		return rc; /* a device copy is aligned */
	size_t esz = dt_size(w->dtype);
	if ((uintptr_t)w->data % esz != 0 &&
	    !(w->data = owned_copy(m, w->data, (size_t)rows * cols * esz)))
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	size_t nscale = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
	if (w->scale && (uintptr_t)w->scale % sizeof(float) != 0 &&
	    !(w->scale = owned_copy(m, w->scale, nscale * sizeof(float))))
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	return WK_OK;
}

int glm_vector(struct engine *e, struct glm_model *m, const char *name, int len, float **out,
	       char *err, size_t errsz)
{
	int rc = eng_vector(e, name, len, out, err, errsz);
	if (rc == WK_OK && !(eng_host_mem(e) ? glm_own(m, *out) : own_dev(m, *out)))
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	return rc;
}

uint64_t glm_weight_bytes(const struct be_weight *w)
{
	uint64_t b = (uint64_t)w->rows * (uint64_t)w->cols * dt_size(w->dtype);
	if (w->scale)
		b += (uint64_t)((w->rows + 127) / 128) * (uint64_t)((w->cols + 127) / 128) * 4;
	return b;
}

int glm_require_str(json_t *cfg, const char *key, const char *want, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v))
		return WK_OK;
	if (!json_is_string(v) || strcmp(json_string_value(v), want) != 0)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: '%s' must be \"%s\" (the only kind implemented)", key,
			       want);
	return WK_OK;
}

int glm_rope_cfg(json_t *cfg, double def_theta, double def_partial, double *theta,
		 double *partial, char *err, size_t errsz)
{
	int rc;
	json_t *rp = json_object_get(cfg, "rope_parameters");
	json_t *rs = json_object_get(cfg, "rope_scaling");
	if (rp && !json_is_null(rp) && !json_is_object(rp))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: 'rope_parameters' must be an object");
	if (rs && !json_is_null(rs)) {
		/* Old-style configs: rope_scaling null or {"rope_type": "default"}. */
		json_t *t = json_is_object(rs) ? json_object_get(rs, "rope_type") : NULL;
		if (!t)
			t = json_is_object(rs) ? json_object_get(rs, "type") : NULL;
		if (!json_is_string(t) || strcmp(json_string_value(t), "default") != 0)
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "config.json: rope_scaling is not supported (only the default "
				       "rope)");
	}
	if ((rc = cfg_real(cfg, "rope_theta", def_theta, theta, err, errsz)) ||
	    (rc = cfg_real(cfg, "partial_rotary_factor", def_partial, partial, err, errsz)))
		return rc;
	if (json_is_object(rp)) {
		if ((rc = glm_require_str(rp, "rope_type", "default", err, errsz)) ||
		    (rc = cfg_real(rp, "rope_theta", *theta, theta, err, errsz)) ||
		    (rc = cfg_real(rp, "partial_rotary_factor", *partial, partial, err, errsz)))
		{
			char why[256];
			snprintf(why, sizeof why, "%s", err ? err : "");
			return wk_errf(err, errsz, rc, "%s (in rope_parameters)", why);
		}
	}
	if (!(*theta > 1.0))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: rope_theta %g must be > 1",
			       *theta);
	if (!(*partial > 0.0 && *partial <= 1.0))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: partial_rotary_factor %g is outside (0, 1]", *partial);
	return WK_OK;
}

/* ---- config -------------------------------------------------------------------------------- */

static int read_cfg(struct glm_cfg *c, json_t *cfg, int max_seq_opt, char *err, size_t errsz)
{
	long long dim, vocab, layers, inter, moe_inter, ne, ns, topk, ng, tg, fkd, maxpos, mtp, freq;
	double eps, rsf;
	int norm, tied, mlp_bias;
	int rc;
	if ((rc = cfg_int(cfg, "hidden_size", -1, 1, 1 << 16, &dim, err, errsz)) ||
	    (rc = cfg_int(cfg, "vocab_size", -1, 1, 1 << 24, &vocab, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_hidden_layers", -1, 1, 4096, &layers, err, errsz)) ||
	    (rc = cfg_int(cfg, "intermediate_size", -1, 1, 1 << 20, &inter, err, errsz)) ||
	    (rc = cfg_int(cfg, "moe_intermediate_size", -1, 1, 1 << 20, &moe_inter, err, errsz)) ||
	    (rc = cfg_int(cfg, "n_routed_experts", -1, 1, GLM_MAX_EXPERTS, &ne, err, errsz)) ||
	    (rc = cfg_int(cfg, "n_shared_experts", 1, 0, 64, &ns, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_experts_per_tok", -1, 1, ne, &topk, err, errsz)) ||
	    (rc = cfg_int(cfg, "n_group", 1, 1, ne, &ng, err, errsz)) ||
	    (rc = cfg_int(cfg, "topk_group", 1, 1, ng, &tg, err, errsz)) ||
	    (rc = cfg_int(cfg, "first_k_dense_replace", -1, 0, layers, &fkd, err, errsz)) ||
	    (rc = cfg_int(cfg, "moe_layer_freq", 1, 1, 1, &freq, err, errsz)) ||
	    (rc = cfg_int(cfg, "max_position_embeddings", 131072, 1, 1 << 24, &maxpos, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_nextn_predict_layers", 0, 0, 64, &mtp, err, errsz)) ||
	    (rc = cfg_real(cfg, "rms_norm_eps", 1e-5, &eps, err, errsz)) ||
	    (rc = cfg_real(cfg, "routed_scaling_factor", 1.0, &rsf, err, errsz)) ||
	    (rc = cfg_bool(cfg, "norm_topk_prob", 1, &norm, err, errsz)) ||
	    (rc = cfg_bool(cfg, "tie_word_embeddings", 0, &tied, err, errsz)) ||
	    (rc = cfg_bool(cfg, "mlp_bias", 0, &mlp_bias, err, errsz)) ||
	    (rc = glm_require_str(cfg, "scoring_func", "sigmoid", err, errsz)) ||
	    (rc = glm_require_str(cfg, "topk_method", "noaux_tc", err, errsz)) ||
	    (rc = glm_require_str(cfg, "hidden_act", "silu", err, errsz)))
		return rc;
	if (mlp_bias)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "config.json: mlp_bias is not supported");
	/* FP8 checkpoints: only the DeepSeek-style block format (e4m3 weights with 128x128
	 * weight_scale_inv, as GLM-5-FP8); GLM-4.x-FP8's compressed-tensors is another format. */
	json_t *qc = json_object_get(cfg, "quantization_config");
	if (qc && !json_is_null(qc)) {
		const char *qm = json_string_value(json_object_get(qc, "quant_method"));
		json_t *bs = json_object_get(qc, "weight_block_size");
		if (!qm || strcmp(qm, "fp8") != 0)
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "config.json: quantization_config.quant_method '%s' is not "
				       "supported (only \"fp8\" with 128x128 weight_scale_inv blocks)",
				       qm ? qm : "?");
		if (bs && (json_array_size(bs) != 2 ||
			   json_integer_value(json_array_get(bs, 0)) != 128 ||
			   json_integer_value(json_array_get(bs, 1)) != 128))
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "config.json: quantization_config.weight_block_size must be "
				       "[128, 128]");
	}
	if (ne % ng != 0)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: n_routed_experts %lld is not a multiple of n_group %lld",
			       ne, ng);
	if (topk > tg * (ne / ng))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: num_experts_per_tok %lld is more than the %lld experts "
			       "in topk_group %lld groups", topk, tg * (ne / ng), tg);
	if (!(eps > 0.0 && eps < 1.0))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: rms_norm_eps %g is outside (0, 1)",
			       eps);
	if (!(rsf > 0.0))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: routed_scaling_factor %g must be positive", rsf);
	*c = (struct glm_cfg){
		.dim = (int)dim, .vocab = (int)vocab, .n_layers = (int)layers,
		.max_seq = max_seq_opt > 0 && max_seq_opt < maxpos ? max_seq_opt : (int)maxpos,
		.inter = (int)inter, .moe_inter = (int)moe_inter, .n_experts = (int)ne,
		.n_shared = (int)ns, .top_k = (int)topk, .n_group = (int)ng, .topk_group = (int)tg,
		.norm_topk = norm, .routed_scale = (float)rsf, .eps = (float)eps, .tied = tied,
		.mtp = (int)mtp,
	};
	return WK_OK;
}

/* Layer l is MoE: from mlp_layer_types ("dense"/"sparse") when present, else l >=
 * first_k_dense_replace. */
static int layer_kinds(json_t *cfg, struct glm_model *m, char *err, size_t errsz)
{
	long long fkd;
	int rc = cfg_int(cfg, "first_k_dense_replace", -1, 0, m->c.n_layers, &fkd, err, errsz);
	if (rc)
		return rc;
	json_t *types = json_object_get(cfg, "mlp_layer_types");
	if (types && !json_is_null(types) &&
	    (!json_is_array(types) || (int)json_array_size(types) != m->c.n_layers))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: 'mlp_layer_types' must list num_hidden_layers (%d) "
			       "entries", m->c.n_layers);
	for (int l = 0; l < m->c.n_layers; l++) {
		m->layers[l].moe = l >= fkd;
		if (!json_is_array(types))
			continue;
		const char *t = json_string_value(json_array_get(types, (size_t)l));
		if (!t || (strcmp(t, "dense") && strcmp(t, "sparse")))
			return wk_errf(err, errsz, WK_EFORMAT,
				       "config.json: mlp_layer_types[%d] must be \"dense\" or "
				       "\"sparse\"", l);
		m->layers[l].moe = !strcmp(t, "sparse");
	}
	if (m->c.n_attn > m->c.n_layers) /* the MTP layer: DeepSeek-V3's and GLM's are MoE */
		m->layers[m->c.n_layers].moe = m->c.n_layers >= fkd;
	return WK_OK;
}

/* ---- weights ------------------------------------------------------------------------------- */

static int load_mlp(struct engine *e, struct glm_model *m, const char *prefix, int inter,
		    struct glm_mlp *p, char *err, size_t errsz)
{
	char nm[320];
	int dim = m->c.dim, rc;
#define MNAME(s) (snprintf(nm, sizeof nm, "%s.%s", prefix, s), nm)
	if ((rc = glm_weight(e, m, MNAME("gate_proj.weight"), inter, dim, &p->gate, err, errsz)) ||
	    (rc = glm_weight(e, m, MNAME("up_proj.weight"), inter, dim, &p->up, err, errsz)) ||
	    (rc = glm_weight(e, m, MNAME("down_proj.weight"), dim, inter, &p->down, err, errsz)))
		return rc;
#undef MNAME
	return WK_OK;
}

static uint64_t mlp_bytes(const struct glm_mlp *p)
{
	return glm_weight_bytes(&p->gate) + glm_weight_bytes(&p->up) + glm_weight_bytes(&p->down);
}

/* The backend's grouped op for this rank's experts of layer f, when it has one and the
 * experts share one dtype (else they run one by one: f->grouped stays false). */
static int bind_grouped(struct engine *e, struct glm_model *m, struct glm_moe *f, char *err,
			size_t errsz)
{
	const struct backend *be = e->be;
	int nl = m->c.ex1 - m->c.ex0, rc;
	if (!be->moe_experts || !be->moe_scratch || nl <= 0 || e->experts_one_by_one ||
	    e->fp8_act) /* the grouped op multiplies unquantized activations */
		return WK_OK;
	enum dt_type dt = f->experts[m->c.ex0].gate.dtype;
	for (int i = 0; i < nl; i++) {
		const struct glm_mlp *x = &f->experts[m->c.ex0 + i];
		const struct be_weight *w[3] = {&x->gate, &x->up, &x->down};
		for (int k = 0; k < 3; k++)
			if (w[k]->dtype != dt || (dt == DT_F8_E4M3 && !w[k]->scale))
				return WK_OK;
	}
	struct be_expert *t = glm_own(m, calloc((size_t)nl, sizeof *t));
	if (!t)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; i < nl; i++) {
		const struct glm_mlp *x = &f->experts[m->c.ex0 + i];
		t[i] = (struct be_expert){x->gate.data, x->up.data, x->down.data,
					  x->gate.scale, x->up.scale, x->down.scale};
	}
	f->bex = (struct be_experts){.ex0 = m->c.ex0, .n_local = nl, .top_k = m->c.top_k,
				     .dim = m->c.dim, .inter = m->c.moe_inter, .dtype = dt,
				     .experts = t};
	/* The shared expert joins the op where this rank adds both it and its routed experts
	 * (sharded: the shared expert is led by TP ranks, the routed ones by EP ranks; a rank
	 * leading only one of them runs the shared expert apart, moe_forward) and its three
	 * weights share a dtype the op takes (its own: a TP slice that cuts FP8 blocks is
	 * stored dequantized). */
	const struct glm_mlp *sh = &f->shared;
	enum dt_type sdt = sh->gate.dtype;
	if (m->c.n_shared > 0 && eng_tp_lead(e) && eng_ep_lead(e) && !e->unfused &&
	    sh->up.dtype == sdt && sh->down.dtype == sdt &&
	    (sdt == DT_F32 || sdt == DT_BF16 || sdt == DT_F16 ||
	     (sdt == DT_F8_E4M3 && sh->gate.scale && sh->up.scale && sh->down.scale))) {
		f->bex_shared = (struct be_expert){sh->gate.data, sh->up.data, sh->down.data,
						   sh->gate.scale, sh->up.scale, sh->down.scale};
		f->bex.shared = &f->bex_shared;
		f->bex.shared_dtype = sdt;
		f->bex.shared_inter = m->c.l_shared;
	}
	if (be->moe_bind && (rc = be->moe_bind(e->bctx, &f->bex, err, errsz)) != WK_OK)
		return rc;
	f->grouped = true;
	if (!m->bex0 || (f->bex.shared && !m->bex0->shared)) /* the largest scratch */
		m->bex0 = &f->bex;
	return WK_OK;
}

static int load_ffn(struct engine *e, struct glm_model *m, int l, char *err, size_t errsz)
{
	struct glm_layer *L = &m->layers[l];
	char pre[256], nm[320];
	int rc;
	snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
	if (!L->moe)
		return load_mlp(e, m, pre, m->c.l_inter, &L->mlp, err, errsz);
	struct glm_moe *f = &L->ffn;
	snprintf(nm, sizeof nm, "%s.gate.weight", pre);
	if ((rc = glm_weight(e, m, nm, m->c.n_experts, m->c.dim, &f->router, err, errsz)))
		return rc;
	if (f->router.dtype != DT_F32 && f->router.dtype != DT_BF16 && f->router.dtype != DT_F16)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "%s: the router '%s' must be F32, BF16 or F16, not %s", e->dir, nm,
			       dt_name(f->router.dtype));
	snprintf(nm, sizeof nm, "%s.gate.e_score_correction_bias", pre);
	if ((rc = glm_vector(e, m, nm, m->c.n_experts, &f->bias, err, errsz)))
		return rc;
	f->experts = glm_own(m, calloc((size_t)m->c.n_experts, sizeof *f->experts));
	if (!f->experts)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int x = m->c.ex0; x < m->c.ex1; x++) {
		snprintf(nm, sizeof nm, "%s.experts.%d", pre, x);
		if ((rc = load_mlp(e, m, nm, m->c.moe_inter, &f->experts[x], err, errsz)))
			return rc;
	}
	if (m->c.n_shared > 0) {
		snprintf(nm, sizeof nm, "%s.shared_experts", pre);
		if ((rc = load_mlp(e, m, nm, m->c.l_shared, &f->shared, err, errsz)))
			return rc;
	}
	return bind_grouped(e, m, f, err, errsz);
}

/* This rank's part of the dense MLP, shared experts, vocabulary and routed experts, by the
 * rules glm_plan cut the snapshot with. */
static int shard_cfg(const struct engine *e, struct glm_cfg *c, char *err, size_t errsz)
{
	int k = eng_tp_rank(e), lo, hi, rc;
	if ((rc = shard_even(c->inter, e->tp, k, "intermediate_size", "tp", &lo, &hi, err,
			     errsz)))
		return rc;
	c->l_inter = hi - lo;
	if ((rc = shard_even((long long)c->moe_inter * c->n_shared, e->tp, k,
			     "moe_intermediate_size * n_shared_experts", "tp", &lo, &hi, err, errsz)))
		return rc;
	c->l_shared = hi - lo;
	if ((rc = shard_even(c->vocab, e->tp, k, "vocab_size", "tp", &c->vocab0, &hi, err, errsz)))
		return rc;
	c->l_vocab = hi - c->vocab0;
	return shard_even(c->n_experts, e->ep, eng_ep_rank(e), "n_routed_experts", "ep", &c->ex0,
			  &c->ex1, err, errsz);
}

/* The MTP layer's own tensors beside its decoder layer (glm.md section 3.6). Its copies of
 * embed_tokens and shared_head.head, where a checkpoint ships them, are not read: the main
 * model's embedding and lm_head serve (DeepSeek-V3 ships the same tensors twice, and vLLM
 * had to point GLM-5's shared_head.head at lm_head for its logits to be right). */
static int mtp_load(struct engine *e, struct glm_model *m, char *err, size_t errsz)
{
	char nm[256];
	int l = m->c.n_layers, dim = m->c.dim, rc;
#define MTP_NAME(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
	if ((rc = glm_weight(e, m, MTP_NAME("eh_proj.weight"), dim, 2 * dim, &m->eh_proj, err,
			     errsz)) ||
	    (rc = glm_vector(e, m, MTP_NAME("enorm.weight"), dim, &m->enorm, err, errsz)) ||
	    (rc = glm_vector(e, m, MTP_NAME("hnorm.weight"), dim, &m->hnorm, err, errsz)) ||
	    (rc = glm_vector(e, m, MTP_NAME("shared_head.norm.weight"), dim, &m->head_norm, err,
			     errsz)))
		return rc;
#undef MTP_NAME
	size_t ns = (size_t)m->max_seqs;
	m->pend = eng_calloc(e, ns * dim * sizeof(float));
	m->mseg = glm_own(m, calloc(ns, sizeof *m->mseg));
	m->dtok = glm_own(m, calloc(ns, sizeof *m->dtok));
	m->dj = glm_own(m, calloc(ns, sizeof *m->dj));
	m->di = glm_own(m, calloc(ns, sizeof *m->di));
	m->q0 = glm_own(m, calloc(ns, sizeof *m->q0));
	m->ditem = glm_own(m, calloc(ns, sizeof *m->ditem));
	if (!m->pend || !m->mseg || !m->dtok || !m->dj || !m->di || !m->q0 || !m->ditem)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for the MTP layer's state");
	return WK_OK;
}

static const enum be_op glm_ops[] = {BE_OP_MATMUL,      BE_OP_RMSNORM,       BE_OP_ROPE,
				     BE_OP_SILU_MUL,    BE_OP_ADD,           BE_OP_MOE_ROUTE,
				     BE_OP_GATHER_ROWS, BE_OP_SCATTER_ADD_ROWS};

int glm_load(struct engine *e, const struct glm_attn *ops, char *err, size_t errsz)
{
	struct glm_model *m = calloc(1, sizeof *m);
	if (!m)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	e->model = m;
	m->e = e;
	m->attn_ops = ops;
	m->max_seqs = e->max_seqs > 0 ? e->max_seqs : 1;
	m->seg = glm_own(m, calloc((size_t)m->max_seqs, sizeof *m->seg));
	if (!m->seg)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	json_t *cfg = e->config;
	int rc = read_cfg(&m->c, cfg, e->max_seq_opt, err, errsz);
	if (rc || (rc = shard_cfg(e, &m->c, err, errsz)))
		return rc;
	/* auto: where the checkpoint or snapshot holds the layer (a snapshot keeps it only when
	 * made with --mtp) */
	char probe[96];
	snprintf(probe, sizeof probe, "model.layers.%d.eh_proj.weight", m->c.n_layers);
	bool held = m->c.mtp > 0 && e->mtp_opt != ENG_MTP_OFF && eng_tensor(e, probe);
	if (m->c.mtp > 0 && e->mtp_opt == ENG_MTP_ON && !held)
		return wk_errf(err, errsz, WK_ENOTFOUND,
			       "%s holds no MTP layer (no %s): a snapshot keeps it only when made "
			       "with wick snapshot --mtp", e->dir, probe);
	m->mtp = held;
	e->info.mtp = m->mtp ? 1 : 0; /* (eng_cache_agrees reads it) */
	m->c.n_attn = m->c.n_layers + (m->mtp ? 1 : 0);
	for (size_t i = 0; i < sizeof glm_ops / sizeof glm_ops[0]; i++)
		if (!e->be->supports(e->bctx, glm_ops[i], DT_F32))
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "the %s backend lacks an op the GLM families need (%d)",
				       e->be->name, (int)glm_ops[i]);

	struct be_weight emb;
	if ((rc = eng_weight_host(e, "model.embed_tokens.weight", m->c.l_vocab, m->c.dim, &emb,
				  err, errsz)))
		return rc;
	if ((rc = eng_tensor_host(e, "model.embed_tokens.weight", &m->embed, err, errsz)))
		return rc;
	if (m->embed->dtype != DT_F32 && m->embed->dtype != DT_BF16 && m->embed->dtype != DT_F16)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "%s: model.embed_tokens.weight must be F32, BF16 or F16, not %s",
			       e->dir, dt_name(m->embed->dtype));
	if (m->c.tied)
		rc = glm_weight(e, m, "model.embed_tokens.weight", m->c.l_vocab, m->c.dim,
				&m->lm_head, err, errsz);
	else
		rc = glm_weight(e, m, "lm_head.weight", m->c.l_vocab, m->c.dim, &m->lm_head, err,
				errsz);
	if (rc || (rc = glm_vector(e, m, "model.norm.weight", m->c.dim, &m->final_norm, err,
				   errsz)))
		return rc;

	m->layers = glm_own(m, calloc((size_t)m->c.n_attn, sizeof *m->layers));
	if (!m->layers)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if ((rc = layer_kinds(cfg, m, err, errsz)))
		return rc;
	for (int l = 0; l < m->c.n_attn; l++) {
		struct glm_layer *L = &m->layers[l];
		char nm[256];
		snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
		if ((rc = glm_vector(e, m, nm, m->c.dim, &L->attn_norm, err, errsz)))
			return rc;
		snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
		if ((rc = glm_vector(e, m, nm, m->c.dim, &L->mlp_norm, err, errsz)) ||
		    (rc = load_ffn(e, m, l, err, errsz)))
			return rc;
	}
	if ((rc = ops->load(e, m, err, errsz)) || (m->mtp && (rc = mtp_load(e, m, err, errsz))))
		return rc;

	/* Bytes one decode step reads: attention, the FFN's active part (router, shared and
	 * top_k experts), the lm_head and one embedding row. Sharded: this rank's shards, and
	 * its experts' expected share of the top_k (ranks run in parallel). */
	uint64_t per_tok = glm_weight_bytes(&m->lm_head) + m->attn_bytes +
			   (uint64_t)m->c.dim * dt_size(m->embed->dtype);
	for (int l = 0; l < m->c.n_layers; l++) {
		struct glm_layer *L = &m->layers[l];
		if (!L->moe) {
			per_tok += mlp_bytes(&L->mlp);
			continue;
		}
		per_tok += glm_weight_bytes(&L->ffn.router) +
			   (uint64_t)m->c.top_k * mlp_bytes(&L->ffn.experts[m->c.ex0]) *
				   (uint64_t)(m->c.ex1 - m->c.ex0) / (uint64_t)m->c.n_experts;
		if (m->c.n_shared > 0)
			per_tok += mlp_bytes(&L->ffn.shared);
	}
	e->info.bytes_per_token = per_tok;
	e->info.vocab = m->c.vocab;
	e->info.max_seq = m->c.max_seq;
	e->info.mtp_layers_skipped = m->c.mtp - (m->mtp ? 1 : 0);
	e->info.mtp = m->mtp ? 1 : 0;
	return WK_OK;
}

void glm_free(struct engine *e)
{
	struct glm_model *m = e->model;
	if (!m)
		return;
	if (m->attn_ops && m->attn_ops->free)
		m->attn_ops->free(m);
	for (size_t i = 0; i < m->n_owned; i++)
		free(m->owned[i]);
	free(m->owned);
	for (size_t i = 0; i < m->n_downed; i++)
		eng_release(e, m->downed[i]);
	free(m->downed);
	void *dev[] = {m->pos, m->x, m->xb, m->tmp, m->g, m->u, m->logits, m->idx, m->wt,
		       m->rows, m->rw, m->xg, m->yg, m->lg, m->moe_scr, m->gath, m->hid, m->mh,
		       m->mcat, m->pend};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		eng_release(e, dev[i]);
	void *host[] = {m->pos_h, m->tok, m->xh, m->idx_h, m->wt_h, m->rows_h, m->rw_h, m->count,
			m->mtok};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	free(m);
	e->model = NULL;
}

/* ---- forward ------------------------------------------------------------------------------- */

/* realloc that keeps *p on failure */
static bool re(void *pp, size_t bytes)
{
	void **p = pp;
	void *q = realloc(*p, bytes ? bytes : 1);
	if (q)
		*p = q;
	return q != NULL;
}

/* Scratch for a step of T token rows in nseg segments; lg_rows rows of whole-vocabulary
 * logits (and, sharded, gath for the all_gather of lg_rows rows). */
static int grow(struct engine *e, struct glm_model *m, int T, int nseg, int lg_rows, int world)
{
	const struct glm_cfg *c = &m->c;
	if (lg_rows > m->lg_cap) {
		size_t nv = (size_t)lg_rows * c->vocab * 4;
		if (!eng_regrow(e, &m->lg, nv) ||
		    (world > 1 && !eng_regrow(e, &m->gath, (size_t)lg_rows * c->l_vocab * world * 4)))
			return WK_ENOMEM;
		m->lg_cap = lg_rows;
	}
	int n = T > nseg ? T : nseg;
	if (n > m->cap) {
		size_t wide = (size_t)c->l_inter;
		if ((size_t)c->l_shared > wide)
			wide = (size_t)c->l_shared;
		if ((size_t)c->moe_inter > wide)
			wide = (size_t)c->moe_inter;
		size_t nd = (size_t)n * c->dim * 4, nk = (size_t)n * c->top_k * 4;
		if (!eng_regrow(e, &m->pos, (size_t)n * 8) || !re(&m->pos_h, (size_t)n * 8) ||
		    !re(&m->tok, (size_t)n * 4) || !eng_regrow(e, &m->x, nd) ||
		    (!eng_host_mem(e) && !re(&m->xh, nd)) || !eng_regrow(e, &m->xb, nd) ||
		    !eng_regrow(e, &m->tmp, nd) || !eng_regrow(e, &m->g, n * wide * 4) ||
		    !eng_regrow(e, &m->u, n * wide * 4) ||
		    !eng_regrow(e, &m->logits, (size_t)n * c->n_experts * 4) ||
		    !eng_regrow(e, &m->idx, nk) || !re(&m->idx_h, nk) ||
		    !eng_regrow(e, &m->wt, nk) || !re(&m->wt_h, nk) || !eng_regrow(e, &m->rows, nk) ||
		    !re(&m->rows_h, nk) || !eng_regrow(e, &m->rw, nk) || !re(&m->rw_h, nk) ||
		    !eng_regrow(e, &m->xg, nd) || !eng_regrow(e, &m->yg, nd) ||
		    !re(&m->count, ((size_t)c->n_experts + 1) * 4) ||
		    (m->bex0 && !eng_regrow(e, &m->moe_scr,
					    e->be->moe_scratch(e->bctx, n, m->bex0))) ||
		    (m->mtp && (!eng_regrow(e, &m->hid, nd) || !eng_regrow(e, &m->mh, nd) ||
				!eng_regrow(e, &m->mcat, 2 * nd) || !re(&m->mtok, (size_t)n * 4))))
			return WK_ENOMEM; /* cap unchanged; the buffers that grew are valid */
		m->cap = n;
	}
	return m->attn_ops->grow(m, T, m->seg, nseg);
}

/* y = down(silu(m->g) * m->u), the MLP once its gate and up projections are in m->g, m->u. */
static void mlp_down(struct engine *e, struct glm_model *m, const struct glm_mlp *p, float *y,
		     int n)
{
	eng_chain_end(e); /* silu_mul is not held */
	e->be->silu_mul(e->bctx, m->g, m->u, (size_t)n * p->gate.rows);
	eng_matmul(e, y, m->g, &p->down, n);
}

static void mlp_forward(struct engine *e, struct glm_model *m, const struct glm_mlp *p,
			float *y, const float *x, int n)
{
	float *o[2] = {m->g, m->u};
	const struct be_weight *w[2] = {&p->gate, &p->up};
	eng_matmul_n(e, o, x, w, 2, n);
	mlp_down(e, m, p, y, n);
}

/* y [n][dim] = MoE(x); y is overwritten. Sharded: this rank's part of it (the shared
 * expert's TP slice, its routed experts), zeros for parts another rank leads (shard.c);
 * the caller's all_reduce completes the sum. With the grouped op the shared expert runs
 * inside it (bex.shared: y = shared(x), then the routed slots added, as here apart) where
 * this rank leads both; a rank that leads only the shared expert or only the routed ones
 * runs the shared expert apart (matmul_n with the router, silu_mul, down) or not at all. */
static void moe_forward(struct engine *e, const struct backend *be, void *c,
			struct glm_model *m, const struct glm_moe *f, float *y, const float *x,
			int n)
{
	const struct glm_cfg *g = &m->c;
	int dim = g->dim, k = g->top_k, ne = g->n_experts;
	if (f->grouped && f->bex.shared) {
		/* the shared expert runs inside the grouped op, which overwrites y */
		eng_matmul(e, m->logits, x, &f->router, n);
	} else if (g->n_shared > 0 && eng_tp_lead(e)) {
		/* the router and the shared expert's gate and up read x: one op */
		float *o[3] = {m->logits, m->g, m->u};
		const struct be_weight *w[3] = {&f->router, &f->shared.gate, &f->shared.up};
		eng_matmul_n(e, o, x, w, 3, n);
		mlp_down(e, m, &f->shared, y, n);
	} else {
		eng_dzero(e, y, (size_t)n * dim * sizeof *y);
		eng_matmul(e, m->logits, x, &f->router, n);
	}
	struct be_route r = {.n_experts = ne, .top_k = k, .n_group = g->n_group,
			     .topk_group = g->topk_group, .norm = g->norm_topk,
			     .scale = g->routed_scale};
	if (f->grouped && be->moe_route_experts) { /* routing in the grouped op's first launch */
		if (eng_ep_lead(e)) /* a decode step's ends the layer's second chain */
			eng_moe_route_experts(e, y, x, m->logits, f->bias, &r, m->idx, m->wt, n,
					      &f->bex, m->moe_scr);
		eng_chain_end(e);
		return;
	}
	eng_chain_end(e); /* the router's matmul ends the layer's second chain */
	be->moe_route(c, m->idx, m->wt, m->logits, f->bias, n, &r);
	if (f->grouped) { /* routing, grouping and experts stay on the backend */
		if (eng_ep_lead(e))
			be->moe_experts(c, y, x, m->idx, m->wt, n, &f->bex, m->moe_scr);
		return;
	}
	/* One expert at a time: group the (token, slot) pairs by expert, tokens ascending within
	 * each expert, on the host (a device waits here once per MoE layer), and send the plan
	 * back. */
	size_t nk = (size_t)n * k;
	eng_to_host(e, m->idx_h, m->idx, nk * sizeof *m->idx_h);
	eng_to_host(e, m->wt_h, m->wt, nk * sizeof *m->wt_h);
	int *start = m->count;
	memset(start, 0, ((size_t)ne + 1) * sizeof *start);
	for (size_t i = 0; i < nk; i++)
		start[m->idx_h[i] + 1]++;
	for (int ex = 0; ex < ne; ex++)
		start[ex + 1] += start[ex];
	for (size_t i = 0; i < nk; i++) {
		int at = start[m->idx_h[i]]++;
		m->rows_h[at] = (int)(i / k);
		m->rw_h[at] = m->wt_h[i];
	}
	for (int ex = ne; ex > 0; ex--)
		start[ex] = start[ex - 1];
	start[0] = 0;
	eng_to_dev(e, m->rows, m->rows_h, nk * sizeof *m->rows);
	eng_to_dev(e, m->rw, m->rw_h, nk * sizeof *m->rw);
	for (int ex = g->ex0; ex < g->ex1 && eng_ep_lead(e); ex++) {
		int cnt = start[ex + 1] - start[ex];
		if (cnt == 0)
			continue;
		be->gather_rows(c, m->xg, x, m->rows + start[ex], cnt, dim);
		mlp_forward(e, m, &f->experts[ex], m->yg, m->xg, cnt);
		be->scatter_add_rows(c, y, m->yg, m->rows + start[ex], m->rw + start[ex], cnt, dim);
	}
}

/* Decoder layer l over the T rows of m->x in these segments: m->x += the attention's output;
 * then m->tmp = the FFN's, which the caller adds (fused with the norm after it). first: m->x
 * holds the layer's input as it is (else the last layer's FFN output is still in m->tmp). */
static void layer(struct engine *e, struct glm_model *m, int l, bool first, int T,
		  const struct eng_seg *seg, int nseg)
{
	struct glm_layer *L = &m->layers[l];
	int dim = m->c.dim;
	bool lead = eng_tp_lead(e);
	/* Two chained launches a layer where the backend chains (eng_chain_begin): the norm
	 * with the attention's first projections (the family's forward ends it before its
	 * first op that is not held), and o_proj (the forward begins it) with the residual add,
	 * the norm, the router's matmul and the grouped MoE op (a dense layer: the MLP's gate
	 * and up; ended before its SiLU). */
	eng_chain_begin(e);
	if (first) {
		struct be_norm n0 = {.y = m->xb, .x = m->x, .w = L->attn_norm, .n = T, .dim = dim,
				     .eps = m->c.eps};
		eng_norm_n(e, &n0, 1);
	} else {
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, L->attn_norm, T, dim, m->c.eps);
	}
	m->attn_ops->forward(e, m, l, m->tmp, m->xb, T, seg, nseg);
	eng_chain_begin(e); /* on, where the forward did not begin it before o_proj */
	if (!lead)
		eng_dzero(e, m->tmp, (size_t)T * dim * sizeof *m->tmp);
	eng_all_reduce(e, m->tmp, (size_t)T * dim);
	eng_add_rmsnorm(e, m->x, m->tmp, m->xb, L->mlp_norm, T, dim, m->c.eps);
	if (L->moe) {
		moe_forward(e, e->be, e->bctx, m, &L->ffn, m->tmp, m->xb, T);
	} else {
		mlp_forward(e, m, &L->mlp, m->tmp, m->xb, T);
		if (!lead)
			eng_dzero(e, m->tmp, (size_t)T * dim * sizeof *m->tmp);
	}
	eng_chain_end(e);
	eng_all_reduce(e, m->tmp, (size_t)T * dim);
}

/* ---- MTP drafts ----------------------------------------------------------------------------
 *
 * The MTP layer at position q reads the main model's hidden state h_q (after the final norm)
 * and the token at q + 1, and predicts the token at q + 2 (DeepSeek-V3's multi-token
 * prediction, glm.md section 3.6): x = eh_proj([enorm(embed(t_{q+1})) | hnorm(h_q)]), its own
 * decoder layer (attention over its own caches of positions 0..q), shared_head.norm, then the
 * main lm_head. The embedding at q = 0 is zero (vLLM's DeepSeek MTP masks it there).
 *
 * After each step, an item's positions whose next token is now known (the prompt's, the kept
 * drafts', and the last kept one's: the step's own output) go through the MTP layer, which
 * keeps its caches as long as the main ones (e->mtp_len); a position whose next token is not
 * known yet (an item without token: a chunk of a prompt) waits in pend for the next step.
 * The last row's prediction is the first draft; each further draft runs the MTP layer on the
 * draft before it and the MTP layer's own hidden state (before shared_head.norm), at the
 * positions after, whose cache rows the next step writes again.
 *
 * A step in which no item asks for drafts (nor sets mtp_cache) runs no MTP pass (a caller
 * that never drafts pays nothing for the layer); the positions it added keep no MTP cache
 * rows, so drafts after them attend to stale rows there: worse drafts, never other outputs
 * (the scheduler's items all ask for drafts or set mtp_cache once it drafts with the MTP
 * layer). An item with mtp_cache and no drafts has its rows run through the layer, and no
 * lm_head. */

/* One MTP pass over R rows in m->mseg[0..nseg): tokens m->mtok (-1: a zero embedding), the
 * hidden states m->mh. Leaves the MTP layer's output hidden states (before
 * shared_head.norm) in m->x. */
static int mtp_pass(struct engine *e, struct glm_model *m, int R, int nseg, char *err,
		    size_t errsz)
{
	int dim = m->c.dim;
	size_t row = (size_t)dim * sizeof(float);
	m->keys_max = 0;
	for (int s = 0; s < nseg; s++) {
		const struct eng_seg *g = &m->mseg[s];
		for (int j = 0; j < g->n; j++) {
			m->pos_h[g->off + j] = g->pos0 + j;
			m->pos_h[R + g->off + j] = g->seq;
		}
		if (g->pos0 + g->n > m->keys_max)
			m->keys_max = g->pos0 + g->n;
	}
	int rc = m->attn_ops->grow(m, R, m->mseg, nseg) != WK_OK
			 ? wk_errf(err, errsz, WK_ENOMEM, "out of memory for an MTP pass of %d rows", R)
			 : WK_OK;
	if ((rc = eng_agree(e, rc, err, errsz)) != WK_OK) /* sharded: every rank stops */
		return rc;
	eng_to_dev(e, m->pos, m->pos_h, (size_t)2 * R * sizeof *m->pos);
	eng_embed(e, m->x, eng_host_mem(e) ? NULL : m->xh, m->mtok, R, m->embed, m->c.vocab0, dim);
	struct be_norm nr[2] = {
		{.y = m->xb, .x = m->x, .w = m->enorm, .n = R, .dim = dim, .eps = m->c.eps},
		{.y = m->tmp, .x = m->mh, .w = m->hnorm, .n = R, .dim = dim, .eps = m->c.eps}};
	eng_norm_n(e, nr, 2);
	eng_dcopy_2d(e, m->mcat, 2 * row, m->xb, row, row, (size_t)R);
	eng_dcopy_2d(e, m->mcat + dim, 2 * row, m->tmp, row, row, (size_t)R);
	eng_matmul(e, m->x, m->mcat, &m->eh_proj, R);
	layer(e, m, m->c.n_layers, true, R, m->mseg, nseg);
	e->be->add(e->bctx, m->x, m->tmp, (size_t)R * dim);
	return WK_OK;
}

int glm_caches(struct engine *e, struct eng_cache *c)
{
	struct glm_model *m = e->model;
	int n = m->attn_ops->caches(e, m, c);
	/* the MTP layer's waiting hidden state (its cache is a layer of the attention's) */
	c[n++] = (struct eng_cache){m->pend, (size_t)m->c.dim * sizeof(float), 1, 1, true};
	return n;
}

/* The drafts of the items that ask for them (eng_item.drafts), after the main pass of the
 * step that left its hidden states after the final norm in hid (the items' rows, as
 * m->seg lays them out). */
static int mtp_drafts(struct engine *e, struct glm_model *m, const struct eng_item *items,
		      int n_items, const float *hid, char *err, size_t errsz)
{
	int dim = m->c.dim, R = 0, ns = 0, nd = 0, most = 0;
	size_t row = (size_t)dim * sizeof(float);
	bool lead = e->rank == 0; /* writes the outputs; sharded, the others read them */
	const struct eng_item *src = e->world > 1 ? shard_items(e) : items;
	for (int i = 0; i < n_items; i++) /* (run() calls this where one drafts) */
		most = items[i].drafts > most ? items[i].drafts : most;
	for (int i = 0; i < n_items; i++) {
		const struct eng_item *it = &src[i]; /* its token: rank 0's outputs */
		const struct eng_seg *g = &m->seg[i];
		int seq = it->seq, p0 = g->pos0, k = it->rows > 1 ? it->rows : 1, a = 0, end;
		int q0 = m->q0[i];
		if (q0 != p0 - 1)
			q0 = p0; /* (a gap: eng_forward's steps run no MTP pass; those rows stay) */
		if (it->token) {
			while (a < k - 1 && it->token[a] == it->tokens[it->n - k + a + 1])
				a++;
			end = p0 + it->n - k + a + 1;
		} else {
			end = p0 + it->n - 1; /* the last row waits for its next token */
			eng_dcopy(e, m->pend + (size_t)seq * dim, hid + (size_t)(g->off + it->n - 1) * dim,
				  row);
		}
		if (lead)
			e->mtp_len[seq] = end;
		if (end <= q0)
			continue;
		for (int q = q0; q < end; q++) {
			int t = q == end - 1 && it->token ? it->token[a] : it->tokens[q + 1 - p0];
			m->mtok[R + q - q0] = q == 0 ? -1 : t;
		}
		if (q0 < p0)
			eng_dcopy(e, m->mh + (size_t)R * dim, m->pend + (size_t)seq * dim, row);
		if (end > p0)
			eng_dcopy(e, m->mh + (size_t)(R + p0 - q0) * dim, hid + (size_t)g->off * dim,
				  (size_t)(end - p0) * row);
		m->mseg[ns++] = (struct eng_seg){.seq = seq, .pos0 = q0, .n = end - q0, .off = R};
		R += end - q0;
		if (it->token && it->drafts > 0) {
			m->dj[nd] = ns - 1; /* its segment and its item */
			m->di[nd++] = i;
		}
	}
	int rc = R > 0 ? mtp_pass(e, m, R, ns, err, errsz) : WK_OK;
	for (int d = 0; d < most && nd > 0 && rc == WK_OK; d++) {
		/* each drafting item's last row: its logits, and the next pass's hidden input */
		for (int j = 0; j < nd; j++) {
			const struct eng_seg *g = &m->mseg[m->dj[j]];
			eng_dcopy(e, m->mh + (size_t)j * dim, m->x + (size_t)(g->off + g->n - 1) * dim,
				  row);
		}
		e->be->rmsnorm(e->bctx, m->xb, m->mh, m->head_norm, nd, dim, m->c.eps);
		eng_matmul(e, m->lg, m->xb, &m->lm_head, nd);
		eng_gather_vocab(e, lead ? m->lg : NULL, false, m->lg, nd, m->c.l_vocab, m->gath);
		for (int j = 0; j < nd && lead; j++) {
			const struct eng_item *it = &src[m->di[j]];
			m->ditem[j] = (struct eng_item){
				.seq = it->seq, .token = &m->dtok[j],
				.logits = it->draft_logits ? it->draft_logits + (size_t)d * m->c.vocab
							   : NULL};
		}
		if (lead && (rc = eng_outputs(e, m->ditem, nd, m->lg, m->c.vocab, err, errsz)) ==
				    WK_OK)
			rc = eng_sync(e, err, errsz);
		for (int j = 0; j < nd && lead && rc == WK_OK; j++)
			src[m->di[j]].draft[d] = m->dtok[j];
		/* sharded: the drafts are rank 0's, read after this */
		if ((rc = eng_agree(e, rc, err, errsz)) != WK_OK)
			break;
		for (int j = 0; j < nd && !lead; j++)
			m->dtok[j] = src[m->di[j]].draft[d];
		/* the items that want another draft, at the position after, within the context */
		int keep = 0;
		for (int j = 0; j < nd; j++) {
			const struct eng_item *it = &src[m->di[j]];
			const struct eng_seg *g = &m->mseg[m->dj[j]];
			int pos = g->pos0 + g->n; /* the next pass's position for it */
			if (d + 1 >= it->drafts)
				continue;
			if (pos >= m->c.max_seq) {
				for (int x = d + 1; x < it->drafts && lead; x++)
					it->draft[x] = -1;
				continue;
			}
			if (keep != j)
				eng_dcopy(e, m->mh + (size_t)keep * dim, m->mh + (size_t)j * dim, row);
			m->mtok[keep] = m->dtok[j];
			m->mseg[keep] = (struct eng_seg){.seq = it->seq, .pos0 = pos, .n = 1, .off = keep};
			m->dj[keep] = keep;
			m->di[keep++] = m->di[j];
		}
		nd = keep;
		if (nd > 0)
			rc = mtp_pass(e, m, nd, nd, err, errsz);
	}
	return rc;
}

/* One batched pass over every item's tokens (continuous batching), as llama.c's run: the
 * embedding, norms, MLP/MoE and lm_head see all T tokens at once; the family's attention
 * takes the step's segments. all_logits (one item only): logits of every token into
 * items[0].logits [T][vocab]; else each item's last token into its logits. Sharded (shard.c):
 * this rank's part, partial sums completed by eng_all_reduce, vocab-parallel embedding and
 * lm_head; items' logits are NULL on ranks other than 0. */
static int run(struct engine *e, const struct eng_item *items, int n_items, bool all_logits,
	       char *err, size_t errsz)
{
	struct glm_model *m = e->model;
	const struct backend *be = e->be;
	void *c = e->bctx;
	int T = 0;
	m->keys_max = 0;
	for (int i = 0; i < n_items; i++) {
		m->seg[i] = (struct eng_seg){.seq = items[i].seq, .pos0 = e->seq_len[items[i].seq],
					     .n = items[i].n, .off = T};
		T += items[i].n;
		if (m->seg[i].pos0 + items[i].n > m->keys_max)
			m->keys_max = m->seg[i].pos0 + items[i].n;
	}
	if (m->mtp) /* read before the step's first collective: rank 0 writes them after it */
		for (int i = 0; i < n_items; i++)
			m->q0[i] = e->mtp_len[items[i].seq];
	/* whole-vocabulary rows needed outside the items' own buffers (in host memory, the
	 * logits of every position go straight into items[0].logits) */
	bool host = eng_host_mem(e);
	int rows_out = eng_out_rows(items, n_items);
	int lg_rows = all_logits ? (e->world > 1 || !host ? T : 0) : rows_out;
	if (m->mtp && !all_logits && lg_rows < n_items)
		lg_rows = n_items; /* a draft row an item */
	/* an MTP pass has a row more an item, its next token's (mtp_pass) */
	int rc = grow(e, m, T + (m->mtp ? n_items : 0), n_items, lg_rows, e->world) != WK_OK
			 ? wk_errf(err, errsz, WK_ENOMEM, "out of memory for a step of %d tokens", T)
			 : WK_OK;
	if ((rc = eng_agree(e, rc, err, errsz)) != WK_OK)
		return rc;
	int dim = m->c.dim;
	for (int i = 0; i < n_items; i++)
		for (int j = 0; j < items[i].n; j++) {
			m->tok[m->seg[i].off + j] = items[i].tokens[j];
			m->pos_h[m->seg[i].off + j] = m->seg[i].pos0 + j;
			m->pos_h[T + m->seg[i].off + j] = m->seg[i].seq; /* its sequence */
		}
	eng_to_dev(e, m->pos, m->pos_h, (size_t)2 * T * sizeof *m->pos);
	/* the embedding rows are read on the host (from the checkpoint) */
	eng_embed(e, m->x, host ? NULL : m->xh, m->tok, T, m->embed, m->c.vocab0, dim);
	/* Each residual add is fused with the norm after it (the next layer's, or the final
	 * one): m->tmp holds the last FFN's output until then. */
	for (int l = 0; l < m->c.n_layers; l++)
		layer(e, m, l, l == 0, T, m->seg, n_items);
	if (all_logits) {
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, m->final_norm, T, dim, m->c.eps);
		if (e->world == 1 && host) {
			eng_matmul(e, items[0].logits, m->xb, &m->lm_head, T);
			return eng_sync(e, err, errsz);
		}
		eng_matmul(e, m->lg, m->xb, &m->lm_head, T);
		if (e->world == 1)
			eng_to_host(e, items[0].logits, m->lg, (size_t)T * m->c.vocab * sizeof(float));
		else
			eng_gather_vocab(e, items[0].logits, true, m->lg, T, m->c.l_vocab, m->gath);
		return eng_sync(e, err, errsz);
	}
	/* Only each item's last token (its last `rows`) needs logits: lm_head over those rows,
	 * then (sharded) the vocabulary slices gathered in order into lg, rank 0 only. */
	const float *hid = m->xb; /* the hidden states after the final norm, for the MTP layer */
	if (T == rows_out && !e->unfused) { /* every row is an output (decode) */
		eng_chain_begin(e); /* the final norm and lm_head: one launch */
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, m->final_norm, T, dim, m->c.eps);
	} else if (m->mtp) { /* the MTP layer reads every row's */
		be->add(c, m->x, m->tmp, (size_t)T * dim);
		be->rmsnorm(c, m->hid, m->x, m->final_norm, T, dim, m->c.eps);
		eng_pick_rows(e, m->xb, m->hid, items, n_items, dim);
		hid = m->hid;
	} else {
		be->add(c, m->x, m->tmp, (size_t)T * dim);
		eng_pick_rows(e, m->xb, m->x, items, n_items, dim);
		be->rmsnorm(c, m->xb, m->xb, m->final_norm, rows_out, dim, m->c.eps);
	}
	eng_matmul(e, m->lg, m->xb, &m->lm_head, rows_out);
	eng_chain_end(e);
	eng_gather_vocab(e, e->rank == 0 ? m->lg : NULL, false, m->lg, rows_out, m->c.l_vocab,
			 m->gath);
	if (e->rank == 0 && (rc = eng_outputs(e, items, n_items, m->lg, m->c.vocab, err, errsz)) ==
				   WK_OK)
		rc = eng_sync(e, err, errsz);
	bool drafting = false; /* (every rank sees the same items) */
	for (int i = 0; i < n_items && m->mtp; i++)
		drafting |= items[i].drafts > 0 || items[i].mtp_cache;
	if (!drafting)
		return rc;
	/* sharded: the other ranks read rank 0's tokens after this (shard_items) */
	if ((rc = eng_agree(e, rc, err, errsz)) != WK_OK)
		return rc;
	return mtp_drafts(e, m, items, n_items, hid, err, errsz);
}

int glm_step(struct engine *e, const struct eng_item *items, int n, char *err, size_t errsz)
{
	return run(e, items, n, false, err, errsz);
}

/* Sequence 0, truncated to pos0 tokens, then tokens appended (eng_forward's contract). */
int glm_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits, bool all,
		char *err, size_t errsz)
{
	struct eng_item it = {.seq = 0, .tokens = tokens, .n = n, .logits = logits};
	(void)pos0; /* eng_forward has set seq_len[0] = pos0 */
	return run(e, &it, 1, all, err, errsz);
}

/* ---- snapshot layout ------------------------------------------------------------------------ */

/* Left out of a snapshot: the MTP layer unless asked for (eng_snap_opts.mtp), and then its
 * copies of the embedding and lm_head (never read: mtp_load) and any MTP layer past the first
 * (the engine runs one). */
static bool mtp_unread(const char *leaf, int l, int layers, bool mtp)
{
	return !mtp || l > layers || !strcmp(leaf, "embed_tokens.weight") ||
	       !strncmp(leaf, "shared_head.head.", 17);
}

/* Unsharded: every tensor whole on rank 0, but the MTP layer's (with mtp: but what it never
 * reads, mtp_unread). FP8 block
 * scales and the router bias keep F32 whatever --dtype says: the kernels read them as F32.
 *
 * Sharded (layout.c has the mechanics, shard.c the run): embed_tokens and lm_head split their
 * vocabulary rows over tp; the dense MLP and the shared experts split intermediate rows
 * (gate_proj, up_proj) and columns (down_proj) over tp; routed expert e lives whole on EP rank
 * e / (n_routed_experts / ep), contiguous blocks of experts, so that a rank's experts are
 * adjacent in the checkpoint and in its file (balanced placement by measured load would need
 * routing statistics we do not have at snapshot time); the router (mlp.gate.weight and
 * e_score_correction_bias) and every norm are replicated, so every rank makes the same
 * routing choice; the attention tensors follow the family's rule (attn). A tensor without a
 * rule is refused rather than guessed. */
static int plan_sharded(struct hf_model *hf, struct plan *p, glm_attn_plan attn, bool mtp,
			char *err, size_t errsz)
{
	json_t *cfg = hf_config(hf);
	struct glm_cfg c;
	int rc, lo, hi;
	if ((rc = read_cfg(&c, cfg, 0, err, errsz)) ||
	    (rc = shard_even(c.inter, p->tp, 0, "intermediate_size", "tp", &lo, &hi, err, errsz)) ||
	    (rc = shard_even((long long)c.moe_inter * c.n_shared, p->tp, 0,
			     "moe_intermediate_size * n_shared_experts", "tp", &lo, &hi, err, errsz)) ||
	    (rc = shard_even(c.vocab, p->tp, 0, "vocab_size", "tp", &lo, &hi, err, errsz)) ||
	    (rc = shard_even(c.n_experts, p->ep, 0, "n_routed_experts", "ep", &lo, &hi, err, errsz)))
		return rc;
	int per_rank = c.n_experts / p->ep;
	enum { NO_RULE = 1 }; /* not a WK_ code: those are <= 0 */
	for (size_t i = 0; i < hf_tensor_count(hf); i++) {
		const char *name = hf_tensor_at(hf, i)->name, *leaf;
		int l, at = 0, x;
		if (wk_ends_with(name, "_scale_inv"))
			continue; /* sliced with its FP8 weight */
		if (sscanf(name, "model.layers.%d.%n", &l, &at) == 1 && at > 0) {
			leaf = name + at;
			if (l >= c.n_layers && mtp_unread(leaf, l, c.n_layers, mtp))
				continue;
			if (!strcmp(leaf, "input_layernorm.weight") ||
			    !strcmp(leaf, "enorm.weight") || !strcmp(leaf, "hnorm.weight") ||
			    !strcmp(leaf, "eh_proj.weight") || !strcmp(leaf, "shared_head.norm.weight") ||
			    !strcmp(leaf, "post_attention_layernorm.weight") ||
			    !strcmp(leaf, "mlp.gate.weight") ||
			    !strcmp(leaf, "mlp.gate.e_score_correction_bias"))
				rc = plan_replicated(p, name, err, errsz);
			else if (!strncmp(leaf, "self_attn.", 10))
				rc = attn(p, cfg, name, leaf + 10, err, errsz);
			else if (sscanf(leaf, "mlp.experts.%d.", &x) == 1 && x >= 0 && x < c.n_experts)
				rc = plan_expert(p, name, x / per_rank, err, errsz);
			else if (!strncmp(leaf, "mlp.", 4) && (wk_ends_with(leaf, "gate_proj.weight") ||
							       wk_ends_with(leaf, "up_proj.weight")))
				rc = plan_tp(p, name, 0, err, errsz);
			else if (!strncmp(leaf, "mlp.", 4) && wk_ends_with(leaf, "down_proj.weight"))
				rc = plan_tp(p, name, 1, err, errsz);
			else
				rc = NO_RULE;
		} else if (!strcmp(name, "model.embed_tokens.weight") ||
			   !strcmp(name, "lm_head.weight")) {
			rc = plan_tp(p, name, 0, err, errsz);
		} else if (!strcmp(name, "model.norm.weight")) {
			rc = plan_replicated(p, name, err, errsz);
		} else {
			rc = NO_RULE;
		}
		if (rc == NO_RULE)
			return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: no sharding rule for '%s'",
				       hf_dir(hf), name);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

int glm_plan(struct hf_model *hf, struct plan *p, glm_attn_plan attn, bool mtp, char *err,
	     size_t errsz)
{
	long long layers, nextn;
	int rc = cfg_int(hf_config(hf), "num_hidden_layers", -1, 1, 4096, &layers, err, errsz);
	if (rc || (rc = cfg_int(hf_config(hf), "num_nextn_predict_layers", 0, 0, 64, &nextn, err,
				errsz)))
		return rc;
	if (mtp && nextn == 0)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: the model has no MTP layer to keep "
			       "(num_nextn_predict_layers is 0)", hf_dir(hf));
	if (p->world > 1)
		return plan_sharded(hf, p, attn, mtp, err, errsz);
	enum dt_type cast = p->cast;
	for (size_t i = 0; i < hf_tensor_count(hf); i++) {
		const char *name = hf_tensor_at(hf, i)->name;
		int l, at = 0;
		if (sscanf(name, "model.layers.%d.%n", &l, &at) == 1 && at > 0 && l >= layers &&
		    mtp_unread(name + at, l, (int)layers, mtp))
			continue;
		p->cast = wk_ends_with(name, "_scale_inv") ||
					  wk_ends_with(name, "e_score_correction_bias")
				  ? DT_INVALID
				  : cast;
		rc = plan_copy(p, name, 0, err, errsz);
		p->cast = cast;
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}
