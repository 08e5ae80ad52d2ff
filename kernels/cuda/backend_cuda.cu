/*
 * backend_cuda.cu - the CUDA backend: the model families' ops on one GPU, with the
 * first-version kernels of cuda_kernels.h. A snapshot streams into one device allocation per
 * rank through pinned staging buffers (the stage ops: cudaMemcpyAsync on a copy stream while
 * the reader threads read and verify the next chunks) and the weights are used where they
 * land; from a Hugging Face directory they are copied when the model binds them
 * (upload_weight). Activations and KV caches are device memory (mem_alloc), and the engine
 * copies in (the embedded tokens) and out (the logits) around each step.
 *
 * Every CUDA call is checked. The first failure is sticky: it is kept, every later op does
 * nothing, and sync() returns it, so the step fails with the CUDA error and the worker hands
 * its jobs back instead of serving garbage (never a hang: sync waits only for work that was
 * launched).
 *
 * Not yet run on a GPU (scripts/gpu-check is the first run). Both families run here: the
 * Llama family on kernels.cu, GLM-5 and GLM-4.5 also on glm_kernels.cu (MoE routing, MLA,
 * the DSA indexer; tests/unit/test_glm_paths.c checks their engine side on devsim). Sharded runs
 * on CUDA are refused (the collectives run on host memory). A prefill's FP8 matmuls run as
 * warpgroup GEMMs (the engine asks from 64 tokens): matmul_fp8act with FP8 activations
 * (gemm_wgmma.cu), matmul_fp8w with f32 ones (gemm_fp8w.cu), their converted activations in
 * scratch grown on demand. The ops the engine holds between eng_chain_begin and eng_chain_end
 * (a decode step's GEMVs, norms and grouped MoE op) run as one chained launch each (chain:
 * moe_kernels.cu k_chain), on counters after dsa_topk's.
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/wk.h"
#include "engine/backend.h"
#include "kernels/cuda/cuda_kernels.h"
}

/* A pinned staging buffer of the snapshot restore, and the event after its last copy. */
struct stage {
	void *host;
	cudaEvent_t done;
	bool borrowed; /* another context's buffer (a sharded restore): forgotten, not freed */
};

#define MARKS 4096 /* the op clock's events a context holds between reads */

struct cuda_ctx {
	int device;
	void **owned; /* uploaded weights, freed at shutdown */
	size_t n_owned, cap_owned;
	pthread_mutex_t stage_mu; /* the restore's reader threads share the staging table */
	struct stage *stages;
	size_t n_stages, cap_stages;
	cudaStream_t copy_stream; /* host-to-device copies of the restore; NULL until needed */
	float *dsa_scores;        /* dsa_topk's score rows, grown on demand (dsa_cap floats) */
	size_t dsa_cap;
	float *att_part;          /* attention's split parts, grown on demand (att_cap floats; */
	size_t att_cap, att_refused; /* a size cudaMalloc refused is not asked for again) */
	uint8_t *aq_codes;        /* matmul_fp8act's e4m3 activations and their scales, and */
	float *aq_scales;         /* matmul_fp8w's bf16 halves of x: grown on demand (dev_grow; */
	uint16_t *xb;             /* the caps in bytes) */
	size_t aq_cap, aq_scap, xb_cap;
	unsigned *dsa_hist;       /* DSA_HIST_ROWS rows of dsa_topk's bin counts (a decode step's
				   * select: one pass over its scores fewer): zero, each launch
				   * leaving them zero; NULL until needed or when refused */
	bool dsa_hist_refused;
	unsigned *dsa_count;      /* DSA_GROUPS counters of the last-block kernels (dsa_topk,
				   * moe_route_experts), then WK_CHAIN_SYNC of the chained launches:
				   * moe_route_experts): zero, each launch leaving them zero */
	cudaEvent_t *marks; /* the op clock's points (mark, marks_ms): MARKS, created as used */
	int n_marks;
	bool gemv_mma;     /* 2..8 tokens through the tensor-core GEMV (gemv_route) */
	bool gemv_v3;      /* and that GEMV the pipelined one (wk_cuda_gemv_mma3) */
	bool gemm_st;      /* matmul_fp8act's GEMM with the TMA-store epilogue */
	int rc;            /* WK_OK until an op fails */
	char err[WK_ERRSZ]; /* the first failure */
};

extern "C" int cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n;
}

/* Keeps the first failure; true when ops may still run. */
static bool ok(struct cuda_ctx *c, int rc, const char *err)
{
	if (rc != WK_OK && c->rc == WK_OK) {
		c->rc = rc;
		snprintf(c->err, sizeof c->err, "%s", err);
	}
	return c->rc == WK_OK;
}

static bool ok_cuda(struct cuda_ctx *c, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return c->rc == WK_OK;
	char m[WK_ERRSZ];
	snprintf(m, sizeof m, "CUDA %s: %s", what, cudaGetErrorString(e));
	return ok(c, WK_EIO, m);
}

static int own_upload(struct cuda_ctx *c, const void *host, size_t bytes, void **out, char *err,
		      size_t errsz);

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool env_gemv_mma, env_gemv_v3, env_gemm_st;
static char env_bad[160]; /* the first setting env_read refused: init fails naming it */

/* v, the value of the variable name (getenv's, called at the caller with the name written
 * out, which the deploy check lists), when it is set and not empty, else NULL; a value that
 * is none of the comma-separated words of allowed, nor (list) several of them joined by
 * commas, is kept in env_bad and read as unset. */
static const char *env_word(const char *name, const char *v, const char *allowed, bool list)
{
	if (!v || !*v)
		return NULL;
	char words[64];
	snprintf(words, sizeof words, ",%s,", allowed);
	for (const char *p = v;;) {
		size_t n = strcspn(p, ",");
		char w[32];
		bool ok = n > 0 && n < sizeof w - 2;
		if (ok) {
			snprintf(w, sizeof w, ",%.*s,", (int)n, p);
			ok = strstr(words, w) != NULL;
		}
		if (!ok || (!list && p[n])) {
			if (!env_bad[0])
				snprintf(env_bad, sizeof env_bad, "%s=%s: not %s%s", name, v,
					 list ? "a list of " : "one of ", allowed);
			return NULL;
		}
		if (!p[n])
			return v;
		p += n + 1;
	}
}

/* The environment's settings, read once for the process; a value none of those below is
 * refused (env_bad), not taken for the default. */
