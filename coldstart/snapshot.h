/*
 * snapshot.h - snapshots of prepared weight layouts, and the prefetch pipeline that restores
 * them at the speed of the storage.
 *
 * A snapshot is made once, offline, by `wick snapshot`: the engine decides every tensor's
 * final layout (sharded per rank, fused, re-typed, quantized) and coldstart/ only stores and
 * streams the bytes. coldstart/ knows nothing about model families.
 *
 * ---- Format, version 2 ------------------------------------------------------------------
 *
 * SNAP/manifest.json
 *   {"format": "wick-snapshot", "version": 2,
 *    "created": RFC 3339 UTC time, "wick": build string,
 *    "world": W, "tp": T, "ep": E, "dtype": "keep"|"fp8"|"bf16"|"f32",
 *    "compress": "none"|"lz4", "chunk_size": bytes (uncompressed),
 *    "config": {the model's config.json},
 *    "layout": {free-form object from the engine: its layout rules and version} or null,
 *    "source": null, or {"dir": path, "hash": "xxh3(size,mtime_ns,head,tail)",
 *               "files": [{"name", "size", "mtime_ns", "xxh3"}], "xxh3": hex},
 *    "files": [{"name", "size", "xxh3"} of each extra file copied verbatim or made by
 *              the engine (tokenizer.prepared), e.g.
 *              "tokenizer.json": XXH3_64bits of its bytes; checked by snap_open and
 *              snap_prefetch] (version 1: [names], unchecked),
 *    "ranks": [{"file": "rank-000.bin", "rank": 0, "size": bytes on disk,
 *               "image_size": bytes restored, "xxh3": hex,
 *               "tensors": [{"name", "dtype", "shape": [...], "offset", "nbytes",
 *                            "layout": tag (only when the engine gave one)}],
 *               "chunks": [{"offset": in image, "size": in image, "file_offset",
 *                           "stored": bytes on disk, "lz4": bool, "xxh3": hex}]}]}
 *   Integers are JSON integers (never reals); "shape" is [] for a scalar.
 *
 * SNAP/rank-NNN.bin  (NNN = the rank, 3 digits; readers accept no other file names)
 *   bytes 0..4095     header block, little-endian: "WICKSNAP" magic (8 bytes), u32 version,
 *                     u32 rank, u64 image_size, u64 chunk count, u32 world, u32 zero,
 *                     u64 the rank's xxh3 (as in the manifest), u64 the rank's meaning
 *                     hash (below), then zeros
 *   bytes 4096..      the chunks, back to back in image order, each starting 4 KiB aligned:
 *                     chunk i+1 starts at align4k(file_offset[i] + stored[i]); the file ends
 *                     at align4k of the last chunk's end (zero padding), which is "size"
 *
 * The image of a rank is its tensors laid out at 4 KiB-aligned offsets in manifest order,
 * zeros between them; image_size is the end of the last tensor rounded up to 4 KiB (0 for a
 * rank without bytes). The image is cut into chunks of chunk_size bytes (a multiple of 4 KiB;
 * the last chunk may be shorter, still a multiple of 4 KiB), so raw chunks can be read with
 * O_DIRECT straight into the image. A chunk is stored raw ("stored" == "size"), or
 * lz4-compressed (LZ4 block format, one block per chunk) when its 4 KiB-padded compressed
 * size is at most 90% of "size". Each chunk's xxh3 is XXH3_64bits of its image bytes (after
 * decompression); a rank's "xxh3" is XXH3_64bits of its chunks' hashes as 8-byte
 * little-endian values in order (so it can be checked in parallel). Hashes are 16 lowercase
 * hex digits.
 *
 * The chunk hashes cover the bytes; what the bytes mean lives in the manifest: a rank's
 * meaning hash is XXH3_64bits over the JSON object {"config", "layout", "world", "tp", "ep",
 * "tensors": the rank's tensor table} taken from the manifest, in a form of wick's own (not
 * a JSON library's text, whose number formatting differs between versions): each value a
 * type byte (jansson's json_type), then an integer's or a real's 8 bytes (the IEEE bits; the
 * manifest's "%.17g" reads back to the same double), a string's u64 length and bytes, an
 * array's u64 count and elements, an object's u64 count and its members sorted by key (u64
 * key length, key, value); all LE. So a manifest edited after the snapshot was written (a
 * tensor's dtype, shape or offset, the model's config) is refused instead of running a
 * different model on the same bytes.
 * Version 1 (no meaning hash: that header field is zero) is still read, without that check.
 *
 * Source identity: hashing hundreds of GB of checkpoint is too slow for a default, so each
 * source file's "xxh3" is a sample: XXH3_64bits over its size (u64 LE), mtime in ns (i64 LE),
 * first min(1 MiB, size) bytes and last min(1 MiB, size - head) bytes. The files are the
 * regular files of src_dir named *.json or *.safetensors (config.json included), sorted by
 * name; the top-level "xxh3" is over each file's name, a NUL and its hash (u64 LE). It
 * catches a replaced, resized or touched file, not an in-place edit of a file's middle that
 * preserves its size and mtime.
 *
 * Writing is atomic: everything goes to SNAP.tmp-PID, each file is fsync'd, the manifest is
 * written last, the directory fsync'd, then renamed to SNAP and the parent fsync'd. An
 * existing SNAP is replaced only when it is a snapshot (has manifest.json) or an empty
 * directory: swapped in one step with renameat2(RENAME_EXCHANGE), or, where the file system
 * lacks it, renamed aside to SNAP.old-PID first; the old one is deleted afterwards. A write
 * that fails removes its .tmp dir; one killed leaves only SNAP.tmp-PID, never a manifest under
 * the final name, and the next snap_write next to it removes .tmp-PID/.old-PID dirs whose
 * process is gone.
 */
