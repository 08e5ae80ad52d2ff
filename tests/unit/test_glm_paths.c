/*
 * test_glm_paths.c - the other ways a GLM step runs (glm_test.h's tiny checkpoints), each
 * against the plain one: several sequences batched in one step, device memory through devsim
 * (devsim.h), the launch counter against chain_plan and matmul_launches, the f32-activation
 * GEMM of a long prefill, FP8 activations, and bf16 and FP8 KV caches (each through decode,
 * batched steps and devsim).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coldstart/snapshot.h"
#include "common/dtype.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/engine_int.h" /* struct engine's bctx, for devsim_counts */
#include "kernels/cpu/cpu_int.h" /* cpu_force_scalar */
#include "tests/unit/devsim.h"
#include "tests/unit/glm_test.h"

/* ---- batched steps -------------------------------------------------------------------------- */

/* Continuous batching: three sequences stepped together (prefills of different lengths mixed
 * with decodes; MLA absorbed (at these sizes, auto absorbs prefills too; "expand" forced by
 * WICK_GLM_MLA elsewhere); the DSA indexer selecting in one segment and dense in another;
 * then all three decoding: GLM-5's latent attention one op over the three sequences'
 * caches, all selecting or, with a wide index_topk, all dense, as every step of that run)
 * give the logits each gets alone. */
static void check_batched(const char *dir, int V, const char *what)
{
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seqs = 3, .kv_dtype = kv_opt};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_info(e)->max_seqs, 3, "%s: the family must batch", what);
	/* prompts: ids[0..7), ids[2..4), ids[4..9); then each decodes three tokens */
	const int *p[3] = {ids, ids + 2, ids + 4};
	int len[3] = {7, 2, 5}, dec[3] = {9, 13, 17};
	float *want = malloc(sizeof(float) * 3 * 4 * V), *got = malloc(sizeof(float) * 3 * 4 * V);
	cr_assert(want && got);
