/*
 * wk.h - status codes and error messages shared by every wick module.
 *
 * Library code never exits. A function that can fail returns 0 (WK_OK) or a negative
 * WK_E* code, and writes a one-line message naming the problem into the caller's buffer
 * (char *err, size_t errsz). err may be NULL when the caller does not want the message.
 */
#ifndef WK_H
#define WK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum wk_status {
	WK_OK = 0,
	WK_EIO = -1,          /* a read, write, open or mmap failed */
	WK_EFORMAT = -2,      /* a file or message is malformed */
	WK_ENOMEM = -3,       /* an allocation failed */
	WK_EINVAL = -4,       /* the caller passed a bad argument or option */
	WK_EUNSUPPORTED = -5, /* valid, but not something wick implements */
	WK_ELIMIT = -6,       /* a size, count or length is past its configured maximum */
	WK_ENOTFOUND = -7,    /* a named file, tensor or key does not exist */
};

#define WK_ERRSZ 512 /* a good size for callers' error buffers */

/* Formats a message into err (when err != NULL) and returns code, so that failure paths read
 * `return wk_errf(err, errsz, WK_EFORMAT, "%s: bad header", path);`. Never fails. */
int wk_errf(char *err, size_t errsz, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* A short name for a status code ("format error", ...). Never returns NULL. */
const char *wk_status_name(int code);

/* Reads a whole file into a NUL-terminated malloc'd buffer of at most max bytes.
 * Returns WK_OK and sets *buf (caller frees) and *len, or WK_EIO/WK_ELIMIT/WK_ENOMEM. */
int wk_read_file(const char *path, size_t max, char **buf, size_t *len, char *err, size_t errsz);

/* Writes len bytes to path atomically (path.tmp, fsync, rename). */
int wk_write_file(const char *path, const void *buf, size_t len, char *err, size_t errsz);
/* ... with the file's mode (0600 for what tenants sent). */
int wk_write_file_mode(const char *path, const void *buf, size_t len, unsigned mode, char *err,
		       size_t errsz);

/* Monotonic seconds, for timing. */
double wk_now(void);

/* Little-endian integers in bytes (the on-disk formats: snapshot headers, the prefix cache's
 * file). */
static inline void wk_put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}
static inline void wk_put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t wk_get32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}
static inline uint64_t wk_get64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* A sampling seed for a request that names none: 8 bytes from the kernel's random source
 * (getrandom), else the clock's nanoseconds, the process id and a per-process counter mixed,
 * so that requests in the same second, or from the same slot, draw differently. */
uint64_t wk_random_seed(void);

/* A growing NUL-terminated string. A failed allocation sets oom and later appends do nothing,
 * so a caller checks once at the end. {0} is an empty buffer; free(b.p) releases it. */
struct wk_buf {
	char *p;
	size_t len, cap;
	bool oom;
};
void wk_buf_add(struct wk_buf *b, const void *s, size_t n);

/* Zeroes a secret string (a password, a key, a token) before freeing it; NULL is fine. */
void wk_free_secret(char *s);

/* Whether string s ends with suffix. */
bool wk_ends_with(const char *s, const char *suffix);

/* A list in recency order, for a cache that drops its least recently used entries: each entry
 * holds a wk_node, and WK_OF gives the entry back from it. {0} is an empty list. */
struct wk_node {
	struct wk_node *prev, *next; /* more, less recently used */
};
struct wk_lru {
	struct wk_node *head, *tail; /* the most, the least recently used */
};
void wk_lru_unlink(struct wk_lru *l, struct wk_node *n);
void wk_lru_push(struct wk_lru *l, struct wk_node *n); /* as the most recently used */
#define WK_OF(node, type, member) ((type *)(void *)((char *)(node) - offsetof(type, member)))

#endif
