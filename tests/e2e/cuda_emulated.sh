# The CUDA backend end to end, on the CPU: scripts/gpu-check's end-to-end checks run against
# $WICK_SIMT_WICK, the whole wick with kernels/cuda/*.cu and backend_cuda.cu rewritten for the
# CUDA emulator in tests/simt (make test builds it in release mode: build/simt/wick), so that
# a wiring bug in backend_cuda.cu (an op's arguments, a copy's direction, the restore's
# staging, the sticky error) shows here before the first GPU run. tests/simt/simt.h says what
# the emulation does not prove; the GPU (scripts/gpu-check) is still the judge.
#   1. stories260K's golden text with --backend cuda at temperature 0, from a Hugging Face
#      directory and from an lz4 snapshot streamed into (emulated) device memory: the CPU's text;
#      its decode steps' op times on the device's clock (wick bench launches --op-times);
#   2. tiny GLM-5 (FP8) and GLM-4.5 logits at every position, cuda against cpu, relative 1e-3
#      as gpu-check, from the directory and from an lz4 snapshot; GLM-5's sparse prefill with MLA
#      absorbed (as a GPU runs it, and decode steps) and expanded (forced), against the CPU's
#      expanded one; 12 greedy decode steps of each (chained launches, the MoE op among them):
#      the CPU's ids;
#   2b. GLM-5 on fp8 KV caches against the CPU on its own (kv_gate.py's fp8 bounds), greedy
#      decode the CPU's ids; GLM-4.5 (also cast to FP8 weights) and stories260K on fp8 caches
#      (GQA, k_attention's FP8 rows) by bounds of their own, greedy decode the CPU's ids;
#   3. GLM-5 with FP8 activations (--fp8-act) on both sides, relative 1e-3 (see there); then
#      GLM-4.5 (cast to FP8) over a 70-token prefill with f32 activations, whose FP8 matmuls
#      run as bf16-split GEMMs (matmul_fp8w): relative 1e-3 (the FP8-activation GEMMs and
#      GLM-5's 150-token prefill with its grouped MoE GEMMs: gpu-check's checks, rehearsed on
#      the emulator by gpu_check_rehearsal.sh);
#   3b. no device allocation in a decode step (WICK_SIMT_ALLOCS); the emulator's launch profile
#      (WICK_SIMT_PROFILE, tests/simt/profile.py) of generate's decode steps: bench launches' count;
#   4. the restore's staging buffers reused: a 54 MB snapshot through one reader thread, the
#      device's bytes against a host restore (wick bench restore);
#   5. a device fault (the emulator's WICK_SIMT_FAULT_LAUNCH): wick logits fails with the CUDA
#      error, and a worker hands its job back and exits 3; a healthy one then completes it;
#   6. seeded non-greedy jobs (top_p, top_k, temperature alone, top_k 1) on a cuda worker, the
#      token chosen from the candidates the device selects: the CPU worker's token ids; jobs
#      with logprobs and the logit processing (the rows' logits copied from the device, the
#      pick on the host): the CPU's ids and logprobs;
#   7. sharded snapshots on emulated devices (WICK_SIMT_DEVICES; the collectives are comm_cpu's
#      under NCCL's name, tests/simt/comm_simt.c): one process, a thread per rank, rank r on
#      device r, each rank file streamed into its device's memory: GLM-5 tp 2 x ep 4 (4 ranks)
#      and GLM-4.5 tp 2 logits against the CPU's unsharded ones (1e-3), stories260K tp 2's
#      golden text through generate and through a worker; too few devices is refused by name;
#      wick bench restore of the 4-rank snapshot into 4 devices, every device's bytes checked;
#   8. speculative decoding (--speculate 4) on a cuda worker, a greedy job and seeded sampled
#      ones: the CPU worker's tokens and drafts kept.
#   9. the prefix cache on the cuda backend (wick bench prefix): a conversation's turns reuse
#      the device's KV cache (GLM-5 on an fp8 cache, stories260K) and give the replies the
#      same turns give without it; three choices of one prompt copy the first one's prefill
#      on the device (eng_seq_copy) and sample what three prefills sample; the prompt's cache
#      saved from the device to a file and loaded into a reopened engine's device memory
#      (eng_seq_save, eng_seq_load) runs its last token only and gives the same reply.
source tests/e2e/lib.sh
case ${MODE:-release} in asan) echo "SKIP: the emulator is built in release mode only"; exit 0 ;; esac
: "${WICK_SIMT_WICK:=$WICK_BUILD/simt/wick}"
[ -x "$WICK_SIMT_WICK" ] || fail "$WICK_SIMT_WICK is missing (make build/simt/wick)"
EMU=$WICK_SIMT_WICK
t0=$EPOCHREALTIME
section() { echo "== $* (at $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s)"; }

# close LABEL CPU.json CUDA.json: max over positions of max|cuda - cpu| / max|cpu| <= 1e-3
close() {
  python3 - "$@" <<'PY' || fail "$1: the emulated CUDA backend's logits differ from the CPU's"
import json, sys
label, a, b = sys.argv[1], *(json.load(open(p)) for p in sys.argv[2:4])
assert a["vocab"] == b["vocab"] and a["positions"] == b["positions"], "shapes differ"
worst = 0.0
for ra, rb in zip(a["logits"], b["logits"]):
    worst = max(worst, max(abs(x - y) for x, y in zip(ra, rb)) / (max(abs(x) for x in ra) or 1.0))
print(f"   {label}: {len(a['logits'])} positions x {a['vocab']}, max |cuda - cpu| / max|cpu| = {worst:.2e}")
sys.exit(0 if worst <= 1e-3 else 1)
PY
}

# The tight comparisons (1e-3) below run both backends on f32 KV caches (--kv-dtype f32): the
# tiny GLM models are bfloat16 checkpoints, so both would default to bf16 caches, where a
# 1e-7 difference between the two backends' sums can round a cached element to the other
# bf16 and move a logit past 1e-3. The bf16 caches have their own section, a gross-error
# gate (see there). stories260K is an f32 checkpoint: auto keeps its cache f32.
KV32="--kv-dtype f32"

section "stories260K's golden text on cuda"
m=$(stories)
want="Once upon a time, there was a little girl named Lily."
cpu=$("$WICK" generate "$m" -n 24 --temperature 0 --backend cpu 2>/dev/null)
[[ $cpu == "$want"* ]] || fail "the CPU's text is not the golden one: '$cpu'"
got=$("$EMU" generate "$m" -n 24 --temperature 0 --backend cuda 2>"$TMPD/gen.err") \
  || fail "generate --backend cuda: $(tail -n 3 "$TMPD/gen.err")"
grep -q '(cuda backend)' "$TMPD/gen.err" || fail "not run on the cuda backend: $(cat "$TMPD/gen.err")"
[ "$got" = "$cpu" ] || fail "cuda tells another story: '$got'"
echo "   $got"
"$WICK" snapshot "$m" -o "$TMPD/stories-snap" --compress lz4 >/dev/null 2>&1 || fail "snapshot stories260K"
got=$("$EMU" generate "$TMPD/stories-snap" -n 24 --temperature 0 --backend cuda 2>"$TMPD/gen.err") \
  || fail "generate from the snapshot: $(tail -n 3 "$TMPD/gen.err")"
grep -q 'restored .* into device memory' "$TMPD/gen.err" \
  || fail "the snapshot was not restored into device memory: $(cat "$TMPD/gen.err")"
