/*
 * cmd_plan.c - `wick plan --config CONFIG_JSON`: how a model fits a node, from config.json
 * alone: weights per GPU under a TP/EP layout, workspace, KV-cache bytes per token and the
 * tokens and sequences the rest holds. The arithmetic and its stated rules are in
 * worker/plan.c; this file reads the flags and the config and prints a table or JSON.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coldstart/hfmodel.h"
#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "worker/cmd.h"
#include "worker/plan.h"

#define DEFAULT_GPU_MEM "141GB" /* an H200 */
#define DEFAULT_RESERVE "4GiB"
#define DEFAULT_BATCH 2048

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick plan --config CONFIG_JSON [--tp N] [--ep N] [--gpus N] [--gpu-mem SIZE]\n"
		"                 [--context N] [--batch N] [--weights-dtype fp8|bf16]\n"
		"                 [--kv-dtype auto|bf16|f32|fp8] [--reserve SIZE] [--mtp]\n"
		"                 [--format table|json]\n"
		"\n"
		"Plans GPU memory from config.json alone (no weights are read): parameter bytes per\n"
		"GPU under the layout, by part; the workspace for --batch tokens; KV-cache bytes per\n"
		"token per GPU; and the KV tokens and sequences of --context tokens that the rest\n"
		"holds. Says whether the model fits, and by how much it does not.\n"
		"\n"
		"  --config PATH        config.json, a Hugging Face directory or a wick snapshot (a\n"
		"                       snapshot's tp, ep and --dtype are the defaults below, and\n"
		"                       one made with --mtp plans as --mtp)\n"
		"  --tp N, --ep N       tensor / expert parallel sizes (default 1); the world size is\n"
		"                       max(tp, ep), and the smaller must divide it\n"
		"  --gpus N             GPUs in the node; must equal the world size (default: it)\n"
		"  --gpu-mem SIZE       memory per GPU (default " DEFAULT_GPU_MEM ", an H200). SIZE: a number\n"
		"                       with B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB\n"
		"                       (powers of 2); a bare number is bytes\n"
		"  --context N          tokens per sequence (default max_position_embeddings)\n"
		"  --batch N            tokens in one forward step, for the workspace (default %d)\n"
		"  --weights-dtype D    fp8, bf16, f16 or f32 (default: the config's: fp8 when\n"
		"                       quantization_config.quant_method is fp8, else torch_dtype)\n"
		"  --kv-dtype D         KV-cache dtype: bf16, f32 or fp8 (e4m3 with one f32 scale\n"
		"                       per 128 of a row), which the engine holds, or f16 to see\n"
		"                       what that would hold (default auto, the engine's: bf16\n"
		"                       for a bfloat16 checkpoint, else f32)\n"
		"  --reserve SIZE       per GPU, kept back for the CUDA context, NCCL buffers and\n"
		"                       allocator slack (default " DEFAULT_RESERVE ")\n"
		"  --mtp                the MTP layer loaded to draft (wick worker --speculate with\n"
		"                       --drafter mtp or auto): in the weights and the KV cache\n"
		"  --format F           table (default) or json\n"
		"  -h, --help           this text\n"
		"\n"
		"Exit status: 0 when the plan was made (whether or not the model fits: see \"fits\"),\n"
		"1 when the config cannot be read, 2 on a usage error or a layout that does not\n"
		"divide the model.\n",
		DEFAULT_BATCH);
}

/* What a snapshot was written with (its manifest's tp, ep and dtype, and whether it kept the
 * MTP layer: wick snapshot --mtp); tp 0 for a config. */
struct snap_made {
	int tp, ep;
	char dtype[16];
	bool mtp;
};

/* Whether rank 0's tensor table in manifest mf lists the MTP layer's eh_proj. */
static bool holds_mtp(json_t *mf, json_t *cfg)
{
	char want[96];
	snprintf(want, sizeof want, "model.layers.%lld.eh_proj.weight",
		 (long long)json_integer_value(json_object_get(cfg, "num_hidden_layers")));
	json_t *t = json_object_get(json_array_get(json_object_get(mf, "ranks"), 0), "tensors");
	for (size_t i = 0; i < json_array_size(t); i++) {
		const char *n = json_string_value(json_object_get(json_array_get(t, i), "name"));
		if (n && !strcmp(n, want))
			return true;
	}
	return false;
}

/* Loads CONFIG: a file, a directory's config.json, or a snapshot's manifest config (and then
 * *made, what the snapshot was written with). */
