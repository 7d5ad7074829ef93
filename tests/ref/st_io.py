# Minimal safetensors reader/writer in plain Python (struct + json + numpy): the test oracle must not
# depend on the code under test, nor on the `safetensors` package (not installed here).
import json
import struct

import numpy as np

_DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64,
       "U8": np.uint8, "I8": np.int8, "I16": np.int16}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_DT[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write(path, tensors, metadata=None, dtypes=None):
    """tensors: name -> numpy array; dtypes: optional name -> tag ("F32", "F16", "BF16", "I32")."""
    dtypes = dtypes or {}
    header = {}
    chunks = []
    off = 0
    for name, arr in tensors.items():
        tag = dtypes.get(name, "F32" if arr.dtype.kind == "f" else "I32")
        if tag == "BF16":
            u = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
            # round to nearest even, as torch does
            raw = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)).tobytes()
        else:
            np_t = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "F64": np.float64}[tag]
            raw = np.ascontiguousarray(arr, dtype=np_t).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
