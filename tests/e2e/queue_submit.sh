# `wick submit` on the spool and on a real redis-server started here on a free loopback port
# (killed on exit): ids made and kept, --wait, refusals with their error codes, --no-check,
# --cancel, and the worker side driven by tests/tools/queue_drive (the worker loop stands in).
source tests/e2e/lib.sh
QD=$WICK_TOOLS/queue_drive
SUBMIT=("$WICK" submit)
"$WICK" submit --help >/dev/null 2>&1 || SUBMIT=("$QD" submit) # until main.c lists submit
status() { python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["status"], (r.get("error") or {}).get("code", ""))'; }

run_on() { # QUEUE_URL
  local Q=$1
  id=$("${SUBMIT[@]}" --queue "$Q" -p "Once upon a time" -n 8) || fail "$Q: submit failed"
  [[ $id =~ ^job-[0-9a-f]+-[0-9a-f]{8}$ ]] || fail "$Q: made-up id '$id'"
  [ "$("${SUBMIT[@]}" --queue "$Q" --id mine -p x)" = mine ] || fail "$Q: --id not kept"
  "${SUBMIT[@]}" --queue "$Q" --id mine -p x 2>/dev/null && fail "$Q: a duplicate id was accepted"
  printf '{"id": "fromfile", "input": {"messages": [{"role": "user", "content": "hi"}]}}' >"$TMPD/job.json"
  [ "$("${SUBMIT[@]}" --queue "$Q" --file "$TMPD/job.json")" = fromfile ] || fail "$Q: --file"
  # refused before enqueueing, with the contract's code
  if "${SUBMIT[@]}" --queue "$Q" --stdin <<<'{"input": {"prompt": "x", "max_tokens": 0}}' 2>"$TMPD/err"; then
    fail "$Q: max_tokens 0 accepted"; fi
  grep -q max_tokens_range "$TMPD/err" || fail "$Q: no max_tokens_range in: $(cat "$TMPD/err")"
  # an id that is not a string is refused (it was swapped for a made-up one)
  if "${SUBMIT[@]}" --queue "$Q" --stdin <<<'{"id": 5, "input": {"prompt": "x"}}' 2>"$TMPD/err"; then
    fail "$Q: a numeric id accepted"; fi
  grep -q '"id" must be a string' "$TMPD/err" || fail "$Q: numeric id: $(cat "$TMPD/err")"
  set +e; "${SUBMIT[@]}" --queue "$Q" >/dev/null 2>&1; rc=$?; set -e
  [ $rc -eq 2 ] || fail "$Q: no job source should be a usage error (2), got $rc"
  # --no-check enqueues a broken job; the worker side answers it FAILED invalid_json
  "${SUBMIT[@]}" --queue "$Q" --no-check --id broken --stdin <<<'{oops' >/dev/null
  n=$("$QD" drain "$Q" 0.5)
  [ "$n" = 4 ] || fail "$Q: drained $n jobs, want 4"
  "${SUBMIT[@]}" --queue "$Q" --id broken2 --no-check --wait --timeout 0.2 --stdin <<<'{oops' >/dev/null 2>&1 &&
    fail "$Q: --wait returned a result nobody wrote"
  "$QD" drain "$Q" 0.5 >/dev/null
  # --wait: the result is printed when it appears; the exit code follows its status
  ( sleep 0.5; "$QD" drain "$Q" 1.5 >/dev/null ) &
  dp=$!
  out=$("${SUBMIT[@]}" --queue "$Q" -p "hello" --wait --timeout 20) || fail "$Q: --wait failed"
  wait $dp # (a bare wait would also wait for redis-server)
  [ "$(status <<<"$out")" = "COMPLETED " ] || fail "$Q: --wait printed $out"
  ( sleep 0.5; "$QD" drain "$Q" 1.5 >/dev/null ) &
  dp=$!
  set +e; out=$("${SUBMIT[@]}" --queue "$Q" --id broken3 --no-check --wait --timeout 20 --stdin <<<'[1]'); rc=$?; set -e
  wait $dp
  [ $rc -eq 1 ] || fail "$Q: a FAILED result should exit 1, got $rc"
  [ "$(status <<<"$out")" = "FAILED invalid_json" ] || fail "$Q: got $out"
  "${SUBMIT[@]}" --queue "$Q" --id later -p "hello" >/dev/null
  "${SUBMIT[@]}" --queue "$Q" --cancel later || fail "$Q: --cancel"
}

run_on "spool:$TMPD/spool"
S=$TMPD/spool
[ -f "$S/done/broken.json" ] && [ -f "$S/failed/broken.json" ] || fail "spool: broken job not in done/ and failed/"
[ -f "$S/cancel/later" ] || fail "spool: no cancel/later"
# a finished job or an unknown id cannot be cancelled (a marker for it stayed forever)
! "${SUBMIT[@]}" --queue "spool:$S" --cancel mine 2>"$TMPD/c.err" && grep -q "has finished" "$TMPD/c.err" ||
  fail "spool: --cancel of a finished job: $(cat "$TMPD/c.err")"
! "${SUBMIT[@]}" --queue "spool:$S" --cancel nope 2>"$TMPD/c.err" && grep -q "no job nope" "$TMPD/c.err" &&
  [ ! -e "$S/cancel/nope" ] || fail "spool: --cancel of an unknown id: $(cat "$TMPD/c.err")"
[ "$(stat -c %a "$S/new")" = 700 ] || fail "spool: new/ is not mode 0700"
ls "$S/tmp" | has . && fail "spool: tmp/ not empty: $(ls "$S/tmp")"

if ! command -v redis-server >/dev/null; then
  echo "SKIP redis part: redis-server is not installed (scripts/install-deps)"; exit 0
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMPD" >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null; rm -rf "$TMPD"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
run_on "redis://127.0.0.1:$port/e2e?group=g"
[ "$(redis-cli -p "$port" exists e2e:cancel:later)" = 1 ] || fail "redis: no cancel key"
[ "$(redis-cli -p "$port" xlen e2e:dead)" -ge 1 ] || fail "redis: the broken input is not in e2e:dead"
[ "$(redis-cli -p "$port" xpending e2e g | sed -n 1p)" = 0 ] || fail "redis: entries left pending"
echo ok
