// ResNet-18/34/50/101/152 in torchvision's layout and state_dict names (include/mgn/models.h), with real
// BatchNorm (batch statistics and running-statistic assigns) or its eval form.
#include <cmath>
#include <string>

#include "mgn/models.h"
#include "mgn/nn.h"

namespace mgn::models {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

struct Builder {
  Graph& g;
  const ResNetConfig& cfg;
  nn::Mode bn_mode;

  // nn::conv2d initializes like nn.Conv2d (kaiming_uniform, a = sqrt 5); torchvision re-initializes every
  // conv with kaiming_normal_(mode="fan_out", nonlinearity="relu"), i.e. N(0, 2 / (out · k · k)).
  Tensor conv(const std::string& name, Tensor x, int64_t out, int64_t k, int64_t stride, int64_t pad) {
    Shape ws = {out, x.dim(1), k, k};
    double std = std::sqrt(2.0 / double(fan_out(ws)));
    Tensor w = g.parameter(name + ".weight", ws, Init::normal(0.0, std, cfg.seed));
    return conv2d(x, w, {.stride = {stride, stride}, .padding = {pad, pad}});
  }

  Tensor bn(const std::string& name, Tensor x) {
    return nn::batch_norm2d(g, name, x, bn_mode, cfg.bn_momentum, cfg.bn_eps);
  }

  Tensor basic(const std::string& p, Tensor x, int64_t planes, int64_t stride) {
    Tensor h = relu(bn(p + ".bn1", conv(p + ".conv1", x, planes, 3, stride, 1)));
    h = bn(p + ".bn2", conv(p + ".conv2", h, planes, 3, 1, 1));
    return relu(h + shortcut(p, x, planes, stride));
  }

  Tensor bottleneck(const std::string& p, Tensor x, int64_t planes, int64_t stride) {
    Tensor h = relu(bn(p + ".bn1", conv(p + ".conv1", x, planes, 1, 1, 0)));
    h = relu(bn(p + ".bn2", conv(p + ".conv2", h, planes, 3, stride, 1)));
    h = bn(p + ".bn3", conv(p + ".conv3", h, planes * 4, 1, 1, 0));
    return relu(h + shortcut(p, x, planes * 4, stride));
  }

  Tensor shortcut(const std::string& p, Tensor x, int64_t out, int64_t stride) {
    if (stride == 1 && x.dim(1) == out) return x;
    return bn(p + ".downsample.1", conv(p + ".downsample.0", x, out, 1, stride, 0));
  }
};

}  // namespace

Graph resnet(const ResNetConfig& cfg) {
  std::vector<int64_t> blocks = cfg.blocks;
  bool bottleneck = cfg.depth >= 50;
  if (blocks.empty()) {
    switch (cfg.depth) {
      case 18: blocks = {2, 2, 2, 2}; break;
      case 34:
      case 50: blocks = {3, 4, 6, 3}; break;
      case 101: blocks = {3, 4, 23, 3}; break;
      case 152: blocks = {3, 8, 36, 3}; break;
      default: throw Error("resnet: depth must be 18, 34, 50, 101 or 152, got " + std::to_string(cfg.depth));
    }
  } else if (cfg.depth != 18 && cfg.depth != 34 && cfg.depth != 50 && cfg.depth != 101 && cfg.depth != 152) {
    throw Error("resnet: depth (which picks the block type) must be 18, 34, 50, 101 or 152, got " +
                std::to_string(cfg.depth));
  }
  if (blocks.size() != 4) throw Error("resnet: blocks needs 4 stage counts, got " + str(int64_t(blocks.size())));
  for (int64_t b : blocks)
    if (b <= 0) throw Error("resnet: every stage needs at least one block, got " + str(b));
  if (cfg.batch <= 0) throw Error("resnet: batch must be positive, got " + str(cfg.batch));
  if (cfg.image_size <= 0) throw Error("resnet: image_size must be positive, got " + str(cfg.image_size));
  if (cfg.num_classes <= 0) throw Error("resnet: num_classes must be positive, got " + str(cfg.num_classes));
  if (cfg.width <= 0) throw Error("resnet: width must be positive, got " + str(cfg.width));

  ResNetBn bn = cfg.bn;
  if (bn == ResNetBn::Auto) bn = cfg.mode == Mode::Train ? ResNetBn::Batch : ResNetBn::Running;
  Graph g;
  Builder b{g, cfg, bn == ResNetBn::Batch ? nn::Mode::Train : nn::Mode::Eval};
  Tensor x = g.input("x", {cfg.batch, 3, cfg.image_size, cfg.image_size});
  Tensor h = relu(b.bn("bn1", b.conv("conv1", x, cfg.width, 7, 2, 3)));
  h = max_pool2d(h, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  for (int s = 0; s < 4; ++s) {
    int64_t planes = cfg.width << s;
    for (int64_t i = 0; i < blocks[size_t(s)]; ++i) {
      std::string p = "layer" + std::to_string(s + 1) + "." + str(i);
      int64_t stride = (s > 0 && i == 0) ? 2 : 1;
      h = bottleneck ? b.bottleneck(p, h, planes, stride) : b.basic(p, h, planes, stride);
    }
  }
  h = flatten(global_avg_pool(h), 1);
  Tensor logits = nn::linear(g, "fc", h, cfg.num_classes, {.seed = cfg.seed});
  g.output("logits", logits);
  if (cfg.mode == Mode::Train) {
    Tensor labels = g.input("labels", {cfg.batch}, DType::I32);
    g.output("loss", cross_entropy(logits, labels));
  }
  return g;
}

}  // namespace mgn::models
