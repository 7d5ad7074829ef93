"""PyTorch side of `mgn bench-gemm`: torch.mm f32 with TF32 off (strict) and on (tf32, CUDA only), after warm-up;
CUDA-event timing on CUDA, synchronized wall clock elsewhere. Prints one JSON line per shape and mode
(median, IQR, TFLOP/s); bench/compare.py puts them next to mgn bench-gemm's lines. --dtype f16 times f16
inputs instead (mode "f16": cuBLAS tensor cores, f32 accumulation), the reference for `mgn bench-gemm --f16`.

  python3 bench/pytorch/gemm.py [--device auto|cuda|cpu] [--dtype f32|f16] [--warmup 5] [--warmup-ms 500] [--samples 20]
         MxNxK...
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402


def bench(m, n, k, strict, device, warmup=5, samples=20, dtype="f32"):
    timing.set_mode("strict" if strict else "accelerated")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(m, k, device=device, generator=g)
    b = torch.rand(k, n, device=device, generator=g)
    if dtype == "f16":
        a, b = a.half(), b.half()
    warm = None
    if device.type == "cuda":
        warm = timing.warm_up(lambda: torch.mm(a, b), warmup, device)
        times = []
        for _ in range(samples):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.mm(a, b)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    else:
        times = timing.time_calls(lambda: torch.mm(a, b), warmup, samples, device)
        warm = (times.warmup_calls, times.warmup_ms)
    p25, med, p75 = (float(np.percentile(times, q)) for q in (25, 50, 75))
    return {"side": "torch", "impl": "cublas" if device.type == "cuda" else "cpu", "mode": "f16" if dtype == "f16" else "strict" if strict else "tf32",
            "backend": device.type, "device": timing.device_name(device), "torch": torch.__version__,
            "m": m, "n": n, "k": k, "median_ms": med, "p25_ms": p25, "p75_ms": p75, "iqr_ms": p75 - p25,
            "min_ms": min(times), "warmup": warm[0], "warmup_ms": warm[1], "tflops": 2.0 * m * n * k / (med * 1e-3) / 1e12}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="*", default=["4096x4096x4096"])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16"])
    timing.add_warmup_args(ap)
    args = ap.parse_args()
    dev = timing.pick_device(args.device)
    if args.dtype == "f16" and dev.type != "cuda":
        sys.exit("gemm.py: --dtype f16 needs CUDA (the CPU has no f16 matmul in every torch build)")
    for (m, n, k) in [tuple(int(v) for v in s.split("x")) for s in args.shapes]:
        modes = (False,) if args.dtype == "f16" else (True, False) if dev.type == "cuda" else (True,)
        for strict in modes:
            print(json.dumps(bench(m, n, k, strict, dev, args.warmup, args.samples, args.dtype)), flush=True)