static void env_read(void)
{
	/* WICK_CUDA_PDL=0: the GEMVs launched as ordinary kernels, not programmatic dependents
	 * (an operator's escape hatch, and the baseline gpu-check times them against) */
	const char *pdl = env_word("WICK_CUDA_PDL", getenv("WICK_CUDA_PDL"), "0,1", false);
	if (pdl && strcmp(pdl, "0") == 0)
		wk_cuda_set_pdl(0);
	/* WICK_CUDA_STREAM=pt: compute on each thread's per-thread default stream rather than
	 * the legacy one (whether PDL acts on the legacy stream is for the GPU to say: the lab's
	 * launch-floor rows and gpu-check's decode step time both) */
	const char *st =
		env_word("WICK_CUDA_STREAM", getenv("WICK_CUDA_STREAM"), "pt,legacy", false);
	wk_cuda_set_stream(st && strcmp(st, "pt") == 0);
	/* the GEMVs of 2..8 tokens on the tensor cores (gemv_route), unless WICK_CUDA_GEMV=v1:
	 * on an H200, v2 read FP8 weights at 2.5-4.6x v1's rate at 8 tokens, bf16 at 1.8-2.9x;
	 * WICK_CUDA_GEMV=v3: those GEMVs software-pipelined (wk_cuda_gemv_mma3, the same sums;
	 * not yet run on a GPU), for gpu-check to time a batched step both ways */
	const char *gv = env_word("WICK_CUDA_GEMV", getenv("WICK_CUDA_GEMV"), "v1,v2,v3", false);
	env_gemv_mma = !(gv && strcmp(gv, "v1") == 0);
	env_gemv_v3 = gv && strcmp(gv, "v3") == 0;
	/* WICK_CUDA_GEMM=st: the FP8 prefill GEMM with the TMA-store epilogue (the lab's
	 * "wgmma st"; the same sums, stored another way) */
	const char *gm = env_word("WICK_CUDA_GEMM", getenv("WICK_CUDA_GEMM"), "st,plain", false);
	env_gemm_st = gm && strcmp(gm, "st") == 0;
	/* WICK_CUDA_FP8W=rs, wf or rs,wf: the f32-activation prefill GEMMs (dense and the MoE
	 * experts') with the weights as wgmma's register operand (fp8w_tile_rs), and/or the
	 * dense one's weight tiles fastest in the grid (the lab's "fp8w ... rs / wf" rows) */
	const char *fw = env_word("WICK_CUDA_FP8W", getenv("WICK_CUDA_FP8W"), "rs,wf", true);
	wk_cuda_fp8w_mode((fw && strstr(fw, "rs") ? WK_FP8W_RS : 0) |
			  (fw && strstr(fw, "wf") ? WK_FP8W_WF : 0));
}

static int init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	int n = cuda_device_count();
	if (n == 0)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "no CUDA device is visible");
	if (cfg->device < 0 || cfg->device >= n)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA device %d does not exist (%d visible)",
			       cfg->device, n);
	cudaError_t e = cudaSetDevice(cfg->device);
	if (e != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "CUDA device %d: %s", cfg->device,
			       cudaGetErrorString(e));
	/* the process-wide settings, once: a sharded restore starts the ranks' contexts from
	 * threads of their own at once (be_sink) */
	pthread_once(&env_once, env_read);
	if (env_bad[0])
		return wk_errf(err, errsz, WK_EINVAL, "%s", env_bad);
	struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	c->device = cfg->device;
	pthread_mutex_init(&c->stage_mu, NULL);
	c->gemv_mma = env_gemv_mma && !cfg->fp8_act;
	c->gemv_v3 = env_gemv_v3;
	c->gemm_st = env_gemm_st;
	*ctx = c;
	return WK_OK;
}

static void shutdown(void *ctx)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (!c)
		return;
	cudaSetDevice(c->device); /* the frees below are this device's */
	for (size_t i = 0; i < c->n_owned; i++)
		cudaFree(c->owned[i]);
	free(c->owned);
	for (size_t i = 0; i < c->n_stages; i++) {
		cudaEventSynchronize(c->stages[i].done);
		cudaEventDestroy(c->stages[i].done);
		if (!c->stages[i].borrowed)
			cudaFreeHost(c->stages[i].host);
	}
	free(c->stages);
	if (c->copy_stream)
		cudaStreamDestroy(c->copy_stream);
	cudaFree(c->aq_codes);
	cudaFree(c->aq_scales);
	cudaFree(c->xb);
	cudaFree(c->dsa_scores);
	cudaFree(c->att_part);
	cudaFree(c->dsa_count);
	cudaFree(c->dsa_hist);
	for (int i = 0; c->marks && i < MARKS; i++)
		if (c->marks[i])
			cudaEventDestroy(c->marks[i]);
	free(c->marks);
	pthread_mutex_destroy(&c->stage_mu);
	free(c);
}

static bool supports(void *ctx, enum be_op op, enum dt_type wt)
{
	(void)ctx;
	switch (op) {
	case BE_OP_MATMUL:
		return wt == DT_F32 || wt == DT_BF16 || wt == DT_F16 || wt == DT_F8_E4M3;
	case BE_OP_ATTENTION: /* the KV cache's type */
	case BE_OP_MLA_ATTENTION:
	case BE_OP_DSA_TOPK:
		return wt == DT_F32 || wt == DT_BF16 || wt == DT_F8_E4M3;
	case BE_OP_RMSNORM:
	case BE_OP_ROPE:
	case BE_OP_SILU_MUL:
	case BE_OP_ADD:
	case BE_OP_LAYERNORM:
	case BE_OP_MOE_ROUTE:
	case BE_OP_GATHER_ROWS:
	case BE_OP_SCATTER_ADD_ROWS:
	case BE_OP_CAST:
		return true;
	case BE_OP_MLA_ABSORB:
		return wt == DT_F32 || wt == DT_BF16 || wt == DT_F16 || wt == DT_F8_E4M3;
	default:
		return false;
	}
}

/* ---- ops ------------------------------------------------------------------------------------ */

/* Whether y = x . w^T of n tokens goes to the tensor-core GEMV (wk_cuda_gemv_mma, or with
 * WICK_CUDA_GEMV=v3 wk_cuda_gemv_mma3; ~1e-5 of the largest output off the f32 reference
 * where k_matmul is ~1e-6) rather than k_matmul:
 * for 2..8 tokens of FP8 or bf16 weights it takes (columns a multiple of 128), unless
 * WICK_CUDA_GEMV=v1 or the engine quantizes activations (be_config.fp8_act). One token
 * stays on k_matmul, level with v2 or faster on most shapes. */
static bool gemv_route(const struct cuda_ctx *c, const float *x, const struct be_weight *w, int n)
{
	return c->gemv_mma && n >= 2 && n <= 8 &&
	       (w->dtype == DT_F8_E4M3 || w->dtype == DT_BF16) && w->cols % 128 == 0 &&
	       (((uintptr_t)x | (uintptr_t)w->data) & 15) == 0;
}

static void matmul(void *ctx, float *y, const float *x, const struct be_weight *w, int n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc != WK_OK)
		return;
	if (gemv_route(c, x, w, n)) {
		auto gv = c->gemv_v3 ? wk_cuda_gemv_mma3 : wk_cuda_gemv_mma;
		ok(c, gv(y, x, w->data, w->dtype, w->scale, n, w->rows, w->cols, err, sizeof err), err);
		return;
	}
	int rc = w->dtype == DT_F8_E4M3
			 ? wk_cuda_matmul_fp8(y, x, (const uint8_t *)w->data, w->scale, n, w->rows,
					      w->cols, err, sizeof err)
			 : wk_cuda_matmul(y, x, w->data, w->dtype, n, w->rows, w->cols, err, sizeof err);
	ok(c, rc, err);
}

/* matmul_n's parts; with rope (matmul_rope_n), each output's rotation as the GEMV's store
 * does it, where its slices sit in whole heads of the output at even rows (r[k].x inside
 * y[k]'s first row); *rest gets the rotations that do not, for a rope_n after. */
static int mm_parts(struct wk_mm *p, float *const *y, const struct be_weight *const *w,
		    int count, int n, const struct be_rope *r, float theta, struct wk_rope *rest)
{
	int nrest = 0;
	for (int k = 0; k < count && k < WK_MATMUL_MAX; k++) {
		p[k] = {y[k], w[k]->data, w[k]->scale, w[k]->dtype, w[k]->rows, NULL, 0, 0, 0, 0, 0};
		if (!r || r[k].rot_dim <= 0)
			continue;
		ptrdiff_t off = r[k].x - y[k];
		if (r[k].n == n && off >= 0 && off + r[k].rot_dim <= r[k].head_dim &&
		    (long long)r[k].n_heads * r[k].head_dim == w[k]->rows &&
		    !((r[k].head_dim | (int)off | r[k].rot_dim) & 1)) {
			p[k].rope_pos = r[k].pos;
			p[k].rope_heads = r[k].n_heads;
			p[k].rope_hd = r[k].head_dim;
			p[k].rope_off = (int)off;
			p[k].rope_dim = r[k].rot_dim;
			p[k].rope_theta = theta;
		} else {
			rest[nrest++] = {r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim,
					 r[k].rot_dim};
		}
	}
	return nrest;
}

