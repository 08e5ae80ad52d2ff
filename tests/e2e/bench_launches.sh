# `wick bench launches`: the ops and copies of a decode step, counted, match what the
# families issue, computed here from the structure. stories260K (Llama): 4 matmuls per layer
# (q, k and v as one matmul_n, o, gate and up as one, down) + lm_head, one attention per
# layer, k and v written straight into the caches, each residual add fused with the norm after
# it (add_rmsnorm), q and k rotated by one norm_n (bare rows, rotate_half); chained (below):
# the norm with q, k, v and their rotations, and o with the next norm and gate + up.
# GLM-5's structure (gen_glm --preset glm5-structure: 78 layers, 3 dense, 256 experts top-8,
# an indexer per layer) past index_topk (sparse): every MoE layer routes and runs its
# experts, the shared expert among them, in one grouped op (3 kernels on CUDA: the router
# inside the first, the shared expert's gate/up and down inside the second and third, the
# combine inside the third) after the router's matmul; the attention's 7 projections are 3 ops
# (q_a, kv_a, indexer wk and weights_proj read x; q_b and indexer wq_b read q_c; o_proj); a
# batch-1 step's keys land in their caches without copies; MLA's absorb_q, attention and absorb_out are one op (mla_absorbed);
# nothing is rotated by a rope op of its own (q, k_pe and the indexer's queries in the stores
# of the matmuls that make them, the indexer's keys in their norm's launch). Chained launches
# (engine_int.h eng_chain_begin): each layer's norm with the attention's first projections,
# their norms and q_b (one launch), and o_proj with the residual add, the norm, the router's
# matmul and the grouped MoE op (its 3 kernels; a dense layer: the MLP's gate and up) (one
# launch); the final norm with lm_head: 2 chains a layer + 1, and the ops inside them listed
# apart ("chained"); the per-kind counts below are of ops, chained or not.
# The unfused baseline: 8 distinct experts one by one (a gather, 3 matmuls, a silu_mul and a
# scatter each, and the routing plan to the host and back: 52 launches), every weight its own
# matmul, 2 cache copies a layer, and MLA's three ops. Also: the sharded count is one rank's,
# with its collectives.
source tests/e2e/lib.sh
m=$(stories)
out=$("$WICK" bench launches "$m" --context 8 --steps 3 --threads 2)
echo "$out"
echo "$out" | has '^launches' || fail "no human table"
python3 - "$(echo "$out" | tail -n 1)" "$m/config.json" <<'PY' || fail "stories260K counts"
import json, sys
j, cfg = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
L, b, ch = cfg["num_hidden_layers"], j["by_kind"], j["chained"]
k = {n: b.get(n, 0) + ch.get(n, 0) for n in set(b) | set(ch)}   # ops, chained or not
assert j["bench"] == "launches" and j["steps"] == 3 and j["context"] == 8, j
assert k["matmul"] == 4 * L + 1, k
assert "copy" not in k, k                          # k and v land in the caches
assert k["attention"] == L and k["silu_mul"] == L and "add" not in k, k
assert k["add_rmsnorm"] == 2 * L, k                        # residual adds fused with norms
assert "rope" not in k and k["rmsnorm"] == L + 1, k   # q and k rotated by a norm_n a layer
assert ch["rmsnorm"] == L + 1, ch                    # held, with layer 0's input norm
# chains: the norm with q, k, v; o_proj, the norm and gate + up; the final norm and lm_head
assert b["chain"] == 2 * L + 1 and ch["matmul"] == 3 * L + 1 and b["matmul"] == L, (b, ch)
held = sum(ch.values())   # matmuls, copies, adds, ropes; then the chains' ops less the chains
assert j["unfused"] - j["launches"] == 3 * L + 2 * L + 1 + 2 * L + L + held - b["chain"], j
assert j["launches"] == j["kernels"] + j["copies"] + j["collectives"], j
print(f"stories260K: {j['launches']:.0f} launches per step, as computed")
PY

# WICK_NO_CHAIN=1 (the escape hatch should chains misbehave on a GPU): every op its own launch
out=$(WICK_NO_CHAIN=1 "$WICK" bench launches "$m" --context 8 --steps 1 --threads 2)
python3 - "$(echo "$out" | tail -n 1)" <<'PY' || fail "WICK_NO_CHAIN=1: $out"
import json, sys
j = json.loads(sys.argv[1])
assert "chain" not in j["by_kind"] and not any(j["chained"].values()), j
assert j["launches"] == j["not_chained"], j   # 50 for stories260K, 34 chained
PY
if WICK_NO_CHAIN=yes "$WICK" bench launches "$m" --steps 1 >/dev/null 2>"$TMPD/nc.err"; then
  fail "WICK_NO_CHAIN=yes was taken"
