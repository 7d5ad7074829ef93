"""bench/compare.py's accelerated gate (issue 33) on synthetic gate files with known errors (ctest CompareGate):
    compare_gate_check.py OUT_DIR

Every tensor is exact + e * |exact| * u, with the exact tensors multiples of ones(8) and u one of three orthonormal
directions orthogonal to ones(8), so that each side's relative L2 error against the f64 tensor is e by construction
(PyTorch f32 along U1, PyTorch TF32 along U2, ours along U3) and the errors between sides and of the norms have
closed forms. The files are written with tests/ref/st_io.py (not the harness's reader). Cases:

  pass      ours 6e-2 off on grad.ln_bias (over the 5e-2 per-tensor limit vs PyTorch f32), PyTorch TF32 4e-2 off:
            within 2 x TF32 -> the per-tensor row is informational, (b) passes, exit 0
  fail_b    the same with ours 1.2e-1 off on grad.ln_bias: over 2 x 4e-2 -> (b) fails, the paper's gates pass, exit 1
  fail_a    ours grad.w scaled by 1.1 (along the tensor: 1e-1 off, within 2 x TF32's 6e-2) -> (b) passes for
            grad.w, the paper's gradient norm gates fail, exit 1
  fallback  the 'pass' file against a reference without acc.* (as on a CPU): the per-tensor limits decide,
            grad.ln_bias at 6e-2 > 5e-2 fails, exit 1; with ours 3e-2 off there, exit 0
  strict    our strict file 1e-5 off PyTorch f32 (along U3) against the same reference: the strict gate, no accelerated rows, exit 0

and the timing table (check_best_variant): every PyTorch variant in its column (eager, CUDA graph, compiled,
compiled + CUDA graph), ours ÷ the fastest with that variant named; and bench/pytorch/gates.py's write() with a
stand-in compute(): on a "cuda" device it computes f32 strict, f64 strict,
then f32 with TF32 on for matmul and cuDNN (acc.*), and restores strict; on the CPU it writes no acc.* and says why.
"""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import st_io  # noqa: E402

N = 8
ONES = np.ones(N)
U1 = np.array([1, -1, 1, -1, 1, -1, 1, -1]) / math.sqrt(N)
U2 = np.array([1, 1, -1, -1, 1, 1, -1, -1]) / math.sqrt(N)
U3 = np.array([1, 1, 1, 1, -1, -1, -1, -1]) / math.sqrt(N)
# The exact tensors (their f64 values): c * ones(8); |grad.ln_bias| is a tenth of |grad.w|.
EXACT = {"logits": 2.0, "grad.w": 0.5, "grad.ln_bias": 0.05, "step.w": 1.0, "step.ln_bias": 0.2}
LOSS = 2.0
# PyTorch f32 and TF32 errors against f64 per tensor (relative L2; losses: relative error).
TORCH_F32 = {"logits": 1e-6, "grad.w": 1e-3, "grad.ln_bias": 1e-3, "step.w": 1e-6, "step.ln_bias": 1e-6, "loss": 1e-7}
TORCH_TF32 = {"logits": 3e-3, "grad.w": 6e-2, "grad.ln_bias": 4e-2, "step.w": 2e-3, "step.ln_bias": 2e-3, "loss": 1e-4}
OURS_PASS = {"logits": 4e-3, "grad.w": 3e-2, "grad.ln_bias": 6e-2, "step.w": 3e-3, "step.ln_bias": 3e-3, "loss": 2e-4}


def tensor(name, e, u):
    x = EXACT[name] * ONES
    return x + e * np.linalg.norm(x) * u


def side(errors, u, prefix="", parallel=()):
    """The gate tensors with the given relative errors along u (names in `parallel`: along the tensor itself)."""
    out = {}
    for name in EXACT:
        out[prefix + name] = (1 + errors[name]) * EXACT[name] * ONES if name in parallel else tensor(name, errors[name], u)
    out[prefix + "loss"] = np.array(LOSS * (1 + errors["loss"]))
    out[prefix + "step.loss"] = np.array(LOSS * (1 + errors["loss"]))
    return out


