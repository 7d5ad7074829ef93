// Shape and dtype rules, one per shape_rule named in ops.def. Each rule checks its inputs and attributes
// and throws mgn::Error naming the node and what was expected.
#include <algorithm>
#include <numeric>
#include <set>

#include "ir/graph.h"

namespace mgn::ir {
namespace {

struct Ctx {
  const Graph& g;
  Node& n;
  std::string who() const {
    std::string s = std::string(op_name(n.op));
    if (!n.name.empty()) s += " '" + n.name + "'";
    return s;
  }
  const Node& in(size_t i) const { return g.node(n.inputs.at(i)); }
  const Shape& shape(size_t i) const { return in(i).shape; }
  DType dtype(size_t i) const { return in(i).dtype; }
  [[noreturn]] void fail(const std::string& msg) const { throw Error(who() + ": " + msg); }
  void require(bool ok, const std::string& msg) const {
    if (!ok) fail(msg);
  }
  void require_float(size_t i) const {
    require(is_float(dtype(i)), "input " + std::to_string(i) + " must be a float tensor, got " +
                                    dtype_name(dtype(i)));
  }
  void require_rank(size_t i, int lo, int hi, const char* what) const {
    int r = int(shape(i).size());
    require(r >= lo && r <= hi, std::string(what) + " must have rank " + std::to_string(lo) +
                                    (lo == hi ? "" : ".." + std::to_string(hi)) + ", got " + shape_str(shape(i)));
  }
  void require_same_dtype(size_t i, size_t j) const {
    require(dtype(i) == dtype(j), std::string("inputs ") + std::to_string(i) + " and " + std::to_string(j) +
                                      " must have the same dtype, got " + dtype_name(dtype(i)) + " and " +
                                      dtype_name(dtype(j)));
  }
  std::vector<int64_t> ints(const char* k, size_t len) const {
    const auto& v = n.attrs.ints(k);
    require(v.size() == len, std::string("attribute '") + k + "' needs " + std::to_string(len) + " values, got " +
                                 std::to_string(v.size()));
    return v;
  }
};

void rule_source(Ctx&) {}

void rule_unary(Ctx& c) {
  Op op = c.n.op;
  bool int_ok = op == Op::Neg || op == Op::Abs || op == Op::StopGradient || op == Op::Square;
  if (!int_ok) c.require_float(0);
  else c.require(c.dtype(0) != DType::Bool, "input must be numeric, got bool");
  if (op == Op::Softmax || op == Op::LogSoftmax) {
    c.require(!c.shape(0).empty(), "input must have rank >= 1");
    normalize_axis(c.n.attrs.i("axis"), int(c.shape(0).size()), c.who());
  }
  if (op == Op::Clamp)
    c.require(c.n.attrs.f("min") <= c.n.attrs.f("max"), "clamp needs min <= max");
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}

void rule_cast(Ctx& c) {
  c.n.shape = c.shape(0);
  c.n.dtype = dtype_from_name(c.n.attrs.s("dtype"));
}

void rule_grad_pw(Ctx& c) {
  c.require_float(0);
  c.require_same_dtype(0, 1);
  c.require(c.shape(0) == c.shape(1), "x " + shape_str(c.shape(0)) + " and dy " + shape_str(c.shape(1)) +
                                          " must have the same shape");
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}

void rule_broadcast(Ctx& c) {
  c.require_same_dtype(0, 1);
  c.require(c.dtype(0) != DType::Bool, "arithmetic on bool tensors is not defined; cast first");
  c.n.shape = broadcast_shapes(c.shape(0), c.shape(1), c.who());
  c.n.dtype = c.dtype(0);
}

void rule_compare(Ctx& c) {
  c.require_same_dtype(0, 1);
  c.n.shape = broadcast_shapes(c.shape(0), c.shape(1), c.who());
  c.n.dtype = DType::Bool;
}

void rule_where(Ctx& c) {
  c.require(c.dtype(0) == DType::Bool, std::string("condition must be bool, got ") + dtype_name(c.dtype(0)));
  c.require_same_dtype(1, 2);
  Shape s = broadcast_shapes(c.shape(0), c.shape(1), c.who());
  c.n.shape = broadcast_shapes(s, c.shape(2), c.who());
  c.n.dtype = c.dtype(1);
}

Shape reduced_shape(Ctx& c, const Shape& in, std::vector<int64_t>& axes, bool keepdim) {
  int rank = int(in.size());
  std::set<int> ax;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) ax.insert(i);
  } else {
    for (int64_t a : axes) {
      int na = normalize_axis(a, rank, c.who());
      c.require(!ax.count(na), "axis " + std::to_string(a) + " is listed twice");
      ax.insert(na);
    }
  }
  axes.assign(ax.begin(), ax.end());
  Shape out;
  for (int i = 0; i < rank; ++i) {
    if (ax.count(i)) {
      if (keepdim) out.push_back(1);
    } else {
      out.push_back(in[size_t(i)]);
    }
  }
  return out;
}

