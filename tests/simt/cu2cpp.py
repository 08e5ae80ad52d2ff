#!/usr/bin/env python3
"""cu2cpp.py IN.cu OUT.cpp - rewrites a CUDA source into C++ for the emulator (simt.h).

Three rewrites, each keeping the line count so that #line maps errors (and the sites that
simt_syncthreads reports) to IN:
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> simt_run(grid, block, smem, stream, [=]() { kernel(args); }, "kernel")
     (the kernel's name as written: its cudaFuncSetAttribute shared-memory opt-in)
  extern __shared__ T name[];
      -> T *name = (T *)simt_dyn_smem();
  __shared__ T a[N], b;
      -> static T a[N], b; simt_shared(&a, sizeof a); simt_shared(&b, sizeof b);
Anything else CUDA-specific comes from simt.h. Exits 1, naming the line, when a launch or a
__shared__ is left that it could not rewrite.
"""
import re
import sys


def split_top(s):
    """s split at the commas outside brackets, each part stripped"""
    out, depth, cur = [], 0, ''
    for ch in s:
        depth += ch in '([{'
        depth -= ch in ')]}'
        if ch == ',' and depth == 0:
            out.append(cur.strip())
            cur = ''
        else:
            cur += ch
    out.append(cur.strip())
    return out


DYN = re.compile(r'extern\s+__shared__\s+([\w\s]+?)\s+(\w+)\s*\[\s*\]\s*;')
SHARED = re.compile(r'__shared__\s+([^;{}()]*);')
LAUNCH = re.compile(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)


def shared(m):
    decls = split_top(m.group(1))
    names = [re.match(r'\w+', d).group(0) for d in decls[1:]]
    first = re.match(r'(.*?)(\w+)\s*(\[.*)?$', decls[0], re.S)
    names.insert(0, first.group(2))
    calls = ''.join(' simt_shared(&%s, sizeof %s);' % (n, n) for n in names)
    return 'static %s;%s' % (m.group(1), calls)


def launches(src):
    out = ''
    while True:
        m = LAUNCH.search(src)
        if not m:
            return out + src
        cfg = split_top(m.group(2))
        cfg += ['0'] * (4 - len(cfg))
        i, depth = m.end(), 1  # the ')' closing the arguments
        while depth:
            depth += {'(': 1, ')': -1}.get(src[i], 0)
            i += 1
        out += src[:m.start()] + 'simt_run(%s, %s, %s, %s, [=]() { %s(%s); }, "%s")' % (
            cfg[0], cfg[1], cfg[2], cfg[3], m.group(1), src[m.end():i - 1], m.group(1))
        src = src[i:]


def convert(src, name):
    src = DYN.sub(r'\1 *\2 = (\1 *)simt_dyn_smem();', src)
    src = SHARED.sub(shared, src)
    src = launches(src)
    for n, line in enumerate(src.split('\n'), 1):
        for bad in ('<<<', '__shared__'):
            if bad in line:
                sys.exit('%s:%d: cu2cpp.py cannot rewrite this %s' % (name, n, bad))
    return '#line 1 "%s"\n%s' % (name, src)


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit('usage: cu2cpp.py IN.cu OUT.cpp')
    with open(sys.argv[1]) as f:
        text = convert(f.read(), sys.argv[1])
    with open(sys.argv[2], 'w') as f:
        f.write(text)
