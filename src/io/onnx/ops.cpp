// The ONNX op table: one lowering rule per op type. Shape-computing ops fold on the host when all their
// inputs are known at import time; everything else becomes builder calls (include/mgn/graph.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>

#include "io/onnx/onnx_internal.h"

namespace mgn::onnx_impl {

namespace pb = ::onnx;

namespace {

using Ins = std::vector<const Value*>;
using Outs = std::vector<Value>;

Value host_value(HostTensor h) {
  Value v;
  v.host = std::move(h);
  return v;
}
Value tensor_value(Tensor t) {
  Value v;
  v.t = t;
  return v;
}

const Value* opt_in(const Ins& in, size_t i) { return i < in.size() ? in[i] : nullptr; }
const Value& req_in(const pb::NodeProto& n, const Ins& in, size_t i) {
  if (i >= in.size() || !in[i])
    throw Error(node_label(n) + ": input " + std::to_string(i) + " is required");
  return *in[i];
}

// Foldable on the host: known at import time and not a parameter (parameters must reach the IR).
bool foldable(const Value* v) { return v && v->is_host() && !v->initializer; }
bool all_foldable(const Ins& in) {
  for (const Value* v : in)
    if (v && !foldable(v)) return false;
  return true;
}

const HostTensor& host_of(const pb::NodeProto& n, const Ins& in, size_t i, const char* what) {
  const Value& v = req_in(n, in, i);
  if (!v.is_host())
    throw Error(node_label(n) + ": input " + std::to_string(i) + " (" + what + ", '" + v.name +
                "') must be known at import time; it is computed from graph inputs");
  return *v.host;
}
std::vector<int64_t> ints_of(const HostTensor& h) {
  std::vector<int64_t> r;
  for (double d : h.v) r.push_back(to_i64(d));
  return r;
}
double scalar_of(const pb::NodeProto& n, const HostTensor& h, const char* what) {
  if (h.numel() != 1) throw Error(node_label(n) + ": " + what + " must hold one value, got " + shape_str(h.shape));
  return h.v[0];
}

int norm_axis(const pb::NodeProto& n, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank || rank == 0)
    throw Error(node_label(n) + ": axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return int(axis < 0 ? axis + rank : axis);
}

Shape broadcast(const pb::NodeProto& n, const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      throw Error(node_label(n) + ": shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat index into `s` (right-aligned, size-1 axes broadcast) of the out-shape multi-index `idx`.
int64_t bcast_index(const Shape& s, const Shape& out, const std::vector<int64_t>& idx) {
  int64_t flat = 0, stride = 1;
  for (int i = int(s.size()) - 1; i >= 0; --i) {
    size_t o = size_t(i) + out.size() - s.size();
    if (s[size_t(i)] != 1) flat += idx[o] * stride;
    stride *= s[size_t(i)];
  }
  return flat;
}

// Visits every multi-index of `shape` in row-major order.
template <typename F>
void for_each_index(const Shape& shape, F&& f) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < total; ++k) {
    f(idx, k);
    for (int i = int(shape.size()) - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < shape[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
}

HostTensor host_broadcast_n(const pb::NodeProto& n, const std::vector<const HostTensor*>& xs, Kind kind,
                            const std::function<double(const std::vector<double>&)>& f) {
  Shape out = xs[0]->shape;
  for (size_t i = 1; i < xs.size(); ++i) out = broadcast(n, out, xs[i]->shape);
  HostTensor r;
  r.kind = kind;
  r.shape = out;
  r.v.resize(size_t(checked_numel(out, node_label(n))));
  std::vector<double> args(xs.size());
  for_each_index(out, [&](const std::vector<int64_t>& idx, int64_t k) {
    for (size_t i = 0; i < xs.size(); ++i) args[i] = xs[i]->v[size_t(bcast_index(xs[i]->shape, out, idx))];
    r.v[size_t(k)] = f(args);
  });
  return r;
}

// The dtype two operands should share: that of a non-host operand, else from the host kinds.
std::optional<DType> common_dtype(const std::vector<const Value*>& vs) {
  for (const Value* v : vs)
    if (v && !v->is_host()) return v->t.dtype();
  for (const Value* v : vs)
    if (v && v->initializer) return DType::F32;
  return std::nullopt;
}

Kind arith_kind(const HostTensor& a, const HostTensor& b) {
  return a.kind == Kind::F || b.kind == Kind::F ? Kind::F : Kind::I;
}

Rule binary(Tensor (*fn)(Tensor, Tensor), double (*host)(double, double, bool), bool compare) {
  return [fn, host, compare](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    const Value& a = req_in(n, in, 0);
    const Value& b = req_in(n, in, 1);
    if (host && foldable(&a) && foldable(&b)) {
      Kind k = compare ? Kind::B : arith_kind(*a.host, *b.host);
      bool integer = k == Kind::I || (compare && arith_kind(*a.host, *b.host) == Kind::I);
      return {host_value(host_broadcast_n(n, {&*a.host, &*b.host}, k,
                                          [&](const std::vector<double>& x) { return host(x[0], x[1], integer); }))};
    }
    auto dt = common_dtype({&a, &b});
    Tensor ta = L.tensor(a, dt), tb = L.tensor(b, dt);
    if (L.opset < 7 && attr_i(n, "broadcast", 0) && find_attr(n, "axis")) {
      // Opset 1-6 aligns B's axes with A's from `axis`, not from the right.
      int64_t axis = attr_i(n, "axis", 0), ra = ta.rank(), rb = tb.rank();
      if (axis < 0) axis += ra;
      if (axis < 0 || axis + rb > ra) throw Error(node_label(n) + ": broadcast axis out of range");
      Shape s(size_t(axis), 1);
      s.insert(s.end(), tb.shape().begin(), tb.shape().end());
      s.resize(size_t(ra), 1);
      tb = reshape(tb, s);
    }
    return {tensor_value(fn(ta, tb))};
  };
}

Rule unary(Tensor (*fn)(Tensor), double (*host)(double)) {
  return [fn, host](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    const Value& x = req_in(n, in, 0);
    if (host && foldable(&x)) {
      HostTensor r = *x.host;
      for (double& d : r.v) d = host(d);
      return {host_value(std::move(r))};
    }
    return {tensor_value(fn(L.tensor(x)))};
  };
}

HostTensor host_reshape(HostTensor h, const Shape& s) {
  h.shape = s;
  return h;
}

// Reshape's target: 0 copies the input axis (unless allowzero), one -1 is inferred.
Shape reshape_target(const pb::NodeProto& n, const Shape& in, const std::vector<int64_t>& spec, bool allowzero) {
  Shape out;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t d = spec[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size()) throw Error(node_label(n) + ": shape entry 0 at axis " + std::to_string(i) + " has no input axis");
      d = in[i];
    }
    if (d == -1) {
      if (infer >= 0) throw Error(node_label(n) + ": more than one -1 in the target shape");
      infer = int(i);
      out.push_back(1);
      continue;
    }
    if (d < 0) throw Error(node_label(n) + ": invalid target dimension " + std::to_string(d));
    out.push_back(d);
    if (__builtin_mul_overflow(known, d, &known))
      throw Error(node_label(n) + ": target shape has more elements than a 64-bit count holds");
  }
  int64_t total = checked_numel(in, node_label(n));
  if (infer >= 0) {
    if (known == 0 || total % known) throw Error(node_label(n) + ": cannot infer -1 reshaping " + shape_str(in));
    out[size_t(infer)] = total / known;
  }
  if (checked_numel(out, node_label(n)) != total)
    throw Error(node_label(n) + ": cannot reshape " + shape_str(in) + " to " + shape_str(out));
  return out;
}

Value reshape_value(Lowering& L, const Value& x, const Shape& s) {
  if (foldable(&x)) return host_value(host_reshape(*x.host, s));
  if (x.shape() == s) return x;
  return tensor_value(reshape(L.tensor(x), s));
}

// Normalized (start, count, step) of an ONNX slice of one axis of size d (clamping like the spec).
struct AxisSlice {
  int64_t start, count, step;
};
AxisSlice slice_axis(const pb::NodeProto& n, int64_t d, int64_t start, int64_t end, int64_t step) {
  if (step == 0) throw Error(node_label(n) + ": slice step must not be 0");
  auto clampi = [](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); };
  if (start < 0) start = start <= std::numeric_limits<int64_t>::min() + d ? -1 - d : start + d;
  if (end < 0) end = end <= std::numeric_limits<int64_t>::min() + d ? -1 - d : end + d;
  int64_t count;
  if (step > 0) {
    start = clampi(start, 0, d);
    end = clampi(end, 0, d);
    count = end > start ? (end - start + step - 1) / step : 0;
  } else {
    start = clampi(start, 0, d - 1);
    end = clampi(end, -1, d - 1);
    count = start > end ? (start - end + (-step) - 1) / (-step) : 0;
  }
  if (count <= 0) throw Error(node_label(n) + ": the slice is empty (empty tensors are not supported)");
  return {start, count, step};
}

// Host gather of `idx` positions along `axis`.
HostTensor host_take(const HostTensor& x, int axis, const std::vector<int64_t>& idx, const Shape& idx_shape) {
  Shape out(x.shape.begin(), x.shape.begin() + axis);
  out.insert(out.end(), idx_shape.begin(), idx_shape.end());
  out.insert(out.end(), x.shape.begin() + axis + 1, x.shape.end());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
  int64_t d = x.shape[size_t(axis)];
  HostTensor r;
  r.kind = x.kind;
  r.shape = out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j : idx)
      for (int64_t k = 0; k < inner; ++k) r.v.push_back(x.v[size_t((o * d + j) * inner + k)]);
  return r;
}

Outs op_reshape(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  Shape s = reshape_target(n, x.shape(), ints_of(host_of(n, in, 1, "shape")), attr_i(n, "allowzero", 0) != 0);
  return {reshape_value(L, x, s)};
}

Outs op_flatten(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int64_t r = int64_t(x.shape().size());
  int64_t axis = attr_i(n, "axis", 1);
  if (axis < -r || axis > r) throw Error(node_label(n) + ": axis " + std::to_string(axis) + " out of range");
  if (axis < 0) axis += r;
  // Checked: a graph input may declare dimensions whose product passes 2^63 (found by onnx_fuzz).
  const Shape& xs = x.shape();
  const int64_t a = checked_numel(Shape(xs.begin(), xs.begin() + axis), node_label(n)),
                b = checked_numel(Shape(xs.begin() + axis, xs.end()), node_label(n));
  return {reshape_value(L, x, {a, b})};
}

std::vector<int64_t> axes_arg(const pb::NodeProto& n, const Ins& in, size_t input) {
  if (opt_in(in, input)) return ints_of(host_of(n, in, input, "axes"));
  return attr_ints(n, "axes");
}

Outs op_unsqueeze(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  std::vector<int64_t> axes = axes_arg(n, in, 1);
  int64_t r = int64_t(x.shape().size() + axes.size());
  std::vector<bool> is_new(size_t(r), false);
  for (int64_t a : axes) {
    int na = norm_axis(n, a, r);
    if (is_new[size_t(na)]) throw Error(node_label(n) + ": axis " + std::to_string(a) + " repeated");
    is_new[size_t(na)] = true;
  }
  Shape s;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) s.push_back(is_new[size_t(i)] ? 1 : x.shape()[k++]);
  return {reshape_value(L, x, s)};
}

Outs op_squeeze(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  const Shape xs = x.shape();
  std::vector<bool> drop(xs.size(), false);
  if (opt_in(in, 1) || find_attr(n, "axes")) {
    for (int64_t a : axes_arg(n, in, 1)) {
      int na = norm_axis(n, a, int64_t(xs.size()));
      if (xs[size_t(na)] != 1)
        throw Error(node_label(n) + ": axis " + std::to_string(a) + " has size " + std::to_string(xs[size_t(na)]));
      drop[size_t(na)] = true;
    }
  } else {
    for (size_t i = 0; i < xs.size(); ++i) drop[i] = xs[i] == 1;
  }
  Shape s;
  for (size_t i = 0; i < xs.size(); ++i)
    if (!drop[i]) s.push_back(xs[i]);
  return {reshape_value(L, x, s)};
}

Outs op_concat(Lowering& L, const pb::NodeProto& n, Ins& in) {
  if (in.empty()) throw Error(node_label(n) + ": needs at least one input");
  for (size_t i = 0; i < in.size(); ++i) req_in(n, in, i);
  int64_t r = int64_t(in[0]->shape().size());
  int axis = norm_axis(n, attr_i(n, "axis", 0), r);
  if (all_foldable(in)) {
    // Host concat: rows of the outer product of leading axes.
    Shape out = in[0]->host->shape;
    out[size_t(axis)] = 0;
    Kind kind = in[0]->host->kind;
    for (const Value* v : in) {
      const Shape& s = v->host->shape;
      if (int64_t(s.size()) != r) throw Error(node_label(n) + ": inputs differ in rank");
      for (int64_t d = 0; d < r; ++d)
        if (d != axis && s[size_t(d)] != in[0]->host->shape[size_t(d)])
          throw Error(node_label(n) + ": input shapes " + shape_str(s) + " and " + shape_str(in[0]->host->shape) +
                      " differ outside the axis");
      out[size_t(axis)] += s[size_t(axis)];
      if (v->host->kind == Kind::F) kind = Kind::F;
    }
    int64_t outer = 1;
    for (int i = 0; i < axis; ++i) outer *= out[size_t(i)];
    HostTensor h;
    h.kind = kind;
    h.shape = out;
    for (int64_t o = 0; o < outer; ++o)
      for (const Value* v : in) {
        int64_t chunk = v->host->numel() / std::max<int64_t>(outer, 1);
        h.v.insert(h.v.end(), v->host->v.begin() + o * chunk, v->host->v.begin() + (o + 1) * chunk);
      }
    return {host_value(std::move(h))};
  }
  auto dt = common_dtype(in);
  std::vector<Tensor> ts;
  for (const Value* v : in) ts.push_back(L.tensor(*v, dt));
  return {tensor_value(concat(ts, axis))};
}

Outs op_split(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape().size()));
  int64_t d = x.shape()[size_t(axis)];
  std::vector<int64_t> sizes;
  if (opt_in(in, 1)) sizes = ints_of(host_of(n, in, 1, "split"));
  else if (find_attr(n, "split")) sizes = attr_ints(n, "split");
  else {
    int64_t parts = attr_i(n, "num_outputs", n.output_size());
    if (parts <= 0) throw Error(node_label(n) + ": needs at least one output");
    int64_t each = (d + parts - 1) / parts;
    for (int64_t p = 0, left = d; p < parts; ++p, left -= each) sizes.push_back(std::min(each, left));
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s <= 0) throw Error(node_label(n) + ": split sizes must be positive (empty tensors are not supported)");
    total += s;
  }
  if (total != d) throw Error(node_label(n) + ": split sizes sum to " + std::to_string(total) + ", axis has " + std::to_string(d));
  Outs outs;
  for (Tensor t : split(L.tensor(x), sizes, axis)) outs.push_back(tensor_value(t));
  return outs;
}

Outs op_slice(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  const Shape xs = x.shape();
  std::vector<int64_t> starts, ends, axes, steps;
  if (L.opset < 10) {  // starts, ends and axes were attributes
    starts = attr_ints(n, "starts");
    ends = attr_ints(n, "ends");
    axes = attr_ints(n, "axes");
  } else {
    starts = ints_of(host_of(n, in, 1, "starts"));
    ends = ints_of(host_of(n, in, 2, "ends"));
  }
  if (L.opset >= 10 && opt_in(in, 3)) axes = ints_of(host_of(n, in, 3, "axes"));
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (L.opset >= 10 && opt_in(in, 4)) steps = ints_of(host_of(n, in, 4, "steps"));
  else steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    throw Error(node_label(n) + ": starts, ends, axes and steps differ in length");
  Value cur = x;
  for (size_t i = 0; i < starts.size(); ++i) {
    int a = norm_axis(n, axes[i], int64_t(xs.size()));
    int64_t d = cur.shape()[size_t(a)];
    AxisSlice s = slice_axis(n, d, starts[i], ends[i], steps[i]);
    if (s.step == 1 && s.start == 0 && s.count == d) continue;
    std::vector<int64_t> idx;
    for (int64_t k = 0; k < s.count; ++k) idx.push_back(s.start + k * s.step);
    if (foldable(&cur)) {
      cur = host_value(host_take(*cur.host, a, idx, {s.count}));
    } else if (s.step > 0) {
      cur = tensor_value(slice(L.tensor(cur), a, s.start, s.start + (s.count - 1) * s.step + 1, s.step));
    } else {  // a reversed slice is a gather of the positions
      std::vector<int32_t> i32(idx.begin(), idx.end());
      cur = tensor_value(gather(L.tensor(cur), L.g.constant_i32({s.count}, i32), a));
    }
  }
  return {cur};
}

Outs op_gather(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  const Value& ix = req_in(n, in, 1);
  int axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape().size()));
  int64_t d = x.shape()[size_t(axis)];
  if (ix.is_host()) {
    std::vector<int64_t> idx = ints_of(*ix.host);
    for (int64_t& i : idx) {
      if (i < -d || i >= d) throw Error(node_label(n) + ": index " + std::to_string(i) + " out of range [" +
                                        std::to_string(-d) + ", " + std::to_string(d) + ")");
      if (i < 0) i += d;
    }
    if (foldable(&x)) return {host_value(host_take(*x.host, axis, idx, ix.host->shape))};
    std::vector<int32_t> i32(idx.begin(), idx.end());
    return {tensor_value(gather(L.tensor(x), L.g.constant_i32(ix.host->shape, i32), axis))};
  }
  // Runtime indices must be non-negative: the IR's gather does not wrap.
  return {tensor_value(gather(L.tensor(x), L.tensor(ix, DType::I32), axis))};
}

// GatherElements / ScatterElements: indices of any integer type become i32 (negative ones count from the end,
// as the IR's ops do).
Outs op_gather_elements(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape().size()));
  return {tensor_value(gather_elements(L.tensor(x), L.tensor(req_in(n, in, 1), DType::I32), axis))};
}

