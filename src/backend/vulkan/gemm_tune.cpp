// Measured kernel choice (gemm_tune.h): the tuning file, and timing the candidate GEMM kernels of a graph.
#include "backend/vulkan/gemm_tune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/vulkan/command.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "backend/vulkan/session_cache.h"
#include "codegen/matmul.h"
#include "codegen/shader_compiler.h"
#include "support/atomic_file.h"
#include "support/parallel.h"

namespace mgn::vk {
namespace {

// The file: this line, "key <hex>", "device <name> | <driver>" (for people; not checked), one line per shape
// "gemm <key> <tile> <ms> <tile>=<ms>...", then "checksum <16 hex digits>" of everything before it.
constexpr const char* kMagic = "mgn gemm tuning 1";

// Repetitions of the GEMM per submission, untimed and timed submissions per candidate.
constexpr int kReps = 3, kWarmup = 1, kTimed = 5;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string ms_text(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", ms);
  return b;
}

bool parse_ms(const std::string& t, double* out) {
  if (t.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !(v >= 0) || v > 1e9) return false;
  *out = v;
  return true;
}

bool parse_tile(const std::string& t, GemmTile* out) {
  try {
    *out = parse_gemm_tile(t, false);
  } catch (const Error&) {
    return false;
  }
  return !out->is_auto() && gemm_tile_str(*out, false) == t;
}

// "gemm <key> <tile> <ms> <tile>=<ms>..."
bool parse_entry(const std::string& line, std::string* key, GemmTuneEntry* e) {
  std::istringstream in(line);
  std::string word, tile, ms;
  if (!(in >> word) || word != "gemm" || !(in >> *key >> tile >> ms)) return false;
  if (!parse_tile(tile, &e->tile) || !parse_ms(ms, &e->ms)) return false;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return false;
    std::pair<GemmTile, double> c;
    if (!parse_tile(word.substr(0, eq), &c.first) || !parse_ms(word.substr(eq + 1), &c.second)) return false;
    e->candidates.push_back(c);
  }
  return true;
}

uint64_t product_where(const std::vector<uint64_t>& dims, const std::vector<uint64_t>& stride) {
  uint64_t p = 1;
  for (size_t d = 0; d < dims.size(); ++d)
    if (stride[d] != 0) p *= dims[d];
  return p;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Times each candidate of `s` (all its kernels compiled first, in parallel) on zero-filled scratch operands;
// returns false (nothing measured) when an operand exceeds one binding's range.
bool measure(Context& ctx, Allocator& alloc, Transfer& transfer, PipelineCache& pipelines,
             codegen::ShaderCompiler& compiler, const codegen::GemmShape& s, const codegen::DeviceCaps& caps,
             GemmTuneEntry* entry) {
  const std::vector<GemmTile> cands = codegen::gemm_tune_candidates(s, caps);
  if (cands.empty()) return false;
  std::vector<codegen::Lowering> lows;
  for (const GemmTile& t : cands) {
    codegen::GemmOptions o;
    o.variant = codegen::GemmVariant::Tiled;
    o.tile = t;
    lows.push_back(codegen::lower_gemm(s, caps, o));
  }
  const uint64_t batch = product_where(s.batch, std::vector<uint64_t>(s.batch.size(), 1));
  const uint64_t words_a = s.m * s.k * product_where(s.batch, s.a_stride);
  const uint64_t words_b = s.k * s.n * product_where(s.batch, s.b_stride);
  const uint64_t words_c = s.m * s.n * batch;
  uint64_t most = std::max({words_a, words_b, words_c});
  for (const codegen::Lowering& l : lows)
    for (uint64_t w : l.scratch_words) most = std::max(most, w);
  if (most * 4 > ctx.limits().max_storage_buffer_range) return false;

  // SPIR-V of every kernel, then the pipelines (the winner's are the session's own later: same SPIR-V).
  std::vector<const codegen::Kernel*> kernels;
  for (const codegen::Lowering& l : lows)
    for (const codegen::Kernel& k : l.kernels) kernels.push_back(&k);
  std::vector<PipelineDesc> descs(kernels.size());
  support::parallel_for(kernels.size(), 0, [&](size_t i) {
    codegen::ShaderOptions so;
    so.name = kernels[i]->name;
    so.scalar_block_layout = kernels[i]->scalar_block_layout;
    descs[i].spirv = compiler.compile(kernels[i]->glsl, so).words;
    descs[i].num_buffers = uint32_t(kernels[i]->bindings.size());
    descs[i].required_subgroup_size = kernels[i]->required_subgroup_size;
    descs[i].name = kernels[i]->name;
  });
  const std::vector<const Pipeline*> pipes = pipelines.get_all(descs);

  std::vector<Buffer> operands;
  std::vector<Buffer> scratch;
  auto release = [&] {
    for (Buffer& b : scratch) alloc.free(b);
    for (Buffer& b : operands) alloc.free(b);
    scratch.clear();
    operands.clear();
  };
  entry->candidates.clear();
  try {
    for (uint64_t w : {words_a, words_b, words_c}) {
      operands.push_back(alloc.allocate(std::max<uint64_t>(w, 1) * 4, MemoryKind::Device, "tuning operand"));
      transfer.fill_zero(operands.back());
    }
    size_t first = 0;
    for (size_t c = 0; c < cands.size(); ++c) {
      const codegen::Lowering& low = lows[c];
      for (uint64_t w : low.scratch_words)
        scratch.push_back(alloc.allocate(std::max<uint64_t>(w, 1) * 4, MemoryKind::Device, "tuning scratch"));
      CommandStream stream(ctx, /*timestamps=*/true);
      for (int rep = 0; rep < kReps; ++rep)
        for (size_t i = 0; i < low.kernels.size(); ++i) {
          const codegen::Kernel& k = low.kernels[i];
          std::vector<Buffer> bind;
          for (const codegen::Binding& bd : k.bindings)
            bind.push_back(bd.kind == codegen::BindingKind::Input    ? operands.at(bd.index == 0 ? 0 : 1)
                           : bd.kind == codegen::BindingKind::Output ? operands[2]
                                                                     : scratch.at(size_t(bd.index)));
          if (rep > 0 || i > 0) stream.barrier();
          stream.dispatch(*pipes[first + i], bind, k.groups, nullptr, 0, k.name);
        }
      for (int w = 0; w < kWarmup; ++w) stream.submit();
      std::vector<double> times;
      for (int t = 0; t < kTimed; ++t) {
        const auto t0 = std::chrono::steady_clock::now();
        stream.submit();
        double ms = ms_since(t0);
        if (stream.timestamps_enabled()) {
          ms = 0;
          for (const DispatchTiming& d : stream.timings()) ms += d.ms;
        }
        times.push_back(ms / kReps);
      }
      std::sort(times.begin(), times.end());
      entry->candidates.push_back({cands[c], times[times.size() / 2]});
      first += low.kernels.size();
      for (Buffer& b : scratch) alloc.free(b);
      scratch.clear();
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  // The fastest; on a tie the earlier candidate (the heuristics' choice comes first).
  size_t best = 0;
  for (size_t c = 1; c < entry->candidates.size(); ++c)
    if (entry->candidates[c].second < entry->candidates[best].second) best = c;
  entry->tile = entry->candidates[best].first;
  entry->ms = entry->candidates[best].second;
  return true;
}

}  // namespace

const char* tune_file_name(TuneFile f) {
  switch (f) {
    case TuneFile::Off: return "off";
    case TuneFile::Miss: return "miss";
    case TuneFile::Hit: return "hit";
    case TuneFile::Damaged: return "damaged";
  }
  return "?";
}

std::string gemm_tuning_key(const DeviceInfo& device) {
  return device_key(device, "gemm tuning").hex();
}

std::string gemm_tuning_path(const std::string& cache_dir, const std::string& key_hex) {
  return (std::filesystem::path(cache_dir) / "tuning" / (key_hex + ".txt")).string();
}

TuneFile load_gemm_tuning(const std::string& path, const std::string& key_hex,
                          std::map<std::string, GemmTuneEntry>* out) {
  out->clear();
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::filesystem::exists(path) ? TuneFile::Damaged : TuneFile::Miss;
  std::vector<std::string> lines;
  std::string line;
  bool newline_last = false;
  while (std::getline(f, line)) {
    newline_last = !f.eof();
    lines.push_back(line);
  }
  if (!newline_last || lines.size() < 4 || lines[0] != kMagic || lines[1] != "key " + key_hex ||
      lines[2].rfind("device ", 0) != 0 || lines.back().rfind("checksum ", 0) != 0)
    return TuneFile::Damaged;
  std::string body;
  for (size_t i = 0; i + 1 < lines.size(); ++i) body += lines[i] + "\n";
  if (lines.back() != "checksum " + hex64(fnv1a(body))) return TuneFile::Damaged;
  std::map<std::string, GemmTuneEntry> entries;
  for (size_t i = 3; i + 1 < lines.size(); ++i) {
    std::string key;
    GemmTuneEntry e;
    if (!parse_entry(lines[i], &key, &e) || !entries.emplace(key, e).second) return TuneFile::Damaged;
  }
  *out = std::move(entries);
  return TuneFile::Hit;
}

std::string store_gemm_tuning(const std::string& path, const std::string& key_hex, const DeviceInfo& device,
                              const std::map<std::string, GemmTuneEntry>& entries) {
  std::string who = device.name + " | " + device.driver;
  std::replace(who.begin(), who.end(), '\n', ' ');
  std::string text = std::string(kMagic) + "\nkey " + key_hex + "\ndevice " + who + "\n";
  for (const auto& [key, e] : entries) {
    text += "gemm " + key + " " + gemm_tile_str(e.tile, false) + " " + ms_text(e.ms);
    for (const auto& [t, ms] : e.candidates) text += " " + gemm_tile_str(t, false) + "=" + ms_text(ms);
    text += "\n";
  }
  text += "checksum " + hex64(fnv1a(text)) + "\n";
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return "cannot create " + std::filesystem::path(path).parent_path().string() + ": " + ec.message();
  return files::try_write_atomic(path, [&](int fd) { return files::write_all(fd, text.data(), text.size()); });
}

GemmTuneResult tune_gemms(Context& ctx, Allocator& alloc, Transfer& transfer, PipelineCache& pipelines,
                          codegen::ShaderCompiler& compiler, const ir::Graph& g, const codegen::DeviceCaps& caps,
                          const codegen::CodegenOptions& codegen, TuneMode mode, const std::string& cache_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  GemmTuneResult r;
  if (mode == TuneMode::Off) return r;
  std::map<std::string, codegen::GemmShape> shapes;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::MatMul) continue;
    const codegen::LowerContext lc{g, n, caps, codegen};
    const std::string key = codegen::tunable_gemm_key(lc);
    if (!key.empty()) shapes.emplace(key, codegen::matmul_shape(g, n));
  }
  if (shapes.empty()) {
    r.ms = ms_since(t0);
    return r;
  }
  std::map<std::string, GemmTuneEntry> entries;
  std::string key_hex, path;
  if (!cache_dir.empty()) {
    key_hex = gemm_tuning_key(ctx.info());
    path = gemm_tuning_path(cache_dir, key_hex);
    r.file = load_gemm_tuning(path, key_hex, &entries);
  }
  bool changed = r.file == TuneFile::Damaged;
  for (const auto& [key, s] : shapes) {
    auto it = entries.find(key);
    if (it != entries.end()) {
      // A kept tile is used only where it is still a valid, fully specified tile of this shape and device.
      bool valid = false;
      try {
        valid = codegen::resolve_simt_tile(s, caps, it->second.tile) == it->second.tile;
      } catch (const Error&) {
      }
      if (valid) {
        r.choices[key] = it->second.tile;
        ++r.cached;
        continue;
      }
      entries.erase(it);
      changed = true;
    }
    if (mode != TuneMode::Measure) continue;
    GemmTuneEntry e;
    if (!measure(ctx, alloc, transfer, pipelines, compiler, s, caps, &e)) continue;
    r.timed += e.candidates.size();
    ++r.measured;
    r.choices[key] = e.tile;
    entries[key] = std::move(e);
    changed = true;
  }
  if (changed && mode == TuneMode::Measure && !path.empty()) (void)store_gemm_tuning(path, key_hex, ctx.info(), entries);
  r.ms = ms_since(t0);
  return r;
}

}  // namespace mgn::vk
