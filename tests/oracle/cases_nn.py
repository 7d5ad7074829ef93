"""Oracle cases for normalization, convolution/pooling/upsampling, attention and rotary embedding, and for
each of their derivative ops directly. Each case names a builder key registered in
tests/oracle/builders_nn.cpp. Padding attributes are [top, left, bottom, right]; PyTorch only pads
symmetrically, so asymmetric cases pad explicitly with F.pad first (-inf for max pooling)."""
import math

import torch
import torch.nn.functional as F

from oracle_lib import Case, In

CASES = []


def add(*cases):
    CASES.extend(cases)


def grad_wrt(f, index):
    """The derivative op's reference: d<f(inputs)>/d inputs[index] contracted with dy (the last argument)."""
    def g(*args):
        *xs, dy = args
        xs = [x.detach().requires_grad_(i == index) for i, x in enumerate(xs)]
        return torch.autograd.grad(f(*xs), xs[index], dy)[0]
    return g


# ---- normalization
EPS = 1e-5


def rms_norm_hf(x, w=None, eps=EPS):
    # HF Llama: x * rsqrt(mean(x^2) + eps) * w
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def batch_norm_train(x, w=None, b=None, eps=EPS):
    return F.batch_norm(x, None, None, w, b, training=True, eps=eps)


add(Case("layer_norm_wb", "layer_norm", [In((3, 5, 7)), In((7,)), In((7,))],
         lambda x, w, b: F.layer_norm(x, (7,), w, b, EPS), attrs={"eps": EPS}),
    Case("layer_norm_w", "layer_norm", [In((4, 9)), In((9,))],
         lambda x, w: F.layer_norm(x, (9,), w, None, EPS), attrs={"eps": EPS}),
    Case("layer_norm_plain", "layer_norm", [In((2, 3, 11))], lambda x: F.layer_norm(x, (11,), eps=1e-3),
         attrs={"eps": 1e-3}),
    # a large common offset: the variance must be taken around the mean, not as E[x^2] - E[x]^2
    Case("layer_norm_offset", "layer_norm", [In((3, 8), kind="uniform", lo=90, hi=91)],
         lambda x: F.layer_norm(x, (8,), eps=EPS), attrs={"eps": EPS}),
    Case("rms_norm_w", "rms_norm", [In((3, 5, 7)), In((7,))], lambda x, w: rms_norm_hf(x, w, 1e-6),
         attrs={"eps": 1e-6}),
    Case("rms_norm_plain", "rms_norm", [In((6, 5))], lambda x: rms_norm_hf(x), attrs={"eps": EPS}),
    Case("group_norm_wb", "group_norm", [In((2, 6, 3, 5)), In((6,)), In((6,))],
         lambda x, w, b: F.group_norm(x, 3, w, b, EPS), attrs={"groups": 3, "eps": EPS}),
    Case("group_norm_one_group", "group_norm", [In((2, 4, 5)), In((4,)), In((4,))],
         lambda x, w, b: F.group_norm(x, 1, w, b, EPS), attrs={"groups": 1, "eps": EPS}),
    Case("group_norm_instance", "group_norm", [In((3, 5, 2, 3))], lambda x: F.group_norm(x, 5, eps=EPS),
         attrs={"groups": 5, "eps": EPS}),
    Case("batch_norm_wb_4d", "batch_norm", [In((5, 3, 2, 3)), In((3,)), In((3,))], batch_norm_train,
         attrs={"eps": EPS}),
    Case("batch_norm_2d", "batch_norm", [In((7, 4))], lambda x: batch_norm_train(x), attrs={"eps": EPS}),
    Case("batch_norm_w_3d", "batch_norm", [In((4, 3, 5)), In((3,))], lambda x, w: batch_norm_train(x, w),
         attrs={"eps": EPS}),
    # running statistics are buffers (PyTorch does not differentiate them): gradients for x, weight, bias only
    Case("batch_norm_eval", "batch_norm_eval",
         [In((4, 3, 2, 5)), In((3,), grad=False), In((3,), kind="positive", grad=False), In((3,)), In((3,))],
         lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False, eps=EPS), attrs={"eps": EPS}),
    Case("batch_norm_eval_plain", "batch_norm_eval",
         [In((6, 4)), In((4,), grad=False), In((4,), kind="positive", grad=False)],
         lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False, eps=1e-3), attrs={"eps": 1e-3}))

