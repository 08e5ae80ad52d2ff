/*
 * snapshot_manifest.c - read and validate a snapshot's manifest.json, and the small helpers
 * (hex, little-endian, messages, header block, tree removal) the other snapshot files share.
 *
 * Validation is complete before anything is opened or allocated for restoring: every field's
 * type, every limit, tensors inside their image and not overlapping, chunks tiling the image
 * exactly and the file exactly (so a chunk's file range is known to lie inside a file of the
 * recorded size, which snap_open then checks against the real file), and each rank's hash
 * against its chunks' hashes. The format and version are checked first, so a manifest from
 * another version gets the version message rather than a complaint about some field.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <lz4.h>
#include <unistd.h>
#include <xxhash.h>

#include "coldstart/snapshot_int.h"
#include "common/wk.h"

/* ---- shared helpers ----------------------------------------------------------------------- */

void snap__hex(uint64_t v, char out[17])
{
	snprintf(out, 17, "%016" PRIx64, v);
}

int snap__unhex(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	for (int i = 0; i < 16; i++) {
		char c = s[i];
		int d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else
			return -1;
		v = (v << 4) | (uint64_t)d;
	}
	if (s[16])
		return -1;
	*out = v;
	return 0;
}

void snap__header(unsigned char *buf, uint32_t version, uint32_t rank, uint32_t world,
		  uint64_t image_size, uint64_t nchunks, uint64_t xxh3, uint64_t meaning)
{
	memset(buf, 0, SNAP_ALIGN);
	memcpy(buf, SNAP_MAGIC, 8);
	wk_put32(buf + 8, version);
	wk_put32(buf + 12, rank);
	wk_put64(buf + 16, image_size);
	wk_put64(buf + 24, nchunks);
	wk_put32(buf + 32, world);
	wk_put64(buf + 40, xxh3);
	wk_put64(buf + 48, meaning);
}

const char *snap__file_name(const json_t *v)
{
	return json_is_string(v) ? json_string_value(v)
				 : json_string_value(json_object_get(v, "name"));
}