static int load_config(const char *path, json_t **out, struct snap_made *made, char *err,
		       size_t errsz)
{
	memset(made, 0, sizeof *made);
	struct stat sb;
	char p[4096];
	if (stat(path, &sb) != 0)
		return wk_errf(err, errsz, WK_ENOTFOUND, "--config %s: %s", path, strerror(errno));
	if (S_ISDIR(sb.st_mode) && snap_is_snapshot(path)) {
		struct snap *sn;
		struct snap_open_opts o = {.manifest_only = true};
		int rc = snap_open(path, &o, &sn, err, errsz);
		if (rc)
			return rc;
		*out = json_incref(snap_config(sn));
		json_t *mf = snap_manifest(sn);
		made->tp = (int)json_integer_value(json_object_get(mf, "tp"));
		made->ep = (int)json_integer_value(json_object_get(mf, "ep"));
		snprintf(made->dtype, sizeof made->dtype, "%s",
			 json_string_value(json_object_get(mf, "dtype")) ?: "keep");
		made->mtp = *out && holds_mtp(mf, *out);
		snap_close(sn);
		if (!*out)
			return wk_errf(err, errsz, WK_EFORMAT, "%s: the manifest has no config", path);
		return WK_OK;
	}
	if (S_ISDIR(sb.st_mode)) {
		if (snprintf(p, sizeof p, "%s/config.json", path) >= (int)sizeof p)
			return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", path);
		path = p;
	}
	char *buf = NULL;
	size_t len;
	int rc = wk_read_file(path, HF_MAX_CONFIG, &buf, &len, err, errsz);
	if (rc)
		return rc;
	json_error_t je;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	if (!j)
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)",
			       path, je.text, je.line, je.column);
	if (!json_is_object(j)) {
		json_decref(j);
		return wk_errf(err, errsz, WK_EFORMAT, "%s: not a JSON object", path);
	}
	*out = j;
	return WK_OK;
}

static int count(const char *arg, const char *flag, long long lo, long long hi, int64_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(arg, &end, 10);
	if (errno || end == arg || *end || v < lo || v > hi) {
		fprintf(stderr, "wick plan: %s wants a whole number from %lld to %lld, not '%s'\n",
			flag, lo, hi, arg);
		return 2;
	}
	*out = v;
	return 0;
}

static int size_flag(const char *arg, const char *flag, uint64_t *out)
{
	char err[WK_ERRSZ];
	if (plan_parse_size(arg, out, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick plan: %s %s\n", flag, err);
		return 2;
	}
	return 0;
}

static int dtype_flag(const char *arg, const char *flag, enum plan_dtype *out)
{
	if (plan_parse_dtype(arg, out) != WK_OK) {
		fprintf(stderr, "wick plan: %s '%s': unknown dtype (use fp8, bf16, f16 or f32)\n",
			flag, arg);
		return 2;
	}
	return 0;
}

/* ---- text ----------------------------------------------------------------------------------- */

static const char *gb(uint64_t v, char b[32])
{
	snprintf(b, 32, "%.2f GB", (double)v / 1e9);
	return b;
}

/* Bytes in the largest decimal unit below v: "90.62 GB", "2.36 MB". */
static const char *human(uint64_t v, char b[32])
{
	if (v >= 1000000000ULL)
		return gb(v, b);
	if (v >= 1000000ULL)
		snprintf(b, 32, "%.2f MB", (double)v / 1e6);
	else if (v >= 1000ULL)
		snprintf(b, 32, "%.2f KB", (double)v / 1e3);
	else
		snprintf(b, 32, "%" PRIu64 " B", v);
	return b;
}

static const char *gib(uint64_t v, char b[32])
{
	snprintf(b, 32, "%.2f GiB", (double)v / 1073741824.0);
	return b;
}

static const char *kib(uint64_t v, char b[32])
{
	snprintf(b, 32, "%.2f KiB", (double)v / 1024.0);
	return b;
}

/* 1234567 -> "1,234,567" */
static const char *commas(uint64_t v, char b[32])
{
	char tmp[32];
	int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), o = 0;
	for (int i = 0; i < n; i++) {
		if (i && (n - i) % 3 == 0)
			b[o++] = ',';
		b[o++] = tmp[i];
	}
	b[o] = 0;
	return b;
}

static const char *bparams(uint64_t v, char b[32])
{
	if (v >= 1000000000ULL)
		snprintf(b, 32, "%.2f B", (double)v / 1e9);
	else if (v >= 1000000ULL)
		snprintf(b, 32, "%.2f M", (double)v / 1e6);
	else
		snprintf(b, 32, "%" PRIu64, v);
	return b;
}

