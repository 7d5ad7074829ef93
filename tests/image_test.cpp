// Images in and out (include/mgn/image.h) against PIL's decoders and torchvision's preprocessing
// (tests/ref/image_ref.py) on Debian's photographs (opencv-doc, python3-skimage), the converted formats
// (gray, palette, alpha, 16-bit PNG, gray JPEG, WebP), refusals of damaged files, and the PNG writer.
#include "mgn/image.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "mgn/types.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

const std::string kOpenCv = "/usr/share/doc/opencv-doc/examples/data/";
const std::string kSkimage = "/usr/lib/python3/dist-packages/skimage/data/";

StoredTensor codes(const std::string& name, const std::string& s) {
  std::vector<double> v(s.begin(), s.end());
  return StoredTensor::from_f64(name, {int64_t(v.size())}, v);
}

std::string text(const StoredTensor& t) {
  std::string s;
  for (double v : t.to_f64()) s.push_back(char(v));
  return s;
}

double max_abs(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(n));
}

}  // namespace

// Real photographs, JPEG and PNG, of several aspect ratios: decoding equals PIL's exactly (same libraries,
// same settings), and Resize(256) / CenterCrop(224) / Normalize is within 1e-3 of torchvision's per pixel.
TEST(Image, PreprocessingMatchesTorchvisionOnPhotographs) {
  const std::vector<std::string> photos = {kOpenCv + "baboon.jpg", kOpenCv + "fruits.jpg",
                                           kSkimage + "chelsea.png", kSkimage + "coffee.png",
                                           kSkimage + "rocket.jpg"};
  for (const auto& p : photos)
    ASSERT_TRUE(std::filesystem::exists(p)) << p << " (scripts/setup-debian.sh installs it)";
  const std::string dir = test::make_temp_dir("image_ref");
  std::string joined;
  for (const auto& p : photos) joined += p + "\n";
  auto ref = test::run_torch("tests/ref/image_ref.py", {codes("dir", dir), codes("paths", joined)});
  for (size_t i = 0; i < photos.size(); ++i) {
    image::Image im = image::read(photos[i]);
    const StoredTensor& raw = ref.at("raw." + std::to_string(i));
    ASSERT_EQ(raw.shape, (Shape{3, im.height, im.width})) << photos[i];
    EXPECT_LT(max_abs(im.data, raw.to_f64()), 1e-6) << photos[i] << " " << im.format;
    std::vector<float> pre = image::preprocess(im);
    ASSERT_EQ(pre.size(), size_t(3 * 224 * 224));
    const double err = max_abs(pre, ref.at("pre." + std::to_string(i)).to_f64());
    EXPECT_LT(err, 1e-3) << photos[i];
    std::printf("%s: %s %lldx%lld, preprocessing max abs vs torchvision %.2e\n", photos[i].c_str(),
                im.format.c_str(), (long long)im.width, (long long)im.height, err);
  }

  // Converted formats: every one decodes to what PIL's convert("RGB") gives (16-bit: value / 65535).
  std::string names = text(ref.at("made_names"));
  size_t k = 0, start = 0;
  while (start < names.size()) {
    size_t end = names.find('\n', start);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(start, end - start), path = dir + "/" + name;
    image::Image im = image::read(path);
    const StoredTensor& want = ref.at("made." + std::to_string(k));
    ASSERT_EQ(want.shape, (Shape{3, im.height, im.width})) << name;
    EXPECT_LT(max_abs(im.data, want.to_f64()), 1e-6) << name << " " << im.format;
    start = end + 1;
    ++k;
  }
  EXPECT_EQ(k, 8u);
  // A WebP file cut short, and a 16-bit PNG cut short, are refused naming the file.
  for (const char* name : {"lossy.webp", "gray16.png"}) {
    std::vector<uint8_t> b = bytes_of(dir + "/" + name);
    const std::string cut = dir + "/cut_" + name;
    write_bytes(cut, b, b.size() * 2 / 3);
    const std::string e = error_of([&] { image::read(cut); });
    EXPECT_NE(e.find(cut), std::string::npos) << e;
    EXPECT_NE(e.find("cannot decode"), std::string::npos) << e;
  }
  std::filesystem::remove_all(dir);
}