Outs op_scatter_elements(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape().size()));
  const std::string r = attr_s(n, "reduction", "none");
  const ScatterReduction red = r == "none"  ? ScatterReduction::None
                               : r == "add" ? ScatterReduction::Add
                               : r == "mul" ? ScatterReduction::Mul
                               : r == "max" ? ScatterReduction::Max
                               : r == "min" ? ScatterReduction::Min
                                            : throw Error(node_label(n) + ": unknown reduction '" + r + "'");
  return {tensor_value(scatter_elements(L.tensor(x), L.tensor(req_in(n, in, 1), DType::I32),
                                        L.tensor(req_in(n, in, 2)), axis, red))};
}

Outs op_expand(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  Shape target = broadcast(n, x.shape(), ints_of(host_of(n, in, 1, "shape")));
  if (target == x.shape()) return {x};
  if (foldable(&x)) {
    const HostTensor& h = *x.host;
    HostTensor r;
    r.kind = h.kind;
    r.shape = target;
    r.v.resize(size_t(checked_numel(target, node_label(n))));
    for_each_index(target, [&](const std::vector<int64_t>& idx, int64_t k) {
      r.v[size_t(k)] = h.v[size_t(bcast_index(h.shape, target, idx))];
    });
    return {host_value(std::move(r))};
  }
  Tensor t = L.tensor(x);
  if (t.rank() < int(target.size())) {
    Shape s(target.size() - size_t(t.rank()), 1);
    s.insert(s.end(), t.shape().begin(), t.shape().end());
    t = reshape(t, s);
  }
  return {tensor_value(expand(t, target))};
}

Outs op_where(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& c = req_in(n, in, 0);
  const Value& a = req_in(n, in, 1);
  const Value& b = req_in(n, in, 2);
  if (foldable(&c) && foldable(&a) && foldable(&b))
    return {host_value(host_broadcast_n(n, {&*c.host, &*a.host, &*b.host}, arith_kind(*a.host, *b.host),
                                        [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; }))};
  auto dt = common_dtype({&a, &b});
  return {tensor_value(where(L.tensor(c, DType::Bool), L.tensor(a, dt), L.tensor(b, dt)))};
}

// Boolean ops (Not, And, Or, Xor): folded on the host when every operand is known, else lowered through
// f32 comparisons (the IR has no logical ops; its bool tensors cast to 0/1).
Outs op_not(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  if (foldable(&x)) {
    HostTensor r = *x.host;
    r.kind = Kind::B;
    for (double& d : r.v) d = d == 0 ? 1.0 : 0.0;
    return {host_value(std::move(r))};
  }
  return {tensor_value(equal(cast(L.tensor(x, DType::Bool), DType::F32), L.g.scalar(0.0)))};
}

Rule logical(Tensor (*fn)(Graph&, Tensor, Tensor), double (*host)(double, double)) {
  return [fn, host](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    const Value& a = req_in(n, in, 0);
    const Value& b = req_in(n, in, 1);
    if (foldable(&a) && foldable(&b))
      return {host_value(host_broadcast_n(n, {&*a.host, &*b.host}, Kind::B,
                                          [&](const std::vector<double>& x) { return host(x[0], x[1]); }))};
    Tensor fa = cast(L.tensor(a, DType::Bool), DType::F32);
    Tensor fb = cast(L.tensor(b, DType::Bool), DType::F32);
    return {tensor_value(fn(L.g, fa, fb))};
  };
}
Tensor lower_and(Graph& g, Tensor a, Tensor b) { return greater(mul(a, b), g.scalar(0.5)); }
Tensor lower_or(Graph& g, Tensor a, Tensor b) { return greater(add(a, b), g.scalar(0.5)); }
Tensor lower_xor(Graph&, Tensor a, Tensor b) { return not_equal(a, b); }
double h_and(double a, double b) { return a != 0 && b != 0; }
double h_or(double a, double b) { return a != 0 || b != 0; }
double h_xor(double a, double b) { return (a != 0) != (b != 0); }

Outs op_cast(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int64_t to = attr_i(n, "to", -1);
  Kind k;
  DType dt;
  switch (to) {
    case pb::TensorProto::FLOAT:
    case pb::TensorProto::DOUBLE: k = Kind::F, dt = DType::F32; break;
    case pb::TensorProto::FLOAT16: k = Kind::F, dt = DType::F16; break;
    case pb::TensorProto::BFLOAT16: k = Kind::F, dt = DType::BF16; break;
    case pb::TensorProto::BOOL: k = Kind::B, dt = DType::Bool; break;
    case pb::TensorProto::INT8:
    case pb::TensorProto::UINT8:
    case pb::TensorProto::INT16:
    case pb::TensorProto::UINT16:
    case pb::TensorProto::INT32:
    case pb::TensorProto::INT64:
    case pb::TensorProto::UINT32:
    case pb::TensorProto::UINT64: k = Kind::I, dt = DType::I32; break;
    default: throw Error(node_label(n) + ": unsupported target type " + std::to_string(to));
  }
  if (foldable(&x)) {
    HostTensor h = *x.host;
    for (double& d : h.v) d = k == Kind::B ? double(d != 0) : k == Kind::I ? std::trunc(d) : d;
    h.kind = k;
    return {host_value(std::move(h))};
  }
  Tensor t = L.tensor(x);
  return {tensor_value(t.dtype() == dt ? t : cast(t, dt))};
}

Outs op_constant(Lowering&, const pb::NodeProto& n, Ins&) {
  if (n.attribute_size() != 1) throw Error(node_label(n) + ": needs exactly one value attribute");
  const auto& a = n.attribute(0);
  HostTensor h;
  if (a.name() == "value" && a.type() == pb::AttributeProto::TENSOR) return {host_value(tensor_from_proto(a.t(), "", node_label(n)))};
  if (a.name() == "value_float" && a.type() == pb::AttributeProto::FLOAT) h = {Kind::F, {}, {double(a.f())}};
  else if (a.name() == "value_int" && a.type() == pb::AttributeProto::INT) h = {Kind::I, {}, {double(a.i())}};
  else if (a.name() == "value_floats" && a.type() == pb::AttributeProto::FLOATS)
    h = {Kind::F, {int64_t(a.floats_size())}, {a.floats().begin(), a.floats().end()}};
  else if (a.name() == "value_ints" && a.type() == pb::AttributeProto::INTS) {
    h = {Kind::I, {int64_t(a.ints_size())}, {}};
    for (int64_t v : a.ints()) h.v.push_back(double(v));
  } else
    throw Error(node_label(n) + ": unsupported value attribute '" + a.name() + "'");
  if (h.numel() == 0) throw Error(node_label(n) + ": empty constants are not supported");
  return {host_value(std::move(h))};
}

Outs op_constant_of_shape(Lowering&, const pb::NodeProto& n, Ins& in) {
  Shape s = ints_of(host_of(n, in, 0, "shape"));
  HostTensor fill{Kind::F, {}, {0.0}};
  if (const auto* a = find_attr(n, "value")) {
    if (a->type() != pb::AttributeProto::TENSOR) throw Error(node_label(n) + ": 'value' must be a tensor");
    fill = tensor_from_proto(a->t(), "", node_label(n));
    if (fill.numel() != 1) throw Error(node_label(n) + ": 'value' must hold one element");
  }
  HostTensor h;
  h.kind = fill.kind;
  h.shape = s;
  h.v.assign(size_t(checked_numel(s, node_label(n))), fill.v[0]);
  return {host_value(std::move(h))};
}

Outs op_shape(Lowering&, const pb::NodeProto& n, Ins& in) {
  const Shape& s = req_in(n, in, 0).shape();
  int64_t r = int64_t(s.size());
  int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  HostTensor h{Kind::I, {std::max<int64_t>(end - start, 0)}, {}};
  for (int64_t i = start; i < end; ++i) h.v.push_back(double(s[size_t(i)]));
  return {host_value(std::move(h))};
}

Outs op_range(Lowering&, const pb::NodeProto& n, Ins& in) {
  const HostTensor& s = host_of(n, in, 0, "start");
  double start = scalar_of(n, s, "start"), limit = scalar_of(n, host_of(n, in, 1, "limit"), "limit"),
         delta = scalar_of(n, host_of(n, in, 2, "delta"), "delta");
  if (delta == 0 || !std::isfinite(delta) || !std::isfinite(start) || !std::isfinite(limit))
    throw Error(node_label(n) + ": delta must be finite and non-zero");
  double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (count > double(kMaxHostElements)) throw Error(node_label(n) + ": range of " + std::to_string(count) + " values is too large");
  HostTensor h{s.kind, {int64_t(count)}, {}};
  for (int64_t i = 0; i < int64_t(count); ++i) h.v.push_back(start + double(i) * delta);
  return {host_value(std::move(h))};
}

Outs op_identity(Lowering&, const pb::NodeProto& n, Ins& in) { return {req_in(n, in, 0)}; }

// Inference Dropout is the identity; its mask (second output) is all true.
Outs op_dropout(Lowering& L, const pb::NodeProto& n, Ins& in) {
  bool training = L.opset < 7 && attr_i(n, "is_test", 0) == 0;
  if (opt_in(in, 2)) training = scalar_of(n, host_of(n, in, 2, "training_mode"), "training_mode") != 0;
  if (training) {  // the ratio matters only in training, where only 0 (no dropping) is supported
    double ratio = L.opset < 12 ? attr_f(n, "ratio", 0.5) : 0.5;
    if (opt_in(in, 1)) ratio = scalar_of(n, host_of(n, in, 1, "ratio"), "ratio");
    if (ratio != 0) throw Error(node_label(n) + ": only inference (training_mode = false, or ratio 0) is supported");
  }
  const Value& x = req_in(n, in, 0);
  Outs outs = {x};
  if (n.output_size() > 1 && !n.output(1).empty()) {
    HostTensor m{Kind::B, x.shape(), std::vector<double>(size_t(checked_numel(x.shape(), node_label(n))), 1.0)};
    outs.push_back(host_value(std::move(m)));
  }
  return outs;
}

Outs op_pad(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  std::string mode = attr_s(n, "mode", "constant");
  if (mode != "constant" && mode != "edge" && mode != "reflect")
    throw Error(node_label(n) + ": mode '" + mode + "' is not supported (constant, edge, reflect)");
  std::vector<int64_t> pads;
  double value = 0;
  if (L.opset < 11) {  // pads and value were attributes
    pads = attr_ints(n, "pads");
    value = attr_f(n, "value", 0.0);
  } else {
    pads = ints_of(host_of(n, in, 1, "pads"));
    if (opt_in(in, 2)) value = scalar_of(n, host_of(n, in, 2, "constant_value"), "constant_value");
  }
  size_t r = x.shape().size();
  std::vector<int64_t> axes;
  if (opt_in(in, 3)) {
    for (int64_t a : ints_of(host_of(n, in, 3, "axes"))) axes.push_back(norm_axis(n, a, int64_t(r)));
  } else {
    for (size_t i = 0; i < r; ++i) axes.push_back(int64_t(i));
  }
  if (pads.size() != 2 * axes.size())
    throw Error(node_label(n) + ": pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * axes.size()));
  std::vector<int64_t> pairs(2 * r, 0);
  bool any = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t b = pads[i], e = pads[i + axes.size()];
    if (b < 0 || e < 0) throw Error(node_label(n) + ": negative pads are not supported");
    pairs[2 * size_t(axes[i])] = b;
    pairs[2 * size_t(axes[i]) + 1] = e;
    any = any || b || e;
  }
  if (!any) return {x};
  if (mode == "constant") return {tensor_value(pad(L.tensor(x), pairs, value))};
  // edge / reflect: a gather per padded axis of the positions each output reads.
  Tensor t = L.tensor(x);
  for (size_t a = 0; a < r; ++a) {
    int64_t b = pairs[2 * a], e = pairs[2 * a + 1], d = t.dim(int(a));
    if (!b && !e) continue;
    if (mode == "reflect" && (b >= d || e >= d))
      throw Error(node_label(n) + ": reflect pads must be smaller than the axis (" + std::to_string(d) + ")");
    std::vector<int32_t> idx;
    for (int64_t j = -b; j < d + e; ++j) {
      int64_t k = j;
      if (mode == "edge") k = std::clamp<int64_t>(j, 0, d - 1);
      else if (j < 0) k = -j;
      else if (j >= d) k = 2 * (d - 1) - j;
      idx.push_back(int32_t(k));
    }
    t = gather(t, L.g.constant_i32({int64_t(idx.size())}, idx), int64_t(a));
  }
  return {tensor_value(t)};
}

Outs op_clip(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.dtype() == DType::I32) {  // integer clip in f32 (exact below 2^24), back to i32
    Value xf = tensor_value(cast(x, DType::F32));
    Ins fin = in;
    fin[0] = &xf;
    return {tensor_value(cast(op_clip(L, n, fin)[0].t, DType::I32))};
  }
  if (L.opset < 11)  // min and max were attributes
    return {tensor_value(clamp(x, attr_f(n, "min", -std::numeric_limits<double>::infinity()),
                               attr_f(n, "max", std::numeric_limits<double>::infinity())))};
  const Value* lo = opt_in(in, 1);
  const Value* hi = opt_in(in, 2);
  if ((!lo || lo->is_host()) && (!hi || hi->is_host())) {
    double l = lo ? scalar_of(n, *lo->host, "min") : -std::numeric_limits<double>::infinity();
    double h = hi ? scalar_of(n, *hi->host, "max") : std::numeric_limits<double>::infinity();
    return {tensor_value(clamp(x, l, h))};
  }
  auto bound = [&](const Value& v) {
    Tensor t = L.tensor(v, x.dtype());
    return t.dtype() == x.dtype() ? t : cast(t, x.dtype());
  };
  if (lo) x = maximum(x, bound(*lo));
  if (hi) x = minimum(x, bound(*hi));
  return {tensor_value(x)};
}

Outs op_trilu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.rank() < 2) throw Error(node_label(n) + ": input must have rank >= 2, got " + shape_str(x.shape()));
  int64_t k = opt_in(in, 1) ? to_i64(scalar_of(n, host_of(n, in, 1, "k"), "k")) : 0;
  bool upper = attr_i(n, "upper", 1) != 0;
  int64_t rows = x.dim(-2), cols = x.dim(-1);
  std::vector<float> mask(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) mask[size_t(i * cols + j)] = (upper ? j - i >= k : j - i <= k) ? 1.0f : 0.0f;
  // where(), not a multiply: 0 * inf would turn masked infinities into NaN.
  return {tensor_value(where(L.g.constant({rows, cols}, mask, DType::Bool), x, L.g.full({}, 0, x.dtype())))};
}

Tensor pow_tensor(Graph& g, Tensor x, Tensor e);
Tensor floor_(Graph& g, Tensor x);
Tensor cast_f32(Tensor t) { return t.dtype() == DType::F32 ? t : cast(t, DType::F32); }

Outs op_pow(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  const Value& e = req_in(n, in, 1);
  if (foldable(&x) && foldable(&e))
    return {host_value(host_broadcast_n(n, {&*x.host, &*e.host}, x.host->kind,
                                        [](const std::vector<double>& v) { return std::pow(v[0], v[1]); }))};
  if (!e.is_host() || e.host->numel() != 1) {
    Tensor t = L.tensor(x);
    Tensor y = pow_tensor(L.g, cast_f32(t), cast_f32(L.tensor(e)));
    return {tensor_value(t.dtype() == DType::I32 ? cast(floor_(L.g, y + 0.5), DType::I32) : t.dtype() == DType::F32 ? y : cast(y, t.dtype()))};
  }
  double p = e.host->v[0];
  Tensor t = L.tensor(x);
  if (p == 1) return {tensor_value(t)};
  if (p == 2) return {tensor_value(square(t))};
  if (p == 0.5) return {tensor_value(sqrt(t))};
  return {tensor_value(pow(t, p))};
}

Rule minmax(Tensor (*fn)(Tensor, Tensor), bool is_max) {
  return [fn, is_max](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    if (in.empty()) throw Error(node_label(n) + ": needs at least one input");
    for (size_t i = 0; i < in.size(); ++i) req_in(n, in, i);
    if (all_foldable(in)) {
      std::vector<const HostTensor*> hs;
      Kind k = Kind::I;
      for (const Value* v : in) {
        hs.push_back(&*v->host);
        if (v->host->kind == Kind::F) k = Kind::F;
      }
      return {host_value(host_broadcast_n(n, hs, k, [is_max](const std::vector<double>& v) {
        return is_max ? *std::max_element(v.begin(), v.end()) : *std::min_element(v.begin(), v.end());
      }))};
    }
    auto dt = common_dtype(in);
    Tensor acc = L.tensor(*in[0], dt);
    for (size_t i = 1; i < in.size(); ++i) acc = fn(acc, L.tensor(*in[i], dt));
    return {tensor_value(acc)};
  };
}

Outs op_leaky_relu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  return {tensor_value(leaky_relu(L.tensor(req_in(n, in, 0)), attr_f(n, "alpha", 0.01)))};
}

Outs op_gelu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  std::string approx = attr_s(n, "approximate", "none");
  Tensor x = L.tensor(req_in(n, in, 0));
  if (approx == "none") return {tensor_value(gelu(x))};
  if (approx == "tanh") return {tensor_value(gelu_tanh(x))};
  throw Error(node_label(n) + ": approximate must be 'none' or 'tanh', got '" + approx + "'");
}

// Before opset 13, Softmax/LogSoftmax/Hardmax flatten the input to 2-D at `axis` (default 1) and normalize
// over the second dimension; from 13 they normalize one axis (default -1).
Rule softmax_rule(Tensor (*fn)(Tensor, int64_t)) {
  return [fn](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    Tensor x = L.tensor(req_in(n, in, 0));
    if (L.opset >= 13) return {tensor_value(fn(x, attr_i(n, "axis", -1)))};
    int axis = x.rank() == 0 ? 0 : norm_axis(n, attr_i(n, "axis", 1), x.rank());
    int64_t a = 1, b = 1;
    for (int i = 0; i < x.rank(); ++i) (i < axis ? a : b) *= x.dim(i);
    const Shape xs = x.shape();  // a copy: building nodes may move the graph's shapes
    return {tensor_value(reshape(fn(reshape(x, {a, b}), -1), xs))};
  };
}