struct run {
	const char *config;
	const struct plan_model *m;
	const struct plan_opts *o;
	const struct plan_result *r;
	const char *weights_from; /* why the weights dtype is what it is */
};

#define NASSUME 10

/* A plan with another KV dtype: the sequences the engine's FP8 cache would hold instead
 * (*seqs); false where there is no such line to show. */
static bool fp8_seqs(const struct run *u, uint64_t *seqs)
{
	if (u->r->kv == PLAN_FP8)
		return false;
	struct plan_result *r8 = malloc(sizeof *r8);
	struct plan_opts o8 = *u->o;
	o8.kv = PLAN_FP8;
	char e8[WK_ERRSZ];
	bool ok = r8 && plan_compute(u->m, &o8, r8, e8, sizeof e8) == WK_OK;
	if (ok)
		*seqs = r8->max_seqs;
	free(r8);
	return ok;
}

/* The assumptions, as full sentences (both outputs print them). */
static int assumptions(const struct run *u, char out[NASSUME][512])
{
	const struct plan_model *m = u->m;
	const struct plan_result *r = u->r;
	char b1[32], b2[32];
	int n = 0;
	snprintf(out[n++], 512,
		 "layout (wick snapshot's rules): world = max(tp, ep) = %d GPUs; attention heads "
		 "split over TP%s; dense MLP and shared experts split over TP; routed experts "
		 "whole, %lld per GPU in contiguous blocks; router and norms replicated; "
		 "embeddings and lm_head vocab-parallel over TP; shards repeated when tp or ep < "
		 "world (here %dx attention, %dx experts) run redundantly",
		 r->world, m->mla ? " (MLA q_a_proj and kv_a_proj_with_mqa replicated)" : "",
		 (long long)r->experts_per_gpu, r->attn_copies, r->expert_copies);
	if (m->dsa)
		snprintf(out[n++], 512,
			 "DSA indexer (wq_b, wk, k_norm, weights_proj) replicated on every GPU: its "
			 "top-%lld needs scores summed over all %lld index heads; %lld of %lld layers "
			 "run their own indexer", (long long)m->index_topk, (long long)m->index_heads,
			 (long long)m->index_full_layers, (long long)m->layers);
	if (r->weights == PLAN_FP8)
		snprintf(out[n++], 512,
			 "fp8 weights: e4m3 plus one f32 scale per %lldx%lld block of each GPU's "
			 "slice, on every decoder linear projection (incl. indexer wq_b/wk); kept "
			 "%s: embeddings, lm_head, norms, router gate, indexer weights_proj, MTP "
			 "eh_proj; e_score_correction_bias f32",
			 (long long)(m->fp8 ? m->block_rows : 128),
			 (long long)(m->fp8 ? m->block_cols : 128), plan_dtype_name(m->base));
	if (m->mtp_layers && !r->mtp_counted)
		snprintf(out[n++], 512,
			 "MTP: the %lld num_nextn_predict_layers layer(s) (%s params, %s) are NOT "
			 "in weights/GPU: wick loads the MTP layer only to draft (--mtp: it would "
			 "add %s per GPU, and a layer's KV cache)",
			 (long long)m->mtp_layers, bparams(r->mtp.params, b1), gb(r->mtp.bytes, b2),
			 gb(r->mtp.gpu, (char[32]){0}));
	else if (m->mtp_layers)
		snprintf(out[n++], 512,
			 "MTP (--mtp): the one MTP layer wick runs to draft (%s params, %s per GPU) "
			 "is in weights/GPU, and its caches (a full layer's, with its own indexer) "
			 "in the KV cache; its embedding and lm_head are the model's",
			 bparams(r->mtp.params, b1), gb(r->mtp.gpu, b2));
	if (m->mla)
		snprintf(out[n++], 512,
			 "KV cache: MLA keeps only the compressed latent (kv_lora_rank %lld + "
			 "qk_rope_head_dim %lld per layer), replicated on every TP rank because each "
			 "rank's heads read all of it%s%s",
			 (long long)m->kv_lora, (long long)m->qk_rope,
			 r->kv == PLAN_FP8 ? "; fp8 uses the FlashMLA layout (e4m3 latent + one f32 "
					     "scale per 128 + bf16 rope)" : "",
			 m->dsa ? "; plus the DSA indexer's key (index_head_dim) per full layer" : "");
	else
		snprintf(out[n++], 512,
			 "KV cache: 2 x %lld kv heads x head_dim %lld per layer, split over TP (%lld "
			 "kv head(s) per GPU%s)%s",
			 (long long)m->kv_heads, (long long)m->head_dim, (long long)r->kv_heads_per_gpu,
			 r->kv_replicated ? ", replicated: tp > kv heads" : "",
			 r->kv == PLAN_FP8 ? "; fp8 is e4m3 with one f32 scale per 128 values of "
					     "each kv head's row" : "");
	snprintf(out[n++], 512,
		 "workspace: bf16 activations (fp32 residual, router, indexer and vocab logits); "
		 "buffers reused layer to layer; total = hidden + max(attention + indexer, FFN) + "
		 "logits, with MoE dispatch sized for every routed copy landing on one GPU and "
		 "logits for all %lld batch tokens", (long long)r->batch);
	snprintf(out[n++], 512,
		 "reserve: %s per GPU for the CUDA context (~1 GiB), NCCL buffers incl. NVLS (~2 "
		 "GiB), allocator slack and GEMM workspaces (~1 GiB)", gib(u->o->reserve, b1));
	snprintf(out[n++], 512,
		 "capacity: KV tokens = headroom / KV bytes per token per GPU; every GPU holds "
		 "every sequence's KV (for its heads; all of the MLA latent), so that is also the "
		 "node's capacity; sequences = floor(tokens / context)");
	snprintf(out[n++], 512, "sizes: GB = 10^9 bytes, GiB = 2^30 bytes; parameters exclude "
		 "fp8 scales");
	return n;
}

