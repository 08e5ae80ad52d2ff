/*
 * test_cuda_glm.c - the GLM families' CUDA kernels (glm_kernels.cu: layernorm, the MoE router,
 * row gather and scatter, MLA's absorption and latent attention, the DSA indexer's top-k)
 * against kernels/cpu/glm_ref.c, as test_cuda.c does for the core ones; with them wk_cuda_zero
 * and the CUDA backend's chain_plan and supports() for GLM's caches.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

/* ---- GLM families (glm_kernels.cu against kernels/cpu/glm_ref.c) ---------------------------- */

Test(cuda_kernels, zero_clears_the_range)
{
	NEED_GPU();
	size_t n = 1000;
	float *x = rnd_vec(n), *got = malloc(n * 4);
	float *dx = to_dev(x, n * 4);
	cr_assert_eq(wk_cuda_zero(dx + 100, 500 * 4, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_zero(dx, 0, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, n * 4);
	for (size_t i = 0; i < n; i++)
		cr_expect_eq(got[i], i >= 100 && i < 600 ? 0.0f : x[i], "element %zu", i);
	wk_cuda_free(dx);
	free(x);
	free(got);
}

Test(cuda_kernels, layernorm_matches_ref)
{
	NEED_GPU();
	static const int shapes[][2] = {{5, 1000}, {3, 7}, {1, 128}};
	for (size_t s = 0; s < 3; s++)
		for (int with_b = 0; with_b < 2; with_b++) {
			int n = shapes[s][0], dim = shapes[s][1];
			size_t N = (size_t)n * dim;
			float *x = rnd_vec(N), *w = rnd_vec(dim), *b = rnd_vec(dim);
			for (size_t i = 0; i < N; i++)
				x[i] = x[i] * 3.0f + 0.5f; /* a mean away from 0 */
			float *want = malloc(N * 4), *got = malloc(N * 4);
			cpu_ref_layernorm(want, x, w, with_b ? b : NULL, n, dim, 1e-5f);
			float *dx = to_dev(x, N * 4), *dw = to_dev(w, dim * 4),
			      *db = to_dev(b, dim * 4);
			/* in place, as the engine calls it */
			cr_assert_eq(wk_cuda_layernorm(dx, dx, dw, with_b ? db : NULL, n, dim,
						       1e-5f, err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dx, N * 4);
			double r = rel(got, want, N);
			cr_expect_leq(r, TOL, "layernorm n=%d dim=%d b=%d: %g", n, dim, with_b, r);
			wk_cuda_free(dx);
			wk_cuda_free(dw);
			wk_cuda_free(db);
			free(x);
			free(w);
			free(b);
			free(want);
			free(got);
		}
}

/* The router's choices are compared exactly, so the sigmoid must round alike on both sides:
 * the kernel's exp is the correctly rounded one, and glibc's expf is too but for rare inputs,
 * which are nudged by an ulp until it is (so the test does not depend on the libm). */
static void route_safe_logits(float *lg, size_t n)
{
	for (size_t i = 0; i < n; i++)
		while (expf(-lg[i]) != (float)exp(-(double)lg[i]))
			lg[i] = nextafterf(lg[i], INFINITY);
}

Test(cuda_kernels, moe_route_matches_ref)
{
	NEED_GPU();
	/* experts, top_k, n_group, topk_group, norm, bias, discrete (many exact ties) */
	static const struct {
		int ne, k, ng, kg, norm, bias, ties;
	} cases[] = {
		{256, 8, 8, 4, 1, 1, 0}, /* DeepSeek-V3 / GLM-5: group-limited */
		{256, 8, 8, 4, 1, 1, 1}, /* the same with ties everywhere */
		{160, 8, 1, 1, 1, 1, 0}, /* GLM-4.5: no groups */
		{128, 6, 1, 1, 0, 0, 1}, /* no bias, unnormalised, ties */
		{1024, 16, 32, 3, 1, 1, 1}, /* the most experts, groups of 32 */
		{64, 12, 64, 12, 1, 0, 1}, /* groups of one expert */
		{96, 5, 4, 2, 1, 1, 0},
	};
	int n = 7;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int ne = cases[c].ne, k = cases[c].k, ng = cases[c].ng, kg = cases[c].kg;
		size_t N = (size_t)n * ne;
		float *lg = rnd_vec(N), *bias = rnd_vec(ne);
		for (size_t i = 0; i < N; i++)
			lg[i] = cases[c].ties ? (float)(rnd_int(12) - 6) * 0.75f + 0.1f
					      : lg[i] * 4.0f;
		for (int e = 0; e < ne; e++)
			bias[e] = cases[c].ties ? (float)rnd_int(3) * 0.5f : bias[e] * 0.3f;
		route_safe_logits(lg, N);
		int *want_i = malloc((size_t)n * k * sizeof(int)),
		    *got_i = malloc((size_t)n * k * sizeof(int));
		float *want_w = malloc((size_t)n * k * 4), *got_w = malloc((size_t)n * k * 4);
		const float *hb = cases[c].bias ? bias : NULL;
		cpu_ref_moe_route(want_i, want_w, lg, hb, n, ne, k, ng, kg, cases[c].norm, 2.5f);
		float *dl = to_dev(lg, N * 4), *db = to_dev(bias, (size_t)ne * 4);
		int *di = dev_alloc((size_t)n * k * sizeof(int));
		float *dw = dev_alloc((size_t)n * k * 4);
		cr_assert_eq(wk_cuda_moe_route(di, dw, dl, cases[c].bias ? db : NULL, n, ne, k, ng,
					       kg, cases[c].norm, 2.5f, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got_i, di, (size_t)n * k * sizeof(int));
		from_dev(got_w, dw, (size_t)n * k * 4);
		for (int i = 0; i < n * k; i++)
			cr_expect_eq(got_i[i], want_i[i],
				     "case %zu: token %d slot %d: expert %d, want %d", c, i / k,
				     i % k, got_i[i], want_i[i]);
		double r = rel(got_w, want_w, (size_t)n * k);
		cr_expect_leq(r, TOL, "case %zu: weights %g", c, r);
		wk_cuda_free(dl);
		wk_cuda_free(db);
		wk_cuda_free(di);
		wk_cuda_free(dw);
		free(lg);
		free(bias);
		free(want_i);
		free(got_i);
		free(want_w);
		free(got_w);
	}
	/* refused before any launch */
	int dummy;
	cr_expect_eq(wk_cuda_moe_route(&dummy, NULL, NULL, NULL, 1, WK_CUDA_MOE_MAX_EXPERTS + 1, 1,
				       1, 1, true, 1.0f, err, sizeof err),
		     WK_EINVAL);
	cr_expect_eq(wk_cuda_moe_route(&dummy, NULL, NULL, NULL, 1, 10, 1, 3, 1, true, 1.0f, err,
				       sizeof err),
		     WK_EINVAL, "groups must divide the experts");
	cr_expect_eq(wk_cuda_moe_route(&dummy, NULL, NULL, NULL, 1, 16, 9, 4, 2, true, 1.0f, err,
				       sizeof err),
		     WK_EINVAL, "top_k past the kept groups' experts");
}

Test(cuda_kernels, gather_scatter_rows_match_ref)
{
	NEED_GPU();
	int nsrc = 20, n = 9, dim = 1000;
	int rows[9] = {3, 0, 19, 7, 8, 12, 1, 15, 4}; /* distinct, as one expert's tokens */
	float *src = rnd_vec((size_t)nsrc * dim), *y = rnd_vec((size_t)nsrc * dim);
	float *sc = rnd_vec(n), *x = rnd_vec((size_t)n * dim);
	float *want = malloc((size_t)nsrc * dim * 4), *got = malloc((size_t)nsrc * dim * 4);
	int *dr = to_dev(rows, sizeof rows);
	float *dsrc = to_dev(src, (size_t)nsrc * dim * 4), *dg = dev_alloc((size_t)n * dim * 4);
	cpu_ref_gather_rows(want, src, rows, n, dim);
	cr_assert_eq(wk_cuda_gather_rows(dg, dsrc, dr, n, dim, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dg, (size_t)n * dim * 4);
	cr_expect_eq(memcmp(got, want, (size_t)n * dim * 4), 0, "gather_rows copies exactly");
	float *dy = to_dev(y, (size_t)nsrc * dim * 4), *dx = to_dev(x, (size_t)n * dim * 4);
	float *dsc = to_dev(sc, (size_t)n * 4);
	memcpy(want, y, (size_t)nsrc * dim * 4);
	cpu_ref_scatter_add_rows(want, x, rows, sc, n, dim);
	cr_assert_eq(wk_cuda_scatter_add_rows(dy, dx, dr, dsc, n, dim, err, sizeof err), WK_OK,
		     "%s", err);
	from_dev(got, dy, (size_t)nsrc * dim * 4);
	double r = rel(got, want, (size_t)nsrc * dim);
	cr_expect_leq(r, TOL, "scatter_add_rows: %g", r);
	wk_cuda_free(dr);
	wk_cuda_free(dsrc);
	wk_cuda_free(dg);
	wk_cuda_free(dy);
	wk_cuda_free(dx);
	wk_cuda_free(dsc);
	free(src);
	free(y);
	free(sc);
	free(x);
	free(want);
	free(got);
}

Test(cuda_kernels, mla_absorb_matches_ref)
{
	NEED_GPU();
	/* lora, heads, d_nope, d_rope, d_v, n, h0, h1: partial 128-blocks of the FP8 scales in
	 * both directions, token counts across the kernel's chunk of 8, a head range */
	static const int cases[][8] = {
		{300, 4, 24, 8, 20, 3, 0, 4},
		{300, 4, 24, 8, 20, 11, 1, 3},
		{512, 3, 192, 64, 256, 1, 0, 3}, /* GLM-5's sizes, fewer heads */
		{64, 2, 16, 4, 16, 9, 0, 2},
		/* whole 16-byte chunks of FP8 (absorb_out_dot's streaming path) with the scales'
		 * last block 16 columns wide */
		{400, 2, 40, 8, 36, 2, 0, 2},
	};
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16, DT_F8_E4M3};
	for (size_t ti = 0; ti < 4; ti++)
		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
			int lora = cases[c][0], H = cases[c][1], nope = cases[c][2],
			    rope = cases[c][3];
			int dv = cases[c][4], n = cases[c][5], h0 = cases[c][6], h1 = cases[c][7];
			int rows = H * (nope + dv);
			enum dt_type t = types[ti];
			float *scale;
			void *w = rnd_weight(t, rows, lora, &scale);
			size_t nq = (size_t)n * H * (nope + rope),
			       nqa = (size_t)n * H * (lora + rope);
			size_t nl = (size_t)n * H * lora, no = (size_t)n * H * dv;
			float *q = rnd_vec(nq), *lat = rnd_vec(nl);
			/* heads outside h0..h1 are left alone: both start from the same values */
			float *want_qa = fill_vec(nqa, 7.0f), *got_qa = malloc(nqa * 4);
			float *want_o = fill_vec(no, 7.0f), *got_o = malloc(no * 4);
			float *dqa = to_dev(want_qa, nqa * 4), *dout = to_dev(want_o, no * 4);
			cpu_ref_mla_absorb_q(want_qa, q, w, t, scale, lora, n, H, nope, rope, dv,
					     h0, h1);
			cpu_ref_mla_absorb_out(want_o, lat, w, t, scale, lora, n, H, nope, dv, h0,
					       h1);
			size_t ns = (size_t)((rows + 127) / 128) * ((lora + 127) / 128);
			void *dw = to_dev(w, (size_t)rows * lora * dt_size(t));
			float *ds = scale ? to_dev(scale, ns * 4) : NULL;
			float *dq = to_dev(q, nq * 4), *dlat = to_dev(lat, nl * 4);
			cr_assert_eq(wk_cuda_mla_absorb_q(dqa, dq, dw, t, ds, lora, n, H, nope,
							  rope, dv, h0, h1, err, sizeof err),
				     WK_OK, "%s", err);
			cr_assert_eq(wk_cuda_mla_absorb_out(dout, dlat, dw, t, ds, lora, n, H, nope,
							    dv, h0, h1, err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got_qa, dqa, nqa * 4);
			from_dev(got_o, dout, no * 4);
			double rq = rel(got_qa, want_qa, nqa), ro = rel(got_o, want_o, no);
			cr_expect_leq(rq, TOL, "absorb_q %s case %zu: %g", dt_name(t), c, rq);
			cr_expect_leq(ro, TOL, "absorb_out %s case %zu: %g", dt_name(t), c, ro);
			wk_cuda_free(dqa);
			wk_cuda_free(dout);
			wk_cuda_free(dw);
			wk_cuda_free(ds);
			wk_cuda_free(dq);
			wk_cuda_free(dlat);
			free(w);
			free(scale);
			free(q);
			free(lat);
			free(want_qa);
			free(got_qa);
			free(want_o);
			free(got_o);
		}
	float dummy;
	cr_expect_eq(wk_cuda_mla_absorb_q(&dummy, &dummy, &dummy, DT_F8_E4M3, NULL, 8, 1, 1, 1, 1,
					  1, 0, 1, err, sizeof err),
		     WK_EINVAL, "FP8 needs its scales");
}

/* A dense prefill of MLA's expanded form through query tiles (wk_cuda_mla_tiled: 32 query
 * rows of a head a block), forced, on the f32 pipes (wk_cuda_attention_force(2)) and on the
 * tensor cores (3, what runs unforced), against the reference: tokens in whole and partial
 * tiles, from position 0 and after earlier positions, tiny dimensions (keys of 32 and 56,
 * values of 20 and 48: no columns left to the tensor cores' second warp of a row group, and
 * widths that are not whole k-steps) and GLM-5's own (nope 192, rope 64, v 256: the widest
 * the tiles take). Then which calls take the tiles: a prefill of 32 tokens or more, and not
 * one of 31, a DSA selection, a bf16 cache, the absorbed layout, a part of the tokens or
 * wider values; forced to 1, never. */
Test(cuda_kernels, mla_prefill_tiles_match_ref)
{
	NEED_GPU();
	static const struct {
		int H, nope, rope, dv, n, pos0;
	} cases[] = {{4, 24, 8, 20, 40, 0}, {2, 192, 64, 256, 33, 10}, {3, 40, 16, 48, 70, 5}};
	for (int path = 2; path <= 3; path++)
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		wk_cuda_attention_force(path);
		int H = cases[c].H, nope = cases[c].nope, rope = cases[c].rope, dv = cases[c].dv;
		int n = cases[c].n, pos0 = cases[c].pos0, T = pos0 + n, row = H * (nope + dv);
		float *kvx = rnd_vec((size_t)T * row), *kpe = rnd_vec((size_t)T * rope);
		size_t nq = (size_t)n * H * (nope + rope), no = (size_t)n * H * dv;
		float *q = rnd_vec(nq), *want = malloc(no * 4), *got = malloc(no * 4);
		for (size_t i = 0; i < nq; i++)
			q[i] *= 3.0f; /* peaked softmaxes */
		struct cpu_mla s = {.n_heads = H, .d_a = nope, .d_b = rope, .d_v = dv, .kv = DT_F32,
				    .k_a = kvx, .k_b = kpe, .v = kvx + nope,
				    .ka_stride = (size_t)row, .ka_head = (size_t)(nope + dv),
				    .kb_stride = (size_t)rope, .v_stride = (size_t)row,
				    .v_head = (size_t)(nope + dv),
				    .scale = 1.0f / sqrtf((float)(nope + rope))};
		cpu_ref_mla_attention(want, q, &s, n, pos0, 0, n, 0, H);
		float *dkvx = to_dev(kvx, (size_t)T * row * 4), *dkpe = to_dev(kpe, (size_t)T * rope * 4);
		float *dq = to_dev(q, nq * 4), *dout = dev_alloc(no * 4);
		struct cpu_mla ds = s;
		ds.k_a = dkvx, ds.v = dkvx + nope, ds.k_b = dkpe;
		cr_expect(wk_cuda_mla_tiles(&ds, n, pos0, 0, n, 0, H));
		cr_assert_eq(wk_cuda_mla_attention(dout, dq, &ds, n, pos0, 0, n, 0, H, NULL, err,
						   sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dout, no * 4);
		double r = rel(got, want, no);
		cr_expect_leq(r, TOL, "path %d mla_attention H=%d %d+%d->%d n=%d pos0=%d: %g", path,
			      H, nope, rope, dv, n, pos0, r);
		wk_cuda_free(dkvx);
		wk_cuda_free(dkpe);
		wk_cuda_free(dq);
		wk_cuda_free(dout);
		free(kvx);
		free(kpe);
		free(q);
		free(want);
		free(got);
	}
	float dummy;
	int one = 0;
	struct cpu_mla s = {.n_heads = 8, .d_a = 192, .d_b = 64, .d_v = 256, .kv = DT_F32,
			    .k_a = &dummy, .k_b = &dummy, .v = &dummy, .ka_stride = 3584,
			    .ka_head = 448, .kb_stride = 64, .v_stride = 3584, .v_head = 448};
	cr_expect(wk_cuda_mla_tiles(&s, 8, 0, 0, 8, 0, 8), "forced");
	cr_expect(!wk_cuda_mla_tiles(&s, 8, 0, 1, 8, 0, 8), "forced, a part of the tokens");
	wk_cuda_attention_force(1);
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 8), "forced to 1");
	wk_cuda_attention_force(0);
	cr_expect(wk_cuda_mla_tiles(&s, 32, 0, 0, 32, 0, 8), "a prefill of 32");
	cr_expect(!wk_cuda_mla_tiles(&s, 31, 0, 0, 31, 0, 8), "a prefill of 31");
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 4), "half the heads");
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 5000, 0, 64, 0, 8), "64 tokens after 5,000: 16 tiles");
	cr_expect(wk_cuda_mla_tiles(&s, 600, 5000, 0, 600, 0, 8), "600 tokens after 5,000: 152");
	s.d_v = 257;
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 8), "values of 257");
	s.d_v = 256, s.kv = DT_BF16;
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 8), "a bf16 cache");
	s.kv = DT_F32, s.sel = &one;
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 8), "a DSA selection");
	s.sel = NULL, s.ka_head = s.v_head = 0;
	cr_expect(!wk_cuda_mla_tiles(&s, 64, 0, 0, 64, 0, 8), "the absorbed layout");
}

