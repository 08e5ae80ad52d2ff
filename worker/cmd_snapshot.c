/*
 * cmd_snapshot.c - `wick snapshot HF_DIR -o SNAP`: prepare the weight layout once, offline.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/engine.h"
#include "worker/cmd.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick snapshot HF_DIR -o SNAP [--tp N] [--ep N] [--dtype keep|fp8|bf16|f32]\n"
		"                     [--compress lz4] [--chunk-mib N] [--mtp]\n\n"
		"Writes a snapshot: each rank's tensors in the layout its kernels read, 4 KiB\n"
		"aligned, with an xxh3 checksum per chunk, so that start-up only streams bytes.\n"
		"  --tp N, --ep N     tensor / expert parallel degree; world = max(tp, ep), the smaller\n"
		"                     divides it (rules: engine/layout.c)\n"
		"  --dtype D          keep (default), bf16 or f32: cast the bf16, f16 and f32 weight\n"
		"                     matrices (FP8 ones stay FP8 with their block scales: nothing\n"
		"                     widens them); fp8: decoder-layer projections to float8_e4m3fn\n"
		"                     with 128x128 block scales (the GLM-5-FP8 convention)\n"
		"  --compress lz4     compress chunks where that saves at least 10%%\n"
		"  --chunk-mib N      chunk size in MiB (default 16)\n"
		"  --mtp              keep the model's MTP layer, so that a worker can draft with it\n"
		"                     (wick worker --speculate; without it the snapshot leaves the\n"
		"                     layer out and the worker drafts by lookup)\n");
}

int cmd_snapshot(int argc, char **argv)
{
	enum { O_TP = 256, O_EP, O_DTYPE, O_COMPRESS, O_CHUNK, O_MTP };
	static const struct option opts[] = {
		{"output", required_argument, 0, 'o'}, {"tp", required_argument, 0, O_TP},
		{"ep", required_argument, 0, O_EP}, {"dtype", required_argument, 0, O_DTYPE},
		{"compress", required_argument, 0, O_COMPRESS},
		{"chunk-mib", required_argument, 0, O_CHUNK}, {"help", no_argument, 0, 'h'},
		{"mtp", no_argument, 0, O_MTP},
		{0, 0, 0, 0}};
	struct eng_snap_opts o = {.tp = 1, .ep = 1, .dtype = "keep"};
	const char *out = NULL;
	int c;
	char *end;
	long v;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case O_TP:
		case O_EP:
		case O_CHUNK:
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (end == optarg || *end || v < 1) {
				fprintf(stderr, "wick snapshot: %s wants a positive count, not '%s'\n",
					c == O_TP ? "--tp" : c == O_EP ? "--ep" : "--chunk-mib", optarg);
				return 2;
			}
			if (c != O_CHUNK && (errno || v > 64)) {
				fprintf(stderr, "wick snapshot: %s %s: at most 64 ranks\n",
					c == O_TP ? "--tp" : "--ep", optarg);
				return 2;
			}
			if (c == O_CHUNK && (errno || v > (long)(SNAP_MAX_CHUNK >> 20))) {
				fprintf(stderr, "wick snapshot: --chunk-mib %s: chunks are 1 to %u MiB\n",
					optarg, SNAP_MAX_CHUNK >> 20);
				return 2;
			}
			if (c == O_TP)
				o.tp = (int)v;
			else if (c == O_EP)
				o.ep = (int)v;
			else
				o.chunk_size = (size_t)v << 20;
			break;
		case O_DTYPE:
			if (strcmp(optarg, "keep") && strcmp(optarg, "fp8") && strcmp(optarg, "bf16") &&
			    strcmp(optarg, "f32")) {
				fprintf(stderr, "wick snapshot: --dtype takes keep, fp8, bf16 or f32, not "
						"'%s'\n", optarg);
				return 2;
			}
			o.dtype = optarg;
			break;
		case O_COMPRESS:
			if (strcmp(optarg, "lz4") && strcmp(optarg, "none")) {
				fprintf(stderr, "wick snapshot: --compress takes lz4 or none\n");
				return 2;
			}
			o.lz4 = !strcmp(optarg, "lz4");
			break;
		case O_MTP: o.mtp = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (argc - optind != 1 || !out) {
		fprintf(stderr, "wick snapshot: %s\n", !out ? "-o SNAP (where to write) is required"
				: argc - optind ? "one HF_DIR, please" : "no HF_DIR given");
		usage(stderr);
		return 2;
	}
	char err[WK_ERRSZ];
	double t0 = wk_now();
	struct eng_snap_report rep = {0};
	o.report = &rep;
	if (eng_snapshot(argv[optind], out, &o, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick snapshot: %s\n", err);
		return 1;
	}
	if (rep.unused_tensors)
		fprintf(stderr, "wick snapshot: warning: %d tensor%s of the checkpoint %s not used "
			"by the model, e.g. '%s': does config.json match the weights?\n",
			rep.unused_tensors, rep.unused_tensors == 1 ? "" : "s",
			rep.unused_tensors == 1 ? "is" : "are", rep.unused_example);
	fprintf(stderr, "wick snapshot: wrote %s in %.2f s\n", out, wk_now() - t0);
	return 0;
}
