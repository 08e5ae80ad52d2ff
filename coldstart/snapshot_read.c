/*
 * snapshot_read.c - snap_open: restore every rank's image with a pool of reader threads, and
 * the accessors of a restored snapshot.
 *
 * Pipeline. After the manifest is validated (snapshot_manifest.c), each rank file is opened
 * twice (buffered, and O_DIRECT when the file system accepts it), its size and header block are
 * checked against the manifest, and its image is allocated. Each rank's chunks are grouped into
 * work items: a run of raw chunks up to read_size bytes (one read straight into the image, as
 * raw chunks are contiguous in the file and in the image), or a run of lz4 chunks up to
 * read_size bytes (one read into the thread's staging buffer, then one LZ4_decompress_safe per
 * chunk into the image). The items of all ranks are interleaved into one queue, which reader
 * threads drain with an atomic counter, so every rank file streams at once.
 *
 * Each item is read buffered when at least half of its pages are already in the page cache
 * (mincore on a read-only mapping of the file: after `wick prefetch` or a recent run, memcpy
 * from the cache beats going to the device), and with O_DIRECT otherwise. O_DIRECT needs
 * aligned offsets, sizes and memory, which the format guarantees (everything 4 KiB) and the
 * image and staging allocations provide; an EINVAL from an O_DIRECT read (tmpfs, some network
 * file systems) turns O_DIRECT off for that file and the read is retried buffered.
 *
 * A rank file whose chunks are all raw and that is mostly in the page cache is not copied at
 * all: its image is a private mapping of the file, and the readers only populate page tables
 * (MADV_POPULATE_READ, cheap) and verify. On the machine this was written on, a warm 2.3 GB
 * restore took ~1.8 s copying (kernel zeroing of the fresh image plus the copy dominate) and
 * a fraction of that mapped.
 *
 * The first error stops every thread (they check a flag between items); its message wins.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lz4.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "coldstart/snapshot_int.h"
#include "common/wk.h"

#define DEFAULT_READ (16u << 20)
#define MAX_THREADS 256

struct work {
	int rank;
	size_t c0, c1;               /* chunks [c0, c1) */
	uint64_t foff, flen;         /* the file range they occupy, padding included */
	bool lz4;
};

struct restore {
	struct snap *s;
	bool verify;
	struct work *w;
	size_t nw;
	uint64_t total;              /* file bytes to read */
	uint64_t stage_need;         /* largest lz4 item */
	uint64_t item_need;          /* largest lz4 item's image bytes (a sink's lz4 buffers) */
	uint64_t piece;              /* bytes a read and copy of raw chunks into a sink */
	uint64_t raw_need;           /* largest raw item's file bytes */
	long page;
	atomic_size_t next;
	atomic_bool failed;
	_Atomic uint64_t done, direct, buffered, mapped;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running;
	int rc;
	char err[WK_ERRSZ];
};

struct reader {
	struct restore *rs;
	pthread_t th;
	unsigned char *stage;
	unsigned char *ring[2];      /* a sink's buffers for lz4 items, used in turn */
	bool ring_busy[2];           /* copies from ring[i] may be in flight */
	int ring_next;
	unsigned char *slot[SNAP_SINK_SLOTS]; /* a sink's piece buffers for raw chunks, in turn */
	bool slot_busy[SNAP_SINK_SLOTS];
	int slot_next;
	XXH3_state_t *xs;            /* the running checksum of a chunk read in pieces */
	unsigned char *vec;          /* mincore output */
	size_t vec_cap;
	double verify_s, decompress_s;
};

/* ---- reading one item --------------------------------------------------------------------- */

/* True when at least half of the pages of [off, off + len) are in the page cache. */
static bool mostly_cached(struct reader *rd, const struct snap_rank *rk, uint64_t off,
			  uint64_t len)
{
	uint64_t page = (uint64_t)rd->rs->page;
	if (!rk->fmap || !len)
		return false;
	uint64_t start = off & ~(page - 1), end = off + len;
	size_t np = (size_t)((end - start + page - 1) / page);
	if (np > rd->vec_cap) {
		unsigned char *v = realloc(rd->vec, np);
		if (!v)
			return false;
		rd->vec = v;
		rd->vec_cap = np;
	}
	if (mincore(rk->fmap + start, end - start, rd->vec))
		return false;
	size_t in = 0;
	for (size_t i = 0; i < np; i++)
		in += rd->vec[i] & 1;
	return 2 * in >= np;
}

