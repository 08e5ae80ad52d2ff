/*
 * simt.cpp - the emulator of simt.h: the fibers, the block scheduler, the barriers and
 * shuffles, cp.async, and the runtime API (the mma is in mma.cpp). See simt.h for what it
 * does and does not prove.
 *
 * Fibers: a thread's first entry is through makecontext/setcontext; after that, switches
 * use _setjmp/_longjmp, which (unlike swapcontext) make no system call to save the signal
 * mask: the kernels' tests switch tens of millions of times. A fiber runs simt_run's body,
 * marks itself done and switches back; the next block resumes it at the top of its loop, so
 * each fiber (and its stack) is made once per process. Jumping between stacks with
 * _longjmp is outside ISO C; glibc does it on x86-64 and aarch64 (coroutine libraries rely
 * on it), but not through _FORTIFY_SOURCE's __longjmp_chk, which takes a jump to another
 * stack for stack smashing: hence the #undef (some compilers define it by default).
 */
#undef _FORTIFY_SOURCE
#include "simt.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

enum {
	MAX_THREADS = 1024, /* per block, as CUDA */
	MAX_DYN_SMEM = 48 * 1024, /* dynamic shared memory without an opt-in attribute */
	STACK = 256 * 1024, /* each fiber's, above one guard page */
	POISON = 0x7fffffff, /* a NaN as a float, INT_MAX as an int */
};

/* a cp.async not yet landed */
struct async_copy {
	void *dst;
	const void *src;
	int n, src_n;
};

struct fiber {
	jmp_buf jb; /* where it continues, once started */
	ucontext_t uc; /* its first entry */
	char *stack;
	dim3 tid;
	bool started, done;
	std::vector<async_copy> copies; /* its cp.async copies not yet landed, in order */
	std::vector<size_t> group_ends; /* committed group k: copies[..group_ends[k]) */
};

/* the block barrier: arrived threads wait until gen changes */
struct barrier {
	int arrived;
	unsigned long gen;
	const char *site;
};

enum { GATHER_MAX = 64 }; /* bytes a lane, simt_warp_gather */

struct warp {
	int arrived, lanes;
	unsigned long gen;
	uint64_t v[32];
	unsigned char gather[32][GATHER_MAX];
};

static fiber fibers[MAX_THREADS]; /* not movable: uc points into itself */
static fiber *cur;
static jmp_buf sched_jb;
static const std::function<void()> *body;
static int live; /* threads of the block not yet returned */
static unsigned long progress; /* arrivals and returns: unchanged over a round = deadlock */
static barrier bar;
static warp warps[MAX_THREADS / 32];
static std::vector<uint64_t> dyn_smem;
static unsigned long block_serial;
static cudaError_t last_err;

struct shared_var {
	void *p;
	unsigned long serial; /* the block that last poisoned it */
};
static std::vector<shared_var> shared_vars;

static void poison(void *p, size_t n)
{
	if (n == 0) /* p may be NULL: no dynamic shared memory */
		return;
	uint32_t w = POISON;
	char *c = (char *)p;
	size_t i = 0;
	for (; i + 4 <= n; i += 4)
		memcpy(c + i, &w, 4);
	memset(c + i, 0xff, n - i);
}

[[noreturn]] static void fail(const char *what)
{
	fprintf(stderr, "simt: %s in block (%u,%u,%u), thread (%u,%u,%u)\n", what, blockIdx.x,
		blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
	abort();
}

/* ---- fibers ------------------------------------------------------------------------------ */

static void to_sched(void)
{
	if (!_setjmp(cur->jb))
		_longjmp(sched_jb, 1);
}

static void fiber_main(void)
{
	for (;;) {
		(*body)();
		cur->done = true;
		live--;
		progress++;
		if (bar.arrived > 0 && bar.arrived == live) { /* it was the last one missing */
			bar.arrived = 0;
			bar.gen++;
		}
		to_sched();
	}
}

static void resume(fiber *f)
{
	if (_setjmp(sched_jb))
		return;
	if (f->started)
		_longjmp(f->jb, 1);
	f->started = true;
	setcontext(&f->uc);
	abort(); /* setcontext returns only on failure */
}

static void fiber_make(fiber *f)
{
	size_t page = 4096;
	char *m = (char *)mmap(NULL, STACK + page, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0 || getcontext(&f->uc) != 0) {
		perror("simt: fiber stack");
		abort();
	}
	f->stack = m;
	f->uc.uc_stack.ss_sp = m + page;
	f->uc.uc_stack.ss_size = STACK;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, fiber_main, 0);
}

