"""The gate tensors of the model scripts (`--outputs`, docs/benchmarks.md "Correctness gates") and their two
optional references, shared by every model script:

- the strict gate tensors: the model in float32, PyTorch strict (TF32 off), eager;
- `--f64-reference`: the same code, weights and inputs in float64 ("f64.<name>"), the exact result against
  which compare.py measures both sides' rounding error;
- `--accelerated-reference`: the same float32 code once more in PyTorch's accelerated mode (timing.set_mode:
  TF32 for matmul and cuDNN) ("acc.<name>"), whose error against f64 is the allowance of our accelerated gate
  (issue 33). TF32 exists on CUDA only: on another device no acc.* tensor is written and the file's metadata
  says why (acc_reference).

A script supplies compute(device, dtype) -> {name: numpy array} (logits, loss, grad.*, step.*); write() runs
it once per setting and writes one file.
"""
import sys
import time

import torch

import safetensors_lite
import timing


def add_args(ap):
    ap.add_argument("--f64-reference", action="store_true",
                    help="with --outputs: also the gate tensors in float64 (f64.*), the exact reference")
    ap.add_argument("--accelerated-reference", action="store_true",
                    help="with --outputs: also the gate tensors in PyTorch's accelerated mode (TF32; acc.*, CUDA "
                         "only), the allowance of compare.py's accelerated gate")


def check_args(ap, args):
    for flag in ("f64_reference", "accelerated_reference"):
        if getattr(args, flag) and not args.outputs:
            ap.error(f"--{flag.replace('_', '-')} needs --outputs")


def array(t):
    """A tensor as numpy in its own dtype (float64 stays float64; a loss is a 0-d array)."""
    return t.detach().cpu().numpy()


def model_tensors(make, minimal=False):
    """The gate tensors of one setting. make() -> (phases, params, state): a fresh model's phases object
    (inference, [minimal,] flb, step; attributes out, [out_min,] loss: timing.Phases or alike), params(phases)
    -> (our name, parameter) pairs whose gradients are gated (a parameter without a gradient is left out),
    state(phases) -> (our name, tensor) pairs recorded after one AdamW step (None: params)."""
    out = {}
    ph, params, state = make()
    ph.inference()
    out["logits"] = array(ph.out)
    if minimal:
        ph.minimal()
        out["minimal.logits"] = array(ph.out_min)
    ph.flb()
    out["loss"] = array(ph.loss)
    for name, p in params(ph):
        if p.grad is not None:
            out["grad." + name] = array(p.grad)
    del ph
    ph, params, state = make()
    ph.step()
    out["step.loss"] = array(ph.loss)
    for name, t in (state or params)(ph):
        out["step." + name] = array(t)
    return out


def _prefixed(prefix, tensors):
    return {prefix + k: v for k, v in tensors.items()}


def _release(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write(path, inputs, compute, device, args, meta, script):
    """Writes path: the inputs, the strict float32 gate tensors and, as args asks, the f64.* and acc.* ones.
    compute(device, dtype) is called with the precision mode already set (strict, or accelerated for acc.*)."""
    out = dict(inputs)
    meta = dict(meta)
    timing.set_mode("strict")
    out.update(compute(device, torch.float32))
    _release(device)
    if args.f64_reference:
        # float64 where the device has it (CUDA, the CPU), else the CPU.
        dev64 = device if device.type in ("cuda", "cpu") else torch.device("cpu")
        t0 = time.perf_counter()
        out.update(_prefixed("f64.", compute(dev64, torch.float64)))
        _release(dev64)
        meta["f64_device"] = dev64.type
        print(f"{script}: float64 reference on {dev64.type} in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    if args.accelerated_reference:
        if device.type == "cuda":
            t0 = time.perf_counter()
            timing.set_mode("accelerated")
            try:
                out.update(_prefixed("acc.", compute(device, torch.float32)))
            finally:
                timing.set_mode("strict")
            _release(device)
            meta["acc_reference"] = "tf32"
            meta["acc_device"] = timing.device_name(device)
            print(f"{script}: accelerated (TF32) reference in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        else:
            meta["acc_reference"] = f"none: {device.type} device (TF32 has no meaning there)"
            print(f"{script}: {device.type}: no accelerated (TF32) reference, TF32 has no meaning there",
                  file=sys.stderr)
    safetensors_lite.write(path, out, meta)
