"""Oracle cases for pointwise, reduction, matmul, data-movement and loss ops (and their derivative
helpers). Each case names a builder key registered in tests/oracle/builders_basic.cpp."""
import torch
import torch.nn.functional as F

from oracle_lib import Case, In

CASES = []


def add(*cases):
    CASES.extend(cases)


# ---- unary pointwise: rank 0, rank 1 and odd-sized rank 3 shapes
UNARY = {
    "neg": (lambda x: -x, "normal"),
    "abs": (torch.abs, "nonzero"),
    "exp": (torch.exp, "normal"),
    "log": (torch.log, "positive"),
    "sqrt": (torch.sqrt, "positive"),
    "rsqrt": (torch.rsqrt, "positive"),
    "reciprocal": (torch.reciprocal, "nonzero"),
    "square": (torch.square, "normal"),
    "relu": (torch.relu, "nonzero"),
    "gelu": (lambda x: F.gelu(x), "normal"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "normal"),
    "silu": (F.silu, "normal"),
    "sigmoid": (torch.sigmoid, "normal"),
    "tanh": (torch.tanh, "normal"),
    "softplus": (F.softplus, "normal"),
    "erf": (torch.erf, "normal"),
    "sin": (torch.sin, "normal"),
    "cos": (torch.cos, "normal"),
    "stop_gradient": (lambda x: x, "normal"),
}
for key, (fn, kind) in UNARY.items():
    for shape in [(), (7,), (3, 5, 2)]:
        tag = "x".join(map(str, shape)) or "scalar"
        # stop_gradient has no gradient by definition: check forward only.
        add(Case(f"{key}_{tag}", key, [In(shape, kind=kind)], fn, grad=key != "stop_gradient"))

add(Case("leaky_relu_0.2", "leaky_relu", [In((4, 9), kind="nonzero")], lambda x: F.leaky_relu(x, 0.2),
         attrs={"alpha": 0.2}),
    Case("pow_3", "pow", [In((5, 6))], lambda x: x ** 3, attrs={"exponent": 3.0}),
    Case("pow_half", "pow", [In((5, 6), kind="positive")], lambda x: x ** 0.5, attrs={"exponent": 0.5}),
    Case("pow_neg1.5", "pow", [In((11,), kind="positive")], lambda x: x ** -1.5, attrs={"exponent": -1.5}),
    Case("clamp", "clamp", [In((6, 7), kind="uniform", lo=-2, hi=2)], lambda x: torch.clamp(x, -0.7, 1.1),
         attrs={"min": -0.7, "max": 1.1}),
    # f32 -> i32 truncates toward zero, like torch's .to(int32).
    Case("cast_f32_i32", "cast_i32", [In((4, 5), kind="uniform", lo=-9, hi=9)], lambda x: x.to(torch.int32),
         grad=False),
    Case("cast_i32_f32", "cast_f32", [In((13,), "i32", lo=-50, hi=50)], lambda x: x.to(torch.float64)),
    Case("cast_bool_f32", "cast_f32", [In((3, 4), "bool")], lambda x: x.to(torch.float64)),
    Case("cast_f32_bool", "cast_bool", [In((3, 4), kind="uniform", lo=-1, hi=1)], lambda x: x != 0, grad=False))

# ---- derivative helpers (x, dy) -> dy * f'(x), compared with autograd
def grad_of(f):
    def g(x, dy):
        x = x.detach().requires_grad_(True)
        return torch.autograd.grad(f(x), x, dy)[0]
    return g


for key, f in {"relu_grad": torch.relu, "gelu_grad": F.gelu,
               "gelu_tanh_grad": lambda x: F.gelu(x, approximate="tanh"), "silu_grad": F.silu}.items():
    kind = "nonzero" if key == "relu_grad" else "normal"
    add(Case(key, key, [In((5, 8), kind=kind), In((5, 8))], grad_of(f), grad=False))

