"""Protocol shared by the PyTorch reference scripts (docs/benchmarks.md): every call synchronized (CUDA),
warm-up first, wall clock per call in milliseconds — the same as `mgn bench`; the precision modes; AdamW's
hyperparameters; JSON lines."""
import argparse
import importlib
import json
import sys
import time

import numpy as np
import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# The warm-up rule of both sides (tools/bench_common.h, Warmup): at least --warmup calls and at least this many
# milliseconds of them, so that the GPU's clock is up again after the idle time of a compile.
WARMUP_MS = 500.0


def set_warmup_ms(value):
    global WARMUP_MS
    if value < 0:
        raise ValueError("--warmup-ms must be >= 0")
    WARMUP_MS = float(value)


class Samples(list):
    """Raw per-call times in ms, in the order taken, and the warm-up actually done before them."""
    warmup_calls = 0
    warmup_ms = 0.0


def warm_up(fn, warmup, device):
    """At least `warmup` synchronized calls and at least WARMUP_MS of them; returns (calls, ms)."""
    t0, n = time.perf_counter(), 0
    while n < warmup or (WARMUP_MS > 0 and (time.perf_counter() - t0) * 1e3 < WARMUP_MS):
        fn()
        sync(device)  # every call, as in the timed loop: the time floor counts finished work, not launches
        n += 1
    return n, (time.perf_counter() - t0) * 1e3


def time_calls(fn, warmup, samples, device):
    """Samples: per-call times in ms after the warm-up."""
    ms = Samples()
    ms.warmup_calls, ms.warmup_ms = warm_up(fn, warmup, device)
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms


def summary(ms, warmup):
    """The JSON fields of a phase; `warmup` is the requested count (used when `ms` is a plain list)."""
    p25, p50, p75 = (float(np.percentile(ms, q)) for q in (25, 50, 75))
    done = isinstance(ms, Samples)
    return {"warmup": ms.warmup_calls if done else warmup, "warmup_ms": ms.warmup_ms if done else 0.0,
            "samples": len(ms), "median_ms": p50, "p25_ms": p25, "p75_ms": p75,
            "iqr_ms": p75 - p25, "min_ms": min(ms), "max_ms": max(ms), "samples_ms": list(ms)}


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


class _WarmupMs(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        if values < 0:
            parser.error("--warmup-ms must be >= 0")
        set_warmup_ms(values)
        setattr(namespace, self.dest, values)


def add_warmup_args(ap):
    """--warmup (calls), --warmup-ms (the time floor; parsing it sets WARMUP_MS) and --samples."""
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_MS, action=_WarmupMs)
    ap.add_argument("--samples", type=int, default=20)


def add_run_args(ap, phases="compile,inference,flb,step"):
    """The flags every model script shares: the protocol, the configurations, the outputs, the device."""
    add_warmup_args(ap)
    ap.add_argument("--phases", default=phases)
    ap.add_argument("--modes", default="strict,accelerated", help="on the CPU only strict is run")
    ap.add_argument("--impls", default="eager,compiled")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", help="write the JSON lines here too (they always go to stdout)")
    ap.add_argument("--outputs", help="write the gate tensors of the strict eager model here")


# The implementations of the PyTorch side: eager; eager + CUDA-graph replay ("cudagraph": each phase captured whole,
# cuda_graph); and torch.compile in the mode given here: "compiled" Inductor's kernels launched one by one,
# "compiled-graph" mode="reduce-overhead" (the same kernels replayed from CUDA graphs; CUDA only). Compiled
# variants compile the model in their mode and the AdamW update in the default mode (PyTorch's recipe
# "compiling the optimizer").
IMPLS = ("eager", "cudagraph", "compiled", "compiled-graph")
COMPILE_MODES = {"compiled": "default", "compiled-graph": "reduce-overhead"}
CUDA_ONLY = ("cudagraph", "compiled-graph")


def compile_mode(impl):
    """torch.compile's mode of a compiled implementation, None for the others."""
    return COMPILE_MODES.get(impl)


def compile_update(opt):
    """The optimizer's step under torch.compile (default mode), as every compiled implementation runs it."""
    @torch.compile(fullgraph=False)
    def opt_step():
        opt.step()
    return opt_step


