// CPU reference: data movement (reshape, permute, slice, concat, pad, expand, gather, one-hot) and losses.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

// Unravels a flat index of `shape` into coordinates.
void unravel(int64_t flat, const Shape& shape, std::vector<int64_t>& coord) {
  coord.resize(shape.size());
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    coord[size_t(i)] = flat % shape[size_t(i)];
    flat /= shape[size_t(i)];
  }
}

int64_t checked_index(const ir::Node& n, double raw, int64_t dim) {
  int64_t i = int64_t(raw);
  if (i < 0) i += dim;
  if (i < 0 || i >= dim)
    throw Error(std::string(ir::op_name(n.op)) + ": index " + std::to_string(int64_t(raw)) + " is out of range for size " +
                std::to_string(dim));
  return i;
}

}  // namespace

void k_Reshape(const ir::Node&, const Inputs& in, Buffer& out) { out.v = in[0]->v; }

void k_Permute(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto& perm = n.attrs.ints("perm");
  const Shape& xs = in[0]->shape;
  std::vector<int64_t> xst = strides_of(xs), coord;
  int r = int(xs.size());
  for (int64_t f = 0; f < out.size(); ++f) {
    unravel(f, out.shape, coord);
    int64_t src = 0;
    for (int i = 0; i < r; ++i) src += coord[size_t(i)] * xst[size_t((perm[size_t(i)] + r) % r)];
    out.v[size_t(f)] = in[0]->v[size_t(src)];
  }
}

void k_Slice(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto &st = n.attrs.ints("starts"), &sp = n.attrs.ints("steps");
  std::vector<int64_t> xst = strides_of(in[0]->shape), coord;
  for (int64_t f = 0; f < out.size(); ++f) {
    unravel(f, out.shape, coord);
    int64_t src = 0;
    for (size_t i = 0; i < coord.size(); ++i) src += (st[i] + coord[i] * sp[i]) * xst[i];
    out.v[size_t(f)] = in[0]->v[size_t(src)];
  }
}

void k_SliceGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto &st = n.attrs.ints("starts"), &sp = n.attrs.ints("steps");
  std::vector<int64_t> ost = strides_of(out.shape), coord;
  const Buffer& dy = *in[0];
  for (int64_t f = 0; f < dy.size(); ++f) {
    unravel(f, dy.shape, coord);
    int64_t dst = 0;
    for (size_t i = 0; i < coord.size(); ++i) dst += (st[i] + coord[i] * sp[i]) * ost[i];
    out.v[size_t(dst)] += dy.v[size_t(f)];
  }
}

void k_Concat(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = int(n.attrs.i("axis"));
  AxisSplit os = split_at(out.shape, axis);
  int64_t off = 0;
  for (const Buffer* b : in) {
    AxisSplit s = split_at(b->shape, axis);
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t k = 0; k < s.n; ++k)
        for (int64_t i = 0; i < s.inner; ++i)
          out.v[size_t((o * os.n + off + k) * os.inner + i)] = b->v[size_t((o * s.n + k) * s.inner + i)];
    off += s.n;
  }
}

void k_Pad(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto& p = n.attrs.ints("pads");
  std::fill(out.v.begin(), out.v.end(), n.attrs.f("value"));
  const Buffer& x = *in[0];
  std::vector<int64_t> ost = strides_of(out.shape), coord;
  for (int64_t f = 0; f < x.size(); ++f) {
    unravel(f, x.shape, coord);
    int64_t dst = 0;
    for (size_t i = 0; i < coord.size(); ++i) dst += (coord[i] + p[i]) * ost[i];
    out.v[size_t(dst)] = x.v[size_t(f)];
  }
}

void k_Expand(const ir::Node&, const Inputs& in, Buffer& out) {
  BroadcastIndex bi(in[0]->shape, out.shape);
  for (int64_t f = 0; f < out.size(); ++f) out.v[size_t(f)] = in[0]->v[size_t(bi(f))];
}

void k_Gather(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = int(n.attrs.i("axis"));
  const Buffer &t = *in[0], &idx = *in[1];
  AxisSplit s = split_at(t.shape, axis);
  int64_t ni = idx.size();
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < ni; ++j) {
      int64_t k = checked_index(n, idx.v[size_t(j)], s.n);
      for (int64_t i = 0; i < s.inner; ++i)
        out.v[size_t((o * ni + j) * s.inner + i)] = t.v[size_t((o * s.n + k) * s.inner + i)];
    }
}

void k_GatherGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  int axis = int(n.attrs.i("axis"));
  const Buffer &dy = *in[0], &idx = *in[1];
  AxisSplit s = split_at(out.shape, axis);
  int64_t ni = idx.size();
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < ni; ++j) {
      int64_t k = checked_index(n, idx.v[size_t(j)], s.n);
      for (int64_t i = 0; i < s.inner; ++i)
        out.v[size_t((o * s.n + k) * s.inner + i)] += dy.v[size_t((o * ni + j) * s.inner + i)];
    }
}

void k_OneHot(const ir::Node& n, const Inputs& in, Buffer& out) {
  int64_t d = n.attrs.i("depth");
  for (int64_t j = 0; j < in[0]->size(); ++j) {
    int64_t k = int64_t(in[0]->v[size_t(j)]);
    if (k >= 0 && k < d) out.v[size_t(j * d + k)] = 1.0;  // out-of-range rows stay zero, like ONNX OneHot
  }
}

