/*
 * snapshot_source.c - the identity of the checkpoint a snapshot was made from, and the check
 * that a source directory still matches it.
 *
 * Hashing a 700 GB checkpoint would take minutes, so the identity is a sample (see the format
 * notes in snapshot.h): per file, xxh3 over size, mtime and the first and last 1 MiB. Files
 * are followed through symlinks, since Hugging Face cache directories link to blobs.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "coldstart/snapshot_int.h"
#include "common/wk.h"

#define SAMPLE (1u << 20)

/* *.json and *.safetensors, with names JSON can hold (UTF-8). */
static bool wanted(const char *name)
{
	size_t l = strlen(name);
	if (!((l > 5 && !strcmp(name + l - 5, ".json")) ||
	      (l > 12 && !strcmp(name + l - 12, ".safetensors"))))
		return false;
	json_t *j = json_string(name);
	json_decref(j);
	return j != NULL;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_at(int fd, unsigned char *buf, size_t n, uint64_t off)
{
	while (n) {
		ssize_t r = pread(fd, buf, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		buf += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* The sampled hash of one file (see snapshot.h); fills *size and *mtime_ns too. */
static int sample_file(const char *path, unsigned char *buf, uint64_t *size, int64_t *mtime_ns,
		       uint64_t *hash, char *err, size_t errsz)
{
	struct stat st;
	unsigned char b[8];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		close(fd);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", path, strerror(errno));
	}
	*size = (uint64_t)st.st_size;
	*mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	XXH3_state_t *hs = XXH3_createState();
	if (!hs) {
		close(fd);
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	}
	XXH3_64bits_reset(hs);
	wk_put64(b, *size);
	XXH3_64bits_update(hs, b, 8);
	wk_put64(b, (uint64_t)*mtime_ns);
	XXH3_64bits_update(hs, b, 8);
	uint64_t head = *size < SAMPLE ? *size : SAMPLE;
	uint64_t tail = *size - head < SAMPLE ? *size - head : SAMPLE;
	int rc = WK_OK;
	if (read_at(fd, buf, head, 0))
		rc = wk_errf(err, errsz, WK_EIO, "%s: read failed", path);
	XXH3_64bits_update(hs, buf, head);
	if (!rc && tail && read_at(fd, buf, tail, *size - tail))
		rc = wk_errf(err, errsz, WK_EIO, "%s: read failed", path);
	XXH3_64bits_update(hs, buf, tail);
	close(fd);
	*hash = XXH3_64bits_digest(hs);
	XXH3_freeState(hs);
	return rc;
}

int snap__source_identity(const char *src_dir, json_t **out, char *err, size_t errsz)
{
	char **names = NULL, path[SNAP_PATH], hex[17];
	size_t n = 0, cap = 0;
	unsigned char *buf = NULL;
	json_t *root = NULL, *files = NULL;
	XXH3_state_t *all = NULL;
	DIR *d = NULL;
	int rc;

	*out = NULL;
	d = opendir(src_dir);
	if (!d)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s",
			       src_dir, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		struct stat st;
		if (!wanted(e->d_name) ||
		    snprintf(path, sizeof path, "%s/%s", src_dir, e->d_name) >= (int)sizeof path ||
		    stat(path, &st) || !S_ISREG(st.st_mode))
			continue;
		if (n == SNAP_MAX_SOURCE_FILES) {
			rc = wk_errf(err, errsz, WK_ELIMIT, "%s: more than %d source files", src_dir,
				     SNAP_MAX_SOURCE_FILES);
			goto fail;
		}
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 64;
			char **nn = realloc(names, nc * sizeof *nn);
			if (!nn) {
				rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", src_dir);
				goto fail;
			}
			names = nn;
			cap = nc;
		}
		if (!(names[n] = strdup(e->d_name))) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", src_dir);
			goto fail;
		}
		n++;
	}
	if (n)
		qsort(names, n, sizeof *names, cmp_str);

	buf = malloc(SAMPLE);
	root = json_object();
	files = json_array();
	all = XXH3_createState();
	if (!buf || !root || !files || !all) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", src_dir);
		goto fail;
	}
	XXH3_64bits_reset(all);
	for (size_t i = 0; i < n; i++) {
		uint64_t size = 0, h = 0;
		int64_t mt = 0;
		unsigned char b[8];
		snprintf(path, sizeof path, "%s/%s", src_dir, names[i]);
		if ((rc = sample_file(path, buf, &size, &mt, &h, err, errsz)))
			goto fail;
		XXH3_64bits_update(all, names[i], strlen(names[i]) + 1);
		wk_put64(b, h);
		XXH3_64bits_update(all, b, 8);
		snap__hex(h, hex);
		json_t *f = json_pack("{ss sI sI ss}", "name", names[i], "size", (json_int_t)size,
				      "mtime_ns", (json_int_t)mt, "xxh3", hex);
		if (!f || json_array_append_new(files, f)) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", src_dir);
			goto fail;
		}
	}
	snap__hex(XXH3_64bits_digest(all), hex);
	char *abs = realpath(src_dir, NULL); /* recorded absolute, for a reader elsewhere */
	int bad_dir = json_object_set_new(root, "dir", json_string(abs ? abs : src_dir));
	free(abs);
	if (bad_dir ||
	    json_object_set_new(root, "hash", json_string("xxh3(size,mtime_ns,head,tail)")) ||
	    json_object_set(root, "files", files) ||
	    json_object_set_new(root, "xxh3", json_string(hex))) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", src_dir);
		goto fail;
	}
	*out = root;
	root = NULL;
	rc = WK_OK;
