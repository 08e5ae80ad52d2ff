/*
 * Engine tests on the real stories260K model, converted at test time.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/sampler.h"

static char dir[256];

static const char *shared(void)
{
	const char *s = getenv("WICK_SHARED");
	return s ? s : "../shared";
}

static void convert(void)
{
	char bin[512], tok[512], err[WK_ERRSZ];
	snprintf(dir, sizeof dir, "/tmp/wick-engine-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", shared());
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", shared());
	int rc = conv_llama2c(bin, tok, dir, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "convert: %s", err);
}

static void cleanup(void)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(engine, .init = convert, .fini = cleanup);

/* Prefill of n tokens at once, token-by-token decode through the KV cache, and per-position
 * logits must agree: they are the same function computed three ways. */
Test(engine, prefill_matches_decode)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	const struct eng_info *in = eng_info(e);
	cr_assert_eq(in->vocab, 512);
	cr_assert_eq(in->max_seq, 64);
	cr_assert_eq(in->bos, 1);
	cr_assert_eq(in->eos, 2);
	int ids[] = {1, 403, 407, 261, 378, 30, 411};
	int n = 7, V = in->vocab;
	float *all = malloc(sizeof(float) * n * V), *one = malloc(sizeof(float) * V);
	cr_assert_eq(eng_forward(e, ids, n, 0, all, true, err, sizeof err), WK_OK, "%s", err);
	float maxd = 0;
	for (int i = 0; i < n; i++) {
		cr_assert_eq(eng_forward(e, ids + i, 1, i, one, false, err, sizeof err), WK_OK);
		for (int v = 0; v < V; v++) {
			float d = fabsf(one[v] - all[(size_t)i * V + v]);
			cr_assert(isfinite(one[v]));
			if (d > maxd)
				maxd = d;
		}
	}
	cr_expect_lt(maxd, 1e-4f, "prefill vs decode differ by %g", maxd);
	/* A prefix split in two chunks lands in the same place. */
	float *last = malloc(sizeof(float) * V);
	cr_assert_eq(eng_forward(e, ids, 3, 0, last, false, err, sizeof err), WK_OK);
	cr_assert_eq(eng_forward(e, ids + 3, 4, 3, last, false, err, sizeof err), WK_OK);
	for (int v = 0; v < V; v++)
		cr_expect_lt(fabsf(last[v] - all[(size_t)6 * V + v]), 1e-4f);
	free(all);
	free(one);
	free(last);
	eng_close(e);
}

Test(engine, greedy_story_tokens)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu"};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	float *lg = malloc(sizeof(float) * 512);
	int tok = 1;
	int got[8];
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(eng_forward(e, &tok, 1, i, lg, false, err, sizeof err), WK_OK);
		tok = got[i] = samp_argmax(lg, 512);
	}
	/* " Once upon a time, there was a" in tok512 ids: 403 " Once", 407 " upon", 261 " a",
	 * 378 " time" (the tokenizer tests check these against the SentencePiece algorithm). */
	int want[8] = {403, 407, 261, 378, 432, 383, 286, 261};
	for (int i = 0; i < 8; i++)
		cr_expect_eq(got[i], want[i], "step %d: got %d, want %d", i, got[i], want[i]);
	free(lg);
	eng_close(e);
}

Test(engine, rejects_bad_input)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .max_seq = 8};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	float lg[512];
	int bad = 512;
	cr_expect_eq(eng_forward(e, &bad, 1, 0, lg, false, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "vocabulary") != NULL, "%s", err);
	int ok = 1;
	cr_expect_eq(eng_forward(e, &ok, 1, 8, lg, false, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "context") != NULL, "%s", err);
	eng_close(e);

	o.backend = "tpu";
	cr_expect_eq(eng_open(dir, &o, &e, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "tpu") != NULL, "%s", err);
}

Test(engine, refuses_unknown_architecture)
{
	char path[512], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/config.json", dir);
	const char *cfg = "{\"architectures\": [\"MambaForCausalLM\"], \"hidden_size\": 64}";
	cr_assert_eq(wk_write_file(path, cfg, strlen(cfg), err, sizeof err), WK_OK);
	struct engine *e;
	cr_expect_eq(eng_open(dir, NULL, &e, err, sizeof err), WK_EUNSUPPORTED);
	cr_expect(strstr(err, "MambaForCausalLM") != NULL, "%s", err);
}

Test(engine, refuses_shape_mismatch)
{
	char path[512], err[WK_ERRSZ];
	char *buf;
	size_t len;
	snprintf(path, sizeof path, "%s/config.json", dir);
	cr_assert_eq(wk_read_file(path, 1 << 20, &buf, &len, err, sizeof err), WK_OK);
	char *p = strstr(buf, "\"intermediate_size\": 172");
	cr_assert_not_null(p);
	memcpy(p, "\"intermediate_size\": 173", 24);
	cr_assert_eq(wk_write_file(path, buf, len, err, sizeof err), WK_OK);
	free(buf);
	struct engine *e;
	cr_expect_eq(eng_open(dir, NULL, &e, err, sizeof err), WK_EFORMAT);
	cr_expect(strstr(err, "gate_proj") != NULL, "%s", err);
}
