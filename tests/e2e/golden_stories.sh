# Golden end-to-end test: stories260K, converted from llama2.c to a Hugging Face directory,
# generates the known story greedily from BOS. A wrong q/k permutation, RoPE convention,
# attention, norm or tokenizer decode changes the text.
source tests/e2e/lib.sh
m=$(stories)
want="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
got=$("$WICK" generate "$m" -n 100 --temperature 0 --backend cpu 2>/dev/null)
echo "$got"
[[ $got == "$want"* ]] || fail "generated text differs from the golden story"

# The same text with one thread (the fast kernels split rows over threads).
got1=$("$WICK" generate "$m" -n 100 --temperature 0 --threads 1 2>/dev/null)
[ "$got1" = "$got" ] || fail "one thread and all threads generate different text"

# A prompt is printed, then continued.
got=$("$WICK" generate "$m" -p "Once upon a time" -n 20 --temperature 0 2>/dev/null)
[[ $got == "Once upon a time, there was a little girl"* ]] || fail "prompted text: '$got'"

# Sampling is deterministic for a seed, and differs across seeds.
a=$("$WICK" generate "$m" -n 60 --temperature 1 --seed 7 2>/dev/null)
b=$("$WICK" generate "$m" -n 60 --temperature 1 --seed 7 2>/dev/null)
c=$("$WICK" generate "$m" -n 60 --temperature 1 --seed 8 2>/dev/null)
[ "$a" = "$b" ] || fail "same seed, different text"
[ "$a" != "$c" ] || fail "different seeds, same text"
k=$("$WICK" generate "$m" -n 60 --temperature 1 --top-k 1 --seed 9 2>/dev/null)
g=$("$WICK" generate "$m" -n 60 --temperature 0 2>/dev/null)
[ "$k" = "$g" ] || fail "top-k 1 should equal greedy"

# A story ends where the model begins the next one (BOS), in wick generate and in the worker
# alike: "Once upon a time" runs greedily to a BOS before 600 tokens. The worker once ran on
# into the next story to the token limit (finish_reason "length"), billed for all of it.
gen=$("$WICK" generate "$m" -p "Once upon a time" -n 600 --temperature 0 2>&1 >/dev/null |
  sed -n 's/.* prompt + \([0-9]*\) generated tokens.*/\1/p')
[ -n "$gen" ] && [ "$gen" -lt 600 ] || fail "generate did not stop before 600 tokens ('$gen')"
"$WICK" submit --queue "spool:$TMPD/q" --id bos -p "Once upon a time" -n 600 \
  --temperature 0 >/dev/null || fail "submit"
"$WICK" worker --model "$m" --queue "spool:$TMPD/q" --idle-timeout 0.5 2>/dev/null ||
  fail "worker"
python3 - "$TMPD/q/done/bos.json" "$gen" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
n, fin = r["usage"]["completion_tokens"], r["output"]["finish_reason"]
assert (n, fin) == (int(sys.argv[2]), "stop"), f"worker: {n} tokens, {fin}; generate: {sys.argv[2]}"
print(f"generate and the worker both stop at the BOS after {n} tokens")
PY

# Bad sampling settings are refused (NaN passed the old `< 0` tests and printed raw bytes),
# and so is a prompt the context cannot hold (it used to exit 0 having generated nothing).
for bad in "--temperature nan" "--top-p nan" "--top-k -5" "--temperature inf"; do
  # shellcheck disable=SC2086
  rc=0
  "$WICK" generate "$m" -p "Once" -n 5 $bad >/dev/null 2>"$TMPD/bad.err" || rc=$?
  [ $rc = 2 ] && grep -q "need 0 < top-p" "$TMPD/bad.err" || fail "$bad: exit $rc"
done
long=$(python3 -c "print('Once upon a time there was a dog. ' * 200)")
rc=0
"$WICK" generate "$m" -p "$long" -n 10 >/dev/null 2>"$TMPD/long.err" || rc=$?
[ $rc = 1 ] && grep -q "the context holds 512" "$TMPD/long.err" || fail "a prompt past the context: exit $rc"

# --chat (the CLI contract): the prompt as one user message in the model's chat format, as
# the worker renders a job's messages. stories260K's format is plain (engine/chat.h), so the
# text is the worker's for the same message.
got=$("$WICK" generate "$m" --chat -p "Once upon a time" -n 20 --temperature 0 2>/dev/null) ||
  fail "generate --chat"
echo '{"id": "chat", "input": {"messages": [{"role": "user", "content": "Once upon a time"}],
  "max_tokens": 20, "temperature": 0}}' | "$WICK" submit --queue "spool:$TMPD/q" --stdin \
  >/dev/null || fail "submit messages"
"$WICK" worker --model "$m" --queue "spool:$TMPD/q" --idle-timeout 0.5 2>/dev/null || fail "worker"
text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["output"]["text"])' \
  "$TMPD/q/done/chat.json")
[ "$got" = "Once upon a time$text" ] || fail "generate --chat: '$got'; the worker: '$text'"

# wick convert writes a new directory whole or not at all: a truncated tokenizer leaves
# nothing behind (it left config.json and model.safetensors, which ran), and a directory
# that holds files is refused (a conversion into a snapshot wrote over its files).
head -c 3000 "$STORIES_SRC/tok512.bin" >"$TMPD/trunc.bin"
rc=0
"$WICK" convert llama2c "$STORIES_SRC/stories260K.bin" "$TMPD/trunc.bin" -o "$TMPD/cv" 2>/dev/null || rc=$?
[ $rc = 1 ] && [ ! -e "$TMPD/cv" ] && [ -z "$(ls -d "$TMPD"/cv.tmp-* 2>/dev/null)" ] ||
  fail "a failed convert left: $(ls "$TMPD")"
mkdir "$TMPD/full" && touch "$TMPD/full/keep"
rc=0
"$WICK" convert llama2c "$STORIES_SRC/stories260K.bin" "$STORIES_SRC/tok512.bin" -o "$TMPD/full" \
  2>"$TMPD/full.err" || rc=$?
[ $rc = 1 ] && grep -q "exists and is not empty" "$TMPD/full.err" && [ "$(ls "$TMPD/full")" = keep ] ||
  fail "convert into a directory with files: exit $rc"
mkdir "$TMPD/empty"
"$WICK" convert llama2c "$STORIES_SRC/stories260K.bin" "$STORIES_SRC/tok512.bin" -o "$TMPD/empty" \
  2>/dev/null && [ -f "$TMPD/empty/tokenizer.json" ] || fail "convert into an empty directory"
# Typos in worker flags are usage errors (exit 2, nothing started, no bill), not start-up
# failures billed a second
for bad in "--backend gpu" "--usage-url http://127.0.0.1:9" "--queue redis://127.0.0.1:9/s?maxdeliveries=3"; do
  rc=0
  # shellcheck disable=SC2086
  "$WICK" worker --model "$m" --queue "spool:$TMPD/q" $bad >/dev/null 2>"$TMPD/bad.err" || rc=$?
  [ $rc = 2 ] && ! grep -q 'bill:' "$TMPD/bad.err" &&
    grep -q -e "--backend wants auto, cpu, cuda or null, not 'gpu'" -e "--usage-url needs --ledger" \
      -e "--queue: .*unknown parameter 'maxdeliveries'" "$TMPD/bad.err" ||
    fail "worker $bad: exit $rc: $(head -3 "$TMPD/bad.err")"
done
echo ok
