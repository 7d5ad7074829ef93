// The graph builder: a typed static graph of tensors, built with free functions in namespace mgn.
//
//   mgn::Graph g;
//   mgn::Tensor x = g.input("x", {64, 784});
//   mgn::Tensor w = g.parameter("fc.weight", {10, 784}, mgn::Init::kaiming_uniform(std::sqrt(5.0)));
//   mgn::Tensor logits = mgn::linear(x, w);            // x · wᵀ (HF layout: weight [out, in])
//   mgn::Tensor labels = g.input("labels", {64}, mgn::DType::I32);
//   g.output("loss", mgn::cross_entropy(logits, labels));
//
// Shapes are static (rank 0..6) and checked when each op is built: a bad shape, dtype or attribute throws
// mgn::Error naming the op and what was expected. Pointwise ops broadcast like numpy.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mgn/init.h"
#include "mgn/types.h"

namespace mgn {

namespace ir {
class Graph;
}

class Graph;

// A handle to one node of a graph. Cheap to copy; valid while its Graph lives.
class Tensor {
 public:
  Tensor() = default;
  Tensor(ir::Graph* g, int id) : g_(g), id_(id) {}

  bool valid() const { return g_ != nullptr; }
  int id() const { return id_; }
  ir::Graph* graph() const { return g_; }
  const Shape& shape() const;
  DType dtype() const;
  int rank() const { return int(shape().size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const { return mgn::numel(shape()); }
  // Per-node precision policy (overrides the graph default). Unset: CompileOptions::default_precision.
  Tensor& set_precision(Precision p);
  std::optional<Precision> precision() const;
  // A label shown in dumps and errors.
  Tensor& set_name(const std::string& name);

 private:
  ir::Graph* g_ = nullptr;
  int id_ = -1;
};

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // A runtime input, fed before each run (shape-checked).
  Tensor input(const std::string& name, const Shape& shape, DType dtype = DType::F32);
  // A named parameter (trainable unless frozen). Names are the checkpoint contract.
  Tensor parameter(const std::string& name, const Shape& shape, const Init& init = Init::zeros(),
                   DType dtype = DType::F32);
  // Non-trainable named state (running statistics, optimizer moments); updated only through assign().
  Tensor state(const std::string& name, const Shape& shape, const Init& init = Init::zeros(),
               DType dtype = DType::F32);
  Tensor constant(const Shape& shape, std::span<const float> values, DType dtype = DType::F32);
  Tensor constant_i32(const Shape& shape, std::span<const int32_t> values);
  Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  Tensor scalar(double value, DType dtype = DType::F32) { return full({}, value, dtype); }
  void output(const std::string& name, Tensor t);

  // Existing named input or parameter; throws if there is none.
  Tensor get(const std::string& name) const;
  std::optional<Tensor> find(const std::string& name) const;
  // The tensor of an output (Graph::output's name), if there is one, e.g. the loss to differentiate.
  std::optional<Tensor> find_output(const std::string& name) const;
  std::vector<Tensor> parameters() const;
  void freeze(const std::string& name_prefix);  // parameters whose name starts with the prefix

  // The precision nodes built from now on carry; nodes built before (or with none set) take
  // CompileOptions::default_precision.
  void set_precision(Precision p);
  std::string dump() const;         // readable text of every node
  void verify() const;

  ir::Graph& ir() { return *g_; }
  const ir::Graph& ir() const { return *g_; }

 private:
  std::unique_ptr<ir::Graph> g_;
};

// ---- pointwise (numpy broadcasting; both operands of one dtype)
Tensor add(Tensor a, Tensor b);
Tensor sub(Tensor a, Tensor b);
Tensor mul(Tensor a, Tensor b);
Tensor div(Tensor a, Tensor b);
Tensor maximum(Tensor a, Tensor b);
Tensor minimum(Tensor a, Tensor b);
Tensor neg(Tensor x);
Tensor abs(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor sqrt(Tensor x);
Tensor rsqrt(Tensor x);
Tensor reciprocal(Tensor x);
Tensor square(Tensor x);
Tensor pow(Tensor x, double exponent);
Tensor relu(Tensor x);
Tensor leaky_relu(Tensor x, double alpha = 0.01);
Tensor gelu(Tensor x);       // exact: x·Φ(x) with erf
Tensor gelu_tanh(Tensor x);  // tanh approximation (PyTorch approximate="tanh")
Tensor silu(Tensor x);
Tensor sigmoid(Tensor x);
Tensor tanh(Tensor x);
Tensor softplus(Tensor x);
Tensor erf(Tensor x);
Tensor sin(Tensor x);
Tensor cos(Tensor x);
Tensor clamp(Tensor x, double lo, double hi);
Tensor cast(Tensor x, DType to);
Tensor stop_gradient(Tensor x);
Tensor equal(Tensor a, Tensor b);
Tensor not_equal(Tensor a, Tensor b);
Tensor less(Tensor a, Tensor b);
Tensor less_equal(Tensor a, Tensor b);
Tensor greater(Tensor a, Tensor b);
Tensor greater_equal(Tensor a, Tensor b);
Tensor where(Tensor cond, Tensor a, Tensor b);

Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator-(Tensor x);
Tensor operator+(Tensor a, double b);
Tensor operator-(Tensor a, double b);
Tensor operator*(Tensor a, double b);
Tensor operator/(Tensor a, double b);
Tensor operator+(double a, Tensor b);
Tensor operator-(double a, Tensor b);
Tensor operator*(double a, Tensor b);
Tensor operator/(double a, Tensor b);

// ---- reductions (empty axes = all axes)
Tensor sum(Tensor x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(Tensor x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor max(Tensor x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor min(Tensor x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor argmax(Tensor x, int64_t axis = -1, bool keepdim = false);
Tensor softmax(Tensor x, int64_t axis = -1);
Tensor log_softmax(Tensor x, int64_t axis = -1);
Tensor logsumexp(Tensor x, int64_t axis = -1, bool keepdim = false);

// ---- matmul: a [..., M, K] · b [..., K, N], batch axes broadcast
Tensor matmul(Tensor a, Tensor b, bool transpose_a = false, bool transpose_b = false);
// x · weightᵀ (+ bias), weight in HF layout [out, in].
Tensor linear(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt);

// ---- normalization
Tensor layer_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, double eps = 1e-5);
Tensor rms_norm(Tensor x, std::optional<Tensor> weight, double eps = 1e-5);
Tensor group_norm(Tensor x, int64_t groups, std::optional<Tensor> weight, std::optional<Tensor> bias,
                  double eps = 1e-5);
// Normalizes with the batch statistics (over every axis but 1). For eval mode use batch_norm_eval.
Tensor batch_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, double eps = 1e-5);
Tensor batch_norm_eval(Tensor x, Tensor running_mean, Tensor running_var, std::optional<Tensor> weight,
                       std::optional<Tensor> bias, double eps = 1e-5);

// ---- convolution and pooling (NCHW)
struct Conv2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};  // {ph, pw} or {top, left, bottom, right}
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
};
Tensor conv2d(Tensor x, Tensor weight, const Conv2dOptions& opt = {}, std::optional<Tensor> bias = std::nullopt);
struct ConvTranspose2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};         // {ph, pw} or {top, left, bottom, right}, removed from the output
  std::vector<int64_t> output_padding = {0, 0};  // added at the bottom/right; each below its stride or dilation
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
};
// The transposed convolution (PyTorch's conv_transpose2d, ONNX ConvTranspose): x [N, Cin, H, W], weight
// [Cin, Cout/groups, kh, kw] -> [N, Cout, (H-1)*s - pad + d*(k-1) + output_padding + 1, ...]. It is the input
// gradient of conv2d with that weight, and differentiable in x and the weight.
Tensor conv_transpose2d(Tensor x, Tensor weight, const ConvTranspose2dOptions& opt = {},
                        std::optional<Tensor> bias = std::nullopt);
// The two derivatives of conv2d(x, weight, opt) (no bias) for an upstream gradient dy, as autodiff emits
// them, for graphs that need one alone (e.g. to time it): the gradient of x (input_shape: x's shape, which
// the strides leave ambiguous) and the gradient of the weight (weight_shape: its shape).
Tensor conv2d_grad_input(Tensor dy, Tensor weight, const Shape& input_shape, const Conv2dOptions& opt = {});
Tensor conv2d_grad_weight(Tensor x, Tensor dy, const Shape& weight_shape, const Conv2dOptions& opt = {});
struct Conv1dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
};
// x [N, C, L], weight [O, C/groups, k].
Tensor conv1d(Tensor x, Tensor weight, const Conv1dOptions& opt = {}, std::optional<Tensor> bias = std::nullopt);
struct Pool2dOptions {
  std::vector<int64_t> kernel = {2, 2};
  std::vector<int64_t> stride = {};  // empty: same as kernel
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};  // max pool only
  bool count_include_pad = true;           // avg pool only
};
Tensor max_pool2d(Tensor x, const Pool2dOptions& opt = {});
Tensor avg_pool2d(Tensor x, const Pool2dOptions& opt = {});
Tensor global_avg_pool(Tensor x);  // [N, C, H, W] -> [N, C, 1, 1]
Tensor upsample_nearest2d(Tensor x, int64_t scale_h, int64_t scale_w);

