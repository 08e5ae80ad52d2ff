#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/wk.h"
#include "engine/convert.h"
#include "worker/cmd.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: wick convert llama2c MODEL.bin TOKENIZER.bin -o HF_DIR\n\n"
		   "Converts a llama2.c checkpoint and tokenizer into a Hugging Face Llama directory\n"
		   "(config.json, model.safetensors, tokenizer.json) that transformers' "
		   "LlamaForCausalLM\nand the tokenizers library load unchanged.\n");
}

int cmd_convert(int argc, char **argv)
{
	static const struct option opts[] = {{"output", required_argument, 0, 'o'},
					     {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	const char *out = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (argc - optind != 3 || !out) {
		fprintf(stderr, "wick convert: %s\n", !out ? "-o OUT_DIR is required"
				: "want FORMAT CHECKPOINT TOKENIZER (llama2c model.bin tokenizer.bin)");
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[optind], "llama2c") != 0) {
		fprintf(stderr, "wick convert: unknown source format '%s' (supported: llama2c)\n",
			argv[optind]);
		return 2;
	}
	char err[WK_ERRSZ];
	if (conv_llama2c(argv[optind + 1], argv[optind + 2], out, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick convert: %s\n", err);
		return 1;
	}
	fprintf(stderr, "wick convert: wrote %s\n", out);
	return 0;
}
