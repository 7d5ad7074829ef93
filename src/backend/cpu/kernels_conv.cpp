// CPU reference: NCHW convolution (forward, input and weight derivatives), max/avg pooling and their
// derivatives, nearest upsampling and its derivative. Padding is [top, left, bottom, right].
//
//   conv2d(x, w)                   x [N, C, H, W], w [O, C/groups, kh, kw] -> y [N, O, OH, OW]
//   conv2d_grad_input(dy, w)       -> dx with shape attribute input_shape
//   conv2d_grad_weight(x, dy)      -> dw with shape attribute weight_shape
//   max_pool2d_grad(x, dy)         routes each dy to the first maximum of its window (row-major window
//                                  order, like PyTorch); padding never wins (it is -inf)
//   avg_pool2d_grad(dy)            spreads dy / divisor over the window's taps inside the input
//   upsample_nearest2d_grad(dy)    sums dy over each scale_h x scale_w block
// Pooling has no ceil mode, so every window ends inside the padded input: with count_include_pad the
// divisor is kh * kw, without it the number of taps inside the unpadded input.
#include <cmath>
#include <limits>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

struct Window {
  int64_t kh, kw, sh, sw, pt, pl, dh, dw;
};

Window window_of(const ir::Node& n, int64_t kh, int64_t kw, bool has_dilation) {
  const auto& st = n.attrs.ints("stride");
  const auto& pd = n.attrs.ints("padding");
  int64_t dh = 1, dw = 1;
  if (has_dilation) {
    dh = n.attrs.ints("dilation")[0];
    dw = n.attrs.ints("dilation")[1];
  }
  return {kh, kw, st[0], st[1], pd[0], pd[1], dh, dw};
}

// Visits every (output element, weight element, input element) triple of a grouped convolution whose input
// tap lies inside the unpadded input, as flat indices into y, w and x. The three conv kernels differ only
// in which of the three they accumulate into.
template <typename F>
void for_each_tap(const ir::Node& n, const Shape& xs, const Shape& ws, const Shape& ys, F&& f) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const int64_t O = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3];
  const int64_t OH = ys[2], OW = ys[3];
  const int64_t groups = n.attrs.i("groups");
  const int64_t Og = O / groups;
  Window win = window_of(n, KH, KW, true);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t o = 0; o < O; ++o) {
      int64_t c0 = (o / Og) * Cg;  // first input channel of this output channel's group
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t yi = ((b * O + o) * OH + oh) * OW + ow;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < KH; ++i) {
              int64_t ih = oh * win.sh - win.pt + i * win.dh;
              if (ih < 0 || ih >= H) continue;
              for (int64_t j = 0; j < KW; ++j) {
                int64_t iw = ow * win.sw - win.pl + j * win.dw;
                if (iw < 0 || iw >= W) continue;
                int64_t xi = ((b * C + c0 + ci) * H + ih) * W + iw;
                int64_t wi = ((o * Cg + ci) * KH + i) * KW + j;
                f(yi, wi, xi);
              }
            }
        }
    }
}

// Visits every (output element, input element) pair of a pooling window inside the unpadded input, in
// row-major window order; `end(yi, count)` is called after each window with its number of taps.
template <typename Tap, typename End>
void for_each_pool_tap(const Shape& xs, const Shape& ys, const Window& win, Tap&& tap, End&& end) {
  const int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3];
  const int64_t OH = ys[2], OW = ys[3];
  for (int64_t p = 0; p < NC; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t yi = (p * OH + oh) * OW + ow;
        int64_t count = 0;
        for (int64_t i = 0; i < win.kh; ++i) {
          int64_t ih = oh * win.sh - win.pt + i * win.dh;
          if (ih < 0 || ih >= H) continue;
          for (int64_t j = 0; j < win.kw; ++j) {
            int64_t iw = ow * win.sw - win.pl + j * win.dw;
            if (iw < 0 || iw >= W) continue;
            tap(yi, (p * H + ih) * W + iw);
            ++count;
          }
        }
        end(yi, count);
      }
}

Window pool_window(const ir::Node& n) {
  const auto& k = n.attrs.ints("kernel");
  bool is_max = n.op == ir::Op::MaxPool2d || n.op == ir::Op::MaxPool2dGrad;
  return window_of(n, k[0], k[1], is_max);
}

