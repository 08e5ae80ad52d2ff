/* queue_http.c - placeholder until the driver lands. */
#include "worker/queue_impl.h"

#include "common/wk.h"

static int http_open(struct queue *q, const char *url, char *err, size_t errsz)
{
	(void)q;
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "%.200s: this queue driver is not built yet", url);
}
static void http_close(struct queue *q) { (void)q; }

const struct queue_ops queue_http_ops = {.name = "http", .open = http_open, .close = http_close};