int snap__files_check(const struct snap *s, char *err, size_t errsz)
{
	size_t i;
	json_t *v;
	if (s->version < 2)
		return WK_OK;
	json_array_foreach(json_object_get(s->m, "files"), i, v) {
		const char *name = snap__file_name(v);
		uint64_t size = (uint64_t)json_integer_value(json_object_get(v, "size")), want, got;
		snap__unhex(json_string_value(json_object_get(v, "xxh3")), &want);
		char path[SNAP_PATH], have[17], says[17];
		if (snprintf(path, sizeof path, "%s/%s", s->dir, name) >= (int)sizeof path)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", s->dir);
		char *text;
		size_t len;
		int rc = wk_read_file(path, SNAP_MAX_COPY, &text, &len, err, errsz);
		if (rc == WK_ENOTFOUND)
			return wk_errf(err, errsz, rc, "%s: missing, though the snapshot's manifest "
				       "lists it; copy it back or run wick snapshot again", path);
		if (rc)
			return rc;
		got = XXH3_64bits(text, len);
		free(text);
		if (len != size || got != want) {
			snap__hex(got, have);
			snap__hex(want, says);
			return wk_errf(err, errsz, WK_EFORMAT, "%s: changed after the snapshot was "
				       "written (%zu bytes, xxh3 %s; the manifest says %" PRIu64
				       " bytes, xxh3 %s); the snapshot's model would run with it: "
				       "restore it or run wick snapshot again", path, len, have, size,
				       says);
		}
	}
	return WK_OK;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Feeds v to h in a form of its own, not jansson's text (whose real formatting changed between
 * versions: a snapshot must read the same under another build): a type byte, then integers
 * and reals as their 8 bytes (a real's IEEE bits), strings and keys length-prefixed, object
 * members sorted by key, arrays in order. Returns 0, or -1 when out of memory. */
static int hash_json(XXH3_state_t *h, const json_t *v, int depth)
{
	unsigned char b[9];
	b[0] = (unsigned char)json_typeof(v);
	if (depth > 64)
		return -1;
	switch (json_typeof(v)) {
	case JSON_INTEGER:
		wk_put64(b + 1, (uint64_t)json_integer_value(v));
		XXH3_64bits_update(h, b, 9);
		return 0;
	case JSON_REAL: {
		double d = json_real_value(v);
		uint64_t u;
		memcpy(&u, &d, 8);
		wk_put64(b + 1, u);
		XXH3_64bits_update(h, b, 9);
		return 0;
	}
	case JSON_STRING:
		wk_put64(b + 1, (uint64_t)json_string_length(v));
		XXH3_64bits_update(h, b, 9);
		XXH3_64bits_update(h, json_string_value(v), json_string_length(v));
		return 0;
	case JSON_ARRAY: {
		size_t i;
		json_t *e;
		wk_put64(b + 1, (uint64_t)json_array_size(v));
		XXH3_64bits_update(h, b, 9);
		json_array_foreach((json_t *)v, i, e)
			if (hash_json(h, e, depth + 1))
				return -1;
		return 0;
	}
	case JSON_OBJECT: {
		size_t n = json_object_size(v), i = 0;
		const char **keys = malloc((n ? n : 1) * sizeof *keys), *k;
		json_t *e;
		if (!keys)
			return -1;
		json_object_foreach((json_t *)v, k, e)
			keys[i++] = k;
		qsort(keys, n, sizeof *keys, cmp_str);
		wk_put64(b + 1, (uint64_t)n);
		XXH3_64bits_update(h, b, 9);
		int rc = 0;
		for (i = 0; i < n && !rc; i++) {
			wk_put64(b + 1, (uint64_t)strlen(keys[i]));
			XXH3_64bits_update(h, b + 1, 8);
			XXH3_64bits_update(h, keys[i], strlen(keys[i]));
			rc = hash_json(h, json_object_get(v, keys[i]), depth + 1);
		}
		free(keys);
		return rc;
	}
	default: /* true, false, null: the type says it all */
		XXH3_64bits_update(h, b, 1);
		return 0;
	}
}

int snap__meaning_hash(json_t *config, json_t *layout, uint64_t world, uint64_t tp, uint64_t ep,
		       json_t *tensors, uint64_t *out)
{
	json_t *o = json_pack("{sO sO sI sI sI sO}", "config", config, "layout",
			      layout ? layout : json_null(), "world", (json_int_t)world, "tp",
			      (json_int_t)tp, "ep", (json_int_t)ep, "tensors", tensors);
	XXH3_state_t *h = XXH3_createState();
	int rc = o && h && XXH3_64bits_reset(h) == XXH_OK ? hash_json(h, o, 0) : -1;
	if (!rc)
		*out = XXH3_64bits_digest(h);
	XXH3_freeState(h);
	json_decref(o);
	return rc;
}

int snap__rank_hash(const struct snap_chunk *c, size_t nc, uint64_t *out)
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		return -1;
	XXH3_64bits_reset(st);
	for (size_t i = 0; i < nc; i++) {
		unsigned char b[8];
		wk_put64(b, c[i].xxh3);
		XXH3_64bits_update(st, b, 8);
	}
	*out = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return 0;
}

