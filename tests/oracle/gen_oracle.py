"""Writes every oracle case (tests/oracle/cases_*.py) as a safetensors file into --out."""
import argparse
import importlib
import os
import pathlib
import sys
import zlib

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from oracle_lib import run_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for old in pathlib.Path(args.out).glob("*.safetensors"):
        old.unlink()
    torch.set_num_threads(1)
    names = set()
    count = 0
    for mod_path in sorted(pathlib.Path(__file__).parent.glob("cases_*.py")):
        mod = importlib.import_module(mod_path.stem)
        for case in mod.CASES:
            if case.name in names:
                raise SystemExit(f"duplicate oracle case name {case.name}")
            names.add(case.name)
            run_case(case, args.out, zlib.crc32(case.name.encode()))
            count += 1
    (pathlib.Path(args.out) / "stamp").write_text(f"{count}\n")
    print(f"oracle: wrote {count} cases to {args.out}")


if __name__ == "__main__":
    main()
