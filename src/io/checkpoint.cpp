// Checkpoint files: one atomic safetensors write holding every parameter and state tensor plus the step;
// reading resolves a single file or a sharded index into one name -> tensor set.
#include "mgn/checkpoint.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace mgn {

const StoredTensor* TensorSet::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

std::vector<float> TensorSet::values_f32(const std::string& name, const Shape& expected) const {
  const StoredTensor* t = find(name);
  auto where = [&]() {
    auto f = file_of.find(name);
    return "'" + (f == file_of.end() ? origin : f->second) + "'";
  };
  if (!t) throw Error("checkpoint " + where() + " has no tensor '" + name + "' (expected shape " + shape_str(expected) + ")");
  if (t->shape != expected)
    throw Error("checkpoint " + where() + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                ", the graph expects " + shape_str(expected));
  if (t->dtype == "BOOL") throw Error("checkpoint " + where() + ": tensor '" + name + "' is BOOL, expected a number");
  try {
    return t->to_f32();
  } catch (const Error& e) {
    throw Error("checkpoint " + where() + ": " + e.what());
  }
}

TensorSet read_tensor_set(const std::string& path, bool header_only) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("checkpoint '" + path +
                "' is a folder: give a .safetensors file or a sharded index (model.safetensors.index.json)");
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    return read_safetensors_index(path, header_only);
  SafetensorsFile f = header_only ? SafetensorsFile::read_header(path) : SafetensorsFile::read(path);
  TensorSet ts;
  ts.origin = path;
  ts.metadata = f.metadata();
  for (const std::string& name : f.names()) {
    ts.tensors[name] = f.get(name);
    ts.file_of[name] = path;
  }
  return ts;
}

void check_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) throw Error("the output path is empty");
  if (fs::is_directory(path, ec)) throw Error("output '" + path + "' is a folder, expected a file name");
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(dir, ec))
    throw Error("output '" + path + "': the folder '" + dir.string() + "' does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error("output '" + path + "': the folder '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")");
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0 && errno != ENOENT)
    throw Error("output '" + path + "' exists and is not writable (" + std::strerror(errno) + ")");
}

void write_checkpoint(const std::string& path, const std::vector<StoredTensor>& tensors, int64_t step,
                      std::map<std::string, std::string> metadata) {
  if (step < 0) throw Error("write_checkpoint '" + path + "': negative step " + std::to_string(step));
  metadata[kCheckpointStepKey] = std::to_string(step);
  metadata.emplace("format", "pt");  // what HF tools expect of a safetensors file of tensors
  write_safetensors(path, tensors, metadata);
}

}  // namespace mgn
