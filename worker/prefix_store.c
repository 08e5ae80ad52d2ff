/*
 * The prefix cache kept across restarts: see prefix_store.h for the why and the format.
 */
#include "worker/prefix_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "worker/sched.h"

#define MAGIC "WICKPFX1"
enum { VERSION = 1, HEAD = 32, ENTRY_HEAD = 32 };

static void path_of(const char *dir, uint64_t id, struct prefix_store_stats *st)
{
	snprintf(st->path, sizeof st->path, "%s/prefix-%016llx.wpc", dir, (unsigned long long)id);
}

/* An entry's cache bytes for n positions: eng_seq_bytes' fixed part plus a position's each
 * (so an entry longer than this engine's context can be sized and passed over). */
static uint64_t bytes_for(struct engine *e, uint64_t n)
{
	uint64_t one = eng_seq_bytes(e, 1), two = eng_seq_bytes(e, 2);
	return one + (two - one) * (n - 1);
}

/* An entry's hash: its header's first 24 bytes, its tokens' (little-endian) and its caches'. */
static uint64_t entry_hash(const unsigned char *head, const unsigned char *tok, size_t ntok,
			   const void *blob, size_t m)
{
	XXH3_state_t *h = XXH3_createState();
	if (!h)
		return 0;
	XXH3_64bits_reset(h);
	XXH3_64bits_update(h, head, 24);
	XXH3_64bits_update(h, tok, ntok);
	XXH3_64bits_update(h, blob, m);
	uint64_t v = XXH3_64bits_digest(h);
	XXH3_freeState(h);
	return v;
}

static int write_all(FILE *f, const void *p, size_t n)
{
	return fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* One entry's record into f; its bytes added to st. */
static int save_entry(FILE *f, struct engine *e, const struct sched_cache_entry *c,
		      struct prefix_store_stats *st, char *err, size_t errsz)
{
	size_t m = eng_seq_bytes(e, c->n), nt = (size_t)c->n * 4;
	unsigned char *buf = malloc(nt + m), head[ENTRY_HEAD] = {0};
	if (!buf)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory for a prefix of %d tokens",
			       c->n);
	for (int i = 0; i < c->n; i++)
		wk_put32(buf + 4 * i, (uint32_t)c->tok[i]);
	int rc = eng_seq_save(e, c->seq, c->n, buf + nt, m, err, errsz);
	if (rc == WK_OK) {
		wk_put32(head, (uint32_t)c->n);
		wk_put64(head + 8, c->key);
		wk_put64(head + 16, m);
		wk_put64(head + 24, entry_hash(head, buf, nt, buf + nt, m));
		if (write_all(f, head, sizeof head) || write_all(f, buf, nt + m))
			rc = wk_errf(err, errsz, WK_EIO, "%s: %s", st->path, strerror(errno));
	}
	free(buf);
	st->bytes += ENTRY_HEAD + nt + m;
	st->tokens += c->n;
	return rc;
}

/* Temporaries of this file (path.XXXXXX) older than 10 minutes: a writer killed mid-write
 * left them (a live one touches its own as it writes). */
static void tidy(const char *dir, const char *path)
{
	const char *base = strrchr(path, '/') + 1;
	size_t bl = strlen(base);
	DIR *d = opendir(dir);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char p[4400];
		struct stat sb;
		if (strncmp(de->d_name, base, bl) || de->d_name[bl] != '.' ||
		    strlen(de->d_name + bl + 1) != 6)
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && time(NULL) - sb.st_mtime > 600)
			unlink(p);
	}
	if (d)
		closedir(d);
}

/* Whether an entry of `bytes` more stays within lim: the file's size, and at the rate of the
 * bytes written so far (none yet: the entry is taken where the deadline has not passed) its
 * end before the deadline. */
static bool fits(const struct prefix_store_limits *lim, const struct prefix_store_stats *st,
		 uint64_t bytes, double t0)
{
	if (!lim)
		return true;
	if (lim->max_bytes && st->bytes + bytes > lim->max_bytes)
		return false;
	if (lim->deadline <= 0)
		return true;
	double now = wk_now(), spent = now - t0;
	if (now >= lim->deadline)
		return false;
	return st->bytes <= HEAD || spent <= 0 ||
	       now + spent * (double)bytes / (double)(st->bytes - HEAD) < lim->deadline;
}

