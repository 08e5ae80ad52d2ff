/*
 * lab_attention.cu - the kernel lab's attention tables (run by lab.cu's wk_cuda_lab, after
 * the GEMVs and the GEMMs). Decode: GQA at GLM-4.5's shape and GLM-5's MLA, each over a long
 * context, as GB/s of the cache they read beside the device copy. Prefill: the query tiles
 * (k_att_tiled) against the per-token kernel on 2,048 tokens, GQA and MLA's expanded form, as
 * TFLOPS and their ratio. Each checked first against kernels/cpu's reference on the
 * downloaded inputs. Linked into build/tools/cuda_lab only.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "kernels/cuda/cuda_kernels.h"
}
#include "kernels/cuda/cuda_int.cuh"
#include "kernels/cuda/lab.cuh"

/* GQA attention decoding one token at GLM-4.5's shape on one GPU (96 query heads over 8 kv
 * heads of 128) after ATT_CTX positions, over a bf16 and an FP8 cache, with its keys split
 * over blocks (the backend's way: 16 blocks of (kv head, 8 query heads) cannot fill the
 * device) and whole: GB/s of the cache read (keys, values and FP8's scales) against the
 * copy. Checked first: the query heads of the first and the last kv head against
 * cpu_ref_attention on the downloaded cache (1e-4 of the largest output). WK_OK or WK_EIO. */
