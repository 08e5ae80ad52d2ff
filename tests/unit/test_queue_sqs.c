/* The sqs driver: its URL parser and ReceiveMessage decoder (pure), then the driver itself
 * against a real moto_server that each test starts on a free loopback port and kills at the
 * end (also when the test crashes: PR_SET_PDEATHSIG). The moto tests skip with a message when
 * moto_server is not installed (it is in our machine image; Debian does not package it). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wk.h"
#include "worker/queue.h"
#include "worker/queue_impl.h"

static char err[WK_ERRSZ];

/* ---- URL parser ---- */

Test(queue_sqs, url_parser)
{
	struct queue_sqs_url u;
	cr_assert_eq(queue_sqs_parse_url("sqs://127.0.0.1:4566/123456789012/jobs?region=eu-west-1&results=out"
					 "&tls=0&max_deliveries=3", &u, err, sizeof err), WK_OK, "%s", err);
	cr_assert_str_eq(u.host, "127.0.0.1");
	cr_assert_eq(u.port, 4566);
	cr_assert_str_eq(u.account, "123456789012");
	cr_assert_str_eq(u.queue, "jobs");
	cr_assert_str_eq(u.results, "out");
	cr_assert_str_eq(u.region, "eu-west-1");
	cr_assert(!u.tls);
	cr_assert_eq(u.max_deliveries, 3);

	/* defaults: https on the scheme's port, the region from an AWS host, <QUEUE>-results */
	cr_assert_eq(queue_sqs_parse_url("sqs://sqs.eu-central-1.amazonaws.com/123456789012/jobs", &u, err,
					 sizeof err), WK_OK, "%s", err);
	cr_assert_eq(u.port, 0);
	cr_assert(u.tls);
	cr_assert_str_eq(u.region, "eu-central-1");
	cr_assert_str_eq(u.results, "jobs-results");
	cr_assert_eq(u.max_deliveries, 0);
	cr_assert_eq(queue_sqs_parse_url("sqs://localhost/000000000000/q", &u, err, sizeof err), WK_OK);
	cr_assert_str_eq(u.region, "us-east-1");

	/* FIFO: the default results queue is FIFO too */
	cr_assert_eq(queue_sqs_parse_url("sqs://h/1/jobs.fifo", &u, err, sizeof err), WK_OK, "%s", err);
	cr_assert_str_eq(u.queue, "jobs.fifo");
	cr_assert_str_eq(u.results, "jobs-results.fifo");

	/* IPv6 */
	cr_assert_eq(queue_sqs_parse_url("sqs://[::1]:9324/000000000000/q?tls=1", &u, err, sizeof err), WK_OK,
		     "%s", err);
	cr_assert_str_eq(u.host, "::1");
	cr_assert_eq(u.port, 9324);

	/* an 80-character name is fine; its default results name is not */
	char name[81], url[200];
	memset(name, 'a', 80);
	name[80] = 0;
	snprintf(url, sizeof url, "sqs://h/1/%s?results=r", name);
	cr_assert_eq(queue_sqs_parse_url(url, &u, err, sizeof err), WK_OK, "%s", err);
	snprintf(url, sizeof url, "sqs://h/1/%s", name);
	cr_assert_eq(queue_sqs_parse_url(url, &u, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "results="), "%s", err);

	static const struct {
		const char *url, *why;
	} bad[] = {
		{"redis://h/1/q", "not an sqs:// URL"},
		{"sqs://host", "no account and queue"},
		{"sqs://host/123", "ACCOUNT/QUEUE"},
		{"sqs://host/123/", "queue name"},
		{"sqs:///1/q", "bad host"},
		{"sqs://user:pw@host/1/q", "bad port"},
		{"sqs://us@er@host/1/q", "bad host"},
		{"sqs://h:0/1/q", "bad port"},
		{"sqs://h:99999/1/q", "bad port"},
		{"sqs://h:/1/q", "bad port"},
		{"sqs://[::1/1/q", "unclosed ["},
		{"sqs://h/1/q?tls=2", "tls is 0"},
		{"sqs://h/1/q?region=EU", "region"},
		{"sqs://h/1/bad.name", "queue name"},
		{"sqs://h/1/.fifo", "queue name"},
		{"sqs://h/1/q/extra", "queue name"},
		{"sqs://h/acc.x/q", "account"},
		{"sqs://h/1/q?results=q", "must differ"},
		{"sqs://h/1/q?results=a+b", "results queue name"},
		{"sqs://h/1/q?foo=1", "unknown parameter 'foo'"},
		{"sqs://h/1/q?max_deliveries=0", "max_deliveries"},
		{"sqs://h/1/q?max_deliveries=x", "max_deliveries"},
		{"sqs://h/1/q?region", "without a value"},
		{"sqs://h/1/q?", "without a value"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		err[0] = 0;
		cr_expect_eq(queue_sqs_parse_url(bad[i].url, &u, err, sizeof err), WK_EINVAL, "%s accepted", bad[i].url);
		cr_expect(strstr(err, bad[i].why), "%s: '%s' lacks '%s'", bad[i].url, err, bad[i].why);
	}
	memset(name, 'b', 80);
	snprintf(url, sizeof url, "sqs://h/1/%sb", name); /* 81 characters */
	cr_assert_eq(queue_sqs_parse_url(url, &u, err, sizeof err), WK_EINVAL);
}

/* ---- ReceiveMessage decoder ---- */

static struct queue_sqs_msg *decode(const char *json, size_t max_body, int *n, int want_rc)
{
	struct queue_sqs_msg *m = NULL;
	int rc = queue_sqs_decode_receive(json, strlen(json), max_body, &m, n, err, sizeof err);
	cr_assert_eq(rc, want_rc, "rc %d (%s) for %s", rc, err, json);
	return m;
}

Test(queue_sqs, decode_receive)
{
	int n;
	struct queue_sqs_msg *m = decode("{}", 1000, &n, WK_OK);
	cr_assert_eq(n, 0);
	cr_assert_null(m);
	m = decode("{\"Messages\": []}", 1000, &n, WK_OK);
	cr_assert_eq(n, 0);

	const char *full =
		"{\"Messages\": [{\"MessageId\": \"m-1\", \"ReceiptHandle\": \"rh1\", \"Body\": \"{\\\"id\\\": \\\"a\\\"}\","
		" \"Attributes\": {\"ApproximateReceiveCount\": \"3\", \"SentTimestamp\": \"1700000000123\"},"
		" \"MessageAttributes\": {\"id\": {\"DataType\": \"String\", \"StringValue\": \"job-1\"}}},"
		/* no attribute: the body's id */
		"{\"MessageId\": \"m-2\", \"ReceiptHandle\": \"rh2\", \"Body\": \"{\\\"id\\\": \\\"from-body\\\"}\"},"
		/* no id anywhere: the MessageId, sanitised */
		"{\"MessageId\": \"ab/c:d\", \"ReceiptHandle\": \"rh3\", \"Body\": \"not json\","
		" \"Attributes\": {\"ApproximateReceiveCount\": \"x\"}},"
		/* an invalid attribute id and a Number attribute fall through to the body */
		"{\"MessageId\": \"m-4\", \"ReceiptHandle\": \"rh4\", \"Body\": \"{\\\"id\\\": \\\"b4\\\"}\","
		" \"MessageAttributes\": {\"id\": {\"DataType\": \"String\", \"StringValue\": \"a b\"}}},"
		"{\"MessageId\": \"m-5\", \"ReceiptHandle\": \"rh5\", \"Body\": \"{\\\"id\\\": \\\"b5\\\"}\","
		" \"MessageAttributes\": {\"id\": {\"DataType\": \"Number\", \"StringValue\": \"5\"}}},"
		/* no receipt: cannot be acknowledged, left out */
		"{\"MessageId\": \"m-6\", \"Body\": \"{}\"},"
		"{\"MessageId\": \"m-7\", \"ReceiptHandle\": \"\", \"Body\": \"{}\"},"
		"{\"MessageId\": \"m-8\", \"ReceiptHandle\": 7, \"Body\": \"{}\"},"
		/* no body; a NUL inside a body; a MessageId that would be '..' */
		"{\"MessageId\": \"m-9\", \"ReceiptHandle\": \"rh9\"},"
		"{\"MessageId\": \"..\", \"ReceiptHandle\": \"rh10\", \"Body\": \"a\\u0000b\"}]}";
	m = decode(full, 1000, &n, WK_OK);
	cr_assert_eq(n, 7);
	cr_assert_str_eq(m[0].id, "job-1");
	cr_assert_str_eq(m[0].receipt, "rh1");
	cr_assert_eq(m[0].kind, QUEUE_SQS_MSG_OK);
	cr_assert_str_eq(m[0].body, "{\"id\": \"a\"}");
	cr_assert_eq(m[0].len, strlen(m[0].body));
	cr_assert_eq(m[0].attempt, 3);
	cr_assert_float_eq(m[0].sent_at, 1700000000.123, 1e-6);
	cr_assert_str_eq(m[1].id, "from-body");
	cr_assert_eq(m[1].attempt, 1);
	cr_assert_eq(m[1].sent_at, 0);
	cr_assert_str_eq(m[2].id, "ab_c_d");
	cr_assert_eq(m[2].attempt, 1);
	cr_assert_str_eq(m[3].id, "b4");
	cr_assert_str_eq(m[4].id, "b5");
	cr_assert_str_eq(m[5].id, "m-9");
	cr_assert_eq(m[5].kind, QUEUE_SQS_MSG_BAD);
	cr_assert_null(m[5].body);
	cr_assert_str_eq(m[6].id, "__");
	cr_assert_eq(m[6].kind, QUEUE_SQS_MSG_OK);
	cr_assert_eq(m[6].len, 3);
	cr_assert_eq(memcmp(m[6].body, "a\0b", 4), 0);
	for (int i = 0; i < n; i++)
		cr_assert(job_id_valid(m[i].id), "%s", m[i].id);
	queue_sqs_msgs_free(m, n);

	/* bodies over max_body are TOO_BIG, with their length */
	m = decode("{\"Messages\": [{\"ReceiptHandle\": \"r\", \"Body\": \"0123456789\"}]}", 9, &n, WK_OK);
	cr_assert_eq(n, 1);
	cr_assert_eq(m[0].kind, QUEUE_SQS_MSG_TOO_BIG);
	cr_assert_eq(m[0].len, 10);
	cr_assert_null(m[0].body);
	cr_assert_str_eq(m[0].id, "r"); /* no MessageId: from the receipt */
	queue_sqs_msgs_free(m, n);

	/* receipts: 1,024 characters fit, 1,025 do not */
	char *big = malloc(4096);
	for (int len = 1024; len <= 1025; len++) {
		int o = snprintf(big, 4096, "{\"Messages\": [{\"MessageId\": \"x\", \"Body\": \"{}\", \"ReceiptHandle\": \"");
		memset(big + o, 'R', (size_t)len);
		snprintf(big + o + len, 4096 - (size_t)(o + len), "\"}]}");
		m = decode(big, 100, &n, WK_OK);
		cr_assert_eq(n, len == 1024 ? 1 : 0, "receipt of %d", len);
		if (n)
			cr_assert_eq(strlen(m[0].receipt), 1024);
		queue_sqs_msgs_free(m, n);
	}
	/* never more than SQS's 10 */
	int o = snprintf(big, 4096, "{\"Messages\": [");
	for (int i = 0; i < 12; i++)
		o += snprintf(big + o, 4096 - (size_t)o, "%s{\"ReceiptHandle\": \"r%d\", \"Body\": \"{}\"}", i ? "," : "", i);
	snprintf(big + o, 4096 - (size_t)o, "]}");
	m = decode(big, 100, &n, WK_OK);
	cr_assert_eq(n, QUEUE_SQS_RECEIVE_MAX);
	queue_sqs_msgs_free(m, n);
	free(big);

	/* whole-response errors */
	decode("not json", 100, &n, WK_EFORMAT);
	cr_assert(strstr(err, "not a JSON object"), "%s", err);
	decode("[1, 2]", 100, &n, WK_EFORMAT);
	decode("{\"Messages\": {}}", 100, &n, WK_EFORMAT);
	cr_assert(strstr(err, "not an array"), "%s", err);
	cr_assert_eq(n, 0);
	/* junk elements are skipped */
	m = decode("{\"Messages\": [1, null, \"x\", []]}", 100, &n, WK_OK);
	cr_assert_eq(n, 0);
}

/* ---- the driver against moto_server ---- */

static pid_t server = -1;
static int port;
static char moto[256];

static bool find_moto(void)
{
	FILE *p = popen("command -v moto_server 2>/dev/null", "r");
	moto[0] = 0;
	if (p) {
		if (!fgets(moto, sizeof moto, p))
			moto[0] = 0;
		pclose(p);
	}
	moto[strcspn(moto, "\n")] = 0;
	if (!moto[0] && access("/root/.pyenv/shims/moto_server", X_OK) == 0)
		snprintf(moto, sizeof moto, "/root/.pyenv/shims/moto_server");
	return moto[0] != 0;
}

static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(getsockname(s, (struct sockaddr *)&a, &l), 0);
	close(s);
	return ntohs(a.sin_port);
}

