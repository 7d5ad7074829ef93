"""`mgn train-fashion-mnist --metrics FILE` on a short CPU run: the JSON Lines file has a run record, one step
record per optimizer step (step numbers 1..N in order, a finite loss that starts near ln 10 — the closed form
for near-uniform logits at PyTorch's default init — and falls, a batch accuracy in [0, 1], the lr given, a
positive throughput), one epoch record per epoch whose mean loss is the mean of its steps' losses and whose
test accuracy is the one printed, and an end record. stderr, not a terminal here, has plain progress lines
(no carriage returns) with a rate and an ETA; under a pseudo-terminal (util-linux `script`) the line is
redrawn with carriage returns instead. scripts/plot-training.py then draws the file to a PNG.

usage: metrics_check.py MGN SOURCE_DIR WORKDIR
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys


def main():
    mgn, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.environ.get("MGN_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
        print("no Fashion-MNIST: skipped")
        return
    metrics = os.path.join(work, "m.jsonl")
    r = subprocess.run([mgn, "train-fashion-mnist", "--model", "mlp", "--backend", "cpu", "--epochs", "2",
                        "--limit-train", "1280", "--limit-test", "300", "--lr", "2e-3", "--out",
                        os.path.join(work, "mlp.safetensors"), "--metrics", metrics],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\r" not in r.stderr, "progress lines must be plain when stderr is not a terminal"
    assert re.search(r"epoch 1/2 \[=+\s*\] \d+/20 .* steps/s  ETA", r.stderr), r.stderr
    assert re.search(r"epoch 2/2 \[=+\] 20/20 .* in \d+s", r.stderr), r.stderr
    assert f"metrics: {metrics}" in r.stdout, r.stdout

    if shutil.which("script"):
        cmd = " ".join([mgn, "train-fashion-mnist", "--model", "mlp", "--backend", "cpu", "--epochs", "1",
                        "--limit-train", "640", "--limit-test", "100", "--metrics", "none", "--out",
                        os.path.join(work, "tty.safetensors")])
        # Bytes: text mode would turn the carriage returns into newlines.
        t = subprocess.run(["script", "-qfec", cmd, "/dev/null"], capture_output=True, timeout=120)
        assert t.returncode == 0, t.stdout + t.stderr
        assert re.search(rb"\repoch 1/1 \[=+\] 10/10 .* in \d+s", t.stdout), repr(t.stdout)
        assert not os.path.exists(os.path.join(work, "tty.metrics.jsonl")), "--metrics none writes nothing"

    recs = [json.loads(line) for line in open(metrics)]
    kinds = [x["kind"] for x in recs]
    assert kinds[0] == "run" and kinds[-1] == "end", kinds
    run = recs[0]
    assert run["command"] == "train-fashion-mnist" and run["model"] == "mlp" and run["backend"] == "cpu", run
    steps = [x for x in recs if x["kind"] == "step"]
    epochs = [x for x in recs if x["kind"] == "epoch"]
    assert [s["step"] for s in steps] == list(range(1, 41)), [s["step"] for s in steps]
    assert [s["epoch"] for s in steps] == [1] * 20 + [2] * 20
    for s in steps:
        assert math.isfinite(s["loss"]) and s["loss"] > 0, s
        assert 0 <= s["accuracy"] <= 1, s
        assert s["lr"] == 2e-3, s
        assert s["samples_per_s"] > 0 and s["time_s"] > 0, s
    assert abs(steps[0]["loss"] - math.log(10)) < 0.3, steps[0]
    first = sum(s["loss"] for s in steps[:5]) / 5
    last = sum(s["loss"] for s in steps[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert sum(s["accuracy"] for s in steps[-5:]) / 5 > 0.5, steps[-5:]
    assert [e["epoch"] for e in epochs] == [1, 2] and [e["step"] for e in epochs] == [20, 40], epochs
    for e, chunk in zip(epochs, (steps[:20], steps[20:])):
        assert abs(e["mean_loss"] - sum(s["loss"] for s in chunk) / 20) < 1e-6, e
    m = re.search(r"test accuracy: ([0-9.]+)%", r.stdout)
    assert m and abs(100 * epochs[-1]["test_accuracy"] - float(m.group(1))) < 0.006, (epochs[-1], r.stdout)
    assert 0.5 < epochs[-1]["test_accuracy"] <= 1, epochs[-1]
    assert recs[-1]["test_accuracy"] == epochs[-1]["test_accuracy"]

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("MGN_REQUIRE_REFERENCES"):
            raise
        print("no matplotlib: plot-training.py not run")
        return
    png = os.path.join(work, "curve.png")
    p = subprocess.run([sys.executable, os.path.join(src, "scripts", "plot-training.py"), metrics, "-o", png],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    print(f"metrics: {len(steps)} steps, loss {first:.3f} -> {last:.3f}, "
          f"test accuracy {100 * epochs[-1]['test_accuracy']:.2f}%; plot {png}")


if __name__ == "__main__":
    main()
