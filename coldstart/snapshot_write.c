/*
 * snapshot_write.c - snap_write: lay out each rank's image, produce, chunk, hash, compress and
 * write the rank files, copy the extra files, then the manifest, and install the directory
 * atomically (see the format notes in snapshot.h).
 *
 * One pass per rank file, one thread. Memory: a tensor buffer grown to the largest tensor
 * (produce() writes a whole tensor), one chunk being assembled, and an output buffer of at
 * least 32 MiB that is written with one write() when full. Writeback of each flushed range is
 * started at once with sync_file_range, so the fsync at the end of a large file is short and
 * dirty pages do not pile up. Compression is single-threaded (LZ4 fast mode, ~0.5-1 GB/s).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <lz4.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "coldstart/snapshot_int.h"
#include "common/wk.h"

#ifndef WICK_VERSION
#define WICK_VERSION "dev"
#endif

#define WBUF_MIN (32u << 20)

struct wr {
	const struct snap_write_opts *o;
	uint64_t chunk;              /* chunk_size */
	unsigned char *cbuf;         /* the chunk being assembled */
	uint64_t cfill;
	unsigned char *wbuf;         /* output waiting for write() */
	size_t wcap, wpos;
	unsigned char *tbuf;         /* one tensor from produce() */
	size_t tcap;
	int fd;
	const char *path;
	uint64_t file_off;           /* file offset of wbuf[0] */
	size_t nchunks;
	json_t *chunks;
	XXH3_state_t *rh;            /* the rank hash, over the chunk hashes */
	char *err;
	size_t errsz;
};

/* ---- low-level output --------------------------------------------------------------------- */

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int fsync_path(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	close(fd);
	return rc;
}

static int flush_out(struct wr *w)
{
	if (!w->wpos)
		return WK_OK;
	if (write_all(w->fd, w->wbuf, w->wpos))
		return wk_errf(w->err, w->errsz, WK_EIO, "%s: write failed: %s", w->path,
			       strerror(errno));
	/* Start writeback now; a failure here only costs speed (the fsync at the end decides). */
	sync_file_range(w->fd, (off_t)w->file_off, (off_t)w->wpos, SYNC_FILE_RANGE_WRITE);
	w->file_off += w->wpos;
	w->wpos = 0;
	return WK_OK;
}

static int put_chunk_json(struct wr *w, uint64_t size, uint64_t foff, uint64_t stored, bool lz4,
			  uint64_t h)
{
	char hex[17];
	snap__hex(h, hex);
	json_t *c = json_pack("{sI sI sI sI sb ss}", "offset", (json_int_t)(w->nchunks * w->chunk),
			      "size", (json_int_t)size, "file_offset", (json_int_t)foff, "stored",
			      (json_int_t)stored, "lz4", lz4, "xxh3", hex);
	if (!c || json_array_append_new(w->chunks, c))
		return wk_errf(w->err, w->errsz, WK_ENOMEM, "%s: out of memory", w->path);
	return WK_OK;
}

/* Hashes, maybe compresses and queues the assembled chunk. */
static int flush_chunk(struct wr *w)
{
	uint64_t size = w->cfill;
	uint64_t h = XXH3_64bits(w->cbuf, size);
	size_t need = (size_t)snap__align((uint64_t)LZ4_COMPRESSBOUND((int)size));
	int rc;

	if (w->wpos + need > w->wcap && (rc = flush_out(w)))
		return rc;
	unsigned char *dst = w->wbuf + w->wpos;
	uint64_t stored = size;
	bool lz4 = false;
	if (w->o->lz4) {
		int c = LZ4_compress_default((const char *)w->cbuf, (char *)dst, (int)size,
					     LZ4_COMPRESSBOUND((int)size));
		if (c > 0 && snap__align((uint64_t)c) * 10 <= size * 9) {
			stored = (uint64_t)c;
			lz4 = true;
		}
	}
	if (!lz4)
		memcpy(dst, w->cbuf, size);
	uint64_t padded = snap__align(stored);
	memset(dst + stored, 0, padded - stored);
	if ((rc = put_chunk_json(w, size, w->file_off + w->wpos, stored, lz4, h)))
		return rc;
	unsigned char hb[8];
	wk_put64(hb, h);
	XXH3_64bits_update(w->rh, hb, 8);
	w->wpos += padded;
	w->nchunks++;
	w->cfill = 0;
	return WK_OK;
}

