/*
 * glm5.c - the GLM-5 family (GlmMoeDsaForCausalLM, model_type glm_moe_dsa): DeepSeek-style
 * multi-head latent attention (MLA) with the DSA lightning indexer on every "full" layer.
 * The MLP/MoE and the decoder skeleton are in glm.c. Facts and sources: glm.md 3.2 and 3.3;
 * where implementations disagree we follow transformers' modular_glm_moe_dsa.py (and the
 * DeepseekV3/V32 modules it inherits):
 *   - RoPE is interleaved (pairs 2i, 2i+1) on the MLA rope slice and on the indexer's rope
 *     part (apply_rotary_pos_emb_interleave), whatever rope_interleave says; a config that
 *     asks for anything else is refused rather than silently run differently.
 *   - q_a_layernorm and kv_a_layernorm use eps 1e-6 (DeepseekV3RMSNorm's default: transformers
 *     does not pass rms_norm_eps to them; vLLM/SGLang use rms_norm_eps, 1e-5).
 *   - The indexer's k_norm is a LayerNorm with bias, eps 1e-6; its score is
 *     sum_h w_h * relu(q_h . k / sqrt(index_head_dim)) with w = weights_proj(x) / sqrt(heads).
 *   - Softmax scale qk_head_dim^-0.5 (rope_type default: no YaRN mscale; other rope types
 *     are refused).
 *   - indexer_types (or index_topk_freq / index_skip_topk_offset / index_topk_pattern, as
 *     GlmMoeDsaConfig derives them): a "shared" layer has no indexer and reuses the previous
 *     full layer's selection. GLM-5 itself is all "full".
 *
 * Per token and layer the caches hold only the compressed latent c_kv (kv_lora_rank, after
 * kv_a_layernorm) and the rotated k_pe (qk_rope_head_dim): 576 values at GLM-5 sizes; plus
 * the indexer's key (index_head_dim) on full layers.
 *
 * Two equal ways to attend (chosen per call by their arithmetic cost, or forced with
 * WICK_GLM_MLA=absorb|expand for tests):
 *   absorbed (decode): q~_h = q_nope,h . W_uk,h (kv_lora_rank), scores over [c_kv | k_pe],
 *     context in latent space, then W_uv,h; kv_b_proj is never expanded per position.
 *   expanded (prefill): [k_nope | v] = kv_b_proj(c_kv) for every position, then ordinary
 *     attention with k = [k_nope,h | k_pe].
 * The DSA selection (exact top-k, ties to the lower position) restricts both the same way;
 * when every query has at most index_topk keys it selects them all and attention is dense.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/glm_int.h"

#define MLA_NORM_EPS 1e-6f     /* q_a_layernorm, kv_a_layernorm (see above) */
#define INDEXER_NORM_EPS 1e-6f /* indexer.k_norm LayerNorm */

struct g5_layer {
	struct be_weight q_a;      /* (q_lora, dim) */
	float *q_a_norm;           /* (q_lora) */
	struct be_weight q_b;      /* (n_heads * (d_nope + d_rope), q_lora) */
	struct be_weight kv_a;     /* (lora + d_rope, dim): c_kv rows then k_pe rows */
	struct be_weight kv_c, kv_r; /* kv_a's c_kv rows and k_pe rows as two weights (split:
				      * a view; FP8 needs lora a multiple of the 128-row block) */
	float *kv_a_norm;          /* (lora) */
	struct be_weight kv_b;     /* (n_heads * (d_nope + d_v), lora): per head k_nope rows, v rows */
	struct be_weight o;        /* (dim, n_heads * d_v) */
	bool full;                 /* runs its own indexer (else reuses the previous full layer's) */
	int fi;                    /* full: its place among the full layers (its keys' cache) */
	struct be_weight iq;       /* indexer.wq_b (i_heads * i_dim, q_lora) */
	struct be_weight ik;       /* indexer.wk (i_dim, dim) */
	float *ik_norm_w, *ik_norm_b; /* (i_dim) indexer.k_norm LayerNorm */
	struct be_weight iw;       /* indexer.weights_proj (i_heads, dim) */
};

enum mla_mode { MLA_AUTO, MLA_ABSORB, MLA_EXPAND };

struct g5 {
	int n_heads, q_lora, lora, d_nope, d_rope, d_v;
	int i_heads, i_dim, topk; /* topk: min(index_topk, max_seq) */
	float scale;
	enum mla_mode mode;
	bool split;                /* kv_a is bound as kv_c and kv_r (see g5_forward) */
	struct g5_layer *layers;   /* [n_attn]: the MTP layer's last when it is loaded */
	/* caches, per sequence: index ((seq * n_attn + layer) * max_seq + position), elements
	 * of the engine's KV type (eng_kv_at), k_pe's of eng_kv_b_type */
	void *ckv;                 /* (max_seqs, n_attn, max_seq, lora) */
	void *kpe;                 /* (max_seqs, n_attn, max_seq, d_rope) */
	void *ikc;                 /* (max_seqs, n_full, max_seq, i_dim) the full layers' indexer
				    * keys */
	float *ckv_s, *ikc_s;      /* FP8: their scales, eng_kv_blocks a row; else NULL */
	int n_full;                /* layers with their own indexer */
	float *scores;             /* (max_seq) indexer scratch */
	void *work;                /* (max_seq * 8 bytes) */
	bool *use_sel;             /* (max_seqs) per segment of the step: attention reads the
				    * last full layer's selection (its sequence is past topk; in
				    * a batched step, every segment once one is) */
	int cap, kvx_cap;
	float *iks;                /* (cap, i_dim) the step's new indexer keys */
	float *qc;                 /* (cap, q_lora) */
	float *q;                  /* (cap, n_heads * (d_nope + d_rope)) */
	float *kva;                /* (cap, lora + d_rope); split: c_kv (cap, lora) */
	float *kvr;                /* split: (cap, d_rope) the step's k_pe rows */
	float *qa;                 /* (cap, n_heads * (lora + d_rope)) */
	float *lat;                /* (cap, n_heads * lora) */
	float *att;                /* (cap, n_heads * d_v) */
	float *iqv;                /* (cap, i_heads * i_dim) */
	float *iwv;                /* (cap, i_heads) */
	int *sel, *nsel;           /* (cap, topk), (cap) */
	float *kvx;                /* (kvx_cap, n_heads * (d_nope + d_v)) expanded k_nope | v */
	float *ckf, *kpf;          /* bf16 caches: (kvx_cap, lora), (kvx_cap, d_rope) the latent
				    * and k_pe read back as f32 for the expansion */
};

