// Training checkpoints: parameters, optimizer state and the step in one safetensors file, written atomically.
// Reading accepts a single .safetensors file or a sharded Hugging Face index (model.safetensors.index.json);
// f16/bf16 tensors widen to f32 on load. Session::save_checkpoint / load_checkpoint are built on these.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mgn/safetensors.h"

namespace mgn {

// Every tensor of a checkpoint, by name, with where it came from (for error messages).
struct TensorSet {
  std::string origin;
  std::map<std::string, StoredTensor> tensors;
  std::map<std::string, std::string> metadata;  // of the single file, or of the index
  std::map<std::string, std::string> file_of;   // tensor name -> shard path

  const StoredTensor* find(const std::string& name) const;
  // The values of tensor `name` converted to f32, checking them against the shape the graph expects;
  // throws mgn::Error naming the tensor and the file when it is missing or mis-shaped.
  std::vector<float> values_f32(const std::string& name, const Shape& expected) const;
};

// A path ending in ".json" is read as a sharded index; anything else as one safetensors file. With
// header_only the tensors keep their names, dtypes and shapes but no bytes (for listing a file of any size).
TensorSet read_tensor_set(const std::string& path, bool header_only = false);
// The sharded HF layout: {"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors"}};
// shard paths are relative to the index's folder. Every listed tensor must be in its shard, and a shard may
// not hold a tensor the map assigns elsewhere.
TensorSet read_safetensors_index(const std::string& index_path, bool header_only = false);
// The same from the index's text (`index_path` names it and locates the shards), reading the shards' headers
// only: for fuzzing the JSON without a file.
TensorSet parse_safetensors_index(const std::string& text, const std::string& index_path);

// The metadata key holding the number of completed optimizer steps.
constexpr const char* kCheckpointStepKey = "mgn.step";

// Throws mgn::Error unless `path` can be written: not a folder, its folder exists and is writable. Callers
// check before the work whose result they save (a training run), not after it.
void check_output_path(const std::string& path);

void write_checkpoint(const std::string& path, const std::vector<StoredTensor>& tensors, int64_t step,
                      std::map<std::string, std::string> metadata = {});

}  // namespace mgn
