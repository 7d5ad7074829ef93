"""PyTorch reference for mgn::nn::self_attention (Llama attention: q/k/v/o projections, HF rotate_half RoPE,
grouped-query heads, causal SDPA), float64 on the C++ side's weights."""
import torch
import torch.nn.functional as F

import torch_io


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def run(t):
    heads, kv_heads, theta = int(t["cfg"][0]), int(t["cfg"][1]), float(t["cfg"][2])
    x = t["x"].double()
    b, s, hidden = x.shape
    hd = hidden // heads
    w = {k: t[f"attn.{k}.weight"].double() for k in ["q_proj", "k_proj", "v_proj", "o_proj"]}
    q = F.linear(x, w["q_proj"]).view(b, s, heads, hd).transpose(1, 2)
    k = F.linear(x, w["k_proj"]).view(b, s, kv_heads, hd).transpose(1, 2)
    v = F.linear(x, w["v_proj"]).view(b, s, kv_heads, hd).transpose(1, 2)
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = heads // kv_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    # Written out (Debian's torch 1.13 has no F.scaled_dot_product_attention).
    scores = (q @ k.transpose(-1, -2)) / (hd ** 0.5)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    o = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
    y = F.linear(o.transpose(1, 2).reshape(b, s, hidden), w["o_proj"])
    return {"y": y}


torch_io.main(run)
