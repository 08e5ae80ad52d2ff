/*
 * fp8_bench.c - how fast cpu_matmul_fp8 streams FP8 weights, against the machine's read
 * bandwidth measured in the same run, and how the candidate e4m3 decoders compare.
 *
 *   fp8_bench [--threads T] [--mib M] [--cols C] [--seconds S] [--variants] [--bf16]
 *
 * Main figure: y[rows] = x[cols] . dequant(w)^T at n = 1 (a decode step) on an M MiB
 * (default 512) e4m3 matrix with 128x128 block scales; weight GB/s = weight bytes per call /
 * seconds per call. The read bandwidth (cpu_read_bandwidth, 1 GiB) is measured in 7 rounds
 * alternating with the matmul (S seconds in all, default 7), because on a shared host the
 * load changes from second to second: it prints the best of each and the median ratio.
 *
 * --variants also times, single-threaded on an L2-resident matrix (the decode's arithmetic
 * cost alone) and with all threads on the big matrix, four n = 1 inner loops:
 *   f16     the library's kernel (fp8_avx2.c: vpmovsxbw, shift, and, vcvtph2ps)
 *   f32x    the f32 bit trick: (code << 20) with the sign moved to bit 31, times 2^120 as a
 *           float (e4m3 subnormals become f32 denormals, exact without DAZ)
 *   gather  a 256-entry f32 table read with vpgatherdd
 *   bias*   exponent rebias in bf16 words, integer ops only: WRONG for zero and subnormal
 *           codes, so only an upper bound for integer decoding (its diff is not 0)
 * The in-L2 column compares decoding cost; in the memory column only f16 (the library)
 * prefetches, so the others trail it there for that reason too.
 * --bf16 times cpu_matmul on a bf16 matrix of the same element count, for comparison.
 *
 * Not a test: it prints numbers and checks only that the variants agree with each other.
 */
#include <getopt.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fp8_int.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

static void *big_alloc(size_t bytes)
{
	size_t align = 2u << 20;
	void *p = aligned_alloc(align, (bytes + align - 1) / align * align);
#ifdef MADV_HUGEPAGE
	if (p)
		madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
	return p;
}

/* ---- candidate n = 1 inner loops (cols a multiple of 128, rows of 4) --------------------- */

enum variant { V_F16, V_F32X, V_GATHER, V_BIAS, V_COUNT };
static const char *vnames[V_COUNT] = {"f16", "f32x", "gather", "bias*"};

AVX2 static inline float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* 8 codes at p as f32: exact for every finite code */
AVX2 static inline __m256 dec8_f32x(const uint8_t *p)
{
	__m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
	v = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32((int)0x87f00000u));
	return _mm256_mul_ps(_mm256_castsi256_ps(v), _mm256_set1_ps(0x1p120f));
}

AVX2 static inline __m256 dec8_gather(const uint8_t *p)
{
	__m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
	return _mm256_i32gather_ps(dt_e4m3_table, v, 4);
}

/* 16 codes as f32 by rebiasing the exponent in bf16 words ((code << 4) + (120 << 7), then
 * widened by unpacking with zeros, so the halves hold columns 0-3,8-11 and 4-7,12-15).
 * WRONG for the e = 0 codes (zero and subnormals): an upper bound on what integer-only
 * decoding could reach, not a candidate as it stands. */
AVX2 static inline void dec16_bias(const uint8_t *p, __m256 *w0, __m256 *w1)
{
	__m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
	v = _mm256_add_epi16(_mm256_and_si256(_mm256_slli_epi16(v, 4), _mm256_set1_epi16((short)0x87f0)),
			     _mm256_set1_epi16(0x3c00));
	*w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
	*w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}

/* rows [r0, r1), r0 and r1 multiples of 4; one of the variants other than f16, inlined
 * with v constant so that each gets the code it would get on its own */
