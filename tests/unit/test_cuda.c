/*
 * test_cuda.c - every CUDA kernel (kernels/cuda/cuda_kernels.h) against its CPU reference
 * (kernels/cpu/cpu.h) on the same random inputs: only the order of the sums differs, so the
 * results must agree within 1e-4 of the largest output (the issue's bound is 1e-3), and the
 * discrete choices (the router's experts, the DSA indexer's positions) exactly. Where no
 * GPU is visible (this machine, or a build without CUDA) each test is skipped with a message;
 * scripts/gpu-check runs them on a GPU machine.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"

#define TOL 1e-4

static char err[WK_ERRSZ];

#define NEED_GPU()                                                                          \
	do {                                                                                \
		if (cuda_device_count() <= 0)                                               \
			cr_skip_test("no CUDA device visible (or a build without CUDA): the " \
				     "kernels are compared on a GPU by scripts/gpu-check");   \
	} while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void) /* uniform in [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rnd_vec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rnd();
	return v;
}

static void *to_dev(const void *host, size_t bytes)
{
	void *d;
	cr_assert_eq(wk_cuda_alloc(&d, bytes, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_upload(d, host, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

/* bytes at device offset off (a fresh allocation of off + bytes); free the returned base */
static void *to_dev_off(const void *host, size_t bytes, int off)
{
	char *d;
	cr_assert_eq(wk_cuda_alloc((void **)&d, bytes + (size_t)off, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(wk_cuda_upload(d + off, host, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

/* Waits for the kernels, then copies bytes from the device. */
static void from_dev(void *host, const void *dev, size_t bytes)
{
	cr_assert_eq(wk_cuda_sync(err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(wk_cuda_download(host, dev, bytes, err, sizeof err), WK_OK, "%s", err);
}

/* max |got - want| / max |want| */
static double rel(const float *got, const float *want, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(isfinite(got[i]), "element %zu is %g", i, got[i]);
		d = fmax(d, fabs((double)got[i] - want[i]));
		m = fmax(m, fabs((double)want[i]));
	}
	return m > 0 ? d / m : d;
}

/* x rounded to bf16 (bits): a bf16 KV cache's copy of an f32 one */
static uint16_t *to_bf16(const float *x, size_t n)
{
	uint16_t *h = malloc(n * sizeof *h);
	cr_assert_not_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = dt_f32_to_bf16(x[i]);
	return h;
}

/* The cache of type kv (DT_F32 or DT_BF16) that x [n] becomes, in host memory: x itself, or
 * its bf16 copy (*own, to free) */
static const void *kv_host(const float *x, size_t n, enum dt_type kv, void **own)
{
	*own = kv == DT_BF16 ? to_bf16(x, n) : NULL;
	return *own ? *own : x;
}

/* x [rows][w] as an FP8 cache, quantized by cpu_ref_cast: its e4m3 codes, and its scales
 * [rows][cpu_kv_blocks(w)] in *scales (both to free) */
static uint8_t *to_fp8(const float *x, size_t rows, int w, float **scales)
{
	uint8_t *c = malloc(rows * (size_t)w);
	*scales = malloc(rows * (size_t)cpu_kv_blocks(w) * sizeof(float));
	cr_assert(c && *scales);
	cpu_ref_cast(c, DT_F8_E4M3, x, DT_F32, rows * (size_t)w, *scales, NULL, w);
	return c;
}

TestSuite(cuda_kernels);

/* Runs fn(arg) in a child process (its stderr silenced: the emulator says where it stopped)
 * and expects it refused: the child killed by a signal (a fault; the emulator's abort) or
 * exiting 1 (an error returned), not exiting 0 (fn did what it must not). */
static void expect_refused(int (*fn)(void *), void *arg, const char *what)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		FILE *null = freopen("/dev/null", "w", stderr);
		(void)null;
		_exit(fn(arg));
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_expect(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 1),
		  "%s (child exit %d)", what, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static int read_device_pointer(void *d)
{
	volatile float v = *(volatile float *)d;
	return v == 1.0f ? 0 : 2; /* 0: it read device memory */
}

/* The host cannot read device memory through a pointer: on a GPU the dereference faults, and
 * the emulator (tests/simt) keeps device memory out of the host's reach between kernels and
 * copies so that it faults there too (simt.cpp: a backend that reads a device pointer on
 * the host fails every emulated run, not only the GPU's). A child process tries. */
Test(cuda_kernels, host_cannot_read_device_memory)
{
	NEED_GPU();
	float *d = to_dev((float[4]){1, 2, 3, 4}, 16);
	expect_refused(read_device_pointer, d, "the host read device memory");
	wk_cuda_free(d);
}

/* silu_mul on device 0 over a buffer of device 1: 0 when it came back done, 1 refused */
static int cross_device_kernel(void *unused)
{
	(void)unused;
	char e[WK_ERRSZ];
	float g[4] = {1, 2, 3, 4}, *d1, *d0;
	if (wk_cuda_set_device(1, e, sizeof e) || wk_cuda_alloc((void **)&d1, 16, e, sizeof e) ||
	    wk_cuda_upload(d1, g, 16, e, sizeof e) || wk_cuda_set_device(0, e, sizeof e) ||
	    wk_cuda_alloc((void **)&d0, 16, e, sizeof e) || wk_cuda_upload(d0, g, 16, e, sizeof e))
		return 2; /* could not set it up */
	int rc = wk_cuda_silu_mul(d0, d1, 4, e, sizeof e);
	if (rc == WK_OK)
		rc = wk_cuda_sync(e, sizeof e);
	return rc == WK_OK ? 0 : 1;
}

/* Nor can a kernel on one GPU read another's memory: wick enables no peer access (a rank's
 * kernels work on its own shard; NCCL moves the rest), so on a GPU such a read is an illegal
 * address, and the emulator keeps a device's memory closed to other devices' kernels
 * (simt.cpp). Needs two devices (the emulator is given two). */
Test(cuda_kernels, kernel_cannot_read_another_devices_memory)
{
	setenv("WICK_SIMT_DEVICES", "2", 0); /* the emulator's device count; nothing on a GPU */
	NEED_GPU();
	if (cuda_device_count() < 2)
		cr_skip_test("needs two GPUs (%d visible)", cuda_device_count());
	expect_refused(cross_device_kernel, NULL, "device 0's kernel read device 1's memory");
}

Test(cuda_kernels, matmul_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 100}, {3, 130, 257}, {8, 256, 2048}, {2, 5, 7}};
	enum dt_type types[] = {DT_F32, DT_BF16, DT_F16};
	for (size_t ti = 0; ti < 3; ti++)
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
			int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
			size_t nw = (size_t)rows * cols, esz = dt_size(types[ti]);
			float *x = rnd_vec((size_t)n * cols), *wf = rnd_vec(nw);
			char *w = malloc(nw * esz);
			for (size_t i = 0; i < nw; i++) {
				if (types[ti] == DT_F32)
					memcpy(w + i * 4, &wf[i], 4);
				else {
					uint16_t h = types[ti] == DT_BF16 ? dt_f32_to_bf16(wf[i])
									  : dt_f32_to_f16(wf[i]);
					memcpy(w + i * 2, &h, 2);
				}
			}
			float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
			cpu_ref_matmul(want, x, w, types[ti], n, rows, cols);
			float *dx = to_dev(x, (size_t)n * cols * 4), *dy;
			void *dw = to_dev(w, nw * esz);
			cr_assert_eq(wk_cuda_alloc((void **)&dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
			cr_assert_eq(wk_cuda_matmul(dy, dx, dw, types[ti], n, rows, cols, err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dy, (size_t)n * rows * 4);
			double r = rel(got, want, (size_t)n * rows);
			cr_expect_leq(r, TOL, "%s n=%d rows=%d cols=%d: %g", dt_name(types[ti]), n, rows,
				      cols, r);
			wk_cuda_free(dx);
			wk_cuda_free(dw);
			wk_cuda_free(dy);
			free(x);
			free(wf);
			free(w);
			free(want);
			free(got);
		}
}

Test(cuda_kernels, matmul_fp8_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 200, 300}, {4, 256, 512}, {2, 130, 129}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
		int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
		size_t nw = (size_t)rows * cols;
		uint8_t *w = malloc(nw);
		for (size_t i = 0; i < nw; i++)
			w[i] = dt_f32_to_e4m3(rnd() * 400.0f);
		float *x = rnd_vec((size_t)n * cols), *scale = rnd_vec((size_t)sr * sc);
		float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
		cpu_ref_matmul_fp8(want, x, w, scale, n, rows, cols);
		float *dx = to_dev(x, (size_t)n * cols * 4), *ds = to_dev(scale, (size_t)sr * sc * 4), *dy;
		uint8_t *dw = to_dev(w, nw);
		cr_assert_eq(wk_cuda_alloc((void **)&dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_matmul_fp8(dy, dx, dw, ds, n, rows, cols, err, sizeof err), WK_OK,
			     "%s", err);
		from_dev(got, dy, (size_t)n * rows * 4);
		double r = rel(got, want, (size_t)n * rows);
		cr_expect_leq(r, TOL, "fp8 n=%d rows=%d cols=%d: %g", n, rows, cols, r);
		wk_cuda_free(dx);
		wk_cuda_free(ds);
		wk_cuda_free(dw);
		wk_cuda_free(dy);
		free(w);
		free(x);
		free(scale);
		free(want);
		free(got);
	}
}

/* The tensor-core GEMV (the lab's v2) against the CPU's matmuls, FP8 and bf16, within 1e-4
 * of the largest output (the bf16 hi/lo split of x keeps ~1e-5): 1..8 tokens, a partial
 * row group and several weight-scale row blocks (300 rows), a warp's run of 3 column blocks
 * (5120 columns over 14 warps: the last load of a pair past its run), one block a warp;
 * 4300 rows take the 32-row blocks (RT = 2), the last with only its first tile's 12 rows.
 * v3 (wk_cuda_gemv_mma3, pipelined through two register stages) on the same shapes, where
 * 5120 columns are a warp's 3 blocks (FP8 16 rows: a stage of 4 steps, the second half
 * past the run) and 4300 x 1664 (8 -> 7 warps of 2 blocks, the last 1) and 17000 x 896
 * (532 row groups: 3 warps of 3 blocks, the last 1, each pass of the loop two 64-column
 * steps) reach its grid's and its stages' ends. */
typedef int (*gemv_mma_fn)(float *, const float *, const void *, enum dt_type, const float *,
			   int, int, int, char *, size_t);
/* the tensor-core GEMVs: v2 and the pipelined v3 (same contract) */
static const struct {
	const char *name;
	gemv_mma_fn fn;
} gemv_mmas[] = {{"v2", wk_cuda_gemv_mma}, {"v3", wk_cuda_gemv_mma3}};

Test(cuda_kernels, gemv_mma_matches_ref)
{
	NEED_GPU();
	/* n, rows, cols, and x's magnitude as a power of two: 2^40 overflowed the FP8 path's
	 * scaling of x (2^100) into bf16's infinity before it was 2^64 */
	static const int shapes[][4] = {{1, 40, 256, 0}, {8, 16, 128, 0}, {3, 130, 384, 0},
					{8, 300, 1024, 0}, {2, 48, 5120, 0}, {5, 64, 2048, 0},
					{8, 4300, 256, 0}, {4, 64, 256, 40}, {4, 64, 256, -40},
					{8, 4300, 1664, 0}, {6, 17000, 896, 0},
					/* v3's FP8 16-row kernel past its first pass of 4 blocks a
					 * warp: 5 blocks (a pass ending part-way), then 10 */
					{3, 64, 10240, 0}, {8, 64, 20480, 0}};
	for (size_t v = 0; v < sizeof gemv_mmas / sizeof gemv_mmas[0]; v++)
		for (int fp8 = 0; fp8 < 2; fp8++)
			for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
				int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
				int sr = (rows + 127) / 128, sc = cols / 128;
				size_t nw = (size_t)rows * cols, esz = fp8 ? 1 : 2;
				unsigned char *w = malloc(nw * esz);
				for (size_t i = 0; i < nw; i++) {
					if (fp8) {
						w[i] = dt_f32_to_e4m3(rnd() * 400.0f);
					} else {
						uint16_t h = dt_f32_to_bf16(rnd());
						memcpy(w + 2 * i, &h, 2);
					}
				}
				float *x = rnd_vec((size_t)n * cols), *scale = rnd_vec((size_t)sr * sc);
				float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
				for (size_t i = 0; i < (size_t)n * cols; i++)
					x[i] = ldexpf(x[i], shapes[s][3]);
				if (fp8)
					cpu_ref_matmul_fp8(want, x, w, scale, n, rows, cols);
				else
					cpu_ref_matmul(want, x, w, DT_BF16, n, rows, cols);
				float *dx = to_dev(x, (size_t)n * cols * 4), *ds = to_dev(scale, (size_t)sr * sc * 4);
				float *dy = to_dev(want, (size_t)n * rows * 4); /* overwritten */
				void *dw = to_dev(w, nw * esz);
				cr_assert_eq(wk_cuda_zero(dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
				cr_assert_eq(gemv_mmas[v].fn(dy, dx, dw, fp8 ? DT_F8_E4M3 : DT_BF16, ds, n, rows,
							     cols, err, sizeof err), WK_OK, "%s", err);
				from_dev(got, dy, (size_t)n * rows * 4);
				double r = rel(got, want, (size_t)n * rows);
				cr_expect_leq(r, 1e-4, "%s %s n=%d rows=%d cols=%d |x| ~2^%d: %g",
					      gemv_mmas[v].name, fp8 ? "fp8" : "bf16", n, rows, cols,
					      shapes[s][3], r);
				wk_cuda_free(dx);
				wk_cuda_free(ds);
				wk_cuda_free(dy);
				wk_cuda_free(dw);
				free(w);
				free(x);
				free(scale);
				free(want);
				free(got);
			}
	/* outside its contract: refused by name, nothing launched */
	for (size_t v = 0; v < sizeof gemv_mmas / sizeof gemv_mmas[0]; v++) {
		gemv_mma_fn fn = gemv_mmas[v].fn;
		cr_expect_eq(fn(NULL, NULL, NULL, DT_BF16, NULL, 9, 16, 128, err, sizeof err),
			     WK_EINVAL);
		cr_expect_eq(fn(NULL, NULL, NULL, DT_BF16, NULL, 1, 16, 100, err, sizeof err),
			     WK_EINVAL);
		cr_expect(strstr(err, "gemv_mma") != NULL, "%s", err);
		cr_expect_eq(fn(NULL, NULL, NULL, DT_F32, NULL, 1, 16, 128, err, sizeof err),
			     WK_EINVAL);
	}
}

/* The GEMV launched as a programmatic dependent (PDL) right after a kernel that writes its x
 * 200 us late, having let dependents start first thing (wk_cuda_late_copy): the GEMV's
 * blocks start during the sleep and load weights, but must read x only after that kernel's
 * end (griddepcontrol.wait), so y is x's new value's product. Without the wait, x's old
 * zeros. v1 and v3 (both programmatic dependents), two tries each. (On a GPU; the emulator
 * runs launches in order, where it passes either way.) */
Test(cuda_kernels, pdl_gemv_waits_for_x)
{
	NEED_GPU();
	const int rows = 4096, cols = 2048, n = 1;
	unsigned char *w = malloc((size_t)rows * cols);
	for (size_t i = 0; i < (size_t)rows * cols; i++)
		w[i] = dt_f32_to_e4m3(rnd() * 100.0f);
	float *x = rnd_vec((size_t)n * cols), *scale = rnd_vec((size_t)(rows / 128) * (cols / 128));
	float *zero = calloc((size_t)n * cols, 4);
	float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
	cpu_ref_matmul_fp8(want, x, w, scale, n, rows, cols);
	float *dsrc = to_dev(x, (size_t)n * cols * 4), *dx = to_dev(zero, (size_t)n * cols * 4);
	float *ds = to_dev(scale, (size_t)(rows / 128) * (cols / 128) * 4);
	float *dy = to_dev(want, (size_t)n * rows * 4); /* overwritten */
	void *dw = to_dev(w, (size_t)rows * cols);
	for (int rep = 0; rep < 4; rep++) {
		cr_assert_eq(wk_cuda_upload(dx, zero, (size_t)n * cols * 4, err, sizeof err), WK_OK);
		/* y too: a GEMV that wrote nothing would leave the try before's right answer */
		cr_assert_eq(wk_cuda_zero(dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_sync(err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_late_copy(dx, dsrc, (size_t)n * cols, 200000, err, sizeof err),
			     WK_OK, "%s", err);
		/* even tries v1 (wk_cuda_matmul_fp8), odd ones v3 (wk_cuda_gemv_mma3) */
		cr_assert_eq(rep % 2 ? wk_cuda_gemv_mma3(dy, dx, dw, DT_F8_E4M3, ds, n, rows, cols, err,
							 sizeof err)
				     : wk_cuda_matmul_fp8(dy, dx, dw, ds, n, rows, cols, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dy, (size_t)n * rows * 4);
		double r = rel(got, want, (size_t)n * rows);
		cr_expect_leq(r, 1e-4, "try %d (%s): the GEMV read x before the kernel writing it "
			      "ended: %g", rep, rep % 2 ? "v3" : "v1", r);
	}
	wk_cuda_free(dsrc);
	wk_cuda_free(dx);
	wk_cuda_free(ds);
	wk_cuda_free(dy);
	wk_cuda_free(dw);
	free(w);
	free(x);
	free(scale);
	free(zero);
	free(want);
	free(got);
}

/* Every e4m3 code but NaN (0x7f, 0xff: zeros here) through the tensor-core GEMVs' widening
 * to bf16, exactly: w[r][c] = code (r + c + 37 (c / 128)) % 256 (no two blocks alike: one
 * block's products taken from another's weights differ), x one-hot in each 128-column block
 * (token t: column 8L + t of every block), scales 1, so y[t][r] is the sum of the codes at
 * those columns, times 1, and must equal their values' sum bit for bit (the mma's products
 * and sums are exact here: multiples of 2^-9 below 2^14 in f32, in any order). 16 launches
 * reach every column of a 128-column block, so each code passes through every byte of a
 * lane's words and every k slot; 256 rows take the 16-row blocks, 4352 the 32-row ones (both
 * tiles); 256 x 4224 gives each warp 3 blocks (v3: its second register stage, half past the
 * run). On a GPU this is the check of the hardware's prmt and of bf16 subnormal inputs to
 * mma (codes 0x01..0x07 and 0x81..0x87 become bf16 subnormals). */
Test(cuda_kernels, gemv_mma_every_e4m3_code)
{
	NEED_GPU();
	static const int shapes[][2] = {{256, 128}, {4352, 128}, {256, 4224}}; /* rows, cols */
	const int n = 8;
	for (size_t v = 0; v < sizeof gemv_mmas / sizeof gemv_mmas[0]; v++)
		for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
			int rows = shapes[k][0], cols = shapes[k][1], kb = cols / 128;
			int ns = (rows + 127) / 128 * kb;
			uint8_t *w = malloc((size_t)rows * cols);
			for (int r = 0; r < rows; r++)
				for (int c = 0; c < cols; c++) {
					uint8_t code = (uint8_t)((r + c + 37 * (c / 128)) % 256);
					w[(size_t)r * cols + c] = (code & 0x7f) == 0x7f ? 0 : code;
				}
			float *scale = malloc((size_t)ns * 4), *x = calloc((size_t)n * cols, 4);
			float *got = malloc((size_t)n * rows * 4);
			for (int i = 0; i < ns; i++)
				scale[i] = 1.0f;
			void *dw = to_dev(w, (size_t)rows * cols);
			float *ds = to_dev(scale, (size_t)ns * 4), *dy = to_dev(got, (size_t)n * rows * 4);
			float *dx = to_dev(x, (size_t)n * cols * 4);
			int bad = 0;
			for (int l = 0; l < 128 / n; l++) {
				memset(x, 0, (size_t)n * cols * 4);
				for (int t = 0; t < n; t++)
					for (int b = 0; b < kb; b++)
						x[(size_t)t * cols + 128 * b + n * l + t] = 1.0f;
				cr_assert_eq(wk_cuda_upload(dx, x, (size_t)n * cols * 4, err, sizeof err), WK_OK);
				cr_assert_eq(wk_cuda_zero(dy, (size_t)n * rows * 4, err, sizeof err), WK_OK);
				cr_assert_eq(gemv_mmas[v].fn(dy, dx, dw, DT_F8_E4M3, ds, n, rows, cols, err,
							     sizeof err), WK_OK, "%s", err);
				from_dev(got, dy, (size_t)n * rows * 4);
				for (int t = 0; t < n; t++)
					for (int r = 0; r < rows; r++) {
						uint8_t code = w[(size_t)r * cols + n * l + t];
						float want = 0.0f, g = got[(size_t)t * rows + r];
						for (int b = 0; b < kb; b++)
							want += dt_e4m3_to_f32(w[(size_t)r * cols + 128 * b + n * l + t]);
						if (g != want && bad++ < 8)
							cr_expect(0, "%s %d x %d, code 0x%02x (row %d, col %d of "
								  "each block): %g, not %g", gemv_mmas[v].name, rows,
								  cols, code, r, n * l + t, g, want);
					}
			}
			cr_expect_eq(bad, 0, "%s %d x %d: %d outputs differ", gemv_mmas[v].name, rows,
				     cols, bad);
			wk_cuda_free(dw);
			wk_cuda_free(ds);
			wk_cuda_free(dy);
			wk_cuda_free(dx);
			free(w);
			free(scale);
			free(x);
			free(got);
		}
}

/* One FP8 GEMM (wk_cuda_gemm_fp8's contract) on n x rows x cols against cpu_ref_gemm_fp8:
 * random finite e4m3 codes and scales, the output poisoned first, within 1e-3. */
static void gemm_fp8_case(int (*gemm)(float *, const uint8_t *, const float *,
				    const uint8_t *, const float *, int, int, int, char *,
				    size_t),
			  const char *name, int n, int rows, int cols, int off)
{
	int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
	size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
	uint8_t *xq = malloc(nx + 1), *w = malloc(nw + 1);
	float *xs = malloc((size_t)n * sc * 4), *ws = malloc((size_t)sr * sc * 4);
	float *want = malloc(ny * 4), *got = malloc(ny * 4);
	cr_assert(xq && w && xs && ws && want && got);
	for (size_t i = 0; i < nx; i++)
		xq[i] = dt_f32_to_e4m3(rnd() * 448.0f);
	for (size_t i = 0; i < nw; i++)
		w[i] = dt_f32_to_e4m3(rnd() * 448.0f);
	for (int i = 0; i < n * sc; i++)
		xs[i] = (rnd() + 1.5f) / 448.0f;
	for (int i = 0; i < sr * sc; i++)
		ws[i] = (rnd() + 1.5f) * 1e-3f;
	cpu_ref_gemm_fp8(want, xq, xs, w, ws, n, rows, cols);
	/* off = 1: both operands one byte past a 16-byte boundary */
	uint8_t *dxq = to_dev_off(xq, nx, off), *dw = to_dev_off(w, nw, off);
	float *dxs = to_dev(xs, (size_t)n * sc * 4), *dws = to_dev(ws, (size_t)sr * sc * 4);
	float *dy;
	cr_assert_eq(wk_cuda_alloc((void **)&dy, ny * 4, err, sizeof err), WK_OK);
	for (size_t i = 0; i < ny; i++)
		got[i] = NAN;
	cr_assert_eq(wk_cuda_upload(dy, got, ny * 4, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(gemm(dy, dxq + off, dxs, dw + off, dws, n, rows, cols, err,
			  sizeof err),
		     WK_OK, "%s: %s", name, err);
	from_dev(got, dy, ny * 4);
	double r = rel(got, want, ny);
	cr_expect_leq(r, 1e-3, "%s n=%d rows=%d cols=%d off=%d: %g", name, n, rows,
		      cols, off, r);
	wk_cuda_free(dxq);
	wk_cuda_free(dw);
	wk_cuda_free(dxs);
	wk_cuda_free(dws);
	wk_cuda_free(dy);
	free(xq);
	free(w);
	free(xs);
	free(ws);
	free(want);
	free(got);
}

/* The FP8 x FP8 GEMM (mma.sync tensor cores) against cpu_ref_gemm_fp8: random finite e4m3
 * codes (subnormals and negatives included) and scales, partial tiles in every dimension
 * (the block tile is 128 x 128, a stage 64 columns), cols % 16 != 0 (the byte-by-byte fill)
 * and misaligned operands too. The tensor cores sum a 128-deep block in another order and,
 * on Hopper, with fewer bits than f32 (the promotion bounds that): within 1e-3. Every output
 * is poisoned first, so an unwritten one fails. */
Test(cuda_kernels, gemm_fp8_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 128},   {7, 200, 300},  {64, 256, 512},
					{130, 200, 512}, {130, 256, 300}, {33, 130, 208},
					{5, 64, 40},     {2, 3, 1}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int off = 0; off < 2; off++)
			if (!off || shapes[s][2] % 16 == 0) /* else already the byte-by-byte path */
				gemm_fp8_case(wk_cuda_gemm_fp8, "gemm_fp8", shapes[s][0],
					      shapes[s][1], shapes[s][2], off);
}

/* The FP8 x FP8 GEMM on Hopper's warpgroup tensor cores (wgmma, gemm_wgmma.cu) against
 * cpu_ref_gemm_fp8, as gemm_fp8_matches_ref: random finite e4m3 codes and scales, partial
 * tiles in every dimension (the block tile is 128 x 128, a stage one 128-deep scale block;
 * 1040 and 1536 columns wrap the TMA kernel's 5-stage ring, 640 the cp.async one's 4), the
 * TMA kernel where cols % 16 == 0 and the operands are aligned, the cp.async one when they
 * are one byte off a 16-byte boundary, ordinary stores when cols % 16 != 0; 600 x 384 makes
 * the TMA kernels' L2-grouped tile order (the emulator's 512 KiB L2: panels of 2 token
 * tiles, here 2, 2 and 1) go round a panel shorter than the others. The TMA-store epilogue
 * (_st) takes the shapes whose rows % 4 == 0 (324: a last tile of 68 weight rows, its third
 * box 4 columns wide and its fourth out of bounds; 36: one tile's two boxes past rows; 600
 * and 200 x 324: blocks with several tiles, so a staging area is reused) and falls back to
 * the plain TMA kernel for 130 and 3 rows (rows * 4 % 16 != 0: no tensor map of y). Within 1e-3;
 * every output is poisoned first. Under the emulator this checks the 128-byte swizzle, the
 * descriptors, the accumulator fragment, the mbarrier protocol and the tensor maps against
 * our reading of the PTX ISA (tests/simt/wgmma.cpp); on a GPU, against the hardware.
 * Both kernels: one CTA a tile, and clusters of two sharing the weight tile (_mc2: its
 * multicast, the remote arrivals; 300 tokens make 3 token tiles, so the second cluster's
 * second CTA has no tokens; the emulator's one cluster loops over 4 pairs of tiles). */
Test(cuda_kernels, gemm_fp8_wgmma_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 128},    {7, 200, 300}, {130, 256, 640},
					{129, 130, 1040}, {33, 130, 208}, {64, 128, 256},
					{70, 256, 1536},  {5, 64, 40},  {2, 3, 1},
					{600, 256, 384},  {200, 324, 256}, {131, 36, 256}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int off = 0; off < 2; off++)
			if (!off || shapes[s][2] % 16 == 0) { /* else already the ordinary stores */
				gemm_fp8_case(wk_cuda_gemm_fp8_wgmma, "gemm_fp8_wgmma",
					      shapes[s][0], shapes[s][1], shapes[s][2], off);
				gemm_fp8_case(wk_cuda_gemm_fp8_wgmma_ovl, "gemm_fp8_wgmma_ovl",
					      shapes[s][0], shapes[s][1], shapes[s][2], off);
				gemm_fp8_case(wk_cuda_gemm_fp8_wgmma_st, "gemm_fp8_wgmma_st",
					      shapes[s][0], shapes[s][1], shapes[s][2], off);
			}
}

Test(cuda_kernels, gemm_fp8_wgmma_mc2_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 128},  {130, 256, 640}, {129, 130, 1040},
					{300, 256, 384}, {70, 256, 1536}, {33, 130, 208}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		gemm_fp8_case(wk_cuda_gemm_fp8_wgmma_mc2, "gemm_fp8_wgmma_mc2", shapes[s][0],
			      shapes[s][1], shapes[s][2], 0);
}

/* The TMA kernel with tiles of 160 weight rows, one CTA a tile and clusters of two: a tile
 * spans two weight-scale blocks, its first from row 160 t % 128 on (500 rows: tiles at 0,
 * 160, 320 and 480, so 128, 96, 64 and 32 rows in the first block; the last tile's second
 * block past the weight's scales), 1040 and 1536 columns wrap the 6-deep ring, 300 tokens
 * give the second cluster's second CTA no tokens. Misaligned operands take the cp.async
 * kernel's 128-row tiles. */
Test(cuda_kernels, gemm_fp8_wgmma_n160_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{1, 64, 128},   {130, 500, 640}, {129, 300, 1040},
					{300, 160, 384}, {70, 320, 1536}, {33, 130, 208}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		gemm_fp8_case(wk_cuda_gemm_fp8_wgmma_n160, "gemm_fp8_wgmma_n160", shapes[s][0],
			      shapes[s][1], shapes[s][2], s == 1);
		gemm_fp8_case(wk_cuda_gemm_fp8_wgmma_n160_mc2, "gemm_fp8_wgmma_n160_mc2",
			      shapes[s][0], shapes[s][1], shapes[s][2], 0);
	}
}


/* max over tokens of max_r |got - want| / max_r |want|: each token's row on its own scale */
static double rel_rows(const float *got, const float *want, int n, int rows)
{
	double worst = 0;
	for (int t = 0; t < n; t++) {
		double r = rel(got + (size_t)t * rows, want + (size_t)t * rows, (size_t)rows);
		worst = fmax(worst, r);
	}
	return worst;
}

/* FP8 weights times f32 activations on the warpgroup tensor cores (gemm_fp8w.cu) against
 * cpu_ref_matmul_fp8, the f32 reference the default (f32-activation) prefill must match:
 * the split first, bit for bit against dt_f32_to_bf16 (hi, lo = bf16(x - hi), zeros in the
 * padding), then the GEMM within 1e-5 of each token row's largest output (the split leaves
 * 2^-16 of each product; dropping lo alone costs ~2^-9). Random finite e4m3 codes
 * (subnormals and negatives included), block scales, activations over 6 binades; partial
 * tiles in every dimension (the block tile is 128 x 128, a stage 64 columns, a scale block
 * two), n from 64 to 300, cols % 16 != 0 (ordinary loads of the codes) and a weight one
 * byte off a 16-byte boundary; every output poisoned first. Under the emulator this checks
 * the bf16 swizzled tiles, descriptors, fragment and promotion against our reading of the
 * PTX ISA (tests/simt/wgmma.cpp); on a GPU, against the hardware. */
Test(cuda_kernels, gemm_fp8w_matches_ref)
{
	NEED_GPU();
	static const int shapes[][3] = {{64, 128, 128},  {65, 200, 300}, {130, 256, 640},
					{129, 130, 1040}, {200, 64, 40},  {300, 384, 512},
					{96, 130, 208},   {70, 3, 1}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int off = 0; off < 2; off++) {
			int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
			if (off && cols % 16 != 0)
				continue; /* already the ordinary-load path */
			int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
			int cp = WK_CUDA_SPLIT_COLS(cols);
			size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
			size_t nb = 2 * (size_t)n * cp;
			float *x = malloc(nx * 4), *ws = malloc((size_t)sr * sc * 4);
			uint8_t *w = malloc(nw + 1);
			uint16_t *xb = malloc(nb * 2);
			float *want = malloc(ny * 4), *got = malloc(ny * 4);
			cr_assert(x && ws && w && xb && want && got);
			for (size_t i = 0; i < nx; i++)
				x[i] = rnd() * ldexpf(1.0f, (int)(i % 7) - 3);
			for (size_t i = 0; i < nw; i++)
				w[i] = dt_f32_to_e4m3(rnd() * 448.0f);
			for (int i = 0; i < sr * sc; i++)
				ws[i] = (rnd() + 1.5f) * 1e-3f;
			cpu_ref_matmul_fp8(want, x, w, ws, n, rows, cols);
			float *dx = to_dev(x, nx * 4), *dws = to_dev(ws, (size_t)sr * sc * 4), *dy;
			uint8_t *dw = to_dev_off(w, nw, off);
			uint16_t *dxb;
			cr_assert_eq(wk_cuda_alloc((void **)&dxb, nb * 2, err, sizeof err), WK_OK);
			cr_assert_eq(wk_cuda_alloc((void **)&dy, ny * 4, err, sizeof err), WK_OK);
			cr_assert_eq(wk_cuda_act_split(dxb, dx, n, cols, err, sizeof err), WK_OK, "%s",
				     err);
			from_dev(xb, dxb, nb * 2);
			for (int t = 0; t < n; t++)
				for (int c = 0; c < cp; c++) {
					float v = c < cols ? x[(size_t)t * cols + c] : 0.0f;
					uint16_t hi = dt_f32_to_bf16(v);
					uint16_t lo = dt_f32_to_bf16(v - dt_bf16_to_f32(hi));
					size_t i = (size_t)t * cp + c;
					cr_assert(xb[i] == hi && xb[(size_t)n * cp + i] == lo,
						  "act_split n=%d cols=%d: token %d column %d: %04x %04x, "
						  "want %04x %04x", n, cols, t, c, xb[i],
						  xb[(size_t)n * cp + i], hi, lo);
				}
			for (size_t i = 0; i < ny; i++)
				got[i] = NAN;
			cr_assert_eq(wk_cuda_upload(dy, got, ny * 4, err, sizeof err), WK_OK, "%s", err);
			cr_assert_eq(wk_cuda_gemm_fp8w(dy, dxb, dw + off, dws, n, rows, cols, err,
						       sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dy, ny * 4);
			double r = rel_rows(got, want, n, rows);
			cr_expect_leq(r, 1e-5, "gemm_fp8w n=%d rows=%d cols=%d off=%d: %g", n, rows,
				      cols, off, r);
			cr_log_info("gemm_fp8w n=%d rows=%d cols=%d off=%d: %.3g", n, rows, cols, off,
				    r);
			wk_cuda_free(dx);
			wk_cuda_free(dws);
			wk_cuda_free(dw);
			wk_cuda_free(dxb);
			wk_cuda_free(dy);
			free(x);
			free(ws);
			free(w);
			free(xb);
			free(want);
			free(got);
		}
}

Test(cuda_kernels, rmsnorm_silu_add_match_ref)
{
	NEED_GPU();
	int n = 5, dim = 1000;
	size_t N = (size_t)n * dim;
	float *x = rnd_vec(N), *w = rnd_vec(dim), *u = rnd_vec(N);
	float *want = malloc(N * 4), *got = malloc(N * 4);
	float *dx = to_dev(x, N * 4), *dw = to_dev(w, dim * 4), *du = to_dev(u, N * 4);
	/* rmsnorm in place, as the engine calls it */
	cpu_ref_rmsnorm(want, x, w, n, dim, 1e-5f);
	cr_assert_eq(wk_cuda_rmsnorm(dx, dx, dw, n, dim, 1e-5f, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "rmsnorm");
	/* silu_mul on the normalised rows */
	memcpy(x, want, N * 4);
	cpu_ref_silu_mul(want, u, N);
	cr_assert_eq(wk_cuda_silu_mul(dx, du, N, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "silu_mul");
	/* add: y += x */
	for (size_t i = 0; i < N; i++)
		want[i] += u[i];
	cr_assert_eq(wk_cuda_add(dx, du, N, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, dx, N * 4);
	cr_expect_leq(rel(got, want, N), TOL, "add");
	wk_cuda_free(dx);
	wk_cuda_free(dw);
	wk_cuda_free(du);
	free(x);
	free(w);
	free(u);
	free(want);
	free(got);
}

Test(cuda_kernels, rope_matches_ref)
{
	NEED_GPU();
	int n = 6, heads = 4, hd = 64, pos[6] = {0, 1, 7, 100, 2047, 5};
	int *dpos = to_dev(pos, sizeof pos);
	for (int mode = 0; mode < 4; mode++) {
		bool inter = mode & 1;
		int rot = mode & 2 ? hd / 2 : hd; /* partial rotation too (GLM-4.5) */
		size_t N = (size_t)n * heads * hd;
		float *x = rnd_vec(N), *got = malloc(N * 4);
		float *dx = to_dev(x, N * 4);
		cpu_ref_rope(x, n, pos, heads, hd, rot, 10000.0f, inter);
		cr_assert_eq(wk_cuda_rope(dx, n, dpos, heads, hd, rot, 10000.0f, inter, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dx, N * 4);
		double r = rel(got, x, N);
		cr_expect_leq(r, TOL, "rope interleaved=%d rot=%d: %g", inter, rot, r);
		wk_cuda_free(dx);
		free(x);
		free(got);
	}
	wk_cuda_free(dpos);
}

Test(cuda_kernels, attention_matches_ref)
{
	NEED_GPU();
	/* decode (n = 1 at pos0 300), a prefill (n = 7 from 0), a chunk (n = 4 at 9); GQA 8:2,
	 * a kv_stride wider than the kv heads (rows of a larger cache); an f32 cache, then the
	 * decode and the chunk over a bf16 one (the reference on the same bf16 cache), then all
	 * three over an FP8 one (rows of head_dim, each with its own scale: the stride one head
	 * wider, the values of each row scaled by a factor of its own). Then the kernel's other
	 * shapes: 12 query heads a kv head (a block of 8 and one of 4), 3 (a block of 4 with one
	 * empty), 1 with head_dim 200 over FP8 (two scale blocks a row, the last partial), and a
	 * decode past 8,192 positions (the kernel once held every score in shared memory). Each
	 * runs whole and, given the scratch, with its keys split over blocks where it would be
	 * split (the longer ones: 5, 3 parts of a causal prefill, 2, 35), then on half that
	 * scratch (fewer parts), whose counters must be left zero. */
	static const struct {
		int n, pos0, kv, heads, kvh, hd;
	} cases[] = {{1, 300, DT_F32, 8, 2, 64},     {7, 0, DT_F32, 8, 2, 64},
		     {4, 9, DT_F32, 8, 2, 64},       {1, 300, DT_BF16, 8, 2, 64},
		     {4, 9, DT_BF16, 8, 2, 64},      {1, 300, DT_F8_E4M3, 8, 2, 64},
		     {7, 0, DT_F8_E4M3, 8, 2, 64},   {4, 9, DT_F8_E4M3, 8, 2, 64},
		     {3, 70, DT_F32, 12, 1, 128},    {3, 70, DT_F8_E4M3, 12, 1, 128},
		     {2, 130, DT_BF16, 6, 2, 40},    {1, 150, DT_F8_E4M3, 4, 4, 200},
		     {2, 140, DT_F32, 4, 4, 200},    {1, 9000, DT_F32, 2, 1, 16},
		     {1, 1500, DT_F8_E4M3, 8, 2, 64}, {3, 1000, DT_BF16, 12, 1, 128},
		     {2, 600, DT_F32, 6, 2, 40}};
	enum { COUNTERS = 4096 };
	unsigned *dcount, zero[COUNTERS] = {0}, back[COUNTERS];
	cr_assert_eq(wk_cuda_alloc((void **)&dcount, sizeof zero, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_upload(dcount, zero, sizeof zero, err, sizeof err), WK_OK, "%s", err);
	int splits = 0;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int n = cases[c].n, pos0 = cases[c].pos0, len = pos0 + n;
		int heads = cases[c].heads, kvh = cases[c].kvh, hd = cases[c].hd;
		enum dt_type kv = (enum dt_type)cases[c].kv;
		bool f8 = kv == DT_F8_E4M3;
		int stride = f8 ? (kvh + 1) * hd : kvh * hd + 16;
		size_t nq = (size_t)n * heads * hd, nk = (size_t)len * stride;
		float *q = rnd_vec(nq), *k = rnd_vec(nk), *v = rnd_vec(nk);
		for (size_t i = 0; f8 && i < nk; i++) {
			k[i] *= 0.25f + (float)(i / (size_t)hd % 11);
			v[i] *= 0.25f + (float)(i / (size_t)hd % 7);
		}
		float *want = malloc(nq * 4), *got = malloc(nq * 4);
		float scale = 1.0f / sqrtf((float)hd);
		void *k16 = NULL, *v16 = NULL;
		float *ks = NULL, *vs = NULL, *dks = NULL, *dvs = NULL;
		const void *kh, *vh;
		if (f8) {
			kh = k16 = to_fp8(k, nk / (size_t)hd, hd, &ks);
			vh = v16 = to_fp8(v, nk / (size_t)hd, hd, &vs);
			size_t sb = nk / (size_t)hd * (size_t)cpu_kv_blocks(hd) * sizeof(float);
			dks = to_dev(ks, sb);
			dvs = to_dev(vs, sb);
		} else {
			kh = kv_host(k, nk, kv, &k16);
			vh = kv_host(v, nk, kv, &v16);
		}
		struct cpu_gqa hs = {kh, vh, ks, vs, kv, heads, kvh, hd, stride, scale,
				     NULL, NULL, 0, 0};
		cpu_ref_attention(want, q, &hs, n, pos0);
		float *dq = to_dev(q, nq * 4), *dout;
		void *dk = to_dev(kh, nk * dt_size(kv)), *dv = to_dev(vh, nk * dt_size(kv));
		struct cpu_gqa ds = hs;
		ds.k = dk, ds.v = dv, ds.ks = dks, ds.vs = dvs;
		cr_assert_eq(wk_cuda_alloc((void **)&dout, nq * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_attention(dout, dq, &ds, n, pos0, NULL, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, dout, nq * 4);
		double r = rel(got, want, nq);
		cr_expect_leq(r, TOL, "attention n=%d pos0=%d %d:%d heads of %d, %s cache: %g", n,
			      pos0, heads, kvh, hd, dt_name(kv), r);
		size_t pf = wk_cuda_attention_part(&ds, n, pos0);
		if (pf) { /* split */
			float *dpart;
			splits++;
			cr_assert_eq(wk_cuda_alloc((void **)&dpart, pf * 4, err, sizeof err), WK_OK);
			/* the whole scratch, then half of it: fewer parts, the same result */
			for (int half = 0; half < 2; half++) {
				size_t f = half ? pf / 2 : pf;
				struct wk_att_split sp = {dpart, f, dcount, COUNTERS};
				cr_assert_eq(wk_cuda_attention(dout, dq, &ds, n, pos0, &sp, err,
							       sizeof err),
					     WK_OK, "%s", err);
				from_dev(got, dout, nq * 4);
				r = rel(got, want, nq);
				cr_expect_leq(r, TOL, "attention split on %zu of %zu scratch floats, "
					      "n=%d pos0=%d %s: %g", f, pf, n, pos0, dt_name(kv), r);
			}
			cr_assert_eq(wk_cuda_download(back, dcount, sizeof back, err, sizeof err),
				     WK_OK);
			cr_expect_eq(memcmp(back, zero, sizeof zero), 0, "counters left non-zero");
			wk_cuda_free(dpart);
		}
		free(k16);
		free(v16);
		free(ks);
		free(vs);
		wk_cuda_free(dks);
		wk_cuda_free(dvs);
		wk_cuda_free(dq);
		wk_cuda_free(dk);
		wk_cuda_free(dv);
		wk_cuda_free(dout);
		free(q);
		free(k);
		free(v);
		free(want);
		free(got);
	}
	cr_expect_eq(splits, 4, "cases split: %d", splits);
	wk_cuda_free(dcount);
	float dummy;
	struct cpu_gqa b = {&dummy, &dummy, NULL, NULL, DT_F32, 8, 1, 800, 800, 1.0f,
			    NULL, NULL, 0, 0};
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &b, 1, 0, NULL, err, sizeof err),
		     WK_EINVAL, "a head_dim past the block's shared memory is refused");
	cr_expect(strstr(err, "head_dim 800") && strstr(err, "up to 734"), "%s", err);
	b = (struct cpu_gqa){&dummy, &dummy, NULL, NULL, DT_F16, 1, 1, 1, 1, 1.0f, NULL, NULL,
			     0, 0};
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &b, 1, 0, NULL, err, sizeof err),
		     WK_EINVAL, "an f16 cache is refused before any launch");
	b.kv = DT_F8_E4M3, b.head_dim = 8, b.kv_stride = 8;
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &b, 1, 0, NULL, err, sizeof err),
		     WK_EINVAL, "an fp8 cache without its scales is refused before any launch");
	b.ks = b.vs = &dummy, b.kv_stride = 12;
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &b, 1, 0, NULL, err, sizeof err),
		     WK_EINVAL, "an fp8 cache whose rows are not head_dim wide is refused");
	b.kv_stride = 8, b.seq = &b.n_kv;
	cr_expect_eq(wk_cuda_attention(&dummy, &dummy, &b, 1, 0, NULL, err, sizeof err),
		     WK_EINVAL, "sequences without their positions are refused");
	cr_expect(strstr(err, "without positions"), "%s", err);
}

/* attention over the tokens of several sequences at once (struct cpu_gqa's seq, pos and
 * seq_rows: each token over its own sequence's cache, as a batched GQA step runs it): 6
 * tokens of 3 sequences in no order, a prefill's two beside decodes far along, on f32, bf16
 * and FP8 caches, GQA 8:2; the reference against itself one token at a time (bit for bit),
 * then the kernel whole and split (its parts planned by keys_max) against the reference,
 * the counters left zero. */
Test(cuda_kernels, attention_over_several_sequences)
{
	NEED_GPU();
	enum { N = 6, SEQS = 3, ROWS = 1100, HEADS = 8, KVH = 2, HD = 64 };
	static const int seq[N] = {1, 0, 2, 1, 0, 0}, pos[N] = {1050, 3, 0, 1051, 4, 700};
	int stride = (KVH + 1) * HD; /* FP8's rows of head_dim, a spare kv head */
	size_t nq = (size_t)N * HEADS * HD, nk = (size_t)SEQS * ROWS * stride;
	size_t row = (size_t)HEADS * HD, hr = (size_t)(KVH + 1);
	unsigned *dcount, zero[64] = {0}, back[64];
	cr_assert_eq(wk_cuda_alloc((void **)&dcount, sizeof zero, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_upload(dcount, zero, sizeof zero, err, sizeof err), WK_OK, "%s", err);
	int *dseq = to_dev(seq, sizeof seq), *dpos = to_dev(pos, sizeof pos);
	static const enum dt_type types[3] = {DT_F32, DT_BF16, DT_F8_E4M3};
	for (int c = 0; c < 3; c++) {
		enum dt_type kv = types[c];
		bool f8 = kv == DT_F8_E4M3;
		float *q = rnd_vec(nq), *k = rnd_vec(nk), *v = rnd_vec(nk);
		float *ks = NULL, *vs = NULL, *want = malloc(nq * 4), *one = malloc(row * 4);
		float *got = malloc(nq * 4);
		void *k16 = NULL, *v16 = NULL;
		const void *kh, *vh;
		for (size_t i = 0; i < nk; i++) { /* each row a scale of its own */
			k[i] *= 0.25f + (float)(i / HD % 11);
			v[i] *= 0.25f + (float)(i / HD % 7);
		}
		if (f8) {
			kh = k16 = to_fp8(k, nk / HD, HD, &ks);
			vh = v16 = to_fp8(v, nk / HD, HD, &vs);
		} else {
			kh = kv_host(k, nk, kv, &k16);
			vh = kv_host(v, nk, kv, &v16);
		}
		struct cpu_gqa hs = {kh, vh, ks, vs, kv, HEADS, KVH, HD, stride, 0.125f,
				     seq, pos, ROWS, 1052};
		cpu_ref_attention(want, q, &hs, N, 0);
		for (int i = 0; i < N; i++) { /* token i alone, over its sequence's rows */
			size_t r0 = (size_t)seq[i] * ROWS, es = dt_size(kv);
			struct cpu_gqa o = hs;
			o.seq = o.pos = NULL;
			o.k = (const char *)kh + r0 * stride * es;
			o.v = (const char *)vh + r0 * stride * es;
			o.ks = f8 ? cpu_kv_scales(ks, r0 * hr, HD) : NULL;
			o.vs = f8 ? cpu_kv_scales(vs, r0 * hr, HD) : NULL;
			cpu_ref_attention(one, q + i * row, &o, 1, pos[i]);
			cr_expect_eq(memcmp(one, want + i * row, row * 4), 0,
				     "%s: token %d differs from itself alone", dt_name(kv), i);
		}
		size_t sb = nk / HD * (size_t)cpu_kv_blocks(HD) * 4;
		struct cpu_gqa ds = hs;
		ds.k = to_dev(kh, nk * dt_size(kv));
		ds.v = to_dev(vh, nk * dt_size(kv));
		ds.ks = f8 ? to_dev(ks, sb) : NULL;
		ds.vs = f8 ? to_dev(vs, sb) : NULL;
		ds.seq = dseq;
		ds.pos = dpos;
		float *dq = to_dev(q, nq * 4), *dout, *dpart;
		size_t pf = wk_cuda_attention_part(&ds, N, 0);
		cr_expect(pf > 0, "%s: 6 tokens of 2 kv heads at 1,052 keys split", dt_name(kv));
		cr_assert_eq(wk_cuda_alloc((void **)&dout, nq * 4, err, sizeof err), WK_OK);
		cr_assert_eq(wk_cuda_alloc((void **)&dpart, (pf + 1) * 4, err, sizeof err), WK_OK);
		struct wk_att_split sp = {dpart, pf, dcount, 64};
		for (int split = 0; split < 2; split++) {
			cr_assert_eq(wk_cuda_attention(dout, dq, &ds, N, 0, split ? &sp : NULL, err,
						       sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dout, nq * 4);
			double r = rel(got, want, nq);
			cr_expect_leq(r, TOL, "%s cache, %s: %g", dt_name(kv),
				      split ? "split" : "whole", r);
		}
		from_dev(back, dcount, sizeof back);
		cr_expect_eq(memcmp(back, zero, sizeof zero), 0, "counters left non-zero");
		wk_cuda_free((void *)ds.k), wk_cuda_free((void *)ds.v);
		wk_cuda_free((void *)ds.ks), wk_cuda_free((void *)ds.vs);
		wk_cuda_free(dq), wk_cuda_free(dout), wk_cuda_free(dpart);
		free(q), free(k), free(v), free(ks), free(vs), free(want), free(one), free(got);
		free(k16), free(v16);
	}
	wk_cuda_free(dseq), wk_cuda_free(dpos), wk_cuda_free(dcount);
}

/* cast_n: six conversions in one launch, bit for bit cpu_ref_cast's: f32 to bf16 (rounding
 * ties to even both ways, just past a tie, NaNs quiet and signalling, infinities, -0,
 * subnormals, the largest float rounding to infinity, among random values), bf16 to f32 (NaN
 * and infinity among them), copies of either type, lengths across the kernel's blocks of
 * elements, one at odd element offsets and one empty; nothing past each destination written.
 * Then the refusals: no casts, too many, an f16 one. */
Test(cuda_kernels, cast_n_matches_ref)
{
	NEED_GPU();
	enum { N = 5000 };
	static const uint32_t special[] = {0x3f808000, 0x3f818000, 0x3f808001, 0xbf808000,
					   0x7fc00001, 0x7f800001, 0xff800001, 0x7f800000,
					   0xff800000, 0x80000000, 0x00000001, 0x807fffff,
					   0x7f7fffff, 0x7f7f8000, 0x00008000, 0x00018000};
	float *x = rnd_vec(N);
	uint16_t *h = to_bf16(x, N);
	memcpy(x, special, sizeof special);
	memcpy(x + 2040, special, sizeof special); /* across the first block's end */
	h[0] = 0x7fc1, h[1] = 0xff81, h[2] = 0x7f80, h[3] = 0x8000, h[4] = 0x0001;
	float *dx = to_dev(x, N * 4);
	uint16_t *dh = to_dev(h, N * 2);
	/* dst type, src type, n, element offset of src and dst */
	static const int cs[][5] = {{DT_BF16, DT_F32, N, 0, 0},  {DT_F32, DT_BF16, N, 0, 0},
				    {DT_F32, DT_F32, 100, 0, 0}, {DT_BF16, DT_BF16, 2049, 0, 0},
				    {DT_BF16, DT_F32, 0, 0, 0},  {DT_BF16, DT_F32, 37, 2035, 1}};
	enum { NC = sizeof cs / sizeof cs[0] };
	struct wk_cast c[NC];
	void *dst[NC], *want[NC], *got[NC];
	size_t bytes[NC];
	for (int k = 0; k < NC; k++) {
		enum dt_type dt = (enum dt_type)cs[k][0], st = (enum dt_type)cs[k][1];
		size_t n = (size_t)cs[k][2], es = dt_size(dt), off = (size_t)cs[k][4];
		bytes[k] = (n + off + 3) * es; /* 3 elements past the end: left alone */
		want[k] = malloc(bytes[k]);
		got[k] = malloc(bytes[k]);
		memset(want[k], 0xab, bytes[k]);
		dst[k] = to_dev(want[k], bytes[k]);
		const void *hsrc = st == DT_F32 ? (const void *)(x + cs[k][3])
						: (const void *)(h + cs[k][3]);
		const void *dsrc = st == DT_F32 ? (const void *)(dx + cs[k][3])
						: (const void *)(dh + cs[k][3]);
		cpu_ref_cast((char *)want[k] + off * es, dt, hsrc, st, n, NULL, NULL, 0);
		c[k] = (struct wk_cast){(char *)dst[k] + off * es, dsrc, n, dt, st, NULL, NULL, 0};
	}
	cr_assert_eq(wk_cuda_cast_n(c, NC, err, sizeof err), WK_OK, "%s", err);
	for (int k = 0; k < NC; k++) {
		from_dev(got[k], dst[k], bytes[k]);
		cr_expect_eq(memcmp(got[k], want[k], bytes[k]), 0, "cast %d (%s to %s, %d) differs "
			     "from cpu_ref_cast's", k, dt_name((enum dt_type)cs[k][1]),
			     dt_name((enum dt_type)cs[k][0]), cs[k][2]);
	}
	const uint16_t *b = got[0];
	cr_expect(b[0] == 0x3f80 && b[1] == 0x3f82 && b[2] == 0x3f81 && b[5] == 0x7fc0 &&
			  b[12] == 0x7f80,
		  "ties to even, a signalling NaN quieted, the largest float to infinity: %04x "
		  "%04x %04x %04x %04x", b[0], b[1], b[2], b[5], b[12]);
	for (int k = 0; k < NC; k++) {
		wk_cuda_free(dst[k]);
		free(want[k]);
		free(got[k]);
	}
	struct wk_cast many[WK_CAST_MAX + 1];
	for (int k = 0; k < WK_CAST_MAX + 1; k++)
		many[k] = (struct wk_cast){dx, dx, 1, DT_F32, DT_F32, NULL, NULL, 0};
	cr_expect_eq(wk_cuda_cast_n(many, 0, err, sizeof err), WK_EINVAL);
	cr_expect_eq(wk_cuda_cast_n(many, WK_CAST_MAX + 1, err, sizeof err), WK_EINVAL);
	many[1].dt = DT_F16;
	cr_expect_eq(wk_cuda_cast_n(many, 2, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "cast 1"), "%s", err);
	cr_expect_eq(wk_cuda_sync(err, sizeof err), WK_OK, "%s", err);
	wk_cuda_free(dx);
	wk_cuda_free(dh);
	free(x);
	free(h);
}

/* bytes of device memory filled with 0xab (what a kernel must leave alone shows) */
static void *dev_ab(size_t bytes)
{
	void *h = malloc(bytes);
	cr_assert_not_null(h);
	memset(h, 0xab, bytes);
	void *d = to_dev(h, bytes);
	free(h);
	return d;
}

/* Whether bytes of device memory equal want's (nothing past a destination written: want's
 * tail is 0xab); f32 values compare bit for bit except that any NaN matches any NaN (CUDA's
 * e4m3 conversion gives its canonical NaN where the host's table keeps another). */
static bool dev_equals(const void *dev, const void *want, size_t bytes, bool f32)
{
	char *got = malloc(bytes);
	cr_assert_not_null(got);
	from_dev(got, dev, bytes);
	bool same = memcmp(got, want, bytes) == 0;
	for (size_t i = 0; f32 && !same && i + 4 <= bytes; i += 4) {
		float g, w;
		memcpy(&g, got + i, 4);
		memcpy(&w, (const char *)want + i, 4);
		if (memcmp(&g, &w, 4) && !(isnan(g) && isnan(w)))
			break;
		same = i + 8 > bytes;
	}
	free(got);
	return same;
}

/* cast_n's FP8 conversions, bit for bit cpu_ref_cast's, five in one launch: rows of 200 (a
 * last block of 72) quantized, their first rows special: an all-zero block with a -0 (scale
 * 1), a block of ties on the e4m3 grid (amax 448: scale 1; ties to even, subnormal ties too),
 * a NaN (code 0x7f), an infinity (scale inf), a block whose scale underflows to 0 (x / 0
 * saturating to +-448, 0 / 0 a NaN), subnormal floats, values near FLT_MAX; rows of 136 (a
 * last block of 8) over several of the kernel's blocks; every code 0..255 dequantized (rows
 * of 200, scales random, one subnormal); a bf16 rounding; an empty one. Nothing past a
 * destination written. Then the refusals: no scales, n not rows of w, w 0, fp8 to bf16 and
 * to fp8. */
Test(cuda_kernels, cast_n_fp8_matches_ref)
{
	NEED_GPU();
	enum { W1 = 200, R1 = 9, W2 = 136, R2 = 40, W3 = 200, R3 = 6, NB = 2 };
	size_t n1 = (size_t)W1 * R1, n2 = (size_t)W2 * R2, n3 = (size_t)W3 * R3;
	float *x1 = rnd_vec(n1), *x2 = rnd_vec(n2), *s3 = rnd_vec((size_t)R3 * NB);
	static const float ties[] = {448.0f,   1.0625f,  1.1875f,   -17.0f, 19.0f, 248.0f,
				     0x1p-10f, 0x3p-10f, -0x5p-10f, 0.0f,   -0.0f, 0x1.1p-6f};
	for (int c = 0; c < 128; c++)
		x1[c] = c == 5 ? -0.0f : 0.0f;
	memcpy(x1 + 128, ties, sizeof ties);
	x1[W1 + 3] = NAN;
	x1[W1 + 130] = INFINITY;
	for (int c = 0; c < 128; c++) /* scale 0x1p-149 / 448 = 0 */
		x1[2 * W1 + c] = c % 3 ? 0.0f : c % 2 ? 0x1p-149f : -0x1p-149f;
	for (int c = 128; c < W1; c++)
		x1[2 * W1 + c] *= 1e-39f;
	for (int c = 0; c < W1; c++)
		x1[3 * W1 + c] *= 3.4e38f;
	uint8_t *c3 = malloc(n3);
	cr_assert_not_null(c3);
	for (size_t i = 0; i < n3; i++)
		c3[i] = (uint8_t)i;
	for (int i = 0; i < R3 * NB; i++)
		s3[i] = fabsf(s3[i]) + 0.01f;
	s3[1] = 0x1p-140f;
	/* the host's results, each 3 elements longer than written (0xab: left alone) */
	uint8_t *q1 = malloc(n1 + 3), *q2 = malloc(n2 + 3);
	float *qs1 = malloc(((size_t)R1 * NB + 3) * 4), *qs2 = malloc(((size_t)R2 * NB + 3) * 4);
	float *f3 = malloc((n3 + 3) * 4);
	uint16_t *b4 = malloc((n2 + 3) * 2);
	cr_assert(c3 && q1 && q2 && qs1 && qs2 && f3 && b4);
	memset(q1, 0xab, n1 + 3);
	memset(q2, 0xab, n2 + 3);
	memset(qs1, 0xab, ((size_t)R1 * NB + 3) * 4);
	memset(qs2, 0xab, ((size_t)R2 * NB + 3) * 4);
	memset(f3, 0xab, (n3 + 3) * 4);
	memset(b4, 0xab, (n2 + 3) * 2);
	cpu_ref_cast(q1, DT_F8_E4M3, x1, DT_F32, n1, qs1, NULL, W1);
	cpu_ref_cast(q2, DT_F8_E4M3, x2, DT_F32, n2, qs2, NULL, W2);
	cpu_ref_cast(f3, DT_F32, c3, DT_F8_E4M3, n3, NULL, s3, W3);
	cpu_ref_cast(b4, DT_BF16, x2, DT_F32, n2, NULL, NULL, 0);
	cr_expect(q1[128] == 0x7e && q1[129] == 0x38 && q1[130] == 0x3a && q1[131] == 0xd8 &&
			  q1[132] == 0x5a && q1[133] == 0x78 && q1[134] == 0 && q1[135] == 2 &&
			  q1[136] == 0x82 && q1[138] == 0x80 && q1[5] == 0x80 && q1[W1 + 3] == 0x7f,
		  "the reference's codes: ties to even, -0, NaN");
	float *dx1 = to_dev(x1, n1 * 4), *dx2 = to_dev(x2, n2 * 4), *ds3 = to_dev(s3, R3 * NB * 4);
	uint8_t *dc3 = to_dev(c3, n3);
	void *dq1 = dev_ab(n1 + 3), *dq2 = dev_ab(n2 + 3), *dqs1 = dev_ab(((size_t)R1 * NB + 3) * 4);
	void *dqs2 = dev_ab(((size_t)R2 * NB + 3) * 4), *df3 = dev_ab((n3 + 3) * 4);
	void *db4 = dev_ab((n2 + 3) * 2), *dq5 = dev_ab(4);
	struct wk_cast c[5] = {
		{dq1, dx1, n1, DT_F8_E4M3, DT_F32, dqs1, NULL, W1},
		{dq2, dx2, n2, DT_F8_E4M3, DT_F32, dqs2, NULL, W2},
		{df3, dc3, n3, DT_F32, DT_F8_E4M3, NULL, ds3, W3},
		{db4, dx2, n2, DT_BF16, DT_F32, NULL, NULL, 0},
		{dq5, dx1, 0, DT_F8_E4M3, DT_F32, dq5, NULL, W1}};
	cr_assert_eq(wk_cuda_cast_n(c, 5, err, sizeof err), WK_OK, "%s", err);
	cr_expect(dev_equals(dq1, q1, n1 + 3, false), "rows of 200: the codes differ");
	cr_expect(dev_equals(dqs1, qs1, ((size_t)R1 * NB + 3) * 4, false),
		  "rows of 200: the scales differ");
	cr_expect(dev_equals(dq2, q2, n2 + 3, false), "rows of 136: the codes differ");
	cr_expect(dev_equals(dqs2, qs2, ((size_t)R2 * NB + 3) * 4, false),
		  "rows of 136: the scales differ");
	cr_expect(dev_equals(df3, f3, (n3 + 3) * 4, true), "every code dequantized: differs");
	cr_expect(dev_equals(db4, b4, (n2 + 3) * 2, false), "the bf16 rounding differs");
	uint32_t ab = 0xabababab;
	cr_expect(dev_equals(dq5, &ab, 4, false), "the empty cast wrote");
	struct wk_cast bad[5] = {
		{dq1, dx1, n1, DT_F8_E4M3, DT_F32, NULL, NULL, W1},
		{dq1, dx1, n1 - 1, DT_F8_E4M3, DT_F32, dqs1, NULL, W1},
		{df3, dc3, n3, DT_F32, DT_F8_E4M3, NULL, ds3, 0},
		{db4, dc3, n3, DT_BF16, DT_F8_E4M3, NULL, ds3, W3},
		{dq1, dc3, n3, DT_F8_E4M3, DT_F8_E4M3, dqs1, ds3, W3}};
	static const char *const why[5] = {"fp8", "rows of 200", "rows of 0", "bf16", "fp8"};
	for (int k = 0; k < 5; k++) {
		struct wk_cast two[2] = {c[3], bad[k]};
		err[0] = 0;
		cr_expect_eq(wk_cuda_cast_n(two, 2, err, sizeof err), WK_EINVAL, "bad cast %d", k);
		cr_expect(strstr(err, "cast 1") && strstr(err, why[k]), "bad cast %d: %s", k, err);
	}
	cr_expect_eq(wk_cuda_sync(err, sizeof err), WK_OK, "%s", err);
	void *dev[] = {dx1, dx2, ds3, dc3, dq1, dq2, dqs1, dqs2, df3, db4, dq5};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		wk_cuda_free(dev[i]);
	void *host[] = {x1, x2, s3, c3, q1, q2, qs1, qs2, f3, b4};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
}

Test(cuda_kernels, argmax_matches_samp_argmax)
{
	NEED_GPU();
	int n = 3, vocab = 50000;
	float *lg = rnd_vec((size_t)n * vocab);
	lg[1 * vocab + 777] = 5.0f; /* a tie: the lower index wins, as samp_argmax */
	lg[1 * vocab + 40000] = 5.0f;
	lg[2 * vocab + vocab - 1] = 9.0f;
	float *dl = to_dev(lg, (size_t)n * vocab * 4);
	int *di, got[3];
	cr_assert_eq(wk_cuda_alloc((void **)&di, sizeof got, err, sizeof err), WK_OK);
	cr_assert_eq(wk_cuda_argmax(di, dl, n, vocab, err, sizeof err), WK_OK, "%s", err);
	from_dev(got, di, sizeof got);
	for (int i = 0; i < n; i++)
		cr_expect_eq(got[i], samp_argmax(lg + (size_t)i * vocab, vocab), "row %d", i);
	wk_cuda_free(dl);
	wk_cuda_free(di);
	free(lg);
}

/* Without a GPU the calls must fail cleanly, never crash: a build without CUDA refuses them,
 * a CUDA build with no device reports the CUDA error. */
Test(cuda_kernels, without_a_gpu_calls_fail_cleanly)
{
	if (cuda_device_count() > 0)
		cr_skip_test("a GPU is visible");
	void *p = (void *)1;
	cr_expect_neq(wk_cuda_alloc(&p, 64, err, sizeof err), WK_OK);
	cr_expect_null(p);
	cr_expect(err[0] != 0, "no message");
	cr_expect_neq(wk_cuda_sync(err, sizeof err), WK_OK);
}

/* ---- GLM families (glm_kernels.cu against kernels/cpu/glm_ref.c) ---------------------------- */

static void *dev_alloc(size_t bytes)
{
	void *d;
	cr_assert_eq(wk_cuda_alloc(&d, bytes, err, sizeof err), WK_OK, "%s", err);
	return d;
}

static float *fill_vec(size_t n, float v)
{
	float *x = malloc(n * sizeof *x);
	cr_assert_not_null(x);
	for (size_t i = 0; i < n; i++)
		x[i] = v;
	return x;
}

static int rnd_int(int n) /* uniform in [0, n) */
{
	int r = (int)((rnd() + 1.0f) * 0.5f * (float)n);
	return r < n ? r : n - 1;
}

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

/* A random [rows][cols] weight in dtype t (host bytes); *scale gets FP8 block scales (else
 * NULL), sized [ceil(rows/128)][ceil(cols/128)]. */
static void *rnd_weight(enum dt_type t, int rows, int cols, float **scale)
{
	size_t nw = (size_t)rows * cols;
	char *w = malloc(nw * dt_size(t));
	cr_assert_not_null(w);
	*scale = NULL;
	for (size_t i = 0; i < nw; i++) {
		float f = rnd();
		uint16_t h;
		switch (t) {
		case DT_F32: memcpy(w + i * 4, &f, 4); break;
		case DT_BF16:
			h = dt_f32_to_bf16(f);
			memcpy(w + i * 2, &h, 2);
			break;
		case DT_F16:
			h = dt_f32_to_f16(f);
			memcpy(w + i * 2, &h, 2);
			break;
		default: ((uint8_t *)w)[i] = dt_f32_to_e4m3(f * 400.0f); break;
		}
	}
	if (t == DT_F8_E4M3) {
		size_t ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
		*scale = rnd_vec(ns);
		for (size_t i = 0; i < ns; i++)
			(*scale)[i] = (*scale)[i] / 400.0f + 1.0f / 256.0f; /* distinct per block */
	}
	return w;
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

/* The random sparse selection of an MLA test: for query i, nsel[i] <= min(topk, keys)
 * ascending positions among its pos0 + i + 1 keys. */
static void rnd_sel(int *sel, int *nsel, int n, int pos0, int topk)
{
	for (int i = 0; i < n; i++) {
		int len = pos0 + i + 1, want = rnd_int(topk < len ? topk : len) + 1, got = 0;
		for (int t = 0; t < len && got < want; t++) /* each position with odds want/len */
			if (rnd_int(len) < want || len - t == want - got)
				sel[i * topk + got++] = t;
		nsel[i] = got;
	}
}

/* The n floats of a split's part scratch dev made NaN (poison_parts) and, after a call, how
 * many it wrote (parts_written): the parts of a split (an empty part too: m -inf, l 0, acc 0)
 * are never NaN, so a call that ran unsplit writes none. */
static void poison_parts(float *dev, size_t n)
{
	float *x = fill_vec(n, NAN);
	cr_assert_eq(wk_cuda_upload(dev, x, n * 4, err, sizeof err), WK_OK, "%s", err);
	free(x);
}

static size_t parts_written(const float *dev, size_t n)
{
	float *x = malloc(n * 4);
	size_t w = 0;
	cr_assert(x);
	from_dev(x, dev, n * 4);
	for (size_t i = 0; i < n; i++)
		w += !isnan(x[i]);
	free(x);
	return w;
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

Test(cuda_kernels, dsa_topk_matches_ref)
{
	NEED_GPU();
	/* n, pos0, topk: every query past topk, or the first queries within it and the rest
	 * past; exact: q, k, w small dyadic numbers and the scales powers of two, so that every
	 * score is exact in f32 whatever the order of the sums (the GPU's equal the CPU's bit
	 * for bit, and many distinct keys tie exactly); then two over a bf16 key cache (the
	 * keys rounded to bf16 first, so that the scores checked below are the cache's), and two
	 * over an FP8 one, keys of 160 (a second, partial scale block), quantized then read back
	 * as the cache holds them (exact: every row's blocks hold a 0.875, so that each scale is
	 * 2^-9 and the cache holds the keys exactly) */
	static const int cases[][5] = {
		{6, 300, 64, 0, DT_F32},      {40, 40, 64, 0, DT_F32},  {2, 2000, 512, 1, DT_F32},
		{30, 100, 64, 1, DT_F32},     {4, 200, 48, 0, DT_BF16}, {30, 100, 64, 1, DT_BF16},
		{4, 200, 48, 0, DT_F8_E4M3}, {30, 100, 64, 1, DT_F8_E4M3}};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		int n = cases[c][0], pos0 = cases[c][1], topk = cases[c][2], T = pos0 + n;
		bool exact = cases[c][3];
		enum dt_type kv = (enum dt_type)cases[c][4];
		int IH = 4, ID = kv == DT_F8_E4M3 ? 160 : 32;
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
				k[(size_t)t * ID] = k[(size_t)t * ID + 128] = 0.875f;
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
		/* The scores are summed in another order on the GPU: unless exact, the test needs
		 * the topk-th and next best to be exactly equal (from equal rows) or well apart. */
		float *sc = malloc((size_t)T * 4);
		int ties = 0; /* queries whose topk-th best ties with the next */
		for (int i = 0; i < n; i++) {
			int len = pos0 + i + 1;
			if (len <= topk)
				continue;
			float mx = 0;
			for (int t = 0; t < len; t++) {
				sc[t] = cpu_ref_dsa_score(q + (size_t)i * IH * ID,
							  k + (size_t)t * ID, DT_F32, NULL,
							  w + (size_t)i * IH, IH, ID, qk, ws);
				mx = fmaxf(mx, fabsf(sc[t]));
			}
			qsort(sc, (size_t)len, 4, cmp_desc);
			float gap = sc[topk - 1] - sc[topk];
			ties += gap == 0;
			cr_assert(exact || gap == 0 || gap > 1e-4f * mx,
				  "case %zu query %d: scores %g and %g too close for the test", c,
				  i, sc[topk - 1], sc[topk]);
		}
		cr_assert(!exact || ties > 0, "case %zu: no tie at the top-k boundary to test", c);
		int *want = malloc((size_t)n * topk * sizeof(int)),
		    *got = malloc((size_t)n * topk * sizeof(int));
		int *wn = malloc((size_t)n * sizeof(int)), *gn = malloc((size_t)n * sizeof(int));
		float *want_sc = fill_vec((size_t)T, 7.0f);
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
		/* one query a launch (scratch for one row), then groups: 4 rows of scratch and
		 * groups of 3 (the groups' counters reused), and every query in one launch */
		static const int shape[][2] = {{1, 1}, {4, 3}, {0, 65535}}; /* rows (0: n), group */
		unsigned *zero = calloc(65535, sizeof *zero);
		unsigned *dcount = to_dev(zero, 65535 * sizeof *zero);
		for (size_t v = 0; v < sizeof shape / sizeof shape[0]; v++) {
			size_t rows = shape[v][0] ? (size_t)shape[v][0] : (size_t)n;
			float *dsc = dev_alloc(rows * T * 4);
			int *dsel = dev_alloc((size_t)n * topk * sizeof(int)),
			    *dn = dev_alloc((size_t)n * sizeof(int));
			cr_assert_eq(wk_cuda_dsa_topk(dsel, dn, dq, dw, &dd, n, pos0, dsc, rows * T,
						      dcount, shape[v][1], err, sizeof err),
				     WK_OK, "%s", err);
			from_dev(got, dsel, (size_t)n * topk * sizeof(int));
			from_dev(gn, dn, (size_t)n * sizeof(int));
			for (int i = 0; i < n; i++) {
				cr_expect_eq(gn[i], wn[i], "case %zu/%zu query %d: nsel %d, want %d",
					     c, v, i, gn[i], wn[i]);
				for (int j = 0; j < wn[i] && j < gn[i]; j++)
					cr_expect_eq(got[(size_t)i * topk + j],
						     want[(size_t)i * topk + j],
						     "case %zu/%zu query %d: sel[%d] = %d, want %d", c,
						     v, i, j, got[(size_t)i * topk + j],
						     want[(size_t)i * topk + j]);
			}
			unsigned *left = malloc(65535 * sizeof *left);
			from_dev(left, dcount, 65535 * sizeof *left);
			cr_expect_arr_eq(left, zero, 65535 * sizeof *left,
					 "case %zu/%zu: the counters were not left zero", c, v);
			free(left);
			wk_cuda_free(dsc);
			wk_cuda_free(dsel);
			wk_cuda_free(dn);
		}
		char e2[WK_ERRSZ]; /* a scratch shorter than one row is refused */
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &dd, n, pos0, NULL, (size_t)T - 1,
					      dcount, 1, e2, sizeof e2),
			     WK_EINVAL);
		struct cpu_dsa bad = dd;
		bad.kv = DT_F16;
		bad.ks = NULL;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, n, pos0, NULL, (size_t)T,
					      dcount, 1, e2, sizeof e2),
			     WK_EINVAL, "an f16 key cache is refused");
		bad.kv = DT_F8_E4M3;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, n, pos0, NULL, (size_t)T,
					      dcount, 1, e2, sizeof e2),
			     WK_EINVAL, "an FP8 key cache without its scales is refused");
		free(k16);
		free(k8);
		free(ks);
		wk_cuda_free(dks);
		wk_cuda_free(dcount);
		free(zero);
		wk_cuda_free(dq);
		wk_cuda_free(dk);
		wk_cuda_free(dw);
		free(q);
		free(k);
		free(w);
		free(sc);
		free(want);
		free(got);
		free(wn);
		free(gn);
		free(want_sc);
		free(work);
	}
}

