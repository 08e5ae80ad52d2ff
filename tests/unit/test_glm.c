/*
 * GLM families (engine/glm*.c) end to end on tiny random checkpoints in the real Hugging Face
 * layout (glm_test.h: tensor names and dtypes of GLM-5-FP8 and GLM-4.5, FP8 edge blocks
 * partial).
 *
 * What is checked here: incremental decode through the caches equals prefill at every position
 * (both families, FP8 weights, absorbed and expanded MLA); weights the config turns off are
 * reported; config refusals; snapshots; the CLI on these checkpoints. test_glm_kernels.c
 * checks DSA top-k (a top-k that covers every key is dense attention, and value/key vectors
 * of unselected keys do not matter), the MLA and MoE kernels against their references, and the
 * router (the correction bias selects but does not weigh, group limiting changes the choice,
 * ties go to the lower index); test_glm_paths.c the other ways a step runs: batched sequences,
 * device memory (devsim), launch counts, FP8 activations and KV cache types.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/engine.h"
#include "engine/glm_int.h"
#include "tests/unit/glm_test.h"

TestSuite(glm);

/* ---- (2) incremental decode == prefill ------------------------------------------------------ */

Test(glm, glm5_fp8_decode_matches_prefill)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 1234, .bias_std = 0.1f};
	write_glm5(dir, &d);
	int n = NIDS;
	/* The reference: prefill with kv_b_proj expanded over every position. */
	set_mla("expand");
	struct engine *e = open_model(dir);
	const struct eng_info *in = eng_info(e);
	cr_assert_eq(in->vocab, G5_VOCAB);
	cr_assert_eq(in->max_seq, 64);
	cr_assert_eq(in->mtp_layers_skipped, 1);
	cr_assert_eq(in->bos, 0);
	cr_assert_eq(in->eos, 1);
	float *ref = prefill(e, n);
	check_decode(e, ref, n, "expanded decode");
	struct glm5_debug dbg;
	cr_assert_eq(glm5_debug(e, &dbg), WK_OK);
	cr_assert(dbg.sparse, "index_topk 4 < %d positions: the indexer must be selecting", n);
	eng_close(e);

	/* Absorbed decode (the production decode path) and absorbed prefill. */
	set_mla("absorb");
	e = open_model(dir);
	check_decode(e, ref, n, "absorbed decode");
	float *ab = prefill(e, n);
	for (int i = 0; i < n; i++)
		cr_expect_leq(rel(ab + (size_t)i * G5_VOCAB, ref + (size_t)i * G5_VOCAB, G5_VOCAB),
			      1e-4, "absorbed prefill, position %d", i);
	eng_close(e);

	/* The default choice, with a prefill split in chunks (pos0 > 0 in the middle). */
	set_mla(NULL);
	e = open_model(dir);
	char err[WK_ERRSZ];
	float *chunk = malloc(sizeof(float) * n * G5_VOCAB);
	cr_assert_eq(eng_forward(e, ids, 5, 0, chunk, true, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(eng_forward(e, ids + 5, n - 5, 5, chunk + 5 * G5_VOCAB, true, err, sizeof err),
		     WK_OK, "%s", err);
	for (int i = 0; i < n; i++)
		cr_expect_leq(rel(chunk + (size_t)i * G5_VOCAB, ref + (size_t)i * G5_VOCAB, G5_VOCAB),
			      1e-4, "chunked prefill, position %d", i);
	eng_close(e);
	free(chunk);
	free(ab);
	free(ref);
	rm_rf(dir);
	free(dir);
}

Test(glm, glm4_decode_matches_prefill)
{
	enum dt_type dts[] = {DT_BF16, DT_F8_E4M3};
	for (int k = 0; k < 2; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, dts[k], 4, 2, 0.1f);
		struct engine *e = open_model(dir);
		cr_assert_eq(eng_info(e)->vocab, G4_VOCAB);
		cr_assert_eq(eng_info(e)->mtp_layers_skipped, 1);
		cr_assert_eq(eng_info(e)->unused_tensors, 0, "%s", eng_info(e)->unused_example);
		/* every id of the eos_token_id list ends a generation (GLM's <|user|> too), and
		 * nothing else does (no bos_token_id here) */
		const struct eng_info *in = eng_info(e);
		cr_assert(in->n_stop == 2 && eng_is_stop(in, 1) && eng_is_stop(in, 2) &&
				  !eng_is_stop(in, 0) && !eng_is_stop(in, 3),
			  "stop ids: %d", in->n_stop);
		float *ref = prefill(e, NIDS);
		check_decode(e, ref, NIDS, dts[k] == DT_BF16 ? "glm4 bf16" : "glm4 fp8");
		eng_close(e);
		free(ref);
		rm_rf(dir);
		free(dir);
	}
}

