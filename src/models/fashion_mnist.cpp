// Fashion-MNIST MLP and small CNN, built from the nn layer helpers (PyTorch default initializers).
#include "mgn/models.h"
#include "mgn/nn.h"

namespace mgn::models {

FashionArch fashion_arch_from_name(const std::string& s) {
  if (s == "mlp") return FashionArch::Mlp;
  if (s == "cnn") return FashionArch::Cnn;
  throw Error("unknown Fashion-MNIST model '" + s + "' (expected mlp or cnn)");
}

const char* fashion_arch_name(FashionArch a) { return a == FashionArch::Mlp ? "mlp" : "cnn"; }

Graph fashion_mnist(const FashionMnistConfig& cfg) {
  if (cfg.batch <= 0) throw Error("fashion_mnist: batch must be positive, got " + std::to_string(cfg.batch));
  if (cfg.hidden < 0) throw Error("fashion_mnist: hidden must be >= 0");
  Graph g;
  Tensor x = g.input("x", {cfg.batch, 1, 28, 28});
  Tensor h;
  int64_t hidden = cfg.hidden;
  if (cfg.arch == FashionArch::Mlp) {
    if (!hidden) hidden = 256;
    h = flatten(x, 1);
  } else {
    if (!hidden) hidden = 128;
    nn::Conv2dLayerOptions c1{.padding = {1, 1}, .seed = cfg.seed};
    h = max_pool2d(relu(nn::conv2d(g, "conv1", x, 16, 3, c1)));
    nn::Conv2dLayerOptions c2{.padding = {1, 1}, .seed = cfg.seed};
    h = max_pool2d(relu(nn::conv2d(g, "conv2", h, 32, 3, c2)));
    h = flatten(h, 1);
  }
  h = relu(nn::linear(g, "fc1", h, hidden, {.seed = cfg.seed}));
  Tensor logits = nn::linear(g, "fc2", h, 10, {.seed = cfg.seed});
  g.output("logits", logits);
  if (cfg.mode == Mode::Train) {
    Tensor labels = g.input("labels", {cfg.batch}, DType::I32);
    g.output("loss", cross_entropy(logits, labels));
  }
  return g;
}

}  // namespace mgn::models
