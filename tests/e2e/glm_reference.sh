# GLM-5 (GlmMoeDsaForCausalLM, FP8) and GLM-4.5 (Glm4MoeForCausalLM) against an independent
# float64 reference: `wick logits --all-positions` on tiny random checkpoints from gen_glm must
# match scripts/glm_ref.py within max|Δ| / max|ref| ≤ 1e-3 (fp32 compute, exact dequantization).
# The reference is first checked on its own: deterministic, finite, blind to sharding and to
# an MTP layer, sensitive to a weight, and its router is checked by hand.
source tests/e2e/lib.sh
PY=/usr/bin/python3
$PY -c 'import numpy' 2>/dev/null || fail "/usr/bin/python3 has no numpy (scripts/install-deps installs python3-numpy)"
REF=scripts/glm_ref.py
TOKENS=1,5,9,13,200,7,42,99,3,250,17,8 # 12 tokens; index_topk is 4, so DSA drops keys

# Tiny checkpoints: GLM-5 FP8 (single file; three shards with an MTP layer, same seed so the
# same weights), GLM-5 FP8 with kv_lora_rank 128 (a whole FP8 block: the engine binds
# kv_a_proj_with_mqa's c_kv and k_pe rows as two weights, the second's block scales offset),
# GLM-5 in BF16 without expert groups (as the real n_group 1), GLM-4.5 BF16
# with qk-norm, and a sharded GLM-4.5 without qk-norm plus MTP.
G="$WICK_TOOLS/gen_glm"
"$G" --family glm5 -o "$TMPD/g5" --seed 7 >/dev/null || fail "gen_glm glm5"
"$G" --family glm5 -o "$TMPD/g5s" --seed 7 --shards 3 --mtp >/dev/null || fail "gen_glm glm5 sharded"
"$G" --family glm5 -o "$TMPD/g5k" --seed 5 --kv-lora-rank 128 >/dev/null || fail "gen_glm glm5 kv 128"
"$G" --family glm5 -o "$TMPD/g5b" --seed 6 --dtype bf16 --n-group 1 --topk-group 1 >/dev/null ||
  fail "gen_glm glm5 bf16"
"$G" --family glm4 -o "$TMPD/g4" --seed 8 >/dev/null || fail "gen_glm glm4"
"$G" --family glm4 -o "$TMPD/g4s" --seed 9 --shards 2 --mtp --no-qk-norm >/dev/null ||
  fail "gen_glm glm4 sharded"
[ -f "$TMPD/g5s/model-00003-of-00003.safetensors" ] && [ -f "$TMPD/g5s/model.safetensors.index.json" ] ||
  fail "gen_glm --shards 3 did not write three shards and an index"

# ---- the reference on its own ----------------------------------------------------------------
for m in g5 g5s g5k g5b g4 g4s; do
  $PY $REF "$TMPD/$m" --tokens $TOKENS --all-positions >"$TMPD/$m.ref.json" || fail "glm_ref.py on $m"
done
$PY $REF "$TMPD/g5" --tokens $TOKENS --all-positions >"$TMPD/g5.ref2.json"
cmp -s "$TMPD/g5.ref.json" "$TMPD/g5.ref2.json" || fail "glm_ref.py is not deterministic"
cmp -s "$TMPD/g5.ref.json" "$TMPD/g5s.ref.json" ||
  fail "the sharded GLM-5 with an MTP layer gives other reference logits than the single file"

$PY - "$TMPD" "$REF" "$TOKENS" <<'PY' || fail "reference self-checks"
import json, math, os, shutil, struct, subprocess, sys
import numpy as np
tmp, ref, tokens = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(ref))
import glm_ref

for m in ("g5", "g5k", "g5b", "g4", "g4s"):
    j = json.load(open(f"{tmp}/{m}.ref.json"))
    a = np.array(j["logits"], dtype=np.float64)
    assert a.shape == (12, j["vocab"]) and np.isfinite(a).all(), m
    assert 0.1 < a.std() < 100, f"{m}: logits std {a.std()}: activations are not O(1)"

