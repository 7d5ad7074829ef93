// NNEF graph building: walks the parsed statements in order, binds each result identifier, and lowers every
// operation onto the graph builder (include/mgn/graph.h) through one table of rules with their parameter
// names. NNEF broadcasting aligns shapes from the left (missing trailing axes are singletons: a [1, C] bias
// broadcasts over [N, C, H, W]); the rules pad the lower-rank operand with trailing ones before the builder's
// numpy broadcasting.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "io/nnef/nnef_internal.h"
#include "ir/graph.h"

namespace mgn::nnef {

namespace {

using nnef_impl::Document;
using nnef_impl::Expr;
using nnef_impl::Stmt;
using K = Expr::Kind;

// A bound identifier: one tensor, or a list of them (split, unstack).
struct Val {
  Tensor t;
  bool is_list = false;
  std::vector<Tensor> list;
};

struct Result {
  std::vector<Tensor> ts;
  bool list = false;  // an array result (bound to one identifier as a list, or unpacked by [a, b] = ...)
};

class Builder;
struct Rule {
  std::vector<std::string> params;  // positional order; every named argument must be one of these
  std::function<Result(Builder&)> fn;
};
const std::map<std::string, Rule>& rules();

constexpr int64_t kMaxElements = int64_t(1) << 28;
constexpr int64_t kMaxConstant = int64_t(1) << 24;  // a filled constant is materialized at import time

class Builder {
 public:
  Builder(Graph& g, const ImportOptions& opt, const DatLoader& load, const std::string& origin)
      : g(g), opt(opt), load(load), origin(origin) {}
  Graph& g;
  const ImportOptions& opt;
  const DatLoader& load;
  const std::string& origin;
  std::map<std::string, Val> env;
  std::map<std::string, Tensor> params;  // variables by label
  std::set<std::string> externals;       // declared graph inputs
  std::vector<std::string> inputs;       // externals, in the order they are defined
  int64_t parameter_count = 0;
  const Expr* st = nullptr;   // the call being lowered (Kind::Call: op in s, generic, line:col)
  const Expr* lhs = nullptr;  // its statement's left side; nullptr for a nested call
  std::map<std::string, const Expr*> args;

  std::string where(int line, int col) const {
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col) + ": ";
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where(st->line, st->col) + "'" + st->s + "': " + what);
  }
  [[noreturn]] void fail_at(const Expr& e, const std::string& what) const {
    throw Error(where(e.line, e.col) + "'" + st->s + "': " + what);
  }

  const Expr* opt_arg(const std::string& name) const {
    auto it = args.find(name);
    return it == args.end() ? nullptr : it->second;
  }
  const Expr& arg(const std::string& name) const {
    const Expr* e = opt_arg(name);
    if (!e) fail("missing argument '" + name + "'");
    return *e;
  }
  bool has(const std::string& name) const { return args.count(name) > 0; }

  // ---- scalar attribute values
  double number(const Expr& e, const std::string& name) const {
    if (e.kind != K::Int && e.kind != K::Float)
      fail_at(e, "argument '" + name + "' must be a number, got " + nnef_impl::kind_name(e.kind));
    return e.num;
  }
  double number(const std::string& name, double dflt) const {
    const Expr* e = opt_arg(name);
    return e ? number(*e, name) : dflt;
  }
  int64_t integer(const Expr& e, const std::string& name) const {
    if (e.kind != K::Int) fail_at(e, "argument '" + name + "' must be an integer, got " + nnef_impl::kind_name(e.kind));
    if (std::fabs(e.num) > double(kMaxElements)) fail_at(e, "argument '" + name + "': " + std::to_string(int64_t(e.num)) + " is out of range");
    return int64_t(e.num);
  }
  int64_t integer(const std::string& name, int64_t dflt) const {
    const Expr* e = opt_arg(name);
    return e ? integer(*e, name) : dflt;
  }
  bool logical(const std::string& name, bool dflt) const {
    const Expr* e = opt_arg(name);
    if (!e) return dflt;
    if (e->kind != K::Bool) fail_at(*e, "argument '" + name + "' must be true or false");
    return e->b;
  }
  std::string string(const std::string& name, const std::string& dflt) const {
    const Expr* e = opt_arg(name);
    if (!e) return dflt;
    if (e->kind != K::Str) fail_at(*e, "argument '" + name + "' must be a string, got " + nnef_impl::kind_name(e->kind));
    return e->s;
  }
  std::vector<int64_t> ints(const std::string& name, const std::vector<int64_t>& dflt) const {
    const Expr* e = opt_arg(name);
    if (!e) return dflt;
    if (e->kind != K::Array) fail_at(*e, "argument '" + name + "' must be an array of integers");
    std::vector<int64_t> v;
    for (const Expr& i : e->items) v.push_back(integer(i, name));
    return v;
  }
  std::vector<double> numbers(const Expr& e, const std::string& name) const {
    if (e.kind == K::Int || e.kind == K::Float) return {e.num};
    if (e.kind == K::Bool) return {e.b ? 1.0 : 0.0};
    if (e.kind != K::Array) fail_at(e, "argument '" + name + "' must be a number or an array of numbers");
    std::vector<double> v;
    for (const Expr& i : e.items) {
      if (i.kind == K::Bool) v.push_back(i.b ? 1.0 : 0.0);
      else v.push_back(number(i, name));
    }
    return v;
  }
  // [(front, back), ...]; empty array means automatic ("same") padding, reported as nullopt.
  std::optional<std::vector<std::pair<int64_t, int64_t>>> padding(const std::string& name) const {
    const Expr* e = opt_arg(name);
    if (!e) return std::nullopt;
    if (e->kind != K::Array) fail_at(*e, "argument '" + name + "' must be an array of (front, back) tuples");
    if (e->items.empty()) return std::nullopt;
    std::vector<std::pair<int64_t, int64_t>> v;
    for (const Expr& i : e->items) {
      if (i.kind != K::Tuple || i.items.size() != 2)
        fail_at(i, "argument '" + name + "' must hold (front, back) tuples of integers");
      int64_t a = integer(i.items[0], name), b = integer(i.items[1], name);
      if (a < 0 || b < 0) fail_at(i, "argument '" + name + "': negative padding");
      v.emplace_back(a, b);
    }
    return v;
  }

  // ---- tensor values
  Tensor tensor(const Expr& e, const std::string& name, DType like = DType::F32) {
    switch (e.kind) {
      case K::Id: {
        auto it = env.find(e.s);
        if (it == env.end()) fail_at(e, "argument '" + name + "': '" + e.s + "' is not defined before this line");
        if (it->second.is_list) fail_at(e, "argument '" + name + "': '" + e.s + "' is an array of tensors");
        return it->second.t;
      }
      case K::Int:
      case K::Float: return g.scalar(e.num, like == DType::Bool ? DType::F32 : like);
      case K::Bool: return g.scalar(e.b ? 1.0 : 0.0, DType::Bool);
      case K::Call: {
        Result r = invoke(e, nullptr);
        if (r.list || r.ts.size() != 1) fail_at(e, "argument '" + name + "': '" + e.s + "' does not give one tensor");
        return r.ts[0];
      }
      default: fail_at(e, "argument '" + name + "' must be a tensor, got " + nnef_impl::kind_name(e.kind));
    }
  }
  Tensor tensor(const std::string& name) { return tensor(arg(name), name); }
  std::vector<Tensor> tensors(const std::string& name) {
    const Expr& e = arg(name);
    if (e.kind == K::Id) {
      auto it = env.find(e.s);
      if (it != env.end() && it->second.is_list) return it->second.list;
      return {tensor(e, name)};
    }
    if (e.kind == K::Call) return invoke(e, nullptr).ts;
    if (e.kind != K::Array) fail_at(e, "argument '" + name + "' must be an array of tensors");
    std::vector<Tensor> v;
    for (const Expr& i : e.items) v.push_back(tensor(i, name));
    return v;
  }
  bool is_literal(const std::string& name) const {
    const Expr* e = opt_arg(name);
    return e && (e->kind == K::Int || e->kind == K::Float);
  }

