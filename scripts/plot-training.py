#!/usr/bin/env python3
"""Draws the metrics a training command wrote (JSON Lines: `mgn train-fashion-mnist --metrics FILE`, default
the checkpoint's name with .metrics.jsonl; `mgn finetune`, DIR/metrics.jsonl) as a PNG: the loss per step
(and its moving average), the batch accuracy per step and the test accuracy per epoch when the file has them.

    scripts/plot-training.py fashion_mnist_cnn.metrics.jsonl [-o curve.png] [--title TEXT]

Needs python3-matplotlib (scripts/setup-debian.sh installs it). Several files draw on the same axes.
"""
import argparse
import json
import os
import sys


def read_jsonl(path):
    runs, steps, epochs = [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            kind = rec.get("kind")
            if kind == "run":
                runs.append(rec)
            elif kind == "step":
                steps.append(rec)
            elif kind == "epoch":
                epochs.append(rec)
    if not steps:
        sys.exit(f"{path}: no step records")
    return (runs[0] if runs else {}), steps, epochs


def moving_average(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="metrics .jsonl files")
    ap.add_argument("-o", "--out", help="PNG to write (default: the first file's name with .png)")
    ap.add_argument("--title", help="figure title (default: from the run record)")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [(p,) + read_jsonl(p) for p in args.files]
    has_acc = any("accuracy" in s for _, _, steps, _ in data for s in steps) or \
        any(e.get("test_accuracy", -1) >= 0 for _, _, _, epochs in data for e in epochs)
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(12 if has_acc else 7, 4.5), squeeze=False)
    ax_loss = axes[0][0]
    for path, run, steps, epochs in data:
        label = os.path.basename(path)
        x = [s["step"] for s in steps]
        loss = [s["loss"] for s in steps]
        window = max(1, len(loss) // 50)
        (line,) = ax_loss.plot(x, moving_average(loss, window), label=f"{label} (mean of {window})")
        if window > 1:
            ax_loss.plot(x, loss, alpha=0.25, linewidth=0.8, color=line.get_color())
        if has_acc:
            ax = axes[0][1]
            acc = [(s["step"], s["accuracy"]) for s in steps if "accuracy" in s]
            if acc:
                ax.plot([a for a, _ in acc], moving_average([100 * b for _, b in acc], window),
                        label=f"{label}: training batches (mean of {window})")
            ev = [(e["step"], e["test_accuracy"]) for e in epochs if e.get("test_accuracy", -1) >= 0]
            if ev:
                ax.plot([a for a, _ in ev], [100 * b for _, b in ev], "o-", label=f"{label}: test set, per epoch")
                for a, b in ev:
                    ax.annotate(f"{100 * b:.1f}%", (a, 100 * b), textcoords="offset points", xytext=(-10, 6))
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    if has_acc:
        ax = axes[0][1]
        ax.set_xlabel("step")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    run = data[0][1]
    title = args.title or " ".join(str(run[k]) for k in ("command", "model", "backend") if k in run)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = args.out or os.path.splitext(args.files[0])[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
