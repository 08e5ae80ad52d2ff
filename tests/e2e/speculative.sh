# Speculative decoding by prompt lookup (wick worker --speculate N) on the real stories260K
# (the workers whose draft counts are checked have a draft's cost fixed, --draft-cost 0.1, as
# on a GPU, so that the counts do not depend on this machine's timing; the benches measure it)
# model, against the same jobs run without it:
#   1. the same 14 jobs on two spool queues, one worker each: every greedy result's text,
#      token ids and finish reason are the same; the speculating worker took fewer steps, its
#      jobs report the drafts they kept and threw away (usage.completion_tokens_details), the
#      sampled ones too (their drafts kept by draws: another draw of the same distribution);
#      the other worker's report none
#   2. bad values of --speculate and --draft-cost are usage errors (exit 2) that name the flag
#   3. wick dev --speculate: an OpenAI completion gives the same text as without, with
#      usage.completion_tokens_details; given that text as its predicted output
#      ("prediction"), nearly every token is a draft kept; a bad prediction is a 400
#   4. wick bench speculate runs both modes and finds the same outputs; with --predict (each
#      request's output its own prediction) it takes under a third of the steps
#   5. the MTP layer drafts (--drafter, default auto): on a tiny GLM-5 with an MTP layer that
#      is always right (gen_glm --mtp-oracle; stories260K's tokenizer), the same 6 greedy
#      jobs give the same tokens with its drafts as without, nearly all of them kept; --drafter lookup drafts by lookup instead; --drafter mtp on a model without
#      one exits 1 naming it; --drafter without --speculate, or a wrong name, exits 2; wick
#      bench speculate drafts with it; wick bench launches --drafts counts its launches
source tests/e2e/lib.sh
m=$(stories)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$TMPD"' EXIT

# 1. Fourteen jobs, greedy ones that repeat their prompts or not, two sampled, a stop string.
python3 - "$TMPD/jobs" <<'PY'
import json, os, sys
os.makedirs(sys.argv[1])
prompts = ["Lily and Ben went to the park. Lily and Ben played. Lily and Ben",
           "Once upon a time", "The dog ran. The dog ran. The dog", "",
           "Tom had a red ball. Tom had a red ball. Tom", "One day, a little bird"]
n = 0
for p in prompts:
    for sampled in (False, True) if p in ("", "Once upon a time") else (False,):
        for mt in (40, 150) if not sampled else (60,):
            n += 1
            inp = {"prompt": p, "max_tokens": mt, "temperature": 0.8 if sampled else 0}
            if sampled:
                inp["seed"] = n
            if p.startswith("Tom"):
                inp["stop"] = ["ball.\nOne"]
            json.dump({"id": f"s-{n}", "input": inp}, open(f"{sys.argv[1]}/{n}.json", "w"))
