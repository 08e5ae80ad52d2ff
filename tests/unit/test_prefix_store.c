/*
 * The prefix cache kept across restarts (worker/prefix_store.c): entries written by one
 * engine's scheduler are read into another's, opened alike, and a request that begins with one
 * reuses it and gives what a fresh prefill gives. What cannot be read is refused with a
 * message naming the file and the fault, and the entries before it stay.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/prefix_store.h"
#include "worker/sched.h"

static char dir[256], pc[300];
static char err[WK_ERRSZ];

static void setup(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512];
	snprintf(dir, sizeof dir, "/tmp/wick-pstore-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	snprintf(pc, sizeof pc, "%s/pc", dir);
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "%s", err);
}

static void teardown(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(prefix_store, .init = setup, .fini = teardown, .timeout = 120);

static struct engine *open_eng(int max_seq, int max_seqs)
{
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .max_seq = max_seq, .max_seqs = max_seqs};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	return e;
}

static struct sched *cached(struct engine *e)
{
	struct sched *s = sched_create(e, NULL);
	cr_assert(s);
	cr_assert_eq(sched_set_prefix_cache(s, true), WK_OK);
	return s;
}

static void on_done(void *ctx, struct sched_req *r)
{
	*(struct sched_req **)ctx = r;
}

/* Runs a greedy request of prompt p (cache_key key) to its end in s. */
static struct sched_req *run(struct engine *e, struct sched *s, const char *p, uint64_t key)
{
	struct sched_req *r = calloc(1, sizeof *r), *got = NULL;
	cr_assert(r);
	snprintf(r->id, sizeof r->id, "r");
	cr_assert_eq(tok_encode(eng_tokenizer(e), p, strlen(p), true, &r->prompt, &r->n_prompt,
				err, sizeof err), WK_OK);
	r->max_tokens = 8;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	r->cache_key = key;
	cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; sched_pending(s) > 0; k++) {
		cr_assert_geq(sched_step(s, on_done, &got), 0);
		cr_assert_lt(k, 100);
	}
	cr_assert_eq(got, r);
	cr_assert_eq(r->status, SCHED_DONE, "%s", r->error);
	return r;
}

static const char *prompts[] = {
	"Once upon a time, there was a little girl named Lily. She liked to",
	"Tom had a big red ball. He liked to play with it in the park. One day,",
	"The sun was hot and the cat sat under a tree. It was sleepy and"};
static const uint64_t keys[] = {1, 1, 2};

/* The entries' tokens, most recent first, as one string (for comparing two caches). */
static void entries_of(struct sched *s, char *out, size_t n)
{
	struct sched_cache_stats st;
	sched_cache_stats(s, &st);
	size_t at = 0;
	out[0] = 0;
	struct sched_cache_entry *ce;
	cr_assert_eq(sched_cache_entries(s, &ce), WK_OK);
	for (int i = 0; i < st.entries; i++) {
		const struct sched_cache_entry *c = &ce[i];
		at += (size_t)snprintf(out + at, n - at, "[%llu:%d:", (unsigned long long)c->key,
				       c->n);
		for (int k = 0; k < c->n && at < n; k++)
			at += (size_t)snprintf(out + at, n - at, "%d,", c->tok[k]);
		at += (size_t)snprintf(out + at, n - at, "]");
		cr_assert_lt(at, n);
	}
	free(ce);
}

