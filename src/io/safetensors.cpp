// safetensors reader/writer. The header is JSON parsed with nlohmann::json; every field is checked before
// any tensor is touched, so a malformed or truncated file is an error, never a crash.
#include "mgn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/atomic_file.h"

namespace mgn {

namespace {

struct TagInfo {
  const char* tag;
  size_t size;
};
constexpr TagInfo kTags[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
                             {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}};

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double element(const StoredTensor& t, int64_t i) {
  const uint8_t* p = t.bytes.data() + size_t(i) * safetensors_dtype_size(t.dtype);
  const std::string& d = t.dtype;
  if (d == "F32") return load<float>(p);
  if (d == "F64") return load<double>(p);
  if (d == "F16") return half_to_float(load<uint16_t>(p));
  if (d == "BF16") return bf16_to_float(load<uint16_t>(p));
  if (d == "I64") return double(load<int64_t>(p));
  if (d == "I32") return load<int32_t>(p);
  if (d == "I16") return load<int16_t>(p);
  if (d == "I8") return load<int8_t>(p);
  if (d == "U8") return *p;
  if (d == "BOOL") return *p ? 1.0 : 0.0;
  throw Error("tensor '" + t.name + "': unsupported dtype " + d);
}

}  // namespace

size_t safetensors_dtype_size(const std::string& tag) {
  for (const TagInfo& t : kTags)
    if (tag == t.tag) return t.size;
  throw Error("unknown safetensors dtype '" + tag + "'");
}

std::vector<float> StoredTensor::to_f32() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (dtype == "F32") {
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * 4);  // an empty vector's data() may be null
    return v;
  }
  for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = float(element(*this, i));
  return v;
}

std::vector<double> StoredTensor::to_f64() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = element(*this, i);
  return v;
}

std::vector<int32_t> StoredTensor::to_i32() const {
  if (dtype != "I32" && dtype != "I64" && dtype != "I16" && dtype != "I8" && dtype != "U8" && dtype != "BOOL")
    throw Error("tensor '" + name + "' has dtype " + dtype + ", expected an integer tensor");
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) {
    double x = element(*this, i);
    if (x < -2147483648.0 || x > 2147483647.0) {  // printed as a double: it may be past int64's range too
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", x);
      throw Error("tensor '" + name + "': value " + text + " does not fit in i32");
    }
    v[size_t(i)] = int32_t(x);
  }
  return v;
}

