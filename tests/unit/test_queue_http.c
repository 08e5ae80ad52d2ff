/* The http(s):// (RunPod job API) queue driver: its job-take decoder and URL builder (pure),
 * then the driver against tests/tools/runpod_server.py, which each test starts on a free
 * loopback port and kills at the end (also when the test crashes: PR_SET_PDEATHSIG). The
 * server tests skip with a message when python3 is missing. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>
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

/* ---- the decoder ---- */

static int decode(const char *body, size_t max_body, struct queue_http_job **x, int *n)
{
	return queue_http_decode_take(body, strlen(body), max_body, x, n, err, sizeof err);
}

/* The wick job in x decodes under x->id to the prompt given. */
static void expect_job(const struct queue_http_job *x, const char *id, const char *prompt)
{
	cr_assert_eq(x->kind, QUEUE_HTTP_JOB_OK, "%s: %s", id, x->why);
	cr_expect_str_eq(x->id, id);
	cr_assert_not_null(x->body);
	cr_expect_eq(x->len, strlen(x->body));
	struct job j;
	char e[WK_ERRSZ];
	cr_assert_eq(job_decode(x->body, x->len, x->id, &j, e, sizeof e), JOB_OK, "%s: %s", x->body, e);
	cr_expect_str_eq(j.prompt, prompt);
	job_free(&j);
}

Test(queue_http, decode_one_job)
{
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode("{\"id\": \"abc-1\", \"input\": {\"prompt\": \"Once\", \"max_tokens\": 5}, "
			    "\"webhook\": \"http://x\"}", 1000, &x, &n), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	expect_job(&x[0], "abc-1", "Once");
	json_t *o = json_loads(x[0].body, 0, NULL);
	cr_expect_str_eq(json_string_value(json_object_get(o, "id")), "abc-1");
	cr_expect_null(json_object_get(o, "webhook"), "RunPod's extra fields stay out of the job");
	json_decref(o);
	queue_http_jobs_free(x, n);
}

Test(queue_http, decode_batch_in_order)
{
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode("[{\"id\": \"a\", \"input\": {\"prompt\": \"1\"}}, {\"id\": \"b\", \"input\": "
			    "{\"prompt\": \"2\"}}, {\"id\": \"c\", \"input\": {\"prompt\": \"3\"}}]", 1000, &x, &n),
		     WK_OK, "%s", err);
	cr_assert_eq(n, 3);
	expect_job(&x[0], "a", "1");
	expect_job(&x[1], "b", "2");
	expect_job(&x[2], "c", "3");
	queue_http_jobs_free(x, n);
}

Test(queue_http, decode_no_job)
{
	static const char *const none[] = {"", "  \r\n\t", "null", "[]", " null "};
	for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
		struct queue_http_job *x = (void *)1;
		int n = -1;
		cr_expect_eq(decode(none[i], 1000, &x, &n), WK_OK, "'%s': %s", none[i], err);
		cr_expect_eq(n, 0, "'%s'", none[i]);
		cr_expect_null(x);
	}
}

Test(queue_http, decode_malformed)
{
	static const char *const bad[] = {"{", "not json", "42", "\"a job\"", "true", "{\"id\": \"a\",}",
					  "[{\"id\": \"a\"}"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct queue_http_job *x;
		int n = -1;
		err[0] = 0;
		cr_expect_eq(decode(bad[i], 1000, &x, &n), WK_EFORMAT, "'%s'", bad[i]);
		cr_expect_eq(n, 0);
		cr_expect_null(x);
		cr_expect(strstr(err, "job-take"), "'%s': message '%s'", bad[i], err);
	}
}

