/*
 * queue_spool.c - spool:DIR, the embedded queue: a directory, no server.
 *
 * Layout (a contract other tools rely on; every directory is created with mode 0700):
 *   DIR/tmp/       files being written (submit: <id>.json; results: r.<pid>.<id>)
 *   DIR/new/       queued jobs: <id>.json, or <id>~<n>.json for a job handed back after n
 *                  deliveries (release, or reclaim by a worker that is not taking)
 *   DIR/claimed/   jobs being run: <id>~<attempt>~<pid>~<lease expiry, unix ms>
 *   DIR/done/      results: <id>.json, one per id, written tmp + fsync + rename + dir fsync
 *   DIR/failed/    inputs that could not be parsed, were too large, were not regular files
 *                  (moved as they are: a link is never followed), had names that are not job
 *                  ids (no result: no id to key it), or were dead-lettered
 *   DIR/cancel/    an empty file <id> cancels that job
 *
 * Claiming is rename(2): exactly one of several racing workers wins a file. A claim is live
 * while its expiry is in the future and its pid exists (kill(pid, 0)); otherwise any worker
 * may take it over by renaming it to its own claim name with attempt + 1 (again one winner).
 * The pid test assumes the workers share one machine and pid namespace; across machines
 * (a shared file system) only the expiry protects a claim, so extend leases well before
 * they end. A worker's own pid gets no exemption: a restarted container often reuses the
 * pid of its previous life, and those claims come back once their lease ends.
 *
 * Durability: a result reaches done/ only after its data is on disk (fsync of the file, or
 * one syncfs for a batch: group commit), and the claim is removed only after done/ itself
 * has been fsync'd. A crash in between leaves both; the next taker sees done/<id>.json and
 * drops the claim without running the job again. The first result stored for an id wins
 * (renameat2 RENAME_NOREPLACE).
 */
#include "worker/queue_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"

#define PENDING_MAX 4096   /* names read from new/ per directory scan */
#define NAME_MAX_ 200      /* our names: id (128) + suffixes */

enum { D_TMP, D_NEW, D_CLAIMED, D_DONE, D_FAILED, D_CANCEL, D_N };
static const char *const dir_names[D_N] = {"tmp", "new", "claimed", "done", "failed", "cancel"};

struct spool {
	char path[PATH_MAX];
	int fd[D_N];
	int ino;               /* inotify on new/, or -1 */
	double next_reclaim;   /* unix seconds */
	char **pending;        /* names from the last scan of new/ */
	int n_pending, i_pending;
	long pid;
	/* Spare inodes: the claim file of a finished job is renamed into tmp/ as
	 * "s.<pid>.<seq>" instead of unlinked, and the next result is written into it. ext4
	 * spends most of a create scanning for an inode that was not recently deleted; with a
	 * create and an unlink per job that scan bounded the spool near 1,000 jobs/s. */
	unsigned long *spare;  /* seq numbers of the spares in tmp/ */
	int n_spare;
	unsigned long spare_seq;
};

#define SPARE_MAX 4096

