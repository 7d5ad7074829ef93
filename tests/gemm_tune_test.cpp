// Measured kernel choice (docs/tuning.md) on the Vulkan engine (lavapipe in CI): a tuned compile computes what
// the CPU reference executor computes; the tuning file is written, and later compiles take every choice from it
// (no measurement, counted by the compile report) and lower the same kernels; a choice in the file is what the
// lowering uses; a truncated, garbage or other-device file is ignored and rewritten; tuning off never touches
// the file.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "backend/vulkan/gemm_tune.h"
#include "codegen/matmul.h"
#include "mgn/graph.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;
namespace fs = std::filesystem;

namespace {

// Three f32 GEMM shapes the tuner sees: a batched product with a broadcast weight, a transposed product, and a
// long K (its candidates include split-K counts); and the three implicit-GEMM convolutions (forward, input and
// weight gradients) of one 3x3 conv.
Graph gemms() {
  Graph g;
  Tensor x = g.input("x", {2, 24, 40});
  Tensor w = g.input("w", {40, 36});
  Tensor h = g.input("h", {24, 40});
  Tensor v = g.input("v", {20, 40});
  Tensor p = g.input("p", {16, 512});
  Tensor q = g.input("q", {512, 12});
  g.output("xw", matmul(x, w));
  g.output("hv", matmul(h, v, false, true));
  g.output("pq", matmul(p, q));
  Tensor img = g.input("img", {2, 4, 8, 8});
  Tensor filt = g.input("filt", {8, 4, 3, 3});
  Tensor dy = g.input("dy", {2, 8, 8, 8});
  const Conv2dOptions co{.padding = {1, 1}};
  g.output("conv", conv2d(img, filt, co));
  g.output("conv_gi", conv2d_grad_input(dy, filt, {2, 4, 8, 8}, co));
  g.output("conv_gw", conv2d_grad_weight(img, dy, {8, 4, 3, 3}, co));
  return g;
}

const std::map<std::string, Shape> kInputs = {{"x", {2, 24, 40}},     {"w", {40, 36}},        {"h", {24, 40}},
                                              {"v", {20, 40}},        {"p", {16, 512}},       {"q", {512, 12}},
                                              {"img", {2, 4, 8, 8}},  {"filt", {8, 4, 3, 3}}, {"dy", {2, 8, 8, 8}}};
const std::vector<std::string> kOutputs = {"xw", "hv", "pq", "conv", "conv_gi", "conv_gw"};
constexpr size_t kShapes = 6;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "mgn-tune-test-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

Session compile_vk(TuneMode mode, const fs::path& dir) {
  Graph g = gemms();
  CompileOptions o{.mode = Mode::Infer, .backend = Backend::Vulkan, .device = test::device_options()};
  o.cache_dir = dir.string();
  o.session_cache_bytes = 0;  // every compile lowers again (the tuner's choices, not a session entry)
  o.tune = mode;
  return compile(g, o);
}

// Runs `s` and the CPU reference on the same inputs; checks every output.
void expect_matches_cpu(Session& s) {
  Graph g = gemms();
  Session cpu = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  uint64_t seed = 1;
  for (const auto& [name, shape] : kInputs) {
    const std::vector<double> d = test::random_normal(size_t(numel(shape)), seed++);
    const std::vector<float> f(d.begin(), d.end());
    s.set_input(name, f);
    cpu.set_input(name, f);
  }
  s.run();
  cpu.run();
  for (const std::string& out : kOutputs) {
    const std::vector<float> a = s.read(out), b = cpu.read(out);
    ASSERT_EQ(a.size(), b.size()) << out;
    EXPECT_LT(test::rel_l2(std::vector<double>(a.begin(), a.end()), std::vector<double>(b.begin(), b.end())), 1e-6)
        << out;
  }
}

std::vector<fs::path> tuning_files(const fs::path& dir) {
  std::vector<fs::path> r;
  if (!fs::exists(dir / "tuning")) return r;
  for (const auto& e : fs::directory_iterator(dir / "tuning"))
    if (e.path().extension() == ".txt") r.push_back(e.path());
  return r;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

// The part of the SIMT kernel's name a fully specified tile gives (matmul_simt.cpp's specialization key).
std::string kernel_key(const GemmTile& t) {
  auto n = [](uint32_t v) { return std::to_string(v); };
  return "matmul_tiled_" + n(t.bm) + "x" + n(t.bn) + "x" + n(t.bk) + "_" + n(t.tm) + "x" + n(t.tn) + "_l" + n(t.lx) +
         "x" + n(t.ly) + "_g" + n(t.group_m) + (t.splits > 1 ? "_s" + n(t.splits) : "") + "_";
}

bool has_kernel(const Session& s, const std::string& key) {
  for (const auto& [name, glsl] : s.kernel_sources())
    if (name.rfind(key, 0) == 0) return true;
  return false;
}

// A kept entry's tile is lowered: the SIMT kernel of that tile (gemm), or an implicit-GEMM kernel of the conv's
// op with that block (conv; "auto" is the heuristics' and names no block).
bool lowers(const Session& s, const std::string& key, const vk::GemmTuneEntry& e) {
  if (e.kind == "gemm") return has_kernel(s, kernel_key(parse_gemm_tile(e.tile, false)));
  if (e.tile == "auto") return true;
  const ConvTile t = parse_conv_tile(e.tile);
  const std::string op = key.substr(0, key.find('/')) + "_igemm", block = "_" + std::to_string(t.bp) + "x" +
                                                                           std::to_string(t.bq) + "x";
  for (const auto& [name, glsl] : s.kernel_sources())
    if (name.rfind(op, 0) == 0 && name.find(block) != std::string::npos) return true;
  return false;
}

// A Measure compile into `dir`; returns the tuning file it wrote and its entries.
fs::path measure_into(const fs::path& dir, std::map<std::string, vk::GemmTuneEntry>* entries) {
  Session s = compile_vk(TuneMode::Measure, dir);
  EXPECT_EQ(s.compile_report().tune_measured, kShapes);
  const std::vector<fs::path> files = tuning_files(dir);
  EXPECT_EQ(files.size(), 1u);
  if (files.size() != 1) return {};
  EXPECT_EQ(vk::load_gemm_tuning(files[0].string(), files[0].stem().string(), entries), vk::TuneFile::Hit);
  return files[0];
}

TEST(GemmTune, MeasuredCompileMatchesCpuAndLaterCompilesReuseTheFile) {
  TempDir dir;
  Session first = compile_vk(TuneMode::Measure, dir.path);
  const CompileReport& r = first.compile_report();
  EXPECT_EQ(r.tune_file, "miss");
  EXPECT_EQ(r.tune_measured, kShapes);
  EXPECT_EQ(r.tune_cached, 0u);
  EXPECT_GT(r.tune_timed, kShapes);  // more than one candidate for at least one shape
  EXPECT_GT(r.tune_ms, 0.0);
  EXPECT_LE(r.tune_ms, r.total_ms);
  expect_matches_cpu(first);

  const std::vector<fs::path> files = tuning_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, vk::GemmTuneEntry> entries;
  ASSERT_EQ(vk::load_gemm_tuning(files[0].string(), files[0].stem().string(), &entries), vk::TuneFile::Hit);
  ASSERT_EQ(entries.size(), kShapes);
  size_t convs = 0;
  for (const auto& [key, e] : entries) {
    convs += e.kind == "conv";
    EXPECT_EQ(key.rfind(e.kind == "gemm" ? "f32/strict/" : "conv2d", 0), 0u) << key;
    ASSERT_GT(e.candidates.size(), 1u) << key;
    double fastest = e.candidates[0].second;
    for (const auto& [t, ms] : e.candidates) fastest = std::min(fastest, ms);
    EXPECT_EQ(e.ms, fastest) << key << ": the fastest candidate is chosen";
    EXPECT_TRUE(lowers(first, key, e)) << key << ": the chosen tile is lowered";
  }
  EXPECT_EQ(convs, 3u);
  EXPECT_TRUE(entries.count("f32/strict/16x12x512/t00/")) << "the long-K shape's key";
  EXPECT_TRUE(entries.count("conv2d/f32/strict/2x4x8x8/8x4x3x3/2x8x8x8/s1x1/p1x1x1x1/d1x1/g1")) << "the conv's key";

  for (TuneMode mode : {TuneMode::Use, TuneMode::Measure}) {
    const std::string before = read_file(files[0]);
    Session again = compile_vk(mode, dir.path);
    const CompileReport& a = again.compile_report();
    EXPECT_EQ(a.tune_file, "hit") << tune_mode_name(mode);
    EXPECT_EQ(a.tune_measured, 0u) << tune_mode_name(mode);
    EXPECT_EQ(a.tune_timed, 0u) << tune_mode_name(mode);
    EXPECT_EQ(a.tune_cached, kShapes) << tune_mode_name(mode);
    EXPECT_EQ(again.kernel_sources(), first.kernel_sources()) << tune_mode_name(mode) << ": the same kernels";
    EXPECT_EQ(read_file(files[0]), before) << tune_mode_name(mode) << ": nothing to add, the file is unchanged";
    expect_matches_cpu(again);
  }
}

TEST(GemmTune, TheFilesChoiceIsWhatTheLoweringUses) {
  TempDir dir;
  std::map<std::string, vk::GemmTuneEntry> entries;
  const fs::path file = measure_into(dir.path, &entries);
  ASSERT_FALSE(file.empty());
  // Make every shape choose a candidate that the measurement did not pick (not the heuristics' "auto" for a
  // conv: that names no tile to look for).
  size_t changed = 0;
  for (auto& [key, e] : entries)
    for (const auto& [t, ms] : e.candidates)
      if (t != e.tile && t != "auto") {
        e.tile = t;
        e.ms = ms;
        ++changed;
        break;
      }
  ASSERT_EQ(changed, kShapes);
  vk::DeviceInfo info;
  info.name = "test";
  ASSERT_EQ(vk::store_gemm_tuning(file.string(), file.stem().string(), info, entries), "");
  Session s = compile_vk(TuneMode::Use, dir.path);
  EXPECT_EQ(s.compile_report().tune_cached, kShapes);
  EXPECT_EQ(s.compile_report().tune_measured, 0u);
  for (const auto& [key, e] : entries) EXPECT_TRUE(lowers(s, key, e)) << key << " " << e.tile;
  expect_matches_cpu(s);
}

TEST(GemmTune, ADamagedFileIsIgnoredAndRewritten) {
  TempDir dir;
  std::map<std::string, vk::GemmTuneEntry> entries;
  const fs::path file = measure_into(dir.path, &entries);
  ASSERT_FALSE(file.empty());
  const std::string good = read_file(file);
  vk::DeviceInfo info;
  info.name = "another device";
  const std::string other_key(file.stem().string().size(), '0');
  const std::vector<std::pair<std::string, std::function<void()>>> damages = {
      {"truncated", [&] { write_file(file, good.substr(0, good.size() / 2)); }},
      {"garbage", [&] { write_file(file, std::string("\x01\x02garbage\xff\n", 11) + good.substr(40)); }},
      {"one byte changed", [&] {
         std::string s = good;
         s[s.find("gemm ") + 5] ^= 1;
         write_file(file, s);
       }},
      {"another device's key", [&] {
         ASSERT_EQ(vk::store_gemm_tuning(file.string(), other_key, info, entries), "");
       }},
  };
  for (const auto& [what, damage] : damages) {
    damage();
    {
      Session use = compile_vk(TuneMode::Use, dir.path);  // never trusts it, never writes
      EXPECT_EQ(use.compile_report().tune_file, "damaged") << what;
      EXPECT_EQ(use.compile_report().tune_cached, 0u) << what;
      EXPECT_EQ(use.compile_report().tune_measured, 0u) << what;
      expect_matches_cpu(use);
    }
    Session m = compile_vk(TuneMode::Measure, dir.path);
    EXPECT_EQ(m.compile_report().tune_file, "damaged") << what;
    EXPECT_EQ(m.compile_report().tune_measured, kShapes) << what;
    expect_matches_cpu(m);
    std::map<std::string, vk::GemmTuneEntry> again;
    EXPECT_EQ(vk::load_gemm_tuning(file.string(), file.stem().string(), &again), vk::TuneFile::Hit)
        << what << ": rewritten";
    EXPECT_EQ(again.size(), kShapes) << what;
  }
}

// The candidate set, on the default caps and a device limited to 256 invocations and 16 KiB of shared memory:
// the heuristics' tile first, every candidate fully specified and canonical (resolving it again changes
// nothing), no duplicates, and the split-K counts where K allows them.
TEST(GemmTune, CandidatesAreResolvedDistinctAndStartWithTheHeuristics) {
  codegen::DeviceCaps big;
  codegen::DeviceCaps small;
  small.max_workgroup_invocations = 256;
  small.max_shared_bytes = 16384;
  for (const codegen::DeviceCaps& caps : {big, small})
    for (auto [m, n, k] : {std::array<uint64_t, 3>{24, 36, 40}, {16, 12, 512}, {128, 576, 1536}, {4096, 4096, 64}}) {
      codegen::GemmShape s;
      s.m = m, s.n = n, s.k = k;
      const std::vector<GemmTile> c = codegen::gemm_tune_candidates(s, caps);
      ASSERT_GE(c.size(), 3u) << m << "x" << n << "x" << k;
      EXPECT_EQ(c[0], codegen::resolve_simt_tile(s, caps)) << "the heuristics' tile comes first";
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_EQ(codegen::resolve_simt_tile(s, caps, c[i]), c[i]) << gemm_tile_str(c[i], false);
        EXPECT_NE(c[i].tm, 0u);
        EXPECT_NE(c[i].splits, 0u);
        EXPECT_LE(uint64_t(c[i].bm / c[i].tm) * (c[i].bn / c[i].tn), caps.max_workgroup_invocations);
        for (size_t j = 0; j < i; ++j) EXPECT_NE(c[i], c[j]);
      }
      bool split = false;
      for (const GemmTile& t : c) split |= t.splits > 1;
      EXPECT_EQ(split, k >= 256) << m << "x" << n << "x" << k << ": split-K candidates where each split keeps 64 of K";
    }
}

// The split-K rule (kSimtSplits) on a big GPU's caps, counted by hand: a grid below 256 blocks doubles its splits
// while it stays within 512 blocks and each split keeps 96 of K, then, for long contractions, within 1024 blocks
// while each keeps 1024.
TEST(GemmSplit, LongContractionsSplitFurther) {
  const codegen::DeviceCaps big;
  auto splits = [&](uint64_t m, uint64_t n, uint64_t k) {
    codegen::GemmShape s;
    s.m = m, s.n = n, s.k = k;
    s.transpose_a = true;
    return codegen::resolve_simt_tile(s, big).splits;
  };
  EXPECT_EQ(splits(1536, 384, 12000), 4u);  // 144 blocks of 64x64: 2 (288 blocks), then 4 (576; 3000 of K each)
  EXPECT_EQ(splits(384, 384, 12000), 8u);   // 36 blocks: 8 (288); 16 would keep 750 of K
  EXPECT_EQ(splits(128, 576, 1536), 16u);   // SmolLM2's down projection: 18 blocks, 16 ways (288)
  EXPECT_EQ(splits(128, 1536, 576), 2u);    // 192 blocks of 32x32: 2 (384); 4 would keep 144 of K
  EXPECT_EQ(splits(4096, 4096, 12000), 1u);  // a full grid is not split
}

// A kept tile that parses but is no kernel of the shape (a per-thread tile that is not a multiple of 4) is not
// used: Use falls back to the heuristics for that shape, Measure measures it again.
TEST(GemmTune, AnInvalidKeptTileIsNotUsed) {
  TempDir dir;
  std::map<std::string, vk::GemmTuneEntry> entries;
  const fs::path file = measure_into(dir.path, &entries);
  ASSERT_FALSE(file.empty());
  const std::string key = "f32/strict/16x12x512/t00/";
  ASSERT_TRUE(entries.count(key));
  entries[key].tile = "64x64x16,t6x4,l16x2,g8,s1";
  vk::DeviceInfo info;
  ASSERT_EQ(vk::store_gemm_tuning(file.string(), file.stem().string(), info, entries), "");
  {
    Session use = compile_vk(TuneMode::Use, dir.path);
    EXPECT_EQ(use.compile_report().tune_file, "hit");
    EXPECT_EQ(use.compile_report().tune_cached, kShapes - 1);
    EXPECT_EQ(use.compile_report().tune_measured, 0u);
    EXPECT_FALSE(has_kernel(use, "matmul_tiled_64x64x16_6x4"));
    expect_matches_cpu(use);
  }
  Session m = compile_vk(TuneMode::Measure, dir.path);
  EXPECT_EQ(m.compile_report().tune_cached, kShapes - 1);
  EXPECT_EQ(m.compile_report().tune_measured, 1u);
  std::map<std::string, vk::GemmTuneEntry> again;
  ASSERT_EQ(vk::load_gemm_tuning(file.string(), file.stem().string(), &again), vk::TuneFile::Hit);
  EXPECT_NE(again.at(key).tile, "64x64x16,t6x4,l16x2,g8,s1");
  expect_matches_cpu(m);
}

TEST(GemmTune, OffNeverTouchesTheFile) {
  TempDir dir;
  {
    Session off = compile_vk(TuneMode::Off, dir.path);
    EXPECT_EQ(off.compile_report().tune_file, "off");
    EXPECT_EQ(off.compile_report().tune_ms, 0.0);
    EXPECT_FALSE(fs::exists(dir.path / "tuning")) << "no tuning folder without tuning";
  }
  std::map<std::string, vk::GemmTuneEntry> entries;
  const fs::path file = measure_into(dir.path, &entries);
  ASSERT_FALSE(file.empty());
  // A file that would be rewritten if anything looked at it.
  write_file(file, "garbage\n");
  const auto mtime = fs::last_write_time(file);
  Session off = compile_vk(TuneMode::Off, dir.path);
  EXPECT_EQ(off.compile_report().tune_file, "off");
  EXPECT_EQ(off.compile_report().tune_measured + off.compile_report().tune_cached, 0u);
  EXPECT_EQ(read_file(file), "garbage\n");
  EXPECT_EQ(fs::last_write_time(file), mtime);
  EXPECT_EQ(tuning_files(dir.path).size(), 1u);
  expect_matches_cpu(off);
}

}  // namespace
