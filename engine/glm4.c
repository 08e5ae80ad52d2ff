/*
 * glm4.c - the GLM-4.5 / 4.6 / 4.7 family (Glm4MoeForCausalLM, model_type glm4_moe):
 * grouped-query attention with q/k/v biases (attention_bias; o_proj has none), optional
 * per-head RMSNorm of q and k (use_qk_norm, eps rms_norm_eps, before RoPE), and partial RoPE:
 * only the first head_dim * partial_rotary_factor dims of each head rotate, half-split
 * (rotate_half, pairs j and j + rot/2) within them, as transformers' modeling_glm4_moe.py
 * apply_rotary_pos_emb does (glm.md 3.5). The MLP/MoE and the skeleton are in glm.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/glm_int.h"

struct g4_layer {
	struct be_weight wq;     /* (n_heads * head_dim, dim) */
	struct be_weight wk, wv; /* (n_kv * head_dim, dim) */
	struct be_weight wo;     /* (dim, n_heads * head_dim) */
	float *bq;               /* (n_heads * head_dim) or NULL */
	float *bk, *bv;          /* (n_kv * head_dim) or NULL */
	float *qn, *kn;          /* (head_dim) q_norm / k_norm, or NULL */
};

/* Vectors, caches and scratch are the backend's memory (glm_int.h). */

struct g4 {
	int n_heads, n_kv, head_dim, rot;
	struct g4_layer *layers; /* [n_attn]: the MTP layer's last when it is loaded */
	struct eng_gqa kv;       /* the KV caches */
	int cap;
	float *q, *att; /* (cap, n_heads * head_dim) */
	float *kt, *vt; /* (cap, n_kv * head_dim) the step's new keys and values */
};

static int g4_load(struct engine *e, struct glm_model *m, char *err, size_t errsz)
{
	json_t *cfg = e->config;
	long long heads, kv, hd;
	double theta, partial;
	int bias, qk_norm, rc;
	if ((rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_key_value_heads", heads, 1, heads, &kv, err, errsz)) ||
	    (rc = cfg_int(cfg, "head_dim", m->c.dim / heads, 2, 4096, &hd, err, errsz)) ||
	    (rc = cfg_bool(cfg, "attention_bias", 0, &bias, err, errsz)) ||
	    (rc = cfg_bool(cfg, "use_qk_norm", 0, &qk_norm, err, errsz)) ||
	    (rc = glm_rope_cfg(cfg, 10000.0, 0.5, &theta, &partial, err, errsz)))
		return rc;
	if (heads % kv != 0)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: num_attention_heads %lld is not a multiple of "
			       "num_key_value_heads %lld", heads, kv);
	int rot = (int)(hd * partial); /* int(head_dim * partial_rotary_factor), as HF */
	if (rot < 2 || rot % 2 != 0)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: head_dim %lld * partial_rotary_factor %g = %d rotary "
			       "dims; it must be even and >= 2", hd, partial, rot);
	struct g4 *a = glm_own(m, calloc(1, sizeof *a));
	if (!a)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	m->attn = a;
	m->c.theta = (float)theta;
	/* this rank's heads (shard.c), as g4_plan_attn cut them */
	struct shard_heads sh;
	if ((rc = shard_heads((int)heads, (int)kv, e->tp, eng_tp_rank(e), &sh, err, errsz)))
		return rc;
	a->n_heads = sh.nq;
	a->n_kv = sh.nkv;
	a->head_dim = (int)hd;
	a->rot = rot;
	int qd = a->n_heads * a->head_dim, kvd = a->n_kv * a->head_dim, dim = m->c.dim;
	if ((rc = eng_kv_check(e, BE_OP_ATTENTION, err, errsz)))
		return rc;

	a->layers = glm_own(m, calloc((size_t)m->c.n_attn, sizeof *a->layers));
	if (!a->layers)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int l = 0; l < m->c.n_attn; l++) {
		struct g4_layer *L = &a->layers[l];
		char nm[256];
#define NAME(s) (snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s", l, s), nm)
		if ((rc = glm_weight(e, m, NAME("q_proj.weight"), qd, dim, &L->wq, err, errsz)) ||
		    (rc = glm_weight(e, m, NAME("k_proj.weight"), kvd, dim, &L->wk, err, errsz)) ||
		    (rc = glm_weight(e, m, NAME("v_proj.weight"), kvd, dim, &L->wv, err, errsz)) ||
		    (rc = glm_weight(e, m, NAME("o_proj.weight"), dim, qd, &L->wo, err, errsz)))
			return rc;
		if (bias &&
		    ((rc = glm_vector(e, m, NAME("q_proj.bias"), qd, &L->bq, err, errsz)) ||
		     (rc = glm_vector(e, m, NAME("k_proj.bias"), kvd, &L->bk, err, errsz)) ||
		     (rc = glm_vector(e, m, NAME("v_proj.bias"), kvd, &L->bv, err, errsz))))
			return rc;
		if (qk_norm &&
		    ((rc = glm_vector(e, m, NAME("q_norm.weight"), a->head_dim, &L->qn, err, errsz)) ||
		     (rc = glm_vector(e, m, NAME("k_norm.weight"), a->head_dim, &L->kn, err, errsz))))
			return rc;
#undef NAME
		if (l < m->c.n_layers) /* (the MTP layer's are not a decode step's) */
			m->attn_bytes += glm_weight_bytes(&L->wq) + glm_weight_bytes(&L->wk) +
					 glm_weight_bytes(&L->wv) + glm_weight_bytes(&L->wo);
	}
	return eng_gqa_alloc(e, &a->kv, m->c.n_attn, m->c.max_seq, a->n_kv, a->head_dim, err,
			     errsz);
}