// ---- attention: q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D]; query head h reads kv head h / (Hq/Hkv).
struct AttentionOptions {
  double scale = 0;  // 0: 1/sqrt(D)
  bool causal = false;
  std::optional<Tensor> mask;  // additive, broadcast to [B, Hq, Sq, Skv]
};
Tensor attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& opt = {});
// Rotary embedding with half-split pairs (d, d + D/2), cos/sin [S, D/2] (broadcast over leading axes).
Tensor rope(Tensor x, Tensor cos, Tensor sin);
// cos/sin tables for positions (i32 [S]) with the HF Llama frequencies theta^(-2i/D): returns {cos, sin}.
std::pair<Tensor, Tensor> rope_tables(Tensor positions, int64_t head_dim, double theta);

// ---- data movement
Tensor reshape(Tensor x, std::vector<int64_t> shape);  // one -1 allowed
Tensor permute(Tensor x, std::vector<int64_t> perm);
Tensor transpose(Tensor x, int64_t a, int64_t b);
// Per-axis slice of one axis: [start, end) with step (negative start/end count from the end).
Tensor slice(Tensor x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
std::vector<Tensor> split(Tensor x, const std::vector<int64_t>& sizes, int64_t axis);
// pads: {before_0, after_0, before_1, after_1, ...} for the leading axes listed (constant value).
Tensor pad(Tensor x, const std::vector<int64_t>& pads, double value = 0);
Tensor expand(Tensor x, const Shape& shape);
Tensor gather(Tensor table, Tensor indices, int64_t axis = 0);
// Elementwise indexing along `axis` (torch.gather / ONNX GatherElements): indices (i32) have data's rank and
// are no longer than data along the other axes; out[..., j, ...] = data[..., indices[..., j, ...], ...] has the
// shape of indices. Negative indices count from the end; an index out of range is an error on the CPU.
Tensor gather_elements(Tensor data, Tensor indices, int64_t axis);
// How scatter_elements combines an update with what is there (ONNX ScatterElements' reduction).
enum class ScatterReduction : uint8_t { None, Add, Mul, Max, Min };
// A copy of data with updates (the shape of indices) written at data[..., indices[..., j, ...], ...]
// (torch.scatter / ONNX ScatterElements). Duplicate indices apply in index order: None keeps the last update,
// the others combine them all. Differentiable for None and Add.
Tensor scatter_elements(Tensor data, Tensor indices, Tensor updates, int64_t axis,
                        ScatterReduction reduction = ScatterReduction::None);
Tensor index_select(Tensor x, int64_t axis, Tensor indices);  // indices rank 1
Tensor embedding(Tensor table, Tensor ids);                    // table [V, D], ids i32 [...]
Tensor one_hot(Tensor indices, int64_t depth);
Tensor flatten(Tensor x, int64_t start_axis = 1);
Tensor squeeze(Tensor x, int64_t axis);
Tensor unsqueeze(Tensor x, int64_t axis);

// ---- losses (scalars)
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0;
};
// logits [..., C], labels i32 [...]: mean over rows whose label is not ignore_index.
Tensor cross_entropy(Tensor logits, Tensor labels, const CrossEntropyOptions& opt = {});
Tensor mse_loss(Tensor pred, Tensor target);
Tensor l1_loss(Tensor pred, Tensor target);
Tensor bce_with_logits(Tensor logits, Tensor target);

// ---- state: the parameter/state takes `value` at the end of the step (reads in the step see the old value).
Tensor assign(Tensor target, Tensor value);

}  // namespace mgn
