/*
 * simt.h - a small CUDA emulator, so that the CUDA kernels' tests (tests/unit/test_cuda*.c)
 * and the CUDA backend end to end (tests/e2e/cuda_emulated.sh) run on a plain CPU in every
 * `make test`. tests/simt/cu2cpp.py rewrites the CUDA files of kernels/cuda into C++
 * (launches become simt_run calls), the shim headers in tests/simt/include make
 * <cuda_runtime.h> and friends this file, and g++ compiles the result (the Makefile's simt
 * target: $(BUILD)/simt/unit, and $(BUILD)/simt/wick, the whole wick with backend_cuda.cu).
 *
 * What it does: each CUDA thread is a fiber on its own stack. The blocks of a launch run one
 * after another, except in the launches whose blocks wait for or count each other (a chained
 * launch, k_chain; the kernels whose last block to finish does the rest): there 3 blocks are
 * resident at once and take turns of a few threads' turns each, newer blocks overtaking older
 * ones on a fixed pseudo-random schedule, so a block that reads another's work before it is
 * done meets it half written (simt.cpp, interleaved).
 * In a block, each warp runs until all its lanes wait at __syncthreads (or
 * have returned), then the next warp, forwards and backwards in turn, so one warp races ahead
 * of the others as it may on a GPU. __syncthreads() is a real barrier (a deadlock, or threads
 * of a block waiting at different __syncthreads, aborts with a message) and a warp shuffle
 * waits for the warp's lanes. Shared memory (static and dynamic) is poisoned with 0x7fffffff
 * words at the start of every block, device memory at cudaMalloc: a float read before it is
 * written is NaN, an int INT_MAX. So a missing barrier usually shows as a read of the poison
 * or of another warp's older or newer value. Launches check the block and grid sizes and the
 * dynamic shared memory as CUDA does and report cudaErrorInvalidConfiguration.
 *
 * What it does NOT prove, and the GPU (scripts/gpu-check) remains the judge of:
 *   - speed: nothing here says how fast a kernel is on a GPU (WICK_SIMT_PROFILE=FILE logs
 *     each launch's blocks and its threads' busy time here, the time of their turns that
 *     moved something, spin-waits' polls left out, and tests/simt/profile.py sums it
 *     by kernel: where the emulated work is, and which kernel has a thread or a few blocks
 *     doing far more than the rest, a serial path a GPU cannot spread either; no more);
 *   - the GPU memory model: threads switch only at barriers, shuffles and __nanosleep, in
 *     the orders above, so a race is found only where those orders expose it; between
 *     blocks, only in the interleaved launches (a chained launch's missing wait fails its
 *     test there, and a wait that can never end is reported as a deadlock), and every write
 *     is visible at once to plain loads, so a missing __threadfence or a plain load that a
 *     GPU's L1 would serve stale passes (a non-coherent load, ld.global.nc, of what another
 *     block wrote in the same interleaved launch does not: it reads the launch's start,
 *     simt_ld_nc); device memory is host
 *     memory, so a host pointer handed to a kernel works here (devsim, tests/unit/devsim.c,
 *     checks that for the backend); the other way round is checked: device memory comes
 *     from an arena, a slice per device, that the host cannot reach while no kernel, copy
 *     or collective uses it (simt_mem.cpp's guard), so host code reading or writing through a
 *     device pointer faults and is named, as is a kernel's access to another device's
 *     memory, to freed memory or past an allocation's last page (on devices holding up to
 *     WICK_SIMT_GUARD_MB, 64 MiB, of live memory: a larger one stays open, the mprotect of
 *     all of it at every launch costing minutes);
 *   - real warp scheduling: no lockstep, no divergence cost, no independent-thread-scheduling
 *     hazards (code that needs __syncwarp and lacks it passes);
 *   - atomics ordering: atomics run one at a time in the emulator's order, not the GPU's;
 *   - arithmetic: expf and friends are the host's libm and nothing is fused into an FMA, so
 *     results can differ from the GPU's in the last bits (the tests compare with tolerances);
 *   - limits beyond the launch configuration: registers, occupancy, static shared memory.
 *     Registers and static shared memory are checked beside it instead: WICK_SIMT_LAUNCHES
 *     logs each launch shape, and tests/simt/launch_fit.py (make test's launch-fit stage)
 *     holds them against what ptxas reported for sm_90a; occupancy is the GPU's to show.
 *
 * The tensor-core mma and cp.async of kernels/cuda/mma.cuh (gemm_fp8.cu) are emulated from
 * their documentation (the PTX ISA): tests/simt/mma.cpp computes an mma from the whole warp's
 * fragments by the documented fragment layout, so a kernel that feeds the wrong bytes to a
 * lane, or reads the wrong lane's result, fails here; but if we misread the document, the
 * emulator and the kernel agree and are both wrong, and the hardware's own accumulation
 * precision is not modelled (the emulator rounds each mma's sum once). A cp.async copy lands
 * only at the cp.async.wait_group that must retire it, so a read before the wait sees poison.
 * Hopper's wgmma (kernels/cuda/wgmma.cuh; e4m3 for gemm_wgmma.cu, bf16 for gemm_fp8w.cu)
 * likewise (tests/simt/wgmma.cpp):
 * the descriptors' 128-byte swizzle and the accumulator fragment as we read the PTX ISA, the
 * result computed at the wgmma.wait_group that retires it, from shared memory as it is then,
 * and aborting when that differs from what shared memory held at the issue;
 * the async proxy (fence.proxy.async) is not modelled. Its mbarriers and the bulk tensor
 * copy (TMA) are emulated too: a copy lands when a thread next waits on its mbarrier, and a
 * round in which every thread only spins on mbarriers is reported as a deadlock. The bulk
 * tensor store (shared to global, in bulk groups) reads shared memory and writes global
 * memory at the cp.async.bulk.wait_group that retires its group, aborting if that shared
 * memory changed since the issue (a staging area rewritten before its wait_group.read) or
 * if a thread returns with a store not waited for; named barriers (bar.sync id, count) are
 * real barriers of count threads.
 * Thread block clusters (cudaLaunchKernelEx's cluster dimension; the 2-CTA GEMM): a
 * cluster's CTAs are resident together and interleaved, its last rank running alone until
 * it waits; mapa's shared::cluster addresses reach a peer's shared memory, so a remote
 * mbarrier arrival and a multicast tensor copy land in the peer. A peer's mbarrier used
 * before its init (a missing cluster barrier), and an arrival or copy reaching a CTA whose
 * threads have all returned, abort; the release/acquire at cluster scope is not modelled
 * (everything is visible at once).
 *
 * The backend (kernels/cuda/backend_cuda.cu) runs on the runtime API below: one device whose
 * memory is host memory, copies checked against their kind, the copies of a stream made only
 * when the host waits for them (so a staging buffer refilled too early, or restored weights
 * read before their event, give wrong bytes), and an injected sticky fault. That checks the
 * backend's wiring (each op's arguments, copy directions, the restore's staging and events,
 * the sticky error) against the CPU backend. It does NOT prove, beyond the list above:
 *   - host/device separation in the backend's own code, all of it: a host pointer handed to a
 *     kernel works here (devsim, tests/unit/devsim.c, checks the engine's side of that
 *     boundary, not backend_cuda.cu's), and host code that touches a device's memory faults
 *     only while no host thread has a kernel or copy on that device running (the guard
 *     counts per device over all threads);
 *   - ordering on the GPU: kernels run at once, in issue order, so only the restore's copy
 *     stream can lag; copy/compute overlap and bandwidth are not modelled;
 *   - the GPU's memory limit, beyond a count: each device holds WICK_SIMT_DEVICE_MB MiB
 *     (default 141 GiB, an H200's), a cudaMalloc past it fails and cudaMemGetInfo reports
 *     what is left, but the CUDA context's own memory, the allocator's granularity and
 *     fragmentation are not modelled, so what just fits here may not on a GPU; what an
 *     allocation costs is not modelled either, but WICK_SIMT_ALLOCS=FILE counts cudaMalloc
 *     and cudaFree (a cudaFree waits for the device: none may come in a decode step);
 *   - devices kept apart: WICK_SIMT_DEVICES devices (default 1) can be selected, per host
 *     thread, and share one memory; each cudaMalloc is tagged with the current device and a
 *     copy to or from another device's memory is refused (stricter than CUDA), and a kernel
 *     touching another device's memory faults (the guard; wick enables no peer access)
 *     unless a copy on that device runs at the same time on another host thread (a
 *     collective opens every device only once all ranks are in it); host threads' kernels
 *     take turns (one launch at a time);
 *   - the driver's errors: only the emulator's refusals (bad configuration, a copy of the
 *     wrong kind, an unknown handle) and the one injected fault occur; a real out-of-memory,
 *     a launch out of registers, a timeout or an ECC error never does;
 *   - NCCL: the emulated wick links tests/simt/comm_simt.c, comm_cpu's collectives under
 *     NCCL's name (right only because every device shares host memory here).
 *
 * Only what kernels/cuda/kernels.cu, glm_kernels.cu, moe_kernels.cu, gemm_fp8.cu,
 * gemm_wgmma.cu, gemm_fp8w.cu and backend_cuda.cu use is here; a file using more fails to
 * compile, and the missing piece is added here. Kernels are launched from one host thread at
 * a time (a second aborts); the runtime calls are thread-safe (see below).
 */
