"""Compare step of the benchmark harness: reads the JSON lines of `mgn bench` and bench/pytorch/*.py and
their gate outputs (safetensors: logits, loss, every gradient, every parameter after one step), applies the
correctness gates (PyTorch strict eager is the reference) and writes one markdown table:
workload x batch x phase x mode: ours, PyTorch eager, eager + CUDA graph, compiled (median ms), ratios against eager
and against the best PyTorch variant, gate verdict.
Exits 1 when a gate fails (or, with --require-gates, when a workload has no pair of outputs to check).
Where the reference file also holds the float64 tensors of the same model (`f64.*`, resnet_bench.py
--f64-reference), a second gate "vs exact (f64)" measures both sides against them (docs/benchmarks.md).

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
# Microbenchmarks (attention, conv): every output tensor of a case, relative L2 against PyTorch strict.
MICRO_TOLERANCE = {"strict": 1e-4, "accelerated": 1e-2}
PHASES = ["compile (cold)", "compile", "inference", "minimal", "flb", "step"]
PHASE_GATES = {"inference": ["logits"], "minimal": ["minimal"], "flb": ["loss", "grad"], "step": ["step"]}
MEMORY_PHASES = ["inference", "minimal", "flb", "step"]


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    d, n = np.linalg.norm(a - b), np.linalg.norm(b)
    return 0.0 if d == 0 else d / max(n, 1e-30)


def rel_scalar(a, b):
    """Relative error of a one-value tensor (a loss) against b; inf unless both hold one value."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    if a.size != 1 or b.size != 1:
        return math.inf
    return abs(float(a[0]) - float(b[0])) / max(abs(float(b[0])), 1e-30)