Outs op_matmul(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor a = L.tensor(req_in(n, in, 0), DType::F32), b = L.tensor(req_in(n, in, 1), DType::F32);
  bool va = a.rank() == 1, vb = b.rank() == 1;  // numpy: vectors get a unit axis, removed afterwards
  if (va) a = unsqueeze(a, 0);
  if (vb) b = unsqueeze(b, 1);
  Tensor y = matmul(a, b);
  if (va) y = squeeze(y, -2);
  if (vb) y = squeeze(y, -1);
  return {tensor_value(y)};
}

Outs op_gemm(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor a = L.tensor(req_in(n, in, 0)), b = L.tensor(req_in(n, in, 1));
  if (a.rank() != 2 || b.rank() != 2) throw Error(node_label(n) + ": A and B must be matrices");
  double alpha = attr_f(n, "alpha", 1.0), beta = attr_f(n, "beta", 1.0);
  Tensor y = matmul(a, b, attr_i(n, "transA", 0) != 0, attr_i(n, "transB", 0) != 0);
  if (alpha != 1) y = y * alpha;
  if (const Value* c = opt_in(in, 2)) {
    Tensor ct = L.tensor(*c);
    y = y + (beta == 1 ? ct : ct * beta);
  }
  return {tensor_value(y)};
}

// Explicit [begin..., end...] pads for 2-D windows, resolving auto_pad.
std::vector<int64_t> window_pads(const pb::NodeProto& n, const Shape& in_hw, const std::vector<int64_t>& k,
                                 const std::vector<int64_t>& stride, const std::vector<int64_t>& dil) {
  std::string ap = attr_s(n, "auto_pad", "NOTSET");
  size_t r = in_hw.size();
  // Every window parameter in range before any arithmetic on it (a zero stride divided by zero: onnx_fuzz).
  if (k.size() != r || stride.size() != r || dil.size() != r)
    throw Error(node_label(n) + ": kernel_shape, strides and dilations need " + std::to_string(r) + " values each");
  for (size_t i = 0; i < r; ++i)
    for (int64_t v : {k[i], stride[i], dil[i]})
      if (v < 1 || v > (int64_t(1) << 20))
        throw Error(node_label(n) + ": kernel_shape, strides and dilations must be from 1 to 2^20, got " +
                    std::to_string(v));
  if (ap == "NOTSET") {
    std::vector<int64_t> p = attr_ints(n, "pads", std::vector<int64_t>(2 * r, 0));
    if (p.size() != 2 * r) throw Error(node_label(n) + ": pads must have " + std::to_string(2 * r) + " values");
    for (int64_t v : p)
      if (v < 0 || v > (int64_t(1) << 30)) throw Error(node_label(n) + ": pads must be from 0 to 2^30");
    return p;
  }
  if (ap == "VALID") return std::vector<int64_t>(2 * r, 0);
  if (ap != "SAME_UPPER" && ap != "SAME_LOWER") throw Error(node_label(n) + ": unknown auto_pad '" + ap + "'");
  std::vector<int64_t> p(2 * r);
  for (size_t i = 0; i < r; ++i) {
    int64_t out = (in_hw[i] + stride[i] - 1) / stride[i];
    int64_t total = std::max<int64_t>((out - 1) * stride[i] + (k[i] - 1) * dil[i] + 1 - in_hw[i], 0);
    int64_t small = total / 2;
    p[i] = ap == "SAME_UPPER" ? small : total - small;
    p[i + r] = total - p[i];
  }
  return p;
}

// 3-D convolution and pooling over [N, C, D, H, W] as 2-D ones: for each kernel depth tap kd, the input
// depths od·stride + kd·dilation are gathered and folded into the batch (conv) or channels (pooling), then
// the taps are summed (conv, average) or maxed.
struct Depth3d {
  std::vector<int64_t> k, stride, dil, p;  // p: ONNX [d0, h0, w0, d1, h1, w1]
  int64_t Do = 0;
};
Depth3d depth_taps(const pb::NodeProto& n, const Shape& dhw, std::vector<int64_t> k) {
  Depth3d t;
  t.k = k;
  t.stride = attr_ints(n, "strides", {1, 1, 1});
  t.dil = attr_ints(n, "dilations", {1, 1, 1});
  if (t.stride.size() != 3 || t.dil.size() != 3 || k.size() != 3)
    throw Error(node_label(n) + ": kernel_shape/strides/dilations must have 3 values");
  if (attr_i(n, "ceil_mode", 0)) throw Error(node_label(n) + ": ceil_mode = 1 is not supported in 3-D");
  t.p = window_pads(n, dhw, k, t.stride, t.dil);
  int64_t span = dhw[0] + t.p[0] + t.p[3] - t.dil[0] * (k[0] - 1) - 1;
  if (span < 0) throw Error(node_label(n) + ": the window is deeper than the padded input");
  t.Do = span / t.stride[0] + 1;
  return t;
}
Tensor depth_tap(Lowering& L, Tensor x, const Depth3d& t, int64_t kd) {
  std::vector<int32_t> idx;
  for (int64_t o = 0; o < t.Do; ++o) idx.push_back(int32_t(o * t.stride[0] + kd * t.dil[0]));
  return gather(x, L.g.constant_i32({t.Do}, idx), 2);  // [N, C, Do, H, W]
}

Tensor conv3d(Lowering& L, const pb::NodeProto& n, Tensor x, Tensor w, std::optional<Tensor> bias) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(3), W = x.dim(4), M = w.dim(0);
  Depth3d t = depth_taps(n, {x.dim(2), H, W}, {w.dim(2), w.dim(3), w.dim(4)});
  if (attr_ints(n, "kernel_shape", t.k) != t.k) throw Error(node_label(n) + ": kernel_shape disagrees with the weight");
  if (t.p[0] || t.p[3]) x = pad(x, {0, 0, 0, 0, t.p[0], t.p[3], 0, 0, 0, 0}, 0.0);
  Conv2dOptions o{.stride = {t.stride[1], t.stride[2]}, .padding = {t.p[1], t.p[2], t.p[4], t.p[5]},
                  .dilation = {t.dil[1], t.dil[2]}, .groups = attr_i(n, "group", 1)};
  Tensor acc;
  for (int64_t kd = 0; kd < t.k[0]; ++kd) {
    Tensor xs = reshape(permute(depth_tap(L, x, t, kd), {0, 2, 1, 3, 4}), {N * t.Do, C, H, W});
    Tensor wk = reshape(slice(w, 2, kd, kd + 1), {M, w.dim(1), t.k[1], t.k[2]});
    Tensor y = conv2d(xs, wk, o);
    acc = kd == 0 ? y : acc + y;
  }
  Tensor y = permute(reshape(acc, {N, t.Do, M, acc.dim(2), acc.dim(3)}), {0, 2, 1, 3, 4});
  if (bias) y = y + reshape(*bias, {M, 1, 1, 1});
  return y;
}

Tensor pool3d(Lowering& L, const pb::NodeProto& n, Tensor x, bool is_max) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(3), W = x.dim(4);
  Depth3d t = depth_taps(n, {x.dim(2), H, W}, attr_ints(n, "kernel_shape"));
  const bool include_pad = attr_i(n, "count_include_pad", 0) != 0;
  if (!is_max && (t.p[0] || t.p[3]) && !include_pad)
    throw Error(node_label(n) + ": 3-D average pooling with depth padding not counted is not supported");
  if (!is_max && (t.dil[0] != 1 || t.dil[1] != 1 || t.dil[2] != 1))
    throw Error(node_label(n) + ": dilated average pooling is not supported");
  for (int i = 1; i < 3; ++i)
    if (2 * std::max(t.p[size_t(i)], t.p[size_t(i) + 3]) > t.k[size_t(i)])
      throw Error(node_label(n) + ": 3-D pooling pads larger than half the window are not supported");
  if (t.p[0] || t.p[3]) x = pad(x, {0, 0, 0, 0, t.p[0], t.p[3], 0, 0, 0, 0}, is_max ? -INFINITY : 0.0);
  Pool2dOptions o{.kernel = {t.k[1], t.k[2]}, .stride = {t.stride[1], t.stride[2]},
                  .padding = {t.p[1], t.p[2], t.p[4], t.p[5]}, .dilation = {t.dil[1], t.dil[2]},
                  .count_include_pad = include_pad};
  Tensor acc;
  for (int64_t kd = 0; kd < t.k[0]; ++kd) {
    Tensor xs = reshape(depth_tap(L, x, t, kd), {N, C * t.Do, H, W});
    Tensor y = is_max ? max_pool2d(xs, o) : avg_pool2d(xs, o);
    acc = kd == 0 ? y : is_max ? maximum(acc, y) : acc + y;
  }
  if (!is_max) acc = acc / double(t.k[0]);
  return reshape(acc, {N, C, t.Do, acc.dim(2), acc.dim(3)});
}

Outs op_conv(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0)), w = L.tensor(req_in(n, in, 1));
  std::optional<Tensor> bias;
  if (const Value* b = opt_in(in, 2)) bias = L.tensor(*b);
  if (x.rank() == 5 && w.rank() == 5) return {tensor_value(conv3d(L, n, x, w, bias))};
  bool is1d = x.rank() == 3;
  if (!is1d && x.rank() != 4) throw Error(node_label(n) + ": only 1-D, 2-D and 3-D convolutions are supported");
  if (w.rank() != x.rank()) throw Error(node_label(n) + ": weight rank differs from input rank");
  size_t r = size_t(x.rank()) - 2;
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  std::vector<int64_t> ks = attr_ints(n, "kernel_shape", k);
  if (ks != k) throw Error(node_label(n) + ": kernel_shape disagrees with the weight " + shape_str(w.shape()));
  std::vector<int64_t> stride = attr_ints(n, "strides", std::vector<int64_t>(r, 1));
  std::vector<int64_t> dil = attr_ints(n, "dilations", std::vector<int64_t>(r, 1));
  if (stride.size() != r || dil.size() != r) throw Error(node_label(n) + ": strides/dilations have the wrong length");
  Shape hw(x.shape().begin() + 2, x.shape().end());
  std::vector<int64_t> p = window_pads(n, hw, k, stride, dil);
  int64_t groups = attr_i(n, "group", 1);
  if (is1d) {  // [N, C, L] as [N, C, 1, L]
    x = unsqueeze(x, 2);
    w = unsqueeze(w, 2);
    stride.insert(stride.begin(), 1);
    dil.insert(dil.begin(), 1);
    p = {0, p[0], 0, p[1]};
  }
  // ONNX pads [x1_begin, x2_begin, x1_end, x2_end] are the IR's [top, left, bottom, right].
  Tensor y = conv2d(x, w, {.stride = stride, .padding = p, .dilation = dil, .groups = groups});
  if (is1d) y = squeeze(y, 2);
  if (bias) {
    Shape bs(size_t(y.rank()) - 1, 1);
    bs[0] = y.dim(1);
    y = y + reshape(*bias, bs);
  }
  return {tensor_value(y)};
}

// ConvTranspose (1-D and 2-D): the IR's transposed convolution; pads from `pads`, or from `output_shape` /
// auto_pad SAME_* as the ONNX spec derives them.
Outs op_conv_transpose(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0)), w = L.tensor(req_in(n, in, 1));
  std::optional<Tensor> bias;
  if (const Value* b = opt_in(in, 2)) bias = L.tensor(*b);
  const bool is1d = x.rank() == 3;
  if (!is1d && x.rank() != 4) throw Error(node_label(n) + ": only 1-D and 2-D transposed convolutions are supported");
  if (w.rank() != x.rank()) throw Error(node_label(n) + ": weight rank differs from input rank");
  const size_t r = size_t(x.rank()) - 2;
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  if (attr_ints(n, "kernel_shape", k) != k)
    throw Error(node_label(n) + ": kernel_shape disagrees with the weight " + shape_str(w.shape()));
  std::vector<int64_t> stride = attr_ints(n, "strides", std::vector<int64_t>(r, 1));
  std::vector<int64_t> dil = attr_ints(n, "dilations", std::vector<int64_t>(r, 1));
  std::vector<int64_t> outpad = attr_ints(n, "output_padding", std::vector<int64_t>(r, 0));
  if (stride.size() != r || dil.size() != r || outpad.size() != r)
    throw Error(node_label(n) + ": strides/dilations/output_padding have the wrong length");
  const std::string ap = attr_s(n, "auto_pad", "NOTSET");
  std::vector<int64_t> want = attr_ints(n, "output_shape", {});
  if (!want.empty() && want.size() != r) want.erase(want.begin(), want.end() - std::ptrdiff_t(r));  // [N, C, ...] given
  std::vector<int64_t> p(2 * r, 0);
  if (want.empty() && (ap == "SAME_UPPER" || ap == "SAME_LOWER"))
    for (size_t i = 0; i < r; ++i) want.push_back(x.dim(int(2 + i)) * stride[i]);
  if (!want.empty()) {
    for (size_t i = 0; i < r; ++i) {
      const int64_t full = stride[i] * (x.dim(int(2 + i)) - 1) + outpad[i] + (k[i] - 1) * dil[i] + 1;
      const int64_t total = full - want[i];
      if (total < 0) throw Error(node_label(n) + ": output_shape larger than the transposed convolution gives");
      const bool lower = ap == "SAME_LOWER";
      p[i] = lower ? total - total / 2 : total / 2;
      p[i + r] = total - p[i];
    }
  } else if (ap == "NOTSET") {
    p = attr_ints(n, "pads", p);
    if (p.size() != 2 * r) throw Error(node_label(n) + ": pads must have " + std::to_string(2 * r) + " values");
  } else if (ap != "VALID") {
    throw Error(node_label(n) + ": unknown auto_pad '" + ap + "'");
  }
  const int64_t groups = attr_i(n, "group", 1);
  if (is1d) {  // [N, C, L] as [N, C, 1, L]
    x = unsqueeze(x, 2);
    w = unsqueeze(w, 2);
    stride.insert(stride.begin(), 1);
    dil.insert(dil.begin(), 1);
    outpad.insert(outpad.begin(), 0);
    p = {0, p[0], 0, p[1]};
  }
  Tensor y = conv_transpose2d(
      x, w, {.stride = stride, .padding = p, .output_padding = outpad, .dilation = dil, .groups = groups}, bias);
  if (is1d) y = squeeze(y, 2);
  return {tensor_value(y)};
}

// MaxPool / AveragePool, 1-D (as [N, C, 1, L]) and 2-D. Pads beyond half the kernel and ceil_mode become
// explicit padding (-inf for max; for average, a pooled validity mask divides so padding is not counted).
Rule pool(bool is_max) {
  return [is_max](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    Tensor x = L.tensor(req_in(n, in, 0));
    const DType dt = x.dtype();
    if (dt != DType::F32) x = cast(x, DType::F32);
    if (x.rank() == 5) {
      Tensor y = pool3d(L, n, x, is_max);
      return {tensor_value(dt == DType::F32 ? y : cast(y, dt))};
    }
    const bool is1d = x.rank() == 3;
    if (!is1d && x.rank() != 4) throw Error(node_label(n) + ": only 1-D, 2-D and 3-D pooling (NCHW) is supported");
    const size_t r = size_t(x.rank()) - 2;
    std::vector<int64_t> k = attr_ints(n, "kernel_shape");
    if (k.size() != r) throw Error(node_label(n) + ": kernel_shape must have " + std::to_string(r) + " values");
    std::vector<int64_t> stride = attr_ints(n, "strides", std::vector<int64_t>(r, 1));
    std::vector<int64_t> dil = attr_ints(n, "dilations", std::vector<int64_t>(r, 1));
    if (stride.size() != r || dil.size() != r) throw Error(node_label(n) + ": strides/dilations have the wrong length");
    Shape hw(x.shape().begin() + 2, x.shape().end());
    std::vector<int64_t> p = window_pads(n, hw, k, stride, dil);
    const bool include_pad = attr_i(n, "count_include_pad", 0) != 0;
    if (is1d) {
      x = unsqueeze(x, 2);
      k.insert(k.begin(), 1), stride.insert(stride.begin(), 1), dil.insert(dil.begin(), 1);
      hw.insert(hw.begin(), 1);
      p = {0, p[0], 0, p[1]};
    }
    if (!is_max && (dil[0] != 1 || dil[1] != 1)) throw Error(node_label(n) + ": dilated average pooling is not supported");
    std::vector<int64_t> extra(2, 0);  // ceil_mode: more padding at the end
    bool explicit_pad = false;
    for (size_t i = 0; i < 2; ++i) {
      int64_t span = hw[i] + p[i] + p[i + 2] - dil[i] * (k[i] - 1) - 1;
      if (span < 0) throw Error(node_label(n) + ": the window is larger than the padded input");
      if (attr_i(n, "ceil_mode", 0) && span % stride[i]) {
        int64_t out = span / stride[i] + 2;
        if ((out - 1) * stride[i] >= hw[i] + p[i]) --out;  // the last window must start inside
        extra[i] = std::max<int64_t>((out - 1) * stride[i] + dil[i] * (k[i] - 1) + 1 - (hw[i] + p[i] + p[i + 2]), 0);
      }
      if (extra[i] || 2 * std::max(p[i], p[i + 2]) > k[i]) explicit_pad = true;
    }
    Tensor y;
    if (!explicit_pad) {
      Pool2dOptions o{.kernel = k, .stride = stride, .padding = p, .dilation = dil, .count_include_pad = include_pad};
      y = is_max ? max_pool2d(x, o) : avg_pool2d(x, o);
    } else {
      std::vector<int64_t> pairs = {0, 0, 0, 0, p[0], p[2] + extra[0], p[1], p[3] + extra[1]};
      Pool2dOptions o{.kernel = k, .stride = stride, .padding = {0, 0, 0, 0}, .dilation = dil, .count_include_pad = true};
      if (is_max) {
        y = max_pool2d(pad(x, pairs, -INFINITY), o);
      } else {
        // The fraction of each window that counts: the input (and the explicit pads when they count).
        Shape ms = {1, 1, hw[0], hw[1]};
        Tensor mask = L.g.full(ms, 1.0);
        if (include_pad) {
          mask = pad(mask, {0, 0, 0, 0, p[0], p[2], p[1], p[3]}, 1.0);
          pairs = {0, 0, 0, 0, 0, extra[0], 0, extra[1]};
          y = avg_pool2d(pad(pad(x, {0, 0, 0, 0, p[0], p[2], p[1], p[3]}, 0.0), pairs, 0.0), o);
        } else {
          y = avg_pool2d(pad(x, pairs, 0.0), o);
        }
        y = y / avg_pool2d(pad(mask, pairs, 0.0), o);
      }
    }
    if (is1d) y = squeeze(y, 2);
    return {tensor_value(dt == DType::F32 ? y : cast(y, dt))};
  };
}

