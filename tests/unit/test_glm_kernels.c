/*
 * test_glm_kernels.c - the GLM families' DSA and router (glm_test.h's tiny checkpoints): the
 * DSA indexer's top-k (one that covers every key is dense attention, ties go to the lower
 * position, the keys and values of unselected positions do not matter), the MLA absorption and
 * attention kernels and the indexer score (AVX2 and over FP8 caches) against the references,
 * the CPU backend's grouped MoE op against cpu_ref_moe_experts, and the router (the correction
 * bias selects but does not weigh, group limiting changes the choice, ties go to the lower
 * index), at the kernels and in a model's logits.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/glm_int.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/glm_kernels.h"
#include "tests/unit/glm_test.h"

/* The next random byte of c's xorshift state. */
static unsigned next_u8(struct ckpt *c)
{
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return (unsigned)((c->rng * 0x2545F4914F6CDD1Dull) >> 56);
}

/* ---- (3) DSA ------------------------------------------------------------------------------- */

/* index_topk >= the sequence: the indexer selects every causal key, i.e. dense attention.
 * Model level: index_topk = the prompt length gives the same logits as an index_topk no
 * prompt reaches. Kernel level: the top-k of a query with <= topk keys is all of them, and
 * attention restricted to that selection is bit-identical to dense causal attention. */
Test(glm, dsa_full_topk_is_dense)
{
	/* Three models with the same weights: index_topk 4 (sparse from the fifth position on),
	 * the prompt length (every query keeps all its keys), and one no prompt reaches. */
	int n = NIDS;
	float *out[3];
	int topks[3] = {4, NIDS, 1 << 20};
	set_mla("expand"); /* the same attention path for all three */
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		struct g5dims d = {.topk = topks[k], .n_group = 1, .topk_group = 1,
				   .wdt = DT_F8_E4M3, .seed = 99, .bias_std = 0.1f};
		write_glm5(dir, &d);
		struct engine *e = open_model(dir);
		out[k] = prefill(e, n);
		eng_close(e);
		rm_rf(dir);
		free(dir);
	}
	set_mla(NULL);
	size_t V = G5_VOCAB;
	cr_expect_eq(memcmp(out[1], out[2], sizeof(float) * n * V), 0);
	/* With index_topk 4 the first four queries go through the indexer's selection, which
	 * keeps all of their keys: exactly dense. Later ones attend to 4 of their keys. */
	for (int i = 0; i < 4; i++) /* not bitwise: the MoE batches other tokens differently */
		cr_expect_leq(rel(out[0] + i * V, out[2] + i * V, (int)V), 1e-6, "position %d: %g", i,
			      rel(out[0] + i * V, out[2] + i * V, (int)V));
	cr_expect_gt(rel(out[0] + (n - 1) * V, out[2] + (n - 1) * V, (int)V), 1e-4,
		     "index_topk 4 changed nothing at position %d", n - 1);
	for (int k = 0; k < 3; k++)
		free(out[k]);

	/* Kernels: a random MLA problem of 9 queries, 3 heads, 20 cached positions. */
	enum { T = 20, NQ = 9, P0 = T - NQ, H = 3, DA = 6, DB = 4, DV = 5, IH = 2, ID = 8 };
	struct ckpt r = {.rng = 5};
	float q[NQ * H * (DA + DB)], ka[T * H * DA], kb[T * DB], v[T * H * DV];
	float iq[NQ * IH * ID], ik[T * ID], iw[NQ * IH], scores[T];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r);
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof v / 4; i++) v[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	int sel[NQ * T], nsel[NQ];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ik, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = T,
			     .qk_scale = 0.3f, .w_scale = 0.7f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	for (int i = 0; i < NQ; i++) {
		cr_assert_eq(nsel[i], P0 + i + 1);
		for (int j = 0; j < nsel[i]; j++)
			cr_assert_eq(sel[i * T + j], j);
	}
	struct cpu_mla s = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb,
			    .v = v, .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB,
			    .v_stride = H * DV, .v_head = DV, .sel = sel, .nsel = nsel,
			    .sel_stride = T, .scale = 0.4f};
	float o1[NQ * H * DV], o2[NQ * H * DV];
	cpu_ref_mla_attention(o1, q, &s, NQ, P0, 0, NQ, 0, H);
	s.sel = NULL;
	cpu_ref_mla_attention(o2, q, &s, NQ, P0, 0, NQ, 0, H);
	cr_expect_eq(memcmp(o1, o2, sizeof o1), 0);
	/* The pooled backend op agrees with the reference (to rounding: it may be the AVX2
	 * version). */
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config bc = {.threads = 3};
	cr_assert_eq(be_cpu.init(&ctx, &bc, err, sizeof err), WK_OK);
	struct be_mla bs = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb,
			    .v = v, .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB,
			    .v_stride = H * DV, .v_head = DV, .sel = NULL, .nsel = nsel,
			    .sel_stride = T, .scale = 0.4f};
	be_cpu.mla_attention(ctx, o1, q, &bs, NQ, P0); /* AVX2 when the CPU has it */
	cr_expect_leq(rel(o1, o2, NQ * H * DV), 1e-5);
	be_cpu.shutdown(ctx);
}

