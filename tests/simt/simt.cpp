/*
 * simt.cpp - the emulator of simt.h: the fibers, the block scheduler, the barriers and
 * shuffles, cp.async, and the runtime API (the mma is in mma.cpp). See simt.h for what it
 * does and does not prove.
 *
 * Fibers: the kernels' tests switch tens of millions of times, so a switch makes no system
 * call. On x86-64 it is fiber_switch below: the callee-saved registers pushed on the old
 * stack, the stack pointer swapped, the new stack's popped (what a coroutine library does;
 * the signal mask and the FPU control words stay as they are: nothing here changes them);
 * glibc's _longjmp, which it replaced, spent most of each switch unwinding cancellation
 * handlers. Elsewhere a thread's first entry is through makecontext/setcontext, and
 * switches after it use _setjmp/_longjmp, which (unlike swapcontext) save no signal mask.
 * A fiber runs simt_run's body, marks itself done and switches back; the next block
 * resumes it at the top of its loop, so each fiber (and its stack) is made once per
 * process. Jumping between stacks with _longjmp is outside ISO C; glibc does it on aarch64
 * (coroutine libraries rely on it), but not through _FORTIFY_SOURCE's __longjmp_chk, which
 * takes a jump to another stack for stack smashing: hence the #undef (some compilers
 * define it by default).
 */
#undef _FORTIFY_SOURCE
#include "simt.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

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
static block_ctx slots[RESIDENT];
static block_ctx *blk = &slots[0]; /* the block running now */
static bool interleaving; /* the launch now running interleaves its blocks */
static unsigned cluster_n = 1; /* > 1: a cluster launch, clusters of cluster_n blocks along x */
static barrier cluster_bar; /* barrier.cluster of the cluster running now */
static unsigned long interleaved_launches;
static fiber *cur;
#ifdef FIBER_SWITCH
static void *sched_sp; /* the scheduler's stack pointer while a fiber runs */
#else
static jmp_buf sched_jb;
#endif
static const std::function<void()> *body;
static unsigned long progress; /* arrivals and returns: unchanged over a round = deadlock */
static unsigned long block_serial;
static thread_local cudaError_t last_err;

/* A static __shared__ variable: one copy (the generated code's static), holding the bytes of
 * the block whose serial it carries; switching blocks swaps them (switch_to). */
struct shared_var {
	void *p;
	size_t n;
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

#ifdef FIBER_SWITCH
/* fiber_switch(&save, to): pushes the callee-saved registers, stores the stack pointer in
 * save, and continues on stack `to` (a fiber_switch's save, or fiber_make's first frame),
 * popping its registers and returning where that stack left off (System V x86-64 ABI). */
extern "C" void simt_fiber_switch(void **save, void *to);
asm(".text\n"
    ".globl simt_fiber_switch\n"
    ".hidden simt_fiber_switch\n"
    ".type simt_fiber_switch, @function\n"
    "simt_fiber_switch:\n"
    "\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
    "\tmovq %rsp, (%rdi)\n"
    "\tmovq %rsi, %rsp\n"
    "\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n"
    "\tret\n"
    ".size simt_fiber_switch, .-simt_fiber_switch\n");
#endif

static void to_sched(void)
{
#ifdef FIBER_SWITCH
	simt_fiber_switch(&cur->sp, sched_sp);
#else
	if (!_setjmp(cur->jb))
		_longjmp(sched_jb, 1);
#endif
}

static int cluster_live(void);

/* The cluster barrier's last missing thread has arrived or returned: it opens. */
static void cluster_release(void)
{
	if (cluster_bar.arrived > 0 && cluster_bar.arrived == cluster_live()) {
		cluster_bar.arrived = 0;
		cluster_bar.gen++;
	}
}

static void fiber_main(void)
{
	for (;;) {
		(*body)();
		if (!interleaving) /* no bulk stores there (simt_block_serial) */
			simt_bulk_on_return();
		cur->done = true;
		blk->live--;
		progress++;
		barrier &bar = blk->bar;
		if (bar.arrived > 0 && bar.arrived == blk->live) { /* it was the last one missing */
			bar.arrived = 0;
			bar.gen++;
		}
		cluster_release();
		to_sched();
	}
}

static void resume(fiber *f)
{
#ifdef FIBER_SWITCH
	f->started = true;
	simt_fiber_switch(&sched_sp, f->sp);
#else
	if (_setjmp(sched_jb))
		return;
	if (f->started)
		_longjmp(f->jb, 1);
	f->started = true;
	setcontext(&f->uc);
	abort(); /* setcontext returns only on failure */
#endif
}

/* Each stack's top is moved by a different multiple of 64 bytes (its colour, below 128 KiB,
 * above the STACK bytes it always has): with tops all at one offset in their pages, the
 * fibers' live frames fell into the same few cache sets and evicted one another at every
 * switch. */
static void fiber_make(fiber *f)
{
	static unsigned made;
	size_t page = 4096, colour = (size_t)(made++ * 37 % 2048) * 64;
	char *m = (char *)mmap(NULL, STACK + colour + page, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
#ifdef FIBER_SWITCH
	if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) {
		perror("simt: fiber stack");
		abort();
	}
	f->stack = m;
	/* the first frame, as fiber_switch leaves one: six registers (zero), then the address
	 * it returns to, fiber_main's entry, above which a null return address ends a
	 * backtrace and leaves the stack pointer as a call would (16-byte aligned + 8) */
	uintptr_t *sp = (uintptr_t *)((uintptr_t)(m + page + STACK + colour) & ~(uintptr_t)15);
	*--sp = 0;
	*--sp = (uintptr_t)fiber_main;
	for (int i = 0; i < 6; i++)
		*--sp = 0;
	f->sp = sp;
#else
	if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0 || getcontext(&f->uc) != 0) {
		perror("simt: fiber stack");
		abort();
	}
	f->stack = m;
	f->uc.uc_stack.ss_sp = m + page;
	f->uc.uc_stack.ss_size = STACK + colour;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, fiber_main, 0);
#endif
}

void simt_nanosleep(unsigned)
{
	if (interleaving || cluster_n > 1) { /* the others run; a pass in which every block only waits aborts */
		to_sched();
		return;
	}
	static unsigned long polls; /* over the whole run: a correct wait never polls here */
	if (++polls == 1000)
		fail("__nanosleep 1000 times: waiting for blocks that will never run (blocks run "
		     "one at a time here, so what a block waits for must have run before it)");
}

void simt_trap(const char *site)
{
	char m[256];
	snprintf(m, sizeof m, "__trap at %s", site);
	fail(m);
}

/* ---- barriers and shuffles ------------------------------------------------------------- */

void simt_syncthreads(const char *site)
{
	barrier &bar = blk->bar;
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
	if (++bar.arrived == blk->live) {
		bar.arrived = 0;
		bar.gen++;
		return;
	}
	while (bar.gen == g)
		to_sched();
}

/* A named barrier counts its arrivals up to its count; threads that return are not counted
 * for it (unlike __syncthreads: a bar.sync's count is fixed), so a count that is never
 * reached is a deadlock. */
