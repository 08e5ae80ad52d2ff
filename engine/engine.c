/*
 * engine.c - runs an opened model: memory and copies through the backend, chained launches,
 * sampling on the device, sequences, the KV caches' types and checks. Opening it (the
 * weights, the tokenizer beside them, the backend, the fit check) is engine_open.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine_int.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

static const struct family *families[] = {&fam_llama, &fam_glm4, &fam_glm5};

const struct family *eng_family(const char *arch)
{
	for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
		if (!strcmp(families[i]->arch, arch))
			return families[i];
	return NULL;
}

int cfg_int(json_t *cfg, const char *key, long long def, long long lo, long long hi,
	    long long *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v)) {
		if (def < 0 && lo >= 0)
			return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' is required", key);
		*out = def;
		return WK_OK;
	}
	if (!json_is_integer(v))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' must be an integer", key);
	long long x = json_integer_value(v);
	if (x < lo || x > hi)
		return wk_errf(err, errsz, WK_EFORMAT,
			       "config.json: '%s' is %lld, outside [%lld, %lld]", key, x, lo, hi);
	*out = x;
	return WK_OK;
}

int cfg_real(json_t *cfg, const char *key, double def, double *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return WK_OK;
	}
	if (!json_is_number(v))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' must be a number", key);
	*out = json_number_value(v);
	return WK_OK;
}

int cfg_bool(json_t *cfg, const char *key, int def, int *out, char *err, size_t errsz)
{
	json_t *v = json_object_get(cfg, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return WK_OK;
	}
	if (!json_is_boolean(v))
		return wk_errf(err, errsz, WK_EFORMAT, "config.json: '%s' must be true or false", key);
	*out = json_is_true(v);
	return WK_OK;
}

static int shape_str(const struct st_tensor *t, char *buf, size_t n)
{
	size_t off = 0;
	off += (size_t)snprintf(buf + off, n - off, "[");
	for (int i = 0; i < t->rank && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "",
					(long long)t->shape[i]);
	if (off < n)
		snprintf(buf + off, n - off, "]");
	return 0;
}

/* The tensor name, host-readable when host is set. */
static int tensor_get(struct engine *e, const char *name, bool host,
		      const struct st_tensor **t, char *err, size_t errsz)
{
	if (host)
		return eng_tensor_host(e, name, t, err, errsz);
	*t = eng_tensor(e, name);
	return WK_OK;
}

static int weight_find(struct engine *e, const char *name, int rows, int cols, bool host,
		       struct be_weight *w, char *err, size_t errsz)
{
	const struct st_tensor *t;
	int rc = tensor_get(e, name, host, &t, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (!t)
		return wk_errf(err, errsz, WK_ENOTFOUND, "%s: tensor '%s' is missing", e->dir,
			       name);
	if (t->rank != 2 || t->shape[0] != rows || t->shape[1] != cols) {
		char s[128];
		shape_str(t, s, sizeof s);
		return wk_errf(err, errsz, WK_EFORMAT,
			       "%s: tensor '%s' has shape %s, but the config needs [%d, %d]",
			       e->dir, name, s, rows, cols);
	}
	if (!e->be->supports(e->bctx, BE_OP_MATMUL, t->dtype))
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "%s: tensor '%s' is %s, which the %s backend cannot multiply",
			       e->dir, name, dt_name(t->dtype), e->be->name);
	*w = (struct be_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
	if (t->dtype != DT_F8_E4M3)
		return WK_OK;
	/* FP8 weights come with <name>_scale_inv: [ceil(rows/128)][ceil(cols/128)] f32. */
	char sname[512];
	snprintf(sname, sizeof sname, "%s_scale_inv", name);
	const struct st_tensor *s;
	if ((rc = tensor_get(e, sname, host, &s, err, errsz)) != WK_OK)
		return rc;
	int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
	if (!s)
		return wk_errf(err, errsz, WK_ENOTFOUND,
			       "%s: FP8 tensor '%s' has no block scales '%s'", e->dir, name, sname);
	if (s->dtype != DT_F32 || s->rank != 2 || s->shape[0] != sr || s->shape[1] != sc) {
		char sh[128];
		shape_str(s, sh, sizeof sh);
		return wk_errf(err, errsz, WK_EFORMAT,
			       "%s: '%s' is %s %s, but 128x128 block scales of [%d, %d] are F32 "
			       "[%lld, %lld]", e->dir, sname, dt_name(s->dtype), sh, rows, cols,
			       (long long)sr, (long long)sc);
	}
	w->scale = s->data;
	return WK_OK;
}

static bool on_device(const struct engine *e)
{
	return e->snap && snap_on_sink(e->snap);
}

/* eng_weight's binding, then the copy to a device backend (none when the snapshot was
 * restored into its memory: the weight is used where it landed). */
int eng_weight(struct engine *e, const char *name, int rows, int cols, struct be_weight *w,
	       char *err, size_t errsz)
{
	int rc = weight_find(e, name, rows, cols, false, w, err, errsz);
	if (rc == WK_OK && e->be->upload_weight && !on_device(e))
		rc = e->be->upload_weight(e->bctx, w, err, errsz);
	return rc;
}

int eng_weight_host(struct engine *e, const char *name, int rows, int cols,
		    struct be_weight *w, char *err, size_t errsz)
{
	return weight_find(e, name, rows, cols, true, w, err, errsz);
}

struct host_copy {
	struct st_tensor t; /* data: buf */
	void *buf;
	struct host_copy *next;
};

int eng_tensor_host(struct engine *e, const char *name, const struct st_tensor **out,
		    char *err, size_t errsz)
{
	const struct st_tensor *t = eng_tensor(e, name);
	*out = t;
	if (!t || !on_device(e))
		return WK_OK;
	for (struct host_copy *h = e->host_copies; h; h = h->next)
		if (!strcmp(h->t.name, t->name)) {
			*out = &h->t;
			return WK_OK;
		}
	struct host_copy *h = calloc(1, sizeof *h);
	void *buf = malloc(t->nbytes ? t->nbytes : 1);
	if (!h || !buf) {
		free(h);
		free(buf);
		*out = NULL;
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for a host copy of '%s'",
			       name);
	}
	e->be->to_host(e->bctx, buf, t->data, t->nbytes); /* load time: not counted */
	h->t = *t;
	h->t.data = buf;
	h->buf = buf;
	h->next = e->host_copies;
	e->host_copies = h;
	*out = &h->t;
	return WK_OK;
}

bool eng_host_mem(const struct engine *e)
{
	return !e->be->mem_alloc;
}

void *eng_alloc(struct engine *e, size_t bytes)
{
	if (e->be->mem_alloc)
		return e->be->mem_alloc(e->bctx, bytes);
	return malloc(bytes ? bytes : 1);
}

void *eng_calloc(struct engine *e, size_t bytes)
{
	if (!e->be->mem_alloc)
		return calloc(1, bytes ? bytes : 1); /* zero pages are mapped lazily */
	void *p = e->be->mem_alloc(e->bctx, bytes);
	if (p)
		eng_dzero(e, p, bytes);
	return p;
}

void eng_release(struct engine *e, void *p)
{
	if (!p)
		return;
	if (e->be && e->be->mem_free)
		e->be->mem_free(e->bctx, p);
	else
		free(p);
}

void eng_to_dev(struct engine *e, void *dst, const void *host, size_t bytes)
{
	eng_chain_flush(e);
	eng_count(e, ENG_K_TO_DEVICE);
	if (e->be->to_device)
		e->be->to_device(e->bctx, dst, host, bytes);
	else if (dst != host)
		memcpy(dst, host, bytes);
}

void eng_to_host(struct engine *e, void *host, const void *src, size_t bytes)
{
	eng_chain_flush(e);
	eng_count(e, ENG_K_TO_HOST);
	if (e->be->to_host)
		e->be->to_host(e->bctx, host, src, bytes);
	else if (host != src)
		memcpy(host, src, bytes);
}

