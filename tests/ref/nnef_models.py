#!/usr/bin/env python3
"""Hand-written NNEF models for the NNEF importer's tests (tests/nnef_test.cpp), with PyTorch computing the same
graphs. Each case is a folder OUT/<case>/ holding graph.nnef, one .dat file per variable (written here with
struct, following the Khronos binary tensor layout: a 128-byte header, then raw little-endian items) and
ref.safetensors: the inputs "in.<name>", the float64 PyTorch outputs "out.<name>" and, for the training case,
the gradients "grad.<label>" of loss = sum(y * y). No NNEF tool is used: none is installed (Debian and npm
have none), and the test must not depend on the code under test.
Usage: nnef_models.py OUT_DIR
"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

torch.backends.mkldnn.enabled = False  # oneDNN's f32 conv backward is wrong in Debian's torch 1.13
OUT = sys.argv[1]
RNG = np.random.default_rng(28)


def dat(arr, item="float", bits=32):
    """The NNEF binary tensor file of `arr`: magic 4E EF, version 1.0, data length, rank, extents[8], bits per item,
    item type (0 float, 4 signed int, 5 logical), 19 reserved words."""
    arr = np.asarray(arr)
    code = {"float": 0, "uint": 1, "int": 4, "logical": 5}[item]
    if item == "float":
        raw = np.ascontiguousarray(arr, dtype={16: "<f2", 32: "<f4", 64: "<f8"}[bits]).tobytes()
    elif item == "logical" and bits == 1:
        raw = np.packbits(arr.astype(np.uint8).ravel(), bitorder="big").tobytes()
    elif item == "logical":
        raw = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
    else:
        raw = np.ascontiguousarray(arr, dtype=("<i%d" if item == "int" else "<u%d") % (bits // 8)).tobytes()
    dims = list(arr.shape) + [0] * (8 - arr.ndim)
    head = b"\x4e\xef\x01\x00" + struct.pack("<II8III", len(raw), arr.ndim, *dims, bits, code) + b"\0" * 76
    assert len(head) == 128
    return head + raw


class Case:
    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(OUT, name)
        os.makedirs(self.dir, exist_ok=True)
        self.vars = {}  # label -> float64 numpy array

    def var(self, label, shape, scale=0.5, bits=32):
        a = RNG.standard_normal(shape) * scale
        if bits == 16:
            a = a.astype(np.float16).astype(np.float64)  # the value the file holds
        elif bits == 32:
            a = a.astype(np.float32).astype(np.float64)
        self.vars[label] = a
        path = os.path.join(self.dir, label + ".dat")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(dat(a, bits=bits))
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)

    def write(self, graph, inputs, outputs, grads=None):
        with open(os.path.join(self.dir, "graph.nnef"), "w") as f:
            f.write(graph)
        t = {"in." + k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
        t.update({"out." + k: v.detach().numpy() for k, v in outputs.items()})
        for k, v in (grads or {}).items():
            t[k if k.startswith(("loss.", "final.")) else "grad." + k] = v
        st_io.write(os.path.join(self.dir, "ref.safetensors"), t, dtypes={k: "F64" for k in t})


def tin(a):
    return torch.tensor(a, dtype=torch.float64)


def mlp():
    c = Case("mlp")
    x = RNG.standard_normal((4, 10))
    w1, b1 = c.var("fc1/weight", (16, 10)), c.var("fc1/bias", (1, 16))
    w2, b2 = c.var("fc2/weight", (5, 16)), c.var("fc2/bias", (1, 5))
    w3 = c.var("w3", (5, 6))
    graph = """version 1.0;
