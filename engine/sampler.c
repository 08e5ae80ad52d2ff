#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

struct sampler {
	int vocab;
	struct samp_cfg cfg;
	uint64_t rng;
	struct samp_cand *c; /* [vocab] scratch */
};

struct sampler *samp_create(int vocab, const struct samp_cfg *cfg)
{
	if (vocab <= 0)
		return NULL;
	struct sampler *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->c = malloc((size_t)vocab * sizeof *s->c);
	if (!s->c) {
		free(s);
		return NULL;
	}
	s->vocab = vocab;
	s->cfg = *cfg;
	s->rng = cfg->seed;
	return s;
}

void samp_free(struct sampler *s)
{
	if (!s)
		return;
	free(s->c);
	free(s);
}

int samp_argmax(const float *logits, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

/* splitmix64: a full-period generator; 53 random bits make a double in [0, 1). */
static double uniform(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* The filters' order: p descending, then id ascending (a total order: ids differ). */
static int before(const struct samp_cand *x, const struct samp_cand *y)
{
	return x->p != y->p ? x->p > y->p : x->id < y->id;
}

static int by_prob_desc(const void *a, const void *b)
{
	return before(a, b) ? -1 : before(b, a);
}

double samp_draw(struct sampler *s)
{
	return uniform(&s->rng);
}

/* The top_p cut over c[0..m): the kept length, or -1 when the running sum of p / mass never
 * reaches top_p within m. */
static int top_p_cut(const struct samp_cand *c, int m, double mass, float top_p)
{
	double acc = 0;
	for (int i = 0; i < m; i++) {
		acc += c[i].p / mass;
		if (acc >= top_p)
			return i + 1;
	}
	return -1;
}

static bool top_p_on(float top_p)
{
	return top_p > 0 && top_p < 1;
}

int samp_pick_cand_draft(const struct samp_cand *c, int m, double mass, float top_p, int d,
			 double u_acc, double u)
{
	int n = m;
	if (top_p_on(top_p)) {
		int keep = top_p_cut(c, m, mass, top_p);
		n = keep > 0 ? keep : m;
	}
	double sum = 0, pd = 0;
	for (int i = 0; i < n; i++) {
		sum += c[i].p;
		if (c[i].id == d)
			pd = c[i].p;
	}
	if (pd > 0 && u_acc * sum < pd)
		return d;
	double r = u * (sum - pd), acc = 0;
	int last = -1;
	for (int i = 0; i < n; i++) {
		if (c[i].id == d)
			continue;
		acc += c[i].p;
		last = c[i].id;
		if (r < acc)
			return last;
	}
	return last >= 0 ? last : d; /* rounding left r at the very top (d alone kept: taken) */
}

int samp_pick_cand(const struct samp_cand *c, int m, double mass, float top_p, double u)
{
	return samp_pick_cand_draft(c, m, mass, top_p, -1, 0, u);
}

static void swap(struct samp_cand *a, struct samp_cand *b)
{
	struct samp_cand t = *a;
	*a = *b;
	*b = t;
}

/* Partitions c[lo..hi) (hi - lo >= 3) around a median-of-three pivot: returns q with
 * c[lo..q) before c[q] and c(q..hi) after it. */
static int partition(struct samp_cand *c, int lo, int hi)
{
	int mid = lo + (hi - lo) / 2;
	if (before(&c[hi - 1], &c[lo]))
		swap(&c[lo], &c[hi - 1]);
	if (before(&c[mid], &c[lo]))
		swap(&c[mid], &c[lo]);
	if (before(&c[hi - 1], &c[mid]))
		swap(&c[mid], &c[hi - 1]);
	swap(&c[mid], &c[hi - 1]); /* the median, out of the way */
	int q = lo;
	for (int i = lo; i < hi - 1; i++)
		if (before(&c[i], &c[hi - 1]))
			swap(&c[i], &c[q++]);
	swap(&c[q], &c[hi - 1]);
	return q;
}

/* Moves the first k of c[0..n) in the filters' order to c[0..k), in no order (quickselect:
 * O(n) expected; the order is total, so there are no equal keys to degrade it). */
static void select_k(struct samp_cand *c, int n, int k)
{
	int lo = 0, hi = n;
	while (hi - lo > 2) {
		int q = partition(c, lo, hi);
		if (q == k || q + 1 == k)
			return;
		if (q > k)
			hi = q;
		else
			lo = q + 1;
	}
	if (hi - lo == 2 && before(&c[lo + 1], &c[lo]))
		swap(&c[lo], &c[lo + 1]);
}

/* Moves to c[0..m) (in no order) the shortest head of c[0..n), in the filters' order, whose
 * p sum to at least need, and returns m (n when the whole sums to less). */
static int select_mass(struct samp_cand *c, int n, double need)
{
	int lo = 0, hi = n; /* c[0..lo) taken; the answer ends in (lo, hi] */
	while (hi - lo > 16) {
		int q = partition(c, lo, hi);
		double m = 0;
		for (int i = lo; i <= q; i++)
			m += c[i].p;
		if (m >= need) {
			hi = q + 1;
		} else {
			need -= m;
			lo = q + 1;
		}
	}
	qsort(c + lo, (size_t)(hi - lo), sizeof *c, by_prob_desc);
	for (double acc = 0; lo < hi; lo++) {
		acc += c[lo].p;
		if (acc >= need)
			return lo + 1;
	}
	return hi;
}

/* The top_p selection asks for this much more mass than top_p (relative to the whole), so
 * that the exact cut (top_p_cut, summing in another order) lands inside what was selected;
 * if it does not, the whole row is sorted. */
#define SELECT_SLACK 0x1p-20

int samp_pick_draft(const float *logits, int vocab, const struct samp_cfg *cfg, int d,
		    double u_acc, double u, struct samp_cand *c)
{
	float mx = logits[samp_argmax(logits, vocab)];
	double total = 0;
	for (int i = 0; i < vocab; i++) {
		float p = expf((logits[i] - mx) / cfg->temperature);
		c[i] = (struct samp_cand){p, i};
		total += p;
	}
	bool top_k = cfg->top_k > 0 && cfg->top_k < vocab, top_p = top_p_on(cfg->top_p);
	if (!top_k && !top_p)
		return samp_pick_cand_draft(c, vocab, total, 1, d, u_acc, u);
	if (top_k) { /* typically small: sorted whole, so mass sums in the filters' order */
		select_k(c, vocab, cfg->top_k);
		qsort(c, (size_t)cfg->top_k, sizeof *c, by_prob_desc);
		double mass = 0;
		for (int i = 0; i < cfg->top_k; i++)
			mass += c[i].p;
		return samp_pick_cand_draft(c, cfg->top_k, mass, cfg->top_p, d, u_acc, u);
	}
	/* top_p alone: mass sums in id order (the full sort summed in the filters' order; the two
	 * differ in the last bits only, which moves the cut only when the running sum lands that
	 * close to top_p). */
	int m = select_mass(c, vocab, fmin(total, (cfg->top_p + SELECT_SLACK) * total));
	qsort(c, (size_t)m, sizeof *c, by_prob_desc);
	if (m < vocab && top_p_cut(c, m, total, cfg->top_p) < 0) {
		qsort(c, (size_t)vocab, sizeof *c, by_prob_desc); /* never seen; correct anyway */
		m = vocab;
	}
	return samp_pick_cand_draft(c, m, total, cfg->top_p, d, u_acc, u);
}

int samp_pick(const float *logits, int vocab, const struct samp_cfg *cfg, double u,
	      struct samp_cand *c)
{
	return samp_pick_draft(logits, vocab, cfg, -1, 0, u, c);
}

int samp_next(struct sampler *s, const float *logits)
{
	if (s->cfg.temperature <= 0)
		return samp_argmax(logits, s->vocab);
	return samp_pick(logits, s->vocab, &s->cfg, samp_draw(s), s->c);
}
