/*
 * sampler.h - choose the next token from logits: greedy, temperature, top-k, top-p.
 *
 * Deterministic: the same seed and the same logits give the same tokens. Order of the
 * filters (as in Hugging Face's generate): temperature, then top-k, then top-p.
 * A sampler is owned by one sequence; not thread-safe.
 */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

struct samp_cfg {
	float temperature; /* <= 0: greedy (argmax, lowest id on ties) */
	float top_p;       /* (0, 1]; 1 disables */
	int top_k;         /* <= 0 disables */
	uint64_t seed;
};

struct sampler;

/* Returns NULL when out of memory or when vocab <= 0. */
struct sampler *samp_create(int vocab, const struct samp_cfg *cfg);
void samp_free(struct sampler *s); /* NULL is fine */

/* Picks a token id in [0, vocab). logits is read, and left unchanged. */
int samp_next(struct sampler *s, const float *logits);

/* The index of the largest logit (lowest index on ties). */
int samp_argmax(const float *logits, int n);

#endif
