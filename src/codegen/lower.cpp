// Routes each IR node to the generator of its archetype. Both switches are exhaustive (no default): the
// op switch is generated from ops.def, so every op is routed by the archetype its table row declares.
#include "codegen/kernel.h"

namespace mgn::codegen {
namespace {

Lowering route(ir::Archetype arch, const LowerContext& ctx) {
  using ir::Archetype;
  switch (arch) {
    case Archetype::Source:
    case Archetype::State:
      throw Error("internal: " + ctx.graph.describe(ctx.node.id) +
                  " owns memory and has no kernel (the executor handles sources and assign)");
    case Archetype::Pointwise: return lower_pointwise(ctx);
    case Archetype::Reduction: return lower_reduction(ctx);
    case Archetype::Matmul: return lower_matmul(ctx);
    case Archetype::Norm: return lower_norm(ctx);
    case Archetype::Conv: return lower_conv(ctx);
    case Archetype::Attention: return lower_attention(ctx);
    case Archetype::DataMovement: return lower_data(ctx);
    case Archetype::Loss: return lower_loss(ctx);
  }
  throw Error("internal: unknown archetype for " + ctx.graph.describe(ctx.node.id));
}

}  // namespace

Lowering lower_node(const LowerContext& ctx) {
  switch (ctx.node.op) {
#define X(E, name, mn, mx, ARCH, diff, rule, attrs) \
  case ir::Op::E: return route(ir::Archetype::ARCH, ctx);
#include "ir/ops.def"
#undef X
  }
  throw Error("internal: unknown op in " + ctx.graph.describe(ctx.node.id));
}

}  // namespace mgn::codegen