int glm5_indexer_full(json_t *cfg, int nl, bool *full, int *n_full, char *err, size_t errsz)
{
	int rc;
	json_t *types = json_object_get(cfg, "indexer_types");
	json_t *pattern = json_object_get(cfg, "index_topk_pattern");
	long long freq, offset;
	if ((rc = cfg_int(cfg, "index_topk_freq", 1, -4096, 4096, &freq, err, errsz)) ||
	    (rc = cfg_int(cfg, "index_skip_topk_offset", 2, -4096, 4096, &offset, err, errsz)))
		return rc;
	if (freq < 1)
		freq = 1;
	*n_full = 0;
	for (int l = 0; l < nl; l++) {
		const char *t = NULL;
		if (types && !json_is_null(types)) {
			if (!json_is_array(types) || (int)json_array_size(types) != nl)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'indexer_types' must list "
					       "num_hidden_layers (%d) entries", nl);
			t = json_string_value(json_array_get(types, (size_t)l));
		} else if (json_is_string(pattern)) {
			const char *p = json_string_value(pattern);
			if ((int)strlen(p) != nl)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'index_topk_pattern' must have "
					       "num_hidden_layers (%d) letters", nl);
			t = p[l] == 'F' ? "full" : p[l] == 'S' ? "shared" : "?";
		} else if (pattern && !json_is_null(pattern)) {
			if (!json_is_array(pattern) || (int)json_array_size(pattern) != nl)
				return wk_errf(err, errsz, WK_EFORMAT,
					       "config.json: 'index_topk_pattern' must list "
					       "num_hidden_layers (%d) entries", nl);
			t = json_string_value(json_array_get(pattern, (size_t)l));
		} else {
			long long k = l - offset + 1;
			t = (k > 0 ? k : 0) % freq == 0 ? "full" : "shared";
		}
		if (!t || (strcmp(t, "full") && strcmp(t, "shared")))
			return wk_errf(err, errsz, WK_EFORMAT,
				       "config.json: indexer type of layer %d must be \"full\" or "
				       "\"shared\"", l);
		full[l] = !strcmp(t, "full");
		*n_full += full[l];
	}
	if (!full[0])
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: layer 0 is a \"shared\" indexer layer, but there is no "
			       "earlier full layer to share from");
	return WK_OK;
}

/* "full"/"shared" per layer, and each full layer's place among them (its indexer keys' cache). */
static int indexer_kinds(json_t *cfg, struct glm_model *m, struct g5 *a, char *err, size_t errsz)
{
	int nl = m->c.n_layers;
	bool *full = malloc((size_t)nl * sizeof *full);
	if (!full)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	int rc = glm5_indexer_full(cfg, nl, full, &a->n_full, err, errsz);
	for (int l = 0, f = 0; l < nl && rc == WK_OK; l++) {
		a->layers[l].full = full[l];
		a->layers[l].fi = full[l] ? f++ : -1;
	}
	if (rc == WK_OK && m->c.n_attn > nl) { /* the MTP layer runs its own indexer */
		a->layers[nl].full = true;
		a->layers[nl].fi = a->n_full++;
	}
	free(full);
	return rc;
}

