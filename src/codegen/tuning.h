// Measured kernel choice for convolutions (docs/tuning.md; the GEMM side is in matmul.h): which conv nodes have
// several implicit-GEMM tiles to choose from, the key a measured choice is kept under, and the candidates.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen {

// "<op>/<dtype>/<strict|accelerated>/<input 0 dims>/<input 1 dims>/<output dims>/s<stride>/p<padding>/
// d<dilation>/g<groups>" for conv2d, conv2d_grad_input and conv2d_grad_weight while KernelOptions::conv_tile is
// auto; "" for every other node (and for an empty output).
std::string tunable_conv_key(const LowerContext& ctx);
// The tiles timed for a tunable conv: auto (the heuristics) first, then 32x32x32, 64x64x32, 128x64x16 and
// 128x128x16. Candidates whose lowering is the same program (a direct kernel, or the heuristics' own tile) are
// dropped by the tuner.
std::vector<ConvTile> conv_tune_candidates();

}  // namespace mgn::codegen