  int axis(int64_t a, int rank, const std::string& what) const {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) fail(what + " axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    return int(a);
  }
  Shape shape_arg(const std::string& name) const {
    Shape s = ints(name, {});
    if (!has(name)) fail("missing argument '" + name + "'");
    if (s.size() > size_t(kMaxRank)) fail("shape " + shape_str(s) + " has more than " + std::to_string(kMaxRank) + " axes");
    int64_t n = 1;
    for (int64_t d : s) {
      if (d <= 0) fail("shape " + shape_str(s) + " has a non-positive extent");
      if (n > kMaxElements / d) fail("shape " + shape_str(s) + " is too large");
      n *= d;
    }
    return s;
  }
  DType dtype_of_generic(const std::string& dflt = "scalar") const {
    std::string t = st->generic.empty() ? dflt : st->generic;
    if (t == "scalar") return DType::F32;
    if (t == "integer") return DType::I32;
    if (t == "logical") return DType::Bool;
    fail("type '" + t + "' is not one of scalar, integer, logical");
  }

  void run(const Document& d);
  Result invoke(const Expr& call, const Expr* lhs);
};

// Pads the lower-rank operand with trailing singleton axes (NNEF's left-aligned broadcasting).
std::pair<Tensor, Tensor> align(Tensor a, Tensor b) {
  auto widen = [](Tensor t, int r) {
    if (t.rank() == 0 || t.rank() >= r) return t;
    Shape s = t.shape();
    s.resize(size_t(r), 1);
    return reshape(t, s);
  };
  int r = std::max(a.rank(), b.rank());
  return {widen(a, r), widen(b, r)};
}

// The dtype a literal operand takes: that of the other operand.
std::pair<Tensor, Tensor> operands(Builder& b, const std::string& x = "x", const std::string& y = "y") {
  const Expr& ex = b.arg(x);
  const Expr& ey = b.arg(y);
  auto lit = [](const Expr& e) { return e.kind == K::Int || e.kind == K::Float; };
  Tensor tx, ty;
  if (lit(ex) && !lit(ey)) {
    ty = b.tensor(ey, y);
    tx = b.tensor(ex, x, ty.dtype());
  } else {
    tx = b.tensor(ex, x);
    ty = b.tensor(ey, y, tx.dtype());
  }
  return align(tx, ty);
}

Result one(Tensor t) { return {{t}, false}; }

// Automatic ("same") padding of one axis: the output keeps ceil(in / stride) positions.
std::pair<int64_t, int64_t> same_pad(int64_t in, int64_t k, int64_t stride, int64_t dil) {
  int64_t out = (in + stride - 1) / stride;
  int64_t total = std::max<int64_t>(0, (out - 1) * stride + (k - 1) * dil + 1 - in);
  return {total / 2, total - total / 2};
}

// Spatial settings of conv/deconv/pools for `nsp` spatial axes: stride, dilation and padding pairs.
struct Window {
  std::vector<int64_t> stride, dilation;
  std::vector<std::pair<int64_t, int64_t>> pad;
};

Window window(Builder& b, const Shape& in, const std::vector<int64_t>& k, size_t first, bool deconv = false) {
  // `first`: the first axis the window covers in `in`; k/stride/dilation/padding cover axes first..rank-1.
  size_t n = in.size() - first;
  Window w;
  w.stride = b.ints("stride", {});
  w.dilation = b.ints("dilation", {});
  if (w.stride.empty()) w.stride.assign(n, 1);
  if (w.dilation.empty()) w.dilation.assign(n, 1);
  if (w.stride.size() != n || w.dilation.size() != n)
    b.fail("stride and dilation need " + std::to_string(n) + " values (or [] for ones), got " +
           std::to_string(w.stride.size()) + " and " + std::to_string(w.dilation.size()));
  for (size_t i = 0; i < n; ++i)
    if (w.stride[i] <= 0 || w.dilation[i] <= 0) b.fail("stride and dilation must be positive");
  auto p = b.padding("padding");
  if (p) {
    if (p->size() != n)
      b.fail("padding needs " + std::to_string(n) + " (front, back) pairs (or [] for automatic), got " +
             std::to_string(p->size()));
    w.pad = *p;
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (deconv) {
        // The transposed convolution's automatic padding makes the output stride times the input.
        int64_t out = in[first + i] * w.stride[i];
        int64_t total = std::max<int64_t>(0, (in[first + i] - 1) * w.stride[i] + (k[i] - 1) * w.dilation[i] + 1 - out);
        w.pad.emplace_back(total / 2, total - total / 2);
      } else {
        w.pad.push_back(same_pad(in[first + i], k[i], w.stride[i], w.dilation[i]));
      }
    }
  }
  return w;
}

Tensor add_bias(Builder& b, Tensor y, const std::string& name = "bias") {
  const Expr* e = b.opt_arg(name);
  if (!e) return y;
  if ((e->kind == K::Int || e->kind == K::Float) && e->num == 0) return y;
  return add(y, align(b.tensor(*e, name), y).first);
}

void check_border(Builder& b, const std::string& border, std::initializer_list<const char*> ok) {
  for (const char* o : ok)
    if (border == o) return;
  std::string list;
  for (const char* o : ok) list += std::string(list.empty() ? "" : ", ") + "'" + o + "'";
  b.fail("border '" + border + "' is not supported here (supported: " + list + ")");
}

bool edge_border(const std::string& border) {
  return border == "replicate" || border == "reflect" || border == "reflect-even";
}

