/*
 * The sharded engine (engine/shard.c) and the sharded snapshot layouts (engine/layout.c):
 *   - logits: a snapshot cut for tp/ep runs on threads with the in-process collectives and
 *     gives the logits of the unsharded model within 1e-5 of max |logit| (fp32 compute; the
 *     reductions add the shards' partial sums in another order, so not bit for bit), for
 *     prefill, token-by-token decode through every rank's caches, and llama's batched step;
 *   - accounting: for every tensor of the unsharded snapshot, the rank files hold exactly its
 *     slices (bytes compared), the layout tags agree with this file's own statement of the
 *     rules, and the rank files' tensor bytes add up to the unsharded snapshot plus the extra
 *     copies of the replicated tensors, which are listed on stderr;
 *   - each rank binds only its own rank file, and all of it;
 *   - FP8 weights cut on the 128 grid stay FP8 with their scales sliced alongside;
 *   - refusals name the dimension that does not split.
 * The full tp x ep matrix through the CLI is tests/e2e/shard_logits.sh.
 *
 * Models: stories260K (converted here) and tiny GLM checkpoints from the gen_glm tool
 * ($WICK_TOOLS, which tests/run sets; built by `make test`).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/comm.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/sampler.h"
#include "tests/unit/devsim.h"
#include <jansson.h>

static char root[256];

static void setup(void)
{
	snprintf(root, sizeof root, "/tmp/wick-shard-XXXXXX");
	cr_assert_not_null(mkdtemp(root));
}

static void teardown(void)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(shard, .init = setup, .fini = teardown, .timeout = 120);

static char *path(const char *name)
{
	char *p = malloc(512);
	snprintf(p, 512, "%s/%s", root, name);
	return p;
}

static char *stories(void)
{
	char bin[512], tok[512], err[WK_ERRSZ];
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char *dir = path("stories");
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "convert: %s", err);
	return dir;
}

/* gen_glm --family fam -o root/name [args]; returns the directory. */
static char *gen_glm(const char *name, const char *fam, const char *args)
{
	const char *tools = getenv("WICK_TOOLS");
	char def[512], cmd[2048];
	if (!tools) {
		snprintf(def, sizeof def, "%s/tools", getenv("WICK_BUILD") ? getenv("WICK_BUILD")
									   : "build");
		tools = def;
	}
	char *dir = path(name);
	snprintf(cmd, sizeof cmd, "'%s/gen_glm' --family %s -o '%s' %s >/dev/null", tools, fam,
		 dir, args);
	cr_assert_eq(system(cmd), 0, "%s failed (is $WICK_TOOLS/gen_glm built?)", cmd);
	return dir;
}

static char *snapshot(const char *hf, const char *name, int tp, int ep, const char *dtype)
{
	char err[WK_ERRSZ];
	char *out = path(name);
	struct eng_snap_opts o = {.tp = tp, .ep = ep, .dtype = dtype};
	cr_assert_eq(eng_snapshot(hf, out, &o, err, sizeof err), WK_OK, "%s tp %d ep %d: %s", hf,
		     tp, ep, err);
	return out;
}

/* f32 KV caches: a sharded model's sums differ from the unsharded one's in order only (~1e-7),
 * and TOL holds them to that; a bf16 cache rounds those differences into ~4e-3 ones in the odd
 * element (test_glm_paths's kv_bf16 tests cover the bf16 caches). */
static struct engine *open_model(const char *dir, int max_seqs)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = max_seqs,
			     .kv_dtype = "f32"};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s: %s", dir, err);
	return e;
}

/* Logits [n][vocab] of every position of tokens, from one prefill. */
static float *prefill(const char *dir, const int *tokens, int n, int *vocab)
{
	struct engine *e = open_model(dir, 1);
	char err[WK_ERRSZ];
	*vocab = eng_info(e)->vocab;
	float *lg = malloc(sizeof(float) * (size_t)n * (size_t)*vocab);
	cr_assert_eq(eng_forward(e, tokens, n, 0, lg, true, err, sizeof err), WK_OK, "%s", err);
	eng_close(e);
	return lg;
}

/* max |a - b| / max |b| */
static double rel(const float *a, const float *b, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(isfinite(a[i]) && isfinite(b[i]));
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return d / m;
}

#define TOL 1e-5

static const int toks[] = {1, 403, 407, 261, 378, 30, 411, 286};
#define NT 8
static const int gtoks[] = {1, 5, 9, 200, 7, 3, 11};
#define NG 7

/* ---- logits ---------------------------------------------------------------------------------- */

Test(shard, stories_logits_and_greedy_text_match_unsharded)
{
	char *hf = stories();
	int V;
	float *want = prefill(hf, toks, NT, &V);
	for (int tp = 2; tp <= 4; tp *= 2) {
		char name[32];
		snprintf(name, sizeof name, "s-tp%d", tp);
		char *sn = snapshot(hf, name, tp, 1, "keep");
		int v2;
		float *got = prefill(sn, toks, NT, &v2);
		cr_assert_eq(v2, V);
		double r = rel(got, want, (size_t)NT * V);
		cr_expect_leq(r, TOL, "stories tp %d: %g", tp, r);
		fprintf(stderr, "shard: stories260K tp %d: max|dlogit|/max|logit| = %.2g\n", tp, r);
		/* greedy decode: the same tokens as the unsharded engine ("Once upon a time, ...") */
		struct engine *e = open_model(sn, 1);
		float lg[512];
		char err[WK_ERRSZ];
		int t = 1, wantt[] = {403, 407, 261, 378, 432, 383, 286, 261};
		for (int i = 0; i < 8; i++) {
			cr_assert_eq(eng_forward(e, &t, 1, i, lg, false, err, sizeof err), WK_OK, "%s", err);
			t = samp_argmax(lg, 512);
			cr_expect_eq(t, wantt[i], "tp %d step %d: %d", tp, i, t);
		}
		eng_close(e);
		free(got);
		free(sn);
	}
	free(want);
	free(hf);
}