StoredTensor StoredTensor::from_f32(const std::string& name, const Shape& shape, const std::vector<float>& v,
                                    DType as) {
  if (int64_t(v.size()) != mgn::numel(shape))
    throw Error("tensor '" + name + "': " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  StoredTensor t{name, "F32", shape, {}};
  if (as == DType::F32) {
    t.bytes.resize(v.size() * 4);
    if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  } else if (as == DType::F16 || as == DType::BF16) {
    t.dtype = as == DType::F16 ? "F16" : "BF16";
    t.bytes.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h = as == DType::F16 ? float_to_half(v[i]) : float_to_bf16(v[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  } else {
    throw Error("tensor '" + name + "': cannot store float values as " + dtype_name(as));
  }
  return t;
}

StoredTensor StoredTensor::from_f64(const std::string& name, const Shape& shape, const std::vector<double>& v) {
  if (int64_t(v.size()) != mgn::numel(shape))
    throw Error("tensor '" + name + "': " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  StoredTensor t{name, "F64", shape, std::vector<uint8_t>(v.size() * 8)};
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

StoredTensor StoredTensor::from_i32(const std::string& name, const Shape& shape, const std::vector<int32_t>& v) {
  if (int64_t(v.size()) != mgn::numel(shape))
    throw Error("tensor '" + name + "': " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  StoredTensor t{name, "I32", shape, std::vector<uint8_t>(v.size() * 4)};
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

namespace {

struct Entry {
  StoredTensor tensor;  // bytes still empty
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in data order
  std::map<std::string, std::string> metadata;
};

// Validates the JSON header against the size of the data section that follows it: every tensor's dtype, shape
// and byte range, no overlap, no gap and nothing after the last tensor (what the format's reference reader
// demands too), so a truncated or damaged file is reported before any tensor is read.
Header parse_header(const char* text, uint64_t hlen, uint64_t data_size, const std::string& origin) {
  auto fail = [&](const std::string& msg) -> Error { return Error("safetensors '" + origin + "': " + msg); };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + hlen);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header must be a JSON object");
  Header out;
  std::map<std::string, bool> seen;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw fail("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& msg) { return fail("tensor '" + key + "': " + msg); };
    if (!v.is_object()) throw bad("entry needs dtype, shape and data_offsets");
    auto dt = v.find("dtype"), sh = v.find("shape"), off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end()) throw bad("entry needs dtype, shape and data_offsets");
    if (!dt->is_string()) throw bad("dtype must be a string");
    Entry e;
    StoredTensor& t = e.tensor;
    t.name = key;
    t.dtype = dt->get<std::string>();
    size_t esize;
    try {
      esize = safetensors_dtype_size(t.dtype);
    } catch (const Error&) {
      throw bad("unknown dtype '" + t.dtype + "'");
    }
    if (!sh->is_array() || sh->size() > 8) throw bad("shape must be an array of at most 8 sizes");
    uint64_t count = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && count > (1ull << 50) / dim)) throw bad("shape is implausibly large");
      count *= dim;
      t.shape.push_back(int64_t(dim));
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      throw bad("data_offsets must be [begin, end]");
    e.begin = (*off)[0].get<uint64_t>(), e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      throw bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] fall outside the " +
                std::to_string(data_size) + "-byte data section: truncated or damaged file");
    if (e.end - e.begin != count * esize)
      throw bad("holds " + std::to_string(e.end - e.begin) + " bytes, but " + t.dtype + shape_str(t.shape) +
                " needs " + std::to_string(count * esize));
    out.entries.push_back(std::move(e));
  }
  // File order = data order, as the writer lays them out.
  std::stable_sort(out.entries.begin(), out.entries.end(),
                   [](const Entry& x, const Entry& y) { return x.begin < y.begin; });
  uint64_t at = 0;
  for (size_t i = 0; i < out.entries.size(); ++i) {
    const Entry& e = out.entries[i];
    if (i && e.begin < out.entries[i - 1].end)
      throw fail("tensors '" + out.entries[i - 1].tensor.name + "' and '" + e.tensor.name + "' overlap");
    if (e.begin != at)
      throw fail("damaged: " + std::to_string(e.begin - at) + " bytes before tensor '" + e.tensor.name +
                 "' belong to no tensor");
    at = e.end;
  }
  if (at != data_size)
    throw fail("damaged: the data section is " + std::to_string(data_size) + " bytes, the tensors end at " +
               std::to_string(at));
  return out;
}

void assemble(Header h, std::map<std::string, size_t>* index, std::vector<StoredTensor>* tensors,
              std::map<std::string, std::string>* metadata) {
  *metadata = std::move(h.metadata);
  for (Entry& e : h.entries) {
    (*index)[e.tensor.name] = tensors->size();
    tensors->push_back(std::move(e.tensor));
  }
}

// Positioned reads of an open file: the header is read without touching the tensors, and each tensor goes
// straight into its own buffer (no image of the whole file).
struct File {
  int fd = -1;
  std::string path;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  void read_at(void* dst, uint64_t n, uint64_t offset) const {
    char* p = static_cast<char*>(dst);
    while (n) {
      ssize_t r = ::pread(fd, p, n > (1u << 30) ? (1u << 30) : size_t(n), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error("cannot read safetensors file '" + path + "': " + std::strerror(errno));
      if (r == 0) throw Error("safetensors '" + path + "': the file ended early (truncated while reading?)");
      p += r, n -= uint64_t(r), offset += uint64_t(r);
    }
  }
};

}  // namespace

SafetensorsFile SafetensorsFile::read_impl(const std::string& path, const SafetensorsLimits& limits,
                                           bool with_data) {
  File f;
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw Error("cannot read safetensors file '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error("safetensors '" + path + "' is a folder, expected a file");
  if (!S_ISREG(st.st_mode)) throw Error("safetensors '" + path + "' is not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  if (with_data && size > limits.max_file_bytes)
    throw Error("safetensors file '" + path + "' is " + std::to_string(size) + " bytes, over the limit of " +
                std::to_string(limits.max_file_bytes));
  auto fail = [&](const std::string& msg) -> Error { return Error("safetensors '" + path + "': " + msg); };
  if (size < 8) throw fail("file is " + std::to_string(size) + " bytes, too short for a header");
  uint64_t hlen = 0;
  f.read_at(&hlen, 8, 0);
  if (hlen > limits.max_header_bytes)
    throw fail("header length " + std::to_string(hlen) + " exceeds the limit of " +
               std::to_string(limits.max_header_bytes) + " bytes");
  if (hlen > size - 8)
    throw fail("header length " + std::to_string(hlen) + " runs past the end of the file (" + std::to_string(size) +
               " bytes): truncated?");
  std::string text(size_t(hlen), '\0');
  f.read_at(text.data(), hlen, 8);
  Header h = parse_header(text.data(), hlen, size - 8 - hlen, path);
  SafetensorsFile out;
  out.origin_ = path;
  if (with_data)
    for (Entry& e : h.entries) {
      e.tensor.bytes.resize(size_t(e.end - e.begin));
      f.read_at(e.tensor.bytes.data(), e.end - e.begin, 8 + hlen + e.begin);
    }
  assemble(std::move(h), &out.index_, &out.tensors_, &out.metadata_);
  return out;
}

SafetensorsFile SafetensorsFile::read(const std::string& path, const SafetensorsLimits& limits) {
  return read_impl(path, limits, true);
}

SafetensorsFile SafetensorsFile::read_header(const std::string& path, const SafetensorsLimits& limits) {
  return read_impl(path, limits, false);
}

SafetensorsFile SafetensorsFile::parse(const std::vector<uint8_t>& image, const std::string& origin,
                                       const SafetensorsLimits& limits) {
  auto fail = [&](const std::string& msg) -> Error { return Error("safetensors '" + origin + "': " + msg); };
  if (image.size() < 8) throw fail("file is " + std::to_string(image.size()) + " bytes, too short for a header");
  uint64_t hlen = load<uint64_t>(image.data());
  if (hlen > limits.max_header_bytes)
    throw fail("header length " + std::to_string(hlen) + " exceeds the limit of " +
               std::to_string(limits.max_header_bytes) + " bytes");
  if (hlen > image.size() - 8)
    throw fail("header length " + std::to_string(hlen) + " runs past the end of the file (" +
               std::to_string(image.size()) + " bytes): truncated?");
  Header h = parse_header(reinterpret_cast<const char*>(image.data()) + 8, hlen, image.size() - 8 - hlen, origin);
  const uint8_t* data = image.data() + 8 + hlen;
  for (Entry& e : h.entries) e.tensor.bytes.assign(data + e.begin, data + e.end);
  SafetensorsFile out;
  out.origin_ = origin;
  assemble(std::move(h), &out.index_, &out.tensors_, &out.metadata_);
  return out;
}

const StoredTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const StoredTensor& SafetensorsFile::get(const std::string& name) const {
  const StoredTensor* t = find(name);
  if (!t) throw Error("safetensors '" + origin_ + "' has no tensor named '" + name + "'");
  return *t;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> r;
  for (const StoredTensor& t : tensors_) r.push_back(t.name);
  return r;
}

void write_safetensors(const std::string& path, const std::vector<StoredTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const StoredTensor& t : tensors) {
    size_t es = safetensors_dtype_size(t.dtype);
    if (uint64_t(t.bytes.size()) != uint64_t(t.numel()) * es)
      throw Error("write_safetensors: tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                  " bytes for " + t.dtype + shape_str(t.shape));
    if (header.contains(t.name)) throw Error("write_safetensors: tensor '" + t.name + "' is listed twice");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // align the data section to 8 bytes
  const uint64_t hlen = h.size();
  // Stale temp files of killed saves are removed first; the folder is synced after the rename.
  files::write_atomic(path, [&](int fd) {
    bool ok = files::write_all(fd, &hlen, 8) && files::write_all(fd, h.data(), h.size());
    for (const StoredTensor& t : tensors) ok = ok && files::write_all(fd, t.bytes.data(), t.bytes.size());
    return ok;
  });
}

}  // namespace mgn
