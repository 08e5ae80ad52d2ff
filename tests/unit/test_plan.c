/*
 * test_plan.c - worker/plan.c: size and dtype parsing, reading config.json, and the plan's
 * arithmetic on tiny configs whose numbers are worked out by hand in the comments.
 * (tests/e2e/plan_cli.sh checks the real GLM-5 and GLM-4.5 configs against an independent
 * Python count, and tiny checkpoints against `wick inspect`.)
 */
#include <criterion/criterion.h>
#include <string.h>

#include "common/wk.h"
#include "worker/plan.h"
#include "engine/engine_int.h"

#define GB 1000000000ULL
#define GiB 1073741824ULL

static uint64_t size_ok(const char *s)
{
	uint64_t v = 0;
	char err[WK_ERRSZ] = "";
	cr_assert_eq(plan_parse_size(s, &v, err, sizeof err), WK_OK, "'%s': %s", s, err);
	return v;
}

static void size_bad(const char *s, const char *msg)
{
	uint64_t v = 0;
	char err[WK_ERRSZ] = "";
	cr_assert_eq(plan_parse_size(s, &v, err, sizeof err), WK_EINVAL, "'%s' was accepted", s);
	cr_assert(strstr(err, msg), "'%s': message '%s' lacks '%s'", s, err, msg);
}

Test(plan, sizes)
{
	cr_assert_eq(size_ok("141GB"), 141 * GB);
	cr_assert_eq(size_ok("140GiB"), 140 * GiB);
	cr_assert_eq(size_ok("141gb"), 141 * GB);
	cr_assert_eq(size_ok("1.5TB"), 1500 * GB);
	cr_assert_eq(size_ok("2 TiB"), 2048 * GiB);
	cr_assert_eq(size_ok("64MiB"), 64ULL << 20);
	cr_assert_eq(size_ok("3MB"), 3000000ULL);
	cr_assert_eq(size_ok("4KiB"), 4096ULL);
	cr_assert_eq(size_ok("512"), 512ULL);
	cr_assert_eq(size_ok("512B"), 512ULL);
	size_bad("141XB", "unknown unit 'XB'");
	size_bad("141G", "unknown unit 'G'");
	size_bad("", "empty size");
	size_bad("GB", "is not a size");
	size_bad("-1GB", "is not a size");
	size_bad("1.5", "needs a unit");
	size_bad("0", "out of range");
	size_bad("0.1B", "out of range");
	size_bad("99999999999TB", "out of range");
}

Test(plan, dtypes)
{
	enum plan_dtype d;
	cr_assert_eq(plan_parse_dtype("fp8", &d), WK_OK);
	cr_assert_eq(d, PLAN_FP8);
	cr_assert_eq(plan_parse_dtype("bf16", &d), WK_OK);
	cr_assert_eq(d, PLAN_BF16);
	cr_assert_eq(plan_parse_dtype("fp32", &d), WK_OK);
	cr_assert_eq(d, PLAN_F32);
	cr_assert_eq(plan_parse_dtype("int4", &d), WK_EINVAL);
	cr_assert_eq(plan_parse_dtype(NULL, &d), WK_EINVAL);
	cr_assert_str_eq(plan_dtype_name(PLAN_FP8), "fp8");
}

/* A tiny GLM-5-style model: 2 layers (layer 0 dense, layer 1 MoE), MLA + DSA, FP8 128x128. */
static const char *tiny_mla =
	"{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\","
	" \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
	" \"vocab_size\": 1000, \"max_position_embeddings\": 4096, \"q_lora_rank\": 128,"
	" \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": 32,"
	" \"v_head_dim\": 64, \"index_n_heads\": 2, \"index_head_dim\": 64, \"index_topk\": 16,"
	" \"intermediate_size\": 512, \"moe_intermediate_size\": 128, \"n_routed_experts\": 4,"
	" \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1,"
	" \"tie_word_embeddings\": false, \"dtype\": \"bfloat16\", \"num_nextn_predict_layers\": 1,"
	" \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}";

static void model(const char *text, struct plan_model *m)
{
	json_error_t je;
	json_t *cfg = json_loads(text, 0, &je);
	cr_assert_not_null(cfg, "%s", je.text);
	char err[WK_ERRSZ] = "";
	int rc = plan_model_read(cfg, m, err, sizeof err);
	json_decref(cfg);
	cr_assert_eq(rc, WK_OK, "%s", err);
}

static void compute(const struct plan_model *m, struct plan_opts o, struct plan_result *r)
{
	char err[WK_ERRSZ] = "";
	cr_assert_eq(plan_compute(m, &o, r, err, sizeof err), WK_OK, "%s", err);
}