// For each output of a max pool, the flat input index of the first maximum of its window (-1 if the window
// holds no input element). NaN wins, as in PyTorch.
std::vector<int64_t> max_pool_argmax(const ir::Node& n, const Buffer& x, const Shape& ys) {
  std::vector<int64_t> arg(size_t(numel(ys)), -1);
  std::vector<double> best(arg.size(), -std::numeric_limits<double>::infinity());
  for_each_pool_tap(
      x.shape, ys, pool_window(n),
      [&](int64_t yi, int64_t xi) {
        double v = x.v[size_t(xi)];
        if (arg[size_t(yi)] < 0 || v > best[size_t(yi)] || (std::isnan(v) && !std::isnan(best[size_t(yi)]))) {
          arg[size_t(yi)] = xi;
          best[size_t(yi)] = v;
        }
      },
      [](int64_t, int64_t) {});
  return arg;
}

double avg_divisor(const ir::Node& n, const Window& win, int64_t count) {
  return n.attrs.i("count_include_pad") != 0 ? double(win.kh * win.kw) : double(count);
}

}  // namespace

void k_Conv2d(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto &x = in[0]->v, &w = in[1]->v;
  for_each_tap(n, in[0]->shape, in[1]->shape, out.shape,
               [&](int64_t yi, int64_t wi, int64_t xi) { out.v[size_t(yi)] += x[size_t(xi)] * w[size_t(wi)]; });
}

void k_Conv2dGradInput(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto &dy = in[0]->v, &w = in[1]->v;
  for_each_tap(n, out.shape, in[1]->shape, in[0]->shape,
               [&](int64_t yi, int64_t wi, int64_t xi) { out.v[size_t(xi)] += dy[size_t(yi)] * w[size_t(wi)]; });
}

void k_Conv2dGradWeight(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto &x = in[0]->v, &dy = in[1]->v;
  for_each_tap(n, in[0]->shape, out.shape, in[1]->shape,
               [&](int64_t yi, int64_t wi, int64_t xi) { out.v[size_t(wi)] += dy[size_t(yi)] * x[size_t(xi)]; });
}

void k_MaxPool2d(const ir::Node& n, const Inputs& in, Buffer& out) {
  std::vector<int64_t> arg = max_pool_argmax(n, *in[0], out.shape);
  for (size_t i = 0; i < arg.size(); ++i)
    out.v[i] = arg[i] < 0 ? -std::numeric_limits<double>::infinity() : in[0]->v[size_t(arg[i])];
}

void k_MaxPool2dGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  std::vector<int64_t> arg = max_pool_argmax(n, *in[0], in[1]->shape);
  for (size_t i = 0; i < arg.size(); ++i)
    if (arg[i] >= 0) out.v[size_t(arg[i])] += in[1]->v[i];
}

void k_AvgPool2d(const ir::Node& n, const Inputs& in, Buffer& out) {
  Window win = pool_window(n);
  const auto& x = in[0]->v;
  for_each_pool_tap(
      in[0]->shape, out.shape, win,
      [&](int64_t yi, int64_t xi) { out.v[size_t(yi)] += x[size_t(xi)]; },
      [&](int64_t yi, int64_t count) { out.v[size_t(yi)] /= avg_divisor(n, win, count); });
}

void k_AvgPool2dGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  Window win = pool_window(n);
  const auto& dy = in[0]->v;
  // Two passes over each window: count its taps (the divisor), then spread dy / divisor over them.
  std::vector<double> share(dy.size());
  for_each_pool_tap(
      out.shape, in[0]->shape, win, [](int64_t, int64_t) {},
      [&](int64_t yi, int64_t count) { share[size_t(yi)] = dy[size_t(yi)] / avg_divisor(n, win, count); });
  for_each_pool_tap(
      out.shape, in[0]->shape, win,
      [&](int64_t yi, int64_t xi) { out.v[size_t(xi)] += share[size_t(yi)]; }, [](int64_t, int64_t) {});
}

void k_Upsample2d(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto& s = n.attrs.ints("scale");
  const Shape& xs = in[0]->shape;
  const int64_t H = xs[2], W = xs[3], OH = out.shape[2], OW = out.shape[3];
  for (int64_t p = 0; p < xs[0] * xs[1]; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        out.v[size_t((p * OH + oh) * OW + ow)] = in[0]->v[size_t((p * H + oh / s[0]) * W + ow / s[1])];
}

void k_Upsample2dGrad(const ir::Node& n, const Inputs& in, Buffer& out) {
  const auto& s = n.attrs.ints("scale");
  const Shape& ys = in[0]->shape;
  const int64_t H = out.shape[2], W = out.shape[3], OH = ys[2], OW = ys[3];
  for (int64_t p = 0; p < ys[0] * ys[1]; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        out.v[size_t((p * H + oh / s[0]) * W + ow / s[1])] += in[0]->v[size_t((p * OH + oh) * OW + ow)];
}

}  // namespace mgn::cpu
