/*
 * cuda_test.h - what the CUDA kernels' tests (test_cuda.c, test_cuda_glm.c, test_cuda_moe.c,
 * test_cuda_sample.c, test_cuda_chain.c) share: the skip where no GPU is visible, the
 * tolerance, random inputs, copies to and from the device, the relative error, bf16 and FP8
 * caches, random weights and sparse selections, a split's part scratch and one rank's MoE
 * experts. Defined in cuda_test.c. The helpers report a failure by failing the Criterion
 * test (cr_assert), never by returning: tests only. One xorshift state feeds every random
 * input (not thread-safe). Each test file keeps its own err buffer for the calls it makes.
 */
#ifndef WICK_TEST_CUDA_TEST_H
#define WICK_TEST_CUDA_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda_kernels.h"

#define TOL 1e-4

/* In a Criterion test: skips it (with a message) where no CUDA device is visible. */
#define NEED_GPU()                                                                          \
	do {                                                                                \
		if (cuda_device_count() <= 0)                                               \
			cr_skip_test("no CUDA device visible (or a build without CUDA): the " \
				     "kernels are compared on a GPU by scripts/gpu-check");   \
	} while (0)

/* ---- random inputs ---------------------------------------------------------------------- */

float rnd(void); /* uniform in [-1, 1) */
int rnd_int(int n); /* uniform in [0, n) */
/* n floats of rnd(), or n of v (fill_vec); both to free */
float *rnd_vec(size_t n);
float *fill_vec(size_t n, float v);

/* A random [rows][cols] weight in dtype t (host bytes); *scale gets FP8 block scales (else
 * NULL), sized [ceil(rows/128)][ceil(cols/128)]. */
void *rnd_weight(enum dt_type t, int rows, int cols, float **scale);

/* The random sparse selection of an MLA test: for query i, nsel[i] <= min(topk, keys)
 * ascending positions among its pos0 + i + 1 keys. */
void rnd_sel(int *sel, int *nsel, int n, int pos0, int topk);

/* ---- device memory ---------------------------------------------------------------------- */

/* bytes of device memory, uninitialized (dev_alloc), or a copy of host's (to_dev); both for
 * wk_cuda_free */
void *dev_alloc(size_t bytes);
void *to_dev(const void *host, size_t bytes);

/* bytes at device offset off (a fresh allocation of off + bytes); free the returned base */
void *to_dev_off(const void *host, size_t bytes, int off);

/* Waits for the kernels, then copies bytes from the device. */
void from_dev(void *host, const void *dev, size_t bytes);

/* The n floats of a split's part scratch dev made NaN (poison_parts) and, after a call, how
 * many it wrote (parts_written): the parts of a split (an empty part too: m -inf, l 0, acc 0)
 * are never NaN, so a call that ran unsplit writes none. */
void poison_parts(float *dev, size_t n);
size_t parts_written(const float *dev, size_t n);

/* ---- results and caches ----------------------------------------------------------------- */

/* max |got - want| / max |want| */
double rel(const float *got, const float *want, size_t n);

/* x rounded to bf16 (bits): a bf16 KV cache's copy of an f32 one */
uint16_t *to_bf16(const float *x, size_t n);

/* The cache of type kv (DT_F32 or DT_BF16) that x [n] becomes, in host memory: x itself, or
 * its bf16 copy (*own, to free) */
const void *kv_host(const float *x, size_t n, enum dt_type kv, void **own);

/* x [rows][w] as an FP8 cache, quantized by cpu_ref_cast: its e4m3 codes, and its scales
 * [rows][cpu_kv_blocks(w)] in *scales (both to free) */
uint8_t *to_fp8(const float *x, size_t rows, int w, float **scales);

/* ---- grouped MoE experts ---------------------------------------------------------------- */

/* One rank's n_local experts in dtype t: host weights for the reference (host), their device
 * copies (dev, a host array of device pointers) and the device table the kernel reads (tab). */
struct moe_set {
	int n_local;
	struct cpu_expert *host, *dev, *tab;
};

/* m's experts made: [inter][dim] gate and up, [dim][inter] down, random (rnd_weight) */
void moe_set_make(struct moe_set *m, enum dt_type t, int n_local, int dim, int inter);
void moe_set_free(struct moe_set *m);

/* The kernels' view of m's experts [ex0, ex0 + n_local) in t (no shared expert). */
struct wk_moe moe_of(const struct moe_set *m, enum dt_type t, int ex0, int dim, int inter);

#endif
