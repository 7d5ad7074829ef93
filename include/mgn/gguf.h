// GGUF files (the model format of ggml / llama.cpp), version 3, written from the published layout:
//
//   magic "GGUF", version u32 = 3, tensor count u64, metadata count u64,
//   metadata: key (string), value type u32, value (an array: element type u32, count u64, elements),
//   tensor infos: name (string), n_dims u32, dims u64 (innermost first), ggml type u32, data offset u64,
//   padding to the alignment, then the tensor data, each tensor starting at a multiple of the alignment.
//
// Strings are a u64 byte count and the bytes (no terminator); everything is little-endian; bool is one byte.
//
//   std::vector<mgn::gguf::KeyValue> kv = {{"general.architecture", mgn::gguf::Value::string("llama")}};
//   std::vector<mgn::gguf::Tensor> t = {{"token_embd.weight", {vocab, hidden}, mgn::gguf::TensorType::F16, values}};
//   mgn::gguf::write("model.gguf", kv, t);   // atomically
//
// Shapes are given as everywhere in meganeura (outermost first, row-major data) and written reversed, as
// ggml counts dimensions (ne[0] is the contiguous one). docs/gguf.md describes the format and the Llama
// exporter (mgn::llama::export_gguf, `mgn export --gguf`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mgn/types.h"

namespace mgn::gguf {

// The metadata value types (gguf_type).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12
};
const char* value_type_name(ValueType t);

// One metadata value: a scalar or an array of one element type (no nested arrays). Integers and bools are
// kept in `ints`, floats in `floats`, strings in `strings`; the factories below fill one of them.
struct Value {
  ValueType type = ValueType::U32;  // Array for arrays
  ValueType element = ValueType::U32;  // the element type of an array (the type itself for a scalar)
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value strings_array(std::vector<std::string> v);
  static Value i32_array(const std::vector<int32_t>& v);
  static Value f32_array(const std::vector<float>& v);
};

struct KeyValue {
  std::string key;
  Value value;
};

// The tensor data types written (ggml_type codes); values are given as f32 and stored rounded (f16: to
// nearest even).
enum class TensorType : uint32_t { F32 = 0, F16 = 1 };

struct Tensor {
  std::string name;
  Shape shape;  // outermost first; the data is row-major in this order
  TensorType type = TensorType::F32;
  std::vector<float> values;
};

// Writes the file atomically (temp file + rename). Throws mgn::Error naming `path` and the key or tensor for:
// a duplicate key or tensor name, a name longer than GGUF allows (64 KiB keys, 64-byte tensor names as
// ggml's GGML_MAX_NAME), a tensor whose value count differs from its shape, a rank above 4 (GGML_MAX_DIMS),
// an array of arrays, or a value whose storage disagrees with its type. `alignment` (a power of two) is
// written as general.alignment when it is not GGUF's default of 32.
void write(const std::string& path, const std::vector<KeyValue>& metadata, const std::vector<Tensor>& tensors,
           uint32_t alignment = 32);

}  // namespace mgn::gguf
