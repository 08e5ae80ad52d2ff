# wick plan: memory plans from config.json alone, checked against independent arithmetic.
#  1. the real GLM-5-FP8 config (values from ../shared/reference/glm.md 1.2 and 2.2) on 8 x H200,
#     tp 8 ep 8, at 128K and 200K context: every number recomputed here in Python by listing
#     the checkpoint's tensors by name and slicing them by the layout rules; the total matches
#     the published 744B (743.7B computed in glm.md) and the MTP layer the ~10B on top; KV per
#     token matches glm.md 3.2 (576 values/layer + indexer keys; 656 B/layer in fp8);
#  2. other layouts (tp 4 ep 8: attention shards on two GPUs each; tp 8 ep 4: experts on two
#     GPUs each), bf16 weights (does not fit, with the shortfall), fp8 KV;
#  3. the GLM-4.5 config: 355B published, KV 368 KiB per token (glm.md 1.3);
#  4. real checkpoints: stories260K and tiny GLM-5 (FP8, 128x128 scales) / GLM-4.5 from gen_glm:
#     the plan's parameters and bytes equal `wick inspect`'s count of the safetensors, and its
#     bytes per GPU equal the rank files of `wick snapshot --tp T --ep E` at several layouts;
#  5. bad inputs: clear errors, exit 2 (usage/layout) or 1 (config).
source tests/e2e/lib.sh

cat >"$TMPD/glm5.json" <<'EOF'
{
  "architectures": ["GlmMoeDsaForCausalLM"],
  "model_type": "glm_moe_dsa",
  "attention_bias": false,
  "attention_dropout": 0.0,
  "dtype": "bfloat16",
  "eos_token_id": [154820, 154827, 154829],
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 6144,
  "index_head_dim": 128,
  "index_n_heads": 32,
  "index_topk": 2048,
  "indexer_rope_interleave": true,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "kv_lora_rank": 512,
  "max_position_embeddings": 202752,
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 78,
  "num_key_value_heads": 64,
  "num_nextn_predict_layers": 1,
  "pad_token_id": 154820,
  "pretraining_tp": 1,
  "q_lora_rank": 2048,
  "qk_head_dim": 256,
  "qk_nope_head_dim": 192,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05,
  "rope_interleave": true,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "transformers_version": "5.0.2.dev0",
  "use_cache": true,
  "v_head_dim": 256,
  "vocab_size": 154880,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}
}
EOF

cat >"$TMPD/glm45.json" <<'EOF'
{
  "architectures": ["Glm4MoeForCausalLM"],
  "model_type": "glm4_moe",
  "attention_bias": true,
  "first_k_dense_replace": 3,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "intermediate_size": 12288,
  "max_position_embeddings": 131072,
  "moe_intermediate_size": 1536,
  "n_group": 1,
  "n_routed_experts": 160,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 96,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 92,
  "num_key_value_heads": 8,
  "num_nextn_predict_layers": 1,
  "partial_rotary_factor": 0.5,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000,
  "routed_scaling_factor": 2.5,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "torch_dtype": "bfloat16",
  "use_qk_norm": true,
  "vocab_size": 151552
}
EOF

# ---- 1-3: the production configs, every number recomputed ----
plan() { # plan NAME ARGS...: wick plan --format json ARGS > $TMPD/NAME.json
  local name=$1; shift
  "$WICK" plan --format json "$@" >"$TMPD/$name.json" || fail "wick plan $* exited $?"
}
G5=(--config "$TMPD/glm5.json" --tp 8 --ep 8 --gpus 8 --gpu-mem 141GB)
plan g5_128k "${G5[@]}" --context 131072
plan g5_200k "${G5[@]}" --context 200000
plan g5_fp8kv "${G5[@]}" --context 200000 --kv-dtype fp8
plan g5_f32kv "${G5[@]}" --context 200000 --kv-dtype f32
plan g5_auto "${G5[@]}" --context 200000 --kv-dtype f32 --kv-dtype auto
plan g5_bf16 "${G5[@]}" --context 131072 --weights-dtype bf16
plan g5_mtp "${G5[@]}" --context 131072 --mtp
plan g5_tp4 --config "$TMPD/glm5.json" --tp 4 --ep 8 --gpu-mem 141GB --context 131072
plan g5_ep4 --config "$TMPD/glm5.json" --tp 8 --ep 4 --gpu-mem 141GiB --context 131072 --batch 512
plan g45 --config "$TMPD/glm45.json" --tp 8 --ep 8 --gpus 8 --gpu-mem 141GB --context 131072
plan g45_kv8 --config "$TMPD/glm45.json" --tp 8 --ep 8 --gpus 8 --gpu-mem 141GB --context 131072 \
  --kv-dtype fp8