static struct plan_opts opts(int tp, int ep)
{
	return (struct plan_opts){.tp = tp, .ep = ep, .gpu_mem = 1 * GB, .reserve = 0,
				  .context = 1000, .batch = 16, .weights = PLAN_NDTYPE,
				  .kv = PLAN_BF16};
}

Test(plan, mla_by_hand)
{
	struct plan_model m;
	struct plan_result r;
	model(tiny_mla, &m);
	cr_assert(m.mla && m.dsa && m.fp8 && m.known_arch);
	cr_assert_eq(m.dense_layers, 1);
	cr_assert_eq(m.moe_layers, 1);
	cr_assert_eq(m.index_full_layers, 2);
	compute(&m, opts(2, 2), &r);
	cr_assert_eq(r.world, 2);
	cr_assert_eq(r.weights, PLAN_FP8);
	/* attention per layer: q_a 128x256 = 32768, q_b (4*64)x128 = 32768, kv_a (128+32)x256 =
	 * 40960, kv_b (4*(32+64))x128 = 49152, o 256x(4*64) = 65536: 221184 params. FP8 scales
	 * (128x128 blocks): 1x2 + 2x1 + 2x2 + 3x1 + 2x2 = 15 floats = 60 B. */
	struct plan_part *a = &r.part[PLAN_ATTN];
	cr_assert_eq(a->params, 2 * 221184);
	cr_assert_eq(a->bytes, 2 * (221184 + 60));
	/* per GPU (tp 2): q_a whole 32768 + 8; q_b [128][128] 16384 + 4; kv_a whole 40960 + 16;
	 * o [256][128] 32768 + 8; kv_b [192][128] is cut off the 128 grid (192 rows), so the
	 * shard of this FP8 checkpoint is stored dequantized, f32: 98304. 221220 per layer. */
	cr_assert_eq(a->gpu, 2 * 221220);
	/* indexer per layer: wq_b [128][128] fp8 16384 + 4, wk [64][256] fp8 16384 + 8,
	 * weights_proj [2][256] bf16 1024; replicated. */
	struct plan_part *ix = &r.part[PLAN_INDEXER];
	cr_assert_eq(ix->params, 2 * (16384 + 16384 + 512));
	cr_assert_eq(ix->bytes, 2 * (16388 + 16392 + 1024));
	cr_assert_eq(ix->gpu, ix->bytes);
	/* routed: 4 experts x 3 x 128x256 params; a GPU holds 2 whole experts, each gate/up
	 * [128][256] 32768 + 8 and down [256][128] 32768 + 8. */
	struct plan_part *x = &r.part[PLAN_ROUTED];
	cr_assert_eq(x->params, 4 * 3 * 32768);
	cr_assert_eq(x->gpu, 2 * 3 * (32768 + 8));
	/* router: gate [4][256] bf16 + bias [4] f32, replicated */
	cr_assert_eq(r.part[PLAN_ROUTER].gpu, 4 * 256 * 2 + 4 * 4);
	/* dense MLP 512 wide over tp 2: gate/up [256][256] 65536 + 16, down [256][256] too */
	cr_assert_eq(r.part[PLAN_DENSE].gpu, 3 * (65536 + 16));
	/* shared expert 128 wide over tp 2: [64][256] and [256][64], off the grid: f32 */
	cr_assert_eq(r.part[PLAN_SHARED].gpu, 3 * 64 * 256 * 4);
	/* vocab-parallel bf16: 500 x 256 x 2 each */
	cr_assert_eq(r.part[PLAN_EMBED].gpu, 500 * 256 * 2);
	cr_assert_eq(r.part[PLAN_LM_HEAD].gpu, 500 * 256 * 2);
	/* norms: 2 layers x (2 x 256 + q_a 128 + kv_a 128 + k_norm 2 x 64) + final 256, bf16 */
	cr_assert_eq(r.part[PLAN_NORMS].params, 2 * (512 + 128 + 128 + 128) + 256);
	uint64_t sum = 0;
	for (int i = 0; i < PLAN_NPARTS; i++)
		sum += r.part[i].gpu;
	cr_assert_eq(r.gpu, sum);
	cr_assert_eq(r.all_gpus, 2 * sum);
	cr_assert_gt(r.mtp.params, 0);
	/* KV per token per GPU, bf16: 2 x (128 + 32) x 2 + indexer 2 x 64 x 2 = 896 */
	cr_assert_eq(r.kv_main, 640);
	cr_assert_eq(r.kv_index, 256);
	cr_assert_eq(r.kv_gpu, 896);
	cr_assert_eq(r.kv_node, 2 * 896);
	cr_assert(r.kv_replicated);
	/* capacity: (1 GB - weights - workspace) / 896 tokens, sequences of 1000 */
	cr_assert_eq(r.budget, (int64_t)(1 * GB - r.gpu - r.ws.total));
	cr_assert_eq(r.kv_tokens_gpu, (uint64_t)r.budget / 896);
	cr_assert_eq(r.max_seqs, r.kv_tokens_gpu / 1000);
	cr_assert(r.fits && r.fits_weights);
	/* workspace, B = 16, C = 1000, Hg = 2: hidden 4*16*256*4 = 65536; attention
	 * 16*2*(128 + 2*64 + 160 + 2*160 + 2*128 + 2*64) = 35840; indexer
	 * 16*(2*2*64 + 4*2 + 4*1000 + 4*16) = 69248; logits 16*4*(500 + 1000) = 96000 */
	cr_assert_eq(r.ws.hidden, 65536);
	cr_assert_eq(r.ws.attn, 35840);
	cr_assert_eq(r.ws.indexer, 69248);
	cr_assert_eq(r.ws.logits, 96000);
	/* ffn: dense 16*2*2*256 = 16384; MoE 16*(4*4 + 4*2*256 + 4*2*128 + 4*128/2) = 53504 */
	cr_assert_eq(r.ws.ffn, 53504);
	cr_assert_eq(r.ws.total, 65536 + 35840 + 69248 + 96000);

	/* fp8 KV: latent 128 + one f32 scale + rope 32 x 2 = 196 per layer; keys 64 + 4 */
	struct plan_opts o = opts(2, 2);
	o.kv = PLAN_FP8;
	compute(&m, o, &r);
	cr_assert_eq(r.kv_gpu, 2 * 196 + 2 * 68);

	/* bf16 weights on request: attention doubles its params' bytes, no scales */
	o = opts(2, 2);
	o.weights = PLAN_BF16;
	compute(&m, o, &r);
	cr_assert_eq(r.part[PLAN_ATTN].bytes, 2 * 2 * 221184);
	cr_assert_eq(r.part[PLAN_SHARED].gpu, 3 * 64 * 256 * 2);
}

