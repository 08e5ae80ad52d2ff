/* Fuzz target: the kept prefix cache's reader and merge (worker/prefix_store.c) on arbitrary
 * files. The
 * engine is stories260K (from $WICK_SHARED, default ../shared, converted once per process;
 * f32 caches, 4 sequences of 256 positions). An input that starts with the file's magic is the
 * whole file; any other is a payload behind a valid header: its first byte the entry count,
 * the rest the entries, each entry's checksum set right where its sizes fit the input, so
 * that the field checks, not the checksums, stand between the bytes and the caches. A refusal
 * must name the file; whatever was read must then serve: a request is run through the
 * scheduler; the cache is written over the input's file (merging what it does not hold) and
 * must read back without a refusal; once all is freed every sequence is free again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "tests/fuzz/fuzz.h"
#include "worker/prefix_store.h"
#include "worker/sched.h"

static struct engine *eng;
static uint64_t id;
static char dir[64];

static void cleanup(void)
{
	char cmd[128];
	eng_close(eng);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "fuzz prefix_store: %s was not removed\n", dir);
}

static void load(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[1024], tok[1024], err[WK_ERRSZ];
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	snprintf(dir, sizeof dir, "/tmp/wick-fuzz-pstore-XXXXXX");
	struct eng_opts o = {.backend = "cpu", .max_seq = 256, .max_seqs = 4};
	if (!mkdtemp(dir) || conv_llama2c(bin, tok, dir, err, sizeof err) != WK_OK ||
	    eng_open(dir, &o, &eng, err, sizeof err) != WK_OK ||
	    eng_cache_id(eng, &id, err, sizeof err) != WK_OK) {
		fprintf(stderr, "fuzz prefix_store: %s\n", err);
		abort();
	}
	atexit(cleanup);
}

/* The file the input stands for (see the top); *n its size. */
static uint8_t *file_of(const uint8_t *data, size_t size, size_t *n)
{
	if (size >= 8 && !memcmp(data, "WICKPFX1", 8)) {
		uint8_t *f = malloc(size ? size : 1);
		memcpy(f, data, size);
		*n = size;
		return f;
	}
	size_t body = size ? size - 1 : 0;
	uint8_t *f = calloc(1, 32 + body);
	memcpy(f, "WICKPFX1", 8);
	f[8] = 1; /* version */
	f[12] = size ? data[0] % 8 : 0;
	wk_put64(f + 16, id);
	wk_put64(f + 24, XXH3_64bits(f, 24));
	if (body)
		memcpy(f + 32, data + 1, body);
	*n = 32 + body;
	for (size_t at = 32; at + 32 <= *n;) { /* each entry whose sizes fit: its checksum */
		uint64_t nt = wk_get32(f + at), m = wk_get64(f + at + 16);
		if (nt > *n || m > *n || at + 32 + 4 * nt + m > *n)
			break;
		XXH3_state_t *h = XXH3_createState();
		XXH3_64bits_reset(h);
		XXH3_64bits_update(h, f + at, 24);
		XXH3_64bits_update(h, f + at + 32, 4 * nt + m);
		wk_put64(f + at + 24, XXH3_64bits_digest(h));
		XXH3_freeState(h);
		at += 32 + 4 * nt + m;
	}
	return f;
}

static _Noreturn void die(const char *what, const char *err)
{
	fprintf(stderr, "fuzz prefix_store: %s: %s\n", what, err);
	abort();
}

static void on_done(void *ctx, struct sched_req *r)
{
	*(struct sched_req **)ctx = r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!eng)
		load();
	size_t n;
	uint8_t *f = file_of(data, size, &n);
	char path[128], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/pc/prefix-%016llx.wpc", dir, (unsigned long long)id);
	snprintf(err, sizeof err, "%s/pc", dir);
	if (mkdir(err, 0700) != 0 && errno != EEXIST)
		abort();
	FILE *out = fopen(path, "wb");
	if (!out || fwrite(f, 1, n, out) != n || fclose(out) != 0)
		abort();
	free(f);
	struct sched *s = sched_create(eng, NULL);
	if (!s || sched_set_prefix_cache(s, true) != WK_OK)
		abort();
	struct prefix_store_stats st;
	snprintf(path, sizeof path, "%s/pc", dir);
	int rc = prefix_store_load(s, eng, path, id, &st, err, sizeof err);
	if (rc != WK_OK && !strstr(err, path))
		abort(); /* a refusal names the file */
	if (getenv("WICK_FUZZ_VERBOSE")) /* (what the corpus reaches) */
		fprintf(stderr, "prefix_store: rc %d, %d entries read, %d passed over%s%s\n", rc,
			st.entries, st.skipped, rc ? ": " : "", rc ? err : "");
	/* what was read serves: a request that may begin with an entry */
	struct sched_req *r = calloc(1, sizeof *r), *got = NULL;
	static const int prompt[] = {1, 403, 407, 261, 378, 1};
	r->prompt = malloc(sizeof prompt);
	memcpy(r->prompt, prompt, sizeof prompt);
	r->n_prompt = 5 + (size ? data[size - 1] % 2 : 0);
	r->max_tokens = 2;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	if (sched_submit(s, r, err, sizeof err) != WK_OK)
		abort();
	for (int k = 0; sched_pending(s) > 0; k++)
		if (sched_step(s, on_done, &got) < 0 || k > 20)
			abort();
	if (got != r || r->status != SCHED_DONE)
		abort();
	sched_req_free(r);
	/* and written again over the input's file, which the write merges: its own entries,
	 * then the input's it does not hold; the result must read back whole */
	if (prefix_store_save(s, eng, path, id, NULL, &st, err, sizeof err) != WK_OK)
		die("the write", err);
	sched_free(s);
	s = sched_create(eng, NULL);
	if (!s || sched_set_prefix_cache(s, true) != WK_OK ||
	    prefix_store_load(s, eng, path, id, &st, err, sizeof err) != WK_OK)
		die("the written file read back", err);
	sched_free(s);
	int seq[4];
	for (int i = 0; i < 4; i++)
		if (eng_seq_alloc(eng, &seq[i]) != WK_OK)
			abort(); /* a sequence leaked */
	for (int i = 0; i < 4; i++)
		eng_seq_free(eng, seq[i]);
	return 0;
}
