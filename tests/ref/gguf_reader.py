"""A small GGUF (version 3) reader written from the published format (ggml's docs/gguf.md, gguf.h's layout
comment), stdlib + NumPy only, sharing nothing with src/io/gguf: the independent side of tests/ref/gguf_check.py.

    f = read("model.gguf")
    f.version, f.alignment, f.data_start, f.metadata["general.architecture"]
    f.tensors["token_embd.weight"]  -> Tensor(name, dims (ggml order, innermost first), type, offset, array)

Arrays come back as NumPy arrays shaped outermost first (dims reversed); F32 (type 0) and F16 (type 1)
tensors are read. Every structural rule is checked: magic, version 3, the value types, tensor offsets
aligned and inside the file, no two tensors overlapping, the data section starting at the aligned end of the
tensor infos, and nothing after the last tensor but its alignment padding.
"""
import struct
from collections import namedtuple

import numpy as np

# gguf_type
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
           I64: "<q", F64: "<d"}
TYPE_NAMES = {U8: "u8", I8: "i8", U16: "u16", I16: "i16", U32: "u32", I32: "i32", F32: "f32", BOOL: "bool",
              STRING: "string", ARRAY: "array", U64: "u64", I64: "i64", F64: "f64"}
# ggml_type: element size in bytes and NumPy dtype of the two types read here.
GGML = {0: (4, np.float32), 1: (2, np.float16)}

Tensor = namedtuple("Tensor", "name dims type offset array")


class GGUFError(Exception):
    pass


class GGUF:
    def __init__(self):
        self.version = 0
        self.metadata = {}  # key -> Python value (list for arrays)
        self.types = {}  # key -> (type, element type or None)
        self.tensors = {}  # name -> Tensor, in file order
        self.alignment = 32
        self.data_start = 0


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError(f"truncated at byte {self.pos} (wanted {n} more)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8")

    def value(self, t):
        if t == STRING:
            return self.string()
        if t in _SCALAR:
            return self.unpack(_SCALAR[t])
        raise GGUFError(f"value type {t} at byte {self.pos}")


def read(path):
    with open(path, "rb") as fh:
        buf = fh.read()
    c = _Cursor(buf)
    if c.take(4) != b"GGUF":
        raise GGUFError(f"{path}: bad magic")
    g = GGUF()
    g.version = c.unpack("<I")
    if g.version != 3:
        raise GGUFError(f"{path}: version {g.version}")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    for _ in range(n_kv):
        key = c.string()
        if key in g.metadata:
            raise GGUFError(f"{path}: key {key} twice")
        t = c.unpack("<I")
        if t == ARRAY:
            et, n = c.unpack("<I"), c.unpack("<Q")
            if et == ARRAY:
                raise GGUFError(f"{path}: {key}: nested array")
            g.metadata[key] = [c.value(et) for _ in range(n)]
            g.types[key] = (ARRAY, et)
        else:
            g.metadata[key] = c.value(t)
            g.types[key] = (t, None)
    if "general.alignment" in g.metadata:
        if g.types["general.alignment"][0] != U32:
            raise GGUFError(f"{path}: general.alignment is not u32")
        g.alignment = g.metadata["general.alignment"]
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.unpack("<I")
        if not 1 <= nd <= 4:
            raise GGUFError(f"{path}: {name}: {nd} dims")
        dims = [c.unpack("<Q") for _ in range(nd)]
        ty, off = c.unpack("<I"), c.unpack("<Q")
        if ty not in GGML:
            raise GGUFError(f"{path}: {name}: ggml type {ty} not read here")
        if name in [i[0] for i in infos]:
            raise GGUFError(f"{path}: tensor {name} twice")
        infos.append((name, dims, ty, off))
    a = g.alignment
    g.data_start = (c.pos + a - 1) // a * a
    if any(b != 0 for b in buf[c.pos:g.data_start]):
        raise GGUFError(f"{path}: non-zero padding before the data")
    spans = []
    for name, dims, ty, off in infos:
        if off % a:
            raise GGUFError(f"{path}: {name}: offset {off} not a multiple of {a}")
        size, dt = GGML[ty]
        n = int(np.prod(dims))
        start = g.data_start + off
        if start + n * size > len(buf):
            raise GGUFError(f"{path}: {name}: data past the end of the file")
        arr = np.frombuffer(buf, dtype=np.dtype(dt).newbyteorder("<"), count=n, offset=start)
        g.tensors[name] = Tensor(name, dims, ty, off, arr.reshape(list(reversed(dims))))
        spans.append((start, start + n * size, name))
    spans.sort()
    for (s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise GGUFError(f"{path}: tensors {n0} and {n1} overlap")
    end = spans[-1][1] if spans else g.data_start
    if len(buf) != (end + a - 1) // a * a:
        raise GGUFError(f"{path}: {len(buf)} bytes, the last tensor ends at {end} (alignment {a})")
    return g