/* Continuous batching on a sharded llama: the same items stepped together on tp 2 give the
 * unsharded engine's logits. */
Test(shard, stories_batched_step_matches_unsharded)
{
	char *hf = stories(), *sn = snapshot(hf, "s-tp2", 2, 1, "keep");
	int p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 30}, p2[] = {1, 411, 300, 261}, t = 42;
	float got[2][3][512];
	for (int which = 0; which < 2; which++) {
		struct engine *e = open_model(which ? sn : hf, 3);
		char err[WK_ERRSZ];
		int seq[3];
		for (int s = 0; s < 3; s++)
			cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
		float tmp[3][512];
		struct eng_item a[2] = {{seq[0], p0, 5, tmp[0], NULL, {}, 0, 0, NULL, NULL, false},
					{seq[1], p1, 2, tmp[1], NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e, a, 2, err, sizeof err), WK_OK, "%s", err);
		struct eng_item b[3] = {{seq[2], p2, 4, tmp[2], NULL, {}, 0, 0, NULL, NULL, false},
					{seq[0], &t, 1, got[which][0], NULL, {}, 0, 0, NULL, NULL, false},
					{seq[1], &t, 1, got[which][1], NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e, b, 3, err, sizeof err), WK_OK, "%s", err);
		struct eng_item c = {seq[2], &t, 1, got[which][2], NULL, {}, 0, 0, NULL, NULL, false};
		cr_assert_eq(eng_step(e, &c, 1, err, sizeof err), WK_OK, "%s", err);
		cr_expect_eq(eng_seq_len(e, seq[2]), 5);
		eng_close(e);
	}
	double r = rel(&got[1][0][0], &got[0][0][0], 3 * 512);
	cr_expect_leq(r, TOL, "batched tp 2 vs unsharded: %g", r);
	free(sn);
	free(hf);
}

/* Continuous batching on sharded GLM: three sequences stepped together (prefills mixed with
 * decodes) on every rank's per-sequence caches give the unsharded engine's logits. */
static void glm_batched_matches(const char *hf, const char *label, int tp, int ep)
{
	char name[64];
	snprintf(name, sizeof name, "%s-b-tp%d-ep%d", label, tp, ep);
	char *sn = snapshot(hf, name, tp, ep, "keep");
	const int *p[3] = {gtoks, gtoks + 1, gtoks + 2};
	int len[3] = {6, 2, 4}, t = 4;
	float *got[2] = {NULL, NULL};
	int V = 0;
	for (int which = 0; which < 2; which++) {
		struct engine *e = open_model(which ? sn : hf, 3);
		char err[WK_ERRSZ];
		V = eng_info(e)->vocab;
		got[which] = malloc(sizeof(float) * 5 * V);
		float *tmp = malloc(sizeof(float) * 3 * V), *g = got[which];
		int seq[3];
		for (int s = 0; s < 3; s++)
			cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
		struct eng_item a[2] = {{seq[0], p[0], len[0], g, NULL, {}, 0, 0, NULL, NULL, false},
					{seq[1], p[1], len[1], g + V, NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e, a, 2, err, sizeof err), WK_OK, "%s", err);
		struct eng_item b[3] = {{seq[2], p[2], len[2], g + 2 * V, NULL, {}, 0, 0, NULL, NULL, false},
					{seq[0], &t, 1, g + 3 * V, NULL, {}, 0, 0, NULL, NULL, false},
					{seq[1], &t, 1, tmp, NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e, b, 3, err, sizeof err), WK_OK, "%s", err);
		struct eng_item c[2] = {{seq[2], &t, 1, g + 4 * V, NULL, {}, 0, 0, NULL, NULL, false},
					{seq[1], &t, 1, tmp + V, NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e, c, 2, err, sizeof err), WK_OK, "%s", err);
		free(tmp);
		eng_close(e);
	}
	double r = rel(got[1], got[0], (size_t)5 * V);
	cr_expect_leq(r, TOL, "%s batched vs unsharded: %g", name, r);
	fprintf(stderr, "shard: %s batched: %.2g\n", name, r);
	free(got[0]);
	free(got[1]);
	free(sn);
}

Test(shard, glm_batched_steps_match_unsharded)
{
	char *hf = gen_glm("g5b", "glm5", "--seed 7");
	glm_batched_matches(hf, "glm5", 2, 2);
	free(hf);
	hf = gen_glm("g4b", "glm4", "--seed 8 --heads 8 --kv-heads 2");
	glm_batched_matches(hf, "glm4", 2, 1);
	free(hf);
}

/* GLM: prefill, then the same tokens decoded one at a time through every rank's caches (MLA
 * absorbed decode, DSA indexer keys, GQA kv caches), against the unsharded prefill. */
static void glm_decode_matches(const char *hf, const char *label, int tp, int ep)
{
	int V;
	float *want = prefill(hf, gtoks, NG, &V);
	char name[64];
	snprintf(name, sizeof name, "%s-tp%d-ep%d", label, tp, ep);
	char *sn = snapshot(hf, name, tp, ep, "keep");
	int v2;
	float *got = prefill(sn, gtoks, NG, &v2);
	double r = rel(got, want, (size_t)NG * V);
	cr_expect_leq(r, TOL, "%s prefill: %g", name, r);
	struct engine *e = open_model(sn, 1);
	char err[WK_ERRSZ];
	double rd = 0;
	for (int i = 0; i < NG; i++) {
		cr_assert_eq(eng_forward(e, gtoks + i, 1, i, got + (size_t)i * V, false, err,
					 sizeof err), WK_OK, "%s", err);
	}
	rd = rel(got, want, (size_t)NG * V);
	cr_expect_leq(rd, TOL, "%s decode: %g", name, rd);
	fprintf(stderr, "shard: %s: prefill %.2g, decode %.2g\n", name, r, rd);
	eng_close(e);
	free(got);
	free(want);
	free(sn);
}

