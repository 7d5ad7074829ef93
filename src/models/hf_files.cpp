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


}  // namespace mgn::models
