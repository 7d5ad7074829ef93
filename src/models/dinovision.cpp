// DinoVision decoder (include/mgn/dinovision.h): the layer list, its graph, the patch-grid rearrangement of
// the encoder's output, and the PSNR / SSIM metrics.
#include "mgn/dinovision.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace mgn::dinovision {

namespace {
std::string str(int64_t v) {
  return std::to_string(v);
}
}  // namespace

void DecoderConfig::validate() const {
  if (widths.size() != 5)
    throw Error("dinovision decoder: 5 widths are needed (conv_in/block, then 4 upsamplings), got " +
                str(int64_t(widths.size())));
  if (in_channels <= 0 || in_channels > (1 << 16))
    throw Error("dinovision decoder: in_channels must be in 1..65536, got " + str(in_channels));
  if (grid <= 0 || grid > 1024) throw Error("dinovision decoder: grid must be in 1..1024, got " + str(grid));
  if (groups <= 0) throw Error("dinovision decoder: groups must be positive, got " + str(groups));
  for (int64_t w : widths)
    if (w <= 0 || w > (1 << 14) || w % groups != 0)
      throw Error("dinovision decoder: every width must be in 1..16384 and divisible by the " + str(groups) +
                  " groups, got " + str(w));
  if (!(eps > 0)) throw Error("dinovision decoder: eps must be positive");
}

std::vector<std::pair<std::string, Shape>> decoder_parameter_shapes(const DecoderConfig& c) {
  c.validate();
  const auto& w = c.widths;
  std::vector<std::pair<std::string, Shape>> s;
  auto conv = [&](const std::string& n, int64_t in, int64_t out) {
    s.push_back({n + ".weight", {out, in, 3, 3}});
    s.push_back({n + ".bias", {out}});
  };
  auto norm = [&](const std::string& n, int64_t ch) {
    s.push_back({n + ".weight", {ch}});
    s.push_back({n + ".bias", {ch}});
  };
  conv("conv_in", c.in_channels, w[0]);
  norm("block.norm", w[0]);
  conv("block.conv", w[0], w[0]);
  for (int i = 0; i < 4; ++i) {
    norm("up." + std::to_string(i) + ".norm", w[size_t(i)]);
    conv("up." + std::to_string(i) + ".conv", w[size_t(i)], w[size_t(i) + 1]);
  }
  norm("out.norm", w[4]);
  conv("out.conv", w[4], 3);
  return s;
}

int64_t decoder_parameter_count(const DecoderConfig& c) {
  int64_t n = 0;
  for (auto& [name, shape] : decoder_parameter_shapes(c)) n += numel(shape);
  return n;
}

Graph decoder_graph(const DecoderConfig& c, int64_t batch, Mode mode, uint64_t seed, int64_t resident_rows) {
  if (batch <= 0) throw Error("dinovision::decoder_graph: batch must be positive, got " + str(batch));
  if (resident_rows < 0 || (resident_rows > 0 && mode != Mode::Train))
    throw Error("dinovision::decoder_graph: resident_rows (" + str(resident_rows) +
                ") must be 0, or positive for a training graph");
  Graph g;
  std::map<std::string, Tensor> p;
  for (auto& [name, shape] : decoder_parameter_shapes(c)) {
    Init init = Init::zeros();
    if (name.find(".norm.") != std::string::npos) {
      init = name.ends_with(".weight") ? Init::ones() : Init::zeros();
    } else if (name.ends_with(".weight")) {
      init = Init::kaiming_uniform(std::sqrt(5.0), seed);
    } else {  // a conv bias: uniform(±1/√fan_in), fan_in of the weight beside it
      const std::string wname = name.substr(0, name.size() - 4) + "weight";
      Shape ws;
      for (auto& [n2, s2] : decoder_parameter_shapes(c))
        if (n2 == wname) ws = s2;
      const double bound = 1.0 / std::sqrt(double(ws[1] * ws[2] * ws[3]));
      init = Init::uniform(-bound, bound, seed);
    }
    p[name] = g.parameter(name, shape, init);
  }
  const int64_t G = c.groups, S = c.image_size();
  auto conv = [&](Tensor x, const std::string& n) {
    return conv2d(x, p.at(n + ".weight"), {.padding = {1, 1}}, p.at(n + ".bias"));
  };
  auto norm_act = [&](Tensor x, const std::string& n) {
    return silu(group_norm(x, G, p.at(n + ".weight"), p.at(n + ".bias"), c.eps));
  };
  std::optional<Tensor> rows;
  if (resident_rows > 0) rows = g.input("rows", {batch}, DType::I32);
  Tensor x = rows ? gather(g.state("data.features", {resident_rows, c.in_channels, c.grid, c.grid}), *rows)
                  : g.input("features", {batch, c.in_channels, c.grid, c.grid});
  x = conv(x, "conv_in");
  x = conv(norm_act(x, "block.norm"), "block.conv");
  for (int i = 0; i < 4; ++i) {
    const std::string u = "up." + std::to_string(i);
    x = conv(upsample_nearest2d(norm_act(x, u + ".norm"), 2, 2), u + ".conv");
  }
  x = conv(norm_act(x, "out.norm"), "out.conv");
  g.output("image", x);
  if (mode == Mode::Train)
    g.output("loss", mse_loss(x, rows ? gather(g.state("data.targets", {resident_rows, 3, S, S}), *rows)
                                      : g.input("target", {batch, 3, S, S})));
  return g;
}

