/*
 * llama.c - the Llama family (LlamaForCausalLM): RMSNorm, rotary embeddings (Hugging Face
 * rotate_half convention), grouped-query attention with a KV cache, SwiGLU MLP, tied or untied
 * lm_head. Optional q/k/v/o biases (attention_bias) and MLP biases are not supported yet and
 * are refused by name.
 *
 * The forward pass takes n tokens at once (prefill) or one (decode). Activations are f32;
 * weights stay in the checkpoint's dtype where the backend reads them in place.
 *
 * Sharded (shard.c): tensor parallel only (no experts); llama_plan states the cut.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine_int.h"

struct layer {
	float *attn_norm, *mlp_norm; /* (dim) */
	struct be_weight wq;         /* (n_heads * head_dim, dim) */
	struct be_weight wk, wv;     /* (n_kv * head_dim, dim) */
	struct be_weight wo;         /* (dim, n_heads * head_dim) */
	struct be_weight gate, up;   /* (hidden, dim) */
	struct be_weight down;       /* (dim, hidden) */
};

/* Shapes below are this rank's shard (shard.c): n_heads, n_kv, hidden and vocab are the
 * local counts, of n_heads_all / n_kv_all / hidden_all / vocab_all; unsharded they are equal. */
struct llama {
	int dim, hidden, n_layers, n_heads, n_kv, head_dim, vocab, max_seq;
	int n_heads_all, n_kv_all, hidden_all, vocab_all;
	int vocab0;                    /* first vocabulary row of the embedding/lm_head shard */
	float eps, theta;
	const struct st_tensor *embed; /* (vocab, dim) */
	struct be_weight lm_head;      /* (vocab, dim); the embedding when tied */
	float *final_norm;             /* (dim) */
	struct layer *layers;          /* [n_layers] */
	int max_seqs;
	struct eng_seg *seg;           /* [max_seqs]: a step's segments */
	struct eng_gqa kv;             /* the KV caches */
	/* scratch, sized for `cap` tokens in a step */
	int cap;
	float *x, *xb, *q, *att, *g, *u, *tmp; /* (cap, dim|q_dim|hidden|vocab_all) */
	float *kt, *vt;                        /* (cap, n_kv * head_dim): new keys and values */
	float *gath;                           /* (world, cap, vocab): the lm_head all_gather */
	int *pos;                              /* (2 cap) positions, then each token's
						* sequence, in the backend's memory */
	int *pos_h, *tok;                      /* (2 cap, cap) the same, tokens: host */
	float *xh;                             /* (cap, dim) host staging of the embedding on a
						* device backend; NULL on the host */
};

static void free_scratch(struct engine *e, struct llama *m)
{
	float **dev[] = {&m->x, &m->xb, &m->q, &m->att, &m->g, &m->u, &m->tmp, &m->kt, &m->vt};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
		eng_release(e, *dev[i]);
		*dev[i] = NULL;
	}
	eng_release(e, m->pos);
	eng_release(e, m->gath);
	free(m->pos_h);
	free(m->tok);
	free(m->xh);
	m->pos = m->pos_h = m->tok = NULL;
	m->gath = m->xh = NULL;
	m->cap = 0;
}

/* Scratch for n tokens: activations in the backend's memory (eng_alloc), token ids and
 * positions on the host too. */
static int grow_scratch(struct engine *e, struct llama *m, int n, int world)
{
	if (n <= m->cap)
		return WK_OK;
	free_scratch(e, m);
	size_t qd = (size_t)m->n_heads * m->head_dim, big = (size_t)m->dim, N = (size_t)n;
	if (qd > big)
		big = qd;
	size_t tmp = m->vocab_all > (int)big ? (size_t)m->vocab_all : big;
	m->x = eng_alloc(e, N * m->dim * sizeof(float));
	m->xb = eng_alloc(e, N * big * sizeof(float));
	m->q = eng_alloc(e, N * qd * sizeof(float));
	m->att = eng_alloc(e, N * qd * sizeof(float));
	m->g = eng_alloc(e, N * m->hidden * sizeof(float));
	m->u = eng_alloc(e, N * m->hidden * sizeof(float));
	m->tmp = eng_alloc(e, N * tmp * sizeof(float));
	m->kt = eng_alloc(e, N * m->n_kv * m->head_dim * sizeof(float));
	m->vt = eng_alloc(e, N * m->n_kv * m->head_dim * sizeof(float));
	m->pos = eng_alloc(e, 2 * N * sizeof(int));
	m->gath = world > 1 ? eng_alloc(e, (size_t)world * N * m->vocab * sizeof(float)) : NULL;
	m->pos_h = malloc(2 * N * sizeof(int));
	m->tok = malloc(N * sizeof(int));
	m->xh = eng_host_mem(e) ? NULL : malloc(N * m->dim * sizeof(float));
	if (!m->x || !m->xb || !m->q || !m->att || !m->g || !m->u || !m->tmp || !m->kt || !m->vt ||
	    !m->pos || (world > 1 && !m->gath) || !m->pos_h || !m->tok ||
	    (!eng_host_mem(e) && !m->xh)) {
		free_scratch(e, m);
		return WK_ENOMEM;
	}
	m->cap = n;
	return WK_OK;
}

