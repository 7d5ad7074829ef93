// Images in and out: JPEG (libjpeg-turbo), PNG (libpng) and WebP (libwebp) decoded to RGB floats, the
// preprocessing of torchvision's Resize(256) / CenterCrop(224) / Normalize(ImageNet) on float tensors, and
// PNG out (libpng):
//
//   mgn::image::Image im = mgn::image::read("photo.jpg");              // [3, H, W] in [0, 1]
//   std::vector<float> px = mgn::image::preprocess(im);                // [3, 224, 224], ImageNet-normalized
//
// Conversions (as PIL's convert("RGB") and torchvision's read_image(mode = RGB) do): grayscale is replicated
// to three channels, palette PNGs are expanded, an alpha channel is dropped (the colour values are used as
// stored, not composited), 16-bit PNG samples are divided by 65535 (full precision, not cut to 8 bits).
// CMYK JPEGs are refused. The format is recognised by content, not by the file name.
//
// The resize is bilinear with antialiasing (torch.nn.functional.interpolate(mode = "bilinear",
// antialias = True, align_corners = False), which torchvision.transforms.Resize uses on tensors): output
// pixel i of a scale s = in/out samples the triangle filter of half-width max(s, 1) centred on s·(i + ½),
// normalised to sum 1.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mgn::image {

struct Image {
  int64_t height = 0, width = 0;
  std::vector<float> data;  // RGB planar [3, height, width]
  std::string format;       // of the source, e.g. "JPEG 8-bit RGB", "PNG 16-bit gray+alpha"
};

// Throws mgn::Error naming the file when it cannot be opened, is not a JPEG, PNG or WebP file, cannot be
// decoded, is truncated (libjpeg's "premature end" is an error here, not a grey fill), is a CMYK JPEG, or is
// larger than max_pixels (a hostile header).
Image read(const std::string& path, int64_t max_pixels = int64_t(1) << 28);
Image decode(std::span<const uint8_t> bytes, const std::string& origin,
             int64_t max_pixels = int64_t(1) << 28);

// Bilinear with antialiasing to exactly out_h x out_w (see above).
Image resize(const Image& im, int64_t out_h, int64_t out_w);
// torchvision Resize(size) with an int: the shorter edge becomes `size`, the longer int(size·long/short).
Image resize_shorter(const Image& im, int64_t size);
Image crop(const Image& im, int64_t top, int64_t left, int64_t h, int64_t w);  // throws if out of bounds
// torchvision CenterCrop: top = round((H - h) / 2), left = round((W - w) / 2), Python's round (half to even).
Image center_crop(const Image& im, int64_t h, int64_t w);
Image flip_horizontal(const Image& im);

struct PreprocessOptions {
  int64_t resize = 256;  // shorter edge after resizing; 0: no resize
  int64_t crop = 224;    // center crop size; 0: no crop
  bool normalize = true;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // ImageNet
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};
// Resize -> center crop -> (x - mean) / std: [3, crop, crop] (or the resized / original size when those are
// 0).
std::vector<float> preprocess(const Image& im, const PreprocessOptions& opt = {});
std::vector<float> normalize(const Image& im, const PreprocessOptions& opt = {});

// 8-bit RGB PNG of `im` (values clamped to [0, 1], rounded to the nearest of 255 steps), written atomically
// (a temporary file renamed into place). Throws naming the file.
void write_png(const std::string& path, const Image& im);

}  // namespace mgn::image
