// NNEF export: writes a graph as graph.nnef (one statement per node, in node order) plus one .dat file per
// parameter (label = its name) and per large constant. The IR broadcasts like numpy (axes align from the
// right) and NNEF from the left, so a lower-rank operand of a broadcasting op is first unsqueezed on its
// leading axes. Ops with no NNEF form (attention, rope, gathers, losses, derivative helpers, ...) are listed in
// one error.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "io/nnef/nnef_internal.h"
#include "ir/graph.h"
#include "ir/op.h"

namespace mgn::nnef {

namespace {

using ir::Op;

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  std::string s = b;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // a real literal
  if (s == "inf" || s == "-inf" || s == "nan" || s == "-nan")
    throw Error("NNEF export: the value " + s + " has no NNEF literal");
  return s;
}

std::string ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string type_of(DType d) {
  switch (d) {
    case DType::I32: return "integer";
    case DType::Bool: return "logical";
    default: return "scalar";
  }
}

bool is_identifier(const std::string& s) {
  static const std::set<std::string> reserved = {"version", "extension", "graph", "fragment", "true", "false",
                                                 "tensor", "integer", "scalar", "logical", "string"};
  if (s.empty() || reserved.count(s) || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return s.rfind("t_", 0) != 0;  // t_<id> names the other nodes
}

class Writer {
 public:
  Writer(const ir::Graph& g, const std::string& dir, const ExportOptions& opt) : g(g), dir(dir), opt(opt) {}

  void run() {
    std::vector<std::string> bad;
    for (const ir::Node& n : g.nodes())
      if (!supported(n)) bad.push_back(g.describe(n.id));
    if (!bad.empty()) {
      std::string msg = "NNEF export: " + std::to_string(bad.size()) + " node(s) have no NNEF form:";
      for (const std::string& b : bad) msg += "\n  " + b;
      throw Error(msg);
    }
    std::filesystem::create_directories(dir);
    std::set<std::string> used;
    auto unique = [&](std::string s, const std::string& fallback) {
      if (!is_identifier(s)) s = fallback;
      std::string base = s;
      for (int k = 1; used.count(s); ++k) s = base + "_" + std::to_string(k);
      used.insert(s);
      return s;
    };
    names.resize(size_t(g.size()));
    std::vector<std::string> ins, outs;
    for (const ir::Node& n : g.nodes()) {
      names[size_t(n.id)] = "t_" + std::to_string(n.id);
      if (n.op == Op::Input) {
        names[size_t(n.id)] = unique(n.name, "input_" + std::to_string(ins.size()));
        ins.push_back(names[size_t(n.id)]);
      }
    }
    for (const ir::Node& n : g.nodes()) emit(n);
    for (const auto& [name, id] : g.outputs()) {
      std::string o = unique(name, "output_" + std::to_string(outs.size()));
      body << "    " << o << " = copy(" << names[size_t(id)] << ");\n";
      outs.push_back(o);
    }
    std::ofstream f(std::filesystem::path(dir) / "graph.nnef");
    f << "version 1.0;\n\ngraph G( ";
    for (size_t i = 0; i < ins.size(); ++i) f << (i ? ", " : "") << ins[i];
    f << " ) -> ( ";
    for (size_t i = 0; i < outs.size(); ++i) f << (i ? ", " : "") << outs[i];
    f << " )\n{\n" << body.str() << "}\n";
    if (!f) throw Error("NNEF export: cannot write " + (std::filesystem::path(dir) / "graph.nnef").string());
  }

 private:
  const ir::Graph& g;
  const std::string& dir;
  const ExportOptions& opt;
  std::vector<std::string> names;
  std::ostringstream body;

  static bool supported(const ir::Node& n) {
    switch (n.op) {
      case Op::Input: case Op::Parameter: case Op::Constant: case Op::Full:
      case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Reciprocal:
      case Op::Square: case Op::Relu: case Op::LeakyRelu: case Op::GeluErf: case Op::Silu: case Op::Sigmoid:
      case Op::Tanh: case Op::Softplus: case Op::Sin: case Op::Cos: case Op::PowScalar: case Op::Clamp:
      case Op::StopGradient:
      case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum: case Op::Equal:
      case Op::NotEqual: case Op::Less: case Op::LessEqual: case Op::Greater: case Op::GreaterEqual: case Op::Where:
      case Op::ReduceSum: case Op::ReduceMean: case Op::ReduceMax: case Op::ReduceMin: case Op::ArgMax:
      case Op::Softmax: case Op::LogSoftmax: case Op::LogSumExp: case Op::MatMul: case Op::LayerNorm:
      case Op::RmsNorm: case Op::GroupNorm: case Op::BatchNorm: case Op::Conv2d: case Op::Conv2dGradInput: case Op::MaxPool2d: case Op::AvgPool2d:
      case Op::Upsample2d: case Op::Reshape: case Op::Permute: case Op::Concat: case Op::Expand:
        return true;
      case Op::Cast: return true;  // same-type casts only; checked when emitted
      case Op::Slice: {
        for (int64_t s : n.attrs.ints("steps"))
          if (s <= 0) return false;
        return true;
      }
      case Op::Pad: {
        for (int64_t p : n.attrs.ints("pads"))
          if (p < 0) return false;
        return true;
      }
      case Op::GeluTanh: case Op::Erf:
      case Op::ReluGrad: case Op::GeluErfGrad: case Op::GeluTanhGrad: case Op::SiluGrad:
      case Op::LayerNormGrad: case Op::RmsNormGrad: case Op::GroupNormGrad:
      case Op::BatchNormGrad: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad: case Op::AvgPool2dGrad:
      case Op::Upsample2dGrad: case Op::Attention: case Op::AttentionLse: case Op::AttentionGradQ:
      case Op::AttentionGradK: case Op::AttentionGradV: case Op::Rope: case Op::SliceGrad: case Op::Gather:
      case Op::GatherGrad: case Op::OneHot: case Op::GatherElements: case Op::ScatterElements: case Op::CrossEntropy:
      case Op::CrossEntropyGrad: case Op::Assign:
        return false;
    }
    return false;
  }

  const std::string& in(const ir::Node& n, size_t k) const { return names[size_t(n.inputs.at(k))]; }
  const ir::Node& src(const ir::Node& n, size_t k) const { return g.node(n.inputs.at(k)); }
  // Input k raised to `rank` by leading singleton axes (numpy alignment in NNEF's left-aligned broadcasting).
  std::string aligned(const ir::Node& n, size_t k, size_t rank) const {
    size_t r = src(n, k).shape.size();
    if (r == 0 || r >= rank) return in(n, k);
    std::vector<int64_t> axes;
    for (size_t i = 0; i < rank - r; ++i) axes.push_back(int64_t(i));
    return "unsqueeze(" + in(n, k) + ", axes = " + ints(axes) + ")";
  }
  void write_dat(const std::string& label, const Shape& shape, const std::vector<double>& v, DType dt) {
    std::filesystem::path p = std::filesystem::path(dir) / (label + ".dat");
    std::filesystem::create_directories(p.parent_path());
    std::ofstream f(p, std::ios::binary);
    std::string bytes = dt == DType::I32    ? write_tensor_bytes(shape, v, ItemType::Int, 32)
                        : dt == DType::Bool ? write_tensor_bytes(shape, v, ItemType::Bool, 8)
                                            : write_tensor_bytes(shape, v);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) throw Error("NNEF export: cannot write " + p.string());
  }
  std::string reduce(const std::string& op, const std::string& x, const std::vector<int64_t>& axes) const {
    return op + "(" + x + ", axes = " + ints(axes) + ")";
  }

  void emit(const ir::Node& n) {
    const std::string& y = names[size_t(n.id)];
    const ir::Attrs& a = n.attrs;
    const size_t r = n.shape.size();
    auto line = [&](const std::string& rhs) { body << "    " << y << " = " << rhs << ";\n"; };
    auto binary = [&](const char* op) { line(std::string(op) + "(" + aligned(n, 0, r) + ", " + aligned(n, 1, r) + ")"); };
    auto keep = [&](const std::string& e, const std::vector<int64_t>& axes, bool keepdim) {
      line(keepdim || axes.empty() ? e : "squeeze(" + e + ", axes = " + ints(axes) + ")");
    };
    auto axes_of = [&](std::vector<int64_t> ax, size_t rank) {
      if (ax.empty())
        for (size_t i = 0; i < rank; ++i) ax.push_back(int64_t(i));
      for (int64_t& v : ax)
        if (v < 0) v += int64_t(rank);
      return ax;
    };
    auto pads2 = [&](const std::vector<int64_t>& p) {  // [top, left, bottom, right] -> NNEF pairs
      return "[(" + std::to_string(p[0]) + ", " + std::to_string(p[2]) + "), (" + std::to_string(p[1]) + ", " +
             std::to_string(p[3]) + ")]";
    };
    switch (n.op) {
      case Op::Input: line("external<" + type_of(n.dtype) + ">(shape = " + ints(n.shape) + ")"); return;
      case Op::Parameter: {
        std::optional<std::vector<float>> v = opt.values ? opt.values(n.name) : std::nullopt;
        std::vector<float> vals = v ? *v : materialize(n.init, n.shape, n.name);
        if (int64_t(vals.size()) != numel(n.shape))
          throw Error("NNEF export: parameter '" + n.name + "' has " + std::to_string(vals.size()) + " values, shape " +
                      shape_str(n.shape) + " needs " + std::to_string(numel(n.shape)));
        write_dat(n.name, n.shape, std::vector<double>(vals.begin(), vals.end()), n.dtype);
        std::string label = n.name;
        line("variable<" + type_of(n.dtype) + ">(shape = " + ints(n.shape) + ", label = '" + label + "')");
        if (label.find('\'') != std::string::npos || label.find("..") != std::string::npos)
          throw Error("NNEF export: parameter name '" + label + "' cannot be an NNEF label");
        return;
      }
      case Op::Constant: {
        const std::vector<double>& v = *n.data;
        if (v.size() <= 64) {
          std::string s = "[";
          for (size_t i = 0; i < v.size(); ++i)
            s += (i ? ", " : "") + (n.dtype == DType::F32 || n.dtype == DType::F16 || n.dtype == DType::BF16
                                        ? num(v[i])
                                        : n.dtype == DType::Bool ? std::string(v[i] != 0 ? "true" : "false")
                                                                 : std::to_string(int64_t(v[i])));
          line("constant<" + type_of(n.dtype) + ">(shape = " + ints(n.shape) + ", value = " + s + "])");
        } else {
          std::string label = "constants/" + y;
          write_dat(label, n.shape, v, n.dtype);
          line("variable<" + type_of(n.dtype) + ">(shape = " + ints(n.shape) + ", label = '" + label + "')");
        }
        return;
      }
      case Op::Full: {
        double v = a.f("value");
        std::string lit = n.dtype == DType::Bool ? (v != 0 ? "true" : "false")
                          : n.dtype == DType::I32 ? std::to_string(int64_t(v))
                                                  : num(v);
        line("constant<" + type_of(n.dtype) + ">(shape = " + ints(n.shape) + ", value = [" + lit + "])");
        return;
      }
      case Op::Neg: line("neg(" + in(n, 0) + ")"); return;
      case Op::Abs: line("abs(" + in(n, 0) + ")"); return;
      case Op::Exp: line("exp(" + in(n, 0) + ")"); return;
      case Op::Log: line("log(" + in(n, 0) + ")"); return;
      case Op::Sqrt: line("sqrt(" + in(n, 0) + ")"); return;
      case Op::Rsqrt: line("rsqrt(" + in(n, 0) + ")"); return;
      case Op::Reciprocal: line("rcp(" + in(n, 0) + ")"); return;
      case Op::Square: line("sqr(" + in(n, 0) + ")"); return;
      case Op::Relu: line("relu(" + in(n, 0) + ")"); return;
      case Op::LeakyRelu: line("leaky_relu(" + in(n, 0) + ", alpha = " + num(a.f("alpha")) + ")"); return;
      case Op::GeluErf: line("gelu(" + in(n, 0) + ")"); return;
      case Op::Silu: line("silu(" + in(n, 0) + ")"); return;
      case Op::Sigmoid: line("sigmoid(" + in(n, 0) + ")"); return;
      case Op::Tanh: line("tanh(" + in(n, 0) + ")"); return;
      case Op::Softplus: line("softplus(" + in(n, 0) + ")"); return;
      case Op::Sin: line("sin(" + in(n, 0) + ")"); return;
      case Op::Cos: line("cos(" + in(n, 0) + ")"); return;
      case Op::PowScalar: line("pow(" + in(n, 0) + ", " + num(a.f("exponent")) + ")"); return;
      case Op::Clamp: line("clamp(" + in(n, 0) + ", " + num(a.f("min")) + ", " + num(a.f("max")) + ")"); return;
      case Op::StopGradient: line("copy(" + in(n, 0) + ")"); return;
      case Op::Cast:
        if (type_of(src(n, 0).dtype) != type_of(n.dtype))
          throw Error("NNEF export: " + g.describe(n.id) + " changes the element type, which NNEF cannot express");
        line("copy(" + in(n, 0) + ")");
        return;
      case Op::Add: binary("add"); return;
      case Op::Sub: binary("sub"); return;
      case Op::Mul: binary("mul"); return;
      case Op::Div: binary("div"); return;
      case Op::Maximum: binary("max"); return;
      case Op::Minimum: binary("min"); return;
      case Op::Equal: binary("eq"); return;
      case Op::NotEqual: binary("ne"); return;
      case Op::Less: binary("lt"); return;
      case Op::LessEqual: binary("le"); return;
      case Op::Greater: binary("gt"); return;
      case Op::GreaterEqual: binary("ge"); return;
      case Op::Where:
        line("select(" + aligned(n, 0, r) + ", " + aligned(n, 1, r) + ", " + aligned(n, 2, r) + ")");
        return;
      case Op::ReduceSum:
      case Op::ReduceMean:
      case Op::ReduceMax:
      case Op::ReduceMin: {
        const char* op = n.op == Op::ReduceSum ? "sum_reduce" : n.op == Op::ReduceMean ? "mean_reduce"
                         : n.op == Op::ReduceMax ? "max_reduce" : "min_reduce";
        std::vector<int64_t> ax = axes_of(a.ints("axes"), src(n, 0).shape.size());
        keep(reduce(op, in(n, 0), ax), ax, a.i("keepdim") != 0);
        return;
      }
      case Op::ArgMax: {
        std::vector<int64_t> ax = axes_of({a.i("axis")}, src(n, 0).shape.size());
        keep(reduce("argmax_reduce", in(n, 0), ax), ax, a.i("keepdim") != 0);
        return;
      }
      case Op::Softmax: line("softmax(" + in(n, 0) + ", axes = " + ints(axes_of({a.i("axis")}, r)) + ")"); return;
      case Op::LogSoftmax:
      case Op::LogSumExp: {
        std::vector<int64_t> ax = axes_of({a.i("axis")}, src(n, 0).shape.size());
        std::string m = reduce("max_reduce", in(n, 0), ax);
        std::string s = "sub(" + in(n, 0) + ", " + m + ")";
        std::string lse = "log(" + reduce("sum_reduce", "exp(" + s + ")", ax) + ")";
        if (n.op == Op::LogSoftmax) line("sub(" + s + ", " + lse + ")");
        else keep("add(" + lse + ", " + m + ")", ax, a.i("keepdim") != 0);
        return;
      }
      case Op::MatMul:
        line("matmul(" + aligned(n, 0, r) + ", " + aligned(n, 1, r) + ", transposeA = " +
             (a.i("transpose_a") ? "true" : "false") + ", transposeB = " + (a.i("transpose_b") ? "true" : "false") + ")");
        return;
      case Op::LayerNorm:
      case Op::RmsNorm: {
        std::vector<int64_t> last = {int64_t(r) - 1};
        std::string x = in(n, 0), e = num(a.f("eps"));
        std::string d = n.op == Op::LayerNorm ? "sub(" + x + ", " + reduce("mean_reduce", x, last) + ")" : x;
        std::string norm = "mul(" + d + ", rsqrt(add(" + reduce("mean_reduce", "sqr(" + d + ")", last) + ", " + e + ")))";
        if (n.inputs.size() > 1) norm = "mul(" + norm + ", " + aligned(n, 1, r) + ")";
        if (n.inputs.size() > 2) norm = "add(" + norm + ", " + aligned(n, 2, r) + ")";
        line(norm);
        return;
      }
      case Op::GroupNorm:
      case Op::BatchNorm: {
        // Statistics over every axis but 1 (batch) or over each (sample, channel group) (group); the
        // per-channel weight and bias [C] become [1, C], which NNEF broadcasts over [N, C, ...].
        std::string x = in(n, 0), e = num(a.f("eps"));
        std::string d, v;
        if (n.op == Op::BatchNorm) {
          std::vector<int64_t> axes = {0};
          for (size_t i = 2; i < r; ++i) axes.push_back(int64_t(i));
          d = "sub(" + x + ", " + reduce("mean_reduce", x, axes) + ")";
          v = reduce("mean_reduce", "sqr(" + d + ")", axes);
        } else {
          int64_t groups = a.i("groups");
          std::string xr = "reshape(" + x + ", shape = " + ints({n.shape[0], groups, -1}) + ")";
          d = "sub(" + xr + ", " + reduce("mean_reduce", xr, {2}) + ")";
          v = reduce("mean_reduce", "sqr(" + d + ")", {2});
        }
        std::string norm = "mul(" + d + ", rsqrt(add(" + v + ", " + e + ")))";
        if (n.op == Op::GroupNorm) norm = "reshape(" + norm + ", shape = " + ints(n.shape) + ")";
        const std::vector<int64_t> channel = {1, n.shape[1]};
        if (n.inputs.size() > 1) norm = "mul(" + norm + ", reshape(" + in(n, 1) + ", shape = " + ints(channel) + "))";
        if (n.inputs.size() > 2) norm = "add(" + norm + ", reshape(" + in(n, 2) + ", shape = " + ints(channel) + "))";
        line(norm);
        return;
      }
      case Op::Conv2d:
        line("conv(" + in(n, 0) + ", " + in(n, 1) + ", padding = " + pads2(a.ints("padding")) + ", stride = " +
             ints(a.ints("stride")) + ", dilation = " + ints(a.ints("dilation")) + ", groups = " +
             std::to_string(a.i("groups")) + ")");
        return;
      case Op::Conv2dGradInput:
        line("deconv(" + in(n, 0) + ", " + in(n, 1) + ", padding = " + pads2(a.ints("padding")) + ", stride = " +
             ints(a.ints("stride")) + ", dilation = " + ints(a.ints("dilation")) + ", output_shape = " +
             ints(n.shape) + ", groups = " + std::to_string(a.i("groups")) + ")");
        return;
      case Op::MaxPool2d:
      case Op::AvgPool2d: {
        const std::vector<int64_t>& k = a.ints("kernel");
        std::vector<int64_t> st = a.ints("stride");
        if (st.empty()) st = k;
        std::vector<int64_t> p = a.ints("padding");
        std::string pads = "[(0, 0), (0, 0), (" + std::to_string(p[0]) + ", " + std::to_string(p[2]) + "), (" +
                           std::to_string(p[1]) + ", " + std::to_string(p[3]) + ")]";
        std::string common = in(n, 0) + ", size = " + ints({1, 1, k[0], k[1]}) + ", padding = " + pads +
                             ", stride = " + ints({1, 1, st[0], st[1]});
        if (n.op == Op::MaxPool2d) {
          const std::vector<int64_t>& d = a.ints("dilation");
          line("max_pool(" + common + ", dilation = " + ints({1, 1, d[0], d[1]}) + ", border = 'ignore')");
        } else {
          line("avg_pool(" + common + ", border = '" + (a.i("count_include_pad") ? "constant" : "ignore") + "')");
        }
        return;
      }
      case Op::Upsample2d: line("nearest_upsample(" + in(n, 0) + ", factors = " + ints(a.ints("scale")) + ")"); return;
      case Op::Reshape: line("reshape(" + in(n, 0) + ", shape = " + ints(n.shape) + ")"); return;
      case Op::Permute: line("transpose(" + in(n, 0) + ", axes = " + ints(a.ints("perm")) + ")"); return;
      case Op::Slice: {
        std::vector<int64_t> axes, b, e, s;
        const Shape& xs = src(n, 0).shape;
        for (size_t i = 0; i < xs.size(); ++i) {
          int64_t lo = a.ints("starts")[i], hi = std::min(a.ints("ends")[i], xs[i]), st = a.ints("steps")[i];
          if (lo == 0 && hi == xs[i] && st == 1) continue;
          axes.push_back(int64_t(i));
          b.push_back(lo);
          e.push_back(hi);
          s.push_back(st);
        }
        if (axes.empty()) line("copy(" + in(n, 0) + ")");
        else line("slice(" + in(n, 0) + ", axes = " + ints(axes) + ", begin = " + ints(b) + ", end = " + ints(e) +
                  ", stride = " + ints(s) + ")");
        return;
      }
      case Op::Concat: {
        std::string xs = "[";
        for (size_t k = 0; k < n.inputs.size(); ++k) xs += (k ? ", " : "") + in(n, k);
        int64_t ax = a.i("axis");
        if (ax < 0) ax += int64_t(r);
        line("concat(" + xs + "], axis = " + std::to_string(ax) + ")");
        return;
      }
      case Op::Pad: {
        const std::vector<int64_t>& p = a.ints("pads");
        std::string s = "[";
        for (size_t i = 0; i < r; ++i)
          s += (i ? ", (" : "(") + std::to_string(p[i]) + ", " + std::to_string(p[i + r]) + ")";
        line("pad(" + in(n, 0) + ", padding = " + s + "], value = " + num(a.f("value")) + ")");
        return;
      }
      case Op::Expand: {
        const Shape& xs = src(n, 0).shape;
        std::vector<int64_t> reps;
        for (size_t i = 0; i < r; ++i) {
          size_t j = i + xs.size() - r;  // the input axis aligned from the right
          int64_t d = i + xs.size() >= r ? xs[j] : 1;
          reps.push_back(n.shape[i] / d);
        }
        std::string x = xs.empty() && r > 0 ? "reshape(" + in(n, 0) + ", shape = " + ints(std::vector<int64_t>(r, 1)) + ")"
                                            : aligned(n, 0, r);
        line("tile(" + x + ", repeats = " + ints(reps) + ")");
        return;
      }
      case Op::GeluTanh: case Op::Erf: case Op::ReluGrad: case Op::GeluErfGrad: case Op::GeluTanhGrad:
      case Op::SiluGrad: case Op::LayerNormGrad: case Op::RmsNormGrad:
      case Op::GroupNormGrad: case Op::BatchNormGrad: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
      case Op::AvgPool2dGrad: case Op::Upsample2dGrad: case Op::Attention: case Op::AttentionLse:
      case Op::AttentionGradQ: case Op::AttentionGradK: case Op::AttentionGradV: case Op::Rope: case Op::SliceGrad:
      case Op::Gather: case Op::GatherGrad: case Op::OneHot: case Op::GatherElements: case Op::ScatterElements:
      case Op::CrossEntropy: case Op::CrossEntropyGrad: case Op::Assign:
        break;
    }
    throw Error("NNEF export: " + g.describe(n.id) + " has no NNEF form");
  }
};

}  // namespace

void export_graph(const Graph& g, const std::string& dir, const ExportOptions& opt) {
  Writer(g.ir(), dir, opt).run();
}

}  // namespace mgn::nnef
