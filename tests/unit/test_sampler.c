#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"

static void logits(float *l, int n)
{
	for (int i = 0; i < n; i++)
		l[i] = sinf((float)i * 1.7f) * 3.0f;
}

Test(sampler, greedy_is_argmax)
{
	float l[100];
	logits(l, 100);
	struct samp_cfg c = {.temperature = 0, .top_p = 1};
	struct sampler *s = samp_create(100, &c);
	cr_assert_eq(samp_next(s, l), samp_argmax(l, 100));
	samp_free(s);
	float tie[4] = {1, 5, 5, 0};
	cr_expect_eq(samp_argmax(tie, 4), 1);
}

Test(sampler, deterministic_for_a_seed)
{
	float l[100];
	logits(l, 100);
	struct samp_cfg c = {.temperature = 1.0f, .top_p = 0.95f, .top_k = 40, .seed = 123};
	struct sampler *a = samp_create(100, &c), *b = samp_create(100, &c);
	c.seed = 124;
	struct sampler *d = samp_create(100, &c);
	int differ = 0;
	for (int i = 0; i < 200; i++) {
		int x = samp_next(a, l), y = samp_next(b, l), z = samp_next(d, l);
		cr_assert_eq(x, y);
		differ += x != z;
	}
	cr_expect_gt(differ, 0);
	samp_free(a);
	samp_free(b);
	samp_free(d);
}

Test(sampler, top_k_and_top_p_restrict)
{
	float l[100];
	logits(l, 100);
	int best = samp_argmax(l, 100);
	struct samp_cfg c = {.temperature = 5.0f, .top_p = 1, .top_k = 1, .seed = 1};
	struct sampler *s = samp_create(100, &c);
	for (int i = 0; i < 50; i++)
		cr_assert_eq(samp_next(s, l), best);
	samp_free(s);
	c = (struct samp_cfg){.temperature = 1.0f, .top_p = 1e-6f, .seed = 2};
	s = samp_create(100, &c);
	for (int i = 0; i < 50; i++)
		cr_assert_eq(samp_next(s, l), best);
	samp_free(s);
	/* top_k 3: only the three largest logits ever come out */
	c = (struct samp_cfg){.temperature = 10.0f, .top_p = 1, .top_k = 3, .seed = 3};
	s = samp_create(100, &c);
	for (int i = 0; i < 300; i++) {
		int t = samp_next(s, l), above = 0;
		for (int j = 0; j < 100; j++)
			above += l[j] > l[t];
		cr_assert_lt(above, 3);
	}
	samp_free(s);
}

Test(sampler, follows_the_distribution)
{
	/* two tokens with logits 0 and ln 3: expect a 1:3 split */
	float l[2] = {0.0f, logf(3.0f)};
	struct samp_cfg c = {.temperature = 1.0f, .top_p = 1, .seed = 99};
	struct sampler *s = samp_create(2, &c);
	int ones = 0, n = 20000;
	for (int i = 0; i < n; i++)
		ones += samp_next(s, l);
	double frac = (double)ones / n;
	cr_expect(fabs(frac - 0.75) < 0.02, "got %f", frac);
	samp_free(s);
}

/* ---- the selection against the full sort ---- */

/* samp_next as it was before the selection: every candidate sorted. The reference the new
 * path must reproduce. */
struct old_cand {
	float p;
	int id;
};

static int old_by_prob_desc(const void *a, const void *b)
{
	const struct old_cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return x->id - y->id;
}

