"""`mgn unet train` then `mgn unet sample` end to end on a few Fashion-MNIST images (tiny config cut to 2 levels,
Vulkan where there is a device): the run folder holds what docs/unet.md says, every logged loss is finite, the
weights file loads into the plain-torch reference (bench/pytorch/sd_unet.py) by name with every shape as torch
has it, and the sample grid is a PNG of the documented size.

argv: mgn work_dir
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import torch

import torch_io

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import sd_unet  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    if not os.path.isdir(FASHION):
        print("dataset-fashion-mnist is not installed")
        sys.exit(1 if os.environ.get("MGN_REQUIRE_REFERENCES") else 77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run = os.path.join(work, "run")
    r = subprocess.run([mgn, "unet", "train", "--run", run, "--data", FASHION, "--config", "tiny", "--levels", "2",
                        "--batch", "2", "--steps", "3", "--limit", "8", "--progress", "1"],
                       capture_output=True, text=True)
    print(r.stdout, r.stderr)
    if r.returncode != 0:
        fail(f"unet train exited {r.returncode}")
    for f in ("run.json", "unet.safetensors", "checkpoint.safetensors", "metrics.jsonl"):
        if not os.path.isfile(os.path.join(run, f)):
            fail(f"the run folder has no {f}")
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    kinds = [rec["kind"] for rec in records]
    if kinds != ["run", "step", "step", "step", "end"]:
        fail(f"metrics records {kinds}")
    losses = [rec["loss"] for rec in records if rec["kind"] == "step"]
    if not all(math.isfinite(v) and v > 0 for v in losses):
        fail(f"losses {losses}")
    # At initialization the prediction is near 0 and the target is N(0, 1) noise: the MSE is near 1.
    if not 0.3 < losses[0] < 3.0:
        fail(f"first loss {losses[0]} is far from E[noise^2] = 1")

    cfg = json.load(open(os.path.join(run, "run.json")))["unet"]
    net = sd_unet.SDUNet(sd_unet.Config(**{k: v for k, v in cfg.items()}))
    weights = torch_io.read(os.path.join(run, "unet.safetensors"))
    missing, unexpected = set(net.state_dict()) - set(weights), set(weights) - set(net.state_dict())
    if missing or unexpected:
        fail(f"names differ from the torch reference: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    for name, t in net.state_dict().items():
        if tuple(weights[name].shape) != tuple(t.shape):
            fail(f"{name}: {tuple(weights[name].shape)} vs torch {tuple(t.shape)}")
    net.load_state_dict(weights, strict=True)

    png = os.path.join(work, "grid.png")
    r = subprocess.run([mgn, "unet", "sample", "--run", run, "--sample-steps", "2", "--per-class", "1", "--out", png,
                        "--clip", "0"],
                       capture_output=True, text=True)
    print(r.stdout, r.stderr)
    if r.returncode != 0:
        fail(f"unet sample exited {r.returncode}")
    data = open(png, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("the grid is not a PNG")
    w, h = struct.unpack(">II", data[16:24])
    if (w, h) != (10 * 16 + 11 * 2, 16 + 2 * 2):
        fail(f"grid size {w}x{h}")
    # The sampler end to end: the plain-torch network with the trained weights, run in float64 by DDIM from the
    # same noise and class tokens (the embedding, schedule and steps recomputed here; no clipping, so that every
    # value depends on the network's predictions).
    vals = torch_io.read(os.path.join(work, "grid.safetensors"))
    net = net.double()
    want = sd_unet.ddim_sample(net, vals["noise"], vals["text_context"], steps=2, clip=0.0)
    err = float((vals["samples"].double() - want).norm() / want.norm())
    print(f"DDIM samples vs torch float64: relative L2 {err:.2e}")
    if not err < 1e-4:
        fail(f"the DDIM samples differ from the torch reference: relative L2 {err:.2e}")
    # The class tokens: 1 at dims j = label mod 10, labels 0..9 in order.
    ctx = vals["text_context"]
    for b in range(10):
        if not torch.equal(ctx[b, 0], (torch.arange(ctx.shape[2]) % 10 == b).float()):
            fail(f"class token of sample {b}")
    # A run folder without weights: a clear error naming the file.
    os.remove(os.path.join(run, "unet.safetensors"))
    r = subprocess.run([mgn, "unet", "sample", "--run", run], capture_output=True, text=True)
    if r.returncode != 1 or "unet.safetensors" not in r.stderr:
        fail(f"sample without weights: exit {r.returncode}, {r.stderr.strip()!r}")
    print("ok")


if __name__ == "__main__":
    main()
