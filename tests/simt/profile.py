#!/usr/bin/env python3
"""profile.py - sums the emulator's launch profile (WICK_SIMT_PROFILE=FILE, simt_runtime.cpp)
by kernel.

  profile.py RUN [--skip K | --minus BASE] [--per N]

RUN and BASE are profile files, a launch a line in the order they ran. --skip K leaves out
RUN's first K launches; --minus BASE leaves out as many as BASE has (BASE: the same command
stopped earlier, as `wick generate -n 1` is to `-n 4` of the same prompt, whose launches past
the first run's are three decode steps without the prefill). --per N divides the sums by N
(per step).

Per kernel: its launches, its blocks a launch, the work (every emulated thread's busy time,
summed: where the emulator's CPU time went), the serial time (each launch's blocks' busiest
threads, summed over the blocks and divided by the blocks a GPU holds at once, BLOCKS_AT_ONCE
below, at least one block's worth: a rough critical path), and the median over its launches
of a launch's busiest thread (the median: a turn that the OS stopped for another process
counts that time, so a launch's maximum can be the machine's noise). These are the emulator's
times on a CPU, not a GPU's: they rank kernels, and a kernel whose busiest thread runs far
longer than the others' is one whose serial path (a loop in a thread, a few blocks doing
everything) a GPU cannot spread either.
"""
import argparse
import collections
import statistics
import sys

# blocks resident on an H200 at once, taken as 132 multiprocessors x 2: a rough figure, so
# that a launch of a few long blocks counts as long and one of thousands of short ones does not
BLOCKS_AT_ONCE = 264


def count(path):
    with open(path) as f:
        return sum(1 for _ in f)


def read(path, skip):
    """kernel -> [launches, blocks, work us, serial us, [each launch's busiest us]], of the
    launches past the first skip"""
    sums = collections.defaultdict(lambda: [0, 0, 0.0, 0.0, []])
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if n <= skip:
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 6:
                sys.exit(f"profile.py: {path}:{n}: not a WICK_SIMT_PROFILE line")
            kernel = parts[0]
            try:
                blocks, _threads = int(parts[1]), int(parts[2])
                work, serial, busiest = (float(x) for x in parts[3:])
            except ValueError:
                sys.exit(f"profile.py: {path}:{n}: a field that is not a number")
            s = sums[kernel]
            s[0] += 1
            s[1] += blocks
            s[2] += work
            # the blocks' busiest threads, in waves of BLOCKS_AT_ONCE; never less than the
            # busiest block
            s[3] += max(serial / BLOCKS_AT_ONCE, busiest) if blocks else 0.0
            s[4].append(busiest)
    return sums


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--skip", type=int, default=0, metavar="K")
    how.add_argument("--minus", metavar="BASE")
    ap.add_argument("--per", type=float, default=1.0, metavar="N")
    a = ap.parse_args()
    if a.per <= 0 or a.skip < 0:
        sys.exit("profile.py: --per wants a positive number, --skip one >= 0")
    try:
        skip = count(a.minus) if a.minus else a.skip
        run = read(a.run, skip)
    except OSError as e:
        sys.exit(f"profile.py: {e.filename}: {e.strerror}")
    rows = [(k, v) for k, v in run.items() if v[0] > 0]
    if not rows:
        sys.exit("profile.py: no launches left")
    work_all = sum(v[2] for _, v in rows)
    serial_all = sum(v[3] for _, v in rows)
    rows.sort(key=lambda kv: -kv[1][3])
    p = a.per
    print(f"{'kernel':28s} {'launches':>8s} {'blocks':>8s} {'work ms':>9s} {'share':>6s} "
          f"{'serial ms':>9s} {'share':>6s} {'busiest us':>10s}")
    print(f"{'':28s} {'':8s} {'a launch':>8s} {'':16s} {'':16s} {'median':>10s}")
    for k, (n, blocks, work, serial, busiest) in rows:
        print(f"{k[:28]:28s} {n / p:8.1f} {blocks / n:8.0f} {work / p / 1e3:9.2f} "
              f"{100 * work / work_all:5.1f}% {serial / p / 1e3:9.3f} "
              f"{100 * serial / serial_all:5.1f}% {statistics.median(busiest):10.1f}")
    print(f"{'sum':28s} {sum(v[0] for _, v in rows) / p:8.1f} {'':8s} "
          f"{work_all / p / 1e3:9.2f} {'':6s} {serial_all / p / 1e3:9.3f}")


if __name__ == "__main__":
    main()
