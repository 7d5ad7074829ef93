// CPU reference: sources, pointwise unary/binary/ternary ops with numpy broadcasting, derivative helpers.
#include <cmath>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

template <class F>
void unary(const Inputs& in, Buffer& out, F f) {
  const auto& x = in[0]->v;
  for (size_t i = 0; i < x.size(); ++i) out.v[i] = f(x[i]);
}

template <class F>
void binary(const Inputs& in, Buffer& out, F f) {
  BroadcastIndex ia(in[0]->shape, out.shape), ib(in[1]->shape, out.shape);
  const auto &a = in[0]->v, &b = in[1]->v;
  for (int64_t i = 0; i < out.size(); ++i) out.v[size_t(i)] = f(a[size_t(ia(i))], b[size_t(ib(i))]);
}

// Integer division and casts follow C semantics (truncation), like the GPU.
bool is_int(DType t) { return t == DType::I32 || t == DType::Bool; }

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2*pi)

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }  // PyTorch threshold 20
double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double gelu_tanh_deriv(double x) {
  double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
}

}  // namespace

// ---- sources (Input and Parameter values are provided by the executor)
void k_Input(const ir::Node& n, const Inputs&, Buffer&) { throw Error("internal: input '" + n.name + "' evaluated"); }
void k_Parameter(const ir::Node& n, const Inputs&, Buffer&) {
  throw Error("internal: parameter '" + n.name + "' evaluated");
}
void k_Constant(const ir::Node& n, const Inputs&, Buffer& out) { out.v = *n.data; }
void k_Full(const ir::Node& n, const Inputs&, Buffer& out) {
  std::fill(out.v.begin(), out.v.end(), n.attrs.f("value"));
}

// ---- unary
void k_Neg(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return -x; }); }
void k_Abs(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::fabs(x); }); }
void k_Exp(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::exp(x); }); }
void k_Log(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::log(x); }); }
void k_Sqrt(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::sqrt(x); }); }
void k_Rsqrt(const ir::Node&, const Inputs& in, Buffer& out) {
  unary(in, out, [](double x) { return 1.0 / std::sqrt(x); });
}
void k_Reciprocal(const ir::Node&, const Inputs& in, Buffer& out) {
  unary(in, out, [](double x) { return 1.0 / x; });
}
void k_Square(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return x * x; }); }
void k_Relu(const ir::Node&, const Inputs& in, Buffer& out) {
  unary(in, out, [](double x) { return x > 0 ? x : 0.0; });
}
void k_LeakyRelu(const ir::Node& n, const Inputs& in, Buffer& out) {
  double a = n.attrs.f("alpha");
  unary(in, out, [a](double x) { return x > 0 ? x : a * x; });
}
void k_GeluErf(const ir::Node&, const Inputs& in, Buffer& out) {
  unary(in, out, [](double x) { return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2)); });
}
void k_GeluTanh(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, gelu_tanh); }
void k_Silu(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return x * sigmoid(x); }); }
void k_Sigmoid(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, sigmoid); }
void k_Tanh(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::tanh(x); }); }
void k_Softplus(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, softplus); }
void k_Erf(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::erf(x); }); }
void k_Sin(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::sin(x); }); }
void k_Cos(const ir::Node&, const Inputs& in, Buffer& out) { unary(in, out, [](double x) { return std::cos(x); }); }
void k_PowScalar(const ir::Node& n, const Inputs& in, Buffer& out) {
  double e = n.attrs.f("exponent");
  unary(in, out, [e](double x) { return std::pow(x, e); });
}
void k_Clamp(const ir::Node& n, const Inputs& in, Buffer& out) {
  double lo = n.attrs.f("min"), hi = n.attrs.f("max");
  unary(in, out, [lo, hi](double x) { return x < lo ? lo : x > hi ? hi : x; });
}
void k_Cast(const ir::Node& n, const Inputs& in, Buffer& out) {
  DType to = n.dtype;
  unary(in, out, [to](double x) {
    if (to == DType::Bool) return x != 0 ? 1.0 : 0.0;
    if (to == DType::I32) return std::trunc(x);
    return x;
  });
}
void k_StopGradient(const ir::Node&, const Inputs& in, Buffer& out) { out.v = in[0]->v; }

// ---- derivative helpers (x, dy)
void k_ReluGrad(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double x, double dy) { return x > 0 ? dy : 0.0; });
}
void k_GeluErfGrad(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double x, double dy) {
    double cdf = 0.5 * (1.0 + std::erf(x * kInvSqrt2));
    double pdf = kInvSqrt2Pi * std::exp(-0.5 * x * x);
    return dy * (cdf + x * pdf);
  });
}
void k_GeluTanhGrad(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double x, double dy) { return dy * gelu_tanh_deriv(x); });
}
void k_SiluGrad(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double x, double dy) {
    double s = sigmoid(x);
    return dy * s * (1.0 + x * (1.0 - s));
  });
}

// ---- binary
void k_Add(const ir::Node&, const Inputs& in, Buffer& out) { binary(in, out, [](double a, double b) { return a + b; }); }
void k_Sub(const ir::Node&, const Inputs& in, Buffer& out) { binary(in, out, [](double a, double b) { return a - b; }); }
void k_Mul(const ir::Node&, const Inputs& in, Buffer& out) { binary(in, out, [](double a, double b) { return a * b; }); }
void k_Div(const ir::Node& n, const Inputs& in, Buffer& out) {
  if (is_int(n.dtype)) {
    binary(in, out, [&](double a, double b) {
      if (b == 0) throw Error("div: integer division by zero in " + std::string(ir::op_name(n.op)));
      return std::trunc(a / b);
    });
  } else {
    binary(in, out, [](double a, double b) { return a / b; });
  }
}
// NaN propagates like torch.maximum / torch.minimum.
void k_Maximum(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); });
}
void k_Minimum(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b); });
}
void k_Equal(const ir::Node&, const Inputs& in, Buffer& out) { binary(in, out, [](double a, double b) { return double(a == b); }); }
void k_NotEqual(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return double(a != b); });
}
void k_Less(const ir::Node&, const Inputs& in, Buffer& out) { binary(in, out, [](double a, double b) { return double(a < b); }); }
void k_LessEqual(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return double(a <= b); });
}
void k_Greater(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return double(a > b); });
}
void k_GreaterEqual(const ir::Node&, const Inputs& in, Buffer& out) {
  binary(in, out, [](double a, double b) { return double(a >= b); });
}
void k_Where(const ir::Node&, const Inputs& in, Buffer& out) {
  BroadcastIndex ic(in[0]->shape, out.shape), ia(in[1]->shape, out.shape), ib(in[2]->shape, out.shape);
  for (int64_t i = 0; i < out.size(); ++i)
    out.v[size_t(i)] = in[0]->v[size_t(ic(i))] != 0 ? in[1]->v[size_t(ia(i))] : in[2]->v[size_t(ib(i))];
}

void k_Assign(const ir::Node&, const Inputs& in, Buffer& out) { out.v = in[1]->v; }

}  // namespace mgn::cpu