/* FP8 requested for a bf16 checkpoint: each shard is quantized on its own 128 grid (wick
 * snapshot --dtype fp8), so nothing is dequantized. */
Test(plan, fp8_cast)
{
	struct plan_model m;
	struct plan_result r;
	json_error_t je;
	json_t *cfg = json_loads(tiny_mla, 0, &je);
	json_object_del(cfg, "quantization_config");
	char err[WK_ERRSZ] = "";
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_OK, "%s", err);
	json_decref(cfg);
	cr_assert(!m.fp8);
	struct plan_opts o = opts(2, 2);
	compute(&m, o, &r);
	cr_assert_eq(r.weights, PLAN_BF16);
	o.weights = PLAN_FP8;
	compute(&m, o, &r);
	/* shared expert over tp 2: [64][256] 16384 + 1x2 scales, [256][64] 16384 + 2x1 */
	cr_assert_eq(r.part[PLAN_SHARED].gpu, 3 * (16384 + 8));
	cr_assert_eq(r.part[PLAN_ATTN].gpu, 2 * (32776 + 16388 + 40976 + 24584 + 32776));
}

Test(plan, layouts)
{
	struct plan_model m;
	struct plan_result r;
	model(tiny_mla, &m);
	/* tp 1 ep 4: 1 expert per GPU; attention whole on each GPU (4 redundant copies), which
	 * adds no capacity: the node holds what one GPU holds */
	compute(&m, opts(1, 4), &r);
	cr_assert_eq(r.world, 4);
	cr_assert_eq(r.attn_copies, 4);
	cr_assert_eq(r.expert_copies, 1);
	cr_assert_eq(r.experts_per_gpu, 1);
	cr_assert_eq(r.part[PLAN_ATTN].gpu, r.part[PLAN_ATTN].bytes);
	cr_assert_eq(r.max_seqs, r.kv_tokens_gpu / 1000);
	cr_assert_eq(r.kv_node, 4 * r.kv_gpu);
	/* tp 4 ep 2: 2 whole experts per GPU, each on 2 GPUs */
	compute(&m, opts(4, 2), &r);
	cr_assert_eq(r.experts_per_gpu, 2);
	cr_assert_eq(r.expert_copies, 2);
	cr_assert_eq(r.part[PLAN_ROUTED].gpu, 2 * 3 * (32768 + 8));
}

