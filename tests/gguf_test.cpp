// The GGUF writer (include/mgn/gguf.h) byte for byte against the layout of the GGUF spec written out by hand
// here, its refusals, and its alignment option. The Llama exporter on top of it is checked end to end by
// tests/ref/gguf_check.py (GgufExport, GgufLlamaCppLogits).
#include "mgn/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace {

using mgn::gguf::Tensor;
using mgn::gguf::TensorType;
using mgn::gguf::Value;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mgn_gguf_test_" + std::to_string(getpid()) + "_" + name)).string();
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Little-endian appenders for the expected image.
void u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void str(std::vector<uint8_t>& b, const std::string& s) {
  u64(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

TEST(Gguf, BytesFollowTheSpec) {
  const std::string path = temp_path("bytes.gguf");
  std::vector<mgn::gguf::KeyValue> kv = {{"a.u32", Value::u32(7)},
                                         {"s", Value::string("hi")},
                                         {"arr", Value::i32_array({1, -2})},
                                         {"f", Value::f32(0.5f)},
                                         {"b", Value::boolean(true)}};
  std::vector<Tensor> t = {{"t", {2, 3}, TensorType::F32, {0, 1, 2, 3, 4, 5}},
                           {"h", {3}, TensorType::F16, {1.0f, -2.0f, 65504.0f}}};
  mgn::gguf::write(path, kv, t);

  std::vector<uint8_t> e = {'G', 'G', 'U', 'F'};
  u32(e, 3);  // version
  u64(e, 2);  // tensors
  u64(e, 5);  // metadata entries
  str(e, "a.u32"), u32(e, 4), u32(e, 7);                       // u32 = 4
  str(e, "s"), u32(e, 8), str(e, "hi");                        // string = 8
  str(e, "arr"), u32(e, 9), u32(e, 5), u64(e, 2), u32(e, 1), u32(e, uint32_t(-2));  // array of i32 (5)
  str(e, "f"), u32(e, 6), u32(e, 0x3F000000u);                // f32 = 6, 0.5f
  str(e, "b"), u32(e, 7), e.push_back(1);                      // bool = 7, one byte
  str(e, "t"), u32(e, 2), u64(e, 3), u64(e, 2), u32(e, 0), u64(e, 0);  // dims innermost first, F32 = 0
  str(e, "h"), u32(e, 1), u64(e, 3), u32(e, 1), u64(e, 32);           // F16 = 1; t's 24 bytes padded to 32
  while (e.size() % 32) e.push_back(0);
  const size_t data = e.size();
  for (float v : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    u32(e, bits);
  }
  while ((e.size() - data) % 32) e.push_back(0);
  for (uint16_t h : {uint16_t(0x3C00), uint16_t(0xC000), uint16_t(0x7BFF)}) e.push_back(uint8_t(h)), e.push_back(uint8_t(h >> 8));
  while ((e.size() - data) % 32) e.push_back(0);

  EXPECT_EQ(slurp(path), e);
  std::filesystem::remove(path);
}

TEST(Gguf, AlignmentOptionIsWrittenAndUsed) {
  const std::string path = temp_path("align.gguf");
  mgn::gguf::write(path, {}, {{"x", {1}, TensorType::F32, {2.0f}}}, 64);
  const std::vector<uint8_t> b = slurp(path);
  std::vector<uint8_t> e = {'G', 'G', 'U', 'F'};
  u32(e, 3), u64(e, 1), u64(e, 1);
  str(e, "general.alignment"), u32(e, 4), u32(e, 64);
  str(e, "x"), u32(e, 1), u64(e, 1), u32(e, 0), u64(e, 0);
  while (e.size() % 64) e.push_back(0);
  u32(e, 0x40000000u);  // 2.0f
  while (e.size() % 64) e.push_back(0);
  EXPECT_EQ(b, e);
  std::filesystem::remove(path);
}

void expect_refused(const std::vector<mgn::gguf::KeyValue>& kv, const std::vector<Tensor>& t, const std::string& want,
                    uint32_t alignment = 32) {
  const std::string path = temp_path("bad.gguf");
  try {
    mgn::gguf::write(path, kv, t, alignment);
    ADD_FAILURE() << "no error; expected one naming " << want;
  } catch (const mgn::Error& err) {
    EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos) << err.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Gguf, Refusals) {
  const Tensor ok{"w", {2}, TensorType::F32, {1, 2}};
  expect_refused({{"k", Value::u32(1)}, {"k", Value::u32(2)}}, {}, "'k' given twice");
  expect_refused({}, {ok, ok}, "'w' given twice");
  expect_refused({}, {{std::string(64, 'n'), {1}, TensorType::F32, {1}}}, "64 bytes");
  expect_refused({}, {{"r5", {1, 1, 1, 1, 1}, TensorType::F32, {1}}}, "rank 5");
  expect_refused({}, {{"short", {2, 3}, TensorType::F32, {1, 2}}}, "2 values for shape");
  expect_refused({}, {{"zero", {0}, TensorType::F32, {}}}, "non-positive");
  Value nested = Value::i32_array({1});
  nested.element = mgn::gguf::ValueType::Array;
  expect_refused({{"nest", nested}}, {}, "array of arrays");
  Value two = Value::u32(1);
  two.ints.push_back(2);
  expect_refused({{"two", two}}, {}, "holds 2 values");
  expect_refused({}, {ok}, "power of two", 48);
}

TEST(Gguf, FailedWriteLeavesNoFile) {
  const std::string dir = temp_path("no_such_dir");
  EXPECT_THROW(mgn::gguf::write(dir + "/x.gguf", {}, {{"w", {1}, TensorType::F32, {1}}}), mgn::Error);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
