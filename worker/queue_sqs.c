/* queue_sqs.c - placeholder until the driver lands. */
#include "worker/queue_impl.h"

#include "common/wk.h"

static int sqs_open(struct queue *q, const char *url, char *err, size_t errsz)
{
	(void)q;
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "%.200s: this queue driver is not built yet", url);
}
static void sqs_close(struct queue *q) { (void)q; }

const struct queue_ops queue_sqs_ops = {.name = "sqs", .open = sqs_open, .close = sqs_close};