/* dsa_topk over several sequences in one call (a batched step): query i scores its own
 * sequence's keys 0 .. pos[i] (rows seq[i] * ROWS on) and takes them all within topk. The
 * reference equals itself query by query on each sequence's cache alone (memcmp); the
 * kernel, on exact scores (dyadic q, k, w and power-of-two scales, as above, so that the
 * order of the sums does not matter), equals the reference: one query a launch, groups of 3,
 * and all in one launch. Each sequence's keys are drawn apart, so a query that read another
 * sequence's rows, or as many keys as its place in the call, would select otherwise. */
Test(cuda_kernels, dsa_topk_over_several_sequences)
{
	NEED_GPU();
	enum { NQ = 7, NSEQ = 3, ROWS = 400, IH = 4, TOPK = 64 };
	int seq[NQ] = {2, 2, 2, 0, 1, 1, 0}, pos[NQ] = {40, 41, 120, 300, 63, 64, 399};
	for (int c = 0; c < 3; c++) {
		enum dt_type kv = c == 0 ? DT_F32 : c == 1 ? DT_BF16 : DT_F8_E4M3;
		int ID = kv == DT_F8_E4M3 ? 160 : 32;
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
			if (kv == DT_F8_E4M3) /* every scale 2^-9: the cache holds k exactly */
				k[t * ID] = k[t * ID + 128] = 0.875f;
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
		static const int shape[][2] = {{1, 1}, {3, 3}, {NQ, NQ}}; /* score rows, group */
		for (int v = 0; v < 3; v++) {
			float *dsc = dev_alloc((size_t)shape[v][0] * ROWS * 4);
			int *dsel = dev_alloc(sizeof got), *dn = dev_alloc(sizeof gn);
			cr_assert_eq(wk_cuda_dsa_topk(dsel, dn, dq, dw, &dd, NQ, 0, dsc,
						      (size_t)shape[v][0] * ROWS, dcount,
						      shape[v][1], err, sizeof err),
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
			wk_cuda_free(dsc);
			wk_cuda_free(dsel);
			wk_cuda_free(dn);
		}
		struct cpu_dsa bad = dd; /* several sequences without their longest */
		bad.keys_max = 0;
		cr_expect_eq(wk_cuda_dsa_topk(NULL, NULL, dq, dw, &bad, NQ, 0, NULL, ROWS, dcount,
					      1, err, sizeof err),
			     WK_EINVAL);
		void *dev[] = {(void *)dd.k, (void *)dd.ks, (void *)dd.seq, (void *)dd.pos, dq, dw,
			       dcount};
		for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
			wk_cuda_free(dev[i]);
		void *host[] = {q, k, w, ks, k8, k16, sc, work};
		for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
			free(host[i]);
	}
}

/* ---- grouped MoE experts (moe_kernels.cu against cpu_ref_moe_experts) ------------------------ */

/* One rank's n_local experts in dtype t: host weights for the reference (host), their device
 * copies (dev, a host array of device pointers) and the device table the kernel reads (tab). */
struct moe_set {
	int n_local;
	struct cpu_expert *host, *dev, *tab;
};

static void moe_set_make(struct moe_set *m, enum dt_type t, int n_local, int dim, int inter)
{
	m->n_local = n_local;
	m->host = calloc((size_t)n_local, sizeof *m->host);
	m->dev = calloc((size_t)n_local, sizeof *m->dev);
	cr_assert(m->host && m->dev);
	int rows[3] = {inter, inter, dim}, cols[3] = {dim, dim, inter}; /* gate, up, down */
	for (int e = 0; e < n_local; e++) {
		const void **hw[3] = {&m->host[e].gate, &m->host[e].up, &m->host[e].down};
		const float **hs[3] = {&m->host[e].gate_s, &m->host[e].up_s, &m->host[e].down_s};
		const void **dw[3] = {&m->dev[e].gate, &m->dev[e].up, &m->dev[e].down};
		const float **ds[3] = {&m->dev[e].gate_s, &m->dev[e].up_s, &m->dev[e].down_s};
		for (int k = 0; k < 3; k++) {
			float *s;
			void *w = rnd_weight(t, rows[k], cols[k], &s);
			size_t ns = (size_t)((rows[k] + 127) / 128) * ((cols[k] + 127) / 128);
			*hw[k] = w;
			*hs[k] = s;
			*dw[k] = to_dev(w, (size_t)rows[k] * cols[k] * dt_size(t));
			*ds[k] = s ? to_dev(s, ns * 4) : NULL;
		}
	}
	m->tab = to_dev(m->dev, (size_t)n_local * sizeof *m->dev);
}

static void moe_set_free(struct moe_set *m)
{
	for (int e = 0; e < m->n_local; e++) {
		const struct cpu_expert *h = &m->host[e], *d = &m->dev[e];
		free((void *)h->gate), free((void *)h->up), free((void *)h->down);
		free((void *)h->gate_s), free((void *)h->up_s), free((void *)h->down_s);
		wk_cuda_free((void *)d->gate), wk_cuda_free((void *)d->up);
		wk_cuda_free((void *)d->down), wk_cuda_free((void *)d->gate_s);
		wk_cuda_free((void *)d->up_s), wk_cuda_free((void *)d->down_s);
	}
	wk_cuda_free(m->tab);
	free(m->host);
	free(m->dev);
}

/* The kernels' view of m's experts [ex0, ex0 + n_local) in t (no shared expert). */
static struct wk_moe moe_of(const struct moe_set *m, enum dt_type t, int ex0, int dim,
			    int inter)
{
	return (struct wk_moe){.experts = m->tab, .ex0 = ex0, .n_local = m->n_local, .wdt = t,
			       .dim = dim, .inter = inter};
}

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
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
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
		cr_expect_leq(r, 1e-3, "%s n=%d dim=%d inter=%d shared %d %s: %g", dt_name(t), n,
			      dim, inter, sh, dt_name(st), r);
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
 * narrower or wider). */
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
		cr_expect_leq(r, 1e-5, "GEMM n=%d dim=%d inter=%d shared %d: %g", n, dim, inter, sh,
			      r);
		cr_log_info("moe_experts GEMM n=%d dim=%d inter=%d shared %d: %.3g", n, dim, inter,
			    sh, r);
		cr_expect(memcmp(got, again, ny * 4) == 0, "GEMM n=%d: two runs differ", n);
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

