/*
 * eng_seq_copy: a sequence made from another's first len positions must be, bit for bit, the
 * source truncated to len. Each check runs the same prompt into two sequences A and D, then
 * truncates D to `cut` and copies A's first `cut` positions into a third, B. B and D then take
 * the same tokens in steps of the same shape, and every output (logits, tokens, MTP drafts and
 * their logits) must be equal, not close: both read caches that one computation wrote. A then
 * goes on beside them and must give what a sequence that never lent its caches gives.
 *
 * The families: Llama (stories260K), GLM-5 (MLA, the indexer's key cache; f32, bf16 and FP8
 * KV caches, the FP8 ones with their scales), GLM-4.5 (GQA). Also on devsim (device memory the
 * host cannot touch: the copies are device-to-device), with the MTP layer (its caches and the
 * hidden state a prompt's last position leaves waiting), and sharded (every rank copies).
 *
 * eng_seq_save and eng_seq_load (a prefix cache written at exit and read at start) must do
 * what a copy does: every check runs again with B made through host bytes, and a sequence
 * saved by one engine is loaded into another opened alike (eng_cache_id equal).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/stat.h>
#include <utime.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "engine/engine.h"
#include "engine/engine_int.h" /* e->world */
#include "glm_test.h"
#include "tests/unit/devsim.h"

TestSuite(seq_copy, .timeout = 120);

static char err[WK_ERRSZ];
static bool saved; /* check() makes B through eng_seq_save and eng_seq_load */

enum { NP = 11, CUT = 6, DEC = 3, KD = 3 };
static const int prompt[NP] = {1, 17, 42, 5, 60, 11, 29, 8, 33, 50, 21};

static struct engine *open_dir(const char *dir, const struct backend *be, const char *kv,
			       int mtp)
{
	struct engine *e;
	struct eng_opts o = {.backend = "cpu", .threads = 2, .max_seq = 64, .max_seqs = 4,
			     .backend_ops = be, .kv_dtype = kv, .mtp = mtp};
	cr_assert_eq(eng_open(dir, &o, &e, err, sizeof err), WK_OK, "%s: %s", dir, err);
	return e;
}

static void step1(struct engine *e, struct eng_item *it, const char *what)
{
	cr_assert_eq(eng_step(e, it, 1, err, sizeof err), WK_OK, "%s: %s", what, err);
}

/* One sequence's outputs: after its prompt's rest, then DEC decodes. */
struct run {
	float *lg;          /* [1 + DEC][V] */
	int tok[1 + DEC];
	int draft[1 + DEC][KD];
	float *dlg;         /* [1 + DEC][KD][V] with the MTP layer */
};

static void run_free(struct run *r)
{
	free(r->lg);
	free(r->dlg);
}

/* Steps seq from position `from` through the rest of the prompt, then DEC tokens (each the
 * previous argmax), recording everything; with mtp, each step also drafts KD tokens. */
static void go_on(struct engine *e, int seq, int from, bool mtp, struct run *r, const char *what)
{
	int V = eng_info(e)->vocab;
	r->lg = malloc(sizeof(float) * (1 + DEC) * V);
	r->dlg = mtp ? malloc(sizeof(float) * (1 + DEC) * KD * V) : NULL;
	cr_assert(r->lg && (!mtp || r->dlg));
	for (int s = 0; s <= DEC; s++) {
		struct eng_item it = {.seq = seq, .tokens = s ? &r->tok[s - 1] : prompt + from,
				      .n = s ? 1 : NP - from, .logits = r->lg + (size_t)s * V,
				      .token = &r->tok[s]};
		if (mtp) {
			it.drafts = KD;
			it.draft = r->draft[s];
			it.draft_logits = r->dlg + (size_t)s * KD * V;
		}
		step1(e, &it, what);
		cr_assert_eq(eng_seq_len(e, seq), NP + s, "%s", what);
	}
}

