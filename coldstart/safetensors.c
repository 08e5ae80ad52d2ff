/*
 * safetensors.c - parse (validate fully, then point into the buffer) and write safetensors.
 *
 * Parsing order matters: nothing is dereferenced past byte 8 until the header length has been
 * checked against the buffer, and no tensor pointer is formed until its dtype, shape, byte
 * count and offsets have all been checked. Overlap is checked after sorting by offset.
 *
 * Internals: tensors live in one array in offset order (st_at); a second array of pointers is
 * sorted by name for st_find (binary search, O(log n)). Names and metadata strings are copied
 * into one pool so that the jansson tree can be freed right after parsing.
 */
#include "coldstart/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/wk.h"

/* Nesting depth of the header JSON. A valid header needs 3 (root, tensor entry, shape); the
 * cap only stops a hostile header from driving the parser's recursion deep. */
#define ST_MAX_DEPTH 16
#define ST_WBUF (8u << 20)

struct st_meta_kv {
	const char *key, *val;
};

struct st_file {
	char *label;                    /* path or caller's label */
	const unsigned char *base;      /* whole image */
	size_t len;
	void *map;                      /* non-NULL when st_open mapped the file */
	size_t n;
	struct st_tensor *t;            /* offset order */
	const struct st_tensor **by_name;
	size_t nmeta;
	struct st_meta_kv *meta;
	char *pool;                     /* names and metadata strings */
};

/* ---- helpers ------------------------------------------------------------------------------ */

const char *st_shown(const char *s, char buf[static ST_SHOWN])
{
	size_t i = 0;
	for (; s[i] && i < ST_SHOWN - 4; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	if (s[i]) {
		memcpy(buf + i, "...", 3);
		i += 3;
	}
	buf[i] = 0;
	return buf;
}

static uint64_t le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* Max nesting depth of JSON text, ignoring brackets inside strings. Malformed text is fine:
 * the parser rejects it afterwards; this only bounds recursion before the parser runs. */
static int json_depth(const char *s, size_t n)
{
	int depth = 0, max = 0, in_str = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = 0;
		} else if (c == '"') {
			in_str = 1;
		} else if (c == '{' || c == '[') {
			if (++depth > max)
				max = depth;
			if (max > ST_MAX_DEPTH)
				return max;
		} else if (c == '}' || c == ']') {
			depth--;
		}
	}
	return max;
}

