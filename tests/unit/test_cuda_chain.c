/*
 * test_cuda_chain.c - chained launches (wk_cuda_chain): GLM-5's decode chains run as chains
 * and op by op give the same bits, and leave their counters zero; bad chains are refused.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

/* ---- chained launches (wk_cuda_chain) ---------------------------------------------------- */

/* A device weight of rnd_weight's (scale: its device block scales, or NULL). */
static void *dev_weight(enum dt_type t, int rows, int cols, float **scale)
{
	float *hs;
	void *w = rnd_weight(t, rows, cols, &hs), *dw = to_dev(w, (size_t)rows * cols * dt_size(t));
	*scale = hs ? to_dev(hs, (size_t)((rows + 127) / 128) * ((cols + 127) / 128) * 4) : NULL;
	free(w);
	free(hs);
	return dw;
}

/* The buffers one run of the two chains writes: the residual h (a copy of h0) and every
 * op's output. */
enum { CH_D = 256, CH_Q = 96, CH_K = 64, CH_I = 8, CH_B = 96, CH_IQ = 64, CH_R = 16 };
struct ch_out {
	float *h, *xb, *qc, *kv, *iw, *qb, *iq, *o, *xb2, *r;
	uint16_t *c16; /* a bf16 cache's n rows of [q_c | kv] (CH_Q + CH_K) */
	uint8_t *f8;   /* FP8 caches: n rows of q_c (CH_Q), then n of xb (CH_D), */
	float *f8s;    /* their scales: n rows of 1, then n of 2 */
};

static float *dev_zero(size_t floats)
{
	float *d = dev_alloc(floats * 4);
	cr_assert_eq(wk_cuda_zero(d, floats * 4, err, sizeof err), WK_OK, "%s", err);
	return d;
}

static void ch_alloc(struct ch_out *b, const float *h0, int n) /* h0: host memory */
{
	b->h = to_dev(h0, (size_t)n * CH_D * 4);
	b->xb = dev_zero((size_t)n * CH_D);
	b->qc = dev_zero((size_t)n * CH_Q);
	b->kv = dev_zero((size_t)n * CH_K);
	b->iw = dev_zero((size_t)n * CH_I);
	b->qb = dev_zero((size_t)n * CH_B);
	b->iq = dev_zero((size_t)n * CH_IQ);
	b->o = dev_zero((size_t)n * CH_D);
	b->xb2 = dev_zero((size_t)n * CH_D);
	b->r = dev_zero((size_t)n * CH_R);
	b->c16 = (uint16_t *)dev_zero((size_t)n * (CH_Q + CH_K) / 2);
	b->f8 = (uint8_t *)dev_zero((size_t)n * (CH_Q + CH_D) / 4);
	b->f8s = dev_zero((size_t)n * 3);
}

static void ch_free(struct ch_out *b)
{
	float **p[] = {&b->h, &b->xb, &b->qc, &b->kv, &b->iw, &b->qb, &b->iq, &b->o, &b->xb2, &b->r};
	for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
		wk_cuda_free(*p[i]);
	wk_cuda_free(b->c16);
	wk_cuda_free(b->f8);
	wk_cuda_free(b->f8s);
}

/* GLM-5's two chains of a decode step, at small sizes: (1) the residual add and norm, the
 * projections of x (two FP8 weights, one with a rotated slice, and a BF16 one), the norms of
 * two of them (an rmsnorm in place, a layernorm with a bias, rotated), their rows rounded
 * into a bf16 cache and q_c's and x's quantized into FP8 ones (rows of 96 and of 256: a
 * cast link, reading what the norms just wrote), the projections of the
 * normalised q_c (FP8 and BF16, both rotated); (2) o_proj (F32), the residual add and norm,
 * the router (F32). Run as two chained launches on one set of counters, and op by op: every
 * output equal bit for bit, over 1, 2, 3, 5 and 9 tokens (each token pass of the GEMV), and
 * the counters left zero. */