void rule_reduce(Ctx& c) {
  c.require(c.dtype(0) != DType::Bool, "cannot reduce a bool tensor");
  if (c.n.op == Op::ReduceMean) c.require_float(0);
  std::vector<int64_t> axes = c.n.attrs.ints("axes");
  c.n.shape = reduced_shape(c, c.shape(0), axes, c.n.attrs.i("keepdim") != 0);
  c.n.attrs.set("axes", axes);  // canonical: sorted, non-negative; empty input meant "all"
  c.n.dtype = c.dtype(0);
}

void rule_argmax(Ctx& c) {
  c.require(!c.shape(0).empty(), "input must have rank >= 1");
  int axis = normalize_axis(c.n.attrs.i("axis"), int(c.shape(0).size()), c.who());
  c.n.attrs.set("axis", int64_t(axis));
  std::vector<int64_t> axes = {axis};
  c.n.shape = reduced_shape(c, c.shape(0), axes, c.n.attrs.i("keepdim") != 0);
  c.n.dtype = DType::I32;
}

void rule_logsumexp(Ctx& c) {
  c.require_float(0);
  c.require(!c.shape(0).empty(), "input must have rank >= 1");
  int axis = normalize_axis(c.n.attrs.i("axis"), int(c.shape(0).size()), c.who());
  c.n.attrs.set("axis", int64_t(axis));
  std::vector<int64_t> axes = {axis};
  c.n.shape = reduced_shape(c, c.shape(0), axes, c.n.attrs.i("keepdim") != 0);
  c.n.dtype = c.dtype(0);
}

void rule_matmul(Ctx& c) {
  c.require_float(0);
  c.require_same_dtype(0, 1);
  c.require_rank(0, 2, kMaxRank, "a");
  c.require_rank(1, 2, kMaxRank, "b");
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  bool ta = c.n.attrs.i("transpose_a") != 0, tb = c.n.attrs.i("transpose_b") != 0;
  int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2];
  int64_t ka = ta ? a[a.size() - 2] : a[a.size() - 1];
  int64_t kb = tb ? b[b.size() - 1] : b[b.size() - 2];
  int64_t n = tb ? b[b.size() - 2] : b[b.size() - 1];
  c.require(ka == kb, "inner dimensions differ: a " + shape_str(a) + (ta ? "ᵀ" : "") + " · b " + shape_str(b) +
                          (tb ? "ᵀ" : "") + " (K " + std::to_string(ka) + " vs " + std::to_string(kb) + ")");
  Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  Shape out = broadcast_shapes(ba, bb, c.who() + " batch axes");
  out.push_back(m);
  out.push_back(n);
  c.n.shape = out;
  c.n.dtype = c.dtype(0);
}

