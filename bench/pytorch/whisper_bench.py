"""PyTorch side of `mgn bench whisper-tiny-encoder` / `whisper-encoder-tiny-test`: the Whisper encoder —
transformers' WhisperEncoder where transformers is installed (the GPU machine), else a plain-torch module with
the same state_dict names (CI) — the config from the weights file's metadata, our weights, the mel input from
our gate file (input.mel). Objective mean(last_hidden_state²) (the paper's), AdamW as mgn::AdamW. Phases
inference, flb (forward + loss + backward) and step; implementations eager, eager + CUDA-graph replay (CUDA
only: forward, backward and a capturable AdamW step captured whole) and torch.compile; strict and
accelerated; peak memory on CUDA. --outputs: the strict eager gate tensors; --f64-reference adds them in float64
(f64.*), --accelerated-reference with TF32 (acc.*, CUDA only): bench/pytorch/gates.py.

  python3 bench/pytorch/whisper_bench.py --weights w.safetensors --inputs mgn_out.safetensors \\
      --json torch.jsonl --outputs torch_out.safetensors [--model transformers|plain] [--f64-reference] \\
      [--accelerated-reference]
"""
import argparse
import json
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


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v)
        else:  # torch < 2.0 (Debian 12's 1.13)
            o = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v
        return self.out_proj(o.transpose(1, 2).reshape(B, T, d))


class Layer(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.self_attn = Attention(d, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class PlainEncoder(nn.Module):
    """WhisperEncoder's forward and state_dict names in plain torch (no transformers needed)."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.conv1 = nn.Conv1d(cfg["num_mel_bins"], d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg["max_source_positions"], d)
        self.embed_positions.requires_grad_(False)
        self.layers = nn.ModuleList(Layer(d, cfg["encoder_attention_heads"], cfg["encoder_ffn_dim"])
                                    for _ in range(cfg["encoder_layers"]))
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = x + self.embed_positions.weight[:x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class HfEncoder(nn.Module):
    """transformers' WhisperEncoder, returning last_hidden_state."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder
        hf = WhisperConfig(d_model=cfg["d_model"], encoder_layers=cfg["encoder_layers"],
                           encoder_attention_heads=cfg["encoder_attention_heads"],
                           encoder_ffn_dim=cfg["encoder_ffn_dim"], num_mel_bins=cfg["num_mel_bins"],
                           max_source_positions=cfg["max_source_positions"], dropout=0.0,
                           attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0)
        self.enc = WhisperEncoder(hf)

    def forward(self, mel):
        return self.enc(mel).last_hidden_state


def build_model(cfg, weights, kind):
    model = HfEncoder(cfg) if kind == "transformers" else PlainEncoder(cfg)
    sd = model.enc.state_dict() if kind == "transformers" else model.state_dict()
    if set(weights) != set(sd):
        raise ValueError(f"weights file: {sorted(set(weights) ^ set(sd))} differ from the model's names")
    target = model.enc if kind == "transformers" else model
    target.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    target.embed_positions.requires_grad_(False)
    return model


def Phases(model, lr, x, impl):
    """timing.Phases with the paper's objective, mean(last_hidden_state²)."""
    return timing.Phases(model, lr, x, impl, lambda h: (h * h).mean())


def gate_outputs(args, cfg, weights, x, device, meta):
    """Strict eager: last hidden state (as "logits", the harness's name for the inference output), loss, every
    gradient, and every parameter after one AdamW step; with --f64-reference / --accelerated-reference the same
    in float64 (f64.*) / with TF32 (acc.*): gates.py."""
    def compute(dev, dtype):
        xd = x.to(dev, dtype)

        def params(ph):
            named = (ph.model.enc if args.model == "transformers" else ph.model).named_parameters()
            return [(n, p) for n, p in named if p.requires_grad]

        def make():
            return Phases(build_model(cfg, weights, args.model).to(dev, dtype), args.lr, xd, "eager"), params, None
        return gates.model_tensors(make)

    gates.write(args.outputs, {"input.mel": x.cpu().numpy()}, compute, device, args,
                dict(meta, side="torch", impl="eager", mode="strict", workload=args.workload, batch=str(x.shape[0]),
                     lr=str(args.lr), model=args.model), "whisper_bench.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors file written by `mgn bench --weights`")
    ap.add_argument("--inputs", required=True, help="our gate file (`mgn bench --outputs`): input.mel")
    timing.add_run_args(ap)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--model", default="auto", choices=["auto", "transformers", "plain"],
                    help="auto: transformers' WhisperEncoder when transformers is installed")
    gates.add_args(ap)
    args = ap.parse_args()
    gates.check_args(ap, args)
    if args.model == "auto":
        try:
            import transformers  # noqa: F401
            args.model = "transformers"
        except ImportError:
            args.model = "plain"

    device = timing.pick_device(args.device)
    if device.type == "cpu":
        # Debian 12's torch 1.13: oneDNN's f32 conv1d backward returns zero weight gradients here (f64 and the
        # native kernels agree with each other and with us); the native CPU kernels are the reference.
        torch.backends.mkldnn.enabled = False
    weights, wmeta = safetensors_lite.read(args.weights)
    cfg = json.loads(wmeta["config"])
    args.workload = wmeta["workload"]
    ins, _ = safetensors_lite.read(args.inputs)
    x = torch.from_numpy(ins["input.mel"].astype(np.float32)).to(device)
    batch = int(x.shape[0])
    dev_name = timing.device_name(device)
    meta = {"backend": device.type, "device": dev_name, "torch": torch.__version__}
    params = sum(int(np.prod(v.shape)) for k, v in weights.items() if k != "embed_positions.weight")
    lines = timing.JsonLines(args.json)
    if args.outputs:
        gate_outputs(args, cfg, weights, x, device, meta)
        print(f"whisper_bench.py: gate outputs ({args.model}) in {args.outputs}", file=sys.stderr)

    phases, modes, impls = timing.run_lists(args, device, "whisper_bench.py")
    for mode, impl, compiled in timing.configurations(modes, impls):
        ph = Phases(build_model(cfg, weights, args.model).to(device), args.lr, x, impl)
        common = dict(side="torch", impl=impl, workload=args.workload, mode=mode, backend=device.type,
                      device=dev_name, batch=batch, frames=int(x.shape[2]), params=params,
                      torch=torch.__version__, model=args.model)
        timing.time_phases(ph, common, phases, ("inference", "flb", "step"), args.warmup, args.samples,
                           device, lines.emit, compiled, ph.value)
    lines.close()


if __name__ == "__main__":
    main()