Test(shard, glm5_prefill_and_decode_match_unsharded)
{
	char *hf = gen_glm("g5", "glm5", "--seed 7");
	glm_decode_matches(hf, "glm5", 2, 4);
	glm_decode_matches(hf, "glm5", 4, 8);
	free(hf);
}

Test(shard, glm4_prefill_and_decode_match_unsharded)
{
	/* 8 query heads over 2 kv heads: tp 2 splits the kv heads, tp 4 gives each shard a copy
	 * of the one its query heads share. */
	char *hf = gen_glm("g4", "glm4", "--seed 8 --heads 8 --kv-heads 2");
	glm_decode_matches(hf, "glm4", 2, 2);
	glm_decode_matches(hf, "glm4", 4, 1);
	free(hf);
}

/* ---- sharded on device memory ------------------------------------------------------------------
 * Every rank on devsim (tests/unit/devsim.h: the CPU's kernels on memory the host cannot
 * touch, every op handed only device memory) with comm_devsim (comm_cpu's collectives, which
 * refuse buffers that are not device memory, as NCCL does): a sharded snapshot, each rank file
 * streamed into its own rank's device memory through staging buffers the ranks share (no
 * weight uploaded), runs a prefill
 * with every position's logits, a batched step of two sequences, one-sequence decodes and
 * greedy tokens picked on each rank's device, and gives the CPU's sharded logits bit for bit
 * (the same kernels and the same reduction order). This is the plumbing the CUDA backend with
 * NCCL relies on: the embedding moved to the device before its all_reduce, the lm_head's
 * vocabulary slices gathered and laid out in device memory, each rank's thread on its own
 * device. */

static float *device_run(const char *dir, const struct backend *be, bool one_by_one,
			 int *vocab, int *ids)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 3,
			     .backend_ops = be, .comm_ops = be ? &comm_devsim : NULL,
			     .experts_one_by_one = one_by_one};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s: %s", dir, err);
	if (be) { /* each rank file streamed into its own rank's device memory */
		cr_assert_str_eq(eng_info(e)->backend, "devsim");
		cr_assert(eng_info(e)->startup.to_device, "%s: not restored into device memory", dir);
		for (int r = 0; r < e->world; r++) {
			struct devsim_counts c;
			devsim_counts(shard_rank(e, r)->bctx, &c);
			cr_assert_eq(c.uploads, 0, "%s: rank %d uploaded %d weights", dir, r, c.uploads);
			cr_assert_gt(c.stage_puts, 0, "%s: rank %d received no restored bytes", dir, r);
		}
	}
	int V = *vocab = eng_info(e)->vocab;
	float *lg = malloc(sizeof(float) * (size_t)V * (NG + 8));
	cr_assert_eq(eng_forward(e, gtoks, NG, 0, lg, true, err, sizeof err), WK_OK, "%s", err);
	float *g = lg + (size_t)NG * V;
	int a, b;
	cr_assert_eq(eng_seq_alloc(e, &a), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &b), WK_OK);
	int t = 4;
	struct eng_item two[2] = {{a, gtoks, 3, g, NULL, {}, 0, 0, NULL, NULL, false},
				  {b, gtoks + 2, 4, g + V, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, two, 2, err, sizeof err), WK_OK, "%s", err);
	struct eng_item dec[2] = {{a, &t, 1, g + 2 * V, &ids[0], {}, 0, 0, NULL, NULL, false},
				  {b, &t, 1, g + 3 * V, &ids[1], {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, dec, 2, err, sizeof err), WK_OK, "%s", err);
	for (int i = 0; i < 3; i++) {
		struct eng_item one = {a, i ? &ids[1 + i] : &ids[0], 1, g + (4 + i) * (size_t)V,
				       &ids[2 + i], {}, 0, 0, NULL, NULL, false};
		cr_assert_eq(eng_step(e, &one, 1, err, sizeof err), WK_OK, "%s", err);
	}
	struct eng_item quiet = {b, &t, 1, NULL, &ids[5], {}, 0, 0, NULL, NULL, false}; /* only the id crosses */
	cr_assert_eq(eng_step(e, &quiet, 1, err, sizeof err), WK_OK, "%s", err);
	eng_close(e);
	return lg;
}

static void device_matches(const char *hf, const char *label, int tp, int ep,
			   const struct backend *be)
{
	char name[64];
	snprintf(name, sizeof name, "%s-dev-tp%d-ep%d", label, tp, ep);
	char *sn = snapshot(hf, name, tp, ep, "keep");
	int V, V2, ids[6], ids2[6];
	bool obo = be == &be_devsim_ungrouped; /* the CPU then runs its experts one by one too */
	/* both absorb MLA: on its own a device absorbs a sparse prefill that the host may expand
	 * (glm5.c's expand), and the bits differ */
	setenv("WICK_GLM_MLA", "absorb", 1);
	float *want = device_run(sn, NULL, obo, &V, ids);
	float *got = device_run(sn, be, obo, &V2, ids2);
	unsetenv("WICK_GLM_MLA");
	cr_assert_eq(V, V2);
	size_t n = (size_t)V * (NG + 7);
	size_t bad = 0;
	while (bad < n && !memcmp(&got[bad], &want[bad], sizeof *got))
		bad++;
	cr_expect_eq(bad, n, "%s: logit %zu (row %zu) differs on device memory: %g vs %g", name,
		     bad, bad / V, bad < n ? got[bad] : 0, bad < n ? want[bad] : 0);
	cr_expect_arr_eq(ids2, ids, sizeof ids, "%s: greedy ids differ on device memory", name);
	for (int i = 0; i < 6; i++)
		cr_expect(ids[i] >= 0 && ids[i] < V, "%s: id %d = %d", name, i, ids[i]);
	if (bad == n)
		fprintf(stderr, "shard: %s on devsim: %zu logits bit for bit\n", name, n);
	free(got);
	free(want);
	free(sn);
}