print(n, "jobs")
PY
for q in plain spec; do
  for f in "$TMPD"/jobs/*.json; do
    "$WICK" submit --queue "spool:$TMPD/$q" --file "$f" >/dev/null || fail "submit $f"
  done
done
"$WICK" worker --model "$m" --queue "spool:$TMPD/plain" --idle-timeout 1 \
  --step-log "$TMPD/plain.steps" 2>"$TMPD/plain.log" || fail "the plain worker exited $?"
"$WICK" worker --model "$m" --queue "spool:$TMPD/spec" --idle-timeout 1 --speculate 4 \
  --draft-cost 0.1 --step-log "$TMPD/spec.steps" 2>"$TMPD/spec.log" ||
  fail "the speculating worker exited $?"
grep -q "speculative decoding on" "$TMPD/spec.log" || fail "no word of speculation at ready"
grep -q "drafts where they pay (0.1 of a step each)" "$TMPD/spec.log" ||
  fail "no word of the draft cost at ready: $(grep ready "$TMPD/spec.log")"
! grep -q "speculative decoding on" "$TMPD/plain.log" || fail "the plain worker speculated"
grep -q "draft tokens kept" "$TMPD/spec.log" || fail "no job_done line with its drafts"
python3 - "$TMPD" <<'PY'
import json, os, sys
d = sys.argv[1]
def results(q):
    return {f[:-5]: json.load(open(f"{d}/{q}/done/{f}")) for f in os.listdir(f"{d}/{q}/done")}
plain, spec = results("plain"), results("spec")
assert len(plain) == len(spec) == 14, (len(plain), len(spec))
kept = drafted = sampled_drafts = n_sampled = 0
none = []
for k, a in sorted(plain.items()):
    b = spec[k]
    assert a["status"] == b["status"] == "COMPLETED", (a, b)
    assert "completion_tokens_details" not in a["usage"], a["usage"]
    det = b["usage"].get("completion_tokens_details")
    job = json.load(open(f"{d}/jobs/{k[2:]}.json"))
    if job["input"]["temperature"] > 0:
        # drafts kept or not by its own draws: the same distribution, another draw
        assert b["usage"]["completion_tokens"] == len(b["output"]["token_ids"]) > 0, b
        sampled_drafts += sum(det.values()) if det else 0
        n_sampled += 1
        continue
    for f in ("text", "token_ids", "finish_reason"):
        x, y = a["output"][f], b["output"][f]
        assert x == y, f"{k}: {f} differs:\n{x!r}\n{y!r}"
    if det is None:  # nothing in it repeated (no 2-token match): no drafts
        none.append(k)
        continue
    kept += det["accepted_prediction_tokens"]
    drafted += det["accepted_prediction_tokens"] + det["rejected_prediction_tokens"]
    assert b["usage"]["completion_tokens"] == len(b["output"]["token_ids"])
assert kept > drafted // 4, f"kept {kept} of {drafted} draft tokens"
assert len(none) <= 2, f"greedy jobs without drafts: {none}"
assert sampled_drafts > 0, "the sampled jobs drafted nothing"
# the steps each job took part in (its job_done line): a job's own count, whatever shared them
import re
steps = {q: sum(int(m.group(1)) for m in re.finditer(r"completion tokens, (\d+) steps",
                                                   open(f"{d}/{q}.log").read()))
         for q in ("plain", "spec")}
assert steps["spec"] < steps["plain"] * 0.9, steps
assert any('"draft": ' in l for l in open(f"{d}/spec.steps")), "no draft in the step log"
stops = [k for k, v in spec.items() if v["output"]["finish_reason"] == "stop"]
print(f"{14 - n_sampled} greedy jobs the same with and without, {n_sampled} sampled ones "
      f"drafted too; {steps['spec']} job steps against {steps['plain']}; "
      f"kept {kept} of {drafted} draft tokens; {len(none)} greedy jobs without a draft; "
      f"{len(stops)} ended by a stop string or EOS")
PY

# 2. Bad values.
for v in 17 -1 x 2.5.1; do
  set +e
  "$WICK" worker --model "$m" --queue "spool:$TMPD/plain" --speculate "$v" 2>"$TMPD/bad.log"
  rc=$?
  set -e
  [ $rc = 2 ] || fail "--speculate $v: exit $rc, want 2"
  grep -q -- "--speculate wants a number" "$TMPD/bad.log" ||
    fail "--speculate $v: $(cat "$TMPD/bad.log")"
done
set +e
"$WICK" worker --model "$m" --queue "spool:$TMPD/plain" --speculate 2 --speculate-max-batch -1 \
  2>"$TMPD/bad.log"
rc=$?
set -e
[ $rc = 2 ] && grep -q -- "--speculate-max-batch wants a number" "$TMPD/bad.log" ||
  fail "--speculate-max-batch -1: exit $rc: $(cat "$TMPD/bad.log")"
for v in -0.1 17 x; do
  set +e
  "$WICK" worker --model "$m" --queue "spool:$TMPD/plain" --speculate 2 --draft-cost "$v" \
    2>"$TMPD/bad.log"
  rc=$?
  set -e
  [ $rc = 2 ] && grep -q -- "--draft-cost wants a number" "$TMPD/bad.log" ||
    fail "--draft-cost $v: exit $rc: $(cat "$TMPD/bad.log")"
done
echo "refused: --speculate 17, -1, x, 2.5.1, --speculate-max-batch -1, --draft-cost -0.1, 17," \
  "x (exit 2, the flag named)"

# 3. A dev session.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
ask() { # PORT: a greedy completion's JSON
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Lily and Ben went to the park. Lily and Ben", "max_tokens": 80,
         "temperature": 0}'
}
for mode in plain spec; do
  P=$(free_port)
  args=()
  [ $mode = spec ] && args=(--speculate 6 --draft-cost 0.1)
  "$WICK" dev --model "$m" --listen 127.0.0.1:$P --idle-timeout 30 ${args[@]+"${args[@]}"} \
    2>"$TMPD/dev-$mode.log" &
  pid=$!
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$P/health" && break
    kill -0 $pid 2>/dev/null || fail "wick dev exited during start-up"
    sleep 0.1
  done
  ask $P >"$TMPD/dev-$mode.json" || fail "the $mode completion failed"
  if [ $mode = spec ]; then
    # OpenAI's predicted output: the text without speculation, given as the prediction
    body=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["choices"][0]["text"]
print(json.dumps({"prompt": "Lily and Ben went to the park. Lily and Ben", "max_tokens": 80,
  "temperature": 0, "prediction": {"type": "content", "content": t}}))' "$TMPD/dev-plain.json")
    curl -sf "http://127.0.0.1:$P/v1/completions" -H 'Content-Type: application/json' -d "$body" \
      >"$TMPD/dev-pred.json" || fail "the completion with a prediction failed"
    code=$(curl -s -o "$TMPD/dev-badpred.json" -w '%{http_code}' \
      "http://127.0.0.1:$P/v1/completions" \
      -H 'Content-Type: application/json' -d '{"prompt": "a", "prediction": {"type": "x"}}')
    [ "$code" = 400 ] && grep -q '"param": *"prediction"' "$TMPD/dev-badpred.json" ||
      fail "a bad prediction: $code $(cat "$TMPD/dev-badpred.json")"
    curl -sf "http://127.0.0.1:$P/metrics" >"$TMPD/metrics.txt" || fail "/metrics"
  fi
  kill -TERM $pid
  wait $pid || fail "wick dev ($mode) exited $?"
done
python3 - "$TMPD/dev-plain.json" "$TMPD/dev-spec.json" "$TMPD/dev-pred.json" <<'PY'
import json, sys
a, b, c = (json.load(open(f)) for f in sys.argv[1:])
assert c["choices"][0]["text"] == a["choices"][0]["text"], (a, c)
# /metrics adds up the two completions' drafts (and the refused one's none)
m = dict(l.rsplit(" ", 1) for l in open(sys.argv[1].rsplit("/", 1)[0] + "/metrics.txt")
         if l.startswith("wick_draft_tokens_total"))
for kept, field in (("true", "accepted"), ("false", "rejected")):
    want = sum(x["usage"]["completion_tokens_details"][field + "_prediction_tokens"]
               for x in (b, c))
    got = int(m['wick_draft_tokens_total{kept="%s"}' % kept])
    assert got == want, (kept, got, want)
dc = c["usage"]["completion_tokens_details"]
# (one step in 7 gives a token of its own)
assert dc["accepted_prediction_tokens"] >= 0.75 * c["usage"]["completion_tokens"], c["usage"]
assert a["choices"][0]["text"] == b["choices"][0]["text"], (a, b)
assert "completion_tokens_details" not in a["usage"], a["usage"]
d = b["usage"]["completion_tokens_details"]
assert d["accepted_prediction_tokens"] > 0 and d["rejected_prediction_tokens"] >= 0, d
print(f"wick dev: the same text; {d['accepted_prediction_tokens']} draft tokens kept, "
      f"{d['rejected_prediction_tokens']} thrown away; with the text as the prediction, "
      f"{dc['accepted_prediction_tokens']} of {c['usage']['completion_tokens']} tokens were "
      f"drafts kept; a bad prediction is a 400 naming it")
PY
# 4. wick bench speculate: both modes, the same outputs, its JSON line; the draft cost measured
"$WICK" bench speculate "$m" -n 40 --runs 1 >"$TMPD/bench.txt" || fail "bench speculate exited $?"
grep -q "the outputs are the same" "$TMPD/bench.txt" || fail "$(cat "$TMPD/bench.txt")"
grep -q "measured from the steps" "$TMPD/bench.txt" || fail "$(cat "$TMPD/bench.txt")"
tail -1 "$TMPD/bench.txt" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["bench"] == "speculate" and j["speculate_steps"] < j["plain_steps"], j
assert 0 < j["accepted"] <= j["drafted"] and j["verify_step_ms"] > 0 < j["step_ms"], j
assert j["draft_cost_measured"] and 0 < j["draft_cost"] <= 16, j
print("bench speculate: %d steps against %d" % (j["speculate_steps"], j["plain_steps"]))'
"$WICK" bench speculate "$m" -n 40 --runs 1 --predict --draft-cost 0.1 >"$TMPD/bench.txt" ||
  fail "bench --predict exited $?"
tail -1 "$TMPD/bench.txt" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["predict"] and j["accepted"] >= 0.9 * j["drafted"], j
assert not j["draft_cost_measured"] and j["draft_cost"] == 0.1, j
assert 3 * j["speculate_steps"] < j["plain_steps"], j
print("bench speculate --predict: %d steps against %d" % (j["speculate_steps"], j["plain_steps"]))'

# 5. The MTP layer.
g="$TMPD/g5mtp"
# (--mtp-oracle: an MTP layer that is always right, so that the jobs keep its drafts)
"$WICK_TOOLS/gen_glm" --family glm5 --mtp --mtp-oracle --vocab 512 --seed 3 -o "$g" >/dev/null ||
  fail "gen_glm"
cp "$m/tokenizer.json" "$g/"
python3 - "$TMPD/mjobs" <<'PY'
import json, os, sys
os.makedirs(sys.argv[1])
for n, p in enumerate(["Once upon a time", "Lily and Ben", "", "The cat sat. The cat sat.",
                       "Tom had a red ball.", "One day"]):
    json.dump({"id": f"m-{n}", "input": {"prompt": p, "max_tokens": 30 + 7 * n, "temperature": 0}},
              open(f"{sys.argv[1]}/{n}.json", "w"))
PY
for q in mplain mspec mlook; do
  for f in "$TMPD"/mjobs/*.json; do
    "$WICK" submit --queue "spool:$TMPD/$q" --file "$f" >/dev/null || fail "submit $f"
  done
done
"$WICK" worker --model "$g" --queue "spool:$TMPD/mplain" --idle-timeout 1 \
  2>"$TMPD/mplain.log" || fail "the plain GLM worker exited $?"
"$WICK" worker --model "$g" --queue "spool:$TMPD/mspec" --idle-timeout 1 --speculate 3 \
  --draft-cost 0.1 --step-log "$TMPD/mspec.steps" 2>"$TMPD/mspec.log" ||
  fail "the MTP worker exited $?"
"$WICK" worker --model "$g" --queue "spool:$TMPD/mlook" --idle-timeout 1 --speculate 3 \
  --drafter lookup 2>"$TMPD/mlook.log" || fail "the lookup GLM worker exited $?"
grep -q "speculative decoding on (the MTP layer drafts)" "$TMPD/mspec.log" ||
  fail "the MTP worker does not say its drafter: $(grep ready "$TMPD/mspec.log")"
grep -q "speculative decoding on (prompt lookup drafts)" "$TMPD/mlook.log" ||
  fail "--drafter lookup: $(grep ready "$TMPD/mlook.log")"
python3 - "$TMPD" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {q: {f: json.load(open(f"{d}/{q}/done/{f}")) for f in os.listdir(f"{d}/{q}/done")}
       for q in ("mplain", "mspec", "mlook")}
assert len(res["mplain"]) == len(res["mspec"]) == len(res["mlook"]) == 6, res
drafted = kept = 0
for k, a in sorted(res["mplain"].items()):
    for q in ("mspec", "mlook"):
        b = res[q][k]
        assert a["status"] == b["status"] == "COMPLETED", (a, b)
        assert a["output"]["token_ids"] == b["output"]["token_ids"], (q, k, a, b)
    det = res["mspec"][k]["usage"]["completion_tokens_details"]
    drafted += det["accepted_prediction_tokens"] + det["rejected_prediction_tokens"]
    kept += det["accepted_prediction_tokens"]
# an MTP layer that is always right: nearly every draft kept, up to 4 tokens a step
n = sum(len(v["output"]["token_ids"]) for v in res["mplain"].values())
assert kept >= 0.9 * drafted and kept >= n / 2, (kept, drafted, n)
print(f"MTP drafts: 6 greedy jobs the same with and without; kept {kept} of {drafted} drafts "
      f"for {n} tokens")
PY
grep -q '"draft": ' "$TMPD/mspec.steps" || fail "no MTP draft in the step log"
set +e
"$WICK" worker --model "$m" --queue "spool:$TMPD/mplain" --speculate 2 --drafter mtp \
  2>"$TMPD/bad.log"
rc=$?
set -e
[ $rc = 1 ] && grep -q "has no MTP layer to draft with" "$TMPD/bad.log" ||
  fail "--drafter mtp on stories260K: exit $rc: $(cat "$TMPD/bad.log")"
for args in "--drafter mtp" "--speculate 2 --drafter nope"; do
  set +e
  "$WICK" worker --model "$g" --queue "spool:$TMPD/mplain" $args 2>"$TMPD/bad.log"
  rc=$?
  set -e
  [ $rc = 2 ] && grep -q -- "--drafter" "$TMPD/bad.log" ||
    fail "$args: exit $rc: $(cat "$TMPD/bad.log")"
done
"$WICK" bench speculate "$g" -n 30 --runs 1 --prompt "Once upon a time" >"$TMPD/bench.txt" ||
  fail "bench speculate on the MTP model exited $?: $(cat "$TMPD/bench.txt")"
tail -1 "$TMPD/bench.txt" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["drafter"] == "mtp" and j["drafted"] > 0 and j["mtp_step_ms"] > 0, j
print("bench speculate with the MTP layer: %d drafts, a step with them %.2f ms" %
      (j["drafted"], j["mtp_step_ms"]))'
# the launches of a step that drafts with it (wick bench launches --drafts)
"$WICK" bench launches "$g" --steps 2 --drafts 2 | tail -1 >"$TMPD/l2.json" ||
  fail "bench launches --drafts exited $?"
"$WICK" bench launches "$g" --steps 2 --batch 1 | tail -1 >"$TMPD/l0.json" ||
  fail "bench launches exited $?"
python3 - "$TMPD/l0.json" "$TMPD/l2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["drafts"] == 2 and a["drafts"] == 0, (a, b)
k = "mla_absorbed"
assert b["launches"] > a["launches"] and b["by_kind"][k] > a["by_kind"][k], (a, b)
print(f"bench launches: a step with 2 MTP drafts {b['launches']:.0f} launches, "
      f"without {a['launches']:.0f}")
PY
echo "PASS"
