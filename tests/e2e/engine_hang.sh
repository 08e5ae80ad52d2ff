# A step that never ends (a hung device, driver or kernel; injected with the null backend's
# WICK_NULL_HANG_STEP) does not hang the worker: after --step-timeout its watchdog logs it
# unhealthy, hands the jobs it held back to the queue (billed RELEASED), closes the ledger
# (worker_exit, reason step_timeout) and exits 3, while the main thread is still stuck in the
# step; a healthy worker then completes every job exactly once, on a second attempt for
# those handed back. Without the watchdog the first worker never exits (the timeout below
# kills it: exit 124).
source tests/e2e/lib.sh
m=$(stories)
Q=$TMPD/q
L=$TMPD/ledger.jsonl
submit_jobs "spool:$Q" h 6
set +e
t0=$(date +%s.%N)
WICK_NULL_HANG_STEP=5 timeout -k 5 60 "$WICK" worker --model "$m" --backend null \
  --queue "spool:$Q" --concurrency 4 --idle-timeout 2 --step-timeout 1 --ledger "$L" \
  2>"$TMPD/hung.log"
rc=$?
t1=$(date +%s.%N)
set -e
[ $rc -eq 3 ] || fail "the hung worker exited $rc, not 3: $(tail -3 "$TMPD/hung.log")"
took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
grep -q 'the engine is taken for hung' "$TMPD/hung.log" \
  || fail "no unhealthy line: $(tail -3 "$TMPD/hung.log")"
[ -z "$(ls "$Q/done")" ] || fail "the hung worker stored results: $(ls "$Q/done")"
[ -z "$(ls "$Q/claimed")" ] || fail "claims left behind: $(ls "$Q/claimed")"
back=$(grep -c 'handed back to the queue' "$TMPD/hung.log")
[ "$back" -eq 4 ] || fail "$back jobs handed back, not the 4 it held"

"$WICK" worker --model "$m" --backend null --queue "spool:$Q" --concurrency 4 \
  --idle-timeout 0.5 --ledger "$L" 2>"$TMPD/good.log" \
  || fail "the healthy worker: $(tail -3 "$TMPD/good.log")"
python3 - "$Q" "$L" "$took" <<'PY' || fail "after the hand-back"
import json, os, sys
q, led, took = sys.argv[1], sys.argv[2], sys.argv[3]
done = {f[:-5]: json.load(open(os.path.join(q, "done", f))) for f in os.listdir(os.path.join(q, "done"))}
assert sorted(done) == [f"h-{i}" for i in range(1, 7)], sorted(done)
assert all(v["status"] == "COMPLETED" for v in done.values()), done
second = sorted(k for k, v in done.items() if v["attempt"] == 2)
assert len(second) == 4, {k: v["attempt"] for k, v in done.items()}
events = [json.loads(line) for line in open(led)]
reqs = [e for e in events if e["type"] == "request"]
released = sorted(e["id"] for e in reqs if e["status"] == "RELEASED")
assert released == second, (released, second)
exits = [e for e in events if e["type"] == "worker_exit"]
assert [e["reason"] for e in exits] == ["step_timeout", "idle"], exits
print(f"hung step: exit 3 after {took} s (--step-timeout 1), {len(released)} jobs handed back "
      f"(billed RELEASED), ledger closed (step_timeout); then completed on attempt 2 by a "
      f"healthy worker; none FAILED")
PY
echo ok
