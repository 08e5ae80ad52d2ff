/*
 * cmd_bench.c - `wick bench SUB ...`: benchmarks that print a human table and, last, one
 * JSON line for scripts.
 *
 *   decode  batch-1 decode speed, compared with the machine's read bandwidth: a decode step
 *           reads every weight once, so weight bytes per token x tokens/s against what a
 *           plain streaming read achieves is the fraction of the roofline reached.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "worker/cmd.h"

#define BENCH_MAX_TOKENS 100000

static void bench_usage(FILE *f)
{
	fprintf(f, "usage: wick bench SUB [ARGS]   (wick bench SUB --help for details)\n\n"
		   "benchmarks:\n"
		   "  wick bench decode MODEL [-n N] [--threads T] [--backend B]\n"
		   "  wick bench restore SNAP [--source HF_DIR] [--runs N] [--no-cold]\n"
		   "  wick bench queue MODEL [-n TOKENS] [--jobs N]\n"
		   "  wick bench launches MODEL [--context N] [--steps S] [--backend B]\n"
		   "  wick bench speculate MODEL [-n TOKENS] [--draft K] [--prompt TEXT]...\n"
		   "  wick bench picks MODEL [-n TOKENS] [--runs N] [--backend B]\n"
		   "  wick bench prefix MODEL [--turns T] [--runs N] [--backend B]\n"
		   "  wick bench prompt MODEL [--turns N] [--bytes B]\n"
		   "  wick bench prepare MODEL --queue URL [--big B] [--kb K] [--rounds R]\n"
		   "  wick bench http MODEL [--big B] [--kb K] [--rounds R]\n");
}

static void decode_usage(FILE *f)
{
	fprintf(f,
		"usage: wick bench decode MODEL [-n N] [options]\n\n"
		"Decodes N tokens at batch 1 (token ids: BOS, then the argmax of each step; no\n"
		"tokenizer needed) after a short warm-up, timing only the forward passes. Then\n"
		"measures the CPU's read bandwidth with the same thread count, and reports\n"
		"weight GB/s = bytes_per_token x tokens/s and ratio = weight GB/s / read GB/s.\n"
		"Prints a table, then one JSON line.\n"
		"  -n, --tokens N        tokens to time (default 64)\n"
		"      --warmup W        untimed tokens first (default 4)\n"
		"      --threads T       CPU threads (default: all cores)\n"
		"      --backend B       cpu, cuda or auto (default cpu)\n"
		"      --bw-bytes MIB    read-bandwidth buffer in MiB (default 1024)\n"
		"      --bw-seconds S    read-bandwidth duration (default 1.0; 0 skips it)\n"
		"      --kv-dtype D      the KV cache's type: bf16, f32, fp8 or auto (default auto:\n"
		"                        bf16 for a bfloat16 checkpoint)\n");
}

/* The machine's read bandwidth with `threads` threads (see cpu_read_bandwidth). Returns 0,
 * or 1 with a message on stderr. */
