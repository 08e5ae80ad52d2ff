/* The redis queue driver against a real redis-server that each test starts on a free loopback
 * port and kills at the end (also when the test fails or crashes: PR_SET_PDEATHSIG). Skipped
 * with a message when redis-server is not installed (scripts/install-deps installs it). */
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wk.h"
#include "tests/unit/refusals.h"
#include "worker/queue.h"
#include "worker/queue_impl.h"

static pid_t server = -1;
static int port;
static char dir[64], url[160], err[WK_ERRSZ];

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

static bool have_redis(void) { return system("command -v redis-server >/dev/null 2>&1") == 0; }

/* Starts redis-server on `port` (append-only file in dir when aof, plus extra arguments) and
 * waits until it answers PING (ready) or, with !ready, until it answers anything. */
static pid_t start_redis_with(bool aof, const char *const *extra, bool ready)
{
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		freopen("/dev/null", "w", stdout);
		char p[16];
		snprintf(p, sizeof p, "%d", port);
		const char *argv[32] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
					"--appendonly", aof ? "yes" : "no", "--appendfsync", "always", "--dir", dir,
					"--daemonize", "no"};
		int n = 15;
		for (int i = 0; extra && extra[i] && n < 31; i++)
			argv[n++] = extra[i];
		argv[n] = NULL;
		execvp("redis-server", (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct timeval tv = {.tv_sec = 1};
		redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
		if (c && !c->err) {
			redisReply *r = redisCommand(c, "PING");
			bool ok = r && (r->type == REDIS_REPLY_STATUS || !ready);
			if (r)
				freeReplyObject(r);
			redisFree(c);
			if (ok)
				return pid;
		} else if (c) {
			redisFree(c);
		}
		usleep(10000);
	}
	return -1;
}

static pid_t start_redis(bool aof) { return start_redis_with(aof, NULL, true); }

static void stop_redis(void)
{
	if (server > 0) {
		kill(server, SIGKILL);
		waitpid(server, NULL, 0);
	}
	server = -1;
}

static void setup(void)
{
	if (!have_redis())
		return;
	snprintf(dir, sizeof dir, "/tmp/wick-redis-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	port = free_port();
	snprintf(url, sizeof url, "redis://127.0.0.1:%d/jobs", port);
	server = start_redis(false);
	cr_assert_gt(server, 0, "redis-server did not start on port %d", port);
}

static void teardown(void)
{
	stop_redis();
	if (dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	}
}

TestSuite(queue_redis, .init = setup, .fini = teardown, .timeout = 90);

#define NEED_REDIS()                                                                               \
	do {                                                                                       \
		if (!have_redis())                                                                 \
			cr_skip_test("redis-server is not installed (scripts/install-deps)");      \
	} while (0)

static struct queue *open_q(const char *u, const char *consumer, double lease)
{
	struct queue_opts o = {.consumer = consumer, .lease_s = lease, .reconnect_s = 20};
	struct queue *q;
	cr_assert_eq(queue_open(u, &o, &q, err, sizeof err), WK_OK, "%s", err);
	return q;
}

static void submit(struct queue *q, const char *id)
{
	char body[256];
	int n = snprintf(body, sizeof body, "{\"id\": \"%s\", \"input\": {\"prompt\": \"hi\"}}", id);
	cr_assert_eq(queue_submit(q, id, body, (size_t)n, err, sizeof err), WK_OK, "%s", err);
}

static int complete(struct queue *q, struct queue_job *j, int n)
{
	struct queue_result r[64];
	char *res[64];
	for (int i = 0; i < n; i++) {
		size_t len;
		res[i] = job_encode_error(j[i].id, JOB_COMPLETED, JOB_OK, NULL, queue_driver(q), j[i].attempt, &len);
		r[i] = (struct queue_result){.job = &j[i], .json = res[i], .len = len};
	}
	int rc = queue_complete(q, r, n, err, sizeof err);
	for (int i = 0; i < n; i++) {
		free(res[i]);
		queue_job_free(&j[i]);
	}
	return rc;
}

static long long redis_int(const char *cmd)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	cr_assert(c && !c->err);
	redisReply *r = redisCommand(c, cmd);
	cr_assert_not_null(r);
	long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	freeReplyObject(r);
	redisFree(c);
	return v;
}

static long long count_results(void)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	cr_assert(c && !c->err);
	redisReply *r = redisCommand(c, "EVAL %s 0", "return #redis.call('KEYS', 'jobs:result:*')");
	cr_assert(r && r->type == REDIS_REPLY_INTEGER);
	long long v = r->integer;
	freeReplyObject(r);
	redisFree(c);
	return v;
}