void eng_dcopy(struct engine *e, void *dst, const void *src, size_t bytes)
{
	eng_chain_flush(e);
	eng_count(e, ENG_K_COPY);
	if (e->be->copy)
		e->be->copy(e->bctx, dst, src, bytes);
	else if (dst != src)
		memmove(dst, src, bytes);
}

void eng_dcopy_2d(struct engine *e, void *dst, size_t dpitch, const void *src, size_t spitch,
		  size_t width, size_t height)
{
	eng_chain_flush(e);
	if (!e->be->copy_2d) {
		for (size_t r = 0; r < height; r++)
			eng_dcopy(e, (char *)dst + r * dpitch, (const char *)src + r * spitch, width);
		return;
	}
	eng_count(e, ENG_K_COPY);
	e->be->copy_2d(e->bctx, dst, dpitch, src, spitch, width, height);
}

void eng_dzero(struct engine *e, void *dst, size_t bytes)
{
	eng_chain_flush(e);
	eng_count(e, ENG_K_ZERO);
	if (e->be->zero)
		e->be->zero(e->bctx, dst, bytes);
	else
		memset(dst, 0, bytes);
}

/* fp8_act: x quantized into e->aq (grown as needed; on failure the step fails at eng_sync
 * and x is used as it is meanwhile). */
static const float *quantized(struct engine *e, const float *x, int n, int cols)
{
	eng_chain_flush(e);
	size_t need = (size_t)n * cols;
	if (need > e->aq_cap) {
		if (!eng_regrow(e, &e->aq, need * sizeof(float))) {
			if (e->step_rc == WK_OK) {
				e->step_rc = WK_ENOMEM;
				snprintf(e->step_err, sizeof e->step_err, "out of %s memory for %zu "
					 "quantized activations", e->be->name, need);
			}
			e->aq_cap = 0;
			return x;
		}
		e->aq_cap = need;
	}
	e->be->act_quant(e->bctx, e->aq, x, n, cols);
	return e->aq;
}

/* From this many tokens a step's FP8 matmuls run as GEMMs on the tensor cores (backend
 * matmul_fp8act with FP8 activations, matmul_fp8w with f32 ones), below it as the decode
 * GEMV (after act_quant with FP8 activations), which reads each weight once per 8 tokens. */
#define ENG_GEMM_TOKENS 64

typedef void (*gemm_fn)(void *ctx, float *const *y, const float *x,
			const struct be_weight *const *w, int count, int n);

/* The backend's GEMM for the FP8 weights of a step of n tokens, or NULL (the GEMV). */
static gemm_fn gemm(const struct engine *e, int n)
{
	if (n < ENG_GEMM_TOKENS || e->unfused)
		return NULL;
	return e->fp8_act ? e->be->matmul_fp8act : e->be->matmul_fp8w;
}

/* ---- chained launches (engine_int.h) ---- */

void eng_chain_begin(struct engine *e)
{
	e->chaining = e->be->chain && !e->unfused && !e->fp8_act && !e->no_chain;
}

/* Runs what is held: a chain of two or more, or the one op itself. */
void eng_chain_flush(struct engine *e)
{
	if (e->n_chain > 1)
		e->be->chain(e->bctx, e->chain, e->n_chain);
	else if (e->n_chain == 1)
		be_chain_each(e->be, e->bctx, e->chain, 1);
	e->n_chain = 0;
}

void eng_chain_end(struct engine *e)
{
	eng_chain_flush(e);
	e->chaining = false;
}

/* The next link to fill (its kind and n set; the caller sets its kind's fields, the only ones
 * read), or NULL when nothing is held (not chaining): the caller runs its op now, after what
 * was held. */
static struct be_link *chain_link(struct engine *e, enum be_link_kind kind, int n)
{
	if (!e->chaining) {
		eng_chain_flush(e);
		return NULL;
	}
	if (e->n_chain == BE_CHAIN_MAX)
		eng_chain_flush(e);
	struct be_link *l = &e->chain[e->n_chain++]; /* ~1 KB: not zeroed on this hot path */
	l->kind = kind;
	l->n = n;
	return l;
}

/* A GEMV over count weights as a link (r: rotations, or NULL); false when not chaining. */
static bool chain_matmul(struct engine *e, float *const *y, const float *x,
			 const struct be_weight *const *w, int count, int n, const struct be_rope *r,
			 float theta)
{
	if (count < 1 || count > BE_MATMUL_MAX) {
		eng_chain_flush(e);
		return false;
	}
	struct be_link *l = chain_link(e, BE_LINK_MATMUL, n);
	if (!l)
		return false;
	l->x_in = x;
	l->count = count;
	l->rope = r != NULL;
	l->theta = theta;
	for (int k = 0; k < count; k++) {
		l->y[k] = y[k];
		l->w[k] = w[k];
		if (r)
			l->r[k] = r[k];
	}
	return true;
}

void eng_matmul(struct engine *e, float *y, const float *x, const struct be_weight *w, int n)
{
	gemm_fn g = w->dtype == DT_F8_E4M3 ? gemm(e, n) : NULL;
	if (g) {
		eng_chain_flush(e);
		g(e->bctx, &y, x, &w, 1, n);
		return;
	}
	if (e->fp8_act && w->dtype == DT_F8_E4M3)
		x = quantized(e, x, n, w->cols);
	else if (chain_matmul(e, &y, x, &w, 1, n, NULL, 0))
		return;
	e->be->matmul(e->bctx, y, x, w, n);
}

static void matmuls(struct engine *e, float *const *y, const float *x,
		    const struct be_weight *const *w, int count, int n)
{
	if (count > 1 && count <= BE_MATMUL_MAX && e->be->matmul_n && !e->unfused) {
		e->be->matmul_n(e->bctx, y, x, w, count, n);
		return;
	}
	for (int k = 0; k < count; k++)
		e->be->matmul(e->bctx, y[k], x, w[k], n);
}

void eng_matmul_n(struct engine *e, float *const *y, const float *x,
		  const struct be_weight *const *w, int count, int n)
{
	gemm_fn g = gemm(e, n);
	if (!e->fp8_act && !g) {
		if (!chain_matmul(e, y, x, w, count, n, NULL, 0))
			matmuls(e, y, x, w, count, n);
		return;
	}
	eng_chain_flush(e);
	/* the FP8 weights read x quantized once (or go to the GEMM), the others x */
	float *yq[BE_MATMUL_MAX], *yp[BE_MATMUL_MAX];
	const struct be_weight *wq[BE_MATMUL_MAX], *wp[BE_MATMUL_MAX];
	int nq = 0, np = 0;
	for (int k = 0; k < count && k < BE_MATMUL_MAX; k++) {
		if (w[k]->dtype == DT_F8_E4M3) {
			yq[nq] = y[k];
			wq[nq++] = w[k];
		} else {
			yp[np] = y[k];
			wp[np++] = w[k];
		}
	}
	if (nq && g)
		g(e->bctx, yq, x, wq, nq, n);
	else if (nq)
		matmuls(e, yq, e->fp8_act ? quantized(e, x, n, wq[0]->cols) : x, wq, nq, n);
	if (np)
		matmuls(e, yp, x, wp, np, n);
}

void eng_matmul_rope_n(struct engine *e, float *const *y, const float *x,
		       const struct be_weight *const *w, int count, int n,
		       const struct be_rope *r, float theta)
{
	if (count >= 1 && count <= BE_MATMUL_MAX && e->be->matmul_rope_n && !e->unfused &&
	    !e->fp8_act && !gemm(e, n)) { /* the GEMV path: its store rotates */
		if (!chain_matmul(e, y, x, w, count, n, r, theta))
			e->be->matmul_rope_n(e->bctx, y, x, w, count, n, r, theta);
		return;
	}
	eng_matmul_n(e, y, x, w, count, n);
	struct be_rope rot[BE_MATMUL_MAX];
	int nrot = 0;
	for (int k = 0; k < count && k < BE_MATMUL_MAX; k++)
		if (r[k].rot_dim > 0)
			rot[nrot++] = r[k];
	if (nrot)
		eng_rope_n(e, rot, nrot, theta, true);
}