Test(queue_http, decode_bad_ids)
{
	char long_valid[200], too_long[700], body[2048];
	memset(long_valid, 'a', 129);
	long_valid[129] = 0; /* valid characters, one past JOB_ID_MAX */
	memset(too_long, 'b', 600);
	too_long[600] = 0;
	snprintf(body, sizeof body,
		 "[{\"id\": \"a/b\", \"input\": {\"prompt\": \"x\"}}, {\"id\": \"%s\", \"input\": {}},"
		 " {\"id\": \"\", \"input\": {}}, {\"id\": 7, \"input\": {}}, {\"input\": {}},"
		 " {\"id\": \"%s\", \"input\": {}}, 5, {\"id\": \"..\", \"input\": {}},"
		 " {\"id\": \"ok\", \"input\": {\"prompt\": \"y\"}}]",
		 long_valid, too_long);
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode(body, 1000, &x, &n), WK_OK, "%s", err);
	cr_assert_eq(n, 9);
	int want[] = {QUEUE_HTTP_JOB_BAD_ID, QUEUE_HTTP_JOB_BAD_ID, QUEUE_HTTP_JOB_NO_ID, QUEUE_HTTP_JOB_NO_ID,
		      QUEUE_HTTP_JOB_NO_ID, QUEUE_HTTP_JOB_NO_ID, QUEUE_HTTP_JOB_NO_ID, QUEUE_HTTP_JOB_BAD_ID,
		      QUEUE_HTTP_JOB_OK};
	for (int i = 0; i < n; i++) {
		cr_expect_eq(x[i].kind, want[i], "job %d: kind %d (%s)", i, x[i].kind, x[i].why);
		if (x[i].kind != QUEUE_HTTP_JOB_OK) {
			cr_expect_null(x[i].body);
			cr_expect_neq(x[i].why[0], 0, "job %d has no reason", i);
		}
		if (x[i].kind == QUEUE_HTTP_JOB_NO_ID)
			cr_expect_str_eq(x[i].id, "", "job %d", i);
	}
	cr_expect_str_eq(x[0].id, "a/b", "kept to answer it");
	cr_expect_str_eq(x[1].id, long_valid);
	expect_job(&x[8], "ok", "y");
	queue_http_jobs_free(x, n);
}

Test(queue_http, decode_bad_input)
{
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode("[{\"id\": \"a\"}, {\"id\": \"b\", \"input\": \"hello\"}, {\"id\": \"c\", \"input\": null},"
			    " {\"id\": \"d\", \"input\": [1]}]", 1000, &x, &n), WK_OK, "%s", err);
	cr_assert_eq(n, 4);
	for (int i = 0; i < n; i++) {
		cr_expect_eq(x[i].kind, QUEUE_HTTP_JOB_BAD_INPUT, "job %d: %d", i, x[i].kind);
		cr_expect_eq(x[i].id[0], "abcd"[i]);
		cr_expect(strstr(x[i].why, "input"), "job %d: %s", i, x[i].why);
	}
	/* an object input the worker cannot run is still a job: the worker answers it */
	queue_http_jobs_free(x, n);
	cr_assert_eq(decode("{\"id\": \"e\", \"input\": {}}", 1000, &x, &n), WK_OK);
	cr_expect_eq(x[0].kind, QUEUE_HTTP_JOB_OK);
	queue_http_jobs_free(x, n);
}

Test(queue_http, decode_lifts_tenant_and_takes_whole_jobs)
{
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode("[{\"id\": \"a\", \"input\": {\"prompt\": \"p\", \"tenant\": \"t1\", \"timeout_s\": 5}},"
			    " {\"id\": \"b\", \"input\": {\"id\": \"other\", \"tenant\": \"t2\", \"timeout_s\": 7,"
			    " \"input\": {\"prompt\": \"q\"}}}]", 1000, &x, &n), WK_OK, "%s", err);
	cr_assert_eq(n, 2);
	struct job j;
	char e[WK_ERRSZ];
	cr_assert_eq(job_decode(x[0].body, x[0].len, "a", &j, e, sizeof e), JOB_OK, "%s", e);
	cr_expect_str_eq(j.tenant, "t1");
	cr_expect_float_eq(j.timeout_s, 5, 1e-9);
	cr_expect_str_eq(j.prompt, "p");
	job_free(&j);
	/* a whole wick job as the input: used as it is, with RunPod's id */
	cr_assert_eq(job_decode(x[1].body, x[1].len, "b", &j, e, sizeof e), JOB_OK, "%s: %s", x[1].body, e);
	cr_expect_str_eq(j.id, "b");
	cr_expect_str_eq(j.tenant, "t2");
	cr_expect_float_eq(j.timeout_s, 7, 1e-9);
	cr_expect_str_eq(j.prompt, "q");
	job_free(&j);
	queue_http_jobs_free(x, n);
}

