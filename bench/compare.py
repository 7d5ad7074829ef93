"""Compare step of the benchmark harness: reads the JSON lines of `mgn bench` and bench/pytorch/*.py and
their gate outputs (safetensors: logits, loss, every gradient, every parameter after one step), applies the
correctness gates (PyTorch strict eager is the reference) and writes one markdown table:
workload x batch x phase x mode: ours, PyTorch eager, PyTorch compiled (median ms), ratios, gate verdict.
Exits 1 when a gate fails (or, with --require-gates, when a workload has no pair of outputs to check).

  python3 bench/compare.py --out table.md mgn.jsonl torch.jsonl mgn_out.safetensors torch_out.safetensors
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch"))
import safetensors_lite  # noqa: E402

# Tolerances per mode of our run. Strict: f32 everywhere on both sides, so only summation order differs.
# Accelerated: the paper's gates (docs/benchmarks.md), for f16 inputs with f32 accumulation.
TOLERANCES = {
    "strict": {"logits": 1e-3, "loss": 1e-4, "grad": 1e-3, "step": 1e-3},
    "accelerated": {"logits": 1e-2, "loss": 1e-2, "grad": 5e-2, "step": 1e-2},
}
PHASES = ["compile (cold)", "compile", "inference", "flb", "step"]
PHASE_GATES = {"inference": ["logits"], "flb": ["loss", "grad"], "step": ["step"]}


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    d, n = np.linalg.norm(a - b), np.linalg.norm(b)
    return 0.0 if d == 0 else d / max(n, 1e-30)


class Gate:
    """Every check of one (workload, batch, our mode) pair of output files."""

    def __init__(self, ours_path, ref_path):
        self.ours, self.ours_meta = safetensors_lite.read(ours_path)
        self.ref, self.ref_meta = safetensors_lite.read(ref_path)
        self.mode = self.ours_meta.get("mode", "strict")
        tol = TOLERANCES[self.mode]
        self.checks = []  # (group, name, value, tolerance, passed, note)
        o, r = self.ours, self.ref

        def check(group, name, value, limit, note=""):
            self.checks.append((group, name, value, limit, bool(value <= limit), note))

        # Same inputs: both sides must have read the same images and labels.
        for k in ("input.x", "input.labels"):
            same = k in o and k in r and o[k].shape == r[k].shape and np.array_equal(o[k], r[k])
            check("inputs", k, 0.0 if same else math.inf, 0.0, "identical" if same else "differ")
        if self.ours_meta.get("lr") and self.ref_meta.get("lr"):
            same = float(self.ours_meta["lr"]) == float(self.ref_meta["lr"])
            check("inputs", "lr", 0.0 if same else math.inf, 0.0, f"{self.ours_meta['lr']} vs {self.ref_meta['lr']}")

        same_shape = o["logits"].shape == r["logits"].shape
        check("logits", "logits", rel_l2(o["logits"], r["logits"]) if same_shape else math.inf, tol["logits"],
              f"shape {list(o['logits'].shape)}" + ("" if same_shape else f" vs {list(r['logits'].shape)}"))
        lo, lr_ = np.asarray(o["loss"]).reshape(-1), np.asarray(r["loss"]).reshape(-1)
        if lo.size == 1 and lr_.size == 1:
            check("loss", "loss", abs(float(lo[0]) - float(lr_[0])) / max(abs(float(lr_[0])), 1e-30),
                  tol["loss"], f"{float(lo[0]):.7f} vs {float(lr_[0]):.7f}")
        else:
            check("loss", "loss", math.inf, tol["loss"], f"loss holds {lo.size} vs {lr_.size} values (want 1)")

        ours_params = sorted(k[5:] for k in o if k.startswith("grad."))
        ref_params = sorted(k[5:] for k in r if k.startswith("grad."))
        same_names = ours_params == ref_params
        check("grad", "parameter names", 0.0 if same_names else math.inf, 0.0,
              f"{len(ours_params)} parameters" if same_names else f"{ours_params} vs {ref_params}")
        for p in ref_params:
            if p not in ours_params:
                continue
            ok = o["grad." + p].shape == r["grad." + p].shape
            check("grad", "grad." + p, rel_l2(o["grad." + p], r["grad." + p]) if ok else math.inf, tol["grad"])
        gn_o = math.sqrt(sum(float(np.sum(np.square(o["grad." + p], dtype=np.float64))) for p in ours_params))
        gn_r = math.sqrt(sum(float(np.sum(np.square(r["grad." + p], dtype=np.float64))) for p in ref_params))
        check("grad", "total gradient norm", abs(gn_o - gn_r) / max(gn_r, 1e-30), tol["grad"],
              f"{gn_o:.6g} vs {gn_r:.6g}")

        so, sr = np.asarray(o["step.loss"]).reshape(-1), np.asarray(r["step.loss"]).reshape(-1)
        if so.size == 1 and sr.size == 1:
            check("step", "step.loss", abs(float(so[0]) - float(sr[0])) / max(abs(float(sr[0])), 1e-30), tol["loss"])
        else:
            check("step", "step.loss", math.inf, tol["loss"], f"holds {so.size} vs {sr.size} values (want 1)")
        for p in ref_params:
            k = "step." + p
            if k in o:
                ok = o[k].shape == r[k].shape
                check("step", k, rel_l2(o[k], r[k]) if ok else math.inf, tol["step"])
            else:
                check("step", k, math.inf, tol["step"], "missing on our side")

    def verdict(self, groups):
        rows = [c for c in self.checks if c[0] in groups or c[0] == "inputs"]
        bad = [c for c in rows if not c[4]]
        worst = max((c[2] for c in rows if c[0] != "inputs"), default=0.0)
        if bad:
            return f"**FAIL** ({', '.join(c[1] for c in bad[:3])})"
        return f"pass (max {worst:.1e})"

    def passed(self):
        return all(c[4] for c in self.checks)


def fmt_ms(v):
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 1000 else f"{v:.0f}"


def fmt_ratio(a, b):
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help=".jsonl timing files and .safetensors gate outputs")
    ap.add_argument("--out", help="write the markdown here (it always goes to stdout)")
    ap.add_argument("--require-gates", action="store_true", help="fail when a workload has no outputs to gate")
    args = ap.parse_args()

    records, outputs = [], {}
    for path in args.files:
        if path.endswith(".jsonl"):
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
        elif path.endswith(".safetensors"):
            _, meta = safetensors_lite.read(path)
            key = (meta.get("workload"), int(meta.get("batch", 0)))
            outputs.setdefault(key, {})[meta.get("side")] = path
        else:
            sys.exit(f"compare.py: {path}: expected a .jsonl or .safetensors file")

    gates = {}
    for key, sides in sorted(outputs.items()):
        if "mgn" in sides and "torch" in sides:
            gates[key] = Gate(sides["mgn"], sides["torch"])

    # (workload, batch, phase, mode, impl) -> record; ours may lack an accelerated run.
    cell = {}
    for r in records:
        impl = "ours" if r["side"] == "mgn" else r["impl"]
        phase = "compile (cold)" if r["phase"] == "compile" and r.get("cache") == "cold" else r["phase"]
        cell[(r["workload"], r["batch"], phase, r["mode"], impl)] = r
    keys = sorted({(r["workload"], r["batch"]) for r in records} | set(outputs))
    modes = [m for m in ("strict", "accelerated") if any(r["mode"] == m for r in records)]

    lines = []
    envs = sorted({f"{r['side']}: {r.get('backend', '?')} / {r.get('device', '?')}" +
                   (f", torch {r['torch']}" if r.get("torch") else "") for r in records})
    lines += ["Devices: " + "; ".join(envs) + ".", ""]
    lines += ["Median wall time per synchronized call in ms (IQR in the JSON). Ratio = ours ÷ PyTorch "
              "(below 1: ours faster). Compile: our graph build + compile() of the inference, F+L+B and "
              "training sessions (cold: empty shader and pipeline caches) vs the first calls of the "
              "torch.compile'd phases.", ""]
    lines += ["| workload | batch | phase | mode | ours | torch eager | torch compiled | ours/eager | "
              "ours/compiled | gate |", "|---|---|---|---|---|---|---|---|---|---|"]
    notes = set()
    for (w, b) in keys:
        for phase in PHASES:
            for mode in modes:
                ours = cell.get((w, b, phase, mode, "ours"))
                if ours is None and mode == "accelerated":
                    ours = cell.get((w, b, phase, "strict", "ours"))
                    if ours is not None:
                        notes.add("† our strict run: mgn has no accelerated (f16) path yet.")
                eager = cell.get((w, b, phase, mode, "eager"))
                comp = cell.get((w, b, phase, mode, "compiled"))
                if not (ours or eager or comp):
                    continue
                o = ours["median_ms"] if ours else None
                e = eager["median_ms"] if eager else None
                c = comp["median_ms"] if comp else None
                mark = "†" if ours and ours["mode"] != mode else ""
                g = gates.get((w, b))
                verdict = "—"
                if g and phase in PHASE_GATES and (g.mode == mode or (mark and g.mode == "strict")):
                    verdict = g.verdict(PHASE_GATES[phase])
                lines.append(f"| {w} | {b} | {phase} | {mode} | {fmt_ms(o)}{mark} | {fmt_ms(e)} | {fmt_ms(c)} | "
                             f"{fmt_ratio(o, e)} | {fmt_ratio(o, c)} | {verdict} |")
    lines += [""] + sorted(notes) + ([""] if notes else [])

    failed = False
    for (w, b), g in gates.items():
        lines += [f"Gates, {w} batch {b} (ours {g.mode} vs PyTorch strict eager on {g.ref_meta.get('device', '?')}):",
                  "", "| check | value | limit | verdict | note |", "|---|---|---|---|---|"]
        for group, name, value, limit, ok, note in g.checks:
            lines.append(f"| {name} | {value:.2e} | {limit:.0e} | {'pass' if ok else '**FAIL**'} | {note} |")
        lines.append("")
        failed |= not g.passed()
    for key in keys:
        if key not in gates:
            lines += [f"No gate for {key[0]} batch {key[1]}: both sides' --outputs files are needed.", ""]
            failed |= args.require_gates

    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if failed:
        print("compare.py: a correctness gate failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