Test(queue_redis, url_parser, .init = NULL, .fini = NULL)
{
	struct queue_redis_url u;
	cr_assert_eq(queue_redis_parse_url("redis://h:7000/s", &u, err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(u.host, "h");
	cr_expect_eq(u.port, 7000);
	cr_expect_str_eq(u.stream, "s");
	cr_expect_str_eq(u.group, "wick");
	cr_expect_str_eq(u.dead, "s:dead");
	cr_expect_eq(u.result_ttl, 7 * 86400);
	cr_expect(!u.tls);
	cr_assert_eq(queue_redis_parse_url("redis://[::1]/a:b?group=g1&dead=d&max_deliveries=3&result_ttl=0",
					   &u, err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(u.host, "::1");
	cr_expect_eq(u.port, 6379);
	cr_expect_str_eq(u.stream, "a:b");
	cr_expect_str_eq(u.group, "g1");
	cr_expect_str_eq(u.dead, "d");
	cr_expect_eq(u.max_deliveries, 3);
	cr_expect_eq(u.result_ttl, 0);
	const char *bad[] = {"redis://h", "redis://h:0/s", "redis://h:99999/s", "redis://h:x/s", "redis:///s",
			     "redis://h/", "redis://h/a b", "redis://h/s?group=", "redis://h/s?bogus=1",
			     "redis://h/s?max_deliveries=0", "redis://h/s?max_deliveries=x", "redis://u:p@h/s",
			     "redis://h/s?group", "redis://[::1/s", "http://h/s"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_expect_neq(queue_redis_parse_url(bad[i], &u, err, sizeof err), WK_OK, "%s parsed", bad[i]);
	/* credentials in the URL: refused, saying where they go, without echoing the password */
	const char *cred[] = {"redis://u:hunter2pw@h:7000/s", "redis://:hunter2pw@h", "redis://hunter2pw@h/s?x=@",
			      "redis://:hunter/2pw@h:7000/s", "rediss://default:hunter2pw@h:6380/s"};
	for (size_t i = 0; i < sizeof cred / sizeof cred[0]; i++) {
		cr_expect_eq(queue_redis_parse_url(cred[i], &u, err, sizeof err), WK_EINVAL, "%s", cred[i]);
		cr_expect(strstr(err, "WICK_REDIS_PASSWORD") && !strstr(err, "hunter"), "%s", err);
		/* and through the driver choice every command uses */
		cr_expect_eq(queue_check_url(cred[i], err, sizeof err), WK_EINVAL, "%s", cred[i]);
		cr_expect(strstr(err, "WICK_REDIS_PASSWORD") && !strstr(err, "hunter"), "%s", err);
	}
	cr_expect_eq(queue_check_url("sqs://AKID:hunter2pw@sqs.us-east-1.amazonaws.com/1/q", err, sizeof err),
		     WK_EINVAL);
	cr_expect(strstr(err, "AWS_ACCESS_KEY_ID") && !strstr(err, "hunter"), "%s", err);
	cr_expect_eq(queue_check_url("rediss://h:6380/s", err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(queue_redis_parse_url("rediss://h:6380/s?group=g", &u, err, sizeof err), WK_OK);
	cr_expect(u.tls && !strcmp(u.host, "h") && u.port == 6380 && !strcmp(u.group, "g"));
	cr_expect_neq(queue_redis_parse_url("redisss://h/s", &u, err, sizeof err), WK_OK);
}

Test(queue_redis, submit_take_complete_cancel)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30), *q = open_q(url, "w1", 30);
	cr_expect_str_eq(queue_driver(q), "redis");
	submit(p, "a");
	submit(p, "b");
	cr_assert_eq(queue_cancel(p, "b", err, sizeof err), WK_OK, "%s", err);
	struct queue_job j[8];
	int n;
	cr_assert_eq(queue_take(q, j, 8, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 2);
	for (int i = 0; i < n; i++) {
		cr_expect_eq(j[i].attempt, 1);
		cr_expect_gt(j[i].enqueued_at, 1.7e9);
		cr_expect_not_null(strstr(j[i].body, j[i].id));
		cr_expect_eq(j[i].cancelled, !strcmp(j[i].id, "b"), "%s", j[i].id);
	}
	int rc[8];
	cr_expect_eq(queue_extend(q, j, n, 30, rc, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(redis_int("XLEN jobs"), 2);
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(p, "a", 2, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_not_null(strstr(res, "\"status\": \"COMPLETED\""), "%s", res);
	free(res);
	cr_expect_eq(queue_wait_result(p, "zzz", 0.2, &res, &len, err, sizeof err), WK_ENOTFOUND);
	cr_expect_eq(queue_submit(p, "a", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(redis_int("XLEN jobs:results"), 2);
	cr_expect_eq(redis_int("EXISTS jobs:result:b"), 1);
	/* nothing pending now */
	double t = wk_now();
	cr_assert_eq(queue_take(q, j, 8, 0.3, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect_geq(wk_now() - t, 0.25);
	/* --wait on a result that arrives later */
	submit(p, "late");
	cr_assert_eq(queue_take(q, j, 1, 1, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_assert_eq(complete(q, j, 1), WK_OK);
	cr_assert_eq(queue_wait_result(p, "late", 2, &res, &len, err, sizeof err), WK_OK, "%s", err);
	free(res);
	queue_close(q);
	queue_close(p);
	struct queue *x;
	char u2[64];
	snprintf(u2, sizeof u2, "redis://127.0.0.1:%d/jobs", free_port());
	cr_expect_eq(queue_open(u2, NULL, &x, err, sizeof err), WK_EIO); /* nothing listens */
}

/* The job stream keeps only what its group may still need: from the oldest pending entry on,
 * else from the last delivered one; the backlog (XINFO GROUPS' lag) stays known throughout,
 * and a second group that has read nothing keeps everything. */
static long long stream_len(void) { return redis_int("XLEN jobs"); }

Test(queue_redis, finished_entries_are_trimmed)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30), *q = open_q(url, "w1", 30);
	char id[16];
	for (int i = 0; i < 5; i++) {
		snprintf(id, sizeof id, "t%d", i);
		submit(p, id);
	}
	struct queue_job j[8];
	int n;
	cr_assert_eq(queue_take(q, j, 8, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 5);
	/* t0 stays pending: nothing before it, so nothing goes */
	cr_assert_eq(complete(q, j + 1, 4), WK_OK, "%s", err);
	cr_expect_eq(stream_len(), 5);
	long b;
	cr_assert_eq(queue_backlog(q, &b, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(b, 1);
	submit(p, "t5");
	submit(p, "t6");
	/* nothing pending: all but the last delivered (t4) and the two undelivered go */
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	cr_expect_eq(stream_len(), 3);
	cr_assert_eq(queue_backlog(q, &b, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(b, 2);
	cr_assert_eq(queue_take(q, j, 8, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 2);
	cr_expect_str_eq(j[0].id, "t5");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	cr_expect_eq(stream_len(), 1);
	cr_assert_eq(queue_backlog(q, &b, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(b, 0);
	/* a second group on the same stream, created now from id 0: it still needs t6 */
	redisContext *c = redisConnect("127.0.0.1", port);
	cr_assert(c && !c->err);
	redisReply *r = redisCommand(c, "XGROUP CREATE jobs other 0");
	cr_assert(r && r->type == REDIS_REPLY_STATUS, "XGROUP CREATE: %s", r ? r->str : "no reply");
	freeReplyObject(r);
	redisFree(c);
	submit(p, "t7");
	cr_assert_eq(queue_take(q, j, 8, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	cr_expect_eq(stream_len(), 2);
	queue_close(q);
	queue_close(p);
}

/* A server that wants a password (requirepass, and an ACL user): refused by name without
 * one or with a wrong one (never echoing it), served with either credential, and AUTH sent
 * again on the connection after a restart. */
Test(queue_redis, password_and_acl_user)
{
	NEED_REDIS();
	stop_redis();
	const char *const auth[] = {"--requirepass", "topsecret-pw", "--user", "wick", "on", ">acl-pw",
				    "~*", "&*", "+@all", NULL};
	server = start_redis_with(false, auth, false);
	cr_assert_gt(server, 0);
	struct queue_opts o = {.consumer = "w", .lease_s = 30, .reconnect_s = 5};
	struct queue *q;
	unsetenv("WICK_REDIS_USERNAME");
	unsetenv("WICK_REDIS_PASSWORD");
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "wants a password") && strstr(err, "WICK_REDIS_PASSWORD"), "%s", err);
	setenv("WICK_REDIS_PASSWORD", "wrong-pw-given", 1);
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "AUTH") && strstr(err, "refused") && !strstr(err, "wrong-pw-given"), "%s",
		  err);
	setenv("WICK_REDIS_USERNAME", "wick", 1);
	unsetenv("WICK_REDIS_PASSWORD");
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "WICK_REDIS_USERNAME is set without"), "%s", err);
	/* the default user's password */
	unsetenv("WICK_REDIS_USERNAME");
	setenv("WICK_REDIS_PASSWORD", "topsecret-pw", 1);
	struct queue *p = open_q(url, "producer", 30);
	submit(p, "a1");
	/* an ACL user */
	setenv("WICK_REDIS_USERNAME", "wick", 1);
	setenv("WICK_REDIS_PASSWORD", "acl-pw", 1);
	q = open_q(url, "w", 30);
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	/* restarted: the reconnect authenticates again */
	stop_redis();
	server = start_redis_with(false, auth, false);
	cr_assert_gt(server, 0);
	submit(p, "a2");
	cr_assert_eq(queue_take(q, j, 4, 2, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "a2");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	queue_close(q);
	queue_close(p);
}

/* A command on an authenticated connection (AUTH pw first); the reply's type. */
static int admin(const char *pw, const char *cmd)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	cr_assert(c && !c->err);
	redisReply *r = redisCommand(c, "AUTH %s", pw);
	cr_assert(r && r->type == REDIS_REPLY_STATUS, "AUTH: %s", r ? r->str : "no reply");
	freeReplyObject(r);
	r = redisCommand(c, cmd);
	int t = r ? r->type : -1;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return t;
}

static char pw_path[128];

/* The rotation's second half, late: the new password reaches the file 0.6 s after the server
 * took it (a Kubernetes Secret's mounted file follows within its sync period). */
static void *write_new_pw(void *arg)
{
	(void)arg;
	usleep(600000);
	char e[WK_ERRSZ];
	cr_assert_eq(wk_write_file(pw_path, "rotated-pw\n", 11, e, sizeof e), WK_OK, "%s", e);
	return NULL;
}

/* WICK_REDIS_PASSWORD_FILE: the password read from a file (its newline dropped) for every new
 * connection, so that a rotated password is taken at the next reconnect without a restart,
 * even when the server changes first and the file follows later (the refused AUTH is retried).
 * At open, a missing or empty file and both variables set are refused by name, and a wrong
 * password in the file fails at once (only a reconnect retries). */
Test(queue_redis, password_file_rotation)
{
	NEED_REDIS();
	stop_redis();
	const char *const auth[] = {"--requirepass", "first-pw", NULL};
	server = start_redis_with(false, auth, false);
	cr_assert_gt(server, 0);
	struct queue_opts o = {.consumer = "w", .lease_s = 30, .reconnect_s = 5};
	struct queue *q;
	char e[WK_ERRSZ];
	unsetenv("WICK_REDIS_USERNAME");
	unsetenv("WICK_REDIS_PASSWORD");
	snprintf(pw_path, sizeof pw_path, "%s/redis-pw", dir);
	setenv("WICK_REDIS_PASSWORD_FILE", pw_path, 1);
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "WICK_REDIS_PASSWORD_FILE") && strstr(err, pw_path), "%s", err);
	cr_assert_eq(wk_write_file(pw_path, "\n", 1, e, sizeof e), WK_OK, "%s", e);
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "is empty"), "%s", err);
	cr_assert_eq(wk_write_file(pw_path, "wrong-pw\n", 9, e, sizeof e), WK_OK, "%s", e);
	double t0 = wk_now();
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "AUTH") && strstr(err, "_FILE") && !strstr(err, "wrong-pw"), "%s",
		  err);
	cr_expect_lt(wk_now() - t0, 1.0, "a wrong password at open was retried");
	setenv("WICK_REDIS_PASSWORD", "first-pw", 1);
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "both WICK_REDIS_PASSWORD and WICK_REDIS_PASSWORD_FILE"), "%s", err);
	unsetenv("WICK_REDIS_PASSWORD");

	cr_assert_eq(wk_write_file(pw_path, "first-pw\n", 9, e, sizeof e), WK_OK, "%s", e);
	struct queue *p = open_q(url, "producer", 30);
	q = open_q(url, "w", 30);
	submit(p, "r1");
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	/* rotated: the server first, every connection cut, the file 0.6 s later */
	cr_assert_eq(admin("first-pw", "CONFIG SET requirepass rotated-pw"), REDIS_REPLY_STATUS);
	cr_assert_eq(admin("rotated-pw", "CLIENT KILL TYPE normal"), REDIS_REPLY_INTEGER);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, write_new_pw, NULL), 0);
	submit(p, "r2");
	cr_assert_eq(queue_take(q, j, 4, 2, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "r2");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	pthread_join(th, NULL);
	cr_expect_eq(admin("rotated-pw", "XLEN jobs"), REDIS_REPLY_INTEGER);
	queue_close(q);
	queue_close(p);
	unsetenv("WICK_REDIS_PASSWORD_FILE");
}

/* ---- 200 jobs, two consumers ---- */

#define NJOBS 200
static atomic_int delivered[NJOBS];
static atomic_int finished;

static void *consumer(void *arg)
{
	const char *name = arg;
	struct queue_opts o = {.consumer = name, .lease_s = 30};
	struct queue *q;
	char e[WK_ERRSZ];
	if (queue_open(url, &o, &q, e, sizeof e) != WK_OK)
		return "open";
	double t0 = wk_now();
	while (atomic_load(&finished) < NJOBS && wk_now() - t0 < 30) {
		struct queue_job j[8];
		int n;
		if (queue_take(q, j, 8, 0.2, &n, e, sizeof e) != WK_OK)
			return "take";
		struct queue_result r[8];
		for (int i = 0; i < n; i++) {
			atomic_fetch_add(&delivered[atoi(j[i].id + 1)], 1);
			r[i] = (struct queue_result){.job = &j[i], .json = "{}", .len = 2};
		}
		if (n && queue_complete(q, r, n, e, sizeof e) != WK_OK)
			return "complete";
		atomic_fetch_add(&finished, n);
		for (int i = 0; i < n; i++)
			queue_job_free(&j[i]);
	}
	queue_close(q);
	return NULL;
}

Test(queue_redis, two_consumers_200_jobs_one_result_each)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30);
	char id[16];
	for (int i = 0; i < NJOBS; i++) {
		snprintf(id, sizeof id, "j%03d", i);
		submit(p, id);
	}
	pthread_t t[2];
	char *names[2] = {"c1", "c2"};
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, consumer, names[i]);
	for (int i = 0; i < 2; i++) {
		void *r;
		pthread_join(t[i], &r);
		cr_expect_null(r, "consumer %d failed at %s", i, (char *)r);
	}
	for (int i = 0; i < NJOBS; i++)
		cr_expect_eq(atomic_load(&delivered[i]), 1, "job %d delivered %d times", i, atomic_load(&delivered[i]));
	cr_expect_eq(redis_int("XLEN jobs:results"), NJOBS);
	cr_expect_eq(count_results(), NJOBS);
	redisContext *c = redisConnect("127.0.0.1", port);
	redisReply *r = redisCommand(c, "XPENDING jobs wick");
	cr_expect_eq(r->element[0]->integer, 0, "entries still pending");
	freeReplyObject(r);
	redisFree(c);
	queue_close(p);
}

/* A consumer that takes and dies: after the lease another consumer reclaims its entries. */
Test(queue_redis, dead_consumer_is_reclaimed)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30);
	char id[16];
	for (int i = 0; i < 10; i++) {
		snprintf(id, sizeof id, "d%d", i);
		submit(p, id);
	}
	pid_t kid = fork();
	if (kid == 0) {
		struct queue_opts o = {.consumer = "dies", .lease_s = 30};
		struct queue *q;
		struct queue_job j[16];
		int n;
		if (queue_open(url, &o, &q, err, sizeof err) != WK_OK || queue_take(q, j, 16, 1, &n, err, sizeof err) ||
		    n != 10)
			_exit(3);
		_exit(0);
	}
	int st;
	waitpid(kid, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", st);
	struct queue *q = open_q(url, "survivor", 0.5);
	int got = 0;
	double t0 = wk_now();
	while (got < 10 && wk_now() - t0 < 10) {
		struct queue_job j[16];
		int n;
		cr_assert_eq(queue_take(q, j, 16, 0.5, &n, err, sizeof err), WK_OK, "%s", err);
		for (int i = 0; i < n; i++)
			cr_expect_eq(j[i].attempt, 2, "%s attempt %d", j[i].id, j[i].attempt);
		got += n;
		cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	}
	cr_expect_eq(got, 10);
	cr_expect_geq(wk_now() - t0, 0.3, "reclaimed before the lease ran out");
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_eq(s.reclaimed, 10);
	queue_close(q);
	queue_close(p);
}

Test(queue_redis, dead_letter_after_max_deliveries)
{
	NEED_REDIS();
	char u[200];
	snprintf(u, sizeof u, "%s?max_deliveries=2&dead=graveyard", url);
	struct queue *p = open_q(u, "producer", 30), *q = open_q(u, "w", 0.3), *q2 = open_q(u, "w2", 0.3);
	submit(p, "poison");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_expect_eq(j[0].attempt, 1);
	/* handed back on drain: the other consumer gets it at once (its reclaim is due) */
	cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK, "%s", err);
	queue_job_free(&j[0]);
	cr_assert_eq(queue_take(q2, j, 2, 1, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_expect_eq(j[0].attempt, 2);
	struct queue_job stale = j[0];
	stale.body = NULL;
	queue_job_free(&j[0]);
	/* q2 stalls past the lease; the third delivery is dead-lettered instead */
	usleep(400000);
	cr_assert_eq(queue_take(q, j, 2, 1.5, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(p, "poison", 1, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_not_null(strstr(res, "\"status\": \"FAILED\""), "%s", res);
	cr_expect_not_null(strstr(res, "dead-lettered"), "%s", res);
	free(res);
	cr_expect_eq(redis_int("XLEN graveyard"), 1);
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_eq(s.dead_lettered, 1);
	/* q2 still thinks it holds the job: its extend says the lease is lost */
	int rc[1];
	cr_expect_eq(queue_extend(q2, &stale, 1, 1, rc, err, sizeof err), WK_ENOTFOUND);
	queue_close(q);
	queue_close(q2);
	queue_close(p);
}

/* Entries written by other producers: malformed ones go to the dead stream, oversized ones
 * get a FAILED result; neither reaches the worker. */
Test(queue_redis, malformed_and_oversized_entries)
{
	NEED_REDIS();
	struct queue_opts o = {.consumer = "w", .max_body = 100};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	redisContext *c = redisConnect("127.0.0.1", port);
	freeReplyObject(redisCommand(c, "XADD jobs * nothing here"));
	freeReplyObject(redisCommand(c, "XADD jobs * id bad/id job {}"));
	char big[300];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = 0;
	freeReplyObject(redisCommand(c, "XADD jobs * id big job %s", big));
	freeReplyObject(redisCommand(c, "XADD jobs * id fine job {oops"));
	redisFree(c);
	struct queue_job j[8];
	int n;
	cr_assert_eq(queue_take(q, j, 8, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "fine");
	cr_expect_str_eq(j[0].body, "{oops");
	struct queue_result r = {.job = &j[0], .json = "{}", .len = 2, .keep_input = true};
	cr_assert_eq(queue_complete(q, &r, 1, err, sizeof err), WK_OK);
	queue_job_free(&j[0]);
	cr_expect_eq(redis_int("XLEN jobs:dead"), 4);
	cr_expect_eq(redis_int("EXISTS jobs:result:big"), 1);
	cr_expect_eq(redis_int("XLEN jobs:results"), 2);
	queue_close(q);
}

/* The value of field f of the dead-letter entry whose reason contains needle (malloc'd). */
static char *dead_field(const char *needle, const char *f)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	cr_assert(c && !c->err);
	redisReply *r = redisCommand(c, "XRANGE jobs:dead - +");
	cr_assert(r && r->type == REDIS_REPLY_ARRAY);
	char *out = NULL;
	for (size_t i = 0; i < r->elements && !out; i++) {
		const redisReply *kv = r->element[i]->element[1];
		const char *want = NULL, *reason = NULL;
		size_t wl = 0;
		for (size_t k = 0; k + 1 < kv->elements; k += 2) {
			if (!strcmp(kv->element[k]->str, f))
				want = kv->element[k + 1]->str, wl = kv->element[k + 1]->len;
			if (!strcmp(kv->element[k]->str, "reason"))
				reason = kv->element[k + 1]->str;
		}
		if (reason && strstr(reason, needle) && want)
			out = strndup(want, wl);
	}
	freeReplyObject(r);
	redisFree(c);
	return out;
}

/* An entry with a job whose id is not a job id: dead-lettered with a reason that names the
 * id (quoted: a log line stays one line), its id and job kept as sent, and refused once. */
Test(queue_redis, invalid_id_is_named_and_kept)
{
	NEED_REDIS();
	struct refusals rf = {0};
	struct queue_opts o = {.consumer = "w", .on_refused = on_refused, .on_refused_ctx = &rf};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	redisContext *c = redisConnect("127.0.0.1", port);
	freeReplyObject(redisCommand(c, "XADD jobs * id %s job %s", "bad id!", "{\"input\": {}}"));
	freeReplyObject(redisCommand(c, "XADD jobs * id %s job %s", "two\nlines", "{}"));
	redisFree(c);
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(n, 0);
	cr_expect_eq(redis_int("XLEN jobs:dead"), 2);
	char *id = dead_field("invalid job id 'bad id!'", "id");
	char *job = dead_field("invalid job id 'bad id!'", "job");
	cr_expect_str_eq(id ? id : "(no such entry)", "bad id!");
	cr_expect_str_eq(job ? job : "(no such entry)", "{\"input\": {}}");
	free(id), free(job);
	id = dead_field("invalid job id 'two\\x0alines'", "id");
	cr_expect_str_eq(id ? id : "(no such entry)", "two\nlines");
	free(id);
	cr_assert_eq(rf.n, 2);
	for (int i = 0; i < 2; i++) {
		cr_expect_str_eq(rf.id[i], "");
		cr_expect_not_null(strstr(rf.why[i], "invalid job id '"), "%s", rf.why[i]);
		cr_expect_not_null(strstr(rf.why[i], "moved to jobs:dead"), "%s", rf.why[i]);
		cr_expect_null(strchr(rf.why[i], '\n'), "%s", rf.why[i]);
	}
	cr_expect_eq(count_results(), 0);
	queue_close(q);
}

/* A job over max_body: a FAILED result, dead-lettered, and refused (logged and counted by
 * the worker) under its id. */
Test(queue_redis, oversized_entry_is_refused)
{
	NEED_REDIS();
	struct refusals rf = {0};
	struct queue_opts o = {.consumer = "w", .max_body = 100, .on_refused = on_refused,
			       .on_refused_ctx = &rf};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	char big[300];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = 0;
	redisContext *c = redisConnect("127.0.0.1", port);
	freeReplyObject(redisCommand(c, "XADD jobs * id big job %s", big));
	redisFree(c);
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(n, 0);
	cr_expect_eq(redis_int("EXISTS jobs:result:big"), 1);
	cr_assert_eq(rf.n, 1);
	cr_expect_str_eq(rf.id[0], "big");
	cr_expect_not_null(strstr(rf.why[0], "the job has 299 bytes; the limit is 100"), "%s", rf.why[0]);
	struct queue_stats qs;
	queue_get_stats(q, &qs);
	cr_expect_eq(qs.refused, 1);
	queue_close(q);
}

/* ---- redis-server restarted mid-run ---- */

/* Completes jobs while the server is down; the driver must wait for it to come back. (The
 * server is restarted by the main thread: PR_SET_PDEATHSIG follows the thread that forked.) */
struct completer {
	struct queue *q;
	struct queue_job *j;
	int n, rc;
};

static void *complete_later(void *arg)
{
	struct completer *c = arg;
	c->rc = complete(c->q, c->j, c->n);
	return NULL;
}

Test(queue_redis, reconnects_after_a_restart)
{
	NEED_REDIS();
	stop_redis();
	server = start_redis(true); /* append-only file with fsync always: nothing is lost */
	cr_assert_gt(server, 0);
	struct queue *p = open_q(url, "producer", 30), *q = open_q(url, "w", 30);
	char id[16];
	for (int i = 0; i < 100; i++) {
		snprintf(id, sizeof id, "r%03d", i);
		submit(p, id);
	}
	int done = 0, seen[100] = {0};
	struct queue_job j[10];
	int n;
	cr_assert_eq(queue_take(q, j, 10, 1, &n, err, sizeof err), WK_OK);
	for (int i = 0; i < n; i++)
		seen[atoi(j[i].id + 1)]++;
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	done += n;
	/* kill it while a take holds 10 uncompleted jobs, then start it again later */
	cr_assert_eq(queue_take(q, j, 10, 1, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 10);
	stop_redis();
	for (int i = 0; i < n; i++)
		seen[atoi(j[i].id + 1)]++;
	struct completer cp = {.q = q, .j = j, .n = n};
	pthread_t t;
	pthread_create(&t, NULL, complete_later, &cp);
	usleep(700000);
	server = start_redis(true);
	pthread_join(t, NULL);
	cr_assert_gt(server, 0, "redis-server did not restart");
	cr_assert_eq(cp.rc, WK_OK, "%s", err);
	done += n;
	double t0 = wk_now();
	while (done < 100 && wk_now() - t0 < 20) {
		cr_assert_eq(queue_take(q, j, 10, 0.5, &n, err, sizeof err), WK_OK, "%s", err);
		for (int i = 0; i < n; i++)
			seen[atoi(j[i].id + 1)]++;
		cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
		done += n;
	}
	cr_expect_eq(done, 100);
	for (int i = 0; i < 100; i++)
		cr_expect_eq(seen[i], 1, "job %d delivered %d times", i, seen[i]);
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_geq(s.reconnects, 1);
	cr_expect_eq(count_results(), 100);
	queue_close(q);
	queue_close(p);
}

/* A restarted server that answers -LOADING while it reads its data is treated like one that
 * refuses connections: the driver waits for it, and then finds the job that was saved. */
Test(queue_redis, waits_while_redis_is_loading)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30), *q = open_q(url, "w", 30);
	submit(p, "saved");
	redisContext *c = redisConnect("127.0.0.1", port);
	for (int i = 0; i < 300; i++)
		redisAppendCommand(c, "SET k%d v", i);
	for (int i = 0; i < 300; i++) {
		void *r;
		cr_assert_eq(redisGetReply(c, &r), REDIS_OK);
		freeReplyObject(r);
	}
	freeReplyObject(redisCommand(c, "SAVE"));
	redisFree(c);
	stop_redis();
	/* 5 ms per key while loading, and clients answered (-LOADING) during the load */
	const char *slow[] = {"--key-load-delay", "5000", "--loading-process-events-interval-bytes", "1024", NULL};
	server = start_redis_with(false, slow, false);
	cr_assert_gt(server, 0);
	c = redisConnect("127.0.0.1", port);
	redisReply *r = redisCommand(c, "PING");
	bool loading = r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "LOADING", 7);
	if (r)
		freeReplyObject(r);
	redisFree(c);
	cr_assert(loading, "the restarted server is not loading (too fast?)");
	struct queue_job j[2];
	int n;
	/* No timing check here: how long the load lasts depends on the machine's load. */
	cr_assert_eq(queue_take(q, j, 2, 5, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1, "the saved job was not delivered after loading");
	cr_expect_str_eq(j[0].id, "saved");
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_geq(s.reconnects, 1);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	queue_close(q);
	queue_close(p);
}

/* ---- streaming ---- */

struct reader {
	const char *id;
	char text[256];
	int attempts[16], n;
	double first_at;
	char *res;
	int rc;
};

static void on_piece(void *ctx, const char *text, size_t len, int attempt)
{
	struct reader *rd = ctx;
	if (!rd->n)
		rd->first_at = wk_now();
	strncat(rd->text, text, len < sizeof rd->text - strlen(rd->text) - 1 ? len : 0);
	if (rd->n < 16)
		rd->attempts[rd->n] = attempt;
	rd->n++;
}

static void *read_stream(void *arg)
{
	struct reader *rd = arg;
	struct queue *p = open_q(url, "reader", 30);
	size_t len;
	char e[WK_ERRSZ];
	rd->rc = queue_wait_stream(p, rd->id, 10, on_piece, rd, &rd->res, &len, e, sizeof e);
	queue_close(p);
	return NULL;
}

/* A streaming job's pieces: buffered by queue_stream, sent by queue_flush_streams as one entry
 * each, the last ones flushed by queue_complete before the result; a reader that waits from
 * before the job ran gets each piece as it is sent, then the result. A job released and run
 * again streams again under its next attempt. */
Test(queue_redis, stream_pieces_come_before_the_result)
{
	NEED_REDIS();
	struct queue *p = open_q(url, "producer", 30), *q = open_q(url, "w", 30);
	cr_expect(queue_streams(q));
	struct reader rd = {.id = "s1"};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, read_stream, &rd), 0);
	submit(p, "s1");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	queue_stream(q, &j[0], "", 0);
	queue_stream(q, &j[0], "Once", 4);
	queue_stream(q, &j[0], " upon", 5);
	cr_assert_eq(queue_flush_streams(q, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(queue_flush_streams(q, err, sizeof err), WK_OK, "%s", err); /* nothing new */
	usleep(300000);
	double sent_last = wk_now();
	queue_stream(q, &j[0], " a time", 7); /* not flushed: complete sends it first */
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	pthread_join(th, NULL);
	cr_assert_eq(rd.rc, WK_OK);
	cr_expect_str_eq(rd.text, "Once upon a time");
	cr_expect_eq(rd.n, 2, "%d pieces", rd.n);
	cr_expect_lt(rd.first_at, sent_last, "the first piece came only with the result");
	cr_expect(rd.res && strstr(rd.res, "\"status\": \"COMPLETED\""), "%s", rd.res);
	free(rd.res);
	cr_expect_eq(redis_int("XLEN jobs:stream:s1"), 2);
	long long ttl = redis_int("TTL jobs:stream:s1");
	cr_expect(ttl > 3500 && ttl <= 3600, "ttl %lld", ttl);

	/* released after a piece, then run again: the reader sees both attempts' pieces */
	struct reader r2 = {.id = "s2"};
	submit(p, "s2");
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	queue_stream(q, &j[0], "x", 1);
	cr_assert_eq(queue_flush_streams(q, err, sizeof err), WK_OK, "%s", err);
	queue_stream(q, &j[0], "lost", 4); /* dropped with the release */
	cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK, "%s", err);
	queue_job_free(&j[0]);
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_eq(j[0].attempt, 2);
	queue_stream(q, &j[0], "y", 1);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	read_stream(&r2);
	cr_assert_eq(r2.rc, WK_OK);
	cr_expect_str_eq(r2.text, "xy");
	cr_expect(r2.n == 2 && r2.attempts[0] == 1 && r2.attempts[1] == 2, "%d pieces", r2.n);
	free(r2.res);
	/* a job that does not stream: the reader gets the result alone */
	struct reader r3 = {.id = "s3"};
	submit(p, "s3");
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(complete(q, j, 1), WK_OK, "%s", err);
	read_stream(&r3);
	cr_expect(r3.rc == WK_OK && r3.n == 0 && r3.res, "rc %d, %d pieces", r3.rc, r3.n);
	free(r3.res);
	queue_close(q);
	queue_close(p);
}

/* ---- TLS (rediss://) ---- */

static int tls_port;
static char pki[96], tls_url[200];

static bool have_openssl(void) { return system("command -v openssl >/dev/null 2>&1") == 0; }

#define NEED_TLS()                                                                                 \
	do {                                                                                       \
		NEED_REDIS();                                                                      \
		if (!have_openssl())                                                               \
			cr_skip_test("the openssl command is not installed (scripts/install-deps)"); \
	} while (0)

/* (Re)starts redis-server with TLS on tls_port beside plain text on port (the tests' own
 * checks), serving pki/CERT.pem; with auth_clients it wants a client certificate that the
 * test CA signed. The PKI (tests/tools/tls_certs.sh) is made on the first call. */
static void start_tls(const char *cert, bool auth_clients, const char *const *more)
{
	if (!pki[0]) {
		snprintf(pki, sizeof pki, "%s/pki", dir);
		char cmd[200];
		snprintf(cmd, sizeof cmd, "tests/tools/tls_certs.sh '%s'", pki);
		cr_assert_eq(system(cmd), 0, "%s failed (run from the repository's root)", cmd);
		tls_port = free_port();
	}
	static char tp[16], crt[160], key[160], ca[160];
	snprintf(tp, sizeof tp, "%d", tls_port);
	snprintf(crt, sizeof crt, "%s/%s.pem", pki, cert);
	snprintf(key, sizeof key, "%s/%s.key", pki, cert);
	snprintf(ca, sizeof ca, "%s/ca.pem", pki);
	const char *argv[20] = {"--tls-port", tp, "--tls-cert-file", crt, "--tls-key-file", key,
				"--tls-ca-cert-file", ca, "--tls-auth-clients", auth_clients ? "yes" : "no"};
	int n = 10;
	for (int i = 0; more && more[i] && n < 19; i++)
		argv[n++] = more[i];
	stop_redis();
	server = start_redis_with(false, argv, !more); /* a password: PING answers NOAUTH */
	cr_assert_gt(server, 0, "redis-server with TLS did not start");
}

/* WICK_REDIS_CA_FILE, _CERT_FILE and _KEY_FILE as pki/NAME, or unset for NULL. */
static void tls_env(const char *ca, const char *cert, const char *key)
{
	const char *names[3] = {"WICK_REDIS_CA_FILE", "WICK_REDIS_CERT_FILE", "WICK_REDIS_KEY_FILE"};
	const char *v[3] = {ca, cert, key};
	for (int i = 0; i < 3; i++) {
		char p[160];
		snprintf(p, sizeof p, "%s/%s", pki, v[i] ? v[i] : "");
		if (v[i])
			setenv(names[i], p, 1);
		else
			unsetenv(names[i]);
	}
}

static const char *tls_at(const char *host)
{
	snprintf(tls_url, sizeof tls_url, "rediss://%s:%d/jobs", host, tls_port);
	return tls_url;
}

/* open must fail with rc, at once (under a second: no retries), and name each of want. */
static void refused_open(const char *u, int rc, const char *const *want)
{
	struct queue_opts o = {.consumer = "w", .lease_s = 30, .reconnect_s = 20};
	struct queue *q = NULL;
	double t0 = wk_now();
	cr_assert_eq(queue_open(u, &o, &q, err, sizeof err), rc, "%s: %s", u, err);
	cr_expect_lt(wk_now() - t0, 2.5, "%s: refused after %.1f s", u, wk_now() - t0);
	for (int i = 0; want[i]; i++)
		cr_expect(strstr(err, want[i]), "%s: '%s' is not in: %s", u, want[i], err);
}

/* The whole queue over TLS (a job submitted, taken with a blocking read, completed, its
 * result read), and each way a connection must not be made, refused by name at open. */
Test(queue_redis, tls_round_trip_and_refusals)
{
	NEED_TLS();
	start_tls("server", false, NULL);
	tls_env("ca.pem", NULL, NULL);
	struct queue *p = open_q(tls_at("localhost"), "producer", 30);
	struct queue *q = open_q(tls_at("localhost"), "w", 30);
	submit(p, "t1");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "t1");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(p, "t1", 2, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_not_null(strstr(res, "\"status\": \"COMPLETED\""), "%s", res);
	free(res);
	double t0 = wk_now(); /* a blocking read that times out, over TLS */
	cr_assert_eq(queue_take(q, j, 2, 0.4, &n, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(n, 0);
	cr_expect_geq(wk_now() - t0, 0.35);
	queue_close(q);
	queue_close(p);
	cr_expect_eq(redis_int("EXISTS jobs:result:t1"), 1, "the result is not in the server");

	/* the server's certificate: the system's CAs do not know it; nor does another CA; it is
	 * not for 127.0.0.1 (its one name is localhost) */
	tls_env(NULL, NULL, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"not trusted", "set WICK_REDIS_CA_FILE", NULL});
	tls_env("other-ca.pem", NULL, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"not trusted", "checked against WICK_REDIS_CA_FILE", NULL});
	tls_env("ca.pem", NULL, NULL);
	refused_open(tls_at("127.0.0.1"), WK_EINVAL,
		     (const char *[]){"not for this host", "IP address mismatch", NULL});
	/* the settings: files that are not there or not certificates, half a client pair, TLS
	 * settings with a plain URL */
	tls_env("nope.pem", NULL, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"WICK_REDIS_CA_FILE", "nope.pem", "No such file", NULL});
	tls_env("client.key", NULL, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"WICK_REDIS_CA_FILE", "client.key", NULL});
	tls_env("ca.pem", "client.pem", NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"WICK_REDIS_CERT_FILE is set without WICK_REDIS_KEY_FILE", NULL});
	tls_env("ca.pem", "client.pem", "server.key");
	refused_open(tls_at("localhost"), WK_EINVAL, (const char *[]){"WICK_REDIS_KEY_FILE", NULL});
	tls_env("ca.pem", NULL, NULL);
	refused_open(url, WK_EINVAL, (const char *[]){"WICK_REDIS_CA_FILE", "rediss://", NULL});
	/* the wrong protocol on either port */
	tls_env(NULL, NULL, NULL);
	char plain_to_tls[120];
	snprintf(plain_to_tls, sizeof plain_to_tls, "redis://localhost:%d/jobs", tls_port);
	refused_open(plain_to_tls, WK_EIO, (const char *[]){"rediss://", NULL});
	tls_env("ca.pem", NULL, NULL);
	char tls_to_plain[120];
	snprintf(tls_to_plain, sizeof tls_to_plain, "rediss://localhost:%d/jobs", port);
	refused_open(tls_to_plain, WK_EIO, (const char *[]){"TLS handshake", NULL});
	tls_env(NULL, NULL, NULL);
}

/* A server that wants a client certificate (tls-auth-clients yes), and a password too: without
 * the certificate the open fails at once, saying which variables to set; with it, and the
 * password sent over TLS, the queue works. */
Test(queue_redis, tls_client_certificate_and_password)
{
	NEED_TLS();
	const char *const pw[] = {"--requirepass", "tls-pw", NULL};
	start_tls("server", true, pw);
	setenv("WICK_REDIS_PASSWORD", "tls-pw", 1);
	tls_env("ca.pem", NULL, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"certificate required", "WICK_REDIS_CERT_FILE", NULL});
	tls_env("ca.pem", "client.pem", "client.key");
	struct queue *q = open_q(tls_at("localhost"), "w", 30);
	submit(q, "m1");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 1, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	queue_close(q);
	unsetenv("WICK_REDIS_PASSWORD");
	tls_env(NULL, NULL, NULL);
}

/* A certificate for an IP address is checked against the URL's address; an expired one is
 * refused as expired. */
Test(queue_redis, tls_ip_address_and_expired_certificates)
{
	NEED_TLS();
	start_tls("server-ip", false, NULL);
	tls_env("ca.pem", NULL, NULL);
	struct queue *q = open_q(tls_at("127.0.0.1"), "w", 30);
	submit(q, "ip1");
	queue_close(q);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"not for this host", "hostname mismatch", NULL});
	start_tls("expired", false, NULL);
	refused_open(tls_at("localhost"), WK_EINVAL,
		     (const char *[]){"not trusted", "certificate has expired", NULL});
	tls_env(NULL, NULL, NULL);
}