AVX2 static inline __attribute__((always_inline)) void rows_variant(enum variant v, float *y, const float *x, const uint8_t *w,
			      const float *scale, int cols, int r0, int r1)
{
	int sc = cols / 128;
	for (int r = r0; r < r1; r += 4) {
		const uint8_t *row = w + (size_t)r * cols;
		const float *srow = scale + (size_t)(r / 128) * sc;
		__m256 acc[4];
		for (int i = 0; i < 4; i++)
			acc[i] = _mm256_setzero_ps();
		for (int b = 0; b < sc; b++) {
			__m256 b0[4], b1[4];
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				b0[i] = b1[i] = _mm256_setzero_ps();
			for (int c = b * 128; c < b * 128 + 128; c += 16) {
				__m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
				if (v == V_BIAS) {
					__m256 a = x0;
					x0 = _mm256_permute2f128_ps(a, x1, 0x20);
					x1 = _mm256_permute2f128_ps(a, x1, 0x31);
				}
#pragma GCC unroll 4
				for (int i = 0; i < 4; i++) {
					const uint8_t *p = row + (size_t)i * cols + c;
					__m256 w0, w1;
					if (v == V_BIAS) {
						dec16_bias(p, &w0, &w1);
					} else {
						w0 = v == V_F32X ? dec8_f32x(p) : dec8_gather(p);
						w1 = v == V_F32X ? dec8_f32x(p + 8) : dec8_gather(p + 8);
					}
					b0[i] = _mm256_fmadd_ps(w0, x0, b0[i]);
					b1[i] = _mm256_fmadd_ps(w1, x1, b1[i]);
				}
			}
			__m256 s = _mm256_set1_ps(srow[b]);
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				acc[i] = _mm256_fmadd_ps(_mm256_add_ps(b0[i], b1[i]), s, acc[i]);
		}
		for (int i = 0; i < 4; i++)
			y[r + i] = hsum(acc[i]);
	}
}

AVX2 static void rows_f32x(float *y, const float *x, const uint8_t *w, const float *scale,
			   int cols, int r0, int r1)
{
	rows_variant(V_F32X, y, x, w, scale, cols, r0, r1);
}

AVX2 static void rows_gather(float *y, const float *x, const uint8_t *w, const float *scale,
			     int cols, int r0, int r1)
{
	rows_variant(V_GATHER, y, x, w, scale, cols, r0, r1);
}

AVX2 static void rows_bias(float *y, const float *x, const uint8_t *w, const float *scale,
			   int cols, int r0, int r1)
{
	rows_variant(V_BIAS, y, x, w, scale, cols, r0, r1);
}

struct vjob {
	enum variant v;
	float *y;
	const float *x;
	const uint8_t *w;
	const float *scale;
	int rows, cols, per;
};

static void vtask(void *ctx, int task, int ntasks)
{
	(void)ntasks;
	const struct vjob *j = ctx;
	int r0 = task * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
	if (j->v == V_F16)
		cpu_fp8_rows_avx2(j->y, j->x, j->w, j->scale, 1, j->rows, j->cols, r0, r1);
	else if (j->v == V_F32X)
		rows_f32x(j->y, j->x, j->w, j->scale, j->cols, r0, r1);
	else if (j->v == V_GATHER)
		rows_gather(j->y, j->x, j->w, j->scale, j->cols, r0, r1);
	else
		rows_bias(j->y, j->x, j->w, j->scale, j->cols, r0, r1);
}

static void run_variant(struct cpu_pool *p, enum variant v, float *y, const float *x,
			const uint8_t *w, const float *scale, int rows, int cols)
{
	int ntasks = cpu_pool_size(p) * 4;
	int per = ((rows + ntasks - 1) / ntasks + 3) & ~3;
	struct vjob j = {v, y, x, w, scale, rows, cols, per};
	cpu_pool_run(p, vtask, &j, (rows + per - 1) / per);
}

/* ---- timing ------------------------------------------------------------------------------ */

/* Seconds per call of fn, over at least `seconds` after one untimed call. */
#define TIME_CALLS(seconds, call)                                                          \
	({                                                                                  \
		call;                                                                       \
		long calls_ = 0;                                                            \
		double t0_ = wk_now(), t_;                                                  \
		do {                                                                        \
			call;                                                               \
			calls_++;                                                           \
		} while ((t_ = wk_now() - t0_) < (seconds));                                \
		t_ / (double)calls_;                                                        \
	})

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* This thread's CPU time in seconds: the single-threaded in-cache timings use it, so that
 * other processes on a shared host do not count against them. */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The best of 10 runs of TIME_CALLS-like loops of `call`, in thread CPU seconds per call. */
