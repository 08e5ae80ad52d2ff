/* Fuzz target: the snapshot manifest validator. The bytes become SNAP/manifest.json of a
 * temporary directory (with no rank files), which snap_open reads with manifest_only: any
 * input must be refused with a message or accepted, never crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "tests/fuzz/fuzz.h"

static char dir[64];

static void cleanup(void)
{
	char path[128];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	unlink(path);
	rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/wick-fuzz-snap-XXXXXX");
		if (!mkdtemp(dir))
			abort();
		atexit(cleanup);
	}
	char path[128], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	FILE *f = fopen(path, "wb");
	if (!f)
		abort();
	fwrite(data, 1, size, f);
	fclose(f);
	struct snap *s;
	struct snap_open_opts o = {.manifest_only = true};
	if (snap_open(dir, &o, &s, err, sizeof err) == WK_OK)
		snap_close(s); /* possible only when the manifest lists no rank files */
	else if (!err[0])
		abort();
	return 0;
}