#ifndef SNAPSHOT_H
#define SNAPSHOT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coldstart/safetensors.h"

#define SNAP_FORMAT "wick-snapshot"
#define SNAP_VERSION 2 /* written; 1 is read too (no meaning hash) */
#define SNAP_ALIGN 4096
#define SNAP_SINK_ALIGN 256                    /* a sink's images (cudaMalloc's guarantee) */
#define SNAP_SINK_PIECE (2u << 20)             /* bytes a copy into a sink (raw chunks) */
#define SNAP_SINK_SLOTS 3                      /* a reader's piece buffers for a sink */
#define SNAP_MAX_MANIFEST (256u << 20)
#define SNAP_MAX_RANKS 64
#define SNAP_DEFAULT_CHUNK (16u << 20)
#define SNAP_MAX_CHUNK (256u << 20)            /* chunk_size and read_size upper bound */
#define SNAP_MAX_CHUNKS (1u << 22)             /* chunks in one rank file */
#define SNAP_MAX_IMAGE ((uint64_t)1 << 44)     /* bytes in one rank's image (16 TiB) */
#define SNAP_MAX_LAYOUT_TAG 128                /* bytes in a tensor's layout tag */
#define SNAP_MAX_SOURCE_FILES 100000
#define SNAP_MAX_COPY ((uint64_t)4 << 30)      /* bytes of one copied extra file */

/* ---- writing ---- */

struct snap_spec; /* forward */

/* Fills dst (nbytes of the spec) with the tensor's final bytes. Called once per tensor, from
 * one thread, in manifest order per rank. Returns WK_OK or a WK_E* code with a message. */
typedef int (*snap_produce_fn)(void *ctx, const struct snap_spec *t, void *dst, char *err,
			       size_t errsz);

struct snap_spec {
	const char *name;            /* unique within its rank file, at most ST_MAX_NAME bytes */
	int rank_file;               /* which rank file holds it, 0 .. world-1 */
	enum dt_type dtype;
	int rank;
	int64_t shape[ST_MAX_RANK];
	uint64_t nbytes;             /* numel * dt_size(dtype) */
	snap_produce_fn produce;
	void *ctx;
	bool owned_name;             /* for the caller's bookkeeping: snap_write ignores it */
	const char *layout;          /* optional tag from the engine ("tiled-64x64"), or NULL */
};

