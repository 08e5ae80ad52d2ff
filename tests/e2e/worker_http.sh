# `wick worker` on the RunPod-compatible job API (http://), against tests/tools/runpod_server.py
# started here on a free loopback port with an API key and a ping lease: 200 jobs and two
# workers (one result each, idle exit), job-done posts failed with 500 and retried, bad jobs
# answered FAILED, pings every RUNPOD_PING_INTERVAL listing the held ids, a stop signal ending
# a running job CANCELLED, a SIGTERM drain that hands jobs back, kill -9 (the pings stop,
# the server requeues), and jobs that stream their text to the stream URL while a client reads
# it. Results are checked from the server's record of job-done posts.
source tests/e2e/lib.sh
m=$(stories)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
KEY="key-$RANDOM$RANDOM-secret"
python3 tests/tools/runpod_server.py --port "$port" --api-key "$KEY" --long-poll 2 --lease 3 \
  >"$TMPD/server.log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null; rm -rf "$TMPD"' EXIT
B=http://127.0.0.1:$port/v2/ep
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/admin/state" >/dev/null && break; sleep 0.05; done
curl -sf "http://127.0.0.1:$port/admin/state" >/dev/null || fail "runpod_server.py did not start: $(cat "$TMPD/server.log")"

unset RUNPOD_POD_ID RUNPOD_WEBHOOK_GET_JOB RUNPOD_WEBHOOK_POST_STREAM
export RUNPOD_AI_API_KEY=$KEY RUNPOD_PING_INTERVAL=500
export RUNPOD_WEBHOOK_POST_OUTPUT="$B/job-done/\$RUNPOD_POD_ID/\$ID?gpu=test"
export RUNPOD_WEBHOOK_PING="$B/ping/\$RUNPOD_POD_ID?gpu=test"
Q="$B/job-take/\$RUNPOD_POD_ID?gpu=test"

# The test's side of the server: rp enqueue PREFIX N MAX_TOKENS [greedy] | rp cancel ID | rp fail N |
# rp fail_stream N CODE |
# rp check PREFIX N (exactly one COMPLETED result per job) | rp state
cat >"$TMPD/rp.py" <<'PY'
import json, statistics, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/admin"
def call(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(), method="GET" if body is None else "POST")
    return json.load(urllib.request.urlopen(req))
cmd, args = sys.argv[2], sys.argv[3:]
if cmd == "enqueue":
    prefix, n, mt = args[0], int(args[1]), int(args[2])
    # greedy from "Once": the slow model's path that runs long without an end-of-text (as c-1)
    inp = {"prompt": "Once", "temperature": 0} if args[3:] == ["greedy"] else {"prompt": "Once upon a time", "temperature": 0.8}
    call("/enqueue", [{"id": f"{prefix}-{i}", "input": {**inp, "max_tokens": mt, "seed": i}} for i in range(1, n + 1)])
elif cmd == "raw":
    call("/enqueue", json.loads(args[0]))
elif cmd == "cancel":
    call("/cancel/" + args[0], {})
elif cmd == "fail":
    call(f"/fail_done?n={args[0]}", {})
elif cmd == "fail_stream":
    call(f"/fail_stream?n={args[0]}&code={args[1]}", {})
elif cmd == "check":
    s = call("/state")
    prefix, n = args[0], int(args[1])
    bad = []
    for i in range(1, n + 1):
        j = s["jobs"][f"{prefix}-{i}"]
        res = j["results"]
        if j["status"] != "COMPLETED" or len(res) != 1:
            bad.append((j["id"], j["status"], len(res))); continue
        b = res[0]["body"]
        out = b.get("output", {})
        assert "error" not in b and out.get("status") == "COMPLETED" and out.get("id") == j["id"], b
        assert out["usage"]["completion_tokens"] == len(out["output"]["token_ids"]) > 0, b
    assert not bad, f"{len(bad)} jobs without exactly one COMPLETED result, e.g. {bad[:5]}"
    stream = {p.get("stream") for p in s["posts"] if p["code"] == 200}
    assert stream == {"false"}, f"isStream values {stream}"
    assert s["unauthorized"] == 0, f"{s['unauthorized']} calls without the API key"
    print(f"{n} jobs, one COMPLETED result each")