// Padding whose values come from the tensor itself, for axes first, first + 1, ...: 'replicate' repeats the
// edge, 'reflect' mirrors without the edge (numpy's reflect), 'reflect-even' mirrors with it (numpy's
// symmetric). Built from slices and one concat per axis, so every backend and autodiff follow.
Tensor edge_pad(Builder& b, Tensor x, size_t first, const std::vector<std::pair<int64_t, int64_t>>& pads,
                const std::string& border) {
  for (size_t i = 0; i < pads.size(); ++i) {
    const int a = int(first + i);
    const auto [f, k] = pads[i];
    if (f == 0 && k == 0) continue;
    const int64_t d = x.dim(a);
    auto at = [&](int64_t j) { return slice(x, a, j, j + 1); };
    std::vector<Tensor> parts;
    if (border == "replicate") {
      auto run = [&](int64_t j, int64_t n) {
        Shape s = x.shape();
        s[size_t(a)] = n;
        return expand(at(j), s);
      };
      if (f) parts.push_back(run(0, f));
      parts.push_back(x);
      if (k) parts.push_back(run(d - 1, k));
    } else {
      const bool even = border == "reflect-even";
      // One slice per padded position: a bound keeps a hostile file from building millions of nodes.
      const int64_t limit = std::min<int64_t>(even ? d : d - 1, 4096);
      if (f > limit || k > limit)
        b.fail("border '" + border + "' cannot pad axis " + std::to_string(a) + " of extent " + std::to_string(d) +
               " by (" + std::to_string(f) + ", " + std::to_string(k) + ") (at most " + std::to_string(limit) + ")");
      for (int64_t j = f; j >= 1; --j) parts.push_back(at(even ? j - 1 : j));
      parts.push_back(x);
      for (int64_t j = 1; j <= k; ++j) parts.push_back(at(even ? d - j : d - 1 - j));
    }
    x = concat(parts, a);
  }
  return x;
}

Result conv_rule(Builder& b) {
  Tensor x = b.tensor("input"), w = b.tensor("filter");
  if (x.rank() != 3 && x.rank() != 4)
    b.fail("only 1-D and 2-D convolutions are supported (input [N, C, L] or [N, C, H, W]), got " + shape_str(x.shape()));
  if (w.rank() != x.rank()) b.fail("filter " + shape_str(w.shape()) + " must have the input's rank " + std::to_string(x.rank()));
  const std::string border = b.string("border", "constant");
  check_border(b, border, {"constant", "ignore", "replicate", "reflect", "reflect-even"});
  int64_t groups = b.integer("groups", 1);
  if (groups == 0) groups = x.dim(1);
  if (groups < 0) b.fail("groups must be positive (or 0 for depthwise)");
  Shape wk(w.shape().begin() + 2, w.shape().end());
  Window win = window(b, x.shape(), wk, 2);
  if (edge_border(border)) {
    x = edge_pad(b, x, 2, win.pad, border);
    for (auto& p : win.pad) p = {0, 0};
  }
  Tensor y;
  if (x.rank() == 4) {
    Conv2dOptions o{.stride = win.stride,
                    .padding = {win.pad[0].first, win.pad[1].first, win.pad[0].second, win.pad[1].second},
                    .dilation = win.dilation,
                    .groups = groups};
    y = conv2d(x, w, o);
  } else {
    Tensor xp = x;
    if (win.pad[0].first != win.pad[0].second) {
      xp = pad(x, {0, 0, 0, 0, win.pad[0].first, win.pad[0].second});
      win.pad[0] = {0, 0};
    }
    y = conv1d(xp, w, {.stride = win.stride[0], .padding = win.pad[0].first, .dilation = win.dilation[0], .groups = groups});
  }
  return one(add_bias(b, y));
}

Result deconv_rule(Builder& b) {
  Tensor x = b.tensor("input"), w = b.tensor("filter");
  if (x.rank() != 4 || w.rank() != 4) b.fail("only 2-D transposed convolutions are supported (input [N, C, H, W])");
  check_border(b, b.string("border", "constant"), {"constant", "ignore"});
  int64_t groups = b.integer("groups", 1);
  if (groups == 0) groups = x.dim(1);
  Shape wk(w.shape().begin() + 2, w.shape().end());
  Window win = window(b, x.shape(), wk, 2, true);
  std::vector<int64_t> outp = {0, 0};
  std::vector<int64_t> want = b.ints("output_shape", {});
  if (!want.empty()) {
    if (want.size() != 4) b.fail("output_shape needs 4 values");
    for (int i = 0; i < 2; ++i) {
      int64_t natural = (x.dim(2 + i) - 1) * win.stride[size_t(i)] + (wk[size_t(i)] - 1) * win.dilation[size_t(i)] + 1 -
                        win.pad[size_t(i)].first - win.pad[size_t(i)].second;
      outp[size_t(i)] = want[size_t(2 + i)] - natural;
      if (outp[size_t(i)] < 0) b.fail("output_shape " + shape_str(want) + " is smaller than the transposed convolution gives");
    }
  }
  ConvTranspose2dOptions o{.stride = win.stride,
                           .padding = {win.pad[0].first, win.pad[1].first, win.pad[0].second, win.pad[1].second},
                           .output_padding = outp,
                           .dilation = win.dilation,
                           .groups = groups};
  return one(add_bias(b, conv_transpose2d(x, w, o)));
}

// max_pool, avg_pool and box on [N, C, H, W] with windows [1, 1, kh, kw].
enum class Pool { Max, Avg, Box };
Result pool_rule(Builder& b, Pool kind) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> size = b.ints("size", {});
  if (!b.has("size")) b.fail("missing argument 'size'");
  if (size.size() != size_t(x.rank())) b.fail("size needs one value per input axis (" + std::to_string(x.rank()) + ")");
  for (int64_t s : size)
    if (s <= 0) b.fail("size values must be positive");
  std::string border = b.string("border", "constant");
  check_border(b, border, {"constant", "ignore", "replicate", "reflect", "reflect-even"});
  Window win = window(b, x.shape(), size, 0);
  int r = x.rank();
  if (edge_border(border)) {
    // The padded values are the tensor's own: pad explicitly, then pool without padding.
    x = edge_pad(b, x, 0, win.pad, border);
    for (auto& p : win.pad) p = {0, 0};
    border = "constant";
  }
  if (r != 4 && r != 3) b.fail("pooling needs a [N, C, H, W] (or [N, C, L]) input, got " + shape_str(x.shape()));
  for (int i = 0; i < 2; ++i)
    if (size[size_t(i)] != 1 || win.stride[size_t(i)] != 1 || win.dilation[size_t(i)] != 1 ||
        win.pad[size_t(i)] != std::pair<int64_t, int64_t>{0, 0})
      b.fail("the window may only cover the spatial axes (size, stride, dilation and padding of the batch and channel "
             "axes must be 1, 1, 1 and (0, 0))");
  // A [N, C, L] input pools as [N, C, 1, L]: the window gets a unit axis at position 2.
  Tensor x4 = x;
  if (r == 3) {
    x4 = unsqueeze(x, 2);
    size.insert(size.begin() + 2, 1);
    win.stride.insert(win.stride.begin() + 2, 1);
    win.dilation.insert(win.dilation.begin() + 2, 1);
    win.pad.insert(win.pad.begin() + 2, {0, 0});
  }
  std::vector<int64_t> k = {size[2], size[3]}, stride = {win.stride[2], win.stride[3]},
                       dil = {win.dilation[2], win.dilation[3]},
                       pads = {win.pad[2].first, win.pad[3].first, win.pad[2].second, win.pad[3].second};
  bool padded = std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; });
  Tensor y;
  if (kind == Pool::Max) {
    Pool2dOptions o{.kernel = k, .stride = stride, .padding = pads, .dilation = dil};
    if (border == "constant" && padded) {
      // Padding with zeros takes part in the maximum: pad explicitly, then pool without padding.
      x4 = pad(x4, {0, 0, 0, 0, pads[0], pads[2], pads[1], pads[3]});
      o.padding = {0, 0};
    }
    y = max_pool2d(x4, o);
  } else {
    if (dil[0] != 1 || dil[1] != 1) b.fail("dilated average pooling is not supported");
    Pool2dOptions o{.kernel = k, .stride = stride, .padding = pads, .count_include_pad = border == "constant"};
    y = avg_pool2d(x4, o);
    if (kind == Pool::Box && !b.logical("normalize", false)) {
      if (border == "ignore" && padded) {
        // The sum over the valid positions: mean over them times their count (a constant).
        Tensor ones = b.g.full(Shape{1, 1, x4.dim(2), x4.dim(3)}, 1.0);
        Pool2dOptions oc = o;
        oc.count_include_pad = true;
        y = y * (avg_pool2d(ones, oc) * double(k[0] * k[1]));
      } else {
        y = y * double(k[0] * k[1]);
      }
    }
  }
  return one(r == 3 ? squeeze(y, 2) : y);
}

