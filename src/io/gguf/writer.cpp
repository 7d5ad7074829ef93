// GGUF version 3 writer (include/mgn/gguf.h; docs/gguf.md). The file is assembled in memory by sections
// (header and metadata, tensor infos, padding, data) and written once through the atomic writer.
#include "mgn/gguf.h"

#include <cstring>
#include <set>

#include "support/atomic_file.h"

namespace mgn::gguf {

namespace {

constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kMaxTensorName = 63;  // ggml's GGML_MAX_NAME (64) less the terminator
constexpr size_t kMaxKey = 65535;
constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

// Little-endian byte sink (x86-64 and every target ggml supports here are little-endian).
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad(size_t alignment) {
    while (b.size() % alignment) b.push_back(0);
  }
};

size_t element_count(const Value& v) {
  switch (v.element) {
    case ValueType::String: return v.strings.size();
    case ValueType::F32:
    case ValueType::F64: return v.floats.size();
    case ValueType::Array: return 0;
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16: case ValueType::U32:
    case ValueType::I32: case ValueType::Bool: case ValueType::U64: case ValueType::I64: return v.ints.size();
  }
  return 0;
}

// One element `i` of `v`'s storage, encoded as `t`.
void put_element(Bytes& out, const Value& v, ValueType t, size_t i) {
  switch (t) {
    case ValueType::U8: out.put<uint8_t>(uint8_t(v.ints[i])); return;
    case ValueType::I8: out.put<int8_t>(int8_t(v.ints[i])); return;
    case ValueType::U16: out.put<uint16_t>(uint16_t(v.ints[i])); return;
    case ValueType::I16: out.put<int16_t>(int16_t(v.ints[i])); return;
    case ValueType::U32: out.put<uint32_t>(uint32_t(v.ints[i])); return;
    case ValueType::I32: out.put<int32_t>(int32_t(v.ints[i])); return;
    case ValueType::U64: out.put<uint64_t>(uint64_t(v.ints[i])); return;
    case ValueType::I64: out.put<int64_t>(v.ints[i]); return;
    case ValueType::Bool: out.put<uint8_t>(v.ints[i] ? 1 : 0); return;
    case ValueType::F32: out.put<float>(float(v.floats[i])); return;
    case ValueType::F64: out.put<double>(v.floats[i]); return;
    case ValueType::String: out.str(v.strings[i]); return;
    case ValueType::Array: return;  // refused by check_value
  }
}

void check_value(const std::string& path, const std::string& key, const Value& v) {
  auto bad = [&](const std::string& what) { throw Error(path + ": metadata '" + key + "': " + what); };
  if (v.element == ValueType::Array) bad("an array of arrays is not written");
  if (v.type != ValueType::Array && v.type != v.element)
    bad(std::string("scalar of type ") + value_type_name(v.type) + " with element type " + value_type_name(v.element));
  const size_t n = element_count(v);
  if (v.type != ValueType::Array && n != 1) bad("a scalar holds " + std::to_string(n) + " values");
  const size_t others = v.ints.size() + v.floats.size() + v.strings.size() - n;
  if (others) bad(std::string("values stored outside the storage of type ") + value_type_name(v.element));
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

Value Value::u32(uint32_t v) { return {ValueType::U32, ValueType::U32, {int64_t(v)}, {}, {}}; }
Value Value::i32(int32_t v) { return {ValueType::I32, ValueType::I32, {v}, {}, {}}; }
Value Value::u64(uint64_t v) { return {ValueType::U64, ValueType::U64, {int64_t(v)}, {}, {}}; }
Value Value::f32(float v) { return {ValueType::F32, ValueType::F32, {}, {double(v)}, {}}; }
Value Value::boolean(bool v) { return {ValueType::Bool, ValueType::Bool, {v ? 1 : 0}, {}, {}}; }
Value Value::string(std::string v) { return {ValueType::String, ValueType::String, {}, {}, {std::move(v)}}; }
Value Value::strings_array(std::vector<std::string> v) {
  return {ValueType::Array, ValueType::String, {}, {}, std::move(v)};
}
Value Value::i32_array(const std::vector<int32_t>& v) {
  return {ValueType::Array, ValueType::I32, std::vector<int64_t>(v.begin(), v.end()), {}, {}};
}
Value Value::f32_array(const std::vector<float>& v) {
  return {ValueType::Array, ValueType::F32, {}, std::vector<double>(v.begin(), v.end()), {}};
}

void write(const std::string& path, const std::vector<KeyValue>& metadata, const std::vector<Tensor>& tensors,
           uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)))
    throw Error(path + ": GGUF alignment " + std::to_string(alignment) + " is not a power of two");
  std::vector<KeyValue> kv = metadata;
  std::set<std::string> keys;
  for (const KeyValue& e : kv) {
    if (e.key.empty() || e.key.size() > kMaxKey) throw Error(path + ": metadata key of " + std::to_string(e.key.size()) + " bytes");
    if (!keys.insert(e.key).second) throw Error(path + ": metadata key '" + e.key + "' given twice");
    check_value(path, e.key, e.value);
  }
  if (alignment != kDefaultAlignment) {
    if (keys.count("general.alignment")) throw Error(path + ": general.alignment given both as a key and an argument");
    kv.push_back({"general.alignment", Value::u32(alignment)});
  }

  Bytes head;
  head.b = {'G', 'G', 'U', 'F'};
  head.put<uint32_t>(kVersion);
  head.put<uint64_t>(tensors.size());
  head.put<uint64_t>(kv.size());
  for (const KeyValue& e : kv) {
    head.str(e.key);
    head.put<uint32_t>(uint32_t(e.value.type));
    if (e.value.type == ValueType::Array) {
      head.put<uint32_t>(uint32_t(e.value.element));
      head.put<uint64_t>(element_count(e.value));
    }
    for (size_t i = 0; i < element_count(e.value); ++i) put_element(head, e.value, e.value.element, i);
  }

  // Tensor infos, with each tensor's offset in the data section.
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name.size() > kMaxTensorName)
      throw Error(where + ": a name of " + std::to_string(t.name.size()) + " bytes (GGUF allows 1 to 63)");
    if (!names.insert(t.name).second) throw Error(where + " given twice");
    if (t.shape.empty() || int(t.shape.size()) > kMaxDims)
      throw Error(where + ": rank " + std::to_string(t.shape.size()) + " (GGUF tensors have rank 1 to 4)");
    for (int64_t d : t.shape)
      if (d <= 0) throw Error(where + ": shape " + shape_str(t.shape) + " has a non-positive dimension");
    if (int64_t(t.values.size()) != numel(t.shape))
      throw Error(where + ": " + std::to_string(t.values.size()) + " values for shape " + shape_str(t.shape));
    head.str(t.name);
    head.put<uint32_t>(uint32_t(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) head.put<uint64_t>(uint64_t(t.shape[d]));  // innermost first
    head.put<uint32_t>(uint32_t(t.type));
    head.put<uint64_t>(offset);
    offsets.push_back(offset);
    const uint64_t bytes = t.values.size() * (t.type == TensorType::F32 ? 4 : 2);
    offset += (bytes + alignment - 1) / alignment * alignment;
  }
  head.pad(alignment);

  files::write_atomic(path, [&](int fd) {
    if (!files::write_all(fd, head.b.data(), head.b.size())) return false;
    std::vector<uint8_t> buf;
    for (const Tensor& t : tensors) {
      buf.clear();
      if (t.type == TensorType::F32) {
        buf.resize(t.values.size() * 4);
        std::memcpy(buf.data(), t.values.data(), buf.size());
      } else {
        buf.resize(t.values.size() * 2);
        for (size_t i = 0; i < t.values.size(); ++i) {
          const uint16_t h = float_to_half(t.values[i]);
          std::memcpy(buf.data() + 2 * i, &h, 2);
        }
      }
      while (buf.size() % alignment) buf.push_back(0);
      if (!files::write_all(fd, buf.data(), buf.size())) return false;
    }
    return true;
  });
}

}  // namespace mgn::gguf
