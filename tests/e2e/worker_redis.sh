# `wick worker` on Redis Streams with a real redis-server started here on a free loopback port
# (with an append-only file, so a restart keeps the stream): two workers and 120 jobs with one
# of them killed -9 mid-batch, then redis-server restarted mid-run, then a SIGTERM drain.
# Every job must end with exactly one COMPLETED result key; none is lost or run twice.
source tests/e2e/lib.sh
command -v redis-server >/dev/null || fail "redis-server is not installed (scripts/install-deps)"
m=$(stories)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
    --dir "$TMPD" >/dev/null &
  rpid=$!
  for _ in $(seq 200); do redis-cli -p "$port" ping 2>/dev/null | has PONG && return; sleep 0.05; done
  fail "redis-server did not start"
}
start_redis
trap 'kill -9 $rpid 2>/dev/null || true; rm -rf "$TMPD"' EXIT
Q="redis://127.0.0.1:$port/jobs?group=wick"

submit_many() { # N MAX_TOKENS PREFIX
  for i in $(seq 1 "$1"); do
    "$WICK" submit --queue "$Q" --id "$3-$i" -p "Once upon a time" -n "$2" --temperature 0.8 \
      --seed "$i" >/dev/null || fail "submit $3-$i"
  done
}

check() { # PREFIX N
  python3 - "$port" "$1" "$2" <<'PY'
import json, subprocess, sys
port, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def get(k):
    return subprocess.run(["redis-cli", "-p", port, "--raw", "get", k], capture_output=True, text=True).stdout.strip()
missing, bad = [], []
for i in range(1, n + 1):
    v = get(f"jobs:result:{prefix}-{i}")
    if not v:
        missing.append(i); continue
    r = json.loads(v)
    if r["status"] != "COMPLETED" or r["usage"]["completion_tokens"] <= 0:
        bad.append((i, r["status"]))
assert not missing, f"{len(missing)} jobs have no result, e.g. {missing[:5]}"
assert not bad, f"not COMPLETED: {bad[:5]}"
# each job announced once on jobs:results
ids = subprocess.run(["redis-cli", "-p", port, "--raw", "xrange", "jobs:results", "-", "+"], capture_output=True, text=True).stdout.split()
ann = [x for x in ids if x.startswith(prefix + "-")]
dups = {x for x in ann if ann.count(x) > 1}
assert not dups, f"results announced twice: {sorted(dups)[:5]}"
print(f"{n} jobs, one COMPLETED result each")
PY
}

# 0. 200 jobs, two workers: one COMPLETED result each, and each worker exits 0 by itself within
#    idle-timeout + 1 s of going quiet.
submit_many 200 12 a
for w in 1 2; do
  "$WICK" worker --model "$m" --queue "$Q" --concurrency 8 --idle-timeout 1 --worker-id w$w \
    2>"$TMPD/w$w.log" &
  eval wp$w=$!
done
wait $wp1 || fail "worker w1 exited $?"
wait $wp2 || fail "worker w2 exited $?"
check a 200 || fail "200 jobs, two workers"
for w in 1 2; do
  grep -q job_done "$TMPD/w$w.log" || fail "worker w$w took no job"
  idle_exit_within "$TMPD/w$w.log" 1
done

# 1. Two workers; one is killed -9 mid-batch; its pending entries are reclaimed (short lease).
submit_many 60 300 k
"$WICK" worker --model "$m" --queue "$Q" --lease 2 --idle-timeout 3 --worker-id a 2>"$TMPD/a.log" &
a=$!
"$WICK" worker --model "$m" --queue "$Q" --lease 2 --idle-timeout 3 --worker-id b 2>"$TMPD/b.log" &
b=$!
# mid-batch however fast the machine: killed once a is busy
for _ in $(seq 200); do grep -q -- '-> BUSY' "$TMPD/a.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.1
held=$(redis-cli -p "$port" xpending jobs wick | sed -n 1p)
[ "$held" -gt 0 ] || fail "no job was in flight when worker a was killed"
kill -9 $a
wait $a 2>/dev/null || true
wait $b || fail "worker b exited $?: $(tail -3 "$TMPD/b.log")"
check k 60 || fail "after kill -9"

