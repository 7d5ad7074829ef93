// Images in and out (include/mgn/image.h): libjpeg-turbo, libpng and libwebp decoding to RGB floats, the
// antialiased bilinear resize of torch's interpolate(antialias = True), center crop, normalization, PNG out.
#include "mgn/image.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <webp/decode.h>

#include "mgn/types.h"

namespace mgn::image {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

void check_size(int64_t w, int64_t h, int64_t max_pixels, const std::string& origin) {
  if (w <= 0 || h <= 0)
    throw Error("'" + origin + "': the image has no pixels (" + str(w) + "x" + str(h) + ")");
  if (w > (int64_t(1) << 20) || h > (int64_t(1) << 20) || w * h > max_pixels)
    throw Error("'" + origin + "': the image is too large (" + str(w) + "x" + str(h) + ", at most " +
                str(max_pixels) + " pixels)");
}

// Interleaved 8-bit samples with `ch` channels (1: gray, 2: gray+alpha, 3: RGB, 4: RGBA) -> planar RGB.
Image from_interleaved8(const uint8_t* p, int64_t w, int64_t h, int ch) {
  Image im{h, w, std::vector<float>(size_t(3 * w * h)), ""};
  const size_t plane = size_t(w * h);
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < 3; ++c) {
      const size_t src = ch >= 3 ? c : 0;
      im.data[c * plane + i] = float(p[i * size_t(ch) + src]) / 255.0f;
    }
  return im;
}

// ---- JPEG

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (msg_level -1) are errors here: libjpeg warns and fills with grey for a truncated file.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& origin, int64_t max_pixels) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  std::vector<uint8_t> pixels;
  int64_t w = 0, h = 0;
  std::string what;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error("'" + origin + "': cannot decode the JPEG image: " + std::string(err.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    throw Error("'" + origin + "': CMYK JPEG images are not supported (convert the file to RGB)");
  }
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = JCS_RGB;
  w = cinfo.image_width;
  h = cinfo.image_height;
  try {
    check_size(w, h, max_pixels, origin);
  } catch (...) {
    jpeg_destroy_decompress(&cinfo);
    throw;
  }
  jpeg_start_decompress(&cinfo);
  pixels.resize(size_t(w * h * 3));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels.data() + size_t(cinfo.output_scanline) * size_t(w) * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  Image im = from_interleaved8(pixels.data(), w, h, 3);
  im.format = gray ? "JPEG 8-bit gray" : "JPEG 8-bit RGB";
  return im;
}

// ---- PNG

struct PngReader {
  std::span<const uint8_t> bytes;
  size_t at = 0;
  std::string error;
};

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->bytes.size() - r->at) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, r->bytes.data() + r->at, n);
  r->at += n;
}

void png_fail(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  if (r->error.empty()) r->error = msg;
  png_longjmp(png, 1);
}

void png_warn(png_structp, png_const_charp) {}

Image decode_png(std::span<const uint8_t> bytes, const std::string& origin, int64_t max_pixels) {
  PngReader r{bytes, 0, ""};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_fail, png_warn);
  if (!png) throw Error("'" + origin + "': out of memory for the PNG decoder");
  png_infop info = png_create_info_struct(png);
  std::vector<uint8_t> pixels;
  std::vector<png_bytep> rows;
  int64_t w = 0, h = 0;
  int channels = 0, depth = 0;
  bool size_error = false;
  std::string size_message;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (size_error) throw Error(size_message);
    throw Error("'" + origin + "': cannot decode the PNG image: " + r.error);
  }
  png_set_read_fn(png, &r, png_read_mem);
  png_read_info(png, info);
  w = png_get_image_width(png, info);
  h = png_get_image_height(png, info);
  try {
    check_size(w, h, max_pixels, origin);
  } catch (const Error& e) {
    size_error = true;
    size_message = e.what();
    png_longjmp(png, 1);
  }
  const int type = png_get_color_type(png, info);
  depth = png_get_bit_depth(png, info);
  const bool alpha = (type & PNG_COLOR_MASK_ALPHA) != 0;
  const bool gray = type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA;
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (gray && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_swap(png);  // host order (little-endian) for the 16-bit reads below
  png_read_update_info(png, info);
  channels = png_get_channels(png, info);
  const int out_depth = png_get_bit_depth(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  pixels.resize(rowbytes * size_t(h));
  rows.resize(size_t(h));
  for (int64_t y = 0; y < h; ++y) rows[size_t(y)] = pixels.data() + size_t(y) * rowbytes;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);

  Image im;
  if (out_depth == 16) {
    im = Image{h, w, std::vector<float>(size_t(3 * w * h)), ""};
    const size_t plane = size_t(w * h);
    for (size_t i = 0; i < plane; ++i)
      for (size_t c = 0; c < 3; ++c) {
        const size_t src = channels >= 3 ? c : 0;
        uint16_t v;
        std::memcpy(&v, pixels.data() + (i * size_t(channels) + src) * 2, 2);
        im.data[c * plane + i] = float(double(v) / 65535.0);
      }
  } else {
    im = from_interleaved8(pixels.data(), w, h, channels);
  }
  im.format = "PNG " + std::to_string(depth) + "-bit " +
              (type == PNG_COLOR_TYPE_PALETTE ? std::string("palette")
               : gray                         ? std::string("gray")
                                              : std::string("RGB")) +
              (alpha ? "+alpha" : "");
  return im;
}

