// Oracle harness (C++ side). Each case file written by tests/oracle/gen_oracle.py names a builder key
// ("op" in its metadata); a builder registered here under that key rebuilds the same computation with the
// mgn builder API from the case's inputs and attributes. Backends (CPU executor, Vulkan) then run the graph
// and compare with PyTorch's result (and gradients, through autodiff).
//
//   MGN_ORACLE_BUILDER(relu) { return mgn::relu(c.in[0]); }
//   MGN_ORACLE_BUILDER_NAMED(linear_bias, "linear.bias") { ... }   // keys that are not identifiers
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mgn/graph.h"
#include "mgn/safetensors.h"

namespace mgn::oracle {

struct Call {
  mgn::Graph& g;
  std::vector<mgn::Tensor> in;  // the case's inputs in.0, in.1, ... as graph inputs "in.0", ...
  const nlohmann::json& attrs;  // the case's attributes (the Python Case(attrs=...))

  // Attribute helpers with a clear error for a missing one.
  int64_t i(const char* k) const;
  double f(const char* k) const;
  std::vector<int64_t> ints(const char* k) const;
  bool has(const char* k) const { return attrs.contains(k); }
};

using Builder = std::function<mgn::Tensor(Call&)>;

bool register_builder(const std::string& key, Builder b);
const Builder* find_builder(const std::string& key);
std::vector<std::string> builder_keys();

// One case file, loaded: the graph (inputs "in.<i>", output "out"), the input values and PyTorch's
// results. Gradients (grad.<i>: d sum(out * cot) / d in.<i>) are present for differentiable cases.
struct Case {
  std::string name, key, path;
  double tol = 1e-5, grad_tol = 1e-4;
  std::unique_ptr<mgn::Graph> graph;
  mgn::Tensor out;
  std::vector<mgn::Tensor> inputs;
  std::vector<mgn::StoredTensor> input_values;  // in.<i>
  mgn::StoredTensor expected;                   // out
  std::optional<mgn::StoredTensor> cot;         // cot
  std::map<int, mgn::StoredTensor> grads;       // grad.<i>
};

// Every case file under the oracle directory (sorted by name). Throws if the directory is missing.
std::vector<std::string> case_files(const std::string& dir);
// Loads a case and builds its graph; throws mgn::Error for an unknown builder key or a bad file.
Case load_case(const std::string& path);

}  // namespace mgn::oracle

#define MGN_ORACLE_CAT2(a, b) a##b
#define MGN_ORACLE_CAT(a, b) MGN_ORACLE_CAT2(a, b)
#define MGN_ORACLE_BUILDER_NAMED(id, key)                                                      \
  static mgn::Tensor MGN_ORACLE_CAT(oracle_build_, id)(mgn::oracle::Call & c);                 \
  [[maybe_unused]] static const bool MGN_ORACLE_CAT(oracle_reg_, id) =                         \
      mgn::oracle::register_builder(key, &MGN_ORACLE_CAT(oracle_build_, id));                  \
  static mgn::Tensor MGN_ORACLE_CAT(oracle_build_, id)([[maybe_unused]] mgn::oracle::Call & c)
#define MGN_ORACLE_BUILDER(id) MGN_ORACLE_BUILDER_NAMED(id, #id)
