// Checkpoints: resume equivalence (save mid-run, load into a fresh session, continue: bit-identical to the
// uninterrupted run), loading into an inference graph, missing/mis-shaped tensors, atomic writes under a
// real I/O failure, files hand-built by Python (f16/bf16/i32, sharded HF index), malformed files.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "mgn/checkpoint.h"
#include "mgn/session.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;
using test::error_of;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("mgn_ckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void put_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<float> to_f(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// y = x · Wᵀ + b with W [2, 3]; in train form the gradients are graph inputs (so this test does not
// depend on autodiff) and Adam keeps moments and a step counter.
struct Model {
  Graph g;
  std::map<std::string, Tensor> grads;
};
void build(Model& m, bool train, uint64_t seed) {
  Tensor x = m.g.input("x", {4, 3});
  Tensor w = m.g.parameter("fc.weight", {2, 3}, Init::normal(0, 1, seed));
  Tensor b = m.g.parameter("fc.bias", {2}, Init::normal(0, 1, seed + 1));
  m.g.output("y", linear(x, w, b));
  if (train) {
    m.grads["fc.weight"] = m.g.input("grad.w", {2, 3});
    m.grads["fc.bias"] = m.g.input("grad.b", {2});
  }
}
Session train_session(Model& m, uint64_t seed) {
  build(m, true, seed);
  return compile(m.g, {.mode = Mode::Train, .optimizer = Adam{.lr = 0.05}, .backend = Backend::Cpu,
                       .gradients = m.grads});
}
Session infer_session(Model& m, uint64_t seed) {
  build(m, false, seed);
  return compile(m.g, {.mode = Mode::Infer, .backend = Backend::Cpu});
}
void feed_step(Session& s, int k) {
  s.set_input("x", to_f(test::random_normal(12, 500 + uint64_t(k))));
  s.set_input("grad.w", to_f(test::random_normal(6, 600 + uint64_t(k))));
  s.set_input("grad.b", to_f(test::random_normal(2, 700 + uint64_t(k))));
  s.step();
}

}  // namespace

TEST(Checkpoint, ResumeIsBitIdenticalToTheUninterruptedRun) {
  fs::path dir = temp_dir("resume");
  std::string path = (dir / "a.safetensors").string();
  Model ma, mb;
  Session a = train_session(ma, 1);
  for (int k = 0; k < 3; ++k) feed_step(a, k);
  a.save_checkpoint(path);
  Session b = train_session(mb, 99);  // different init: everything must come from the file
  b.load_checkpoint(path);
  EXPECT_EQ(b.step_count(), 3);
  for (const std::string& n : a.state_names()) EXPECT_EQ(a.read(n), b.read(n)) << n;
  // The file itself holds parameters, both Adam moments and the step.
  SafetensorsFile f = SafetensorsFile::read(path);
  for (const char* n : {"fc.weight", "fc.bias", "optim.fc.weight.exp_avg", "optim.fc.weight.exp_avg_sq",
                        "optim.fc.bias.exp_avg", "optim.fc.bias.exp_avg_sq", "optim.step"})
    EXPECT_NE(f.find(n), nullptr) << n;
  EXPECT_EQ(f.metadata().at(kCheckpointStepKey), "3");
  for (int k = 3; k < 5; ++k) {
    feed_step(a, k);
    feed_step(b, k);
  }
  EXPECT_EQ(a.read("fc.weight"), b.read("fc.weight"));
  EXPECT_EQ(a.read("fc.bias"), b.read("fc.bias"));
  EXPECT_EQ(b.step_count(), 5);
  fs::remove_all(dir);
}

TEST(Checkpoint, InferenceGraphLoadsParametersAndIgnoresOptimizerState) {
  fs::path dir = temp_dir("infer");
  std::string path = (dir / "a.safetensors").string();
  Model mt, mi;
  Session t = train_session(mt, 1);
  for (int k = 0; k < 2; ++k) feed_step(t, k);
  t.save_checkpoint(path);
  Session inf = infer_session(mi, 42);
  inf.load_checkpoint(path);
  std::vector<float> x = to_f(test::random_normal(12, 9));
  inf.set_input("x", x);
  inf.run();
  std::vector<float> w = t.read("fc.weight"), b = t.read("fc.bias"), y = inf.read("y");
  ASSERT_EQ(y.size(), 8u);
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o) {
      double acc = b[size_t(o)];
      for (int k = 0; k < 3; ++k) acc += double(x[size_t(i * 3 + k)]) * w[size_t(o * 3 + k)];
      EXPECT_NEAR(y[size_t(i * 2 + o)], acc, 1e-5 * (1 + std::abs(acc)));
    }
  fs::remove_all(dir);
}

