#include <criterion/criterion.h>
#include <math.h>

#include "engine/sampler.h"

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
