# wick tokenize: the CLI contract. {"ids": [...]} for --text/--file, BOS only with --special,
# {"text": ...} for --decode (properly escaped JSON), --jsonl batches, a model directory or
# its tokenizer.json, and clear errors (exit 1; usage errors exit 2).
source tests/e2e/lib.sh
m=$(stories)
tj=$m/tokenizer.json
expect() { # expect WANT ARGS...: stdout of wick tokenize ARGS must be exactly WANT
  local want=$1; shift
  local got; got=$("$WICK" tokenize "$@") || fail "wick tokenize $* exited $?"
  [ "$got" = "$want" ] || fail "wick tokenize $*: got '$got', want '$want'"
}
expect '{"ids": [403, 407, 261, 378]}' "$m" --text "Once upon a time"
expect '{"ids": [403, 407, 261, 378]}' "$tj" --text "Once upon a time"
expect '{"ids": [1, 403, 407, 261, 378]}' "$m" --text "Once upon a time" --special
expect '{"ids": [1, 403, 407, 261, 378]}' --special "$m" --text "Once upon a time"
expect '{"ids": []}' "$m" --text ""
expect '{"ids": [1]}' "$m" --text "" --special
expect '{"text": "Once upon a time"}' "$m" --decode 1,403,407,261,378,2
expect '{"text": "<s> Once upon a time</s>"}' "$m" --decode 1,403,407,261,378,2 --special
# byte fallback: 你 is three <0xXX> tokens; a lone <0xFF> prints as U+FFFD
expect '{"ids": [410, 231, 192, 163]}' "$m" --text "你"
expect '{"text": "你"}' "$m" --decode 410,231,192,163
expect '{"text": "�"}' "$m" --decode 410,258

# --file reads bytes (any bytes), "-" is stdin
printf 'Once upon a time\n' >"$TMPD/in.txt"
expect '{"ids": [403, 407, 261, 378, 13]}' "$m" --file "$TMPD/in.txt"
got=$(printf 'Once upon a time\n' | "$WICK" tokenize "$m" --file -)
[ "$got" = '{"ids": [403, 407, 261, 378, 13]}' ] || fail "--file -: $got"
printf 'a\377b' >"$TMPD/bad.txt"
expect '{"ids": [261, 258, 430]}' "$m" --file "$TMPD/bad.txt"

# decoded text is escaped JSON
ids=$("$WICK" tokenize "$m" --text $'say "hi"\\\n\tok' | python3 -c \
  'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
"$WICK" tokenize "$m" --decode "$ids" | python3 -c '
import json, sys
t = json.load(sys.stdin)["text"]
assert t == "say \"hi\"\\\n\tok", repr(t)' || fail "decoded text is not the JSON-escaped original"

# --jsonl: one output line per non-blank input line, strings encode and id arrays decode
printf '"Once upon a time"\n\n["unused"]\n' >"$TMPD/bad.jsonl"
printf '"Once upon a time"\n\n[1, 403]\n"a\\u0000b"\n' >"$TMPD/in.jsonl"
got=$("$WICK" tokenize "$m" --jsonl "$TMPD/in.jsonl")
want=$'{"ids": [403, 407, 261, 378]}\n{"text": "Once"}\n{"ids": [261, 3, 430]}'
[ "$got" = "$want" ] || fail "--jsonl: got '$got'"
"$WICK" tokenize --help | has -- "--jsonl" || fail "--help does not document --jsonl"

# --chat: stories260K has no chat template, so the contents are concatenated (engine/chat.h)
printf '[{"role": "user", "content": "Once upon"}, {"role": "assistant", "content": " a time"}]' \
  >"$TMPD/chat.json"
expect '{"text": "Once upon a time", "ids": [403, 407, 261, 378]}' "$m" --chat "$TMPD/chat.json"
expect '{"text": "Once upon a time", "ids": [1, 403, 407, 261, 378]}' "$m" --chat "$TMPD/chat.json" \
  --special
got=$("$WICK" tokenize "$m" --chat "$TMPD/chat.json" --chat-format glm --no-think)
[ "$got" = '{"text": "[gMASK]<sop><|user|>Once upon<|assistant|></think>a time<|assistant|></think>", "ids": '"$(
  "$WICK" tokenize "$m" --text "[gMASK]<sop><|user|>Once upon<|assistant|></think>a time<|assistant|></think>" |
  sed 's/^{"ids": //')" ] || fail "--chat-format glm: $got"
printf '[{"role": "robot", "content": "x"}]' >"$TMPD/badchat.json"

# errors
set +e
err() { # err RC PATTERN ARGS...: wick tokenize ARGS exits RC with PATTERN on stderr
  local rc=$1 pat=$2; shift 2
  "$WICK" tokenize "$@" >"$TMPD/out" 2>"$TMPD/err"
  local got=$?
  [ $got -eq "$rc" ] || fail "wick tokenize $*: exit $got, want $rc ($(cat "$TMPD/err"))"
  grep -q -- "$pat" "$TMPD/err" || fail "wick tokenize $*: stderr lacks '$pat': $(cat "$TMPD/err")"
  [ ! -s "$TMPD/out" ] || [ "$rc" -eq 1 ] || fail "wick tokenize $*: printed to stdout"
}
err 1 "nope" "$TMPD/nope" --text hi
err 1 "tokenizer.json" "$TMPD" --text hi
echo '{"model": {"type": "BPE", "vocab": {' >"$TMPD/broken.json"
err 1 "broken.json" "$TMPD/broken.json" --text hi
echo '{"model": {"type": "Unigram", "vocab": []}}' >"$TMPD/unigram.json"
err 1 "Unigram" "$TMPD/unigram.json" --text hi
err 1 "512" "$m" --decode 1,512
err 2 "token id list" "$m" --decode 1,x
err 2 "exactly one" "$m"
err 2 "exactly one" "$m" --text a --decode 1
err 2 "MODEL" --text hi
err 2 "usage" "$m" --text hi --bogus
err 1 "in.txt.missing" "$m" --file "$TMPD/in.txt.missing"
err 1 "bad.jsonl:3" "$m" --jsonl "$TMPD/bad.jsonl"
err 1 "robot" "$m" --chat "$TMPD/badchat.json"
err 1 "chatml" "$m" --chat "$TMPD/chat.json" --chat-format chatml
err 2 "exactly one" "$m" --chat "$TMPD/chat.json" --text a
echo ok
