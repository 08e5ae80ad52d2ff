# wick dev: an OpenAI-compatible session on the real stories260K model, driven by the official
# `openai` npm package (installed from the npm registry into $WICK_BUILD/node-openai, once).
#   1. refusals: a non-loopback address without a key, a bad keys file
#   2. the openai client: chat, streamed chat (same text), streamed completion, models, a
#      request for another model (404), a wrong key (401); unseeded requests draw afresh
#   3. 50 concurrent streaming clients for $WICK_DEV_LOAD_SECONDS (default 15) s: every stream
#      ends with data: [DONE]; p50/p99 time to first token; the requests shared steps
#   4. 100+ malformed or hostile requests: each a 4xx or cut by the timeout; still serving
#   5. tenants from the keys file reach the usage ledger; keys never reach the log
#   6. a queue job and HTTP requests in one step (wick worker --queue ... --listen ...)
#   7. a client that disconnects mid-stream frees its slot for the next (--concurrency 1); one
#      that disconnects from a request not streamed cancels it too
#   7c. fairness between tenants (--concurrency 1): team-b's one request, sent after team-a's
#      burst of 6, runs as soon as the slot frees, not after the whole burst
#   8. SIGTERM drains: the running stream finishes, a request already accepted is served,
#      new requests get 503, exit 0
#   9. idle exit: the session ends by itself, exit 0, and prints its bill
source tests/e2e/lib.sh
command -v curl >/dev/null || fail "curl is needed"
need_openai
m=$(stories)
# on exit, stop what is still running of ours (jobs -p: this shell's live background jobs only)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$TMPD"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() { # PORT PID
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ] && return 0
    kill -0 "$2" 2>/dev/null || fail "the server exited during start-up"
    sleep 0.1
  done
  fail "the server on port $1 did not become ready"
}
client() { node tests/tools/openai_client.js "$@" --openai "$OPENAI"; }

# 1. Refusals.
set +e
"$WICK" dev --model "$m" --listen 0.0.0.0:$(free_port) --idle-timeout 5 2>"$TMPD/refuse.log"
rc=$?
set -e
[ $rc = 2 ] || fail "a non-loopback address without a key: exit $rc, want 2"
grep -q 'not a loopback address' "$TMPD/refuse.log" || fail "no reason given: $(cat "$TMPD/refuse.log")"
printf 'good-key-1 t1\nsecret-key-2 t2 extra\n' >"$TMPD/badkeys"
set +e
"$WICK" dev --model "$m" --listen 127.0.0.1:$(free_port) --api-keys "$TMPD/badkeys" 2>"$TMPD/refuse2.log"
rc=$?
set -e
[ $rc = 2 ] || fail "a malformed keys file: exit $rc, want 2"
grep -q 'line 2' "$TMPD/refuse2.log" || fail "the message does not name the line: $(cat "$TMPD/refuse2.log")"
! grep -q 'secret-key-2' "$TMPD/refuse2.log" || fail "a key was printed"
echo "refused: non-loopback without a key (exit 2), a bad keys file (exit 2, line named)"

# The main session: two tenants' keys, a ledger, a short slow-client timeout.
K1=key-one-$RANDOM$RANDOM
K2=key-two-$RANDOM$RANDOM
printf '# key tenant\n%s team-a\n\n%s team-b\n' "$K1" "$K2" >"$TMPD/keys"
P=$(free_port)
"$WICK" dev --model "$m" --listen 127.0.0.1:$P --api-keys "$TMPD/keys" --concurrency 16 \
  --idle-timeout 300 --ledger "$TMPD/ledger" --step-log "$TMPD/steps" 2>"$TMPD/dev.log" &
dev=$!
wait_ready $P $dev
BASE=http://127.0.0.1:$P/v1

# 2. The official client.
client basic --base "$BASE" --key "$K1" --model stories260K

