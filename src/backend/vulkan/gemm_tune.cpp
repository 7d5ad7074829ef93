// Measured kernel choice (gemm_tune.h): the tuning file, and timing the candidate GEMM kernels of a graph.
#include "backend/vulkan/gemm_tune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "backend/vulkan/command.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "backend/vulkan/session_cache.h"
#include "codegen/matmul.h"
#include "codegen/shader_compiler.h"
#include "codegen/tuning.h"
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
  return codegen::fnv1a64(s.data(), s.size());
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

// A tile's text in its canonical form: a fully specified SIMT tile (gemm), or a conv tile / "auto" (conv).
bool valid_tile(const std::string& kind, const std::string& t) {
  try {
    if (kind == "gemm") {
      const GemmTile g = parse_gemm_tile(t, false);
      return !g.is_auto() && gemm_tile_str(g, false) == t;
    }
    return kind == "conv" && conv_tile_str(parse_conv_tile(t)) == t;
  } catch (const Error&) {
    return false;
  }
}

// "<gemm|conv> <key> <tile> <ms> <tile>=<ms>..."
bool parse_entry(const std::string& line, std::string* key, GemmTuneEntry* e) {
  std::istringstream in(line);
  std::string word, ms;
  if (!(in >> e->kind) || (e->kind != "gemm" && e->kind != "conv") || !(in >> *key >> e->tile >> ms)) return false;
  if (!valid_tile(e->kind, e->tile) || !parse_ms(ms, &e->ms)) return false;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return false;
    std::pair<std::string, double> c{word.substr(0, eq), 0.0};
    if (!valid_tile(e->kind, c.first) || !parse_ms(word.substr(eq + 1), &c.second)) return false;
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

// One shape to measure: its candidates (tile text) and their lowerings, the words of each input binding and of
// the output.
struct Job {
  std::string key, kind;
  std::vector<std::string> tiles;
  std::vector<codegen::Lowering> lows;
  std::vector<uint64_t> inputs;
  uint64_t output = 0;
  std::vector<const Pipeline*> pipes;  // every kernel of lows, in order
};

struct Tuner {
  Context& ctx;
  Allocator& alloc;
  Transfer& transfer;
  PipelineCache& pipelines;
  codegen::ShaderCompiler& compiler;

  // Whether every buffer of the job fits one binding's range (else the heuristics stay).
  bool fits(const Job& j) const {
    uint64_t most = j.output;
    for (uint64_t w : j.inputs) most = std::max(most, w);
    for (const codegen::Lowering& l : j.lows)
      for (uint64_t w : l.scratch_words) most = std::max(most, w);
    return most * 4 <= ctx.limits().max_storage_buffer_range;
  }

  // The SPIR-V of every kernel of every job in parallel, then the pipelines (the winners' are the sessions' own
  // later: same SPIR-V, same pipeline cache).
  void compile(std::vector<Job>& jobs) {
    std::vector<const codegen::Kernel*> kernels;
    for (const Job& j : jobs)
      for (const codegen::Lowering& l : j.lows)
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
    size_t next = 0;
    for (Job& j : jobs)
      for (const codegen::Lowering& l : j.lows)
        for (size_t k = 0; k < l.kernels.size(); ++k) j.pipes.push_back(pipes[next++]);
  }

  // Times each candidate of a compiled job on zero-filled buffers (binding Input i: inputs[i] words, Output: the
  // output's); the median ms per call of each, in order.
  std::vector<double> time(const Job& j) {
    std::vector<double> out;
    std::vector<Buffer> operands, scratch;  // operands: the inputs, then the output
    auto release = [&] {
      for (Buffer& b : scratch) alloc.free(b);
      for (Buffer& b : operands) alloc.free(b);
      scratch.clear();
      operands.clear();
    };
    try {
      std::vector<uint64_t> words = j.inputs;
      words.push_back(j.output);
      for (uint64_t w : words) {
        operands.push_back(alloc.allocate(std::max<uint64_t>(w, 1) * 4, MemoryKind::Device, "tuning operand"));
        transfer.fill_zero(operands.back());
      }
      size_t first = 0;
      for (const codegen::Lowering& low : j.lows) {
        for (uint64_t w : low.scratch_words)
          scratch.push_back(alloc.allocate(std::max<uint64_t>(w, 1) * 4, MemoryKind::Device, "tuning scratch"));
        if (low.counter_words > 0) {  // after the scratch buffers, zero (the kernels leave them zero)
          scratch.push_back(alloc.allocate(low.counter_words * 4, MemoryKind::Device, "tuning counters"));
          transfer.fill_zero(scratch.back());
        }
        CommandStream stream(ctx, /*timestamps=*/true);
        for (int rep = 0; rep < kReps; ++rep)
          for (size_t i = 0; i < low.kernels.size(); ++i) {
            const codegen::Kernel& k = low.kernels[i];
            std::vector<Buffer> bind;
            for (const codegen::Binding& bd : k.bindings)
              bind.push_back(bd.kind == codegen::BindingKind::Input      ? operands.at(size_t(bd.index))
                             : bd.kind == codegen::BindingKind::Output   ? operands.back()
                             : bd.kind == codegen::BindingKind::Counters ? scratch.back()
                                                                         : scratch.at(size_t(bd.index)));
            if (rep > 0 || i > 0) stream.barrier();
            stream.dispatch(*j.pipes[first + i], bind, k.groups, nullptr, 0, k.name);
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
        out.push_back(times[times.size() / 2]);
        first += low.kernels.size();
        for (Buffer& b : scratch) alloc.free(b);
        scratch.clear();
      }
    } catch (...) {
      release();
      throw;
    }
    release();
    return out;
  }
};

// The candidates of a GEMM shape (empty when it has none).
Job gemm_job(const std::string& key, const codegen::GemmShape& s, const codegen::DeviceCaps& caps) {
  Job j;
  j.key = key;
  j.kind = "gemm";
  for (const GemmTile& t : codegen::gemm_tune_candidates(s, caps)) {
    codegen::GemmOptions o;
    o.variant = codegen::GemmVariant::Tiled;
    o.tile = t;
    j.tiles.push_back(gemm_tile_str(t, false));
    j.lows.push_back(codegen::lower_gemm(s, caps, o));
  }
  const uint64_t batch = product_where(s.batch, std::vector<uint64_t>(s.batch.size(), 1));
  j.inputs = {s.m * s.k * product_where(s.batch, s.a_stride), s.k * s.n * product_where(s.batch, s.b_stride)};
  j.output = s.m * s.n * batch;
  return j;
}

// The conv node's lowering with each candidate tile; candidates that give the same program as an earlier one are
// dropped (a direct kernel ignores the tile; the heuristics may pick a candidate's tile themselves).
Job conv_job(const std::string& key, const ir::Graph& g, const ir::Node& n, const codegen::DeviceCaps& caps,
             const codegen::CodegenOptions& codegen) {
  Job j;
  j.key = key;
  j.kind = "conv";
  std::vector<std::string> programs;
  for (const ConvTile& t : codegen::conv_tune_candidates()) {
    codegen::CodegenOptions o = codegen;
    o.kernels.conv_tile = t;
    o.conv_tuned.clear();
    codegen::Lowering l;
    try {
      l = codegen::lower_node({g, n, caps, o});
    } catch (const Error&) {
      continue;  // not valid for this device
    }
    std::string program;
    for (const codegen::Kernel& k : l.kernels) program += k.glsl;
    if (std::find(programs.begin(), programs.end(), program) != programs.end()) continue;
    programs.push_back(program);
    j.tiles.push_back(conv_tile_str(t));
    j.lows.push_back(std::move(l));
  }
  for (int in : n.inputs) j.inputs.push_back(uint64_t(std::max<int64_t>(numel(g.node(in).shape), 1)));
  j.output = uint64_t(std::max<int64_t>(numel(n.shape), 1));
  return j;
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
    text += e.kind + " " + key + " " + e.tile + " " + ms_text(e.ms);
    for (const auto& [t, ms] : e.candidates) text += " " + t + "=" + ms_text(ms);
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
  std::map<std::string, const ir::Node*> convs;
  for (const ir::Node& n : g.nodes()) {
    const codegen::LowerContext lc{g, n, caps, codegen};
    if (n.op == ir::Op::MatMul) {
      const std::string key = codegen::tunable_gemm_key(lc);
      if (!key.empty()) shapes.emplace(key, codegen::matmul_shape(g, n));
    } else {
      const std::string key = codegen::tunable_conv_key(lc);
      if (!key.empty()) convs.emplace(key, &n);
    }
  }
  if (shapes.empty() && convs.empty()) {
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
  // A kept entry is used only where it is of the right kind and (gemm) still a valid, fully specified tile of
  // this shape and device; otherwise it is dropped (and measured again when measuring).
  auto kept = [&](const std::string& key, const std::string& kind, const std::function<bool(const std::string&)>& use) {
    auto it = entries.find(key);
    if (it == entries.end()) return false;
    if (it->second.kind == kind && use(it->second.tile)) {
      ++r.cached;
      return true;
    }
    entries.erase(it);
    changed = true;
    return false;
  };
  auto use_gemm = [&](const std::string& key, const codegen::GemmShape& s, const std::string& text) {
    try {
      const GemmTile t = parse_gemm_tile(text, false);
      if (codegen::resolve_simt_tile(s, caps, t) != t) return false;
      r.choices[key] = t;
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  auto use_conv = [&](const std::string& key, const std::string& text) {
    const ConvTile t = parse_conv_tile(text);
    if (!t.is_auto()) r.conv_choices[key] = t;
    return true;
  };
  // The shapes to measure: every candidate lowered, then all compiled at once, then timed one shape at a time.
  std::vector<Job> jobs;
  for (const auto& [key, s] : shapes) {
    const std::string& k = key;
    const codegen::GemmShape& sh = s;
    if (kept(k, "gemm", [&](const std::string& t) { return use_gemm(k, sh, t); }) || mode != TuneMode::Measure)
      continue;
    jobs.push_back(gemm_job(k, sh, caps));
  }
  for (const auto& [key, n] : convs) {
    const std::string& k = key;
    if (kept(k, "conv", [&](const std::string& t) { return use_conv(k, t); }) || mode != TuneMode::Measure) continue;
    jobs.push_back(conv_job(k, g, *n, caps, codegen));
  }
  Tuner tuner{ctx, alloc, transfer, pipelines, compiler};
  std::vector<Job> timed;
  for (Job& j : jobs) {
    if (j.tiles.empty() || !tuner.fits(j)) continue;  // the heuristics stay
    if (j.tiles.size() == 1) {  // one program: nothing to time
      GemmTuneEntry e;
      e.kind = j.kind;
      e.tile = j.tiles[0];
      if (j.kind == "gemm" ? use_gemm(j.key, shapes.at(j.key), e.tile) : use_conv(j.key, e.tile)) {
        ++r.measured;
        entries[j.key] = std::move(e);
        changed = true;
      }
      continue;
    }
    timed.push_back(std::move(j));
  }
  tuner.compile(timed);
  for (const Job& j : timed) {
    const std::vector<double> ms = tuner.time(j);
    GemmTuneEntry e;
    e.kind = j.kind;
    for (size_t c = 0; c < j.tiles.size(); ++c) e.candidates.push_back({j.tiles[c], ms[c]});
    // The fastest; on a tie the earlier candidate (the heuristics' choice comes first).
    size_t best = 0;
    for (size_t c = 1; c < ms.size(); ++c)
      if (ms[c] < ms[best]) best = c;
    e.tile = j.tiles[best];
    e.ms = ms[best];
    if (j.kind == "gemm" ? !use_gemm(j.key, shapes.at(j.key), e.tile) : !use_conv(j.key, e.tile)) continue;
    r.timed += j.tiles.size();
    ++r.measured;
    entries[j.key] = std::move(e);
    changed = true;
  }
  if (!timed.empty()) alloc.trim();  // the tuning buffers' memory blocks go back (the session's memory report)
  if (changed && mode == TuneMode::Measure && !path.empty()) (void)store_gemm_tuning(path, key_hex, ctx.info(), entries);
  r.ms = ms_since(t0);
  return r;
}

}  // namespace mgn::vk
