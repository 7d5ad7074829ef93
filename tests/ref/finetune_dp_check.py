"""Data-parallel `mgn finetune` on a tiny Llama folder (the one FinetuneThenGenerate builds), against the
single-device run, which is the independent reference:

  (a) `--replicas 2 --devices 0,0` (two logical devices on the one lavapipe device) at global batch B against
      the single-device run at batch B (and both against PyTorch, below), from the same weights file and the same text windows. Each replica's
      loss is the mean cross-entropy over its B/2 windows of S - 1 labelled tokens each (the last position is
      -100), so the mean of the two shard means is the full-batch mean: the losses differ by f32 summation order
      only at the first step (same weights), and afterwards by the weights' drift. The final weights agree within
      a tolerance: AdamW moves a weight by about lr per step whatever the gradient's size, so the two runs' f32
      rounding differences stay a small fraction of lr; the bounds below are about 10x the values measured on
      lavapipe (printed by this script). The output folder has the same files, the metrics the same records
      (plus "replicas" in the run record), and the log one line per step.
      Both runs are also checked against a float64 PyTorch run of the same steps (tests/ref/llama_ref.py's plain
      Llama, HF's loss, torch.optim.AdamW with mgn's defaults; the token ids from bpe_reference.py's own
      encoder): every step's loss and the final weights within f32 tolerances.
  (b) `mpirun -np 2 mgn finetune --data-parallel mpi` (one replica per rank): the loss log and the weights
      bitwise equal to (a) (the same shards meet the same ordered sum: rank order = replica order); rank 0 alone
      prints and writes. A batch two ranks cannot split and ranks given different --seed are clear errors.
      Without MPI in the build (configured with -DMGN_MPI=OFF or no MPI found), `--data-parallel mpi` must say
      that the build has no MPI instead.
  (c) usage errors before anything is read or compiled: a batch the replicas cannot split, a --devices list of
      the wrong length.

usage: finetune_dp_check.py MGN MPIEXEC HAS_MPI WORKDIR   (MPIEXEC may be empty; HAS_MPI is 1 or 0)
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
import safetensors_lite  # noqa: E402
from finetune_check import tiny_model  # noqa: E402
import bpe_reference  # noqa: E402

STEPS, BATCH, SEQ, LR = 4, 4, 16, 1e-2
# Measured on lavapipe (printed below): losses 4.8e-7 apart at most (1 ulp at 6.5, the first step); weights 2.5e-7
# apart, except a few embedding elements up to 3e-6 since the weight gradients of the tied lm_head fold the batch
# into one product (each run sums its own number of rows: B*S against B/2*S; AdamW divides by the gradient's running
# RMS, so where a gradient is tiny its rounding moves the update by more, as against PyTorch below). The bounds are
# about 10x that: every weight within WEIGHT_TOLERANCE, at most WEIGHT_OUTLIERS beyond WEIGHT_BULK.
LOSS_TOLERANCE = 5e-6       # absolute, on losses of 5 to 6.5 (ulp 4.8e-7)
WEIGHT_TOLERANCE = 3e-5     # absolute, on weights of size ~0.1 that moved by up to 0.04 (4 steps of lr 1e-2)
WEIGHT_BULK = 2.5e-6
WEIGHT_OUTLIERS = 5
# Against the float64 PyTorch run (f32 against f64), measured on lavapipe and printed below: losses 4.7e-7 apart;
# weights: one embedding element of the 27k 1.9e-5 apart (AdamW divides by the gradient's running RMS, so where a
# gradient is tiny its f32 rounding moves the update by more), every other 6.3e-7 at most. Bounds about 10x that:
# all weights within TORCH_WEIGHT_TOLERANCE, and at most TORCH_WEIGHT_OUTLIERS of them beyond TORCH_WEIGHT_BULK.
TORCH_LOSS_TOLERANCE = 5e-6
TORCH_WEIGHT_TOLERANCE = 2e-4
TORCH_WEIGHT_BULK = 6e-6
TORCH_WEIGHT_OUTLIERS = 5


def run(cmd, env=None, expect_ok=True):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if expect_ok and r.returncode != 0:
        sys.exit(f"FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    print(f"  {time.monotonic() - t0:5.1f} s  {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}"
          [:160])
    return r


def read_log(path):
    rows = []
    for line in open(path):
        step, bits, _, _, _ = line.split()  # the loss's f32 bits (hex), then the loss printed to 6 decimals
        rows.append((int(step), int(bits, 16), struct.unpack("<f", struct.pack("<I", int(bits, 16)))[0]))
    return rows


def torch_reference(cfg, vocab, weights, text):
    """Every step's loss and the final weights of STEPS AdamW steps in float64 on the same windows as mgn
    finetune: the text's token ids in order, BATCH windows of SEQ tokens per step, wrapping around."""
    import importlib.util
    import torch
    # tests/ref/llama_ref.py (bench/pytorch has another module of that name, earlier on the path).
    spec = importlib.util.spec_from_file_location("llama_ref_test", os.path.join(HERE, "llama_ref.py"))
    llama_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llama_ref)
    merges = bpe_reference.train(bpe_reference.CORPUS, bpe_reference.NUM_MERGES)
    added = [dict(t, id=i) for i, t in enumerate(bpe_reference.ADDED)]
    bvocab = {t["content"]: t["id"] for t in added}
    for b in range(256):
        bvocab[bpe_reference.BYTE_TO_CHAR[b]] = len(bvocab)
    for a, b in merges:
        bvocab.setdefault(a + b, len(bvocab))
    ids = bpe_reference.Encoder(bvocab, merges, added, bpe_reference.CONFIGS["gpt2"]).encode(text)
    assert max(ids) < vocab, (max(ids), vocab)

    class C:
        pass
    c = C()
    c.vocab, c.hidden, c.layers = vocab, cfg["hidden_size"], cfg["num_hidden_layers"]
    c.heads, c.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    c.head_dim, c.ffn = c.hidden // c.heads, cfg["intermediate_size"]
    c.eps, c.theta, c.tied = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["tie_word_embeddings"]
    W = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in weights.items()}
    opt = torch.optim.AdamW(list(W.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    losses, cursor = [], 0
    for _ in range(STEPS):
        rows = []
        for _ in range(BATCH):
            if cursor + SEQ > len(ids):
                cursor = 0
            rows.append(ids[cursor:cursor + SEQ])
            cursor += SEQ
        batch = torch.tensor(rows, dtype=torch.int64)
        opt.zero_grad()
        loss = llama_ref.hf_loss(llama_ref.forward(c, W, batch), batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, {n: w.detach().numpy() for n, w in W.items()}


def main():
    mgn, mpiexec, has_mpi, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model, vocab, cfg = tiny_model(work)
    # Weights from a file (the path a user takes with a pretrained model), loaded into every replica.
    rng = np.random.default_rng(7)
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
              "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.post_attention_layernorm.weight": (h,),
              "model.layers.0.self_attn.q_proj.weight": (h, h), "model.layers.0.self_attn.k_proj.weight": (kv, h),
              "model.layers.0.self_attn.v_proj.weight": (kv, h), "model.layers.0.self_attn.o_proj.weight": (h, h),
              "model.layers.0.mlp.gate_proj.weight": (f, h), "model.layers.0.mlp.up_proj.weight": (f, h),
              "model.layers.0.mlp.down_proj.weight": (h, f)}
    weights = {n: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.1 * rng.standard_normal(s)).astype(np.float32)
               for n, s in shapes.items()}
    wfile = os.path.join(work, "start.safetensors")
    safetensors_lite.write(wfile, weights, {"format": "pt"})
    corpus = os.path.join(work, "text.txt")
    with open(corpus, "w", encoding="utf-8") as fh:
        fh.write("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                 "must be in want of a wife. " * 20)
    ref_losses, ref_weights = torch_reference(cfg, vocab, weights, open(corpus, encoding="utf-8").read())
    common = ["--text", corpus, "--steps", str(STEPS), "--batch", str(BATCH), "--seq", str(SEQ), "--lr", str(LR),
              "--weights", wfile]
    out = {k: os.path.join(work, k) for k in ("single", "dp", "mpi")}
    log = {k: os.path.join(work, k + ".log") for k in out}

    # ---- (a) two replicas on one device against one device with the whole batch
    run([mgn, "finetune", model, *common, "--out", out["single"], "--log", log["single"]])
    r = run([mgn, "finetune", model, *common, "--replicas", "2", "--devices", "0,0", "--out", out["dp"],
             "--log", log["dp"]])
    assert f"data-parallel: batch {BATCH} = 2 replicas x {BATCH // 2} (1 process(es) x 2)" in r.stderr, r.stderr
    assert "data-parallel steps (rank 0, 2 replicas)" in r.stdout, r.stdout
    single, dp = read_log(log["single"]), read_log(log["dp"])
    assert [s[0] for s in single] == [s[0] for s in dp] == list(range(STEPS)), (single, dp)
    assert abs(single[0][2] - math.log(vocab)) < 1.5, f"first loss {single[0][2]} vs ln(vocab) {math.log(vocab)}"
    assert single[-1][2] < single[0][2], f"the single-device loss did not fall: {single}"
    loss_diff = max(abs(a[2] - b[2]) for a, b in zip(single, dp))
    print(f"losses single: {[s[2] for s in single]}")
    print(f"losses 2 replicas: {[s[2] for s in dp]}; max |diff| {loss_diff:.3g}")
    assert loss_diff <= LOSS_TOLERANCE, f"loss curves differ by {loss_diff} > {LOSS_TOLERANCE}"

    ws, _ = safetensors_lite.read(os.path.join(out["single"], "model.safetensors"))
    wd, md = safetensors_lite.read(os.path.join(out["dp"], "model.safetensors"))
    assert set(ws) == set(wd) == set(shapes), (sorted(ws), sorted(wd))
    assert md.get("mgn.finetune_steps") == str(STEPS), md
    worst, worst_name, moved, beyond = 0.0, "", 0.0, 0
    for n in ws:
        assert ws[n].shape == wd[n].shape == shapes[n], (n, ws[n].shape, wd[n].shape)
        diff = np.abs(ws[n].astype(np.float64) - wd[n])
        d = float(diff.max())
        beyond += int((diff > WEIGHT_BULK).sum())
        moved = max(moved, float(np.abs(ws[n].astype(np.float64) - weights[n]).max()))
        if d > worst:
            worst, worst_name = d, n
    print(f"final weights: max |single - 2 replicas| {worst:.3g} ({worst_name}), {beyond} beyond {WEIGHT_BULK:g}; "
          f"largest move from the start {moved:.3g}")
    assert moved > 10 * WEIGHT_BULK, "the weights barely moved: the comparison would not tell anything"
    assert worst <= WEIGHT_TOLERANCE, f"{worst_name}: {worst} > {WEIGHT_TOLERANCE}"
    assert beyond <= WEIGHT_OUTLIERS, f"{beyond} weights beyond {WEIGHT_BULK}"
    # Both against the float64 PyTorch run.
    for label, log_rows, w in (("single", single, ws), ("2 replicas", dp, wd)):
        dl = max(abs(r[2] - t) for r, t in zip(log_rows, ref_losses))
        diffs = np.concatenate([np.abs(w[n].astype(np.float64) - ref_weights[n]).ravel() for n in w])
        dw, outliers = float(diffs.max()), int((diffs > TORCH_WEIGHT_BULK).sum())
        print(f"{label} against float64 PyTorch: losses {dl:.3g}, weights {dw:.3g} apart at most, "
              f"{outliers} of {diffs.size} beyond {TORCH_WEIGHT_BULK:g}")
        assert dl <= TORCH_LOSS_TOLERANCE, f"{label}: losses {dl} from PyTorch's {ref_losses}"
        assert dw <= TORCH_WEIGHT_TOLERANCE, f"{label}: weights {dw} from PyTorch's"
        assert outliers <= TORCH_WEIGHT_OUTLIERS, f"{label}: {outliers} weights beyond {TORCH_WEIGHT_BULK}"
    for fname in ("config.json", "tokenizer.json", "metrics.jsonl"):
        assert os.path.exists(os.path.join(out["dp"], fname)), fname
    recs = [json.loads(line) for line in open(os.path.join(out["dp"], "metrics.jsonl"))]
    assert recs[0]["kind"] == "run" and recs[0]["replicas"] == 2 and recs[0]["batch"] == BATCH, recs[0]
    steps = [x for x in recs if x["kind"] == "step"]
    assert [x["step"] for x in steps] == list(range(1, STEPS + 1)), steps
    assert all(abs(x["loss"] - d[2]) < 1e-5 and x["lr"] == LR for x, d in zip(steps, dp)), (steps, dp)
    assert recs[-1]["kind"] == "end", recs[-1]

    # ---- (b) the same over two MPI processes
    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    if has_mpi == "1" and mpiexec and shutil.which(mpiexec):
        mpirun = [mpiexec, "--oversubscribe", "-np", "2"]
        r = run(mpirun + [mgn, "finetune", model, *common, "--data-parallel", "mpi", "--out", out["mpi"],
                          "--log", log["mpi"]], env)
        assert f"batch {BATCH} = 2 replicas x {BATCH // 2} (2 process(es) x 1)" in r.stderr, r.stderr
        assert r.stdout.count("saved:") == 1, "only rank 0 writes and reports: " + r.stdout
        mp = read_log(log["mpi"])
        assert [(s[0], s[1]) for s in mp] == [(s[0], s[1]) for s in dp], f"loss bits differ: {mp} vs {dp}"
        wm, _ = safetensors_lite.read(os.path.join(out["mpi"], "model.safetensors"))
        for n in wd:
            assert wm[n].tobytes() == wd[n].tobytes(), \
                f"{n}: mpirun -np 2 differs from --replicas 2 by {np.abs(wm[n].astype(np.float64) - wd[n]).max()}"
        print("mpirun -np 2: loss bits and weights bitwise equal to --replicas 2")
        r = run(mpirun + [mgn, "finetune", model, *common[:4], "--batch", "3", "--seq", str(SEQ), "--data-parallel", "mpi",
                          "--out", os.path.join(work, "bad")], env, expect_ok=False)
        assert r.returncode != 0 and "--batch 3 does not split into 2 equal shards" in r.stderr, r.stderr
        rank_args = lambda seed: [mgn, "finetune", model, *common, "--seed", str(seed), "--data-parallel", "mpi",
                                  "--out", os.path.join(work, "bad")]
        r = run([mpiexec, "--oversubscribe", "-np", "1", *rank_args(1), ":", "-np", "1", *rank_args(2)], env,
                expect_ok=False)
        assert r.returncode != 0 and "the ranks disagree on --seed: rank 0 has 1, rank 1 has 2" in r.stderr, r.stderr
    elif has_mpi == "1":
        sys.exit("this mgn has MPI but mpirun was not found (" + repr(mpiexec) + "): install openmpi-bin")
    else:
        r = run([mgn, "finetune", model, *common, "--data-parallel", "mpi", "--out", out["mpi"]], env,
                expect_ok=False)
        assert r.returncode == 2 and "this mgn was built without MPI" in r.stderr, r.stderr
        print("SKIPPED (b): this build has no MPI; --data-parallel mpi says so")

    # ---- (c) usage errors, before anything is read or compiled (the kernel cache stays as it is)
    for args, want in [
        (["--replicas", "3"], f"--batch {BATCH} does not split into 3 equal shards"),
        (["--replicas", "2", "--devices", "0"], "--devices names 1 device(s) but --replicas is 2"),
        (["--devices", "0,0"], "--devices names 2 device(s) but --replicas is 1"),
        (["--replicas", "2", "--devices", "0,,"], "has an empty entry"),
    ]:
        t0 = time.monotonic()
        r = run([mgn, "finetune", model, *common, *args, "--out", os.path.join(work, "usage")],
                expect_ok=False)
        assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)
        assert time.monotonic() - t0 < 2.0, f"{args}: the error took {time.monotonic() - t0:.1f} s"
        assert not os.path.exists(os.path.join(work, "usage")), f"{args}: the output folder was created"
    print("ok")


if __name__ == "__main__":
    main()
