/*
 * simt.cpp - the emulator of simt.h: the fibers, the barriers and shuffles, cp.async, shared
 * memory, the clusters' shared memory and barrier, and the block scheduler (device memory's
 * guard and the read-only path are in simt_mem.cpp, simt_run and the runtime API in
 * simt_runtime.cpp, the mma in mma.cpp, wgmma and the tensor copies in wgmma.cpp; simt_int.h
 * is what they share). See simt.h for what it does and does not prove.
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
#include "simt_int.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <functional>
#include <utility>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

block_ctx slots[RESIDENT];
static block_ctx *blk = &slots[0]; /* the block running now */
bool interleaving; /* the launch now running interleaves its blocks */
unsigned cluster_n = 1; /* > 1: a cluster launch, clusters of cluster_n blocks along x */
static barrier cluster_bar; /* barrier.cluster of the cluster running now */
static unsigned long interleaved_launches;
static fiber *cur;
#ifdef FIBER_SWITCH
static void *sched_sp; /* the scheduler's stack pointer while a fiber runs */
#else
static jmp_buf sched_jb;
#endif
const std::function<void()> *body;
static unsigned long progress; /* arrivals and returns: unchanged over a round = deadlock */
static unsigned long block_serial;
bool profiling; /* this launch's threads are timed (simt_run: WICK_SIMT_PROFILE) */
launch_prof prof;

/* A static __shared__ variable: one copy (the generated code's static), holding the bytes of
 * the block whose serial it carries; switching blocks swaps them (switch_to). */
struct shared_var {
	void *p;
	size_t n;
	unsigned long serial; /* the block that last poisoned it */
};
static std::vector<shared_var> shared_vars;

void poison(void *p, size_t n)
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

[[noreturn]] void fail(const char *what)
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

/* The monotonic clock (the vDSO's: the thread's CPU clock is a system call, which made the
 * emulator ten times slower): a turn during which the OS ran another process counts that
 * time too, so a profile is taken with nothing else running. */
static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* resume, its time added to the thread's busy time unless the turn moved nothing (a
 * spin-wait's poll, which on a GPU would be the wait, not the thread's work) */
static void timed_resume(fiber *f)
{
	unsigned long p0 = progress;
	uint64_t t0 = now_ns();
	resume(f);
	uint64_t dt = now_ns() - t0;
	if (progress != p0 || f->done)
		f->busy_ns += dt;
}

/* Each stack's top is moved by a different multiple of 64 bytes (its colour, below 128 KiB,
 * above the STACK bytes it always has): with tops all at one offset in their pages, the
 * fibers' live frames fell into the same few cache sets and evicted one another at every
 * switch. */
void fiber_make(fiber *f)
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
				f.busy_ns = 0;
				f.copies.clear(); /* a returned thread's copies never land */
				f.group_ends.clear();
			}
	b.live = (int)nt;
}

/* Makes block `to` the running one: the static shared variables the block running now holds
 * are saved with it (unless it has returned), and to's are put back. */
void switch_to(block_ctx *to)
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
		if (profiling)
			timed_resume(f);
		else
			resume(f);
		n++;
	}
	return progress != start;
}

/* A block whose threads have all returned: its busy times into prof. */
static void prof_block(const block_ctx &b, size_t nt)
{
	if (!profiling)
		return;
	uint64_t sum = 0, most = 0;
	for (size_t i = 0; i < nt; i++) {
		sum += b.fibers[i].busy_ns;
		most = b.fibers[i].busy_ns > most ? b.fibers[i].busy_ns : most;
	}
	prof.blocks++;
	prof.work_ns += (double)sum;
	prof.serial_ns += (double)most;
	prof.max_ns = (double)most > prof.max_ns ? (double)most : prof.max_ns;
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
bool interleaved(const char *kernel)
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

void run_grid(dim3 grid, size_t nt)
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
			prof_block(slots[0], nt);
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
			if (res[s]->live == 0) {
				prof_block(*res[s], nt);
				res[s] = NULL;
			}
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