void rule_norm(Ctx& c) {
  c.require_float(0);
  const Shape& x = c.shape(0);
  int64_t feat;
  if (c.n.op == Op::LayerNorm || c.n.op == Op::RmsNorm) {
    c.require_rank(0, 1, kMaxRank, "x");
    feat = x.back();
  } else {
    c.require_rank(0, 2, kMaxRank, "x");
    feat = x[1];
    if (c.n.op == Op::GroupNorm) {
      int64_t g = c.n.attrs.i("groups");
      c.require(g > 0 && feat % g == 0, "channels " + std::to_string(feat) + " are not divisible by groups " +
                                            std::to_string(g));
    }
  }
  c.require(c.n.attrs.f("eps") >= 0, "eps must be non-negative");
  for (size_t i = 1; i < c.n.inputs.size(); ++i) {
    c.require_same_dtype(0, i);
    c.require(c.shape(i) == Shape{feat}, std::string(i == 1 ? "weight" : "bias") + " must have shape [" +
                                             std::to_string(feat) + "], got " + shape_str(c.shape(i)));
  }
  c.n.shape = x;
  c.n.dtype = c.dtype(0);
}

void rule_norm_grad(Ctx& c) {
  c.require_float(0);
  c.require(c.shape(0) == c.shape(1), "x and dy must have the same shape");
  const Shape& x = c.shape(0);
  if (c.n.inputs.size() > 2) {
    int64_t feat = (c.n.op == Op::LayerNormGrad || c.n.op == Op::RmsNormGrad) ? x.back() : x.at(1);
    c.require(c.shape(2) == Shape{feat}, "weight must have shape [" + std::to_string(feat) + "]");
  }
  c.n.shape = x;
  c.n.dtype = c.dtype(0);
}

struct Conv2dGeom {
  int64_t sh, sw, pt, pl, pb, pr, dh, dw, groups;
};

Conv2dGeom conv_geom(Ctx& c, bool has_groups, bool has_dilation) {
  auto st = c.ints("stride", 2);
  auto pd = c.ints("padding", 4);
  std::vector<int64_t> dl = {1, 1};
  if (has_dilation) dl = c.ints("dilation", 2);
  int64_t groups = has_groups ? c.n.attrs.i("groups") : 1;
  c.require(st[0] > 0 && st[1] > 0, "stride must be positive");
  c.require(dl[0] > 0 && dl[1] > 0, "dilation must be positive");
  c.require(groups > 0, "groups must be positive");
  for (int64_t p : pd) c.require(p >= 0, "padding must be non-negative");
  return {st[0], st[1], pd[0], pd[1], pd[2], pd[3], dl[0], dl[1], groups};
}

int64_t conv_out(Ctx& c, int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t d, const char* axis) {
  int64_t span = d * (k - 1) + 1;
  int64_t padded = in + p0 + p1;
  c.require(padded >= span, std::string("kernel (") + std::to_string(span) + " with dilation) is larger than the padded " +
                                axis + " (" + std::to_string(padded) + ")");
  return (padded - span) / s + 1;
}

Shape conv2d_shape(Ctx& c, const Shape& x, const Shape& w, const Conv2dGeom& g) {
  c.require(x.size() == 4, "input must be NCHW (rank 4), got " + shape_str(x));
  c.require(w.size() == 4, "weight must be [O, C/groups, kh, kw], got " + shape_str(w));
  c.require(x[1] % g.groups == 0 && w[0] % g.groups == 0,
            "channels (in " + std::to_string(x[1]) + ", out " + std::to_string(w[0]) +
                ") must be divisible by groups " + std::to_string(g.groups));
  c.require(w[1] == x[1] / g.groups, "weight " + shape_str(w) + " expects " + std::to_string(w[1] * g.groups) +
                                         " input channels, input " + shape_str(x) + " has " + std::to_string(x[1]));
  return {x[0], w[0], conv_out(c, x[2], w[2], g.sh, g.pt, g.pb, g.dh, "height"),
          conv_out(c, x[3], w[3], g.sw, g.pl, g.pr, g.dw, "width")};
}