void simt_named_bar(int id, int count)
{
	if (id < 1 || id > 15 || count <= 0 || count % 32 != 0 ||
	    count > (int)(blockDim.x * blockDim.y * blockDim.z))
		fail("bar.sync with an id outside 1..15 or a count not a multiple of 32 threads");
	barrier &bar = blk->named[id];
	if (bar.arrived == 0)
		blk->named_count[id] = count;
	else if (blk->named_count[id] != count)
		fail("bar.sync on one id with two thread counts");
	progress++;
	unsigned long g = bar.gen;
	if (++bar.arrived == count) {
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
	warp &w = blk->warps[t / 32];
	if (src < 0 || src >= w.lanes)
		fail("shuffle from a lane the warp does not have");
	uint64_t *buf = w.v[w.gen & 1];
	buf[t & 31] = *v;
	warp_wait(w); /* every lane has written */
	*v = buf[src];
}

int simt_warp_gather(const void *mine, void *all, size_t n)
{
	if (n > GATHER_MAX)
		fail("warp gather of more than 64 bytes a lane");
	int t = linear_tid();
	warp &w = blk->warps[t / 32];
	unsigned char(*buf)[GATHER_MAX] = w.gather[w.gen & 1];
	memcpy(buf[t & 31], mine, n);
	warp_wait(w); /* every lane has written */
	for (int l = 0; l < w.lanes; l++)
		memcpy((char *)all + (size_t)l * n, buf[l], n);
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
			if (s.serial != blk->serial) {
				s.serial = blk->serial;
				poison(p, n);
			}
			return;
		}
	shared_vars.push_back({p, n, blk->serial});
	poison(p, n);
}

void *simt_dyn_smem(void)
{
	return blk->dyn_smem.data();
}

uint32_t simt_smem_addr(const void *p)
{
	const std::vector<uint64_t> &dyn_smem = blk->dyn_smem;
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)dyn_smem.data();
	if (a < b || a >= b + dyn_smem.size() * sizeof dyn_smem[0])
		fail("a shared-window address of a pointer outside the dynamic shared memory");
	return (uint32_t)(a - b);
}

/* The block of rank `rank` in the running block's cluster (a block is a cluster of one
 * outside a cluster launch). */
static block_ctx *rank_block(unsigned rank)
{
	if (rank >= (cluster_n > 1 ? cluster_n : 1))
		fail("a shared::cluster address of a rank the cluster does not have");
	return cluster_n > 1 ? &slots[rank] : blk;
}

int simt_smem_slot(uint32_t addr, uint32_t *off)
{
	block_ctx *b = addr >> 24 ? rank_block((addr >> 24) - 1) : blk;
	if (b->live == 0) /* its shared memory is gone on a GPU (the cluster's next may reuse it) */
		fail("shared memory of a CTA of the cluster that has exited (an arrival, or a "
		     "multicast copy, after its last thread returned)");
	*off = addr & 0xffffff;
	return (int)(b - slots);
}

void *simt_smem_ptr(uint32_t addr, size_t n)
{
	uint32_t off;
	const std::vector<uint64_t> &dyn_smem = slots[simt_smem_slot(addr, &off)].dyn_smem;
	if ((size_t)off + n > dyn_smem.size() * sizeof dyn_smem[0])
		fail("a shared-memory operand outside the dynamic shared memory");
	return (char *)dyn_smem.data() + off;
}

unsigned simt_cluster_rank(void)
{
	return cluster_n > 1 ? blockIdx.x % cluster_n : 0;
}

uint32_t simt_mapa(uint32_t addr, unsigned rank)
{
	rank_block(rank); /* checks it */
	return (addr & 0xffffff) | (rank + 1) << 24;
}

/* threads of the running cluster not yet returned */
static int cluster_live(void)
{
	if (cluster_n <= 1)
		return blk->live;
	int n = 0;
	for (unsigned r = 0; r < cluster_n; r++)
		n += slots[r].live;
	return n;
}

void simt_cluster_sync(void)
{
	progress++;
	unsigned long g = cluster_bar.gen;
	cluster_bar.arrived++;
	cluster_release();
	while (cluster_bar.gen == g)
		to_sched();
}

int simt_thread_index(void)
{
	return linear_tid();
}

unsigned long simt_block_serial(void)
{
	if (interleaving) /* wgmma.cpp keeps one block's state */
		fail("wgmma or an mbarrier in an interleaved launch (simt.cpp's interleaved())");
	return blk->serial;
}

int simt_block_slot(void)
{
	return (int)(blk - slots);
}

unsigned long simt_slot_serial(int slot)
{
	return slots[slot].serial;
}

void simt_yield(void)
{
	to_sched();
}

void simt_progress(void)
{
	progress++;
}

/* ---- the runtime's state: allocations, streams, the injected fault ------------------------ */

/* A queued copy (src non-NULL) or memset on a stream; seq orders all queued work. */
struct stream_op {
	void *dst;
	const void *src;
	size_t n;
	int value;
	uint64_t seq;
};

struct CUstream_st {
	unsigned flags;
	std::vector<stream_op> q; /* not yet made, in order */
};

struct CUevent_st {
	cudaStream_t s; /* NULL: never recorded, or recorded on the default stream */
	uint64_t seq;   /* the stream's work up to here */
};

static std::mutex rt_mu; /* everything below */
static std::map<uintptr_t, size_t> dev_allocs, pinned_allocs; /* base -> bytes */
static uint64_t dev_gen; /* bumped at every change of dev_allocs */
static std::map<uintptr_t, int> dev_of; /* device allocation base -> the device it is on */
static thread_local int cur_device;     /* cudaSetDevice's, per host thread */
static std::set<cudaStream_t> streams;
static std::set<cudaEvent_t> events;
static uint64_t op_seq;

/* ---- device memory, out of the host's reach and of other devices' kernels ------------------
 * A GPU's memory is not the host's: host code that reads or writes through a device pointer
 * crashes there (or reads garbage), however well it works where device memory is host
 * memory. Nor is one GPU's memory another's: a kernel reaches another device's memory only
 * through peer access, which wick never enables (a rank's kernels work on its own shard).
 * So device allocations come from an arena of address space reserved for them, a slice per
 * device, and a device's live allocations are PROT_NONE while nothing that may touch them
 * runs (dev_access, counted per device over all host threads: a launch opens its own
 * device's, a collective every device's; span_access: a copy or memset opens only its own
 * pages). A host access then faults, and so
 * does a kernel's access to another device's memory (unless something has that device
 * open at the time) or to its arena outside every live allocation (freed memory, or past
 * an allocation's last page); the fault handler (cow_segv) names which. Holes left by
 * cudaFree stay reserved and inaccessible: the arena is never reused (1 TiB of address
 * space, none of it committed until allocated). The price is an mprotect of a device's
 * whole memory at each launch's start and end: so a device that comes to hold more than
 * WICK_SIMT_GUARD_MB of live memory (default 64: every test model but the GLM-5 structure
 * of 117,459 tensors, 120 MiB, whose unfused decode step is 5,928 launches) stays open
 * from then on, unguarded. */