static void llama_free(struct engine *e)
{
	struct llama *m = e->model;
	if (!m)
		return;
	if (m->layers)
		for (int l = 0; l < m->n_layers; l++) {
			eng_release(e, m->layers[l].attn_norm);
			eng_release(e, m->layers[l].mlp_norm);
		}
	free(m->layers);
	free(m->seg);
	eng_release(e, m->final_norm);
	eng_gqa_free(e, &m->kv);
	free_scratch(e, m);
	free(m);
	e->model = NULL;
}

static int read_config(struct llama *m, json_t *cfg, int max_seq_opt, char *err, size_t errsz)
{
	long long dim, hidden, layers, heads, kv, vocab, maxpos, head_dim;
	double eps, theta;
	int rc;
	if ((rc = cfg_int(cfg, "hidden_size", -1, 1, 1 << 16, &dim, err, errsz)) ||
	    (rc = cfg_int(cfg, "intermediate_size", -1, 1, 1 << 20, &hidden, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_hidden_layers", -1, 1, 4096, &layers, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz)) ||
	    (rc = cfg_int(cfg, "num_key_value_heads", heads, 1, heads, &kv, err, errsz)) ||
	    (rc = cfg_int(cfg, "vocab_size", -1, 1, 1 << 24, &vocab, err, errsz)) ||
	    (rc = cfg_int(cfg, "max_position_embeddings", 2048, 1, 1 << 24, &maxpos, err, errsz)) ||
	    (rc = cfg_int(cfg, "head_dim", dim / heads, 2, 4096, &head_dim, err, errsz)) ||
	    (rc = cfg_real(cfg, "rms_norm_eps", 1e-6, &eps, err, errsz)) ||
	    (rc = cfg_real(cfg, "rope_theta", 10000.0, &theta, err, errsz)))
		return rc;
	if (heads % kv != 0)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: num_attention_heads %lld is not a multiple of "
			       "num_key_value_heads %lld", heads, kv);
	/* as glm.c checks them: either out of range makes every logit NaN */
	if (!(theta > 1.0))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: rope_theta %g must be > 1",
			       theta);
	if (!(eps > 0.0 && eps < 1.0))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: rms_norm_eps %g is outside (0, 1)",
			       eps);
	if (head_dim % 2 != 0)
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: head_dim %lld must be even",
			       head_dim);
	int bias = 0;
	if ((rc = cfg_bool(cfg, "attention_bias", 0, &bias, err, errsz)))
		return rc;
	if (bias)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: attention_bias is not supported for Llama yet");
	if ((rc = cfg_bool(cfg, "mlp_bias", 0, &bias, err, errsz)))
		return rc;
	if (bias)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: mlp_bias is not supported for Llama yet");
	json_t *rs = json_object_get(cfg, "rope_scaling");
	if (rs && !json_is_null(rs))
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "config.json: rope_scaling is not supported yet");
	m->dim = (int)dim;
	m->hidden = (int)hidden;
	m->n_layers = (int)layers;
	m->n_heads = (int)heads;
	m->n_kv = (int)kv;
	m->head_dim = (int)head_dim;
	m->vocab = (int)vocab;
	m->max_seq = max_seq_opt > 0 && max_seq_opt < maxpos ? max_seq_opt : (int)maxpos;
	m->eps = (float)eps;
	m->theta = (float)theta;
	return WK_OK;
}

