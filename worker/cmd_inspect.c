/*
 * cmd_inspect.c - `wick inspect MODEL`: validate a checkpoint and summarise it.
 *
 * MODEL is a Hugging Face directory (config.json + model.safetensors or a sharded index) or a
 * single .safetensors file. Opening validates every shard fully (coldstart/safetensors.c), so
 * inspect doubles as a checker: a malformed file is reported on stderr, naming the file and
 * tensor, with exit status 1.
 */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "coldstart/hfmodel.h"
#include "coldstart/snapshot.h"
#include "coldstart/safetensors.h"
#include "common/wk.h"
#include "worker/cmd.h"

/* config.json fields worth showing, when present at the top level. */
static const char *const fields[] = {
	"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
	"num_key_value_heads", "vocab_size", "max_position_embeddings", "n_routed_experts",
	"num_experts_per_tok", "torch_dtype",
};

struct summary {
	size_t tensors;
	uint64_t params;                  /* numel of all non-scale tensors */
	size_t scale_tensors;
	uint64_t scale_values;
	uint64_t bytes;
	size_t dt_tensors[DT_COUNT];
	uint64_t dt_bytes[DT_COUNT];
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick inspect [--json] [--tensors] MODEL\n"
		"\n"
		"Validates and summarises a model. MODEL is a Hugging Face directory (config.json\n"
		"plus model.safetensors or model.safetensors.index.json), a snapshot (its manifest,\n"
		"rank files' headers and copied files are checked; the chunks are not read) or one\n"
		".safetensors file. --model M or --snapshot M names it too.\n"
		"\n"
		"  --json       print the report as one JSON object\n"
		"  --tensors    also list every tensor (name, dtype, shape, file offset)\n"
		"  -h, --help   this text\n"
		"\n"
		"Exit status: 0 when every file is valid, 1 when one is not (the message names the\n"
		"file and tensor), 2 on a usage error.\n");
}

/* FP8 checkpoints carry per-block scales next to the weights; they are not parameters. */
static int is_scale(const char *name)
{
	static const char *const suffix[] = {"_scale_inv", ".weight_scale", ".input_scale"};
	size_t n = strlen(name);
	for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
		size_t k = strlen(suffix[i]);
		if (n >= k && !strcmp(name + n - k, suffix[i]))
			return 1;
	}
	return 0;
}

static void add(struct summary *s, const struct st_tensor *t)
{
	s->tensors++;
	if (is_scale(t->name)) {
		s->scale_tensors++;
		s->scale_values += (uint64_t)t->numel;
	} else {
		s->params += (uint64_t)t->numel;
	}
	s->bytes += t->nbytes;
	s->dt_tensors[t->dtype]++;
	s->dt_bytes[t->dtype] += t->nbytes;
}

/* 1234567 -> "1,234,567" */
static const char *commas(uint64_t v, char buf[32])
{
	char tmp[32];
	int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), o = 0;
	for (int i = 0; i < n; i++) {
		if (i && (n - i) % 3 == 0)
			buf[o++] = ',';
		buf[o++] = tmp[i];
	}
	buf[o] = 0;
	return buf;
}

static const char *human(uint64_t v, char buf[32])
{
	const char *u[] = {"", "K", "M", "G", "T", "P"};
	double d = (double)v;
	int i = 0;
	while (d >= 1000 && i < 5) {
		d /= 1000;
		i++;
	}
	snprintf(buf, 32, i ? "%.2f %s" : "%.0f%s", d, u[i]);
	return buf;
}

static json_t *shape_json(const struct st_tensor *t)
{
	json_t *a = json_array();
	for (int d = 0; a && d < t->rank; d++)
		json_array_append_new(a, json_integer(t->shape[d]));
	return a;
}

