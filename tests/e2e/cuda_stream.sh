# WICK_CUDA_STREAM=pt (compute on the per-thread default stream, kernels/cuda/cuda_kernels.h
# wk_cuda_set_stream) under the CUDA emulator: every launch and async memset takes
# cudaStreamPerThread (WICK_SIMT_STREAM=pt makes the emulator abort on one that does not,
# naming it), and the answers are the legacy stream's, bit for bit (stories260K's golden text;
# tiny GLM-5's logits at every position). The emulator makes every default- and
# per-thread-stream operation at once, in issue order, so this proves the wiring, not the
# ordering on a GPU: scripts/gpu-check compares the per-thread stream's logits with the CPU's
# there, and times the decode step both ways.
source tests/e2e/lib.sh
simt_wick
m=$(stories)
want="Once upon a time, there was a little girl named Lily."
got=$(WICK_CUDA_STREAM=pt WICK_SIMT_STREAM=pt "$EMU" generate "$m" -n 24 --temperature 0 --backend cuda 2>"$TMPD/g.err") ||
  fail "generate with WICK_CUDA_STREAM=pt: $(tail -n 2 "$TMPD/g.err")"
[[ $got == "$want"* ]] || fail "the per-thread stream tells another story: '$got'"
echo "stories260K golden on the per-thread stream: '${got:0:52}...'"
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/glm5" >/dev/null 2>&1 || fail "gen_glm"
ids=1,5,9,42,7,3,100,64
"$EMU" logits "$TMPD/glm5" --tokens $ids --all-positions --backend cuda >"$TMPD/legacy.json" \
  2>"$TMPD/l.err" || fail "logits on the legacy stream: $(tail -n 2 "$TMPD/l.err")"
WICK_CUDA_STREAM=pt WICK_SIMT_STREAM=pt "$EMU" logits "$TMPD/glm5" --tokens $ids --all-positions --backend cuda \
  >"$TMPD/pt.json" 2>"$TMPD/p.err" || fail "logits on the per-thread stream: $(tail -n 2 "$TMPD/p.err")"
cmp -s "$TMPD/legacy.json" "$TMPD/pt.json" || fail "tiny GLM-5's logits differ between the streams"
echo "tiny GLM-5 logits, 8 positions: the same bytes on both streams"
echo ok