void eng_norm_n(struct engine *e, const struct be_norm *r, int count)
{
	bool more = false; /* than plain norms: a rotation, a bias, heads, a bare row */
	for (int k = 0; k < count; k++)
		more |= r[k].rope_dim > 0 || r[k].add || r[k].heads > 1 || r[k].bare;
	struct be_link *l = count >= 1 && count <= BE_NORM_MAX && e->be->norm_n && !e->unfused
				    ? chain_link(e, BE_LINK_NORM, 0)
				    : NULL;
	if (l) {
		memcpy(l->norm, r, (size_t)count * sizeof *r);
		l->n_norm = count;
		return;
	}
	eng_chain_flush(e);
	if ((count > 1 || more) && count <= BE_NORM_MAX && e->be->norm_n && !e->unfused) {
		e->be->norm_n(e->bctx, r, count);
		return;
	}
	/* one by one: the bias a token at a time, the norm, the rotation */
	for (int k = 0; k < count; k++) {
		const struct be_norm *q = &r[k];
		int H = q->heads > 1 ? q->heads : 1;
		size_t w = (size_t)H * q->dim;
		const float *x = q->x;
		if (q->add || (q->bare && q->y != q->x)) {
			if (q->y != q->x)
				eng_dcopy(e, q->y, q->x, (size_t)q->n * q->dim * sizeof(float));
			for (int t = 0; q->add && t < q->n / H; t++)
				e->be->add(e->bctx, q->y + (size_t)t * w, q->add, w);
			x = q->y;
		}
		if (!q->bare && q->layer)
			e->be->layernorm(e->bctx, q->y, x, q->w, q->b, q->n, q->dim, q->eps);
		else if (!q->bare)
			e->be->rmsnorm(e->bctx, q->y, x, q->w, q->n, q->dim, q->eps);
		if (q->rope_dim > 0)
			e->be->rope(e->bctx, q->y, q->n / H, q->rope_pos, H, q->dim, q->rope_dim,
				    q->theta, !q->half);
	}
}

/* Whether item it asks for a sampled token (sampled true) or for the argmax (false). */
static bool wants(const struct eng_item *it, bool sampled)
{
	return it->token && (it->sample.temperature > 0) == sampled;
}

static int outputs_argmax(struct engine *e, const struct eng_item *items, int n,
			  const float *lg, int vocab, char *err, size_t errsz)
{
	if (eng_host_mem(e) || !e->be->argmax) {
		bool host = eng_host_mem(e);
		float *row = host ? NULL : malloc((size_t)vocab * sizeof *row);
		if (!host && !row)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory for a logits row");
		for (int i = 0; i < n; i++) {
			if (!wants(&items[i], false))
				continue;
			const float *r = lg + (size_t)i * vocab;
			if (!host) {
				eng_to_host(e, row, r, (size_t)vocab * sizeof *row);
				r = row;
			}
			*items[i].token = samp_argmax(r, vocab);
		}
		free(row);
		return WK_OK;
	}
	if (n > e->tok_cap) {
		int *h = realloc(e->tok_h, (size_t)n * sizeof *h);
		if (h)
			e->tok_h = h;
		if (!h || !eng_regrow(e, &e->tok_d, (size_t)n * sizeof(int)))
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory for %d token ids", n);
		e->tok_cap = n;
	}
	e->be->argmax(e->bctx, e->tok_d, lg, n, vocab);
	eng_to_host(e, e->tok_h, e->tok_d, (size_t)n * sizeof(int));
	for (int i = 0; i < n; i++)
		if (wants(&items[i], false))
			*items[i].token = e->tok_h[i];
	return WK_OK;
}

static int cand_cap(const struct engine *e)
{
	return e->cand_cap > 0 ? e->cand_cap : ENG_CAND_CAP;
}

/* sample_cand's buffers for n rows: [n] heads, then [n][cap] candidates. */
static size_t cand_bytes(const struct engine *e, int n)
{
	return (size_t)n * (sizeof(struct be_cand_head) +
			    (size_t)cand_cap(e) * sizeof(struct samp_cand));
}

static bool cand_grow(struct engine *e, int n)
{
	if (n <= e->cand_rows)
		return true;
	struct be_samp *sh = realloc(e->samp_h, (size_t)n * sizeof *sh);
	if (sh)
		e->samp_h = sh;
	void *ch = sh ? realloc(e->cand_h, cand_bytes(e, n)) : NULL;
	if (ch)
		e->cand_h = ch;
	if (!ch || !eng_regrow(e, &e->samp_d, (size_t)n * sizeof *sh) ||
	    !eng_regrow(e, &e->cand_d, cand_bytes(e, n)))
		return false;
	e->cand_rows = n;
	return true;
}

/* A row's draft for speculative sampling: the token drafted after it (-1: none) and the
 * draw that keeps it or not. */
struct row_draft {
	int d;
	double u_acc;
};

/* The sampled items' tokens: the device's candidates where it selects them (one op and one
 * copy for the step, plus a logits row for each filtered row past ENG_CAND_CAP; temperature
 * alone is one candidate, the device's pick with the item's draw), else the host's pick
 * over each row. A row with a draft (dr, when not NULL; samp_pick_draft's rule): with a
 * filter the host applies the rule to the device's candidates (samp_pick_cand_draft); with
 * temperature alone the device applies it and sends the one token, so a drafted row costs
 * no logits row; without a device, samp_pick_draft on the row. */
static int outputs_sampled(struct engine *e, const struct eng_item *items, int n,
			   const float *lg, int vocab, const struct row_draft *dr, char *err,
			   size_t errsz)
{
	bool host = eng_host_mem(e), dev = !host && e->be->sample_cand;
	if (!e->pick)
		e->pick = malloc((size_t)vocab * sizeof *e->pick);
	if (!host && !e->pick_row)
		e->pick_row = malloc((size_t)vocab * sizeof *e->pick_row);
	if (!e->pick || (!host && !e->pick_row))
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for sampling scratch");
	if (dev && !cand_grow(e, n))
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for %d rows of candidates", n);
	const struct be_cand_head *head = e->cand_h;
	const struct samp_cand *cand = (const struct samp_cand *)(head + n);
	if (dev) {
		for (int i = 0; i < n; i++) { /* temperature 0: the device skips the row */
			const struct eng_sample *sm = &items[i].sample;
			bool drafted = dr && dr[i].d >= 0;
			e->samp_h[i] = wants(&items[i], true)
					       ? (struct be_samp){sm->temperature, sm->top_p, sm->top_k,
								  drafted ? dr[i].d + 1 : 0, sm->u,
								  drafted ? dr[i].u_acc : 0}
					       : (struct be_samp){0, 1, 0, 0, 0, 0};
		}
		eng_to_dev(e, e->samp_d, e->samp_h, (size_t)n * sizeof *e->samp_h);
		struct be_cand_head *hd = e->cand_d;
		e->be->sample_cand(e->bctx, (struct samp_cand *)(hd + n), hd, lg, e->samp_d, n, vocab,
				   cand_cap(e));
		eng_to_host(e, e->cand_h, e->cand_d, cand_bytes(e, n));
	}
	for (int i = 0; i < n; i++) {
		const struct eng_item *it = &items[i];
		if (!wants(it, true))
			continue;
		bool drafted = dr && dr[i].d >= 0;
		if (dev && head[i].count > 0) { /* a draft: the device kept it or not where no
						 * filter is on (one candidate), else the list */
			bool filter = (it->sample.top_k > 0 && it->sample.top_k < vocab) ||
				      (it->sample.top_p > 0 && it->sample.top_p < 1);
			const struct samp_cand *c = cand + (size_t)i * cand_cap(e);
			*it->token = drafted && filter
					     ? samp_pick_cand_draft(c, head[i].count, head[i].mass,
								    it->sample.top_p, dr[i].d,
								    dr[i].u_acc, it->sample.u)
					     : samp_pick_cand(c, head[i].count, head[i].mass,
							      it->sample.top_p, it->sample.u);
			continue;
		}
		const float *r = lg + (size_t)i * vocab;
		if (!host) {
			eng_to_host(e, e->pick_row, r, (size_t)vocab * sizeof *e->pick_row);
			r = e->pick_row;
		}
		struct samp_cfg cfg = {it->sample.temperature, it->sample.top_p, it->sample.top_k, 0};
		*it->token = drafted ? samp_pick_draft(r, vocab, &cfg, dr[i].d, dr[i].u_acc,
						       it->sample.u, e->pick)
				     : samp_pick(r, vocab, &cfg, it->sample.u, e->pick);
	}
	return WK_OK;
}