/* Appends n image bytes from src (zeros when src is NULL). */
static int emit(struct wr *w, const unsigned char *src, uint64_t n)
{
	while (n) {
		uint64_t take = w->chunk - w->cfill < n ? w->chunk - w->cfill : n;
		if (src) {
			memcpy(w->cbuf + w->cfill, src, take);
			src += take;
		} else {
			memset(w->cbuf + w->cfill, 0, take);
		}
		w->cfill += take;
		n -= take;
		if (w->cfill == w->chunk) {
			int rc = flush_chunk(w);
			if (rc)
				return rc;
		}
	}
	return WK_OK;
}

/* ---- one rank file ------------------------------------------------------------------------ */

static int write_rank(struct wr *w, const char *tmp, int rank, const struct snap_spec *t,
		      size_t n, const uint64_t *off, uint64_t image_size, json_t *ranks)
{
	char path[SNAP_PATH], file[16], hex[17], nb[ST_SHOWN];
	json_t *tensors = json_array(), *jr = NULL;
	uint64_t pos = 0;
	int rc;

	w->chunks = json_array();
	w->fd = -1;
	w->path = tmp;
	if (snprintf(file, sizeof file, "rank-%03d.bin", rank % 1000) >= (int)sizeof file ||
	    snprintf(path, sizeof path, "%s/%s", tmp, file) >= (int)sizeof path) {
		rc = wk_errf(w->err, w->errsz, WK_ELIMIT, "%s: path too long", tmp);
		goto fail;
	}
	w->path = path;
	if (!tensors || !w->chunks) {
		rc = wk_errf(w->err, w->errsz, WK_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		rc = wk_errf(w->err, w->errsz, WK_EIO, "%s: %s", path, strerror(errno));
		goto fail;
	}
	w->file_off = 0;
	w->nchunks = 0;
	w->cfill = 0;
	memset(w->wbuf, 0, SNAP_ALIGN); /* the header block, rewritten at the end */
	w->wpos = SNAP_ALIGN;
	XXH3_64bits_reset(w->rh);

	for (size_t i = 0; i < n; i++) {
		const struct snap_spec *s = &t[i];
		if (s->rank_file != rank)
			continue;
		if (s->nbytes > w->tcap) {
			free(w->tbuf);
			w->tcap = 0;
			w->tbuf = malloc(s->nbytes);
			if (!w->tbuf) {
				rc = wk_errf(w->err, w->errsz, WK_ENOMEM, "snapshot: tensor '%s': "
					     "cannot allocate %" PRIu64 " bytes",
					     st_shown(s->name, nb), s->nbytes);
				goto fail;
			}
			w->tcap = s->nbytes;
		}
		char perr[WK_ERRSZ] = "";
		static unsigned char dummy[1];
		rc = s->produce(s->ctx, s, w->tbuf ? w->tbuf : dummy, perr, sizeof perr);
		if (rc) {
			rc = wk_errf(w->err, w->errsz, rc < 0 ? rc : WK_EIO, "snapshot: tensor '%s': "
				     "%s", st_shown(s->name, nb), perr[0] ? perr : "produce failed");
			goto fail;
		}
		if ((rc = emit(w, NULL, off[i] - pos)) || (rc = emit(w, w->tbuf, s->nbytes)))
			goto fail;
		pos = off[i] + s->nbytes;

		json_t *shape = json_array(), *e;
		for (int d = 0; shape && d < s->rank; d++)
			json_array_append_new(shape, json_integer(s->shape[d]));
		e = json_pack("{ss ss so sI sI}", "name", s->name, "dtype", dt_name(s->dtype),
			      "shape", shape, "offset", (json_int_t)off[i], "nbytes",
			      (json_int_t)s->nbytes);
		if (e && s->layout)
			json_object_set_new(e, "layout", json_string(s->layout));
		if (!e || json_array_append_new(tensors, e)) {
			rc = wk_errf(w->err, w->errsz, WK_ENOMEM, "%s: out of memory", path);
			goto fail;
		}
	}
	if ((rc = emit(w, NULL, image_size - pos)))
		goto fail;
	if (w->cfill && (rc = flush_chunk(w)))
		goto fail;
	if ((rc = flush_out(w)))
		goto fail;

	uint64_t rh = XXH3_64bits_digest(w->rh), meaning;
	json_t *cfg = w->o->config ? json_incref(w->o->config) : json_object();
	int mh = snap__meaning_hash(cfg, w->o->layout, (uint64_t)w->o->world,
				    w->o->tp ? (uint64_t)w->o->tp : 1, w->o->ep ? (uint64_t)w->o->ep : 1,
				    tensors, &meaning);
	json_decref(cfg);
	if (mh) {
		rc = wk_errf(w->err, w->errsz, WK_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	snap__header(w->wbuf, SNAP_VERSION, (uint32_t)rank, (uint32_t)w->o->world, image_size,
		     w->nchunks, rh, meaning);
	if (pwrite(w->fd, w->wbuf, SNAP_ALIGN, 0) != SNAP_ALIGN || fsync(w->fd)) {
		rc = wk_errf(w->err, w->errsz, WK_EIO, "%s: write/fsync failed: %s", path,
			     strerror(errno));
		goto fail;
	}
	close(w->fd);
	w->fd = -1;
	snap__hex(rh, hex);
	jr = json_pack("{ss si sI sI ss sO sO}", "file", file, "rank", rank, "size",
		       (json_int_t)w->file_off, "image_size", (json_int_t)image_size, "xxh3", hex,
		       "tensors", tensors, "chunks", w->chunks);
	if (!jr || json_array_append_new(ranks, jr)) {
		rc = wk_errf(w->err, w->errsz, WK_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	rc = WK_OK;
fail:
	w->path = NULL; /* path is this frame's */
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	json_decref(tensors);
	json_decref(w->chunks);
	w->chunks = NULL;
	return rc;
}

/* ---- input checks ------------------------------------------------------------------------- */

static bool plain_name(const char *s)
{
	return s && *s && strlen(s) <= 255 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static int cmp_spec_idx(const void *a, const void *b, void *ctx)
{
	const struct snap_spec *t = ctx;
	const struct snap_spec *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
	if (x->rank_file != y->rank_file)
		return x->rank_file < y->rank_file ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* JSON strings must be UTF-8; jansson's constructor is the validator. */
static bool utf8(const char *s)
{
	json_t *j = json_string(s);
	json_decref(j);
	return j != NULL;
}

/* A name an extra file may have: plain, UTF-8, not the manifest's or a rank file's. */
static bool extra_name(const char *c)
{
	size_t l = c ? strlen(c) : 0;
	return plain_name(c) && utf8(c) && strcmp(c, "manifest.json") &&
	       !(!strncmp(c, "rank-", 5) && l > 4 && !strcmp(c + l - 4, ".bin"));
}

/* Checks every spec and fills off[] (image offsets) and img[] (image size per rank). */
static int check_specs(const struct snap_write_opts *o, uint64_t chunk,
		       const struct snap_spec *t, size_t n, uint64_t *off, uint64_t *img,
		       char *err, size_t errsz)
{
	char nb[ST_SHOWN];
	size_t cnt[SNAP_MAX_RANKS] = {0};
	for (size_t i = 0; i < n; i++) {
		const struct snap_spec *s = &t[i];
		if (!s->name || !*s->name || strlen(s->name) > ST_MAX_NAME)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor %zu: name is empty, "
				       "missing or longer than %d bytes", i, ST_MAX_NAME);
		const char *nm = st_shown(s->name, nb);
		if (!utf8(s->name) || (s->layout && !utf8(s->layout)))
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': name or layout "
				       "tag is not valid UTF-8", nm);
		if (s->rank_file < 0 || s->rank_file >= o->world)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': rank_file %d "
				       "is outside 0..%d", nm, s->rank_file, o->world - 1);
		if (dt_size(s->dtype) == 0 || s->rank < 0 || s->rank > ST_MAX_RANK || !s->produce)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': bad dtype, rank "
				       "or missing produce()", nm);
		if (s->layout && strlen(s->layout) > SNAP_MAX_LAYOUT_TAG)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': layout tag "
				       "longer than %d bytes", nm, SNAP_MAX_LAYOUT_TAG);
		uint64_t numel = 1;
		bool zero = false, overflow = false;
		for (int d = 0; d < s->rank; d++) {
			if (s->shape[d] < 0)
				return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': "
					       "shape[%d] is negative", nm, d);
			if (s->shape[d] == 0)
				zero = true;
			else if (numel > (uint64_t)INT64_MAX / (uint64_t)s->shape[d])
				overflow = true;
			else
				numel *= (uint64_t)s->shape[d];
		}
		if (zero) {
			numel = 0;
			overflow = false;
		}
		if (overflow || numel > SNAP_MAX_IMAGE || numel * dt_size(s->dtype) != s->nbytes)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s': nbytes %" PRIu64
				       " does not match its shape and dtype %s", nm, s->nbytes,
				       dt_name(s->dtype));
		uint64_t *end = &img[s->rank_file];
		off[i] = snap__align(*end);
		if (off[i] + s->nbytes > SNAP_MAX_IMAGE)
			return wk_errf(err, errsz, WK_ELIMIT, "snapshot: rank %d's image passes the "
				       "limit of %" PRIu64 " bytes", s->rank_file, SNAP_MAX_IMAGE);
		*end = off[i] + s->nbytes;
		if (++cnt[s->rank_file] > ST_MAX_TENSORS)
			return wk_errf(err, errsz, WK_ELIMIT, "snapshot: rank %d has more than %d "
				       "tensors", s->rank_file, ST_MAX_TENSORS);
	}
	for (int r = 0; r < o->world; r++) {
		img[r] = snap__align(img[r]);
		if ((img[r] + chunk - 1) / chunk > SNAP_MAX_CHUNKS)
			return wk_errf(err, errsz, WK_ELIMIT, "snapshot: rank %d needs more than %u "
				       "chunks; use a larger chunk_size", r, SNAP_MAX_CHUNKS);
	}
	size_t *idx = malloc((n ? n : 1) * sizeof *idx);
	if (!idx)
		return wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	qsort_r(idx, n, sizeof *idx, cmp_spec_idx, (void *)t);
	for (size_t i = 1; i < n; i++)
		if (!cmp_spec_idx(&idx[i - 1], &idx[i], (void *)t)) {
			int rc = wk_errf(err, errsz, WK_EINVAL, "snapshot: tensor '%s' appears twice "
					 "in rank file %d", st_shown(t[idx[i]].name, nb),
					 t[idx[i]].rank_file);
			free(idx);
			return rc;
		}
	free(idx);
	return WK_OK;
}