#ifndef WICK_SIMT_H
#define WICK_SIMT_H

#include <cmath>
#include <functional>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

using std::isnan;

extern "C" { /* common/dtype.c */
float dt_f16_to_f32(uint16_t h);
float dt_e4m3_to_f32(uint8_t b);
}

/* ---- the thread's coordinates ---------------------------------------------------------- */

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
/* set by the scheduler before it resumes a thread */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---- qualifiers and types -------------------------------------------------------------- */

#define WICK_SIMT 1 /* kernels/cuda/mma.cuh takes the emulator's instructions */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
/* cu2cpp.py rewrites `__shared__ T x[N];` as a static plus a simt_shared call */

struct alignas(16) uint4 {
	unsigned x, y, z, w;
};
struct alignas(8) float2 {
	float x, y;
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(8) uint2 {
	unsigned x, y;
};
struct __nv_bfloat16 {
	uint16_t x;
};
struct __half {
	uint16_t x;
};
struct __nv_fp8_e4m3 {
	uint8_t x;
	explicit operator float() const { return dt_e4m3_to_f32(x); }
};

static inline float __bfloat162float(__nv_bfloat16 b)
{
	uint32_t u = (uint32_t)b.x << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline float __half2float(__half h) { return dt_f16_to_f32(h.x); }
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
/* one rounding each, as CUDA's: the host's float arithmetic (nothing is fused here) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{x, y, z, w};
}
/* prmt.b32 in PTX's default mode (kernels/cuda/gemv.cuh's prmt) */
static inline uint32_t simt_prmt(uint32_t a, uint32_t b, uint32_t sel)
{
	uint64_t v = (uint64_t)b << 32 | a;
	uint32_t d = 0;
	for (int i = 0; i < 4; i++) {
		unsigned n = (sel >> (4 * i)) & 15u;
		uint32_t byte = (uint32_t)(v >> (8 * (n & 7))) & 0xffu;
		if (n & 8)
			byte = byte & 0x80u ? 0xffu : 0u;
		d |= byte << (8 * i);
	}
	return d;
}
/* cvt.rn.bf16x2.f32 d, hi, lo: each rounded to nearest even, NaN as the canonical 0x7fff */
static inline uint32_t simt_bf16_rn(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return 0x7fffu;
	return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
static inline uint32_t simt_cvt_rn_bf16x2_f32(float hi, float lo)
{
	return simt_bf16_rn(hi) << 16 | simt_bf16_rn(lo);
}
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* ---- barriers, shuffles, shared memory ------------------------------------------------- */

/* Waits until every thread of the block that has not returned is here; site names the call
 * (a block whose threads wait at different sites aborts). */
void simt_syncthreads(const char *site);
#define SIMT_STR_(x) #x
#define SIMT_STR(x) SIMT_STR_(x)
#define __syncthreads() simt_syncthreads(__FILE__ ":" SIMT_STR(__LINE__))
/* Every write is visible to every thread at once here: a fence orders nothing (the GPU's
 * memory model is not modelled; see the top). */
static inline void __threadfence(void) {}
/* A thread waiting for other blocks (a chained launch's link waits for the one before it)
 * sleeps between polls. In an interleaved launch the other resident blocks run meanwhile,
 * and a pass in which every block only waits aborts as a deadlock; in any other launch blocks
 * run one after another, so a correct wait is over before its first poll: a thread that
 * sleeps again and again waits for work no block left to run will do, and it aborts. */
void simt_nanosleep(unsigned ns);
#define __nanosleep(ns) simt_nanosleep(ns)
/* A trap: the GPU ends the launch with a sticky error; here it aborts, naming the site. */
[[noreturn]] void simt_trap(const char *site);
#define __trap() simt_trap(__FILE__ ":" SIMT_STR(__LINE__))

/* A load of n (<= 16, n-aligned) bytes through the non-coherent read-only path
 * (ld.global.nc): in an interleaved launch, what src held when the launch began, as a GPU's
 * read-only cache may answer after another block's write (simt_mem.cpp, cow); else src now. */
void simt_ld_nc(void *dst, const void *src, size_t n);

/* prefetch.global.L2: a hint, nothing loaded; here one byte of p is read, so that an address
 * a kernel may not reach (the host's, another device's, freed, past an allocation's last
 * page) faults and is named, as a load there would be. */
void simt_prefetch(const void *p);

/* The thread's lane in its warp (warps are consecutive threads in x, then y, then z). */
int simt_lane(void);
/* Every lane of the warp calls it; *v becomes lane src's *v. */
void simt_warp_exchange(uint64_t *v, int src);

/* A __shared__ variable: poisons [p, p + n) the first time a thread of a block gets here. */
void simt_shared(void *p, size_t n);
/* The launch's dynamic shared memory (extern __shared__). */
void *simt_dyn_smem(void);

template <typename T> static inline T simt_shfl(T v, int src)
{
	static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type over 8 bytes");
	uint64_t b = 0;
	memcpy(&b, &v, sizeof v);
	simt_warp_exchange(&b, src);
	T r;
	memcpy(&r, &b, sizeof r);
	return r;
}
/* The mask is not checked: the kernels here shuffle with whole warps only. */
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int o)
{
	(void)mask;
	return simt_shfl(v, simt_lane() ^ o);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, int o)
{
	(void)mask;
	int lane = simt_lane();
	return simt_shfl(v, lane >= o ? lane - o : lane);
}

/* The warp's lanes meet, as at a shuffle (the mask is not checked: whole warps only). Threads
 * switch only at such meetings and barriers here, so a missing __syncwarp still passes. */
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
	(void)mask;
	(void)simt_shfl(0, simt_lane());
}

/* Every lane of the warp calls it with its n bytes (n <= 64); all [lane * n ..) gets each
 * lane's bytes in lane order. Returns the number of lanes in the warp. */
int simt_warp_gather(const void *mine, void *all, size_t n);

/* ---- tensor cores and asynchronous copies (kernels/cuda/mma.cuh) ----------------------- */

/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 with d as C and D (tests/simt/mma.cpp):
 * every lane of a full warp calls it; fragments as the PTX ISA documents them. */
void simt_mma_e4m3_16832(float d[4], const uint32_t a[4], const uint32_t b[2]);
void simt_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
/* cp.async of n bytes (4, 8 or 16; both addresses n-aligned): src_n bytes from src, then
 * zeros. Queued in the calling thread's open group; copied when a wait retires the group. */
void simt_cp_async(void *dst, const void *src, int n, int src_n);
void simt_cp_async_commit(void); /* closes the thread's open group */
/* Completes the thread's committed groups but the newest `pending`. Groups still pending
 * when the thread returns are dropped: their bytes never land. */
void simt_cp_async_wait(int pending);

/* ---- Hopper's warpgroup tensor cores (kernels/cuda/wgmma.cuh; tests/simt/wgmma.cpp) ----- */

/* The shared-window address of p, a pointer into the launch's dynamic shared memory (the
 * window starts at 0 at the dynamic memory's start); aborts for any other pointer. */
uint32_t simt_smem_addr(const void *p);
/* [addr, addr + n) of the shared window as a pointer; aborts when it leaves the window. addr
 * may be a shared::cluster address (simt_mapa's): then in that CTA's shared memory. */
void *simt_smem_ptr(uint32_t addr, size_t n);
/* The thread's index in its block (x fastest), and the serial number of the running block. */
int simt_thread_index(void);
unsigned long simt_block_serial(void);
/* The blocks resident at once (simt.cpp's slots: an interleaved launch's, or a cluster's CTAs
 * by rank), the running block's slot, and the serial of the block in a slot: wgmma.cpp keeps
 * its per-block state by slot. */
enum { SIMT_SLOTS = 3 };
int simt_block_slot(void);
unsigned long simt_slot_serial(int slot);
/* The slot of the block whose shared memory addr (a shared::cta or shared::cluster address)
 * lies in, and its offset there. */
int simt_smem_slot(uint32_t addr, uint32_t *off);

/* ---- thread block clusters (a launch with a cluster dimension, simt_launch_ex) ----------
 * A cluster's CTAs (2 or 3, along x) are resident together and run interleaved, one cluster
 * after another. A shared::cluster address here is a shared::cta one with the rank + 1 in its
 * bits 24 and up. Outside a cluster launch a block is a cluster of one. */
unsigned simt_cluster_rank(void);                    /* %cluster_ctarank */
uint32_t simt_mapa(uint32_t addr, unsigned rank);    /* mapa.shared::cluster */
void simt_cluster_sync(void);                        /* barrier.cluster.arrive + wait */
/* wgmma.fence / commit_group / wait_group and wgmma.mma_async.m64nNk32.f32.e4m3.e4m3 with A
 * and B from descriptors (d: the thread's n / 2 accumulators); see wgmma.cpp. */
void simt_wgmma_fence(void);
void simt_wgmma_commit(void);
void simt_wgmma_wait(int pending);
void simt_wgmma_e4m3(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d);
/* wgmma.mma_async.m64nNk16.f32.bf16.bf16, A and B K-major from descriptors (the same
 * 128-byte swizzle, 16 two-byte elements in a row's 32-byte k slice). */
void simt_wgmma_bf16(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d);
/* The same with A from registers (a: this thread's 4 registers of the warp's 16-row slice,
 * mma.sync m16n8k16's A layout); they must hold the same values at the retiring wait. */
void simt_wgmma_bf16_rs(float *d, int n, const uint32_t *a, uint64_t desc_b, int scale_d);
/* mbarriers at shared addresses, and cp.async.bulk.tensor.2d (map: a CUtensorMap of
 * tests/simt/include/cuda.h): the copy is recorded on its mbarrier and lands when a thread
 * next waits on that mbarrier; see wgmma.cpp. arrive with tx > 0 is arrive.expect_tx. */
void simt_mbar_init(uint32_t bar, unsigned count);
void simt_mbar_arrive(uint32_t bar, unsigned tx);
void simt_mbar_wait(uint32_t bar, unsigned parity);
void simt_tma_load_2d(uint32_t dst, const void *map, int c0, int c1, uint32_t bar);
/* The same multicast: into each CTA of mask (bit r: rank r) at dst, on its mbarrier at bar. */
void simt_tma_load_2d_mc(uint32_t dst, const void *map, int c0, int c1, uint32_t bar,
			 uint16_t mask);
/* cp.async.bulk.tensor.2d.global.shared::cta.bulk_group (a store of the box at (c0, c1) of
 * map's tensor from shared address src), cp.async.bulk.commit_group and
 * cp.async.bulk.wait_group[.read] (pending: N): a store reads its shared memory and writes
 * global memory when a wait retires its group, and aborts if that shared memory changed
 * since the issue; a thread that returns with bulk stores not waited for aborts
 * (simt_bulk_on_return, called by the scheduler); see wgmma.cpp. */
void simt_tma_store_2d(const void *map, int c0, int c1, uint32_t src);
void simt_bulk_commit(void);
void simt_bulk_wait(int pending, bool read);
void simt_bulk_on_return(void);
/* bar.sync id, count: a barrier of count threads on barrier id 1..15 (0 is __syncthreads');
 * the threads arriving at one id must name the same count. */
void simt_named_bar(int id, int count);
/* Device memory opened to the host (1) and closed again (0), paired: what a collective of
 * tests/simt/comm_simt.c does from the host, as NCCL's kernels would on a GPU. */
extern "C" void simt_device_access(int open);
/* The thread lets the others run (a spin-wait's turn); simt_progress counts an event that
 * may release a waiter (the scheduler's deadlock check: a round of only yields aborts). */
void simt_yield(void);
void simt_progress(void);

/* One thread runs at a time, so these are plain read-modify-writes. */
template <typename T, typename U> static inline T atomicAdd(T *p, U v)
{
	T old = *p;
	*p = old + (T)v;
	return old;
}
/* A load cached in L2 only (ld.global.cg): here every load is from memory. */
template <typename T> static inline T __ldcg(const T *p)
{
	return *p;
}

template <typename T, typename U> static inline T atomicExch(T *p, U v)
{
	T old = *p;
	*p = (T)v;
	return old;
}

/* ---- the runtime API (simt_runtime.cpp), for the kernels and kernels/cuda/backend_cuda.cu ----
 *
 * One device, number 0; device memory is host memory. cudaMalloc poisons what it returns and
 * records it; cudaHostAlloc (pinned memory) likewise. A copy or memset whose pointers do not
 * lie where its kind says (device memory inside one cudaMalloc allocation, host memory outside
 * every one) is refused with cudaErrorInvalidValue: stricter than CUDA, which under unified
 * addressing takes some such copies, so a to_device wired as a to_host fails here.
 *
 * Streams: kernels, cudaMemcpy, cudaMemset and the Async calls on the default stream (0) run
 * to completion before they return, as if the GPU were infinitely fast. A copy or memset on a
 * stream of cudaStreamCreateWithFlags is queued on that stream and made only when the host
 * next waits for it: cudaEventSynchronize of an event recorded after it, cudaStreamSynchronize,
 * cudaDeviceSynchronize, or cudaFree, cudaFreeHost or cudaStreamDestroy (which wait for all);
 * its source is read then, not when it was queued. So a pinned staging buffer refilled before
 * its event was waited for lands its new bytes, and device memory read before the wait (by a
 * kernel or a copy on the default stream) still holds cudaMalloc's poison. A copy whose host
 * side is pageable is made at once (CUDA stages pageable memory before returning). A blocking
 * stream's queue (cudaStreamDefault) is made before each default-stream call, the legacy
 * default stream's implicit synchronisation; a cudaStreamNonBlocking stream's is not.
 * cudaStreamPerThread works as the default stream (both made at once); WICK_SIMT_STREAM=pt
 * makes a kernel launch or async memset on the legacy default stream abort, naming it (the
 * check that WICK_CUDA_STREAM=pt moves all the backend's compute).
 *
 * Errors: the last error is per host thread, as CUDA's. WICK_SIMT_FAULT_LAUNCH=N in the
 * environment makes the Nth kernel launch of the process (from 1) fault as an illegal memory
 * access would on a GPU: it and every launch after it run nothing; the next call that waits
 * for the device (a synchronous copy or memset, a synchronize) returns
 * cudaErrorIllegalAddress, and from then on every call does (the context is lost: sticky).
 *
 * Thread safety: the runtime calls may come from several host threads at once (the restore's
 * readers); kernels are launched from one thread at a time (a second at once aborts).
 */

typedef int cudaError_t;
enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
	cudaErrorIllegalAddress = 700,
};
enum cudaMemcpyKind {
	cudaMemcpyHostToHost,
	cudaMemcpyHostToDevice,
	cudaMemcpyDeviceToHost,
	cudaMemcpyDeviceToDevice,
};
enum {
	cudaStreamDefault = 0, /* blocking: the legacy default stream waits for it */
	cudaStreamNonBlocking = 1,
	cudaEventDefault = 0,
	cudaEventDisableTiming = 2,
	cudaHostAllocDefault = 0,
	cudaHostAllocPortable = 1,
};
typedef struct CUstream_st *cudaStream_t; /* 0 is the default stream */
#define cudaStreamPerThread ((cudaStream_t)0x2) /* works as the default stream here */
typedef struct CUevent_st *cudaEvent_t;

