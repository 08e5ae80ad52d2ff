# The fit check before a restore into GPU memory (engine.c fit_check), on the CUDA emulator
# with a small device (WICK_SIMT_DEVICE_MB): a worker whose concurrency x max-seq of KV cache
# cannot fit beside the weights is refused before the restore reads a byte, naming what
# does fit; the same snapshot at a concurrency that fits restores and serves; and the
# emulator's device memory is finite (a cudaMalloc past it fails, named by the load).
source tests/e2e/lib.sh
simt_wick

m=$(stories)
snap=$TMPD/snap
"$WICK" snapshot "$m" -o "$snap" >/dev/null 2>&1 || fail "wick snapshot"

# stories260K: 5 layers x 512 positions x (4 KV heads x 8) x k and v, f32 = 640 KiB a
# sequence; its weights 1.0 MiB. On a 2 MiB device 8 sequences (5 MiB) cannot fit; 1 can,
# and 8 of 97 positions (97 x 1280 B x 8 <= 1 MiB left).
set +e
WICK_SIMT_DEVICE_MB=2 timeout 60 "$EMU" worker --model "$snap" --backend cuda \
  --listen 127.0.0.1:0 --concurrency 8 >"$TMPD/w8.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "a worker that cannot fit exited $rc, not 1: $(tail -n 3 "$TMPD/w8.log")"
grep -q 'startup_failed: .*LlamaForCausalLM does not fit the GPU' "$TMPD/w8.log" ||
  fail "no fit refusal: $(tail -n 3 "$TMPD/w8.log")"
grep -q 'KV caches of 8 sequences of 512 positions 5.0 MiB more (640 KiB a sequence)' \
  "$TMPD/w8.log" || fail "the refusal's sizes: $(grep startup_failed "$TMPD/w8.log")"
grep -q 'Room beside the weights: 1 sequence of 512 positions, or 8 of 97 positions' \
  "$TMPD/w8.log" || fail "the refusal's room: $(grep startup_failed "$TMPD/w8.log")"
! grep -q 'restored' "$TMPD/w8.log" || fail "the refused worker restored first"
echo "refused before the restore: $(grep -o 'does not fit.*positions (' "$TMPD/w8.log")"

# --max-seq that fits 8 sequences: the worker restores and serves (a greedy chat answer)
WICK_SIMT_DEVICE_MB=2 "$EMU" worker --model "$snap" --backend cuda --listen 127.0.0.1:0 \
  --concurrency 8 --max-seq 64 --idle-timeout 30 >"$TMPD/w64.log" 2>&1 &