# ---- binary with numpy broadcasting (both directions, rank 0 operands)
BINARY = {
    "add": (torch.add, "normal"),
    "sub": (torch.sub, "normal"),
    "mul": (torch.mul, "normal"),
    "div": (torch.div, "nonzero"),
    "maximum": (torch.maximum, "normal"),
    "minimum": (torch.minimum, "normal"),
}
BCAST = [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((6,), ()), ((2, 1, 3, 1), (5, 1, 4))]
for key, (fn, kind) in BINARY.items():
    for i, (sa, sb) in enumerate(BCAST):
        add(Case(f"{key}_b{i}", key, [In(sa), In(sb, kind=kind)], fn))

COMPARE = {"equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
           "greater": torch.gt, "greater_equal": torch.ge}
for key, fn in COMPARE.items():
    # small integers so that equality happens often; floats for the ordered comparisons too
    add(Case(f"{key}_i32", key, [In((4, 6), "i32", lo=0, hi=3), In((6,), "i32", lo=0, hi=3)], fn, grad=False),
        Case(f"{key}_f32", key, [In((3, 1, 5)), In((4, 1))], fn, grad=False))

add(Case("where", "where", [In((4, 1, 6), "bool"), In((5, 6)), In((4, 5, 1))], torch.where),
    Case("where_scalar", "where", [In((7,), "bool"), In(()), In((7,))], torch.where))

# ---- reductions
for key, fn in {"sum": torch.sum, "mean": torch.mean}.items():
    add(Case(f"{key}_all", key, [In((3, 4, 5))], lambda x, fn=fn: fn(x), attrs={"axes": [], "keepdim": 0}),
        Case(f"{key}_inner", key, [In((3, 4, 5))], lambda x, fn=fn: fn(x, dim=-1), attrs={"axes": [-1], "keepdim": 0}),
        Case(f"{key}_outer_keep", key, [In((3, 4, 5))], lambda x, fn=fn: fn(x, dim=0, keepdim=True),
             attrs={"axes": [0], "keepdim": 1}),
        Case(f"{key}_mid_multi", key, [In((2, 3, 4, 5))], lambda x, fn=fn: fn(x, dim=(1, 3)),
             attrs={"axes": [1, 3], "keepdim": 0}),
        Case(f"{key}_rank1", key, [In((9,))], lambda x, fn=fn: fn(x, dim=0), attrs={"axes": [0], "keepdim": 0}),
        Case(f"{key}_rank0", key, [In(())], lambda x, fn=fn: fn(x), attrs={"axes": [], "keepdim": 0}))
# Outputs along a contiguous axis and more than 32 reduced elements: the column kernel (bias gradients); 20 and
# 17 columns leave a partial block of 16.
add(Case("sum_columns", "sum", [In((6, 9, 20))], lambda x: torch.sum(x, dim=(0, 1)), attrs={"axes": [0, 1], "keepdim": 0}),
    Case("mean_columns_keep", "mean", [In((40, 3, 17))], lambda x: torch.mean(x, dim=0, keepdim=True),
         attrs={"axes": [0], "keepdim": 1}),
    Case("max_columns", "max", [In((70, 24))], lambda x: torch.amax(x, dim=0), attrs={"axes": [0], "keepdim": 0}),
    # Few column blocks and many rows: the rows split into chunks as well (two passes).
    Case("sum_columns_chunked", "sum", [In((300, 2, 24))], lambda x: torch.sum(x, dim=(0, 1)),
         attrs={"axes": [0, 1], "keepdim": 0}),
    Case("mean_columns_chunked", "mean", [In((530, 20))], lambda x: torch.mean(x, dim=0), attrs={"axes": [0], "keepdim": 0}),
    Case("min_columns_chunked", "min", [In((300, 17))], lambda x: torch.amin(x, dim=0), attrs={"axes": [0], "keepdim": 0}))
# Few outputs over many elements (a loss's mean over everything): each output's elements split into row chunks of
# at least 8,192 (two passes); 48,251 elements make 5 chunks with a short last one.
add(Case("sum_all_chunked", "sum", [In((7, 61, 113))], lambda x: torch.sum(x), attrs={"axes": [], "keepdim": 0}),
    Case("mean_rows_chunked", "mean", [In((3, 41000))], lambda x: torch.mean(x, dim=1), attrs={"axes": [1], "keepdim": 0}),
    Case("max_all_chunked", "max", [In((9, 2000))], lambda x: torch.amax(x), attrs={"axes": [], "keepdim": 0}))