/* Element i of a KV cache of type t (f32 or bf16) set to v. */
static void put_kv(void *c, enum dt_type t, size_t i, float v)
{
	if (t == DT_BF16)
		((uint16_t *)c)[i] = dt_f32_to_bf16(v);
	else
		((float *)c)[i] = v;
}

/* A small index_topk: the keys (c_kv) and values of positions the indexer did not select can
 * be anything. After a prefill, the last layer's compressed cache rows that the final
 * query's selection left out are overwritten with garbage and the final step re-run: its
 * logits do not change (both MLA paths). Garbage in one selected row does change them. */
Test(glm, dsa_unselected_keys_do_not_matter)
{
	char *dir = mkdir_tmp();
	struct g5dims d = {.topk = 3, .n_group = 1, .topk_group = 1, .wdt = DT_F8_E4M3,
			   .seed = 4321, .bias_std = 0.1f};
	write_glm5(dir, &d);
	const char *modes[] = {"absorb", "expand"};
	int n = NIDS, last = n - 1;
	for (int k = 0; k < 2; k++) {
		set_mla(modes[k]);
		struct engine *e = open_model(dir);
		char err[WK_ERRSZ];
		float *base = malloc(sizeof(float) * G5_VOCAB), *again = malloc(sizeof(float) * G5_VOCAB);
		float *pre = malloc(sizeof(float) * n * G5_VOCAB);
		cr_assert_eq(eng_forward(e, ids, last, 0, pre, true, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, base, false, err, sizeof err), WK_OK);
		struct glm5_debug g;
		cr_assert_eq(glm5_debug(e, &g), WK_OK);
		cr_assert(g.sparse);
		cr_assert_eq(g.nsel[0], 3);
		bool chosen[64] = {false};
		for (int j = 0; j < g.nsel[0]; j++)
			chosen[g.sel[j]] = true;
		int dropped = 0, kept = -1;
		for (int t = 0; t < last; t++) {
			if (chosen[t]) {
				kept = t;
				continue;
			}
			dropped++;
			for (int c = 0; c < g.lora; c++)
				put_kv(g.ckv, g.kv, (size_t)t * g.lora + c,
				       1e3f * (float)(c + t) - 7.0f);
			for (int c = 0; c < g.rope; c++)
				put_kv(g.kpe, g.kv, (size_t)t * g.rope + c, -5e2f * (float)(c + 1));
		}
		cr_assert_geq(dropped, n - 1 - 3);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, again, false, err, sizeof err), WK_OK);
		cr_expect_eq(memcmp(base, again, sizeof(float) * G5_VOCAB), 0,
			     "%s: unselected cache rows changed the output", modes[k]);
		/* Sanity: the same garbage in a selected row (not the query's own) matters. */
		cr_assert_geq(kept, 0, "the selection holds only the query itself");
		for (int c = 0; c < g.lora; c++)
			put_kv(g.ckv, g.kv, (size_t)kept * g.lora + c,
			       3.0f * (float)(c % 5) - 6.0f);
		cr_assert_eq(eng_forward(e, ids + last, 1, last, again, false, err, sizeof err), WK_OK);
		cr_expect_gt(rel(again, base, G5_VOCAB), 1e-3, "%s: a selected row did not matter",
			     modes[k]);
		free(base);
		free(again);
		free(pre);
		eng_close(e);
	}
	set_mla(NULL);
	rm_rf(dir);
	free(dir);
}

