"""`mgn smolvla train|act` end to end (ctest SmolVLACli) with the reduced config: synthetic VLM K/V and action
chunks written here; train lowers the flow-matching loss; act's 10-step Euler sample from its saved noise is
recomputed by the plain-torch expert (bench/pytorch/smolvla_expert.py) with the trained weights, in float64;
mis-shaped VLM K/V, noisy-action data and missing tensors are refused naming the tensor and the expected shape.

  python3 tests/ref/smolvla_cli_check.py MGN OUT_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
import smolvla_expert as se  # noqa: E402
import torch_io  # noqa: E402

REDUCED = dict(hidden=48, layers=4, heads=3, kv_heads=1, head_dim=16, intermediate=64, action_dim=8, chunk=6,
               time_dim=24, vlm_kv_dim=16, vlm_tokens=5, attention="paper")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(mgn, args):
    r = subprocess.run([mgn, "smolvla"] + args, capture_output=True, text=True, timeout=240)
    print("$ mgn smolvla " + " ".join(args) + f"  -> rc {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    g = torch.Generator().manual_seed(0)
    N, c = 4, REDUCED
    # Synthetic "VLM" K/V per example, and actions that depend on them (so there is something to learn).
    data = {f"vlm_kv_layer_{i}": torch.randn(N, c["vlm_tokens"], c["vlm_kv_dim"], generator=g) for i in (1, 3)}
    base = torch.randn(1, c["chunk"], c["action_dim"], generator=g)
    data["actions"] = (base + 0.5 * data["vlm_kv_layer_1"][:, :1, :c["action_dim"]]).contiguous()
    path = os.path.join(work, "data.safetensors")
    torch_io.write(path, data)
    common = ["--config", "reduced", "--backend", "auto"]

    w = os.path.join(work, "w.safetensors")
    r = run(mgn, ["train", "--data", path, "--out", w, "--steps", "200", "--lr", "2e-3", "--batch", "4",
                  "--progress", "50"] + common)
    check(r.returncode == 0, "train exits 0")
    m = re.search(r"steps ([0-9.]+) -> ([0-9.]+)", r.stdout)
    check(m is not None and float(m.group(2)) < 0.85 * float(m.group(1)), "train lowers the flow-matching loss")

    a = os.path.join(work, "a.safetensors")
    r = run(mgn, ["act", "--data", path, "--weights", w, "--out", a, "--seed", "5"] + common)
    check(r.returncode == 0, "act exits 0")
    if r.returncode == 0:
        got = torch_io.read(a)
        expert = se.ActionExpert(c).double()
        expert.load_state_dict({k: v.double() for k, v in torch_io.read(w).items()})
        vlm = {k: v.double() for k, v in data.items() if k.startswith("vlm_")}
        ref = se.euler_sample(expert, got["noise"].double(), vlm, 10)
        check(tuple(got["actions"].shape) == (N, c["chunk"], c["action_dim"]), "act writes [N, 6, 8] actions")
        err = float((got["actions"].double() - ref).norm() / ref.norm())
        check(err <= 1e-4, f"act's Euler sample matches torch's (rel-L2 {err:.2e})")

    # Bad inputs: named with the expected shape, before anything compiles.
    bad = dict(data, vlm_kv_layer_3=torch.zeros(N, c["vlm_tokens"], 20))
    torch_io.write(os.path.join(work, "bad.safetensors"), bad)
    r = run(mgn, ["act", "--data", os.path.join(work, "bad.safetensors"), "--weights", w, "--out", a] + common)
    check(r.returncode == 1 and "'vlm_kv_layer_3' has shape [4,5,20], expected [4,5,16]" in r.stderr,
          "a mis-shaped VLM K/V tensor is named with the expected shape")
    miss = {k: v for k, v in data.items() if k != "vlm_kv_layer_1"}
    torch_io.write(os.path.join(work, "miss.safetensors"), miss)
    r = run(mgn, ["act", "--data", os.path.join(work, "miss.safetensors"), "--weights", w, "--out", a] + common)
    check(r.returncode == 1 and "no tensor 'vlm_kv_layer_1'" in r.stderr, "a missing VLM K/V tensor is named")
    acts = dict(data, actions=torch.zeros(N, c["chunk"], 7))
    torch_io.write(os.path.join(work, "acts.safetensors"), acts)
    r = run(mgn, ["train", "--data", os.path.join(work, "acts.safetensors"), "--out", w, "--steps", "1"] + common)
    check(r.returncode == 1 and "'actions'" in r.stderr and "[4,6,8]" in r.stderr,
          "mis-shaped action chunks are named with the expected shape")
    r = run(mgn, ["act", "--data", path, "--weights", path, "--out", a] + common)
    check(r.returncode == 1 and "model.action_in_proj.weight" in r.stderr and "[48,8]" in r.stderr,
          "a weights file without the expert's tensors names the first missing one")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
