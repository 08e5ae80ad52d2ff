/*
 * test_cuda_moe.c - the grouped MoE experts (moe_kernels.cu) against cpu_ref_moe_experts, then
 * the launches that do the work of several kernels (matmul_n, add_rmsnorm, act_quant and
 * act_codes, rope_n, norm_n, mla_absorbed) against those kernels or their references, as
 * test_cuda.c does for the core kernels.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

/* ---- grouped MoE experts (moe_kernels.cu against cpu_ref_moe_experts) ------------------------ */

/* Token t's top_k distinct experts of n_experts, in random order; local: how many of them
 * come from [ex0, ex0 + n_local) at most (0: another rank's only). force: an expert put in
 * slot t % top_k, or -1. */
static void moe_pick(int *it, int top_k, int n_experts, int ex0, int n_local, bool local,
		     int force, int t)
{
	int perm[64], np = 0;
	for (int e = 0; e < n_experts; e++)
		if (local || e < ex0 || e >= ex0 + n_local)
			perm[np++] = e;
	cr_assert(np >= top_k && np <= 64);
	for (int i = np - 1; i > 0; i--) {
		int j = rnd_int(i + 1), x = perm[i];
		perm[i] = perm[j];
		perm[j] = x;
	}
	for (int i = 0; force >= 0 && i < np; i++)
		if (perm[i] == force) {
			perm[i] = perm[t % top_k];
			perm[t % top_k] = force;
		}
	memcpy(it, perm, (size_t)top_k * sizeof *it);
}

/* The router fused with the grouped experts (one launch for the router and the plan) gives
 * the two ops' idx, wt and y bit for bit, and leaves its counter zero. */
