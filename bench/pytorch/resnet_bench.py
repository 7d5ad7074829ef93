"""PyTorch side of `mgn bench resnet50` / `resnet-tiny`: torchvision's ResNet in plain torch (same module and
state_dict names, so torchvision is not needed), the config from the weights file's metadata, our weights,
the inputs from our gate file (input.x, input.labels), AdamW as mgn::AdamW. Phases inference (eval, running
statistics), flb (train: batch statistics, forward + loss + backward) and step; eager and torch.compile,
strict and accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors (logits, loss, every
gradient, every parameter and running statistic after one step).

  python3 bench/pytorch/resnet_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402
from timing import ADAMW, set_mode, sync, time_calls  # noqa: E402
from fashion_cnn import record  # noqa: E402


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


class Phases:
    def __init__(self, model, lr, x, y, compiled):
        self.model, self.x, self.y = model, x, y
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, **ADAMW)
        self.fwd = torch.compile(model) if compiled else model
        if compiled:
            opt = self.opt

            @torch.compile(fullgraph=False)
            def opt_step():
                opt.step()
            self.opt_step = opt_step
        else:
            self.opt_step = self.opt.step
        self.loss = None

    def inference(self):
        self.model.eval()
        with torch.no_grad():
            self.logits = self.fwd(self.x)

    def flb(self):
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        self.loss = F.cross_entropy(self.fwd(self.x), self.y)
        self.loss.backward()

    def step(self):
        self.flb()
        self.opt_step()


def gate_outputs(args, cfg, weights, x, y, device, meta):
    set_mode("strict")
    out = {"input.x": x.cpu().numpy(), "input.labels": y.cpu().numpy().astype(np.int32)}
    ph = Phases(build_model(cfg, weights).to(device), args.lr, x, y, compiled=False)
    ph.inference()
    out["logits"] = ph.logits.cpu().numpy()
    ph.flb()
    out["loss"] = np.array(ph.loss.item(), dtype=np.float32)
    for name, p in ph.model.named_parameters():
        out["grad." + name] = p.grad.detach().cpu().numpy()
    ph = Phases(build_model(cfg, weights).to(device), args.lr, x, y, compiled=False)
    ph.step()
    out["step.loss"] = np.array(ph.loss.item(), dtype=np.float32)
    for name, t in ph.model.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            out["step." + name] = t.detach().cpu().numpy()
    safetensors_lite.write(args.outputs, out, dict(meta, side="torch", impl="eager", mode="strict",
                                                   workload=args.workload, batch=str(x.shape[0]), lr=str(args.lr)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True, help="our gate file (`mgn bench --outputs`): input.x, input.labels")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--phases", default="compile,inference,flb,step")
    ap.add_argument("--modes", default="strict,accelerated", help="on the CPU only strict is run")
    ap.add_argument("--impls", default="eager,compiled")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", help="write the JSON lines here too (they always go to stdout)")
    ap.add_argument("--outputs", help="write the gate tensors of the strict eager model here")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    args = ap.parse_args()

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    ins, _ = safetensors_lite.read(args.inputs)
    x = torch.from_numpy(ins["input.x"].astype(np.float32)).to(device)
    y = torch.from_numpy(ins["input.labels"].astype(np.int64)).to(device)
    batch = int(x.shape[0])
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    out_file = open(args.json, "w") if args.json else None

    def emit(r):
        s = json.dumps(r)
        print(s, flush=True)
        if out_file:
            out_file.write(s + "\n")
            out_file.flush()

    if args.outputs:
        gate_outputs(args, cfg, weights, x, y, device, meta)
        print(f"resnet_bench.py: gate outputs in {args.outputs}", file=sys.stderr)

    phases = [p for p in args.phases.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    impls = [i for i in args.impls.split(",") if i]
    if device.type == "cpu" and "accelerated" in modes:
        modes.remove("accelerated")
        print("resnet_bench.py: CPU: accelerated (TF32) has no meaning, strict only", file=sys.stderr)
    if "compiled" in impls and not hasattr(torch, "compile"):
        impls.remove("compiled")
        print(f"resnet_bench.py: torch {torch.__version__} has no torch.compile, eager only", file=sys.stderr)

    for mode in modes:
        for impl in impls:
            set_mode(mode)
            compiled = impl == "compiled"
            if compiled:
                importlib.import_module("torch._dynamo").reset()
            ph = Phases(build_model(cfg, weights).to(device), args.lr, x, y, compiled)
            common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                          device=dev_name, batch=batch, image=cfg["image_size"], params=params,
                          torch=torch.__version__)
            if compiled:
                parts = {}
                for name in ("inference", "flb", "step"):
                    if name not in phases and "compile" not in phases:
                        continue
                    t0 = time.perf_counter()
                    getattr(ph, name)()
                    sync(device)
                    parts[name] = (time.perf_counter() - t0) * 1e3
                if "compile" in phases:
                    emit(record(common, "compile", [sum(parts.values())], 0, parts_ms=parts))
            for name in ("inference", "flb", "step"):
                if name not in phases:
                    continue
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                ms = time_calls(getattr(ph, name), args.warmup, args.samples, device)
                extra = {}
                if device.type == "cuda":
                    extra["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
                value = ph.logits[0, 0].item() if name == "inference" else ph.loss.item()
                if not np.isfinite(value):
                    raise RuntimeError(f"{impl} {mode} {name}: non-finite result {value}")
                emit(record(common, name, ms, args.warmup, **extra))
    if out_file:
        out_file.close()


if __name__ == "__main__":
    main()
