/*
 * simt_mem.cpp - the emulator's device memory (simt.h, simt_int.h): the arena it comes from,
 * a slice per device, kept out of the host's reach and of other devices' kernels (the guard),
 * and the read-only path of an interleaved launch (cow, simt_ld_nc): mprotect and a SIGSEGV
 * handler, both. The allocations, copies and launches that open it are simt_runtime.cpp's.
 */
#include "simt_int.h"

#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

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
std::mutex guard_mu; /* a leaf: nothing else is taken under it */
std::atomic<int> guard_open[DEVS]; /* what has each device's memory open */
static std::map<uintptr_t, uintptr_t> live[DEVS]; /* live memory, merged: start -> end */
size_t live_bytes[DEVS];
bool unguarded[DEVS]; /* it grew past the limit: open for good */
std::atomic<int> launch_dev{-1};  /* the device of the launch running, if any */
thread_local bool launching;      /* this host thread runs that launch */
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
void guard_inc(unsigned mask)
{
	std::lock_guard<std::mutex> g(guard_mu);
	for (int i = 0; i < DEVS; i++)
		if (mask >> i & 1 && guard_open[i].fetch_add(1) == 0)
			guard_set(i, PROT_READ | PROT_WRITE);
}

void guard_dec(unsigned mask)
{
	std::lock_guard<std::mutex> g(guard_mu);
	for (int i = 0; i < DEVS; i++)
		if (mask >> i & 1 && guard_open[i].fetch_sub(1) == 1)
			guard_set(i, PROT_NONE);
}

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
void *dev_map(int d, size_t len)
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
int arena_dev(uintptr_t a)
{
	if (!arena_lo || a < arena_lo || a >= arena_lo + DEVS * arena_slice)
		return -1;
	return (int)((a - arena_lo) / arena_slice);
}

/* [a, a + len) joins its device's live memory, closed unless something has that open. */
void guard_add(uintptr_t a, size_t len)
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
void guard_remove(uintptr_t a, size_t len)
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
void cow_begin(void)
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

void cow_end(void)
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

void simt_prefetch(const void *p)
{
	(void)*(const volatile char *)p;
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