elif cmd == "state":
    json.dump(call("/state"), sys.stdout)
PY
rp() { python3 "$TMPD/rp.py" "$port" "$@"; }

# Runs a worker in the background: its pid lands in $TMPD/NAME.pid, its exit status and time
# in $TMPD/NAME.exit; $! is the subshell that waits for it.
run_worker() { # NAME MODEL [flags...]
  local name=$1 model=$2
  shift 2
  rm -f "$TMPD/$name.pid"
  ( set +e; "$WICK" worker --model "$model" --queue "$Q" --worker-id "$name" "$@" 2>"$TMPD/$name.log" &
    echo $! >"$TMPD/$name.pid"; wait $!
    echo "$? $(date +%s.%N)" >"$TMPD/$name.exit" ) 2>/dev/null &
  for _ in $(seq 100); do [ -s "$TMPD/$name.pid" ] && break; sleep 0.01; done
}
wpid() { cat "$TMPD/$1.pid"; }
exited() { # NAME: fails unless the worker exited 0
  read -r code _ <"$TMPD/$1.exit"
  [ "$code" = 0 ] || fail "worker $1 exited $code: $(tail -5 "$TMPD/$1.log")"
}

# 1. 200 jobs, two workers: exactly one COMPLETED result each; each worker exits 0 by itself
#    within idle-timeout + 1 s of its last result.
rp enqueue a 200 12
run_worker w1 "$m" --concurrency 8 --idle-timeout 1
p1=$!
run_worker w2 "$m" --concurrency 8 --idle-timeout 1
p2=$!
wait $p1 $p2
exited w1
exited w2
rp check a 200 || fail "200 jobs, 2 workers"
rp state >"$TMPD/state1.json"
python3 - "$TMPD/state1.json" "$TMPD/w1.exit" "$TMPD/w2.exit" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for w, f in (("w1", sys.argv[2]), ("w2", sys.argv[3])):
    t_exit = float(open(f).read().split()[1])
    mine = [p["t"] for p in s["posts"] if p["worker"] == w and p["code"] == 200]
    assert mine, f"{w} posted no result"
    quiet = t_exit - max(mine)
    assert quiet <= 1 + 1, f"{w} exited {quiet:.2f} s after its last result (idle-timeout 1)"
    print(f"{w}: {len(mine)} results, exited {quiet:.2f} s after the last")
takes = [t for t in s["takes"] if t["ids"]]
assert any(t["batch_size"] > 1 and len(t["ids"]) > 1 for t in takes), "no batch take"
assert all(len(t["ids"]) <= t["batch_size"] for t in takes)
PY
[ $? = 0 ] || fail "idle exit"
grep -q 'exit: reason idle' "$TMPD/w1.log" || fail "w1 did not idle-exit"
! grep -q -- "$KEY" "$TMPD"/w*.log || fail "the API key appears in a worker log"

# 2. The server fails the first 10 job-done posts with HTTP 500: the worker retries, every job
#    still gets exactly one result.
rp fail 10
rp enqueue f 30 8
run_worker f1 "$m" --concurrency 8 --idle-timeout 1
wait $!
exited f1
rp check f 30 || fail "after failed posts"
rp state | python3 -c 'import json,sys; s=json.load(sys.stdin); assert s["failed_posts"] == 10, s["failed_posts"]' ||
  fail "the server did not fail 10 posts"
! grep -q 'not stored' "$TMPD/f1.log" || fail "a result was given up: $(grep 'not stored' "$TMPD/f1.log" | head -2)"

# 3. Bad jobs are answered FAILED (invalid_input) by the driver; the worker keeps going.
rp raw '[{"id": "bad/id", "input": {"prompt": "x"}}, {"id": "noinput"}, {"id": "strinput", "input": "hi"},
         {"id": "nest", "input": {"tenant": "t1", "input": {"prompt": "Once", "max_tokens": 3}}},
         {"id": "maxtok", "input": {"prompt": "hi", "max_tokens": 0}}]'
