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
#include "engine/backend.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

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

/* The KV cache types: the default (f32 for this float32 checkpoint), bf16, fp8. */
static const char *const kv_types[] = {NULL, "bf16", "fp8"};
#define N_KV_TYPES (sizeof kv_types / sizeof kv_types[0])

/* Prefill of n tokens at once, token-by-token decode through the KV cache, and per-position
 * logits must agree: they are the same function computed three ways, on every cache type
 * (both ways read the same rounded or quantized rows). */
static void prefill_matches_decode(const char *kv)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .kv_dtype = kv};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	const struct eng_info *in = eng_info(e);
	cr_assert_str_eq(in->kv_dtype, kv ? kv : "f32");
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
	cr_expect_lt(maxd, 1e-4f, "%s cache: prefill vs decode differ by %g", in->kv_dtype, maxd);
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

Test(engine, prefill_matches_decode)
{
	for (size_t k = 0; k < N_KV_TYPES; k++)
		prefill_matches_decode(kv_types[k]);
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

/* The tokenizer is read on a thread of its own beside the weights. With both good, the engine
 * has it and says how long it took; with it broken, its error is the one reported; with the
 * weights broken as well, theirs is (as before the thread), and nothing is left behind
 * (the ASan run checks the tokenizer that did load is freed). */
Test(engine, tokenizer_beside_the_weights)
{
	char tok[512], st[512], err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .max_seq = 8};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	const struct eng_info *in = eng_info(e);
	cr_expect_gt(in->startup.tokenizer_s, 0.0);
	cr_expect_leq(in->startup.tokenizer_s, in->startup.total_s);
	cr_expect_not_null(eng_tokenizer(e));
	eng_close(e);

	snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
	cr_assert_eq(wk_write_file(tok, "{\"model\": [", 11, err, sizeof err), WK_OK);
	cr_expect_eq(eng_open(dir, &o, &e, err, sizeof err), WK_EFORMAT);
	cr_expect(strstr(err, "tokenizer.json") != NULL, "%s", err);

	/* the weights broken too (their file cut short): the weights are named */
	snprintf(st, sizeof st, "%s/model.safetensors", dir);
	cr_assert_eq(truncate(st, 100), 0);
	cr_expect_neq(eng_open(dir, &o, &e, err, sizeof err), WK_OK);
	cr_expect(strstr(err, "model.safetensors") != NULL, "%s", err);
	/* and with the tokenizer good: the weights' error, the loaded tokenizer freed */
	cr_assert_eq(unlink(tok), 0);
	cleanup();
	convert();
	snprintf(st, sizeof st, "%s/model.safetensors", dir);
	cr_assert_eq(truncate(st, 100), 0);
	cr_expect_neq(eng_open(dir, &o, &e, err, sizeof err), WK_OK);
	cr_expect(strstr(err, "model.safetensors") != NULL, "%s", err);
}

/* The ids eng_tokenizer(e) gives text. */
static int encode_n(struct engine *e, const char *text, int *out, int max)
{
	int *ids, n;
	char err[WK_ERRSZ];
	cr_assert_not_null(eng_tokenizer(e));
	cr_assert_eq(tok_encode(eng_tokenizer(e), text, strlen(text), true, &ids, &n, err,
				sizeof err), WK_OK, "%s", err);
	cr_assert_leq(n, max);
	memcpy(out, ids, sizeof(int) * (size_t)n);
	free(ids);
	return n;
}

/* A snapshot holds its tokenizer prepared, and a start takes it instead of parsing
 * tokenizer.json: the same ids. The snapshot's manifest refuses one changed since. Beside a
 * model's tokenizer.json (the same rule reads any directory), one that is stale (made from
 * another tokenizer.json) or of another version is passed over for the JSON, and a damaged
 * one is an error naming it. */