static void refused(const char *cfg, struct plan_opts o, const char *msg)
{
	struct plan_model m;
	struct plan_result r;
	char err[WK_ERRSZ] = "";
	model(cfg, &m);
	cr_assert_eq(plan_compute(&m, &o, &r, err, sizeof err), WK_EINVAL, "accepted (%s)", msg);
	cr_assert(strstr(err, msg), "message '%s' lacks '%s'", err, msg);
}

Test(plan, refusals)
{
	refused(tiny_mla, opts(3, 1), "--tp 3 does not divide num_attention_heads 4");
	refused(tiny_mla, opts(1, 3), "--ep 3 does not divide n_routed_experts 4");
	refused(tiny_mla, opts(2, 3), "the smaller must divide the larger");
	refused(tiny_mla, opts(8, 1), "--tp 8 does not divide num_attention_heads 4");
	struct plan_opts o = opts(2, 2);
	o.gpus = 8;
	refused(tiny_mla, o, "--gpus 8");
	o = opts(2, 2);
	o.context = 0; /* -> max_position_embeddings: fine */
	o.batch = 0;
	refused(tiny_mla, o, "--batch");
	o = opts(256, 1);
	refused(tiny_mla, o, "a world of 256 ranks is more than 64"); /* no snapshot can hold it */
	o = opts(1, 128);
	refused(tiny_mla, o, "a world of 128 ranks is more than 64");
	/* sizes inside each field's range whose product passes 64 bits: refused, not wrapped
	 * into negative bytes */
	static const char *huge =
		"{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\","
		" \"hidden_size\": 1048576, \"num_hidden_layers\": 4096, \"num_attention_heads\": 4,"
		" \"vocab_size\": 1000, \"max_position_embeddings\": 4096, \"q_lora_rank\": 128,"
		" \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": 32,"
		" \"v_head_dim\": 64, \"index_n_heads\": 2, \"index_head_dim\": 64,"
		" \"index_topk\": 16, \"intermediate_size\": 512, \"moe_intermediate_size\": 16777216,"
		" \"n_routed_experts\": 1048576, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2,"
		" \"first_k_dense_replace\": 1, \"dtype\": \"bfloat16\"}";
	refused(huge, opts(1, 1), "cannot be planned");
}

/* GQA: 8 heads, 2 kv heads, tp 4 -> one kv head per GPU, replicated. */
static const char *tiny_gqa =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 3,"
	" \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"vocab_size\": 100,"
	" \"intermediate_size\": 128, \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\"}";

Test(plan, gqa)
{
	struct plan_model m;
	struct plan_result r;
	model(tiny_gqa, &m);
	cr_assert(!m.mla && m.known_arch);
	cr_assert_eq(m.head_dim, 8);
	struct plan_opts o = opts(4, 1);
	o.context = 10;
	compute(&m, o, &r);
	cr_assert_eq(r.kv_heads_per_gpu, 1);
	cr_assert(r.kv_replicated);
	cr_assert_eq(r.kv_gpu, 3 * 2 * 1 * 8 * 2);
	/* f32 weights: q [16][64], k, v [8][64] (one replicated kv head), o [64][16] */
	cr_assert_eq(r.part[PLAN_ATTN].gpu, 3 * 4 * (16 * 64 + 8 * 64 + 8 * 64 + 64 * 16));
	cr_assert_eq(r.part[PLAN_LM_HEAD].params, 0);
	cr_assert_eq(r.part[PLAN_EMBED].gpu, 25 * 64 * 4);
	cr_assert_eq(r.params, 100 * 64 + 3 * (64 * 64 + 2 * 16 * 64 + 64 * 64 + 3 * 128 * 64 +
						   2 * 64) + 64);
	/* no max_position_embeddings and no --context */
	o.context = 0;
	char err[WK_ERRSZ];
	cr_assert_eq(plan_compute(&m, &o, &r, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "--context"), "%s", err);
	/* tp 3 divides neither the heads nor the kv heads */
	refused(tiny_gqa, opts(3, 1), "--tp 3 does not divide num_attention_heads 8");
	refused(tiny_gqa, opts(1, 2), "--ep 2: the model has no routed experts");
	refused(tiny_gqa, opts(8, 1), "--tp 8 does not divide vocab_size 100");
}