void rule_conv2d(Ctx& c) {
  c.require_float(0);
  c.require_same_dtype(0, 1);
  c.n.shape = conv2d_shape(c, c.shape(0), c.shape(1), conv_geom(c, true, true));
  c.n.dtype = c.dtype(0);
}

void rule_conv2d_gi(Ctx& c) {
  Shape xs = c.ints("input_shape", 4);
  Shape y = conv2d_shape(c, xs, c.shape(1), conv_geom(c, true, true));
  c.require(y == c.shape(0), "dy " + shape_str(c.shape(0)) + " does not match the conv output " + shape_str(y));
  c.n.shape = xs;
  c.n.dtype = c.dtype(0);
}

void rule_conv2d_gw(Ctx& c) {
  Shape ws = c.ints("weight_shape", 4);
  Shape y = conv2d_shape(c, c.shape(0), ws, conv_geom(c, true, true));
  c.require(y == c.shape(1), "dy " + shape_str(c.shape(1)) + " does not match the conv output " + shape_str(y));
  c.n.shape = ws;
  c.n.dtype = c.dtype(0);
}

Shape pool_shape(Ctx& c, const Shape& x) {
  c.require(x.size() == 4, "input must be NCHW (rank 4), got " + shape_str(x));
  auto k = c.ints("kernel", 2);
  c.require(k[0] > 0 && k[1] > 0, "kernel must be positive");
  bool has_dil = c.n.op == Op::MaxPool2d || c.n.op == Op::MaxPool2dGrad;
  Conv2dGeom g = conv_geom(c, false, has_dil);
  c.require(g.pt * 2 <= k[0] && g.pb * 2 <= k[0] && g.pl * 2 <= k[1] && g.pr * 2 <= k[1],
            "padding must be at most half the kernel");
  return {x[0], x[1], conv_out(c, x[2], k[0], g.sh, g.pt, g.pb, g.dh, "height"),
          conv_out(c, x[3], k[1], g.sw, g.pl, g.pr, g.dw, "width")};
}

void rule_pool2d(Ctx& c) {
  c.require_float(0);
  c.n.shape = pool_shape(c, c.shape(0));
  c.n.dtype = c.dtype(0);
}

void rule_pool2d_g(Ctx& c) {
  Shape y = pool_shape(c, c.shape(0));
  c.require(y == c.shape(1), "dy " + shape_str(c.shape(1)) + " does not match the pool output " + shape_str(y));
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}

void rule_avgpool_g(Ctx& c) {
  Shape xs = c.ints("input_shape", 4);
  Shape y = pool_shape(c, xs);
  c.require(y == c.shape(0), "dy " + shape_str(c.shape(0)) + " does not match the pool output " + shape_str(y));
  c.n.shape = xs;
  c.n.dtype = c.dtype(0);
}

void rule_upsample(Ctx& c) {
  c.require_rank(0, 4, 4, "input");
  auto s = c.ints("scale", 2);
  c.require(s[0] > 0 && s[1] > 0, "scale must be positive");
  const Shape& x = c.shape(0);
  c.n.shape = {x[0], x[1], x[2] * s[0], x[3] * s[1]};
  c.n.dtype = c.dtype(0);
}

void rule_upsample_g(Ctx& c) {
  c.require_rank(0, 4, 4, "dy");
  auto s = c.ints("scale", 2);
  const Shape& x = c.shape(0);
  c.require(s[0] > 0 && s[1] > 0 && x[2] % s[0] == 0 && x[3] % s[1] == 0, "dy is not divisible by the scale");
  c.n.shape = {x[0], x[1], x[2] / s[0], x[3] / s[1]};
  c.n.dtype = c.dtype(0);
}

