// TEMPORARY: ops whose CPU kernels are being written (norm, conv, pool, attention, rope).
#include "backend/cpu/kernels.h"

namespace mgn::cpu {
#define PENDING(E) \
  void k_##E(const ir::Node& n, const Inputs&, Buffer&) { throw Error(std::string(ir::op_name(n.op)) + ": CPU kernel pending"); }
PENDING(LayerNorm)
PENDING(RmsNorm)
PENDING(GroupNorm)
PENDING(BatchNorm)
PENDING(LayerNormGrad)
PENDING(RmsNormGrad)
PENDING(GroupNormGrad)
PENDING(BatchNormGrad)
PENDING(Conv2d)
PENDING(Conv2dGradInput)
PENDING(Conv2dGradWeight)
PENDING(MaxPool2d)
PENDING(MaxPool2dGrad)
PENDING(AvgPool2d)
PENDING(AvgPool2dGrad)
PENDING(Upsample2d)
PENDING(Upsample2dGrad)
PENDING(Attention)
PENDING(AttentionLse)
PENDING(AttentionGradQ)
PENDING(AttentionGradK)
PENDING(AttentionGradV)
PENDING(Rope)
}  // namespace mgn::cpu