# Requests that name no seed draw afresh each time (the seed was the second XOR the slot:
# a client's requests within a second all got one text).
for i in 1 2 3 4 5 6; do
  curl -sf -H "Authorization: Bearer $K1" "$BASE/completions" \
    -d '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.5}' |
    python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))'
done >"$TMPD/unseeded"
[ "$(sort -u "$TMPD/unseeded" | wc -l)" -ge 4 ] ||
  fail "6 unseeded requests gave only $(sort -u "$TMPD/unseeded" | wc -l) distinct texts"
echo "unseeded: $(sort -u "$TMPD/unseeded" | wc -l) distinct texts from 6 requests"
# a prompt and an explicit max_tokens past the context: 400, as OpenAI answers (not cut short)
code=$(curl -s -o "$TMPD/ctx.json" -w '%{http_code}' -H "Authorization: Bearer $K1" \
  "$BASE/completions" -d '{"prompt": "Once upon a time", "max_tokens": 510}')
[ "$code" = 400 ] && grep -q 'past the context of 512' "$TMPD/ctx.json" ||
  fail "prompt + max_tokens past the context: $code $(cat "$TMPD/ctx.json")"
echo "prompt + max_tokens past the context: 400 ($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$TMPD/ctx.json"))"

# HEAD is GET without the body; OPTIONS (a browser's CORS preflight) needs no key and names
# what a page on another origin may send, since this server takes keys
hd=$(curl -s -I "$BASE/models" -H "Authorization: Bearer $K1")
echo "$hd" | has '^HTTP/1.1 200' && echo "$hd" | has -i '^Access-Control-Allow-Origin: \*' ||
  fail "HEAD /v1/models: $hd"
# two HEADs on one kept-alive connection: no body after the headers (libevent sent one, which
# the client read as the start of the next response)
hv=$(curl -s -v -I -H "Authorization: Bearer $K1" "$BASE/models" "http://127.0.0.1:$P/health" 2>&1)
[ "$(echo "$hv" | grep -c '^< HTTP/1.1 200')" = 2 ] && ! echo "$hv" | has -i 'excess' ||
  fail "HEAD twice on one connection: $hv"
pre=$(curl -s -i -X OPTIONS "$BASE/chat/completions" -H 'Origin: http://localhost:5173' \
  -H 'Access-Control-Request-Method: POST' \
  -H 'Access-Control-Request-Headers: authorization, content-type, x-stainless-os')
echo "$pre" | has '^HTTP/1.1 204' &&
  echo "$pre" | has -i '^Access-Control-Allow-Headers: authorization, content-type, x-stainless-os' &&
  echo "$pre" | has -i '^Access-Control-Allow-Methods: POST' ||
  fail "CORS preflight: $pre"
code=$(curl -s -o /dev/null -w '%{http_code}' -X OPTIONS "$BASE/nowhere")
[ "$code" = 404 ] || fail "OPTIONS on no route: $code"
echo "HEAD and CORS preflight: 200 and 204, allowed headers echoed"

# 3. Load.
secs=${WICK_DEV_LOAD_SECONDS:-15}
client load --base "$BASE" --key "$K2" --model stories260K --clients 50 --seconds "$secs" \
  --max-tokens 32 | tee "$TMPD/load.json"
python3 - "$TMPD/load.json" "$TMPD/steps" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["streams"] >= 50, r
steps = [json.loads(l) for l in open(sys.argv[2])]
widest = max(len(s["items"]) for s in steps)
assert widest >= 8, f"HTTP requests never shared a step (at most {widest} per step)"
print(f"50 clients: {r['streams']} streams, all ended with [DONE]; time to first token "
      f"p50 {r['ttft_p50_ms']} ms, p99 {r['ttft_p99_ms']} ms; up to {widest} requests per step")
PY
kill -0 $dev || fail "the server died under load"

# 4. Hostile requests, on a second session with a 2 s slow-client timeout.
P2=$(free_port)
"$WICK" dev --model "$m" --listen 127.0.0.1:$P2 --api-keys "$TMPD/keys" --http-timeout 2 \
  --max-connections 32 --idle-timeout 300 2>"$TMPD/hostile.log" &
