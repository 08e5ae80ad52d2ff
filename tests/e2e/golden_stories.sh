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
echo ok
