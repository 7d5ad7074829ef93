"""Synthetic data for `mgn smolvla train|act` (the VLM is out of scope, docs/smolvla.md): per example, the VLM K/V
inputs of every layer the expert reads, N(0, 1), and an action chunk that depends on them (so that there is
something to learn): actions[n, s, a] = tanh(mean over tokens of vlm_0[n, :, a mod W]) + 0.1·sin(s/5 + a), with
vlm_0 the first VLM K/V input. numpy only.

  python3 bench/pytorch/smolvla_data.py OUT.safetensors [--examples 64] [--config paper|reduced]
      [--attention paper|lerobot] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402

CONFIGS = {"paper": dict(layers=16, action_dim=32, chunk=50, vlm_kv_dim=320, vlm_tokens=16),
           "reduced": dict(layers=4, action_dim=8, chunk=6, vlm_kv_dim=16, vlm_tokens=5)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--config", default="paper", choices=sorted(CONFIGS))
    ap.add_argument("--attention", default="paper", choices=["paper", "lerobot"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c, n = CONFIGS[a.config], a.examples
    rng = np.random.default_rng(a.seed)
    names = []
    for i in range(c["layers"]):
        if a.attention == "lerobot":
            names += [f"vlm_k_layer_{i}", f"vlm_v_layer_{i}"]
        elif i % 2 == 1:
            names.append(f"vlm_kv_layer_{i}")
    out = {k: rng.standard_normal((n, c["vlm_tokens"], c["vlm_kv_dim"])).astype(np.float32) for k in names}
    A, S, W = c["action_dim"], c["chunk"], c["vlm_kv_dim"]
    feat = np.tanh(out[names[0]].mean(axis=1)[:, np.arange(A) % W] * np.sqrt(c["vlm_tokens"]))  # [n, A]
    wave = 0.1 * np.sin(np.arange(S)[:, None] / 5.0 + np.arange(A)[None, :])                  # [S, A]
    out["actions"] = (feat[:, None, :] + wave[None]).astype(np.float32)
    safetensors_lite.write(a.out, out, {"config": a.config, "attention": a.attention, "examples": str(n)})
    print(f"smolvla_data.py: {n} examples, {len(names)} VLM K/V tensors + actions [{n}, {S}, {A}] in {a.out}")


if __name__ == "__main__":
    main()
