// IDX reader and batch loader: the real Fashion-MNIST files against an independent Python/numpy reading,
// malformed files written to a temp dir, and the loader's seeded permutations.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "mgn/data.h"
#include "mgn/safetensors.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;
using test::error_of;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("mgn_data_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, size_t payload, uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(d >> s));
  for (size_t i = 0; i < payload; ++i) b.push_back(uint8_t(i * 7));
  return b;
}

void write_raw(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

void write_gz(const fs::path& p, const std::vector<uint8_t>& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), unsigned(b.size())), int(b.size()));
  gzclose(f);
}

bool have_dataset() { return fs::exists(fashion_mnist_dir() + "/t10k-labels-idx1-ubyte.gz"); }

}  // namespace

TEST(Idx, RealFashionMnistMatchesNumpy) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  fs::path dir = temp_dir("real");
  std::string out = (dir / "ref.safetensors").string();
  // numpy reads the same gz files with Python's gzip module: the first 100 test images and 50 labels.
  std::string script = dir.string() + "/ref.py";
  std::ofstream(script) << "import gzip, sys, numpy as np\n"
                           "sys.path.insert(0, '" MGN_SOURCE_DIR "/tests/ref')\n"
                           "import st_io\n"
                           "d = '" << fashion_mnist_dir() << "'\n"
                           "im = np.frombuffer(gzip.open(d + '/t10k-images-idx3-ubyte.gz').read()[16:], np.uint8)\n"
                           "lb = np.frombuffer(gzip.open(d + '/t10k-labels-idx1-ubyte.gz').read()[8:], np.uint8)\n"
                           "st_io.write(sys.argv[1], {'images': im[:78400].astype(np.float64) / 255.0,\n"
                           "  'labels': lb[:50].astype(np.int32), 'counts': np.bincount(lb, minlength=10).astype(np.int32)},\n"
                           "  dtypes={'images': 'F64'})\n";
  ASSERT_EQ(std::system((std::string(MGN_TORCH_PYTHON) + " " + script + " " + out).c_str()), 0);
  SafetensorsFile ref = SafetensorsFile::read(out);

  Dataset test = load_fashion_mnist(fashion_mnist_dir(), Split::Test);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.sample_shape, (Shape{1, 28, 28}));
  std::vector<double> want = ref.get("images").to_f64();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(test.features[i], want[i], 1e-7) << i;
  std::vector<int32_t> labels = ref.get("labels").to_i32();
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(test.labels[i], labels[i]);
  std::vector<int32_t> counts(10, 0);
  for (int32_t y : test.labels) {
    ASSERT_GE(y, 0);
    ASSERT_LE(y, 9);
    ++counts[size_t(y)];
  }
  EXPECT_EQ(counts, ref.get("counts").to_i32());

  IdxArray raw = read_idx(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz");
  EXPECT_EQ(raw.dims, (std::vector<int64_t>{60000, 28, 28}));
  Dataset train = load_fashion_mnist(fashion_mnist_dir(), Split::Train, 1000);
  EXPECT_EQ(train.count, 1000);
  EXPECT_EQ(train.features.size(), 784000u);
  for (float v : train.features) ASSERT_TRUE(v >= 0 && v <= 1);
  fs::remove_all(dir);
}

