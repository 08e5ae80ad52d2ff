/*
 * test_cuda.c - the core CUDA kernels (kernels/cuda/cuda_kernels.h: kernels.cu and the GEMMs)
 * against their CPU references (kernels/cpu/cpu.h) on the same random inputs: only the order
 * of the sums differs, so the results must agree within 1e-4 of the largest output (the
 * issue's bound is 1e-3), and the discrete choices (the router's experts, the DSA indexer's
 * positions) exactly. Where no GPU is visible (this machine, or a build without CUDA) each
 * test is skipped with a message; scripts/gpu-check runs them on a GPU machine.
 * The other kernel families, in the same suite (cuda_kernels) on the same helpers
 * (cuda_test.h): test_cuda_glm.c, test_cuda_moe.c, test_cuda_sample.c and test_cuda_chain.c.
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
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/cuda_test.h"

static char err[WK_ERRSZ];

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
 * copies so that it faults there too (simt_mem.cpp: a backend that reads a device pointer on
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
 * (simt_mem.cpp). Needs two devices (the emulator is given two). */
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


/* wk_cuda_fp8w_mode's flags as the lab prints them */
static const char *mode_name(int mode)
{
	static const char *names[4] = {"", " wf", " rs", " rs wf"};
	return names[mode & 3];
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
 * byte off a 16-byte boundary; every output poisoned first; each case in every
 * wk_cuda_fp8w_mode (the bf16 weight tile in shared memory or the weights as the register
 * operand, fp8w_tile_rs; the token or the weight tiles fastest in the grid). Under the
 * emulator this checks
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
			for (int mode = 0; mode < 4; mode++) { /* each wk_cuda_fp8w_mode */
				const char *mn = mode_name(mode);
				for (size_t i = 0; i < ny; i++)
					got[i] = NAN;
				cr_assert_eq(wk_cuda_upload(dy, got, ny * 4, err, sizeof err), WK_OK,
					     "%s", err);
				wk_cuda_fp8w_mode(mode);
				int rc = wk_cuda_gemm_fp8w(dy, dxb, dw + off, dws, n, rows, cols, err,
							   sizeof err);
				wk_cuda_fp8w_mode(0);
				cr_assert_eq(rc, WK_OK, "%s", err);
				from_dev(got, dy, ny * 4);
				double r = rel_rows(got, want, n, rows);
				cr_expect_leq(r, 1e-5, "gemm_fp8w%s n=%d rows=%d cols=%d off=%d: %g", mn,
					      n, rows, cols, off, r);
				cr_log_info("gemm_fp8w%s n=%d rows=%d cols=%d off=%d: %.3g", mn, n, rows,
					    cols, off, r);
			}
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

/* One attention test case's inputs: random q [n][heads][hd] (times qmul) and a cache of
 * pos0 + n positions of type kv (f32, bf16, or FP8 with a scale per row of hd, each row's
 * values scaled by a factor of its own), its rows one head wider (FP8) or 16 floats wider
 * than the kv heads; the host's (hs) and the device's (ds) views of it, and dq, dout on the
 * device. */
struct att_io {
	size_t nq, nk;
	float *q, *k, *v, *ks, *vs, *dks, *dvs, *dq, *dout;
	void *k16, *v16, *dk, *dv;
	struct cpu_gqa hs, ds;
};

static void att_io_make(struct att_io *a, int n, int pos0, enum dt_type kv, int heads, int kvh,
			int hd, float qmul)
{
	bool f8 = kv == DT_F8_E4M3;
	int stride = f8 ? (kvh + 1) * hd : kvh * hd + 16;
	memset(a, 0, sizeof *a);
	a->nq = (size_t)n * heads * hd, a->nk = (size_t)(pos0 + n) * stride;
	a->q = rnd_vec(a->nq), a->k = rnd_vec(a->nk), a->v = rnd_vec(a->nk);
	for (size_t i = 0; i < a->nq; i++)
		a->q[i] *= qmul;
	for (size_t i = 0; f8 && i < a->nk; i++) {
		a->k[i] *= 0.25f + (float)(i / (size_t)hd % 11);
		a->v[i] *= 0.25f + (float)(i / (size_t)hd % 7);
	}
	const void *kh, *vh;
	if (f8) {
		kh = a->k16 = to_fp8(a->k, a->nk / (size_t)hd, hd, &a->ks);
		vh = a->v16 = to_fp8(a->v, a->nk / (size_t)hd, hd, &a->vs);
		size_t sb = a->nk / (size_t)hd * (size_t)cpu_kv_blocks(hd) * sizeof(float);
		a->dks = to_dev(a->ks, sb);
		a->dvs = to_dev(a->vs, sb);
	} else {
		kh = kv_host(a->k, a->nk, kv, &a->k16);
		vh = kv_host(a->v, a->nk, kv, &a->v16);
	}
	a->hs = (struct cpu_gqa){kh, vh, a->ks, a->vs, kv, heads, kvh, hd, stride,
				 1.0f / sqrtf((float)hd), NULL, NULL, 0, 0};
	a->dq = to_dev(a->q, a->nq * 4);
	a->dout = dev_alloc(a->nq * 4);
	a->dk = to_dev(kh, a->nk * dt_size(kv));
	a->dv = to_dev(vh, a->nk * dt_size(kv));
	a->ds = a->hs;
	a->ds.k = a->dk, a->ds.v = a->dv, a->ds.ks = a->dks, a->ds.vs = a->dvs;
}

static void att_io_free(struct att_io *a)
{
	free(a->k16);
	free(a->v16);
	free(a->ks);
	free(a->vs);
	wk_cuda_free(a->dks);
	wk_cuda_free(a->dvs);
	wk_cuda_free(a->dq);
	wk_cuda_free(a->dk);
	wk_cuda_free(a->dv);
	wk_cuda_free(a->dout);
	free(a->q);
	free(a->k);
	free(a->v);
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
		int n = cases[c].n, pos0 = cases[c].pos0;
		int heads = cases[c].heads, kvh = cases[c].kvh, hd = cases[c].hd;
		enum dt_type kv = (enum dt_type)cases[c].kv;
		struct att_io a;
		att_io_make(&a, n, pos0, kv, heads, kvh, hd, 1.0f);
		size_t nq = a.nq;
		float *dq = a.dq, *dout = a.dout;
		struct cpu_gqa ds = a.ds;
		float *want = malloc(nq * 4), *got = malloc(nq * 4);
		cpu_ref_attention(want, a.q, &a.hs, n, pos0);
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
		att_io_free(&a);
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

/* A prefill's attention through query tiles, on the f32 pipes (k_att_tiled,
 * wk_cuda_attention_path 2) and on the tensor cores (k_att_mma, 3): every shape they take
 * against the reference, each path forced, on f32, bf16 and FP8 caches: tokens in whole and
 * partial tiles of 64 / GM rows (GM the heads of a kv head a block: 8 with a second block of
 * 4 for 12 heads, 4 with one empty for 3, 1 for 1), prefills from 0 and chunks after earlier
 * positions, head_dim 8 to 128 (the most they take; 40 and 8 are not whole k-steps of 16).
 * Then which path each call takes: the tensor cores' for a prefill of 32 tokens or more of
 * one sequence on its own; fewer, several sequences or head_dim 129 not; forced, the one
 * forced where it can run. */
Test(cuda_kernels, attention_prefill_tiles_match_ref)
{
	NEED_GPU();
	static const struct {
		int n, pos0, kv, heads, kvh, hd;
	} cases[] = {{40, 0, DT_F32, 8, 2, 64},      {33, 37, DT_BF16, 8, 2, 64},
		     {70, 5, DT_F8_E4M3, 8, 2, 64},  {24, 100, DT_F32, 12, 1, 128},
		     {65, 0, DT_F8_E4M3, 12, 1, 128}, {50, 3, DT_BF16, 6, 2, 40},
		     {130, 0, DT_F32, 3, 3, 8},      {20, 0, DT_F32, 4, 4, 128},
		     {7, 9, DT_F32, 2, 1, 16},       {1, 40, DT_BF16, 8, 2, 64}};
	for (int path = 2; path <= 3; path++)
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		wk_cuda_attention_force(path);
		int n = cases[c].n, pos0 = cases[c].pos0;
		int heads = cases[c].heads, kvh = cases[c].kvh, hd = cases[c].hd;
		enum dt_type kv = (enum dt_type)cases[c].kv;
		struct att_io a; /* peaked softmaxes (q times 3), where a row's max matters */
		att_io_make(&a, n, pos0, kv, heads, kvh, hd, 3.0f);
		float *want = malloc(a.nq * 4), *got = malloc(a.nq * 4);
		cpu_ref_attention(want, a.q, &a.hs, n, pos0);
		cr_expect_eq(wk_cuda_attention_path(&a.ds, n, pos0), path);
		cr_assert_eq(wk_cuda_attention(a.dout, a.dq, &a.ds, n, pos0, NULL, err, sizeof err),
			     WK_OK, "%s", err);
		from_dev(got, a.dout, a.nq * 4);
		double r = rel(got, want, a.nq);
		cr_expect_leq(r, TOL, "path %d n=%d pos0=%d %d:%d heads of %d, %s cache: %g", path,
			      n, pos0, heads, kvh, hd, dt_name(kv), r);
		att_io_free(&a);
		free(want);
		free(got);
	}
	float dummy;
	int one = 0;
	struct cpu_gqa b = {&dummy, &dummy, NULL, NULL, DT_F32, 8, 2, 129, 258, 1.0f,
			    NULL, NULL, 0, 0};
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 0), 1, "head_dim 129, forced");
	b.head_dim = 128;
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 0), 3);
	wk_cuda_attention_force(2);
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 0), 2, "forced to 2");
	wk_cuda_attention_force(1);
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 0), 1, "forced to 1");
	wk_cuda_attention_force(0);
	cr_expect_eq(wk_cuda_attention_path(&b, 32, 0), 3, "a prefill of 32");
	cr_expect_eq(wk_cuda_attention_path(&b, 31, 100), 1, "a chunk of 31");
	cr_expect_eq(wk_cuda_attention_path(&b, 1, 900), 1, "a decode");
	/* 8:2 heads, 16 tokens a tile: 8 blocks at 64 tokens, 130 at 1,040, 132 at 1,056 */
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 5000), 1, "64 tokens after 5,000");
	cr_expect_eq(wk_cuda_attention_path(&b, 1056, 5000), 3, "1,056 tokens after 5,000");
	cr_expect_eq(wk_cuda_attention_path(&b, 1040, 5000), 1, "1,040 tokens after 5,000");
	b.seq = b.pos = &one;
	cr_expect_eq(wk_cuda_attention_path(&b, 64, 0), 1, "several sequences");
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
