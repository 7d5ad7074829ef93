# Hand-built safetensors files for tests/checkpoint_test.cpp, written without the code under test:
#   checkpoint_files.py OUT_DIR
# mixed.safetensors  F32 / F16 / BF16 / I32 tensors;  ref.safetensors  their decoded values as F64
# model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json  a sharded linear layer fc
#   (ref.safetensors also holds an input "x" and numpy's fc(x) as "y")
# bad_index.json  lists a tensor its shard does not hold
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def bf16_round(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def main():
    out = sys.argv[1]
    a = (np.arange(6, dtype=np.float64) * 0.37 - 1.0).reshape(2, 3)
    h = np.array([0.1, -2.5, 65504.0, 1e-5, 3.0e-8])
    b = np.array([3.14159, -0.001, 1.0e10])
    i = np.array([-7, 0, 123456], dtype=np.int32)
    st_io.write(os.path.join(out, "mixed.safetensors"), {"a": a, "h": h, "b": b, "i": i},
                metadata={"written_by": "python"}, dtypes={"a": "F32", "h": "F16", "b": "BF16", "i": "I32"})
    ref = {
        "a": a.astype(np.float32).astype(np.float64),
        "h": h.astype(np.float16).astype(np.float64),
        "b": bf16_round(b),
        "i": i.astype(np.float64),
    }
    rng = np.random.default_rng(7)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    bias = rng.standard_normal(2).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    ref["x"], ref["y"] = x.astype(np.float64), y
    st_io.write(os.path.join(out, "ref.safetensors"), ref, dtypes={k: "F64" for k in ref})

    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    st_io.write(os.path.join(out, s1), {"fc.weight": w})
    st_io.write(os.path.join(out, s2), {"fc.bias": bias})
    index = {"metadata": {"total_size": int(w.nbytes + bias.nbytes)},
             "weight_map": {"fc.weight": s1, "fc.bias": s2}}
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
    bad = {"metadata": {}, "weight_map": {"fc.weight": s1, "fc.bias": s2, "fc.extra": s1}}
    json.dump(bad, open(os.path.join(out, "bad_index.json"), "w"))


if __name__ == "__main__":
    main()
