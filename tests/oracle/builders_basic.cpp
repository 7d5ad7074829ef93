// Oracle builders for pointwise, reduction, matmul, data-movement and loss cases (tests/oracle/cases_basic.py).
#include "ir/graph.h"
#include "oracle/registry.h"

using namespace mgn;
using mgn::oracle::Call;

namespace {

Tensor raw(Call& c, ir::Op op, std::vector<Tensor> ins, ir::Attrs attrs) {
  std::vector<int> ids;
  for (const Tensor& t : ins) ids.push_back(t.id());
  return Tensor(&c.g.ir(), c.g.ir().add(op, ids, std::move(attrs)));
}

}  // namespace

// ---- unary
MGN_ORACLE_BUILDER(neg) { return neg(c.in[0]); }
MGN_ORACLE_BUILDER(abs) { return mgn::abs(c.in[0]); }
MGN_ORACLE_BUILDER(exp) { return mgn::exp(c.in[0]); }
MGN_ORACLE_BUILDER(log) { return mgn::log(c.in[0]); }
MGN_ORACLE_BUILDER(sqrt) { return mgn::sqrt(c.in[0]); }
MGN_ORACLE_BUILDER(rsqrt) { return rsqrt(c.in[0]); }
MGN_ORACLE_BUILDER(reciprocal) { return reciprocal(c.in[0]); }
MGN_ORACLE_BUILDER(square) { return square(c.in[0]); }
MGN_ORACLE_BUILDER(relu) { return relu(c.in[0]); }
MGN_ORACLE_BUILDER(gelu) { return gelu(c.in[0]); }
MGN_ORACLE_BUILDER(gelu_tanh) { return gelu_tanh(c.in[0]); }
MGN_ORACLE_BUILDER(silu) { return silu(c.in[0]); }
MGN_ORACLE_BUILDER(sigmoid) { return sigmoid(c.in[0]); }
MGN_ORACLE_BUILDER(tanh) { return mgn::tanh(c.in[0]); }
MGN_ORACLE_BUILDER(softplus) { return softplus(c.in[0]); }
MGN_ORACLE_BUILDER(erf) { return mgn::erf(c.in[0]); }
MGN_ORACLE_BUILDER(sin) { return mgn::sin(c.in[0]); }
MGN_ORACLE_BUILDER(cos) { return mgn::cos(c.in[0]); }
MGN_ORACLE_BUILDER(stop_gradient) { return stop_gradient(c.in[0]); }
MGN_ORACLE_BUILDER(leaky_relu) { return leaky_relu(c.in[0], c.f("alpha")); }
MGN_ORACLE_BUILDER(pow) { return mgn::pow(c.in[0], c.f("exponent")); }
MGN_ORACLE_BUILDER(clamp) { return clamp(c.in[0], c.f("min"), c.f("max")); }
MGN_ORACLE_BUILDER(cast_i32) { return cast(c.in[0], DType::I32); }
MGN_ORACLE_BUILDER(cast_f32) { return cast(c.in[0], DType::F32); }
MGN_ORACLE_BUILDER(cast_bool) { return cast(c.in[0], DType::Bool); }

MGN_ORACLE_BUILDER(relu_grad) { return raw(c, ir::Op::ReluGrad, {c.in[0], c.in[1]}, {}); }
MGN_ORACLE_BUILDER(gelu_grad) { return raw(c, ir::Op::GeluErfGrad, {c.in[0], c.in[1]}, {}); }
MGN_ORACLE_BUILDER(gelu_tanh_grad) { return raw(c, ir::Op::GeluTanhGrad, {c.in[0], c.in[1]}, {}); }
MGN_ORACLE_BUILDER(silu_grad) { return raw(c, ir::Op::SiluGrad, {c.in[0], c.in[1]}, {}); }

