"""Oracle harness (Python side): cases run in PyTorch (float64 on float32-rounded inputs) and are written as
safetensors files that the C++ tests read: inputs in.<i>, output out, cotangent cot, gradients grad.<i> of
sum(out * cot). The op, its attributes and tolerances travel in __metadata__."""
import json
import struct

import numpy as np
import torch

_TAGS = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int32"): "I32",
         np.dtype("int64"): "I64", np.dtype("bool"): "BOOL", np.dtype("uint8"): "U8"}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, off = [], 0
    for name, arr in tensors.items():
        arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray would turn rank 0 into rank 1)
        raw = arr.tobytes()
        header[name] = {"dtype": _TAGS[arr.dtype], "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class In:
    """An input spec: dtype 'f32' | 'i32' | 'bool', shape, and how to draw values."""

    def __init__(self, shape, dtype="f32", kind="normal", lo=None, hi=None, grad=True, axis=None):
        self.shape, self.dtype, self.kind, self.lo, self.hi, self.grad = tuple(shape), dtype, kind, lo, hi, grad
        self.axis = axis

    def draw(self, rng):
        if self.dtype == "i32" and self.kind == "distinct":
            # Indices with no repeats along `axis` (each line a random choice from [lo, hi) without
            # replacement): scatters whose result does not depend on the order of duplicate writes.
            moved = np.moveaxis(np.empty(self.shape, dtype=np.int32), self.axis, -1)
            flat = moved.reshape(-1, moved.shape[-1])
            for row in flat:
                row[:] = rng.permutation(np.arange(self.lo, self.hi))[: len(row)]
            return np.ascontiguousarray(np.moveaxis(flat.reshape(moved.shape), -1, self.axis))
        if self.dtype == "i32":
            return rng.integers(self.lo, self.hi, size=self.shape, dtype=np.int64).astype(np.int32)
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.kind == "normal":
            v = rng.standard_normal(self.shape)
        elif self.kind == "uniform":
            v = rng.uniform(self.lo, self.hi, size=self.shape)
        elif self.kind == "positive":  # away from 0 for log/sqrt/div
            v = rng.uniform(0.5, 2.0, size=self.shape)
        elif self.kind == "nonzero":  # |v| >= 0.5 for division / kinks
            v = rng.uniform(0.5, 2.0, size=self.shape) * np.where(rng.random(self.shape) < 0.5, -1, 1)
        else:
            raise ValueError(self.kind)
        return np.asarray(v, dtype=np.float32)


class Case:
    def __init__(self, name, op, inputs, fn, attrs=None, tol=1e-5, grad=True, grad_tol=1e-4):
        self.name, self.op, self.inputs, self.fn = name, op, inputs, fn
        self.attrs, self.tol, self.grad, self.grad_tol = attrs or {}, tol, grad, grad_tol


def run_case(case, out_dir, seed):
    rng = np.random.default_rng(seed)
    arrays = [spec.draw(rng) for spec in case.inputs]
    tens = []
    for spec, a in zip(case.inputs, arrays):
        if spec.dtype == "f32":
            t = torch.tensor(a.astype(np.float64), dtype=torch.float64, requires_grad=case.grad and spec.grad)
        elif spec.dtype == "i32":
            t = torch.tensor(a.astype(np.int64))
        else:
            t = torch.tensor(a)
        tens.append(t)
    out = case.fn(*tens)
    tensors = {f"in.{i}": a for i, a in enumerate(arrays)}
    if out.dtype == torch.bool:
        tensors["out"] = out.detach().numpy().astype(np.uint8)
    elif out.dtype in (torch.int64, torch.int32):
        tensors["out"] = out.detach().numpy().astype(np.int32)
    else:
        tensors["out"] = out.detach().numpy().astype(np.float64)
    has_grad = case.grad and out.dtype == torch.float64 and any(t.requires_grad for t in tens)
    if has_grad:
        cot = np.asarray(rng.standard_normal(tuple(out.shape)), dtype=np.float32)
        tensors["cot"] = cot
        loss = (out * torch.tensor(cot.astype(np.float64))).sum()
        grads = torch.autograd.grad(loss, [t for t in tens if t.requires_grad], allow_unused=True)
        gi = iter(grads)
        for i, t in enumerate(tens):
            if t.requires_grad:
                g = next(gi)
                tensors[f"grad.{i}"] = (torch.zeros_like(t) if g is None else g).detach().numpy()
    meta = {"op": case.op, "attrs": json.dumps(case.attrs), "tol": case.tol, "grad_tol": case.grad_tol,
            "inputs": json.dumps([s.dtype for s in case.inputs]), "case": case.name}
    write_safetensors(f"{out_dir}/{case.name}.safetensors", tensors, meta)