[ "$got" = "$cpu" ] || fail "cuda from a snapshot tells another story: '$got'"
echo "   from an lz4 snapshot, $(grep -o 'restored .* into device memory' "$TMPD/gen.err"): the same text"
# --backend auto (the default): cuda where a device is visible, cpu where none is
got=$("$EMU" generate "$m" -n 24 --temperature 0 2>"$TMPD/gen.err") \
  || fail "generate with the default backend: $(tail -n 3 "$TMPD/gen.err")"
grep -q '(cuda backend)' "$TMPD/gen.err" || fail "auto did not take the visible device: $(cat "$TMPD/gen.err")"
[ "$got" = "$cpu" ] || fail "auto on cuda tells another story: '$got'"
"$WICK" generate "$m" -n 4 --temperature 0 >/dev/null 2>"$TMPD/gen.err" || fail "generate on auto: $(tail -n 3 "$TMPD/gen.err")"
if ! grep -q '(cpu backend)' "$TMPD/gen.err"; then
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
    fail "auto took another backend than cpu with no GPU: $(cat "$TMPD/gen.err")"
fi
echo "   --backend auto: cuda on the emulated device, cpu in the build without one visible"
# where a step's time goes on the device (wick bench launches --op-times, engine/count.c's
# op clock on the backend's events): every op timed between two of them, the device's time
# between ops apart, the kinds and the between adding up to the sum, inside the step's time
out=$("$EMU" bench launches "$m" --context 4 --steps 2 --op-times --backend cuda 2>"$TMPD/ot.err") \
  || fail "bench launches --op-times: $(tail -n 3 "$TMPD/ot.err")"
python3 - "$(echo "$out" | tail -n 1)" <<'PY' || fail "op times on cuda: $out"
import json, sys
t = json.loads(sys.argv[1])["op_times"]
b = t["by_kind"]
assert t["clock"] == "device", t
for n in ("matmul", "attention", "add_rmsnorm", "rmsnorm", "silu_mul", "to_device", "to_host"):
    assert b[n]["ops"] > 0 and b[n]["ms"] >= 0 and b[n]["host_ms"] > 0, (n, b)
assert b["matmul"]["ms"] > 0 and "chain" not in b, b
s = sum(v["ms"] for v in b.values()) + t["between_ops_ms"]
assert abs(s - t["sum_ms"]) <= 1e-4 * s, (s, t)
assert 0.5 * t["step_ms"] <= t["sum_ms"] <= 1.05 * t["step_ms"] + 1.0, t
print(f"   op times on the device's clock: {t['sum_ms']:.1f} of a {t['step_ms']:.1f} ms step")
c = json.loads(sys.argv[1])["op_times_chained"]
cb = c["by_kind"]
assert c["clock"] == "device" and cb["chain"]["ops"] > 0 and cb["chain"]["ms"] > 0, c
s = sum(v["ms"] for v in cb.values()) + c["between_ops_ms"]
assert abs(s - c["sum_ms"]) <= 1e-4 * s and c["sum_ms"] <= 1.05 * c["step_ms"] + 1.0, c
print(f"   chained: {cb['chain']['ops']:.0f} chains a step, {cb['chain']['ms']:.1f} ms of it")
PY

section "tiny GLM-5 and GLM-4.5 logits, cuda against cpu"
"$WICK_TOOLS/gen_glm" --family glm5 -o "$TMPD/glm5" --seed 7 >/dev/null || fail "gen_glm glm5"
"$WICK_TOOLS/gen_glm" --family glm4 -o "$TMPD/glm4" --seed 8 >/dev/null || fail "gen_glm glm4"
ids=1,5,9,42,7,3,100,64
for fam in glm5 glm4; do
  "$WICK" snapshot "$TMPD/$fam" -o "$TMPD/$fam-snap" --compress lz4 >/dev/null 2>&1 || fail "snapshot $fam"
  "$WICK" logits "$TMPD/$fam" --tokens $ids --all-positions --backend cpu $KV32 >"$TMPD/$fam.cpu.json" \
    2>/dev/null || fail "$fam: cpu logits"
  for src in "$fam" "$fam-snap"; do
    "$EMU" logits "$TMPD/$src" --tokens $ids --all-positions --backend cuda $KV32 \
      >"$TMPD/$src.cuda.json" 2>"$TMPD/err" || fail "$src: cuda logits: $(tail -n 3 "$TMPD/err")"
    if [ "$src" != "$fam" ]; then
      grep -q 'into device memory' "$TMPD/err" || fail "$src: not restored into device memory"
    fi
    close "$src" "$TMPD/$fam.cpu.json" "$TMPD/$src.cuda.json"
  done
done
# on a GPU a sparse prefill absorbs kv_b_proj, as decode steps do (engine/glm5.c's expand;
# the CPU expands it where that is fewer multiply-adds): the expanded form, forced
WICK_GLM_MLA=expand "$EMU" logits "$TMPD/glm5" --tokens $ids --all-positions --backend cuda $KV32 \
  >"$TMPD/expand.cuda.json" 2>"$TMPD/err" || fail "glm5 expanded: $(tail -n 3 "$TMPD/err")"
close "glm5, MLA expanded (forced)" "$TMPD/glm5.cpu.json" "$TMPD/expand.cuda.json"
# decode steps of one token, each layer's ops in two chained launches (the MoE op among them):
# greedy, the CPU's ids
for fam in glm5 glm4; do
  want=$("$WICK" generate "$TMPD/$fam" --tokens $ids -n 12 --temperature 0 --backend cpu $KV32 2>/dev/null)
  got=$("$EMU" generate "$TMPD/$fam" --tokens $ids -n 12 --temperature 0 --backend cuda $KV32 \
    2>"$TMPD/err") || fail "$fam: cuda decode: $(tail -n 3 "$TMPD/err")"
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "$fam: cuda decoded '$got', cpu '$want'"
  echo "   $fam: 12 greedy decode steps on cuda, the CPU's ids: ${got##*$'\n'}"
done

# the MTP layer's drafts (speculative decoding's drafter): 4 greedy steps, 3 drafts each (two
# chained), its logits on cuda within 1e-3 of the CPU's and the same draft ids
section "the MTP layer's drafts, cuda against cpu"
for fam in glm5 glm4; do
  "$WICK_TOOLS/gen_glm" --family $fam --mtp -o "$TMPD/$fam-mtp" --seed 7 >/dev/null ||
    fail "gen_glm $fam --mtp"
  "$WICK" logits "$TMPD/$fam-mtp" --tokens $ids --mtp 4 --drafts 3 --backend cpu $KV32 \
    >"$TMPD/$fam-mtp.cpu.json" 2>"$TMPD/err" || fail "$fam: cpu MTP: $(tail -n 3 "$TMPD/err")"
  "$EMU" logits "$TMPD/$fam-mtp" --tokens $ids --mtp 4 --drafts 3 --backend cuda $KV32 \
    >"$TMPD/$fam-mtp.cuda.json" 2>"$TMPD/err" || fail "$fam: cuda MTP: $(tail -n 3 "$TMPD/err")"
  python3 - "$fam" "$TMPD/$fam-mtp.cpu.json" "$TMPD/$fam-mtp.cuda.json" <<'PY' ||
import json, sys
fam, a, b = sys.argv[1], *(json.load(open(p)) for p in sys.argv[2:4])
assert a["tokens"] == b["tokens"] and a["drafts"] == b["drafts"], (a["drafts"], b["drafts"])
worst = 0.0
for x, y in zip([a["logits"]] + a["chain"], [b["logits"]] + b["chain"]):
    for r, s in zip(x, y):
        m = max(abs(v) for v in r)
        worst = max(worst, max(abs(u - v) for u, v in zip(r, s)) / m)