/* The absorbed layout's latent attention over a prefill on the tensor cores
 * (wk_cuda_mla_latent: one token's heads, 8 a block, each key's latent row read once for
 * them), forced, against the reference: f32, bf16 and FP8 latent caches; dense and through a
 * DSA selection; GLM-5's widths (512 + 64, 8 heads) and tiny ones (24 + 8 over 3 heads; 40 +
 * 8 over 12: two blocks of heads, the second of 4, and values that end inside a warp's
 * m-tile); from position 0 and after 10; and the 36 tokens of 3 sequences at once (a batched
 * step's: each token at its own position of its own sequence's rows, 60 apart). Then which
 * calls take it: 32 tokens or more (31 not), unforced, of one sequence or several; not a part
 * of the tokens or heads, the expanded layout, or values wider than 512. */
Test(cuda_kernels, mla_latent_tiles_match_ref)
{
	NEED_GPU();
	static const struct {
		int H, lora, rope, n, pos0, topk, seqs;
	} cases[] = {{8, 512, 64, 40, 0, 16, 0}, {3, 24, 8, 33, 10, 7, 0},
		     {12, 40, 8, 40, 0, 64, 0}, {8, 64, 16, 36, 0, 20, 3}};
	enum { ROWS = 60 }; /* a sequence's rows, with several */
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int H = cases[c].H, lora = cases[c].lora, rope = cases[c].rope, n = cases[c].n;
		int pos0 = cases[c].pos0, topk = cases[c].topk, seqs = cases[c].seqs;
		int T = seqs ? seqs * ROWS : pos0 + n, dq = lora + rope;
		float *ckv = rnd_vec((size_t)T * lora), *kpe = rnd_vec((size_t)T * rope);
		uint16_t *ckv16 = to_bf16(ckv, (size_t)T * lora), *kpe16 = to_bf16(kpe, (size_t)T * rope);
		float *cks;
		uint8_t *ckv8 = to_fp8(ckv, (size_t)T, lora, &cks);
		int *sel = malloc((size_t)n * topk * sizeof(int)), *nsel = malloc((size_t)n * sizeof(int));
		int *seq = malloc((size_t)n * sizeof(int)), *pos = malloc((size_t)n * sizeof(int));
		for (int i = 0; i < n; i++) {
			seq[i] = seqs ? rnd_int(seqs) : 0;
			pos[i] = seqs ? rnd_int(ROWS) : pos0 + i;
			/* token i's selection among its 0 .. pos[i] */
			rnd_sel(sel + (size_t)i * topk, nsel + i, 1, pos[i], topk);
		}
		int *dseq = to_dev(seq, (size_t)n * sizeof(int)), *dpos = to_dev(pos, (size_t)n * sizeof(int));
		void *dckv = to_dev(ckv, (size_t)T * lora * 4), *dkpe = to_dev(kpe, (size_t)T * rope * 4);
		void *dckv16 = to_dev(ckv16, (size_t)T * lora * 2);
		void *dkpe16 = to_dev(kpe16, (size_t)T * rope * 2);
		void *dckv8 = to_dev(ckv8, (size_t)T * lora);
		float *dcks = to_dev(cks, (size_t)T * cpu_kv_blocks(lora) * 4);
		int *dsel = to_dev(sel, (size_t)n * topk * sizeof(int));
		int *dnsel = to_dev(nsel, (size_t)n * sizeof(int));
		size_t nq = (size_t)n * H * dq, no = (size_t)n * H * lora;
		float *q = rnd_vec(nq), *want = malloc(no * 4), *got = malloc(no * 4);
		for (size_t i = 0; i < nq; i++)
			q[i] *= 0.25f; /* scores of a few units over 576 dimensions */
		float *dq_ = to_dev(q, nq * 4), *dout = dev_alloc(no * 4);
		for (int kv = 0; kv < 3; kv++)
			for (int sparse = 0; sparse < 2; sparse++) {
				enum dt_type dt = kv == 0 ? DT_F32 : kv == 1 ? DT_BF16 : DT_F8_E4M3;
				const void *ka = kv == 0 ? (const void *)ckv
						 : kv == 1 ? (const void *)ckv16 : (const void *)ckv8;
				struct cpu_mla s = {.n_heads = H, .d_a = lora, .d_b = rope, .d_v = lora,
						    .kv = dt, .k_a = ka, .v = ka,
						    .k_b = kv == 0 ? (const void *)kpe : kpe16,
						    .a_s = kv == 2 ? cks : NULL,
						    .ka_stride = (size_t)lora, .v_stride = (size_t)lora,
						    .kb_stride = (size_t)rope,
						    .sel = sparse ? sel : NULL, .nsel = nsel,
						    .sel_stride = topk,
						    .scale = 1.0f / sqrtf((float)(192 + rope)),
						    .seq = seqs ? seq : NULL, .pos = seqs ? pos : NULL,
						    .seq_rows = ROWS, .keys_max = ROWS};
				cpu_ref_mla_attention(want, q, &s, n, pos0, 0, n, 0, H);
				struct cpu_mla ds = s;
				ds.k_a = ds.v = kv == 0 ? dckv : kv == 1 ? dckv16 : dckv8;
				ds.k_b = kv == 0 ? dkpe : dkpe16;
				ds.a_s = kv == 2 ? dcks : NULL;
				ds.sel = sparse ? dsel : NULL, ds.nsel = dnsel;
				ds.seq = seqs ? dseq : NULL, ds.pos = seqs ? dpos : NULL;
				wk_cuda_attention_force(3);
				cr_expect(wk_cuda_mla_latent_tiles(&ds, n, pos0, 0, n, 0, H));
				cr_assert_eq(wk_cuda_mla_attention(dout, dq_, &ds, n, pos0, 0, n, 0, H,
								   NULL, err, sizeof err),
					     WK_OK, "%s", err);
				wk_cuda_attention_force(0);
				from_dev(got, dout, no * 4);
				double r = rel(got, want, no);
				cr_expect_leq(r, TOL, "latent tiles H=%d %d+%d n=%d pos0=%d seqs=%d %s%s: %g",
					      H, lora, rope, n, pos0, seqs, dt_name(dt),
					      sparse ? ", selected" : "", r);
			}
		void *dev[] = {dckv, dkpe, dckv16, dkpe16, dckv8, dcks, dsel, dnsel, dq_, dout,
			       dseq, dpos};
		for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
			wk_cuda_free(dev[i]);
		void *host[] = {ckv, kpe, ckv16, kpe16, ckv8, cks, sel, nsel, q, want, got, seq, pos};
		for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
			free(host[i]);
	}
	float dummy;
	int one = 0;
	struct cpu_mla s = {.n_heads = 8, .d_a = 512, .d_b = 64, .d_v = 512, .kv = DT_BF16,
			    .k_a = &dummy, .v = &dummy, .k_b = &dummy, .ka_stride = 512,
			    .v_stride = 512, .kb_stride = 64};
	cr_expect(wk_cuda_mla_latent_tiles(&s, 32, 0, 0, 32, 0, 8), "a prefill of 32");
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 31, 0, 0, 31, 0, 8), "a prefill of 31");
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 64, 0, 1, 64, 0, 8), "a part of the tokens");
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 64, 0, 0, 64, 0, 4), "half the heads");
	wk_cuda_attention_force(2);
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 64, 0, 0, 64, 0, 8), "forced to the f32 tiles");
	wk_cuda_attention_force(0);
	s.seq = s.pos = &one;
	cr_expect(wk_cuda_mla_latent_tiles(&s, 64, 0, 0, 64, 0, 8), "several sequences");
	s.seq = s.pos = NULL, s.ka_head = s.v_head = 448;
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 64, 0, 0, 64, 0, 8), "the expanded layout");
	s.ka_head = s.v_head = 0, s.d_a = s.d_v = 520;
	cr_expect(!wk_cuda_mla_latent_tiles(&s, 64, 0, 0, 64, 0, 8), "values of 520");
}

