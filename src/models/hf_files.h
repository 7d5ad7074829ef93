// What the Hugging Face model builders (llama, whisper, dinov3) share: reading a config file, finding the
// weights file of a model directory, and the paper's deterministic init. Private to src/models.
#pragma once

#include <string>
#include <vector>

#include "mgn/types.h"

namespace mgn::models {

// The whole file as text; throws mgn::Error "cannot open <what> '<path>'".
std::string read_text_file(const std::string& path, const std::string& what);

// A model directory's weights: model.safetensors.index.json, else model.safetensors; any other path as given.
// Throws mgn::Error naming the directory when it has neither.
std::string weights_file(const std::string& path);

// The paper's name-seeded sine values (workload-specs.md, "Inferena deterministic init"): t[j] =
// 0.02·sin(0.01·j + seed(name)), seed(name) = (h·31 + byte mod 2^32 over the name) mod 10000; 2-D weights are
// generated [in, out] and stored [out, in].
std::vector<float> paper_sine_values(const std::string& name, const Shape& shape);

}  // namespace mgn::models
