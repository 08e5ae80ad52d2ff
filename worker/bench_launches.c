/*
 * bench_launches.c - `wick bench launches MODEL`: what one decode step launches on a GPU.
 *
 * Eager mode pays a launch for every kernel and copy: a naive GLM-5 decode step launches
 * 1,600-2,300 kernels per GPU, and the target is <= 400. This counts them (engine/count.c:
 * every backend op and copy the engine issues, plus a sharded rank's collectives) over
 * decode steps at batch 1 (or --batch N sequences, each a token a step, as the worker
 * batches them) after a prefill of --context tokens, and prints them per step by
 * kind, beside the unfused baseline from the same run (MoE experts one by one, one matmul
 * per weight instead of matmul_n). The families issue the same ops on every backend, so a count on the CPU backend is
 * what the CUDA backend launches for the same step (one kernel per op, one async copy per
 * copy); the structure, not the dimensions, decides the count, so a checkpoint with GLM-5's
 * layers, experts, top-k and indexer at small dimensions (gen_glm --preset glm5-structure)
 * counts what GLM-5 launches. A chain (engine_int.h eng_chain_begin: ops that follow one
 * another as one launch) counts one; the ops inside chains are listed under it, and the same
 * steps are run again without chains (every op its own launch). Each run's decode steps are
 * timed too (ms per step, its logits back on the host): on a GPU that is what the launches
 * cost, chained against not; on the CPU it is the arithmetic alone. With --op-times the
 * not-chained steps run once more with every op timed (engine/count.c's op clock): on the
 * CUDA backend each op's time on the device between events recorded before and after it,
 * the device's time between ops, and each kind's host time to issue its ops; on the CPU
 * backend each op's own time. Then the chained steps, every chain timed as one op beside
 * the ops between them: whether a chain takes less of the device than its ops alone did.
 * Prints a table, then one JSON line.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "worker/cmd.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick bench launches MODEL [options]\n\n"
		"Counts the kernel launches and copies of a batch-1 decode step (what the CUDA\n"
		"backend launches; counted on any backend): a prefill of --context tokens, then\n"
		"--steps decode steps; prints the average per step by kind (matmul_n, norm_n and\n"
		"rope_n count as one matmul, rmsnorm and rope), then one JSON line.\n"
		"  -c, --context N    tokens before the decode steps (default 64)\n"
		"  -s, --steps S      decode steps counted (default 4)\n"
		"      --backend B    cpu, cuda, null or auto (default cpu)\n"
		"      --threads T    CPU threads (default: all cores)\n"
		"      --target N     launches per step to compare with (default 400)\n"
		"      --batch N      sequences decoding together, each its own prefill and a token\n"
		"                     a step chosen on the device (default 1: one sequence whose\n"
		"                     logits come to the host each step)\n"
		"      --kv-dtype D   the KV cache's type: bf16, f32, fp8 or auto (default auto:\n"
		"                     bf16 for a bfloat16 checkpoint)\n"
		"      --drafts K     each step also drafts K tokens with the model's MTP layer\n"
		"                     (speculative decoding's drafter; not verified: one token a\n"
		"                     step, then the MTP layer's passes)\n"
		"      --op-times     also time every op of the steps run without chains: per kind,\n"
		"                     on the device's clock where the backend has one (cuda), else\n"
		"                     the host's; and the device's time between ops; then the\n"
		"                     chained steps, each chain timed as one op\n");
}

static int parse_pos(const char *s, const char *what, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (end == s || *end || v < 1 || v > hi) {
		fprintf(stderr, "wick bench: %s wants an integer in 1..%d, not '%s'\n", what, hi, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* One measurement: the launches per decode step, averaged over steps, after a prefill. */