static int check_opts(const struct snap_write_opts *o, uint64_t chunk, char *err, size_t errsz)
{
	if (o->world < 1 || o->world > SNAP_MAX_RANKS)
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: world %d is outside 1..%d",
			       o->world, SNAP_MAX_RANKS);
	if (o->tp < 0 || o->ep < 0 || o->tp > (1 << 20) || o->ep > (1 << 20))
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: bad tp %d / ep %d", o->tp, o->ep);
	if (chunk < SNAP_ALIGN || chunk % SNAP_ALIGN || chunk > SNAP_MAX_CHUNK)
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: chunk_size %" PRIu64 " is not a "
			       "multiple of %d in %d..%u", chunk, SNAP_ALIGN, SNAP_ALIGN,
			       SNAP_MAX_CHUNK);
	if (o->dtype && (strlen(o->dtype) > 32 || !utf8(o->dtype)))
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: dtype name too long or not UTF-8");
	if ((o->config && !json_is_object(o->config)) || (o->layout && !json_is_object(o->layout)))
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: config and layout must be JSON "
			       "objects");
	for (size_t i = 0; o->copy && o->copy[i]; i++)
		if (!o->src_dir || !extra_name(o->copy[i]))
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: cannot copy '%s': it needs "
				       "src_dir and a plain name other than manifest.json and "
				       "rank-*.bin", o->copy[i] ? o->copy[i] : "(null)");
	for (size_t i = 0; i < o->n_made; i++) {
		const char *c = o->made[i].name;
		bool dup = false;
		for (size_t k = 0; o->copy && o->copy[k] && c; k++)
			dup = dup || !strcmp(c, o->copy[k]);
		for (size_t k = 0; k < i && c; k++)
			dup = dup || !strcmp(c, o->made[k].name);
		if (!extra_name(c) || dup || (!o->made[i].data && o->made[i].len) ||
		    o->made[i].len > SNAP_MAX_COPY)
			return wk_errf(err, errsz, WK_EINVAL, "snapshot: cannot write the made file "
				       "'%s': it needs a plain name other than manifest.json, "
				       "rank-*.bin and the other files', and at most %" PRIu64
				       " bytes", c ? c : "(null)", SNAP_MAX_COPY);
	}
	return WK_OK;
}