struct snap_write_opts {
	int world, tp, ep;           /* world 1..SNAP_MAX_RANKS; tp, ep >= 1 (0 means 1) */
	const char *dtype;           /* recorded as given: "keep", "fp8", ...; NULL: "keep" */
	bool lz4;
	size_t chunk_size;           /* 0: SNAP_DEFAULT_CHUNK; a multiple of SNAP_ALIGN */
	json_t *config;              /* borrowed; stored as "config" (NULL: {}) */
	json_t *layout;              /* borrowed; stored as "layout" (may be NULL) */
	const char *src_dir;         /* identity is recorded from its files (may be NULL) */
	const char *const *copy;     /* NULL-terminated names to copy from src_dir if present */
	const struct snap_file *made; /* n_made files the caller made, written beside the
				       * copies and listed with them (may be NULL) */
	size_t n_made;
};

/* A file made in memory for the snapshot, e.g. the tokenizer prepared. name follows the
 * rules for copy (a plain name, not manifest.json or rank-*.bin) and is not also copied. */
struct snap_file {
	const char *name;
	const void *data;
	size_t len;                  /* at most SNAP_MAX_COPY */
};

/* Writes the snapshot atomically (see the format notes). Each rank file is written in one
 * pass: produce() fills a per-tensor buffer (grown to the largest tensor; memory use is about
 * largest tensor + 3 chunks + 32 MiB), the image is cut into chunks, hashed, compressed, and
 * written with large sequential writes. Refuses bad input with WK_EINVAL before writing
 * anything: world out of range, a rank_file out of range, duplicate names in a rank, nbytes
 * that disagree with shape x dtype, an unknown dtype, a bad chunk_size, an out_dir that
 * exists but is neither a snapshot nor an empty directory. On any failure nothing is left
 * under out_dir's name that was not there before, and the .tmp dir is removed. */
int snap_write(const char *out_dir, const struct snap_write_opts *o, const struct snap_spec *t,
	       size_t n, char *err, size_t errsz);

/* ---- restoring ---- */

struct snap_timings {
	double open_s;       /* manifest, validation, opening files, allocating images */
	double read_s;       /* wall time of the parallel restore (reads, verify, decompress) */
	double verify_s;     /* xxh3 time summed over reader threads (may exceed read_s) */
	double decompress_s; /* lz4 time summed over reader threads */
	double total_s;
	uint64_t bytes_read, bytes_restored;  /* on disk (with padding) / images in memory */
	uint64_t bytes_direct, bytes_buffered, bytes_mapped; /* bytes_read split by how */
	int threads;                           /* reader threads used */
};

/* Optional image allocator, e.g. cudaHostAlloc so that the upload to the GPU runs from
 * pinned memory. alloc must return SNAP_ALIGN-aligned memory of size bytes (NULL on failure);
 * release is called from snap_close (or a failed snap_open) and ctx must outlive the snap. */
struct snap_allocator {
	void *(*alloc)(void *ctx, int rank, size_t size);
	void (*release)(void *ctx, int rank, void *p, size_t size);
	void *ctx;
};

