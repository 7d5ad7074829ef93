"""End-to-end check of `mgn inspect` and `mgn run` on NNEF models: tests/ref/nnef_models.py writes the
hand-written models and PyTorch's float64 outputs; `mgn run DIR --input x=x.npy --save-outputs OUT` must match
them (relative L2 <= 1e-4) for the conv and the conv + linear (float16 weights) models, `mgn inspect` must list
the version, inputs, ops and variables, a graph.nnef path works like its folder, and a truncated .dat file must be
a clear error naming the file. `mgn export MODEL.onnx --nnef DIR` on a CNN exported by torch.onnx.export must give
an NNEF folder whose `mgn run` output matches torch.

usage: mgn_run_nnef_check.py MGN WORKDIR
"""
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    models = os.path.join(work, "models")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nnef_models.py"), models],
                   check=True)
    for case, target in (("conv", "conv"), ("train", "train/graph.nnef")):
        d = os.path.join(models, case)
        ref = st_io.read(os.path.join(d, "ref.safetensors"))
        np.save(os.path.join(work, case + "_x.npy"), ref["in.x"].astype(np.float32))
        out = os.path.join(work, case + "_out")
        run = subprocess.run([mgn, "run", os.path.join(models, target), "--input", "x=" + os.path.join(work, case + "_x.npy"),
                              "--save-outputs", out], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "NNEF 1.0" in run.stderr, run.stderr
        outs = [k[4:] for k in ref if k.startswith("out.")]
        for name in outs:
            got = np.load(os.path.join(out, name + ".npy")).astype(np.float64)
            want = ref["out." + name]
            assert got.shape == want.shape, (case, name, got.shape, want.shape)
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            print(f"{case} {name}: mgn run vs torch relative L2 {err:.3g}")
            assert err <= 1e-4, (case, name, err)

    ins = subprocess.run([mgn, "inspect", os.path.join(models, "conv")], capture_output=True, text=True)
    assert ins.returncode == 0, ins.stderr
    for needle in ("NNEF 1.0", "x: [2, 3, 9, 9]", "conv x4", "deconv x1", "conv1/filter [4, 3, 3, 3]"):
        assert needle in ins.stdout, f"inspect output lacks {needle!r}:\n{ins.stdout}"
    ops = subprocess.run([mgn, "inspect", "--supported-ops", "--nnef"], capture_output=True, text=True)
    assert ops.returncode == 0 and "conv\n" in ops.stdout and "batch_normalization\n" in ops.stdout, ops.stdout

    broken = os.path.join(work, "broken")
    shutil.copytree(os.path.join(models, "train"), broken)
    path = os.path.join(broken, "fc", "weight.dat")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-10])
    run = subprocess.run([mgn, "run", broken], capture_output=True, text=True)
    assert run.returncode != 0 and "fc/weight.dat" in run.stderr and "truncated" in run.stderr, run.stderr

    # ONNX -> NNEF: a torch CNN exported to ONNX, converted by `mgn export --nnef`, run from the NNEF folder.
    import torch
    import torch.nn as nn
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, stride=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 2 * 2, 5), nn.Softmax(dim=1)).eval()
    x = torch.randn(3, 2, 8, 8)
    onnx_path = os.path.join(work, "cnn.onnx")
    torch.onnx.export(model, (x,), onnx_path, input_names=["x"], output_names=["y"], opset_version=13)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    nnef_dir = os.path.join(work, "cnn_nnef")
    exp = subprocess.run([mgn, "export", onnx_path, "--nnef", nnef_dir], capture_output=True, text=True)
    assert exp.returncode == 0, exp.stdout + exp.stderr
    assert os.path.isfile(os.path.join(nnef_dir, "graph.nnef")), os.listdir(nnef_dir)
    np.save(os.path.join(work, "cnn_x.npy"), x.numpy())
    run = subprocess.run([mgn, "run", nnef_dir, "--input", "x=" + os.path.join(work, "cnn_x.npy"), "--save-outputs",
                          os.path.join(work, "cnn_out")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    got = np.load(os.path.join(work, "cnn_out", "y.npy")).astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"onnx -> mgn export --nnef -> mgn run vs torch: relative L2 {err:.3g}")
    assert got.shape == want.shape and err <= 1e-4, (got.shape, err)
    print("ok")


if __name__ == "__main__":
    main()