enum { DEVS = 8 }; /* the most devices (n_devices) */
static uintptr_t arena_lo, arena_slice; /* device d's slice: arena_lo + d * arena_slice */
static uintptr_t arena_bump[DEVS];     /* under rt_mu */
static std::mutex guard_mu; /* a leaf: nothing else is taken under it */
static std::atomic<int> guard_open[DEVS]; /* what has each device's memory open */
static std::map<uintptr_t, uintptr_t> live[DEVS]; /* live memory, merged: start -> end */
static size_t live_bytes[DEVS];
static bool unguarded[DEVS]; /* it grew past the limit: open for good */
static std::atomic<int> launch_dev{-1};  /* the device of the launch running, if any */
static thread_local bool launching;      /* this host thread runs that launch */
static void segv_install(void);

static void guard_set(int d, int prot) /* under guard_mu */
{
	if (unguarded[d])
		return;
	for (auto &r : live[d])
		if (mprotect((void *)r.first, r.second - r.first, prot) != 0) {
			perror("simt: mprotect of device memory");
			abort();
		}
}

/* the memory of the devices in mask (bit d: device d) opened, or closed again */
static void guard_inc(unsigned mask)
{
	std::lock_guard<std::mutex> g(guard_mu);
	for (int i = 0; i < DEVS; i++)
		if (mask >> i & 1 && guard_open[i].fetch_add(1) == 0)
			guard_set(i, PROT_READ | PROT_WRITE);
}

static void guard_dec(unsigned mask)
{
	std::lock_guard<std::mutex> g(guard_mu);
	for (int i = 0; i < DEVS; i++)
		if (mask >> i & 1 && guard_open[i].fetch_sub(1) == 1)
			guard_set(i, PROT_NONE);
}

static int arena_dev(uintptr_t a);

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

/* the same for tests/simt/comm_simt.c's collectives (every device): 1 opens, 0 closes */
extern "C" void simt_device_access(int open)
{
	if (open)
		guard_inc((1u << DEVS) - 1);
	else
		guard_dec((1u << DEVS) - 1);
}

/* len bytes (whole pages) of device d's memory, readable and writable (the caller poisons
 * them before guard_add); NULL when its slice is used up or the arena cannot be made. Under
 * rt_mu. */
