#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/cmd.h"

int cmd_parse_ids(const char *s, int **ids, int *n)
{
	size_t cap = 16, cnt = 0;
	int *v = malloc(cap * sizeof *v);
	if (!v)
		return -1;
	const char *p = s;
	while (*p) {
		char *end;
		errno = 0;
		long x = strtol(p, &end, 10);
		if (end == p || errno || x < 0 || x > INT_MAX || (*end && *end != ',')) {
			fprintf(stderr, "wick: bad token id list '%s': expected comma-separated "
					"non-negative integers\n", s);
			free(v);
			return -1;
		}
		if (cnt == cap) {
			int *nv = realloc(v, 2 * cap * sizeof *v);
			if (!nv) {
				free(v);
				return -1;
			}
			v = nv;
			cap *= 2;
		}
		v[cnt++] = (int)x;
		p = *end ? end + 1 : end;
	}
	if (cnt == 0) {
		fprintf(stderr, "wick: empty token id list\n");
		free(v);
		return -1;
	}
	*ids = v;
	*n = (int)cnt;
	return 0;
}