/* Weights the config turns off are reported, not silently dropped: GLM-4.5's q/k/v biases
 * under attention_bias false (transformers warns of unused weights the same way). */
Test(glm, unused_tensors_reported)
{
	char *dir = mkdir_tmp(), path[600], *text;
	size_t len;
	char err[WK_ERRSZ];
	write_glm4(dir, DT_BF16, 4, 2, 0.1f);
	snprintf(path, sizeof path, "%s/config.json", dir);
	cr_assert_eq(wk_read_file(path, 1 << 20, &text, &len, err, sizeof err), WK_OK, "%s", err);
	char *at = strstr(text, "\"attention_bias\": true");
	cr_assert_not_null(at);
	size_t head = (size_t)(at - text) + strlen("\"attention_bias\": ");
	FILE *f = fopen(path, "w");
	cr_assert(f && fwrite(text, 1, head, f) == head && fputs("false", f) >= 0 &&
		  fputs(text + head + 4, f) >= 0 && fclose(f) == 0);
	free(text);
	struct engine *e = open_model(dir);
	const struct eng_info *in = eng_info(e);
	cr_expect_eq(in->unused_tensors, 3 * G4_L, "%d", in->unused_tensors);
	cr_expect(in->unused_example && wk_ends_with(in->unused_example, "_proj.bias"), "%s",
		  in->unused_example ? in->unused_example : "(none)");
	eng_close(e);
	rm_rf(dir);
	free(dir);
}

/* ---- config refusals ------------------------------------------------------------------------ */

static void expect_refused(const char *dir, const char *from, const char *to, const char *needle)
{
	char path[512], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/config.json", dir);
	char *buf;
	size_t len;
	cr_assert_eq(wk_read_file(path, 1 << 20, &buf, &len, err, sizeof err), WK_OK);
	char *at = strstr(buf, from);
	cr_assert_not_null(at, "%s not in config", from);
	char out[8192];
	snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
	FILE *f = fopen(path, "w");
	fputs(out, f);
	fclose(f);
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 1};
	int rc = eng_open(dir, &o, &e, err, sizeof err);
	cr_expect_neq(rc, WK_OK, "%s -> %s was accepted", from, to);
	cr_expect_not_null(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
	/* nor is a snapshot of it written: the refusal comes at `wick snapshot`, not at a
	 * worker's cold start */
	char snap[600];
	snprintf(snap, sizeof snap, "%s.snap", dir);
	struct eng_snap_opts so = {.tp = 1, .ep = 1};
	rc = eng_snapshot(dir, snap, &so, err, sizeof err);
	cr_expect_neq(rc, WK_OK, "a snapshot of %s -> %s was written", from, to);
	cr_expect_not_null(strstr(err, needle), "snapshot message '%s' lacks '%s'", err, needle);
	cr_expect_eq(access(snap, F_OK), -1, "%s -> %s: %s was left behind", from, to, snap);
	f = fopen(path, "w");
	fputs(buf, f);
	fclose(f);
	free(buf);
}

Test(glm, config_refusals)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_BF16, .seed = 1,
			   .bias_std = 0.1f};
	write_glm5(dir, &d);
	expect_refused(dir, "\"qk_head_dim\": 20", "\"qk_head_dim\": 21", "qk_head_dim");
	expect_refused(dir, "\"n_group\": 1", "\"n_group\": 3", "n_group");
	expect_refused(dir, "\"topk_group\": 1", "\"topk_group\": 2", "topk_group");
	expect_refused(dir, "\"rope_interleave\": true", "\"rope_interleave\": false",
		       "rope_interleave");
	expect_refused(dir, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_type");
	expect_refused(dir, "\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"",
		       "scoring_func");
	expect_refused(dir, "\"kv_lora_rank\": 24", "\"kv_lora_rank\": 25", "kv_a_proj_with_mqa");
	expect_refused(dir, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9",
		       "num_experts_per_tok");
	expect_refused(dir, "\"quant_method\": \"fp8\"", "\"quant_method\": \"compressed-tensors\"",
		       "quant_method");
	expect_refused(dir, "[128, 128]", "[64, 64]", "weight_block_size");
	/* the developer's override of the MLA path: a value it does not know is refused, not
	 * taken for auto */
	char err[WK_ERRSZ];
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 1};
	set_mla("absorbed");
	int rc = eng_open(dir, &o, &e, err, sizeof err);
	set_mla(NULL);
	cr_assert_neq(rc, WK_OK, "WICK_GLM_MLA=absorbed was taken");
	cr_expect(strstr(err, "WICK_GLM_MLA is 'absorbed'; it takes auto, absorb or expand"),
		  "%s", err);
	rm_rf(dir);
	free(dir);
}

