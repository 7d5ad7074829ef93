"""The Python module: graphs, compiling, NumPy in and out, errors, safetensors, devices. Each number is
checked against a closed form or NumPy, never against the module itself."""
import math

import numpy as np
import pytest

import meganeura as mg


def test_forward_matches_numpy(opts):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    g = mg.Graph()
    x = g.input("x", [3, 5])
    y = mg.linear(x, g.parameter("w", [4, 5], w), g.parameter("b", [4], b))
    g.output("y", mg.relu(y) * 2.0 + 1.0)
    g.output("s", mg.sum(mg.softmax(y), [1]))
    s = mg.compile(g, mode="infer", **opts)
    out = s.run({"x": a})
    want = np.maximum(a @ w.T + b, 0) * 2 + 1
    assert out["y"].shape == (3, 4) and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["s"], np.ones(3), rtol=1e-5)


def test_xor_trains(opts):
    g = mg.Graph()
    x = g.input("x", [4, 2])
    labels = g.input("labels", [4], "i32")
    h = mg.tanh(mg.nn.linear(g, "fc1", x, 8))
    g.output("loss", mg.cross_entropy(mg.nn.linear(g, "fc2", h, 2), labels))
    s = mg.compile(g, mode="train", optimizer=mg.AdamW(lr=0.05), **opts)
    feed = {"x": np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32), "labels": np.array([0, 1, 1, 0], np.int32)}
    s.step(feed)
    first = s.read_scalar("loss")
    for _ in range(299):
        s.step(feed)
    assert abs(first - math.log(2)) < 0.3  # near-uniform logits at PyTorch's default init
    assert s.read_scalar("loss") < 0.05
    assert s.step_count == 300
    assert "fc1.weight" in s.state_names


def test_inputs_are_converted_and_checked(opts):
    g = mg.Graph()
    x = g.input("x", [2, 3])
    g.output("y", x * 3.0)
    s = mg.compile(g, **opts)
    # float64 and a non-contiguous view convert; the result is the same as from float32.
    base = np.arange(12, dtype=np.float64).reshape(2, 6)[:, ::2]
    np.testing.assert_array_equal(s.run({"x": base})["y"], base.astype(np.float32) * 3)
    with pytest.raises(mg.Error, match="'x'"):
        s.set_input("x", np.zeros(5, np.float32))
    with pytest.raises(mg.Error, match="'nope'"):
        s.set_input("nope", np.zeros(6, np.float32))
    # mgn::Error is a RuntimeError with the library's message.
    with pytest.raises(RuntimeError):
        s.read("missing_output")


def test_graph_errors_name_the_op():
    g = mg.Graph()
    a = g.input("a", [2, 3])
    b = g.input("b", [4, 5])
    with pytest.raises(mg.Error, match="matmul"):
        mg.matmul(a, b)
    with pytest.raises(mg.Error, match="unknown option 'no_such'"):
        mg.compile(g, no_such=1)


def test_checkpoint_round_trip(opts, workdir):
    g = mg.Graph()
    x = g.input("x", [1, 2])
    g.output("y", mg.linear(x, g.parameter("w", [3, 2], np.arange(6, dtype=np.float32))))
    s = mg.compile(g, **opts)
    path = str(workdir / "w.safetensors")
    s.save_checkpoint(path)
    tensors, meta = mg.load_safetensors(path)
    np.testing.assert_array_equal(tensors["w"], np.arange(6, dtype=np.float32).reshape(3, 2))
    # Write other values, load them into a fresh session, and check the product.
    mg.save_safetensors(path, {"w": np.ones((3, 2), np.float32) * 2}, {"note": "from python"})
    t2, meta2 = mg.load_safetensors(path)
    assert meta2["note"] == "from python"
    g2 = mg.Graph()
    x2 = g2.input("x", [1, 2])
    g2.output("y", mg.linear(x2, g2.parameter("w", [3, 2])))
    s2 = mg.compile(g2, **opts)
    s2.load_checkpoint(path)
    np.testing.assert_array_equal(s2.run({"x": np.array([[1, 2]], np.float32)})["y"], [[6, 6, 6]])
    with pytest.raises(mg.Error, match="no_such_file"):
        mg.load_safetensors(str(workdir / "no_such_file.safetensors"))


def test_half_precision_files(workdir):
    path = str(workdir / "h.safetensors")
    v = np.array([1.0, 0.5, -2.0, 1e-3], np.float32)
    mg.save_safetensors(path, {"h": v, "i": np.array([1, -7], np.int64)}, dtype="f16")
    t, _ = mg.load_safetensors(path)
    np.testing.assert_allclose(t["h"], v, rtol=1e-3)  # f16 keeps 11 significant bits
    assert t["i"].dtype == np.int32 and list(t["i"]) == [1, -7]


def test_devices_and_options():
    devs = mg.devices()
    assert isinstance(devs, list)
    for d in devs:
        assert {"index", "name", "type", "api_version", "driver"} <= set(d)
    o = mg.CompileOptions()
    o.mode = "train"
    o.backend = "cpu"
    o.optimizer = mg.SGD(lr=0.5)
    assert (o.mode, o.backend) == ("train", "cpu")
    with pytest.raises(mg.Error, match="precision"):
        o.precision = "fast"


def test_cpu_backend_is_selectable():
    g = mg.Graph()
    g.output("y", g.input("x", [2]) + 1.0)
    s = mg.compile(g, backend="cpu")
    assert s.backend == "cpu" and s.device_type == "host"
    np.testing.assert_array_equal(s.run({"x": np.array([1, 2], np.float32)})["y"], [2, 3])
