"""PyTorch side of `mgn bench sd-unet-small` / `sd-unet-test`: the conditioned U-Net in plain torch
(bench/pytorch/sd_unet.py, written from the spec; no diffusers), the config from the weights file's metadata,
our weights, the inputs (noisy_latent, timestep_embedding, text_context, noise_target) from our gate file.
--f64-reference adds the gate tensors in float64 (f64.*) for compare.py's gate vs exact, --accelerated-reference
the same with TF32 (acc.*, CUDA only) for its accelerated gate (bench/pytorch/gates.py).
Objective mean((noise_pred - noise_target)²), AdamW as mgn::AdamW. Phases inference, flb (forward + loss +
backward) and step; implementations eager, eager + CUDA-graph replay (CUDA only) and torch.compile; strict and
accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors.

  python3 bench/pytorch/sd_unet_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import sd_unet  # noqa: E402
import timing  # noqa: E402

INPUTS = ("noisy_latent", "timestep_embedding", "text_context")


class Bound(nn.Module):
    """The U-Net called on the tuple (noisy_latent, timestep_embedding, text_context), as timing.Phases calls
    a model on one input."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, xs):
        return self.net(*xs)


def build_model(cfg, weights):
    net = sd_unet.SDUNet(sd_unet.Config(**cfg))
    sd = net.state_dict()
    if set(weights) != set(sd):
        raise ValueError(f"weights file: {sorted(set(weights) ^ set(sd))[:10]} differ from the model's names")
    net.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    return Bound(net)


def Phases(model, lr, xs, target, impl):
    return timing.Phases(model, lr, xs, impl, lambda out: ((out - target) ** 2).mean())


def gate_outputs(args, cfg, weights, xs, target, device, meta):
    """Strict eager: noise_pred (as "logits"), loss, every gradient, every parameter after one AdamW step, with
    the inputs; with --f64-reference / --accelerated-reference the same in float64 (f64.*, the exact reference
    of compare.py) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd, td = tuple(x.to(dev, dtype) for x in xs), target.to(dev, dtype)

        def make():
            ph = Phases(build_model(cfg, weights).to(dev, dtype), args.lr, xd, td, "eager")
            return ph, lambda ph: ph.model.net.named_parameters(), None
        return gates.model_tensors(make)

    inputs = {"input." + n: x.cpu().numpy() for n, x in zip(INPUTS, xs)}
    inputs["input.noise_target"] = target.cpu().numpy()
    gates.write(args.outputs, inputs, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload,
                     batch=str(xs[0].shape[0]), lr=str(args.lr)), "sd_unet_bench.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True, help="our gate file (`mgn bench --outputs`): input.*")
    timing.add_run_args(ap)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    gates.add_args(ap)
    args = ap.parse_args()
    gates.check_args(ap, args)

    device = timing.pick_device(args.device)
    if device.type == "cpu":
        torch.backends.mkldnn.enabled = False  # Debian's torch 1.13: oneDNN's f32 conv backward is wrong
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    ins, _ = safetensors_lite.read(args.inputs)
    xs = tuple(torch.from_numpy(ins["input." + n].astype(np.float32)).to(device) for n in INPUTS)
    target = torch.from_numpy(ins["input.noise_target"].astype(np.float32)).to(device)
    batch = int(xs[0].shape[0])
    # Our inputs must be the spec's (workload-specs.md §2), computed here independently of the C++ side.
    spec = sd_unet.bench_inputs(sd_unet.Config(**cfg), batch)
    spec["text_context"] = spec["text_context"].unsqueeze(0).expand(batch, -1, -1)
    for n, x in list(zip(INPUTS, xs)) + [("noise_target", target)]:
        if tuple(x.shape) != tuple(spec[n].shape) or not torch.allclose(x.cpu(), spec[n], rtol=0, atol=1e-6):
            raise SystemExit(f"sd_unet_bench.py: input {n} {tuple(x.shape)} is not the spec's benchmark input "
                             f"{tuple(spec[n].shape)}")
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    lines = timing.JsonLines(args.json)
    if args.outputs:
        gate_outputs(args, cfg, weights, xs, target, device, meta)
        print(f"sd_unet_bench.py: gate outputs in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "sd_unet_bench.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        ph = Phases(build_model(cfg, weights).to(device), args.lr, xs, target, impl)
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=batch, latent=cfg["latent"], context_len=cfg["context_len"],
                      params=params, torch=torch.__version__)
        timing.time_phases(ph, common, phases, ("inference", "flb", "step"), args.warmup, args.samples,
                           device, lines.emit, compiled, ph.value)
    lines.close()


if __name__ == "__main__":
    main()