/* Whether any of the weights goes to the tensor-core GEMV (gemv_route). */
static bool any_route(const struct cuda_ctx *c, const float *x, const struct be_weight *const *w,
		      int count, int n)
{
	for (int k = 0; k < count; k++)
		if (gemv_route(c, x, w[k], n))
			return true;
	return false;
}

/* Each weight as matmul computes it: those gemv_route takes one tensor-core GEMV each, the
 * rest in one launch (k_matmul's set). */
static void matmul_n(void *ctx, float *const *y, const float *x,
		     const struct be_weight *const *w, int count, int n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct wk_mm p[WK_MATMUL_MAX];
	static_assert(WK_MATMUL_MAX == BE_MATMUL_MAX, "matmul_n limits differ");
	if (c->rc != WK_OK)
		return;
	if (count >= 1 && count <= WK_MATMUL_MAX && any_route(c, x, w, count, n)) {
		float *yr[WK_MATMUL_MAX];
		const struct be_weight *wr[WK_MATMUL_MAX];
		int m = 0;
		for (int k = 0; k < count && c->rc == WK_OK; k++) {
			if (gemv_route(c, x, w[k], n)) {
				matmul(ctx, y[k], x, w[k], n);
			} else {
				yr[m] = y[k];
				wr[m++] = w[k];
			}
		}
		if (m == 0 || c->rc != WK_OK)
			return;
		mm_parts(p, yr, wr, m, n, NULL, 0, NULL);
		ok(c, wk_cuda_matmul_n(p, m, x, n, wr[0]->cols, err, sizeof err), err);
		return;
	}
	mm_parts(p, y, w, count, n, NULL, 0, NULL);
	ok(c, wk_cuda_matmul_n(p, count, x, n, count > 0 ? w[0]->cols : 0, err, sizeof err), err);
}

/* The rotations in the GEMV's store: one launch for the matmuls and their rotations. Where a
 * weight goes to the tensor-core GEMV (whose store does not rotate): matmul_n, then every
 * rotation in one rope_n, which is what the store computes. */
static void matmul_rope_n(void *ctx, float *const *y, const float *x,
			  const struct be_weight *const *w, int count, int n,
			  const struct be_rope *r, float theta)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct wk_mm p[WK_MATMUL_MAX];
	struct wk_rope rest[WK_MATMUL_MAX];
	static_assert(WK_ROPE_MAX >= WK_MATMUL_MAX, "a rope_n takes what the store could not");
	if (c->rc != WK_OK)
		return;
	if (count >= 1 && count <= WK_MATMUL_MAX && any_route(c, x, w, count, n)) {
		int nr = 0;
		matmul_n(ctx, y, x, w, count, n);
		for (int k = 0; k < count; k++)
			if (r[k].rot_dim > 0)
				rest[nr++] = {r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim,
					      r[k].rot_dim};
		if (c->rc == WK_OK && nr)
			ok(c, wk_cuda_rope_n(rest, nr, theta, true, err, sizeof err), err);
		return;
	}
	int nrest = mm_parts(p, y, w, count, n, r, theta, rest);
	ok(c, wk_cuda_matmul_n(p, count, x, n, count > 0 ? w[0]->cols : 0, err, sizeof err), err);
	if (c->rc == WK_OK && nrest)
		ok(c, wk_cuda_rope_n(rest, nrest, theta, true, err, sizeof err), err);
}

/* What matmul_n / matmul_rope_n above launch (backend member matmul_launches): a tensor-core
 * GEMV for each weight gemv_route takes and one matmul_n launch for the rest; a rope_n where
 * a rotation is not made in the GEMV's store (every rotation once a weight is routed). */
static void matmul_launches(void *ctx, float *const *y, const float *x,
			    const struct be_weight *const *w, int count, int n,
			    const struct be_rope *r, int *mm, int *rot)
{
	const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
	*mm = 1;
	*rot = 0;
	if (count < 1 || count > WK_MATMUL_MAX)
		return;
	if (any_route(c, x, w, count, n)) {
		int routed = 0;
		for (int k = 0; k < count; k++) {
			routed += gemv_route(c, x, w[k], n);
			*rot |= r && r[k].rot_dim > 0;
		}
		*mm = routed + (routed < count);
		return;
	}
	struct wk_mm p[WK_MATMUL_MAX];
	struct wk_rope rest[WK_MATMUL_MAX];
	*rot = r && mm_parts(p, y, w, count, n, r, 0.0f, rest) > 0;
}

static void rmsnorm(void *ctx, float *y, const float *x, const float *w, int n, int dim,
		    float eps)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_rmsnorm(y, x, w, n, dim, eps, err, sizeof err), err);
}

static void rope(void *ctx, float *x, int n, const int *pos, int n_heads, int head_dim,
		 int rot_dim, float theta, bool interleaved)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_rope(x, n, pos, n_heads, head_dim, rot_dim, theta, interleaved, err,
				   sizeof err), err);
}

static_assert(WK_CAST_MAX == BE_CAST_MAX, "cast_n limits differ");
static_assert(sizeof(struct wk_cast) == sizeof(struct be_cast) &&
		      offsetof(struct wk_cast, n) == offsetof(struct be_cast, n) &&
		      offsetof(struct wk_cast, st) == offsetof(struct be_cast, st) &&
		      offsetof(struct wk_cast, w) == offsetof(struct be_cast, w),
	      "struct be_cast must have struct wk_cast's layout");

static void cast_n(void *ctx, const struct be_cast *r, int count)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_cast_n((const struct wk_cast *)r, count, err, sizeof err), err);
}

static void silu_mul(void *ctx, float *g, const float *u, size_t n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_silu_mul(g, u, n, err, sizeof err), err);
}

static void add(void *ctx, float *y, const float *x, size_t n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_add(y, x, n, err, sizeof err), err);
}

/* The kernels' form of norms; false where a rotation or a head count does not fit its 16
 * bits (then nothing runs: norm_n fails by name, a chain runs op by op). */
static bool wk_norms(struct wk_norm *w, const struct be_norm *r, int count)
{
	bool fit = true;
	for (int k = 0; k < count && k < WK_NORM_MAX; k++) {
		fit &= r[k].rope_dim <= INT16_MAX && r[k].heads <= INT16_MAX;
		w[k] = {r[k].y,
			r[k].x,
			r[k].w,
			r[k].b,
			r[k].rope_pos,
			r[k].add,
			r[k].n,
			r[k].dim,
			r[k].eps,
			r[k].theta,
			(int16_t)r[k].rope_dim,
			(int16_t)r[k].heads,
			r[k].layer,
			r[k].half,
			r[k].bare};
	}
	return fit;
}

static void norm_n(void *ctx, const struct be_norm *r, int count)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct wk_norm w[WK_NORM_MAX];
	static_assert(WK_NORM_MAX == BE_NORM_MAX, "norm_n limits differ");
	if (c->rc != WK_OK)
		return;
	if (!wk_norms(w, r, count)) {
		ok(c, wk_errf(err, sizeof err, WK_EINVAL, "CUDA norm_n: a rotation or a head "
			      "count past %d", INT16_MAX), err);
		return;
	}
	ok(c, wk_cuda_norm_n(w, count, err, sizeof err), err);
}

