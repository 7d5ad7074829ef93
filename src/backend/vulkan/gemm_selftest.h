// Device self-test of the f16 cooperative-matrix GEMM: run once per device and process before any session
// may lower an Accelerated matmul to it (codegen::coopmat_status() gates the path).
#pragma once

#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "codegen/kernel.h"

namespace mgn::codegen {
class ShaderCompiler;
}

namespace mgn::vk {

// Picks the device's f16 x f16 -> f32 subgroup multiply shape
// (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV), runs three products through the generated kernel
// (direct and edge-staged stores, both transposes, a batch with broadcasting) and compares them with a CPU
// reference on the same f16-rounded inputs. Sets codegen::set_coopmat_status and returns whether the path is
// usable. The first call per device does the work (~0.1-0.5 s, mostly pipeline compilation); later calls
// return the cached answer. A device without VK_NV_cooperative_matrix returns false silently; a failure on a
// device that has it is reported on stderr
// ("mgn: f16 cooperative-matrix GEMM disabled on <device>: <why>"). MGN_GEMM_F16=0 skips the test (off).
bool gemm_coopmat_self_test(Context& ctx);

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

// The note of the last test on this device ("" before it ran): what passed, or why it is off.
std::string gemm_coopmat_self_test_note(const Context& ctx);

}  // namespace mgn::vk
