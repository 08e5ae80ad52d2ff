/*
 * cuda_none.c - the CUDA backend's entry in a build without nvcc (or with CUDA=0): it exists
 * so that --backend cuda fails with a clear message instead of a missing symbol.
 */
#include "common/wk.h"
#include "engine/backend.h"

static int init(void **ctx, const struct be_config *cfg, char *err, size_t errsz)
{
	(void)ctx;
	(void)cfg;
	return wk_errf(err, errsz, WK_EUNSUPPORTED,
		       "this wick was built without CUDA (nvcc not found, or CUDA=0)");
}

static bool supports(void *ctx, enum be_op op, enum dt_type wt)
{
	(void)ctx;
	(void)op;
	(void)wt;
	return false;
}

const struct backend be_cuda = {.name = "cuda", .init = init, .supports = supports};

int cuda_device_count(void)
{
	return 0;
}

/* ---- cuda_kernels.h without CUDA: every call is refused ---- */

#include "kernels/cuda/cuda_kernels.h"

static int none(char *err, size_t errsz)
{
	return wk_errf(err, errsz, WK_EUNSUPPORTED, "this wick was built without CUDA");
}

int wk_cuda_alloc(void **p, size_t bytes, char *err, size_t errsz)
{
	(void)bytes;
	*p = NULL;
	return none(err, errsz);
}

void wk_cuda_free(void *p)
{
	(void)p;
}

int wk_cuda_upload(void *dst, const void *src, size_t bytes, char *err, size_t errsz)
{
	(void)dst, (void)src, (void)bytes;
	return none(err, errsz);
}

int wk_cuda_download(void *dst, const void *src, size_t bytes, char *err, size_t errsz)
{
	(void)dst, (void)src, (void)bytes;
	return none(err, errsz);
}

int wk_cuda_sync(char *err, size_t errsz)
{
	return none(err, errsz);
}

int wk_cuda_matmul(float *y, const float *x, const void *w, enum dt_type wt, int n, int rows,
		   int cols, char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)wt, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_matmul_fp8(float *y, const float *x, const uint8_t *w, const float *scale, int n,
		       int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)scale, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_matmul_n(const struct wk_mm *parts, int count, const float *x, int n, int cols,
		     char *err, size_t errsz)
{
	(void)parts, (void)count, (void)x, (void)n, (void)cols;
	return none(err, errsz);
}

int wk_cuda_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps,
		    char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)n, (void)dim, (void)eps;
	return none(err, errsz);
}

int wk_cuda_rope(float *x, int n, const int *pos, int n_heads, int head_dim, int rot_dim,
		 float theta, bool interleaved, char *err, size_t errsz)
{
	(void)x, (void)n, (void)pos, (void)n_heads, (void)head_dim, (void)rot_dim, (void)theta,
		(void)interleaved;
	return none(err, errsz);
}

size_t wk_cuda_attention_part(const struct cpu_gqa *s, int n, int pos0)
{
	(void)s, (void)n, (void)pos0;
	return 0;
}

int wk_cuda_attention(float *out, const float *q, const struct cpu_gqa *s, int n, int pos0,
		      const struct wk_att_split *sp, char *err, size_t errsz)
{
	(void)out, (void)q, (void)s, (void)n, (void)pos0, (void)sp;
	return none(err, errsz);
}

int wk_cuda_attention_path(const struct cpu_gqa *s, int n, int pos0)
{
	(void)s, (void)n, (void)pos0;
	return 1;
}

void wk_cuda_attention_force(int path)
{
	(void)path;
}

int wk_cuda_dsa_path(const struct cpu_dsa *d, int n, int pos0)
{
	(void)d, (void)n, (void)pos0;
	return 1;
}

void wk_cuda_dsa_force(int path)
{
	(void)path;
}

void wk_cuda_dsa_cap(int cap)
{
	(void)cap;
}

