// CPU reference: layer/RMS/group/batch normalization and their input derivatives (double accumulation).
//
// Every norm partitions x into statistic groups of M elements and scales each element by a per-feature
// weight (and adds a bias):
//   layer_norm, rms_norm  x [..., F]:    one group per row of the last axis; feature = last index
//   group_norm            x [N, C, ...]: one group per (n, channel group); feature = channel
//   batch_norm            x [N, C, ...]: one group per channel over N and the spatial axes (training-mode
//                                        batch statistics); feature = channel
// Variances are biased (divide by M), as PyTorch normalizes.
//
// The *_norm_grad(x, dy [, weight]) ops return dx only, the derivative with respect to the norm's input
// (weight scaling included); weight and bias gradients come from ordinary ops in autodiff. With
// g = dy * weight and xhat = (x - mean) * rstd, means taken over each statistic group:
//   layer/group/batch: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   rms:               dx = r * g - x * r^3 * mean(g * x),   r = 1 / sqrt(mean(x^2) + eps)
// batch_norm_grad is the training-mode derivative (the batch statistics depend on x).
#include <cmath>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

enum class Kind { Layer, Rms, Group, Batch };

// Maps a flat element index of x to its statistic group and its feature (weight/bias index).
struct NormIndex {
  Kind kind;
  int64_t feat = 1;     // F (layer/rms) or C (group/batch)
  int64_t spatial = 1;  // product of the axes after 1 (group/batch)
  int64_t per_group = 1;  // channels per group (group norm)
  int64_t groups = 1;   // number of statistic groups
  int64_t group_size = 1;  // M: elements in each statistic group

  NormIndex(Kind k, const Shape& x, int64_t channel_groups) : kind(k) {
    int64_t total = numel(x);
    if (k == Kind::Layer || k == Kind::Rms) {
      feat = x.back();
      groups = total / feat;
      group_size = feat;
      return;
    }
    feat = x[1];
    for (size_t i = 2; i < x.size(); ++i) spatial *= x[i];
    if (k == Kind::Group) {
      per_group = feat / channel_groups;
      groups = x[0] * channel_groups;
      group_size = per_group * spatial;
    } else {
      groups = feat;
      group_size = x[0] * spatial;
    }
  }
  int64_t feature(int64_t f) const {
    return (kind == Kind::Layer || kind == Kind::Rms) ? f % feat : (f / spatial) % feat;
  }
  int64_t group(int64_t f) const {
    switch (kind) {
      case Kind::Layer:
      case Kind::Rms:
        return f / feat;
      case Kind::Group: {
        int64_t n = f / (feat * spatial);
        return n * (feat / per_group) + feature(f) / per_group;
      }
      case Kind::Batch:
        return feature(f);
    }
    return 0;
  }
};

// Only norm ops come here (the executor routes by op); anything else is a routing bug, not a batch norm.
Kind kind_of(ir::Op op) {
  if (op == ir::Op::LayerNorm || op == ir::Op::LayerNormGrad) return Kind::Layer;
  if (op == ir::Op::RmsNorm || op == ir::Op::RmsNormGrad) return Kind::Rms;
  if (op == ir::Op::GroupNorm || op == ir::Op::GroupNormGrad) return Kind::Group;
  if (op == ir::Op::BatchNorm || op == ir::Op::BatchNormGrad) return Kind::Batch;
  throw Error(std::string("internal: the CPU norm kernels got ") + ir::op_name(op));
}

NormIndex index_for(const ir::Node& n, const Shape& x) {
  Kind k = kind_of(n.op);
  return NormIndex(k, x, k == Kind::Group ? n.attrs.i("groups") : 1);
}

// Per-group mean (zero for RMS, which does not centre) and reciprocal standard deviation.
struct Stats {
  std::vector<double> mean, rstd;
};

