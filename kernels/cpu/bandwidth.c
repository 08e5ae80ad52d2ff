/*
 * bandwidth.c - the machine's read bandwidth: the roofline a decode step is compared with.
 *
 * Each pool thread first touches its own share of the buffer (so its pages are mapped, and
 * on a NUMA machine local to it), then every thread streams its share with AVX2 loads until
 * `seconds` have passed. GB/s = bytes read by all threads / wall time of the streaming phase.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/wk.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h"

#define ALIGN (2u << 20) /* a huge page */
#define PASS_BYTES (256u << 10) /* bytes streamed between clock checks */

struct bw_job {
	char *buf;
	size_t share; /* bytes per task, a multiple of PASS_BYTES */
	double t0, seconds;
	bool touch, avx2;
	_Atomic uint64_t bytes;
	_Atomic uint64_t sink;
};

static uint64_t stream_sum_scalar(const void *buf, size_t bytes)
{
	const uint64_t *p = buf;
	uint64_t a = 0, b = 0, c = 0, d = 0;
	for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
		a += p[i];
		b += p[i + 1];
		c += p[i + 2];
		d += p[i + 3];
	}
	return a + b + c + d;
}

static void bw_task(void *ctx, int task, int ntasks)
{
	(void)ntasks;
	struct bw_job *j = ctx;
	char *mine = j->buf + (size_t)task * j->share;
	if (j->touch) {
		for (size_t i = 0; i < j->share; i += 4096)
			memset(mine + i, (int)(i >> 12) & 0xff, 4096);
		return;
	}
	uint64_t sum = 0, bytes = 0;
	do {
		for (size_t off = 0; off < j->share; off += PASS_BYTES) {
			sum += j->avx2 ? cpu_stream_sum_avx2(mine + off, PASS_BYTES)
				       : stream_sum_scalar(mine + off, PASS_BYTES);
			bytes += PASS_BYTES;
		}
	} while (wk_now() - j->t0 < j->seconds);
	atomic_fetch_add(&j->bytes, bytes);
	atomic_fetch_add(&j->sink, sum);
}

double cpu_read_bandwidth(struct cpu_pool *p, size_t bytes, double seconds)
{
	int threads = cpu_pool_size(p);
	size_t share = bytes / (size_t)threads;
	share = (share + PASS_BYTES - 1) / PASS_BYTES * PASS_BYTES;
	size_t total = share * (size_t)threads;
	total = (total + ALIGN - 1) / ALIGN * ALIGN;
	char *buf = aligned_alloc(ALIGN, total);
	if (!buf)
		return -1.0;
#ifdef MADV_HUGEPAGE
	madvise(buf, total, MADV_HUGEPAGE); /* a hint; failure is harmless */
#endif
	struct bw_job j = {.buf = buf, .share = share, .seconds = seconds, .touch = true,
			   .avx2 = cpu_has_avx2()};
	atomic_init(&j.bytes, 0);
	atomic_init(&j.sink, 0);
	cpu_pool_run(p, bw_task, &j, threads);

	j.touch = false;
	j.t0 = wk_now();
	cpu_pool_run(p, bw_task, &j, threads);
	double dt = wk_now() - j.t0;

	/* The sum is kept in an atomic the compiler must assume is read. */
	(void)atomic_load(&j.sink);
	free(buf);
	return dt > 0 ? (double)atomic_load(&j.bytes) / dt / 1e9 : -1.0;
}