/* Exact top-k with deterministic ties: equal scores go to the lower position. */
Test(glm, dsa_topk_ties)
{
	float scores[8] = {1, 3, 2, 3, 3, 0, 2, NAN};
	int sel[8], nsel;
	char work[64];
	cpu_ref_dsa_select(sel, &nsel, scores, 8, 4, work);
	cr_assert_eq(nsel, 4);
	int want[4] = {1, 2, 3, 4}; /* 3, 3, 3 at 1, 3, 4; then 2 at 2 (not 6) */
	for (int j = 0; j < 4; j++)
		cr_expect_eq(sel[j], want[j], "sel[%d] = %d", j, sel[j]);
}

/* The AVX2 absorption kernels against the reference: FP8 (heads crossing 128-row blocks,
 * lora past the row buffer and not a multiple of 8) and BF16. */
Test(glm, absorb_avx2_matches_ref)
{
	if (!cpu_has_avx2())
		cr_skip_test("no AVX2");
	enum { H = 3, NOPE = 70, ROPE = 6, DV = 50, LORA = 1100, N = 3 };
	int rows = H * (NOPE + DV);
	struct ckpt c = {.rng = 3};
	tensor(&c, "w8", DT_F8_E4M3, rows, LORA, 0.0f, 0.1f);
	tensor(&c, "w16", DT_BF16, rows, LORA, 0.0f, 0.1f);
	float *q = malloc(sizeof(float) * N * H * (NOPE + ROPE));
	float *lat = malloc(sizeof(float) * N * H * LORA);
	for (int i = 0; i < N * H * (NOPE + ROPE); i++) q[i] = gauss(&c);
	for (int i = 0; i < N * H * LORA; i++) lat[i] = gauss(&c);
	size_t qa = sizeof(float) * N * H * (LORA + ROPE);
	float *a = malloc(qa), *b = malloc(qa);
	for (int k = 0; k < 2; k++) {
		const struct st_out *w = &c.t[k == 0 ? 0 : 2];
		const float *sc = k == 0 ? c.t[1].data : NULL;
		cpu_ref_mla_absorb_q(a, q, w->data, w->dtype, sc, LORA, N, H, NOPE, ROPE, DV, 0, H);
		cpu_mla_absorb_q_avx2(b, q, w->data, w->dtype, sc, LORA, N, H, NOPE, ROPE, DV, 0, H);
		cr_expect_leq(rel(b, a, N * H * (LORA + ROPE)), 1e-5, "absorb_q %s", dt_name(w->dtype));
		cpu_ref_mla_absorb_out(a, lat, w->data, w->dtype, sc, LORA, N, H, NOPE, DV, 0, H);
		cpu_mla_absorb_out_avx2(b, lat, w->data, w->dtype, sc, LORA, N, H, NOPE, DV, 0, H);
		cr_expect_leq(rel(b, a, N * H * DV), 1e-5, "absorb_out %s", dt_name(w->dtype));
	}
	free(q);
	free(lat);
	free(a);
	free(b);
	for (size_t i = 0; i < c.nb; i++)
		free(c.bufs[i]);
	for (size_t i = 0; i < c.n; i++)
		free(c.names[i]);
}

/* The AVX2 MLA attention (one pass, online softmax) and indexer score against the
 * references, with a selection and dense, in both the expanded and the absorbed layouts. */
