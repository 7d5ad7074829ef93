// CPU reference: reductions over axis sets, argmax, softmax / log-softmax / logsumexp along one axis.
#include <cmath>
#include <limits>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

// For each input element, the flat index of the output element it reduces into.
std::vector<int64_t> reduce_map(const Shape& in, const std::vector<int64_t>& axes) {
  Shape kept = in;
  for (int64_t a : axes) kept[size_t(a)] = 1;
  std::vector<int64_t> ks = strides_of(kept);
  std::vector<int64_t> map(size_t(numel(in)));
  for (int64_t f = 0; f < int64_t(map.size()); ++f) {
    int64_t rem = f, o = 0;
    for (int i = int(in.size()) - 1; i >= 0; --i) {
      int64_t c = rem % in[size_t(i)];
      rem /= in[size_t(i)];
      if (kept[size_t(i)] != 1) o += c * ks[size_t(i)];
    }
    map[size_t(f)] = o;
  }
  return map;
}

enum class Red { Sum, Mean, Max, Min };

void reduce(const ir::Node& n, const Inputs& in, Buffer& out, Red kind) {
  const auto& axes = n.attrs.ints("axes");
  std::vector<int64_t> map = reduce_map(in[0]->shape, axes);
  const auto& x = in[0]->v;
  if (kind == Red::Max || kind == Red::Min) {
    double init = kind == Red::Max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    std::fill(out.v.begin(), out.v.end(), init);
    for (size_t i = 0; i < x.size(); ++i) {
      double& o = out.v[size_t(map[i])];
      if (std::isnan(x[i]) || std::isnan(o)) o = NAN;
      else if (kind == Red::Max ? x[i] > o : x[i] < o) o = x[i];
    }
    return;
  }
  for (size_t i = 0; i < x.size(); ++i) out.v[size_t(map[i])] += x[i];
  if (kind == Red::Mean) {
    double count = double(x.size()) / double(out.v.size());
    for (double& o : out.v) o /= count;
  }
}

}  // namespace

void k_ReduceSum(const ir::Node& n, const Inputs& in, Buffer& out) { reduce(n, in, out, Red::Sum); }
void k_ReduceMean(const ir::Node& n, const Inputs& in, Buffer& out) { reduce(n, in, out, Red::Mean); }
void k_ReduceMax(const ir::Node& n, const Inputs& in, Buffer& out) { reduce(n, in, out, Red::Max); }
void k_ReduceMin(const ir::Node& n, const Inputs& in, Buffer& out) { reduce(n, in, out, Red::Min); }

void k_ArgMax(const ir::Node& n, const Inputs& in, Buffer& out) {
  AxisSplit s = split_at(in[0]->shape, int(n.attrs.i("axis")));
  const auto& x = in[0]->v;
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      int64_t best = 0;
      double bv = x[size_t(o * s.n * s.inner + i)];
      for (int64_t k = 1; k < s.n; ++k) {
        double v = x[size_t((o * s.n + k) * s.inner + i)];
        if (v > bv || (std::isnan(v) && !std::isnan(bv))) {  // first maximum wins; NaN is the maximum
          bv = v;
          best = k;
        }
      }
      out.v[size_t(o * s.inner + i)] = double(best);
    }
}

namespace {
// Calls f(row_offset, stride, count) for every 1-D row along `axis`.
template <class F>
void for_rows(const Shape& shape, int axis, F f) {
  AxisSplit s = split_at(shape, axis);
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) f(o * s.n * s.inner + i, s.inner, s.n);
}

double row_lse(const std::vector<double>& x, int64_t off, int64_t st, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < n; ++k) m = std::max(m, x[size_t(off + k * st)]);
  if (std::isinf(m)) return m;
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += std::exp(x[size_t(off + k * st)] - m);
  return m + std::log(s);
}
}  // namespace

void k_Softmax(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = ir::normalize_axis(n.attrs.i("axis"), int(in[0]->shape.size()), "softmax");
  const auto& x = in[0]->v;
  for_rows(in[0]->shape, axis, [&](int64_t off, int64_t st, int64_t cnt) {
    double lse = row_lse(x, off, st, cnt);
    for (int64_t k = 0; k < cnt; ++k) out.v[size_t(off + k * st)] = std::exp(x[size_t(off + k * st)] - lse);
  });
}

void k_LogSoftmax(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = ir::normalize_axis(n.attrs.i("axis"), int(in[0]->shape.size()), "log_softmax");
  const auto& x = in[0]->v;
  for_rows(in[0]->shape, axis, [&](int64_t off, int64_t st, int64_t cnt) {
    double lse = row_lse(x, off, st, cnt);
    for (int64_t k = 0; k < cnt; ++k) out.v[size_t(off + k * st)] = x[size_t(off + k * st)] - lse;
  });
}

void k_LogSumExp(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = int(n.attrs.i("axis"));
  AxisSplit s = split_at(in[0]->shape, axis);
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i)
      out.v[size_t(o * s.inner + i)] = row_lse(in[0]->v, o * s.n * s.inner + i, s.inner, s.n);
}

}  // namespace mgn::cpu
