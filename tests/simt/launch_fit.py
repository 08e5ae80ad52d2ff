#!/usr/bin/env python3
"""launch_fit.py LAUNCHES SOURCE_DIR PTXAS... - do the emulated tests' launches fit an H200?
   launch_fit.py --self-test - the rules below on cases worked by hand

The emulator (simt_runtime.cpp) checks a launch's grid, block and dynamic shared memory as
CUDA does, but it cannot see what ptxas made of each kernel: its registers and static shared
memory. A launch that asks for more than an SM holds fails on the GPU alone ("too many resources
requested for launch"), at the first run there. This joins the two:
  LAUNCHES  lines "kernel<TAB>threads<TAB>dynamic shared bytes<TAB>opt-in bytes", written by
            the emulator under WICK_SIMT_LAUNCHES (the kernel's name as the launch wrote it);
  PTXAS     the reports `nvcc -Xptxas -v` wrote for sm_90a (the Makefile keeps them beside
            each object as *.cu.o.ptxas);
  SOURCE_DIR  the .cu/.cuh files, for each kernel's __launch_bounds__.
For every launch shape, against every compiled instance of its kernel (a template's launch
written with its parameters, k_matmul<T, MM_NT>, is checked against all its instances):
  - threads <= the kernel's __launch_bounds__ (1,024 without);
  - registers: warps x (registers rounded up to 8) x 32 <= 65,536 (sm_90's file per block);
  - shared memory: static + dynamic <= 48 KiB without an opt-in; with one,
    static + the opt-in <= 227 KiB (or cudaFuncSetAttribute itself fails) and dynamic <= it.
Prints a table and exits 1 naming each launch that does not fit, or a launch whose kernel
ptxas did not report (the names must match, or nothing would be checked).
"""
import collections
import glob
import os
import re
import subprocess
import sys

REGS_PER_BLOCK = 65536
SMEM_DEFAULT = 48 * 1024
SMEM_OPTIN = 227 * 1024


def regs_used(regs, threads):
    """registers a block takes: per warp, the thread's count rounded up to 8, times 32"""
    return (threads + 31) // 32 * ((regs + 7) // 8 * 8) * 32


def misfits(regs, static, bound, threads, dyn, optin):
    """why a launch of THREADS threads with DYN bytes of dynamic shared memory (OPTIN: the
    kernel's cudaFuncSetAttribute opt-in, 0 for none) does not fit a kernel of REGS registers,
    STATIC bytes of static shared memory and __launch_bounds__ BOUND; [] when it fits"""
    out = []
    if threads > bound:
        out.append('over its __launch_bounds__ of %d' % bound)
    if regs_used(regs, threads) > REGS_PER_BLOCK:
        out.append('%d registers a thread need %d of the %d a block has'
                   % (regs, regs_used(regs, threads), REGS_PER_BLOCK))
    if optin == 0 and static + dyn > SMEM_DEFAULT:
        out.append('%d B static + %d B dynamic shared memory, over %d B without an opt-in'
                   % (static, dyn, SMEM_DEFAULT))
    if optin and static + optin > SMEM_OPTIN:
        out.append('%d B static + an opt-in of %d B, over %d B' % (static, optin, SMEM_OPTIN))
    if optin and dyn > optin:
        out.append('%d B dynamic, over its opt-in of %d B' % (dyn, optin))
    return out