Test(cuda_kernels, moe_route_experts_matches_the_two_ops)
{
	NEED_GPU();
	int ne = 32, ng = 4, tg = 2, top_k = 8, n_local = 16, ex0 = 4;
	static const struct {
		enum dt_type t;
		int n, dim, inter;
	} cases[] = {{DT_F8_E4M3, 37, 200, 144}, {DT_F8_E4M3, 1, 200, 144}, {DT_BF16, 9, 96, 70}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		enum dt_type t = cases[c].t;
		int n = cases[c].n, dim = cases[c].dim, inter = cases[c].inter;
		size_t ny = (size_t)n * dim, ns = (size_t)n * top_k;
		struct moe_set m;
		moe_set_make(&m, t, n_local, dim, inter);
		float *lg = rnd_vec((size_t)n * ne), *bias = rnd_vec((size_t)ne);
		float *x = rnd_vec(ny), *y0 = rnd_vec(ny);
		for (int e = 0; e < ne; e++)
			bias[e] = fabsf(bias[e]) * 0.1f;
		float *dl = to_dev(lg, (size_t)n * ne * 4), *db = to_dev(bias, (size_t)ne * 4);
		float *dx = to_dev(x, ny * 4), *dy[2] = {to_dev(y0, ny * 4), to_dev(y0, ny * 4)};
		int *di[2] = {dev_alloc(ns * 4), dev_alloc(ns * 4)};
		float *dw[2] = {dev_alloc(ns * 4), dev_alloc(ns * 4)};
		struct wk_moe mo = moe_of(&m, t, ex0, dim, inter);
		size_t scr = wk_cuda_moe_experts_scratch(n, top_k, &mo);
		void *ds[2] = {dev_alloc(scr), dev_alloc(scr)};
		unsigned zero = 0, *dc = to_dev(&zero, sizeof zero);
		cr_assert_eq(wk_cuda_moe_route(di[0], dw[0], dl, db, n, ne, top_k, ng, tg, true, 2.5f,
					       err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(wk_cuda_moe_experts(dy[0], dx, di[0], dw[0], n, top_k, &mo, ds[0], err,
						 sizeof err),
			     WK_OK, "%s", err);
		cr_assert_eq(wk_cuda_moe_route_experts(dy[1], dx, dl, db, ne, ng, tg, true, 2.5f,
						       di[1], dw[1], n, top_k, &mo, ds[1], dc, err,
						       sizeof err),
			     WK_OK, "%s", err);
		int *hi[2] = {malloc(ns * 4), malloc(ns * 4)};
		float *hw[2] = {malloc(ns * 4), malloc(ns * 4)}, *hy[2] = {malloc(ny * 4), malloc(ny * 4)};
		for (int k = 0; k < 2; k++) {
			from_dev(hi[k], di[k], ns * 4);
			from_dev(hw[k], dw[k], ns * 4);
			from_dev(hy[k], dy[k], ny * 4);
		}
		unsigned left;
		from_dev(&left, dc, sizeof left);
		cr_expect(memcmp(hi[0], hi[1], ns * 4) == 0, "%s n=%d: idx differ", dt_name(t), n);
		cr_expect(memcmp(hw[0], hw[1], ns * 4) == 0, "%s n=%d: wt differ", dt_name(t), n);
		cr_expect(memcmp(hy[0], hy[1], ny * 4) == 0, "%s n=%d: y differs", dt_name(t), n);
		cr_expect(memcmp(hy[0], y0, ny * 4) != 0, "%s n=%d: y unchanged", dt_name(t), n);
		cr_expect_eq(left, 0u, "%s n=%d: the counter was left at %u", dt_name(t), n, left);
		for (int k = 0; k < 2; k++) {
			wk_cuda_free(dy[k]);
			wk_cuda_free(di[k]);
			wk_cuda_free(dw[k]);
			wk_cuda_free(ds[k]);
			free(hi[k]);
			free(hw[k]);
			free(hy[k]);
		}
		wk_cuda_free(dl);
		wk_cuda_free(db);
		wk_cuda_free(dx);
		wk_cuda_free(dc);
		moe_set_free(&m);
		free(lg);
		free(bias);
		free(x);
		free(y0);
	}
	float dummy;
	struct wk_moe none = {.n_local = 4, .wdt = DT_F32, .dim = 8, .inter = 8};
	cr_expect_eq(wk_cuda_moe_route_experts(&dummy, &dummy, NULL, NULL, 10, 3, 1, true, 1.0f,
					       NULL, NULL, 1, 1, &none, NULL, NULL, err,
					       sizeof err),
		     WK_EINVAL, "10 experts in 3 groups");
}

Test(cuda_kernels, moe_experts_matches_ref)
{
	NEED_GPU();
	/* 32 experts, this rank's 4..19: the slots of 0..3 and 20..31 are skipped */
	int top_k = 8, n_local = 16, ex0 = 4, n_experts = 32;
	/* FP8 dims cut 128-blocks short (200 = 128 + 72, 144 = 128 + 16); one token, whose 8
	 * slots are fewer than the 16 experts (the grid's bound), and many; sh: a shared
	 * expert's width (narrower, as a TP slice, or wider than the routed experts'), 0: none,
	 * in st (F32 beside FP8: a TP slice stored dequantized) */
	static const struct {
		enum dt_type t;
		int n, dim, inter, sh;
		enum dt_type st;
	} cases[] = {
		{DT_F8_E4M3, 37, 200, 144, 0, 0},    {DT_F8_E4M3, 1, 200, 144, 0, 0},
		{DT_BF16, 37, 96, 70, 0, 0},         {DT_BF16, 1, 96, 70, 0, 0},
		{DT_F32, 37, 64, 50, 0, 0},          {DT_F32, 1, 64, 50, 0, 0},
		{DT_F16, 9, 130, 33, 0, 0},          {DT_F8_E4M3, 37, 200, 144, 72, DT_F8_E4M3},
		{DT_F8_E4M3, 1, 200, 144, 300, DT_F8_E4M3}, {DT_BF16, 9, 96, 70, 70, DT_BF16},
		{DT_F8_E4M3, 9, 200, 144, 72, DT_F32},
		/* every matrix whole 16-byte chunks: all on the streaming path; 336 and 176 rows
		 * leave the last block of 32 rows half used */
		{DT_F8_E4M3, 9, 256, 208, 0, 0},     {DT_F8_E4M3, 2, 336, 176, 96, DT_F8_E4M3},
		{DT_BF16, 5, 104, 72, 40, DT_BF16},  {DT_F32, 3, 68, 36, 0, 0},
	};
	/* both decode paths: streaming (4 rows a warp in 16-byte chunks), then the first
	 * version (a warp a row, the lab's baseline); the scalar path takes what streaming
	 * cannot (a row not a whole number of chunks) */
	const size_t nc = sizeof cases / sizeof cases[0];
	for (size_t run2 = 0; run2 < 2 * nc; run2++) {
		size_t c = run2 % nc;
		bool v0 = run2 >= nc;
		wk_cuda_moe_rows_v0(v0);
		enum dt_type t = cases[c].t, st = cases[c].st;
		int n = cases[c].n, dim = cases[c].dim, inter = cases[c].inter, sh = cases[c].sh;
		size_t ny = (size_t)n * dim, ns = (size_t)n * top_k;
		struct moe_set m, shared;
		moe_set_make(&m, t, n_local, dim, inter);
		if (sh)
			moe_set_make(&shared, st, 1, dim, sh);
		struct wk_moe mo = moe_of(&m, t, ex0, dim, inter);
		mo.shared = sh ? &shared.dev[0] : NULL;
		mo.shared_wdt = st;
		mo.shared_inter = sh;
		struct cpu_shared_expert rsh = {sh ? shared.host[0] : (struct cpu_expert){0}, st, sh};
		int *idx = malloc(ns * sizeof *idx);
		float *wt = rnd_vec(ns), *x = rnd_vec(ny), *y0 = rnd_vec(ny);
		/* tokens 0..5 all choose expert 5; the last of many tokens has no local slot */
		for (int i = 0; i < n; i++)
			moe_pick(idx + (size_t)i * top_k, top_k, n_experts, ex0, n_local,
				 n < 10 || i < n - 1, i < 6 ? 5 : -1, i);
		for (size_t i = 0; i < ny; i++)
			y0[i] *= 50.0f; /* y is added to, not overwritten */
		float *want = malloc(ny * 4), *got = malloc(ny * 4), *again = malloc(ny * 4);
		float *scr = malloc(((size_t)2 * (sh > inter ? sh : inter) + dim) * 4);
		memcpy(want, y0, ny * 4);
		cpu_ref_moe_experts(want, x, idx, wt, n, top_k, m.host, ex0, n_local, t, dim, inter,
				    sh ? &rsh : NULL, scr);
		float *dx = to_dev(x, ny * 4), *dwt = to_dev(wt, ns * 4);
		float *dy = to_dev(y0, ny * 4), *dy2 = to_dev(y0, ny * 4);
		int *didx = to_dev(idx, ns * sizeof *idx);
		void *dscr = dev_alloc(wk_cuda_moe_experts_scratch(n, top_k, &mo));
		for (int run = 0; run < 2; run++)
			cr_assert_eq(wk_cuda_moe_experts(run ? dy2 : dy, dx, didx, dwt, n, top_k, &mo,
							 dscr, err, sizeof err),
				     WK_OK, "%s", err);
		from_dev(got, dy, ny * 4);
		from_dev(again, dy2, ny * 4);
		double r = rel(got, want, ny);
		cr_expect_leq(r, 1e-3, "%s n=%d dim=%d inter=%d shared %d %s%s: %g", dt_name(t), n,
			      dim, inter, sh, dt_name(st), v0 ? " (v0)" : "", r);
		/* the plan's grouping order and the combining blocks may change between runs; the
		 * values may not */
		cr_expect(memcmp(got, again, ny * 4) == 0, "%s n=%d: two runs differ", dt_name(t), n);
		if (n >= 10 && !sh) /* the token without a local slot is left as it was */
			cr_expect(memcmp(got + ny - dim, y0 + ny - dim, (size_t)dim * 4) == 0,
				  "%s: the last token's y changed", dt_name(t));
		if (sh)
			moe_set_free(&shared);
		wk_cuda_free(dx);
		wk_cuda_free(dwt);
		wk_cuda_free(dy);
		wk_cuda_free(dy2);
		wk_cuda_free(didx);
		wk_cuda_free(dscr);
		moe_set_free(&m);
		free(idx);
		free(wt);
		free(x);
		free(y0);
		free(want);
		free(got);
		free(again);
		free(scr);
	}
	wk_cuda_moe_rows_v0(0);
	/* refused, or nothing to do, before any launch */
	float dummy;
	struct cpu_expert nowt = {0};
	struct wk_moe e5 = {.n_local = 16, .wdt = DT_F8_E5M2, .dim = 64, .inter = 64};
	struct wk_moe f32 = {.n_local = 16, .wdt = DT_F32, .dim = 64, .inter = 64};
	struct wk_moe shw = {.wdt = DT_F32, .dim = 64, .inter = 64, .shared = &nowt};
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, 1, 8, &e5, NULL, err,
					 sizeof err),
		     WK_EINVAL, "E5M2 experts");
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, -1, 8, &f32, NULL, err,
					 sizeof err),
		     WK_EINVAL, "negative n");
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, 0, 8, &f32, NULL, err,
					 sizeof err),
		     WK_OK, "no tokens: nothing to do");
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, 1, 8, &shw, NULL, err,
					 sizeof err),
		     WK_EINVAL, "a shared expert of width 0");
	shw.shared_inter = 64;
	shw.shared_wdt = DT_F8_E5M2;
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, 1, 8, &shw, NULL, err,
					 sizeof err),
		     WK_EINVAL, "an E5M2 shared expert");
	cr_expect_eq(wk_cuda_moe_experts(&dummy, &dummy, NULL, NULL, 1, 8, NULL, NULL, err,
					 sizeof err),
		     WK_EINVAL, "no layer");
	/* an FP8 expert without its scales, which the host cannot see in the device's table:
	 * NaN for its tokens, not a fault */
	struct moe_set m;
	moe_set_make(&m, DT_F8_E4M3, 1, 16, 16);
	struct cpu_expert bad = m.dev[0];
	bad.down_s = NULL;
	int e0 = 0;
	float w1 = 1.0f, *xv = rnd_vec(16), yv[16];
	struct cpu_expert *dbad = to_dev(&bad, sizeof bad);
	int *di = to_dev(&e0, sizeof e0);
	float *dw1 = to_dev(&w1, 4), *dxv = to_dev(xv, 64), *dyv = to_dev(xv, 64);
	struct wk_moe mbad = {.experts = dbad, .n_local = 1, .wdt = DT_F8_E4M3, .dim = 16,
			      .inter = 16};
	void *ds = dev_alloc(wk_cuda_moe_experts_scratch(64, 1, &mbad));
	cr_assert_eq(wk_cuda_moe_experts(dyv, dxv, di, dw1, 1, 1, &mbad, ds, err, sizeof err),
		     WK_OK, "%s", err);
	from_dev(yv, dyv, 64);
	for (int i = 0; i < 16; i++)
		cr_expect(isnan(yv[i]), "element %d is %g without scales", i, yv[i]);
	/* the same for 64 tokens, which take the grouped GEMMs: NaN, not a fault */
	int e64[64] = {0};
	float w64[64], *x64 = rnd_vec(64 * 16), *y64 = malloc(64 * 16 * 4);
	for (int i = 0; i < 64; i++)
		w64[i] = 1.0f;
	int *di64 = to_dev(e64, sizeof e64);
	float *dw64 = to_dev(w64, sizeof w64), *dx64 = to_dev(x64, 64 * 16 * 4);
	float *dy64 = to_dev(x64, 64 * 16 * 4);
	cr_assert_eq(wk_cuda_moe_experts(dy64, dx64, di64, dw64, 64, 1, &mbad, ds, err, sizeof err),
		     WK_OK, "%s", err);
	from_dev(y64, dy64, 64 * 16 * 4);
	for (int i = 0; i < 64 * 16; i++)
		cr_expect(isnan(y64[i]), "64 tokens: element %d is %g without scales", i, y64[i]);
	wk_cuda_free(di64);
	wk_cuda_free(dw64);
	wk_cuda_free(dx64);
	wk_cuda_free(dy64);
	free(x64);
	free(y64);
	wk_cuda_free(dbad);
	wk_cuda_free(di);
	wk_cuda_free(dw1);
	wk_cuda_free(dxv);
	wk_cuda_free(dyv);
	wk_cuda_free(ds);
	moe_set_free(&m);
	free(xv);
}

/* Many tokens (>= 64) with FP8 experts take the grouped GEMMs (moe_kernels.cu's
 * grouped_gemms: bf16 hi/lo wgmma tiles of 128 grouped slots, the tokens gathered through the
 * plan's tok[]), which must give cpu_ref_moe_experts within the f32 GEMM's 1e-5: uneven
 * groups (expert 5 in 140 tokens: two tiles, the second short), experts 7 and 12 chosen by
 * no token (empty groups), expert 9 by token 3 alone (a group of 1), ragged dims (cp.async
 * and ordinary-load weight paths both), with and without a shared expert (one more group,
 * narrower or wider); on both tiles (fp8w_tile, and fp8w_tile_rs: WK_FP8W_RS). */
