# The chaos test of issue 11, shortened for `make test`: tests/chaos/run for 20 s instead of
# 120 (150 Redis jobs and 3 workers on stories260K, plus a spool worker with 20 jobs) with
# random kill -9, SIGTERM drains, redis-server restarts and spool worker crashes. It fails
# on any lost or twice-announced job, a hung worker, or a ledger that does not add up; its
# summary line carries the figures. The full run: tests/chaos/run (see its --help).
source tests/e2e/lib.sh
command -v redis-server >/dev/null || fail "redis-server is not installed (scripts/install-deps)"
m=$(stories)
# (a failed run keeps its work directory, named above, with every worker's log and ledger)
python3 tests/chaos/run --model "$m" --duration 20 --jobs 150 --spool-jobs 20 --interval 0.3:1.5 \
  || fail "the chaos run failed (above)"
# What the chaos run once found, made deterministic: a completion whose reply is lost (the
# connection drops after Redis ran the pipeline) must still be announced exactly once.
WICK=$WICK python3 tests/chaos/lost_reply --model "$m" || fail "a lost reply announced a job twice"
echo ok