// Damaged input: every refusal names the file.
TEST(Image, DamagedFilesAreRefusedNamingTheFile) {
  const std::string dir = test::make_temp_dir("image_bad");
  for (const std::string& src : {kOpenCv + "baboon.jpg", kSkimage + "chelsea.png"}) {
    std::vector<uint8_t> b = bytes_of(src);
    ASSERT_GT(b.size(), 1000u) << src;
    const std::string cut = dir + "/cut" + std::filesystem::path(src).extension().string();
    write_bytes(cut, b, b.size() / 2);
    std::string e = error_of([&] { image::read(cut); });
    EXPECT_NE(e.find(cut), std::string::npos) << e;
    EXPECT_NE(e.find("cannot decode"), std::string::npos) << e;
    // The header only.
    write_bytes(cut, b, 40);
    e = error_of([&] { image::read(cut); });
    EXPECT_NE(e.find(cut), std::string::npos) << e;
  }
  const std::string junk = dir + "/junk.jpg";
  write_bytes(junk, std::vector<uint8_t>(100, 7), 100);
  EXPECT_NE(error_of([&] { image::read(junk); }).find("is not a JPEG, PNG or WebP image"), std::string::npos);
  write_bytes(junk, {}, 0);
  EXPECT_NE(error_of([&] { image::read(junk); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { image::read(dir + "/missing.png"); }).find("missing.png"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// PNG out: written atomically, read back to within half a step of 255.
TEST(Image, WritesPngThatReadsBack) {
  const std::string dir = test::make_temp_dir("image_png");
  image::Image im = image::read(kSkimage + "coffee.png");
  im = image::center_crop(image::resize_shorter(im, 40), 40, 48);
  im.data[0] = -0.5f;  // clamped
  im.data[1] = 1.5f;
  image::write_png(dir + "/out.png", im);
  image::Image back = image::read(dir + "/out.png");
  ASSERT_EQ(back.height, 40);
  ASSERT_EQ(back.width, 48);
  EXPECT_EQ(back.data[0], 0.0f);
  EXPECT_EQ(back.data[1], 1.0f);
  double m = 0;
  for (size_t i = 2; i < im.data.size(); ++i) m = std::max(m, std::fabs(double(back.data[i]) - im.data[i]));
  EXPECT_LE(m, 0.5 / 255 + 1e-6);
  EXPECT_FALSE(std::filesystem::exists(dir + "/out.png.tmp"));
  EXPECT_NE(error_of([&] { image::write_png(dir + "/no/such/dir.png", im); }).find("no/such"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Image, ResizeCropFlipClosedForms) {
  // A constant image stays constant at any scale (the taps are normalised).
  image::Image c{5, 7, std::vector<float>(3 * 5 * 7, 0.25f), ""};
  for (auto [h, w] : {std::pair<int64_t, int64_t>{3, 2}, {11, 13}, {5, 7}}) {
    image::Image r = image::resize(c, h, w);
    for (float v : r.data) EXPECT_NEAR(v, 0.25f, 1e-6);
  }
  // Same size: the identity.
  image::Image ramp{4, 6, {}, ""};
  for (int i = 0; i < 72; ++i) ramp.data.push_back(float(i) / 72.0f);
  EXPECT_EQ(image::resize(ramp, 4, 6).data, ramp.data);
  // Center crop uses Python's round (ties to even): (6 - 3) / 2 = 1.5 -> 2; (4 - 1) / 2 = 1.5 -> 2.
  image::Image cc = image::center_crop(ramp, 1, 3);
  EXPECT_EQ(cc.data[0], ramp.data[2 * 6 + 2]);
  image::Image f = image::flip_horizontal(ramp);
  EXPECT_EQ(f.data[0], ramp.data[5]);
  EXPECT_NE(error_of([&] { image::center_crop(ramp, 5, 2); }).find("larger than"), std::string::npos);
  // Resize(256) of a 300 x 451 image: 256 x int(256·451/300) = 256 x 384.
  image::Image r =
      image::resize_shorter(image::Image{300, 451, std::vector<float>(3 * 300 * 451, 0.5f), ""}, 256);
  EXPECT_EQ(r.height, 256);
  EXPECT_EQ(r.width, 384);
}