// ---- elementwise indexing along one axis: index position p (row-major over indices) reads or writes data at
// p with p[axis] replaced by the index there (negative counts from the end).
namespace {
template <class F>
void for_each_element_index(const ir::Node& n, const Shape& data, const Buffer& idx, F f) {
  const int axis = int(n.attrs.i("axis"));
  const std::vector<int64_t> ds = strides_of(data);
  std::vector<int64_t> coord(idx.shape.size(), 0);
  for (int64_t p = 0; p < idx.size(); ++p) {
    int64_t off = 0;
    for (size_t d = 0; d < coord.size(); ++d)
      off += (int(d) == axis ? checked_index(n, idx.v[size_t(p)], data[d]) : coord[d]) * ds[d];
    f(p, off);
    for (size_t d = coord.size(); d-- > 0;) {  // next row-major coordinate
      if (++coord[d] < idx.shape[d]) break;
      coord[d] = 0;
    }
  }
}
}  // namespace

void k_GatherElements(const ir::Node& n, const Inputs& in, Buffer& out) {
  const Buffer& data = *in[0];
  for_each_element_index(n, data.shape, *in[1], [&](int64_t p, int64_t off) { out.v[size_t(p)] = data.v[size_t(off)]; });
}

// Writes in index order, so with duplicate indices reduction "none" keeps the last update and the others combine
// in that order (the GPU kernel walks each output's candidates in the same order).
void k_ScatterElements(const ir::Node& n, const Inputs& in, Buffer& out) {
  out.v = in[0]->v;
  const std::string& r = n.attrs.s("reduction");
  const std::vector<double>& upd = in[2]->v;
  for_each_element_index(n, out.shape, *in[1], [&](int64_t p, int64_t off) {
    double& o = out.v[size_t(off)];
    const double u = upd[size_t(p)];
    if (r == "add") o += u;
    else if (r == "mul") o *= u;
    else if (r == "max") o = std::isnan(o) || std::isnan(u) ? NAN : std::max(o, u);
    else if (r == "min") o = std::isnan(o) || std::isnan(u) ? NAN : std::min(o, u);
    else o = u;
  });
}

// ---- cross-entropy over the last axis with PyTorch's ignore_index and label_smoothing semantics.
namespace {
struct XentRows {
  int64_t rows, classes;
};
XentRows xent_rows(const Shape& logits) { return {numel(logits) / logits.back(), logits.back()}; }

int64_t label_of(const ir::Node& n, double raw, int64_t classes, int64_t ignore) {
  int64_t y = int64_t(raw);
  if (y == ignore) return -1;
  if (y < 0 || y >= classes)
    throw Error("cross_entropy: label " + std::to_string(y) + " is out of range for " + std::to_string(classes) +
                " classes");
  return y;
}
}  // namespace

void k_CrossEntropy(const ir::Node& n, const Inputs& in, Buffer& out) {
  XentRows r = xent_rows(in[0]->shape);
  int64_t ignore = n.attrs.i("ignore_index");
  double eps = n.attrs.f("label_smoothing");
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < r.rows; ++i) {
    int64_t y = label_of(n, in[1]->v[size_t(i)], r.classes, ignore);
    if (y < 0) continue;
    const double* z = in[0]->v.data() + i * r.classes;
    double m = z[0];
    for (int64_t c = 1; c < r.classes; ++c) m = std::max(m, z[c]);
    double s = 0, sum_logp = 0;
    for (int64_t c = 0; c < r.classes; ++c) s += std::exp(z[c] - m);
    double lse = m + std::log(s);
    for (int64_t c = 0; c < r.classes; ++c) sum_logp += z[c] - lse;
    total += (1 - eps) * (lse - z[y]) - eps * sum_logp / double(r.classes);
    ++count;
  }
  out.v[0] = count ? total / double(count) : NAN;
}

void k_CrossEntropyGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  XentRows r = xent_rows(in[0]->shape);
  int64_t ignore = n.attrs.i("ignore_index");
  double eps = n.attrs.f("label_smoothing");
  int64_t count = 0;
  for (int64_t i = 0; i < r.rows; ++i)
    if (label_of(n, in[1]->v[size_t(i)], r.classes, ignore) >= 0) ++count;
  double scale = count ? in[2]->v[0] / double(count) : 0.0;
  for (int64_t i = 0; i < r.rows; ++i) {
    int64_t y = label_of(n, in[1]->v[size_t(i)], r.classes, ignore);
    if (y < 0) continue;
    const double* z = in[0]->v.data() + i * r.classes;
    double m = z[0];
    for (int64_t c = 1; c < r.classes; ++c) m = std::max(m, z[c]);
    double s = 0;
    for (int64_t c = 0; c < r.classes; ++c) s += std::exp(z[c] - m);
    for (int64_t c = 0; c < r.classes; ++c) {
      double p = std::exp(z[c] - m) / s;
      double target = (c == y ? 1 - eps : 0.0) + eps / double(r.classes);
      out.v[size_t(i * r.classes + c)] = scale * (p - target);
    }
  }
}

}  // namespace mgn::cpu
