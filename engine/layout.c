/*
 * layout.c - snapshot layouts: the engine decides what each rank's file holds, in which dtype
 * and shape; coldstart/snapshot.c stores and streams the bytes without knowing why.
 *
 * Layout version 1 (recorded in the manifest's "layout"): tensors keep their Hugging Face
 * names and row-major [out][in] shapes, which is what the CPU kernels read in place; `--dtype`
 * casts floating-point matrices (rank >= 2) and leaves vectors (norms, biases) as they are.
 * The sharding issue adds per-rank splits; the family's plan() owns those rules.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/wk.h"
#include "engine/engine_int.h"

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
static bool fp8_candidate(const struct st_tensor *t)
{
	size_t l = strlen(t->name);
	return t->rank == 2 && (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16) &&
	       !strncmp(t->name, "model.layers.", 13) && l > 12 &&
	       !strcmp(t->name + l - 12, "_proj.weight") && !strstr(t->name, "weights_proj") &&
	       !strstr(t->name, "eh_proj");
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

int plan_copy(struct plan *p, const char *name, int rank_file, char *err, size_t errsz)
{
	const struct st_tensor *src = hf_tensor(p->hf, name);
	if (!src)
		return wk_errf(err, errsz, WK_ENOTFOUND, "%s: tensor '%s' is missing",
			       hf_dir(p->hf), name);
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
	const char *dtype = o->dtype ? o->dtype : "keep";
	if (tp != 1 || ep != 1)
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "--tp %d --ep %d: sharded snapshots need the sharded engine, which is "
			       "not built yet (use --tp 1 --ep 1)", tp, ep);
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

int eng_snapshot(const char *hf_dir, const char *out_dir, const struct eng_snap_opts *o,
		 char *err, size_t errsz)
{
	struct plan p = {.cast = DT_INVALID};
	const char *arch = NULL;
	json_t *layout = NULL;
	int rc = make_plan(hf_dir, o, &p, &arch, err, errsz);
	if (rc != WK_OK)
		goto out;
	layout = json_pack("{s:i, s:s, s:s}", "version", 1, "family", arch, "rules",
			   "hf-names, row-major [out][in], matrices cast to dtype");
	static const char *const copy[] = {"tokenizer.json", "tokenizer_config.json",
					   "generation_config.json", "config.json", NULL};
	struct snap_write_opts wo = {.world = 1, .tp = 1, .ep = 1,
				     .dtype = o->dtype ? o->dtype : "keep", .lz4 = o->lz4,
				     .chunk_size = o->chunk_size, .config = hf_config(p.hf),
				     .layout = layout,
				     .src_dir = hf_dir, .copy = copy};
	rc = snap_write(out_dir, &wo, p.specs, p.n, err, errsz);
out:
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
