#!/usr/bin/env bash
# malformed_safetensors.sh - `wick inspect` on broken safetensors files must exit 1 (not die on
# a signal) with a message naming the file and the problem; a valid file must exit 0.
source tests/e2e/lib.sh

# Each case: FILE<TAB>expected substring of the message. Files are crafted byte by byte.
python3 - "$TMPD" >"$TMPD/cases.tsv" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]

def ent(dtype="F32", shape=(4,), offs=(0, 16), **extra):
    e = {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}
    e.update(extra)
    return e

def mk(name, want, hdr, data_len=16, hlen=None, cut=None):
    h = hdr if isinstance(hdr, bytes) else json.dumps(hdr).encode()
    b = struct.pack("<Q", len(h) if hlen is None else hlen) + h + bytes(data_len)
    if cut is not None:
        b = b[:cut]
    p = os.path.join(d, name + ".safetensors")
    with open(p, "wb") as f:
        f.write(b)
    print(f"{p}\t{want}")

mk("short", "too short", b"", cut=5)
mk("empty", "too short", b"", cut=0)
mk("header_cut", "runs past the end", {"w": ent()}, cut=30)
mk("hlen_past_end", "runs past the end", {"w": ent()}, hlen=10_000)
mk("hlen_over_cap", "over the limit", {"w": ent()}, hlen=(100 << 20) + 1)
mk("hlen_huge", "over the limit", {"w": ent()}, hlen=2**64 - 1)
mk("not_json", "not valid JSON", b"{this is not json}")
mk("not_object", "does not start with '{'", b"[1, 2, 3]")
mk("overlap", "overlap", {"a": ent(offs=(0, 16)), "b": ent(shape=(2,), offs=(8, 16))})
mk("past_end", "run past the end", {"w": ent(offs=(16, 32))})
mk("begin_gt_end", "begin > end", {"w": ent(offs=(16, 0))})
mk("unknown_dtype", "unknown dtype 'F99'", {"w": ent(dtype="F99")})
mk("mismatch", "hold 16 bytes but shape [64] of F32 needs 256", {"w": ent(shape=(64,))})
mk("negative_dim", "shape[0] is not a non-negative integer", {"w": ent(shape=(-4,))})
mk("overflow_dims", "overflows 64 bits", {"w": ent(shape=(2**62, 2**62))})
mk("rank_too_high", "rank 9 is over the limit", {"w": ent(shape=(1,) * 8 + (4,))})
mk("name_too_long", "over the limit of 512", {"n" * 513: ent()})
mk("bad_metadata", "__metadata__ value of 'format' is not a string",
   {"__metadata__": {"format": 1}, "w": ent()})
mk("metadata_not_object", "__metadata__ is not a JSON object", {"__metadata__": [], "w": ent()})
mk("unknown_key", "unknown key 'extra'", {"w": ent(extra=1)})
mk("deep", "nests deeper", b'{"__metadata__":' + b"[" * 5000 + b"]" * 5000 + b"}")
EOF

n=0
while IFS=$'\t' read -r file want; do
  set +e
  out=$("$WICK" inspect "$file" 2>&1)
  rc=$?
  set -e
  name=$(basename "$file")
  [ "$rc" -ge 128 ] && fail "$name: killed by signal $((rc - 128)): $out"
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1: $out"
  [[ $out == *"$file"* ]] || fail "$name: message does not name the file: $out"
  [[ $out == *"$want"* ]] || fail "$name: message lacks '$want': $out"
  [[ $name == short* || $name == empty* || $name == hlen* || $name == header_cut* ||
     $name == not_* || $name == deep* || $name == metadata* || $name == bad_metadata* ||
     $out == *"tensor"*"'"* ]] || fail "$name: message does not name the tensor: $out"
  n=$((n + 1))
done <"$TMPD/cases.tsv"
[ "$n" -ge 20 ] || fail "only $n cases ran"

# A valid file and directory pass, and the directory's broken shard is named.
python3 - "$TMPD" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
def write(p, hdr, data):
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
hdr = {"__metadata__": {"format": "pt"},
       "a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
       "a_scale_inv": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
write(os.path.join(d, "ok.safetensors"), hdr, bytes(12))
os.makedirs(os.path.join(d, "hf"))
with open(os.path.join(d, "hf", "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2}, f)
write(os.path.join(d, "hf", "model-1.safetensors"), hdr, bytes(12))
write(os.path.join(d, "hf", "model-2.safetensors"),
      {"b": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, bytes(12))
with open(os.path.join(d, "hf", "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {"a": "model-1.safetensors", "a_scale_inv": "model-1.safetensors",
                              "b": "model-2.safetensors"}}, f)
EOF
out=$("$WICK" inspect "$TMPD/ok.safetensors") || fail "valid file rejected: $out"
[[ $out == *"tensors       2"* ]] || fail "bad report: $out"
out=$("$WICK" inspect "$TMPD/hf") || fail "valid dir rejected: $out"
[[ $out == *"shards        2"* && $out == *"parameters    7 "* && $out == *"scales        1"* ]] ||
  fail "bad dir report: $out"
"$WICK" inspect --json "$TMPD/hf" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["tensors"] == 3 and r["parameters"] == 7 and r["scale_tensors"] == 1, r
assert r["architecture"] == "LlamaForCausalLM" and r["config"]["hidden_size"] == 2, r
' || fail "bad --json report"

printf '\x10\0\0\0\0\0\0\0{}' >"$TMPD/hf/model-2.safetensors"
set +e
out=$("$WICK" inspect "$TMPD/hf" 2>&1)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "broken shard: exit $rc: $out"
[[ $out == *"model-2.safetensors"* ]] || fail "broken shard not named: $out"
echo "ok: $n malformed files rejected cleanly"
