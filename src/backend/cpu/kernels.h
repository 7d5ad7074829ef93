// The CPU reference kernels: one function per op, declared from ops.def so a missing one fails to link.
// Values are held as double; results are rounded to the node's storage dtype afterwards (executor.cpp).
#pragma once

#include <vector>

#include "ir/graph.h"

namespace mgn::cpu {

struct Buffer {
  Shape shape;
  DType dtype = DType::F32;
  std::vector<double> v;
  int64_t size() const { return int64_t(v.size()); }
};

using Inputs = std::vector<const Buffer*>;

#define X(E, name, mn, mx, arch, diff, rule, attrs) void k_##E(const ir::Node& n, const Inputs& in, Buffer& out);
#include "ir/ops.def"
#undef X

// Row-major strides of a shape.
std::vector<int64_t> strides_of(const Shape& s);

// Maps flat indices of an output shape to flat indices of an input that broadcasts to it (numpy rules).
class BroadcastIndex {
 public:
  BroadcastIndex(const Shape& in, const Shape& out);
  int64_t operator()(int64_t out_flat) const;

 private:
  std::vector<int64_t> out_dims_, in_strides_;  // in_strides_ is 0 on broadcast axes
  bool identity_;
};

// Splits a shape around one axis: outer (product before), n (the axis), inner (product after).
struct AxisSplit {
  int64_t outer, n, inner;
};
AxisSplit split_at(const Shape& s, int axis);

}  // namespace mgn::cpu