#define W(s, k) (want + ((size_t)(s) * 4 + (k)) * V)
#define G(s, k) (got + ((size_t)(s) * 4 + (k)) * V)
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(eng_forward(e, p[s], len[s], 0, W(s, 0), false, err, sizeof err), WK_OK,
			     "%s", err);
		for (int k = 0; k < 3; k++)
			cr_assert_eq(eng_forward(e, &dec[k], 1, len[s] + k, W(s, k + 1), false, err,
						 sizeof err), WK_OK, "%s", err);
	}
	eng_seq_free(e, 0);
	int seq[3];
	for (int s = 0; s < 3; s++)
		cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
	/* step 1: 0 and 1 prefill; step 2: 2 prefills while 0 and 1 decode; step 3: all decode;
	 * step 4: 2 decodes alone */
	struct eng_item s1[2] = {{seq[0], p[0], len[0], G(0, 0), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[1], p[1], len[1], G(1, 0), NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, s1, 2, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s2[3] = {{seq[2], p[2], len[2], G(2, 0), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[0], &dec[0], 1, G(0, 1), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[1], &dec[0], 1, G(1, 1), NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, s2, 3, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s3[3] = {{seq[1], &dec[1], 1, G(1, 2), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[2], &dec[0], 1, G(2, 1), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[0], &dec[1], 1, G(0, 2), NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, s3, 3, err, sizeof err), WK_OK, "%s", err);
	struct eng_item s4 = {seq[2], &dec[1], 1, G(2, 2), NULL, {}, 0, 0, NULL, NULL, false};
	cr_assert_eq(eng_step(e, &s4, 1, err, sizeof err), WK_OK, "%s", err);
	/* step 5: all three decode (sequences 2, 0 and 1, at positions 7, 9 and 4) */
	struct eng_item s5[3] = {{seq[2], &dec[2], 1, G(2, 3), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[0], &dec[2], 1, G(0, 3), NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[1], &dec[2], 1, G(1, 3), NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, s5, 3, err, sizeof err), WK_OK, "%s", err);
	double worst = 0;
	for (int s = 0; s < 3; s++)
		for (int k = 0; k < 4; k++) {
			double r = rel(G(s, k), W(s, k), V);
			cr_expect_leq(r, 1e-4, "%s: sequence %d, logits %d: batched vs alone %g", what,
				      s, k, r);
			worst = r > worst ? r : worst;
		}
	fprintf(stderr, "glm batched: %s: worst relative difference %.2g\n", what, worst);
#undef W
#undef G
	free(want);
	free(got);
	eng_close(e);
}

Test(glm, batched_sequences_match_single)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 99, .bias_std = 0.1f};
	write_glm5(dir, &d);
	set_mla(NULL);
	check_batched(dir, G5_VOCAB, "glm5 fp8, index_topk 4");
	set_mla("absorb");
	check_batched(dir, G5_VOCAB, "glm5 fp8, absorbed");
	set_mla(NULL);
	rm_rf(dir);
	free(dir);
	/* BF16: kv_a_proj_with_mqa bound as two weights, c_kv and k_pe written straight into the
	 * caches for one sequence, through the step's rows for several */
	dir = mkdir_tmp();
	d.wdt = DT_BF16;
	write_glm5(dir, &d);
	check_batched(dir, G5_VOCAB, "glm5 bf16, index_topk 4");
	rm_rf(dir);
	free(dir);
	/* every query dense (index_topk past every sequence's length) */
	dir = mkdir_tmp();
	d.topk = 64;
	write_glm5(dir, &d);
	check_batched(dir, G5_VOCAB, "glm5 bf16, index_topk 64");
	d.topk = 4;
	rm_rf(dir);
	free(dir);
	dir = mkdir_tmp();
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	check_batched(dir, G4_VOCAB, "glm4 bf16");
	rm_rf(dir);
	free(dir);
}

/* ---- a prefill's indexer apart in a batched step ----------------------------------------- */

static struct {
	int calls, n[64];
	bool several[64];
} dsa_log;

static void dsa_logged(void *ctx, int *sel, int *nsel, const float *q, const float *w,
		       const struct be_dsa *d, int n, int pos0, float *scores, void *work)
{
	if (dsa_log.calls < 64) {
		dsa_log.n[dsa_log.calls] = n;
		dsa_log.several[dsa_log.calls] = d->seq != NULL;
	}
	dsa_log.calls++;
	be_cpu.dsa_topk(ctx, sel, nsel, q, w, d, n, pos0, scores, work);
}

/* In a batched step a segment of ENG_ATT_OWN (32) tokens or more, a prefill, gets a DSA top-k
 * call of its own, so that a device can score its queries in tiles (the CUDA backend's
 * tensor-core path takes one sequence); the short segments around it share calls over several
 * sequences, and a step of short ones one call. A tiny GLM-5 (index_topk 4, so that every
 * query past the fourth selects): a decode, a 40-token prefill and a decode in one step give
 * per layer a call of 1 token (several sequences), one of 40 (one sequence) and one of 1;
 * then three decodes, one call of 3 a layer. Every logit is what each sequence gets alone
 * (within 1e-4: the step's matmuls see more rows). */
Test(glm, batched_prefill_scores_on_its_own)
{
	char err[WK_ERRSZ], *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 41, .bias_std = 0.1f};
	write_glm5(dir, &d);
	int V = G5_VOCAB, p[40], t = 42;
	for (int i = 0; i < 40; i++)
		p[i] = (i * 37 + 11) % V;
	/* alone: each sequence's logits (rows: 0 and 2 after ids[0..6) then t, 1 after p, then
	 * 0 and 1 after t) */
	struct engine *e;
	struct eng_opts o1 = {.backend = "cpu", .threads = 2};
	cr_assert_eq(eng_open(dir, &o1, &e, err, sizeof err), WK_OK, "%s", err);
	float *want = malloc(sizeof(float) * 5 * V), *got = malloc(sizeof(float) * 5 * V);
	cr_assert(want && got);
	cr_assert_eq(eng_forward(e, ids, 6, 0, want, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 6, want, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 7, want + 3 * V, false, err, sizeof err), WK_OK);
	cr_assert_eq(eng_forward(e, p, 40, 0, want + V, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 40, want + 4 * V, false, err, sizeof err), WK_OK);
	eng_close(e);
	struct backend be = be_cpu;
	be.dsa_topk = dsa_logged;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seqs = 3, .backend_ops = &be};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	int seq[3];
	eng_seq_free(e, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
	struct eng_item pre[2] = {{seq[0], ids, 6, NULL, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], ids, 6, NULL, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, pre, 2, err, sizeof err), WK_OK, "%s", err);
	memset(&dsa_log, 0, sizeof dsa_log);
	struct eng_item mix[3] = {{seq[0], &t, 1, got, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[1], p, 40, got + V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], &t, 1, got + 2 * V, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, mix, 3, err, sizeof err), WK_OK, "%s", err);
	int layers = dsa_log.calls / 3;
	cr_expect_eq(dsa_log.calls, 3 * layers, "%d calls", dsa_log.calls);
	cr_expect_gt(layers, 0);
	for (int c = 0; c < dsa_log.calls && c < 64; c++) {
		bool own = c % 3 == 1;
		cr_expect_eq(dsa_log.n[c], own ? 40 : 1, "call %d of %d tokens", c, dsa_log.n[c]);
		cr_expect_eq(dsa_log.several[c], !own, "call %d: several sequences %d", c,
			     dsa_log.several[c]);
	}
	memset(&dsa_log, 0, sizeof dsa_log);
	struct eng_item dec[3] = {{seq[0], &t, 1, got + 3 * V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[1], &t, 1, got + 4 * V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], &t, 1, NULL, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, dec, 3, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(dsa_log.calls, layers, "decodes: one call a layer, not %d", dsa_log.calls);
	for (int c = 0; c < dsa_log.calls && c < 64; c++)
		cr_expect(dsa_log.n[c] == 3 && dsa_log.several[c], "decode call %d", c);
	eng_close(e);
	for (int r = 0; r < 5; r++) {
		const float *w = want + (size_t)(r == 2 ? 0 : r) * V;
		double rr = rel(got + (size_t)r * V, w, V);
		cr_expect_leq(rr, 1e-4, "logits row %d differ from the sequence's alone by %g", r,
			      rr);
	}
	free(want);
	free(got);
	rm_rf(dir);
	free(dir);
}

/* ---- device memory (devsim) ----------------------------------------------------------------- */

/* The GLM families on a device backend's memory: through devsim (devsim.h) every weight,
 * vector, cache and activation is memory the host cannot touch outside the backend's ops and
 * copies (a stray host access is a SIGSEGV, a host pointer handed to an op a failure), and
 * the logits are bit for bit the CPU backend's: a prefill of every position, decode steps,
 * and batched steps of two sequences (a prefill beside a decode). Also without the grouped
 * MoE op (the experts one by one, gathered and scattered): the same within float rounding
 * (the experts' outputs are summed in another order). This is the engine side of GLM on
 * CUDA. Where WICK_GLM_MLA (set_mla) forces no MLA path, both absorb: on its own a device
 * absorbs a sparse prefill that the host may expand (glm5.c's expand), and the bits differ. */
