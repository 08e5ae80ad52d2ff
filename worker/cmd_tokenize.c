/*
 * cmd_tokenize.c - wick tokenize: encode text to ids, or decode ids to text, with a
 * tokenizer.json. Prints JSON on stdout; errors go to stderr (exit 1, usage errors exit 2).
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"

static const char usage_text[] =
	"usage: wick tokenize MODEL_OR_TOKENIZER_JSON (--text TEXT | --file F | --decode IDS |\n"
	"                     --jsonl F | --chat F | --prepare OUT) [--special]\n"
	"\n"
	"Encodes text with a Hugging Face tokenizer.json and prints {\"ids\": [...]}, or decodes\n"
	"ids and prints {\"text\": \"...\"}. MODEL may be a model directory or snapshot (its\n"
	"tokenizer.prepared where that was made from its tokenizer.json, else its tokenizer.json),\n"
	"the tokenizer.json file itself, or a prepared tokenizer file.\n"
	"\n"
	"  --text TEXT   encode TEXT\n"
	"  --file F      encode the bytes of file F (\"-\": stdin)\n"
	"  --decode IDS  decode comma-separated ids, e.g. 1,15043,3186\n"
	"  --jsonl F     batch mode: each line of F (\"-\": stdin) is either a JSON string, answered\n"
	"                with one {\"ids\": [...]} line, or a JSON array of ids, answered with one\n"
	"                {\"text\": \"...\"} line; blank lines are skipped\n"
	"  --chat F      render the chat messages in JSON file F (\"-\": stdin; a list of\n"
	"                {\"role\", \"content\"}, or {\"messages\": [...], \"tools\": [...]}\n"
	"                with OpenAI's tools and an assistant's tool_calls) with the model's\n"
	"                chat template, encode the result and print {\"text\": \"...\",\n"
	"                \"ids\": [...]}\n"
	"  --chat-format NAME   glm, glm45 or plain (default: from the model directory's chat\n"
	"                template or config.json, see engine/chat.h)\n"
	"  --no-think    --chat: GLM's thinking-off markers\n"
	"  --no-generation-prompt   --chat: end after the last message\n"
	"  --prepare OUT write the tokenizer.json's prepared form (the binary tables a snapshot's\n"
	"                tokenizer.prepared holds, read without parsing JSON) to OUT\n"
	"  --special     encoding: add the post-processor's special tokens (BOS for Llama);\n"
	"                decoding: keep special tokens in the text (dropped otherwise)\n"
	"  -h, --help    print this help\n"
	"\n"
	"Decoded text is what Hugging Face's decode returns: byte-fallback tokens that do not\n"
	"form valid UTF-8 print as U+FFFD.\n";

static void print_ids(const int *ids, int n)
{
	fputs("{\"ids\": [", stdout);
	for (int i = 0; i < n; i++)
		printf(i ? ", %d" : "%d", ids[i]);
	fputs("]}\n", stdout);
}

/* Prints {"text": ...}; text is valid UTF-8 (tok_decode_utf8). */
static int print_text(const char *text, size_t len)
{
	json_t *o = json_pack("{s:s%}", "text", text, len);
	char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;
	json_decref(o);
	if (!s) {
		fprintf(stderr, "wick tokenize: could not format the decoded text as JSON\n");
		return 1;
	}
	puts(s);
	free(s);
	return 0;
}