Test(engine, snapshot_takes_its_prepared_tokenizer)
{
	char snap[300], prep[400], mprep[400], err[WK_ERRSZ];
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(prep, sizeof prep, "%s/tokenizer.prepared", snap);
	snprintf(mprep, sizeof mprep, "%s/tokenizer.prepared", dir);
	struct eng_snap_opts so = {0};
	cr_assert_eq(eng_snapshot(dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(access(prep, R_OK), 0, "no %s", prep);
	const char *text = "Once upon a time, the little dog said \"hi!\"";
	int want[64], got[64], nw, ng;
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .max_seq = 8};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_expect(!eng_info(e)->startup.tokenizer_prepared, "a model directory has none");
	nw = encode_n(e, text, want, 64);
	eng_close(e);
	cr_assert_eq(eng_open(snap, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_expect(eng_info(e)->startup.tokenizer_prepared, "the snapshot's was not taken");
	ng = encode_n(e, text, got, 64);
	eng_close(e);
	cr_assert_eq(ng, nw);
	cr_assert_eq(memcmp(got, want, sizeof(int) * (size_t)nw), 0);

	char *buf;
	size_t len;
	cr_assert_eq(wk_read_file(prep, 1 << 24, &buf, &len, err, sizeof err), WK_OK, "%s", err);
	struct {
		size_t at;       /* byte to change, or len: none */
		bool taken, ok;  /* prepared taken; the start succeeds */
		const char *why;
	} cases[] = {
		{len, true, true, "fresh"},
		{16, false, true, "stale: another tokenizer.json's size"},
		{24, false, true, "stale: another tokenizer.json's hash"},
		{8, false, true, "another version"},
		{len - 3, false, false, "damaged"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t at = cases[i].at;
		if (at < len)
			buf[at] ^= 0x40;
		cr_assert_eq(wk_write_file(mprep, buf, len, err, sizeof err), WK_OK, "%s", err);
		if (at < len)
			buf[at] ^= 0x40;
		int rc = eng_open(dir, &o, &e, err, sizeof err);
		if (!cases[i].ok) {
			cr_expect_neq(rc, WK_OK, "%s", cases[i].why);
			cr_expect(strstr(err, "tokenizer.prepared"), "%s: %s", cases[i].why, err);
			continue;
		}
		cr_assert_eq(rc, WK_OK, "%s: %s", cases[i].why, err);
		cr_expect_eq(eng_info(e)->startup.tokenizer_prepared, cases[i].taken, "%s",
			     cases[i].why);
		ng = encode_n(e, text, got, 64);
		cr_expect(ng == nw && !memcmp(got, want, sizeof(int) * (size_t)nw), "%s",
			  cases[i].why);
		eng_close(e);
	}
	/* in the snapshot, checksums verified or not, the manifest refuses a changed file */
	buf[len - 3] ^= 0x40;
	cr_assert_eq(wk_write_file(prep, buf, len, err, sizeof err), WK_OK, "%s", err);
	for (int v = 0; v < 2; v++) {
		o.no_verify = v;
		cr_expect_neq(eng_open(snap, &o, &e, err, sizeof err), WK_OK);
		cr_expect(strstr(err, "tokenizer.prepared"), "%s", err);
	}
	free(buf);
}

/* A rope_theta or rms_norm_eps out of range is refused by name (each made every logit NaN,
 * and wick generate printed garbage with exit 0), and so is a num_hidden_layers short of
 * the checkpoint's layers (the first ones ran alone, quietly). */
Test(engine, refuses_out_of_range_config)
{
	static const char *const from[] = {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0",
					   "\"rms_norm_eps\": 1.0000000000000001e-5",
					   "\"num_hidden_layers\": 5"};
	static const char *const to[] = {"\"rope_theta\": 0.0", "\"rope_theta\": -5.0",
					 "\"rms_norm_eps\": -1.0", "\"num_hidden_layers\": 2"};
	static const char *const named[] = {"rope_theta", "rope_theta", "rms_norm_eps",
					    "model.layers.2.input_layernorm.weight"};
	char path[512], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/config.json", dir);
	char *orig;
	size_t len;
	cr_assert_eq(wk_read_file(path, 1 << 20, &orig, &len, err, sizeof err), WK_OK);
	for (int k = 0; k < 4; k++) {
		const char *p = strstr(orig, from[k]);
		cr_assert_not_null(p, "%s", from[k]);
		char buf[8192];
		cr_assert_lt(len + 64, sizeof buf);
		int n = snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - orig), orig, to[k],
				 p + strlen(from[k]));
		cr_assert_eq(wk_write_file(path, buf, (size_t)n, err, sizeof err), WK_OK);
		struct engine *e;
		cr_expect_eq(eng_open(dir, NULL, &e, err, sizeof err), WK_EFORMAT, "%s", to[k]);
		cr_expect(strstr(err, named[k]) != NULL, "%s: %s", to[k], err);
	}
	cr_assert_eq(wk_write_file(path, orig, len, err, sizeof err), WK_OK);
	free(orig);
}

/* Continuous batching: sequences stepped together (different lengths, prefill mixed with
 * decode) give the logits each would get alone. */
static void batched_sequences_match_single(const char *kv)
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .max_seq = 64, .max_seqs = 3, .kv_dtype = kv};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_info(e)->max_seqs, 3);
	int V = eng_info(e)->vocab;
	int p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 30}, p2[] = {1, 411, 300, 261};
	const int *prompts[3] = {p0, p1, p2};
	int lens[3] = {5, 2, 4};
	/* alone: prompt, then one extra token (42) */
	float want[3][2][512];
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(eng_forward(e, prompts[s], lens[s], 0, want[s][0], false, err, sizeof err), WK_OK);
		int t = 42;
		cr_assert_eq(eng_forward(e, &t, 1, lens[s], want[s][1], false, err, sizeof err), WK_OK);
	}
	int seq[3];
	eng_seq_free(e, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
	int extra;
	cr_expect_eq(eng_seq_alloc(e, &extra), WK_ELIMIT);
	float got[3][512];
	/* step 1: sequences 0 and 1 prefill together */
	struct eng_item it[3] = {{seq[0], p0, 5, got[0], NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[1], p1, 2, got[1], NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, it, 2, err, sizeof err), WK_OK, "%s", err);
	/* step 2: 0 and 1 decode while 2 prefills */
	int t = 42;
	float g2[3][512];
	struct eng_item it2[3] = {{seq[2], p2, 4, got[2], NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[0], &t, 1, g2[0], NULL, {}, 0, 0, NULL, NULL, false},
				 {seq[1], &t, 1, g2[1], NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, it2, 3, err, sizeof err), WK_OK, "%s", err);
	struct eng_item it3 = {seq[2], &t, 1, g2[2], NULL, {}, 0, 0, NULL, NULL, false};
	cr_assert_eq(eng_step(e, &it3, 1, err, sizeof err), WK_OK, "%s", err);
	float maxd = 0;
	for (int s = 0; s < 3; s++)
		for (int v = 0; v < V; v++) {
			float d1 = fabsf(got[s][v] - want[s][0][v]), d2 = fabsf(g2[s][v] - want[s][1][v]);
			maxd = fmaxf(maxd, fmaxf(d1, d2));
		}
	cr_expect_lt(maxd, 1e-4f, "%s cache: batched vs single differ by %g", kv ? kv : "f32",
		     maxd);
	cr_expect_eq(eng_seq_len(e, seq[0]), 6);
	cr_expect_eq(eng_seq_len(e, seq[2]), 5);
	/* refusals: a sequence twice, a free sequence */
	struct eng_item dup[2] = {{seq[0], &t, 1, g2[0], NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[0], &t, 1, g2[1], NULL, {}, 0, 0, NULL, NULL, false}};
	cr_expect_eq(eng_step(e, dup, 2, err, sizeof err), WK_EINVAL);
	eng_seq_free(e, seq[1]);
	struct eng_item freed = {seq[1], &t, 1, g2[1], NULL, {}, 0, 0, NULL, NULL, false};
	cr_expect_eq(eng_step(e, &freed, 1, err, sizeof err), WK_EINVAL);
	eng_close(e);
}