static char ca_path[160];

/* The CA file put back 0.6 s after the connections were cut (a Secret's file catching up). */
static void *restore_ca(void *arg)
{
	(void)arg;
	usleep(600000);
	char src[200], cmd[420];
	snprintf(src, sizeof src, "%s/ca.pem", pki);
	snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, ca_path);
	cr_assert_eq(system(cmd), 0);
	return NULL;
}

/* After the first connection, a TLS connection lost is made again with the files read anew:
 * with the CA file briefly holding the wrong CA (a rotation half done), the reconnect is
 * retried, not fatal, and goes through once the file is right; then a server restart. */
Test(queue_redis, tls_reconnects_and_reads_the_files_again)
{
	NEED_TLS();
	start_tls("server", false, NULL);
	snprintf(ca_path, sizeof ca_path, "%s/current-ca.pem", dir);
	char cmd[420];
	snprintf(cmd, sizeof cmd, "cp '%s/ca.pem' '%s'", pki, ca_path);
	cr_assert_eq(system(cmd), 0);
	setenv("WICK_REDIS_CA_FILE", ca_path, 1);
	struct queue *p = open_q(tls_at("localhost"), "producer", 30);
	struct queue *q = open_q(tls_at("localhost"), "w", 30);
	submit(p, "x1");
	snprintf(cmd, sizeof cmd, "cp '%s/other-ca.pem' '%s'", pki, ca_path);
	cr_assert_eq(system(cmd), 0);
	cr_assert_geq(redis_int("CLIENT KILL TYPE normal"), 2); /* p, q (and this one) */
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, restore_ca, NULL), 0);
	struct queue_job j[2];
	int n;
	double t0 = wk_now();
	cr_assert_eq(queue_take(q, j, 2, 2, &n, err, sizeof err), WK_OK, "%s", err);
	pthread_join(th, NULL);
	cr_assert_eq(n, 1);
	cr_expect_geq(wk_now() - t0, 0.5, "the wrong CA was not in the way");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_geq(s.reconnects, 1);
	/* a restart (no persistence here: the group is made again) */
	start_tls("server", false, NULL);
	submit(p, "x2");
	cr_assert_eq(queue_take(q, j, 2, 2, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "x2");
	cr_assert_eq(complete(q, j, n), WK_OK, "%s", err);
	queue_close(q);
	queue_close(p);
	unsetenv("WICK_REDIS_CA_FILE");
}
