"""PyTorch side of `mgn bench dinov3-vits16` / `dinov3-test` (the DINOv3 ViT: transformers' DINOv3ViTModel where
transformers has it (the GPU machine), else a plain-torch module with the same state_dict names (CI);
objective mean(last_hidden_state²), the paper's) and `mgn bench dinovision` / `dinovision-test` (DinoVision's
decoder, docs/dinovision.md's layer list; objective MSE against the target). The workload and config come from
the weights file's metadata, the inputs from our gate file (input.pixel_values, or input.features and
input.target). AdamW as mgn::AdamW. Phases inference, flb (forward + loss + backward) and step; implementations
eager, eager + CUDA-graph replay (CUDA only: forward, backward and a capturable AdamW step captured whole) and
torch.compile; strict and accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors;
--f64-reference adds them in float64 (f64.*), --accelerated-reference with TF32 (acc.*, CUDA only):
bench/pytorch/gates.py.

  python3 bench/pytorch/dinov3_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors [--model transformers|plain] [--f64-reference] \\
      [--accelerated-reference]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import timing  # noqa: E402


# ---- the ViT in plain torch (DINOv3ViTModel's forward and names)

def rope_tables(hd, theta, gh, gw, device, dtype=torch.float32):
    """cos, sin of the axial RoPE, computed in dtype (float32 as transformers does; float64 for the f64 reference)."""
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / hd, dtype=dtype, device=device)
    ch = torch.arange(0.5, gh, dtype=dtype, device=device) / gh
    cw = torch.arange(0.5, gw, dtype=dtype, device=device) / gw
    coords = 2.0 * torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1) - 1.0
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2).tile(2)
    return torch.cos(angles), torch.sin(angles)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, d, heads, npre):
        super().__init__()
        self.heads, self.npre = heads, npre
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        n = self.npre

        def rot(t):
            return torch.cat((t[:, :, :n], t[:, :, n:] * cos + rotate_half(t[:, :, n:]) * sin), dim=2)

        q, k = rot(q), rot(k)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v)
        else:  # torch < 2.0 (Debian 12's 1.13)
            o = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, d))


class LayerScale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.lambda1


class Mlp(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class Layer(nn.Module):
    def __init__(self, d, heads, f, npre, eps):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.attention = Attention(d, heads, npre)
        self.layer_scale1, self.layer_scale2 = LayerScale(d), LayerScale(d)
        self.mlp = Mlp(d, f)

    def forward(self, x, cos, sin):
        x = x + self.layer_scale1(self.attention(self.norm1(x), cos, sin))
        return x + self.layer_scale2(self.mlp(self.norm2(x)))


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, p = cfg["hidden_size"], cfg["patch_size"]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d))
        self.register_tokens = nn.Parameter(torch.zeros(1, cfg["num_register_tokens"], d))
        self.patch_embeddings = nn.Conv2d(cfg["num_channels"], d, p, stride=p)

    def forward(self, px):
        B = px.shape[0]
        x = self.patch_embeddings(px).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(B, -1, -1), self.register_tokens.expand(B, -1, -1), x], dim=1)


class PlainViT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg["hidden_size"]
        self.embeddings = Embeddings(cfg)
        self.layer = nn.ModuleList(Layer(d, cfg["num_attention_heads"], cfg["intermediate_size"],
                                         1 + cfg["num_register_tokens"], cfg["layer_norm_eps"])
                                   for _ in range(cfg["num_hidden_layers"]))
        self.norm = nn.LayerNorm(d, eps=cfg["layer_norm_eps"])

    def forward(self, px):
        p = self.cfg["patch_size"]
        cos, sin = rope_tables(self.cfg["hidden_size"] // self.cfg["num_attention_heads"], self.cfg["rope_theta"],
                               px.shape[2] // p, px.shape[3] // p, px.device,
                               torch.float64 if px.dtype == torch.float64 else torch.float32)
        x = self.embeddings(px)
        for layer in self.layer:
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype))
        return self.norm(x)


class HfViT(nn.Module):
    """transformers' DINOv3ViTModel, returning last_hidden_state (RoPE coordinate augmentation off: the
    training-time shift / jitter / rescale would make flb and step random)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import DINOv3ViTConfig, DINOv3ViTModel
        hf = DINOv3ViTConfig(**{k: v for k, v in cfg.items()}, drop_path_rate=0.0, attention_dropout=0.0,
                             pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=None)
        self.enc = DINOv3ViTModel(hf)

    def forward(self, px):
        return self.enc(pixel_values=px).last_hidden_state


# ---- the DinoVision decoder