/* Counting launches (wick bench launches) on a sharded snapshot restored into device memory:
 * rank 0 takes over the top engine's counted context, the other ranks count the contexts
 * the restore started for them; every rank counts the same kernels for a decode step. */
Test(shard, launches_counted_on_every_device_rank)
{
	char *hf = gen_glm("g5c", "glm5", "--seed 7");
	char *sn = snapshot(hf, "g5c-tp2-ep2", 2, 2, "keep");
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 1,
			     .backend_ops = &be_devsim, .comm_ops = &comm_devsim,
			     .count_launches = true};
	cr_assert_eq(eng_open(sn, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_assert(eng_info(e)->startup.to_device);
	int V = eng_info(e)->vocab, t = 5;
	float *lg = malloc(sizeof(float) * (size_t)V * NG);
	cr_assert_eq(eng_forward(e, gtoks, NG, 0, lg, false, err, sizeof err), WK_OK, "%s", err);
	struct eng_launches before[2], after[2];
	for (int r = 0; r < 2; r++)
		cr_assert_eq(eng_launches(e, r, &before[r]), WK_OK, "rank %d", r);
	cr_assert_eq(eng_forward(e, &t, 1, NG, lg, false, err, sizeof err), WK_OK, "%s", err);
	long k[2] = {0, 0};
	for (int r = 0; r < 2; r++) {
		cr_assert_eq(eng_launches(e, r, &after[r]), WK_OK, "rank %d", r);
		for (int i = 0; i < ENG_LAUNCH_KINDS; i++) {
			bool copy;
			int per;
			eng_launch_kind(i, &copy, &per);
			if (!copy)
				k[r] += (after[r].n[i] - before[r].n[i]) * per;
		}
		cr_expect_gt(after[r].collectives - before[r].collectives, 0, "rank %d", r);
	}
	cr_expect_gt(k[0], 0);
	cr_expect_eq(k[0], k[1], "rank 0 launched %ld kernels, rank 1 %ld", k[0], k[1]);
	fprintf(stderr, "shard: a devsim tp2 x ep2 decode step: %ld kernels on each rank\n", k[0]);
	eng_close(e);
	free(lg);
	free(sn);
	free(hf);
}

Test(shard, sharded_on_device_memory_matches_cpu)
{
	char *st = stories();
	device_matches(st, "stories", 2, 1, &be_devsim);
	free(st);
	char *hf = gen_glm("g5d", "glm5", "--seed 7");
	device_matches(hf, "glm5", 2, 2, &be_devsim);
	device_matches(hf, "glm5-ungrouped", 2, 4, &be_devsim_ungrouped);
	free(hf);
	hf = gen_glm("g4d", "glm4", "--seed 8 --heads 8 --kv-heads 2");
	device_matches(hf, "glm4", 2, 1, &be_devsim);
	free(hf);
}

/* ---- the communicator, made while the snapshot streams --------------------------------------
 * A sharded restore into device memory starts the further ranks' contexts at once and makes
 * the ranks' communicator on a thread of its own from the moment the snapshot is accepted
 * (NCCL's init takes seconds on 8 GPUs), not after the weights are in. comm_slow is
 * comm_devsim (comm_cpu on host memory) with an init that takes 150 ms, notes when and on
 * which thread it began, and can be made to fail; inits and destroys are counted. */

static struct {
	const struct comm_ops *base;
	pthread_t thread;
	double t_init;
	int inits, destroys;
	bool fail;
} slow;

static int slow_init(void **ctx, int world, char *err, size_t errsz)
{
	slow.thread = pthread_self();
	slow.t_init = wk_now();
	slow.inits++;
	usleep(150 * 1000);
	if (slow.fail)
		return wk_errf(err, errsz, WK_EIO, "comm slow: injected failure over %d ranks",
			       world);
	return slow.base->init(ctx, world, err, errsz);
}

static void slow_destroy(void *ctx)
{
	slow.destroys++;
	slow.base->destroy(ctx);
}

static struct comm_ops comm_slow;

/* devsim whose copies take 30 ms more to finish: a restore that lasts long enough for the
 * communicator's thread to have begun before it ends, however busy the machine */
static int slowcopy_wait(void *ctx, const void *buf, char *err, size_t errsz)
{
	usleep(30 * 1000);
	return be_devsim.stage_wait(ctx, buf, err, errsz);
}

static struct backend be_slowcopy;

static int open_slow(const char *dir, const struct backend *be, struct engine **e, char *err)
{
	be_slowcopy = be_devsim;
	be_slowcopy.stage_wait = slowcopy_wait;
	if (be == &be_devsim)
		be = &be_slowcopy;
	bool fail = slow.fail;
	memset(&slow, 0, sizeof slow);
	slow.fail = fail;
	slow.base = be ? &comm_devsim : &comm_cpu;
	comm_slow = *slow.base;
	comm_slow.name = "slow";
	comm_slow.init = slow_init;
	comm_slow.destroy = slow_destroy;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 1,
			     .backend_ops = be, .comm_ops = &comm_slow};
	return eng_open(dir, &o, e, err, WK_ERRSZ);
}

