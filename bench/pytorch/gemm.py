"""PyTorch side of `mgn bench-gemm`: torch.mm f32 on CUDA with TF32 off (strict) and on (accelerated), timed
with CUDA events after warm-up (median of samples). Prints one JSON line per shape and mode."""
import json
import statistics
import sys

import torch


def bench(m, n, k, strict, warmup=5, samples=20):
    torch.backends.cuda.matmul.allow_tf32 = not strict
    torch.backends.cudnn.allow_tf32 = not strict
    torch.set_float32_matmul_precision("highest" if strict else "high")
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand(m, k, device="cuda", generator=g)
    b = torch.rand(k, n, device="cuda", generator=g)
    for _ in range(warmup):
        torch.mm(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.mm(a, b)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    med = statistics.median(times)
    return {"side": "torch", "mode": "strict" if strict else "tf32", "m": m, "n": n, "k": k,
            "median_ms": med, "min_ms": min(times), "tflops": 2.0 * m * n * k / (med * 1e-3) / 1e12}


if __name__ == "__main__":
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1:]] or [(4096, 4096, 4096)]
    for (m, n, k) in shapes:
        for strict in (True, False):
            print(json.dumps(bench(m, n, k, strict)), flush=True)