def self_test():
    """the rules on cases worked by hand; exits 1 naming the first that disagrees"""
    cases = [  # regs, static, bound, threads, dyn, optin, fits
        (64, 0, 1024, 1024, 0, 0, True),       # 64 x 1024 = 65,536 exactly
        (65, 0, 1024, 1024, 0, 0, False),      # rounds to 72: 73,728
        (255, 0, 256, 256, 0, 0, True),        # rounds to 256: 65,536 exactly
        (255, 0, 1024, 288, 0, 0, False),      # 9 warps
        (32, 0, 256, 257, 0, 0, False),        # over the bounds
        (32, 15744, 1024, 256, 33408, 0, True),   # 49,152 exactly
        (32, 15744, 1024, 256, 33412, 0, False),
        (32, 512, 1024, 256, 197632, 197632, True),
        (32, 512, 1024, 256, 197632, 232448, False),  # static + opt-in over 227 KiB
        (32, 0, 1024, 256, 60000, 50000, False),      # dynamic over its opt-in
    ]
    for regs, static, bound, threads, dyn, optin, want in cases:
        got = not misfits(regs, static, bound, threads, dyn, optin)
        if got != want:
            sys.exit('launch_fit.py --self-test: %d registers, %d B static, bounds %d, %d threads, '
                     '%d B dynamic, opt-in %d: fits %s, expected %s'
                     % (regs, static, bound, threads, dyn, optin, got, want))
    print('launch_fit.py --self-test: %d cases agree' % len(cases))


# ptxas's "Potential Performance Loss" notes (C75xx: wgmma serialized, ...) fail the stage:
# the build prints no "ptxas info" line, so a kernel that ptxas slowed down would otherwise
# reach the GPU unnoticed. Known ones, each with why it is kept:
KNOWN_LOSSES = {
    '_Z16k_gemm_wgmma_tmaILi1ELi128ELb1EEvPf14CUtensorMap_stS1_PKfS3_iiiiii':
        'the lab\'s "wgmma ovl" (not the backend\'s): its early issue of the next tile leaves '
        'a wgmma in flight past the loop; waiting after the loop spills ~700 B. The lab\'s '
        '"wgmma st" (a shared-memory-staged TMA-store epilogue) is the fix it wanted',
}


def perf_losses(paths):
    """[(mangled, message)] of ptxas's performance-loss notes"""
    out = []
    for p in paths:
        for line in open(p, errors='replace'):
            if 'Potential Performance Loss' in line:
                m = re.search(r"in the function '(\S+)'", line)
                out.append((m.group(1) if m else '?', line.strip()))
    return out


def parse_ptxas(paths):
    """{mangled: {'regs', 'smem', 'spill', 'file'}} from ptxas -v reports"""
    out, cur = {}, None
    for p in paths:
        for line in open(p, errors='replace'):
            m = re.search(r"Compiling entry function '(\S+)' for", line)
            if m:
                cur = out.setdefault(m.group(1), {'regs': 0, 'smem': 0, 'spill': 0,
                                                  'file': os.path.basename(p)})
                continue
            if cur is None:
                continue
            m = re.search(r'(\d+) bytes spill stores', line)
            if m:
                cur['spill'] = int(m.group(1))
            m = re.search(r'Used (\d+) registers', line)
            if m:
                cur['regs'] = int(m.group(1))
                m = re.search(r'(\d+) bytes smem', line)
                cur['smem'] = int(m.group(1)) if m else 0
    return out


def demangle(names):
    r = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                       check=True)
    return dict(zip(names, r.stdout.split('\n')))


def instance_key(demangled):
    """'void k_chain<4>(chain_set, unsigned int*)' -> 'k_chain<4>' (spaces removed)"""
    head = demangled.split('(', 1)[0]
    if head.startswith('void '):
        head = head[5:]
    return head.replace(' ', '')