/* ---- directory handling ------------------------------------------------------------------- */

/* 1 when path is absent, 2 when it is a snapshot or an empty directory, 0 otherwise. */
static int replaceable(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 1 : 0;
	if (!S_ISDIR(st.st_mode))
		return 0;
	if (snap_is_snapshot(path))
		return 2;
	DIR *d = opendir(path);
	if (!d)
		return 0;
	struct dirent *e;
	int empty = 1;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty ? 2 : 0;
}

/* Removes BASE.tmp-PID and BASE.old-PID dirs in parent whose process no longer exists. */
static void remove_stale(const char *parent, const char *base)
{
	DIR *d = opendir(parent);
	if (!d)
		return;
	size_t bl = strlen(base);
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *s = e->d_name;
		if (strncmp(s, base, bl) || (strncmp(s + bl, ".tmp-", 5) && strncmp(s + bl, ".old-", 5)))
			continue;
		char *end;
		errno = 0;
		long pid = strtol(s + bl + 5, &end, 10);
		if (errno || *end || end == s + bl + 5 || pid <= 0 || pid > INT_MAX ||
		    pid == (long)getpid())
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		char p[SNAP_PATH];
		if (snprintf(p, sizeof p, "%s/%s", parent, s) < (int)sizeof p)
			snap__rmtree(p);
	}
	closedir(d);
}

