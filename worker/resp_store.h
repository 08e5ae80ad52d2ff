/*
 * resp_store.h - kept responses on disk (--responses-dir), so that they outlive the process.
 *
 * The Responses API keeps each response (store, the default) so that previous_response_id can
 * go on from it. In memory alone (oai_kept) a worker that scales to zero forgets them all at
 * its exit: a developer's agent that comes back after the idle timeout gets
 * previous_response_not_found and loses its conversation. With a directory, each kept
 * response is also a file there, read back when memory no longer holds it (after a restart,
 * or past the memory's bounds).
 *
 * A response is the file DIR/ID.T.json, T being the 16 hex digits of XXH3_64bits of its
 * tenant: {"id", "tenant", "conversation", "object"} (the chat messages through it, and its
 * response object). Another tenant's lookup names another file, and the tenant inside is
 * checked too. IDs are [A-Za-z0-9_-]{1,47}; any other is not found, and no path is built from
 * it. Each file is written whole beside its name, fsync'd and renamed over it (mode 0600, in
 * a directory made 0700: they hold tenants' conversations), so a crash leaves the file or
 * none. A file that is not a kept response (cut short by a full disk on another host, edited)
 * is removed when read, and reported.
 *
 * Files are written by the store's own thread, so that a slow disk or a network volume
 * (fsync and close are round trips there) never holds up the caller (the HTTP server's event
 * loop): a put hands the text over and returns; a get finds a response still waiting to be
 * written; closing writes what is waiting first. A write that fails is logged through the
 * callback given at open (from the writer thread) and counted.
 *
 * Bounded in bytes: past max_bytes the least recently used files go (a read counts as a use:
 * it touches the file's time). Bounded in age too where asked: a file not used for
 * max_age_s seconds is gone (removed at the next open, write or read; never read back). The
 * store knows the files that were there when it opened and those it wrote or read since, and
 * every 30 s (at a write) its writer reads DIR again: workers sharing DIR (a network volume)
 * so bound it together, each counting the others' files and removing the least recently used
 * of all. Temporaries left by a writer killed mid-write are removed at a scan once a minute
 * old.
 *
 * One caller at a time (the HTTP server's threads, under its lock), beside the store's
 * writer.
 */
#ifndef WICK_RESP_STORE_H
#define WICK_RESP_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct resp_store;

/* Opens DIR (made, mode 0700, where missing) bounded to max_bytes (0: 1 GiB) and max_age_s
 * seconds since a file's last use (0: no bound), indexing the files there and removing those
 * past the bounds (the least recently used first), and starts the writer;
 * log (NULL: none) gets each failed write's message. WK_EIO naming the path (not a
 * directory, no access), WK_ENOMEM. */
int resp_store_open(const char *dir, uint64_t max_bytes, double max_age_s,
		    void (*log)(void *ctx, const char *msg), void *log_ctx, struct resp_store **out,
		    char *err, size_t errsz);
/* Writes what is waiting, then ends the writer and frees s. NULL is fine. */
void resp_store_close(struct resp_store *s);
/* Waits until every response put has been written (or has failed). */
void resp_store_flush(struct resp_store *s);

/* Keeps response id of tenant: {"id", "tenant", "conversation", "object"}, handed to the
 * writer; once written, the least recently used others go while the files pass the bound. A
 * response bigger than the bound alone is not kept (WK_ELIMIT); WK_EINVAL for an id that
 * cannot be a file name; WK_ENOMEM. A failed write (the older file, if any, stays) is the
 * writer's to log. */
int resp_store_put(struct resp_store *s, const char *id, const char *tenant,
		   const json_t *conversation, const json_t *object, char *err, size_t errsz);

/* Reads response id of tenant into *conversation and *object (new references). WK_OK;
 * WK_ENOTFOUND where tenant has no such response (another's included); WK_EFORMAT where the
 * file is not a kept response (it is removed; err names it); WK_EIO. */
int resp_store_get(struct resp_store *s, const char *id, const char *tenant,
		   json_t **conversation, json_t **object, char *err, size_t errsz);

/* Removes response id of tenant: whether there was one. */
bool resp_store_delete(struct resp_store *s, const char *id, const char *tenant);

/* How often the writer reads DIR again (at a write): 30 s unless set, and then never sooner
 * than ten times the last scan's length (a network volume's directory of many files); 0, at
 * every write. */
void resp_store_rescan_every(struct resp_store *s, double seconds);

/* The responses the store knows (files, and those waiting to be written), their bytes, and
 * the writes that failed; NULL s: none. */
int resp_store_count(struct resp_store *s, uint64_t *bytes, uint64_t *errors);

#endif