# an MLP: linear layers, activations, matmul and softmax
graph mlp( x ) -> ( y, z )
{
    x = external<scalar>(shape = [4, 10]);
    w1 = variable<scalar>(shape = [16, 10], label = 'fc1/weight');
    b1 = variable<scalar>(shape = [1, 16], label = 'fc1/bias');
    w2 = variable<scalar>(shape = [5, 16], label = "fc2/weight");
    b2 = variable(shape = [1, 5], label = 'fc2/bias');
    w3 = variable<scalar>(shape = [5, 6], label = 'w3');
    h = linear(x, w1, b1);
    r = relu(h);
    g = gelu(sub(r, 0.25));
    s = silu(g);
    o = linear(s, w2, bias = b2);
    p = matmul(o, w3);                       # [4, 6]
    q = matmul(p, w3, transposeB = true);    # [4, 5]
    a = div(mul(add(q, o), sigmoid(o)), 2.0);
    y = softmax(a, axes = [1]);
    z = copy(neg(a));
}
"""
    xt = tin(x)
    h = F.linear(xt, w1, b1[0])
    s = F.silu(F.gelu(F.relu(h) - 0.25))
    o = F.linear(s, w2, b2[0])
    q = (o @ w3) @ w3.T
    a = (q + o) * torch.sigmoid(o) / 2
    c.write(graph, {"x": x}, {"y": torch.softmax(a, 1), "z": -a})


def unary():
    c = Case("unary")
    x = RNG.standard_normal((3, 5))
    xp = np.abs(x) + 0.5
    graph = """version 1.0;
graph unary( x, p ) -> ( y1, y2, y3, y4, y5, y6, y7, y8, y9 )
{
    x = external<scalar>(shape = [3, 5]);
    p = external<scalar>(shape = [3, 5]);
    y1 = add(exp(x), log(p));
    y2 = sub(rcp(p), mul(rsqrt(p), sqrt(p)));
    y3 = add(sqr(x), rsqr(p));
    y4 = add(tanh(x), mul(abs(x), softplus(x)));
    y5 = add(elu(x, alpha = 0.7), leaky_relu(x, alpha = 0.2));
    y6 = add(clamp(x, -0.5, 0.8), max(min(x, 0.3), -0.2));
    y7 = add(pow(p, 1.5), log2(p));
    c = gt(x, 0.1);
    n = not(c);
    s = select(n, sin(x), cos(x));
    k = and(c, lt(x, 1.0));
    y8 = add(s, select(k, 1.0, 0.0));
    y9 = add(add(floor(mul(x, 3.0)), ceil(mul(x, -2.5))), sign(sub(x, 0.2)));
}
"""
    X, P = tin(x), tin(xp)
    outs = {
        "y1": X.exp() + P.log(),
        "y2": 1 / P - P.rsqrt() * P.sqrt(),
        "y3": X * X + 1 / (P * P),
        "y4": X.tanh() + X.abs() * F.softplus(X),
        "y5": F.elu(X, 0.7) + F.leaky_relu(X, 0.2),
        "y6": X.clamp(-0.5, 0.8) + X.clamp(max=0.3).clamp(min=-0.2),
        "y7": P ** 1.5 + P.log2(),
        "y8": torch.where(~(X > 0.1), X.sin(), X.cos()) + ((X > 0.1) & (X < 1.0)).double(),
        "y9": torch.floor(X * 3) + torch.ceil(X * -2.5) + torch.sign(X - 0.2),
    }
    c.write(graph, {"x": x, "p": xp}, outs)


def conv():
    c = Case("conv")
    x = RNG.standard_normal((2, 3, 9, 9))
    w1, b1 = c.var("conv1/filter", (4, 3, 3, 3)), c.var("conv1/bias", (1, 4))
    w2 = c.var("dw/filter", (4, 1, 3, 3))
    w3 = c.var("conv3/filter", (6, 2, 2, 2))
    mean, var = c.var("bn/mean", (1, 6)), tin((np.abs(RNG.standard_normal((1, 6))) + 0.5).astype(np.float32))
    off, sc = c.var("bn/offset", (1, 6)), c.var("bn/scale", (1, 6))
    with open(os.path.join(c.dir, "bn/variance.dat"), "wb") as f:
        f.write(dat(var.numpy()))
    wd = c.var("up/filter", (6, 3, 3, 3))
    graph = """version 1.0;