Test(cuda_kernels, mla_attention_matches_ref)
{
	NEED_GPU();
	/* lora: more latent dimensions than the kernel's threads, not a multiple of 32 */
	int H = 4, nope = 24, rope = 8, dv = 20, lora = 300, n = 5, pos0 = 150, topk = 130;
	int T = pos0 + n, kvrow = H * (nope + dv);
	/* expanded layout (kv_b applied to every position): k_a and v interleave per head in
	 * one row, as engine/glm5.c lays them out; absorbed layout: one latent c_kv row serves as
	 * key and value for all heads */
	float *kvx = rnd_vec((size_t)T * kvrow), *ckv = rnd_vec((size_t)T * lora);
	float *kpe = rnd_vec((size_t)T * rope);
	int *sel = malloc((size_t)n * topk * sizeof(int)), nsel[5];
	rnd_sel(sel, nsel, n, pos0, topk);
	/* the caches in f32 and in bf16 (the reference on the same bf16 cache) */
	size_t nkvx = (size_t)T * kvrow, nckv = (size_t)T * lora, nkpe = (size_t)T * rope;
	uint16_t *kvx16 = to_bf16(kvx, nkvx), *ckv16 = to_bf16(ckv, nckv);
	uint16_t *kpe16 = to_bf16(kpe, nkpe);
	float *dkvx = to_dev(kvx, nkvx * 4), *dckv = to_dev(ckv, nckv * 4);
	float *dkpe = to_dev(kpe, nkpe * 4);
	uint16_t *dkvx16 = to_dev(kvx16, nkvx * 2), *dckv16 = to_dev(ckv16, nckv * 2);
	uint16_t *dkpe16 = to_dev(kpe16, nkpe * 2);
	int *dsel = to_dev(sel, (size_t)n * topk * sizeof(int)), *dnsel = to_dev(nsel, sizeof nsel);
	/* and the absorbed layout's FP8 cache: the latent's codes and scales (rows of 300: a
	 * last block of 44), k_pe in bf16 */
	float *ckvs, *dckvs;
	uint8_t *ckv8 = to_fp8(ckv, (size_t)T, lora, &ckvs), *dckv8 = to_dev(ckv8, nckv);
	dckvs = to_dev(ckvs, (size_t)T * cpu_kv_blocks(lora) * 4);
	/* the f32 caches' layouts, then the bf16 ones', then FP8's (absorbed only) */
	for (int bl = 0; bl < 5; bl++)
		for (int sparse = 0; sparse < 2; sparse++)
			for (int part = 0; part < (bl < 2 ? 2 : 1); part++) { /* else whole only */
				int bf = bl / 2, layout = bl == 4 ? 1 : bl % 2;
				struct cpu_mla s = {.n_heads = H,
						    .d_b = rope,
						    .kv = bf ? DT_BF16 : DT_F32,
						    .k_b = bf ? (const void *)kpe16 : kpe,
						    .kb_stride = (size_t)rope,
						    .sel = sparse ? sel : NULL,
						    .nsel = nsel,
						    .sel_stride = topk,
						    .scale = 1.0f / sqrtf((float)(nope + rope))};
				if (layout == 0) {
					s.d_a = nope;
					s.d_v = dv;
					s.k_a = bf ? (const void *)kvx16 : kvx;
					s.ka_stride = s.v_stride = (size_t)kvrow;
					s.ka_head = s.v_head = (size_t)(nope + dv);
					s.v = bf ? (const void *)(kvx16 + nope) : kvx + nope;
				} else {
					s.d_a = s.d_v = lora;
					s.k_a = s.v = bf ? (const void *)ckv16 : ckv;
					s.ka_stride = s.v_stride = (size_t)lora;
				}
				if (bl == 4) {
					s.kv = DT_F8_E4M3;
					s.k_a = s.v = ckv8;
					s.a_s = ckvs;
				}
				int dq = s.d_a + s.d_b;
				/* part: tokens 1..4 and heads 1..3 only; the rest is left alone */
				int i0 = part ? 1 : 0, i1 = part ? 4 : n, h0 = part ? 1 : 0,
				    h1 = part ? 3 : H;
				size_t nqv = (size_t)n * H * dq, no = (size_t)n * H * s.d_v;
				float *q = rnd_vec(nqv), *want = fill_vec(no, 7.0f),
				      *got = malloc(no * 4);
				float *dqv = to_dev(q, nqv * 4), *dout = to_dev(want, no * 4);
				cpu_ref_mla_attention(want, q, &s, n, pos0, i0, i1, h0, h1);
				struct cpu_mla ds = s;
				if (bf) {
					ds.k_b = dkpe16;
					ds.k_a = layout == 0 ? dkvx16 : dckv16;
					ds.v = layout == 0 ? dkvx16 + nope : dckv16;
				} else {
					ds.k_b = dkpe;
					ds.k_a = layout == 0 ? dkvx : dckv;
					ds.v = layout == 0 ? dkvx + nope : dckv;
				}
				if (bl == 4) {
					ds.k_a = ds.v = dckv8;
					ds.a_s = dckvs;
				}
				ds.sel = sparse ? dsel : NULL;
				ds.nsel = dnsel;
				cr_assert_eq(wk_cuda_mla_attention(dout, dqv, &ds, n, pos0, i0, i1,
								   h0, h1, NULL, err, sizeof err),
					     WK_OK, "%s", err);
				from_dev(got, dout, no * 4);
				double r = rel(got, want, no);
				cr_expect_leq(r, TOL,
					      "mla_attention layout=%d sparse=%d part=%d %s: %g",
					      layout, sparse, part, dt_name(s.kv), r);
				wk_cuda_free(dqv);
				wk_cuda_free(dout);
				free(q);
				free(want);
				free(got);
			}
	struct cpu_mla big = {.n_heads = 1, .d_a = 8192, .d_b = 64, .d_v = 8192};
	float dummy;
	cr_expect_eq(wk_cuda_mla_attention(&dummy, &dummy, &big, 1, 0, 0, 1, 0, 1, NULL, err,
					   sizeof err),
		     WK_EINVAL, "past the kernel's shared memory the call is refused");
	struct cpu_mla f16 = {.n_heads = 1, .d_a = 8, .d_b = 8, .d_v = 8, .kv = DT_F16};
	cr_expect_eq(wk_cuda_mla_attention(&dummy, &dummy, &f16, 1, 0, 0, 1, 0, 1, NULL, err,
					   sizeof err),
		     WK_EINVAL, "an f16 cache is refused");
	/* FP8 outside struct cpu_mla's layout: no scales, v not k_a's rows (per head) */
	struct cpu_mla f8 = {.n_heads = 1, .d_a = 8, .d_b = 8, .d_v = 8, .kv = DT_F8_E4M3,
			     .ka_stride = 8, .v_stride = 8};
	cr_expect_eq(wk_cuda_mla_attention(&dummy, &dummy, &f8, 1, 0, 0, 1, 0, 1, NULL, err,
					   sizeof err),
		     WK_EINVAL, "an FP8 cache without its scales is refused");
	f8.a_s = &dummy;
	f8.v_head = 8;
	cr_expect_eq(wk_cuda_mla_attention(&dummy, &dummy, &f8, 1, 0, 0, 1, 0, 1, NULL, err,
					   sizeof err),
		     WK_EINVAL, "an FP8 cache in the expanded layout is refused");
	void *dev[] = {dkvx, dckv, dkpe, dkvx16, dckv16, dkpe16, dsel, dnsel, dckv8, dckvs};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		wk_cuda_free(dev[i]);
	void *host[] = {kvx, ckv, kpe, kvx16, ckv16, kpe16, sel, ckv8, ckvs};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
}

