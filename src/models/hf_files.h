// What the Hugging Face model builders (llama, whisper, dinov3) share: reading a config file, finding the
// weights file of a model directory. Private to src/models (the paper's sine init is Init::paper_sine).
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

}  // namespace mgn::models
