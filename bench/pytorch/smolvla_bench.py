"""PyTorch side of `mgn bench smolvla-expert` / `smolvla-expert-test`: the SmolVLA action expert in plain torch
(bench/pytorch/smolvla_expert.py, written from the spec; lerobot is not needed), the config from the weights
file's metadata, our weights, the inputs from our gate file (input.noisy_actions, input.timestep,
input.vlm_kv_layer_{i}, input.target: the spec's benchmark values). Loss mean((velocity - target)²), AdamW as
mgn::AdamW. Phases inference, minimal (the spec's latency shape: 1 action token, still 16 VLM tokens), flb
(forward + loss + backward) and step; implementations eager, eager + CUDA-graph replay (CUDA only) and
torch.compile; strict and accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors;
--f64-reference adds them in float64 (f64.*), --accelerated-reference with TF32 (acc.*, CUDA only):
bench/pytorch/gates.py.

  python3 bench/pytorch/smolvla_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import smolvla_expert as se  # noqa: E402
import timing  # noqa: E402


class Phases(timing.Phases):
    """timing.Phases with the loss mean((v - target)²) and the minimal phase (inference at 1 action token)."""

    def __init__(self, model, lr, x, x_min, impl):
        target = x["target"]
        super().__init__(model, lr, {k: v for k, v in x.items() if k != "target"}, impl,
                         lambda v: ((v - target) ** 2).mean())
        self.x_min, self.out_min = x_min, None

    def _minimal(self):
        with torch.no_grad():
            self.out_min = self.fwd(self.x_min)

    def minimal(self):
        self._run("minimal")

    def value(self, phase):
        return self.out_min.flatten()[0].item() if phase == "minimal" else super().value(phase)


def build_model(cfg, weights, device):
    model = se.ActionExpert(cfg)
    sd = model.state_dict()
    if set(weights) != set(sd):
        raise ValueError(f"weights file: {sorted(set(weights) ^ set(sd))} differ from the model's names")
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    return model.to(device)


def minimal_inputs(cfg, x):
    """The latency shape: the first action token of the spec's pattern, the same timestep and VLM K/V."""
    m = {k: v for k, v in x.items() if k != "target"}
    B = x["noisy_actions"].shape[0]
    a = cfg["action_dim"]
    m["noisy_actions"] = torch.sin(0.01 * torch.arange(B * a, dtype=torch.float64)).view(B, 1, a).to(
        x["noisy_actions"])
    return m


def gate_outputs(args, cfg, weights, x, x_min, device, meta):
    """Strict eager: the velocity (as "logits"), the latency shape's (minimal.logits), loss, every gradient, every
    parameter after one AdamW step, with the inputs both sides used; with --f64-reference /
    --accelerated-reference the same in float64 (f64.*) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd = {k: v.to(dev, dtype) for k, v in x.items()}
        md = {k: v.to(dev, dtype) for k, v in x_min.items()}

        def make():
            ph = Phases(build_model(cfg, weights, dev).to(dtype), args.lr, xd, md, "eager")
            return ph, lambda ph: ph.model.named_parameters(), None
        return gates.model_tensors(make, minimal=True)

    gates.write(args.outputs, {"input." + k: v.cpu().numpy() for k, v in x.items()}, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload,
                     batch=str(x["noisy_actions"].shape[0]), lr=str(args.lr)), "smolvla_bench.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True, help="our gate file (`mgn bench --outputs`): input.*")
    timing.add_run_args(ap, phases="compile,inference,minimal,flb,step")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    gates.add_args(ap)
    args = ap.parse_args()
    gates.check_args(ap, args)

    device = timing.pick_device(args.device)
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    ins, _ = safetensors_lite.read(args.inputs)
    x = {k[len("input."):]: torch.from_numpy(v.astype(np.float32)).to(device) for k, v in ins.items()
         if k.startswith("input.")}
    missing = [n for n in se.input_names(cfg) + ["target"] if n not in x]
    if missing:
        raise ValueError(f"{args.inputs}: no input.{missing[0]}")
    x_min = minimal_inputs(cfg, x)
    batch = int(x["noisy_actions"].shape[0])
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    lines = timing.JsonLines(args.json)
    if args.outputs:
        gate_outputs(args, cfg, weights, x, x_min, device, meta)
        print(f"smolvla_bench.py: gate outputs in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "smolvla_bench.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        ph = Phases(build_model(cfg, weights, device), args.lr, x, x_min, impl)
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=batch, chunk=int(x["noisy_actions"].shape[1]),
                      vlm_tokens=int(cfg["vlm_tokens"]), params=params, torch=torch.__version__)
        timing.time_phases(ph, common, phases, ("inference", "minimal", "flb", "step"), args.warmup, args.samples,
                           device, lines.emit, compiled, ph.value,
                           compile_names=("inference", "minimal", "flb", "step"))
    lines.close()


if __name__ == "__main__":
    main()