/* mla_attention's split: each query's keys over several blocks, merged by the last (one
 * launch), in both layouts (the expanded one a head a block), f32, bf16 and FP8, dense and
 * DSA-selected, over a part of the tokens and heads, on the whole scratch and on half of it
 * (fewer parts), against the reference; the counters left zero; an empty selection (nsel 0)
 * NaN as the reference's 0/0. The plan keeps a head a block where the blocks are this few;
 * two cases force 4 and 2 (the lab's knob), a block's heads split too. */
Test(cuda_kernels, mla_attention_splits_its_keys)
{
	NEED_GPU();
	int H = 4, nope = 24, rope = 8, dv = 20, lora = 136, n = 3, pos0 = 1400, topk = 900;
	int T = pos0 + n, kvrow = H * (nope + dv);
	/* layout (0 expanded, 1 absorbed), cache type, DSA-selected, tokens i0..i1, heads
	 * h0..h1, heads a block forced (wk_cuda_mla_force; 0: the plan's, 1 here) */
	static const int cases[][8] = {
		{0, DT_F32, 0, 0, 3, 0, 4, 0},     {0, DT_BF16, 1, 1, 3, 1, 3, 0},
		{1, DT_F32, 1, 0, 3, 0, 4, 0},     {1, DT_BF16, 0, 2, 3, 0, 4, 0},
		{1, DT_F8_E4M3, 0, 0, 3, 1, 4, 0}, {1, DT_F8_E4M3, 1, 0, 2, 0, 4, 0},
		{1, DT_F32, 1, 0, 3, 0, 4, 4},     {1, DT_F8_E4M3, 0, 1, 3, 1, 4, 2},
	};
	float *kvx = rnd_vec((size_t)T * kvrow), *ckv = rnd_vec((size_t)T * lora);
	float *kpe = rnd_vec((size_t)T * rope), *ckvs;
	int *sel = malloc((size_t)n * topk * sizeof(int)), nsel[3];
	cr_assert(sel);
	rnd_sel(sel, nsel, n, pos0, topk);
	nsel[1] = 0; /* a query with no keys */
	size_t nkvx = (size_t)T * kvrow, nckv = (size_t)T * lora, nkpe = (size_t)T * rope;
	uint16_t *kvx16 = to_bf16(kvx, nkvx), *ckv16 = to_bf16(ckv, nckv);
	uint16_t *kpe16 = to_bf16(kpe, nkpe);
	uint8_t *ckv8 = to_fp8(ckv, (size_t)T, lora, &ckvs);
	enum { COUNTERS = 64 };
	unsigned *dcount, zero[COUNTERS] = {0}, back[COUNTERS];
	cr_assert_eq(wk_cuda_alloc((void **)&dcount, sizeof zero, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_upload(dcount, zero, sizeof zero, err, sizeof err), WK_OK, "%s", err);
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int layout = cases[c][0], sparse = cases[c][2], i0 = cases[c][3], i1 = cases[c][4];
		int h0 = cases[c][5], h1 = cases[c][6];
		enum dt_type kv = (enum dt_type)cases[c][1];
		bool bf = kv != DT_F32;
		struct cpu_mla s = {.n_heads = H, .d_b = rope, .kv = kv,
				    .k_b = bf ? (const void *)kpe16 : kpe,
				    .kb_stride = (size_t)rope,
				    .sel = sparse ? sel : NULL, .nsel = nsel, .sel_stride = topk,
				    .scale = 1.0f / sqrtf((float)(nope + rope))};
		size_t bytes;
		if (layout == 0) {
			s.d_a = nope;
			s.d_v = dv;
			s.k_a = bf ? (const void *)kvx16 : kvx;
			s.ka_stride = s.v_stride = (size_t)kvrow;
			s.ka_head = s.v_head = (size_t)(nope + dv);
			bytes = nkvx * dt_size(kv);
		} else {
			s.d_a = s.d_v = lora;
			s.k_a = kv == DT_F8_E4M3 ? (const void *)ckv8
				: bf		 ? (const void *)ckv16
						 : ckv;
			s.a_s = kv == DT_F8_E4M3 ? ckvs : NULL;
			s.ka_stride = s.v_stride = (size_t)lora;
			bytes = nckv * dt_size(kv);
		}
		s.v = layout == 0 ? (const char *)s.k_a + (size_t)nope * dt_size(kv) : s.k_a;
		size_t nq = (size_t)n * H * (s.d_a + s.d_b), no = (size_t)n * H * s.d_v;
		float *q = rnd_vec(nq), *want = fill_vec(no, 7.0f), *got = malloc(no * 4);
		float *init = fill_vec(no, 7.0f), *wz = malloc(no * 4);
		cpu_ref_mla_attention(want, q, &s, n, pos0, i0, i1, h0, h1);
		int nans = 0;
		for (size_t x = 0; x < no; x++) { /* wz: want, its NaNs 0 (got's become 0 too) */
			nans += isnan(want[x]);
			wz[x] = isnan(want[x]) ? 0.0f : want[x];
		}
		cr_expect_eq(nans, sparse && i0 <= 1 && i1 > 1 ? (h1 - h0) * s.d_v : 0);
		struct cpu_mla ds = s;
		ds.k_a = to_dev(s.k_a, bytes);
		ds.v = (const char *)ds.k_a + ((const char *)s.v - (const char *)s.k_a);
		ds.k_b = to_dev(s.k_b, nkpe * dt_size(cpu_kv_b_type(kv)));
		ds.a_s = s.a_s ? to_dev(s.a_s, (size_t)T * cpu_kv_blocks(lora) * 4) : NULL;
		ds.sel = sparse ? to_dev(sel, (size_t)n * topk * sizeof(int)) : NULL;
		ds.nsel = to_dev(nsel, sizeof nsel);
		int gm, split, force = cases[c][7];
		wk_cuda_mla_force(force);
		wk_cuda_mla_shape(&ds, i1 - i0, h1 - h0, pos0, &gm, &split);
		cr_expect(split >= 7 && gm == (force ? force : 1), "case %zu: gm %d, split %d", c,
			  gm, split);
		size_t pf = wk_cuda_mla_part(&ds, i1, pos0);
		cr_expect(pf >= (size_t)i1 * H * 7 * (s.d_v + 2), "case %zu: %zu floats", c, pf);
		float *dq = to_dev(q, nq * 4), *dpart;
		cr_assert_eq(wk_cuda_alloc((void **)&dpart, pf * 4, err, sizeof err), WK_OK);
		for (int half = 0; half < 2; half++) {
			struct wk_att_split sp = {dpart, half ? pf / 2 : pf, dcount, COUNTERS};
			float *dout = to_dev(init, no * 4);
			poison_parts(dpart, pf);
			cr_assert_eq(wk_cuda_mla_attention(dout, dq, &ds, n, pos0, i0, i1, h0, h1,
							   &sp, err, sizeof err),
				     WK_OK, "%s", err);
			/* split at least in two (half) or as planned (all the scratch) */
			size_t rows = (size_t)(i1 - i0) * (h1 - h0) * (s.d_v + 2);
			size_t wrote = parts_written(dpart, pf);
			cr_expect_geq(wrote, rows * (half ? 2 : (size_t)split),
				      "case %zu: %zu part floats written", c, wrote);
			from_dev(got, dout, no * 4);
			int nan = 0; /* NaN where the reference's is NaN (and only there) */
			for (size_t x = 0; x < no; x++)
				if (isnan(want[x])) {
					nan += !isnan(got[x]);
					got[x] = 0.0f;
				}
			cr_expect_eq(nan, 0, "case %zu: %d outputs of no keys not NaN", c, nan);
			double r = rel(got, wz, no);
			cr_expect_leq(r, TOL, "mla_attention split case %zu (%s, %s) on %s "
				      "scratch: %g", c, layout ? "absorbed" : "expanded",
				      dt_name(kv), half ? "half the" : "all the", r);
			wk_cuda_free(dout);
		}
		wk_cuda_mla_force(0);
		cr_assert_eq(wk_cuda_download(back, dcount, sizeof back, err, sizeof err), WK_OK);
		cr_expect_eq(memcmp(back, zero, sizeof zero), 0, "case %zu: counters left non-zero",
			     c);
		void *dev[] = {(void *)ds.k_a, (void *)ds.k_b, (void *)ds.a_s, (void *)ds.sel,
			       (void *)ds.nsel, dq, dpart};
		for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
			wk_cuda_free(dev[i]);
		free(q);
		free(want);
		free(got);
		free(init);
		free(wz);
	}
	wk_cuda_free(dcount);
	void *host[] = {kvx, ckv, kpe, kvx16, ckv16, kpe16, sel, ckv8, ckvs};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
}

