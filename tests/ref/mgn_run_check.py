"""End-to-end check of `mgn inspect` and `mgn run`: exports a small CNN with torch.onnx.export, writes its
input as .npy, runs `mgn run --input x=x.npy --save-outputs DIR` and compares the saved output with
PyTorch's (relative L2 <= 1e-4); `mgn inspect` must list the ops and the input shape; a malformed input file
must be a clear error (nonzero exit, a message naming the file).

usage: mgn_run_check.py MGN WORKDIR [BACKEND]
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    backend = sys.argv[3] if len(sys.argv) > 3 else "auto"
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 3 * 3, 5)).eval()
    x = torch.randn(3, 2, 6, 6)
    path = os.path.join(work, "model.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=13)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    np.save(os.path.join(work, "x.npy"), x.numpy())

    out = subprocess.run([mgn, "inspect", path], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for needle in ("Conv", "MaxPool", "Gemm", "[3, 2, 6, 6]"):
        assert needle in out.stdout, f"inspect output lacks {needle!r}:\n{out.stdout}"

    outdir = os.path.join(work, "out")
    run = subprocess.run([mgn, "run", path, "--input", "x=" + os.path.join(work, "x.npy"), "--backend", backend,
                          "--save-outputs", outdir], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    got = np.load(os.path.join(outdir, "y.npy")).astype(np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"mgn run vs torch: relative L2 {err:.3g} ({run.stderr.strip()})")
    assert err <= 1e-4, err

    # A dynamic batch axis bound from the command line: --input x=5x2x6x6 (random values of that shape).
    dyn = os.path.join(work, "dyn.onnx")
    torch.onnx.export(model.float(), (x,), dyn, input_names=["x"], output_names=["y"], opset_version=13,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    run = subprocess.run([mgn, "run", dyn, "--input", "x=5x2x6x6"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("y [5,5]"), run.stdout

    bad = os.path.join(work, "bad.npy")
    with open(bad, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00garbage")
    run = subprocess.run([mgn, "run", path, "--input", "x=" + bad], capture_output=True, text=True)
    assert run.returncode != 0 and "bad.npy" in run.stderr, run.stderr
    print("ok")


if __name__ == "__main__":
    main()