Outs op_global_avg_pool(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.rank() < 3) throw Error(node_label(n) + ": input must be [N, C, spatial...]");
  std::vector<int64_t> axes;
  for (int i = 2; i < x.rank(); ++i) axes.push_back(i);
  return {tensor_value(mean(x, axes, true))};
}

Outs op_batch_norm(Lowering& L, const pb::NodeProto& n, Ins& in) {
  if (attr_i(n, "training_mode", 0)) {
    // Batch statistics (population variance) normalize; the running statistics update by momentum.
    Tensor x = L.tensor(req_in(n, in, 0));
    std::vector<int64_t> axes = {0};
    for (int i = 2; i < x.rank(); ++i) axes.push_back(i);
    Shape cs(size_t(x.rank()) - 1, 1);
    cs[0] = x.dim(1);
    double eps = attr_f(n, "epsilon", 1e-5), mom = attr_f(n, "momentum", 0.9);
    Tensor mu = mean(x, axes, true), var = mean(square(x - mu), axes, true);
    Tensor y = (x - mu) * rsqrt(var + eps) * reshape(L.tensor(req_in(n, in, 1)), cs) + reshape(L.tensor(req_in(n, in, 2)), cs);
    Tensor rm = L.tensor(req_in(n, in, 3)) * mom + reshape(mu, {x.dim(1)}) * (1 - mom);
    Tensor rv = L.tensor(req_in(n, in, 4)) * mom + reshape(var, {x.dim(1)}) * (1 - mom);
    return {tensor_value(y), tensor_value(rm), tensor_value(rv)};
  }
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor scale = L.tensor(req_in(n, in, 1)), bias = L.tensor(req_in(n, in, 2));
  Tensor mean = L.tensor(req_in(n, in, 3), std::nullopt, true), var = L.tensor(req_in(n, in, 4), std::nullopt, true);
  return {tensor_value(batch_norm_eval(x, mean, var, scale, bias, attr_f(n, "epsilon", 1e-5)))};
}

Outs op_layer_norm(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  int axis = norm_axis(n, attr_i(n, "axis", -1), x.rank());
  double eps = attr_f(n, "epsilon", 1e-5);
  if (n.output_size() > 1) {
    // Mean and InvStdDev asked for: the normalization spelled out, so they are values of the graph.
    std::vector<int64_t> axes;
    for (int i = axis; i < x.rank(); ++i) axes.push_back(i);
    Tensor mu = mean(x, axes, true);
    Tensor inv = rsqrt(mean(square(x - mu), axes, true) + eps);
    Tensor y = (x - mu) * inv;
    if (const Value* v = opt_in(in, 1)) y = y * L.tensor(*v);
    if (const Value* v = opt_in(in, 2)) y = y + L.tensor(*v);
    return {tensor_value(y), tensor_value(mu), tensor_value(inv)};
  }
  std::optional<Tensor> w, b;
  if (const Value* v = opt_in(in, 1)) w = L.tensor(*v);
  if (const Value* v = opt_in(in, 2)) b = L.tensor(*v);
  if (axis == x.rank() - 1) {
    // The IR's weight/bias are [D]; ONNX allows them broadcastable, e.g. [1, D].
    if (w && w->rank() != 1) w = reshape(*w, {w->numel()});
    if (b && b->rank() != 1) b = reshape(*b, {b->numel()});
    return {tensor_value(layer_norm(x, w, b, eps))};
  }
  // Normalizing several trailing axes: flatten them into one, then restore the shape.
  Shape lead(x.shape().begin(), x.shape().begin() + axis);
  int64_t d = 1;
  for (int i = axis; i < x.rank(); ++i)
    if (__builtin_mul_overflow(d, x.dim(i), &d))
      throw Error(node_label(n) + ": normalized axes have more elements than a 64-bit count holds");
  Shape flat = lead;
  flat.push_back(d);
  Tensor y = layer_norm(reshape(x, flat), std::nullopt, std::nullopt, eps);
  y = reshape(y, x.shape());
  if (w) y = y * *w;
  if (b) y = y + *b;
  return {tensor_value(y)};
}

Rule reduce(Tensor (*fn)(Tensor, std::vector<int64_t>, bool), bool axes_input_13) {
  return [fn, axes_input_13](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    const Value& xv = req_in(n, in, 0);
    bool keep = attr_i(n, "keepdims", 1) != 0;
    // ReduceSum takes axes as an input from opset 13, the others from opset 18; before, an attribute.
    (void)axes_input_13;
    std::vector<int64_t> axes = opt_in(in, 1) ? ints_of(host_of(n, in, 1, "axes")) : attr_ints(n, "axes");
    if (axes.empty() && attr_i(n, "noop_with_empty_axes", 0)) return {xv};
    Tensor x = L.tensor(xv);
    for (int64_t& a : axes) a = norm_axis(n, a, x.rank());
    return {tensor_value(fn(x, axes, keep))};
  };
}

Outs op_transpose(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  std::vector<int64_t> def(size_t(x.rank()));
  for (int i = 0; i < x.rank(); ++i) def[size_t(i)] = x.rank() - 1 - i;
  return {tensor_value(permute(x, attr_ints(n, "perm", def)))};
}

// ---- ops composed from the builder's ops (no IR op of their own, so every backend and autodiff apply)

Tensor f32(Tensor t) { return t.dtype() == DType::F32 ? t : cast(t, DType::F32); }
Tensor back_to(Tensor t, DType dt) { return t.dtype() == dt ? t : cast(t, dt); }

// floor(x) exactly: |x| >= 2^23 is already an integer in f32 (and NaN/inf pass through); below, the cast to
// i32 truncates and the correction steps negative non-integers down.
Tensor floor_(Graph& g, Tensor x) {
  const double big = 8388608.0;
  Tensor t = cast(cast(clamp(x, -big, big), DType::I32), DType::F32);
  Tensor fl = t - cast(less(x, t), DType::F32);
  return where(less(abs(x), g.scalar(big)), fl, x);
}
Tensor ceil_(Graph& g, Tensor x) { return -floor_(g, -x); }
Tensor sign_(Graph& g, Tensor x) {
  return cast(greater(x, g.scalar(0.0)), DType::F32) - cast(less(x, g.scalar(0.0)), DType::F32);
}
// Round half to even.
Tensor round_(Graph& g, Tensor x) {
  Tensor r = floor_(g, x + 0.5);
  Tensor half = equal(r - x, g.scalar(0.5));
  Tensor odd = equal(r - 2.0 * floor_(g, r * 0.5), g.scalar(1.0));
  Tensor both = greater(cast(half, DType::F32) + cast(odd, DType::F32), g.scalar(1.5));
  return where(both, r - 1.0, r);
}
Tensor tan_(Graph&, Tensor x) { return sin(x) / cos(x); }
Tensor sinh_(Graph&, Tensor x) { return (exp(x) - exp(-x)) * 0.5; }
Tensor cosh_(Graph&, Tensor x) { return (exp(x) + exp(-x)) * 0.5; }
Tensor asinh_(Graph&, Tensor x) { return log(x + sqrt(square(x) + 1.0)); }
Tensor acosh_(Graph&, Tensor x) { return log(x + sqrt(square(x) - 1.0)); }
Tensor atanh_(Graph&, Tensor x) { return log((1.0 + x) / (1.0 - x)) * 0.5; }
Tensor softsign_(Graph&, Tensor x) { return x / (abs(x) + 1.0); }
Tensor mish_(Graph&, Tensor x) { return x * tanh(softplus(x)); }

Rule float_unary(Tensor (*fn)(Graph&, Tensor)) {
  return [fn](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    Tensor x = L.tensor(req_in(n, in, 0));
    return {tensor_value(back_to(fn(L.g, f32(x)), x.dtype()))};
  };
}

Outs op_isnan(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  return {tensor_value(not_equal(x, x))};
}

Outs op_isinf(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor pos = equal(x, L.g.scalar(INFINITY)), neg = equal(x, L.g.scalar(-INFINITY));
  bool p = attr_i(n, "detect_positive", 1) != 0, m = attr_i(n, "detect_negative", 1) != 0;
  if (p && m) return {tensor_value(greater(cast(pos, DType::F32) + cast(neg, DType::F32), L.g.scalar(0.5)))};
  if (p) return {tensor_value(pos)};
  if (m) return {tensor_value(neg)};
  return {tensor_value(equal(x, L.g.scalar(NAN)))};
}

// Activations with attributes.
Outs op_elu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  double alpha = attr_f(n, "alpha", 1.0);
  return {tensor_value(where(greater(x, L.g.scalar(0.0)), x, (exp(x) - 1.0) * alpha))};
}
Outs op_selu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  double alpha = attr_f(n, "alpha", 1.67326319217681884765625), gamma = attr_f(n, "gamma", 1.05070102214813232421875);
  return {tensor_value(where(greater(x, L.g.scalar(0.0)), x * gamma, (exp(x) * alpha - alpha) * gamma))};
}
Outs op_celu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  double alpha = attr_f(n, "alpha", 1.0);
  return {tensor_value(maximum(x, L.g.scalar(0.0)) + minimum(L.g.scalar(0.0), (exp(x / alpha) - 1.0) * alpha))};
}
Outs op_thresholded_relu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  return {tensor_value(where(greater(x, L.g.scalar(attr_f(n, "alpha", 1.0))), x, L.g.scalar(0.0)))};
}
Outs op_hard_sigmoid(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  return {tensor_value(clamp(x * attr_f(n, "alpha", 0.2) + attr_f(n, "beta", 0.5), 0.0, 1.0))};
}
Outs op_hard_swish(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  return {tensor_value(x * clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0))};
}
Outs op_shrink(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  DType dt = x.dtype();
  x = f32(x);
  double lambd = attr_f(n, "lambd", 0.5), bias = attr_f(n, "bias", 0.0);
  Tensor y = where(less(x, L.g.scalar(-lambd)), x + bias,
                   where(greater(x, L.g.scalar(lambd)), x - bias, L.g.full({}, 0.0)));
  return {tensor_value(back_to(y, dt))};
}
Outs op_prelu(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor slope = L.tensor(req_in(n, in, 1), x.dtype());
  if (L.opset < 7 && slope.rank() == 1 && x.rank() > 2 && slope.dim(0) == x.dim(1)) {  // per channel
    Shape s(size_t(x.rank()) - 1, 1);
    s[0] = slope.dim(0);
    slope = reshape(slope, s);
  }
  return {tensor_value(where(less(x, L.g.scalar(0.0, x.dtype())), x * slope, x))};
}

// Variadic Sum / Mean.
Rule variadic(bool is_mean) {
  return [is_mean](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    if (in.empty()) throw Error(node_label(n) + ": needs at least one input");
    auto dt = common_dtype(in);
    Tensor acc = L.tensor(req_in(n, in, 0), dt);
    for (size_t i = 1; i < in.size(); ++i) acc = acc + L.tensor(req_in(n, in, i), dt);
    if (is_mean && in.size() > 1) acc = acc / double(in.size());
    return {tensor_value(acc)};
  };
}

Outs op_size(Lowering&, const pb::NodeProto& n, Ins& in) {
  return {host_value(HostTensor{Kind::I, {}, {double(checked_numel(req_in(n, in, 0).shape(), node_label(n)))}})};
}

Outs op_cast_like(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& like = req_in(n, in, 1);
  DType dt = like.is_host() ? (like.host->kind == Kind::F ? DType::F32 : like.host->kind == Kind::I ? DType::I32 : DType::Bool)
                            : like.t.dtype();
  const Value& x = req_in(n, in, 0);
  if (foldable(&x)) {
    HostTensor h = *x.host;
    Kind k = dt == DType::Bool ? Kind::B : dt == DType::I32 ? Kind::I : Kind::F;
    for (double& d : h.v) d = k == Kind::B ? double(d != 0) : k == Kind::I ? std::trunc(d) : d;
    h.kind = k;
    return {host_value(std::move(h))};
  }
  Tensor t = L.tensor(x);
  return {tensor_value(back_to(t, dt))};
}

// ArgMax / ArgMin (keepdims, select_last_index) on the IR's argmax (first maximum).
Rule arg_rule(bool is_min) {
  return [is_min](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    Tensor x = f32(L.tensor(req_in(n, in, 0)));
    int axis = norm_axis(n, attr_i(n, "axis", 0), x.rank());
    bool keep = attr_i(n, "keepdims", 1) != 0, last = attr_i(n, "select_last_index", 0) != 0;
    if (is_min) x = -x;
    int64_t d = x.dim(axis);
    if (last) {
      std::vector<int32_t> rev;
      for (int64_t k = d - 1; k >= 0; --k) rev.push_back(int32_t(k));
      x = gather(x, L.g.constant_i32({d}, rev), axis);
    }
    Tensor i = argmax(x, axis, keep);
    if (last) i = cast(double(d - 1) - cast(i, DType::F32), DType::I32);
    return {tensor_value(i)};
  };
}

// Hardmax: one-hot of the first maximum along `axis` (2-D coercion before opset 13).
Tensor hardmax_last(Tensor x, int64_t) {
  int64_t d = x.dim(-1);
  return cast(one_hot(argmax(x, -1, false), d), x.dtype());
}
Outs op_hardmax(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (L.opset < 13) return softmax_rule(hardmax_last)(L, n, in);
  int axis = norm_axis(n, attr_i(n, "axis", -1), x.rank());
  if (axis == x.rank() - 1) return {tensor_value(hardmax_last(x, -1))};
  return {tensor_value(transpose(hardmax_last(transpose(x, axis, -1), -1), axis, -1))};
}

// The reductions ONNX adds on top of sum/mean/max/min.
Tensor reduce_l1(Tensor x, std::vector<int64_t> a, bool k) { return sum(abs(x), a, k); }
Tensor reduce_l2(Tensor x, std::vector<int64_t> a, bool k) { return sqrt(sum(square(x), a, k)); }
Tensor reduce_sum_square(Tensor x, std::vector<int64_t> a, bool k) { return sum(square(x), a, k); }
Tensor reduce_log_sum(Tensor x, std::vector<int64_t> a, bool k) { return log(sum(x, a, k)); }
Tensor reduce_log_sum_exp(Tensor x, std::vector<int64_t> a, bool k) {
  if (a.empty())
    for (int i = 0; i < x.rank(); ++i) a.push_back(i);
  Tensor m = stop_gradient(max(x, a, true));
  Tensor y = log(sum(exp(x - m), a, true)) + m;
  if (!k) {
    Shape s;
    for (int i = 0; i < x.rank(); ++i)
      if (std::find(a.begin(), a.end(), i) == a.end()) s.push_back(x.dim(i));
    y = reshape(y, s);
  }
  return y;
}
// Product as sign × exp(Σ log|x|), zero when any factor is zero.
Tensor reduce_prod(Graph& g, Tensor x, std::vector<int64_t> a, bool k) {
  Tensor mag = exp(sum(log(abs(x)), a, k));
  Tensor negs = sum(cast(less(x, g.scalar(0.0)), DType::F32), a, k);
  Tensor odd = equal(negs - 2.0 * floor_(g, negs * 0.5), g.scalar(1.0));
  Tensor zero = greater(sum(cast(equal(x, g.scalar(0.0)), DType::F32), a, k), g.scalar(0.5));
  return where(zero, g.scalar(0.0), where(odd, -mag, mag));
}
Outs op_reduce_prod(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& xv = req_in(n, in, 0);
  bool keep = attr_i(n, "keepdims", 1) != 0;
  std::vector<int64_t> axes = opt_in(in, 1) ? ints_of(host_of(n, in, 1, "axes")) : attr_ints(n, "axes");
  if (axes.empty() && attr_i(n, "noop_with_empty_axes", 0)) return {xv};
  Tensor x = L.tensor(xv);
  for (int64_t& a : axes) a = norm_axis(n, a, x.rank());
  return {tensor_value(reduce_prod(L.g, x, axes, keep))};
}

// Mod: fmod = a - b·trunc(a / b) (sign of a), else a - b·floor(a / b) (sign of b); computed in f32.
Outs op_mod(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& av = req_in(n, in, 0);
  const Value& bv = req_in(n, in, 1);
  bool fmod = attr_i(n, "fmod", 0) != 0;
  if (foldable(&av) && foldable(&bv))
    return {host_value(host_broadcast_n(n, {&*av.host, &*bv.host}, arith_kind(*av.host, *bv.host),
                                        [fmod](const std::vector<double>& v) {
                                          double r = std::fmod(v[0], v[1]);
                                          if (!fmod && r != 0 && ((r < 0) != (v[1] < 0))) r += v[1];
                                          return r;
                                        }))};
  auto dt = common_dtype({&av, &bv});
  Tensor a = L.tensor(av, dt), b = L.tensor(bv, dt);
  DType out = a.dtype();
  Tensor af = f32(a), bf = f32(b);
  Tensor q = af / bf;
  Tensor t = fmod ? sign_(L.g, q) * floor_(L.g, abs(q)) : floor_(L.g, q);
  Tensor r = af - bf * t;
  return {tensor_value(out == DType::I32 ? cast(round_(L.g, r), DType::I32) : back_to(r, out))};
}

// CumSum along an axis as a matmul with a triangular 0/1 matrix (exclusive and reverse choose the triangle).
Outs op_cumsum(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  int axis = norm_axis(n, to_i64(scalar_of(n, host_of(n, in, 1, "axis"), "axis")), x.rank());
  bool excl = attr_i(n, "exclusive", 0) != 0, rev = attr_i(n, "reverse", 0) != 0;
  int64_t d = x.dim(axis);
  checked_numel({d, d}, node_label(n) + " (its summing matrix)");
  std::vector<float> m(size_t(d * d), 0.0f);  // y[j] = sum_i x[i] m[i][j]
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      bool on = rev ? (excl ? i > j : i >= j) : (excl ? i < j : i <= j);
      m[size_t(i * d + j)] = on ? 1.0f : 0.0f;
    }
  DType dt = x.dtype();
  Tensor t = f32(x);
  bool last = axis == x.rank() - 1;
  if (!last) t = transpose(t, axis, -1);
  if (x.rank() == 1) t = unsqueeze(t, 0);
  Tensor y = matmul(t, L.g.constant({d, d}, m));
  if (x.rank() == 1) y = squeeze(y, 0);
  if (!last) y = transpose(y, axis, -1);
  return {tensor_value(dt == DType::I32 ? cast(round_(L.g, y), DType::I32) : back_to(y, dt))};
}

