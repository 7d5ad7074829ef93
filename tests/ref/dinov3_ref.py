"""DINOv3 ViT in plain torch for tests/dinov3_test.cpp (run through test::run_torch), written from the spec
(../shared/reference/workload-specs.md §4) and transformers' DINOv3ViTModel, not from our builder: the RoPE
tables are computed here as transformers computes them (f32), the prefix tokens split off and left unrotated.

Inputs:  "cfg" f64 [hidden, layers, heads, intermediate, patch, registers, rope_theta, eps, float64, final_norm]
         "pixel_values" f32 [B, C, H, W]; "w.<name>" every tensor (DINOv3ViTModel state_dict names, no bias
         entries for k_proj)
Outputs: "last_hidden_state" [B, 1 + R + N, D]; "loss" = mean(last_hidden_state²);
         "grad.<name>" d loss / d param for every tensor the forward uses (not the mask token)
"""
import math
import sys

import torch
import torch.nn.functional as F

import torch_io


def rope(hd, theta, gh, gw):
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / hd, dtype=torch.float32)
    ch = torch.arange(0.5, gh, dtype=torch.float32) / gh
    cw = torch.arange(0.5, gw, dtype=torch.float32) / gw
    coords = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1)
    coords = 2.0 * coords - 1.0
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2).tile(2)
    return torch.cos(angles), torch.sin(angles)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def vit(w, px, d, layers, heads, patch, regs, theta, eps, final_norm):
    B, _, H, W = px.shape
    gh, gw = H // patch, W // patch
    x = F.conv2d(px, w["embeddings.patch_embeddings.weight"], w["embeddings.patch_embeddings.bias"], stride=patch)
    x = x.flatten(2).transpose(1, 2)
    parts = [w["embeddings.cls_token"].expand(B, -1, -1)]
    if regs:
        parts.append(w["embeddings.register_tokens"].expand(B, -1, -1))
    x = torch.cat(parts + [x], dim=1)
    T = x.shape[1]
    hd = d // heads
    cos, sin = rope(hd, theta, gh, gw)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    npre = 1 + regs

    def rot(t):
        pre, pat = t[:, :, :npre], t[:, :, npre:]
        return torch.cat((pre, pat * cos + rotate_half(pat) * sin), dim=2)

    for i in range(layers):
        p = lambda n: w.get(f"layer.{i}.{n}")  # noqa: E731
        h = F.layer_norm(x, (d,), p("norm1.weight"), p("norm1.bias"), eps)
        q = F.linear(h, p("attention.q_proj.weight"), p("attention.q_proj.bias"))
        k = F.linear(h, p("attention.k_proj.weight"))
        v = F.linear(h, p("attention.v_proj.weight"), p("attention.v_proj.bias"))
        q, k, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in (q, k, v))
        q, k = rot(q), rot(k)
        a = torch.softmax((q @ k.transpose(-1, -2)) * hd ** -0.5, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(a, p("attention.o_proj.weight"), p("attention.o_proj.bias")) * p("layer_scale1.lambda1")
        h = F.layer_norm(x, (d,), p("norm2.weight"), p("norm2.bias"), eps)
        h = F.gelu(F.linear(h, p("mlp.up_proj.weight"), p("mlp.up_proj.bias")))
        x = x + F.linear(h, p("mlp.down_proj.weight"), p("mlp.down_proj.bias")) * p("layer_scale2.lambda1")
    if final_norm:
        x = F.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], eps)
    return x


def main():
    ins = torch_io.read(sys.argv[1])
    cfg = [float(v) for v in ins["cfg"]]
    d, layers, heads, _, patch, regs = (int(v) for v in cfg[:6])
    theta, eps, f64, final_norm = cfg[6], cfg[7], cfg[8], cfg[9]
    dtype = torch.float64 if f64 else torch.float32
    w = {k[2:]: v.to(dtype).requires_grad_(True) for k, v in ins.items() if k.startswith("w.")}
    out = vit(w, ins["pixel_values"].to(dtype), d, layers, heads, patch, regs, theta, eps, bool(final_norm))
    loss = (out * out).mean()
    loss.backward()
    res = {"last_hidden_state": out.detach(), "loss": loss.detach()}
    for k, v in w.items():
        if v.grad is not None:
            res["grad." + k] = v.grad
    torch_io.write(sys.argv[2], res)


if __name__ == "__main__":
    main()