TEST(Idx, MalformedFilesAreErrorsNamingTheFile) {
  fs::path d = temp_dir("bad");
  auto err = [&](const std::string& name) { return error_of([&] { read_idx((d / name).string()); }); };
  auto expect = [&](const std::string& name, const std::string& piece) {
    std::string e = err(name);
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_NE(e.find(piece), std::string::npos) << name << ": " << e;
  };
  write_raw(d / "good", idx_bytes({3, 2}, 6));
  IdxArray good = read_idx((d / "good").string());
  EXPECT_EQ(good.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(good.data[5], 35);
  write_gz(d / "good.gz", idx_bytes({3, 2}, 6));
  EXPECT_EQ(read_idx((d / "good.gz").string()).data, good.data);

  expect("missing.gz", "does not exist");
  write_raw(d / "magic", {1, 2, 8, 1, 0, 0, 0, 1, 5});
  expect("magic", "magic");
  write_raw(d / "type", idx_bytes({2}, 8, 0x0D));
  expect("type", "element type");
  write_raw(d / "short", idx_bytes({10, 10}, 99));
  expect("short", "truncated");
  write_raw(d / "long", idx_bytes({10}, 11));
  expect("long", "unexpected bytes");
  write_raw(d / "zero", idx_bytes({0, 5}, 0));
  expect("zero", "is 0");
  write_raw(d / "tiny", {0, 0});
  expect("tiny", "too short");
  std::vector<uint8_t> hdr = idx_bytes({4, 4, 4}, 64);
  hdr.resize(9);
  write_raw(d / "header", hdr);
  expect("header", "truncated header");
  // A gzip stream cut in half.
  write_gz(d / "cut.gz", idx_bytes({100, 100}, 10000));
  auto gz = [&] {
    std::ifstream f(d / "cut.gz", std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  }();
  gz.resize(gz.size() / 2);
  write_raw(d / "cut.gz", gz);
  EXPECT_NE(err("cut.gz").find("cut.gz"), std::string::npos) << err("cut.gz");

  // Dataset-level checks: labels out of range, images and labels of different counts, missing files.
  fs::create_directories(d / "ds");
  write_gz(d / "ds" / "t10k-images-idx3-ubyte.gz", idx_bytes({2, 28, 28}, 2 * 784));
  write_gz(d / "ds" / "t10k-labels-idx1-ubyte.gz", {0, 0, 8, 1, 0, 0, 0, 2, 3, 12});
  std::string e = error_of([&] { load_fashion_mnist((d / "ds").string(), Split::Test); });
  EXPECT_NE(e.find("label 12"), std::string::npos) << e;
  write_gz(d / "ds" / "t10k-labels-idx1-ubyte.gz", {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3});
  e = error_of([&] { load_fashion_mnist((d / "ds").string(), Split::Test); });
  EXPECT_NE(e.find("3 labels"), std::string::npos) << e;
  e = error_of([&] { load_fashion_mnist((d / "ds").string(), Split::Train); });
  EXPECT_NE(e.find("train-images-idx3-ubyte"), std::string::npos) << e;
  write_gz(d / "ds" / "t10k-labels-idx1-ubyte.gz", {0, 0, 8, 1, 0, 0, 0, 2, 9, 0});
  Dataset ok = load_fashion_mnist((d / "ds").string(), Split::Test);
  EXPECT_EQ(ok.labels, (std::vector<int32_t>{9, 0}));
  EXPECT_FLOAT_EQ(ok.features[1], 7.0f / 255.0f);
  fs::remove_all(d);
}

namespace {

Dataset toy(int64_t n) {
  Dataset d;
  d.count = n;
  d.sample_shape = {2};
  for (int64_t i = 0; i < n; ++i) {
    d.features.push_back(float(i));
    d.features.push_back(float(-i));
    d.labels.push_back(int32_t(i % 3));
  }
  return d;
}

std::vector<int64_t> epoch_order(BatchLoader& l, int64_t epoch, int64_t* batches = nullptr) {
  l.start_epoch(epoch);
  std::vector<int64_t> order;
  Batch b;
  int64_t nb = 0;
  while (l.next(b)) {
    ++nb;
    for (int64_t i = 0; i < b.size; ++i) {
      int64_t k = b.indices[size_t(i)];
      order.push_back(k);
      // Features and labels are those of the sample the index names.
      EXPECT_EQ(b.features[size_t(2 * i)], float(k));
      EXPECT_EQ(b.features[size_t(2 * i + 1)], float(-k));
      EXPECT_EQ(b.labels[size_t(i)], int32_t(k % 3));
    }
  }
  if (batches) *batches = nb;
  return order;
}

}  // namespace

TEST(Loader, SeededPermutationsAndBatches) {
  Dataset d = toy(103);
  BatchLoader a(d, {.batch = 10, .shuffle = true, .seed = 5});
  BatchLoader b(d, {.batch = 10, .shuffle = true, .seed = 5});
  BatchLoader c(d, {.batch = 10, .shuffle = true, .seed = 6});
  int64_t nb = 0;
  std::vector<int64_t> a0 = epoch_order(a, 0, &nb);
  EXPECT_EQ(nb, 10);
  EXPECT_EQ(a.batches_per_epoch(), 10);
  EXPECT_EQ(a0.size(), 100u);  // drop_last: 3 samples left out
  EXPECT_EQ(std::set<int64_t>(a0.begin(), a0.end()).size(), 100u);
  EXPECT_EQ(epoch_order(b, 0), a0);
  EXPECT_NE(epoch_order(c, 0), a0);
  std::vector<int64_t> a1 = epoch_order(a, 1);
  EXPECT_NE(a1, a0);
  EXPECT_EQ(epoch_order(a, 0), a0);  // an epoch's order depends on (seed, epoch) alone

  BatchLoader p(d, {.batch = 10, .shuffle = true, .seed = 5, .drop_last = false});
  std::vector<int64_t> all = epoch_order(p, 0, &nb);
  EXPECT_EQ(nb, 11);
  EXPECT_EQ(p.batches_per_epoch(), 11);
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(all[size_t(i)], i);
  BatchLoader seq(d, {.batch = 50, .shuffle = false, .drop_last = false});
  std::vector<int64_t> s = epoch_order(seq, 3);
  for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(s[size_t(i)], i);

  EXPECT_THROW((void)BatchLoader(d, {.batch = 0}), Error);
  EXPECT_THROW((void)BatchLoader(toy(5), {.batch = 10}), Error);
}