Test(engine, batched_sequences_match_single)
{
	for (size_t k = 0; k < N_KV_TYPES; k++)
		batched_sequences_match_single(kv_types[k]);
}

/* Logits of a prompt and 24 greedy tokens from BOS on model (a directory or snapshot) with a
 * KV cache of type kv: into lg [n][V] (n = the prompt's 7 positions), the tokens into
 * toks [24]. */
static void story_on(const char *model, const char *kv, float *lg, int toks[24])
{
	struct engine *e;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .kv_dtype = kv};
	cr_assert_eq(eng_open(model, &o, &e, err, sizeof err), WK_OK, "%s", err);
	int ids[] = {1, 403, 407, 261, 378, 30, 411}, V = eng_info(e)->vocab;
	cr_assert_eq(eng_forward(e, ids, 7, 0, lg, true, err, sizeof err), WK_OK, "%s", err);
	float *one = malloc(sizeof(float) * V);
	int tok = 1;
	for (int i = 0; i < 24; i++) {
		cr_assert_eq(eng_forward(e, &tok, 1, i, one, false, err, sizeof err), WK_OK);
		tok = toks[i] = samp_argmax(one, V);
	}
	free(one);
	eng_close(e);
}

/* An FP8 KV cache (keys and values e4m3, one f32 scale per kv head's row of 8): the prompt's
 * logits stay near the f32 cache's (mean cosine, the same top-1) but are not the bf16 cache's
 * (the cache does quantize), and greedy decoding tells the f32 cache's story. At tp 2 (two of
 * the four kv heads a rank, each row whole with its scale) the logits are tp 1's up to the
 * order of the sums, and the story the same. */
