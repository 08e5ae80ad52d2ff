/* Fuzz target: `wick usage` over a ledger of arbitrary bytes (cmd_usage, as the command line
 * calls it: the reader, the repair of torn lines, the settling of runs and requests, the
 * bill). The first byte picks --by, --format and --bill-overhead and whether the file is
 * given twice; the rest is the ledger, in a memfd. No crash, an exit of 0 or 1 (the flags are
 * valid), --format json prints one valid JSON document, and with the overhead spread the
 * rows' costs add up to the workers' total, to the micro-dollar. */
#include <fcntl.h>
#include <stdint.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

int cmd_usage(int argc, char **argv);

/* A row's or total's "cost_usd" ("-0.000123" too) in micro-dollars. */
static int64_t micro(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key)), *d;
	char *end;
	if (!s || !(d = strchr(s, '.')) || strlen(d) != 7)
		abort(); /* every cost is printed as dollars with 6 decimals */
	long long whole = strtoll(s, &end, 10), frac = strtoll(d + 1, NULL, 10);
	if (end != d || whole > INT64_MAX / 1000000 - 1 || whole < -(INT64_MAX / 1000000 - 1))
		abort();
	return *s == '-' ? whole * 1000000 - frac : whole * 1000000 + frac;
}

/* With --bill-overhead proportional every micro-dollar of the workers' cost is some row's. */
static void check_sums(json_t *bill, bool spread)
{
	json_t *rows = json_object_get(bill, "rows"), *tot = json_object_get(bill, "totals"), *r;
	const char *by = json_string_value(json_object_get(bill, "by"));
	if (!json_is_array(rows) || !json_is_object(tot) || !by)
		abort();
	if (!spread || strcmp(by, "tenant"))
		return;
	int64_t sum = 0;
	size_t i;
	json_array_foreach(rows, i, r)
		sum += micro(r, "cost_usd");
	if (sum != micro(tot, "cost_usd"))
		abort();
}

static int fresh_fd(const char *name)
{
	int fd = memfd_create(name, 0);
	if (fd < 0)
		abort();
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int led = -1, out = -1, null_fd = -1;
	if (led < 0) {
		led = fresh_fd("ledger");
		out = fresh_fd("out");
		null_fd = open("/dev/null", O_WRONLY);
	}
	if (size < 1 || null_fd < 0 || ftruncate(led, 0) || ftruncate(out, 0) ||
	    lseek(out, 0, SEEK_SET) != 0)
		return 0;
	if (size > 1 && pwrite(led, data + 1, size - 1, 0) != (ssize_t)(size - 1))
		abort();
	static char *const by[] = {"request", "tenant", "worker", "day"};
	static char *const fmt[] = {"json", "table", "csv", "json"};
	unsigned b = data[0];
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", led);
	char *argv[] = {"usage", "--by", by[b & 3], "--format", fmt[(b >> 2) & 3],
			"--bill-overhead", (b & 16) ? "proportional" : "none", path, path, NULL};
	int argc = (b & 32) ? 9 : 8;

	fflush(stdout);
	fflush(stderr);
	int so = dup(1), se = dup(2);
	if (so < 0 || se < 0 || dup2(out, 1) < 0 || dup2(null_fd, 2) < 0)
		abort();
	optind = 0; /* getopt starts over */
	int rc = cmd_usage(argc, argv);
	fflush(stdout);
	fflush(stderr);
	if (dup2(so, 1) < 0 || dup2(se, 2) < 0)
		abort();
	close(so);
	close(se);
	if (rc != 0 && rc != 1)
		abort(); /* 2 is a usage error, and these flags are valid */
	if (rc == 0 && !strcmp(fmt[(b >> 2) & 3], "json")) {
		off_t n = lseek(out, 0, SEEK_END);
		char *buf = n > 0 ? malloc((size_t)n) : NULL;
		if (!buf || pread(out, buf, (size_t)n, 0) != n)
			abort();
		json_error_t e;
		json_t *j = json_loadb(buf, (size_t)n, 0, &e);
		if (!j)
			abort(); /* the bill must be one valid JSON document */
		check_sums(j, b & 16);
		json_decref(j);
		free(buf);
	}
	return 0;
}
