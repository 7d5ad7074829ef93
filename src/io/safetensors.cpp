// safetensors reader/writer. The header is JSON parsed with nlohmann::json; every field is checked before
// any tensor is touched, so a malformed or truncated file is an error, never a crash.
#include "mgn/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

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
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
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
    if (x < -2147483648.0 || x > 2147483647.0)
      throw Error("tensor '" + name + "': value " + std::to_string(int64_t(x)) + " does not fit in i32");
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
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
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
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

StoredTensor StoredTensor::from_i32(const std::string& name, const Shape& shape, const std::vector<int32_t>& v) {
  if (int64_t(v.size()) != mgn::numel(shape))
    throw Error("tensor '" + name + "': " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  StoredTensor t{name, "I32", shape, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

SafetensorsFile SafetensorsFile::read(const std::string& path, const SafetensorsLimits& limits) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error("cannot open safetensors file '" + path + "'");
  std::streamoff size = f.tellg();
  if (size < 0) throw Error("cannot read safetensors file '" + path + "'");
  if (uint64_t(size) > limits.max_file_bytes)
    throw Error("safetensors file '" + path + "' is " + std::to_string(size) + " bytes, over the limit of " +
                std::to_string(limits.max_file_bytes));
  std::vector<uint8_t> image(static_cast<size_t>(size));
  f.seekg(0);
  if (size && !f.read(reinterpret_cast<char*>(image.data()), size))
    throw Error("cannot read safetensors file '" + path + "'");
  return parse(image, path, limits);
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
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(image.begin() + 8, image.begin() + 8 + std::ptrdiff_t(hlen));
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header must be a JSON object");
  uint64_t data_size = image.size() - 8 - hlen;
  const uint8_t* data = image.data() + 8 + hlen;

  SafetensorsFile out;
  out.origin_ = origin;
  struct Span {
    uint64_t b, e;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw fail("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& msg) { return fail("tensor '" + key + "': " + msg); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw bad("entry needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) throw bad("dtype must be a string");
    StoredTensor t;
    t.name = key;
    t.dtype = v["dtype"].get<std::string>();
    size_t esize;
    try {
      esize = safetensors_dtype_size(t.dtype);
    } catch (const Error&) {
      throw bad("unknown dtype '" + t.dtype + "'");
    }
    if (!v["shape"].is_array() || v["shape"].size() > 8) throw bad("shape must be an array of at most 8 sizes");
    uint64_t count = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && count > (1ull << 50) / dim)) throw bad("shape is implausibly large");
      count *= dim;
      t.shape.push_back(int64_t(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be [begin, end]");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      throw bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] fall outside the " +
                std::to_string(data_size) + "-byte data section");
    if (e - b != count * esize)
      throw bad("holds " + std::to_string(e - b) + " bytes, but " + t.dtype + shape_str(t.shape) + " needs " +
                std::to_string(count * esize));
    t.bytes.assign(data + b, data + e);
    spans.push_back({b, e, key});
    out.index_[key] = out.tensors_.size();
    out.tensors_.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.b < y.b; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].b < spans[i - 1].e)
      throw fail("tensors '" + spans[i - 1].name + "' and '" + spans[i].name + "' overlap");
  // File order = data order, as the writer lays them out.
  std::vector<StoredTensor> ordered;
  for (const Span& s : spans) ordered.push_back(std::move(out.tensors_[out.index_[s.name]]));
  out.tensors_ = std::move(ordered);
  for (size_t i = 0; i < out.tensors_.size(); ++i) out.index_[out.tensors_[i].name] = i;
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
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("cannot create '" + tmp + "': " + std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      c += w;
      n -= size_t(w);
    }
    return true;
  };
  uint64_t hlen = h.size();
  bool ok = write_all(&hlen, 8) && write_all(h.data(), h.size());
  for (const StoredTensor& t : tensors) ok = ok && write_all(t.bytes.data(), t.bytes.size());
  ok = ok && ::fsync(fd) == 0;
  int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write safetensors file '" + path + "': " + std::strerror(err));
  }
}

}  // namespace mgn