def write_ref(path, with_acc):
    t = {"input.x": np.array([1.0, 2.0, 3.0])}
    t.update(side(TORCH_F32, U1))
    t.update({"f64." + k: v for k, v in side({k: 0.0 for k in TORCH_F32}, U1).items()})
    meta = {"side": "torch", "impl": "eager", "mode": "strict", "workload": "toy", "batch": "2", "lr": "0.001",
            "device": "synthetic", "f64_device": "cpu"}
    dtypes = {"f64." + k: "F64" for k in list(EXACT) + ["loss", "step.loss"]}
    if with_acc:
        t.update(side(TORCH_TF32, U2, "acc."))
        meta.update(acc_reference="tf32", acc_device="synthetic")
    else:
        meta["acc_reference"] = "none: cpu device (TF32 has no meaning there)"
    st_io.write(path, t, metadata=meta, dtypes=dtypes)


def write_ours(path, errors, mode="accelerated", parallel=(), base=None):
    """Our gate file: errors against f64 along U3 (with base: added to PyTorch f32's tensors instead)."""
    t = {"input.x": np.array([1.0, 2.0, 3.0])}
    t.update(side(errors, U3, parallel=parallel))
    if base is not None:
        b = side(base, U1)
        t = {k: v if k == "input.x" else b[k] + (v - side({n: 0.0 for n in errors}, U3)[k]) for k, v in t.items()}
    st_io.write(path, t, metadata={"side": "mgn", "mode": mode, "workload": "toy", "batch": "2", "lr": "0.001"})


failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def compare(out_dir, name, ours, ref):
    table = os.path.join(out_dir, name + ".md")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare.py"), "--out", table, ours, ref],
                       capture_output=True, text=True)
    with open(table) as f:
        return p.returncode, f.read()


def section(text, start, end=None):
    """The lines from the heading starting with `start` up to the next heading starting with `end`."""
    i = text.index(start)
    j = text.index(end, i) if end and end in text[i:] else len(text)
    return text[i:j]


def row(text, name):
    """The cells of the first table row named `name`."""
    m = re.search(r"^\| " + re.escape(name) + r" \|(.*)\|$", text, re.M)
    return None if m is None else [c.strip() for c in m.group(1).split("|")]


def close(a, b, rtol=1e-3):
    return abs(a - b) <= rtol * abs(b)