static void rope_n(void *ctx, const struct be_rope *r, int count, float theta,
		   bool interleaved)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct wk_rope w[WK_ROPE_MAX];
	static_assert(WK_ROPE_MAX == BE_ROPE_MAX, "rope_n limits differ");
	static_assert(sizeof(struct wk_rope) == sizeof(struct be_rope), "rope_n layouts differ");
	if (c->rc != WK_OK)
		return;
	for (int k = 0; k < count && k < WK_ROPE_MAX; k++)
		w[k] = {r[k].x, r[k].n, r[k].pos, r[k].n_heads, r[k].head_dim, r[k].rot_dim};
	ok(c, wk_cuda_rope_n(w, count, theta, interleaved, err, sizeof err), err);
}

static void argmax(void *ctx, int *idx, const float *logits, int n, int vocab)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_argmax(idx, logits, n, vocab, err, sizeof err), err);
}

static void sample_cand(void *ctx, struct samp_cand *cand, struct be_cand_head *head,
			const float *logits, const struct be_samp *s, int n, int vocab, int cap)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	static_assert(BE_CAND_MAX == WK_CUDA_CAND_MAX, "sample_cand limits differ");
	static_assert(sizeof(struct samp_cand) == sizeof(struct cpu_cand) &&
			      sizeof(struct be_cand_head) == sizeof(struct cpu_cand_head) &&
			      sizeof(struct be_samp) == sizeof(struct cpu_samp),
		      "sample_cand layouts differ");
	if (c->rc == WK_OK)
		ok(c,
		   wk_cuda_sample_cand((struct cpu_cand *)cand, (struct cpu_cand_head *)head, logits,
				       (const struct cpu_samp *)s, n, vocab, cap, err, sizeof err),
		   err);
}

/* *p holds at least bytes of device memory, *cap of them (grown, its contents dropped);
 * false, the context failed, when CUDA refuses. */
static bool dev_grow(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes, const char *what)
{
	if (bytes <= *cap)
		return true;
	cudaFree(*p);
	*p = NULL;
	*cap = 0;
	if (!ok_cuda(c, cudaMalloc(p, bytes), what))
		return false;
	*cap = bytes;
	return true;
}

/* x quantized once into e4m3 codes and scales (wk_cuda_act_codes: act_quant's arithmetic),
 * then one FP8 GEMM per weight on the warpgroup tensor cores. */
static void matmul_fp8act(void *ctx, float *const *y, const float *x,
			  const struct be_weight *const *w, int count, int n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc != WK_OK || count <= 0 || n <= 0)
		return;
	int cols = w[0]->cols;
	size_t nsc = (size_t)n * ((cols + 127) / 128);
	if (!dev_grow(c, (void **)&c->aq_codes, &c->aq_cap, (size_t)n * cols, "FP8 activations") ||
	    !dev_grow(c, (void **)&c->aq_scales, &c->aq_scap, nsc * sizeof(float),
		      "FP8 activation scales") ||
	    !ok(c, wk_cuda_act_codes(c->aq_codes, c->aq_scales, x, n, cols, err, sizeof err), err))
		return;
	for (int k = 0; k < count && c->rc == WK_OK; k++)
		ok(c, (c->gemm_st ? wk_cuda_gemm_fp8_wgmma_st : wk_cuda_gemm_fp8_wgmma)(
			      y[k], c->aq_codes, c->aq_scales, (const uint8_t *)w[k]->data,
			      w[k]->scale, n, w[k]->rows, cols, err, sizeof err),
		   err);
}

/* x split once into bf16 hi and lo halves (wk_cuda_act_split), then one GEMM per FP8 weight
 * on the warpgroup tensor cores (wk_cuda_gemm_fp8w): matmul's result within ~1e-5. */
static void matmul_fp8w(void *ctx, float *const *y, const float *x,
			const struct be_weight *const *w, int count, int n)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc != WK_OK || count <= 0 || n <= 0)
		return;
	int cols = w[0]->cols;
	size_t need = 2 * (size_t)n * WK_CUDA_SPLIT_COLS((size_t)cols) * sizeof(uint16_t);
	if (!dev_grow(c, (void **)&c->xb, &c->xb_cap, need, "bf16 halves of the activations") ||
	    !ok(c, wk_cuda_act_split(c->xb, x, n, cols, err, sizeof err), err))
		return;
	for (int k = 0; k < count && c->rc == WK_OK; k++)
		ok(c, wk_cuda_gemm_fp8w(y[k], c->xb, (const uint8_t *)w[k]->data, w[k]->scale, n,
					w[k]->rows, cols, err, sizeof err),
		   err);
}

static void act_quant(void *ctx, float *y, const float *x, int n, int cols)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_act_quant(y, x, n, cols, err, sizeof err), err);
}

static void add_rmsnorm(void *ctx, float *x, const float *d, float *y, const float *w, int n,
			int dim, float eps)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	if (c->rc == WK_OK)
		ok(c, wk_cuda_add_rmsnorm(x, d, y, w, n, dim, eps, err, sizeof err), err);
}

/* ---- memory --------------------------------------------------------------------------------- */

/* ---- the GLM ops (glm_kernels.cu) ---- */

/* Runs one kernel call `call` (which reports into err) unless the context has failed. */
#define RUN(call)                                           \
	do {                                                \
		struct cuda_ctx *c = (struct cuda_ctx *)ctx; \
		char err[WK_ERRSZ];                         \
		if (c->rc == WK_OK)                         \
			ok(c, call, err);                   \
	} while (0)

static void layernorm(void *ctx, float *y, const float *x, const float *w, const float *b, int n,
		      int dim, float eps)
{
	RUN(wk_cuda_layernorm(y, x, w, b, n, dim, eps, err, sizeof err));
}

static void moe_route(void *ctx, int *idx, float *wt, const float *logits, const float *bias,
		      int n, const struct be_route *r)
{
	RUN(wk_cuda_moe_route(idx, wt, logits, bias, n, r->n_experts, r->top_k, r->n_group,
			      r->topk_group, r->norm, r->scale, err, sizeof err));
}

static void gather_rows(void *ctx, float *dst, const float *src, const int *rows, int n, int dim)
{
	RUN(wk_cuda_gather_rows(dst, src, rows, n, dim, err, sizeof err));
}

static void scatter_add_rows(void *ctx, float *y, const float *x, const int *rows,
			     const float *scale, int n, int dim)
{
	RUN(wk_cuda_scatter_add_rows(y, x, rows, scale, n, dim, err, sizeof err));
}

static void mla_absorb_q(void *ctx, float *qa, const float *q, const struct be_weight *kv_b,
			 int n, int n_heads, int d_nope, int d_rope, int d_v)
{
	RUN(wk_cuda_mla_absorb_q(qa, q, kv_b->data, kv_b->dtype, kv_b->scale, kv_b->cols, n,
				 n_heads, d_nope, d_rope, d_v, 0, n_heads, err, sizeof err));
}

static void mla_absorb_out(void *ctx, float *o, const float *lat, const struct be_weight *kv_b,
			   int n, int n_heads, int d_nope, int d_v)
{
	RUN(wk_cuda_mla_absorb_out(o, lat, kv_b->data, kv_b->dtype, kv_b->scale, kv_b->cols, n,
				   n_heads, d_nope, d_v, 0, n_heads, err, sizeof err));
}