static int g4_grow(struct glm_model *m, int T, const struct eng_seg *seg, int nseg)
{
	struct g4 *a = m->attn;
	(void)seg;
	(void)nseg;
	if (T <= a->cap)
		return WK_OK;
	size_t qd = (size_t)a->n_heads * a->head_dim, kvd = (size_t)a->n_kv * a->head_dim;
	float **bufs[] = {&a->q, &a->att, &a->kt, &a->vt};
	size_t width[] = {qd, qd, kvd, kvd};
	for (int i = 0; i < 4; i++)
		if (!eng_regrow(m->e, bufs[i], (size_t)T * width[i] * sizeof(float)))
			return WK_ENOMEM;
	a->cap = T;
	return WK_OK;
}

static void g4_forward(struct engine *e, struct glm_model *m, int l, float *out, const float *x,
		       int T, const struct eng_seg *seg, int nseg)
{
	struct g4 *a = m->attn;
	struct g4_layer *L = &a->layers[l];
	int kvd = a->n_kv * a->head_dim;

	/* q, k, v read x: one op. With one segment and an f32 cache, k and v land straight in
	 * its caches (biased, normalised and rotated there); else through the step's rows. */
	bool direct = nseg == 1 && !e->unfused && e->kv == DT_F32;
	float *kt = direct ? eng_gqa_f32(e, &a->kv, false, seg[0].seq, l, seg[0].pos0) : a->kt;
	float *vt = direct ? eng_gqa_f32(e, &a->kv, true, seg[0].seq, l, seg[0].pos0) : a->vt;
	float *o[3] = {a->q, kt, vt};
	const struct be_weight *w[3] = {&L->wq, &L->wk, &L->wv};
	eng_matmul_n(e, o, x, w, 3, T);
	/* then one op: q and k biased, normalised per head (use_qk_norm) and rotated (partial,
	 * half-split), v biased; then k and v stored into the caches (bf16 and fp8: one cast
	 * op for all the step's sequences) */
	struct be_norm nr[3] = {
		{.y = a->q, .x = a->q, .w = L->qn, .n = T * a->n_heads, .dim = a->head_dim,
		 .eps = m->c.eps, .rope_pos = m->pos, .rope_dim = a->rot, .theta = m->c.theta,
		 .add = L->bq, .heads = a->n_heads, .half = true, .bare = !L->qn},
		{.y = kt, .x = kt, .w = L->kn, .n = T * a->n_kv, .dim = a->head_dim,
		 .eps = m->c.eps, .rope_pos = m->pos, .rope_dim = a->rot, .theta = m->c.theta,
		 .add = L->bk, .heads = a->n_kv, .half = true, .bare = !L->kn},
		{.y = vt, .x = vt, .n = T * a->n_kv, .dim = a->head_dim, .add = L->bv,
		 .heads = a->n_kv, .bare = true}};
	eng_norm_n(e, nr, L->bv ? 3 : 2);
	for (int s = 0; s < nseg && !direct; s++) {
		const struct eng_seg *g = &seg[s];
		eng_gqa_store(e, &a->kv, g->seq, l, g->pos0, a->kt + (size_t)g->off * kvd,
			      a->vt + (size_t)g->off * kvd, g->n);
	}
	/* the chain glm.c began with the layer's norm ends here (a decode step's: that norm,
	 * q/k/v, their bias, norms and rotations, and the stores, one launch); the attention
	 * is not held */
	eng_chain_end(e);
	/* several sequences: one attention over the short segments, each token over its own
	 * sequence's cache (m->pos: positions, then sequences), a prefill's apart; unfused, one
	 * a sequence */
	eng_gqa_attend_step(e, &a->kv, l, seg, nseg, m->pos, m->keys_max, a->att, a->q, T,
			    a->n_heads);
	/* o_proj begins the next chain: glm.c adds the residual and norm and the FFN's first
	 * matmul (as GLM-5's attention does) */
	eng_chain_begin(e);
	eng_matmul(e, out, a->att, &L->wo, T);
}

