"""Protocol shared by the PyTorch reference scripts (docs/benchmarks.md): every call synchronized (CUDA),
warm-up first, wall clock per call in milliseconds — the same as `mgn bench`; the precision modes; AdamW's
hyperparameters; JSON lines."""
import json
import sys
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


# mgn::AdamW defaults (include/mgn/optim.h); the lr is a flag on both sides.
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}


def set_mode(mode):
    """strict: TF32 off (matmul and cuDNN), matmul precision "highest"; accelerated: TF32 allowed."""
    strict = mode == "strict"
    torch.backends.cuda.matmul.allow_tf32 = not strict
    torch.backends.cudnn.allow_tf32 = not strict
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest" if strict else "high")


def pick_device(name):
    """auto: CUDA when available, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def cpu_modes(modes, device, script):
    """On the CPU only strict has a meaning (TF32 is a GPU format)."""
    if device.type == "cpu" and "accelerated" in modes:
        print(f"{script}: CPU: accelerated (TF32) has no meaning, strict only", file=sys.stderr)
        return [m for m in modes if m != "accelerated"]
    return modes


class JsonLines:
    """One JSON object per line, to stdout and (when a path is given) to that file."""

    def __init__(self, path):
        self.file = open(path, "w") if path else None

    def emit(self, record):
        s = json.dumps(record)
        print(s, flush=True)
        if self.file:
            self.file.write(s + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()


def time_with_peak(fn, warmup, samples, device):
    """time_calls, and torch.cuda.max_memory_allocated over the warm-up and the samples (None off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    ms = time_calls(fn, warmup, samples, device)
    return ms, (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)