assert worst <= 1e-3, worst
print(f"   {fam}: {len(a['drafts'])} steps of 3 MTP drafts on cuda, the CPU's ids; "
      f"max|d|/max|cpu| {worst:.2g}")
PY
    fail "$fam: the MTP drafts on cuda differ from the CPU's"
done

# bf16 KV caches (auto: what a bfloat16 checkpoint gets), cuda against cpu on bf16 caches of
# their own: each backend rounds its f32 rows into the cache (cast_n, in a decode step as a
# link of the chained launch), and where the two backends' sums part by an ulp a cached
# element can round to the other bf16, so the logits are held to a looser gate than 1e-3, each
# prompt on its own: mean cosine >= 0.9999, top-1 agreement >= 0.9 and every logit within
# 2e-2 of the largest, over the positions of the 8-token prefills (from the directory and a
# snapshot; GLM-5's indexer selecting 4, its MLA absorbed and expanded) and 2 x 40-token ones
# (measured here: 1 - cosine <= 4e-9, <= 1.7e-4; a cast that truncates instead of rounding
# moves one prompt by 0.24); then 12 greedy decode steps on cuda, each chosen id within 1e-2
# of max|logit| of the best in the CPU's logits over the same ids (a prefill), also on a
# GLM-5 whose kv_a splits (kv_lora 128: its c_kv and k_pe rows, with the indexer keys, go
# into the caches as a cast link of the step's first chained launch; the tiny default's do
# not, and its new positions' indexer keys rarely win a selection of 4, so a link that
# wrote nothing goes unseen there).
section "tiny GLM-5 and GLM-4.5 on bf16 KV caches, cuda against cpu"
long=$(python3 -c "import random; random.seed(9); print(','.join(str(random.randrange(300)) for _ in range(40)))")
pairs=()
for fam in glm5 glm4; do
  for p in "s:$ids" "l:$long"; do
    "$WICK" logits "$TMPD/$fam" --tokens "${p#*:}" --all-positions --backend cpu --verbose \
      >"$TMPD/b-$fam-${p%%:*}.cpu.json" 2>"$TMPD/err" || fail "$fam bf16: cpu logits"
    grep -q '"kv_dtype": "bf16"' "$TMPD/err" || fail "$fam: auto did not take a bf16 cache: $(cat "$TMPD/err")"
    runs=("$fam" "$fam-snap")
    [ "${p%%:*}" = l ] && runs=("$fam")
    [ "$fam" = glm5 ] && [ "${p%%:*}" = s ] && runs+=(expand)
    for src in "${runs[@]}"; do
      out="$TMPD/b-$src-${p%%:*}.cuda.json"
      if [ "$src" = expand ]; then
        WICK_GLM_MLA=expand "$EMU" logits "$TMPD/glm5" --tokens "${p#*:}" --all-positions \
          --backend cuda --verbose >"$out" 2>"$TMPD/err" || fail "glm5 bf16 expanded: $(tail -n 3 "$TMPD/err")"
      else
        "$EMU" logits "$TMPD/$src" --tokens "${p#*:}" --all-positions --backend cuda --verbose \
          >"$out" 2>"$TMPD/err" || fail "$src bf16: cuda logits: $(tail -n 3 "$TMPD/err")"
      fi
      grep -q '"kv_dtype": "bf16"' "$TMPD/err" || fail "$src: not on a bf16 cache on cuda: $(cat "$TMPD/err")"
      pairs+=("$TMPD/b-$fam-${p%%:*}.cpu.json" "$out")
    done
  done
done
python3 tests/tools/kv_gate.py --indent "   " "${pairs[@]}" ||
  fail "bf16 KV caches: the emulated CUDA backend fails the gate (tests/tools/kv_gate.py)"
"$WICK_TOOLS/gen_glm" --family glm5 --hidden 256 --intermediate 384 --moe-intermediate 128 \
  --q-lora-rank 128 --kv-lora-rank 128 -o "$TMPD/glm5-split" --seed 7 >/dev/null || fail "gen_glm glm5-split"
