// ONNX import: lowers an .onnx model (opsets 13-17, plus the axes-as-input forms of 18) into a mgn::Graph,
// so every pass, the planner, autodiff and every backend apply to imported graphs as to built ones.
//
//   mgn::onnx::Imported m = mgn::onnx::import_file("model.onnx", {.input_shapes = {{"x", {1, 3, 32, 32}}}});
//   // m.graph has one input per ONNX graph input and one output per ONNX graph output, same names.
//
// Initializers become named parameters (ONNX initializer names), frozen unless `trainable`; batch-norm
// running statistics become non-trainable state. Shape-computing subgraphs (Shape, Gather/Concat of shape
// pieces, ConstantOfShape, Range, ...) are folded on the host at import time, so only tensor ops reach the
// IR. int64 ONNX tensors become i32 (values outside the i32 range are an error).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/types.h"

namespace mgn::onnx {

// A tensor read from a serialized TensorProto (the ONNX test suite's input_N.pb / output_N.pb files), its
// values widened to double (exact for every integer of at most 53 bits and every float type).
struct TensorFile {
  std::string name;       // the TensorProto's name (the graph value it feeds; may be empty)
  int elem_type = 0;      // onnx::TensorProto::DataType
  std::string type_name;  // "FLOAT", "INT64", ...
  Shape shape;
  std::vector<double> values;
  bool is_float() const;  // FLOAT, DOUBLE, FLOAT16, BFLOAT16
};
// Throws mgn::Error naming the file when it is not a TensorProto or its data disagrees with its shape.
TensorFile read_tensor_file(const std::string& path);

struct ImportOptions {
  std::map<std::string, Shape> input_shapes;  // binds dynamic axes ("x" -> {1, 3, 224, 224})
  // Inputs whose values are known before import (e.g. the shape tensor a Reshape or Expand reads): they are
  // folded like constants, so shape-computing ops that read them need no runtime support. The input is then
  // no graph input of the imported graph (it is left out of Imported::inputs).
  std::map<std::string, TensorFile> input_values;
  bool trainable = false;                      // initializers become trainable parameters
  std::string external_data_dir;               // default: the model file's directory
};

struct Imported {
  Graph graph;
  std::vector<std::string> inputs, outputs;  // graph inputs (initializers excluded) and outputs, in order
  int64_t parameter_count = 0;               // elements of the float initializers turned into parameters
  int opset = 0;                             // the default-domain opset the model imports
};

// Throws mgn::Error naming the file (or `origin`), the node and what was expected; a model that uses
// unsupported ops gets one error listing every such node.
Imported import_file(const std::string& path, const ImportOptions& opt = {});
Imported import_bytes(const std::string& bytes, const std::string& origin, const ImportOptions& opt = {});

// A readable summary of a model without importing it: opset, inputs and outputs with their shapes,
// the histogram of op types (unsupported ones marked), initializer count and parameter count.
std::string inspect(const std::string& path);
std::string inspect_bytes(const std::string& bytes, const std::string& origin);

// The model's graph inputs (initializers excluded) and outputs, in order, with their declared element types
// (onnx::TensorProto::DataType; 0 when not a tensor), without importing it.
struct GraphValue {
  std::string name;
  int elem_type = 0;
};
std::vector<GraphValue> graph_inputs(const std::string& path);
std::vector<GraphValue> graph_outputs(const std::string& path);

// Op types the importer maps (default domain), sorted; generated from the importer's table.
std::vector<std::string> supported_ops();

}  // namespace mgn::onnx
