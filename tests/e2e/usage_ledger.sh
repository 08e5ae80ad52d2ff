# The usage ledger through the real worker on stories260K:
#  1. conservation over random job mixes (sizes, lengths, arrival times, concurrency): the
#     requests' gpu_seconds sum to the busy seconds of the state transitions (+-1 ms), the
#     states sum to the lifetime (+-1 ms), billed = ceil(lifetime);
#  2. kill -9 mid-batch: the ledger still parses, a torn tail is repaired on the next start
#     (with a recovery event), `wick usage` gives the lifetime within 1 s of the truth, and
#     every job with a stored result has its request line; each job is billed once;
#  3. export to a collector (in this test) that fails the first posts: every event arrives,
#     each exactly once by id, also across the kill -9.
source tests/e2e/lib.sh
m=$(stories)

# ---- 1. conservation over random mixes ----
python3 - "$WICK" "$m" "$TMPD" <<'PY'
import json, math, os, random, subprocess, sys, time
wick, model, tmp = sys.argv[1:4]
for seed in (1, 2, 3):
    rnd = random.Random(seed)
    q = f"{tmp}/mix{seed}"
    led = f"{tmp}/mix{seed}.jsonl"
    conc = rnd.randint(1, 8)
    n = rnd.randint(8, 20)
    jobs = sorted((rnd.uniform(0, 2.0), i) for i in range(n))
    w = subprocess.Popen([wick, "worker", "--model", model, "--queue", f"spool:{q}",
                          "--idle-timeout", "1", "--concurrency", str(conc), "--ledger", led,
                          "--ledger-tick", "0.2"], stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    for at, i in jobs:
        d = at - (time.monotonic() - t0)
        if d > 0:
            time.sleep(d)
        words = " ".join(rnd.choice(["Once", "upon", "a", "time", "the", "cat", "sat"])
                         for _ in range(rnd.randint(1, 30)))
        subprocess.run([wick, "submit", "--queue", f"spool:{q}", "--id", f"m{i}", "-p", words,
                        "-n", str(rnd.randint(1, 80)), "--temperature", "0.9",
                        "--seed", str(i)], check=True, stdout=subprocess.DEVNULL)
    assert w.wait(timeout=60) == 0, "worker exit"
    ev = [json.loads(l) for l in open(led)]
    busy = sum(e["seconds"] for e in ev if e["type"] == "state" and e["state"] == "busy")
    states = sum(e["seconds"] for e in ev if e["type"] == "state")
    gpu = sum(e["gpu_seconds"] for e in ev if e["type"] == "request")
    ex = [e for e in ev if e["type"] == "worker_exit"]
    assert len(ex) == 1, ex
    ex = ex[0]
    reqs = {e["id"] for e in ev if e["type"] == "request"}
    assert reqs == {f"m{i}" for i in range(n)}, f"request lines for {sorted(reqs)}"
    assert abs(gpu - busy) <= 1e-3, f"seed {seed}: sum of gpu_seconds {gpu:.6f} != busy {busy:.6f}"
    assert abs(states - ex["lifetime_seconds"]) <= 1e-3, (states, ex)
    assert ex["billed_seconds"] == math.ceil(ex["lifetime_seconds"] - 1e-6), ex
    assert ex["cost_micro_usd"] == (ex["billed_seconds"] * 36310000 + 1800) // 3600, ex
    assert busy > 0 and ex["idle_seconds"] > 0
    print(f"seed {seed}: {n} jobs, concurrency {conc}: busy {busy:.4f} s = sum of gpu_seconds "
          f"{gpu:.4f} s; lifetime {ex['lifetime_seconds']:.3f} s, billed {ex['billed_seconds']} s")
PY
"$WICK" usage "$TMPD/mix1.jsonl" --format json >"$TMPD/u1.json" || fail "wick usage"
python3 - "$TMPD/u1.json" <<'PY'
import json, sys
u = json.load(open(sys.argv[1]))
t = u["totals"]
assert abs(t["request_gpu_seconds"] - t["busy_seconds"]) <= 1e-3, t
assert t["overhead_attempts"] == 0 and t["bad_lines"] == 0, t
PY

# ---- 2 and 3: kill -9 mid-batch, with the export on; then a second worker finishes ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$port" "$TMPD/collected.json" <<'PY' &
# A metering collector: keeps CloudEvents by id; fails the first 3 posts (after reading them).
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, out = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
state = {"posts": 0, "failed": 0, "events": {}, "copies": 0}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            state["posts"] += 1
            if state["posts"] <= 3:
                state["failed"] += 1
                self.send_response(500); self.end_headers(); return
            for ev in json.loads(body):
                assert ev["specversion"] == "1.0" and ev["id"] and ev["type"].startswith("wick.")
                if ev["id"] in state["events"]:
                    state["copies"] += 1
                state["events"][ev["id"]] = ev
            json.dump({"posts": state["posts"], "failed": state["failed"], "copies": state["copies"],
                       "ids": sorted(state["events"])}, open(out + ".tmp", "w"))
            import os; os.replace(out + ".tmp", out)
        self.send_response(200); self.end_headers()
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
cpid=$!
trap 'kill $cpid 2>/dev/null; rm -rf "$TMPD"' EXIT
for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null && break; sleep 0.05; done

Q=$TMPD/kq
L=$TMPD/kill.jsonl
for i in $(seq 1 60); do
  "$WICK" submit --queue "spool:$Q" --id "k$i" -p "Once upon a time" -n 400 --temperature 0.8 \
    --seed "$i" >/dev/null || fail "submit"
done
start=$(date +%s.%N)
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 4 --lease 2 --idle-timeout 3 \
  --ledger "$L" --usage-url "http://127.0.0.1:$port/events" 2>"$TMPD/k1.log" &
k1=$!
# mid-batch however fast or busy the machine: killed as soon as the first results are stored
# (60 jobs of 400 tokens: minutes of work; the wait allows 60 s for the first two)
for _ in $(seq 3000); do [ "$(ls "$Q/done" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.02; done
kill -9 $k1
killed=$(date +%s.%N)
wait $k1 2>/dev/null || true
done_before=$(ls "$Q/done" | wc -l)
[ "$done_before" -gt 0 ] && [ "$done_before" -lt 60 ] || fail "not mid-batch: $done_before of 60 done at the kill"
python3 -c "
import json, sys
for n, l in enumerate(open('$L'), 1):
    json.loads(l)
" || fail "the ledger does not parse after kill -9"
# a crash mid-write: a torn last line
printf '{"type":"request","ts":"2026-12-0' >>"$L"
"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 8 --lease 2 --idle-timeout 1 \
  --ledger "$L" --usage-url "http://127.0.0.1:$port/events" 2>"$TMPD/k2.log" || fail "second worker: $(tail -3 "$TMPD/k2.log")"
grep -q "events sent" "$TMPD/k2.log" || fail "no export summary: $(grep usage_export "$TMPD/k2.log")"
"$WICK" usage "$L" --by worker --format json >"$TMPD/uk.json" || fail "wick usage"
"$WICK" usage "$L" --by request --format json >"$TMPD/ur.json" || fail "wick usage --by request"
python3 - "$L" "$Q" "$TMPD/uk.json" "$TMPD/ur.json" "$TMPD/collected.json" "$start" "$killed" <<'PY'
import json, os, sys
led, q, uk, ur, col, start, killed = sys.argv[1:8]
truth = float(killed) - float(start)
ev = [json.loads(l) for l in open(led)]          # every line parses
rec = [e for e in ev if e["type"] == "recovery"]
assert rec and rec[0]["dropped_bytes"] == len('{"type":"request","ts":"2026-12-0'), rec
assert rec[0]["crashed"] and rec[0]["crashed"][0]["worker"] != "", rec
w = json.load(open(uk))["rows"]
crashed = [r for r in w if r["exit"] == "crashed"]
assert len(crashed) == 1 and len(w) == 2, w
life = crashed[0]["lifetime_seconds"]
assert abs(life - truth) <= 1.0, f"crashed worker: usage says {life:.3f} s, it lived {truth:.3f} s"
assert crashed[0]["billed_seconds"] >= life
# every stored result has its request line; each job billed once
reqs = json.load(open(ur))["rows"]
done = {f[:-5] for f in os.listdir(os.path.join(q, "done"))}
assert done == {f"k{i}" for i in range(1, 61)}, f"{len(done)} results"
billed = {}
for r in reqs:
    if r["billed"] == "yes":
        billed[r["id"]] = billed.get(r["id"], 0) + 1
for i in done:
    res = json.load(open(os.path.join(q, "done", i + ".json")))
    assert billed.get(i) == 1, f"{i}: billed {billed.get(i)} times"
    lines = [r for r in reqs if r["id"] == i and r["status"] == res["status"]]
    assert lines, f"{i} has a stored result and no request line"
# export: every exportable event arrived, each exactly once by id
c = json.load(open(col))
want = {e["eid"] for e in ev if e["type"] in ("request", "state", "worker_exit")}
got = set(c["ids"])
assert c["failed"] == 3 and got == want, f"missing {len(want - got)}, extra {len(got - want)}"
print(f"kill -9 after {truth:.2f} s: usage says {life:.2f} s; {len(done)} results, each billed once; "
      f"{len(got)} events exported ({c['failed']} posts failed and were retried, {c['copies']} copies dropped by id)")
PY

# ---- 4. bills from hand-written ledgers: the edge cases of wick usage's arithmetic ----
# (each found by an audit; before the fixes: a run with no billed request charged to nobody
# under --bill-overhead proportional, a run cut off from its worker_start line billed $0,
# two tenants' jobs with one id billed once, a superseded line read before its request
# line ignored, a job of no gpu time given a whole run's overhead, a run's cost put on its
# start day, a ledger given twice counted twice)
python3 - "$WICK" "$TMPD" <<'PY'
import datetime, decimal, json, subprocess, sys
wick, tmp = sys.argv[1:3]
PRICE = 36310000  # micro-dollars an hour

def ts(u):
    d = datetime.datetime.fromtimestamp(u, datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

def cost(secs):  # half up, as money_cost_micro
    return (round(secs * 1e6) * PRICE + 1800000000) // 3600000000

class Run:
    """a worker's ledger lines, written as worker/ledger.c writes them"""
    def __init__(self, worker, t0, start=True):
        self.w, self.t0, self.seq, self.lines = worker, t0, 0, []
        self.boot, self.state_name, self.since = int(t0 * 1000), "starting", 0.0
        if start:
            self.ev("worker_start", 0, gpu_type="H200", gpu_count=8,
                    price_micro_usd_per_hour=PRICE)
    def ev(self, typ, mono, **kw):
        self.seq += 1
        self.lines.append(json.dumps(dict(type=typ, ts=ts(self.t0 + mono),
                                          eid=f"{self.w}.{self.boot}.{self.seq}", worker=self.w,
                                          boot=self.boot, mono=mono, **kw)))
    def state(self, new, mono):
        kw = dict(next=new) if new else {}
        self.ev("state", mono, state=self.state_name, mono_start=self.since, mono_end=mono,
                seconds=round(mono - self.since, 6), **kw)
        self.state_name, self.since = new, mono
    def req(self, mono, id, tenant, gpu, attempt=1):
        self.ev("request", mono, id=id, tenant=tenant, attempt=attempt, status="COMPLETED",
                queue_seconds=0.1, prompt_tokens=3, completion_tokens=10, gpu_seconds=gpu,
                cost_micro_usd=cost(gpu))
    def exit(self, mono, price=True):
        self.state(None, mono)
        billed = -(-round(mono * 1e6) // 10 ** 6)
        kw = dict(price_micro_usd_per_hour=PRICE) if price else {}
        self.ev("worker_exit", mono, reason="idle", lifetime_seconds=mono, billed_seconds=billed,
                cost_micro_usd=cost(billed), **kw)
        return cost(billed)

def usage(files, *args):
    paths = []
    for i, lines in enumerate(files):
        paths.append(f"{tmp}/h{len(paths)}-{i}.jsonl")
        open(paths[-1], "w").write("\n".join(lines) + "\n")
    out = subprocess.run([wick, "usage", *paths, "--format", "json", *args],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"wick usage {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)

T = 1767225600.0  # 2026-01-01T00:00:00Z
# a run with requests (overhead spread over them) and an idle one (no requests)
a = Run("a", T + 3600); a.state("busy", 1.0); a.req(1.3, "j1", "alice", 0.3)
a.req(1.5, "j2", "bob", 0.2); a.state("idle", 1.5); ca = a.exit(2.5)
e = Run("e", T + 7200); ce = e.exit(3.0)
u = usage([a.lines, e.lines], "--by", "tenant", "--bill-overhead", "proportional")
rows = {r["tenant"]: round(float(r["cost_usd"]) * 1e6) for r in u["rows"]}
assert sum(rows.values()) == ca + ce == u["totals"]["cost_micro_usd"], (rows, ca, ce)
assert rows["(no requests)"] == ce, rows
# requests whose rounded costs add up to more than their run's: a negative overhead, spread
n = Run("n", T); n.state("busy", 0.0)
for i in range(10):
    n.req(0.1 * (i + 1), f"n{i}", "t", 0.1)  # 1009 each: 10090 against the run's 10086
cn = n.exit(1.0)
u = usage([n.lines], "--by", "tenant", "--bill-overhead", "proportional")
assert round(float(u["rows"][0]["cost_usd"]) * 1e6) == cn == 10086, u["rows"]
# no worker_start (a rotated ledger): priced from worker_exit
s = Run("s", T, start=False); cs = s.exit(2.0)
u = usage([s.lines], "--by", "worker")
assert u["totals"]["cost_micro_usd"] == cs > 0 and u["totals"]["unpriced_runs"] == 0, u["totals"]
# two tenants' jobs with one id: both billed
m = Run("m", T); m.req(1.0, "order-1", "alice", 0.2); m.req(2.0, "order-1", "bob", 0.3); m.exit(3.0)
u = usage([m.lines], "--by", "request")
assert [r["billed"] for r in u["rows"]] == ["yes", "yes"], u["rows"]
# a superseded line before its request line (lines of two files in any order)
x = Run("x", T); x.req(1.0, "X", "t", 1.0, attempt=1); x.exit(2.0)
y = Run("y", T + 10); y.req(1.5, "X", "t", 2.5, attempt=2); y.ev("superseded", 1.6, id="X", attempt=2)
y.exit(2.0)
y.lines[1], y.lines[2] = y.lines[2], y.lines[1]
u = usage([x.lines, y.lines], "--by", "request")
assert [r["attempt"] for r in u["rows"] if r["billed"] == "yes"] == [1], u["rows"]
# a job that never ran (0 gpu-seconds) carries none of its run's overhead
z = Run("z", T); z.req(0.1, "bad", "mallory", 0.0); cz = z.exit(1.0)
u = usage([z.lines], "--by", "tenant", "--bill-overhead", "proportional")
rows = {r["tenant"]: round(float(r["cost_usd"]) * 1e6) for r in u["rows"]}
assert rows == {"mallory": 0, "(no requests)": cz}, rows
# a run across midnight: its cost split by its seconds in each day
d = Run("d", T - 30); d.state("idle", 0.0); cd = d.exit(60.0)
u = usage([d.lines], "--by", "day")
days = {r["day"]: round(float(r["workers_cost_usd"]) * 1e6) for r in u["rows"]}
assert sum(days.values()) == cd and abs(days["2026-01-01"] - cd / 2) <= 1, days
# a crash: the open interval is the state begun by the last state line, not the older tick's
c = Run("c", T); c.state("idle", 0.2); c.ev("tick", 1.0, state="idle", lifetime_seconds=1.0)
c.state("busy", 1.5); c.req(1.9, "j", "t", 0.4)
t = usage([c.lines])["totals"]
assert abs(t["busy_seconds"] - 0.4) < 1e-6 and abs(t["idle_seconds"] - 1.3) < 1e-6, t
# the same ledger twice: counted once, and said
u = usage([a.lines, a.lines])
t = u["totals"]
assert t["duplicate_lines"] == len(a.lines) and t["cost_micro_usd"] == ca, t
assert abs(t["start_seconds"] + t["busy_seconds"] + t["idle_seconds"] - 2.5) < 1e-6, t
# a line with a number out of its kind or range (damaged, or edited): skipped and counted,
# never billed; amounts no bill can hold (a 31-year run at $1e9 an hour): refused, by name
h = Run("h", T); h.req(1.0, "ok", "t", 0.5); h.req(1.5, "neg", "t", 0.5)
h.lines[-1] = h.lines[-1].replace('"gpu_seconds": 0.5', '"gpu_seconds": -2.0')
h.req(1.6, "str", "t", 0.5)
h.lines[-1] = h.lines[-1].replace('"attempt": 1', '"attempt": "1"'); ch = h.exit(3.0)
u = usage([h.lines], "--by", "request")
assert [r["id"] for r in u["rows"]] == ["ok"] and u["totals"]["bad_lines"] == 2, u
assert u["totals"]["cost_micro_usd"] == ch, u["totals"]
g = Run("g", T); g.lines[0] = g.lines[0].replace(f"{PRICE}", f"{10 ** 15}"); g.exit(1e9)
# large amounts spread exactly: a 48-day run at $1e9 an hour (its cost just under the
# limit) over two equal requests; shares of a floating-point quotient came to 5
# micro-dollars more than the run's cost
def micro(s):
    return int((decimal.Decimal(s) * 1000000).to_integral_exact())
v = Run("v", T); v.lines[0] = v.lines[0].replace(f"{PRICE}", f"{10 ** 15}")
v.state("busy", 0.0); v.req(1.0, "v1", "p", 1.0); v.req(2.0, "v2", "q", 1.0); v.exit(4150003.0)
u = usage([v.lines], "--by", "tenant", "--bill-overhead", "proportional")
rows = [micro(r["cost_usd"]) for r in u["rows"]]
assert sum(rows) == micro(u["totals"]["cost_usd"]) == 1152778611111111111, (rows, u["totals"])
open(f"{tmp}/huge.jsonl", "w").write("\n".join(g.lines) + "\n")
out = subprocess.run([wick, "usage", f"{tmp}/huge.jsonl"], capture_output=True, text=True)
assert out.returncode == 1 and "more than a bill can hold" in out.stderr, out
print("hand-written ledgers: proportional overhead adds up (an idle run's shown apart, a "
      "negative one spread), a run priced from its exit, one id of two tenants billed twice, "
      "a superseded line out of order, a never-run job free, a run split at midnight, "
      "a crash's open interval, a ledger given twice counted once, numbers out of range "
      "skipped, a bill too large refused, large amounts spread exactly")
PY
# Not a ledger: a directory, a file of other lines: exit 1 by name, not a $0.00 bill
rc=0; "$WICK" usage "$TMPD" >/dev/null 2>"$TMPD/notl1" || rc=$?
[ $rc = 1 ] && grep -q 'not a ledger file (a directory)' "$TMPD/notl1" || fail "a directory: rc=$rc $(cat "$TMPD/notl1")"
printf 'root:x:0:0:root:/root:/bin/bash\n{"type": "tick"}\n' >"$TMPD/passwd"
rc=0; "$WICK" usage "$TMPD/passwd" >/dev/null 2>"$TMPD/notl2" || rc=$?
[ $rc = 1 ] && grep -q 'not a ledger: none of its 2 lines is a ledger event' "$TMPD/notl2" ||
  fail "a file of other lines: rc=$rc $(cat "$TMPD/notl2")"
echo ok
