/*
 * prefetch.c - snap_prefetch: warm the page cache with a snapshot's files, so that a later
 * snap_open reads them from memory (snap_open reads mostly-cached ranges buffered).
 *
 * The manifest is validated first (a prefetch of a broken snapshot should fail where the
 * platform's hook can see it, not later in the worker). The files are cut into 32 MiB pieces,
 * and a few threads read the pieces through with buffered reads into a small scratch buffer:
 * unlike posix_fadvise(WILLNEED) or readahead(2), which may return before the data is in and
 * are capped by the readahead window, a read that returned means the pages are cached.
 * Pieces that mincore reports wholly cached are skipped, so a second prefetch is instant.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coldstart/snapshot_int.h"
#include "common/wk.h"

#define PIECE (32u << 20)
#define BUF (256u << 10) /* small enough to stay in L2: a warm read is then a fast memcpy */
#define MAX_FILES (SNAP_MAX_RANKS + 10000 + 1)
#define MAX_THREADS 64

struct pf_file {
	char *path;
	int fd;
	uint64_t size;
	unsigned char *map;   /* PROT_READ mapping for mincore, or NULL */
};

struct pf {
	struct pf_file *f;
	size_t nf;
	struct { size_t file; uint64_t off, len; } *piece;
	size_t np;
	atomic_size_t next;
	atomic_bool failed;
	_Atomic uint64_t bytes;
	long page;
	pthread_mutex_t mu;
	int rc;
	char err[WK_ERRSZ];
};

/* True when every page of [off, off + len) of f is in the page cache. */
static bool cached(const struct pf *p, const struct pf_file *f, uint64_t off, uint64_t len,
		   unsigned char *vec)
{
	if (!f->map)
		return false;
	uint64_t pg = (uint64_t)p->page;
	size_t np = (size_t)((len + pg - 1) / pg);
	if (mincore(f->map + off, len, vec))
		return false;
	for (size_t i = 0; i < np; i++)
		if (!(vec[i] & 1))
			return false;
	return true;
}

static void *pf_main(void *arg)
{
	struct pf *p = arg;
	unsigned char *buf = malloc(BUF), *vec = malloc(PIECE / 4096);
	char err[WK_ERRSZ];
	int rc = buf && vec ? WK_OK : wk_errf(err, sizeof err, WK_ENOMEM, "prefetch: out of memory");
	while (!rc && !atomic_load(&p->failed)) {
		size_t i = atomic_fetch_add(&p->next, 1);
		if (i >= p->np)
			break;
		const struct pf_file *f = &p->f[p->piece[i].file];
		uint64_t off = p->piece[i].off, end = off + p->piece[i].len;
		if (cached(p, f, off, end - off, vec))
			continue;
		while (off < end) {
			size_t want = end - off < BUF ? (size_t)(end - off) : BUF;
			ssize_t r = pread(f->fd, buf, want, (off_t)off);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				rc = wk_errf(err, sizeof err, WK_EIO, "%s: read at byte %" PRIu64
					     " failed: %s", f->path, off,
					     r < 0 ? strerror(errno) : "unexpected end of file");
				break;
			}
			off += (uint64_t)r;
			atomic_fetch_add(&p->bytes, (uint64_t)r);
		}
	}
	if (rc) {
		pthread_mutex_lock(&p->mu);
		if (!p->rc) {
			p->rc = rc;
			snprintf(p->err, sizeof p->err, "%s", err);
		}
		pthread_mutex_unlock(&p->mu);
		atomic_store(&p->failed, true);
	}
	free(buf);
	free(vec);
	return NULL;
}

static int add_file(struct pf *p, const char *dir, const char *name, char *err, size_t errsz)
{
	struct pf_file *f = &p->f[p->nf];
	struct stat st;
	if (asprintf(&f->path, "%s/%s", dir, name) < 0) {
		f->path = NULL;
		return wk_errf(err, errsz, WK_ENOMEM, "prefetch: out of memory");
	}
	f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
	p->nf++;
	if (f->fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s",
			       f->path, strerror(errno));
	if (fstat(f->fd, &st) || !S_ISREG(st.st_mode))
		return wk_errf(err, errsz, WK_EIO, "%s: not a regular file", f->path);
	f->size = (uint64_t)st.st_size;
	if (f->size) {
		void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
		f->map = m == MAP_FAILED ? NULL : m;
	}
	posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a larger readahead window */
	return WK_OK;
}