/* ---- sampling candidates (sample_kernels.cu against kernels/cpu/sample_ref.c) -------------- */

/* Row logits of one of four kinds: smooth, one spike over noise, a few levels (exact ties in
 * p), or flat (every p equal: top_p keeps a share of the whole vocabulary). */
static void cand_logits(float *l, int vocab, int kind)
{
	for (int j = 0; j < vocab; j++) {
		float x = rnd();
		l[j] = kind == 0 ? 4 * x : kind == 1 ? (j == vocab / 3 ? 9 : x) : kind == 2 ? (float)rnd_int(4) : 0.5f;
	}
}

/* The filter's whole list for row l (top_p off; cap: all of it) into w[0..vocab), sorted as
 * the reference sorts; its length. work: vocab more candidates. */
static int whole_list(struct cpu_cand *w, double *mass, const float *l, int vocab,
		      const struct cpu_samp *s)
{
	if (!(s->top_k > 0 && s->top_k < vocab)) { /* every id in id order (the reference picks) */
		float mx = l[0];
		for (int j = 1; j < vocab; j++)
			mx = l[j] > mx ? l[j] : mx;
		*mass = 0;
		for (int j = 0; j < vocab; j++) {
			w[j] = (struct cpu_cand){expf((l[j] - mx) / s->temperature), j};
			*mass += w[j].p;
		}
		return vocab;
	}
	struct cpu_cand_head h;
	struct cpu_samp all = {s->temperature, 1, s->top_k, 0, 0};
	cpu_ref_sample_cand(w, &h, l, &all, 1, vocab, vocab, w + vocab);
	*mass = h.mass;
	return h.count;
}