/* Safetensors dtypes wick does not implement: reported as unsupported rather than malformed. */
static int is_other_st_dtype(const char *s)
{
	static const char *const other[] = {"F64", "I64", "I32", "I16", "I8", "U64", "U32",
					    "U16", "U8", "BOOL", "F8_E8M0", "F6_E2M3",
					    "F6_E3M2", "F4", "C64"};
	for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
		if (!strcmp(s, other[i]))
			return 1;
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b)
{
	const struct st_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

/* Reads a non-negative JSON integer. Returns 0, or -1 when v is not one. */
static int get_uint(const json_t *v, int64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (int64_t)json_integer_value(v);
	return 0;
}

static char *pool_put(char **p, const char *s)
{
	size_t n = strlen(s) + 1;
	char *r = *p;
	memcpy(r, s, n);
	*p += n;
	return r;
}

/* Validates one tensor entry and fills *t (except name and data). data_len is the size of the
 * data area, hdr_end the absolute offset where it starts. */
static int parse_entry(const char *label, const char *name, json_t *e, uint64_t data_len,
		       uint64_t hdr_end, struct st_tensor *t, char *err, size_t errsz)
{
	char nb[ST_SHOWN], kb[ST_SHOWN];
	const char *key;
	json_t *v, *dtype = NULL, *shape = NULL, *offs = NULL;

	if (!json_is_object(e))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': entry is not a JSON object",
			       label, st_shown(name, nb));
	json_object_foreach(e, key, v) {
		if (!strcmp(key, "dtype"))
			dtype = v;
		else if (!strcmp(key, "shape"))
			shape = v;
		else if (!strcmp(key, "data_offsets"))
			offs = v;
		else
			return wk_errf(err, errsz, WK_EFORMAT,
				       "%s: tensor '%s': unknown key '%s' (expected dtype, shape, "
				       "data_offsets)", label, st_shown(name, nb), st_shown(key, kb));
	}
	if (!dtype || !shape || !offs)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': missing '%s'", label,
			       st_shown(name, nb), !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

	if (!json_is_string(dtype))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': dtype is not a string",
			       label, st_shown(name, nb));
	const char *dn = json_string_value(dtype);
	t->dtype = dt_from_name(dn);
	if (t->dtype == DT_INVALID) {
		if (is_other_st_dtype(dn))
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "%s: tensor '%s': dtype %s is not supported by wick (it reads "
				       "F32, BF16, F16, F8_E4M3, F8_E5M2)", label, st_shown(name, nb), dn);
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", label,
			       st_shown(name, nb), st_shown(dn, kb));
	}

	if (!json_is_array(shape))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': shape is not an array",
			       label, st_shown(name, nb));
	size_t rank = json_array_size(shape);
	if (rank > ST_MAX_RANK)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: tensor '%s': rank %zu is over the limit "
			       "of %d", label, st_shown(name, nb), rank, ST_MAX_RANK);
	t->rank = (int)rank;
	t->numel = 1;
	int overflow = 0;
	for (size_t i = 0; i < rank; i++) {
		int64_t d;
		if (get_uint(json_array_get(shape, i), &d))
			return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': shape[%zu] is not a "
				       "non-negative integer", label, st_shown(name, nb), i);
		t->shape[i] = d;
		if (d != 0 && t->numel > INT64_MAX / d)
			overflow = 1; /* keep going: a later 0 dim makes the product 0 */
		else
			t->numel *= d;
	}
	for (size_t i = rank; i < ST_MAX_RANK; i++)
		t->shape[i] = 0;
	if (overflow) {
		for (size_t i = 0; i < rank; i++)
			if (t->shape[i] == 0)
				overflow = 0;
		if (overflow)
			return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': shape's element "
				       "count overflows 64 bits", label, st_shown(name, nb));
		t->numel = 0;
	}
	uint64_t esz = dt_size(t->dtype);
	if ((uint64_t)t->numel > UINT64_MAX / esz)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': byte size of shape "
			       "overflows 64 bits", label, st_shown(name, nb));
	uint64_t need = (uint64_t)t->numel * esz;

	int64_t b, en;
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    get_uint(json_array_get(offs, 0), &b) || get_uint(json_array_get(offs, 1), &en))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': data_offsets is not "
			       "[begin, end] with non-negative integers", label, st_shown(name, nb));
	if (b > en)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] "
			       "has begin > end", label, st_shown(name, nb), (long long)b, (long long)en);
	if ((uint64_t)en > data_len)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] "
			       "run past the end of the %llu-byte data area", label, st_shown(name, nb),
			       (long long)b, (long long)en, (unsigned long long)data_len);
	if ((uint64_t)(en - b) != need) {
		char sb[8 * 24 + 4];
		size_t o = 0;
		sb[o++] = '[';
		for (size_t i = 0; i < rank; i++)
			o += (size_t)snprintf(sb + o, sizeof sb - o, "%s%lld", i ? ", " : "",
					      (long long)t->shape[i]);
		snprintf(sb + o, sizeof sb - o, "]");
		return wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] "
			       "hold %lld bytes but shape %s of %s needs %llu", label,
			       st_shown(name, nb), (long long)b, (long long)en, (long long)(en - b), sb,
			       dt_name(t->dtype), (unsigned long long)need);
	}
	t->offset = hdr_end + (uint64_t)b;
	t->nbytes = need;
	return WK_OK;
}

/* ---- reading ------------------------------------------------------------------------------ */

