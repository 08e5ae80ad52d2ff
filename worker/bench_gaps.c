/*
 * bench_gaps.c - what `wick bench prepare` and `wick bench http` share: a real worker runs
 * steady jobs decoding while big ones arrive, once without a helper thread and once with it,
 * and the gaps the steady jobs saw (between two steps, or two chunks of a stream) are
 * reported side by side: their flags, the big jobs' text, and the table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/job.h"

int bench_load_flag(struct bench_load *l, int ch, const char *arg, const char *who)
{
	if (ch == 'B' || ch == 'T') {
		*(ch == 'B' ? &l->backend : &l->threads) = arg;
		return 0;
	}
	if (!strchr("cnbker", ch))
		return 2;
	char *end;
	long v = strtol(arg, &end, 10);
	long hi = ch == 'k' ? (JOB_PROMPT_MAX >> 10) - 1 : ch == 'n' ? 100000 : 1000;
	if (end == arg || *end || v < 1 || v > hi) {
		fprintf(stderr, "wick bench %s: -%c wants a number from 1 to %ld, not '%s'\n", who,
			ch, hi, arg);
		return 2;
	}
	*(ch == 'c' ? &l->steady : ch == 'n' ? &l->tokens : ch == 'b' ? &l->big :
	  ch == 'k' ? &l->kb : ch == 'e' ? &l->every : &l->rounds) = (int)v;
	if (l->rounds > BENCH_ROUNDS_MAX)
		l->rounds = BENCH_ROUNDS_MAX;
	return 0;
}

int bench_load_model(struct bench_load *l, const char *model, const char *who, int max,
		     const char *what, struct tok **tk)
{
	l->model = model;
	*tk = NULL;
	if (l->steady + l->big > max) {
		fprintf(stderr, "wick bench %s: --steady and --big: at most %d %s\n", who, max,
			what);
		return 2;
	}
	char err[WK_ERRSZ];
	bool prepared;
	if (tok_load_dir(model, tk, &prepared, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench %s: %s\n", who, err);
		return 1;
	}
	return 0;
}

char *bench_filler(int kb)
{
	size_t n = (size_t)kb << 10, o = 0;
	char *f = malloc(n + 64);
	for (int i = 0; f && o < n; i++) /* words of a story, numbered: no piece repeats another */
		o += (size_t)snprintf(f + o, n + 64 - o, "The cat sat on mat %d and ran. ", i);
	if (f)
		f[n] = 0;
	return f;
}

void bench_gaps_of(double *t, size_t n, struct bench_gaps *g)
{
	g->median_ms = cmd_median(t, (int)n); /* (t sorted) */
	g->p99_ms = t[(size_t)((double)(n - 1) * 0.99)];
	g->max_ms = t[n - 1];
}

void bench_gaps_table(const char *const names[2], const char *count, const char *beside,
		      struct bench_gaps (*r)[BENCH_ROUNDS_MAX], int rounds, double longest[2])
{
	printf("%-24s %8s %8s %8s %8s %7s   %s\n", "", "median", "p99", "longest", count, "run s",
	       beside);
	for (int m = 0; m < 2; m++) {
		double v[5][BENCH_ROUNDS_MAX], md[5];
		for (int i = 0; i < rounds; i++) {
			v[0][i] = r[m][i].median_ms;
			v[1][i] = r[m][i].p99_ms;
			v[2][i] = r[m][i].max_ms;
			v[3][i] = (double)r[m][i].count;
			v[4][i] = r[m][i].run_s;
		}
		for (int k = 0; k < 5; k++)
			md[k] = cmd_median(v[k], rounds);
		longest[m] = md[2];
		printf("%-24s %8.2f %8.2f %8.2f %8.0f %7.2f %8lld\n", names[m], md[0], md[1], md[2],
		       md[3], md[4], r[m][rounds - 1].beside);
	}
}