# (x, dy [, weight]) -> dx, against autograd of the PyTorch norm with respect to x only
NORM_GRADS = [
    ("layer_norm_grad_w", "layer_norm_grad", [(3, 5, 7), (3, 5, 7), (7,)], {"eps": EPS},
     lambda x, w: F.layer_norm(x, (7,), w, None, EPS)),
    ("layer_norm_grad_plain", "layer_norm_grad", [(4, 9), (4, 9)], {"eps": EPS},
     lambda x: F.layer_norm(x, (9,), eps=EPS)),
    ("rms_norm_grad_w", "rms_norm_grad", [(3, 5, 7), (3, 5, 7), (7,)], {"eps": 1e-6},
     lambda x, w: rms_norm_hf(x, w, 1e-6)),
    ("rms_norm_grad_plain", "rms_norm_grad", [(6, 5), (6, 5)], {"eps": EPS}, lambda x: rms_norm_hf(x)),
    ("group_norm_grad_w", "group_norm_grad", [(2, 6, 3, 5), (2, 6, 3, 5), (6,)], {"groups": 3, "eps": EPS},
     lambda x, w: F.group_norm(x, 3, w, None, EPS)),
    ("group_norm_grad_plain", "group_norm_grad", [(3, 4, 5), (3, 4, 5)], {"groups": 2, "eps": EPS},
     lambda x: F.group_norm(x, 2, eps=EPS)),
    ("batch_norm_grad_w", "batch_norm_grad", [(5, 3, 2, 3), (5, 3, 2, 3), (3,)], {"eps": EPS},
     lambda x, w: batch_norm_train(x, w)),
    ("batch_norm_grad_plain", "batch_norm_grad", [(7, 4), (7, 4)], {"eps": EPS}, lambda x: batch_norm_train(x)),
]
for name, key, shapes, attrs, f in NORM_GRADS:
    def ref(x, dy, *w, f=f):
        return grad_wrt(f, 0)(x, *w, dy)
    add(Case(name, key, [In(s) for s in shapes], ref, attrs=attrs, grad=False))


# ---- convolution
def conv_ref(stride, padding, dilation, groups):
    t, l, b, r = padding

    def f(x, w, bias=None):
        return F.conv2d(F.pad(x, (l, r, t, b)), w, bias, stride=stride, dilation=dilation, groups=groups)
    return f


