"""The SmolVLA action expert in plain torch (no lerobot), written from ../shared/reference/workload-specs.md §1,
with the spec's parameter names (state_dict keys "model.…", HF [out, in] linear weights), plus flow matching as
SmolVLA uses it. Used by tests/ref/smolvla_ref.py (CI, CPU) and bench/pytorch/smolvla_bench.py (GPU).

Config keys (as `mgn bench` writes them in the weights file's metadata): hidden, layers, heads, kv_heads,
head_dim, intermediate, action_dim, chunk, time_dim, vlm_kv_dim, vlm_tokens, rms_norm_eps, rope_theta,
attention ("paper" | "lerobot").

Inputs (a dict): noisy_actions [B, S, A], timestep [B, time_dim]; paper: vlm_kv_layer_{i} [B, P, vlm_kv_dim] for
odd i (the K and the V source); lerobot: vlm_k_layer_{i}, vlm_v_layer_{i} for every i.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PAPER = dict(hidden=720, layers=16, heads=15, kv_heads=5, head_dim=64, intermediate=2048, action_dim=32, chunk=50,
             time_dim=1440, vlm_kv_dim=320, vlm_tokens=16, rms_norm_eps=1e-5, rope_theta=10000.0, attention="paper")


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attn(nn.Module):
    def __init__(self, cfg, kin):
        super().__init__()
        H, q, kv = cfg["hidden"], cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
        self.q_proj = nn.Linear(H, q, bias=False)
        self.k_proj = nn.Linear(kin, kv, bias=False)
        self.v_proj = nn.Linear(kin, kv, bias=False)
        self.o_proj = nn.Linear(q, H, bias=False)


class Mlp(nn.Module):
    def __init__(self, H, F_):
        super().__init__()
        self.gate_proj = nn.Linear(H, F_, bias=False)
        self.up_proj = nn.Linear(H, F_, bias=False)
        self.down_proj = nn.Linear(F_, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg, cross):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden"], cfg["rms_norm_eps"])
        self.self_attn = Attn(cfg, cfg["vlm_kv_dim"] if cross else cfg["hidden"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden"], cfg["rms_norm_eps"])
        self.mlp = Mlp(cfg["hidden"], cfg["intermediate"])


def rope_cos_sin(first, n, head_dim, theta, dtype, device):
    """HF-style tables for positions first..first+n-1: angle[s, i] = pos_s · theta^(-2i/D), i < D/2. Computed
    on `device` in float64 (no host-to-device copy, so CUDA-graph capture works)."""
    f64 = dict(dtype=torch.float64, device=device)
    inv = theta ** (-torch.arange(0, head_dim // 2, **f64) * 2.0 / head_dim)
    ang = torch.arange(first, first + n, **f64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Half-split pairs (d, d + D/2): [x1·cos - x2·sin, x2·cos + x1·sin]."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q, k, v, n_rep, scale, mask):
    """GQA: query head h reads KV head h // n_rep; additive mask [Sq, Skv] or None. SDPA on CUDA (its default
    scale is 1/sqrt(head_dim), the one used here)."""
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention") and q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale: 1/sqrt(head_dim), its default
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    return torch.softmax(s, dim=-1) @ v


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden"]
        self.action_in_proj = nn.Linear(cfg["action_dim"], H)
        self.action_time_mlp_in = nn.Linear(cfg["time_dim"], H)
        self.action_time_mlp_out = nn.Linear(H, H)
        self.vlm_with_expert = nn.Module()
        self.vlm_with_expert.lm_expert = nn.Module()
        self.vlm_with_expert.lm_expert.layers = nn.ModuleList(Layer(cfg, i % 2 == 1) for i in range(cfg["layers"]))
        self.action_out_proj = nn.Linear(H, cfg["action_dim"])


class ActionExpert(nn.Module):
    """forward(inputs: dict) -> velocity [B, S, action_dim]."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(PAPER, **cfg)
        self.model = Model(self.cfg)

    def forward(self, inputs):
        c, m = self.cfg, self.model
        noisy = inputs["noisy_actions"]
        B, S, _ = noisy.shape
        P, nh, kvh, hd = c["vlm_tokens"], c["heads"], c["kv_heads"], c["head_dim"]
        lerobot = c["attention"] == "lerobot"
        x = m.action_in_proj(noisy)
        t = m.action_time_mlp_out(F.silu(m.action_time_mlp_in(inputs["timestep"])))
        x = x + t[:, None, :]
        dt, dev = x.dtype, x.device
        # The triu mask: self layers see key j from query s iff j <= s (+ P: the prefix, lerobot). Device ops
        # only (CUDA-graph capture allows no host-to-device copy).
        off = P if lerobot else 0
        self_mask = torch.full((S, S + off), float("-inf"), dtype=dt, device=dev).triu(off + 1)
        if lerobot:
            cs_self = rope_cos_sin(P, S, hd, c["rope_theta"], dt, dev)
            cs_cross = rope_cos_sin(0, S, hd, c["rope_theta"], dt, dev)
        heads = lambda u, n: u.view(B, u.shape[1], n, hd).transpose(1, 2)  # noqa: E731
        for i, layer in enumerate(m.vlm_with_expert.lm_expert.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = heads(a.q_proj(h), nh)
            if i % 2 == 0:
                k, v = heads(a.k_proj(h), kvh), heads(a.v_proj(h), kvh)
                if lerobot:
                    q, k = apply_rope(q, *cs_self), apply_rope(k, *cs_self)
                    k = torch.cat([heads(inputs[f"vlm_k_layer_{i}"], kvh), k], dim=2)
                    v = torch.cat([heads(inputs[f"vlm_v_layer_{i}"], kvh), v], dim=2)
                o = attend(q, k, v, nh // kvh, hd ** -0.5, self_mask)
            else:
                ks = inputs[f"vlm_k_layer_{i}"] if lerobot else inputs[f"vlm_kv_layer_{i}"]
                vs = inputs[f"vlm_v_layer_{i}"] if lerobot else inputs[f"vlm_kv_layer_{i}"]
                k, v = heads(a.k_proj(ks), kvh), heads(a.v_proj(vs), kvh)
                if lerobot:
                    q = apply_rope(q, *cs_cross)
                o = attend(q, k, v, nh // kvh, hd ** -0.5, None)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, S, nh * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.action_out_proj(x)


def input_names(cfg):
    c = dict(PAPER, **cfg)
    names = ["noisy_actions", "timestep"]
    for i in range(c["layers"]):
        if c["attention"] == "lerobot":
            names += [f"vlm_k_layer_{i}", f"vlm_v_layer_{i}"]
        elif i % 2 == 1:
            names.append(f"vlm_kv_layer_{i}")
    return names


def benchmark_inputs(cfg, chunk=None, dtype=torch.float32):
    """The spec's benchmark inputs at batch 1: noisy_actions sin(0.01 i), timestep sin(0.005 i), every VLM K/V
    input cos(0.01 i), target zeros."""
    c = dict(PAPER, **cfg)
    S = chunk or c["chunk"]
    idx = lambda n: torch.arange(n, dtype=torch.float64)  # noqa: E731
    out = {"noisy_actions": torch.sin(0.01 * idx(S * c["action_dim"])).view(1, S, c["action_dim"]),
           "timestep": torch.sin(0.005 * idx(c["time_dim"])).view(1, c["time_dim"])}
    for n in input_names(c)[2:]:
        out[n] = torch.cos(0.01 * idx(c["vlm_tokens"] * c["vlm_kv_dim"])).view(1, c["vlm_tokens"], c["vlm_kv_dim"])
    return {k: v.to(dtype) for k, v in out.items()}


# ---- flow matching (SmolVLA's convention: t = 1 is noise, t = 0 is data)

def time_features(t, dim, dtype=torch.float64):
    """[sin(2πt/p_k), cos(2πt/p_k)], periods p_k = 4e-3·(4/4e-3)^linspace(0, 1, dim/2): [len(t), dim]."""
    t = torch.as_tensor(t, dtype=torch.float64).reshape(-1)
    frac = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = 4e-3 * (4.0 / 4e-3) ** frac
    ang = 2.0 * math.pi * t[:, None] / period[None, :]
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=1).to(dtype)


def flow_target(actions, noise, t):
    """x_t = t·noise + (1 - t)·actions, u = noise - actions; t per batch row."""
    tt = torch.as_tensor(t, dtype=actions.dtype).reshape(-1, *([1] * (actions.dim() - 1)))
    return tt * noise + (1 - tt) * actions, noise - actions


@torch.no_grad()
def euler_sample(expert, noise, vlm, steps=10):
    """x from t = 1 (noise) to t = 0 by `steps` Euler steps of dt = -1/steps; vlm: the K/V inputs."""
    x, dt = noise.clone(), -1.0 / steps
    B = noise.shape[0]
    for k in range(steps):
        t = 1.0 + k * dt
        feats = time_features([t] * B, expert.cfg["time_dim"], noise.dtype).to(noise.device)
        v = expert(dict(vlm, noisy_actions=x, timestep=feats))
        x = x + dt * v
    return x