def grad_norm(tensors, names, prefix="grad."):
    return math.sqrt(sum(float(np.sum(np.square(tensors[prefix + p], dtype=np.float64))) for p in names))


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

        # Same inputs: both sides must have read (or computed) the same images / token ids and labels.
        input_keys = sorted(k for k in set(o) | set(r) if k.startswith("input."))
        if not input_keys:
            check("inputs", "inputs", math.inf, 0.0, "no input.* tensors on either side")
        for k in input_keys:
            same = k in o and k in r and o[k].shape == r[k].shape and np.array_equal(o[k], r[k])
            check("inputs", k, 0.0 if same else math.inf, 0.0,
                  "identical" if same else "missing on one side" if (k not in o or k not in r) else "differ")
        if self.ours_meta.get("lr") and self.ref_meta.get("lr"):
            same = float(self.ours_meta["lr"]) == float(self.ref_meta["lr"])
            check("inputs", "lr", 0.0 if same else math.inf, 0.0, f"{self.ours_meta['lr']} vs {self.ref_meta['lr']}")

        same_shape = o["logits"].shape == r["logits"].shape
        check("logits", "logits", rel_l2(o["logits"], r["logits"]) if same_shape else math.inf, tol["logits"],
              f"shape {list(o['logits'].shape)}" + ("" if same_shape else f" vs {list(r['logits'].shape)}"))
        # The minimal phase (one decode token with the KV cache): against PyTorch's full forward, no cache.
        if "minimal.logits" in o or "minimal.logits" in r:
            ok = "minimal.logits" in o and "minimal.logits" in r and o["minimal.logits"].shape == r["minimal.logits"].shape
            check("minimal", "minimal.logits", rel_l2(o["minimal.logits"], r["minimal.logits"]) if ok else math.inf,
                  tol["logits"], f"shape {list(o['minimal.logits'].shape)}" if ok else "missing or shapes differ")
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
        gn_o, gn_r = grad_norm(o, ours_params), grad_norm(r, ref_params)
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
        # State after the step that has no gradient (BatchNorm's running statistics).
        for k in sorted(k for k in r if k.startswith("step.") and k != "step.loss" and k[5:] not in ref_params):
            ok = k in o and o[k].shape == r[k].shape
            check("step", k, rel_l2(o[k], r[k]) if ok else math.inf, tol["step"], "" if k in o else "missing on our side")

        # The exact reference: the same PyTorch model in float64 ("f64.<name>", resnet_bench.py --f64-reference).
        self.exact = []  # (group, name, ours vs torch f32, torch f32 vs f64, ours vs f64, limit, passed)
        if any(k.startswith("f64.") for k in r):
            self.exact_checks(tol, ref_params)

    def exact_checks(self, tol, ref_params):
        """Per tensor: ours vs PyTorch f32 (the gate above), PyTorch f32 vs f64 (PyTorch's own f32 error, the noise
        floor), ours vs f64; pass when ours vs f64 <= max(the limit, 2 x PyTorch f32 vs f64)."""
        o, r = self.ours, self.ref
        groups = {"logits": "logits", "minimal.logits": "minimal", "loss": "loss", "step.loss": "step"}

        def add(group, name, ours_ref, ref_exact, ours_exact, limit):
            limit = max(limit, 2 * ref_exact)
            self.exact.append((group, name, ours_ref, ref_exact, ours_exact, limit, bool(ours_exact <= limit)))

        def tensor(k):
            if k not in r or "f64." + k not in r:
                return
            group = groups.get(k, k.split(".", 1)[0])
            scalar = k.endswith("loss")

            def err(a, b):
                if a is None:
                    return math.inf
                return rel_scalar(a, b) if scalar else rel_l2(a, b) if np.shape(a) == np.shape(b) else math.inf
            add(group, k, err(o.get(k), r[k]), err(r[k], r["f64." + k]), err(o.get(k), r["f64." + k]),
                tol["loss"] if scalar else tol["logits"] if group == "minimal" else tol[group])

        for k in ["logits", "minimal.logits", "loss"] + ["grad." + p for p in ref_params]:
            tensor(k)
        if ref_params and all("f64.grad." + p in r and "grad." + p in o for p in ref_params):
            gn_o, gn_r, gn_x = grad_norm(o, ref_params), grad_norm(r, ref_params), grad_norm(r, ref_params, "f64.grad.")
            add("grad", "total gradient norm", abs(gn_o - gn_r) / max(gn_r, 1e-30), abs(gn_r - gn_x) / max(gn_x, 1e-30),
                abs(gn_o - gn_x) / max(gn_x, 1e-30), tol["grad"])
        for k in ["step.loss"] + sorted(k for k in r if k.startswith("step.") and k != "step.loss"):
            tensor(k)

    def exact_verdict(self, groups):
        rows = [c for c in self.exact if c[0] in groups]
        if not rows:
            return "—"
        bad = [c for c in rows if not c[6]]
        if bad:
            return f"**FAIL** ({', '.join(c[1] for c in bad[:3])})"
        return f"pass (max {max(c[4] for c in rows):.1e})"

    def exact_rows(self):
        """The markdown of the gate vs exact (f64): every tensor's three errors and a summary line."""
        out = ["| check | ours vs torch f32 | torch f32 vs f64 | ours vs f64 | limit | verdict |",
               "|---|---|---|---|---|---|"]
        for group, name, ours_ref, ref_exact, ours_exact, limit, ok in self.exact:
            out.append(f"| {name} | {ours_ref:.2e} | {ref_exact:.2e} | {ours_exact:.2e} | {limit:.1e} | "
                       f"{'pass' if ok else '**FAIL**'} |")
        worst_o = max(self.exact, key=lambda c: c[4])
        worst_r = max(self.exact, key=lambda c: c[3])
        bad = [c for c in self.exact if not c[6]]
        grads = [c for c in self.exact if c[1].startswith("grad.") and c[3] > 0]
        ratio = (f"; over the {len(grads)} gradient tensors the median of ours vs f64 ÷ PyTorch f32 vs f64 is "
                 f"{float(np.median([c[4] / c[3] for c in grads])):.2f}" if grads else "")
        out += ["", f"Gate vs exact (f64): ours vs f64 worst {worst_o[4]:.2e} ({worst_o[1]}), PyTorch f32 vs f64 "
                f"worst {worst_r[3]:.2e} ({worst_r[1]}){ratio}; "
                + (f"**{len(bad)} of {len(self.exact)} FAIL**." if bad else f"all {len(self.exact)} pass.")]
        return out

    def verdict(self, groups):
        rows = [c for c in self.checks if c[0] in groups or c[0] == "inputs"]
        bad = [c for c in rows if not c[4]]
        worst = max((c[2] for c in rows if c[0] != "inputs"), default=0.0)
        if bad:
            return f"**FAIL** ({', '.join(c[1] for c in bad[:3])})"
        return f"pass (max {worst:.1e})"

    def passed(self):
        return all(c[4] for c in self.checks) and all(c[6] for c in self.exact)


