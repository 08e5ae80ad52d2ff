/* resp_store.c - kept responses on disk (resp_store.h). */
#include "worker/resp_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/wk.h"

#define ID_MAX 47
#define NAME_MAX_ 80                  /* ID.T.json */
#define DEFAULT_BYTES ((uint64_t)1 << 30)
#define FILE_MAX ((size_t)1 << 30)    /* a file read, at most */
#define STALE_TMP_S 60
#define RESCAN_S 30.0                 /* the directory read again, for other workers' files */

struct entry {
	char name[NAME_MAX_];
	uint64_t bytes;
	double used; /* the file's mtime: its last write or read */
};

/* A file to write: its name and whole text. */
struct pending {
	char name[NAME_MAX_];
	char *text;
	size_t len;
	struct pending *next;
};

struct resp_store {
	int dfd;
	char dir[4096];
	uint64_t max_bytes;
	double max_age_s; /* 0: none */
	void (*log)(void *ctx, const char *msg);
	void *log_ctx;
	/* under mu: the index, the files waiting for the writer, its errors */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t bytes;
	struct entry *e;
	size_t n, cap;
	struct pending *head, *tail, *busy; /* busy: the one being written (out of the list) */
	size_t n_pending;
	uint64_t pending_bytes, errors;
	double rescan_s;
	double scanned_at, scan_s;        /* the last scan's end and its length (the writer's) */
	bool stop, thread_started;
	pthread_t thread;
};

static bool id_ok(const char *id)
{
	size_t n = strlen(id);
	if (n < 1 || n > ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
		      (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '-'))
			return false;
	return true;
}

/* Whether name is a kept response's file: ID.T.json. */
static bool name_ok(const char *name)
{
	const char *dot = strchr(name, '.');
	if (!dot || (size_t)(dot - name) > ID_MAX || dot == name || strlen(dot) != 22 ||
	    strcmp(dot + 17, ".json"))
		return false;
	for (const char *p = dot + 1; p < dot + 17; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	char id[ID_MAX + 1];
	snprintf(id, sizeof id, "%.*s", (int)(dot - name), name);
	return id_ok(id);
}

static void file_name(char *out, const char *id, const char *tenant)
{
	snprintf(out, NAME_MAX_, "%s.%016llx.json", id,
		 (unsigned long long)XXH3_64bits(tenant, strlen(tenant)));
}

static double mtime_of(const struct stat *st)
{
	return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec * 1e-9;
}

static double now_real(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct entry *find(struct resp_store *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->e[i].name, name))
			return &s->e[i];
	return NULL;
}

static void forget(struct resp_store *s, struct entry *x)
{
	s->bytes -= x->bytes;
	*x = s->e[--s->n];
}

/* Indexes name at bytes and used, replacing what was known of it. WK_OK or WK_ENOMEM. */
static int note(struct resp_store *s, const char *name, uint64_t bytes, double used)
{
	struct entry *x = find(s, name);
	if (x) {
		s->bytes -= x->bytes;
	} else {
		if (s->n == s->cap) {
			size_t cap = s->cap ? s->cap * 2 : 64;
			struct entry *e = realloc(s->e, cap * sizeof *e);
			if (!e)
				return WK_ENOMEM;
			s->e = e;
			s->cap = cap;
		}
		x = &s->e[s->n++];
		snprintf(x->name, sizeof x->name, "%s", name);
	}
	x->bytes = bytes;
	x->used = used;
	s->bytes += bytes;
	return WK_OK;
}

static int by_use(const void *a, const void *b)
{
	double x = ((const struct entry *)a)->used, y = ((const struct entry *)b)->used;
	return x < y ? -1 : x > y;
}

/* At open and at a rescan, with every file indexed: the least recently used go while the
 * bytes pass the bound, in one sort rather than a search a file (a directory of 100,000
 * responses). */
static void trim(struct resp_store *s)
{
	if (s->bytes <= s->max_bytes)
		return;
	qsort(s->e, s->n, sizeof *s->e, by_use);
	size_t k = 0;
	for (; k < s->n && s->bytes > s->max_bytes; k++) {
		unlinkat(s->dfd, s->e[k].name, 0);
		s->bytes -= s->e[k].bytes;
	}
	memmove(s->e, s->e + k, (s->n - k) * sizeof *s->e);
	s->n -= k;
}

/* Whether a file last used at used is past the age bound. */
static bool expired(const struct resp_store *s, double used)
{
	return s->max_age_s > 0 && used < now_real() - s->max_age_s;
}

/* The files past the age bound go, then the least recently used, but keep, while the bytes
 * pass the bound (under mu). */