std::vector<float> patch_grid(const std::vector<float>& hidden, int64_t B, int64_t prefix, int64_t grid,
                              int64_t D) {
  const int64_t S = prefix + grid * grid;
  if (int64_t(hidden.size()) != B * S * D)
    throw Error("dinovision::patch_grid: " + str(int64_t(hidden.size())) + " values, not " + str(B) + "x" +
                str(S) + "x" + str(D));
  std::vector<float> out(size_t(B * D * grid * grid));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < grid * grid; ++t)
      for (int64_t d = 0; d < D; ++d)
        out[size_t((b * D + d) * grid * grid + t)] = hidden[size_t((b * S + prefix + t) * D + d)];
  return out;
}

double psnr(double mse) {
  return 10.0 * std::log10(1.0 / std::max(mse, 1e-20));
}

double ssim(const std::vector<float>& a, const std::vector<float>& b, int64_t H, int64_t W) {
  constexpr int r = 5;  // int(3.5·1.5 + 0.5)
  if (a.size() != b.size() || int64_t(a.size()) != 3 * H * W)
    throw Error("dinovision::ssim: the images differ in size");
  if (H <= 2 * r || W <= 2 * r)
    throw Error("dinovision::ssim: the images must be at least 11 x 11, got " + str(H) + "x" + str(W));
  double k[2 * r + 1], ksum = 0;
  for (int i = -r; i <= r; ++i) ksum += k[i + r] = std::exp(-0.5 * double(i * i) / (1.5 * 1.5));
  for (double& v : k) v /= ksum;
  const double C1 = 0.01 * 0.01, C2 = 0.03 * 0.03;
  const int64_t oh = H - 2 * r, ow = W - 2 * r;
  double total = 0;
  for (int64_t ch = 0; ch < 3; ++ch) {
    const float* x = a.data() + ch * H * W;
    const float* y = b.data() + ch * H * W;
    // Horizontal pass of x, y, x², y², xy on the columns that the interior needs, then vertical.
    std::vector<double> h(size_t(5 * H * ow));
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double s[5] = {0, 0, 0, 0, 0};
        for (int t = 0; t <= 2 * r; ++t) {
          const double u = x[i * W + j + t], v = y[i * W + j + t], w = k[t];
          s[0] += w * u, s[1] += w * v, s[2] += w * u * u, s[3] += w * v * v, s[4] += w * u * v;
        }
        for (int q = 0; q < 5; ++q) h[size_t((q * H + i) * ow + j)] = s[q];
      }
    double sum = 0;
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double m[5] = {0, 0, 0, 0, 0};
        for (int t = 0; t <= 2 * r; ++t)
          for (int q = 0; q < 5; ++q) m[q] += k[t] * h[size_t((q * H + i + t) * ow + j)];
        const double vx = m[2] - m[0] * m[0], vy = m[3] - m[1] * m[1], vxy = m[4] - m[0] * m[1];
        sum +=
            ((2 * m[0] * m[1] + C1) * (2 * vxy + C2)) / ((m[0] * m[0] + m[1] * m[1] + C1) * (vx + vy + C2));
      }
    total += sum / double(oh * ow);
  }
  return total / 3.0;
}

}  // namespace mgn::dinovision
