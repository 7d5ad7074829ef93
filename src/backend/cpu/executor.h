// The CPU reference executor: runs any graph op by op in plain loops with double accumulation, from the same
// kind of static plan the Vulkan backend runs. It is the oracle for every other backend and lets every graph
// run without a GPU.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace mgn::cpu {

struct ExecutorOptions {
  // float64: keep every intermediate in double (gradient checking); otherwise round each result to its
  // storage dtype (f32, f16, bf16) like a real backend.
  bool float64 = false;
  // The static plan the executor runs from: one arena of doubles, every tensor at its planned offset,
  // barrier groups executed as if their dispatches ran concurrently (all reads of a group before its
  // writes), and the arena poisoned before each step, so an aliasing bug shows. tensor_bytes is replaced by
  // numel × sizeof(double) and the alignment raised to at least 8. With reuse and in_place off every
  // tensor has its own memory (the plan tests compare the two bitwise).
  plan::PlanOptions plan;
};

class Executor {
 public:
  explicit Executor(const ir::Graph& g, ExecutorOptions opt = {});

  // Inputs are fed as row-major values; the count must match the input's shape.
  void set_input(const std::string& name, std::vector<double> values);
  void set_input(const std::string& name, const std::vector<float>& values);
  void set_input(const std::string& name, const std::vector<int32_t>& values);
  // Parameters and state start from their initializers; these read or replace their current values.
  const std::vector<double>& state(const std::string& name) const;
  void set_state(const std::string& name, std::vector<double> values);
  std::vector<std::string> state_names() const;

  // Evaluates every node the outputs and assigns need, then commits the assigns.
  void run();

  const Buffer& output(const std::string& name) const;
  const ir::Graph& graph() const { return g_; }
  const plan::Plan& plan() const { return plan_; }

 private:
  const ir::Graph& g_;
  ExecutorOptions opt_;
  std::map<std::string, std::vector<double>> state_;
  std::map<std::string, std::vector<double>> inputs_;
  std::map<std::string, Buffer> outputs_;
  plan::Plan plan_;
  std::vector<double> arena_;
};

// Rounds every value of a buffer to its dtype's precision (f32/f16/bf16; ints are left as they are).
void round_to_dtype(Buffer& b);

}  // namespace mgn::cpu