static void *dev_map(int d, size_t len)
{
	if (!arena_lo) {
		for (size_t sz = (size_t)1 << 40; sz >= (size_t)1 << 34 && !arena_lo; sz /= 2) {
			void *a = mmap(NULL, sz, PROT_NONE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (a != MAP_FAILED) {
				arena_lo = (uintptr_t)a;
				arena_slice = sz / DEVS;
				for (int i = 0; i < DEVS; i++)
					arena_bump[i] = arena_lo + (uintptr_t)i * arena_slice;
			}
		}
		if (!arena_lo)
			return NULL;
		segv_install();
	}
	uintptr_t end = arena_lo + (uintptr_t)(d + 1) * arena_slice;
	if (len > end - arena_bump[d])
		return NULL;
	void *q = mmap((void *)arena_bump[d], len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (q == MAP_FAILED)
		return NULL;
	arena_bump[d] += len;
	return q;
}

/* the device whose slice holds a, or -1 */
static int arena_dev(uintptr_t a)
{
	if (!arena_lo || a < arena_lo || a >= arena_lo + DEVS * arena_slice)
		return -1;
	return (int)((a - arena_lo) / arena_slice);
}

/* [a, a + len) joins its device's live memory, closed unless something has that open. */
static void guard_add(uintptr_t a, size_t len)
{
	int d = arena_dev(a);
	std::lock_guard<std::mutex> g(guard_mu);
	uintptr_t lo = a, hi = a + len;
	auto it = live[d].lower_bound(lo);
	if (it != live[d].begin() && std::prev(it)->second == lo) {
		lo = std::prev(it)->first;
		live[d].erase(std::prev(it));
	}
	it = live[d].find(hi);
	if (it != live[d].end()) {
		hi = it->second;
		live[d].erase(it);
	}
	live[d][lo] = hi;
	live_bytes[d] += len;
	static const size_t limit = [] {
		const char *v = getenv("WICK_SIMT_GUARD_MB");
		return (size_t)(v ? atol(v) : 64) << 20;
	}();
	if (!unguarded[d] && live_bytes[d] > limit) { /* open for good from now on */
		if (guard_open[d].load() == 0)
			guard_set(d, PROT_READ | PROT_WRITE);
		unguarded[d] = true;
	}
	if (!unguarded[d] && guard_open[d].load() == 0 &&
	    mprotect((void *)a, len, PROT_NONE) != 0) {
		perror("simt: mprotect of device memory");
		abort();
	}
}

/* [a, a + len) leaves live memory and goes back to the reserve (inaccessible). */
static void guard_remove(uintptr_t a, size_t len)
{
	int d = arena_dev(a);
	std::lock_guard<std::mutex> g(guard_mu);
	auto it = std::prev(live[d].upper_bound(a));
	uintptr_t lo = it->first, hi = it->second;
	live[d].erase(it);
	live_bytes[d] -= len;
	if (lo < a)
		live[d][lo] = a;
	if (a + len < hi)
		live[d][a + len] = hi;
	mmap((void *)a, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
	     -1, 0);
}

/* ---- the read-only path: ld.global.nc in an interleaved launch -------------------------------
 * A GPU may answer a non-coherent load (ld.global.nc: ld_stream16, ld_x4<false> in gemv.cuh,
 * through simt_ld_nc) from a line its SM cached before another block of the same launch
 * wrote it: what a launch writes, its other blocks must read with plain loads. The
 * interleaved launches (where blocks read each other's writes) take the worst case: at the
 * start the launch's device's memory is write-protected (cow_begin says which pages; the
 * other devices' is closed altogether, the guard above); a page's first write
 * (a SIGSEGV) copies the page aside and makes it writable again, and simt_ld_nc reads such
 * a page from its copy, as the page was when the launch began. Plain loads see every write
 * at once. */
static std::vector<std::pair<uintptr_t, size_t>> cow_ranges; /* protected: base, bytes; sorted */
/* the pages written in this launch -> their old bytes: an open-addressing table made before
 * the launch, so that the fault handler allocates nothing but the copy's page (mmap) */
static std::vector<uintptr_t> cow_keys; /* 0: empty */
static std::vector<void *> cow_vals;
static std::vector<size_t> cow_used; /* the slots in use, reserved to the table's size */
static uint64_t cow_gen = UINT64_MAX; /* dev_gen when cow_ranges was last made whole */
static std::set<uintptr_t> cow_written; /* pages interleaved launches wrote since then */
static bool cow_learn; /* cow_ranges is to be made again from cow_written */
static std::atomic<bool> cow_on;
static std::atomic_flag cow_lock = ATOMIC_FLAG_INIT;
static struct sigaction cow_old_segv;

static bool cow_covers(uintptr_t pg)
{
	auto it = std::upper_bound(cow_ranges.begin(), cow_ranges.end(),
				   std::make_pair(pg, SIZE_MAX));
	return it != cow_ranges.begin() && pg < (it - 1)->first + (it - 1)->second;
}

/* the slot of page pg: its own, or the empty one where it would go (under cow_lock) */
static size_t cow_slot(uintptr_t pg)
{
	size_t mask = cow_keys.size() - 1, i = (pg / PAGE * 0x9e3779b97f4a7c15ull) & mask;
	while (cow_keys[i] != 0 && cow_keys[i] != pg)
		i = (i + 1) & mask;
	return i;
}

/* A write to a protected page, by a kernel's thread or another host thread: keep the page's
 * old bytes, make it writable, and let the write go on. Any other fault goes back to the
 * handler there was before, and happens again under it. */
static void cow_segv(int, siginfo_t *si, void *)
{
	uintptr_t pg = (uintptr_t)si->si_addr & ~(uintptr_t)(PAGE - 1);
	if (cow_on.load() && arena_dev(pg) == launch_dev.load() && cow_covers(pg)) {
		while (cow_lock.test_and_set(std::memory_order_acquire))
			;
		size_t i = cow_slot(pg);
		if (cow_keys[i] == 0) {
			void *old = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
					 -1, 0);
			if (old == MAP_FAILED)
				abort();
			memcpy(old, (void *)pg, PAGE);
			cow_keys[i] = pg;
			cow_vals[i] = old;
			cow_used.push_back(i); /* within its reserve: no allocation */
			mprotect((void *)pg, PAGE, PROT_READ | PROT_WRITE);
		}
		cow_lock.clear(std::memory_order_release);
		return;
	}
	uintptr_t a = (uintptr_t)si->si_addr;
	int d = arena_dev(a);
	if (d >= 0) { /* device memory: say what touched it, then stop */
		char m[320];
		int k = launch_dev.load(), n;
		if (guard_open[d].load() > 0 || unguarded[d])
			n = snprintf(m, sizeof m,
				     "simt: device %d's memory at %p is in no allocation (freed, or "
				     "past an allocation's last page)",
				     d, si->si_addr);
		else if (launching && k >= 0 && k != d)
			n = snprintf(m, sizeof m,
				     "simt: a kernel on device %d touched device %d's memory at %p "
				     "(another GPU's: wick enables no peer access)",
				     k, d, si->si_addr);
		else
			n = snprintf(m, sizeof m,
				     "simt: host code touched device %d's memory at %p, while no "
				     "kernel or copy ran: on a GPU the host cannot (cudaMemcpy it)",
				     d, si->si_addr);
		static const char where[] = ". Where (addr2line -f -e the program +0x...):\n";
		if (write(2, m, (size_t)n) < 0 || write(2, where, sizeof where - 1) < 0)
			_exit(134);
		void *frames[32];
		backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
		abort();
	}
	sigaction(SIGSEGV, &cow_old_segv, NULL);
}

static void segv_install(void)
{
	static std::once_flag once;
	std::call_once(once, [] {
		struct sigaction sa = {};
		sa.sa_sigaction = cow_segv;
		sa.sa_flags = SA_SIGINFO | SA_NODEFER;
		sigemptyset(&sa.sa_mask);
		sigaction(SIGSEGV, &sa, &cow_old_segv);
	});
}

/* mprotect of the part of range r on the launch's device (the others' memory stays closed,
 * simt's guard above) */
static int cow_clip(const std::pair<uintptr_t, size_t> &r, int prot)
{
	uintptr_t lo = arena_lo + (uintptr_t)launch_dev.load() * arena_slice, hi = lo + arena_slice;
	uintptr_t a = std::max(r.first, lo), b = std::min(r.first + r.second, hi);
	return a < b ? mprotect((void *)a, b - a, prot) : 0;
}

/* Under launch_mu: cudaFree takes it too (it waits for the device, as CUDA's does), so no
 * allocation goes away while it is protected. */
static void cow_begin(void)
{
	segv_install();
	/* Which pages: after any allocation or free, all device memory (in address order,
	 * adjacent allocations one range); after that, only the pages interleaved launches have
	 * written since (weights, most of the memory, are never written: protecting them at
	 * every launch would cost the emulated GLM-5 structure seconds a step). */
	auto add = [](uintptr_t at, size_t len) {
		if (!cow_ranges.empty() && cow_ranges.back().first + cow_ranges.back().second == at)
			cow_ranges.back().second += len;
		else
			cow_ranges.push_back({at, len});
	};
	{
		std::lock_guard<std::mutex> g(rt_mu);
		if (cow_gen != dev_gen) {
			size_t pages = 0;
			cow_ranges.clear();
			cow_written.clear();
			for (auto &a : dev_allocs) {
				size_t len = (a.second + PAGE - 1) / PAGE * PAGE;
				add(a.first, len);
				pages += len / PAGE;
			}
			size_t cap = 1024;
			while (cap < 2 * pages)
				cap *= 2;
			if (cap > cow_keys.size()) {
				cow_keys.assign(cap, 0);
				cow_vals.assign(cap, NULL);
				cow_used.reserve(cap);
			}
			cow_gen = dev_gen;
			cow_learn = true;
		} else if (cow_learn) {
			cow_ranges.clear();
			for (uintptr_t pg : cow_written)
				add(pg, PAGE);
			cow_learn = false;
		}
	}
	cow_on = true;
	for (auto &r : cow_ranges)
		if (cow_clip(r, PROT_READ) != 0) {
			char m[160];
			snprintf(m, sizeof m, "cannot write-protect device memory for an interleaved "
				 "launch (mprotect: %s; %zu ranges)", strerror(errno), cow_ranges.size());
			fail(m);
		}
}

static void cow_end(void)
{
	for (auto &r : cow_ranges)
		cow_clip(r, PROT_READ | PROT_WRITE);
	cow_on = false;
	for (size_t i : cow_used) {
		cow_learn |= cow_written.insert(cow_keys[i]).second;
		munmap(cow_vals[i], PAGE);
		cow_keys[i] = 0;
	}
	cow_used.clear();
}

void simt_ld_nc(void *dst, const void *src, size_t n)
{
	uintptr_t a = (uintptr_t)src, pg = a & ~(uintptr_t)(PAGE - 1);
	if ((a & (n - 1)) != 0 || n > 16)
		fail("a non-coherent load that is misaligned or over 16 bytes");
	if (cow_on.load()) {
		while (cow_lock.test_and_set(std::memory_order_acquire))
			;
		size_t i = cow_slot(pg);
		bool copied = cow_keys[i] != 0;
		memcpy(dst, copied ? (const char *)cow_vals[i] + (a - pg) : src, n);
		cow_lock.clear(std::memory_order_release);
		return;
	}
	memcpy(dst, src, n);
}

/* WICK_SIMT_FAULT_LAUNCH: the launch that faults; FAULTED until a wait notices, then STICKY */
enum fault_state { NO_FAULT, FAULTED, STICKY };
static std::atomic<int> fault{NO_FAULT};
/* One kernel at a time: the fibers and the grid's state are global. A sharded engine
 * launches from a thread per rank (one per emulated device); their kernels take turns. */
static std::mutex launch_mu;
static unsigned long launches, fault_at;

/* The error every call returns once the context is lost; cudaSuccess before. */
static cudaError_t sticky(void)
{
	return fault.load() == STICKY ? cudaErrorIllegalAddress : cudaSuccess;
}

/* A call that waits for the device notices a fault. */
static cudaError_t notice(void)
{
	int f = FAULTED;
	fault.compare_exchange_strong(f, STICKY);
	return sticky();
}

enum region { R_HOST, R_PINNED, R_DEVICE, R_BAD };

/* Whether [a, a + n) lies inside one allocation of m; *overlap set when it crosses an edge. */
static bool inside(const std::map<uintptr_t, size_t> &m, uintptr_t a, size_t n, bool *overlap)
{
	auto next = m.upper_bound(a); /* the first allocation starting after a */
	if (next != m.begin()) {
		auto at = std::prev(next);
		if (a - at->first < at->second) { /* starts inside it */
			if (a + n <= at->first + at->second)
				return true;
			*overlap = true;
			return false;
		}
	}
	if (next != m.end() && next->first < a + n)
		*overlap = true;
	return false;
}

/* Where [p, p + n) lies (n > 0); R_BAD when it straddles an allocation's edge. */
static region where(const void *p, size_t n) /* under rt_mu */
{
	uintptr_t a = (uintptr_t)p;
	bool overlap = false;
	if (inside(dev_allocs, a, n, &overlap))
		return R_DEVICE;
	if (inside(pinned_allocs, a, n, &overlap))
		return R_PINNED;
	return overlap ? R_BAD : R_HOST;
}

static bool is_host(region r)
{
	return r == R_HOST || r == R_PINNED;
}

/* Whether device memory at p is the current device's: a copy touching another device's
 * memory is refused (stricter than CUDA, which copies between peers), so that memory placed
 * on the wrong device shows at the first copy to or from it. */
static bool on_current(const void *p) /* under rt_mu */
{
	auto next = dev_allocs.upper_bound((uintptr_t)p);
	if (next == dev_allocs.begin())
		return true;
	auto d = dev_of.find(std::prev(next)->first);
	return d == dev_of.end() || d->second == cur_device;
}

/* Whether dst and src lie where kind says, device memory on the current device. */
static bool kind_ok(void *dst, const void *src, size_t n, cudaMemcpyKind kind) /* under rt_mu */
{
	region d = where(dst, n), s = where(src, n);
	if ((d == R_DEVICE && !on_current(dst)) || (s == R_DEVICE && !on_current(src)))
		return false;
	switch (kind) {
	case cudaMemcpyHostToHost: return is_host(d) && is_host(s);
	case cudaMemcpyHostToDevice: return d == R_DEVICE && is_host(s);
	case cudaMemcpyDeviceToHost: return is_host(d) && s == R_DEVICE;
	case cudaMemcpyDeviceToDevice: return d == R_DEVICE && s == R_DEVICE;
	}
	return false;
}

static void make_op(const stream_op &o)
{
	span_access open(o.dst, o.src, o.n);
	if (o.src)
		memmove(o.dst, o.src, o.n);
	else
		memset(o.dst, o.value, o.n);
}

/* Makes s's queued work up to seq (all of it: UINT64_MAX). */
static void drain(cudaStream_t s, uint64_t seq) /* under rt_mu */
{
	size_t k = 0;
	for (; k < s->q.size() && s->q[k].seq <= seq; k++)
		make_op(s->q[k]);
	s->q.erase(s->q.begin(), s->q.begin() + (long)k);
}

/* Before work on the default stream: the blocking streams' queues (legacy semantics). */
static void drain_blocking(void) /* under rt_mu */
{
	for (cudaStream_t s : streams)
		if (!(s->flags & cudaStreamNonBlocking))
			drain(s, UINT64_MAX);
}

static void drain_all(void) /* under rt_mu */
{
	for (cudaStream_t s : streams)
		drain(s, UINT64_MAX);
}

/* ---- launches ---------------------------------------------------------------------------- */

static void start_block(block_ctx &b, dim3 idx, size_t nt)
{
	b.idx = idx;
	b.serial = ++block_serial;
	b.round = 0;
	b.in_round = false;
	b.saved.clear();
	poison(b.dyn_smem.data(), b.dyn_smem.size() * sizeof b.dyn_smem[0]);
	b.bar = barrier{};
	for (int i = 0; i < 16; i++) {
		b.named[i] = barrier{};
		b.named_count[i] = 0;
	}
	for (size_t w = 0; w < (nt + 31) / 32; w++) {
		b.warps[w].arrived = 0;
		b.warps[w].lanes = (int)(nt - w * 32 < 32 ? nt - w * 32 : 32);
	}
	size_t i = 0;
	for (unsigned z = 0; z < blockDim.z; z++)
		for (unsigned y = 0; y < blockDim.y; y++)
			for (unsigned x = 0; x < blockDim.x; x++, i++) {
				fiber &f = b.fibers[i];
				f.tid = dim3(x, y, z);
				f.done = false;
				f.copies.clear(); /* a returned thread's copies never land */
				f.group_ends.clear();
			}
	b.live = (int)nt;
}

/* Makes block `to` the running one: the static shared variables the block running now holds
 * are saved with it (unless it has returned), and to's are put back. */
static void switch_to(block_ctx *to)
{
	for (size_t i = 0; i < shared_vars.size() && to != blk; i++) {
		shared_var &s = shared_vars[i];
		if (s.serial != blk->serial || blk->live == 0)
			continue;
		const char *p = (const char *)s.p;
		blk->saved.emplace_back(i, std::vector<char>(p, p + s.n));
		s.serial = 0; /* no block's */
	}
	for (auto &v : to->saved) { /* empty when to is the running block */
		shared_var &s = shared_vars[v.first];
		memcpy(s.p, v.second.data(), s.n);
		s.serial = to->serial;
	}
	to->saved.clear();
	blk = to;
	blockIdx = to->idx;
}

/* A round of the running block: warp by warp, each run until all its lanes wait at
 * __syncthreads (or spin) or have returned (a warp races ahead of the others, as on a GPU);
 * forwards and backwards in turn. block_run resumes at most budget threads of it (0: to the
 * round's end) and returns, to go on where it stopped at its next call: so an interleaved
 * launch switches blocks inside a round too, between any two threads' turns. Whether
 * anything moved. */
static bool block_run(size_t nt, unsigned budget)
{
	block_ctx &b = *blk;
	unsigned long start = progress;
	size_t nw = (nt + 31) / 32;
	for (unsigned n = 0; b.live > 0 && (budget == 0 || n < budget);) {
		if (!b.in_round) {
			b.in_round = true;
			b.k = b.l = 0;
			b.seen = progress;
		}
		size_t w = b.round & 1 ? nw - 1 - b.k : b.k;
		size_t lanes = (size_t)b.warps[w].lanes;
		if (b.l == lanes) { /* a pass over the warp's lanes: again while it moves */
			b.l = 0;
			if (progress == b.seen && ++b.k == nw) {
				b.in_round = false;
				b.round++;
				if (budget == 0)
					break;
			}
			b.seen = progress;
			continue;
		}
		fiber *f = &b.fibers[w * 32 + (b.round & 1 ? lanes - 1 - b.l : b.l)];
		b.l++;
		if (f->done)
			continue;
		cur = f;
		threadIdx = f->tid;
		resume(f);
		n++;
	}
	return progress != start;
}

/* A whole round of the running block (the rest of the one it is in first). */
static bool block_round(size_t nt)
{
	bool moved = blk->in_round && block_run(nt, 0);
	return block_run(nt, 0) || moved;
}

[[noreturn]] static void deadlock(size_t nt, const char *what)
{
	char m[256];
	snprintf(m, sizeof m,
		 "deadlock%s: %d of %d threads left, %d at __syncthreads (%s), the rest in warp "
		 "shuffles, mbarrier waits or __nanosleep",
		 what, blk->live, (int)nt, blk->bar.arrived,
		 blk->bar.arrived ? blk->bar.site : "-");
	threadIdx = dim3(0, 0, 0);
	fail(m);
}

/* A cluster launch (cluster_n > 1) runs the same way, a cluster at a time: its blocks, in
 * slots 0 .. cluster_n - 1 by rank, started together when the previous cluster's are done,
 * the last rank alone until it waits for the others.
 *
 * The launches whose blocks wait for one another or count each other's work: a chained
 * launch's links, and the kernels whose last block to finish does the rest. Their blocks run
 * interleaved, as a GPU keeps blocks resident on its SMs: RESIDENT at once, the next started
 * as one returns. Each pass runs them newest first, each for 1 to 128 threads' turns, the
 * older ones stalling more often, and now and then one frozen for up to 1,024 passes (a
 * pseudo-random schedule, the same on every run): later blocks overtake earlier ones, and a
 * block stopped anywhere stays stopped while the rest run on. Those orders expose these
 * kernels' bugs: a link that reads before the link it follows has finished, a block that
 * counts itself finished before all its threads have written, or a "last" block chosen by
 * its index rather than by the count, meets another block's work half done (or the
 * poison), and the test comparing its result fails where one block at a time would hide
 * it. Every other launch runs its blocks one at a time (cheaper; their blocks never read
 * each other's writes). */
static bool interleaved(const char *kernel)
{
	static const char *const names[] = {"k_chain<", "k_dsa_topk_n", "k_moe_route_plan",
					    "k_moe_down", "k_attention<", "k_mla_attention<",
					    "k_mla_absorbed<"};
	for (const char *n : names)
		if (kernel && strncmp(kernel, n, strlen(n)) == 0 &&
		    (n[strlen(n) - 1] == '<' || kernel[strlen(n)] == 0))
			return true;
	return false;
}

static void run_grid(dim3 grid, size_t nt)
{
	size_t total = (size_t)grid.x * grid.y * grid.z, next = 0;
	auto at = [&](size_t i) {
		return dim3((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y),
			    (unsigned)(i / grid.x / grid.y));
	};
	if (!interleaving && cluster_n <= 1) {
		for (; next < total; next++) {
			switch_to(&slots[0]);
			start_block(slots[0], at(next), nt);
			blockIdx = slots[0].idx;
			while (slots[0].live > 0)
				if (!block_round(nt))
					deadlock(nt, "");
		}
		return;
	}
	block_ctx *res[RESIDENT] = {};
	uint64_t rng = 0x9e3779b97f4a7c15ull * ++interleaved_launches; /* the same every run */
	auto pick = [&](unsigned n) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		return (unsigned)(rng >> 33) % n;
	};
	unsigned long frozen_until[RESIDENT] = {}; /* a slot's block sits out passes till then */
	bool full = false; /* after a pass in which nothing moved: every block a whole round */
	for (unsigned long pass = 0;; pass++) {
		bool none = true; /* a cluster's blocks start together once the last one's are done */
		for (int s = 0; s < RESIDENT; s++)
			none &= !res[s];
		for (int s = 0; s < RESIDENT; s++)
			if (!res[s] && next < total &&
			    (cluster_n <= 1 || (none && s < (int)cluster_n))) {
				start_block(*(res[s] = &slots[s]), at(next++), nt);
				/* a cluster's last rank runs alone until it waits: so a CTA that
				 * reaches a peer before the peer is ready (a missing cluster barrier
				 * after the mbarriers' init) does so here */
				frozen_until[s] = cluster_n > 1 && s + 1 < (int)cluster_n ? ~0ul : 0;
				cluster_bar = barrier{};
			}
		int order[RESIDENT], n = 0; /* the resident blocks, newest first */
		for (int s = 0; s < RESIDENT; s++)
			if (res[s]) {
				int i = n++;
				for (; i > 0 && res[order[i - 1]]->serial < res[s]->serial; i--)
					order[i] = order[i - 1];
				order[i] = s;
			}
		if (n == 0)
			return;
		bool moved = false, frozen = false;
		for (int i = 0; i < n; i++) {
			int s = order[i];
			if (!full && pass >= frozen_until[s] && pick(64) == 0) /* its SM busy */
				frozen_until[s] = pass + 1 + pick(1024);
			if (!full && pass < frozen_until[s]) {
				frozen = true;
				continue;
			}
			switch_to(res[s]);
			if (full)
				moved |= block_round(nt);
			else if ((int)pick(RESIDENT) >= i) /* the i-th newest stalls i times in 3 */
				moved |= block_run(nt, 1 + pick(128));
			if (res[s]->live == 0)
				res[s] = NULL;
		}
		if (moved) {
			full = false;
		} else if (frozen) { /* the others wait for a frozen block: it thaws */
			for (unsigned long &f : frozen_until)
				f = 0;
		} else if (full) {
			deadlock(nt, " of the resident blocks (each waits for another)");
		} else { /* nothing moved: every block runs a whole round; if still nothing
			  * moves, nothing ever will */
			full = true;
		}
	}
}

