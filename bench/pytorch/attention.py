"""PyTorch side of `mgn bench attention`: causal grouped-query attention on the inputs mgn wrote (q [B, Hq, S, D],
k/v [B, Hkv, S, D], the upstream gradient do), forward (no grad) and forward + backward (dq, dk, dv for do).
torch.nn.functional.scaled_dot_product_attention where it exists (torch >= 2.0; the KV heads repeated to the
query heads first, as transformers' sdpa attention does, so the f32 memory-efficient kernel can run), else
the same function in plain ops (softmax of q·kᵀ/√D under the causal mask, times v).

  python3 bench/pytorch/attention.py --inputs attention.mgn_out.safetensors --outputs attention.torch_out.safetensors \\
      --json attention.torch.jsonl
"""
import math

import torch

from micro_common import requires_grad, run

HAVE_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")


def attention(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if HAVE_SDPA:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s + torch.full((n, m), float("-inf"), device=q.device).triu(1 + m - n)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def phase_fn(case, shape, phase, t):
    causal = bool(shape["causal"])
    if phase == "forward":
        state = {}

        def fn():
            with torch.no_grad():
                state["out"] = attention(t["q"], t["k"], t["v"], causal)
        return fn, lambda: (fn(), {"out": state["out"]})[1]
    if phase == "fwdbwd":
        q, k, v, do = requires_grad(t["q"]), requires_grad(t["k"]), requires_grad(t["v"]), t["do"]
        state = {}

        def fn():
            for x in (q, k, v):
                x.grad = None
            state["out"] = attention(q, k, v, causal)
            state["out"].backward(do)

        def result():
            fn()
            return {"out": state["out"], "grad.q": q.grad, "grad.k": k.grad, "grad.v": v.grad}
        return fn, result
    raise SystemExit(f"attention.py: unknown phase '{phase}' (forward, fwdbwd)")


if __name__ == "__main__":
    run(__doc__, "attention", lambda device: "sdpa" if HAVE_SDPA else "math", phase_fn)
