#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

struct cand {
	float p;
	int id;
};

struct sampler {
	int vocab;
	struct samp_cfg cfg;
	uint64_t rng;
	struct cand *c; /* [vocab] scratch */
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

static int by_prob_desc(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return x->id - y->id;
}

int samp_next(struct sampler *s, const float *logits)
{
	int v = s->vocab;
	if (s->cfg.temperature <= 0)
		return samp_argmax(logits, v);

	float mx = logits[samp_argmax(logits, v)];
	double sum = 0;
	for (int i = 0; i < v; i++) {
		float p = expf((logits[i] - mx) / s->cfg.temperature);
		s->c[i] = (struct cand){p, i};
		sum += p;
	}
	int n = v;

	if ((s->cfg.top_k > 0 && s->cfg.top_k < v) || (s->cfg.top_p > 0 && s->cfg.top_p < 1)) {
		qsort(s->c, (size_t)v, sizeof *s->c, by_prob_desc);
		if (s->cfg.top_k > 0 && s->cfg.top_k < n)
			n = s->cfg.top_k;
		sum = 0;
		for (int i = 0; i < n; i++)
			sum += s->c[i].p;
		if (s->cfg.top_p > 0 && s->cfg.top_p < 1) {
			/* Keep the smallest prefix whose mass reaches top_p (at least one). */
			double acc = 0;
			int keep = n;
			for (int i = 0; i < n; i++) {
				acc += s->c[i].p / sum;
				if (acc >= s->cfg.top_p) {
					keep = i + 1;
					break;
				}
			}
			n = keep;
			sum = 0;
			for (int i = 0; i < n; i++)
				sum += s->c[i].p;
		}
	}
	double r = uniform(&s->rng) * sum, acc = 0;
	for (int i = 0; i < n; i++) {
		acc += s->c[i].p;
		if (r < acc)
			return s->c[i].id;
	}
	return s->c[n - 1].id; /* rounding left r at the very top */
}
