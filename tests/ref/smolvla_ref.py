"""SmolVLA action expert reference for tests/smolvla_test.cpp (run through test::run_torch): the plain-torch
expert of bench/pytorch/smolvla_expert.py (written from the spec, not from our builder).

Inputs:  "cfg" f64 [hidden, layers, heads, kv_heads, head_dim, intermediate, action_dim, chunk, time_dim,
                    vlm_kv_dim, vlm_tokens, lerobot (0/1), float64 (0/1), euler steps (0: none)]
         "w.<name>" every parameter; "in.<name>" every graph input (noisy_actions, timestep, VLM K/V, target);
         with euler steps: "noise" [B, S, A]
Outputs: "velocity"; "loss" = mean((velocity - target)²); "grad.<name>" for every parameter;
         with euler steps: "actions" (the Euler sampler from "noise" with the same VLM K/V) and
         "time_features" (of t = 1, 1 - 1/steps, ..., one row each)
"""
import os
import sys

import torch

import torch_io

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import smolvla_expert as se  # noqa: E402

KEYS = ["hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "action_dim", "chunk", "time_dim",
        "vlm_kv_dim", "vlm_tokens"]


def main():
    ins = torch_io.read(sys.argv[1])
    c = [float(v) for v in ins["cfg"]]
    cfg = {k: int(c[i]) for i, k in enumerate(KEYS)}
    cfg["attention"] = "lerobot" if c[11] else "paper"
    dtype = torch.float64 if c[12] else torch.float32
    steps = int(c[13])
    expert = se.ActionExpert(cfg).to(dtype)
    sd = expert.state_dict()
    given = {k[2:]: v for k, v in ins.items() if k.startswith("w.")}
    if set(given) != set(sd):
        raise ValueError(f"names differ: {sorted(set(given) ^ set(sd))}")
    expert.load_state_dict({k: v.to(dtype) for k, v in given.items()})
    x = {k[3:]: v.to(dtype) for k, v in ins.items() if k.startswith("in.")}
    out = expert(x)
    loss = ((out - x["target"]) ** 2).mean()
    loss.backward()
    res = {"velocity": out.detach(), "loss": loss.detach()}
    for k, p in expert.named_parameters():
        res["grad." + k] = p.grad
    if steps:
        vlm = {k: v for k, v in x.items() if k.startswith("vlm_")}
        res["actions"] = se.euler_sample(expert, ins["noise"].to(dtype), vlm, steps)
        res["time_features"] = se.time_features([1.0 - k / steps for k in range(steps)], cfg["time_dim"])
    torch_io.write(sys.argv[2], res)


if __name__ == "__main__":
    main()
