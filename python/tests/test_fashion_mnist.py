"""Notebook-style: load Fashion-MNIST (Debian's dataset-fashion-mnist), build the MLP, train it with a plain
Python loop over NumPy batches, save a checkpoint, load it into an inference graph and measure accuracy.
Short (2,560 images, one epoch) so it runs on lavapipe; the accuracy is checked against chance (10%) and
against NumPy's own evaluation of the same trained weights."""
import math
import os

import numpy as np
import pytest

import meganeura as mg

DATA = mg.fashion_mnist_dir()


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                    reason="no Fashion-MNIST (apt install dataset-fashion-mnist)")
def test_fashion_mnist_train_and_evaluate(opts, workdir):
    images, labels = mg.load_fashion_mnist(split="train", limit=2560)
    test_x, test_y = mg.load_fashion_mnist(split="test", limit=500)
    assert images.shape == (2560, 1, 28, 28) and images.dtype == np.float32 and labels.dtype == np.int32
    assert 0 <= images.min() and images.max() <= 1 and set(np.unique(labels)) == set(range(10))

    g = mg.models.fashion_mnist("mlp", batch=64, mode="train", hidden=64)
    train = mg.compile(g, mode="train", optimizer=mg.AdamW(lr=2e-3), **opts)
    losses = []
    for xb, yb in mg.batches(images, labels, 64, seed=1):
        train.step({"x": xb, "labels": yb})
        losses.append(train.read_scalar("loss"))
    assert len(losses) == 40
    assert abs(losses[0] - math.log(10)) < 0.3
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    ckpt = str(workdir / "mlp.safetensors")
    train.save_checkpoint(ckpt)

    gi = mg.models.fashion_mnist("mlp", batch=100, mode="infer", hidden=64, seed=7)
    infer = mg.compile(gi, mode="infer", **opts)
    infer.load_checkpoint(ckpt)
    acc = mg.evaluate(infer, test_x, test_y)
    # The same weights evaluated by NumPy: flatten -> fc1 -> relu -> fc2.
    w, _ = mg.load_safetensors(ckpt)
    h = np.maximum(test_x.reshape(len(test_y), -1) @ w["fc1.weight"].T + w["fc1.bias"], 0)
    want = ((h @ w["fc2.weight"].T + w["fc2.bias"]).argmax(axis=1) == test_y).mean()
    assert abs(acc - want) <= 1 / len(test_y)  # at most one near-tie decided the other way
    assert acc > 0.6, acc
    print(f"Fashion-MNIST MLP, 40 steps on {infer.backend}: test accuracy {100 * acc:.1f}%")
