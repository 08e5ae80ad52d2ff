/*
 * test_cuda_sample.c - the sampling candidates (sample_kernels.cu) against
 * kernels/cpu/sample_ref.c and samp_pick, as test_cuda.c does for the core kernels.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/wk.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

/* ---- sampling candidates (sample_kernels.cu against kernels/cpu/sample_ref.c) -------------- */

/* Row logits of one of four kinds: smooth, one spike over noise, a few levels (exact ties in
 * p), or flat (every p equal: top_p keeps a share of the whole vocabulary). */
static void cand_logits(float *l, int vocab, int kind)
{
	for (int j = 0; j < vocab; j++) {
		float x = rnd();
		l[j] = kind == 0 ? 4 * x : kind == 1 ? (j == vocab / 3 ? 9 : x) : kind == 2 ? (float)rnd_int(4) : 0.5f;
	}
}

/* The filter's whole list for row l (top_p off; cap: all of it) into w[0..vocab), sorted as
 * the reference sorts; its length. work: vocab more candidates. */
static int whole_list(struct cpu_cand *w, double *mass, const float *l, int vocab,
		      const struct cpu_samp *s)
{
	if (!(s->top_k > 0 && s->top_k < vocab)) { /* every id in id order (the reference picks) */
		float mx = l[0];
		for (int j = 1; j < vocab; j++)
			mx = l[j] > mx ? l[j] : mx;
		*mass = 0;
		for (int j = 0; j < vocab; j++) {
			w[j] = (struct cpu_cand){expf((l[j] - mx) / s->temperature), j};
			*mass += w[j].p;
		}
		return vocab;
	}
	struct cpu_cand_head h;
	struct cpu_samp all = {s->temperature, 1, s->top_k, 0, 0, 0};
	cpu_ref_sample_cand(w, &h, l, &all, 1, vocab, vocab, w + vocab);
	*mass = h.mass;
	return h.count;
}

/* Whether a running sum of row l's list lands within margin (relative to its mass) of the
 * share `share` of the mass: a cut there may fall on either side, summed in another order. */
static bool near_cut(const float *l, int vocab, const struct cpu_samp *s, double share,
		     double margin, struct cpu_cand *w)
{
	double mass, acc = 0;
	int n = whole_list(w, &mass, l, vocab, s);
	for (int j = 0; j < n; j++)
		if (fabs((acc += w[j].p) / mass - share) <= margin)
			return true;
	return false;
}

/* Whether draw u is within margin of a boundary of the host's pick for row l: a cumulative
 * share of the kept candidates, or a top_p cut that is itself near (then the kept set may be
 * one longer or shorter). */
static bool near_boundary(const float *l, int vocab, const struct cpu_samp *s, double u,
			  double margin, struct cpu_cand *w)
{
	bool top_p = s->top_p > 0 && s->top_p < 1;
	if (top_p && near_cut(l, vocab, s, s->top_p, margin, w))
		return true;
	double mass, acc = 0;
	int n = whole_list(w, &mass, l, vocab, s);
	if (top_p)
		for (int j = 0; j < n; j++)
			if ((acc += w[j].p / mass) >= s->top_p) {
				n = j + 1;
				break;
			}
	double sum = 0;
	for (int j = 0; j < n; j++)
		sum += w[j].p;
	acc = 0;
	for (int j = 0; j < n; j++)
		if (fabs((acc += w[j].p) / sum - u) < margin)
			return true;
	return false;
}

/* The kernel against the reference on random rows (every filter, ties, top_k 1, top_p tiny,
 * lists past the cap): the same list in the same order (ids may swap only between p within
 * 1e-6: a GPU's expf differs from the host's in the last bits), the same mass within 1e-6, the
 * same count but where the top_p target is within 1e-9 of a running sum; then the token the
 * pick makes from the device's list equals samp_pick's from the row for 16 draws each, but
 * where the draw is within 1e-5 of a boundary (counted). With neither filter, the list is the
 * pick made with the row's draw: the reference's is samp_pick's token exactly, the device's
 * too but within 1e-5 of a boundary, whatever the cap (a vocabulary of 3,000 with cap 16). */
