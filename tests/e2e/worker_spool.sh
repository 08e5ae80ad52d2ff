# The worker on the embedded spool queue with the real stories260K model: many jobs and two
# workers (exactly one result each, idle exit), bad jobs, cancel, kill -9 with reclaim, and a
# SIGTERM drain. Results are checked from the spool's done/ directory.
source tests/e2e/lib.sh
m=$(stories)
Q=$TMPD/q

submit_many() { # N MAX_TOKENS PREFIX
  for i in $(seq 1 "$1"); do
    printf '{"id": "%s-%d", "tenant": "t%d", "input": {"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0.7, "seed": %d}}\n' \
      "$3" "$i" $((i % 3)) "$2" "$i" >"$TMPD/job.json"
    "$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null || fail "submit $i"
  done
}

check_results() { # PREFIX N: exactly one COMPLETED result per job
  python3 - "$Q" "$1" "$2" <<'PY'
import json, os, sys
q, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
done = {f[:-5]: json.load(open(os.path.join(q, "done", f))) for f in os.listdir(os.path.join(q, "done")) if f.startswith(prefix + "-")}
missing = [i for i in range(1, n + 1) if f"{prefix}-{i}" not in done]
assert not missing, f"no result for {len(missing)} jobs, e.g. {missing[:5]}"
bad = {k: v["status"] for k, v in done.items() if v["status"] != "COMPLETED"}
assert not bad, f"not completed: {list(bad.items())[:5]}"
for k, v in done.items():
    u = v["usage"]
    assert v["id"] == k and v["attempt"] >= 1 and "error" not in v, v
    assert u["completion_tokens"] == len(v["output"]["token_ids"]) > 0, v
    assert u["cost_micro_usd"] >= 0 and abs(float(u["cost_usd"]) * 1e6 - u["cost_micro_usd"]) < 1, u
left = [d for d in ("new", "claimed") if os.listdir(os.path.join(q, d))]
assert not left, f"jobs left in {left}: {[os.listdir(os.path.join(q, d)) for d in left]}"
print(f"{len(done)} results, all COMPLETED")
PY
}

# 1. 200 jobs, two workers; each exits 0 by itself within idle-timeout + 1 s of going quiet.
submit_many 200 12 a
for w in 1 2; do
  "$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --idle-timeout 1 \
    --worker-id w$w --price-per-hour 36.31 --step-log "$TMPD/steps$w" 2>"$TMPD/w$w.log" &
  eval pid$w=$!
done
wait $pid1 || fail "worker 1 exited $?"
wait $pid2 || fail "worker 2 exited $?"
check_results a 200 || fail "results"
idle_exit_within "$TMPD/w1.log" 1
idle_exit_within "$TMPD/w2.log" 1
# Both workers took jobs, and jobs shared steps (the step log).
for w in 1 2; do
  n=$(grep -c 'job_done' "$TMPD/w$w.log" || true)
  [ "$n" -gt 0 ] || fail "worker $w took no job"
done
python3 - "$TMPD/steps1" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
assert max(len(s["items"]) for s in steps) >= 4, "jobs never shared a step"
PY

# 2. Bad jobs end FAILED with the contract's codes, and the worker keeps going.
mkdir -p "$Q/new"
printf 'not json' >"$Q/new/broken.json"
printf '{"id": "noinput", "input": {}}' >"$Q/new/noinput.json"
printf '{"id": "toolong", "input": {"prompt": "%s"}}' "$(python3 -c 'print("Once upon a time " * 200)')" >"$Q/new/toolong.json"
printf '{"id": "maxtok", "input": {"prompt": "hi", "max_tokens": 0}}' >"$Q/new/maxtok.json"
# refused on sight, each with a log line: a link (never followed), a directory, a name
# that is not a job id (no result: no id to key it)
printf 'root:x:0:0' >"$TMPD/secret"
ln -s "$TMPD/secret" "$Q/new/link.json"
mkdir "$Q/new/adir.json"
printf '{}' >"$Q/new/bad id.json"
submit_many 3 8 b
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 1 2>"$TMPD/w3.log" || fail "worker exit"
for l in "job link: new/link.json is a symbolic link, not a regular file" \
  "job adir: new/adir.json is a directory, not a regular file" \
  "'new/bad id.json': the name is not a job id"; do
  grep -qF "job_refused: $l" "$TMPD/w3.log" || fail "no refusal '$l' in the log"