Test(cuda_kernels, moe_experts_gemm_matches_ref)
{
	NEED_GPU();
	int top_k = 8, n_local = 16, ex0 = 4, n_experts = 32;
	static const struct {
		int n, dim, inter, sh;
	} cases[] = {{150, 200, 144, 0}, {64, 192, 72, 300}, {300, 136, 144, 72}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		enum dt_type t = DT_F8_E4M3;
		int n = cases[c].n, dim = cases[c].dim, inter = cases[c].inter, sh = cases[c].sh;
		size_t ny = (size_t)n * dim, ns = (size_t)n * top_k;
		struct moe_set m, shared;
		moe_set_make(&m, t, n_local, dim, inter);
		if (sh)
			moe_set_make(&shared, t, 1, dim, sh);
		struct wk_moe mo = moe_of(&m, t, ex0, dim, inter);
		mo.shared = sh ? &shared.dev[0] : NULL;
		mo.shared_wdt = t;
		mo.shared_inter = sh;
		struct cpu_shared_expert rsh = {sh ? shared.host[0] : (struct cpu_expert){0}, t, sh};
		int *idx = malloc(ns * sizeof *idx), pool[32], np = 0;
		for (int e = 0; e < n_experts; e++)
			if (e != 7 + ex0 && e != 9 + ex0 && e != 12 + ex0 && e != 5 + ex0)
				pool[np++] = e;
		for (int i = 0; i < n; i++) { /* top_k distinct experts of the pool, shuffled */
			int *it = idx + (size_t)i * top_k;
			for (int k = np - 1; k > 0; k--) {
				int j = rnd_int(k + 1), v = pool[k];
				pool[k] = pool[j];
				pool[j] = v;
			}
			memcpy(it, pool, (size_t)top_k * sizeof *it);
			if (i < 140)
				it[i % top_k] = 5 + ex0;
			if (i == 3)
				it[(i + 1) % top_k] = 9 + ex0;
		}
		float *wt = rnd_vec(ns), *x = rnd_vec(ny), *y0 = rnd_vec(ny);
		float *want = malloc(ny * 4), *got = malloc(ny * 4), *again = malloc(ny * 4);
		float *scr = malloc(((size_t)2 * (sh > inter ? sh : inter) + dim) * 4);
		cr_assert(idx && want && got && again && scr);
		memcpy(want, y0, ny * 4);
		cpu_ref_moe_experts(want, x, idx, wt, n, top_k, m.host, ex0, n_local, t, dim, inter,
				    sh ? &rsh : NULL, scr);
		float *dx = to_dev(x, ny * 4), *dwt = to_dev(wt, ns * 4);
		float *dy = to_dev(y0, ny * 4), *dy2 = to_dev(y0, ny * 4), *dy3 = to_dev(y0, ny * 4);
		int *didx = to_dev(idx, ns * sizeof *idx);
		void *dscr = dev_alloc(wk_cuda_moe_experts_scratch(n, top_k, &mo));
		for (int run = 0; run < 3; run++) { /* the third on fp8w_tile_rs */
			float *to = run == 0 ? dy : run == 1 ? dy2 : dy3;
			wk_cuda_fp8w_mode(run == 2 ? WK_FP8W_RS : 0);
			int rc = wk_cuda_moe_experts(to, dx, didx, dwt, n, top_k, &mo, dscr, err,
						     sizeof err);
			wk_cuda_fp8w_mode(0);
			cr_assert_eq(rc, WK_OK, "%s", err);
		}
		from_dev(got, dy, ny * 4);
		from_dev(again, dy2, ny * 4);
		double r = rel(got, want, ny);
		cr_expect_leq(r, 1e-5, "GEMM n=%d dim=%d inter=%d shared %d: %g", n, dim, inter, sh,
			      r);
		cr_log_info("moe_experts GEMM n=%d dim=%d inter=%d shared %d: %.3g", n, dim, inter,
			    sh, r);
		cr_expect(memcmp(got, again, ny * 4) == 0, "GEMM n=%d: two runs differ", n);
		from_dev(again, dy3, ny * 4);
		r = rel(again, want, ny);
		cr_expect_leq(r, 1e-5, "GEMM rs n=%d dim=%d inter=%d shared %d: %g", n, dim, inter,
			      sh, r);
		cr_log_info("moe_experts GEMM rs n=%d dim=%d inter=%d shared %d: %.3g", n, dim,
			    inter, sh, r);
		wk_cuda_free(dy3);
		if (sh)
			moe_set_free(&shared);
		wk_cuda_free(dx);
		wk_cuda_free(dwt);
		wk_cuda_free(dy);
		wk_cuda_free(dy2);
		wk_cuda_free(didx);
		wk_cuda_free(dscr);
		moe_set_free(&m);
		free(idx);
		free(wt);
		free(x);
		free(y0);
		free(want);
		free(got);
		free(again);
		free(scr);
	}
}

/* The fused grouped op (the shared expert as one more group of gate/up and down, the combine
 * inside down) gives the unfused ops' y bit for bit: the shared expert run alone as a
 * one-expert grouped op (top 1, weight 1, onto -0.0, so y is its output exactly), then the
 * routed experts onto it, each with the combine as a launch of its own. Without a shared
 * expert, the combine inside down gives the separate combine's y. */
Test(cuda_kernels, moe_experts_fused_matches_unfused)
{
	NEED_GPU();
	int top_k = 8, n_local = 16, ex0 = 4, n_experts = 32;
	static const struct {
		enum dt_type t;
		int n, dim, inter, sh;
		enum dt_type st;
	} cases[] = {{DT_F8_E4M3, 37, 200, 144, 72, DT_F8_E4M3},
		     {DT_F8_E4M3, 1, 200, 144, 300, DT_F8_E4M3},
		     {DT_BF16, 9, 96, 70, 70, DT_BF16},
		     {DT_F8_E4M3, 9, 200, 144, 72, DT_F32},
		     {DT_F32, 5, 64, 50, 0, DT_F32}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		enum dt_type t = cases[c].t, st = cases[c].st;
		int n = cases[c].n, dim = cases[c].dim, inter = cases[c].inter, sh = cases[c].sh;
		size_t ny = (size_t)n * dim, ns = (size_t)n * top_k;
		struct moe_set m, shared;
		moe_set_make(&m, t, n_local, dim, inter);
		moe_set_make(&shared, st, 1, dim, sh ? sh : inter);
		int *idx = malloc(ns * sizeof *idx), *zeros = calloc((size_t)n, sizeof *zeros);
		float *wt = rnd_vec(ns), *x = rnd_vec(ny), *y0 = rnd_vec(ny);
		float *ones = malloc((size_t)n * 4), *neg0 = malloc(ny * 4);
		float *fused = malloc(ny * 4), *unfused = malloc(ny * 4);
		cr_assert(idx && zeros && ones && neg0 && fused && unfused);
		for (int i = 0; i < n; i++)
			moe_pick(idx + (size_t)i * top_k, top_k, n_experts, ex0, n_local, true,
				 i < 6 ? 5 : -1, i);
		for (int i = 0; i < n; i++)
			ones[i] = 1.0f;
		for (size_t i = 0; i < ny; i++)
			neg0[i] = -0.0f;
		struct wk_moe routed = moe_of(&m, t, ex0, dim, inter), fu = routed;
		if (sh) {
			fu.shared = &shared.dev[0];
			fu.shared_wdt = st;
			fu.shared_inter = sh;
		}
		struct wk_moe alone = moe_of(&shared, st, 0, dim, sh ? sh : inter);
		alone.split_combine = routed.split_combine = true;
		float *dx = to_dev(x, ny * 4), *dwt = to_dev(wt, ns * 4), *d1 = to_dev(ones, n * 4);
		int *didx = to_dev(idx, ns * sizeof *idx), *d0 = to_dev(zeros, n * sizeof *zeros);
		float *dyf = to_dev(y0, ny * 4), *dyu = to_dev(sh ? neg0 : y0, ny * 4);
		size_t b0 = wk_cuda_moe_experts_scratch(n, top_k, &fu);
		size_t b1 = wk_cuda_moe_experts_scratch(n, 1, &alone);
		void *dscr = dev_alloc(b0 > b1 ? b0 : b1);
		cr_assert_eq(wk_cuda_moe_experts(dyf, dx, didx, dwt, n, top_k, &fu, dscr, err,
						 sizeof err),
			     WK_OK, "%s", err);
		from_dev(fused, dyf, ny * 4);
		if (sh)
			cr_assert_eq(wk_cuda_moe_experts(dyu, dx, d0, d1, n, 1, &alone, dscr, err,
							 sizeof err),
				     WK_OK, "%s", err);
		cr_assert_eq(wk_cuda_moe_experts(dyu, dx, didx, dwt, n, top_k, &routed, dscr, err,
						 sizeof err),
			     WK_OK, "%s", err);
		from_dev(unfused, dyu, ny * 4);
		cr_expect(memcmp(fused, unfused, ny * 4) == 0,
			  "%s n=%d shared %d %s: the fused op's y differs from the unfused ops'",
			  dt_name(t), n, sh, dt_name(st));
		cr_expect(memcmp(fused, y0, ny * 4) != 0, "%s n=%d: y unchanged", dt_name(t), n);
		wk_cuda_free(dx);
		wk_cuda_free(dwt);
		wk_cuda_free(d1);
		wk_cuda_free(didx);
		wk_cuda_free(d0);
		wk_cuda_free(dyf);
		wk_cuda_free(dyu);
		wk_cuda_free(dscr);
		moe_set_free(&m);
		moe_set_free(&shared);
		free(idx);
		free(zeros);
		free(wt);
		free(x);
		free(y0);
		free(ones);
		free(neg0);
		free(fused);
		free(unfused);
	}
}

/* matmul_n: four weights of every dtype over one input in one launch, each output bit for
 * bit what its own matmul gives (the same row code), and within TOL of the reference. */