static int read_into(struct reader *rd, struct snap_rank *rk, unsigned char *dst, uint64_t len,
		     uint64_t foff, char *err, size_t errsz)
{
	struct restore *rs = rd->rs;
	bool direct = rk->fd_direct >= 0 && atomic_load(&rk->direct_ok) &&
		      !mostly_cached(rd, rk, foff, len);
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = pread(direct ? rk->fd_direct : rk->fd, dst + done, len - done,
				  (off_t)(foff + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && direct && errno == EINVAL) {
			atomic_store(&rk->direct_ok, false);
			direct = false;
			continue;
		}
		if (r < 0)
			return wk_errf(err, errsz, WK_EIO, "%s: read of bytes %" PRIu64 "..%" PRIu64
				       " failed: %s", rk->path, foff + done, foff + len,
				       strerror(errno));
		if (r == 0)
			return wk_errf(err, errsz, WK_EIO, "%s: end of file at byte %" PRIu64 " (was "
				       "it truncated while being read?)", rk->path, foff + done);
		atomic_fetch_add(direct ? &rs->direct : &rs->buffered, (uint64_t)r);
		if (direct && r % SNAP_ALIGN)
			direct = false; /* the rest would be misaligned */
		done += (uint64_t)r;
	}
	return WK_OK;
}

/* Maps the page-cache pages of [foff, foff + len) of a mapped rank into its image. */
static int populate(struct reader *rd, struct snap_rank *rk, uint64_t foff, uint64_t len,
		    char *err, size_t errsz)
{
	uint64_t page = (uint64_t)rd->rs->page, start = foff & ~(page - 1);
	if (madvise(rk->fmap + start, foff + len - start, MADV_POPULATE_READ) == 0) {
		atomic_fetch_add(&rd->rs->mapped, len);
		return WK_OK;
	}
	if (errno != EINVAL)
		return wk_errf(err, errsz, WK_EIO, "%s: reading bytes %" PRIu64 "..%" PRIu64
			       " failed: %s", rk->path, foff, foff + len, strerror(errno));
	/* Before Linux 5.14: touch one byte per page. */
	volatile unsigned char sink = 0;
	for (uint64_t o = start; o < foff + len; o += page)
		sink ^= rk->fmap[o];
	(void)sink;
	atomic_fetch_add(&rd->rs->mapped, len);
	return WK_OK;
}

/* Chunk ci's checksum h against the manifest's. */
static int chunk_sum(const struct snap_rank *rk, size_t ci, uint64_t h, char *err, size_t errsz)
{
	const struct snap_chunk *c = &rk->c[ci];
	char held[ST_SHOWN * 4];
	if (h == c->xxh3)
		return WK_OK;
	return wk_errf(err, errsz, WK_EFORMAT, "%s: chunk %zu (bytes %" PRIu64 "..%" PRIu64 ") "
		       "failed its checksum; %s", rk->path, ci, c->offset, c->offset + c->size,
		       snap__chunk_tensors(rk, c->offset, c->size, held, sizeof held));
}

/* Verifies chunk ci, whose image bytes are at bytes. */
static int check_chunk(struct reader *rd, const struct snap_rank *rk, size_t ci,
		       const unsigned char *bytes, char *err, size_t errsz)
{
	double t0 = wk_now();
	uint64_t h = XXH3_64bits(bytes, rk->c[ci].size);
	rd->verify_s += wk_now() - t0;
	return chunk_sum(rk, ci, h, err, errsz);
}

/* Decompresses chunk ci of an lz4 item read into rd->stage (from file offset foff) to dst. */
static int inflate(struct reader *rd, const struct snap_rank *rk, size_t ci, uint64_t foff,
		   unsigned char *dst, char *err, size_t errsz)
{
	const struct snap_chunk *c = &rk->c[ci];
	char held[ST_SHOWN * 4];
	double t0 = wk_now();
	int got = LZ4_decompress_safe((const char *)rd->stage + (c->file_offset - foff),
				      (char *)dst, (int)c->stored, (int)c->size);
	rd->decompress_s += wk_now() - t0;
	if (got >= 0 && (uint64_t)got == c->size)
		return WK_OK;
	return wk_errf(err, errsz, WK_EFORMAT, "%s: chunk %zu (bytes %" PRIu64 "..%" PRIu64 ") "
		       "failed to decompress; %s", rk->path, ci, c->offset, c->offset + c->size,
		       snap__chunk_tensors(rk, c->offset, c->size, held, sizeof held));
}

static int stage_lz4(struct reader *rd, struct snap_rank *rk, const struct work *w, char *err,
		     size_t errsz)
{
	struct restore *rs = rd->rs;
	if (!rd->stage && !(rd->stage = aligned_alloc(SNAP_ALIGN, rs->stage_need)))
		return wk_errf(err, errsz, WK_ENOMEM, "%s: cannot allocate a %" PRIu64
			       "-byte staging buffer", rk->path, rs->stage_need);
	return read_into(rd, rk, rd->stage, w->flen, w->foff, err, errsz);
}

/* The staging buffer *b of bytes bytes, made when missing (SNAP_ALIGN-aligned), once every
 * copy from it has finished (*busy). */
