/*
 * main.c - the wick binary: dispatches to a subcommand. The only place that exits.
 */
#include <stdio.h>
#include <string.h>

#include "worker/cmd.h"

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *usage;
} cmds[] = {
	{"convert", cmd_convert, "convert llama2c MODEL.bin TOKENIZER.bin -o HF_DIR"},
	{"snapshot", cmd_snapshot, "snapshot HF_DIR -o SNAP [--tp N] [--ep N] [--dtype D] [--compress lz4]"},
	{"inspect", cmd_inspect, "inspect MODEL"},
	{"prefetch", cmd_prefetch, "prefetch SNAP [--threads N]"},
	{"tokenize", cmd_tokenize, "tokenize MODEL_OR_TOKENIZER_JSON (--text T | --file F | --decode IDS)"},
	{"generate", cmd_generate, "generate MODEL [-p TEXT | --tokens IDS] [-n N] [--temperature T] ..."},
	{"logits", cmd_logits, "logits MODEL --tokens 1,2,3 [--all-positions]"},
	{"worker", cmd_worker, "worker --model MODEL (--queue URL | --listen HOST:PORT) [--concurrency N] ..."},
	{"dev", cmd_dev, "dev --model MODEL [--listen 127.0.0.1:8000] [--idle-timeout S] [--api-key KEY]"},
	{"submit", cmd_submit, "submit --queue URL [--wait] (-p TEXT | --file JOB.json | --stdin) | --cancel ID"},
	{"usage", cmd_usage, "usage LEDGER... [--by request|tenant|worker|day] [--format table|json|csv] | --quote SECONDS"},
	{"bench", cmd_bench, "bench (decode | restore | queue | launches) MODEL [options]"},
	{"plan", cmd_plan, "plan --config CONFIG_JSON [--tp N] [--ep N] [--gpus N] [--gpu-mem SIZE] [--context N] ..."},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: wick COMMAND [ARGS]   (wick COMMAND --help for details)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		fprintf(f, "  wick %s\n", cmds[i].usage);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "wick: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