/* Writes a made file's bytes to dst (a new file), fsync'd. */
static int write_made(const char *dst, const struct snap_file *f, char *err, size_t errsz)
{
	int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", dst, strerror(errno));
	int rc = WK_OK;
	if (write_all(fd, f->data, f->len) || fsync(fd))
		rc = wk_errf(err, errsz, WK_EIO, "%s: write failed: %s", dst, strerror(errno));
	close(fd);
	return rc;
}

/* Copies src to dst (nothing when src does not exist: *copied false), its size and xxh3 in
 * *size and *hash. */
static int copy_file(const char *src, const char *dst, unsigned char *buf, size_t bufsz,
		     bool *copied, uint64_t *size, uint64_t *hash, char *err, size_t errsz)
{
	int in = -1, out = -1, rc;
	struct stat st;
	XXH3_state_t *h = NULL;
	*copied = false;
	*size = 0;
	in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0) {
		if (errno == ENOENT)
			return WK_OK;
		return wk_errf(err, errsz, WK_EIO, "%s: %s", src, strerror(errno));
	}
	if (fstat(in, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > SNAP_MAX_COPY) {
		rc = wk_errf(err, errsz, WK_EINVAL, "%s: not a regular file of at most %" PRIu64
			     " bytes", src, SNAP_MAX_COPY);
		goto fail;
	}
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (out < 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", dst, strerror(errno));
		goto fail;
	}
	if (!(h = XXH3_createState()) || XXH3_64bits_reset(h) != XXH_OK) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", dst);
		goto fail;
	}
	for (;;) {
		ssize_t r = read(in, buf, bufsz);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = wk_errf(err, errsz, WK_EIO, "%s: read failed: %s", src, strerror(errno));
			goto fail;
		}
		if (r == 0)
			break;
		XXH3_64bits_update(h, buf, (size_t)r);
		*size += (uint64_t)r;
		if (write_all(out, buf, (size_t)r)) {
			rc = wk_errf(err, errsz, WK_EIO, "%s: write failed: %s", dst, strerror(errno));
			goto fail;
		}
	}
	if (fsync(out)) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: fsync failed: %s", dst, strerror(errno));
		goto fail;
	}
	*copied = true;
	*hash = XXH3_64bits_digest(h);
	rc = WK_OK;
fail:
	XXH3_freeState(h);
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return rc;
}