void check_attention(Ctx& c, size_t mask_index) {
  for (size_t i = 0; i < 3; ++i) {
    c.require_float(i);
    c.require_rank(i, 4, 4, i == 0 ? "q" : i == 1 ? "k" : "v");
  }
  c.require_same_dtype(0, 1);
  c.require_same_dtype(0, 2);
  const Shape &q = c.shape(0), &k = c.shape(1), &v = c.shape(2);
  c.require(q[0] == k[0] && k[0] == v[0], "q, k, v batch sizes differ");
  c.require(k[1] == v[1], "k and v head counts differ");
  c.require(q[1] % k[1] == 0, "query heads " + std::to_string(q[1]) + " are not a multiple of kv heads " +
                                  std::to_string(k[1]));
  c.require(q[3] == k[3], "q and k head dims differ: " + shape_str(q) + " vs " + shape_str(k));
  c.require(k[2] == v[2], "k and v sequence lengths differ");
  if (c.n.inputs.size() > mask_index) {
    c.require_float(mask_index);
    Shape full = {q[0], q[1], q[2], k[2]};
    c.require(c.shape(mask_index).size() <= 4 &&
                  broadcast_shapes(c.shape(mask_index), full, c.who() + " mask") == full,
              "mask " + shape_str(c.shape(mask_index)) + " does not broadcast to " + shape_str(full));
  }
}

void rule_attention(Ctx& c) {
  check_attention(c, 3);
  const Shape &q = c.shape(0), &v = c.shape(2);
  c.n.shape = {q[0], q[1], q[2], v[3]};
  c.n.dtype = c.dtype(0);
}

void rule_attn_lse(Ctx& c) {
  check_attention(c, 3);
  const Shape& q = c.shape(0);
  c.n.shape = {q[0], q[1], q[2]};
  c.n.dtype = DType::F32;
}

void check_attention_grad(Ctx& c) {
  check_attention(c, 6);
  const Shape &q = c.shape(0), &v = c.shape(2);
  Shape o = {q[0], q[1], q[2], v[3]};
  c.require(c.shape(3) == o && c.shape(4) == o, "o and do must have shape " + shape_str(o));
  c.require(c.shape(5) == Shape({q[0], q[1], q[2]}), "lse must have shape [B, Hq, Sq]");
}

void rule_attn_gq(Ctx& c) {
  check_attention_grad(c);
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}
void rule_attn_gk(Ctx& c) {
  check_attention_grad(c);
  c.n.shape = c.shape(1);
  c.n.dtype = c.dtype(0);
}
void rule_attn_gv(Ctx& c) {
  check_attention_grad(c);
  c.n.shape = c.shape(2);
  c.n.dtype = c.dtype(0);
}

void rule_rope(Ctx& c) {
  for (size_t i = 0; i < 3; ++i) c.require_float(i);
  c.require_rank(0, 2, kMaxRank, "x");
  const Shape& x = c.shape(0);
  c.require(x.back() % 2 == 0, "head dim " + std::to_string(x.back()) + " must be even");
  c.require(c.shape(1) == c.shape(2), "cos and sin must have the same shape");
  Shape half = x;
  half.back() /= 2;
  c.require(c.shape(1).size() <= x.size() && c.shape(1).size() >= 2 &&
                broadcast_shapes(c.shape(1), half, c.who()) == half,
            "cos/sin " + shape_str(c.shape(1)) + " must broadcast to " + shape_str(half));
  c.n.shape = x;
  c.n.dtype = c.dtype(0);
}