static void check_devsim(const char *dir, int V, const char *what)
{
	enum { NE = 3 }; /* cpu, devsim, devsim without grouped MoE */
	const struct backend *bes[NE] = {NULL, &be_devsim, &be_devsim_ungrouped};
	char err[WK_ERRSZ];
	struct engine *e[NE];
	float *lg[NE];
	bool auto_mla = !getenv("WICK_GLM_MLA");
	if (auto_mla)
		set_mla("absorb");
	for (int k = 0; k < NE; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seqs = 2,
				     .backend_ops = bes[k], .kv_dtype = kv_opt};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s: %s", what, err);
		lg[k] = malloc(sizeof(float) * NIDS * V);
		cr_assert_not_null(lg[k]);
	}
	if (auto_mla) /* read at open */
		set_mla(NULL);
	cr_assert_str_eq(eng_info(e[1])->backend, "devsim");
	/* compares the first rows * V logits of every engine with the CPU's */
#define SAME(rows, ...)                                                                      \
	do {                                                                                  \
		cr_expect_eq(memcmp(lg[0], lg[1], sizeof(float) * (rows) * V), 0, __VA_ARGS__); \
		for (int r_ = 0; r_ < (rows); r_++)                                           \
			cr_expect_leq(rel(lg[2] + (size_t)r_ * V, lg[0] + (size_t)r_ * V, V),  \
				      1e-5, __VA_ARGS__);                                     \
	} while (0)
	for (int k = 0; k < NE; k++)
		cr_assert_eq(eng_forward(e[k], ids, NIDS, 0, lg[k], true, err, sizeof err), WK_OK,
			     "%s: %s", what, err);
	SAME(NIDS, "%s: prefill logits differ on devsim", what);
	for (int i = 0; i < 3; i++) {
		for (int k = 0; k < NE; k++)
			cr_assert_eq(eng_forward(e[k], ids + i, 1, NIDS + i, lg[k], false, err,
						 sizeof err), WK_OK, "%s: %s", what, err);
		SAME(1, "%s: decode step %d differs on devsim", what, i);
	}
	/* sequence 0 decodes on while sequence 1 prefills, then both decode */
	for (int k = 0; k < NE; k++) {
		int s1;
		cr_assert_eq(eng_seq_alloc(e[k], &s1), WK_OK);
		struct eng_item a[2] = {{0, ids + 3, 1, lg[k], NULL, {}, 0, 0, NULL, NULL, false},
					{s1, ids, 6, lg[k] + V, NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e[k], a, 2, err, sizeof err), WK_OK, "%s: %s", what, err);
		struct eng_item b[2] = {{s1, ids + 6, 1, lg[k] + 2 * V, NULL, {}, 0, 0, NULL, NULL, false},
					{0, ids + 4, 1, lg[k] + 3 * V, NULL, {}, 0, 0, NULL, NULL, false}};
		cr_assert_eq(eng_step(e[k], b, 2, err, sizeof err), WK_OK, "%s: %s", what, err);
	}
	SAME(4, "%s: batched steps differ on devsim", what);
#undef SAME
	struct devsim_counts n[2];
	devsim_counts(e[1]->bctx, &n[0]);
	devsim_counts(e[2]->bctx, &n[1]);
	cr_expect_gt(n[0].ops, 100, "%s: only %d ops ran on devsim", what, n[0].ops);
	/* from a snapshot the weights stream into devsim's memory and are used where they land;
	 * from a checkpoint they are uploaded one by one */
	bool snap = snap_is_snapshot(dir);
	cr_expect_eq(eng_info(e[1])->startup.to_device, snap, "%s", what);
	cr_expect(snap ? n[0].uploads == 0 && n[0].stage_puts > 0 : n[0].uploads > 0,
		  "%s: %d uploads, %d staged copies", what, n[0].uploads, n[0].stage_puts);
	cr_expect_gt(n[1].ops, n[0].ops, "%s: the experts one by one took no more ops (%d, %d)",
		     what, n[1].ops, n[0].ops);
	cr_log_info("%s on devsim: %d ops, %d copies, %d regions; experts one by one: %d ops, "
		    "%d copies", what, n[0].ops, n[0].copies, n[0].regions, n[1].ops, n[1].copies);
	for (int k = 0; k < NE; k++) {
		eng_close(e[k]);
		free(lg[k]);
	}
}

Test(glm, device_memory_only_through_the_backend)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 2, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	write_glm5(dir, &d);
	set_mla("expand");
	check_devsim(dir, G5_VOCAB, "glm5 fp8, expanded");
	set_mla("absorb");
	check_devsim(dir, G5_VOCAB, "glm5 fp8, absorbed");
	set_mla(NULL);
	/* a snapshot restored straight into devsim's memory (lz4, small chunks) */
	char *sd = mkdir_tmp(), out[600], err[WK_ERRSZ];
	snprintf(out, sizeof out, "%s/s", sd);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .lz4 = true, .chunk_size = 64 << 10};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	check_devsim(out, G5_VOCAB, "glm5 fp8 snapshot, streamed");
	rm_rf(sd);
	free(sd);
	rm_rf(dir);
	free(dir);
	enum dt_type dts[] = {DT_BF16, DT_F8_E4M3};
	for (int k = 0; k < 2; k++) {
		dir = mkdir_tmp();
		write_glm4(dir, dts[k], 4, 2, 0.1f);
		check_devsim(dir, G4_VOCAB, dts[k] == DT_BF16 ? "glm4 bf16" : "glm4 fp8");
		rm_rf(dir);
		free(dir);
	}
}