static int read_cfg(struct engine *e, struct glm_model *m, struct g5 *a, char *err, size_t errsz)
{
	json_t *cfg = e->config;
	long long heads, kvh, q_lora, lora, nope, rope, v, qk, ih, id, topk;
	double theta, partial;
	int bias, inter, iinter, rc;
	if ((rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_key_value_heads", heads, 1, 1 << 16, &kvh, err, errsz)) ||
	    (rc = cfg_int(cfg, "q_lora_rank", -1, 1, 1 << 16, &q_lora, err, errsz)) ||
	    (rc = cfg_int(cfg, "kv_lora_rank", -1, 1, 1 << 16, &lora, err, errsz)) ||
	    (rc = cfg_int(cfg, "qk_nope_head_dim", -1, 1, 4096, &nope, err, errsz)) ||
	    (rc = cfg_int(cfg, "qk_rope_head_dim", -1, 2, 4096, &rope, err, errsz)) ||
	    (rc = cfg_int(cfg, "v_head_dim", -1, 1, 4096, &v, err, errsz)) ||
	    (rc = cfg_int(cfg, "qk_head_dim", nope + rope, 2, 8192, &qk, err, errsz)) ||
	    (rc = cfg_int(cfg, "index_n_heads", -1, 1, 4096, &ih, err, errsz)) ||
	    (rc = cfg_int(cfg, "index_head_dim", -1, 2, 4096, &id, err, errsz)) ||
	    (rc = cfg_int(cfg, "index_topk", -1, 1, 1 << 24, &topk, err, errsz)) ||
	    (rc = cfg_bool(cfg, "attention_bias", 0, &bias, err, errsz)) ||
	    (rc = cfg_bool(cfg, "rope_interleave", 1, &inter, err, errsz)) ||
	    (rc = cfg_bool(cfg, "indexer_rope_interleave", 1, &iinter, err, errsz)) ||
	    (rc = glm_rope_cfg(cfg, 10000.0, 1.0, &theta, &partial, err, errsz)))
		return rc;
	if (json_is_null(json_object_get(cfg, "q_lora_rank")))
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: q_lora_rank null (a plain q_proj) is not supported");
	if (qk != nope + rope)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: qk_head_dim %lld is not qk_nope_head_dim %lld + "
			       "qk_rope_head_dim %lld", qk, nope, rope);
	if (rope % 2 != 0)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: qk_rope_head_dim %lld must be even", rope);
	if (id < rope)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: index_head_dim %lld is smaller than its rope part "
			       "qk_rope_head_dim %lld", id, rope);
	if (bias)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: attention_bias is not supported for MLA");
	if (!inter || !iinter)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: %s is false, but GlmMoeDsa always applies interleaved "
			       "RoPE (transformers modular_glm_moe_dsa.py)",
			       !inter ? "rope_interleave" : "indexer_rope_interleave");
	if (partial != 1.0)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: partial_rotary_factor %g: MLA rotates the whole "
			       "qk_rope_head_dim slice", partial);
	(void)kvh; /* MLA has no kv heads: every head reads the one latent */
	/* this rank's heads (shard.c), as g5_plan_attn cut them; the latent is replicated */
	struct shard_heads sh;
	if ((rc = shard_heads((int)heads, 1, e->tp, eng_tp_rank(e), &sh, err, errsz)))
		return rc;
	a->n_heads = sh.nq;
	a->q_lora = (int)q_lora;
	a->lora = (int)lora;
	a->d_nope = (int)nope;
	a->d_rope = (int)rope;
	a->d_v = (int)v;
	a->i_heads = (int)ih;
	a->i_dim = (int)id;
	a->topk = topk < m->c.max_seq ? (int)topk : m->c.max_seq;
	a->scale = 1.0f / sqrtf((float)qk);
	m->c.theta = (float)theta;
	/* a developer's override; a value it does not know is refused, not taken for auto */
	const char *mode = getenv("WICK_GLM_MLA");
	if (!mode || !*mode || !strcmp(mode, "auto"))
		a->mode = MLA_AUTO;
	else if (!strcmp(mode, "absorb"))
		a->mode = MLA_ABSORB;
	else if (!strcmp(mode, "expand"))
		a->mode = MLA_EXPAND;
	else
		return wk_errf(err, errsz, WK_EINVAL, "WICK_GLM_MLA is '%.40s'; it takes auto, "
			       "absorb or expand", mode);
	return WK_OK;
}

static const enum be_op g5_ops[] = {BE_OP_LAYERNORM, BE_OP_MLA_ABSORB, BE_OP_MLA_ATTENTION,
				    BE_OP_DSA_TOPK};

static int g5_load(struct engine *e, struct glm_model *m, char *err, size_t errsz)
{
	struct g5 *a = glm_own(m, calloc(1, sizeof *a));
	if (!a)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	m->attn = a;
	int rc = read_cfg(e, m, a, err, errsz);
	if (rc)
		return rc;
	for (size_t i = 0; i < sizeof g5_ops / sizeof g5_ops[0]; i++)
		if (!e->be->supports(e->bctx, g5_ops[i], DT_F32))
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "the %s backend lacks an op MLA/DSA needs (%d)", e->be->name,
				       (int)g5_ops[i]);
	if ((rc = eng_kv_check(e, BE_OP_MLA_ATTENTION, err, errsz)) ||
	    (rc = eng_kv_check(e, BE_OP_DSA_TOPK, err, errsz)))
		return rc;
	a->layers = glm_own(m, calloc((size_t)m->c.n_attn, sizeof *a->layers));
	if (!a->layers)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if ((rc = indexer_kinds(e->config, m, a, err, errsz)))
		return rc;
	int dim = m->c.dim, H = a->n_heads;
	a->split = true;
	for (int l = 0; l < m->c.n_attn; l++) {
		struct g5_layer *L = &a->layers[l];
		char nm[256];
		/* Binds self_attn.<s> as a [r][c] weight, or a [r] vector. */
#define W(s, r, c, w) \
	glm_weight(e, m, (snprintf(nm, sizeof nm, P "%s", l, s), nm), r, c, w, err, errsz)
#define V(s, r, v) glm_vector(e, m, (snprintf(nm, sizeof nm, P "%s", l, s), nm), r, v, err, errsz)
#define P "model.layers.%d.self_attn."
		int qd = H * (a->d_nope + a->d_rope), kvd = H * (a->d_nope + a->d_v);
		if ((rc = W("q_a_proj.weight", a->q_lora, dim, &L->q_a)) ||
		    (rc = V("q_a_layernorm.weight", a->q_lora, &L->q_a_norm)) ||
		    (rc = W("q_b_proj.weight", qd, a->q_lora, &L->q_b)) ||
		    (rc = W("kv_a_proj_with_mqa.weight", a->lora + a->d_rope, dim, &L->kv_a)) ||
		    (rc = V("kv_a_layernorm.weight", a->lora, &L->kv_a_norm)) ||
		    (rc = W("kv_b_proj.weight", kvd, a->lora, &L->kv_b)) ||
		    (rc = W("o_proj.weight", dim, H * a->d_v, &L->o)))
			return rc;
		/* kv_a as two weights, so that its c_kv and k_pe rows land in two places */
		a->split &= L->kv_a.dtype != DT_F8_E4M3 || a->lora % 128 == 0;
		L->kv_c = L->kv_r = L->kv_a;
		L->kv_c.rows = a->lora;
		L->kv_r.rows = a->d_rope;
		L->kv_r.data = (const char *)L->kv_a.data +
			       (size_t)a->lora * dim * dt_size(L->kv_a.dtype);
		if (L->kv_a.scale)
			L->kv_r.scale = L->kv_a.scale + (size_t)(a->lora / 128) * ((dim + 127) / 128);
		if (l < m->c.n_layers) /* (the MTP layer's are not a decode step's) */
			m->attn_bytes += glm_weight_bytes(&L->q_a) + glm_weight_bytes(&L->q_b) +
					 glm_weight_bytes(&L->kv_a) + glm_weight_bytes(&L->kv_b) +
					 glm_weight_bytes(&L->o);
		if (!L->full)
			continue;
		if ((rc = W("indexer.wq_b.weight", a->i_heads * a->i_dim, a->q_lora, &L->iq)) ||
		    (rc = W("indexer.wk.weight", a->i_dim, dim, &L->ik)) ||
		    (rc = V("indexer.k_norm.weight", a->i_dim, &L->ik_norm_w)) ||
		    (rc = V("indexer.k_norm.bias", a->i_dim, &L->ik_norm_b)) ||
		    (rc = W("indexer.weights_proj.weight", a->i_heads, dim, &L->iw)))
			return rc;
#undef P
#undef V
#undef W
		if (l < m->c.n_layers)
			m->attn_bytes += glm_weight_bytes(&L->iq) + glm_weight_bytes(&L->ik) +
					 glm_weight_bytes(&L->iw);
	}
	size_t T = (size_t)m->c.max_seq, nl = (size_t)m->max_seqs * m->c.n_attn;
	size_t kvs = eng_kv_size(e), bs = dt_size(eng_kv_b_type(e));
	size_t nf = (size_t)m->max_seqs * a->n_full;
	bool fp8 = e->kv == DT_F8_E4M3; /* and the scales */
	size_t sl = fp8 ? eng_kv_blocks(a->lora) * 4 : 0;
	size_t si = fp8 ? eng_kv_blocks(a->i_dim) * 4 : 0;
	size_t per_pos = (size_t)m->c.n_attn * (a->lora * kvs + sl + a->d_rope * bs) +
			 (size_t)a->n_full * (a->i_dim * kvs + si); /* bytes a position takes */
	if ((rc = eng_cache_agrees(e, (uint64_t)T * per_pos, err, errsz)))
		return rc;
	a->ckv = eng_calloc(e, nl * T * a->lora * kvs);
	a->kpe = eng_calloc(e, nl * T * a->d_rope * bs);
	a->ikc = eng_calloc(e, nf * T * a->i_dim * kvs);
	a->ckv_s = fp8 ? eng_calloc(e, nl * T * sl) : NULL;
	a->ikc_s = fp8 ? eng_calloc(e, nf * T * si) : NULL;
	a->scores = eng_alloc(e, T * sizeof(float));
	a->work = eng_alloc(e, T * 8);
	a->use_sel = calloc((size_t)m->max_seqs, sizeof *a->use_sel);
	if (!a->ckv || !a->kpe || !a->ikc || !a->scores || !a->work || !a->use_sel ||
	    (fp8 && (!a->ckv_s || !a->ikc_s)))
		return wk_errf(err, errsz, WK_ENOMEM,
			       "cannot allocate the MLA and indexer caches of %d positions for %d "
			       "sequences (%zu MiB); try a smaller max_seq or concurrency",
			       m->c.max_seq, m->max_seqs,
			       (size_t)m->max_seqs * T * per_pos >> 20);
	return WK_OK;
}

