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