for fam in glm5 glm4 glm5-split; do
  got=$("$EMU" generate "$TMPD/$fam" --tokens $ids -n 12 --temperature 0 --backend cuda \
    --kv-dtype bf16 2>"$TMPD/err") || fail "$fam bf16: cuda decode: $(tail -n 3 "$TMPD/err")"
  got=${got##*$'\n'}
  all="$ids${got:+,$(echo $got | tr ' ' ',')}"
  "$WICK" logits "$TMPD/$fam" --tokens "$all" --all-positions --backend cpu --kv-dtype bf16 >"$TMPD/bd.json" \
    2>/dev/null || fail "$fam bf16: cpu logits of the decoded ids"
  python3 - "$TMPD/bd.json" "$all" 8 "$fam" <<'PY' || fail "$fam bf16: cuda decoded '$got', not the CPU's best"
import json, sys
lg = json.load(open(sys.argv[1]))["logits"]
ids, p = [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
worst = 0.0
for j in range(p, len(ids)):
    row = lg[j - 1]
    worst = max(worst, (max(row) - row[ids[j]]) / max(abs(x) for x in row))
print(f"   {sys.argv[4]}: {len(ids) - p} greedy decode steps on cuda, each id within {worst:.1e} of the CPU's best")
sys.exit(0 if len(ids) > p and worst <= 1e-2 else 1)  # at most 12: a stop id ends it
PY
done

# fp8 KV caches (--kv-dtype fp8; GLM-5's: the MLA latent and the indexer keys as e4m3
# codes with a scale per 128 of a row, k_pe in bf16), cuda against cpu on caches of their own:
# both quantize bit for bit alike (cast_n; in a decode step a link of the chained launch), but
# where their sums part by an ulp at an e4m3 rounding boundary an element takes the next code,
# and that can change a DSA selection, so tests/tools/kv_gate.py's fp8 bounds (see there:
# measured here over 54 prompts, the two models' most within 2e-5 of the largest logit; a
# cast that truncates moves each by 1 - cosine >= 0.055): GLM-5's 8-token prefill from the
# directory, a snapshot and expanded, its 40-token one, and the kv_a split's two (its rows
# go into the caches as a cast link); then 12 greedy decode steps of each on cuda: the CPU's
# ids (measured: equal from 3 prompts on each model).
section "tiny GLM-5 on fp8 KV caches, cuda against cpu"
pairs=()
for fam in glm5 glm5-split; do
  for p in "s:$ids" "l:$long"; do
    "$WICK" logits "$TMPD/$fam" --tokens "${p#*:}" --all-positions --backend cpu --kv-dtype fp8 \
      >"$TMPD/f-$fam-${p%%:*}.cpu.json" 2>/dev/null || fail "$fam fp8: cpu logits"
    runs=("$fam")
    [ "$fam" = glm5 ] && [ "${p%%:*}" = s ] && runs+=(glm5-snap expand)
    for src in "${runs[@]}"; do
      out="$TMPD/f-$src-${p%%:*}.cuda.json"
      mla=; [ "$src" = expand ] && mla=expand
      dir=$src; [ "$src" = expand ] && dir=glm5
      WICK_GLM_MLA=$mla "$EMU" logits "$TMPD/$dir" --tokens "${p#*:}" --all-positions \
        --backend cuda --kv-dtype fp8 --verbose >"$out" 2>"$TMPD/err" ||
        fail "$src fp8: cuda logits: $(tail -n 3 "$TMPD/err")"
      grep -q '"kv_dtype": "fp8"' "$TMPD/err" || fail "$src: not on an fp8 cache on cuda: $(cat "$TMPD/err")"
      pairs+=("$TMPD/f-$fam-${p%%:*}.cpu.json" "$out")
    done
  done
done
python3 tests/tools/kv_gate.py --cos 0.98 --top 0.85 --rel inf --indent "   " "${pairs[@]}" ||
  fail "fp8 KV caches: the emulated CUDA backend fails the gate (tests/tools/kv_gate.py)"
for fam in glm5 glm5-split; do
  want=$("$WICK" generate "$TMPD/$fam" --tokens $ids -n 12 --temperature 0 --backend cpu \
    --kv-dtype fp8 2>/dev/null)
  got=$("$EMU" generate "$TMPD/$fam" --tokens $ids -n 12 --temperature 0 --backend cuda \
    --kv-dtype fp8 2>"$TMPD/err") || fail "$fam fp8: cuda decode: $(tail -n 3 "$TMPD/err")"
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "$fam fp8: cuda decoded '$got', cpu '$want'"
  echo "   $fam: 12 greedy decode steps on fp8 caches on cuda, the CPU's ids: ${got##*$'\n'}"
done

# The GQA families on fp8 caches (K and V of each position's kv-head row as e4m3 codes, a
# scale per 128, read by k_attention), cuda against cpu on caches of their own: no DSA
# selection, so only a code flipped where the two sides' sums part by an ulp at an e4m3
# rounding boundary; but GLM-4.5's MoE router (top 4 of 16 experts in groups) selects too, and
# a flipped code can change one position's experts. Measured here (kv_gate.py's figures) over
# the e2e's 8- and 40-token prompts and 50 random ones of 8 to 70 tokens (30 for the default
# seed and the FP8 cast): stories260K 1 - mean cosine <= 7.2e-9, |d|/max <= 1.4e-3, top-1 1;
# GLM-4.5 (seed 8, and gpu-check's default seed) by flipped codes alone <= 6.7e-7 and 3.3e-3,
# and one prompt of each seed with a position whose experts changed (its cosine 0.956 / 0.961,
# the prompt's mean 0.99937 / 0.99902, |d|/max 0.23 / 0.30), top-1 still 1; cast to FP8
# weights <= 6.1e-7 and 2.1e-3; the e2e's own prompts <= 1e-12 and 1e-6 on all three.
# So GLM-4.5: mean cosine >= 0.99, top-1 >= 0.85 (one such position in 8 tokens) and every
# logit within 0.5 of the largest; stories260K: the bf16 caches' bounds (0.9999, 0.9, 2e-2).
# V's scales taken from position 0's row in k_attention give GLM-4.5 0.933, 0.65, 0.53 and
# stories260K 0.99927, 0.825, 0.22. Over GLM-4.5's 8-token prefill from the directory and an
# lz4 snapshot and its 40-token one, the same on it cast to FP8 weights (the snapshot), and
# stories260K's as GLM-4.5's; then 12 greedy decode steps of each on cuda: the CPU's ids
# (stories260K: the text of "Once upon a time"; measured equal on all three).
section "GLM-4.5 and stories260K on fp8 KV caches, cuda against cpu"
"$WICK" snapshot "$TMPD/glm4" -o "$TMPD/glm4-fp8" --dtype fp8 >/dev/null 2>&1 ||
  fail "snapshot glm4 --dtype fp8"
g4=() s1=()
for fam in glm4 glm4-fp8 stories; do
  dir=$TMPD/$fam; [ $fam = stories ] && dir=$m
  for p in "s:$ids" "l:$long"; do
    "$WICK" logits "$dir" --tokens "${p#*:}" --all-positions --backend cpu --kv-dtype fp8 \
      >"$TMPD/f-$fam-${p%%:*}.cpu.json" 2>/dev/null || fail "$fam fp8: cpu logits"
    runs=("$dir")
    [ $fam != glm4-fp8 ] && [ "${p%%:*}" = s ] && runs+=("$TMPD/$fam-snap")
    for src in "${runs[@]}"; do
      out="$TMPD/f-${src##*/}-${p%%:*}.cuda.json"
      "$EMU" logits "$src" --tokens "${p#*:}" --all-positions --backend cuda --kv-dtype fp8 \
        --verbose >"$out" 2>"$TMPD/err" ||
        fail "${src##*/} fp8: cuda logits: $(tail -n 3 "$TMPD/err")"
      grep -q '"kv_dtype": "fp8"' "$TMPD/err" ||
        fail "${src##*/}: not on an fp8 cache on cuda: $(cat "$TMPD/err")"
      if [ $fam = stories ]; then s1+=("$TMPD/f-$fam-${p%%:*}.cpu.json" "$out")
      else g4+=("$TMPD/f-$fam-${p%%:*}.cpu.json" "$out"); fi
    done
  done
done
python3 tests/tools/kv_gate.py --positions 104 --cos 0.99 --top 0.85 --rel 0.5 \
  --indent "   GLM-4.5: " "${g4[@]}" ||
  fail "GLM-4.5 on fp8 KV caches: the emulated CUDA backend fails the gate (tests/tools/kv_gate.py)"
python3 tests/tools/kv_gate.py --positions 56 --cos 0.9999 --top 0.9 --rel 2e-2 \
  --indent "   stories260K: " "${s1[@]}" ||
  fail "stories260K on fp8 KV caches: the emulated CUDA backend fails the gate (kv_gate.py)"
for fam in glm4 glm4-fp8 stories; do
  in=("$TMPD/$fam" --tokens $ids)
  [ $fam = stories ] && in=("$m" -p "Once upon a time")  # its text: --tokens $ids has NUL bytes
  want=$("$WICK" generate "${in[@]}" -n 12 --temperature 0 --backend cpu --kv-dtype fp8 2>/dev/null)
  got=$("$EMU" generate "${in[@]}" -n 12 --temperature 0 --backend cuda --kv-dtype fp8 \
    2>"$TMPD/err") || fail "$fam fp8: cuda decode: $(tail -n 3 "$TMPD/err")"
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "$fam fp8: cuda decoded '$got', cpu '$want'"
  echo "   $fam: 12 greedy decode steps on fp8 caches on cuda, the CPU's: ${got##*$'\n'}"
done

# FP8 activations: both backends quantize each matmul input per token per 128 channels with
# kernels that agree bit for bit, but their matmuls sum in other orders, so an input lying
# within an f32 ulp or two of an e4m3 rounding tie can take the other code, and on random
# tiny weights one flipped code cascades (with ids 1,5,9,42,7,3,100,64 the first matmul
# input of token 3 has x/scale = -247.99999 on the CPU, -248.00002 here, the tie between
# 240 and 256, and the logits part by 2e-2 from position 3 on). These ids hold no such tie
# under the first GEMV's sums (4.9e-7) nor under the 16-byte GEMV's (4.8e-7). A failure here
# may be a new tie after a change in either side's arithmetic rather than a bug, but it must
# be looked at, not loosened: 3,141,59,26,53,58,97,93, clean under the first GEMV, parted by
# 3.5e-2 from position 5 on under the 16-byte one, positions 0-4 still within 4e-7 (a flipped
# code, not a wrong sum). gpu-check's gate on a GPU is the cosine one (issue 9).
section "GLM-5 with FP8 activations, cuda against cpu"
ids=11,22,33,44,55,66,77,88
# (the CPU absorbs MLA as the GPU does: the two forms quantize different activations)
WICK_GLM_MLA=absorb "$WICK" logits "$TMPD/glm5" --tokens $ids --all-positions --fp8-act \
  --backend cpu $KV32 >"$TMPD/q.cpu.json" 2>/dev/null || fail "fp8-act: cpu logits"
"$EMU" logits "$TMPD/glm5" --tokens $ids --all-positions --fp8-act --backend cuda $KV32 \
  >"$TMPD/q.cuda.json" 2>"$TMPD/err" || fail "fp8-act: cuda logits: $(tail -n 3 "$TMPD/err")"
close "glm5 --fp8-act" "$TMPD/q.cpu.json" "$TMPD/q.cuda.json"

# A prefill of 64 tokens or more with FP8 activations runs its FP8 matmuls as GEMMs
# (matmul_fp8act: the activations as e4m3 codes and scales, then the wgmma GEMM): issue 9's
# gross-error gate over 360 positions is gpu-check's "fp8 activations gpu vs cpu", which
# make test's gpu_check_rehearsal.sh runs on the emulator with these flags and gate.

# With f32 activations (the default) a prefill of 64 tokens or more runs its FP8 matmuls as
# GEMMs too (matmul_fp8w: x split into bf16 hi and lo halves, then the bf16 wgmma GEMM of
# gemm_fp8w.cu) instead of the decode GEMV, and must still match the CPU's f32 logits within
# 1e-3 like any other step (the split leaves ~2^-16 of each product; the GEMM test's bound is
# 1e-5): GLM-4.5 cast to FP8 by the snapshot over 70 tokens here; GLM-5 over 150 (two token
# tiles, the last partial; hidden 200 is not a multiple of 16, so the weights' byte-load path
# too; and the grouped MoE GEMMs of moe_kernels.cu, from 64 tokens with FP8 experts) is
# gpu-check's "f32-activation prefill GEMM gpu vs cpu", rehearsed on the emulator by
# gpu_check_rehearsal.sh with the same prompt and bound. A doubled block scale in the kernel
# parts these by ~2; a slot index in place of the plan's tok[] in the MoE gather gives NaN
# logits. Groups of more than one 128-slot tile are test_cuda_moe.c's moe_experts_gemm_matches_ref.
# A prefill of 32 tokens or more runs its attention through query tiles on the tensor cores
# (k_att_mma, each key and value read once for 64 query rows, or 32 of MLA's: attention.cu):
# GLM-4.5's 70 tokens here do; GLM-5's prefill runs MLA's expanded form so while dense (every
# position within index_topk): a GLM-5 whose indexer keeps 256 positions, over 40 tokens.
# Sparse, a GPU absorbs it, and its latent attention runs as one token's heads a block
# (k_mla_lat): the tiny GLM-5 (index_topk 4) over 40 tokens.
section "GLM-4.5 FP8 prefill GEMMs with f32 activations, prefill attention tiles, cuda against cpu"
"$WICK_TOOLS/gen_glm" --family glm5 --index-topk 256 -o "$TMPD/glm5-dense" --seed 9 >/dev/null \
  || fail "gen_glm glm5 --index-topk 256"
for c in "glm4-fp8 70 12" "glm5-dense 40 5" "glm5 40 13"; do
  set -- $c
  ids=$(python3 -c "import random; random.seed($3); print(','.join(str(random.randrange(300)) for _ in range($2)))")
  "$WICK" logits "$TMPD/$1" --tokens "$ids" --all-positions --backend cpu $KV32 \
    >"$TMPD/f32-$1.cpu.json" 2>/dev/null || fail "$1 f32 prefill: cpu logits"
  "$EMU" logits "$TMPD/$1" --tokens "$ids" --all-positions --backend cuda $KV32 \
    >"$TMPD/f32-$1.cuda.json" 2>"$TMPD/err" || fail "$1 f32 prefill: cuda logits: $(tail -n 3 "$TMPD/err")"
  close "$1, a $2-token prefill" "$TMPD/f32-$1.cpu.json" "$TMPD/f32-$1.cuda.json"
done
# The GEMVs of 2..8 tokens go to the tensor-core GEMV (v2, k_gemv_mma), to its pipelined form
# with WICK_CUDA_GEMV=v3 (k_gemv_mma3) and to k_matmul with WICK_CUDA_GEMV=v1: each setting
# launches its own kernel (the emulator's launch log says which) and gives the CPU's logits.
# A GLM-5 whose matrices' columns are multiples of 128, as the tensor-core GEMVs need.
section "the GEMVs of 8 tokens: v2, v3 and v1, cuda against cpu"
"$WICK_TOOLS/gen_glm" --family glm5 --hidden 256 --intermediate 384 --moe-intermediate 128 \
  --q-lora-rank 128 --kv-lora-rank 128 -o "$TMPD/glm5-128" --seed 3 >/dev/null ||
  fail "gen_glm glm5-128"
"$WICK" logits "$TMPD/glm5-128" --tokens 1,5,9,42,7,3,100,64 --all-positions --backend cpu $KV32 \
  >"$TMPD/g128.cpu.json" 2>/dev/null || fail "glm5-128: cpu logits"
for v in v2 v3 v1; do
  WICK_CUDA_GEMV=$v WICK_SIMT_LAUNCHES="$TMPD/launches-$v" "$EMU" logits "$TMPD/glm5-128" \
    --tokens 1,5,9,42,7,3,100,64 --all-positions --backend cuda $KV32 >"$TMPD/g128.$v.json" \
    2>"$TMPD/err" || fail "glm5-128, WICK_CUDA_GEMV=$v: $(tail -n 3 "$TMPD/err")"
  close "WICK_CUDA_GEMV=$v" "$TMPD/g128.cpu.json" "$TMPD/g128.$v.json"
  n2=$(grep -c '^k_gemv_mma<' "$TMPD/launches-$v" || :)
  n3=$(grep -c '^k_gemv_mma3<' "$TMPD/launches-$v" || :)
  case $v in
    v2) [ "$n2" -gt 0 ] && [ "$n3" = 0 ] ;;
    v3) [ "$n3" -gt 0 ] && [ "$n2" = 0 ] ;;
    v1) [ "$n2" = 0 ] && [ "$n3" = 0 ] ;;
  esac || fail "WICK_CUDA_GEMV=$v launched $n2 k_gemv_mma and $n3 k_gemv_mma3"
  echo "   WICK_CUDA_GEMV=$v: $n2 k_gemv_mma, $n3 k_gemv_mma3 launches"
  # the shapes into make test's log as well, for the launch-fit check
  [ -z "${WICK_SIMT_LAUNCHES:-}" ] || cat "$TMPD/launches-$v" >>"$WICK_SIMT_LAUNCHES"
