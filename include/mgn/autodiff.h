// Reverse-mode automatic differentiation as a graph transformation: backward() appends the gradient
// computation of a scalar loss to the same graph, so a backend runs forward and backward as one graph.
//
//   mgn::Tensor loss = mgn::cross_entropy(mgn::linear(x, w), labels);
//   mgn::Gradients grads = mgn::backward(g, loss);
//   g.output("loss", loss);
//   g.output("grad.w", grads.params.at("fc.weight"));
//
// Rules: gradients through several paths are summed; broadcasting is undone by summing over the broadcast
// axes; stop_gradient blocks; frozen parameters (Graph::freeze) and state get no gradient; integer and
// bool tensors carry no gradient. Max/min reductions and maximum/minimum split the gradient evenly between
// tied elements (PyTorch's amax/amin and torch.maximum semantics). The additive attention mask is not
// differentiated: backward() throws if a gradient would have to flow into it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "mgn/graph.h"

namespace mgn {

struct BackwardOptions {
  // Also differentiate with respect to these graph inputs (float Input or Parameter nodes).
  std::vector<Tensor> inputs;
};

struct Gradients {
  // Every trainable (non-frozen) parameter the loss depends on through differentiable ops: name -> gradient
  // (same shape and dtype as the parameter).
  std::map<std::string, Tensor> params;
  // One per BackwardOptions::inputs, in order (a zero tensor where the loss does not depend on it).
  std::vector<Tensor> inputs;
};

// Appends the backward pass of the scalar `loss` to g and returns the gradient tensors (not yet outputs).
// Throws mgn::Error for a non-scalar or non-float loss, or a requested input that cannot have a gradient.
Gradients backward(Graph& g, Tensor loss, const BackwardOptions& opt = {});

}  // namespace mgn