static void evict(struct resp_store *s, const char *keep)
{
	for (size_t i = 0; i < s->n;) {
		if (expired(s, s->e[i].used) && (!keep || strcmp(s->e[i].name, keep))) {
			unlinkat(s->dfd, s->e[i].name, 0);
			forget(s, &s->e[i]); /* (the last one moves to i) */
		} else {
			i++;
		}
	}
	while (s->bytes > s->max_bytes) {
		struct entry *old = NULL;
		for (size_t i = 0; i < s->n; i++)
			if ((!keep || strcmp(s->e[i].name, keep)) && (!old || s->e[i].used < old->used))
				old = &s->e[i];
		if (!old)
			return;
		unlinkat(s->dfd, old->name, 0); /* (gone already: another worker's eviction) */
		forget(s, old);
	}
}

static void rescan(struct resp_store *s);

/* The writer thread: each pending file written whole (fsync'd, renamed), indexed, and the
 * least recently used past the bound removed; a failure logged and counted. */
static void *writer(void *arg)
{
	struct resp_store *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		struct pending *p = s->head;
		if (!p)
			break; /* (stopping, nothing left) */
		s->head = p->next;
		if (!s->head)
			s->tail = NULL;
		s->busy = p;
		pthread_mutex_unlock(&s->mu);
		char path[4200], err[512];
		snprintf(path, sizeof path, "%s/%s", s->dir, p->name);
		int rc = wk_write_file_mode(path, p->text, p->len, 0600, err, sizeof err);
		if (rc != WK_OK && s->log) /* (logged before a flush can return) */
			s->log(s->log_ctx, err);
		pthread_mutex_lock(&s->mu);
		/* (at most a tenth of the writer's time: a network volume's stat is a round trip) */
		double every = s->rescan_s > 0 && 10 * s->scan_s > s->rescan_s ? 10 * s->scan_s
										: s->rescan_s;
		bool due = rc == WK_OK && now_real() - s->scanned_at >= every;
		pthread_mutex_unlock(&s->mu);
		if (due)
			rescan(s);
		pthread_mutex_lock(&s->mu);
		s->busy = NULL;
		s->n_pending--;
		s->pending_bytes -= p->len;
		if (rc == WK_OK && note(s, p->name, p->len, now_real()) != WK_OK)
			rc = WK_ENOMEM; /* (written, not indexed: the next open finds it) */
		if (rc == WK_OK)
			evict(s, p->name);
		else
			s->errors++;
		pthread_cond_broadcast(&s->cv); /* (resp_store_flush) */
		free(p->text);
		free(p);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

void resp_store_close(struct resp_store *s)
{
	if (!s)
		return;
	if (s->thread_started) { /* (it writes what is pending first) */
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_cond_broadcast(&s->cv); /* (the writer, beside any flush) */
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->thread, NULL);
	}
	if (s->dfd >= 0)
		close(s->dfd);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->e);
	free(s);
}