/* What is wrong with an entry's header for engine e, or NULL. */
static const char *head_fault(struct engine *e, const unsigned char *eh)
{
	uint64_t n = wk_get32(eh);
	if (n < 1 || wk_get32(eh + 4) != 0)
		return "no tokens";
	return wk_get64(eh + 16) != bytes_for(e, n) ? "its caches' size is not this model's" : NULL;
}

/* Whether an entry's tokens and caches (buf: n tokens, then m bytes of caches) are ones
 * engine e takes: the checks past its checksum. WK_EFORMAT with what is wrong in why. */
static int entry_check(struct engine *e, const unsigned char *buf, uint64_t n, uint64_t m,
		       char *why, size_t wsz)
{
	for (uint64_t i = 0; i < n; i++) {
		int32_t t = (int32_t)wk_get32(buf + 4 * i);
		if (t < 0 || t >= eng_info(e)->vocab)
			return wk_errf(why, wsz, WK_EFORMAT, "a token outside the vocabulary");
	}
	int len, rc = eng_seq_check(e, buf + 4 * n, m, &len, why, wsz);
	if (rc == WK_OK && len != (int)n)
		rc = wk_errf(why, wsz, WK_EFORMAT, "its caches hold %d positions, not %d", len,
			     (int)n);
	return rc;
}

/* Whether one of our entries (ce[0..n), written or left out by a bound: the fresher copy)
 * holds what an older entry holds: the same key, and its tokens beginning with the older
 * one's (tok, nt little-endian i32). */
static bool covered(const struct sched_cache_entry *ce, int n, uint64_t key,
		    const unsigned char *tok, uint64_t nt)
{
	for (int i = 0; i < n; i++) {
		if (ce[i].key != key || (uint64_t)ce[i].n < nt)
			continue;
		uint64_t k = 0;
		while (k < nt && ce[i].tok[k] == (int)wk_get32(tok + 4 * k))
			k++;
		if (k == nt)
			return true;
	}
	return false;
}

/* The entries of the file already at st->path (another worker's, or this model's last)
 * that ours do not hold, appended to f after ours while lim allows and the file holds fewer
 * than `most` (what an engine like this one can read back): so that workers sharing a
 * directory keep the union, not the last one's alone. Each is checked against its hash and
 * copied as it is; the first damaged or cut one ends the merge, as does any error (the file
 * written so far stands). */
static void merge_older(FILE *f, struct engine *e, const struct sched_cache_entry *ce,
			int n_ours, uint64_t id, const struct prefix_store_limits *lim,
			struct prefix_store_stats *st, double t0)
{
	int most = eng_info(e)->max_seqs;
	FILE *old = fopen(st->path, "rbe");
	unsigned char head[HEAD], eh[ENTRY_HEAD], *buf = NULL;
	char why[WK_ERRSZ];
	struct stat sb;
	if (!old)
		return;
	uint64_t size = fstat(fileno(old), &sb) == 0 ? (uint64_t)sb.st_size : 0;
	if (fread(head, 1, sizeof head, old) != sizeof head || memcmp(head, MAGIC, 8) ||
	    wk_get64(head + 24) != XXH3_64bits(head, 24) || wk_get32(head + 8) != VERSION ||
	    wk_get64(head + 16) != id) {
		fclose(old);
		return;
	}
	for (uint32_t k = 0, n = wk_get32(head + 12); k < n && st->entries < most; k++) {
		if (fread(eh, 1, sizeof eh, old) != sizeof eh)
			break;
		uint64_t nt = wk_get32(eh), m = wk_get64(eh + 16), len = 4 * nt + m;
		if (head_fault(e, eh) || (uint64_t)ftello(old) + len > size)
			break;
		if (nt > (uint64_t)eng_info(e)->max_seq) { /* longer than this engine's context:
							     * not checked here, so not kept */
			if (fseeko(old, (off_t)len, SEEK_CUR) != 0)
				break;
			continue;
		}
		unsigned char *b = realloc(buf, len);
		if (!b)
			break;
		buf = b;
		if (fread(buf, 1, len, old) != len ||
		    entry_hash(eh, buf, 4 * nt, buf + 4 * nt, m) != wk_get64(eh + 24) ||
		    entry_check(e, buf, nt, m, why, sizeof why) != WK_OK)
			break;
		if (covered(ce, n_ours, wk_get64(eh + 8), buf, nt))
			continue;
		if (!fits(lim, st, ENTRY_HEAD + len, t0)) {
			st->skipped++;
			continue; /* (a smaller one after it may still fit) */
		}
		if (write_all(f, eh, sizeof eh) || write_all(f, buf, len))
			break;
		st->entries++;
		st->merged++;
		st->tokens += (long)nt;
		st->bytes += ENTRY_HEAD + len;
	}
	free(buf);
	fclose(old);
}