static void same(const struct run *a, const struct run *b, int V, bool mtp, const char *what,
		 const char *which)
{
	cr_expect_eq(memcmp(a->lg, b->lg, sizeof(float) * (1 + DEC) * V), 0,
		     "%s: %s: the logits differ", what, which);
	cr_expect_eq(memcmp(a->tok, b->tok, sizeof a->tok), 0, "%s: %s: the tokens differ", what,
		     which);
	if (mtp) {
		cr_expect_eq(memcmp(a->draft, b->draft, sizeof a->draft), 0,
			     "%s: %s: the drafts differ", what, which);
		cr_expect_eq(memcmp(a->dlg, b->dlg, sizeof(float) * (1 + DEC) * KD * V), 0,
			     "%s: %s: the drafts' logits differ", what, which);
	}
}

/* Bytes of sequence a's first len positions (eng_seq_save); *n their size. */
static char *save(struct engine *e, int a, int len, size_t *n, const char *what)
{
	*n = eng_seq_bytes(e, len);
	cr_assert_gt(*n, 8, "%s", what);
	char *buf = malloc(*n);
	cr_assert(buf);
	cr_assert_eq(eng_seq_save(e, a, len, buf, *n, err, sizeof err), WK_OK, "%s: %s", what,
		     err);
	return buf;
}

/* Sequence b (allocated, empty) takes those bytes; a refusal first leaves it empty. */
static void load(struct engine *e, int b, const char *buf, size_t n, const char *what)
{
	cr_expect_eq(eng_seq_load(e, b, buf, n - 1, err, sizeof err), WK_EFORMAT, "%s", what);
	cr_expect(strstr(err, "do not hold"), "%s", err);
	cr_assert_eq(eng_seq_len(e, b), 0, "%s: a refused load left positions", what);
	cr_assert_eq(eng_seq_load(e, b, buf, n, err, sizeof err), WK_OK, "%s: %s", what, err);
}

/* B takes A's first cut positions: copied, or saved and loaded. */
static void lend(struct engine *e, int b, int a, int cut, const char *what)
{
	if (!saved) {
		cr_assert_eq(eng_seq_copy(e, b, a, cut, err, sizeof err), WK_OK, "%s: %s", what,
			     err);
		return;
	}
	size_t n;
	char *buf = save(e, a, cut, &n, what);
	load(e, b, buf, n, what);
	free(buf);
}

/* The check described at the top, on engine e. With waiting (the MTP layer loaded), the
 * prompts go in without a token wanted but with the MTP layer's caches kept up (as the
 * scheduler's prompt chunks), so that their last position's hidden state waits for its next
 * token (glm.c's pend); B then copies all of A's NP - 1 positions. */