cudaError_t cudaGetDeviceCount(int *n); /* $WICK_SIMT_DEVICES (1..8), default 1 */
cudaError_t cudaSetDevice(int device);  /* per host thread; cudaErrorInvalidDevice past n */
cudaError_t cudaGetDevice(int *device);

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b); /* $WICK_SIMT_DEVICE_MB */
template <typename T> cudaError_t cudaMalloc(T **p, size_t n)
{
	return cudaMalloc((void **)p, n);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags); /* 4 KiB-aligned */
template <typename T> cudaError_t cudaHostAlloc(T **p, size_t n, unsigned flags)
{
	return cudaHostAlloc((void **)p, n, flags);
}
cudaError_t cudaFreeHost(void *p);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			 size_t height, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e); /* success when never recorded, as CUDA */
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaDeviceSynchronize(void);

/* the calling thread's last error, then cudaSuccess (a sticky error stays) */
cudaError_t cudaGetLastError(void);

/* The driver's entry points the kernels ask for: cuTensorMapEncodeTiled only (cuda.h). */
enum cudaDriverEntryPointQueryResult {
	cudaDriverEntryPointSuccess = 0,
	cudaDriverEntryPointSymbolNotFound = 1,
};
enum { cudaEnableDefault = 0 };
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
					     unsigned long long flags,
					     cudaDriverEntryPointQueryResult *status);

