// libFuzzer target for sharded checkpoints (model.safetensors.index.json): the index text is fuzzed; the
// folder beside it holds one real shard, so mutations that keep its name reach the tensor-to-shard checks.
#include <unistd.h>

#include <filesystem>

#include "fuzz_common.h"
#include "mgn/checkpoint.h"

namespace {

std::string index_path;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto dir = std::filesystem::temp_directory_path() / ("mgn_index_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  mgn::write_safetensors((dir / "model-00001-of-00001.safetensors").string(),
                         {mgn::StoredTensor::from_f32("a", {2}, {1, 2}), mgn::StoredTensor::from_f32("b", {1}, {3})});
  index_path = (dir / "model.safetensors.index.json").string();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mgn::fuzz::expect_clean([&] { (void)mgn::parse_safetensors_index(mgn::fuzz::text(data, size), index_path); });
  return 0;
}