static void g4_free(struct glm_model *m)
{
	struct g4 *a = m->attn;
	if (!a)
		return;
	eng_gqa_free(m->e, &a->kv);
	void *bufs[] = {a->q, a->att, a->kt, a->vt};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		eng_release(m->e, bufs[i]);
}

/* Sharded layout of the attention: q_proj (weight and bias) rows by query heads, k_proj and
 * v_proj rows by kv heads (shard_heads: split, or one shared kv head per shard when tp is a
 * multiple of num_key_value_heads), o_proj columns by query heads; q_norm and k_norm (one
 * head_dim vector shared by every head) replicated. */
static int g4_plan_attn(struct plan *p, json_t *cfg, const char *name, const char *leaf,
			char *err, size_t errsz)
{
	long long heads, kv, dim, hd;
	int rc;
	if ((rc = cfg_int(cfg, "hidden_size", -1, 1, 1 << 16, &dim, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_key_value_heads", heads, 1, heads, &kv, err, errsz)) ||
	    (rc = cfg_int(cfg, "head_dim", dim / heads, 2, 4096, &hd, err, errsz)))
		return rc;
	int64_t qlo[COMM_MAX_WORLD], qhi[COMM_MAX_WORLD], klo[COMM_MAX_WORLD], khi[COMM_MAX_WORLD];
	for (int k = 0; k < p->tp; k++) {
		struct shard_heads sh;
		if ((rc = shard_heads((int)heads, (int)kv, p->tp, k, &sh, err, errsz)))
			return rc;
		qlo[k] = sh.q0 * hd;
		qhi[k] = (sh.q0 + sh.nq) * hd;
		klo[k] = sh.kv0 * hd;
		khi[k] = (sh.kv0 + sh.nkv) * hd;
	}
	if (!strcmp(leaf, "q_proj.weight") || !strcmp(leaf, "q_proj.bias"))
		return plan_tp_ranges(p, name, 0, qlo, qhi, err, errsz);
	if (!strncmp(leaf, "k_proj.", 7) || !strncmp(leaf, "v_proj.", 7))
		return plan_tp_ranges(p, name, 0, klo, khi, err, errsz);
	if (!strcmp(leaf, "o_proj.weight"))
		return plan_tp_ranges(p, name, 1, qlo, qhi, err, errsz);
	if (!strcmp(leaf, "q_norm.weight") || !strcmp(leaf, "k_norm.weight"))
		return plan_replicated(p, name, err, errsz);
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "no sharding rule for '%s'", name);
}

static int g4_plan(struct hf_model *hf, const struct eng_snap_opts *o, struct plan *p,
		   char *err, size_t errsz)
{
	return glm_plan(hf, p, g4_plan_attn, o->mtp, err, errsz);
}

static int g4_caches(struct engine *e, struct glm_model *m, struct eng_cache *c)
{
	struct g4 *a = m->attn;
	return eng_gqa_caches(e, &a->kv, c);
}

static const struct glm_attn g4_attn = {
	.load = g4_load,
	.grow = g4_grow,
	.forward = g4_forward,
	.caches = g4_caches,
	.free = g4_free,
};

static int g4_family_load(struct engine *e, char *err, size_t errsz)
{
	return glm_load(e, &g4_attn, err, errsz);
}

const struct family fam_glm4 = {
	.arch = "Glm4MoeForCausalLM",
	.load = g4_family_load,
	.forward = glm_forward,
	.step = glm_step,
	.caches = glm_caches,
	.free = glm_free,
	.plan = g4_plan,
};
