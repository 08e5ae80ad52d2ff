/*
 * The MTP layer's drafts (eng_item.drafts, engine/glm.c "MTP drafts") hold to one contract
 * whatever way the tokens came: the drafts after a sequence's committed tokens are the same
 * whether those tokens came one step at a time, through verification steps that kept some
 * drafts and forgot the rest (eng_seq_truncate), or as a prompt in chunks whose last position
 * waited for its next token, or in steps that drafted nothing but kept the layer's caches
 * (eng_item.mtp_cache); and a sequence's drafts do not depend on the other sequences in its
 * steps. The main model's outputs are the same with the MTP layer loaded as without.
 * tests/e2e/glm_reference.sh holds the drafts' logits to an independent float64 reference
 * (scripts/glm_ref.py --mtp); this file holds the engine to itself. Tiny GLM-5 (MLA, an
 * indexer that selects: index_topk 4) and GLM-4.5 (GQA) checkpoints from gen_glm --mtp, on
 * the CPU backend and on devsim (device memory the host cannot touch), and GLM-5 sharded.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "glm_test.h"
#include "tests/unit/devsim.h"
#include "worker/sched.h"

TestSuite(mtp);

enum { K = 3, STEPS = 12, NP = 6, MAXLEN = 40 };

static char err[WK_ERRSZ];

static struct engine *open_with(const char *dir, const struct backend *be, int mtp)
{
	struct engine *e;
	/* f32 caches: a bf16 cache rounds what a later step reads and not what the step that
	 * wrote it reads, so chunks would differ in the third digit */
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 4,
			     .backend_ops = be, .mtp = mtp, .kv_dtype = "f32"};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	return e;
}

/* What the drafts were after a committed length: their tokens and logits [K][V]. */
struct seen {
	bool set;
	int d[K];
	float *lg;
};

static void record(struct seen *s, int len, const int *d, const float *lg, int V)
{
	cr_assert(len < MAXLEN);
	s[len].set = true;
	memcpy(s[len].d, d, sizeof s[len].d);
	if (!s[len].lg)
		s[len].lg = malloc(sizeof(float) * K * V);
	memcpy(s[len].lg, lg, sizeof(float) * K * V);
}

/* The drafts after len committed tokens agree with want's (the same tokens; logits within
 * 1e-4 of the row's largest). Returns whether want had them. */
static bool agree(const struct seen *want, int len, const int *d, const float *lg, int V,
		  const char *what)
{
	if (!want[len].set)
		return false;
	for (int j = 0; j < K; j++) {
		double r = rel(lg + (size_t)j * V, want[len].lg + (size_t)j * V, V);
		cr_expect_leq(r, 1e-4, "%s: after %d tokens, draft %d's logits differ by %g", what,
			      len, j, r);
		cr_expect_eq(d[j], want[len].d[j], "%s: after %d tokens, draft %d is %d, not %d",
			     what, len, j, d[j], want[len].d[j]);
	}
	return true;
}