static int stage_ready(struct reader *rd, const struct snap_rank *rk, unsigned char **b,
		       bool *busy, uint64_t bytes, char *err, size_t errsz)
{
	const struct snap_sink *k = &rd->rs->s->sink;
	int rc;
	if (!*b && !(*b = k->stage_alloc(k->ctx, bytes)))
		return wk_errf(err, errsz, WK_ENOMEM, "%s: cannot allocate a %" PRIu64 "-byte "
			       "staging buffer", rk->path, bytes);
	if ((uintptr_t)*b % SNAP_ALIGN)
		return wk_errf(err, errsz, WK_EINVAL, "%s: the sink's staging buffer is not aligned "
			       "to %d", rk->path, SNAP_ALIGN);
	if (*busy && (rc = k->wait(k->ctx, *b, err, errsz)))
		return rc;
	*busy = false;
	return WK_OK;
}

/* An lz4 work item through a sink: read and decompress into the next lz4 buffer, verify
 * there, and start the copy into the sink's image. */
static int sink_lz4(struct reader *rd, const struct work *w, char *err, size_t errsz)
{
	struct restore *rs = rd->rs;
	const struct snap_sink *k = &rs->s->sink;
	struct snap_rank *rk = &rs->s->r[w->rank];
	int i = rd->ring_next, rc;
	if ((rc = stage_ready(rd, rk, &rd->ring[i], &rd->ring_busy[i], rs->item_need, err,
			      errsz)))
		return rc;
	unsigned char *buf = rd->ring[i];
	uint64_t img0 = rk->c[w->c0].offset;
	uint64_t len = rk->c[w->c1 - 1].offset + rk->c[w->c1 - 1].size - img0;
	if ((rc = stage_lz4(rd, rk, w, err, errsz)))
		return rc;
	for (size_t ci = w->c0; ci < w->c1; ci++) {
		unsigned char *at = buf + (rk->c[ci].offset - img0);
		if ((rc = inflate(rd, rk, ci, w->foff, at, err, errsz)))
			return rc;
		if (rs->verify && (rc = check_chunk(rd, rk, ci, at, err, errsz)))
			return rc;
	}
	if ((rc = k->put(k->ctx, w->rank, rk->image + img0, buf, len, err, errsz)))
		return rc;
	rd->ring_busy[i] = true;
	rd->ring_next = !i;
	return WK_OK;
}

/* Adds image bytes [p, e) of a raw work item (at buf, relative to the item's first chunk)
 * to the running checksums of the chunks they cover, from chunk *ci on, and checks each
 * chunk that ends within them. Raw chunks lie in the file as in the image. */
static int sum_piece(struct reader *rd, const struct snap_rank *rk, const struct work *w,
		     size_t *ci, bool *open, const unsigned char *buf, uint64_t p, uint64_t e,
		     char *err, size_t errsz)
{
	uint64_t img0 = rk->c[w->c0].offset;
	double t0 = wk_now();
	int rc = WK_OK;
	for (; *ci < w->c1 && rc == WK_OK; (*ci)++) {
		const struct snap_chunk *c = &rk->c[*ci];
		uint64_t cs = c->offset - img0, ce = cs + c->size;
		if (cs > e || (cs == e && c->size))
			break; /* starts in a later piece */
		if (!*open)
			XXH3_64bits_reset(rd->xs);
		*open = true;
		uint64_t a = cs > p ? cs : p, b = ce < e ? ce : e;
		if (b > a)
			XXH3_64bits_update(rd->xs, buf + (a - p), (size_t)(b - a));
		if (ce > e)
			break; /* goes on in the next piece */
		*open = false;
		rc = chunk_sum(rk, *ci, XXH3_64bits_digest(rd->xs), err, errsz);
	}
	rd->verify_s += wk_now() - t0;
	return rc;
}

/* A raw work item through a sink, in pieces of rs->piece bytes: each read into the next of
 * the reader's piece buffers (once its last copy is done), summed into its chunks'
 * checksums, and its copy into the sink's image started. */
static int sink_raw(struct reader *rd, const struct work *w, char *err, size_t errsz)
{
	struct restore *rs = rd->rs;
	const struct snap_sink *k = &rs->s->sink;
	struct snap_rank *rk = &rs->s->r[w->rank];
	uint64_t img0 = rk->c[w->c0].offset;
	uint64_t len = rk->c[w->c1 - 1].offset + rk->c[w->c1 - 1].size - img0;
	size_t ci = w->c0;
	bool open = false;
	int rc;
	if (rs->verify && !rd->xs && !(rd->xs = XXH3_createState()))
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", rk->path);
	for (uint64_t p = 0; p < w->flen; p += rs->piece) {
		int i = rd->slot_next;
		uint64_t n = w->flen - p < rs->piece ? w->flen - p : rs->piece;
		uint64_t e = p + n < len ? p + n : len; /* image bytes [p, e): the rest is padding */
		if ((rc = stage_ready(rd, rk, &rd->slot[i], &rd->slot_busy[i], rs->piece, err,
				      errsz)) ||
		    (rc = read_into(rd, rk, rd->slot[i], n, w->foff + p, err, errsz)))
			return rc;
		if (rs->verify &&
		    (rc = sum_piece(rd, rk, w, &ci, &open, rd->slot[i], p, e, err, errsz)))
			return rc;
		if (e > p && (rc = k->put(k->ctx, w->rank, rk->image + img0 + p, rd->slot[i],
					  e - p, err, errsz)))
			return rc;
		rd->slot_busy[i] = e > p;
		rd->slot_next = (i + 1) % SNAP_SINK_SLOTS;
	}
	if (rs->verify && ci < w->c1) /* cannot happen: every chunk ends by the item's end */
		return wk_errf(err, errsz, WK_EFORMAT, "%s: chunk %zu was not read whole",
			       rk->path, ci);
	return WK_OK;
}