static int llama_load(struct engine *e, char *err, size_t errsz)
{
	struct llama *m = calloc(1, sizeof *m);
	if (!m)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	e->model = m;
	json_t *cfg = e->config;
	int rc = read_config(m, cfg, e->max_seq_opt, err, errsz);
	if (rc)
		return rc;
	int tied = 0;
	if ((rc = cfg_bool(cfg, "tie_word_embeddings", 0, &tied, err, errsz)))
		return rc;
	/* This rank's shard, by the rules llama_plan cut the snapshot with. */
	struct shard_heads sh;
	int k = eng_tp_rank(e), lo, hi, vhi;
	if (e->ep != 1)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: LlamaForCausalLM has no experts, "
			       "but the snapshot was made for ep %d", e->dir, e->ep);
	if ((rc = shard_heads(m->n_heads, m->n_kv, e->tp, k, &sh, err, errsz)) ||
	    (rc = shard_even(m->hidden, e->tp, k, "intermediate_size", "tp", &lo, &hi, err, errsz)) ||
	    (rc = shard_even(m->vocab, e->tp, k, "vocab_size", "tp", &m->vocab0, &vhi, err, errsz)))
		return rc;
	m->n_heads_all = m->n_heads;
	m->n_kv_all = m->n_kv;
	m->hidden_all = m->hidden;
	m->vocab_all = m->vocab;
	m->n_heads = sh.nq;
	m->n_kv = sh.nkv;
	m->hidden = hi - lo;
	m->vocab = vhi - m->vocab0;

	int qd = m->n_heads * m->head_dim, kvd = m->n_kv * m->head_dim;
	struct be_weight emb;
	if ((rc = eng_weight_host(e, "model.embed_tokens.weight", m->vocab, m->dim, &emb, err,
				   errsz)))
		return rc;
	if ((rc = eng_tensor_host(e, "model.embed_tokens.weight", &m->embed, err, errsz)))
		return rc;
	/* tied: the embedding again, this time bound (uploaded) as the lm_head's weight */
	const char *head = tied || !eng_tensor(e, "lm_head.weight") ? "model.embed_tokens.weight"
								     : "lm_head.weight";
	if ((rc = eng_weight(e, head, m->vocab, m->dim, &m->lm_head, err, errsz)))
		return rc;
	if ((rc = eng_vector(e, "model.norm.weight", m->dim, &m->final_norm, err, errsz)))
		return rc;

	m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
	if (!m->layers)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int l = 0; l < m->n_layers; l++) {
		struct layer *L = &m->layers[l];
		char nm[256];
#define NAME(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), nm)
		if ((rc = eng_vector(e, NAME("input_layernorm.weight"), m->dim, &L->attn_norm, err, errsz)) ||
		    (rc = eng_vector(e, NAME("post_attention_layernorm.weight"), m->dim, &L->mlp_norm, err, errsz)) ||
		    (rc = eng_weight(e, NAME("self_attn.q_proj.weight"), qd, m->dim, &L->wq, err, errsz)) ||
		    (rc = eng_weight(e, NAME("self_attn.k_proj.weight"), kvd, m->dim, &L->wk, err, errsz)) ||
		    (rc = eng_weight(e, NAME("self_attn.v_proj.weight"), kvd, m->dim, &L->wv, err, errsz)) ||
		    (rc = eng_weight(e, NAME("self_attn.o_proj.weight"), m->dim, qd, &L->wo, err, errsz)) ||
		    (rc = eng_weight(e, NAME("mlp.gate_proj.weight"), m->hidden, m->dim, &L->gate, err, errsz)) ||
		    (rc = eng_weight(e, NAME("mlp.up_proj.weight"), m->hidden, m->dim, &L->up, err, errsz)) ||
		    (rc = eng_weight(e, NAME("mlp.down_proj.weight"), m->dim, m->hidden, &L->down, err, errsz)))
			return rc;
#undef NAME
	}
	/* a layer past num_hidden_layers: the config and the weights disagree (running the
	 * first layers alone would quietly give another model's output) */
	char past[64];
	snprintf(past, sizeof past, "model.layers.%d.input_layernorm.weight", m->n_layers);
	if (eng_tensor(e, past))
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: num_hidden_layers is %d, but the checkpoint holds %s "
			       "(a layer past them)", m->n_layers, past);

	m->max_seqs = e->max_seqs;
	m->seg = calloc((size_t)(m->max_seqs > 0 ? m->max_seqs : 1), sizeof *m->seg);
	if (!m->seg)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if ((rc = eng_gqa_alloc(e, &m->kv, m->n_layers, m->max_seq, m->n_kv, m->head_dim, err,
				errsz)))
		return rc;

	/* Bytes one decode step reads: every matrix once, the lm_head, one embedding row. */
	uint64_t per_tok = m->lm_head.rows * (uint64_t)m->lm_head.cols * dt_size(m->lm_head.dtype);
	for (int l = 0; l < m->n_layers; l++) {
		const struct be_weight *ws[] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv,
						&m->layers[l].wo, &m->layers[l].gate, &m->layers[l].up,
						&m->layers[l].down};
		for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
			per_tok += (uint64_t)ws[i]->rows * ws[i]->cols * dt_size(ws[i]->dtype);
	}
	per_tok += (uint64_t)m->dim * dt_size(m->embed->dtype);
	e->info.bytes_per_token = per_tok;
	e->info.vocab = m->vocab_all;
	e->info.max_seq = m->max_seq;
	return WK_OK;
}