run_worker b1 "$m" --idle-timeout 1
wait $!
exited b1
rp state | python3 -c '
import json, sys
s = json.load(sys.stdin)["jobs"]
for i in ("bad/id", "noinput", "strinput", "maxtok"):
    assert s[i]["status"] == "FAILED" and len(s[i]["results"]) == 1, s[i]
    e = s[i]["results"][0]["body"]["error"]
    assert isinstance(e, str) and e.startswith("max_tokens_range:" if i == "maxtok" else "invalid_input:"), e
assert s["nest"]["status"] == "COMPLETED", s["nest"]
print("bad jobs FAILED with string errors")' || fail "bad jobs"

# 4. Pings every RUNPOD_PING_INTERVAL (500 ms) list the held job; the platform's stop signal
#    (job-stop) ends the running job CANCELLED. A slow random model keeps the job running.
slow=$TMPD/slow
"$WICK_TOOLS/gen_llama" -o "$slow" --hidden 384 --intermediate 1024 --layers 6 --heads 6 \
  --kv-heads 2 --vocab 512 --max-pos 8192 --dtype f32 --seed 9 >/dev/null
cp "$m/tokenizer.json" "$slow/"
rp raw '{"id": "c-1", "input": {"prompt": "Once", "max_tokens": 8000, "temperature": 0}}'
# --ping-url wins over RUNPOD_WEBHOOK_PING: its pings arrive under the name "flag-c1"
run_worker c1 "$slow" --idle-timeout 1 --ping-url "$B/ping/flag-\$RUNPOD_POD_ID?gpu=test"
pc=$!
sleep 2.5
t_cancel=$(date +%s.%N)
rp cancel c-1
wait $pc
exited c1
rp state >"$TMPD/state4.json"
python3 - "$TMPD/state4.json" "$t_cancel" <<'PY'
import json, statistics, sys
s, t_cancel = json.load(open(sys.argv[1])), float(sys.argv[2])
j = s["jobs"]["c-1"]
assert j["status"] == "CANCELLED" and len(j["results"]) == 1, j
b = j["results"][0]["body"]
assert b["error"].startswith("cancelled:") and b["output"]["status"] == "CANCELLED", b
assert b["output"]["usage"]["completion_tokens"] > 0, "the job never ran"
late = j["results"][0]["t"] - t_cancel
assert late < 3.0, f"the cancel took {late:.2f} s to end the job"
pings = [p for p in s["pings"] if p["worker"] == "flag-c1"]
assert not [p for p in s["pings"] if p["worker"] == "c1"], "RUNPOD_WEBHOOK_PING used despite --ping-url"
gaps = [b["t"] - a["t"] for a, b in zip(pings, pings[1:])]
held = [p for p in pings if p["job_ids"] == ["c-1"]]
assert len(held) >= 3, f"only {len(held)} pings listed c-1: {pings}"
assert 0.4 <= statistics.median(gaps) <= 0.7, f"ping gaps {gaps}"
assert all(p["runpod_version"] for p in pings)
print(f"{len(pings)} pings, median gap {statistics.median(gaps):.3f} s, {len(held)} listing c-1; cancelled {late:.2f} s after the signal")
PY
[ $? = 0 ] || fail "pings and cancel"