Test(cuda_kernels, matmul_n_matches_matmul)
{
	NEED_GPU();
	enum { K = 4 };
	int n = 3, cols = 300, rows[K] = {37, 64, 5, 130};
	enum dt_type types[K] = {DT_F32, DT_BF16, DT_F16, DT_F8_E4M3};
	float *x = rnd_vec((size_t)n * cols), *dx = to_dev(x, (size_t)n * cols * 4);
	struct wk_mm parts[K];
	void *dw[K];
	float *scale[K] = {NULL}, *dscale[K] = {NULL}, *want[K];
	for (int k = 0; k < K; k++) {
		void *w = rnd_weight(types[k], rows[k], cols, &scale[k]);
		size_t nb = (size_t)rows[k] * cols * dt_size(types[k]);
		dw[k] = to_dev(w, nb);
		if (scale[k])
			dscale[k] = to_dev(scale[k], (size_t)((rows[k] + 127) / 128) *
							 ((cols + 127) / 128) * 4);
		want[k] = malloc((size_t)n * rows[k] * 4);
		if (types[k] == DT_F8_E4M3)
			cpu_ref_matmul_fp8(want[k], x, w, scale[k], n, rows[k], cols);
		else
			cpu_ref_matmul(want[k], x, w, types[k], n, rows[k], cols);
		free(w);
		parts[k] = (struct wk_mm){.y = dev_alloc((size_t)n * rows[k] * 4), .w = dw[k],
					  .scale = dscale[k], .dtype = types[k], .rows = rows[k]};
	}
	cr_assert_eq(wk_cuda_matmul_n(parts, K, dx, n, cols, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) {
		size_t ny = (size_t)n * rows[k];
		float *got = malloc(ny * 4), *one = malloc(ny * 4), *dy = dev_alloc(ny * 4);
		from_dev(got, parts[k].y, ny * 4);
		if (types[k] == DT_F8_E4M3)
			cr_assert_eq(wk_cuda_matmul_fp8(dy, dx, dw[k], dscale[k], n, rows[k], cols, err,
							sizeof err), WK_OK, "%s", err);
		else
			cr_assert_eq(wk_cuda_matmul(dy, dx, dw[k], types[k], n, rows[k], cols, err,
						    sizeof err), WK_OK, "%s", err);
		from_dev(one, dy, ny * 4);
		cr_expect_eq(memcmp(got, one, ny * 4), 0, "%s: matmul_n differs from matmul",
			     dt_name(types[k]));
		cr_expect_leq(rel(got, want[k], ny), TOL, "%s: against the reference",
			      dt_name(types[k]));
		free(got);
		free(one);
		free(want[k]);
		free(scale[k]);
		wk_cuda_free(dy);
		wk_cuda_free(parts[k].y);
		wk_cuda_free(dw[k]);
		wk_cuda_free(dscale[k]);
	}
	struct wk_mm bad = parts[3];
	bad.scale = NULL;
	cr_expect_eq(wk_cuda_matmul_n(&bad, 1, dx, n, cols, err, sizeof err), WK_EINVAL);
	wk_cuda_free(dx);
	free(x);
}

/* The decode GEMV's paths (kernels.cu) for every weight dtype against the CPU reference:
 * 16-byte loads with one-warp and many-warp teams (short and long rows), 1, 2, 4 and 8
 * tokens a pass with masked tokens (n = 3, 5) and a second pass (n = 9), partial row groups
 * (rows % 4) and partial FP8 scale blocks (rows % 128, cols % 128), and the scalar path
 * (cols * elem_size % 16 != 0; w or x off a 16-byte boundary). y is poisoned first, so a
 * missing store shows as a NaN. */
Test(cuda_kernels, matmul_paths_match_ref)
{
	NEED_GPU();
	/* n, rows, cols, w offset (elements), x offset (floats) */
	static const int cases[][5] = {
		{1, 7, 2048, 0, 0}, {3, 13, 4096, 0, 0}, {8, 130, 1152, 0, 0}, {9, 33, 640, 0, 0},
		{2, 9, 1040, 0, 0}, {5, 6, 200, 0, 0},   {1, 1030, 256, 0, 0}, {4, 300, 7, 0, 0},
		{1, 1, 16, 0, 0},   {3, 11, 2048, 1, 0}, {8, 5, 1024, 0, 1},   {9, 130, 272, 0, 0},
	};
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16, DT_F8_E4M3};
	for (size_t ti = 0; ti < 4; ti++)
		for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
			enum dt_type t = types[ti];
			int n = cases[s][0], rows = cases[s][1], cols = cases[s][2];
			int wo = cases[s][3] * (int)dt_size(t), xo = cases[s][4] * 4;
			size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
			size_t nw = (size_t)rows * cols * dt_size(t);
			float *scale, *x = rnd_vec(nx), *want = malloc(ny * 4), *got = malloc(ny * 4);
			void *w = rnd_weight(t, rows, cols, &scale);
			cr_assert(want && got);
			if (t == DT_F8_E4M3)
				cpu_ref_matmul_fp8(want, x, w, scale, n, rows, cols);
			else
				cpu_ref_matmul(want, x, w, t, n, rows, cols);
			char *dx = to_dev_off(x, nx * 4, xo), *dw = to_dev_off(w, nw, wo);
			float *ds = scale ? to_dev(scale, (size_t)((rows + 127) / 128) *
							    ((cols + 127) / 128) * 4)
					  : NULL;
			for (size_t i = 0; i < ny; i++)
				got[i] = NAN;
			float *dy = to_dev(got, ny * 4);
			int rc = t == DT_F8_E4M3
					 ? wk_cuda_matmul_fp8(dy, (float *)(dx + xo), (uint8_t *)(dw + wo),
							      ds, n, rows, cols, err, sizeof err)
					 : wk_cuda_matmul(dy, (float *)(dx + xo), dw + wo, t, n, rows, cols,
							  err, sizeof err);
			cr_assert_eq(rc, WK_OK, "%s", err);
			from_dev(got, dy, ny * 4);
			double r = rel(got, want, ny);
			cr_expect_leq(r, TOL, "%s n=%d rows=%d cols=%d w+%d x+%d: %g", dt_name(t), n, rows,
				      cols, wo, xo, r);
			wk_cuda_free(dx);
			wk_cuda_free(dw);
			wk_cuda_free(ds);
			wk_cuda_free(dy);
			free(x);
			free(w);
			free(scale);
			free(want);
			free(got);
		}
}

/* matmul_n over weights of one dtype (the kernel wk_cuda_matmul itself runs) and of mixed
 * dtypes (a kernel of its own), on the 16-byte path with teams of one and several warps,
 * 9 tokens: each output bit for bit its own matmul's, and within TOL of the reference. */
Test(cuda_kernels, matmul_n_sets_match_matmul)
{
	NEED_GPU();
	enum { K = 4 };
	int n = 9, cols = 2064, rows[K] = {5, 130, 37, 260};
	static const enum dt_type sets[][K] = {{DT_F8_E4M3, DT_F8_E4M3, DT_F8_E4M3, DT_F8_E4M3},
					       {DT_BF16, DT_BF16, DT_BF16, DT_BF16},
					       {DT_F8_E4M3, DT_BF16, DT_F32, DT_F16}};
	float *x = rnd_vec((size_t)n * cols), *dx = to_dev(x, (size_t)n * cols * 4);
	for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
		struct wk_mm parts[K];
		void *dw[K];
		float *scale[K], *dscale[K] = {NULL}, *want[K];
		for (int k = 0; k < K; k++) {
			enum dt_type t = sets[si][k];
			void *w = rnd_weight(t, rows[k], cols, &scale[k]);
			dw[k] = to_dev(w, (size_t)rows[k] * cols * dt_size(t));
			if (scale[k])
				dscale[k] = to_dev(scale[k], (size_t)((rows[k] + 127) / 128) *
								 ((cols + 127) / 128) * 4);
			want[k] = malloc((size_t)n * rows[k] * 4);
			if (t == DT_F8_E4M3)
				cpu_ref_matmul_fp8(want[k], x, w, scale[k], n, rows[k], cols);
			else
				cpu_ref_matmul(want[k], x, w, t, n, rows[k], cols);
			free(w);
			parts[k] = (struct wk_mm){.y = dev_alloc((size_t)n * rows[k] * 4), .w = dw[k],
						  .scale = dscale[k], .dtype = t, .rows = rows[k]};
		}
		cr_assert_eq(wk_cuda_matmul_n(parts, K, dx, n, cols, err, sizeof err), WK_OK, "%s",
			     err);
		for (int k = 0; k < K; k++) {
			enum dt_type t = sets[si][k];
			size_t ny = (size_t)n * rows[k];
			float *got = malloc(ny * 4), *one = malloc(ny * 4), *dy = dev_alloc(ny * 4);
			from_dev(got, parts[k].y, ny * 4);
			if (t == DT_F8_E4M3)
				cr_assert_eq(wk_cuda_matmul_fp8(dy, dx, dw[k], dscale[k], n, rows[k], cols,
								err, sizeof err), WK_OK, "%s", err);
			else
				cr_assert_eq(wk_cuda_matmul(dy, dx, dw[k], t, n, rows[k], cols, err,
							    sizeof err), WK_OK, "%s", err);
			from_dev(one, dy, ny * 4);
			cr_expect_eq(memcmp(got, one, ny * 4), 0, "set %zu, %s x %d: matmul_n differs "
				     "from matmul", si, dt_name(t), rows[k]);
			cr_expect_leq(rel(got, want[k], ny), TOL, "set %zu, %s x %d: against the "
				      "reference", si, dt_name(t), rows[k]);
			free(got);
			free(one);
			free(want[k]);
			free(scale[k]);
			wk_cuda_free(dy);
			wk_cuda_free(parts[k].y);
			wk_cuda_free(dw[k]);
			wk_cuda_free(dscale[k]);
		}
	}
	wk_cuda_free(dx);
	free(x);
}