def run_lists(args, device, script):
    """The phases, modes and impls of the flags: strict only on the CPU, no CUDA-graph variant without CUDA,
    no compiled one without torch.compile (each one left out is said on stderr)."""
    phases = [p for p in args.phases.split(",") if p]
    modes = cpu_modes([m for m in args.modes.split(",") if m], device, script)
    impls = [i for i in args.impls.split(",") if i]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise SystemExit(f"{script}: unknown --impls {','.join(unknown)} (known: {','.join(IMPLS)})")
    for impl in list(impls):
        if impl in CUDA_ONLY and device.type != "cuda":
            impls.remove(impl)
            print(f"{script}: {impl} needs CUDA, left out on {device.type}", file=sys.stderr)
        elif impl in COMPILE_MODES and not hasattr(torch, "compile"):
            impls.remove(impl)
            print(f"{script}: torch {torch.__version__} has no torch.compile, {impl} left out", file=sys.stderr)
    return phases, modes, impls


def configurations(modes, impls):
    """(mode, impl, compiled) of every configuration, the precision mode set; every compiled configuration
    compiles from scratch (dynamo's caches reset)."""
    for mode in modes:
        for impl in impls:
            set_mode(mode)
            compiled = impl in COMPILE_MODES
            if compiled:
                importlib.import_module("torch._dynamo").reset()
            yield mode, impl, compiled


def time_phases(run, common, phases, names, warmup, samples, device, emit, compiled, value,
                compile_names=("inference", "flb", "step"), prepare=None):
    """The timed loop of one configuration. Compiled: the first call of each phase of compile_names (which
    traces, compiles and runs it once) is timed, their sum emitted as the compile line (parts_ms per phase).
    Then each phase of names that was asked for: prepare(name) (False: not timed), the warm-up and samples with
    CUDA's peak memory, value(name) must be finite, one JSON line."""
    if compiled:
        parts = {}
        for name in compile_names:
            if name not in phases and "compile" not in phases:
                continue
            t0 = time.perf_counter()
            getattr(run, name)()
            sync(device)
            parts[name] = (time.perf_counter() - t0) * 1e3
        if "compile" in phases:
            emit(dict(common, phase="compile", **summary([sum(parts.values())], 0), parts_ms=parts))
    for name in names:
        if name not in phases or (prepare is not None and prepare(name) is False):
            continue
        ms, peak = time_with_peak(getattr(run, name), warmup, samples, device)
        v = value(name)
        if not np.isfinite(v):
            raise RuntimeError(f"{common['impl']} {common['mode']} {name}: non-finite result {v}")
        emit(dict(common, phase=name, **summary(ms, warmup), **({} if peak is None else {"peak_mem_bytes": peak})))


def cuda_graph(fn, warmup=3):
    """fn captured once in a CUDA graph (after `warmup` calls on a side stream, as PyTorch's whole-network
    capture recipe does); returns the replay. What fn allocates during capture lives in the graph's pool and
    is rewritten by each replay, so tensors fn leaves behind (outputs, .grad) hold the latest replay's values."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


class Phases:
    """The three timed functions (inference, flb, step) of one configuration of a model whose loss is
    loss_fn(output): impl "eager", "compiled" / "compiled-graph" (the model under torch.compile in that impl's
    mode, the AdamW update compiled, compile_update) or "cudagraph" (each phase captured whole on its first call,
    cuda_graph, with a capturable AdamW, then replayed)."""

    def __init__(self, model, lr, x, impl, loss_fn):
        self.model, self.x, self.loss_fn = model, x, loss_fn
        graphed = impl == "cudagraph"
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=lr, capturable=graphed, **ADAMW)
        mode = compile_mode(impl)
        self.fwd = torch.compile(model, mode=mode) if mode else model
        self.opt_step = compile_update(self.opt) if mode else self.opt.step
        self.graphs = {} if graphed else None
        self.loss = self.out = None

    def _inference(self):
        with torch.no_grad():
            self.out = self.fwd(self.x)

    def _flb(self):
        self.opt.zero_grad(set_to_none=True)
        self.loss = self.loss_fn(self.fwd(self.x))
        self.loss.backward()

    def _step(self):
        self._flb()
        self.opt_step()

    def _run(self, name):
        fn = getattr(self, "_" + name)
        if self.graphs is None:
            return fn()
        if name not in self.graphs:
            self.graphs[name] = cuda_graph(fn)
        self.graphs[name]()

    def inference(self):
        self._run("inference")

    def flb(self):
        self._run("flb")

    def step(self):
        self._run("step")

    def value(self, phase):
        """A scalar of the phase's last result (checked finite after the samples)."""
        return self.out.flatten()[0].item() if phase == "inference" else self.loss.item()
