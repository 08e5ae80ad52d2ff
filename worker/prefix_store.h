/*
 * The prefix cache kept across restarts (--prefix-cache-dir). A worker that scales to zero
 * loses its prefix cache at every exit, so the first request after a cold start prefills its
 * whole prompt again: a long system prompt, a repository's files in a dev session, the turns
 * of a conversation. prefix_store_save writes the cache's entries (their tokens, tenant keys
 * and KV caches, eng_seq_save) at exit; prefix_store_load reads them back at the next start,
 * so the first such request runs only its new tokens.
 *
 * The file is DIR/prefix-<id>.wpc, id being the engine's eng_cache_id: the weights, config,
 * KV cache type, backend, FP8 activations, MTP layer and tp x ep. A worker of another model
 * or layout finds no file of its id and starts empty, and the file of one is left alone.
 *
 * Format, version 1, little-endian:
 *   header (32 bytes): "WICKPFX1", u32 version, u32 entries, u64 cache id, u64 XXH3_64bits
 *                      of the header's first 24 bytes
 *   each entry, the most recently used first:
 *     u32 tokens n, u32 0, u64 cache_key (the tenant's), u64 cache bytes m,
 *     u64 XXH3_64bits of the entry's first 24 bytes, its tokens' and its caches' bytes,
 *     then n i32 tokens, m bytes
 *     (eng_seq_save's: they name their own length, which must be n)
 * The file is written whole beside its name and renamed over it (fsync'd, mode 0600: it holds
 * what tenants' prompts computed), so a crash or a full disk leaves the old file or none. A
 * write may be bounded in bytes (--prefix-cache-max) and in time (a signal's drain, before
 * the platform's kill): the most recent entries go first, and the file ends before the first
 * entry that would pass either bound (its header counting those written). Temporaries left
 * by a writer killed mid-write are removed by the next write. After its own entries a write
 * keeps those of the file it replaces that its own do not hold (the same key, and tokens that
 * begin one of its own), within the bounds: workers that share DIR (a network volume) keep
 * the union of their caches, not the last one's alone. (Entries longer than the writer's
 * context, which it cannot check, are left out.)
 */
#ifndef WICK_PREFIX_STORE_H
#define WICK_PREFIX_STORE_H

#include <stddef.h>
#include <stdint.h>

struct engine;
struct sched;

struct prefix_store_stats {
	char path[4200]; /* the file */
	int entries;     /* written or loaded */
	int skipped;     /* load: entries left (no sequence free, or longer than the context);
			  * save: entries left out by a bound */
	int merged;      /* save: of the entries written, those kept from the older file */
	long tokens;     /* their tokens */
	uint64_t bytes;  /* the file's bytes written or read */
	double seconds;
};

/* A write's bounds: the file's bytes (0: none) and a wk_now() by which it must be done (0:
 * none). An entry is left out, with those after it, where the file would pass max_bytes, or
 * where at the rate of the entries written so far it would end past the deadline. */
struct prefix_store_limits {
	uint64_t max_bytes;
	double deadline;
};

/* Writes the entries of s's prefix cache (on e, whose cache id is id) to DIR's file (DIR is
 * made where missing), within lim (NULL: none), then the older file's that they do not hold,
 * up to e's sequences. With no entry in the cache, or where the bounds leave none of them
 * in, the older file stays as it is. WK_EIO (naming the path; the older file stays) or
 * WK_ENOMEM. */
int prefix_store_save(struct sched *s, struct engine *e, const char *dir, uint64_t id,
		      const struct prefix_store_limits *lim, struct prefix_store_stats *st,
		      char *err, size_t errsz);

/* Reads DIR's file of id into s's prefix cache, each entry into a free sequence, until none
 * is free. WK_OK with 0 entries where there is no file. WK_EFORMAT naming the file and what
 * is wrong (the entries read before it stay; the rest are not read) or WK_EIO. */
int prefix_store_load(struct sched *s, struct engine *e, const char *dir, uint64_t id,
		      struct prefix_store_stats *st, char *err, size_t errsz);

#endif