Result reduce_rule(Builder& b, const std::string& what) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> axes = b.ints("axes", {});
  if (!b.has("axes")) b.fail("missing argument 'axes'");
  for (int64_t& a : axes) a = b.axis(a, x.rank(), "reduction");
  if (what == "sum") {
    Tensor y = sum(x, axes, true);
    if (b.logical("normalize", false)) {
      int64_t n = 1;
      for (int64_t a : axes) n *= x.dim(int(a));
      y = y / double(n);
    }
    return one(y);
  }
  if (what == "mean") return one(mean(x, axes, true));
  if (what == "max") return one(max(x, axes, true));
  if (what == "min") return one(min(x, axes, true));
  if (axes.size() != 1) b.fail("argmax_reduce over several axes is not supported");
  return one(argmax(x, axes[0], true));
}

Result softmax_rule(Builder& b) {
  Tensor x = b.tensor("x");
  std::vector<int64_t> axes = b.ints("axes", {1});
  if (axes.empty()) b.fail("axes must not be empty");
  for (int64_t& a : axes) a = b.axis(a, x.rank(), "softmax");
  if (axes.size() == 1) return one(softmax(x, axes[0]));
  Tensor m = stop_gradient(max(x, axes, true));
  Tensor e = exp(x - m);
  return one(e / sum(e, axes, true));
}

Result reshape_rule(Builder& b) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> shape = b.ints("shape", {});
  if (!b.has("shape")) b.fail("missing argument 'shape'");
  int64_t start = b.integer("axis_start", 0), count = b.integer("axis_count", -1);
  int r = x.rank();
  if (start < 0 || start > r) b.fail("axis_start " + std::to_string(start) + " is out of range");
  if (count == -1) count = r - start;
  if (count < 0 || start + count > r) b.fail("axis_count " + std::to_string(count) + " is out of range");
  Shape out(x.shape().begin(), x.shape().begin() + start);
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d == 0) {
      if (start + int64_t(i) >= r) b.fail("shape value 0 at position " + std::to_string(i) + " copies no input axis");
      d = x.dim(int(start + int64_t(i)));
    } else if (d == -1) {
      if (infer >= 0) b.fail("shape has more than one -1");
      infer = int(out.size());
    } else if (d < 0) {
      b.fail("shape value " + std::to_string(d) + " is negative");
    }
    if (d != -1) known *= d;
    out.push_back(d);
  }
  int64_t span = 1;
  for (int64_t i = start; i < start + count; ++i) span *= x.dim(int(i));
  if (infer >= 0) {
    if (known == 0 || span % known) b.fail("cannot infer -1: " + std::to_string(span) + " elements do not divide by " + std::to_string(known));
    out[size_t(infer)] = span / known;
  } else if (known != span) {
    b.fail("shape " + shape_str(shape) + " holds " + std::to_string(known) + " elements, the input's axes hold " +
           std::to_string(span));
  }
  for (int64_t i = start + count; i < r; ++i) out.push_back(x.dim(int(i)));
  return one(reshape(x, out));
}

Result slice_rule(Builder& b) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> axes = b.ints("axes", {}), begin = b.ints("begin", {}), end = b.ints("end", {}),
                       stride = b.ints("stride", {});
  if (stride.empty()) stride.assign(axes.size(), 1);
  if (begin.size() != axes.size() || end.size() != axes.size() || stride.size() != axes.size())
    b.fail("axes, begin, end and stride need the same length");
  Tensor y = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    int a = b.axis(axes[i], x.rank(), "slice");
    int64_t d = x.dim(a), s = stride[i], lo = begin[i], hi = end[i];
    if (s <= 0) b.fail("only positive slice strides are supported");
    if (lo < 0) lo += d;
    if (hi <= 0 && end[i] == 0) hi = d;  // end 0 means the end of the axis
    else if (hi < 0) hi += d;
    lo = std::clamp<int64_t>(lo, 0, d);
    hi = std::clamp<int64_t>(hi, 0, d);
    if (hi <= lo) b.fail("slice of axis " + std::to_string(a) + " is empty");
    y = slice(y, a, lo, hi, s);
  }
  return one(y);
}

Result pad_rule(Builder& b) {
  Tensor x = b.tensor("input");
  auto p = b.padding("padding");
  const std::string border = b.string("border", "constant");
  check_border(b, border, {"constant", "replicate", "reflect", "reflect-even"});
  if (!p || p->size() != size_t(x.rank())) b.fail("padding needs one (front, back) pair per axis");
  if (edge_border(border)) return one(edge_pad(b, x, 0, *p, border));
  std::vector<int64_t> flat;
  for (auto [f, k] : *p) flat.push_back(f), flat.push_back(k);
  return one(pad(x, flat, b.number("value", 0.0)));
}

Result lrn_rule(Builder& b) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> size = b.ints("size", {});
  if (size.size() != size_t(x.rank())) b.fail("size needs one value per input axis");
  int ax = -1;
  for (int i = 0; i < x.rank(); ++i)
    if (size[size_t(i)] != 1) {
      if (ax >= 0) b.fail("only a window along one axis is supported");
      ax = i;
    }
  double alpha = b.number("alpha", 1.0), beta = b.number("beta", 0.5), bias = b.number("bias", 1.0);
  Tensor sq = square(x);
  Tensor acc = sq;
  if (ax >= 0) {
    int64_t n = size[size_t(ax)], d = x.dim(ax);
    auto [f, k] = same_pad(d, n, 1, 1);
    std::vector<int64_t> pads(2 * size_t(x.rank()), 0);
    pads[2 * size_t(ax)] = f;
    pads[2 * size_t(ax) + 1] = k;
    Tensor padded = pad(sq, pads);
    acc = slice(padded, ax, 0, d);
    for (int64_t j = 1; j < n; ++j) acc = acc + slice(padded, ax, j, j + d);
    acc = acc / double(n);
  }
  return one(x / pow(bias + alpha * acc, beta));
}