/* The checks on the model in dir, on backend be (NULL: cpu). */
static void consistent(const char *dir, const struct backend *be, const char *what)
{
	struct engine *e = open_with(dir, be, ENG_MTP_ON), *plain = open_with(dir, be, ENG_MTP_OFF);
	cr_assert_eq(eng_info(e)->mtp, 1, "%s: the MTP layer is loaded", what);
	cr_assert_eq(eng_info(e)->mtp_layers_skipped, 0);
	cr_assert_eq(eng_info(plain)->mtp, 0);
	cr_assert_eq(eng_info(plain)->mtp_layers_skipped, 1);
	int V = eng_info(e)->vocab;
	const int prompt[NP] = {3, 17, 42, 5, 20, 11};
	struct seen seen[MAXLEN] = {0};
	float *lg = malloc(sizeof(float) * K * V), *lg2 = malloc(sizeof(float) * K * V);
	float *main1 = malloc(sizeof(float) * V), *main2 = malloc(sizeof(float) * V);

	/* (1) one token a step, on both engines: the main model's logits the same; the drafts
	 * after each length recorded */
	int a, p, out[STEPS + 1], d[K], po;
	cr_assert_eq(eng_seq_alloc(e, &a), WK_OK);
	cr_assert_eq(eng_seq_alloc(plain, &p), WK_OK);
	for (int s = 0; s <= STEPS; s++) {
		const int *in = s ? &out[s - 1] : prompt;
		int n = s ? 1 : NP;
		struct eng_item it = {.seq = a, .tokens = in, .n = n, .logits = main1,
				      .token = &out[s], .drafts = K, .draft = d, .draft_logits = lg};
		struct eng_item ip = {.seq = p, .tokens = in, .n = n, .logits = main2, .token = &po};
		cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s: %s", what, err);
		cr_assert_eq(eng_step(plain, &ip, 1, err, sizeof err), WK_OK, "%s: %s", what, err);
		cr_expect_eq(rel(main1, main2, V), 0.0, "%s: step %d: the main logits moved", what, s);
		cr_expect_eq(out[s], po);
		/* the drafts follow the output token: NP + s + 1 tokens are then known */
		record(seen, NP + s + 1, d, lg, V);
		for (int j = 0; j < K; j++)
			cr_assert(d[j] >= 0 && d[j] < V && d[j] == samp_argmax(lg + (size_t)j * V, V),
				  "%s: draft %d is its logits' argmax", what, j);
	}
	/* the drafts are not the main model's next tokens (else nothing here would show that
	 * the MTP layer ran): on random weights they differ somewhere */
	int differ = 0;
	for (int s = 0; s + 1 <= STEPS; s++)
		differ += seen[NP + s + 1].d[0] != out[s + 1];
	cr_expect_gt(differ, 0, "%s: every first draft is the main model's token", what);

	/* (2) verification steps beside a sequence that prefills in two chunks and then decodes
	 * one token a step: drafts that are all right (the tokens of (1)), half right, all
	 * wrong; after each, the drafts must be (1)'s after the same length */
	int b, c;
	cr_assert_eq(eng_seq_alloc(e, &b), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &c), WK_OK);
	int tb[K + 1], ob[K + 1], db[K], oc, dc[K];
	/* step 0: b's prompt whole; c's first 4 tokens, no token wanted (its last position waits
	 * for its next token) */
	struct eng_item st[2] = {
		{.seq = b, .tokens = prompt, .n = NP, .token = ob, .drafts = K, .draft = db,
		 .draft_logits = lg},
		{.seq = c, .tokens = prompt, .n = 4}};
	cr_assert_eq(eng_step(e, st, 2, err, sizeof err), WK_OK, "%s", err);
	cr_assert(agree(seen, NP + 1, db, lg, V, what));
	int len_b = NP + 1, len_c = 4, cin[NP];
	memcpy(cin, prompt + 4, 2 * sizeof *cin);
	int n_c = 2, kept = 0, checked = 0;
	for (int s = 0; len_b + K + 1 <= NP + STEPS + 1; s++) {
		/* b verifies the tokens after its last output: (1)'s own next tokens for the first
		 * `good` of them, then a wrong one */
		int good = s % 3 == 0 ? K : s % 3 == 1 ? 1 : 0;
		tb[0] = ob[kept];
		for (int j = 0; j < K; j++) {
			int want = out[len_b - NP + j]; /* (1)'s token at position len_b + j */
			tb[j + 1] = j < good ? want : (want + 1) % V;
		}
		st[0] = (struct eng_item){.seq = b, .tokens = tb, .n = K + 1, .rows = K + 1,
					  .token = ob, .drafts = K, .draft = db, .draft_logits = lg};
		st[1] = (struct eng_item){.seq = c, .tokens = cin, .n = n_c, .token = &oc,
					  .drafts = K, .draft = dc, .draft_logits = lg2};
		cr_assert_eq(eng_step(e, st, 2, err, sizeof err), WK_OK, "%s", err);
		kept = 0;
		while (kept < K && ob[kept] == tb[kept + 1])
			kept++;
		cr_expect_eq(kept, good, "%s: (1)'s tokens are the argmaxes", what);
		len_b += kept + 1;
		cr_assert_eq(eng_seq_truncate(e, b, len_b - 1), WK_OK);
		checked += agree(seen, len_b, db, lg, V, what);
		len_c += n_c;
		checked += agree(seen, len_c + 1, dc, lg2, V, what);
		cin[0] = oc;
		n_c = 1;
	}
	cr_expect_geq(checked, 5, "%s: %d steps compared", what, checked);

	/* (3) steps in which nothing drafts, with mtp_cache (the scheduler's steps between
	 * drafts where drafts do not pay): the MTP layer's caches keep up all the same, so the
	 * drafts of the step after are (1)'s */
	int q, oq, dq[K];
	cr_assert_eq(eng_seq_alloc(e, &q), WK_OK);
	for (int s = 0; s <= STEPS; s++) {
		bool drafts = s == 0 || s % 4 == 3;
		struct eng_item it = {.seq = q, .tokens = s ? &out[s - 1] : prompt, .n = s ? 1 : NP,
				      .token = &oq, .drafts = drafts ? K : 0, .draft = dq,
				      .draft_logits = lg, .mtp_cache = !drafts};
		cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s: %s", what, err);
		cr_expect_eq(oq, out[s]);
		if (drafts && s > 0)
			cr_expect(agree(seen, NP + s + 1, dq, lg, V, what), "%s: step %d", what, s);
	}
	for (int i = 0; i < MAXLEN; i++)
		free(seen[i].lg);
	free(lg);
	free(lg2);
	free(main1);
	free(main2);
	eng_close(e);
	eng_close(plain);
}