static bool port_open(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons((uint16_t)port)};
	bool ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
	close(s);
	return ok;
}

static void start_moto(void)
{
	server = fork();
	if (server == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		freopen("/dev/null", "w", stdout);
		freopen("/dev/null", "w", stderr);
		char p[16];
		snprintf(p, sizeof p, "%d", port);
		execl(moto, "moto_server", "-H", "127.0.0.1", "-p", p, (char *)NULL);
		_exit(127);
	}
}

static void setup(void)
{
	setenv("AWS_ACCESS_KEY_ID", "test", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "test", 1);
	unsetenv("AWS_SESSION_TOKEN");
	if (!find_moto())
		return;
	port = free_port();
	start_moto();
	for (int i = 0; i < 600 && !port_open(); i++)
		usleep(20000);
	cr_assert(port_open(), "moto_server did not start on port %d", port);
}

static void teardown(void)
{
	if (server > 0) {
		kill(server, SIGKILL);
		waitpid(server, NULL, 0);
	}
	server = -1;
}

#define NEED_MOTO()                                                                                \
	do {                                                                                       \
		if (server <= 0)                                                                   \
			cr_skip_test("moto_server not installed");                                \
	} while (0)

static double reconnect_s = 5;

/* The queue NAME on the SQS endpoint at loopback port p. */
static struct queue *open_q_at(int p, const char *name, const char *params, double lease)
{
	char url[256];
	snprintf(url, sizeof url, "sqs://127.0.0.1:%d/123456789012/%s?tls=0%s", p, name, params);
	struct queue_opts o = {.consumer = "t", .lease_s = lease, .reconnect_s = reconnect_s};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	cr_assert_str_eq(queue_driver(q), "sqs");
	return q;
}

