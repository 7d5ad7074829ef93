"""ONNX import test models (tests/onnx_test.cpp). Usage: onnx_export.py OUTDIR

For each model NAME writes OUTDIR/NAME.onnx and OUTDIR/NAME.safetensors holding the input "x" and the
PyTorch reference output "y" (computed in float64 from the very float32 parameters that were exported).
The torch models are exported with torch.onnx.export; "helper_ops" is built with onnx.helper and its
reference is computed with the equivalent torch ops. "mlp_grad" and "cnn_grad" also hold torch autograd
gradients "grad.<param>" of loss = sum(y * y)."""
import copy
import os
import shutil
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_io  # noqa: E402

OUT = sys.argv[1]


def save(name, tensors):
    torch_io.write(os.path.join(OUT, name + ".safetensors"), tensors)


def export(name, model, x, opset, fold=True, dynamic=None, run_x=None, keep_bn=False):
    """dynamic: {axis: name} of x and y left symbolic in the file; the reference then runs on run_x.
    keep_bn: export in TrainingMode.PRESERVE (the module is in eval mode) so the exporter does not fuse
    BatchNormalization into the preceding Conv; it stays as an inference-mode BatchNormalization node."""
    model.eval()
    path = os.path.join(OUT, name + ".onnx")
    mode = torch.onnx.TrainingMode.PRESERVE if keep_bn else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=opset,
                      do_constant_folding=fold, dynamic_axes={"x": dynamic, "y": dynamic} if dynamic else None,
                      training=mode)
    if run_x is not None:
        x = run_x
    with torch.no_grad():
        y = copy.deepcopy(model).double()(x.double())
    save(name, {"x": x, "y": y})