static const struct backend *const backends[] = {NULL, &be_devsim};
static const char *const names[] = {"cpu", "devsim"};

Test(mtp, glm5_drafts_hold_whatever_way_the_tokens_came)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 11 --index-topk 4");
	for (int i = 0; i < 2; i++) {
		char what[64];
		snprintf(what, sizeof what, "glm5 on %s", names[i]);
		consistent(dir, backends[i], what);
	}
	rm_rf(dir);
	free(dir);
}

/* Sharded (tp 2, ep 2: four ranks on the CPU's collectives): the drafts are rank 0's, which
 * the other ranks read to run the MTP layer's next pass on their shards; the same contract,
 * and the same drafts as the unsharded engine's. */
Test(mtp, glm5_sharded_drafts_hold_and_match_unsharded)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 11 --index-topk 4"), *snap = mkdir_tmp();
	struct eng_snap_opts so = {.tp = 2, .ep = 2, .dtype = "keep", .mtp = true};
	cr_assert_eq(eng_snapshot(dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	consistent(snap, NULL, "glm5 tp2 ep2");
	/* against the unsharded engine, step by step */
	struct engine *one = open_with(dir, NULL, ENG_MTP_ON), *four = open_with(snap, NULL,
										  ENG_MTP_ON);
	int V = eng_info(one)->vocab, s1, s4, t1, t4, d1[K], d4[K];
	const int prompt[4] = {9, 1, 250, 33};
	float *l1 = malloc(sizeof(float) * K * V), *l4 = malloc(sizeof(float) * K * V);
	cr_assert_eq(eng_seq_alloc(one, &s1), WK_OK);
	cr_assert_eq(eng_seq_alloc(four, &s4), WK_OK);
	for (int s = 0; s < 6; s++) {
		struct eng_item a = {.seq = s1, .tokens = s ? &t1 : prompt, .n = s ? 1 : 4,
				     .token = &t1, .drafts = K, .draft = d1, .draft_logits = l1};
		struct eng_item b = {.seq = s4, .tokens = s ? &t4 : prompt, .n = s ? 1 : 4,
				     .token = &t4, .drafts = K, .draft = d4, .draft_logits = l4};
		cr_assert_eq(eng_step(one, &a, 1, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_step(four, &b, 1, err, sizeof err), WK_OK, "%s", err);
		cr_expect_eq(t1, t4);
		for (int j = 0; j < K; j++) {
			double r = rel(l4 + (size_t)j * V, l1 + (size_t)j * V, V);
			cr_expect_leq(r, 1e-4, "step %d draft %d: sharded logits differ by %g", s, j, r);
			cr_expect_eq(d1[j], d4[j], "step %d draft %d", s, j);
		}
	}
	free(l1);
	free(l4);
	eng_close(one);
	eng_close(four);
	rm_rf(snap);
	rm_rf(dir);
	free(snap);
	free(dir);
}

Test(mtp, glm4_drafts_hold_whatever_way_the_tokens_came)
{
	char *dir = gen_glm_dir("glm4", "--mtp --seed 12");
	consistent(dir, NULL, "glm4 on cpu");
	rm_rf(dir);
	free(dir);
}

Test(mtp, refusals_name_the_problem)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 11 --layers 2"), *bare = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_BF16, .seed = 1};
	write_glm5(bare, &d); /* an MTP layer without its decoder layer's tensors */
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 1, .max_seq = 32, .mtp = ENG_MTP_ON};
	int rc = eng_open(bare, &o, &e, err, sizeof err);
	cr_expect_neq(rc, WK_OK);
	cr_expect(strstr(err, "model.layers.3."), "the missing tensor is named: %s", err);
	/* auto on a model with one loads it; off leaves it */
	o.mtp = ENG_MTP_AUTO;
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(eng_info(e)->mtp, 1);
	int seq, tok, dr[17];
	cr_assert_eq(eng_seq_alloc(e, &seq), WK_OK);
	int ids3[3] = {1, 2, 3};
	struct eng_item it = {.seq = seq, .tokens = ids3, .n = 3, .token = &tok, .drafts = 17,
			      .draft = dr};
	cr_expect_eq(eng_step(e, &it, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "at most 16"), "%s", err);
	it.drafts = 2;
	it.token = NULL;
	cr_expect_eq(eng_step(e, &it, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "without token"), "%s", err);
	eng_close(e);
	o.mtp = ENG_MTP_OFF;
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_seq_alloc(e, &seq), WK_OK);
	it = (struct eng_item){.seq = seq, .tokens = ids3, .n = 3, .token = &tok, .drafts = 1,
			       .draft = dr};
	cr_expect_eq(eng_step(e, &it, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "no MTP layer is loaded"), "%s", err);
	eng_close(e);
	/* a snapshot made without --mtp: auto loads no MTP layer, on is refused naming it */
	char *snap = mkdir_tmp();
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .dtype = "keep"};
	cr_assert_eq(eng_snapshot(dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	o.mtp = ENG_MTP_AUTO;
	cr_assert_eq(eng_open(snap, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(eng_info(e)->mtp, 0);
	cr_expect_eq(eng_info(e)->mtp_layers_skipped, 1);
	eng_close(e);
	o.mtp = ENG_MTP_ON;
	cr_expect_neq(eng_open(snap, &o, &e, err, sizeof err), WK_OK);
	cr_expect(strstr(err, "holds no MTP layer (no model.layers.2.eh_proj.weight)"), "%s", err);
	rm_rf(snap);
	free(snap);
	/* a model without one: refused when asked for; auto and off load the same */
	char *none = gen_glm_dir("glm4", "--seed 3 --layers 2");
	o.mtp = ENG_MTP_ON;
	cr_expect_eq(eng_open(none, &o, &e, err, sizeof err), WK_EUNSUPPORTED);
	cr_expect(strstr(err, "has no MTP layer to draft with (num_nextn_predict_layers is 0)"),
		  "%s", err);
	o.mtp = ENG_MTP_AUTO;
	cr_assert_eq(eng_open(none, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(eng_info(e)->mtp, 0);
	eng_close(e);
	rm_rf(none);
	free(none);
	rm_rf(dir);
	rm_rf(bare);
	free(dir);
	free(bare);
}

/* ---- the scheduler drafting with it (worker/sched.h) ------------------------------------- */

struct got {
	struct sched_req *r[8];
};

static void got_done(void *ctx, struct sched_req *r)
{
	((struct got *)ctx)->r[r->id[0] - 'a'] = r;
}

enum { NREQ = 5 };

/* NREQ requests on e with speculation spec, a draft costing cost (fixed: the counts do not
 * depend on this machine's timing); the last two predict want[0] and want[1]'s outputs (NULL:
 * none). Returns the step log (malloc'd). */
static char *serve_batch(struct engine *e, int spec, int max_batch, double cost, struct got *g,
			 struct sched_req *const *want)
{
	static const int prompts[NREQ][6] = {{3, 17, 42, 5, 20, 11}, {7, 7, 7}, {250, 1, 99, 4},
					     {3, 17, 42, 5, 20, 11}, {7, 7, 7}};
	static const int np[NREQ] = {6, 3, 4, 6, 3}, max[NREQ] = {40, 57, 9, 40, 57};
	char *log;
	size_t len;
	FILE *lf = open_memstream(&log, &len);
	struct sched *s = sched_create(e, lf);
	cr_assert_eq(sched_set_speculate(s, spec), WK_OK);
	cr_assert_eq(sched_set_speculate_max_batch(s, max_batch), WK_OK);
	cr_assert_eq(sched_set_draft_cost(s, cost), WK_OK);
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *r = calloc(1, sizeof *r);
		snprintf(r->id, sizeof r->id, "%c", 'a' + i);
		r->prompt = malloc(sizeof prompts[i]);
		memcpy(r->prompt, prompts[i], sizeof prompts[i]);
		r->n_prompt = np[i];
		r->max_tokens = max[i];
		/* c is sampled with top_k 1: greedy in all but name */
		r->samp = (struct samp_cfg){.temperature = i == 2 ? 0.7f : 0, .top_p = 1,
					    .top_k = i == 2 ? 1 : 0, .seed = 4};
		if (i >= 3 && want) { /* the first 30 tokens after the first of a's or b's */
			const struct sched_req *w = want[i - 3];
			r->n_pred = w->n_out - 1 < 30 ? w->n_out - 1 : 30;
			r->pred = malloc(sizeof(int) * (size_t)r->n_pred);
			memcpy(r->pred, w->out + 1, sizeof(int) * (size_t)r->n_pred);
		}
		cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
	}
	while (sched_pending(s) > 0)
		cr_assert_geq(sched_step(s, got_done, g), 0);
	sched_free(s);
	fclose(lf);
	return log;
}

static char *serve(struct engine *e, int spec, struct got *g, struct sched_req *const *want)
{
	return serve_batch(e, spec, 0, 0.1, g, want); /* 0.1: as a GPU's step of a few tokens */
}

/* Frees two runs' requests and step logs. */
static void release(struct got *a, struct got *b, char *la, char *lb)
{
	for (int i = 0; i < NREQ; i++) {
		sched_req_free(a->r[i]);
		sched_req_free(b->r[i]);
	}
	free(la);
	free(lb);
}

Test(mtp, the_scheduler_drafts_with_it_and_the_output_stays)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 5 --index-topk 4");
	struct engine *e = open_with(dir, NULL, ENG_MTP_ON), *plain = open_with(dir, NULL,
										  ENG_MTP_OFF);
	struct got p = {0}, m = {0};
	char *plog = serve(plain, 0, &p, NULL);
	char *mlog = serve(e, 4, &m, p.r);
	int drafted = 0, accepted = 0;
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *a = p.r[i], *b = m.r[i];
		cr_assert(a && b);
		cr_expect_eq(b->status, SCHED_DONE);
		cr_expect(a->n_out == b->n_out && !memcmp(a->out, b->out, sizeof(int) * a->n_out),
			  "request %c: the tokens differ with MTP drafts", 'a' + i);
		cr_expect_gt(b->drafted, 0, "request %c drafted nothing", 'a' + i);
		cr_expect_leq(b->accepted, b->drafted);
		drafted += b->drafted;
		accepted += b->accepted;
	}
	/* d and e drafted from their predictions first (kept), then (e, whose prediction ends
	 * before its output) from the MTP layer */
	for (int i = 3; i < NREQ; i++)
		cr_expect_geq(m.r[i]->accepted, 10, "request %c kept %d of %d", 'a' + i,
			      m.r[i]->accepted, m.r[i]->drafted);
	cr_expect_gt(m.r[4]->drafted, m.r[4]->accepted + 5, "e: the MTP layer drafted after");
	cr_expect_null(strstr(plog, "\"draft\""));
	cr_expect_not_null(strstr(mlog, "\"draft\": "));
	fprintf(stderr, "mtp scheduler: kept %d of %d drafts\n", accepted, drafted);
	release(&p, &m, plog, mlog);
	eng_close(e);
	eng_close(plain);
	rm_rf(dir);
	free(dir);
}

/* An MTP layer that is always right (gen_glm --mtp-oracle: the model's next token depends on
 * its token alone, and the MTP layer computes the same function): the scheduler keeps nearly
 * every draft, so a greedy request of n tokens takes about n / (1 + K) steps, with the tokens
 * it gets without drafts; a sampled one with top_k 1 too. A draft the scheduler garbled, or
 * took from the wrong place, would be thrown away: this is where the drafter's wiring shows. */
Test(mtp, an_mtp_layer_that_is_right_saves_the_steps)
{
	char *dir = gen_glm_dir("glm5", "--mtp --mtp-oracle --seed 4 --index-topk 4");
	struct engine *e = open_with(dir, NULL, ENG_MTP_ON), *plain = open_with(dir, NULL,
										  ENG_MTP_OFF);
	struct got p = {0}, m = {0};
	char *plog = serve(plain, 0, &p, NULL), *mlog = serve(e, 3, &m, NULL);
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *a = p.r[i], *b = m.r[i];
		cr_expect(a->n_out == b->n_out && !memcmp(a->out, b->out, sizeof(int) * a->n_out),
			  "request %c: the tokens differ", 'a' + i);
		if (b->n_out < 8)
			continue;
		cr_expect_geq(b->accepted * 10, b->drafted * 9, "request %c kept %d of %d drafts",
			      'a' + i, b->accepted, b->drafted);
		/* up to 4 tokens a step (1 + 3 drafts), the first draft-free */
		cr_expect_leq(b->steps, 2 + b->n_out / 3, "request %c: %d steps for %d tokens",
			      'a' + i, b->steps, b->n_out);
		fprintf(stderr, "mtp oracle: request %c, %d tokens in %d steps (%d without), kept %d "
			"of %d\n", 'a' + i, b->n_out, b->steps, a->steps, b->accepted, b->drafted);
	}
	release(&p, &m, plog, mlog);
	eng_close(e);
	eng_close(plain);
	rm_rf(dir);
	free(dir);
}

/* sched_set_speculate_max_batch: no drafts in a step of more than 2 requests (the step log's
 * items), drafts again once fewer run, every one kept (the oracle), the same tokens. */
Test(mtp, no_drafts_in_a_big_batch)
{
	char *dir = gen_glm_dir("glm5", "--mtp --mtp-oracle --seed 4 --index-topk 4");
	struct engine *e = open_with(dir, NULL, ENG_MTP_ON);
	struct got p = {0}, m = {0};
	char *plog = serve(e, 0, &p, NULL), *mlog = serve_batch(e, 3, 2, 0.1, &m, NULL);
	for (int i = 0; i < NREQ; i++)
		cr_expect(p.r[i]->n_out == m.r[i]->n_out &&
				  !memcmp(p.r[i]->out, m.r[i]->out, sizeof(int) * p.r[i]->n_out),
			  "request %c: the tokens differ", 'a' + i);
	int big = 0, small = 0, drafted_big = 0, drafted_small = 0;
	for (char *line = strtok(mlog, "\n"); line; line = strtok(NULL, "\n")) {
		int items = 0, drafts = 0;
		for (char *q = strstr(line, "\"phase\""); q; q = strstr(q + 1, "\"phase\""))
			items++;
		for (char *q = strstr(line, "\"draft\": "); q; q = strstr(q + 1, "\"draft\": "))
			drafts++;
		*(items > 2 ? &big : &small) += 1;
		*(items > 2 ? &drafted_big : &drafted_small) += drafts > 0;
	}
	cr_expect_gt(big, 0);
	cr_expect_eq(drafted_big, 0, "%d steps of more than 2 requests drafted", drafted_big);
	cr_expect_gt(drafted_small, 0, "no step of 2 or fewer drafted (%d such steps)", small);
	int kept = 0, drafted = 0;
	for (int i = 0; i < NREQ; i++) {
		kept += m.r[i]->accepted;
		drafted += m.r[i]->drafted;
	}
	cr_expect_eq(kept, drafted, "kept %d of %d", kept, drafted);
	release(&p, &m, plog, mlog);
	eng_close(e);
	rm_rf(dir);
	free(dir);
}

/* Drafts where they pay (sched_set_draft_cost): where a draft costs half a step, drafts kept
 * a fifth of the time (this random MTP layer's) do not pay, and the requests stop drafting
 * but for a probe now and then; an MTP layer that is always right drafts all it may. The
 * same tokens either way. Without the plan (drafting on whatever is kept) a and b draft
 * about once a step. */
Test(mtp, drafts_that_do_not_pay_stop)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 5 --index-topk 4");
	char *odir = gen_glm_dir("glm5", "--mtp --mtp-oracle --seed 4 --index-topk 4");
	struct engine *e = open_with(dir, NULL, ENG_MTP_ON), *o = open_with(odir, NULL, ENG_MTP_ON);
	struct got p = {0}, m = {0}, op = {0}, om = {0};
	char *plog = serve(e, 0, &p, NULL), *mlog = serve_batch(e, 4, 0, 0.5, &m, NULL);
	char *oplog = serve(o, 0, &op, NULL), *omlog = serve_batch(o, 4, 0, 0.5, &om, NULL);
	for (int i = 0; i < NREQ; i++) {
		struct sched_req *a = p.r[i], *b = m.r[i];
		cr_expect(a->n_out == b->n_out && !memcmp(a->out, b->out, sizeof(int) * a->n_out),
			  "request %c: the tokens differ", 'a' + i);
		a = op.r[i], b = om.r[i];
		cr_expect(a->n_out == b->n_out && !memcmp(a->out, b->out, sizeof(int) * a->n_out),
			  "oracle request %c: the tokens differ", 'a' + i);
	}
	int drafted = 0, n_out = 0;
	for (int i = 0; i < 2; i++) { /* a and b: greedy, 15 and 57 tokens on this model */
		struct sched_req *b = m.r[i], *ob = om.r[i];
		cr_expect_gt(b->drafted, 0, "request %c: no probe", 'a' + i);
		drafted += b->drafted;
		n_out += b->n_out;
		cr_expect_eq(ob->accepted, ob->drafted);
		cr_expect_leq(ob->steps, 2 + ob->n_out / 4, "oracle request %c: %d steps for %d "
			      "tokens", 'a' + i, ob->steps, ob->n_out);
		fprintf(stderr, "drafts that pay: request %c drafted %d for %d tokens (kept %d); the "
			"oracle's %d in %d steps (kept %d of %d)\n", 'a' + i, b->drafted, b->n_out,
			b->accepted, ob->n_out, ob->steps, ob->accepted, ob->drafted);
	}
	cr_expect_geq(n_out, 60);
	cr_expect_leq(4 * drafted, n_out, "a and b drafted %d for %d tokens", drafted, n_out);
	release(&p, &m, plog, mlog);
	release(&op, &om, oplog, omlog);
	eng_close(e);
	eng_close(o);
	rm_rf(dir);
	rm_rf(odir);
	free(dir);
	free(odir);
}

