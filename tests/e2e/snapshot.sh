# Snapshots end to end: stories260K through `wick snapshot`, then generate/logits from the
# snapshot, inspect, the refusals (corruption, truncation, wrong tp, changed source), an
# interrupted `wick snapshot`, and a smoke run of `wick bench restore`.
source tests/e2e/lib.sh
m=$(stories)
S=$TMPD/snap
"$WICK" snapshot "$m" -o "$S"
"$WICK" snapshot "$m" -o "$TMPD/snap-lz4" --compress lz4 --chunk-mib 1

# Same text and bit-identical logits from the snapshot as from the Hugging Face directory.
want=$("$WICK" generate "$m" -n 80 --temperature 0 2>/dev/null)
for s in "$S" "$TMPD/snap-lz4"; do
  got=$("$WICK" generate "$s" -n 80 --temperature 0 2>/dev/null)
  [ "$got" = "$want" ] || fail "$s generates different text: $got"
  "$WICK" logits --snapshot "$s" --tokens 1,403,407,261 --all-positions >"$TMPD/a.json"
  "$WICK" logits "$m" --tokens 1,403,407,261 --all-positions >"$TMPD/b.json"
  cmp -s "$TMPD/a.json" "$TMPD/b.json" || fail "$s: logits differ from the HF directory's"
done
"$WICK" generate "$S" -n 5 --temperature 0 --verbose 2>"$TMPD/v.txt" >/dev/null
grep -q '"startup"' "$TMPD/v.txt" || fail "--verbose prints no start-up timings"

# bf16 snapshot: matrices cast, runs, and logits stay close to f32.
"$WICK" snapshot "$m" -o "$TMPD/snap-bf16" --dtype bf16
"$WICK" inspect "$TMPD/snap-bf16" >"$TMPD/i.txt"
# --model/--snapshot name MODEL for every command that takes one (BRIEF's alias)
"$WICK" inspect --snapshot "$TMPD/snap-bf16" | cmp -s - "$TMPD/i.txt" || fail "inspect --snapshot"
"$WICK" prefetch --model "$TMPD/snap-bf16" >/dev/null || fail "prefetch --model"
"$WICK" tokenize --model "$TMPD/snap-bf16" --text Once >/dev/null || fail "tokenize --model"
"$WICK" bench restore --snapshot "$TMPD/snap-bf16" --runs 1 --no-cold --startup-runs 0 >/dev/null ||
  fail "bench restore --snapshot"
! "$WICK" inspect --model "$TMPD/snap-bf16" "$TMPD/snap-bf16" 2>/dev/null || fail "two MODELs accepted"
grep -q 'dtype bf16' "$TMPD/i.txt" || fail "inspect: no dtype bf16"
"$WICK" logits "$TMPD/snap-bf16" --tokens 1,403,407,261 >"$TMPD/c.json"
python3 - "$TMPD/b.json" "$TMPD/c.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["logits"][-1]; b = json.load(open(sys.argv[2]))["logits"][0]
d = max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a)
assert 0 < d < 0.05, f"bf16 relative difference {d}"
PY

# The GLM test models through snapshots: bit-identical logits to their HF directories, and
# restore equals the naive load path (the MTP layer is left out of both).
for fam in glm5 glm4; do
  "$WICK_TOOLS/gen_glm" --family $fam -o "$TMPD/$fam" --mtp --shards 2 --seed 5 >/dev/null
  "$WICK" snapshot "$TMPD/$fam" -o "$TMPD/$fam.snap" --compress lz4 2>"$TMPD/$fam.w"
  "$WICK" logits "$TMPD/$fam" --tokens 1,5,9,200,7,3,11 --all-positions >"$TMPD/$fam.a" 2>>"$TMPD/$fam.w"
  "$WICK" logits "$TMPD/$fam.snap" --tokens 1,5,9,200,7,3,11 --all-positions >"$TMPD/$fam.b" 2>>"$TMPD/$fam.w"
  ! grep -q 'not used' "$TMPD/$fam.w" || fail "$fam: unused tensors reported: $(cat "$TMPD/$fam.w")"
  cmp -s "$TMPD/$fam.a" "$TMPD/$fam.b" || fail "$fam: logits from the snapshot differ"
  "$WICK" bench restore "$TMPD/$fam.snap" --runs 1 --no-cold --startup-runs 0 >/dev/null \
    || fail "$fam: restore and naive load disagree"