const char *snap__chunk_tensors(const struct snap_rank *r, uint64_t off, uint64_t len,
				char *buf, size_t bufsz)
{
	char nb[ST_SHOWN];
	size_t count = 0, shown = 0, o = 0;
	for (size_t i = 0; i < r->nt; i++) {
		const struct st_tensor *t = &r->t[i];
		if (t->nbytes && t->offset < off + len && t->offset + t->nbytes > off)
			count++;
	}
	if (count == 0) {
		snprintf(buf, bufsz, "it holds only padding");
		return buf;
	}
	o = (size_t)snprintf(buf, bufsz, "it holds tensor%s ", count > 1 ? "s" : "");
	for (size_t i = 0; i < r->nt && shown < 3 && o < bufsz; i++) {
		const struct st_tensor *t = &r->t[i];
		if (!(t->nbytes && t->offset < off + len && t->offset + t->nbytes > off))
			continue;
		o += (size_t)snprintf(buf + o, bufsz - o, "%s'%s'", shown ? ", " : "",
				      st_shown(t->name, nb));
		shown++;
	}
	if (count > shown && o < bufsz)
		snprintf(buf + o, bufsz - o, " and %zu more", count - shown);
	return buf;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return (flag == FTW_DP ? rmdir(path) : unlink(path)) ? -1 : 0;
}

int snap__rmtree(const char *path)
{
	return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void snap__free(struct snap *s)
{
	if (!s)
		return;
	for (int i = 0; s->r && i < s->world; i++) {
		struct snap_rank *r = &s->r[i];
		if (r->image) {
			if (s->on_sink)
				s->sink.release(s->sink.ctx, i, r->image);
			else if (r->image_mmapped)
				munmap(r->image, r->image_size);
			else if (s->alloc.release)
				s->alloc.release(s->alloc.ctx, i, r->image, r->image_size);
		}
		if (r->fmap)
			munmap(r->fmap, r->size);
		if (r->fd >= 0)
			close(r->fd);
		if (r->fd_direct >= 0)
			close(r->fd_direct);
		free(r->path);
		free(r->t);
		free(r->layout);
		free(r->by_name);
		free(r->c);
	}
	free(s->r);
	json_decref(s->m);
	free(s->dir);
	free(s);
}

/* ---- typed field access ------------------------------------------------------------------- */

struct mp {
	const char *path; /* manifest path, for messages */
	char *err;
	size_t errsz;
};

static const char *fld(char *buf, size_t n, const char *where, const char *key)
{
	snprintf(buf, n, "%s%s%s", where, *where ? "." : "", key);
	return buf;
}

static int get(struct mp *p, json_t *obj, const char *where, const char *key, json_t **out)
{
	char f[128];
	*out = json_object_get(obj, key);
	if (!*out)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: missing \"%s\"", p->path,
			       fld(f, sizeof f, where, key));
	return WK_OK;
}

static int get_uint(struct mp *p, json_t *obj, const char *where, const char *key, uint64_t max,
		    uint64_t *out)
{
	char f[128];
	json_t *v;
	int rc = get(p, obj, where, key, &v);
	if (rc)
		return rc;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not a non-negative integer",
			       p->path, fld(f, sizeof f, where, key));
	if ((uint64_t)json_integer_value(v) > max)
		return wk_errf(p->err, p->errsz, WK_ELIMIT, "%s: %s = %lld is over the limit of %"
			       PRIu64, p->path, fld(f, sizeof f, where, key),
			       (long long)json_integer_value(v), max);
	*out = (uint64_t)json_integer_value(v);
	return WK_OK;
}

/* A string without embedded NULs, of at most max bytes. */
static int get_str(struct mp *p, json_t *obj, const char *where, const char *key, size_t max,
		   const char **out)
{
	char f[128];
	json_t *v;
	int rc = get(p, obj, where, key, &v);
	if (rc)
		return rc;
	if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not a string", p->path,
			       fld(f, sizeof f, where, key));
	if (json_string_length(v) > max)
		return wk_errf(p->err, p->errsz, WK_ELIMIT, "%s: %s is %zu bytes, over the limit "
			       "of %zu", p->path, fld(f, sizeof f, where, key),
			       json_string_length(v), max);
	*out = json_string_value(v);
	return WK_OK;
}

static int get_hex(struct mp *p, json_t *obj, const char *where, const char *key, uint64_t *out)
{
	char f[128];
	const char *s;
	int rc = get_str(p, obj, where, key, 64, &s);
	if (rc)
		return rc;
	if (snap__unhex(s, out))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not 16 lowercase hex "
			       "digits", p->path, fld(f, sizeof f, where, key));
	return WK_OK;
}