static double now_unix(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- names: pure functions ---- */

/* Parses a claim name "<id>~<attempt>~<pid>~<expiry_ms>". Returns false when it is not one. */
bool queue_spool_parse_claim(const char *name, char *id, int *attempt, long *pid, long long *expiry_ms)
{
	const char *t3 = strrchr(name, '~');
	if (!t3)
		return false;
	const char *t2 = t3 - 1, *t1;
	while (t2 > name && *t2 != '~')
		t2--;
	if (t2 <= name)
		return false;
	t1 = t2 - 1;
	while (t1 > name && *t1 != '~')
		t1--;
	if (t1 <= name || *t1 != '~')
		return false;
	size_t idlen = (size_t)(t1 - name);
	if (idlen > JOB_ID_MAX)
		return false;
	char *end;
	long a = strtol(t1 + 1, &end, 10);
	if (end != t2 || a < 1 || a > 1000000)
		return false;
	long p = strtol(t2 + 1, &end, 10);
	if (end != t3 || p < 1)
		return false;
	long long e = strtoll(t3 + 1, &end, 10);
	if (*end || end == t3 + 1 || e < 0)
		return false;
	memcpy(id, name, idlen);
	id[idlen] = 0;
	if (!job_id_valid(id))
		return false;
	*attempt = (int)a;
	*pid = p;
	*expiry_ms = e;
	return true;
}

/* Parses a new/ name "<id>.json" or "<id>~<n>.json" (n earlier deliveries). */
bool queue_spool_parse_new(const char *name, char *id, int *prev)
{
	size_t len = strlen(name);
	if (len < 6 || strcmp(name + len - 5, ".json") || name[0] == '.')
		return false;
	len -= 5;
	*prev = 0;
	const char *t = memchr(name, '~', len);
	if (t) {
		char *end;
		long n = strtol(t + 1, &end, 10);
		if (end != name + len || end == t + 1 || n < 0 || n > 1000000)
			return false;
		*prev = (int)n;
		len = (size_t)(t - name);
	}
	if (len > JOB_ID_MAX)
		return false;
	memcpy(id, name, len);
	id[len] = 0;
	return job_id_valid(id);
}

static void claim_name(char *out, size_t outsz, const char *id, int attempt, long pid, double expiry)
{
	snprintf(out, outsz, "%s~%d~%ld~%lld", id, attempt, pid, (long long)(expiry * 1000.0));
}

/* ---- file helpers ---- */

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static const char *file_kind(mode_t m)
{
	return S_ISDIR(m) ? "a directory" : S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a fifo"
	       : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a plain file";
}

/* Reads dir/name (at most max bytes) into a malloc'd NUL-terminated buffer; messages call it
 * shown (NULL: name). Anything but a regular file is WK_EFORMAT without being read: a job
 * file is data someone put in new/, and a link there must not make the worker read (and
 * quote in an error) a file it points to; O_NONBLOCK keeps a fifo from hanging the open. */
static int read_at(int dfd, const char *name, const char *shown, size_t max, char **buf,
		   size_t *len, double *mtime, char *err, size_t errsz)
{
	if (!shown)
		shown = name;
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0 && (errno == ELOOP || errno == ENXIO)) /* ENXIO: a socket */
		return wk_errf(err, errsz, WK_EFORMAT, "%s is %s, not a regular file", shown,
			       errno == ELOOP ? "a symbolic link" : "a socket");
	if (fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s", shown,
			       strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", shown, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return wk_errf(err, errsz, WK_EFORMAT, "%s is %s, not a regular file", shown,
			       file_kind(st.st_mode));
	}
	if ((size_t)st.st_size > max) {
		close(fd);
		return wk_errf(err, errsz, WK_ELIMIT, "%s: %lld bytes, more than the limit of %zu", shown,
			       (long long)st.st_size, max);
	}
	char *p = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (p && got < (size_t)st.st_size) {
		ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (!p)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	p[got] = 0;
	*buf = p;
	*len = got;
	if (mtime)
		*mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
	return WK_OK;
}

/* Writes tmp/tmpname with data (no fsync); returns the open fd (caller syncs and closes). */
static int write_tmp(struct spool *s, const char *tmpname, const char *data, size_t len)
{
	int fd = openat(s->fd[D_TMP], tmpname, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
			0600);
	if (fd < 0)
		return -1;
	if (write_all(fd, data, len) != 0) {
		close(fd);
		unlinkat(s->fd[D_TMP], tmpname, 0);
		return -1;
	}
	return fd;
}

static int sync_dir(struct queue *q, int d)
{
	q->st.syncs++;
	return fsync(((struct spool *)q->impl)->fd[d]);
}

/* Stores result json for id as done/<id>.json: tmp file, fsync, rename (first result wins),
 * dir fsync. For one result; complete() does the batched version. */
static int store_result(struct queue *q, const char *id, const char *json, size_t len, char *err,
			size_t errsz)
{
	struct spool *s = q->impl;
	char tmp[NAME_MAX_ + 32], fin[NAME_MAX_];
	snprintf(tmp, sizeof tmp, "r.%ld.%s", s->pid, id);
	snprintf(fin, sizeof fin, "%s.json", id);
	int fd = write_tmp(s, tmp, json, len);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s/tmp/%s: %s", s->path, tmp, strerror(errno));
	q->st.syncs++;
	if (fsync(fd) != 0) {
		close(fd);
		unlinkat(s->fd[D_TMP], tmp, 0);
		return wk_errf(err, errsz, WK_EIO, "%s/tmp/%s: fsync: %s", s->path, tmp, strerror(errno));
	}
	close(fd);
	if (renameat2(s->fd[D_TMP], tmp, s->fd[D_DONE], fin, RENAME_NOREPLACE) != 0) {
		int e = errno;
		unlinkat(s->fd[D_TMP], tmp, 0);
		if (e != EEXIST)
			return wk_errf(err, errsz, WK_EIO, "%s/done/%s: %s", s->path, fin, strerror(e));
	}
	if (sync_dir(q, D_DONE) != 0)
		return wk_errf(err, errsz, WK_EIO, "%s/done: fsync: %s", s->path, strerror(errno));
	return WK_OK;
}

