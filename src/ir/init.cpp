// Deterministic parameter initializers: a counter-based generator keyed by (seed, parameter name), so
// every backend and every run produces the same initial values. Each element depends only on its index,
// so large tensors are filled by several threads with identical results.
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

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
    case Init::Kind::PaperSine: return "paper_sine";
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

// Runs f(begin, end) over [0, n) in chunks on up to hardware_concurrency threads (one thread below ~1M
// elements, where starting threads costs more than it saves).
template <typename F>
void parallel_chunks(int64_t n, F&& f) {
  constexpr int64_t kPerThread = int64_t(1) << 20;
  const int64_t hw = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t threads = std::min<int64_t>(hw, (n + kPerThread - 1) / kPerThread);
  if (threads <= 1) {
    f(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&f, b, e] { f(b, e); });
  }
  for (std::thread& th : pool) th.join();
}
}  // namespace

std::vector<float> materialize(const Init& init, const Shape& shape, const std::string& name) {
  int64_t n = numel(shape);
  std::vector<float> v(size_t(n), 0.0f);
  uint64_t key = splitmix64(fnv1a(name) ^ splitmix64(init.seed));
  auto uniform = [&](double lo, double hi) {
    parallel_chunks(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) v[size_t(i)] = float(lo + (hi - lo) * unit(key, uint64_t(i)));
    });
  };
  auto normal = [&](double mean, double std) {
    parallel_chunks(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {  // Box-Muller on two independent streams
        double u1 = unit(key, uint64_t(2 * i)), u2 = unit(key, uint64_t(2 * i + 1));
        v[size_t(i)] = float(mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      }
    });
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
    case Init::Kind::PaperSine: {
      uint32_t h = 0;
      for (unsigned char ch : name) h = h * 31u + ch;
      const double seed = double(h % 10000u), scale = init.a;
      // Element i of the stored tensor is generated value g(i): j = i itself, or for [out, in] the index of
      // (in, out) in the [in, out] generation order.
      const bool two_d = shape.size() == 2;
      const int64_t out = two_d ? shape[0] : 1, in = two_d ? shape[1] : 1;
      parallel_chunks(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t j = two_d ? (i % in) * out + i / in : i;
          v[size_t(i)] = float(std::sin(0.01 * double(j) + seed) * scale);
          if (init.b != 0) v[size_t(i)] += float(init.b);
        }
      });
      break;
    }
  }
  return v;
}

}  // namespace mgn
