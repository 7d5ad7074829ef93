"""Timing shared by the PyTorch reference scripts: every call synchronized (CUDA), warm-up first, wall
clock per call in milliseconds — the same protocol as `mgn bench` (docs/benchmarks.md)."""
import time

import numpy as np
import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_calls(fn, warmup, samples, device):
    """Raw per-call times in ms, in the order taken."""
    for _ in range(warmup):
        fn()
    sync(device)
    ms = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms


def summary(ms, warmup):
    p25, p50, p75 = (float(np.percentile(ms, q)) for q in (25, 50, 75))
    return {"warmup": warmup, "samples": len(ms), "median_ms": p50, "p25_ms": p25, "p75_ms": p75,
            "iqr_ms": p75 - p25, "min_ms": min(ms), "max_ms": max(ms), "samples_ms": ms}
