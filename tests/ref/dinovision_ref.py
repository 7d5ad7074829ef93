"""DinoVision references for tests/dinovision_test.cpp (run through test::run_torch), written from the layer
list in docs/dinovision.md, not from our builder.

Decoder mode: inputs "cfg" f64 [in_channels, grid, groups, w0..w4, float64], "features" [B, D, g, g],
"target" [B, 3, 16g, 16g], "w.<name>" every decoder tensor -> "image", "loss" (mean squared error),
"grad.<name>".
SSIM mode: inputs "ssim.a" and "ssim.b" [n, 3, H, W] -> "ssim" [n] from skimage.metrics.structural_similarity
(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1, channel_axis=0) and "psnr" [n]
from skimage.metrics.peak_signal_noise_ratio(data_range=1).
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

import torch_io


def decoder(w, x, groups):
    def conv(t, n):
        return F.conv2d(t, w[n + ".weight"], w[n + ".bias"], padding=1)

    def norm_act(t, n):
        return F.silu(F.group_norm(t, groups, w[n + ".weight"], w[n + ".bias"], 1e-5))

    x = conv(x, "conv_in")
    x = conv(norm_act(x, "block.norm"), "block.conv")
    for i in range(4):
        x = conv(F.interpolate(norm_act(x, f"up.{i}.norm"), scale_factor=2, mode="nearest"), f"up.{i}.conv")
    return conv(norm_act(x, "out.norm"), "out.conv")


def main():
    ins = torch_io.read(sys.argv[1])
    res = {}
    if "ssim.a" in ins:
        from skimage.metrics import peak_signal_noise_ratio, structural_similarity
        a, b = ins["ssim.a"].double().numpy(), ins["ssim.b"].double().numpy()
        res["ssim"] = torch.tensor([structural_similarity(a[i], b[i], gaussian_weights=True, sigma=1.5,
                                                          use_sample_covariance=False, data_range=1.0,
                                                          channel_axis=0) for i in range(a.shape[0])])
        res["psnr"] = torch.tensor([peak_signal_noise_ratio(a[i], b[i], data_range=1.0) for i in range(a.shape[0])])
        torch_io.write(sys.argv[2], res)
        return
    cfg = [float(v) for v in ins["cfg"]]
    groups, f64 = int(cfg[2]), cfg[8]
    dtype = torch.float64 if f64 else torch.float32
    w = {k[2:]: v.to(dtype).requires_grad_(True) for k, v in ins.items() if k.startswith("w.")}
    out = decoder(w, ins["features"].to(dtype), groups)
    loss = ((out - ins["target"].to(dtype)) ** 2).mean()
    loss.backward()
    res = {"image": out.detach(), "loss": loss.detach()}
    for k, v in w.items():
        res["grad." + k] = v.grad
    torch_io.write(sys.argv[2], res)


if __name__ == "__main__":
    main()