Test(cuda_kernels, sample_cand_matches_ref)
{
	NEED_GPU();
	static const int vocabs[] = {1, 7, 300, 1000, 3000};
	static const float temps[] = {0, 0.3f, 1, 2.5f};
	static const float top_ps[] = {1, 0.9f, 0.5f, 1e-6f, 0.999999f, 0};
	enum { ROWS = 4, DRAWS = 16 };
	int rows = 0, overflows = 0, draws = 0, near = 0, near_differ = 0, picks = 0;
	for (int c = 0; c < 60; c++) {
		int vocab = vocabs[c % 5], cap = c % 3 == 0 ? 16 : WK_CUDA_CAND_MAX;
		float *l = malloc((size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp s[ROWS];
		for (int i = 0; i < ROWS; i++) {
			cand_logits(l + (size_t)i * vocab, vocab, (c + i) % 4);
			int ks[] = {0, 1, 5, 40, vocab - 1, vocab, vocab + 5, 2000};
			s[i] = (struct cpu_samp){temps[rnd_int(4)], top_ps[rnd_int(6)], ks[rnd_int(8)],
						 0, (rnd() + 1.0) * 0.5, 0};
		}
		if (!(s[0].temperature > 0))
			s[0].temperature = 1;
		size_t cb = (size_t)ROWS * cap * sizeof(struct cpu_cand);
		struct cpu_cand *want = malloc(cb), *got = malloc(cb);
		struct cpu_cand *w = malloc((size_t)2 * vocab * sizeof *w);
		struct cpu_cand_head wh[ROWS], gh[ROWS];
		cpu_ref_sample_cand(want, wh, l, s, ROWS, vocab, cap, w);
		float *dl = to_dev(l, (size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp *ds = to_dev(s, sizeof s);
		struct cpu_cand *dc = dev_alloc(cb);
		struct cpu_cand_head *dh = dev_alloc(sizeof gh);
		cr_assert_eq(wk_cuda_sample_cand(dc, dh, dl, ds, ROWS, vocab, cap, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(gh, dh, sizeof gh);
		from_dev(got, dc, cb);
		for (int i = 0; i < ROWS; i++, rows++) {
			const float *li = l + (size_t)i * vocab;
			const struct cpu_cand *wc = want + (size_t)i * cap, *gc = got + (size_t)i * cap;
			char tag[128];
			snprintf(tag, sizeof tag, "case %d row %d (vocab %d cap %d, T %g top_k %d top_p %g)",
				 c, i, vocab, cap, s[i].temperature, s[i].top_k, s[i].top_p);
			if (!(s[i].temperature > 0)) {
				cr_assert_eq(gh[i].count, 0, "%s", tag);
				continue;
			}
			cr_assert(fabs(gh[i].mass - wh[i].mass) <= 1e-6 * wh[i].mass,
				  "%s: mass %.17g, not %.17g", tag, gh[i].mass, wh[i].mass);
			struct samp_cfg cfg = {s[i].temperature, s[i].top_p, s[i].top_k, 0};
			if (!(s[i].top_k > 0 && s[i].top_k < vocab) &&
			    !(s[i].top_p > 0 && s[i].top_p < 1)) { /* the pick, with s[i].u */
				int tw = samp_pick(li, vocab, &cfg, s[i].u, (struct samp_cand *)w);
				cr_assert(wh[i].count == 1 && wc[0].id == tw, "%s: the reference picks "
					  "%d (count %d), samp_pick %d", tag, wc[0].id, wh[i].count, tw);
				cr_assert_eq(gh[i].count, 1, "%s", tag);
				bool nb = near_boundary(li, vocab, &s[i], s[i].u, 1e-5, w);
				near += nb;
				near_differ += nb && gc[0].id != tw;
				picks++;
				cr_assert(gc[0].id == tw || nb, "%s: draw %.17g gives %d, not %d", tag,
					  s[i].u, gc[0].id, tw);
				continue;
			}
			if (gh[i].count != wh[i].count) {
				double share = fmin(1, s[i].top_p + CPU_CAND_SLACK);
				cr_assert(s[i].top_p > 0 && s[i].top_p < 1 &&
						  near_cut(li, vocab, &s[i], share, 1e-9, w),
					  "%s: count %d, not %d", tag, gh[i].count, wh[i].count);
			}
			overflows += gh[i].count < 0;
			int m = gh[i].count < wh[i].count ? gh[i].count : wh[i].count;
			for (int j = 0; j < m; j++)
				cr_assert(gc[j].id == wc[j].id || fabsf(gc[j].p - wc[j].p) <= 1e-6f * wc[j].p,
					  "%s: candidate %d is id %d p %.9g, not id %d p %.9g", tag, j,
					  gc[j].id, gc[j].p, wc[j].id, wc[j].p);
			if (gh[i].count <= 0)
				continue;
			for (int d = 0; d < DRAWS; d++, draws++) {
				double u = (rnd() + 1.0) * 0.5;
				int tg = samp_pick_cand((const struct samp_cand *)gc, gh[i].count,
							gh[i].mass, s[i].top_p, u);
				int tw = samp_pick(li, vocab, &cfg, u, (struct samp_cand *)w);
				bool nb = near_boundary(li, vocab, &s[i], u, 1e-5, w);
				near += nb;
				near_differ += nb && tg != tw;
				cr_assert(tg == tw || nb, "%s: draw %.17g gives %d, not %d", tag, u, tg, tw);
			}
		}
		wk_cuda_free(dl);
		wk_cuda_free(ds);
		wk_cuda_free(dc);
		wk_cuda_free(dh);
		free(l);
		free(want);
		free(got);
		free(w);
	}
	cr_assert_gt(overflows, 0, "no row overflowed its cap");
	cr_assert_gt(picks, 20, "too few rows with neither filter");
	cr_log_info("sample_cand: %d rows, %d past the cap, %d picked on the device; %d draws "
		    "give samp_pick's token but %d of the %d within 1e-5 of a boundary", rows,
		    overflows, picks, draws + picks, near_differ, near);
}

/* With a draft and neither filter the kernel applies speculative sampling's rule where the
 * logits are (one candidate crosses, not the row): on random rows (vocabularies of 2 to
 * 3,000, drafts likely, rare and random, many draws), its token is the reference's (which
 * is samp_pick_draft's exactly: test_sampler.c), but where a draw is within 1e-5 of a
 * boundary: of keeping the draft (u_acc against p_d / mass), or of the pick among the other
 * ids (u against their running shares). */
Test(cuda_kernels, sample_cand_keeps_a_draft_as_the_reference)
{
	NEED_GPU();
	static const int vocabs[] = {2, 7, 300, 3000};
	enum { ROWS = 8 };
	int checks = 0, near = 0, kept = 0;
	for (int c = 0; c < 16; c++) {
		int vocab = vocabs[c % 4];
		float *l = malloc((size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp s[ROWS];
		for (int i = 0; i < ROWS; i++) {
			float *li = l + (size_t)i * vocab;
			cand_logits(li, vocab, (c + i) % 3);
			int amax = 0, amin = 0;
			for (int j = 1; j < vocab; j++) {
				amax = li[j] > li[amax] ? j : amax;
				amin = li[j] < li[amin] ? j : amin;
			}
			int d = i % 3 == 0 ? amax : i % 3 == 1 ? amin : rnd_int(vocab);
			s[i] = (struct cpu_samp){i % 2 ? 0.6f : 1.5f, 1, 0, d + 1, (rnd() + 1.0) * 0.5,
						 (rnd() + 1.0) * 0.5};
		}
		struct cpu_cand want[ROWS], got[ROWS], *w = malloc((size_t)vocab * sizeof *w);
		struct cpu_cand_head wh[ROWS], gh[ROWS];
		cpu_ref_sample_cand(want, wh, l, s, ROWS, vocab, 1, w);
		float *dl = to_dev(l, (size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp *ds = to_dev(s, sizeof s);
		struct cpu_cand *dc = dev_alloc(sizeof got);
		struct cpu_cand_head *dh = dev_alloc(sizeof gh);
		cr_assert_eq(wk_cuda_sample_cand(dc, dh, dl, ds, ROWS, vocab, 1, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(gh, dh, sizeof gh);
		from_dev(got, dc, sizeof got);
		for (int i = 0; i < ROWS; i++, checks++) {
			const float *li = l + (size_t)i * vocab;
			int d = s[i].draft - 1;
			cr_assert(wh[i].count == 1 && gh[i].count == 1);
			kept += want[i].id == d;
			if (got[i].id == want[i].id)
				continue;
			/* a boundary within 1e-5: keeping the draft, or the pick among the others */
			float mx = li[0];
			for (int j = 1; j < vocab; j++)
				mx = li[j] > mx ? li[j] : mx;
			double mass = 0, pd = expf((li[d] - mx) / s[i].temperature), acc = 0;
			for (int j = 0; j < vocab; j++)
				mass += expf((li[j] - mx) / s[i].temperature);
			bool nb = fabs(s[i].u_acc - pd / mass) < 1e-5;
			for (int j = 0; j < vocab && !nb; j++)
				if (j != d) {
					acc += expf((li[j] - mx) / s[i].temperature);
					nb = fabs(acc / (mass - pd) - s[i].u) < 1e-5;
				}
			cr_assert(nb, "case %d row %d (vocab %d, draft %d, draws %.17g %.17g): %d, "
				  "not %d", c, i, vocab, d, s[i].u_acc, s[i].u, got[i].id, want[i].id);
			near++;
		}
		wk_cuda_free(dl);
		wk_cuda_free(ds);
		wk_cuda_free(dc);
		wk_cuda_free(dh);
		free(l);
		free(w);
	}
	cr_assert_gt(kept, 0, "no draft kept");
	cr_assert_lt(kept, checks, "every draft kept");
	cr_log_info("sample_cand with drafts: %d rows, %d drafts kept, %d differ within 1e-5 of "
		    "a boundary", checks, kept, near);
}
