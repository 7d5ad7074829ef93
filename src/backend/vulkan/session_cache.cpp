// The compiled-session cache (session_cache.h): canonical key, entry format, verified load, atomic store.
#include "backend/vulkan/session_cache.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>

#include "codegen/shader_compiler.h"
#include <mgn_code_fingerprint.h>  // generated in the build tree (cmake/fingerprint.cmake)
#include "support/atomic_file.h"
#include "support/cache_folder.h"

namespace mgn::vk {
namespace {

// Bump when the entry layout, or what a lowering holds, changes.
constexpr uint32_t kFormat = 3;  // 2: GLSL stored once per distinct source; 3: counters
constexpr char kMagic[8] = {'M', 'G', 'N', 'S', 'E', 'S', 'S', '\0'};
constexpr uint64_t kMaxPayload = 1ull << 32;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

// Two independent 64-bit lanes over a byte stream, 8 bytes at a time (fast enough for constant tables).
class Hasher {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0) {
      if (fill_ == 0 && n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        word(w);
        p += 8;
        n -= 8;
        continue;
      }
      buf_[fill_++] = *p++;
      --n;
      if (fill_ == 8) {
        uint64_t w;
        std::memcpy(&w, buf_, 8);
        word(w);
        fill_ = 0;
      }
    }
  }
  template <typename T>
    requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  void pod(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    for (const T& x : v) pod(x);
  }
  SessionKey finish() {
    uint64_t tail = 0;
    std::memcpy(&tail, buf_, fill_);
    word(tail ^ (uint64_t(fill_) << 56));
    word(total_);
    return {avalanche(a_), avalanche(b_ ^ rotl(a_, 17))};
  }

 private:
  void word(uint64_t w) {
    a_ = rotl(a_ ^ (w * 0x9e3779b97f4a7c15ull), 31) * 0x87c37b91114253d5ull;
    b_ = rotl(b_ + (w ^ 0xc2b2ae3d27d4eb4full), 29) * 0x4cf5ad432745937full + 0x52dce729;
  }
  uint64_t a_ = 0x243f6a8885a308d3ull, b_ = 0x13198a2e03707344ull, total_ = 0;
  unsigned char buf_[8] = {};
  size_t fill_ = 0;
};

SessionKey checksum(std::string_view s) {
  Hasher h;
  h.bytes(s.data(), s.size());
  return h.finish();
}

// ---- binary writer / bounds-checked reader