for key, fn in {"max": torch.amax, "min": torch.amin}.items():
    # continuous random inputs: no ties, so the gradient is well defined
    add(Case(f"{key}_inner", key, [In((3, 4, 5))], lambda x, fn=fn: fn(x, dim=-1), attrs={"axes": [-1], "keepdim": 0}),
        Case(f"{key}_multi_keep", key, [In((2, 3, 4, 5))], lambda x, fn=fn: fn(x, dim=(0, 2), keepdim=True),
             attrs={"axes": [0, 2], "keepdim": 1}),
        Case(f"{key}_all", key, [In((4, 7))], lambda x, fn=fn: fn(x), attrs={"axes": [], "keepdim": 0}))
add(Case("argmax_inner", "argmax", [In((4, 9))], lambda x: torch.argmax(x, dim=1).to(torch.int32),
         attrs={"axis": 1, "keepdim": 0}, grad=False),
    Case("argmax_mid_keep", "argmax", [In((3, 5, 4))], lambda x: torch.argmax(x, dim=1, keepdim=True).to(torch.int32),
         attrs={"axis": 1, "keepdim": 1}, grad=False))
for key, fn in {"softmax": torch.softmax, "log_softmax": torch.log_softmax}.items():
    add(Case(f"{key}_last", key, [In((4, 11))], lambda x, fn=fn: fn(x, dim=-1), attrs={"axis": -1}),
        Case(f"{key}_mid", key, [In((2, 5, 3))], lambda x, fn=fn: fn(x, dim=1), attrs={"axis": 1}),
        Case(f"{key}_big", key, [In((3, 7), kind="uniform", lo=-60, hi=60)], lambda x, fn=fn: fn(x, dim=-1),
             attrs={"axis": -1}),
        # Logits near 1e5 (ONNX's test_softmax_large_number): exp(x - (m + log s)) rounds log-sum-exp at the scale
        # of the logits and is off by ~1e-3; exp(x - m) / s is not.
        Case(f"{key}_large_logits", key, [In((3, 9), kind="uniform", lo=1e5 - 8, hi=1e5 + 8)],
             lambda x, fn=fn: fn(x, dim=-1), attrs={"axis": -1}))
add(Case("logsumexp_last", "logsumexp", [In((4, 11))], lambda x: torch.logsumexp(x, dim=-1),
         attrs={"axis": -1, "keepdim": 0}),
    Case("logsumexp_first_keep", "logsumexp", [In((6, 3), kind="uniform", lo=-80, hi=80)],
         lambda x: torch.logsumexp(x, dim=0, keepdim=True), attrs={"axis": 0, "keepdim": 1}))

# ---- matmul / linear
def mm(ta, tb):
    def f(a, b):
        return torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)
    return f


add(Case("matmul_2d", "matmul", [In((5, 7)), In((7, 3))], mm(0, 0), attrs={"ta": 0, "tb": 0}),
    Case("matmul_ta", "matmul", [In((7, 5)), In((7, 3))], mm(1, 0), attrs={"ta": 1, "tb": 0}),
    Case("matmul_tb", "matmul", [In((5, 7)), In((3, 7))], mm(0, 1), attrs={"ta": 0, "tb": 1}),
    Case("matmul_tab", "matmul", [In((2, 7, 5)), In((2, 3, 7))], mm(1, 1), attrs={"ta": 1, "tb": 1}),
    Case("matmul_batch_bcast", "matmul", [In((3, 1, 4, 6)), In((5, 6, 2))], mm(0, 0), attrs={"ta": 0, "tb": 0}),
    Case("matmul_vec", "matmul", [In((1, 9)), In((9, 1))], mm(0, 0), attrs={"ta": 0, "tb": 0}),
    Case("linear", "linear", [In((4, 6)), In((5, 6))], lambda x, w: F.linear(x, w)),
    Case("linear_bias_3d", "linear_bias", [In((2, 3, 6)), In((5, 6)), In((5,))], F.linear))