// ---- binary, comparisons, where
MGN_ORACLE_BUILDER(add) { return add(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(sub) { return sub(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(mul) { return mul(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(div) { return mgn::div(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(maximum) { return maximum(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(minimum) { return minimum(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(equal) { return equal(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(not_equal) { return not_equal(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(less) { return less(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(less_equal) { return less_equal(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(greater) { return greater(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(greater_equal) { return greater_equal(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(where) { return where(c.in[0], c.in[1], c.in[2]); }

// ---- reductions
MGN_ORACLE_BUILDER(sum) { return sum(c.in[0], c.ints("axes"), c.i("keepdim") != 0); }
MGN_ORACLE_BUILDER(mean) { return mean(c.in[0], c.ints("axes"), c.i("keepdim") != 0); }
MGN_ORACLE_BUILDER(max) { return mgn::max(c.in[0], c.ints("axes"), c.i("keepdim") != 0); }
MGN_ORACLE_BUILDER(min) { return mgn::min(c.in[0], c.ints("axes"), c.i("keepdim") != 0); }
MGN_ORACLE_BUILDER(argmax) { return argmax(c.in[0], c.i("axis"), c.i("keepdim") != 0); }
MGN_ORACLE_BUILDER(softmax) { return softmax(c.in[0], c.i("axis")); }
MGN_ORACLE_BUILDER(log_softmax) { return log_softmax(c.in[0], c.i("axis")); }
MGN_ORACLE_BUILDER(logsumexp) { return logsumexp(c.in[0], c.i("axis"), c.i("keepdim") != 0); }

// ---- matmul
MGN_ORACLE_BUILDER(matmul) { return matmul(c.in[0], c.in[1], c.i("ta") != 0, c.i("tb") != 0); }
MGN_ORACLE_BUILDER(linear) { return linear(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(linear_bias) { return linear(c.in[0], c.in[1], c.in[2]); }

// ---- data movement
MGN_ORACLE_BUILDER(reshape) { return reshape(c.in[0], c.ints("shape")); }
MGN_ORACLE_BUILDER(permute) { return permute(c.in[0], c.ints("perm")); }
MGN_ORACLE_BUILDER(transpose) { return transpose(c.in[0], c.i("a"), c.i("b")); }
MGN_ORACLE_BUILDER(slice) { return slice(c.in[0], c.i("axis"), c.i("start"), c.i("end"), c.i("step")); }
MGN_ORACLE_BUILDER(concat2) { return concat({c.in[0], c.in[1]}, c.i("axis")); }
MGN_ORACLE_BUILDER(concat3) { return concat({c.in[0], c.in[1], c.in[2]}, c.i("axis")); }
MGN_ORACLE_BUILDER(split_take1) { return split(c.in[0], c.ints("sizes"), c.i("axis"))[1]; }
MGN_ORACLE_BUILDER(pad) { return pad(c.in[0], c.ints("pads"), c.f("value")); }
MGN_ORACLE_BUILDER(expand) { return expand(c.in[0], c.ints("shape")); }
MGN_ORACLE_BUILDER(gather) { return gather(c.in[0], c.in[1], c.i("axis")); }
MGN_ORACLE_BUILDER(gather_elements) { return gather_elements(c.in[0], c.in[1], c.i("axis")); }
MGN_ORACLE_BUILDER(scatter_elements) {
  const std::string r = c.attrs.at("reduction").get<std::string>();
  const ScatterReduction red = r == "add"   ? ScatterReduction::Add
                               : r == "mul" ? ScatterReduction::Mul
                               : r == "max" ? ScatterReduction::Max
                               : r == "min" ? ScatterReduction::Min
                                            : ScatterReduction::None;
  return scatter_elements(c.in[0], c.in[1], c.in[2], c.i("axis"), red);
}
MGN_ORACLE_BUILDER(index_select) { return index_select(c.in[0], c.i("axis"), c.in[1]); }
MGN_ORACLE_BUILDER(embedding) { return embedding(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(one_hot) { return one_hot(c.in[0], c.i("depth")); }
MGN_ORACLE_BUILDER(flatten) { return flatten(c.in[0], 1); }
MGN_ORACLE_BUILDER(squeeze_unsqueeze) { return unsqueeze(squeeze(c.in[0], 1), 0); }
MGN_ORACLE_BUILDER(slice_grad) {
  return raw(c, ir::Op::SliceGrad, {c.in[0]},
             ir::Attrs()
                 .set("starts", c.ints("starts"))
                 .set("ends", c.ints("ends"))
                 .set("steps", c.ints("steps"))
                 .set("input_shape", c.ints("input_shape")));
}
MGN_ORACLE_BUILDER(gather_grad) {
  return raw(c, ir::Op::GatherGrad, {c.in[0], c.in[1]},
             ir::Attrs().set("axis", c.i("axis")).set("table_shape", c.ints("table_shape")));
}

// ---- losses
MGN_ORACLE_BUILDER(cross_entropy) {
  return cross_entropy(c.in[0], c.in[1], {.ignore_index = c.i("ignore_index"), .label_smoothing = c.f("label_smoothing")});
}
MGN_ORACLE_BUILDER(cross_entropy_grad) {
  return raw(c, ir::Op::CrossEntropyGrad, {c.in[0], c.in[1], c.in[2]},
             ir::Attrs().set("ignore_index", c.i("ignore_index")).set("label_smoothing", c.f("label_smoothing")));
}
MGN_ORACLE_BUILDER(mse) { return mse_loss(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(l1) { return l1_loss(c.in[0], c.in[1]); }
MGN_ORACLE_BUILDER(bce_with_logits) { return bce_with_logits(c.in[0], c.in[1]); }