fi
grep -q "WICK_NO_CHAIN is 'yes'; it takes 0 or 1" "$TMPD/nc.err" || fail "$(cat "$TMPD/nc.err")"

g=$TMPD/g5s
"$WICK_TOOLS/gen_glm" --preset glm5-structure -o "$g" >/dev/null || fail "gen_glm"
out=$("$WICK" bench launches "$g" --context 100 --steps 2 --threads 2 --op-times)
echo "$out"
# --op-times: the steps without chains once more, every op timed (on the CPU backend, by the
# host's clock: each op's own time, inside the step's)
python3 - "$(echo "$out" | tail -n 1)" <<'PY' || fail "GLM-5 structure op times"
import json, sys
t = json.loads(sys.argv[1])["op_times"]
b = t["by_kind"]
assert t["clock"] == "host" and t["between_ops_ms"] == 0, t
assert b["mla_absorbed"]["ops"] == 78 and b["dsa_topk"]["ops"] == 78, b
assert b["moe_experts"]["ops"] == 75 and "chain" not in b, b     # not chained: each op its own
for n in ("matmul", "add_rmsnorm", "rmsnorm", "cast", "mla_absorbed", "moe_experts", "dsa_topk"):
    assert b[n]["ms"] > 0 and b[n]["ms"] == b[n]["host_ms"], (n, b[n])
s = sum(v["ms"] for v in b.values())
assert abs(s - t["sum_ms"]) <= 1e-4 * s, (s, t)
# the ops run inside the timed steps, and are most of them
assert 0.5 * t["step_ms"] <= t["sum_ms"] <= t["step_ms"] * 1.001, t
print(f"GLM-5 structure op times: {t['sum_ms']:.3f} of a {t['step_ms']:.3f} ms step in ops")
# and the chained steps, every chain timed as one op beside the ops between chains
j = json.loads(sys.argv[1])
c, cb = j["op_times_chained"], j["op_times_chained"]["by_kind"]
assert cb["chain"]["ops"] == j["by_kind"]["chain"] > 0, (cb, j["by_kind"])
assert cb["mla_absorbed"]["ops"] == 78 and cb["dsa_topk"]["ops"] == 78, cb
assert "moe_experts" not in cb and "add_rmsnorm" not in cb, cb  # inside the chains
assert cb["chain"]["ms"] > 0 and 0.5 * c["step_ms"] <= c["sum_ms"] <= c["step_ms"] * 1.001, c
print(f"chained: {cb['chain']['ops']:.0f} chains {cb['chain']['ms']:.3f} ms of {c['sum_ms']:.3f}")
PY
python3 - "$(echo "$out" | tail -n 1)" "$g/config.json" <<'PY' || fail "GLM-5 structure counts"
import json, sys
j, cfg = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
ch = j["chained"]
k = {n: j["by_kind"].get(n, 0) + ch.get(n, 0) for n in set(j["by_kind"]) | set(ch)}
k = {n: v for n, v in k.items() if v}
L, dense, topk = cfg["num_hidden_layers"], cfg["first_k_dense_replace"], cfg["num_experts_per_tok"]
moe = L - dense
assert L == 78 and dense == 3 and cfg["n_routed_experts"] == 256 and topk == 8, cfg
assert k["mla_absorbed"] == L and k["dsa_topk"] == L, k           # sparse: 100 > index_topk
assert "mla_attention" not in k and "mla_absorb_q" not in k and "mla_absorb_out" not in k, k
assert "moe_route" not in k and k["moe_experts"] == moe, k     # the router inside the grouped op
assert "gather_rows" not in k and "scatter_add_rows" not in k, k
assert k["matmul"] == 3 * L + 2 * dense + moe + 1, k   # + dense MLPs, routers, lm_head
assert k["silu_mul"] == dense, k        # the shared experts' SiLU is inside the grouped op
assert k["to_host"] == 1 and k["to_device"] == 2, k               # no routing round trip
assert "copy" not in k, k                          # c_kv, k_pe, index keys land in caches
# the checkpoint is bfloat16, so the caches are: a layer's new rows are rounded into them by
# one cast link inside its first chain (no launch of its own)
assert j["kv_dtype"] == "bf16" and ch["cast"] == L and "cast" not in j["by_kind"], (j, ch)
assert k["add_rmsnorm"] == 2 * L and "add" not in k, k
assert "rope" not in k, k   # q, k_pe and the indexer's queries rotated in their matmuls' stores,
                            # the indexer's keys in their norm_n after the norm