# 2. redis-server restarted mid-run: the worker reconnects and finishes every job.
submit_many 120 200 r
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 3 --worker-id c 2>"$TMPD/c.log" &
c=$!
# restart once the worker has stored its first results, however fast the machine is
for _ in $(seq 400); do
  done_before=$(redis-cli -p "$port" --raw keys 'jobs:result:r-*' | grep -c . || true)
  [ "$done_before" -gt 0 ] && break
  sleep 0.025
done
[ "$done_before" -lt 120 ] || fail "every job finished before the restart"
kill -9 $rpid
wait $rpid 2>/dev/null || true
sleep 0.5
start_redis
wait $c || fail "worker c exited $?: $(tail -5 "$TMPD/c.log")"
check r 120 || fail "after a redis restart"

# 3. SIGTERM during a batch: in-flight jobs finish or are handed back; another worker finishes.
submit_many 16 400 t
"$WICK" worker --model "$m" --queue "$Q" --concurrency 4 --drain-timeout 0.2 --idle-timeout 5 \
  --worker-id d 2>"$TMPD/d.log" &
d=$!
sleep 0.5
kill -TERM $d
wait $d || fail "SIGTERM: exit $?"
grep -q 'reason signal' "$TMPD/d.log" || fail "no drain in the log"
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 1 --worker-id e 2>/dev/null || fail "worker e"
check t 16 || fail "after SIGTERM"
[ "$(redis-cli -p "$port" xpending jobs wick | sed -n 1p)" = 0 ] || fail "entries left pending"

# 4. One job id queued twice (by a producer other than wick submit), both entries taken in
#    one batch: both run, the queue keeps the first result stored, and the bill is that
#    attempt's (its prompt), the other one overhead, with a log line saying so. Before
#    ledger_superseded, wick usage billed the dropped one (the last terminal line).
for p in "Once upon a time" "Once upon a time there was a big dog"; do
  redis-cli -p "$port" xadd jobs '*' id dup job \
    "{\"id\":\"dup\",\"input\":{\"prompt\":\"$p\",\"max_tokens\":8,\"temperature\":0}}" \
    >/dev/null || fail "xadd dup"
done
"$WICK" worker --model "$m" --queue "$Q" --concurrency 4 --idle-timeout 1 --worker-id f \
  --ledger "$TMPD/f.jsonl" 2>"$TMPD/f.log" || fail "worker f"
grep -q 'result_superseded: job dup attempt' "$TMPD/f.log" || fail "no result_superseded line"
"$WICK" usage "$TMPD/f.jsonl" --by request --format json >"$TMPD/f.json" || fail "wick usage f"
python3 - "$port" "$TMPD/f.json" <<'PY'
import json, subprocess, sys
port, path = sys.argv[1], sys.argv[2]
stored = json.loads(subprocess.run(["redis-cli", "-p", port, "--raw", "get", "jobs:result:dup"],
                                   capture_output=True, text=True).stdout)
rows = [r for r in json.load(open(path))["rows"] if r["id"] == "dup"]
assert len(rows) == 2, rows
billed = [r for r in rows if r["billed"] == "yes"]
assert len(billed) == 1, rows
assert billed[0]["prompt_tokens"] == stored["usage"]["prompt_tokens"], (billed, stored["usage"])
print(f"job dup: billed the attempt whose result stands ({billed[0]['prompt_tokens']} prompt "
      f"tokens), the other overhead")
PY

