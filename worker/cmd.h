/*
 * cmd.h - the wick subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name, as getopt_long expects), prints its own --help, and returns the process
 * exit status: 0 on success, 1 on a failure, 2 on a usage error. Only main() exits.
 */
#ifndef CMD_H
#define CMD_H

int cmd_convert(int argc, char **argv);  /* worker/cmd_convert.c */
int cmd_inspect(int argc, char **argv);  /* worker/cmd_inspect.c */
int cmd_tokenize(int argc, char **argv); /* worker/cmd_tokenize.c */
int cmd_generate(int argc, char **argv); /* worker/cmd_generate.c */
int cmd_logits(int argc, char **argv);   /* worker/cmd_generate.c */
int cmd_bench(int argc, char **argv);    /* worker/cmd_bench.c */
int bench_restore(int argc, char **argv); /* worker/bench_restore.c, via cmd_bench */
int bench_queue(int argc, char **argv);   /* worker/bench_queue.c, via cmd_bench */
/* The integer just before `word` in a worker's log line ("... 2000 completed ..."), or -1
 * (bench_queue.c; its benchmarks read their worker's exit line). */
long long bench_number_before(const char *msg, const char *word);
int bench_spec(int argc, char **argv);    /* worker/bench_spec.c, via cmd_bench */
int bench_launches(int argc, char **argv); /* worker/bench_launches.c, via cmd_bench */
int bench_picks(int argc, char **argv);   /* worker/bench_picks.c, via cmd_bench */
int bench_prompt(int argc, char **argv);  /* worker/bench_prompt.c, via cmd_bench */
int bench_prepare(int argc, char **argv); /* worker/bench_prepare.c, via cmd_bench */
int bench_http(int argc, char **argv);    /* worker/bench_http.c, via cmd_bench */

/* ---- what bench prepare and bench http share (worker/bench_gaps.c): a worker with steady
 * jobs decoding while big ones arrive, without and then with a helper thread ---- */
#include <stddef.h>
#define BENCH_ROUNDS_MAX 64
struct bench_load {
	const char *model, *backend, *threads; /* --backend, --threads: the worker's */
	int steady, tokens, big, kb, every, rounds;
};
#define BENCH_LOAD_DEFAULT                                                                 \
	{.backend = "cpu", .steady = 4, .tokens = 400, .big = 8, .kb = 512, .every = 40,      \
	 .rounds = 2}
#define BENCH_LOAD_OPTIONS                                                                 \
	{"steady", required_argument, 0, 'c'}, {"tokens", required_argument, 0, 'n'},         \
	{"big", required_argument, 0, 'b'}, {"kb", required_argument, 0, 'k'},                \
	{"every", required_argument, 0, 'e'}, {"rounds", required_argument, 0, 'r'},          \
	{"backend", required_argument, 0, 'B'}, {"threads", required_argument, 0, 'T'}
/* One of BENCH_LOAD_OPTIONS' flags (getopt's ch and its argument) into l: 0, or 2 (a bad
 * value, said on stderr in the name of `wick bench who`; or a flag not of these, unsaid). */
int bench_load_flag(struct bench_load *l, int ch, const char *arg, const char *who);
/* l's model (MODEL, the one argument) and its tokenizer into *tk (the caller frees it), with
 * at most max steady and big jobs together (what: "jobs", "requests"): 0, or the exit status
 * after saying why in the name of `wick bench who` (2: a usage error; 1: no tokenizer). */
struct tok;
int bench_load_model(struct bench_load *l, const char *model, const char *who, int max,
		     const char *what, struct tok **tk);
/* kb KB of a story's words, numbered so that no piece repeats another (malloc'd), or NULL. */
char *bench_filler(int kb);
/* What one run's steady jobs saw. */
struct bench_gaps {
	double median_ms, p99_ms, max_ms, run_s;
	long count;       /* steps, or chunks */
	long long beside; /* the big ones the helper took, or -1 when unknown */
};
/* The gaps t[n] (ms, n >= 1; sorted here) into g's median, 99th percentile and longest. */
void bench_gaps_of(double *t, size_t n, struct bench_gaps *g);
/* The table: a row for each run (names[0] without the helper, names[1] with it), each column
 * the median over the rounds; the longest gaps' medians into longest[2]. */
void bench_gaps_table(const char *const names[2], const char *count, const char *beside,
		      struct bench_gaps (*r)[BENCH_ROUNDS_MAX], int rounds, double longest[2]);
int bench_prefix(int argc, char **argv);  /* worker/bench_prefix.c, via cmd_bench */
int cmd_worker(int argc, char **argv);   /* worker/cmd_worker.c: runs worker/worker.c */
int cmd_worker_as(const char *name, int argc, char **argv); /* the same, its messages as NAME */
int cmd_dev(int argc, char **argv);      /* worker/cmd_dev.c: the worker, serving HTTP */
int cmd_submit(int argc, char **argv);   /* worker/cmd_submit.c */
int cmd_usage(int argc, char **argv);    /* worker/usage.c */
int cmd_snapshot(int argc, char **argv); /* worker/cmd_snapshot.c */
int cmd_prefetch(int argc, char **argv); /* worker/cmd_prefetch.c */
int cmd_plan(int argc, char **argv);     /* worker/cmd_plan.c */

/* ---- the engine flags shared by every command that loads a model ---- */

#include <stdbool.h>
#include <stdint.h>