void rule_reshape(Ctx& c) {
  std::vector<int64_t> s = c.n.attrs.ints("shape");
  c.require(s.size() <= size_t(kMaxRank), "target rank exceeds " + std::to_string(kMaxRank));
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      c.require(infer < 0, "at most one -1 is allowed in " + shape_str(s));
      infer = int(i);
    } else {
      c.require(s[i] > 0, "target shape " + shape_str(s) + " has a non-positive dimension");
      c.require(!__builtin_mul_overflow(known, s[i], &known),
                "target shape " + shape_str(s) + " has more elements than a 64-bit count holds");
    }
  }
  int64_t total = numel(c.shape(0));
  if (infer >= 0) {
    c.require(known > 0 && total % known == 0, "cannot infer -1 in " + shape_str(s) + " for " +
                                                   std::to_string(total) + " elements");
    s[size_t(infer)] = total / known;
  }
  c.require(numel(s) == total, "cannot reshape " + shape_str(c.shape(0)) + " (" + std::to_string(total) +
                                   " elements) to " + shape_str(s));
  c.n.attrs.set("shape", s);
  c.n.shape = s;
  c.n.dtype = c.dtype(0);
}

void rule_permute(Ctx& c) {
  auto p = c.n.attrs.ints("perm");
  const Shape& x = c.shape(0);
  c.require(p.size() == x.size(), "perm " + shape_str(p) + " must list " + std::to_string(x.size()) + " axes");
  std::vector<bool> seen(x.size(), false);
  Shape out;
  for (int64_t a : p) {
    int na = normalize_axis(a, int(x.size()), c.who());
    c.require(!seen[size_t(na)], "perm " + shape_str(p) + " is not a permutation");
    seen[size_t(na)] = true;
    out.push_back(x[size_t(na)]);
  }
  c.n.shape = out;
  c.n.dtype = c.dtype(0);
}

Shape slice_shape(Ctx& c, const Shape& x) {
  size_t r = x.size();
  auto st = c.ints("starts", r), en = c.ints("ends", r), sp = c.ints("steps", r);
  Shape out;
  for (size_t i = 0; i < r; ++i) {
    c.require(sp[i] > 0, "steps must be positive (axis " + std::to_string(i) + ")");
    c.require(st[i] >= 0 && st[i] < en[i] && en[i] <= x[i],
              "axis " + std::to_string(i) + ": slice [" + std::to_string(st[i]) + ", " + std::to_string(en[i]) +
                  ") is empty or outside [0, " + std::to_string(x[i]) + ")");
    out.push_back((en[i] - st[i] + sp[i] - 1) / sp[i]);
  }
  return out;
}

void rule_slice(Ctx& c) {
  c.n.shape = slice_shape(c, c.shape(0));
  c.n.dtype = c.dtype(0);
}

void rule_slice_g(Ctx& c) {
  Shape xs = c.n.attrs.ints("input_shape");
  Shape y = slice_shape(c, xs);
  c.require(y == c.shape(0), "dy " + shape_str(c.shape(0)) + " does not match the slice " + shape_str(y));
  c.n.shape = xs;
  c.n.dtype = c.dtype(0);
}

void rule_concat(Ctx& c) {
  const Shape& first = c.shape(0);
  c.require(!first.empty(), "cannot concatenate scalars");
  int axis = normalize_axis(c.n.attrs.i("axis"), int(first.size()), c.who());
  c.n.attrs.set("axis", int64_t(axis));
  Shape out = first;
  out[size_t(axis)] = 0;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    c.require_same_dtype(0, i);
    const Shape& s = c.shape(i);
    c.require(s.size() == first.size(), "input " + std::to_string(i) + " has rank " + std::to_string(s.size()) +
                                            ", expected " + std::to_string(first.size()));
    for (size_t d = 0; d < s.size(); ++d)
      if (int(d) != axis)
        c.require(s[d] == first[d], "input " + std::to_string(i) + " " + shape_str(s) + " differs from " +
                                        shape_str(first) + " outside axis " + std::to_string(axis));
    out[size_t(axis)] += s[size_t(axis)];
  }
  c.n.shape = out;
  c.n.dtype = c.dtype(0);
}