static int outputs(struct engine *e, const struct eng_item *items, int n, const float *lg,
		   int vocab, const struct row_draft *dr, char *err, size_t errsz)
{
	bool greedy = false, sampled = false;
	for (int i = 0; i < n; i++) {
		if (items[i].logits)
			eng_to_host(e, items[i].logits, lg + (size_t)i * vocab, vocab * sizeof(float));
		greedy |= wants(&items[i], false);
		sampled |= wants(&items[i], true);
	}
	int rc = greedy ? outputs_argmax(e, items, n, lg, vocab, err, errsz) : WK_OK;
	if (rc == WK_OK && sampled)
		rc = outputs_sampled(e, items, n, lg, vocab, dr, err, errsz);
	return rc;
}

int eng_out_rows(const struct eng_item *items, int n)
{
	int r = 0;
	for (int i = 0; i < n; i++)
		r += items[i].rows > 1 ? items[i].rows : 1;
	return r;
}

void eng_pick_rows(struct engine *e, float *y, const float *x, const struct eng_item *items,
		   int n, int dim)
{
	for (int i = 0, t = 0, r = 0; i < n; i++) {
		int k = items[i].rows > 1 ? items[i].rows : 1;
		t += items[i].n;
		eng_dcopy(e, y + (size_t)r * dim, x + (size_t)(t - k) * dim,
			  (size_t)k * dim * sizeof(float));
		r += k;
	}
}

int eng_outputs(struct engine *e, const struct eng_item *items, int n, const float *lg,
		int vocab, char *err, size_t errsz)
{
	int rows = eng_out_rows(items, n);
	if (rows == n)
		return outputs(e, items, n, lg, vocab, NULL, err, errsz);
	struct eng_item *one = malloc((size_t)rows * sizeof *one);
	struct row_draft *dr = malloc((size_t)rows * sizeof *dr);
	if (!one || !dr) {
		free(one);
		free(dr);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for %d output rows", rows);
	}
	for (int i = 0, r = 0; i < n; i++) {
		const struct eng_item *it = &items[i];
		int k = it->rows > 1 ? it->rows : 1;
		for (int j = 0; j < k; j++, r++) {
			one[r] = *it;
			one[r].rows = 1;
			one[r].logits = it->logits ? it->logits + (size_t)j * vocab : NULL;
			one[r].token = it->token ? it->token + j : NULL;
			dr[r].d = -1;
			if (k > 1 && it->sample.temperature > 0 && it->sample.u_rows) {
				one[r].sample.u = it->sample.u_rows[2 * j + 1];
				if (j < k - 1) {
					dr[r].d = it->tokens[it->n - k + j + 1];
					dr[r].u_acc = it->sample.u_rows[2 * j];
				}
			}
		}
	}
	int rc = outputs(e, one, rows, lg, vocab, dr, err, errsz);
	free(one);
	free(dr);
	return rc;
}

void eng_rope_n(struct engine *e, const struct be_rope *r, int count, float theta,
		bool interleaved)
{
	eng_chain_flush(e);
	if (count > 1 && count <= BE_ROPE_MAX && e->be->rope_n && !e->unfused) {
		e->be->rope_n(e->bctx, r, count, theta, interleaved);
		return;
	}
	for (int k = 0; k < count; k++)
		e->be->rope(e->bctx, r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim,
			    r[k].rot_dim, theta, interleaved);
}

void eng_moe_route_experts(struct engine *e, float *y, const float *x, const float *logits,
			   const float *bias, const struct be_route *r, int *idx, float *wt, int n,
			   const struct be_experts *ex, void *scratch)
{
	struct be_link *l = n < ENG_GEMM_TOKENS ? chain_link(e, BE_LINK_MOE, n) : NULL;
	if (l) {
		l->y_moe = y;
		l->x_moe = x;
		l->logits = logits;
		l->bias = bias;
		l->route = *r;
		l->idx = idx;
		l->wt = wt;
		l->ex = ex;
		l->scratch = scratch;
		return;
	}
	eng_chain_flush(e);
	e->be->moe_route_experts(e->bctx, y, x, logits, bias, r, idx, wt, n, ex, scratch);
}

void eng_add_rmsnorm(struct engine *e, float *x, const float *d, float *y, const float *w,
		     int n, int dim, float eps)
{
	struct be_link *l = e->be->add_rmsnorm && !e->unfused
				    ? chain_link(e, BE_LINK_ADD_RMSNORM, n)
				    : NULL;
	if (l) {
		l->x = x;
		l->d = d;
		l->y_norm = y;
		l->w_norm = w;
		l->dim = dim;
		l->eps = eps;
		return;
	}
	eng_chain_flush(e);
	if (e->be->add_rmsnorm && !e->unfused) {
		e->be->add_rmsnorm(e->bctx, x, d, y, w, n, dim, eps);
		return;
	}
	e->be->add(e->bctx, x, d, (size_t)n * dim);
	e->be->rmsnorm(e->bctx, y, x, w, n, dim, eps);
}

bool eng_regrow(struct engine *e, void *p, size_t bytes)
{
	void **pp = p;
	void *q = eng_alloc(e, bytes ? bytes : 1);
	if (!q)
		return false;
	eng_release(e, *pp);
	*pp = q;
	return true;
}

int eng_sync(struct engine *e, char *err, size_t errsz)
{
	eng_chain_end(e);
	int rc = e->be->sync ? e->be->sync(e->bctx, err, errsz) : WK_OK;
	if (rc == WK_OK && e->step_rc != WK_OK) {
		rc = wk_errf(err, errsz, e->step_rc, "%s", e->step_err);
		e->step_rc = WK_OK;
	}
	return rc;
}

int eng_vector(struct engine *e, const char *name, int len, float **out, char *err,
	       size_t errsz)
{
	const struct st_tensor *t;
	int rc = eng_tensor_host(e, name, &t, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (!t)
		return wk_errf(err, errsz, WK_ENOTFOUND, "%s: tensor '%s' is missing", e->dir,
			       name);
	if (t->rank != 1 || t->shape[0] != len) {
		char s[128];
		shape_str(t, s, sizeof s);
		return wk_errf(err, errsz, WK_EFORMAT,
			       "%s: tensor '%s' has shape %s, but the config needs [%d]",
			       e->dir, name, s, len);
	}
	float *v = malloc((size_t)len * sizeof *v);
	if (!v)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	if (dt_to_f32(v, t->data, t->dtype, (size_t)len) != 0) {
		free(v);
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: tensor '%s' has dtype %s",
			       e->dir, name, dt_name(t->dtype));
	}
	if (!eng_host_mem(e)) {
		float *d = eng_alloc(e, (size_t)len * sizeof *d);
		if (d)
			eng_to_dev(e, d, v, (size_t)len * sizeof *d);
		free(v);
		if (!d)
			return wk_errf(err, errsz, WK_ENOMEM, "out of %s memory for '%s'",
				       e->be->name, name);
		v = d;
	}
	*out = v;
	return WK_OK;
}

bool eng_is_stop(const struct eng_info *in, int id)
{
	for (int i = 0; i < in->n_stop; i++)
		if (in->stop[i] == id)
			return true;
	return false;
}

