# The worker's preparers (--prepare-threads): a big job (a document of 16 KB or more) taken
# while the engine has work is decoded, and its prompt rendered and encoded, beside the steps,
# not between them. stories260K on spool queues:
#   1. wick bench prepare, small: with a preparer every big job is prepared beside the steps,
#      without one none is, and both runs complete every job
#   2. the same jobs with --prepare-threads 0 and 1 give the same results: greedy texts, and
#      big jobs that fail (a bad member, a prompt past the context, a document that is not
#      JSON) fail with the same codes and messages
#   3. SIGTERM with --drain-timeout 0 while big jobs wait for the preparer: each goes back to
#      the queue, and a second worker completes every job, one result each
#   4. HTTP (wick dev): big requests while another streams are prepared beside the steps and
#      answered as they are alone (the same text; the same 400 for a prompt past the context);
#      each was also parsed by the HTTP server's parser, beside its thread (/metrics)
#   5. wick bench http, small: with --http-parse-threads 1 every big request is parsed beside
#      the server's thread, with 0 none is, and every stream and request is answered 200
#   6. the Responses API from 4 clients at once, each a chain of turns in bodies of 20 KB (JSON
#      whitespace), through 2 parsers: each turn goes on from the response before it (read
#      from the kept ones beside the server thread, which keeps, reads and deletes others);
#      a token count and /tokenize in 20 KB bodies answer as they do in small ones
source tests/e2e/lib.sh
m=$(stories)

# 1.
"$WICK" bench prepare "$m" --queue "spool:$TMPD/bq" --big 3 --kb 64 -n 200 --every 30 \
  --rounds 1 >"$TMPD/bench.out" 2>&1 || { cat "$TMPD/bench.out" >&2; fail "bench prepare"; }
grep -Eq -- '^--prepare-threads 0 .* 0$' "$TMPD/bench.out" &&
  grep -Eq -- '^--prepare-threads 1 .* 3$' "$TMPD/bench.out" ||
  { cat "$TMPD/bench.out" >&2; fail "bench prepare: not every big job prepared beside"; }