fail:
	if (d)
		closedir(d);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(buf);
	XXH3_freeState(all);
	json_decref(files);
	json_decref(root);
	return rc;
}

int snap_source_hash(const char *src_dir, uint64_t *out, char *err, size_t errsz)
{
	json_t *id = NULL;
	int rc = snap__source_identity(src_dir, &id, err, errsz);
	if (rc != WK_OK)
		return rc;
	const char *hex = json_string_value(json_object_get(id, "xxh3"));
	char *end = NULL;
	*out = hex ? strtoull(hex, &end, 16) : 0;
	rc = hex && end && !*end ? WK_OK
				 : wk_errf(err, errsz, WK_EFORMAT, "%s: no source hash", src_dir);
	json_decref(id);
	return rc;
}

static const char *fstr(json_t *f, const char *k)
{
	json_t *v = json_object_get(f, k);
	return json_is_string(v) ? json_string_value(v) : "";
}

static json_int_t fint(json_t *f, const char *k)
{
	return json_integer_value(json_object_get(f, k));
}

int snap_source_check(const struct snap *s, const char *src_dir, char *err, size_t errsz)
{
	json_t *rec = json_object_get(s->m, "source"), *cur = NULL;
	int rc;
	if (!json_is_object(rec))
		return wk_errf(err, errsz, WK_ENOTFOUND, "%s: the snapshot recorded no source "
			       "checkpoint", s->dir);
	if ((rc = snap__source_identity(src_dir, &cur, err, errsz)))
		return rc;
	/* Both lists are sorted by name (the manifest's was validated for types only). */
	json_t *a = json_object_get(rec, "files"), *b = json_object_get(cur, "files");
	size_t i = 0, j = 0, na = json_array_size(a), nb = json_array_size(b);
	char n1[ST_SHOWN];
	rc = WK_OK;
	while (!rc && (i < na || j < nb)) {
		json_t *fa = json_array_get(a, i), *fb = json_array_get(b, j);
		int c = i == na ? 1 : j == nb ? -1 : strcmp(fstr(fa, "name"), fstr(fb, "name"));
		if (c < 0)
			rc = wk_errf(err, errsz, WK_EINVAL, "source %s changed since the snapshot: "
				     "%s is gone", src_dir, st_shown(fstr(fa, "name"), n1));
		else if (c > 0)
			rc = wk_errf(err, errsz, WK_EINVAL, "source %s changed since the snapshot: "
				     "%s is new", src_dir, st_shown(fstr(fb, "name"), n1));
		else if (fint(fa, "size") != fint(fb, "size"))
			rc = wk_errf(err, errsz, WK_EINVAL, "source %s changed since the snapshot: "
				     "%s is %lld bytes, the snapshot recorded %lld", src_dir,
				     st_shown(fstr(fa, "name"), n1), (long long)fint(fb, "size"),
				     (long long)fint(fa, "size"));
		else if (fint(fa, "mtime_ns") != fint(fb, "mtime_ns"))
			rc = wk_errf(err, errsz, WK_EINVAL, "source %s changed since the snapshot: "
				     "%s was modified (mtime differs; a copy that did not keep "
				     "times also looks modified)", src_dir,
				     st_shown(fstr(fa, "name"), n1));
		else if (strcmp(fstr(fa, "xxh3"), fstr(fb, "xxh3")))
			rc = wk_errf(err, errsz, WK_EINVAL, "source %s changed since the snapshot: "
				     "%s has different contents", src_dir,
				     st_shown(fstr(fa, "name"), n1));
		i += c <= 0;
		j += c >= 0;
	}
	json_decref(cur);
	return rc;
}