/* Puts tmp in place of out (parent is out's directory). */
static int install(const char *tmp, const char *out, const char *parent, char *err, size_t errsz)
{
	char old[SNAP_PATH];
	const char *doomed = NULL;
	int kind = replaceable(out);

	if (kind == 0)
		return wk_errf(err, errsz, WK_EINVAL, "%s exists and is neither a snapshot nor an "
			       "empty directory; refusing to replace it", out);
	if (kind == 1) {
		if (rename(tmp, out))
			return wk_errf(err, errsz, WK_EIO, "rename %s -> %s: %s", tmp, out,
				       strerror(errno));
	} else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) == 0) {
		doomed = tmp; /* now holds the old snapshot */
	} else {
		if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
			return wk_errf(err, errsz, WK_EIO, "exchange %s <-> %s: %s", tmp, out,
				       strerror(errno));
		if (snprintf(old, sizeof old, "%s.old-%d", out, (int)getpid()) >= (int)sizeof old)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", out);
		if (rename(out, old))
			return wk_errf(err, errsz, WK_EIO, "rename %s -> %s: %s", out, old,
				       strerror(errno));
		if (rename(tmp, out)) {
			int e = errno;
			rename(old, out);
			return wk_errf(err, errsz, WK_EIO, "rename %s -> %s: %s", tmp, out,
				       strerror(e));
		}
		doomed = old;
	}
	if (fsync_path(parent))
		return wk_errf(err, errsz, WK_EIO, "%s: fsync failed: %s", parent, strerror(errno));
	if (doomed)
		snap__rmtree(doomed); /* best effort: the new snapshot is already in place */
	return WK_OK;
}

/* ---- snap_write --------------------------------------------------------------------------- */

static int write_manifest(const char *tmp, json_t *root, char *err, size_t errsz)
{
	char path[SNAP_PATH];
	if (snprintf(path, sizeof path, "%s/manifest.json", tmp) >= (int)sizeof path)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", tmp);
	char *text = json_dumps(root, JSON_INDENT(1));
	if (!text)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	int rc = WK_OK;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0 || write_all(fd, (unsigned char *)text, strlen(text)) ||
	    write_all(fd, (const unsigned char *)"\n", 1) || fsync(fd))
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", path, strerror(errno));
	if (fd >= 0)
		close(fd);
	free(text);
	return rc;
}