# ---- data movement
add(Case("reshape", "reshape", [In((2, 3, 4))], lambda x: x.reshape(4, 6), attrs={"shape": [4, -1]}),
    Case("reshape_to_scalar", "reshape", [In((1, 1))], lambda x: x.reshape(()), attrs={"shape": []}),
    Case("permute", "permute", [In((2, 3, 4, 5))], lambda x: x.permute(2, 0, 3, 1), attrs={"perm": [2, 0, 3, 1]}),
    Case("transpose", "transpose", [In((3, 7))], lambda x: x.t(), attrs={"a": 0, "b": 1}),
    Case("slice_step", "slice", [In((4, 9, 3))], lambda x: x[:, 1:8:3],
         attrs={"axis": 1, "start": 1, "end": 8, "step": 3}),
    Case("slice_neg", "slice", [In((10,))], lambda x: x[-7:-2], attrs={"axis": 0, "start": -7, "end": -2, "step": 1}),
    Case("concat", "concat3", [In((2, 3)), In((2, 1)), In((2, 4))], lambda a, b, c: torch.cat([a, b, c], 1),
         attrs={"axis": 1}),
    Case("concat_axis0", "concat2", [In((1, 3, 2)), In((4, 3, 2))], lambda a, b: torch.cat([a, b], 0),
         attrs={"axis": 0}),
    Case("split_mid", "split_take1", [In((3, 8))], lambda x: torch.split(x, [3, 4, 1], 1)[1],
         attrs={"sizes": [3, 4, 1], "axis": 1}),
    Case("pad", "pad", [In((2, 3, 4))], lambda x: F.pad(x, (0, 0, 2, 1, 1, 0), value=0.5),
         attrs={"pads": [1, 0, 2, 1], "value": 0.5}),
    Case("expand", "expand", [In((3, 1, 2))], lambda x: x.expand(4, 3, 5, 2), attrs={"shape": [4, 3, 5, 2]}),
    Case("gather_axis1", "gather", [In((3, 6, 2)), In((4, 5), "i32", lo=0, hi=6)],
         lambda t, i: torch.index_select(t, 1, i.reshape(-1)).reshape(3, 4, 5, 2), attrs={"axis": 1}),
    Case("index_select", "index_select", [In((5, 4)), In((7,), "i32", lo=0, hi=5)],
         lambda x, i: torch.index_select(x, 0, i), attrs={"axis": 0}),
    # repeated ids: the embedding gradient is a scatter-add
    Case("embedding", "embedding", [In((6, 3)), In((2, 5), "i32", lo=0, hi=6)], lambda t, i: F.embedding(i, t)),
    Case("one_hot", "one_hot", [In((2, 4), "i32", lo=0, hi=5)], lambda i: F.one_hot(i, 5).to(torch.float64),
         attrs={"depth": 5}),
    Case("flatten", "flatten", [In((2, 3, 4))], lambda x: torch.flatten(x, 1)),
    Case("squeeze_unsqueeze", "squeeze_unsqueeze", [In((3, 1, 4))], lambda x: x.squeeze(1).unsqueeze(0)))


# ---- elementwise indexing along an axis (repeated indices: the gather's gradient is a scatter-add)
def scatter_case(name, reduce, axis, data, idx, grad, distinct=False):
    torch_reduce = {"mul": "prod", "max": "amax", "min": "amin"}.get(reduce)

    def f(d, i, u):
        if reduce == "none":
            return d.scatter(axis, i, u)
        if reduce == "add":
            return d.scatter_add(axis, i, u)
        return d.scatter_reduce(axis, i, u, reduce=torch_reduce, include_self=True)
    kind = "distinct" if distinct else "normal"
    return Case(name, "scatter_elements",
                [In(data), In(idx, "i32", kind=kind, lo=0, hi=data[axis], axis=axis), In(idx)], f,
                attrs={"axis": axis, "reduction": reduce}, grad=grad)


