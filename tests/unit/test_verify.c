/*
 * Speculative decoding's engine side: a step item with rows > 1 gives the logits and the
 * argmax after each of its tokens, the same as feeding them one step at a time; and
 * eng_seq_truncate forgets rejected drafts, so that what comes after them sees only the
 * tokens kept. On stories260K (Llama), a tiny GLM-5 (MLA, a DSA indexer that selects, MoE)
 * and a tiny GLM-4.5 (GQA); on the CPU backend and on devsim (devsim.h: the rows and the
 * argmax through device memory, as on a GPU).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "glm_test.h"
#include "tests/unit/devsim.h"

TestSuite(verify);

/* Logits [V] of prompt, then each of extra[0..k) one step at a time, in a fresh sequence:
 * out [k+1][V] (row 0 after the prompt). */
static void one_at_a_time(struct engine *e, const int *prompt, int np, const int *extra, int k,
			  float *out)
{
	int V = eng_info(e)->vocab, seq;
	char err[WK_ERRSZ];
	cr_assert_eq(eng_seq_alloc(e, &seq), WK_OK);
	struct eng_item it = {.seq = seq, .tokens = prompt, .n = np, .logits = out};
	cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s", err);
	for (int j = 0; j < k; j++) {
		it = (struct eng_item){.seq = seq, .tokens = extra + j, .n = 1,
				       .logits = out + (size_t)(j + 1) * V};
		cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s", err);
	}
	eng_seq_free(e, seq);
}

static double worst(const float *a, const float *b, int rows, int V)
{
	double w = 0;
	for (int r = 0; r < rows; r++)
		w = fmax(w, rel(a + (size_t)r * V, b + (size_t)r * V, V));
	return w;
}

/* The checks, on engine e (max_seqs >= 3) with a prompt of np tokens and a draft of k. */
static void rows_and_truncate(struct engine *e, const int *prompt, int np, const int *draft,
			      int k, const char *what)
{
	int V = eng_info(e)->vocab;
	char err[WK_ERRSZ];
	eng_seq_free(e, 0); /* eng_forward's; the steps below allocate their own */
	/* (1) alone: the prompt, then each draft token (the "last output" is draft[0]) */
	float *want = malloc(sizeof(float) * (size_t)(k + 1) * V);
	one_at_a_time(e, prompt, np, draft, k, want);

	/* (2) the prompt; then draft[0..k) in one item with rows = k, beside another sequence
	 * prefilling the same prompt in that step (output rows picked from among the rows) */
	int s, other;
	cr_assert_eq(eng_seq_alloc(e, &s), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &other), WK_OK);
	float *got = malloc(sizeof(float) * (size_t)(k + 1) * V), *olg = malloc(sizeof(float) * V);
	int tok[16], otok = -1;
	cr_assert(k <= 16);
	struct eng_item it[2] = {{.seq = s, .tokens = prompt, .n = np, .logits = got}};
	cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s", err);
	it[0] = (struct eng_item){.seq = s, .tokens = draft, .n = k, .logits = got + V,
				  .token = tok, .rows = k};
	it[1] = (struct eng_item){.seq = other, .tokens = prompt, .n = np, .logits = olg,
				  .token = &otok};
	cr_assert_eq(eng_step(e, it, 2, err, sizeof err), WK_OK, "%s", err);
	double d = worst(got, want, k + 1, V);
	cr_expect_leq(d, 1e-4, "%s: rows of one step against one step a token: %g", what, d);
	for (int j = 0; j < k; j++)
		cr_expect_eq(tok[j], samp_argmax(want + (size_t)(j + 1) * V, V),
			     "%s: the argmax after draft token %d", what, j);
	cr_expect_leq(rel(olg, want, V), 1e-4, "%s: the prefill beside it", what);
	cr_expect_eq(otok, samp_argmax(want, V), "%s: the prefill's token", what);
	cr_expect_eq(eng_seq_len(e, s), np + k);

	/* (3) keep draft[0] only (as if draft[1] was rejected), then two other tokens x, y in
	 * one item of two rows, beside the other sequence decoding (every row an output): the
	 * logits after x and y must be those of prompt + draft[0] + x + y alone, not seeing the
	 * rest */
	int kept[3] = {draft[0], (draft[1] + 5) % V, (draft[2] + 7) % V};
	cr_assert_eq(eng_seq_truncate(e, s, np + 1), WK_OK);
	cr_expect_eq(eng_seq_len(e, s), np + 1);
	float *after = malloc(sizeof(float) * 2 * (size_t)V);
	it[0] = (struct eng_item){.seq = s, .tokens = kept + 1, .n = 2, .logits = after,
				  .token = tok, .rows = 2};
	it[1] = (struct eng_item){.seq = other, .tokens = draft, .n = 1, .logits = olg};
	cr_assert_eq(eng_step(e, it, 2, err, sizeof err), WK_OK, "%s", err);
	cr_expect_leq(rel(olg, want + V, V), 1e-4, "%s: the decode beside it", what);
	float *alone = malloc(sizeof(float) * 4 * (size_t)V);
	one_at_a_time(e, prompt, np, kept, 3, alone);
	d = worst(after, alone + 2 * (size_t)V, 2, V);
	cr_expect_leq(d, 1e-4, "%s: after a truncation: %g", what, d);
	cr_expect_eq(tok[1], samp_argmax(alone + 3 * (size_t)V, V), "%s", what);
	/* and the truncated-away logits really were different (the check can fail) */
	cr_expect_gt(rel(after, want + 2 * (size_t)V, V), 1e-3, "%s", what);
	cr_expect_eq(eng_seq_len(e, s), np + 3);

	/* (4) sampled: the rows' tokens are samp_pick_draft's on the logits one at a time, each
	 * row's draft kept or replaced by its two draws, the last row an ordinary pick; with
	 * top_p (the draft rule on the host, over the device's candidates where there is a
	 * device) and with temperature alone (on a device, the rule where the logits are). The
	 * drafts are the greedy tokens after draft[0], so that they are likely and some are
	 * kept (an unlikely draft is never kept, and its row is the ordinary pick). */
	float *gl = malloc(sizeof(float) * (size_t)(k + 1) * V);
	int gd[16], held = 0;
	gd[0] = draft[0];
	int s3;
	cr_assert_eq(eng_seq_alloc(e, &s3), WK_OK);
	it[0] = (struct eng_item){.seq = s3, .tokens = prompt, .n = np};
	cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s", err);
	for (int j = 0; j < k; j++) {
		it[0] = (struct eng_item){.seq = s3, .tokens = &gd[j], .n = 1,
					  .logits = gl + (size_t)j * V};
		cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s", err);
		if (j + 1 < k)
			gd[j + 1] = samp_argmax(gl + (size_t)j * V, V);
	}
	eng_seq_free(e, s3);
	struct samp_cand *scr = malloc(sizeof *scr * (size_t)V);
	for (int f = 0; f < 2; f++) {
		int s2;
		cr_assert_eq(eng_seq_alloc(e, &s2), WK_OK);
		struct samp_cfg cfg = {f ? 1.3f : 0.9f, f ? 1 : 0.95f, 0, 0};
		double u[32];
		for (int j = 0; j < 2 * k; j++)
			u[j] = (j * 0.37 + 0.11 + f * 0.2) - (int)(j * 0.37 + 0.11 + f * 0.2);
		it[0] = (struct eng_item){.seq = s2, .tokens = prompt, .n = np};
		cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s", err);
		it[0] = (struct eng_item){.seq = s2, .tokens = gd, .n = k, .token = tok, .rows = k,
					  .sample = {cfg.temperature, cfg.top_p, 0, 0.5, u}};
		cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s", err);
		for (int j = 0; j < k; j++) {
			const float *row = gl + (size_t)j * V;
			int w = j < k - 1 ? samp_pick_draft(row, V, &cfg, gd[j + 1], u[2 * j],
							    u[2 * j + 1], scr)
					  : samp_pick(row, V, &cfg, u[2 * j + 1], scr);
			cr_expect_eq(tok[j], w, "%s: sampled row %d (temperature %g, top_p %g)",
				     what, j, cfg.temperature, cfg.top_p);
			held += j < k - 1 && w == gd[j + 1];
		}
		eng_seq_free(e, s2);
	}
	cr_expect_gt(held, 0, "%s: no draft kept: the sampled rows' rule went unseen", what);
	free(scr);
	free(gl);

	/* refusals, before any work */
	it[0] = (struct eng_item){.seq = s, .tokens = draft, .n = 2, .token = tok, .rows = 3};
	cr_expect_eq(eng_step(e, it, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "outputs for 3 of its 2 tokens"), "%s", err);
	it[0].rows = 2;
	it[0].sample = (struct eng_sample){.temperature = 0.8f, .top_p = 1, .u = 0.5};
	cr_expect_eq(eng_step(e, it, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "sampled tokens for 2 rows without their draws"), "%s", err);
	cr_expect_eq(eng_seq_len(e, s), np + 3, "a refused step ran nothing");
	cr_expect_eq(eng_seq_truncate(e, s, np + 4), WK_EINVAL);
	cr_expect_eq(eng_seq_truncate(e, s, -1), WK_EINVAL);
	cr_expect_eq(eng_seq_truncate(e, 7, 0), WK_EINVAL);
	eng_seq_free(e, s);
	eng_seq_free(e, other);
	free(want);
	free(got);
	free(olg);
	free(after);
	free(alone);
}