/* `wick bench restore --backend B`'s device part (bench_restore.c): starts backend b on
 * device 0 (and, for a sharded snapshot, the sink starts rank r's on device r), restores the
 * snapshot dir into the devices' memory once untimed, checking every rank's bytes against a
 * host restore, then runs times (b must pass be_streams); then copies each rank's number of
 * bytes to its device from a pinned buffer of its own, all devices at once (the links
 * alone). Medians in *out. */
struct backend;
struct bench_device {
	double restore_s, link_s;
	uint64_t bytes; /* image bytes, all ranks */
	int devices;    /* one a rank */
	/* the restore's parts (snap_timings, medians of the runs): open (manifest, files, device
	 * images), the readers' wall time, and their hashing summed over threads */
	double open_s, read_s, verify_s;
	int threads;
	/* pinning what the readers stage through, alone: pins buffers of SNAP_SINK_PIECE */
	int pins;
	double pin_s, unpin_s;
	/* the restore again with ALT_READERS reader threads (alt_threads: as it ran), when the
	 * default took another number and no --threads was given; alt_s 0 otherwise */
	int alt_threads;
	double alt_s;
};
#define ALT_READERS 16
int bench_restore_device(const char *dir, const struct backend *b, int runs, int threads,
			 struct bench_device *out, char *err, size_t errsz);

#include "engine/engine.h"

#define CMD_OPT_BASE 1000
/* getopt_long entries for the engine flags; their values start at CMD_OPT_BASE. */
#define CMD_ENGINE_OPTIONS                                                                  \
	{"backend", required_argument, 0, CMD_OPT_BASE + 0},                               \
	{"threads", required_argument, 0, CMD_OPT_BASE + 1},                               \
	{"no-verify", no_argument, 0, CMD_OPT_BASE + 2},                                   \
	{"tp", required_argument, 0, CMD_OPT_BASE + 3},                                    \
	{"ep", required_argument, 0, CMD_OPT_BASE + 4},                                    \
	{"source", required_argument, 0, CMD_OPT_BASE + 5},                                \
	{"verbose", no_argument, 0, CMD_OPT_BASE + 6},                                     \
	{"snapshot", required_argument, 0, CMD_OPT_BASE + 7},                              \
	{"model", required_argument, 0, CMD_OPT_BASE + 7},                                 \
	{"fp8-act", no_argument, 0, CMD_OPT_BASE + 8},                                     \
	{"max-seq", required_argument, 0, CMD_OPT_BASE + 9},                               \
	{"kv-dtype", required_argument, 0, CMD_OPT_BASE + 10}

#define CMD_ENGINE_HELP                                                                     \
	"      --backend B       cpu, cuda or auto (default auto: cuda when a GPU is present)\n" \
	"      --threads T       CPU threads (default: all cores)\n"                            \
	"      --model M, --snapshot M   the model, instead of the positional MODEL\n"         \
	"      --no-verify       snapshots: skip the chunk checksums\n"                         \
	"      --tp N, --ep N    snapshots: the layout to run (default: the manifest's)\n"      \
	"      --source HF_DIR   snapshots: refuse if this source changed since the snapshot\n" \
	"      --verbose         print start-up timings as JSON on stderr\n"                    \
	"      --fp8-act         quantize the input of FP8-weight matmuls to FP8 (per token,\n"  \
	"                        128 channels a scale; default: f32 activations)\n"          \
	"      --max-seq N       positions the KV cache holds per sequence (default: the\n"    \
	"                        model's max_position_embeddings; a worker holds one cache\n"  \
	"                        per --concurrency slot: size both with wick plan)\n"  \
	"      --kv-dtype D      the KV cache's element type: bf16, f32, fp8 or auto\n" \
	"                        (default: bf16 for a bfloat16 checkpoint, as GLM-5's; else\n" \
	"                        f32); fp8: e4m3 with a scale per 128 of a row (GLM-5: the\n" \
	"                        latent and indexer keys, rope keys bf16, FlashMLA's FP8\n" \
	"                        layout; GQA: keys and values, a scale per kv head's row)\n"

struct cmd_engine {
	struct eng_opts o;
	const char *model; /* from --model/--snapshot, or the positional argument */
	bool verbose;
};

/* Handles an engine flag (c >= CMD_OPT_BASE). Returns 0, or 2 with a usage message on stderr. */
int cmd_engine_flag(struct cmd_engine *ce, int c, const char *arg);
/* Takes MODEL from the positional arguments left (argv[optind..argc)) unless --model gave it;
 * the count of positionals must then be `want`. Returns 0 or 2 (usage). */
/* The MODEL of a command that takes no engine flags: --model/--snapshot M (given, NULL when
 * absent) or the one positional argument left at optind_, as cmd_engine_model takes it. NULL,
 * with a message, when there is none or one too many. */
const char *cmd_one_model(const char *given, int argc, char **argv, int optind_);
#define CMD_MODEL_OPTIONS {"model", required_argument, 0, 'M'}, {"snapshot", required_argument, 0, 'M'}

int cmd_engine_model(struct cmd_engine *ce, int argc, char **argv, int optind_, int want);
/* Opens the engine; prints the error and returns 1 on failure. For a snapshot it prints a
 * one-line restore summary on stderr, and with --verbose the start-up timings as JSON. */
int cmd_engine_open(struct cmd_engine *ce, struct engine **e);

/* The median of v[0..n) (n > 0; the mean of the middle two when n is even); sorts v. */
double cmd_median(double *v, int n);

/* Parses "1,2,3" into a malloc'd array. Returns 0, or -1 with a message on stderr naming
 * what is wrong (empty list, not a number, out of int range). */
int cmd_parse_ids(const char *s, int **ids, int *n);

#endif