// ---- WebP

Image decode_webp(std::span<const uint8_t> bytes, const std::string& origin, int64_t max_pixels) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(bytes.data(), bytes.size(), &f) != VP8_STATUS_OK)
    throw Error("'" + origin + "': cannot decode the WebP image: not a valid WebP header");
  check_size(f.width, f.height, max_pixels, origin);
  int w = 0, h = 0;
  uint8_t* rgb = WebPDecodeRGB(bytes.data(), bytes.size(), &w, &h);
  if (!rgb) throw Error("'" + origin + "': cannot decode the WebP image (corrupt or truncated data)");
  Image im = from_interleaved8(rgb, w, h, 3);
  WebPFree(rgb);
  im.format =
      std::string("WebP ") + (f.format == 2 ? "lossless" : "lossy") + (f.has_alpha ? " RGB+alpha" : " RGB");
  return im;
}

// ---- resize: torch's _upsample_bilinear2d_aa weights (PIL's ImagingResample with the triangle filter).

struct Taps {
  std::vector<int64_t> start, count;
  std::vector<double> weights;  // count[i] values from i·stride
  int64_t stride = 0;
};

Taps taps(int64_t in, int64_t out) {
  const double scale = double(in) / double(out);
  const double support = scale >= 1.0 ? scale : 1.0;  // interp_size/2 = 1 for bilinear
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  Taps t;
  t.stride = int64_t(std::ceil(support)) * 2 + 1;
  t.start.resize(size_t(out));
  t.count.resize(size_t(out));
  t.weights.assign(size_t(out * t.stride), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (double(i) + 0.5);
    const int64_t xmin = std::max<int64_t>(int64_t(center - support + 0.5), 0);
    const int64_t xsize = std::min<int64_t>(int64_t(center + support + 0.5), in) - xmin;
    double total = 0;
    for (int64_t j = 0; j < xsize; ++j) {
      const double x = std::fabs((double(j + xmin) - center + 0.5) * invscale);
      const double wgt = x < 1.0 ? 1.0 - x : 0.0;
      t.weights[size_t(i * t.stride + j)] = wgt;
      total += wgt;
    }
    if (total != 0)
      for (int64_t j = 0; j < xsize; ++j) t.weights[size_t(i * t.stride + j)] /= total;
    t.start[size_t(i)] = xmin;
    t.count[size_t(i)] = xsize;
  }
  return t;
}

bool starts_with(std::span<const uint8_t> b, const char* magic, size_t n, size_t at = 0) {
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

}  // namespace

Image decode(std::span<const uint8_t> bytes, const std::string& origin, int64_t max_pixels) {
  if (starts_with(bytes, "\xFF\xD8\xFF", 3)) return decode_jpeg(bytes, origin, max_pixels);
  if (starts_with(bytes, "\x89PNG\r\n\x1a\n", 8)) return decode_png(bytes, origin, max_pixels);
  if (starts_with(bytes, "RIFF", 4) && starts_with(bytes, "WEBP", 4, 8))
    return decode_webp(bytes, origin, max_pixels);
  if (bytes.empty()) throw Error("'" + origin + "': the file is empty, not an image");
  throw Error("'" + origin + "' is not a JPEG, PNG or WebP image");
}

Image read(const std::string& path, int64_t max_pixels) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open image '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error("cannot read image '" + path + "'");
  return decode(bytes, path, max_pixels);
}

Image resize(const Image& im, int64_t out_h, int64_t out_w) {
  if (out_h <= 0 || out_w <= 0)
    throw Error("image::resize: the size must be positive, got " + str(out_h) + "x" + str(out_w));
  if (size_t(3 * im.height * im.width) != im.data.size() || im.height <= 0 || im.width <= 0)
    throw Error("image::resize: the image holds " + str(int64_t(im.data.size())) + " values, not 3x" +
                str(im.height) + "x" + str(im.width));
  const int64_t H = im.height, W = im.width;
  const Taps th = taps(H, out_h), tw = taps(W, out_w);
  // Horizontal then vertical, in double.
  std::vector<double> mid(size_t(3 * H * out_w));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < H; ++y) {
      const float* row = im.data.data() + (c * H + y) * W;
      for (int64_t x = 0; x < out_w; ++x) {
        double s = 0;
        const double* wt = tw.weights.data() + x * tw.stride;
        for (int64_t j = 0; j < tw.count[size_t(x)]; ++j) s += wt[j] * row[tw.start[size_t(x)] + j];
        mid[size_t((c * H + y) * out_w + x)] = s;
      }
    }
  Image out{out_h, out_w, std::vector<float>(size_t(3 * out_h * out_w)), im.format};
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < out_h; ++y) {
      const double* wt = th.weights.data() + y * th.stride;
      for (int64_t x = 0; x < out_w; ++x) {
        double s = 0;
        for (int64_t j = 0; j < th.count[size_t(y)]; ++j)
          s += wt[j] * mid[size_t((c * H + th.start[size_t(y)] + j) * out_w + x)];
        out.data[size_t((c * out_h + y) * out_w + x)] = float(s);
      }
    }
  return out;
}