Test(shard, communicator_made_while_the_snapshot_streams)
{
	char *hf = gen_glm("g5m", "glm5", "--seed 7");
	char *sn = snapshot(hf, "g5m-tp2-ep2", 2, 2, "keep");
	struct engine *e;
	char err[WK_ERRSZ];
	cr_assert_eq(open_slow(sn, &be_devsim, &e, err), WK_OK, "%s", err);
	const struct eng_startup *su = &eng_info(e)->startup;
	cr_assert(su->to_device);
	double t0 = su->ready_mono - su->total_s, weights_in = t0 + su->weights_s;
	cr_expect_eq(slow.inits, 1);
	cr_expect(!pthread_equal(slow.thread, pthread_self()),
		  "the communicator was made on the opening thread, not beside the restore");
	cr_expect_lt(slow.t_init, weights_in, "the communicator's init began %.3f s after the "
		     "weights were in", slow.t_init - weights_in);
	cr_expect_geq(su->comm_s, 0.149, "comm_s %.3f", su->comm_s);
	cr_expect_leq(su->comm_wait_s, su->comm_s);
	cr_expect_gt(su->ranks_s, 0);
	int V = eng_info(e)->vocab; /* the collectives go through the communicator it made */
	float *lg = malloc(sizeof(float) * (size_t)V * NG);
	cr_assert_eq(eng_forward(e, gtoks, NG, 0, lg, false, err, sizeof err), WK_OK, "%s", err);
	eng_close(e);
	cr_expect_eq(slow.destroys, 1);

	/* restored into host memory: the ranks start after it, and so does the communicator */
	cr_assert_eq(open_slow(sn, NULL, &e, err), WK_OK, "%s", err);
	su = &eng_info(e)->startup;
	cr_expect(!su->to_device);
	cr_expect_eq(slow.inits, 1);
	cr_expect(pthread_equal(slow.thread, pthread_self()));
	cr_expect_geq(slow.t_init, su->ready_mono - su->total_s + su->weights_s);
	cr_expect_eq(su->comm_wait_s, su->comm_s);
	cr_expect_eq(su->ranks_s, 0);
	cr_assert_eq(eng_forward(e, gtoks, NG, 0, lg, false, err, sizeof err), WK_OK, "%s", err);
	eng_close(e);
	cr_expect_eq(slow.destroys, 1);

	/* its init fails: the open fails naming it, and nothing is left running */
	slow.fail = true;
	cr_expect_neq(open_slow(sn, &be_devsim, &e, err), WK_OK);
	cr_expect(strstr(err, "comm slow: injected failure over 2 ranks"), "%s", err);
	cr_expect_eq(slow.inits, 1);
	cr_expect_eq(slow.destroys, 0);
	slow.fail = false;

	/* the restore fails (a rank file changed): the communicator it started is destroyed */
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "printf 'X' | dd of='%s/rank-001.bin' bs=1 seek=4096 "
		 "conv=notrunc status=none", sn);
	cr_assert_eq(system(cmd), 0);
	cr_expect_neq(open_slow(sn, &be_devsim, &e, err), WK_OK);
	cr_expect(strstr(err, "rank-001.bin"), "%s", err);
	cr_expect_eq(slow.inits, 1, "the restore failed before the accept: %s", err);
	cr_expect_eq(slow.destroys, 1);
	free(lg);
	free(sn);
	free(hf);
}

/* The further ranks' contexts start at once: each init of be_slowdev (devsim's, 100 ms
 * longer) counts the inits running beside it. */
static int dev_running, dev_most;
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;

static int slowdev_init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	pthread_mutex_lock(&dev_mu);
	if (++dev_running > dev_most)
		dev_most = dev_running;
	pthread_mutex_unlock(&dev_mu);
	usleep(100 * 1000);
	pthread_mutex_lock(&dev_mu);
	dev_running--;
	pthread_mutex_unlock(&dev_mu);
	return be_devsim.init(ctx, cfg, err, errsz);
}

Test(shard, further_ranks_start_at_once)
{
	char *st = stories();
	char *sn = snapshot(st, "stories-tp4", 4, 1, "keep");
	struct backend be_slowdev = be_devsim;
	be_slowdev.init = slowdev_init;
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 1,
			     .backend_ops = &be_slowdev, .comm_ops = &comm_devsim};
	cr_assert_eq(eng_open(sn, &o, &e, err, sizeof err), WK_OK, "%s", err);
	const struct eng_startup *su = &eng_info(e)->startup;
	cr_assert(su->to_device);
	for (int r = 0; r < 4; r++) {
		struct devsim_counts c;
		devsim_counts(shard_rank(e, r)->bctx, &c);
		cr_expect_gt(c.stage_puts, 0, "rank %d received no restored bytes", r);
	}
	cr_expect_geq(dev_most, 2, "the 3 further ranks' contexts started one after another");
	cr_expect_geq(su->ranks_s, 0.099, "ranks_s %.3f", su->ranks_s);
	fprintf(stderr, "shard: 3 further ranks of 100 ms each started in %.3f s, %d at once\n",
		su->ranks_s, dev_most);
	eng_close(e);
	free(sn);
	free(st);
}

/* ---- what each rank holds ------------------------------------------------------------------- */

enum rule { R_REP, R_ROWS, R_COLS, R_EXPERT };

/* This file's own statement of the layout rules (layout.c, llama.c, glm.c, glm4.c, glm5.c),
 * by tensor name. */
