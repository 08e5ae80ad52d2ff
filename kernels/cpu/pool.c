/*
 * pool.c - a persistent thread pool for the CPU kernels.
 *
 * The engine runs ~10 pool jobs per layer per token, so a job must start in microseconds.
 * Workers are created once. Between jobs each worker spins on the job generation for a
 * while (SPIN_NS), then sleeps on a condition variable; the caller only takes the mutex to
 * broadcast when some worker is asleep.
 *
 * A job: the caller publishes fn/ctx/ntasks and bumps `gen`. Every thread (caller included)
 * claims task indices from the shared counter `next` until they run out. Each worker then
 * bumps `finished`; the caller returns once all workers have finished. Waiting for every
 * worker (not just for every task) is what makes it safe to overwrite the job description
 * for the next call: no worker can still be reading the old one.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/wk.h"
#include "kernels/cpu/cpu.h"

#define SPIN_NS 2000000 /* how long an idle worker spins before sleeping: 2 ms */
/* Pause-spins before a waiting thread starts calling sched_yield() between checks. With
 * more threads than free cores, a spinner would otherwise hold the core that the thread it
 * waits for needs, and every job would cost a scheduler time slice (~ms). */
#define SPINS_BEFORE_YIELD 100
#define MAX_THREADS 256

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct cpu_pool {
	int nthreads; /* including the caller */
	int nworkers; /* nthreads - 1 */
	pthread_t *threads;

	/* the current job; written by the caller before gen is bumped */
	void (*fn)(void *ctx, int task, int ntasks);
	void *ctx;
	int ntasks;
	atomic_int next;     /* next task index to claim */
	atomic_int finished; /* workers done with the current job */
	atomic_uint gen;     /* job generation */
	atomic_bool quit;

	atomic_int sleepers; /* workers blocked (or about to block) on cond */
	pthread_mutex_t mu;
	pthread_cond_t cond;
};

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void run_tasks(struct cpu_pool *p)
{
	int ntasks = p->ntasks;
	for (;;) {
		int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (i >= ntasks)
			break;
		p->fn(p->ctx, i, ntasks);
	}
}

/* Waits until gen differs from seen (or quit); returns the new generation. */
static unsigned wait_job(struct cpu_pool *p, unsigned seen)
{
	long long deadline = 0;
	for (unsigned spins = 0;; spins++) {
		unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g != seen || atomic_load_explicit(&p->quit, memory_order_acquire))
			return g;
		if ((spins & 255) == 0) {
			long long t = now_ns();
			if (!deadline)
				deadline = t + SPIN_NS;
			else if (t > deadline)
				break;
		}
		if (spins < SPINS_BEFORE_YIELD)
			cpu_relax();
		else
			sched_yield();
	}
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's gen/sleepers */
	unsigned g;
	while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->quit))
		pthread_cond_wait(&p->cond, &p->mu);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->mu);
	return g;
}

static void *worker_main(void *arg)
{
	struct cpu_pool *p = arg;
	unsigned seen = 0;
	for (;;) {
		seen = wait_job(p, seen);
		if (atomic_load_explicit(&p->quit, memory_order_acquire))
			return NULL;
		run_tasks(p);
		atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
	}
}

int cpu_pool_create(int nthreads, struct cpu_pool **out)
{
	*out = NULL;
	if (nthreads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = n > 0 ? (int)n : 1;
	}
	if (nthreads > MAX_THREADS)
		nthreads = MAX_THREADS;

	struct cpu_pool *p = calloc(1, sizeof *p);
	if (!p)
		return WK_ENOMEM;
	p->nthreads = nthreads;
	p->nworkers = 0;
	atomic_init(&p->next, 0);
	atomic_init(&p->finished, 0);
	atomic_init(&p->gen, 0);
	atomic_init(&p->quit, false);
	atomic_init(&p->sleepers, 0);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cond, NULL);
	if (nthreads > 1) {
		p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
		if (!p->threads)
			goto fail_nomem;
		for (int i = 0; i < nthreads - 1; i++) {
			if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0)
				goto fail_io;
			p->nworkers++;
		}
	}
	*out = p;
	return WK_OK;

fail_nomem:
	cpu_pool_destroy(p);
	return WK_ENOMEM;
fail_io:
	cpu_pool_destroy(p);
	return WK_EIO;
}

void cpu_pool_destroy(struct cpu_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->quit, true);
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->nworkers; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cond);
	free(p->threads);
	free(p);
}

int cpu_pool_size(const struct cpu_pool *p)
{
	return p ? p->nthreads : 1;
}

void cpu_pool_run(struct cpu_pool *p, void (*fn)(void *ctx, int task, int ntasks), void *ctx,
		  int ntasks)
{
	if (ntasks <= 0)
		return;
	if (!p || p->nworkers == 0 || ntasks == 1) {
		for (int i = 0; i < ntasks; i++)
			fn(ctx, i, ntasks);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->ntasks = ntasks;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
	atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the job, then read sleepers */
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->mu);
	}
	run_tasks(p);
	for (unsigned spins = 0;
	     atomic_load_explicit(&p->finished, memory_order_acquire) < p->nworkers; spins++) {
		if (spins < SPINS_BEFORE_YIELD)
			cpu_relax();
		else
			sched_yield();
	}
}