hs=$!
wait_ready $P2 $hs
python3 tests/tools/http_hostile.py --port $P2 --key "$K1" --model stories260K --timeout 2 \
  --max-connections 32
kill -0 $hs || fail "the server died under hostile requests"
curl -sf -H "Authorization: Bearer $K1" "http://127.0.0.1:$P2/metrics" >"$TMPD/metrics2"
python3 - "$TMPD/metrics2" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
v = lambda name: float(re.search(r"^" + re.escape(name) + r" (\S+)$", t, re.M).group(1))
assert v('wick_http_requests_total{code="401"}') >= 15 and v('wick_http_requests_total{code="404"}') >= 10
assert v('wick_http_requests_total{code="400"}') >= 50
PY
! grep -q -e "$K1" -e "$K2" "$TMPD/hostile.log" || fail "an API key reached the log"
kill -TERM $hs
wait $hs || fail "the hostile session exited $? on SIGTERM"

# 5. Metrics, tenants, keys.
curl -sf -H "Authorization: Bearer $K1" "http://127.0.0.1:$P/metrics" >"$TMPD/metrics"
python3 - "$TMPD/metrics" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
v = lambda name: float(re.search(r"^" + re.escape(name) + r" (\S+)$", t, re.M).group(1))
assert v('wick_http_requests_total{code="200"}') >= 50, "too few 200s"
assert v('wick_http_requests_total{code="401"}') >= 1 and v('wick_http_requests_total{code="404"}') >= 1
assert v("wick_completion_tokens_total") > 0 and v("wick_time_to_first_token_seconds_count") >= 50
assert v('wick_time_to_first_token_seconds_bucket{le="+Inf"}') == v("wick_time_to_first_token_seconds_count")
assert v("wick_cost_usd_total") > 0 and v('wick_state_seconds_total{state="BUSY"}') > 0
print("metrics: requests by code, tokens, latency histograms, seconds per state, cost")
PY
python3 - "$TMPD/ledger" <<'PY'
import json, sys
reqs = [e for e in map(json.loads, open(sys.argv[1])) if e["type"] == "request"]
tenants = {}
for e in reqs:
    tenants[e["tenant"]] = tenants.get(e["tenant"], 0) + 1
assert set(tenants) == {"team-a", "team-b"}, tenants
assert all(e["id"].startswith(("chatcmpl-", "cmpl-")) for e in reqs)
print(f"ledger: {len(reqs)} HTTP requests billed to {tenants}")
PY
! grep -q -e "$K1" -e "$K2" "$TMPD/dev.log" "$TMPD/ledger" || fail "an API key reached the log or the ledger"
kill -TERM $dev
wait $dev || fail "the session exited $? on SIGTERM"
grep -q 'bill: session' "$TMPD/dev.log" || fail "no bill: $(tail -3 "$TMPD/dev.log")"

# A slow model (random weights, stories260K's tokenizer): stories260K finishes too quickly
# to be caught mid-stream.
slow=$TMPD/slow
"$WICK_TOOLS/gen_llama" -o "$slow" --hidden 384 --intermediate 1024 --layers 6 --heads 6 \
  --kv-heads 2 --vocab 512 --max-pos 8192 --dtype f32 --seed 9 >/dev/null
cp "$m/tokenizer.json" "$slow/"

# 6. One worker, a queue and HTTP: queue jobs and HTTP requests share steps.
Q=$TMPD/q
P=$(free_port)
"$WICK" worker --model "$slow" --queue "spool:$Q" --listen 127.0.0.1:$P --concurrency 8 \
  --idle-timeout 2 --step-log "$TMPD/steps-mixed" 2>"$TMPD/mixed.log" &