Test(queue_http, decode_limits)
{
	struct queue_http_job *x;
	int n;
	cr_assert_eq(decode("{\"id\": \"big\", \"input\": {\"prompt\": \"0123456789012345678901234567890123456789\"}}",
			    40, &x, &n), WK_OK, "%s", err);
	cr_assert_eq(n, 1);
	cr_expect_eq(x[0].kind, QUEUE_HTTP_JOB_TOO_BIG);
	cr_expect_str_eq(x[0].id, "big");
	cr_expect(strstr(x[0].why, "limit is 40"), "%s", x[0].why);
	queue_http_jobs_free(x, n);
	/* more jobs than one take may carry */
	size_t cap = (QUEUE_HTTP_TAKE_MAX + 1) * 3 + 3;
	char *many = malloc(cap);
	size_t k = 0;
	many[k++] = '[';
	for (int i = 0; i <= QUEUE_HTTP_TAKE_MAX; i++)
		k += (size_t)snprintf(many + k, cap - k, "%s{}", i ? "," : "");
	many[k++] = ']';
	many[k] = 0;
	cr_expect_eq(decode(many, 1000, &x, &n), WK_ELIMIT);
	cr_expect_eq(n, 0);
	free(many);
}

Test(queue_http, url_builder)
{
	struct {
		const char *tmpl, *worker, *job, *query, *want;
	} c[] = {
		{"http://h/v2/e/job-take/$RUNPOD_POD_ID?gpu=x", "w1", NULL, "job_in_progress=0",
		 "http://h/v2/e/job-take/w1?gpu=x&job_in_progress=0"},
		{"http://h/v2/e/job-take/$ID", "w1", NULL, "a=1", "http://h/v2/e/job-take/w1?a=1"},
		{"http://h/v2/e/job-done/$RUNPOD_POD_ID/$ID?gpu=x", "w 1", "j/2", "isStream=false",
		 "http://h/v2/e/job-done/w%201/j%2F2?gpu=x&isStream=false"},
		{"http://h/ping?", "w", NULL, "runpod_version=1", "http://h/ping?runpod_version=1"},
		{"http://h/done/$ID", "w", "j", NULL, "http://h/done/j"},
		{"http://h/$IDX/$RUNPOD_POD", "w", "j", "", "http://h/jX/$RUNPOD_POD"},
	};
	for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
		char *u = queue_http_url(c[i].tmpl, c[i].worker, c[i].job, c[i].query);
		cr_assert_not_null(u);
		cr_expect_str_eq(u, c[i].want, "case %zu", i);
		free(u);
	}
}

/* ---- the driver against runpod_server.py ---- */

static pid_t server = -1;
static int port;
static char base[128];

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

static bool have_python(void)
{
	return system("command -v python3 >/dev/null 2>&1") == 0 &&
	       access("tests/tools/runpod_server.py", R_OK) == 0;
}

struct body {
	char *p;
	size_t n;
};

static size_t collect(char *p, size_t sz, size_t nm, void *ud)
{
	struct body *b = ud;
	char *q = realloc(b->p, b->n + sz * nm + 1);
	if (!q)
		return 0;
	memcpy(q + b->n, p, sz * nm);
	b->p = q;
	b->n += sz * nm;
	b->p[b->n] = 0;
	return sz * nm;
}

/* An admin call; POST when body is not NULL. Returns the parsed answer (caller decrefs) or NULL
 * when the server did not answer. */
static json_t *admin(const char *path, const char *body)
{
	char u[256];
	snprintf(u, sizeof u, "http://127.0.0.1:%d/admin/%s", port, path);
	CURL *e = curl_easy_init();
	struct body b = {0};
	curl_easy_setopt(e, CURLOPT_URL, u);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
	if (body)
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
	CURLcode cc = curl_easy_perform(e);
	curl_easy_cleanup(e);
	json_t *j = cc == CURLE_OK && b.p ? json_loads(b.p, JSON_ALLOW_NUL, NULL) : NULL;
	free(b.p);
	return j;
}

static json_t *state_job(json_t *st, const char *id)
{
	return json_object_get(json_object_get(st, "jobs"), id);
}