Test(glm, attention_avx2_matches_ref)
{
	if (!cpu_has_avx2())
		cr_skip_test("no AVX2");
	enum { T = 40, NQ = 7, P0 = T - NQ, H = 4, DA = 37, DB = 10, DV = 29, IH = 3, ID = 21,
	       TOPK = 9 };
	struct ckpt r = {.rng = 17};
	static float q[NQ * H * (DA + DB)], ka[T * H * DA], kb[T * DB], v[T * H * DV];
	static float iq[NQ * IH * ID], ik[T * ID], iw[NQ * IH];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r);
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof v / 4; i++) v[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	for (int i = 0; i < NQ; i++)
		for (int t = 0; t < T; t++) {
			float a = cpu_ref_dsa_score(iq + i * IH * ID, ik + t * ID, DT_F32, NULL,
						    iw + i * IH, IH, ID, 0.2f, 0.6f);
			float b = cpu_dsa_score_avx2(iq + i * IH * ID, ik + t * ID, DT_F32, NULL,
						     iw + i * IH, IH, ID, 0.2f, 0.6f);
			cr_expect_leq(fabsf(a - b), 1e-5f * (1.0f + fabsf(a)), "score %d %d", i, t);
		}
	int sel[NQ * TOPK], nsel[NQ];
	float scores[T];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ik, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = TOPK,
			     .qk_scale = 0.2f, .w_scale = 0.6f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	/* expanded layout: per-head keys; absorbed: one key and value for all heads */
	struct cpu_mla lay[2] = {
		{.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DV, .k_a = ka, .k_b = kb, .v = v,
		 .ka_stride = H * DA, .ka_head = DA, .kb_stride = DB, .v_stride = H * DV,
		 .v_head = DV, .sel_stride = TOPK, .scale = 0.3f},
		{.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DA, .k_a = ka, .k_b = kb, .v = ka,
		 .ka_stride = DA, .ka_head = 0, .kb_stride = DB, .v_stride = DA, .v_head = 0,
		 .sel_stride = TOPK, .scale = 0.3f},
	};
	static float o1[NQ * H * DA], o2[NQ * H * DA];
	for (int k = 0; k < 4; k++) {
		struct cpu_mla s = lay[k / 2];
		if (k % 2) {
			s.sel = sel;
			s.nsel = nsel;
		}
		cpu_ref_mla_attention(o1, q, &s, NQ, P0, 0, NQ, 0, H);
		cpu_mla_attention_avx2(o2, q, &s, NQ, P0, 0, NQ, 0, H);
		cr_expect_leq(rel(o2, o1, NQ * H * s.d_v), 1e-5, "layout %d, sel %d", k / 2, k % 2);
	}
}

/* FP8 KV caches at the kernels: cpu_ref_cast's quantization is cpu_ref_act_quant's (codes and
 * scales back to f32 bit for bit, partial blocks and an all-zero block included); MLA
 * attention over an FP8 latent (bf16 k_pe) and indexer scores over FP8 keys are the f32
 * references' over the dequantized values bit for bit, and the AVX2 versions are within 1e-5
 * of them, dense and with a selection. */