mixed=$!
wait_ready $P $mixed
# no keys: not opened to other origins' pages
! curl -s -D - -o /dev/null "http://127.0.0.1:$P/health" | has -i '^Access-Control' ||
  fail "a server without keys sent CORS headers"
curls=()
for i in 1 2 3; do
  curl -sf "http://127.0.0.1:$P/v1/completions" \
    -d '{"prompt": "The dog", "max_tokens": 60, "temperature": 0}' \
    >"$TMPD/mixed-$i.json" &
  curls+=($!)
done
for i in 1 2 3 4; do
  printf '{"id": "q-%d", "input": {"prompt": "Once upon a time", "max_tokens": 10}}' $i >"$TMPD/job.json"
  "$WICK" submit --queue "spool:$Q" --file "$TMPD/job.json" >/dev/null
done
for c in "${curls[@]}"; do wait $c || fail "an HTTP request to the mixed worker failed"; done
wait $mixed || fail "the mixed worker exited $?"
python3 - "$TMPD/steps-mixed" "$Q" "$TMPD"/mixed-*.json <<'PY'
import json, os, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
both = [s for s in steps if any(i["id"].startswith("q-") for i in s["items"])
        and any(i["id"].startswith("cmpl-") for i in s["items"])]
assert both, "no step ran a queue job and an HTTP request together"
for i in range(1, 5):
    assert json.load(open(f"{sys.argv[2]}/done/q-{i}.json"))["status"] == "COMPLETED"
for f in sys.argv[3:]:
    assert json.load(open(f))["choices"][0]["text"], f
print(f"queue jobs and HTTP requests shared {len(both)} steps in one worker")
PY

# 7. A client that disconnects mid-stream frees its slot: one slot; client A leaves after 5
#    chunks, client B then runs.
P=$(free_port)
"$WICK" dev --model "$slow" --served-name slow --listen 127.0.0.1:$P --api-key "$K1" \
  --concurrency 1 --idle-timeout 60 --step-log "$TMPD/steps-slow" --drain-timeout 20 \
  2>"$TMPD/slow.log" &
sd=$!
wait_ready $P $sd
client disconnect --base "http://127.0.0.1:$P/v1" --key "$K1" --model slow --max-tokens 4000 \
  | tee "$TMPD/disc.json"
sleep 0.3
python3 - "$TMPD/disc.json" "$TMPD/steps-slow" "$TMPD/slow.log" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
steps = [json.loads(l) for l in open(sys.argv[2])]
a = [k for k, s in enumerate(steps) if any(i["id"] == d["a"] for i in s["items"])]
b = [k for k, s in enumerate(steps) if any(i["id"] == d["b"] for i in s["items"])]
assert a and b, "A or B never ran"
assert len(a) < 4000, "A ran to its max_tokens: the disconnect did not cancel it"
assert max(a) < min(b), "B ran before A's slot was free (concurrency 1)"
assert all(len(s["items"]) == 1 for s in steps)
log = open(sys.argv[3]).read()
assert f"job {d['a']}: CANCELLED" in log, "A did not end CANCELLED"
print(f"disconnect: A stopped after {len(a)} of 4000 tokens (steps {a[0]}..{a[-1]}); "
      f"B took the slot at step {b[0]} and finished")
PY
# the count is taken on the server thread when it sees the close: allow it a moment
for i in $(seq 1 30); do
  curl -s -m 5 -H "Authorization: Bearer $K1" "http://127.0.0.1:$P/metrics" >"$TMPD/metrics-slow" || true
  grep -q 'wick_http_requests_total{code="499"} 1$' "$TMPD/metrics-slow" && break
  sleep 0.1
done
grep -q 'wick_http_requests_total{code="499"} 1$' "$TMPD/metrics-slow" ||
  fail "/metrics does not count the disconnect once: $(grep -E 'requests_total' "$TMPD/metrics-slow" | tr '\n' ' ')"

