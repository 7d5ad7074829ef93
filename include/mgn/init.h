// Parameter initializers: deterministic given (kind, seed, parameter name), on every backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mgn/types.h"

namespace mgn {

struct Init {
  enum class Kind : uint8_t {
    Zeros, Ones, Constant, Normal, Uniform, KaimingUniform, KaimingNormal, XavierUniform, XavierNormal, Data,
    PaperSine
  };
  Kind kind = Kind::Zeros;
  double a = 0;  // Constant: value; Normal: mean; Uniform: low; Kaiming: negative slope; Xavier: gain;
                 // PaperSine: scale
  double b = 0;  // Normal: std; Uniform: high; PaperSine: offset
  uint64_t seed = 0;
  std::vector<float> data;  // Data: row-major values

  static Init make(Kind k, double a = 0, double b = 0, uint64_t seed = 0) {
    Init i;
    i.kind = k;
    i.a = a;
    i.b = b;
    i.seed = seed;
    return i;
  }
  static Init zeros() { return make(Kind::Zeros); }
  static Init ones() { return make(Kind::Ones); }
  static Init constant(double v) { return make(Kind::Constant, v); }
  static Init normal(double mean, double std, uint64_t seed = 0) { return make(Kind::Normal, mean, std, seed); }
  static Init uniform(double lo, double hi, uint64_t seed = 0) { return make(Kind::Uniform, lo, hi, seed); }
  // PyTorch's defaults: nn.Linear/nn.Conv weights use kaiming_uniform(a = sqrt(5)).
  static Init kaiming_uniform(double a = 0, uint64_t seed = 0) { return make(Kind::KaimingUniform, a, 0, seed); }
  static Init kaiming_normal(double a = 0, uint64_t seed = 0) { return make(Kind::KaimingNormal, a, 0, seed); }
  static Init xavier_uniform(double gain = 1, uint64_t seed = 0) { return make(Kind::XavierUniform, gain, 0, seed); }
  static Init xavier_normal(double gain = 1, uint64_t seed = 0) { return make(Kind::XavierNormal, gain, 0, seed); }
  // The paper's benchmark init (workload-specs.md): seed = (h·31 + byte mod 2³² over the name's bytes) mod 10000,
  // v_j = sin(0.01·j + seed)·scale; a 2-D parameter [out, in] is generated in [in, out] row-major order and
  // transposed. Computed when the values are needed (a 100M-parameter model costs nothing to build).
  // `offset` (b) is added to each f32 value afterwards (norm weights that start near 1).
  static Init paper_sine(double scale = 0.02, double offset = 0) { return make(Kind::PaperSine, scale, offset); }
  static Init from_data(std::vector<float> values) {
    Init i = make(Kind::Data);
    i.data = std::move(values);
    return i;
  }
  bool operator==(const Init&) const = default;
};

const char* init_kind_name(Init::Kind k);

// Fan-in / fan-out as PyTorch computes them: dim 1 (resp. 0) times the receptive field.
int64_t fan_in(const Shape& s);
int64_t fan_out(const Shape& s);

// The values of an initializer for a parameter of this shape and name; throws on a size mismatch (Data).
std::vector<float> materialize(const Init& init, const Shape& shape, const std::string& name);

}  // namespace mgn
