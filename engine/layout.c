/*
 * layout.c - snapshot layouts: the engine decides what each rank's file holds, in which dtype
 * and shape; coldstart/snapshot.c stores and streams the bytes without knowing why.
 *
 * Layout version 1 (recorded in the manifest's "layout"): tensors keep their Hugging Face
 * names and row-major [out][in] shapes, which is what the CPU kernels read in place; `--dtype`
 * casts floating-point matrices (rank >= 2) and leaves vectors (norms, biases) as they are.
 *
 * Layout version 2 (world > 1; `wick snapshot --tp T --ep E`): the same, per rank, each rank
 * file holding only its shard under the tensor's own name. world = max(T, E), and T and E must
 * divide it. Rank r holds TP shard k = r mod T and the routed experts of EP rank j = r mod E;
 * when T < world the TP shards repeat on world/T ranks (likewise experts when E < world),
 * which the engine runs redundantly (see shard.c). Each tensor is one of:
 *   replicated      the whole tensor on every rank (norms, routers, ...);
 *   tp rows / cols  rows (dim 0, the output features) or columns (dim 1, the input features)
 *                   [lo, hi) of the whole, for TP shard k; usually an even split into T parts;
 *   expert          a routed expert's tensors whole, on the ranks of its EP rank.
 * Each spec carries its rule as the manifest's per-tensor "layout" tag ("replicated",
 * "tp rows 0:80 of 160", "expert (ep rank 1)"). The family's plan() says which tensor splits
 * how (llama.c, glm.c); this file does the slicing.
 *
 * FP8 weights with 128x128 block scales (<name>_scale_inv) are sliced together with their
 * scales when the cut falls on the 128 grid (lo a multiple of 128, hi too or the end): the
 * shard is then bit-exact FP8 with the matching block rows/columns of the scales, as GLM-5-FP8
 * at tp 2, 4, 8 always is (every split dimension is a multiple of 128 per rank). A cut off the
 * grid cannot keep one scale per 128x128 block of the shard, so that shard is stored
 * dequantized to F32 (fp8 * scale, rounded once to f32) and its tag says "f32 from fp8"; only
 * the tiny test models hit this. With `--dtype fp8` a shard is quantized on its own 128 grid,
 * which is the global grid whenever the cut is on it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/wk.h"
#include "engine/comm.h"
#include "engine/engine_int.h"
#include "engine/tokenizer.h"

struct copy_ctx {
	const struct st_tensor *src; /* first: by_source_offset reads it for every spec */
};

static int produce_copy(void *ctx, const struct snap_spec *t, void *dst, char *err,
			size_t errsz)
{
	const struct st_tensor *src = ((struct copy_ctx *)ctx)->src;
	if (src->dtype == t->dtype) {
		memcpy(dst, src->data, src->nbytes);
		return WK_OK;
	}
	/* Cast through f32, a block at a time. */
	enum { BLK = 1 << 16 };
	float *tmp = malloc(BLK * sizeof *tmp);
	if (!tmp)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	size_t ssz = dt_size(src->dtype), dsz = dt_size(t->dtype);
	for (int64_t i = 0; i < src->numel; i += BLK) {
		size_t n = (size_t)(src->numel - i < BLK ? src->numel - i : BLK);
		dt_to_f32(tmp, (const char *)src->data + (size_t)i * ssz, src->dtype, n);
		char *d = (char *)dst + (size_t)i * dsz;
		for (size_t k = 0; k < n; k++) {
			if (t->dtype == DT_F32) {
				memcpy(d + 4 * k, &tmp[k], 4);
			} else if (t->dtype == DT_BF16) {
				uint16_t h = dt_f32_to_bf16(tmp[k]);
				memcpy(d + 2 * k, &h, 2);
			} else {
				free(tmp);
				return wk_errf(err, errsz, WK_EUNSUPPORTED, "cannot cast '%s' to %s",
					       t->name, dt_name(t->dtype));
			}
		}
	}
	free(tmp);
	return WK_OK;
}

/* ---- --dtype fp8: 128x128 block-scaled float8_e4m3fn, the GLM-5-FP8 convention ----------
 * A weight W [rows][cols] becomes W8 (F8_E4M3) and W8_scale_inv (F32 [ceil(rows/128)]
 * [ceil(cols/128)]) with W ~= e4m3(W8) * scale_inv, where each block's scale_inv is its
 * amax / 448 (the largest finite e4m3 value), so the block's largest weight maps to 448. */

