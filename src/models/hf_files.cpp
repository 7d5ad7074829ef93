// Shared by the Hugging Face model builders (src/models/hf_files.h).
#include "hf_files.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mgn::models {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + what + " '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string weights_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  const fs::path index = fs::path(path) / "model.safetensors.index.json", single = fs::path(path) / "model.safetensors";
  if (fs::exists(index)) return index.string();
  if (fs::exists(single)) return single.string();
  throw Error("model directory '" + path + "' has neither model.safetensors nor model.safetensors.index.json");
}

std::vector<float> paper_sine_values(const std::string& name, const Shape& shape) {
  uint32_t h = 0;
  for (unsigned char ch : name) h = h * 31u + ch;
  const double seed = double(h % 10000u);
  const int64_t n = numel(shape);
  std::vector<float> gen(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) gen[size_t(j)] = float(std::sin(0.01 * double(j) + seed) * 0.02);
  if (shape.size() != 2) return gen;
  const int64_t out = shape[0], in = shape[1];
  std::vector<float> t(static_cast<size_t>(n));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) t[size_t(o * in + i)] = gen[size_t(i * out + o)];
  return t;
}

}  // namespace mgn::models