void rule_pad(Ctx& c) {
  const Shape& x = c.shape(0);
  auto p = c.ints("pads", 2 * x.size());
  Shape out = x;
  for (size_t i = 0; i < x.size(); ++i) {
    c.require(p[i] >= 0 && p[i + x.size()] >= 0, "pads must be non-negative");
    out[i] += p[i] + p[i + x.size()];
  }
  c.n.shape = out;
  c.n.dtype = c.dtype(0);
}

void rule_expand(Ctx& c) {
  Shape t = c.n.attrs.ints("shape");
  c.require(t.size() <= size_t(kMaxRank), "target rank exceeds " + std::to_string(kMaxRank));
  c.require(t.size() >= c.shape(0).size() && broadcast_shapes(c.shape(0), t, c.who()) == t,
            "cannot expand " + shape_str(c.shape(0)) + " to " + shape_str(t));
  c.n.shape = t;
  c.n.dtype = c.dtype(0);
}

Shape gather_shape(Ctx& c, const Shape& table, const Shape& idx, int axis) {
  Shape out(table.begin(), table.begin() + axis);
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), table.begin() + axis + 1, table.end());
  c.require(out.size() <= size_t(kMaxRank), "result rank exceeds " + std::to_string(kMaxRank));
  return out;
}

void rule_gather(Ctx& c) {
  c.require(c.dtype(1) == DType::I32, std::string("indices must be i32, got ") + dtype_name(c.dtype(1)));
  c.require(!c.shape(0).empty(), "table must have rank >= 1");
  int axis = normalize_axis(c.n.attrs.i("axis"), int(c.shape(0).size()), c.who());
  c.n.attrs.set("axis", int64_t(axis));
  c.n.shape = gather_shape(c, c.shape(0), c.shape(1), axis);
  c.n.dtype = c.dtype(0);
}

void rule_gather_g(Ctx& c) {
  c.require(c.dtype(1) == DType::I32, "indices must be i32");
  c.require_float(0);
  Shape t = c.n.attrs.ints("table_shape");
  int axis = normalize_axis(c.n.attrs.i("axis"), int(t.size()), c.who());
  c.require(gather_shape(c, t, c.shape(1), axis) == c.shape(0), "dy does not match the gather output");
  c.n.shape = t;
  c.n.dtype = c.dtype(0);
}

// indices have data's rank and are no longer than data along every axis but `axis`.
int check_elements_index(Ctx& c, const Shape& data, const Shape& idx) {
  c.require(c.dtype(1) == DType::I32, std::string("indices must be i32, got ") + dtype_name(c.dtype(1)));
  c.require(!data.empty(), "data must have rank >= 1");
  c.require(idx.size() == data.size(), "indices " + shape_str(idx) + " must have the rank of data " + shape_str(data));
  int axis = normalize_axis(c.n.attrs.i("axis"), int(data.size()), c.who());
  c.n.attrs.set("axis", int64_t(axis));
  for (size_t d = 0; d < data.size(); ++d)
    c.require(int(d) == axis || idx[d] <= data[d], "indices " + shape_str(idx) + " exceed data " + shape_str(data) +
                                                       " along axis " + std::to_string(d));
  return axis;
}

void rule_gather_el(Ctx& c) {
  check_elements_index(c, c.shape(0), c.shape(1));
  c.n.shape = c.shape(1);
  c.n.dtype = c.dtype(0);
}

void rule_scatter_el(Ctx& c) {
  check_elements_index(c, c.shape(0), c.shape(1));
  c.require(c.shape(2) == c.shape(1), "updates " + shape_str(c.shape(2)) + " must have the shape of indices " +
                                          shape_str(c.shape(1)));
  c.require_same_dtype(0, 2);
  const std::string& r = c.n.attrs.s("reduction");
  c.require(r == "none" || r == "add" || r == "mul" || r == "max" || r == "min",
            "reduction must be none, add, mul, max or min, got '" + r + "'");
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}

