/*
 * The usage ledger: integer money, billed seconds, the torn-tail repair, crash notes, and the
 * events a worker's life writes.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wk.h"
#include "worker/ledger.h"

Test(ledger, money_parse_is_exact)
{
	int64_t m;
	cr_assert_eq(money_parse_micro("36.31", &m), WK_OK);
	cr_assert_eq(m, 36310000);
	cr_assert_eq(money_parse_micro("0.001261", &m), WK_OK);
	cr_assert_eq(m, 1261);
	cr_assert_eq(money_parse_micro("7", &m), WK_OK);
	cr_assert_eq(m, 7000000);
	cr_assert_eq(money_parse_micro(".5", &m), WK_OK);
	cr_assert_eq(m, 500000);
	cr_assert_neq(money_parse_micro("0.0000001", &m), WK_OK, "finer than a micro-dollar");
	cr_assert_neq(money_parse_micro("-1", &m), WK_OK);
	cr_assert_neq(money_parse_micro("1e3", &m), WK_OK);
	cr_assert_neq(money_parse_micro("", &m), WK_OK);
	cr_assert_neq(money_parse_micro(".", &m), WK_OK);
}

/* The user's story: a session billed 1,200 seconds at $36.31/h costs $12.10 (12.103333). */
Test(ledger, twenty_minutes_at_36_31_per_hour)
{
	int64_t c = money_cost_micro(1200, 36310000);
	cr_assert_eq(c, 12103333);
	char b[40];
	money_fmt6(b, sizeof b, c);
	cr_assert_str_eq(b, "12.103333");
	money_fmt_cents(b, sizeof b, c);
	cr_assert_str_eq(b, "$12.10");
}

Test(ledger, rounding_is_half_up_in_integers)
{
	/* 1 s at $0.0018/h = 0.5 micro-dollars -> 1 */
	cr_assert_eq(money_cost_micro(1, 1800), 1);
	cr_assert_eq(money_cost_micro(1, 1799), 0);
	char b[40];
	money_fmt_cents(b, sizeof b, 5000); /* half a cent rounds up */
	cr_assert_str_eq(b, "$0.01");
	money_fmt_cents(b, sizeof b, 4999);
	cr_assert_str_eq(b, "$0.00");
	/* a million one-second requests sum exactly: no float drift */
	int64_t sum = 0;
	for (int i = 0; i < 1000000; i++)
		sum += money_cost_micro(1, 36000000);
	cr_assert_eq(sum, 10000 * 1000000LL);
	/* Modal's H200 price per GPU-second, 8 GPUs, one hour */
	cr_assert_eq(money_cost_micro(3600, 1261 * 3600 * 8), 1261 * 3600 * 8);
}

Test(ledger, billed_seconds_are_the_ceiling)
{
	cr_assert_eq(money_billed_seconds(0), 0);
	cr_assert_eq(money_billed_seconds(0.0004), 1);
	cr_assert_eq(money_billed_seconds(1.0), 1);
	cr_assert_eq(money_billed_seconds(1.0000001), 1, "within a microsecond of whole");
	cr_assert_eq(money_billed_seconds(1.001), 2);
	cr_assert_eq(money_billed_seconds(1199.2), 1200);
}

static char *tmpfile_with(const char *content)
{
	static char path[64];
	snprintf(path, sizeof path, "/tmp/wick-ledger-XXXXXX");
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	size_t n = strlen(content);
	cr_assert_eq(write(fd, content, n), (ssize_t)n);
	close(fd);
	return path;
}

static char *slurp(const char *path)
{
	char *buf;
	size_t len;
	char err[WK_ERRSZ];
	cr_assert_eq(wk_read_file(path, 1 << 20, &buf, &len, err, sizeof err), WK_OK, "%s", err);
	return buf;
}