done

# Weights the config turns off (GLM-4.5's q/k/v biases under attention_bias false) are
# reported by snapshot and at start, each name once however many ranks hold a piece of it.
sed 's/"attention_bias": true/"attention_bias": false/' "$TMPD/glm4/config.json" >"$TMPD/cfg.tmp" &&
  mv "$TMPD/cfg.tmp" "$TMPD/glm4/config.json"
"$WICK" snapshot "$TMPD/glm4" -o "$TMPD/nobias.snap" --tp 2 2>"$TMPD/nobias.w" || fail "snapshot"
"$WICK" logits "$TMPD/nobias.snap" --tokens 1,5 >/dev/null 2>>"$TMPD/nobias.w"
[ "$(grep -c "warning: 12 tensors of the checkpoint are not used by the model, e.g. 'model.layers.0.self_attn.k_proj.bias'" "$TMPD/nobias.w")" = 1 ] &&
  [ "$(grep -c "warning: 12 tensors of the checkpoint are not used by the model, e.g. 'model.layers.0.self_attn.q_proj.bias'" "$TMPD/nobias.w")" = 1 ] ||
  fail "unused biases: $(cat "$TMPD/nobias.w")"

# prefetch warms the page cache; a missing snapshot is an error
"$WICK" prefetch "$S" >"$TMPD/p.txt" || fail "prefetch"
grep -q 'GB/s' "$TMPD/p.txt" || fail "prefetch prints no summary"
! "$WICK" prefetch "$TMPD/none" 2>/dev/null || fail "prefetch of nothing succeeded"
# ... and so is a damaged one (prefetch is the deploy gate: it passed truncated rank files)
cp -r "$S" "$TMPD/trunc" && truncate -s 500000 "$TMPD/trunc/rank-000.bin"
! "$WICK" prefetch "$TMPD/trunc" 2>"$TMPD/trunc.err" && grep -q "truncated" "$TMPD/trunc.err" ||
  fail "prefetch of a truncated snapshot: $(cat "$TMPD/trunc.err")"
cp -r "$S" "$TMPD/magic" && printf XXXXXXXX | dd of="$TMPD/magic/rank-000.bin" bs=1 conv=notrunc 2>/dev/null
! "$WICK" prefetch "$TMPD/magic" 2>"$TMPD/magic.err" && grep -q "bad magic" "$TMPD/magic.err" ||
  fail "prefetch of a rank file with a bad magic: $(cat "$TMPD/magic.err")"

# fp8 snapshot: decoder-layer projections quantized with 128x128 block scales (GLM-5-FP8
# convention); the engine computes from the FP8 bytes; logits stay close.
"$WICK" snapshot "$m" -o "$TMPD/snap-fp8" --dtype fp8
"$WICK" inspect "$TMPD/snap-fp8" >"$TMPD/i.txt"
grep -q 'F8_E4M3          35 tensors' "$TMPD/i.txt" || fail "fp8: $(cat "$TMPD/i.txt")"
"$WICK" logits "$TMPD/snap-fp8" --tokens 1,403,407,261 >"$TMPD/d.json"
python3 - "$TMPD/b.json" "$TMPD/d.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["logits"][-1]; b = json.load(open(sys.argv[2]))["logits"][0]
d = max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a)
assert 0 < d < 0.15, f"fp8 relative difference {d}"
print("fp8 relative difference", d)
PY
"$WICK" bench restore "$TMPD/snap-fp8" --source "$m" --runs 1 --no-cold --startup-runs 0 >/dev/null \
  || fail "fp8: restore and the naive path (same quantization) disagree"