done

# The backend's settings refuse a value they do not know, by name, rather than run the
# default (WICK_CUDA_GEMV=v4 would otherwise have been v2).
section "the backend's settings: a value they do not know is refused"
for bad in WICK_CUDA_GEMV=v4 WICK_CUDA_PDL=2 WICK_CUDA_STREAM=per-thread WICK_CUDA_GEMM=tma \
    WICK_CUDA_FP8W=rs,,wf WICK_CUDA_FP8W=rsx; do
  env "$bad" "$EMU" logits "$TMPD/glm5" --tokens 1,2 --backend cuda >/dev/null 2>"$TMPD/err" &&
    fail "$bad: the cuda backend started"
  grep -q "${bad%%=*}=${bad#*=}: not " "$TMPD/err" || fail "$bad: $(tail -n 1 "$TMPD/err")"
done
for good in WICK_CUDA_GEMV=v2 WICK_CUDA_STREAM=legacy WICK_CUDA_GEMM=plain WICK_CUDA_FP8W=wf,rs \
    WICK_CUDA_PDL=1; do
  env "$good" "$EMU" logits "$TMPD/glm5" --tokens 1,2 --backend cuda >/dev/null 2>"$TMPD/err" ||
    fail "$good: $(tail -n 1 "$TMPD/err")"
