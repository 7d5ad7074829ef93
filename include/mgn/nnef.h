// NNEF import: lowers a Khronos NNEF model (a folder with graph.nnef, the flat text graph, and one .dat file
// per variable in the NNEF binary tensor format) into a mgn::Graph, the same graph the ONNX importer builds,
// so every pass, autodiff, the planner, Session and Trainer apply to it.
//
//   mgn::nnef::Imported m = mgn::nnef::import_path("model_dir", {.trainable = true});
//   // m.graph has one input per `external` the graph declares and one output per graph result, same names.
//
// Variables become named parameters (their label, e.g. "conv1/filter"), frozen unless `trainable`. Shapes
// are static: an external's declared shape is used unless `input_shapes` binds another of the same rank.
// Errors name the file with line:column (syntax, unknown op, bad attribute) or the .dat file and the tensor
// (missing, truncated, wrong item type or shape). docs/nnef.md lists the operators.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/types.h"

namespace mgn::nnef {

// The item type codes of the binary tensor header (the low 16 bits of its item-type field).
enum class ItemType : uint32_t { Float = 0, Uint = 1, Quint = 2, Qint = 3, Int = 4, Bool = 5 };

// A tensor read from a .dat file, values widened to double (exact for every stored type but 64-bit
// integers beyond 2^53).
struct TensorData {
  Shape shape;
  ItemType item_type = ItemType::Float;
  uint32_t bits = 32;  // bits per item: 16/32/64 float, 8/16/32/64 integer, 1 or 8 logical
  std::vector<double> values;
};

// Parses the bytes of a .dat file; throws mgn::Error naming `origin` on a bad magic or version, a header
// that disagrees with itself, a short or long file, or an item type it does not read (quantized, vendor).
TensorData read_tensor_bytes(const std::string& bytes, const std::string& origin);
TensorData read_tensor_file(const std::string& path);
// The bytes of a .dat file holding `values` (float32 or float16 items, or integer/logical of `bits`).
std::string write_tensor_bytes(const Shape& shape, const std::vector<double>& values,
                               ItemType type = ItemType::Float, uint32_t bits = 32);

struct ImportOptions {
  std::map<std::string, Shape> input_shapes;  // replaces an external's declared shape (same rank)
  bool trainable = false;                     // variables become trainable parameters
};

struct Imported {
  Graph graph;
  std::vector<std::string> inputs, outputs;  // the graph's externals and results, in declaration order
  int64_t parameter_count = 0;               // elements of the scalar variables turned into parameters
  std::string version;                       // the `version` line, e.g. "1.0"
  std::vector<std::string> extensions;       // the `extension` lines' names
};

// A folder holding graph.nnef (or the graph.nnef file itself); variables are read from <folder>/<label>.dat.
Imported import_path(const std::string& path, const ImportOptions& opt = {});
// The graph text; `load` returns the bytes of a variable's .dat file by label (throw mgn::Error, or return
// nullopt for a missing file).
using DatLoader = std::function<std::optional<std::string>(const std::string& label)>;
Imported import_text(const std::string& text, const std::string& origin, const DatLoader& load,
                     const ImportOptions& opt = {});

// True when `path` is an NNEF model: a folder with graph.nnef, or a file named *.nnef.
bool is_nnef_path(const std::string& path);

// A readable summary without building the graph: version, extensions, inputs with their declared shapes,
// outputs, the histogram of ops (unsupported ones marked) and the variables with their shapes.
std::string inspect(const std::string& path);
std::string inspect_text(const std::string& text, const std::string& origin);

// Writes `g` as an NNEF model folder `dir`: graph.nnef (one statement per node; the inputs and outputs keep
// their names where they are identifiers) and one .dat per parameter (label = its name) and per constant of
// more than 64 elements. Parameter values come from `values` (e.g. a trained Session's read) or, when it has
// none, from the parameter's initializer. Throws mgn::Error listing every node whose op has no NNEF form
// (attention, rope, gathers, losses, derivative helpers, erf, tanh-GELU, element-type casts).
struct ExportOptions {
  std::function<std::optional<std::vector<float>>(const std::string& name)> values;
};
void export_graph(const Graph& g, const std::string& dir, const ExportOptions& opt = {});

// Operators the importer maps, sorted.
std::vector<std::string> supported_ops();

}  // namespace mgn::nnef