/* ---- open / close ---- */

/* A directory stream of dir `which` on an open file description of its own (a dup() would
 * share, and exhaust, the directory offset of s->fd). NULL when it cannot be opened. */
static DIR *open_dir(struct spool *s, int which)
{
	int fd = openat(s->fd[which], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d && fd >= 0) {
		int e = errno; /* for the caller's message */
		close(fd);
		errno = e;
	}
	return d;
}

/* Removes what dead processes left in tmp/: spares ("s.<pid>.<n>"), half-written results
 * ("r.<pid>.<id>"). Names of live pids stay. */
static void sweep_tmp(struct spool *s)
{
	DIR *d = open_dir(s, D_TMP);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		long pid;
		char kind;
		if (sscanf(e->d_name, "%c.%ld.", &kind, &pid) != 2 || (kind != 's' && kind != 'r') ||
		    pid <= 0)
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		unlinkat(s->fd[D_TMP], e->d_name, 0);
	}
	closedir(d);
}

static void spool_close(struct queue *q)
{
	struct spool *s = q->impl;
	if (!s)
		return;
	if (s->ino >= 0)
		close(s->ino);
	for (int i = s->i_pending; i < s->n_pending; i++)
		free(s->pending[i]);
	free(s->pending);
	for (int i = 0; i < s->n_spare && s->fd[D_TMP] >= 0; i++) {
		char name[64];
		snprintf(name, sizeof name, "s.%ld.%lu", s->pid, s->spare[i]);
		unlinkat(s->fd[D_TMP], name, 0);
	}
	free(s->spare);
	for (int i = 0; i < D_N; i++)
		if (s->fd[i] >= 0)
			close(s->fd[i]);
	free(s);
	q->impl = NULL;
}