Test(glm, fp8_cache_kernels)
{
	enum { T = 40, NQ = 7, P0 = T - NQ, H = 3, DA = 200, DB = 10, IH = 3, ID = 150, TOPK = 9 };
	struct ckpt r = {.rng = 23};
	static float q[NQ * H * (DA + DB)], ka[T * DA], kaq[T * DA], kb[T * DB], kbq[T * DB];
	static float iq[NQ * IH * ID], ik[T * ID], ikq[T * ID], iw[NQ * IH], want[T * DA];
	static uint8_t ka8[T * DA], ik8[T * ID];
	static uint16_t kb16[T * DB];
	static float kas[T * 2], iks[T * 2];
	for (size_t i = 0; i < sizeof q / 4; i++) q[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ka / 4; i++) ka[i] = gauss(&r) * (i % DA < 128 ? 1 : 30);
	for (int c = 128; c < DA; c++) /* row 3's second block: all zeros */
		ka[3 * DA + c] = 0;
	for (size_t i = 0; i < sizeof kb / 4; i++) kb[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iq / 4; i++) iq[i] = gauss(&r);
	for (size_t i = 0; i < sizeof ik / 4; i++) ik[i] = gauss(&r);
	for (size_t i = 0; i < sizeof iw / 4; i++) iw[i] = gauss(&r);
	cpu_ref_cast(ka8, DT_F8_E4M3, ka, DT_F32, T * DA, kas, NULL, DA);
	cpu_ref_cast(kaq, DT_F32, ka8, DT_F8_E4M3, T * DA, NULL, kas, DA);
	cpu_ref_act_quant(want, ka, T, DA);
	cr_expect_eq(memcmp(kaq, want, sizeof want), 0, "FP8 cache rows are not act_quant's");
	cr_expect(kas[3 * 2 + 1] == 1.0f && ka8[3 * DA + 150] == 0, "an all-zero block: scale %g",
		  kas[3 * 2 + 1]);
	cpu_ref_cast(kb16, DT_BF16, kb, DT_F32, T * DB, NULL, NULL, 0);
	cpu_ref_cast(kbq, DT_F32, kb16, DT_BF16, T * DB, NULL, NULL, 0);
	cpu_ref_cast(ik8, DT_F8_E4M3, ik, DT_F32, T * ID, iks, NULL, ID);
	cpu_ref_cast(ikq, DT_F32, ik8, DT_F8_E4M3, T * ID, NULL, iks, ID);
	for (int i = 0; i < NQ; i++)
		for (int t = 0; t < T; t++) {
			const float *qi = iq + i * IH * ID, *wi = iw + i * IH;
			float a = cpu_ref_dsa_score(qi, ikq + t * ID, DT_F32, NULL, wi, IH, ID, 0.2f,
						    0.6f);
			float b = cpu_ref_dsa_score(qi, ik8 + t * ID, DT_F8_E4M3, iks + t * 2, wi, IH,
						    ID, 0.2f, 0.6f);
			cr_expect_eq(a, b, "score %d %d: %g on the FP8 keys, %g dequantized", i, t,
				     b, a);
			if (cpu_has_avx2()) {
				float c = cpu_dsa_score_avx2(qi, ik8 + t * ID, DT_F8_E4M3,
							     iks + t * 2, wi, IH, ID, 0.2f, 0.6f);
				cr_expect_leq(fabsf(c - a), 1e-5f * (1.0f + fabsf(a)), "avx2 score "
					      "%d %d: %g, not %g", i, t, c, a);
			}
		}
	int sel[NQ * TOPK], nsel[NQ], sel8[NQ * TOPK], nsel8[NQ];
	float scores[T];
	char work[T * 8];
	struct cpu_dsa dd = {.k = ikq, .kv = DT_F32, .n_heads = IH, .head_dim = ID, .topk = TOPK,
			     .qk_scale = 0.2f, .w_scale = 0.6f};
	cpu_ref_dsa_topk(sel, nsel, iq, iw, &dd, NQ, P0, scores, work);
	dd.k = ik8;
	dd.ks = iks;
	dd.kv = DT_F8_E4M3;
	cpu_ref_dsa_topk(sel8, nsel8, iq, iw, &dd, NQ, P0, scores, work);
	cr_expect_eq(memcmp(sel, sel8, sizeof sel), 0, "FP8 keys select differently");
	cr_expect_eq(memcmp(nsel, nsel8, sizeof nsel), 0);
	/* the absorbed layout: one latent key and value for all heads */
	struct cpu_mla f = {.n_heads = H, .d_a = DA, .d_b = DB, .d_v = DA, .kv = DT_F32,
			    .k_a = kaq, .k_b = kbq, .v = kaq, .ka_stride = DA, .kb_stride = DB,
			    .v_stride = DA, .sel_stride = TOPK, .scale = 0.05f};
	struct cpu_mla e8 = f;
	e8.kv = DT_F8_E4M3;
	e8.k_a = e8.v = ka8;
	e8.a_s = kas;
	e8.k_b = kb16;
	static float o1[NQ * H * DA], o2[NQ * H * DA], o3[NQ * H * DA];
	for (int k = 0; k < 2; k++) {
		f.sel = e8.sel = k ? sel : NULL;
		f.nsel = e8.nsel = k ? nsel : NULL;
		cpu_ref_mla_attention(o1, q, &f, NQ, P0, 0, NQ, 0, H);
		cpu_ref_mla_attention(o2, q, &e8, NQ, P0, 0, NQ, 0, H);
		cr_expect_eq(memcmp(o1, o2, sizeof o1), 0, "sel %d: MLA over the FP8 latent is not "
			     "the reference over its values", k);
		if (cpu_has_avx2()) {
			cpu_mla_attention_avx2(o3, q, &e8, NQ, P0, 0, NQ, 0, H);
			cr_expect_leq(rel(o3, o1, NQ * H * DA), 1e-5, "sel %d: avx2 MLA over the FP8 "
				      "latent", k);
		}
	}
}

