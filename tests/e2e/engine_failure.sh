# An engine that fails (a sticky device error, injected with the null backend's
# WICK_NULL_FAIL_STEP) does not turn its jobs into FAILED results: the worker logs itself
# unhealthy, hands the jobs it held back to the queue (billed as RELEASED overhead), and
# exits 3; a healthy worker then completes every job exactly once, on a second attempt for
# those handed back.
source tests/e2e/lib.sh
m=$(stories)
Q=$TMPD/q
L=$TMPD/ledger.jsonl
submit_jobs "spool:$Q" e 6
set +e
WICK_NULL_FAIL_STEP=5 "$WICK" worker --model "$m" --backend null --queue "spool:$Q" \
  --concurrency 4 --idle-timeout 2 --ledger "$L" 2>"$TMPD/bad.log"
rc=$?
set -e
[ $rc -eq 3 ] || fail "the failing worker exited $rc, not 3: $(tail -3 "$TMPD/bad.log")"
grep -q 'unhealthy' "$TMPD/bad.log" || fail "no unhealthy line: $(tail -3 "$TMPD/bad.log")"
grep -q 'injected device failure' "$TMPD/bad.log" || fail "the engine's error is not logged"
[ -z "$(ls "$Q/done")" ] || fail "the failing worker stored results: $(ls "$Q/done")"
[ -z "$(ls "$Q/claimed")" ] || fail "claims left behind: $(ls "$Q/claimed")"
back=$(grep -c 'handed back to the queue' "$TMPD/bad.log")
[ "$back" -eq 4 ] || fail "$back jobs handed back, not the 4 it held"

"$WICK" worker --model "$m" --queue "spool:$Q" --concurrency 4 --idle-timeout 0.5 \
  --ledger "$L" 2>"$TMPD/good.log" || fail "the healthy worker: $(tail -3 "$TMPD/good.log")"
python3 - "$Q" "$L" <<'PY' || fail "after the hand-back"
import json, os, sys
q, led = sys.argv[1], sys.argv[2]
done = {f[:-5]: json.load(open(os.path.join(q, "done", f))) for f in os.listdir(os.path.join(q, "done"))}
assert sorted(done) == [f"e-{i}" for i in range(1, 7)], sorted(done)
assert all(v["status"] == "COMPLETED" for v in done.values()), done
second = sorted(k for k, v in done.items() if v["attempt"] == 2)
assert len(second) == 4, {k: v["attempt"] for k, v in done.items()}
reqs = [e for e in map(json.loads, open(led)) if e["type"] == "request"]
released = sorted(e["id"] for e in reqs if e["status"] == "RELEASED")
assert released == second, (released, second)
print(f"engine failure: exit 3, {len(released)} jobs handed back (billed RELEASED), "
      f"then completed on attempt 2 by a healthy worker; none FAILED")
PY
echo ok