int st_parse(const void *buf, size_t len, const char *label, struct st_file **out, char *err,
	     size_t errsz)
{
	char nb[ST_SHOWN], nb2[ST_SHOWN];
	json_t *root = NULL;
	struct st_file *f = NULL;
	int rc;

	*out = NULL;
	if (!label)
		label = "safetensors";
	if (!buf && len)
		return wk_errf(err, errsz, WK_EINVAL, "%s: NULL buffer", label);
	if (len < 8)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: file is %zu bytes, too short to hold the "
			       "8-byte header length", label, len);
	const unsigned char *base = buf;
	uint64_t hlen = le64(base);
	if (hlen > ST_MAX_HEADER)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: header length %llu is over the limit of "
			       "%u bytes (not a safetensors file?)", label, (unsigned long long)hlen,
			       ST_MAX_HEADER);
	if (hlen > len - 8)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: header length %llu runs past the end of "
			       "the %zu-byte file (truncated?)", label, (unsigned long long)hlen, len);
	const char *hdr = (const char *)base + 8;
	size_t i0 = 0;
	while (i0 < hlen && (hdr[i0] == ' ' || hdr[i0] == '\t' || hdr[i0] == '\n' || hdr[i0] == '\r'))
		i0++;
	if (i0 == hlen || hdr[i0] != '{')
		return wk_errf(err, errsz, WK_EFORMAT, "%s: header does not start with '{' (not a "
			       "safetensors file?)", label);
	if (json_depth(hdr, hlen) > ST_MAX_DEPTH)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: header JSON nests deeper than %d levels",
			       label, ST_MAX_DEPTH);
	json_error_t je;
	root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: header is not valid JSON: %s (line %d, "
			       "column %d)", label, je.text, je.line, je.column);
	if (!json_is_object(root)) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: header is not a JSON object", label);
		goto fail;
	}

	/* Pass 1: limits, metadata shape, pool size. */
	json_t *meta = json_object_get(root, "__metadata__");
	size_t n = json_object_size(root) - (meta ? 1 : 0);
	if (n > ST_MAX_TENSORS) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: %zu tensors, over the limit of %d", label, n,
			     ST_MAX_TENSORS);
		goto fail;
	}
	size_t pool = 1;
	const char *key;
	json_t *v;
	if (meta) {
		if (!json_is_object(meta)) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "%s: __metadata__ is not a JSON object",
				     label);
			goto fail;
		}
		json_object_foreach(meta, key, v) {
			if (!json_is_string(v)) {
				rc = wk_errf(err, errsz, WK_EFORMAT, "%s: __metadata__ value of '%s' is "
					     "not a string", label, st_shown(key, nb));
				goto fail;
			}
			pool += strlen(key) + 1 + json_string_length(v) + 1;
		}
	}
	json_object_foreach(root, key, v) {
		if (v == meta)
			continue;
		size_t kl = strlen(key);
		if (kl == 0) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "%s: tensor with an empty name", label);
			goto fail;
		}
		if (kl > ST_MAX_NAME) {
			rc = wk_errf(err, errsz, WK_ELIMIT, "%s: tensor '%s': name is %zu bytes, over "
				     "the limit of %d", label, st_shown(key, nb), kl, ST_MAX_NAME);
			goto fail;
		}
		pool += kl + 1;
	}

	f = calloc(1, sizeof *f);
	if (!f || !(f->label = strdup(label)) || !(f->pool = malloc(pool)) ||
	    !(f->t = calloc(n ? n : 1, sizeof *f->t)) ||
	    !(f->by_name = calloc(n ? n : 1, sizeof *f->by_name)) ||
	    !(f->meta = calloc(meta ? json_object_size(meta) + 1 : 1, sizeof *f->meta))) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory for %zu tensors", label, n);
		goto fail;
	}
	f->base = base;
	f->len = len;

	/* Pass 2: metadata, then each tensor entry. */
	char *pp = f->pool;
	if (meta) {
		json_object_foreach(meta, key, v) {
			if (strlen(json_string_value(v)) != json_string_length(v)) {
				rc = wk_errf(err, errsz, WK_EFORMAT, "%s: __metadata__ value of '%s' "
					     "contains a NUL", label, st_shown(key, nb));
				goto fail;
			}
			f->meta[f->nmeta].key = pool_put(&pp, key);
			f->meta[f->nmeta].val = pool_put(&pp, json_string_value(v));
			f->nmeta++;
		}
	}
	uint64_t hdr_end = 8 + hlen, data_len = len - hdr_end;
	json_object_foreach(root, key, v) {
		if (v == meta)
			continue;
		struct st_tensor *t = &f->t[f->n];
		rc = parse_entry(label, key, v, data_len, hdr_end, t, err, errsz);
		if (rc)
			goto fail;
		t->name = pool_put(&pp, key);
		f->n++;
	}
	json_decref(root);
	root = NULL;

	qsort(f->t, f->n, sizeof *f->t, cmp_offset);
	for (size_t i = 0; i < f->n; i++) {
		struct st_tensor *t = &f->t[i];
		if (i > 0) {
			const struct st_tensor *p = &f->t[i - 1];
			if (t->offset < p->offset + p->nbytes) {
				rc = wk_errf(err, errsz, WK_EFORMAT, "%s: tensors '%s' [%llu, %llu] and "
					     "'%s' [%llu, %llu] overlap", label, st_shown(p->name, nb),
					     (unsigned long long)(p->offset - hdr_end),
					     (unsigned long long)(p->offset - hdr_end + p->nbytes),
					     st_shown(t->name, nb2),
					     (unsigned long long)(t->offset - hdr_end),
					     (unsigned long long)(t->offset - hdr_end + t->nbytes));
				goto fail;
			}
		}
		/* offset + nbytes <= len was established in parse_entry. */
		t->data = base + t->offset;
		f->by_name[i] = t;
	}
	qsort(f->by_name, f->n, sizeof *f->by_name, cmp_name);
	*out = f;
	return WK_OK;
