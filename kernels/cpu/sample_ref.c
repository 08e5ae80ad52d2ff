/*
 * sample_ref.c - cpu_ref_sample_cand, the reference for the sampling candidates (contract in
 * cpu.h): the plain way, every candidate sorted. engine/sampler.c reaches the same list by
 * selection, and kernels/cuda/sample_kernels.cu by radix selects on the device. With neither
 * filter on, the list is the pick itself (samp_pick's arithmetic exactly).
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

static int by_prob_desc(const void *a, const void *b)
{
	const struct cpu_cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return (x->id > y->id) - (x->id < y->id);
}

/* One row: the list into cand[0..cap), its length (-1 past cap) and mass into *h. */
static void row_cand(struct cpu_cand *cand, struct cpu_cand_head *h, const float *l,
		     const struct cpu_samp *s, int vocab, int cap, struct cpu_cand *w)
{
	*h = (struct cpu_cand_head){0, 0, 0};
	if (!(s->temperature > 0))
		return;
	float mx = l[0];
	for (int j = 1; j < vocab; j++)
		if (l[j] > mx)
			mx = l[j];
	double total = 0;
	for (int j = 0; j < vocab; j++) {
		w[j] = (struct cpu_cand){expf((l[j] - mx) / s->temperature), j};
		total += w[j].p;
	}
	bool top_k = s->top_k > 0 && s->top_k < vocab, top_p = s->top_p > 0 && s->top_p < 1;
	int count = vocab;
	h->mass = total;
	if (!top_k && !top_p) { /* the pick itself, as samp_pick_cand_draft over the row in id
				  * order: with a draft, kept by u_acc or else skipped */
		int d = s->draft > 0 && s->draft <= vocab ? s->draft - 1 : -1;
		double pd = d >= 0 ? w[d].p : 0, r = s->u * (total - pd), acc = 0;
		int id = d >= 0 && s->u_acc * total < pd ? d : -1;
		for (int j = 0; j < vocab && id < 0; j++)
			if (j != d && r < (acc += w[j].p))
				id = j;
		if (id < 0) /* rounding left r at the very top: the last id (but d) */
			id = d == vocab - 1 && vocab > 1 ? vocab - 2 : vocab - 1;
		cand[0] = w[id];
		h->count = 1;
		return;
	}
	if (top_k || top_p)
		qsort(w, (size_t)vocab, sizeof *w, by_prob_desc);
	if (top_k) {
		count = s->top_k;
		h->mass = 0;
		for (int j = 0; j < count; j++)
			h->mass += w[j].p;
	}
	if (top_p) {
		double need = fmin(h->mass, (s->top_p + CPU_CAND_SLACK) * h->mass), acc = 0;
		for (int j = 0; j < count; j++)
			if ((acc += w[j].p) >= need) {
				count = j + 1;
				break;
			}
	}
	h->count = count > cap ? -1 : count;
	for (int j = 0; j < count && j < cap; j++)
		cand[j] = w[j];
}

void cpu_ref_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head, const float *logits,
			 const struct cpu_samp *s, int n, int vocab, int cap,
			 struct cpu_cand *work)
{
	for (int i = 0; i < n; i++)
		row_cand(cand + (size_t)i * cap, head + i, logits + (size_t)i * vocab, s + i, vocab,
			 cap, work);
}
