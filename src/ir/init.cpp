// Deterministic parameter initializers: a counter-based generator keyed by (seed, parameter name), so
// every backend and every run produces the same initial values.
#include <cmath>

#include "mgn/init.h"

namespace mgn {

const char* init_kind_name(Init::Kind k) {
  switch (k) {
    case Init::Kind::Zeros: return "zeros";
    case Init::Kind::Ones: return "ones";
    case Init::Kind::Constant: return "constant";
    case Init::Kind::Normal: return "normal";
    case Init::Kind::Uniform: return "uniform";
    case Init::Kind::KaimingUniform: return "kaiming_uniform";
    case Init::Kind::KaimingNormal: return "kaiming_normal";
    case Init::Kind::XavierUniform: return "xavier_uniform";
    case Init::Kind::XavierNormal: return "xavier_normal";
    case Init::Kind::Data: return "data";
  }
  return "?";
}

int64_t fan_in(const Shape& s) {
  if (s.size() < 2) return s.empty() ? 1 : s[0];
  int64_t rf = 1;
  for (size_t i = 2; i < s.size(); ++i) rf *= s[i];
  return s[1] * rf;
}

int64_t fan_out(const Shape& s) {
  if (s.size() < 2) return s.empty() ? 1 : s[0];
  int64_t rf = 1;
  for (size_t i = 2; i < s.size(); ++i) rf *= s[i];
  return s[0] * rf;
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}
// Uniform in (0, 1), never 0 (safe for log).
double unit(uint64_t key, uint64_t i) { return (double(splitmix64(key ^ splitmix64(i)) >> 11) + 0.5) * 0x1.0p-53; }
}  // namespace

std::vector<float> materialize(const Init& init, const Shape& shape, const std::string& name) {
  int64_t n = numel(shape);
  std::vector<float> v(size_t(n), 0.0f);
  uint64_t key = splitmix64(fnv1a(name) ^ splitmix64(init.seed));
  auto uniform = [&](double lo, double hi) {
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(lo + (hi - lo) * unit(key, uint64_t(i)));
  };
  auto normal = [&](double mean, double std) {
    for (int64_t i = 0; i < n; ++i) {  // Box-Muller on two independent streams
      double u1 = unit(key, uint64_t(2 * i)), u2 = unit(key, uint64_t(2 * i + 1));
      v[size_t(i)] = float(mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  };
  switch (init.kind) {
    case Init::Kind::Zeros: break;
    case Init::Kind::Ones: std::fill(v.begin(), v.end(), 1.0f); break;
    case Init::Kind::Constant: std::fill(v.begin(), v.end(), float(init.a)); break;
    case Init::Kind::Normal: normal(init.a, init.b); break;
    case Init::Kind::Uniform: uniform(init.a, init.b); break;
    case Init::Kind::KaimingUniform: {
      double gain = std::sqrt(2.0 / (1.0 + init.a * init.a));
      double bound = gain * std::sqrt(3.0 / double(fan_in(shape)));
      uniform(-bound, bound);
      break;
    }
    case Init::Kind::KaimingNormal: {
      double gain = std::sqrt(2.0 / (1.0 + init.a * init.a));
      normal(0.0, gain / std::sqrt(double(fan_in(shape))));
      break;
    }
    case Init::Kind::XavierUniform: {
      double bound = init.a * std::sqrt(6.0 / double(fan_in(shape) + fan_out(shape)));
      uniform(-bound, bound);
      break;
    }
    case Init::Kind::XavierNormal:
      normal(0.0, init.a * std::sqrt(2.0 / double(fan_in(shape) + fan_out(shape))));
      break;
    case Init::Kind::Data:
      if (int64_t(init.data.size()) != n)
        throw Error("parameter '" + name + "': initial data has " + std::to_string(init.data.size()) +
                    " values, shape " + shape_str(shape) + " needs " + std::to_string(n));
      v = init.data;
      break;
  }
  return v;
}

}  // namespace mgn