static int measure_bw(int threads, int mib, double seconds, double *gbps, int *nthreads)
{
	struct cpu_pool *pool = NULL;
	if (cpu_pool_create(threads, &pool) != WK_OK) {
		fprintf(stderr, "wick bench: cannot start %d threads\n", threads);
		return 1;
	}
	*nthreads = cpu_pool_size(pool);
	*gbps = cpu_read_bandwidth(pool, (size_t)mib << 20, seconds);
	cpu_pool_destroy(pool);
	if (*gbps < 0) {
		fprintf(stderr, "wick bench: cannot allocate %d MiB for the bandwidth run\n", mib);
		return 1;
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int parse_int(const char *s, const char *what, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "wick bench: %s wants an integer in %d..%d, not '%s'\n", what, lo, hi,
			s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

static int bench_decode(int argc, char **argv)
{
	int ntok = 64, warmup = 4, threads = 0, bw_mib = 1024;
	double bw_seconds = 1.0;
	const char *backend = "cpu", *kv = NULL;
	static const struct option opts[] = {
		{"tokens", required_argument, NULL, 'n'},
		{"kv-dtype", required_argument, NULL, 'k'},
		{"warmup", required_argument, NULL, 'w'},
		{"threads", required_argument, NULL, 't'},
		{"backend", required_argument, NULL, 'b'},
		{"bw-bytes", required_argument, NULL, 'B'},
		{"bw-seconds", required_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		CMD_MODEL_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	int c;
	const char *given = NULL;
	optind = 1;
	while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 'n': bad = parse_int(optarg, "-n", 1, BENCH_MAX_TOKENS, &ntok); break;
		case 'w': bad = parse_int(optarg, "--warmup", 0, BENCH_MAX_TOKENS, &warmup); break;
		case 't': bad = parse_int(optarg, "--threads", 0, 1024, &threads); break;
		case 'b': backend = optarg; break;
		case 'k': kv = optarg; break;
		case 'M': given = optarg; break;
		case 'B': bad = parse_int(optarg, "--bw-bytes", 1, 1 << 20, &bw_mib); break;
		case 'S': {
			char *end;
			bw_seconds = strtod(optarg, &end);
			bad = end == optarg || *end || bw_seconds < 0 || bw_seconds > 600;
			if (bad)
				fprintf(stderr, "wick bench: --bw-seconds wants 0..600\n");
			break;
		}
		case 'h': decode_usage(stdout); return 0;
		default: decode_usage(stderr); return 2;
		}
		if (bad)
			return 2;
	}
	const char *model = cmd_one_model(given, argc, argv, optind);
	if (!model) {
		decode_usage(stderr);
		return 2;
	}

	char err[WK_ERRSZ];
	struct engine *e = NULL;
	struct eng_opts eo = {.backend = backend, .threads = threads, .max_seq = warmup + ntok,
			      .kv_dtype = kv};
	if (eng_open(model, &eo, &e, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench: %s\n", err);
		return 1;
	}
	const struct eng_info *info = eng_info(e);
	float *logits = malloc((size_t)info->vocab * sizeof *logits);
	double *times = malloc((size_t)ntok * sizeof *times);
	int rc = 1;
	if (!logits || !times) {
		fprintf(stderr, "wick bench: out of memory\n");
		goto done;
	}

	if (info->max_seq < warmup + ntok) {
		fprintf(stderr, "wick bench: the model holds %d positions, fewer than the %d warm-up "
				"+ %d timed tokens\n", info->max_seq, warmup, ntok);
		goto done;
	}
	double bw_before = 0, bw_after = 0;
	int nthreads = threads;
	if (bw_seconds > 0 && measure_bw(threads, bw_mib, bw_seconds, &bw_before, &nthreads))
		goto done;
	int tok = info->bos >= 0 && info->bos < info->vocab ? info->bos : 0;
	double total = 0.0;
	for (int i = 0; i < warmup + ntok; i++) {
		double t0 = wk_now();
		if (eng_forward(e, &tok, 1, i, logits, false, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench: token %d: %s\n", i, err);
			goto done;
		}
		double dt = wk_now() - t0;
		if (i >= warmup) {
			times[i - warmup] = dt;
			total += dt;
		}
		tok = samp_argmax(logits, info->vocab);
	}
	char arch[128], be_name[32], kv_name[8];
	snprintf(arch, sizeof arch, "%s", info->arch);
	snprintf(kv_name, sizeof kv_name, "%s", info->kv_dtype);
	snprintf(be_name, sizeof be_name, "%s", info->backend);
	uint64_t bpt = info->bytes_per_token, wbytes = info->weight_bytes;
	int64_t params = info->params;
	eng_close(e); /* frees its memory and threads before the bandwidth run */
	e = NULL;

	qsort(times, (size_t)ntok, sizeof *times, cmp_double);
	double tps = ntok / total;
	double weight_gbps = (double)bpt * tps / 1e9;

	/* The baseline is measured before and after the decode run and the higher figure kept:
	 * on a noisy machine that errs against wick, never for it. */
	if (bw_seconds > 0 && measure_bw(threads, bw_mib, bw_seconds, &bw_after, &nthreads))
		goto done;
	double read_gbps = bw_after > bw_before ? bw_after : bw_before;
	double ratio = read_gbps > 0 ? weight_gbps / read_gbps : 0.0;

	printf("model            %s (%s)\n", model, arch);
	printf("parameters       %.1f M, %.1f MB of weights\n", params / 1e6, wbytes / 1e6);
	printf("backend          %s, %d threads, %s KV cache\n", be_name, nthreads, kv_name);
	printf("tokens           %d timed (after %d warm-up)\n", ntok, warmup);
	printf("ms/token         mean %.3f  p50 %.3f  min %.3f  max %.3f\n", 1e3 * total / ntok,
	       1e3 * times[ntok / 2], 1e3 * times[0], 1e3 * times[ntok - 1]);
	printf("tokens/s         %.2f\n", tps);
	printf("bytes/token      %.1f MB\n", bpt / 1e6);
	printf("weight GB/s      %.2f\n", weight_gbps);
	if (bw_seconds > 0) {
		printf("read GB/s        %.2f (best of before %.2f / after %.2f; %d MiB, %d threads, "
		       "%.1f s each)\n", read_gbps, bw_before, bw_after, bw_mib, nthreads, bw_seconds);
		printf("ratio            %.3f of the measured read bandwidth\n", ratio);
	}
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:I, s:f, s:f, s:f}",
			      "bench", "decode", "model", model, "backend", be_name, "kv_dtype",
			      kv_name, "threads", nthreads,
			      "tokens", ntok, "tokens_per_s", tps, "ms_per_token",
			      1e3 * total / ntok, "bytes_per_token", (json_int_t)bpt,
			      "weight_gbps", weight_gbps, "read_gbps", read_gbps, "ratio", ratio);
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
	json_decref(j);
	if (!s) {
		fprintf(stderr, "wick bench: out of memory\n");
		goto done;
	}
	printf("%s\n", s);
	free(s);
	rc = 0;
done:
	eng_close(e);
	free(logits);
	free(times);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	if (argc < 2) {
		bench_usage(stderr);
		return 2;
	}
	const char *sub = argv[1];
	if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
		bench_usage(stdout);
		return 0;
	}
	if (!strcmp(sub, "decode"))
		return bench_decode(argc - 1, argv + 1);
	if (!strcmp(sub, "restore"))
		return bench_restore(argc - 1, argv + 1);
	if (!strcmp(sub, "queue"))
		return bench_queue(argc - 1, argv + 1);
	if (!strcmp(sub, "launches"))
		return bench_launches(argc - 1, argv + 1);
	if (!strcmp(sub, "speculate"))
		return bench_spec(argc - 1, argv + 1);
	if (!strcmp(sub, "picks"))
		return bench_picks(argc - 1, argv + 1);
	if (!strcmp(sub, "prefix"))
		return bench_prefix(argc - 1, argv + 1);
	if (!strcmp(sub, "prompt"))
		return bench_prompt(argc - 1, argv + 1);
	if (!strcmp(sub, "prepare"))
		return bench_prepare(argc - 1, argv + 1);
	if (!strcmp(sub, "http"))
		return bench_http(argc - 1, argv + 1);
	fprintf(stderr, "wick bench: unknown benchmark '%s'\n", sub);
	bench_usage(stderr);
	return 2;
}