plan g45_fp8 --config "$TMPD/glm45.json" --tp 8 --ep 8 --gpus 8 --gpu-mem 141GB --weights-dtype fp8 \
  --kv-dtype fp8

python3 - "$TMPD" <<'PY'
import json, math, sys
tmp = sys.argv[1]
GB, GiB = 10**9, 2**30
def load(n): return json.load(open(f"{tmp}/{n}.json"))
def cdiv(a, b): return -(-a // b)
def check(cond, msg):
    if not cond:
        print("FAIL:", msg); sys.exit(1)

def tensors(c, mtp=False):
    """(name, rows, cols, split) for every tensor of the checkpoint, by its HF name.
    split: rep | tp_rows | tp_cols | kv_rows | vocab | expert (whole, on its EP rank)."""
    d, L, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    out = [("model.embed_tokens.weight", c["vocab_size"], d, "vocab"),
           ("model.norm.weight", d, 1, "rep")]
    if not c.get("tie_word_embeddings"):
        out.append(("lm_head.weight", c["vocab_size"], d, "vocab"))
    layers = list(range(L)) + ([L + i for i in range(c.get("num_nextn_predict_layers", 0))] if mtp else [])
    for l in layers:
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", d, 1, "rep"), (p + "post_attention_layernorm.weight", d, 1, "rep")]
        a = p + "self_attn."
        if "kv_lora_rank" in c:
            ql, kl, nope, rope, v = c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
            out += [(a + "q_a_proj.weight", ql, d, "rep"), (a + "q_a_layernorm.weight", ql, 1, "rep"),
                    (a + "q_b_proj.weight", H * (nope + rope), ql, "tp_rows"),
                    (a + "kv_a_proj_with_mqa.weight", kl + rope, d, "rep"), (a + "kv_a_layernorm.weight", kl, 1, "rep"),
                    (a + "kv_b_proj.weight", H * (nope + v), kl, "tp_rows"), (a + "o_proj.weight", d, H * v, "tp_cols")]
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            out += [(a + "indexer.wq_b.weight", ih * idim, ql, "rep"), (a + "indexer.wk.weight", idim, d, "rep"),
                    (a + "indexer.k_norm.weight", idim, 1, "rep"), (a + "indexer.k_norm.bias", idim, 1, "rep"),
                    (a + "indexer.weights_proj.weight", ih, d, "rep")]
        else:
            kv, hd = c["num_key_value_heads"], c["head_dim"]
            out += [(a + "q_proj.weight", H * hd, d, "tp_rows"), (a + "k_proj.weight", kv * hd, d, "kv_rows"),
                    (a + "v_proj.weight", kv * hd, d, "kv_rows"), (a + "o_proj.weight", d, H * hd, "tp_cols")]
            if c.get("attention_bias"):
                out += [(a + "q_proj.bias", H * hd, 1, "tp_rows"), (a + "k_proj.bias", kv * hd, 1, "kv_rows"),
                        (a + "v_proj.bias", kv * hd, 1, "kv_rows")]
            if c.get("use_qk_norm"):
                out += [(a + "q_norm.weight", hd, 1, "rep"), (a + "k_norm.weight", hd, 1, "rep")]
        m = p + "mlp."
        if l < c.get("first_k_dense_replace", 0):
            i = c["intermediate_size"]
            out += [(m + "gate_proj.weight", i, d, "tp_rows"), (m + "up_proj.weight", i, d, "tp_rows"),
                    (m + "down_proj.weight", d, i, "tp_cols")]
        else:
            E, mi = c["n_routed_experts"], c["moe_intermediate_size"]
            out += [(m + "gate.weight", E, d, "rep"), (m + "gate.e_score_correction_bias", E, 1, "rep")]
            x = f"{m}experts.*."   # all E experts: one entry each, counted E times below
            out += [(x + "gate_proj.weight", mi, d, "expert"), (x + "up_proj.weight", mi, d, "expert"),
                    (x + "down_proj.weight", d, mi, "expert")]
            s = mi * c.get("n_shared_experts", 1)
            out += [(m + "shared_experts.gate_proj.weight", s, d, "tp_rows"), (m + "shared_experts.up_proj.weight", s, d, "tp_rows"),
                    (m + "shared_experts.down_proj.weight", d, s, "tp_cols")]
        if l >= L:
            out += [(p + "eh_proj.weight", d, 2 * d, "rep"), (p + "enorm.weight", d, 1, "rep"),
                    (p + "hnorm.weight", d, 1, "rep"), (p + "shared_head.norm.weight", d, 1, "rep")]
    return out

def nbytes(name, rows, cols, wdt, base, block, full=None):
    """full: the unsharded (rows, cols) of a shard of an FP8 checkpoint; a shard cut off the
    block grid is stored dequantized, f32 (engine/layout.c)"""
    if name.endswith("e_score_correction_bias"): return rows * cols * 4
    quant = cols > 1 and name.startswith("model.layers.") and (
        (name.endswith("_proj.weight") and "weights_proj" not in name and "eh_proj" not in name)
        or name.endswith("kv_a_proj_with_mqa.weight") or name.endswith("indexer.wq_b.weight")
        or name.endswith("indexer.wk.weight"))
    size = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1}
    if quant and wdt == "fp8":
        if full and ((rows != full[0] and rows % block[0]) or (cols != full[1] and cols % block[1])):
            return rows * cols * 4
        return rows * cols + cdiv(rows, block[0]) * cdiv(cols, block[1]) * 4
    if cols == 1: return rows * size[base]
    return rows * cols * size[base if wdt == "fp8" else wdt]