Stats group_stats(const NormIndex& ix, const std::vector<double>& x, double eps) {
  Stats s{std::vector<double>(size_t(ix.groups), 0.0), std::vector<double>(size_t(ix.groups), 0.0)};
  double m = double(ix.group_size);
  if (ix.kind != Kind::Rms) {
    for (int64_t f = 0; f < int64_t(x.size()); ++f) s.mean[size_t(ix.group(f))] += x[size_t(f)];
    for (double& v : s.mean) v /= m;
  }
  // Second pass around the mean: the one-pass E[x²] - E[x]² loses digits when |mean| >> std.
  std::vector<double> sq(size_t(ix.groups), 0.0);
  for (int64_t f = 0; f < int64_t(x.size()); ++f) {
    double d = x[size_t(f)] - s.mean[size_t(ix.group(f))];
    sq[size_t(ix.group(f))] += d * d;
  }
  for (size_t g = 0; g < sq.size(); ++g) s.rstd[g] = 1.0 / std::sqrt(sq[g] / m + eps);
  return s;
}

void norm_forward(const ir::Node& n, const Inputs& in, Buffer& out) {
  const std::vector<double>& x = in[0]->v;
  NormIndex ix = index_for(n, in[0]->shape);
  Stats s = group_stats(ix, x, n.attrs.f("eps"));
  const Buffer* w = in.size() > 1 ? in[1] : nullptr;
  const Buffer* b = in.size() > 2 ? in[2] : nullptr;
  for (int64_t f = 0; f < int64_t(x.size()); ++f) {
    int64_t g = ix.group(f), c = ix.feature(f);
    double y = (x[size_t(f)] - s.mean[size_t(g)]) * s.rstd[size_t(g)];
    if (w) y *= w->v[size_t(c)];
    if (b) y += b->v[size_t(c)];
    out.v[size_t(f)] = y;
  }
}

void norm_backward(const ir::Node& n, const Inputs& in, Buffer& out) {
  const std::vector<double>& x = in[0]->v;
  const std::vector<double>& dy = in[1]->v;
  const Buffer* w = in.size() > 2 ? in[2] : nullptr;
  NormIndex ix = index_for(n, in[0]->shape);
  Stats s = group_stats(ix, x, n.attrs.f("eps"));
  double m = double(ix.group_size);
  // g = dy * weight; per group: mean(g) and mean(g * xhat) (RMS: mean(g * x)).
  std::vector<double> g(x.size());
  std::vector<double> mean_g(size_t(ix.groups), 0.0), mean_gx(size_t(ix.groups), 0.0);
  for (int64_t f = 0; f < int64_t(x.size()); ++f) {
    int64_t grp = ix.group(f);
    double gv = dy[size_t(f)] * (w ? w->v[size_t(ix.feature(f))] : 1.0);
    g[size_t(f)] = gv;
    double xhat = (x[size_t(f)] - s.mean[size_t(grp)]) * s.rstd[size_t(grp)];
    mean_g[size_t(grp)] += gv / m;
    mean_gx[size_t(grp)] += gv * (ix.kind == Kind::Rms ? x[size_t(f)] : xhat) / m;
  }
  for (int64_t f = 0; f < int64_t(x.size()); ++f) {
    size_t grp = size_t(ix.group(f));
    double r = s.rstd[grp];
    if (ix.kind == Kind::Rms) {
      out.v[size_t(f)] = r * g[size_t(f)] - x[size_t(f)] * r * r * r * mean_gx[grp];
    } else {
      double xhat = (x[size_t(f)] - s.mean[grp]) * r;
      out.v[size_t(f)] = r * (g[size_t(f)] - mean_g[grp] - xhat * mean_gx[grp]);
    }
  }
}

}  // namespace

void k_LayerNorm(const ir::Node& n, const Inputs& in, Buffer& out) { norm_forward(n, in, out); }
void k_RmsNorm(const ir::Node& n, const Inputs& in, Buffer& out) { norm_forward(n, in, out); }
void k_GroupNorm(const ir::Node& n, const Inputs& in, Buffer& out) { norm_forward(n, in, out); }
void k_BatchNorm(const ir::Node& n, const Inputs& in, Buffer& out) { norm_forward(n, in, out); }

void k_LayerNormGrad(const ir::Node& n, const Inputs& in, Buffer& out) { norm_backward(n, in, out); }
void k_RmsNormGrad(const ir::Node& n, const Inputs& in, Buffer& out) { norm_backward(n, in, out); }
void k_GroupNormGrad(const ir::Node& n, const Inputs& in, Buffer& out) { norm_backward(n, in, out); }
void k_BatchNormGrad(const ir::Node& n, const Inputs& in, Buffer& out) { norm_backward(n, in, out); }

}  // namespace mgn::cpu