/* mla_attention over the tokens of several sequences at once (struct cpu_mla's seq, pos,
 * seq_rows: each token over its own sequence's caches, as a batch of decode steps runs it):
 * 4 tokens of 3 sequences, the absorbed layout, bf16 and FP8, dense and DSA-selected, split,
 * against the reference, and the reference against itself one token at a time. */
Test(cuda_kernels, mla_attention_over_several_sequences)
{
	NEED_GPU();
	int H = 4, rope = 8, lora = 136, n = 4, rows = 1500, topk = 700, nseq = 3;
	int seq[4] = {2, 0, 1, 2}, pos[4] = {1400, 900, 300, 1200};
	size_t T = (size_t)nseq * rows, qw = (size_t)lora + rope;
	float *ckv = rnd_vec(T * lora), *kpe = rnd_vec(T * rope), *ckvs;
	uint16_t *ckv16 = to_bf16(ckv, T * lora), *kpe16 = to_bf16(kpe, T * rope);
	uint8_t *ckv8 = to_fp8(ckv, T, lora, &ckvs);
	int *sel = malloc((size_t)n * topk * sizeof(int)), nsel[4];
	cr_assert(sel);
	for (int i = 0; i < n; i++) /* token i's selection among its 0 .. pos[i] */
		rnd_sel(sel + (size_t)i * topk, nsel + i, 1, pos[i], topk);
	unsigned *dcount;
	unsigned zero[64] = {0};
	cr_assert_eq(wk_cuda_alloc((void **)&dcount, sizeof zero, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_upload(dcount, zero, sizeof zero, err, sizeof err), WK_OK, "%s", err);
	for (int c = 0; c < 4; c++) {
		bool f8 = c & 1, sparse = c & 2;
		struct cpu_mla s = {.n_heads = H, .d_a = lora, .d_b = rope, .d_v = lora,
				    .kv = f8 ? DT_F8_E4M3 : DT_BF16,
				    .k_a = f8 ? (const void *)ckv8 : ckv16, .k_b = kpe16,
				    .a_s = f8 ? ckvs : NULL, .ka_stride = (size_t)lora,
				    .kb_stride = (size_t)rope, .v_stride = (size_t)lora,
				    .sel = sparse ? sel : NULL, .nsel = nsel, .sel_stride = topk,
				    .scale = 0.2f, .seq = seq, .pos = pos, .seq_rows = (size_t)rows,
				    .keys_max = 1401};
		s.v = s.k_a;
		size_t nq = (size_t)n * H * qw, no = (size_t)n * H * lora;
		float *q = rnd_vec(nq), *want = malloc(no * 4), *one = malloc(no * 4);
		float *got = malloc(no * 4);
		cpu_ref_mla_attention(want, q, &s, n, 0, 0, n, 0, H);
		for (int i = 0; i < n; i++) { /* token i alone: its sequence's caches, at pos[i] */
			struct cpu_mla o = s;
			size_t r0 = (size_t)seq[i] * rows;
			o.seq = o.pos = NULL;
			o.k_a = o.v = (const char *)s.k_a + r0 * lora * dt_size(s.kv);
			o.k_b = kpe16 + r0 * rope;
			o.a_s = f8 ? ckvs + r0 * cpu_kv_blocks(lora) : NULL;
			o.sel = sparse ? sel + (size_t)i * topk : NULL;
			o.nsel = nsel + i;
			float *oi = one + (size_t)i * H * lora;
			cpu_ref_mla_attention(oi, q + (size_t)i * H * qw, &o, 1, pos[i], 0, 1, 0, H);
		}
		cr_expect_eq(memcmp(one, want, no * 4), 0, "case %d: the reference's tokens "
			     "differ from each alone", c);
		struct cpu_mla ds = s;
		ds.k_a = ds.v = to_dev(s.k_a, T * lora * dt_size(s.kv));
		ds.k_b = to_dev(kpe16, T * rope * 2);
		ds.a_s = f8 ? to_dev(ckvs, T * cpu_kv_blocks(lora) * 4) : NULL;
		ds.sel = sparse ? to_dev(sel, (size_t)n * topk * sizeof(int)) : NULL;
		ds.nsel = to_dev(nsel, sizeof nsel);
		ds.seq = to_dev(seq, sizeof seq);
		ds.pos = to_dev(pos, sizeof pos);
		int gm, split;
		wk_cuda_mla_shape(&ds, n, H, 0, &gm, &split);
		size_t pf = wk_cuda_mla_part(&ds, n, 0);
		cr_expect(split > 1 && pf > 0, "case %d: split %d", c, split);
		float *dq = to_dev(q, nq * 4), *dout, *dpart;
		cr_assert_eq(wk_cuda_alloc((void **)&dout, no * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_alloc((void **)&dpart, (pf + 1) * 4, err, sizeof err), WK_OK);
		struct wk_att_split sp = {dpart, pf, dcount, 64};
		cr_assert_eq(wk_cuda_mla_attention(dout, dq, &ds, n, 0, 0, n, 0, H, &sp, err,
						   sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dout, no * 4);
		double r = rel(got, want, no);
		cr_expect_leq(r, TOL, "case %d (%s, %s): %g", c, f8 ? "fp8" : "bf16",
			      sparse ? "selected" : "dense", r);
		/* and mla_absorbed, the three stages as one launch, over the same sequences: a
		 * batched decode step's kv_b_proj absorbed on both sides (FP8), against the
		 * CPU's chain; the stages' counters left zero */
		int nope = 16, dv = 24, rows_w = H * (nope + dv);
		float *wsc, *q0 = rnd_vec((size_t)n * H * (nope + rope));
		void *w = rnd_weight(DT_F8_E4M3, rows_w, lora, &wsc);
		float *rqa = malloc(nq * 4), *rlat = malloc(no * 4);
		size_t nov = (size_t)n * H * dv;
		float *ro = malloc(nov * 4), *go = malloc(nov * 4);
		cpu_ref_mla_absorb_q(rqa, q0, w, DT_F8_E4M3, wsc, lora, n, H, nope, rope, dv, 0, H);
		cpu_ref_mla_attention(rlat, rqa, &s, n, 0, 0, n, 0, H);
		cpu_ref_mla_absorb_out(ro, rlat, w, DT_F8_E4M3, wsc, lora, n, H, nope, dv, 0, H);
		size_t nws = (size_t)((rows_w + 127) / 128) * ((lora + 127) / 128);
		void *dwt = to_dev(w, (size_t)rows_w * lora);
		float *dws = to_dev(wsc, nws * 4);
		float *dq0 = to_dev(q0, (size_t)n * H * (nope + rope) * 4);
		float *dqa = dev_alloc(nq * 4), *dlat = dev_alloc(no * 4);
		float *dov = dev_alloc(nov * 4);
		cr_assert_eq(wk_cuda_mla_absorbed(dov, dqa, dlat, dq0, dwt, DT_F8_E4M3, dws, lora,
						  &ds, n, 0, nope, dv, &sp, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(go, dov, nov * 4);
		r = rel(go, ro, nov);
		cr_expect_leq(r, TOL, "case %d: mla_absorbed over several sequences: %g", c, r);
		unsigned back[64];
		from_dev(back, dcount, sizeof back);
		cr_expect_eq(memcmp(back, zero, sizeof zero), 0, "case %d: counters left", c);
		void *dev[] = {(void *)ds.k_a, (void *)ds.k_b, (void *)ds.a_s, (void *)ds.sel,
			       (void *)ds.nsel, (void *)ds.seq, (void *)ds.pos, dq, dout, dpart,
			       dwt, dws, dq0, dqa, dlat, dov};
		for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++)
			wk_cuda_free(dev[k]);
		void *hfree[] = {q, want, one, got, wsc, q0, w, rqa, rlat, ro, go};
		for (size_t k = 0; k < sizeof hfree / sizeof hfree[0]; k++)
			free(hfree[k]);
	}
	wk_cuda_free(dcount);
	void *host[] = {ckv, kpe, ckv16, kpe16, ckv8, ckvs, sel};
	for (size_t k = 0; k < sizeof host / sizeof host[0]; k++)
		free(host[k]);
}

/* The backend's clock (mark and marks_ms, engine/count.c's op times): marks count from 0, a
 * read of them gives the times between them (the one around a kernel over 4 MB above 0),
 * its last mark is the next read's first (the next mark is 1), a read of another count is
 * refused by name, and a context holds a bounded number (then -1, until they are read). */
Test(cuda_kernels, marks_time_the_device)
{
	NEED_GPU();
	void *ctx;
	struct be_config cfg = {.threads = 1};
	cr_assert_eq(be_cuda.init(&ctx, &cfg, err, sizeof err), WK_OK, "%s", err);
	size_t n = 1 << 20;
	float *d = be_cuda.mem_alloc(ctx, n * sizeof(float));
	cr_assert_not_null(d);
	be_cuda.zero(ctx, d, n * sizeof(float));
	cr_assert_eq(be_cuda.mark(ctx), 0);
	be_cuda.add(ctx, d, d, n);
	cr_assert_eq(be_cuda.mark(ctx), 1);
	cr_assert_eq(be_cuda.mark(ctx), 2);
	float *ms = malloc(8192 * sizeof *ms);
	cr_assert_not_null(ms);
	cr_expect_eq(be_cuda.marks_ms(ctx, ms, 2, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "2 marks asked for, 3 made"), "%s", err);
	cr_assert_eq(be_cuda.marks_ms(ctx, ms, 3, err, sizeof err), WK_OK, "%s", err);
	cr_expect_gt(ms[0], 0.0f, "the add took %g ms", ms[0]);
	cr_expect_geq(ms[1], 0.0f);
	cr_assert_eq(be_cuda.mark(ctx), 1);
	int i, last = 1;
	while ((i = be_cuda.mark(ctx)) >= 0 && i < 8192)
		last = i;
	cr_assert_lt(last, 8191, "marks without bound");
	cr_expect_gt(last, 100, "only %d marks", last);
	cr_assert_eq(be_cuda.marks_ms(ctx, ms, last + 1, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < last; k++)
		cr_assert_geq(ms[k], 0.0f, "mark %d to %d: %g ms", k, k + 1, ms[k]);
	cr_expect_eq(be_cuda.mark(ctx), 1);
	cr_expect_eq(be_cuda.sync(ctx, err, sizeof err), WK_OK, "%s", err);
	free(ms);
	be_cuda.mem_free(ctx, d);
	be_cuda.shutdown(ctx);
}

/* The backend's chain_plan (which its chain runs from) and matmul_launches, which the launch
 * counter counts by. chain_plan: at one token a chain is one launch; at 4 tokens a matmul
 * link whose weight the tensor-core GEMV takes (FP8, 128-multiple columns) runs on its own,
 * a run of two or more links between such GEMVs is one launch, and a lone one runs op by
 * op; a MoE link of 64 tokens (the grouped GEMMs, not a chain's link) sends its whole run op
 * by op. Host logic: nothing the links point at is read. */
Test(cuda_kernels, chain_plan_splits_around_tensor_core_gemvs)
{
	NEED_GPU();
	void *ctx;
	struct be_config cfg = {.threads = 1};
	cr_assert_eq(be_cuda.init(&ctx, &cfg, err, sizeof err), WK_OK, "%s", err);
	static float buf[64] __attribute__((aligned(16)));
	struct be_weight w = {.data = buf, .scale = buf, .dtype = DT_F8_E4M3, .rows = 256,
			      .cols = 256};
	struct be_experts ex = {.top_k = 2, .dim = 256, .inter = 128, .dtype = DT_F8_E4M3};
	struct be_link l[5];
	int seg[5];
	/* norm, norm, matmul, add_rmsnorm, norm */
	static const enum be_link_kind kinds[5] = {BE_LINK_NORM, BE_LINK_NORM, BE_LINK_MATMUL,
						   BE_LINK_ADD_RMSNORM, BE_LINK_NORM};
	for (int n = 1; n <= 4; n += 3) {
		memset(l, 0, sizeof l);
		for (int i = 0; i < 5; i++) {
			l[i].kind = kinds[i];
			l[i].n = n;
			l[i].n_norm = 1;
			l[i].count = 1;
			l[i].w[0] = &w;
			l[i].y[0] = buf;
			l[i].x_in = buf;
		}
		int runs = be_cuda.chain_plan(ctx, l, 5, seg);
		static const int one[5] = {0, 0, 0, 0, 0}, four[5] = {0, 0, -1, 1, 1};
		cr_expect_eq(runs, n == 1 ? 1 : 2, "n %d: %d chained launches", n, runs);
		cr_expect_arr_eq(seg, n == 1 ? one : four, sizeof seg, "n %d: %d %d %d %d %d", n,
				 seg[0], seg[1], seg[2], seg[3], seg[4]);
	}
	/* matmul, norm, matmul, norm, norm at 4 tokens: the lone norm op by op */
	l[0].kind = BE_LINK_MATMUL;
	l[1].kind = BE_LINK_NORM;
	l[2].kind = BE_LINK_MATMUL;
	cr_expect_eq(be_cuda.chain_plan(ctx, l, 5, seg), 1);
	static const int lone[5] = {-1, -1, -1, 0, 0};
	cr_expect_arr_eq(seg, lone, sizeof seg, "%d %d %d %d %d", seg[0], seg[1], seg[2],
			 seg[3], seg[4]);
	/* norm, matmul (not taken: bf16 columns of 200), MoE of 64 tokens: the run op by op */
	struct be_weight w2 = w;
	w2.dtype = DT_BF16;
	w2.cols = 200;
	memset(l, 0, sizeof l);
	for (int i = 0; i < 3; i++) {
		l[i].n = 64;
		l[i].n_norm = 1;
		l[i].count = 1;
		l[i].w[0] = &w2;
		l[i].y[0] = buf;
		l[i].x_in = buf;
		l[i].ex = &ex;
	}
	l[0].kind = BE_LINK_NORM;
	l[1].kind = BE_LINK_MATMUL;
	l[2].kind = BE_LINK_MOE;
	cr_expect_eq(be_cuda.chain_plan(ctx, l, 3, seg), 0);
	for (int i = 0; i < 3; i++)
		cr_expect_eq(seg[i], -1, "a 64-token MoE run: link %d in launch %d", i, seg[i]);
	l[2].kind = BE_LINK_NORM; /* without the MoE link, one launch */
	cr_expect_eq(be_cuda.chain_plan(ctx, l, 3, seg), 1);
	/* matmul_launches: two FP8 weights the tensor-core GEMV takes at 4 tokens and a bf16
	 * one of 200 columns it does not: 3 launches (2 GEMVs, one matmul_n), and a rope_n for
	 * the rotations the GEMV's store does not make; at one token one launch, the rotations
	 * in its store (2 heads of 128, 64 rotated) unless they cannot be (an odd rot_dim) */
	const struct be_weight *ws[3] = {&w, &w, &w2};
	float *ys[3] = {buf, buf, buf};
	struct be_rope r[3] = {{buf, 4, NULL, 2, 128, 64}, {buf, 4, NULL, 2, 128, 0},
			       {buf, 4, NULL, 2, 128, 0}};
	int mm, rot;
	be_cuda.matmul_launches(ctx, ys, buf, ws, 3, 4, NULL, &mm, &rot);
	cr_expect(mm == 3 && rot == 0, "4 tokens: %d matmul launches, %d rope", mm, rot);
	be_cuda.matmul_launches(ctx, ys, buf, ws, 3, 4, r, &mm, &rot);
	cr_expect(mm == 3 && rot == 1, "4 tokens, rotated: %d matmul launches, %d rope", mm, rot);
	for (int k = 0; k < 3; k++)
		r[k].n = 1;
	be_cuda.matmul_launches(ctx, ys, buf, ws, 3, 1, r, &mm, &rot);
	cr_expect(mm == 1 && rot == 0, "1 token: %d matmul launches, %d rope", mm, rot);
	r[0].rot_dim = 63;
	be_cuda.matmul_launches(ctx, ys, buf, ws, 3, 1, r, &mm, &rot);
	cr_expect(mm == 1 && rot == 1, "1 token, odd rot_dim: %d matmul launches, %d rope", mm,
		  rot);
	be_cuda.shutdown(ctx);
}

/* The backend's supports(): an fp8 KV cache, and a bf16 one, for MLA attention, the DSA
 * indexer and GQA attention (the kernels above take them); f16 for none. */
Test(cuda_kernels, supports_fp8_kv)
{
	NEED_GPU();
	static const enum be_op ops[3] = {BE_OP_MLA_ATTENTION, BE_OP_DSA_TOPK, BE_OP_ATTENTION};
	for (int i = 0; i < 3; i++) {
		cr_expect(be_cuda.supports(NULL, ops[i], DT_F8_E4M3), "op %d fp8", i);
		cr_expect(be_cuda.supports(NULL, ops[i], DT_BF16), "op %d bf16", i);
		cr_expect(!be_cuda.supports(NULL, ops[i], DT_F16), "op %d f16", i);
	}
}

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x < y) - (x > y);
}

/* The reference's scores of query i (len keys) into sc; the largest magnitude returned. */
static float dsa_ref_row(float *sc, int len, const float *q, const float *k, const float *w,
			 int IH, int ID, float qk, float ws)
{
	float mx = 0;
	for (int t = 0; t < len; t++) {
		sc[t] = cpu_ref_dsa_score(q, k + (size_t)t * ID, DT_F32, NULL, w, IH, ID, qk, ws);
		mx = fmaxf(mx, fabsf(sc[t]));
	}
	return mx;
}

/* dsa_topk on its three paths (wk_cuda_dsa_path: 1, a warp a query and key on the f32 pipes;
 * 2, query tiles on the tensor cores; 3, a query's keys on the tensor cores; 2 and 3 where
 * the shape lets them) against the reference: the selections, and the scores each path
 * leaves in the scratch. */
Test(cuda_kernels, dsa_topk_matches_ref)
{
	NEED_GPU();
	/* n, pos0, topk, exact, kv, heads, head_dim: every query past topk, or the first queries
	 * within it and the rest past; exact: q, k, w small dyadic numbers and the scales powers
	 * of two, so that every score is exact in f32 whatever the order of the sums (the GPU's
	 * equal the CPU's bit for bit, and many distinct keys tie exactly); bf16 key caches (the
	 * keys rounded to bf16 first, so that the scores checked below are the cache's), and FP8
	 * ones, quantized then read back as the cache holds them (exact: every row's blocks hold
	 * a 0.875, so that each scale is 2^-9 and the cache holds the keys exactly), one of keys
	 * of 160 (a second, partial scale block: path 1 only). For path 2: head_dim 128 and 32
	 * heads (GLM-5's indexer: 4 queries a block), 12 heads (10 queries, 8 rows of a warp
	 * empty), head_dim 40 (a k-step half past it), more than 1,024 keys (two chunks). For
	 * path 3 the same (it takes up to 32 heads): 2,000 keys are 4 of its blocks. 9,000 keys:
	 * the select's last pass in two chunks of 8,192 (counts carried across). */
	static const int cases[][7] = {
		{6, 300, 64, 0, DT_F32, 4, 32},		{40, 40, 64, 0, DT_F32, 4, 32},
		{2, 2000, 512, 1, DT_F32, 4, 32},	{30, 100, 64, 1, DT_F32, 4, 32},
		{4, 200, 48, 0, DT_BF16, 4, 32},	{30, 100, 64, 1, DT_BF16, 4, 32},
		{4, 200, 48, 0, DT_F8_E4M3, 4, 160},	{30, 100, 64, 1, DT_F8_E4M3, 4, 160},
		{9, 150, 64, 0, DT_F8_E4M3, 32, 128},	{24, 60, 40, 1, DT_F8_E4M3, 12, 128},
		{21, 90, 32, 0, DT_F32, 12, 40},	{8, 1040, 300, 1, DT_BF16, 4, 64},
		{12, 200, 100, 0, DT_BF16, 32, 128},	{2, 9000, 700, 1, DT_BF16, 4, 32}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int n = cases[c][0], pos0 = cases[c][1], topk = cases[c][2], T = pos0 + n;
		bool exact = cases[c][3];
		enum dt_type kv = (enum dt_type)cases[c][4];
		int IH = cases[c][5], ID = cases[c][6];
		float qk = exact ? 0.25f : 1.0f / sqrtf((float)ID), ws = 0.5f;
		float *q = rnd_vec((size_t)n * IH * ID), *k = rnd_vec((size_t)T * ID);
		float *w = rnd_vec((size_t)n * IH);
		if (exact) {
			for (size_t i = 0; i < (size_t)n * IH * ID; i++)
				q[i] = (float)(rnd_int(5) - 2) * 0.25f;
			for (size_t i = 0; i < (size_t)T * ID; i++)
				k[i] = (float)(rnd_int(5) - 2) * 0.25f;
			for (size_t i = 0; i < (size_t)n * IH; i++)
				w[i] = (float)(rnd_int(7) - 3) * 0.5f;
			for (int t = 0; kv == DT_F8_E4M3 && t < T; t++)
				for (int b = 0; b < ID; b += 128)
					k[(size_t)t * ID + b] = 0.875f;
		}
		/* exact ties: repeated key rows, and all-zero rows (score 0 for every query) */
		for (int t = 0; t < T; t++) {
			if (t % 7 == 3 && t >= 10)
				memcpy(k + (size_t)t * ID, k + (size_t)(t - 10) * ID,
				       (size_t)ID * 4);
			if (t % 11 == 5)
				memset(k + (size_t)t * ID, 0, (size_t)ID * 4);
		}
		if (kv == DT_BF16)
			for (size_t i = 0; i < (size_t)T * ID; i++)
				k[i] = dt_bf16_to_f32(dt_f32_to_bf16(k[i]));
		float *ks = NULL;
		uint8_t *k8 = kv == DT_F8_E4M3 ? to_fp8(k, (size_t)T, ID, &ks) : NULL;
		if (k8)
			cpu_ref_cast(k, DT_F32, k8, DT_F8_E4M3, (size_t)T * ID, NULL, ks, ID);
		void *k16 = NULL;
		const void *kh = k8 ? k8 : kv_host(k, (size_t)T * ID, kv, &k16);
		float *dks = ks ? to_dev(ks, (size_t)T * cpu_kv_blocks(ID) * 4) : NULL;
		/* The scores are summed in another order on the GPU: unless exact, a query's
		 * selection is compared only where its topk-th and next best are exactly equal
		 * (from equal rows) or well apart; most queries must be. Every score is compared. */
		float *ref = malloc((size_t)n * T * 4), *sc = malloc((size_t)T * 4);
		float *mx = malloc((size_t)n * 4);
		bool *close = calloc((size_t)n, sizeof *close);
		int ties = 0, nclose = 0; /* queries whose topk-th best ties with the next */
		for (int i = 0; i < n; i++) {
			int len = pos0 + i + 1;
			mx[i] = dsa_ref_row(ref + (size_t)i * T, len, q + (size_t)i * IH * ID, k,
					    w + (size_t)i * IH, IH, ID, qk, ws);
			if (len <= topk)
				continue;
			memcpy(sc, ref + (size_t)i * T, (size_t)len * 4);
			qsort(sc, (size_t)len, 4, cmp_desc);
			float gap = sc[topk - 1] - sc[topk];
			ties += gap == 0;
			close[i] = !exact && gap != 0 && gap <= 1e-4f * mx[i];
			nclose += close[i];
		}
		cr_assert(!exact || ties > 0, "case %zu: no tie at the top-k boundary to test", c);
		cr_assert(nclose * 4 <= n, "case %zu: %d of %d queries too close to test", c,
			  nclose, n);
		int *want = malloc((size_t)n * topk * sizeof(int)),
		    *got = malloc((size_t)n * topk * sizeof(int));
		int *wn = malloc((size_t)n * sizeof(int)), *gn = malloc((size_t)n * sizeof(int));
		float *want_sc = fill_vec((size_t)T, 7.0f), *got_sc = malloc((size_t)n * T * 4);
		char *work = malloc((size_t)T * 8);
		float *dq = to_dev(q, (size_t)n * IH * ID * 4);
		void *dk = to_dev(kh, (size_t)T * ID * dt_size(kv));
		float *dw = to_dev(w, (size_t)n * IH * 4);
		struct cpu_dsa hd = {.k = kh, .ks = ks, .kv = kv, .n_heads = IH, .head_dim = ID,
				     .topk = topk, .qk_scale = qk, .w_scale = ws};
		struct cpu_dsa dd = hd;
		dd.k = dk;
		dd.ks = dks;
		cpu_ref_dsa_topk(want, wn, q, w, &hd, n, pos0, want_sc, work);
		int all = topk > pos0 ? topk - pos0 : 0; /* the queries within topk */
		/* one query a launch (scratch for one row), then groups: 4 rows of scratch and
		 * groups of 3 (the groups' counters reused), and every query in one launch */
		static const int shape[][2] = {{1, 1}, {4, 3}, {0, 65535}}; /* rows (0: n), group */
		unsigned *zero = calloc(65535, sizeof *zero);
		unsigned *dcount = to_dev(zero, 65535 * sizeof *zero);
		enum { HR = 64 }; /* rows of bin counts: every group here */
		unsigned *hzero = calloc((size_t)HR * WK_DSA_BINS, sizeof *hzero);
		unsigned *hleft = malloc((size_t)HR * WK_DSA_BINS * sizeof *hleft);
		unsigned *dhist = to_dev(hzero, (size_t)HR * WK_DSA_BINS * sizeof *hzero);
		/* path, the select's list (wk_cuda_dsa_cap), and bin counts made by path 3's
		 * scoring blocks: the three paths with the default list, path 1 and 2 counting
		 * their bins in the select, path 3 given the counts; then path 3 with no list
		 * (the five-pass radix select: the counts, given, left untouched) and with one
		 * of topk + 64 keys (enough for some queries' and not for others'), not given
		 * the counts */
		const int runs[][3] = {{1, -1, 0}, {2, -1, 0}, {3, -1, 1}, {3, 0, 1},
				       {3, topk + 64, 0}};
		for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
			int path = runs[r][0], cap = runs[r][1];
			unsigned *hist = runs[r][2] ? dhist : NULL;
			if (T > 4096 && (path != 3 || cap > 0)) /* the select's chunks: one path */
				continue;
			wk_cuda_dsa_force(path);
			wk_cuda_dsa_cap(cap);
			int on = wk_cuda_dsa_path(&dd, n, pos0);
			cr_expect_eq(on, ID <= 128 ? path : 1, "case %zu: path %d", c, on);
			/* one query a launch on path 1 alone (2 and 3 share its groups); the lists'
			 * runs in one group */
			size_t v0 = path == 1 && cap < 0 ? 0 : cap < 0 ? 1 : 2;
			for (size_t v = v0; v < sizeof shape / sizeof shape[0]; v++) {
				size_t rows = shape[v][0] ? (size_t)shape[v][0] : (size_t)n;
				float *dsc = dev_alloc(rows * T * 4);
				int *dsel = dev_alloc((size_t)n * topk * sizeof(int)),
				    *dn = dev_alloc((size_t)n * sizeof(int));
				cr_assert_eq(wk_cuda_dsa_topk(dsel, dn, dq, dw, &dd, n, pos0, dsc,
							      rows * T, dcount, shape[v][1], hist,
							      HR, err, sizeof err),
					     WK_OK, "%s", err);
				from_dev(got, dsel, (size_t)n * topk * sizeof(int));
				from_dev(gn, dn, (size_t)n * sizeof(int));
				for (int i = 0; i < n; i++) {
					cr_expect_eq(gn[i], wn[i],
						     "case %zu/%d/%zu/%d query %d: nsel %d, want %d",
						     c, on, v, cap, i, gn[i], wn[i]);
					for (int j = 0; j < wn[i] && j < gn[i] && !close[i]; j++)
						cr_expect_eq(got[(size_t)i * topk + j],
							     want[(size_t)i * topk + j],
							     "case %zu/%d/%zu/%d query %d: sel[%d] = "
							     "%d, want %d",
							     c, on, v, cap, i, j,
							     got[(size_t)i * topk + j],
							     want[(size_t)i * topk + j]);
				}
				/* all in one group: row i - all holds query i's scores */
				if (!shape[v][0] && n > all) {
					from_dev(got_sc, dsc, (size_t)(n - all) * T * 4);
					double worst = 0;
					for (int i = all; i < n; i++)
						for (int t = 0; t <= pos0 + i; t++) {
							double e = fabs(got_sc[(size_t)(i - all) * T + t] -
									ref[(size_t)i * T + t]) /
								   fmax(mx[i], 1e-30);
							worst = fmax(worst, e);
						}
					cr_expect(exact ? worst == 0 : worst < 1e-4,
						  "case %zu/%d: scores %g off", c, on, worst);
				}
				unsigned *left = malloc(65535 * sizeof *left);
				from_dev(left, dcount, 65535 * sizeof *left);
				cr_expect_arr_eq(left, zero, 65535 * sizeof *left,
						 "case %zu/%d/%zu: the counters were not left zero",
						 c, on, v);
				free(left);
				from_dev(hleft, dhist, (size_t)HR * WK_DSA_BINS * sizeof *hleft);
				cr_expect_arr_eq(hleft, hzero, (size_t)HR * WK_DSA_BINS * 4,
						 "case %zu/%d/%zu/%d: the bin counts were not left "
						 "zero", c, on, v, cap);
				wk_cuda_free(dsc);
				wk_cuda_free(dsel);
				wk_cuda_free(dn);
			}
		}
		wk_cuda_dsa_force(0);
		wk_cuda_dsa_cap(-1);
		char e2[WK_ERRSZ]; /* a scratch shorter than one row is refused */
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &dd, n, pos0, NULL, (size_t)T - 1,
					      dcount, 1, NULL, 0, e2, sizeof e2),
			     WK_EINVAL);
		struct cpu_dsa bad = dd;
		bad.kv = DT_F16;
		bad.ks = NULL;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, n, pos0, NULL, (size_t)T,
					      dcount, 1, NULL, 0, e2, sizeof e2),
			     WK_EINVAL, "an f16 key cache is refused");
		bad.kv = DT_F8_E4M3;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, n, pos0, NULL, (size_t)T,
					      dcount, 1, NULL, 0, e2, sizeof e2),
			     WK_EINVAL, "an FP8 key cache without its scales is refused");
		free(k16);
		free(k8);
		free(ks);
		wk_cuda_free(dks);
		wk_cuda_free(dcount);
		free(zero);
		wk_cuda_free(dhist);
		free(hzero);
		free(hleft);
		wk_cuda_free(dq);
		wk_cuda_free(dk);
		wk_cuda_free(dw);
		free(q);
		free(k);
		free(w);
		free(sc);
		free(ref);
		free(mx);
		free(close);
		free(want);
		free(got);
		free(wn);
		free(gn);
		free(want_sc);
		free(got_sc);
		free(work);
	}
}

