/*
 * snapshot_fixture.h - helpers shared by test_snapshot.c and test_snapshot_corrupt.c: a
 * fixture of tensors over two rank files (odd sizes, several dtypes, some larger than a
 * chunk, random and compressible bytes), temp dirs, and manifest accessors. Functions are
 * static inline so that each test file uses only what it needs without warnings.
 */
#ifndef SNAPSHOT_FIXTURE_H
#define SNAPSHOT_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"

#define CHUNK 8192

/* ---- helpers ------------------------------------------------------------------------------ */

static inline int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static inline void rmtree(char *d)
{
	nftw(d, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(d);
}

static inline char *tmpdir(void)
{
	char *d = strdup("/tmp/wick-snap.XXXXXX");
	cr_assert_not_null(mkdtemp(d));
	return d;
}

static inline char *path2(const char *a, const char *b)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", a, b) > 0);
	return p;
}

static inline size_t entries(const char *dir)
{
	size_t n = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (d)
		closedir(d);
	return n;
}

static inline void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)(x >> 24);
	}
}

static inline void fill_compressible(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)((i / 64) % 5);
}

struct src {
	const char *name;
	int rank_file;
	enum dt_type dtype;
	int rank;
	int64_t shape[4];
	int random; /* 1: incompressible, 0: compressible, 2: zeros */
	unsigned char *data;
	uint64_t nbytes;
};

static int fail_at = -1; /* when >= 0, produce() fails for tensor 'odd' (interrupted write) */

static inline int produce(void *ctx, const struct snap_spec *t, void *dst, char *err, size_t errsz)
{
	struct src *s = ctx;
	if (fail_at >= 0 && !strcmp(t->name, "odd"))
		return wk_errf(err, errsz, WK_EIO, "simulated failure");
	memcpy(dst, s->data, t->nbytes);
	return WK_OK;
}

/* Two rank files; "big" exists in both. Sizes are odd; several tensors pass one chunk. */
static struct src fixture[] = {
	{"embed", 0, DT_F32, 2, {37, 100}, 1, NULL, 0},
	{"big", 0, DT_BF16, 2, {300, 200}, 0, NULL, 0},
	{"scale", 0, DT_F32, 0, {0}, 1, NULL, 0},
	{"odd", 0, DT_F8_E4M3, 3, {3, 7, 11}, 1, NULL, 0},
	{"empty", 0, DT_F16, 2, {0, 5}, 1, NULL, 0},
	{"big", 1, DT_F16, 2, {64, 513}, 1, NULL, 0},
	{"zeros", 1, DT_F32, 1, {4096}, 2, NULL, 0},
	{"norm", 1, DT_BF16, 1, {77}, 1, NULL, 0},
};
#define NFIX (sizeof fixture / sizeof fixture[0])

static struct snap_spec specs[NFIX];

static inline void make_fixture(void)
{
	for (size_t i = 0; i < NFIX; i++) {
		struct src *s = &fixture[i];
		uint64_t n = dt_size(s->dtype);
		for (int d = 0; d < s->rank; d++)
			n *= (uint64_t)s->shape[d];
		s->nbytes = n;
		free(s->data);
		s->data = malloc(n ? n : 1);
		if (s->random == 1)
			fill_random(s->data, n, i + 1);
		else if (s->random == 0)
			fill_compressible(s->data, n);
		else
			memset(s->data, 0, n);
		struct snap_spec *t = &specs[i];
		memset(t, 0, sizeof *t);
		t->name = s->name;
		t->rank_file = s->rank_file;
		t->dtype = s->dtype;
		t->rank = s->rank;
		for (int d = 0; d < s->rank; d++)
			t->shape[d] = s->shape[d];
		t->nbytes = n;
		t->produce = produce;
		t->ctx = s;
	}
	fail_at = -1;
}

static inline void free_fixture(void)
{
	for (size_t i = 0; i < NFIX; i++) {
		free(fixture[i].data);
		fixture[i].data = NULL;
	}
}

static inline void write_snap(const char *out, bool lz4)
{
	char err[WK_ERRSZ] = "";
	json_t *cfg = json_pack("{si}", "hidden_size", 8);
	struct snap_write_opts o = {.world = 2, .tp = 2, .ep = 1, .dtype = "keep", .lz4 = lz4,
				    .chunk_size = CHUNK, .config = cfg};
	int rc = snap_write(out, &o, specs, NFIX, err, sizeof err);
	json_decref(cfg);
	cr_assert_eq(rc, WK_OK, "snap_write: %s", err);
}