static void setup(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (!have_python())
		return;
	port = free_port();
	snprintf(base, sizeof base, "http://127.0.0.1:%d/v2/ep", port);
	server = fork();
	if (server == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		freopen("/dev/null", "w", stdout);
		char p[16];
		snprintf(p, sizeof p, "%d", port);
		execlp("python3", "python3", "tests/tools/runpod_server.py", "--port", p, "--long-poll", "0.5",
		       "--api-key", "k-secret-1", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 300; i++) {
		json_t *s = admin("state", NULL);
		if (s) {
			json_decref(s);
			break;
		}
		usleep(20000);
	}
	char done[200], ping[200];
	snprintf(done, sizeof done, "%s/job-done/$RUNPOD_POD_ID/$ID?gpu=t", base);
	snprintf(ping, sizeof ping, "%s/ping/$RUNPOD_POD_ID?gpu=t", base);
	setenv("RUNPOD_WEBHOOK_POST_OUTPUT", done, 1);
	setenv("RUNPOD_WEBHOOK_PING", ping, 1);
	setenv("RUNPOD_PING_INTERVAL", "200", 1);
	setenv("RUNPOD_AI_API_KEY", "k-secret-1", 1);
	unsetenv("RUNPOD_POD_ID");
}

static void teardown(void)
{
	if (server > 0) {
		kill(server, SIGKILL);
		waitpid(server, NULL, 0);
	}
	server = -1;
}

TestSuite(queue_http_server, .init = setup, .fini = teardown, .timeout = 60);

#define NEED_SERVER()                                                                              \
	do {                                                                                       \
		if (!have_python())                                                                \
			cr_skip_test("python3 or tests/tools/runpod_server.py is missing");        \
	} while (0)

static struct queue *open_q(const char *consumer)
{
	char u[200];
	snprintf(u, sizeof u, "%s/job-take/$RUNPOD_POD_ID?gpu=t", base);
	struct queue_opts o = {.consumer = consumer, .reconnect_s = 10};
	struct queue *q;
	cr_assert_eq(queue_open(u, &o, &q, err, sizeof err), WK_OK, "%s", err);
	cr_assert_str_eq(queue_driver(q), "http");
	return q;
}

static void enqueue(const char *prefix, int n)
{
	char body[8192];
	size_t k = 0;
	k += (size_t)snprintf(body + k, sizeof body - k, "[");
	for (int i = 1; i <= n; i++)
		k += (size_t)snprintf(body + k, sizeof body - k,
				      "%s{\"id\": \"%s-%d\", \"input\": {\"prompt\": \"hi %d\"}}", i > 1 ? "," : "",
				      prefix, i, i);
	snprintf(body + k, sizeof body - k, "]");
	json_t *r = admin("enqueue", body);
	cr_assert_not_null(r, "enqueue");
	json_decref(r);
}

/* Takes until want jobs came (or 5 s passed). */
static int take_n(struct queue *q, struct queue_job *jobs, int max, int want)
{
	int got = 0;
	for (int tries = 0; got < want && tries < 25; tries++) {
		int n = 0;
		cr_assert_eq(queue_take(q, jobs + got, max - got, 0.2, &n, err, sizeof err), WK_OK, "%s", err);
		got += n;
	}
	return got;
}

static bool last_replaced; /* complete_as: the queue took a FAILED result in its place */

/* Completes j as st, with queue_complete_within(budget_s) where budget_s >= 0. */
static int complete_within_as(struct queue *q, struct queue_job *j, enum job_status st,
			      double budget_s)
{
	size_t len;
	char *res = st == JOB_COMPLETED
			    ? job_encode_result(&(struct job_result){.id = j->id, .status = st, .text = "ok",
								     .worker = "t", .attempt = 1}, &len)
			    : job_encode_error(j->id, st, JOB_ETIMEOUT, "too slow", "t", 1, &len);
	struct queue_result r = {.job = j, .json = res, .len = len};
	int rc = budget_s >= 0 ? queue_complete_within(q, &r, 1, budget_s, err, sizeof err)
			       : queue_complete(q, &r, 1, err, sizeof err);
	cr_expect_eq(rc, r.rc);
	last_replaced = r.replaced;
	free(res);
	return rc;
}

static int complete_as(struct queue *q, struct queue_job *j, enum job_status st)
{
	return complete_within_as(q, j, st, -1);
}

Test(queue_http_server, take_complete_and_ping)
{
	NEED_SERVER();
	enqueue("a", 3);
	struct queue *q = open_q("w1");
	struct queue_job jobs[8];
	cr_assert_eq(take_n(q, jobs, 8, 3), 3);
	for (int i = 0; i < 3; i++) {
		char id[16];
		snprintf(id, sizeof id, "a-%d", i + 1);
		cr_expect_str_eq(jobs[i].id, id);
		cr_expect_eq(jobs[i].attempt, 1);
		cr_expect(strstr(jobs[i].body, "\"prompt\""), "%s", jobs[i].body);
	}
	usleep(500000); /* two pings or more */
	json_t *st = admin("state", NULL);
	bool listed = false;
	size_t i;
	json_t *p;
	json_array_foreach(json_object_get(st, "pings"), i, p) {
		cr_expect_str_eq(json_string_value(json_object_get(p, "worker")), "w1");
		listed |= json_array_size(json_object_get(p, "job_ids")) == 3;
	}
	cr_expect(listed, "no ping listed the three held jobs");
	json_t *t = json_array_get(json_object_get(st, "takes"), 0);
	cr_expect_eq(json_integer_value(json_object_get(t, "batch_size")), 8, "a batch take sized by the free slots");
	cr_expect_eq(json_integer_value(json_object_get(st, "unauthorized")), 0, "the API key was sent");
	json_decref(st);

	cr_expect_eq(complete_as(q, &jobs[0], JOB_COMPLETED), WK_OK, "%s", err);
	cr_expect_eq(complete_as(q, &jobs[1], JOB_TIMED_OUT), WK_OK, "%s", err);
	int rc[2] = {1, 1};
	cr_expect_eq(queue_extend(q, &jobs[2], 1, 10, rc, err, sizeof err), WK_OK);
	cr_expect_eq(rc[0], WK_OK);
	struct queue_stats s;
	queue_get_stats(q, &s);
	cr_expect_eq(s.syncs, 2);
	cr_expect_eq(s.taken, 3);
	st = admin("state", NULL);
	json_t *a1 = json_object_get(json_array_get(json_object_get(state_job(st, "a-1"), "results"), 0), "body");
	json_t *a2 = json_object_get(json_array_get(json_object_get(state_job(st, "a-2"), "results"), 0), "body");
	cr_expect_null(json_object_get(a1, "error"));
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(a1, "output"), "status")), "COMPLETED");
	cr_expect_str_eq(json_string_value(json_object_get(a2, "error")), "timeout: too slow");
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(a2, "output"), "status")), "TIMED_OUT");
	cr_expect_str_eq(json_string_value(json_object_get(state_job(st, "a-2"), "status")), "FAILED");
	json_decref(st);
	usleep(450000);
	st = admin("state", NULL);
	json_t *pings = json_object_get(st, "pings");
	json_t *last = json_object_get(json_array_get(pings, json_array_size(pings) - 1), "job_ids");
	cr_expect(json_array_size(last) == 1 && !strcmp(json_string_value(json_array_get(last, 0)), "a-3"),
		  "the last ping lists only the job still held");
	json_decref(st);
	cr_expect_eq(complete_as(q, &jobs[2], JOB_COMPLETED), WK_OK, "%s", err);
	for (int k = 0; k < 3; k++)
		queue_job_free(&jobs[k]);
	queue_close(q);
}