static int get_array(struct mp *p, json_t *obj, const char *where, const char *key, size_t max,
		     json_t **out)
{
	char f[128];
	int rc = get(p, obj, where, key, out);
	if (rc)
		return rc;
	if (!json_is_array(*out))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not an array", p->path,
			       fld(f, sizeof f, where, key));
	if (json_array_size(*out) > max)
		return wk_errf(p->err, p->errsz, WK_ELIMIT, "%s: %s has %zu entries, over the "
			       "limit of %zu", p->path, fld(f, sizeof f, where, key),
			       json_array_size(*out), max);
	return WK_OK;
}

/* A name that may be joined to the snapshot dir: no '/', not "." or "..", not empty. */
static bool plain_name(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* ---- sections ----------------------------------------------------------------------------- */

static int check_source(struct mp *p, json_t *src)
{
	json_t *files, *f;
	const char *s;
	uint64_t u;
	size_t i;
	int rc;
	char w[64];

	if (json_is_null(src))
		return WK_OK;
	if (!json_is_object(src))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: source is not an object or null",
			       p->path);
	if ((rc = get_str(p, src, "source", "dir", SNAP_PATH, &s)) ||
	    (rc = get_hex(p, src, "source", "xxh3", &u)) ||
	    (rc = get_array(p, src, "source", "files", SNAP_MAX_SOURCE_FILES, &files)))
		return rc;
	json_array_foreach(files, i, f) {
		snprintf(w, sizeof w, "source.files[%zu]", i);
		json_t *mt;
		if (!json_is_object(f))
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not an object",
				       p->path, w);
		if ((rc = get_str(p, f, w, "name", 255, &s)) ||
		    (rc = get_uint(p, f, w, "size", INT64_MAX, &u)) ||
		    (rc = get_hex(p, f, w, "xxh3", &u)) || (rc = get(p, f, w, "mtime_ns", &mt)))
			return rc;
		if (!json_is_integer(mt))
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s.mtime_ns is not an "
				       "integer", p->path, w);
	}
	return WK_OK;
}

static int cmp_name_idx_ctx(const void *a, const void *b, void *ctx)
{
	const struct st_tensor *t = ctx;
	return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_off_idx_ctx(const void *a, const void *b, void *ctx)
{
	const struct st_tensor *t = ctx;
	const struct st_tensor *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int parse_tensor(struct mp *p, struct snap_rank *r, int ri, size_t i, json_t *e)
{
	char w[64], nb[ST_SHOWN];
	struct st_tensor *t = &r->t[i];
	const char *dn;
	json_t *shape, *lay;
	int rc;

	snprintf(w, sizeof w, "ranks[%d].tensors[%zu]", ri, i);
	if (!json_is_object(e))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not an object", p->path, w);
	if ((rc = get_str(p, e, w, "name", ST_MAX_NAME, &t->name)) ||
	    (rc = get_str(p, e, w, "dtype", 32, &dn)) ||
	    (rc = get_array(p, e, w, "shape", ST_MAX_RANK, &shape)) ||
	    (rc = get_uint(p, e, w, "offset", SNAP_MAX_IMAGE, &t->offset)) ||
	    (rc = get_uint(p, e, w, "nbytes", SNAP_MAX_IMAGE, &t->nbytes)))
		return rc;
	if (!*t->name)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s.name is empty", p->path, w);
	const char *nm = st_shown(t->name, nb);
	t->dtype = dt_from_name(dn);
	if (t->dtype == DT_INVALID)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: tensor '%s': unknown dtype",
			       p->path, nm);
	t->rank = (int)json_array_size(shape);
	t->numel = 1;
	bool overflow = false;
	for (int d = 0; d < t->rank; d++) {
		json_t *v = json_array_get(shape, (size_t)d);
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: tensor '%s': shape[%d] is "
				       "not a non-negative integer", p->path, nm, d);
		t->shape[d] = (int64_t)json_integer_value(v);
		if (t->shape[d] && t->numel > INT64_MAX / t->shape[d])
			overflow = true;
		else
			t->numel *= t->shape[d];
	}
	for (int d = 0; d < t->rank; d++)
		if (t->shape[d] == 0) {
			overflow = false;
			t->numel = 0;
		}
	uint64_t esz = dt_size(t->dtype);
	if (overflow || (uint64_t)t->numel > UINT64_MAX / esz ||
	    (uint64_t)t->numel * esz != t->nbytes)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: tensor '%s': nbytes %" PRIu64
			       " does not match its shape and dtype %s", p->path, nm, t->nbytes,
			       dt_name(t->dtype));
	if (t->offset % SNAP_ALIGN)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: tensor '%s': offset %" PRIu64
			       " is not a multiple of %d", p->path, nm, t->offset, SNAP_ALIGN);
	if (t->offset > r->image_size || t->nbytes > r->image_size - t->offset)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: tensor '%s': bytes %" PRIu64
			       "..%" PRIu64 " lie outside the %" PRIu64 "-byte image of %s",
			       p->path, nm, t->offset, t->offset + t->nbytes, r->image_size,
			       r->file);
	lay = json_object_get(e, "layout");
	if (lay && !json_is_null(lay)) {
		const char *tag;
		if ((rc = get_str(p, e, w, "layout", SNAP_MAX_LAYOUT_TAG, &tag)))
			return rc;
		r->layout[i] = tag;
	}
	return WK_OK;
}