/* Restoring straight into another memory, a GPU's, that the host cannot read: no host image
 * is made. After the manifest is read, accept(ctx, world) says whether to stream (false:
 * restore into host memory as without a sink). Then each rank's image is image(ctx, rank,
 * size) in the sink's memory, SNAP_SINK_ALIGN-aligned (NULL when out of memory; freed with
 * release). Staging buffers come from stage_alloc (pinned host memory, so that the copies
 * run at full speed; SNAP_ALIGN-aligned for O_DIRECT), and each reader thread uses its own in
 * turn. Raw chunks go in pieces: the reader reads a piece of a work item (o->sink_piece
 * bytes, default SNAP_SINK_PIECE) into the next of its SNAP_SINK_SLOTS piece buffers, adds it
 * to the running checksums of the chunks it covers, and hands it to put, which starts an
 * asynchronous copy into the image and returns. A chunk is checked when its last piece has
 * been read, so a bad chunk's first pieces may already be copied: the restore then fails
 * whole and releases the images. lz4 chunks go whole: a work item is read and decompressed
 * into one of two more buffers (bytes: the largest lz4 item, made only for a snapshot that
 * has one), its chunks verified there, then put. Before a buffer is filled again, wait(ctx,
 * buffer) returns once every copy from it is done. So the disk reads, checksums and copies
 * overlap, and the pinned memory is bounded by SNAP_SINK_SLOTS pieces (and 2 lz4 items) a
 * reader, whatever the chunk size: pinning costs time on a cold start, in proportion to the
 * bytes. snap_open waits for every copy before it returns, failed or not. put and wait are
 * called from many threads at once. Tensor data pointers then point into the sink's images
 * (snap_on_sink). */
struct snap_sink {
	bool (*accept)(void *ctx, int world);
	void *(*image)(void *ctx, int rank, size_t size);
	void (*release)(void *ctx, int rank, void *image);
	void *(*stage_alloc)(void *ctx, size_t size);
	void (*stage_free)(void *ctx, void *buf);
	int (*put)(void *ctx, int rank, void *dst, const void *buf, size_t bytes, char *err,
		   size_t errsz); /* bytes from the start of buf */
	int (*wait)(void *ctx, const void *buf, char *err, size_t errsz);
	void *ctx;
};

struct snap_open_opts {
	const struct snap_sink *sink; /* NULL: restore into host memory */
	bool verify;       /* check every chunk's xxh3 as it arrives (default: caller sets true) */
	int threads;       /* reader threads; <= 0 picks a default: 4 per rank file, at most 16
			    * and at most max(4, 2 per CPU) */
	size_t read_size;  /* bytes per read; 0 means 16 MiB (rounded up to 4 KiB, <= 256 MiB) */
	size_t sink_piece; /* bytes per read and copy of raw chunks into a sink; 0 means
			    * SNAP_SINK_PIECE (rounded up to 4 KiB, <= read_size's bound) */
	bool progress;     /* draw a progress bar on stderr when it is a TTY */
	const struct snap_allocator *allocator; /* NULL: anonymous mmap */
	int map;           /* 0: auto, 1: whenever possible, -1: never (see snap_open) */
	bool manifest_only; /* validate the manifest and the rank files' sizes and headers, but
			     * restore nothing: every tensor's data is NULL (for inspect) */
	/* Called once the manifest is read and validated, before a rank file is opened or a
	 * sink's accept: a status other than WK_OK fails the open with the message it wrote
	 * (say, the caller finding that what it describes cannot fit where it is to go).
	 * manifest is borrowed. NULL: no check. */
	int (*check)(void *ctx, json_t *manifest, char *err, size_t errsz);
	void *check_ctx;
};

struct snap; /* opaque: a restored snapshot, every rank's image in memory */

/* Returns true when dir holds a manifest.json (it may still be invalid). */
bool snap_is_snapshot(const char *dir);

