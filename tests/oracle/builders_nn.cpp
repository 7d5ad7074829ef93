// Oracle builders for normalization, convolution/pooling/upsampling, attention and rope cases
// (tests/oracle/cases_nn.py). Forward ops go through the public builders; derivative ops, which have no
// public builder, are added to the IR directly with the case's attributes.
#include <cmath>

#include "ir/graph.h"
#include "oracle/registry.h"

using namespace mgn;
using mgn::oracle::Call;

namespace {

Tensor raw_node(Call& c, ir::Op op, const std::vector<Tensor>& ins, ir::Attrs attrs) {
  std::vector<int> ids;
  for (const Tensor& t : ins) ids.push_back(t.id());
  return Tensor(&c.g.ir(), c.g.ir().add(op, ids, std::move(attrs)));
}

// The case's attributes as IR attributes: json integers, floats and integer lists keep their kinds.
ir::Attrs attrs_of(const Call& c) {
  ir::Attrs a;
  for (const auto& [k, v] : c.attrs.items()) {
    if (v.is_number_integer()) a.set(k, v.get<int64_t>());
    else if (v.is_number_float()) a.set(k, v.get<double>());
    else if (v.is_array()) a.set(k, v.get<std::vector<int64_t>>());
    else throw Error("oracle case: attribute '" + k + "' has an unsupported json kind");
  }
  return a;
}

std::optional<Tensor> opt_in(const Call& c, size_t i) {
  return c.in.size() > i ? std::optional<Tensor>(c.in[i]) : std::nullopt;
}

Conv2dOptions conv_options(const Call& c) {
  return {.stride = c.ints("stride"), .padding = c.ints("padding"), .dilation = c.ints("dilation"),
          .groups = c.i("groups")};
}

Conv1dOptions conv1d_options(const Call& c) {
  return {.stride = c.i("stride"), .padding = c.i("padding"), .dilation = c.i("dilation"), .groups = c.i("groups")};
}

// Attention attributes with the default scale (0 in the case) resolved to 1/sqrt(D), as the builder does.
ir::Attrs attention_attrs(const Call& c) {
  double scale = c.f("scale");
  if (scale == 0) scale = 1.0 / std::sqrt(double(c.in[0].dim(3)));
  return ir::Attrs().set("scale", scale).set("causal", c.i("causal"));
}

// q, k, v, do [, mask] -> attention_grad_{q,k,v}(q, k, v, o, do, lse [, mask]) with o and lse from the
// forward ops, so the derivative sees a consistent saved state.
Tensor attention_grad(Call& c, ir::Op op) {
  std::vector<Tensor> qkv = {c.in[0], c.in[1], c.in[2]};
  if (c.in.size() > 4) qkv.push_back(c.in[4]);
  ir::Attrs attrs = attention_attrs(c);
  Tensor o = raw_node(c, ir::Op::Attention, qkv, attrs);
  Tensor lse = raw_node(c, ir::Op::AttentionLse, qkv, attrs);
  std::vector<Tensor> in = {c.in[0], c.in[1], c.in[2], o, c.in[3], lse};
  if (c.in.size() > 4) in.push_back(c.in[4]);
  return raw_node(c, op, in, attrs);
}

}  // namespace

// ---- normalization
MGN_ORACLE_BUILDER(layer_norm) { return layer_norm(c.in[0], opt_in(c, 1), opt_in(c, 2), c.f("eps")); }
MGN_ORACLE_BUILDER(rms_norm) { return rms_norm(c.in[0], opt_in(c, 1), c.f("eps")); }
MGN_ORACLE_BUILDER(group_norm) { return group_norm(c.in[0], c.i("groups"), opt_in(c, 1), opt_in(c, 2), c.f("eps")); }
MGN_ORACLE_BUILDER(batch_norm) { return batch_norm(c.in[0], opt_in(c, 1), opt_in(c, 2), c.f("eps")); }
MGN_ORACLE_BUILDER(batch_norm_eval) {
  return batch_norm_eval(c.in[0], c.in[1], c.in[2], opt_in(c, 3), opt_in(c, 4), c.f("eps"));
}
MGN_ORACLE_BUILDER(layer_norm_grad) { return raw_node(c, ir::Op::LayerNormGrad, c.in, attrs_of(c)); }
MGN_ORACLE_BUILDER(rms_norm_grad) { return raw_node(c, ir::Op::RmsNormGrad, c.in, attrs_of(c)); }
MGN_ORACLE_BUILDER(group_norm_grad) { return raw_node(c, ir::Op::GroupNormGrad, c.in, attrs_of(c)); }
MGN_ORACLE_BUILDER(batch_norm_grad) { return raw_node(c, ir::Op::BatchNormGrad, c.in, attrs_of(c)); }