#define WS_TERMS 6

struct ws_term {
	const char *name, *formula;
	uint64_t bytes;
};

/* The workspace terms of plan.c's formula, with their formulas in words. */
static int ws_terms(const struct plan_model *m, const struct plan_result *r,
		    struct ws_term t[WS_TERMS])
{
	int n = 0;
	t[n++] = (struct ws_term){"hidden", "4 x B x hidden_size x 4", r->ws.hidden};
	t[n++] = (struct ws_term){
		"attention",
		m->mla ? "B x 2 x (q_lora + Hg x qk_head + kv_lora + rope + Hg x (kv_lora + rope) "
			 "+ Hg x kv_lora + Hg x v_head), Hg = heads / tp"
		       : "B x 2 x ((Hg + 2 x KVg) x head_dim + Hg x head_dim), Hg = heads / tp",
		r->ws.attn};
	if (m->dsa)
		t[n++] = (struct ws_term){"indexer",
					  "B x (2 x index_heads x index_dim + 4 x index_heads + 4 x C "
					  "+ 4 x index_topk)",
					  r->ws.indexer};
	t[n++] = (struct ws_term){
		"ffn",
		m->n_routed ? "max(dense: B x 2 x 2 x inter / tp, MoE: B x (4 x n_routed + 4 x "
			      "top_k x hidden_size + 4 x top_k x moe_inter + 4 x shared_width / "
			      "tp))"
			    : "B x 2 x 2 x intermediate_size / tp",
		r->ws.ffn};
	t[n++] = (struct ws_term){"logits", "B x 4 x (vocab / tp + vocab)", r->ws.logits};
	t[n++] = (struct ws_term){"total", "hidden + max(attention + indexer, ffn) + logits",
				  r->ws.total};
	return n;
}