class Decoder(nn.Module):
    """ConvTranspose (stride, padding, output padding, dilation), GatherElements (repeated indices) and
    ScatterElements (indices distinct along the axis) as torch.onnx.export writes them."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.ConvTranspose2d(3, 2, (2, 3), stride=(1, 2), padding=(0, 1), dilation=(2, 1), bias=False)
        g = torch.Generator().manual_seed(3)
        self.register_buffer("take", torch.randint(0, 15, (2, 2, 10, 6), generator=g))
        self.register_buffer("put", torch.stack([torch.randperm(15, generator=g)[:6] for _ in range(40)])
                             .reshape(2, 2, 10, 6))

    def forward(self, x):
        h = self.up2(torch.relu(self.up(x)))          # [2, 2, 10, 15]
        t = torch.gather(h, 3, self.take)             # GatherElements, [2, 2, 10, 6]
        return h.scatter(3, self.put, t * 2.0 - 1.0)  # ScatterElements, [2, 2, 10, 15]


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.fc2 = nn.Linear(16, 12)
        self.fc3 = nn.Linear(12, 5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = nn.functional.gelu(self.fc2(h))
        return torch.softmax(self.fc3(h), dim=-1)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 6, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 2 * 2, 4)
        self.fc2 = nn.Linear(6, 4)

    def forward(self, x):
        h = self.bn1(torch.relu(self.conv1(x)))        # 8x8x8 (BatchNormalization stays: no Conv to fold into)
        h = nn.functional.max_pool2d(h, 2)             # 8x4x4
        h = torch.relu(self.bn2(self.conv2(h)))        # 6x4x4
        a = nn.functional.avg_pool2d(h, 2)             # 6x2x2
        g = nn.functional.adaptive_avg_pool2d(h, 1)    # 6x1x1 (GlobalAveragePool)
        return self.fc(torch.flatten(a, 1)) + self.fc2(torch.flatten(g, 1))


class Block(nn.Module):
    def __init__(self, d=16, heads=2, t=6):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, 2 * d)
        self.ff2 = nn.Linear(2 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)))

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.reshape(b, t, self.heads, hd).transpose(1, 2)
        k = k.reshape(b, t, self.heads, hd).transpose(1, 2)
        v = v.reshape(b, t, self.heads, hd).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / (hd ** 0.5)
        s = s.masked_fill(~self.mask[:t, :t], -1e9)
        a = torch.matmul(torch.softmax(s, dim=-1), v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


class MlpGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class CnnGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 3, 3)
        self.fc = nn.Linear(3 * 2 * 2, 3)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)  # 4x4x4
        h = torch.relu(self.conv2(h))                                # 3x2x2
        return self.fc(torch.flatten(h, 1))


class VitBlock(nn.Module):
    """ViT: 4x4 patch embedding conv, class token, position embedding, pre-LN encoder block
    (nn.MultiheadAttention, GELU MLP), final LayerNorm and a linear head on the class token."""

    def __init__(self, d=16, heads=2, patch=4, img=16, classes=5):
        super().__init__()
        n = (img // patch) ** 2
        self.embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(0.5 * torch.randn(1, 1, d))
        self.pos = nn.Parameter(0.5 * torch.randn(1, n + 1, d))
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, 4 * d)
        self.ff2 = nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2)               # [B, N, D]
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.ff2(nn.functional.gelu(self.ff1(self.ln2(h))))
        return self.head(self.ln(h)[:, 0])


class RmsNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class LlamaBlock(nn.Module):
    """Llama decoder block on float embeddings [B, S, D]: RMSNorm, RoPE (half-split rotation, cos/sin from
    positions computed in the model), causal attention through a triu mask, SwiGLU MLP."""

    def __init__(self, d=16, heads=2, hidden=40, theta=10000.0):
        super().__init__()
        self.heads, self.hd, self.theta = heads, d // heads, theta
        self.norm1 = RmsNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.norm2 = RmsNorm(d)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]   # [S, hd/2]
        ang = torch.cat([ang, ang], dim=-1).to(x.dtype)
        cos, sin = ang.cos(), ang.sin()
        h = self.norm1(x)
        q = self.wq(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        mask = torch.triu(torch.full((s, s), float("-inf"), dtype=x.dtype), diagonal=1)
        sc = torch.matmul(q, k.transpose(2, 3)) / (self.hd ** 0.5) + mask
        a = torch.matmul(torch.softmax(sc, dim=-1), v).transpose(1, 2).reshape(b, s, d)
        x = x + self.wo(a)
        h = self.norm2(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


def randomize_bn(model):
    with torch.no_grad():  # non-trivial running statistics so BatchNorm(eval) is really exercised
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def helper_ops():
    # y = reshape(expand(concat(gather(where(x > 0, tril(x), clip(x)), idx, 0), x[1:3], 1), [3,2,8]) * scale,
    #             [shape(...)[0], -1])
    idx = numpy_helper.from_array(np.array([2, 0], dtype=np.int64), "idx")
    starts = numpy_helper.from_array(np.array([1], dtype=np.int64), "starts")
    ends = numpy_helper.from_array(np.array([3], dtype=np.int64), "ends")
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    eshape = numpy_helper.from_array(np.array([3, 1, 1], dtype=np.int64), "eshape")
    lo = numpy_helper.from_array(np.array(-0.5, dtype=np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "hi")
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    rng = np.random.RandomState(5)
    scale_np = rng.randn(3, 1, 1).astype(np.float32)
    scale = numpy_helper.from_array(scale_np, "scale")
    minus1 = numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1")
    gidx0 = numpy_helper.from_array(np.array([0], dtype=np.int64), "gidx0")
    nodes = [
        helper.make_node("Trilu", ["x"], ["tril"], upper=0),
        helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Where", ["pos", "tril", "clip"], ["w"]),
        helper.make_node("Gather", ["w", "idx"], ["g"], axis=0),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Concat", ["g", "s"], ["cat"], axis=1),
        helper.make_node("Expand", ["cat", "eshape"], ["e"]),
        helper.make_node("Mul", ["e", "scale"], ["m"]),
        helper.make_node("Shape", ["m"], ["mshape"]),
        helper.make_node("Gather", ["mshape", "gidx0"], ["d0"], axis=0),
        helper.make_node("Concat", ["d0", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["m", "newshape"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "helper_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 16])],
                              [idx, starts, ends, axes, eshape, lo, hi, zero, scale, minus1, gidx0])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(OUT, "helper_ops.onnx"))
    torch.manual_seed(11)
    x = torch.randn(4, 4)
    xd = x.double()
    w = torch.where(xd > 0, torch.tril(xd), torch.clamp(xd, -0.5, 0.5))
    cat = torch.cat([w[[2, 0]], xd[1:3]], dim=1)
    m = cat.expand(3, 2, 8) * torch.from_numpy(scale_np).double()
    save("helper_ops", {"x": x, "y": m.reshape(3, -1)})


def helper_logic():
    # Boolean ops on runtime tensors (not foldable): y = x + And(p, q) + 2 Or(Not(p), q) + 4 Xor(p, q)
    # with p = x > 0, q = x < 0.5.
    c0 = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "c0")
    c5 = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "c5")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    four = numpy_helper.from_array(np.array(4.0, dtype=np.float32), "four")
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Greater", ["x", "c0"], ["p"]),
        helper.make_node("Less", ["x", "c5"], ["q"]),
        helper.make_node("And", ["p", "q"], ["a"]),
        helper.make_node("Not", ["p"], ["np"]),
        helper.make_node("Or", ["np", "q"], ["o"]),
        helper.make_node("Xor", ["p", "q"], ["xo"]),
        helper.make_node("Cast", ["a"], ["af"], to=f),
        helper.make_node("Cast", ["o"], ["of"], to=f),
        helper.make_node("Cast", ["xo"], ["xf"], to=f),
        helper.make_node("Mul", ["of", "two"], ["o2"]),
        helper.make_node("Mul", ["xf", "four"], ["x4"]),
        helper.make_node("Add", ["x", "af"], ["s1"]),
        helper.make_node("Add", ["s1", "o2"], ["s2"]),
        helper.make_node("Add", ["s2", "x4"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "helper_logic", [helper.make_tensor_value_info("x", f, [3, 4])],
                              [helper.make_tensor_value_info("y", f, [3, 4])], [c0, c5, two, four])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(OUT, "helper_logic.onnx"))
    torch.manual_seed(12)
    x = torch.randn(3, 4)
    xd = x.double()
    p, q = xd > 0, xd < 0.5
    y = xd + (p & q).double() + 2 * ((~p) | q).double() + 4 * (p ^ q).double()
    save("helper_logic", {"x": x, "y": y})


def bad_models():
    # A node reads "w", which is neither an initializer, a graph input nor a node output.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "missing_init", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(OUT, "bad_missing_init.onnx"))
    # Two unsupported ops (NonMaxSuppression, RoiAlign) among supported ones.
    y2 = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.array([1], dtype=np.int64), "k")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonMaxSuppression", ["r"], ["h"], name="the_nms"),
             helper.make_node("RoiAlign", ["h", "k"], ["y"], name="the_roialign")]
    g = helper.make_graph(nodes, "unknown_ops", [x], [y2], [k])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(OUT, "bad_unknown_ops.onnx"))


def bad_models_2():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "old_opset", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), os.path.join(OUT, "bad_opset.onnx"))
    # An initializer whose raw data holds 2 floats while its dims say 6.
    b = TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=np.zeros(2, np.float32).tobytes())
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "short_init", [x], [y], [b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(OUT, "bad_init_size.onnx"))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    export("mlp", Mlp(), torch.randn(4, 10), 13)
    # The same model with every initializer in an external data file next to the .onnx.
    ext = onnx.load(os.path.join(OUT, "mlp.onnx"))
    onnx.save_model(ext, os.path.join(OUT, "mlp_ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="mlp_ext.data", size_threshold=0)
    shutil.copy(os.path.join(OUT, "mlp.safetensors"), os.path.join(OUT, "mlp_ext.safetensors"))
    torch.manual_seed(1)
    cnn = Cnn()
    with torch.no_grad():  # non-trivial running statistics so BatchNorm(eval) is really exercised
        for bn in (cnn.bn1, cnn.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    export("cnn", cnn, torch.randn(2, 3, 8, 8), 15)  # bn2 folded into conv2 by the exporter
    torch.manual_seed(5)
    export("cnn_bn", cnn, torch.randn(2, 3, 8, 8), 16, fold=False)  # no constant folding
    torch.manual_seed(2)
    export("block", Block(), torch.randn(2, 6, 16), 17)
    torch.manual_seed(3)
    export("block_op14", Block(), torch.randn(2, 6, 16), 14)  # LayerNorm decomposed (no LayerNormalization)

    torch.manual_seed(6)
    export("mlp_dyn", Mlp(), torch.randn(4, 10), 13, dynamic={0: "batch"}, run_x=torch.randn(7, 10))
    torch.manual_seed(7)  # symbolic batch and sequence: the Shape/Gather/Concat/Slice pieces see bound sizes
    export("block_dyn", Block(), torch.randn(2, 6, 16), 17, dynamic={0: "batch", 1: "seq"},
           run_x=torch.randn(3, 4, 16))

    import torchvision  # noqa: E402  (Debian python3-torchvision)
    torch.manual_seed(20)
    resnet = torchvision.models.resnet18(weights=None, num_classes=10)
    randomize_bn(resnet)
    export("resnet18", resnet, torch.randn(1, 3, 32, 32), 13)  # batch norms folded into the convs
    export("resnet18_bn", resnet, torch.randn(1, 3, 64, 64), 17, fold=False, keep_bn=True)  # BatchNormalization
    torch.manual_seed(21)
    export("vit", VitBlock(), torch.randn(1, 3, 16, 16), 17)
    torch.manual_seed(22)
    export("vit_op13", VitBlock(), torch.randn(2, 3, 16, 16), 13, fold=False)  # LayerNorm decomposed
    torch.manual_seed(23)
    export("llama", LlamaBlock(), torch.randn(1, 7, 16), 17)
    torch.manual_seed(24)
    export("llama_nofold", LlamaBlock(), torch.randn(2, 5, 16), 14, fold=False)  # RoPE/mask as subgraphs
    torch.manual_seed(26)
    export("decoder", Decoder(), torch.randn(2, 4, 4, 4), 17)
    torch.manual_seed(25)  # symbolic sequence: positions (Range) and the mask are computed from Shape
    export("llama_dyn", LlamaBlock(), torch.randn(1, 6, 16), 15, dynamic={1: "seq"}, run_x=torch.randn(1, 9, 16))

    # Models whose gradients are checked: torch autograd of loss = sum(y * y), in float64.
    for name, make, x in (("mlp_grad", MlpGrad, lambda: torch.randn(4, 6)),
                          ("cnn_grad", CnnGrad, lambda: torch.randn(2, 2, 8, 8))):
        torch.manual_seed(4)
        m = make()
        x = x()
        m.eval()
        torch.onnx.export(m, (x,), os.path.join(OUT, name + ".onnx"), input_names=["x"], output_names=["y"],
                          opset_version=13, do_constant_folding=False)
        md = m.double()
        y = md(x.double())
        (y * y).sum().backward()
        out = {"x": x, "y": y.detach()}
        for pname, p in md.named_parameters():
            out["grad." + pname] = p.grad
        save(name, out)

    helper_ops()
    helper_logic()
    bad_models()
    bad_models_2()


if __name__ == "__main__":
    main()
