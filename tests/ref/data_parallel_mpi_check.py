"""`mpirun -np 2 mgn train-fashion-mnist --data-parallel mpi` on a tiny MLP run (a few steps), against one process:

  * `mgn train-fashion-mnist --replicas 2` (one process, two logical devices, the same batches split the same
    way): the checkpoint rank 0 wrote must hold bitwise the same tensors and step (the reduction order over
    replicas is the same: rank order = replica order);
  * `mpirun -np 2 ... --replicas 2` against `--replicas 4` in one process: the same file, byte for byte;
  * `mgn train-fashion-mnist` (one device, the whole batch in one graph): equal within a tolerance, since one
    matmul over the whole batch sums the per-sample products in another order. AdamW divides each gradient by its
    running RMS, so after a few steps a weight moves by a few lr at most; the bound below is measured (the
    largest difference is printed) with room left for another device.

Also: a batch the ranks cannot split is an error naming the batch and the replica count, a rank without a
device (--devices with one entry for two ranks on this host) is an error naming the rank, and ranks given
different seeds are an error naming both values.

usage: data_parallel_mpi_check.py MGN MPIEXEC WORKDIR   (MPIEXEC empty or not found: skipped, exit 77)
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

STEPS_ARGS = ["--model", "mlp", "--batch", "32", "--limit-train", "96", "--epochs", "1", "--limit-test", "100",
              "--eval-batch", "100", "--lr", "2e-3", "--seed", "5", "--metrics", "none", "--no-progress"]
# Measured on lavapipe (3 AdamW steps at lr 2e-3, printed by this script): 5.4e-7; the bound is about 10x that.
FULL_BATCH_TOLERANCE = 5e-6


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        dtype = {"F32": np.float32, "I32": np.int32, "I64": np.int64}[t["dtype"]]
        tensors[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(t["shape"])
    return meta, tensors


def run(cmd, env, expect_ok=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if expect_ok and r.returncode != 0:
        sys.exit(f"FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def main():
    mgn, mpiexec, work = sys.argv[1:4]
    if not mpiexec or not shutil.which(mpiexec):
        print("SKIPPED: mpirun not found (scripts/setup-debian.sh installs openmpi-bin and libopenmpi-dev), or the "
              "build was configured with -DMGN_MPI=OFF; the MPI data-parallel path was not tested")
        sys.exit(77)
    data = os.environ.get("MGN_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
        sys.exit("no Fashion-MNIST data in " + data + " (scripts/setup-debian.sh installs dataset-fashion-mnist)")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ)
    # CI runs as root: Open MPI refuses that unless told (here, in the test's environment only).
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # Containers often forbid the cross-process memory copy (process_vm_readv) Open MPI's shared-memory transport
    # uses for large messages by default; copying through shared memory works everywhere.
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    mpirun = [mpiexec, "--oversubscribe", "-np", "2"]

    ckpt = {k: os.path.join(work, k + ".safetensors") for k in ("mpi", "replicas", "single")}
    r = run(mpirun + [mgn, "train-fashion-mnist", *STEPS_ARGS, "--data-parallel", "mpi", "--out", ckpt["mpi"]], env)
    assert "batch 32 = 2 replicas x 16 (2 process(es) x 1)" in r.stderr, r.stderr
    assert r.stdout.count("checkpoint:") == 1, "only rank 0 reports: " + r.stdout
    run([mgn, "train-fashion-mnist", *STEPS_ARGS, "--replicas", "2", "--out", ckpt["replicas"]], env)
    run([mgn, "train-fashion-mnist", *STEPS_ARGS, "--out", ckpt["single"]], env)

    # Two ranks of two replicas each against four replicas in one process: the global replica order is rank by
    # rank, so the same shards meet the same sum.
    ckpt["mpi4"] = os.path.join(work, "mpi4.safetensors")
    ckpt["replicas4"] = os.path.join(work, "replicas4.safetensors")
    run(mpirun + [mgn, "train-fashion-mnist", *STEPS_ARGS, "--data-parallel", "mpi", "--replicas", "2",
                  "--out", ckpt["mpi4"]], env)
    run([mgn, "train-fashion-mnist", *STEPS_ARGS, "--replicas", "4", "--out", ckpt["replicas4"]], env)
    with open(ckpt["mpi4"], "rb") as a, open(ckpt["replicas4"], "rb") as b:
        assert a.read() == b.read(), "mpirun -np 2 --replicas 2 differs from --replicas 4"

    m_meta, mpi = read_safetensors(ckpt["mpi"])
    r_meta, rep = read_safetensors(ckpt["replicas"])
    s_meta, single = read_safetensors(ckpt["single"])
    assert m_meta.get("mgn.step") == "3", m_meta  # 96 images in batches of 32
    assert m_meta == r_meta, (m_meta, r_meta)
    assert set(mpi) == set(rep) == set(single), (sorted(mpi), sorted(single))
    for name in mpi:
        assert mpi[name].shape == rep[name].shape and mpi[name].tobytes() == rep[name].tobytes(), \
            f"{name}: mpirun -np 2 differs from --replicas 2 (max |diff| " \
            f"{np.abs(mpi[name].astype(np.float64) - rep[name]).max()})"
    worst, name_worst = 0.0, ""
    for name in mpi:
        if not name.startswith("fc"):
            continue  # the optimizer's moments: the weights are the contract
        d = float(np.abs(mpi[name].astype(np.float64) - single[name]).max())
        if d > worst:
            worst, name_worst = d, name
    print(f"max |mpirun -np 2 - single device full batch| over the weights: {worst:.3g} ({name_worst})")
    assert worst <= FULL_BATCH_TOLERANCE, f"{name_worst}: {worst} > {FULL_BATCH_TOLERANCE}"
    assert any(n.startswith("optim.") and n != "optim.step" and np.abs(mpi[n]).max() > 0 for n in mpi), \
        "the optimizer's moments are all zero: no step was trained"

    # Bad input: a batch two ranks cannot split evenly; a rank without a device.
    r = run(mpirun + [mgn, "train-fashion-mnist", *STEPS_ARGS[:2], "--batch", "31", "--limit-train", "62",
                      "--data-parallel", "mpi", "--out", os.path.join(work, "bad.safetensors")], env, expect_ok=False)
    assert r.returncode != 0 and "--batch 31 does not split into 2 equal shards" in r.stderr, r.stderr
    r = run(mpirun + [mgn, "train-fashion-mnist", *STEPS_ARGS, "--data-parallel", "mpi", "--devices", "0",
                      "--out", os.path.join(work, "bad.safetensors")], env, expect_ok=False)
    assert r.returncode != 0 and "rank 1 (local rank 1" in r.stderr and "has no device" in r.stderr, r.stderr
    # Ranks given different arguments (MPMD: one rank with --seed 1, the other with --seed 2) would draw different
    # batches: refused before the first step.
    bad = os.path.join(work, "bad.safetensors")
    i = STEPS_ARGS.index("--seed")
    no_seed = STEPS_ARGS[:i] + STEPS_ARGS[i + 2:]
    rank_args = lambda seed: [mgn, "train-fashion-mnist", *no_seed, "--seed", str(seed), "--data-parallel", "mpi",
                              "--out", bad]
    r = run([mpiexec, "--oversubscribe", "-np", "1", *rank_args(1), ":", "-np", "1", *rank_args(2)], env,
            expect_ok=False)
    assert r.returncode != 0 and "the ranks disagree on --seed: rank 0 has 1, rank 1 has 2" in r.stderr, r.stderr
    print("mpirun -np 2: bitwise equal to --replicas 2, within tolerance of one device; bad input rejected")


if __name__ == "__main__":
    main()
