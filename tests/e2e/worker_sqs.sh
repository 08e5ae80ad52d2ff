# `wick worker` on Amazon SQS, against a moto_server started here on a free loopback port:
# 1. 200 jobs, two workers: one COMPLETED result each, both idle-exit 0 within idle-timeout + 1 s;
# 2. kill -9 of one of two workers mid-batch: visibility expiry hands its jobs to the other, and
#    the .fifo results queue (MessageDeduplicationId = job id) keeps one result per job;
# 3. SIGTERM during a batch: in-flight jobs finish or go back (visibility 0) within the drain;
# 4. dead letters: a queue whose RedrivePolicy has maxReceiveCount 2 moves a job that two
#    crashed consumers held to its DLQ (never run a third time); without a policy the driver
#    answers FAILED after max_deliveries;
# 5. `wick submit --wait` finds its result among others'.
# Results are read back from the results queues with SigV4-signed JSON-protocol calls from the
# Python standard library. Skips (exit 0) when moto_server is not installed.
source tests/e2e/lib.sh
MOTO=$(command -v moto_server || true)
[ -z "$MOTO" ] && [ -x /root/.pyenv/shims/moto_server ] && MOTO=/root/.pyenv/shims/moto_server
if [ -z "$MOTO" ]; then echo "SKIP: moto_server not installed"; exit 0; fi
m=$(stories)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$MOTO" -H 127.0.0.1 -p "$port" >"$TMPD/moto.log" 2>&1 &
mpid=$!
trap 'kill -9 $mpid $(jobs -p) 2>/dev/null; rm -rf "$TMPD"' EXIT
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
unset AWS_SESSION_TOKEN
B="sqs://127.0.0.1:$port/123456789012"

