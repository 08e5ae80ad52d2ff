# The checks behind SECURITY.md: file modes, job ids that try to leave the spool, and secrets
# that must never reach a log, a result or the ledger.
source tests/e2e/lib.sh
m=$(stories)
umask 022 # the modes below must not depend on the caller's umask being strict
mode() { stat -c %a "$1"; }

# 1. Spool directories 0700, spool files and the ledger 0600.
Q=$TMPD/q
"$WICK" submit --queue "spool:$Q" --id ok1 -p "Once" -n 4 >/dev/null
[ "$(mode "$Q")" = 700 ] || fail "spool root is $(mode "$Q")"
for d in tmp new claimed done failed cancel; do
  [ "$(mode "$Q/$d")" = 700 ] || fail "spool $d/ is $(mode "$Q/$d")"
done
[ "$(mode "$Q/new/ok1.json")" = 600 ] || fail "a queued job is $(mode "$Q/new/ok1.json")"
"$WICK" submit --queue "spool:$Q" --cancel nothing-yet >/dev/null 2>&1 || true
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.3 --ledger "$TMPD/ledger.jsonl" \
  --usage-url http://127.0.0.1:9/ 2>/dev/null || true
[ "$(mode "$Q/done/ok1.json")" = 600 ] || fail "a result is $(mode "$Q/done/ok1.json")"
[ "$(mode "$TMPD/ledger.jsonl")" = 600 ] || fail "the ledger is $(mode "$TMPD/ledger.jsonl")"
[ "$(mode "$TMPD/ledger.jsonl.cursor")" = 600 ] || fail "the export cursor is $(mode "$TMPD/ledger.jsonl.cursor")"

# 2. Job ids cannot leave the spool: refused by submit, and a job file whose id tries is
#    failed under its file stem, with nothing written outside the spool.
for bad in ../evil a/b .. . "" "$(printf 'x%.0s' $(seq 129))" 'a b' 'a$b'; do
  if "$WICK" submit --queue "spool:$Q" --id "$bad" -p hi >/dev/null 2>"$TMPD/e"; then
    fail "submit accepted the id '$bad'"
  fi
done
printf '{"id": "../../escaped", "input": {"prompt": "hi"}}' >"$Q/new/trav.json"
printf '{"id": "/etc/passwd", "input": {"prompt": "hi"}}' >"$Q/new/abs.json"
"$WICK" worker --model "$m" --queue "spool:$Q" --idle-timeout 0.3 2>/dev/null || fail "worker exit"
for i in trav abs; do
  grep -q '"status": "FAILED"' "$Q/done/$i.json" || fail "job file $i.json: $(cat "$Q/done/$i.json" 2>/dev/null)"
done
[ ! -e "$TMPD/escaped.json" ] && [ ! -e "$Q/escaped.json" ] && [ ! -e "$(dirname "$TMPD")/escaped.json" ] \
  || fail "a result escaped the spool"

# 3. Secrets never reach logs, results or the ledger.
secret=wick-marker-SEKRIT-$$
# RunPod: the key is sent to the server and never printed, even when the server is down
RUNPOD_AI_API_KEY=$secret RUNPOD_WEBHOOK_POST_OUTPUT='http://127.0.0.1:9/done/$ID' \
  timeout 5 "$WICK" worker --model "$m" --queue 'http://127.0.0.1:9/job-take/$RUNPOD_POD_ID?token='"$secret" \
  --idle-timeout 1 --ledger "$TMPD/l2.jsonl" >"$TMPD/rp.out" 2>"$TMPD/rp.err" || true
# AWS: credentials sign requests and are never printed, even when SQS is down
AWS_ACCESS_KEY_ID=AKIA$secret AWS_SECRET_ACCESS_KEY=$secret AWS_SESSION_TOKEN=$secret \
  timeout 5 "$WICK" worker --model "$m" --queue "sqs://127.0.0.1:9/123456789012/q?tls=0" \
  --idle-timeout 1 >"$TMPD/sqs.out" 2>"$TMPD/sqs.err" || true
AWS_ACCESS_KEY_ID=AKIA$secret AWS_SECRET_ACCESS_KEY=$secret \
  timeout 5 "$WICK" submit --queue "sqs://127.0.0.1:9/123456789012/q?tls=0" -p hi \
  >>"$TMPD/sqs.out" 2>>"$TMPD/sqs.err" || true
# Redis: the password is sent with AUTH and never printed, even when Redis is down
WICK_REDIS_PASSWORD=$secret timeout 5 "$WICK" worker --model "$m" \
  --queue "redis://127.0.0.1:9/jobs" --idle-timeout 1 >"$TMPD/redis.out" 2>"$TMPD/redis.err" || true
WICK_REDIS_PASSWORD=$secret timeout 5 "$WICK" submit --queue "rediss://127.0.0.1:9/jobs" -p hi \
  >>"$TMPD/redis.out" 2>>"$TMPD/redis.err" || true
[ -s "$TMPD/rp.err" ] && [ -s "$TMPD/sqs.err" ] && [ -s "$TMPD/redis.err" ] ||
  fail "the failing drivers logged nothing"
if grep -rl -- "$secret" "$TMPD" --include='*.err' --include='*.out' --include='*.json' \
     --include='*.jsonl' 2>/dev/null | grep .; then
  fail "a secret reached the files above"
fi
echo ok