/* ---- barriers and shuffles ------------------------------------------------------------- */

void simt_syncthreads(const char *site)
{
	if (bar.arrived == 0)
		bar.site = site;
	else if (bar.site != site && strcmp(bar.site, site) != 0) {
		char m[512];
		snprintf(m, sizeof m, "__syncthreads at %s while others wait at %s", site,
			 bar.site);
		fail(m);
	}
	progress++;
	unsigned long g = bar.gen;
	if (++bar.arrived == live) {
		bar.arrived = 0;
		bar.gen++;
		return;
	}
	while (bar.gen == g)
		to_sched();
}

static int linear_tid(void)
{
	return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

int simt_lane(void)
{
	return linear_tid() & 31;
}

static void warp_wait(warp &w)
{
	progress++;
	unsigned long g = w.gen;
	if (++w.arrived == w.lanes) {
		w.arrived = 0;
		w.gen++;
		return;
	}
	while (w.gen == g)
		to_sched();
}

void simt_warp_exchange(uint64_t *v, int src)
{
	int t = linear_tid();
	warp &w = warps[t / 32];
	if (src < 0 || src >= w.lanes)
		fail("shuffle from a lane the warp does not have");
	w.v[t & 31] = *v;
	warp_wait(w); /* every lane has written */
	uint64_t r = w.v[src];
	warp_wait(w); /* every lane has read */
	*v = r;
}

int simt_warp_gather(const void *mine, void *all, size_t n)
{
	if (n > GATHER_MAX)
		fail("warp gather of more than 64 bytes a lane");
	int t = linear_tid();
	warp &w = warps[t / 32];
	memcpy(w.gather[t & 31], mine, n);
	warp_wait(w); /* every lane has written */
	for (int l = 0; l < w.lanes; l++)
		memcpy((char *)all + (size_t)l * n, w.gather[l], n);
	warp_wait(w); /* every lane has read */
	return w.lanes;
}

/* ---- cp.async: copies land when a wait retires their group ------------------------------ */

void simt_cp_async(void *dst, const void *src, int n, int src_n)
{
	if ((n != 4 && n != 8 && n != 16) || src_n < 0 || src_n > n)
		fail("cp.async of a size it does not have");
	if ((uintptr_t)dst % (unsigned)n != 0 || (src_n > 0 && (uintptr_t)src % (unsigned)n != 0))
		fail("cp.async to or from a misaligned address");
	cur->copies.push_back({dst, src, n, src_n});
}

void simt_cp_async_commit(void)
{
	cur->group_ends.push_back(cur->copies.size());
}

void simt_cp_async_wait(int pending)
{
	fiber *f = cur;
	size_t groups = f->group_ends.size();
	if (pending < 0 || groups <= (size_t)pending)
		return;
	size_t done = groups - (size_t)pending, end = f->group_ends[done - 1];
	for (size_t i = 0; i < end; i++) {
		const async_copy &c = f->copies[i];
		memcpy(c.dst, c.src, (size_t)c.src_n);
		memset((char *)c.dst + c.src_n, 0, (size_t)(c.n - c.src_n));
	}
	f->copies.erase(f->copies.begin(), f->copies.begin() + (long)end);
	f->group_ends.erase(f->group_ends.begin(), f->group_ends.begin() + (long)done);
	for (size_t &e : f->group_ends)
		e -= end;
}

void simt_shared(void *p, size_t n)
{
	for (shared_var &s : shared_vars)
		if (s.p == p) {
			if (s.serial != block_serial) {
				s.serial = block_serial;
				poison(p, n);
			}
			return;
		}
	shared_vars.push_back({p, block_serial});
	poison(p, n);
}

void *simt_dyn_smem(void)
{
	return dyn_smem.data();
}

/* ---- launches ---------------------------------------------------------------------------- */

static void run_block(size_t nt)
{
	block_serial++;
	poison(dyn_smem.data(), dyn_smem.size() * sizeof dyn_smem[0]);
	bar = barrier{};
	for (size_t w = 0; w < (nt + 31) / 32; w++) {
		warps[w].arrived = 0;
		warps[w].lanes = (int)(nt - w * 32 < 32 ? nt - w * 32 : 32);
	}
	size_t i = 0;
	for (unsigned z = 0; z < blockDim.z; z++)
		for (unsigned y = 0; y < blockDim.y; y++)
			for (unsigned x = 0; x < blockDim.x; x++, i++) {
				fibers[i].tid = dim3(x, y, z);
				fibers[i].done = false;
				fibers[i].copies.clear(); /* a returned thread's copies never land */
				fibers[i].group_ends.clear();
			}
	live = (int)nt;
	/* Warp by warp, each run until all its lanes wait at __syncthreads or have returned (a
	 * warp races ahead of the others, as on a GPU); forwards and backwards in turn. */
	size_t nw = (nt + 31) / 32;
	for (unsigned round = 0; live > 0; round++) {
		unsigned long before = progress;
		for (size_t k = 0; k < nw; k++) {
			size_t w = round & 1 ? nw - 1 - k : k;
			size_t lanes = (size_t)warps[w].lanes;
			unsigned long seen;
			do {
				seen = progress;
				for (size_t l = 0; l < lanes; l++) {
					fiber *f = &fibers[w * 32 + (round & 1 ? lanes - 1 - l : l)];
					if (f->done)
						continue;
					cur = f;
					threadIdx = f->tid;
					resume(f);
				}
			} while (progress != seen);
		}
		if (progress == before) {
			char m[160];
			snprintf(m, sizeof m,
				 "deadlock: %d of %d threads left, %d at __syncthreads (%s), the "
				 "rest in warp shuffles",
				 live, (int)nt, bar.arrived, bar.arrived ? bar.site : "-");
			threadIdx = dim3(0, 0, 0);
			fail(m);
		}
	}
}

void simt_run(dim3 grid, dim3 block, size_t smem, const std::function<void()> &fn)
{
	size_t nt = (size_t)block.x * block.y * block.z;
	if (nt == 0 || nt > MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64 ||
	    grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
	    grid.y > 65535 || grid.z > 65535 || smem > MAX_DYN_SMEM) {
		last_err = cudaErrorInvalidConfiguration;
		return;
	}
	for (size_t i = 0; i < nt; i++)
		if (!fibers[i].stack)
			fiber_make(&fibers[i]);
	gridDim = grid;
	blockDim = block;
	body = &fn;
	dyn_smem.assign((smem + 7) / 8, 0);
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				blockIdx = dim3(x, y, z);
				run_block(nt);
			}
	body = NULL;
}

/* ---- the runtime API --------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t n)
{
	size_t sz = (n + 255) / 256 * 256;
	*p = sz ? aligned_alloc(256, sz) : NULL;
	if (!*p)
		return cudaErrorMemoryAllocation;
	poison(*p, sz);
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	(void)kind;
	memmove(dst, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
	memset(p, v, n);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	(void)s;
	return cudaMemset(p, v, n);
}

cudaError_t cudaDeviceSynchronize(void)
{
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_err;
	last_err = cudaSuccess;
	return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	default: return "unknown error";
	}
}

/* kernels/cuda/cuda_kernels.h: the emulated device (kernels/cuda/cuda_none.c is not linked) */
extern "C" int cuda_device_count(void)
{
	return 1;
}
