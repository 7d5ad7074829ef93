"""The PyTorch anchor of DinoVision: the same decoder (docs/dinovision.md's layer list), the same initial
weights, the same data order and the same optimizer (Adam, MSE), trained with torch on the same cached
features that `mgn dinovision train` wrote, then evaluated the same way (global PSNR over the held-out crops
clamped to [0, 1]; median SSIM with the 11 x 11 Gaussian window). Passes when |PSNR - meganeura's| <= --tol.

Usage: dinovision_anchor.py RUN_DIR [--device cpu|cuda] [--tol 0.2] [--json OUT]
RUN_DIR holds run.json, features.safetensors, order.safetensors, init.safetensors and metrics.json.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402


class Decoder(nn.Module):
    def __init__(self, in_channels, widths, groups, eps):
        super().__init__()
        w = widths

        def stage(cin, cout):
            m = nn.Module()
            m.norm = nn.GroupNorm(groups, cin, eps=eps)
            m.conv = nn.Conv2d(cin, cout, 3, padding=1)
            return m

        self.conv_in = nn.Conv2d(in_channels, w[0], 3, padding=1)
        self.block = stage(w[0], w[0])
        self.up = nn.ModuleList([stage(w[i], w[i + 1]) for i in range(4)])
        self.out = stage(w[4], 3)

    def forward(self, x):
        x = self.conv_in(x)
        x = self.block.conv(F.silu(self.block.norm(x)))
        for u in self.up:
            x = u.conv(F.interpolate(F.silu(u.norm(x)), scale_factor=2, mode="nearest"))
        return self.out.conv(F.silu(self.out.norm(x)))


def ssim(a, b):
    """a, b: [3, H, W] float64 tensors in [0, 1]; skimage's structural_similarity(gaussian_weights=True,
    sigma=1.5, use_sample_covariance=False, data_range=1), i.e. the interior mean of the SSIM map."""
    r = 5
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float64) / 1.5) ** 2)
    k = k / k.sum()
    win = (k[:, None] * k[None, :])[None, None]
    x, y = a[:, None], b[:, None]
    f = lambda t: F.conv2d(t, win)  # noqa: E731  valid: the pixels at least r from the border
    mx, my = f(x), f(y)
    vx, vy, vxy = f(x * x) - mx * mx, f(y * y) - my * my, f(x * y) - mx * my
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mx * my + c1) * (2 * vxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tol", type=float, default=0.2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if torch.cuda.is_available():  # f32 arithmetic, as meganeura's strict precision
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    if dev.type == "cpu":
        # Debian 12's torch 1.13: oneDNN's f32 conv backward returned zero weight gradients for conv1d
        # (bench/pytorch/whisper_bench.py); the native CPU kernels are the reference.
        torch.backends.mkldnn.enabled = False
    run = json.load(open(os.path.join(args.run_dir, "run.json")))
    feats, _ = safetensors_lite.read(os.path.join(args.run_dir, "features.safetensors"))
    order, _ = safetensors_lite.read(os.path.join(args.run_dir, "order.safetensors"))
    init, _ = safetensors_lite.read(os.path.join(args.run_dir, "init.safetensors"))
    ours = json.load(open(os.path.join(args.run_dir, "metrics.json")))

    model = Decoder(run["hidden_size"], run["widths"], run["groups"], run["eps"]).to(dev)
    state = model.state_dict()
    missing = set(state) - set(init)
    if missing:
        sys.exit(f"init.safetensors lacks {sorted(missing)}")
    model.load_state_dict({k: torch.from_numpy(init[k]) for k in state})
    opt = run["optimizer"]
    adam = torch.optim.Adam(model.parameters(), lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    xf = torch.from_numpy(feats["train.features"]).to(dev)
    yt = torch.from_numpy(feats["train.targets"]).to(dev)
    idx = torch.from_numpy(order["order"].astype(np.int64)).to(dev)
    steps = idx.shape[0]
    t0 = time.time()
    for step in range(steps):
        i = idx[step]
        x, y = xf[i], yt[i].float() / 255.0
        loss = F.mse_loss(model(x), y)
        adam.zero_grad(set_to_none=True)
        loss.backward()
        adam.step()
        if (step + 1) % max(1, steps // 10) == 0:
            print(f"step {step + 1}/{steps}: loss {loss.item():.6f}", file=sys.stderr)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t0

    model.eval()
    vf = torch.from_numpy(feats["val.features"]).to(dev)
    vt = torch.from_numpy(feats["val.targets"]).double() / 255.0
    with torch.no_grad():
        rec = torch.cat([model(vf[i:i + 8]) for i in range(0, vf.shape[0], 8)]).double().cpu().clamp(0, 1)
    mse = float(((rec - vt) ** 2).mean())
    psnr = 10 * math.log10(1 / mse)
    ssims = [ssim(rec[i], vt[i]) for i in range(rec.shape[0])]
    result = {"psnr_db": psnr, "ssim_median": float(np.median(ssims)), "mse": mse, "steps": steps,
              "train_seconds": train_s, "device": str(dev), "torch": torch.__version__,
              "meganeura_psnr_db": ours["psnr_db"], "meganeura_ssim_median": ours["ssim_median"],
              "psnr_diff_db": psnr - ours["psnr_db"], "tol_db": args.tol}
    try:  # skimage, where installed, confirms the SSIM formula
        from skimage.metrics import structural_similarity
        sk = [structural_similarity(rec[i].numpy(), vt[i].numpy(), gaussian_weights=True, sigma=1.5,
                                    use_sample_covariance=False, data_range=1.0, channel_axis=0)
              for i in range(rec.shape[0])]
        result["ssim_median_skimage"] = float(np.median(sk))
    except ImportError:
        pass
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = abs(result["psnr_diff_db"]) <= args.tol
    print(f"anchor: torch {psnr:.3f} dB, meganeura {ours['psnr_db']:.3f} dB, diff {psnr - ours['psnr_db']:+.3f} dB "
          f"(tolerance {args.tol}): {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