int snap_prefetch_stats(const char *dir, int threads, struct snap_prefetch_stats *stats,
			char *err, size_t errsz)
{
	struct snap *s = NULL;
	struct pf p = {0};
	pthread_t th[MAX_THREADS];
	json_t *files, *v;
	size_t i;
	int started = 0, rc;

	if (stats)
		memset(stats, 0, sizeof *stats);
	if (!dir)
		return wk_errf(err, errsz, WK_EINVAL, "prefetch: no directory given");
	s = calloc(1, sizeof *s);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "prefetch: out of memory");
	if ((rc = snap__manifest_load(dir, s, err, errsz)) ||
	    (rc = snap__files_check(s, err, errsz)))
		goto fail;
	files = json_object_get(s->m, "files");
	p.f = calloc(MAX_FILES, sizeof *p.f);
	if (!p.f) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "prefetch: out of memory");
		goto fail;
	}
	for (i = 0; i < MAX_FILES; i++)
		p.f[i].fd = -1;
	if ((rc = add_file(&p, dir, "manifest.json", err, errsz)))
		goto fail;
	/* each rank file checked as a restore checks it (size, header), so that the deploy gate
	 * (ExecStartPre, an init container) fails on a damaged snapshot instead of passing it
	 * to a worker that then cannot start */
	for (int r = 0; r < s->world; r++)
		if ((rc = add_file(&p, dir, s->r[r].file, err, errsz)) ||
		    (rc = snap__rank_check(s, r, p.f[p.nf - 1].fd, err, errsz)))
			goto fail;
	json_array_foreach(files, i, v)
		if ((rc = add_file(&p, dir, snap__file_name(v), err, errsz)))
			goto fail;

	size_t np = 0;
	for (i = 0; i < p.nf; i++)
		np += (size_t)((p.f[i].size + PIECE - 1) / PIECE);
	p.piece = malloc((np ? np : 1) * sizeof *p.piece);
	if (!p.piece) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "prefetch: out of memory");
		goto fail;
	}
	/* Interleave the files, so that every rank file streams at once. */
	for (uint64_t off = 0; p.np < np; off += PIECE)
		for (i = 0; i < p.nf; i++)
			if (off < p.f[i].size) {
				p.piece[p.np].file = i;
				p.piece[p.np].off = off;
				p.piece[p.np].len = p.f[i].size - off < PIECE ? p.f[i].size - off
									      : PIECE;
				p.np++;
			}
	p.page = sysconf(_SC_PAGESIZE);
	if (p.page <= 0 || PIECE % (uint64_t)p.page)
		p.page = 4096; /* pieces must start on a page for mincore; else it just fails */
	if (threads <= 0)
		threads = 4;
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;
	pthread_mutex_init(&p.mu, NULL);
	for (int t = 0; t < threads && (size_t)t < p.np; t++) {
		if (pthread_create(&th[t], NULL, pf_main, &p))
			break;
		started++;
	}
	for (int t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	pthread_mutex_destroy(&p.mu);
	if (p.np && !started)
		rc = wk_errf(err, errsz, WK_ENOMEM, "prefetch: cannot start threads");
	else if (p.rc)
		rc = wk_errf(err, errsz, p.rc, "%s", p.err);
	if (stats) {
		stats->bytes_read = atomic_load(&p.bytes);
		stats->files = p.nf;
		for (i = 0; i < p.nf; i++)
			stats->bytes += p.f[i].size;
	}
fail:
	for (i = 0; p.f && i < p.nf; i++) {
		if (p.f[i].map)
			munmap(p.f[i].map, p.f[i].size);
		if (p.f[i].fd >= 0)
			close(p.f[i].fd);
		free(p.f[i].path);
	}
	free(p.f);
	free(p.piece);
	snap__free(s);
	return rc;
}

int snap_prefetch(const char *dir, int threads, char *err, size_t errsz)
{
	return snap_prefetch_stats(dir, threads, NULL, err, errsz);
}