int wk_cuda_cast_n(const struct wk_cast *c, int count, char *err, size_t errsz)
{
	(void)c, (void)count;
	return none(err, errsz);
}

int wk_cuda_silu_mul(float *g, const float *u, size_t n, char *err, size_t errsz)
{
	(void)g, (void)u, (void)n;
	return none(err, errsz);
}

int wk_cuda_norm_n(const struct wk_norm *r, int count, char *err, size_t errsz)
{
	(void)r, (void)count;
	return none(err, errsz);
}

int wk_cuda_rope_n(const struct wk_rope *r, int count, float theta, bool interleaved, char *err,
		   size_t errsz)
{
	(void)r, (void)count, (void)theta, (void)interleaved;
	return none(err, errsz);
}

int wk_cuda_act_quant(float *y, const float *x, int n, int cols, char *err, size_t errsz)
{
	(void)y, (void)x, (void)n, (void)cols;
	return none(err, errsz);
}

int wk_cuda_add_rmsnorm(float *x, const float *d, float *y, const float *w, int n, int dim,
			float eps, char *err, size_t errsz)
{
	(void)x, (void)d, (void)y, (void)w, (void)n, (void)dim, (void)eps;
	return none(err, errsz);
}

int wk_cuda_chain(const struct wk_link *l, int count, unsigned *sync, char *err, size_t errsz)
{
	(void)l, (void)count, (void)sync;
	return none(err, errsz);
}

bool wk_cuda_chain_moe(int n, const struct wk_moe *m)
{
	(void)n, (void)m;
	return false;
}

int wk_cuda_add(float *y, const float *x, size_t n, char *err, size_t errsz)
{
	(void)y, (void)x, (void)n;
	return none(err, errsz);
}

int wk_cuda_argmax(int *idx, const float *logits, int n, int vocab, char *err, size_t errsz)
{
	(void)idx, (void)logits, (void)n, (void)vocab;
	return none(err, errsz);
}

int wk_cuda_sample_cand(struct cpu_cand *cand, struct cpu_cand_head *head, const float *logits,
			const struct cpu_samp *s, int n, int vocab, int cap, char *err,
			size_t errsz)
{
	(void)cand, (void)head, (void)logits, (void)s, (void)n, (void)vocab, (void)cap;
	return none(err, errsz);
}

int wk_cuda_zero(void *y, size_t bytes, char *err, size_t errsz)
{
	(void)y, (void)bytes;
	return none(err, errsz);
}

int wk_cuda_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim,
		      float eps, char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)b, (void)n, (void)dim, (void)eps;
	return none(err, errsz);
}

int wk_cuda_moe_route(int *idx, float *wt, const float *logits, const float *bias, int n,
		      int n_experts, int top_k, int n_group, int topk_group, bool norm,
		      float scale, char *err, size_t errsz)
{
	(void)idx, (void)wt, (void)logits, (void)bias, (void)n, (void)n_experts, (void)top_k,
		(void)n_group, (void)topk_group, (void)norm, (void)scale;
	return none(err, errsz);
}

int wk_cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int dim,
			char *err, size_t errsz)
{
	(void)dst, (void)src, (void)rows, (void)n, (void)dim;
	return none(err, errsz);
}

int wk_cuda_scatter_add_rows(float *y, const float *x, const int *rows, const float *scale,
			     int n, int dim, char *err, size_t errsz)
{
	(void)y, (void)x, (void)rows, (void)scale, (void)n, (void)dim;
	return none(err, errsz);
}

int wk_cuda_mla_absorb_q(float *qa, const float *q, const void *w, enum dt_type wt,
			 const float *scale, int lora, int n, int n_heads, int d_nope, int d_rope,
			 int d_v, int h0, int h1, char *err, size_t errsz)
{
	(void)qa, (void)q, (void)w, (void)wt, (void)scale, (void)lora, (void)n, (void)n_heads,
		(void)d_nope, (void)d_rope, (void)d_v, (void)h0, (void)h1;
	return none(err, errsz);
}

