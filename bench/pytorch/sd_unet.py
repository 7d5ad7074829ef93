"""The paper's conditioned SD-1.x-style U-Net (`SDUNetConfig::small()`, 10,928,768 parameters) in plain torch,
written from ../shared/reference/workload-specs.md §2 (no diffusers), with the canonical parameter names of
include/mgn/unet.h so that weights exchange as safetensors.

Used by tests/ref/sd_unet_ref.py (the CI gates, f64 on the CPU) and bench/pytorch/sd_unet_bench.py (the GPU
benchmark). Batched: latent [B, C, H, W], timestep embedding [B, T], context [B, L, D] (a 2-D context [L, D] is
taken as batch 1, the spec's benchmark form).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    in_channels: int = 4
    base_channels: int = 64
    levels: int = 3
    groups: int = 16
    eps: float = 1e-5
    time_input_dim: int = 64
    time_embed_dim: int = 256
    context_dim: int = 768
    context_len: int = 77
    head_dim: int = 32
    latent: int = 32

    @staticmethod
    def small():
        return Config()

    @staticmethod
    def tiny():
        return Config(base_channels=32, groups=8, time_input_dim=32, time_embed_dim=128, latent=16)


class ResBlock(nn.Module):
    def __init__(self, ci, co, temb, groups, eps):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, ci, eps=eps)
        self.conv1 = nn.Conv2d(ci, co, 3, padding=1, bias=False)
        self.time_proj = nn.Linear(temb, co)
        self.norm2 = nn.GroupNorm(groups, co, eps=eps)
        self.conv2 = nn.Conv2d(co, co, 3, padding=1, bias=False)
        if ci != co:
            self.res_conv = nn.Conv2d(ci, co, 1, bias=False)

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(temb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.res_conv(x) if hasattr(self, "res_conv") else x)


class Attention(nn.Module):
    def __init__(self, dim, kv_dim, head_dim):
        super().__init__()
        self.heads, self.head_dim = dim // head_dim, head_dim
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(kv_dim, dim, bias=False)
        self.v_proj = nn.Linear(kv_dim, dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, kv):
        B, S, D = x.shape
        L = kv.shape[1]
        q = self.q_proj(x).view(B, S, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv).view(B, L, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv).view(B, L, self.heads, self.head_dim).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0 (the GPU machine): PyTorch's fused kernels
            a = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim)
        else:  # Debian 12's torch 1.13
            a = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1) @ v
        return self.out_proj(a.transpose(1, 2).reshape(B, S, D))


class TransformerBlock(nn.Module):
    def __init__(self, c, ctx, head_dim, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(c, eps=eps)
        self.self_attn = Attention(c, c, head_dim)
        self.norm2 = nn.LayerNorm(c, eps=eps)
        self.cross_attn = Attention(c, ctx, head_dim)
        self.norm3 = nn.LayerNorm(c, eps=eps)
        self.ff = nn.Module()
        self.ff.fc1 = nn.Linear(c, 4 * c)
        self.ff.fc2 = nn.Linear(4 * c, c)

    def forward(self, x, context):
        h = self.norm1(x)
        x = x + self.self_attn(h, h)
        x = x + self.cross_attn(self.norm2(x), context)
        return x + self.ff.fc2(F.gelu(self.ff.fc1(self.norm3(x)), approximate="tanh"))


class SpatialTransformer(nn.Module):
    def __init__(self, c, ctx, head_dim, groups, eps):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=eps)
        self.proj_in = nn.Conv2d(c, c, 1, bias=False)
        self.transformer = TransformerBlock(c, ctx, head_dim, eps)
        self.proj_out = nn.Conv2d(c, c, 1, bias=False)

    def forward(self, x, context):
        B, C, H, W = x.shape
        tokens = self.proj_in(self.norm(x)).reshape(B, C, H * W).transpose(1, 2)  # row-major over (h, w)
        tokens = self.transformer(tokens, context)
        return x + self.proj_out(tokens.transpose(1, 2).reshape(B, C, H, W))


class ConvOut(nn.Module):
    """conv_out.norm (GroupNorm) -> SiLU -> conv_out.weight (3x3, no bias)."""

    def __init__(self, c, out, groups, eps):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=eps)
        self.weight = nn.Parameter(torch.empty(out, c, 3, 3))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x):
        return F.conv2d(F.silu(self.norm(x)), self.weight, padding=1)


class SDUNet(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        ch = [cfg.base_channels << level for level in range(cfg.levels)]
        g, e, t, ctx, hd = cfg.groups, cfg.eps, cfg.time_embed_dim, cfg.context_dim, cfg.head_dim
        self.time_mlp = nn.Module()
        self.time_mlp.fc1 = nn.Linear(cfg.time_input_dim, t)
        self.time_mlp.fc2 = nn.Linear(t, t)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.base_channels, 3, padding=1, bias=False)
        self.encoder = nn.ModuleList()
        prev = cfg.base_channels
        for level, c in enumerate(ch):
            m = nn.Module()
            m.resblock = ResBlock(prev, c, t, g, e)
            if level > 0:
                m.attn = SpatialTransformer(c, ctx, hd, g, e)
            if level < cfg.levels - 1:
                m.downsample = nn.Conv2d(c, c, 3, stride=2, padding=1, bias=False)
            self.encoder.append(m)
            prev = c
        self.middle = nn.Module()
        self.middle.resblock = ResBlock(prev, prev, t, g, e)
        self.middle.attn = SpatialTransformer(prev, ctx, hd, g, e)
        dec = [None] * cfg.levels
        for level in reversed(range(cfg.levels)):
            m = nn.Module()
            m.resblock = ResBlock(prev + ch[level], ch[level], t, g, e)
            if level > 0:
                m.attn = SpatialTransformer(ch[level], ctx, hd, g, e)
            dec[level] = m
            prev = ch[level]
        self.decoder = nn.ModuleList(dec)  # decoder.{level}
        self.conv_out = ConvOut(cfg.base_channels, cfg.in_channels, g, e)

    def forward(self, x, timestep_embedding, context):
        if context.dim() == 2:
            context = context.unsqueeze(0).expand(x.shape[0], -1, -1)
        temb = self.time_mlp.fc2(F.silu(self.time_mlp.fc1(timestep_embedding)))
        x = self.conv_in(x)
        skips = []
        for level, m in enumerate(self.encoder):
            x = m.resblock(x, temb)
            if level > 0:
                x = m.attn(x, context)
            skips.append(x)
            if level < self.cfg.levels - 1:
                x = m.downsample(x)
        x = self.middle.resblock(x, temb)
        x = self.middle.attn(x, context)
        for level in reversed(range(self.cfg.levels)):
            m = self.decoder[level]
            if level < self.cfg.levels - 1:
                x = F.interpolate(x, scale_factor=2, mode="nearest")
            x = torch.cat([x, skips[level]], dim=1)
            x = m.resblock(x, temb)
            if level > 0:
                x = m.attn(x, context)
        return self.conv_out(x)


def name_seed(name):
    h = 0
    for b in name.encode("ascii"):
        h = (h * 31 + b) % 2**32
    return h % 10000


def paper_init(model):
    """The paper's deterministic init: norms 1 / 0; every other tensor 0.02·sin(0.01·j + seed(name)), 2-D
    weights generated [in, out] and stored transposed."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm" in name:
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
                continue
            n = p.numel()
            v = torch.sin(torch.arange(n, dtype=torch.float64) * 0.01 + name_seed(name)) * 0.02
            if p.dim() == 2:
                out_f, in_f = p.shape
                p.copy_(v.view(in_f, out_f).T.to(p.dtype))
            else:
                p.copy_(v.view_as(p).to(p.dtype))
    return model