done
echo "   refused by name: WICK_CUDA_GEMV=v4, ...; taken: WICK_CUDA_GEMV=v2, ..."

# A decode step allocates and frees no device memory: a cudaFree waits for the device, so one
# a step would stall a GPU's pipeline every step. Batched steps of 4 sequences whose prefills
# were short (2 tokens), so that the indexer's score rows, which grow by a key a step, outgrow
# what the prefills made: 2 steps and 6 (after the bench's warm-up step) make as many
# cudaMalloc and cudaFree calls (the emulator counts them: WICK_SIMT_ALLOCS). Before the
# scores grew to the next power of two keys they made two more a step.
section "no device allocations in decode steps"
for s in 2 6; do
  WICK_SIMT_ALLOCS="$TMPD/allocs-$s" "$EMU" bench launches "$TMPD/glm5" --backend cuda --batch 4 \
    --context 2 --steps $s >"$TMPD/bench-$s.txt" 2>&1 ||
    { tail -n 5 "$TMPD/bench-$s.txt"; fail "bench launches --batch 4 --steps $s on cuda"; }
done
[ -s "$TMPD/allocs-2" ] && cmp -s "$TMPD/allocs-2" "$TMPD/allocs-6" ||
  fail "decode steps allocate device memory: 2 steps: $(cat "$TMPD/allocs-2"), 6:" \
    "$(cat "$TMPD/allocs-6")"
echo "   2 and 6 batched decode steps: $(cat "$TMPD/allocs-6") each"

# The emulator's launch profile (WICK_SIMT_PROFILE: a line a launch, its threads' busy time;
# tests/simt/profile.py sums it by kernel): generate's launches past those of the same command
# stopped a token earlier are its decode steps, and timed from WICK_SIMT_PROFILE_FROM on. Two
# steps' worth must be as many launches a step as bench launches counts at that position, the
# launches before it must be untimed (zeros) and every one from it timed.
section "the emulator's launch profile"
ids=1,5,9,42,7,3,100,64
for n in 1 3; do
  from=1
  [ $n = 3 ] && from=$(($(wc -l <"$TMPD/prof-1") + 1))
  WICK_SIMT_PROFILE="$TMPD/prof-$n" WICK_SIMT_PROFILE_FROM=$from "$EMU" generate "$TMPD/glm5" \
    --tokens $ids -n $n --temperature 0 --backend cuda >/dev/null 2>"$TMPD/gen.err" ||
    fail "generate -n $n under WICK_SIMT_PROFILE: $(tail -n 1 "$TMPD/gen.err")"
  grep -q "8 prompt + $n generated" "$TMPD/gen.err" ||
    fail "generate -n $n: $(tail -n 1 "$TMPD/gen.err")"
done
k=$(wc -l <"$TMPD/prof-1")
awk -F'\t' -v k="$k" 'NF != 6 || (NR <= k) != ($4 == 0) { bad = NR } END { exit bad ? 1 : 0 }' \
  "$TMPD/prof-3" || fail "WICK_SIMT_PROFILE_FROM=$((k + 1)): not every launch before it" \
  "untimed and every one from it timed"
python3 tests/simt/profile.py "$TMPD/prof-3" --skip "$k" --per 2 >"$TMPD/prof.txt" ||
  fail "profile.py"
"$EMU" bench launches "$TMPD/glm5" --context 8 --steps 2 --backend cuda >"$TMPD/bench.txt" 2>&1 ||
  fail "bench launches --context 8 on cuda"
per=$(awk '$1 == "sum" { print $2 }' "$TMPD/prof.txt")
want=$(awk '$1 == "kernels" { print $2 }' "$TMPD/bench.txt")
[ -n "$per" ] && [ "$per" = "$want" ] ||
  { cat "$TMPD/prof.txt"; fail "profile: $per launches a decode step, bench launches: $want"; }
echo "   $k launches before the decode steps, $per a step (bench launches: $want); the busiest:"
sed -n 3,4p "$TMPD/prof.txt" | sed 's/^/   /'

# A reader's two staging buffers are reused only past two work items of 16 MiB: 54 MB through
# one reader refills each several times, and the emulator makes a copy only when its event
# is waited for, reading the buffer then, so a refill before the wait lands the wrong bytes.
section "restore through reused staging buffers"
"$WICK_TOOLS/gen_llama" -o "$TMPD/big" --hidden 512 --intermediate 1536 --layers 6 --heads 8 \
  --kv-heads 4 --vocab 8192 >/dev/null || fail "gen_llama"
"$WICK" snapshot "$TMPD/big" -o "$TMPD/big-snap" >/dev/null 2>&1 || fail "snapshot the 54 MB model"
"$EMU" bench restore "$TMPD/big-snap" --backend cuda --threads 1 --runs 1 --no-cold \
  --startup-runs 0 >"$TMPD/bench.txt" 2>&1 || { cat "$TMPD/bench.txt"; fail "bench restore --backend cuda"; }
grep -q "device's bytes checked against the host restore" "$TMPD/bench.txt" \
  || { cat "$TMPD/bench.txt"; fail "bench restore did not check the device's bytes"; }
echo "   $(grep '^into cuda memory' "$TMPD/bench.txt")"

section "a device fault is sticky and fails the step"
set +e
WICK_SIMT_FAULT_LAUNCH=30 "$EMU" logits "$TMPD/glm5" --tokens $ids --backend cuda \
  >"$TMPD/fault.json" 2>"$TMPD/fault.err"
rc=$?
set -e
[ $rc -ne 0 ] || fail "logits after a device fault exited 0"
[ ! -s "$TMPD/fault.json" ] || fail "logits after a device fault printed logits"
grep -q 'the CUDA backend failed: CUDA .*an illegal memory access' "$TMPD/fault.err" \
  || fail "the fault is not reported: $(cat "$TMPD/fault.err")"
echo "   wick logits: exit $rc, $(cat "$TMPD/fault.err")"
Q=$TMPD/q
"$WICK" submit --queue "spool:$Q" --id f1 -p "Once upon a time" -n 8 --temperature 0 >/dev/null || fail "submit"
set +e
# launch 150 lands inside the job (its prefill and 8 chained decode steps: about 280 launches;
# 30 to 250 all do), after the worker's start
WICK_SIMT_FAULT_LAUNCH=150 "$EMU" worker --model "$TMPD/stories-snap" --backend cuda \
  --queue "spool:$Q" --idle-timeout 0.5 2>"$TMPD/bad.log"
rc=$?
set -e
[ $rc -eq 3 ] || fail "the faulted worker exited $rc, not 3: $(tail -n 3 "$TMPD/bad.log")"
grep -q 'unhealthy: .*illegal memory access' "$TMPD/bad.log" || fail "no unhealthy line: $(tail -n 3 "$TMPD/bad.log")"
grep -q 'job f1 handed back' "$TMPD/bad.log" || fail "f1 was not handed back"
[ -z "$(ls "$Q/done")" ] || fail "the faulted worker stored a result"
"$EMU" worker --model "$TMPD/stories-snap" --backend cuda --queue "spool:$Q" --idle-timeout 0.3 \
  2>"$TMPD/good.log" || fail "the healthy worker: $(tail -n 3 "$TMPD/good.log")"
