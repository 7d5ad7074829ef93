// Model builders. Each returns a graph whose inputs, outputs and parameter names are part of its contract,
// so a training graph and an inference graph of the same model exchange checkpoints by name.
#pragma once

#include <cstdint>
#include <string>

#include "mgn/graph.h"
#include "mgn/session.h"

namespace mgn::models {

// Fashion-MNIST classifiers.
//   Mlp: flatten -> fc1 (hidden) -> relu -> fc2 (10)
//   Cnn: conv1 (16, 3x3, pad 1) -> relu -> max-pool 2 -> conv2 (32, 3x3, pad 1) -> relu -> max-pool 2
//        -> flatten (32*7*7) -> fc1 (hidden) -> relu -> fc2 (10)
// Inputs: "x" f32 [batch, 1, 28, 28]; Train adds "labels" i32 [batch] and the output "loss" (mean
// cross-entropy). Both modes output "logits" [batch, 10].
enum class FashionArch : uint8_t { Mlp, Cnn };
FashionArch fashion_arch_from_name(const std::string& s);  // "mlp", "cnn"
const char* fashion_arch_name(FashionArch a);

struct FashionMnistConfig {
  FashionArch arch = FashionArch::Mlp;
  int64_t batch = 64;
  Mode mode = Mode::Train;
  int64_t hidden = 0;  // 0: 256 for the MLP, 128 for the CNN
  uint64_t seed = 0;
};

Graph fashion_mnist(const FashionMnistConfig& cfg);

}  // namespace mgn::models

// ---- ResNet (torchvision layout)
namespace mgn::models {

// torchvision's ResNet ("v1.5": a bottleneck strides on its 3x3 conv):
//   conv1 (7x7, stride 2, pad 3, no bias) -> bn1 -> relu -> max-pool 3x3 / 2 (pad 1)
//   -> layer1..layer4 -> global average pool -> flatten -> fc (num_classes)
// Stage s (1..4) has blocks[s-1] blocks of `planes` = width · 2^(s-1) (width 64 in torchvision); the first
// block of stages 2..4 has stride 2, and a block gets a downsample (1x1 conv with the block's stride, then
// BN) where its input and output shapes differ. Basic blocks (depth 18, 34): conv3x3-bn-relu-conv3x3-bn;
// bottlenecks (50, 101, 152): conv1x1-bn-relu-conv3x3-bn-relu-conv1x1 (4·planes)-bn; then + identity, relu.
// Convs have no bias. Parameter names are torchvision's state_dict keys (conv1.weight, bn1.{weight, bias,
// running_mean, running_var}, layer1.0.conv1.weight, layer2.0.downsample.0.weight, layer2.0.downsample.1.*,
// fc.weight, fc.bias, ...), without num_batches_tracked, which torch reads only when momentum is None.
// Inputs: "x" f32 [batch, 3, image_size, image_size]; Train adds "labels" i32 [batch] and the output "loss"
// (mean cross-entropy). Both modes output "logits" [batch, num_classes].
// BatchNorm: Batch normalizes with the batch statistics and assigns the running statistics (momentum,
// unbiased variance), as torch in train(); Running normalizes with the running statistics, as torch in
// eval(). Auto: Batch in Train mode, Running in Infer mode.
// Initialization as torchvision (zero_init_residual=False): conv weights normal(0, sqrt(2 / fan_out))
// (kaiming_normal_, mode fan_out, relu), BN weight 1 and bias 0, running mean 0 and var 1, fc nn.Linear's
// default; the values come from mgn's generator, not torch's.
enum class ResNetBn : uint8_t { Auto, Batch, Running };

struct ResNetConfig {
  int depth = 50;               // 18, 34, 50, 101, 152
  std::vector<int64_t> blocks;  // blocks per stage (4 values); empty: torchvision's for `depth`
  int64_t batch = 4;
  int64_t image_size = 224;
  int64_t num_classes = 1000;
  int64_t width = 64;  // planes of layer1 (torchvision: 64); smaller for tests
  Mode mode = Mode::Train;
  ResNetBn bn = ResNetBn::Auto;
  double bn_momentum = 0.1;
  double bn_eps = 1e-5;
  uint64_t seed = 0;
};

Graph resnet(const ResNetConfig& cfg);

}  // namespace mgn::models
