"""What bench/pytorch/attention.py and conv.py share: the inputs `mgn bench attention|conv --outputs` wrote
(every case's tensors and, in the metadata, its shape parameters and FLOP counts), the gate outputs, and one
JSON line per (mode, case, phase) in the schema of `mgn bench`'s microbenchmarks."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402
import timing  # noqa: E402


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--inputs", required=True, help="the --outputs file of mgn bench (inputs of every case)")
    ap.add_argument("--outputs", help="write the inputs and this side's outputs here (strict)")
    ap.add_argument("--json", help="write the JSON lines here too (they always go to stdout)")
    ap.add_argument("--phases", help="default: the phases mgn ran")
    ap.add_argument("--modes", default="strict,accelerated", help="on the CPU only strict is run")
    timing.add_warmup_args(ap)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    return ap.parse_args()


def run(doc, workload, impl_name, phase_fn):
    """phase_fn(case, shape, phase, tensors on the device) -> (fn to time, fn returning {name: tensor})."""
    a = parse_args(doc)
    script = f"{workload}.py"
    device = timing.pick_device(a.device)
    tensors, meta = safetensors_lite.read(a.inputs)
    if meta.get("workload") != workload or meta.get("kind") != "micro":
        raise SystemExit(f"{script}: {a.inputs} holds '{meta.get('workload')}', not {workload} microbenchmarks")
    cases = json.loads(meta["cases"])
    phases = (a.phases or meta.get("phases", "")).split(",")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # cuDNN picks its fastest algorithm during the warm-up
    common = {"side": "torch", "impl": impl_name(device), "workload": workload, "backend": device.type,
              "device": timing.device_name(device), "torch": torch.__version__}

    def inputs_of(case):
        prefix = case + ".input."
        return {k[len(prefix):]: torch.from_numpy(v).to(device) for k, v in tensors.items() if k.startswith(prefix)}

    if a.outputs:
        timing.set_mode("strict")
        out = {k: v for k, v in tensors.items() if ".input." in k}
        for case, shape in cases.items():
            for phase in phases:
                _, result = phase_fn(case, shape, phase, inputs_of(case))
                for name, t in result().items():
                    out[f"{case}.{phase}.{name}"] = t.detach().float().cpu().numpy()
        safetensors_lite.write(a.outputs, out, dict(common, side="torch", kind="micro", workload=workload,
                                                    mode="strict"))
        print(f"{script}: inputs and outputs of {len(cases)} cases in {a.outputs}", file=sys.stderr)

    lines = timing.JsonLines(a.json)
    for mode in timing.cpu_modes([m for m in a.modes.split(",") if m], device, script):
        timing.set_mode(mode)
        for case, shape in cases.items():
            for phase in phases:
                fn, result = phase_fn(case, shape, phase, inputs_of(case))
                ms = timing.time_calls(fn, a.warmup, a.samples, device)
                values = result()
                if not all(bool(torch.isfinite(t).all()) for t in values.values()):
                    raise RuntimeError(f"{script}: {case} {phase} {mode}: non-finite output")
                flop = float(shape["flop"][phase])
                r = dict(common, case=case, phase=phase, mode=mode,
                         shape={k: v for k, v in shape.items() if k != "flop"}, flop=flop)
                r.update(timing.summary(ms, a.warmup))
                r["tflops"] = flop / (r["median_ms"] * 1e-3) / 1e12
                lines.emit(r)
    lines.close()


def requires_grad(t):
    return t.detach().clone().requires_grad_(True)
