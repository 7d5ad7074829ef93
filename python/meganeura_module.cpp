// The Python extension _meganeura (pybind11): graphs, ONNX and Hugging Face imports, sessions, safetensors,
// devices and datasets, with NumPy arrays in and out. It uses the public headers only (include/mgn), like
// tools/. The package python/meganeura/__init__.py re-exports it with a few pure-Python helpers.
//
// Arrays in: a C-contiguous float32 (or int32) array is read where it lies (buffer protocol, no copy); any
// other array is converted once. Arrays out: the vector the library returns becomes the array's memory (no
// second copy). mgn::Error becomes meganeura.Error (a RuntimeError) with the same message.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mgn/audio.h"
#include "mgn/checkpoint.h"
#include "mgn/data.h"
#include "mgn/device.h"
#include "mgn/environment.h"
#include "mgn/graph.h"
#include "mgn/llama.h"
#include "mgn/models.h"
#include "mgn/nn.h"
#include "mgn/nnef.h"
#include "mgn/onnx.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "mgn/tokenizer.h"
#include "mgn/train.h"
#include "mgn/whisper.h"

namespace py = pybind11;

namespace {

using mgn::Shape;

// A graph shared by the Python objects that point into it: every Tensor keeps its graph alive.
using GraphPtr = std::shared_ptr<mgn::Graph>;

struct PyTensor {
  mgn::Tensor t;
  GraphPtr g;
};

PyTensor wrap(mgn::Tensor t, const GraphPtr& g) {
  return {t, g};
}

// Builds every op of graph.h as a Python function over PyTensors: the result shares the first operand's
// graph.
template <class F>
auto unary(F f) {
  return [f](const PyTensor& x) { return wrap(f(x.t), x.g); };
}
template <class F>
auto binary(F f) {
  return [f](const PyTensor& a, const PyTensor& b) {
    if (a.g != b.g) throw mgn::Error("the two operands belong to different graphs");
    return wrap(f(a.t, b.t), a.g);
  };
}

std::optional<mgn::Tensor> opt(const std::optional<PyTensor>& t) {
  return t ? std::optional<mgn::Tensor>(t->t) : std::nullopt;
}

mgn::DType dtype_of(const std::string& name) {
  return mgn::dtype_from_name(name);
}

// ---- arrays

template <class T>
py::array_t<T> to_array(std::vector<T>&& v, const Shape& shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array_t<T>(dims, heap->data(), owner);
}

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

bool is_integer_array(const py::array& a) {
  char k = a.dtype().kind();
  return k == 'i' || k == 'u' || k == 'b';
}

// ---- sessions

struct PySession {
  mgn::Session s;

  void set_input(const std::string& name, const py::array& values) {
    if (is_integer_array(values)) {
      I32Array a = I32Array::ensure(values);
      if (!a) throw mgn::Error("input '" + name + "': the array does not convert to int32");
      s.set_input(name, std::span<const int32_t>(a.data(), size_t(a.size())));
    } else {
      F32Array a = F32Array::ensure(values);
      if (!a) throw mgn::Error("input '" + name + "': the array does not convert to float32");
      s.set_input(name, std::span<const float>(a.data(), size_t(a.size())));
    }
  }
  void set_inputs(const py::dict& inputs) {
    for (auto [k, v] : inputs) set_input(py::cast<std::string>(k), py::cast<py::array>(v));
  }
  py::array read(const std::string& name) {
    std::vector<float> v;
    {
      py::gil_scoped_release nogil;
      v = s.read(name);
    }
    return to_array(std::move(v), s.shape_of(name));
  }
};

mgn::Backend backend_of(const std::string& s) {
  return mgn::backend_from_name(s);
}

mgn::Precision precision_of(const std::string& s) {
  if (s == "strict") return mgn::Precision::Strict;
  if (s == "accelerated") return mgn::Precision::Accelerated;
  throw mgn::Error("precision '" + s + "': expected strict or accelerated");
}

mgn::Mode mode_of(const std::string& s) {
  if (s == "train") return mgn::Mode::Train;
  if (s == "infer") return mgn::Mode::Infer;
  throw mgn::Error("mode '" + s + "': expected train or infer");
}

// compile(graph, options=None, **fields): `fields` set CompileOptions attributes by name on a copy.
PySession compile_graph(const GraphPtr& g, std::optional<mgn::CompileOptions> options, const py::kwargs& kw) {
  mgn::CompileOptions o = options.value_or(mgn::CompileOptions{});
  if (kw.size()) {
    py::object po = py::cast(o);
    for (auto [k, v] : kw) {
      std::string key = py::cast<std::string>(k);
      if (!py::hasattr(po, key.c_str()))
        throw mgn::Error("compile: unknown option '" + key + "' (see meganeura.CompileOptions)");
      po.attr(key.c_str()) = v;
    }
    o = py::cast<mgn::CompileOptions>(po);
  }
  py::gil_scoped_release nogil;
  return PySession{mgn::compile(*g, o)};
}

py::dict tensors_to_dict(const std::vector<const mgn::StoredTensor*>& ts) {
  py::dict out;
  for (const mgn::StoredTensor* t : ts) {
    if (t->dtype == "I32" || t->dtype == "I64" || t->dtype == "I16" || t->dtype == "I8" || t->dtype == "U8" ||
        t->dtype == "BOOL")
      out[py::str(t->name)] = to_array(t->to_i32(), t->shape);
    else
      out[py::str(t->name)] = to_array(t->to_f32(), t->shape);
  }
  return out;
}

mgn::StoredTensor stored_from_array(const std::string& name, const py::array& a, const std::string& as) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  if (is_integer_array(a)) {
    I32Array v = I32Array::ensure(a);
    return mgn::StoredTensor::from_i32(name, shape, std::vector<int32_t>(v.data(), v.data() + v.size()));
  }
  F32Array v = F32Array::ensure(a);
  return mgn::StoredTensor::from_f32(name, shape, std::vector<float>(v.data(), v.data() + v.size()),
                                     mgn::dtype_from_name(as));
}