void rule_one_hot(Ctx& c) {
  c.require(c.dtype(0) == DType::I32, "indices must be i32");
  int64_t d = c.n.attrs.i("depth");
  c.require(d > 0, "depth must be positive");
  c.n.shape = c.shape(0);
  c.n.shape.push_back(d);
  c.require(c.n.shape.size() <= size_t(kMaxRank), "result rank exceeds " + std::to_string(kMaxRank));
  c.n.dtype = DType::F32;
}

void check_xent(Ctx& c) {
  c.require_float(0);
  c.require(c.dtype(1) == DType::I32, std::string("labels must be i32 class indices, got ") +
                                          dtype_name(c.dtype(1)));
  const Shape& l = c.shape(0);
  c.require(!l.empty(), "logits must have rank >= 1 (classes last)");
  Shape want(l.begin(), l.end() - 1);
  c.require(c.shape(1) == want, "labels " + shape_str(c.shape(1)) + " must have shape " + shape_str(want) +
                                    " (logits " + shape_str(l) + " without the class axis)");
  double ls = c.n.attrs.f("label_smoothing");
  c.require(ls >= 0 && ls <= 1, "label_smoothing must be in [0, 1]");
}

void rule_xent(Ctx& c) {
  check_xent(c);
  c.n.shape = {};
  c.n.dtype = DType::F32;
}

void rule_xent_g(Ctx& c) {
  check_xent(c);
  c.require(c.shape(2).empty(), "dloss must be a scalar");
  c.n.shape = c.shape(0);
  c.n.dtype = c.dtype(0);
}

void rule_assign(Ctx& c) {
  const Node& t = c.in(0);
  c.require(t.op == Op::Parameter, "target must be a parameter/state tensor, got " + c.g.describe(t.id));
  c.require(t.shape == c.shape(1) && t.dtype == c.dtype(1),
            "value " + shape_str(c.shape(1)) + " " + dtype_name(c.dtype(1)) + " does not match target '" +
                t.name + "' " + shape_str(t.shape) + " " + dtype_name(t.dtype));
  c.n.shape = t.shape;
  c.n.dtype = t.dtype;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& what) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      throw Error(what + ": shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(int64_t axis, int rank, const std::string& what) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw Error(what + ": axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return int(a);
}

void infer_node(const Graph& g, Node& n) {
  const OpInfo& info = op_info(n.op);
  int nin = int(n.inputs.size());
  Ctx c{g, n};
  if (nin < info.min_inputs || (info.max_inputs >= 0 && nin > info.max_inputs))
    c.fail("takes " + std::to_string(info.min_inputs) +
           (info.max_inputs == info.min_inputs ? ""
            : info.max_inputs < 0               ? " or more"
                                                : ".." + std::to_string(info.max_inputs)) +
           " inputs, got " + std::to_string(nin));
  // Attribute presence and kinds, as declared in the op table.
  std::string spec = info.attrs;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(' ', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    bool optional = item.back() == '?';
    if (optional) item.pop_back();
    std::string name = item.substr(0, item.find(':')), kind = item.substr(item.find(':') + 1);
    if (!n.attrs.has(name)) {
      if (optional) continue;
      c.fail("missing attribute '" + name + "' (" + kind + ")");
    }
    try {
      if (kind == "int") (void)n.attrs.i(name);
      else if (kind == "float") (void)n.attrs.f(name);
      else if (kind == "ints") (void)n.attrs.ints(name);
      else (void)n.attrs.s(name);
    } catch (const Error& e) {
      c.fail(e.what());
    }
  }
  switch (n.op) {
#define X(E, name, mn, mx, arch, diff, rule, attrs) \
  case Op::E: rule_##rule(c); break;
#include "ir/ops.def"
#undef X
  }
  if (n.shape.size() > size_t(kMaxRank))
    c.fail("result rank " + std::to_string(n.shape.size()) + " exceeds " + std::to_string(kMaxRank));
}

}  // namespace mgn::ir
