# An engine that fails (a sticky device error, injected with the null backend's
# WICK_NULL_FAIL_STEP) does not turn its jobs into FAILED results: the worker logs itself
# unhealthy, hands the jobs it held back to the queue (billed as RELEASED overhead), and
# exits 3; a healthy worker then completes every job exactly once, on a second attempt for
# those handed back. Nor does it write its prefix cache (--prefix-cache-dir): a failed
# engine's caches are not trusted, and the file a healthy worker left stays as it was.
source tests/e2e/lib.sh
m=$(stories)
Q=$TMPD/q
L=$TMPD/ledger.jsonl
PC=$TMPD/pc
submit_jobs "spool:$TMPD/q0" k 1
"$WICK" worker --model "$m" --backend null --queue "spool:$TMPD/q0" --idle-timeout 0.3 \
  --prefix-cache-dir "$PC" 2>"$TMPD/keep.log" || fail "the healthy null worker: $(tail -3 "$TMPD/keep.log")"
grep -q 'wrote 1 entries' "$TMPD/keep.log" || fail "no cache kept: $(grep prefix_cache "$TMPD/keep.log")"
kept=$(stat -c '%i %Y %s' "$PC"/prefix-*.wpc)
submit_jobs "spool:$Q" e 6
set +e
WICK_NULL_FAIL_STEP=5 "$WICK" worker --model "$m" --backend null --queue "spool:$Q" \
  --concurrency 4 --idle-timeout 2 --ledger "$L" --prefix-cache-dir "$PC" 2>"$TMPD/bad.log"
rc=$?
set -e
grep -q 'read 1 entries' "$TMPD/bad.log" || fail "the cache not read: $(grep prefix_cache "$TMPD/bad.log")"
! grep -q 'wrote\|nothing to keep' "$TMPD/bad.log" || fail "a failed engine wrote its cache"
[ "$(stat -c '%i %Y %s' "$PC"/prefix-*.wpc)" = "$kept" ] || fail "the kept file changed"
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