py::dict device_dict(const mgn::DeviceDescription& d) {
  py::dict r;
  r["index"] = d.index;
  r["name"] = d.name;
  r["type"] = d.type;
  r["api_version"] = d.api_version;
  r["driver"] = d.driver;
  if (!d.features.empty()) {
    r["features"] = d.features;
    r["subgroup_size"] = d.subgroup_size;
    r["max_shared_bytes"] = d.max_shared_bytes;
    r["f16_gemm"] = d.f16_gemm;
    r["f16_gemm_verified"] = d.f16_gemm_verified;
  }
  return r;
}

}  // namespace

PYBIND11_MODULE(_meganeura, m) {
  m.doc() = "meganeura: compile, train and run neural networks on Vulkan GPUs (C++ extension)";
  py::register_exception<mgn::Error>(m, "Error", PyExc_RuntimeError);

  // ---- graphs
  py::class_<PyTensor>(m, "Tensor", "A node of a Graph (keeps the graph alive).")
      .def_property_readonly("shape", [](const PyTensor& t) { return t.t.shape(); })
      .def_property_readonly("dtype",
                             [](const PyTensor& t) { return std::string(mgn::dtype_name(t.t.dtype())); })
      .def_property_readonly("id", [](const PyTensor& t) { return t.t.id(); })
      .def_property_readonly("graph", [](const PyTensor& t) { return t.g; })
      .def("set_name",
           [](PyTensor& t, const std::string& n) {
             t.t.set_name(n);
             return t;
           })
      .def("__add__", binary([](mgn::Tensor a, mgn::Tensor b) { return a + b; }))
      .def("__sub__", binary([](mgn::Tensor a, mgn::Tensor b) { return a - b; }))
      .def("__mul__", binary([](mgn::Tensor a, mgn::Tensor b) { return a * b; }))
      .def("__truediv__", binary([](mgn::Tensor a, mgn::Tensor b) { return a / b; }))
      .def("__matmul__", binary([](mgn::Tensor a, mgn::Tensor b) { return mgn::matmul(a, b); }))
      .def("__add__", [](const PyTensor& a, double b) { return wrap(a.t + b, a.g); })
      .def("__sub__", [](const PyTensor& a, double b) { return wrap(a.t - b, a.g); })
      .def("__mul__", [](const PyTensor& a, double b) { return wrap(a.t * b, a.g); })
      .def("__truediv__", [](const PyTensor& a, double b) { return wrap(a.t / b, a.g); })
      .def("__radd__", [](const PyTensor& a, double b) { return wrap(b + a.t, a.g); })
      .def("__rsub__", [](const PyTensor& a, double b) { return wrap(b - a.t, a.g); })
      .def("__rmul__", [](const PyTensor& a, double b) { return wrap(b * a.t, a.g); })
      .def("__rtruediv__", [](const PyTensor& a, double b) { return wrap(b / a.t, a.g); })
      .def("__neg__", unary([](mgn::Tensor x) { return -x; }))
      .def("__repr__", [](const PyTensor& t) {
        return "<meganeura.Tensor %" + std::to_string(t.t.id()) + " " + mgn::dtype_name(t.t.dtype()) + " " +
               mgn::shape_str(t.t.shape()) + ">";
      });

  py::class_<mgn::Graph, GraphPtr>(m, "Graph", "A typed static graph; build it with the op functions.")
      .def(py::init<>())
      .def(
          "input",
          [](const GraphPtr& g, const std::string& name, const Shape& shape, const std::string& dtype) {
            return wrap(g->input(name, shape, dtype_of(dtype)), g);
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "f32")
      .def(
          "parameter",
          [](const GraphPtr& g, const std::string& name, const Shape& shape, std::optional<F32Array> value) {
            mgn::Init init = mgn::Init::zeros();
            if (value)
              init = mgn::Init::from_data(std::vector<float>(value->data(), value->data() + value->size()));
            return wrap(g->parameter(name, shape, init), g);
          },
          py::arg("name"), py::arg("shape"), py::arg("value") = std::nullopt,
          "A trainable parameter, zeros or `value` (an array of that many elements).")
      .def(
          "constant",
          [](const GraphPtr& g, const py::array& value) {
            Shape shape(value.shape(), value.shape() + value.ndim());
            if (is_integer_array(value)) {
              I32Array v = I32Array::ensure(value);
              return wrap(g->constant_i32(shape, std::span<const int32_t>(v.data(), size_t(v.size()))), g);
            }
            F32Array v = F32Array::ensure(value);
            return wrap(g->constant(shape, std::span<const float>(v.data(), size_t(v.size()))), g);
          },
          py::arg("value"))
      .def(
          "scalar", [](const GraphPtr& g, double v) { return wrap(g->scalar(v), g); }, py::arg("value"))
      .def(
          "output",
          [](const GraphPtr& g, const std::string& name, const PyTensor& t) { g->output(name, t.t); },
          py::arg("name"), py::arg("tensor"))
      .def("get", [](const GraphPtr& g, const std::string& name) { return wrap(g->get(name), g); })
      .def("parameters",
           [](const GraphPtr& g) {
             std::vector<PyTensor> out;
             for (mgn::Tensor t : g->parameters()) out.push_back(wrap(t, g));
             return out;
           })
      .def("freeze", &mgn::Graph::freeze, py::arg("name_prefix"))
      .def("dump", &mgn::Graph::dump)
      .def("verify", &mgn::Graph::verify);

  // Pointwise, reductions, matmul, shapes, losses.
#define MGN_UNARY(name) m.def(#name, unary([](mgn::Tensor x) { return mgn::name(x); }), py::arg("x"))
  MGN_UNARY(neg);
  MGN_UNARY(abs);
  MGN_UNARY(exp);
  MGN_UNARY(log);
  MGN_UNARY(sqrt);
  MGN_UNARY(rsqrt);
  MGN_UNARY(reciprocal);
  MGN_UNARY(square);
  MGN_UNARY(relu);
  MGN_UNARY(gelu);
  MGN_UNARY(gelu_tanh);
  MGN_UNARY(silu);
  MGN_UNARY(sigmoid);
  MGN_UNARY(tanh);
  MGN_UNARY(softplus);
  MGN_UNARY(erf);
  MGN_UNARY(sin);
  MGN_UNARY(cos);
  MGN_UNARY(stop_gradient);
  MGN_UNARY(global_avg_pool);
#undef MGN_UNARY
#define MGN_BINARY(name)                                                                           \
  m.def(#name, binary([](mgn::Tensor a, mgn::Tensor b) { return mgn::name(a, b); }), py::arg("a"), \
        py::arg("b"))
  MGN_BINARY(add);
  MGN_BINARY(sub);
  MGN_BINARY(mul);
  MGN_BINARY(div);
  MGN_BINARY(maximum);
  MGN_BINARY(minimum);
  MGN_BINARY(equal);
  MGN_BINARY(less);
  MGN_BINARY(greater);
  MGN_BINARY(mse_loss);
  MGN_BINARY(l1_loss);
  MGN_BINARY(bce_with_logits);
  MGN_BINARY(embedding);
  MGN_BINARY(assign);
#undef MGN_BINARY
  m.def(
      "pow", [](const PyTensor& x, double e) { return wrap(mgn::pow(x.t, e), x.g); }, py::arg("x"),
      py::arg("exponent"));
  m.def(
      "leaky_relu", [](const PyTensor& x, double a) { return wrap(mgn::leaky_relu(x.t, a), x.g); },
      py::arg("x"), py::arg("alpha") = 0.01);
  m.def(
      "clamp", [](const PyTensor& x, double lo, double hi) { return wrap(mgn::clamp(x.t, lo, hi), x.g); },
      py::arg("x"), py::arg("lo"), py::arg("hi"));
  m.def(
      "cast",
      [](const PyTensor& x, const std::string& to) { return wrap(mgn::cast(x.t, dtype_of(to)), x.g); },
      py::arg("x"), py::arg("dtype"));
  m.def(
      "where",
      [](const PyTensor& c, const PyTensor& a, const PyTensor& b) {
        return wrap(mgn::where(c.t, a.t, b.t), c.g);
      },
      py::arg("cond"), py::arg("a"), py::arg("b"));
#define MGN_REDUCE(name)                                               \
  m.def(                                                               \
      #name,                                                           \
      [](const PyTensor& x, std::vector<int64_t> axes, bool keepdim) { \
        return wrap(mgn::name(x.t, std::move(axes), keepdim), x.g);    \
      },                                                               \
      py::arg("x"), py::arg("axes") = std::vector<int64_t>{}, py::arg("keepdim") = false)
  MGN_REDUCE(sum);
  MGN_REDUCE(mean);
  MGN_REDUCE(max);
  MGN_REDUCE(min);
#undef MGN_REDUCE
  m.def(
      "argmax",
      [](const PyTensor& x, int64_t axis, bool keepdim) {
        return wrap(mgn::argmax(x.t, axis, keepdim), x.g);
      },
      py::arg("x"), py::arg("axis") = -1, py::arg("keepdim") = false);
  m.def(
      "softmax", [](const PyTensor& x, int64_t axis) { return wrap(mgn::softmax(x.t, axis), x.g); },
      py::arg("x"), py::arg("axis") = -1);
  m.def(
      "log_softmax", [](const PyTensor& x, int64_t axis) { return wrap(mgn::log_softmax(x.t, axis), x.g); },
      py::arg("x"), py::arg("axis") = -1);
  m.def(
      "matmul",
      [](const PyTensor& a, const PyTensor& b, bool ta, bool tb) {
        return wrap(mgn::matmul(a.t, b.t, ta, tb), a.g);
      },
      py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false);
  m.def(
      "linear",
      [](const PyTensor& x, const PyTensor& w, const std::optional<PyTensor>& b) {
        return wrap(mgn::linear(x.t, w.t, opt(b)), x.g);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias") = std::nullopt,
      "x · weightᵀ (+ bias); weight [out, in]");
  m.def(
      "layer_norm",
      [](const PyTensor& x, const std::optional<PyTensor>& w, const std::optional<PyTensor>& b, double eps) {
        return wrap(mgn::layer_norm(x.t, opt(w), opt(b), eps), x.g);
      },
      py::arg("x"), py::arg("weight") = std::nullopt, py::arg("bias") = std::nullopt, py::arg("eps") = 1e-5);
  m.def(
      "rms_norm",
      [](const PyTensor& x, const std::optional<PyTensor>& w, double eps) {
        return wrap(mgn::rms_norm(x.t, opt(w), eps), x.g);
      },
      py::arg("x"), py::arg("weight") = std::nullopt, py::arg("eps") = 1e-5);
  m.def(
      "conv2d",
      [](const PyTensor& x, const PyTensor& w, const std::optional<PyTensor>& b, std::vector<int64_t> stride,
         std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
        return wrap(
            mgn::conv2d(x.t, w.t,
                        {.stride = stride, .padding = padding, .dilation = dilation, .groups = groups},
                        opt(b)),
            x.g);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias") = std::nullopt,
      py::arg("stride") = std::vector<int64_t>{1, 1}, py::arg("padding") = std::vector<int64_t>{0, 0},
      py::arg("dilation") = std::vector<int64_t>{1, 1}, py::arg("groups") = 1);
  m.def(
      "max_pool2d",
      [](const PyTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
         std::vector<int64_t> padding) {
        return wrap(mgn::max_pool2d(x.t, {.kernel = kernel, .stride = stride, .padding = padding}), x.g);
      },
      py::arg("x"), py::arg("kernel") = std::vector<int64_t>{2, 2},
      py::arg("stride") = std::vector<int64_t>{}, py::arg("padding") = std::vector<int64_t>{0, 0});
  m.def(
      "avg_pool2d",
      [](const PyTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
         std::vector<int64_t> padding) {
        return wrap(mgn::avg_pool2d(x.t, {.kernel = kernel, .stride = stride, .padding = padding}), x.g);
      },
      py::arg("x"), py::arg("kernel") = std::vector<int64_t>{2, 2},
      py::arg("stride") = std::vector<int64_t>{}, py::arg("padding") = std::vector<int64_t>{0, 0});
  m.def(
      "attention",
      [](const PyTensor& q, const PyTensor& k, const PyTensor& v, bool causal, double scale) {
        return wrap(mgn::attention(q.t, k.t, v.t, {.scale = scale, .causal = causal}), q.g);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = 0.0);
  m.def(
      "reshape",
      [](const PyTensor& x, std::vector<int64_t> s) { return wrap(mgn::reshape(x.t, std::move(s)), x.g); },
      py::arg("x"), py::arg("shape"));
  m.def(
      "permute",
      [](const PyTensor& x, std::vector<int64_t> p) { return wrap(mgn::permute(x.t, std::move(p)), x.g); },
      py::arg("x"), py::arg("perm"));
  m.def(
      "transpose",
      [](const PyTensor& x, int64_t a, int64_t b) { return wrap(mgn::transpose(x.t, a, b), x.g); },
      py::arg("x"), py::arg("a"), py::arg("b"));
  m.def(
      "flatten", [](const PyTensor& x, int64_t start) { return wrap(mgn::flatten(x.t, start), x.g); },
      py::arg("x"), py::arg("start_axis") = 1);
  m.def(
      "slice",
      [](const PyTensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
        return wrap(mgn::slice(x.t, axis, start, end, step), x.g);
      },
      py::arg("x"), py::arg("axis"), py::arg("start"), py::arg("end"), py::arg("step") = 1);
  m.def(
      "concat",
      [](const std::vector<PyTensor>& xs, int64_t axis) {
        if (xs.empty()) throw mgn::Error("concat: no tensors");
        std::vector<mgn::Tensor> ts;
        for (const PyTensor& x : xs) ts.push_back(x.t);
        return wrap(mgn::concat(ts, axis), xs[0].g);
      },
      py::arg("tensors"), py::arg("axis"));
  m.def(
      "squeeze", [](const PyTensor& x, int64_t a) { return wrap(mgn::squeeze(x.t, a), x.g); }, py::arg("x"),
      py::arg("axis"));
  m.def(
      "unsqueeze", [](const PyTensor& x, int64_t a) { return wrap(mgn::unsqueeze(x.t, a), x.g); },
      py::arg("x"), py::arg("axis"));
  m.def(
      "one_hot", [](const PyTensor& x, int64_t d) { return wrap(mgn::one_hot(x.t, d), x.g); },
      py::arg("indices"), py::arg("depth"));
  m.def(
      "cross_entropy",
      [](const PyTensor& logits, const PyTensor& labels, int64_t ignore_index, double smoothing) {
        return wrap(mgn::cross_entropy(logits.t, labels.t,
                                       {.ignore_index = ignore_index, .label_smoothing = smoothing}),
                    logits.g);
      },
      py::arg("logits"), py::arg("labels"), py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0);

  // Layer helpers (PyTorch initializers, Hugging Face names).
  py::module_ nn =
      m.def_submodule("nn", "Layer helpers: parameters under a name prefix, PyTorch's initializers.");
  nn.def(
      "linear",
      [](const GraphPtr& g, const std::string& name, const PyTensor& x, int64_t out, bool bias,
         uint64_t seed) {
        return wrap(mgn::nn::linear(*g, name, x.t, out, {.bias = bias, .seed = seed}), g);
      },
      py::arg("graph"), py::arg("name"), py::arg("x"), py::arg("out_features"), py::arg("bias") = true,
      py::arg("seed") = 0);
  nn.def(
      "conv2d",
      [](const GraphPtr& g, const std::string& name, const PyTensor& x, int64_t out, int64_t kernel,
         std::vector<int64_t> stride, std::vector<int64_t> padding, bool bias, uint64_t seed) {
        return wrap(mgn::nn::conv2d(*g, name, x.t, out, kernel,
                                    {.stride = stride, .padding = padding, .bias = bias, .seed = seed}),
                    g);
      },
      py::arg("graph"), py::arg("name"), py::arg("x"), py::arg("out_channels"), py::arg("kernel"),
      py::arg("stride") = std::vector<int64_t>{1, 1}, py::arg("padding") = std::vector<int64_t>{0, 0},
      py::arg("bias") = true, py::arg("seed") = 0);
  nn.def(
      "layer_norm",
      [](const GraphPtr& g, const std::string& name, const PyTensor& x, double eps) {
        return wrap(mgn::nn::layer_norm(*g, name, x.t, eps), g);
      },
      py::arg("graph"), py::arg("name"), py::arg("x"), py::arg("eps") = 1e-5);
  nn.def(
      "embedding",
      [](const GraphPtr& g, const std::string& name, const PyTensor& ids, int64_t vocab, int64_t dim) {
        return wrap(mgn::nn::embedding(*g, name, ids.t, vocab, dim), g);
      },
      py::arg("graph"), py::arg("name"), py::arg("ids"), py::arg("vocab"), py::arg("dim"));

  // ---- models
  py::module_ models = m.def_submodule("models", "Model builders (graphs with fixed names).");
  models.def(
      "fashion_mnist",
      [](const std::string& arch, int64_t batch, const std::string& mode, int64_t hidden, uint64_t seed) {
        return std::make_shared<mgn::Graph>(
            mgn::models::fashion_mnist({.arch = mgn::models::fashion_arch_from_name(arch),
                                        .batch = batch,
                                        .mode = mode_of(mode),
                                        .hidden = hidden,
                                        .seed = seed}));
      },
      py::arg("arch") = "mlp", py::arg("batch") = 64, py::arg("mode") = "train", py::arg("hidden") = 0,
      py::arg("seed") = 0,
      "Fashion-MNIST classifier: input x [batch, 1, 28, 28], output logits [batch, 10]; train adds labels "
      "and loss.");

  // ---- compiling and sessions
  py::class_<mgn::SGD>(m, "SGD")
      .def(py::init([](double lr, double momentum, bool nesterov, double wd) {
             return mgn::SGD{.lr = lr, .momentum = momentum, .nesterov = nesterov, .weight_decay = wd};
           }),
           py::arg("lr") = 1e-2, py::arg("momentum") = 0.0, py::arg("nesterov") = false,
           py::arg("weight_decay") = 0.0)
      .def_readwrite("lr", &mgn::SGD::lr);
  py::class_<mgn::Adam>(m, "Adam")
      .def(py::init([](double lr, double b1, double b2, double eps, double wd) {
             return mgn::Adam{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd};
           }),
           py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 0.0)
      .def_readwrite("lr", &mgn::Adam::lr);
  py::class_<mgn::AdamW>(m, "AdamW")
      .def(py::init([](double lr, double b1, double b2, double eps, double wd) {
             return mgn::AdamW{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd};
           }),
           py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 1e-2)
      .def_readwrite("lr", &mgn::AdamW::lr);

  // CompileOptions with text-valued enums ("train"/"infer", "auto"/"cpu"/"vulkan", "strict"/"accelerated").
  py::class_<mgn::CompileOptions>(
      m, "CompileOptions",
      "Typed compile options (include/mgn/session.h); compile() also takes them as keywords.")
      .def(py::init<>())
      .def_property(
          "mode", [](const mgn::CompileOptions& o) { return o.mode == mgn::Mode::Train ? "train" : "infer"; },
          [](mgn::CompileOptions& o, const std::string& s) { o.mode = mode_of(s); })
      .def_property(
          "backend", [](const mgn::CompileOptions& o) { return std::string(mgn::backend_name(o.backend)); },
          [](mgn::CompileOptions& o, const std::string& s) { o.backend = backend_of(s); })
      .def_property(
          "optimizer", [](const mgn::CompileOptions& o) { return o.optimizer; },
          [](mgn::CompileOptions& o, const mgn::Optimizer& v) { o.optimizer = v; })
      .def_property(
          "precision",
          [](const mgn::CompileOptions& o) { return std::string(mgn::precision_name(o.default_precision)); },
          [](mgn::CompileOptions& o, const std::string& s) { o.default_precision = precision_of(s); })
      .def_property(
          "device", [](const mgn::CompileOptions& o) { return o.device.device; },
          [](mgn::CompileOptions& o, const std::string& s) { o.device.device = s; },
          "a device index or part of its name (meganeura.devices()); empty: the best one")
      .def_property(
          "validation", [](const mgn::CompileOptions& o) { return o.device.validation; },
          [](mgn::CompileOptions& o, bool v) { o.device.validation = v; },
          "Vulkan validation layer on; any message becomes an error")
      .def_property(
          "clip_grad_norm", [](const mgn::CompileOptions& o) { return o.update.clip_grad_norm; },
          [](mgn::CompileOptions& o, double v) { o.update.clip_grad_norm = v; })
      .def_readwrite("loss", &mgn::CompileOptions::loss)
      .def_readwrite("cache_dir", &mgn::CompileOptions::cache_dir)
      .def_readwrite("profile", &mgn::CompileOptions::profile)
      .def_readwrite("submissions", &mgn::CompileOptions::submissions);

  m.def(
      "options_from_environment",
      [](const std::string& mode) {
        mgn::CompileOptions o;
        o.mode = mode_of(mode);
        mgn::read_environment().apply(o);
        return o;
      },
      py::arg("mode") = "infer",
      "CompileOptions with the MGN_* variables applied (device, kernels, cache folder), as the mgn tool "
      "does.");

  py::class_<PySession>(m, "Session", "A compiled graph bound to a device.")
      .def_property_readonly(
          "mode", [](const PySession& s) { return s.s.mode() == mgn::Mode::Train ? "train" : "infer"; })
      .def_property_readonly("backend", [](const PySession& s) { return std::string(s.s.backend()); })
      .def_property_readonly("device_type", [](const PySession& s) { return std::string(s.s.device_type()); })
      .def("set_input", &PySession::set_input, py::arg("name"), py::arg("values"),
           "Feed an input from an array of its shape (float32 or int32 C-contiguous arrays are read in "
           "place).")
      .def("set_inputs", &PySession::set_inputs, py::arg("inputs"))
      .def(
          "step",
          [](PySession& s, std::optional<py::dict> inputs) {
            if (inputs) s.set_inputs(*inputs);
            py::gil_scoped_release nogil;
            s.s.step();
          },
          py::arg("inputs") = std::nullopt, "Train: forward + backward + optimizer update")
      .def(
          "run",
          [](PySession& s, std::optional<py::dict> inputs) {
            if (inputs) s.set_inputs(*inputs);
            {
              py::gil_scoped_release nogil;
              s.s.run();
            }
            py::dict out;
            for (const std::string& n : s.s.output_names()) out[py::str(n)] = s.read(n);
            return out;
          },
          py::arg("inputs") = std::nullopt, "Infer: evaluate and return every output by name")
      .def("read", &PySession::read, py::arg("name"), "An output, parameter or state tensor as an array")
      .def("read_scalar", [](PySession& s, const std::string& n) { return s.s.read_scalar(n); })
      .def(
          "write_parameter",
          [](PySession& s, const std::string& name, const F32Array& v) {
            s.s.write_parameter(name, std::span<const float>(v.data(), size_t(v.size())));
          },
          py::arg("name"), py::arg("values"))
      .def("shape_of", [](const PySession& s, const std::string& n) { return s.s.shape_of(n); })
      .def_property_readonly("input_names", [](const PySession& s) { return s.s.input_names(); })
      .def_property_readonly("output_names", [](const PySession& s) { return s.s.output_names(); })
      .def_property_readonly("state_names", [](const PySession& s) { return s.s.state_names(); })
      .def("state_dict",
           [](PySession& s) {
             py::dict d;
             for (const std::string& n : s.s.state_names()) d[py::str(n)] = s.read(n);
             return d;
           })
      .def("load_state_dict",
           [](PySession& s, const py::dict& d) {
             for (auto [k, v] : d) {
               F32Array a = F32Array::ensure(v);
               s.s.write_parameter(py::cast<std::string>(k),
                                   std::span<const float>(a.data(), size_t(a.size())));
             }
           })
      .def_property(
          "lr", [](const PySession& s) { return s.s.lr(); }, [](PySession& s, double v) { s.s.set_lr(v); })
      .def_property_readonly("step_count", [](const PySession& s) { return s.s.step_count(); })
      .def(
          "save_checkpoint", [](PySession& s, const std::string& p) { s.s.save_checkpoint(p); },
          py::arg("path"))
      .def(
          "load_checkpoint",
          [](PySession& s, const std::string& p, bool require_optimizer_state) {
            s.s.load_checkpoint(p, {.require_optimizer_state = require_optimizer_state});
          },
          py::arg("path"), py::arg("require_optimizer_state") = true)
      .def("kernel_sources", [](const PySession& s) { return s.s.kernel_sources(); });

  m.def(
      "compile", &compile_graph, py::arg("graph"), py::arg("options") = std::nullopt,
      "Compile a graph: compile(g, mode='train', optimizer=AdamW(lr=1e-3), backend='auto', device='', ...). "
      "In train mode the backward pass and the update are appended to the graph itself: compile it once.");

  // ---- devices
  m.def(
      "devices",
      [] {
        py::list out;
        for (const mgn::DeviceDescription& d : mgn::list_devices()) out.append(device_dict(d));
        return out;
      },
      "The Vulkan devices, as dicts (index, name, type, api_version, driver).");
  m.def(
      "describe_device",
      [](const std::string& device) { return device_dict(mgn::describe_device({.device = device})); },
      py::arg("device") = "", "The selected device with its features and the f16 GEMM self-test verdict.");

  // ---- files
  m.def(
      "load_safetensors",
      [](const std::string& path) {
        mgn::TensorSet ts = mgn::read_tensor_set(path);
        std::vector<const mgn::StoredTensor*> ptrs;
        for (auto& [n, t] : ts.tensors) ptrs.push_back(&t);
        return py::make_tuple(tensors_to_dict(ptrs), ts.metadata);
      },
      py::arg("path"),
      "(tensors, metadata) of a .safetensors file or sharded index; floats as float32, integers as int32.");
  m.def(
      "save_safetensors",
      [](const std::string& path, const py::dict& tensors, const std::map<std::string, std::string>& metadata,
         const std::string& dtype) {
        std::vector<mgn::StoredTensor> ts;
        for (auto [k, v] : tensors)
          ts.push_back(stored_from_array(py::cast<std::string>(k), py::cast<py::array>(v), dtype));
        mgn::write_safetensors(path, ts, metadata);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
      py::arg("dtype") = "f32",
      "Write arrays (float as `dtype`: f32, f16 or bf16; integers as I32) atomically.");

  // ---- ONNX
  py::module_ onnx = m.def_submodule("onnx", "ONNX import (opsets 13-17).");
  onnx.def(
      "import_file",
      [](const std::string& path, const std::map<std::string, Shape>& input_shapes, bool trainable) {
        mgn::onnx::Imported im =
            mgn::onnx::import_file(path, {.input_shapes = input_shapes, .trainable = trainable});
        py::dict r;
        r["graph"] = std::make_shared<mgn::Graph>(std::move(im.graph));
        r["inputs"] = im.inputs;
        r["outputs"] = im.outputs;
        r["parameter_count"] = im.parameter_count;
        r["opset"] = im.opset;
        return r;
      },
      py::arg("path"), py::arg("input_shapes") = std::map<std::string, Shape>{}, py::arg("trainable") = false,
      "Import a model: a dict with graph, inputs, outputs, parameter_count, opset.");
  onnx.def("inspect", &mgn::onnx::inspect, py::arg("path"));
  onnx.def("supported_ops", &mgn::onnx::supported_ops);

  // ---- NNEF
  py::module_ nnef = m.def_submodule("nnef", "NNEF import (a folder with graph.nnef and .dat tensors).");
  nnef.def(
      "import_path",
      [](const std::string& path, const std::map<std::string, Shape>& input_shapes, bool trainable) {
        mgn::nnef::Imported im = mgn::nnef::import_path(path, {.input_shapes = input_shapes, .trainable = trainable});
        py::dict r;
        r["graph"] = std::make_shared<mgn::Graph>(std::move(im.graph));
        r["inputs"] = im.inputs;
        r["outputs"] = im.outputs;
        r["parameter_count"] = im.parameter_count;
        r["version"] = im.version;
        return r;
      },
      py::arg("path"), py::arg("input_shapes") = std::map<std::string, Shape>{}, py::arg("trainable") = false,
      "Import a model: a dict with graph, inputs, outputs, parameter_count, version.");
  nnef.def("inspect", &mgn::nnef::inspect, py::arg("path"));
  nnef.def("supported_ops", &mgn::nnef::supported_ops);

  // ---- Llama-family (Hugging Face directories)
  py::module_ llama = m.def_submodule("llama", "Llama-family models from Hugging Face directories.");
  py::class_<mgn::llama::Config>(llama, "Config")
      .def_static("from_file", &mgn::llama::Config::from_file, py::arg("path"))
      .def_static("from_json", &mgn::llama::Config::from_json, py::arg("text"),
                  py::arg("origin") = "config.json")
      .def_static("tiny", &mgn::llama::Config::tiny)
      .def_readwrite("vocab_size", &mgn::llama::Config::vocab_size)
      .def_readwrite("hidden_size", &mgn::llama::Config::hidden_size)
      .def_readwrite("num_hidden_layers", &mgn::llama::Config::num_hidden_layers)
      .def_readwrite("num_attention_heads", &mgn::llama::Config::num_attention_heads)
      .def_readwrite("num_key_value_heads", &mgn::llama::Config::num_key_value_heads)
      .def_readwrite("intermediate_size", &mgn::llama::Config::intermediate_size)
      .def_readwrite("tie_word_embeddings", &mgn::llama::Config::tie_word_embeddings);
  llama.def(
      "prefill_graph",
      [](const mgn::llama::Config& c, int64_t batch, int64_t seq, uint64_t seed) {
        return std::make_shared<mgn::Graph>(
            mgn::llama::prefill_graph(c, {.batch = batch, .seq = seq, .seed = seed}));
      },
      py::arg("config"), py::arg("batch") = 1, py::arg("seq") = 1, py::arg("seed") = 0,
      "ids i32 [batch, seq] -> logits [batch, seq, vocab]");
  llama.def(
      "loss_graph",
      [](const mgn::llama::Config& c, int64_t batch, int64_t seq, uint64_t seed) {
        return std::make_shared<mgn::Graph>(
            mgn::llama::loss_graph(c, {.batch = batch, .seq = seq, .seed = seed}));
      },
      py::arg("config"), py::arg("batch") = 1, py::arg("seq") = 1, py::arg("seed") = 0,
      "ids, labels i32 [batch, seq] -> loss, logits");
  llama.def(
      "load_weights",
      [](PySession& s, const mgn::llama::Config& c, const std::string& path) {
        py::gil_scoped_release nogil;
        mgn::llama::load_weights(s.s, mgn::llama::read_weights(c, path));
      },
      py::arg("session"), py::arg("config"), py::arg("path"),
      "Read a model directory's (or file's) weights and write them into the session's parameters.");

  py::class_<mgn::Tokenizer>(m, "Tokenizer", "Byte-level BPE from a Hugging Face tokenizer.json.")
      .def_static("from_file", &mgn::Tokenizer::from_file, py::arg("path"))
      .def(
          "encode",
          [](const mgn::Tokenizer& t, const std::string& text, bool add_special) {
            return t.encode(text, add_special);
          },
          py::arg("text"), py::arg("add_special") = false)
      .def("decode", &mgn::Tokenizer::decode, py::arg("ids"), py::arg("skip_special") = false)
      .def_property_readonly("vocab_size", &mgn::Tokenizer::vocab_size);

  // ---- audio and Whisper
  py::module_ audio =
      m.def_submodule("audio", "Sound files (libsndfile), resampling, Whisper's log-mel spectrogram.");
  audio.def(
      "read",
      [](const std::string& path) {
        mgn::audio::Audio a = mgn::audio::read(path);
        const int64_t n = int64_t(a.samples.size());
        return py::make_tuple(to_array(std::move(a.samples), {n}), a.sample_rate, a.channels, a.format);
      },
      py::arg("path"), "(samples float32 [n] mono, sample_rate, channels of the file, format)");
  audio.def(
      "resample",
      [](const F32Array& x, int64_t from, int64_t to) {
        std::vector<float> y =
            mgn::audio::resample(std::vector<float>(x.data(), x.data() + x.size()), from, to);
        const int64_t n = int64_t(y.size());
        return to_array(std::move(y), {n});
      },
      py::arg("samples"), py::arg("from_rate"), py::arg("to_rate"));
  audio.def(
      "log_mel",
      [](const F32Array& x, int64_t sample_rate, int64_t n_fft, int64_t hop, int64_t n_mels) {
        mgn::audio::LogMelOptions o{.sample_rate = sample_rate, .n_fft = n_fft, .hop = hop, .n_mels = n_mels};
        std::vector<float> y = mgn::audio::log_mel(std::vector<float>(x.data(), x.data() + x.size()), o);
        const int64_t frames = int64_t(y.size()) / n_mels;
        return to_array(std::move(y), {n_mels, frames});
      },
      py::arg("samples"), py::arg("sample_rate") = 16000, py::arg("n_fft") = 400, py::arg("hop") = 160,
      py::arg("n_mels") = 80,
      "Whisper's log-mel spectrogram of one signal: float32 [n_mels, samples / hop].");

  py::module_ whisper = m.def_submodule("whisper", "The Whisper encoder from Hugging Face directories.");
  py::class_<mgn::whisper::Config>(whisper, "Config")
      .def_static("from_file", &mgn::whisper::Config::from_file, py::arg("path"))
      .def_static("tiny", &mgn::whisper::Config::tiny);
  whisper.def(
      "encoder_graph",
      [](const mgn::whisper::Config& c, int64_t batch, const std::string& mode) {
        return std::make_shared<mgn::Graph>(mgn::whisper::encoder_graph(c, {.batch = batch}, mode_of(mode)));
      },
      py::arg("config"), py::arg("batch") = 1, py::arg("mode") = "infer",
      "mel f32 [batch, n_mels, frames] -> last_hidden_state [batch, frames / 2, d_model]");
  whisper.def(
      "load_weights",
      [](PySession& s, const mgn::whisper::Config& c, const std::string& path) {
        py::gil_scoped_release nogil;
        mgn::whisper::load_weights(s.s, mgn::whisper::read_weights(c, path));
      },
      py::arg("session"), py::arg("config"), py::arg("path"));

  m.def("fashion_mnist_dir", &mgn::fashion_mnist_dir, "Debian's dataset-fashion-mnist folder");
  m.def(
      "load_fashion_mnist",
      [](const std::string& dir, const std::string& split, int64_t limit) {
        mgn::Split sp = split == "train"  ? mgn::Split::Train
                        : split == "test" ? mgn::Split::Test
                                          : throw mgn::Error("split '" + split + "': expected train or test");
        mgn::Dataset d = mgn::load_fashion_mnist(dir.empty() ? mgn::fashion_mnist_dir() : dir, sp, limit);
        Shape xs = {d.count};
        xs.insert(xs.end(), d.sample_shape.begin(), d.sample_shape.end());
        return py::make_tuple(to_array(std::move(d.features), xs), to_array(std::move(d.labels), {d.count}));
      },
      py::arg("dir") = "", py::arg("split") = "train", py::arg("limit") = 0,
      "(images float32 [N, 1, 28, 28] in [0, 1], labels int32 [N]) from the IDX files.");
}
