// DinoVision (the paper's case study): a convolutional decoder that reconstructs the RGB image from frozen
// DINOv3 features. The encoder is the first 3 layers of DINOv3 ViT-S/16 (dinov3::vit_graph with layers = 3
// and the final norm applied), its patch rows rearranged to [D, 14, 14]; only the decoder trains.
//
// The paper names the decoder's ops (conv, GroupNorm, SiLU, upsampling), its size (2,012,547 parameters) and,
// by difference, its cost (about 1.14 GMAC), but not its layer list; this one is ours (docs/dinov3.md):
// 2,012,451 parameters and 1.139 GMAC per image at the default widths.
//
//   conv_in  Conv2d(D, w0, 3, padding 1)                                  at g x g (14 x 14)
//   block    GroupNorm(G, w0) -> SiLU -> Conv2d(w0, w0, 3, p 1)           at g x g
//   up.{i}   GroupNorm(G, w_i) -> SiLU -> nearest x2 -> Conv2d(w_i, w_{i+1}, 3, p 1),
//            i = 0..3, at 28, 56, 112, 224
//   out      GroupNorm(G, w4) -> SiLU -> Conv2d(w4, 3, 3, p 1) -> RGB in [0, 1] (no activation)
//
// with widths w = {272, 120, 88, 16, 16}, G = 8 groups, eps 1e-5, every conv with a bias. Tensor names are
// those of a torch nn.Module with these attributes ("conv_in.weight", "block.norm.weight", "up.2.conv.bias").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/session.h"

namespace mgn::dinovision {

constexpr int64_t kEncoderLayers = 3;  // the paper runs the first 3 layers of the frozen ViT

struct DecoderConfig {
  int64_t in_channels = 384;  // the encoder's hidden size
  int64_t grid = 14;          // patches per side; the output is 16·grid pixels per side
  // conv_in and block, then after each of the 4 upsamplings
  std::vector<int64_t> widths = {272, 120, 88, 16, 16};
  int64_t groups = 8;
  double eps = 1e-5;

  int64_t image_size() const { return grid * 16; }
  // Throws mgn::Error for 5 widths not given, a width not divisible by the groups, or a non-positive size.
  void validate() const;
};

std::vector<std::pair<std::string, Shape>> decoder_parameter_shapes(const DecoderConfig& cfg);
int64_t decoder_parameter_count(const DecoderConfig& cfg);  // default: 2,012,451

// Input "features" f32 [B, D, g, g] -> output "image" [B, 3, 16g, 16g]. Mode::Train adds the input "target"
// [B, 3, 16g, 16g] and the output "loss" = mean((image - target)²). Weights start as PyTorch's Conv2d
// defaults (kaiming_uniform(a = √5) weights, uniform(±1/√fan_in) biases, seeded by name and `seed`);
// GroupNorm ones / zeros.
// `resident_rows` > 0 (Mode::Train only) keeps the training set on the device: "features" and "target" become the
// states "data.features" [R, D, g, g] and "data.targets" [R, 3, 16g, 16g] (written once with write_parameter),
// and the i32 input "rows" [B] picks the batch's rows (a gather), so a step uploads B indices instead of B
// images. Same arithmetic: the gathered rows are the values the host would have uploaded.
Graph decoder_graph(const DecoderConfig& cfg, int64_t batch, Mode mode = Mode::Infer, uint64_t seed = 0,
                    int64_t resident_rows = 0);

// The patch rows of the encoder's last_hidden_state [B, prefix + g·g, D] rearranged to [B, D, g, g].
std::vector<float> patch_grid(const std::vector<float>& hidden, int64_t batch, int64_t prefix, int64_t grid,
                              int64_t dim);

// ---- metrics (images [3, H, W] in [0, 1])
// 10·log10(1 / mse); mse is the mean over every pixel of every image (the "global" PSNR).
double psnr(double mse);
// SSIM as skimage.metrics.structural_similarity(a, b, channel_axis = 0, data_range = 1, gaussian_weights =
// True, sigma = 1.5, use_sample_covariance = False): an 11 x 11 Gaussian window (σ 1.5, truncated at 3.5σ),
// K1 = 0.01, K2 = 0.03, the mean over the pixels at least 5 from the border, averaged over the 3 channels.
double ssim(const std::vector<float>& a, const std::vector<float>& b, int64_t height, int64_t width);

}  // namespace mgn::dinovision