/* add_rmsnorm: the residual add and the norm in one launch, bit for bit the two kernels. */
Test(cuda_kernels, add_rmsnorm_matches_add_then_rmsnorm)
{
	NEED_GPU();
	int n = 3, dim = 1000;
	size_t N = (size_t)n * dim;
	float *x = rnd_vec(N), *d = rnd_vec(N), *w = rnd_vec(dim);
	float *xa = to_dev(x, N * 4), *xb = to_dev(x, N * 4), *dd = to_dev(d, N * 4);
	float *dw = to_dev(w, dim * 4), *ya = dev_alloc(N * 4), *yb = dev_alloc(N * 4);
	cr_assert_eq(wk_cuda_add(xa, dd, N, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_rmsnorm(ya, xa, dw, n, dim, 1e-5f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_add_rmsnorm(xb, dd, yb, dw, n, dim, 1e-5f, err, sizeof err), WK_OK,
		     "%s", err);
	float *a = malloc(N * 4), *b = malloc(N * 4), *want = malloc(N * 4);
	from_dev(a, xa, N * 4);
	from_dev(b, xb, N * 4);
	cr_expect_eq(memcmp(a, b, N * 4), 0, "the sums differ");
	from_dev(a, ya, N * 4);
	from_dev(b, yb, N * 4);
	cr_expect_eq(memcmp(a, b, N * 4), 0, "the norms differ");
	for (size_t i = 0; i < N; i++)
		x[i] += d[i];
	cpu_ref_rmsnorm(want, x, w, n, dim, 1e-5f);
	cr_expect_leq(rel(b, want, N), TOL, "against the reference");
	wk_cuda_free(xa);
	wk_cuda_free(xb);
	wk_cuda_free(dd);
	wk_cuda_free(dw);
	wk_cuda_free(ya);
	wk_cuda_free(yb);
	free(x);
	free(d);
	free(w);
	free(a);
	free(b);
	free(want);
}

/* act_quant: FP8 activations per token per 128 channels, bit for bit the CPU reference (a
 * partial last block, a zero block, magnitudes from subnormal to saturating). */
Test(cuda_kernels, act_quant_matches_ref)
{
	NEED_GPU();
	int n = 4, cols = 300;
	size_t N = (size_t)n * cols;
	float *x = rnd_vec(N), *want = malloc(N * 4), *got = malloc(N * 4);
	for (size_t i = 0; i < N; i++)
		x[i] *= ldexpf(1.0f, (int)(i % 23) - 12);
	for (int c = 128; c < 256; c++)
		x[cols + c] = 0.0f;
	cpu_ref_act_quant(want, x, n, cols);
	float *dx = to_dev(x, N * 4), *dy = dev_alloc(N * 4);
	cr_assert_eq(wk_cuda_act_quant(dy, dx, n, cols, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dy, N * 4);
	cr_expect_eq(memcmp(got, want, N * 4), 0, "act_quant differs from cpu_ref_act_quant");
	cr_assert_eq(wk_cuda_act_quant(dx, dx, n, cols, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_eq(memcmp(got, want, N * 4), 0, "in place");
	wk_cuda_free(dx);
	wk_cuda_free(dy);
	free(x);
	free(want);
	free(got);
}

/* act_codes: the same quantization kept as e4m3 bytes and per-block scales, which the FP8
 * GEMMs read: byte * scale is act_quant's value bit for bit, and every byte is a finite
 * e4m3 code (subnormals, a zero block and the 448 end included). */
Test(cuda_kernels, act_codes_are_act_quants_values)
{
	NEED_GPU();
	int n = 5, cols = 300, nb = 3;
	size_t N = (size_t)n * cols;
	float *x = rnd_vec(N), *want = malloc(N * 4), *xs = malloc((size_t)n * nb * 4);
	uint8_t *xq = malloc(N);
	for (size_t i = 0; i < N; i++)
		x[i] *= ldexpf(1.0f, (int)(i % 23) - 12);
	for (int c = 128; c < 256; c++)
		x[cols + c] = 0.0f;
	x[2 * cols + 7] = -0.0f;
	cpu_ref_act_quant(want, x, n, cols);
	float *dx = to_dev(x, N * 4), *ds = dev_alloc((size_t)n * nb * 4);
	uint8_t *dq = dev_alloc(N);
	cr_assert_eq(wk_cuda_act_codes(dq, ds, dx, n, cols, err, sizeof err), WK_OK, "%s", err);
	from_dev(xq, dq, N);
	from_dev(xs, ds, (size_t)n * nb * 4);
	int sub = 0, top = 0;
	for (int t = 0; t < n; t++)
		for (int c = 0; c < cols; c++) {
			size_t i = (size_t)t * cols + c;
			uint8_t b = xq[i];
			cr_assert((b & 0x7f) != 0x7f, "token %d col %d: NaN code 0x%02x", t, c, b);
			float v = dt_e4m3_to_f32(b) * xs[t * nb + c / 128];
			cr_assert(memcmp(&v, &want[i], 4) == 0, "token %d col %d: code 0x%02x x %g = %g, "
				  "act_quant %g", t, c, b, xs[t * nb + c / 128], v, want[i]);
			sub += b && (b & 0x78) == 0;
			top += (b & 0x7f) == 0x7e;
		}
	cr_expect(sub > 0 && top >= n, "subnormal codes %d, 448s %d: the cases were not covered",
		  sub, top);
	wk_cuda_free(dx);
	wk_cuda_free(ds);
	wk_cuda_free(dq);
	free(x);
	free(want);
	free(xs);
	free(xq);
}

/* rope_n: three tensors of different shapes and positions in one launch, bit for bit what
 * rope gives each alone. */
Test(cuda_kernels, rope_n_matches_rope)
{
	NEED_GPU();
	enum { K = 3 };
	int n[K] = {5, 5, 2}, heads[K] = {4, 2, 1}, hd[K] = {24, 16, 8}, rot[K] = {8, 8, 8};
	int pos_h[5] = {0, 3, 7, 100, 4095};
	int *dpos = to_dev(pos_h, sizeof pos_h);
	struct wk_rope r[K];
	float *a[K], *b[K];
	for (int k = 0; k < K; k++) {
		size_t N = (size_t)n[k] * heads[k] * hd[k];
		float *x = rnd_vec(N);
		a[k] = to_dev(x, N * 4);
		b[k] = to_dev(x, N * 4);
		free(x);
		r[k] = (struct wk_rope){a[k], n[k], dpos + (k == 2 ? 3 : 0), heads[k], hd[k], rot[k]};
		cr_assert_eq(wk_cuda_rope(b[k], n[k], dpos + (k == 2 ? 3 : 0), heads[k], hd[k], rot[k],
					  10000.0f, true, err, sizeof err), WK_OK, "%s", err);
	}
	cr_assert_eq(wk_cuda_rope_n(r, K, 10000.0f, true, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) {
		size_t N = (size_t)n[k] * heads[k] * hd[k];
		float *ga = malloc(N * 4), *gb = malloc(N * 4);
		from_dev(ga, a[k], N * 4);
		from_dev(gb, b[k], N * 4);
		cr_expect_eq(memcmp(ga, gb, N * 4), 0, "tensor %d differs from rope alone", k);
		free(ga);
		free(gb);
		wk_cuda_free(a[k]);
		wk_cuda_free(b[k]);
	}
	wk_cuda_free(dpos);
}

/* matmul_n with rotations in its store (the engine's matmul_rope_n on CUDA): each output
 * bit for bit matmul_n's, then wk_cuda_rope over its rope slices; and within TOL of the CPU's
 * matmul and rope. Token counts 1, 2, 3, 5 and 9 (every pass size, and two passes), one-warp
 * and multi-warp teams (a short wide weight), rope slices at the head's start and inside it,
 * a part without rotation, one dtype and a mixed set. A slice at an odd row is refused. */
Test(cuda_kernels, matmul_n_rotations_match_matmul_then_rope)
{
	NEED_GPU();
	enum { K = 3 };
	static const int ns[] = {1, 2, 3, 5, 9};
	static const int heads[K] = {4, 2, 0}, hd[K] = {64, 40, 0}, off[K] = {48, 0, 0},
			 rot[K] = {16, 32, 0}, rows0[K] = {256, 80, 96};
	static const enum dt_type sets[][K] = {{DT_F8_E4M3, DT_F8_E4M3, DT_F8_E4M3},
					       {DT_BF16, DT_F8_E4M3, DT_F32}};
	int pos_h[9] = {0, 3, 7, 100, 4095, 1, 2, 31, 65000};
	int *dpos = to_dev(pos_h, sizeof pos_h);
	for (int c = 0; c < 2; c++) {
		int cols = c == 0 ? 2048 : 256; /* 2048 wide, 256 rows: teams of several warps */
		for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
			for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
				int n = ns[ni];
				float *x = rnd_vec((size_t)n * cols), *dx = to_dev(x, (size_t)n * cols * 4);
				struct wk_mm fused[K], plain[K];
				void *dw[K];
				float *scale[K], *dscale[K] = {NULL};
				float *ref[K];
				for (int k = 0; k < K; k++) {
					enum dt_type t = sets[si][k];
					void *w = rnd_weight(t, rows0[k], cols, &scale[k]);
					dw[k] = to_dev(w, (size_t)rows0[k] * cols * dt_size(t));
					if (scale[k])
						dscale[k] = to_dev(scale[k], (size_t)((rows0[k] + 127) / 128) *
										 ((cols + 127) / 128) * 4);
					ref[k] = malloc((size_t)n * rows0[k] * 4);
					if (t == DT_F8_E4M3)
						cpu_ref_matmul_fp8(ref[k], x, w, scale[k], n, rows0[k], cols);
					else
						cpu_ref_matmul(ref[k], x, w, t, n, rows0[k], cols);
					if (rot[k])
						cpu_ref_rope(ref[k] + off[k], n, pos_h, heads[k], hd[k], rot[k],
							     10000.0f, true);
					free(w);
					size_t ny = (size_t)n * rows0[k] * 4;
					plain[k] = (struct wk_mm){.y = dev_alloc(ny), .w = dw[k],
								  .scale = dscale[k], .dtype = t,
								  .rows = rows0[k]};
					fused[k] = plain[k];
					fused[k].y = dev_alloc(ny);
					fused[k].rope_pos = dpos;
					fused[k].rope_heads = heads[k];
					fused[k].rope_hd = hd[k];
					fused[k].rope_off = off[k];
					fused[k].rope_dim = rot[k];
					fused[k].rope_theta = 10000.0f;
				}
				cr_assert_eq(wk_cuda_matmul_n(fused, K, dx, n, cols, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_matmul_n(plain, K, dx, n, cols, err, sizeof err),
					     WK_OK, "%s", err);
				for (int k = 0; k < K; k++) {
					if (rot[k])
						cr_assert_eq(wk_cuda_rope(plain[k].y + off[k], n, dpos, heads[k],
									  hd[k], rot[k], 10000.0f, true,
									  err, sizeof err), WK_OK, "%s", err);
					size_t ny = (size_t)n * rows0[k];
					float *gf = malloc(ny * 4), *gp = malloc(ny * 4);
					from_dev(gf, fused[k].y, ny * 4);
					from_dev(gp, plain[k].y, ny * 4);
					cr_expect_eq(memcmp(gf, gp, ny * 4), 0, "cols %d, set %zu, n %d, part "
						     "%d: the store's rotation differs from rope's", cols,
						     si, n, k);
					cr_expect_leq(rel(gf, ref[k], ny), TOL, "cols %d, set %zu, n %d, "
						      "part %d: against the reference", cols, si, n, k);
					free(gf);
					free(gp);
					free(ref[k]);
					free(scale[k]);
					wk_cuda_free(fused[k].y);
					wk_cuda_free(plain[k].y);
					wk_cuda_free(dw[k]);
					wk_cuda_free(dscale[k]);
				}
				wk_cuda_free(dx);
				free(x);
			}
		}
	}
	/* a slice starting at an odd row would split its pairs across groups of 4 rows */
	float *dy = dev_alloc(256 * 4), *dx = dev_alloc(256 * 4);
	float *w32 = rnd_vec(256 * 256), *dw = to_dev(w32, 256 * 256 * 4);
	struct wk_mm bad = {.y = dy, .w = dw, .dtype = DT_F32, .rows = 256, .rope_pos = dpos,
			    .rope_heads = 4, .rope_hd = 64, .rope_off = 47, .rope_dim = 16,
			    .rope_theta = 10000.0f};
	cr_expect_eq(wk_cuda_matmul_n(&bad, 1, dx, 1, 256, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "rotation"), "%s", err);
	wk_cuda_free(dy);
	wk_cuda_free(dx);
	wk_cuda_free(dw);
	free(w32);
	wk_cuda_free(dpos);
}

/* norm_n with a rotation after the norm (GLM-5's indexer keys): an rmsnorm and a layernorm
 * with a bias, each row's first rope_dim rotated, bit for bit norm_n without, then rope. */
Test(cuda_kernels, norm_n_rotation_matches_norm_then_rope)
{
	NEED_GPU();
	enum { K = 2, N = 5, DIM = 128, ROT = 64 };
	int pos_h[N] = {0, 9, 100, 4095, 70000};
	int *dpos = to_dev(pos_h, sizeof pos_h);
	float *x = rnd_vec((size_t)N * DIM), *wv = rnd_vec(DIM), *bv = rnd_vec(DIM);
	float *dx = to_dev(x, (size_t)N * DIM * 4), *dwv = to_dev(wv, DIM * 4), *dbv = to_dev(bv, DIM * 4);
	struct wk_norm fused[K], plain[K];
	for (int k = 0; k < K; k++) {
		plain[k] = (struct wk_norm){.y = dev_alloc((size_t)N * DIM * 4), .x = dx, .w = dwv,
					    .b = k ? dbv : NULL, .n = N, .dim = DIM, .eps = 1e-6f,
					    .layer = k == 1};
		fused[k] = plain[k];
		fused[k].y = dev_alloc((size_t)N * DIM * 4);
		fused[k].rope_pos = dpos;
		fused[k].rope_dim = ROT;
		fused[k].rope_theta = 10000.0f;
	}
	cr_assert_eq(wk_cuda_norm_n(fused, K, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_norm_n(plain, K, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) {
		cr_assert_eq(wk_cuda_rope(plain[k].y, N, dpos, 1, DIM, ROT, 10000.0f, true, err,
					  sizeof err), WK_OK, "%s", err);
		float gf[N * DIM], gp[N * DIM];
		from_dev(gf, fused[k].y, sizeof gf);
		from_dev(gp, plain[k].y, sizeof gp);
		cr_expect_eq(memcmp(gf, gp, sizeof gf), 0, "norm %d: rotated in the norm's launch "
			     "differs from rope after it", k);
		wk_cuda_free(fused[k].y);
		wk_cuda_free(plain[k].y);
	}
	fused[0].rope_dim = 7;
	cr_expect_eq(wk_cuda_norm_n(fused, 1, err, sizeof err), WK_EINVAL);
	wk_cuda_free(dx);
	wk_cuda_free(dwv);
	wk_cuda_free(dbv);
	wk_cuda_free(dpos);
	free(x);
	free(wv);
	free(bv);
}

/* norm_n as GLM-4.5's attention uses it: q and k biased (a token's row of the bias, head h
 * taking its slice), normalised per head and rotated half-split over the first ROT of each
 * head at their token's position; v biased only (bare). Bit for bit the ops one by one (add a
 * token at a time, rmsnorm over the heads' rows, rope), and also y apart from x; a head
 * count that does not divide the rows is refused. */
Test(cuda_kernels, norm_n_bias_heads_matches_add_norm_rope)
{
	NEED_GPU();
	enum { T = 3, HD = 40, ROT = 20, K = 3 };
	int heads[K] = {4, 2, 2}, pos_h[T] = {0, 17, 5000};
	int *dpos = to_dev(pos_h, sizeof pos_h);
	float *wv = rnd_vec(HD), *dwv = to_dev(wv, HD * 4);
	float *dx[K], *db[K], *fused[K], *apart[K], *plain[K];
	struct wk_norm r[K];
	for (int k = 0; k < K; k++) {
		size_t w = (size_t)heads[k] * HD;
		float *x = rnd_vec(T * w), *b = rnd_vec(w);
		dx[k] = to_dev(x, T * w * 4);
		db[k] = to_dev(b, w * 4);
		fused[k] = to_dev(x, T * w * 4);
		plain[k] = to_dev(x, T * w * 4);
		apart[k] = dev_alloc(T * w * 4);
		free(x);
		free(b);
		r[k] = (struct wk_norm){.y = fused[k], .x = fused[k], .w = dwv,
					.rope_pos = k < 2 ? dpos : NULL, .add = db[k],
					.n = T * heads[k], .dim = HD, .eps = 1e-5f,
					.rope_theta = 10000.0f, .rope_dim = k < 2 ? ROT : 0,
					.heads = (int16_t)heads[k], .half = true, .bare = k == 2};
	}
	cr_assert_eq(wk_cuda_norm_n(r, K, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) { /* again from x into another y */
		r[k].x = dx[k];
		r[k].y = apart[k];
	}
	cr_assert_eq(wk_cuda_norm_n(r, K, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) {
		size_t w = (size_t)heads[k] * HD;
		for (int t = 0; t < T; t++)
			cr_assert_eq(wk_cuda_add(plain[k] + t * w, db[k], w, err, sizeof err),
				     WK_OK);
		if (k < 2) {
			cr_assert_eq(wk_cuda_rmsnorm(plain[k], plain[k], dwv, T * heads[k], HD,
						     1e-5f, err, sizeof err),
				     WK_OK, "%s", err);
			cr_assert_eq(wk_cuda_rope(plain[k], T, dpos, heads[k], HD, ROT, 10000.0f,
						  false, err, sizeof err), WK_OK, "%s", err);
		}
		float *gf = malloc(T * w * 4), *ga = malloc(T * w * 4), *gp = malloc(T * w * 4);
		from_dev(gf, fused[k], T * w * 4);
		from_dev(ga, apart[k], T * w * 4);
		from_dev(gp, plain[k], T * w * 4);
		cr_expect_eq(memcmp(gf, gp, T * w * 4), 0, "norm %d: in one launch differs from "
			     "the ops one by one", k);
		cr_expect_eq(memcmp(ga, gp, T * w * 4), 0, "norm %d: into another y differs", k);
		free(gf);
		free(ga);
		free(gp);
	}
	r[0].heads = 4;
	r[0].n = 7;
	cr_expect_eq(wk_cuda_norm_n(r, 1, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "heads"), "%s", err);
	for (int k = 0; k < K; k++) {
		void *d[] = {dx[k], db[k], fused[k], apart[k], plain[k]};
		for (size_t i = 0; i < 5; i++)
			wk_cuda_free(d[i]);
	}
	wk_cuda_free(dwv);
	wk_cuda_free(dpos);
	free(wv);
}

/* norm_n: an rmsnorm in place, a layernorm with a bias and one without, in one launch, bit
 * for bit what each gives alone. */
Test(cuda_kernels, norm_n_matches_norms)
{
	NEED_GPU();
	enum { K = 3 };
	int n[K] = {3, 2, 4}, dim[K] = {300, 64, 1000};
	bool layer[K] = {false, true, true};
	struct wk_norm r[K];
	float *a[K], *b[K], *w[K], *bias = NULL;
	for (int k = 0; k < K; k++) {
		size_t N = (size_t)n[k] * dim[k];
		float *x = rnd_vec(N), *wv = rnd_vec(dim[k]);
		a[k] = to_dev(x, N * 4);
		b[k] = dev_alloc(N * 4);
		w[k] = to_dev(wv, dim[k] * 4);
		if (k == 1) {
			float *bv = rnd_vec(dim[k]);
			bias = to_dev(bv, dim[k] * 4);
			free(bv);
		}
		float *bb = k == 1 ? bias : NULL;
		float *out = k == 0 ? a[k] : dev_alloc(N * 4);
		r[k] = (struct wk_norm){.y = out, .x = a[k], .w = w[k], .b = bb, .n = n[k],
					.dim = dim[k], .eps = 1e-6f, .layer = layer[k]};
		if (layer[k])
			cr_assert_eq(wk_cuda_layernorm(b[k], a[k], w[k], bb, n[k], dim[k], 1e-6f, err,
						       sizeof err), WK_OK, "%s", err);
		else
			cr_assert_eq(wk_cuda_rmsnorm(b[k], a[k], w[k], n[k], dim[k], 1e-6f, err,
						     sizeof err), WK_OK, "%s", err);
		free(x);
		free(wv);
	}
	cr_assert_eq(wk_cuda_norm_n(r, K, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < K; k++) {
		size_t N = (size_t)n[k] * dim[k];
		float *ga = malloc(N * 4), *gb = malloc(N * 4);
		from_dev(ga, r[k].y, N * 4);
		from_dev(gb, b[k], N * 4);
		cr_expect_eq(memcmp(ga, gb, N * 4), 0, "norm %d differs from its kernel alone", k);
		free(ga);
		free(gb);
		if (k)
			wk_cuda_free(r[k].y);
		wk_cuda_free(a[k]);
		wk_cuda_free(b[k]);
		wk_cuda_free(w[k]);
	}
	wk_cuda_free(bias);
}

/* mla_absorbed's outputs got[3..5] (with the split scratch) and got[6..8] (without) against
 * the three kernels' got[0..2] (qa, lat, o: len[k] floats each): bit for bit, but for an
 * unsplit lat and o where the kernels split (split > 1), which differ by the order of lat's
 * sums only; and both o against the CPU's chain ro. */
static void check_absorbed(float *const got[9], const size_t len[9], const float *ro, int split,
			   const char *what)
{
	static const char *const stage[3] = {"qa", "lat", "o"};
	for (int f = 1; f < 3; f++) {
		const char *how = f == 1 ? "split" : "unsplit";
		for (int k = 0; k < 3; k++) {
			const float *a = got[k], *b = got[k + 3 * f];
			bool same = f == 2 && k > 0 && split > 1 ? rel(b, a, len[k]) <= TOL
								  : !memcmp(a, b, len[k] * 4);
			cr_expect(same, "%s: the fused %s %s differs from its kernel's", what, how,
				  stage[k]);
		}
		double r = rel(got[3 * f + 2], ro, len[2]);
		cr_expect_leq(r, TOL, "%s: o (%s) against the CPU's chain: %g", what, how, r);
	}
}

/* mla_absorbed: absorb_q, the latent attention and absorb_out in one launch of three stages;
 * its qa, lat and o bit for bit what the three kernels give one after another on the same
 * split scratch (and again without one: the three kernels themselves), dense and
 * DSA-selected, over token counts across absorb_q's chunk of 8, for every kv_b dtype; the
 * chain against the CPU references; the counters left zero. The later cases run fewer
 * dtypes: a GLM-5 rank's decode at 2,500 positions (its keys split over 19 blocks dense,
 * up to 16 selected), and batches whose blocks run 2 and 8 heads each. */
Test(cuda_kernels, mla_absorbed_matches_the_three_kernels)
{
	NEED_GPU();
	/* lora, heads, d_nope, d_rope, d_v, n, pos0, topk, the dtypes run (types[] bits), heads
	 * a block forced (wk_cuda_mla_force; 0: the plan's) */
	static const int cases[][10] = {
		{300, 3, 24, 8, 20, 1, 140, 64, 63, 0},  /* a decode step, selecting */
		{300, 2, 24, 8, 20, 9, 30, 16, 63, 0},   /* more tokens than a chunk of absorb_q */
		{512, 2, 192, 64, 256, 3, 40, 32, 63, 0}, /* GLM-5's sizes, fewer heads */
		{64, 4, 16, 4, 40, 5, 0, 4, 63, 0},      /* a prefill that absorbs; d_v past lora/2 */
		{512, 8, 192, 64, 256, 1, 2500, 2048, 48, 0}, /* GLM-5 at tp 8, split */
		{512, 8, 192, 64, 256, 3, 2500, 2048, 32, 0}, /* 3 tokens, split */
		{64, 8, 16, 8, 32, 2, 600, 256, 33, 4},  /* 4 heads a block, split */
		{64, 8, 16, 8, 32, 70, 10, 16, 33, 0},   /* 2 heads a block */
		{32, 8, 8, 8, 16, 270, 0, 8, 32, 0},     /* 8 heads a block */
	};
	/* the weights' types over an f32 cache, then FP8 weights over a bf16 cache (GLM-5's) and
	 * over an FP8 one (--kv-dtype fp8: the latent's codes and scales, k_pe in bf16) */
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16, DT_F8_E4M3, DT_F8_E4M3, DT_F8_E4M3};
	enum { COUNTERS = 4096 };
	unsigned *dcount, zero[COUNTERS] = {0}, back[COUNTERS];
	cr_assert_eq(wk_cuda_alloc((void **)&dcount, sizeof zero, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_upload(dcount, zero, sizeof zero, err, sizeof err), WK_OK, "%s", err);
	int runs[4][2] = {{0}}; /* by heads a block (1, 2, 4, 8) and split or not */
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
		for (size_t ti = 0; ti < 6; ti++)
			for (int sparse = 0; sparse < 2 && (cases[c][8] >> ti & 1); sparse++) {
				int lora = cases[c][0], H = cases[c][1], nope = cases[c][2];
				int rope = cases[c][3], dv = cases[c][4], n = cases[c][5];
				int pos0 = cases[c][6], topk = cases[c][7], T = pos0 + n;
				int rows = H * (nope + dv);
				enum dt_type t = types[ti];
				enum dt_type kv = ti == 5 ? DT_F8_E4M3 : ti == 4 ? DT_BF16 : DT_F32;
				float *scale;
				void *w = rnd_weight(t, rows, lora, &scale);
				size_t nq = (size_t)n * H * (nope + rope);
				size_t nqa = (size_t)n * H * (lora + rope), nl = (size_t)n * H * lora;
				size_t no = (size_t)n * H * dv;
				float *q = rnd_vec(nq), *ckv = rnd_vec((size_t)T * lora);
				float *kpe = rnd_vec((size_t)T * rope);
				void *ckv16 = NULL, *kpe16;
				float *ckvs = NULL;
				const void *ckvh;
				if (kv == DT_F8_E4M3) /* the codes freed as ckv16 */
					ckvh = ckv16 = to_fp8(ckv, (size_t)T, lora, &ckvs);
				else
					ckvh = kv_host(ckv, (size_t)T * lora, kv, &ckv16);
				const void *kpeh = kv_host(kpe, (size_t)T * rope, cpu_kv_b_type(kv),
							   &kpe16);
				int *sel = malloc((size_t)n * topk * sizeof(int));
				int *nsel = malloc((size_t)n * sizeof(int));
				cr_assert(sel && nsel);
				rnd_sel(sel, nsel, n, pos0, topk);
				struct cpu_mla s = {.n_heads = H, .d_a = lora, .d_b = rope, .d_v = lora,
						    .kv = kv, .k_a = ckvh, .k_b = kpeh, .v = ckvh,
						    .a_s = ckvs, .ka_stride = (size_t)lora, .kb_stride = (size_t)rope,
						    .v_stride = (size_t)lora,
						    .sel = sparse ? sel : NULL, .nsel = nsel,
						    .sel_stride = topk,
						    .scale = 1.0f / sqrtf((float)(nope + rope))};
				/* the CPU's chain */
				float *rqa = malloc(nqa * 4), *rlat = malloc(nl * 4);
				float *ro = malloc(no * 4);
				cpu_ref_mla_absorb_q(rqa, q, w, t, scale, lora, n, H, nope, rope, dv, 0,
						     H);
				cpu_ref_mla_attention(rlat, rqa, &s, n, pos0, 0, n, 0, H);
				cpu_ref_mla_absorb_out(ro, rlat, w, t, scale, lora, n, H, nope, dv, 0,
						       H);
				size_t ns = (size_t)((rows + 127) / 128) * ((lora + 127) / 128);
				void *dw = to_dev(w, (size_t)rows * lora * dt_size(t));
				float *ds = scale ? to_dev(scale, ns * 4) : NULL;
				float *dq = to_dev(q, nq * 4);
				struct cpu_mla dm = s;
				dm.k_a = dm.v = to_dev(ckvh, (size_t)T * lora * dt_size(kv));
				dm.k_b = to_dev(kpeh, (size_t)T * rope * dt_size(cpu_kv_b_type(kv)));
				if (ckvs)
					dm.a_s = to_dev(ckvs, (size_t)T * cpu_kv_blocks(lora) * 4);
				int *dsel = to_dev(sel, (size_t)n * topk * sizeof(int));
				dm.nsel = to_dev(nsel, (size_t)n * sizeof(int));
				dm.sel = sparse ? dsel : NULL;
				/* the split's scratch: 4 counters of the stages, then the parts' */
				wk_cuda_mla_force(cases[c][9]);
				size_t pf = wk_cuda_mla_part(&dm, n, pos0);
				float *dpart;
				cr_assert_eq(wk_cuda_alloc((void **)&dpart, (pf + 1) * 4, err,
							   sizeof err), WK_OK);
				struct wk_att_split sp = {dpart, pf, dcount + 4, COUNTERS - 4};
				struct wk_att_split spa = {dpart, pf, dcount, COUNTERS};
				int gm, split;
				wk_cuda_mla_shape(&dm, n, H, pos0, &gm, &split);
				runs[gm == 1 ? 0 : gm == 2 ? 1 : gm == 4 ? 2 : 3][split > 1]++;
				size_t parts = (size_t)n * H * split * (lora + 2), wrote[2];
				poison_parts(dpart, pf + 1);
				/* qa, lat, o: the three kernels, then fused with the scratch, then
				 * without */
				float *buf[9], *got[9];
				size_t len[9] = {nqa, nl, no, nqa, nl, no, nqa, nl, no};
				for (int k = 0; k < 9; k++) {
					float *fill = fill_vec(len[k], 7.0f);
					buf[k] = to_dev(fill, len[k] * 4);
					got[k] = fill;
				}
				cr_assert_eq(wk_cuda_mla_absorb_q(buf[0], dq, dw, t, ds, lora, n, H, nope,
								  rope, dv, 0, H, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_mla_attention(buf[1], buf[0], &dm, n, pos0, 0, n, 0,
								   H, &sp, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_mla_absorb_out(buf[2], buf[1], dw, t, ds, lora, n, H,
								    nope, dv, 0, H, err, sizeof err),
					     WK_OK, "%s", err);
				wrote[0] = parts_written(dpart, pf + 1);
				for (int f = 1; f < 3; f++) {
					float *const *b = buf + 3 * f; /* qa, lat, o */
					const struct wk_att_split *use = f == 1 ? &spa : NULL;
					int rc = wk_cuda_mla_absorbed(
						b[2], b[0], b[1], dq, dw, t, ds, lora, &dm, n, pos0,
						nope, dv, use, err, sizeof err);
					cr_assert_eq(rc, WK_OK, "%s", err);
					if (f == 1) { /* the one launch's own parts */
						wrote[1] = parts_written(dpart, pf + 1);
						poison_parts(dpart, pf + 1);
					}
				}
				wk_cuda_mla_force(0);
				/* every part written, by the three kernels and by the one launch */
				for (int f = 0; f < 2 && split > 1; f++)
					cr_expect_eq(wrote[f], parts, "case %zu: %s wrote %zu of %zu",
						     c, f ? "mla_absorbed" : "mla_attention", wrote[f],
						     parts);
				cr_expect(split > 1 || (!wrote[0] && !wrote[1]), "case %zu: unsplit, "
					  "parts written", c);
				for (int k = 0; k < 9; k++)
					from_dev(got[k], buf[k], len[k] * 4);
				char what[96];
				snprintf(what, sizeof what, "case %zu %s sparse=%d %s cache", c,
					 dt_name(t), sparse, dt_name(kv));
				check_absorbed(got, len, ro, split, what);
				cr_assert_eq(wk_cuda_download(back, dcount, sizeof back, err,
							      sizeof err), WK_OK);
				cr_expect_eq(memcmp(back, zero, sizeof zero), 0,
					     "case %zu: counters left non-zero", c);
				wk_cuda_free(dpart);
				for (int k = 0; k < 9; k++) {
					wk_cuda_free(buf[k]);
					free(got[k]);
				}
				wk_cuda_free(dw);
				wk_cuda_free(ds);
				wk_cuda_free(dq);
				wk_cuda_free((void *)dm.k_a);
				wk_cuda_free((void *)dm.k_b);
				wk_cuda_free((void *)dm.a_s);
				wk_cuda_free(dsel);
				wk_cuda_free((void *)dm.nsel);
				free(w);
				free(scale);
				free(q);
				free(ckv);
				free(kpe);
				free(ckv16);
				free(kpe16);
				free(ckvs);
				free(sel);
				free(nsel);
				free(rqa);
				free(rlat);
				free(ro);
			}
	/* split at 1 head a block (GLM-5's decode) and at 4 (forced), 2 and 8 heads unsplit */
	cr_expect(runs[0][1] >= 4 && runs[2][1] >= 2 && runs[1][0] >= 2 && runs[3][0] >= 1,
		  "runs: 1 head split %d, 4 split %d, 2 whole %d, 8 whole %d", runs[0][1],
		  runs[2][1], runs[1][0], runs[3][0]);
	wk_cuda_free(dcount);
	/* refused by name: a latent attention whose widths are not kv_b's lora, FP8 without
	 * its scales, past the attention's shared memory */
	float dummy;
	struct cpu_mla bad = {.n_heads = 1, .d_a = 8, .d_b = 2, .d_v = 4};
	cr_expect_eq(wk_cuda_mla_absorbed(&dummy, &dummy, &dummy, &dummy, &dummy, DT_F32, NULL, 8,
					  &bad, 1, 0, 1, 1, NULL, err, sizeof err),
		     WK_EINVAL);
	cr_expect(strstr(err, "mla_absorbed"), "%s", err);
	bad.d_v = 8;
	cr_expect_eq(wk_cuda_mla_absorbed(&dummy, &dummy, &dummy, &dummy, &dummy, DT_F8_E4M3,
					  NULL, 8, &bad, 1, 0, 1, 1, NULL, err, sizeof err),
		     WK_EINVAL, "FP8 needs its scales");
	bad.d_a = bad.d_v = 8192;
	cr_expect_eq(wk_cuda_mla_absorbed(&dummy, &dummy, &dummy, &dummy, &dummy, DT_F32, NULL,
					  8192, &bad, 1, 0, 1, 1, NULL, err, sizeof err),
		     WK_EINVAL, "past the kernel's shared memory the call is refused");
}