# Perturbing one FP8 byte of one expert weight changes the logits.
src, dst = f"{tmp}/g5", f"{tmp}/g5p"
shutil.copytree(src, dst)
path = f"{dst}/model.safetensors"
with open(path, "r+b") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    hdr = json.loads(f.read(n))
    info = hdr["model.layers.1.self_attn.kv_b_proj.weight"]
    assert info["dtype"] == "F8_E4M3"
    f.seek(8 + n + info["data_offsets"][0] + 5)
    b = f.read(1)[0]
    f.seek(-1, 1)
    f.write(bytes([b ^ 0x10]))
out = subprocess.run([sys.executable, ref, dst, "--tokens", tokens, "--all-positions"],
                     check=True, capture_output=True, text=True).stdout
a = np.array(json.load(open(f"{tmp}/g5.ref.json"))["logits"])
b = np.array(json.loads(out)["logits"])
assert np.abs(a - b).max() > 1e-6, "perturbing kv_b_proj did not change the logits"

# The router by hand, on one token: 8 experts in 4 groups of 2, 2 groups kept, 2 experts.
cfg = {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
       "routed_scaling_factor": 2.5, "norm_topk_prob": True}
s = np.array([0.9, 0.1, 0.8, 0.7, 0.85, 0.05, 0.3, 0.3])
logit = np.log(s / (1 - s))
# group scores (top-2 sums) 1.0, 1.5, 0.9, 0.6 keep groups 1 and 0, so expert 4 (0.85) loses
# to expert 2 (0.8): group-limited selection changes the answer.
idx, w = glm_ref.route(cfg, logit, np.zeros(8))
assert sorted(idx) == [0, 2], idx
assert np.allclose(sorted(w, reverse=True), 2.5 * np.array([0.9, 0.8]) / 1.7)
flat = dict(cfg, n_group=1, topk_group=1)
assert sorted(glm_ref.route(flat, logit, np.zeros(8))[0]) == [0, 4]
# A bias on experts 6 and 7 lifts group 3 (0.9 + 0.85) and picks them, but the gates stay
# their unbiased sigmoids 0.3 and 0.3, normalised: 1.25 each.
bias = np.array([0, 0, 0, 0, 0, 0, 0.6, 0.55])
idx, w = glm_ref.route(cfg, logit, bias)
assert sorted(idx) == [6, 7], idx
assert np.allclose(w, [1.25, 1.25]), w
print("reference self-checks ok")
PY

# ---- wick against the reference ---------------------------------------------------------------
# f32 KV caches, as the reference holds them (the generated checkpoints are bfloat16, so wick
# would hold bf16 ones by default: test_glm_paths's kv_bf16 checks those against f32 ones)
for m in g5 g5s g5k g5b g4 g4s; do
  "$WICK" logits "$TMPD/$m" --tokens $TOKENS --all-positions --kv-dtype f32 \
    >"$TMPD/$m.wick.json" 2>"$TMPD/$m.err" ||
    fail "wick logits on $m: $(head -c 300 "$TMPD/$m.err")"
  $PY - "$TMPD/$m.wick.json" "$TMPD/$m.ref.json" "$m" <<'PY' || fail "$m: wick differs from the reference"
import json, sys
import numpy as np
w, r, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
assert w["vocab"] == r["vocab"], (w["vocab"], r["vocab"])
assert w["positions"] == r["positions"], w["positions"]
a = np.array([[np.nan if v is None else v for v in row] for row in w["logits"]], dtype=np.float64)
b = np.array(r["logits"], dtype=np.float64)
assert a.shape == b.shape and np.isfinite(a).all(), "wick's logits are not all finite"
rel = np.abs(a - b).max() / np.abs(b).max()
print(f"{name}: max|d|/max|ref| = {rel:.3g}")
assert rel <= 1e-3, f"{name}: relative error {rel:.3g} > 1e-3"
PY
done

# ---- the MTP layer's drafts against the reference ------------------------------------------------
# wick logits --mtp: 6 greedy steps after the 12 tokens, each with 3 drafts (the first from the
# main model's hidden state, two chained); glm_ref.py --mtp on the 12 + 6 tokens gives the MTP
# layer's logits at each position and the chained drafts' after it. A snapshot that keeps the
# MTP layer (--mtp) gives wick's logits bit for bit; one sharded over 4 ranks (tp 2, ep 2) is
# held to the reference too; one without the layer cannot draft.
"$WICK" snapshot "$TMPD/g5s" -o "$TMPD/g5s.snap" --mtp >/dev/null 2>"$TMPD/snap.err" ||
  fail "wick snapshot g5s: $(head -c 300 "$TMPD/snap.err")"