static void check(struct engine *e, bool mtp, bool waiting, const char *what)
{
	int V = eng_info(e)->vocab, a, b, d, f;
	cr_assert_eq(eng_seq_alloc(e, &a), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &d), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &b), WK_OK);
	int cut = waiting ? NP - 1 : CUT, t0, t1, dr[KD];
	/* A and D take the prompt alike: whole, a token and (with the MTP layer) drafts wanted;
	 * or waiting, its first NP - 1 tokens and no token */
	for (int k = 0; k < 2; k++) {
		struct eng_item it = {.seq = k ? d : a, .tokens = prompt, .n = waiting ? cut : NP,
				      .token = waiting ? NULL : k ? &t1 : &t0, .mtp_cache = mtp};
		if (mtp && !waiting) {
			it.drafts = KD;
			it.draft = dr;
		}
		step1(e, &it, what);
	}
	if (!waiting)
		cr_assert_eq(eng_seq_truncate(e, d, cut), WK_OK);
	lend(e, b, a, cut, what);
	cr_assert_eq(eng_seq_len(e, b), cut);
	cr_assert_eq(eng_seq_len(e, a), waiting ? cut : NP, "%s: the source is unchanged", what);
	struct run rb, rd, ra, rf;
	go_on(e, b, cut, mtp, &rb, what);
	go_on(e, d, cut, mtp, &rd, what);
	same(&rb, &rd, V, mtp, what, "the copy against the truncated sequence");
	/* A itself goes on from where it was, as a sequence that lent nothing: F */
	eng_seq_free(e, d);
	cr_assert_eq(eng_seq_alloc(e, &f), WK_OK);
	if (waiting) {
		struct eng_item it = {.seq = f, .tokens = prompt, .n = cut, .mtp_cache = mtp};
		step1(e, &it, what);
		go_on(e, a, cut, mtp, &ra, what);
		go_on(e, f, cut, mtp, &rf, what);
	} else {
		struct eng_item it = {.seq = f, .tokens = prompt, .n = NP, .token = &t1};
		if (mtp) {
			it.drafts = KD;
			it.draft = dr;
		}
		step1(e, &it, what);
		cr_assert_eq(eng_seq_truncate(e, f, cut), WK_OK);
		cr_assert_eq(eng_seq_truncate(e, a, cut), WK_OK);
		go_on(e, a, cut, mtp, &ra, what);
		go_on(e, f, cut, mtp, &rf, what);
	}
	same(&ra, &rf, V, mtp, what, "the source against one that lent nothing");
	/* and the copy's outputs are the model's: close to a fresh prefill's (the order of its
	 * sums differs), so a copy of the wrong rows would not pass for one */
	cr_assert_eq(eng_seq_truncate(e, f, 0), WK_OK);
	struct eng_item it = {.seq = f, .tokens = prompt, .n = NP, .logits = rf.lg, .token = &t1};
	step1(e, &it, what);
	double r = rel(rb.lg, rf.lg, V);
	cr_expect_leq(r, 2e-2, "%s: the copy's first logits are %g from a fresh prefill's", what, r);
	fprintf(stderr, "seq_copy: %s: copy vs fresh prefill %.2g\n", what, r);
	run_free(&rb);
	run_free(&rd);
	run_free(&ra);
	run_free(&rf);
	/* refusals */
	cr_expect_eq(eng_seq_copy(e, b, b, 1, err, sizeof err), WK_EINVAL);
	cr_expect_eq(eng_seq_copy(e, b, a, 0, err, sizeof err), WK_EINVAL);
	cr_expect_eq(eng_seq_copy(e, b, a, eng_seq_len(e, a) + 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "copied"), "%s", err);
	eng_seq_free(e, b);
	cr_expect_eq(eng_seq_copy(e, b, a, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "not allocated"), "%s", err);
	cr_expect_eq(eng_seq_copy(e, a, 9, 1, err, sizeof err), WK_EINVAL);
	eng_seq_free(e, a);
	eng_seq_free(e, f);
}

static void each_kv(const char *dir, const struct backend *be, const char *label)
{
	const char *kvs[] = {"f32", "bf16", "fp8"};
	for (int k = 0; k < 3; k++) {
		char what[128];
		snprintf(what, sizeof what, "%s, %s cache%s%s", label, kvs[k], be ? ", devsim" : "",
			 saved ? ", saved" : "");
		struct engine *e = open_dir(dir, be, kvs[k], ENG_MTP_OFF);
		check(e, false, false, what);
		eng_close(e);
	}
}

Test(seq_copy, llama_is_the_source_truncated)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512];
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	char *dir = mkdir_tmp();
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "convert: %s", err);
	each_kv(dir, NULL, "stories260K");
	each_kv(dir, &be_devsim, "stories260K");
	rm_rf(dir);
	free(dir);
}

Test(seq_copy, glm_families_are_the_source_truncated)
{
	char *g5 = gen_glm_dir("glm5", "--index-topk 4"), *g4 = gen_glm_dir("glm4", "");
	each_kv(g5, NULL, "GLM-5");
	each_kv(g5, &be_devsim, "GLM-5");
	each_kv(g4, NULL, "GLM-4.5");
	each_kv(g4, &be_devsim, "GLM-4.5");
	rm_rf(g5);
	rm_rf(g4);
	free(g5);
	free(g4);
}