Test(plan, config_fields)
{
	struct plan_model m;
	json_error_t je;
	char err[WK_ERRSZ] = "";
	/* indexer_types: shared layers have no indexer and no key cache */
	json_t *cfg = json_loads(tiny_mla, 0, &je);
	json_object_set_new(cfg, "indexer_types", json_pack("[s, s]", "full", "shared"));
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(m.index_full_layers, 1);
	/* mlp_layer_types overrides first_k_dense_replace */
	json_object_set_new(cfg, "mlp_layer_types", json_pack("[s, s]", "sparse", "sparse"));
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(m.moe_layers, 2);
	/* another quantization: a warning, weights default to the checkpoint dtype */
	json_object_set_new(cfg, "quantization_config",
			    json_pack("{s:s}", "quant_method", "compressed-tensors"));
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_OK, "%s", err);
	cr_assert(!m.fp8);
	cr_assert_eq(m.nwarn, 1);
	cr_assert(strstr(m.warn[0], "compressed-tensors"), "%s", m.warn[0]);
	/* errors name the field */
	json_object_set_new(cfg, "hidden_size", json_string("big"));
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "'hidden_size'"), "%s", err);
	json_object_set_new(cfg, "hidden_size", json_integer(256));
	json_object_set_new(cfg, "quantization_config",
			    json_pack("{s:s, s:[i]}", "quant_method", "fp8", "weight_block_size",
				      128));
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "weight_block_size"), "%s", err);
	json_decref(cfg);
	cfg = json_pack("{s:i, s:i, s:i, s:i, s:i}", "hidden_size", 64, "vocab_size", 10,
			"num_hidden_layers", 1, "num_attention_heads", 1, "num_experts", 8);
	cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_EUNSUPPORTED);
	cr_assert(strstr(err, "'num_experts'"), "%s", err);
	json_decref(cfg);
}

/* The plan's KV cache per token, f32, bf16 and fp8, is what the engine allocates
 * (eng_seq_cache_bytes, which every family's load holds its allocation to): on the real GLM-5
 * and GLM-4.5 configs and stories260K, at every tp that divides them; and on GLM-5 with shared
 * indexer layers (index_topk_freq 3: every third layer its own indexer), whose others cache
 * no indexer keys. */
Test(plan, kv_cache_is_the_engines)
{
	static const char *const files[] = {"tests/fuzz/corpus/config/glm5.json",
					    "tests/fuzz/corpus/config/glm45.json",
					    "tests/fuzz/corpus/config/stories260K.json"};
	for (size_t f = 0; f <= sizeof files / sizeof files[0]; f++) {
		json_error_t je;
		bool shared = f == sizeof files / sizeof files[0];
		json_t *cfg = json_load_file(files[shared ? 0 : f], 0, &je);
		cr_assert_not_null(cfg, "%s: %s", files[shared ? 0 : f], je.text);
		const char *name = shared ? "glm5 index_topk_freq 3" : files[f];
		if (shared)
			json_object_set_new(cfg, "index_topk_freq", json_integer(3));
		struct plan_model m;
		char err[WK_ERRSZ] = "";
		cr_assert_eq(plan_model_read(cfg, &m, err, sizeof err), WK_OK, "%s", err);
		const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
		int checked = 0;
		for (int i = 0; i < 12; i++) {
			int tp = 1 << (i / 3);
			static const enum dt_type kvs[3] = {DT_F32, DT_BF16, DT_F8_E4M3};
			static const enum plan_dtype pks[3] = {PLAN_F32, PLAN_BF16, PLAN_FP8};
			static const char *const kn[3] = {"f32", "bf16", "fp8"};
			uint64_t bytes;
			int ms; /* 4096, or the model's max_position_embeddings below it */
			enum dt_type kv = kvs[i % 3];
			int rc = eng_seq_cache_bytes(arch, cfg, 4096, tp, kv, false, &ms, &bytes,
						     err, sizeof err);
			cr_assert_eq(rc, WK_OK, "%s: %s", name, err);
			struct plan_opts o = opts(tp, 1);
			o.kv = pks[i % 3];
			o.gpu_mem = 1000 * GB;
			o.context = ms;
			struct plan_result r;
			if (plan_compute(&m, &o, &r, err, sizeof err) != WK_OK)
				continue; /* a tp this model cannot split over */
			cr_expect_eq(bytes, r.kv_gpu * (uint64_t)ms, "%s at tp %d %s: the engine "
				     "allocates %llu bytes a sequence, the plan counts %llu", name,
				     tp, kn[i % 3],
				     (unsigned long long)bytes, (unsigned long long)(r.kv_gpu * ms));
			checked++;
		}
		cr_expect_gt(checked, 0, "%s: no tp planned", name);
		json_decref(cfg);
	}
}