void resp_store_flush(struct resp_store *s)
{
	pthread_mutex_lock(&s->mu);
	while (s->head || s->busy)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

/* Reads DIR: its responses into a new index (*e, *n of them, *bytes in all), stale
 * temporaries removed. Takes no lock: the writer's rescans run it beside the caller. */
static int scan_into(struct resp_store *s, struct entry **e, size_t *n, uint64_t *bytes,
		     char *err, size_t errsz)
{
	*e = NULL;
	*n = 0;
	*bytes = 0;
	/* (opened again, not a dup: a dup shares its offset, at the end after the first scan) */
	int fd = openat(s->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", s->dir, strerror(errno));
	}
	double now = now_real();
	size_t cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		struct stat st;
		bool tmp = wk_ends_with(de->d_name, ".json.tmp");
		if ((!tmp && !name_ok(de->d_name)) ||
		    fstatat(s->dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		if (tmp) {
			if (now - mtime_of(&st) > STALE_TMP_S)
				unlinkat(s->dfd, de->d_name, 0);
			continue;
		}
		if (*n == cap) {
			size_t c2 = cap ? cap * 2 : 64;
			struct entry *e2 = realloc(*e, c2 * sizeof *e2);
			if (!e2) {
				closedir(d);
				free(*e);
				*e = NULL;
				return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			}
			*e = e2;
			cap = c2;
		}
		struct entry *x = &(*e)[(*n)++];
		snprintf(x->name, sizeof x->name, "%.*s", (int)sizeof x->name - 1, de->d_name);
		x->bytes = (uint64_t)st.st_size;
		x->used = mtime_of(&st);
		*bytes += x->bytes;
	}
	closedir(d);
	return WK_OK;
}

/* The writer, every rescan_s (or ten times as long as the last scan took, if that is
 * longer): DIR read again, so that the files other workers sharing it wrote (a network
 * volume) count against the bound, and those they removed are forgotten; the least recently
 * used of all go past it. Then under mu. */
static void rescan(struct resp_store *s)
{
	struct entry *e;
	size_t n;
	uint64_t bytes;
	char err[256];
	double t0 = now_real();
	int rc = scan_into(s, &e, &n, &bytes, err, sizeof err);
	s->scanned_at = now_real();
	s->scan_s = s->scanned_at - t0;
	if (rc != WK_OK)
		return; /* (the index it has stays) */
	pthread_mutex_lock(&s->mu);
	free(s->e);
	s->e = e;
	s->n = s->cap = n;
	s->bytes = bytes;
	trim(s);
	pthread_mutex_unlock(&s->mu);
}

int resp_store_open(const char *dir, uint64_t max_bytes, double max_age_s,
		    void (*log)(void *ctx, const char *msg), void *log_ctx, struct resp_store **out,
		    char *err, size_t errsz)
{
	*out = NULL;
	struct resp_store *s = calloc(1, sizeof *s);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	s->dfd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->max_bytes = max_bytes ? max_bytes : DEFAULT_BYTES;
	s->max_age_s = max_age_s > 0 ? max_age_s : 0;
	s->log = log;
	s->log_ctx = log_ctx;
	if (snprintf(s->dir, sizeof s->dir, "%s", dir) >= (int)sizeof s->dir) {
		resp_store_close(s);
		return wk_errf(err, errsz, WK_EINVAL, "%.100s...: path too long", dir);
	}
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		int e = errno;
		resp_store_close(s);
		return wk_errf(err, errsz, WK_EIO, "%s: cannot make it: %s", dir, strerror(e));
	}
	s->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dfd < 0 || faccessat(s->dfd, ".", W_OK | X_OK, AT_EACCESS)) {
		int e = errno;
		resp_store_close(s);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", dir,
			       e == ENOTDIR ? "not a directory" : strerror(e));
	}
	s->rescan_s = RESCAN_S;
	s->scanned_at = now_real();
	int rc = scan_into(s, &s->e, &s->n, &s->bytes, err, errsz);
	if (rc != WK_OK) {
		resp_store_close(s);
		return rc;
	}
	s->cap = s->n;
	trim(s);
	evict(s, NULL); /* (the age bound; the bytes are within theirs) */
	if ((rc = pthread_create(&s->thread, NULL, writer, s))) {
		resp_store_close(s);
		return wk_errf(err, errsz, WK_ENOMEM, "the writer thread: %s", strerror(rc));
	}
	s->thread_started = true;
	*out = s;
	return WK_OK;
}