#define QB 128

struct quant_ctx {
	const struct st_tensor *src; /* first, as in struct copy_ctx: by_source_offset reads it */
	bool scales; /* this spec is the _scale_inv tensor */
};

/* Converts rows [r0, r0+nr) of src to f32 into buf, and computes each 128-column block's
 * scale_inv into sc [ceil(cols/128)]. */
static void block_row(const struct st_tensor *src, int r0, int nr, float *buf, float *sc)
{
	int64_t cols = src->shape[1];
	size_t esz = dt_size(src->dtype);
	dt_to_f32(buf, (const char *)src->data + (size_t)r0 * cols * esz, src->dtype,
		  (size_t)nr * cols);
	for (int64_t b = 0; b * QB < cols; b++) {
		float amax = 0;
		for (int r = 0; r < nr; r++)
			for (int64_t c = b * QB; c < cols && c < (b + 1) * QB; c++) {
				float a = fabsf(buf[(size_t)r * cols + c]);
				if (a > amax)
					amax = a;
			}
		sc[b] = amax > 0 ? amax / 448.0f : 1.0f;
	}
}

static int produce_fp8(void *ctx, const struct snap_spec *t, void *dst, char *err, size_t errsz)
{
	const struct quant_ctx *q = ctx;
	const struct st_tensor *src = q->src;
	int64_t rows = src->shape[0], cols = src->shape[1], nb = (cols + QB - 1) / QB;
	float *buf = malloc((size_t)QB * cols * sizeof *buf), *sc = malloc((size_t)nb * sizeof *sc);
	if (!buf || !sc) {
		free(buf);
		free(sc);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory quantizing '%s'", t->name);
	}
	for (int64_t r0 = 0; r0 < rows; r0 += QB) {
		int nr = (int)(rows - r0 < QB ? rows - r0 : QB);
		block_row(src, (int)r0, nr, buf, sc);
		if (q->scales) {
			memcpy((float *)dst + (r0 / QB) * nb, sc, (size_t)nb * sizeof *sc);
			continue;
		}
		uint8_t *o = (uint8_t *)dst + (size_t)r0 * cols;
		for (int r = 0; r < nr; r++)
			for (int64_t c = 0; c < cols; c++)
				o[(size_t)r * cols + c] = dt_f32_to_e4m3(buf[(size_t)r * cols + c] / sc[c / QB]);
	}
	free(buf);
	free(sc);
	return WK_OK;
}

/* The GLM-5-FP8 convention: the decoder layers' linear projections are FP8; embeddings,
 * lm_head, norms, the router gate and the indexer's weights_proj stay as they are. */
/* The decoder-layer matrices that GLM-5-FP8 stores in FP8 (glm.md 2.2): every *_proj (the
 * attention's q_a/q_b/kv_b/o, the MLPs' and experts' gate/up/down), kv_a_proj_with_mqa, and
 * the indexer's wq_b and wk; not indexer.weights_proj, the MTP layer's eh_proj, the router,
 * the norms or the embeddings. */
static bool fp8_candidate(const struct st_tensor *t)
{
	const char *n = t->name;
	return t->rank == 2 && (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16) &&
	       !strncmp(n, "model.layers.", 13) &&
	       (wk_ends_with(n, "_proj.weight") || wk_ends_with(n, "kv_a_proj_with_mqa.weight") ||
		wk_ends_with(n, "indexer.wq_b.weight") || wk_ends_with(n, "indexer.wk.weight")) &&
	       !strstr(n, "weights_proj") && !strstr(n, "eh_proj");
}

static int plan_add(struct plan *p, const struct snap_spec *sp, char *err, size_t errsz)
{
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		struct snap_spec *s = realloc(p->specs, cap * sizeof *s);
		if (!s)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		p->specs = s;
		p->cap = cap;
	}
	p->specs[p->n++] = *sp;
	return WK_OK;
}

