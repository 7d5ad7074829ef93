// safetensors files: read (validated: offsets in range, no overlap, dtype/shape consistent, size limits)
// and write atomically (temp file + rename: a failed write leaves the old file untouched).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mgn/types.h"

namespace mgn {

// One tensor as stored: its safetensors dtype tag ("F32", "F16", "BF16", "I32", "F64", "I64", "BOOL", "U8",
// "I8", "I16"), shape and raw little-endian bytes.
struct StoredTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  std::vector<uint8_t> bytes;

  int64_t numel() const { return mgn::numel(shape); }
  // Converted copies (f16/bf16 widen exactly; integer tags convert to float/double).
  std::vector<float> to_f32() const;
  std::vector<double> to_f64() const;
  std::vector<int32_t> to_i32() const;  // integer or bool tags only

  static StoredTensor from_f32(const std::string& name, const Shape& shape, const std::vector<float>& v,
                               DType as = DType::F32);
  static StoredTensor from_f64(const std::string& name, const Shape& shape, const std::vector<double>& v);
  static StoredTensor from_i32(const std::string& name, const Shape& shape, const std::vector<int32_t>& v);
};

// Bytes per element of a safetensors dtype tag; throws mgn::Error for an unknown tag.
size_t safetensors_dtype_size(const std::string& tag);

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100ull << 20;  // the format's own recommendation
  uint64_t max_file_bytes = 64ull << 30;
};

class SafetensorsFile {
 public:
  // Reads and validates the file (header first, then each tensor by positioned reads; no image of the whole
  // file); throws mgn::Error naming the file and the problem (a folder, truncation, bytes no tensor owns).
  static SafetensorsFile read(const std::string& path, const SafetensorsLimits& limits = {});
  // The header only (names, dtypes, shapes, metadata; every StoredTensor's bytes stay empty), validated as
  // read() does, without reading the tensors: for listing a file of any size.
  static SafetensorsFile read_header(const std::string& path, const SafetensorsLimits& limits = {});
  // Parses an in-memory image (used by fuzzing and tests).
  static SafetensorsFile parse(const std::vector<uint8_t>& image, const std::string& origin,
                               const SafetensorsLimits& limits = {});

  const StoredTensor* find(const std::string& name) const;
  const StoredTensor& get(const std::string& name) const;  // throws naming the tensor and file
  std::vector<std::string> names() const;                    // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& origin() const { return origin_; }

 private:
  static SafetensorsFile read_impl(const std::string& path, const SafetensorsLimits& limits, bool with_data);
  std::string origin_;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (and optional string metadata) atomically to `path`.
void write_safetensors(const std::string& path, const std::vector<StoredTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mgn
