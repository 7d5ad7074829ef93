// The GLSL helper library of the kernel generators (glsl.h).
#include "codegen/glsl.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace mgn::codegen::gl {

std::string render(std::string_view tmpl, Vars vars) {
  std::vector<bool> used(vars.size(), false);
  std::string out;
  out.reserve(tmpl.size() * 2);
  size_t i = 0;
  while (i < tmpl.size()) {
    const size_t at = tmpl.find("${", i);
    if (at == std::string_view::npos) {
      out.append(tmpl.substr(i));
      break;
    }
    out.append(tmpl.substr(i, at - i));
    const size_t end = tmpl.find('}', at + 2);
    if (end == std::string_view::npos) throw Error("internal: unterminated placeholder in a kernel template");
    const std::string_view name = tmpl.substr(at + 2, end - at - 2);
    size_t k = 0;
    for (const auto& [key, value] : vars) {
      if (key == name) {
        out += value;
        used[k] = true;
        break;
      }
      ++k;
    }
    if (k == vars.size())
      throw Error("internal: kernel template placeholder ${" + std::string(name) + "} has no value");
    i = end + 1;
  }
  size_t k = 0;
  for (const auto& [key, value] : vars)
    if (!used[k++]) throw Error("internal: kernel template has no placeholder ${" + std::string(key) + "}");
  return out;
}

const char* type_of(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return "float";
    case DType::I32:
      return "int";
    case DType::Bool:
      return "uint";
  }
  return "float";
}

std::string flit(double v) {
  float f = float(v);
  if (!std::isfinite(f)) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    char b[48];
    std::snprintf(b, sizeof b, "uintBitsToFloat(0x%08xu)", bits);
    return b;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", double(f));
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string u(uint64_t v) {
  if (v > 0xffffffffull) throw Error("codegen: index " + std::to_string(v) + " does not fit 32 bits");
  return std::to_string(v) + "u";
}

std::string const_uint(const std::string& name, uint64_t v) {
  return "const uint " + name + " = " + u(v) + ";\n";
}
std::string const_int(const std::string& name, int64_t v) {
  return "const int " + name + " = " + std::to_string(v) + ";\n";
}

std::string buffer_as(int binding, const std::string& type, const std::string& name,
                      const std::string& qualifiers) {
  const std::string b = std::to_string(binding);
  return "layout(std430, set = 0, binding = " + b + ") " + qualifiers + "buffer Blk" + b + " { " + type + " " +
         name + "[]; };\n";
}

std::string buffer(int binding, const std::string& name, DType t, bool readonly, bool writeonly) {
  return buffer_as(binding, type_of(t), name, readonly ? "readonly " : writeonly ? "writeonly " : "");
}

void Buffers::add(const std::string& name, Binding b, DType t) {
  decls += buffer(int(bindings.size()), name, t, !b.written, b.written);
  bindings.push_back(b);
}

void Buffers::add_as(const std::string& type, const std::string& name, Binding b) {
  decls += buffer_as(int(bindings.size()), type, name, b.written ? "writeonly " : "readonly ");
  bindings.push_back(b);
}

Binding input(int i) {
  return {BindingKind::Input, i, false};
}
Binding output(int node) {
  return {BindingKind::Output, 0, true, node};
}

uint64_t numel_u(const Shape& s) {
  uint64_t n = 1;
  for (int64_t d : s) n *= uint64_t(d);
  return n;
}

void check_32bit(uint64_t n, const std::string& who) {
  if (n >= (1ull << 31))
    throw Error(who + ": " + std::to_string(n) +
                " elements exceed the 2^31 indexing limit of the Vulkan kernels");
}

Grid flat_groups(uint64_t total, const DeviceCaps& caps, const std::string& who) {
  Grid g;
  uint64_t t = std::max<uint64_t>(total, 1);
  uint64_t gx = std::min<uint64_t>(t, caps.max_workgroup_count[0]);
  uint64_t gy = div_up(t, gx);
  if (gy > caps.max_workgroup_count[1])
    throw Error(who + ": " + std::to_string(total) + " workgroups exceed the device's dispatch grid");
  g.groups = {uint32_t(gx), uint32_t(gy), 1};
  g.glsl = "  uint gid = gl_WorkGroupID.x + gl_WorkGroupID.y * " + u(gx) + ";\n";
  if (gx * gy != total) g.glsl += "  if (gid >= " + u(total) + ") return;\n";
  return g;
}

Kernel elementwise(const std::string& name, const std::string& comment, const std::string& decls,
                   const std::string& body, uint64_t total, std::vector<Binding> bindings,
                   const DeviceCaps& caps) {
  check_32bit(total, name);
  const uint32_t wg = std::min<uint32_t>(256, caps.max_workgroup_invocations);
  Grid grid = flat_groups(div_up(total, wg), caps, name);
  static constexpr std::string_view kTemplate = R"(#version 450
// archetype: ${COMMENT}
layout(local_size_x = ${WG}) in;
${DECLS}void main() {
${GRID}  uint i = gid * ${WGU} + gl_LocalInvocationID.x;
  if (i >= ${TOTAL}) return;
${BODY}}
)";
  Kernel k;
  k.name = name;
  k.glsl = render(kTemplate, {{"COMMENT", comment},
                              {"WG", std::to_string(wg)},
                              {"DECLS", decls},
                              {"GRID", grid.glsl},
                              {"WGU", u(wg)},
                              {"TOTAL", u(total)},
                              {"BODY", body}});
  k.bindings = std::move(bindings);
  k.groups = total == 0 ? std::array<uint32_t, 3>{0, 0, 0} : grid.groups;
  return k;
}