static enum rule expected_rule(const char *n)
{
	static const char *const rows[] = {
		"embed_tokens.weight", "lm_head.weight", "q_proj.weight", "q_proj.bias",
		"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias", "q_b_proj.weight",
		"kv_b_proj.weight", "gate_proj.weight", "up_proj.weight"};
	static const char *const cols[] = {"o_proj.weight", "down_proj.weight"};
	if (strstr(n, ".mlp.experts."))
		return R_EXPERT;
	size_t l = strlen(n);
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
		if (l >= strlen(rows[i]) && !strcmp(n + l - strlen(rows[i]), rows[i]) &&
		    !strstr(n, "indexer."))
			return R_ROWS;
	for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
		if (l >= strlen(cols[i]) && !strcmp(n + l - strlen(cols[i]), cols[i]))
			return R_COLS;
	return R_REP; /* norms, router, MLA latent projections, indexer */
}

static const struct st_tensor *find(struct snap *s, int rank, const char *name, const char **tag)
{
	const struct st_tensor *t = snap_tensor(s, rank, name);
	if (t && tag)
		*tag = snap_tensor_layout(s, rank, (size_t)(t - snap_tensor_at(s, rank, 0)));
	return t;
}

struct account {
	uint64_t whole, ranks, rep, tp, ex; /* tensor bytes */
	uint64_t kv;                        /* GQA kv heads held by several TP shards: extra bytes */
	int n_rep;
};

/* Checks the rank files of sharded snapshot sd against the unsharded u, tensor by tensor,
 * and sums the bytes. */
static void check_layout(struct snap *u, struct snap *sd, int tp, int ep, struct account *a,
			 const char *label)
{
	int W = snap_world(sd);
	cr_assert_eq(W, tp > ep ? tp : ep);
	*a = (struct account){0};
	fprintf(stderr, "shard: %s, tp %d ep %d: replicated on all %d ranks:\n", label, tp, ep, W);
	static char pats[64][256];
	int n_pats = 0;
	for (size_t i = 0; i < snap_tensor_count(u, 0); i++) {
		const struct st_tensor *t = snap_tensor_at(u, 0, i);
		const char *name = t->name, *tag = NULL;
		if (strstr(name, "_scale_inv"))
			continue; /* checked with its weight below when FP8 */
		enum rule want = expected_rule(name);
		a->whole += t->nbytes;
		size_t esz = dt_size(t->dtype);
		int64_t R = t->shape[0], C = t->rank == 2 ? t->shape[1] : 1;
		int copies = 0;
		uint64_t lead_bytes = 0; /* of the TP shards on ranks 0..tp-1 */
		for (int r = 0; r < W; r++) {
			const struct st_tensor *s = find(sd, r, name, &tag);
			if (!s) {
				cr_assert_eq(want, R_EXPERT, "%s: '%s' missing on rank %d", label, name, r);
				continue;
			}
			copies++;
			cr_assert_not_null(tag, "%s: '%s' has no layout tag", label, name);
			cr_assert_eq(s->dtype, t->dtype, "%s: '%s' changed dtype (%s)", label, name, tag);
			long long lo = 0, hi = 0, n = 0;
			if (want == R_REP) {
				cr_assert_str_eq(tag, "replicated", "%s: '%s'", label, name);
				cr_assert_eq(s->nbytes, t->nbytes);
				cr_assert(!memcmp(s->data, t->data, t->nbytes), "%s: '%s' rank %d", label,
					  name, r);
			} else if (want == R_EXPERT) {
				json_t *cfg = snap_config(u);
				int E = (int)json_integer_value(json_object_get(cfg, "n_routed_experts"));
				int x = atoi(strstr(name, ".mlp.experts.") + 13), owner = x / (E / ep);
				char wtag[64];
				snprintf(wtag, sizeof wtag, "expert (ep rank %d)", owner);
				cr_assert_str_eq(tag, wtag, "%s: '%s' on rank %d", label, name, r);
				cr_assert_eq(r % ep, owner, "%s: expert %d on rank %d", label, x, r);
				cr_assert(!memcmp(s->data, t->data, t->nbytes));
			} else {
				char ax[8];
				cr_assert_eq(sscanf(tag, "tp %7s %lld:%lld of %lld", ax, &lo, &hi, &n), 4,
					     "%s: '%s': tag '%s'", label, name, tag);
				cr_assert_str_eq(ax, want == R_ROWS ? "rows" : "cols", "%s: '%s'", label,
						 name);
				cr_assert_eq(n, want == R_ROWS ? R : C);
				if (r < tp)
					lead_bytes += s->nbytes;
				/* rank r holds exactly rows/cols lo:hi of the whole */
				int64_t sr = want == R_ROWS ? hi - lo : R, sc = want == R_ROWS ? C : hi - lo;
				cr_assert_eq(s->numel, sr * sc, "%s: '%s'", label, name);
				for (int64_t y = 0; y < sr; y++) {
					const char *from = (const char *)t->data +
							   ((want == R_ROWS ? lo + y : y) * C +
							    (want == R_ROWS ? 0 : lo)) * (int64_t)esz;
					cr_assert(!memcmp((const char *)s->data + y * sc * (int64_t)esz, from,
							  (size_t)sc * esz),
						  "%s: '%s' rank %d row %lld", label, name, r, (long long)y);
				}
			}
		}
		if (want == R_REP) {
			cr_assert_eq(copies, W);
			a->rep += t->nbytes;
			a->n_rep++;
			/* list each replicated tensor once, layer numbers folded */
			char pat[256];
			int l, at = 0;
			if (sscanf(name, "model.layers.%d.%n", &l, &at) == 1 && at > 0)
				snprintf(pat, sizeof pat, "model.layers.*.%s", name + at);
			else
				snprintf(pat, sizeof pat, "%s", name);
			bool seen = false;
			for (int k = 0; k < n_pats && !seen; k++)
				seen = !strcmp(pats[k], pat);
			if (!seen && n_pats < 64) {
				snprintf(pats[n_pats++], sizeof pats[0], "%s", pat);
				fprintf(stderr, "    %s\n", pat);
			}
		} else if (want == R_EXPERT) {
			cr_assert_eq(copies, W / ep);
			a->ex += t->nbytes;
		} else {
			a->tp += t->nbytes;
			/* the lead shards cover the tensor once, except kv heads shared by shards */
			cr_assert_geq(lead_bytes, t->nbytes, "%s: '%s' is not covered", label, name);
			if (lead_bytes > t->nbytes)
				cr_assert(strstr(name, "k_proj") || strstr(name, "v_proj"),
					  "%s: '%s' overlaps", label, name);
			a->kv += lead_bytes - t->nbytes;
		}
	}
	for (int r = 0; r < W; r++)
		for (size_t i = 0; i < snap_tensor_count(sd, r); i++)
			a->ranks += snap_tensor_at(sd, r, i)->nbytes;
	/* the scales of FP8 weights count with their class */
	uint64_t scales = 0;
	for (size_t i = 0; i < snap_tensor_count(u, 0); i++)
		if (strstr(snap_tensor_at(u, 0, i)->name, "_scale_inv"))
			scales += snap_tensor_at(u, 0, i)->nbytes;
	cr_assert_eq(scales, 0, "check_layout takes models without FP8 scales");
	/* rank files = the whole + extra copies: replicated on every rank, TP shards repeated
	 * world / tp times, experts world / ep times */
	uint64_t want = a->whole + (uint64_t)(W - 1) * a->rep + (uint64_t)(W / tp - 1) * a->tp +
			(uint64_t)(W / ep - 1) * a->ex + (uint64_t)(W / tp) * a->kv;
	fprintf(stderr, "  unsharded %llu B = tp-split %llu + experts %llu + replicated %llu "
		"(%d tensors); %d rank files hold %llu B = unsharded + %d x %llu replicated%s%s\n",
		(unsigned long long)a->whole, (unsigned long long)a->tp, (unsigned long long)a->ex,
		(unsigned long long)a->rep, a->n_rep, W, (unsigned long long)a->ranks, W - 1,
		(unsigned long long)a->rep,
		(W / tp - 1) * a->tp + (W / ep - 1) * a->ex ? " + repeated shards" : "",
		a->kv ? " + kv heads shared by TP shards" : "");
	cr_expect_eq(a->ranks, want, "%s: rank files hold %llu bytes, expected %llu", label,
		     (unsigned long long)a->ranks, (unsigned long long)want);
}

