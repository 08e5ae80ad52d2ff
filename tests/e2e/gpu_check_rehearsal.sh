# scripts/gpu-check, the one script for the scarce GPU minutes, checked here so that it works
# the first time on a GPU (issue 9):
#   1. with no GPU it builds, prints NO GPU and exits 0;
#   2. rehearsed (WICK_GPU_CHECK_REHEARSE=2: every check on two emulated GPUs, tests/simt),
#      it runs every check a GPU would (the NCCL tools and the kernel lab skipped) and passes:
#      its commands, paths, parsing and gates, the sharded and multi-GPU branches included.
#      A broken command or gate in the script fails this test before it wastes a GPU run.
# The kernel tests themselves run in make test's cuda-simt stage; here only one, to rehearse
# the step.
source tests/e2e/lib.sh
case ${MODE:-release} in asan) echo "SKIP: the emulator is built in release mode only"; exit 0 ;; esac
[ "$WICK_BUILD" = build ] || { echo "SKIP: gpu-check builds in build/"; exit 0; }
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] \
  || { echo "SKIP: no nvcc: gpu-check builds with CUDA"; exit 0; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: a GPU is present: run scripts/gpu-check itself"
  exit 0
fi

scripts/gpu-check >"$TMPD/nogpu.txt" 2>&1 || { cat "$TMPD/nogpu.txt"; fail "gpu-check without a GPU exited non-zero"; }
[ "$(tail -n 1 "$TMPD/nogpu.txt")" = "NO GPU" ] || { cat "$TMPD/nogpu.txt"; fail "gpu-check did not end with NO GPU"; }
echo "   no GPU: $(tr '\n' ' ' <"$TMPD/nogpu.txt")"

set +e
WICK_GPU_CHECK_REHEARSE=2 WICK_GPU_CHECK_KERNELS='cuda_kernels/argmax*' scripts/gpu-check \
  >"$TMPD/rehearsal.txt" 2>&1
rc=$?
set -e
out=$TMPD/rehearsal.txt
grep -q "REHEARSAL on 2 emulated GPU(s)" "$out" || { cat "$out"; fail "no rehearsal note"; }
table=$(sed -n '/^== gpu-check (/,$p' "$out")
[ -n "$table" ] || { cat "$out"; fail "no results table"; }
if echo "$table" | grep -E '^[A-Za-z0-9].* FAIL '; then
  cat build/gpu-check.log | tail -n 40
  fail "the rehearsal failed a check (above)"
fi
[ $rc -eq 0 ] || { cat "$out"; fail "the rehearsal exited $rc"; }
for check in "chained launches (k_chain)" "cuda kernel tests" "stories260K golden on cuda" "stories260K snapshot on cuda" \
  "tiny glm5 logits gpu vs cpu" "tiny glm4 logits gpu vs cpu" "tiny glm5 tp2 x ep2 on 2 GPUs" \
  "GLM-5 structure decode on cuda" "fp8 activations gpu vs cpu" \
  "f32-activation prefill GEMM gpu vs cpu" "restore into GPU memory" \
  "restore into 2 GPUs (tp 2)" "tiny glm5, v2 GEMVs, gpu vs cpu" "tiny glm4, v2 GEMVs, gpu vs cpu" \
  "tiny glm5, v3 GEMVs, gpu vs cpu" "tiny glm4, v3 GEMVs, gpu vs cpu" \
  "tiny glm5, per-thread stream, gpu vs cpu" "TMA-store GEMM vs plain, in GLM-5" \
  "bf16 KV cache gpu vs cpu" "bf16 KV cache decode on gpu" "fp8 KV cache gpu vs cpu" \
  "fp8 KV cache decode on gpu" "fp8 KV cache glm4 gpu vs cpu" "fp8 KV cache stories gpu vs cpu" \
  "fp8 KV cache decode glm4, stories" "batched glm5 decode on gpu" \
  "batched stories decode on gpu" "prefix cache stories on gpu"; do
  echo "$table" | has "^$check  *PASS" || { echo "$table"; fail "'$check' did not pass"; }
done
echo "$table" | has "^GLM-5 decode step (wick bench launches, --backend cuda): launches [0-9]" \
  || { echo "$table"; fail "no launch count in the table"; }
echo "$table" | has "^plain read (1 MiB buffered, rank files) [0-9.]* [0-9.]*$" \
  || { echo "$table"; fail "no storage baseline beside the restore into GPU memory"; }
echo "$table" | has "^pinned copies (a buffer a device, no disk)" \
  || { echo "$table"; fail "no multi-GPU restore figures in the table"; }
echo "$table" | grep -E '^[a-zA-Z0-9].* (PASS|SKIP)  ' | sed 's/^/   /'
echo ok