/* ... on moto_server */
static struct queue *open_q(const char *name, const char *params, double lease)
{
	return open_q_at(port, name, params, lease);
}

static void submit(struct queue *q, const char *id)
{
	char body[256];
	int n = snprintf(body, sizeof body, "{\"id\": \"%s\", \"input\": {\"prompt\": \"hi\"}}", id);
	cr_assert_eq(queue_submit(q, id, body, (size_t)n, err, sizeof err), WK_OK, "%s", err);
}

static int complete(struct queue *q, struct queue_job *j, int n)
{
	struct queue_result r[16];
	char *res[16];
	for (int i = 0; i < n; i++) {
		size_t len;
		res[i] = job_encode_error(j[i].id, JOB_COMPLETED, JOB_OK, NULL, "t", j[i].attempt, &len);
		r[i] = (struct queue_result){.job = &j[i], .json = res[i], .len = len};
	}
	int rc = queue_complete(q, r, n, err, sizeof err);
	for (int i = 0; i < n; i++) {
		free(res[i]);
		queue_job_free(&j[i]);
	}
	return rc;
}

static int take(struct queue *q, struct queue_job *j, int max, double wait)
{
	int n = -1;
	cr_assert_eq(queue_take(q, j, max, wait, &n, err, sizeof err), WK_OK, "%s", err);
	return n;
}

