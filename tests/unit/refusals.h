/*
 * refusals.h - what queue_opts.on_refused was told, for the queue drivers' tests
 * (test_queue_spool.c, test_queue_redis.c).
 */
#ifndef WICK_TEST_REFUSALS_H
#define WICK_TEST_REFUSALS_H

#include <criterion/criterion.h>
#include <stdio.h>

#include "worker/job.h"

struct refusals {
	int n;
	char id[8][JOB_ID_MAX + 1]; /* "" for NULL */
	char why[8][512];
};

static inline void on_refused(void *ctx, const char *id, const char *why)
{
	struct refusals *r = ctx;
	cr_assert_lt(r->n, 8);
	snprintf(r->id[r->n], sizeof r->id[0], "%s", id ? id : "");
	snprintf(r->why[r->n], sizeof r->why[0], "%s", why);
	r->n++;
}

#endif
