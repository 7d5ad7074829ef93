// Optimizers, learning-rate schedules and gradient clipping. An optimizer is lowered to ordinary graph ops
// plus assign() appended to the training graph, so any backend runs forward + backward + update at once:
//
//   auto grads = mgn::backward(g, loss);
//   mgn::UpdatePlan plan = mgn::append_optimizer(g, grads.params, mgn::AdamW{.lr = 1e-3});
//   // every step: feed plan.scalar_inputs(lr_for_this_step, step) as graph inputs, run, commit assigns
//
// Semantics follow torch.optim exactly: SGD and Adam add weight decay to the gradient (L2); AdamW decays
// the parameter directly (decoupled). Moments are Graph::state tensors named "optim.<param>.<slot>"; the
// completed-step count is the state "optim.step". The learning rate is a runtime scalar input, so a
// schedule or set_lr never recompiles.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "mgn/graph.h"

namespace mgn {

struct SGD {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;  // L2: grad += weight_decay * param
};

struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2: grad += weight_decay * param
};

struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay
};

using Optimizer = std::variant<SGD, Adam, AdamW>;

// The base learning rate an optimizer was configured with.
double base_lr(const Optimizer& opt);
const char* optimizer_name(const Optimizer& opt);

// Parameters whose name starts with `prefix` train with lr * scale (the longest matching prefix wins).
struct LrMultiplier {
  std::string prefix;
  double scale = 1;
};

struct UpdateOptions {
  // > 0: scale all gradients together so that their global L2 norm is at most this (in graph, like
  // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1).
  double clip_grad_norm = 0;
  std::vector<LrMultiplier> lr_multipliers;
};

// Learning rate as a function of the number of completed steps t (0 for the first step), computed on the
// host each step. Closed forms (match torch.optim.lr_scheduler where one exists):
//   Constant:       lr
//   LinearWarmup:   lr * (f + (1 - f) * min(t, W) / W)                 (LinearLR(start_factor = f, total_iters = W))
//   Cosine:         m + (lr - m) * (1 + cos(pi * min(t, T) / T)) / 2   (CosineAnnealingLR(T_max = T, eta_min = m))
//   WarmupCosine:   LinearWarmup for t < W, then Cosine over T - W steps of (t - W)
// where m = lr * min_lr_ratio.
struct Schedule {
  enum class Kind : uint8_t { Constant, LinearWarmup, Cosine, WarmupCosine };
  Kind kind = Kind::Constant;
  int64_t warmup_steps = 0;   // W
  double warmup_start_factor = 0;  // f
  int64_t total_steps = 0;    // T (Cosine, WarmupCosine)
  double min_lr_ratio = 0;

  static Schedule constant() { return {}; }
  static Schedule linear_warmup(int64_t warmup, double start_factor = 0) {
    return {Kind::LinearWarmup, warmup, start_factor, 0, 0};
  }
  static Schedule cosine(int64_t total, double min_lr_ratio = 0) { return {Kind::Cosine, 0, 0, total, min_lr_ratio}; }
  static Schedule warmup_cosine(int64_t warmup, int64_t total, double min_lr_ratio = 0, double start_factor = 0) {
    return {Kind::WarmupCosine, warmup, start_factor, total, min_lr_ratio};
  }
  // Throws mgn::Error for inconsistent settings (non-positive W or T where needed, W >= T).
  void validate() const;
  double lr(double base, int64_t t) const;
};

// What append_optimizer added: the names of the runtime scalar inputs and of the state it created.
struct UpdatePlan {
  static constexpr const char* kLrInput = "optim.lr";
  static constexpr const char* kBiasCorrection1Input = "optim.bias_correction1";  // Adam/AdamW: 1 - beta1^(t+1)
  static constexpr const char* kBiasCorrection2Input = "optim.bias_correction2";  // Adam/AdamW: 1 - beta2^(t+1)
  static constexpr const char* kStepState = "optim.step";
  static constexpr const char* kGradNormOutput = "optim.grad_norm";  // with clipping: the norm before clipping

  Optimizer optimizer;
  std::vector<std::string> params;       // updated parameters, in graph order
  std::vector<std::string> state_names;  // moments and the step counter
  std::vector<std::string> inputs;       // runtime scalar inputs to feed every step

  // Values of `inputs` (same order) for the step after t completed steps at learning rate lr. The bias
  // corrections are computed on the host in double: in f32 in the graph, 1 - 0.999^1 would lose ~5 digits.
  std::vector<float> scalar_inputs(double lr, int64_t t) const;
};

// Appends the update for every parameter in `grads` (parameter name -> its gradient, as returned by
// mgn::backward) to `g`. Throws mgn::Error naming the parameter for a gradient of the wrong shape, a
// frozen/unknown parameter, or a graph that already holds an optimizer.
UpdatePlan append_optimizer(Graph& g, const std::map<std::string, Tensor>& grads, const Optimizer& opt,
                            const UpdateOptions& options = {});

}  // namespace mgn