/* Whether n queries at pos0 attend sparsely (some query has more than topk keys). */
static bool sparse(const struct g5 *a, int n, int pos0)
{
	return pos0 + n > a->topk;
}

/* Whether to expand kv_b_proj over every position instead of absorbing it: whichever does
 * fewer multiply-adds, unless WICK_GLM_MLA forces one; but on a device (a backend with memory
 * of its own: a GPU) a sparse call absorbs. There the cost is the gather of the selected keys,
 * not the multiply-adds: expanded, each (token, head) reads its head's own rows of every key
 * it selected (nope + rope + dv f32 values, 2 KB at GLM-5's sizes; 16 KB a key for a tp-8
 * rank's 8 heads), absorbed, each token reads the key's latent row once for all its heads
 * (lora + rope values: 1.2 KB in bf16). A GLM-5 rank's prefill of 8,192 tokens gathers about
 * 270 GB a layer expanded and 19 GB absorbed, for 1.9 times the multiply-adds, which the
 * tensor cores take (wk_cuda_mla_latent). A dense call still expands where that is cheaper:
 * its keys are contiguous, and the query tiles read each once for 32 tokens
 * (wk_cuda_mla_tiles). */
static bool expand(const struct engine *e, const struct g5 *a, int n, int pos0)
{
	if (a->mode != MLA_AUTO)
		return a->mode == MLA_EXPAND;
	if (e->be->mem_alloc && sparse(a, n, pos0))
		return false;
	double T = pos0 + n, H = a->n_heads, keys = sparse(a, n, pos0) ? a->topk : T;
	double kvb = H * (a->d_nope + a->d_v) * a->lora;
	double ex = T * kvb + n * keys * H * (a->d_nope + a->d_rope + a->d_v);
	double ab = n * kvb + n * keys * H * (2.0 * a->lora + a->d_rope);
	return ex < ab;
}

/* Scratch in the backend's memory (glm_int.h); its contents are not kept. */
static bool re(struct glm_model *m, void *pp, size_t bytes)
{
	return eng_regrow(m->e, pp, bytes);
}