class Writer {
 public:
  template <typename T>
    requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  void pod(T v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out_ += s;
  }
  void ints(const std::vector<int>& v) {
    pod<uint64_t>(v.size());
    for (int x : v) pod<int32_t>(x);
  }
  void words(const std::vector<uint32_t>& v) {
    pod<uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  std::string& text() { return out_; }

 private:
  std::string out_;
};

struct BadEntry {};

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  T pod() {
    T v;
    need(sizeof v);
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  uint64_t count(uint64_t each) {
    const uint64_t n = pod<uint64_t>();
    if (each && n > uint64_t(end_ - p_) / each) throw BadEntry{};
    return n;
  }
  std::string str() {
    const uint64_t n = count(1);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<int> ints() {
    std::vector<int> v(count(4));
    for (int& x : v) x = pod<int32_t>();
    return v;
  }
  std::vector<uint32_t> words() {
    std::vector<uint32_t> v(count(4));
    std::memcpy(v.data(), p_, v.size() * 4);
    p_ += v.size() * 4;
    return v;
  }
  bool done() const { return p_ == end_; }

 private:
  void need(size_t n) const {
    if (size_t(end_ - p_) < n) throw BadEntry{};
  }
  const char* p_;
  const char* end_;
};

std::string payload_of(const CompiledSession& s) {
  Writer w;
  w.pod<uint64_t>(s.fusions.size());
  for (const std::vector<int>& f : s.fusions) w.ints(f);
  w.pod<uint64_t>(s.spirv.size());
  for (const std::vector<uint32_t>& m : s.spirv) w.words(m);
  // Distinct GLSL once (the layers of a model share their kernels), then indices into it.
  std::unordered_map<std::string_view, uint32_t> glsl_index;
  std::vector<const std::string*> glsl;
  for (const CachedDispatch& d : s.dispatches)
    for (const codegen::Kernel& kern : d.lowering.kernels)
      if (glsl_index.emplace(kern.glsl, uint32_t(glsl.size())).second) glsl.push_back(&kern.glsl);
  w.pod<uint64_t>(glsl.size());
  for (const std::string* g : glsl) w.str(*g);
  w.pod<uint64_t>(s.dispatches.size());
  for (const CachedDispatch& d : s.dispatches) {
    w.ints(d.nodes);
    w.pod<uint64_t>(d.stored.size());
    for (bool b : d.stored) w.pod<uint8_t>(b);
    const codegen::Lowering& l = d.lowering;
    w.pod<uint8_t>(l.output_zero_filled);
    w.pod<uint64_t>(l.scratch_words.size());
    for (uint64_t x : l.scratch_words) w.pod(x);
    w.pod<uint64_t>(l.counter_words);
    w.pod<uint64_t>(l.kernels.size());
    for (size_t k = 0; k < l.kernels.size(); ++k) {
      const codegen::Kernel& kern = l.kernels[k];
      w.str(kern.name);
      w.pod<uint32_t>(glsl_index.at(kern.glsl));
      w.pod<uint64_t>(kern.bindings.size());
      for (const codegen::Binding& b : kern.bindings) {
        w.pod<uint8_t>(uint8_t(b.kind));
        w.pod<int32_t>(b.index);
        w.pod<uint8_t>(b.written);
        w.pod<int32_t>(b.node);
      }
      for (uint32_t g : kern.groups) w.pod(g);
      w.pod(kern.required_subgroup_size);
      w.pod<uint8_t>(kern.scalar_block_layout);
      w.pod<uint32_t>(d.spirv.at(k));
    }
  }
  return std::move(w.text());
}

CompiledSession parse_payload(const char* p, size_t n) {
  Reader r(p, n);
  CompiledSession s;
  s.fusions.resize(r.count(8));
  for (auto& f : s.fusions) f = r.ints();
  s.spirv.resize(r.count(8));
  for (auto& m : s.spirv) {
    m = r.words();
    if (m.empty()) throw BadEntry{};
  }
  std::vector<std::string> glsl(r.count(8));
  for (std::string& g : glsl) g = r.str();
  s.dispatches.resize(r.count(8));
  for (CachedDispatch& d : s.dispatches) {
    d.nodes = r.ints();
    d.stored.resize(r.count(1));
    for (size_t i = 0; i < d.stored.size(); ++i) d.stored[i] = r.pod<uint8_t>() != 0;
    codegen::Lowering& l = d.lowering;
    l.output_zero_filled = r.pod<uint8_t>() != 0;
    l.scratch_words.resize(r.count(8));
    for (uint64_t& x : l.scratch_words) x = r.pod<uint64_t>();
    l.counter_words = r.pod<uint64_t>();
    if (l.counter_words > (uint64_t(1) << 32)) throw BadEntry{};
    l.kernels.resize(r.count(16));
    for (codegen::Kernel& kern : l.kernels) {
      kern.name = r.str();
      const uint32_t gi = r.pod<uint32_t>();
      if (gi >= glsl.size()) throw BadEntry{};
      kern.glsl = glsl[gi];
      kern.bindings.resize(r.count(10));
      for (codegen::Binding& b : kern.bindings) {
        const uint8_t kind = r.pod<uint8_t>();
        if (kind > uint8_t(codegen::BindingKind::Counters)) throw BadEntry{};
        b.kind = codegen::BindingKind(kind);
        b.index = r.pod<int32_t>();
        b.written = r.pod<uint8_t>() != 0;
        b.node = r.pod<int32_t>();
      }
      for (uint32_t& g : kern.groups) g = r.pod<uint32_t>();
      kern.required_subgroup_size = r.pod<uint32_t>();
      kern.scalar_block_layout = r.pod<uint8_t>() != 0;
      const uint32_t idx = r.pod<uint32_t>();
      if (idx >= s.spirv.size()) throw BadEntry{};
      d.spirv.push_back(idx);
    }
  }
  if (!r.done()) throw BadEntry{};
  return s;
}

std::string entry_path(const std::string& cache_dir, const SessionKey& key) {
  return (std::filesystem::path(session_cache_folder(cache_dir)) / (key.hex() + kSessionSuffix)).string();
}

}  // namespace

std::string SessionKey::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buf;
}