def check_gates_write(out):
    """gates.write: which settings compute() runs under, what lands in the file."""
    import argparse
    import types
    import torch
    sys.path.insert(0, os.path.join(ROOT, "bench", "pytorch"))
    import gates
    import timing
    calls = []

    def compute(dev, dtype):
        calls.append((dev.type, dtype, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return {"logits": np.full(3, 1.5 if dtype == torch.float64 else 2.5, dtype=np.float64 if dtype == torch.float64
                                  else np.float32)}

    args = argparse.Namespace(f64_reference=True, accelerated_reference=True)
    saved = gates._release, timing.device_name
    gates._release, timing.device_name = (lambda d: None), (lambda d: "stand-in GPU")
    try:
        path = os.path.join(out, "gates_cuda.safetensors")
        gates.write(path, {"input.x": np.zeros(2, np.float32)}, compute, types.SimpleNamespace(type="cuda"), args,
                    {"side": "torch"}, "compare_gate_check.py")
    finally:
        gates._release, timing.device_name = saved
    f32, f64 = torch.float32, torch.float64
    expect(calls == [("cuda", f32, False, False), ("cuda", f64, False, False), ("cuda", f32, True, True)],
           f"gates.write on CUDA: f32 strict, f64 strict, f32 with TF32 (matmul, cuDNN): {calls}")
    expect(not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32,
           "gates.write: strict mode restored after the TF32 reference")
    t = st_io.read(path)
    with open(path, "rb") as f:
        blob = f.read()
    expect(sorted(t) == ["acc.logits", "f64.logits", "input.x", "logits"] and t["f64.logits"].dtype == np.float64
           and b'"acc_reference":"tf32"' in blob.replace(b" ", b""),
           f"gates.write on CUDA: logits, f64.logits (float64), acc.logits, acc_reference tf32: {sorted(t)}")
    calls.clear()
    path = os.path.join(out, "gates_cpu.safetensors")
    gates.write(path, {"input.x": np.zeros(2, np.float32)}, compute, torch.device("cpu"), args, {"side": "torch"},
                "compare_gate_check.py")
    t = st_io.read(path)
    with open(path, "rb") as f:
        blob = f.read()
    expect(calls == [("cpu", f32, False, False), ("cpu", f64, False, False)] and "acc.logits" not in t
           and b"none: cpu device" in blob, f"gates.write on the CPU: no TF32 run, no acc.*, the reason recorded: {calls}")


def check_best_variant(out):
    """The timing table: each PyTorch variant in its column, ours ÷ the fastest of them, that variant named. Per
    phase a different variant is fastest; a phase with ours only has no best."""
    medians = {"inference": {"eager": 8.0, "cudagraph": 5.0, "compiled": 6.0, "compiled-graph": 4.0},
               "flb": {"eager": 20.0, "cudagraph": 10.0, "compiled": 12.0},
               "step": {"eager": 30.0, "compiled": 25.0, "compiled-graph": 26.0}}
    ours = {"inference": 3.0, "flb": 15.0, "step": 20.0, "minimal": 1.0}
    ours_path, torch_path = os.path.join(out, "best.mgn.jsonl"), os.path.join(out, "best.torch.jsonl")
    common = {"workload": "toy", "batch": 2, "mode": "strict", "backend": "cpu"}
    with open(ours_path, "w") as f:
        for phase, ms in ours.items():
            f.write(json.dumps(dict(common, side="mgn", impl="mgn", phase=phase, median_ms=ms)) + "\n")
    with open(torch_path, "w") as f:
        for phase, impls in medians.items():
            for impl, ms in impls.items():
                f.write(json.dumps(dict(common, side="torch", impl=impl, phase=phase, median_ms=ms)) + "\n")
    table = os.path.join(out, "best.md")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare.py"), "--out", table, ours_path,
                        torch_path], capture_output=True, text=True)
    expect(p.returncode == 0, f"best: compare.py exits 0 (got {p.returncode}: {p.stderr.strip()[-200:]})")
    with open(table) as f:
        text = f.read()
    rows = {}
    for ln in section(text, "| workload | batch | phase | mode |", "Memory in MiB").splitlines():
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) >= 11 and cells[0] == "toy":
            rows[cells[2]] = cells
    # Columns: ours, eager, CUDA graph, compiled, compiled + graph, ours/eager, ours/best.
    want = {"inference": (["3.000", "8.000", "5.000", "6.000", "4.000"], "0.75× (compile + graph)"),
            "flb": (["15.00", "20.00", "10.00", "12.00", "—"], "1.50× (CUDA graph)"),
            "step": (["20.00", "30.00", "—", "25.00", "26.00"], "0.80× (compile)"),
            "minimal": (["1.000", "—", "—", "—", "—"], "—")}
    for phase, (cols, ratio) in want.items():
        r = rows.get(phase)
        expect(r is not None and r[4:9] == cols and r[10] == ratio,
               f"best: {phase} row has {cols} and ours/best {ratio}: {r and r[4:11]}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ref, ref_noacc = os.path.join(out, "ref.safetensors"), os.path.join(out, "ref_noacc.safetensors")
    write_ref(ref, True)
    write_ref(ref_noacc, False)
    gates = "Gates, toy batch 2 (ours accelerated"
    accg = "Accelerated gate vs exact (f64), toy batch 2"

    # pass: grad.ln_bias 6e-2 from f64 (ours vs PyTorch f32: sqrt(6e-2² + 1e-3²) / sqrt(1 + 1e-3²) > 5e-2), within
    # max(5e-2, 2 x 4e-2).
    p = os.path.join(out, "pass.safetensors")
    write_ours(p, OURS_PASS)
    rc, text = compare(out, "pass", p, ref)
    expect(rc == 0, f"pass: compare.py exits 0 (got {rc})")
    g = section(text, gates, accg)
    a = section(text, accg)
    r = row(g, "grad.ln_bias")
    want = math.sqrt(6e-2 ** 2 + 1e-3 ** 2) / math.sqrt(1 + 1e-3 ** 2)
    expect(r is not None and close(float(r[0]), want, 1e-2) and r[2] == "over (info)",
           f"pass: per-tensor row grad.ln_bias vs PyTorch f32 {want:.3e}, over its 5e-2 limit, informational: {r}")
    r = row(a, "grad.ln_bias")
    expect(r is not None and close(float(r[0]), 6e-2, 1e-2) and close(float(r[1]), 4e-2, 1e-2)
           and close(float(r[2]), 1e-3, 1e-2) and close(float(r[3]), 8e-2, 1e-2) and r[4] == "pass (bound: 2×TF32)",
           f"pass: (b) grad.ln_bias ours 6e-2, TF32 4e-2, f32 1e-3 vs f64, limit 8e-2 from 2×TF32, pass: {r}")
    r = row(a, "logits")
    expect(r is not None and close(float(r[3]), 1e-2) and r[4] == "pass (bound: 1e-02)",
           f"pass: (b) logits limit is the accelerated limit 1e-2 (2 × 3e-3 below it): {r}")
    # The paper's gates against PyTorch f32: total gradient norm, every vector orthogonal to the exact one.
    n2 = {k: (EXACT[k] ** 2) * N for k in ("grad.w", "grad.ln_bias")}
    gn_o = math.sqrt(sum(n2[k] * (1 + OURS_PASS[k] ** 2) for k in n2))
    gn_r = math.sqrt(sum(n2[k] * (1 + TORCH_F32[k] ** 2) for k in n2))
    r = row(g, "paper: total gradient norm")
    expect(r is not None and close(float(r[0]), abs(gn_o - gn_r) / gn_r, 1e-2) and r[2] == "pass (paper gate)",
           f"pass: paper total gradient norm error {abs(gn_o - gn_r) / gn_r:.3e}, paper gate: {r}")
    r = row(g, "paper: loss, symmetric relative error")
    want = 2 * abs(LOSS * (1 + 2e-4) - LOSS * (1 + 1e-7)) / (LOSS * (1 + 2e-4) + LOSS * (1 + 1e-7))
    expect(r is not None and close(float(r[0]), want, 1e-2) and r[2] == "pass (paper gate)",
           f"pass: paper loss error {want:.3e}: {r}")
    expect("all pass." in a and "8 of 8 within their limit" in a, "pass: (b) summary: 8 of 8 within, all pass")
    main_row = [ln for ln in text.splitlines() if ln.startswith("| grad.ln_bias")]
    expect(len(main_row) == 2, "pass: grad.ln_bias shown in both tables (per-tensor numbers stay visible)")

    # fail_b: ours 1.2e-1 from f64 on grad.ln_bias, over max(5e-2, 8e-2); the paper's gates still pass.
    p = os.path.join(out, "fail_b.safetensors")
    write_ours(p, dict(OURS_PASS, **{"grad.ln_bias": 1.2e-1}))
    rc, text = compare(out, "fail_b", p, ref)
    expect(rc == 1, f"fail_b: compare.py exits 1 (got {rc})")
    g, a = section(text, gates, accg), section(text, accg)
    r = row(a, "grad.ln_bias")
    expect(r is not None and close(float(r[0]), 1.2e-1, 1e-2) and r[4] == "**FAIL** (bound: 2×TF32)",
           f"fail_b: (b) grad.ln_bias 1.2e-1 over 8e-2 fails: {r}")
    paper = [ln for ln in g.splitlines() if ln.startswith("| paper: ")]
    expect(len(paper) == 5 and all("| pass (paper gate) |" in ln for ln in paper),
           f"fail_b: the 5 paper rows pass ({len(paper)} rows)")
    expect("**1 FAIL**." in a, "fail_b: (b) summary counts 1 FAIL")

    # fail_a: ours grad.w = 1.1 x exact: 1e-1 from f64, within max(5e-2, 2 x 6e-2) for (b); the total gradient norm
    # and the per-parameter norms move by about 1e-1 against PyTorch f32: the paper's gates fail.
    p = os.path.join(out, "fail_a.safetensors")
    write_ours(p, dict(OURS_PASS, **{"grad.w": 0.1}), parallel=("grad.w",))
    rc, text = compare(out, "fail_a", p, ref)
    expect(rc == 1, f"fail_a: compare.py exits 1 (got {rc})")
    g, a = section(text, gates, accg), section(text, accg)
    r = row(a, "grad.w")
    expect(r is not None and close(float(r[0]), 0.1, 1e-2) and r[4] == "pass (bound: 2×TF32)",
           f"fail_a: (b) grad.w 1e-1 within 1.2e-1 passes: {r}")
    gn_o = math.sqrt(n2["grad.w"] * 1.21 + n2["grad.ln_bias"] * (1 + OURS_PASS["grad.ln_bias"] ** 2))
    r = row(g, "paper: total gradient norm")
    expect(r is not None and close(float(r[0]), abs(gn_o - gn_r) / gn_r, 1e-2) and r[2] == "**FAIL** (paper gate)",
           f"fail_a: paper total gradient norm error {abs(gn_o - gn_r) / gn_r:.3e} fails: {r}")
    norms_o = np.array([math.sqrt(n2["grad.w"] * 1.21), math.sqrt(n2["grad.ln_bias"] * (1 + 6e-2 ** 2))])
    norms_r = np.array([math.sqrt(n2["grad.w"] * (1 + 1e-6)), math.sqrt(n2["grad.ln_bias"] * (1 + 1e-6))])
    want = np.linalg.norm(norms_o - norms_r) / np.linalg.norm(norms_r)
    r = row(g, "paper: per-parameter gradient norms, rel-L2")
    expect(r is not None and close(float(r[0]), want, 1e-2) and r[2] == "**FAIL** (paper gate)",
           f"fail_a: paper per-parameter norm vector rel-L2 {want:.3e} fails: {r}")

    # fallback: no acc.* (a CPU reference): the per-tensor limits against PyTorch f32 decide.
    rc, text = compare(out, "fallback_fail", os.path.join(out, "pass.safetensors"), ref_noacc)
    expect(rc == 1, f"fallback: grad.ln_bias 6e-2 vs PyTorch f32 fails the per-tensor gate, exit 1 (got {rc})")
    g = section(text, gates)
    expect("the reference has no acc.* tensors (none: cpu device (TF32 has no meaning there))" in g,
           "fallback: the table says why (b) is the per-tensor gate")
    r = row(g, "grad.ln_bias")
    expect(r is not None and r[2] == "**FAIL** (per-tensor gate)", f"fallback: grad.ln_bias row decided per tensor: {r}")
    expect(accg not in text, "fallback: no TF32 table")
    p = os.path.join(out, "fallback_pass.safetensors")
    write_ours(p, dict(OURS_PASS, **{"grad.ln_bias": 3e-2}))
    rc, text = compare(out, "fallback_pass", p, ref_noacc)
    expect(rc == 0, f"fallback: every tensor within the per-tensor limits, exit 0 (got {rc})")

    # strict: the strict gate, untouched by the acc.* tensors of the reference.
    p = os.path.join(out, "strict.safetensors")
    write_ours(p, {k: 1e-5 for k in OURS_PASS}, mode="strict", base=TORCH_F32)
    rc, text = compare(out, "strict", p, ref)
    expect(rc == 0, f"strict: exit 0 (got {rc})")
    expect("paper:" not in text and accg not in text and "Gate vs exact (f64), toy batch 2, ours strict" in text,
           "strict: no accelerated rows, the gate vs exact (f64) as before")
    r = row(section(text, "Gates, toy batch 2 (ours strict"), "grad.ln_bias")
    expect(r is not None and r[2] == "pass", f"strict: plain verdicts: {r}")

    check_gates_write(out)
    check_best_variant(out)

    if failures:
        print(f"compare_gate_check: {len(failures)} check(s) failed")
        return 1
    print("compare_gate_check: all checks pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
