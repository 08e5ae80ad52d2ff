# The worker on GLM models batches continuously, as it does Llama: a tiny random GLM-5 (MLA,
# DSA indexer selecting from position 5 on, FP8 MoE) and a tiny GLM-4.5 (GQA), each with
# stories260K's tokenizer, serve six greedy jobs at concurrency 4. The step log must show
# steps shared by several jobs, and every job's tokens must equal those of the same job run
# alone (concurrency 1): batching changes the schedule, never the answer. Both run again on
# FP8 KV caches (--kv-dtype fp8: GLM-5's latent and indexer keys, GLM-4.5's keys and values,
# e4m3 with a scale per 128 of a row), where the same must hold. A KV dtype wick does not
# have is refused by name, and its job left queued. The prefix cache on both, each KV dtype: a
# conversation's turns reuse what the turn before left (wick bench prefix), and every reply is
# the one the same turn gives without the cache.
source tests/e2e/lib.sh
m=$(stories)
G="$WICK_TOOLS/gen_glm"
"$G" --family glm5 -o "$TMPD/g5" --vocab 512 --seed 3 --index-topk 4 >/dev/null ||
  fail "gen_glm glm5"
"$G" --family glm4 -o "$TMPD/g4" --vocab 512 --seed 4 >/dev/null || fail "gen_glm glm4"

prompts=("Once upon a time" "The dog" "Lily and Ben went to the park" "A big red ball" "Tim"
  "She was happy")
cp -r "$TMPD/g5" "$TMPD/g5-fp8"
cp -r "$TMPD/g4" "$TMPD/g4-fp8"
for fam in g5 g4 g5-fp8 g4-fp8; do
  cp "$m/tokenizer.json" "$TMPD/$fam/"
  kv=(); [[ $fam == *-fp8 ]] && kv=(--kv-dtype fp8)
  for conc in 4 1; do
    Q=$TMPD/q-$fam-$conc
    for i in "${!prompts[@]}"; do
      printf '{"id": "j-%d", "input": {"prompt": "%s", "max_tokens": %d, "temperature": 0}}\n' \
        "$i" "${prompts[$i]}" $((6 + 2 * i)) >"$TMPD/job.json"
      "$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null || fail "submit"
    done
    "$WICK" worker --model "$TMPD/$fam" --queue "spool:$Q" --concurrency $conc \
      --idle-timeout 0.5 --step-log "$TMPD/steps-$fam-$conc" "${kv[@]}" \
      2>"$TMPD/w-$fam-$conc.log" ||
      fail "$fam worker at concurrency $conc: $(tail -3 "$TMPD/w-$fam-$conc.log")"
  done
  want=$([[ $fam == *-fp8 ]] && echo fp8 || echo bf16)
  grep -q "positions of $want KV cache" "$TMPD/w-$fam-4.log" ||
    fail "$fam: the ready line does not name a $want cache: $(grep ready "$TMPD/w-$fam-4.log")"
  python3 - "$TMPD" "$fam" "${#prompts[@]}" <<'PY' || fail "$fam: batched vs alone"
import json, os, sys
tmp, fam, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def results(conc):
    q = f"{tmp}/q-{fam}-{conc}/done"
    r = {f[:-5]: json.load(open(os.path.join(q, f))) for f in os.listdir(q)}
    assert len(r) == n and all(v["status"] == "COMPLETED" for v in r.values()), r
    return {k: v["output"]["token_ids"] for k, v in r.items()}
batched, alone = results(4), results(1)
steps = [json.loads(l) for l in open(f"{tmp}/steps-{fam}-4")]
widest = max(len(s["items"]) for s in steps)
assert widest >= 3, f"no step held more than {widest} jobs at concurrency 4"
assert all(len(s["items"]) == 1 for s in (json.loads(l) for l in open(f"{tmp}/steps-{fam}-1")))
diff = [k for k in alone if batched[k] != alone[k]]
assert not diff, f"tokens differ batched vs alone for {diff}: {batched[diff[0]]} vs {alone[diff[0]]}"
print(f"{fam}: {n} jobs, up to {widest} per step ({len(steps)} steps); the same tokens as alone")
PY
done
Q=$TMPD/q-g4-fp4
"$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null || fail "submit"
rc=0
"$WICK" worker --model "$TMPD/g4" --queue "spool:$Q" --kv-dtype fp4 --idle-timeout 0.5 \
  2>"$TMPD/w-g4-fp4.log" || rc=$?
[ $rc -eq 2 ] && grep -q -- "--kv-dtype wants .* not 'fp4'" "$TMPD/w-g4-fp4.log" ||
  fail "GLM-4.5 on an fp4 cache: exit $rc, $(tail -2 "$TMPD/w-g4-fp4.log")"
[ "$(ls "$Q/new" | wc -l)" = 1 ] || fail "the refused worker's job is not left queued: $(ls -R "$Q")"
echo "GLM-4.5 --kv-dtype fp4: refused (exit $rc), its job left queued"

for fam in g5 g4; do
  for kv in bf16 fp8; do
    "$WICK" bench prefix "$TMPD/$fam" --turns 5 --system 40 --user 16 --reply 8 --runs 1 \
      --choices 4 --prompt 40 --kv-dtype $kv >"$TMPD/prefix-$fam-$kv.txt" 2>&1 ||
      fail "bench prefix $fam $kv: $(tail -2 "$TMPD/prefix-$fam-$kv.txt")"
    tail -n 1 "$TMPD/prefix-$fam-$kv.txt" | python3 -c 'import json, sys
j = json.load(sys.stdin)
assert j["replies_differ"] == 0 and 0 < j["ran_on"] < j["ran_off"] / 3, j
assert j["choices_differ"] == 0 and j["choices_ran_on"] == 40 + 3 and j["choices_ran_off"] == 160, j
' ||
      fail "the prefix cache on $fam, $kv: $(tail -n 2 "$TMPD/prefix-$fam-$kv.txt")"
    echo "prefix cache, $fam, $kv: $(grep 'all:' "$TMPD/prefix-$fam-$kv.txt" | sed 's/^ *all: //')"
    echo "  $(grep 'choices:' "$TMPD/prefix-$fam-$kv.txt" | sed 's/^ *//')"
  done
done
echo ok
