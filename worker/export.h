/*
 * export.h - sends the usage ledger to a metering service as CloudEvents (the JSON event shape
 * OpenMeter ingests): `wick worker --ledger PATH --usage-url URL`.
 *
 * One event per request line ("wick.request", subject = tenant) and one per worker interval
 * ("wick.worker_interval" for each state line, "wick.worker_exit" for the exit line,
 * subject = worker). The CloudEvent id is the ledger line's eid, so a retried post carries
 * the same id and the collector can drop the copy. Events are read from the ledger file
 * after a cursor (PATH.cursor: the byte offset of the first line not yet acknowledged,
 * replaced atomically and fsync'd after each accepted post), so what a crash interrupted is
 * sent by the next worker that exports this ledger. A flock on the cursor file keeps two
 * workers sharing a ledger from sending the same lines at once. Posts are batches
 * (application/cloudevents-batch+json, up to 100 events) retried with exponential backoff
 * (0.2 s doubling to 10 s) on network errors and non-2xx answers.
 */
#ifndef EXPORT_H
#define EXPORT_H

#include <stddef.h>
#include <stdint.h>

struct exporter;

struct export_stats {
	uint64_t posts, failed_posts, events;
};

/* Starts the export thread for the ledger at path. */
int exporter_start(const char *ledger_path, const char *url, struct exporter **e, char *err,
		   size_t errsz);
/* Sends what is left (the ledger up to its end now), trying until deadline_s seconds from
 * now, then stops the thread. Returns WK_OK when everything was acknowledged, else WK_EIO
 * with a message (the cursor keeps the rest for the next run). NULL is fine. */
int exporter_finish(struct exporter *e, double deadline_s, struct export_stats *st, char *err,
		    size_t errsz);

/* One pass, for tests and the thread: sends the lines after the cursor in batches until the
 * end of the file or a failed post. *sent gets the events acknowledged. */
int export_pass(const char *ledger_path, const char *url, uint64_t *sent, char *err,
		size_t errsz);

#endif
