# A full disk, on a small tmpfs this test mounts: writing a snapshot, a spool result, the
# usage ledger or the kept prefix cache fails with a clear error, nothing already written is corrupted, and no job is
# lost - once there is room again, every job completes.
source tests/e2e/lib.sh
mnt=$TMPD/mnt
mkdir -p "$mnt"
if ! mount -t tmpfs -o size=2m,mode=0700 tmpfs "$mnt" 2>/dev/null; then
  echo "SKIP: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)"
  exit 0
fi
trap 'umount "$mnt" 2>/dev/null; rm -rf "$TMPD"' EXIT
m=$(stories)
fill() { dd if=/dev/zero of="$mnt/fill" bs=4k 2>/dev/null || true; sync; }
unfill() { rm -f "$mnt/fill"; }
parses() { python3 -c "
import json, sys
for l in open(sys.argv[1]): json.loads(l)
" "$1"; }

# 1. A snapshot written over a good one on a full disk: a clear error, the old one intact.
"$WICK" snapshot "$m" -o "$mnt/snap" >/dev/null || fail "the first snapshot does not fit"
fill
if "$WICK" snapshot "$m" -o "$mnt/snap" --dtype f32 2>"$TMPD/s.err"; then fail "snapshot on a full disk succeeded"; fi
grep -q "No space left on device" "$TMPD/s.err" || fail "snapshot error: $(cat "$TMPD/s.err")"
ls "$mnt" | has 'snap.tmp' && fail "a partial snapshot directory was left behind"
got=$("$WICK" generate "$mnt/snap" -n 12 --temperature 0 2>/dev/null) || fail "the old snapshot no longer restores"
[[ $got == "Once upon a time, there was"* ]] || fail "the old snapshot generates '$got'"
unfill
rm -rf "$mnt/snap"

# 2. Spool results on a full disk: not stored, the jobs stay claimed and are not lost.
Q=$mnt/q
for i in 1 2 3; do "$WICK" submit --queue "spool:$Q" --id "s$i" -p "Once upon a time" -n 8 >/dev/null; done
fill
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.5 2>"$TMPD/w1.log" || fail "worker exit on a full disk"
grep -q "was not stored" "$TMPD/w1.log" || fail "no error about the results: $(tail -3 "$TMPD/w1.log")"
grep -q "No space left on device" "$TMPD/w1.log" || fail "the error does not name the cause"
[ -z "$(ls "$Q/done")" ] || fail "results appeared in done/ on a full disk: $(ls "$Q/done")"
unfill
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.5 2>"$TMPD/w2.log" || fail "worker exit after the disk was freed"
for i in 1 2 3; do
  grep -q '"status": "COMPLETED"' "$Q/done/s$i.json" || fail "job s$i did not complete once there was room"
done
rm -rf "$Q"

# 3. The usage ledger on a full disk: a request line that cannot be written keeps its result
#    from being stored (billing comes first); the lines written before stay whole; later all
#    complete. (The ledger's last page may have room for a line or two: a job finished alone,
#    as one the prefix cache let run a step ahead of the others, may still be billed and
#    stored. Whichever are, each stored result has its line and each other none.)
Q=$TMPD/q2
L=$mnt/ledger.jsonl
"$WICK" submit --queue "spool:$Q" --id l0 -p "Once" -n 4 >/dev/null
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.3 --ledger "$L" 2>/dev/null || fail "first ledger run"
before=$(wc -l <"$L")
cp "$L" "$TMPD/ledger.before"
for i in 1 2 3; do "$WICK" submit --queue "spool:$Q" --id "l$i" -p "Once upon a time" -n 8 >/dev/null; done
fill
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.5 --ledger "$L" 2>"$TMPD/w3.log"
grep -q "ledger" "$TMPD/w3.log" && grep -q "No space left on device" "$TMPD/w3.log" \
  || fail "no clear ledger error: $(grep -i ledger "$TMPD/w3.log" | head -3)"
unstored=0
for i in 1 2 3; do
  if [ -e "$Q/done/l$i.json" ]; then
    grep -q "\"id\":\"l$i\"" "$L" || fail "l$i stored a result its ledger line could not precede"
  else
    unstored=$((unstored + 1))
    grep -q "\"id\":\"l$i\"" "$L" && fail "l$i was billed but its result not stored"
  fi
done
[ $unstored -gt 0 ] || fail "every result was stored on a full disk"
parses "$L" || fail "the ledger no longer parses after a full disk"
head -n "$before" "$L" | cmp -s - "$TMPD/ledger.before" || fail "the lines written before the full disk changed"
unfill
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.5 --ledger "$L" 2>/dev/null || fail "worker after the disk was freed"
for i in 1 2 3; do grep -q '"status": "COMPLETED"' "$Q/done/l$i.json" || fail "l$i did not complete"; done
parses "$L" || fail "the ledger does not parse at the end"
python3 - "$L" <<'PY' || fail "ledger lines"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ids = [e["id"] for e in ev if e["type"] == "request" and e["status"] == "COMPLETED"]
# the lines of one group commit are written whole or not at all: the full disk left none
for i in ("l0", "l1", "l2", "l3"):
    assert ids.count(i) == 1, (i, ids)
print("every job has one request line across the full disk")
PY
"$WICK" usage "$L" --by request --format json >"$TMPD/u.json" || fail "wick usage on the ledger"
python3 -c "
import json, sys
rows = json.load(open(sys.argv[1]))['rows']
billed = [r['id'] for r in rows if r['billed'] == 'yes']
assert sorted(billed) == ['l0', 'l1', 'l2', 'l3'], billed
" "$TMPD/u.json" || fail "billing after the full disk"

# 4. The kept prefix cache (--prefix-cache-dir) on a full disk: not written, said with its
#    cause, the worker exits 0, the file kept before stays as it was and no temporary is left.
Q=$TMPD/q3
PC=$mnt/pc
"$WICK" submit --queue "spool:$Q" --id p1 -p "Once upon a time" -n 4 >/dev/null
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.3 --prefix-cache-dir "$PC" \
  2>"$TMPD/p1.log" || fail "the first prefix cache run"
grep -q "wrote 1 entries" "$TMPD/p1.log" || fail "no cache kept: $(grep prefix_cache "$TMPD/p1.log")"
kept=$(md5sum "$PC"/prefix-*.wpc)
"$WICK" submit --queue "spool:$Q" --id p2 -p "The dog ran to the park" -n 4 >/dev/null
fill
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.3 --prefix-cache-dir "$PC" \
  2>"$TMPD/p2.log" || fail "the worker's exit with the cache on a full disk"
grep -q "prefix_cache: not written: .*No space left on device" "$TMPD/p2.log" ||
  fail "no clear error: $(grep prefix_cache "$TMPD/p2.log")"
[ "$(md5sum "$PC"/prefix-*.wpc)" = "$kept" ] || fail "the kept file changed on a full disk"
[ "$(ls "$PC" | wc -l)" = 1 ] || fail "left in $PC: $(ls "$PC")"
grep -q '"status": "COMPLETED"' "$Q/done/p2.json" || fail "p2 did not complete"
unfill
echo "4. the prefix cache on a full disk: not written (said), the kept file unchanged"
echo ok