/* The MTP layer's caches are copied with the main model's, and the hidden state a prompt's
 * last position leaves waiting for its next token: the copy's drafts are the truncated
 * sequence's, and with nothing truncated the waiting row's. */
Test(seq_copy, mtp_drafts_follow_the_copy)
{
	const char *fams[] = {"glm5", "glm4"};
	for (int k = 0; k < 2; k++) {
		char *dir = gen_glm_dir(fams[k], k ? "--mtp" : "--mtp --index-topk 4"), what[64];
		for (int dev = 0; dev < 2; dev++) {
			struct engine *e = open_dir(dir, dev ? &be_devsim : NULL, "f32", ENG_MTP_ON);
			cr_assert_eq(eng_info(e)->mtp, 1);
			for (int sv = 1; sv >= 0; sv--) { /* (saved first: then no copy
							     * has left B's rows as A's) */
				saved = sv;
				const char *how = sv ? ", saved" : "";
				snprintf(what, sizeof what, "%s mtp%s%s", fams[k],
					 dev ? ", devsim" : "", how);
				check(e, true, false, what);
				snprintf(what, sizeof what, "%s mtp, waiting%s%s", fams[k],
					 dev ? ", devsim" : "", how);
				check(e, true, true, what);
			}
			saved = false;
			eng_close(e);
		}
		rm_rf(dir);
		free(dir);
	}
}

/* Sharded: the copy runs on every rank (tp 2 splits the heads and so each rank's caches; ep 2
 * the experts), and the sharded copy is the sharded source truncated. Saved, the rows every
 * rank holds alike are kept once (GLM-5's latent: rank 1 loads rank 0's). */
Test(seq_copy, every_rank_copies)
{
	const char *fams[] = {"glm5", "glm4"}, *labels[] = {"GLM-5", "GLM-4.5"};
	for (int k = 0; k < 2; k++) {
		/* (GLM-5's latent caches are whole on every rank; GLM-4.5's KV heads split) */
		char *hf = gen_glm_dir(fams[k], k ? "" : "--index-topk 4"), *sn = mkdir_tmp();
		char out[600], what[64];
		snprintf(out, sizeof out, "%s/s", sn);
		struct eng_snap_opts so = {.tp = 2, .ep = 2, .dtype = "keep"};
		cr_assert_eq(eng_snapshot(hf, out, &so, err, sizeof err), WK_OK, "%s", err);
		struct engine *e = open_dir(out, NULL, "bf16", ENG_MTP_OFF);
		cr_assert_eq(e->world, 2);
		/* saved, each row once: GLM-5's whole latent from rank 0 alone, GLM-4.5's heads
		 * from each rank: the bytes of the model unsharded */
		struct engine *one = open_dir(hf, NULL, "bf16", ENG_MTP_OFF);
		cr_expect_eq(eng_seq_bytes(e, 5), eng_seq_bytes(one, 5), "%s: %zu bytes sharded, "
			     "%zu not", labels[k], eng_seq_bytes(e, 5), eng_seq_bytes(one, 5));
		eng_close(one);
		for (int sv = 1; sv >= 0; sv--) { /* saved: every rank's bytes at its offset */
			saved = sv;
			snprintf(what, sizeof what, "%s tp 2 ep 2%s", labels[k], sv ? ", saved" : "");
			check(e, false, false, what);
		}
		eng_close(e);
		rm_rf(hf);
		rm_rf(sn);
		free(hf);
		free(sn);
	}
}

/* Saved bytes hold what a copy holds, in every family and cache type. */
Test(seq_copy, saved_caches_are_the_source_truncated)
{
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	char bin[512], tok[512];
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
	char *dir = mkdir_tmp(), *g5 = gen_glm_dir("glm5", "--index-topk 4");
	char *g4 = gen_glm_dir("glm4", "");
	cr_assert_eq(conv_llama2c(bin, tok, dir, err, sizeof err), WK_OK, "convert: %s", err);
	saved = true;
	each_kv(dir, &be_devsim, "stories260K");
	each_kv(g5, &be_devsim, "GLM-5");
	each_kv(g4, NULL, "GLM-4.5");
	saved = false;
	const char *dirs[] = {dir, g5, g4};
	for (int i = 0; i < 3; i++) {
		rm_rf(dirs[i]);
		free((void *)dirs[i]);
	}
}