def launch_bounds(src_dir):
    """{kernel base name: max threads} from __launch_bounds__(N[, ...]) name("""
    text = ''
    for p in sorted(glob.glob(os.path.join(src_dir, '*.cu')) +
                    glob.glob(os.path.join(src_dir, '*.cuh'))):
        text += open(p).read() + '\n'
    defines = dict(re.findall(r'^#define\s+(\w+)\s+(\d+)\b', text, re.M))
    bounds = {}
    for m in re.finditer(r'__launch_bounds__\s*\(', text):
        i, depth = m.end(), 1
        while depth:
            depth += {'(': 1, ')': -1}.get(text[i], 0)
            i += 1
        args = text[m.end():i - 1]
        first = args.split(',', 1)[0].strip()
        name = re.match(r'\s*(\w+)\s*\(', text[i:])
        if not name:
            sys.exit('launch_fit.py: cannot find the kernel after __launch_bounds__(%s)' % args)
        value = first if first.isdigit() else defines.get(first)
        if value is None:
            sys.exit('launch_fit.py: __launch_bounds__(%s) of %s: %s is not a number or a '
                     '#define of one' % (args, name.group(1), first))
        bounds[name.group(1)] = int(value)
    return bounds


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    if len(sys.argv) < 4:
        sys.exit('usage: launch_fit.py LAUNCHES SOURCE_DIR PTXAS...')
    kernels = parse_ptxas(sys.argv[3:])
    if not kernels:
        sys.exit('launch_fit.py: no kernels in the ptxas reports %s' % ' '.join(sys.argv[3:]))
    names = demangle(sorted(kernels))
    by_base = collections.defaultdict(list)
    for mangled, info in kernels.items():
        key = instance_key(names[mangled])
        info['key'] = key
        by_base[key.split('<', 1)[0]].append(info)
    bounds = launch_bounds(sys.argv[2])

    shapes = collections.defaultdict(set)  # kernel as launched -> {(threads, dyn, optin)}
    for line in open(sys.argv[1]) if os.path.exists(sys.argv[1]) else []:
        f = line.rstrip('\n').split('\t')
        if len(f) != 4:
            sys.exit('launch_fit.py: %s: a bad line: %r' % (sys.argv[1], line))
        shapes[f[0]].add((int(f[1]), int(f[2]), int(f[3])))

    if not shapes:
        sys.exit('launch_fit.py: %s holds no launches' % sys.argv[1])
    bad, launched = [], set()
    print('%-34s %7s %5s %7s %8s %7s  %s' % ('kernel (as launched)', 'threads', 'regs',
                                           'static', 'dynamic', 'opt-in', 'regs used of 64 K'))
    for kernel in sorted(shapes):
        base = kernel.split('<', 1)[0]
        inst = [i for i in by_base.get(base, []) if i['key'] == kernel] or by_base.get(base, [])
        if not inst:
            bad.append('%s: launched, but no ptxas report names it' % kernel)
            continue
        launched.add(base)
        regs = max(i['regs'] for i in inst)
        static = max(i['smem'] for i in inst)
        limit = bounds.get(base, 1024)
        for threads, dyn, optin in sorted(shapes[kernel]):
            print('%-34s %7d %5d %7d %8d %7d  %d%%' % (kernel, threads, regs, static, dyn, optin,
                                                    100 * regs_used(regs, threads) //
                                                    REGS_PER_BLOCK))
            bad += ['%s at %d threads: %s' % (kernel, threads, p)
                    for p in misfits(regs, static, limit, threads, dyn, optin)]
    spills = sorted('%s (%d B)' % (i['key'], i['spill']) for i in kernels.values() if i['spill'])
    if spills:
        print('spills (not an error): ' + ', '.join(spills))
    unlaunched = sorted(set(by_base) - launched)
    if unlaunched:
        print('compiled, not launched by these tests: ' + ', '.join(unlaunched))
    print('%d launch shapes of %d kernels against %d compiled instances'
          % (sum(len(s) for s in shapes.values()), len(shapes), len(kernels)))
    for b in bad:
        print('DOES NOT FIT: ' + b)
    lost = 0
    for fn, msg in perf_losses(sys.argv[3:]):
        if fn in KNOWN_LOSSES:
            print('known performance loss (%s): %s' % (KNOWN_LOSSES[fn], msg))
        else:
            print('PERFORMANCE LOSS: ' + msg)
            lost += 1
    return 1 if bad or lost else 0


if __name__ == '__main__':
    sys.exit(main())