want=$("$WICK" generate "$m" -p "Once upon a time" -n 8 --temperature 0 2>/dev/null)
python3 - "$Q/done/f1.json" "${want#Once upon a time}" <<'PY' || fail "f1 after the hand-back"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "COMPLETED" and r["attempt"] == 2, r
assert r["output"]["text"] == sys.argv[2], (r["output"]["text"], sys.argv[2])
print(f"   worker: exit 3 and f1 handed back; a healthy one completed it on attempt 2: {r['output']['text']!r}")
PY
section "seeded sampled jobs: cuda worker against cpu worker"
# Non-greedy jobs take their token from the candidates the device selects (sample_cand; the
# draw and the pick on the host): with the same seeds, the CPU worker's texts.
for b in cpu cuda; do
  mkdir -p "$TMPD/qs-$b"
  for j in "p1 0.8 0.9 0 5" "p2 1.1 0.95 40 6" "p3 1.0 1 0 7" "p4 0.6 1 1 8"; do
    set -- $j
    printf '{"id": "%s", "input": {"prompt": "Once upon a time", "max_tokens": 24, "temperature": %s, "top_p": %s, "top_k": %s, "seed": %s}}' \
      "$@" >"$TMPD/$1.json"
    "$WICK" submit --queue "spool:$TMPD/qs-$b" --file "$TMPD/$1.json" >/dev/null || fail "submit $1"
  done
  printf '{"id": "p5", "input": {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 9, "logprobs": true, "top_logprobs": 3, "frequency_penalty": 1, "logit_bias": {"261": -100}}}' >"$TMPD/p5.json"
  printf '{"id": "p6", "input": {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": true, "repetition_penalty": 1.3}}' >"$TMPD/p6.json"
  # prompt logprobs: the prompt's rows to the host (eng_item rows = n, no token), then the
  # first token picked there; and a prompt of ids scored alone (max_tokens 0)
  printf '{"id": "p7", "input": {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.8, "seed": 10, "logprobs": true, "prompt_logprobs": 3}}' >"$TMPD/p7.json"
  printf '{"id": "p8", "input": {"prompt": [1, 403, 407, 261, 378, 270, 9, 17], "max_tokens": 0, "prompt_logprobs": 2}}' >"$TMPD/p8.json"
  for j in p5 p6 p7 p8; do
    "$WICK" submit --queue "spool:$TMPD/qs-$b" --file "$TMPD/$j.json" >/dev/null || fail "submit $j"
  done
  W=$WICK; [ $b = cuda ] && W=$EMU
  "$W" worker --model "$TMPD/stories-snap" --backend $b --queue "spool:$TMPD/qs-$b" \
    --concurrency 4 --idle-timeout 0.3 2>"$TMPD/qs-$b.log" || fail "the $b worker: $(tail -n 3 "$TMPD/qs-$b.log")"
done
python3 - "$TMPD/qs-cpu/done" "$TMPD/qs-cuda/done" <<'PY' || fail "sampled jobs differ between the workers"
import json, os, sys
for j in ("p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8"):
    a, b = (json.load(open(os.path.join(d, j + ".json"))) for d in sys.argv[1:3])
    assert a["status"] == b["status"] == "COMPLETED", (a, b)
    assert a["output"]["token_ids"] == b["output"]["token_ids"], (j, a["output"], b["output"])
    d = 0
    for key in ("logprobs", "prompt_logprobs"):
        if key not in a["output"]:
            continue
        la, lb = a["output"][key], b["output"][key]
        if key == "logprobs":
            la, lb = la["content"], lb["content"]
        n = len(a["output"]["token_ids" if key == "logprobs" else "prompt_token_ids"])
        assert len(la) == len(lb) == n, j
        if key == "prompt_logprobs":
            assert la[0]["logprob"] is None and lb[0]["logprob"] is None, j
            la, lb = la[1:], lb[1:]
        for x, y in zip(la, lb):
            assert x["token"] == y["token"], (j, x, y)
            tx, ty = x["top_logprobs"], y["top_logprobs"]
            assert [t["token"] for t in tx] == [t["token"] for t in ty], (j, tx, ty)
            d = max([d, abs(x["logprob"] - y["logprob"])] +
                    [abs(s["logprob"] - t["logprob"]) for s, t in zip(tx, ty)])
        assert d < 1e-3, (j, d)
    print(f"   {j}: {b['output']['text']!r}" + (f" (logprobs within {d:.1g})" if d else ""))
PY
section "sharded snapshots on emulated devices"
ids=1,5,9,42,7,3,100,64
for c in "glm5 2 4" "glm4 2 1"; do # world = max(tp, ep) ranks, one device each
  set -- $c
  fam=$1 tp=$2 ep=$3 w=$(( $2 > $3 ? $2 : $3 ))
  s="$fam-tp$tp-ep$ep"
  "$WICK" snapshot "$TMPD/$fam" -o "$TMPD/$s" --tp "$tp" --ep "$ep" >/dev/null 2>&1 \
    || fail "snapshot $fam tp $tp ep $ep"
  WICK_SIMT_DEVICES=$w "$EMU" logits "$TMPD/$s" --tokens $ids --all-positions \
    --backend cuda $KV32 --verbose >"$TMPD/$s.cuda.json" 2>"$TMPD/err" \
    || fail "$s: cuda logits: $(tail -n 3 "$TMPD/err")"
  grep -q "restored .* into device memory" "$TMPD/err" \
    || fail "$s: the rank files were not restored into device memory: $(cat "$TMPD/err")"
  # the further ranks' contexts started at once, the communicator made beside the restore
  grep '^{"startup"' "$TMPD/err" | python3 -c '
import json, sys
s = json.load(sys.stdin)["startup"]
assert s["to_device"] and s["ranks_s"] > 0 and s["comm_s"] > 0, s
assert 0 <= s["comm_wait_s"] <= s["comm_s"], s
print("   start-up: further ranks %.1f ms, communicator %.1f ms (waited for %.1f ms after the "
      "weights)" % (s["ranks_s"] * 1e3, s["comm_s"] * 1e3, s["comm_wait_s"] * 1e3))' \
    || fail "$s: start-up timings: $(grep startup "$TMPD/err")"
  close "$fam tp $tp x ep $ep, $w ranks on $w devices" "$TMPD/$fam.cpu.json" "$TMPD/$s.cuda.json"
done
WICK_GLM_MLA=expand WICK_SIMT_DEVICES=4 "$EMU" logits "$TMPD/glm5-tp2-ep4" --tokens $ids \
  --all-positions --backend cuda $KV32 >"$TMPD/expand-tp2.cuda.json" 2>"$TMPD/err" \
  || fail "glm5 tp 2 x ep 4 expanded: $(tail -n 3 "$TMPD/err")"
close "glm5 tp 2 x ep 4, MLA expanded (forced)" "$TMPD/glm5.cpu.json" "$TMPD/expand-tp2.cuda.json"
set +e
WICK_SIMT_DEVICES=3 "$EMU" logits "$TMPD/glm5-tp2-ep4" --tokens $ids --backend cuda \
  >/dev/null 2>"$TMPD/few.err"
rc=$?
set -e
[ $rc -ne 0 ] || fail "4 ranks on 3 devices exited 0"
grep -q 'CUDA device 3 does not exist (3 visible)' "$TMPD/few.err" \
  || fail "4 ranks on 3 devices: $(cat "$TMPD/few.err")"
