#!/usr/bin/env python3
"""Compares two numerics traces (scripts/numerics-trace.sh): for every process key (its command line) found
in both, the ordered list of (what, bytes, hash) records must be equal. Prints each difference and a
summary; exits 1 on any difference in a key both runs have.

  scripts/numerics-compare.py BEFORE_DIR AFTER_DIR
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
    return {k: [r for _, v in sorted(procs) for r in v] for k, procs in runs.items()}


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    common = sorted(set(a) & set(b))
    bad = 0
    records = 0
    for k in common:
        records += len(a[k])
        if a[k] != b[k]:
            bad += 1
            n = next((i for i, (x, y) in enumerate(zip(a[k], b[k])) if x != y), min(len(a[k]), len(b[k])))
            print(f"DIFF {k}\n  {len(a[k])} vs {len(b[k])} records; first difference at record {n}: "
                  f"{a[k][n] if n < len(a[k]) else '-'} | {b[k][n] if n < len(b[k]) else '-'}")
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    for k in only_a:
        print(f"only before: {k} ({len(a[k])} records)")
    for k in only_b:
        print(f"only after: {k} ({len(b[k])} records)")
    print(f"{len(common)} processes in both ({records} records): {bad} differ; "
          f"{len(only_a)} only before, {len(only_b)} only after")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
