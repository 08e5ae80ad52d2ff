/*
 * export.c - the usage ledger's CloudEvents exporter (see export.h).
 */
#include "worker/export.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"

#define BATCH_MAX 100

struct exporter {
	char *path, *url;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	double deadline;       /* while stopping: give up after this wk_now() */
	int last_rc;
	char last_err[WK_ERRSZ];
	struct export_stats st;
};

static int read_cursor(int fd, long long *off)
{
	char b[64] = {0};
	ssize_t n = pread(fd, b, sizeof b - 1, 0);
	*off = n > 0 ? atoll(b) : 0;
	return WK_OK;
}

static int write_cursor(const char *cpath, long long off, char *err, size_t errsz)
{
	char tmp[4216], b[64];
	snprintf(tmp, sizeof tmp, "%s.tmp", cpath);
	int n = snprintf(b, sizeof b, "%lld\n", off);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, b, (size_t)n) != n || fsync(fd) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", tmp, strerror(e));
	}
	close(fd);
	if (rename(tmp, cpath) != 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", cpath, strerror(errno));
	return WK_OK;
}

/* The CloudEvent for one ledger line, or NULL for lines that are not exported (ticks, ...). */
static json_t *cloudevent(json_t *ev)
{
	const char *type = json_string_value(json_object_get(ev, "type"));
	const char *eid = json_string_value(json_object_get(ev, "eid"));
	const char *worker = json_string_value(json_object_get(ev, "worker"));
	if (!type || !eid || !worker)
		return NULL;
	const char *ce_type, *subject = worker;
	if (!strcmp(type, "request")) {
		ce_type = "wick.request";
		subject = json_string_value(json_object_get(ev, "tenant"));
	} else if (!strcmp(type, "state")) {
		ce_type = "wick.worker_interval";
	} else if (!strcmp(type, "worker_exit")) {
		ce_type = "wick.worker_exit";
	} else {
		return NULL;
	}
	char source[200];
	snprintf(source, sizeof source, "wick/%s", worker);
	return json_pack("{s:s, s:s, s:s, s:s, s:s?, s:O, s:s, s:O}", "specversion", "1.0", "id",
			 eid, "source", source, "type", ce_type, "subject", subject, "time",
			 json_object_get(ev, "ts"), "datacontenttype", "application/json", "data",
			 ev);
}

static size_t sink(void *p, size_t sz, size_t n, void *ud)
{
	(void)p;
	(void)ud;
	return sz * n;
}

static int post(CURL *c, const char *url, const char *body, char *err, size_t errsz)
{
	struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/cloudevents-batch+json");
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	CURLcode cr = curl_easy_perform(c);
	long code = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	curl_slist_free_all(h);
	if (cr != CURLE_OK)
		return wk_errf(err, errsz, WK_EIO, "posting usage events: %s", curl_easy_strerror(cr));
	if (code < 200 || code > 299)
		return wk_errf(err, errsz, WK_EIO, "posting usage events: HTTP %ld", code);
	return WK_OK;
}

