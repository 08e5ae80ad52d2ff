/*
 * gram_check - structured output's recognizer from the command line, for tests that hold it
 * to another implementation (tests/e2e/grammar_pattern.sh: Python's re and its validators).
 *
 *   gram_check SCHEMA_JSON < DOCS
 *
 * Compiles the schema (exit 2 with the message when it is refused), then reads one document a
 * line (the bytes as they are, without the newline) and prints a line for each: 1 when the
 * recognizer takes every byte and the document is whole, else 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/grammar.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gram_check SCHEMA_JSON < DOCS\n");
		return 2;
	}
	struct gram *g;
	char err[WK_ERRSZ];
	if (gram_compile(argv[1], strlen(argv[1]), &g, err, sizeof err) != WK_OK) {
		fprintf(stderr, "gram_check: %s\n", err);
		return 2;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, stdin)) >= 0) {
		if (n > 0 && line[n - 1] == '\n')
			n--;
		struct gram_state s;
		gram_start(g, &s);
		bool ok = gram_feed(g, &s, line, (size_t)n) && gram_complete(g, &s);
		printf("%d\n", ok);
	}
	free(line);
	gram_free(g);
	return 0;
}