int wk_cuda_mla_absorb_out(float *o, const float *lat, const void *w, enum dt_type wt,
			   const float *scale, int lora, int n, int n_heads, int d_nope, int d_v,
			   int h0, int h1, char *err, size_t errsz)
{
	(void)o, (void)lat, (void)w, (void)wt, (void)scale, (void)lora, (void)n, (void)n_heads,
		(void)d_nope, (void)d_v, (void)h0, (void)h1;
	return none(err, errsz);
}

int wk_cuda_mla_attention(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
			  int i0, int i1, int h0, int h1, const struct wk_att_split *sp, char *err,
			  size_t errsz)
{
	(void)out, (void)q, (void)s, (void)n, (void)pos0, (void)i0, (void)i1, (void)h0, (void)h1,
		(void)sp;
	return none(err, errsz);
}

bool wk_cuda_mla_tiles(const struct cpu_mla *s, int n, int pos0, int i0, int i1, int h0,
		       int h1)
{
	(void)s, (void)n, (void)pos0, (void)i0, (void)i1, (void)h0, (void)h1;
	return false;
}

int wk_cuda_mla_tiled(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
		      char *err, size_t errsz)
{
	(void)out, (void)q, (void)s, (void)n, (void)pos0;
	return none(err, errsz);
}

bool wk_cuda_mla_latent_tiles(const struct cpu_mla *s, int n, int pos0, int i0, int i1,
			      int h0, int h1)
{
	(void)s, (void)n, (void)pos0, (void)i0, (void)i1, (void)h0, (void)h1;
	return false;
}

int wk_cuda_mla_latent(float *out, const float *q, const struct cpu_mla *s, int n, int pos0,
		       char *err, size_t errsz)
{
	(void)out, (void)q, (void)s, (void)n, (void)pos0;
	return none(err, errsz);
}

void wk_cuda_mla_force(int gm)
{
	(void)gm;
}

void wk_cuda_mla_shape(const struct cpu_mla *s, int n, int nh, int pos0, int *gm, int *split)
{
	(void)s, (void)n, (void)nh, (void)pos0;
	*gm = *split = 1;
}

size_t wk_cuda_mla_part(const struct cpu_mla *s, int n, int pos0)
{
	(void)s, (void)n, (void)pos0;
	return 0;
}

int wk_cuda_mla_absorbed(float *o, float *qa, float *lat, const float *q, const void *w,
			 enum dt_type wt, const float *scale, int lora, const struct cpu_mla *s,
			 int n, int pos0, int d_nope, int d_v, const struct wk_att_split *sp,
			 char *err, size_t errsz)
{
	(void)o, (void)qa, (void)lat, (void)q, (void)w, (void)wt, (void)scale, (void)lora, (void)s,
		(void)n, (void)pos0, (void)d_nope, (void)d_v, (void)sp;
	return none(err, errsz);
}

int wk_cuda_dsa_topk(int *sel, int *nsel, const float *q, const float *w,
		     const struct cpu_dsa *d, int n, int pos0, float *scores, size_t score_floats,
		     unsigned *count, int max_group, unsigned *hist, int hist_rows, char *err,
		     size_t errsz)
{
	(void)sel, (void)nsel, (void)q, (void)w, (void)d, (void)n, (void)pos0, (void)scores,
		(void)score_floats, (void)count, (void)max_group, (void)hist, (void)hist_rows;
	return none(err, errsz);
}

size_t wk_cuda_moe_experts_scratch(int n, int top_k, const struct wk_moe *m)
{
	(void)n, (void)top_k, (void)m;
	return 0;
}