/* ---- launch counts -------------------------------------------------------------------------- */

/* A step's act_split launches (the f32-activation GEMM's split: one per matmul_fp8w op). */
static long act_splits(const struct engine *e)
{
	struct eng_launches L;
	long n = 0;
	cr_assert_eq(eng_launches(e, 0, &L), WK_OK);
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++)
		n += strcmp(eng_launch_kind(k, NULL, NULL), "act_split") ? 0 : L.n[k];
	return n;
}

/* A CPU backend with a chain (its links one by one) whose chain_plan says each MoE link runs
 * on its own and the links around it chained, as the CUDA backend does with a MoE op its
 * chained launch cannot take; and the same without the plan (chain one launch, as before). */
static int plan_moe_apart(void *ctx, const struct be_link *l, int count, int *seg)
{
	(void)ctx;
	int runs = 0;
	for (int i = 0; i < count; i++)
		seg[i] = l[i].kind == BE_LINK_MOE ? -1 : i > 0 && seg[i - 1] >= 0 ? seg[i - 1] : runs++;
	return runs;
}

static void chain_cpu(void *ctx, const struct be_link *l, int count)
{
	be_chain_each(&be_cpu, ctx, l, count);
}

/* Every matmul_n and matmul_rope_n two launches and a rotation's (as the CUDA backend's
 * tensor-core GEMVs would make them). */
static void two_matmuls(void *ctx, float *const *y, const float *x,
			const struct be_weight *const *w, int count, int n, const struct be_rope *r,
			int *mm, int *rot)
{
	(void)ctx, (void)y, (void)x, (void)w, (void)count, (void)n, (void)r;
	*mm = 2;
	*rot = 1;
}

/* The launch counter counts what chain_plan says: with the MoE links apart, each is a
 * moe_experts op of its own (3 launches on the CUDA backend) instead of a link inside a
 * chain, the chains around them as many, and the logits the same bit for bit. And what
 * matmul_launches says: each matmul_n / matmul_rope_n outside a chain one more matmul and a
 * rotation. */
Test(glm, launch_count_follows_chain_plan)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 23, .bias_std = 0.1f};
	write_glm5(dir, &d);
	struct backend be[3] = {be_cpu, be_cpu, be_cpu};
	be[0].chain = be[1].chain = be[2].chain = chain_cpu;
	be[1].chain_plan = plan_moe_apart;
	be[2].matmul_launches = two_matmuls;
	struct eng_launches L[3];
	float *lg[3];
	int V = G5_VOCAB, tok = 5;
	char err[WK_ERRSZ];
	for (int k = 0; k < 3; k++) {
		struct engine *e;
		struct eng_opts o = {.backend = "cpu", .threads = 2, .backend_ops = &be[k],
				     .count_launches = true};
		cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
		lg[k] = malloc(sizeof(float) * V);
		cr_assert_eq(eng_forward(e, ids, NIDS, 0, lg[k], false, err, sizeof err), WK_OK, "%s",
			     err);
		cr_assert_eq(eng_forward(e, &tok, 1, NIDS, lg[k], false, err, sizeof err), WK_OK,
			     "%s", err);
		cr_assert_eq(eng_launches(e, 0, &L[k]), WK_OK);
		eng_close(e);
	}
	int moe = -1, chain = -1, mm = -1, rope = -1;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *nm = eng_launch_kind(k, NULL, NULL);
		moe = strcmp(nm, "moe_experts") ? moe : k;
		chain = strcmp(nm, "chain") ? chain : k;
		mm = strcmp(nm, "matmul") ? mm : k;
		rope = strcmp(nm, "rope") ? rope : k;
	}
	cr_assert(moe >= 0 && chain >= 0 && mm >= 0 && rope >= 0);
	long dm = L[2].n[mm] - L[0].n[mm], dr = L[2].n[rope] - L[0].n[rope];
	cr_log_info("matmul ops %ld / %ld, rope %ld / %ld", L[0].n[mm], L[2].n[mm], L[0].n[rope],
		    L[2].n[rope]);
	cr_expect(dm > 0 && dr == dm, "matmul_launches: %ld more matmuls, %ld more ropes", dm,
		  dr);
	cr_expect_eq(L[2].n[chain], L[0].n[chain]);
	cr_log_info("chained MoE ops %ld, MoE ops %ld / %ld, chains %ld / %ld",
		    L[0].chained[moe], L[0].n[moe], L[1].n[moe], L[0].n[chain], L[1].n[chain]);
	cr_expect_gt(L[0].chained[moe], 0, "no MoE op ran inside a chain");
	cr_expect_eq(L[1].chained[moe], 0, "a MoE link counted inside a chain");
	cr_expect_eq(L[1].n[moe], L[0].n[moe] + L[0].chained[moe]);
	cr_expect_eq(L[1].n[chain], L[0].n[chain]);
	cr_expect_eq(memcmp(lg[0], lg[1], sizeof(float) * V), 0);
	cr_expect_eq(memcmp(lg[0], lg[2], sizeof(float) * V), 0);
	for (int k = 0; k < 3; k++)
		free(lg[k]);
	rm_rf(dir);
	free(dir);
}