// Tile, one axis at a time: [pre, 1, d, post] expanded to [pre, r, d, post].
Outs op_tile(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& xv = req_in(n, in, 0);
  std::vector<int64_t> reps = ints_of(host_of(n, in, 1, "repeats"));
  if (reps.size() != xv.shape().size()) throw Error(node_label(n) + ": repeats must have one value per axis");
  Shape final_shape = xv.shape();
  for (size_t a = 0; a < reps.size(); ++a) {
    if (reps[a] < 1 || reps[a] > kMaxHostElements)
      throw Error(node_label(n) + ": repeats must be in [1, " + std::to_string(kMaxHostElements) + "]");
    final_shape[a] *= reps[a];
  }
  checked_numel(final_shape, node_label(n));
  Tensor x = L.tensor(xv);
  for (int a = 0; a < x.rank(); ++a) {
    int64_t r = reps[size_t(a)];
    if (r < 1) throw Error(node_label(n) + ": repeats must be >= 1 (empty tensors are not supported)");
    if (r == 1) continue;
    int64_t pre = 1, post = 1, d = x.dim(a);
    for (int i = 0; i < a; ++i) pre *= x.dim(i);
    for (int i = a + 1; i < x.rank(); ++i) post *= x.dim(i);
    Shape out = x.shape();
    out[size_t(a)] *= r;
    x = reshape(expand(reshape(x, {pre, 1, d, post}), {pre, r, d, post}), out);
  }
  return {tensor_value(x)};
}

// DepthToSpace / SpaceToDepth: reshape, permute, reshape (DCR and CRD orders).
Outs op_depth_to_space(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.rank() != 4) throw Error(node_label(n) + ": input must be NCHW");
  int64_t b = attr_i(n, "blocksize", 0), N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  if (b < 1 || C % (b * b)) throw Error(node_label(n) + ": channels must be divisible by blocksize^2");
  bool crd = attr_s(n, "mode", "DCR") == "CRD";
  Tensor t = crd ? permute(reshape(x, {N, C / (b * b), b, b, H, W}), {0, 1, 4, 2, 5, 3})
                 : permute(reshape(x, {N, b, b, C / (b * b), H, W}), {0, 3, 4, 1, 5, 2});
  return {tensor_value(reshape(t, {N, C / (b * b), H * b, W * b}))};
}
Outs op_space_to_depth(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.rank() != 4) throw Error(node_label(n) + ": input must be NCHW");
  int64_t b = attr_i(n, "blocksize", 0), N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  if (b < 1 || H % b || W % b) throw Error(node_label(n) + ": H and W must be divisible by blocksize");
  Tensor t = permute(reshape(x, {N, C, H / b, b, W / b, b}), {0, 3, 5, 1, 2, 4});
  return {tensor_value(reshape(t, {N, C * b * b, H / b, W / b}))};
}

Outs op_global_max_pool(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  if (x.rank() < 3) throw Error(node_label(n) + ": input must be [N, C, spatial...]");
  std::vector<int64_t> axes;
  for (int i = 2; i < x.rank(); ++i) axes.push_back(i);
  return {tensor_value(max(x, axes, true))};
}

Outs op_instance_norm(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor scale = L.tensor(req_in(n, in, 1)), bias = L.tensor(req_in(n, in, 2));
  if (x.rank() < 3) throw Error(node_label(n) + ": input must be [N, C, spatial...]");
  double eps = attr_f(n, "epsilon", 1e-5);
  std::vector<int64_t> axes;
  for (int i = 2; i < x.rank(); ++i) axes.push_back(i);
  Tensor mu = mean(x, axes, true);
  Tensor var = mean(square(x - mu), axes, true);
  Shape cs(size_t(x.rank()) - 1, 1);
  cs[0] = x.dim(1);
  return {tensor_value((x - mu) * rsqrt(var + eps) * reshape(scale, cs) + reshape(bias, cs))};
}

Outs op_mvn(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  std::vector<int64_t> axes = attr_ints(n, "axes", {0, 2, 3});
  for (int64_t& a : axes) a = norm_axis(n, a, x.rank());
  Tensor mu = mean(x, axes, true);
  Tensor var = mean(square(x), axes, true) - square(mu);
  return {tensor_value((x - mu) / (sqrt(var) + 1e-9))};
}

Outs op_lp_norm(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  int axis = norm_axis(n, attr_i(n, "axis", -1), x.rank());
  int64_t p = attr_i(n, "p", 2);
  if (p != 1 && p != 2) throw Error(node_label(n) + ": p must be 1 or 2");
  Tensor norm = p == 1 ? sum(abs(x), {axis}, true) : sqrt(sum(square(x), {axis}, true));
  return {tensor_value(x / norm)};
}

Outs op_eye_like(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Shape s = req_in(n, in, 0).shape();
  if (s.size() != 2) throw Error(node_label(n) + ": input must be 2-D");
  int64_t k = attr_i(n, "k", 0);
  std::vector<float> v(size_t(s[0] * s[1]), 0.0f);
  for (int64_t i = 0; i < s[0]; ++i)
    if (i + k >= 0 && i + k < s[1]) v[size_t(i * s[1] + i + k)] = 1.0f;
  int64_t dt = attr_i(n, "dtype", -1);
  DType d = dt == pb::TensorProto::BOOL ? DType::Bool
            : (dt == -1 ? req_in(n, in, 0).is_host() ? (req_in(n, in, 0).host->kind == Kind::F ? DType::F32 : DType::I32)
                                                      : req_in(n, in, 0).t.dtype()
                        : (dt == pb::TensorProto::FLOAT || dt == pb::TensorProto::DOUBLE || dt == pb::TensorProto::FLOAT16)
                            ? DType::F32
                            : DType::I32);
  return {tensor_value(L.g.constant(s, v, d))};
}

// Pow with a tensor exponent: |x|^e = exp(e·log|x|), negative bases only with integer exponents (the sign
// from the exponent's parity), x^0 = 1.
Tensor pow_tensor(Graph& g, Tensor x, Tensor e) {
  Tensor r = exp(e * log(abs(x)));
  Tensor is_int = equal(e, floor_(g, e));
  Tensor odd = equal(e - 2.0 * floor_(g, e * 0.5), g.scalar(1.0));
  Tensor neg_r = where(is_int, where(odd, -r, r), g.scalar(NAN));
  Tensor y = where(less(x, g.scalar(0.0)), neg_r, r);
  return where(equal(e, g.scalar(0.0)), g.scalar(1.0), y);
}

// NegativeLogLikelihoodLoss on log-probabilities [N, C, d...] and targets [N, d...].
Tensor nll(Lowering& L, const pb::NodeProto& n, Tensor x, Tensor target, std::optional<Tensor> weight) {
  Graph& g = L.g;
  std::string red = attr_s(n, "reduction", "mean");
  if (red != "none" && red != "sum" && red != "mean") throw Error(node_label(n) + ": unknown reduction '" + red + "'");
  if (x.rank() < 2 || target.rank() != x.rank() - 1) throw Error(node_label(n) + ": input must be [N, C, ...], target [N, ...]");
  const Value* ii = nullptr;
  (void)ii;
  std::optional<int64_t> ignore;
  if (find_attr(n, "ignore_index")) ignore = attr_i(n, "ignore_index", 0);
  Tensor tgt = target;
  Tensor keep = g.scalar(1.0);
  if (ignore) {
    Tensor ign = equal(cast(target, DType::F32), g.scalar(double(*ignore)));
    tgt = where(ign, g.scalar(0.0, DType::I32), target);
    keep = where(ign, g.scalar(0.0), g.scalar(1.0));
  }
  Tensor picked = squeeze(gather_elements(x, unsqueeze(tgt, 1), 1), 1);  // [N, d...]
  Tensor w = keep;
  if (weight) w = gather(*weight, tgt, 0) * keep;
  Tensor loss = -picked * w;
  if (red == "none") return loss;
  if (red == "sum") return sum(loss);
  Tensor denom = weight || ignore ? sum(expand(w, loss.shape())) : g.scalar(double(loss.numel()));
  return sum(loss) / denom;
}

Outs op_nll_loss(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor t = L.tensor(req_in(n, in, 1), DType::I32);
  std::optional<Tensor> w;
  if (const Value* v = opt_in(in, 2)) w = L.tensor(*v);
  return {tensor_value(back_to(nll(L, n, f32(x), t, w), x.dtype()))};
}

Outs op_softmax_ce_loss(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  Tensor t = L.tensor(req_in(n, in, 1), DType::I32);
  std::optional<Tensor> w;
  if (const Value* v = opt_in(in, 2)) w = L.tensor(*v);
  Tensor lp = log_softmax(f32(x), 1);
  Outs o = {tensor_value(back_to(nll(L, n, lp, t, w), x.dtype()))};
  if (n.output_size() > 1) o.push_back(tensor_value(back_to(lp, x.dtype())));
  return o;
}

// Resize / Upsample: separable per axis; each output position reads 1 (nearest), 2 (linear) or 4 (cubic)
// input positions (edge-clamped) with weights computed on the host, as onnx's reference does.
struct Taps {
  std::vector<std::vector<int32_t>> idx;  // [tap][out]
  std::vector<std::vector<float>> w;      // [tap][out]
};
// tf_crop_and_resize: the region [roi0, roi1] (normalized) of the axis; positions outside the input are
// marked in `outside` (they take the extrapolation value).
Taps resize_taps(const pb::NodeProto& n, int64_t d, int64_t o, double scale, const std::string& mode,
                 const std::string& ctm, const std::string& nearest, double cubic_a, bool exclude_outside,
                 double roi0 = 0, double roi1 = 1, std::vector<float>* outside = nullptr) {
  int taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
  Taps t{std::vector<std::vector<int32_t>>(size_t(taps)), std::vector<std::vector<float>>(size_t(taps))};
  for (int64_t j = 0; j < o; ++j) {
    double x;
    double out_len = scale * double(d);
    if (ctm == "half_pixel") x = (double(j) + 0.5) / scale - 0.5;
    else if (ctm == "pytorch_half_pixel") x = o > 1 ? (double(j) + 0.5) / scale - 0.5 : -0.5;
    else if (ctm == "align_corners") x = out_len == 1 ? 0.0 : double(j) * double(d - 1) / (out_len - 1);
    else if (ctm == "asymmetric") x = double(j) / scale;
    else if (ctm == "tf_half_pixel_for_nn") x = (double(j) + 0.5) / scale;
    else if (ctm == "tf_crop_and_resize")
      x = o > 1 ? roi0 * double(d - 1) + double(j) * (roi1 - roi0) * double(d - 1) / double(o - 1)
                : 0.5 * (roi0 + roi1) * double(d - 1);
    else throw Error(node_label(n) + ": coordinate_transformation_mode '" + ctm + "' is not supported");
    if (outside) outside->push_back(x < 0 || x > double(d - 1) ? 1.0f : 0.0f);
    double fl = std::floor(x), r = x - fl;
    int64_t k = int64_t(fl);
    auto clampi = [d](int64_t i) { return int32_t(std::clamp<int64_t>(i, 0, d - 1)); };
    if (taps == 1) {
      int64_t pick = k;
      if (r != 0) {
        if (nearest == "round_prefer_floor") pick = r <= 0.5 ? k : k + 1;
        else if (nearest == "round_prefer_ceil") pick = r < 0.5 ? k : k + 1;
        else if (nearest == "floor") pick = k;
        else if (nearest == "ceil") pick = k + 1;
        else throw Error(node_label(n) + ": nearest_mode '" + nearest + "' is not supported");
      }
      t.idx[0].push_back(clampi(pick));
      t.w[0].push_back(1.0f);
    } else if (taps == 2) {
      t.idx[0].push_back(clampi(k));
      t.idx[1].push_back(clampi(k + 1));
      t.w[0].push_back(float(1 - r));
      t.w[1].push_back(float(r));
    } else {
      if (r == 0) r = 1, k -= 1;  // the reference's neighbours of an integer position
      const double A = cubic_a;
      double c[4] = {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                     ((A + 2) * r - (A + 3)) * r * r + 1, ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                     ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A};
      if (exclude_outside) {
        double s = 0;
        for (int q = 0; q < 4; ++q) {
          int64_t i = k - 1 + q;
          if (i < 0 || i >= d) c[q] = 0;
          s += c[q];
        }
        for (double& v : c) v /= s;
      }
      for (int q = 0; q < 4; ++q) {
        t.idx[size_t(q)].push_back(clampi(k - 1 + q));
        t.w[size_t(q)].push_back(float(c[q]));
      }
    }
  }
  return t;
}

Tensor resize_nd(Lowering& L, const pb::NodeProto& n, Tensor x, const Shape& out, const std::vector<double>& scales,
                 const std::string& mode, const std::string& ctm, const std::string& nearest, double cubic_a,
                 bool exclude_outside, const std::vector<double>& roi = {}, double extrapolation = 0) {
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    throw Error(node_label(n) + ": mode '" + mode + "' is not supported");
  DType dt = x.dtype();
  x = f32(x);
  const bool crop = ctm == "tf_crop_and_resize";
  // Innermost axis first, as the reference recurses (it matters only for extrapolated positions).
  for (int a = x.rank() - 1; a >= 0; --a) {
    int64_t d = x.dim(a), o = out[size_t(a)];
    if (o == d && scales[size_t(a)] == 1.0 && !crop) continue;
    if (o < 1) throw Error(node_label(n) + ": output size " + std::to_string(o) + " (empty tensors are not supported)");
    std::vector<float> outside;
    Taps t = crop ? resize_taps(n, d, o, scales[size_t(a)], mode, ctm, nearest, cubic_a, exclude_outside,
                                roi[size_t(a)], roi[size_t(a + x.rank())], &outside)
                  : resize_taps(n, d, o, scales[size_t(a)], mode, ctm, nearest, cubic_a, exclude_outside);
    Shape ws(size_t(x.rank()), 1);
    ws[size_t(a)] = o;
    Tensor acc;
    for (size_t q = 0; q < t.idx.size(); ++q) {
      Tensor g = gather(x, L.g.constant_i32({o}, t.idx[q]), a);
      if (mode != "nearest") g = g * L.g.constant(ws, t.w[q]);
      acc = q == 0 ? g : acc + g;
    }
    if (std::find(outside.begin(), outside.end(), 1.0f) != outside.end()) {
      Tensor m = L.g.constant(ws, outside);
      acc = acc * (1.0 - m) + m * extrapolation;
    }
    x = acc;
  }
  return back_to(x, dt);
}

Outs op_resize(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  const int r = x.rank();
  std::vector<double> scales;
  Shape out;
  std::string mode = attr_s(n, "mode", "nearest");
  std::string ctm = attr_s(n, "coordinate_transformation_mode", "half_pixel");
  std::string nearest = attr_s(n, "nearest_mode", "round_prefer_floor");
  auto from_scales = [&](const std::vector<double>& s) {
    if (int(s.size()) != r) throw Error(node_label(n) + ": scales must have one value per axis");
    scales = s;
    for (int a = 0; a < r; ++a) out.push_back(int64_t(std::floor(double(x.dim(a)) * s[size_t(a)])));
  };
  if (n.op_type() == "Upsample" || L.opset < 11) {  // Upsample and Resize-10: scales, asymmetric, floor
    ctm = "asymmetric";
    nearest = "floor";
    if (mode == "bilinear") mode = "linear";
    if (L.opset < 9 && n.op_type() == "Upsample") {
      std::vector<double> s;
      const auto* a = find_attr(n, "scales");
      if (!a) throw Error(node_label(n) + ": needs the scales attribute");
      for (float f : a->floats()) s.push_back(f);
      from_scales(s);
    } else {
      from_scales(host_of(n, in, 1, "scales").v);
    }
  } else {
    if (opt_in(in, 3) && host_of(n, in, 3, "sizes").numel() > 0) {
      std::vector<int64_t> sz = ints_of(host_of(n, in, 3, "sizes"));
      if (int(sz.size()) != r) throw Error(node_label(n) + ": sizes must have one value per axis");
      for (int a = 0; a < r; ++a) {
        out.push_back(sz[size_t(a)]);
        scales.push_back(double(sz[size_t(a)]) / double(x.dim(a)));
      }
    } else {
      from_scales(host_of(n, in, 2, "scales").v);
    }
  }
  checked_numel(out, node_label(n));
  std::vector<double> roi;
  if (ctm == "tf_crop_and_resize") {
    roi = host_of(n, in, 1, "roi").v;
    if (int(roi.size()) != 2 * r) throw Error(node_label(n) + ": roi must hold 2 values per axis");
  }
  return {tensor_value(resize_nd(L, n, x, out, scales, mode, ctm, nearest, attr_f(n, "cubic_coeff_a", -0.75),
                                 attr_i(n, "exclude_outside", 0) != 0, roi, attr_f(n, "extrapolation_value", 0.0)))};
}

// OneHot: negative indices count from the end of `depth`; out-of-range ones give a row of `off`.
Outs op_one_hot(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor idx = f32(L.tensor(req_in(n, in, 0)));
  int64_t depth = to_i64(scalar_of(n, host_of(n, in, 1, "depth"), "depth"));
  const HostTensor& vals = host_of(n, in, 2, "values");
  if (vals.numel() != 2) throw Error(node_label(n) + ": values must hold [off, on]");
  if (depth < 1) throw Error(node_label(n) + ": depth must be >= 1");
  Shape os = idx.shape();
  os.push_back(depth);
  checked_numel(os, node_label(n));
  idx = where(less(idx, L.g.scalar(0.0)), idx + double(depth), idx);
  Tensor oh = one_hot(cast(idx, DType::I32), depth);
  Tensor y = oh * (vals.v[1] - vals.v[0]) + vals.v[0];
  int axis = norm_axis(n, attr_i(n, "axis", -1), y.rank());
  if (axis != y.rank() - 1) {
    std::vector<int64_t> perm;
    for (int i = 0; i < y.rank() - 1; ++i) {
      if (i == axis) perm.push_back(y.rank() - 1);
      perm.push_back(i);
    }
    y = permute(y, perm);
  }
  return {tensor_value(vals.kind == Kind::F ? y : cast(y, DType::I32))};
}