/* A work item through a sink: read (and decompress) into staging buffers, verify there, and
 * start the copies into the sink's image. */
static int do_work_sink(struct reader *rd, const struct work *w, char *err, size_t errsz)
{
	int rc = w->lz4 ? sink_lz4(rd, w, err, errsz) : sink_raw(rd, w, err, errsz);
	if (rc == WK_OK)
		atomic_fetch_add(&rd->rs->done, w->flen);
	return rc;
}

/* Waits for the copies from a staging buffer, then frees it; the first error goes to err. */
static void stage_drop(struct reader *rd, unsigned char **b, bool *busy, int *rc, char *err,
		       size_t errsz)
{
	const struct snap_sink *k = &rd->rs->s->sink;
	if (*busy) {
		char e2[WK_ERRSZ];
		int r2 = k->wait(k->ctx, *b, e2, sizeof e2);
		if (r2 && !*rc) {
			*rc = r2;
			snprintf(err, errsz, "%s", e2);
		}
		*busy = false;
	}
	if (*b)
		k->stage_free(k->ctx, *b);
	*b = NULL;
}

/* Waits for the copies from a reader's staging buffers and frees them. */
static int ring_drain(struct reader *rd, char *err, size_t errsz)
{
	int rc = WK_OK;
	for (int i = 0; i < 2; i++)
		stage_drop(rd, &rd->ring[i], &rd->ring_busy[i], &rc, err, errsz);
	for (int i = 0; i < SNAP_SINK_SLOTS; i++)
		stage_drop(rd, &rd->slot[i], &rd->slot_busy[i], &rc, err, errsz);
	return rc;
}

static int do_work(struct reader *rd, const struct work *w, char *err, size_t errsz)
{
	struct restore *rs = rd->rs;
	struct snap_rank *rk = &rs->s->r[w->rank];
	int rc;

	if (rs->s->on_sink)
		return do_work_sink(rd, w, err, errsz);
	if (rk->mapped) {
		if ((rc = populate(rd, rk, w->foff, w->flen, err, errsz)))
			return rc;
	} else if (!w->lz4) {
		if ((rc = read_into(rd, rk, rk->image + rk->c[w->c0].offset, w->flen, w->foff, err,
				    errsz)))
			return rc;
	} else if ((rc = stage_lz4(rd, rk, w, err, errsz))) {
		return rc;
	}
	for (size_t ci = w->c0; ci < w->c1; ci++) {
		unsigned char *at = rk->image + rk->c[ci].offset;
		if (w->lz4 && (rc = inflate(rd, rk, ci, w->foff, at, err, errsz)))
			return rc;
		if (rs->verify && (rc = check_chunk(rd, rk, ci, at, err, errsz)))
			return rc;
	}
	atomic_fetch_add(&rs->done, w->flen);
	return WK_OK;
}

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	struct restore *rs = rd->rs;
	char err[WK_ERRSZ];
	for (bool last = false; !last;) {
		size_t i = atomic_load(&rs->failed) ? rs->nw : atomic_fetch_add(&rs->next, 1);
		int rc = WK_OK;
		last = i >= rs->nw;
		if (!last)
			rc = do_work(rd, &rs->w[i], err, sizeof err);
		else if (rs->s->on_sink)
			rc = ring_drain(rd, err, sizeof err); /* after a failure too */
		if (rc) {
			pthread_mutex_lock(&rs->mu);
			if (!rs->rc) {
				rs->rc = rc;
				snprintf(rs->err, sizeof rs->err, "%s", err);
			}
			pthread_mutex_unlock(&rs->mu);
			atomic_store(&rs->failed, true);
		}
	}
	pthread_mutex_lock(&rs->mu);
	rs->running--;
	pthread_cond_signal(&rs->cv);
	pthread_mutex_unlock(&rs->mu);
	return NULL;
}

/* ---- setup -------------------------------------------------------------------------------- */

/* True when at least 90% of the pages of rank r's file are in the page cache. A large file
 * is sampled (1024 windows of 16 pages, evenly spread): a full mincore of a 100 GB file
 * would take a second. */