Test(engine, kv_fp8_tells_the_story)
{
	enum { V = 512, N = 7 };
	static float ref[N * V], b16[N * V], got[N * V], tp2[N * V];
	int tr[24], tb[24], tg[24], t2[24];
	story_on(dir, NULL, ref, tr);
	story_on(dir, "bf16", b16, tb);
	story_on(dir, "fp8", got, tg);
	char snap[300], err[WK_ERRSZ];
	snprintf(snap, sizeof snap, "%s/tp2", dir);
	struct eng_snap_opts so = {.tp = 2, .ep = 1};
	cr_assert_eq(eng_snapshot(dir, snap, &so, err, sizeof err), WK_OK, "%s", err);
	story_on(snap, "fp8", tp2, t2);
	double cos = 0, worst = 0, d16 = 0;
	int top = 0;
	for (int i = 0; i < N; i++) {
		const float *x = got + i * V, *y = ref + i * V;
		double xy = 0, xx = 0, yy = 0, m = 0, d = 0;
		for (int v = 0; v < V; v++) {
			xy += (double)x[v] * y[v], xx += (double)x[v] * x[v], yy += (double)y[v] * y[v];
			m = fmax(m, fabs(y[v]));
			d = fmax(d, fabs(x[v] - y[v]));
			d16 = fmax(d16, fabs(x[v] - b16[i * V + v]));
		}
		cos += xy / sqrt(xx * yy) / N;
		worst = fmax(worst, d / m);
		top += samp_argmax(x, V) == samp_argmax(y, V);
	}
	fprintf(stderr, "stories260K kv fp8 vs f32: mean cosine %.6f, worst %.3g of the largest "
		"logit, top-1 %d of %d\n", cos, worst, top, N);
	cr_expect(cos >= 0.999 && top == N, "fp8 vs f32: mean cosine %g, top-1 %d of %d", cos,
		  top, N);
	cr_expect_gt(d16, 1e-3, "the fp8 cache's logits are the bf16 cache's");
	double m = 0, d2 = 0;
	for (int i = 0; i < N * V; i++)
		m = fmax(m, fabs(got[i])), d2 = fmax(d2, fabs(tp2[i] - got[i]));
	fprintf(stderr, "stories260K kv fp8: tp 2 vs tp 1 %.2g of the largest logit\n", d2 / m);
	cr_expect_leq(d2 / m, 1e-4, "fp8 caches: tp 2 vs tp 1 differ by %g", d2 / m);
	for (int i = 0; i < 24; i++) {
		cr_expect_eq(tg[i], tr[i], "step %d: fp8 %d, f32 %d", i, tg[i], tr[i]);
		cr_expect_eq(t2[i], tg[i], "step %d: fp8 at tp 2 %d, tp 1 %d", i, t2[i], tg[i]);
	}
}

/* ---- a prefill's attention apart in a batched step ------------------------------------- */

static struct {
	int calls, n[64];
	bool several[64];
} att_log;

static void att_logged(void *ctx, float *out, const float *q, const struct be_gqa *s, int n,
		       int pos0)
{
	if (att_log.calls < 64) {
		att_log.n[att_log.calls] = n;
		att_log.several[att_log.calls] = s->seq != NULL;
	}
	att_log.calls++;
	be_cpu.attention(ctx, out, q, s, n, pos0);
}

/* In a batched step a segment of ENG_ATT_OWN (32) tokens or more, a prefill, gets an
 * attention call of its own, so that a device can run its query tiles; the short segments
 * around it share calls over several sequences, and a step of short ones one call. stories260K
 * (5 layers): a decode, a 40-token prefill and a decode in one step give per layer a call of
 * 1 token (several sequences), one of 40 (one sequence) and one of 1; then three decodes, one
 * call of 3 a layer. Every logit is what each sequence gets alone (within 1e-4: the step's
 * matmuls see more rows). */