Lowering one_kernel(Kernel k) {
  Lowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

std::vector<int64_t> strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = int(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i) + 1] * s[size_t(i) + 1];
  return st;
}

std::vector<Dim> permuted_dims(const Shape& in, const Shape& out, const std::vector<int64_t>& perm) {
  const int64_t r = int64_t(in.size());
  const std::vector<int64_t> st = strides(in);
  std::vector<Dim> dims;
  for (size_t d = 0; d < out.size(); ++d) dims.push_back({out[d], st[size_t((perm[d] + r) % r)]});
  return dims;
}

std::vector<Dim> merge_dims(const std::vector<Dim>& dims) {
  std::vector<Dim> out;
  for (const Dim& d : dims) {
    if (d.size == 1) continue;
    if (!out.empty() && out.back().stride == d.size * d.stride) {
      out.back().size *= d.size;
      out.back().stride = d.stride;
    } else {
      out.push_back(d);
    }
  }
  return out;
}

namespace {

// Statements adding to `acc` the offset of `var` over merged `dims` (innermost last), dividing `var` itself.
std::string strided_terms(const std::vector<Dim>& m, const std::string& var, const std::string& acc) {
  std::string s;
  for (int i = int(m.size()) - 1; i >= 0; --i) {
    const Dim& d = m[size_t(i)];
    std::string coord = i == 0 ? var : "(" + var + " % " + u(uint64_t(d.size)) + ")";
    std::string term = d.stride == 1 ? coord : coord + " * " + u(uint64_t(d.stride));
    if (d.stride != 0) s += "  " + acc + " += " + term + ";\n";
    if (i > 0) s += "  " + var + " /= " + u(uint64_t(d.size)) + ";\n";
  }
  return s;
}

}  // namespace

std::string offset_code(const std::vector<Dim>& dims, const std::string& var, const std::string& acc,
                        const std::string& tmp) {
  std::vector<Dim> m = merge_dims(dims);
  if (m.empty()) return "";
  if (m.size() == 1) {
    std::string term = m[0].stride == 1 ? var : var + " * " + u(uint64_t(m[0].stride));
    return "  " + acc + " += " + term + ";\n";
  }
  return "  uint " + tmp + " = " + var + ";\n" + strided_terms(m, tmp, acc);
}

std::string broadcast_fn(const std::string& name, const Shape& in, const Shape& out) {
  std::string s = "uint " + name + "(uint i) {\n";
  if (in == out) return s + "  return i;\n}\n";
  if (numel_u(in) == 1) return s + "  return 0u;\n}\n";
  std::vector<int64_t> ist = strides(in);
  size_t off = out.size() - in.size();
  std::vector<Dim> dims;
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t st = 0;
    if (i >= off && in[i - off] != 1) st = ist[i - off];
    dims.push_back({out[i], st});
  }
  // Broadcast dims (stride 0) must still divide the index, so merge only within equal-kind runs.
  std::vector<Dim> m;
  for (const Dim& d : dims) {
    if (d.size == 1) continue;
    if (!m.empty() && ((m.back().stride == 0 && d.stride == 0) ||
                       (d.stride != 0 && m.back().stride == d.size * d.stride))) {
      m.back().size *= d.size;
      m.back().stride = d.stride;
    } else {
      m.push_back(d);
    }
  }
  return s + "  uint r = 0u;\n" + strided_terms(m, "i", "r") + "  return r;\n}\n";
}