static int save_dir(const char *dir, char *err, size_t errsz)
{
	if (mkdir(dir, 0700) == 0 || errno == EEXIST)
		return WK_OK;
	return wk_errf(err, errsz, WK_EIO, "%s: %s", dir, strerror(errno));
}

int prefix_store_save(struct sched *s, struct engine *e, const char *dir, uint64_t id,
		      const struct prefix_store_limits *lim, struct prefix_store_stats *st,
		      char *err, size_t errsz)
{
	memset(st, 0, sizeof *st);
	path_of(dir, id, st);
	double t0 = wk_now();
	struct sched_cache_stats cs;
	sched_cache_stats(s, &cs);
	int rc = save_dir(dir, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (cs.entries == 0) /* nothing of ours: the older file is all a merge would hold */
		return WK_OK;
	tidy(dir, st->path);
	char tmp[4300]; /* unique, so that workers sharing DIR (a network volume) never meet */
	snprintf(tmp, sizeof tmp, "%s.XXXXXX", st->path);
	int fd = mkostemp(tmp, O_CLOEXEC); /* (mode 0600) */
	FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	unsigned char head[HEAD] = {0};
	memcpy(head, MAGIC, 8);
	wk_put32(head + 8, VERSION);
	wk_put32(head + 12, (uint32_t)cs.entries);
	wk_put64(head + 16, id);
	wk_put64(head + 24, XXH3_64bits(head, 24));
	st->bytes = HEAD;
	if (write_all(f, head, sizeof head))
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
	struct sched_cache_entry *ce = NULL;
	if (rc == WK_OK && sched_cache_entries(s, &ce) != WK_OK)
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; rc == WK_OK && i < cs.entries; i++) {
		const struct sched_cache_entry *c = &ce[i];
		if (!fits(lim, st, ENTRY_HEAD + (uint64_t)c->n * 4 + eng_seq_bytes(e, c->n), t0)) {
			st->skipped = cs.entries - i; /* (and those after it: the older ones) */
			break;
		}
		if ((rc = save_entry(f, e, c, st, err, errsz)) == WK_OK)
			st->entries++;
	}
	if (rc == WK_OK)
		merge_older(f, e, ce, cs.entries, id, lim, st, t0);
	free(ce);
	if (rc == WK_OK && st->entries != cs.entries) { /* the header counts what was written */
		wk_put32(head + 12, (uint32_t)st->entries);
		wk_put64(head + 24, XXH3_64bits(head, 24));
		if (fseeko(f, 0, SEEK_SET) != 0 || write_all(f, head, sizeof head))
			rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
	}
	if (rc == WK_OK && !st->entries) { /* nothing fit: the older file stays */
		fclose(f);
		unlink(tmp);
		st->bytes = 0;
		st->seconds = wk_now() - t0;
		return WK_OK;
	}
	if (rc == WK_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
	if (fclose(f) != 0 && rc == WK_OK)
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
	if (rc == WK_OK && rename(tmp, st->path) != 0)
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", st->path, strerror(errno));
	if (rc != WK_OK) {
		unlink(tmp);
		return rc;
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename, durable */
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	st->seconds = wk_now() - t0;
	return WK_OK;
}

static int bad(struct prefix_store_stats *st, char *err, size_t errsz, int entry,
	       const char *what)
{
	return wk_errf(err, errsz, WK_EFORMAT, "%s: entry %d: %s", st->path, entry + 1, what);
}

/* Entry k of f into a free sequence and the cache; *stop where no more can be taken. */
static int load_entry(FILE *f, struct sched *s, struct engine *e, int k,
		      struct prefix_store_stats *st, bool *stop, char *err, size_t errsz)
{
	unsigned char head[ENTRY_HEAD];
	if (fread(head, 1, sizeof head, f) != sizeof head)
		return bad(st, err, errsz, k, "the file ends inside it (cut short)");
	const struct eng_info *in = eng_info(e);
	uint64_t n = wk_get32(head), m = wk_get64(head + 16);
	const char *why = head_fault(e, head);
	if (why)
		return bad(st, err, errsz, k, why);
	st->bytes += ENTRY_HEAD + 4 * n + m;
	if (n > (uint64_t)in->max_seq) { /* a longer context then: passed over */
		st->skipped++;
		return fseeko(f, (off_t)(4 * n + m), SEEK_CUR) == 0
			       ? WK_OK : bad(st, err, errsz, k, "cut short");
	}
	unsigned char *buf = malloc(4 * n + m);
	int *tok = malloc(n * sizeof *tok), seq = -1, rc = WK_OK;
	if (!buf || !tok) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory for a prefix of %d tokens",
			     (int)n);
	} else if (fread(buf, 1, 4 * n + m, f) != 4 * n + m) {
		rc = bad(st, err, errsz, k, "the file ends inside it (cut short)");
	} else if (entry_hash(head, buf, 4 * n, buf + 4 * n, m) != wk_get64(head + 24)) {
		rc = bad(st, err, errsz, k, "its checksum does not match (the file is damaged)");
	} else {
		char why[WK_ERRSZ];
		if (entry_check(e, buf, n, m, why, sizeof why) != WK_OK)
			rc = bad(st, err, errsz, k, why);
		for (uint64_t i = 0; i < n && rc == WK_OK; i++)
			tok[i] = (int32_t)wk_get32(buf + 4 * i);
	}
	if (rc == WK_OK && eng_seq_alloc(e, &seq) != WK_OK) {
		*stop = true; /* every sequence is in use */
	} else if (rc == WK_OK) {
		char lerr[WK_ERRSZ];
		if (eng_seq_load(e, seq, buf + 4 * n, m, lerr, sizeof lerr) != WK_OK)
			rc = bad(st, err, errsz, k, lerr);
		else if (sched_cache_add(s, seq, tok, (int)n, wk_get64(head + 8)) != WK_OK)
			*stop = true; /* as many entries as slots */
		else
			seq = -1; /* the cache's now */
		if (seq >= 0)
			eng_seq_free(e, seq);
		if (rc == WK_OK && !*stop) {
			st->entries++;
			st->tokens += (long)n;
		}
	}
	free(buf);
	free(tok);
	return rc;
}