/* The prefix cache with the MTP layer: the layer's row at position p is made from the token
 * at p + 1, so a sequence copied (or truncated) to a prefix that a prompt leaves at p + 1
 * holds a row of the other prompt's. The drafts then differ from a fresh prefill's; one
 * position fewer makes that row again and gives them. The scheduler reuses one fewer. */
Test(mtp, a_reused_prefix_makes_its_last_row_again)
{
	char *dir = gen_glm_dir("glm5", "--mtp --seed 5 --index-topk 4");
	struct engine *e = open_with(dir, NULL, ENG_MTP_ON);
	int V = eng_info(e)->vocab;
	const int x[NP] = {3, 17, 42, 5, 20, 11}, y[NP] = {3, 17, 42, 5, 99, 7};
	int a, t, d[K];
	float *lg[3];
	for (int i = 0; i < 3; i++)
		lg[i] = malloc(sizeof(float) * K * V);
	cr_assert_eq(eng_seq_alloc(e, &a), WK_OK);
	struct eng_item it = {.seq = a, .tokens = x, .n = NP, .token = &t, .drafts = K, .draft = d,
			      .draft_logits = lg[0]};
	cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s", err);
	/* [0]: a copy of 4 positions (x and y share them), [1]: of 3, [2]: y fresh */
	for (int i = 0; i < 3; i++) {
		int b, from = i == 2 ? 0 : 4 - i;
		cr_assert_eq(eng_seq_alloc(e, &b), WK_OK);
		if (from)
			cr_assert_eq(eng_seq_copy(e, b, a, from, err, sizeof err), WK_OK, "%s", err);
		it = (struct eng_item){.seq = b, .tokens = y + from, .n = NP - from, .token = &t,
				       .drafts = K, .draft = d, .draft_logits = lg[i]};
		cr_assert_eq(eng_step(e, &it, 1, err, sizeof err), WK_OK, "%s", err);
		eng_seq_free(e, b);
	}
	double stale = rel(lg[0], lg[2], K * V), again = rel(lg[1], lg[2], K * V);
	fprintf(stderr, "mtp: drafts after a reused prefix: %.2g from a fresh prefill's, %.2g with "
		"its last row made again\n", stale, again);
	cr_expect_gt(stale, 1e-3, "the stale row did not show (%g)", stale);
	cr_expect_leq(again, 1e-4);
	/* the scheduler: b shares 4 tokens with a's prompt and reuses 3 */
	struct sched *s = sched_create(e, NULL);
	cr_assert_eq(sched_set_speculate(s, 2), WK_OK);
	cr_assert_eq(sched_set_prefix_cache(s, true), WK_OK);
	struct got g = {0};
	for (int i = 0; i < 2; i++) {
		struct sched_req *r = calloc(1, sizeof *r);
		snprintf(r->id, sizeof r->id, "%c", 'a' + i);
		r->prompt = malloc(sizeof x);
		memcpy(r->prompt, i ? y : x, sizeof x);
		r->n_prompt = NP;
		r->max_tokens = 6;
		r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
		cr_assert_eq(sched_submit(s, r, err, sizeof err), WK_OK, "%s", err);
		while (sched_pending(s) > 0)
			cr_assert_geq(sched_step(s, got_done, &g), 0);
	}
	cr_expect_eq(g.r[0]->cached, 0);
	cr_expect_eq(g.r[1]->cached, 3, "%d cached", g.r[1]->cached);
	sched_req_free(g.r[0]);
	sched_req_free(g.r[1]);
	sched_free(s);
	for (int i = 0; i < 3; i++)
		free(lg[i]);
	eng_close(e);
	rm_rf(dir);
	free(dir);
}