static int parse_tensors(struct mp *p, struct snap_rank *r, int ri, json_t *arr)
{
	char nb[ST_SHOWN], nb2[ST_SHOWN];
	size_t *byoff = NULL;
	json_t *e;
	size_t i;
	int rc;

	r->nt = json_array_size(arr);
	r->t = calloc(r->nt ? r->nt : 1, sizeof *r->t);
	r->layout = calloc(r->nt ? r->nt : 1, sizeof *r->layout);
	r->by_name = malloc((r->nt ? r->nt : 1) * sizeof *r->by_name);
	byoff = malloc((r->nt ? r->nt : 1) * sizeof *byoff);
	if (!r->t || !r->layout || !r->by_name || !byoff) {
		rc = wk_errf(p->err, p->errsz, WK_ENOMEM, "%s: out of memory", p->path);
		goto fail;
	}
	uint64_t end = 0;
	json_array_foreach(arr, i, e) {
		if ((rc = parse_tensor(p, r, ri, i, e)))
			goto fail;
		if (r->t[i].offset + r->t[i].nbytes > end)
			end = r->t[i].offset + r->t[i].nbytes;
		r->by_name[i] = byoff[i] = i;
	}
	if (snap__align(end) != r->image_size) {
		rc = wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d].image_size %" PRIu64
			     " is not the end of its last tensor rounded up to 4 KiB (%" PRIu64 ")",
			     p->path, ri, r->image_size, snap__align(end));
		goto fail;
	}
	qsort_r(r->by_name, r->nt, sizeof *r->by_name, cmp_name_idx_ctx, r->t);
	for (i = 1; i < r->nt; i++)
		if (!strcmp(r->t[r->by_name[i - 1]].name, r->t[r->by_name[i]].name)) {
			rc = wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d]: tensor '%s' is "
				     "listed twice", p->path, ri,
				     st_shown(r->t[r->by_name[i]].name, nb));
			goto fail;
		}
	qsort_r(byoff, r->nt, sizeof *byoff, cmp_off_idx_ctx, r->t);
	uint64_t prev_end = 0;
	const struct st_tensor *prev = NULL;
	for (i = 0; i < r->nt; i++) {
		const struct st_tensor *t = &r->t[byoff[i]];
		if (!t->nbytes)
			continue;
		if (prev && t->offset < prev_end) {
			rc = wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d]: tensors '%s' and "
				     "'%s' overlap", p->path, ri, st_shown(prev->name, nb),
				     st_shown(t->name, nb2));
			goto fail;
		}
		prev = t;
		prev_end = t->offset + t->nbytes;
	}
	rc = WK_OK;
