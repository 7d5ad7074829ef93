"""Helpers for PyTorch reference scripts run by the C++ tests (tests/support/test_util.h: run_torch):
read the C++ side's safetensors inputs, write results back. Uses only torch + numpy + json."""
import json
import struct
import sys

import numpy as np
import torch

_NP = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_,
       "F16": np.float16}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype=_NP[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        arr = np.array(t.detach().cpu().numpy(), order="C", copy=True)
        if arr.dtype == np.float32:
            tag = "F32"
        elif arr.dtype == np.float64:
            tag = "F64"
        elif arr.dtype in (np.int32, np.int64):
            arr, tag = arr.astype(np.int32), "I32"
        else:
            raise ValueError(f"{name}: unsupported dtype {arr.dtype}")
        raw = arr.tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


def main(fn):
    """fn(inputs: dict[str, Tensor]) -> dict[str, Tensor]; argv: in.safetensors out.safetensors."""
    torch.set_num_threads(1)
    write(sys.argv[2], fn(read(sys.argv[1])))
