/*
 * devsim.h - "devsim", a test backend for the engine's side of a device backend, checked
 * without a GPU: it runs the CPU backend's kernels on memory that the host cannot touch. Its
 * mem_alloc and upload_weight hand out page-aligned regions kept PROT_NONE except while one
 * of its own ops or copies runs, so any place where the engine reads or writes activations,
 * caches, norm vectors or weights directly (instead of through eng_to_dev / eng_to_host /
 * eng_dcopy / eng_dzero and the backend's ops) crashes the test with SIGSEGV. This is the
 * plumbing the CUDA backend relies on (device pointers are just as untouchable from the host
 * there). The other direction too: every pointer an op or a device copy is handed must be
 * devsim memory (a GPU kernel cannot read host memory), else the test fails naming it. Every
 * op of the Llama and GLM families is wrapped, and matmul_fp8w (the f32-activation prefill
 * GEMM, which the CPU lacks) as the CPU's matmul, exact. Used by test_devmem.c
 * (stories260K) and test_glm_paths.c (GLM-5 and GLM-4.5). It also takes a snapshot restore
 * straight into its memory (the stage ops), its copies made only at stage_wait.
 */
#ifndef WICK_TEST_DEVSIM_H
#define WICK_TEST_DEVSIM_H

#include "engine/backend.h"

extern const struct backend be_devsim;
/* The same without the grouped MoE op: the engine runs the experts one by one. */
extern const struct backend be_devsim_ungrouped;

/* The collectives of a sharded engine whose ranks run on devsim (eng_opts.comm_ops):
 * comm_cpu's, refusing buffers that are not devsim memory, as NCCL needs device pointers. */
struct comm_ops;
extern const struct comm_ops comm_devsim;

/* Ops and copies counted since init, so a test knows the paths ran. */
struct devsim_counts {
	int ops, copies, regions;
	int uploads;    /* upload_weight calls (none when a snapshot streamed in) */
	int stage_puts; /* the restore's copies from staging buffers */
};
void devsim_counts(void *ctx, struct devsim_counts *out);

#endif