# 5. SIGTERM during a batch: in-flight jobs finish or are handed back (a retryable job-done)
#    within the drain timeout; another worker finishes them; none is lost or run twice.
rp enqueue t 8 1500 greedy
run_worker t1 "$slow" --concurrency 4 --drain-timeout 0.2 --idle-timeout 5
pt=$!
# mid-batch however fast the machine: 1,500 tokens take seconds on the slow model
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/t1.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.3
start=$(date +%s%N)
kill -TERM "$(wpid t1)"
wait $pt
took=$(( ($(date +%s%N) - start) / 1000000 ))
exited t1
[ $took -lt 5000 ] || fail "the drain took $took ms (drain timeout 0.2 s)"
grep -q 'reason signal' "$TMPD/t1.log" || fail "no drain in the log: $(tail -3 "$TMPD/t1.log")"
grep -q 'handed back' "$TMPD/t1.log" || fail "no job was handed back: $(grep -v job_done "$TMPD/t1.log" | tail -8)"
run_worker t2 "$m" --concurrency 8 --idle-timeout 1
wait $!
exited t2
rp check t 8 || fail "after SIGTERM"
rp state | python3 -c '
import json, sys
s = json.load(sys.stdin)
back = [j for j in s["jobs"].values() if j["id"].startswith("t-") and j["released"]]
assert back and all(j["deliveries"] == 2 for j in back), back
print(f"{len(back)} jobs handed back and finished by another worker")' || fail "hand-back"

# 6. kill -9: the worker's pings stop, the server requeues its jobs after the lease (3 s),
#    another worker finishes them.
rp enqueue k 4 1500 greedy
run_worker k1 "$slow" --concurrency 4 --idle-timeout 5
pk=$!
# mid-batch however fast the machine: 1,500 tokens take seconds on the slow model
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/k1.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.3
kill -KILL "$(wpid k1)"
wait $pk 2>/dev/null || true
run_worker k2 "$m" --concurrency 8 --idle-timeout 4.5
wait $!
exited k2
rp check k 4 || fail "after kill -9"
rp state | python3 -c '
import json, sys
s = json.load(sys.stdin)
exp = {e["id"] for e in s["expired"] if e["worker"] == "k1"}
ks = {i: (j["deliveries"], [r["worker"] for r in j["results"]]) for i, j in s["jobs"].items() if i.startswith("k-")}
unfinished = {i for i, (_, by) in ks.items() if by != ["k1"]}
assert exp and exp == unfinished, (exp, ks)
assert all(ks[i] == (2, ["k2"]) for i in exp), ks
print(f"kill -9: {len(exp)} jobs requeued by the ping lease and finished by another worker")' || fail "lease"

# 7. Streaming. Jobs with "stream": true have their text posted to the stream URL
#    (RUNPOD_WEBHOOK_POST_STREAM) as it is made, and a client reads it meanwhile through the
#    platform's /stream/ID: it sees text on several reads before the job ends; the pieces, in
#    order, are exactly the result's text; all of them were posted before the job-done, which
#    says isStream=true; a job that did not ask streams nothing. Then stream posts that fail
#    (HTTP 500, three times) are retried and lose nothing; a refused one (400) ends that job's
#    stream, and its result is still whole; with no stream URL a streaming job comes whole.
export RUNPOD_WEBHOOK_POST_STREAM="$B/job-stream/\$RUNPOD_POD_ID/\$ID?gpu=test"
streaming() { # ID MAX_TOKENS: a greedy job that asks to stream
  rp raw "[{\"id\": \"$1\", \"input\": {\"prompt\": \"Once upon a time\", \"temperature\": 0,
    \"max_tokens\": $2, \"stream\": true}}]"
}
rp raw '[{"id": "s-1", "input": {"prompt": "Once", "temperature": 0, "max_tokens": 600,
   "stream": true}},
  {"id": "s-2", "input": {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 40}},
  {"id": "s-3", "input": {"prompt": "Once upon a time", "temperature": 0.8, "seed": 3,
   "max_tokens": 200, "stream": true}}]'
run_worker s1 "$slow" --concurrency 4 --idle-timeout 1
ps=$!
python3 - "$port" "$KEY" >"$TMPD/client.json" <<'PY' || fail "the stream client"
import json, sys, time, urllib.request
port, key = sys.argv[1], sys.argv[2]
text, reads_with_text, t0 = [], 0, time.time()
while time.time() - t0 < 120:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/ep/stream/s-1",
                                 headers={"Authorization": key})
    r = json.load(urllib.request.urlopen(req))
    reads_with_text += bool(r["stream"])
    text += [p["output"]["text"] for p in r["stream"]]
    if r["status"] != "IN_PROGRESS" and r["status"] != "IN_QUEUE":
        break
    time.sleep(0.1)
