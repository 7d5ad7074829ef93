// The static plan of a graph, for inspection: the dispatch list grouped at barriers, every buffer with its
// lifetime and arena offset, and the memory report (logical vs physical bytes per class). Backends plan
// their own sessions; this plans a graph as a GPU backend would (4-byte elements, 256-byte alignment).
//
//   mgn::Graph g = mgn::models::fashion_mnist({.mode = mgn::Mode::Train});
//   std::puts(mgn::describe_training_plan(g, "loss", mgn::AdamW{}).c_str());  // backward + update appended
//   uint64_t arena = mgn::summarize_plan(g).physical_bytes;
#pragma once

#include <cstdint>
#include <string>

#include "mgn/graph.h"
#include "mgn/optim.h"

namespace mgn {

struct PlanDescribeOptions {
  uint64_t element_bytes = 4;  // bytes per element as the backend stores it
  uint64_t alignment = 256;    // offset alignment (the device's minStorageBufferOffsetAlignment or more)
  bool dump = true;            // false: the memory report alone
  bool reuse = true;           // false: no aliasing or in-place (for comparison)
};

// The plan's text dump and memory report; throws mgn::Error when the graph cannot be planned.
std::string describe_plan(const Graph& g, const PlanDescribeOptions& opt = {});

// The totals of the memory report, as numbers (the benchmarks put them next to measured memory).
struct PlanSummary {
  uint64_t logical_bytes = 0;    // every tensor's bytes (views excluded), as if nothing shared memory
  uint64_t physical_bytes = 0;   // the arena after aliasing and in-place reuse
  uint64_t peak_live_bytes = 0;  // most step-local bytes live in one barrier group (a lower bound)
  int dispatches = 0;
  int barrier_groups = 0;
};
// The same plan describe_plan prints (opt.dump is ignored); throws mgn::Error when it cannot be planned.
PlanSummary summarize_plan(const Graph& g, const PlanDescribeOptions& opt = {});
// Appends the backward pass of the output `loss` and the optimizer update to `g` (as compile() does in
// Train mode), then describes the plan of that training step.
std::string describe_training_plan(Graph& g, const std::string& loss, const Optimizer& optimizer,
                                   const PlanDescribeOptions& opt = {});

}  // namespace mgn