// BitShift on unsigned integers: x · 2^y or floor(x / 2^y), in f32 (exact below 2^24).
Outs op_bit_shift(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0))), y = f32(L.tensor(req_in(n, in, 1)));
  std::string dir = attr_s(n, "direction", "");
  Tensor p = round_(L.g, exp(y * std::log(2.0)));
  Tensor r;
  if (dir == "LEFT") r = x * p;
  else if (dir == "RIGHT") r = floor_(L.g, x / p + 1e-6);
  else throw Error(node_label(n) + ": direction must be LEFT or RIGHT, got '" + dir + "'");
  return {tensor_value(cast(r, DType::I32))};
}

// Linear offsets of GatherND/ScatterND index tuples (the last axis of `indices`) into the first q axes of
// `shape`, negative entries counting from the end.
Tensor nd_offsets(Lowering& L, const pb::NodeProto& n, Tensor indices, const Shape& shape) {
  int64_t q = indices.dim(-1);
  if (q < 1 || q > int64_t(shape.size())) throw Error(node_label(n) + ": indices' last axis exceeds the data's rank");
  std::vector<float> dims, strides(static_cast<size_t>(q), 0.0f);
  int64_t st = 1;
  for (int64_t j = q - 1; j >= 0; --j) strides[size_t(j)] = float(st), st *= shape[size_t(j)];
  for (int64_t j = 0; j < q; ++j) dims.push_back(float(shape[size_t(j)]));
  Tensor i = f32(indices);
  i = where(less(i, L.g.scalar(0.0)), i + L.g.constant({q}, dims), i);
  return cast(round_(L.g, sum(i * L.g.constant({q}, strides), {indices.rank() - 1}, false)), DType::I32);
}

Outs op_gather_nd(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor data = L.tensor(req_in(n, in, 0)), idx = L.tensor(req_in(n, in, 1));
  if (int64_t b = attr_i(n, "batch_dims", 0); b > 0) {
    // Leading batch axes shared by data and indices: prepend each batch's own coordinates to its index
    // tuples and gather from the data as if batch_dims were 0.
    if (b >= idx.rank() || b >= data.rank()) throw Error(node_label(n) + ": batch_dims too large");
    Shape lead(idx.shape().begin(), idx.shape().end() - 1);
    std::vector<Tensor> coords;
    for (int64_t a = 0; a < b; ++a) {
      Shape cs(lead.size(), 1);
      cs[size_t(a)] = lead[size_t(a)];
      std::vector<int32_t> v(static_cast<size_t>(lead[size_t(a)]), 0);
      std::iota(v.begin(), v.end(), 0);
      Shape full = lead;
      full.push_back(1);
      cs.push_back(1);
      coords.push_back(expand(L.g.constant_i32(cs, v), full));
    }
    coords.push_back(cast(idx, DType::I32));
    Value iv = tensor_value(concat(coords, -1)), dv = tensor_value(data);
    Ins fin = {&dv, &iv};
    pb::NodeProto plain = n;
    plain.clear_attribute();
    return op_gather_nd(L, plain, fin);
  }
  int64_t q = idx.dim(-1), lead = 1;
  for (int64_t j = 0; j < q; ++j) lead *= data.dim(int(j));
  Shape flat = {lead};
  flat.insert(flat.end(), data.shape().begin() + q, data.shape().end());
  return {tensor_value(gather(reshape(data, flat), nd_offsets(L, n, idx, data.shape()), 0))};
}

Outs op_scatter_nd(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor data = L.tensor(req_in(n, in, 0)), idx = L.tensor(req_in(n, in, 1)), upd = L.tensor(req_in(n, in, 2));
  const std::string r = attr_s(n, "reduction", "none");
  const ScatterReduction red = r == "none"  ? ScatterReduction::None
                               : r == "add" ? ScatterReduction::Add
                               : r == "mul" ? ScatterReduction::Mul
                               : r == "max" ? ScatterReduction::Max
                               : r == "min" ? ScatterReduction::Min
                                            : throw Error(node_label(n) + ": unknown reduction '" + r + "'");
  int64_t q = idx.dim(-1), lead = 1, rest = 1, u = 1;
  for (int64_t j = 0; j < int64_t(data.rank()); ++j) (j < q ? lead : rest) *= data.dim(int(j));
  for (int j = 0; j < idx.rank() - 1; ++j) u *= idx.dim(j);
  Tensor off = reshape(nd_offsets(L, n, idx, data.shape()), {u, 1});
  Tensor y = scatter_elements(reshape(data, {lead, rest}), expand(off, {u, rest}), reshape(upd, {u, rest}), 0, red);
  return {tensor_value(reshape(y, data.shape()))};
}

// LRN across channels: x / (bias + alpha / size · Σ x²)^beta over a window of `size` channels.
Outs op_lrn(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  int64_t size = attr_i(n, "size", 0), C = x.dim(1);
  if (size < 1) throw Error(node_label(n) + ": size must be >= 1");
  double alpha = attr_f(n, "alpha", 1e-4), beta = attr_f(n, "beta", 0.75), bias = attr_f(n, "bias", 1.0);
  std::vector<int64_t> pairs(size_t(2 * x.rank()), 0);
  pairs[2] = (size - 1) / 2, pairs[3] = size - 1 - (size - 1) / 2;
  Tensor sq = pad(square(x), pairs, 0.0), acc;
  for (int64_t j = 0; j < size; ++j) {
    Tensor s = slice(sq, 1, j, j + C);
    acc = j == 0 ? s : acc + s;
  }
  return {tensor_value(x / pow(acc * (alpha / double(size)) + bias, beta))};
}

Outs op_dequantize(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0))), scale = f32(L.tensor(req_in(n, in, 1)));
  std::optional<Tensor> zp;
  if (const Value* z = opt_in(in, 2)) zp = f32(L.tensor(*z));
  if (scale.rank() == 1 && scale.dim(0) > 1) {  // per axis
    int axis = norm_axis(n, attr_i(n, "axis", 1), x.rank());
    Shape s(size_t(x.rank()), 1);
    s[size_t(axis)] = scale.dim(0);
    scale = reshape(scale, s);
    if (zp) zp = reshape(*zp, s);
  }
  return {tensor_value((zp ? x - *zp : x) * scale)};
}

// Einsum without ellipsis or repeated indices within an operand: each operand is permuted and reshaped onto
// the full index space, the operands multiplied (broadcast), the indices not in the output summed.
Outs op_einsum(Lowering& L, const pb::NodeProto& n, Ins& in) {
  std::string eq;
  for (char c : attr_s(n, "equation", "")) if (c != ' ') eq += c;
  if (eq.find("...") != std::string::npos) throw Error(node_label(n) + ": ellipsis in the equation is not supported");
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow), out;
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t c = lhs.find(',', p);
    terms.push_back(lhs.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  if (terms.size() != in.size()) throw Error(node_label(n) + ": the equation names " + std::to_string(terms.size()) + " operands");
  std::string letters;
  std::map<char, int> count;
  for (const auto& t : terms)
    for (char c : t) {
      if (!std::isalpha(static_cast<unsigned char>(c))) throw Error(node_label(n) + ": bad equation '" + eq + "'");
      if (letters.find(c) == std::string::npos) letters += c;
      count[c]++;
    }
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
  } else {
    for (const auto& [c, k] : count)
      if (k == 1) out += c;
  }
  if (letters.size() > 6) throw Error(node_label(n) + ": more than 6 distinct indices are not supported");
  std::map<char, int64_t> dim;
  Tensor acc;
  for (size_t i = 0; i < terms.size(); ++i) {
    Tensor x = f32(L.tensor(req_in(n, in, i)));
    const std::string& t = terms[i];
    if (int(t.size()) != x.rank()) throw Error(node_label(n) + ": operand " + std::to_string(i) + " has rank " + std::to_string(x.rank()));
    for (size_t a = 0; a < t.size(); ++a) {
      if (t.find(t[a]) != a) throw Error(node_label(n) + ": repeated index in one operand (a diagonal) is not supported");
      if (dim.count(t[a]) && dim[t[a]] != x.dim(int(a)) && x.dim(int(a)) != 1 && dim[t[a]] != 1)
        throw Error(node_label(n) + ": index '" + std::string(1, t[a]) + "' has different sizes");
      dim[t[a]] = std::max(dim.count(t[a]) ? dim[t[a]] : 1, x.dim(int(a)));
    }
    std::vector<int64_t> perm;
    Shape full;
    for (char c : letters) {
      size_t a = t.find(c);
      if (a != std::string::npos) perm.push_back(int64_t(a)), full.push_back(x.dim(int(a)));
      else full.push_back(1);
    }
    bool identity = true;
    for (size_t a = 0; a < perm.size(); ++a) identity = identity && perm[a] == int64_t(a);
    if (!identity) x = permute(x, perm);
    x = reshape(x, full);
    acc = i == 0 ? x : acc * x;
  }
  checked_numel(acc.shape(), node_label(n));
  std::vector<int64_t> summed;
  std::string kept;
  for (size_t a = 0; a < letters.size(); ++a) {
    if (out.find(letters[a]) == std::string::npos) summed.push_back(int64_t(a));
    else kept += letters[a];
  }
  if (!summed.empty()) acc = sum(acc, summed, false);
  std::vector<int64_t> perm;
  for (char c : out) {
    size_t a = kept.find(c);
    if (a == std::string::npos) throw Error(node_label(n) + ": output index '" + std::string(1, c) + "' is in no operand");
    perm.push_back(int64_t(a));
  }
  bool identity = true;
  for (size_t a = 0; a < perm.size(); ++a) identity = identity && perm[a] == int64_t(a);
  if (!identity && perm.size() > 1) acc = permute(acc, perm);
  return {tensor_value(acc)};
}

// Hann, Hamming and Blackman windows of a size known at import time (host constants).
Rule window(int kind) {
  return [kind](Lowering&, const pb::NodeProto& n, Ins& in) -> Outs {
    int64_t size = to_i64(scalar_of(n, host_of(n, in, 0, "size"), "size"));
    if (size < 1) throw Error(node_label(n) + ": size must be >= 1 (empty tensors are not supported)");
    checked_numel({size}, node_label(n));
    double N = attr_i(n, "periodic", 1) ? double(size) : double(size - 1);
    HostTensor h{attr_i(n, "output_datatype", 1) == pb::TensorProto::FLOAT || attr_i(n, "output_datatype", 1) ==
                                                                                     pb::TensorProto::DOUBLE
                     ? Kind::F
                     : Kind::I,
                 {size}, {}};
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < size; ++i) {
      double x = 2 * pi * double(i) / N;
      h.v.push_back(kind == 0   ? 0.5 - 0.5 * std::cos(x)
                    : kind == 1 ? 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x)
                                : 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x));
    }
    return {host_value(std::move(h))};
  };
}

// Compress with a condition known at import time: a gather of the selected positions.
Outs op_compress(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& xv = req_in(n, in, 0);
  const HostTensor& cond = host_of(n, in, 1, "condition");
  Tensor x = L.tensor(xv);
  int axis = 0;
  if (find_attr(n, "axis")) axis = norm_axis(n, attr_i(n, "axis", 0), x.rank());
  else x = reshape(x, {x.numel()});
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < std::min<int64_t>(cond.numel(), x.dim(axis)); ++i)
    if (cond.v[size_t(i)] != 0) idx.push_back(int32_t(i));
  if (idx.empty()) throw Error(node_label(n) + ": nothing selected (empty tensors are not supported)");
  return {tensor_value(gather(x, L.g.constant_i32({int64_t(idx.size())}, idx), axis))};
}

// ConvInteger / MatMulInteger: the integer operands minus their zero points, in f32 (exact below 2^24),
// an i32 result.
Tensor minus_zero_point(Lowering& L, const Value* zp, Tensor x, int per_axis) {
  x = f32(x);
  if (!zp) return x;
  Tensor z = f32(L.tensor(*zp));
  if (z.rank() == 1 && z.dim(0) > 1 && per_axis >= 0) {
    Shape s(size_t(x.rank()), 1);
    s[size_t(per_axis)] = z.dim(0);
    z = reshape(z, s);
  }
  return x - z;
}
Outs op_conv_integer(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Value x = tensor_value(minus_zero_point(L, opt_in(in, 2), L.tensor(req_in(n, in, 0)), 1));
  Value w = tensor_value(minus_zero_point(L, opt_in(in, 3), L.tensor(req_in(n, in, 1)), 0));
  Ins fin = {&x, &w};
  return {tensor_value(cast(round_(L.g, op_conv(L, n, fin)[0].t), DType::I32))};
}
Outs op_matmul_integer(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor a = L.tensor(req_in(n, in, 0));
  Value av = tensor_value(minus_zero_point(L, opt_in(in, 2), a, a.rank() - 2));
  Value bv = tensor_value(minus_zero_point(L, opt_in(in, 3), L.tensor(req_in(n, in, 1)), -1));
  Ins fin = {&av, &bv};
  return {tensor_value(cast(round_(L.g, op_matmul(L, n, fin)[0].t), DType::I32))};
}

// Ops unrolled into one node group per step (TopK's K, a recurrent sequence) stay below this many steps.
constexpr int64_t kMaxUnrolled = 4096;

// RNN, GRU and LSTM unrolled over the (import-time) sequence length: per step, gates from the input's
// projection (all steps in one matmul) and the recurrent projection, as the ONNX spec writes them.
Tensor rnn_act(const pb::NodeProto& n, const std::string& name, Tensor x) {
  if (name == "Sigmoid") return sigmoid(x);
  if (name == "Tanh") return tanh(x);
  if (name == "Relu") return relu(x);
  throw Error(node_label(n) + ": activation '" + name + "' is not supported (Sigmoid, Tanh, Relu)");
}

Rule recurrent(int kind) {  // 0 RNN, 1 GRU, 2 LSTM
  return [kind](Lowering& L, const pb::NodeProto& n, Ins& in) -> Outs {
    const int G = kind == 0 ? 1 : kind == 1 ? 3 : 4;
    Tensor X = f32(L.tensor(req_in(n, in, 0))), W = L.tensor(req_in(n, in, 1)), R = L.tensor(req_in(n, in, 2));
    const bool batch_first = attr_i(n, "layout", 0) != 0;
    if (X.rank() != 3) throw Error(node_label(n) + ": X must be 3-D");
    if (batch_first) X = transpose(X, 0, 1);
    const int64_t S = X.dim(0), B = X.dim(1), I = X.dim(2), H = attr_i(n, "hidden_size", R.dim(-1));
    if (S > kMaxUnrolled) throw Error(node_label(n) + ": sequences above " + std::to_string(kMaxUnrolled) + " steps are not supported");
    const std::string dir = attr_s(n, "direction", "forward");
    const int dirs = dir == "bidirectional" ? 2 : 1;
    if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
      throw Error(node_label(n) + ": unknown direction '" + dir + "'");
    if (W.dim(0) != dirs || W.dim(1) != G * H || R.dim(2) != H) throw Error(node_label(n) + ": W or R has the wrong shape");
    if (find_attr(n, "clip")) throw Error(node_label(n) + ": clip is not supported");
    if (kind == 2 && attr_i(n, "input_forget", 0)) throw Error(node_label(n) + ": input_forget is not supported");
    if (const Value* sl = opt_in(in, 4)) {
      const HostTensor& lens = host_of(n, in, 4, "sequence_lens");
      for (double v : lens.v)
        if (int64_t(v) != S) throw Error(node_label(n) + ": sequence_lens shorter than the sequence are not supported");
      (void)sl;
    }
    std::vector<std::string> acts;
    if (const auto* a = find_attr(n, "activations")) acts.assign(a->strings().begin(), a->strings().end());
    const size_t per_dir = kind == 0 ? 1 : kind == 1 ? 2 : 3;
    std::vector<std::string> defaults = kind == 0   ? std::vector<std::string>{"Tanh"}
                                        : kind == 1 ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                    : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    std::vector<Tensor> ys, hs, cs;
    for (int d = 0; d < dirs; ++d) {
      auto act = [&](size_t k, Tensor x) {
        size_t i = size_t(d) * per_dir + k;
        return rnn_act(n, i < acts.size() ? acts[i] : defaults[k], x);
      };
      Tensor Wd = reshape(slice(W, 0, d, d + 1), {G * H, I}), Rd = reshape(slice(R, 0, d, d + 1), {G * H, H});
      Tensor XW = reshape(matmul(reshape(X, {S * B, I}), Wd, false, true), {S, B, G * H});
      std::optional<Tensor> Wb, Rb;
      if (const Value* b = opt_in(in, 3)) {
        Tensor Bd = reshape(slice(L.tensor(*b), 0, d, d + 1), {2 * G * H});
        Wb = slice(Bd, 0, 0, G * H), Rb = slice(Bd, 0, G * H, 2 * G * H);
        XW = XW + *Wb;
      }
      Tensor h = L.g.full({B, H}, 0.0), c = L.g.full({B, H}, 0.0);
      if (const Value* h0 = opt_in(in, 5)) h = reshape(slice(L.tensor(*h0), 0, d, d + 1), {B, H});
      if (kind == 2)
        if (const Value* c0 = opt_in(in, 6)) c = reshape(slice(L.tensor(*c0), 0, d, d + 1), {B, H});
      std::optional<Tensor> P;
      if (kind == 2)
        if (const Value* p = opt_in(in, 7)) P = reshape(slice(L.tensor(*p), 0, d, d + 1), {3 * H});
      auto gate = [&](Tensor t, int k) { return slice(t, -1, k * H, (k + 1) * H); };
      bool reverse = dir == "reverse" || d == 1;
      std::vector<Tensor> steps(static_cast<size_t>(S));
      for (int64_t s = 0; s < S; ++s) {
        int64_t t = reverse ? S - 1 - s : s;
        Tensor xw = reshape(slice(XW, 0, t, t + 1), {B, G * H});
        if (kind == 0) {
          Tensor hr = matmul(h, Rd, false, true);
          if (Rb) hr = hr + *Rb;
          h = act(0, xw + hr);
        } else if (kind == 1) {
          Tensor Rzr = slice(Rd, 0, 0, 2 * H), Rh = slice(Rd, 0, 2 * H, 3 * H);
          Tensor hzr = matmul(h, Rzr, false, true);
          if (Rb) hzr = hzr + slice(*Rb, 0, 0, 2 * H);
          Tensor z = act(0, gate(xw, 0) + gate(hzr, 0)), r = act(0, gate(xw, 1) + gate(hzr, 1));
          Tensor hh;
          if (attr_i(n, "linear_before_reset", 0)) {
            Tensor hr = matmul(h, Rh, false, true);
            if (Rb) hr = hr + slice(*Rb, 0, 2 * H, 3 * H);
            hh = act(1, gate(xw, 2) + r * hr);
          } else {
            Tensor hr = matmul(r * h, Rh, false, true);
            if (Rb) hr = hr + slice(*Rb, 0, 2 * H, 3 * H);
            hh = act(1, gate(xw, 2) + hr);
          }
          h = (1.0 - z) * hh + z * h;
        } else {
          Tensor g = xw + matmul(h, Rd, false, true);
          if (Rb) g = g + *Rb;
          Tensor gi = gate(g, 0), go = gate(g, 1), gf = gate(g, 2), gc = gate(g, 3);
          if (P) gi = gi + slice(*P, 0, 0, H) * c, gf = gf + slice(*P, 0, 2 * H, 3 * H) * c;
          Tensor i = act(0, gi), f = act(0, gf), cc = act(1, gc);
          c = f * c + i * cc;
          if (P) go = go + slice(*P, 0, H, 2 * H) * c;
          h = act(0, go) * act(2, c);
        }
        steps[size_t(t)] = unsqueeze(h, 0);
      }
      ys.push_back(unsqueeze(concat(steps, 0), 1));  // [S, 1, B, H]
      hs.push_back(unsqueeze(h, 0));
      cs.push_back(unsqueeze(c, 0));
    }
    Tensor Y = dirs == 1 ? ys[0] : concat(ys, 1), Yh = dirs == 1 ? hs[0] : concat(hs, 0),
           Yc = dirs == 1 ? cs[0] : concat(cs, 0);
    if (batch_first) Y = permute(Y, {2, 0, 1, 3}), Yh = transpose(Yh, 0, 1), Yc = transpose(Yc, 0, 1);
    Outs o = {tensor_value(Y), tensor_value(Yh)};
    if (kind == 2) o.push_back(tensor_value(Yc));
    return o;
  };
}