static void fresh_file(struct engine *e, uint64_t *id, char *path, size_t n)
{
	struct sched *s = cached(e);
	for (int i = 0; i < 3; i++)
		sched_req_free(run(e, s, prompts[i], keys[i]));
	cr_assert_eq(eng_cache_id(e, id, err, sizeof err), WK_OK, "%s", err);
	struct prefix_store_stats st;
	cr_assert_eq(prefix_store_save(s, e, pc, *id, NULL, &st, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(st.entries, 3);
	snprintf(path, n, "%s", st.path);
	sched_free(s);
}

/* Written by one engine, read by another: the same entries in the same order, and a request
 * that begins with one runs its last prompt token only and gives what a fresh prefill gives.
 * A tenant's entry stays its own. */
Test(prefix_store, entries_outlive_the_engine)
{
	struct engine *e = open_eng(256, 4);
	struct sched *s = cached(e);
	for (int i = 0; i < 3; i++)
		sched_req_free(run(e, s, prompts[i], keys[i]));
	uint64_t id;
	cr_assert_eq(eng_cache_id(e, &id, err, sizeof err), WK_OK, "%s", err);
	struct prefix_store_stats st;
	cr_assert_eq(prefix_store_save(s, e, pc, id, NULL, &st, err, sizeof err), WK_OK, "%s",
		     err);
	cr_expect_eq(st.entries, 3);
	struct stat fs;
	cr_assert_eq(stat(st.path, &fs), 0, "%s", st.path);
	cr_expect_eq(fs.st_mode & 0777, 0600, "mode %o", fs.st_mode & 0777);
	cr_expect_eq((uint64_t)fs.st_size, st.bytes);
	static char before[1 << 14], after[1 << 14];
	entries_of(s, before, sizeof before);
	sched_free(s);
	eng_close(e);

	e = open_eng(256, 8); /* (room for a scheduler without the cache beside it) */
	s = cached(e);
	struct prefix_store_stats ld;
	cr_assert_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(ld.entries, 3);
	cr_expect_eq(ld.skipped, 0);
	cr_expect_eq(ld.tokens, st.tokens);
	cr_expect_eq(ld.bytes, st.bytes);
	entries_of(s, after, sizeof after);
	cr_expect_str_eq(after, before, "the entries read are not those written");
	struct sched *plain = sched_create(e, NULL);
	for (int i = 0; i < 3; i++) {
		struct sched_req *r = run(e, s, prompts[i], keys[i]), *a = run(e, plain, prompts[i], 0);
		cr_expect_eq(r->cached, r->n_prompt - 1, "prompt %d: %d of %d cached", i, r->cached,
			     r->n_prompt);
		cr_expect_eq(r->n_out, a->n_out);
		cr_expect_eq(memcmp(r->out, a->out, sizeof *r->out * (size_t)a->n_out), 0,
			     "prompt %d: the kept cache gave other tokens than a fresh prefill", i);
		sched_req_free(r);
		sched_req_free(a);
	}
	struct sched_req *r = run(e, s, prompts[2], 1); /* key 2's prompt, as tenant 1 */
	cr_expect_eq(r->cached, 0, "another tenant's entry reused: %d cached", r->cached);
	sched_req_free(r);
	sched_free(plain);
	sched_free(s);
	eng_close(e);
}

/* An engine with fewer sequences reads the most recent entries (and evicts them least recent
 * first), one with a shorter context
 * passes over those longer than it, and one of another cache type finds no file of its id. */
Test(prefix_store, fewer_sequences_and_shorter_contexts)
{
	struct engine *e = open_eng(256, 4);
	uint64_t id;
	char path[4200];
	fresh_file(e, &id, path, sizeof path);
	struct sched *s = cached(e);
	struct prefix_store_stats ld;
	cr_assert_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	static char all[1 << 14], two[1 << 14];
	entries_of(s, all, sizeof all);
	sched_free(s);
	eng_close(e);

	e = open_eng(256, 2);
	s = cached(e);
	cr_assert_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(ld.entries, 2);
	cr_expect_eq(ld.skipped, 1);
	entries_of(s, two, sizeof two);
	cr_expect(!strncmp(all, two, strlen(two)) && strlen(two) < strlen(all),
		  "not the two most recent: %s\nof %s", two, all);
	/* and they are evicted in that order: another prompt takes the older one's sequence */
	sched_req_free(run(e, s, "A frog sat on a log by the pond and sang", 3));
	struct sched_req *r = run(e, s, prompts[2], keys[2]);
	cr_expect_eq(r->cached, r->n_prompt - 1, "the most recent entry was evicted first");
	sched_req_free(r);
	sched_free(s);
	eng_close(e);

	e = open_eng(16, 4); /* every entry holds more than 16 positions */
	s = cached(e);
	cr_assert_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(ld.entries, 0);
	cr_expect_eq(ld.skipped, 3);
	sched_free(s);
	eng_close(e);

	struct eng_opts o = {.backend = "cpu", .max_seq = 256, .max_seqs = 4, .kv_dtype = "bf16"};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	uint64_t other;
	cr_assert_eq(eng_cache_id(e, &other, err, sizeof err), WK_OK);
	cr_expect_neq(other, id);
	s = cached(e);
	cr_assert_eq(prefix_store_load(s, e, pc, other, &ld, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(ld.entries, 0);
	cr_expect_eq(ld.bytes, 0, "bf16 read the f32 file");
	sched_free(s);
	eng_close(e);
}

static void copy_file(const char *from, const char *to, long keep)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	cr_assert(a && b);
	for (long k = 0, c; (c = getc(a)) != EOF && (keep < 0 || k < keep); k++)
		putc((int)c, b);
	fclose(a);
	fclose(b);
}

/* A file whose load must fail with `want` in the message, after `loaded` entries. */
static void refused(struct engine *e, uint64_t id, int loaded, const char *want)
{
	struct sched *s = cached(e);
	struct prefix_store_stats ld;
	cr_expect_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_EFORMAT,
		     "no refusal for '%s'", want);
	cr_expect(strstr(err, want) && strstr(err, pc), "'%s' is not '%s'", err, want);
	cr_expect_eq(ld.entries, loaded, "%s: %d entries before it", want, ld.entries);
	struct sched_cache_stats cs;
	sched_cache_stats(s, &cs);
	cr_expect_eq(cs.entries, loaded);
	sched_free(s); /* (frees the sequences of what was read) */
	int seq[4];
	for (int i = 0; i < 4; i++) /* every sequence free again: none leaked by a refusal */
		cr_expect_eq(eng_seq_alloc(e, &seq[i]), WK_OK, "%s: sequence %d", want, i);
	for (int i = 0; i < 4; i++)
		eng_seq_free(e, seq[i]);
}

/* Damage of each kind is named; the entries before it stay. An empty cache removes the file;
 * a directory that cannot be made is named. */
Test(prefix_store, damage_is_named)
{
	struct engine *e = open_eng(256, 4);
	uint64_t id;
	char path[4200], good[4300];
	fresh_file(e, &id, path, sizeof path);
	snprintf(good, sizeof good, "%s.good", path);
	copy_file(path, good, -1);
	struct stat fs;
	cr_assert_eq(stat(good, &fs), 0);

	copy_file(good, path, fs.st_size - 10);
	refused(e, id, 2, "entry 3: the file ends inside it");
	copy_file(good, path, -1);
	FILE *f = fopen(path, "r+b");
	fseek(f, 32 + 32 + 10, SEEK_SET); /* the first entry's tokens */
	putc(0x7f, f);
	fclose(f);
	refused(e, id, 0, "entry 1: its checksum does not match");
	copy_file(good, path, -1);
	f = fopen(path, "r+b");
	fseek(f, 16, SEEK_SET); /* the header's id */
	putc(0x55, f);
	fclose(f);
	refused(e, id, 0, "header's checksum");
	copy_file(good, path, 8);
	refused(e, id, 0, "not a wick prefix cache");
	/* a file renamed to another id's name */
	char other[4300];
	snprintf(other, sizeof other, "%s/prefix-%016llx.wpc", pc, (unsigned long long)(id ^ 1));
	copy_file(good, other, -1);
	refused(e, id ^ 1, 0, "made by another model");

	/* nothing of its own: the file stays as it was */
	copy_file(good, path, -1);
	struct sched *s = cached(e);
	struct prefix_store_stats st;
	cr_assert_eq(prefix_store_save(s, e, pc, id, NULL, &st, err, sizeof err), WK_OK, "%s",
		     err);
	cr_expect_eq(st.entries, 0);
	struct stat after;
	cr_expect(stat(path, &after) == 0 && after.st_size == fs.st_size,
		  "an empty cache changed %s", path);
	char bad[600];
	snprintf(bad, sizeof bad, "%s/model.safetensors/pc", dir); /* under a file */
	cr_expect_eq(prefix_store_save(s, e, bad, id, NULL, &st, err, sizeof err), WK_EIO);
	cr_expect(strstr(err, bad), "%s", err);
	sched_free(s);
	eng_close(e);
}

/* The same file's identity and contents, to tell whether a save left it alone. */
static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert(f, "%s", path);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	rewind(f);
	char *b = malloc(*n + 1);
	cr_assert_eq(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

/* Bounds: --prefix-cache-max keeps the most recent entries that fit (the header counting
 * them), a drain's deadline passed writes none and leaves the older file; temporaries a
 * killed writer left are removed, a live writer's are not. */
Test(prefix_store, bounds_keep_the_most_recent)
{
	struct engine *e = open_eng(256, 4);
	uint64_t id;
	char path[4200];
	fresh_file(e, &id, path, sizeof path);
	struct sched *s = cached(e);
	struct prefix_store_stats st;
	cr_assert_eq(prefix_store_load(s, e, pc, id, &st, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(st.entries, 3);
	struct sched_cache_entry *ce;
	cr_assert_eq(sched_cache_entries(s, &ce), WK_OK);
	int n0_tok = ce[0].n; /* the most recent */
	free(ce);
	uint64_t one = 32 + 32 + (uint64_t)n0_tok * 4 + eng_seq_bytes(e, n0_tok);

	/* a killed writer's temporary (an hour old), a live one's, and another name */
	char old[4300], live[4300], other[4300];
	snprintf(old, sizeof old, "%s.Ab3xYz", path);
	snprintf(live, sizeof live, "%s.Qw9rTy", path);
	snprintf(other, sizeof other, "%s.tmp", path);
	const char *made[] = {old, live, other};
	for (int i = 0; i < 3; i++)
		fclose(fopen(made[i], "w"));
	struct utimbuf ut = {time(NULL) - 3600, time(NULL) - 3600};
	cr_assert_eq(utime(old, &ut), 0);
	cr_assert_eq(utime(other, &ut), 0);

	struct prefix_store_limits lim = {.max_bytes = one + 10};
	cr_assert_eq(prefix_store_save(s, e, pc, id, &lim, &st, err, sizeof err), WK_OK, "%s",
		     err);
	cr_expect_eq(st.entries, 1);
	cr_expect_eq(st.skipped, 2);
	cr_expect_eq(st.bytes, one);
	cr_expect_neq(access(old, F_OK), 0, "a killed writer's temporary stayed");
	cr_expect_eq(access(live, F_OK), 0, "a live writer's temporary was removed");
	cr_expect_eq(access(other, F_OK), 0, "another file was removed");
	struct sched *t = cached(e); /* (s's sequences: this one reads into the free one) */
	sched_free(s);
	struct prefix_store_stats ld;
	cr_assert_eq(prefix_store_load(t, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(ld.entries, 1);
	cr_assert_eq(sched_cache_entries(t, &ce), WK_OK);
	cr_expect_eq(ce[0].n, n0_tok, "not the most recent entry");
	free(ce);
	size_t n0, n1;
	char *before = slurp(path, &n0);
	lim = (struct prefix_store_limits){.max_bytes = 40}; /* no entry fits */
	cr_assert_eq(prefix_store_save(t, e, pc, id, &lim, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 0);
	cr_expect_eq(st.skipped, 1);
	lim = (struct prefix_store_limits){.deadline = wk_now() - 1}; /* the drain is over */
	cr_assert_eq(prefix_store_save(t, e, pc, id, &lim, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 0);
	char *after = slurp(path, &n1);
	cr_expect(n0 == n1 && !memcmp(before, after, n0), "the older file changed");
	free(before);
	free(after);
	lim = (struct prefix_store_limits){.deadline = wk_now() + 3600};
	cr_assert_eq(prefix_store_save(t, e, pc, id, &lim, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 1);
	cr_expect_eq(st.skipped, 0);
	sched_free(t);
	eng_close(e);
}

/* The entries a save finds in the file it replaces, in the order written (keys and lengths),
 * read into a fresh scheduler. */
static int order_of(struct engine *e, uint64_t id, int *n_tok, uint64_t *key)
{
	struct sched *s = cached(e);
	struct prefix_store_stats ld;
	cr_assert_eq(prefix_store_load(s, e, pc, id, &ld, err, sizeof err), WK_OK, "%s", err);
	struct sched_cache_entry *ce;
	cr_assert_eq(sched_cache_entries(s, &ce), WK_OK);
	for (int i = 0; i < ld.entries; i++) {
		n_tok[i] = ce[i].n;
		key[i] = ce[i].key;
	}
	free(ce);
	sched_free(s);
	return ld.entries;
}

/* Workers that share a directory: each save keeps, after its own entries, those of the file
 * it replaces that its own do not hold (the same key and tokens), up to the sequences an
 * engine like it can read back. */
Test(prefix_store, workers_sharing_a_directory_keep_the_union)
{
	struct engine *e = open_eng(256, 4);
	uint64_t id;
	cr_assert_eq(eng_cache_id(e, &id, err, sizeof err), WK_OK);
	struct prefix_store_stats st;
	struct sched *a = cached(e); /* worker A: prompts 0 and 1, tenant 1 */
	sched_req_free(run(e, a, prompts[0], 1));
	sched_req_free(run(e, a, prompts[1], 1));
	cr_assert_eq(prefix_store_save(a, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.merged, 0);
	sched_free(a);
	struct sched *b = cached(e); /* worker B, which never read A's: prompt 2, tenant 2 */
	sched_req_free(run(e, b, prompts[2], 2));
	cr_assert_eq(prefix_store_save(b, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 3);
	cr_expect_eq(st.merged, 2, "A's entries not kept: %d", st.merged);
	sched_free(b);
	int n_tok[8];
	uint64_t key[8];
	cr_assert_eq(order_of(e, id, n_tok, key), 3);
	cr_expect(key[0] == 2 && key[1] == 1 && key[2] == 1, "order %llu %llu %llu",
		  (unsigned long long)key[0], (unsigned long long)key[1],
		  (unsigned long long)key[2]);
	/* worker C: prompt 2 again as tenant 2 (its entry holds the older one's tokens: that one
	 * goes) and prompt 1 as tenant 2 (another key: tenant 1's stays) */
	struct sched *c = cached(e);
	sched_req_free(run(e, c, prompts[2], 2));
	sched_req_free(run(e, c, prompts[1], 2));
	cr_assert_eq(prefix_store_save(c, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 4);
	cr_expect_eq(st.merged, 2, "%d kept: tenant 1's prompts 1 and 0", st.merged);
	sched_free(c);
	cr_assert_eq(order_of(e, id, n_tok, key), 4);
	cr_expect(key[0] == 2 && key[1] == 2 && key[2] == 1 && key[3] == 1,
		  "keys %llu %llu %llu %llu: a duplicate kept", (unsigned long long)key[0],
		  (unsigned long long)key[1], (unsigned long long)key[2],
		  (unsigned long long)key[3]);
	eng_close(e);
	/* an engine of 2 sequences keeps at most 2 */
	e = open_eng(256, 2);
	struct sched *d = cached(e);
	sched_req_free(run(e, d, "A frog sat on a log by the pond and sang", 3));
	cr_assert_eq(prefix_store_save(d, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.entries, 2);
	cr_expect_eq(st.merged, 1);
	sched_free(d);
	/* a file of a short entry behind a long one (most recent first), merged by an engine
	 * of 16 positions: the long one is passed over, the short one after it kept */
	d = cached(e);
	sched_req_free(run(e, d, "Once", 4));
	sched_req_free(run(e, d, prompts[1], 4));
	cr_assert_eq(prefix_store_save(d, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	sched_free(d);
	eng_close(e);
	e = open_eng(16, 2);
	d = cached(e);
	sched_req_free(run(e, d, "A dog", 5));
	cr_assert_eq(prefix_store_save(d, e, pc, id, NULL, &st, err, sizeof err), WK_OK);
	cr_expect_eq(st.merged, 1, "the short entry behind a long one: %d kept", st.merged);
	sched_free(d);
	eng_close(e);
}