/* A result whose text holds a NUL byte (\u0000) is posted as the output, not as an error. */
Test(queue_http_server, a_result_with_a_nul_byte_is_posted)
{
	NEED_SERVER();
	enqueue("n", 1);
	struct queue *q = open_q("w1");
	struct queue_job j[1];
	cr_assert_eq(take_n(q, j, 1, 1), 1);
	size_t len;
	char *res = job_encode_result(&(struct job_result){.id = j[0].id, .status = JOB_COMPLETED,
							   .text = "x\0y", .text_len = 3,
							   .worker = "t", .attempt = 1},
				      &len);
	struct queue_result r = {.job = &j[0], .json = res, .len = len};
	cr_expect_eq(queue_complete(q, &r, 1, err, sizeof err), WK_OK, "%s", err);
	free(res);
	json_t *st = admin("state", NULL);
	json_t *b = json_object_get(json_array_get(json_object_get(state_job(st, "n-1"), "results"), 0), "body");
	cr_expect_null(json_object_get(b, "error"));
	const json_t *t = json_object_get(json_object_get(json_object_get(b, "output"), "output"), "text");
	cr_expect_eq(json_string_length(t), 3, "the text came back as %s", json_string_value(t));
	json_decref(st);
	queue_job_free(&j[0]);
	queue_close(q);
}

/* Job PREFIX-1 taken by a new handle (into j), after the server was told to fail the next
 * fails job-done posts. */