// Quantization: round half to even and saturate to the zero point's integer type (uint8 when absent).
std::pair<double, double> quant_range(const pb::NodeProto& n, int elem) {
  switch (elem) {
    case 0:
    case pb::TensorProto::UINT8: return {0, 255};
    case pb::TensorProto::INT8: return {-128, 127};
    case pb::TensorProto::UINT16: return {0, 65535};
    case pb::TensorProto::INT16: return {-32768, 32767};
    default: throw Error(node_label(n) + ": zero point element type " + std::to_string(elem) + " is not supported");
  }
}
// A per-axis quantization parameter ([C] along `axis`) shaped to broadcast against `like`.
Tensor per_axis(const pb::NodeProto& n, Tensor p, const Tensor& like, int64_t axis_attr) {
  if (p.rank() == 1 && p.dim(0) > 1) {
    int axis = norm_axis(n, axis_attr, like.rank());
    Shape s(size_t(like.rank()), 1);
    s[size_t(axis)] = p.dim(0);
    return reshape(p, s);
  }
  return p.rank() == 1 ? reshape(p, {}) : p;
}
Tensor quantize(Lowering& L, const pb::NodeProto& n, Tensor real, Tensor scale, const Value* zp, int64_t axis) {
  auto [lo, hi] = quant_range(n, zp ? zp->elem_type() : 0);
  Tensor q = round_(L.g, real / per_axis(n, f32(scale), real, axis));
  if (zp) q = q + per_axis(n, f32(L.tensor(*zp)), real, axis);
  return cast(clamp(q, lo, hi), DType::I32);
}
Tensor dequantize(Lowering& L, const pb::NodeProto& n, Tensor x, const Value& scale, const Value* zp, int64_t axis) {
  x = f32(x);
  if (zp) x = x - per_axis(n, f32(L.tensor(*zp)), x, axis);
  return x * per_axis(n, f32(L.tensor(scale)), x, axis);
}

Outs op_quantize(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0)));
  return {tensor_value(quantize(L, n, x, L.tensor(req_in(n, in, 1)), opt_in(in, 2), attr_i(n, "axis", 1)))};
}

Outs op_dynamic_quantize(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0)));
  Tensor lo = minimum(min(x), L.g.scalar(0.0)), hi = maximum(max(x), L.g.scalar(0.0));
  Tensor scale = (hi - lo) / 255.0;
  Tensor zp = clamp(round_(L.g, -lo / scale), 0, 255);
  Tensor y = clamp(round_(L.g, x / scale) + zp, 0, 255);
  return {tensor_value(cast(y, DType::I32)), tensor_value(scale), tensor_value(cast(zp, DType::I32))};
}

Outs op_qlinear_matmul(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor a = dequantize(L, n, L.tensor(req_in(n, in, 0)), req_in(n, in, 1), opt_in(in, 2), -2);
  Tensor b = dequantize(L, n, L.tensor(req_in(n, in, 3)), req_in(n, in, 4), opt_in(in, 5), -1);
  Value av = tensor_value(a), bv = tensor_value(b);
  Ins fin = {&av, &bv};
  Tensor y = op_matmul(L, n, fin)[0].t;
  return {tensor_value(quantize(L, n, y, L.tensor(req_in(n, in, 6)), opt_in(in, 7), -1))};
}

Outs op_qlinear_conv(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = dequantize(L, n, L.tensor(req_in(n, in, 0)), req_in(n, in, 1), opt_in(in, 2), 1);
  Tensor w = dequantize(L, n, L.tensor(req_in(n, in, 3)), req_in(n, in, 4), opt_in(in, 5), 0);
  Value xv = tensor_value(x), wv = tensor_value(w);
  Ins fin = {&xv, &wv};
  Tensor y = op_conv(L, n, fin)[0].t;
  if (const Value* b = opt_in(in, 8)) {  // int32 bias in units of x_scale · w_scale
    Tensor s = f32(L.tensor(req_in(n, in, 1))) * f32(L.tensor(req_in(n, in, 4)));
    Tensor bias = f32(L.tensor(*b)) * s;
    Shape bs(size_t(y.rank()) - 1, 1);
    bs[0] = y.dim(1);
    y = y + reshape(bias, bs);
  }
  return {tensor_value(quantize(L, n, y, L.tensor(req_in(n, in, 6)), opt_in(in, 7), 1))};
}

// Sequences exist only at import time: a sequence value is a list of values, positions must be known.
const Value& seq_in(const pb::NodeProto& n, const Ins& in, size_t i) {
  const Value& v = req_in(n, in, i);
  if (!v.is_seq) throw Error(node_label(n) + ": input " + std::to_string(i) + " must be a sequence");
  return v;
}
Value seq_value(std::vector<Value> items) {
  Value v;
  v.is_seq = true;
  v.seq = std::move(items);
  return v;
}
int64_t seq_pos(const pb::NodeProto& n, const Ins& in, size_t i, int64_t size, int64_t dflt, bool insert) {
  if (!opt_in(in, i)) return dflt;
  int64_t p = to_i64(scalar_of(n, host_of(n, in, i, "position"), "position"));
  int64_t hi = insert ? size : size - 1;
  if (p < -size || p > hi) throw Error(node_label(n) + ": position " + std::to_string(p) + " is out of range");
  return p < 0 ? p + size : p;
}
Outs op_sequence_construct(Lowering&, const pb::NodeProto& n, Ins& in) {
  std::vector<Value> items;
  for (size_t i = 0; i < in.size(); ++i) items.push_back(req_in(n, in, i));
  return {seq_value(std::move(items))};
}
Outs op_sequence_empty(Lowering&, const pb::NodeProto&, Ins&) { return {seq_value({})}; }
Outs op_sequence_at(Lowering&, const pb::NodeProto& n, Ins& in) {
  const Value& s = seq_in(n, in, 0);
  return {s.seq.at(size_t(seq_pos(n, in, 1, int64_t(s.seq.size()), 0, false)))};
}
Outs op_sequence_insert(Lowering&, const pb::NodeProto& n, Ins& in) {
  std::vector<Value> items = seq_in(n, in, 0).seq;
  int64_t p = seq_pos(n, in, 2, int64_t(items.size()), int64_t(items.size()), true);
  items.insert(items.begin() + p, req_in(n, in, 1));
  return {seq_value(std::move(items))};
}
Outs op_sequence_erase(Lowering&, const pb::NodeProto& n, Ins& in) {
  std::vector<Value> items = seq_in(n, in, 0).seq;
  if (items.empty()) throw Error(node_label(n) + ": the sequence is empty");
  items.erase(items.begin() + seq_pos(n, in, 1, int64_t(items.size()), int64_t(items.size()) - 1, false));
  return {seq_value(std::move(items))};
}
Outs op_sequence_length(Lowering&, const pb::NodeProto& n, Ins& in) {
  return {host_value(HostTensor{Kind::I, {}, {double(seq_in(n, in, 0).seq.size())}})};
}
Outs op_split_to_sequence(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& x = req_in(n, in, 0);
  int axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape().size()));
  int64_t d = x.shape()[size_t(axis)];
  std::vector<int64_t> sizes;
  bool keep = attr_i(n, "keepdims", 1) != 0;
  if (opt_in(in, 1)) {
    const HostTensor& sp = host_of(n, in, 1, "split");
    if (sp.shape.empty()) {
      int64_t each = to_i64(sp.v.at(0));
      for (int64_t left = d; left > 0; left -= each) sizes.push_back(std::min(each, left));
    } else {
      sizes = ints_of(sp);
    }
    keep = true;
  } else {
    sizes.assign(size_t(d), 1);
  }
  std::vector<Value> items;
  for (Tensor t : split(L.tensor(x), sizes, axis)) items.push_back(tensor_value(keep ? t : squeeze(t, axis)));
  return {seq_value(std::move(items))};
}
Outs op_concat_from_sequence(Lowering& L, const pb::NodeProto& n, Ins& in) {
  const Value& s = seq_in(n, in, 0);
  if (s.seq.empty()) throw Error(node_label(n) + ": the sequence is empty");
  bool stack = attr_i(n, "new_axis", 0) != 0;
  int64_t r = int64_t(s.seq[0].shape().size()) + (stack ? 1 : 0);
  int axis = norm_axis(n, attr_i(n, "axis", 0), r);
  std::vector<Tensor> ts;
  for (const Value& v : s.seq) ts.push_back(stack ? unsqueeze(L.tensor(v), axis) : L.tensor(v));
  return {tensor_value(concat(ts, axis))};
}

// GridSample (2-D; bilinear and nearest; zeros, border and reflection padding) as PyTorch's grid_sample
// computes it: unnormalize, clip or reflect the coordinates, then a weighted gather of the taps (taps
// outside the image read zero).
Outs op_grid_sample(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Graph& g = L.g;
  Tensor x = f32(L.tensor(req_in(n, in, 0))), grid = f32(L.tensor(req_in(n, in, 1)));
  if (x.rank() != 4 || grid.rank() != 4 || grid.dim(3) != 2) throw Error(node_label(n) + ": only 2-D sampling is supported");
  const std::string mode = attr_s(n, "mode", "bilinear"), padding = attr_s(n, "padding_mode", "zeros");
  const bool align = attr_i(n, "align_corners", 0) != 0;
  if (mode != "bilinear" && mode != "nearest") throw Error(node_label(n) + ": mode '" + mode + "' is not supported");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    throw Error(node_label(n) + ": padding_mode '" + padding + "' is not supported");
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), Ho = grid.dim(1), Wo = grid.dim(2);
  auto coord = [&](int k, int64_t size) {
    Tensor c = reshape(slice(grid, 3, k, k + 1), {N, Ho, Wo});
    c = align ? (c + 1.0) * (0.5 * double(size - 1)) : ((c + 1.0) * double(size) - 1.0) * 0.5;
    if (padding == "border") c = clamp(c, 0.0, double(size - 1));
    if (padding == "reflection") {
      double lo = align ? 0.0 : -0.5, span = align ? double(size - 1) : double(size);
      if (span > 0) {
        Tensor a = abs(c - lo);
        Tensor flips = floor_(g, a / span);
        Tensor extra = a - flips * span;
        Tensor even = equal(flips - 2.0 * floor_(g, flips * 0.5), g.scalar(0.0));
        c = where(even, extra + lo, (span - extra) + lo);
      } else {
        c = c * 0.0;
      }
      c = clamp(c, 0.0, double(size - 1));
    }
    return c;
  };
  Tensor cx = coord(0, W), cy = coord(1, H);
  Tensor flat = reshape(x, {N, C, H * W});
  auto tap = [&](Tensor xi, Tensor yi, Tensor w) {
    Tensor inside = cast(greater_equal(xi, g.scalar(0.0)), DType::F32) * cast(less_equal(xi, g.scalar(double(W - 1))), DType::F32) *
                    cast(greater_equal(yi, g.scalar(0.0)), DType::F32) * cast(less_equal(yi, g.scalar(double(H - 1))), DType::F32);
    Tensor idx = clamp(yi, 0.0, double(H - 1)) * double(W) + clamp(xi, 0.0, double(W - 1));
    Tensor i32 = expand(reshape(cast(round_(g, idx), DType::I32), {N, 1, Ho * Wo}), {N, C, Ho * Wo});
    return gather_elements(flat, i32, 2) * reshape(w * inside, {N, 1, Ho * Wo});
  };
  Tensor y;
  if (mode == "nearest") {
    y = tap(round_(g, cx), round_(g, cy), g.full({N, Ho, Wo}, 1.0));
  } else {
    Tensor x0 = floor_(g, cx), y0 = floor_(g, cy);
    Tensor wx1 = cx - x0, wy1 = cy - y0, wx0 = 1.0 - wx1, wy0 = 1.0 - wy1;
    y = tap(x0, y0, wx0 * wy0) + tap(x0 + 1.0, y0, wx1 * wy0) + tap(x0, y0 + 1.0, wx0 * wy1) + tap(x0 + 1.0, y0 + 1.0, wx1 * wy1);
  }
  return {tensor_value(reshape(y, {N, C, Ho, Wo}))};
}

// TopK by K rounds of argmax (the first of equal values wins, as ONNX orders ties), each masking its pick.
Outs op_topk(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  const DType dt = x.dtype();
  int axis = norm_axis(n, attr_i(n, "axis", -1), x.rank());
  int64_t k = L.opset < 10 ? attr_i(n, "k", 0) : to_i64(scalar_of(n, host_of(n, in, 1, "K"), "K"));
  int64_t d = x.dim(axis);
  if (k < 1 || k > d) throw Error(node_label(n) + ": K = " + std::to_string(k) + " must be in [1, " + std::to_string(d) + "]");
  if (k > kMaxUnrolled) throw Error(node_label(n) + ": K above " + std::to_string(kMaxUnrolled) + " is not supported");
  const bool largest = attr_i(n, "largest", 1) != 0;
  Tensor t = f32(x);
  if (axis != t.rank() - 1) t = transpose(t, axis, -1);
  Tensor work = largest ? t : -t;
  std::vector<Tensor> vals, idxs;
  for (int64_t j = 0; j < k; ++j) {
    Tensor i = argmax(work, -1, true);
    Tensor pick = gather_elements(t, i, t.rank() - 1);
    vals.push_back(pick);
    idxs.push_back(i);
    if (j + 1 < k) {
      Tensor hit = greater(one_hot(squeeze(i, -1), d), L.g.scalar(0.5));
      work = where(hit, L.g.scalar(-INFINITY), work);
    }
  }
  Tensor v = k == 1 ? vals[0] : concat(vals, -1), ix = k == 1 ? idxs[0] : concat(idxs, -1);
  if (axis != t.rank() - 1) v = transpose(v, axis, -1), ix = transpose(ix, axis, -1);
  return {tensor_value(back_to(v, dt)), tensor_value(ix)};
}

// ReverseSequence with lengths known at import time: a gather along the time axis by per-batch positions.
Outs op_reverse_sequence(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = L.tensor(req_in(n, in, 0));
  std::vector<int64_t> lens = ints_of(host_of(n, in, 1, "sequence_lens"));
  int ta = norm_axis(n, attr_i(n, "time_axis", 0), x.rank()), ba = norm_axis(n, attr_i(n, "batch_axis", 1), x.rank());
  int64_t T = x.dim(ta), B = x.dim(ba);
  if (int64_t(lens.size()) != B) throw Error(node_label(n) + ": sequence_lens must have one value per batch");
  Shape is(size_t(x.rank()), 1);
  is[size_t(ta)] = T, is[size_t(ba)] = B;
  std::vector<int32_t> idx(size_t(T * B));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      int64_t src = t < lens[size_t(b)] ? lens[size_t(b)] - 1 - t : t;
      idx[size_t(ta < ba ? t * B + b : b * T + t)] = int32_t(src);
    }
  const Shape xs = x.shape();
  Tensor i = expand(L.g.constant_i32(is, idx), xs);
  return {tensor_value(gather_elements(x, i, ta))};
}