/* cudaDevAttrMultiProcessorCount: 3 emulated multiprocessors (tests/simt/wgmma.cpp), so
 * that a persistent kernel's blocks each take several tiles here; cudaDevAttrL2CacheSize:
 * 512 KiB, so that the FP8 GEMM's L2-grouped tile order (gemm_wgmma.cu) groups the tests'
 * small shapes too. */
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrL2CacheSize = 38 };
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
const char *cudaGetErrorString(cudaError_t e);

/* kernel<<<grid, block, smem, stream>>>(args) as cu2cpp.py writes it: body runs once per
 * thread of every block, after the work queued on stream (and on blocking streams). A bad
 * configuration launches nothing and sets cudaGetLastError. */
void simt_run(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
	      const std::function<void()> &body, const char *kernel = 0,
	      dim3 cluster = dim3(1, 1, 1));

/* cudaLaunchKernelEx with the two attributes the kernels use: a cluster dimension (x only:
 * clusters of 2 or 3 blocks along x, gridDim.x a multiple), and programmatic stream
 * serialization (PDL: the launch may overlap the kernel before; the emulator runs launches
 * one after another, which is one of the orders PDL allows, and griddepcontrol is a no-op
 * in its kernels); returns the launch's configuration error, as CUDA does.
 * cudaOccupancyMaxActiveClusters answers for the 3 emulated multiprocessors: 3 / the
 * cluster's size. */
