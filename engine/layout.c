/*
 * layout.c - snapshot layouts: the engine decides what each rank's file holds, in which dtype
 * and shape; coldstart/snapshot.c stores and streams the bytes without knowing why.
 *
 * Layout version 1 (recorded in the manifest's "layout"): tensors keep their Hugging Face
 * names and row-major [out][in] shapes, which is what the CPU kernels read in place; `--dtype`
 * casts floating-point matrices (rank >= 2) and leaves vectors (norms, biases) as they are.
 * The sharding issue adds per-rank splits; the family's plan() owns those rules.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/wk.h"
#include "engine/engine_int.h"

struct copy_ctx {
	const struct st_tensor *src;
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
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		struct snap_spec *s = realloc(p->specs, cap * sizeof *s);
		if (!s)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		p->specs = s;
		p->cap = cap;
	}
	struct copy_ctx *c = malloc(sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	c->src = src;
	enum dt_type dt = src->dtype;
	if (p->cast != DT_INVALID && src->rank >= 2 && is_float(dt))
		dt = p->cast;
	struct snap_spec *s = &p->specs[p->n++];
	*s = (struct snap_spec){.name = src->name, .rank_file = rank_file, .dtype = dt,
				.rank = src->rank, .nbytes = (uint64_t)src->numel * dt_size(dt),
				.produce = produce_copy, .ctx = c};
	memcpy(s->shape, src->shape, sizeof s->shape);
	return WK_OK;
}

static void plan_free(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->specs[i].ctx);
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
		return wk_errf(err, errsz, WK_EUNSUPPORTED,
			       "--dtype fp8 needs the FP8 block-scaled kernels, which are not built "
			       "yet (use keep, bf16 or f32)");
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