Test(engine, batched_prefill_attends_on_its_own)
{
	char err[WK_ERRSZ];
	int p[40], t = 42, two[2] = {1, 30};
	for (int i = 0; i < 40; i++)
		p[i] = 1 + (i * 37) % 500;
	/* alone (the plain CPU backend): each sequence's logits */
	struct engine *e;
	struct eng_opts o1 = {.backend = "cpu", .max_seq = 64};
	cr_assert_eq(eng_open(dir, &o1, &e, err, sizeof err), WK_OK, "%s", err);
	int V = eng_info(e)->vocab;
	float *want = malloc(sizeof(float) * 5 * V), *got = malloc(sizeof(float) * 5 * V);
	cr_assert(want && got);
	cr_assert_eq(eng_forward(e, two, 2, 0, want, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 2, want, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 3, want + 3 * V, false, err, sizeof err), WK_OK);
	cr_assert_eq(eng_forward(e, p, 40, 0, want + V, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, &t, 1, 40, want + 4 * V, false, err, sizeof err), WK_OK);
	eng_close(e);
	/* batched, its attention calls logged */
	struct backend be = be_cpu;
	be.attention = att_logged;
	struct eng_opts o = {.backend = "cpu", .max_seq = 64, .max_seqs = 3, .backend_ops = &be};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	int seq[3];
	eng_seq_free(e, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(eng_seq_alloc(e, &seq[s]), WK_OK);
	struct eng_item pre[2] = {{seq[0], two, 2, NULL, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], two, 2, NULL, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, pre, 2, err, sizeof err), WK_OK, "%s", err);
	memset(&att_log, 0, sizeof att_log);
	struct eng_item mix[3] = {{seq[0], &t, 1, got, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[1], p, 40, got + V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], &t, 1, got + 2 * V, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, mix, 3, err, sizeof err), WK_OK, "%s", err);
	int layers = att_log.calls / 3;
	cr_expect_eq(att_log.calls, 3 * layers, "%d calls", att_log.calls);
	cr_expect_gt(layers, 0);
	for (int c = 0; c < att_log.calls && c < 64; c++) {
		bool own = c % 3 == 1;
		cr_expect_eq(att_log.n[c], own ? 40 : 1, "call %d of %d tokens", c, att_log.n[c]);
		cr_expect_eq(att_log.several[c], !own, "call %d: several sequences %d", c,
			     att_log.several[c]);
	}
	memset(&att_log, 0, sizeof att_log);
	struct eng_item dec[3] = {{seq[0], &t, 1, got + 3 * V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[1], &t, 1, got + 4 * V, NULL, {}, 0, 0, NULL, NULL, false},
				  {seq[2], &t, 1, NULL, NULL, {}, 0, 0, NULL, NULL, false}};
	cr_assert_eq(eng_step(e, dec, 3, err, sizeof err), WK_OK, "%s", err);
	cr_expect_eq(att_log.calls, layers, "decodes: one call a layer, not %d", att_log.calls);
	for (int c = 0; c < att_log.calls && c < 64; c++)
		cr_expect(att_log.n[c] == 3 && att_log.several[c], "decode call %d", c);
	eng_close(e);
	/* rows: 0 and 2 after "1 30" then 42 (the same), 1 after its 40; then 0 and 1 after 42 */
	for (int r = 0; r < 5; r++) {
		const float *w = want + (size_t)(r == 2 ? 0 : r) * V, *g = got + (size_t)r * V;
		float d = 0;
		for (int v = 0; v < V; v++)
			d = fmaxf(d, fabsf(g[v] - w[v]));
		cr_expect_lt(d, 1e-4f, "logits row %d differ from the sequence's alone by %g", r, d);
	}
	free(want);
	free(got);
}

/* The op clock (engine/count.c, eng_opts.op_times) on a backend with a device clock of its
 * own: a fake whose clock moves only by what the test says, 1 ms in each attention call and
 * 0.125 ms at each mark (the time that passes between any two marks), and that holds 5
 * marks, so that the counter reads them every few ops and carries the last over. Each op
 * is marked before and after, so every op of a kind must be charged 0.125 more than its
 * own cost, and the time between ops 0.125 a gap: one gap fewer than the ops timed. A
 * charge to the wrong interval, a mark not carried across a read, or a gap counted as an op
 * fails it. */
