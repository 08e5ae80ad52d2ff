# `wick bench decode` on a small random Llama (gen_llama, ~5 MB): the table prints, and the
# final JSON line carries positive, self-consistent numbers. The real measurement, on a
# 0.5-1 GB model, is scripts/bench-decode.
source tests/e2e/lib.sh
m=$TMPD/llama
"$WICK_TOOLS/gen_llama" -o "$m" --hidden 256 --intermediate 688 --layers 2 --heads 4 \
  --kv-heads 2 --vocab 1000 --max-pos 128 --seed 3
[ -f "$m/model.safetensors" ] && [ -f "$m/config.json" ] || fail "gen_llama wrote no model"

out=$("$WICK" bench decode "$m" -n 8 --warmup 2 --threads 2 --bw-bytes 64 --bw-seconds 0.2)
echo "$out"
echo "$out" | has '^tokens/s' || fail "no human table"
json=$(echo "$out" | tail -n 1)
python3 - "$json" <<'PY' || fail "bad JSON line: $json"
import json, sys
j = json.loads(sys.argv[1])
assert j["bench"] == "decode" and j["tokens"] == 8 and j["threads"] == 2, j
for k in ("tokens_per_s", "bytes_per_token", "weight_gbps", "read_gbps", "ratio"):
    assert j[k] > 0, k
assert abs(j["weight_gbps"] - j["bytes_per_token"] * j["tokens_per_s"] / 1e9) <= 1e-3 * j["weight_gbps"]
assert abs(j["ratio"] - j["weight_gbps"] / j["read_gbps"]) <= 1e-3 * j["ratio"]
PY

# `wick bench queue` (batching): eight equal requests at concurrency 8 against one alone, in
# turn for 3 rounds; each round's ratio is printed and the JSON ratio is their median.
out=$("$WICK" bench queue "$m" -n 6 --jobs 8 --threads 2)
echo "$out"
python3 - "$out" <<'PY' || fail "bad bench queue output"
import json, re, statistics, sys
out = sys.argv[1]
j = json.loads(out.strip().splitlines()[-1])
assert j["bench"] == "queue" and j["mode"] == "batching" and j["jobs"] == 8, j
assert j["rounds"] == 3 and j["tokens"] == 6, j
# one sequence takes a step per token; eight together take the same number of steps
assert j["steps_one"] == 6 and j["steps_all"] == 6, j
assert j["one_s"] > 0 and j["all_s"] > 0, j
rounds = [float(x) for x in re.search(r"rounds ([\d.]+) ([\d.]+) ([\d.]+)", out).groups()]
assert abs(statistics.median(rounds) - j["ratio"]) < 0.006, (rounds, j["ratio"])
PY

# Usage errors exit 2; an unknown sub-benchmark is refused by name.
set +e
"$WICK" bench 2>/dev/null; [ $? -eq 2 ] || fail "bare 'wick bench' should exit 2"
"$WICK" bench nosuch 2>"$TMPD/err"; [ $? -eq 2 ] || fail "unknown benchmark should exit 2"
grep -q nosuch "$TMPD/err" || fail "unknown benchmark not named"
"$WICK" bench decode "$m" -n 0 2>/dev/null; [ $? -eq 2 ] || fail "-n 0 should exit 2"
"$WICK" bench decode "$m" -n 1000 2>/dev/null; [ $? -eq 1 ] || fail "past max-pos should fail"
set -e
"$WICK" bench decode --help | has 'usage: wick bench decode' || fail "no --help"

# `wick bench queue --queue URL` refuses a queue that holds someone's job (its worker runs
# every job on the null engine: a user's job came back COMPLETED with garbage text), and
# leaves the job alone.
"$WICK" submit --queue "spool:$TMPD/bq" --id real-1 -p "a real job" -n 5 >/dev/null
rc=0
"$WICK" bench queue "$m" --queue "spool:$TMPD/bq" --jobs 5 2>"$TMPD/bq.err" >/dev/null || rc=$?
[ $rc = 1 ] && grep -q "holds 1 job(s) queued or running" "$TMPD/bq.err" ||
  fail "bench queue on a queue with a job: exit $rc: $(cat "$TMPD/bq.err")"