static int encode(const struct tok *t, const char *text, size_t len, bool special)
{
	char err[WK_ERRSZ];
	int *ids, n;
	if (tok_encode(t, text, len, special, &ids, &n, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick tokenize: %s\n", err);
		return 1;
	}
	print_ids(ids, n);
	free(ids);
	return 0;
}

static int decode(const struct tok *t, const int *ids, int n, bool special)
{
	char err[WK_ERRSZ], *text;
	size_t len;
	if (tok_decode_utf8(t, ids, n, !special, &text, &len, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick tokenize: %s\n", err);
		return 1;
	}
	int rc = print_text(text, len);
	free(text);
	return rc;
}

/* Reads all of path ("-": stdin), at most TOK_MAX_TEXT bytes. */
static int read_input(const char *path, char **buf, size_t *len)
{
	char err[WK_ERRSZ];
	if (strcmp(path, "-")) {
		if (wk_read_file(path, TOK_MAX_TEXT, buf, len, err, sizeof err) == WK_OK)
			return 0;
		fprintf(stderr, "wick tokenize: %s\n", err);
		return 1;
	}
	size_t cap = 1 << 16, n = 0;
	char *p = malloc(cap + 1);
	for (;;) {
		if (!p) {
			fprintf(stderr, "wick tokenize: out of memory reading stdin\n");
			return 1;
		}
		n += fread(p + n, 1, cap - n, stdin);
		if (n < cap)
			break;
		if (cap > TOK_MAX_TEXT) {
			free(p);
			fprintf(stderr, "wick tokenize: stdin: more than %u bytes\n", TOK_MAX_TEXT);
			return 1;
		}
		char *q = realloc(p, 2 * cap + 1);
		if (!q)
			free(p);
		p = q;
		cap *= 2;
	}
	if (ferror(stdin)) {
		free(p);
		fprintf(stderr, "wick tokenize: error reading stdin\n");
		return 1;
	}
	p[n] = 0;
	*buf = p;
	*len = n;
	return 0;
}

/* One --jsonl line: a JSON string to encode, or an array of ids to decode. */
static int jsonl_line(const struct tok *t, const char *path, size_t lineno, const char *line,
		      size_t len, bool special)
{
	json_error_t jerr;
	json_t *v = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	int rc = 1;
	if (json_is_string(v)) {
		rc = encode(t, json_string_value(v), json_string_length(v), special);
	} else if (json_is_array(v)) {
		size_t n = json_array_size(v), i;
		int *ids = malloc((n ? n : 1) * sizeof *ids);
		json_t *x;
		bool ok = ids && n <= (size_t)TOK_MAX_TEXT;
		json_array_foreach(v, i, x) {
			if (!ok)
				break;
			ok = json_is_integer(x) && json_integer_value(x) >= 0 &&
			     json_integer_value(x) <= 0x7fffffff;
			if (ok)
				ids[i] = (int)json_integer_value(x);
		}
		if (ok)
			rc = decode(t, ids, (int)n, special);
		else
			fprintf(stderr, "wick tokenize: %s:%zu: expected an array of token ids\n",
				path, lineno);
		free(ids);
	} else if (!v) {
		fprintf(stderr, "wick tokenize: %s:%zu: %s\n", path, lineno, jerr.text);
	} else {
		fprintf(stderr, "wick tokenize: %s:%zu: expected a JSON string or an array of ids\n",
			path, lineno);
	}
	json_decref(v);
	return rc;
}

struct chat_opts {
	const char *file, *format, *model_dir;
	bool think, gen;
};

/* --chat: messages -> template text -> ids, printed as {"text": ..., "ids": [...]}. */
static int run_chat(const struct tok *t, const struct chat_opts *c, bool special)
{
	char err[WK_ERRSZ], *buf, *text = NULL;
	size_t len, tlen;
	enum chat_format f = CHAT_PLAIN;
	int rc = WK_OK;
	if (c->format)
		rc = chat_format_parse(c->format, &f, err, sizeof err);
	else if (c->model_dir)
		rc = chat_format_for_model(c->model_dir, &f, err, sizeof err);
	if (rc != WK_OK) {
		fprintf(stderr, "wick tokenize: %s\n", err);
		return 1;
	}
	if (read_input(c->file, &buf, &len))
		return 1;
	struct chat_msg *m;
	size_t n, tools_len;
	char *tools;
	rc = chat_parse_json_tools(buf, len, &m, &n, &tools, &tools_len, err, sizeof err);
	free(buf);
	if (rc == WK_OK) {
		rc = chat_render_tools(f, m, n, tools, tools_len, c->gen, c->think, &text, &tlen, err,
				       sizeof err);
		free(m);
		free(tools);
	}
	int *ids = NULL, nids = 0;
	if (rc == WK_OK)
		rc = tok_encode(t, text, tlen, special, &ids, &nids, err, sizeof err);
	if (rc != WK_OK) {
		fprintf(stderr, "wick tokenize: --chat %s: %s\n", c->file, err);
		free(text);
		return 1;
	}
	json_t *o = json_pack("{s:s%,s:[]}", "text", text, tlen, "ids");
	for (int i = 0; o && i < nids; i++)
		json_array_append_new(json_object_get(o, "ids"), json_integer(ids[i]));
	char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;
	json_decref(o);
	free(text);
	free(ids);
	if (!s) {
		fprintf(stderr, "wick tokenize: could not format the result as JSON\n");
		return 1;
	}
	puts(s);
	free(s);
	return 0;
}

static int run_jsonl(const struct tok *t, const char *path, bool special)
{
	char *buf;
	size_t len;
	if (read_input(path, &buf, &len))
		return 1;
	int rc = 0;
	size_t lineno = 0;
	for (char *p = buf, *end = buf + len; p < end && rc == 0;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		lineno++;
		size_t k = 0;
		while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r'))
			k++;
		if (k < n)
			rc = jsonl_line(t, path, lineno, p, n, special);
		p += n + 1;
	}
	free(buf);
	return rc;
}

/* --prepare: the prepared form of the tokenizer.json at path, written to out. */
static int write_prepared(const char *path, const char *out)
{
	char err[WK_ERRSZ], *json = NULL, *buf = NULL;
	size_t jlen, len;
	int rc = wk_read_file(path, TOK_MAX_FILE, &json, &jlen, err, sizeof err);
	if (rc == WK_OK)
		rc = tok_prepare_json(path, json, jlen, &buf, &len, err, sizeof err);
	if (rc == WK_OK)
		rc = wk_write_file(out, buf, len, err, sizeof err);
	if (rc != WK_OK)
		fprintf(stderr, "wick tokenize: %s\n", err);
	free(json);
	free(buf);
	return rc == WK_OK ? 0 : 1;
}

int cmd_tokenize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"text", required_argument, NULL, 't'},  {"file", required_argument, NULL, 'f'},
		{"decode", required_argument, NULL, 'd'}, {"jsonl", required_argument, NULL, 'j'},
		{"special", no_argument, NULL, 's'},     {"help", no_argument, NULL, 'h'},
		{"chat", required_argument, NULL, 'c'}, {"chat-format", required_argument, NULL, 'F'},
		{"no-think", no_argument, NULL, 'T'},
		{"no-generation-prompt", no_argument, NULL, 'G'},
		{"prepare", required_argument, NULL, 'P'},
		CMD_MODEL_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	const char *given = NULL;
	const char *text = NULL, *file = NULL, *dec = NULL, *jsonl = NULL, *prep = NULL;
	struct chat_opts chat = {.think = true, .gen = true};
	bool special = false;
	int modes = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 't': text = optarg; modes++; break;
		case 'f': file = optarg; modes++; break;
		case 'd': dec = optarg; modes++; break;
		case 'j': jsonl = optarg; modes++; break;
		case 's': special = true; break;
		case 'c': chat.file = optarg; modes++; break;
		case 'F': chat.format = optarg; break;
		case 'T': chat.think = false; break;
		case 'G': chat.gen = false; break;
		case 'M': given = optarg; break;
		case 'P': prep = optarg; modes++; break;
		case 'h': fputs(usage_text, stdout); return 0;
		default: fputs(usage_text, stderr); return 2;
		}
	}
	const char *model = cmd_one_model(given, argc, argv, optind);
	if (!model || modes != 1) {
		if (model)
			fprintf(stderr, "wick tokenize: give exactly one of --text, --file, --decode, "
					"--jsonl, --chat, --prepare\n");
		fputs(usage_text, stderr);
		return 2;
	}
	char path[4096], err[WK_ERRSZ], dir[4096];
	struct stat st;
	bool is_dir = stat(model, &st) == 0 && S_ISDIR(st.st_mode);
	if (is_dir) {
		if (snprintf(path, sizeof path, "%s/tokenizer.json", model) >= (int)sizeof path) {
			fprintf(stderr, "wick tokenize: %s: path too long\n", model);
			return 1;
		}
		snprintf(dir, sizeof dir, "%s", model);
	} else {
		snprintf(path, sizeof path, "%s", model);
		/* a tokenizer.json: its directory may hold the model's config and template */
		snprintf(dir, sizeof dir, "%s", model);
		char *slash = strrchr(dir, '/');
		if (slash)
			*slash = 0;
		else
			snprintf(dir, sizeof dir, ".");
	}
	chat.model_dir = dir;
	int *ids = NULL, n = 0;
	if (dec && cmd_parse_ids(dec, &ids, &n) != 0)
		return 2;
	if (prep)
		return write_prepared(path, prep);
	struct tok *t;
	bool from_prep;
	if ((is_dir ? tok_load_dir(model, &t, &from_prep, err, sizeof err)
		    : tok_load_any(path, &t, err, sizeof err)) != WK_OK) {
		fprintf(stderr, "wick tokenize: %s\n", err);
		free(ids);
		return 1;
	}
	int rc;
	if (text) {
		rc = encode(t, text, strlen(text), special);
	} else if (file) {
		char *buf;
		size_t len;
		rc = read_input(file, &buf, &len);
		if (rc == 0) {
			rc = encode(t, buf, len, special);
			free(buf);
		}
	} else if (dec) {
		rc = decode(t, ids, n, special);
	} else if (chat.file) {
		rc = run_chat(t, &chat, special);
	} else {
		rc = run_jsonl(t, jsonl, special);
	}
	free(ids);
	tok_free(t);
	if (fflush(stdout) != 0 && rc == 0) {
		fprintf(stderr, "wick tokenize: error writing the output\n");
		rc = 1;
	}
	return rc;
}