int snap_write(const char *out_dir, const struct snap_write_opts *o, const struct snap_spec *t,
	       size_t n, char *err, size_t errsz)
{
	char out[SNAP_PATH], tmp[SNAP_PATH], parent[SNAP_PATH], base[SNAP_PATH], when[32];
	struct wr w = {.fd = -1, .err = err, .errsz = errsz};
	uint64_t *off = NULL, img[SNAP_MAX_RANKS] = {0};
	json_t *root = NULL, *ranks = NULL, *files = NULL, *source = NULL;
	bool made_tmp = false;
	int rc;

	if (!out_dir || !*out_dir || !o || (n && !t))
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: missing output dir, options or "
			       "tensors");
	uint64_t chunk = o->chunk_size ? o->chunk_size : SNAP_DEFAULT_CHUNK;
	if ((rc = check_opts(o, chunk, err, errsz)))
		return rc;
	off = malloc((n ? n : 1) * sizeof *off);
	if (!off)
		return wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
	if ((rc = check_specs(o, chunk, t, n, off, img, err, errsz)))
		goto fail;
	if (strlen(out_dir) + 32 > sizeof tmp) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", out_dir);
		goto fail;
	}
	if (snprintf(out, sizeof out, "%s", out_dir) >= (int)sizeof out) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", out_dir);
		goto fail;
	}
	for (size_t l = strlen(out); l > 1 && out[l - 1] == '/'; l--)
		out[l - 1] = 0; /* "snap/" names the same directory as "snap" */
	out_dir = out;
	memcpy(parent, out, sizeof parent);
	memcpy(base, out, sizeof base);
	char *pd = dirname(parent), *bn = basename(base);
	memmove(parent, pd, strlen(pd) + 1);
	if (!replaceable(out_dir)) {
		rc = wk_errf(err, errsz, WK_EINVAL, "%s exists and is neither a snapshot nor an "
			     "empty directory; refusing to replace it", out_dir);
		goto fail;
	}
	remove_stale(parent, bn);
	if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", out_dir, (int)getpid()) >= (int)sizeof tmp) {
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", out_dir);
		goto fail;
	}
	snap__rmtree(tmp); /* left by an earlier process with our pid */
	if (mkdir(tmp, 0755)) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	made_tmp = true;

	w.o = o;
	w.chunk = chunk;
	w.wcap = WBUF_MIN;
	if (w.wcap < 2 * snap__align((uint64_t)LZ4_COMPRESSBOUND((int)chunk)) + SNAP_ALIGN)
		w.wcap = 2 * snap__align((uint64_t)LZ4_COMPRESSBOUND((int)chunk)) + SNAP_ALIGN;
	w.cbuf = aligned_alloc(SNAP_ALIGN, chunk);
	w.wbuf = aligned_alloc(SNAP_ALIGN, w.wcap);
	w.rh = XXH3_createState();
	root = json_object();
	ranks = json_array();
	files = json_array();
	if (!w.cbuf || !w.wbuf || !w.rh || !root || !ranks || !files) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
		goto fail;
	}
	for (int r = 0; r < o->world; r++)
		if ((rc = write_rank(&w, tmp, r, t, n, off, img[r], ranks)))
			goto fail;

	for (size_t i = 0; o->copy && o->copy[i]; i++) {
		char src[SNAP_PATH], dst[SNAP_PATH];
		bool copied;
		if (snprintf(src, sizeof src, "%s/%s", o->src_dir, o->copy[i]) >= (int)sizeof src) {
			rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", o->src_dir);
			goto fail;
		}
		if (snprintf(dst, sizeof dst, "%s/%s", tmp, o->copy[i]) >= (int)sizeof dst) {
			rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", tmp);
			goto fail;
		}
		uint64_t size = 0, hash = 0;
		if ((rc = copy_file(src, dst, w.wbuf, w.wcap, &copied, &size, &hash, err, errsz)))
			goto fail;
		char hex[17];
		snap__hex(hash, hex);
		if (copied && json_array_append_new(files, json_pack("{ss sI ss}", "name", o->copy[i],
								     "size", (json_int_t)size,
								     "xxh3", hex))) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
			goto fail;
		}
	}
	for (size_t i = 0; i < o->n_made; i++) {
		char dst[SNAP_PATH], hex[17];
		const struct snap_file *f = &o->made[i];
		if (snprintf(dst, sizeof dst, "%s/%s", tmp, f->name) >= (int)sizeof dst) {
			rc = wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", tmp);
			goto fail;
		}
		if ((rc = write_made(dst, f, err, errsz)))
			goto fail;
		snap__hex(XXH3_64bits(f->data, f->len), hex);
		if (json_array_append_new(files, json_pack("{ss sI ss}", "name", f->name, "size",
							   (json_int_t)f->len, "xxh3", hex))) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
			goto fail;
		}
	}
	if (o->src_dir && (rc = snap__source_identity(o->src_dir, &source, err, errsz)))
		goto fail;

	time_t now = time(NULL);
	struct tm tmv;
	gmtime_r(&now, &tmv);
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
	json_t *cfg = o->config ? json_incref(o->config) : json_object();
	json_t *lay = o->layout ? json_incref(o->layout) : json_null();
	json_t *src = source ? json_incref(source) : json_null();
	if (json_object_set_new(root, "format", json_string(SNAP_FORMAT)) ||
	    json_object_set_new(root, "version", json_integer(SNAP_VERSION)) ||
	    json_object_set_new(root, "created", json_string(when)) ||
	    json_object_set_new(root, "wick", json_string(WICK_VERSION)) ||
	    json_object_set_new(root, "world", json_integer(o->world)) ||
	    json_object_set_new(root, "tp", json_integer(o->tp ? o->tp : 1)) ||
	    json_object_set_new(root, "ep", json_integer(o->ep ? o->ep : 1)) ||
	    json_object_set_new(root, "dtype", json_string(o->dtype ? o->dtype : "keep")) ||
	    json_object_set_new(root, "compress", json_string(o->lz4 ? "lz4" : "none")) ||
	    json_object_set_new(root, "chunk_size", json_integer((json_int_t)chunk)) ||
	    json_object_set_new(root, "config", cfg) || json_object_set_new(root, "layout", lay) ||
	    json_object_set_new(root, "source", src) || json_object_set(root, "files", files) ||
	    json_object_set(root, "ranks", ranks)) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "snapshot: out of memory");
		goto fail;
	}
	if ((rc = write_manifest(tmp, root, err, errsz)))
		goto fail;
	if (fsync_path(tmp)) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
		goto fail;
	}
	if ((rc = install(tmp, out_dir, parent, err, errsz)))
		goto fail;
	made_tmp = false;
	rc = WK_OK;
fail:
	if (made_tmp)
		snap__rmtree(tmp);
	free(off);
	free(w.cbuf);
	free(w.wbuf);
	free(w.tbuf);
	XXH3_freeState(w.rh);
	json_decref(root);
	json_decref(ranks);
	json_decref(files);
	json_decref(source);
	return rc;
}