/* Whether a running sum of row l's list lands within margin (relative to its mass) of the
 * share `share` of the mass: a cut there may fall on either side, summed in another order. */
static bool near_cut(const float *l, int vocab, const struct cpu_samp *s, double share,
		     double margin, struct cpu_cand *w)
{
	double mass, acc = 0;
	int n = whole_list(w, &mass, l, vocab, s);
	for (int j = 0; j < n; j++)
		if (fabs((acc += w[j].p) / mass - share) <= margin)
			return true;
	return false;
}

/* Whether draw u is within margin of a boundary of the host's pick for row l: a cumulative
 * share of the kept candidates, or a top_p cut that is itself near (then the kept set may be
 * one longer or shorter). */
static bool near_boundary(const float *l, int vocab, const struct cpu_samp *s, double u,
			  double margin, struct cpu_cand *w)
{
	bool top_p = s->top_p > 0 && s->top_p < 1;
	if (top_p && near_cut(l, vocab, s, s->top_p, margin, w))
		return true;
	double mass, acc = 0;
	int n = whole_list(w, &mass, l, vocab, s);
	if (top_p)
		for (int j = 0; j < n; j++)
			if ((acc += w[j].p / mass) >= s->top_p) {
				n = j + 1;
				break;
			}
	double sum = 0;
	for (int j = 0; j < n; j++)
		sum += w[j].p;
	acc = 0;
	for (int j = 0; j < n; j++)
		if (fabs((acc += w[j].p) / sum - u) < margin)
			return true;
	return false;
}