class MicroGate:
    """Every tensor of one microbenchmark workload's pair of files: the inputs ("<case>.input.<name>") must be
    identical, every output ("<case>.<phase>.<name>") within MICRO_TOLERANCE in relative L2."""

    def __init__(self, ours_path, ref_path):
        o, self.ours_meta = safetensors_lite.read(ours_path)
        r, self.ref_meta = safetensors_lite.read(ref_path)
        self.mode = self.ours_meta.get("mode", "strict")
        limit = MICRO_TOLERANCE[self.mode]
        self.checks = {}  # (case, phase or "input") -> [(name, value, limit, passed, note)]
        for k in sorted(set(o) | set(r)):
            case, rest = k.split(".", 1)
            phase = rest.split(".", 1)[0]
            if k not in o or k not in r:
                row = (k, math.inf, 0.0 if phase == "input" else limit, False, "missing on one side")
            elif phase == "input":
                same = o[k].shape == r[k].shape and np.array_equal(o[k], r[k])
                row = (k, 0.0 if same else math.inf, 0.0, same, "identical" if same else "differ")
            else:
                ok = o[k].shape == r[k].shape
                v = rel_l2(o[k], r[k]) if ok else math.inf
                row = (k, v, limit, bool(v <= limit), f"shape {list(o[k].shape)}" if ok else "shapes differ")
            self.checks.setdefault((case, phase), []).append(row)

    def verdict(self, case, phase):
        rows = self.checks.get((case, phase), [])
        if not rows:
            return "—"
        rows = rows + self.checks.get((case, "input"), [])
        bad = [c for c in rows if not c[3]]
        if bad:
            return f"**FAIL** ({', '.join(c[0] for c in bad[:3])})"
        return f"pass ({max(c[1] for c in rows):.1e})"

    def passed(self):
        return all(c[3] for rows in self.checks.values() for c in rows)


def gate_rows(checks, per_tensor_limit=16):
    """Markdown rows of a gate's checks; a group with many per-tensor rows (a 30-layer model has 272 gradients)
    shows one summary row, its worst tensor, and every failing tensor."""
    def row(name, value, limit, ok, note):
        return f"| {name} | {value:.2e} | {limit:.0e} | {'pass' if ok else '**FAIL**'} | {note} |"

    out = []
    tensors = {}
    for group, name, value, limit, ok, note in checks:
        if name.startswith(("grad.", "step.")) and name != "step.loss":
            tensors.setdefault(name.split(".", 1)[0], []).append((name, value, limit, ok, note))
    summarized = {k for k, v in tensors.items() if len(v) > per_tensor_limit}
    done = set()
    for group, name, value, limit, ok, note in checks:
        prefix = name.split(".", 1)[0]
        if prefix in summarized and name.startswith(("grad.", "step.")) and name != "step.loss":
            if prefix not in done:
                done.add(prefix)
                rows = tensors[prefix]
                worst = max(rows, key=lambda r: r[1])
                bad = [r for r in rows if not r[3]]
                out.append(row(f"{prefix}.* ({len(rows)} tensors, worst)", worst[1], worst[2], not bad,
                               worst[0] + (f"; {len(bad)} over the limit" if bad else "; every tensor within")))
                out += [row(*r) for r in bad]
            continue
        out.append(row(name, value, limit, ok, note))
    return out