"$WICK" snapshot "$TMPD/g5s" -o "$TMPD/g5s.tp2" --tp 2 --ep 2 --mtp >/dev/null 2>"$TMPD/snap.err" ||
  fail "wick snapshot g5s --tp 2 --ep 2: $(head -c 300 "$TMPD/snap.err")"
"$WICK" snapshot "$TMPD/g5s" -o "$TMPD/g5s.nomtp" >/dev/null 2>&1 || fail "wick snapshot g5s"
"$WICK" logits "$TMPD/g5s.nomtp" --tokens $TOKENS --mtp 2 >/dev/null 2>"$TMPD/nomtp.err" &&
  fail "a snapshot without the MTP layer drafted"
grep -q "holds no MTP layer (no model.layers.4.eh_proj.weight)" "$TMPD/nomtp.err" ||
  fail "a snapshot without the MTP layer: $(cat "$TMPD/nomtp.err")"
"$WICK" snapshot "$TMPD/g5" -o "$TMPD/g5.mtp" --mtp >/dev/null 2>"$TMPD/snap.err" &&
  fail "wick snapshot --mtp of a model without an MTP layer succeeded"
grep -q "no MTP layer" "$TMPD/snap.err" || fail "snapshot --mtp: $(cat "$TMPD/snap.err")"
for m in g5s g4s g5s.snap g5s.tp2; do
  "$WICK" logits "$TMPD/$m" --tokens $TOKENS --mtp 6 --drafts 3 --kv-dtype f32 \
    >"$TMPD/$m.mtp.json" 2>"$TMPD/$m.err" ||
    fail "wick logits --mtp on $m: $(head -c 300 "$TMPD/$m.err")"
done
cmp -s "$TMPD/g5s.mtp.json" "$TMPD/g5s.snap.mtp.json" ||
  fail "the snapshot's MTP drafts differ from the checkpoint's"
"$WICK" logits "$TMPD/g5" --tokens $TOKENS --mtp 2 >/dev/null 2>"$TMPD/none.err" &&
  fail "wick logits --mtp on a model without an MTP layer succeeded"
grep -q "has no MTP layer" "$TMPD/none.err" ||
  fail "no MTP layer, not named: $(cat "$TMPD/none.err")"
for m in g5s g4s g5s.tp2; do
  $PY - "$TMPD/$m.mtp.json" "$TMPD/${m%.tp2}" "$REF" "$TOKENS" "$m" <<'PY' ||
import json, subprocess, sys
import numpy as np
w = json.load(open(sys.argv[1]))
model, ref, tokens, name = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
n = len(tokens.split(","))
seq = tokens + "," + ",".join(str(t) for t in w["tokens"])
r = json.loads(subprocess.run([sys.executable, ref, model, "--tokens", seq, "--mtp", "--chain",
                               "3", "--from", str(n - 1)],
                              check=True, capture_output=True, text=True).stdout)
assert w["positions"] == r["positions"] == list(range(n - 1, n + 5)), (w["positions"],
                                                                      r["positions"])
f = lambda x: np.array([[np.nan if v is None else v for v in row] for row in x], dtype=np.float64)
worst = 0.0
for i, q in enumerate(w["positions"]):
    a = np.vstack([f([w["logits"][i]]), f(w["chain"][i])])
    b = np.vstack([np.array([r["logits"][i]]), np.array(r["chain"][i])])
    assert a.shape == b.shape == (3, w["vocab"]) and np.isfinite(a).all(), (name, q, a.shape)
    worst = max(worst, np.abs(a - b).max() / np.abs(b).max())
    # each draft is wick's own argmax, and the reference chained on the same tokens
    assert w["drafts"][i] == [int(np.argmax(x)) for x in a], (name, q, w["drafts"][i])
    assert w["drafts"][i] == [int(np.argmax(x)) for x in b], (name, q, "reference argmax")
print(f"{name}: MTP drafts at {len(w['positions'])} positions, max|d|/max|ref| = {worst:.3g}")
assert worst <= 1e-3, f"{name}: relative error {worst:.3g} > 1e-3"
PY
    fail "$m: wick's MTP drafts differ from the reference"
done
echo ok