struct count_run {
	char arch[128], backend[32], kv[8];
	double per_kind[ENG_LAUNCH_KINDS]; /* ops per step */
	double chained[ENG_LAUNCH_KINDS];  /* ops per step run inside chains */
	double kernels, copies, coll, total; /* launches per step */
	double step_ms; /* wall time of a decode step (its logits on the host) */
	/* --op-times: per step, each kind's ops timed and their ms (on the device where it has
	 * a clock, else on the host), the host's ms issuing them, the device's ms between ops */
	double timed[ENG_LAUNCH_KINDS], op_ms[ENG_LAUNCH_KINDS], host_ms[ENG_LAUNCH_KINDS];
	double gap_ms;
	bool dev_clock;
};

/* Batch > 1: batch sequences, each prefilled with the same context tokens in one step, then
 * a step more, then the counted and timed steps: every sequence a token, its argmax chosen
 * where the logits are (eng_item.token), as the worker's greedy requests decode. */
static int batch_steps(struct engine *e, const int *ids, int context, int steps, int batch,
		       int drafts, struct eng_launches *before, double *ms)
{
	char err[WK_ERRSZ];
	struct eng_item *it = calloc((size_t)batch, sizeof *it);
	int *tok = calloc((size_t)batch, sizeof *tok), rc = 1;
	int *dr = calloc((size_t)batch * (drafts + 1), sizeof *dr);
	if (!it || !tok || !dr) {
		fprintf(stderr, "wick bench: out of memory\n");
		goto done;
	}
	for (int b = 0; b < batch; b++) {
		if (eng_seq_alloc(e, &it[b].seq) != WK_OK) {
			fprintf(stderr, "wick bench: the engine holds fewer than %d sequences\n",
				batch);
			goto done;
		}
		it[b].tokens = ids;
		it[b].n = context;
		it[b].token = &tok[b];
		it[b].drafts = drafts; /* the MTP layer's, after each step's token */
		it[b].draft = dr + (size_t)b * (drafts + 1);
	}
	for (int i = -1; i <= steps; i++) { /* the prefill, one step more, then the counted */
		if (i == 1 && eng_launches(e, 0, before) != WK_OK) {
			fprintf(stderr, "wick bench: the engine did not count its launches\n");
			goto done;
		}
		if (i == 1)
			*ms = wk_now();
		if (eng_step(e, it, batch, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench: %s step: %s\n", i < 0 ? "prefill" : "decode",
				err);
			goto done;
		}
		for (int b = 0; b < batch; b++) { /* each its own chosen token next */
			it[b].tokens = &tok[b];
			it[b].n = 1;
		}
	}
	*ms = (wk_now() - *ms) * 1e3 / steps;
	rc = 0;
done:
	free(it);
	free(tok);
	free(dr);
	return rc;
}

