/*
 * fast.c - the threaded CPU kernels: split the work over the pool, then run the AVX2 inner
 * loops (fast_avx2.c) when the CPU has them, or portable scalar loops when it does not.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h"

/* ---- CPU features ------------------------------------------------------------------------ */

static bool detect_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return false;
	bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
	     f16c = c & (1u << 29);
	if (!(fma && osxsave && avx && f16c))
		return false;
	unsigned xlo, xhi;
	__asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
	if ((xlo & 6u) != 6u) /* the OS saves XMM and YMM state */
		return false;
	if (__get_cpuid_max(0, NULL) < 7)
		return false;
	__cpuid_count(7, 0, a, b, c, d);
	return b & (1u << 5);
#else
	return false;
#endif
}

static atomic_int cached = -1; /* -1 unknown, 0 no, 1 yes; racing initialisers agree */

bool cpu_has_avx2(void)
{
	int v = atomic_load_explicit(&cached, memory_order_relaxed);
	if (v < 0) {
		v = detect_avx2() ? 1 : 0;
		atomic_store_explicit(&cached, v, memory_order_relaxed);
	}
	return v == 1;
}

void cpu_force_scalar(bool on)
{
	atomic_store(&cached, on ? 0 : (detect_avx2() ? 1 : 0));
}

/* ---- matmul ------------------------------------------------------------------------------ */

struct mm_job {
	float *y;
	const float *x;
	const float *xp; /* x packed for the AVX2 batched path, or NULL */
	size_t xs;
	const void *w;
	enum dt_type wt;
	int n, rows, cols;
	int rows_per_task;
	bool avx2;
};

/* The portable fallback: the reference loops over a block of rows. */
static void matmul_rows_scalar(const struct mm_job *j, int r0, int r1)
{
	size_t esz = dt_size(j->wt);
	const char *w = (const char *)j->w + (size_t)r0 * j->cols * esz;
	for (int t = 0; t < j->n; t++) {
		float tmp[64];
		for (int r = r0; r < r1; r += 64) {
			int nr = r1 - r < 64 ? r1 - r : 64;
			cpu_ref_matmul(tmp, j->x + (size_t)t * j->cols,
				       w + (size_t)(r - r0) * j->cols * esz, j->wt, 1, nr, j->cols);
			for (int i = 0; i < nr; i++)
				j->y[(size_t)t * j->rows + r + i] = tmp[i];
		}
	}
}

static void matmul_task(void *ctx, int task, int ntasks)
{
	(void)ntasks;
	const struct mm_job *j = ctx;
	int r0 = task * j->rows_per_task;
	int r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
	if (r0 >= r1)
		return;
	if (j->avx2)
		cpu_matmul_rows_avx2(j->y, j->x, j->xp, j->xs, j->w, j->wt, j->n, j->rows, j->cols,
				     r0, r1);
	else
		matmul_rows_scalar(j, r0, r1);
}

/* Tasks are contiguous row ranges, a multiple of 4 rows (the AVX2 block), about 4 per thread
 * so that a thread slowed by another process does not hold the others up, but no smaller
 * than ~32 KiB of weights, below which dispatch costs more than it saves. */
void cpu_matmul(struct cpu_pool *p, float *y, const float *x, const void *w, enum dt_type wt,
		int n, int rows, int cols)
{
	if (n <= 0 || rows <= 0)
		return;
	struct mm_job j = {y, x, NULL, 0, w, wt, n, rows, cols, rows, cpu_has_avx2()};
	float *xp = j.avx2 ? cpu_pack_x_avx2(x, wt, n, cols, &j.xs) : NULL;
	j.xp = xp;
	int threads = cpu_pool_size(p);
	if (threads > 1) {
		size_t row_bytes = (size_t)cols * dt_size(wt) * (size_t)n;
		int min_rows = (int)(32768 / (row_bytes ? row_bytes : 1)) + 1;
		int per = (rows + threads * 4 - 1) / (threads * 4);
		if (per < min_rows)
			per = min_rows;
		per = (per + 3) & ~3;
		j.rows_per_task = per;
	}
	int ntasks = (rows + j.rows_per_task - 1) / j.rows_per_task;
	cpu_pool_run(p, matmul_task, &j, ntasks);
	free(xp);
}

/* ---- attention --------------------------------------------------------------------------- */

/* Element d of position t's row of one kv head, the row at element at: FP8 times its
 * block's scale, s the head's first row's scales and ss the scales' stride a position */