/* cudaFuncAttributeMaxDynamicSharedMemorySize by kernel name, spaces removed (under rt_mu) */
static std::map<std::string, size_t> smem_optin;

/* A kernel's name as the source writes it, spaces removed, and the parentheses a template
 * of several arguments is written in for the macros, (k<A, B>), taken off. */
static std::string kernel_key(const char *name)
{
	std::string k;
	for (const char *c = name; *c; c++)
		if (*c != ' ' && *c != '\t' && *c != '\n')
			k += *c;
	if (k.size() > 2 && k.front() == '(' && k.back() == ')')
		k = k.substr(1, k.size() - 2);
	return k;
}

static size_t smem_limit(const char *kernel)
{
	if (!kernel)
		return MAX_DYN_SMEM;
	std::lock_guard<std::mutex> g(rt_mu);
	auto it = smem_optin.find(kernel_key(kernel));
	if (it != smem_optin.end() && it->second > MAX_DYN_SMEM)
		return it->second;
	return MAX_DYN_SMEM;
}

cudaError_t simt_func_set_attribute(const char *kernel, cudaFuncAttribute a, int v)
{
	if (sticky())
		return sticky();
	if (!kernel || a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 ||
	    v > MAX_DYN_SMEM_OPTIN)
		return cudaErrorInvalidValue;
	std::lock_guard<std::mutex> g(rt_mu);
	smem_optin[kernel_key(kernel)] = (size_t)v;
	return cudaSuccess;
}