Test(ledger, repair_cuts_a_torn_last_line_only)
{
	const char *good = "{\"type\":\"tick\",\"a\":1}\n{\"type\":\"tick\",\"a\":2}\n";
	char buf[256];
	char *dropped;
	size_t nd;
	char err[WK_ERRSZ];
	/* intact: untouched */
	char *p = tmpfile_with(good);
	int fd = open(p, O_RDWR);
	cr_assert_eq(ledger_repair(fd, &dropped, &nd, err, sizeof err), WK_OK, "%s", err);
	cr_assert_null(dropped);
	close(fd);
	char *s = slurp(p);
	cr_assert_str_eq(s, good);
	free(s);
	unlink(p);
	/* a write cut short: no newline */
	snprintf(buf, sizeof buf, "%s{\"type\":\"requ", good);
	p = tmpfile_with(buf);
	fd = open(p, O_RDWR);
	cr_assert_eq(ledger_repair(fd, &dropped, &nd, err, sizeof err), WK_OK, "%s", err);
	cr_assert_not_null(dropped);
	cr_assert_eq(nd, strlen("{\"type\":\"requ"));
	cr_assert_eq(memcmp(dropped, "{\"type\":\"requ", nd), 0);
	free(dropped);
	close(fd);
	s = slurp(p);
	cr_assert_str_eq(s, good);
	free(s);
	unlink(p);
	/* a newline-terminated line that is not JSON (a torn page) is cut too */
	snprintf(buf, sizeof buf, "%s{\"type\":\"tick\",\"a\n", good);
	p = tmpfile_with(buf);
	fd = open(p, O_RDWR);
	cr_assert_eq(ledger_repair(fd, &dropped, &nd, err, sizeof err), WK_OK, "%s", err);
	cr_assert_not_null(dropped);
	free(dropped);
	close(fd);
	s = slurp(p);
	cr_assert_str_eq(s, good);
	free(s);
	unlink(p);
	/* a single torn line and nothing else */
	p = tmpfile_with("{\"ty");
	fd = open(p, O_RDWR);
	cr_assert_eq(ledger_repair(fd, &dropped, &nd, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(nd, 4);
	free(dropped);
	cr_assert_eq(lseek(fd, 0, SEEK_END), 0);
	close(fd);
	unlink(p);
}

/* Reads path's events into an array. */
static json_t *events(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	json_t *a = json_array();
	char line[8192];
	while (fgets(line, sizeof line, f)) {
		json_error_t je;
		json_t *j = json_loads(line, 0, &je);
		cr_assert_not_null(j, "not JSON: %s (%s)", line, je.text);
		json_array_append_new(a, j);
	}
	fclose(f);
	return a;
}

static json_t *find(json_t *evs, const char *type, int nth)
{
	size_t i;
	json_t *e;
	json_array_foreach(evs, i, e)
		if (!strcmp(json_string_value(json_object_get(e, "type")), type) && nth-- == 0)
			return e;
	return NULL;
}

Test(ledger, a_life_in_events_adds_up)
{
	char path[] = "/tmp/wick-ledger-life-XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	unlink(path);
	double t0 = wk_now();
	struct ledger_info in = {.worker = "w1", .gpu_type = "H200", .gpu_count = 8,
				 .price_micro_per_hour = 36310000, .t_start = t0};
	struct ledger *l;
	char err[WK_ERRSZ];
	cr_assert_eq(ledger_open(path, &in, &l, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(ledger_state(l, LEDGER_IDLE, t0 + 0.5, err, sizeof err), WK_OK);
	cr_assert_eq(ledger_state(l, LEDGER_BUSY, t0 + 2.0, err, sizeof err), WK_OK);
	struct ledger_req r[2] = {
		{.id = "a", .tenant = "acme", .status = "COMPLETED", .attempt = 1,
		 .gpu_seconds = 0.75, .prompt_tokens = 3, .completion_tokens = 9,
		 .cost_micro_usd = money_cost_micro(0.75, 36310000)},
		{.id = "b", .tenant = NULL, .status = "FAILED", .attempt = 2, .gpu_seconds = 0.25}};
	cr_assert_eq(ledger_requests(l, r, 2, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(ledger_state(l, LEDGER_IDLE, t0 + 3.0, err, sizeof err), WK_OK);
	struct ledger_totals tot;
	cr_assert_eq(ledger_exit(l, "idle", t0 + 1200.0, &tot, err, sizeof err), WK_OK, "%s", err);
	ledger_close(l);
	cr_assert_float_eq(tot.seconds[LEDGER_BUSY], 1.0, 1e-9);
	cr_assert_float_eq(tot.request_gpu_seconds, 1.0, 1e-9);

	json_t *ev = events(path);
	json_t *st = find(ev, "worker_start", 0), *ex = find(ev, "worker_exit", 0);
	cr_assert_not_null(st);
	cr_assert_not_null(ex);
	cr_assert_eq(json_integer_value(json_object_get(st, "price_micro_usd_per_hour")), 36310000);
	cr_assert_eq(json_integer_value(json_object_get(ex, "billed_seconds")), 1200);
	cr_assert_eq(json_integer_value(json_object_get(ex, "cost_micro_usd")), 12103333);
	cr_assert_str_eq(json_string_value(json_object_get(ex, "cost_usd")), "12.103333");
	double sum = 0;
	const char *names[] = {"start_seconds", "busy_seconds", "idle_seconds", "drain_seconds"};
	for (int i = 0; i < 4; i++)
		sum += json_number_value(json_object_get(ex, names[i]));
	cr_assert_float_eq(sum, json_number_value(json_object_get(ex, "lifetime_seconds")), 1e-5);
	cr_assert_float_eq(json_number_value(json_object_get(ex, "busy_seconds")), 1.0, 1e-6);
	json_t *ra = find(ev, "request", 0), *rb = find(ev, "request", 1);
	cr_assert_str_eq(json_string_value(json_object_get(ra, "tenant")), "acme");
	cr_assert_str_eq(json_string_value(json_object_get(rb, "tenant")), "default");
	cr_assert_eq(json_integer_value(json_object_get(rb, "attempt")), 2);
	/* every event: type, ts (RFC 3339, ms, UTC), a unique eid */
	size_t i;
	json_t *e;
	json_array_foreach(ev, i, e) {
		const char *ts = json_string_value(json_object_get(e, "ts"));
		cr_assert(ts && strlen(ts) == 24 && ts[23] == 'Z' && ts[19] == '.', "ts %s", ts);
		for (size_t k = 0; k < i; k++)
			cr_assert_str_neq(json_string_value(json_object_get(e, "eid")),
					  json_string_value(json_object_get(json_array_get(ev, k), "eid")));
	}
	/* three closed intervals + the last: starting, idle, busy, idle */
	cr_assert_str_eq(json_string_value(json_object_get(find(ev, "state", 2), "state")), "busy");
	json_decref(ev);
	unlink(path);
}

Test(ledger, reopening_repairs_and_notes_a_crashed_worker)
{
	/* a worker that started and died: its pid is a reaped child's */
	pid_t pid = fork();
	if (pid == 0)
		_exit(0);
	waitpid(pid, NULL, 0);
	char host[64] = {0};
	gethostname(host, sizeof host - 1);
	char buf[1024];
	snprintf(buf, sizeof buf,
		 "{\"type\":\"worker_start\",\"ts\":\"2026-01-01T00:00:00.000Z\",\"eid\":\"x.1.1\","
		 "\"worker\":\"x\",\"boot\":1,\"mono\":0,\"pid\":%d,\"host\":\"%s\"}\n"
		 "{\"type\":\"tick\",\"ts\":\"2026-01-01T00:00:07.000Z\",\"eid\":\"x.1.2\","
		 "\"worker\":\"x\",\"boot\":1,\"mono\":7.25,\"state\":\"busy\"}\n"
		 "{\"type\":\"request\",\"id\":\"j",
		 (int)pid, host);
	char *p = tmpfile_with(buf);
	struct ledger_info in = {.worker = "y", .price_micro_per_hour = 1, .t_start = wk_now()};
	struct ledger *l;
	char err[WK_ERRSZ];
	cr_assert_eq(ledger_open(p, &in, &l, err, sizeof err), WK_OK, "%s", err);
	ledger_close(l);
	json_t *ev = events(p); /* every line parses now */
	json_t *rec = find(ev, "recovery", 0);
	cr_assert_not_null(rec);
	cr_assert_eq(json_integer_value(json_object_get(rec, "dropped_bytes")),
		     (json_int_t)strlen("{\"type\":\"request\",\"id\":\"j"));
	cr_assert_str_eq(json_string_value(json_object_get(rec, "dropped_text")),
			 "{\"type\":\"request\",\"id\":\"j");
	json_t *c = json_array_get(json_object_get(rec, "crashed"), 0);
	cr_assert_not_null(c);
	cr_assert_str_eq(json_string_value(json_object_get(c, "worker")), "x");
	cr_assert_float_eq(json_number_value(json_object_get(c, "lifetime_seconds")), 7.25, 1e-9);
	cr_assert_eq(json_integer_value(json_object_get(c, "billed_seconds")), 8);
	json_decref(ev);
	/* a second open notes nothing new */
	cr_assert_eq(ledger_open(p, &in, &l, err, sizeof err), WK_OK, "%s", err);
	ledger_close(l);
	ev = events(p);
	cr_assert_null(find(ev, "recovery", 1), "the crash was noted twice");
	json_decref(ev);
	unlink(p);
}