/* One batched pass over every item's tokens. The matmuls see all T tokens at once, so each
 * weight is read once per step; attention runs per item over its own sequence's cache.
 * all_logits (one item only): logits of every token into items[0].logits [n][vocab].
 * Sharded (shard.c): this rank's heads and MLP slice; o_proj and down_proj give partial sums
 * that eng_all_reduce completes; embedding and lm_head are vocab-parallel. Items' logits are
 * NULL on ranks other than 0. */
static int run(struct engine *e, const struct eng_item *items, int n_items, bool all_logits,
	       char *err, size_t errsz)
{
	struct llama *m = e->model;
	const struct backend *be = e->be;
	void *c = e->bctx;
	int T = 0;
	for (int i = 0; i < n_items; i++)
		T += items[i].n;
	int rows_out = all_logits ? T : eng_out_rows(items, n_items);
	int rc = grow_scratch(e, m, T > rows_out ? T : rows_out, e->world) != WK_OK
			 ? wk_errf(err, errsz, WK_ENOMEM, "out of memory for a step of %d tokens", T)
			 : WK_OK;
	if ((rc = eng_agree(e, rc, err, errsz)) != WK_OK)
		return rc;
	int dim = m->dim, kvd = m->n_kv * m->head_dim;
	bool lead = eng_tp_lead(e); /* this rank's partial sums count (shard.c) */

	int keys_max = 0; /* the most keys a token of the step attends to */
	for (int i = 0, t = 0; i < n_items; i++) {
		m->seg[i] = (struct eng_seg){.seq = items[i].seq, .pos0 = e->seq_len[items[i].seq],
					     .n = items[i].n, .off = t};
		for (int j = 0; j < items[i].n; j++, t++) {
			m->tok[t] = items[i].tokens[j];
			m->pos_h[t] = e->seq_len[items[i].seq] + j;
			m->pos_h[T + t] = items[i].seq;
			keys_max = m->pos_h[t] + 1 > keys_max ? m->pos_h[t] + 1 : keys_max;
		}
	}
	eng_to_dev(e, m->pos, m->pos_h, (size_t)2 * T * sizeof(int));
	/* the embedding rows are read on the host (from the checkpoint) */
	eng_embed(e, m->x, m->xh, m->tok, T, m->embed, m->vocab0, dim);
	for (int l = 0; l < m->n_layers; l++) {
		struct layer *L = &m->layers[l];
		/* each residual add is fused with the norm after it: m->tmp holds the last MLP's
		 * output until the next layer's norm (or the final one). Where the backend chains
		 * (eng_chain_begin), that norm and q, k, v are one launch, and o_proj, the next
		 * norm and gate + up another. */
		eng_chain_begin(e);
		if (l == 0) {
			struct be_norm n0 = {.y = m->xb, .x = m->x, .w = L->attn_norm, .n = T,
					     .dim = dim, .eps = m->eps};
			eng_norm_n(e, &n0, 1);
		} else {
			eng_add_rmsnorm(e, m->x, m->tmp, m->xb, L->attn_norm, T, dim, m->eps);
		}
		/* q, k, v read xb: one op. With one sequence in the step and an f32 cache, k and
		 * v land straight in its caches (rotated there); else they go through the step's
		 * rows. */
		int s0 = items[0].seq, p0 = e->seq_len[s0];
		bool direct = n_items == 1 && !e->unfused && e->kv == DT_F32;
		float *kt = direct ? eng_gqa_f32(e, &m->kv, false, s0, l, p0) : m->kt;
		float *vt = direct ? eng_gqa_f32(e, &m->kv, true, s0, l, p0) : m->vt;
		float *qkv[3] = {m->q, kt, vt};
		const struct be_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
		eng_matmul_n(e, qkv, m->xb, wqkv, 3, T);
		/* q and k rotated (rotate_half over each head) as one op, norm_n's bare rows;
		 * then k and v stored into the caches: both held in the chain (a decode step's
		 * norm, q/k/v, rotations and stores: one launch); the attention is not */
		struct be_norm rot[2] = {
			{.y = m->q, .x = m->q, .n = T * m->n_heads, .dim = m->head_dim,
			 .rope_pos = m->pos, .rope_dim = m->head_dim, .theta = m->theta,
			 .heads = m->n_heads, .half = true, .bare = true},
			{.y = kt, .x = kt, .n = T * m->n_kv, .dim = m->head_dim, .rope_pos = m->pos,
			 .rope_dim = m->head_dim, .theta = m->theta, .heads = m->n_kv, .half = true,
			 .bare = true}};
		eng_norm_n(e, rot, 2);
		for (int i = 0, t = 0; i < n_items && !direct; t += items[i].n, i++)
			eng_gqa_store(e, &m->kv, items[i].seq, l, e->seq_len[items[i].seq],
				      m->kt + (size_t)t * kvd, m->vt + (size_t)t * kvd, items[i].n);
		eng_chain_end(e);
		/* several sequences: one attention over the short segments, each token over its
		 * own sequence's cache (m->pos: positions, then sequences), a prefill's apart;
		 * unfused, one a sequence */
		eng_gqa_attend_step(e, &m->kv, l, m->seg, n_items, m->pos, keys_max, m->att, m->q,
				    T, m->n_heads);
		eng_chain_begin(e);
		eng_matmul(e, m->tmp, m->att, &L->wo, T);
		if (!lead)
			eng_dzero(e, m->tmp, (size_t)T * dim * sizeof(float));
		eng_all_reduce(e, m->tmp, (size_t)T * dim);
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, L->mlp_norm, T, dim, m->eps);
		float *gu[2] = {m->g, m->u};
		const struct be_weight *wgu[2] = {&L->gate, &L->up};
		eng_matmul_n(e, gu, m->xb, wgu, 2, T);
		eng_chain_end(e); /* silu_mul is not held */
		be->silu_mul(c, m->g, m->u, (size_t)T * m->hidden);
		eng_matmul(e, m->tmp, m->g, &L->down, T);
		if (!lead)
			eng_dzero(e, m->tmp, (size_t)T * dim * sizeof(float));
		eng_all_reduce(e, m->tmp, (size_t)T * dim);
	}
	if (all_logits) {
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, m->final_norm, T, dim, m->eps);
		if (e->world == 1 && eng_host_mem(e)) {
			eng_matmul(e, items[0].logits, m->xb, &m->lm_head, T);
			return eng_sync(e, err, errsz);
		}
		eng_matmul(e, m->tmp, m->xb, &m->lm_head, T);
		if (e->world == 1)
			eng_to_host(e, items[0].logits, m->tmp, (size_t)T * m->vocab * sizeof(float));
		else
			eng_gather_vocab(e, items[0].logits, true, m->tmp, T, m->vocab, m->gath);
		return eng_sync(e, err, errsz);
	}
	/* Only each item's last token (its last `rows`) needs logits. */
	if (T == rows_out && !e->unfused) { /* every row is an output (decode) */
		eng_chain_begin(e); /* the final norm and lm_head: one launch */
		eng_add_rmsnorm(e, m->x, m->tmp, m->xb, m->final_norm, T, dim, m->eps);
	} else {
		be->add(c, m->x, m->tmp, (size_t)T * dim);
		eng_pick_rows(e, m->xb, m->x, items, n_items, dim);
		be->rmsnorm(c, m->xb, m->xb, m->final_norm, rows_out, dim, m->eps);
	}
	eng_matmul(e, m->tmp, m->xb, &m->lm_head, rows_out);
	eng_chain_end(e);
	eng_gather_vocab(e, e->rank == 0 ? m->tmp : NULL, false, m->tmp, rows_out, m->vocab,
			 m->gath);
	if (e->rank != 0)
		return WK_OK;
	rc = eng_outputs(e, items, n_items, m->tmp, m->vocab_all, err, errsz);
	return rc != WK_OK ? rc : eng_sync(e, err, errsz);
}