/* The kernels' form of an MLA attention's description. */
static struct cpu_mla to_cpu_mla(const struct be_mla *s)
{
	struct cpu_mla m;
	memset(&m, 0, sizeof m);
	m.n_heads = s->n_heads;
	m.d_a = s->d_a;
	m.d_b = s->d_b;
	m.d_v = s->d_v;
	m.kv = s->kv;
	m.k_a = s->k_a;
	m.k_b = s->k_b;
	m.v = s->v;
	m.a_s = s->a_s;
	m.ka_stride = s->ka_stride;
	m.ka_head = s->ka_head;
	m.kb_stride = s->kb_stride;
	m.v_stride = s->v_stride;
	m.v_head = s->v_head;
	m.sel = s->sel;
	m.nsel = s->nsel;
	m.sel_stride = s->sel_stride;
	m.scale = s->scale;
	m.seq = s->seq;
	m.pos = s->pos;
	m.seq_rows = s->seq_rows;
	m.keys_max = s->keys_max;
	return m;
}


/* dsa_topk scores a group of queries at once in the backend's own scratch: up to DSA_GROUPS
 * rows of pos0 + n floats, within DSA_BUDGET floats (a 4,096-token prefill at 16K keys
 * fits whole). Grown when a step needs more, its rows then as long as the next power of two
 * keys, DSA_KEYS_MIN at least: cudaFree and cudaMalloc wait for the device, and a batched
 * decode step's rows grow by a key a step, so growing them to fit would stall every step
 * (it did, where the sequences' prefills had made it smaller: short prompts, long answers);
 * where that fails, the engine's scratch, one query at a time. */
#define DSA_GROUPS 4096
#define DSA_BUDGET ((size_t)64 << 20)
#define DSA_KEYS_MIN 1024
#define DSA_HIST_ROWS 256 /* decode steps of up to 256 sequences: 4 MiB of bin counts */

/* The zeroed counters, made on first use; NULL (the failure kept) when CUDA refuses. */
static unsigned *counters(struct cuda_ctx *c)
{
	size_t bytes = (DSA_GROUPS + WK_CHAIN_SYNC) * sizeof(unsigned);
	if (!c->dsa_count &&
	    (!ok_cuda(c, cudaMalloc((void **)&c->dsa_count, bytes), "counters") ||
	     !ok_cuda(c, cudaMemset(c->dsa_count, 0, bytes), "counters")))
		return NULL;
	return c->dsa_count;
}

/* The parts of a split attention (wk_cuda_attention) in the backend's own scratch, sized for
 * the widest split of the call's shape at any context (so a decode does not grow it position
 * by position), up to ATT_PART_MAX floats; grown when a shape needs more (cudaMalloc and
 * cudaFree wait for the device: a rare, load-time-like cost), the old one kept where that
 * fails (fewer parts: the same result, less spread over the device). Its counters are the
 * last-block kernels' (counters()). */
#define ATT_PART_MAX ((size_t)4 << 20)

/* The split scratch for a call that would use need floats of parts now and want at any
 * context (0: it does not split), in *sp; false (c->rc set) where the counters could not be
 * made. */
static bool att_scratch(struct cuda_ctx *c, size_t need, size_t want, struct wk_att_split *sp)
{
	*sp = (struct wk_att_split){NULL, 0, NULL, 0};
	if (!need)
		return true;
	want = want < ATT_PART_MAX ? want : ATT_PART_MAX;
	float *p;
	if (want > c->att_cap && want != c->att_refused) {
		if (cudaMalloc((void **)&p, want * sizeof(float)) == cudaSuccess) {
			cudaFree(c->att_part);
			c->att_part = p;
			c->att_cap = want;
		} else {
			cudaGetLastError(); /* out of memory: the old one, fewer parts */
			c->att_refused = want;
		}
	}
	unsigned *count = counters(c);
	*sp = (struct wk_att_split){c->att_part, c->att_cap, count, DSA_GROUPS};
	return count != NULL;
}

static void attention(void *ctx, float *out, const float *q, const struct be_gqa *b, int n,
		      int pos0)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	const struct cpu_gqa s = {b->k, b->v, b->ks, b->vs, b->kv, b->n_heads, b->n_kv,
				  b->head_dim, b->kv_stride, b->scale, b->seq, b->pos,
				  b->seq_rows, b->keys_max};
	struct wk_att_split sp;
	if (c->rc != WK_OK || !att_scratch(c, wk_cuda_attention_part(&s, n, pos0),
					   wk_cuda_attention_part(&s, n, -1), &sp))
		return;
	ok(c, wk_cuda_attention(out, q, &s, n, pos0, sp.part ? &sp : NULL, err, sizeof err), err);
}

/* MLA's attention splits as GQA's, in the same scratch (a model has one or the other). */
static bool mla_scratch(struct cuda_ctx *c, const struct cpu_mla *m, int n, int pos0,
			struct wk_att_split *sp)
{
	return c->rc == WK_OK && att_scratch(c, wk_cuda_mla_part(m, n, pos0),
					     wk_cuda_mla_part(m, n, -1), sp);
}

static void mla_attention(void *ctx, float *out, const float *q, const struct be_mla *s, int n,
			  int pos0)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct cpu_mla m = to_cpu_mla(s);
	struct wk_att_split sp;
	if (!mla_scratch(c, &m, n, pos0, &sp))
		return;
	ok(c, wk_cuda_mla_attention(out, q, &m, n, pos0, 0, n, 0, s->n_heads,
				    sp.part ? &sp : NULL, err, sizeof err),
	   err);
}

/* mla_absorbed's stages always count on the counters, split or not. */
static void mla_absorbed(void *ctx, float *o, float *qa, float *lat, const float *q,
			 const struct be_weight *kv_b, const struct be_mla *s, int n, int pos0,
			 int d_nope, int d_v)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct cpu_mla m = to_cpu_mla(s);
	struct wk_att_split sp;
	if (!mla_scratch(c, &m, n, pos0, &sp))
		return;
	if (!sp.count && !(sp.count = counters(c)))
		return;
	sp.count_n = DSA_GROUPS;
	ok(c, wk_cuda_mla_absorbed(o, qa, lat, q, kv_b->data, kv_b->dtype, kv_b->scale,
				   kv_b->cols, &m, n, pos0, d_nope, d_v, &sp, err, sizeof err),
	   err);
}

static void dsa_topk(void *ctx, int *sel, int *nsel, const float *q, const float *w,
		     const struct be_dsa *b, int n, int pos0, float *scores, void *work)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	(void)work;
	if (c->rc != WK_OK || n <= 0)
		return;
	if (!counters(c))
		return;
	const struct cpu_dsa d = {b->k, b->ks, b->kv, b->n_heads, b->head_dim, b->topk,
				  b->qk_scale, b->w_scale, b->seq, b->pos, b->seq_rows,
				  b->keys_max};
	/* a score row: the most keys of a query */
	size_t row = d.seq ? (size_t)(d.keys_max > 0 ? d.keys_max : 1) : (size_t)pos0 + n;
	size_t rows = n < DSA_GROUPS ? (size_t)n : DSA_GROUPS;
	if (rows * row > DSA_BUDGET)
		rows = DSA_BUDGET / row > 0 ? DSA_BUDGET / row : 1;
	if (c->dsa_cap < rows * row && rows > 1) {
		size_t keys = DSA_KEYS_MIN;
		while (keys < row)
			keys *= 2;
		size_t want = rows * keys <= DSA_BUDGET ? rows * keys : rows * row;
		cudaFree(c->dsa_scores);
		c->dsa_scores = NULL;
		c->dsa_cap = 0;
		if (cudaMalloc((void **)&c->dsa_scores, want * sizeof(float)) == cudaSuccess)
			c->dsa_cap = want;
		else
			cudaGetLastError(); /* out of memory: the engine's scratch below */
	}
	bool own = c->dsa_cap >= row;
	if (!c->dsa_hist && !c->dsa_hist_refused) { /* made once; refused: the select counts */
		size_t hb = (size_t)DSA_HIST_ROWS * WK_DSA_BINS * sizeof(unsigned);
		if (cudaMalloc((void **)&c->dsa_hist, hb) != cudaSuccess) {
			cudaGetLastError();
			c->dsa_hist = NULL;
			c->dsa_hist_refused = true;
		} else if (!ok_cuda(c, cudaMemset(c->dsa_hist, 0, hb), "dsa bin counts")) {
			return;
		}
	}
	ok(c, wk_cuda_dsa_topk(sel, nsel, q, w, &d, n, pos0, own ? c->dsa_scores : scores,
			       own ? c->dsa_cap : row, c->dsa_count, DSA_GROUPS, c->dsa_hist,
			       DSA_HIST_ROWS, err, sizeof err),
	   err);
}

