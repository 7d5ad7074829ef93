"""The conditioned U-Net and the DDPM / DDIM arithmetic in plain torch (bench/pytorch/sd_unet.py, written from
the spec, not from our builder) for tests/unet_test.cpp, run through test::run_torch.

Model mode, inputs: "cfg" f64 [in_channels, base_channels, levels, groups, time_input_dim, time_embed_dim,
context_dim, head_dim, float64]; "noisy_latent", "timestep_embedding", "text_context" [B, L, D], "noise_target";
"w.<name>" every parameter. Outputs: "noise_pred", "loss" = mean((noise_pred - noise_target)²), "grad.<name>".

Diffusion mode (input "t" present): "t" i32 [B], "x0", "noise", "dim" f64 [1], "ddim" i32 [t, t_prev], "x",
"eps". Outputs: "temb" (sinusoidal embedding of t), "alphas_cumprod" (1000 linear betas 1e-4..0.02),
"x_t" (q(x_t | x0)), "x_prev" (one DDIM step of x with eps from t to t_prev).
"""
import os
import sys

import torch

import torch_io

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import sd_unet  # noqa: E402


def diffusion(ins):
    t = ins["t"].long()
    ac = sd_unet.alphas_cumprod(1000, 1e-4, 0.02)
    x0, noise = ins["x0"].double(), ins["noise"].double()
    tt, tp = [int(v) for v in ins["ddim"]]
    return {
        "temb": sd_unet.timestep_embedding(t, int(ins["dim"][0])),
        "alphas_cumprod": ac,
        "x_t": sd_unet.add_noise(ac, x0, noise, t),
        "x_prev": sd_unet.ddim_step(ac, ins["x"].double(), ins["eps"].double(), tt, tp),
    }


def model(ins):
    c = [float(v) for v in ins["cfg"]]
    cfg = sd_unet.Config(in_channels=int(c[0]), base_channels=int(c[1]), levels=int(c[2]), groups=int(c[3]),
                         time_input_dim=int(c[4]), time_embed_dim=int(c[5]), context_dim=int(c[6]),
                         head_dim=int(c[7]))
    dtype = torch.float64 if c[8] else torch.float32
    net = sd_unet.SDUNet(cfg).to(dtype)
    params = dict(net.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(ins["w." + name].to(dtype))
    if len(params) != sum(1 for k in ins if k.startswith("w.")):
        raise SystemExit("the weights given are not the reference model's parameters")
    out = net(ins["noisy_latent"].to(dtype), ins["timestep_embedding"].to(dtype), ins["text_context"].to(dtype))
    loss = ((out - ins["noise_target"].to(dtype)) ** 2).mean()
    loss.backward()
    res = {"noise_pred": out.detach(), "loss": loss.detach()}
    for name, p in params.items():
        res["grad." + name] = p.grad
    return res


def main():
    torch.set_num_threads(2)
    torch.backends.mkldnn.enabled = False  # oneDNN's f32 conv backward is wrong in Debian's torch 1.13
    ins = torch_io.read(sys.argv[1])
    torch_io.write(sys.argv[2], diffusion(ins) if "t" in ins else model(ins))


if __name__ == "__main__":
    main()
