"""Whisper encoder in plain torch for tests/whisper_test.cpp (run through test::run_torch), written from the
spec (../shared/reference/workload-specs.md §3) and transformers' WhisperEncoder, not from our builder.

Inputs:  "cfg" f64 [d_model, layers, heads, ffn, mels, max_source_positions, float64]
         "mel" f32 [B, mels, frames]; "w.<name>" every encoder tensor (WhisperEncoder state_dict names)
Outputs: "last_hidden_state" [B, T, d]; "loss" = mean(last_hidden_state²);
         "grad.<name>" d loss / d param for every trainable tensor (embed_positions is not trainable)
"""
import sys

import torch
import torch.nn.functional as F

import torch_io


def encoder(w, mel, d, layers, heads):
    x = F.gelu(F.conv1d(mel, w["conv1.weight"], w["conv1.bias"], padding=1))
    x = F.gelu(F.conv1d(x, w["conv2.weight"], w["conv2.bias"], stride=2, padding=1))
    x = x.permute(0, 2, 1)
    B, T, _ = x.shape
    x = x + w["embed_positions.weight"][:T]
    hd = d // heads
    for i in range(layers):
        p = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (d,), p("self_attn_layer_norm.weight"), p("self_attn_layer_norm.bias"), 1e-5)
        q = (F.linear(h, p("self_attn.q_proj.weight"), p("self_attn.q_proj.bias")) * hd ** -0.5)
        k = F.linear(h, p("self_attn.k_proj.weight"))
        v = F.linear(h, p("self_attn.v_proj.weight"), p("self_attn.v_proj.bias"))
        q, k, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(a, p("self_attn.out_proj.weight"), p("self_attn.out_proj.bias"))
        h = F.layer_norm(x, (d,), p("final_layer_norm.weight"), p("final_layer_norm.bias"), 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, p("fc1.weight"), p("fc1.bias"))), p("fc2.weight"), p("fc2.bias"))
    return F.layer_norm(x, (d,), w["layer_norm.weight"], w["layer_norm.bias"], 1e-5)


def main():
    ins = torch_io.read(sys.argv[1])
    cfg = [float(v) for v in ins["cfg"]]
    d, layers, heads = int(cfg[0]), int(cfg[1]), int(cfg[2])
    dtype = torch.float64 if cfg[6] else torch.float32
    w = {k[2:]: v.to(dtype).requires_grad_(k != "w.embed_positions.weight") for k, v in ins.items()
         if k.startswith("w.")}
    out = encoder(w, ins["mel"].to(dtype), d, layers, heads)
    loss = (out * out).mean()
    loss.backward()
    res = {"last_hidden_state": out.detach(), "loss": loss.detach()}
    for k, v in w.items():
        if v.requires_grad:
            res["grad." + k] = v.grad
    torch_io.write(sys.argv[2], res)


if __name__ == "__main__":
    main()