/* Grouped MoE (moe_kernels.cu): the layer's table of expert weight pointers is copied to the
 * device once, at bind; the shared expert's pointers travel by value with each launch. Each
 * call is 3 launches. */
static int moe_bind(void *ctx, struct be_experts *ex, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	static_assert(sizeof(struct be_expert) == sizeof(struct cpu_expert),
		      "struct be_expert must have struct cpu_expert's layout");
	void *d;
	int rc = own_upload(c, ex->experts, (size_t)ex->n_local * sizeof(struct cpu_expert), &d, err,
			    errsz);
	if (rc == WK_OK)
		ex->dev = d;
	return rc;
}

/* From this many tokens the grouped experts' combine is a launch of its own: the combine
 * inside the down launch counts every slot with an atomic from every row block (a decode
 * step's few; a 4,096-token prefill's some 25 million a layer), where one more launch costs a
 * prefill nothing. Both ways give the same bits (test_cuda). */
#define MOE_SPLIT_TOKENS 64

static struct wk_moe moe_layer(const struct be_experts *ex, int n)
{
	struct wk_moe m = {};
	m.split_combine = n >= MOE_SPLIT_TOKENS;
	m.experts = (const struct cpu_expert *)ex->dev;
	m.ex0 = ex->ex0;
	m.n_local = ex->n_local;
	m.wdt = ex->dtype;
	m.dim = ex->dim;
	m.inter = ex->inter;
	m.shared = (const struct cpu_expert *)ex->shared;
	m.shared_wdt = ex->shared_dtype;
	m.shared_inter = ex->shared_inter;
	return m;
}

static size_t moe_scratch(void *ctx, int n, const struct be_experts *ex)
{
	(void)ctx;
	struct wk_moe m = moe_layer(ex, n);
	return wk_cuda_moe_experts_scratch(n, ex->top_k, &m);
}

static void moe_experts(void *ctx, float *y, const float *x, const int *idx, const float *wt,
			int n, const struct be_experts *ex, void *scratch)
{
	struct wk_moe m = moe_layer(ex, n);
	RUN(wk_cuda_moe_experts(y, x, idx, wt, n, ex->top_k, &m, scratch, err, sizeof err));
}

static void moe_route_experts(void *ctx, float *y, const float *x, const float *logits,
			      const float *bias, const struct be_route *r, int *idx, float *wt,
			      int n, const struct be_experts *ex, void *scratch)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	unsigned *count = c->rc == WK_OK ? counters(c) : NULL;
	struct wk_moe m = moe_layer(ex, n);
	if (count)
		ok(c, wk_cuda_moe_route_experts(y, x, logits, bias, r->n_experts, r->n_group,
						r->topk_group, r->norm, r->scale, idx, wt, n,
						ex->top_k, &m, scratch, count, err, sizeof err),
		   err);
}

static void zero(void *ctx, void *dst, size_t bytes)
{
	RUN(wk_cuda_zero(dst, bytes, err, sizeof err));
}

/* Allocations and frees run on the context's device whatever the calling thread's current
 * one is (a sharded restore allocates every rank's image from one thread), and leave the
 * thread's current device as they found it. Should the device not be selected, nothing is
 * allocated (on another device it would be). */
static cudaError_t dev_enter(const struct cuda_ctx *c, int *prev)
{
	if (cudaGetDevice(prev) != cudaSuccess)
		*prev = -1;
	return *prev == c->device ? cudaSuccess : cudaSetDevice(c->device);
}

static void dev_leave(const struct cuda_ctx *c, int prev)
{
	if (prev >= 0 && prev != c->device)
		cudaSetDevice(prev);
}

static void *mem_alloc(void *ctx, size_t bytes)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	void *p = NULL;
	int prev;
	if (dev_enter(c, &prev) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
		cudaGetLastError(); /* the caller reports it (out of memory), not sticky */
		p = NULL;
	}
	dev_leave(c, prev);
	return p;
}

static int mem_info(void *ctx, size_t *free_b, size_t *total_b, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	int prev;
	cudaError_t e = dev_enter(c, &prev);
	if (e == cudaSuccess)
		e = cudaMemGetInfo(free_b, total_b);
	dev_leave(c, prev);
	if (e != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "cuda: device %d: cudaMemGetInfo: %s", c->device,
			       cudaGetErrorString(e));
	return WK_OK;
}

static void mem_free(void *ctx, void *p)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (!p)
		return;
	int prev;
	dev_enter(c, &prev);
	cudaFree(p);
	dev_leave(c, prev);
}

static void to_device(void *ctx, void *dst, const void *host, size_t bytes)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK)
		ok_cuda(c, cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "copy to device");
}

static void to_host(void *ctx, void *host, const void *src, size_t bytes)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK)
		ok_cuda(c, cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
	else
		memset(host, 0, bytes); /* the step fails at sync; leave nothing uninitialised */
}

static void copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK)
		ok_cuda(c, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "device copy");
}

static void copy_2d(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
		    size_t width, size_t height)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK && width && height)
		ok_cuda(c, cudaMemcpy2D(dst, dpitch, src, spitch, width, height,
					cudaMemcpyDeviceToDevice), "device copy (2-D)");
}

/* ---- the snapshot restore's staging (engine/backend.h): pinned buffers, one copy stream,
 * an event per buffer recorded after each copy from it. Called from the reader threads, each
 * of which must select the device first (the current device is per thread). ---- */

static long stage_find(struct cuda_ctx *c, const void *host) /* under stage_mu */
{
	for (size_t i = 0; i < c->n_stages; i++)
		if (c->stages[i].host == host)
			return (long)i;
	return -1;
}

/* Adds host (with an event of this device, the current one) to the table, making the copy
 * stream on first use; -1 when out of memory or CUDA refuses. Under stage_mu. */
static long stage_add(struct cuda_ctx *c, void *host, bool borrowed)
{
	cudaEvent_t ev;
	if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	bool ok_ = true;
	if (!c->copy_stream &&
	    cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking) != cudaSuccess) {
		cudaGetLastError();
		c->copy_stream = NULL;
		ok_ = false;
	}
	if (ok_ && c->n_stages == c->cap_stages) {
		size_t cap = c->cap_stages ? 2 * c->cap_stages : 16;
		struct stage *s = (struct stage *)realloc(c->stages, cap * sizeof *s);
		if (s) {
			c->stages = s;
			c->cap_stages = cap;
		} else {
			ok_ = false;
		}
	}
	if (!ok_) {
		cudaEventDestroy(ev);
		return -1;
	}
	c->stages[c->n_stages] = {host, ev, borrowed};
	return (long)c->n_stages++;
}