static struct snap *open_snap(const char *dir)
{
	struct snap *s;
	char err[WK_ERRSZ];
	struct snap_open_opts o = {.verify = true};
	cr_assert_eq(snap_open(dir, &o, &s, err, sizeof err), WK_OK, "%s", err);
	return s;
}

static void layout_case(const char *hf, const char *label, int tp, int ep)
{
	char n0[64], n1[64];
	snprintf(n0, sizeof n0, "%s-whole", label);
	snprintf(n1, sizeof n1, "%s-tp%d-ep%d", label, tp, ep);
	char *d0 = path(n0);
	if (access(d0, F_OK) != 0) {
		free(d0);
		d0 = snapshot(hf, n0, 1, 1, "keep");
	}
	char *d1 = snapshot(hf, n1, tp, ep, "keep");
	struct snap *u = open_snap(d0), *s = open_snap(d1);
	struct account a;
	check_layout(u, s, tp, ep, &a, label);
	snap_close(u);
	snap_close(s);
	free(d0);
	free(d1);
}

Test(shard, rank_files_hold_their_slices_and_add_up)
{
	char *st = stories();
	layout_case(st, "stories260K", 4, 1);
	char *g5 = gen_glm("g5b", "glm5", "--seed 7 --dtype bf16");
	layout_case(g5, "glm5-bf16", 4, 4);
	layout_case(g5, "glm5-bf16", 2, 8);
	char *g4 = gen_glm("g4", "glm4", "--seed 8 --heads 8 --kv-heads 2");
	layout_case(g4, "glm4", 2, 2);
	layout_case(g4, "glm4", 4, 2); /* kv heads repeated: each shard holds the one it needs */
	free(st);
	free(g5);
	free(g4);
}

/* Every rank engine binds tensors of its own rank file only, and every tensor of it. */
Test(shard, each_rank_binds_only_its_own_file)
{
	char *g5 = gen_glm("g5", "glm5", "--seed 7");
	char *sn = snapshot(g5, "g5-tp2-ep4", 2, 4, "keep");
	struct engine *e = open_model(sn, 1);
	struct eng_rank_stats st;
	for (int r = 0; r < 4; r++) {
		cr_assert_eq(eng_rank_stats(e, r, &st), WK_OK);
		cr_expect_eq(st.used, st.tensors, "rank %d used %zu of its %zu tensors", r, st.used,
			     st.tensors);
		uintptr_t lo = (uintptr_t)st.image, hi = lo + st.image_size;
		cr_expect(st.lo >= lo && st.hi <= hi && st.hi > st.lo,
			  "rank %d bound bytes outside its image", r);
		/* and outside every other rank's image */
		for (int q = 0; q < 4; q++) {
			struct eng_rank_stats o;
			cr_assert_eq(eng_rank_stats(e, q, &o), WK_OK);
			if (q != r)
				cr_expect(st.hi <= (uintptr_t)o.image ||
					  st.lo >= (uintptr_t)o.image + o.image_size,
					  "rank %d bound bytes of rank %d's image", r, q);
		}
	}
	cr_expect_eq(eng_rank_stats(e, 4, &st), WK_EINVAL);
	eng_close(e);
	free(sn);
	free(g5);
}

/* GLM-5 FP8 with head and MLP sizes that put every TP cut on the 128 grid (as the real
 * GLM-5-FP8 at tp 2..8): the shards stay FP8, scales sliced with them, bytes exact. */