echo "   4 ranks on 3 devices: exit $rc, $(tail -n 1 "$TMPD/few.err")"
# the cold start of a sharded worker, measured: each rank file into its own device
WICK_SIMT_DEVICES=4 "$EMU" bench restore "$TMPD/glm5-tp2-ep4" --backend cuda --runs 1 \
  --no-cold --startup-runs 0 >"$TMPD/bench4.txt" 2>&1 \
  || { cat "$TMPD/bench4.txt"; fail "bench restore --backend cuda of 4 ranks"; }
grep -q "on 4 devices, one a rank; every device's bytes checked" "$TMPD/bench4.txt" \
  || { cat "$TMPD/bench4.txt"; fail "bench restore did not restore 4 ranks into 4 devices"; }
grep -q '"devices":4' "$TMPD/bench4.txt" || fail "bench restore's JSON has no 4 devices"
echo "   $(grep '^into cuda memory' "$TMPD/bench4.txt")"
set +e
WICK_SIMT_DEVICES=3 "$EMU" bench restore "$TMPD/glm5-tp2-ep4" --backend cuda --runs 1 \
  --no-cold --startup-runs 0 >"$TMPD/bench3.txt" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "a snapshot of 4 ranks is restored into 4 cuda devices" "$TMPD/bench3.txt" \
  || { cat "$TMPD/bench3.txt"; fail "bench restore of 4 ranks on 3 devices: exit $rc"; }
"$WICK" snapshot "$m" -o "$TMPD/stories-tp2" --tp 2 >/dev/null 2>&1 || fail "snapshot stories260K tp 2"
got=$(WICK_SIMT_DEVICES=2 "$EMU" generate "$TMPD/stories-tp2" -n 24 --temperature 0 \
  --backend cuda 2>"$TMPD/gen.err") || fail "generate tp 2: $(tail -n 3 "$TMPD/gen.err")"
[ "$got" = "$cpu" ] || fail "cuda tp 2 tells another story: '$got'"
echo "   stories260K tp 2 on 2 devices: the golden text"
Q2=$TMPD/q2
"$WICK" submit --queue "spool:$Q2" --id s1 -p "Once upon a time" -n 8 --temperature 0 >/dev/null || fail "submit"
WICK_SIMT_DEVICES=2 "$EMU" worker --model "$TMPD/stories-tp2" --backend cuda --queue "spool:$Q2" \
  --idle-timeout 0.3 2>"$TMPD/tp2.log" || fail "the tp 2 worker: $(tail -n 3 "$TMPD/tp2.log")"
want=$("$WICK" generate "$m" -p "Once upon a time" -n 8 --temperature 0 2>/dev/null)
python3 - "$Q2/done/s1.json" "${want#Once upon a time}" <<'PY' || fail "s1 on the tp 2 worker"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "COMPLETED", r
assert r["output"]["text"] == sys.argv[2], (r["output"]["text"], sys.argv[2])
print(f"   a worker on stories260K tp 2 (2 devices, one process): {r['output']['text']!r}")
PY
# its ready line says what the communicator, made beside the restore, cost the start
grep -q 'ready: .*restored from a snapshot.*; communicator [0-9.]* ms, [0-9.]* ms of it after them' \
  "$TMPD/tp2.log" || fail "the tp 2 worker's ready line: $(grep 'ready:' "$TMPD/tp2.log")"
section "speculative decoding on the cuda backend"
# --speculate 4 on a cuda worker and a cpu worker, the same jobs: a greedy one (its drafts
# checked by the device's argmax over every row, the rest truncated from the device's cache)
# and two seeded sampled ones (temperature alone: a drafted row kept or replaced by the
# candidates kernel itself, the others picked there too; the CPU worker applies
# samp_pick_draft to the row): the CPU worker's tokens and drafts (a draft's cost fixed,
# --draft-cost, so that both plan the same drafts however fast each runs; the prefix cache
# off, since with it the job the queue hands over first prefills and the others copy it a
# step later, and the spool's order is the directory's)
for q in sc sg; do
  for i in 0 1 2; do
    t=0.7
    [ $i = 0 ] && t=0
    "$WICK" submit --queue "spool:$TMPD/$q" --id j$i -n 40 --temperature $t --seed $i \
      -p "Lily and Ben went to the park. Lily and Ben" >/dev/null || fail "submit"
  done
done
"$WICK" worker --model "$m" --queue "spool:$TMPD/sc" --idle-timeout 0.3 --speculate 4 \
  --draft-cost 0.1 --prefix-cache off 2>"$TMPD/sc.log" ||
  fail "the cpu worker: $(tail -n 3 "$TMPD/sc.log")"
"$EMU" worker --model "$m" --backend cuda --queue "spool:$TMPD/sg" --idle-timeout 0.3 \
  --speculate 4 --draft-cost 0.1 --prefix-cache off 2>"$TMPD/sg.log" ||
  fail "the cuda worker: $(tail -n 3 "$TMPD/sg.log")"
python3 - "$TMPD" <<'PY' || fail "speculation, cuda against cpu"
import json, sys
kept = [0, 0]
for i in (0, 1, 2):
    a, b = (json.load(open(f"{sys.argv[1]}/{q}/done/j{i}.json")) for q in ("sc", "sg"))
    assert a["status"] == b["status"] == "COMPLETED", (a, b)
    assert a["output"]["token_ids"] == b["output"]["token_ids"], (a["output"], b["output"])
    d = b["usage"]["completion_tokens_details"]
    assert d == a["usage"]["completion_tokens_details"], (a["usage"], b["usage"])
    kept[i > 0] += d["accepted_prediction_tokens"]
assert kept[0] > 0 and kept[1] > 0, f"drafts kept, greedy and sampled: {kept}"
print(f"   --speculate 4, a greedy job and 2 seeded sampled ones: the CPU worker's tokens; "
      f"{kept[0]} and {kept[1]} drafts kept")
PY

section "the prefix cache"
for spec in "glm5 fp8" "stories auto"; do
  set -- $spec
  model=$TMPD/glm5
  [ $1 = stories ] && model=$m
  "$EMU" bench prefix "$model" --backend cuda --turns 3 --system 20 --user 10 --reply 6 \
    --choices 3 --prompt 16 --prefix-wait 2 --runs 1 --kv-dtype $2 >"$TMPD/prefix-$1.txt" 2>&1 ||
    fail "bench prefix $1: $(tail -n 2 "$TMPD/prefix-$1.txt")"
  tail -n 1 "$TMPD/prefix-$1.txt" | python3 -c 'import json, sys
j = json.load(sys.stdin)
assert j["backend"] == "cuda" and j["replies_differ"] == 0 and j["ran_on"] < j["ran_off"], j
assert j["choices_differ"] == 0 and j["choices_ran_on"] == 16 + 2, j
r = j["restart"]
assert r["differ"] == 0 and r["ran_on"] == 1 and r["ran_off"] == 16, j
' ||
    fail "the prefix cache on cuda, $1: $(tail -n 2 "$TMPD/prefix-$1.txt")"
  sum=$(grep 'all:' "$TMPD/prefix-$1.txt" | sed 's/^ *all: //; s/; time.*replies/; replies/')
  echo "   $1, KV $2: $sum"
  echo "   $(grep 'choices:' "$TMPD/prefix-$1.txt" | sed 's/^ *//')"
  echo "   $(grep '^  restart:' "$TMPD/prefix-$1.txt" | sed 's/^ *//')"
done
section "done"
echo ok