static void *stage_alloc(void *ctx, size_t bytes)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	void *p = NULL;
	/* portable: every device's copies read it as pinned memory (a sharded restore) */
	if (cudaSetDevice(c->device) != cudaSuccess ||
	    cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	pthread_mutex_lock(&c->stage_mu);
	long i = stage_add(c, p, false);
	pthread_mutex_unlock(&c->stage_mu);
	if (i < 0) {
		cudaFreeHost(p);
		return NULL;
	}
	return p;
}

static void stage_free(void *ctx, void *host)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	pthread_mutex_lock(&c->stage_mu);
	long i = stage_find(c, host);
	struct stage s = {};
	if (i >= 0) {
		s = c->stages[i];
		c->stages[i] = c->stages[--c->n_stages];
	}
	pthread_mutex_unlock(&c->stage_mu);
	if (i < 0)
		return;
	cudaSetDevice(c->device);
	cudaEventSynchronize(s.done);
	cudaEventDestroy(s.done);
	if (!s.borrowed)
		cudaFreeHost(s.host);
}

static int stage_put(void *ctx, void *dst, const void *host, size_t bytes, char *err,
		     size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	cudaError_t e = cudaSetDevice(c->device);
	pthread_mutex_lock(&c->stage_mu);
	long i = stage_find(c, host);
	if (i < 0 && e == cudaSuccess) /* another device's buffer: registered here */
		i = stage_add(c, (void *)host, true);
	if (i >= 0 && e == cudaSuccess)
		e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->copy_stream);
	if (i >= 0 && e == cudaSuccess)
		e = cudaEventRecord(c->stages[i].done, c->copy_stream);
	pthread_mutex_unlock(&c->stage_mu);
	if (i < 0 && e == cudaSuccess)
		return wk_errf(err, errsz, WK_ENOMEM, "CUDA: no room to stage copies to device %d",
			       c->device);
	if (e != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "CUDA: copying %zu restored bytes to device %d: "
			       "%s", bytes, c->device, cudaGetErrorString(e));
	return WK_OK;
}

static int stage_wait(void *ctx, const void *host, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	pthread_mutex_lock(&c->stage_mu);
	long i = stage_find(c, host);
	cudaEvent_t ev = i >= 0 ? c->stages[i].done : NULL;
	pthread_mutex_unlock(&c->stage_mu);
	if (i < 0) /* no copy from it on this device */
		return WK_OK;
	cudaError_t e = cudaSetDevice(c->device);
	if (e == cudaSuccess)
		e = cudaEventSynchronize(ev);
	if (e != cudaSuccess)
		return wk_errf(err, errsz, WK_EIO, "CUDA: waiting for restored bytes on device %d: "
			       "%s", c->device, cudaGetErrorString(e));
	return WK_OK;
}

/* A device copy of bytes at host, kept until shutdown. */
static int own_upload(struct cuda_ctx *c, const void *host, size_t bytes, void **out, char *err,
		      size_t errsz)
{
	if (c->n_owned == c->cap_owned) {
		size_t cap = c->cap_owned ? 2 * c->cap_owned : 256;
		void **p = (void **)realloc(c->owned, cap * sizeof *p);
		if (!p)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		c->owned = p;
		c->cap_owned = cap;
	}
	void *d = NULL;
	int prev;
	cudaError_t e = dev_enter(c, &prev);
	if (e == cudaSuccess)
		e = cudaMalloc(&d, bytes ? bytes : 1);
	if (e == cudaSuccess) {
		e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
		if (e != cudaSuccess)
			cudaFree(d);
	}
	dev_leave(c, prev);
	if (e != cudaSuccess)
		return wk_errf(err, errsz, e == cudaErrorMemoryAllocation ? WK_ENOMEM : WK_EIO,
			       "CUDA: uploading %zu bytes of weights: %s", bytes,
			       cudaGetErrorString(e));
	c->owned[c->n_owned++] = d;
	*out = d;
	return WK_OK;
}

static int upload_weight(void *ctx, struct be_weight *w, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	void *d;
	size_t bytes = (size_t)w->rows * w->cols * dt_size(w->dtype);
	int rc = own_upload(c, w->data, bytes, &d, err, errsz);
	if (rc != WK_OK)
		return rc;
	w->data = d;
	if (w->scale) {
		size_t sb = (size_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128) * sizeof(float);
		if ((rc = own_upload(c, w->scale, sb, &d, err, errsz)) != WK_OK)
			return rc;
		w->scale = (const float *)d;
	}
	return WK_OK;
}

/* A sharded engine drives every GPU from one process, rank r's ops on rank r's thread: the
 * rank's thread makes its device current before them (shard.c, each step and at close). */
static void attach(void *ctx)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK)
		ok_cuda(c, cudaSetDevice(c->device), "selecting the device");
}

static int dev_sync(void *ctx, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc == WK_OK)
		ok_cuda(c, cudaDeviceSynchronize(), "kernel");
	if (c->rc != WK_OK)
		return wk_errf(err, errsz, c->rc, "the CUDA backend failed: %s", c->err);
	return WK_OK;
}

/* ---- the op clock (engine/count.c's op times) ------------------------------------------------ */

extern cudaStream_t wk_compute_stream; /* kernels.cu: the stream every launch names */

/* An event recorded on the compute stream after the work issued so far; MARKS of them,
 * created at their first use and reused (the counter reads them, mark 0 carried over). */
static int mark(void *ctx)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (c->rc != WK_OK || c->n_marks >= MARKS)
		return -1;
	if (!c->marks && !(c->marks = (cudaEvent_t *)calloc(MARKS, sizeof *c->marks)))
		return -1;
	cudaEvent_t *ev = &c->marks[c->n_marks];
	if ((!*ev && !ok_cuda(c, cudaEventCreate(ev), "creating a timing event")) ||
	    !ok_cuda(c, cudaEventRecord(*ev, wk_compute_stream), "recording a timing event"))
		return -1;
	return c->n_marks++;
}

static int marks_ms(void *ctx, float *ms, int n, char *err, size_t errsz)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	if (n != c->n_marks)
		return wk_errf(err, errsz, WK_EINVAL, "CUDA marks_ms: %d marks asked for, %d made",
			       n, c->n_marks);
	if (n > 0 && ok_cuda(c, cudaEventSynchronize(c->marks[n - 1]), "waiting for a mark"))
		for (int i = 0; i + 1 < n; i++)
			if (!ok_cuda(c, cudaEventElapsedTime(&ms[i], c->marks[i], c->marks[i + 1]),
				     "timing between marks"))
				break;
	if (c->rc != WK_OK)
		return wk_errf(err, errsz, c->rc, "the CUDA backend failed: %s", c->err);
	if (n > 1) { /* the last mark is the next ones' first */
		cudaEvent_t t = c->marks[0];
		c->marks[0] = c->marks[n - 1];
		c->marks[n - 1] = t;
	}
	c->n_marks = n > 0;
	return WK_OK;
}

/* ---- chained launches ---------------------------------------------------------------------- */

/* The links as the chained launch (wk_cuda_chain) takes them, into wl [count], their MoE
 * counters sync; false where it cannot take them: a matmul whose rotations the GEMV's store
 * cannot make (mm_parts leaves some for a rope_n), a MoE op that takes the grouped GEMMs or
 * a combine of its own (64 tokens and more), or more than WK_CHAIN_MAX kernel links (a MoE
 * op is 3). */