/* wk_cuda_dsa_path's rule: query tiles on the tensor cores (2) for one sequence's 16 or more
 * queries past topk, at most 128 heads of at most 128; a query's keys on the tensor cores (3)
 * for the rest (a decode, several sequences) of at most 32 heads of at most 128; both with
 * head_dim a multiple of 8 and the cache 16-byte aligned; else a warp a key (1). Forced, a
 * path where it can run, else 1. */
Test(cuda_kernels, dsa_path_rule)
{
	NEED_GPU(); /* a build without CUDA has only cuda_none.c's stub */
	struct cpu_dsa d = {.kv = DT_F32, .n_heads = 32, .head_dim = 128, .topk = 2048};
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 2, "a prefill of 4,096");
	cr_expect_eq(wk_cuda_dsa_path(&d, 2063, 0), 3, "15 queries past topk");
	cr_expect_eq(wk_cuda_dsa_path(&d, 2064, 0), 2, "16 queries past topk");
	cr_expect_eq(wk_cuda_dsa_path(&d, 16, 5000), 2, "a chunk of 16 after 5,000");
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 3, "a decode");
	d.head_dim = 129;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "head_dim 129");
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 1, "head_dim 129, a decode");
	d.head_dim = 36;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "head_dim 36 (8 columns a load)");
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 1, "head_dim 36, a decode");
	d.head_dim = 128;
	d.k = (const void *)(uintptr_t)8;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "a cache 8 bytes past 16");
	d.k = NULL;
	d.n_heads = 64;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 2, "64 heads");
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 1, "64 heads, a decode");
	d.n_heads = 129;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "129 heads");
	d.n_heads = 32;
	int seq[1] = {0}, pos[1] = {0};
	d.seq = seq;
	d.pos = pos;
	d.keys_max = 1;
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 3, "several sequences");
	wk_cuda_dsa_force(2);
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "several sequences, forced to 2");
	d.seq = NULL;
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 2, "a decode, forced to 2");
	wk_cuda_dsa_force(3);
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 3, "a prefill, forced to 3");
	d.n_heads = 33;
	cr_expect_eq(wk_cuda_dsa_path(&d, 1, 5000), 1, "33 heads, forced to 3");
	d.n_heads = 32;
	wk_cuda_dsa_force(1);
	cr_expect_eq(wk_cuda_dsa_path(&d, 4096, 0), 1, "forced to 1");
	wk_cuda_dsa_force(0);
}

