# The KV cache's type against the logits (scripts/kv-precision --check): on random GLM-5s with
# GLM-5's cache widths, with the indexer selecting every position and 64 of 200, and on a
# random GLM-4.5 (GQA, head_dim 128), bf16 and fp8 caches stay within their bounds of the f32
# caches' logits.
source tests/e2e/lib.sh
scripts/kv-precision --check || fail "the KV cache's precision left its bounds"
echo ok