Result tile_rule(Builder& b) {
  Tensor x = b.tensor("input");
  std::vector<int64_t> reps = b.ints("repeats", {});
  if (reps.size() != size_t(x.rank())) b.fail("repeats needs one value per axis");
  int64_t total = x.numel();
  for (int i = 0; i < x.rank(); ++i) {
    if (reps[size_t(i)] <= 0 || reps[size_t(i)] > 4096) b.fail("repeats must be in 1..4096");
    total *= reps[size_t(i)];
    if (total > kMaxElements) b.fail("the tiled tensor is too large");
    if (reps[size_t(i)] > 1) x = concat(std::vector<Tensor>(size_t(reps[size_t(i)]), x), i);
  }
  return one(x);
}

Result source_rule(Builder& b, const std::string& kind) {
  if (!b.lhs || b.lhs->kind != K::Id) b.fail("the result of '" + kind + "' must be assigned to one identifier");
  const std::string& name = b.lhs->s;
  DType dt = b.dtype_of_generic();
  Shape shape = b.shape_arg("shape");
  if (kind == "external") {
    if (!b.externals.count(name)) b.fail("'" + name + "' is not one of the graph's inputs");
    auto bound = b.opt.input_shapes.find(name);
    if (bound != b.opt.input_shapes.end()) {
      if (bound->second.size() != shape.size())
        b.fail("bound shape " + shape_str(bound->second) + " for '" + name + "' must have the declared rank " +
               std::to_string(shape.size()));
      shape = bound->second;
    }
    b.inputs.push_back(name);
    return one(b.g.input(name, shape, dt));
  }
  if (kind == "constant") {
    std::vector<double> v = b.numbers(b.arg("value"), "value");
    int64_t n = numel(shape);
    if (n > kMaxConstant) b.fail("constant of shape " + shape_str(shape) + " is too large (at most " + std::to_string(kMaxConstant) + " elements)");
    if (v.size() == 1) v.assign(size_t(n), v[0]);
    if (int64_t(v.size()) != n)
      b.fail("value holds " + std::to_string(v.size()) + " numbers, shape " + shape_str(shape) + " needs 1 or " +
             std::to_string(n));
    if (dt == DType::I32) {
      std::vector<int32_t> iv;
      for (double d : v) {
        if (d != std::floor(d) || std::fabs(d) > 2147483647.0) b.fail("integer constant value " + std::to_string(d) + " does not fit i32");
        iv.push_back(int32_t(d));
      }
      return one(b.g.constant_i32(shape, iv));
    }
    std::vector<float> fv(v.begin(), v.end());
    if (dt == DType::Bool)
      for (float& f : fv) f = f != 0 ? 1.0f : 0.0f;
    return one(b.g.constant(shape, fv, dt));
  }
  // variable
  std::string label = b.string("label", "");
  if (label.empty()) b.fail("missing argument 'label'");
  namespace fs = std::filesystem;
  fs::path rel(label);
  if (rel.is_absolute() || rel.has_root_name() ||
      std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".." || c == "."; }))
    b.fail("label '" + label + "' must be a relative path inside the model's folder");
  auto it = b.params.find(label);
  if (it != b.params.end()) {
    if (it->second.shape() != shape)
      b.fail("variable '" + label + "' is declared again with shape " + shape_str(shape) + ", first " +
             shape_str(it->second.shape()));
    return one(it->second);
  }
  std::optional<std::string> bytes = b.load(label);
  if (!bytes) b.fail("variable '" + label + "': the tensor file '" + label + ".dat' is missing");
  TensorData t = read_tensor_bytes(*bytes, label + ".dat");
  if (t.shape != shape)
    b.fail("variable '" + label + "': '" + label + ".dat' holds shape " + shape_str(t.shape) + ", the graph declares " +
           shape_str(shape));
  bool float_item = t.item_type == ItemType::Float;
  bool want_float = dt == DType::F32;
  if (float_item != want_float || (dt == DType::Bool && t.item_type != ItemType::Bool) ||
      (dt == DType::I32 && t.item_type != ItemType::Int && t.item_type != ItemType::Uint))
    b.fail("variable '" + label + "': '" + label + ".dat' holds " + std::to_string(t.bits) + "-bit " +
           (t.item_type == ItemType::Float  ? "float"
            : t.item_type == ItemType::Bool ? "logical"
                                            : "integer") +
           " items, the graph declares " + (b.st->generic.empty() ? "scalar" : b.st->generic));
  Tensor out;
  if (dt == DType::F32) {
    out = b.g.parameter(label, shape, Init::from_data(std::vector<float>(t.values.begin(), t.values.end())));
    if (!b.opt.trainable) b.g.ir().node_mut(out.id()).trainable = false;
    b.parameter_count += numel(shape);
  } else if (dt == DType::I32) {
    std::vector<int32_t> iv;
    for (double d : t.values) {
      if (std::fabs(d) > 2147483647.0) b.fail("variable '" + label + "': value " + std::to_string(d) + " does not fit i32");
      iv.push_back(int32_t(d));
    }
    out = b.g.constant_i32(shape, iv);
  } else {
    out = b.g.constant(shape, std::vector<float>(t.values.begin(), t.values.end()), DType::Bool);
  }
  b.params.emplace(label, out);
  return one(out);
}

using UnaryFn = Tensor (*)(Tensor);
Rule unary(UnaryFn f) {
  return {{"x"}, [f](Builder& b) { return one(f(b.tensor("x"))); }};
}
Rule binary(Tensor (*f)(Tensor, Tensor)) {
  return {{"x", "y"}, [f](Builder& b) {
            auto [x, y] = operands(b);
            return one(f(x, y));
          }};
}