void eng_free_host_copies(struct engine *e)
{
	while (e->host_copies) {
		struct host_copy *h = e->host_copies;
		e->host_copies = h->next;
		free(h->buf);
		free(h);
	}
}

int eng_launches(const struct engine *e, int rank, struct eng_launches *out)
{
	if (e->shard) {
		if (rank < 0 || rank >= e->world)
			return WK_EINVAL;
		e = shard_rank((struct engine *)e, rank);
	} else if (rank != 0) {
		return WK_EINVAL;
	}
	return e ? eng_count_read(e, out) : WK_EINVAL;
}

static void mark_used(struct engine *e, size_t i)
{
	if (e->used && !e->used[i]) {
		e->used[i] = true;
		e->n_used++;
	}
}

const struct st_tensor *eng_tensor(struct engine *e, const char *name)
{
	if (!e->snap) {
		size_t i;
		const struct st_tensor *t = hf_tensor_find(e->hf, name, &i);
		if (t)
			mark_used(e, i);
		return t;
	}
	const struct st_tensor *t = snap_tensor(e->snap, e->rank, name);
	if (t && e->used) {
		mark_used(e, (size_t)(t - snap_tensor_at(e->snap, e->rank, 0)));
		uintptr_t lo = (uintptr_t)t->data, hi = lo + t->nbytes;
		if (!e->bound_lo || lo < e->bound_lo)
			e->bound_lo = lo;
		if (hi > e->bound_hi)
			e->bound_hi = hi;
	}
	return t;
}

/* The checkpoint's tensors that e's family never looked up, in e->info: skipped on purpose are
 * layers past num_hidden_layers (MTP, counted in mtp_layers_skipped), rotary inv_freq
 * buffers (recomputed from the config, as transformers does) and a stored lm_head under
 * tie_word_embeddings (the embeddings serve, as in transformers). eng_unused_at: tensor i's name
 * when it is one of them, else NULL. */
const char *eng_unused_at(const struct engine *e, size_t i, int layers)
{
	const struct st_tensor *t = e->snap ? snap_tensor_at(e->snap, e->rank, i)
					    : hf_tensor_sorted(e->hf, i);
	int l;
	if (!t || !e->used || e->used[i] || wk_ends_with(t->name, "rotary_emb.inv_freq") ||
	    (sscanf(t->name, "model.layers.%d.", &l) == 1 && l >= layers) ||
	    (!strcmp(t->name, "lm_head.weight") &&
	     json_is_true(json_object_get(e->config, "tie_word_embeddings"))))
		return NULL;
	return t->name;
}

void eng_count_unused(struct engine *e, int layers)
{
	size_t n = e->snap ? snap_tensor_count(e->snap, e->rank) : hf_tensor_count(e->hf);
	for (size_t i = 0; i < n; i++) {
		const char *name = eng_unused_at(e, i, layers);
		if (name && !e->info.unused_tensors++)
			e->info.unused_example = name;
	}
}

int eng_rank_stats(struct engine *e, int rank, struct eng_rank_stats *st)
{
	struct engine *r = e->shard ? NULL : e;
	if (e->shard && rank >= 0 && rank < e->world)
		r = shard_rank(e, rank);
	if (!r || !r->snap || r->rank != rank || !r->used)
		return WK_EINVAL;
	*st = (struct eng_rank_stats){.tensors = snap_tensor_count(r->snap, rank),
				      .used = r->n_used, .lo = r->bound_lo, .hi = r->bound_hi};
	st->image = snap_image(r->snap, rank, &st->image_size);
	return WK_OK;
}

int eng_kv_type(const char *opt, json_t *cfg, enum dt_type *kv, char *err, size_t errsz)
{
	if (opt && !strcmp(opt, "f32")) {
		*kv = DT_F32;
	} else if (opt && !strcmp(opt, "bf16")) {
		*kv = DT_BF16;
	} else if (opt && !strcmp(opt, "fp8")) {
		*kv = DT_F8_E4M3;
	} else if (!opt || !strcmp(opt, "auto")) {
		json_t *d = json_object_get(cfg, "torch_dtype");
		if (!json_is_string(d))
			d = json_object_get(cfg, "dtype"); /* transformers >= 4.56 writes this */
		*kv = json_is_string(d) && !strcmp(json_string_value(d), "bfloat16") ? DT_BF16
										      : DT_F32;
	} else {
		return wk_errf(err, errsz, WK_EINVAL, "KV cache dtype '%s': it takes f32, bf16, fp8 "
			       "or auto", opt);
	}
	return WK_OK;
}

const char *eng_kv_name(enum dt_type kv)
{
	return kv == DT_BF16 ? "bf16" : kv == DT_F8_E4M3 ? "fp8" : "f32";
}

int eng_kv_check_arch(const struct engine *e, const char *arch, enum be_op op, enum dt_type kv,
		      char *err, size_t errsz)
{
	if (e->be->supports(e->bctx, op, kv) && (kv == DT_F32 || e->be->cast_n))
		return WK_OK;
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: the %s backend cannot attend over a %s KV "
		       "cache (--kv-dtype %s can)", arch, e->be->name, eng_kv_name(kv),
		       kv == DT_F8_E4M3 && e->be->supports(e->bctx, op, DT_BF16) ? "bf16" : "f32");
}

int eng_kv_check(struct engine *e, enum be_op op, char *err, size_t errsz)
{
	return eng_kv_check_arch(e, e->arch, op, e->kv, err, errsz);
}

int eng_gqa_alloc(struct engine *e, struct eng_gqa *g, int n_layers, int max_seq, int n_kv,
		  int head_dim, char *err, size_t errsz)
{
	*g = (struct eng_gqa){.n_layers = n_layers, .max_seq = max_seq, .n_kv = n_kv,
			      .head_dim = head_dim};
	size_t rows = (size_t)e->max_seqs * n_layers * max_seq * n_kv; /* of head_dim */
	size_t bytes = rows * head_dim * eng_kv_size(e);
	size_t sbytes = e->kv == DT_F8_E4M3 ? rows * eng_kv_blocks(head_dim) * sizeof(float) : 0;
	uint64_t per_seq = 2 * (uint64_t)(bytes + sbytes) / (uint64_t)e->max_seqs;
	int rc;
	if ((rc = eng_kv_check(e, BE_OP_ATTENTION, err, errsz)) ||
	    (rc = eng_cache_agrees(e, per_seq, err, errsz)))
		return rc;
	g->k = eng_calloc(e, bytes);
	g->v = eng_calloc(e, bytes);
	if (sbytes) {
		g->ks = eng_calloc(e, sbytes);
		g->vs = eng_calloc(e, sbytes);
	}
	if (!g->k || !g->v || (sbytes && (!g->ks || !g->vs)))
		return wk_errf(err, errsz, WK_ENOMEM,
			       "cannot allocate KV caches of %d positions for %d sequences (%zu MiB); "
			       "try a smaller max_seq or concurrency", max_seq, e->max_seqs,
			       (size_t)(2 * (bytes + sbytes) >> 20));
	return WK_OK;
}

void eng_gqa_free(struct engine *e, struct eng_gqa *g)
{
	void *bufs[] = {g->k, g->v, g->ks, g->vs};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		eng_release(e, bufs[i]);
	g->k = g->v = g->ks = g->vs = NULL;
}

int eng_gqa_caches(const struct engine *e, const struct eng_gqa *g, struct eng_cache *c)
{
	size_t row = (size_t)g->n_kv * g->head_dim * eng_kv_size(e);
	size_t srow = (size_t)g->n_kv * eng_kv_blocks(g->head_dim) * sizeof(float);
	c[0] = (struct eng_cache){g->k, row, g->n_layers, g->max_seq, false};
	c[1] = (struct eng_cache){g->v, row, g->n_layers, g->max_seq, false};
	c[2] = (struct eng_cache){g->ks, srow, g->n_layers, g->max_seq, false};
	c[3] = (struct eng_cache){g->vs, srow, g->n_layers, g->max_seq, false};
	return 4;
}