/* How a prefill attends (glm5.c's expand): on the host, expanded or absorbed, whichever does
 * fewer multiply-adds; on a device, absorbed whenever it is sparse (each key's latent row read
 * once for every head, not each head's own rows), expanded where dense and cheaper. A GLM-5
 * whose kv_lora_rank (32) makes expanding the cheaper, 12 tokens from 0, on the CPU and on
 * devsim with the launch counter: over index_topk 4 (sparse) the CPU runs mla_attention and
 * no absorbed op, devsim one mla_absorbed a layer and no mla_attention; over index_topk 16
 * (dense) both expand. The logits agree within 1e-4 either way. */
Test(glm, sparse_prefill_absorbs_on_a_device)
{
	char err[WK_ERRSZ];
	int att = -1, abs = -1, absq = -1;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *nm = eng_launch_kind(k, NULL, NULL);
		att = strcmp(nm, "mla_attention") ? att : k;
		abs = strcmp(nm, "mla_absorbed") ? abs : k;
		absq = strcmp(nm, "mla_absorb_q") ? absq : k;
	}
	cr_assert(att >= 0 && abs >= 0 && absq >= 0);
	set_mla(NULL);
	for (int dense = 0; dense < 2; dense++) {
		char *dir = mkdir_tmp();
		struct g5dims d = {.topk = dense ? 16 : 4, .n_group = 1, .topk_group = 1,
				   .kvl = 32, .wdt = DT_F8_E4M3, .seed = 31, .bias_std = 0.1f};
		write_glm5(dir, &d);
		const struct backend *bes[2] = {&be_cpu, &be_devsim};
		struct eng_launches L[2];
		float *lg[2];
		for (int k = 0; k < 2; k++) {
			struct engine *e;
			struct eng_opts o = {.backend = "cpu", .threads = 2, .backend_ops = bes[k],
					     .count_launches = true};
			cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
			lg[k] = malloc(sizeof(float) * G5_VOCAB);
			cr_assert_eq(eng_forward(e, ids, NIDS, 0, lg[k], false, err, sizeof err),
				     WK_OK, "%s", err);
			cr_assert_eq(eng_launches(e, 0, &L[k]), WK_OK);
			eng_close(e);
			cr_log_info("%s, %s: mla_attention %ld, mla_absorbed %ld, mla_absorb_q %ld",
				    dense ? "dense" : "sparse", bes[k]->name, L[k].n[att],
				    L[k].n[abs], L[k].n[absq]);
		}
		cr_expect_eq(L[0].n[abs] + L[0].n[absq], 0, "the CPU absorbed (%s)",
			     dense ? "dense" : "sparse");
		cr_expect_eq(L[0].n[att], G5_L, "the CPU's mla_attention ops");
		if (dense) {
			cr_expect_eq(L[1].n[abs] + L[1].n[absq], 0, "devsim absorbed a dense prefill");
			cr_expect_eq(L[1].n[att], G5_L);
		} else {
			cr_expect_eq(L[1].n[abs], G5_L, "devsim's mla_absorbed ops");
			cr_expect_eq(L[1].n[att], 0, "devsim expanded a sparse prefill");
		}
		double r = rel(lg[1], lg[0], G5_VOCAB);
		cr_expect_leq(r, 1e-4, "%s: devsim against the CPU %g", dense ? "dense" : "sparse",
			      r);
		free(lg[0]);
		free(lg[1]);
		rm_rf(dir);
		free(dir);
	}
}

/* With f32 activations a step of ENG_GEMM_TOKENS (64) tokens or more sends its FP8 matmuls
 * to the backend's GEMM (matmul_fp8w; devsim runs it as the CPU's matmul, so the logits stay
 * the CPU's bit for bit), one of 63 tokens to the GEMV; an unfused engine never uses it, nor
 * one with FP8 activations (whose GEMM is matmul_fp8act, which devsim lacks). Counted on
 * devsim over a tiny GLM-5 FP8. */