fail:
	free(byoff);
	return rc;
}

static int parse_chunks(struct mp *p, struct snap *s, struct snap_rank *r, int ri, json_t *arr,
			bool lz4_allowed)
{
	char w[64];
	json_t *e;
	size_t i;
	int rc;
	uint64_t want_n = (r->image_size + s->chunk_size - 1) / s->chunk_size;

	r->nc = json_array_size(arr);
	if (r->nc != want_n)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d] has %zu chunks; a %"
			       PRIu64 "-byte image in chunks of %" PRIu64 " needs %" PRIu64,
			       p->path, ri, r->nc, r->image_size, s->chunk_size, want_n);
	r->c = calloc(r->nc ? r->nc : 1, sizeof *r->c);
	if (!r->c)
		return wk_errf(p->err, p->errsz, WK_ENOMEM, "%s: out of memory", p->path);
	uint64_t fo = SNAP_ALIGN;
	json_array_foreach(arr, i, e) {
		struct snap_chunk *c = &r->c[i];
		json_t *lz;
		snprintf(w, sizeof w, "ranks[%d].chunks[%zu]", ri, i);
		if (!json_is_object(e))
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not an object",
				       p->path, w);
		if ((rc = get_uint(p, e, w, "offset", SNAP_MAX_IMAGE, &c->offset)) ||
		    (rc = get_uint(p, e, w, "size", SNAP_MAX_CHUNK, &c->size)) ||
		    (rc = get_uint(p, e, w, "file_offset", INT64_MAX / 2, &c->file_offset)) ||
		    (rc = get_uint(p, e, w, "stored", SNAP_MAX_CHUNK + SNAP_MAX_CHUNK / 64,
				   &c->stored)) ||
		    (rc = get_hex(p, e, w, "xxh3", &c->xxh3)) || (rc = get(p, e, w, "lz4", &lz)))
			return rc;
		if (!json_is_boolean(lz))
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s.lz4 is not a boolean",
				       p->path, w);
		c->lz4 = json_is_true(lz);
		uint64_t off = (uint64_t)i * s->chunk_size;
		uint64_t size = r->image_size - off < s->chunk_size ? r->image_size - off
								    : s->chunk_size;
		if (c->offset != off || c->size != size)
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s covers image bytes %"
				       PRIu64 "..%" PRIu64 "; chunks must tile the image, so it "
				       "should cover %" PRIu64 "..%" PRIu64, p->path, w, c->offset,
				       c->offset + c->size, off, off + size);
		if (c->file_offset != fo)
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s.file_offset is %" PRIu64
				       ", expected %" PRIu64 " (chunks follow each other 4 KiB "
				       "aligned)", p->path, w, c->file_offset, fo);
		if (c->lz4 && !lz4_allowed)
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is lz4 but compress is "
				       "\"none\"", p->path, w);
		if (!c->lz4 && c->stored != c->size)
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is raw but stores %"
				       PRIu64 " of its %" PRIu64 " bytes", p->path, w, c->stored,
				       c->size);
		if (c->lz4 && (c->stored == 0 || c->stored > (uint64_t)LZ4_COMPRESSBOUND(c->size)))
			return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s stores %" PRIu64 " lz4 "
				       "bytes, impossible for %" PRIu64 " bytes", p->path, w,
				       c->stored, c->size);
		fo = snap__align(c->file_offset + c->stored);
	}
	if (r->size != fo)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d].size is %" PRIu64
			       " but its chunks end at %" PRIu64, p->path, ri, r->size, fo);
	uint64_t h;
	if (snap__rank_hash(r->c, r->nc, &h))
		return wk_errf(p->err, p->errsz, WK_ENOMEM, "%s: out of memory", p->path);
	if (h != r->xxh3)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: ranks[%d].xxh3 does not match "
			       "its chunks' hashes", p->path, ri);
	return WK_OK;
}