graph conv( x ) -> ( y1, y2, y3, y4, y5, y6, y7, y8, y9 )
{
    x = external<scalar>(shape = [2, 3, 9, 9]);
    f1 = variable<scalar>(shape = [4, 3, 3, 3], label = 'conv1/filter');
    b1 = variable<scalar>(shape = [1, 4], label = 'conv1/bias');
    f2 = variable<scalar>(shape = [4, 1, 3, 3], label = 'dw/filter');
    f3 = variable<scalar>(shape = [6, 2, 2, 2], label = 'conv3/filter');
    m = variable<scalar>(shape = [1, 6], label = 'bn/mean');
    v = variable<scalar>(shape = [1, 6], label = 'bn/variance');
    o = variable<scalar>(shape = [1, 6], label = 'bn/offset');
    s = variable<scalar>(shape = [1, 6], label = 'bn/scale');
    fd = variable<scalar>(shape = [6, 3, 3, 3], label = 'up/filter');
    c1 = conv(x, f1, b1, padding = [(1, 1), (1, 1)], stride = [2, 2]);          # [2, 4, 5, 5]
    c2 = conv(c1, f2, 0.0, groups = 0, padding = []);                         # depthwise, auto same
    c3 = conv(c2, f3, groups = 2, dilation = [2, 2], padding = [(1, 0), (2, 1)]);
    y1 = batch_normalization(c3, m, v, o, s, epsilon = 1e-3);
    y2 = max_pool(c1, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = 'ignore');
    y3 = avg_pool(c1, size = [1, 1, 3, 3], padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = 'constant');
    y4 = avg_pool(c1, size = [1, 1, 3, 3], padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = 'ignore');
    y5 = max_pool(sub(c1, 3.0), size = [1, 1, 2, 2], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), (0, 1), (0, 1)], border = 'constant');
    y6 = add(box(c1, size = [1, 1, 2, 2], padding = [(0, 0), (0, 0), (0, 1), (1, 0)]), local_response_normalization(c1, size = [1, 3, 1, 1], alpha = 0.3, beta = 0.75, bias = 2.0));
    y7 = deconv(y1, fd, stride = [2, 2], padding = [(1, 1), (1, 1)], output_shape = [2, 3, 8, 11]);
    y8 = conv(x, f1, b1, border = 'reflect', padding = [(1, 1), (2, 0)]);
    y9 = max_pool(c1, size = [1, 1, 3, 3], border = 'replicate', padding = [(0, 0), (0, 0), (1, 1), (1, 1)]);
}
"""
    X = tin(x)
    c1 = F.conv2d(X, w1, b1[0], stride=2, padding=1)
    c2 = F.conv2d(F.pad(c1, (1, 1, 1, 1)), w2, groups=4)
    c3 = F.conv2d(F.pad(c2, (2, 1, 1, 0)), w3, groups=2, dilation=2)
    y1 = (c3 - mean.view(1, 6, 1, 1)) / torch.sqrt(var.view(1, 6, 1, 1) + 1e-3) * sc.view(1, 6, 1, 1) + off.view(1, 6, 1, 1)
    y2 = F.max_pool2d(c1, 3, stride=2, padding=1)
    y3 = F.avg_pool2d(c1, 3, stride=1, padding=1, count_include_pad=True)
    y4 = F.avg_pool2d(c1, 3, stride=1, padding=1, count_include_pad=False)
    y5 = F.max_pool2d(F.pad(c1 - 3.0, (0, 1, 0, 1)), 2, stride=2)
    box = F.avg_pool2d(F.pad(c1, (1, 0, 0, 1)), 2, stride=1) * 4
    y6 = box + F.local_response_norm(c1, 3, alpha=0.3, beta=0.75, k=2.0)
    y7 = F.conv_transpose2d(y1, wd, stride=2, padding=1, output_padding=(1, 0))
    assert y7.shape == (2, 3, 8, 11), y7.shape
    y8 = F.conv2d(F.pad(X, (2, 0, 1, 1), mode="reflect"), w1, b1[0])
    y9 = F.max_pool2d(F.pad(c1, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    c.write(graph, {"x": x}, {"y1": y1, "y2": y2, "y3": y3, "y4": y4, "y5": y5, "y6": y6, "y7": y7, "y8": y8, "y9": y9})


def shapes():
    c = Case("shapes")
    x = RNG.standard_normal((2, 3, 4))
    b = c.var("bias", (1, 3))
    graph = """version 1.0;
