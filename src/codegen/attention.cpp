// Placeholder until the generator lands.
#include "codegen/kernel.h"
#include "mgn/types.h"

namespace mgn::codegen {

Lowering lower_attention(const LowerContext& ctx) {
  throw Error(std::string(ir::op_name(ctx.node.op)) + ": no Vulkan lowering yet");
}

}  // namespace mgn::codegen