static int llama_step(struct engine *e, const struct eng_item *items, int n, char *err,
		      size_t errsz)
{
	return run(e, items, n, false, err, errsz);
}

/* Sequence 0, truncated to pos0 tokens, then tokens appended (eng_forward's contract). */
static int llama_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits,
			 bool all, char *err, size_t errsz)
{
	struct eng_item it = {.seq = 0, .tokens = tokens, .n = n, .logits = logits};
	(void)pos0; /* eng_forward has set seq_len[0] = pos0 */
	return run(e, &it, 1, all, err, errsz);
}

/* Layout. Unsharded: every tensor whole on rank 0. Sharded (tp > 1; ep must be 1, there are
 * no experts): embed_tokens and lm_head split their vocabulary rows; q_proj its rows by query
 * heads, k_proj/v_proj by kv heads (shard_heads: split, or one shared head per shard when tp
 * is a multiple of num_key_value_heads); o_proj its columns by query heads; gate_proj/up_proj
 * rows and down_proj columns by intermediate_size / tp; the norms are replicated. A tensor
 * with no rule is refused rather than guessed. */
static int llama_plan(struct hf_model *hf, const struct eng_snap_opts *o, struct plan *p,
		      char *err, size_t errsz)
{
	(void)o;
	int rc;
	if (p->world == 1) {
		for (size_t i = 0; i < hf_tensor_count(hf); i++)
			if ((rc = plan_copy(p, hf_tensor_at(hf, i)->name, 0, err, errsz)) != WK_OK)
				return rc;
		return WK_OK;
	}
	if (p->ep != 1)
		return wk_errf(err, errsz, WK_EINVAL, "--ep %d: LlamaForCausalLM has no experts "
			       "(use --ep 1)", p->ep);
	struct llama m;
	if ((rc = read_config(&m, hf_config(hf), 0, err, errsz)))
		return rc;
	int64_t qlo[COMM_MAX_WORLD], qhi[COMM_MAX_WORLD], klo[COMM_MAX_WORLD], khi[COMM_MAX_WORLD];
	int lo, hi;
	for (int k = 0; k < p->tp; k++) {
		struct shard_heads sh;
		if ((rc = shard_heads(m.n_heads, m.n_kv, p->tp, k, &sh, err, errsz)) ||
		    (rc = shard_even(m.hidden, p->tp, k, "intermediate_size", "tp", &lo, &hi, err, errsz)) ||
		    (rc = shard_even(m.vocab, p->tp, k, "vocab_size", "tp", &lo, &hi, err, errsz)))
			return rc;
		qlo[k] = (int64_t)sh.q0 * m.head_dim;
		qhi[k] = (int64_t)(sh.q0 + sh.nq) * m.head_dim;
		klo[k] = (int64_t)sh.kv0 * m.head_dim;
		khi[k] = (int64_t)(sh.kv0 + sh.nkv) * m.head_dim;
	}
	for (size_t i = 0; i < hf_tensor_count(hf); i++) {
		const char *name = hf_tensor_at(hf, i)->name;
		if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight") ||
		    wk_ends_with(name, ".mlp.gate_proj.weight") || wk_ends_with(name, ".mlp.up_proj.weight"))
			rc = plan_tp(p, name, 0, err, errsz);
		else if (wk_ends_with(name, ".mlp.down_proj.weight"))
			rc = plan_tp(p, name, 1, err, errsz);
		else if (wk_ends_with(name, ".self_attn.q_proj.weight"))
			rc = plan_tp_ranges(p, name, 0, qlo, qhi, err, errsz);
		else if (wk_ends_with(name, ".self_attn.k_proj.weight") ||
			 wk_ends_with(name, ".self_attn.v_proj.weight"))
			rc = plan_tp_ranges(p, name, 0, klo, khi, err, errsz);
		else if (wk_ends_with(name, ".self_attn.o_proj.weight"))
			rc = plan_tp_ranges(p, name, 1, qlo, qhi, err, errsz);
		else if (wk_ends_with(name, "layernorm.weight") || !strcmp(name, "model.norm.weight"))
			rc = plan_replicated(p, name, err, errsz);
		else
			rc = wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: no tensor-parallel rule for "
				     "'%s'", hf_dir(hf), name);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

static int llama_caches(struct engine *e, struct eng_cache *c)
{
	struct llama *m = e->model;
	return eng_gqa_caches(e, &m->kv, c);
}

const struct family fam_llama = {
	.plan = llama_plan,
	.arch = "LlamaForCausalLM",
	.load = llama_load,
	.forward = llama_forward,
	.step = llama_step,
	.caches = llama_caches,
	.free = llama_free,
};