Test(cuda_kernels, chain_matches_the_ops_one_by_one)
{
	NEED_GPU();
	static const int ns[] = {1, 2, 3, 5, 9};
	int pos_h[9] = {0, 3, 7, 100, 4095, 1, 2, 31, 65000};
	int *dpos = to_dev(pos_h, sizeof pos_h);
	float *s_qa, *s_kv, *s_iw, *s_qb, *s_iq, *s_o, *s_rt;
	void *w_qa = dev_weight(DT_F8_E4M3, CH_Q, CH_D, &s_qa);
	void *w_kv = dev_weight(DT_F8_E4M3, CH_K, CH_D, &s_kv);
	void *w_iw = dev_weight(DT_BF16, CH_I, CH_D, &s_iw);
	void *w_qb = dev_weight(DT_F8_E4M3, CH_B, CH_Q, &s_qb);
	void *w_iq = dev_weight(DT_BF16, CH_IQ, CH_Q, &s_iq);
	void *w_o = dev_weight(DT_F32, CH_D, CH_B, &s_o);
	void *w_rt = dev_weight(DT_F32, CH_R, CH_D, &s_rt);
	float *hv[4];
	for (int i = 0; i < 4; i++)
		hv[i] = rnd_vec(CH_D);
	float *nw = to_dev(hv[0], CH_D * 4), *nw2 = to_dev(hv[1], CH_D * 4);
	float *qn = to_dev(hv[2], CH_Q * 4), *kn = to_dev(hv[3], CH_K * 4),
	      *kb = to_dev(hv[3] + CH_K, CH_K * 4);
	unsigned zeros[WK_CHAIN_SYNC] = {0}, left[WK_CHAIN_SYNC];
	unsigned *sync = to_dev(zeros, sizeof zeros);
	for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
		int n = ns[ni];
		float *h0 = rnd_vec((size_t)n * CH_D), *d = rnd_vec((size_t)n * CH_D);
		float *dd = to_dev(d, (size_t)n * CH_D * 4);
		struct ch_out a, b; /* chained, op by op */
		ch_alloc(&a, h0, n);
		ch_alloc(&b, h0, n);
		for (int pass = 0; pass < 2; pass++) {
			struct ch_out *o = pass ? &b : &a;
			struct wk_mm x3[3] = {
				{.y = o->qc, .w = w_qa, .scale = s_qa, .dtype = DT_F8_E4M3, .rows = CH_Q},
				{.y = o->kv, .w = w_kv, .scale = s_kv, .dtype = DT_F8_E4M3, .rows = CH_K,
				 .rope_pos = dpos, .rope_heads = 1, .rope_hd = CH_K, .rope_off = 32,
				 .rope_dim = 32, .rope_theta = 10000.0f},
				{.y = o->iw, .w = w_iw, .dtype = DT_BF16, .rows = CH_I}};
			struct wk_norm nm[2] = {
				{.y = o->qc, .x = o->qc, .w = qn, .n = n, .dim = CH_Q,
				 .eps = 1e-6f},
				{.y = o->kv, .x = o->kv, .w = kn, .b = kb, .rope_pos = dpos, .n = n,
				 .dim = CH_K, .eps = 1e-6f, .rope_theta = 10000.0f, .rope_dim = 32,
				 .layer = true}};
			struct wk_mm q2[2] = {
				{.y = o->qb, .w = w_qb, .scale = s_qb, .dtype = DT_F8_E4M3, .rows = CH_B,
				 .rope_pos = dpos, .rope_heads = 2, .rope_hd = 48, .rope_off = 16,
				 .rope_dim = 32, .rope_theta = 10000.0f},
				{.y = o->iq, .w = w_iq, .dtype = DT_BF16, .rows = CH_IQ, .rope_pos = dpos,
				 .rope_heads = 2, .rope_hd = 32, .rope_off = 0, .rope_dim = 32,
				 .rope_theta = 10000.0f}};
			struct wk_cast cc[4] = {
				{o->c16, o->qc, (size_t)n * CH_Q, DT_BF16, DT_F32, NULL, NULL, 0},
				{o->c16 + (size_t)n * CH_Q, o->kv, (size_t)n * CH_K, DT_BF16,
				 DT_F32, NULL, NULL, 0},
				{o->f8, o->qc, (size_t)n * CH_Q, DT_F8_E4M3, DT_F32, o->f8s, NULL,
				 CH_Q},
				{o->f8 + (size_t)n * CH_Q, o->xb, (size_t)n * CH_D, DT_F8_E4M3,
				 DT_F32, o->f8s + n, NULL, CH_D}};
			struct wk_mm om = {.y = o->o, .w = w_o, .dtype = DT_F32, .rows = CH_D};
			struct wk_mm rm = {.y = o->r, .w = w_rt, .dtype = DT_F32, .rows = CH_R};
			if (pass == 0) {
				static struct wk_link l[5], m[3]; /* large: not on the stack */
				memset(l, 0, sizeof l);
				memset(m, 0, sizeof m);
				l[0] = (struct wk_link){.kind = WK_LINK_ADD_RMSNORM, .n = n, .ax = o->h,
							.ay = o->xb, .d = dd, .w = nw, .dim = CH_D,
							.eps = 1e-5f};
				l[1].kind = WK_LINK_MATMUL;
				l[1].n = n;
				memcpy(l[1].mm, x3, sizeof x3);
				l[1].mm_count = 3;
				l[1].cols = CH_D;
				l[1].x = o->xb;
				l[2].kind = WK_LINK_NORM;
				memcpy(l[2].norm, nm, sizeof nm);
				l[2].norm_count = 2;
				l[3].kind = WK_LINK_CAST;
				memcpy(l[3].cast, cc, sizeof cc);
				l[3].cast_count = 4;
				l[4] = l[1];
				memcpy(l[4].mm, q2, sizeof q2);
				l[4].mm_count = 2;
				l[4].cols = CH_Q;
				l[4].x = o->qc;
				m[0] = (struct wk_link){.kind = WK_LINK_MATMUL, .n = n, .mm = {om},
							.mm_count = 1, .cols = CH_B, .x = o->qb};
				m[1] = (struct wk_link){.kind = WK_LINK_ADD_RMSNORM, .n = n, .ax = o->h,
							.ay = o->xb2, .d = o->o, .w = nw2, .dim = CH_D,
							.eps = 1e-5f};
				m[2] = (struct wk_link){.kind = WK_LINK_MATMUL, .n = n, .mm = {rm},
							.mm_count = 1, .cols = CH_D, .x = o->xb2};
				cr_assert_eq(wk_cuda_chain(l, 5, sync, err, sizeof err), WK_OK,
					     "%s", err);
				cr_assert_eq(wk_cuda_chain(m, 3, sync, err, sizeof err), WK_OK, "%s", err);
			} else {
				cr_assert_eq(wk_cuda_add_rmsnorm(o->h, dd, o->xb, nw, n, CH_D, 1e-5f, err,
								 sizeof err), WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_matmul_n(x3, 3, o->xb, n, CH_D, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_norm_n(nm, 2, err, sizeof err), WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_cast_n(cc, 4, err, sizeof err), WK_OK, "%s",
					     err);
				cr_assert_eq(wk_cuda_matmul_n(q2, 2, o->qc, n, CH_Q, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_matmul_n(&om, 1, o->qb, n, CH_B, err, sizeof err),
					     WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_add_rmsnorm(o->h, o->o, o->xb2, nw2, n, CH_D, 1e-5f,
								 err, sizeof err), WK_OK, "%s", err);
				cr_assert_eq(wk_cuda_matmul_n(&rm, 1, o->xb2, n, CH_D, err, sizeof err),
					     WK_OK, "%s", err);
			}
		}
		const char *names[] = {"h", "xb", "q_c", "kv", "iw", "q_b", "iq", "o", "xb2", "router"};
		float *pa[] = {a.h, a.xb, a.qc, a.kv, a.iw, a.qb, a.iq, a.o, a.xb2, a.r};
		float *pb[] = {b.h, b.xb, b.qc, b.kv, b.iw, b.qb, b.iq, b.o, b.xb2, b.r};
		int width[] = {CH_D, CH_D, CH_Q, CH_K, CH_I, CH_B, CH_IQ, CH_D, CH_D, CH_R};
		for (int i = 0; i < 10; i++) {
			size_t bytes = (size_t)n * width[i] * 4;
			float *ga = malloc(bytes), *gb = malloc(bytes);
			from_dev(ga, pa[i], bytes);
			from_dev(gb, pb[i], bytes);
			cr_expect_eq(memcmp(ga, gb, bytes), 0, "n %d: %s chained differs from op by op",
				     n, names[i]);
			for (size_t j = 0; j < bytes / 4; j++)
				cr_assert(isfinite(ga[j]), "n %d: %s[%zu] = %g", n, names[i], j, ga[j]);
			free(ga);
			free(gb);
		}
		size_t cb = (size_t)n * (CH_Q + CH_K) * 2;
		uint16_t *ca = malloc(cb), *cbb = malloc(cb), *cw = malloc(cb);
		float *rows = malloc((size_t)n * (CH_Q + CH_K) * 4);
		from_dev(ca, a.c16, cb);
		from_dev(cbb, b.c16, cb);
		cr_expect_eq(memcmp(ca, cbb, cb), 0, "n %d: the bf16 cache chained differs from op "
			     "by op", n);
		from_dev(rows, a.qc, (size_t)n * CH_Q * 4); /* what the cast link read */
		from_dev(rows + (size_t)n * CH_Q, a.kv, (size_t)n * CH_K * 4);
		cpu_ref_cast(cw, DT_BF16, rows, DT_F32, (size_t)n * (CH_Q + CH_K), NULL, NULL, 0);
		cr_expect_eq(memcmp(ca, cw, cb), 0, "n %d: the cast link's bf16 rows are not the "
			     "normalised rows rounded", n);
		/* the FP8 caches: codes then scales, chained, op by op, and the reference's */
		size_t fb = (size_t)n * (CH_Q + CH_D) + (size_t)n * 3 * 4;
		uint8_t *fa = malloc(fb), *fo = malloc(fb), *fw = malloc(fb);
		float *fx = malloc((size_t)n * CH_D * 4);
		cr_assert(fa && fo && fw && fx);
		size_t nc = (size_t)n * (CH_Q + CH_D);
		from_dev(fa, a.f8, nc);
		from_dev(fa + nc, a.f8s, (size_t)n * 3 * 4);
		from_dev(fo, b.f8, nc);
		from_dev(fo + nc, b.f8s, (size_t)n * 3 * 4);
		from_dev(fx, a.xb, (size_t)n * CH_D * 4);
		float *fws = malloc((size_t)n * 3 * 4);
		cr_assert_not_null(fws);
		cpu_ref_cast(fw, DT_F8_E4M3, rows, DT_F32, (size_t)n * CH_Q, fws, NULL, CH_Q);
		cpu_ref_cast(fw + (size_t)n * CH_Q, DT_F8_E4M3, fx, DT_F32, (size_t)n * CH_D,
			     fws + n, NULL, CH_D);
		memcpy(fw + nc, fws, (size_t)n * 3 * 4);
		cr_expect_eq(memcmp(fa, fo, fb), 0, "n %d: the FP8 caches chained differ from op by "
			     "op", n);
		cr_expect_eq(memcmp(fa, fw, fb), 0, "n %d: the cast link's FP8 rows are not "
			     "cpu_ref_cast's", n);
		free(fa);
		free(fo);
		free(fw);
		free(fx);
		free(fws);
		free(ca);
		free(cbb);
		free(cw);
		free(rows);
		from_dev(left, sync, sizeof left);
		cr_expect_eq(memcmp(left, zeros, sizeof zeros), 0, "n %d: counters left non-zero", n);
		ch_free(&a);
		ch_free(&b);
		wk_cuda_free(dd);
		free(h0);
		free(d);
	}
	/* refused: the matmuls' token passes differ, too many links, no counters */
	static struct wk_link bad[WK_CHAIN_MAX + 1];
	memset(bad, 0, sizeof bad);
	for (int i = 0; i < WK_CHAIN_MAX + 1; i++)
		bad[i] = (struct wk_link){.kind = WK_LINK_MATMUL, .n = i ? 1 : 9, .mm_count = 1,
					  .cols = CH_D, .x = nw,
					  .mm = {{.y = nw2, .w = w_rt, .dtype = DT_F32, .rows = 1}}};
	cr_expect_eq(wk_cuda_chain(bad, 2, sync, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "pass"), "%s", err);
	cr_expect_eq(wk_cuda_chain(bad + 1, WK_CHAIN_MAX + 1 - 1, NULL, err, sizeof err), WK_EINVAL);
	cr_expect_eq(wk_cuda_chain(bad, WK_CHAIN_MAX + 1, sync, err, sizeof err), WK_EINVAL);
	bad[1] = (struct wk_link){.kind = WK_LINK_CAST, .cast = {{nw2, nw, 1, DT_F16, DT_F32}},
				  .cast_count = 1};
	cr_expect_eq(wk_cuda_chain(bad, 2, sync, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "cast_n"), "%s", err);
	void *ws[] = {w_qa, w_kv, w_iw, w_qb, w_iq, w_o, w_rt, s_qa, s_kv, s_iw, s_qb, s_iq, s_o,
		      s_rt, nw, nw2, qn, kn, kb, sync, dpos};
	for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
		wk_cuda_free(ws[i]);
	for (int i = 0; i < 4; i++)
		free(hv[i]);
}

/* GLM-5's second chain ending in the grouped MoE op: the residual add and norm, the router's
 * matmul and moe_route_experts (16 of 32 experts local, top 8 in 4 groups, a shared expert,
 * FP8), as one chained launch and op by op: h, x, the logits, idx, wt and y equal bit for
 * bit over 1, 3 and 9 tokens, every counter left zero. A MoE op of 64 tokens (the grouped
 * GEMMs) is not a chain's link, and refused as one. */
Test(cuda_kernels, chain_with_moe_matches_the_ops_one_by_one)
{
	NEED_GPU();
	enum { D = 256, INTER = 144, NE = 32, TOPK = 8, NL = 16, EX0 = 4 };
	static const int ns[] = {1, 3, 9};
	struct moe_set m, sh;
	moe_set_make(&m, DT_F8_E4M3, NL, D, INTER);
	moe_set_make(&sh, DT_F8_E4M3, 1, D, 2 * INTER);
	struct wk_moe mo = moe_of(&m, DT_F8_E4M3, EX0, D, INTER);
	mo.shared = &sh.dev[0];
	mo.shared_wdt = DT_F8_E4M3;
	mo.shared_inter = 2 * INTER;
	float *s_rt, *hb = rnd_vec(NE), *hn = rnd_vec(D);
	for (int e = 0; e < NE; e++)
		hb[e] = fabsf(hb[e]) * 0.1f;
	void *w_rt = dev_weight(DT_F32, NE, D, &s_rt);
	float *bias = to_dev(hb, NE * 4), *nw = to_dev(hn, D * 4);
	unsigned zeros[WK_CHAIN_SYNC] = {0}, left[WK_CHAIN_SYNC], lc[2];
	unsigned *sync = to_dev(zeros, sizeof zeros), *cnt = to_dev(zeros, 2 * sizeof(unsigned));
	for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
		int n = ns[ni];
		size_t nd = (size_t)n * D, nk = (size_t)n * TOPK;
		float *h0 = rnd_vec(nd), *d = rnd_vec(nd), *y0 = rnd_vec(nd);
		float *dd = to_dev(d, nd * 4);
		size_t scr = wk_cuda_moe_experts_scratch(n, TOPK, &mo);
		struct {
			float *h, *x, *lg, *wt, *y;
			int *idx;
			void *scr;
		} o[2];
		for (int k = 0; k < 2; k++) {
			o[k].h = to_dev(h0, nd * 4);
			o[k].y = to_dev(y0, nd * 4);
			o[k].x = dev_zero(nd);
			o[k].lg = dev_zero((size_t)n * NE);
			o[k].wt = dev_zero(nk);
			o[k].idx = dev_alloc(nk * 4);
			o[k].scr = dev_alloc(scr);
		}
		struct wk_mm rt[2] = {{.y = o[0].lg, .w = w_rt, .dtype = DT_F32, .rows = NE},
				      {.y = o[1].lg, .w = w_rt, .dtype = DT_F32, .rows = NE}};
		static struct wk_link l[3];
		memset(l, 0, sizeof l);
		l[0] = (struct wk_link){.kind = WK_LINK_ADD_RMSNORM, .n = n, .ax = o[0].h,
					.ay = o[0].x, .d = dd, .w = nw, .dim = D, .eps = 1e-5f};
		l[1] = (struct wk_link){.kind = WK_LINK_MATMUL, .n = n, .mm = {rt[0]}, .mm_count = 1,
					.cols = D, .x = o[0].x};
		l[2] = (struct wk_link){.kind = WK_LINK_MOE, .n = n, .moe_y = o[0].y, .wt = o[0].wt,
					.moe_x = o[0].x, .logits = o[0].lg, .bias = bias,
					.n_experts = NE, .n_group = 4, .topk_group = 2, .top_k = TOPK,
					.norm_w = true, .scale = 2.5f, .idx = o[0].idx, .moe = mo,
					.scratch = o[0].scr, .count = cnt};
		cr_assert(wk_cuda_chain_moe(n, &mo));
		cr_assert_eq(wk_cuda_chain(l, 3, sync, err, sizeof err), WK_OK, "%s", err);
		cr_assert_eq(wk_cuda_add_rmsnorm(o[1].h, dd, o[1].x, nw, n, D, 1e-5f, err, sizeof err),
			     WK_OK, "%s", err);
		cr_assert_eq(wk_cuda_matmul_n(&rt[1], 1, o[1].x, n, D, err, sizeof err), WK_OK, "%s",
			     err);
		cr_assert_eq(wk_cuda_moe_route_experts(o[1].y, o[1].x, o[1].lg, bias, NE, 4, 2, true,
						       2.5f, o[1].idx, o[1].wt, n, TOPK, &mo,
						       o[1].scr, cnt + 1, err, sizeof err),
			     WK_OK, "%s", err);
		const char *names[] = {"h", "x", "logits", "wt", "y", "idx"};
		size_t bytes[] = {nd * 4, nd * 4, (size_t)n * NE * 4, nk * 4, nd * 4, nk * 4};
		void *pa[] = {o[0].h, o[0].x, o[0].lg, o[0].wt, o[0].y, o[0].idx};
		void *pb[] = {o[1].h, o[1].x, o[1].lg, o[1].wt, o[1].y, o[1].idx};
		for (int i = 0; i < 6; i++) {
			char *ga = malloc(bytes[i]), *gb = malloc(bytes[i]);
			from_dev(ga, pa[i], bytes[i]);
			from_dev(gb, pb[i], bytes[i]);
			cr_expect_eq(memcmp(ga, gb, bytes[i]), 0, "n %d: %s chained differs from op by "
				     "op", n, names[i]);
			if (i == 4)
				cr_expect_neq(memcmp(ga, y0, bytes[i]), 0, "n %d: y unchanged", n);
			free(ga);
			free(gb);
		}
		from_dev(left, sync, sizeof left);
		from_dev(lc, cnt, sizeof lc);
		cr_expect_eq(memcmp(left, zeros, sizeof zeros), 0, "n %d: chain counters left", n);
		cr_expect(lc[0] == 0 && lc[1] == 0, "n %d: router counters left %u %u", n, lc[0],
			  lc[1]);
		for (int k = 0; k < 2; k++) {
			void *f[] = {o[k].h, o[k].x, o[k].lg, o[k].wt, o[k].y, o[k].idx, o[k].scr};
			for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
				wk_cuda_free(f[i]);
		}
		wk_cuda_free(dd);
		free(h0);
		free(d);
		free(y0);
	}
	cr_expect(!wk_cuda_chain_moe(64, &mo), "64 FP8 tokens take the grouped GEMMs");
	static struct wk_link big;
	memset(&big, 0, sizeof big);
	big = (struct wk_link){.kind = WK_LINK_MOE, .n = 64, .n_experts = NE, .n_group = 4,
			       .topk_group = 2, .top_k = TOPK, .moe = mo, .scratch = nw,
			       .count = cnt};
	cr_expect_eq(wk_cuda_chain(&big, 1, sync, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "grouped GEMMs"), "%s", err);
	moe_set_free(&m);
	moe_set_free(&sh);
	void *f[] = {w_rt, bias, nw, sync, cnt};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
		wk_cuda_free(f[i]);
	free(hb);
	free(hn);
}