static struct engine *open_on(const char *dir, const struct backend *be)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 4,
			     .kv_dtype = kv_opt, .backend_ops = be};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	return e;
}

static const struct backend *const backends[] = {NULL, &be_devsim};
static const char *const backend_names[] = {"cpu", "devsim"};

Test(verify, stories260k)
{
	char *dir = mkdir_tmp(), bin[512], tok[512], err[WK_ERRSZ], what[64];
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "%s", err);
	const char *kv[] = {NULL, "bf16", "fp8"};
	int prompt[] = {1, 403, 407, 261, 378}, draft[] = {30, 411, 300, 261, 42};
	for (int b = 0; b < 2; b++)
		for (int i = 0; i < 3; i++) {
			kv_opt = kv[i];
			struct engine *e = open_on(dir, backends[b]);
			snprintf(what, sizeof what, "stories260K, %s, %s cache", backend_names[b],
				 eng_info(e)->kv_dtype);
			rows_and_truncate(e, prompt, 5, draft, 5, what);
			eng_close(e);
		}
	kv_opt = NULL;
	rm_rf(dir);
	free(dir);
}

/* GLM-5 with index_topk 4: the drafts' positions are past it, so the indexer selects, and a
 * forgotten draft's indexer key must not be selected afterwards. */
Test(verify, glm5)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 99, .bias_std = 0.1f};
	write_glm5(dir, &d);
	for (int b = 0; b < 2; b++) {
		struct engine *e = open_on(dir, backends[b]);
		rows_and_truncate(e, ids, 6, ids + 6, 4, backend_names[b]);
		eng_close(e);
	}
	rm_rf(dir);
	free(dir);
}

Test(verify, glm4)
{
	char *dir = mkdir_tmp();
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	struct engine *e = open_on(dir, NULL);
	rows_and_truncate(e, ids, 5, ids + 5, 6, "glm4");
	eng_close(e);
	rm_rf(dir);
	free(dir);
}
