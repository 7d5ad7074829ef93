// Layer helpers: each creates its parameters under a name prefix with PyTorch's default initializers and
// Hugging Face parameter names, so checkpoints exchange with PyTorch by name.
//
//   mgn::Tensor h = mgn::nn::linear(g, "fc1", x, 256);             // fc1.weight [256, in], fc1.bias [256]
//   h = mgn::nn::conv2d(g, "conv1", x, 32, 3, {.padding = {1, 1}}); // conv1.weight [32, C, 3, 3], conv1.bias
//   h = mgn::nn::batch_norm2d(g, "bn1", h, mgn::nn::Mode::Train);   // bn1.{weight,bias,running_mean,running_var}
#pragma once

#include <optional>
#include <string>

#include "mgn/graph.h"

namespace mgn::nn {

enum class Mode { Train, Eval };

struct LinearOptions {
  bool bias = true;
  uint64_t seed = 0;
};
// x [..., in] -> [..., out]; weight [out, in] (kaiming_uniform(a = sqrt 5)), bias U(-1/sqrt(in), 1/sqrt(in)).
Tensor linear(Graph& g, const std::string& name, Tensor x, int64_t out_features, const LinearOptions& opt = {});

struct Conv2dLayerOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
  uint64_t seed = 0;
};
// x [N, C, H, W]; weight [out, C/groups, k, k].
Tensor conv2d(Graph& g, const std::string& name, Tensor x, int64_t out_channels, int64_t kernel,
              const Conv2dLayerOptions& opt = {});

// ids i32 [...] -> [..., dim]; weight [vocab, dim] ~ N(0, 1) like nn.Embedding (`std` overrides).
Tensor embedding(Graph& g, const std::string& name, Tensor ids, int64_t vocab, int64_t dim, double std = 1.0,
                 uint64_t seed = 0);

// Over the last axis; weight ones, bias zeros.
Tensor layer_norm(Graph& g, const std::string& name, Tensor x, double eps = 1e-5, bool bias = true);
Tensor rms_norm(Graph& g, const std::string& name, Tensor x, double eps = 1e-6);
Tensor group_norm(Graph& g, const std::string& name, Tensor x, int64_t groups, double eps = 1e-5);

// BatchNorm over axis 1 of [N, C, ...]. Train: batch statistics, and assigns that update running_mean /
// running_var (momentum, unbiased variance) like torch.nn.BatchNorm2d. Eval: the running statistics.
Tensor batch_norm2d(Graph& g, const std::string& name, Tensor x, Mode mode, double momentum = 0.1,
                    double eps = 1e-5);

enum class Activation { Relu, Gelu, GeluTanh, Silu };
Tensor activate(Tensor x, Activation a);

// fc1 -> activation -> fc2 (names "<name>.fc1", "<name>.fc2").
Tensor mlp(Graph& g, const std::string& name, Tensor x, int64_t hidden, int64_t out, Activation a = Activation::Gelu);
// Llama MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
Tensor swiglu(Graph& g, const std::string& name, Tensor x, int64_t hidden);

struct AttentionConfig {
  int64_t heads = 1;
  int64_t kv_heads = 0;  // 0: same as heads (grouped-query attention when fewer)
  int64_t head_dim = 0;  // 0: hidden / heads
  bool causal = true;
  bool bias = false;         // on q/k/v projections
  double rope_theta = 0;     // > 0: rotary embedding on q and k with these base frequencies
  std::optional<Tensor> positions;  // i32 [S] for RoPE; default 0..S-1
};
// Self-attention of x [B, S, hidden] with q_proj/k_proj/v_proj/o_proj (Llama names) -> [B, S, hidden].
Tensor self_attention(Graph& g, const std::string& name, Tensor x, const AttentionConfig& cfg);

}  // namespace mgn::nn