// MaxUnpool: the values scattered to their flat positions (MaxPool's Indices) in a zero tensor.
Outs op_max_unpool(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0)));
  Tensor idx = L.tensor(req_in(n, in, 1), DType::I32);
  if (x.rank() != 4) throw Error(node_label(n) + ": only 2-D unpooling is supported");
  std::vector<int64_t> k = attr_ints(n, "kernel_shape"), s = attr_ints(n, "strides", {1, 1}),
                       p = attr_ints(n, "pads", {0, 0, 0, 0});
  if (k.size() != 2 || s.size() != 2 || p.size() != 4) throw Error(node_label(n) + ": kernel_shape/strides/pads");
  Shape out = {x.dim(0), x.dim(1), (x.dim(2) - 1) * s[0] + k[0] - p[0] - p[2], (x.dim(3) - 1) * s[1] + k[1] - p[1] - p[3]};
  if (opt_in(in, 2)) {
    // The indices address the default output; re-address them in the requested (larger) one.
    Shape want = ints_of(host_of(n, in, 2, "output_shape"));
    if (want.size() != 4 || want[0] != out[0] || want[1] != out[1] || want[2] < out[2] || want[3] < out[3])
      throw Error(node_label(n) + ": output_shape " + shape_str(want) + " cannot hold " + shape_str(out));
    Tensor f = f32(idx);
    double plane = double(out[2] * out[3]), w = double(out[3]);
    Tensor pl = floor_(L.g, f / plane + 1e-7), rem = f - pl * plane;
    Tensor r = floor_(L.g, rem / w + 1e-7), c = rem - r * w;
    idx = cast(round_(L.g, pl * double(want[2] * want[3]) + r * double(want[3]) + c), DType::I32);
    out = want;
  }
  int64_t total = checked_numel(out, node_label(n));
  Tensor y = scatter_elements(L.g.full({total}, 0.0), reshape(idx, {x.numel()}), reshape(x, {x.numel()}), 0,
                              ScatterReduction::None);
  return {tensor_value(reshape(y, out))};
}

// atan by argument reduction (|x| > 1 through π/2 − atan(1/x), then two half-angle steps
// t → t / (1 + √(1 + t²)) down to |t| ≤ 0.2) and the odd Taylor series to t^19 (error below 1e-14).
Tensor atan_(Graph& g, Tensor x) {
  const double half_pi = 1.57079632679489661923;
  Tensor big = greater(abs(x), g.scalar(1.0));
  Tensor t = where(big, 1.0 / where(big, x, g.scalar(1.0)), x);
  for (int i = 0; i < 2; ++i) t = t / (1.0 + sqrt(1.0 + square(t)));
  Tensor t2 = square(t), term = t, acc = t;
  for (int k = 1; k <= 9; ++k) {
    term = term * t2;
    acc = acc + term * ((k % 2 ? -1.0 : 1.0) / double(2 * k + 1));
  }
  acc = acc * 4.0;  // undo the two halvings
  Tensor outside = where(greater(x, g.scalar(0.0)), half_pi - acc, -half_pi - acc);
  return where(big, outside, acc);
}
Tensor asin_(Graph& g, Tensor x) {
  // asin x = atan(x / √(1 − x²)); ±1 map to ±π/2 through the division by zero.
  Tensor r = sqrt(1.0 - square(x));
  Tensor edge = equal(r, g.scalar(0.0));
  Tensor a = atan_(g, x / where(edge, g.scalar(1.0), r));
  return where(edge, x * 1.57079632679489661923, a);
}
Tensor acos_(Graph& g, Tensor x) { return 1.57079632679489661923 - asin_(g, x); }

// Det of 1×1, 2×2 and 3×3 matrices (cofactor expansion) over the last two axes.
Outs op_det(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0)));
  if (x.rank() < 2 || x.dim(-1) != x.dim(-2) || x.dim(-1) > 3)
    throw Error(node_label(n) + ": only 1x1, 2x2 and 3x3 matrices are supported");
  const int64_t m = x.dim(-1);
  Shape lead(x.shape().begin(), x.shape().end() - 2);
  auto e = [&](int64_t i, int64_t j) {
    return reshape(slice(slice(x, x.rank() - 2, i, i + 1), x.rank() - 1, j, j + 1), lead);
  };
  Tensor d;
  if (m == 1) d = e(0, 0);
  else if (m == 2) d = e(0, 0) * e(1, 1) - e(0, 1) * e(1, 0);
  else
    d = e(0, 0) * (e(1, 1) * e(2, 2) - e(1, 2) * e(2, 1)) - e(0, 1) * (e(1, 0) * e(2, 2) - e(1, 2) * e(2, 0)) +
        e(0, 2) * (e(1, 0) * e(2, 1) - e(1, 1) * e(2, 0));
  return {tensor_value(d)};
}

// NonZero's output shape depends on the values: only for inputs known at import time.
Outs op_nonzero(Lowering&, const pb::NodeProto& n, Ins& in) {
  const HostTensor& x = host_of(n, in, 0, "X");
  std::vector<std::vector<int64_t>> hits;
  for_each_index(x.shape, [&](const std::vector<int64_t>& idx, int64_t k) {
    if (x.v[size_t(k)] != 0) hits.push_back(idx);
  });
  if (hits.empty()) throw Error(node_label(n) + ": no non-zero element (empty tensors are not supported)");
  HostTensor h{Kind::I, {int64_t(x.shape.size()), int64_t(hits.size())}, {}};
  for (size_t a = 0; a < x.shape.size(); ++a)
    for (const auto& idx : hits) h.v.push_back(double(idx[a]));
  return {host_value(std::move(h))};
}

// DFT (opset 17) as matmuls with cos/sin matrices along `axis`; the last axis holds [re] or [re, im].
Outs op_dft(Lowering& L, const pb::NodeProto& n, Ins& in) {
  Tensor x = f32(L.tensor(req_in(n, in, 0)));
  int axis = norm_axis(n, attr_i(n, "axis", 1), x.rank() - 1);
  const bool inverse = attr_i(n, "inverse", 0) != 0, onesided = attr_i(n, "onesided", 0) != 0;
  const int64_t len = x.dim(axis), c = x.dim(-1);
  if (opt_in(in, 1) && to_i64(scalar_of(n, host_of(n, in, 1, "dft_length"), "dft_length")) != len)
    throw Error(node_label(n) + ": dft_length different from the axis is not supported");
  if (c != 1 && c != 2) throw Error(node_label(n) + ": the last axis must hold 1 (real) or 2 (complex) values");
  const int64_t out = onesided ? len / 2 + 1 : len;
  checked_numel({len, out}, node_label(n) + " (its DFT matrix)");
  std::vector<float> cs(size_t(len * out)), sn(size_t(len * out));
  const double sign = inverse ? 1.0 : -1.0, pi = 3.14159265358979323846;
  for (int64_t j = 0; j < len; ++j)
    for (int64_t k = 0; k < out; ++k) {
      double a = 2 * pi * double((j * k) % len) / double(len);
      cs[size_t(j * out + k)] = float(std::cos(a));
      sn[size_t(j * out + k)] = float(sign * std::sin(a));
    }
  Tensor C = L.g.constant({len, out}, cs), S = L.g.constant({len, out}, sn);
  // Move `axis` last (dropping the complex axis), transform, move it back.
  auto part = [&](int64_t k) { return transpose(squeeze(slice(x, x.rank() - 1, k, k + 1), x.rank() - 1), axis, -1); };
  Tensor re = part(0);
  Tensor yr = matmul(re, C), yi = matmul(re, S);
  if (c == 2) {
    Tensor im = part(1);
    yr = yr - matmul(im, S);
    yi = yi + matmul(im, C);
  }
  if (inverse) yr = yr / double(len), yi = yi / double(len);
  yr = unsqueeze(transpose(yr, axis, -1), -1);
  yi = unsqueeze(transpose(yi, axis, -1), -1);
  return {tensor_value(concat({yr, yi}, -1))};
}

// Unique's output shape depends on the values: only for inputs known at import time (host computation;
// slices along `axis` compare lexicographically when sorted).
Outs op_unique(Lowering&, const pb::NodeProto& n, Ins& in) {
  const HostTensor& x = host_of(n, in, 0, "X");
  const bool sorted = attr_i(n, "sorted", 1) != 0, has_axis = find_attr(n, "axis") != nullptr;
  HostTensor flat = x;
  int axis = 0;
  if (!has_axis) flat.shape = {x.numel()};
  else axis = norm_axis(n, attr_i(n, "axis", 0), int64_t(x.shape.size()));
  const Shape& s = flat.shape;
  int64_t outer = 1, inner = 1, d = s[size_t(axis)];
  for (int i = 0; i < axis; ++i) outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) inner *= s[i];
  auto slice_of = [&](int64_t j) {
    std::vector<double> v;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < inner; ++k) v.push_back(flat.v[size_t((o * d + j) * inner + k)]);
    return v;
  };
  std::vector<std::vector<double>> keys;
  std::vector<int64_t> first, counts, inverse(static_cast<size_t>(d), 0);
  for (int64_t j = 0; j < d; ++j) {
    std::vector<double> v = slice_of(j);
    auto it = std::find(keys.begin(), keys.end(), v);
    if (it == keys.end()) {
      keys.push_back(v), first.push_back(j), counts.push_back(0);
      it = keys.end() - 1;
    }
    counts[size_t(it - keys.begin())]++;
  }
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (sorted) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<size_t> rank(keys.size());
  for (size_t r = 0; r < order.size(); ++r) rank[order[r]] = r;
  for (int64_t j = 0; j < d; ++j)
    inverse[size_t(j)] = int64_t(rank[size_t(std::find(keys.begin(), keys.end(), slice_of(j)) - keys.begin())]);
  const int64_t u = int64_t(keys.size());
  Shape ys = s;
  ys[size_t(axis)] = u;
  HostTensor y{x.kind, ys, std::vector<double>(size_t(outer * u * inner)), x.elem};
  for (int64_t r = 0; r < u; ++r) {
    const auto& v = keys[order[size_t(r)]];
    size_t p = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < inner; ++k) y.v[size_t((o * u + r) * inner + k)] = v[p++];
  }
  HostTensor idx{Kind::I, {u}, {}}, inv{Kind::I, {d}, {}}, cnt{Kind::I, {u}, {}};
  for (size_t r : order) idx.v.push_back(double(first[r])), cnt.v.push_back(double(counts[r]));
  for (int64_t j : inverse) inv.v.push_back(double(j));
  return {host_value(std::move(y)), host_value(std::move(idx)), host_value(std::move(inv)), host_value(std::move(cnt))};
}

double h_add(double a, double b, bool) { return a + b; }
double h_sub(double a, double b, bool) { return a - b; }
double h_mul(double a, double b, bool) { return a * b; }
double h_div(double a, double b, bool integer) {
  if (integer) {
    if (b == 0) throw Error("integer division by zero");
    return std::trunc(a / b);
  }
  return a / b;
}
double h_eq(double a, double b, bool) { return a == b; }
double h_lt(double a, double b, bool) { return a < b; }
double h_gt(double a, double b, bool) { return a > b; }
double h_le(double a, double b, bool) { return a <= b; }
double h_ge(double a, double b, bool) { return a >= b; }
double h_neg(double a) { return -a; }
double h_abs(double a) { return std::fabs(a); }
double h_sqrt(double a) { return std::sqrt(a); }
double h_recip(double a) { return 1.0 / a; }

Tensor relu_(Tensor x) { return relu(x); }

}  // namespace

const std::map<std::string, Rule>& op_table() {
  static const std::map<std::string, Rule> table = {
      {"Add", binary(add, h_add, false)},
      {"Sub", binary(sub, h_sub, false)},
      {"Mul", binary(mul, h_mul, false)},
      {"Div", binary(div, h_div, false)},
      {"Equal", binary(equal, h_eq, true)},
      {"Less", binary(less, h_lt, true)},
      {"Greater", binary(greater, h_gt, true)},
      {"LessOrEqual", binary(less_equal, h_le, true)},
      {"GreaterOrEqual", binary(greater_equal, h_ge, true)},
      {"Pow", op_pow},
      {"Max", minmax(maximum, true)},
      {"Min", minmax(minimum, false)},
      {"Neg", unary(neg, h_neg)},
      {"Abs", unary(abs, h_abs)},
      {"Sqrt", unary(sqrt, h_sqrt)},
      {"Reciprocal", unary(reciprocal, h_recip)},
      {"Exp", unary(exp, nullptr)},
      {"Log", unary(log, nullptr)},
      {"Relu", unary(relu_, nullptr)},
      {"Sigmoid", unary(sigmoid, nullptr)},
      {"Tanh", unary(tanh, nullptr)},
      {"Erf", unary(erf, nullptr)},
      {"Sin", unary(sin, nullptr)},
      {"Cos", unary(cos, nullptr)},
      {"Softplus", unary(softplus, nullptr)},
      {"LeakyRelu", op_leaky_relu},
      {"Gelu", op_gelu},
      {"Softmax", softmax_rule(softmax)},
      {"LogSoftmax", softmax_rule(log_softmax)},
      {"MatMul", op_matmul},
      {"Gemm", op_gemm},
      {"Conv", op_conv},
      {"ConvTranspose", op_conv_transpose},
      {"MaxPool", pool(true)},
      {"AveragePool", pool(false)},
      {"GlobalAveragePool", op_global_avg_pool},
      {"BatchNormalization", op_batch_norm},
      {"LayerNormalization", op_layer_norm},
      {"ReduceMean", reduce(mean, false)},
      {"ReduceSum", reduce(sum, true)},
      {"ReduceMax", reduce(max, false)},
      {"ReduceMin", reduce(min, false)},
      {"Reshape", op_reshape},
      {"Transpose", op_transpose},
      {"Flatten", op_flatten},
      {"Squeeze", op_squeeze},
      {"Unsqueeze", op_unsqueeze},
      {"Concat", op_concat},
      {"Split", op_split},
      {"Slice", op_slice},
      {"Gather", op_gather},
      {"GatherElements", op_gather_elements},
      {"ScatterElements", op_scatter_elements},
      {"Expand", op_expand},
      {"Where", op_where},
      {"Not", op_not},
      {"And", logical(lower_and, h_and)},
      {"Or", logical(lower_or, h_or)},
      {"Xor", logical(lower_xor, h_xor)},
      {"Cast", op_cast},
      {"Constant", op_constant},
      {"ConstantOfShape", op_constant_of_shape},
      {"Shape", op_shape},
      {"Range", op_range},
      {"Identity", op_identity},
      {"Dropout", op_dropout},
      {"Pad", op_pad},
      {"Clip", op_clip},
      {"Trilu", op_trilu},
      {"Upsample", op_resize},
      {"Resize", op_resize},
      {"Sum", variadic(false)},
      {"Mean", variadic(true)},
      {"Size", op_size},
      {"CastLike", op_cast_like},
      {"PRelu", op_prelu},
      {"ArgMax", arg_rule(false)},
      {"ArgMin", arg_rule(true)},
      {"Hardmax", op_hardmax},
      {"ReduceL1", reduce(reduce_l1, false)},
      {"ReduceL2", reduce(reduce_l2, false)},
      {"ReduceSumSquare", reduce(reduce_sum_square, false)},
      {"ReduceLogSum", reduce(reduce_log_sum, false)},
      {"ReduceLogSumExp", reduce(reduce_log_sum_exp, false)},
      {"ReduceProd", op_reduce_prod},
      {"Mod", op_mod},
      {"CumSum", op_cumsum},
      {"Tile", op_tile},
      {"DepthToSpace", op_depth_to_space},
      {"SpaceToDepth", op_space_to_depth},
      {"GlobalMaxPool", op_global_max_pool},
      {"InstanceNormalization", op_instance_norm},
      {"MeanVarianceNormalization", op_mvn},
      {"LpNormalization", op_lp_norm},
      {"EyeLike", op_eye_like},
      {"NegativeLogLikelihoodLoss", op_nll_loss},
      {"SoftmaxCrossEntropyLoss", op_softmax_ce_loss},
      {"Floor", float_unary(floor_)},
      {"Ceil", float_unary(ceil_)},
      {"Round", float_unary(round_)},
      {"Sign", float_unary(sign_)},
      {"Tan", float_unary(tan_)},
      {"Sinh", float_unary(sinh_)},
      {"Cosh", float_unary(cosh_)},
      {"Asinh", float_unary(asinh_)},
      {"Acosh", float_unary(acosh_)},
      {"Atanh", float_unary(atanh_)},
      {"Softsign", float_unary(softsign_)},
      {"Mish", float_unary(mish_)},
      {"IsNaN", op_isnan},
      {"IsInf", op_isinf},
      {"Elu", op_elu},
      {"Selu", op_selu},
      {"Celu", op_celu},
      {"ThresholdedRelu", op_thresholded_relu},
      {"HardSigmoid", op_hard_sigmoid},
      {"HardSwish", op_hard_swish},
      {"Shrink", op_shrink},
      {"OneHot", op_one_hot},
      {"BitShift", op_bit_shift},
      {"GatherND", op_gather_nd},
      {"ScatterND", op_scatter_nd},
      {"Scatter", op_scatter_elements},
      {"LRN", op_lrn},
      {"DequantizeLinear", op_dequantize},
      {"Einsum", op_einsum},
      {"HannWindow", window(0)},
      {"HammingWindow", window(1)},
      {"BlackmanWindow", window(2)},
      {"Compress", op_compress},
      {"ConvInteger", op_conv_integer},
      {"MatMulInteger", op_matmul_integer},
      {"RNN", recurrent(0)},
      {"GRU", recurrent(1)},
      {"LSTM", recurrent(2)},
      {"QuantizeLinear", op_quantize},
      {"DynamicQuantizeLinear", op_dynamic_quantize},
      {"QLinearMatMul", op_qlinear_matmul},
      {"QLinearConv", op_qlinear_conv},
      {"SequenceConstruct", op_sequence_construct},
      {"SequenceEmpty", op_sequence_empty},
      {"SequenceAt", op_sequence_at},
      {"SequenceInsert", op_sequence_insert},
      {"SequenceErase", op_sequence_erase},
      {"SequenceLength", op_sequence_length},
      {"SplitToSequence", op_split_to_sequence},
      {"ConcatFromSequence", op_concat_from_sequence},
      {"GridSample", op_grid_sample},
      {"TopK", op_topk},
      {"ReverseSequence", op_reverse_sequence},
      {"MaxUnpool", op_max_unpool},
      {"Atan", float_unary(atan_)},
      {"Asin", float_unary(asin_)},
      {"Acos", float_unary(acos_)},
      {"Det", op_det},
      {"NonZero", op_nonzero},
      {"DFT", op_dft},
      {"Unique", op_unique},
  };
  return table;
}

}  // namespace mgn::onnx_impl