json.dump({"text": "".join(text), "reads": reads_with_text, "status": r["status"]}, sys.stdout)
PY
wait $ps
exited s1
rp fail_stream 3 500
streaming s-4 120
run_worker s4 "$m" --idle-timeout 1
wait $!
exited s4
rp fail_stream 1 400
streaming s-5 120
run_worker s5 "$m" --idle-timeout 1
wait $!
exited s5
grep -q "job s-5: its stream stopped (HTTP 400)" "$TMPD/s5.log" ||
  fail "the refused stream is not in the log: $(tail -3 "$TMPD/s5.log")"
unset RUNPOD_WEBHOOK_POST_STREAM
rp raw '[{"id": "s-6", "input": {"prompt": "Once upon a time", "max_tokens": 20, "stream": true}}]'
run_worker s6 "$m" --idle-timeout 1
wait $!
exited s6
rp state >"$TMPD/state7.json"
python3 - "$TMPD/state7.json" "$TMPD/client.json" <<'PY' || fail "streaming"
import json, sys
s, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
jobs = s["jobs"]
def done(i):
    (p,) = [p for p in s["posts"] if p["id"] == i and p["code"] == 200]
    return p
def text(i):
    return done(i)["body"]["output"]["output"]["text"]
def streamed(i):
    return "".join(p["output"]["text"] for p in jobs[i]["stream"])
assert all(jobs[i]["status"] == "COMPLETED" for i in jobs if i.startswith("s-")), jobs
assert c["status"] == "COMPLETED" and c["text"] == text("s-1"), (c, text("s-1")[:80])
assert c["reads"] >= 3, f"the client saw text on {c['reads']} reads: not streamed"
for i in ("s-1", "s-3"):
    assert len(jobs[i]["stream"]) >= 3 and streamed(i) == text(i), i
    assert not any(p["done_before"] for p in jobs[i]["stream"]), f"{i}: a piece after the end"
    assert done(i)["stream"] == "true", (i, done(i)["stream"])
assert jobs["s-2"]["stream"] == [] and done("s-2")["stream"] == "false", jobs["s-2"]
print(f"streaming: s-1's {len(text('s-1'))} bytes in {len(jobs['s-1']['stream'])} pieces, read "
      f"by a client on {c['reads']} reads before it ended; s-2 not streamed")
assert s.get("stream_failures") == 4, s.get("stream_failures")
assert streamed("s-4") == text("s-4"), "s-4 lost text"
assert jobs["s-5"]["stream"] == [] and done("s-5")["stream"] == "true" and text("s-5"), jobs["s-5"]
assert jobs["s-6"]["stream"] == [] and done("s-6")["stream"] == "false", jobs["s-6"]
print("streaming: 3 failed pieces retried, nothing lost; a refused one ended that stream, the "
      "result whole; no stream URL, no stream")
PY

# 8. A job-done post that takes a second (a platform's API at a distance) holds up no step:
#    the committer makes it beside the steps, so the job running beside the one being posted
#    decodes in its own steps' time (40 steps of 20 ms); posted from the worker's thread, it
#    waited the second out too.
port2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/tools/runpod_server.py --port "$port2" --long-poll 2 --delay-ms 1000 \
  >"$TMPD/server2.log" 2>&1 &
spid2=$!
trap 'kill $spid $spid2 2>/dev/null; rm -rf "$TMPD"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port2/admin/state" >/dev/null && break; sleep 0.05; done
B2=http://127.0.0.1:$port2/v2/ep
python3 - "$port2" <<'PY'
import json, sys, urllib.request
body = [{"id": "d-1", "input": {"prompt": "Once", "max_tokens": 2}},
        {"id": "d-2", "input": {"prompt": "Once", "max_tokens": 40}}]
urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/admin/enqueue",
                                              data=json.dumps(body).encode(), method="POST"))