Test(glm, f32_prefill_fp8_weights_take_the_gemm)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 23, .bias_std = 0.1f};
	write_glm5(dir, &d);
	enum { LEN = 64 };
	struct engine *cpu, *e[3]; /* devsim: fused, unfused, FP8 activations */
	char err[WK_ERRSZ];
	struct eng_opts oc = {.backend = "cpu", .threads = 2};
	cr_assert_eq(eng_open(dir, &oc, &cpu, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < 3; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .backend_ops = &be_devsim,
				     .count_launches = true, .unfused = k == 1, .fp8_act = k == 2};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s", err);
	}
	cr_assert_eq(eng_info(cpu)->max_seq, LEN);
	int V = G5_VOCAB, tok[LEN];
	for (int i = 0; i < LEN; i++)
		tok[i] = (i * 37 + 11) % V;
	float *want = malloc(sizeof(float) * LEN * V), *got = malloc(sizeof(float) * LEN * V);
	cr_assert(want && got);
	cr_assert_eq(eng_forward(cpu, tok, LEN, 0, want, true, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < 3; k++)
		cr_assert_eq(eng_forward(e[k], tok, LEN, 0, got, true, err, sizeof err), WK_OK, "%s",
			     err);
	long splits = act_splits(e[0]);
	cr_assert_eq(eng_forward(e[0], tok, LEN, 0, got, true, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(memcmp(got, want, sizeof(float) * LEN * V), 0,
		     "devsim's GEMM prefill differs from the CPU's");
	cr_log_info("a %d-token GLM-5 prefill: %ld act_split ops", LEN, splits);
	cr_expect_geq(splits, (long)G5_L, "a %d-token prefill ran %ld matmul_fp8w ops", LEN, splits);
	cr_expect_eq(act_splits(e[0]), 2 * splits, "a second prefill ran another count");
	cr_assert_eq(eng_forward(e[0], tok, LEN - 1, 0, got, true, err, sizeof err), WK_OK, "%s",
		     err);
	cr_expect_eq(act_splits(e[0]), 2 * splits, "a %d-token step took the GEMM", LEN - 1);
	cr_expect_eq(act_splits(e[1]), 0, "the unfused engine took the GEMM");
	cr_expect_eq(act_splits(e[2]), 0, "the f32 GEMM ran with FP8 activations");
	eng_close(cpu);
	for (int k = 0; k < 3; k++)
		eng_close(e[k]);
	free(want);
	free(got);
	rm_rf(dir);
	free(dir);
}

/* ---- FP8 activations ------------------------------------------------------------------------ */

/* eng_opts.fp8_act quantizes the input of every FP8-weight matmul per token per 128 channels
 * (the quantizer itself is tested in test_fp8.c). Here: over 320 positions of a tiny GLM-5 FP8
 * the quantization runs (act_quant before the FP8 matmuls, the experts one by one so that
 * they read quantized input too, logits finite and changed) and devsim's logits are the
 * CPU's bit for bit (act_quant and its scratch live in device memory). How far FP8
 * activations move the logits of random tiny weights is logged, not bounded: a flipped
 * e4m3 rounding changes MoE and DSA choices and cascades (issue 9's gross-error gate, GPU
 * against CPU with FP8 activations on both, runs in scripts/gpu-check). */
Test(glm, fp8_activations)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 21, .bias_std = 0.1f};
	write_glm5(dir, &d);
	enum { SEQS = 5, LEN = 64 };
	const struct backend *bes[3] = {NULL, NULL, &be_devsim};
	struct engine *e[3];
	char err[WK_ERRSZ];
	for (int k = 0; k < 3; k++) {
		struct eng_opts o = {.backend = "cpu", .threads = 2, .fp8_act = k > 0,
				     .backend_ops = bes[k], .count_launches = k == 1};
		cr_assert_eq(eng_open(dir, &o, &e[k], err, sizeof err), WK_OK, "%s", err);
	}
	cr_assert_eq(eng_info(e[0])->max_seq, LEN);
	int V = G5_VOCAB, tok[LEN], top1 = 0, n = 0;
	float *lg[3];
	for (int k = 0; k < 3; k++)
		lg[k] = malloc(sizeof(float) * LEN * V);
	double cos_sum = 0, maxd = 0;
	uint64_t r = 12345;
	for (int s = 0; s < SEQS; s++) {
		for (int i = 0; i < LEN; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			tok[i] = (int)((r >> 33) % (uint64_t)V);
		}
		for (int k = 0; k < 3; k++)
			cr_assert_eq(eng_forward(e[k], tok, LEN, 0, lg[k], true, err, sizeof err),
				     WK_OK, "%s", err);
		cr_expect_eq(memcmp(lg[1], lg[2], sizeof(float) * LEN * V), 0,
			     "devsim differs from the CPU with FP8 activations");
		for (int i = 0; i < LEN; i++, n++) {
			const float *a = lg[0] + (size_t)i * V, *b = lg[1] + (size_t)i * V;
			double ab = 0, aa = 0, bb = 0;
			int ia = 0, ib = 0;
			for (int v = 0; v < V; v++) {
				cr_assert(isfinite(b[v]));
				ab += (double)a[v] * b[v];
				aa += (double)a[v] * a[v];
				bb += (double)b[v] * b[v];
				ia = a[v] > a[ia] ? v : ia;
				ib = b[v] > b[ib] ? v : ib;
				maxd = fmax(maxd, fabs((double)a[v] - b[v]));
			}
			cos_sum += ab / sqrt(aa * bb);
			top1 += ia == ib;
		}
	}
	struct eng_launches L;
	cr_assert_eq(eng_launches(e[1], 0, &L), WK_OK);
	long aq = 0, mx = 0;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *name = eng_launch_kind(k, NULL, NULL);
		aq += strcmp(name, "act_quant") ? 0 : L.n[k];
		mx += strcmp(name, "moe_experts") ? 0 : L.n[k];
	}
	cr_log_info("fp8 activations vs f32 over %d positions: mean cosine %.4f, top-1 %.3f, max "
		    "|d| %.3g; %ld act_quant ops", n, cos_sum / n, (double)top1 / n, maxd, aq);
	cr_expect_geq(aq, (long)SEQS * G5_L, "only %ld act_quant ops", aq);
	cr_expect_eq(mx, 0, "the grouped MoE op ran with FP8 activations");
	cr_expect_gt(maxd, 1e-4, "FP8 activations changed nothing (max |d| %g)", maxd);
	for (int k = 0; k < 3; k++) {
		eng_close(e[k]);
		free(lg[k]);
	}
	rm_rf(dir);
	free(dir);
}

/* ---- KV cache types ------------------------------------------------------------------------- */

/* The prefill logits [NIDS][vocab] of the model in dir on KV caches of type kv (*V: vocab). */
static float *prefill_kv(const char *dir, const char *kv, int *V)
{
	kv_opt = kv;
	struct engine *e = open_model(dir);
	cr_assert_str_eq(eng_info(e)->kv_dtype, kv);
	*V = eng_info(e)->vocab;
	float *lg = prefill(e, NIDS);
	eng_close(e);
	return lg;
}

