// Implementation of the small value types shared by every layer (dtype tables, shape helpers, halves).
#include <cmath>
#include <cstring>

#include "mgn/types.h"

namespace mgn {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::Bool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::Bool})
    if (s == dtype_name(t)) return t;
  throw Error("unknown dtype '" + s + "' (expected f32, f16, bf16, i32 or bool)");
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("shape " + shape_str(s) + " has more elements than a 64-bit count holds");
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ",";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

const char* precision_name(Precision p) { return p == Precision::Strict ? "strict" : "accelerated"; }

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = int32_t((x >> 23) & 0xffu);
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));  // inf / nan
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return uint16_t(sign | 0x7c00u);  // overflow to inf
  if (e <= 0) {                                     // subnormal or zero
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    uint32_t shift = uint32_t(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return uint16_t(sign | half_mant);
  }
  uint32_t half = sign | (uint32_t(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // carries into exponent correctly
  return uint16_t(half);
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      float f = std::ldexp(float(mant), -24);
      std::memcpy(&x, &f, 4);
      x |= sign;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return uint16_t((x + rounding) >> 16);
}

float bf16_to_float(uint16_t h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace mgn
