"""meganeura: compile, train and run neural networks on Vulkan GPUs from Python.

Build a graph (or import ONNX / a Hugging Face Llama directory), compile it for a device, then feed NumPy
arrays and read NumPy arrays back::

    import numpy as np
    import meganeura as mg

    g = mg.Graph()
    x = g.input("x", [4, 2])
    labels = g.input("labels", [4], "i32")
    h = mg.tanh(mg.nn.linear(g, "fc1", x, 8))
    g.output("loss", mg.cross_entropy(mg.nn.linear(g, "fc2", h, 2), labels))
    s = mg.compile(g, mode="train", optimizer=mg.AdamW(lr=0.05))   # backend="auto": Vulkan, else CPU
    for _ in range(300):
        s.step({"x": np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32),
                "labels": np.array([0, 1, 1, 0], np.int32)})
    print(s.read_scalar("loss"))

Errors the library reports are raised as meganeura.Error (a RuntimeError) with its message.
"""
import numpy as _np

from ._meganeura import *  # noqa: F401,F403
from ._meganeura import Error, llama, models, nn, onnx  # noqa: F401


def batches(images, labels, batch, shuffle=True, seed=0):
    """Yields (images, labels) batches of exactly `batch` rows (the remainder is dropped), shuffled with a
    seeded NumPy generator when `shuffle`. The slices are C-contiguous, so set_input reads them in place."""
    n = len(labels) - len(labels) % batch
    order = _np.random.default_rng(seed).permutation(len(labels)) if shuffle else _np.arange(len(labels))
    for i in range(0, n, batch):
        idx = order[i:i + batch]
        yield _np.ascontiguousarray(images[idx]), _np.ascontiguousarray(labels[idx])


def evaluate(session, images, labels, input="x", logits="logits"):
    """Accuracy of an inference session over a whole dataset: batches of the session's batch size (the last
    one padded with zeros, its padding dropped), argmax of `logits` against the labels."""
    batch = session.shape_of(input)[0]
    correct = 0
    for i in range(0, len(labels), batch):
        x = images[i:i + batch]
        real = len(x)
        if real < batch:
            x = _np.concatenate([x, _np.zeros((batch - real,) + x.shape[1:], x.dtype)])
        session.set_input(input, _np.ascontiguousarray(x))
        out = session.run()[logits]
        correct += int((out[:real].argmax(axis=1) == labels[i:i + real]).sum())
    return correct / len(labels)


__all__ = [n for n in dir() if not n.startswith("_")]