static void launch_fault_init(void)
{
	const char *f = getenv("WICK_SIMT_FAULT_LAUNCH");
	fault_at = f ? strtoul(f, NULL, 10) : 0;
}

/* WICK_SIMT_LAUNCHES=FILE: each distinct launch shape of this process appended to FILE as
 * "kernel<TAB>threads<TAB>dynamic shared bytes<TAB>opt-in bytes (0: none)", one write() a
 * line (O_APPEND), so that the processes of a test run can share the file.
 * tests/simt/launch_fit.py checks them against ptxas's registers and static shared memory
 * for sm_90a, the limits the emulator cannot see. Under launch_mu. */
static void launch_log(const char *kernel, size_t nt, size_t smem)
{
	static const char *path = getenv("WICK_SIMT_LAUNCHES");
	static std::set<std::string> seen;
	if (!path || !*path || !kernel)
		return;
	size_t optin;
	{
		std::lock_guard<std::mutex> g(rt_mu);
		auto it = smem_optin.find(kernel_key(kernel));
		optin = it == smem_optin.end() ? 0 : it->second;
	}
	char line[512];
	int len = snprintf(line, sizeof line, "%s\t%zu\t%zu\t%zu\n", kernel_key(kernel).c_str(), nt,
			   smem, optin);
	if (len <= 0 || (size_t)len >= sizeof line || !seen.insert(line).second)
		return;
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, line, (size_t)len) != len)
		fail("WICK_SIMT_LAUNCHES: cannot append to its file");
	close(fd);
}

