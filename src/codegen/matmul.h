// The GEMM generator behind lower_matmul, callable on a bare shape so a benchmark can generate and time a
// kernel without building a graph.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen {

struct GemmShape {
  uint64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  // Output batch dims, and per dim the matrix-count stride of a and b (0 where that operand broadcasts).
  std::vector<uint64_t> batch, a_stride, b_stride;
};

enum class GemmVariant : uint8_t { Auto, Tiled, Small };

// Bindings: 0 = a, 1 = b (node inputs 0, 1), 2 = output.
Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant = GemmVariant::Auto);

}  // namespace mgn::codegen
