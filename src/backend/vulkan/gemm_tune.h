// Measured kernel choice (docs/tuning.md): for every f32 SIMT GEMM shape of a graph, the candidate kernels
// (codegen::gemm_tune_candidates: block tiles and split-K counts valid for the shape), and for every
// convolution the implicit-GEMM tiles (codegen::conv_tune_candidates), are timed on the device on scratch
// buffers and the fastest is used for the session's lowering (CodegenOptions::gemm_tuned, conv_tuned). Every
// candidate is a correct kernel of the same product; the choice changes speed, and (split K) the order in
// which partial sums are added, never the product computed.
//
// The choices are kept per device and driver in `<cache_dir>/tuning/<device key>.txt` (vk::device_key: vendor,
// device, API version, name, driver name and info, pipeline-cache UUID), a versioned text file with a checksum,
// written atomically (support/atomic_file.h). A damaged, truncated or other-device file is ignored (never
// trusted) and rewritten by the next compile that measures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "codegen/kernel.h"
#include "ir/graph.h"

namespace mgn::codegen {
class ShaderCompiler;
}

namespace mgn::vk {

class Allocator;
class Transfer;
class PipelineCache;

// One shape's measured choice: the tile used and every candidate's time (ms per call, GPU timestamps where the
// device has them, else host wall time around the fence). Tiles in their text forms: gemm_tile_str (a fully
// specified SIMT tile) for kind "gemm", conv_tile_str ("auto": the heuristics) for kind "conv".
struct GemmTuneEntry {
  std::string kind = "gemm";
  std::string tile;
  double ms = 0;
  std::vector<std::pair<std::string, double>> candidates;
};

enum class TuneFile : uint8_t { Off, Miss, Hit, Damaged };
const char* tune_file_name(TuneFile f);  // "off", "miss", "hit", "damaged"

// `<cache_dir>/tuning/<key_hex>.txt`; the key of a device is gemm_tuning_key(info).
std::string gemm_tuning_key(const DeviceInfo& device);
std::string gemm_tuning_path(const std::string& cache_dir, const std::string& key_hex);
// Reads the file into `out` (cleared first). Miss: no file; Damaged: a file that fails any check (magic and
// version, key, entry syntax, checksum): `out` stays empty.
TuneFile load_gemm_tuning(const std::string& path, const std::string& key_hex, std::map<std::string, GemmTuneEntry>* out);
// Writes every entry atomically; returns "" or the error (best effort: a failure costs a later compile the
// measurement).
std::string store_gemm_tuning(const std::string& path, const std::string& key_hex, const DeviceInfo& device,
                              const std::map<std::string, GemmTuneEntry>& entries);

struct GemmTuneResult {
  std::map<std::string, GemmTile> choices;       // tunable_gemm_key -> tile (CodegenOptions::gemm_tuned)
  std::map<std::string, ConvTile> conv_choices;  // tunable_conv_key -> tile (CodegenOptions::conv_tuned)
  size_t measured = 0;  // shapes decided now (timed, or a conv whose candidates are all one program)
  size_t cached = 0;    // shapes whose choice came from the file
  size_t timed = 0;     // candidate kernels timed
  TuneFile file = TuneFile::Off;
  double ms = 0;
};

// The choices for the tunable matmuls and convolutions of `g` (mode Use: from the file only; Measure: the missing ones timed and
// the file rewritten with them). `codegen` and `caps` are the session's, so the keys are the ones its lowering
// asks for.
GemmTuneResult tune_gemms(Context& ctx, Allocator& alloc, Transfer& transfer, PipelineCache& pipelines,
                          codegen::ShaderCompiler& compiler, const ir::Graph& g, const codegen::DeviceCaps& caps,
                          const codegen::CodegenOptions& codegen, TuneMode mode, const std::string& cache_dir);

}  // namespace mgn::vk
