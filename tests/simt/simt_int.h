/*
 * simt_int.h - what the emulator's own files share beyond simt.h (which is the kernels' and
 * the backend's): the limits, a block's and its threads' state, and the functions and
 * variables one file defines and another uses. simt.cpp holds the threads, their blocks and
 * the block scheduler; simt_mem.cpp device memory's arena, its guard and the read-only path;
 * simt_runtime.cpp the runtime's state, simt_run and the CUDA runtime API. mma.cpp,
 * wgmma.cpp and the kernel files go through simt.h only.
 */
#ifndef WICK_SIMT_INT_H
#define WICK_SIMT_INT_H

#include "simt.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

enum {
	MAX_THREADS = 1024, /* per block, as CUDA */
	MAX_DYN_SMEM = 48 * 1024, /* dynamic shared memory without an opt-in attribute */
	MAX_DYN_SMEM_OPTIN = 227 * 1024, /* with one (cudaFuncSetAttribute), as sm_90 */
	PAGE = 4096, /* device allocations are whole pages, write-protected in interleaved launches */
	STACK = 256 * 1024, /* each fiber's, above one guard page */
	POISON = 0x7fffffff, /* a NaN as a float, INT_MAX as an int */
};

/* a cp.async not yet landed */
struct async_copy {
	void *dst;
	const void *src;
	int n, src_n;
};

#if defined(__x86_64__)
#define FIBER_SWITCH 1
#endif

struct fiber {
#ifdef FIBER_SWITCH
	void *sp; /* its saved stack pointer (fiber_switch's), a first entry's made by fiber_make */
#else
	jmp_buf jb; /* where it continues, once started */
	ucontext_t uc; /* its first entry */
#endif
	char *stack;
	dim3 tid;
	bool started, done;
	uint64_t busy_ns; /* WICK_SIMT_PROFILE: its turns' time this block, spin-waits left out */
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

/* A warp's lanes meet at warp_wait (a shuffle, a gather). What they exchange goes through two
 * buffers, picked by the parity of the meeting's generation: a lane writes before the meeting
 * and reads after it, and the next write to the same buffer is two meetings on, when every
 * lane has arrived at the meeting between, so has read. One meeting an exchange, not two. */
struct warp {
	int arrived, lanes;
	unsigned long gen;
	uint64_t v[2][32];
	unsigned char gather[2][32][GATHER_MAX];
};

/* A block on its SM: its threads, barrier, warps and shared memory. A launch runs its blocks
 * one after another in slot 0; an interleaved one (see interleaved()) keeps up to RESIDENT
 * blocks started at once and runs them a round each in turn. */
enum { RESIDENT = SIMT_SLOTS };
struct block_ctx {
	fiber fibers[MAX_THREADS]; /* not movable: uc points into itself */
	dim3 idx;
	unsigned long serial; /* simt_block_serial */
	int live; /* threads of the block not yet returned */
	unsigned round; /* and where block_run is in it: */
	bool in_round;
	size_t k, l; /* the warp (k-th in the round's order) and its next lane */
	unsigned long seen; /* progress when the warp's pass began */
	barrier bar;
	barrier named[16]; /* bar.sync id, count (simt_named_bar); [0] unused */
	int named_count[16];
	warp warps[MAX_THREADS / 32];
	std::vector<uint64_t> dyn_smem;
	/* its static shared variables' bytes while another block runs: (shared_vars index, bytes) */
	std::vector<std::pair<size_t, std::vector<char>>> saved;
};

/* ---- simt.cpp: the threads and their blocks ---------------------------------------------- */

extern block_ctx slots[RESIDENT];
extern bool interleaving;
extern unsigned cluster_n;
extern const std::function<void()> *body;
void poison(void *p, size_t n);
[[noreturn]] void fail(const char *what);
void fiber_make(fiber *f);
void switch_to(block_ctx *to);
bool interleaved(const char *kernel);
void run_grid(dim3 grid, size_t nt);

/* WICK_SIMT_PROFILE (simt_runtime.cpp writes it): what run_grid measured of the launch now
 * running, its blocks' threads' busy time (fiber::busy_ns) */
struct launch_prof {
	unsigned long blocks;
	double work_ns; /* every thread's, summed */
	double serial_ns; /* each block's busiest thread's, summed */
	double max_ns; /* the busiest thread's of the launch */
};
extern bool profiling; /* this launch's threads are timed */
extern launch_prof prof;

/* ---- simt_mem.cpp: device memory's guard, the read-only path ----------------------------- */

extern std::mutex guard_mu;
/* by device, DEVS of them (simt_mem.cpp) */
extern std::atomic<int> guard_open[];
extern size_t live_bytes[];
extern bool unguarded[];
extern std::atomic<int> launch_dev;
extern thread_local bool launching;
void guard_inc(unsigned mask);
void guard_dec(unsigned mask);
int arena_dev(uintptr_t a);
void *dev_map(int d, size_t len);
void guard_add(uintptr_t a, size_t len);
void guard_remove(uintptr_t a, size_t len);
void cow_begin(void);
void cow_end(void);

/* device memory open to this scope: a launch's device's, all of it */
struct dev_access {
	unsigned mask;
	explicit dev_access(unsigned m) : mask(m) { guard_inc(mask); }
	~dev_access() { guard_dec(mask); }
	dev_access(const dev_access &) = delete;
	dev_access &operator=(const dev_access &) = delete;
};

/* A copy's or memset's bytes open to this scope: only their pages (opening a device's
 * whole memory for each of a model's ~10^5 uploads would cost minutes in mprotect), and
 * only where their device is closed. guard_mu is held throughout, so no device opens or
 * closes meanwhile. */
struct span_access {
	std::unique_lock<std::mutex> g;
	std::pair<uintptr_t, uintptr_t> open[2];
	int n = 0;
	span_access(void *dst, const void *src, size_t len) : g(guard_mu)
	{
		for (const void *p : {(const void *)dst, src}) {
			int d = p ? arena_dev((uintptr_t)p) : -1;
			if (d < 0 || unguarded[d] || guard_open[d].load() > 0 || len == 0)
				continue;
			uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
			uintptr_t hi = ((uintptr_t)p + len + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
			if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) != 0) {
				perror("simt: mprotect of device memory");
				abort();
			}
			open[n++] = {lo, hi};
		}
	}
	~span_access()
	{
		for (int i = 0; i < n; i++)
			mprotect((void *)open[i].first, open[i].second - open[i].first, PROT_NONE);
	}
	span_access(const span_access &) = delete;
	span_access &operator=(const span_access &) = delete;
};

/* ---- simt_runtime.cpp: the runtime's state ----------------------------------------------- */

extern std::mutex rt_mu;
extern std::map<uintptr_t, size_t> dev_allocs;
extern uint64_t dev_gen;

#endif