# 2. A steady job runs first; the big ones arrive once it has steps (the spool takes in an order
# of its own).
jobs_into() { # QDIR BIG_FILLER_REPEATS STEADY_TOKENS: a-steady in new/, the big ones in stage/
  python3 - "$@" <<'PY'
import json, os, sys
q, reps, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in ("new", "stage"):
    os.makedirs(os.path.join(q, d), exist_ok=True)
filler = "".join(f"The cat sat on mat {i} and ran. " for i in range(reps))
def put(d, name, doc):
    with open(os.path.join(q, d, name + ".json"), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
put("new", "a-steady", {"id": "a-steady", "input": {"prompt": "Once upon a time",
    "max_tokens": tokens, "temperature": 0, "logit_bias": {"2": -100}}})
for i in range(3):
    put("stage", f"b-big-{i}", {"id": f"b-big-{i}", "input": {"prompt": f"Once upon a time, {i}",
        "max_tokens": 8, "temperature": 0, "prediction": f"{i} {filler}"}})
put("stage", "b-big-bad", {"id": "b-big-bad", "input": {"prompt": "x", "max_tokens": "many",
                                                          "prediction": filler}})
put("stage", "b-big-long", {"id": "b-big-long", "input": {"messages": [{"role": "user",
                                                                         "content": filler}]}})
put("stage", "b-big-junk", '{"id": "b-big-junk", "input": {"prompt": "' + filler)
PY
}
big_jobs_arrive() { # QDIR STEPLOG: once the step log has a step, the staged jobs into new/
  for _ in $(seq 1 1000); do
    [ -s "$2" ] && break
    sleep 0.005
  done
  mv "$1"/stage/* "$1/new/"
}
results_of() { # QDIR: each job's status, error and text, one line each
  python3 - "$1" <<'PY'
import json, os, sys
d = os.path.join(sys.argv[1], "done")
for f in sorted(os.listdir(d)):
    r = json.load(open(os.path.join(d, f)))
    e = r.get("error") or {}
    print(r["id"], r["status"], e.get("code"), e.get("message"),
          json.dumps((r.get("output") or {}).get("text")))
PY
}
prepared() { sed -n 's/.*; \([0-9]*\) prepared beside.*/\1/p' "$1"; }
for p in 0 1; do
  jobs_into "$TMPD/q$p" 1400 400 # big: 44 KB
  "$WICK" worker --model "$m" --queue "spool:$TMPD/q$p" --concurrency 8 --idle-timeout 1 \
    --prepare-threads $p --step-log "$TMPD/steps$p" 2>"$TMPD/w$p.log" &
  pid=$!
  big_jobs_arrive "$TMPD/q$p" "$TMPD/steps$p"
  wait $pid || fail "worker --prepare-threads $p exited $?"
  results_of "$TMPD/q$p" >"$TMPD/r$p"
done
[ "$(wc -l <"$TMPD/r1")" -eq 7 ] || { cat "$TMPD/r1" >&2; fail "not 7 results"; }
diff "$TMPD/r0" "$TMPD/r1" >&2 || fail "the results differ with a preparer"
grep -q '^b-big-bad FAILED invalid_input .*max_tokens' "$TMPD/r1" &&
  grep -q '^b-big-long FAILED prompt_too_long' "$TMPD/r1" &&
  grep -q '^b-big-junk FAILED invalid_json' "$TMPD/r1" &&
  [ "$(grep -c ' COMPLETED ' "$TMPD/r1")" -eq 4 ] || { cat "$TMPD/r1" >&2; fail "results"; }
[ "$(prepared "$TMPD/w0.log")" = 0 ] || fail "prepared beside with --prepare-threads 0"
[ "$(prepared "$TMPD/w1.log")" = 6 ] ||
  { grep exit "$TMPD/w1.log" >&2; fail "not all 6 big jobs prepared beside"; }

# 3. Big jobs of 600 KB queue behind one preparer (each takes a while to encode); SIGTERM
# with no drain time once the worker has taken them all.
Q=$TMPD/q3
jobs_into "$Q" 19000 450
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --idle-timeout 5 \
  --drain-timeout 0 --step-log "$TMPD/steps3" 2>"$TMPD/w3.log" &
pid=$!
big_jobs_arrive "$Q" "$TMPD/steps3"
for _ in $(seq 1 2000); do # until the worker has taken all 7 (a bad one fails at once)
  [ "$(find "$Q/new" -type f | wc -l)" -eq 0 ] && break
  sleep 0.005
done
kill -TERM $pid
wait $pid || fail "the drained worker exited $?"
n=$(prepared "$TMPD/w3.log")
dropped=$(sed -n 's/.*prepare: \([0-9]*\) job(s) taken and not yet admitted.*/\1/p' "$TMPD/w3.log")
released=$(grep -c 'handed back to the queue' "$TMPD/w3.log" || true)
[ -n "$dropped" ] && [ "$dropped" -ge 1 ] && [ "$released" -ge "$dropped" ] ||
  { grep -E 'exit|released|prepare' "$TMPD/w3.log" >&2; fail "no job was being prepared at SIGTERM"; }
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --idle-timeout 1 \
  2>"$TMPD/w4.log" || fail "the second worker exited $?"
results_of "$Q" >"$TMPD/r3"
[ "$(grep -c ' COMPLETED ' "$TMPD/r3")" -eq 4 ] && [ "$(wc -l <"$TMPD/r3")" -eq 7 ] &&
  [ "$(find "$Q/new" "$Q/claimed" -type f | wc -l)" -eq 0 ] ||
  { cat "$TMPD/r3" >&2; fail "after the drain"; }
# 4. HTTP (wick dev): big chat requests (a 44 KB prediction; a 44 KB message, past the context)
# while a long one streams: each is prepared beside the steps, and answers as it does alone.
P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$WICK" dev --model "$m" --listen 127.0.0.1:$P --idle-timeout 2 2>"$TMPD/dev.log" &
dpid=$!
wait_dev $P $dpid "$TMPD/dev.log"
python3 - $P <<'PY' || fail "HTTP requests prepared beside the steps"
import json, sys, threading, time, urllib.request, urllib.error
url = f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions"
filler = "".join(f"The cat sat on mat {i} and ran. " for i in range(1400))
def post(body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
msgs = [{"role": "user", "content": "Once upon a time"}]
big = {"messages": msgs, "max_tokens": 8, "temperature": 0,
       "prediction": {"type": "content", "content": filler}}
long = {"messages": [{"role": "user", "content": filler}], "max_tokens": 8}
alone = [post(big), post(long)]  # the engine idle: prepared as they are taken
chunks = []
def stream():
    body = {"messages": msgs, "max_tokens": 400, "stream": True, "logit_bias": {"1": -100, "2": -100}}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        for line in r:
            chunks.append(line)
t = threading.Thread(target=stream)
t.start()
while len(chunks) < 20:  # it is decoding
    time.sleep(0.001)
beside = [post(big), post(long)]
t.join()
assert alone[0][0] == beside[0][0] == 200, (alone[0], beside[0])
text = lambda b: json.loads(b)["choices"][0]["message"]["content"]
assert text(alone[0][1]) == text(beside[0][1]), (alone[0][1], beside[0][1])
assert alone[1][0] == beside[1][0] == 400 and alone[1][1] == beside[1][1], (alone[1], beside[1])
assert b"context" in beside[1][1], beside[1][1]
assert len(chunks) > 400, len(chunks)
with urllib.request.urlopen(url.replace("/v1/chat/completions", "/metrics")) as r:
    metrics = r.read().decode()
assert "\nwick_http_requests_parsed_beside_total 4\n" in metrics, metrics
assert "\nwick_http_requests_parsing 0\n" in metrics, metrics
PY
wait $dpid || fail "wick dev exited $?"
hn=$(prepared "$TMPD/dev.log")
[ "$hn" = 2 ] || { grep exit "$TMPD/dev.log" >&2; fail "HTTP: $hn prepared beside, not 2"; }

# 5.
"$WICK" bench http "$m" --big 3 --kb 64 -n 200 --every 30 --rounds 1 >"$TMPD/bhttp.out" 2>&1 ||
  { cat "$TMPD/bhttp.out" >&2; fail "bench http"; }
grep -Eq -- '^--http-parse-threads 0 .* 0$' "$TMPD/bhttp.out" &&
  grep -Eq -- '^--http-parse-threads 1 .* 3$' "$TMPD/bhttp.out" ||
  { cat "$TMPD/bhttp.out" >&2; fail "bench http: not every big request parsed beside"; }

# 6.
"$WICK" dev --model "$m" --listen 127.0.0.1:$P --idle-timeout 4 --http-parse-threads 2 \
  2>"$TMPD/dev6.log" &
dpid=$!
wait_dev $P $dpid "$TMPD/dev6.log"
python3 - $P <<'PY' || fail "Responses API chains parsed beside"
import json, sys, threading, urllib.request, urllib.error
base = f"http://127.0.0.1:{sys.argv[1]}"
def call(method, path, body=None, pad=20000):
    data = None
    if body is not None:
        data = (json.dumps(body)[:-1] + " " * pad + "}").encode()  # past 16 KB
    req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"},
                                 method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()
errors = []
def chain(k):
    prev = None
    for turn in range(4):
        body = {"input": f"Client {k} turn {turn}: once upon a time", "max_output_tokens": 6,
                "temperature": 0}
        if prev:
            body["previous_response_id"] = prev
        st, r = call("POST", "/v1/responses", body)
        if st != 200:
            errors.append((k, turn, st, r)); return
        st, items = call("GET", f"/v1/responses/{r['id']}/input_items?order=asc&limit=100")
        want = 2 * turn + 1  # every turn's input, the answers before this one
        if st != 200 or len(items["data"]) != want:
            errors.append((k, turn, "items", st, items)); return
        if not items["data"][-1]["content"][0]["text"].startswith(f"Client {k} turn {turn}"):
            errors.append((k, turn, "last item", items)); return
        if prev and turn == 3 and call("DELETE", f"/v1/responses/{prev}")[0] != 200:
            errors.append((k, turn, "delete")); return
        prev = r["id"]
ts = [threading.Thread(target=chain, args=(k,)) for k in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not errors, errors
# a token count and /tokenize, big and small: the same answers
for path, body in [("/v1/messages/count_tokens",
                    {"model": "stories260K",
                     "messages": [{"role": "user", "content": "Once upon a time"}]}),
                   ("/tokenize", {"prompt": "Once upon a time there was a cat"})]:
    big, small = call("POST", path, body), call("POST", path, body, pad=0)
    assert big[0] == 200 and big == small, (path, big, small)
with urllib.request.urlopen(base + "/metrics") as r:
    metrics = r.read().decode()
assert "\nwick_http_requests_parsed_beside_total 18\n" in metrics, metrics
PY
wait $dpid || fail "wick dev exited $?"

echo "prepare: ok (bench: every big job prepared beside; the same 7 results with and without" \
  "a preparer; at SIGTERM $dropped job(s) were being prepared ($n prepared), $released handed" \
  "back, and all 7 ended after; HTTP: 2 big requests prepared beside a stream, answered as" \
  "alone, and parsed beside the server's thread; bench http: every big request parsed beside;" \
  "4 Responses API chains of 4 turns, each turn parsed beside)"