def expect_plan(c, j, tp, ep, wdt, base="bf16", block=(128, 128)):
    world = max(tp, ep)
    src_fp8 = c.get("quantization_config", {}).get("quant_method") == "fp8" and wdt == "fp8"
    kv = c.get("num_key_value_heads", 1)
    params = total = gpu = 0
    for name, r, k, split in tensors(c):
        n, ng = 1, 1
        if ".experts.*." in name:   # rank 0 holds experts [0, E/ep), whole
            n, ng = c["n_routed_experts"], c["n_routed_experts"] // ep
        params += n * r * k
        total += n * nbytes(name, r, k, wdt, base, block)
        gr, gc = {"rep": (r, k), "tp_rows": (r // tp, k), "tp_cols": (r, k // tp),
                  "kv_rows": (r // kv * max(1, kv // tp), k), "vocab": (r // tp, k),
                  "expert": (r, k)}[split]
        gpu += ng * nbytes(name, gr, gc, wdt, base, block, (r, k) if src_fp8 else None)
    w = j["weights"]
    check(w["params"] == params, f"params {w['params']} != {params}")
    check(w["bytes"] == total, f"bytes {w['bytes']} != {total}")
    check(w["per_gpu_bytes"] == gpu, f"per GPU {w['per_gpu_bytes']} != {gpu}")
    check(w["all_gpus_bytes"] == gpu * world, "all_gpus_bytes")
    check(sum(p["params"] for p in w["parts"]) == params, "parts do not add up")
    return params, total, gpu

def expect_memory(c, j, tp, ep, ctx, batch, kvdt, gpu_mem, reserve=4 * GiB):
    world = max(tp, ep); d = c["hidden_size"]; L = c["num_hidden_layers"]
    Hg = c["num_attention_heads"] // tp; V = c["vocab_size"]
    if "kv_lora_rank" in c:
        kl, rope, idim = c["kv_lora_rank"], c["qk_rope_head_dim"], c["index_head_dim"]
        if kvdt == "fp8":
            kvtok = L * (kl + cdiv(kl, 128) * 4 + rope * 2) + L * (idim + cdiv(idim, 128) * 4)
        else:
            b = 4 if kvdt == "f32" else 2
            kvtok = L * (kl + rope) * b + L * idim * b
        attn = batch * 2 * (c["q_lora_rank"] + Hg * (c["qk_nope_head_dim"] + rope) + kl + rope
                            + Hg * (kl + rope) + Hg * kl + Hg * c["v_head_dim"])
        ih = c["index_n_heads"]
        idx = batch * (2 * ih * idim + 4 * ih + 4 * ctx + 4 * c["index_topk"])
    else:
        kvg = max(1, c["num_key_value_heads"] // tp); hd = c["head_dim"]
        # fp8: each kv head's row of codes with one f32 scale per 128
        per = hd + cdiv(hd, 128) * 4 if kvdt == "fp8" else hd * {"bf16": 2, "f32": 4}[kvdt]
        kvtok = L * 2 * kvg * per
        attn = batch * 2 * ((Hg + 2 * kvg) * hd + Hg * hd); idx = 0
    k, mi, E = c["num_experts_per_tok"], c["moe_intermediate_size"], c["n_routed_experts"]
    ffn = max(batch * 4 * c["intermediate_size"] // tp,
              batch * (4 * E + 4 * k * d + 4 * k * mi + 4 * mi * c["n_shared_experts"] // tp))
    ws = 4 * batch * d * 4 + max(attn + idx, ffn) + batch * 4 * (cdiv(V, tp) + V)
    kvj, mem = j["kv_cache"], j["memory"]
    check(kvj["bytes_per_token_per_gpu"] == kvtok, f"kv/token {kvj['bytes_per_token_per_gpu']} != {kvtok}")
    check(j["workspace"]["per_gpu_bytes"] == ws, f"workspace {j['workspace']['per_gpu_bytes']} != {ws}")
    head = gpu_mem - j["weights"]["per_gpu_bytes"] - ws - reserve
    check(mem["headroom_bytes"] == head, f"headroom {mem['headroom_bytes']} != {head}")
    toks = max(head, 0) // kvtok   # every GPU holds every sequence: the node holds no more
    check(kvj["tokens"] == toks, f"tokens {kvj['tokens']} != {toks}")
    check(kvj["bytes_per_token_all_gpus"] == kvtok * world, "bytes_per_token_all_gpus")
    seqs = toks // ctx
    check(kvj["max_sequences"] == seqs, f"sequences {kvj['max_sequences']} != {seqs}")
    check(mem["fits"] == (seqs >= 1), "fits")
    if seqs == 0:
        check(mem["shortfall_bytes"] == ctx * kvtok - head, "shortfall")
    return kvtok, toks, seqs

c5 = json.load(open(f"{tmp}/glm5.json")); c45 = json.load(open(f"{tmp}/glm45.json"))

# GLM-5-FP8, 8 x H200, tp 8 ep 8
r = {}
for name, ctx in (("g5_128k", 131072), ("g5_200k", 200000)):
    j = load(name)
    params, total, gpu = expect_plan(c5, j, 8, 8, "fp8")
    kvtok, toks, seqs = expect_memory(c5, j, 8, 8, ctx, 2048, "bf16", 141 * GB)
    r[name] = (gpu, toks, seqs, j["memory"]["headroom_bytes"])
check(abs(params - 743.7e9) / 743.7e9 < 0.001, f"GLM-5 params {params} vs 743.7B computed in glm.md")
check(abs(params - 744e9) / 744e9 < 0.005, f"GLM-5 params {params} vs the published 744B")
j = load("g5_128k")
mtp = j["mtp"]
check(mtp["counted"] is False and mtp["layers"] == 1, "MTP must be reported apart, not counted")
mp = sum(r_ * k * (c5["n_routed_experts"] if ".experts.*." in n else 1)
         for n, r_, k, s in tensors(c5, mtp=True)) - params
check(mtp["params"] == mp, f"MTP params {mtp['params']} != {mp}")
check(abs(params + mp - 754e9) / 754e9 < 0.01, "with MTP the total should be ~754B")
# --mtp: the one MTP layer wick loads to draft, in the weights and (a full layer with its own
# indexer) in the KV cache
jm = load("g5_mtp")
check(jm["mtp"]["counted"] is True, "--mtp counts the MTP layer")
check(jm["weights"]["params"] == params + mp, "--mtp: the weights with the MTP layer")
check(jm["weights"]["per_gpu_bytes"] == j["weights"]["per_gpu_bytes"] + jm["mtp"]["per_gpu_bytes"],
      "--mtp: per GPU")
check(jm["kv_cache"]["bytes_per_token_per_gpu"] == 79 * 576 * 2 + 79 * 128 * 2,
      "--mtp: KV of 79 layers")
check(jm["kv_cache"]["max_sequences"] <= j["kv_cache"]["max_sequences"], "--mtp holds no more")
check(abs(total - 746e9) / 746e9 < 0.01, f"GLM-5-FP8 bytes {total} vs ~746 GB in glm.md 2.2")
# weights per GPU = the sharded parts / 8 + the replicated parts (attention down-projections,
# indexer, router, norms): about 93 GB + a few
check(total / 8 < gpu < total / 8 + 3 * GB, f"per GPU {gpu} vs total/8 {total / 8}")
check(j["kv_cache"]["bytes_per_token_per_gpu"] == 78 * 576 * 2 + 78 * 128 * 2, "GLM-5 KV bf16 (the engine's default for its bfloat16 checkpoint)")
check(j["kv_cache"]["replicated_over_tp"] is True, "MLA latent is replicated over TP")
# with the engine's bf16 caches GLM-5's full 200K context fits (with f32 caches it did not)
check(r["g5_128k"][2] >= 1, "GLM-5-FP8 must fit 8 x H200 at 128K")
check(r["g5_200k"][2] >= 1, "GLM-5-FP8 must fit 8 x H200 at its full 200K context in bf16 KV")
_, _, s32 = expect_memory(c5, load("g5_f32kv"), 8, 8, 200000, 2048, "f32", 141 * GB)
check(s32 == 0, f"with f32 KV GLM-5's 200K context fits {s32} sequences, expected none")
check(load("g5_auto") == load("g5_200k"), "--kv-dtype auto is the default")
# a plan says what the engine's fp8 cache would hold: --kv-dtype fp8's own count (MLA, GQA)
check(load("g5_200k")["kv_cache"].get("max_sequences_fp8") ==
      load("g5_fp8kv")["kv_cache"]["max_sequences"] == 3, "max_sequences_fp8")
g45_8 = load("g45_kv8")["kv_cache"]["max_sequences"]
check(load("g45")["kv_cache"].get("max_sequences_fp8") == g45_8 >
      load("g45")["kv_cache"]["max_sequences"], f"GLM-4.5 max_sequences_fp8 {g45_8}")
check("max_sequences_fp8" not in load("g5_fp8kv")["kv_cache"], "max_sequences_fp8 on an fp8 plan")
check(r["g5_128k"][1] > r["g5_200k"][1], "a longer context has a bigger indexer workspace")
j = load("g5_fp8kv")
expect_memory(c5, j, 8, 8, 200000, 2048, "fp8", 141 * GB)
check(j["kv_cache"]["main_bytes_per_token_per_gpu"] == 78 * 656, "fp8 MLA cache is 656 B/layer (glm.md 3.2)")
# bf16 weights: ~1.5 TB does not fit 8 x 141 GB
j = load("g5_bf16")
expect_plan(c5, j, 8, 8, "bf16")
expect_memory(c5, j, 8, 8, 131072, 2048, "bf16", 141 * GB)
check(not j["memory"]["fits"] and not j["memory"]["fits_weights"] and j["memory"]["shortfall_bytes"] > 40 * GB,
      "GLM-5 in bf16 must not fit 8 x H200")
# other layouts
j = load("g5_tp4"); expect_plan(c5, j, 4, 8, "fp8"); expect_memory(c5, j, 4, 8, 131072, 2048, "bf16", 141 * GB)
check(j["layout"]["attention_copies"] == 2, "tp 4 on 8 GPUs: each attention shard on two GPUs")
j = load("g5_ep4"); expect_plan(c5, j, 8, 4, "fp8"); expect_memory(c5, j, 8, 4, 131072, 512, "bf16", 141 * GiB)
check(j["layout"]["experts_per_gpu"] == 64 and j["layout"]["expert_copies"] == 2, "ep 4 on 8 GPUs")

# GLM-4.5 (bf16 config; fp8 on request = 128x128 blocks, wick snapshot --dtype fp8)
j = load("g45")
p45, _, _ = expect_plan(c45, j, 8, 8, "bf16")
expect_memory(c45, j, 8, 8, 131072, 2048, "bf16", 141 * GB)
check(abs(p45 - 355e9) / 355e9 < 0.015, f"GLM-4.5 params {p45} vs the published 355B")
check(j["kv_cache"]["bytes_per_token_all_gpus"] == 368 * 1024, "GLM-4.5 KV is 368 KiB/token in bf16 (glm.md 1.3), the engine's default for it")
j = load("g45_fp8")
expect_plan(c45, j, 8, 8, "fp8")
expect_memory(c45, j, 8, 8, 131072, 2048, "fp8", 141 * GB)
j = load("g45_kv8")
expect_memory(c45, j, 8, 8, 131072, 2048, "fp8", 141 * GB)
check(j["kv_cache"]["bytes_per_token_all_gpus"] == 92 * 2 * 8 * 132,
      "GLM-4.5's fp8 KV: 132 B a kv head of 128 (codes + one f32 scale)")
print(f"GLM-4.5 at 128K on 8 x H200: {load('g45')['kv_cache']['max_sequences']} sequences on bf16 "
      f"KV, {j['kv_cache']['max_sequences']} on fp8")
for n in ("g5_128k", "g5_200k"):
    gpu, toks, seqs, head = r[n]
    print(f"{n}: weights/GPU {gpu / GB:.2f} GB, headroom {head / GB:.2f} GB, KV tokens/GPU {toks}, sequences {seqs}")
PY

# the table says the same, and names the assumptions
"$WICK" plan "${G5[@]}" --context 200000 >"$TMPD/t.txt" || fail "table exited $?"
for want in "routed_experts" "MTP x1 (not loaded)" "DSA indexer keys" "KV cache tokens" \
  "max concurrent sequences" "fits" "assumptions" "reserve: 4.00 GiB"; do
  grep -qF "$want" "$TMPD/t.txt" || fail "the table lacks '$want'"
done
tok=$(python3 -c 'import json,sys; print(format(json.load(open(sys.argv[1]))["kv_cache"]["tokens"], ","))' \
  "$TMPD/g5_200k.json")
grep -q "KV cache tokens  *$tok " "$TMPD/t.txt" || fail "the table's KV tokens differ from the JSON's ($tok)"
# and what the engine's fp8 cache would hold, as --kv-dtype fp8's own plan says
s8=$(python3 -c 'import json,sys; print(format(json.load(open(sys.argv[1]))["kv_cache"]["max_sequences"], ","))' \
  "$TMPD/g5_fp8kv.json")
grep -q "with an fp8 KV cache  *$s8  *sequences of 200,000 tokens" "$TMPD/t.txt" ||
  fail "the table's fp8 line differs from --kv-dtype fp8's plan ($s8): $(grep fp8 "$TMPD/t.txt")"
"$WICK" plan "${G5[@]}" --context 200000 --kv-dtype fp8 >"$TMPD/t8.txt" || fail "fp8 table"
! grep -q "with an fp8 KV cache" "$TMPD/t8.txt" || fail "an fp8 plan offers fp8"
"$WICK" plan "${G5[@]}" --weights-dtype bf16 >"$TMPD/t.txt" || fail "bf16 table exited $?"
grep -q "fits  *NO" "$TMPD/t.txt" || fail "bf16 GLM-5 should print fits NO"

# ---- 4: real checkpoints: the plan counts what the safetensors hold ----
m=$(stories)
"$WICK" plan --config "$m" --format json >"$TMPD/st.json"
"$WICK" plan --config "$m" --tp 2 --gpus 2 --format json >"$TMPD/st2.json"
"$WICK" inspect --json "$m" >"$TMPD/st_i.json"
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/t5" >/dev/null
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/t5m" --mtp >/dev/null
"$WICK_TOOLS/gen_glm" --family glm4 -o "$TMPD/t4" >/dev/null
for t in t5 t5m t4; do
  "$WICK" inspect --json "$TMPD/$t" >"$TMPD/${t}_i.json"
  "$WICK" plan --config "$TMPD/$t" --format json >"$TMPD/${t}_p.json"
done
"$WICK" plan --config "$TMPD/t5/config.json" --tp 2 --ep 4 --format json >"$TMPD/t5_tp2.json"
# a snapshot's manifest config works too
"$WICK" snapshot "$TMPD/t5" -o "$TMPD/t5snap" >/dev/null 2>&1 || fail "wick snapshot t5"
"$WICK" plan --config "$TMPD/t5snap" --format json >"$TMPD/t5s_p.json"
cmp -s <(grep -v '"config"' "$TMPD/t5s_p.json") <(grep -v '"config"' "$TMPD/t5_p.json") ||
  fail "a snapshot plans differently from its HF directory"
# per GPU = the largest rank file of a sharded snapshot (tensor bytes, from its manifest), and
# all GPUs = their sum: FP8 shards on and off the 128 grid (off: stored f32), bf16, GQA, dense
"$WICK_TOOLS/gen_glm" --family glm5 --dtype bf16 -o "$TMPD/t5b" >/dev/null
# (t5m: snapshots that keep the MTP layer, --mtp, planned with --mtp and from their manifests)
for spec in "t5 2 2" "t5 4 4" "t5 1 2" "t5 2 4" "t5 4 2" "t5b 2 4" "t4 2 2" "t4 1 4" "st 2 1" \
            "t5m 1 1" "t5m 2 2" "t5m 2 4" "t5m 4 2"; do
  set -- $spec
  src=$TMPD/$1; [ "$1" = st ] && src=$m
  d="$TMPD/snap-$1-$2-$3"
  mtp=(); [ "$1" = t5m ] && mtp=(--mtp)
  "$WICK" snapshot "$src" -o "$d" --tp "$2" --ep "$3" ${mtp[@]+"${mtp[@]}"} >/dev/null 2>&1 ||
    fail "wick snapshot $src --tp $2 --ep $3 ${mtp[*]+"${mtp[*]}"}"
  "$WICK" plan --config "$src" --tp "$2" --ep "$3" ${mtp[@]+"${mtp[@]}"} --format json \
    >"$d.plan.json"
  # the snapshot itself, no flags: its own layout
  "$WICK" plan --config "$d" --format json >"$d.self.json" || fail "wick plan --config $d"
done
# a snapshot cast to fp8 and sharded: planned with its layout and dtype, as the flags would
"$WICK" snapshot "$TMPD/t4" -o "$TMPD/t4fp8" --dtype fp8 --tp 2 --ep 2 >/dev/null 2>&1 ||
  fail "wick snapshot t4 --dtype fp8"
"$WICK" plan --config "$TMPD/t4fp8" --format json >"$TMPD/t4fp8.self.json"
"$WICK" plan --config "$TMPD/t4" --tp 2 --ep 2 --weights-dtype fp8 --format json >"$TMPD/t4fp8.flags.json"
python3 - "$TMPD" "$TMPD"/snap-*.self.json <<'PY' || fail "a snapshot's own plan differs from its flags' plan"
import json, sys
def same(a, b):
    a, b = json.load(open(a)), json.load(open(b))
    return a["layout"] == b["layout"] and a["weights"]["per_gpu_bytes"] == b["weights"]["per_gpu_bytes"] \
        and a["weights"]["all_gpus_bytes"] == b["weights"]["all_gpus_bytes"]
for s in sys.argv[2:]:
    assert same(s, s[:-len(".self.json")] + ".plan.json"), s
assert same(f"{sys.argv[1]}/t4fp8.self.json", f"{sys.argv[1]}/t4fp8.flags.json"), "t4 fp8"
print(f"{len(sys.argv) - 1} snapshots planned from their manifests as their flags plan them")
PY
python3 - "$TMPD"/snap-*.plan.json <<'PY' || fail "plan vs sharded snapshots"
import json, sys
for pf in sys.argv[1:]:
    m, p = json.load(open(pf[:-len(".plan.json")] + "/manifest.json")), json.load(open(pf))
    ranks = [sum(t["nbytes"] for t in r["tensors"]) for r in m["ranks"]]
    w = p["weights"]
    if len(ranks) != p["layout"]["gpus"] or max(ranks) != w["per_gpu_bytes"] or sum(ranks) != w["all_gpus_bytes"]:
        print(f"{pf}: snapshot ranks {ranks}, plan per GPU {w['per_gpu_bytes']}, all {w['all_gpus_bytes']}")
        sys.exit(1)
print(f"{len(sys.argv) - 1} sharded snapshots match the plan")
PY
# a context past max_position_embeddings is planned, with a warning
"$WICK" plan --config "$TMPD/t5" --context 100000 >"$TMPD/t.txt" || fail "long context exited $?"
grep -q "context 100000 is more than max_position_embeddings 256" "$TMPD/t.txt" ||
  fail "no warning for a context past max_position_embeddings"
python3 - "$TMPD" <<'PY'
import json, sys
tmp = sys.argv[1]
def load(n): return json.load(open(f"{tmp}/{n}.json"))
def check(cond, msg):
    if not cond:
        print("FAIL:", msg); sys.exit(1)
for p, i in (("st", "st_i"), ("t5_p", "t5_i"), ("t4_p", "t4_i")):
    p, i = load(p), load(i)
    check(p["weights"]["params"] == i["parameters"], f"{i['model']}: params {p['weights']['params']} != inspect {i['parameters']}")
    check(p["weights"]["bytes"] == i["bytes"], f"{i['model']}: bytes {p['weights']['bytes']} != inspect {i['bytes']}")
st, st2 = load("st"), load("st2")
check(st["weights"]["params"] == 260032, "stories260K has 260,032 parameters")
check(st["kv_cache"]["bytes_per_token_per_gpu"] == 5 * 2 * 4 * 8 * 4, "stories KV per token (f32, as the engine holds it)")
check(st2["kv_cache"]["bytes_per_token_per_gpu"] == 5 * 2 * 2 * 8 * 4, "stories tp 2: 2 kv heads per GPU")
# the MTP layer the generator writes (model.layers.4.*) = the plan's MTP + its own copies of
# embed_tokens and shared_head.head, which the plan assumes are shared with the model's
p, i = load("t5m_p"), load("t5m_i")
c = json.load(open(f"{tmp}/t5m/config.json"))
vd = c["vocab_size"] * c["hidden_size"]
check(i["parameters"] == p["weights"]["params"] + p["mtp"]["params"] + 2 * vd, "MTP params")
check(i["bytes"] == p["weights"]["bytes"] + p["mtp"]["bytes"] + 2 * vd * 2, "MTP bytes")
check(load("t5_tp2")["layout"]["heads_per_gpu"] == 2, "tiny GLM-5 tp 2")
PY

# ---- 5: bad inputs ----
bad() { # bad RC MESSAGE ARGS...: wick plan ARGS exits RC and prints MESSAGE on stderr
  local rc=$1 msg=$2; shift 2
  set +e; "$WICK" plan "$@" >"$TMPD/out.txt" 2>"$TMPD/err.txt"; local got=$?; set -e
  [ "$got" = "$rc" ] || fail "wick plan $*: exit $got, want $rc ($(cat "$TMPD/err.txt"))"
  grep -qF -- "$msg" "$TMPD/err.txt" || fail "wick plan $*: stderr lacks '$msg': $(cat "$TMPD/err.txt")"
  [ ! -s "$TMPD/out.txt" ] || fail "wick plan $*: printed a plan on a failure"
}
C5=(--config "$TMPD/glm5.json")
bad 2 "--tp 3 does not divide num_attention_heads 64" "${C5[@]}" --tp 3 --gpus 3
bad 2 "--tp 3 --ep 8: the smaller must divide the larger" "${C5[@]}" --tp 3 --ep 8 --gpus 8
bad 2 "--ep 3 does not divide n_routed_experts 256" "${C5[@]}" --ep 3
bad 2 "--gpus 4: the layout --tp 8 --ep 8 runs on exactly max(tp, ep) = 8 GPUs" "${C5[@]}" --tp 8 --ep 8 --gpus 4
bad 2 "--gpu-mem '141XB': unknown unit 'XB'" "${C5[@]}" --tp 8 --ep 8 --gpu-mem 141XB
bad 2 "--reserve 'lots' is not a size" "${C5[@]}" --tp 8 --ep 8 --reserve lots
bad 2 "--weights-dtype 'int4': unknown dtype" "${C5[@]}" --weights-dtype int4
bad 2 "--kv-dtype 'fp4': unknown dtype" "${C5[@]}" --kv-dtype fp4
bad 2 "--format 'xml'" "${C5[@]}" --format xml
bad 2 "--ep 2: the model has no routed experts" --config "$m" --ep 2
bad 2 "--tp 12 and num_key_value_heads 8: one must divide the other" --config "$TMPD/glm45.json" --tp 12
bad 2 "--config CONFIG_JSON is required" --tp 8
bad 1 "--config $TMPD/missing.json: No such file or directory" --config "$TMPD/missing.json"
printf '{"hidden_size": 64,' >"$TMPD/trunc.json"
bad 1 "not valid JSON" --config "$TMPD/trunc.json"
printf '{"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 1, "num_local_experts": 8}' >"$TMPD/mix.json"
bad 1 "'num_local_experts' (Mixtral/Qwen-style MoE) is not understood" --config "$TMPD/mix.json"
printf '{"hidden_size": 64, "vocab_size": 10, "num_attention_heads": 1}' >"$TMPD/nolayers.json"
bad 1 "config.json: 'num_hidden_layers' is missing" --config "$TMPD/nolayers.json"
"$WICK" plan --help >"$TMPD/help.txt" || fail "--help exited $?"
grep -q -- "--gpu-mem SIZE" "$TMPD/help.txt" || fail "--help does not document --gpu-mem"
echo "plan_cli: ok"