#define CPU_TIME_BEST(seconds, call)                                                       \
	({                                                                                  \
		double best_ = 1e30;                                                        \
		for (int rep_ = 0; rep_ < 10; rep_++) {                                     \
			long calls_ = 0;                                                    \
			double t0_ = cpu_now(), t_;                                         \
			do {                                                                \
				call;                                                       \
				calls_++;                                                   \
			} while ((t_ = cpu_now() - t0_) < (seconds) / 10);                  \
			if (t_ / (double)calls_ < best_)                                    \
				best_ = t_ / (double)calls_;                                \
		}                                                                           \
		best_;                                                                      \
	})

static void usage(void)
{
	fprintf(stderr, "usage: fp8_bench [--threads T] [--mib M] [--cols C] [--seconds S] "
			"[--variants] [--bf16]\n");
}

int main(int argc, char **argv)
{
	int threads = 2, mib = 512, cols = 6144;
	double seconds = 7.0;
	bool variants = false, bf16 = false;
	static const struct option opts[] = {
		{"threads", required_argument, 0, 't'}, {"mib", required_argument, 0, 'm'},
		{"cols", required_argument, 0, 'c'},    {"seconds", required_argument, 0, 's'},
		{"variants", no_argument, 0, 'v'},       {"bf16", no_argument, 0, 'b'},
		{0, 0, 0, 0}};
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (o) {
		case 't': threads = atoi(optarg); break;
		case 'm': mib = atoi(optarg); break;
		case 'c': cols = atoi(optarg); break;
		case 's': seconds = atof(optarg); break;
		case 'v': variants = true; break;
		case 'b': bf16 = true; break;
		default: usage(); return 2;
		}
	}
	if (mib <= 0 || cols <= 0 || cols % 128 || seconds <= 0) {
		usage();
		fprintf(stderr, "--cols must be a positive multiple of 128\n");
		return 2;
	}
	struct cpu_pool *pool;
	if (cpu_pool_create(threads, &pool) != WK_OK) {
		fprintf(stderr, "fp8_bench: cannot start %d threads\n", threads);
		return 1;
	}
	threads = cpu_pool_size(pool);
	int rows = (int)(((size_t)mib << 20) / (size_t)cols) & ~127;
	if (rows < 128) {
		fprintf(stderr, "fp8_bench: --mib too small for %d columns\n", cols);
		return 2;
	}
	size_t wbytes = (size_t)rows * cols;
	int sc = cols / 128, sr = rows / 128;
	uint8_t *w = big_alloc(wbytes);
	float *x = malloc((size_t)cols * sizeof *x), *y = malloc((size_t)rows * sizeof *y);
	float *y2 = malloc((size_t)rows * sizeof *y2);
	float *scale = malloc((size_t)sr * sc * sizeof *scale);
	if (!w || !x || !y || !y2 || !scale) {
		fprintf(stderr, "fp8_bench: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < wbytes; i++) {
		uint8_t b = (uint8_t)next_u32();
		w[i] = (b & 0x7f) == 0x7f ? 0x38 : b; /* every finite code, 5% subnormal */
	}
	for (int i = 0; i < cols; i++)
		x[i] = (float)(next_u32() >> 8) / (float)(1 << 24) - 0.5f;
	for (int i = 0; i < sr * sc; i++)
		scale[i] = 1e-3f * (1.0f + (float)(next_u32() >> 8) / (float)(1 << 24));

	printf("fp8_bench: %d threads, avx2 %s, matrix %d x %d e4m3 = %.0f MiB\n", threads,
	       cpu_has_avx2() ? "yes" : "no", rows, cols, (double)wbytes / (1 << 20));
	/* Rounds of (read bandwidth, then the matmul), so that both see the same machine: on a
	 * shared host the load changes from second to second. Report the best of each and the
	 * median of the per-round ratios. */
	enum { ROUNDS = 7 };
	double bws[ROUNDS], fps[ROUNDS], ratios[ROUNDS], bw = 0.0, gbps = 0.0;
	cpu_matmul_fp8(pool, y, x, w, scale, 1, rows, cols); /* page in */
	for (int i = 0; i < ROUNDS; i++) {
		bws[i] = cpu_read_bandwidth(pool, (size_t)1 << 30, seconds / ROUNDS);
		double t = TIME_CALLS(seconds / ROUNDS,
				      cpu_matmul_fp8(pool, y, x, w, scale, 1, rows, cols));
		fps[i] = (double)wbytes / t / 1e9;
		ratios[i] = fps[i] / bws[i];
		bw = fmax(bw, bws[i]);
		gbps = fmax(gbps, fps[i]);
		printf("  round %d: read %.2f GB/s, cpu_matmul_fp8 n=1 %.2f GB/s (%.2f ms), "
		       "ratio %.2f\n",
		       i, bws[i], fps[i], (double)wbytes / fps[i] / 1e6, ratios[i]);
	}
	qsort(ratios, ROUNDS, sizeof ratios[0], cmp_double);
	double ratio = ratios[ROUNDS / 2];
	printf("cpu_matmul_fp8 n=1: best %.2f GB/s of FP8 weights; read bandwidth best %.2f GB/s;"
	       " median ratio %.2f\n",
	       gbps, bw, ratio);

	double side = fmax(1.0, seconds / ROUNDS); /* for the side measurements */
	/* small batches (an MoE expert's tokens of a prompt) and a prefill-sized one: each
	 * weight is read once per call and used by every token */
	static const int batch[] = {2, 4, 16};
	for (size_t bi = 0; bi < sizeof batch / sizeof batch[0]; bi++) {
		int n = batch[bi];
		float *xn = malloc((size_t)n * cols * sizeof *xn),
		      *yn = malloc((size_t)n * rows * sizeof *yn);
		if (!xn || !yn)
			return 1;
		for (int i = 0; i < n; i++)
			memcpy(xn + (size_t)i * cols, x, (size_t)cols * sizeof *x);
		double tn = TIME_CALLS(side, cpu_matmul_fp8(pool, yn, xn, w, scale, n, rows, cols));
		printf("cpu_matmul_fp8 n=%d: %.2f ms/call, %.2f GB/s of weights, %.2f GFLOP/s\n", n,
		       tn * 1e3, (double)wbytes / tn / 1e9, 2.0 * n * wbytes / tn / 1e9);
		free(xn);
		free(yn);
	}

	if (bf16) {
		uint16_t *wb = big_alloc(wbytes * 2);
		if (!wb)
			return 1;
		for (size_t i = 0; i < wbytes; i++)
			wb[i] = dt_f32_to_bf16(dt_e4m3_to_f32(w[i]) * 1e-3f);
		double tb = TIME_CALLS(side, cpu_matmul(pool, y2, x, wb, DT_BF16, 1, rows, cols));
		printf("cpu_matmul bf16 n=1 (same shape): %.2f ms/call, %.2f GB/s of weights\n",
		       tb * 1e3, 2.0 * wbytes / tb / 1e9);
		free(wb);
	}

	if (variants && cpu_has_avx2()) {
		int small_rows = 256, small_cols = 1024; /* 256 KiB: in L2 */
		printf("\ndecoder variants, n=1 (GB/s of FP8 weights)\n");
		printf("%-8s %18s %22s\n", "variant", "1 thread, in L2 (*)", "all threads, memory");
		for (int v = 0; v < V_COUNT; v++) {
			double ts = CPU_TIME_BEST(side, run_variant(NULL, (enum variant)v, y2, x, w,
									 scale, small_rows, small_cols));
			double tm = TIME_CALLS(side, run_variant(pool, (enum variant)v, y2, x, w,
								    scale, rows, cols));
			double worst = 0.0, ymax = 0.0;
			cpu_matmul_fp8(pool, y, x, w, scale, 1, rows, cols);
			for (int r = 0; r < rows; r++) {
				worst = fmax(worst, fabs((double)y2[r] - y[r]));
				ymax = fmax(ymax, fabs(y[r]));
			}
			printf("%-8s %18.2f %22.2f   (max |diff| / max |y| = %.1e)\n", vnames[v],
			       (double)small_rows * small_cols / ts / 1e9, (double)wbytes / tm / 1e9,
			       worst / ymax);
		}
	}
	if (variants && cpu_has_avx2())
		printf("(*) best of 10, in thread CPU time\n");
	printf("{\"threads\":%d,\"rows\":%d,\"cols\":%d,\"fp8_gbps\":%.3f,\"read_gbps\":%.3f,"
	       "\"ratio\":%.3f}\n",
	       threads, rows, cols, gbps, bw, ratio);
	free(w);
	free(x);
	free(y);
	free(y2);
	free(scale);
	cpu_pool_destroy(pool);
	return 0;
}