/* Reads and validates the manifest, checks each rank file's size and header block, then
 * restores every rank file in parallel into memory. Reader threads take groups of chunks (up
 * to read_size) from one queue that interleaves the rank files. Ranges mostly in the page
 * cache (mincore) are read buffered, the rest with O_DIRECT where the file system allows it
 * (buffered otherwise); raw chunks go straight into the image, lz4 chunks through a
 * per-thread staging buffer. Chunks are verified (o->verify) in the reader threads.
 *
 * Zero-copy: a rank file whose chunks are all raw is byte for byte its image after the header
 * block. When such a file is at least 90% in the page cache (o->map 0; any time with 1; never
 * with -1 or with an allocator), the image is a private writable mapping of the file, which
 * the readers populate (MADV_POPULATE_READ) and verify: no zeroing, no copy, and the memory
 * is shared with the page cache. The file must then not be truncated or rewritten in place
 * while the snap is open (SIGBUS); snap_write never does that (it replaces directories).
 *
 * Refuses, naming the problem: another format or version (WK_EUNSUPPORTED); a malformed
 * manifest or header, a truncated or grown file, a chunk that fails its checksum or does not
 * decompress, naming the chunk, its image byte range and the tensors it holds (WK_EFORMAT); a
 * missing file (WK_ENOTFOUND); WK_EIO, WK_ENOMEM. Never returns a partial load. o may be NULL
 * (verify on, defaults). With o->progress and stderr a TTY, draws a progress bar (bytes,
 * GB/s, ETA) and erases it at the end; otherwise prints nothing. On success *out owns the
 * images (and the mappings) until snap_close. */
int snap_open(const char *dir, const struct snap_open_opts *o, struct snap **out, char *err,
	      size_t errsz);
void snap_close(struct snap *s); /* NULL is fine */

/* Accessors. A struct snap is immutable after snap_open and may be read from many threads. */
json_t *snap_manifest(const struct snap *s); /* borrowed */
json_t *snap_config(const struct snap *s);   /* borrowed: manifest "config" */
const char *snap_dir(const struct snap *s);
/* Whether the manifest's "files" (the model's small files copied in) names name. */
bool snap_lists_file(const struct snap *s, const char *name);
int snap_world(const struct snap *s);
/* Tensors of one rank in manifest order; offset is the image offset, data points into the
 * image. rank out of range: 0 / NULL. snap_tensor looks a name up in O(log n). */
size_t snap_tensor_count(const struct snap *s, int rank);
const struct st_tensor *snap_tensor_at(const struct snap *s, int rank, size_t i);
const struct st_tensor *snap_tensor(const struct snap *s, int rank, const char *name);
/* The layout tag of tensor i of rank, or NULL when it has none. */
const char *snap_tensor_layout(const struct snap *s, int rank, size_t i);
/* A rank's whole image (SNAP_ALIGN-aligned, *size bytes), e.g. for one upload to a GPU. */
const void *snap_image(const struct snap *s, int rank, uint64_t *size);
const struct snap_timings *snap_timings(const struct snap *s);
/* True when the images are in a sink's memory (tensor data not readable by the host). */
bool snap_on_sink(const struct snap *s);

/* Compares src_dir with the source identity recorded in the manifest (see the format notes).
 * Returns WK_OK, or WK_EINVAL naming the first file that was added, removed, resized, touched
 * or whose sampled bytes differ; WK_ENOTFOUND when the snapshot recorded no source. */
int snap_source_check(const struct snap *s, const char *src_dir, char *err, size_t errsz);
/* The source identity's hash of src_dir (its "xxh3": sampled, see the format notes). */
int snap_source_hash(const char *src_dir, uint64_t *out, char *err, size_t errsz);

/* ---- prefetch ---- */

struct snap_prefetch_stats {
	uint64_t bytes;       /* size of the snapshot's files, all now in the page cache */
	uint64_t bytes_read;  /* of which were read now (pieces already cached are skipped) */
	size_t files;
};

/* Warms the page cache with every file of the snapshot (manifest, rank files, copied files):
 * the manifest is validated, then threads (<= 0: 4) read the files through in 32 MiB pieces
 * with buffered reads, skipping pieces that mincore says are cached already. Returns WK_OK,
 * or WK_ENOTFOUND/WK_EFORMAT/WK_EIO with a message. */
int snap_prefetch(const char *dir, int threads, char *err, size_t errsz);
/* The same, also filling *st (may be NULL). */
int snap_prefetch_stats(const char *dir, int threads, struct snap_prefetch_stats *st,
			char *err, size_t errsz);

#endif