class Stage(nn.Module):
    def __init__(self, cin, cout, groups, eps):
        super().__init__()
        self.norm = nn.GroupNorm(groups, cin, eps=eps)
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        w, g, eps = cfg["widths"], cfg["groups"], cfg["eps"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], w[0], 3, padding=1)
        self.block = Stage(w[0], w[0], g, eps)
        self.up = nn.ModuleList(Stage(w[i], w[i + 1], g, eps) for i in range(4))
        self.out = Stage(w[4], 3, g, eps)

    def forward(self, x):
        x = self.conv_in(x)
        x = self.block.conv(F.silu(self.block.norm(x)))
        for u in self.up:
            x = u.conv(F.interpolate(F.silu(u.norm(x)), scale_factor=2, mode="nearest"))
        return self.out.conv(F.silu(self.out.norm(x)))


def is_vit(workload):
    return workload.startswith("dinov3")


def build_model(cfg, weights, kind, workload):
    if not is_vit(workload):
        model = target = Decoder(cfg)
    elif kind == "transformers":
        model = HfViT(cfg)
        target = model.enc
    else:
        model = target = PlainViT(cfg)
    sd = target.state_dict()
    # transformers 5.x nests the blocks as model.layer.{i} where the checkpoint (and ours) says layer.{i}: map
    # our names onto the module's where only that prefix differs (ours_of maps them back for the gate files).
    to_hf = {k: k if k in sd or ("model." + k) not in sd else "model." + k for k in weights}
    target.ours_of = {v: k for k, v in to_hf.items()}
    if set(to_hf.values()) != set(sd):
        raise ValueError(f"weights file: {sorted(set(to_hf.values()) ^ set(sd))} differ from the model's names")
    target.load_state_dict({to_hf[k]: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    return model, target


def objective(workload, out, target):
    return (out * out).mean() if is_vit(workload) else F.mse_loss(out, target)


def Phases(model, lr, x, target, workload, impl):
    """timing.Phases with the workload's objective (the ViT: mean(out²); the decoder: MSE to the image)."""
    return timing.Phases(model, lr, x, impl, lambda out: objective(workload, out, target))


def gate_outputs(args, cfg, weights, x, target, device, meta):
    """Strict eager: the output (as "logits", the harness's name for the inference output), loss, every
    gradient, and every parameter after one AdamW step; with --f64-reference / --accelerated-reference the same
    in float64 (f64.*) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd, td = x.to(dev, dtype), None if target is None else target.to(dev, dtype)

        def make():
            model, tgt = build_model(cfg, weights, args.model, args.workload)
            ph = Phases(model.to(dev, dtype), args.lr, xd, td, args.workload, "eager")
            return ph, lambda ph: [(tgt.ours_of.get(n, n), p) for n, p in tgt.named_parameters()], None
        return gates.model_tensors(make)

    if is_vit(args.workload):
        inputs = {"input.pixel_values": x.cpu().numpy()}
    else:
        inputs = {"input.features": x.cpu().numpy(), "input.target": target.cpu().numpy()}
    gates.write(args.outputs, inputs, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload, batch=str(x.shape[0]),
                     lr=str(args.lr), model=args.model), "dinov3_bench.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True,
                    help="our gate file (`mgn bench --outputs`): input.pixel_values, or input.features + input.target")
    timing.add_run_args(ap)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--model", default="auto", choices=["auto", "transformers", "plain"],
                    help="the ViT: auto takes transformers' DINOv3ViTModel where transformers has it")
    gates.add_args(ap)
    args = ap.parse_args()
    gates.check_args(ap, args)
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    if args.model == "auto":
        try:
            from transformers import DINOv3ViTModel  # noqa: F401
            args.model = "transformers" if is_vit(args.workload) else "plain"
        except ImportError:
            args.model = "plain"

    device = timing.pick_device(args.device)
    if device.type == "cpu":
        # Debian 12's torch 1.13: oneDNN's f32 conv backward returned zero weight gradients for conv1d
        # (whisper_bench.py); the native CPU kernels are the reference.
        torch.backends.mkldnn.enabled = False
    ins, _ = safetensors_lite.read(args.inputs)
    if is_vit(args.workload):
        x, target = torch.from_numpy(ins["input.pixel_values"].astype(np.float32)).to(device), None
    else:
        x = torch.from_numpy(ins["input.features"].astype(np.float32)).to(device)
        target = torch.from_numpy(ins["input.target"].astype(np.float32)).to(device)
    batch = int(x.shape[0])
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for v in weights.values())
    image = int(x.shape[2]) if is_vit(args.workload) else int(target.shape[2])
    lines = timing.JsonLines(args.json)
    if args.outputs:
        gate_outputs(args, cfg, weights, x, target, device, meta)
        print(f"dinov3_bench.py: gate outputs ({args.model}) in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "dinov3_bench.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        model, _ = build_model(cfg, weights, args.model, args.workload)
        ph = Phases(model.to(device), args.lr, x, target, args.workload, impl)
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=batch, image=image, params=params, torch=torch.__version__,
                      model=args.model)
        timing.time_phases(ph, common, phases, ("inference", "flb", "step"), args.warmup, args.samples,
                           device, lines.emit, compiled, ph.value)
    lines.close()


if __name__ == "__main__":
    main()
