/*
 * test_devmem.c - stories260K through devsim (devsim.h: the CPU kernels on memory the host
 * cannot touch) gives exactly the CPU backend's logits and text, so the Llama family's
 * engine reaches device memory only through the backend. test_glm_paths.c does the same for
 * the GLM families.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/backend.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/sampler.h"
#include "tests/unit/devsim.h"
#include "worker/cmd.h"

static char model_dir[256];

/* stories260K converted into a fresh directory (the unit stage runs before any e2e script
 * has converted it under build/). */
static void convert(void)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512], err[WK_ERRSZ];
	snprintf(model_dir, sizeof model_dir, "/tmp/wick-devmem-XXXXXX");
	cr_assert_not_null(mkdtemp(model_dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, model_dir, err, sizeof err), WK_OK, "convert: %s", err);
}

static void cleanup(void)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", model_dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(devmem, .init = convert, .fini = cleanup);

static struct engine *open_dir(const char *dir, const struct backend *be, int max_seqs)
{
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = max_seqs,
			     .backend_ops = be};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s: %s", dir, err);
	return e;
}

static struct engine *open_with(const struct backend *be, int max_seqs)
{
	return open_dir(model_dir, be, max_seqs);
}

Test(devmem, stories_through_untouchable_memory_matches_cpu)
{
	int toks[] = {1, 403, 407, 261, 378, 30, 411};
	int n = 7, V = 512;
	float *want = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
	char err[WK_ERRSZ];
	struct engine *cpu = open_with(NULL, 1), *dev = open_with(&be_devsim, 3);
	cr_assert_str_eq(eng_info(dev)->backend, "devsim");
	/* a prefill with every position's logits, then decode steps */
	cr_assert_eq(eng_forward(cpu, toks, n, 0, want, true, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(dev, toks, n, 0, got, true, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(memcmp(got, want, sizeof(float) * n * V), 0, "prefill logits differ");
	int t = 1;
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(eng_forward(cpu, &t, 1, i, want, false, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(dev, &t, 1, i, got, false, err, sizeof err), WK_OK, "%s", err);
		cr_expect_eq(memcmp(got, want, sizeof(float) * V), 0, "decode step %d differs", i);
		t = samp_argmax(want, V);
	}
	/* a batched step of two sequences (prefill and decode together) */
	eng_seq_free(dev, 0);
	int s0, s1;
	cr_assert_eq(eng_seq_alloc(dev, &s0), WK_OK);
	cr_assert_eq(eng_seq_alloc(dev, &s1), WK_OK);
	float g0[512], g1[512];
	struct eng_item a[2] = {{s0, toks, 4, g0, NULL, {}, 0, 0, NULL, NULL, false},
				{s1, toks, 2, g1, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(dev, a, 2, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(cpu, toks, 4, 0, want, false, err, sizeof err), WK_OK, "%s", err);
	/* the batch's 6 tokens take another matmul path than 4 alone: the order of the sums
	 * differs, so within 1e-5 of the largest logit rather than bit for bit */
	float dmax = 0, lmax = 0;
	for (int v = 0; v < V; v++) {
		dmax = fmaxf(dmax, fabsf(g0[v] - want[v]));
		lmax = fmaxf(lmax, fabsf(want[v]));
	}
	cr_expect_leq(dmax, 1e-5f * lmax, "batched sequence 0 differs by %g", dmax);
	struct eng_item b[2] = {{s0, &t, 1, g0, NULL, {}, 0, 0, NULL, NULL, false},
				{s1, &t, 1, g1, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(dev, b, 2, err, sizeof err), WK_OK, "%s", err);
	eng_close(cpu);
	eng_close(dev);
	free(want);
	free(got);
}

/* The probe works: touching devsim memory from the host is fatal. (Under ASan, whose own
 * handler turns the SIGSEGV into an abort, the release build's run of this test counts.) */
#ifdef __SANITIZE_ADDRESS__
Test(devmem, the_host_cannot_touch_devsim_memory)
{
	cr_skip_test("ASan handles the SIGSEGV itself; the release build checks this");
}
#else
Test(devmem, the_host_cannot_touch_devsim_memory, .signal = SIGSEGV)
{
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config cfg = {.threads = 1};
	cr_assert_eq(be_devsim.init(&ctx, &cfg, err, sizeof err), WK_OK);
	float *p = be_devsim.mem_alloc(ctx, 64);
	p[0] = 1.0f; /* SIGSEGV */
}

/* Whether a host write to p faults (SIGSEGV, caught here). */
static sigjmp_buf probe_jb;
static void probe_segv(int sig)
{
	(void)sig;
	siglongjmp(probe_jb, 1);
}
static bool host_write_faults(volatile float *p)
{
	struct sigaction sa = {.sa_handler = probe_segv}, old;
	sigemptyset(&sa.sa_mask);
	cr_assert_eq(sigaction(SIGSEGV, &sa, &old), 0);
	volatile bool faulted = true;
	if (sigsetjmp(probe_jb, 1) == 0) {
		p[0] = 1.0f;
		faulted = false;
	}
	sigaction(SIGSEGV, &old, NULL);
	return faulted;
}

/* Ops open every region while they run and close them after, a run of adjacent regions at
 * a time: with one freed between two others, each op on either works (each sees the bytes
 * the last left), and after each, both, and the freed one, fault from the host again. */
Test(devmem, devsim_memory_is_closed_again_after_each_op)
{
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config cfg = {.threads = 2};
	cr_assert_eq(be_devsim.init(&ctx, &cfg, err, sizeof err), WK_OK);
	float *a = be_devsim.mem_alloc(ctx, 64), *b = be_devsim.mem_alloc(ctx, 5000);
	float *c = be_devsim.mem_alloc(ctx, 64), x[16] = {7, 8}, y[16];
	be_devsim.mem_free(ctx, b);
	for (int k = 0; k < 2; k++) {
		float *p = k ? c : a;
		be_devsim.to_device(ctx, p, x, sizeof x);
		be_devsim.to_host(ctx, y, p, sizeof y);
		cr_assert_eq(memcmp(x, y, sizeof x), 0);
		be_devsim.zero(ctx, p, 64);
		be_devsim.to_host(ctx, y, p, sizeof y);
		cr_assert(y[0] == 0.0f && y[1] == 0.0f);
		cr_assert(host_write_faults(a), "a region left open after an op");
		cr_assert(host_write_faults(c), "a region past a freed one left open after an op");
		cr_assert(host_write_faults(b), "a freed region open");
	}
	be_devsim.mem_free(ctx, a);
	be_devsim.mem_free(ctx, c);
	be_devsim.shutdown(ctx);
}
#endif

/* A snapshot streams into devsim's memory through staging buffers (the path of a GPU), and
 * the weights are used where they landed: no upload, the same logits as the CPU backend on
 * the checkpoint, bit for bit. With small chunks, lz4 and raw, in many pieces. */
Test(devmem, snapshot_streams_into_device_memory)
{
	char snap[300], err[WK_ERRSZ];
	snprintf(snap, sizeof snap, "%s/snap", model_dir);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .lz4 = true, .chunk_size = 16 << 10};
	cr_assert_eq(eng_snapshot(model_dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	struct engine *cpu = open_with(NULL, 1), *dev = open_dir(snap, &be_devsim, 1);
	const struct eng_info *in = eng_info(dev);
	cr_assert(in->startup.snapshot && in->startup.to_device);
	struct devsim_counts n;
	devsim_counts(dev->bctx, &n);
	cr_expect_eq(n.uploads, 0, "weights uploaded again after the restore");
	cr_expect_gt(n.stage_puts, 4, "the snapshot came in %d pieces", n.stage_puts);
	int toks[] = {1, 403, 407, 261, 378, 30, 411}, nt = 7, V = 512;
	float *want = malloc(sizeof(float) * nt * V), *got = malloc(sizeof(float) * nt * V);
	cr_assert_eq(eng_forward(cpu, toks, nt, 0, want, true, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(dev, toks, nt, 0, got, true, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(memcmp(got, want, sizeof(float) * nt * V), 0, "prefill logits differ");
	int t = samp_argmax(want + (nt - 1) * V, V);
	for (int i = nt; i < nt + 4; i++) {
		cr_assert_eq(eng_forward(cpu, &t, 1, i, want, false, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(dev, &t, 1, i, got, false, err, sizeof err), WK_OK, "%s", err);
		cr_expect_eq(memcmp(got, want, sizeof(float) * V), 0, "decode step %d differs", i);
		t = samp_argmax(want, V);
	}
	eng_close(cpu);
	eng_close(dev);
	free(want);
	free(got);
}

/* `wick bench restore --backend B`'s device part on devsim: the device's bytes match a host
 * restore, both timings are measured; a sharded snapshot's ranks land each in a device of
 * their own (devsim refuses a copy from another context's memory, so a rank's image read back
 * through the wrong context fails the test), its links timed all at once. */
Test(devmem, bench_restore_into_device_memory)
{
	char snap[300], snap2[300], err[WK_ERRSZ];
	snprintf(snap, sizeof snap, "%s/bsnap", model_dir);
	snprintf(snap2, sizeof snap2, "%s/bsnap2", model_dir);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .chunk_size = 16 << 10};
	cr_assert_eq(eng_snapshot(model_dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	struct bench_device bd = {0};
	cr_assert_eq(bench_restore_device(snap, &be_devsim, 3, 2, &bd, err, sizeof err), WK_OK,
		     "%s", err);
	cr_expect_gt(bd.bytes, 900000, "%llu image bytes", (unsigned long long)bd.bytes);
	cr_expect(bd.restore_s > 0 && bd.link_s > 0, "%g %g", bd.restore_s, bd.link_s);
	cr_expect_eq(bd.devices, 1);
	uint64_t one = bd.bytes;
	struct eng_snap_opts s2 = {.tp = 2, .ep = 1};
	cr_assert_eq(eng_snapshot(model_dir, snap2, &s2, err, sizeof err), WK_OK, "%s", err);
	struct bench_device b2 = {0};
	cr_assert_eq(bench_restore_device(snap2, &be_devsim, 2, 2, &b2, err, sizeof err), WK_OK,
		     "%s", err);
	cr_expect_eq(b2.devices, 2);
	/* tp 2 slices every matrix and repeats the norms: each rank holds about half */
	cr_expect(b2.bytes > one && b2.bytes < one + one / 4, "%llu bytes on 2 ranks, %llu on 1",
		  (unsigned long long)b2.bytes, (unsigned long long)one);
	cr_expect(b2.restore_s > 0 && b2.link_s > 0, "%g %g", b2.restore_s, b2.link_s);
}

/* Greedy steps pick the token where the logits are: items with a token pointer and no logits
 * get the argmax from the backend (devsim: its argmax op on device memory; only the ids come
 * back), the same ids the CPU's logits give samp_argmax; an item may ask for both. */
Test(devmem, greedy_tokens_chosen_on_the_device)
{
	int toks[] = {1, 403, 407, 261, 378, 30, 411}, V = 512;
	char err[WK_ERRSZ];
	struct engine *cpu = open_with(NULL, 2), *dev = open_with(&be_devsim, 2);
	int sc[2], sd[2];
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(eng_seq_alloc(cpu, &sc[k]), WK_OK);
		cr_assert_eq(eng_seq_alloc(dev, &sd[k]), WK_OK);
	}
	float lc[2][512], ld[512];
	int td[2] = {-1, -1};
	const int *in[2] = {toks, toks + 3};
	int len[2] = {5, 4};
	for (int step = 0; step < 6; step++) {
		struct eng_item c[2] = {{sc[0], in[0], len[0], lc[0], NULL, {}, 0, 0, NULL, NULL, false},
					{sc[1], in[1], len[1], lc[1], NULL, {}, 0, 0, NULL, NULL, false}};
		struct eng_item d[2] = {{sd[0], in[0], len[0], NULL, &td[0], {}, 0, 0, NULL, NULL, false},
					{sd[1], in[1], len[1], step % 2 ? ld : NULL, &td[1], {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(cpu, c, 2, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_step(dev, d, 2, err, sizeof err), WK_OK, "%s", err);
		for (int k = 0; k < 2; k++)
			cr_expect_eq(td[k], samp_argmax(lc[k], V), "step %d item %d: %d, want %d", step,
				     k, td[k], samp_argmax(lc[k], V));
		if (step % 2)
			cr_expect_eq(memcmp(ld, lc[1], sizeof ld), 0, "step %d: logits beside the id",
				     step);
		static int next[2];
		for (int k = 0; k < 2; k++) {
			next[k] = td[k];
			in[k] = &next[k];
			len[k] = 1;
		}
	}
	eng_close(cpu);
	eng_close(dev);
}

/* Sampled steps pick the token where the logits are too: items with a token pointer and a
 * temperature get samp_next's token for their settings and draw, from the candidates the
 * backend's sample_cand selects on device memory (only they come back) or, for a row with
 * more candidates than the cap, from its logits row copied back. Over batched steps and
 * settings (top_p alone, top_k and top_p, top_k 1, tiny top_p, temperature alone), the ids
 * equal samp_next's on the CPU backend's logits with the same seeds, with the engine's cap
 * (every row fits: stories260K has 512 ids) and with a cap of 16 (most rows fall back). */
Test(devmem, sampled_tokens_chosen_on_the_device)
{
	static const struct samp_cfg cfgs[] = {
		{0.8f, 0.9f, 0, 11}, {1.2f, 0.95f, 40, 12}, {1.0f, 1, 1, 13},
		{0.7f, 1e-6f, 0, 14}, {1.0f, 1, 0, 15}, {2.0f, 0.5f, 300, 16},
	};
	int toks[] = {1, 403, 407, 261, 378, 30, 411}, V = 512, ncfg = 6;
	char err[WK_ERRSZ];
	struct engine *cpu = open_with(NULL, 2), *dev[2] = {open_with(&be_devsim, 2),
							    open_with(&be_devsim, 2)};
	dev[1]->cand_cap = 16;
	int differ = 0;
	for (int pair = 0; pair < ncfg; pair++) { /* rows with settings pair and pair + 1 */
		const struct samp_cfg *cf[2] = {&cfgs[pair], &cfgs[(pair + 1) % ncfg]};
		int sc[2], sd[2][2];
		struct sampler *rc[2], *rd[2][2];
		for (int k = 0; k < 2; k++) {
			cr_assert_eq(eng_seq_alloc(cpu, &sc[k]), WK_OK);
			rc[k] = samp_create(V, cf[k]);
			for (int e = 0; e < 2; e++) {
				cr_assert_eq(eng_seq_alloc(dev[e], &sd[e][k]), WK_OK);
				rd[e][k] = samp_create(V, cf[k]);
			}
		}
		float lc[2][512];
		int td[2][2] = {{-1, -1}, {-1, -1}}, next[2];
		const int *in[2] = {toks, toks + 3};
		int len[2] = {5, 4};
		for (int step = 0; step < 5; step++) {
			struct eng_item c[2] = {{sc[0], in[0], len[0], lc[0], NULL, {}, 0, 0, NULL, NULL, false},
						{sc[1], in[1], len[1], lc[1], NULL, {}, 0, 0, NULL, NULL, false}};
			cr_assert_eq(eng_step(cpu, c, 2, err, sizeof err), WK_OK, "%s", err);
			for (int e = 0; e < 2; e++) {
				struct eng_item d[2];
				for (int k = 0; k < 2; k++)
					d[k] = (struct eng_item){sd[e][k], in[k], len[k], NULL, &td[e][k],
						{cf[k]->temperature, cf[k]->top_p, cf[k]->top_k,
						 samp_draw(rd[e][k]), NULL}, 0, 0, NULL, NULL, false};
				cr_assert_eq(eng_step(dev[e], d, 2, err, sizeof err), WK_OK, "%s", err);
			}
			for (int k = 0; k < 2; k++) {
				int want = samp_next(rc[k], lc[k]);
				for (int e = 0; e < 2; e++)
					cr_expect_eq(td[e][k], want, "settings %d, step %d, cap %s: %d, want %d",
						     (pair + k) % ncfg, step, e ? "16" : "default", td[e][k],
						     want);
				differ += want != samp_argmax(lc[k], V);
				next[k] = want;
				in[k] = &next[k];
				len[k] = 1;
			}
		}
		for (int k = 0; k < 2; k++) {
			eng_seq_free(cpu, sc[k]);
			samp_free(rc[k]);
			for (int e = 0; e < 2; e++) {
				eng_seq_free(dev[e], sd[e][k]);
				samp_free(rd[e][k]);
			}
		}
	}
	cr_expect_gt(differ, 0, "every sampled token was the argmax: nothing was sampled");
	/* the cap of 16 copied logits rows back; the default cap never needed to */
	struct devsim_counts n0, n1;
	devsim_counts(dev[0]->bctx, &n0);
	devsim_counts(dev[1]->bctx, &n1);
	cr_expect_gt(n1.copies, n0.copies, "no row fell back to its logits under a cap of 16");
	eng_close(cpu);
	eng_close(dev[0]);
	eng_close(dev[1]);
}