static int g5_grow(struct glm_model *m, int T, const struct eng_seg *seg, int nseg)
{
	struct g5 *a = m->attn;
	size_t H = (size_t)a->n_heads, f = sizeof(float);
	if (T > a->cap) {
		size_t N = (size_t)T;
		if (!re(m, &a->qc, N * a->q_lora * f) ||
		    !re(m, &a->q, N * H * (a->d_nope + a->d_rope) * f) ||
		    !re(m, &a->kva, N * (a->lora + a->d_rope) * f) ||
		    !re(m, &a->kvr, N * a->d_rope * f) ||
		    !re(m, &a->qa, N * H * (a->lora + a->d_rope) * f) ||
		    !re(m, &a->lat, N * H * a->lora * f) || !re(m, &a->att, N * H * a->d_v * f) ||
		    !re(m, &a->iqv, N * a->i_heads * a->i_dim * f) || !re(m, &a->iwv, N * a->i_heads * f) ||
		    !re(m, &a->iks, N * a->i_dim * f) || !re(m, &a->sel, N * a->topk * sizeof(int)) ||
		    !re(m, &a->nsel, N * sizeof(int)))
			return WK_ENOMEM;
		a->cap = T;
	}
	for (int s = 0; s < nseg; s++) {
		int end = seg[s].pos0 + seg[s].n;
		if (expand(m->e, a, seg[s].n, seg[s].pos0) && end > a->kvx_cap) {
			if (!re(m, &a->kvx, (size_t)end * H * (a->d_nope + a->d_v) * f) ||
			    (m->e->kv != DT_F32 && (!re(m, &a->ckf, (size_t)end * a->lora * f) ||
						    !re(m, &a->kpf, (size_t)end * a->d_rope * f))))
				return WK_ENOMEM;
			a->kvx_cap = end;
		}
	}
	return WK_OK;
}

/* Attention of one segment over its sequence's caches of layer l, into a->att (absorbed:
 * a->lat, from a->qa, which the caller has filled when absorb_done; the caller then maps
 * lat to att; else the backend's mla_absorbed runs the chain as one op where it has one). */
static void g5_attend(struct engine *e, struct glm_model *m, struct g5_layer *L,
		      const struct eng_seg *g, const void *ckv, const float *cks, const void *kpe,
		      bool use_sel, bool absorb_done)
{
	struct g5 *a = m->attn;
	const struct backend *be = e->be;
	void *c = e->bctx;
	int H = a->n_heads, lora = a->lora, nope = a->d_nope, rope = a->d_rope, dv = a->d_v;
	size_t off = (size_t)g->off;
	struct be_mla s = {.n_heads = H, .d_b = rope, .kv = e->kv, .k_b = kpe, .a_s = cks,
			   .kb_stride = (size_t)rope,
			   .sel = use_sel ? a->sel + off * a->topk : NULL, .nsel = a->nsel + off,
			   .sel_stride = a->topk, .scale = a->scale};
	const float *q = a->q + off * H * (nope + rope);
	if (expand(e, a, g->n, g->pos0)) {
		size_t row = (size_t)H * (nope + dv), len = (size_t)(g->pos0 + g->n);
		if (e->kv != DT_F32) { /* the expansion reads f32 rows */
			eng_kv_get(e, a->ckf, e->kv, ckv, cks, lora, len * lora);
			eng_kv_get(e, a->kpf, eng_kv_b_type(e), kpe, NULL, rope, len * rope);
			ckv = a->ckf;
			s.k_b = a->kpf;
			s.kv = DT_F32;
			s.a_s = NULL;
		}
		eng_matmul(e, a->kvx, ckv, &L->kv_b, (int)len);
		s.d_a = nope;
		s.d_v = dv;
		s.k_a = a->kvx;
		s.ka_stride = row;
		s.ka_head = (size_t)(nope + dv);
		s.v = a->kvx + nope;
		s.v_stride = row;
		s.v_head = (size_t)(nope + dv);
		be->mla_attention(c, a->att + off * H * dv, q, &s, g->n, g->pos0);
		return;
	}
	float *qa = a->qa + off * H * (lora + rope), *lat = a->lat + off * H * lora;
	s.d_a = lora;
	s.d_v = lora;
	s.k_a = ckv;
	s.ka_stride = (size_t)lora;
	s.v = ckv;
	s.v_stride = (size_t)lora;
	if (!absorb_done && be->mla_absorbed && !e->unfused) {
		be->mla_absorbed(c, a->att + off * H * dv, qa, lat, q, &L->kv_b, &s, g->n, g->pos0,
				 nope, dv);
		return;
	}
	if (!absorb_done)
		be->mla_absorb_q(c, qa, q, &L->kv_b, g->n, H, nope, rope, dv);
	be->mla_attention(c, lat, qa, &s, g->n, g->pos0);
	if (!absorb_done)
		be->mla_absorb_out(c, a->att + off * H * dv, lat, &L->kv_b, g->n, H, nope, dv);
}

