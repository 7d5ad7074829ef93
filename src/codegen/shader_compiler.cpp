// GLSL → SPIR-V with shaderc (glslang + spirv-opt), validated by SPIRV-Tools, cached in memory and on disk.
// Cache files hold the full key text, so a hash collision can never hand back the wrong kernel.
#include "codegen/shader_compiler.h"

#include <glslang/build_info.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <string_view>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <shaderc/shaderc.hpp>
#include <spirv-tools/libspirv.hpp>
#include <sstream>

#include "mgn/types.h"
#include "support/atomic_file.h"

namespace mgn::codegen {
namespace {

// Bump when the cache file layout or the meaning of an option changes.
// 2: the kernel's name is part of the key only with debug info (otherwise it never reaches the SPIR-V), so
// identical kernels of different nodes and sessions share one entry.
// 3: the source in the key is canonical (canonical_glsl).
constexpr uint32_t kCacheFormat = 3;
constexpr char kCacheMagic[8] = {'M', 'G', 'N', 'S', 'P', 'V', '1', '\0'};

// The exact input of a compile, as text: version, options, source.
std::string cache_key(const std::string& glsl, const ShaderOptions& o) {
  std::ostringstream k;
  k << ShaderCompiler::compiler_version() << "\nopt=" << o.optimize << " dbg=" << o.debug_info
    << " scalar=" << o.scalar_block_layout;
  if (o.debug_info) k << " name=" << o.name;
  k << "\n";
  for (const auto& [name, value] : o.defines) k << "-D" << name << "=" << value << "\n";
  k << "--\n" << (o.debug_info ? glsl : canonical_glsl(glsl));
  return k.str();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::filesystem::path cache_path(const std::string& dir, const std::string& key) {
  // Two independent 64-bit hashes: file names collide only at 2^64 kernels, and content is checked anyway.
  const uint64_t a = fnv1a64(key.data(), key.size());
  const uint64_t b = fnv1a64(key.data(), key.size(), 0x84222325cbf29ce4ull);
  return std::filesystem::path(dir) / "spirv" / (hex(a) + hex(b) + ".spv");
}

bool load_cached(const std::filesystem::path& path, const std::string& key, std::vector<uint32_t>* words) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[8];
  uint64_t key_len = 0, n_words = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, kCacheMagic, 8) != 0) return false;
  if (!in.read(reinterpret_cast<char*>(&key_len), 8) || key_len != key.size()) return false;
  std::string stored(key_len, '\0');
  if (!in.read(stored.data(), static_cast<std::streamsize>(key_len)) || stored != key) return false;
  if (!in.read(reinterpret_cast<char*>(&n_words), 8) || n_words == 0 || n_words > (1u << 28)) return false;
  words->resize(n_words);
  return static_cast<bool>(
      in.read(reinterpret_cast<char*>(words->data()), static_cast<std::streamsize>(n_words * 4)));
}

// Best effort: a read-only or full cache directory only costs a recompile next time.
void store_cached(const std::filesystem::path& path, const std::string& key,
                  const std::vector<uint32_t>& words) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return;
  // Temp file + rename so a concurrent reader (another process compiling the same kernel) never sees half a file.
  const uint64_t key_len = key.size(), n_words = words.size();
  (void)files::try_write_atomic(path.string(), [&](int fd) {
    return files::write_all(fd, kCacheMagic, 8) && files::write_all(fd, &key_len, 8) &&
           files::write_all(fd, key.data(), key.size()) && files::write_all(fd, &n_words, 8) &&
           files::write_all(fd, words.data(), words.size() * 4);
  });
}

[[noreturn]] void fail(const char* what, const ShaderOptions& o, const std::string& glsl,
                       const std::string& msg) {
  std::ostringstream e;
  e << what << " for kernel '" << o.name << "':\n" << msg;
  if (!msg.empty() && msg.back() != '\n') e << "\n";
  if (!o.defines.empty()) {
    e << "defines:";
    for (const auto& [n, v] : o.defines) e << " " << n << "=" << v;
    e << "\n";
  }
  e << "--- source ---\n" << number_lines(glsl);
  throw Error(e.str());
}