def fmt_ms(v):
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 1000 else f"{v:.0f}"


def fmt_ratio(a, b):
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def fmt_mib(v):
    return "—" if v is None else f"{v / 2**20:.1f}"


def gemm_records(r):
    """A line of `mgn bench-gemm` or bench/pytorch/gemm.py, as microbenchmark records. Modes: strict (f32 on
    both sides), accelerated (ours --f16 next to cuBLAS with TF32, PyTorch's accelerated mode) and f16 (ours
    --f16 next to cuBLAS with f16 inputs, the like-for-like tensor-core figure): our f16 line serves both."""
    m, n, k = r["m"], r["n"], r["k"]
    if r["side"] == "mgn":
        modes = ["accelerated", "f16"] if r.get("precision") == "f16" else ["strict"]
    else:
        modes = [{"tf32": "accelerated"}.get(r.get("mode", "strict"), r.get("mode", "strict"))]
    return [dict(r, workload="gemm", case=f"{m}x{n}x{k}", phase="matmul", mode=mode,
                 impl="mgn" if r["side"] == "mgn" else r.get("impl", "cublas"), flop=2.0 * m * n * k)
            for mode in modes]


FALLBACK_NOTE = ("† our strict run: our accelerated mode was not run for this row (its matmuls would use f16 "
                 "where the device passes the self-test).")