static int plan_fp8(struct plan *p, const struct st_tensor *src, int rank_file, char *err,
		    size_t errsz)
{
	int64_t rows = src->shape[0], cols = src->shape[1];
	for (int k = 0; k < 2; k++) {
		struct quant_ctx *q = malloc(sizeof *q);
		char *name = malloc(strlen(src->name) + 16);
		if (!q || !name) {
			free(q);
			free(name);
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		}
		*q = (struct quant_ctx){.src = src, .scales = k == 1};
		sprintf(name, "%s%s", src->name, k ? "_scale_inv" : "");
		struct snap_spec sp = {.name = name, .rank_file = rank_file, .rank = 2,
				       .produce = produce_fp8, .ctx = q, .owned_name = true};
		if (k == 0) {
			sp.dtype = DT_F8_E4M3;
			sp.shape[0] = rows;
			sp.shape[1] = cols;
		} else {
			sp.dtype = DT_F32;
			sp.shape[0] = (rows + QB - 1) / QB;
			sp.shape[1] = (cols + QB - 1) / QB;
		}
		sp.nbytes = (uint64_t)sp.shape[0] * sp.shape[1] * dt_size(sp.dtype);
		int rc = plan_add(p, &sp, err, errsz);
		if (rc != WK_OK) {
			free(q);
			free(name);
			return rc;
		}
	}
	return WK_OK;
}

static bool is_float(enum dt_type t)
{
	return t == DT_F32 || t == DT_BF16 || t == DT_F16;
}

static const struct st_tensor *source(struct plan *p, const char *name, char *err,
				      size_t errsz)
{
	const struct st_tensor *src = hf_tensor(p->hf, name);
	if (!src)
		wk_errf(err, errsz, WK_ENOTFOUND, "%s: tensor '%s' is missing", hf_dir(p->hf),
			name);
	return src;
}

