// Basic value types of the public API: errors, dtypes, shapes, precision policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mgn {

// Every error a user can cause (bad shape, unknown op, malformed file, missing device feature).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The Vulkan device stopped (VK_ERROR_DEVICE_LOST: a driver reset, a hung or faulting kernel, a GPU gone).
// Every session on that device fails with it from then on, at once; a session compiled afterwards opens the
// device anew (docs/reliability.md, "Resource exhaustion").
class DeviceLost : public Error {
 public:
  using Error::Error;
};

enum class DType : uint8_t { F32, F16, BF16, I32, Bool };

// Bytes per element as stored in memory.
size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "f16", "bf16", "i32", "bool"; throws Error otherwise.
DType dtype_from_name(const std::string& s);
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A static shape; rank 0 (scalar) to kMaxRank.
using Shape = std::vector<int64_t>;
constexpr int kMaxRank = 6;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);

// Strict keeps every operand f32; Accelerated lets eligible forward matmul/conv/attention inputs round to
// f16 with f32 accumulation.
enum class Precision : uint8_t { Strict, Accelerated };
const char* precision_name(Precision p);

// f16/bf16 conversions used by the CPU reference and by checkpoint I/O (round to nearest even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);

}  // namespace mgn