extension KHR_enable_operator_expressions;
graph shapes( x ) -> ( y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14 )
{
    x = external<scalar>(shape = [2, 3, 4]);
    b = variable<scalar>(shape = [1, 3], label = 'bias');
    t = transpose(x, axes = [0, 2, 1]);                        # [2, 4, 3]
    y1 = reshape(t, shape = [0, -1]);                          # [2, 12]
    y2 = concat([x, add(x, b), x], axis = 2);                  # b broadcasts from the left: [1, 3] -> [1, 3, 1]
    y3 = slice(x, axes = [1, 2], begin = [1, -3], end = [0, 4], stride = [1, 2]);
    y4 = unsqueeze(squeeze(reshape(x, shape = [2, 1, 12]), axes = [1]), axes = [0, 3]);
    [a, b2] = split(x, axis = 2, ratios = [1, 3]);
    y5 = mul(a, sum_reduce(b2, axes = [2]));
    y6 = pad(x, padding = [(0, 0), (1, 0), (2, 1)], value = 0.5);
    y7 = tile(x, repeats = [1, 2, 1]);
    y11 = stack([mean_reduce(x, axes = [1]), max_reduce(x, axes = [1])], axis = 1);
    (mu, var) = moments(x, axes = [0, 2]);
    y8 = sub(min_reduce(x, axes = [2]), add(mu, var));
    y9 = softmax(x, axes = [1, 2]);
    parts = unstack(x, axis = 1);
    y10 = add_n(parts);
    y12 = pad(x, padding = [(0, 0), (2, 1), (1, 3)], border = 'reflect');
    y13 = pad(x, padding = [(1, 0), (0, 2), (3, 0)], border = 'replicate');
    y14 = pad(x, padding = [(0, 0), (3, 0), (1, 4)], border = 'reflect-even');
}
"""
    X = tin(x)
    a, b2 = X[:, :, :1], X[:, :, 1:]
    mu = X.mean((0, 2), keepdim=True)
    var = ((X - mu) ** 2).mean((0, 2), keepdim=True)
    e = torch.exp(X - X.amax((1, 2), keepdim=True))
    outs = {
        "y1": X.permute(0, 2, 1).reshape(2, 12),
        "y2": torch.cat([X, X + b.view(1, 3, 1), X], 2),
        "y3": X[:, 1:, 1::2],
        "y4": X.reshape(2, 12)[None, :, :, None],
        "y5": a * b2.sum(2, keepdim=True),
        "y6": F.pad(X, (2, 1, 1, 0), value=0.5),
        "y7": X.repeat(1, 2, 1),
        "y11": torch.stack([X.mean(1, keepdim=True), X.amax(1, keepdim=True)], 1),
        "y8": X.amin(2, keepdim=True) - (mu + var),
        "y9": e / e.sum((1, 2), keepdim=True),
        "y10": X.sum(1),
        # numpy's pad modes are the reference: reflect (no edge), edge, symmetric (with the edge)
        "y12": tin(np.pad(x, ((0, 0), (2, 1), (1, 3)), mode="reflect")),
        "y13": tin(np.pad(x, ((1, 0), (0, 2), (3, 0)), mode="edge")),
        "y14": tin(np.pad(x, ((0, 0), (3, 0), (1, 4)), mode="symmetric")),
    }
    c.write(graph, {"x": x}, outs)


def train():
    """conv + relu + max_pool + reshape + linear, weights partly stored as float16: forward and gradients."""
    c = Case("train")
    x = RNG.standard_normal((2, 2, 6, 6))
    w1, b1 = c.var("conv/filter", (3, 2, 3, 3)), c.var("conv/bias", (1, 3), bits=16)
    w2, b2 = c.var("fc/weight", (4, 27), bits=16), c.var("fc/bias", (1, 4))
    graph = """version 1.0;