static bool chain_links(const struct be_link *l, int count, struct wk_link *wl, unsigned *sync)
{
	int nk = 0;
	bool apart = false; /* a link the chained launch cannot take */
	for (int i = 0; i < count && !apart; i++) {
		const struct be_link *k = &l[i];
		struct wk_link *q = &wl[i];
		memset(q, 0, sizeof *q);
		q->n = k->n;
		nk += k->kind == BE_LINK_MOE ? WK_CHAIN_MOE_LINKS : 1;
		if (k->kind == BE_LINK_MOE) {
			q->kind = WK_LINK_MOE;
			q->moe = moe_layer(k->ex, k->n);
			apart = !wk_cuda_chain_moe(k->n, &q->moe);
			q->moe_y = k->y_moe;
			q->moe_x = k->x_moe;
			q->logits = k->logits;
			q->bias = k->bias;
			q->n_experts = k->route.n_experts;
			q->n_group = k->route.n_group;
			q->topk_group = k->route.topk_group;
			q->norm_w = k->route.norm;
			q->scale = k->route.scale;
			q->idx = k->idx;
			q->wt = k->wt;
			q->top_k = k->ex->top_k;
			q->scratch = k->scratch;
			q->count = sync;
		} else if (k->kind == BE_LINK_MATMUL) {
			struct wk_rope rest[WK_MATMUL_MAX];
			q->kind = WK_LINK_MATMUL;
			apart = mm_parts(q->mm, k->y, k->w, k->count, k->n, k->rope ? k->r : NULL,
					 k->theta, rest) > 0;
			q->mm_count = k->count;
			q->cols = k->count > 0 ? k->w[0]->cols : 0;
			q->x = k->x_in;
		} else if (k->kind == BE_LINK_ADD_RMSNORM) {
			q->kind = WK_LINK_ADD_RMSNORM;
			q->ax = k->x;
			q->ay = k->y_norm;
			q->d = k->d;
			q->w = k->w_norm;
			q->dim = k->dim;
			q->eps = k->eps;
		} else if (k->kind == BE_LINK_CAST) {
			q->kind = WK_LINK_CAST;
			q->cast_count = k->n_cast;
			memcpy(q->cast, k->cast,
			       (size_t)(k->n_cast > 0 && k->n_cast <= WK_CAST_MAX ? k->n_cast : 0) *
				       sizeof(struct wk_cast));
		} else {
			q->kind = WK_LINK_NORM;
			q->norm_count = k->n_norm;
			apart |= !wk_norms(q->norm, k->norm, k->n_norm);
		}
	}
	return !apart && nk <= WK_CHAIN_MAX;
}

/* The links as one launch, or (chain_links refusing them) op by op. */
static void chain_run(void *ctx, const struct be_link *l, int count)
{
	struct cuda_ctx *c = (struct cuda_ctx *)ctx;
	char err[WK_ERRSZ];
	struct wk_link wl[WK_CHAIN_MAX];
	static_assert(WK_CHAIN_MAX == BE_CHAIN_MAX, "chain limits differ");
	if (c->rc != WK_OK)
		return;
	if (count < 1 || count > WK_CHAIN_MAX) {
		ok(c, wk_errf(err, sizeof err, WK_EINVAL, "CUDA chain: %d links (1..%d)", count,
			      WK_CHAIN_MAX), err);
		return;
	}
	unsigned *sync = counters(c);
	if (!sync)
		return;
	if (!chain_links(l, count, wl, sync)) {
		be_chain_each(&be_cuda, ctx, l, count);
		return;
	}
	ok(c, wk_cuda_chain(wl, count, sync + DSA_GROUPS, err, sizeof err), err);
}

/* A matmul link with a weight that gemv_route sends to the tensor-core GEMV. */
static bool link_mma(const struct cuda_ctx *c, const struct be_link *k)
{
	return k->kind == BE_LINK_MATMUL && k->count >= 1 && k->count <= WK_MATMUL_MAX &&
	       any_route(c, k->x_in, k->w, k->count, k->n);
}

/* How chain runs the links (backend member chain_plan): the GEMVs that gemv_route takes each
 * on their own (matmul_n, matmul_rope_n), the runs of two or more links between them chained
 * (the whole chain when there are none, even of one link), a lone link between them on its
 * own, and a run chain_links refuses op by op. */
static int chain_plan(void *ctx, const struct be_link *l, int count, int *seg)
{
	const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
	struct wk_link wl[WK_CHAIN_MAX];
	int s = 0, runs = 0;
	for (int i = 0; i <= count; i++) {
		bool mma = i < count && c->gemv_mma && link_mma(c, &l[i]);
		if (i < count && !mma)
			continue;
		int len = i - s; /* the run [s, i) before this GEMV, or before the end */
		bool one = len > 1 || (i == count && s == 0 && len > 0);
		one = one && len <= WK_CHAIN_MAX && chain_links(l + s, len, wl, NULL);
		for (int k = s; k < i; k++)
			seg[k] = one ? runs : -1;
		runs += one;
		if (mma)
			seg[i] = -1;
		s = i + 1;
	}
	return runs;
}

/* The links as chain_plan says: its chained runs through chain_run, the rest one by one. */
static void chain(void *ctx, const struct be_link *l, int count)
{
	int seg[BE_CHAIN_MAX];
	if (count < 1 || count > BE_CHAIN_MAX) {
		chain_run(ctx, l, count); /* which names the count */
		return;
	}
	chain_plan(ctx, l, count, seg);
	for (int i = 0, j; i < count; i = j) {
		for (j = i + 1; seg[i] >= 0 && j < count && seg[j] == seg[i]; j++)
			;
		if (seg[i] >= 0)
			chain_run(ctx, l + i, j - i);
		else
			be_chain_each(&be_cuda, ctx, l + i, 1);
	}
}

static struct backend make_backend(void)
{
	struct backend b;
	memset(&b, 0, sizeof b);
	b.name = "cuda";
	b.init = init;
	b.shutdown = shutdown;
	b.supports = supports;
	b.matmul = matmul;
	b.matmul_n = matmul_n;
	b.matmul_rope_n = matmul_rope_n;
	b.matmul_launches = matmul_launches;
	b.add_rmsnorm = add_rmsnorm;
	b.chain = chain;
	b.chain_plan = chain_plan;
	b.act_quant = act_quant;
	b.matmul_fp8act = matmul_fp8act;
	b.matmul_fp8w = matmul_fp8w;
	b.argmax = argmax;
	b.sample_cand = sample_cand;
	b.rope_n = rope_n;
	b.norm_n = norm_n;
	b.rmsnorm = rmsnorm;
	b.rope = rope;
	b.attention = attention;
	b.silu_mul = silu_mul;
	b.add = add;
	b.cast_n = cast_n;
	b.layernorm = layernorm;
	b.moe_route = moe_route;
	b.gather_rows = gather_rows;
	b.scatter_add_rows = scatter_add_rows;
	b.mla_absorb_q = mla_absorb_q;
	b.mla_absorb_out = mla_absorb_out;
	b.mla_attention = mla_attention;
	b.mla_absorbed = mla_absorbed;
	b.dsa_topk = dsa_topk;
	b.zero = zero;
	b.moe_bind = moe_bind;
	b.moe_scratch = moe_scratch;
	b.moe_experts = moe_experts;
	b.moe_route_experts = moe_route_experts;
	b.mem_alloc = mem_alloc;
	b.mem_free = mem_free;
	b.mem_info = mem_info;
	b.to_device = to_device;
	b.to_host = to_host;
	b.copy = copy;
	b.copy_2d = copy_2d;
	b.upload_weight = upload_weight;
	b.stage_alloc = stage_alloc;
	b.stage_free = stage_free;
	b.stage_put = stage_put;
	b.stage_wait = stage_wait;
	b.attach = attach;
	b.sync = dev_sync;
	b.mark = mark;
	b.marks_ms = marks_ms;
	return b;
}

extern "C" const struct backend be_cuda = make_backend();