/* A KV cache type's consistency on the model in dir (e: open on it, closed here; got: its
 * prefill): decoding token by token matches the prefill, in the chosen MLA form and the
 * absorbed one (it reads the cache itself; these sizes choose expanded), batched steps match
 * each sequence alone, and device memory (devsim) matches bit for bit. */
static void check_cache_paths(struct engine *e, const char *dir, const float *got, int V,
			      const char *what)
{
	check_decode(e, got, NIDS, what);
	eng_close(e);
	set_mla("absorb");
	e = open_model(dir);
	check_decode(e, got, NIDS, what);
	eng_close(e);
	set_mla(NULL);
	check_batched(dir, V, what);
	check_devsim(dir, V, what);
}

/* The worst rel() over NIDS rows of logits. */
static double worst_rel(const float *a, const float *b, int V)
{
	double w = 0;
	for (int i = 0; i < NIDS; i++)
		w = fmax(w, rel(a + (size_t)i * V, b + (size_t)i * V, V));
	return w;
}

/* bf16 KV caches on every family and both ways GLM-5 writes its latent (FP8 kv_a whole, bf16
 * kv_a split in two): the logits stay within bf16's rounding of the f32 caches' and differ
 * from them (the caches do round); decoding token by token matches the prefill; batched steps
 * (the step's rows rounded into several sequences' caches) match each sequence alone; and on
 * device memory (devsim) the logits are the CPU backend's bit for bit. */
Test(glm, kv_bf16)
{
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	const char *what[3] = {"glm5 fp8", "glm5 bf16", "glm4 bf16"};
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		d.wdt = k == 0 ? DT_F8_E4M3 : DT_BF16;
		if (k < 2)
			write_glm5(dir, &d);
		else
			write_glm4(dir, DT_BF16, 4, 2, 0.1f);
		int V;
		float *ref = prefill_kv(dir, "f32", &V), *got = prefill_kv(dir, "bf16", &V);
		struct engine *e = open_model(dir);
		double worst = worst_rel(got, ref, V);
		fprintf(stderr, "glm kv bf16: %s: bf16 vs f32 caches, worst relative difference "
			"%.2g\n", what[k], worst);
		cr_expect(worst > 0 && worst <= 1.5e-2, "%s: bf16 vs f32 caches differ by %g",
			  what[k], worst);
		check_cache_paths(e, dir, got, V, what[k]);
		kv_opt = NULL;
		free(ref);
		free(got);
		rm_rf(dir);
		free(dir);
	}
}

/* Mean cosine and top-1 agreement of n rows of logits against ref's. */
static void agreement(const float *a, const float *ref, int n, int V, double *cos, double *top1)
{
	*cos = *top1 = 0;
	for (int i = 0; i < n; i++) {
		const float *x = a + (size_t)i * V, *y = ref + (size_t)i * V;
		double xy = 0, xx = 0, yy = 0;
		int bx = 0, by = 0;
		for (int j = 0; j < V; j++) {
			xy += (double)x[j] * y[j], xx += (double)x[j] * x[j], yy += (double)y[j] * y[j];
			bx = x[j] > x[bx] ? j : bx;
			by = y[j] > y[by] ? j : by;
		}
		*cos += xy / sqrt(xx * yy) / n;
		*top1 += (double)(bx == by) / n;
	}
}

/* fp8 caches on the model in dir against f32 and bf16 ones: printed, the logits differing from
 * the bf16 caches' (the cache does quantize) and, bounded, the mean cosine and top-1 against
 * f32 held to a gross-error gate; then check_cache_paths. Returns the fp8 prefill's logits
 * (to free), V its vocabulary. */
static float *check_fp8_cache(const char *dir, const char *what, bool bounded, int *V)
{
	float *ref = prefill_kv(dir, "f32", V), *b16 = prefill_kv(dir, "bf16", V);
	float *got = prefill_kv(dir, "fp8", V);
	struct engine *e = open_model(dir);
	double worst = worst_rel(got, ref, *V), worst16 = worst_rel(got, b16, *V), cos, top1;
	agreement(got, ref, NIDS, *V, &cos, &top1);
	fprintf(stderr, "glm kv fp8: %s: fp8 vs f32 caches, worst relative difference %.2g, "
		"mean cosine %.6f, top-1 %.2f (vs bf16 caches: %.2g)\n", what, worst, cos, top1,
		worst16);
	cr_expect(!bounded || (cos >= 0.998 && top1 >= 0.8), "%s: fp8 vs f32 caches: mean "
		  "cosine %g, top-1 %g", what, cos, top1);
	cr_expect(worst16 > 1e-3, "%s: the fp8 caches' logits are the bf16 caches' (%g)", what,
		  worst16);
	check_cache_paths(e, dir, got, *V, what);
	kv_opt = NULL;
	free(ref);
	free(b16);
	return got;
}

/* FP8 KV caches (GLM-5: the latent and the indexer keys e4m3 with a scale per 128, k_pe
 * bf16), with kv_a whole (FP8 weights) and split (bf16). Dense (index_topk 16 over 12
 * positions): the logits stay near the f32 caches' (a gross-error gate: e4m3 keeps 3 mantissa
 * bits) and differ from the bf16 caches' (the cache does quantize). Sparse (index_topk 4, so
 * the indexer reads its FP8 keys; on random tiny weights one flipped choice moves a logit far,
 * so no bound against f32 there): decoding token by token reads the same quantized rows as
 * the prefill's expansion, so it matches it to f32 rounding; batched = alone; devsim bit for
 * bit. A KV dtype wick does not have is refused by name. */