def micro_tables(micro, micro_gates, notes):
    """The microbenchmark table: ours vs PyTorch per case and phase, TFLOP/s from the same FLOP count."""
    lines = ["Microbenchmarks: median ms per synchronized call (IQR), TFLOP/s from the same FLOP count on both "
             "sides (attention: 4·B·Hq·S²·D/2 causal forward, 3.5× for forward + backward; conv: 2·N·Cout·Ho·Wo·Cin·k² "
             "per phase; GEMM: 2·M·N·K); ratio = ours ÷ PyTorch time (below 1: ours faster); check: relative L2 of "
             "every output against PyTorch strict on the same inputs.", "",
             "| workload | case | phase | mode | ours ms (IQR) | torch ms (IQR) | ours TFLOP/s | torch TFLOP/s | "
             "ours/torch | check |", "|---|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in micro:
        key = (r["workload"], r["case"], r["phase"])
        if key not in keys:
            keys.append(key)
    modes = [m for m in ("strict", "accelerated", "f16") if any(r["mode"] == m for r in micro)]

    def pick(w, c, p, mode, side):
        for r in micro:
            if (r["workload"], r["case"], r["phase"], r["mode"], r["side"]) == (w, c, p, mode, side):
                return r
        return None

    def ms_iqr(r):
        if r is None:
            return "—"
        iqr = r.get("iqr_ms")
        return fmt_ms(r["median_ms"]) + ("" if iqr is None else f" ({fmt_ms(iqr)})")

    def tflops(r):
        return "—" if r is None else f"{r['flop'] / (r['median_ms'] * 1e-3) / 1e12:.3g}"

    for (w, c, p) in keys:
        for mode in modes:
            ours = pick(w, c, p, mode, "mgn")
            mark = ""
            if ours is None and mode == "accelerated":
                ours = pick(w, c, p, "strict", "mgn")
                mark = "†" if ours else ""
                if mark:
                    notes.add(FALLBACK_NOTE)
            theirs = pick(w, c, p, mode, "torch")
            if ours is None and theirs is None:
                continue
            g = micro_gates.get((w, "strict" if mark else mode))
            verdict = g.verdict(c, p) if g else "—"
            lines.append(f"| {w} | {c} | {p} | {mode} | {ms_iqr(ours)}{mark} | {ms_iqr(theirs)} | {tflops(ours)} | "
                         f"{tflops(theirs)} | {fmt_ratio(ours and ours['median_ms'], theirs and theirs['median_ms'])} | "
                         f"{verdict} |")
    return lines + [""]


def memory_table(cell, keys):
    """Planned and measured memory of our sessions next to PyTorch's peak, per phase (strict runs)."""
    rows = []
    for (w, b) in keys:
        for phase in MEMORY_PHASES:
            ours = cell.get((w, b, phase, "strict", "ours"))
            eager = cell.get((w, b, phase, "strict", "eager"))
            comp = cell.get((w, b, phase, "strict", "compiled"))
            if not ours and not (eager and eager.get("peak_mem_bytes")):
                continue
            o = ours or {}
            alloc = o.get("allocated_bytes")
            heap = o.get("heap_usage_bytes") if o.get("budget_ext") else None
            peak_e = eager.get("peak_mem_bytes") if eager else None
            peak_c = comp.get("peak_mem_bytes") if comp else None
            rows.append(f"| {w} | {b} | {phase} | {fmt_mib(o.get('plan_logical_bytes'))} | "
                        f"{fmt_mib(o.get('plan_physical_bytes'))} | {fmt_mib(alloc or None)} | {fmt_mib(heap)} | "
                        f"{fmt_mib(peak_e)} | {fmt_mib(peak_c)} | {fmt_ratio(alloc or None, peak_e)} |")
    if not rows:
        return []
    return ["Memory in MiB per session (strict): planned logical (every tensor) and physical (the arena after "
            "aliasing), as `mgn plan` plans the session's graph; allocated = the VkDeviceMemory the session's "
            "allocator reserved (device + staging; its blocks are coarse, so small models show the block size); "
            "heap usage = VK_EXT_memory_budget's device-local usage, process-wide (every session alive at that "
            "point); PyTorch: torch.cuda.max_memory_allocated over the phase's calls (CUDA only).", "",
            "| workload | batch | phase | planned logical | planned physical | allocated | heap usage | "
            "torch eager peak | torch compiled peak | allocated ÷ eager peak |", "|---|---|---|---|---|---|---|---|---|---|"
            ] + rows + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help=".jsonl timing files and .safetensors gate outputs")
    ap.add_argument("--out", help="write the markdown here (it always goes to stdout)")
    ap.add_argument("--require-gates", action="store_true", help="fail when a workload has no outputs to gate")
    args = ap.parse_args()

    records, micro, outputs, micro_outputs = [], [], {}, {}
    for path in args.files:
        if path.endswith(".jsonl"):
            with open(path) as f:
                for line in f:
                    if not line.strip():
                        continue
                    r = json.loads(line)
                    if "case" in r:
                        micro.append(r)
                    elif "m" in r and "phase" not in r:
                        micro += gemm_records(r)
                    else:
                        records.append(r)
        elif path.endswith(".safetensors"):
            _, meta = safetensors_lite.read(path)
            if meta.get("side") not in ("mgn", "torch"):
                sys.exit(f"compare.py: {path}: not a gate output file (no 'side' in its metadata; weights files "
                         "are not compared)")
            micro_kind = meta.get("kind") == "micro"
            key = meta.get("workload") if micro_kind else (meta.get("workload"), int(meta.get("batch", 0)))
            sides = (micro_outputs if micro_kind else outputs).setdefault(key, {"mgn": {}, "torch": {}})
            # Ours: one file per mode. The reference: PyTorch strict eager, one file for both of our modes.
            side_mode = meta.get("mode", "strict") if meta["side"] == "mgn" else "strict"
            if side_mode in sides[meta["side"]]:
                sys.exit(f"compare.py: {path} and {sides[meta['side']][side_mode]}: two {meta['side']} {side_mode} "
                         f"gate files for {key}")
            sides[meta["side"]][side_mode] = path
        else:
            sys.exit(f"compare.py: {path}: expected a .jsonl or .safetensors file")

    # (key, our mode) -> gate of our run in that mode against the PyTorch strict reference.
    def our_files(sides):  # strict first
        return sorted(sides["mgn"].items(), key=lambda kv: (kv[0] != "strict", kv[0]))

    gates = {(key, mode): Gate(path, sides["torch"]["strict"]) for key, sides in sorted(outputs.items())
             if "strict" in sides["torch"] for mode, path in our_files(sides)}
    micro_gates = {(w, mode): MicroGate(path, sides["torch"]["strict"]) for w, sides in sorted(micro_outputs.items())
                   if "strict" in sides["torch"] for mode, path in our_files(sides)}

    # (workload, batch, phase, mode, impl) -> record; ours may lack an accelerated run.
    cell = {}
    for r in records:
        impl = "ours" if r["side"] == "mgn" else r["impl"]
        phase = "compile (cold)" if r["phase"] == "compile" and r.get("cache") == "cold" else r["phase"]
        cell[(r["workload"], r["batch"], phase, r["mode"], impl)] = r
    keys = sorted({(r["workload"], r["batch"]) for r in records} | set(outputs))
    modes = [m for m in ("strict", "accelerated") if any(r["mode"] == m for r in records)]

    exact = any(g.exact for g in gates.values())  # a float64 reference exists: one more verdict column
    lines = []
    envs = sorted({f"{r['side']}: {r.get('backend', '?')}" + (f" / {r['device']}" if r.get("device") else "") +
                   (f", torch {r['torch']}" if r.get("torch") else "") for r in records + micro})
    lines += ["Devices: " + "; ".join(envs) + ".", ""]
    notes = set()
    if keys:
        lines += ["Median wall time per synchronized call in ms (IQR in the JSON). Ratio = ours ÷ PyTorch "
                  "(below 1: ours faster). Compile: our graph build + compile() of the inference, minimal, F+L+B "
                  "and training sessions (cold: empty shader and pipeline caches) vs the first calls of the "
                  "torch.compile'd phases. Minimal: one decode token with the KV cache of the prefill.", ""]
        lines += ["Best PyTorch: the fastest of eager, eager + CUDA-graph replay and torch.compile in that mode "
                  "(the anchor; a variant not run is left out).", ""]
        lines += ["| workload | batch | phase | mode | ours | torch eager | torch eager + CUDA graph | torch compiled | "
                  "ours/eager | ours/best PyTorch | gate |" + (" gate vs exact (f64) |" if exact else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if exact else "")]
    for (w, b) in keys:
        for phase in PHASES:
            for mode in modes:
                ours = cell.get((w, b, phase, mode, "ours"))
                if ours is None and mode == "accelerated":
                    ours = cell.get((w, b, phase, "strict", "ours"))
                    if ours is not None:
                        notes.add(FALLBACK_NOTE)
                eager = cell.get((w, b, phase, mode, "eager"))
                graph = cell.get((w, b, phase, mode, "cudagraph"))
                comp = cell.get((w, b, phase, mode, "compiled"))
                if not (ours or eager or comp or graph):
                    continue
                o = ours["median_ms"] if ours else None
                e = eager["median_ms"] if eager else None
                gr = graph["median_ms"] if graph else None
                c = comp["median_ms"] if comp else None
                # The compile phase has no best: its rows compare compile times.
                theirs = [t for t in (e, gr, c) if t is not None]
                best = min(theirs) if theirs else None
                mark = "†" if ours and ours["mode"] != mode else ""
                # Our accelerated run's gate where it ran; where it did not, the strict one (its row is †).
                g = gates.get(((w, b), "strict" if mark else mode))
                verdict = exact_verdict = "—"
                if g and phase in PHASE_GATES:
                    verdict = g.verdict(PHASE_GATES[phase])
                    exact_verdict = g.exact_verdict(PHASE_GATES[phase])
                lines.append(f"| {w} | {b} | {phase} | {mode} | {fmt_ms(o)}{mark} | {fmt_ms(e)} | {fmt_ms(gr)} | "
                             f"{fmt_ms(c)} | {fmt_ratio(o, e)} | {fmt_ratio(o, best)} | {verdict} |" +
                             (f" {exact_verdict} |" if exact else ""))
    if keys:
        lines += [""]
        f16 = []
        for (w, b) in keys:
            parts = [f"{phase} {r['f16_gemm_dispatches']} of {r['matmul_dispatches']}" for phase in MEMORY_PHASES
                     for r in [cell.get((w, b, phase, "accelerated", "ours"))] if r and "f16_gemm_dispatches" in r]
            if parts:
                f16.append(f"{w} batch {b}: " + ", ".join(parts))
        if f16:
            lines += ["Our accelerated sessions, f16 cooperative-matrix GEMM dispatches of all matmul dispatches "
                      "(the rest stay f32: shapes the f16 kernel does not take, or a device without a passing "
                      "self-test): " + "; ".join(f16) + ".", ""]
        lines += memory_table(cell, keys)
    if micro:
        lines += micro_tables(micro, micro_gates, notes)
    lines += sorted(notes) + ([""] if notes else [])

    failed = False
    for ((w, b), mode), g in gates.items():
        lines += [f"Gates, {w} batch {b} (ours {g.mode} vs PyTorch strict eager on {g.ref_meta.get('device', '?')}):",
                  "", "| check | value | limit | verdict | note |", "|---|---|---|---|---|"]
        lines += gate_rows(g.checks)
        lines.append("")
        if g.exact:
            lines += [f"Gate vs exact (f64), {w} batch {b}, ours {g.mode}: the same PyTorch model, weights and inputs in float64 "
                      f"(on {g.ref_meta.get('f64_device', '?')}) as the exact result. Per tensor relative L2 (losses: "
                      "relative error) of ours vs PyTorch f32 (the gate above), PyTorch f32 vs f64 (PyTorch's own f32 "
                      "error: the noise floor) and ours vs f64; pass when ours vs f64 <= max(limit above, 2 × PyTorch "
                      "f32 vs f64).", ""]
            lines += g.exact_rows()
            lines.append("")
        failed |= not g.passed()
    for (w, mode), g in micro_gates.items():
        rows = [c for (case, phase), cs in sorted(g.checks.items()) for c in cs]
        bad = [c for c in rows if not c[3]]
        worst = max((c[1] for c in rows if ".input." not in c[0]), default=0.0)
        lines += [f"Checks, {w} (ours {g.mode} vs PyTorch strict on {g.ref_meta.get('device', '?')}): "
                  f"{len(rows)} tensors, worst output relative L2 {worst:.2e} (limit "
                  f"{MICRO_TOLERANCE[g.mode]:.0e}), " + (f"**{len(bad)} FAIL**: " + ", ".join(c[0] for c in bad[:5])
                                                         if bad else "all pass") + ".", ""]
        failed |= not g.passed()
    # Every mode in which ours ran needs its gate (ours in that mode vs PyTorch strict eager).
    ran = {((r["workload"], r["batch"]), r["mode"]) for r in records if r["side"] == "mgn"}
    for key, sides in outputs.items():
        ran |= {(key, m) for m in sides["mgn"]}
    ran |= {(key, "strict") for key in keys}
    for key, mode in sorted(ran):
        if (key, mode) not in gates:
            lines += [f"No gate for {key[0]} batch {key[1]}, ours {mode}: our --outputs file of that mode and "
                      "PyTorch's strict one are needed.", ""]
            failed |= args.require_gates
    micro_ran = {(r["workload"], r["mode"]) for r in micro if r["workload"] != "gemm" and r["side"] == "mgn"}
    micro_ran |= {(r["workload"], "strict") for r in micro if r["workload"] != "gemm"}
    for w, mode in sorted(micro_ran):
        if (w, mode) not in micro_gates:
            lines += [f"No check for {w}, ours {mode}: our --outputs file of that mode and PyTorch's strict one "
                      "are needed.", ""]
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