static void print_text(const char *model, json_t *cfg, const struct st_file *single,
		       size_t nshards, const struct summary *s)
{
	char b1[32], b2[32];
	printf("model         %s\n", model);
	if (cfg) {
		json_t *arch = json_array_get(json_object_get(cfg, "architectures"), 0);
		json_t *mt = json_object_get(cfg, "model_type");
		printf("architecture  %s (model_type %s)\n",
		       json_is_string(arch) ? json_string_value(arch) : "?",
		       json_is_string(mt) ? json_string_value(mt) : "?");
		for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
			json_t *v = json_object_get(cfg, fields[i]);
			if (json_is_integer(v))
				printf("  %-24s %lld\n", fields[i], (long long)json_integer_value(v));
			else if (json_is_string(v))
				printf("  %-24s %s\n", fields[i], json_string_value(v));
		}
		json_t *q = json_object_get(json_object_get(cfg, "quantization_config"),
					    "quant_method");
		if (json_is_string(q))
			printf("  %-24s %s\n", "quant_method", json_string_value(q));
		json_t *mtp = json_object_get(cfg, "num_nextn_predict_layers");
		if (json_is_integer(mtp) && json_integer_value(mtp) > 0)
			printf("  %-24s %lld (skipped at load: the engine does not run "
			       "multi-token prediction)\n", "mtp layers",
			       (long long)json_integer_value(mtp));
	}
	if (single) {
		/* A lone file has no config; its __metadata__ is what there is. */
		const char *fmt = st_meta(single, "format");
		if (fmt)
			printf("metadata      format=%s\n", fmt);
	}
	printf("shards        %zu\n", nshards);
	printf("tensors       %s\n", commas(s->tensors, b1));
	printf("parameters    %s (%s)\n", commas(s->params, b1), human(s->params, b2));
	if (s->scale_tensors)
		printf("scales        %s tensors, %s values (FP8 scales, not counted as parameters)"
		       "\n", commas(s->scale_tensors, b1), commas(s->scale_values, b2));
	printf("bytes         %s (%sB)\n", commas(s->bytes, b1), human(s->bytes, b2));
	for (int d = 0; d < DT_COUNT; d++)
		if (s->dt_tensors[d])
			printf("  %-8s %10zu tensors %20s bytes\n", dt_name((enum dt_type)d),
			       s->dt_tensors[d], commas(s->dt_bytes[d], b1));
}

static json_t *report_json(const char *model, json_t *cfg, size_t nshards,
			   const struct summary *s)
{
	json_t *r = json_object(), *dts = json_object();
	json_object_set_new(r, "model", json_string(model));
	if (cfg) {
		json_t *arch = json_array_get(json_object_get(cfg, "architectures"), 0);
		json_t *mt = json_object_get(cfg, "model_type");
		json_object_set(r, "architecture", json_is_string(arch) ? arch : json_null());
		json_object_set(r, "model_type", json_is_string(mt) ? mt : json_null());
		json_t *c = json_object();
		for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
			json_t *v = json_object_get(cfg, fields[i]);
			if (json_is_integer(v) || json_is_string(v))
				json_object_set(c, fields[i], v);
		}
		json_t *q = json_object_get(json_object_get(cfg, "quantization_config"),
					    "quant_method");
		if (json_is_string(q))
			json_object_set(c, "quant_method", q);
		json_object_set_new(r, "config", c);
	}
	json_object_set_new(r, "shards", json_integer((json_int_t)nshards));
	json_object_set_new(r, "tensors", json_integer((json_int_t)s->tensors));
	json_object_set_new(r, "parameters", json_integer((json_int_t)s->params));
	json_object_set_new(r, "scale_tensors", json_integer((json_int_t)s->scale_tensors));
	json_object_set_new(r, "scale_values", json_integer((json_int_t)s->scale_values));
	json_object_set_new(r, "bytes", json_integer((json_int_t)s->bytes));
	for (int d = 0; d < DT_COUNT; d++) {
		if (!s->dt_tensors[d])
			continue;
		json_t *o = json_object();
		json_object_set_new(o, "tensors", json_integer((json_int_t)s->dt_tensors[d]));
		json_object_set_new(o, "bytes", json_integer((json_int_t)s->dt_bytes[d]));
		json_object_set_new(dts, dt_name((enum dt_type)d), o);
	}
	json_object_set_new(r, "dtypes", dts);
	return r;
}