def bench_inputs(cfg, batch=1, device="cpu"):
    """The spec's benchmark inputs: noisy_latent = sin(0.01 i), timestep_embedding = sin(0.005 i),
    text_context = 0.1·cos(0.003 i) ([L, D], shared by the batch), noise_target = cos(0.007 i)."""
    n = batch * cfg.in_channels * cfg.latent * cfg.latent
    shape = (batch, cfg.in_channels, cfg.latent, cfg.latent)
    ar = lambda k: torch.arange(k, dtype=torch.float64)  # noqa: E731
    return {
        "noisy_latent": torch.sin(ar(n) * 0.01).float().reshape(shape).to(device),
        "timestep_embedding": torch.sin(ar(batch * cfg.time_input_dim) * 0.005).float()
        .reshape(batch, cfg.time_input_dim).to(device),
        "text_context": (0.1 * torch.cos(ar(cfg.context_len * cfg.context_dim) * 0.003)).float()
        .reshape(cfg.context_len, cfg.context_dim).to(device),
        "noise_target": torch.cos(ar(n) * 0.007).float().reshape(shape).to(device),
    }


# ---- diffusion, from the DDPM / DDIM papers (independent of include/mgn/unet.h's C++)

def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    a = t.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1)


def alphas_cumprod(steps=1000, beta_start=1e-4, beta_end=0.02):
    betas = torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
    return torch.cumprod(1.0 - betas, dim=0)


def add_noise(ac, x0, noise, t):
    a = ac[t].reshape(-1, *([1] * (x0.dim() - 1)))
    return a.sqrt() * x0 + (1 - a).sqrt() * noise


def ddim_step(ac, x, eps, t, t_prev, clip=0.0):
    """One DDIM step (eta 0) from t to t_prev (t_prev < 0: alpha-bar 1). With clip > 0 the predicted x0 is
    clamped to [-clip, clip] and the noise recomputed from it."""
    a = ac[t]
    ap = ac[t_prev] if t_prev >= 0 else torch.tensor(1.0, dtype=torch.float64)
    x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
    if clip > 0:
        x0 = x0.clamp(-clip, clip)
        eps = (x - a.sqrt() * x0) / (1 - a).sqrt()
    return ap.sqrt() * x0 + (1 - ap).sqrt() * eps


def ddim_sample(net, noise, context, steps, clip=1.0, train_steps=1000):
    """DDIM from `noise` over `steps` of the training timesteps ("leading" spacing: ratio = 1000 // steps,
    t = (steps-1)·ratio, ..., ratio, 0), float64 arithmetic around the network."""
    ac = alphas_cumprod(train_steps)
    ratio = train_steps // steps
    ts = [k * ratio for k in reversed(range(steps))]
    x = noise.double()
    dtype = next(net.parameters()).dtype
    for i, t in enumerate(ts):
        t_prev = ts[i + 1] if i + 1 < len(ts) else -1
        temb = timestep_embedding(torch.full((x.shape[0],), t), net.cfg.time_input_dim)
        with torch.no_grad():
            eps = net(x.to(dtype), temb.to(dtype), context.to(dtype)).double()
        x = ddim_step(ac, x, eps, t, t_prev, clip)
    return x