void validate(const std::vector<uint32_t>& words, const ShaderOptions& o, const std::string& glsl) {
  spvtools::SpirvTools tools(SPV_ENV_VULKAN_1_2);
  std::string messages;
  tools.SetMessageConsumer([&](spv_message_level_t, const char*, const spv_position_t& pos, const char* m) {
    messages += "spirv-val: word " + std::to_string(pos.index) + ": " + m + "\n";
  });
  spvtools::ValidatorOptions vo;
  vo.SetScalarBlockLayout(o.scalar_block_layout);
  if (!tools.Validate(words.data(), words.size(), vo)) {
    // The disassembly points at the instruction; the GLSL alone often does not explain a validator error.
    std::string disasm;
    if (tools.Disassemble(words, &disasm, SPV_BINARY_TO_TEXT_OPTION_FRIENDLY_NAMES)) messages += disasm;
    fail("SPIR-V validation failed", o, glsl, messages);
  }
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string canonical_glsl(const std::string& glsl) {
  auto ident_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
  auto ident_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  static const char* const kPrefixes[] = {"in_x", "out_v", "idx_x", "x", "v"};
  std::map<std::string, size_t> ids;  // node id as written -> its number in order of first appearance
  std::string out;
  out.reserve(glsl.size());
  const size_t n = glsl.size();
  size_t i = 0;
  while (i < n) {
    const char c = glsl[i];
    if (c == '/' && i + 1 < n && glsl[i + 1] == '/') {  // line comment: dropped (the newline stays)
      while (i < n && glsl[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && glsl[i + 1] == '*') {  // block comment: one space
      const size_t end = glsl.find("*/", i + 2);
      i = end == std::string::npos ? n : end + 2;
      out += ' ';
    } else if (ident_start(c)) {
      size_t j = i;
      while (j < n && ident_char(glsl[j])) ++j;
      const std::string_view tok(glsl.data() + i, j - i);
      bool renamed = false;
      for (const char* p : kPrefixes) {
        const std::string_view prefix(p);
        if (tok.size() <= prefix.size() || tok.substr(0, prefix.size()) != prefix) continue;
        const std::string_view digits = tok.substr(prefix.size());
        if (!std::all_of(digits.begin(), digits.end(), [](char d) { return d >= '0' && d <= '9'; })) continue;
        const size_t id = ids.emplace(std::string(digits), ids.size()).first->second;
        out += prefix;
        out += '#';  // cannot occur in an identifier: a renamed token never meets an original one
        out += std::to_string(id);
        renamed = true;
        break;
      }
      if (!renamed) out += tok;
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {  // a number, with its suffixes and exponent
      size_t j = i;
      while (j < n && (ident_char(glsl[j]) || glsl[j] == '.')) ++j;
      out.append(glsl, i, j - i);
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string number_lines(const std::string& source) {
  std::ostringstream out;
  std::istringstream in(source);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    char num[16];
    std::snprintf(num, sizeof num, "%4d | ", n);
    out << num << line << "\n";
  }
  return out.str();
}

std::string ShaderCompiler::compiler_version() {
  unsigned spv_version = 0, spv_revision = 0;
  shaderc_get_spv_version(&spv_version, &spv_revision);
  std::ostringstream v;
  v << "mgn-cache" << kCacheFormat << " shaderc-spv" << spv_version << "." << spv_revision << " glslang"
    << GLSLANG_VERSION_MAJOR << "." << GLSLANG_VERSION_MINOR << "." << GLSLANG_VERSION_PATCH
    << " spirv-tools:" << spvSoftwareVersionDetailsString() << " env=vk1.2/spv1.5";
  return v.str();
}

namespace {

// glslang's built-in symbol tables (every built-in function and variable, parsed from GLSL text for each version
// and stage) live from glslang::InitializeProcess to FinalizeProcess, and shaderc runs those as its first compiler
// object is made and its last one destroyed. A compiler made and dropped per kernel therefore re-parses them every
// time: 52 ms for a 1.9 KB kernel against 5.9 ms when another compiler object stays alive (Debian 12's shaderc,
// docs/perf-notes.md 2026-12-07). This one stays alive for the process.
void keep_glslang_initialized() {
  static const shaderc::Compiler keep;
  (void)keep;
}

}  // namespace

ShaderCompiler::ShaderCompiler(std::string cache_dir) : cache_dir_(std::move(cache_dir)) {
  keep_glslang_initialized();
}

void ShaderCompiler::warm_up() {
  keep_glslang_initialized();
  shaderc::Compiler compiler;
  shaderc::CompileOptions co;
  co.SetSourceLanguage(shaderc_source_language_glsl);
  co.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
  co.SetTargetSpirv(shaderc_spirv_version_1_5);
  co.SetOptimizationLevel(shaderc_optimization_level_zero);
  const char* glsl = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
  (void)compiler.CompileGlslToSpv(glsl, shaderc_compute_shader, "warm_up", "main", co);
}

ShaderCompiler::Stats ShaderCompiler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

SpirV ShaderCompiler::compile(const std::string& glsl, const ShaderOptions& options) {
  const std::string key = cache_key(glsl, options);
  {
    std::lock_guard lock(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }

  SpirV result;
  bool from_disk = false;
  std::filesystem::path path;
  if (!cache_dir_.empty()) {
    path = cache_path(cache_dir_, key);
    from_disk = load_cached(path, key, &result.words);
  }
  double compile_ms = 0, validate_ms = 0;
  if (!from_disk) {
    const auto t0 = std::chrono::steady_clock::now();
    // Compiled outside the lock: glslang takes milliseconds per kernel and sessions compile many.
    shaderc::Compiler compiler;
    shaderc::CompileOptions co;
    co.SetSourceLanguage(shaderc_source_language_glsl);
    co.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
    co.SetTargetSpirv(shaderc_spirv_version_1_5);
    co.SetOptimizationLevel(options.optimize ? shaderc_optimization_level_performance
                                             : shaderc_optimization_level_zero);
    if (options.debug_info) co.SetGenerateDebugInfo();
    for (const auto& [name, value] : options.defines) co.AddMacroDefinition(name, value);
    const auto r = compiler.CompileGlslToSpv(glsl, shaderc_compute_shader, options.name.c_str(), "main", co);
    if (r.GetCompilationStatus() != shaderc_compilation_status_success)
      fail("GLSL compile failed", options, glsl, r.GetErrorMessage());
    result.words.assign(r.cbegin(), r.cend());
    const auto t1 = std::chrono::steady_clock::now();
    validate(result.words, options, glsl);
    compile_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    validate_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    if (!cache_dir_.empty()) store_cached(path, key, result.words);
  }
  result.hash = fnv1a64(result.words.data(), result.words.size() * 4);

  std::lock_guard lock(mutex_);
  ++(from_disk ? stats_.disk_hits : stats_.compiled);
  stats_.compile_ms += compile_ms;
  stats_.validate_ms += validate_ms;
  memory_.emplace(key, result);
  return result;
}

}  // namespace mgn::codegen