static void g5_forward(struct engine *e, struct glm_model *m, int l, float *out, const float *x,
		       int T, const struct eng_seg *seg, int nseg)
{
	struct g5 *a = m->attn;
	struct g5_layer *L = &a->layers[l];
	const struct backend *be = e->be;
	void *c = e->bctx;
	int H = a->n_heads, lora = a->lora, nope = a->d_nope, rope = a->d_rope, dv = a->d_v;
	size_t S = (size_t)m->c.max_seq, nl = (size_t)m->c.n_attn;
	float theta = m->c.theta;
	/* sequence seq's caches of this layer at position pos: the latent (CKV, FP8 scales CKS),
	 * k_pe (KPE, bytes of eng_kv_b_type) */
	size_t bs = dt_size(eng_kv_b_type(e)), nbl = eng_kv_blocks(lora);
	size_t nbi = eng_kv_blocks(a->i_dim);
#define ROW(seq, pos) (((size_t)(seq) * nl + (size_t)l) * S + (size_t)(pos))
#define CKV(seq, pos) eng_kv_at(e, a->ckv, ROW(seq, pos) * lora)
#define CKS(seq, pos) (a->ckv_s ? a->ckv_s + ROW(seq, pos) * nbl : NULL)
#define KPE(seq, pos) ((void *)((char *)a->kpe + ROW(seq, pos) * rope * bs))
	/* the indexer keys' cache: full layers only (L->fi: this one's place among them) */
#define IROW(seq, pos) (((size_t)(seq) * a->n_full + (size_t)L->fi) * S + (size_t)(pos))
#define IKC(seq, pos) eng_kv_at(e, a->ikc, IROW(seq, pos) * a->i_dim)
#define IKS(seq, pos) (a->ikc_s ? a->ikc_s + IROW(seq, pos) * nbi : NULL)

	/* Whether the indexer selects for some segment (a full layer decides, the others reuse
	 * its choice); then the projections of the layer input x as one op: q_a_proj,
	 * kv_a_proj_with_mqa, and the indexer's key and head-weight projections. */
	bool any = false;
	for (int s = 0; s < nseg; s++) {
		if (L->full)
			a->use_sel[s] = sparse(a, seg[s].n, seg[s].pos0);
		any |= L->full && a->use_sel[s];
	}
	/* With kv_a split, one segment (a sequence's prefill, a batch-1 decode step) and f32
	 * caches, c_kv, k_pe and the indexer keys land straight in their caches, normalised and
	 * rotated there: no copies. A bf16 or FP8 cache takes them from the step's rows, rounded
	 * or quantized as they are stored (eng_kv_put, one chained op for all of them). */
	const struct eng_seg *g0 = &seg[0];
	bool f32 = e->kv == DT_F32;
	bool direct = nseg == 1 && !e->unfused && f32, split = a->split && !e->unfused;
	float *ckv0 = CKV(g0->seq, g0->pos0);
	float *kpe0 = KPE(g0->seq, g0->pos0);
	float *ik0 = L->full ? IKC(g0->seq, g0->pos0) : NULL;
	float *xo[5] = {a->qc}, *ikeys = direct ? ik0 : a->iks;
	const struct be_weight *xw[5] = {&L->q_a};
	struct be_rope xr[5] = {{0}}; /* k_pe rotated as it is stored */
	int nx = 1;
	if (split) {
		xo[nx] = direct ? ckv0 : a->kva;
		xw[nx++] = &L->kv_c;
		xo[nx] = direct ? kpe0 : a->kvr;
		xr[nx] = (struct be_rope){xo[nx], T, m->pos, 1, rope, rope};
		xw[nx++] = &L->kv_r;
	} else {
		xo[nx] = a->kva;
		xr[nx] = (struct be_rope){a->kva + lora, T, m->pos, 1, lora + rope, rope};
		xw[nx++] = &L->kv_a;
	}
	if (L->full) {
		xo[nx] = ikeys;
		xw[nx++] = &L->ik;
	}
	if (L->full && any) {
		xo[nx] = a->iwv;
		xw[nx++] = &L->iw;
	}
	eng_matmul_rope_n(e, xo, x, xw, nx, T, xr, theta);

	/* The norms of what x-matmul produced (q_c; c_kv into the caches; the indexer's keys,
	 * then rotated) as one op. The other rotations ride in the matmuls that produce them:
	 * k_pe above, q's rope slice and the indexer's queries below. */
	struct be_norm nrm[BE_NORM_MAX];
	int nn = 0;
	nrm[nn++] = (struct be_norm){.y = a->qc, .x = a->qc, .w = L->q_a_norm, .n = T,
				     .dim = a->q_lora, .eps = MLA_NORM_EPS};
	if (L->full)
		nrm[nn++] = (struct be_norm){.y = ikeys, .x = ikeys, .w = L->ik_norm_w,
					     .b = L->ik_norm_b, .n = T, .dim = a->i_dim,
					     .eps = INDEXER_NORM_EPS, .layer = true,
					     .rope_pos = m->pos, .rope_dim = rope, .theta = theta};

	/* caches: c_kv = kv_a_layernorm(rows 0..lora), k_pe = rope(rows lora..) */
	if (!split)
		eng_chain_end(e); /* rmsnorm row by row below, not held */
	for (int s = 0; s < nseg; s++) {
		const struct eng_seg *g = &seg[s];
		if (split) { /* f32: normalised into the cache; else in place, stored below */
			float *c_in = a->kva + (size_t)g->off * lora;
			float *cr = f32 ? CKV(g->seq, g->pos0) : c_in;
			nrm[nn++] = (struct be_norm){.y = cr, .x = direct ? cr : c_in,
						     .w = L->kv_a_norm, .n = g->n, .dim = lora,
						     .eps = MLA_NORM_EPS};
			if (nn == BE_NORM_MAX) {
				eng_norm_n(e, nrm, nn);
				nn = 0;
			}
			if (!direct && f32)
				eng_dcopy(e, KPE(g->seq, g->pos0),
					  a->kvr + (size_t)g->off * rope,
					  (size_t)g->n * rope * sizeof(float));
		}
		for (int i = 0; i < g->n && !split; i++) {
			float *row = a->kva + (size_t)(g->off + i) * (lora + rope);
			int p = g->pos0 + i;
			if (f32) {
				be->rmsnorm(c, CKV(g->seq, p), row, L->kv_a_norm, 1, lora,
					    MLA_NORM_EPS);
				eng_dcopy(e, KPE(g->seq, p), row + lora,
					  (size_t)rope * sizeof(float));
			} else {
				be->rmsnorm(c, row, row, L->kv_a_norm, 1, lora, MLA_NORM_EPS);
				eng_kv_put(e, e->kv, CKV(g->seq, p), CKS(g->seq, p), lora, row,
					   (size_t)lora);
				eng_kv_put(e, eng_kv_b_type(e), KPE(g->seq, p), NULL, rope,
					   row + lora, (size_t)rope);
			}
		}
	}
	eng_norm_n(e, nrm, nn);
	for (int s = 0; s < nseg && !f32; s++) { /* the step's normalised rows stored */
		const struct eng_seg *g = &seg[s];
		size_t off = (size_t)g->off, n = (size_t)g->n;
		if (split) {
			eng_kv_put(e, e->kv, CKV(g->seq, g->pos0), CKS(g->seq, g->pos0), lora,
				   a->kva + off * lora, n * lora);
			eng_kv_put(e, eng_kv_b_type(e), KPE(g->seq, g->pos0), NULL, rope,
				   a->kvr + off * rope, n * rope);
		}
		if (L->full)
			eng_kv_put(e, e->kv, IKC(g->seq, g->pos0), IKS(g->seq, g->pos0), a->i_dim,
				   a->iks + off * a->i_dim, n * a->i_dim);
	}

	/* q: q_a_proj -> q_a_layernorm (q_c, also the indexer's input) -> q_b_proj (with the
	 * indexer's query projection, which reads q_c too), each rotated as it is stored */
	float *qo[2] = {a->q, a->iqv};
	const struct be_weight *qw[2] = {&L->q_b, &L->iq};
	struct be_rope qr[2] = {{a->q + nope, T, m->pos, H, nope + rope, rope},
				{a->iqv, T, m->pos, a->i_heads, a->i_dim, rope}};
	eng_matmul_rope_n(e, qo, a->qc, qw, any ? 2 : 1, T, qr, theta);
	/* the chain glm.c began with the layer's norm ends here (a decode step's: that norm,
	 * these three ops and the norms between, one launch); the indexer and MLA are not held */
	eng_chain_end(e);

	/* DSA indexer: keys always enter the caches; scores only where some query has more
	 * than topk keys (else it would select them all). With several segments (a batched
	 * step) every segment reads a selection: each run of segments shorter than
	 * ENG_ATT_OWN is one op over its tokens, each over its own sequence's keys (m->pos:
	 * the tokens' positions, then sequences), and each longer one (a prefill beside
	 * decodes: a device scores its queries in tiles, which a call over several sequences
	 * cannot) one of its own; a query within topk selects all its keys (the keys dense
	 * attention reads, in the same order). */
	if (L->full) {
		int id = a->i_dim;
		bool one_dsa = any && nseg > 1 && !e->unfused;
		for (int s = 0; s < nseg && !direct && f32; s++)
			eng_dcopy(e, IKC(seg[s].seq, seg[s].pos0),
				  a->iks + (size_t)seg[s].off * id,
				  (size_t)seg[s].n * id * sizeof(float));
		struct be_dsa d = {.kv = e->kv, .n_heads = a->i_heads, .head_dim = id,
				   .topk = a->topk, .qk_scale = 1.0f / sqrtf((float)id),
				   .w_scale = 1.0f / sqrtf((float)a->i_heads)};
		for (int s = 0; s < nseg;) {
			const struct eng_seg *g = &seg[s];
			size_t off = (size_t)g->off;
			a->use_sel[s] |= one_dsa;
			if (!a->use_sel[s]) {
				s++;
				continue;
			}
			bool seqs = one_dsa && g->n < ENG_ATT_OWN; /* segments s .. b - 1 */
			int b = s + 1, n = g->n;
			for (; seqs && b < nseg && seg[b].n < ENG_ATT_OWN; b++) {
				a->use_sel[b] = true;
				n += seg[b].n;
			}
			d.k = IKC(seqs ? 0 : g->seq, 0);
			d.ks = IKS(seqs ? 0 : g->seq, 0);
			d.seq = seqs ? m->pos + T + off : NULL;
			d.pos = seqs ? m->pos + off : NULL;
			d.seq_rows = seqs ? (size_t)a->n_full * S : 0;
			d.keys_max = seqs ? m->keys_max : 0;
			be->dsa_topk(c, a->sel + off * a->topk, a->nsel + off,
				     a->iqv + off * a->i_heads * id, a->iwv + off * a->i_heads, &d,
				     seqs ? n : g->n, seqs ? 0 : g->pos0, a->scores, a->work);
			s = b;
		}
	}

	/* Attention per segment. When every segment of a batch absorbs (decode steps), kv_b_proj's
	 * two halves are applied to all T rows at once, so the weight is read once per step,
	 * not once per sequence. A segment alone (a batch-1 decode step) instead runs its chain
	 * as one op (g5_attend: mla_absorbed, one launch for three) where the backend has it. */
	bool batched = nseg > 1 || !be->mla_absorbed || e->unfused;
	for (int s = 0; s < nseg; s++)
		batched &= !expand(e, a, seg[s].n, seg[s].pos0);
	/* and where they also agree on the indexer (all selected or all dense: always, after
	 * the step's one top-k above), the latent attention of all their tokens is one op,
	 * each token over its own sequence's caches (each sequence's nl * S rows apart; m->pos:
	 * the tokens' positions, then sequences): the whole chain's, mla_absorbed, where the
	 * backend has it */
	bool one = batched && nseg > 1 && !e->unfused;
	for (int s = 0; s < nseg; s++)
		one &= a->use_sel[s] == a->use_sel[0];
	bool chain = one && be->mla_absorbed; /* absorb_q, the attention, absorb_out: one op */
	if (batched && !chain)
		be->mla_absorb_q(c, a->qa, a->q, &L->kv_b, T, H, nope, rope, dv);
	if (one) {
		struct be_mla s = {.n_heads = H, .d_a = lora, .d_b = rope, .d_v = lora, .kv = e->kv,
				   .k_a = CKV(0, 0), .k_b = KPE(0, 0), .v = CKV(0, 0),
				   .a_s = CKS(0, 0), .ka_stride = (size_t)lora,
				   .kb_stride = (size_t)rope, .v_stride = (size_t)lora,
				   .sel = a->use_sel[0] ? a->sel : NULL, .nsel = a->nsel,
				   .sel_stride = a->topk, .scale = a->scale, .seq = m->pos + T,
				   .pos = m->pos, .seq_rows = nl * S, .keys_max = m->keys_max};
		if (chain)
			be->mla_absorbed(c, a->att, a->qa, a->lat, a->q, &L->kv_b, &s, T, 0, nope,
					 dv);
		else
			be->mla_attention(c, a->lat, a->qa, &s, T, 0);
	}
	for (int s = 0; s < nseg && !one; s++)
		g5_attend(e, m, L, &seg[s], CKV(seg[s].seq, 0), CKS(seg[s].seq, 0),
			  KPE(seg[s].seq, 0), a->use_sel[s], batched);
	if (batched && !chain)
		be->mla_absorb_out(c, a->att, a->lat, &L->kv_b, T, H, nope, dv);
	/* o_proj begins the next chain: glm.c adds the residual and norm and the FFN's first
	 * matmul */
	eng_chain_begin(e);
	eng_matmul(e, out, a->att, &L->o, T);
#undef IKS
#undef IKC
#undef IROW
#undef KPE
#undef CKS
#undef CKV
#undef ROW
}