static void print_table(const struct run *u)
{
	const struct plan_model *m = u->m;
	const struct plan_opts *o = u->o;
	const struct plan_result *r = u->r;
	char b1[32], b2[32], b3[32], lbl[64];
	printf("wick plan: %s (%s) from %s\n", m->arch, m->model_type, u->config);
	printf("model      %lld layers (%lld dense, %lld MoE)", (long long)m->layers,
	       (long long)m->dense_layers, (long long)m->moe_layers);
	if (m->mtp_layers && r->mtp_counted)
		printf(" + 1 MTP (loaded to draft)");
	else if (m->mtp_layers)
		printf(" + %lld MTP (not loaded)", (long long)m->mtp_layers);
	printf(", hidden %lld, vocab %lld, %s attention, %lld heads", (long long)m->dim,
	       (long long)m->vocab, m->mla ? (m->dsa ? "MLA+DSA" : "MLA") : "GQA",
	       (long long)m->heads);
	if (m->n_routed)
		printf(", %lld routed experts (top %lld) + %lld shared", (long long)m->n_routed,
		       (long long)m->top_k, (long long)m->n_shared);
	printf("\n");
	printf("layout     tp %d, ep %d on %d GPU(s): %lld heads", r->tp, r->ep, r->world,
	       (long long)r->heads_per_gpu);
	if (m->n_routed)
		printf(" and %lld routed experts", (long long)r->experts_per_gpu);
	printf(" per GPU");
	if (r->attn_copies > 1 || r->expert_copies > 1)
		printf("; attention shards x%d, experts x%d (redundant copies)", r->attn_copies,
		       r->expert_copies);
	printf("\n");
	printf("dtypes     weights %s (%s), KV cache %s\n", plan_dtype_name(r->weights),
	       u->weights_from, plan_dtype_name(r->kv));
	printf("\n%-30s %12s %14s %12s   %s\n", "weights", "parameters", "model bytes", "per GPU",
	       "layout");
	for (int i = 0; i < PLAN_NPARTS; i++) {
		const struct plan_part *p = &r->part[i];
		if (!p->params && i != PLAN_LM_HEAD)
			continue;
		printf("  %-28s %12s %14s %12s   %s\n", p->name, bparams(p->params, b1),
		       human(p->bytes, b2), human(p->gpu, b3), p->split);
	}
	if (r->mtp_counted)
		printf("  %-28s %12s %14s %12s   %s\n", "MTP (loaded to draft)",
		       bparams(r->mtp.params, b1), human(r->mtp.bytes, b2), human(r->mtp.gpu, b3),
		       r->mtp.split);
	printf("  %-28s %12s %14s %12s\n", "total", bparams(r->params, b1), human(r->bytes, b2),
	       human(r->gpu, b3));
	printf("  %-28s %12s %14s %12s   %s replicated copies\n", "sum over all GPUs", "",
	       human(r->all_gpus, b1), "", human(r->all_gpus - r->bytes, b2));
	if (m->mtp_layers && !r->mtp_counted) {
		snprintf(lbl, sizeof lbl, "MTP x%lld (not loaded)", (long long)m->mtp_layers);
		printf("  %-28s %12s %14s %12s   %s\n", lbl, bparams(r->mtp.params, b1),
		       human(r->mtp.bytes, b2), human(r->mtp.gpu, b3), r->mtp.split);
	}

	snprintf(lbl, sizeof lbl, "KV cache per token (%s)", plan_dtype_name(r->kv));
	printf("\n%-30s %12s %14s\n", lbl, "per GPU", "all GPUs");
	if (m->mla)
		printf("  %-28s %12s %14s   %lld layers x (%lld + %lld), on every TP rank\n",
		       "MLA latent", kib(r->kv_main, b1), kib(r->kv_main * (uint64_t)r->world, b2),
		       (long long)m->layers, (long long)m->kv_lora, (long long)m->qk_rope);
	else
		printf("  %-28s %12s %14s   %lld layers x 2 x %lld kv head(s) x %lld\n", "k + v",
		       kib(r->kv_main, b1), kib(r->kv_main * (uint64_t)r->world, b2),
		       (long long)m->layers, (long long)r->kv_heads_per_gpu, (long long)m->head_dim);
	if (m->dsa)
		printf("  %-28s %12s %14s   %lld full layers x %lld, on every TP rank\n",
		       "DSA indexer keys", kib(r->kv_index, b1),
		       kib(r->kv_index * (uint64_t)r->world, b2), (long long)m->index_full_layers,
		       (long long)m->index_dim);
	printf("  %-28s %12s %14s   (%s bytes per GPU)\n", "total", kib(r->kv_gpu, b1),
	       kib(r->kv_node, b2), commas(r->kv_gpu, b3));

	printf("\nmemory per GPU (context %s tokens, batch %lld tokens)\n", commas((uint64_t)r->context, b3),
	       (long long)r->batch);
	printf("  %-28s %12s   (%s)\n", "GPU memory", human(o->gpu_mem, b1), gib(o->gpu_mem, b2));
	printf("  %-28s %12s\n", "- weights", human(r->gpu, b1));
	printf("  %-28s %12s\n", "- workspace", human(r->ws.total, b1));
	printf("  %-28s %12s   (%s)\n", "- reserve", human(o->reserve, b1), gib(o->reserve, b2));
	if (r->budget >= 0)
		printf("  %-28s %12s   (%s)\n", "= KV budget (headroom)", human((uint64_t)r->budget, b1),
		       gib((uint64_t)r->budget, b2));
	else
		printf("  %-28s %12s   short by %s\n", "= KV budget (headroom)", "-",
		       human((uint64_t)-r->budget, b1));
	printf("  %-28s %12s   (each GPU holds every sequence)\n", "KV cache tokens",
	       commas(r->kv_tokens_gpu, b1));
	printf("  %-28s %12s   of %s tokens each\n", "max concurrent sequences",
	       commas(r->max_seqs, b1), commas((uint64_t)r->context, b2));
	if (r->fits)
		printf("  %-28s %12s\n", "fits", "yes");
	else if (!r->fits_weights)
		printf("  %-28s %12s   weights + workspace + reserve exceed GPU memory; %s more per "
		       "GPU needed for one %s-token sequence\n", "fits", "NO",
		       human(r->shortfall, b1), commas((uint64_t)r->context, b2));
	else
		printf("  %-28s %12s   %s more per GPU needed for one %s-token sequence\n", "fits",
		       "NO", human(r->shortfall, b1), commas((uint64_t)r->context, b2));
	uint64_t s8;
	if (fp8_seqs(u, &s8))
		printf("  %-28s %12s   sequences of %s tokens with --kv-dtype fp8 (%s)\n",
		       "with an fp8 KV cache", commas(s8, b1), commas((uint64_t)r->context, b2),
		       m->mla ? "e4m3 latent and indexer keys" : "e4m3 keys and values");

	printf("\nworkspace per GPU (B = %lld batch tokens, C = %lld context; bytes per value "
	       "in the formulas)\n", (long long)r->batch, (long long)r->context);
	struct ws_term t[WS_TERMS];
	int nt = ws_terms(m, r, t);
	for (int i = 0; i < nt; i++)
		printf("  %-28s %12s   %s\n", t[i].name, human(t[i].bytes, b1), t[i].formula);
	char as[NASSUME][512];
	int na = assumptions(u, as);
	printf("\nassumptions\n");
	for (int i = 0; i < na; i++)
		printf("  - %s\n", as[i]);
	if (r->nwarn) {
		printf("\nwarnings\n");
		for (int i = 0; i < r->nwarn; i++)
			printf("  - %s\n", r->warn[i]);
	}
}