pid=$!
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*/v1' "$TMPD/w64.log" | head -n 1 || true)
  grep -q 'state: STARTING -> READY' "$TMPD/w64.log" && [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the worker that fits exited: $(tail -n 3 "$TMPD/w64.log")"
  sleep 0.1
done
grep -q 'state: STARTING -> READY' "$TMPD/w64.log" || fail "not READY: $(tail -n 3 "$TMPD/w64.log")"
out=$(curl -sS --max-time 120 "$url/completions" -H 'content-type: application/json' \
  -d '{"model": "snap", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}') ||
  fail "completion request"
kill -TERM "$pid"; wait "$pid" || fail "the worker exited non-zero after SIGTERM"
[[ $out == *'"text":", there was a little girl"'* ]] ||
  fail "the answer: $out"
echo "fits at --max-seq 64: READY, served '${out:0:60}...'"

# a device smaller than the weights: the snapshot refused by the check; the Hugging Face
# directory (no manifest: no check) fails in the load's own allocation, by name
# tiny_device MODEL OUT: generate on a 1 MiB device; must fail (exit 1), stderr in OUT
tiny_device() {
  local rc
  set +e
  WICK_SIMT_DEVICE_MB=1 timeout 60 "$EMU" generate "$1" --backend cuda -n 4 -p Once >/dev/null 2>"$2"
  rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "a 1 MiB device ran a 1 MiB model from $1 (exit $rc)"
}
tiny_device "$snap" "$TMPD/g1.err"
grep -q 'does not fit the GPU' "$TMPD/g1.err" || fail "1 MiB device: $(tail -n 2 "$TMPD/g1.err")"
tiny_device "$m" "$TMPD/h1.err"
grep -q 'out of memory' "$TMPD/h1.err" || fail "1 MiB device, directory: $(tail -n 2 "$TMPD/h1.err")"
echo "1 MiB device: $(tail -n 1 "$TMPD/g1.err" | cut -c1-80)...; from the directory: $(tail -n 1 "$TMPD/h1.err")"
# GLM-5 (MLA): a bf16 cache that does not fit names what the fp8 one would hold, and the fp8
# cache then restores and runs on the same device (GLM-4.5's GQA cache below likewise)
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/g5" --max-pos 4096 --seed 3 >/dev/null || fail "gen_glm"
"$WICK" snapshot "$TMPD/g5" -o "$TMPD/g5snap" >/dev/null 2>&1 || fail "glm5 snapshot"
set +e
WICK_SIMT_DEVICE_MB=8 timeout 120 "$EMU" generate "$TMPD/g5snap" --backend cuda -n 2 \
  --tokens 1,2,3 >/dev/null 2>"$TMPD/g5b.err"
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q 'bf16 KV caches of 1 sequence of 4096 positions' "$TMPD/g5b.err" &&
  grep -q -- '--kv-dtype fp8: room for 1 sequence of 4096 positions' "$TMPD/g5b.err" ||
  fail "GLM-5 bf16 on 8 MiB (exit $rc): $(tail -n 1 "$TMPD/g5b.err")"
WICK_SIMT_DEVICE_MB=8 timeout 120 "$EMU" generate "$TMPD/g5snap" --backend cuda -n 2 \
  --tokens 1,2,3 --kv-dtype fp8 >/dev/null 2>"$TMPD/g5f.err" ||
  fail "GLM-5 fp8 on 8 MiB: $(tail -n 2 "$TMPD/g5f.err")"
echo "GLM-5 on 8 MiB: bf16 refused, offering fp8; fp8 runs"
# GLM-4.5 (GQA): the same on 10 MiB (6.5 MiB of weights, 5.0 MiB a bf16 sequence of 4096
# positions, 2.8 MiB an fp8 one); on 8 MiB, where fp8 would not hold one either, no offer
"$WICK_TOOLS/gen_glm" --family glm4 -o "$TMPD/g4" --max-pos 4096 --seed 3 >/dev/null || fail "gen_glm"
"$WICK" snapshot "$TMPD/g4" -o "$TMPD/g4snap" >/dev/null 2>&1 || fail "glm4 snapshot"
for mb in 10 8; do
  set +e
  WICK_SIMT_DEVICE_MB=$mb timeout 120 "$EMU" generate "$TMPD/g4snap" --backend cuda -n 2 \
    --tokens 1,2,3 >/dev/null 2>"$TMPD/g4b.err"
  rc=$?
  set -e
  offer=$(grep -o -- '--kv-dtype fp8: room for [0-9]* sequences* of 4096' "$TMPD/g4b.err" || true)
  want=; [ $mb = 10 ] && want='--kv-dtype fp8: room for 1 sequence of 4096'
  [ "$rc" -eq 1 ] && grep -q 'bf16 KV caches of 1 sequence of 4096 positions' "$TMPD/g4b.err" &&
    [ "$offer" = "$want" ] ||
    fail "GLM-4.5 bf16 on $mb MiB (exit $rc): $(tail -n 1 "$TMPD/g4b.err")"
done
WICK_SIMT_DEVICE_MB=10 timeout 120 "$EMU" generate "$TMPD/g4snap" --backend cuda -n 2 \
  --tokens 1,2,3 --kv-dtype fp8 >/dev/null 2>"$TMPD/g4f.err" ||
  fail "GLM-4.5 fp8 on 10 MiB: $(tail -n 2 "$TMPD/g4f.err")"
echo "GLM-4.5 on 10 MiB: bf16 refused, offering fp8; fp8 runs; on 8 MiB no offer"
echo "ok"