static struct queue *take_one_failing(const char *prefix, int fails, struct queue_job *j)
{
	enqueue(prefix, 1);
	char path[40];
	snprintf(path, sizeof path, "fail_done?n=%d", fails);
	json_decref(admin(path, ""));
	struct queue *q = open_q("w1");
	cr_assert_eq(take_n(q, j, 1, 1), 1);
	return q;
}

Test(queue_http_server, failed_posts_are_retried)
{
	NEED_SERVER();
	struct queue_job j[1];
	struct queue *q = take_one_failing("f", 3, j);
	cr_expect_eq(complete_as(q, &j[0], JOB_COMPLETED), WK_OK, "%s", err);
	cr_expect(!last_replaced);
	json_t *st = admin("state", NULL);
	cr_expect_eq(json_integer_value(json_object_get(st, "failed_posts")), 3);
	cr_expect_eq(json_array_size(json_object_get(state_job(st, "f-1"), "results")), 1);
	json_decref(st);
	queue_job_free(&j[0]);
	queue_close(q);
}

/* queue_complete_within: the committer's budget for one store (what is left of
 * --queue-outage), not the handle's 10 s, which the worker's own thread keeps using. */
Test(queue_http_server, a_stores_budget_is_its_own)
{
	NEED_SERVER();
	struct queue_job j[1];
	struct queue *q = take_one_failing("b", 1000, j);
	double t0 = wk_now();
	int rc = complete_within_as(q, &j[0], JOB_COMPLETED, 1.0);
	double took = wk_now() - t0;
	cr_expect_neq(rc, WK_OK);
	cr_expect(took < 4, "a 1 s budget took %.2f s (the handle's is 10 s)", took);
	json_decref(admin("fail_done?n=0", ""));
	queue_job_free(&j[0]);
	queue_close(q);
}

Test(queue_http_server, a_refused_result_ends_failed)
{
	NEED_SERVER();
	enqueue("r", 1);
	json_decref(admin("refuse_done?n=1&code=413", ""));
	struct queue *q = open_q("w1");
	struct queue_job j[1];
	cr_assert_eq(take_n(q, j, 1, 1), 1);
	cr_expect_neq(complete_as(q, &j[0], JOB_COMPLETED), WK_OK);
	cr_expect(strstr(err, "413") && strstr(err, "FAILED"), "%s", err);
	cr_expect(last_replaced, "the worker must know the job ended (not to be delivered again)");
	json_t *st = admin("state", NULL);
	json_t *r1 = state_job(st, "r-1");
	cr_expect_str_eq(json_string_value(json_object_get(r1, "status")), "FAILED", "never COMPLETED without output");
	json_t *b = json_object_get(json_array_get(json_object_get(r1, "results"), 0), "body");
	cr_expect_str_eq(json_string_value(json_object_get(b, "error")),
			 "internal: job-done refused the result (HTTP 413)");
	json_decref(st);
	queue_job_free(&j[0]);
	queue_close(q);
}

Test(queue_http_server, release_and_close_hand_jobs_back)
{
	NEED_SERVER();
	enqueue("h", 3);
	struct queue *q = open_q("w1");
	struct queue_job j[1];
	cr_assert_eq(take_n(q, j, 1, 1), 1);
	cr_expect_eq(queue_release(q, j, 1, err, sizeof err), WK_OK, "%s", err);
	/* one free slot reported: the driver takes one more job into its buffer; close hands it back */
	struct queue_job none[1];
	int n = 0;
	cr_assert_eq(queue_take(q, none, 1, 0, &n, err, sizeof err), WK_OK, "%s", err);
	for (int i = 0; i < 100 && n == 0; i++) {
		json_t *st = admin("state", NULL);
		n = (int)json_array_size(json_object_get(st, "takes")) >= 2;
		json_decref(st);
		usleep(20000);
	}
	usleep(100000);
	queue_close(q);
	json_t *st = admin("state", NULL);
	int released = 0, queued = 0;
	const char *k;
	json_t *v;
	json_object_foreach(json_object_get(st, "jobs"), k, v) {
		released += (int)json_integer_value(json_object_get(v, "released"));
		queued += !strcmp(json_string_value(json_object_get(v, "status")), "IN_QUEUE");
		cr_expect_eq(json_array_size(json_object_get(v, "results")), 0, "%s has a result", k);
	}
	cr_expect_eq(released, 2, "the released job and the buffered one");
	cr_expect_eq(queued, 3, "every job is back in the queue");
	json_t *rel = json_object_get(json_array_get(json_object_get(st, "posts"), 0), "body");
	cr_expect(json_is_true(json_object_get(rel, "retry")));
	cr_expect(strstr(json_string_value(json_object_get(rel, "error")), "released"));
	json_decref(st);
	queue_job_free(&j[0]);
}