static inline float head_el(const void *c, enum dt_type kv, const float *s, size_t ss, int t,
			    size_t at, int d)
{
	if (kv == DT_F8_E4M3)
		return dt_e4m3_table[((const uint8_t *)c)[at + (size_t)d]] *
		       s[(size_t)t * ss + (size_t)(d / CPU_FP8_BLOCK)];
	return cpu_kv_at(c, kv, at + (size_t)d);
}

/* Online softmax over chunks of CPU_ATTN_CHUNK scores: the output row accumulates the
 * weighted values and is rescaled whenever a chunk raises the running maximum. */
static void attention_head_scalar(float *out, const float *q, const void *k, const void *v,
				  const float *ks, const float *vs, size_t ss, enum dt_type kv,
				  int len, int head_dim, int kv_stride, float scale)
{
	float s[CPU_ATTN_CHUNK];
	float max = -INFINITY, sum = 0.0f;
	for (int d = 0; d < head_dim; d++)
		out[d] = 0.0f;
	for (int t0 = 0; t0 < len; t0 += CPU_ATTN_CHUNK) {
		int m = len - t0 < CPU_ATTN_CHUNK ? len - t0 : CPU_ATTN_CHUNK;
		float cmax = -INFINITY;
		for (int t = 0; t < m; t++) {
			size_t kt = (size_t)(t0 + t) * kv_stride;
			float acc = 0.0f;
			for (int d = 0; d < head_dim; d++)
				acc += q[d] * head_el(k, kv, ks, ss, t0 + t, kt, d);
			s[t] = acc * scale;
			if (s[t] > cmax)
				cmax = s[t];
		}
		if (cmax > max) {
			float f = expf(max - cmax); /* 0 on the first chunk */
			for (int d = 0; d < head_dim; d++)
				out[d] *= f;
			sum *= f;
			max = cmax;
		}
		for (int t = 0; t < m; t++) {
			float pr = expf(s[t] - max);
			size_t vt = (size_t)(t0 + t) * kv_stride;
			sum += pr;
			for (int d = 0; d < head_dim; d++)
				out[d] += pr * head_el(v, kv, vs, ss, t0 + t, vt, d);
		}
	}
	for (int d = 0; d < head_dim; d++)
		out[d] /= sum;
}

struct attn_job {
	float *out;
	const float *q;
	const struct cpu_gqa *s;
	int pos0;
	bool avx2;
};

static void attention_task(void *ctx, int task, int ntasks)
{
	(void)ntasks;
	const struct attn_job *j = ctx;
	const struct cpu_gqa *s = j->s;
	int i = task / s->n_heads, h = task % s->n_heads, hd = s->head_dim;
	size_t koff = (size_t)(h / (s->n_heads / s->n_kv)) * hd;
	size_t qoff = ((size_t)i * s->n_heads + h) * hd;
	size_t r0 = cpu_gqa_base(s, i); /* the token's sequence's row 0 */
	int len = cpu_gqa_len(s, i, j->pos0);
	size_t at = r0 * (size_t)s->kv_stride + koff;
	const void *k = cpu_kv_ptr(s->k, s->kv, at), *v = cpu_kv_ptr(s->v, s->kv, at);
	const float *ks = NULL, *vs = NULL;
	size_t ss = 0; /* FP8: the head's scales at position 0, their stride a position */
	if (s->kv == DT_F8_E4M3) {
		size_t nb = (size_t)cpu_kv_blocks(hd);
		ks = cpu_kv_scales(s->ks, at / (size_t)hd, hd);
		vs = cpu_kv_scales(s->vs, at / (size_t)hd, hd);
		ss = (size_t)(s->kv_stride / hd) * nb;
	}
	if (j->avx2)
		cpu_attention_head_avx2(j->out + qoff, j->q + qoff, k, v, ks, vs, ss, s->kv, len,
					hd, s->kv_stride, s->scale);
	else
		attention_head_scalar(j->out + qoff, j->q + qoff, k, v, ks, vs, ss, s->kv, len, hd,
				      s->kv_stride, s->scale);
}

void cpu_attention(struct cpu_pool *p, float *out, const float *q, const struct cpu_gqa *s,
		   int n, int pos0)
{
	struct attn_job j = {out, q, s, pos0, cpu_has_avx2()};
	cpu_pool_run(p, attention_task, &j, n * s->n_heads);
}