/* ---- snapshots ------------------------------------------------------------------------------ */

/* A snapshot (with --dtype bf16, which must leave FP8 block scales F32) runs the same. The
 * MTP layer is left out of it. */
Test(glm, snapshot_roundtrip)
{
	char *dir = mkdir_tmp(), *snap = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 11, .bias_std = 0.1f};
	write_glm5(dir, &d);
	char err[WK_ERRSZ], out[600];
	snprintf(out, sizeof out, "%s/s", snap);
	struct eng_snap_opts so = {.tp = 1, .ep = 1, .dtype = "bf16"};
	cr_assert_eq(eng_snapshot(dir, out, &so, err, sizeof err), WK_OK, "%s", err);
	struct engine *a = open_model(dir), *b = open_model(out);
	cr_expect_eq(eng_info(b)->mtp_layers_skipped, 1);
	/* every tensor read but the MTP layer's, from the checkpoint and from the snapshot */
	cr_expect_eq(eng_info(a)->unused_tensors, 0, "%s", eng_info(a)->unused_example);
	cr_expect_eq(eng_info(b)->unused_tensors, 0, "%s", eng_info(b)->unused_example);
	float *la = prefill(a, NIDS), *lb = prefill(b, NIDS);
	for (int i = 0; i < NIDS; i++)
		cr_expect_leq(rel(lb + (size_t)i * G5_VOCAB, la + (size_t)i * G5_VOCAB, G5_VOCAB), 1e-5,
			      "position %d", i);
	free(la);
	free(lb);
	eng_close(a);
	eng_close(b);
	rm_rf(dir);
	rm_rf(snap);
	free(dir);
	free(snap);
}

/* ---- the CLI on these checkpoints ------------------------------------------------------------ */

static bool find_wick(char *out, size_t n)
{
	char self[PATH_MAX];
	ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
	if (k <= 0)
		return false;
	self[k] = 0;
	char *slash = strrchr(self, '/'); /* .../BUILD/tests/unit */
	if (!slash)
		return false;
	*slash = 0;
	slash = strrchr(self, '/');
	if (!slash)
		return false;
	*slash = 0;
	if (strlen(self) + 6 > n)
		return false;
	memcpy(out, self, strlen(self));
	memcpy(out + strlen(self), "/wick", 6);
	return access(out, X_OK) == 0;
}

static int run(const char *cmd, char *out, size_t n)
{
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t got = fread(out, 1, n - 1, p);
	out[got] = 0;
	return pclose(p);
}

Test(glm, cli)
{
	char wick[PATH_MAX];
	if (!find_wick(wick, sizeof wick))
		cr_skip_test("no wick binary beside the test binary");
	char *d5 = mkdir_tmp(), *d4 = mkdir_tmp();
	struct g5dims d = {.topk = 4, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3, .seed = 7,
			   .bias_std = 0.1f};
	write_glm5(d5, &d);
	write_glm4(d4, DT_BF16, 4, 2, 0.1f);
	const char *dirs[2] = {d5, d4};
	static char out[1 << 16];
	for (int k = 0; k < 2; k++) {
		char cmd[2 * PATH_MAX];
		snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
		cr_expect_not_null(strstr(out, k == 0 ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"),
				   "%s", out);
		snprintf(cmd, sizeof cmd, "%s logits %s --tokens 3,17,42,5,60,11 --all-positions 2>&1",
			 wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
		snprintf(cmd, sizeof cmd, "%s generate %s --tokens 3,17,42 -n 8 --temperature 0 2>&1",
			 wick, dirs[k]);
		cr_expect_eq(run(cmd, out, sizeof out), 0, "%s", out);
	}
	if (!getenv("WICK_GLM_KEEP")) { /* set it to look at the checkpoints afterwards */
		rm_rf(d5);
		rm_rf(d4);
	} else {
		cr_log_warn("kept %s (GLM-5) and %s (GLM-4.5)", d5, d4);
	}
	free(d5);
	free(d4);
}