static int g5_caches(struct engine *e, struct glm_model *m, struct eng_cache *c)
{
	struct g5 *a = m->attn;
	int nl = m->c.n_attn, S = m->c.max_seq;
	size_t kvs = eng_kv_size(e), bs = dt_size(eng_kv_b_type(e));
	/* (all whole: TP replicates the latent, the rope key and the indexer, g5_plan_attn) */
	c[0] = (struct eng_cache){a->ckv, a->lora * kvs, nl, S, true};
	c[1] = (struct eng_cache){a->kpe, a->d_rope * bs, nl, S, true};
	c[2] = (struct eng_cache){a->ckv_s, eng_kv_blocks(a->lora) * 4, nl, S, true};
	c[3] = (struct eng_cache){a->ikc, a->i_dim * kvs, a->n_full, S, true};
	c[4] = (struct eng_cache){a->ikc_s, eng_kv_blocks(a->i_dim) * 4, a->n_full, S, true};
	return 5;
}

static void g5_free(struct glm_model *m)
{
	struct g5 *a = m->attn;
	if (!a)
		return;
	free(a->use_sel);
	void *bufs[] = {a->ckv, a->kpe, a->ikc, a->ckv_s, a->ikc_s, a->iks, a->scores, a->work, a->qc, a->q, a->kva,
			a->kvr, a->qa, a->lat, a->att, a->iqv, a->iwv, a->sel, a->nsel, a->kvx,
			a->ckf, a->kpf};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		eng_release(m->e, bufs[i]);
}