fail:
	json_decref(root);
	st_close(f);
	return rc;
}

int st_open(const char *path, struct st_file **out, char *err, size_t errsz)
{
	int fd = -1, rc;
	void *map = NULL;
	size_t len = 0;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s", path,
			       strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: fstat: %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: not a regular file", path);
		goto fail;
	}
	if (st.st_size < 8) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: file is %lld bytes, too short to hold the "
			     "8-byte header length", path, (long long)st.st_size);
		goto fail;
	}
	if ((uintmax_t)st.st_size > SIZE_MAX) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: too large to map", path);
		goto fail;
	}
	len = (size_t)st.st_size;
	map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		map = NULL;
		rc = wk_errf(err, errsz, WK_EIO, "%s: mmap of %zu bytes: %s", path, len,
			     strerror(errno));
		goto fail;
	}
	close(fd);
	fd = -1;
	rc = st_parse(map, len, path, out, err, errsz);
	if (rc)
		goto fail;
	(*out)->map = map;
	return WK_OK;
fail:
	if (map)
		munmap(map, len);
	if (fd >= 0)
		close(fd);
	return rc;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->len);
	free(f->label);
	free(f->pool);
	free(f->t);
	free(f->by_name);
	free(f->meta);
	free(f);
}

const char *st_path(const struct st_file *f)
{
	return f->label;
}

size_t st_count(const struct st_file *f)
{
	return f->n;
}

const struct st_tensor *st_at(const struct st_file *f, size_t i)
{
	return i < f->n ? &f->t[i] : NULL;
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
	return st_bsearch((const struct st_tensor *const *)f->by_name, f->n, name);
}

long st_bsearch_ix(const struct st_tensor *const *sorted, size_t n, const char *name)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, sorted[mid]->name);
		if (c == 0)
			return (long)mid;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