/* ---- (4) router ----------------------------------------------------------------------------- */

static float logit(float p)
{
	return logf(p / (1.0f - p));
}

/* The correction bias changes which experts are chosen, but the gate values are the chosen
 * experts' unbiased sigmoid scores, normalised and scaled. */
/* The CPU backend's grouped MoE op (experts batched, threaded matmuls) against
 * cpu_ref_moe_experts (token by token): FP8 with partial 128-blocks and BF16, 16 local
 * experts of 24 (ex0 4: slots naming experts 0..3 and 20..23 are another rank's and skipped),
 * several tokens on one expert, y accumulated onto non-zero values. With a shared expert
 * (expert 0's weights) the op's y is also bit for bit what the engine's unfused path gives:
 * the shared expert's matmuls and silu_mul into y, then the routed experts added. */
Test(glm, grouped_experts_match_reference)
{
	enum { DIM = 200, INTER = 144, NL = 16, EX0 = 4, K = 8, N = 37 };
	struct ckpt c = {.rng = 4242};
	enum dt_type dts[] = {DT_F8_E4M3, DT_BF16};
	void *ctx;
	char err[WK_ERRSZ];
	struct be_config bc = {.threads = 2};
	cr_assert_eq(be_cpu.init(&ctx, &bc, err, sizeof err), WK_OK);
	float *x = malloc(sizeof(float) * N * DIM), *wt = malloc(sizeof(float) * N * K);
	float *y0 = malloc(sizeof(float) * N * DIM), *y1 = malloc(sizeof(float) * N * DIM);
	int *idx = malloc(sizeof(int) * N * K);
	float *ref_scr = malloc(sizeof(float) * (2 * INTER + DIM));
	cr_assert(x && wt && y0 && y1 && idx && ref_scr);
	for (int i = 0; i < N * DIM; i++) {
		x[i] = gauss(&c);
		y0[i] = y1[i] = 0.5f * gauss(&c);
	}
	for (int t = 0; t < N; t++)
		for (int j = 0; j < K; j++) {
			/* distinct experts per token from 24; tokens 0..9 all choose the same ones */
			idx[t * K + j] = ((t < 10 ? 7 : t * 5) + j * 3) % 24;
			wt[t * K + j] = 0.1f + 0.05f * (float)j;
		}
	for (int t = 0; t < N; t++)
		for (int j = 0; j < K; j++)
			for (int i = 0; i < j; i++)
				cr_assert_neq(idx[t * K + i], idx[t * K + j], "test setup: token %d", t);
	for (int d = 0; d < 2; d++) {
		enum dt_type w = dts[d];
		struct be_expert ex[NL];
		void *bufs[NL * 6];
		int nb = 0;
		for (int e = 0; e < NL; e++) {
			int shape[3][2] = {{INTER, DIM}, {INTER, DIM}, {DIM, INTER}};
			const void *data[3];
			const float *scale[3] = {NULL, NULL, NULL};
			for (int k = 0; k < 3; k++) {
				int r = shape[k][0], cc = shape[k][1];
				size_t nel = (size_t)r * cc;
				void *p = malloc(nel * dt_size(w));
				cr_assert_not_null(p);
				bufs[nb++] = p;
				if (w == DT_F8_E4M3) {
					uint8_t *b = p;
					for (size_t i = 0; i < nel; i++) {
						uint8_t v = (uint8_t)(next_u8(&c));
						b[i] = (v & 0x7f) == 0x7f ? 0x30 : v; /* no NaN codes */
					}
					size_t ns = (size_t)((r + 127) / 128) * ((cc + 127) / 128);
					float *sc = malloc(ns * sizeof *sc);
					cr_assert_not_null(sc);
					bufs[nb++] = sc;
					for (size_t i = 0; i < ns; i++)
						sc[i] = 0.002f * (1.0f + (float)i);
					scale[k] = sc;
				} else {
					float *f = malloc(nel * sizeof *f);
					cr_assert_not_null(f);
					for (size_t i = 0; i < nel; i++)
						f[i] = gauss(&c) / sqrtf((float)cc);
					uint16_t *h = p;
					for (size_t i = 0; i < nel; i++)
						h[i] = dt_f32_to_bf16(f[i]);
					free(f);
				}
				data[k] = p;
			}
			ex[e] = (struct be_expert){data[0], data[1], data[2], scale[0], scale[1], scale[2]};
		}
		struct be_experts be = {.ex0 = EX0, .n_local = NL, .top_k = K, .dim = DIM,
					.inter = INTER, .dtype = w, .experts = ex,
					.shared = &ex[0], .shared_dtype = w, .shared_inter = INTER};
		float *a = malloc(sizeof(float) * N * DIM), *b = malloc(sizeof(float) * N * DIM);
		void *scr = malloc(be_cpu.moe_scratch(ctx, N, &be));
		cr_assert(a && b && scr);
		/* one token, then all; then with expert 0's weights as a shared expert too */
		for (int it = 0, n = 1, sh = 0; it < 4; it++, n = it % 2 ? N : 1, sh = it >= 2) {
			struct cpu_shared_expert rsh = {{ex[0].gate, ex[0].up, ex[0].down,
							 ex[0].gate_s, ex[0].up_s, ex[0].down_s},
							w, INTER};
			be.shared = sh ? &ex[0] : NULL;
			be.shared_dtype = w;
			be.shared_inter = sh ? INTER : 0;
			memcpy(a, y0, sizeof(float) * N * DIM);
			memcpy(b, y0, sizeof(float) * N * DIM);
			cpu_ref_moe_experts(a, x, idx, wt, n, K, (const struct cpu_expert *)ex, EX0, NL,
					    w, DIM, INTER, sh ? &rsh : NULL, ref_scr);
			be_cpu.moe_experts(ctx, b, x, idx, wt, n, &be, scr);
			if (sh) {
				struct be_weight gw = {w, INTER, DIM, ex[0].gate, ex[0].gate_s};
				struct be_weight uw = {w, INTER, DIM, ex[0].up, ex[0].up_s};
				struct be_weight dw = {w, DIM, INTER, ex[0].down, ex[0].down_s};
				float *g = malloc(sizeof(float) * N * INTER), *u = malloc(sizeof(float) * N * INTER);
				float *un = malloc(sizeof(float) * N * DIM);
				cr_assert(g && u && un);
				be_cpu.matmul(ctx, g, x, &gw, n);
				be_cpu.matmul(ctx, u, x, &uw, n);
				be_cpu.silu_mul(ctx, g, u, (size_t)n * INTER);
				be_cpu.matmul(ctx, un, g, &dw, n);
				be.shared = NULL;
				be_cpu.moe_experts(ctx, un, x, idx, wt, n, &be, scr);
				be.shared = &ex[0];
				cr_expect_eq(memcmp(un, b, sizeof(float) * n * DIM), 0,
					     "%s, %d tokens: the shared expert inside the op differs "
					     "from it apart", dt_name(w), n);
				free(g);
				free(u);
				free(un);
			}
			double worst = 0;
			for (int t = 0; t < n; t++)
				worst = fmax(worst, rel(b + (size_t)t * DIM, a + (size_t)t * DIM, DIM));
			cr_expect_leq(worst, 1e-5, "%s, %d tokens, shared %d: grouped vs reference %g",
				      dt_name(w), n, sh, worst);
			cr_expect_neq(memcmp(a, y0, sizeof(float) * n * DIM), 0, "nothing was added");
		}
		free(a);
		free(b);
		free(scr);
		for (int i = 0; i < nb; i++)
			free(bufs[i]);
	}
	be_cpu.shutdown(ctx);
	free(x);
	free(wt);
	free(y0);
	free(y1);
	free(idx);
	free(ref_scr);
}