std::string unravel(const Shape& shape, const std::string& var, const std::string& prefix) {
  std::string s;
  int r = int(shape.size());
  if (r == 0) return s;
  s += "  uint " + prefix + "t = " + var + ";\n";
  for (int i = r - 1; i >= 0; --i) {
    std::string c = prefix + std::to_string(i);
    if (i == 0) {
      s += "  uint " + c + " = " + prefix + "t;\n";
    } else {
      s += "  uint " + c + " = " + prefix + "t % " + u(uint64_t(shape[size_t(i)])) + ";\n";
      s += "  " + prefix + "t /= " + u(uint64_t(shape[size_t(i)])) + ";\n";
    }
  }
  return s;
}

std::string unflatten(const std::string& var, const std::vector<std::pair<std::string, uint64_t>>& dims,
                      const std::string& indent) {
  std::string s = indent + "uint r_ = " + var + ";\n";
  for (size_t i = dims.size(); i-- > 0;) {
    if (i == 0) {
      s += indent + "uint " + dims[i].first + " = r_;\n";
    } else {
      s += indent + "uint " + dims[i].first + " = r_ % " + u(dims[i].second) + ";\n" + indent +
           "r_ /= " + u(dims[i].second) + ";\n";
    }
  }
  return s;
}

std::string math_lib() {
  return R"(float mgn_nan() { return uintBitsToFloat(0x7fc00000u); }
// log(1 + y) without the cancellation of 1 + y for tiny y.
float mgn_log1p(float y) {
  float w = 1.0 + y;
  if (w == 1.0) return y;
  return log(w) * (y / (w - 1.0));
}
// tanh that neither overflows nor cancels for small |x|.
float mgn_tanh(float x) {
  float a = abs(x);
  if (a < 0.1) {
    float x2 = x * x;
    return x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
  }
  float e = exp(-2.0 * a);
  float t = (1.0 - e) / (1.0 + e);
  return x < 0.0 ? -t : t;
}
float mgn_sigmoid(float x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  float e = exp(x);
  return e / (1.0 + e);
}
// erf: Taylor series near 0 (no cancellation), else 1 - erfc with the Numerical Recipes Chebyshev fit
// (fractional error < 1.2e-7).
float mgn_erf(float x) {
  float a = abs(x);
  if (a < 0.5) {
    float x2 = x * x;
    float s = 1.0 + x2 * (-1.0 / 3.0 + x2 * (1.0 / 10.0 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 +
              x2 * (-1.0 / 1320.0 + x2 * (1.0 / 9360.0))))));
    return 1.1283791670955126 * x * s;
  }
  float t = 1.0 / (1.0 + 0.5 * a);
  float r = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
            t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
            t * (-0.82215223 + t * 0.17087277)))))))));
  float e = 1.0 - r;
  return x < 0.0 ? -e : e;
}
)";
}

uint32_t row_workgroup(uint64_t m, const DeviceCaps& caps) {
  uint32_t wg = 32;
  while (wg < 256 && wg < m) wg *= 2;
  return std::min(wg, std::max<uint32_t>(32, caps.max_workgroup_invocations));
}

std::string tree_reduce(uint32_t wg, const std::string& combine, const std::string& indent) {
  return render(R"(${I}for (uint s = ${HALF}; s > 0u; s >>= 1) {
${I}  if (t < s)${COMBINE}
${I}  barrier();
${I}}
)",
                {{"I", indent}, {"HALF", u(wg / 2)}, {"COMBINE", combine}});
}

std::string wg_reduce_lib(uint32_t wg) {
  std::string s = "shared float s_red[" + u(wg) + "];\n";
  for (const char* op : {"sum", "max"}) {
    const std::string comb =
        std::string(op) == "sum" ? "a + b" : "(isnan(a) || isnan(b)) ? mgn_nan() : max(a, b)";
    s += render(R"(float wg_${OP}(float v) {
  uint t = gl_LocalInvocationID.x;
  s_red[t] = v;
  barrier();
${REDUCE}  float r = s_red[0];
  barrier();
  return r;
}
)",
                {{"OP", op},
                 {"REDUCE", tree_reduce(wg,
                                        " {\n      float a = s_red[t], b = s_red[t + s];\n      s_red[t] = " +
                                            comb + ";\n    }",
                                        "  ")}});
  }
  return s;
}

}  // namespace mgn::codegen::gl
