# Allocation-failure injection (tests/tools/allocfail.c): the loaders and the job decoder run
# with their Nth allocation failing, for every N along the run; each run must end in success
# or a clean error, with no crash and no leak.
source tests/e2e/lib.sh
m=$(stories)
af=$WICK_TOOLS/allocfail
out=$("$af" job /dev/null 2>&1 || true)
case $out in SKIP:*) echo "$out"; exit 0 ;; esac
"$WICK" snapshot "$m" -o "$TMPD/snap" >/dev/null
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/glm5" --shards 2 --layers 2 >/dev/null
"$WICK_TOOLS/gen_glm" --family glm4 -o "$TMPD/glm4" --layers 2 >/dev/null
printf '{"id": "file-stem", "tenant": "t", "input": {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi \\u00e9"}], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 3, "stop": ["a", "b"], "timeout_s": 30}}' >"$TMPD/job1.json"
printf '{"input": {"prompt": "Once upon a time", "max_tokens": 5}}' >"$TMPD/job2.json"
run() {
  "$af" "$@" || fail "allocfail $*"
}
run safetensors "$m/model.safetensors"
run hf "$m"
run hf "$TMPD/glm5"
run tokenizer "$m/tokenizer.json"
run snapshot "$TMPD/snap"
run engine "$m"
run engine "$TMPD/snap"
run engine "$TMPD/glm5"
run engine "$TMPD/glm4"
run job "$TMPD/job1.json"
run job "$TMPD/job2.json"
echo ok