static uint64_t id_of(struct engine *e)
{
	uint64_t id = 0;
	cr_assert_eq(eng_cache_id(e, &id, err, sizeof err), WK_OK, "%s", err);
	return id;
}

/* Saved by one engine and loaded by another opened alike (as by a worker's next start): the
 * loaded sequence goes on as the new engine's own prefill truncated does, bit for bit. The
 * cache's identity is equal between them, and differs with the KV cache's type, the backend,
 * or a weights file touched. */
Test(seq_copy, saved_caches_load_into_another_engine)
{
	char *dir = gen_glm_dir("glm5", "--mtp --index-topk 4"), what[] = "GLM-5 mtp, reopened";
	struct engine *e = open_dir(dir, NULL, "fp8", ENG_MTP_ON);
	uint64_t id = id_of(e);
	int a, b, d, t;
	cr_assert_eq(eng_seq_alloc(e, &a), WK_OK);
	struct eng_item it = {.seq = a, .tokens = prompt, .n = NP, .token = &t, .mtp_cache = true};
	step1(e, &it, what);
	size_t n;
	char *buf = save(e, a, CUT, &n, what);
	eng_close(e);

	e = open_dir(dir, NULL, "fp8", ENG_MTP_ON);
	cr_assert_eq(id_of(e), id, "the same model, opened alike, has another cache id");
	cr_assert_eq(eng_seq_alloc(e, &b), WK_OK);
	cr_assert_eq(eng_seq_alloc(e, &d), WK_OK);
	load(e, b, buf, n, what);
	cr_assert_eq(eng_seq_len(e, b), CUT);
	it.seq = d;
	step1(e, &it, what);
	cr_assert_eq(eng_seq_truncate(e, d, CUT), WK_OK);
	struct run rb, rd;
	go_on(e, b, CUT, true, &rb, what);
	go_on(e, d, CUT, true, &rd, what);
	same(&rb, &rd, eng_info(e)->vocab, true, what, "the loaded sequence against its prefill");
	run_free(&rb);
	run_free(&rd);
	/* refusals: a sequence not allocated, more positions than it holds, bytes of another
	 * length */
	cr_expect_eq(eng_seq_load(e, 3, buf, n, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "not allocated"), "%s", err);
	cr_expect_eq(eng_seq_save(e, b, eng_seq_len(e, b) + 1, buf, n, err, sizeof err),
		     WK_EINVAL);
	cr_expect_eq(eng_seq_save(e, b, CUT + 1, buf, n, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "take"), "%s", err);
	int32_t bad = 9999;
	memcpy(buf, &bad, sizeof bad);
	cr_expect_eq(eng_seq_load(e, b, buf, n, err, sizeof err), WK_EFORMAT);
	free(buf);
	eng_close(e);

	e = open_dir(dir, NULL, "bf16", ENG_MTP_ON);
	cr_expect_neq(id_of(e), id, "another KV cache type, the same cache id");
	eng_close(e);
	e = open_dir(dir, &be_devsim, "fp8", ENG_MTP_ON);
	cr_expect_neq(id_of(e), id, "another backend, the same cache id");
	eng_close(e);
	e = open_dir(dir, NULL, "fp8", ENG_MTP_OFF);
	cr_expect_neq(id_of(e), id, "no MTP layer, the same cache id");
	eng_close(e);
	char path[600];
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s", path);
	struct utimbuf ut = {.actime = st.st_atime, .modtime = st.st_mtime + 10};
	cr_assert_eq(utime(path, &ut), 0);
	e = open_dir(dir, NULL, "fp8", ENG_MTP_ON);
	cr_expect_neq(id_of(e), id, "the weights touched, the same cache id");
	eng_close(e);
	rm_rf(dir);
	free(dir);
}
