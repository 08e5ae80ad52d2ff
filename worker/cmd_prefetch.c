/*
 * cmd_prefetch.c - `wick prefetch SNAP`: warm the page cache with a snapshot's files, so that a
 * worker started afterwards restores from memory. Meant for a platform's pre-warm hook or an
 * init container. Prints one summary line; exit status 0, 1 on a failure, 2 on a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "worker/cmd.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick prefetch [--threads N] SNAP\n"
		"\n"
		"Reads every file of the snapshot SNAP (manifest, rank files, copied files) so that\n"
		"they are in the page cache when a worker starts. The manifest is validated first.\n"
		"Chunk checksums are not checked here; the restore checks them.\n"
		"\n"
		"  -j, --threads N   reader threads (default 4, at most 64)\n"
		"  -h, --help        this text\n"
		"\n"
		"Pieces already in the page cache are skipped. Prints one line: the snapshot's\n"
		"size, the bytes read, seconds and GB/s of those reads.\n"
		"\n"
		"Exit status: 0 on success, 1 when the snapshot is missing, invalid or\n"
		"unreadable, 2 on a usage error.\n");
}

int cmd_prefetch(int argc, char **argv)
{
	static const struct option opts[] = {
		{"threads", required_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		CMD_MODEL_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	int threads = 4, c;
	const char *given = NULL;
	optind = 1;
	while ((c = getopt_long(argc, argv, "j:h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': {
			char *end;
			errno = 0;
			long v = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || v < 1 || v > 64) {
				fprintf(stderr, "wick prefetch: --threads wants 1..64, not '%s'\n",
					optarg);
				return 2;
			}
			threads = (int)v;
			break;
		}
		case 'M':
			given = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	const char *dir = cmd_one_model(given, argc, argv, optind);
	if (!dir) {
		usage(stderr);
		return 2;
	}
	char err[WK_ERRSZ];
	struct snap_prefetch_stats st;
	double t0 = wk_now();
	int rc = snap_prefetch_stats(dir, threads, &st, err, sizeof err);
	double dt = wk_now() - t0;
	if (rc) {
		fprintf(stderr, "wick prefetch: %s\n", err);
		return 1;
	}
	printf("prefetch %s: %.3f GB in %zu files, %.3f GB read (the rest was cached) in %.3f s, "
	       "%.2f GB/s (%d threads)\n", dir, (double)st.bytes / 1e9, st.files,
	       (double)st.bytes_read / 1e9, dt, dt > 0 ? (double)st.bytes_read / 1e9 / dt : 0.0,
	       threads);
	return 0;
}
