#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/cmd.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double cmd_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int count(const char *arg, const char *flag, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(arg, &end, 10);
	if (end == arg || *end || v < lo || v > hi) {
		fprintf(stderr, "wick: %s wants a number from %d to %d, not '%s'\n", flag, lo, hi, arg);
		return 2;
	}
	*out = (int)v;
	return 0;
}

int cmd_engine_flag(struct cmd_engine *ce, int c, const char *arg)
{
	switch (c - CMD_OPT_BASE) {
	case 0:
		if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda") &&
		    strcmp(arg, "null")) {
			fprintf(stderr, "wick: --backend wants auto, cpu, cuda or null, not '%s'\n",
				arg);
			return 2;
		}
		ce->o.backend = arg;
		return 0;
	case 1: return count(arg, "--threads", 1, 1024, &ce->o.threads);
	case 2: ce->o.no_verify = true; return 0;
	case 3: return count(arg, "--tp", 1, 1024, &ce->o.tp);
	case 4: return count(arg, "--ep", 1, 1024, &ce->o.ep);
	case 5: ce->o.source = arg; return 0;
	case 6: ce->verbose = true; return 0;
	case 7: ce->model = arg; return 0;
	case 8: ce->o.fp8_act = true; return 0;
	case 9: return count(arg, "--max-seq", 2, 1 << 24, &ce->o.max_seq);
	case 10:
		if (strcmp(arg, "auto") && strcmp(arg, "f32") && strcmp(arg, "bf16") &&
		    strcmp(arg, "fp8")) {
			fprintf(stderr, "wick: --kv-dtype wants bf16, f32, fp8 or auto, not '%s'\n",
				arg);
			return 2;
		}
		ce->o.kv_dtype = arg;
		return 0;
	}
	return 2;
}

const char *cmd_one_model(const char *given, int argc, char **argv, int optind_)
{
	struct cmd_engine ce = {.model = given};
	return cmd_engine_model(&ce, argc, argv, optind_, 0) ? NULL : ce.model;
}

int cmd_engine_model(struct cmd_engine *ce, int argc, char **argv, int optind_, int want)
{
	int left = argc - optind_;
	if (!ce->model && left > 0) {
		ce->model = argv[optind_];
		left--;
	}
	if (!ce->model) {
		fprintf(stderr, "wick: no MODEL given\n");
		return 2;
	}
	if (left != want) {
		fprintf(stderr, "wick: unexpected argument '%s'\n", argv[argc - left]);
		return 2;
	}
	return 0;
}

int cmd_engine_open(struct cmd_engine *ce, struct engine **e)
{
	char err[WK_ERRSZ];
	if (eng_open(ce->model, &ce->o, e, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick: %s\n", err);
		return 1;
	}
	const struct eng_info *in = eng_info(*e);
	if (in->unused_tensors)
		fprintf(stderr, "wick: warning: %d tensor%s of the checkpoint %s not used by the "
			"model, e.g. '%s': does config.json match the weights?\n", in->unused_tensors,
			in->unused_tensors == 1 ? "" : "s", in->unused_tensors == 1 ? "is" : "are",
			in->unused_example);
	const struct eng_startup *s = &in->startup;
	if (s->snapshot)
		fprintf(stderr, "wick: restored %.1f MB%s in %.1f ms (%.2f GB/s)%s; ready in %.1f ms\n",
			s->bytes / 1e6, s->to_device ? " into device memory" : "", s->weights_s * 1e3,
			s->weights_s > 0 ? s->bytes / s->weights_s / 1e9 : 0.0,
			ce->o.no_verify ? ", checksums skipped" : ", checksums verified",
			s->total_s * 1e3);
	if (ce->verbose)
		fprintf(stderr,
			"{\"startup\": {\"model\": \"%s\", \"snapshot\": %s, \"weights_s\": %.6f, "
			"\"read_s\": %.6f, \"verify_s\": %.6f, \"tokenizer_s\": %.6f, "
			"\"tokenizer_prepared\": %s, "
			"\"init_s\": %.6f, \"total_s\": %.6f, "
			"\"bytes\": %llu, \"to_device\": %s, \"ranks_s\": %.6f, \"comm_s\": %.6f, "
			"\"comm_wait_s\": %.6f, \"ready_mono\": %.6f, "
			"\"kv_dtype\": \"%s\", \"max_seq\": %d, \"max_seqs\": %d}}\n",
			ce->model, s->snapshot ? "true" : "false", s->weights_s, s->read_s, s->verify_s,
			s->tokenizer_s, s->tokenizer_prepared ? "true" : "false", s->init_s,
			s->total_s, (unsigned long long)s->bytes, s->to_device ? "true" : "false",
			s->ranks_s, s->comm_s, s->comm_wait_s, s->ready_mono, in->kv_dtype,
			in->max_seq, in->max_seqs);
	return 0;
}

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