int resp_store_put(struct resp_store *s, const char *id, const char *tenant,
		   const json_t *conversation, const json_t *object, char *err, size_t errsz)
{
	if (!id_ok(id))
		return wk_errf(err, errsz, WK_EINVAL, "'%.60s' cannot be a kept response's id", id);
	json_t *doc = json_pack("{s:s, s:s, s:O, s:O}", "id", id, "tenant", tenant, "conversation",
				conversation, "object", object);
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	if (!text)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	size_t len = strlen(text);
	struct pending *p = calloc(1, sizeof *p);
	if (!p) {
		free(text);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	file_name(p->name, id, tenant);
	if (len > s->max_bytes) {
		wk_errf(err, errsz, WK_ELIMIT, "%s/%s: %zu bytes, past the bound of %llu", s->dir,
			p->name, len, (unsigned long long)s->max_bytes);
		free(text);
		free(p);
		return WK_ELIMIT;
	}
	p->text = text;
	p->len = len;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = p;
	else
		s->head = p;
	s->tail = p;
	s->n_pending++;
	s->pending_bytes += len;
	pthread_cond_broadcast(&s->cv); /* (the writer, beside any flush) */
	pthread_mutex_unlock(&s->mu);
	return WK_OK;
}

/* The pending file of name, or NULL (under mu). */
static struct pending *pending_of(struct resp_store *s, const char *name)
{
	if (s->busy && !strcmp(s->busy->name, name))
		return s->busy;
	for (struct pending *p = s->head; p; p = p->next)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}

/* Name's file no longer indexed, if it was (under mu). */
static void forget_name(struct resp_store *s, const char *name)
{
	struct entry *x = find(s, name);
	if (x)
		forget(s, x);
}

/* ... taking mu. */
static void forget_locked(struct resp_store *s, const char *name)
{
	pthread_mutex_lock(&s->mu);
	forget_name(s, name);
	pthread_mutex_unlock(&s->mu);
}

/* A file read that is not a kept response of id: removed, and named. */
static int bad_file(struct resp_store *s, const char *name, const char *path, const char *why,
		    char *err, size_t errsz)
{
	unlinkat(s->dfd, name, 0);
	forget_locked(s, name);
	return wk_errf(err, errsz, WK_EFORMAT, "%s: not a kept response (%s): removed", path, why);
}

/* The text of name: still pending (a copy), else its file's. WK_OK, WK_ENOTFOUND, WK_EIO. */
static int text_of(struct resp_store *s, const char *name, const char *path, char **buf,
		   size_t *len, bool *from_file, char *err, size_t errsz)
{
	pthread_mutex_lock(&s->mu);
	struct pending *p = pending_of(s, name);
	*buf = p ? malloc(p->len + 1) : NULL;
	if (*buf) {
		memcpy(*buf, p->text, p->len + 1);
		*len = p->len;
	}
	pthread_mutex_unlock(&s->mu);
	*from_file = !p;
	if (p)
		return *buf ? WK_OK : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	struct stat st;
	bool stat_ok = fstatat(s->dfd, name, &st, 0) == 0;
	bool gone = stat_ok ? expired(s, mtime_of(&st)) /* (not yet evicted: nothing ran since) */
			    : errno == ENOENT; /* (another worker's eviction, or a delete) */
	if (gone) {
		if (stat_ok)
			unlinkat(s->dfd, name, 0);
		forget_locked(s, name);
		return WK_ENOTFOUND;
	}
	return wk_read_file(path, FILE_MAX, buf, len, err, errsz);
}

int resp_store_get(struct resp_store *s, const char *id, const char *tenant,
		   json_t **conversation, json_t **object, char *err, size_t errsz)
{
	*conversation = *object = NULL;
	if (!id_ok(id))
		return WK_ENOTFOUND;
	char name[NAME_MAX_], path[4200];
	file_name(name, id, tenant);
	snprintf(path, sizeof path, "%s/%s", s->dir, name);
	char *buf;
	size_t len;
	bool from_file;
	int rc = text_of(s, name, path, &buf, &len, &from_file, err, errsz);
	if (rc != WK_OK)
		return rc;
	json_error_t je;
	json_t *doc = json_loadb(buf, len, 0, &je);
	free(buf);
	if (!doc)
		return bad_file(s, name, path, je.text, err, errsz);
	json_t *c = json_object_get(doc, "conversation"), *o = json_object_get(doc, "object");
	const char *fid = json_string_value(json_object_get(doc, "id"));
	const char *ften = json_string_value(json_object_get(doc, "tenant"));
	if (!json_is_array(c) || !json_is_object(o) || !fid || !ften) {
		json_decref(doc);
		return bad_file(s, name, path, "no id, tenant, conversation or object", err, errsz);
	}
	if (strcmp(fid, id) || strcmp(ften, tenant)) { /* (a hash's collision: another's) */
		json_decref(doc);
		return WK_ENOTFOUND;
	}
	*conversation = json_incref(c);
	*object = json_incref(o);
	json_decref(doc);
	if (from_file) {
		utimensat(s->dfd, name, NULL, 0); /* a use: the most recent now */
		pthread_mutex_lock(&s->mu);
		if (note(s, name, len, now_real()) == WK_OK)
			evict(s, name);
		pthread_mutex_unlock(&s->mu);
	}
	return WK_OK;
}

bool resp_store_delete(struct resp_store *s, const char *id, const char *tenant)
{
	if (!id_ok(id))
		return false;
	char name[NAME_MAX_];
	file_name(name, id, tenant);
	json_t *c, *o;
	char err[256];
	if (resp_store_get(s, id, tenant, &c, &o, err, sizeof err) != WK_OK)
		return false; /* (not tenant's: left alone) */
	json_decref(c);
	json_decref(o);
	pthread_mutex_lock(&s->mu);
	while (s->busy && !strcmp(s->busy->name, name)) /* (being written: let it end) */
		pthread_cond_wait(&s->cv, &s->mu);
	for (struct pending **pp = &s->head, *prev = NULL; *pp;) {
		struct pending *p = *pp;
		if (strcmp(p->name, name)) {
			prev = p;
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		if (s->tail == p)
			s->tail = prev;
		s->n_pending--;
		s->pending_bytes -= p->len;
		free(p->text);
		free(p);
	}
	forget_name(s, name);
	pthread_mutex_unlock(&s->mu);
	unlinkat(s->dfd, name, 0); /* (none: it was still pending) */
	return true;
}

void resp_store_rescan_every(struct resp_store *s, double seconds)
{
	pthread_mutex_lock(&s->mu);
	s->rescan_s = seconds > 0 ? seconds : 0;
	pthread_mutex_unlock(&s->mu);
}

int resp_store_count(struct resp_store *s, uint64_t *bytes, uint64_t *errors)
{
	if (!s) {
		if (bytes)
			*bytes = 0;
		if (errors)
			*errors = 0;
		return 0;
	}
	pthread_mutex_lock(&s->mu);
	int n = (int)(s->n + s->n_pending);
	if (bytes)
		*bytes = s->bytes + s->pending_bytes;
	if (errors)
		*errors = s->errors;
	pthread_mutex_unlock(&s->mu);
	return n;
}
