// The public builder: one function per op, each adding one IR node (or a short composite).
#include "mgn/graph.h"

#include <cmath>

#include "ir/graph.h"

namespace mgn {

using ir::Attrs;
using ir::Op;

namespace {

ir::Graph* same_graph(std::initializer_list<const Tensor*> ts, const char* op) {
  ir::Graph* g = nullptr;
  for (const Tensor* t : ts) {
    if (!t->valid()) throw Error(std::string(op) + ": an operand is an empty Tensor");
    if (g && t->graph() != g) throw Error(std::string(op) + ": operands belong to different graphs");
    g = t->graph();
  }
  return g;
}

Tensor node(Op op, std::vector<Tensor> in, Attrs attrs = {}) {
  if (in.empty()) throw Error(std::string(ir::op_name(op)) + ": needs at least one operand");
  ir::Graph* g = nullptr;
  std::vector<int> ids;
  for (const Tensor& t : in) {
    if (!t.valid()) throw Error(std::string(ir::op_name(op)) + ": an operand is an empty Tensor");
    if (g && t.graph() != g) throw Error(std::string(ir::op_name(op)) + ": operands belong to different graphs");
    g = t.graph();
    ids.push_back(t.id());
  }
  return Tensor(g, g->add(op, std::move(ids), std::move(attrs)));
}

Tensor scalar_like(const Tensor& t, double v) {
  same_graph({&t}, "scalar");
  return Tensor(t.graph(), t.graph()->add_full({}, t.dtype(), v));
}

std::vector<int64_t> pad4(const std::vector<int64_t>& p, const char* what) {
  if (p.size() == 2) return {p[0], p[1], p[0], p[1]};
  if (p.size() == 4) return p;
  throw Error(std::string(what) + ": padding needs 2 ({ph, pw}) or 4 ({top, left, bottom, right}) values");
}

// y [N, C, ...] + bias [C] broadcast over the trailing axes.
Tensor add_channel_bias(Tensor y, Tensor bias, const char* who) {
  if (bias.shape() != Shape{y.dim(1)})
    throw Error(std::string(who) + ": bias must be [" + std::to_string(y.dim(1)) + "], got " + shape_str(bias.shape()));
  Shape bs(size_t(y.rank()) - 1, 1);
  bs[0] = y.dim(1);
  return y + reshape(bias, bs);
}

}  // namespace

// ---- Tensor
const Shape& Tensor::shape() const {
  if (!g_) throw Error("shape() of an empty Tensor");
  return g_->node(id_).shape;
}
DType Tensor::dtype() const {
  if (!g_) throw Error("dtype() of an empty Tensor");
  return g_->node(id_).dtype;
}
int64_t Tensor::dim(int axis) const {
  const Shape& s = shape();
  return s[size_t(ir::normalize_axis(axis, int(s.size()), "Tensor::dim"))];
}
Tensor& Tensor::set_precision(Precision p) {
  g_->node_mut(id_).precision = p;
  return *this;
}
std::optional<Precision> Tensor::precision() const { return g_->node(id_).precision; }
Tensor& Tensor::set_name(const std::string& name) {
  ir::Node& n = g_->node_mut(id_);
  if (n.op == Op::Input || n.op == Op::Parameter) throw Error("cannot rename input/parameter '" + n.name + "'");
  n.name = name;
  return *this;
}

// ---- Graph
Graph::Graph() : g_(std::make_unique<ir::Graph>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Tensor Graph::input(const std::string& name, const Shape& shape, DType dtype) {
  return Tensor(g_.get(), g_->add_input(name, shape, dtype));
}
Tensor Graph::parameter(const std::string& name, const Shape& shape, const Init& init, DType dtype) {
  return Tensor(g_.get(), g_->add_parameter(name, shape, dtype, init, true));
}
Tensor Graph::state(const std::string& name, const Shape& shape, const Init& init, DType dtype) {
  return Tensor(g_.get(), g_->add_parameter(name, shape, dtype, init, false));
}
Tensor Graph::constant(const Shape& shape, std::span<const float> values, DType dtype) {
  return Tensor(g_.get(), g_->add_constant(shape, dtype, std::vector<double>(values.begin(), values.end())));
}
Tensor Graph::constant_i32(const Shape& shape, std::span<const int32_t> values) {
  return Tensor(g_.get(), g_->add_constant(shape, DType::I32, std::vector<double>(values.begin(), values.end())));
}
Tensor Graph::full(const Shape& shape, double value, DType dtype) {
  return Tensor(g_.get(), g_->add_full(shape, dtype, value));
}
void Graph::output(const std::string& name, Tensor t) {
  if (t.graph() != g_.get()) throw Error("output '" + name + "': tensor belongs to another graph");
  g_->add_output(name, t.id());
}
std::optional<Tensor> Graph::find(const std::string& name) const {
  auto id = g_->find_named(name);
  if (!id) return std::nullopt;
  return Tensor(g_.get(), *id);
}
std::optional<Tensor> Graph::find_output(const std::string& name) const {
  auto id = g_->find_output(name);
  if (!id) return std::nullopt;
  return Tensor(g_.get(), *id);
}
Tensor Graph::get(const std::string& name) const {
  auto t = find(name);
  if (!t) throw Error("the graph has no input or parameter named '" + name + "'");
  return *t;
}
std::vector<Tensor> Graph::parameters() const {
  std::vector<Tensor> r;
  for (int id : g_->parameters()) r.emplace_back(g_.get(), id);
  return r;
}
void Graph::freeze(const std::string& prefix) {
  bool any = false;
  for (int id : g_->parameters()) {
    ir::Node& n = g_->node_mut(id);
    if (n.name.rfind(prefix, 0) == 0) {
      n.trainable = false;
      any = true;
    }
  }
  if (!any) throw Error("freeze: no parameter name starts with '" + prefix + "'");
}
void Graph::set_precision(Precision p) { g_->set_default_precision(p); }
std::string Graph::dump() const { return ir::to_text(*g_); }
void Graph::verify() const { ir::verify(*g_); }

// ---- pointwise
Tensor add(Tensor a, Tensor b) { return node(Op::Add, {a, b}); }
Tensor sub(Tensor a, Tensor b) { return node(Op::Sub, {a, b}); }
Tensor mul(Tensor a, Tensor b) { return node(Op::Mul, {a, b}); }
Tensor div(Tensor a, Tensor b) { return node(Op::Div, {a, b}); }
Tensor maximum(Tensor a, Tensor b) { return node(Op::Maximum, {a, b}); }
Tensor minimum(Tensor a, Tensor b) { return node(Op::Minimum, {a, b}); }
Tensor neg(Tensor x) { return node(Op::Neg, {x}); }
Tensor abs(Tensor x) { return node(Op::Abs, {x}); }
Tensor exp(Tensor x) { return node(Op::Exp, {x}); }
Tensor log(Tensor x) { return node(Op::Log, {x}); }
Tensor sqrt(Tensor x) { return node(Op::Sqrt, {x}); }
Tensor rsqrt(Tensor x) { return node(Op::Rsqrt, {x}); }
Tensor reciprocal(Tensor x) { return node(Op::Reciprocal, {x}); }
Tensor square(Tensor x) { return node(Op::Square, {x}); }
Tensor pow(Tensor x, double e) { return node(Op::PowScalar, {x}, Attrs().set("exponent", e)); }
Tensor relu(Tensor x) { return node(Op::Relu, {x}); }
Tensor leaky_relu(Tensor x, double alpha) { return node(Op::LeakyRelu, {x}, Attrs().set("alpha", alpha)); }
Tensor gelu(Tensor x) { return node(Op::GeluErf, {x}); }
Tensor gelu_tanh(Tensor x) { return node(Op::GeluTanh, {x}); }
Tensor silu(Tensor x) { return node(Op::Silu, {x}); }
Tensor sigmoid(Tensor x) { return node(Op::Sigmoid, {x}); }
Tensor tanh(Tensor x) { return node(Op::Tanh, {x}); }
Tensor softplus(Tensor x) { return node(Op::Softplus, {x}); }
Tensor erf(Tensor x) { return node(Op::Erf, {x}); }
Tensor sin(Tensor x) { return node(Op::Sin, {x}); }
Tensor cos(Tensor x) { return node(Op::Cos, {x}); }
Tensor clamp(Tensor x, double lo, double hi) { return node(Op::Clamp, {x}, Attrs().set("min", lo).set("max", hi)); }
Tensor cast(Tensor x, DType to) { return node(Op::Cast, {x}, Attrs().set("dtype", std::string(dtype_name(to)))); }
Tensor stop_gradient(Tensor x) { return node(Op::StopGradient, {x}); }
Tensor equal(Tensor a, Tensor b) { return node(Op::Equal, {a, b}); }
Tensor not_equal(Tensor a, Tensor b) { return node(Op::NotEqual, {a, b}); }
Tensor less(Tensor a, Tensor b) { return node(Op::Less, {a, b}); }
Tensor less_equal(Tensor a, Tensor b) { return node(Op::LessEqual, {a, b}); }
Tensor greater(Tensor a, Tensor b) { return node(Op::Greater, {a, b}); }
Tensor greater_equal(Tensor a, Tensor b) { return node(Op::GreaterEqual, {a, b}); }
Tensor where(Tensor c, Tensor a, Tensor b) { return node(Op::Where, {c, a, b}); }

Tensor operator+(Tensor a, Tensor b) { return add(a, b); }
Tensor operator-(Tensor a, Tensor b) { return sub(a, b); }
Tensor operator*(Tensor a, Tensor b) { return mul(a, b); }
Tensor operator/(Tensor a, Tensor b) { return div(a, b); }
Tensor operator-(Tensor x) { return neg(x); }
Tensor operator+(Tensor a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(Tensor a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(Tensor a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator/(Tensor a, double b) { return div(a, scalar_like(a, b)); }
Tensor operator+(double a, Tensor b) { return add(scalar_like(b, a), b); }
Tensor operator-(double a, Tensor b) { return sub(scalar_like(b, a), b); }
Tensor operator*(double a, Tensor b) { return mul(scalar_like(b, a), b); }
Tensor operator/(double a, Tensor b) { return div(scalar_like(b, a), b); }

// ---- reductions
static Attrs reduce_attrs(std::vector<int64_t> axes, bool keepdim) {
  return Attrs().set("axes", std::move(axes)).set("keepdim", keepdim);
}
Tensor sum(Tensor x, std::vector<int64_t> axes, bool k) { return node(Op::ReduceSum, {x}, reduce_attrs(axes, k)); }
Tensor mean(Tensor x, std::vector<int64_t> axes, bool k) { return node(Op::ReduceMean, {x}, reduce_attrs(axes, k)); }
Tensor max(Tensor x, std::vector<int64_t> axes, bool k) { return node(Op::ReduceMax, {x}, reduce_attrs(axes, k)); }
Tensor min(Tensor x, std::vector<int64_t> axes, bool k) { return node(Op::ReduceMin, {x}, reduce_attrs(axes, k)); }
Tensor argmax(Tensor x, int64_t axis, bool k) {
  return node(Op::ArgMax, {x}, Attrs().set("axis", axis).set("keepdim", k));
}
Tensor softmax(Tensor x, int64_t axis) { return node(Op::Softmax, {x}, Attrs().set("axis", axis)); }
Tensor log_softmax(Tensor x, int64_t axis) { return node(Op::LogSoftmax, {x}, Attrs().set("axis", axis)); }
Tensor logsumexp(Tensor x, int64_t axis, bool k) {
  return node(Op::LogSumExp, {x}, Attrs().set("axis", axis).set("keepdim", k));
}

// ---- matmul
Tensor matmul(Tensor a, Tensor b, bool ta, bool tb) {
  return node(Op::MatMul, {a, b}, Attrs().set("transpose_a", ta).set("transpose_b", tb));
}
Tensor linear(Tensor x, Tensor w, std::optional<Tensor> bias) {
  if (w.rank() != 2) throw Error("linear: weight must be [out, in], got " + shape_str(w.shape()));
  Tensor y;
  if (x.rank() == 1) {
    y = reshape(matmul(reshape(x, {1, x.dim(0)}), w, false, true), {w.dim(0)});
  } else {
    y = matmul(x, w, false, true);
  }
  if (bias) {
    if (bias->shape() != Shape{w.dim(0)})
      throw Error("linear: bias must be [" + std::to_string(w.dim(0)) + "], got " + shape_str(bias->shape()));
    y = y + *bias;
  }
  return y;
}

// ---- normalization
static std::vector<Tensor> with_optional(Tensor x, std::optional<Tensor> w, std::optional<Tensor> b,
                                         const char* op) {
  std::vector<Tensor> in = {x};
  if (w) in.push_back(*w);
  if (b) {
    if (!w) throw Error(std::string(op) + ": a bias needs a weight");
    in.push_back(*b);
  }
  return in;
}
Tensor layer_norm(Tensor x, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
  return node(Op::LayerNorm, with_optional(x, w, b, "layer_norm"), Attrs().set("eps", eps));
}
Tensor rms_norm(Tensor x, std::optional<Tensor> w, double eps) {
  return node(Op::RmsNorm, with_optional(x, w, std::nullopt, "rms_norm"), Attrs().set("eps", eps));
}
Tensor group_norm(Tensor x, int64_t groups, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
  return node(Op::GroupNorm, with_optional(x, w, b, "group_norm"), Attrs().set("groups", groups).set("eps", eps));
}
Tensor batch_norm(Tensor x, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
  return node(Op::BatchNorm, with_optional(x, w, b, "batch_norm"), Attrs().set("eps", eps));
}
Tensor batch_norm_eval(Tensor x, Tensor rm, Tensor rv, std::optional<Tensor> w, std::optional<Tensor> b,
                       double eps) {
  if (x.rank() < 2) throw Error("batch_norm_eval: input must be [N, C, ...], got " + shape_str(x.shape()));
  int64_t c = x.dim(1);
  for (const Tensor* t : {&rm, &rv})
    if (t->shape() != Shape{c})
      throw Error("batch_norm_eval: running statistics must be [" + std::to_string(c) + "], got " +
                  shape_str(t->shape()));
  Shape bshape(size_t(x.rank()), 1);
  bshape[1] = c;
  Tensor scale = rsqrt(reshape(rv, bshape) + eps);
  if (w) scale = scale * reshape(*w, bshape);
  Tensor y = (x - reshape(rm, bshape)) * scale;
  if (b) y = y + reshape(*b, bshape);
  return y;
}

// ---- convolution and pooling
Tensor conv2d(Tensor x, Tensor w, const Conv2dOptions& o, std::optional<Tensor> bias) {
  Tensor y = node(Op::Conv2d, {x, w},
                  Attrs()
                      .set("stride", o.stride)
                      .set("padding", pad4(o.padding, "conv2d"))
                      .set("dilation", o.dilation)
                      .set("groups", o.groups));
  return bias ? add_channel_bias(y, *bias, "conv2d") : y;
}

Tensor conv_transpose2d(Tensor x, Tensor w, const ConvTranspose2dOptions& o, std::optional<Tensor> bias) {
  const char* who = "conv_transpose2d";
  if (x.rank() != 4 || w.rank() != 4)
    throw Error(std::string(who) + ": x must be [N, C, H, W] and weight [Cin, Cout/groups, kh, kw], got " +
                shape_str(x.shape()) + " and " + shape_str(w.shape()));
  if (o.stride.size() != 2 || o.dilation.size() != 2 || o.output_padding.size() != 2)
    throw Error(std::string(who) + ": stride, dilation and output_padding need 2 values each");
  if (o.groups < 1 || w.dim(0) != x.dim(1) || x.dim(1) % o.groups != 0)
    throw Error(std::string(who) + ": weight " + shape_str(w.shape()) + " does not take " + std::to_string(x.dim(1)) +
                " input channels in " + std::to_string(o.groups) + " groups (weight dim 0 is Cin)");
  const std::vector<int64_t> p = pad4(o.padding, who);
  Shape out = {x.dim(0), w.dim(1) * o.groups, 0, 0};
  for (int a = 0; a < 2; ++a) {
    const int64_t s = o.stride[size_t(a)], d = o.dilation[size_t(a)], op = o.output_padding[size_t(a)];
    if (op < 0 || (op >= s && op >= d))
      throw Error(std::string(who) + ": output_padding " + std::to_string(op) +
                  " must be below the stride or the dilation of its axis");
    out[size_t(2 + a)] = (x.dim(2 + a) - 1) * s - p[size_t(a)] - p[size_t(a + 2)] + d * (w.dim(2 + a) - 1) + op + 1;
    if (out[size_t(2 + a)] <= 0)
      throw Error(std::string(who) + ": the padding leaves no output along axis " + std::to_string(2 + a));
  }
  Tensor y = conv2d_grad_input(x, w, out, {.stride = o.stride, .padding = p, .dilation = o.dilation, .groups = o.groups});
  return bias ? add_channel_bias(y, *bias, who) : y;
}
// The attributes of conv2d's derivative ops are the forward's geometry plus the shape they produce.
static Attrs conv2d_grad_attrs(const Conv2dOptions& o, const char* shape_attr, const Shape& shape) {
  return Attrs()
      .set("stride", o.stride)
      .set("padding", pad4(o.padding, "conv2d"))
      .set("dilation", o.dilation)
      .set("groups", o.groups)
      .set(shape_attr, shape);
}
Tensor conv2d_grad_input(Tensor dy, Tensor w, const Shape& input_shape, const Conv2dOptions& o) {
  return node(Op::Conv2dGradInput, {dy, w}, conv2d_grad_attrs(o, "input_shape", input_shape));
}
Tensor conv2d_grad_weight(Tensor x, Tensor dy, const Shape& weight_shape, const Conv2dOptions& o) {
  return node(Op::Conv2dGradWeight, {x, dy}, conv2d_grad_attrs(o, "weight_shape", weight_shape));
}
Tensor conv1d(Tensor x, Tensor w, const Conv1dOptions& o, std::optional<Tensor> bias) {
  if (x.rank() != 3) throw Error("conv1d: input must be [N, C, L], got " + shape_str(x.shape()));
  if (w.rank() != 3) throw Error("conv1d: weight must be [O, C/groups, k], got " + shape_str(w.shape()));
  Tensor x4 = reshape(x, {x.dim(0), x.dim(1), 1, x.dim(2)});
  Tensor w4 = reshape(w, {w.dim(0), w.dim(1), 1, w.dim(2)});
  Tensor y = conv2d(x4, w4,
                    {.stride = {1, o.stride}, .padding = {0, o.padding}, .dilation = {1, o.dilation}, .groups = o.groups});
  y = reshape(y, {y.dim(0), y.dim(1), y.dim(3)});
  return bias ? add_channel_bias(y, *bias, "conv1d") : y;
}
Tensor max_pool2d(Tensor x, const Pool2dOptions& o) {
  return node(Op::MaxPool2d, {x},
              Attrs()
                  .set("kernel", o.kernel)
                  .set("stride", o.stride.empty() ? o.kernel : o.stride)
                  .set("padding", pad4(o.padding, "max_pool2d"))
                  .set("dilation", o.dilation));
}
Tensor avg_pool2d(Tensor x, const Pool2dOptions& o) {
  return node(Op::AvgPool2d, {x},
              Attrs()
                  .set("kernel", o.kernel)
                  .set("stride", o.stride.empty() ? o.kernel : o.stride)
                  .set("padding", pad4(o.padding, "avg_pool2d"))
                  .set("count_include_pad", o.count_include_pad));
}
Tensor global_avg_pool(Tensor x) {
  if (x.rank() != 4) throw Error("global_avg_pool: input must be NCHW, got " + shape_str(x.shape()));
  return mean(x, {2, 3}, true);
}
Tensor upsample_nearest2d(Tensor x, int64_t sh, int64_t sw) {
  return node(Op::Upsample2d, {x}, Attrs().set("scale", std::vector<int64_t>{sh, sw}));
}

// ---- attention
Tensor attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& o) {
  if (q.rank() != 4) throw Error("attention: q must be [B, H, S, D], got " + shape_str(q.shape()));
  double scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(q.dim(3)));
  std::vector<Tensor> in = {q, k, v};
  if (o.mask) in.push_back(*o.mask);
  return node(Op::Attention, in, Attrs().set("scale", scale).set("causal", o.causal));
}
Tensor rope(Tensor x, Tensor c, Tensor s) { return node(Op::Rope, {x, c, s}); }
std::pair<Tensor, Tensor> rope_tables(Tensor positions, int64_t head_dim, double theta) {
  if (positions.rank() != 1 || positions.dtype() != DType::I32)
    throw Error("rope_tables: positions must be i32 [S], got " + std::string(dtype_name(positions.dtype())) +
                shape_str(positions.shape()));
  if (head_dim % 2) throw Error("rope_tables: head_dim must be even");
  int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = float(1.0 / std::pow(theta, double(2 * i) / double(head_dim)));
  ir::Graph* g = positions.graph();
  Tensor invf(g, g->add_constant({1, half}, DType::F32, std::vector<double>(inv.begin(), inv.end())));
  Tensor ang = reshape(cast(positions, DType::F32), {positions.dim(0), 1}) * invf;
  return {cos(ang), sin(ang)};
}

// ---- data movement
Tensor reshape(Tensor x, std::vector<int64_t> shape) { return node(Op::Reshape, {x}, Attrs().set("shape", shape)); }
Tensor permute(Tensor x, std::vector<int64_t> perm) {
  // A permutation that keeps the axes longer than 1 in their order only moves axes of size 1: every element
  // stays at its offset, so it is a reshape (a view, no dispatch). A decode step's [B, 1, H, D] -> [B, H, 1, D]
  // is one: four of the ~20 dispatches of a Llama layer at one token. Anything else (or a malformed perm, whose
  // error the Permute node gives) is a Permute.
  const Shape& s = x.shape();
  const int64_t r = int64_t(s.size());
  if (int64_t(perm.size()) == r) {
    std::vector<bool> seen(s.size(), false);
    Shape out;
    int64_t last = -1;
    bool view = true;
    for (int64_t a : perm) {
      const int64_t na = a < 0 ? a + r : a;
      if (na < 0 || na >= r || seen[size_t(na)]) {
        view = false;
        break;
      }
      seen[size_t(na)] = true;
      out.push_back(s[size_t(na)]);
      if (s[size_t(na)] != 1) {
        if (na < last) view = false;
        last = na;
      }
    }
    if (view) return reshape(x, out);
  }
  return node(Op::Permute, {x}, Attrs().set("perm", perm));
}
Tensor transpose(Tensor x, int64_t a, int64_t b) {
  int r = x.rank();
  int na = ir::normalize_axis(a, r, "transpose"), nb = ir::normalize_axis(b, r, "transpose");
  std::vector<int64_t> p(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) p[size_t(i)] = i;
  std::swap(p[size_t(na)], p[size_t(nb)]);
  return permute(x, p);
}
Tensor slice(Tensor x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  const Shape& s = x.shape();
  int a = ir::normalize_axis(axis, int(s.size()), "slice");
  int64_t d = s[size_t(a)];
  if (start < 0) start += d;
  if (end < 0) end += d;
  end = std::min(end, d);
  std::vector<int64_t> st(s.size(), 0), en(s.begin(), s.end()), sp(s.size(), 1);
  st[size_t(a)] = start;
  en[size_t(a)] = end;
  sp[size_t(a)] = step;
  return node(Op::Slice, {x}, Attrs().set("starts", st).set("ends", en).set("steps", sp));
}
Tensor concat(const std::vector<Tensor>& xs, int64_t axis) { return node(Op::Concat, xs, Attrs().set("axis", axis)); }
std::vector<Tensor> split(Tensor x, const std::vector<int64_t>& sizes, int64_t axis) {
  int a = ir::normalize_axis(axis, x.rank(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != x.dim(a))
    throw Error("split: sizes add up to " + std::to_string(total) + ", axis has " + std::to_string(x.dim(a)));
  std::vector<Tensor> r;
  int64_t off = 0;
  for (int64_t s : sizes) {
    r.push_back(slice(x, a, off, off + s));
    off += s;
  }
  return r;
}
Tensor pad(Tensor x, const std::vector<int64_t>& pads, double value) {
  size_t r = size_t(x.rank());
  if (pads.size() % 2 || pads.size() > 2 * r)
    throw Error("pad: needs pairs {before, after} for at most " + std::to_string(r) + " axes, got " +
                std::to_string(pads.size()) + " values");
  std::vector<int64_t> full(2 * r, 0);
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    full[i] = pads[2 * i];
    full[i + r] = pads[2 * i + 1];
  }
  return node(Op::Pad, {x}, Attrs().set("pads", full).set("value", value));
}
Tensor expand(Tensor x, const Shape& shape) { return node(Op::Expand, {x}, Attrs().set("shape", shape)); }
Tensor gather(Tensor t, Tensor idx, int64_t axis) { return node(Op::Gather, {t, idx}, Attrs().set("axis", axis)); }
Tensor gather_elements(Tensor data, Tensor idx, int64_t axis) {
  return node(Op::GatherElements, {data, idx}, Attrs().set("axis", axis));
}
Tensor scatter_elements(Tensor data, Tensor idx, Tensor updates, int64_t axis, ScatterReduction reduction) {
  static const char* kNames[] = {"none", "add", "mul", "max", "min"};
  return node(Op::ScatterElements, {data, idx, updates},
              Attrs().set("axis", axis).set("reduction", std::string(kNames[size_t(reduction)])));
}
Tensor index_select(Tensor x, int64_t axis, Tensor idx) {
  if (idx.rank() != 1) throw Error("index_select: indices must be rank 1, got " + shape_str(idx.shape()));
  return gather(x, idx, axis);
}
Tensor embedding(Tensor table, Tensor ids) {
  if (table.rank() != 2) throw Error("embedding: table must be [V, D], got " + shape_str(table.shape()));
  return gather(table, ids, 0);
}
Tensor one_hot(Tensor idx, int64_t depth) { return node(Op::OneHot, {idx}, Attrs().set("depth", depth)); }
Tensor flatten(Tensor x, int64_t start) {
  int s = ir::normalize_axis(start, x.rank(), "flatten");
  Shape out(x.shape().begin(), x.shape().begin() + s);
  int64_t rest = 1;
  for (int i = s; i < x.rank(); ++i) rest *= x.dim(i);
  out.push_back(rest);
  return reshape(x, out);
}
Tensor squeeze(Tensor x, int64_t axis) {
  int a = ir::normalize_axis(axis, x.rank(), "squeeze");
  if (x.dim(a) != 1) throw Error("squeeze: axis " + std::to_string(axis) + " has size " + std::to_string(x.dim(a)));
  Shape s = x.shape();
  s.erase(s.begin() + a);
  return reshape(x, s);
}
Tensor unsqueeze(Tensor x, int64_t axis) {
  int a = ir::normalize_axis(axis, x.rank() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return reshape(x, s);
}

// ---- losses
Tensor cross_entropy(Tensor logits, Tensor labels, const CrossEntropyOptions& o) {
  return node(Op::CrossEntropy, {logits, labels},
              Attrs().set("ignore_index", o.ignore_index).set("label_smoothing", o.label_smoothing));
}
static void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape())
    throw Error(std::string(op) + ": prediction " + shape_str(a.shape()) + " and target " + shape_str(b.shape()) +
                " must have the same shape");
}
Tensor mse_loss(Tensor p, Tensor t) {
  same_shape(p, t, "mse_loss");
  return mean(square(p - t));
}
Tensor l1_loss(Tensor p, Tensor t) {
  same_shape(p, t, "l1_loss");
  return mean(abs(p - t));
}
Tensor bce_with_logits(Tensor x, Tensor y) {
  same_shape(x, y, "bce_with_logits");
  // max(x, 0) - x*y + log(1 + exp(-|x|)): stable for large |x|.
  return mean(relu(x) - x * y + softplus(-abs(x)));
}

Tensor assign(Tensor target, Tensor value) { return node(Op::Assign, {target, value}); }

}  // namespace mgn