static bool file_cached(const struct snap_rank *r, long page)
{
	const uint64_t pg = (uint64_t)page, win = 16 * pg;
	unsigned char vec[16];
	uint64_t step = r->size / 1024 / pg * pg, total = 0, in = 0;
	if (step < win)
		step = win;
	for (uint64_t off = 0; off < r->size; off += step) {
		uint64_t len = r->size - off < win ? r->size - off : win;
		size_t np = (size_t)((len + pg - 1) / pg);
		if (mincore(r->fmap + off, len, vec))
			return false;
		for (size_t i = 0; i < np; i++)
			in += vec[i] & 1;
		total += np;
	}
	return (double)in >= 0.9 * (double)total;
}

/* Opens rank r's file, checks its size and header block against the manifest, and gives it
 * an image: a mapping of the file (see snap_open) or fresh memory. */
int snap__rank_check(const struct snap *s, int ri, int fd, char *err, size_t errsz)
{
	const struct snap_rank *r = &s->r[ri];
	unsigned char hdr[SNAP_ALIGN], want[SNAP_ALIGN];
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		return wk_errf(err, errsz, WK_EIO, "%s: not a regular file", r->path);
	if ((uint64_t)st.st_size < r->size)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: truncated: %lld bytes, the manifest "
			       "says %" PRIu64, r->path, (long long)st.st_size, r->size);
	if ((uint64_t)st.st_size > r->size)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: %lld bytes, the manifest says %" PRIu64,
			       r->path, (long long)st.st_size, r->size);
	if (pread(fd, hdr, SNAP_ALIGN, 0) != SNAP_ALIGN)
		return wk_errf(err, errsz, WK_EIO, "%s: cannot read the header block", r->path);
	if (memcmp(hdr, SNAP_MAGIC, 8))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not a wick snapshot rank file (bad "
			       "magic)", r->path);
	if (wk_get32(hdr + 8) != (uint32_t)s->version)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: snapshot format version %u, the "
			       "manifest's is %d", r->path, wk_get32(hdr + 8), s->version);
	snap__header(want, (uint32_t)s->version, (uint32_t)ri, (uint32_t)s->world, r->image_size,
		     r->nc, r->xxh3, r->meaning);
	if (!memcmp(hdr, want, 48) && memcmp(hdr, want, SNAP_ALIGN))
		return wk_errf(err, errsz, WK_EFORMAT, "%s/manifest.json: rank %d's tensor table or "
			       "the model's config is not what %s was written with (the manifest was "
			       "edited after the snapshot was written?); run wick snapshot again",
			       s->dir, ri, r->file);
	if (memcmp(hdr, want, SNAP_ALIGN))
		return wk_errf(err, errsz, WK_EFORMAT, "%s: header block does not match the "
			       "manifest (rank %u of %u, image %" PRIu64 " bytes, %" PRIu64 " chunks;"
			       " from another snapshot?)", r->path, wk_get32(hdr + 12),
			       wk_get32(hdr + 32), wk_get64(hdr + 16), wk_get64(hdr + 24));
	return WK_OK;
}