def conv_out(n, k, s, p0, p1, d):
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def conv_attrs(stride, padding, dilation, groups):
    return {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": groups}


# The transposed convolution: torch's full output (no padding) with the padding cropped away, so asymmetric
# padding can be checked too; output_padding adds rows/columns at the end.
def conv_transpose_ref(stride, padding, output_padding, dilation, groups):
    t, l, b, r = padding

    def f(x, w):
        y = F.conv_transpose2d(x, w, stride=stride, output_padding=output_padding, dilation=dilation,
                               groups=groups)
        return y[:, :, t:y.shape[2] - b, l:y.shape[3] - r]
    return f


for name, xs, ws, st, pd, op, dl, gr in [
        ("conv_transpose2d_s2", (2, 3, 5, 4), (3, 4, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1),
        ("conv_transpose2d_asym", (1, 2, 4, 5), (2, 3, 3, 2), (2, 1), (0, 1, 2, 0), (1, 0), (1, 1), 1),
        ("conv_transpose2d_groups_dil", (2, 4, 3, 3), (4, 3, 3, 3), (1, 2), (1, 0, 1, 0), (0, 1), (2, 1), 2),
        ("conv_transpose2d_1x1", (1, 6, 3, 2), (6, 5, 1, 1), (1, 1), (0, 0, 0, 0), (0, 0), (1, 1), 1)]:
    add(Case(name, "conv_transpose2d", [In(xs), In(ws)], conv_transpose_ref(st, pd, op, dl, gr),
             attrs={"stride": list(st), "padding": list(pd), "output_padding": list(op), "dilation": list(dl),
                    "groups": gr}))


CONVS = [  # name, x shape, w shape, stride, padding [t, l, b, r], dilation, groups
    ("conv2d_basic", (2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ("conv2d_stride_asym_pad", (1, 3, 9, 8), (5, 3, 3, 2), (2, 3), (1, 0, 2, 1), (1, 1), 1),
    ("conv2d_dilation", (2, 2, 9, 9), (3, 2, 3, 3), (1, 2), (2, 1, 2, 3), (2, 3), 1),
    ("conv2d_groups", (2, 6, 5, 5), (9, 2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),
    ("conv2d_depthwise", (1, 5, 7, 7), (5, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 5),
    ("conv2d_1x1", (2, 7, 3, 5), (3, 7, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ("conv2d_stem_k7", (1, 3, 13, 12), (4, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),  # > 25 taps
    # Implicit-GEMM tiling on Vulkan: channel counts above one tile, no dimension a multiple of a tile,
    # several stride phases (grad_input) and K splits (grad_weight). Each stays under 20 MFLOP.
    ("conv2d_wide_3x3", (2, 40, 9, 9), (70, 40, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ("conv2d_wide_3x3_s2", (2, 40, 9, 9), (70, 40, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    ("conv2d_wide_1x1", (2, 160, 6, 5), (144, 160, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # ResNet bottleneck, small: the 3x3 conv and the strided 1x1 projection of a downsampling block
    ("conv2d_bottleneck_3x3", (2, 64, 10, 10), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ("conv2d_bottleneck_proj_s2", (2, 64, 10, 10), (128, 64, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ("conv2d_grouped_wide", (2, 32, 7, 7), (48, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    # stride 2 with dilation 2 in height: odd input rows are read by no tap (an empty stride phase)
    ("conv2d_wide_dilated_s2", (1, 24, 11, 10), (20, 24, 3, 3), (2, 2), (2, 1, 1, 2), (2, 1), 1),
]
for name, xs, ws, st, pd, dl, gr in CONVS:
    add(Case(name, "conv2d", [In(xs), In(ws)], conv_ref(st, pd, dl, gr), attrs=conv_attrs(st, pd, dl, gr)))
add(Case("conv2d_groups_bias", "conv2d_bias", [In((2, 6, 5, 5)), In((9, 2, 3, 3)), In((9,))],
         conv_ref((2, 1), (1, 1, 0, 1), (1, 1), 3), attrs=conv_attrs((2, 1), (1, 1, 0, 1), (1, 1), 3)),
    Case("conv2d_depthwise_bias", "conv2d_bias", [In((1, 4, 6, 5)), In((4, 1, 3, 3)), In((4,))],
         conv_ref((1, 1), (1, 1, 1, 1), (1, 1), 4), attrs=conv_attrs((1, 1), (1, 1, 1, 1), (1, 1), 4)))

# conv1d: x [N, C, L], w [O, C/groups, k]
add(Case("conv1d_stride_pad", "conv1d", [In((2, 3, 11)), In((5, 3, 3))],
         lambda x, w: F.conv1d(x, w, stride=2, padding=1),
         attrs={"stride": 2, "padding": 1, "dilation": 1, "groups": 1}),
    Case("conv1d_groups_dilation_bias", "conv1d_bias", [In((2, 4, 13)), In((6, 2, 3)), In((6,))],
         lambda x, w, b: F.conv1d(x, w, b, stride=1, padding=2, dilation=2, groups=2),
         attrs={"stride": 1, "padding": 2, "dilation": 2, "groups": 2}))

# conv2d_grad_input(dy, w) and conv2d_grad_weight(x, dy), against autograd of the padded conv
for name, xs, ws, st, pd, dl, gr in CONVS:
    ys = (xs[0], ws[0], conv_out(xs[2], ws[2], st[0], pd[0], pd[2], dl[0]),
          conv_out(xs[3], ws[3], st[1], pd[1], pd[3], dl[1]))
    f = conv_ref(st, pd, dl, gr)
    attrs = conv_attrs(st, pd, dl, gr)

    def gi(dy, w, f=f, xs=xs):
        x = torch.zeros(xs, dtype=torch.float64, requires_grad=True)
        return torch.autograd.grad(f(x, w), x, dy)[0]

    def gw(x, dy, f=f, ws=ws):
        w = torch.zeros(ws, dtype=torch.float64, requires_grad=True)
        return torch.autograd.grad(f(x, w), w, dy)[0]

    tag = name[len("conv2d_"):]
    add(Case(f"conv2d_grad_input_{tag}", "conv2d_grad_input", [In(ys), In(ws)], gi,
             attrs=dict(attrs, input_shape=list(xs)), grad=False),
        Case(f"conv2d_grad_weight_{tag}", "conv2d_grad_weight", [In(xs), In(ys)], gw,
             attrs=dict(attrs, weight_shape=list(ws)), grad=False))


# ---- pooling and upsampling
def max_pool_ref(kernel, stride, padding, dilation):
    t, l, b, r = padding

    def f(x):
        xp = F.pad(x, (l, r, t, b), value=-math.inf)
        return F.max_pool2d(xp, kernel, stride, 0, dilation)
    return f


def avg_pool_ref(kernel, stride, padding, count_include_pad):
    t, l, b, r = padding

    def f(x):
        if t == b and l == r:  # symmetric: PyTorch's own avg_pool2d
            return F.avg_pool2d(x, kernel, stride, (t, l), count_include_pad=count_include_pad)
        # asymmetric: window sums of the zero-padded input over the window's tap count
        s = F.avg_pool2d(F.pad(x, (l, r, t, b)), kernel, stride, 0, divisor_override=1)
        if count_include_pad:
            return s / (kernel[0] * kernel[1])
        ones = F.pad(torch.ones_like(x), (l, r, t, b))
        return s / F.avg_pool2d(ones, kernel, stride, 0, divisor_override=1)
    return f


def pool_attrs(kernel, stride, padding, **extra):
    return dict({"kernel": list(kernel), "stride": list(stride), "padding": list(padding)}, **extra)


MAX_POOLS = [  # name, x shape, kernel, stride, padding, dilation
    ("max_pool2d_k2", (2, 3, 6, 8), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
    ("max_pool2d_k3_s2_pad", (1, 4, 7, 9), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ("max_pool2d_asym", (2, 2, 7, 6), (2, 3), (1, 2), (1, 0, 0, 1), (1, 1)),
    ("max_pool2d_dilation", (1, 3, 9, 8), (3, 2), (1, 2), (1, 1, 1, 0), (2, 3)),
]
for name, xs, k, st, pd, dl in MAX_POOLS:
    f = max_pool_ref(k, st, pd, dl)
    attrs = pool_attrs(k, st, pd, dilation=list(dl))
    add(Case(name, "max_pool2d", [In(xs)], f, attrs=attrs))
    ys = tuple(f(torch.zeros(xs, dtype=torch.float64)).shape)
    add(Case(name.replace("max_pool2d", "max_pool2d_grad"), "max_pool2d_grad", [In(xs), In(ys)], grad_wrt(f, 0),
             attrs=attrs, grad=False))


# Ties: the input is built from small integers (cast in the graph), so windows hold equal maxima. PyTorch
# routes the gradient to the first maximum in row-major window order.
def max_pool_ties(xi, dy):
    x = xi.to(torch.float64).requires_grad_(True)
    return torch.autograd.grad(F.max_pool2d(x, (3, 3), (2, 2), (1, 1)), x, dy)[0]


add(Case("max_pool2d_grad_ties", "max_pool2d_grad_ties", [In((2, 2, 7, 7), "i32", lo=0, hi=3), In((2, 2, 4, 4))],
         max_pool_ties, attrs=pool_attrs((3, 3), (2, 2), (1, 1, 1, 1), dilation=[1, 1]), grad=False))

AVG_POOLS = [  # name, x shape, kernel, stride, padding
    ("avg_pool2d_k2", (2, 3, 6, 8), (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avg_pool2d_k3_s2_pad", (1, 4, 7, 9), (3, 3), (2, 2), (1, 1, 1, 1)),
    ("avg_pool2d_asym", (2, 2, 7, 6), (2, 3), (1, 2), (1, 0, 0, 1)),
]
for name, xs, k, st, pd in AVG_POOLS:
    for cip in (1, 0):
        f = avg_pool_ref(k, st, pd, bool(cip))
        attrs = pool_attrs(k, st, pd, count_include_pad=cip)
        tag = "incl" if cip else "excl"
        add(Case(f"{name}_{tag}", "avg_pool2d", [In(xs)], f, attrs=attrs))
        ys = tuple(f(torch.zeros(xs, dtype=torch.float64)).shape)

        def gref(dy, f=f, xs=xs):
            x = torch.zeros(xs, dtype=torch.float64, requires_grad=True)
            return torch.autograd.grad(f(x), x, dy)[0]
        add(Case(f"{name.replace('avg_pool2d', 'avg_pool2d_grad')}_{tag}", "avg_pool2d_grad", [In(ys)], gref,
                 attrs=dict(attrs, input_shape=list(xs)), grad=False))

add(Case("global_avg_pool", "global_avg_pool", [In((2, 3, 5, 7))], lambda x: F.adaptive_avg_pool2d(x, 1)),
    Case("upsample_nearest2d_2x3", "upsample_nearest2d", [In((2, 3, 3, 4))],
         lambda x: F.interpolate(x, scale_factor=(2, 3), mode="nearest"), attrs={"scale": [2, 3]}),
    Case("upsample_nearest2d_1x2", "upsample_nearest2d", [In((1, 2, 5, 3))],
         lambda x: F.interpolate(x, scale_factor=(1, 2), mode="nearest"), attrs={"scale": [1, 2]}))


def upsample_grad(dy):
    x = torch.zeros(dy.shape[0], dy.shape[1], dy.shape[2] // 2, dy.shape[3] // 3, dtype=torch.float64,
                    requires_grad=True)
    return torch.autograd.grad(F.interpolate(x, scale_factor=(2, 3), mode="nearest"), x, dy)[0]


add(Case("upsample_nearest2d_grad", "upsample_nearest2d_grad", [In((2, 3, 6, 9))], upsample_grad,
         attrs={"scale": [2, 3]}, grad=False))


# ---- attention (plain PyTorch, float64): query head h reads kv head h // (Hq / Hkv); causal key j is
# visible to query i iff j <= i + Skv - Sq. A row with no visible key is defined to output 0 (and to have no
# derivative); the reference computes it without NaN so autograd stays finite.
def attn_scores(q, k, scale, causal, mask):
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    sq, skv = q.shape[2], k.shape[2]
    visible = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq) if causal else torch.ones(sq, skv, dtype=torch.bool)
    return s, visible


def attn_ref(scale=None, causal=False):
    def f(q, k, v, mask=None):
        sc = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        s, visible = attn_scores(q, k, sc, causal, mask)
        any_visible = visible.any(-1, keepdim=True)
        s = torch.where(visible, s, torch.tensor(-math.inf, dtype=s.dtype))
        s = torch.where(any_visible, s, torch.zeros_like(s))  # fully masked rows: a harmless finite row
        p = torch.softmax(s, -1) * any_visible
        return torch.matmul(p, v.repeat_interleave(q.shape[1] // k.shape[1], dim=1))
    return f


def lse_ref(scale=None, causal=False):
    def f(q, k, v, mask=None):
        sc = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        s, visible = attn_scores(q, k, sc, causal, mask)
        return torch.logsumexp(torch.where(visible, s, torch.tensor(-math.inf, dtype=s.dtype)), -1)
    return f


# name, B, Hq, Hkv, Sq, Skv, D, Dv, causal, scale (None: 1/sqrt(D)), mask shape (None: no mask)
ATTN = [
    ("mha", 2, 3, 3, 5, 5, 4, 4, False, None, None),
    ("gqa_d5_dv3", 1, 6, 2, 4, 7, 5, 3, False, None, None),
    ("causal_square", 1, 2, 2, 6, 6, 4, 4, True, None, None),
    ("causal_sq_lt_skv", 2, 2, 1, 3, 7, 6, 6, True, None, None),
    ("causal_sq_gt_skv", 1, 2, 2, 6, 4, 3, 3, True, None, None),  # queries 0 and 1 see no key: output 0
    ("mask_full", 2, 2, 2, 3, 5, 4, 4, False, None, (2, 2, 3, 5)),
    ("mask_bcast_heads", 2, 3, 1, 4, 5, 3, 3, False, None, (2, 1, 4, 5)),
    ("mask_2d_causal", 1, 2, 2, 4, 6, 4, 5, True, None, (4, 6)),
    ("mask_keys_scale", 2, 4, 2, 3, 5, 7, 2, False, 0.3, (2, 1, 1, 5)),
    ("scale_causal_gqa", 1, 4, 2, 5, 5, 6, 6, True, 0.5, None),
]


def attn_inputs(B, Hq, Hkv, Sq, Skv, D, Dv, mask):
    ins = [In((B, Hq, Sq, D)), In((B, Hkv, Skv, D)), In((B, Hkv, Skv, Dv))]
    return ins, ([] if mask is None else [In(mask, grad=False)])  # no op yields a mask derivative


for name, B, Hq, Hkv, Sq, Skv, D, Dv, causal, scale, mask in ATTN:
    attrs = {"scale": scale or 0.0, "causal": int(causal)}
    qkv, m = attn_inputs(B, Hq, Hkv, Sq, Skv, D, Dv, mask)
    add(Case(f"attention_{name}", "attention", qkv + m, attn_ref(scale, causal), attrs=attrs))
    if Sq <= Skv:  # rows without a visible key have lse -inf (not comparable as a finite number)
        add(Case(f"attention_lse_{name}", "attention_lse", qkv + m, lse_ref(scale, causal), attrs=attrs,
                 grad=False))
    # derivative ops: inputs q, k, v, do [, mask]; the builder computes o and lse with the forward ops and
    # feeds them to attention_grad_{q,k,v}
    dout = In((B, Hq, Sq, Dv))
    for which, idx in (("q", 0), ("k", 1), ("v", 2)):
        f = attn_ref(scale, causal)

        def gref(q, k, v, do, *mk, f=f, idx=idx):
            xs = [t.detach().requires_grad_(i == idx) for i, t in enumerate((q, k, v))]
            return torch.autograd.grad(f(*xs, *mk), xs[idx], do)[0]
        add(Case(f"attention_grad_{which}_{name}", f"attention_grad_{which}", qkv + [dout] + m, gref, attrs=attrs,
                 grad=False))


# ---- rotary embedding, compared with HF's rotate_half formulation
def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_hf(x, cos, sin):
    c, s = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return x * c + rotate_half(x) * s


add(Case("rope_bhsd", "rope", [In((2, 3, 5, 6)), In((5, 3)), In((5, 3))], rope_hf),
    Case("rope_2d", "rope", [In((7, 4)), In((7, 2)), In((7, 2))], rope_hf),
    Case("rope_batched_tables", "rope", [In((2, 3, 4, 10)), In((2, 1, 4, 5)), In((2, 1, 4, 5))], rope_hf))


# rope_tables + rope on real positions: HF Llama frequencies theta^(-2i/D), angles in float32 like the graph
def rope_llama(x, pos):
    d = x.shape[-1]
    inv = (1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))).to(torch.float32)
    ang = (pos.to(torch.float32)[:, None] * inv[None, :]).to(torch.float64)
    return rope_hf(x, ang.cos(), ang.sin())


add(Case("rope_llama_tables", "rope_tables", [In((1, 2, 5, 8)), In((5,), "i32", lo=0, hi=40)], rope_llama,
         attrs={"theta": 10000.0}))