static int old_pick(const float *logits, int v, const struct samp_cfg *cfg, double u,
		    struct old_cand *c)
{
	float mx = logits[samp_argmax(logits, v)];
	double sum = 0;
	for (int i = 0; i < v; i++) {
		float p = expf((logits[i] - mx) / cfg->temperature);
		c[i] = (struct old_cand){p, i};
		sum += p;
	}
	int n = v;
	if ((cfg->top_k > 0 && cfg->top_k < v) || (cfg->top_p > 0 && cfg->top_p < 1)) {
		qsort(c, (size_t)v, sizeof *c, old_by_prob_desc);
		if (cfg->top_k > 0 && cfg->top_k < n)
			n = cfg->top_k;
		sum = 0;
		for (int i = 0; i < n; i++)
			sum += c[i].p;
		if (cfg->top_p > 0 && cfg->top_p < 1) {
			double acc = 0;
			int keep = n;
			for (int i = 0; i < n; i++) {
				acc += c[i].p / sum;
				if (acc >= cfg->top_p) {
					keep = i + 1;
					break;
				}
			}
			n = keep;
			sum = 0;
			for (int i = 0; i < n; i++)
				sum += c[i].p;
		}
	}
	double r = u * sum, acc = 0;
	for (int i = 0; i < n; i++) {
		acc += c[i].p;
		if (r < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}

static uint64_t rnd_state = 42;
static uint32_t rnd(void)
{
	rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rnd_state >> 33);
}
static float rnd01(void) { return (float)rnd() / 2147483648.0f; }

/* Random logits: smooth, spiky, or from a few levels (many exact ties). */
static void random_logits(float *l, int v)
{
	int kind = rnd() % 3;
	for (int i = 0; i < v; i++) {
		float x = rnd01();
		l[i] = kind == 0 ? x * 8 - 4 : kind == 1 ? (x < 0.01f ? 10 + x : x * 3) : (float)(rnd() % 5);
	}
}

static struct samp_cfg random_cfg(int v)
{
	static const float ps[] = {1, 0.9f, 0.5f, 0.99f, 1e-6f, 0.3f, 0.999999f, 0};
	struct samp_cfg c = {.temperature = 0.2f + 2 * rnd01(), .top_p = ps[rnd() % 8]};
	int k = rnd() % 5;
	c.top_k = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? 1 + (int)(rnd() % 50) : (int)(rnd() % (v + 2));
	c.seed = rnd();
	return c;
}

Test(sampler, selection_gives_the_full_sorts_tokens)
{
	int cases = 3000, draws = 0;
	float *l = malloc(6000 * sizeof *l);
	struct old_cand *oc = malloc(6000 * sizeof *oc);
	for (int t = 0; t < cases; t++) {
		int v = 1 + (int)(rnd() % (t % 10 == 0 ? 6000 : 300));
		random_logits(l, v);
		struct samp_cfg c = random_cfg(v);
		/* the same seed twice: samp_draw on one gives the draws samp_next makes on the
		 * other, one per call */
		struct sampler *s = samp_create(v, &c), *r = samp_create(v, &c);
		for (int d = 0; d < 4; d++, draws++) {
			double u = samp_draw(r);
			int want = old_pick(l, v, &c, u, oc), got = samp_next(s, l);
			cr_assert_eq(got, want, "case %d draw %d: vocab %d, T %g, top_k %d, top_p %g: %d, not %d",
				     t, d, v, c.temperature, c.top_k, c.top_p, got, want);
		}
		samp_free(s);
		samp_free(r);
	}
	free(l);
	free(oc);
	cr_log_info("%d draws over %d cases equal the full sort's", draws, cases);
}

Test(sampler, pick_from_candidates_equals_the_pick_from_logits)
{
	/* the candidates as a device would give them: the filter's prefix, a few past the cut */
	int v = 500;
	float l[500];
	struct samp_cand *scratch = malloc(v * sizeof *scratch);
	struct old_cand oc[500];
	for (int t = 0; t < 500; t++) {
		random_logits(l, v);
		struct samp_cfg c = random_cfg(v);
		double u = rnd01();
		float mx = l[samp_argmax(l, v)];
		double total = 0;
		for (int i = 0; i < v; i++) {
			oc[i] = (struct old_cand){expf((l[i] - mx) / c.temperature), i};
			total += oc[i].p;
		}
		bool top_k = c.top_k > 0 && c.top_k < v, top_p = c.top_p > 0 && c.top_p < 1;
		int m = v;
		double mass = total;
		if (top_k || top_p)
			qsort(oc, (size_t)v, sizeof *oc, old_by_prob_desc);
		if (top_k) {
			m = c.top_k;
			mass = 0;
			for (int i = 0; i < m; i++)
				mass += oc[i].p;
		}
		if (top_p) { /* keep up to 3 past the cut */
			double acc = 0;
			int keep = m;
			for (int i = 0; i < m; i++)
				if ((acc += oc[i].p / mass) >= c.top_p) {
					keep = i + 1;
					break;
				}
			m = keep + 3 < m ? keep + 3 : m;
		}
		struct samp_cand cand[500];
		for (int i = 0; i < m; i++)
			cand[i] = (struct samp_cand){oc[i].p, oc[i].id};
		cr_assert_eq(samp_pick_cand(cand, m, mass, c.top_p, u),
			     samp_pick(l, v, &c, u, scratch), "case %d", t);
	}
	free(scratch);
}

/* Speculative sampling (samp_pick_draft): whatever the draft, the token's distribution is the
 * pick's. Over a grid of (u_acc, u) the frequencies are computed exactly (no RNG, so the
 * check cannot be flaky): the grid's mean of each outcome against its probability after the
 * filters, for a draft that is likely, one that is rare, and one the filters drop. With
 * d < 0 it is samp_pick itself. */
Test(sampler, a_draft_leaves_the_distribution_as_it_is)
{
	enum { V = 12, G = 400 };
	float lg[V];
	for (int i = 0; i < V; i++)
		lg[i] = (float)(i % 5) * 0.7f - (float)i * 0.11f;
	struct samp_cand scratch[V];
	const struct samp_cfg cfgs[] = {{1.0f, 1, 0, 0}, {0.7f, 1, 5, 0}, {1.3f, 0.8f, 0, 0},
					{0.9f, 0.9f, 6, 0}};
	for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
		/* the probabilities after the filters: the pick's frequencies over a fine grid of u */
		double want[V] = {0};
		for (int j = 0; j < 20000; j++)
			want[samp_pick(lg, V, &cfgs[k], (j + 0.5) / 20000, scratch)] += 1.0 / 20000;
		int likely = 0, rare = -1, dropped = -1;
		for (int i = 0; i < V; i++) {
			if (want[i] > want[likely])
				likely = i;
			if (want[i] > 0 && (rare < 0 || want[i] < want[rare]))
				rare = i;
			if (want[i] == 0)
				dropped = i;
		}
		const int drafts[] = {likely, rare, dropped >= 0 ? dropped : likely};
		for (int t = 0; t < 3; t++) {
			double got[V] = {0};
			int kept = 0;
			for (int a = 0; a < G; a++)
				for (int b = 0; b < G; b++) {
					int x = samp_pick_draft(lg, V, &cfgs[k], drafts[t], (a + 0.5) / G,
								(b + 0.5) / G, scratch);
					got[x] += 1.0 / (G * G);
					kept += x == drafts[t];
				}
			for (int i = 0; i < V; i++)
				cr_expect(fabs(got[i] - want[i]) < 4e-3,
					  "cfg %zu, draft %d: token %d at %.4f, want %.4f", k, drafts[t],
					  i, got[i], want[i]);
			/* the draft is kept as often as it is likely: accepted, never resampled */
			cr_expect(fabs(kept / (double)(G * G) - want[drafts[t]]) < 4e-3);
		}
		for (int j = 0; j < 100; j++) {
			double u = (j + 0.25) / 100;
			cr_expect_eq(samp_pick_draft(lg, V, &cfgs[k], -1, 0.3, u, scratch),
				     samp_pick(lg, V, &cfgs[k], u, scratch));
		}
	}
}