/* dsa_topk over several sequences in one call (a batched step): query i scores its own
 * sequence's keys 0 .. pos[i] (rows seq[i] * ROWS on) and takes them all within topk. The
 * reference equals itself query by query on each sequence's cache alone (memcmp); the
 * kernel, on exact scores (dyadic q, k, w and power-of-two scales, as above, so that the
 * order of the sums does not matter), equals the reference: one query a launch, groups of 3,
 * and all in one launch, with the keys scored a warp a key (path 1) and on the tensor cores
 * (path 3; FP8 keys of 128 for it, 160 for path 1 alone). Each sequence's keys are drawn
 * apart, so a query that read another sequence's rows, or as many keys as its place in the
 * call, would select otherwise. */
Test(cuda_kernels, dsa_topk_over_several_sequences)
{
	NEED_GPU();
	enum { NQ = 7, NSEQ = 3, ROWS = 400, IH = 4, TOPK = 64 };
	int seq[NQ] = {2, 2, 2, 0, 1, 1, 0}, pos[NQ] = {40, 41, 120, 300, 63, 64, 399};
	for (int c = 0; c < 4; c++) {
		enum dt_type kv = c == 0 ? DT_F32 : c == 1 ? DT_BF16 : DT_F8_E4M3;
		int ID = c == 2 ? 160 : c == 3 ? 128 : 32;
		size_t T = (size_t)NSEQ * ROWS, nb = (size_t)cpu_kv_blocks(ID);
		float *q = malloc((size_t)NQ * IH * ID * 4), *k = malloc(T * ID * 4);
		float *w = malloc((size_t)NQ * IH * 4);
		cr_assert(q && k && w);
		for (size_t i = 0; i < (size_t)NQ * IH * ID; i++)
			q[i] = (float)(rnd_int(5) - 2) * 0.25f;
		for (size_t i = 0; i < T * ID; i++)
			k[i] = (float)(rnd_int(5) - 2) * 0.25f;
		for (size_t i = 0; i < (size_t)NQ * IH; i++)
			w[i] = (float)(rnd_int(7) - 3) * 0.5f;
		for (size_t t = 0; t < T; t++) {
			if (t % 7 == 3 && t % ROWS >= 10) /* ties within a sequence */
				memcpy(k + t * ID, k + (t - 10) * ID, (size_t)ID * 4);
			for (int b = 0; kv == DT_F8_E4M3 && b < ID; b += 128)
				k[t * ID + b] = 0.875f; /* every scale 2^-9: the cache holds k exactly */
		}
		float *ks = NULL;
		uint8_t *k8 = kv == DT_F8_E4M3 ? to_fp8(k, T, ID, &ks) : NULL;
		void *k16 = NULL;
		const void *kh = k8 ? k8 : kv_host(k, T * ID, kv, &k16);
		struct cpu_dsa hd = {.k = kh, .ks = ks, .kv = kv, .n_heads = IH, .head_dim = ID,
				     .topk = TOPK, .qk_scale = 0.25f, .w_scale = 0.5f, .seq = seq,
				     .pos = pos, .seq_rows = ROWS, .keys_max = 400};
		int want[NQ * TOPK], wn[NQ], one[NQ * TOPK], on[NQ], got[NQ * TOPK], gn[NQ];
		float *sc = malloc(ROWS * 4);
		char *work = malloc(ROWS * 8);
		cpu_ref_dsa_topk(want, wn, q, w, &hd, NQ, 0, sc, work);
		for (int i = 0; i < NQ; i++) { /* query i alone, on its sequence's cache */
			struct cpu_dsa o = hd;
			size_t r0 = (size_t)seq[i] * ROWS;
			o.seq = o.pos = NULL;
			o.k = (const char *)kh + r0 * ID * dt_size(kv);
			o.ks = ks ? ks + r0 * nb : NULL;
			cpu_ref_dsa_topk(one + i * TOPK, on + i, q + (size_t)i * IH * ID,
					 w + i * IH, &o, 1, pos[i], sc, work);
			int len = pos[i] + 1, n = len < TOPK ? len : TOPK;
			cr_expect_eq(wn[i], n, "case %d query %d: nsel %d, want %d", c, i, wn[i],
				     n);
			cr_expect(on[i] == wn[i] && !memcmp(one + i * TOPK, want + i * TOPK,
							    (size_t)n * sizeof(int)),
				  "case %d query %d: the reference differs from the query alone", c,
				  i);
		}
		struct cpu_dsa dd = hd;
		dd.k = to_dev(kh, T * ID * dt_size(kv));
		dd.ks = ks ? to_dev(ks, T * nb * 4) : NULL;
		dd.seq = to_dev(seq, sizeof seq);
		dd.pos = to_dev(pos, sizeof pos);
		float *dq = to_dev(q, (size_t)NQ * IH * ID * 4);
		float *dw = to_dev(w, (size_t)NQ * IH * 4);
		unsigned zero[NQ] = {0}, left[NQ];
		unsigned *dcount = to_dev(zero, sizeof zero);
		/* bin counts for path 3's scoring blocks (path 1 leaves them alone) */
		unsigned *hzero = calloc((size_t)NQ * WK_DSA_BINS, sizeof *hzero);
		unsigned *hleft = malloc((size_t)NQ * WK_DSA_BINS * sizeof *hleft);
		unsigned *dhist = to_dev(hzero, (size_t)NQ * WK_DSA_BINS * sizeof *hzero);
		static const int shape[][2] = {{1, 1}, {3, 3}, {NQ, NQ}}; /* score rows, group */
		for (int v = 0; v < 6; v++) {
			int path = v < 3 ? 1 : 3;
			wk_cuda_dsa_force(path);
			cr_expect_eq(wk_cuda_dsa_path(&dd, NQ, 0), ID <= 128 ? path : 1);
			float *dsc = dev_alloc((size_t)shape[v % 3][0] * ROWS * 4);
			int *dsel = dev_alloc(sizeof got), *dn = dev_alloc(sizeof gn);
			cr_assert_eq(wk_cuda_dsa_topk(dsel, dn, dq, dw, &dd, NQ, 0, dsc,
						      (size_t)shape[v % 3][0] * ROWS, dcount,
						      shape[v % 3][1], dhist, NQ, err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dsel, sizeof got);
			from_dev(gn, dn, sizeof gn);
			from_dev(left, dcount, sizeof left);
			for (int i = 0; i < NQ; i++)
				cr_expect(gn[i] == wn[i] &&
						  !memcmp(got + i * TOPK, want + i * TOPK,
							  (size_t)wn[i] * sizeof(int)),
					  "case %d/%d query %d (sequence %d at %d): %d selected, "
					  "want %d, or another selection", c, v, i, seq[i], pos[i],
					  gn[i], wn[i]);
			cr_expect_arr_eq(left, zero, sizeof left,
					 "case %d/%d: the counters were not left zero", c, v);
			from_dev(hleft, dhist, (size_t)NQ * WK_DSA_BINS * sizeof *hleft);
			cr_expect_arr_eq(hleft, hzero, (size_t)NQ * WK_DSA_BINS * 4,
					 "case %d/%d: the bin counts were not left zero", c, v);
			wk_cuda_free(dsc);
			wk_cuda_free(dsel);
			wk_cuda_free(dn);
		}
		wk_cuda_dsa_force(0);
		struct cpu_dsa bad = dd; /* several sequences without their longest */
		bad.keys_max = 0;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, NQ, 0, NULL, ROWS, dcount,
					      1, NULL, 0, err, sizeof err),
			     WK_EINVAL);
		free(hzero);
		free(hleft);
		void *dev[] = {(void *)dd.k, (void *)dd.ks, (void *)dd.seq, (void *)dd.pos, dq, dw,
			       dcount, dhist};
		for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
			wk_cuda_free(dev[i]);
		void *host[] = {q, k, w, ks, k8, k16, sc, work};
		for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
			free(host[i]);
	}
}