const struct st_tensor *st_bsearch(const struct st_tensor *const *sorted, size_t n,
				   const char *name)
{
	long i = st_bsearch_ix(sorted, n, name);
	return i < 0 ? NULL : sorted[i];
}

int st_advise(const struct st_file *f, int advice)
{
	return f->map ? madvise(f->map, f->len, advice) : 0;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	for (size_t i = 0; i < f->nmeta; i++)
		if (!strcmp(f->meta[i].key, key))
			return f->meta[i].val;
	return NULL;
}

/* ---- writing ------------------------------------------------------------------------------ */

struct wbuf {
	int fd;
	char *buf;
	size_t used;
};

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		size_t chunk = n < (1u << 30) ? n : (1u << 30);
		ssize_t w = write(fd, c, chunk);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int wb_flush(struct wbuf *w)
{
	int r = write_all(w->fd, w->buf, w->used);
	w->used = 0;
	return r;
}

/* Small pieces are gathered into 8 MiB writes; big tensors go straight from the caller. */
static int wb_put(struct wbuf *w, const void *p, size_t n)
{
	if (w->used + n <= ST_WBUF) {
		memcpy(w->buf + w->used, p, n);
		w->used += n;
		return 0;
	}
	if (wb_flush(w))
		return -1;
	if (n >= ST_WBUF / 2)
		return write_all(w->fd, p, n);
	memcpy(w->buf, p, n);
	w->used = n;
	return 0;
}

/* Builds the header JSON (no padding). On success *hdr is malloc'd (caller frees). */
static int build_header(const char *path, const struct st_out *t, size_t n,
			const char *meta_json, char **hdr, char *err, size_t errsz)
{
	char nb[ST_SHOWN];
	int rc;
	json_t *root = json_object(), *meta = NULL;
	if (!root)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	if (meta_json) {
		json_error_t je;
		meta = json_loads(meta_json, JSON_REJECT_DUPLICATES, &je);
		if (!meta || !json_is_object(meta)) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: metadata is not a JSON object: %s",
				     path, meta ? "wrong type" : je.text);
			goto fail;
		}
		const char *k;
		json_t *v;
		json_object_foreach(meta, k, v) {
			if (!json_is_string(v)) {
				rc = wk_errf(err, errsz, WK_EINVAL, "%s: metadata value of '%s' is "
					     "not a string", path, st_shown(k, nb));
				goto fail;
			}
		}
		if (json_object_set(root, "__metadata__", meta)) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
			goto fail;
		}
	}
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		const struct st_out *o = &t[i];
		if (!o->name || !o->name[0] || strlen(o->name) > ST_MAX_NAME ||
		    !strcmp(o->name, "__metadata__")) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor %zu: name is empty, reserved "
				     "or longer than %d bytes", path, i, ST_MAX_NAME);
			goto fail;
		}
		if (dt_size(o->dtype) == 0 || o->rank < 0 || o->rank > ST_MAX_RANK) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s': bad dtype or rank %d",
				     path, st_shown(o->name, nb), o->rank);
			goto fail;
		}
		uint64_t numel = 1;
		int zero = 0, over = 0;
		for (int d = 0; d < o->rank; d++) {
			if (o->shape[d] < 0) {
				rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s': negative dim",
					     path, st_shown(o->name, nb));
				goto fail;
			}
			if (o->shape[d] == 0)
				zero = 1;
			else if (numel > (uint64_t)INT64_MAX / (uint64_t)o->shape[d])
				over = 1;
			else
				numel *= (uint64_t)o->shape[d];
		}
		if (zero)
			numel = 0;
		uint64_t esz = dt_size(o->dtype);
		if ((over && !zero) || numel > (UINT64_MAX - off) / esz ||
		    numel * esz > (uint64_t)INT64_MAX - off) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s': size overflows", path,
				     st_shown(o->name, nb));
			goto fail;
		}
		if (numel && !o->data) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s': NULL data", path,
				     st_shown(o->name, nb));
			goto fail;
		}
		uint64_t end = off + numel * esz;
		if (json_object_get(root, o->name)) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s' appears twice", path,
				     st_shown(o->name, nb));
			goto fail;
		}
		json_t *e = json_object(), *sh = json_array(), *of = json_array();
		int bad = !e || !sh || !of;
		for (int d = 0; !bad && d < o->rank; d++)
			bad = json_array_append_new(sh, json_integer(o->shape[d]));
		bad = bad || json_array_append_new(of, json_integer((json_int_t)off)) ||
		      json_array_append_new(of, json_integer((json_int_t)end)) ||
		      json_object_set_new(e, "dtype", json_string(dt_name(o->dtype)));
		if (!bad) {
			bad = json_object_set_new(e, "shape", sh) |
			      json_object_set_new(e, "data_offsets", of);
			sh = of = NULL;
		}
		json_decref(sh);
		json_decref(of);
		if (bad) {
			json_decref(e);
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
			goto fail;
		}
		/* set_new fails on a name that is not valid UTF-8 (and frees e). */
		if (json_object_set_new(root, o->name, e)) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: tensor '%s': name is not valid "
				     "UTF-8", path, st_shown(o->name, nb));
			goto fail;
		}
		off = end;
	}
	/* Jansson keeps insertion order, so the keys come out in the caller's order. */
	*hdr = json_dumps(root, JSON_COMPACT);
	if (!*hdr) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	rc = WK_OK;
