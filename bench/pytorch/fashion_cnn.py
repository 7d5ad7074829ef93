"""PyTorch side of `mgn bench fashion-cnn` (and fashion-mlp): the same model as src/models/fashion_mnist.cpp,
the same weights (the safetensors file `mgn bench --weights` wrote), the same inputs (the first BATCH
Fashion-MNIST training images, read from the IDX files), AdamW with the hyperparameters of mgn::AdamW.
Times the phases inference (no-grad forward), flb (forward + loss + backward) and step (flb + AdamW update)
for eager and torch.compile, strict (TF32 off, matmul precision "highest") and accelerated (TF32 on), each
sample synchronized; compile is the wall time of the first call of each compiled phase. Writes one JSON line
per (impl, mode, phase) in the schema of `mgn bench`, and with --outputs the gate tensors of the strict eager
model (logits, loss, every gradient, every parameter after one step), with --f64-reference also in float64
(f64.*) and with --accelerated-reference also with TF32 (acc.*, CUDA only): bench/pytorch/gates.py. Falls back to
the CPU without CUDA.

  python3 bench/pytorch/fashion_cnn.py --weights w.safetensors --batch 64 --json torch.jsonl \\
      --outputs torch_out.safetensors
"""
import argparse
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import timing  # noqa: E402
from timing import ADAMW  # noqa: E402


class FashionCnn(nn.Module):
    """conv1 (16, 3x3, pad 1) -> relu -> max-pool 2 -> conv2 (32, 3x3, pad 1) -> relu -> max-pool 2 -> flatten
    -> fc1 (hidden) -> relu -> fc2 (10)."""

    def __init__(self, hidden):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class FashionMlp(nn.Module):
    """flatten -> fc1 (hidden) -> relu -> fc2 (10)."""

    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load_batch(data_dir, batch):
    def pick(base):
        for p in (os.path.join(data_dir, base + ".gz"), os.path.join(data_dir, base)):
            if os.path.exists(p):
                return p
        raise FileNotFoundError(f"Fashion-MNIST: no {base}(.gz) in {data_dir} (set MGN_FASHION_MNIST_DIR)")
    images = read_idx(pick("train-images-idx3-ubyte"))
    labels = read_idx(pick("train-labels-idx1-ubyte"))
    if images.shape[0] < batch:
        raise ValueError(f"{data_dir} holds {images.shape[0]} training images, batch is {batch}")
    # The same f32 division as mgn::load_fashion_mnist: float(byte) / 255.0f.
    x = images[:batch].astype(np.float32).reshape(batch, 1, 28, 28) / np.float32(255.0)
    return x, labels[:batch].astype(np.int64)


def build_model(workload, weights):
    hidden = weights["fc1.weight"].shape[0]
    model = FashionCnn(hidden) if workload == "fashion-cnn" else FashionMlp(hidden)
    expected = set(model.state_dict())
    if set(weights) != expected:
        raise ValueError(f"weights file: tensors {sorted(weights)}, the model expects {sorted(expected)}")
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    return model


class Phases:
    """The three timed functions of one configuration (model, optimizer, eager or compiled)."""

    def __init__(self, model, lr, x, y, compile_mode=None):
        """compile_mode: torch.compile's mode (timing.compile_mode of a compiled impl), None: eager."""
        self.model, self.x, self.y = model, x, y
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, **ADAMW)
        self.fwd = torch.compile(model, mode=compile_mode) if compile_mode else model
        self.opt_step = timing.compile_update(self.opt) if compile_mode else self.opt.step
        self.loss = None

    def inference(self):
        with torch.no_grad():
            self.out = self.fwd(self.x)

    def flb(self):
        self.opt.zero_grad(set_to_none=True)
        self.loss = F.cross_entropy(self.fwd(self.x), self.y)
        self.loss.backward()

    def step(self):
        self.flb()
        self.opt_step()

    def value(self, phase):
        """A scalar of the phase's last result (checked finite after the samples)."""
        return self.out[0, 0].item() if phase == "inference" else self.loss.item()


def gate_outputs(args, weights, x, y, device, meta):
    """Strict eager: logits, loss, every gradient, and every parameter after one AdamW step; with
    --f64-reference / --accelerated-reference the same in float64 (f64.*) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd, yd = x.to(dev, dtype), y.to(dev)

        def make():
            ph = Phases(build_model(args.workload, weights).to(dev, dtype), args.lr, xd, yd)
            return ph, lambda ph: ph.model.named_parameters(), None
        return gates.model_tensors(make)

    inputs = {"input.x": x.cpu().numpy(), "input.labels": y.cpu().numpy().astype(np.int32)}
    gates.write(args.outputs, inputs, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload, batch=args.batch,
                     lr=args.lr), "fashion_cnn.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="fashion-cnn", choices=["fashion-cnn", "fashion-mlp"])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--batch", type=int, default=64)
    timing.add_run_args(ap)
    gates.add_args(ap)
    ap.add_argument("--data", default=os.environ.get("MGN_FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    args = ap.parse_args()
    gates.check_args(ap, args)

    device = timing.pick_device(args.device)
    weights, _ = safetensors_lite.read(args.weights)
    xs, ys = load_batch(args.data, args.batch)
    x, y = torch.from_numpy(xs).to(device), torch.from_numpy(ys).to(device)
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    lines = timing.JsonLines(args.json)

    if args.outputs:
        gate_outputs(args, weights, x, y, device, meta)
        print(f"fashion_cnn.py: gate outputs in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "fashion_cnn.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        # timing.Phases for every implementation (CUDA-graph replay included); Phases above is the gates' eager form.
        ph = timing.Phases(build_model(args.workload, weights).to(device), args.lr, x, impl,
                           lambda out, y=y: F.cross_entropy(out, y))
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=args.batch, params=params, torch=torch.__version__)
        timing.time_phases(ph, common, phases, ("inference", "flb", "step"), args.warmup, args.samples, device,
                           lines.emit, compiled, ph.value)
    lines.close()


if __name__ == "__main__":
    main()