int export_pass(const char *ledger_path, const char *url, uint64_t *sent, char *err,
		size_t errsz)
{
	*sent = 0;
	char cpath[4200];
	snprintf(cpath, sizeof cpath, "%s.cursor", ledger_path);
	int lock = open(cpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock < 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", cpath, strerror(errno));
	FILE *f = fopen(ledger_path, "r");
	if (!f) {
		close(lock);
		return wk_errf(err, errsz, WK_EIO, "%s: %s", ledger_path, strerror(errno));
	}
	CURL *c = curl_easy_init();
	if (!c) {
		fclose(f);
		close(lock);
		return wk_errf(err, errsz, WK_ENOMEM, "curl_easy_init failed");
	}
	flock(lock, LOCK_EX);
	int rc = WK_OK;
	long long off;
	read_cursor(lock, &off);
	char *line = NULL;
	size_t cap = 0;
	for (;;) {
		if (fseeko(f, off, SEEK_SET) != 0) {
			rc = wk_errf(err, errsz, WK_EIO, "%s: seek: %s", ledger_path, strerror(errno));
			break;
		}
		json_t *batch = json_array();
		long long end = off;
		ssize_t n;
		while (json_array_size(batch) < BATCH_MAX && (n = getline(&line, &cap, f)) > 0) {
			if (line[n - 1] != '\n')
				break; /* a line still being written (or torn): next time */
			end += n;
			json_t *ev = json_loadb(line, (size_t)n, 0, NULL);
			json_t *ce = ev ? cloudevent(ev) : NULL;
			if (ce)
				json_array_append_new(batch, ce);
			json_decref(ev);
		}
		if (end == off) {
			json_decref(batch);
			break; /* nothing new */
		}
		size_t k = json_array_size(batch);
		if (k) {
			char *body = json_dumps(batch, JSON_COMPACT);
			rc = body ? post(c, url, body, err, errsz)
				  : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
			free(body);
		}
		json_decref(batch);
		if (rc != WK_OK)
			break;
		rc = write_cursor(cpath, end, err, errsz);
		if (rc != WK_OK)
			break;
		*sent += k;
		off = end;
	}
	free(line);
	flock(lock, LOCK_UN);
	curl_easy_cleanup(c);
	fclose(f);
	close(lock);
	return rc;
}

static void *export_main(void *arg)
{
	struct exporter *e = arg;
	double backoff = 0.2;
	pthread_mutex_lock(&e->mu);
	for (;;) {
		bool stopping = e->stop;
		pthread_mutex_unlock(&e->mu);
		uint64_t sent = 0;
		char err[WK_ERRSZ];
		int rc = export_pass(e->path, e->url, &sent, err, sizeof err);
		pthread_mutex_lock(&e->mu);
		e->st.posts++;
		e->st.events += sent;
		e->last_rc = rc;
		if (rc != WK_OK) {
			e->st.failed_posts++;
			snprintf(e->last_err, sizeof e->last_err, "%s", err);
		}
		if (stopping && (rc == WK_OK || wk_now() >= e->deadline))
			break;
		if (e->stop && !stopping && rc == WK_OK)
			continue; /* finish() came during the pass: one more, at once */
		double wait = rc == WK_OK ? 1.0 : backoff;
		backoff = rc == WK_OK ? 0.2 : (backoff * 2 > 10 ? 10 : backoff * 2);
		if (e->stop && wk_now() + wait > e->deadline)
			wait = e->deadline - wk_now();
		if (wait <= 0)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double at = ts.tv_sec + ts.tv_nsec * 1e-9 + wait;
		ts.tv_sec = (time_t)at;
		ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&e->cv, &e->mu, &ts); /* finish() wakes it early */
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

int exporter_start(const char *ledger_path, const char *url, struct exporter **ep, char *err,
		   size_t errsz)
{
	*ep = NULL;
	if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
		return wk_errf(err, errsz, WK_EINVAL, "--usage-url %.200s: want an http(s):// URL", url);
	struct exporter *e = calloc(1, sizeof *e);
	if (!e || !(e->path = strdup(ledger_path)) || !(e->url = strdup(url))) {
		if (e)
			free(e->path);
		free(e);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	if (pthread_create(&e->th, NULL, export_main, e) != 0) {
		free(e->path);
		free(e->url);
		free(e);
		return wk_errf(err, errsz, WK_ENOMEM, "cannot start the export thread");
	}
	*ep = e;
	return WK_OK;
}

int exporter_finish(struct exporter *e, double deadline_s, struct export_stats *st, char *err,
		    size_t errsz)
{
	if (!e)
		return WK_OK;
	pthread_mutex_lock(&e->mu);
	e->stop = true;
	e->deadline = wk_now() + deadline_s;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
	pthread_join(e->th, NULL);
	int rc = e->last_rc;
	if (rc != WK_OK)
		wk_errf(err, errsz, rc, "%s (the cursor keeps the rest)", e->last_err);
	if (st)
		*st = e->st;
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e->path);
	free(e->url);
	free(e);
	return rc;
}