Test(glm, kv_fp8)
{
	struct g5dims d = {.topk = 16, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 5, .bias_std = 0.1f};
	const char *what[4] = {"glm5 fp8 dense", "glm5 bf16 dense", "glm5 fp8", "glm5 bf16"};
	for (int k = 0; k < 4; k++) {
		char *dir = mkdir_tmp();
		d.wdt = k % 2 == 0 ? DT_F8_E4M3 : DT_BF16;
		d.topk = k < 2 ? 16 : 4;
		write_glm5(dir, &d);
		int V;
		free(check_fp8_cache(dir, what[k], k < 2, &V));
		rm_rf(dir);
		free(dir);
	}
	char *dir = mkdir_tmp();
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	struct engine *e;
	char err[WK_ERRSZ] = "";
	struct eng_opts o = {.backend = "cpu", .threads = 2, .kv_dtype = "fp4"};
	cr_expect_eq(eng_open(dir, &o, &e, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "'fp4'"), "%s", err);
	rm_rf(dir);
	free(dir);
}

/* FP8 KV caches on GLM-4.5 (GQA: keys and values e4m3 with one f32 scale per 128 of each
 * position's kv-head row, head_dim 32 here), FP8 and bf16 weights: the logits stay near the f32
 * caches' (a gross-error gate: e4m3 keeps 3 mantissa bits) and differ from the bf16 caches'
 * (the cache does quantize); decoding token by token reads the same quantized rows as the
 * prefill, so it matches it to f32 rounding; batched = alone; devsim bit for bit; the scalar
 * kernels match AVX2 (tp 2: engine/kv_fp8_tells_the_story, on stories260K). */
Test(glm, kv_fp8_gqa)
{
	const char *what[2] = {"glm4 fp8", "glm4 bf16"};
	for (int k = 0; k < 2; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, k == 0 ? DT_F8_E4M3 : DT_BF16, 4, 2, 0.1f);
		int V;
		float *got = check_fp8_cache(dir, what[k], true, &V);
		cpu_force_scalar(true);
		float *sc = prefill_kv(dir, "fp8", &V);
		cpu_force_scalar(false);
		cr_expect_leq(worst_rel(sc, got, V), 1e-4, "%s: scalar vs AVX2: %g", what[k],
			      worst_rel(sc, got, V));
		kv_opt = NULL;
		free(sc);
		free(got);
		rm_rf(dir);
		free(dir);
	}
}

/* FP8 caches whose rows span several 128-blocks with a partial last one (gen_glm: kv_lora_rank
 * and index_head_dim 136 = 128 + 8, so the per-block scales are indexed past the first): the
 * cache paths as kv_fp8 checks them; a prefill in two chunks (the second expanding over the
 * first's quantized rows) matches the whole one in either MLA form; the scalar kernels match
 * the AVX2 ones; and tp 2 matches tp 1 (each rank caches the whole latent). */
Test(glm, kv_fp8_blocks)
{
	const char *tools = getenv("WICK_TOOLS");
	char *dir = mkdir_tmp(), cmd[1024], err[WK_ERRSZ];
	snprintf(cmd, sizeof cmd, "'%s/gen_glm' --family glm5 -o '%s' --kv-lora-rank 136 "
		 "--index-head-dim 136 --index-topk 4 >/dev/null", tools ? tools : "build/tools", dir);
	cr_assert_eq(system(cmd), 0, "%s (is $WICK_TOOLS/gen_glm built?)", cmd);
	int V;
	float *got = prefill_kv(dir, "fp8", &V);
	check_cache_paths(open_model(dir), dir, got, V, "glm5 fp8 cache, 136-wide rows");
	float *two = malloc(sizeof(float) * NIDS * V);
	cr_assert_not_null(two);
	for (int m = 0; m < 2; m++) {
		set_mla(m ? "expand" : "absorb");
		struct engine *e = open_model(dir);
		cr_assert_eq(eng_forward(e, ids, 6, 0, two, true, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(e, ids + 6, NIDS - 6, 6, two + (size_t)6 * V, true, err,
					 sizeof err), WK_OK, "%s", err);
		eng_close(e);
		cr_expect_leq(worst_rel(two, got, V), 1e-4, "%s: a chunked prefill differs by %g",
			      m ? "expand" : "absorb", worst_rel(two, got, V));
	}
	set_mla(NULL);
	cpu_force_scalar(true);
	float *sc = prefill_kv(dir, "fp8", &V);
	cpu_force_scalar(false);
	cr_expect_leq(worst_rel(sc, got, V), 1e-4, "scalar vs AVX2: %g", worst_rel(sc, got, V));
	char *sd = mkdir_tmp(), out[600];
	snprintf(out, sizeof out, "%s/s", sd);
	struct eng_snap_opts so = {.tp = 2, .ep = 1};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	float *tp2 = prefill_kv(out, "fp8", &V);
	double d = worst_rel(tp2, got, V);
	fprintf(stderr, "glm kv fp8 blocks: tp 2 vs tp 1 on fp8 caches %.2g\n", d);
	cr_expect_leq(d, 1e-4, "tp 2 vs tp 1: %g", d);
	kv_opt = NULL;
	free(got), free(two), free(sc), free(tp2);
	rm_rf(sd), free(sd);
	rm_rf(dir), free(dir);
}