/* The family's arrays (none without the hook). */
static int caches_of(struct engine *e, struct eng_cache *c)
{
	return e->fam && e->fam->caches ? e->fam->caches(e, c) : 0;
}

/* Where sequence seq's part of array c begins, and the bytes of one of its layers (its pitch)
 * and of the first len positions of a layer (all of a row-a-sequence array's). */
static char *cache_at(const struct eng_cache *c, int seq, size_t *pitch, size_t *used, int len)
{
	*pitch = (size_t)c->rows * c->row_bytes;
	*used = c->rows == 1 ? c->row_bytes : (size_t)len * c->row_bytes;
	return (char *)c->base + (size_t)seq * c->layers * *pitch;
}

void eng_caches_copy(struct engine *e, int dst, int src, int len)
{
	struct eng_cache c[ENG_CACHES];
	for (int i = 0, n = caches_of(e, c); i < n; i++) {
		if (!c[i].base)
			continue;
		size_t pitch, used;
		char *d = cache_at(&c[i], dst, &pitch, &used, len);
		const char *s = cache_at(&c[i], src, &pitch, &used, len);
		if (pitch >= (size_t)1 << 31) { /* past a 2-D copy's pitch on CUDA
						 * (cudaDevAttrMaxPitch) */
			for (int l = 0; l < c[i].layers; l++)
				eng_dcopy(e, d + l * pitch, s + l * pitch, used);
			continue;
		}
		eng_dcopy_2d(e, d, pitch, s, pitch, used, (size_t)c[i].layers);
	}
}

/* Array c's bytes of len positions. */
static size_t cache_bytes(const struct eng_cache *c, int len)
{
	return c->base ? (size_t)c->layers * (c->rows == 1 ? 1 : (size_t)len) * c->row_bytes : 0;
}

/* The bytes of len positions in the first section (every array) and in each other one (the
 * arrays that are not whole). */
static void sections(const struct eng_cache *c, int n, int len, size_t *first, size_t *other)
{
	*first = *other = 0;
	for (int i = 0; i < n; i++) {
		*first += cache_bytes(&c[i], len);
		*other += c[i].whole ? 0 : cache_bytes(&c[i], len);
	}
}

size_t eng_caches_bytes(struct engine *e, int len)
{
	struct eng_cache c[ENG_CACHES];
	size_t first, other;
	sections(c, caches_of(e, c), len, &first, &other);
	return first + (size_t)(e->tp - 1) * other;
}

void eng_caches_io(struct engine *e, int seq, int len, void *host, bool save)
{
	struct eng_cache c[ENG_CACHES];
	int n = caches_of(e, c), k = eng_tp_rank(e);
	size_t first, other, at0 = 0, atk = 0;
	sections(c, n, len, &first, &other);
	char *mine = (char *)host + (k ? first + (size_t)(k - 1) * other : 0); /* shard k's */
	for (int i = 0; i < n; i++) {
		size_t pitch, used, sz = cache_bytes(&c[i], len);
		/* from (to) section 0 when whole or in shard 0; else shard k's, past its split
		 * arrays before this one */
		char *h = c[i].whole || !k ? (char *)host + at0 : mine + atk;
		bool mine_to_save = e->rank == 0 || (e->rank < e->tp && !c[i].whole);
		at0 += sz;
		atk += c[i].whole ? 0 : sz;
		if (!sz || (save && !mine_to_save))
			continue;
		char *d = cache_at(&c[i], seq, &pitch, &used, len);
		for (int l = 0; l < c[i].layers; l++, h += used) {
			if (save)
				eng_to_host(e, h, d + l * pitch, used);
			else
				eng_to_dev(e, d + l * pitch, h, used);
		}
	}
}

/* The row of head_dim that position pos's kv head 0 of sequence seq's layer l starts */
static size_t gqa_row(const struct eng_gqa *g, int seq, int l, int pos)
{
	return (((size_t)seq * g->n_layers + l) * g->max_seq + pos) * g->n_kv;
}

float *eng_gqa_f32(const struct engine *e, const struct eng_gqa *g, bool v, int seq, int l,
		   int pos)
{
	if (e->kv != DT_F32)
		return NULL;
	return (float *)(v ? g->v : g->k) + gqa_row(g, seq, l, pos) * g->head_dim;
}

void eng_gqa_store(struct engine *e, const struct eng_gqa *g, int seq, int l, int pos0,
		   const float *kt, const float *vt, int n)
{
	size_t r = gqa_row(g, seq, l, pos0), nb = eng_kv_blocks(g->head_dim);
	size_t m = (size_t)n * g->n_kv * g->head_dim;
	bool f8 = e->kv == DT_F8_E4M3;
	eng_kv_put(e, e->kv, eng_kv_at(e, g->k, r * g->head_dim), f8 ? g->ks + r * nb : NULL,
		   g->head_dim, kt, m);
	eng_kv_put(e, e->kv, eng_kv_at(e, g->v, r * g->head_dim), f8 ? g->vs + r * nb : NULL,
		   g->head_dim, vt, m);
}

/* be->attention over sequence seq's layer l (seqs NULL), or over several sequences' (seqs and
 * pos their device arrays, each sequence's rows n_layers * max_seq apart) */
static void gqa_attend(struct engine *e, const struct eng_gqa *g, int seq, int l, int pos0,
		       const int *seqs, const int *pos, int keys_max, float *out, const float *q,
		       int n, int n_heads)
{
	size_t r = gqa_row(g, seq, l, 0), nb = eng_kv_blocks(g->head_dim);
	bool f8 = e->kv == DT_F8_E4M3;
	struct be_gqa s = {
		.k = eng_kv_at(e, g->k, r * g->head_dim), .v = eng_kv_at(e, g->v, r * g->head_dim),
		.ks = f8 ? g->ks + r * nb : NULL, .vs = f8 ? g->vs + r * nb : NULL, .kv = e->kv,
		.n_heads = n_heads, .n_kv = g->n_kv, .head_dim = g->head_dim,
		.kv_stride = g->n_kv * g->head_dim, .scale = 1.0f / sqrtf((float)g->head_dim),
		.seq = seqs, .pos = pos, .seq_rows = seqs ? (size_t)g->n_layers * g->max_seq : 0,
		.keys_max = keys_max};
	e->be->attention(e->bctx, out, q, &s, n, pos0);
}

void eng_gqa_attend(struct engine *e, const struct eng_gqa *g, int seq, int l, int pos0,
		    float *out, const float *q, int n, int n_heads)
{
	gqa_attend(e, g, seq, l, pos0, NULL, NULL, pos0 + n, out, q, n, n_heads);
}

void eng_gqa_attend_seqs(struct engine *e, const struct eng_gqa *g, int l, const int *seq,
			 const int *pos, int keys_max, float *out, const float *q, int n,
			 int n_heads)
{
	gqa_attend(e, g, 0, l, 0, seq, pos, keys_max, out, q, n, n_heads);
}

void eng_gqa_attend_step(struct engine *e, const struct eng_gqa *g, int l,
			 const struct eng_seg *seg, int nseg, const int *pos, int keys_max,
			 float *out, const float *q, int T, int n_heads)
{
	size_t qd = (size_t)n_heads * g->head_dim;
	for (int s = 0; s < nseg;) {
		const struct eng_seg *a = &seg[s];
		if (nseg == 1 || e->unfused || a->n >= ENG_ATT_OWN) {
			eng_gqa_attend(e, g, a->seq, l, a->pos0, out + (size_t)a->off * qd,
				       q + (size_t)a->off * qd, a->n, n_heads);
			s++;
			continue;
		}
		int b = s; /* the run of short segments s .. b - 1 */
		while (b < nseg && seg[b].n < ENG_ATT_OWN)
			b++;
		int off = a->off, n = seg[b - 1].off + seg[b - 1].n - off;
		eng_gqa_attend_seqs(e, g, l, pos + T + off, pos + off, keys_max,
				    out + (size_t)off * qd, q + (size_t)off * qd, n, n_heads);
		s = b;
	}
}