static int parse_rank(struct mp *p, struct snap *s, int ri, json_t *e, bool lz4)
{
	struct snap_rank *r = &s->r[ri];
	json_t *tensors, *chunks;
	const char *file;
	uint64_t rank;
	char w[32];
	int rc;

	snprintf(w, sizeof w, "ranks[%d]", ri);
	ri %= 1000; /* ri < SNAP_MAX_RANKS; tells the compiler the name fits */
	snprintf(r->file, sizeof r->file, "rank-%03d.bin", ri);
	if (!json_is_object(e))
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is not an object", p->path, w);
	if ((rc = get_str(p, e, w, "file", 64, &file)) ||
	    (rc = get_uint(p, e, w, "rank", SNAP_MAX_RANKS, &rank)) ||
	    (rc = get_uint(p, e, w, "size", INT64_MAX / 2, &r->size)) ||
	    (rc = get_uint(p, e, w, "image_size", SNAP_MAX_IMAGE, &r->image_size)) ||
	    (rc = get_hex(p, e, w, "xxh3", &r->xxh3)) ||
	    (rc = get_array(p, e, w, "tensors", ST_MAX_TENSORS, &tensors)) ||
	    (rc = get_array(p, e, w, "chunks", SNAP_MAX_CHUNKS, &chunks)))
		return rc;
	if (strcmp(file, r->file) || rank != (uint64_t)ri)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s is file \"%.32s\" rank %" PRIu64
			       "; expected \"%s\" rank %d", p->path, w, file, rank, r->file, ri);
	if (r->image_size % SNAP_ALIGN)
		return wk_errf(p->err, p->errsz, WK_EFORMAT, "%s: %s.image_size is not a multiple "
			       "of %d", p->path, w, SNAP_ALIGN);
	if (asprintf(&r->path, "%s/%s", s->dir, r->file) < 0) {
		r->path = NULL;
		return wk_errf(p->err, p->errsz, WK_ENOMEM, "%s: out of memory", p->path);
	}
	if ((rc = parse_tensors(p, r, ri, tensors)))
		return rc;
	return parse_chunks(p, s, r, ri, chunks, lz4);
}

/* ---- entry point -------------------------------------------------------------------------- */