static struct {
	double now, t[5];
	int n;
} fclock;

static void fclock_attention(void *ctx, float *out, const float *q, const struct be_gqa *s,
			     int n, int pos0)
{
	be_cpu.attention(ctx, out, q, s, n, pos0);
	fclock.now += 1.0;
}

static int fclock_mark(void *ctx)
{
	(void)ctx;
	if (fclock.n == 5)
		return -1;
	fclock.now += 0.125;
	fclock.t[fclock.n] = fclock.now;
	return fclock.n++;
}

static int fclock_marks_ms(void *ctx, float *ms, int n, char *err, size_t errsz)
{
	(void)ctx;
	if (n != fclock.n)
		return wk_errf(err, errsz, WK_EINVAL, "%d marks read, %d made", n, fclock.n);
	for (int i = 0; i + 1 < n; i++)
		ms[i] = (float)(fclock.t[i + 1] - fclock.t[i]);
	if (n > 0)
		fclock.t[0] = fclock.t[n - 1];
	fclock.n = n > 0;
	return WK_OK;
}

Test(engine, op_times_charge_each_op_its_interval)
{
	char err[WK_ERRSZ];
	struct backend be = be_cpu;
	be.attention = fclock_attention;
	be.mark = fclock_mark;
	be.marks_ms = fclock_marks_ms;
	memset(&fclock, 0, sizeof fclock);
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .max_seq = 64, .backend_ops = &be,
			     .count_launches = true, .op_times = true};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	int ids[] = {1, 403, 407, 261, 378}, V = eng_info(e)->vocab;
	float *logits = malloc(sizeof(float) * V);
	cr_assert_eq(eng_forward(e, ids, 4, 0, logits, false, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, ids + 4, 1, 4, logits, false, err, sizeof err), WK_OK);
	struct eng_launches L;
	cr_assert_eq(eng_launches(e, 0, &L), WK_OK);
	cr_assert(L.dev_clock);
	cr_assert_eq(L.op_times_rc, WK_OK);
	long ops = 0, att_ops = 0;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *name = eng_launch_kind(k, NULL, NULL);
		bool att = !strcmp(name, "attention");
		att_ops += att ? L.timed[k] : 0;
		double want = (double)L.timed[k] * (att ? 1.125 : 0.125);
		cr_expect_eq(L.dev_ms[k], want, "%s: %ld ops charged %g ms, not %g", name,
			     L.timed[k], L.dev_ms[k], want);
		cr_expect(L.timed[k] == 0 || L.host_ms[k] > 0, "%s: no host time", name);
		ops += L.timed[k];
	}
	cr_expect_gt(att_ops, 0, "no attention timed");
	cr_expect_gt(ops, 20, "%ld ops timed", ops);
	cr_expect_eq(L.gap_ms, (double)(ops - 1) * 0.125, "between ops %g ms over %ld ops",
		     L.gap_ms, ops);
	free(logits);
	eng_close(e);
	/* a clock with half its members is refused by name */
	be.marks_ms = NULL;
	cr_expect_eq(eng_open(dir, &o, &e, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "mark and marks_ms"), "%s", err);
}

/* On the plain CPU backend (no device clock) the op clock is the host's, each op's own. */
Test(engine, op_times_on_the_host)
{
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .max_seq = 64, .count_launches = true,
			     .op_times = true};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s", err);
	int ids[] = {1, 403, 407}, V = eng_info(e)->vocab;
	float *logits = malloc(sizeof(float) * V);
	cr_assert_eq(eng_forward(e, ids, 3, 0, logits, false, err, sizeof err), WK_OK, "%s", err);
	struct eng_launches L;
	cr_assert_eq(eng_launches(e, 0, &L), WK_OK);
	cr_expect(!L.dev_clock);
	cr_expect_str_eq(eng_launch_kind(0, NULL, NULL), "matmul");
	cr_expect_gt(L.timed[0], 0, "no matmul timed");
	cr_expect_gt(L.host_ms[0], 0.0);
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++)
		cr_expect_eq(L.dev_ms[k], 0.0);
	cr_expect_eq(L.gap_ms, 0.0);
	free(logits);
	eng_close(e);
}