Test(glm, router_bias_selects_not_weighs)
{
	float p[8] = {0.9f, 0.85f, 0.3f, 0.2f, 0.5f, 0.1f, 0.05f, 0.4f};
	float lg[8], zero[8] = {0}, bias[8] = {0};
	for (int e = 0; e < 8; e++)
		lg[e] = logit(p[e]);
	int idx[2];
	float wt[2];
	cpu_ref_moe_route(idx, wt, lg, zero, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 0 && idx[1] == 1);
	bias[2] = 0.7f; /* 1.0 */
	bias[3] = 0.75f; /* 0.95 */
	cpu_ref_moe_route(idx, wt, lg, bias, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 2 && idx[1] == 3, "bias must choose 2, 3; got %d, %d", idx[0], idx[1]);
	float s2 = 1 / (1 + expf(-lg[2])), s3 = 1 / (1 + expf(-lg[3]));
	cr_expect_float_eq(wt[0], s2 / (s2 + s3 + 1e-20f) * 2.5f, 1e-6);
	cr_expect_float_eq(wt[1], s3 / (s2 + s3 + 1e-20f) * 2.5f, 1e-6);
	/* A different bias that chooses the same experts: the same weights, bit for bit. */
	float w2[2];
	bias[2] = 5.0f;
	bias[3] = 4.0f;
	cpu_ref_moe_route(idx, w2, lg, bias, 1, 8, 2, 1, 1, true, 2.5f);
	cr_assert(idx[0] == 2 && idx[1] == 3);
	cr_expect(w2[0] == wt[0] && w2[1] == wt[1]);
	/* Without norm_topk_prob: the raw scores times the factor. */
	cpu_ref_moe_route(idx, w2, lg, bias, 1, 8, 2, 1, 1, false, 2.5f);
	cr_expect_float_eq(w2[0], s2 * 2.5f, 1e-6);
	/* Ties: the lower index first. */
	float flat[8] = {0};
	cpu_ref_moe_route(idx, wt, flat, NULL, 1, 8, 2, 1, 1, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 1);
	cr_expect_float_eq(wt[0], 0.5f, 1e-6);
}

