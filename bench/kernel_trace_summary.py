#!/usr/bin/env python3
"""Summarise a kernel trace written by bench/kernel_trace.cpp: GPU time per kernel name (total, count, mean), per
class of kernel, and the copies by direction (count, bytes, time). With --per N the totals are divided by N (the
number of identical calls the traced program made), so they read as one call's. With --gaps N it also prints the
idle time between consecutive GPU activities (kernels and copies), summed by the kernel that precedes each gap, and
the N longest gaps shorter than --max-gap-us (longer ones are the traced program's pauses between calls).

  python3 bench/kernel_trace_summary.py trace.csv --per 12 --top 25 --gaps 20
"""
import argparse
import collections
import csv
import re

# Classes by kernel name, first match wins.
CLASSES = [
    ("attention", re.compile(r"cudnn|fmha|flash|attn|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|sm90_", re.I)),
    ("logprobs", re.compile(r"logprob|lse|softmax", re.I)),
    ("optimizer", re.compile(r"adamw|sum_of_squares|norm_sq|clip", re.I)),
    ("norm", re.compile(r"rmsnorm", re.I)),
]
COPY_KINDS = {1: "host->device", 2: "device->host", 3: "host->array", 8: "device->device", 10: "peer"}


def classify(name):
    return next((c for c, rx in CLASSES if rx.search(name)), "other")


def read_trace(path):
    """The trace's rows as (kind, start_ns, end_ns, row): kind "kernel" (row[6] the name) or "memcpy" (row[4] the
    copy kind, row[5] the bytes)."""
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) >= 7 and row[0] in ("kernel", "memcpy"):
                yield row[0], int(row[1]), int(row[2]), row


def copy_totals(acts):
    """Copies by direction: {direction: [count, bytes, ms]}."""
    copies = collections.defaultdict(lambda: [0, 0, 0.0])
    for kind, start, end, row in acts:
        if kind == "memcpy":
            c = copies[COPY_KINDS.get(int(row[4]), row[4])]
            c[0] += 1
            c[1] += int(row[5])
            c[2] += (end - start) / 1e6
    return copies


def short_name(name):
    return re.sub(r"\(.*$", "", name)[:110]


def print_gaps(acts, per, top, max_gap_us):
    """Idle time between consecutive activities of the trace (sorted by start), per preceding kernel and longest."""
    acts = sorted((start, end, short_name(row[6]) if kind == "kernel" else "memcpy kind %s" % row[4])
                  for kind, start, end, row in acts)
    gaps, by_prev = [], collections.defaultdict(lambda: [0.0, 0])
    busy_until = None
    prev = None
    for start, end, name in acts:
        if busy_until is not None and start > busy_until:
            us = (start - busy_until) / 1e3
            if us < max_gap_us:
                gaps.append((us, prev, name))
                by_prev[prev][0] += us
                by_prev[prev][1] += 1
        if busy_until is None or end > busy_until:
            busy_until, prev = end, name
    total = sum(g[0] for g in gaps)
    print("idle between activities: %.3f ms per call over %.0f gaps (gaps >= %.0f us left out)"
          % (total / 1e3 / per, len(gaps) / per, max_gap_us))
    print("idle after each kernel (us per call, gaps per call):")
    for name, (us, count) in sorted(by_prev.items(), key=lambda kv: -kv[1][0])[:top]:
        print("  %9.1f %6.1f  %s" % (us / per, count / per, name))
    print("longest gaps (us, before -> after):")
    for us, before, after in sorted(gaps, reverse=True)[:top]:
        print("  %9.1f  %s -> %s" % (us, before, after))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--per", type=float, default=1.0, help="divide totals by this many calls")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--gaps", type=int, default=0, help="also list the idle time between activities (this many rows)")
    p.add_argument("--max-gap-us", type=float, default=5000.0,
                   help="gaps at least this long are pauses between calls, left out of --gaps")
    a = p.parse_args()
    if a.per <= 0 or a.gaps < 0 or a.max_gap_us <= 0:
        p.error("--per and --max-gap-us must be > 0 and --gaps >= 0 (got %g, %g, %d)" % (a.per, a.max_gap_us, a.gaps))
    by_name = collections.defaultdict(lambda: [0.0, 0])
    by_class = collections.defaultdict(float)
    first, last = None, None
    try:
        acts = list(read_trace(a.trace))
    except OSError as e:
        p.error("cannot read the trace %s: %s" % (a.trace, e.strerror or e))
    for kind, start, end, row in acts:
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
        if kind == "kernel":
            ms = (end - start) / 1e6
            short = short_name(row[6])
            by_name[short][0] += ms
            by_name[short][1] += 1
            by_class[classify(row[6])] += ms
    copies = copy_totals(acts)
    n = a.per
    total = sum(v[0] for v in by_name.values())
    print("kernel time %.3f ms per call (%.0f kernels), trace span %.1f ms in all"
          % (total / n, sum(v[1] for v in by_name.values()) / n, ((last or 0) - (first or 0)) / 1e6))
    for cls, ms in sorted(by_class.items(), key=lambda kv: -kv[1]):
        print("  %-10s %9.3f ms  %5.1f%%" % (cls, ms / n, 100 * ms / max(total, 1e-12)))
    print("top kernels (ms per call, launches per call, mean us):")
    for name, (ms, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print("  %8.3f %6.1f %9.1f  %s" % (ms / n, count / n, 1e3 * ms / count, name))
    for kind, (count, nbytes, ms) in sorted(copies.items()):
        print("copies %-15s %6.1f per call, %12.0f bytes per call, %.3f ms per call" % (kind, count / n, nbytes / n, ms / n))
    if a.gaps > 0:
        print_gaps(acts, n, a.gaps, a.max_gap_us)


if __name__ == "__main__":
    main()
