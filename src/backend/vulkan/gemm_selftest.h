// Device self-test of the f16 cooperative-matrix GEMM: run once per device (and tile option) before any
// session may lower an Accelerated matmul to it (DeviceCaps::coopmat_f16_verified gates the path).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "codegen/kernel.h"

namespace mgn::codegen {
class ShaderCompiler;
}

namespace mgn::vk {

// The verdict of the f16 cooperative-matrix GEMM on this device with `tile` (KernelOptions::f16_tile; auto
// when unset). Picks the device's f16 x f16 -> f32 subgroup multiply shape
// (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV), runs three products through the generated kernel
// (direct and edge-staged stores, both transposes, a batch with broadcasting) and compares them with a CPU
// reference on the same f16-rounded inputs. The first call per device and tile does the work (~0.1-0.5 s,
// mostly pipeline compilation) and the Context keeps the verdict; later calls return it. A device without
// VK_NV_cooperative_matrix gets a negative verdict silently; a failure on a device that has it is reported
// on stderr ("mgn: f16 cooperative-matrix GEMM disabled on <device>: <why>").
// Where the compiler has a cache folder, a verdict the test reached (not one it failed to run, nor a device
// without the extension) is kept in `<cache>/selftest/` under device_build_key (this build, the device and
// driver, the tile), so later processes skip the test (~0.3 s on an H100); a damaged file is ignored and
// rewritten.
CoopMatVerdict coopmat_verdict(Context& ctx, const GemmTile& tile, codegen::ShaderCompiler& compiler);

// The persisted verdict's file (coopmat_verdict): `cache_dir/selftest/<key>.txt`. load gives nothing for a
// missing, damaged or other-key file; store is best effort (atomic; a failure only costs the next process
// the test).
std::string coopmat_verdict_path(const std::string& cache_dir, const std::string& key_hex);
std::optional<CoopMatVerdict> load_coopmat_verdict(const std::string& cache_dir, const std::string& key_hex);
void store_coopmat_verdict(const std::string& cache_dir, const std::string& key_hex, const CoopMatVerdict& v);

class Allocator;
class Transfer;
class PipelineCache;

// Runs the kernels of a two-input GEMM lowering (inputs 0 = a and 1 = b, the output of n_out floats,
// scratch buffers as the lowering asks, a barrier between kernels) in one submission; returns the output.
// For the self-test and for tests that check a lowering without a session.
std::vector<float> run_gemm_lowering(Context& ctx, Allocator& alloc, Transfer& transfer,
                                     PipelineCache& pipelines, codegen::ShaderCompiler& compiler,
                                     const codegen::Lowering& low, const std::vector<float>& a,
                                     const std::vector<float>& b, size_t n_out);

}  // namespace mgn::vk