/* cudaStreamPerThread: a blocking stream that the legacy default stream orders itself with,
 * so, with work on the default stream made at once, the same as the default stream here. */
static cudaStream_t norm(cudaStream_t s)
{
	return s == cudaStreamPerThread ? (cudaStream_t)0 : s;
}

/* WICK_SIMT_STREAM=pt: every kernel launch and async memset must name cudaStreamPerThread
 * (the backend's WICK_CUDA_STREAM=pt); one on the legacy stream aborts, naming it. */
static void expect_stream(cudaStream_t s, const char *what)
{
	static const bool pt = [] {
		const char *v = getenv("WICK_SIMT_STREAM");
		return v && !strcmp(v, "pt");
	}();
	if (pt && s == (cudaStream_t)0) {
		fprintf(stderr, "simt: %s on the legacy default stream, not cudaStreamPerThread "
				"(WICK_SIMT_STREAM=pt)\n", what ? what : "a launch");
		abort();
	}
}

void simt_run(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
	      const std::function<void()> &fn, const char *kernel, dim3 cluster)
{
	static std::once_flag once;
	std::call_once(once, launch_fault_init);
	std::lock_guard<std::mutex> turn(launch_mu);
	expect_stream(stream, kernel);
	stream = norm(stream);
	{
		std::lock_guard<std::mutex> g(rt_mu);
		if (stream && !streams.count(stream)) {
			last_err = cudaErrorInvalidResourceHandle;
			return;
		}
		if (stream)
			drain(stream, UINT64_MAX);
		drain_blocking();
	}
	if (++launches == fault_at)
		fault = FAULTED;
	if (fault.load() != NO_FAULT) /* the context is lost: nothing runs any more */
		return;
	size_t nt = (size_t)block.x * block.y * block.z;
	launch_log(kernel, nt, smem);
	if (nt == 0 || nt > MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64 ||
	    grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
	    grid.y > 65535 || grid.z > 65535 || smem > smem_limit(kernel) || cluster.x == 0 ||
	    cluster.x > RESIDENT || cluster.y != 1 || cluster.z != 1 || grid.x % cluster.x != 0) {
		last_err = cudaErrorInvalidConfiguration;
		return;
	}
	interleaving = interleaved(kernel);
	cluster_n = cluster.x;
	if (interleaving && cluster_n > 1)
		fail("a cluster launch of a kernel the emulator interleaves");
	for (int s = 0; s < (interleaving ? RESIDENT : (int)cluster_n); s++) {
		for (size_t i = 0; i < nt; i++)
			if (!slots[s].fibers[i].stack)
				fiber_make(&slots[s].fibers[i]);
		slots[s].dyn_smem.assign((smem + 7) / 8, 0);
	}
	gridDim = grid;
	blockDim = block;
	body = &fn;
	dev_access open(1u << cur_device); /* before cow_begin's protections, after cow_end's */
	launch_dev = cur_device;
	launching = true;
	if (interleaving)
		cow_begin();
	run_grid(grid, nt);
	if (interleaving)
		cow_end();
	launching = false;
	launch_dev = -1;
	switch_to(&slots[0]);
	interleaving = false;
	cluster_n = 1;
	body = NULL;
}

cudaError_t simt_launch_ex(const cudaLaunchConfig_t *cfg, const char *kernel,
			   const std::function<void()> &body)
{
	dim3 cluster(1, 1, 1);
	for (unsigned i = 0; i < cfg->numAttrs; i++) {
		const cudaLaunchAttribute &a = cfg->attrs[i];
		if (a.id == cudaLaunchAttributeProgrammaticStreamSerialization)
			continue; /* run after the kernel before, as PDL allows */
		if (a.id != cudaLaunchAttributeClusterDimension)
			fail("cudaLaunchKernelEx with an attribute the emulator does not have");
		cluster = dim3(a.val.clusterDim.x, a.val.clusterDim.y, a.val.clusterDim.z);
	}
	cudaError_t before = last_err; /* another call's, still unread */
	last_err = cudaSuccess;
	simt_run(cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, cfg->stream, body, kernel,
		 cluster);
	cudaError_t e = last_err;
	if (e == cudaSuccess)
		last_err = before;
	return sticky() ? sticky() : e;
}

/* ---- the runtime API --------------------------------------------------------------------- */

/* WICK_SIMT_DEVICES (1..8, default 1) devices, all on the one host memory: enough for a
 * sharded engine's rank r to select device r; memory is not kept apart by device. */
static int n_devices(void)
{
	const char *v = getenv("WICK_SIMT_DEVICES");
	int n = v ? atoi(v) : 1;
	return n < 1 ? 1 : n > 8 ? 8 : n;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = n_devices();
	return sticky();
}

/* Each device's memory: WICK_SIMT_DEVICE_MB MiB (default 141 GiB, an H200's; at most its
 * slice of the arena). cudaMalloc past it fails with cudaErrorMemoryAllocation, and
 * cudaMemGetInfo reports what is left (whole pages, as allocations take them). */
static size_t device_bytes(void)
{
	static const size_t b = [] {
		const char *v = getenv("WICK_SIMT_DEVICE_MB");
		long long mb = v ? atoll(v) : 0;
		return mb > 0 ? (size_t)mb << 20 : (size_t)141 << 30;
	}();
	return b;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
	if (sticky())
		return sticky();
	size_t used;
	{
		std::lock_guard<std::mutex> g(guard_mu);
		used = live_bytes[cur_device];
	}
	*total_b = device_bytes();
	*free_b = used < *total_b ? *total_b - used : 0;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	if (sticky())
		return sticky();
	if (device < 0 || device >= n_devices())
		return cudaErrorInvalidDevice;
	cur_device = device;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
	*device = cur_device;
	return sticky();
}