Image resize_shorter(const Image& im, int64_t size) {
  if (size <= 0) throw Error("image::resize_shorter: the size must be positive, got " + str(size));
  const int64_t shorter = std::min(im.height, im.width), longer = std::max(im.height, im.width);
  const int64_t other = int64_t(double(size) * double(longer) / double(shorter));  // torchvision truncates
  return im.height <= im.width ? resize(im, size, other) : resize(im, other, size);
}

Image crop(const Image& im, int64_t top, int64_t left, int64_t h, int64_t w) {
  if (top < 0 || left < 0 || h <= 0 || w <= 0 || top + h > im.height || left + w > im.width)
    throw Error("image::crop: the window " + str(h) + "x" + str(w) + " at (" + str(top) + ", " + str(left) +
                ") is outside the " + str(im.height) + "x" + str(im.width) + " image");
  Image out{h, w, std::vector<float>(size_t(3 * h * w)), im.format};
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < h; ++y)
      std::copy_n(im.data.begin() + (c * im.height + top + y) * im.width + left, w,
                  out.data.begin() + (c * h + y) * w);
  return out;
}

Image center_crop(const Image& im, int64_t h, int64_t w) {
  auto half_even = [](int64_t twice) {  // round(twice / 2) with ties to even, twice >= 0
    const int64_t q = twice / 2;
    return (twice % 2 == 1 && q % 2 == 1) ? q + 1 : q;
  };
  if (h > im.height || w > im.width)
    throw Error("image::center_crop: the crop " + str(h) + "x" + str(w) + " is larger than the " +
                str(im.height) + "x" + str(im.width) + " image");
  return crop(im, half_even(im.height - h), half_even(im.width - w), h, w);
}

Image flip_horizontal(const Image& im) {
  Image out = im;
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < im.height; ++y) {
      auto row = out.data.begin() + (c * im.height + y) * im.width;
      std::reverse(row, row + im.width);
    }
  return out;
}

std::vector<float> normalize(const Image& im, const PreprocessOptions& opt) {
  std::vector<float> out(im.data.size());
  const size_t plane = size_t(im.height * im.width);
  for (size_t c = 0; c < 3; ++c)
    for (size_t i = 0; i < plane; ++i)
      out[c * plane + i] = (im.data[c * plane + i] - opt.mean[c]) / opt.std[c];
  return out;
}

std::vector<float> preprocess(const Image& im, const PreprocessOptions& opt) {
  Image x = opt.resize > 0 ? resize_shorter(im, opt.resize) : im;
  if (opt.crop > 0) x = center_crop(x, opt.crop, opt.crop);
  return opt.normalize ? normalize(x, opt) : x.data;
}

void write_png(const std::string& path, const Image& im) {
  if (im.height <= 0 || im.width <= 0 || im.data.size() != size_t(3 * im.height * im.width))
    throw Error("write_png '" + path + "': the image holds " + str(int64_t(im.data.size())) +
                " values, not 3x" + str(im.height) + "x" + str(im.width));
  const size_t plane = size_t(im.height * im.width);
  std::vector<uint8_t> rgb(plane * 3);
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < 3; ++c) {
      const float v = std::clamp(im.data[c * plane + i], 0.0f, 1.0f);
      rgb[i * 3 + c] = uint8_t(std::lround(v * 255.0f));
    }
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(im.width);
  img.height = png_uint_32(im.height);
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, rgb.data(), 0, nullptr))
    throw Error("write_png '" + path + "': " + std::string(img.message));
  std::vector<uint8_t> bytes(size);
  if (!png_image_write_to_memory(&img, bytes.data(), &size, 0, rgb.data(), 0, nullptr))
    throw Error("write_png '" + path + "': " + std::string(img.message));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("cannot create '" + tmp + "': " + std::strerror(errno));
  size_t done = 0;
  bool ok = true;
  while (ok && done < size) {
    ssize_t w = ::write(fd, bytes.data() + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      ok = false;
    else
      done += size_t(w);
  }
  ok = ok && ::fsync(fd) == 0;
  int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write PNG file '" + path + "': " + std::strerror(err));
  }
}

}  // namespace mgn::image
