"""`mgn bench` with the profile on (MGN_PROFILE=1, CompileOptions::profile): every timed phase's JSON line carries
`kernel_profile`, one row per dispatch (a node's lowering or a fusion), heaviest first, and without the profile the
field is absent. The work estimates are checked against closed forms: the Fashion-MNIST MLP at batch B (784 -> 256 ->
10) has two matmuls in inference, 2*B*256*784 and 2*B*10*256 FLOPs; in F+L+B the backward adds the weight gradients
(the same two counts) and the input gradient of the second layer (2*B*256*10); every row's bytes are at least those
of its largest bound tensor and GB/s and TFLOP/s are bytes and FLOPs over its time. No timing is asserted.

usage: bench_profile_check.py MGN WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

B = 8


def bench(mgn, out, profile):
    env = {k: v for k, v in os.environ.items() if k != "MGN_PROFILE"}
    if profile:
        env["MGN_PROFILE"] = "1"
    r = subprocess.run([mgn, "bench", "fashion-mlp", "--backend", "vulkan", "--batch", str(B), "--phases",
                        "inference,flb", "--warmup", "1", "--warmup-ms", "0", "--samples", "2", "--json", out],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return {d["phase"]: d for d in (json.loads(x) for x in open(out)) if d.get("phase") in ("inference", "flb")}


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    plain = bench(mgn, os.path.join(work, "plain.jsonl"), False)
    assert all("kernel_profile" not in d for d in plain.values()), "a profile without MGN_PROFILE"
    lines = bench(mgn, os.path.join(work, "profile.jsonl"), True)
    assert set(lines) == {"inference", "flb"}, sorted(lines)
    want = {"inference": sorted([2 * B * 256 * 784, 2 * B * 10 * 256]),
            "flb": sorted([2 * B * 256 * 784, 2 * B * 10 * 256, 2 * B * 256 * 784, 2 * B * 10 * 256,
                           2 * B * 256 * 10])}
    for phase, d in lines.items():
        rows = d["kernel_profile"]
        assert rows, phase
        ms = [r["ms"] for r in rows]
        assert ms == sorted(ms, reverse=True) and min(ms) >= 0, (phase, ms)
        assert sum(r["count"] for r in rows) <= d["dispatches"], (phase, d["dispatches"])
        nodes = [r["nodes"] for r in rows]
        assert len(nodes) == len(set(nodes)) and all(n.startswith("%") for n in nodes), nodes
        flops = sorted(r["flops"] for r in rows if "matmul" in r["ops"].split())
        assert flops == want[phase], (phase, flops, want[phase])
        assert all(r["flops"] == 0 for r in rows if "matmul" not in r["ops"].split()), phase
        for r in rows:
            assert r["bytes"] > 0 and r["count"] >= 1, r
            if r["ms"] > 0:
                assert abs(r["gbps"] - r["bytes"] / (r["ms"] * 1e6)) <= 1e-9 * max(1.0, r["gbps"]), r
                assert abs(r["tflops"] - r["flops"] / (r["ms"] * 1e9)) <= 1e-9 * max(1.0, r["tflops"]), r
        # The first layer's product reads its 784x256 weight: at least that many bytes.
        first = [r for r in rows if r["flops"] == 2 * B * 256 * 784 and "matmul" in r["ops"].split()]
        assert first and all(r["bytes"] >= 784 * 256 * 4 for r in first), first
        print(f"{phase}: {len(rows)} dispatches profiled, matmul FLOPs {flops}")
    print("ok")


if __name__ == "__main__":
    main()