void eng_kv_put(struct engine *e, enum dt_type t, void *dst, float *ds, int w,
		const float *src, size_t n)
{
	if (t == DT_F32 && !e->chaining) {
		eng_dcopy(e, dst, src, n * sizeof(float));
		return;
	} /* chaining, f32 rows too go in as a cast link (a copy: cast_n's dt == st) */
	struct be_cast c = {dst, src, n, t, DT_F32, t == DT_F8_E4M3 ? ds : NULL, NULL, w};
	struct be_link *last = e->chaining && e->n_chain ? &e->chain[e->n_chain - 1] : NULL;
	if (last && last->kind == BE_LINK_CAST && last->n_cast < BE_CAST_MAX) {
		last->cast[last->n_cast++] = c;
		return;
	}
	struct be_link *l = chain_link(e, BE_LINK_CAST, 0);
	if (l) {
		l->cast[0] = c;
		l->n_cast = 1;
		return;
	}
	e->be->cast_n(e->bctx, &c, 1);
}

void eng_kv_get(struct engine *e, float *dst, enum dt_type t, const void *src, const float *ss,
		int w, size_t n)
{
	if (t == DT_F32) {
		eng_dcopy(e, dst, src, n * sizeof(float));
		return;
	}
	eng_chain_flush(e);
	struct be_cast c = {dst, src, n, DT_F32, t, NULL, t == DT_F8_E4M3 ? ss : NULL, w};
	e->be->cast_n(e->bctx, &c, 1);
}

int eng_seq_cache_bytes(const char *arch, json_t *cfg, int max_seq_opt, int tp,
			enum dt_type kv, bool mtp, int *max_seq, uint64_t *bytes, char *err,
			size_t errsz)
{
	bool glm = arch && (!strcmp(arch, "Glm4MoeForCausalLM") ||
			    !strcmp(arch, "GlmMoeDsaForCausalLM"));
	if (!arch || (!glm && strcmp(arch, "LlamaForCausalLM") != 0))
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "architecture '%s' is not supported",
			       arch ? arch : "?");
	long long layers, maxpos, per_tok, nextn; /* per_tok: bytes a position takes */
	long long es = (long long)dt_size(kv), bs = kv == DT_F8_E4M3 ? 2 : es;
	int rc;
	if ((rc = cfg_int(cfg, "num_hidden_layers", -1, 1, 4096, &layers, err, errsz)) ||
	    (rc = cfg_int(cfg, "max_position_embeddings", glm ? 131072 : 2048, 1, 1 << 24, &maxpos,
			  err, errsz)) ||
	    (rc = cfg_int(cfg, "num_nextn_predict_layers", 0, 0, 64, &nextn, err, errsz)))
		return rc;
	long long cached = layers + (mtp && glm && nextn > 0 ? 1 : 0); /* the MTP layer last */
	if (!strcmp(arch, "GlmMoeDsaForCausalLM")) {
		long long lora, rope, id;
		int n_full = 0;
		bool *full = malloc((size_t)layers * sizeof *full);
		if (!full)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		if ((rc = cfg_int(cfg, "kv_lora_rank", -1, 1, 1 << 16, &lora, err, errsz)) ||
		    (rc = cfg_int(cfg, "qk_rope_head_dim", -1, 2, 4096, &rope, err, errsz)) ||
		    (rc = cfg_int(cfg, "index_head_dim", -1, 2, 4096, &id, err, errsz)) ||
		    (rc = glm5_indexer_full(cfg, (int)layers, full, &n_full, err, errsz))) {
			free(full);
			return rc;
		}
		free(full);
		/* FP8: the latent's and the keys' codes with their scales, k_pe in bf16 */
		long long sl = kv == DT_F8_E4M3 ? (long long)eng_kv_blocks((int)lora) * 4 : 0;
		long long si = kv == DT_F8_E4M3 ? (long long)eng_kv_blocks((int)id) * 4 : 0;
		n_full += (int)(cached - layers); /* the MTP layer runs its own indexer */
		per_tok = cached * (lora * es + sl + rope * bs) + n_full * (id * es + si);
	} else {
		long long dim, heads, kvh, hd;
		struct shard_heads sh;
		if ((rc = cfg_int(cfg, "hidden_size", -1, 1, 1 << 16, &dim, err, errsz)) ||
		    (rc = cfg_int(cfg, "num_attention_heads", -1, 1, 4096, &heads, err, errsz)) ||
		    (rc = cfg_int(cfg, "num_key_value_heads", heads, 1, heads, &kvh, err, errsz)) ||
		    (rc = cfg_int(cfg, "head_dim", dim / heads, 2, 4096, &hd, err, errsz)) ||
		    (rc = shard_heads((int)heads, (int)kvh, tp > 0 ? tp : 1, 0, &sh, err, errsz)))
			return rc;
		/* FP8: each kv head's row of codes with its scales (struct eng_gqa) */
		long long sh8 = kv == DT_F8_E4M3 ? (long long)eng_kv_blocks((int)hd) * 4 : 0;
		per_tok = cached * 2 * (long long)sh.nkv * (hd * es + sh8);
	}
	*max_seq = max_seq_opt > 0 && max_seq_opt < maxpos ? max_seq_opt : (int)maxpos;
	*bytes = (uint64_t)*max_seq * (uint64_t)per_tok;
	return WK_OK;
}

int eng_cache_agrees(const struct engine *e, uint64_t per_seq, char *err, size_t errsz)
{
	uint64_t want;
	int ms;
	int rc = eng_seq_cache_bytes(e->arch, e->config, e->max_seq_opt, e->tp, e->kv,
				     e->info.mtp > 0, &ms, &want, err, errsz);
	if (rc == WK_OK && want != per_seq)
		rc = wk_errf(err, errsz, WK_EINVAL, "%s: the KV caches take %llu bytes a sequence, "
			     "but eng_seq_cache_bytes says %llu (the fit check before a restore "
			     "would misjudge this model)", e->arch, (unsigned long long)per_seq,
			     (unsigned long long)want);
	return rc;
}

const struct eng_info *eng_info(const struct engine *e)
{
	return &e->info;
}

const struct tok *eng_tokenizer(const struct engine *e)
{
	return e->tok;
}

int eng_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits, bool all,
		char *err, size_t errsz)
{
	if (n <= 0 || pos0 < 0 || pos0 + n > e->info.max_seq)
		return wk_errf(err, errsz, WK_EINVAL,
			       "positions %d..%d are outside the context of %d tokens", pos0,
			       pos0 + n - 1, e->info.max_seq);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= e->info.vocab)
			return wk_errf(err, errsz, WK_EINVAL,
				       "token id %d is outside the vocabulary (0..%d)", tokens[i],
				       e->info.vocab - 1);
	e->seq_used[0] = true;
	e->seq_len[0] = pos0; /* sequence 0 is truncated to pos0, then tokens appended */
	if (e->mtp_len[0] > pos0)
		e->mtp_len[0] = pos0;
	int rc = e->shard ? shard_forward(e, tokens, n, pos0, logits, all, err, errsz)
			  : e->fam->forward(e, tokens, n, pos0, logits, all, err, errsz);
	e->seq_len[0] = rc == WK_OK ? pos0 + n : 0;
	return rc;
}

int eng_seq_alloc(struct engine *e, int *seq)
{
	for (int i = 0; i < e->max_seqs; i++)
		if (!e->seq_used[i]) {
			e->seq_used[i] = true;
			e->seq_len[i] = 0;
			e->mtp_len[i] = 0;
			*seq = i;
			return WK_OK;
		}
	return WK_ELIMIT;
}

void eng_seq_free(struct engine *e, int seq)
{
	if (seq >= 0 && seq < e->max_seqs) {
		e->seq_used[seq] = false;
		e->seq_len[seq] = 0;
	}
}

int eng_seq_len(const struct engine *e, int seq)
{
	return seq >= 0 && seq < e->max_seqs ? e->seq_len[seq] : -1;
}