static int count_step(const char *model, const struct eng_opts *eo, int context, int steps,
		      int batch, int drafts, struct count_run *r)
{
	char err[WK_ERRSZ];
	struct engine *e = NULL;
	if (eng_open(model, eo, &e, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench: %s\n", err);
		return 1;
	}
	const struct eng_info *info = eng_info(e);
	int rc = 1, V = info->vocab;
	int *ids = malloc((size_t)context * sizeof *ids);
	float *logits = malloc((size_t)V * sizeof *logits);
	struct eng_launches before, after;
	memset(r, 0, sizeof *r);
	snprintf(r->arch, sizeof r->arch, "%s", info->arch);
	snprintf(r->backend, sizeof r->backend, "%s", info->backend);
	snprintf(r->kv, sizeof r->kv, "%s", info->kv_dtype);
	if (!ids || !logits) {
		fprintf(stderr, "wick bench: out of memory\n");
		goto done;
	}
	if (info->max_seq < context + steps + 1 + drafts) {
		fprintf(stderr, "wick bench: the model holds %d positions, fewer than --context %d + "
				"--steps %d + 1\n", info->max_seq, context, steps);
		goto done;
	}
	for (int i = 0; i < context; i++) /* any tokens: the count does not depend on them */
		ids[i] = (int)((1 + 7919u * (unsigned)i) % (unsigned)V);
	if (batch > 1 || drafts > 0) {
		if (batch_steps(e, ids, context, steps, batch, drafts, &before, &r->step_ms))
			goto done;
		goto count;
	}
	if (eng_forward(e, ids, context, 0, logits, false, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench: prefill: %s\n", err);
		goto done;
	}
	/* one step first, neither counted nor timed: a GPU loads each kernel at its first launch */
	int tok0 = samp_argmax(logits, V);
	if (eng_forward(e, &tok0, 1, context, logits, false, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench: decode step: %s\n", err);
		goto done;
	}
	if (eng_launches(e, 0, &before) != WK_OK) {
		fprintf(stderr, "wick bench: the engine did not count its launches\n");
		goto done;
	}
	double t0 = wk_now();
	for (int i = 0; i < steps; i++) {
		int tok = samp_argmax(logits, V);
		if (eng_forward(e, &tok, 1, context + 1 + i, logits, false, err, sizeof err) != WK_OK) {
			fprintf(stderr, "wick bench: decode step %d: %s\n", i, err);
			goto done;
		}
	}
	r->step_ms = (wk_now() - t0) * 1e3 / steps;
count:
	eng_launches(e, 0, &after);
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		bool is_copy;
		int per;
		eng_launch_kind(k, &is_copy, &per);
		double n = (double)(after.n[k] - before.n[k]) / steps;
		r->per_kind[k] = n;
		r->chained[k] = (double)(after.chained[k] - before.chained[k]) / steps;
		*(is_copy ? &r->copies : &r->kernels) += n * per;
	}
	r->coll = (double)(after.collectives - before.collectives) / steps;
	r->total = r->kernels + r->copies + r->coll;
	if (eo->op_times && after.op_times_rc != WK_OK) {
		fprintf(stderr, "wick bench: the op clock failed: the device's timing events could "
				"not be read\n");
		goto done;
	}
	for (int k = 0; eo->op_times && k < ENG_LAUNCH_KINDS; k++) {
		r->timed[k] = (double)(after.timed[k] - before.timed[k]) / steps;
		r->host_ms[k] = (after.host_ms[k] - before.host_ms[k]) / steps;
		r->op_ms[k] = after.dev_clock ? (after.dev_ms[k] - before.dev_ms[k]) / steps
					      : r->host_ms[k];
	}
	r->gap_ms = (after.gap_ms - before.gap_ms) / steps;
	r->dev_clock = after.dev_clock;
	rc = 0;
done:
	eng_close(e);
	free(ids);
	free(logits);
	return rc;
}

/* --op-times: a timed run's table, kinds by time, and its JSON object; how: how its ops
 * ran ("not chained, every op", or "chained, every chain and op"). */
static json_t *print_op_times(const struct count_run *t, double untimed_ms, const char *how)
{
	const char *clock = t->dev_clock ? "device" : "host";
	double sum = t->gap_ms;
	int order[ENG_LAUNCH_KINDS], n = 0;
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		sum += t->op_ms[k];
		if (t->timed[k] == 0)
			continue;
		int i = n++;
		for (; i > 0 && t->op_ms[order[i - 1]] < t->op_ms[k]; i--)
			order[i] = order[i - 1];
		order[i] = k;
	}
	printf("op times           %s timed on the %s's clock: a step %.3f ms (%.3f ms "
	       "untimed)\n", how, clock, t->step_ms, untimed_ms);
	printf("  %-16s %8s %10s %6s %10s %10s\n", "kind", "ops", "ms", "share", "us an op",
	       "host ms");
	json_t *by = json_object();
	for (int i = 0; i < n; i++) {
		int k = order[i];
		const char *name = eng_launch_kind(k, NULL, NULL);
		printf("  %-16s %8.1f %10.4f %5.1f%% %10.2f %10.4f\n", name, t->timed[k], t->op_ms[k],
		       sum > 0 ? 100.0 * t->op_ms[k] / sum : 0.0, 1e3 * t->op_ms[k] / t->timed[k],
		       t->host_ms[k]);
		json_object_set_new(by, name, json_pack("{s:f, s:f, s:f}", "ops", t->timed[k], "ms",
							 t->op_ms[k], "host_ms", t->host_ms[k]));
	}
	if (t->dev_clock)
		printf("  %-16s %8s %10.4f %5.1f%%  (the device between ops)\n", "(between ops)", "",
		       t->gap_ms, sum > 0 ? 100.0 * t->gap_ms / sum : 0.0);
	printf("  %-16s %8s %10.4f\n", "sum", "", sum);
	return json_pack("{s:s, s:f, s:f, s:f, s:o}", "clock", clock, "step_ms", t->step_ms,
			 "between_ops_ms", t->gap_ms, "sum_ms", sum, "by_kind", by);
}

int bench_launches(int argc, char **argv)
{
	int context = 64, steps = 4, threads = 0, target = 400, batch = 1, drafts = 0;
	bool op_times = false;
	const char *backend = "cpu", *kv = NULL;
	static const struct option opts[] = {
		{"context", required_argument, NULL, 'c'},
		{"steps", required_argument, NULL, 's'},
		{"backend", required_argument, NULL, 'b'},
		{"threads", required_argument, NULL, 't'},
		{"target", required_argument, NULL, 'T'},
		{"kv-dtype", required_argument, NULL, 'k'},
		{"batch", required_argument, NULL, 'B'},
		{"op-times", no_argument, NULL, 'O'},
		{"drafts", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		CMD_MODEL_OPTIONS,
		{NULL, 0, NULL, 0},
	};
	int c;
	const char *given = NULL;
	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 'c': bad = parse_pos(optarg, "--context", 1 << 20, &context); break;
		case 's': bad = parse_pos(optarg, "--steps", 10000, &steps); break;
		case 'B': bad = parse_pos(optarg, "--batch", 4096, &batch); break;
		case 'b': backend = optarg; break;
		case 't': bad = parse_pos(optarg, "--threads", 1024, &threads); break;
		case 'T': bad = parse_pos(optarg, "--target", 1 << 30, &target); break;
		case 'k': kv = optarg; break;
		case 'O': op_times = true; break;
		case 'D': bad = parse_pos(optarg, "--drafts", ENG_DRAFT_MAX, &drafts); break;
		case 'M': given = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (bad)
			return 2;
	}
	const char *model = cmd_one_model(given, argc, argv, optind);
	if (!model) {
		usage(stderr);
		return 2;
	}
	/* fused and chained / not chained / unfused / not chained, every op timed / chained,
	 * every chain and op timed */
	struct count_run grouped, plain, one, timed, timed_ch;
	struct eng_opts eo = {.backend = backend, .threads = threads,
			      .max_seq = context + steps + 1 + drafts, .max_seqs = batch,
			      .count_launches = true, .kv_dtype = kv,
			      .mtp = drafts ? ENG_MTP_ON : ENG_MTP_OFF};
	if (count_step(model, &eo, context, steps, batch, drafts, &grouped))
		return 1;
	eo.no_chain = true; /* every op its own launch */
	if (count_step(model, &eo, context, steps, batch, drafts, &plain))
		return 1;
	eo.op_times = op_times; /* the same, every op timed */
	if (op_times && count_step(model, &eo, context, steps, batch, drafts, &timed))
		return 1;
	eo.no_chain = false; /* chained, each chain timed as one op */
	if (op_times && count_step(model, &eo, context, steps, batch, drafts, &timed_ch))
		return 1;
	eo.op_times = false;
	eo.no_chain = true;
	eo.experts_one_by_one = true; /* the baseline: MoE experts one at a time, */
	eo.unfused = true;            /* one matmul per weight, cache writes by copy */
	if (count_step(model, &eo, context, steps, batch, drafts, &one))
		return 1;

	printf("model            %s (%s)\n", model, grouped.arch);
	printf("backend          %s\n", grouped.backend);
	printf("kv cache         %s\n", grouped.kv);
	printf("decode step      batch %d at position %d..%d, %d steps averaged (after one more)%s\n",
	       batch, context + 1, context + steps, steps,
	       drafts ? ", each with the MTP layer's drafts" : "");
	if (drafts)
		printf("MTP drafts       %d a sequence a step\n", drafts);
	printf("%-18s %10s\n", "kind", "per step");
	json_t *by = json_object();
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		bool is_copy;
		int per;
		const char *name = eng_launch_kind(k, &is_copy, &per);
		double n = grouped.per_kind[k];
		if (n == 0)
			continue;
		if (per > 1)
			printf("%-18s %10.1f  (x %d kernels each)\n", name, n, per);
		else
			printf("%-18s %10.1f%s\n", name, n, is_copy ? "  (copy)" : "");
		json_object_set_new(by, name, json_real(n));
	}
	json_t *inside = json_object();
	for (int k = 0; k < ENG_LAUNCH_KINDS; k++) {
		const char *name = eng_launch_kind(k, NULL, NULL);
		if (grouped.chained[k] == 0)
			continue;
		printf("  %-16s %10.1f  (inside the chains)\n", name, grouped.chained[k]);
		json_object_set_new(inside, name, json_real(grouped.chained[k]));
	}
	printf("%-18s %10.1f\n", "kernels", grouped.kernels);
	printf("%-18s %10.1f\n", "copies", grouped.copies);
	if (grouped.coll > 0)
		printf("%-18s %10.1f\n", "collectives", grouped.coll);
	printf("%-18s %10.1f  (target %d: %.2fx)\n", "launches", grouped.total, target,
	       grouped.total / target);
	if (batch > 1)
		printf("%-18s %10.1f  (a step's launches over its %d tokens)\n", "per token",
		       grouped.total / batch, batch);
	printf("%-18s %10.1f  (every op its own launch)\n", "not chained", plain.total);
	printf("%-18s %10.1f  (experts one by one, one matmul per weight; fused: %.2fx fewer)\n",
	       "unfused", one.total, grouped.total > 0 ? one.total / grouped.total : 0.0);
	/* the same steps timed: on a GPU, what the launches cost; on the CPU backend, the CPU's
	 * arithmetic, which launches do not change */
	printf("%-18s %10.3f ms  (not chained %.3f ms: %.2fx; unfused %.3f ms) on %s\n",
	       "time per step", grouped.step_ms, plain.step_ms,
	       grouped.step_ms > 0 ? plain.step_ms / grouped.step_ms : 0.0, one.step_ms,
	       grouped.backend);
	json_t *ms = json_pack("{s:f, s:f, s:f}", "chained", grouped.step_ms, "not_chained",
			       plain.step_ms, "unfused", one.step_ms);
	json_t *ot = op_times ? print_op_times(&timed, plain.step_ms, "not chained, every op")
			      : NULL;
	json_t *otc = op_times ? print_op_times(&timed_ch, grouped.step_ms,
						"chained, every chain and op") : NULL;
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, "
			      "s:i, s:o, s:o, s:o, s:o*, s:o*, s:i}",
			      "bench", "launches", "model", model, "backend", grouped.backend,
			      "kv_dtype", grouped.kv, "batch", batch,
			      "context", context, "steps", steps, "kernels", grouped.kernels,
			      "copies", grouped.copies, "collectives", grouped.coll, "launches",
			      grouped.total, "not_chained", plain.total, "unfused", one.total,
			      "target", target, "by_kind", by, "chained", inside, "step_ms", ms,
			      "op_times", ot, "op_times_chained", otc, "drafts", drafts);
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
	json_decref(j);
	if (!s) {
		fprintf(stderr, "wick bench: out of memory\n");
		return 1;
	}
	printf("%s\n", s);
	free(s);
	return 0;
}