int plan_copy(struct plan *p, const char *name, int rank_file, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	if (p->cast == DT_F8_E4M3 && fp8_candidate(src))
		return plan_fp8(p, src, rank_file, err, errsz);
	struct copy_ctx *c = malloc(sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	c->src = src;
	enum dt_type dt = src->dtype;
	if (p->cast != DT_INVALID && p->cast != DT_F8_E4M3 && src->rank >= 2 && is_float(dt))
		dt = p->cast;
	struct snap_spec sp = {.name = src->name, .rank_file = rank_file, .dtype = dt,
			       .rank = src->rank, .nbytes = (uint64_t)src->numel * dt_size(dt),
			       .produce = produce_copy, .ctx = c};
	memcpy(sp.shape, src->shape, sizeof sp.shape);
	int rc = plan_add(p, &sp, err, errsz);
	if (rc != WK_OK)
		free(c);
	return rc;
}

/* ---- sharded layouts: slices -------------------------------------------------------------- */

enum slice_mode {
	SL_COPY,        /* the source's elements, cast when a cast applies (FP8 bytes as they are) */
	SL_DEQUANT,     /* an FP8 shard cut off the 128 grid: fp8 * scale, in F32 */
	SL_QUANT,       /* --dtype fp8: the shard quantized on its own 128 grid (the weight) */
	SL_QUANT_SCALE, /* ... and its _scale_inv */
};

struct slice_ctx {
	const struct st_tensor *src;   /* first: by_source_offset reads it */
	const struct st_tensor *scale; /* SL_DEQUANT: the block scales of src */
	int axis;                      /* 0: rows (dim 0), 1: columns (dim 1) */
	int64_t lo, hi;
	enum slice_mode mode;
	char tag[SNAP_MAX_LAYOUT_TAG];
};

static int64_t rows_of(const struct st_tensor *t)
{
	return t->rank ? t->shape[0] : 1;
}

static int64_t cols_of(const struct st_tensor *t)
{
	int64_t r = rows_of(t);
	return r ? t->numel / r : 0;
}

/* Stores n f32 values as dt (F32 or BF16, the cast targets). */
static int store(void *dst, enum dt_type dt, const float *x, size_t n)
{
	if (dt == DT_F32) {
		memcpy(dst, x, n * sizeof *x);
		return 0;
	}
	if (dt != DT_BF16)
		return -1;
	for (size_t k = 0; k < n; k++) {
		uint16_t h = dt_f32_to_bf16(x[k]);
		memcpy((char *)dst + 2 * k, &h, 2);
	}
	return 0;
}

/* Row i of the slice as f32 (FP8 sources dequantized with their block scales) into out. */
static void slice_row(const struct slice_ctx *c, int64_t i, float *out)
{
	const struct st_tensor *t = c->src;
	int64_t C = cols_of(t), row = c->axis ? i : c->lo + i, c0 = c->axis ? c->lo : 0;
	int64_t n = c->axis ? c->hi - c->lo : C;
	const char *base = (const char *)t->data + ((size_t)row * C + c0) * dt_size(t->dtype);
	if (t->dtype != DT_F8_E4M3) {
		dt_to_f32(out, base, t->dtype, (size_t)n);
		return;
	}
	const float *sc = (const float *)c->scale->data + (row / QB) * cols_of(c->scale);
	for (int64_t j = 0; j < n; j++)
		out[j] = dt_e4m3_to_f32((uint8_t)base[j]) * sc[(c0 + j) / QB];
}

static int produce_slice(void *ctx, const struct snap_spec *t, void *dst, char *err,
			 size_t errsz)
{
	const struct slice_ctx *c = ctx;
	const struct st_tensor *src = c->src;
	int64_t R = c->axis ? rows_of(src) : c->hi - c->lo;
	int64_t C = c->axis ? c->hi - c->lo : cols_of(src);
	size_t ssz = dt_size(src->dtype), dsz = dt_size(t->dtype);
	if (c->mode == SL_COPY && t->dtype == src->dtype) {
		/* the bytes themselves: one block for rows, one run per row for columns */
		int64_t SC = cols_of(src);
		if (!c->axis) {
			memcpy(dst, (const char *)src->data + (size_t)c->lo * SC * ssz, t->nbytes);
			return WK_OK;
		}
		for (int64_t i = 0; i < R; i++)
			memcpy((char *)dst + (size_t)(i * C) * ssz,
			       (const char *)src->data + (size_t)(i * SC + c->lo) * ssz, (size_t)C * ssz);
		return WK_OK;
	}
	bool quant = c->mode == SL_QUANT || c->mode == SL_QUANT_SCALE;
	int64_t nr = quant ? QB : 1, nb = (C + QB - 1) / QB; /* rows at a time, scale blocks */
	float *buf = malloc((size_t)(nr * C) * sizeof *buf), *sc = malloc((size_t)nb * sizeof *sc);
	if (!buf || !sc) {
		free(buf);
		free(sc);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory slicing '%s'", t->name);
	}
	int rc = WK_OK;
	for (int64_t r0 = 0; r0 < R && rc == WK_OK; r0 += nr) {
		int64_t m = R - r0 < nr ? R - r0 : nr;
		for (int64_t i = 0; i < m; i++)
			slice_row(c, r0 + i, buf + i * C);
		if (c->mode == SL_COPY || c->mode == SL_DEQUANT) {
			if (store((char *)dst + (size_t)(r0 * C) * dsz, t->dtype, buf, (size_t)C))
				rc = wk_errf(err, errsz, WK_EUNSUPPORTED, "cannot cast '%s' to %s",
					     t->name, dt_name(t->dtype));
			continue;
		}
		/* one row of 128x128 blocks: scale_inv = block amax / 448, as produce_fp8 */
		for (int64_t b = 0; b < nb; b++) {
			float amax = 0;
			for (int64_t i = 0; i < m; i++)
				for (int64_t j = b * QB; j < C && j < (b + 1) * QB; j++)
					amax = fmaxf(amax, fabsf(buf[i * C + j]));
			sc[b] = amax > 0 ? amax / 448.0f : 1.0f;
		}
		if (c->mode == SL_QUANT_SCALE) {
			memcpy((float *)dst + (r0 / QB) * nb, sc, (size_t)nb * sizeof *sc);
			continue;
		}
		uint8_t *o = (uint8_t *)dst + (size_t)(r0 * C);
		for (int64_t i = 0; i < m; i++)
			for (int64_t j = 0; j < C; j++)
				o[i * C + j] = dt_f32_to_e4m3(buf[i * C + j] / sc[j / QB]);
	}
	free(buf);
	free(sc);
	return rc;
}

/* Adds one slice spec. name: NULL for src->name, else malloc'd and owned by the spec. */
static int add_slice(struct plan *p, const struct slice_ctx *proto,
		     const struct st_tensor *shape_of, enum dt_type dt, char *name, int rank_file,
		     char *err, size_t errsz)
{
	struct slice_ctx *c = malloc(sizeof *c);
	if (!c) {
		free(name);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	*c = *proto;
	struct snap_spec sp = {.name = name ? name : c->src->name, .rank_file = rank_file, .dtype = dt,
			       .rank = shape_of->rank, .produce = produce_slice, .ctx = c,
			       .owned_name = name != NULL, .layout = c->tag};
	memcpy(sp.shape, shape_of->shape, sizeof sp.shape);
	int64_t lo = c->lo, hi = c->hi;
	if (c->mode == SL_QUANT_SCALE) { /* the shard's own scale grid */
		int64_t R = c->axis ? rows_of(c->src) : hi - lo;
		int64_t C = c->axis ? hi - lo : cols_of(c->src);
		sp.rank = 2;
		sp.shape[0] = (R + QB - 1) / QB;
		sp.shape[1] = (C + QB - 1) / QB;
	} else {
		sp.shape[c->axis] = hi - lo;
	}
	sp.nbytes = dt_size(dt);
	for (int d = 0; d < sp.rank; d++)
		sp.nbytes *= (uint64_t)sp.shape[d];
	int rc = plan_add(p, &sp, err, errsz);
	if (rc != WK_OK) {
		free(c);
		free(name);
	}
	return rc;
}

int plan_slice(struct plan *p, const char *name, int rank_file, int axis, int64_t lo,
	       int64_t hi, const char *tag, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	int64_t dim = axis ? cols_of(src) : rows_of(src);
	if ((axis != 0 && (axis != 1 || src->rank != 2)) || lo < 0 || lo >= hi || hi > dim)
		return wk_errf(err, errsz, WK_EINVAL, "%s: no slice %lld:%lld along dim %d of '%s'",
			       hf_dir(p->hf), (long long)lo, (long long)hi, axis, name);
	struct slice_ctx c = {.src = src, .axis = axis, .lo = lo, .hi = hi, .mode = SL_COPY};
	snprintf(c.tag, sizeof c.tag, "%s", tag);
	if (src->dtype == DT_F8_E4M3) {
		char sname[ST_MAX_NAME + 16];
		snprintf(sname, sizeof sname, "%s_scale_inv", name);
		const struct st_tensor *s = hf_tensor(p->hf, sname);
		if (!s || s->dtype != DT_F32 || s->rank != 2 ||
		    s->shape[0] != (rows_of(src) + QB - 1) / QB ||
		    s->shape[1] != (cols_of(src) + QB - 1) / QB)
			return wk_errf(err, errsz, WK_EFORMAT, "%s: FP8 tensor '%s' has no F32 "
				       "128x128 block scales '%s'", hf_dir(p->hf), name, sname);
		if (lo % QB == 0 && (hi % QB == 0 || hi == dim)) {
			int rc = add_slice(p, &c, src, DT_F8_E4M3, NULL, rank_file, err, errsz);
			if (rc != WK_OK)
				return rc;
			struct slice_ctx cs = c;
			cs.src = s;
			cs.lo = lo / QB;
			cs.hi = (hi + QB - 1) / QB;
			return add_slice(p, &cs, s, DT_F32, NULL, rank_file, err, errsz);
		}
		c.mode = SL_DEQUANT;
		c.scale = s;
		size_t l = strlen(c.tag);
		snprintf(c.tag + l, sizeof c.tag - l, "; f32 from fp8");
		return add_slice(p, &c, src, DT_F32, NULL, rank_file, err, errsz);
	}
	if (p->cast == DT_F8_E4M3 && fp8_candidate(src)) {
		char *sname = malloc(strlen(name) + 16);
		if (!sname)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		sprintf(sname, "%s_scale_inv", name);
		c.mode = SL_QUANT;
		int rc = add_slice(p, &c, src, DT_F8_E4M3, NULL, rank_file, err, errsz);
		if (rc != WK_OK) {
			free(sname);
			return rc;
		}
		c.mode = SL_QUANT_SCALE;
		return add_slice(p, &c, src, DT_F32, sname, rank_file, err, errsz);
	}
	enum dt_type dt = src->dtype;
	if (p->cast != DT_INVALID && p->cast != DT_F8_E4M3 && src->rank >= 2 && is_float(dt))
		dt = p->cast;
	return add_slice(p, &c, src, dt, NULL, rank_file, err, errsz);
}

int plan_replicated(struct plan *p, const char *name, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	for (int r = 0; r < p->world; r++) {
		int rc = plan_slice(p, name, r, 0, 0, rows_of(src), "replicated", err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

int plan_tp_ranges(struct plan *p, const char *name, int axis, const int64_t *lo,
		   const int64_t *hi, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	int64_t dim = axis ? cols_of(src) : rows_of(src);
	for (int r = 0; r < p->world; r++) {
		int k = r % p->tp;
		char tag[SNAP_MAX_LAYOUT_TAG];
		snprintf(tag, sizeof tag, "tp %s %lld:%lld of %lld", axis ? "cols" : "rows",
			 (long long)lo[k], (long long)hi[k], (long long)dim);
		int rc = plan_slice(p, name, r, axis, lo[k], hi[k], tag, err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

int plan_tp(struct plan *p, const char *name, int axis, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	int64_t dim = axis ? cols_of(src) : rows_of(src), lo[COMM_MAX_WORLD], hi[COMM_MAX_WORLD];
	if (dim % p->tp != 0)
		return wk_errf(err, errsz, WK_EINVAL, "%s: '%s' has %lld %s, which do not split "
			       "evenly over tp %d", hf_dir(p->hf), name, (long long)dim,
			       axis ? "columns" : "rows", p->tp);
	for (int k = 0; k < p->tp; k++) {
		lo[k] = dim / p->tp * k;
		hi[k] = dim / p->tp * (k + 1);
	}
	return plan_tp_ranges(p, name, axis, lo, hi, err, errsz);
}

int plan_expert(struct plan *p, const char *name, int ep_rank, char *err, size_t errsz)
{
	const struct st_tensor *src = source(p, name, err, errsz);
	if (!src)
		return WK_ENOTFOUND;
	char tag[SNAP_MAX_LAYOUT_TAG];
	snprintf(tag, sizeof tag, "expert (ep rank %d)", ep_rank);
	for (int r = ep_rank; r < p->world; r += p->ep) {
		int rc = plan_slice(p, name, r, 0, 0, rows_of(src), tag, err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	return WK_OK;
}

static void plan_free(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->specs[i].ctx);
		if (p->specs[i].owned_name)
			free((char *)p->specs[i].name);
	}
	free(p->specs);
}

/* Opens hf_dir and asks its family for the plan. On failure p holds what was made so far. */
static int make_plan(const char *hf_dir, const struct eng_snap_opts *o, struct plan *p,
		     const char **arch_out, char *err, size_t errsz)
{
	int tp = o->tp > 0 ? o->tp : 1, ep = o->ep > 0 ? o->ep : 1;
	int world = tp > ep ? tp : ep;
	const char *dtype = o->dtype ? o->dtype : "keep";
	if (world > SNAP_MAX_RANKS)
		return wk_errf(err, errsz, WK_EINVAL, "--tp %d --ep %d: a world of %d ranks is more "
			       "than %d", tp, ep, world, SNAP_MAX_RANKS);
	if (world % tp || world % ep)
		return wk_errf(err, errsz, WK_EINVAL, "--tp %d --ep %d: the smaller must divide the "
			       "larger (the world is max(tp, ep) ranks, shared by both)", tp, ep);
	p->tp = tp;
	p->ep = ep;
	p->world = world;
	if (!strcmp(dtype, "bf16"))
		p->cast = DT_BF16;
	else if (!strcmp(dtype, "f32"))
		p->cast = DT_F32;
	else if (!strcmp(dtype, "fp8"))
		p->cast = DT_F8_E4M3;
	else if (strcmp(dtype, "keep") != 0)
		return wk_errf(err, errsz, WK_EINVAL, "--dtype '%s': expected keep, fp8, bf16 or f32",
			       dtype);

	int rc = hf_open(hf_dir, &p->hf, err, errsz);
	if (rc != WK_OK)
		return rc;
	json_t *cfg = hf_config(p->hf);
	const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
	const struct family *fam = arch ? eng_family(arch) : NULL;
	if (!fam)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "%s/config.json: architecture '%s' is not supported", hf_dir,
			       arch ? arch : "(none)");
	*arch_out = arch;
	return fam->plan(p->hf, o, p, err, errsz);
}

/* The snapshot's tokenizer: tokenizer.json as read once here, and its prepared form made
 * from those same bytes (so the two cannot disagree), as made[0..*n) (none without a
 * tokenizer.json). *json and *prep hold the bytes; the caller frees them. */
static int prepare_tokenizer(const char *hf_dir, struct snap_file *made, size_t *n, char **json,
			     char **prep, char *err, size_t errsz)
{
	char path[4096];
	size_t jlen, plen;
	*n = 0;
	if (snprintf(path, sizeof path, "%s/tokenizer.json", hf_dir) >= (int)sizeof path)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", hf_dir);
	int rc = wk_read_file(path, TOK_MAX_FILE, json, &jlen, err, errsz);
	if (rc == WK_ENOTFOUND)
		return WK_OK;
	if (rc != WK_OK)
		return rc;
	if ((rc = tok_prepare_json(path, *json, jlen, prep, &plen, err, errsz)))
		return rc;
	made[0] = (struct snap_file){"tokenizer.json", *json, jlen};
	made[1] = (struct snap_file){"tokenizer.prepared", *prep, plen};
	*n = 2;
	return WK_OK;
}

int eng_snapshot(const char *hf_dir, const char *out_dir, const struct eng_snap_opts *o,
		 char *err, size_t errsz)
{
	struct plan p = {.cast = DT_INVALID};
	const char *arch = NULL;
	json_t *layout = NULL;
	struct snap_file made[2];
	char *tok_json = NULL, *tok_prep = NULL; /* made's bytes */
	size_t n_made = 0;
	int rc = make_plan(hf_dir, o, &p, &arch, err, errsz);
	if (rc != WK_OK)
		goto out;
	if (p.world == 1)
		layout = json_pack("{s:i, s:s, s:s}", "version", 1, "family", arch, "rules",
				   "hf-names, row-major [out][in], matrices cast to dtype");
	else
		layout = json_pack("{s:i, s:s, s:i, s:i, s:s}", "version", 2, "family", arch, "tp",
				   p.tp, "ep", p.ep, "rules",
				   "hf-names, row-major [out][in], matrices cast to dtype; rank r "
				   "holds tp shard r % tp and the experts of ep rank r % ep; each "
				   "tensor's layout tag says replicated, tp rows/cols lo:hi of n, or "
				   "expert");
	if (!layout) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto out;
	}
	static const char *const copy[] = {"tokenizer_config.json", "generation_config.json",
					   "config.json", "chat_template.jinja", NULL};
	if ((rc = prepare_tokenizer(hf_dir, made, &n_made, &tok_json, &tok_prep, err, errsz)))
		goto out;
	struct snap_write_opts wo = {.world = p.world, .tp = p.tp, .ep = p.ep,
				     .dtype = o->dtype ? o->dtype : "keep", .lz4 = o->lz4,
				     .chunk_size = o->chunk_size, .config = hf_config(p.hf),
				     .layout = layout,
				     .src_dir = hf_dir, .copy = copy, .made = made,
				     .n_made = n_made};
	/* The model must load as a start would load it (config and tensor checks; the cpu
	 * backend, weights mapped and bound, one position of KV cache), so that a snapshot that
	 * cannot serve is refused here, not at a worker's cold start. */
	struct engine *e = NULL;
	struct eng_opts eo = {.backend = "cpu", .threads = 1, .max_seq = 1,
			      .mtp = o->mtp ? ENG_MTP_ON : ENG_MTP_OFF};
	char why[WK_ERRSZ];
	if ((rc = eng_open(hf_dir, &eo, &e, why, sizeof why)) != WK_OK) {
		wk_errf(err, errsz, rc, "%s will not load, so no snapshot was written: %s", hf_dir,
			why);
		goto out;
	}
	if (o->report) {
		o->report->unused_tensors = eng_info(e)->unused_tensors;
		snprintf(o->report->unused_example, sizeof o->report->unused_example, "%s",
			 eng_info(e)->unused_example ? eng_info(e)->unused_example : "");
	}
	eng_close(e);
	rc = snap_write(out_dir, &wo, p.specs, p.n, err, errsz);
out:
	free(tok_json);
	free(tok_prep);
	json_decref(layout);
	plan_free(&p);
	hf_close(p.hf);
	return rc;
}

/* ---- the naive load path ---------------------------------------------------------------- */

struct eng_naive {
	size_t n;
	struct {
		const char *name; /* points into names */
		void *data;
		uint64_t nbytes;
		int rank;         /* the rank file the snapshot puts it in */
	} *t;
	char *names;
	void *mem;
	uint64_t bytes;
};

static int by_source_offset(const void *a, const void *b)
{
	const struct st_tensor *x = ((const struct copy_ctx *)((const struct snap_spec *)a)->ctx)->src;
	const struct st_tensor *y = ((const struct copy_ctx *)((const struct snap_spec *)b)->ctx)->src;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return strcmp(x->name, y->name); /* shards: ties across files, any fixed order */
}

int eng_naive_load(const char *hf_dir, const struct eng_snap_opts *o, struct eng_naive **out,
		   char *err, size_t errsz)
{
	struct plan p = {.cast = DT_INVALID};
	const char *arch = NULL;
	struct eng_naive *nv = calloc(1, sizeof *nv);
	if (!nv)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	int rc = make_plan(hf_dir, o, &p, &arch, err, errsz);
	if (rc != WK_OK)
		goto fail;
	for (size_t i = 0; i < hf_shard_count(p.hf); i++)
		st_advise(hf_shard(p.hf, i), MADV_SEQUENTIAL);
	if (p.n) /* specs is NULL in a plan of no tensors */
		qsort(p.specs, p.n, sizeof *p.specs, by_source_offset);
	size_t names = 0;
	for (size_t i = 0; i < p.n; i++) {
		nv->bytes += p.specs[i].nbytes;
		names += strlen(p.specs[i].name) + 1;
	}
	nv->t = calloc(p.n ? p.n : 1, sizeof *nv->t);
	nv->names = malloc(names + 1);
	/* One allocation for every tensor, as an engine sizes its weight memory up front. */
	nv->mem = nv->bytes ? mmap(NULL, nv->bytes, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
	if (!nv->t || !nv->names || nv->mem == MAP_FAILED) {
		nv->mem = NULL;
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory for %llu bytes of weights",
			     (unsigned long long)nv->bytes);
		goto fail;
	}
	char *np = nv->names, *dst = nv->mem;
	for (size_t i = 0; i < p.n; i++) {
		struct snap_spec *sp = &p.specs[i];
		if ((rc = sp->produce(sp->ctx, sp, dst, err, errsz)) != WK_OK)
			goto fail;
		size_t l = strlen(sp->name) + 1;
		memcpy(np, sp->name, l);
		nv->t[i].name = np;
		nv->t[i].data = dst;
		nv->t[i].nbytes = sp->nbytes;
		nv->t[i].rank = sp->rank_file;
		np += l;
		dst += sp->nbytes;
	}
	nv->n = p.n;
	plan_free(&p);
	hf_close(p.hf);
	*out = nv;
	return WK_OK;
fail:
	plan_free(&p);
	hf_close(p.hf);
	eng_naive_free(nv);
	return rc;
}

size_t eng_naive_count(const struct eng_naive *n)
{
	return n->n;
}

const char *eng_naive_tensor(const struct eng_naive *n, size_t i, const void **data,
			     uint64_t *nbytes)
{
	if (i >= n->n)
		return NULL;
	*data = n->t[i].data;
	*nbytes = n->t[i].nbytes;
	return n->t[i].name;
}

int eng_naive_rank(const struct eng_naive *n, size_t i)
{
	return i < n->n ? n->t[i].rank : -1;
}

uint64_t eng_naive_bytes(const struct eng_naive *n)
{
	return n->bytes;
}

void eng_naive_free(struct eng_naive *n)
{
	if (!n)
		return;
	if (n->mem)
		munmap(n->mem, n->bytes);
	free(n->t);
	free(n->names);
	free(n);
}