// A distinct node for floats (an output may then be named apart from its source); integer and logical
// tensors are bound as they are.
Tensor copy_fn(Tensor x) { return x.dtype() == DType::F32 ? x * 1.0 : x; }
Tensor sqr_fn(Tensor x) { return square(x); }
// floor through a truncating i32 cast, exact where |x| < 2^23 (beyond it every f32 is an integer already).
Tensor floor_fn(Tensor x) {
  const double big = 8388608.0;
  Tensor t = cast(cast(clamp(x, -big, big), DType::I32), DType::F32);
  Tensor f = t - cast(greater(t, x), DType::F32);
  return where(less(abs(x), abs(x) * 0.0 + big), f, x);
}
Tensor ceil_fn(Tensor x) { return -floor_fn(-x); }
Tensor sign_fn(Tensor x) {
  Tensor zero = x * 0.0;
  return cast(greater(x, zero), DType::F32) - cast(less(x, zero), DType::F32);
}
Tensor rsqr_fn(Tensor x) { return reciprocal(square(x)); }
Tensor log2_fn(Tensor x) { return log(x) * (1.0 / std::log(2.0)); }
const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> table = [] {
    std::map<std::string, Rule> t;
    t["external"] = {{"shape"}, [](Builder& b) { return source_rule(b, "external"); }};
    t["variable"] = {{"shape", "label"}, [](Builder& b) { return source_rule(b, "variable"); }};
    t["constant"] = {{"shape", "value"}, [](Builder& b) { return source_rule(b, "constant"); }};
    // elementwise
    t["copy"] = unary(copy_fn);
    t["neg"] = unary(mgn::neg);
    t["rcp"] = unary(mgn::reciprocal);
    t["exp"] = unary(mgn::exp);
    t["log"] = unary(mgn::log);
    t["log2"] = unary(log2_fn);
    t["sin"] = unary(mgn::sin);
    t["cos"] = unary(mgn::cos);
    t["abs"] = unary(mgn::abs);
    t["sqr"] = unary(sqr_fn);
    t["floor"] = unary(floor_fn);
    t["ceil"] = unary(ceil_fn);
    t["sign"] = unary(sign_fn);
    t["sqrt"] = unary(mgn::sqrt);
    t["rsqr"] = unary(rsqr_fn);
    t["rsqrt"] = unary(mgn::rsqrt);
    t["relu"] = unary(mgn::relu);
    t["sigmoid"] = unary(mgn::sigmoid);
    t["tanh"] = unary(mgn::tanh);
    t["softplus"] = unary(mgn::softplus);
    t["gelu"] = unary(mgn::gelu);
    t["silu"] = unary(mgn::silu);
    t["not"] = {{"x"}, [](Builder& b) { return one(equal(b.tensor("x"), b.g.scalar(0, DType::Bool))); }};
    t["elu"] = {{"x", "alpha"}, [](Builder& b) {
                  Tensor x = b.tensor("x");
                  double a = b.number("alpha", 1.0);
                  return one(where(greater(x, b.g.scalar(0)), x, a * (exp(minimum(x, b.g.scalar(0))) - 1.0)));
                }};
    t["leaky_relu"] = {{"x", "alpha"}, [](Builder& b) { return one(leaky_relu(b.tensor("x"), b.number(b.arg("alpha"), "alpha"))); }};
    t["prelu"] = {{"x", "alpha"}, [](Builder& b) {
                    auto [x, a] = operands(b, "x", "alpha");
                    return one(where(greater(x, b.g.scalar(0)), x, x * a));
                  }};
    t["add"] = binary(mgn::add);
    t["sub"] = binary(mgn::sub);
    t["mul"] = binary(mgn::mul);
    t["div"] = binary(mgn::div);
    t["min"] = binary(mgn::minimum);
    t["max"] = binary(mgn::maximum);
    t["lt"] = binary(mgn::less);
    t["gt"] = binary(mgn::greater);
    t["le"] = binary(mgn::less_equal);
    t["ge"] = binary(mgn::greater_equal);
    t["eq"] = binary(mgn::equal);
    t["ne"] = binary(mgn::not_equal);
    t["and"] = {{"x", "y"}, [](Builder& b) {
                  auto [x, y] = operands(b);
                  return one(where(x, y, x));
                }};
    t["or"] = {{"x", "y"}, [](Builder& b) {
                 auto [x, y] = operands(b);
                 return one(where(x, x, y));
               }};
    t["pow"] = {{"x", "y"}, [](Builder& b) {
                  if (b.is_literal("y")) return one(pow(b.tensor("x"), b.arg("y").num));
                  auto [x, y] = operands(b);
                  return one(exp(y * log(x)));  // a tensor exponent: defined for positive bases
                }};
    t["select"] = {{"condition", "true_value", "false_value"}, [](Builder& b) {
                     Tensor c = b.tensor("condition");
                     auto [x, y] = operands(b, "true_value", "false_value");
                     auto [c2, x2] = align(c, x);
                     auto [c3, y2] = align(c2, y);
                     return one(where(c3, x2, y2));
                   }};
    t["clamp"] = {{"x", "a", "b"}, [](Builder& b) {
                    if (b.is_literal("a") && b.is_literal("b"))
                      return one(clamp(b.tensor("x"), b.arg("a").num, b.arg("b").num));
                    auto [x, lo] = operands(b, "x", "a");
                    auto [x2, hi] = align(x, b.tensor(b.arg("b"), "b"));
                    return one(minimum(maximum(x2, lo), hi));
                  }};
    // reductions (reduced axes are kept as singletons)
    t["sum_reduce"] = {{"input", "axes", "normalize"}, [](Builder& b) { return reduce_rule(b, "sum"); }};
    t["mean_reduce"] = {{"input", "axes"}, [](Builder& b) { return reduce_rule(b, "mean"); }};
    t["max_reduce"] = {{"input", "axes"}, [](Builder& b) { return reduce_rule(b, "max"); }};
    t["min_reduce"] = {{"input", "axes"}, [](Builder& b) { return reduce_rule(b, "min"); }};
    t["argmax_reduce"] = {{"input", "axes"}, [](Builder& b) { return reduce_rule(b, "argmax"); }};
    t["moments"] = {{"input", "axes"}, [](Builder& b) {
                      Tensor x = b.tensor("input");
                      std::vector<int64_t> axes = b.ints("axes", {});
                      for (int64_t& a : axes) a = b.axis(a, x.rank(), "moments");
                      Tensor m = mean(x, axes, true);
                      return Result{{m, mean(square(x - m), axes, true)}, false};
                    }};
    t["softmax"] = {{"x", "axes"}, softmax_rule};
    // linear algebra
    t["matmul"] = {{"A", "B", "transposeA", "transposeB"}, [](Builder& b) {
                     Tensor a = b.tensor("A"), c = b.tensor("B");
                     return one(matmul(a, c, b.logical("transposeA", false), b.logical("transposeB", false)));
                   }};
    t["linear"] = {{"input", "filter", "bias"}, [](Builder& b) {
                     Tensor x = b.tensor("input"), w = b.tensor("filter");
                     if (x.rank() != 2 || w.rank() != 2)
                       b.fail("input and filter must be matrices, got " + shape_str(x.shape()) + " and " + shape_str(w.shape()));
                     if (x.dim(1) != w.dim(1))
                       b.fail("filter " + shape_str(w.shape()) + " does not take input " + shape_str(x.shape()) +
                              " (filter is [out, in])");
                     return one(add_bias(b, linear(x, w)));
                   }};
    t["conv"] = {{"input", "filter", "bias", "border", "padding", "stride", "dilation", "groups"}, conv_rule};
    t["deconv"] = {{"input", "filter", "bias", "border", "padding", "stride", "dilation", "output_shape", "groups"},
                   deconv_rule};
    t["max_pool"] = {{"input", "size", "border", "padding", "stride", "dilation"},
                     [](Builder& b) { return pool_rule(b, Pool::Max); }};
    t["avg_pool"] = {{"input", "size", "border", "padding", "stride", "dilation"},
                     [](Builder& b) { return pool_rule(b, Pool::Avg); }};
    t["box"] = {{"input", "size", "border", "padding", "stride", "dilation", "normalize"},
                [](Builder& b) { return pool_rule(b, Pool::Box); }};
    t["batch_normalization"] = {{"input", "mean", "variance", "offset", "scale", "epsilon"}, [](Builder& b) {
                                  Tensor x = b.tensor("input");
                                  auto side = [&](const char* n) { return align(b.tensor(n), x).first; };
                                  double eps = b.number(b.arg("epsilon"), "epsilon");
                                  Tensor y = (x - side("mean")) * rsqrt(side("variance") + eps);
                                  if (b.has("scale")) y = y * side("scale");
                                  if (b.has("offset")) y = y + side("offset");
                                  return one(y);
                                }};
    t["local_response_normalization"] = {{"input", "size", "alpha", "beta", "bias"}, lrn_rule};
    // shapes and data movement
    t["reshape"] = {{"input", "shape", "axis_start", "axis_count"}, reshape_rule};
    t["squeeze"] = {{"input", "axes"}, [](Builder& b) {
                      Tensor x = b.tensor("input");
                      std::vector<int64_t> axes = b.ints("axes", {});
                      for (int64_t& a : axes) a = b.axis(a, x.rank(), "squeeze");
                      std::sort(axes.rbegin(), axes.rend());
                      for (int64_t a : axes) {
                        if (x.dim(int(a)) != 1) b.fail("cannot squeeze axis " + std::to_string(a) + " of extent " + std::to_string(x.dim(int(a))));
                        x = squeeze(x, a);
                      }
                      return one(x);
                    }};
    t["unsqueeze"] = {{"input", "axes"}, [](Builder& b) {
                        Tensor x = b.tensor("input");
                        std::vector<int64_t> axes = b.ints("axes", {});
                        std::sort(axes.begin(), axes.end());
                        for (int64_t a : axes) {
                          if (a < 0 || a > x.rank()) b.fail("unsqueeze axis " + std::to_string(a) + " is out of range");
                          x = unsqueeze(x, a);
                        }
                        return one(x);
                      }};
    t["transpose"] = {{"input", "axes"}, [](Builder& b) {
                        Tensor x = b.tensor("input");
                        std::vector<int64_t> axes = b.ints("axes", {});
                        if (axes.size() > size_t(x.rank())) b.fail("axes has more entries than the input has axes");
                        for (int64_t i = int64_t(axes.size()); i < x.rank(); ++i) axes.push_back(i);  // the rest stay
                        std::vector<int64_t> seen(axes.size(), 0);
                        for (int64_t a : axes) {
                          if (a < 0 || a >= x.rank() || seen[size_t(a)]++) b.fail("axes " + shape_str(axes) + " is not a permutation");
                        }
                        return one(permute(x, axes));
                      }};
    t["concat"] = {{"values", "axis"}, [](Builder& b) {
                     std::vector<Tensor> xs = b.tensors("values");
                     if (xs.empty()) b.fail("values is empty");
                     int a = b.axis(b.integer(b.arg("axis"), "axis"), xs[0].rank(), "concat");
                     return one(xs.size() == 1 ? xs[0] : concat(xs, a));
                   }};
    t["stack"] = {{"values", "axis"}, [](Builder& b) {
                    std::vector<Tensor> xs = b.tensors("values");
                    if (xs.empty()) b.fail("values is empty");
                    int64_t a = b.integer(b.arg("axis"), "axis");
                    if (a < 0 || a > xs[0].rank()) b.fail("stack axis is out of range");
                    for (Tensor& x : xs) x = unsqueeze(x, a);
                    return one(xs.size() == 1 ? xs[0] : concat(xs, a));
                  }};
    t["split"] = {{"value", "axis", "ratios"}, [](Builder& b) {
                    Tensor x = b.tensor("value");
                    int a = b.axis(b.integer(b.arg("axis"), "axis"), x.rank(), "split");
                    std::vector<int64_t> ratios = b.ints("ratios", {});
                    int64_t total = 0;
                    for (int64_t r : ratios) {
                      if (r <= 0) b.fail("ratios must be positive");
                      total += r;
                    }
                    if (ratios.empty() || x.dim(a) % total) b.fail("ratios do not divide axis " + std::to_string(a) + " of extent " + std::to_string(x.dim(a)));
                    std::vector<int64_t> sizes;
                    for (int64_t r : ratios) sizes.push_back(x.dim(a) / total * r);
                    return Result{split(x, sizes, a), true};
                  }};
    t["unstack"] = {{"value", "axis"}, [](Builder& b) {
                      Tensor x = b.tensor("value");
                      int a = b.axis(b.integer(b.arg("axis"), "axis"), x.rank(), "unstack");
                      Result r{{}, true};
                      for (int64_t i = 0; i < x.dim(a); ++i) r.ts.push_back(squeeze(slice(x, a, i, i + 1), a));
                      return r;
                    }};
    t["slice"] = {{"input", "axes", "begin", "end", "stride"}, slice_rule};
    t["pad"] = {{"input", "padding", "border", "value"}, pad_rule};
    t["tile"] = {{"input", "repeats"}, tile_rule};
    t["add_n"] = {{"x"}, [](Builder& b) {
                    std::vector<Tensor> xs = b.tensors("x");
                    if (xs.empty()) b.fail("x is empty");
                    Tensor s = xs[0];
                    for (size_t i = 1; i < xs.size(); ++i) s = add(s, xs[i]);
                    return one(s);
                  }};
    t["nearest_upsample"] = {{"input", "factors"}, [](Builder& b) {
                               Tensor x = b.tensor("input");
                               std::vector<int64_t> f = b.ints("factors", {});
                               if (x.rank() != 4 || f.size() != 2 || f[0] <= 0 || f[1] <= 0)
                                 b.fail("needs a [N, C, H, W] input and two positive factors");
                               return one(upsample_nearest2d(x, f[0], f[1]));
                             }};
    t["nearest_downsample"] = {{"input", "factors"}, [](Builder& b) {
                                 Tensor x = b.tensor("input");
                                 std::vector<int64_t> f = b.ints("factors", {});
                                 if (f.size() + 2 != size_t(x.rank())) b.fail("factors needs one value per spatial axis");
                                 for (size_t i = 0; i < f.size(); ++i) {
                                   if (f[i] <= 0) b.fail("factors must be positive");
                                   x = slice(x, int64_t(i) + 2, 0, x.dim(int(i) + 2), f[i]);
                                 }
                                 return one(x);
                               }};
    return t;
  }();
  return table;
}

