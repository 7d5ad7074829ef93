// Internal view of the gradient-rule table of src/passes/autodiff.cpp (for tests that walk the op table).
#pragma once

#include "ir/op.h"

namespace mgn::ir {

// True when autodiff has a gradient rule for the op (exactly the ops marked differentiable in ops.def).
bool has_gradient_rule(Op op);

}  // namespace mgn::ir