const char* cache_result_name(CacheResult r) {
  switch (r) {
    case CacheResult::Off:
      return "off";
    case CacheResult::Miss:
      return "miss";
    case CacheResult::Hit:
      return "hit";
    case CacheResult::Corrupt:
      return "corrupt";
  }
  return "?";
}

std::string session_cache_folder(const std::string& cache_dir) {
  return (std::filesystem::path(cache_dir) / "sessions").string();
}

// The device's identity and driver build (both keys below).
static void hash_device(Hasher& h, const DeviceInfo& device) {
  h.pod(device.vendor_id);
  h.pod(device.device_id);
  h.pod(device.api_version);
  h.str(device.name);
  h.str(device.driver);
  h.bytes(device.pipeline_cache_uuid.data(), device.pipeline_cache_uuid.size());
}

SessionKey device_build_key(const DeviceInfo& device, const std::string& what) {
  Hasher h;
  h.str("device-build key 1");
  h.str(codegen::ShaderCompiler::compiler_version());
  h.str(MGN_CODE_FINGERPRINT);
  hash_device(h, device);
  h.str(what);
  return h.finish();
}

SessionKey device_key(const DeviceInfo& device, const std::string& what) {
  Hasher h;
  h.str("device key 1");
  hash_device(h, device);
  h.str(what);
  return h.finish();
}

SessionKey session_key(const ir::Graph& g, const codegen::DeviceCaps& caps, const codegen::CodegenOptions& codegen,
                       const plan::PlanOptions& plan, const DeviceInfo& device) {
  Hasher h;
  h.pod<uint32_t>(kFormat);
  h.str(codegen::ShaderCompiler::compiler_version());
  h.str(MGN_CODE_FINGERPRINT);  // this build's generators (cmake/fingerprint.cmake)
  // The device: identity and driver build, then the caps the generators read.
  hash_device(h, device);
  h.pod(caps.subgroup_size);
  h.pod(caps.max_shared_bytes);
  h.pod(caps.max_workgroup_invocations);
  for (uint32_t c : caps.max_workgroup_count) h.pod(c);
  h.pod(caps.max_storage_buffer_range);
  h.pod(caps.cooperative_matrix_nv);
  h.pod(caps.max_storage_buffers);
  h.pod(caps.coopmat_f16_verified);
  h.pod(caps.coopmat_mma.m);
  h.pod(caps.coopmat_mma.n);
  h.pod(caps.coopmat_mma.k);
  // The options that reach the generators and the planner's decisions.
  const KernelOptions& k = codegen.kernels;
  h.pod(codegen.default_precision);
  h.pod(k.fusion);
  h.pod(k.gemm_epilogue);
  h.pod(k.gemm_siblings);
  h.pod(k.gemm_splitk_fixup);
  h.pod(k.gemm_k_vec4);
  h.pod(k.attention);
  h.pod(k.gemm);
  for (const GemmTile& t : {k.gemm_tile, k.f16_tile})
    for (uint32_t v : {t.bm, t.bn, t.bk, t.tm, t.tn, t.lx, t.ly, t.wm, t.wn, t.group_m, t.splits}) h.pod(v);
  h.pod(k.f16_gemm);
  h.pod(k.f16_min_work);
  h.pod(k.f16_min_dim);
  h.pod(k.f16_operand_scaling);
  h.pod(k.f16_ablation);
  h.pod(k.conv_tile.bp);
  h.pod(k.conv_tile.bq);
  h.pod(k.conv_tile.bk);
  h.pod(k.conv_splits);
  h.pod(k.spirv_optimize);
  // Measured kernel choices (docs/tuning.md).
  h.pod<uint64_t>(codegen.gemm_tuned.size());
  for (const auto& [key, t] : codegen.gemm_tuned) {
    h.str(key);
    for (uint32_t v : {t.bm, t.bn, t.bk, t.tm, t.tn, t.lx, t.ly, t.wm, t.wn, t.group_m, t.splits}) h.pod(v);
  }
  h.pod<uint64_t>(codegen.conv_tuned.size());
  for (const auto& [key, t] : codegen.conv_tuned) {
    h.str(key);
    for (uint32_t v : {t.bp, t.bq, t.bk}) h.pod(v);
  }
  h.pod(plan.in_place);
  h.pod(plan.in_place_assign);
  h.pod(plan.reuse);
  h.pod(plan.sink);
  h.vec(plan.pinned);
  // The graph, node by node.
  h.pod<uint64_t>(g.nodes().size());
  for (const ir::Node& n : g.nodes()) {
    h.pod(n.op);
    h.vec(n.inputs);
    h.vec(n.shape);
    h.pod(n.dtype);
    h.pod<int8_t>(n.precision ? int8_t(*n.precision) : int8_t(-1));
    h.str(n.name);
    h.pod(n.trainable);
    h.pod<uint64_t>(n.attrs.items().size());
    for (const auto& [name, value] : n.attrs.items()) {
      h.str(name);
      h.pod<uint64_t>(value.index());
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::string>) h.str(v);
            else if constexpr (std::is_same_v<T, std::vector<int64_t>>) h.vec(v);
            else h.pod(v);
          },
          value);
    }
    if (n.data) {
      h.pod<uint64_t>(n.data->size());
      h.bytes(n.data->data(), n.data->size() * sizeof(double));
    } else {
      h.pod<uint64_t>(~0ull);
    }
  }
  h.pod<uint64_t>(g.outputs().size());
  for (const auto& [name, id] : g.outputs()) {
    h.str(name);
    h.pod(id);
  }
  h.vec(g.assigns());
  return h.finish();
}