# 5. Entries refused on sight: a job over 4 MiB (a FAILED result) and one whose id is not a
#    job id (no result: it has no key) are each logged with the reason, dead-lettered with
#    what they held, and counted among the jobs taken and failed.
python3 -c 'print("x" * (4 * 1024 * 1024 + 1), end="")' | redis-cli -p "$port" -x xadd jobs '*' id huge job >/dev/null
redis-cli -p "$port" xadd jobs '*' id 'bad id!' job '{"input": {"prompt": "hi"}}' >/dev/null
submit_many 1 8 g
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 1 --worker-id g 2>"$TMPD/g.log" || fail "worker g"
grep -q "job_refused: job huge: stream entry .*: the job has 4194305 bytes; the limit is 4194304" "$TMPD/g.log" ||
  fail "no refusal of the large job: $(cat "$TMPD/g.log")"
grep -q "job_refused: stream entry .*: invalid job id 'bad id!'" "$TMPD/g.log" ||
  fail "no refusal of the invalid id: $(cat "$TMPD/g.log")"
grep -q "exit: reason idle; 3 jobs taken, 1 completed, 2 failed" "$TMPD/g.log" ||
  fail "refusals not counted: $(grep exit: "$TMPD/g.log")"
check g 1 || fail "the good job beside the refused ones"
python3 - "$port" <<'PY'
import json, subprocess, sys
port = sys.argv[1]
r = json.loads(subprocess.run(["redis-cli", "-p", port, "--raw", "get", "jobs:result:huge"], capture_output=True, text=True).stdout)
assert r["status"] == "FAILED" and r["error"]["code"] == "invalid_input", r
out = subprocess.run(["redis-cli", "-p", port, "--raw", "xrange", "jobs:dead", "-", "+"], capture_output=True, text=True).stdout
assert "bad id!" in out and "invalid job id 'bad id!'" in out and '{"input": {"prompt": "hi"}}' in out, out[-500:]
print("refused entries logged, counted and dead-lettered")
PY

# 6. Redis gone mid-run. The worker's calls on the queue give up within seconds, so a SIGTERM
#    is obeyed at once, and a worker whose every call has failed for --queue-outage seconds
#    exits 4 (before: each call retried for 60 s on the main thread, steps stalled, SIGTERM
#    waited a minute, and the worker never gave up).
ready() { for _ in $(seq 200); do grep -q "ready:" "$1" 2>/dev/null && return; sleep 0.05; done; fail "not ready: $1"; }
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 60 --worker-id h 2>"$TMPD/h.log" &
h=$!
ready "$TMPD/h.log"
kill -9 $rpid
wait $rpid 2>/dev/null || true
sleep 3
t0=$(date +%s.%N)
kill -TERM $h
rc=0; wait $h || rc=$?
python3 -c "import sys; d = float(sys.argv[2]) - float(sys.argv[1]); assert d < 2.5, f'SIGTERM took {d:.1f} s'" \
  "$t0" "$(date +%s.%N)" || fail "SIGTERM in an outage: $(tail -3 "$TMPD/h.log")"
[ $rc = 0 ] || fail "SIGTERM in an outage: exit $rc"
start_redis
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 60 --queue-outage 3 --worker-id i \
  2>"$TMPD/i.log" &
i=$!
ready "$TMPD/i.log"
kill -9 $rpid
wait $rpid 2>/dev/null || true
t0=$(date +%s)
rc=0; wait $i || rc=$?
[ $rc = 4 ] || fail "an outage past --queue-outage: exit $rc: $(tail -3 "$TMPD/i.log")"
[ $(( $(date +%s) - t0 )) -le 12 ] || fail "an outage of 3 s took $(( $(date +%s) - t0 )) s to give up"
grep -q "unhealthy: every call on the queue has failed for" "$TMPD/i.log" &&
  grep -q "exit: reason queue_lost" "$TMPD/i.log" || fail "no queue_lost: $(tail -3 "$TMPD/i.log")"
echo "redis gone: SIGTERM obeyed at once; --queue-outage 3 gave up with exit 4"

# 7. Streaming: a job with "stream": true has its text added to jobs:stream:ID after each step;
#    `wick submit --stream`, waiting from before the worker starts, prints it piece by piece
#    and then the result: the pieces add up to the result's text exactly.
start_redis
"$WICK" submit --queue "$Q" --id st-1 -p "Once upon a time" -n 120 --temperature 0 --stream \
  >"$TMPD/st.out" 2>"$TMPD/st.err" &