enum cudaLaunchAttributeID {
	cudaLaunchAttributeClusterDimension = 4,
	cudaLaunchAttributeProgrammaticStreamSerialization = 6
};
union cudaLaunchAttributeValue {
	struct {
		unsigned x, y, z;
	} clusterDim;
	int programmaticStreamSerializationAllowed;
	char pad[64];
};
struct cudaLaunchAttribute {
	cudaLaunchAttributeID id;
	cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
	dim3 gridDim, blockDim;
	size_t dynamicSmemBytes;
	cudaStream_t stream;
	cudaLaunchAttribute *attrs;
	unsigned numAttrs;
};
cudaError_t simt_launch_ex(const cudaLaunchConfig_t *cfg, const char *kernel,
			   const std::function<void()> &body);
#define cudaLaunchKernelEx(cfg, kernel, ...)                                                \
	simt_launch_ex(cfg, #kernel, [=]() { kernel(__VA_ARGS__); })
cudaError_t simt_max_active_clusters(int *n, const cudaLaunchConfig_t *cfg);
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveClusters(int *n, F *func,
							 const cudaLaunchConfig_t *cfg)
{
	(void)func;
	return simt_max_active_clusters(n, cfg);
}

/* Dynamic shared memory above 48 KiB, as CUDA: launches of kernel may then use up to v
 * bytes (at most 227 KiB). The kernel is known by its name as the source writes it (spaces
 * aside): cu2cpp.py passes each launch's to simt_run, and this macro stringizes the
 * attribute's (a template kernel must be named with its arguments, k<true>, in both; one
 * of several arguments in parentheses, (k<A, B>), for the macros' sake). */
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
cudaError_t simt_func_set_attribute(const char *kernel, cudaFuncAttribute a, int v);
#define cudaFuncSetAttribute(kernel, a, v) simt_func_set_attribute(#kernel, a, v)

#endif