/* The kernel against the reference on random rows (every filter, ties, top_k 1, top_p tiny,
 * lists past the cap): the same list in the same order (ids may swap only between p within
 * 1e-6: a GPU's expf differs from the host's in the last bits), the same mass within 1e-6, the
 * same count but where the top_p target is within 1e-9 of a running sum; then the token the
 * pick makes from the device's list equals samp_pick's from the row for 16 draws each, but
 * where the draw is within 1e-5 of a boundary (counted). With neither filter, the list is the
 * pick made with the row's draw: the reference's is samp_pick's token exactly, the device's
 * too but within 1e-5 of a boundary, whatever the cap (a vocabulary of 3,000 with cap 16). */
Test(cuda_kernels, sample_cand_matches_ref)
{
	NEED_GPU();
	static const int vocabs[] = {1, 7, 300, 1000, 3000};
	static const float temps[] = {0, 0.3f, 1, 2.5f};
	static const float top_ps[] = {1, 0.9f, 0.5f, 1e-6f, 0.999999f, 0};
	enum { ROWS = 4, DRAWS = 16 };
	int rows = 0, overflows = 0, draws = 0, near = 0, near_differ = 0, picks = 0;
	for (int c = 0; c < 60; c++) {
		int vocab = vocabs[c % 5], cap = c % 3 == 0 ? 16 : WK_CUDA_CAND_MAX;
		float *l = malloc((size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp s[ROWS];
		for (int i = 0; i < ROWS; i++) {
			cand_logits(l + (size_t)i * vocab, vocab, (c + i) % 4);
			int ks[] = {0, 1, 5, 40, vocab - 1, vocab, vocab + 5, 2000};
			s[i] = (struct cpu_samp){temps[rnd_int(4)], top_ps[rnd_int(6)], ks[rnd_int(8)],
						 0, (rnd() + 1.0) * 0.5};
		}
		if (!(s[0].temperature > 0))
			s[0].temperature = 1;
		size_t cb = (size_t)ROWS * cap * sizeof(struct cpu_cand);
		struct cpu_cand *want = malloc(cb), *got = malloc(cb);
		struct cpu_cand *w = malloc((size_t)2 * vocab * sizeof *w);
		struct cpu_cand_head wh[ROWS], gh[ROWS];
		cpu_ref_sample_cand(want, wh, l, s, ROWS, vocab, cap, w);
		float *dl = to_dev(l, (size_t)ROWS * vocab * sizeof *l);
		struct cpu_samp *ds = to_dev(s, sizeof s);
		struct cpu_cand *dc = dev_alloc(cb);
		struct cpu_cand_head *dh = dev_alloc(sizeof gh);
		cr_assert_eq(wk_cuda_sample_cand(dc, dh, dl, ds, ROWS, vocab, cap, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(gh, dh, sizeof gh);
		from_dev(got, dc, cb);
		for (int i = 0; i < ROWS; i++, rows++) {
			const float *li = l + (size_t)i * vocab;
			const struct cpu_cand *wc = want + (size_t)i * cap, *gc = got + (size_t)i * cap;
			char tag[128];
			snprintf(tag, sizeof tag, "case %d row %d (vocab %d cap %d, T %g top_k %d top_p %g)",
				 c, i, vocab, cap, s[i].temperature, s[i].top_k, s[i].top_p);
			if (!(s[i].temperature > 0)) {
				cr_assert_eq(gh[i].count, 0, "%s", tag);
				continue;
			}
			cr_assert(fabs(gh[i].mass - wh[i].mass) <= 1e-6 * wh[i].mass,
				  "%s: mass %.17g, not %.17g", tag, gh[i].mass, wh[i].mass);
			struct samp_cfg cfg = {s[i].temperature, s[i].top_p, s[i].top_k, 0};
			if (!(s[i].top_k > 0 && s[i].top_k < vocab) &&
			    !(s[i].top_p > 0 && s[i].top_p < 1)) { /* the pick, with s[i].u */
				int tw = samp_pick(li, vocab, &cfg, s[i].u, (struct samp_cand *)w);
				cr_assert(wh[i].count == 1 && wc[0].id == tw, "%s: the reference picks "
					  "%d (count %d), samp_pick %d", tag, wc[0].id, wh[i].count, tw);
				cr_assert_eq(gh[i].count, 1, "%s", tag);
				bool nb = near_boundary(li, vocab, &s[i], s[i].u, 1e-5, w);
				near += nb;
				near_differ += nb && gc[0].id != tw;
				picks++;
				cr_assert(gc[0].id == tw || nb, "%s: draw %.17g gives %d, not %d", tag,
					  s[i].u, gc[0].id, tw);
				continue;
			}
			if (gh[i].count != wh[i].count) {
				double share = fmin(1, s[i].top_p + CPU_CAND_SLACK);
				cr_assert(s[i].top_p > 0 && s[i].top_p < 1 &&
						  near_cut(li, vocab, &s[i], share, 1e-9, w),
					  "%s: count %d, not %d", tag, gh[i].count, wh[i].count);
			}
			overflows += gh[i].count < 0;
			int m = gh[i].count < wh[i].count ? gh[i].count : wh[i].count;
			for (int j = 0; j < m; j++)
				cr_assert(gc[j].id == wc[j].id || fabsf(gc[j].p - wc[j].p) <= 1e-6f * wc[j].p,
					  "%s: candidate %d is id %d p %.9g, not id %d p %.9g", tag, j,
					  gc[j].id, gc[j].p, wc[j].id, wc[j].p);
			if (gh[i].count <= 0)
				continue;
			for (int d = 0; d < DRAWS; d++, draws++) {
				double u = (rnd() + 1.0) * 0.5;
				int tg = samp_pick_cand((const struct samp_cand *)gc, gh[i].count,
							gh[i].mass, s[i].top_p, u);
				int tw = samp_pick(li, vocab, &cfg, u, (struct samp_cand *)w);
				bool nb = near_boundary(li, vocab, &s[i], u, 1e-5, w);
				near += nb;
				near_differ += nb && tg != tw;
				cr_assert(tg == tw || nb, "%s: draw %.17g gives %d, not %d", tag, u, tg, tw);
			}
		}
		wk_cuda_free(dl);
		wk_cuda_free(ds);
		wk_cuda_free(dc);
		wk_cuda_free(dh);
		free(l);
		free(want);
		free(got);
		free(w);
	}
	cr_assert_gt(overflows, 0, "no row overflowed its cap");
	cr_assert_gt(picks, 20, "too few rows with neither filter");
	cr_log_info("sample_cand: %d rows, %d past the cap, %d picked on the device; %d draws "
		    "give samp_pick's token but %d of the %d within 1e-5 of a boundary", rows,
		    overflows, picks, draws + picks, near_differ, near);
}

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