add(Case("gather_elements_axis1", "gather_elements", [In((3, 6, 4)), In((3, 5, 2), "i32", lo=0, hi=6)],
         lambda d, i: torch.gather(d, 1, i), attrs={"axis": 1}),
    Case("gather_elements_rank1", "gather_elements", [In((7,)), In((9,), "i32", lo=0, hi=7)],
         lambda d, i: torch.gather(d, 0, i), attrs={"axis": 0}),
    Case("gather_elements_last", "gather_elements", [In((2, 3, 5)), In((2, 2, 8), "i32", lo=0, hi=5)],
         lambda d, i: torch.gather(d, 2, i), attrs={"axis": -1}),
    scatter_case("scatter_elements_none_axis1", "none", 1, (3, 6, 4), (3, 4, 4), True, distinct=True),
    scatter_case("scatter_elements_add_axis0", "add", 0, (5, 3), (7, 3), True),
    scatter_case("scatter_elements_mul", "mul", 0, (4, 3), (6, 2), False),
    scatter_case("scatter_elements_max", "max", 1, (3, 5), (2, 7), False),
    scatter_case("scatter_elements_min", "min", 1, (3, 5), (3, 6), False))


def slice_grad(dy):
    z = torch.zeros(4, 9, 3, dtype=torch.float64)
    z[1:4, 0:9:4, :] = dy
    return z


def gather_grad(table, idx_shape):
    def f(dy, idx):
        t = torch.zeros(*table, dtype=torch.float64, requires_grad=True)
        out = torch.index_select(t, 1, idx.reshape(-1)).reshape(table[0], *idx_shape, table[2])
        return torch.autograd.grad(out, t, dy)[0]
    return f


add(Case("slice_grad", "slice_grad", [In((3, 3, 3))], slice_grad, grad=False,
         attrs={"starts": [1, 0, 0], "ends": [4, 9, 3], "steps": [1, 4, 1], "input_shape": [4, 9, 3]}),
    Case("gather_grad", "gather_grad", [In((3, 4, 5, 2)), In((4, 5), "i32", lo=0, hi=6)],
         gather_grad((3, 6, 2), (4, 5)), grad=False, attrs={"axis": 1, "table_shape": [3, 6, 2]}),
    # A table of more rows than the scan's workgroup has threads, not a multiple of it (rows per thread, a
    # ragged last chunk), with repeated and untouched rows.
    Case("gather_grad_big_table", "gather_grad", [In((1, 3, 60, 2)), In((3, 60), "i32", lo=0, hi=1500)],
         gather_grad((1, 1500, 2), (3, 60)), grad=False, attrs={"axis": 1, "table_shape": [1, 1500, 2]}))

# ---- losses
def xent(ignore=-100, smoothing=0.0):
    def f(z, y):
        return F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1), ignore_index=ignore,
                               label_smoothing=smoothing)
    return f


def xent_grad(ignore, smoothing):
    def f(z, y, dl):
        z = z.detach().requires_grad_(True)
        return torch.autograd.grad(xent(ignore, smoothing)(z, y), z, dl)[0]
    return f


add(Case("cross_entropy", "cross_entropy", [In((6, 5)), In((6,), "i32", lo=0, hi=5)], xent(),
         attrs={"ignore_index": -100, "label_smoothing": 0.0}),
    Case("cross_entropy_3d_ignore", "cross_entropy", [In((2, 4, 7)), In((2, 4), "i32", lo=0, hi=7)], xent(3),
         attrs={"ignore_index": 3, "label_smoothing": 0.0}),
    Case("cross_entropy_smooth", "cross_entropy", [In((5, 4), kind="uniform", lo=-30, hi=30),
                                                   In((5,), "i32", lo=0, hi=4)], xent(-100, 0.1),
         attrs={"ignore_index": -100, "label_smoothing": 0.1}),
    Case("cross_entropy_grad", "cross_entropy_grad", [In((6, 5)), In((6,), "i32", lo=0, hi=5), In(())],
         xent_grad(2, 0.2), attrs={"ignore_index": 2, "label_smoothing": 0.2}, grad=False),
    Case("mse", "mse", [In((3, 7)), In((3, 7))], F.mse_loss),
    Case("l1", "l1", [In((3, 7)), In((3, 7))], F.l1_loss),
    Case("bce_with_logits", "bce_with_logits", [In((4, 5), kind="uniform", lo=-40, hi=40),
                                                In((4, 5), kind="uniform", lo=0, hi=1)],
         F.binary_cross_entropy_with_logits))