PY
WICK_NULL_STEP_MS=20 "$WICK" worker --model "$m" --queue "$B2/job-take/\$RUNPOD_POD_ID" \
  --done-url "$B2/job-done/\$RUNPOD_POD_ID/\$ID" --ping-url "$B2/ping/\$RUNPOD_POD_ID" \
  --worker-id far --backend null --concurrency 2 --max-jobs 2 2>"$TMPD/far.log" ||
  fail "the worker on the distant API: $(tail -3 "$TMPD/far.log")"
python3 - "$TMPD/far.log" <<'PY' || fail "a job-done post held up the steps"
import re, sys
log = open(sys.argv[1]).read()
d = {m.group(1): (int(m.group(2)), float(m.group(3))) for m in re.finditer(
    r"job (d-\d): COMPLETED, \d+ prompt \+ \d+ completion tokens, (\d+) steps.*?, ([0-9.]+) s$",
    log, re.M)}
assert set(d) == {"d-1", "d-2"}, log
steps, secs = d["d-2"]
# (speculation may take fewer steps than tokens: the null engine's tokens repeat)
assert steps >= 10 and secs < steps * 0.020 + 0.5, f"d-2: {steps} steps in {secs} s"
print(f"a 1 s job-done post beside the steps: d-2's {steps} steps of 20 ms took {secs:.2f} s")
PY

# 9. The platform's API gone mid-run (the server killed while 2 jobs run, every slot busy):
#    the pings' and then the takes' failures are reported on every call once they have
#    lasted 2 s, so --queue-outage 3 gives up with exit 4 (the platform requeues the jobs when
#    the pings stop), not after minutes of takes that said "recovered" between two reports;
#    and the result of the job that ends meanwhile (g-1), which the committer is posting, is
#    given up with the queue rather than retried for its whole minute.
port3=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/tools/runpod_server.py --port "$port3" --long-poll 2 >"$TMPD/server3.log" 2>&1 &
spid3=$!
trap 'kill $spid $spid2 $spid3 2>/dev/null; rm -rf "$TMPD"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port3/admin/state" >/dev/null && break; sleep 0.05; done
B3=http://127.0.0.1:$port3/v2/ep
curl -sf -X POST "http://127.0.0.1:$port3/admin/enqueue" -d '[{"id": "g-1", "input": {"prompt":
  "Once", "max_tokens": 40}}, {"id": "g-2", "input": {"prompt": "Once", "max_tokens": 400}}]' \
  >/dev/null || fail "enqueue on the third server"
WICK_NULL_STEP_MS=50 "$WICK" worker --model "$m" --queue "$B3/job-take/\$RUNPOD_POD_ID" \
  --done-url "$B3/job-done/\$RUNPOD_POD_ID/\$ID" --ping-url "$B3/ping/\$RUNPOD_POD_ID" \
  --worker-id gone --backend null --concurrency 2 --queue-outage 3 --idle-timeout 60 \
  2>"$TMPD/gone.log" &
gpid=$!
for _ in $(seq 100); do grep -q 'BUSY' "$TMPD/gone.log" && break; sleep 0.05; done
kill -9 $spid3
t0=$(date +%s.%N)
rc=0
wait $gpid || rc=$?
secs=$(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 1))")
[ $rc = 4 ] && grep -q 'unhealthy: every call on the queue has failed for' "$TMPD/gone.log" ||
  fail "the API gone: exit $rc after $secs s: $(tail -3 "$TMPD/gone.log")"
python3 -c "import sys; sys.exit(0 if $secs < 15 else 1)" ||
  fail "the API gone: exit 4 only after $secs s: $(cut -c1-250 "$TMPD/gone.log" | tail -12)"
! grep -q 'queue_recovered' "$TMPD/gone.log" || fail "a dead API said recovered: $(grep recovered "$TMPD/gone.log" | head -2)"
grep -q 'job g-1: the result was not stored (job g-1: job-done' "$TMPD/gone.log" ||
  fail "g-1's post was not given up with the queue: $(cut -c1-250 "$TMPD/gone.log" | tail -6)"
echo "the API gone mid-run: exit 4 after $secs s (--queue-outage 3), g-1's post given up"
echo ok
