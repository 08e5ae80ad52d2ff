/* Kept responses on disk (--responses-dir): they outlive the store that wrote them, a tenant
 * sees only its own, the least recently used go past the bound, and a bad file or id is
 * named, never a crash or a path outside the directory. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/wk.h"
#include "worker/resp_store.h"

static char dir[256], sub[300];
static char err[WK_ERRSZ];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/wick-rstore-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(sub, sizeof sub, "%s/kept", dir);
}

static void teardown(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(resp_store, .init = setup, .fini = teardown, .timeout = 60);

static char logged[2048]; /* the writer's messages */

static void on_log(void *ctx, const char *msg)
{
	(void)ctx;
	size_t o = strlen(logged);
	snprintf(logged + o, sizeof logged - o, "%s\n", msg);
}

static struct resp_store *open_aged(uint64_t max, double max_age)
{
	struct resp_store *s = NULL;
	logged[0] = 0;
	cr_assert_eq(resp_store_open(sub, max, max_age, on_log, NULL, &s, err, sizeof err), WK_OK,
		     "%s", err);
	return s;
}

static struct resp_store *open_store(uint64_t max)
{
	return open_aged(max, 0);
}

/* Keeps a conversation of one user message, and its object (not waiting for the writer). */
static void put_async(struct resp_store *s, const char *id, const char *tenant, const char *text)
{
	json_t *c = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
	json_t *o = json_pack("{s:s, s:s}", "id", id, "object", "response");
	cr_assert_eq(resp_store_put(s, id, tenant, c, o, err, sizeof err), WK_OK, "%s", err);
	json_decref(c);
	json_decref(o);
}

/* ... and waits until it is written. */
static void put(struct resp_store *s, const char *id, const char *tenant, const char *text)
{
	put_async(s, id, tenant, text);
	resp_store_flush(s);
}

/* The content of id's kept conversation, or NULL (and its status in *rc). */
static char *got(struct resp_store *s, const char *id, const char *tenant, int *rc)
{
	json_t *c, *o;
	*rc = resp_store_get(s, id, tenant, &c, &o, err, sizeof err);
	if (*rc != WK_OK) {
		cr_assert(!c && !o);
		return NULL;
	}
	cr_expect_str_eq(json_string_value(json_object_get(o, "id")), id);
	char *t = strdup(json_string_value(json_object_get(json_array_get(c, 0), "content")));
	json_decref(c);
	json_decref(o);
	return t;
}

static int files_in(const char *d, const char *suffix)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c '%s$'", d, suffix);
	FILE *p = popen(cmd, "r");
	int n = -1;
	cr_assert_eq(fscanf(p, "%d", &n), 1);
	pclose(p);
	return n;
}

