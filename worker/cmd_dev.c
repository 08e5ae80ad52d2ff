/*
 * cmd_dev.c - `wick dev`: an interactive session. It is `wick worker` with no queue, serving
 * the OpenAI API (worker/http_api.h) on 127.0.0.1:8000, ending itself after 10 idle minutes
 * and printing the session's bill. Every worker flag applies; the ones given win over these
 * defaults (getopt takes the last value of a flag).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cmd.h"

static const char *const defaults[] = {"--listen", "127.0.0.1:8000", "--idle-timeout", "600"};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick dev --model MODEL [--listen HOST:PORT] [--idle-timeout S] [options]\n\n"
		"Serves MODEL (a Hugging Face directory or a snapshot) through an OpenAI-compatible\n"
		"API: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (\"stream\":\n"
		"true for Server-Sent Events), Anthropic's POST /v1/messages, GET /v1/models, GET\n"
		"/health, GET /metrics, POST /tokenize and /detokenize. Requests are batched together.\n"
		"After --idle-timeout seconds without a request the session ends (exit 0) and prints\n"
		"its bill; SIGTERM drains. Defaults: --listen 127.0.0.1:8000 --idle-timeout 600.\n"
		"  --api-key KEY         require \"Authorization: Bearer KEY\" (or env WICK_API_KEY);\n"
		"                        a key is required to listen on a non-loopback address\n"
		"  --api-keys FILE       \"KEY TENANT\" lines: each key bills its tenant\n"
		"  --served-name NAME    the model id (default: the model directory's name)\n"
		"  --model-alias GLOB    other model names a request may give ('claude-*' for\n"
		"                        Claude Code's own; repeatable)\n"
		"  --responses-dir DIR   the Responses API's kept responses also as files there, so\n"
		"                        previous_response_id outlives the session; with\n"
		"                        --prefix-cache-dir on the same volume, the next session\n"
		"                        also has their turns' KV cache\n"
		"  --price-per-hour USD, --ledger PATH   what the bill uses (see wick worker --help)\n"
		"Every `wick worker` flag applies too (--concurrency, --max-connections,\n"
		"--http-timeout, --max-tokens-limit, --step-log, --queue ...): wick worker --help.\n");
}

int cmd_dev(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			break;
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
	}
	int nd = (int)(sizeof defaults / sizeof defaults[0]);
	char **args = calloc((size_t)(argc + nd + 1), sizeof *args);
	if (!args) {
		fprintf(stderr, "wick dev: out of memory\n");
		return 1;
	}
	args[0] = argv[0];
	for (int i = 0; i < nd; i++)
		args[1 + i] = (char *)defaults[i];
	for (int i = 1; i < argc; i++)
		args[nd + i] = argv[i];
	int rc = cmd_worker_as("wick dev", argc + nd, args);
	free(args);
	return rc;
}