# 7b. So does one whose request is not streamed: nothing is written to it before the end, so
#     only the server's own watch on the socket sees it go (raw socket, closed after 0.3 s;
#     greedy, it would run 4000 tokens, about 12 s).
python3 - $P "$K1" <<'PY'
import json, socket, sys, time
body = json.dumps({"model": "slow", "prompt": "Once upon a time", "max_tokens": 4000,
                   "temperature": 0}).encode()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sys.argv[2]}\r\n"
          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
time.sleep(0.3)
s.close()
PY
for i in $(seq 1 50); do
  [ "$(grep -c 'job cmpl-.*: CANCELLED' "$TMPD/slow.log")" = 1 ] && break
  sleep 0.1
done
grep 'job cmpl-.*: CANCELLED' "$TMPD/slow.log" | grep -v ' 4000 completion' >/dev/null ||
  fail "a non-streamed request whose client left was not cancelled: $(grep 'job_done: job cmpl-' "$TMPD/slow.log" | tail -1)"
curl -s -m 5 -H "Authorization: Bearer $K1" "http://127.0.0.1:$P/metrics" >"$TMPD/metrics-slow"
grep -q 'wick_http_requests_total{code="499"} 2$' "$TMPD/metrics-slow" ||
  fail "/metrics does not count the non-streamed disconnect: $(grep -E 'requests_total' "$TMPD/metrics-slow" | tr '\n' ' ')"
code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 -H "Authorization: Bearer $K1" \
  "http://127.0.0.1:$P/v1/completions" -d '{"prompt": "x", "max_tokens": 2}')
[ "$code" = 200 ] || fail "the slot of the cancelled request was not freed: $code"
echo "disconnect, not streamed: cancelled ($(grep -o 'job cmpl-.*: CANCELLED.*' "$TMPD/slow.log" | cut -d, -f2)), counted 499, its slot reused"

# 7c. One slot, two tenants: team-a sends 6 requests at once, team-b one once they wait; the
#     worker takes the first to come of the tenant it holds fewest of.
P3=$(free_port)
"$WICK" dev --model "$m" --listen 127.0.0.1:$P3 --api-keys "$TMPD/keys" --concurrency 1 \
  --idle-timeout 60 2>"$TMPD/fair.log" &
fd=$!
wait_ready $P3 $fd
python3 - $P3 "$K1" "$K2" <<'PY' || fail "team-b's request waited behind team-a's burst"
import json, sys, threading, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
done = []
def post(key, who):
    body = {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0,
            "logit_bias": {"1": -100, "2": -100}}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Authorization": f"Bearer {key}",
                                  "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 200
    done.append(who)
def queued():
    req = urllib.request.Request(url + "/metrics", None, {"Authorization": f"Bearer {sys.argv[2]}"})
    text = urllib.request.urlopen(req).read().decode()
    return int(text.split("\nwick_http_requests_queued ")[1].split()[0])
ts = [threading.Thread(target=post, args=(sys.argv[2], f"a{i}")) for i in range(6)]
[t.start() for t in ts]
for _ in range(500):  # one runs, the others wait (the first may be done already)
    if queued() + len(done) >= 5 and queued() >= 3:
        break
    time.sleep(0.002)
waiting, before = queued(), len(done)
assert waiting >= 3, (waiting, before)
tb = threading.Thread(target=post, args=(sys.argv[3], "b"))
tb.start()
[t.join() for t in ts + [tb]]
# b goes right after the one running when it came, ahead of every one of team-a's waiting
assert done.index("b") <= before + 1, (done, before, waiting)  # (FIFO: last)
print(f"fairness: team-b's request finished {done.index('b') + 1} of 7, ahead of the "
      f"{waiting} of team-a's burst still waiting when it came")
PY
kill -TERM $fd
wait $fd || fail "the fairness session exited $?"

# 8. SIGTERM while a stream runs: it finishes, a request accepted before the signal (waiting
# for the one slot) is still served, new requests get 503, exit 0.
curl -sN -H "Authorization: Bearer $K1" "http://127.0.0.1:$P/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Once"}], "max_tokens": 150, "temperature": 0, "stream": true}' \
  >"$TMPD/drain.sse" &
