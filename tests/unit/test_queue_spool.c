/* The spool queue driver on a real directory: submit, take, complete, cancel, leases, reclaim
 * of expired and dead claims (forked children), two takers, dead-letter, and the name parsers. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "tests/unit/refusals.h"
#include "worker/queue.h"
#include "worker/queue_impl.h"

static char dir[64], url[96], err[WK_ERRSZ];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/wick-spool-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	strcat(dir, "/q"); /* the driver creates it */
	snprintf(url, sizeof url, "spool:%s", dir);
}

static void teardown(void)
{
	char cmd[128];
	char *slash = strrchr(dir, '/');
	*slash = 0;
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(queue_spool, .init = setup, .fini = teardown, .timeout = 60);

static struct queue *open_q(double lease, int max_deliveries)
{
	struct queue_opts o = {.lease_s = lease, .max_deliveries = max_deliveries};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	return q;
}

static void submit(struct queue *q, const char *id)
{
	char body[256];
	int n = snprintf(body, sizeof body, "{\"id\": \"%s\", \"input\": {\"prompt\": \"hi %s\"}}", id, id);
	cr_assert_eq(queue_submit(q, id, body, (size_t)n, err, sizeof err), WK_OK, "%s", err);
}

static int count_dir(const char *sub)
{
	char p[160];
	snprintf(p, sizeof p, "%s/%s", dir, sub);
	DIR *d = opendir(p);
	cr_assert_not_null(d, "%s", p);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static bool exists(const char *sub, const char *name)
{
	char p[2048];
	snprintf(p, sizeof p, "%s/%s/%s", dir, sub, name);
	return access(p, F_OK) == 0;
}

static void complete(struct queue *q, struct queue_job *j, int n, bool keep)
{
	struct queue_result r[64];
	char *res[64];
	cr_assert_leq(n, 64);
	for (int i = 0; i < n; i++) {
		size_t len;
		res[i] = job_encode_error(j[i].id, JOB_COMPLETED, JOB_OK, NULL, "test", j[i].attempt, &len);
		r[i] = (struct queue_result){.job = &j[i], .json = res[i], .len = len, .keep_input = keep};
	}
	cr_assert_eq(queue_complete(q, r, n, err, sizeof err), WK_OK, "%s", err);
	for (int i = 0; i < n; i++)
		free(res[i]);
}

static void free_jobs(struct queue_job *j, int n)
{
	for (int i = 0; i < n; i++)
		queue_job_free(&j[i]);
}

Test(queue_spool, layout_submit_take_complete)
{
	struct queue *q = open_q(0, 0);
	cr_expect_str_eq(queue_driver(q), "spool");
	const char *subs[] = {"tmp", "new", "claimed", "done", "failed", "cancel"};
	for (int i = 0; i < 6; i++) {
		char p[160];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
		cr_assert_eq(stat(p, &st), 0, "%s", p);
		cr_expect_eq(st.st_mode & 0777, 0700, "%s mode %o", p, st.st_mode & 0777);
	}
	submit(q, "a");
	submit(q, "b");
	submit(q, "c.d");
	cr_expect(exists("new", "a.json"));
	cr_expect_eq(count_dir("tmp"), 0);

	struct queue_job j[8];
	int n;
	cr_assert_eq(queue_take(q, j, 8, 0, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 3);
	cr_expect_eq(count_dir("new"), 0);
	cr_expect_eq(count_dir("claimed"), 3);
	for (int i = 0; i < n; i++) {
		cr_expect_eq(j[i].attempt, 1);
		cr_expect(!j[i].cancelled);
		cr_expect_gt(j[i].enqueued_at, 1.7e9);
		char want[512];
		snprintf(want, sizeof want, "{\"id\": \"%.128s\", \"input\": {\"prompt\": \"hi %.128s\"}}", j[i].id, j[i].id);
		cr_expect_str_eq(j[i].body, want);
		cr_expect_eq(j[i].len, strlen(want));
	}
	complete(q, j, n, false);
	cr_expect_eq(count_dir("claimed"), 0);
	cr_expect_eq(count_dir("done"), 3);
	/* the three claim files wait in tmp/ as spare inodes for later results (s.<pid>.<n>);
	 * queue_close removes them */
	cr_expect_eq(count_dir("tmp"), 3);
	cr_expect(exists("done", "c.d.json"));

	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(q, "a", 1, &res, &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_not_null(strstr(res, "\"id\": \"a\""));
	cr_expect_not_null(strstr(res, "\"attempt\": 1"));
	free(res);
	cr_expect_eq(queue_wait_result(q, "nope", 0.05, &res, &len, err, sizeof err), WK_ENOTFOUND);

	/* nothing left; waiting returns after the wait */
	double t = wk_now();
	cr_assert_eq(queue_take(q, j + 3, 4, 0.2, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect_geq(wk_now() - t, 0.19);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_expect_eq(st.taken, 3);
	cr_expect_eq(st.completed, 3);
	free_jobs(j, 3);
	queue_close(q);
	cr_expect_eq(count_dir("tmp"), 0);
}

Test(queue_spool, refuses_duplicates_and_bad_ids)
{
	struct queue *q = open_q(0, 0);
	submit(q, "dup");
	cr_expect_eq(queue_submit(q, "dup", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_not_null(strstr(err, "already queued"), "%s", err);
	cr_expect_eq(queue_submit(q, "a/b", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(queue_submit(q, "a~1", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(queue_submit(q, "..", "{}", 2, err, sizeof err), WK_EINVAL);
	struct queue_job j[1];
	int n;
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	/* running (claimed/), then handed back (new/dup~1.json): still refused; both ran before */
	cr_expect_eq(queue_submit(q, "dup", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_not_null(strstr(err, "is running"), "%s", err);
	cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK);
	free_jobs(j, 1);
	cr_expect_eq(queue_submit(q, "dup", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_not_null(strstr(err, "is queued again"), "%s", err);
	cr_expect_eq(queue_submit(q, "du", "{}", 2, err, sizeof err), WK_OK, "a prefix is another id");
	struct queue_job j2[2];
	cr_assert_eq(queue_take(q, j2, 2, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 2);
	complete(q, j2, 2, false);
	cr_expect_eq(queue_submit(q, "dup", "{}", 2, err, sizeof err), WK_EINVAL);
	cr_expect_not_null(strstr(err, "already has a result"), "%s", err);
	free_jobs(j2, 2);
	queue_close(q);
	struct queue *q2;
	cr_expect_eq(queue_open("spool:", NULL, &q2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(queue_open("ftp://x", NULL, &q2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(queue_open("sqs://h/1", NULL, &q2, err, sizeof err), WK_EINVAL);
	cr_expect_eq(queue_open("spool:/proc/nope/q", NULL, &q2, err, sizeof err), WK_EIO);
}

Test(queue_spool, cancel)
{
	struct queue *q = open_q(0, 0);
	submit(q, "c1");
	cr_assert_eq(queue_cancel(q, "c1", err, sizeof err), WK_OK, "%s", err);
	cr_expect(exists("cancel", "c1"));
	submit(q, "c2");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 2);
	struct queue_job *c1 = !strcmp(j[0].id, "c1") ? &j[0] : &j[1], *c2 = c1 == j ? &j[1] : &j[0];
	cr_expect(c1->cancelled);
	cr_expect(!c2->cancelled);
	cr_assert_eq(queue_check_cancel(q, j, 2, err, sizeof err), WK_OK);
	cr_expect(!c2->cancelled);
	queue_cancel(q, "c2", err, sizeof err);
	cr_assert_eq(queue_check_cancel(q, j, 2, err, sizeof err), WK_OK);
	cr_expect(c2->cancelled);
	complete(q, j, 2, false);
	free_jobs(j, 2);
	/* a finished job or an unknown id: an error, and no marker left forever */
	cr_expect_eq(queue_cancel(q, "c1", err, sizeof err), WK_EINVAL);
	cr_expect_not_null(strstr(err, "has finished"), "%s", err);
	cr_expect_eq(queue_cancel(q, "nope", err, sizeof err), WK_ENOTFOUND);
	cr_expect_not_null(strstr(err, "no job nope"), "%s", err);
	cr_expect(!exists("cancel", "nope"));
	queue_close(q);
}

Test(queue_spool, extend_and_release)
{
	struct queue *q = open_q(30, 0);
	submit(q, "e");
	struct queue_job j[1];
	int n, rc[1];
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	char before[200];
	strcpy(before, j[0].handle);
	usleep(2000);
	cr_assert_eq(queue_extend(q, j, 1, 120, rc, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(rc[0], WK_OK);
	cr_expect_str_neq(j[0].handle, before);
	cr_expect(exists("claimed", j[0].handle));
	char id[JOB_ID_MAX + 1];
	int attempt;
	long pid;
	long long exp;
	cr_assert(queue_spool_parse_claim(j[0].handle, id, &attempt, &pid, &exp));
	cr_expect_gt((double)exp / 1000, (double)time(NULL) + 100);
	cr_expect_eq(pid, (long)getpid());

	/* release: back to new/ with its delivery count; the next take is attempt 2 */
	cr_assert_eq(queue_release(q, j, 1, err, sizeof err), WK_OK);
	cr_expect(exists("new", "e~1.json"));
	free_jobs(j, 1);
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_expect_eq(j[0].attempt, 2);
	cr_expect_str_eq(j[0].id, "e");

	/* a lost lease */
	char p[2048];
	snprintf(p, sizeof p, "%s/claimed/%s", dir, j[0].handle);
	cr_assert_eq(unlink(p), 0);
	cr_expect_eq(queue_extend(q, j, 1, 10, rc, err, sizeof err), WK_ENOTFOUND);
	cr_expect_eq(rc[0], WK_ENOTFOUND);
	free_jobs(j, 1);
	queue_close(q);
}

/* A child that takes every job with the given lease, then sleeps (alive) or exits at once. */
static pid_t child_takes(double lease, bool stay_alive, int expect_n)
{
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct queue_opts o = {.lease_s = lease};
		struct queue *q;
		struct queue_job j[16];
		int n = 0;
		if (queue_open(url, &o, &q, err, sizeof err) != WK_OK ||
		    queue_take(q, j, 16, 0, &n, err, sizeof err) != WK_OK || n != expect_n)
			_exit(3);
		if (stay_alive)
			for (;;)
				pause();
		_exit(0); /* holding the claims: a crash */
	}
	if (!stay_alive) {
		int st;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	}
	return pid;
}

Test(queue_spool, reclaims_dead_pid)
{
	struct queue *q = open_q(60, 0);
	submit(q, "d1");
	submit(q, "d2");
	child_takes(60, false, 2);
	cr_expect_eq(count_dir("claimed"), 2);
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 2, "the dead child's claims were not reclaimed");
	for (int i = 0; i < n; i++)
		cr_expect_eq(j[i].attempt, 2);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_expect_eq(st.reclaimed, 2);
	complete(q, j, n, false);
	cr_expect_eq(count_dir("done"), 2);
	free_jobs(j, n);
	queue_close(q);
}

Test(queue_spool, reclaims_expired_lease_of_live_worker)
{
	struct queue *q = open_q(60, 0);
	submit(q, "x1");
	pid_t pid = child_takes(0.3, true, 1);
	/* wait for the child's claim, then check that a live lease is respected */
	for (int i = 0; i < 2000 && count_dir("claimed") == 0; i++)
		usleep(5000);
	cr_assert_eq(count_dir("claimed"), 1, "the child did not claim the job");
	struct queue_job j[2];
	int n;
	cr_assert_eq(queue_take(q, j, 2, 0, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0, "took a job under a live lease");
	/* past the lease, with a wait: reclaim runs inside take */
	cr_assert_eq(queue_take(q, j, 2, 3, &n, err, sizeof err), WK_OK);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "x1");
	cr_expect_eq(j[0].attempt, 2);
	free_jobs(j, n);
	queue_close(q);
}

Test(queue_spool, dead_letter_after_max_deliveries)
{
	struct queue *q = open_q(60, 3);
	submit(q, "poison");
	struct queue_job j[1];
	int n;
	for (int attempt = 1; attempt <= 2; attempt++) {
		cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
		cr_assert_eq(n, 1);
		cr_expect_eq(j[0].attempt, attempt);
		queue_release(q, j, 1, err, sizeof err);
		free_jobs(j, 1);
	}
	/* the third delivery dies with its worker; reclaiming it would be the fourth */
	child_takes(60, false, 1);
	/* reclaim runs at most once a second (min(lease/4, 1 s)): wait past it */
	cr_assert_eq(queue_take(q, j, 1, 1.5, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect(exists("failed", "poison.json"));
	cr_expect(exists("done", "poison.json"));
	cr_expect_eq(count_dir("claimed"), 0);
	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(q, "poison", 0, &res, &len, err, sizeof err), WK_OK);
	cr_expect_not_null(strstr(res, "\"status\": \"FAILED\""), "%s", res);
	cr_expect_not_null(strstr(res, "\"code\": \"internal\""), "%s", res);
	cr_expect_not_null(strstr(res, "dead-lettered"), "%s", res);
	free(res);
	queue_close(q);
}

Test(queue_spool, redelivered_job_with_a_result_is_acknowledged)
{
	struct queue *q = open_q(60, 0);
	submit(q, "r1");
	struct queue_job j[1];
	int n;
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	/* a crash after the result was stored but before the claim was removed */
	char p[256];
	snprintf(p, sizeof p, "%s/done/r1.json", dir);
	cr_assert_eq(wk_write_file(p, "{}", 2, err, sizeof err), WK_OK);
	queue_release(q, j, 1, err, sizeof err);
	free_jobs(j, 1);
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect_eq(count_dir("claimed"), 0);
	cr_expect_eq(count_dir("new"), 0);
	struct queue_stats st;
	queue_get_stats(q, &st);
	cr_expect_eq(st.redelivered_done, 1);
	/* a second complete of the same id keeps the first result */
	submit(q, "r2");
	cr_assert_eq(queue_take(q, j, 1, 0, &n, err, sizeof err), WK_OK);
	complete(q, j, 1, false);
	snprintf(p, sizeof p, "%s/done/r2.json", dir);
	char *first;
	size_t len;
	cr_assert_eq(wk_read_file(p, 1 << 20, &first, &len, err, sizeof err), WK_OK);
	struct queue_result r = {.job = j, .json = "{\"other\": 1}", .len = 12};
	cr_expect_eq(queue_complete(q, &r, 1, err, sizeof err), WK_OK);
	char *now;
	cr_assert_eq(wk_read_file(p, 1 << 20, &now, &len, err, sizeof err), WK_OK);
	cr_expect_str_eq(now, first);
	free(first);
	free(now);
	free_jobs(j, 1);
	queue_close(q);
}

Test(queue_spool, bad_names_oversized_and_kept_inputs)
{
	struct queue_opts o = {.max_body = 64};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	char p[256];
	snprintf(p, sizeof p, "%s/new/bad name!.json", dir);
	cr_assert_eq(wk_write_file(p, "{}", 2, err, sizeof err), WK_OK);
	snprintf(p, sizeof p, "%s/new/ignored.txt", dir);
	cr_assert_eq(wk_write_file(p, "x", 1, err, sizeof err), WK_OK);
	char big[200];
	memset(big, 'x', sizeof big);
	snprintf(p, sizeof p, "%s/new/big.json", dir);
	cr_assert_eq(wk_write_file(p, big, sizeof big, err, sizeof err), WK_OK);
	cr_expect_eq(queue_submit(q, "toolarge", big, sizeof big, err, sizeof err), WK_ELIMIT);
	snprintf(p, sizeof p, "%s/new/notjson.json", dir);
	cr_assert_eq(wk_write_file(p, "{oops", 5, err, sizeof err), WK_OK);

	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1); /* only notjson: the worker decides it is invalid_json */
	cr_expect_str_eq(j[0].id, "notjson");
	cr_expect(exists("failed", "bad name!.json"));
	cr_expect(exists("new", "ignored.txt"));
	cr_expect(exists("failed", "big.json"));
	cr_expect(exists("done", "big.json"));
	/* the worker's FAILED result for an unparseable job keeps its input */
	struct job jb;
	char msg[256];
	cr_expect_eq(job_decode(j[0].body, j[0].len, j[0].id, &jb, msg, sizeof msg), JOB_EINVALID_JSON);
	job_free(&jb);
	complete(q, j, 1, true);
	cr_expect(exists("failed", "notjson.json"));
	cr_expect(exists("done", "notjson.json"));
	cr_expect_eq(count_dir("claimed"), 0);
	free_jobs(j, 1);
	queue_close(q);
}

static struct queue *open_watched(struct refusals *r)
{
	memset(r, 0, sizeof *r);
	struct queue_opts o = {.on_refused = on_refused, .on_refused_ctx = r};
	struct queue *q;
	cr_assert_eq(queue_open(url, &o, &q, err, sizeof err), WK_OK, "%s", err);
	return q;
}

static const char *refusal_of(const struct refusals *r, const char *id, const char *needle)
{
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->id[i], id) && strstr(r->why[i], needle))
			return r->why[i];
	return NULL;
}

static char *read_result(struct queue *q, const char *id)
{
	char *res;
	size_t len;
	cr_assert_eq(queue_wait_result(q, id, 0, &res, &len, err, sizeof err), WK_OK, "%s", err);
	return res;
}

/* A symlink, a directory and a fifo in new/: each is refused once on sight (FAILED result,
 * moved to failed/ as it is, a refusal naming it), and a link is never followed: its target's
 * bytes appear nowhere. */
Test(queue_spool, refuses_what_is_not_a_regular_file)
{
	struct refusals rf;
	struct queue *q = open_watched(&rf);
	char p[256], target[256];
	snprintf(target, sizeof target, "%s/../secret", dir);
	cr_assert_eq(wk_write_file(target, "root:x:0:0", 10, err, sizeof err), WK_OK);
	snprintf(p, sizeof p, "%s/new/x.json", dir);
	cr_assert_eq(symlink(target, p), 0);
	snprintf(p, sizeof p, "%s/new/s-dir.json", dir);
	cr_assert_eq(mkdir(p, 0700), 0);
	snprintf(p, sizeof p, "%s/new/ff.json", dir);
	cr_assert_eq(mkfifo(p, 0600), 0);
	submit(q, "fine");

	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	cr_expect_str_eq(j[0].id, "fine");
	complete(q, j, 1, false);
	free_jobs(j, 1);
	cr_expect_eq(rf.n, 3);
	cr_expect_not_null(refusal_of(&rf, "x", "new/x.json is a symbolic link, not a regular file"));
	cr_expect_not_null(refusal_of(&rf, "s-dir", "new/s-dir.json is a directory, not a regular file"));
	cr_expect_not_null(refusal_of(&rf, "ff", "new/ff.json is a fifo, not a regular file"));
	const char *ids[] = {"x", "s-dir", "ff"};
	for (int i = 0; i < 3; i++) {
		char *res = read_result(q, ids[i]);
		cr_expect_not_null(strstr(res, "\"code\": \"invalid_input\""), "%s", res);
		cr_expect_null(strstr(res, "root"), "the link was followed: %s", res);
		free(res);
	}
	struct stat st;
	snprintf(p, sizeof p, "%s/failed/x.json", dir);
	cr_expect(lstat(p, &st) == 0 && S_ISLNK(st.st_mode), "the link itself is kept in failed/");
	snprintf(p, sizeof p, "%s/failed/s-dir.json", dir);
	cr_expect(lstat(p, &st) == 0 && S_ISDIR(st.st_mode));
	cr_expect(exists("failed", "ff.json"));
	cr_expect_eq(count_dir("claimed"), 0);
	cr_expect_eq(count_dir("new"), 0);
	struct queue_stats qs;
	queue_get_stats(q, &qs);
	cr_expect_eq(qs.refused, 3);
	/* once: nothing comes back on a later take, or after a lease would have run out */
	cr_assert_eq(queue_take(q, j, 4, 0, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect_eq(rf.n, 3);
	queue_close(q);
}

/* *.json names in new/ that are not job ids move to failed/ with a refusal (no id, so no
 * result), the name quoted so a log line stays one line. */
Test(queue_spool, names_that_are_not_ids_are_refused_with_a_reason)
{
	struct refusals rf;
	struct queue *q = open_watched(&rf);
	const char *names[] = {"bad id.json", "weird~name.json", "s-x~abc.json", "nl\nx.json"};
	char p[256];
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof p, "%s/new/%s", dir, names[i]);
		cr_assert_eq(wk_write_file(p, "{}", 2, err, sizeof err), WK_OK);
	}
	struct queue_job j[4];
	int n;
	cr_assert_eq(queue_take(q, j, 4, 0, &n, err, sizeof err), WK_OK);
	cr_expect_eq(n, 0);
	cr_expect_eq(rf.n, 4);
	cr_expect_not_null(refusal_of(&rf, "", "'new/bad id.json': the name is not a job id"));
	cr_expect_not_null(refusal_of(&rf, "", "'new/weird~name.json': the name is not a job id"));
	cr_expect_not_null(refusal_of(&rf, "", "'new/s-x~abc.json': the name is not a job id"));
	cr_expect_not_null(refusal_of(&rf, "", "'new/nl\\x0ax.json': the name is not a job id"));
	for (int i = 0; i < rf.n; i++)
		cr_expect_null(strchr(rf.why[i], '\n'), "%s", rf.why[i]);
	for (int i = 0; i < 4; i++)
		cr_expect(exists("failed", names[i]), "%s", names[i]);
	cr_expect_eq(count_dir("done"), 0); /* "s-x" must not get a result: a real s-x may come */
	cr_expect_eq(count_dir("new"), 0);
	queue_close(q);
}

/* Results are 0600 even when written into the inode of a finished 0644 input (a spare), and
 * a hard-linked input is never reused: its other name keeps its bytes. */
Test(queue_spool, results_are_0600_and_never_written_through_an_input)
{
	struct queue *q = open_q(0, 0);
	char p[256], outside[256];
	const char *body = "{\"id\": \"a\", \"input\": {\"prompt\": \"hi\"}}";
	snprintf(p, sizeof p, "%s/new/a.json", dir);
	cr_assert_eq(wk_write_file(p, body, strlen(body), err, sizeof err), WK_OK);
	cr_assert_eq(chmod(p, 0644), 0);
	snprintf(outside, sizeof outside, "%s/../mine.json", dir);
	cr_assert_eq(wk_write_file(outside, body, strlen(body), err, sizeof err), WK_OK);
	snprintf(p, sizeof p, "%s/new/h.json", dir);
	cr_assert_eq(link(outside, p), 0);
	struct queue_job j[2];
	int n;
	/* a and h run and finish; their claims are the candidates for spares */
	cr_assert_eq(queue_take(q, j, 2, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 2);
	complete(q, j, 2, false);
	free_jobs(j, 2);
	submit(q, "b");
	submit(q, "c");
	cr_assert_eq(queue_take(q, j, 2, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 2);
	complete(q, j, 2, false);
	free_jobs(j, 2);
	const char *ids[] = {"a", "h", "b", "c"};
	for (int i = 0; i < 4; i++) {
		struct stat st;
		snprintf(p, sizeof p, "%s/done/%s.json", dir, ids[i]);
		cr_assert_eq(stat(p, &st), 0, "%s", p);
		cr_expect_eq(st.st_mode & 07777, 0600, "done/%s.json has mode %o", ids[i], st.st_mode & 07777);
	}
	char *got;
	size_t len;
	cr_assert_eq(wk_read_file(outside, 1 << 20, &got, &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect(len == strlen(body) && !memcmp(got, body, len), "the hard link was overwritten: %.*s",
		  (int)len, got);
	free(got);
	queue_close(q);
}

Test(queue_spool, group_commit)
{
	struct queue *q = open_q(60, 0);
	char id[16];
	for (int i = 0; i < 40; i++) {
		snprintf(id, sizeof id, "g%02d", i);
		submit(q, id);
	}
	struct queue_stats st0, st1;
	queue_get_stats(q, &st0);
	struct queue_job j[40];
	int n;
	cr_assert_eq(queue_take(q, j, 40, 0, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 40);
	complete(q, j, n, false);
	queue_get_stats(q, &st1);
	cr_expect_leq(st1.syncs - st0.syncs, 2, "%llu syncs for 40 results",
		      (unsigned long long)(st1.syncs - st0.syncs));
	cr_expect_eq(count_dir("done"), 40);
	free_jobs(j, n);
	queue_close(q);
}

/* Two processes take and complete 200 jobs one or a few at a time: each job is delivered to
 * exactly one of them, and each has exactly one result. */
Test(queue_spool, two_takers_never_share_a_job)
{
	struct queue *q = open_q(60, 0);
	char id[16];
	for (int i = 0; i < 200; i++) {
		snprintf(id, sizeof id, "t%03d", i);
		submit(q, id);
	}
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t kids[2];
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		cr_assert_geq(kids[k], 0);
		if (kids[k] == 0) {
			close(fds[0]);
			struct queue *cq;
			struct queue_opts o = {.lease_s = 60};
			if (queue_open(url, &o, &cq, err, sizeof err) != WK_OK)
				_exit(3);
			for (;;) {
				struct queue_job j[3];
				int n;
				if (queue_take(cq, j, 1 + k * 2, 0.2, &n, err, sizeof err) != WK_OK)
					_exit(4);
				if (n == 0)
					break;
				struct queue_result r[3];
				for (int i = 0; i < n; i++) {
					r[i] = (struct queue_result){.job = &j[i], .json = "{}", .len = 2};
					char line[JOB_ID_MAX + 2];
					int l = snprintf(line, sizeof line, "%s\n", j[i].id);
					if (write(fds[1], line, (size_t)l) != l)
						_exit(5);
				}
				if (queue_complete(cq, r, n, err, sizeof err) != WK_OK)
					_exit(6);
				for (int i = 0; i < n; i++)
					queue_job_free(&j[i]);
			}
			queue_close(cq);
			_exit(0);
		}
	}
	close(fds[1]);
	FILE *f = fdopen(fds[0], "r");
	int seen[200] = {0}, total = 0;
	char line[64];
	while (fgets(line, sizeof line, f)) {
		int i = atoi(line + 1);
		cr_assert(i >= 0 && i < 200);
		seen[i]++;
		total++;
	}
	fclose(f);
	for (int k = 0; k < 2; k++) {
		int st;
		waitpid(kids[k], &st, 0);
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "taker %d status %d", k, st);
	}
	cr_expect_eq(total, 200);
	for (int i = 0; i < 200; i++)
		cr_expect_eq(seen[i], 1, "job t%03d delivered %d times", i, seen[i]);
	cr_expect_eq(count_dir("done"), 200);
	cr_expect_eq(count_dir("claimed"), 0);
	cr_expect_eq(count_dir("new"), 0);
	queue_close(q);
}

Test(queue_spool, name_parsers, .init = NULL, .fini = NULL)
{
	char id[JOB_ID_MAX + 1];
	int a, prev;
	long pid;
	long long exp;
	cr_expect(queue_spool_parse_claim("a.b~2~123~1700000000000", id, &a, &pid, &exp));
	cr_expect_str_eq(id, "a.b");
	cr_expect_eq(a, 2);
	cr_expect_eq(pid, 123);
	cr_expect_eq(exp, 1700000000000LL);
	const char *bad[] = {"", "a", "a~1~2", "~1~2~3", "a~0~2~3", "a~1~0~3", "a~1~2~", "a~1~2~x",
			     "a b~1~2~3", "a~1~2~3~", "a~~2~3"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_expect(!queue_spool_parse_claim(bad[i], id, &a, &pid, &exp), "%s parsed", bad[i]);
	cr_expect(queue_spool_parse_new("x.json", id, &prev));
	cr_expect_str_eq(id, "x");
	cr_expect_eq(prev, 0);
	cr_expect(queue_spool_parse_new("x.json.json", id, &prev));
	cr_expect_str_eq(id, "x.json");
	cr_expect(queue_spool_parse_new("x~4.json", id, &prev));
	cr_expect_eq(prev, 4);
	const char *badn[] = {"x", ".json", "x.txt", ".x.json", "x~.json", "x~a.json", "a b.json", "~1.json"};
	for (size_t i = 0; i < sizeof badn / sizeof badn[0]; i++)
		cr_expect(!queue_spool_parse_new(badn[i], id, &prev), "%s parsed", badn[i]);
}