// ---- convolution
MGN_ORACLE_BUILDER(conv2d) { return conv2d(c.in[0], c.in[1], conv_options(c)); }
MGN_ORACLE_BUILDER(conv2d_bias) { return conv2d(c.in[0], c.in[1], conv_options(c), c.in[2]); }
MGN_ORACLE_BUILDER(conv1d) { return conv1d(c.in[0], c.in[1], conv1d_options(c)); }
MGN_ORACLE_BUILDER(conv1d_bias) { return conv1d(c.in[0], c.in[1], conv1d_options(c), c.in[2]); }
MGN_ORACLE_BUILDER(conv_transpose2d) {
  return conv_transpose2d(c.in[0], c.in[1],
                          {.stride = c.ints("stride"), .padding = c.ints("padding"),
                           .output_padding = c.ints("output_padding"), .dilation = c.ints("dilation"),
                           .groups = c.i("groups")});
}
MGN_ORACLE_BUILDER(conv2d_grad_input) { return raw_node(c, ir::Op::Conv2dGradInput, c.in, attrs_of(c)); }
MGN_ORACLE_BUILDER(conv2d_grad_weight) { return raw_node(c, ir::Op::Conv2dGradWeight, c.in, attrs_of(c)); }

// ---- pooling and upsampling
MGN_ORACLE_BUILDER(max_pool2d) {
  return max_pool2d(c.in[0], {.kernel = c.ints("kernel"), .stride = c.ints("stride"), .padding = c.ints("padding"),
                              .dilation = c.ints("dilation")});
}
MGN_ORACLE_BUILDER(avg_pool2d) {
  return avg_pool2d(c.in[0], {.kernel = c.ints("kernel"), .stride = c.ints("stride"), .padding = c.ints("padding"),
                              .count_include_pad = c.i("count_include_pad") != 0});
}
MGN_ORACLE_BUILDER(max_pool2d_grad) { return raw_node(c, ir::Op::MaxPool2dGrad, c.in, attrs_of(c)); }
// Small integers cast to f32 in the graph, so that windows hold tied maxima.
MGN_ORACLE_BUILDER(max_pool2d_grad_ties) {
  return raw_node(c, ir::Op::MaxPool2dGrad, {cast(c.in[0], DType::F32), c.in[1]}, attrs_of(c));
}
MGN_ORACLE_BUILDER(avg_pool2d_grad) { return raw_node(c, ir::Op::AvgPool2dGrad, c.in, attrs_of(c)); }
MGN_ORACLE_BUILDER(global_avg_pool) { return global_avg_pool(c.in[0]); }
MGN_ORACLE_BUILDER(upsample_nearest2d) {
  auto s = c.ints("scale");
  return upsample_nearest2d(c.in[0], s.at(0), s.at(1));
}
MGN_ORACLE_BUILDER(upsample_nearest2d_grad) { return raw_node(c, ir::Op::Upsample2dGrad, c.in, attrs_of(c)); }

// ---- attention and rope
MGN_ORACLE_BUILDER(attention) {
  return attention(c.in[0], c.in[1], c.in[2], {.scale = c.f("scale"), .causal = c.i("causal") != 0, .mask = opt_in(c, 3)});
}
MGN_ORACLE_BUILDER(attention_lse) { return raw_node(c, ir::Op::AttentionLse, c.in, attention_attrs(c)); }
MGN_ORACLE_BUILDER(attention_grad_q) { return attention_grad(c, ir::Op::AttentionGradQ); }
MGN_ORACLE_BUILDER(attention_grad_k) { return attention_grad(c, ir::Op::AttentionGradK); }
MGN_ORACLE_BUILDER(attention_grad_v) { return attention_grad(c, ir::Op::AttentionGradV); }
MGN_ORACLE_BUILDER(rope) { return rope(c.in[0], c.in[1], c.in[2]); }
MGN_ORACLE_BUILDER(rope_tables) {
  auto [cs, sn] = rope_tables(c.in[1], c.in[0].dim(-1), c.f("theta"));
  return rope(c.in[0], cs, sn);
}
