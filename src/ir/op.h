// The op enum and its static table, generated from ops.def (one declaration of the op set).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mgn::ir {

enum class Op : uint16_t {
#define X(E, name, mn, mx, arch, diff, rule, attrs) E,
#include "ir/ops.def"
#undef X
};

#define X(E, name, mn, mx, arch, diff, rule, attrs) +1
constexpr int kOpCount = 0
#include "ir/ops.def"
    ;
#undef X

// The kernel generator family an op lowers to; passes ask the archetype, not a list of names.
enum class Archetype : uint8_t { Source, Pointwise, Reduction, Matmul, Norm, Conv, Attention, DataMovement, Loss, State };

struct OpInfo {
  Op op;
  const char* name;
  int min_inputs;
  int max_inputs;  // -1: variadic
  Archetype archetype;
  bool differentiable;
  const char* attrs;  // "name:kind ..." (kind: int, float, ints, str; trailing '?' = optional)
};

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
const char* archetype_name(Archetype a);
// Looks an op up by its text name; returns false if there is none.
bool op_from_name(std::string_view name, Op* out);

}  // namespace mgn::ir