int prefix_store_load(struct sched *s, struct engine *e, const char *dir, uint64_t id,
		      struct prefix_store_stats *st, char *err, size_t errsz)
{
	memset(st, 0, sizeof *st);
	path_of(dir, id, st);
	double t0 = wk_now();
	FILE *f = fopen(st->path, "rbe");
	if (!f)
		return errno == ENOENT ? WK_OK
				       : wk_errf(err, errsz, WK_EIO, "%s: %s", st->path, strerror(errno));
	unsigned char head[HEAD];
	int rc = WK_OK;
	if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, MAGIC, 8))
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: not a wick prefix cache", st->path);
	else if (wk_get64(head + 24) != XXH3_64bits(head, 24))
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: its header's checksum does not match",
			     st->path);
	else if (wk_get32(head + 8) != VERSION)
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: version %u (this wick reads %d)",
			     st->path, wk_get32(head + 8), VERSION);
	else if (wk_get64(head + 16) != id)
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: made by another model or cache layout",
			     st->path);
	st->bytes = HEAD;
	int n = rc == WK_OK ? (int)wk_get32(head + 12) : 0;
	bool stop = false;
	for (int k = 0; rc == WK_OK && k < n; k++) {
		if (stop) {
			st->skipped += n - k;
			break;
		}
		rc = load_entry(f, s, e, k, st, &stop, err, errsz);
		if (stop && rc == WK_OK)
			st->skipped++;
	}
	fclose(f);
	st->seconds = wk_now() - t0;
	return rc;
}
