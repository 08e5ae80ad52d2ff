# wick logits: the stable JSON format engines and backends are compared through, and the
# consistency of prefill (all positions at once) with the cached decode path.
source tests/e2e/lib.sh
m=$(stories)
"$WICK" logits "$m" --tokens 1,403,407,261,378 --all-positions >"$TMPD/all.json"
"$WICK" logits "$m" --tokens 1,403,407 >"$TMPD/last.json"
python3 - "$TMPD/all.json" "$TMPD/last.json" <<'PY'
import json, sys, math
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert a["vocab"] == 512 and b["vocab"] == 512, "vocab must be config.json's vocab_size"
assert a["positions"] == [0, 1, 2, 3, 4], a["positions"]
assert b["positions"] == [2], b["positions"]
assert len(a["logits"]) == 5 and all(len(r) == 512 for r in a["logits"])
# position 2 of the 5-token prefill equals the last logits of the 3-token run
d = max(abs(x - y) for x, y in zip(a["logits"][2], b["logits"][0]))
assert d < 1e-4, f"prefill vs shorter run differ by {d}"
assert all(math.isfinite(x) for r in a["logits"] for x in r)
print("ok, max diff", d)
PY
# Errors are clear and exit 1, never a crash.
set +e
"$WICK" logits "$m" --tokens 1,99999 2>"$TMPD/e1"; rc=$?
[ $rc -eq 1 ] && grep -q "outside the vocabulary" "$TMPD/e1" || fail "bad id: rc=$rc $(cat $TMPD/e1)"
"$WICK" logits "$m" --tokens 1,x 2>"$TMPD/e2"; rc=$?
[ $rc -eq 2 ] || fail "bad list: rc=$rc"
"$WICK" logits "$TMPD/nope" --tokens 1 2>"$TMPD/e3"; rc=$?
[ $rc -eq 1 ] && grep -q "nope" "$TMPD/e3" || fail "missing model: rc=$rc $(cat $TMPD/e3)"
# token ids need no tokenizer: one wick cannot read does not block logits (generate refuses it)
cp -r "$m" "$TMPD/badtok" && echo '{"model": {"type": "Unigram"' >"$TMPD/badtok/tokenizer.json"
"$WICK" logits "$TMPD/badtok" --tokens 1,403,407 >"$TMPD/badtok.json" 2>"$TMPD/e4" &&
  cmp -s "$TMPD/badtok.json" "$TMPD/last.json" || fail "logits with a broken tokenizer.json: $(cat $TMPD/e4)"
"$WICK" generate "$TMPD/badtok" -p Once -n 2 2>"$TMPD/e5"; rc=$?
[ $rc -eq 1 ] && grep -q "tokenizer.json:2" "$TMPD/e5" || fail "generate, broken tokenizer: rc=$rc $(cat $TMPD/e5)"
# usage errors name the problem (they printed the usage alone), exit 2
while IFS='|' read -r args want; do
  rc=0
  # shellcheck disable=SC2086
  "$WICK" $args >/dev/null 2>"$TMPD/u.err" || rc=$?
  [ $rc = 2 ] && grep -qF -- "$want" "$TMPD/u.err" || fail "wick $args: exit $rc: $(head -2 "$TMPD/u.err")"
done <<EOF2
logits $m|--tokens IDS is required
generate $m -p x --tokens 1|give -p TEXT or --tokens IDS, not both
generate $m --tokens 1,x|bad token id list '1,x'
snapshot $m -o $TMPD/s --tp 99999999999|--tp 99999999999: at most 64 ranks
snapshot $m -o $TMPD/s --dtype f16|--dtype takes keep, fp8, bf16 or f32, not 'f16'
snapshot $m|-o SNAP (where to write) is required
convert llama2c a b|-o OUT_DIR is required
bench queue $m --jobs 0|--jobs wants a number from 1 to 1000000, not '0'
bench queue $m -n abc|-n wants a number from 1 to 100000, not 'abc'
EOF2
echo ok