# fp8 from a BF16 GLM-5: the tensors GLM-5-FP8 stores in FP8 (every *_proj, kv_a_proj_with_mqa,
# the indexer's wq_b and wk), each with its scale_inv; indexer.weights_proj, the router and the
# norms stay BF16; the snapshot runs.
"$WICK_TOOLS/gen_glm" --family glm5 --dtype bf16 -o "$TMPD/g5bf" >/dev/null
"$WICK" snapshot "$TMPD/g5bf" -o "$TMPD/g5-fp8" --dtype fp8 >/dev/null
python3 - "$TMPD/g5-fp8/manifest.json" <<'PY' || fail "fp8 from a BF16 GLM-5"
import json, sys
t = {x["name"]: x["dtype"] for r in json.load(open(sys.argv[1]))["ranks"] for x in r["tensors"]}
a = "model.layers.0.self_attn."
for n in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "indexer.wq_b",
          "indexer.wk"):
    assert t[a + n + ".weight"] == "F8_E4M3" and t[a + n + ".weight_scale_inv"] == "F32", n
assert t[a + "indexer.weights_proj.weight"] == "BF16"
assert t["model.layers.1.mlp.gate.weight"] == "BF16" and t[a + "kv_a_layernorm.weight"] == "BF16"
assert t["model.layers.1.mlp.experts.0.down_proj.weight"] == "F8_E4M3"
PY
"$WICK" logits "$TMPD/g5-fp8" --tokens 1,5,9 >/dev/null || fail "the fp8 GLM-5 snapshot does not run"

# inspect reads the manifest
"$WICK" inspect "$S" >"$TMPD/i.txt"
grep -q 'wick-snapshot version 2' "$TMPD/i.txt" || fail "inspect SNAP"
"$WICK" inspect "$S" --json | python3 -c 'import json,sys; m=json.load(sys.stdin); assert m["ranks"][0]["tensor_count"] == 47'

set +e
# One flipped byte in the rank file: refused, naming the chunk and the tensor.
cp -r "$S" "$TMPD/bad"
python3 - "$TMPD/bad/rank-000.bin" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[4096 + 300000] ^= 0x40; open(p, 'wb').write(b)
PY
"$WICK" generate "$TMPD/bad" -n 5 2>"$TMPD/e1"; rc=$?
[ $rc -eq 1 ] && grep -q 'chunk 0' "$TMPD/e1" && grep -q "tensors* '" "$TMPD/e1" \
  || fail "flipped byte: rc=$rc $(cat "$TMPD/e1")"
"$WICK" generate "$TMPD/bad" -n 5 --no-verify >/dev/null 2>&1 || fail "--no-verify should load"

# Truncated rank file: refused.
cp -r "$S" "$TMPD/trunc"
truncate -s -4096 "$TMPD/trunc/rank-000.bin"
"$WICK" logits "$TMPD/trunc" --tokens 1 2>"$TMPD/e2"; rc=$?
[ $rc -eq 1 ] && grep -q 'truncated' "$TMPD/e2" || fail "truncated: rc=$rc $(cat "$TMPD/e2")"

# Another format version: refused by name.
cp -r "$S" "$TMPD/v3"
grep -q '"version": 2,' "$TMPD/v3/manifest.json" || fail "the manifest is not version 2"
sed -i 's/"version": 2,/"version": 3,/' "$TMPD/v3/manifest.json"
"$WICK" logits "$TMPD/v3" --tokens 1 2>"$TMPD/e3"; rc=$?
[ $rc -eq 1 ] && grep -q 'version 3' "$TMPD/e3" || fail "version: rc=$rc $(cat "$TMPD/e3")"

# The snapshot's copy of config.json edited (the engine runs the manifest's config, so an edit
# would change nothing but the chat format, silently): refused by name.
cp -r "$S" "$TMPD/cfg"
sed -i 's/"hidden_size": *[0-9]*/"hidden_size": 4096/' "$TMPD/cfg/config.json"
"$WICK" logits "$TMPD/cfg" --tokens 1 2>"$TMPD/e3b"; rc=$?
[ $rc -eq 1 ] && grep -q 'config.json: changed after the snapshot was written' "$TMPD/e3b" ||
  fail "edited config.json: rc=$rc $(cat "$TMPD/e3b")"