int snap__manifest_load(const char *dir, struct snap *s, char *err, size_t errsz)
{
	char path[SNAP_PATH];
	char *text = NULL;
	size_t len;
	json_error_t je;
	json_t *v, *ranks, *files;
	const char *str;
	uint64_t world;
	size_t i;
	int rc;

	if (snprintf(path, sizeof path, "%s/manifest.json", dir) >= (int)sizeof path)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", dir);
	struct mp p = {path, err, errsz};
	s->dir = strdup(dir);
	if (!s->dir)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", dir);
	rc = wk_read_file(path, SNAP_MAX_MANIFEST, &text, &len, err, errsz);
	if (rc == WK_ENOTFOUND)
		return wk_errf(err, errsz, rc, "%s: not a snapshot (no manifest.json)", dir);
	if (rc)
		return rc;
	s->m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!s->m)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)",
			       path, je.text, je.line, je.column);
	if (!json_is_object(s->m))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not a JSON object", path);

	v = json_object_get(s->m, "format");
	if (!json_is_string(v) || strcmp(json_string_value(v), SNAP_FORMAT))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not a wick snapshot manifest (\"format\" "
			       "is not \"%s\")", path, SNAP_FORMAT);
	v = json_object_get(s->m, "version");
	if (!json_is_integer(v))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: \"version\" is missing or not an "
			       "integer", path);
	if (json_integer_value(v) != 1 && json_integer_value(v) != SNAP_VERSION)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: snapshot format version %lld, this "
			       "wick reads versions 1 to %d", path, (long long)json_integer_value(v),
			       SNAP_VERSION);
	s->version = (int)json_integer_value(v);
	uint64_t tp, ep;

	if ((rc = get_str(&p, s->m, "", "created", 64, &str)) ||
	    (rc = get_str(&p, s->m, "", "wick", 256, &str)) ||
	    (rc = get_uint(&p, s->m, "", "world", SNAP_MAX_RANKS, &world)) ||
	    (rc = get_uint(&p, s->m, "", "tp", 1u << 20, &tp)) ||
	    (rc = get_uint(&p, s->m, "", "ep", 1u << 20, &ep)) ||
	    (rc = get_str(&p, s->m, "", "dtype", 32, &str)) ||
	    (rc = get_uint(&p, s->m, "", "chunk_size", SNAP_MAX_CHUNK, &s->chunk_size)) ||
	    (rc = get_str(&p, s->m, "", "compress", 16, &str)))
		return rc;
	if (strcmp(str, "none") && strcmp(str, "lz4"))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: compress is \"%.16s\", expected \"none\" "
			       "or \"lz4\"", path, str);
	bool lz4 = !strcmp(str, "lz4");
	if (world < 1)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: world is 0", path);
	if (s->chunk_size < SNAP_ALIGN || s->chunk_size % SNAP_ALIGN)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: chunk_size %" PRIu64 " is not a positive "
			       "multiple of %d", path, s->chunk_size, SNAP_ALIGN);
	v = json_object_get(s->m, "config");
	if (!json_is_object(v))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: \"config\" is missing or not an object",
			       path);
	v = json_object_get(s->m, "layout");
	if (v && !json_is_object(v) && !json_is_null(v))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: \"layout\" is not an object or null",
			       path);
	if ((rc = get(&p, s->m, "", "source", &v)) || (rc = check_source(&p, v)))
		return rc;
	if ((rc = get_array(&p, s->m, "", "files", 10000, &files)))
		return rc;
	json_array_foreach(files, i, v) {
		char w[32];
		snprintf(w, sizeof w, "files[%zu]", i);
		const char *name = NULL;
		uint64_t size, h;
		if (s->version > 1 && (!json_is_object(v) || (rc = get_str(&p, v, w, "name", 255,
									      &name)) ||
				       (rc = get_uint(&p, v, w, "size", SNAP_MAX_COPY, &size)) ||
				       (rc = get_hex(&p, v, w, "xxh3", &h))))
			return rc ? rc : wk_errf(err, errsz, WK_EFORMAT, "%s: %s is not an object",
						 path, w);
		if (s->version == 1 && json_is_string(v) &&
		    strlen(json_string_value(v)) == json_string_length(v) &&
		    json_string_length(v) <= 255)
			name = json_string_value(v);
		if (!name || !plain_name(name))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: files[%zu] is not a plain file "
				       "name", path, i);
	}
	if ((rc = get_array(&p, s->m, "", "ranks", SNAP_MAX_RANKS, &ranks)))
		return rc;
	if (json_array_size(ranks) != world)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: world is %" PRIu64 " but ranks has %zu "
			       "entries", path, world, json_array_size(ranks));
	s->r = calloc(world, sizeof *s->r);
	if (!s->r)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	s->world = (int)world;
	for (int r = 0; r < s->world; r++)
		s->r[r].fd = s->r[r].fd_direct = -1;
	for (int r = 0; r < s->world; r++)
		if ((rc = parse_rank(&p, s, r, json_array_get(ranks, (size_t)r), lz4)))
			return rc;
	for (int r = 0; s->version > 1 && r < s->world; r++)
		if (snap__meaning_hash(json_object_get(s->m, "config"),
				       json_object_get(s->m, "layout"), world, tp, ep,
				       json_object_get(json_array_get(ranks, (size_t)r), "tensors"),
				       &s->r[r].meaning))
			return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	return WK_OK;
}
