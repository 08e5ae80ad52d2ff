/*
 * simt_runtime.cpp - the emulator's runtime (simt.h, simt_int.h): its state (allocations,
 * streams and events, the injected fault), where a copy's pointers lie, the streams' queues,
 * the launch (simt_run: its checks, the launch log, the guard and the read-only path around
 * simt.cpp's block scheduler) and the CUDA runtime API. Device memory's arena and guard are
 * simt_mem.cpp's.
 */
#include "simt_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

/* ---- the runtime's state: allocations, streams, the injected fault ------------------------ */

/* cudaGetLastError's, per host thread */
static thread_local cudaError_t last_err;

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
	bool timing;    /* created without cudaEventDisableTiming */
	bool recorded;
	double t;       /* the host's clock at the record, in ms (the emulator runs a kernel at
			 * its launch, so the default stream's work before it is done then) */
};

std::mutex rt_mu; /* everything below */
std::map<uintptr_t, size_t> dev_allocs, pinned_allocs; /* base -> bytes */
uint64_t dev_gen; /* bumped at every change of dev_allocs */
static std::map<uintptr_t, int> dev_of; /* device allocation base -> the device it is on */
static thread_local int cur_device;     /* cudaSetDevice's, per host thread */
static std::set<cudaStream_t> streams;
static std::set<cudaEvent_t> events;
static uint64_t op_seq;

/* WICK_SIMT_FAULT_LAUNCH: the launch that faults; FAULTED until a wait notices, then STICKY */
enum fault_state { NO_FAULT, FAULTED, STICKY };
static std::atomic<int> fault{NO_FAULT};
/* One kernel at a time: the fibers and the grid's state are global. A sharded engine
 * launches from a thread per rank (one per emulated device); their kernels take turns. */
static std::mutex launch_mu;
static unsigned long launches, fault_at;
static unsigned long profile_from; /* the first launch timed (WICK_SIMT_PROFILE); 0: none */

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

/* ---- launches: their checks and log, simt_run (the blocks are simt.cpp's) ---------------- */

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
	const char *p = getenv("WICK_SIMT_PROFILE"), *from = getenv("WICK_SIMT_PROFILE_FROM");
	char *end = NULL;
	if (p && *p)
		profile_from = from ? strtoul(from, &end, 10) : 1;
	if (p && *p && from && (!*from || *end || profile_from == 0))
		fail("WICK_SIMT_PROFILE_FROM: not a launch's number (1, 2, ...)");
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

/* WICK_SIMT_PROFILE=FILE: every launch of this process appended to FILE as "kernel<TAB>blocks
 * <TAB>threads a block<TAB>work us<TAB>serial us<TAB>busiest thread us", one write() a line:
 * the busy time of its threads (each turn's time, turns that only polled a spin-wait left
 * out; the monotonic clock, so a turn the OS stopped to run another process counts that
 * time too: run nothing else beside it) summed over all of them, the busiest thread's of each
 * block summed over the blocks, and the busiest thread's of all. Not a GPU's time; what it
 * shows is where the emulated work is and how long a kernel's longest serial path is beside
 * the others' (tests/simt/profile.py sums it by kernel). Only the launches from the
 * WICK_SIMT_PROFILE_FROM-th (counted from 1; default 1) are timed: the earlier ones (a
 * prefill before the decode steps to be measured) log zeros. Under launch_mu. */
static void profile_log(const char *kernel, dim3 grid, size_t nt)
{
	static const char *path = getenv("WICK_SIMT_PROFILE");
	static int fd = path && *path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)
				      : -2;
	if (fd == -2)
		return;
	char line[512];
	int len = snprintf(line, sizeof line, "%s\t%lu\t%zu\t%.2f\t%.2f\t%.2f\n",
			   kernel ? kernel_key(kernel).c_str() : "?",
			   (unsigned long)grid.x * grid.y * grid.z, nt, prof.work_ns / 1e3,
			   prof.serial_ns / 1e3, prof.max_ns / 1e3);
	if (fd < 0 || len <= 0 || (size_t)len >= sizeof line || write(fd, line, (size_t)len) != len)
		fail("WICK_SIMT_PROFILE: cannot append to its file");
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
	prof = launch_prof{};
	profiling = profile_from && launches >= profile_from;
	run_grid(grid, nt);
	profiling = false;
	profile_log(kernel, grid, nt);
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

/* WICK_SIMT_ALLOCS=FILE: at exit, "cudaMalloc N cudaFree M" appended to FILE, the process's
 * device allocations and frees (a free waits for the device, so one per decode step stalls
 * a GPU's pipeline: tests/e2e/cuda_emulated.sh compares the counts of runs of 2 and 6 steps). */
static std::atomic<unsigned long> n_mallocs, n_frees;

static void allocs_report(void)
{
	const char *path = getenv("WICK_SIMT_ALLOCS");
	FILE *f = path && *path ? fopen(path, "a") : NULL;
	if (f) {
		fprintf(f, "cudaMalloc %lu cudaFree %lu\n", n_mallocs.load(), n_frees.load());
		fclose(f);
	}
}

static void allocs_count(std::atomic<unsigned long> &n)
{
	static std::once_flag once;
	std::call_once(once, [] { atexit(allocs_report); });
	n++;
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
	allocs_count(n_mallocs);
	if (e == cudaSuccess && *p) {
		std::lock_guard<std::mutex> g(rt_mu);
		dev_of[(uintptr_t)*p] = cur_device;
	}
	return e;
}

cudaError_t cudaFree(void *p)
{
	if (p)
		allocs_count(n_frees);
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
	*e = new CUevent_st{NULL, 0, !(flags & cudaEventDisableTiming), false, 0.0};
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
	e->recorded = true;
	e->t = std::chrono::duration<double, std::milli>(
		       std::chrono::steady_clock::now().time_since_epoch())
		       .count();
	return cudaSuccess;
}

/* CUDA's errors: an event never recorded or made without timing, InvalidResourceHandle; one
 * whose stream has not reached it, NotReady. The time is the records' host clocks apart. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	std::lock_guard<std::mutex> g(rt_mu);
	if (sticky())
		return sticky();
	if (!ms || !events.count(a) || !events.count(b))
		return cudaErrorInvalidValue;
	if (!a->timing || !b->timing || !a->recorded || !b->recorded)
		return cudaErrorInvalidResourceHandle;
	for (cudaEvent_t e : {a, b})
		if (e->s && !e->s->q.empty() && e->s->q.front().seq <= e->seq)
			return cudaErrorNotReady;
	*ms = (float)(b->t - a->t);
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
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	default: return "unknown error";
	}
}