void Builder::run(const Document& d) {
  for (const std::string& in : d.inputs) {
    if (!externals.insert(in).second) throw Error(origin + ": graph input '" + in + "' is listed twice");
  }
  const auto& table = rules();
  // Every unknown op at once, so a user sees the whole gap in one run.
  std::string unknown;
  int count = 0;
  auto scan = [&](const Expr& e, auto&& self) -> void {
    if (e.kind == K::Call && !table.count(e.s)) {
      unknown += "\n  " + where(e.line, e.col) + "'" + e.s + "'";
      ++count;
    }
    for (const Expr& i : e.items) self(i, self);
  };
  for (const Stmt& s : d.stmts) scan(s.call, scan);
  if (count)
    throw Error(origin + ": " + std::to_string(count) + " operation(s) are not supported:" + unknown);
  for (const Stmt& s : d.stmts) {
    Result r = invoke(s.call, &s.lhs);
    st = &s.call;
    auto bind = [&](const Expr& id, Val v) {
      if (env.count(id.s))
        throw Error(where(id.line, id.col) + "'" + id.s + "' is assigned twice");
      env.emplace(id.s, std::move(v));
    };
    if (s.lhs.kind == K::Id) {
      if (r.list) bind(s.lhs, Val{Tensor(), true, r.ts});
      else if (r.ts.size() == 1) bind(s.lhs, Val{r.ts[0]});
      else fail("returns " + std::to_string(r.ts.size()) + " results; assign them to a tuple (a, b)");
    } else {
      const std::vector<Expr>* ids = &s.lhs.items;
      // [a, b] = split(...) or (a, b) = moments(...).
      if (ids->size() == 1 && (*ids)[0].kind == K::Array) ids = &(*ids)[0].items;
      if (ids->size() != r.ts.size())
        fail("returns " + std::to_string(r.ts.size()) + " results, the left side names " + std::to_string(ids->size()));
      for (size_t i = 0; i < ids->size(); ++i) {
        if ((*ids)[i].kind != K::Id) fail("nested results on the left side are not supported");
        bind((*ids)[i], Val{r.ts[i]});
      }
    }
  }
  st = nullptr;
  for (const std::string& in : d.inputs)
    if (std::find(inputs.begin(), inputs.end(), in) == inputs.end())
      throw Error(origin + ": graph input '" + in + "' is not defined by an external statement");
  for (const auto& [name, _] : opt.input_shapes)
    if (!externals.count(name)) throw Error(origin + ": a shape is given for '" + name + "', which is not a graph input");
}