cl=$!
for _ in $(seq 1 100); do grep -q '^data: ' "$TMPD/drain.sse" 2>/dev/null && break; sleep 0.05; done
curl -s -o "$TMPD/queued.json" -w '%{http_code}' -H "Authorization: Bearer $K1" \
  "http://127.0.0.1:$P/v1/completions" -d '{"prompt": "Once", "max_tokens": 4}' >"$TMPD/queued.code" &
qd=$!
sleep 0.2
kill -TERM $sd
sleep 0.1
code=$(curl -s -o "$TMPD/drain503.json" -w '%{http_code}' -H "Authorization: Bearer $K1" \
  "http://127.0.0.1:$P/v1/completions" -d '{"prompt": "x", "max_tokens": 2}')
hcode=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/health")
wait $cl
wait $qd
wait $sd || fail "SIGTERM: exit $?"
[ "$(cat "$TMPD/queued.code")" = 200 ] ||
  fail "a request accepted before SIGTERM got $(cat "$TMPD/queued.code"): $(cat "$TMPD/queued.json")"
[ "$code" = 503 ] || fail "a request while draining got $code, want 503"
[ "$hcode" = 503 ] || fail "/health while draining got $hcode, want 503"
grep -v '^$' "$TMPD/drain.sse" | tail -n 1 | has '^data: \[DONE\]$' || fail "the stream did not end with [DONE]"
grep -q '"finish_reason":"\(length\|stop\)"' "$TMPD/drain.sse" || fail "the stream did not finish: $(tail -c 300 "$TMPD/drain.sse")"
grep -q 'reason signal' "$TMPD/slow.log" || fail "no drain in the log"
echo "SIGTERM: the running stream finished, the request waiting for its slot was served, a new request got 503, /health 503, exit 0"

# An idle session told to stop refuses what comes after the signal at once (it waited up to
# half a second on its inbox first, and served a request sent 0.1 s after SIGTERM with 200).
for i in 1 2 3; do
  P=$(free_port)
  "$WICK" dev --model "$m" --listen 127.0.0.1:$P 2>"$TMPD/term.log" &
  td=$!
  wait_ready $P $td
  kill -TERM $td
  sleep 0.0$((2 * i))
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/v1/completions" \
    -d '{"prompt": "x", "max_tokens": 2}' || true)
  wait $td || fail "idle SIGTERM: exit $?"
  [ "$code" != 200 ] || fail "a request 0.0$((2 * i)) s after SIGTERM to an idle session got 200"
done
echo "SIGTERM to an idle session: requests after it refused (503 or closed)"

# 9. Idle exit with the bill.
P=$(free_port)
start=$(date +%s%N)
"$WICK" dev --model "$m" --listen 127.0.0.1:$P --idle-timeout 2 --price-per-hour 36.31 \
  2>"$TMPD/idle.log" &
idle=$!
wait_ready $P $idle
curl -sf "http://127.0.0.1:$P/v1/completions" -d '{"prompt": "Once", "max_tokens": 8}' >/dev/null
t_req=$(date +%s%N)
wait $idle || fail "the idle session exited $?"
took=$(( ($(date +%s%N) - t_req) / 1000000 ))
[ $took -ge 1900 ] && [ $took -lt 5000 ] || fail "idle exit $took ms after the last request (--idle-timeout 2)"
grep -q 'exit: reason idle' "$TMPD/idle.log" || fail "not an idle exit: $(tail -3 "$TMPD/idle.log")"
bill=$(grep -o 'bill: session.*' "$TMPD/idle.log") || fail "no bill line: $(tail -3 "$TMPD/idle.log")"
echo "idle exit ${took} ms after the last request; $bill"
! grep -l 'Sanitizer' "$TMPD"/*.log || fail "a sanitizer report in the logs above"
echo ok
