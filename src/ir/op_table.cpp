// The op table built from ops.def, and name lookups.
#include <array>
#include <cstring>

#include "ir/op.h"

namespace mgn::ir {
namespace {

constexpr std::array<OpInfo, kOpCount> kTable = {{
#define X(E, name, mn, mx, arch, diff, rule, attrs) {Op::E, name, mn, mx, Archetype::arch, diff, attrs},
#include "ir/ops.def"
#undef X
}};

constexpr bool table_in_enum_order() {
  for (int i = 0; i < kOpCount; ++i)
    if (static_cast<int>(kTable[i].op) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "op table must follow enum order");

}  // namespace

const OpInfo& op_info(Op op) { return kTable[static_cast<size_t>(op)]; }

const char* archetype_name(Archetype a) {
  switch (a) {
    case Archetype::Source: return "source";
    case Archetype::Pointwise: return "pointwise";
    case Archetype::Reduction: return "reduction";
    case Archetype::Matmul: return "matmul";
    case Archetype::Norm: return "norm";
    case Archetype::Conv: return "conv";
    case Archetype::Attention: return "attention";
    case Archetype::DataMovement: return "data_movement";
    case Archetype::Loss: return "loss";
    case Archetype::State: return "state";
  }
  return "?";
}

bool op_from_name(std::string_view name, Op* out) {
  for (const OpInfo& info : kTable) {
    if (name == info.name) {
      *out = info.op;
      return true;
    }
  }
  return false;
}

}  // namespace mgn::ir