static cudaError_t alloc(void **p, size_t n, size_t align, std::map<uintptr_t, size_t> &m)
{
	*p = NULL;
	if (sticky())
		return sticky();
	size_t sz = (n + align - 1) / align * align;
	void *q = NULL;
	std::lock_guard<std::mutex> g(rt_mu);
	if (sz && &m == &dev_allocs) {
		/* device memory: whole pages of the arena, so that an interleaved launch can
		 * write-protect them (cow) and the host cannot touch them (guard_add);
		 * consecutive allocations make one region to protect */
		size_t len = (sz + PAGE - 1) / PAGE * PAGE, used;
		{
			std::lock_guard<std::mutex> gg(guard_mu);
			used = live_bytes[cur_device];
		}
		if (len <= device_bytes() && used <= device_bytes() - len)
			q = dev_map(cur_device, len);
	} else if (sz) {
		q = aligned_alloc(align, sz);
	}
	if (!q)
		return cudaErrorMemoryAllocation;
	poison(q, sz);
	if (&m == &dev_allocs)
		guard_add((uintptr_t)q, (sz + PAGE - 1) / PAGE * PAGE);
	m[(uintptr_t)q] = sz;
	dev_gen += &m == &dev_allocs;
	*p = q;
	return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for the device first, as CUDA's do: for another thread's
 * launch too (launch_mu), so that nothing is freed while an interleaved launch protects it. */
static cudaError_t release(void *p, std::map<uintptr_t, size_t> &m)
{
	if (!p)
		return sticky();
	std::lock_guard<std::mutex> turn(launch_mu);
	std::lock_guard<std::mutex> g(rt_mu);
	auto it = m.find((uintptr_t)p);
	if (it == m.end())
		return cudaErrorInvalidValue;
	drain_all();
	if (&m == &dev_allocs)
		guard_remove((uintptr_t)p, (it->second + PAGE - 1) / PAGE * PAGE);
	else
		free(p);
	m.erase(it);
	dev_gen += &m == &dev_allocs;
	dev_of.erase((uintptr_t)p);
	return sticky();
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t e = alloc(p, n, 256, dev_allocs);
	if (e == cudaSuccess && *p) {
		std::lock_guard<std::mutex> g(rt_mu);
		dev_of[(uintptr_t)*p] = cur_device;
	}
	return e;
}

cudaError_t cudaFree(void *p)
{
	return release(p, dev_allocs);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	if (flags & ~(unsigned)cudaHostAllocPortable) {
		*p = NULL;
		return cudaErrorInvalidValue;
	}
	return alloc(p, n, 4096, pinned_allocs);
}

cudaError_t cudaFreeHost(void *p)
{
	return release(p, pinned_allocs);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (notice())
		return sticky();
	if (n == 0)
		return cudaSuccess;
	if (!kind_ok(dst, src, n, kind))
		return cudaErrorInvalidValue;
	drain_blocking();
	span_access open(dst, src, n);
	memmove(dst, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			 size_t height, cudaMemcpyKind kind)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (notice())
		return sticky();
	if (width == 0 || height == 0)
		return cudaSuccess;
	if (width > dpitch || width > spitch)
		return cudaErrorInvalidValue; /* CUDA: cudaErrorInvalidPitchValue */
	for (size_t r = 0; r < height; r++) /* each row within an allocation of the right kind */
		if (!kind_ok((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind))
			return cudaErrorInvalidValue;
	drain_blocking();
	for (size_t r = 0; r < height; r++) {
		span_access open((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
		memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
	}
	return cudaSuccess;
}

/* A copy (src non-NULL) or memset on s: made now on the default stream, queued on another. */
static cudaError_t enqueue(void *dst, const void *src, size_t n, int v, cudaStream_t s,
			   bool pageable)
{
	if (s && !streams.count(s))
		return cudaErrorInvalidResourceHandle;
	stream_op o = {dst, src, n, v, ++op_seq};
	if (!s || pageable) { /* in order: after what s holds already */
		if (s)
			drain(s, UINT64_MAX);
		drain_blocking();
		make_op(o);
	} else {
		s->q.push_back(o);
	}
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s)
{
	s = norm(s);
	std::lock_guard<std::mutex> g(rt_mu);
	if (sticky())
		return sticky();
	if (n == 0)
		return cudaSuccess;
	if (!kind_ok(dst, src, n, kind))
		return cudaErrorInvalidValue;
	bool pageable = where(dst, n) == R_HOST || where(src, n) == R_HOST;
	return enqueue(dst, src, n, 0, s, pageable);
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (notice())
		return sticky();
	if (n == 0)
		return cudaSuccess;
	if (where(p, n) != R_DEVICE)
		return cudaErrorInvalidValue;
	return enqueue(p, NULL, n, v, 0, false);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	expect_stream(s, "cudaMemsetAsync");
	s = norm(s);
	std::lock_guard<std::mutex> g(rt_mu);
	if (sticky())
		return sticky();
	if (n == 0)
		return cudaSuccess;
	if (where(p, n) != R_DEVICE)
		return cudaErrorInvalidValue;
	return enqueue(p, NULL, n, v, s, false);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	*s = NULL;
	if (sticky())
		return sticky();
	if (flags & ~(unsigned)cudaStreamNonBlocking)
		return cudaErrorInvalidValue;
	std::lock_guard<std::mutex> g(rt_mu);
	*s = new CUstream_st{flags, {}};
	streams.insert(*s);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	s = norm(s);
	std::lock_guard<std::mutex> g(rt_mu);
	if (s && !streams.count(s))
		return cudaErrorInvalidResourceHandle;
	if (notice())
		return sticky();
	if (s)
		drain(s, UINT64_MAX);
	else
		drain_blocking();
	return cudaSuccess;
}

/* Its queue is made first (CUDA lets it finish after the call returns). */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (!s || !streams.count(s))
		return cudaErrorInvalidResourceHandle;
	drain(s, UINT64_MAX);
	streams.erase(s);
	for (cudaEvent_t e : events)
		if (e->s == s)
			e->s = NULL;
	delete s;
	return sticky();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	*e = NULL;
	if (sticky())
		return sticky();
	if (flags & ~(unsigned)cudaEventDisableTiming)
		return cudaErrorInvalidValue;
	std::lock_guard<std::mutex> g(rt_mu);
	*e = new CUevent_st{NULL, 0};
	events.insert(*e);
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	s = norm(s);
	std::lock_guard<std::mutex> g(rt_mu);
	if (sticky())
		return sticky();
	if (!events.count(e) || (s && !streams.count(s)))
		return cudaErrorInvalidResourceHandle;
	e->s = s; /* the default stream's work is done already */
	e->seq = op_seq;
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (!events.count(e))
		return cudaErrorInvalidResourceHandle;
	if (notice())
		return sticky();
	if (e->s)
		drain(e->s, e->seq);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (!events.count(e))
		return cudaErrorInvalidResourceHandle;
	events.erase(e);
	delete e;
	return sticky();
}

cudaError_t cudaDeviceSynchronize(void)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (notice())
		return sticky();
	drain_all();
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
	if (sticky())
		return sticky();
	cudaError_t e = last_err;
	last_err = cudaSuccess;
	return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	default: return "unknown error";
	}
}