cat >"$TMPD/sqs.py" <<'PY'
# A tiny SQS client (JSON protocol, SigV4) for checking what the workers left behind.
import datetime, hashlib, hmac, json, sys, time, urllib.request
port = sys.argv[1]
HOST = f"127.0.0.1:{port}"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def call(action, body):
    data = json.dumps(body).encode()
    t = datetime.datetime.now(datetime.timezone.utc)
    amz, day = t.strftime("%Y%m%dT%H%M%SZ"), t.strftime("%Y%m%d")
    h = {"content-type": "application/x-amz-json-1.0", "host": HOST, "x-amz-date": amz,
         "x-amz-target": "AmazonSQS." + action}
    names = ";".join(sorted(h))
    canon = "\n".join(["POST", "/", "", "".join(f"{k}:{h[k]}\n" for k in sorted(h)), names,
                       hashlib.sha256(data).hexdigest()])
    scope = f"{day}/us-east-1/sqs/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(canon.encode()).hexdigest()])
    k = b"AWS4test"
    for part in (day, "us-east-1", "sqs", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = f"AWS4-HMAC-SHA256 Credential=test/{scope}, SignedHeaders={names}, Signature={sig}"
    req = urllib.request.Request(f"http://{HOST}/", data=data, headers=h, method="POST")
    with opener.open(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")

urls = {}
def url(name):
    if name not in urls:
        urls[name] = call("CreateQueue", {"QueueName": name, **({"Attributes": {"FifoQueue": "true"}} if name.endswith(".fifo") else {})})["QueueUrl"]
    return urls[name]

def receive(name, vis, n=10):
    return call("ReceiveMessage", {"QueueUrl": url(name), "MaxNumberOfMessages": n, "VisibilityTimeout": vis,
                "MessageAttributeNames": ["All"], "MessageSystemAttributeNames": ["ApproximateReceiveCount"]}).get("Messages", [])

def drain(name):
    """Every message of a queue (received, then deleted), until three empty receives."""
    out, empty = [], 0
    while empty < 3:
        ms = receive(name, 300)
        empty = 0 if ms else empty + 1
        out += ms
        if ms:
            call("DeleteMessageBatch", {"QueueUrl": url(name), "Entries": [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(ms)]})
    return out

def count(name):
    a = call("GetQueueAttributes", {"QueueUrl": url(name), "AttributeNames": ["All"]})["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])

cmd = sys.argv[2]
if cmd == "wait":  # until moto answers
    for _ in range(600):
        try:
            call("ListQueues", {}); sys.exit(0)
        except Exception:
            time.sleep(0.05)
    sys.exit("moto_server did not answer")
elif cmd == "redrive":  # QUEUE DLQ MAX: create QUEUE with a RedrivePolicy
    q, dlq, mx = sys.argv[3], sys.argv[4], sys.argv[5]
    url(dlq)
    arn = call("GetQueueAttributes", {"QueueUrl": url(dlq), "AttributeNames": ["QueueArn"]})["Attributes"]["QueueArn"]
    call("SetQueueAttributes", {"QueueUrl": url(q), "Attributes": {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": mx})}})
elif cmd == "crash":  # QUEUE: receive one message and never delete it (a consumer that died), 1 s lease
    ms = receive(sys.argv[3], 1, 1)
    assert len(ms) == 1, f"crash: {len(ms)} messages received"
    print(ms[0]["Attributes"]["ApproximateReceiveCount"])
elif cmd == "count":
    print(count(sys.argv[3]))
elif cmd == "left":  # QUEUE: what is left in it, for a failure's message (visible ones received)
    a = call("GetQueueAttributes", {"QueueUrl": url(sys.argv[3]), "AttributeNames": ["All"]})["Attributes"]
    ms = receive(sys.argv[3], 0)
    ids = [json.loads(m["Body"]).get("id") for m in ms]
    print(f"{a['ApproximateNumberOfMessages']} visible, {a['ApproximateNumberOfMessagesNotVisible']} in flight;"
          f" visible: {ids}, receive counts {[m['Attributes']['ApproximateReceiveCount'] for m in ms]}")
elif cmd == "send":  # QUEUE ID BODY: a message with an id attribute
    call("SendMessage", {"QueueUrl": url(sys.argv[3]), "MessageBody": sys.argv[5],
                         "MessageAttributes": {"id": {"DataType": "String", "StringValue": sys.argv[4]}}})
elif cmd == "batch":  # QUEUE PREFIX FROM TO: jobs PREFIX-FROM..TO sent in batches; odd ones carry
    # their id in the body only (no id attribute), as a producer other than wick submit might
    q, prefix, lo, hi = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    ents = []
    for i in range(lo, hi + 1):
        body = {"id": f"{prefix}-{i}", "input": {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.8, "seed": i}}
        e = {"Id": str(len(ents)), "MessageBody": json.dumps(body)}
        if i % 2 == 0:
            e["MessageAttributes"] = {"id": {"DataType": "String", "StringValue": body["id"]}}
        ents.append(e)
        if len(ents) == 10 or i == hi:
            r = call("SendMessageBatch", {"QueueUrl": url(q), "Entries": ents})
            assert not r.get("Failed"), r
            ents = []
elif cmd == "ids":  # QUEUE: the id attributes of every message, drained
    print(" ".join(m["MessageAttributes"]["id"]["StringValue"] for m in drain(sys.argv[3])))
elif cmd == "check":  # RESULTS PREFIX N [STATUS]: exactly one result per job, with STATUS
    res, prefix, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
    want = sys.argv[6] if len(sys.argv) > 6 else "COMPLETED"
    seen = {}
    for msg in drain(res):
        r = json.loads(msg["Body"])
        assert msg["MessageAttributes"]["id"]["StringValue"] == r["id"], msg
        assert msg["MessageAttributes"]["status"]["StringValue"] == r["status"], msg
        seen.setdefault(r["id"], []).append(r)
    mine = {k: v for k, v in seen.items() if k.startswith(prefix + "-")}
    missing = [i for i in range(1, n + 1) if f"{prefix}-{i}" not in mine]
    assert not missing, f"{len(missing)} jobs have no result, e.g. {missing[:5]}"
    twice = [k for k, v in mine.items() if len(v) > 1]
    assert not twice, f"{len(twice)} jobs have more than one result, e.g. {twice[:5]}"
    bad = [(k, v[0]["status"]) for k, v in mine.items() if v[0]["status"] != want]
    assert not bad, f"not {want}: {bad[:5]}"
    if want == "COMPLETED":
        for k, v in mine.items():
            assert v[0]["usage"]["completion_tokens"] > 0 and "error" not in v[0], v[0]
    print(f"{n} jobs, one {want} result each; attempts {sorted({v[0]['attempt'] for v in mine.values()})}")
PY
sqs() { python3 "$TMPD/sqs.py" "$port" "$@"; }
sqs wait || fail "moto_server did not start: $(tail -3 "$TMPD/moto.log")"

submit_many() { # QUEUE-URL N MAX_TOKENS PREFIX
  seq 1 "$2" | xargs -P 4 -I{} "$WICK" submit --queue "$1" --id "$4-{}" -p "Once upon a time" \
    -n "$3" --temperature 0.8 --seed {} >/dev/null || fail "submit $4"
}

idle_exit_ok() { # LOG IDLE: exited for idleness within IDLE + 1 s of going quiet (its last
  # BUSY -> IDLE: the last result stored; storing is not idle time)
  python3 - "$1" "$2" <<'PY'
import datetime, sys
lines = open(sys.argv[1]).read().splitlines()
ts = lambda l: datetime.datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
done = [ts(l) for l in lines if " job_done: " in l]
quiet = [ts(l) for l in lines if " state: BUSY -> IDLE" in l]
ex = [l for l in lines if " exit: reason idle" in l]
assert done and quiet, "the worker finished no job"
assert ex, "the worker did not exit for idleness: " + lines[-1]
gap, since_job = ts(ex[0]) - quiet[-1], ts(ex[0]) - done[-1]
assert gap <= float(sys.argv[2]) + 1, f"idle exit {gap:.2f} s after going quiet (idle-timeout {sys.argv[2]})"
print(f"idle exit {gap:.2f} s after going quiet ({since_job:.2f} s after its last job)")
PY
}

# 1. 200 jobs, two workers, one COMPLETED result each; both idle-exit 0 in time. 60 come from
# wick submit, the rest in batches straight to SQS (half of those without the id attribute).
# A standard queue may hand one message to two receivers (SQS says so; moto does it under
# concurrent ReceiveMessage calls), so exactly one result per job takes the .fifo results
# queue, whose MessageDeduplicationId (= job id) drops the second.
Q="$B/a?tls=0&results=a-results.fifo"
submit_many "$Q" 60 12 a
sqs batch a a 61 200
[ "$(sqs count a)" = 200 ] || fail "200 jobs were not queued"
for w in 1 2; do
  "$WICK" worker --model "$m" --queue "$Q" --concurrency 8 --idle-timeout 2 --worker-id w$w \
    2>"$TMPD/w$w.log" &
  eval pid$w=$!
done
wait $pid1 || fail "worker 1 exited $?: $(tail -3 "$TMPD/w1.log")"
wait $pid2 || fail "worker 2 exited $?: $(tail -3 "$TMPD/w2.log")"
sqs check a-results.fifo a 200 || fail "results of the 200 jobs"
for w in 1 2; do idle_exit_ok "$TMPD/w$w.log" 2 || fail "worker $w: $(tail -2 "$TMPD/w$w.log")"; done
runs=$(cat "$TMPD/w1.log" "$TMPD/w2.log" | grep -c ' job_done: ' || true)
echo "200 jobs ran $runs times in all (a standard queue is at-least-once)"
# (a failure says what is left and the workers' last warnings: a flake once seen under load)
[ "$(sqs count a)" = 0 ] || fail "jobs left in the queue: $(sqs left a); $(grep -h -i \
  'warn\|error\|fail' "$TMPD/w1.log" "$TMPD/w2.log" | tail -n 5)"

# 2. kill -9 of one of two workers mid-batch; a 2 s lease brings its jobs back to the other.
Q="$B/k?tls=0&results=k-results.fifo"
submit_many "$Q" 40 400 k
"$WICK" worker --model "$m" --queue "$Q" --lease 2 --idle-timeout 3 --worker-id ka 2>"$TMPD/ka.log" &
a=$!
"$WICK" worker --model "$m" --queue "$Q" --lease 2 --idle-timeout 3 --worker-id kb 2>"$TMPD/kb.log" &
b=$!
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/ka.log" && break; sleep 0.05; done
sleep 0.2 # mid-batch: eight jobs of 400 tokens take about a second here
kill -9 $a
wait $a 2>/dev/null || true
taken=$(grep -c 'job_done' "$TMPD/ka.log" || true)
wait $b || fail "worker kb exited $?: $(tail -3 "$TMPD/kb.log")"
out=$(sqs check k-results.fifo k 40) || fail "after kill -9"
echo "$out"
echo "$out" | has 'attempts \[1, 2' || fail "no job was redelivered after the kill (ka finished $taken)"
[ "$(sqs count k)" = 0 ] || fail "jobs left in the queue after kill -9"

# 3. SIGTERM during a batch (drain timeout 0: whatever is in flight goes back at once);
#    another worker ends them. One job at a time, on a slow random model: each job decodes
#    1000 tokens greedily (this model and prompt never meet EOS) for about 1.5 s, so the signal
#    finds one running (stories260K ran 400 tokens in 40 ms, and the signal could land in the
#    gap between two receives).
slow=$TMPD/slow
"$WICK_TOOLS/gen_llama" -o "$slow" --hidden 384 --intermediate 1024 --layers 6 --heads 6 \
  --kv-heads 2 --vocab 512 --max-pos 1024 --dtype f32 --seed 9 >/dev/null
cp "$m/tokenizer.json" "$slow/"
Q="$B/t?tls=0"
seq 1 6 | xargs -P 4 -I{} "$WICK" submit --queue "$Q" --id "t-{}" -p "Once upon a time" \
  -n 1000 --temperature 0 >/dev/null || fail "submit t"
"$WICK" worker --model "$slow" --queue "$Q" --concurrency 1 --drain-timeout 0 --idle-timeout 5 \
  --worker-id d 2>"$TMPD/d.log" &
d=$!
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/d.log" && break; sleep 0.05; done
sleep 0.1
t0=$(date +%s.%N)
kill -TERM $d
wait $d || fail "SIGTERM: exit $?"
python3 -c "import sys; t = float(sys.argv[2]) - float(sys.argv[1]); assert t < 2.5, f'drain took {t:.2f} s'" \
  "$t0" "$(date +%s.%N)" || fail "slow drain"
grep -q 'reason signal' "$TMPD/d.log" || fail "no drain in the log"
grep -q 'handed back to the queue' "$TMPD/d.log" || fail "no job was in flight past the drain: $(tail -3 "$TMPD/d.log")"
"$WICK" worker --model "$slow" --queue "$Q" --idle-timeout 1 --worker-id e 2>"$TMPD/e.log" || fail "worker e"
out=$(sqs check t-results t 6) || fail "after SIGTERM"
echo "$out"
echo "$out" | has 'attempts \[1, 2' || fail "the jobs handed back were not delivered again"
[ "$(sqs count t)" = 0 ] || fail "jobs left in the queue after SIGTERM"

# 4a. RedrivePolicy maxReceiveCount 2: after two consumers died holding the job, SQS moves it
# to the DLQ; the worker never runs it.
sqs redrive rd rd-dlq 2
Q="$B/rd?tls=0"
"$WICK" submit --queue "$Q" --id rd-1 -p "Once upon a time" -n 8 >/dev/null || fail "submit rd-1"
[ "$(sqs crash rd)" = 1 ] && sleep 1.2 && [ "$(sqs crash rd)" = 2 ] && sleep 1.2 || fail "crash rd"
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 1 --worker-id r 2>"$TMPD/r.log" || fail "worker r"
! grep -q 'job_done' "$TMPD/r.log" || fail "the job ran a third time: $(grep job_done "$TMPD/r.log")"
[ "$(sqs ids rd-dlq)" = rd-1 ] || fail "rd-1 is not in the dead-letter queue"
[ "$(sqs count rd)" = 0 ] && [ "$(sqs count rd-results)" = 0 ] || fail "rd-1 left a message or a result"

# 4b. No RedrivePolicy: the driver's max_deliveries=2 answers FAILED on the third delivery.
Q="$B/md?tls=0&max_deliveries=2"
"$WICK" submit --queue "$Q" --id md-1 -p "Once upon a time" -n 8 >/dev/null || fail "submit md-1"
[ "$(sqs crash md)" = 1 ] && sleep 1.2 && [ "$(sqs crash md)" = 2 ] && sleep 1.2 || fail "crash md"
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 1 --worker-id s 2>"$TMPD/s.log" || fail "worker s"
! grep -q 'job_done' "$TMPD/s.log" || fail "md-1 ran past max_deliveries"
sqs check md-results md 1 FAILED || fail "md-1 was not answered FAILED"
[ "$(sqs count md)" = 0 ] || fail "md-1 is still queued"

# 5. wick submit --wait, with other results in the results queue.
Q="$B/w?tls=0"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sqs send w-results other-$i '{"id": "other"}'; done
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 2 --worker-id x 2>"$TMPD/x.log" &
x=$!
res=$("$WICK" submit --queue "$Q" --id w-1 -p "Once upon a time" -n 8 --wait --timeout 20) ||
  fail "submit --wait: $res"
echo "$res" | has '"status": "COMPLETED"' || fail "submit --wait printed $res"
wait $x || fail "worker x"
[ "$(sqs ids w-results | wc -w)" = 12 ] || fail "the others' results were lost"
echo ok
