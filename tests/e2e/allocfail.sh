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
# hf_open and hf_close (config.json, the shards, the index of glm5's two) are not run on
# their own: an engine opened from a directory opens it with them, so the engine runs below
# fail each of their allocations in turn too, and check their cleanup (16 s saved)
run tokenizer "$m/tokenizer.json"
run snapshot "$TMPD/snap"
# the snapshot's tokenizer.prepared, checked against the tokenizer.json beside it: no engine
# run here reads it (the Hugging Face directory has none, engine-notok leaves it unread)
run tokenizer-prepared "$TMPD/snap/tokenizer.prepared"
run engine "$m"
# the snapshot's engine without its tokenizer: the engine run above fails each of the
# tokenizer's allocations inside an engine open already, and the tokenizer run each of its
# own (2,252 of the 3,693 runs here)
run engine-notok "$TMPD/snap"
run engine "$TMPD/glm5"
run engine "$TMPD/glm4"
run job "$TMPD/job1.json"
run job "$TMPD/job2.json"
echo ok