[ -f "$TMPD/bq/new/real-1.json" ] && [ -z "$(ls "$TMPD/bq/done")" ] || fail "the job was touched"

# --step-ms: the null engine's steps take that long, so the worker cannot beat the steps'
# bound it prints (free steps would put it hundreds of times over it); it needs --queue.
out=$("$WICK" bench queue "$(stories)" --queue "spool:$TMPD/bq3" --jobs 8 -n 5 --concurrency 8 \
  --step-ms 20) || fail "bench queue --step-ms: $out"
echo "$out" | python3 -c '
import re, sys
m = re.search(r"^steps. bound +(\d+) jobs/s at 20 ms a step \(8 at once\): the worker ran at "
              r"([0-9.]+)x of it$", sys.stdin.read(), re.M)
assert m and m.group(1) == "80" and 0.1 < float(m.group(2)) <= 1.05, m and m.groups()
print("--step-ms: the worker at", m.group(2), "of the steps bound")' || fail "no bound line: $out"
rc=0
"$WICK" bench queue "$m" --step-ms 20 2>"$TMPD/sm.err" >/dev/null || rc=$?
[ $rc = 2 ] && grep -q -- "--step-ms goes with --queue URL" "$TMPD/sm.err" ||
  fail "--step-ms without --queue: exit $rc: $(cat "$TMPD/sm.err")"

# --stream: a second run of jobs that stream, on a real redis-server (each wrote its stream
# key), beside the first (stories260K: the jobs' prompts need a tokenizer); a spool queue, which has no stream, is refused before any run.
rc=0
"$WICK" bench queue "$m" --queue "spool:$TMPD/bq2" --jobs 5 --stream 2>"$TMPD/bq2.err" || rc=$?
[ $rc = 1 ] && grep -q "a spool queue has no stream channel" "$TMPD/bq2.err" &&
  [ -z "$(find "$TMPD/bq2" -type f)" ] ||
  fail "bench queue --stream on a spool: exit $rc: $(cat "$TMPD/bq2.err")"
command -v redis-server >/dev/null || fail "redis-server is not installed (scripts/install-deps)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --dir "$TMPD" >/dev/null &
rpid=$!
trap 'kill -9 $rpid 2>/dev/null || true; rm -rf "$TMPD"' EXIT
for _ in $(seq 200); do redis-cli -p "$port" ping 2>/dev/null | has PONG && break; sleep 0.05; done
out=$("$WICK" bench queue "$(stories)" --queue "redis://127.0.0.1:$port/bench" --jobs 50 -n 4 \
  --stream) ||
  fail "bench queue --stream on redis"
echo "$out" | grep -E '^streaming +[0-9]+ jobs/s against [0-9]+ without: [0-9.]+x$' ||
  fail "no streaming line: $out"
python3 - "$port" <<'PY' || fail "the streaming jobs' streams"
import json, subprocess, sys
def cli(*a):
    out = subprocess.run(["redis-cli", "-p", sys.argv[1], "--json", *a],
                         capture_output=True).stdout
    try:  # a stream piece cut inside a character is not UTF-8
        return json.loads(out.decode("utf-8"))
    except UnicodeDecodeError as e:
        sys.exit(f"redis-cli {' '.join(a)}: not UTF-8 ({e}): {out[:400]!r}")
ids = [k.split(":", 2)[2] for k in subprocess.run(
    ["redis-cli", "-p", sys.argv[1], "--scan", "--pattern", "bench:result:*"],
    capture_output=True, text=True).stdout.split()]
streamed = [i for i in ids if "-s" in i.split("bench-", 1)[1]]
assert len(ids) == 100 and len(streamed) == 50, (len(ids), len(streamed))
for i in streamed:
    text = json.loads(cli("GET", f"bench:result:{i}"))["output"]["text"]
    pieces = "".join(e[1][e[1].index("text") + 1] for e in cli("XRANGE", f"bench:stream:{i}",
                                                               "-", "+"))
    assert pieces == text, (i, pieces, text)
print(f"{len(streamed)} streaming jobs: each stream adds up to its result's text")
PY
echo ok