done
grep -q "exit: reason idle; 10 jobs taken, 3 completed, 7 failed" "$TMPD/w3.log" ||
  fail "refusals not counted: $(grep exit: "$TMPD/w3.log")"
python3 - "$Q" <<'PY'
import json, os, sys
q = sys.argv[1]
r = lambda i: json.load(open(os.path.join(q, "done", i + ".json")))
want = {"broken": "invalid_json", "noinput": "invalid_input", "toolong": "prompt_too_long", "maxtok": "max_tokens_range"}
for i, code in want.items():
    v = r(i)
    assert v["status"] == "FAILED" and v["error"]["code"] == code, (i, v)
assert os.path.exists(os.path.join(q, "failed", "broken.json")), "the unparseable input is not kept"
for i in ("link", "adir"):
    v = r(i)
    assert v["status"] == "FAILED" and v["error"]["code"] == "invalid_input" and "root" not in json.dumps(v), (i, v)
assert os.path.islink(os.path.join(q, "failed", "link.json")) and os.path.isdir(os.path.join(q, "failed", "adir.json"))
assert os.path.exists(os.path.join(q, "failed", "bad id.json")) and not os.path.exists(os.path.join(q, "done", "bad id.json"))
assert all(r(f"b-{i}")["status"] == "COMPLETED" for i in (1, 2, 3))
print("bad jobs failed with their codes")
PY
check_results b 3 || fail "good jobs after bad ones"

# 3. Cancel: a job cancelled before it runs, and one cancelled while it runs (on a slower
#    random model with a long context and stories260K's tokenizer), end CANCELLED.
slow=$TMPD/slow
"$WICK_TOOLS/gen_llama" -o "$slow" --hidden 384 --intermediate 1024 --layers 6 --heads 6 \
  --kv-heads 2 --vocab 512 --max-pos 8192 --dtype f32 --seed 9 >/dev/null
cp "$m/tokenizer.json" "$slow/"
printf '{"id": "c-0", "input": {"prompt": "Once", "max_tokens": 10}}' >"$TMPD/job.json"
"$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null
: >"$Q/cancel/c-0"
printf '{"id": "c-1", "input": {"prompt": "Once", "max_tokens": 8000, "temperature": 0}}' >"$TMPD/job.json"
"$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null
"$WICK" worker --model "$slow" --queue "spool:$Q" --idle-timeout 1 2>"$TMPD/w4.log" &
pid=$!
sleep 1
: >"$Q/cancel/c-1"
wait $pid || fail "worker exit after cancel"
python3 - "$Q" <<'PY'
import json, sys
for i in ("c-0", "c-1"):
    v = json.load(open(f"{sys.argv[1]}/done/{i}.json"))
    assert v["status"] == "CANCELLED" and v["error"]["code"] == "cancelled", v
    assert (v["usage"]["completion_tokens"] > 0) == (i == "c-1"), v
PY

# 4. kill -9 of one of two workers mid-batch: its jobs are reclaimed (short lease), every job
#    completes exactly once.
submit_many 40 64 k
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --lease 2 --idle-timeout 3 \
  2>"$TMPD/k1.log" &
k1=$!
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --lease 2 --idle-timeout 3 \
  2>"$TMPD/k2.log" &
k2=$!
# mid-batch however fast the machine: killed once k1 is busy
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/k1.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.1
kill -9 $k1
wait $k1 2>/dev/null || true
wait $k2 || fail "the surviving worker exited $?"
check_results k 40 || fail "after kill -9"

# 5. SIGTERM during a batch: in-flight jobs finish or go back to new/ within the drain
#    timeout; the worker exits 0; a second worker finishes what was handed back.
submit_many 16 400 t
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 4 --drain-timeout 0.3 \
  --idle-timeout 5 2>"$TMPD/t1.log" &
t1=$!
sleep 0.5
start=$(date +%s%N)
kill -TERM $t1
wait $t1 || fail "SIGTERM: exit $?"
took=$(( ($(date +%s%N) - start) / 1000000 ))
[ $took -lt 5000 ] || fail "the drain took $took ms (drain timeout 0.3 s)"
grep -q 'reason signal' "$TMPD/t1.log" || fail "no drain in the log"
[ -z "$(ls "$Q/claimed")" ] || fail "claims left after the drain: $(ls "$Q/claimed")"
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --idle-timeout 1 2>/dev/null || fail "second worker"
check_results t 16 || fail "after SIGTERM"
echo ok