Test(shard, fp8_cut_on_the_grid_stays_fp8)
{
	char *hf = gen_glm("g5a", "glm5", "--seed 3 --qk-nope-dim 64 --qk-rope-dim 64 "
				      "--v-head-dim 64 --index-head-dim 128 --intermediate 256 "
				      "--moe-intermediate 256");
	char *d0 = snapshot(hf, "g5a-whole", 1, 1, "keep"), *d1 = snapshot(hf, "g5a-tp2", 2, 2, "keep");
	struct snap *u = open_snap(d0), *s = open_snap(d1);
	int fp8 = 0;
	for (int r = 0; r < 2; r++)
		for (size_t i = 0; i < snap_tensor_count(s, r); i++) {
			const struct st_tensor *t = snap_tensor_at(s, r, i);
			const char *tag = snap_tensor_layout(s, r, i);
			cr_expect(!strstr(tag, "f32 from fp8"), "'%s': %s", t->name, tag);
			if (strncmp(tag, "tp ", 3))
				continue;
			/* a TP-split FP8 weight or scale: compare with the matching slice */
			const struct st_tensor *w = snap_tensor(u, 0, t->name);
			long long lo, hi, n;
			char ax[8];
			cr_assert_eq(sscanf(tag, "tp %7s %lld:%lld of %lld", ax, &lo, &hi, &n), 4);
			if (strstr(t->name, "_scale_inv")) { /* tag in weight units; scale in blocks */
				lo /= 128;
				hi = (hi + 127) / 128;
			}
			fp8 += t->dtype == DT_F8_E4M3;
			size_t esz = dt_size(t->dtype);
			int64_t C = w->shape[1];
			bool rows = !strcmp(ax, "rows");
			int64_t sr = rows ? hi - lo : w->shape[0], sc = rows ? C : hi - lo;
			cr_assert_eq(t->numel, sr * sc, "'%s' %s", t->name, tag);
			for (int64_t y = 0; y < sr; y++)
				cr_assert(!memcmp((const char *)t->data + y * sc * (int64_t)esz,
						  (const char *)w->data +
							  ((rows ? lo + y : y) * C + (rows ? 0 : lo)) *
								  (int64_t)esz,
						  (size_t)sc * esz),
					  "'%s' rank %d row %lld", t->name, r, (long long)y);
		}
	cr_expect_gt(fp8, 20, "only %d TP-split FP8 tensors", fp8);
	snap_close(u);
	snap_close(s);
	int V;
	float *want = prefill(d0, gtoks, NG, &V), *got = prefill(d1, gtoks, NG, &V);
	double r = rel(got, want, (size_t)NG * V);
	cr_expect_leq(r, TOL, "fp8 on the grid, tp 2: %g", r);
	fprintf(stderr, "shard: glm5 fp8 on the 128 grid, tp 2 ep 2: %.2g\n", r);
	free(want);
	free(got);
	free(d0);
	free(d1);
	free(hf);
}

/* --dtype bf16 cuts the same bf16 values; --dtype fp8 quantizes each shard on its own grid
 * (stories' shards are not on the 128 grid, so only closeness to f32 is expected). */
Test(shard, dtype_casts_per_shard)
{
	char *hf = stories();
	char *b1 = snapshot(hf, "b1", 1, 1, "bf16"), *b2 = snapshot(hf, "b2", 2, 1, "bf16");
	char *f2 = snapshot(hf, "f2", 2, 1, "fp8");
	int V;
	float *want = prefill(b1, toks, NT, &V), *got = prefill(b2, toks, NT, &V);
	double r = rel(got, want, (size_t)NT * V);
	cr_expect_leq(r, TOL, "bf16 tp 2: %g", r);
	float *ref = prefill(hf, toks, NT, &V), *q = prefill(f2, toks, NT, &V);
	double rq = rel(q, ref, (size_t)NT * V);
	cr_expect(rq > 0 && rq < 0.15, "fp8 tp 2 vs f32: %g", rq);
	free(want);
	free(got);
	free(ref);
	free(q);
	free(b1);
	free(b2);
	free(f2);
	free(hf);
}

Test(shard, refusals_name_the_problem)
{
	char *hf = stories(), *out = path("bad"), err[WK_ERRSZ];
	struct eng_snap_opts o = {.tp = 3, .ep = 1};
	cr_expect_eq(eng_snapshot(hf, out, &o, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "num_attention_heads 8") && strstr(err, "tp 3"), "%s", err);
	o = (struct eng_snap_opts){.tp = 2, .ep = 3};
	cr_expect_eq(eng_snapshot(hf, out, &o, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "divide") != NULL, "%s", err);
	o = (struct eng_snap_opts){.tp = 1, .ep = 2};
	cr_expect_eq(eng_snapshot(hf, out, &o, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "no experts") != NULL, "%s", err);
	o = (struct eng_snap_opts){.tp = 128, .ep = 1};
	cr_expect_eq(eng_snapshot(hf, out, &o, err, sizeof err), WK_EINVAL);
	cr_expect(access(out, F_OK) != 0, "a refused snapshot left a directory");
	char *g5 = gen_glm("g5", "glm5", "--seed 7");
	o = (struct eng_snap_opts){.tp = 1, .ep = 32};
	cr_expect_eq(eng_snapshot(g5, out, &o, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "n_routed_experts 16") && strstr(err, "ep 32"), "%s", err);
	/* running with another layout than the snapshot's is refused */
	char *sn = snapshot(hf, "s2", 2, 1, "keep");
	struct engine *e;
	struct eng_opts eo = {.backend = "cpu", .tp = 4};
	cr_expect_eq(eng_open(sn, &eo, &e, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "tp 2") != NULL, "%s", err);
	free(sn);
	free(g5);
	free(out);
	free(hf);
}
