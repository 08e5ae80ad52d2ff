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

/* Picks a token id in [0, vocab). logits is read, and left unchanged. Non-greedy, it is
 * samp_pick(logits, vocab, cfg, samp_draw(s), scratch): one draw per call. */
int samp_next(struct sampler *s, const float *logits);

/* ---- the draw and the pick apart, so that the candidates may come from anywhere (a device
 * that selected them where the logits are: backend.h's sample_cand) ----
 *
 * The pick, with p_i = expf((l_i - max l) / temperature) (f32) and the order "p descending,
 * then id ascending": without top_k and top_p the candidates are every id in id order; with
 * top_k (0 < top_k < vocab) the first top_k in that order, mass = their sum in that order;
 * else mass = the sum of all p in id order. With top_p in (0, 1) only the shortest prefix
 * whose running sum of p / mass reaches top_p is kept (all when none does). Then r = u *
 * (the sum of the kept p, in order), and the token is the first whose running sum passes r. */

struct samp_cand {
	float p;    /* unnormalised: expf((l - max) / temperature) */
	int32_t id;
};

/* The next uniform draw in [0, 1): the RNG advances exactly as one non-greedy samp_next. */
double samp_draw(struct sampler *s);

/* The pick above from the candidates c[0..m) (the filter's order: a prefix, in order, of the
 * candidates that holds at least the top_p-kept ones), mass as above, u from samp_draw. m > 0. */
int samp_pick_cand(const struct samp_cand *c, int m, double mass, float top_p, double u);

/* The pick from a whole logits row (cfg->temperature > 0): selects the candidates without
 * sorting the vocabulary (top_k: a selection, then a sort of those; top_p: a selection by
 * mass, then a sort of those). scratch: [vocab]. samp_next's result for the same draw. */
int samp_pick(const float *logits, int vocab, const struct samp_cfg *cfg, double u,
	      struct samp_cand *scratch);

/* Speculative sampling, for a row whose next token was drafted as d without the model (a
 * draft of probability 1, as prompt lookup's): d when u_acc * (the kept p's sum) < d's p
 * (0 when the filters drop d), else the pick above by u from the kept candidates without d.
 * Whatever d, the token has the pick's distribution exactly (so a draft costs nothing in
 * what comes out); with d < 0 it is the pick itself. u_acc, like u, from samp_draw. */
int samp_pick_cand_draft(const struct samp_cand *c, int m, double mass, float top_p, int d,
			 double u_acc, double u);
int samp_pick_draft(const float *logits, int vocab, const struct samp_cfg *cfg, int d,
		    double u_acc, double u, struct samp_cand *scratch);
/* The index of the largest logit (lowest index on ties). */
int samp_argmax(const float *logits, int n);

#endif