/* Group limiting: 4 groups of 2; the best single experts (0, 1) are in groups whose top-2 sums
 * lose to groups 2 and 3, so with topk_group 2 the choice moves there. */
Test(glm, router_group_limited)
{
	float p[8] = {0.9f, 0.01f, 0.8f, 0.01f, 0.6f, 0.6f, 0.55f, 0.56f};
	float lg[8];
	for (int e = 0; e < 8; e++)
		lg[e] = logit(p[e]);
	int idx[2];
	float wt[2];
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 4, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 2, "all groups: %d %d", idx[0], idx[1]);
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 2, true, 1.0f);
	cr_expect(idx[0] == 4 && idx[1] == 5, "2 groups: %d %d", idx[0], idx[1]);
	cpu_ref_moe_route(idx, wt, lg, NULL, 1, 8, 2, 4, 1, true, 1.0f);
	cr_expect(idx[0] == 4 && idx[1] == 5, "1 group: %d %d", idx[0], idx[1]);
	/* The bias takes part in the group scores too: lift group 0's weak expert. */
	float bias[8] = {0, 0.7f, 0, 0, 0, 0, 0, 0};
	cpu_ref_moe_route(idx, wt, lg, bias, 1, 8, 2, 4, 1, true, 1.0f);
	cr_expect(idx[0] == 0 && idx[1] == 1, "biased group 0: %d %d", idx[0], idx[1]);
	float s0 = p[0], s1 = p[1];
	cr_expect_float_eq(wt[1], s1 / (s0 + s1), 1e-5);

	/* Model level: topk_group and the correction bias both change a GLM-4.5's logits. */
	float *out[3];
	int tg[3] = {4, 1, 4};
	float bstd[3] = {0.0f, 0.0f, 1.0f};
	for (int k = 0; k < 3; k++) {
		char *dir = mkdir_tmp();
		write_glm4(dir, DT_BF16, 4, tg[k], bstd[k]);
		struct engine *e = open_model(dir);
		out[k] = prefill(e, NIDS);
		eng_close(e);
		rm_rf(dir);
		free(dir);
	}
	cr_expect_gt(rel(out[1], out[0], NIDS * G4_VOCAB), 1e-3, "topk_group had no effect");
	cr_expect_gt(rel(out[2], out[0], NIDS * G4_VOCAB), 1e-3, "the bias had no effect");
	for (int k = 0; k < 3; k++)
		free(out[k]);
}
