// Shared test helpers: relative errors and deterministic random data.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mgn/options.h"
#include "plan/plan.h"

namespace mgn::test {

// The device of every Vulkan test: the validation layer on (any message fails the test) unless the
// environment says MGN_VALIDATION=0 (a GPU host without the layer package). Tests pass options; they never
// set the environment.
DeviceOptions device_options();

// A static plan in which every tensor has memory of its own (no sharing, no in-place results or assigns,
// no sinking): the reference the plan tests compare an aliasing plan with, bitwise.
plan::PlanOptions separate_memory_plan();

// ||a - b|| / ||b||; 0 when both are zero. Sizes must match.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b);
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b);
std::vector<double> random_normal(size_t n, uint64_t seed, double scale = 1.0);
std::vector<double> random_uniform(size_t n, uint64_t seed, double lo, double hi);

// One input of an attention test graph, drawn from `rng`: n uniform values in [-1, 1), times `scale` (q's
// peakiness). A mask with `inf_rows` (rows of `cols` keys) then gets -inf on every third row, starting at
// row 1, and on a random quarter of the other elements.
std::vector<float> attention_input(std::mt19937& rng, size_t n, float scale, bool inf_rows = false,
                                   int64_t cols = 1);

}  // namespace mgn::test

#include <functional>
#include <map>

#include "mgn/safetensors.h"

namespace mgn::test {

// Runs `/usr/bin/python3 <MGN_SOURCE_DIR>/<script> in.safetensors out.safetensors` in a fresh temporary
// directory with `inputs` written to in.safetensors, and returns the tensors of out.safetensors by name.
// Throws mgn::Error with the script's output when it fails. This is how tests reach PyTorch.
std::map<std::string, StoredTensor> run_torch(const std::string& script,
                                              const std::vector<StoredTensor>& inputs);

// The message of the mgn::Error that f throws; "" when it throws none (other exceptions propagate).
std::string error_of(const std::function<void()>& f);

// A fresh empty directory under the system temp dir (removed by the caller if it wants).
std::string make_temp_dir(const std::string& tag);

// The whole file as bytes; "" when it cannot be read.
std::string read_bytes(const std::string& path);

// The directory `/usr/bin/python3 <MGN_SOURCE_DIR>/<script> DIR` fills (models, reference tensors), made once
// and cached under the temp dir, keyed by the contents of the script and of `also_hashed` (files it imports,
// paths relative to MGN_SOURCE_DIR): ctest runs every test in its own process. The directory is filled under
// another name and renamed into place when complete, so a concurrent or interrupted run never leaves half a
// result. Throws mgn::Error with the script's output when it fails.
std::string generated_dir(const std::string& tag, const std::string& script,
                          const std::vector<std::string>& also_hashed = {});

}  // namespace mgn::test