sp=$!
sleep 0.3
"$WICK" worker --model "$m" --queue "$Q" --idle-timeout 1 --worker-id st 2>"$TMPD/st.log" ||
  fail "worker st: $(tail -3 "$TMPD/st.log")"
wait $sp || fail "submit --stream: $(cat "$TMPD/st.err")"
python3 - "$TMPD/st.out" <<'PY' || fail "submit --stream"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
res, pieces = lines[-1], lines[:-1]
assert res["status"] == "COMPLETED", res
assert len(pieces) >= 3 and all(p["attempt"] == 1 for p in pieces), pieces[:3]
assert "".join(p["output"]["text"] for p in pieces) == res["output"]["text"], (pieces, res)
print(f"submit --stream: {len(pieces)} pieces, then the result; they add up to its text")
PY
kill -9 $rpid
wait $rpid 2>/dev/null || true

# 8. TLS (rediss://): a server that speaks TLS on one port (plain text stays on another, for
#    the checks here), wants a client certificate and a password. Jobs submitted and a worker
#    run over TLS: one COMPLETED result each, and `wick submit --wait` gets its result back.
#    Without the client certificate, the worker fails at start, saying what to set.
command -v openssl >/dev/null || fail "openssl is not installed (scripts/install-deps)"
tests/tools/tls_certs.sh "$TMPD/pki" || fail "tls_certs.sh"
free() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free) tport=$(free)
redis-server --port "$port" --bind 127.0.0.1 --save '' --dir "$TMPD" --requirepass tls-pw \
  --tls-port "$tport" --tls-cert-file "$TMPD/pki/server.pem" --tls-key-file "$TMPD/pki/server.key" \
  --tls-ca-cert-file "$TMPD/pki/ca.pem" --tls-auth-clients yes >/dev/null &
rpid=$!
for _ in $(seq 200); do redis-cli -p "$port" ping 2>&1 | has NOAUTH && break; sleep 0.05; done
export REDISCLI_AUTH=tls-pw
printf 'tls-pw\n' >"$TMPD/pw"
export WICK_REDIS_PASSWORD_FILE=$TMPD/pw WICK_REDIS_CA_FILE=$TMPD/pki/ca.pem
export WICK_REDIS_CERT_FILE=$TMPD/pki/client.pem WICK_REDIS_KEY_FILE=$TMPD/pki/client.key
Q="rediss://localhost:$tport/jobs?group=wick"
submit_many 20 12 s
"$WICK" worker --model "$m" --queue "$Q" --concurrency 4 --idle-timeout 2 --worker-id s \
  2>"$TMPD/s.log" &
s=$!
out=$("$WICK" submit --queue "$Q" --id s-wait -p "Once upon a time" -n 8 --wait --timeout 60) ||
  fail "submit --wait over TLS: $out"
echo "$out" | has '"status": "COMPLETED"' || fail "submit --wait over TLS: $out"
wait $s || fail "worker s over TLS exited $?: $(tail -3 "$TMPD/s.log")"
grep -q "queue rediss://localhost:$tport/jobs" "$TMPD/s.log" ||
  fail "the log does not name the queue"
rc=0
WICK_REDIS_CERT_FILE='' WICK_REDIS_KEY_FILE='' "$WICK" worker --model "$m" --queue "$Q" \
  --idle-timeout 1 2>"$TMPD/s2.log" || rc=$?
[ $rc = 1 ] || fail "a worker without its client certificate exited $rc"
grep -q "certificate required.*WICK_REDIS_CERT_FILE and WICK_REDIS_KEY_FILE" "$TMPD/s2.log" ||
  fail "no reason for the refused client: $(tail -2 "$TMPD/s2.log")"
check s 20 || fail "jobs over TLS"
kill -9 $rpid
echo "TLS: 21 jobs submitted, run and answered over rediss:// with a client certificate"
echo ok
