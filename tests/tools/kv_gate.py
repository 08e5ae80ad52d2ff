#!/usr/bin/env python3
"""kv_gate.py [--positions N] [--indent S] CPU.json GPU.json [CPU.json GPU.json ...]: holds a
GPU's logits on bf16 KV caches (wick logits --all-positions JSON) to the CPU's, each prompt (a
pair of files) on its own so that none hides in an average: mean cosine >= 0.9999, top-1
agreement >= 0.9 and every logit within 2e-2 of the largest. Where the two backends' sums part
by an ulp a cached element can round to the other bf16, so not 1e-3 (measured under the
emulator: 1 - cosine <= 4e-9, <= 1.7e-4; a cast that truncates instead of rounding moves a
prompt by 0.24). --positions: the positions there must be in all (default: any but none).
Used by tests/e2e/cuda_emulated.sh and scripts/gpu-check; exits 0 when every prompt passes.
"""
import argparse
import json
import math
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--positions", type=int, default=0)
ap.add_argument("--indent", default="")
ap.add_argument("files", nargs="+")
a = ap.parse_args()
if len(a.files) % 2:
    sys.exit("kv_gate: the files go in pairs, CPU then GPU")
ok, n, worst, low = True, 0, 0.0, 1.0
for pa, pb in zip(a.files[0::2], a.files[1::2]):
    ra_all, rb_all = (json.load(open(p))["logits"] for p in (pa, pb))
    assert len(ra_all) == len(rb_all) > 0, "shapes differ"
    cos = top = d = m = 0
    for ra, rb in zip(ra_all, rb_all):
        dot = sum(x * y for x, y in zip(ra, rb))
        cos += dot / math.sqrt(sum(x * x for x in ra) * sum(y * y for y in rb))
        top += ra.index(max(ra)) == rb.index(max(rb))
        d = max(d, max(abs(x - y) for x, y in zip(ra, rb)))
        m = max(m, max(abs(x) for x in ra))
    k = len(ra_all)
    n += k
    worst, low = max(worst, d / m), min(low, cos / k)
    ok &= cos / k >= 0.9999 and top / k >= 0.9 and d / m <= 2e-2
print(f"{a.indent}{n} positions: lowest mean cosine of a prompt {low:.6f}, worst |d|/max {worst:.1e}")
sys.exit(0 if ok and n > 0 and (not a.positions or n == a.positions) else 1)