/* ---- json ----------------------------------------------------------------------------------- */

#define JI(v) json_integer((json_int_t)(v))

static json_t *part_json(const struct plan_part *p)
{
	return json_pack("{s:s, s:o, s:o, s:o, s:s}", "name", p->name, "params", JI(p->params),
			 "bytes", JI(p->bytes), "per_gpu_bytes", JI(p->gpu), "layout", p->split);
}

static json_t *report_json(const struct run *u)
{
	const struct plan_model *m = u->m;
	const struct plan_opts *o = u->o;
	const struct plan_result *r = u->r;
	json_t *parts = json_array();
	for (int i = 0; i < PLAN_NPARTS; i++)
		json_array_append_new(parts, part_json(&r->part[i]));
	json_t *model = json_pack(
		"{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
		"config", u->config, "architecture", m->arch, "model_type", m->model_type,
		"attention", m->mla ? (m->dsa ? "mla+dsa" : "mla") : "gqa", "known_architecture",
		m->known_arch, "hidden_size", JI(m->dim), "vocab_size", JI(m->vocab), "layers",
		JI(m->layers), "dense_layers", JI(m->dense_layers), "moe_layers", JI(m->moe_layers),
		"mtp_layers", JI(m->mtp_layers), "heads", JI(m->heads), "n_routed_experts",
		JI(m->n_routed), "index_full_layers", JI(m->index_full_layers),
		"max_position_embeddings", JI(m->max_pos));
	json_t *layout = json_pack("{s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:o}", "tp", r->tp, "ep",
				   r->ep, "gpus", r->world, "attention_copies", r->attn_copies,
				   "expert_copies", r->expert_copies, "heads_per_gpu",
				   JI(r->heads_per_gpu), "kv_heads_per_gpu",
				   JI(r->kv_heads_per_gpu), "experts_per_gpu",
				   JI(r->experts_per_gpu));
	json_t *opts = json_pack("{s:o, s:o, s:o, s:o, s:s, s:s, s:s}", "gpu_mem_bytes",
				 JI(o->gpu_mem), "reserve_bytes", JI(o->reserve), "context",
				 JI(r->context), "batch", JI(r->batch), "weights_dtype",
				 plan_dtype_name(r->weights), "weights_dtype_from", u->weights_from,
				 "kv_dtype", plan_dtype_name(r->kv));
	json_t *weights = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "params", JI(r->params),
				    "bytes", JI(r->bytes), "per_gpu_bytes", JI(r->gpu),
				    "all_gpus_bytes", JI(r->all_gpus), "replicated_bytes",
				    JI(r->all_gpus - r->bytes), "parts", parts);
	json_t *mtp = json_pack("{s:o, s:o, s:o, s:o, s:b}", "layers", JI(m->mtp_layers), "params",
				JI(r->mtp.params), "bytes", JI(r->mtp.bytes), "per_gpu_bytes",
				JI(r->mtp.gpu), "counted", r->mtp_counted);
	json_t *ws = json_pack("{s:o, s:o, s:o}", "per_gpu_bytes", JI(r->ws.total), "batch",
			       JI(r->batch), "context", JI(r->context));
	struct ws_term t[WS_TERMS];
	int nt = ws_terms(m, r, t);
	for (int i = 0; i < nt; i++)
		json_object_set_new(ws, t[i].name, json_pack("{s:o, s:s}", "bytes",
							    JI(t[i].bytes), "formula",
							    t[i].formula));
	json_t *kv = json_pack("{s:o, s:o, s:o, s:o, s:b, s:o, s:o}",
			       "main_bytes_per_token_per_gpu", JI(r->kv_main),
			       "indexer_bytes_per_token_per_gpu", JI(r->kv_index),
			       "bytes_per_token_per_gpu", JI(r->kv_gpu), "bytes_per_token_all_gpus",
			       JI(r->kv_node), "replicated_over_tp", r->kv_replicated, "tokens",
			       JI(r->kv_tokens_gpu), "max_sequences", JI(r->max_seqs));
	uint64_t s8;
	if (fp8_seqs(u, &s8)) /* what --kv-dtype fp8 would hold */
		json_object_set_new(kv, "max_sequences_fp8", JI(s8));
	json_t *mem = json_pack("{s:o, s:o, s:o, s:o, s:o, s:b, s:b, s:o}", "gpu_mem_bytes",
				JI(o->gpu_mem), "weights_bytes", JI(r->gpu), "workspace_bytes",
				JI(r->ws.total), "reserve_bytes", JI(o->reserve), "headroom_bytes",
				JI(r->budget), "fits_weights", r->fits_weights, "fits", r->fits,
				"shortfall_bytes", JI(r->shortfall));
	char as[NASSUME][512];
	int na = assumptions(u, as);
	json_t *aj = json_array(), *wj = json_array();
	for (int i = 0; i < na; i++)
		json_array_append_new(aj, json_string(as[i]));
	for (int i = 0; i < r->nwarn; i++)
		json_array_append_new(wj, json_string(r->warn[i]));
	return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "model", model,
			 "layout", layout, "options", opts, "weights", weights, "mtp", mtp,
			 "workspace", ws, "kv_cache", kv, "memory", mem, "assumptions", aj,
			 "warnings", wj);
}