# A layout other than the snapshot's: refused.
"$WICK" logits "$S" --tokens 1 --tp 2 2>"$TMPD/e4"; rc=$?
[ $rc -eq 1 ] && grep -q 'tp 1' "$TMPD/e4" || fail "tp: rc=$rc $(cat "$TMPD/e4")"

# The source changed since the snapshot: refused when the source is given.
cp -r "$m" "$TMPD/src"
"$WICK" snapshot "$TMPD/src" -o "$TMPD/snap-src" 2>/dev/null
"$WICK" logits "$TMPD/snap-src" --tokens 1 --source "$TMPD/src" >/dev/null 2>&1 || fail "unchanged source refused"
echo ' ' >>"$TMPD/src/config.json"
"$WICK" logits "$TMPD/snap-src" --tokens 1 --source "$TMPD/src" 2>"$TMPD/e5"; rc=$?
[ $rc -eq 1 ] && grep -q 'changed since the snapshot' "$TMPD/e5" || fail "source: rc=$rc $(cat "$TMPD/e5")"

# kill -9 in the middle of `wick snapshot`: nothing valid-looking is left behind.
"$WICK_TOOLS/gen_llama" -o "$TMPD/big" --hidden 1024 --intermediate 2816 --layers 8 --heads 16 \
  --kv-heads 4 --vocab 8000 --dtype f32 --seed 3 >/dev/null
"$WICK" snapshot "$TMPD/big" -o "$TMPD/killed" --compress lz4 --chunk-mib 1 2>/dev/null &
pid=$!
sleep 0.3
kill -9 $pid; wait $pid 2>/dev/null
[ ! -e "$TMPD/killed/manifest.json" ] || fail "a killed snapshot left a manifest"
"$WICK" logits "$TMPD/killed" --tokens 1 >/dev/null 2>&1 && fail "a killed snapshot loads"
set -e
"$WICK" snapshot "$TMPD/big" -o "$TMPD/killed" 2>/dev/null
"$WICK" logits "$TMPD/killed" --tokens 1,2 >/dev/null 2>&1 || fail "snapshot after a kill"
ls "$TMPD" | has 'killed\.' && fail "stale temporary directories were not cleaned: $(ls "$TMPD")"

# bench restore: a smoke run (the real figures come from scripts/bench-restore).
"$WICK" bench restore "$S" --source "$m" --runs 1 --startup-runs 2 >"$TMPD/br.txt"
tail -n 1 "$TMPD/br.txt" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["bench"] == "restore" and j["bytes"] == 1040128, j
assert all(v > 0 for v in j["warm_s"].values()) and 0 < j["fixed_startup_ms"] < 1000, j'
# bad arguments are usage errors (atoi took --threads -5 and --map sometimes), and what was
# not measured is null in the JSON (it said fixed_startup_ms -1000 and cold ratios 0)
for bad in "--map sometimes" "--threads -5" "--threads 100000" "--runs x"; do
  rc=0
  # shellcheck disable=SC2086
  "$WICK" bench restore "$S" $bad >/dev/null 2>&1 || rc=$?
  [ $rc = 2 ] || fail "bench restore $bad: exit $rc"
done
"$WICK" bench restore "$S" --runs 1 --no-cold --startup-runs 0 | tail -n 1 | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["fixed_startup_ms"] is None and j["cold_restore_vs_plain"] is None, j'

# A snapshot whose manifest lists tokenizer.json but lacks it is damaged, not a model without
# a tokenizer: refused at start (it started READY and failed every prompt job).
cp -r "$S" "$TMPD/notok" && rm "$TMPD/notok/tokenizer.json"
rc=0
"$WICK" generate "$TMPD/notok" -p "Once" -n 2 >/dev/null 2>"$TMPD/notok.err" || rc=$?
[ $rc = 1 ] && grep -q "tokenizer.json: missing, though the snapshot's manifest lists it" "$TMPD/notok.err" ||
  fail "a snapshot without its tokenizer.json: exit $rc: $(cat "$TMPD/notok.err")"
echo ok