static inline struct snap *open_ok(const char *dir, const struct snap_open_opts *o)
{
	char err[WK_ERRSZ] = "";
	struct snap *s = NULL;
	int rc = snap_open(dir, o, &s, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "snap_open: %s", err);
	cr_assert_not_null(s);
	return s;
}

static inline void open_fails(const char *dir, const struct snap_open_opts *o, int code,
		       const char *want)
{
	char err[WK_ERRSZ] = "";
	struct snap *s = (struct snap *)1;
	int rc = snap_open(dir, o, &s, err, sizeof err);
	cr_assert_neq(rc, WK_OK, "expected a failure containing '%s'", want);
	cr_assert_null(s);
	if (code)
		cr_assert_eq(rc, code, "rc %d (%s): %s", rc, wk_status_name(rc), err);
	cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

static inline void check_restored(struct snap *s)
{
	cr_assert_eq(snap_world(s), 2);
	size_t count[2] = {0};
	for (size_t i = 0; i < NFIX; i++) {
		const struct src *f = &fixture[i];
		const struct st_tensor *t = snap_tensor(s, f->rank_file, f->name);
		cr_assert_not_null(t, "%s missing", f->name);
		cr_assert_str_eq(t->name, f->name);
		cr_assert_eq(t->dtype, f->dtype);
		cr_assert_eq(t->rank, f->rank);
		for (int d = 0; d < f->rank; d++)
			cr_assert_eq(t->shape[d], f->shape[d]);
		cr_assert_eq(t->nbytes, f->nbytes);
		cr_assert_eq((uint64_t)t->numel * dt_size(t->dtype), f->nbytes);
		cr_assert_eq(t->offset % SNAP_ALIGN, 0);
		if (f->nbytes) {
			cr_assert_eq((uintptr_t)t->data % SNAP_ALIGN, 0);
			cr_assert(!memcmp(t->data, f->data, f->nbytes), "%s differs", f->name);
		}
		cr_assert_eq(snap_tensor_at(s, f->rank_file, count[f->rank_file]), t,
			     "manifest order");
		count[f->rank_file]++;
	}
	cr_assert_eq(snap_tensor_count(s, 0), count[0]);
	cr_assert_eq(snap_tensor_count(s, 1), count[1]);
	cr_assert_null(snap_tensor(s, 0, "nope"));
	cr_assert_null(snap_tensor(s, 2, "big"));
	cr_assert_null(snap_tensor_at(s, 0, 99));
	cr_assert_eq(json_integer_value(json_object_get(snap_config(s), "hidden_size")), 8);
}

static inline json_t *load_manifest(const char *dir)
{
	char *p = path2(dir, "manifest.json");
	json_error_t je;
	json_t *m = json_load_file(p, 0, &je);
	free(p);
	cr_assert_not_null(m, "%s", je.text);
	return m;
}

static inline void save_manifest(const char *dir, json_t *m)
{
	char *p = path2(dir, "manifest.json");
	cr_assert_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
	free(p);
}

static inline json_t *chunk_of(json_t *m, int rank, size_t i)
{
	return json_array_get(json_object_get(json_array_get(json_object_get(m, "ranks"),
							      (size_t)rank), "chunks"), i);
}

static inline json_t *tensor_of(json_t *m, int rank, const char *name)
{
	json_t *ts = json_object_get(json_array_get(json_object_get(m, "ranks"), (size_t)rank),
				     "tensors"), *t;
	size_t i;
	json_array_foreach(ts, i, t)
		if (!strcmp(json_string_value(json_object_get(t, "name")), name))
			return t;
	return NULL;
}

static inline uint64_t jint(json_t *o, const char *k)
{
	return (uint64_t)json_integer_value(json_object_get(o, k));
}

/* Index of the first chunk of rank that lies wholly inside tensor name. */
static inline size_t chunk_inside(json_t *m, int rank, const char *name)
{
	json_t *t = tensor_of(m, rank, name);
	uint64_t a = jint(t, "offset"), b = a + jint(t, "nbytes");
	for (size_t i = 0;; i++) {
		json_t *c = chunk_of(m, rank, i);
		cr_assert_not_null(c, "no chunk inside %s", name);
		if (jint(c, "offset") >= a && jint(c, "offset") + jint(c, "size") <= b)
			return i;
	}
}

static inline void flip(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0);
	unsigned char b;
	cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x40;
	cr_assert_eq(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

#endif