#define ATT_CTX 32768
#define ATT_HEADS 96
#define ATT_KV 8
#define ATT_HD 128
#define ATT_CALLS 20
int lab_attention(double ceil_gbs)
{
	char err[WK_ERRSZ] = "";
	size_t len = ATT_CTX, nq = (size_t)ATT_HEADS * ATT_HD, ne = len * ATT_KV * ATT_HD;
	struct cpu_gqa shape = {NULL, NULL, NULL, NULL, DT_BF16, ATT_HEADS, ATT_KV, ATT_HD,
				ATT_KV * ATT_HD, 1.0f / sqrtf((float)ATT_HD), NULL, NULL, 0, 0};
	size_t nrow = len * ATT_KV, pf = wk_cuda_attention_part(&shape, 1, ATT_CTX - 1);
	void *k = NULL, *v = NULL;
	float *ks = NULL, *vs = NULL, *q = NULL, *o = NULL, *part = NULL;
	unsigned *count = NULL;
	float *hq = (float *)malloc(nq * 4), *got = (float *)malloc(nq * 4);
	float *want = (float *)malloc(nq * 4), *hks = (float *)malloc(nrow * 4);
	float *hvs = (float *)malloc(nrow * 4);
	unsigned char *hk = (unsigned char *)malloc(ne * 2), *hv = (unsigned char *)malloc(ne * 2);
	int failed = 0;
	float scale = 1.0f / sqrtf((float)ATT_HD);
	printf("\n%-40s %10s %10s   (%d positions, %d:%d heads of %d)\n",
	       "kernel (decode attention, GQA)", "GB/s", "of copy", ATT_CTX, ATT_HEADS, ATT_KV,
	       ATT_HD);
	if (!hq || !got || !want || !hks || !hvs || !hk || !hv ||
	    wk_cuda_alloc(&k, ne * 2, err, sizeof err) || wk_cuda_alloc(&v, ne * 2, err, sizeof err) ||
	    wk_cuda_alloc((void **)&ks, nrow * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&vs, nrow * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&o, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&part, (pf ? pf : 1) * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&count, 4096 * 4, err, sizeof err) ||
	    cudaMemset(count, 0, 4096 * 4) != cudaSuccess || fill_random(k, ne * 2, false, -1, 1) ||
	    fill_random(v, ne * 2, false, -1, 1) || fill_random(ks, nrow * 4, true, 0.5f, 1.5f) ||
	    fill_random(vs, nrow * 4, true, 0.5f, 1.5f) || fill_random(q, nq * 4, true, -1, 1) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err) ||
	    wk_cuda_download(hk, k, ne * 2, err, sizeof err) ||
	    wk_cuda_download(hv, v, ne * 2, err, sizeof err) ||
	    wk_cuda_download(hks, ks, nrow * 4, err, sizeof err) ||
	    wk_cuda_download(hvs, vs, nrow * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "attention", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	for (int f8 = 0; f8 < 2; f8++) {
		enum dt_type kv = f8 ? DT_F8_E4M3 : DT_BF16;
		const float *dks = f8 ? ks : NULL, *dvs = f8 ? vs : NULL;
		struct wk_att_split sp = {part, pf, count, 4096};
		const int grp = ATT_HEADS / ATT_KV, gw = grp * ATT_HD; /* a kv head's queries */
		size_t es = f8 ? 1 : 2, lo = (size_t)(ATT_KV - 1) * ATT_HD; /* the last kv head */
		/* on the host: the first and the last kv head's query heads, as one kv head each */
		struct cpu_gqa h0 = {hk, hv, hks, hvs, kv, grp, 1, ATT_HD, ATT_KV * ATT_HD, scale,
				     NULL, NULL, 0, 0};
		struct cpu_gqa h1 = {hk + lo * es, hv + lo * es, hks + ATT_KV - 1, hvs + ATT_KV - 1,
				     kv, grp, 1, ATT_HD, ATT_KV * ATT_HD, scale, NULL, NULL, 0, 0};
		struct cpu_gqa d = {k, v, dks, dvs, kv, ATT_HEADS, ATT_KV, ATT_HD, ATT_KV * ATT_HD,
				    scale, NULL, NULL, 0, 0};
		cpu_ref_attention(want, hq, &h0, 1, ATT_CTX - 1);
		cpu_ref_attention(want + gw, hq + (size_t)(ATT_HEADS - grp) * ATT_HD, &h1, 1,
				  ATT_CTX - 1);
		for (int whole = 0; whole < 2; whole++) {
			char name[64];
			snprintf(name, sizeof name, "%s cache, %s", f8 ? "fp8" : "bf16",
				 whole ? "whole (16 blocks)" : "split");
			const struct wk_att_split *s = whole ? NULL : &sp;
			double worst = INFINITY;
			if (wk_cuda_attention(o, q, &d, 1, ATT_CTX - 1, s, err, sizeof err) ==
				    WK_OK &&
			    wk_cuda_sync(err, sizeof err) == WK_OK &&
			    wk_cuda_download(got, o, nq * 4, err, sizeof err) == WK_OK)
				worst = fmax(lab_rel(got, want, 1, (int)nq, 0, gw),
					     lab_rel(got, want + gw, 1, (int)nq, (int)nq - gw, gw));
			float ms = time_ms([&]() -> int {
				for (int c = 0; c < ATT_CALLS; c++) {
					int r = wk_cuda_attention(o, q, &d, 1, ATT_CTX - 1, s, err,
								  sizeof err);
					if (r != WK_OK)
						return r;
				}
				return WK_OK;
			});
			bool ok = worst <= 1e-4;
			failed |= !ok || ms <= 0;
			if (ms <= 0) {
				printf("%-40s %10s   (%s)\n", name, "FAILED", err);
				continue;
			}
			double bytes = (double)ne * 2 * (f8 ? 1 : 2) + (f8 ? 2.0 * nrow * 4 : 0);
			double gbs = bytes * ATT_CALLS / (ms * 1e-3) / 1e9;
			printf("%-40s %10.0f %9.0f%%   %.1f us a call; %s %.1e off the CPU\n", name,
			       gbs, 100.0 * gbs / ceil_gbs, 1e3 * ms / ATT_CALLS,
			       ok ? "checked:" : "WRONG:", worst);
		}
	}
out:
	wk_cuda_free(k);
	wk_cuda_free(v);
	wk_cuda_free(ks);
	wk_cuda_free(vs);
	wk_cuda_free(q);
	wk_cuda_free(o);
	wk_cuda_free(part);
	wk_cuda_free(count);
	free(hq);
	free(got);
	free(want);
	free(hks);
	free(hvs);
	free(hk);
	free(hv);
	return failed ? WK_EIO : WK_OK;
}

/* One row of a table of paths (the prefill tables, the DSA decode table): forces path
 * (force: wk_cuda_attention_force, or wk_cuda_dsa_force for the indexer's tables), runs run()
 * (one call into o, no floats: WK_OK, or an error in err) once, downloads o into dst (path
 * 1's: base; the others': got) and takes its worst error: ref(dst) against the CPU reference
 * and, past path 1, got against base on every output (INFINITY when it could not); then times
 * run()
 * and prints name's TFLOPS (flops a call) and its speed-up on *ms1 (path 1 sets it), and
 * with bytes (read a call) its GB/s against ceil_gbs (the device copy). Returns 0, or 1 for a
 * failed or wrong row. */
template <typename R, typename C>
static int lab_path_row(const char *name, void (*force)(int), int path, double flops, R run,
			C ref, const float *o, size_t no, float *base, float *got, double *ms1,
			char *err, double bytes = 0, double ceil_gbs = 0)
{
	float *dst = path == 1 ? base : got;
	force(path);
	double worst = INFINITY;
	if (run() == WK_OK && wk_cuda_sync(err, WK_ERRSZ) == WK_OK &&
	    wk_cuda_download(dst, o, no * 4, err, WK_ERRSZ) == WK_OK) {
		worst = ref(dst);
		if (path != 1)
			worst = fmax(worst, lab_rel(got, base, 1, 0, 0, (int)no));
	}
	float ms = time_ms(run);
	force(0);
	bool ok = worst <= 1e-4;
	if (ms <= 0) {
		printf("%-40s %10s   (%s)\n", name, "FAILED", err);
		return 1;
	}
	if (path == 1)
		*ms1 = ms;
	printf("%-40s %10.1f %9.2fx   %.3f ms a call; %s %.1e off", name,
	       flops / (ms * 1e-3) / 1e12, *ms1 / ms, ms, ok ? "checked:" : "WRONG:", worst);
	if (bytes > 0)
		printf("; %.0f GB/s, %.0f%% of the copy", bytes / (ms * 1e-3) / 1e9,
		       100.0 * bytes / (ms * 1e-3) / 1e9 / ceil_gbs);
	printf("\n");
	return !ok;
}

/* GQA attention over a prefill at GLM-4.5's shape on one GPU (96 query heads over 8 kv heads
 * of 128), AP_N tokens from position 0 over a bf16 cache (the default for bf16 checkpoints),
 * by each of wk_cuda_attention's kernels (wk_cuda_attention_path): a block a token (its keys
 * read again for every token) and query tiles (64 rows a block, each key and value read once
 * for them) on the f32 pipes and on the tensor cores: TFLOPS of the causal attention's
 * multiply-adds (2 x 2 x head_dim a query and a key it sees) and each one's speed-up on the
 * first. Checked first: the tiles against the per-token kernel on every output (1e-4 of the
 * largest), and the first kv head's heads over the first 64 tokens against
 * cpu_ref_attention. WK_OK or WK_EIO. */
#define AP_N 2048
int lab_attention_prefill(void)
{
	char err[WK_ERRSZ] = "";
	size_t nq = (size_t)AP_N * ATT_HEADS * ATT_HD, ne = (size_t)AP_N * ATT_KV * ATT_HD;
	const int grp = ATT_HEADS / ATT_KV, gw = grp * ATT_HD, nc = 64;
	float scale = 1.0f / sqrtf((float)ATT_HD);
	void *k = NULL, *v = NULL;
	float *q = NULL, *o = NULL;
	float *hq = (float *)malloc(nq * 4), *got = (float *)malloc(nq * 4);
	float *base = (float *)malloc(nq * 4), *want = (float *)malloc((size_t)nc * gw * 4);
	unsigned char *hk = (unsigned char *)malloc(ne * 2), *hv = (unsigned char *)malloc(ne * 2);
	int failed = 0;
	double ms1 = 0;
	printf("\n%-40s %10s %10s   (%d tokens from 0, %d:%d heads of %d, bf16 cache)\n",
	       "kernel (prefill attention, GQA)", "TFLOPS", "vs token", AP_N, ATT_HEADS, ATT_KV,
	       ATT_HD);
	if (!hq || !got || !base || !want || !hk || !hv ||
	    wk_cuda_alloc(&k, ne * 2, err, sizeof err) || wk_cuda_alloc(&v, ne * 2, err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&o, nq * 4, err, sizeof err) ||
	    fill_random(k, ne * 2, false, -1, 1) || fill_random(v, ne * 2, false, -1, 1) ||
	    fill_random(q, nq * 4, true, -1, 1) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err) ||
	    wk_cuda_download(hk, k, ne * 2, err, sizeof err) ||
	    wk_cuda_download(hv, v, ne * 2, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "prefill attention", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	{
		struct cpu_gqa h0 = {hk, hv, NULL, NULL, DT_BF16, grp, 1, ATT_HD, ATT_KV * ATT_HD,
				     scale, NULL, NULL, 0, 0};
		struct cpu_gqa d = {k, v, NULL, NULL, DT_BF16, ATT_HEADS, ATT_KV, ATT_HD,
				    ATT_KV * ATT_HD, scale, NULL, NULL, 0, 0};
		/* the first kv head's query heads of the first nc tokens, on the host */
		float *q0 = (float *)malloc((size_t)nc * gw * 4);
		if (!q0) {
			failed = 1;
			goto out;
		}
		for (int t = 0; t < nc; t++)
			memcpy(q0 + (size_t)t * gw, hq + (size_t)t * ATT_HEADS * ATT_HD, (size_t)gw * 4);
		cpu_ref_attention(want, q0, &h0, nc, 0);
		free(q0);
		double flops = 4.0 * ATT_HD * ATT_HEADS * ((double)AP_N * (AP_N + 1) / 2);
		for (int path = 1; path <= 3; path++) {
			const char *name = path == 1   ? "a block a token"
					   : path == 2 ? "query tiles, f32"
						       : "query tiles, tensor cores";
			failed |= lab_path_row(
				name, wk_cuda_attention_force, path, flops,
				[&]() -> int {
					return wk_cuda_attention(o, q, &d, AP_N, 0, NULL, err,
								 sizeof err);
				},
				[&](const float *dst) -> double {
					return lab_rel(dst, want, nc, ATT_HEADS * ATT_HD, 0, gw);
				},
				o, nq, base, got, &ms1, err);
		}
	}
out:
	wk_cuda_free(k);
	wk_cuda_free(v);
	wk_cuda_free(q);
	wk_cuda_free(o);
	free(hq);
	free(got);
	free(base);
	free(want);
	free(hk);
	free(hv);
	return failed ? WK_EIO : WK_OK;
}

/* MLA's expanded form over a dense prefill at GLM-5's shape on one tensor-parallel rank of 8
 * (8 heads, keys nope 192 + rope 64, values 256, f32 rows as engine/glm5.c expands them),
 * AP_N tokens from 0, by each kernel of wk_cuda_mla_attention (wk_cuda_mla_tiles): a block a
 * (token, head) and query tiles (32 rows of a head a block) on the f32 pipes and on the
 * tensor cores: TFLOPS and the speed-ups, as lab_attention_prefill. Checked first: the tiles
 * against the per-token kernel on every output, and the first 64 tokens against
 * cpu_ref_mla_attention. WK_OK or WK_EIO. */
int lab_mla_prefill(void)
{
	char err[WK_ERRSZ] = "";
	const int H = 8, nope = 192, rope = 64, dv = 256, row = H * (nope + dv), nc = 64;
	size_t nkv = (size_t)AP_N * row, npe = (size_t)AP_N * rope;
	size_t nq = (size_t)AP_N * H * (nope + rope), no = (size_t)AP_N * H * dv;
	float *kvx = NULL, *kpe = NULL, *q = NULL, *o = NULL;
	float *hkv = (float *)malloc(nkv * 4), *hpe = (float *)malloc(npe * 4);
	float *hq = (float *)malloc(nq * 4), *got = (float *)malloc(no * 4);
	float *base = (float *)malloc(no * 4), *want = (float *)malloc((size_t)nc * H * dv * 4);
	int failed = 0;
	double ms1 = 0;
	printf("\n%-40s %10s %10s   (%d tokens from 0, %d heads, %d+%d -> %d, f32 rows)\n",
	       "kernel (prefill attention, MLA expanded)", "TFLOPS", "vs token", AP_N, H, nope,
	       rope, dv);
	if (!hkv || !hpe || !hq || !got || !base || !want ||
	    wk_cuda_alloc((void **)&kvx, nkv * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&kpe, npe * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&o, no * 4, err, sizeof err) ||
	    fill_random(kvx, nkv * 4, true, -1, 1) || fill_random(kpe, npe * 4, true, -1, 1) ||
	    fill_random(q, nq * 4, true, -1, 1) ||
	    wk_cuda_download(hkv, kvx, nkv * 4, err, sizeof err) ||
	    wk_cuda_download(hpe, kpe, npe * 4, err, sizeof err) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "prefill attention, MLA", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	{
		struct cpu_mla hs;
		memset(&hs, 0, sizeof hs);
		hs.n_heads = H, hs.d_a = nope, hs.d_b = rope, hs.d_v = dv, hs.kv = DT_F32;
		hs.k_a = hkv, hs.k_b = hpe, hs.v = hkv + nope;
		hs.ka_stride = hs.v_stride = (size_t)row;
		hs.ka_head = hs.v_head = (size_t)(nope + dv);
		hs.kb_stride = (size_t)rope;
		hs.scale = 1.0f / sqrtf((float)(nope + rope));
		struct cpu_mla d = hs;
		d.k_a = kvx, d.k_b = kpe, d.v = kvx + nope;
		cpu_ref_mla_attention(want, hq, &hs, nc, 0, 0, nc, 0, H);
		double flops = 2.0 * H * (nope + rope + dv) * ((double)AP_N * (AP_N + 1) / 2);
		for (int path = 1; path <= 3; path++) {
			const char *name = path == 1   ? "a block a (token, head)"
					   : path == 2 ? "query tiles, f32"
						       : "query tiles, tensor cores";
			failed |= lab_path_row(
				name, wk_cuda_attention_force, path, flops,
				[&]() -> int {
					return wk_cuda_mla_attention(o, q, &d, AP_N, 0, 0, AP_N, 0, H,
								     NULL, err, sizeof err);
				},
				[&](const float *dst) -> double {
					return lab_rel(dst, want, 1, 0, 0, nc * H * dv);
				},
				o, no, base, got, &ms1, err);
		}
	}
out:
	wk_cuda_free(kvx);
	wk_cuda_free(kpe);
	wk_cuda_free(q);
	wk_cuda_free(o);
	free(hkv);
	free(hpe);
	free(hq);
	free(got);
	free(base);
	free(want);
	return failed ? WK_EIO : WK_OK;
}

/* MLA's absorbed (latent) attention over a sparse prefill at GLM-5's shape on one rank of 8
 * (8 heads, latent rows of 512 + 64 in bf16, the values their first 512): AL_N tokens at
 * positions AL_N .. 2 AL_N - 1, each over its own AL_TOPK positions (random, ascending), by
 * the per-token kernel (wk_cuda_attention_force(1): a block a token's heads, the f32 pipes)
 * and the latent tiles on the tensor cores (3): TFLOPS (2 x 8 x (576 + 512) a key a token)
 * and the speed-up. Checked first: the tiles against the per-token kernel on
 * every output, and the first 16 tokens against cpu_ref_mla_attention. WK_OK or WK_EIO. */
#define AL_N 2048
#define AL_TOPK 2048
int lab_mla_latent(void)
{
	char err[WK_ERRSZ] = "";
	const int H = 8, lora = 512, rope = 64, T = 2 * AL_N, nc = 16;
	size_t nlat = (size_t)T * lora, npe = (size_t)T * rope, nq = (size_t)AL_N * H * (lora + rope);
	size_t no = (size_t)AL_N * H * lora, nsel = (size_t)AL_N * AL_TOPK;
	void *lat = NULL, *pe = NULL;
	float *q = NULL, *o = NULL;
	int *dsel = NULL, *dn = NULL;
	uint16_t *hlat = (uint16_t *)malloc(nlat * 2), *hpe = (uint16_t *)malloc(npe * 2);
	float *hq = (float *)malloc(nq * 4), *got = (float *)malloc(no * 4);
	float *base = (float *)malloc(no * 4), *want = (float *)malloc((size_t)nc * H * lora * 4);
	int *sel = (int *)malloc(nsel * sizeof(int)), *ns = (int *)malloc(AL_N * sizeof(int));
	int failed = 0;
	double ms1 = 0;
	printf("\n%-40s %10s %10s   (%d tokens after %d, %d keys each, %d heads, %d+%d, bf16)\n",
	       "kernel (prefill attention, MLA latent)", "TFLOPS", "vs token", AL_N, AL_N, AL_TOPK,
	       H, lora, rope);
	if (!hlat || !hpe || !hq || !got || !base || !want || !sel || !ns ||
	    wk_cuda_alloc(&lat, nlat * 2, err, sizeof err) ||
	    wk_cuda_alloc(&pe, npe * 2, err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&o, no * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&dsel, nsel * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&dn, AL_N * sizeof(int), err, sizeof err) ||
	    fill_random(lat, nlat * 2, false, -1, 1) || fill_random(pe, npe * 2, false, -1, 1) ||
	    fill_random(q, nq * 4, true, -0.25f, 0.25f) ||
	    wk_cuda_download(hlat, lat, nlat * 2, err, sizeof err) ||
	    wk_cuda_download(hpe, pe, npe * 2, err, sizeof err) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "prefill attention, MLA latent", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	for (int i = 0; i < AL_N; i++) { /* AL_TOPK of its AL_N + i + 1 positions, at random */
		int len = AL_N + i + 1, want_k = AL_TOPK, got_k = 0;
		for (int t = 0; t < len && got_k < want_k; t++)
			if ((int)(lab_next() % (uint32_t)(len - t)) < want_k - got_k)
				sel[(size_t)i * AL_TOPK + got_k++] = t;
		ns[i] = got_k;
	}
	if (wk_cuda_upload(dsel, sel, nsel * sizeof(int), err, sizeof err) ||
	    wk_cuda_upload(dn, ns, AL_N * sizeof(int), err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "prefill attention, MLA latent", "FAILED", err);
		failed = 1;
		goto out;
	}
	{
		struct cpu_mla hs;
		memset(&hs, 0, sizeof hs);
		hs.n_heads = H, hs.d_a = lora, hs.d_b = rope, hs.d_v = lora, hs.kv = DT_BF16;
		hs.k_a = hs.v = hlat, hs.k_b = hpe;
		hs.ka_stride = hs.v_stride = (size_t)lora, hs.kb_stride = (size_t)rope;
		hs.sel = sel, hs.nsel = ns, hs.sel_stride = AL_TOPK;
		hs.scale = 1.0f / sqrtf(192.0f + rope);
		struct cpu_mla d = hs;
		d.k_a = d.v = lat, d.k_b = pe, d.sel = dsel, d.nsel = dn;
		cpu_ref_mla_attention(want, hq, &hs, nc, AL_N, 0, nc, 0, H);
		double flops = 2.0 * H * (lora + rope + lora) * (double)AL_TOPK * AL_N;
		for (int path = 1; path <= 3; path += 2) {
			failed |= lab_path_row(
				path == 1 ? "a block a token's heads" : "latent tiles, tensor cores",
				wk_cuda_attention_force, path, flops,
				[&]() -> int {
					return wk_cuda_mla_attention(o, q, &d, AL_N, AL_N, 0, AL_N, 0,
								     H, NULL, err, sizeof err);
				},
				[&](const float *dst) -> double {
					return lab_rel(dst, want, 1, 0, 0, nc * H * lora);
				},
				o, no, base, got, &ms1, err);
		}
	}
out:
	wk_cuda_free(lat);
	wk_cuda_free(pe);
	wk_cuda_free(q);
	wk_cuda_free(o);
	wk_cuda_free(dsel);
	wk_cuda_free(dn);
	free(hlat);
	free(hpe);
	free(hq);
	free(got);
	free(base);
	free(want);
	free(sel);
	free(ns);
	return failed ? WK_EIO : WK_OK;
}

/* GLM-5's DSA indexer over a prefill (32 heads of 128, index_topk 2,048; the indexer is not
 * sharded, so a rank runs all of it): DS_N tokens at positions DS_N .. 2 DS_N - 1, each
 * scoring every key it has in an FP8 key cache (e4m3 codes, a scale a row) and selecting
 * 2,048. Rows: wk_cuda_dsa_topk on the f32 pipes (path 1: a warp a query and key) and on the
 * tensor cores (path 2: query tiles, each key read once for 4 queries; path 3, the decode
 * kernel: a block a query's 512 keys), the select in each; TFLOPS of the scores' 2 H D a
 * query and key. The scores are checked on the first DS_NC queries against
 * cpu_ref_dsa_score, and the tensor cores' against path 1's on every query. */
#define DS_N 2048
#define DS_NC 16

int lab_dsa_prefill(void)
{
	char err[WK_ERRSZ] = "";
	const int H = 32, D = 128, T = 2 * DS_N, topk = 2048;
	size_t nq = (size_t)DS_N * H * D, nk = (size_t)T * D, nw = (size_t)DS_N * H;
	size_t no = (size_t)DS_N * T; /* the score rows, one group */
	void *k = NULL;
	float *ks = NULL, *q = NULL, *w = NULL, *sc = NULL;
	int *sel = NULL, *ns = NULL;
	unsigned *count = NULL;
	uint8_t *hk = (uint8_t *)malloc(nk);
	float *hks = (float *)malloc((size_t)T * 4), *hq = (float *)malloc(nq * 4);
	float *hw = (float *)malloc(nw * 4), *got = (float *)malloc(no * 4);
	float *base = (float *)malloc(no * 4), *want = (float *)malloc((size_t)DS_NC * T * 4);
	int failed = 0;
	double ms1 = 0;
	printf("\n%-40s %10s %10s   (%d tokens after %d, %d heads of %d, top %d, fp8 keys)\n",
	       "kernel (prefill, DSA indexer)", "TFLOPS", "vs warps", DS_N, DS_N, H, D, topk);
	if (!hk || !hks || !hq || !hw || !got || !base || !want ||
	    wk_cuda_alloc(&k, nk, err, sizeof err) ||
	    wk_cuda_alloc((void **)&ks, (size_t)T * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&w, nw * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&sc, no * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&sel, (size_t)DS_N * topk * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&ns, DS_N * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&count, DS_N * sizeof(unsigned), err, sizeof err) ||
	    wk_cuda_zero(count, DS_N * sizeof(unsigned), err, sizeof err) ||
	    wk_cuda_zero(sc, no * 4, err, sizeof err) || fill_random(k, nk, false, -1, 1) ||
	    fill_random(ks, (size_t)T * 4, true, 0.01f, 0.02f) ||
	    fill_random(q, nq * 4, true, -1, 1) || fill_random(w, nw * 4, true, -1, 1) ||
	    wk_cuda_download(hk, k, nk, err, sizeof err) ||
	    wk_cuda_download(hks, ks, (size_t)T * 4, err, sizeof err) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err) ||
	    wk_cuda_download(hw, w, nw * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "prefill, DSA indexer", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	{
		struct cpu_dsa d;
		memset(&d, 0, sizeof d);
		d.k = k, d.ks = ks, d.kv = DT_F8_E4M3, d.n_heads = H, d.head_dim = D, d.topk = topk;
		d.qk_scale = 1.0f / sqrtf((float)D), d.w_scale = 1.0f / sqrtf((float)H);
		for (int i = 0; i < DS_NC; i++)
			for (int t = 0; t <= DS_N + i; t++)
				want[(size_t)i * T + t] = cpu_ref_dsa_score(
					hq + (size_t)i * H * D, hk + (size_t)t * D, DT_F8_E4M3,
					hks + t, hw + (size_t)i * H, H, D, d.qk_scale, d.w_scale);
		double flops = 2.0 * H * D * ((double)DS_N * DS_N + (double)DS_N * (DS_N + 1) / 2);
		for (int path = 1; path <= 3; path++) {
			failed |= lab_path_row(
				path == 1   ? "a warp a query and key (f32)"
				: path == 2 ? "query tiles, tensor cores"
					    : "a query's keys, tensor cores",
				wk_cuda_dsa_force, path, flops,
				[&]() -> int {
					return wk_cuda_dsa_topk(sel, ns, q, w, &d, DS_N, DS_N, sc, no,
								count, DS_N, NULL, 0, err,
								sizeof err);
				},
				[&](const float *dst) -> double {
					double e = 0, m = 0;
					for (int i = 0; i < DS_NC; i++)
						for (int t = 0; t <= DS_N + i; t++) {
							size_t x = (size_t)i * T + t;
							e = fmax(e, fabs(dst[x] - want[x]));
							m = fmax(m, fabs(want[x]));
						}
					return isfinite(e) && m > 0 ? e / m : INFINITY;
				},
				sc, no, base, got, &ms1, err);
		}
	}
out:
	wk_cuda_free(k);
	wk_cuda_free(ks);
	wk_cuda_free(q);
	wk_cuda_free(w);
	wk_cuda_free(sc);
	wk_cuda_free(sel);
	wk_cuda_free(ns);
	wk_cuda_free(count);
	free(hk);
	free(hks);
	free(hq);
	free(hw);
	free(got);
	free(base);
	free(want);
	return failed ? WK_EIO : WK_OK;
}

/* GLM-5's DSA indexer in a batched decode step: DD_B sequences of DD_CTX keys each (bf16,
 * the default cache), one query each at its last position, one call (several sequences):
 * a warp a key on the f32 pipes (path 1) against the keys on the tensor cores (path 3), the
 * select in both (its two-pass form, wk_cuda_dsa_cap), and path 3 again with the select's
 * five-pass radix form. Both are bound by reading the keys (GB/s of them beside the copy);
 * the calls rotate over DD_LAYERS layers' caches, so that the keys stream from HBM and not
 * from L2. Checked on layer 0: query 0's scores against cpu_ref_dsa_score, and path 3's
 * against path 1's for every query. Then the same at one sequence of DD_B x DD_CTX keys
 * (long context at batch 1: one block selects while the others idle). */
#define DD_B 4
#define DD_CTX 32768
#define DD_LAYERS 4

/* Path 3 with the five-pass select (lab_path_row's force: 0 restores both defaults). */
static void dsa_force_radix(int path)
{
	wk_cuda_dsa_force(path);
	wk_cuda_dsa_cap(path ? 0 : -1);
}

static int dsa_decode_at(int nb, int ctx, double ceil_gbs);

int lab_dsa_decode(double ceil_gbs)
{
	return dsa_decode_at(DD_B, DD_CTX, ceil_gbs) | dsa_decode_at(1, DD_B * DD_CTX, ceil_gbs)
		       ? WK_EIO
		       : WK_OK;
}

static int dsa_decode_at(int nb, int ctx, double ceil_gbs)
{
	char err[WK_ERRSZ] = "";
	const int H = 32, D = 128, topk = 2048;
	size_t nk = (size_t)nb * ctx * D, nq = (size_t)nb * H * D, nw = (size_t)nb * H;
	size_t no = (size_t)nb * ctx;
	void *k[DD_LAYERS] = {};
	float *q = NULL, *w = NULL, *sc = NULL;
	int *sel = NULL, *ns = NULL, *dseq = NULL, *dpos = NULL;
	unsigned *count = NULL, *hist = NULL;
	uint16_t *hk = (uint16_t *)malloc((size_t)ctx * D * 2);
	float *hq = (float *)malloc((size_t)H * D * 4), *hw = (float *)malloc((size_t)H * 4);
	float *got = (float *)malloc(no * 4), *base = (float *)malloc(no * 4);
	float *want = (float *)malloc((size_t)ctx * 4);
	int seq[DD_B] = {}, pos[DD_B] = {}, failed = 0, layer = 0;
	double ms1 = 0;
	for (int b = 0; b < nb; b++)
		seq[b] = b, pos[b] = ctx - 1;
	printf("\n%-40s %10s %10s   (%d sequences of %d keys, %d heads of %d, top %d, bf16 keys)\n",
	       "kernel (decode, DSA indexer)", "TFLOPS", "vs warps", nb, ctx, H, D, topk);
	bool ok = hk && hq && hw && got && base && want;
	for (int l = 0; l < DD_LAYERS && ok; l++)
		ok = !wk_cuda_alloc(&k[l], nk * 2, err, sizeof err) &&
		     !fill_random(k[l], nk * 2, false, -1, 1);
	if (!ok || wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&w, nw * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&sc, no * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&sel, (size_t)nb * topk * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&ns, nb * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&dseq, sizeof seq, err, sizeof err) ||
	    wk_cuda_alloc((void **)&dpos, sizeof pos, err, sizeof err) ||
	    wk_cuda_alloc((void **)&count, nb * sizeof(unsigned), err, sizeof err) ||
	    wk_cuda_zero(count, nb * sizeof(unsigned), err, sizeof err) ||
	    wk_cuda_alloc((void **)&hist, (size_t)nb * WK_DSA_BINS * 4, err, sizeof err) ||
	    wk_cuda_zero(hist, (size_t)nb * WK_DSA_BINS * 4, err, sizeof err) ||
	    wk_cuda_zero(sc, no * 4, err, sizeof err) ||
	    wk_cuda_upload(dseq, seq, sizeof seq, err, sizeof err) ||
	    wk_cuda_upload(dpos, pos, sizeof pos, err, sizeof err) ||
	    fill_random(q, nq * 4, true, -1, 1) || fill_random(w, nw * 4, true, -1, 1) ||
	    wk_cuda_download(hk, k[0], (size_t)ctx * D * 2, err, sizeof err) ||
	    wk_cuda_download(hq, q, (size_t)H * D * 4, err, sizeof err) ||
	    wk_cuda_download(hw, w, (size_t)H * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "decode, DSA indexer", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	{
		struct cpu_dsa d;
		memset(&d, 0, sizeof d);
		d.kv = DT_BF16, d.n_heads = H, d.head_dim = D, d.topk = topk;
		d.qk_scale = 1.0f / sqrtf((float)D), d.w_scale = 1.0f / sqrtf((float)H);
		d.seq = dseq, d.pos = dpos, d.seq_rows = ctx, d.keys_max = ctx;
		for (int t = 0; t < ctx; t++) /* query 0 over sequence 0 of layer 0 */
			want[t] = cpu_ref_dsa_score(hq, hk + (size_t)t * D, DT_BF16, NULL, hw, H, D,
						    d.qk_scale, d.w_scale);
		double flops = 2.0 * H * D * (double)nb * ctx;
		static const char *name[] = {"a warp a key (f32)", "keys on the tensor cores",
					     "tensor cores, select counts bins",
					     "tensor cores, 5-pass select"};
		for (int row = 0; row < 4; row++) {
			int path = row ? 3 : 1;
			unsigned *h = row == 1 ? hist : NULL; /* bins counted by the scoring */
			layer = 0;
			failed |= lab_path_row(
				name[row], row == 3 ? dsa_force_radix : wk_cuda_dsa_force, path,
				flops,
				[&]() -> int {
					d.k = k[layer++ % DD_LAYERS];
					return wk_cuda_dsa_topk(sel, ns, q, w, &d, nb, 0, sc, no,
								count, nb, h, nb, err,
								sizeof err);
				},
				[&](const float *dst) -> double {
					return lab_rel(dst, want, 1, 0, 0, ctx);
				},
				sc, no, base, got, &ms1, err, (double)nk * 2, ceil_gbs);
		}
	}
out:
	for (int l = 0; l < DD_LAYERS; l++)
		wk_cuda_free(k[l]);
	wk_cuda_free(q);
	wk_cuda_free(w);
	wk_cuda_free(sc);
	wk_cuda_free(sel);
	wk_cuda_free(ns);
	wk_cuda_free(dseq);
	wk_cuda_free(dpos);
	wk_cuda_free(count);
	wk_cuda_free(hist);
	free(hk);
	free(hq);
	free(hw);
	free(got);
	free(base);
	free(want);
	return failed ? WK_EIO : WK_OK;
}

/* GLM-5's MLA decoding one token on one tensor-parallel rank of 8 (8 of its 64 heads,
 * kv_lora_rank 512, rope 64, nope 192, v 256): position MLA_CTX - 1 attends to the MLA_TOPK
 * positions of MLA_CTX that DSA selected (random, ascending, distinct, the last included), over
 * a bf16 cache (latent and k_pe bf16) and an FP8 one (the latent's e4m3 codes with a scale per
 * 128, k_pe bf16: struct cpu_mla's FP8 layout, v is the latent), kv_b_proj in FP8 with 128 x
 * 128 block scales. Rows: wk_cuda_mla_absorbed with the split scratch (one launch of three
 * stages, the backend's), the same without it (three launches, the attention whole: its
 * baseline), and wk_cuda_mla_attention alone over a random absorbed query (d_a = d_v = 512,
 * d_b = 64), split and whole. Decode is bound by what it reads, so a row's figure is the
 * selected cache rows' bytes (latent, FP8's scales, k_pe; the absorbed rows add kv_b's codes
 * and scales) per second against the copy; the calls rotate over MLA_LAYERS layers' caches,
 * weights and selections (as a step walks its layers), so that they stream from HBM and not
 * from L2. gm / split: wk_cuda_mla_shape's plan (heads a block, parts of the keys). Checked
 * first on layer 0 against the CPU references (the absorbed o against cpu_ref_mla_absorb_q,
 * cpu_ref_mla_attention and cpu_ref_mla_absorb_out; the attention's against
 * cpu_ref_mla_attention), 1e-4 of the largest output, as lab_attention's (the absorptions
 * sum in the reference's order; the attention in its own, an online softmax and the split's
 * merge). WK_OK or WK_EIO. */
#ifndef MLA_CTX
#define MLA_CTX 32768 /* positions in the cache; the token is the last */
#endif
#ifndef MLA_TOPK
#define MLA_TOPK 2048 /* index_topk */
#endif
#ifndef MLA_LAYERS
#define MLA_LAYERS 32 /* each call's selected rows and kv_b: ~3 MB, 32 of them past L2 */
#endif
#ifndef MLA_CALLS
#define MLA_CALLS 20
#endif
#define MLA_HEADS 8 /* 64 / 8 ranks */
#define MLA_LORA 512
#define MLA_ROPE 64
#define MLA_NOPE 192
#define MLA_DV 256
#define MLA_ROWS (MLA_HEADS * (MLA_NOPE + MLA_DV)) /* kv_b_proj's rows on the rank */
#define MLA_WS (((MLA_ROWS + 127) / 128) * ((MLA_LORA + 127) / 128)) /* its block scales */
#define MLA_LS (MLA_LORA / 128) /* an FP8 latent row's scales */

/* cache: one layer's latent (its first MLA_CTX * MLA_LORA bytes as FP8 codes, with scales
 * ls), k_pe (bf16 either way) and selection sel; kv the cache's type. */
static struct cpu_mla lab_mla_cache(enum dt_type kv, const void *lat, const float *ls,
				    const void *kpe, const int *sel, const int *nsel)
{
	struct cpu_mla s;
	memset(&s, 0, sizeof s);
	s.n_heads = MLA_HEADS;
	s.d_a = s.d_v = MLA_LORA;
	s.d_b = MLA_ROPE;
	s.kv = kv;
	s.k_a = s.v = lat;
	s.k_b = kpe;
	s.a_s = kv == DT_F8_E4M3 ? ls : NULL;
	s.ka_stride = s.v_stride = MLA_LORA;
	s.kb_stride = MLA_ROPE;
	s.sel = sel;
	s.nsel = nsel;
	s.sel_stride = MLA_TOPK;
	s.scale = 1.0f / sqrtf((float)(MLA_NOPE + MLA_ROPE));
	return s;
}

/* A random ascending selection of MLA_TOPK distinct positions of MLA_CTX, the last included
 * (the token's own key): the others chosen one by one with the odds of the ones still to
 * choose over the positions left. */
static void lab_mla_select(int *sel)
{
	int need = MLA_TOPK - 1, m = 0;
	for (int t = 0; t < MLA_CTX - 1 && need > 0; t++)
		if ((int)(lab_next() % (uint32_t)(MLA_CTX - 1 - t)) < need) {
			sel[m++] = t;
			need--;
		}
	sel[m] = MLA_CTX - 1;
}

int lab_mla(double ceil_gbs)
{
	char err[WK_ERRSZ] = "";
	const int L = MLA_LAYERS, pos0 = MLA_CTX - 1, H = MLA_HEADS;
	const size_t lat_b = (size_t)MLA_CTX * MLA_LORA * 2, kpe_b = (size_t)MLA_CTX * MLA_ROPE * 2;
	const size_t nls = (size_t)MLA_CTX * MLA_LS, w_b = (size_t)MLA_ROWS * MLA_LORA;
	const size_t nq = (size_t)H * (MLA_NOPE + MLA_ROPE);
	const size_t nqa = (size_t)H * (MLA_LORA + MLA_ROPE);
	const size_t nl = (size_t)H * MLA_LORA, no = (size_t)H * MLA_DV;
	size_t pf = 0;
	char *lat = NULL, *kpe = NULL, *w = NULL;
	float *ls = NULL, *ws = NULL, *q = NULL, *qa = NULL, *dl = NULL, *o = NULL, *qr = NULL;
	float *lr = NULL, *part = NULL;
	int *sel = NULL, *nsel = NULL;
	unsigned *count = NULL;
	int one = MLA_TOPK; /* nsel: the token's keys */
	int *hsel = (int *)malloc((size_t)L * MLA_TOPK * sizeof(int));
	unsigned char *hlat = (unsigned char *)malloc(lat_b);
	unsigned char *hkpe = (unsigned char *)malloc(kpe_b);
	unsigned char *hw = (unsigned char *)malloc(w_b);
	float *hls = (float *)malloc(nls * 4), *hws = (float *)malloc(MLA_WS * 4);
	float *hq = (float *)malloc(nq * 4), *hqr = (float *)malloc(nqa * 4);
	float *rqa = (float *)malloc(nqa * 4), *rl = (float *)malloc(nl * 4);
	float *want = (float *)malloc(nl * 4), *got = (float *)malloc(nl * 4);
	int failed = 0;
	printf("\n%-40s %10s %10s   (GLM-5, a rank of 8: %d heads, %d of %d positions)\n",
	       "kernel (decode attention, MLA)", "GB/s", "of copy", H, MLA_TOPK, MLA_CTX);
	if (hsel)
		for (int l = 0; l < L; l++)
			lab_mla_select(hsel + (size_t)l * MLA_TOPK);
	for (int f8 = 0; f8 < 2; f8++) { /* the widest split of either cache */
		struct cpu_mla s = lab_mla_cache(f8 ? DT_F8_E4M3 : DT_BF16, NULL, NULL, NULL,
						 hsel, &one);
		size_t p = wk_cuda_mla_part(&s, 1, pos0);
		pf = p > pf ? p : pf;
	}
	if (!hsel || !hlat || !hkpe || !hw || !hls || !hws || !hq || !hqr || !rqa || !rl ||
	    !want || !got || wk_cuda_alloc((void **)&lat, lat_b * L, err, sizeof err) ||
	    wk_cuda_alloc((void **)&kpe, kpe_b * L, err, sizeof err) ||
	    wk_cuda_alloc((void **)&ls, nls * L * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&w, w_b * L, err, sizeof err) ||
	    wk_cuda_alloc((void **)&ws, (size_t)MLA_WS * L * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&sel, (size_t)L * MLA_TOPK * sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&nsel, sizeof(int), err, sizeof err) ||
	    wk_cuda_alloc((void **)&q, nq * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&qa, nqa * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&dl, nl * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&o, no * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&qr, nqa * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&lr, nl * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&part, (pf ? pf : 1) * 4, err, sizeof err) ||
	    wk_cuda_alloc((void **)&count, 4096 * 4, err, sizeof err) ||
	    cudaMemset(count, 0, 4096 * 4) != cudaSuccess ||
	    /* bf16 values in [-1, 1) whose bytes are also e4m3 codes; FP8 scales near 1/256
	     * (the latent's, so that scores stay moderate) and 1/512 (kv_b's) */
	    fill_random(lat, lat_b * L, false, -1, 1) ||
	    fill_random(kpe, kpe_b * L, false, -1, 1) ||
	    fill_random(ls, nls * L * 4, true, 0.002f, 0.006f) ||
	    fill_random(w, w_b * L, false, -1, 1) ||
	    fill_random(ws, (size_t)MLA_WS * L * 4, true, 0.001f, 0.003f) ||
	    fill_random(q, nq * 4, true, -1, 1) || fill_random(qr, nqa * 4, true, -1, 1) ||
	    wk_cuda_upload(sel, hsel, (size_t)L * MLA_TOPK * sizeof(int), err, sizeof err) ||
	    wk_cuda_upload(nsel, &one, sizeof(int), err, sizeof err) ||
	    wk_cuda_download(hlat, lat, lat_b, err, sizeof err) ||
	    wk_cuda_download(hkpe, kpe, kpe_b, err, sizeof err) ||
	    wk_cuda_download(hls, ls, nls * 4, err, sizeof err) ||
	    wk_cuda_download(hw, w, w_b, err, sizeof err) ||
	    wk_cuda_download(hws, ws, (size_t)MLA_WS * 4, err, sizeof err) ||
	    wk_cuda_download(hq, q, nq * 4, err, sizeof err) ||
	    wk_cuda_download(hqr, qr, nqa * 4, err, sizeof err)) {
		printf("%-40s %10s   (%s)\n", "mla", "FAILED",
		       err[0] ? err : "out of memory, or the fill failed");
		failed = 1;
		goto out;
	}
	for (int f8 = 0; f8 < 2; f8++) {
		enum dt_type kv = f8 ? DT_F8_E4M3 : DT_BF16;
		struct wk_att_split sp = {part, pf, count, 4096};
		/* layer 0 on the host: the references */
		struct cpu_mla hs = lab_mla_cache(kv, hlat, hls, hkpe, hsel, &one);
		double rows = (double)MLA_TOPK * (MLA_LORA * (f8 ? 1 : 2) + (f8 ? MLA_LS * 4 : 0) +
						  MLA_ROPE * 2);
		double wbytes = (double)w_b + MLA_WS * 4;
		float wo[MLA_HEADS * MLA_DV];
		cpu_ref_mla_absorb_q(rqa, hq, hw, DT_F8_E4M3, hws, MLA_LORA, 1, H, MLA_NOPE,
				     MLA_ROPE, MLA_DV, 0, H);
		cpu_ref_mla_attention(rl, rqa, &hs, 1, pos0, 0, 1, 0, H);
		cpu_ref_mla_absorb_out(wo, rl, hw, DT_F8_E4M3, hws, MLA_LORA, 1, H, MLA_NOPE,
				       MLA_DV, 0, H);
		cpu_ref_mla_attention(want, hqr, &hs, 1, pos0, 0, 1, 0, H);
		/* absorbed: split, 3 launches; attention: split, whole; then absorbed, split,
		 * with all 8 heads in each block (wk_cuda_mla_force: each key read once for
		 * the 8, in fewer blocks) */
		for (int r = 0; r < 5; r++) {
			bool absorbed = r < 2 || r == 4, split = !(r & 1);
			wk_cuda_mla_force(r == 4 ? MLA_HEADS : 0);
			const struct wk_att_split *s = split ? &sp : NULL;
			char name[64];
			snprintf(name, sizeof name, "%s cache, %s", f8 ? "fp8" : "bf16",
				 r == 0 ? "absorbed, split" : r == 1 ? "absorbed, 3 launches"
				 : r == 2 ? "attention, split" : r == 3 ? "attention, whole"
				 : "absorbed, split, gm 8");
			/* the check: layer 0 */
			struct cpu_mla d0 = lab_mla_cache(kv, lat, ls, kpe, sel, nsel);
			double worst = INFINITY;
			int rc = absorbed ? wk_cuda_mla_absorbed(o, qa, dl, q, w, DT_F8_E4M3, ws,
								 MLA_LORA, &d0, 1, pos0, MLA_NOPE,
								 MLA_DV, s, err, sizeof err)
					  : wk_cuda_mla_attention(lr, qr, &d0, 1, pos0, 0, 1, 0, H,
								  s, err, sizeof err);
			if (rc == WK_OK && wk_cuda_sync(err, sizeof err) == WK_OK &&
			    wk_cuda_download(got, absorbed ? o : lr, (absorbed ? no : nl) * 4, err,
					     sizeof err) == WK_OK)
				worst = absorbed ? lab_rel(got, wo, 1, (int)no, 0, (int)no)
						 : lab_rel(got, want, 1, (int)nl, 0, (int)nl);
			size_t call = 0;
			float ms = time_ms([&]() -> int {
				for (int c = 0; c < MLA_CALLS; c++, call++) {
					size_t l = call % L;
					struct cpu_mla d = lab_mla_cache(
						kv, lat + l * lat_b, ls + l * nls, kpe + l * kpe_b,
						sel + l * MLA_TOPK, nsel);
					int r2 = absorbed
						? wk_cuda_mla_absorbed(o, qa, dl, q, w + l * w_b,
								       DT_F8_E4M3, ws + l * MLA_WS,
								       MLA_LORA, &d, 1, pos0,
								       MLA_NOPE, MLA_DV, s, err,
								       sizeof err)
						: wk_cuda_mla_attention(lr, qr, &d, 1, pos0, 0, 1,
									0, H, s, err,
									sizeof err);
					if (r2 != WK_OK)
						return r2;
				}
				return WK_OK;
			});
			bool ok = worst <= 1e-4;
			failed |= !ok || ms <= 0;
			if (ms <= 0) {
				printf("%-40s %10s   (%s)\n", name, "FAILED", err);
				continue;
			}
			int gm = 1, parts = 1;
			wk_cuda_mla_shape(&d0, 1, H, pos0, &gm, &parts);
			double bytes = rows + (absorbed ? wbytes : 0);
			double gbs = bytes * MLA_CALLS / (ms * 1e-3) / 1e9;
			printf("%-40s %10.0f %9.0f%%   %.1f us a call, gm %d, split %d; %s %.1e "
			       "off the CPU\n", name, gbs, 100.0 * gbs / ceil_gbs,
			       1e3 * ms / MLA_CALLS, gm, split ? parts : 1,
			       ok ? "checked:" : "WRONG:", worst);
		}
		wk_cuda_mla_force(0);
	}
out:
	wk_cuda_free(lat);
	wk_cuda_free(kpe);
	wk_cuda_free(ls);
	wk_cuda_free(w);
	wk_cuda_free(ws);
	wk_cuda_free(sel);
	wk_cuda_free(nsel);
	wk_cuda_free(q);
	wk_cuda_free(qa);
	wk_cuda_free(dl);
	wk_cuda_free(o);
	wk_cuda_free(qr);
	wk_cuda_free(lr);
	wk_cuda_free(part);
	wk_cuda_free(count);
	free(hsel);
	free(hlat);
	free(hkpe);
	free(hw);
	free(hls);
	free(hws);
	free(hq);
	free(hqr);
	free(rqa);
	free(rl);
	free(want);
	free(got);
	return failed ? WK_EIO : WK_OK;
}