assert k["rmsnorm"] == L + 1 and "layernorm" not in k, k   # q_c, c_kv, index keys: one norm_n
b = j["by_kind"]
assert b["chain"] == 2 * L + 1, b          # two chains a layer, the final norm with lm_head
assert ch["add_rmsnorm"] == 2 * L and ch["rmsnorm"] == L + 1, ch   # and layer 0's input norm
assert ch["matmul"] == 3 * L + dense + moe + 1, ch   # all but the dense MLPs' down (after SiLU)
assert b["matmul"] == dense and "rmsnorm" not in b and "add_rmsnorm" not in b, b
assert ch["moe_experts"] == moe and "moe_experts" not in b, ch   # the MoE op in its chain
per = {"moe_experts": 3}   # kernels of an op on its own
# per MoE layer: 8 experts' 6 ops, 4 plan copies and moe_route for the grouped op's 3; the
# shared expert's gate, up, silu_mul and down (inside it); then the attention's matmuls,
# the dense MLPs' gate + up, cache copies, adds, ropes (4 a layer, none left), norms, MLA
# and the chains: the launches of the ops they hold, less one launch each
held = sum(v * per.get(n, 1) for n, v in ch.items())
assert j["unfused"] - j["launches"] == moe * (6 * topk + 4 - 3 + 1) + 4 * moe + 4 * L + dense + 2 * L + 1 + 2 * L + 4 * L + 2 * L + 2 * L + held - b["chain"], j
print(f"GLM-5 structure: {j['launches']:.0f} launches per decode step (target {j['target']}); "
      f"unfused {j['unfused']:.0f}")
PY

# fp8 caches (--kv-dtype fp8): the latent and indexer keys quantized and k_pe rounded as they
# are stored, in the same cast link of each layer's first chain: the same launches as bf16
out8=$("$WICK" bench launches "$g" --context 100 --steps 1 --threads 2 --kv-dtype fp8)
python3 - "$(echo "$out" | tail -n 1)" "$(echo "$out8" | tail -n 1)" <<'PY' || fail "fp8: $out8"
import json, sys
b16, f8 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert f8["kv_dtype"] == "fp8" and f8["chained"]["cast"] == 78, f8
assert "cast" not in f8["by_kind"] and f8["launches"] == b16["launches"], (f8, b16)
print(f"fp8 caches: {f8['launches']:.0f} launches, as bf16's")
PY

# GLM-4.5's structure (92 layers, 3 dense, 160 experts top-8; tiny sizes): q, k and v's
# biases, per-head norms and partial rotations are one norm_n (heads, half-split, bias first,
# v bare) and the caches' stores one cast, both held in the layer's first chain with its norm
# and q/k/v; o_proj begins the second. A layer: 2 chains and its attention.
g4=$TMPD/g4s
"$WICK_TOOLS/gen_glm" --family glm4 -o "$g4" --layers 92 --first-dense 3 --experts 160 \
  --experts-per-tok 8 --n-group 1 --topk-group 1 --hidden 128 --intermediate 128 \
  --moe-intermediate 32 >/dev/null || fail "gen_glm glm4"
out4=$("$WICK" bench launches "$g4" --context 20 --steps 2 --threads 2)
python3 - "$(echo "$out4" | tail -n 1)" <<'PY' || fail "GLM-4.5 structure counts: $out4"
import json, sys
j = json.loads(sys.argv[1])
b, ch = j["by_kind"], j["chained"]
L, dense = 92, 3
for k in ("add", "rope", "rmsnorm", "cast", "copy"):   # none on their own
    assert k not in b, (k, b)
assert b["attention"] == L and b["chain"] == 2 * L + 1, b
assert b["matmul"] == dense and b["silu_mul"] == dense, b   # the dense MLPs' down after SiLU
assert ch["rmsnorm"] == L + 1 and ch["cast"] == L and ch["add_rmsnorm"] == 2 * L, ch
assert ch["moe_experts"] == L - dense, ch
assert j["launches"] == 3 * L + 1 + 2 * dense + 3, j   # + the copies: positions, ids, logits
print(f"GLM-4.5 structure: {j['launches']:.0f} launches per decode step; "
      f"unfused {j['unfused']:.0f}")
PY