int wk_cuda_moe_experts(float *y, const float *x, const int *idx, const float *wt, int n,
			int top_k, const struct wk_moe *m, void *scratch, char *err,
			size_t errsz)
{
	(void)y, (void)x, (void)idx, (void)wt, (void)n, (void)top_k, (void)m, (void)scratch;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
		     const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)xq, (void)xs, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8_wgmma(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			   const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)xq, (void)xs, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8_wgmma_mc2(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			       const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)xq, (void)xs, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8_wgmma_n160(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
				const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)xq, (void)xs, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8_wgmma_n160_mc2(float *y, const uint8_t *xq, const float *xs,
				    const uint8_t *w, const float *ws, int n, int rows, int cols,
				    char *err, size_t errsz)
{
	(void)y, (void)xq, (void)xs, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8_wgmma_ovl(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			       const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	return wk_cuda_gemm_fp8_wgmma(y, xq, xs, w, ws, n, rows, cols, err, errsz);
}

int wk_cuda_gemm_fp8_wgmma_st(float *y, const uint8_t *xq, const float *xs, const uint8_t *w,
			      const float *ws, int n, int rows, int cols, char *err, size_t errsz)
{
	return wk_cuda_gemm_fp8_wgmma(y, xq, xs, w, ws, n, rows, cols, err, errsz);
}

int wk_cuda_set_device(int d, char *err, size_t errsz)
{
	(void)d;
	return none(err, errsz);
}

int wk_cuda_gemv_mma(float *y, const float *x, const void *w, enum dt_type wt,
		     const float *scale, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)wt, (void)scale, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemv_mma3(float *y, const float *x, const void *w, enum dt_type wt,
		      const float *scale, int n, int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)x, (void)w, (void)wt, (void)scale, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

void wk_cuda_set_stream(int per_thread)
{
	(void)per_thread;
}

void wk_cuda_set_pdl(int on)
{
	(void)on;
}

int wk_cuda_late_copy(float *x, const float *src, size_t n, unsigned ns, char *err,
		      size_t errsz)
{
	(void)x, (void)src, (void)n, (void)ns;
	return none(err, errsz);
}

int wk_cuda_lab(const char *only)
{
	(void)only;
	return WK_EUNSUPPORTED;
}

int wk_cuda_moe_route_check(int n_experts, int top_k, int n_group, int topk_group, char *err,
			    size_t errsz)
{
	(void)n_experts, (void)top_k, (void)n_group, (void)topk_group;
	return none(err, errsz);
}

int wk_cuda_moe_route_experts(float *y, const float *x, const float *logits, const float *bias,
			      int n_experts, int n_group, int topk_group, bool norm, float scale,
			      int *idx, float *wt, int n, int top_k, const struct wk_moe *m,
			      void *scratch, unsigned *count, char *err, size_t errsz)
{
	(void)y, (void)x, (void)logits, (void)bias, (void)n_experts, (void)n_group,
		(void)topk_group, (void)norm, (void)scale, (void)idx, (void)wt, (void)n,
		(void)top_k, (void)m, (void)scratch, (void)count;
	return none(err, errsz);
}

int wk_cuda_act_split(uint16_t *xb, const float *x, int n, int cols, char *err, size_t errsz)
{
	(void)xb, (void)x, (void)n, (void)cols;
	return none(err, errsz);
}

int wk_cuda_gemm_fp8w(float *y, const uint16_t *xb, const uint8_t *w, const float *ws, int n,
		      int rows, int cols, char *err, size_t errsz)
{
	(void)y, (void)xb, (void)w, (void)ws, (void)n, (void)rows, (void)cols;
	return none(err, errsz);
}

void wk_cuda_fp8w_mode(int mode)
{
	(void)mode;
}

void wk_cuda_moe_rows_v0(int on)
{
	(void)on;
}

int wk_cuda_act_codes(uint8_t *xq, float *xs, const float *x, int n, int cols, char *err,
		      size_t errsz)
{
	(void)xq, (void)xs, (void)x, (void)n, (void)cols;
	return none(err, errsz);
}