TestSuite(queue_sqs_moto, .init = setup, .fini = teardown, .timeout = 90);

Test(queue_sqs_moto, submit_take_complete_wait)
{
	NEED_MOTO();
	struct queue *q = open_q("jobs", "", 30);
	for (int i = 0; i < 12; i++) {
		char id[16];
		snprintf(id, sizeof id, "j%d", i);
		submit(q, id);
	}
	struct queue_job j[16];
	int got = 0, seen[12] = {0};
	for (int round = 0; round < 10 && got < 12; round++) {
		int n = take(q, j, 16, 1);
		for (int i = 0; i < n; i++) {
			cr_assert_eq(j[i].attempt, 1);
			cr_assert_gt(j[i].enqueued_at, 1e9);
			cr_assert_gt(strlen(j[i].handle), 0);
			cr_assert(strstr(j[i].body, j[i].id), "%s / %s", j[i].id, j[i].body);
			int k = atoi(j[i].id + 1);
			cr_assert_eq(seen[k]++, 0, "%s delivered twice", j[i].id);
		}
		cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
		got += n;
	}
	cr_assert_eq(got, 12);
	cr_assert_eq(take(q, j, 16, 0), 0);
	long backlog = -1; /* (every job completed and deleted) */
	cr_assert_eq(queue_backlog(q, &backlog, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(backlog, 0);

	char *res = NULL;
	size_t len = 0;
	cr_assert_eq(queue_wait_result(q, "j7", 5, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_assert(strstr(res, "\"j7\"") && strstr(res, "COMPLETED"), "%s", res);
	cr_assert_eq(strlen(res), len);
	free(res);
	/* taken from the results queue: a second wait finds nothing */
	cr_assert_eq(queue_wait_result(q, "j7", 1, &res, &len, err, sizeof err), WK_ENOTFOUND);
	cr_assert_eq(queue_cancel(q, "j1", err, sizeof err), WK_EUNSUPPORTED);

	/* the backlog: 2 queued, then 1 queued and 1 taken (visibility 30 s) */
	submit(q, "k1");
	submit(q, "k2");
	cr_assert_eq(queue_backlog(q, &backlog, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(backlog, 2);
	int nk = take(q, j, 1, 1);
	cr_assert_eq(nk, 1);
	cr_assert_eq(queue_backlog(q, &backlog, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(backlog, 2, "a taken job still counts");
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	nk = 0;
	for (int round = 0; round < 5 && !nk; round++)
		nk = take(q, j, 1, 1);
	cr_assert_eq(nk, 1);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	cr_assert_eq(queue_backlog(q, &backlog, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(backlog, 0);
	/* the same id again: this process completed it, so it is deleted without running */
	submit(q, "j3");
	cr_assert_eq(take(q, j, 4, 1), 0);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_assert_eq(st.taken, 14); /* (with k1 and k2) */
	cr_assert_eq(st.completed, 14);
	cr_assert_eq(st.redelivered_done, 1);
	cr_assert_geq(st.syncs, 2);
	queue_close(q);
}

/* The worker's committer stores results through a second handle: the job is deleted there,
 * and the handle that took it, told so, no longer holds its receipt and knows a redelivery
 * of its id as done (deleted without running). */
Test(queue_sqs_moto, a_job_completed_through_another_handle)
{
	NEED_MOTO();
	struct queue *q = open_q("jobs2", "", 30), *qc = open_q("jobs2", "", 30);
	submit(q, "d1");
	struct queue_job j[2];
	int n = 0;
	for (int round = 0; round < 5 && !n; round++)
		n = take(q, j, 1, 1);
	cr_assert_eq(n, 1);
	struct queue_job copy = j[0];
	copy.body = NULL; /* (complete frees the job's body; q is told of the copy) */
	cr_assert_eq(complete(qc, j, 1), WK_OK, "%s", err);
	long backlog = -1;
	cr_assert_eq(queue_backlog(q, &backlog, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(backlog, 0, "the job was not deleted through the second handle");
	queue_done_elsewhere(q, &copy);
	submit(q, "d1"); /* the same id again: q knows it done */
	cr_assert_eq(take(q, j, 2, 1), 0);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_expect_eq(st.redelivered_done, 1);
	/* a job q took and that no one said was done stays its own to release */
	submit(q, "d2");
	n = 0;
	for (int round = 0; round < 5 && !n; round++)
		n = take(q, j, 1, 1);
	cr_assert_eq(n, 1);
	cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK, "%s", err);
	queue_job_free(&j[0]);
	queue_close(qc);
	queue_close(q);
}

Test(queue_sqs_moto, release_extend_dead_letter)
{
	NEED_MOTO();
	struct queue *q = open_q("dl", "&max_deliveries=2", 30);
	submit(q, "x");
	struct queue_job j[4];
	for (int attempt = 1; attempt <= 2; attempt++) {
		cr_assert_eq(take(q, j, 4, 2), 1);
		cr_assert_str_eq(j[0].id, "x");
		cr_assert_eq(j[0].attempt, attempt);
		int rc[1];
		cr_assert_eq(queue_extend(q, j, 1, 10, rc, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(rc[0], WK_OK);
		cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK, "%s", err);
		queue_job_free(&j[0]);
	}
	/* the third delivery is past max_deliveries: a FAILED result, the message deleted */
	cr_assert_eq(take(q, j, 4, 2), 0);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_assert_eq(st.dead_lettered, 1);
	cr_assert_eq(st.released, 2);
	char *res = NULL;
	size_t len;
	cr_assert_eq(queue_wait_result(q, "x", 5, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_assert(strstr(res, "FAILED") && strstr(res, "dead-lettered"), "%s", res);
	free(res);
	cr_assert_eq(take(q, j, 4, 1), 0);

	/* a receipt SQS does not know: the lease is lost */
	memset(j, 0, sizeof j);
	snprintf(j[0].id, sizeof j[0].id, "gone");
	snprintf(j[0].handle, sizeof j[0].handle, "not-a-receipt");
	int rc[1] = {99};
	cr_assert_eq(queue_extend(q, j, 1, 10, rc, err, sizeof err), WK_ENOTFOUND, "%s", err);
	cr_assert_eq(rc[0], WK_ENOTFOUND);
	cr_assert(strstr(err, "gone"), "%s", err);
	queue_close(q);
}

Test(queue_sqs_moto, visibility_expiry_redelivers)
{
	NEED_MOTO();
	struct queue *a = open_q("vis.fifo", "", 1), *b = open_q("vis.fifo", "", 1);
	submit(a, "v");
	struct queue_job j[2];
	cr_assert_eq(take(a, j, 2, 2), 1);
	/* a "dies" holding it: after the 1 s lease, b receives it as attempt 2 */
	struct queue_job k[2];
	int n = 0;
	for (int i = 0; i < 5 && n == 0; i++)
		n = take(b, k, 2, 1);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(k[0].id, "v");
	cr_assert_eq(k[0].attempt, 2);
	/* both finish it; the FIFO results queue keeps one result */
	cr_assert_eq(complete(b, k, 1), WK_OK, "%s", err);
	cr_assert_eq(complete(a, j, 1), WK_OK, "%s", err);
	char *res = NULL;
	size_t len;
	cr_assert_eq(queue_wait_result(b, "v", 5, &res, &len, err, sizeof err), WK_OK, "%s", err);
	free(res);
	cr_assert_eq(queue_wait_result(b, "v", 1, &res, &len, err, sizeof err), WK_ENOTFOUND);
	queue_close(a);
	queue_close(b);
}

Test(queue_sqs_moto, errors_are_clear)
{
	struct queue *q;
	struct queue_opts o = {.reconnect_s = 0.3};
	char url[160];
	/* no credentials */
	unsetenv("AWS_ACCESS_KEY_ID");
	snprintf(url, sizeof url, "sqs://127.0.0.1:1/123456789012/q?tls=0");
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "AWS_ACCESS_KEY_ID"), "%s", err);
	/* nothing listening: the action is named, the credentials are not */
	setenv("AWS_ACCESS_KEY_ID", "AKIDSECRETKEYID", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value", 1);
	int p = free_port();
	snprintf(url, sizeof url, "sqs://127.0.0.1:%d/123456789012/q?tls=0", p);
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EIO);
	cr_assert(strstr(err, "GetQueueUrl") && strstr(err, "gave up"), "%s", err);
	cr_assert_null(strstr(err, "AKIDSECRETKEYID"), "%s", err);
	cr_assert_null(strstr(err, "very-secret-value"), "%s", err);
	cr_assert_eq(queue_open("sqs://h/1/q?tls=7", &o, &q, err, sizeof err), WK_EINVAL);
	NEED_MOTO();
	/* invalid UTF-8 cannot travel in an SQS message */
	q = open_q("u", "", 30);
	cr_assert_eq(queue_submit(q, "bad", "{\"x\": \"\xff\"}", 10, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "UTF-8"), "%s", err);
	queue_close(q);
}

Test(queue_sqs_moto, reconnects_after_a_restart)
{
	NEED_MOTO();
	reconnect_s = 60;
	struct queue *q = open_q("rs", "", 30);
	submit(q, "before");
	teardown();
	start_moto(); /* the same port, empty: the driver retries, then creates its queues again */
	submit(q, "after");
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_assert_geq(st.reconnects, 1);
	struct queue_job j[4];
	cr_assert_eq(take(q, j, 4, 2), 1);
	cr_assert_str_eq(j[0].id, "after"); /* "before" went with the old server */
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	char *res = NULL;
	size_t len;
	cr_assert_eq(queue_wait_result(q, "after", 5, &res, &len, err, sizeof err), WK_OK, "%s", err);
	free(res);
	queue_close(q);
}

Test(queue_sqs_moto, oversized_messages)
{
	NEED_MOTO();
	struct queue *q = open_q("big", "", 30);
	/* SQS refuses a job over its message size: the action and AWS's words come back */
	size_t n = 1100 * 1024;
	char *job = malloc(n + 64);
	int o = snprintf(job, 64, "{\"id\": \"big\", \"input\": {\"prompt\": \"");
	memset(job + o, 'x', n);
	snprintf(job + o + n, 64, "\"}}");
	cr_assert_eq(queue_submit(q, "big", job, strlen(job), err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "SendMessage") && strstr(err, "InvalidParameterValue") && strstr(err, "HTTP 400"),
		  "%s", err);
	/* a result too large for the results queue is replaced by a FAILED one, so the job ends */
	submit(q, "r");
	struct queue_job j[2];
	cr_assert_eq(take(q, j, 2, 2), 1);
	struct job_result jr = {.id = "r", .status = JOB_COMPLETED, .text = job, .worker = "t", .attempt = 1};
	size_t len;
	char *res = job_encode_result(&jr, &len);
	struct queue_result r = {.job = &j[0], .json = res, .len = len};
	cr_assert_eq(queue_complete(q, &r, 1, err, sizeof err), WK_OK, "%s", err);
	free(res);
	queue_job_free(&j[0]);
	cr_assert_eq(queue_wait_result(q, "r", 5, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_assert(strstr(res, "FAILED") && strstr(res, "refused by the results queue"), "%s", res);
	free(res);
	cr_assert_eq(take(q, j, 2, 1), 0); /* deleted: it does not come back */
	free(job);
	queue_close(q);
}

/* ---- credentials (worker/aws_creds.h): each source against moto_server, which serves STS
 * and EC2 instance metadata; the container endpoint is pointed at moto's metadata
 * credentials, the same JSON document ---- */

#include "worker/aws_creds.h"

static void no_aws_env(void)
{
	static const char *const vars[] = {
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN",
		"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME", "AWS_ENDPOINT_URL_STS",
		"AWS_ENDPOINT_URL", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_SERVICE_ENDPOINT",
		"AWS_EC2_METADATA_V1_DISABLED"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
		unsetenv(vars[i]);
	setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
}

Test(aws_creds, times_and_due)
{
	cr_expect_eq(aws_creds_parse_time("2026-12-04T22:33:05Z"), (time_t)1796423585);
	cr_expect_eq(aws_creds_parse_time("2026-12-04T22:33:05.384405Z"), (time_t)1796423585);
	cr_expect_eq(aws_creds_parse_time("2026-12-04T22:33:05+00:00"), (time_t)1796423585);
	cr_expect_eq(aws_creds_parse_time("2026-12-04 22:33:05"), (time_t)-1);
	cr_expect_eq(aws_creds_parse_time("2026-12-04T22:33:05+01:00"), (time_t)-1);
	cr_expect_eq(aws_creds_parse_time(""), (time_t)-1);
	struct aws_creds c = {.expires = 1000000};
	cr_expect(!aws_creds_due(&c, 1000000 - 301));
	cr_expect(aws_creds_due(&c, 1000000 - 300));
	cr_expect(aws_creds_due(&c, 1000000 + 5));
	c.expires = 0; /* long-term keys */
	cr_expect(!aws_creds_due(&c, 1L << 40));
}

Test(aws_creds, environment_and_its_errors)
{
	struct aws_creds c;
	no_aws_env();
	setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "only AWS_ACCESS_KEY_ID is set"), "%s", err);
	setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t", 1);
	setenv("AWS_SESSION_TOKEN", "tok", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(c.key, "AKIDEXAMPLE");
	cr_expect_str_eq(c.token, "tok");
	cr_expect_str_eq(c.source, "environment");
	cr_expect_eq(c.expires, 0);
	aws_creds_free(&c);
	cr_expect_null(c.key);
	/* a value that cannot stand in a header (a Secret made from a file keeps its newline):
	 * named, where, never shown */
	setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t\n", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "secret access key has a line break at byte 6"), "%s", err);
	cr_expect_null(strstr(err, "s3cr3t"), "%s", err);
	setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t", 1);
	setenv("AWS_SESSION_TOKEN", "to\x01k", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "session token has a control or non-ASCII byte at byte 2"), "%s", err);
	/* nothing anywhere (metadata disabled): every source is named */
	no_aws_env();
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "no AWS credentials") && strstr(err, "AWS_WEB_IDENTITY_TOKEN_FILE") &&
		  strstr(err, "AWS_CONTAINER_CREDENTIALS_FULL_URI") &&
		  strstr(err, "disabled by AWS_EC2_METADATA_DISABLED"), "%s", err);
	/* metadata on, but nothing listens there: the end of the chain, not a hang */
	unsetenv("AWS_EC2_METADATA_DISABLED");
	char ep[64];
	snprintf(ep, sizeof ep, "http://127.0.0.1:%d", free_port());
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
	double t0 = wk_now();
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "none answered"), "%s", err);
	cr_expect_lt(wk_now() - t0, 3.0);
	/* a web identity half set up, and one whose token file is missing */
	no_aws_env();
	setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/wick", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "only AWS_ROLE_ARN is set"), "%s", err);
	setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/wick-token", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "web identity") && strstr(err, "/nonexistent/wick-token"), "%s", err);
}

TestSuite(aws_creds_moto, .init = setup, .fini = teardown, .timeout = 90);

Test(aws_creds_moto, web_identity_container_and_instance_metadata)
{
	NEED_MOTO();
	struct aws_creds c;
	char ep[96], path[64];
	snprintf(ep, sizeof ep, "http://127.0.0.1:%d/", port);
	/* web identity: STS AssumeRoleWithWebIdentity with the token file's JWT */
	no_aws_env();
	snprintf(path, sizeof path, "/tmp/wick-wi-%d", (int)getpid());
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3aWNrIn0.c2ln\n", f);
	fclose(f);
	setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/wick", 1);
	setenv("AWS_WEB_IDENTITY_TOKEN_FILE", path, 1);
	setenv("AWS_ENDPOINT_URL_STS", ep, 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(c.source, "web identity");
	cr_expect(!strncmp(c.key, "ASIA", 4), "%s", c.key); /* a temporary key */
	cr_expect(c.secret && strlen(c.secret) >= 20);
	cr_expect(c.token && strlen(c.token) > 20);
	time_t now = time(NULL);
	cr_expect(c.expires > now + 3000 && c.expires <= now + 3700, "expires in %ld s",
		  (long)(c.expires - now));
	cr_expect(!aws_creds_due(&c, now) && aws_creds_due(&c, c.expires - 60));
	aws_creds_free(&c);
	/* the SQS driver on those credentials */
	struct queue *q = open_q("wi", "", 30);
	submit(q, "w1");
	struct queue_job j[2];
	cr_assert_eq(take(q, j, 2, 2), 1);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	queue_close(q);
	unlink(path);
	/* the container endpoint (ECS, EKS Pod Identity), with an authorization token file */
	no_aws_env();
	char full[160];
	snprintf(full, sizeof full, "%slatest/meta-data/iam/security-credentials/default-role", ep);
	setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", full, 1);
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/nonexistent/wick-auth", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "container") && strstr(err, "/nonexistent/wick-auth"), "%s", err);
	unsetenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer abc", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(c.source, "container");
	cr_expect_str_eq(c.key, "test-key");
	cr_expect_str_eq(c.token, "test-session-token");
	cr_expect_gt(c.expires, now + 3600);
	aws_creds_free(&c);
	/* plain http to anywhere but loopback or the ECS / EKS addresses: refused (the
	 * Authorization token goes there) */
	setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://credentials.example.com/v1", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "plain http only"), "%s", err);
	setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.23:1/v1/credentials", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL); /* allowed; none there */
	cr_expect(!strstr(err, "plain http only") && strstr(err, "container"), "%s", err);
	/* a metadata service that is not EC2's (no IMDSv2 token: 404): the chain's end */
	no_aws_env();
	unsetenv("AWS_EC2_METADATA_DISABLED");
	char other[128];
	snprintf(other, sizeof other, "%snothing", ep);
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", other, 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "no AWS credentials") && strstr(err, "HTTP 404"), "%s", err);
	/* EC2 instance metadata (IMDSv2) */
	no_aws_env();
	unsetenv("AWS_EC2_METADATA_DISABLED");
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(c.source, "instance metadata");
	cr_expect_str_eq(c.secret, "test-secret-key");
	aws_creds_free(&c);
	q = open_q("md", "", 30);
	submit(q, "m1");
	cr_assert_eq(take(q, j, 2, 2), 1);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	queue_close(q);
	/* STS refusing: named, not a fall-through to metadata */
	no_aws_env();
	unsetenv("AWS_EC2_METADATA_DISABLED");
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
	setenv("AWS_ROLE_ARN", "not-an-arn", 1);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("x", f);
	fclose(f);
	setenv("AWS_WEB_IDENTITY_TOKEN_FILE", path, 1);
	setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1/", 1);
	cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "web identity") && strstr(err, "STS"), "%s", err);
	unlink(path);
}

/* SQS answering ExpiredToken (tests/tools/aws_fault_proxy.py in front of moto, also serving
 * its instance metadata): the driver fetches the credentials again and sends the request
 * once more; the job goes through and the role's credentials were fetched twice. */
static int proxy_counts(int pport, const char *key)
{
	char cmd[160], buf[256] = "";
	snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/__counts", pport);
	FILE *p = popen(cmd, "r");
	if (p) {
		if (!fgets(buf, sizeof buf, p))
			buf[0] = 0;
		pclose(p);
	}
	char k[32];
	snprintf(k, sizeof k, "\"%s\": ", key);
	const char *at = strstr(buf, k);
	return at ? atoi(at + strlen(k)) : -1;
}

/* tests/tools/aws_fault_proxy.py on pport in front of moto (expire_in: its credentials'
 * lifetime in seconds, "0" for moto's own; fail_after: credential fetches that succeed, "-1"
 * all; token: its IMDSv2 token requests "ok", "405" or "hang"), and the environment pointed at
 * it for instance metadata: the SQS driver's credentials come through it. */
static pid_t fault_proxy_imds(int pport, const char *expire_in, const char *fail_after,
			      const char *token)
{
	if (system("command -v python3 >/dev/null 2>&1") != 0)
		cr_skip_test("python3 is missing");
	pid_t proxy = fork();
	if (proxy == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		char a[16], b[16];
		snprintf(a, sizeof a, "%d", pport);
		snprintf(b, sizeof b, "%d", port);
		execlp("python3", "python3", "tests/tools/aws_fault_proxy.py", "--port", a, "--target", b,
		       "--creds-expire-in", expire_in, "--fail-creds-after", fail_after, "--imds-token",
		       token, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 300 && proxy_counts(pport, "sqs") < 0; i++)
		usleep(20000);
	cr_assert_eq(proxy_counts(pport, "sqs"), 0, "the proxy did not start");
	no_aws_env();
	unsetenv("AWS_EC2_METADATA_DISABLED");
	char ep[64];
	snprintf(ep, sizeof ep, "http://127.0.0.1:%d", pport);
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
	return proxy;
}

static pid_t fault_proxy(int pport, const char *expire_in, const char *fail_after)
{
	return fault_proxy_imds(pport, expire_in, fail_after, "ok");
}

/* Takes up to 3 jobs within 5 one-second polls; how many came. */
static int take_up_to_3(struct queue *q)
{
	struct queue_job j[3];
	int got = 0;
	for (int t = 0; t < 5 && got < 3; t++)
		got += take(q, j + got, 3 - got, 1);
	for (int i = 0; i < got; i++)
		queue_job_free(&j[i]);
	return got;
}

static void proxy_get(int pport, const char *what)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "curl -s -o /dev/null http://127.0.0.1:%d/%s", pport, what);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(aws_creds_moto, expired_token_is_fetched_again_and_retried)
{
	NEED_MOTO();
	int pport = free_port();
	pid_t proxy = fault_proxy(pport, "0", "-1");
	struct queue *q = open_q_at(pport, "exp", "", 30);
	submit(q, "x0");
	proxy_get(pport, "__arm");
	submit(q, "x1"); /* meets the expiry */
	submit(q, "x2");
	cr_expect_eq(proxy_counts(pport, "expired"), 1);
	cr_expect_eq(proxy_counts(pport, "creds"), 2, "credentials fetched at open and after the expiry");
	cr_expect_eq(take_up_to_3(q), 3, "every job was sent once");
	queue_close(q);
	kill(proxy, SIGKILL);
	waitpid(proxy, NULL, 0);
}

/* Instance metadata without IMDSv2: the token request refused (HTTP 405) or never answered (a
 * container behind a bridge, the PUT response hop limit 1): the credentials come from IMDSv1,
 * as the AWS SDKs fall back; with AWS_EC2_METADATA_V1_DISABLED=true they do not, and the
 * chain ends naming both answers. With IMDSv2 answering, no request goes without a token. */
Test(aws_creds_moto, imdsv1_when_the_token_request_fails)
{
	NEED_MOTO();
	static const char *const modes[] = {"405", "hang", "ok"};
	for (int m = 0; m < 3; m++) {
		int pport = free_port();
		pid_t proxy = fault_proxy_imds(pport, "0", "-1", modes[m]);
		struct aws_creds c = {0};
		char err[WK_ERRSZ] = "";
		cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_OK, "%s: %s",
			     modes[m], err);
		bool ok = m == 2;
		cr_expect_str_eq(c.source, ok ? "instance metadata" : "instance metadata (IMDSv1)");
		cr_expect_str_eq(c.secret, "test-secret-key");
		aws_creds_free(&c);
		int v1 = proxy_counts(pport, "v1");
		cr_expect(ok ? v1 == 0 : v1 >= 2, "%s: %d requests without a token", modes[m], v1);
		if (m == 0) {
			setenv("AWS_EC2_METADATA_V1_DISABLED", "true", 1);
			cr_assert_eq(aws_creds_load(&c, "us-east-1", err, sizeof err), WK_EINVAL);
			cr_expect(strstr(err, "no AWS credentials") && strstr(err, "HTTP 405"), "%s", err);
			cr_expect_eq(proxy_counts(pport, "v1"), v1, "IMDSv1 asked though disabled");
			unsetenv("AWS_EC2_METADATA_V1_DISABLED");
		}
		kill(proxy, SIGKILL);
		waitpid(proxy, NULL, 0);
	}
}

/* Credentials 200 s from their expiry are due for a refresh (5 minutes before it). When the
 * refresh fails, the old ones serve and the next try waits 30 s; when it brings credentials
 * as short-lived, likewise: an open and three requests make two credential fetches, not one
 * a request (each may cost a source's whole timeout). */
static void short_lived(const char *fail_after)
{
	int pport = free_port();
	pid_t proxy = fault_proxy(pport, "200", fail_after);
	struct queue *q = open_q_at(pport, "ref", "", 30);
	submit(q, "r0");
	submit(q, "r1");
	submit(q, "r2");
	cr_expect_eq(proxy_counts(pport, "creds"), 2, "%d credential fetches for an open and 3 "
		     "requests: want the open's and one refresh", proxy_counts(pport, "creds"));
	cr_expect_eq(take_up_to_3(q), 3, "the credentials served");
	queue_close(q);
	kill(proxy, SIGKILL);
	waitpid(proxy, NULL, 0);
}

Test(aws_creds_moto, a_failed_refresh_is_not_retried_on_every_request)
{
	NEED_MOTO();
	short_lived("1");
}

Test(aws_creds_moto, short_lived_credentials_are_not_fetched_on_every_request)
{
	NEED_MOTO();
	short_lived("-1");
}
