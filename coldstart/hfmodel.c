/*
 * hfmodel.c - open a Hugging Face model directory: config.json plus validated safetensors.
 *
 * Layout chosen like transformers: model.safetensors wins when present, otherwise
 * model.safetensors.index.json lists the shards. Shards are opened in sorted file-name order
 * (model-00001-of-00005... sorts naturally), each once. Tensors found in a shard but not
 * named by the index are kept (harmless); a name present in two shards is an error.
 *
 * Internals: `all` holds every tensor in shard order, then offset order within a shard
 * (the order a cold start reads the files in); `by_name` is the same pointers sorted by
 * name for hf_tensor() (binary search).
 */
#include "coldstart/hfmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/wk.h"

#define HF_PATH 4096

struct hf_model {
	char *dir;
	json_t *config;
	size_t nshards;
	struct st_file **shards;
	size_t n;
	const struct st_tensor **all;
	const struct st_tensor **by_name;
};


static int join(char *out, const char *dir, const char *name, char *err, size_t errsz)
{
	if (snprintf(out, HF_PATH, "%s/%s", dir, name) >= HF_PATH)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", dir);
	return WK_OK;
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* Loads a JSON object file of at most max bytes. */
static int load_object(const char *path, size_t max, json_t **out, char *err, size_t errsz)
{
	char *buf = NULL;
	size_t len;
	int rc = wk_read_file(path, max, &buf, &len, err, errsz);
	if (rc)
		return rc;
	json_error_t je;
	/* Jansson caps nesting at 2048 levels; files here are bounded by max, so that is
	 * enough stack safety. */
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	if (!j)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)",
			       path, je.text, je.line, je.column);
	if (!json_is_object(j)) {
		json_decref(j);
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not a JSON object", path);
	}
	*out = j;
	return WK_OK;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

struct named {
	const struct st_tensor *t;
	size_t shard;
};

static int cmp_named(const void *a, const void *b)
{
	const struct named *x = a, *y = b;
	int c = strcmp(x->t->name, y->t->name);
	if (c)
		return c;
	return x->shard < y->shard ? -1 : x->shard > y->shard;
}

static int valid_shard_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n <= 255 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* Opens the shards listed by the index (sorted, distinct) and checks every entry. */
static int open_index(struct hf_model *m, const char *ipath, char *err, size_t errsz)
{
	char nb[ST_SHOWN], sb[ST_SHOWN], path[HF_PATH];
	json_t *idx = NULL;
	const char **names = NULL;
	int rc = load_object(ipath, HF_MAX_INDEX, &idx, err, errsz);
	if (rc)
		return rc;
	json_t *wm = json_object_get(idx, "weight_map");
	if (!json_is_object(wm)) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: no \"weight_map\" object", ipath);
		goto fail;
	}
	size_t nw = json_object_size(wm);
	if (nw == 0) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: weight_map is empty", ipath);
		goto fail;
	}
	names = calloc(nw, sizeof *names);
	if (!names) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", ipath);
		goto fail;
	}
	const char *key;
	json_t *v;
	size_t k = 0;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !valid_shard_name(json_string_value(v))) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "%s: weight_map['%s'] is not a plain "
				     "file name in the model directory", ipath, st_shown(key, nb));
			goto fail;
		}
		names[k++] = json_string_value(v);
	}
	qsort(names, nw, sizeof *names, cmp_str);
	size_t nd = 0;
	for (size_t i = 0; i < nw; i++)
		if (i == 0 || strcmp(names[i], names[nd - 1]))
			names[nd++] = names[i];
	if (nd > HF_MAX_SHARDS) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: %zu shards, over the limit of %d", ipath,
			     nd, HF_MAX_SHARDS);
		goto fail;
	}
	m->shards = calloc(nd, sizeof *m->shards);
	if (!m->shards) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", ipath);
		goto fail;
	}
	for (size_t i = 0; i < nd; i++) {
		if ((rc = join(path, m->dir, names[i], err, errsz)))
			goto fail;
		if (!exists(path)) {
			rc = wk_errf(err, errsz, WK_ENOTFOUND, "%s: shard '%s' named by the index is "
				     "missing", path, st_shown(names[i], sb));
			goto fail;
		}
		if ((rc = st_open(path, &m->shards[i], err, errsz)))
			goto fail;
		m->nshards++;
	}
	json_object_foreach(wm, key, v) {
		const char *s = json_string_value(v);
		const char **hit = bsearch(&s, names, nd, sizeof *names, cmp_str);
		size_t si = (size_t)(hit - names);
		if (!st_find(m->shards[si], key)) {
			rc = wk_errf(err, errsz, WK_ENOTFOUND, "%s: tensor '%s' is mapped to '%s', "
				     "which has no such tensor", ipath, st_shown(key, nb), st_shown(s, sb));
			goto fail;
		}
	}
	rc = WK_OK;