int glm5_debug(struct engine *e, struct glm5_debug *d)
{
	if (e->fam != &fam_glm5 || !e->model)
		return WK_EINVAL;
	struct glm_model *m = e->model;
	struct g5 *a = m->attn;
	size_t l = (size_t)m->c.n_layers - 1, T = (size_t)m->c.max_seq;
	*d = (struct glm5_debug){.ckv = eng_kv_at(e, a->ckv, l * T * a->lora),
				 .cks = a->ckv_s ? a->ckv_s + l * T * eng_kv_blocks(a->lora) : NULL,
				 .kpe = (char *)a->kpe + l * T * a->d_rope *
						dt_size(eng_kv_b_type(e)),
				 .kv = e->kv, .kv_b = eng_kv_b_type(e),
				 .lora = a->lora, .rope = a->d_rope, .sel = a->sel, .nsel = a->nsel,
				 .sel_stride = a->topk, .sparse = a->use_sel[0]};
	return WK_OK;
}

/* Sharded layout of MLA: q_b_proj rows (qk_nope + qk_rope per head), kv_b_proj rows
 * (qk_nope + v per head) and o_proj columns (v per head) split by heads over tp; everything
 * that is not per head is replicated: q_a_proj and q_a_layernorm (the query latent every head
 * expands from), kv_a_proj_with_mqa and kv_a_layernorm (the compressed KV latent and the rope
 * key all heads share, so every rank caches the full 576-wide latent, as TP MLA does in vLLM
 * and SGLang), and the DSA indexer (its top-k is per token, for all heads). */
static int g5_plan_attn(struct plan *p, json_t *cfg, const char *name, const char *leaf,
			char *err, size_t errsz)
{
	long long heads;
	int rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz);
	if (rc)
		return rc;
	if (heads % p->tp)
		return wk_errf(err, errsz, WK_EINVAL, "num_attention_heads %lld does not split over "
			       "tp %d", heads, p->tp);
	if (!strcmp(leaf, "q_b_proj.weight") || !strcmp(leaf, "kv_b_proj.weight"))
		return plan_tp(p, name, 0, err, errsz);
	if (!strcmp(leaf, "o_proj.weight"))
		return plan_tp(p, name, 1, err, errsz);
	if (!strcmp(leaf, "q_a_proj.weight") || !strcmp(leaf, "q_a_layernorm.weight") ||
	    !strcmp(leaf, "kv_a_proj_with_mqa.weight") || !strcmp(leaf, "kv_a_layernorm.weight") ||
	    !strncmp(leaf, "indexer.", 8))
		return plan_replicated(p, name, err, errsz);
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "no sharding rule for '%s'", name);
}

static int g5_plan(struct hf_model *hf, const struct eng_snap_opts *o, struct plan *p,
		   char *err, size_t errsz)
{
	return glm_plan(hf, p, g5_plan_attn, o->mtp, err, errsz);
}

static const struct glm_attn g5_attn = {
	.load = g5_load,
	.grow = g5_grow,
	.forward = g5_forward,
	.caches = g5_caches,
	.free = g5_free,
};

static int g5_family_load(struct engine *e, char *err, size_t errsz)
{
	return glm_load(e, &g5_attn, err, errsz);
}

const struct family fam_glm5 = {
	.arch = "GlmMoeDsaForCausalLM",
	.load = g5_family_load,
	.forward = glm_forward,
	.step = glm_step,
	.caches = glm_caches,
	.free = glm_free,
	.plan = g5_plan,
};
