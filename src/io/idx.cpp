// IDX reader (the MNIST family's format): big-endian header, unsigned-byte payload, via zlib so that
// .gz files and raw files read the same way.
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "mgn/data.h"

namespace mgn {

const char* const kFashionMnistClasses[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

namespace {

// The whole decompressed content, or an error naming the file (truncated gzip streams included).
std::vector<uint8_t> read_all(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("IDX file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path)) throw Error("IDX file '" + path + "' is a folder, expected a file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open IDX file '" + path + "'");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw Error("IDX file '" + path + "': decompression failed (" + msg + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > (size_t(1) << 32)) {
      gzclose(f);
      throw Error("IDX file '" + path + "' is larger than 4 GiB decompressed");
    }
  }
  int err = 0;
  std::string msg = gzerror(f, &err);
  gzclose(f);
  // zlib reports a stream cut short only here (Z_BUF_ERROR: "unexpected end of file").
  if (err != Z_OK && err != Z_STREAM_END) throw Error("IDX file '" + path + "': decompression failed (" + msg + ")");
  return out;
}

std::string hex_byte(uint8_t b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02X", unsigned(b));
  return s;
}

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

}  // namespace

IdxArray read_idx(const std::string& path) { return parse_idx(read_all(path), path); }

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& path) {
  auto fail = [&](const std::string& msg) { return Error("IDX file '" + path + "': " + msg); };
  if (bytes.size() < 4) throw fail("only " + std::to_string(bytes.size()) + " bytes, too short for the magic number");
  if (bytes[0] != 0 || bytes[1] != 0)
    throw fail("bad magic number (the first two bytes must be 0; is this an IDX file?)");
  if (bytes[2] != 0x08)
    throw fail("element type " + hex_byte(bytes[2]) + " is not supported (expected 0x08, unsigned byte)");
  int rank = bytes[3];
  if (rank < 1 || rank > 4) throw fail("rank " + std::to_string(rank) + " (expected 1 to 4)");
  size_t header = 4 + size_t(rank) * 4;
  if (bytes.size() < header) throw fail("truncated header: " + std::to_string(bytes.size()) + " bytes");
  IdxArray a;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = be32(bytes.data() + 4 + 4 * i);
    if (d == 0) throw fail("dimension " + std::to_string(i) + " is 0");
    count *= d;
    if (count > (uint64_t(1) << 32)) throw fail("dimensions are implausibly large");
    a.dims.push_back(int64_t(d));
  }
  uint64_t have = bytes.size() - header;
  if (have < count)
    throw fail("truncated: the header promises " + std::to_string(count) + " values, the file holds " +
               std::to_string(have));
  if (have > count)
    throw fail(std::to_string(have - count) + " unexpected bytes after the " + std::to_string(count) + " values");
  a.data.assign(bytes.begin() + std::ptrdiff_t(header), bytes.end());
  return a;
}

std::string fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

Dataset load_fashion_mnist(const std::string& dir, Split split, int64_t limit) {
  std::string stem = split == Split::Train ? "train" : "t10k";
  auto pick = [&](const std::string& base) {
    // Debian ships the .gz files; an unpacked copy works too.
    std::string gz = dir + "/" + base + ".gz";
    if (std::filesystem::exists(gz)) return gz;
    std::string raw = dir + "/" + base;
    if (std::filesystem::exists(raw)) return raw;
    throw Error("Fashion-MNIST: neither '" + gz + "' nor '" + raw +
                "' exists (install the Debian package dataset-fashion-mnist or set MGN_FASHION_MNIST_DIR)");
  };
  std::string ipath = pick(stem + "-images-idx3-ubyte"), lpath = pick(stem + "-labels-idx1-ubyte");
  IdxArray images = read_idx(ipath), labels = read_idx(lpath);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28)
    throw Error("Fashion-MNIST images '" + ipath + "': shape " + shape_str(images.dims) + ", expected [N, 28, 28]");
  if (labels.dims.size() != 1) throw Error("Fashion-MNIST labels '" + lpath + "': shape " + shape_str(labels.dims) + ", expected [N]");
  if (labels.dims[0] != images.dims[0])
    throw Error("Fashion-MNIST: " + std::to_string(images.dims[0]) + " images in '" + ipath + "' but " +
                std::to_string(labels.dims[0]) + " labels in '" + lpath + "'");
  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  Dataset d;
  d.count = n;
  d.sample_shape = {1, 28, 28};
  d.features.resize(size_t(n * 784));
  for (size_t i = 0; i < d.features.size(); ++i) d.features[i] = float(images.data[i]) / 255.0f;
  d.labels.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t y = labels.data[size_t(i)];
    if (y > 9) throw Error("Fashion-MNIST labels '" + lpath + "': label " + std::to_string(y) + " at index " + std::to_string(i) + " is not a class 0..9");
    d.labels[size_t(i)] = y;
  }
  return d;
}

}  // namespace mgn