int cmd_plan(int argc, char **argv)
{
	enum { O_CONFIG = 1, O_TP, O_EP, O_GPUS, O_MEM, O_CTX, O_BATCH, O_WDT, O_KVDT, O_RES, O_FMT,
	       O_MTP };
	static const struct option opts[] = {
		{"config", required_argument, NULL, O_CONFIG},
		{"tp", required_argument, NULL, O_TP},
		{"ep", required_argument, NULL, O_EP},
		{"gpus", required_argument, NULL, O_GPUS},
		{"gpu-mem", required_argument, NULL, O_MEM},
		{"context", required_argument, NULL, O_CTX},
		{"batch", required_argument, NULL, O_BATCH},
		{"weights-dtype", required_argument, NULL, O_WDT},
		{"kv-dtype", required_argument, NULL, O_KVDT},
		{"reserve", required_argument, NULL, O_RES},
		{"mtp", no_argument, NULL, O_MTP},
		{"format", required_argument, NULL, O_FMT},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct plan_opts po = {.tp = 1, .ep = 1, .batch = DEFAULT_BATCH, .weights = PLAN_NDTYPE,
			       .kv = PLAN_NDTYPE}; /* PLAN_NDTYPE: auto, the engine's default */
	const char *config = NULL, *format = "table";
	int64_t v = 0; /* read only when its flag parsed */
	int c, rc = 0;
	bool layout_given = false, weights_given = false;
	plan_parse_size(DEFAULT_GPU_MEM, &po.gpu_mem, NULL, 0);
	plan_parse_size(DEFAULT_RESERVE, &po.reserve, NULL, 0);
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_CONFIG: config = optarg; break;
		case O_TP:
			rc = count(optarg, "--tp", 1, 4096, &v);
			po.tp = (int)v;
			layout_given = true;
			break;
		case O_EP:
			rc = count(optarg, "--ep", 1, 4096, &v);
			po.ep = (int)v;
			layout_given = true;
			break;
		case O_GPUS: rc = count(optarg, "--gpus", 1, 4096, &v); po.gpus = (int)v; break;
		case O_MEM: rc = size_flag(optarg, "--gpu-mem", &po.gpu_mem); break;
		case O_CTX: rc = count(optarg, "--context", 1, 1LL << 32, &po.context); break;
		case O_BATCH: rc = count(optarg, "--batch", 1, 1 << 24, &po.batch); break;
		case O_WDT:
			rc = dtype_flag(optarg, "--weights-dtype", &po.weights);
			weights_given = true;
			break;
		case O_KVDT:
			if (!strcmp(optarg, "auto"))
				po.kv = PLAN_NDTYPE; /* the last flag wins, auto too */
			else
				rc = dtype_flag(optarg, "--kv-dtype", &po.kv);
			break;
		case O_MTP: po.mtp = true; break;
		case O_RES:
			if (!strcmp(optarg, "0"))
				po.reserve = 0;
			else
				rc = size_flag(optarg, "--reserve", &po.reserve);
			break;
		case O_FMT: format = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (rc)
			return rc;
	}
	if (optind != argc) {
		fprintf(stderr, "wick plan: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!config) {
		fprintf(stderr, "wick plan: --config CONFIG_JSON is required\n");
		return 2;
	}
	if (strcmp(format, "table") && strcmp(format, "json")) {
		fprintf(stderr, "wick plan: --format '%s': use table or json\n", format);
		return 2;
	}

	char err[WK_ERRSZ];
	json_t *cfg = NULL;
	struct plan_model m;
	struct snap_made made;
	if (load_config(config, &cfg, &made, err, sizeof err) != WK_OK ||
	    plan_model_read(cfg, &m, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick plan: %s\n", err);
		json_decref(cfg);
		return 1;
	}
	json_decref(cfg);
	if (po.kv == PLAN_NDTYPE)
		po.kv = m.kv_auto;
	/* A snapshot: its layout and weight dtype unless the flags say otherwise (the layout as
	 * logits and worker default to it; an FP8 checkpoint cast to bf16 keeps its FP8
	 * matrices, so only fp8, or bf16/f32 of a model that is not FP8, changes the plan) */
	if (made.tp > 0 && !layout_given) {
		po.tp = made.tp;
		po.ep = made.ep > 0 ? made.ep : 1;
	}
	po.mtp |= made.mtp; /* a restore puts its MTP layer in GPU memory */
	bool weights_from_snap = false;
	if (made.tp > 0 && !weights_given &&
	    (!strcmp(made.dtype, "fp8") || (!m.fp8 && (!strcmp(made.dtype, "bf16") ||
						       !strcmp(made.dtype, "f32"))))) {
		plan_parse_dtype(made.dtype, &po.weights);
		weights_from_snap = true;
	}
	struct plan_result *r = malloc(sizeof *r);
	if (!r) {
		fprintf(stderr, "wick plan: out of memory\n");
		return 1;
	}
	if (plan_compute(&m, &po, r, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick plan: %s\n", err);
		free(r);
		return 2;
	}
	char from[160];
	if (weights_from_snap)
		snprintf(from, sizeof from, "the snapshot's --dtype %s", made.dtype);
	else if (po.weights != PLAN_NDTYPE)
		snprintf(from, sizeof from, "--weights-dtype");
	else if (m.fp8)
		snprintf(from, sizeof from, "config quantization_config: %s", m.quant_note);
	else
		snprintf(from, sizeof from, "config torch_dtype%s%s", m.quant_note[0] ? "; " : "",
			 m.quant_note);
	struct run u = {.config = config, .m = &m, .o = &po, .r = r, .weights_from = from};
	if (!strcmp(format, "json")) {
		json_t *j = report_json(&u);
		if (!j) {
			fprintf(stderr, "wick plan: out of memory\n");
			free(r);
			return 1;
		}
		json_dumpf(j, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(j);
	} else {
		print_table(&u);
	}
	free(r);
	return 0;
}
