# The golden stories260K generation under valgrind's memcheck: no invalid read or write, no
# use of uninitialised memory, no definite leak, and still the golden text. Skipped in the
# ASan build (the sanitizer already checks it there, and the two do not mix).
source tests/e2e/lib.sh
case ${MODE:-release} in asan) echo "SKIP: ASan build"; exit 0 ;; esac
command -v valgrind >/dev/null || fail "valgrind is not installed (scripts/install-deps)"
m=$(stories)
want="Once upon a time, there was a little girl named Lily."
got=$(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite "$WICK" generate "$m" -n 24 --temperature 0 --threads 2 2>"$TMPD/vg.txt") \
  || { cat "$TMPD/vg.txt"; fail "valgrind reported errors (exit $?)"; }
echo "$got"
[[ $got == "$want"* ]] || fail "under valgrind the text differs: '$got'"
# and a worker serving a job end to end (queue, scheduler, result), also clean
"$WICK" submit --queue "spool:$TMPD/q" --id v1 -p "Once upon a time" -n 16 --temperature 0 >/dev/null
valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite "$WICK" worker --model "$m" --queue "spool:$TMPD/q" --idle-timeout 0.5 \
  --ledger "$TMPD/ledger.jsonl" 2>"$TMPD/vgw.txt" \
  || { grep -v '^20' "$TMPD/vgw.txt" | head -60; fail "valgrind reported errors in the worker"; }
grep -q '"status": "COMPLETED"' "$TMPD/q/done/v1.json" || fail "the job did not complete under valgrind"
echo ok
