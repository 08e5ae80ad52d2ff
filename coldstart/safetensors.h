/*
 * safetensors.h - read and write Hugging Face safetensors files.
 *
 * Format (https://huggingface.co/docs/safetensors):
 *   bytes 0..7      N, little-endian uint64: length of the JSON header
 *   bytes 8..8+N    JSON object: {"__metadata__": {str: str}?, NAME: {"dtype": "F32"|...,
 *                   "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
 *   bytes 8+N..     the data area; offsets are relative to its start
 *
 * Reading maps the file with mmap and validates every field before forming a pointer:
 * header length within the file and under ST_MAX_HEADER, tensor count, name length and rank
 * under their limits, a known dtype, end - begin == product(shape) * dtype size (no overflow),
 * offsets inside the data area, and no two tensors overlapping. Any violation fails the
 * whole open with WK_EFORMAT (or WK_ELIMIT) and a message naming the file and the tensor.
 *
 * A struct st_file is immutable after open and may be read from many threads.
 */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define ST_MAX_HEADER (100u << 20) /* bytes of JSON header */
#define ST_MAX_TENSORS 1000000     /* tensors in one file */
#define ST_MAX_NAME 512            /* bytes in a tensor name */
#define ST_MAX_RANK 8              /* dimensions of one tensor */

struct st_tensor {
	const char *name;             /* NUL-terminated, owned by the st_file */
	enum dt_type dtype;
	int rank;                     /* 0..ST_MAX_RANK; rank 0 is a scalar */
	int64_t shape[ST_MAX_RANK];
	int64_t numel;                /* product of shape (1 for a scalar) */
	uint64_t offset;              /* absolute byte offset of the data in the file */
	uint64_t nbytes;
	const void *data;             /* points into the mapping (or the caller's buffer) */
};

struct st_file; /* opaque */

/* ---- reading ---- */

/* Maps and validates path. On success *out owns the mapping; free with st_close(). */
int st_open(const char *path, struct st_file **out, char *err, size_t errsz);

/* Validates a safetensors image held in memory (for tests and fuzzing). The buffer is
 * borrowed and must outlive *out. label names the source in error messages. */
int st_parse(const void *buf, size_t len, const char *label, struct st_file **out,
	     char *err, size_t errsz);

void st_close(struct st_file *f); /* NULL is fine */

const char *st_path(const struct st_file *f);
size_t st_count(const struct st_file *f);
const struct st_tensor *st_at(const struct st_file *f, size_t i); /* file order by offset */
const struct st_tensor *st_find(const struct st_file *f, const char *name); /* NULL if absent */
/* Value of a __metadata__ key, or NULL. */
const char *st_meta(const struct st_file *f, const char *key);
/* madvise() on the file's mapping (e.g. MADV_SEQUENTIAL); a no-op for st_parse images.
 * Returns 0 or -1 (errno set); failure is harmless, it is only advice. */
int st_advise(const struct st_file *f, int advice);

/* ---- helpers for other readers of named tensors ---- */

#define ST_SHOWN 96 /* bytes of a name quoted in an error message */

/* Copies s into buf for an error message: control bytes become '?', a long name is cut and
 * ends in "...". Returns buf. Never fails. */
const char *st_shown(const char *s, char buf[static ST_SHOWN]);

/* Binary search of n tensor pointers sorted by strcmp of their names: the index, -1 when
 * absent; st_bsearch: the tensor, NULL when absent. */
long st_bsearch_ix(const struct st_tensor *const *sorted, size_t n, const char *name);
const struct st_tensor *st_bsearch(const struct st_tensor *const *sorted, size_t n,
				   const char *name);

/* ---- writing ---- */

/* One tensor to write. data holds numel * dt_size(dtype) bytes. */
struct st_out {
	const char *name;
	enum dt_type dtype;
	int rank;
	int64_t shape[ST_MAX_RANK];
	const void *data;
};

/* Writes n tensors (in the given order, data packed without gaps) to path, atomically via
 * path.tmp + rename. meta_json is the __metadata__ object as JSON text, or NULL. */
int st_write(const char *path, const struct st_out *t, size_t n, const char *meta_json,
	     char *err, size_t errsz);

#endif
