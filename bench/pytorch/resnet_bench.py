"""PyTorch side of `mgn bench resnet50` / `resnet-tiny`: torchvision's ResNet in plain torch (same module and
state_dict names, so torchvision is not needed), the config from the weights file's metadata, our weights,
the inputs from our gate file (input.x, input.labels), AdamW as mgn::AdamW. Phases inference (eval, running
statistics), flb (train: batch statistics, forward + loss + backward) and step; eager, eager + CUDA-graph
replay and torch.compile, strict and accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors (logits, loss, every
gradient, every parameter and running statistic after one step); with --f64-reference also the same tensors of
the same model, weights and inputs computed in float64 (names prefixed `f64.`, untimed): the exact reference
against which compare.py measures both sides' f32 error; with --accelerated-reference the same once more with
TF32 (acc.*, CUDA only), the allowance of compare.py's accelerated gate (bench/pytorch/gates.py).

  python3 bench/pytorch/resnet_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors [--f64-reference] [--accelerated-reference]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_cnn  # noqa: E402
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import timing  # noqa: E402


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride, mom, eps):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, eps, mom)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps, mom)
        self.downsample = down(cin, planes, stride, mom, eps)

    def forward(self, x):
        h = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride, mom, eps):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, eps, mom)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps, mom)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4, eps, mom)
        self.downsample = down(cin, planes * 4, stride, mom, eps)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


def down(cin, out, stride, mom, eps):
    if stride == 1 and cin == out:
        return None
    return nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out, eps, mom))


BLOCKS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}


class ResNet(nn.Module):
    def __init__(self, depth, width, classes, mom, eps):
        super().__init__()
        block = Bottleneck if depth >= 50 else Basic
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width, eps, mom)
        cin = width
        for s, n in enumerate(BLOCKS[depth]):
            planes = width << s
            layers = []
            for i in range(n):
                layers.append(block(cin, planes, 2 if s > 0 and i == 0 else 1, mom, eps))
                cin = planes * block.expansion
            setattr(self, f"layer{s + 1}", nn.Sequential(*layers))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for s in range(1, 5):
            x = getattr(self, f"layer{s}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(cfg, weights):
    model = ResNet(cfg["depth"], cfg["width"], cfg["num_classes"], cfg["bn_momentum"], cfg["bn_eps"])
    expected = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
    if set(weights) != expected:
        raise ValueError(f"weights file: {sorted(set(weights) ^ expected)} differ from the model's names")
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}, strict=False)
    return model


class Phases(fashion_cnn.Phases):
    """fashion_cnn's phases; inference in eval mode (running statistics), flb and step in train mode (batch
    statistics). The gate tensors' (eager) phases."""

    def inference(self):
        self.model.eval()
        super().inference()

    def flb(self):
        self.model.train()
        super().flb()


class TimedPhases(timing.Phases):
    """The timed phases of one implementation (eager, eager + CUDA-graph replay, compiled): timing.Phases with
    cross-entropy on the labels, inference in eval mode and flb / step in train mode, as Phases. The mode is set
    inside the function a CUDA graph captures, so each phase's graph holds its mode's kernels (BatchNorm's batch
    statistics and running-statistic updates in flb and step)."""

    def __init__(self, model, lr, x, y, impl):
        super().__init__(model, lr, x, impl, lambda out: F.cross_entropy(out, y))

    def _inference(self):
        self.model.eval()
        super()._inference()

    def _flb(self):
        self.model.train()
        super()._flb()


def gate_outputs(args, cfg, weights, x, y, device, meta):
    """Strict eager: logits, loss, every gradient, and after one AdamW step the loss and every parameter and
    running statistic; with --f64-reference / --accelerated-reference the same from the same f32 weights and
    inputs (widened exactly) in float64 (f64.*) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd, yd = x.to(dev, dtype), y.to(dev)

        def make():
            ph = Phases(build_model(cfg, weights).to(dev, dtype), args.lr, xd, yd)
            return ph, lambda ph: ph.model.named_parameters(), lambda ph: [
                (n, t) for n, t in ph.model.state_dict().items() if not n.endswith("num_batches_tracked")]
        return gates.model_tensors(make)

    inputs = {"input.x": x.cpu().numpy(), "input.labels": y.cpu().numpy().astype(np.int32)}
    gates.write(args.outputs, inputs, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload, batch=str(x.shape[0]),
                     lr=str(args.lr)), "resnet_bench.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True, help="our gate file (`mgn bench --outputs`): input.x, input.labels")
    timing.add_run_args(ap)
    gates.add_args(ap)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    args = ap.parse_args()
    gates.check_args(ap, args)

    device = timing.pick_device(args.device)
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    ins, _ = safetensors_lite.read(args.inputs)
    x = torch.from_numpy(ins["input.x"].astype(np.float32)).to(device)
    y = torch.from_numpy(ins["input.labels"].astype(np.int64)).to(device)
    batch = int(x.shape[0])
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    lines = timing.JsonLines(args.json)

    if args.outputs:
        gate_outputs(args, cfg, weights, x, y, device, meta)
        print(f"resnet_bench.py: gate outputs in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "resnet_bench.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        ph = TimedPhases(build_model(cfg, weights).to(device), args.lr, x, y, impl)
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=batch, image=cfg["image_size"], params=params,
                      torch=torch.__version__)
        timing.time_phases(ph, common, phases, ("inference", "flb", "step"), args.warmup, args.samples, device,
                           lines.emit, compiled, ph.value)
    lines.close()


if __name__ == "__main__":
    main()