/* A snapshot: the manifest's summary (nothing is restored), then the same model summary. */
/* Whether rank's copy of a tensor of a sharded snapshot counts towards the model's parameters:
 * each piece once (a replicated tensor on rank 0, tp shard r on rank r < tp, ep rank r's
 * experts on rank r < ep; ranks past them hold repeats). */
static bool counts(const char *layout, int rank, int tp, int ep)
{
	if (layout && !strncmp(layout, "tp ", 3))
		return rank < tp;
	if (layout && !strncmp(layout, "expert", 6))
		return rank < ep;
	return rank == 0;
}

static int inspect_snapshot(const char *dir, bool as_json, bool list)
{
	char err[WK_ERRSZ], b1[32], b2[32];
	struct snap *sn;
	struct snap_open_opts o = {.manifest_only = true};
	if (snap_open(dir, &o, &sn, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick inspect: %s\n", err);
		return 1;
	}
	json_t *m = snap_manifest(sn);
	if (as_json) {
		json_t *r = json_deep_copy(m);
		json_t *ranks = json_object_get(r, "ranks");
		size_t i;
		json_t *rk;
		json_array_foreach(ranks, i, rk) {
			/* summarise: counts instead of the per-tensor and per-chunk lists */
			json_object_set_new(rk, "tensor_count",
					    json_integer((json_int_t)json_array_size(json_object_get(rk, "tensors"))));
			json_object_set_new(rk, "chunk_count",
					    json_integer((json_int_t)json_array_size(json_object_get(rk, "chunks"))));
			if (!list) /* --tensors: each rank's tensor table as the manifest has it */
				json_object_del(rk, "tensors");
			json_object_del(rk, "chunks");
		}
		json_dumpf(r, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(r);
		snap_close(sn);
		return 0;
	}
	printf("snapshot      %s (format %s version %lld)\n", dir,
	       json_string_value(json_object_get(m, "format")),
	       (long long)json_integer_value(json_object_get(m, "version")));
	printf("layout        world %d, tp %lld, ep %lld, dtype %s, compress %s, chunks of %s bytes\n",
	       snap_world(sn), (long long)json_integer_value(json_object_get(m, "tp")),
	       (long long)json_integer_value(json_object_get(m, "ep")),
	       json_string_value(json_object_get(m, "dtype")),
	       json_string_value(json_object_get(m, "compress")),
	       commas((uint64_t)json_integer_value(json_object_get(m, "chunk_size")), b1));
	json_t *src = json_object_get(m, "source");
	if (json_is_object(src))
		printf("source        %s (xxh3 %s)\n", json_string_value(json_object_get(src, "dir")),
		       json_string_value(json_object_get(src, "xxh3")));
	struct summary s = {0};
	size_t i;
	json_t *rk;
	int tp = (int)json_integer_value(json_object_get(m, "tp")),
	    ep = (int)json_integer_value(json_object_get(m, "ep"));
	tp = tp > 0 ? tp : 1;
	ep = ep > 0 ? ep : 1;
	json_array_foreach(json_object_get(m, "ranks"), i, rk) {
		size_t lz = 0, j;
		json_t *c;
		json_array_foreach(json_object_get(rk, "chunks"), j, c)
			lz += json_is_true(json_object_get(c, "lz4"));
		uint64_t disk = (uint64_t)json_integer_value(json_object_get(rk, "size"));
		uint64_t img = (uint64_t)json_integer_value(json_object_get(rk, "image_size"));
		printf("  %-12s %sB on disk, %sB restored, %zu tensors, %zu chunks (%zu lz4)\n",
		       json_string_value(json_object_get(rk, "file")), human(disk, b1), human(img, b2),
		       snap_tensor_count(sn, (int)i), json_array_size(json_object_get(rk, "chunks")), lz);
		for (size_t t = 0; t < snap_tensor_count(sn, (int)i); t++)
			if (counts(snap_tensor_layout(sn, (int)i, t), (int)i, tp, ep))
				add(&s, snap_tensor_at(sn, (int)i, t));
	}
	print_text(dir, snap_config(sn), NULL, (size_t)snap_world(sn), &s);
	if (snap_world(sn) > 1)
		printf("(a sharded snapshot: tensors, parameters and bytes count each piece once, "
		       "not the repeats on other ranks)\n");
	for (int r = 0; list && r < snap_world(sn); r++) {
		printf("\n%-8s %-60s %-8s %-24s %s\n", "rank", "tensor", "dtype", "shape", "layout");
		for (size_t t = 0; t < snap_tensor_count(sn, r); t++) {
			const struct st_tensor *x = snap_tensor_at(sn, r, t);
			const char *lay = snap_tensor_layout(sn, r, t);
			char sh[8 * 22 + 4];
			size_t o = 0;
			sh[o++] = '[';
			for (int d = 0; d < x->rank; d++)
				o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld", d ? ", " : "",
						      (long long)x->shape[d]);
			snprintf(sh + o, sizeof sh - o, "]");
			printf("%-8d %-60s %-8s %-24s %s\n", r, x->name, dt_name(x->dtype), sh,
			       lay ? lay : "-");
		}
	}
	snap_close(sn);
	return 0;
}

int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"tensors", no_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		CMD_MODEL_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	int as_json = 0, list = 0, c;
	const char *given = NULL;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': as_json = 1; break;
		case 't': list = 1; break;
		case 'M': given = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	const char *model = cmd_one_model(given, argc, argv, optind);
	if (!model) {
		usage(stderr);
		return 2;
	}
	char err[WK_ERRSZ];
	struct hf_model *hf = NULL;
	struct st_file *st = NULL;
	struct stat sb;
	int rc;
	if (stat(model, &sb) != 0) {
		fprintf(stderr, "wick inspect: %s: no such file or directory\n", model);
		return 1;
	}
	if (S_ISDIR(sb.st_mode) && snap_is_snapshot(model))
		return inspect_snapshot(model, as_json, list);
	if (S_ISDIR(sb.st_mode))
		rc = hf_open(model, &hf, err, sizeof err);
	else
		rc = st_open(model, &st, err, sizeof err);
	if (rc) {
		fprintf(stderr, "wick inspect: %s\n", err);
		return 1;
	}

	size_t n = hf ? hf_tensor_count(hf) : st_count(st);
	size_t nshards = hf ? hf_shard_count(hf) : 1;
	json_t *cfg = hf ? hf_config(hf) : NULL;
	struct summary s = {0};
	for (size_t i = 0; i < n; i++)
		add(&s, hf ? hf_tensor_at(hf, i) : st_at(st, i));

	if (as_json) {
		json_t *r = report_json(model, cfg, nshards, &s);
		if (list) {
			json_t *a = json_array();
			for (size_t i = 0; i < n; i++) {
				const struct st_tensor *t = hf ? hf_tensor_at(hf, i) : st_at(st, i);
				json_t *o = json_object();
				json_object_set_new(o, "name", json_string(t->name));
				json_object_set_new(o, "dtype", json_string(dt_name(t->dtype)));
				json_object_set_new(o, "shape", shape_json(t));
				json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
				json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
				json_array_append_new(a, o);
			}
			json_object_set_new(r, "tensor_list", a);
		}
		json_dumpf(r, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(r);
	} else {
		print_text(model, cfg, st, nshards, &s);
		if (list) {
			printf("\n%-60s %-8s %-24s %14s\n", "tensor", "dtype", "shape", "offset");
			for (size_t i = 0; i < n; i++) {
				const struct st_tensor *t = hf ? hf_tensor_at(hf, i) : st_at(st, i);
				char sh[8 * 22 + 4];
				size_t o = 0;
				sh[o++] = '[';
				for (int d = 0; d < t->rank; d++)
					o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld",
							      d ? ", " : "", (long long)t->shape[d]);
				snprintf(sh + o, sizeof sh - o, "]");
				printf("%-60s %-8s %-24s %14" PRIu64 "\n", t->name,
				       dt_name(t->dtype), sh, t->offset);
			}
		}
	}
	hf_close(hf);
	st_close(st);
	return 0;
}