# --batch 4 on the GQA families: the weights' ops once for all four sequences, and the
# attention one op a layer over the four sequences' caches (each token over its own), so the
# batch-1 step's launches, less the logits' copy to the host (greedy ids instead)
for fam in glm4:"$g4":20 stories:"$m":8; do
  IFS=: read -r name dir ctx <<<"$fam"
  one=$("$WICK" bench launches "$dir" --context "$ctx" --steps 1 --threads 2)
  four=$("$WICK" bench launches "$dir" --context "$ctx" --steps 1 --threads 2 --batch 4)
  python3 - "$name" "$(echo "$one" | tail -n 1)" "$(echo "$four" | tail -n 1)" <<'PY' \
    || fail "$name batch 4: $four"
import json, sys
name, one, j = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert j["batch"] == 4 and one["batch"] == 1, j
assert j["by_kind"]["attention"] == one["by_kind"]["attention"], (one, j)
assert j["launches"] == one["launches"] - 1 and "to_host" not in j["by_kind"], (one, j)
print(f"{name} batch 4: {j['launches']:.0f} launches a step (batch 1: {one['launches']:.0f})")
PY
done

# --batch 4: four sequences decoding together, as the worker batches them. The weights' ops
# are the batch-1 step's, once for all four, and so are the indexer's top-k (one op over
# the four sequences' key caches) and MLA's chain (mla_absorbed: kv_b's absorptions and the
# latent attention over the four sequences' caches): the batch-1 step's launches, less the
# logits' copy to the host (argmax on the device)
outb=$("$WICK" bench launches "$g" --context 100 --steps 1 --threads 2 --batch 4)
echo "$outb" | has '^per token' || fail "batch 4: no per-token line"
python3 - "$(echo "$out" | tail -n 1)" "$(echo "$outb" | tail -n 1)" <<'PY' || fail "batch 4: $outb"
import json, sys
one, j = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ch = j["chained"]
k = {n: j["by_kind"].get(n, 0) + ch.get(n, 0) for n in set(j["by_kind"]) | set(ch)}
assert j["batch"] == 4 and one["batch"] == 1, j
assert k["mla_absorbed"] == 78 and k["dsa_topk"] == 78, k
assert "mla_attention" not in k and "mla_absorb_q" not in k and "mla_absorb_out" not in k, k
assert k["moe_experts"] == 75 and j["by_kind"]["chain"] == one["by_kind"]["chain"], k
assert j["launches"] == one["launches"] - 1, (j, one)
print(f"batch 4: {j['launches']:.0f} launches a step, {j['launches'] / 4:.1f} a token")
PY

# the null backend has none of the GLM ops: refused by name (it used to crash on a NULL op)
if "$WICK" bench launches "$g" --context 8 --steps 1 --backend null >/dev/null 2>"$TMPD/null.err"; then
  fail "GLM-5 ran on the null backend"
fi
grep -q "the null backend lacks an op the GLM families need" "$TMPD/null.err" \
  || fail "GLM-5 on the null backend: $(cat "$TMPD/null.err")"

# sharded (tp 2 x ep 2 over 4 ranks): rank 0's count, with its all_reduces
s=$TMPD/g5s-snap
"$WICK" snapshot "$g" -o "$s" --tp 2 --ep 2 >/dev/null || fail "snapshot"
out=$("$WICK" bench launches "$s" --context 100 --steps 2 --threads 2)
python3 - "$(echo "$out" | tail -n 1)" <<'PY' || fail "sharded counts: $out"
import json, sys
j = json.loads(sys.argv[1])
b, ch = j["by_kind"], j["chained"]
assert j["collectives"] >= 2 * 78, j   # an all_reduce after the attention and the FFN
assert b["mla_absorbed"] == 78 and "mla_attention" not in b, j
# rank 0 leads the shared expert's TP slice and its routed experts: one grouped op with both
assert b["matmul"] + ch["matmul"] == 3 * 78 + 2 * 3 + 75 + 1 and b["silu_mul"] == 3, j
# the all_reduce after o_proj ends its chain: o_proj (and the dense MLPs' down) alone; the
# second chain holds the add and norm, the router's matmul and the grouped op
assert b["matmul"] == 78 + 3 and b["chain"] == 2 * 78 + 1, j
assert ch["moe_experts"] == 75 and "moe_experts" not in b, j
assert "rope" not in j["by_kind"], j
print(f"sharded tp 2 x ep 2, rank 0: {j['launches']:.0f} launches, {j['collectives']:.0f} collectives")
PY
echo ok
