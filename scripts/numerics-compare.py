#!/usr/bin/env python3
"""Compares two numerics traces (scripts/numerics-trace.sh). For every process key (its command line) found
in both, the ordered list of value records (what, bytes, hash: CPU outputs and state, Vulkan downloads) must
be equal. The SPIR-V records ("vk.spirv", one per compiled kernel) are compared on their own and reported:
kernels may change where values do not (a generator rewritten with the same arithmetic).

  scripts/numerics-compare.py BEFORE_DIR AFTER_DIR [--show N]
Exits 1 on any value difference in a key both runs have.
"""
import collections
import os
import sys


def load(d):
    runs = collections.defaultdict(list)
    for name in sorted(os.listdir(d)):
        if not name.endswith(".trace"):
            continue
        with open(os.path.join(d, name)) as f:
            lines = f.read().splitlines()
        if not lines or not lines[0].startswith("key "):
            continue
        # Processes with the same key (a script running the same command twice) are kept in pid order.
        runs[lines[0][4:]].append((int(name.split(".")[0]), lines[1:]))
    out = {}
    for k, procs in runs.items():
        recs = [r for _, v in sorted(procs) for r in v]
        out[k] = ([r for r in recs if not r.startswith("vk.spirv ")], [r for r in recs if r.startswith("vk.spirv ")])
    return out


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    show = int(sys.argv[sys.argv.index("--show") + 1]) if "--show" in sys.argv else 20
    a, b = load(sys.argv[1]), load(sys.argv[2])
    common = sorted(set(a) & set(b))
    bad, records, spirv_diff, spirv_compared = 0, 0, 0, 0
    for k in common:
        (va, sa), (vb, sb) = a[k], b[k]
        records += len(va)
        if va != vb:
            bad += 1
            if bad <= show:
                n = first_diff(va, vb)
                print(f"VALUES DIFFER {k}\n  {len(va)} vs {len(vb)} records; first difference at record {n}: "
                      f"{va[n] if n < len(va) else '-'} | {vb[n] if n < len(vb) else '-'}")
        if sa and sb:
            spirv_compared += 1
            if sa != sb:
                spirv_diff += 1
                if spirv_diff <= show:
                    print(f"kernels differ {k}: {len(sa)} vs {len(sb)} kernels, "
                          f"{len(set(sa) ^ set(sb))} distinct SPIR-V hashes not in both")
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    for k in only_a[:show]:
        print(f"only before: {k} ({len(a[k][0])} records)")
    for k in only_b[:show]:
        print(f"only after: {k} ({len(b[k][0])} records)")
    print(f"{len(common)} processes in both ({records} value records): {bad} differ in values; "
          f"kernels compared in {spirv_compared}, differ in {spirv_diff}; "
          f"{len(only_a)} only before, {len(only_b)} only after")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