Test(resp_store, a_response_outlives_its_store)
{
	struct resp_store *s = open_store(0);
	put(s, "resp_a1", "acme", "hello there");
	put(s, "resp_b2", "acme", "second");
	resp_store_close(s);

	s = open_store(0); /* a new process: only the files */
	uint64_t bytes = 0;
	cr_expect_eq(resp_store_count(s, &bytes, NULL), 2);
	cr_expect_gt(bytes, 50);
	int rc;
	char *t = got(s, "resp_a1", "acme", &rc);
	cr_assert_eq(rc, WK_OK, "%s", err);
	cr_expect_str_eq(t, "hello there");
	free(t);
	/* kept private: the directory 0700, each file 0600 */
	struct stat st;
	cr_assert_eq(stat(sub, &st), 0);
	cr_expect_eq(st.st_mode & 0777, 0700);
	cr_expect_eq(files_in(sub, ".json"), 2);
	char cmd[600], name[300] = "";
	snprintf(cmd, sizeof cmd, "ls '%s' | head -1", sub);
	FILE *p = popen(cmd, "r");
	cr_assert(fgets(name, sizeof name, p));
	pclose(p);
	name[strcspn(name, "\n")] = 0;
	char path[700];
	snprintf(path, sizeof path, "%s/%s", sub, name);
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(st.st_mode & 0777, 0600, "%s: %o", path, st.st_mode & 0777);
	/* deleted: gone from disk, and from the next store */
	cr_expect(resp_store_delete(s, "resp_a1", "acme"));
	cr_expect_not(resp_store_delete(s, "resp_a1", "acme"));
	cr_expect_null(got(s, "resp_a1", "acme", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	resp_store_close(s);
	s = open_store(0);
	cr_expect_eq(resp_store_count(s, NULL, NULL), 1);
	cr_expect_null(got(s, "resp_a1", "acme", &rc));
	t = got(s, "resp_b2", "acme", &rc);
	cr_expect_str_eq(t, "second");
	free(t);
	resp_store_close(s);
}

Test(resp_store, a_tenant_sees_only_its_own)
{
	struct resp_store *s = open_store(0);
	put(s, "resp_x", "acme", "acme's");
	int rc;
	cr_expect_null(got(s, "resp_x", "globex", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	cr_expect_not(resp_store_delete(s, "resp_x", "globex"));
	put(s, "resp_x", "globex", "globex's"); /* the same id: another file */
	char *t = got(s, "resp_x", "acme", &rc);
	cr_expect_str_eq(t, "acme's");
	free(t);
	t = got(s, "resp_x", "globex", &rc);
	cr_expect_str_eq(t, "globex's");
	free(t);
	cr_expect(resp_store_delete(s, "resp_x", "globex"));
	t = got(s, "resp_x", "acme", &rc);
	cr_expect_str_eq(t, "acme's");
	free(t);
	/* a file whose name is acme's but which says it is another tenant's: not acme's */
	char cmd[900];
	snprintf(cmd, sizeof cmd, "cd '%s' && f=$(ls resp_x.*.json) && "
		 "sed -i 's/\"tenant\":\"acme\"/\"tenant\":\"other\"/' \"$f\"", sub);
	cr_assert_eq(system(cmd), 0);
	cr_expect_null(got(s, "resp_x", "acme", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	resp_store_close(s);
}

/* Ids that cannot be a file's name are not found and not written: no path outside DIR. */
Test(resp_store, an_id_is_never_a_path)
{
	struct resp_store *s = open_store(0);
	put(s, "resp_ok", "t", "x");
	static const char *const bad[] = {"", "../resp_ok", "a/b", ".", "..", "resp ok",
					  "resp_ok.json",
					  "r23456789012345678901234567890123456789012345678"};
	json_t *c = json_array(), *o = json_object();
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int rc;
		cr_expect_null(got(s, bad[i], "t", &rc), "%s", bad[i]);
		cr_expect_eq(rc, WK_ENOTFOUND, "%s", bad[i]);
		cr_expect_not(resp_store_delete(s, bad[i], "t"));
		cr_expect_eq(resp_store_put(s, bad[i], "t", c, o, err, sizeof err), WK_EINVAL,
			     "%s", bad[i]);
	}
	json_decref(c);
	json_decref(o);
	cr_expect_eq(files_in(sub, ".json"), 1);
	cr_expect_eq(files_in(dir, ".json"), 0);
	resp_store_close(s);
}

/* Past the bound the least recently used go: a read is a use, and survives a reopen. */
Test(resp_store, the_least_recently_used_go_past_the_bound)
{
	char big[1001];
	memset(big, 'x', 1000);
	big[1000] = 0;
	struct resp_store *s = open_store(3500); /* three files of ~1.1 KB */
	put(s, "resp_1", "t", big);
	usleep(20000);
	put(s, "resp_2", "t", big);
	usleep(20000);
	put(s, "resp_3", "t", big);
	cr_expect_eq(resp_store_count(s, NULL, NULL), 3);
	usleep(20000);
	int rc;
	free(got(s, "resp_1", "t", &rc)); /* 1 is now the most recently used */
	cr_expect_eq(rc, WK_OK);
	usleep(20000);
	put(s, "resp_4", "t", big); /* 2 goes */
	cr_expect_eq(resp_store_count(s, NULL, NULL), 3);
	cr_expect_null(got(s, "resp_2", "t", &rc));
	usleep(20000); /* (a file's time is as fine as the kernel's tick) */
	free(got(s, "resp_1", "t", &rc));
	cr_expect_eq(rc, WK_OK);
	resp_store_close(s);
	/* a smaller bound at the next open: the oldest go (3, then 4; 1 was read last) */
	s = open_store(1500);
	cr_expect_eq(resp_store_count(s, NULL, NULL), 1);
	free(got(s, "resp_1", "t", &rc));
	cr_expect_eq(rc, WK_OK, "%s", err);
	cr_expect_eq(files_in(sub, ".json"), 1);
	/* one bigger than the bound alone is not written; the others stay */
	char huge[2001];
	memset(huge, 'y', 2000);
	huge[2000] = 0;
	json_t *c = json_pack("[{s:s}]", "content", huge), *o = json_object();
	cr_expect_eq(resp_store_put(s, "resp_5", "t", c, o, err, sizeof err), WK_ELIMIT);
	cr_expect(strstr(err, "past the bound"), "%s", err);
	json_decref(c);
	json_decref(o);
	cr_expect_eq(resp_store_count(s, NULL, NULL), 1);
	resp_store_close(s);
}

/* A file cut short (a crash on another host) is named and removed; a writer's stale
 * temporary is removed at the next open, a fresh one (a writer at work) is left. */
Test(resp_store, a_bad_file_is_named_and_removed)
{
	struct resp_store *s = open_store(0);
	put(s, "resp_cut", "t", "will be cut");
	put(s, "resp_odd", "t", "will be odd");
	char cmd[900];
	snprintf(cmd, sizeof cmd, "cd '%s' && truncate -s 20 resp_cut.*.json && "
		 "f=$(ls resp_odd.*.json) && echo '{\"id\": \"resp_odd\"}' > \"$f\" && "
		 "echo junk > stale.json.tmp && touch -d '-2 minutes' stale.json.tmp && "
		 "echo junk > fresh.json.tmp && echo x > notes.txt", sub);
	cr_assert_eq(system(cmd), 0);
	int rc;
	cr_expect_null(got(s, "resp_cut", "t", &rc));
	cr_expect_eq(rc, WK_EFORMAT);
	cr_expect(strstr(err, "resp_cut.") && strstr(err, "not a kept response"), "%s", err);
	cr_expect_null(got(s, "resp_odd", "t", &rc));
	cr_expect_eq(rc, WK_EFORMAT);
	cr_expect(strstr(err, "no id, tenant, conversation or object"), "%s", err);
	cr_expect_eq(files_in(sub, ".json"), 0);
	cr_expect_eq(resp_store_count(s, NULL, NULL), 0);
	resp_store_close(s);
	s = open_store(0);
	cr_expect_eq(files_in(sub, ".json.tmp"), 1); /* fresh.json.tmp */
	cr_expect_eq(files_in(sub, ".txt"), 1);      /* not ours: left alone */
	cr_expect_eq(resp_store_count(s, NULL, NULL), 0);
	resp_store_close(s);
}

/* A directory that cannot be one is named at open. */
Test(resp_store, a_bad_directory_is_named)
{
	char file[400];
	snprintf(file, sizeof file, "%s/file", dir);
	FILE *f = fopen(file, "w");
	cr_assert_not_null(f);
	fclose(f);
	struct resp_store *s = NULL;
	cr_expect_eq(resp_store_open(file, 0, 0, NULL, NULL, &s, err, sizeof err), WK_EIO);
	cr_expect(strstr(err, file) && strstr(err, "not a directory"), "%s", err);
	cr_expect_null(s);
	snprintf(file, sizeof file, "%s/no/such/dir", dir);
	cr_expect_eq(resp_store_open(file, 0, 0, NULL, NULL, &s, err, sizeof err), WK_EIO);
	cr_expect(strstr(err, file), "%s", err);
}

/* The writer's thread writes: a put returns at once, a get finds a response still waiting, a
 * close writes what waits, and a write that fails is logged and counted, not a crash. */
Test(resp_store, the_writer_writes_and_a_failure_is_logged)
{
	struct resp_store *s = open_store(0);
	int rc;
	for (int i = 0; i < 50; i++) { /* each readable at once, written or waiting */
		char id[32], text[32];
		snprintf(id, sizeof id, "resp_w%d", i);
		snprintf(text, sizeof text, "turn %d", i);
		put_async(s, id, "t", text);
		char *t = got(s, id, "t", &rc);
		cr_expect(rc == WK_OK && t && !strcmp(t, text), "%s: %d %s", id, rc, err);
		free(t);
	}
	cr_expect_eq(resp_store_count(s, NULL, NULL), 50);
	put_async(s, "resp_gone", "t", "deleted before or after its write");
	cr_expect(resp_store_delete(s, "resp_gone", "t"));
	resp_store_close(s); /* writes what waits */
	cr_expect_eq(files_in(sub, ".json"), 50);
	/* a write that fails: its temporary's name taken by a directory */
	s = open_store(0);
	char tmp[700];
	snprintf(tmp, sizeof tmp, "%s/resp_bad.%016llx.json.tmp", sub,
		 (unsigned long long)XXH3_64bits("t", 1));
	cr_assert_eq(mkdir(tmp, 0700), 0);
	put(s, "resp_bad", "t", "x");
	uint64_t errors = 0;
	cr_expect_eq(resp_store_count(s, NULL, &errors), 50);
	cr_expect_eq(errors, 1);
	cr_expect(strstr(logged, "resp_bad.") && strstr(logged, ".json.tmp"), "%s", logged);
	cr_expect_null(got(s, "resp_bad", "t", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	put(s, "resp_good", "t", "y"); /* the writer goes on */
	cr_expect_eq(resp_store_count(s, NULL, &errors), 51);
	cr_expect_eq(errors, 1);
	resp_store_close(s);
}

/* --responses-max-age: a file not used for that long is gone at the next open, write or
 * read, and never read back; one used since stays. */
Test(resp_store, a_response_past_the_age_bound_is_gone)
{
	struct resp_store *s = open_store(0);
	put(s, "resp_old", "t", "old");
	put(s, "resp_used", "t", "used");
	put(s, "resp_stale", "t", "read after its time");
	resp_store_close(s);
	char cmd[900]; /* two days untouched */
	snprintf(cmd, sizeof cmd, "cd '%s' && touch -d '-2 days' resp_old.*.json resp_used.*.json "
		 "resp_stale.*.json", sub);
	cr_assert_eq(system(cmd), 0);
	s = open_store(0); /* no age bound: all three */
	cr_expect_eq(resp_store_count(s, NULL, NULL), 3);
	int rc;
	free(got(s, "resp_used", "t", &rc)); /* used now */
	cr_expect_eq(rc, WK_OK);
	resp_store_close(s);
	s = open_aged(0, 86400); /* a day: the two untouched ones go at the open */
	cr_expect_eq(resp_store_count(s, NULL, NULL), 1);
	cr_expect_null(got(s, "resp_old", "t", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	char *t = got(s, "resp_used", "t", &rc);
	cr_expect(rc == WK_OK && t && !strcmp(t, "used"), "%d", rc);
	free(t);
	/* a file that ages while the store is open is not read back, and goes */
	snprintf(cmd, sizeof cmd, "cd '%s' && touch -d '-2 days' resp_used.*.json", sub);
	cr_assert_eq(system(cmd), 0);
	cr_expect_null(got(s, "resp_used", "t", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	cr_expect_eq(files_in(sub, ".json"), 0);
	put(s, "resp_new", "t", "new"); /* a new one is kept */
	cr_expect_eq(resp_store_count(s, NULL, NULL), 1);
	resp_store_close(s);
}

/* Workers sharing the directory (a network volume) bound it together: a store that reads it
 * again at each write counts the files another wrote, and removes the least recently used of
 * all; the other then finds its own gone (and forgets it). */
Test(resp_store, workers_sharing_a_directory_bound_it_together)
{
	char big[1001];
	memset(big, 'x', 1000);
	big[1000] = 0;
	struct resp_store *a = open_store(3500), *b = open_store(3500); /* three files of ~1.1 KB */
	resp_store_rescan_every(b, 0);
	put(a, "resp_1", "t", big);
	usleep(20000); /* (a file's time is as fine as the kernel's tick) */
	put(a, "resp_2", "t", big);
	usleep(20000);
	put(b, "resp_3", "t", big);
	cr_expect_eq(files_in(sub, ".json"), 3);
	cr_expect_eq(resp_store_count(b, NULL, NULL), 3, "b does not count a's files");
	usleep(20000);
	put(b, "resp_4", "t", big); /* past the bound: a's oldest goes */
	cr_expect_eq(files_in(sub, ".json"), 3, "the directory is past its bound");
	int rc;
	cr_expect_null(got(a, "resp_1", "t", &rc));
	cr_expect_eq(rc, WK_ENOTFOUND, "%d %s", rc, err);
	cr_expect_eq(resp_store_count(a, NULL, NULL), 1, "a still counts the file b removed");
	free(got(a, "resp_2", "t", &rc)); /* still there, read through a */
	cr_expect_eq(rc, WK_OK, "%s", err);
	resp_store_close(a);
	resp_store_close(b);
}