CacheResult load_session(const std::string& cache_dir, const SessionKey& key, CompiledSession* out) {
  if (cache_dir.empty()) return CacheResult::Off;
  const std::string path = entry_path(cache_dir, key);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return CacheResult::Miss;
  // One read of the whole file (an istreambuf_iterator loop ran at ~150 MB/s: 40 ms of a 5.5 MB entry).
  const std::streamoff size = in.tellg();
  std::string data(size > 0 ? size_t(size) : 0, '\0');
  in.seekg(0);
  if (size > 0 && !in.read(data.data(), size)) data.clear();  // unreadable: treated as corrupt below
  in.close();
  constexpr size_t kHeader = 8 + 4 + 4 + 16 + 8 + 16;
  bool ok = data.size() >= kHeader && std::memcmp(data.data(), kMagic, 8) == 0;
  if (ok) {
    Reader h(data.data() + 8, kHeader - 8);
    const uint32_t format = h.pod<uint32_t>();
    (void)h.pod<uint32_t>();
    const uint64_t ka = h.pod<uint64_t>(), kb = h.pod<uint64_t>();
    const uint64_t bytes = h.pod<uint64_t>();
    const uint64_t ca = h.pod<uint64_t>(), cb = h.pod<uint64_t>();
    ok = format == kFormat && ka == key.a && kb == key.b && bytes <= kMaxPayload && bytes == data.size() - kHeader;
    if (ok) {
      const SessionKey sum = checksum(std::string_view(data).substr(kHeader));
      ok = sum.a == ca && sum.b == cb;
    }
    if (ok) {
      try {
        *out = parse_payload(data.data() + kHeader, data.size() - kHeader);
      } catch (const BadEntry&) {
        ok = false;
      }
    }
  }
  if (!ok) {
    std::error_code ec;
    std::filesystem::remove(path, ec);  // never trusted; this compile writes a good one
    return CacheResult::Corrupt;
  }
  files::touch(path);
  return CacheResult::Hit;
}

void store_session(const std::string& cache_dir, const SessionKey& key, const CompiledSession& entry,
                   uint64_t max_bytes) {
  if (cache_dir.empty()) return;
  const std::string payload = payload_of(entry);
  const SessionKey sum = checksum(payload);
  Writer head;
  head.text().append(kMagic, 8);
  head.pod<uint32_t>(kFormat);
  head.pod<uint32_t>(0);
  head.pod(key.a);
  head.pod(key.b);
  head.pod<uint64_t>(payload.size());
  head.pod(sum.a);
  head.pod(sum.b);
  const std::string folder = session_cache_folder(cache_dir);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return;
  const std::string path = entry_path(cache_dir, key);
  const std::string err = files::try_write_atomic(path, [&](int fd) {
    return files::write_all(fd, head.text().data(), head.text().size()) &&
           files::write_all(fd, payload.data(), payload.size());
  });
  if (err.empty()) files::evict_lru(folder, kSessionSuffix, max_bytes, path);
}

}  // namespace mgn::vk