Test(queue_http_server, stop_signal_cancels)
{
	NEED_SERVER();
	enqueue("c", 2);
	struct queue *q = open_q("w1");
	struct queue_job j[2];
	cr_assert_eq(take_n(q, j, 2, 2), 2);
	json_decref(admin("cancel/c-2", ""));
	bool seen = false;
	for (int i = 0; i < 60 && !seen; i++) {
		cr_assert_eq(queue_check_cancel(q, j, 2, err, sizeof err), WK_OK);
		seen = j[1].cancelled;
		cr_expect(!j[0].cancelled);
		usleep(50000);
	}
	cr_expect(seen, "the stop signal never arrived");
	for (int i = 0; i < 2; i++) {
		complete_as(q, &j[i], i ? JOB_CANCELLED : JOB_COMPLETED);
		queue_job_free(&j[i]);
	}
	queue_close(q);
}

Test(queue_http_server, take_failures_are_reported)
{
	NEED_SERVER();
	char u[200];
	snprintf(u, sizeof u, "http://127.0.0.1:%d/v2/ep/job-take/w?token=t0ps3cret", free_port());
	struct queue_opts o = {.consumer = "w1", .reconnect_s = 0.3};
	struct queue *q;
	cr_assert_eq(queue_open(u, &o, &q, err, sizeof err), WK_OK, "%s", err);
	int rc = WK_OK;
	double t0 = wk_now();
	while (rc == WK_OK && wk_now() - t0 < 5) {
		struct queue_job j[1];
		int n = 0;
		rc = queue_take(q, j, 1, 0.2, &n, err, sizeof err);
		cr_expect_eq(n, 0);
	}
	cr_expect_eq(rc, WK_EIO, "%s", err);
	cr_expect(strstr(err, "job-take"), "%s", err);
	cr_expect(!strstr(err, "t0ps3cret") && !strstr(err, "k-secret-1"), "secrets in '%s'", err);
	queue_close(q);
}

Test(queue_http_server, open_errors)
{
	NEED_SERVER();
	struct queue *q;
	char u[200];
	snprintf(u, sizeof u, "%s/job-take/w", base);
	cr_expect_eq(queue_open("http://h/job take", NULL, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "space"), "%s", err);
	unsetenv("RUNPOD_WEBHOOK_POST_OUTPUT");
	cr_expect_eq(queue_open(u, NULL, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "--done-url") && strstr(err, "RUNPOD_WEBHOOK_POST_OUTPUT"), "%s", err);
	struct queue_opts o = {.done_url = "ftp://x/done"};
	cr_expect_eq(queue_open(u, &o, &q, err, sizeof err), WK_EINVAL);
	o.done_url = "http://x/done/$ID";
	setenv("RUNPOD_PING_INTERVAL", "10s", 1);
	cr_expect_eq(queue_open(u, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "RUNPOD_PING_INTERVAL"), "%s", err);
	setenv("RUNPOD_PING_INTERVAL", "1000", 1);
	setenv("RUNPOD_AI_API_KEY", "k-secret-2\r\nX-Evil: 1", 1);
	cr_expect_eq(queue_open(u, &o, &q, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "RUNPOD_AI_API_KEY") && !strstr(err, "k-secret-2"), "%s", err);
	setenv("RUNPOD_AI_API_KEY", "k-secret-1", 1);
	cr_assert_eq(queue_open(u, &o, &q, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(queue_submit(q, "x", "{}", 2, err, sizeof err), WK_EUNSUPPORTED);
	cr_expect(strstr(err, "/run"), "%s", err);
	char *json;
	cr_expect_eq(queue_wait_result(q, "x", 0, &json, NULL, err, sizeof err), WK_EUNSUPPORTED);
	cr_expect_eq(queue_cancel(q, "x", err, sizeof err), WK_EUNSUPPORTED);
	queue_close(q);
}
