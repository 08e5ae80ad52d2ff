/*
 * snapshot_int.h - internals of the snapshot module, shared by snapshot_manifest.c (parse and
 * validate), snapshot_write.c, snapshot_source.c, snapshot_read.c (restore) and prefetch.c.
 * Nothing outside coldstart/snapshot*.c and coldstart/prefetch.c includes this header.
 */
#ifndef SNAPSHOT_INT_H
#define SNAPSHOT_INT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "coldstart/snapshot.h"

#define SNAP_MAGIC "WICKSNAP"
#define SNAP_PATH 4096

static inline uint64_t snap__align(uint64_t x)
{
	return (x + SNAP_ALIGN - 1) & ~(uint64_t)(SNAP_ALIGN - 1);
}

struct snap_chunk {
	uint64_t offset, size;        /* in the image */
	uint64_t file_offset, stored; /* in the rank file; stored bytes without padding */
	uint64_t xxh3;                /* of the image bytes */
	bool lz4;
};

struct snap_rank {
	char file[16];                /* "rank-NNN.bin" */
	char *path;                   /* dir/file */
	uint64_t size, image_size, xxh3;
	uint64_t meaning;             /* the manifest's meaning hash of this rank (version 2) */
	size_t nt;
	struct st_tensor *t;          /* manifest order; names point into the manifest json */
	const char **layout;          /* per tensor, NULL when untagged */
	size_t *by_name;              /* indices into t, sorted by name */
	size_t nc;
	struct snap_chunk *c;         /* image order */
	/* restore state */
	unsigned char *image;         /* image_size bytes, SNAP_ALIGN-aligned; NULL when 0 */
	bool image_mmapped;           /* else from the caller's allocator */
	int fd, fd_direct;            /* fd_direct -1 when O_DIRECT cannot be opened */
	atomic_bool direct_ok;        /* cleared when an O_DIRECT read says EINVAL */
	unsigned char *fmap;          /* private mapping of the whole file (mincore; the image
				       * when mapped); or NULL */
	bool mapped;                  /* image == fmap + SNAP_ALIGN */
};

struct snap {
	char *dir;
	json_t *m;                    /* the manifest; owns the tensor names */
	int version;                  /* the manifest's format version: 1 or SNAP_VERSION */
	int world;
	uint64_t chunk_size;
	struct snap_rank *r;          /* world entries */
	struct snap_timings tm;
	struct snap_allocator alloc;  /* .alloc NULL: anonymous mmap */
	struct snap_sink sink;        /* .image NULL: host images */
	bool on_sink;                 /* the images are the sink's (sink.accept said so) */
};

/* Reads dir/manifest.json and validates every field (see snapshot.h): fills s->dir, s->m,
 * s->world, s->chunk_size and each rank's file, path, sizes, tensors (data NULL) and chunks.
 * Opens nothing else. On failure s holds what was filled so far; free with snap__free. */
int snap__manifest_load(const char *dir, struct snap *s, char *err, size_t errsz);
/* The name of entry v of the manifest's "files" (validated: a name in version 1, an object
 * with one in version 2). */
const char *snap__file_name(const json_t *v);
/* Each copied file of a version-2 snapshot against its size and xxh3 in the manifest: WK_OK,
 * or WK_EFORMAT / WK_ENOTFOUND / WK_EIO naming the file and what changed. */
int snap__files_check(const struct snap *s, char *err, size_t errsz);

/* Rank ri's file, open as fd, against the manifest: a regular file of the size it says, with
 * the header block it implies (magic, version, rank, world, image size, chunks, checksum).
 * WK_OK, or WK_EFORMAT / WK_EUNSUPPORTED / WK_EIO naming the file and the mismatch. */
int snap__rank_check(const struct snap *s, int ri, int fd, char *err, size_t errsz);

/* Frees everything in s (images via s->alloc, fds, mappings) and s itself. NULL is fine. */
void snap__free(struct snap *s);

/* The rank's xxh3: XXH3_64bits over the chunks' hashes as u64 LE, in order. Returns 0, or -1
 * when the hash state cannot be allocated. */
int snap__rank_hash(const struct snap_chunk *c, size_t nc, uint64_t *out);

/* "it holds tensor 'a'" / "it holds tensors 'a', 'b' and 3 more" / "it holds only padding",
 * for the bytes [off, off + len) of rank r's image. Writes into buf. */
const char *snap__chunk_tensors(const struct snap_rank *r, uint64_t off, uint64_t len,
				char *buf, size_t bufsz);

/* Copies s for an error message: control bytes become '?', long names are cut. */

void snap__hex(uint64_t v, char out[17]);
int snap__unhex(const char *s, uint64_t *out); /* 16 lowercase hex digits; 0 or -1 */

/* Removes path and everything under it (no symlinks followed). Returns 0 or -1 (errno). */
int snap__rmtree(const char *path);

/* Fills buf with the header block of a rank file (SNAP_ALIGN bytes) of format version
 * (meaning: 0 for version 1). */
void snap__header(unsigned char *buf, uint32_t version, uint32_t rank, uint32_t world,
		  uint64_t image_size, uint64_t nchunks, uint64_t xxh3, uint64_t meaning);

/* A rank's meaning hash (snapshot.h): config an object, layout an object or null, tensors the
 * rank's tensor table as the manifest holds it. Returns 0, or -1 when out of memory. */
int snap__meaning_hash(json_t *config, json_t *layout, uint64_t world, uint64_t tp, uint64_t ep,
		       json_t *tensors, uint64_t *out);

/* The source identity object for src_dir (see snapshot.h); *out is a new reference. */
int snap__source_identity(const char *src_dir, json_t **out, char *err, size_t errsz);

#endif
