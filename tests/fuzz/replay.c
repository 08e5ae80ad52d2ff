/* replay.c - runs files (or every file in directories) through a fuzz target, for `make test`.
 * Prints "replayed N inputs" and exits 0; a crash or abort is the failure. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"

static int one(const char *path, long *count)
{
	char *buf;
	size_t len;
	char err[WK_ERRSZ];
	if (wk_read_file(path, 16u << 20, &buf, &len, err, sizeof err) != WK_OK) {
		fprintf(stderr, "replay: %s\n", err);
		return 1;
	}
	LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
	free(buf);
	(*count)++;
	return 0;
}

int main(int argc, char **argv)
{
	long count = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (one(argv[i], &count))
				return 1;
			continue;
		}
		DIR *d = opendir(argv[i]);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char p[4096];
			snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
			if (one(p, &count))
				return 1;
		}
		if (d)
			closedir(d);
	}
	printf("replayed %ld inputs\n", count);
	return 0;
}