TEST(Checkpoint, MissingAndMisShapedTensorsAreNamed) {
  fs::path dir = temp_dir("missing");
  std::string path = (dir / "a.safetensors").string();
  Model mi;
  Session inf = infer_session(mi, 1);
  inf.save_checkpoint(path);

  Graph g2;
  Tensor x = g2.input("x", {4, 3});
  g2.output("y", linear(linear(x, g2.parameter("fc.weight", {2, 3})), g2.parameter("fc2.weight", {5, 2})));
  Session s2 = compile(g2, {.backend = Backend::Cpu});
  std::string e = error_of([&] { s2.load_checkpoint(path); });
  EXPECT_NE(e.find("'fc2.weight'"), std::string::npos) << e;

  Graph g3;
  Tensor x3 = g3.input("x", {4, 2});
  Tensor w3 = g3.parameter("fc.weight", {3, 2}, Init::constant(0.5));
  g3.output("y", linear(x3, w3, g3.parameter("fc.bias", {3})));
  Session s3 = compile(g3, {.backend = Backend::Cpu});
  e = error_of([&] { s3.load_checkpoint(path); });
  EXPECT_NE(e.find("'fc.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find(shape_str({2, 3})), std::string::npos) << e;
  // A rejected load changes nothing.
  EXPECT_EQ(s3.read("fc.weight"), std::vector<float>(6, 0.5f));

  // A training session needs the optimizer state unless told it is starting from parameters alone.
  Model mt;
  Session t = train_session(mt, 5);
  e = error_of([&] { t.load_checkpoint(path); });
  EXPECT_NE(e.find("optim."), std::string::npos) << e;
  t.load_checkpoint(path, {.require_optimizer_state = false});
  EXPECT_EQ(t.read("fc.weight"), inf.read("fc.weight"));
  EXPECT_EQ(t.step_count(), 0);
  EXPECT_NE(error_of([&] { t.load_checkpoint((dir / "nope.safetensors").string()); }).find("nope"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, FailedWriteLeavesTheOldFile) {
  fs::path dir = temp_dir("atomic");
  std::string path = (dir / "a.safetensors").string();
  Graph g;
  g.parameter("small", {2}, Init::constant(1.0));
  Tensor big = g.parameter("big", {4096}, Init::constant(2.0));
  g.output("o", sum(big));
  Session s = compile(g, {.backend = Backend::Cpu});
  // The old file: a different, small checkpoint.
  write_checkpoint(path, {StoredTensor::from_f32("old", {1}, {7.0f})}, 1);
  std::vector<uint8_t> before = file_bytes(path);

  // A real mid-write failure: a file size limit below the checkpoint's size makes write() fail (EFBIG).
  struct rlimit old_lim;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old_lim;
  lim.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string e = error_of([&] { s.save_checkpoint(path); });
  setrlimit(RLIMIT_FSIZE, &old_lim);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_EQ(file_bytes(path), before);
  // No temporary file is left behind.
  int files = 0;
  for (auto& ent : fs::directory_iterator(dir)) files += ent.is_regular_file();
  EXPECT_EQ(files, 1);

  // Rename failure (the target is a directory): also an error, nothing left behind.
  fs::create_directories(dir / "adir");
  EXPECT_THROW(s.save_checkpoint((dir / "adir").string()), Error);
  files = 0;
  for (auto& ent : fs::directory_iterator(dir)) files += ent.is_regular_file();
  EXPECT_EQ(files, 1);

  // And a successful write replaces the old file.
  s.save_checkpoint(path);
  EXPECT_EQ(SafetensorsFile::read(path).get("big").to_f32(), std::vector<float>(4096, 2.0f));
  fs::remove_all(dir);
}

class PythonFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = temp_dir("python");
    std::string cmd = std::string(MGN_TORCH_PYTHON) + " " + MGN_SOURCE_DIR + "/tests/ref/checkpoint_files.py " + dir_.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path PythonFiles::dir_;

TEST_F(PythonFiles, DtypesConvertOnLoad) {
  TensorSet ts = read_tensor_set((dir_ / "mixed.safetensors").string());
  SafetensorsFile ref = SafetensorsFile::read((dir_ / "ref.safetensors").string());
  EXPECT_EQ(ts.metadata.at("written_by"), "python");
  EXPECT_EQ(ts.find("h")->dtype, "F16");
  EXPECT_EQ(ts.find("b")->dtype, "BF16");
  struct C {
    const char* name;
    Shape shape;
  };
  for (C c : {C{"a", {2, 3}}, C{"h", {5}}, C{"b", {3}}, C{"i", {3}}}) {
    std::vector<float> got = ts.values_f32(c.name, c.shape);
    std::vector<double> want = ref.get(c.name).to_f64();
    ASSERT_EQ(got.size(), want.size()) << c.name;
    for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(double(got[k]), want[k]) << c.name << "[" << k << "]";
  }
  EXPECT_EQ(ts.find("i")->to_i32(), (std::vector<int32_t>{-7, 0, 123456}));
  // Into a session: an f32 parameter loads from the f16 tensor.
  Graph g;
  Tensor h = g.parameter("h", {5});
  Tensor b = g.parameter("b", {3});
  Tensor a = g.parameter("a", {2, 3});
  Tensor i = g.state("i", {3});
  g.output("s", sum(h) + sum(b) + sum(a) + sum(i));
  Session s = compile(g, {.backend = Backend::Cpu});
  s.load_checkpoint((dir_ / "mixed.safetensors").string());
  std::vector<double> hw = ref.get("h").to_f64();
  std::vector<float> hr = s.read("h");
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(double(hr[k]), hw[k]);
}

TEST_F(PythonFiles, ShardedIndexLoadsIntoAnInferenceGraph) {
  Model m;
  Session s = infer_session(m, 3);
  s.load_checkpoint((dir_ / "model.safetensors.index.json").string());
  SafetensorsFile ref = SafetensorsFile::read((dir_ / "ref.safetensors").string());
  std::vector<double> x = ref.get("x").to_f64(), y = ref.get("y").to_f64();
  s.set_input("x", to_f(x));
  s.run();
  std::vector<float> got = s.read("y");
  EXPECT_LE(test::rel_l2(std::vector<double>(got.begin(), got.end()), y), 1e-6);
  TensorSet ts = read_tensor_set((dir_ / "model.safetensors.index.json").string());
  EXPECT_NE(ts.file_of.at("fc.bias").find("model-00002-of-00002"), std::string::npos);
  std::string e = error_of([&] { read_tensor_set((dir_ / "bad_index.json").string()); });
  EXPECT_NE(e.find("'fc.extra'"), std::string::npos) << e;
}

namespace {

std::vector<uint8_t> image(const std::string& header, size_t data_bytes, uint64_t hlen_override = 0) {
  uint64_t n = hlen_override ? hlen_override : header.size();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);  // little-endian length
  s += header;
  s.append(data_bytes, '\0');
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string parse_error(const std::vector<uint8_t>& img) {
  return error_of([&] { SafetensorsFile::parse(img, "bad.safetensors"); });
}

}  // namespace

TEST(Safetensors, MalformedFilesAreRejectedWithReasons) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(parse_error(image(ok, 8)), "");  // the control case parses

  std::vector<uint8_t> truncated = image(ok, 8);
  truncated.resize(truncated.size() - 3);
  EXPECT_NE(parse_error(truncated).find("data_offsets"), std::string::npos) << parse_error(truncated);

  std::vector<uint8_t> cut_header = image(ok, 8);
  cut_header.resize(20);
  EXPECT_NE(parse_error(cut_header).find("truncated"), std::string::npos) << parse_error(cut_header);

  EXPECT_NE(parse_error({1, 2, 3}).find("too short"), std::string::npos);
  EXPECT_NE(parse_error(image(R"({"t":{"dtype":"F32","shape":[2],"data_of)", 8)).find("JSON"), std::string::npos);
  EXPECT_NE(parse_error(image("[1,2]", 0)).find("object"), std::string::npos);

  std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string e = parse_error(image(overlap, 12));
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;

  e = parse_error(image(ok, 8, uint64_t(1) << 62));
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
  e = parse_error(image(ok, 8, 5000));  // under the limit but past the end of the file
  EXPECT_NE(e.find("past the end"), std::string::npos) << e;

  e = parse_error(image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("'t'"), std::string::npos) << e;
  e = parse_error(image(R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("Q4"), std::string::npos) << e;
  e = parse_error(image(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("'t'"), std::string::npos) << e;

  // The same rejection through the session's checkpoint path names the file.
  fs::path dir = temp_dir("malformed");
  put_bytes(dir / "bad.safetensors", image(overlap, 12));
  Graph g;
  g.output("o", sum(g.parameter("a", {2})));
  Session s = compile(g, {.backend = Backend::Cpu});
  e = error_of([&] { s.load_checkpoint((dir / "bad.safetensors").string()); });
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;
  fs::remove_all(dir);
}