/* The sampling candidates' reference with a draft and neither filter (kernels/cpu/cpu.h:
 * what a device sends for a drafted row of temperature alone, the draft rule applied where
 * the logits are): samp_pick_draft's token exactly, for every draw of a grid, drafts likely,
 * rare and random, on rows of 1 to 300 ids. */
Test(sampler, the_candidates_reference_keeps_a_draft_as_samp_pick_draft)
{
	static const int vocabs[] = {1, 2, 7, 300};
	int checks = 0, kept = 0;
	for (int c = 0; c < 4; c++) {
		int V = vocabs[c];
		float *l = malloc(sizeof(float) * V);
		struct samp_cand *scratch = malloc(sizeof *scratch * V);
		struct cpu_cand *work = malloc(sizeof *work * V), cand[1];
		uint64_t x = 88172645463325252ull + (uint64_t)c;
		int amax = 0, amin = 0;
		for (int j = 0; j < V; j++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			l[j] = (float)((x >> 11) * 0x1.0p-53) * 6.0f;
			amax = l[j] > l[amax] ? j : amax;
			amin = l[j] < l[amin] ? j : amin;
		}
		int drafts[] = {amax, amin, (int)(x % (uint64_t)V), V - 1};
		for (int k = 0; k < 4; k++)
			for (int a = 0; a < 40; a++)
				for (int b = 0; b < 40; b++) {
					double ua = (a + 0.5) / 40, u = (b + 0.5) / 40;
					float T = k == 1 ? 2.5f : 0.7f;
					struct cpu_samp s = {T, 1, 0, drafts[k] + 1, u, ua};
					struct cpu_cand_head h;
					cpu_ref_sample_cand(cand, &h, l, &s, 1, V, 1, work);
					struct samp_cfg cfg = {T, 1, 0, 0};
					int want = samp_pick_draft(l, V, &cfg, drafts[k], ua, u, scratch);
					cr_assert_eq(h.count, 1);
					cr_assert_eq(cand[0].id, want, "vocab %d draft %d draws %g %g: %d, "
						     "not %d", V, drafts[k], ua, u, cand[0].id, want);
					checks++;
					kept += want == drafts[k];
				}
		free(l);
		free(scratch);
		free(work);
	}
	cr_assert_gt(kept, 0);
	cr_assert_lt(kept, checks);
}
