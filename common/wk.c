#include "common/wk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int wk_errf(char *err, size_t errsz, int code, const char *fmt, ...)
{
	if (err && errsz) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errsz, fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *wk_status_name(int code)
{
	switch (code) {
	case WK_OK: return "ok";
	case WK_EIO: return "I/O error";
	case WK_EFORMAT: return "format error";
	case WK_ENOMEM: return "out of memory";
	case WK_EINVAL: return "invalid argument";
	case WK_EUNSUPPORTED: return "unsupported";
	case WK_ELIMIT: return "limit exceeded";
	case WK_ENOTFOUND: return "not found";
	}
	return "unknown error";
}

int wk_read_file(const char *path, size_t max, char **buf, size_t *len, char *err, size_t errsz)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s", path,
			       strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return wk_errf(err, errsz, WK_EIO, "%s: not a regular file", path);
	}
	if ((size_t)st.st_size > max) {
		close(fd);
		return wk_errf(err, errsz, WK_ELIMIT, "%s: %lld bytes, more than the limit of %zu",
			       path, (long long)st.st_size, max);
	}
	char *p = malloc((size_t)st.st_size + 1);
	if (!p) {
		close(fd);
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(p);
			close(fd);
			return wk_errf(err, errsz, WK_EIO, "%s: read failed", path);
		}
		got += (size_t)r;
	}
	close(fd);
	p[got] = 0;
	*buf = p;
	*len = got;
	return WK_OK;
}

int wk_write_file(const char *path, const void *buf, size_t len, char *err, size_t errsz)
{
	return wk_write_file_mode(path, buf, len, 0644, err, errsz);
}

int wk_write_file_mode(const char *path, const void *buf, size_t len, unsigned mode, char *err,
		       size_t errsz)
{
	char tmp[4096];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
	if (fd < 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(errno));
	const char *p = buf;
	size_t done = 0;
	while (done < len) {
		ssize_t w = write(fd, p + done, len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = errno;
			close(fd);
			unlink(tmp);
			return wk_errf(err, errsz, WK_EIO, "%s: write failed: %s", tmp, strerror(e));
		}
		done += (size_t)w;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		unlink(tmp);
		return wk_errf(err, errsz, WK_EIO, "%s: fsync/close failed", tmp);
	}
	if (rename(tmp, path) != 0) {
		unlink(tmp);
		return wk_errf(err, errsz, WK_EIO, "%s: rename failed: %s", path, strerror(errno));
	}
	return WK_OK;
}

double wk_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t wk_random_seed(void)
{
	uint64_t x;
	if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x)
		return x;
	static _Atomic uint64_t calls;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	x ^= (uint64_t)getpid() << 32;
	x += 0x9e3779b97f4a7c15ULL * (atomic_fetch_add(&calls, 1) + 1);
	x ^= x >> 33; /* splitmix64's finalizer */
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	return x ^ (x >> 33);
}

void wk_buf_add(struct wk_buf *b, const void *s, size_t n)
{
	if (b->oom || n > SIZE_MAX / 4 - b->len) {
		b->oom = true;
		return;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

void wk_free_secret(char *s)
{
	if (!s)
		return;
	volatile char *p = s; /* volatile: the stores are not dropped as dead before free */
	while (*p)
		*p++ = 0;
	free(s);
}

bool wk_ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && !strcmp(s + a - b, suffix);
}

void wk_lru_unlink(struct wk_lru *l, struct wk_node *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		l->head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	else
		l->tail = n->prev;
	n->prev = n->next = NULL;
}

void wk_lru_push(struct wk_lru *l, struct wk_node *n)
{
	n->prev = NULL;
	n->next = l->head;
	if (l->head)
		l->head->prev = n;
	l->head = n;
	if (!l->tail)
		l->tail = n;
}