Result Builder::invoke(const Expr& call, const Expr* lhs_of) {
  const Expr* saved_st = st;
  const Expr* saved_lhs = lhs;
  std::map<std::string, const Expr*> saved_args;
  saved_args.swap(args);
  st = &call;
  lhs = lhs_of;
  const Rule& rule = rules().at(call.s);
  size_t positional = 0;
  for (size_t i = 0; i < call.items.size(); ++i) {
    const std::string& k = call.names[i];
    const Expr& e = call.items[i];
    if (k.empty()) {
      if (positional >= rule.params.size())
        fail("takes at most " + std::to_string(rule.params.size()) + " arguments");
      args[rule.params[positional++]] = &e;
      continue;
    }
    if (std::find(rule.params.begin(), rule.params.end(), k) == rule.params.end()) {
      std::string list;
      for (const std::string& p : rule.params) list += (list.empty() ? "" : ", ") + p;
      fail_at(e, "unknown argument '" + k + "' (expected: " + list + ")");
    }
    if (args.count(k)) fail_at(e, "argument '" + k + "' is given twice");
    args[k] = &e;
  }
  if (!call.generic.empty() && call.s != "external" && call.s != "variable" && call.s != "constant")
    fail("only external, variable and constant take a type argument");
  Result r;
  try {
    r = rule.fn(*this);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind(origin + ":", 0) == 0) throw;
    fail(what);
  }
  st = saved_st;
  lhs = saved_lhs;
  args.swap(saved_args);
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open NNEF graph '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string graph_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    fs::path p = fs::path(path) / "graph.nnef";
    if (!fs::is_regular_file(p)) throw Error(path + ": the folder holds no graph.nnef");
    return p.string();
  }
  return path;
}

}  // namespace

Imported import_text(const std::string& text, const std::string& origin, const DatLoader& load,
                     const ImportOptions& opt) {
  Document d = nnef_impl::parse(text, origin);
  Imported out;
  out.version = d.version;
  out.extensions = d.extensions;
  Builder b(out.graph, opt, load, origin);
  b.run(d);
  out.inputs = d.inputs;
  for (const std::string& o : d.outputs) {
    auto it = b.env.find(o);
    if (it == b.env.end()) throw Error(origin + ": graph output '" + o + "' is not computed by any statement");
    if (it->second.is_list) throw Error(origin + ": graph output '" + o + "' is an array of tensors");
    if (std::count(d.outputs.begin(), d.outputs.end(), o) > 1) throw Error(origin + ": graph output '" + o + "' is listed twice");
    out.graph.output(o, it->second.t);
    out.outputs.push_back(o);
  }
  out.parameter_count = b.parameter_count;
  out.graph.verify();
  return out;
}

Imported import_path(const std::string& path, const ImportOptions& opt) {
  namespace fs = std::filesystem;
  const std::string file = graph_file(path);
  const fs::path dir = fs::path(file).parent_path();
  DatLoader load = [&](const std::string& label) -> std::optional<std::string> {
    fs::path p = dir / (label + ".dat");
    if (!fs::is_regular_file(p)) return std::nullopt;
    return read_text(p.string());
  };
  try {
    return import_text(read_text(file), file, load, opt);
  } catch (const Error& e) {
    std::string what = e.what();
    // Tensor-file errors name the .dat file relative to the folder: give its full path.
    throw Error(what.rfind(file, 0) == 0 ? what : file + ": " + what);
  }
}

bool is_nnef_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return fs::is_regular_file(fs::path(path) / "graph.nnef");
  return fs::path(path).extension() == ".nnef";
}

std::string inspect_text(const std::string& text, const std::string& origin) {
  Document d = nnef_impl::parse(text, origin);
  std::ostringstream s;
  s << origin << ": NNEF " << d.version << ", graph '" << d.name << "'";
  for (const std::string& e : d.extensions) s << ", extension " << e;
  s << "\n";
  std::map<std::string, const Stmt*> def;
  for (const Stmt& st : d.stmts)
    if (st.lhs.kind == K::Id) def[st.lhs.s] = &st;
  auto named = [](const Stmt& st, const std::string& key) -> const Expr* {
    for (size_t i = 0; i < st.call.items.size(); ++i)
      if (st.call.names[i] == key) return &st.call.items[i];
    return nullptr;
  };
  auto shape_of = [&](const Stmt& st) {
    if (const Expr* e = named(st, "shape"); e && e->kind == K::Array) {
      std::string r = "[";
      for (size_t i = 0; i < e->items.size(); ++i) r += (i ? ", " : "") + std::to_string(int64_t(e->items[i].num));
      return r + "]";
    }
    return std::string("[?]");
  };
  s << "inputs:\n";
  for (const std::string& in : d.inputs) {
    auto it = def.find(in);
    s << "  " << in << ": " << (it != def.end() && it->second->call.s == "external" ? shape_of(*it->second) : "(no external)") << "\n";
  }
  s << "outputs:\n";
  for (const std::string& o : d.outputs) s << "  " << o << "\n";
  std::map<std::string, int> hist;
  int variables = 0;
  for (const Stmt& st : d.stmts) {
    auto count_ops = [&](const Expr& e, auto&& self) -> void {
      if (e.kind == K::Call) hist[e.s]++;
      for (const Expr& i : e.items) self(i, self);
    };
    count_ops(st.call, count_ops);
    if (st.call.s == "variable") ++variables;
  }
  s << "ops (" << d.stmts.size() << " statements):\n";
  const auto& table = rules();
  for (const auto& [op, n] : hist) s << "  " << op << " x" << n << (table.count(op) ? "" : "  (unsupported)") << "\n";
  s << "variables: " << variables << "\n";
  for (const Stmt& st : d.stmts)
    if (st.call.s == "variable") {
      std::string label = "?";
      if (const Expr* e = named(st, "label"); e && e->kind == K::Str) label = e->s;
      s << "  " << label << " " << shape_of(st) << "\n";
    }
  return s.str();
}

std::string inspect(const std::string& path) {
  const std::string file = graph_file(path);
  return inspect_text(read_text(file), file);
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> v;
  for (const auto& [name, _] : rules()) v.push_back(name);
  return v;
}

}  // namespace mgn::nnef