int eng_seq_truncate(struct engine *e, int seq, int len)
{
	if (seq < 0 || seq >= e->max_seqs || !e->seq_used[seq] || len < 0 ||
	    len > e->seq_len[seq])
		return WK_EINVAL;
	e->seq_len[seq] = len; /* every cache is indexed by position: the rows past len are
				* written again before a step reads them */
	if (e->mtp_len[seq] > len)
		e->mtp_len[seq] = len;
	return WK_OK;
}

int eng_seq_copy(struct engine *e, int dst, int src, int len, char *err, size_t errsz)
{
	for (int k = 0; k < 2; k++) {
		int q = k ? src : dst;
		if (q < 0 || q >= e->max_seqs || !e->seq_used[q])
			return wk_errf(err, errsz, WK_EINVAL, "sequence %d is not allocated", q);
	}
	if (dst == src)
		return wk_errf(err, errsz, WK_EINVAL, "sequence %d copied onto itself", src);
	if (len < 1 || len > e->seq_len[src])
		return wk_errf(err, errsz, WK_EINVAL, "%d positions of sequence %d copied (it "
			       "holds %d)", len, src, e->seq_len[src]);
	const struct family *f = e->fam;
	if (!f || !f->caches)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s holds one sequence: no copies",
			       e->arch);
	int rc = WK_OK;
	if (e->shard)
		rc = shard_seq_copy(e, dst, src, len, err, errsz);
	else
		eng_caches_copy(e, dst, src, len);
	if (rc != WK_OK)
		return rc;
	e->seq_len[dst] = len; /* as eng_seq_truncate leaves src at len */
	e->mtp_len[dst] = e->mtp_len[src] < len ? e->mtp_len[src] : len;
	return WK_OK;
}

/* eng_seq_save's bytes begin with the positions and the MTP layer's (int32 each) */
enum { SEQ_HEAD = 8 };

size_t eng_seq_bytes(struct engine *e, int len)
{
	if (!e->fam || !e->fam->caches || len < 1 || len > e->info.max_seq)
		return 0;
	return SEQ_HEAD + (e->shard ? shard_seq_bytes(e, len) : eng_caches_bytes(e, len));
}

int eng_seq_save(struct engine *e, int seq, int len, void *buf, size_t n, char *err,
		 size_t errsz)
{
	if (seq < 0 || seq >= e->max_seqs || !e->seq_used[seq])
		return wk_errf(err, errsz, WK_EINVAL, "sequence %d is not allocated", seq);
	if (len < 1 || len > e->seq_len[seq])
		return wk_errf(err, errsz, WK_EINVAL, "%d positions of sequence %d saved (it holds "
			       "%d)", len, seq, e->seq_len[seq]);
	size_t need = eng_seq_bytes(e, len);
	if (!need)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s holds one sequence: no saved "
			       "caches", e->arch);
	if (n != need)
		return wk_errf(err, errsz, WK_EINVAL, "%zu bytes for %d positions' caches: they "
			       "take %zu", n, len, need);
	int32_t head[2] = {len, e->mtp_len[seq] < len ? e->mtp_len[seq] : len};
	memcpy(buf, head, sizeof head);
	if (e->shard)
		return shard_seq_io(e, seq, len, (char *)buf + SEQ_HEAD, true, err, errsz);
	eng_caches_io(e, seq, len, (char *)buf + SEQ_HEAD, true);
	return eng_sync(e, err, errsz);
}

int eng_seq_check(struct engine *e, const void *buf, size_t n, int *len, char *err,
		  size_t errsz)
{
	int32_t head[2] = {0, 0};
	if (n >= SEQ_HEAD)
		memcpy(head, buf, sizeof head);
	size_t need = eng_seq_bytes(e, head[0]);
	if (!need || n != need || head[1] < 0 || head[1] > head[0])
		return wk_errf(err, errsz, WK_EFORMAT, "%zu bytes of caches do not hold the %d "
			       "positions they name (%zu bytes here)", n, head[0], need);
	*len = head[0];
	return WK_OK;
}

int eng_seq_load(struct engine *e, int seq, const void *buf, size_t n, char *err, size_t errsz)
{
	if (seq < 0 || seq >= e->max_seqs || !e->seq_used[seq])
		return wk_errf(err, errsz, WK_EINVAL, "sequence %d is not allocated", seq);
	int len, rc = eng_seq_check(e, buf, n, &len, err, errsz);
	if (rc != WK_OK)
		return rc;
	int32_t head[2];
	memcpy(head, buf, sizeof head);
	if (e->shard) {
		rc = shard_seq_io(e, seq, head[0], (char *)buf + SEQ_HEAD, false, err, errsz);
	} else {
		eng_caches_io(e, seq, head[0], (char *)buf + SEQ_HEAD, false);
		rc = eng_sync(e, err, errsz);
	}
	if (rc != WK_OK)
		return rc;
	e->seq_len[seq] = head[0];
	e->mtp_len[seq] = head[1];
	return WK_OK;
}

_Static_assert(ENG_DRAFT_MAX == 16, "eng_step's message says 16");

int eng_step(struct engine *e, const struct eng_item *items, int n, char *err, size_t errsz)
{
	if (n <= 0 || n > e->max_seqs)
		return wk_errf(err, errsz, WK_EINVAL, "a step of %d items (the engine holds %d)", n,
			       e->max_seqs);
	for (int i = 0; i < n; i++) {
		const struct eng_item *it = &items[i];
		if (it->seq < 0 || it->seq >= e->max_seqs || !e->seq_used[it->seq])
			return wk_errf(err, errsz, WK_EINVAL, "sequence %d is not allocated", it->seq);
		for (int j = 0; j < i; j++)
			if (items[j].seq == it->seq)
				return wk_errf(err, errsz, WK_EINVAL, "sequence %d appears twice in a "
					       "step", it->seq);
		if (it->n <= 0 || e->seq_len[it->seq] + it->n > e->info.max_seq)
			return wk_errf(err, errsz, WK_EINVAL,
				       "sequence %d: %d + %d tokens exceed the context of %d",
				       it->seq, e->seq_len[it->seq], it->n, e->info.max_seq);
		if (it->rows < 0 || it->rows > it->n)
			return wk_errf(err, errsz, WK_EINVAL, "sequence %d: outputs for %d of its %d "
				       "tokens", it->seq, it->rows, it->n);
		if (it->drafts < 0 || it->drafts > ENG_DRAFT_MAX ||
		    (it->drafts > 0 && (!e->info.mtp || !it->token || !it->draft)))
			return wk_errf(err, errsz, WK_EINVAL, "sequence %d: %d drafts asked for%s",
				       it->seq, it->drafts,
				       it->drafts < 0 || it->drafts > ENG_DRAFT_MAX
					       ? " (at most 16)"
				       : !e->info.mtp ? ", but no MTP layer is loaded"
						      : " without token and draft to put them in");
		if (it->rows > 1 && it->token && it->sample.temperature > 0 && !it->sample.u_rows)
			return wk_errf(err, errsz, WK_EINVAL, "sequence %d: sampled tokens for %d rows "
				       "without their draws (sample.u_rows)", it->seq, it->rows);
		for (int k = 0; k < it->n; k++)
			if (it->tokens[k] < 0 || it->tokens[k] >= e->info.vocab)
				return wk_errf(err, errsz, WK_EINVAL,
					       "token id %d is outside the vocabulary (0..%d)",
					       it->tokens[k], e->info.vocab - 1);
	}
	int rc;
	if (e->shard)
		rc = shard_step(e, items, n, err, errsz);
	else if (e->fam->step)
		rc = e->fam->step(e, items, n, err, errsz);
	else
		rc = e->fam->forward(e, items[0].tokens, items[0].n, e->seq_len[items[0].seq],
				     items[0].logits, false, err, errsz);
	if (rc != WK_OK)
		return rc;
	for (int i = 0; i < n; i++)
		e->seq_len[items[i].seq] += items[i].n;
	return WK_OK;
}