fail:
	json_decref(meta);
	json_decref(root);
	return rc;
}

int st_write(const char *path, const struct st_out *t, size_t n, const char *meta_json,
	     char *err, size_t errsz)
{
	char tmp[4096];
	char *hdr = NULL;
	struct wbuf w = {.fd = -1};
	int rc, created = 0;

	if (!path || (n && !t))
		return wk_errf(err, errsz, WK_EINVAL, "st_write: NULL path or tensors");
	if (n > ST_MAX_TENSORS)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: %zu tensors, over the limit of %d", path,
			       n, ST_MAX_TENSORS);
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", path);
	rc = build_header(path, t, n, meta_json, &hdr, err, errsz);
	if (rc)
		return rc;
	size_t hl = strlen(hdr);
	size_t padded = (hl + 7) & ~(size_t)7; /* data area starts 8-aligned, as HF writes it */
	if (padded > ST_MAX_HEADER) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: header would be %zu bytes, over the limit "
			     "of %u", path, padded, ST_MAX_HEADER);
		goto fail;
	}
	if (!(w.buf = malloc(ST_WBUF))) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w.fd < 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	created = 1;
	unsigned char lenb[8];
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	int bad = wb_put(&w, lenb, 8) || wb_put(&w, hdr, hl);
	for (size_t i = hl; !bad && i < padded; i++)
		bad = wb_put(&w, " ", 1);
	for (size_t i = 0; !bad && i < n; i++) {
		size_t nb = dt_size(t[i].dtype);
		for (int d = 0; d < t[i].rank; d++)
			nb *= (size_t)t[i].shape[d]; /* checked in build_header */
		if (nb)
			bad = wb_put(&w, t[i].data, nb);
	}
	if (bad || wb_flush(&w)) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: write failed: %s", tmp, strerror(errno));
		goto fail;
	}
	if (fsync(w.fd) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: fsync: %s", tmp, strerror(errno));
		goto fail;
	}
	int fd = w.fd;
	w.fd = -1;
	if (close(fd) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: close: %s", tmp, strerror(errno));
		goto fail;
	}
	if (rename(tmp, path) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: rename: %s", path, strerror(errno));
		goto fail;
	}
	free(w.buf);
	free(hdr);
	return WK_OK;
fail:
	if (w.fd >= 0)
		close(w.fd);
	if (created)
		unlink(tmp);
	free(w.buf);
	free(hdr);
	return rc;
}