static int spool_open(struct queue *q, const char *dir, char *err, size_t errsz)
{
	if (!*dir)
		return wk_errf(err, errsz, WK_EINVAL, "spool: needs a directory (spool:DIR)");
	if (strlen(dir) >= PATH_MAX - 16)
		return wk_errf(err, errsz, WK_ELIMIT, "spool: directory path too long");
	struct spool *s = calloc(1, sizeof *s);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; i < D_N; i++)
		s->fd[i] = -1;
	s->ino = -1;
	s->pid = (long)getpid();
	snprintf(s->path, sizeof s->path, "%s", dir);
	q->impl = s;
	int root;
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		wk_errf(err, errsz, WK_EIO, "spool %s: %s", dir, strerror(errno));
		goto fail;
	}
	if ((root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		wk_errf(err, errsz, WK_EIO, "spool %s: %s", dir, strerror(errno));
		goto fail;
	}
	for (int i = 0; i < D_N; i++) {
		if (mkdirat(root, dir_names[i], 0700) != 0 && errno != EEXIST) {
			wk_errf(err, errsz, WK_EIO, "spool %s/%s: %s", dir, dir_names[i], strerror(errno));
			close(root);
			goto fail;
		}
		if ((s->fd[i] = openat(root, dir_names[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
			wk_errf(err, errsz, WK_EIO, "spool %s/%s: %s", dir, dir_names[i], strerror(errno));
			close(root);
			goto fail;
		}
	}
	close(root);
	s->spare = malloc(SPARE_MAX * sizeof *s->spare);
	if (!s->spare) {
		wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto fail;
	}
	sweep_tmp(s);
	return WK_OK;
fail:
	spool_close(q);
	return WK_EIO;
}

/* ---- delivering one claimed file ---- */

static bool move_to_failed(struct queue *q, const char *claim, const char *id)
{
	struct spool *s = q->impl;
	char fin[NAME_MAX_];
	snprintf(fin, sizeof fin, "%s.json", id);
	if (renameat(s->fd[D_CLAIMED], claim, s->fd[D_FAILED], fin) != 0)
		return false;
	sync_dir(q, D_FAILED);
	return true;
}

/* Turns the claim `claim` of id into a delivered job in *j, or handles it and returns false:
 * dead-letter past max_deliveries, already done, too large, not a regular file. from names
 * the file as it was found (new/<name> or claimed/<name>) for messages. */
static bool deliver(struct queue *q, const char *claim, const char *from, const char *id,
		    int attempt, struct queue_job *j)
{
	struct spool *s = q->impl;
	char fin[NAME_MAX_], msg[256];
	snprintf(fin, sizeof fin, "%s.json", id);
	if (faccessat(s->fd[D_DONE], fin, F_OK, 0) == 0) {
		unlinkat(s->fd[D_CLAIMED], claim, 0);
		q->st.redelivered_done++;
		return false;
	}
	if (attempt > q->o.max_deliveries) {
		snprintf(msg, sizeof msg,
			 "dead-lettered: delivered %d times without a result (max_deliveries %d)",
			 attempt - 1, q->o.max_deliveries);
		size_t len;
		char *res = queue_error_result(q, id, JOB_EINTERNAL, msg, attempt - 1, &len);
		if (res && store_result(q, id, res, len, NULL, 0) == WK_OK) {
			move_to_failed(q, claim, id);
			q->st.dead_lettered++;
		}
		free(res);
		return false;
	}
	char *body;
	size_t len;
	double mtime = 0;
	int rc = read_at(s->fd[D_CLAIMED], claim, from, q->o.max_body, &body, &len, &mtime, msg,
			 sizeof msg);
	if (rc == WK_ELIMIT || rc == WK_EFORMAT) { /* too large, or not a regular file */
		size_t rlen;
		char *res = queue_error_result(q, id, JOB_EINVALID_INPUT, msg, attempt, &rlen);
		if (res && store_result(q, id, res, rlen, NULL, 0) == WK_OK) {
			bool moved = move_to_failed(q, claim, id);
			queue_refused(q, id, "%s; %s failed/%s", msg,
				      moved ? "moved to" : "FAILED result stored, but not moved to", fin);
		}
		free(res);
		return false;
	}
	if (rc != WK_OK)
		return false; /* gone (reclaimed under us) or unreadable: leave it to the lease */
	memset(j, 0, sizeof *j);
	snprintf(j->id, sizeof j->id, "%s", id);
	snprintf(j->handle, sizeof j->handle, "%s", claim);
	j->body = body;
	j->len = len;
	j->attempt = attempt;
	j->enqueued_at = mtime;
	j->cancelled = faccessat(s->fd[D_CANCEL], id, F_OK, 0) == 0;
	return true;
}

/* ---- take ---- */

static bool alive(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Takes over claims whose lease expired or whose owner is gone. */
static void reclaim(struct queue *q, struct queue_job *jobs, int max, int *n)
{
	struct spool *s = q->impl;
	DIR *d = open_dir(s, D_CLAIMED);
	if (!d)
		return;
	double now = now_unix();
	struct dirent *de;
	while (*n < max && (de = readdir(d))) {
		char id[JOB_ID_MAX + 1], claim[NAME_MAX_];
		int attempt;
		long pid;
		long long exp_ms;
		if (de->d_name[0] == '.' || !queue_spool_parse_claim(de->d_name, id, &attempt, &pid, &exp_ms))
			continue;
		/* our own pid is not special: in a container a restarted worker often gets the pid
		 * of its previous life, whose claims must still come back once their lease ends */
		if ((double)exp_ms / 1000.0 > now && alive(pid))
			continue;
		claim_name(claim, sizeof claim, id, attempt + 1, s->pid, now + q->o.lease_s);
		if (renameat(s->fd[D_CLAIMED], de->d_name, s->fd[D_CLAIMED], claim) != 0)
			continue; /* another worker won it */
		q->st.reclaimed++;
		char from[NAME_MAX_ + 16];
		snprintf(from, sizeof from, "claimed/%s", claim);
		if (deliver(q, claim, from, id, attempt + 1, &jobs[*n]))
			(*n)++;
	}
	closedir(d);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads up to PENDING_MAX names from new/ into s->pending. */
static void scan_new(struct spool *s)
{
	for (int i = s->i_pending; i < s->n_pending; i++)
		free(s->pending[i]);
	s->n_pending = s->i_pending = 0;
	if (!s->pending && !(s->pending = malloc(PENDING_MAX * sizeof *s->pending)))
		return;
	DIR *d = open_dir(s, D_NEW);
	if (!d)
		return;
	struct dirent *de;
	while (s->n_pending < PENDING_MAX && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char *p = strdup(de->d_name);
		if (!p)
			break;
		s->pending[s->n_pending++] = p;
	}
	closedir(d);
	/* names, not arrival order: sorting makes several workers contend less than readdir
	 * order would, since each starts where the others are not (it does not give FIFO) */
	qsort(s->pending, (size_t)s->n_pending, sizeof *s->pending, cmp_str);
	if (s->pid & 1) /* odd pids take from the end: two workers rarely fight for one file */
		for (int i = 0; i < s->n_pending / 2; i++) {
			char *t = s->pending[i];
			s->pending[i] = s->pending[s->n_pending - 1 - i];
			s->pending[s->n_pending - 1 - i] = t;
		}
}

/* A *.json file in new/ whose name is not "<id>.json" or "<id>~<n>.json" moves to failed/
 * under its own name, with a log line. It gets no result: results are keyed by id, and the
 * name holds none that can be trusted (for "s-x~abc.json" the stem "s-x" is a valid id,
 * but a FAILED result under it would be taken for the result of a real job s-x, which would
 * then never run). Other names (no .json, hidden) are not ours and stay. If the move fails
 * (failed/ already holds that name) the file stays in new/, unlogged: a line per scan would
 * flood the log. */
static void refuse_name(struct queue *q, const char *name)
{
	struct spool *s = q->impl;
	size_t len = strlen(name);
	if (len <= 5 || strcmp(name + len - 5, ".json") || name[0] == '.')
		return;
	if (renameat(s->fd[D_NEW], name, s->fd[D_FAILED], name) != 0)
		return; /* taken by another worker, or failed/ holds the name */
	sync_dir(q, D_FAILED);
	char quoted[3 * NAME_MAX_];
	queue_quote(quoted, sizeof quoted, name, len);
	queue_refused(q, NULL,
		      "'new/%s': the name is not a job id ([A-Za-z0-9._-]{1,%d}.json, or ID~N.json after N "
		      "deliveries); moved to failed/ without a result",
		      quoted, JOB_ID_MAX);
}

static void take_new(struct queue *q, struct queue_job *jobs, int max, int *n)
{
	struct spool *s = q->impl;
	bool rescanned = false;
	while (*n < max) {
		if (s->i_pending >= s->n_pending) {
			if (rescanned)
				return;
			scan_new(s);
			rescanned = true;
			if (s->n_pending == 0)
				return;
		}
		char *name = s->pending[s->i_pending++];
		char id[JOB_ID_MAX + 1], claim[NAME_MAX_];
		int prev;
		if (!queue_spool_parse_new(name, id, &prev)) {
			refuse_name(q, name);
			free(name);
			continue;
		}
		char from[NAME_MAX_ + 16];
		snprintf(from, sizeof from, "new/%.*s", NAME_MAX_, name);
		claim_name(claim, sizeof claim, id, prev + 1, s->pid, now_unix() + q->o.lease_s);
		int rc = renameat(s->fd[D_NEW], name, s->fd[D_CLAIMED], claim);
		free(name);
		if (rc != 0)
			continue; /* taken by another worker */
		if (deliver(q, claim, from, id, prev + 1, &jobs[*n]))
			(*n)++;
	}
}

static void watch_new(struct spool *s)
{
	if (s->ino >= 0)
		return;
	s->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (s->ino < 0)
		return;
	char p[PATH_MAX + 8];
	snprintf(p, sizeof p, "%s/new", s->path);
	if (inotify_add_watch(s->ino, p, IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
		close(s->ino);
		s->ino = -1;
	}
}

/* Sleeps until new/ changes or ms pass. */
static void wait_new(struct spool *s, int ms)
{
	if (s->ino < 0) {
		poll(NULL, 0, ms < 20 ? ms : 20);
		return;
	}
	struct pollfd p = {.fd = s->ino, .events = POLLIN};
	if (poll(&p, 1, ms) > 0) {
		char buf[4096];
		while (read(s->ino, buf, sizeof buf) > 0) {
		}
	}
}

static int spool_take(struct queue *q, struct queue_job *jobs, int max, double wait_s, int *n,
		      char *err, size_t errsz)
{
	(void)err, (void)errsz;
	struct spool *s = q->impl;
	double deadline = wk_now() + wait_s;
	if (wait_s > 0)
		watch_new(s); /* before looking, so an arrival after the scan still wakes us */
	for (;;) {
		double now = now_unix();
		if (now >= s->next_reclaim) {
			reclaim(q, jobs, max, n);
			double step = q->o.lease_s / 4;
			s->next_reclaim = now + (step < 1 ? step : 1);
		}
		take_new(q, jobs, max, n);
		double left = deadline - wk_now();
		if (*n > 0 || left <= 0)
			return WK_OK;
		double until_reclaim = s->next_reclaim - now_unix();
		if (until_reclaim < left)
			left = until_reclaim > 0.001 ? until_reclaim : 0.001;
		wait_new(s, (int)(left * 1000) + 1);
	}
}

/* ---- complete, extend, release, cancel ---- */

/* Whether the claim `claim` may become a spare that a later result is written into: the
 * input's inode carries whoever made it in new/, and a result must not inherit that. Only a
 * regular file of ours with no other link qualifies (a hard-linked input would have its other
 * name overwritten by the result), and it is set to 0600 here, since results are 0600 like
 * every file the spool creates (an input written as 0644 would otherwise give a 0644 result). */
static bool spare_ok(struct spool *s, const char *claim)
{
	struct stat st;
	if (fstatat(s->fd[D_CLAIMED], claim, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_nlink != 1 || st.st_uid != geteuid())
		return false;
	return (st.st_mode & 07777) == 0600 || fchmodat(s->fd[D_CLAIMED], claim, 0600, 0) == 0;
}

static int spool_complete(struct queue *q, struct queue_result *r, int n, char *err, size_t errsz)
{
	struct spool *s = q->impl;
	int first = WK_OK;
	int *fds = malloc((size_t)n * sizeof *fds);
	if (!fds)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	char tmp[NAME_MAX_ + 32], fin[NAME_MAX_];
	/* 1. write every result to tmp/ (into a spare inode when there is one) */
	for (int i = 0; i < n; i++) {
		snprintf(tmp, sizeof tmp, "r.%ld.%s", s->pid, r[i].job->id);
		if (s->n_spare > 0) {
			char spare[64];
			snprintf(spare, sizeof spare, "s.%ld.%lu", s->pid, s->spare[--s->n_spare]);
			renameat(s->fd[D_TMP], spare, s->fd[D_TMP], tmp); /* on failure: a create */
		}
		fds[i] = write_tmp(s, tmp, r[i].json, r[i].len);
		if (fds[i] < 0) {
			r[i].rc = wk_errf(err, errsz, WK_EIO, "%s/tmp/%s: %s", s->path, tmp, strerror(errno));
			if (first == WK_OK)
				first = r[i].rc;
		}
	}
	/* 2. make their data durable: one fsync each for a few, one syncfs for a batch */
	int syncfd = -1;
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			syncfd = fds[i];
	bool group = n >= 4;
	if (group && syncfd >= 0) {
		q->st.syncs++;
		if (syncfs(syncfd) != 0)
			group = false; /* fall back to fsync each */
	}
	for (int i = 0; i < n; i++) {
		if (fds[i] < 0)
			continue;
		if (!group) {
			q->st.syncs++;
			if (fsync(fds[i]) != 0) {
				r[i].rc = wk_errf(err, errsz, WK_EIO, "%s/tmp: fsync: %s", s->path, strerror(errno));
				if (first == WK_OK)
					first = r[i].rc;
			}
		}
		close(fds[i]);
	}
	free(fds);
	/* 3. publish them in done/, then make done/ durable */
	for (int i = 0; i < n; i++) {
		snprintf(tmp, sizeof tmp, "r.%ld.%s", s->pid, r[i].job->id);
		if (r[i].rc != WK_OK) {
			unlinkat(s->fd[D_TMP], tmp, 0);
			continue;
		}
		snprintf(fin, sizeof fin, "%s.json", r[i].job->id);
		if (renameat2(s->fd[D_TMP], tmp, s->fd[D_DONE], fin, RENAME_NOREPLACE) != 0) {
			int e = errno;
			unlinkat(s->fd[D_TMP], tmp, 0);
			if (e != EEXIST) { /* EEXIST: an earlier delivery stored it; that result stands */
				r[i].rc = wk_errf(err, errsz, WK_EIO, "%s/done/%s: %s", s->path, fin, strerror(e));
				if (first == WK_OK)
					first = r[i].rc;
			} else {
				r[i].superseded = true;
			}
		}
	}
	if (sync_dir(q, D_DONE) != 0) {
		for (int i = 0; i < n; i++)
			r[i].rc = WK_EIO;
		return wk_errf(err, errsz, WK_EIO, "%s/done: fsync: %s", s->path, strerror(errno));
	}
	/* 4. acknowledge: drop the claims (a claim already reclaimed by another worker is gone:
	 * fine, that worker will find the result and drop its own) */
	bool moved = false;
	for (int i = 0; i < n; i++) {
		if (r[i].rc != WK_OK)
			continue;
		if (r[i].keep_input) {
			snprintf(fin, sizeof fin, "%s.json", r[i].job->id);
			moved |= renameat(s->fd[D_CLAIMED], r[i].job->handle, s->fd[D_FAILED], fin) == 0;
		} else if (s->n_spare < SPARE_MAX && spare_ok(s, r[i].job->handle)) {
			/* keep the inode for a later result */
			char spare[64];
			snprintf(spare, sizeof spare, "s.%ld.%lu", s->pid, s->spare_seq);
			if (renameat(s->fd[D_CLAIMED], r[i].job->handle, s->fd[D_TMP], spare) == 0)
				s->spare[s->n_spare++] = s->spare_seq++;
		} else {
			unlinkat(s->fd[D_CLAIMED], r[i].job->handle, 0);
		}
	}
	if (moved)
		sync_dir(q, D_FAILED);
	return first;
}

static int spool_extend(struct queue *q, struct queue_job *jobs, int n, double lease_s, int *rc,
			char *err, size_t errsz)
{
	struct spool *s = q->impl;
	int ret = WK_OK;
	double exp = now_unix() + lease_s;
	for (int i = 0; i < n; i++) {
		char claim[NAME_MAX_];
		claim_name(claim, sizeof claim, jobs[i].id, jobs[i].attempt, s->pid, exp);
		int r = WK_OK;
		if (renameat(s->fd[D_CLAIMED], jobs[i].handle, s->fd[D_CLAIMED], claim) == 0)
			snprintf(jobs[i].handle, sizeof jobs[i].handle, "%s", claim);
		else
			r = ret = wk_errf(err, errsz, WK_ENOTFOUND, "job %s: lease lost (%s)", jobs[i].id,
					  strerror(errno));
		if (rc)
			rc[i] = r;
	}
	return ret;
}

static int spool_release(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	(void)err, (void)errsz;
	struct spool *s = q->impl;
	for (int i = 0; i < n; i++) {
		char name[NAME_MAX_];
		snprintf(name, sizeof name, "%s~%d.json", jobs[i].id, jobs[i].attempt);
		renameat(s->fd[D_CLAIMED], jobs[i].handle, s->fd[D_NEW], name); /* ENOENT: reclaimed */
	}
	return WK_OK;
}

static int spool_check_cancel(struct queue *q, struct queue_job *jobs, int n, char *err, size_t errsz)
{
	(void)err, (void)errsz;
	struct spool *s = q->impl;
	for (int i = 0; i < n; i++)
		if (!jobs[i].cancelled)
			jobs[i].cancelled = faccessat(s->fd[D_CANCEL], jobs[i].id, F_OK, 0) == 0;
	return WK_OK;
}

/* Whether a job id is claimed (running, or waiting for its reclaim) or queued again after a
 * delivery (new/ID~N.json): a submit of that id then would run a second job under it. */
static bool spool_in_flight(struct spool *s, const char *id, const char **where)
{
	static const int dirs[] = {D_CLAIMED, D_NEW};
	for (int k = 0; k < 2; k++) {
		DIR *d = open_dir(s, dirs[k]);
		if (!d)
			continue;
		struct dirent *de;
		bool found = false;
		while (!found && (de = readdir(d))) {
			char jid[JOB_ID_MAX + 1];
			int a, prev;
			long pid;
			long long exp;
			found = dirs[k] == D_CLAIMED
					? queue_spool_parse_claim(de->d_name, jid, &a, &pid, &exp) &&
						  !strcmp(jid, id)
					: strchr(de->d_name, '~') &&
						  queue_spool_parse_new(de->d_name, jid, &prev) &&
						  !strcmp(jid, id);
		}
		closedir(d);
		if (found) {
			*where = dirs[k] == D_CLAIMED ? "is running (claimed/)" : "is queued again (new/)";
			return true;
		}
	}
	return false;
}

/* A cancel marker for a job that is queued or running; an unknown or finished id is an error
 * (a marker for it would say nothing to anyone and stay forever). */
static int spool_cancel(struct queue *q, const char *id, char *err, size_t errsz)
{
	struct spool *s = q->impl;
	char name[NAME_MAX_];
	const char *where;
	snprintf(name, sizeof name, "%s.json", id);
	if (faccessat(s->fd[D_NEW], name, F_OK, 0) != 0 && !spool_in_flight(s, id, &where)) {
		if (faccessat(s->fd[D_DONE], name, F_OK, 0) == 0)
			return wk_errf(err, errsz, WK_EINVAL, "job %s has finished (%s/done/%s)", id,
				       s->path, name);
		return wk_errf(err, errsz, WK_ENOTFOUND, "no job %s is queued or running in %s", id,
			       s->path);
	}
	int fd = openat(s->fd[D_CANCEL], id, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s/cancel/%s: %s", s->path, id, strerror(errno));
	close(fd);
	return WK_OK;
}

static int spool_submit(struct queue *q, const char *id, const char *json, size_t len, char *err,
			size_t errsz)
{
	struct spool *s = q->impl;
	char name[NAME_MAX_];
	snprintf(name, sizeof name, "%s.json", id);
	if (faccessat(s->fd[D_DONE], name, F_OK, 0) == 0)
		return wk_errf(err, errsz, WK_EINVAL, "job %s already has a result in %s/done", id, s->path);
	const char *where;
	if (spool_in_flight(s, id, &where))
		return wk_errf(err, errsz, WK_EINVAL, "a job with id %s %s in %s", id, where, s->path);
	int fd = write_tmp(s, name, json, len);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s/tmp/%s: %s", s->path, name, strerror(errno));
	q->st.syncs++;
	int rc = fsync(fd);
	close(fd);
	if (rc != 0) {
		unlinkat(s->fd[D_TMP], name, 0);
		return wk_errf(err, errsz, WK_EIO, "%s/tmp/%s: fsync: %s", s->path, name, strerror(errno));
	}
	if (renameat2(s->fd[D_TMP], name, s->fd[D_NEW], name, RENAME_NOREPLACE) != 0) {
		int e = errno;
		unlinkat(s->fd[D_TMP], name, 0);
		return wk_errf(err, errsz, e == EEXIST ? WK_EINVAL : WK_EIO, "%s/new/%s: %s", s->path, name,
			       e == EEXIST ? "a job with this id is already queued" : strerror(e));
	}
	if (sync_dir(q, D_NEW) != 0)
		return wk_errf(err, errsz, WK_EIO, "%s/new: fsync: %s", s->path, strerror(errno));
	return WK_OK;
}

static int spool_wait_result(struct queue *q, const char *id, double timeout_s, char **json,
			     size_t *len, char *err, size_t errsz)
{
	struct spool *s = q->impl;
	char name[NAME_MAX_], p[PATH_MAX + 8];
	snprintf(name, sizeof name, "%s.json", id);
	snprintf(p, sizeof p, "%s/done", s->path);
	int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (ino >= 0 && inotify_add_watch(ino, p, IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
		close(ino);
		ino = -1;
	}
	double deadline = wk_now() + timeout_s;
	int rc;
	for (;;) {
		rc = read_at(s->fd[D_DONE], name, NULL, JOB_BODY_MAX + 65536, json, len, NULL, err, errsz);
		if (rc != WK_ENOTFOUND)
			break;
		double left = deadline - wk_now();
		if (left <= 0) {
			rc = wk_errf(err, errsz, WK_ENOTFOUND, "no result for job %s after %.1f s", id,
				     timeout_s);
			break;
		}
		int ms = (int)(left * 1000) + 1;
		if (ino < 0 || ms > 1000)
			ms = ino < 0 ? (ms < 50 ? ms : 50) : 1000; /* re-check now and then regardless */
		struct pollfd pf = {.fd = ino, .events = POLLIN};
		if (poll(ino >= 0 ? &pf : NULL, ino >= 0, ms) > 0) {
			char buf[4096];
			while (read(ino, buf, sizeof buf) > 0) {
			}
		}
	}
	if (ino >= 0)
		close(ino);
	return rc;
}

/* Files in new/ and claimed/ (dot files aside: not jobs). */
static int spool_backlog(struct queue *q, long *n, char *err, size_t errsz)
{
	struct spool *s = q->impl;
	static const int dirs[] = {D_NEW, D_CLAIMED};
	*n = 0;
	for (int k = 0; k < 2; k++) {
		DIR *d = open_dir(s, dirs[k]);
		if (!d)
			return wk_errf(err, errsz, WK_EIO, "%s: %s", s->path, strerror(errno));
		for (struct dirent *de; (de = readdir(d));)
			*n += de->d_name[0] != '.';
		closedir(d);
	}
	return WK_OK;
}

const struct queue_ops queue_spool_ops = {
	.name = "spool",
	.open = spool_open,
	.close = spool_close,
	.take = spool_take,
	.complete = spool_complete,
	.extend = spool_extend,
	.release = spool_release,
	.check_cancel = spool_check_cancel,
	.submit = spool_submit,
	.wait_result = spool_wait_result,
	.cancel = spool_cancel,
	.backlog = spool_backlog,
};