fail:
	free(names);
	json_decref(idx);
	return rc;
}

int hf_open(const char *dir, struct hf_model **out, char *err, size_t errsz)
{
	char path[HF_PATH], ipath[HF_PATH], nb[ST_SHOWN];
	struct named *nm = NULL;
	struct hf_model *m = NULL;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof *m);
	if (!m || !(m->dir = strdup(dir))) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", dir);
		goto fail;
	}
	for (size_t k = strlen(m->dir); k > 1 && m->dir[k - 1] == '/'; k--)
		m->dir[k - 1] = 0; /* "dir/" names files as "dir/config.json", not "dir//..." */
	dir = m->dir;
	if ((rc = join(path, dir, "config.json", err, errsz)))
		goto fail;
	if ((rc = load_object(path, HF_MAX_CONFIG, &m->config, err, errsz)))
		goto fail;

	if ((rc = join(path, dir, "model.safetensors", err, errsz)) ||
	    (rc = join(ipath, dir, "model.safetensors.index.json", err, errsz)))
		goto fail;
	if (exists(path)) {
		if (!(m->shards = calloc(1, sizeof *m->shards))) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", dir);
			goto fail;
		}
		if ((rc = st_open(path, &m->shards[0], err, errsz)))
			goto fail;
		m->nshards = 1;
	} else if (exists(ipath)) {
		if ((rc = open_index(m, ipath, err, errsz)))
			goto fail;
	} else {
		rc = wk_errf(err, errsz, WK_ENOTFOUND, "%s: no weights: neither model.safetensors "
			     "nor model.safetensors.index.json exists", dir);
		goto fail;
	}

	size_t n = 0;
	for (size_t i = 0; i < m->nshards; i++)
		n += st_count(m->shards[i]); /* each <= ST_MAX_TENSORS, shards <= HF_MAX_SHARDS */
	m->all = calloc(n ? n : 1, sizeof *m->all);
	m->by_name = calloc(n ? n : 1, sizeof *m->by_name);
	nm = calloc(n ? n : 1, sizeof *nm);
	if (!m->all || !m->by_name || !nm) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory for %zu tensors", dir, n);
		goto fail;
	}
	for (size_t i = 0; i < m->nshards; i++)
		for (size_t j = 0; j < st_count(m->shards[i]); j++) {
			nm[m->n].t = m->all[m->n] = st_at(m->shards[i], j);
			nm[m->n].shard = i;
			m->n++;
		}
	qsort(nm, n, sizeof *nm, cmp_named);
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && !strcmp(nm[i].t->name, nm[i - 1].t->name)) {
			rc = wk_errf(err, errsz, WK_EFORMAT, "%s: tensor '%s' appears in both %s and "
				     "%s", dir, st_shown(nm[i].t->name, nb),
				     st_path(m->shards[nm[i - 1].shard]),
				     st_path(m->shards[nm[i].shard]));
			goto fail;
		}
		m->by_name[i] = nm[i].t;
	}
	free(nm);
	*out = m;
	return WK_OK;
fail:
	free(nm);
	hf_close(m);
	return rc;
}

void hf_close(struct hf_model *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nshards; i++)
		st_close(m->shards[i]);
	free(m->shards);
	free(m->all);
	free(m->by_name);
	json_decref(m->config);
	free(m->dir);
	free(m);
}

const char *hf_dir(const struct hf_model *m)
{
	return m->dir;
}

json_t *hf_config(const struct hf_model *m)
{
	return m->config;
}

size_t hf_tensor_count(const struct hf_model *m)
{
	return m->n;
}

const struct st_tensor *hf_tensor_at(const struct hf_model *m, size_t i)
{
	return i < m->n ? m->all[i] : NULL;
}

const struct st_tensor *hf_tensor(const struct hf_model *m, const char *name)
{
	return st_bsearch(m->by_name, m->n, name);
}

const struct st_tensor *hf_tensor_sorted(const struct hf_model *m, size_t i)
{
	return i < m->n ? m->by_name[i] : NULL;
}

const struct st_tensor *hf_tensor_find(const struct hf_model *m, const char *name, size_t *ix)
{
	long i = st_bsearch_ix(m->by_name, m->n, name);
	if (i < 0)
		return NULL;
	*ix = (size_t)i;
	return m->by_name[i];
}

size_t hf_shard_count(const struct hf_model *m)
{
	return m->nshards;
}

const struct st_file *hf_shard(const struct hf_model *m, size_t i)
{
	return i < m->nshards ? m->shards[i] : NULL;
}