static int open_rank(struct snap *s, const struct snap_open_opts *o, long page, int ri,
		     char *err, size_t errsz)
{
	struct snap_rank *r = &s->r[ri];
	r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s (the "
			       "manifest lists it)", r->path, errno == ENOENT ? "missing" :
			       strerror(errno));
	int rc = snap__rank_check(s, ri, r->fd, err, errsz);
	if (rc != WK_OK)
		return rc;

	r->fd_direct = open(r->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	atomic_store(&r->direct_ok, r->fd_direct >= 0);
	void *m = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, r->fd, 0);
	r->fmap = m == MAP_FAILED ? NULL : m;

	if (o->manifest_only)
		return WK_OK; /* tensors keep data = NULL */
	bool all_raw = true;
	for (size_t i = 0; i < r->nc; i++)
		all_raw = all_raw && !r->c[i].lz4;
	if (r->image_size && r->fmap && all_raw && o->map >= 0 && !s->alloc.alloc &&
	    !s->on_sink && (o->map > 0 || file_cached(r, page))) {
		r->mapped = true;
		r->image = r->fmap + SNAP_ALIGN;
	} else if (r->image_size) {
		if (s->on_sink) {
			r->image = s->sink.image(s->sink.ctx, ri, r->image_size);
			if (r->image && ((uintptr_t)r->image % SNAP_SINK_ALIGN)) {
				s->sink.release(s->sink.ctx, ri, r->image);
				r->image = NULL;
				return wk_errf(err, errsz, WK_EINVAL, "%s: the sink's image is not "
					       "aligned to %d", r->path, SNAP_SINK_ALIGN);
			}
		} else if (s->alloc.alloc) {
			r->image = s->alloc.alloc(s->alloc.ctx, ri, r->image_size);
			if (r->image && ((uintptr_t)r->image % SNAP_ALIGN)) {
				s->alloc.release(s->alloc.ctx, ri, r->image, r->image_size);
				r->image = NULL;
				return wk_errf(err, errsz, WK_EINVAL, "%s: the allocator returned "
					       "memory not aligned to %d", r->path, SNAP_ALIGN);
			}
		} else {
			m = mmap(NULL, r->image_size, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			r->image = m == MAP_FAILED ? NULL : m;
			r->image_mmapped = r->image != NULL;
			if (r->image && r->image_size >= (2u << 20))
				madvise(r->image, r->image_size, MADV_HUGEPAGE); /* fewer faults */
		}
		if (!r->image)
			return wk_errf(err, errsz, WK_ENOMEM, "%s: cannot allocate its %" PRIu64
				       "-byte image%s", r->path, r->image_size,
				       s->on_sink ? " in the sink's memory" : "");
	}
	for (size_t i = 0; i < r->nt; i++)
		r->t[i].data = r->image ? r->image + r->t[i].offset : NULL;
	return WK_OK;
}

/* Groups the chunks of every rank into work items, interleaved across ranks. */
static int plan(struct restore *rs, uint64_t read_size, char *err, size_t errsz)
{
	struct snap *s = rs->s;
	size_t n = 0, *cur = calloc(SNAP_MAX_RANKS, sizeof *cur); /* world <= SNAP_MAX_RANKS */
	for (int r = 0; r < s->world; r++)
		n += s->r[r].nc;
	rs->w = malloc((n ? n : 1) * sizeof *rs->w);
	if (!cur || !rs->w) {
		free(cur);
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", s->dir);
	}
	for (bool any = true; any;) {
		any = false;
		for (int r = 0; r < s->world; r++) {
			const struct snap_rank *rk = &s->r[r];
			size_t i = cur[r];
			if (i >= rk->nc)
				continue;
			any = true;
			struct work *w = &rs->w[rs->nw++];
			w->rank = r;
			w->c0 = i;
			w->lz4 = rk->c[i].lz4;
			w->foff = rk->c[i].file_offset;
			uint64_t end = snap__align(rk->c[i].file_offset + rk->c[i].stored);
			for (i++; i < rk->nc && rk->c[i].lz4 == w->lz4; i++) {
				uint64_t e = snap__align(rk->c[i].file_offset + rk->c[i].stored);
				if (e - w->foff > read_size)
					break;
				end = e;
			}
			w->c1 = cur[r] = i;
			w->flen = end - w->foff;
			rs->total += w->flen;
			if (w->lz4 && w->flen > rs->stage_need)
				rs->stage_need = w->flen;
			uint64_t span = rk->c[i - 1].offset + rk->c[i - 1].size - rk->c[w->c0].offset;
			if (w->lz4 && span > rs->item_need)
				rs->item_need = span;
			if (!w->lz4 && w->flen > rs->raw_need)
				rs->raw_need = w->flen;
		}
	}
	free(cur);
	return WK_OK;
}

static void draw(uint64_t done, uint64_t total, double el)
{
	int width = 30, fill = total ? (int)((double)width * (double)done / (double)total) : width;
	double rate = el > 0 ? (double)done / el : 0;
	double eta = rate > 0 ? (double)(total - done) / rate : 0;
	fprintf(stderr, "\rrestore [%.*s%*s] %5.1f%%  %.2f/%.2f GB  %.2f GB/s  ETA %.0fs ", fill,
		"##############################", width - fill, "",
		total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1e9,
		(double)total / 1e9, rate / 1e9, eta);
}

/* Starts the readers and waits for them, drawing progress when asked. */
/* ---- prefaulting ----------------------------------------------------------------------------
 * Fresh anonymous memory costs a page fault and a zeroed page on first touch, which on a VM
 * can cost as much as the disk read itself. A reader that faults its destination inside
 * pread() waits for that; so one thread walks the images ahead of the readers and populates
 * them (MADV_POPULATE_WRITE), overlapping the faults with the reads in flight. */

struct prefault {
	struct snap *s;
	atomic_bool stop;
};

static void *prefault_main(void *arg)
{
	struct prefault *pf = arg;
	const uint64_t step = 32u << 20;
	for (int r = 0; r < pf->s->world; r++) {
		struct snap_rank *rk = &pf->s->r[r];
		if (!rk->image_mmapped || rk->mapped)
			continue;
		for (uint64_t off = 0; off < rk->image_size && !atomic_load(&pf->stop); off += step) {
			uint64_t len = rk->image_size - off < step ? rk->image_size - off : step;
			if (madvise(rk->image + off, len, MADV_POPULATE_WRITE) != 0)
				return NULL; /* old kernel: the readers fault as they go */
		}
	}
	return NULL;
}

static int run_readers(struct restore *rs, int nthreads, bool progress, char *err, size_t errsz)
{
	struct reader *rd = calloc((size_t)nthreads, sizeof *rd);
	int started = 0, rc = WK_OK;
	if (!rd)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", rs->s->dir);
	pthread_mutex_init(&rs->mu, NULL);
	pthread_cond_init(&rs->cv, NULL);
	rs->running = nthreads;
	for (int i = 0; i < nthreads; i++) {
		rd[i].rs = rs;
		if (pthread_create(&rd[i].th, NULL, reader_main, &rd[i]))
			break;
		started++;
	}
	pthread_mutex_lock(&rs->mu);
	rs->running -= nthreads - started;
	double t0 = wk_now();
	while (rs->running > 0) {
		if (!progress) {
			pthread_cond_wait(&rs->cv, &rs->mu);
			continue;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&rs->cv, &rs->mu, &ts);
		draw(atomic_load(&rs->done), rs->total, wk_now() - t0);
	}
	pthread_mutex_unlock(&rs->mu);
	if (progress)
		fprintf(stderr, "\r\033[K");
	for (int i = 0; i < started; i++) {
		pthread_join(rd[i].th, NULL);
		rs->s->tm.verify_s += rd[i].verify_s;
		rs->s->tm.decompress_s += rd[i].decompress_s;
	}
	for (int i = 0; i < nthreads; i++) {
		free(rd[i].stage);
		free(rd[i].vec);
		XXH3_freeState(rd[i].xs);
	}
	free(rd);
	pthread_cond_destroy(&rs->cv);
	pthread_mutex_destroy(&rs->mu);
	rs->s->tm.threads = started;
	if (started == 0 && rs->nw)
		rc = wk_errf(err, errsz, WK_ENOMEM, "%s: cannot start reader threads", rs->s->dir);
	else if (rs->rc)
		rc = wk_errf(err, errsz, rs->rc, "%s", rs->err);
	return rc;
}

/* ---- snap_open ---------------------------------------------------------------------------- */

int snap_open(const char *dir, const struct snap_open_opts *o, struct snap **out, char *err,
	      size_t errsz)
{
	struct snap_open_opts def = {.verify = true};
	struct restore rs = {0};
	struct snap *s = NULL;
	double t0 = wk_now();
	int rc;

	*out = NULL;
	if (!o)
		o = &def;
	if (!dir)
		return wk_errf(err, errsz, WK_EINVAL, "snapshot: no directory given");
	uint64_t read_size = o->read_size ? snap__align(o->read_size) : DEFAULT_READ;
	if (read_size > SNAP_MAX_CHUNK)
		read_size = SNAP_MAX_CHUNK;
	s = calloc(1, sizeof *s);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", dir);
	if (o->allocator) {
		if (!o->allocator->alloc || !o->allocator->release) {
			rc = wk_errf(err, errsz, WK_EINVAL, "%s: allocator without alloc/release",
				     dir);
			goto fail;
		}
		s->alloc = *o->allocator;
	}
	const struct snap_sink *k = o->manifest_only ? NULL : o->sink;
	if (k && (o->allocator || !k->image || !k->release || !k->stage_alloc ||
		  !k->stage_free || !k->put || !k->wait)) {
		rc = wk_errf(err, errsz, WK_EINVAL, "%s: %s", dir, o->allocator ? "both a sink and "
			     "an allocator" : "a sink without image/release/stage/put/wait");
		goto fail;
	}
	if ((rc = snap__manifest_load(dir, s, err, errsz)) ||
	    (rc = snap__files_check(s, err, errsz)) ||
	    (o->check && (rc = o->check(o->check_ctx, s->m, err, errsz))))
		goto fail;
	if (k && (!k->accept || k->accept(k->ctx, s->world))) {
		s->sink = *k;
		s->on_sink = true;
	}
	rs.page = sysconf(_SC_PAGESIZE);
	if (rs.page <= 0)
		rs.page = 4096;
	for (int r = 0; r < s->world; r++)
		if ((rc = open_rank(s, o, rs.page, r, err, errsz)))
			goto fail;
	if (o->manifest_only) {
		for (int r = 0; r < s->world; r++) {
			if (s->r[r].fmap)
				munmap(s->r[r].fmap, s->r[r].size);
			s->r[r].fmap = NULL;
			close(s->r[r].fd);
			if (s->r[r].fd_direct >= 0)
				close(s->r[r].fd_direct);
			s->r[r].fd = s->r[r].fd_direct = -1;
		}
		s->tm.total_s = s->tm.open_s = wk_now() - t0;
		*out = s;
		return WK_OK;
	}
	rs.s = s;
	rs.verify = o->verify;
	if ((rc = plan(&rs, read_size, err, errsz)))
		goto fail;
	rs.piece = o->sink_piece ? snap__align(o->sink_piece) : SNAP_SINK_PIECE;
	if (rs.piece > SNAP_MAX_CHUNK)
		rs.piece = SNAP_MAX_CHUNK;
	if (rs.piece > rs.raw_need && rs.raw_need) /* a small snapshot: no bigger than an item */
		rs.piece = rs.raw_need;
	s->tm.open_s = wk_now() - t0;

	/* Default: 4 per rank file, at most 16, and at most 2 per CPU: beyond that, threads only
	 * fight over cores and caches when the data comes from the page cache or lz4 (on 2
	 * cores, 8 threads restored a warm lz4 snapshot 2.5x slower than 2). Into a GPU too: on
	 * an H200 machine (16 CPUs) a warm one-rank 1.2 GB snapshot took 0.195 s with 4 threads
	 * and 0.361 s with 16 (not measured why; the suspect: each reader then pinned two
	 * staging buffers of a 16 MiB item, 128 MiB against 512 MiB of cudaHostAlloc, which is
	 * why raw chunks now go in pieces, SNAP_SINK_SLOTS of 2 MiB a reader: 24 and 96 MiB). */
	int nthreads = o->threads;
	if (nthreads <= 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = 4 * s->world < 16 ? 4 * s->world : 16;
		if (cpus > 0 && nthreads > 2 * cpus)
			nthreads = 2 * cpus < 4 ? 4 : (int)(2 * cpus);
	}
	if (nthreads > MAX_THREADS)
		nthreads = MAX_THREADS;
	if ((size_t)nthreads > rs.nw)
		nthreads = (int)rs.nw;
	double t1 = wk_now();
	struct prefault pf = {.s = s};
	atomic_init(&pf.stop, false);
	pthread_t pft;
	bool pf_on = pthread_create(&pft, NULL, prefault_main, &pf) == 0;
	if (nthreads > 0)
		rc = run_readers(&rs, nthreads, o->progress && isatty(2), err, errsz);
	if (pf_on) {
		atomic_store(&pf.stop, true);
		pthread_join(pft, NULL);
	}
	if (rc)
		goto fail;
	s->tm.read_s = wk_now() - t1;
	s->tm.bytes_read = rs.total;
	s->tm.bytes_direct = atomic_load(&rs.direct);
	s->tm.bytes_buffered = atomic_load(&rs.buffered);
	s->tm.bytes_mapped = atomic_load(&rs.mapped);
	for (int r = 0; r < s->world; r++) {
		s->tm.bytes_restored += s->r[r].image_size;
		/* The files are not read again: give back the descriptors and mappings now. */
		if (s->r[r].fmap && !s->r[r].mapped) {
			munmap(s->r[r].fmap, s->r[r].size);
			s->r[r].fmap = NULL;
		}
		close(s->r[r].fd);
		if (s->r[r].fd_direct >= 0)
			close(s->r[r].fd_direct);
		s->r[r].fd = s->r[r].fd_direct = -1;
	}
	s->tm.total_s = wk_now() - t0;
	free(rs.w);
	*out = s;
	return WK_OK;
fail:
	free(rs.w);
	snap__free(s);
	return rc;
}

void snap_close(struct snap *s)
{
	snap__free(s);
}

/* ---- accessors ---------------------------------------------------------------------------- */

bool snap_is_snapshot(const char *dir)
{
	char p[SNAP_PATH];
	struct stat st;
	if (!dir || snprintf(p, sizeof p, "%s/manifest.json", dir) >= (int)sizeof p)
		return false;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

json_t *snap_manifest(const struct snap *s)
{
	return s->m;
}

json_t *snap_config(const struct snap *s)
{
	return json_object_get(s->m, "config");
}

const char *snap_dir(const struct snap *s)
{
	return s->dir;
}

bool snap_lists_file(const struct snap *s, const char *name)
{
	size_t i;
	json_t *v;
	json_array_foreach(json_object_get(s->m, "files"), i, v)
		if (!strcmp(snap__file_name(v), name))
			return true;
	return false;
}

int snap_world(const struct snap *s)
{
	return s->world;
}

size_t snap_tensor_count(const struct snap *s, int rank)
{
	return rank >= 0 && rank < s->world ? s->r[rank].nt : 0;
}

const struct st_tensor *snap_tensor_at(const struct snap *s, int rank, size_t i)
{
	if (rank < 0 || rank >= s->world || i >= s->r[rank].nt)
		return NULL;
	return &s->r[rank].t[i];
}

const struct st_tensor *snap_tensor(const struct snap *s, int rank, const char *name)
{
	if (rank < 0 || rank >= s->world || !name)
		return NULL;
	const struct snap_rank *r = &s->r[rank];
	size_t lo = 0, hi = r->nt;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->t[r->by_name[mid]].name, name);
		if (c == 0)
			return &r->t[r->by_name[mid]];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *snap_tensor_layout(const struct snap *s, int rank, size_t i)
{
	if (rank < 0 || rank >= s->world || i >= s->r[rank].nt)
		return NULL;
	return s->r[rank].layout[i];
}

const void *snap_image(const struct snap *s, int rank, uint64_t *size)
{
	if (rank < 0 || rank >= s->world) {
		if (size)
			*size = 0;
		return NULL;
	}
	if (size)
		*size = s->r[rank].image_size;
	return s->r[rank].image;
}

const struct snap_timings *snap_timings(const struct snap *s)
{
	return &s->tm;
}

bool snap_on_sink(const struct snap *s)
{
	return s->on_sink;
}