graph net( x ) -> ( y )
{
    x = external<scalar>(shape = [2, 2, 6, 6]);
    w1 = variable<scalar>(shape = [3, 2, 3, 3], label = 'conv/filter');
    b1 = variable<scalar>(shape = [1, 3], label = 'conv/bias');
    w2 = variable<scalar>(shape = [4, 27], label = 'fc/weight');
    b2 = variable<scalar>(shape = [1, 4], label = 'fc/bias');
    c = conv(x, w1, b1, padding = []);
    r = relu(c);
    p = max_pool(r, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], border = 'ignore', padding = [(0,0), (0,0), (0,0), (0,0)]);
    f = reshape(p, shape = [2, -1]);
    y = linear(f, w2, b2);
}
"""
    X = tin(x)
    net = lambda: F.linear(F.max_pool2d(F.relu(F.conv2d(X, w1, b1[0], padding=1)), 2).reshape(2, -1), w2, b2[0])
    y = net()
    (y * y).sum().backward()
    labels = ["conv/filter", "conv/bias", "fc/weight", "fc/bias"]
    grads = {k: t.grad.numpy().copy() for k, t in zip(labels, [w1, b1, w2, b2])}
    y0 = y.detach().clone()
    # Three SGD steps (lr 0.002) of loss = sum(y * y): the loss before each step, then the final parameters.
    opt = torch.optim.SGD([w1, b1, w2, b2], lr=0.002)
    for step in range(3):
        opt.zero_grad()
        loss = (net() ** 2).sum()
        grads["loss.%d" % step] = loss.detach().numpy().reshape(1)
        loss.backward()
        opt.step()
    for k, t in zip(labels, [w1, b1, w2, b2]):
        grads["final." + k] = t.detach().numpy().copy()
    c.write(graph, {"x": x}, {"y": y0}, grads)


def conv1d_and_ints():
    """A 1-D convolution with asymmetric padding, an integer constant and a 1-bit logical variable."""
    c = Case("conv1d")
    x = RNG.standard_normal((1, 2, 7))
    w = c.var("w", (3, 2, 3))
    mask = np.array([[[1, 0, 1, 1, 0, 0, 1]]], dtype=bool)
    with open(os.path.join(c.dir, "mask.dat"), "wb") as f:
        f.write(dat(mask, item="logical", bits=1))
    idx = np.array([[3, -2, 7]], dtype=np.int64)
    with open(os.path.join(c.dir, "ints.dat"), "wb") as f:
        f.write(dat(idx, item="int", bits=64))
    graph = """version 1.0;
graph c1( x ) -> ( y, z )
{
    x = external(shape = [1, 2, 7]);
    w = variable<scalar>(shape = [3, 2, 3], label = 'w');
    m = variable<logical>(shape = [1, 1, 7], label = 'mask');
    k = variable<integer>(shape = [1, 3], label = 'ints');
    c = conv(x, w, padding = [(2, 0)], stride = [2]);
    y = select(m, avg_pool(x, size = [1, 1, 3], padding = [(0, 0), (0, 0), (1, 1)], border = 'ignore'), 0.0);
    z = constant<scalar>(shape = [1, 3, 4], value = [0.5]);
    y2 = add(c, z);
}
"""
    # z is replaced below by the sum of c and the constant: rename in the graph for clarity
    graph = graph.replace("-> ( y, z )", "-> ( y, y2 )")
    X = tin(x)
    cc = F.conv1d(F.pad(X, (2, 0)), w, stride=2)
    y = torch.where(torch.tensor(mask), F.avg_pool1d(X, 3, 1, 1, count_include_pad=False), torch.tensor(0.0, dtype=torch.float64))
    c.write(graph, {"x": x}, {"y": y, "y2": cc + 0.5})


def main():
    mlp()
    unary()
    conv()
    shapes()
    train()
    conv1d_and_ints()
    print("wrote", OUT)


if __name__ == "__main__":
    main()
