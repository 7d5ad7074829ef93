// `mgn inspect` and `mgn run`: an ONNX model (or an NNEF model: a folder with graph.nnef, or that file) from
// the command line.
//
//   mgn inspect model.onnx | model_dir/ | graph.nnef
//   mgn run model.onnx [--input NAME=random|zeros|FILE.npy|1x3x224x224]... [--shape NAME=1x3x224x224]...
//                      [--backend auto|cpu|vulkan] [--device D] [--precision P] [--seed S] [--save-outputs
//                      DIR]
//
// `run` imports the model (dynamic axes bound by --shape, by --input NAME=SHAPE (random values of that
// shape), or by the shape of an .npy input), compiles an
// inference session and prints each output's shape, a summary (min, max, mean) and its first values;
// --save-outputs writes every output as DIR/<name>.npy (float32).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/llama.h"
#include "mgn/nnef.h"
#include "mgn/onnx.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "mgn/tokenizer.h"
#include "mgn/types.h"

namespace mgn::tool {
namespace {

// A NumPy .npy array (format 1.x/2.x/3.x, C order, little-endian f4/f8/i4/i8/u1/b1), as float or int32.
struct Npy {
  Shape shape;
  std::vector<float> f;
  std::vector<int32_t> i;
  bool is_int = false;
};

Npy read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return Error(path + ": not a supported .npy file: " + why); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw bad("missing the \\x93NUMPY magic");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = size_t(static_cast<unsigned char>(bytes[8])) | size_t(static_cast<unsigned char>(bytes[9])) << 8;
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw bad("truncated header");
    hlen = 0;
    for (int b = 0; b < 4; ++b) hlen |= size_t(static_cast<unsigned char>(bytes[8 + b])) << (8 * b);
    hstart = 12;
  } else {
    throw bad("format version " + std::to_string(major));
  }
  if (hstart + hlen > bytes.size()) throw bad("truncated header");
  const std::string h = bytes.substr(hstart, hlen);
  auto field = [&](const std::string& key) {
    size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) throw bad("header has no '" + key + "'");
    size_t c = h.find(':', k);
    if (c == std::string::npos) throw bad("malformed header");
    return h.substr(c + 1);
  };
  std::string descr = field("descr");
  size_t q0 = descr.find('\''), q1 = descr.find('\'', q0 + 1);
  if (q0 == std::string::npos || q1 == std::string::npos) throw bad("malformed descr");
  descr = descr.substr(q0 + 1, q1 - q0 - 1);
  std::string fo = field("fortran_order");
  if (fo.find("True") < fo.find(','))
    throw bad("Fortran-order arrays are not supported (save a C-order copy)");
  std::string sh = field("shape");
  size_t p0 = sh.find('('), p1 = sh.find(')');
  if (p0 == std::string::npos || p1 == std::string::npos) throw bad("malformed shape");
  Npy a;
  std::string dims = sh.substr(p0 + 1, p1 - p0 - 1);
  size_t p = 0;
  while (p < dims.size()) {
    size_t e = dims.find(',', p);
    if (e == std::string::npos) e = dims.size();
    std::string d = dims.substr(p, e - p);
    d.erase(std::remove(d.begin(), d.end(), ' '), d.end());
    if (!d.empty()) a.shape.push_back(std::stoll(d));
    p = e + 1;
  }
  const size_t n = size_t(numel(a.shape));
  const char* data = bytes.data() + hstart + hlen;
  const size_t avail = bytes.size() - hstart - hlen;
  auto need = [&](size_t w) {
    if (avail < n * w)
      throw bad("data holds " + std::to_string(avail) + " bytes, the shape needs " + std::to_string(n * w));
  };
  if (descr == "<f4" || descr == "<f8") {
    const size_t w = descr == "<f4" ? 4 : 8;
    need(w);
    a.f.resize(n);
    for (size_t k = 0; k < n; ++k) {
      if (w == 4) {
        std::memcpy(&a.f[k], data + 4 * k, 4);
      } else {
        double v;
        std::memcpy(&v, data + 8 * k, 8);
        a.f[k] = float(v);
      }
    }
  } else if (descr == "<i4" || descr == "<i8" || descr == "|u1" || descr == "|b1") {
    const size_t w = descr == "<i4" ? 4 : descr == "<i8" ? 8 : 1;
    need(w);
    a.is_int = true;
    a.i.resize(n);
    for (size_t k = 0; k < n; ++k) {
      int64_t v = 0;
      if (w == 4) {
        int32_t t;
        std::memcpy(&t, data + 4 * k, 4);
        v = t;
      } else if (w == 8) {
        std::memcpy(&v, data + 8 * k, 8);
      } else {
        v = static_cast<unsigned char>(data[k]);
      }
      if (v < INT32_MIN || v > INT32_MAX) throw bad("integer " + std::to_string(v) + " does not fit int32");
      a.i[k] = int32_t(v);
    }
  } else {
    throw bad("dtype '" + descr + "' (supported: <f4 <f8 <i4 <i8 |u1 |b1)");
  }
  return a;
}

void write_npy(const std::string& path, const Shape& shape, const std::vector<float>& v) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() == 1)
    dims = std::to_string(shape[0]) + ",";
  else if (!dims.empty())
    dims.resize(dims.size() - 2);
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {char(h.size() & 0xff), char(h.size() >> 8)};
  out.write(len, 2);
  out.write(h.data(), std::streamsize(h.size()));
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  if (!out) throw Error(path + ": write failed");
}

std::pair<std::string, std::string> split_eq(const std::string& s, const char* flag) {
  size_t e = s.find('=');
  if (e == std::string::npos || e == 0)
    throw UsageError(std::string("--") + flag + " takes NAME=VALUE, got '" + s + "'");
  return {s.substr(0, e), s.substr(e + 1)};
}

struct RunArgs {
  std::string model, save_dir;
  std::vector<std::string> inputs, shapes;  // NAME=SPEC, NAME=DIMS as given
  uint64_t seed = 0;
  CompileFlags compile;
};

// What --input and --shape ask for, checked before anything is read: every spec is random, zeros, a shape
// or an existing .npy file.
struct RunPlan {
  std::map<std::string, std::string> inputs;  // name -> random | zeros | file.npy
  std::map<std::string, Shape> shapes;        // dynamic axes bound from the command line
};

RunPlan plan_run(const RunArgs& a) {
  RunPlan p;
  for (const std::string& text : a.inputs) {
    auto [name, spec] = split_eq(text, "input");
    if (!spec.empty() && spec.find_first_not_of("0123456789x") == std::string::npos) {
      // NAME=1x3x224x224: binds the input's shape (dynamic axes) and feeds random values.
      p.shapes[name] = parse_dims(spec, "--input " + name);
      spec = "random";
    } else if (spec != "random" && spec != "zeros" && !std::filesystem::is_regular_file(spec)) {
      throw UsageError("--input " + name + "=" + spec +
                       ": expected random, zeros, a shape like 1x3x224x224 or an " + "existing .npy file");
    }
    p.inputs[name] = spec;
  }
  for (const std::string& text : a.shapes) {
    auto [name, dims] = split_eq(text, "shape");
    p.shapes[name] = parse_dims(dims, "--shape " + name);
  }
  return p;
}

int run_model(const RunArgs& a, const Context& c) {
  const RunPlan p = plan_run(a);
  const std::map<std::string, std::string>& inputs = p.inputs;
  std::map<std::string, Npy> arrays;
  onnx::ImportOptions io;
  io.input_shapes = p.shapes;
  // An .npy input binds its own shape unless --shape says otherwise.
  for (const auto& [name, spec] : inputs) {
    if (spec == "random" || spec == "zeros") continue;
    arrays[name] = read_npy(spec);
    if (!io.input_shapes.count(name)) io.input_shapes[name] = arrays[name].shape;
  }
  // One imported model, whichever the format: its graph, inputs and outputs.
  struct Model {
    Graph graph;
    std::vector<std::string> inputs, outputs;
    int64_t parameter_count = 0;
    std::string format;
  } m;
  if (nnef::is_nnef_path(a.model)) {
    nnef::Imported n = nnef::import_path(a.model, {.input_shapes = io.input_shapes});
    m = Model{std::move(n.graph), n.inputs, n.outputs, n.parameter_count, "NNEF " + n.version};
  } else {
    onnx::Imported o = onnx::import_file(a.model, io);
    m = Model{std::move(o.graph), o.inputs, o.outputs, o.parameter_count, "opset " + std::to_string(o.opset)};
  }
  for (const auto& [name, spec] : inputs)
    if (std::find(m.inputs.begin(), m.inputs.end(), name) == m.inputs.end())
      throw UsageError("the model has no input '" + name + "'");
  Session s = compile(m.graph, compile_options(c, a.compile, Mode::Infer));
  std::fprintf(stderr, "%s: %s, %lld parameter elements, backend %s\n", a.model.c_str(), m.format.c_str(),
               static_cast<long long>(m.parameter_count), s.backend());
  std::mt19937_64 rng(a.seed);
  for (const std::string& name : m.inputs) {
    Tensor t = m.graph.get(name);
    const size_t n = size_t(t.numel());
    const bool is_int = t.dtype() == DType::I32 || t.dtype() == DType::Bool;
    auto it = inputs.find(name);
    const std::string spec = it == inputs.end() ? "random" : it->second;
    if (it == inputs.end()) std::fprintf(stderr, "input %s: random (no --input given)\n", name.c_str());
    if (spec == "random" || spec == "zeros") {
      if (is_int) {
        std::vector<int32_t> v(n, 0);
        std::uniform_int_distribution<int32_t> d(0, t.dtype() == DType::Bool ? 1 : 9);
        if (spec == "random")
          for (int32_t& e : v) e = d(rng);
        s.set_input(name, v);
      } else {
        std::vector<float> v(n, 0.0f);
        std::uniform_real_distribution<float> d(-1.0f, 1.0f);
        if (spec == "random")
          for (float& e : v) e = d(rng);
        s.set_input(name, v);
      }
      continue;
    }
    const Npy& arr = arrays.at(name);
    if (size_t(numel(arr.shape)) != n)
      throw Error(spec + " has shape " + shape_str(arr.shape) + ", input '" + name + "' is " +
                  shape_str(t.shape()));
    if (is_int) {
      if (!arr.is_int) throw Error("input '" + name + "' is an integer tensor; " + spec + " holds floats");
      s.set_input(name, arr.i);
    } else {
      s.set_input(name, arr.is_int ? std::vector<float>(arr.i.begin(), arr.i.end()) : arr.f);
    }
  }
  s.run();
  if (!a.save_dir.empty()) std::filesystem::create_directories(a.save_dir);
  for (const std::string& name : m.outputs) {
    std::vector<float> v = s.read(name);
    Shape sh = s.shape_of(name);
    double lo = v.empty() ? 0 : v[0], hi = lo, sum = 0;
    for (float e : v) lo = std::min<double>(lo, e), hi = std::max<double>(hi, e), sum += e;
    std::printf("%s %s  min %.6g  max %.6g  mean %.6g\n ", name.c_str(), shape_str(sh).c_str(), lo, hi,
                v.empty() ? 0.0 : sum / double(v.size()));
    for (size_t k = 0; k < std::min<size_t>(v.size(), 8); ++k) std::printf(" %.6g", v[k]);
    std::printf("%s\n", v.size() > 8 ? " ..." : "");
    if (!a.save_dir.empty()) {
      std::string file = name;  // ONNX value names may hold path separators
      for (char& ch : file)
        if (ch == '/' || ch == '\\' || ch == ':') ch = '_';
      write_npy(a.save_dir + "/" + file + ".npy", sh, v);
    }
  }
  return 0;
}

}  // namespace

namespace {

// `mgn export MODEL --gguf OUT.gguf`: a Hugging Face Llama directory (config.json, model.safetensors or a
// sharded index, tokenizer.json when there is one) or a weights file `mgn bench` wrote for a Llama workload
// (its metadata holds the config) as GGUF for llama.cpp (docs/gguf.md).
void export_llama_gguf(const std::string& model, const std::string& out, const std::string& type,
                       const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  llama::Config cfg;
  std::string weights_path = model, tok = tokenizer_path;
  if (fs::is_directory(model)) {
    if (!fs::exists(fs::path(model) / "config.json"))
      throw Error(model + ": no config.json (--gguf takes a Hugging Face Llama directory or a bench weights file)");
    cfg = llama::Config::from_file((fs::path(model) / "config.json").string());
    if (tok.empty() && fs::exists(fs::path(model) / "tokenizer.json")) tok = (fs::path(model) / "tokenizer.json").string();
  } else {
    const SafetensorsFile head = SafetensorsFile::read_header(model);
    auto it = head.metadata().find("config");
    if (it == head.metadata().end())
      throw Error(model + ": no \"config\" in the safetensors metadata (a Llama weights file of mgn bench has one; "
                  "else give the model's directory)");
    cfg = llama::Config::from_json(it->second, model + " (metadata config)");
  }
  std::optional<Tokenizer> t;
  if (!tok.empty()) t.emplace(Tokenizer::from_file(tok));
  llama::GgufOptions opt;
  opt.type = type == "f16" ? llama::GgufType::F16 : llama::GgufType::F32;
  opt.tokenizer = t ? &*t : nullptr;
  opt.name = fs::path(model).filename().string();
  llama::export_gguf(cfg, llama::read_weights(cfg, weights_path), out, opt);
  std::fprintf(stderr, "wrote %s (llama, %s weights, %s)\n", out.c_str(), type.c_str(),
               t ? ("tokenizer " + tok).c_str() : "placeholder vocabulary: no tokenizer.json");
}

}  // namespace

Run declare_export(CLI::App& app) {
  struct Args {
    std::string model, nnef_dir, gguf, gguf_type = "f32", tokenizer;
    std::vector<std::string> shapes;
  };
  auto a = std::make_shared<Args>();
  app.add_option("MODEL", a->model,
                 "an .onnx file or an NNEF model (--nnef); a Hugging Face Llama directory or a Llama weights file "
                 "of mgn bench (--gguf)")
      ->required()
      ->check(CLI::ExistingPath);
  auto* nnef_opt = app.add_option("--nnef", a->nnef_dir, "write the model as an NNEF folder DIR (graph.nnef + .dat tensors)")
      ->type_name("DIR");
  auto* gguf_opt = app.add_option("--gguf", a->gguf, "write a Llama-family model as a GGUF file for llama.cpp")
      ->type_name("FILE");
  nnef_opt->excludes(gguf_opt);
  app.add_option("--gguf-type", a->gguf_type, "with --gguf: the matrices' type (norms stay f32)")
      ->check(CLI::IsMember({"f32", "f16"}));
  app.add_option("--tokenizer", a->tokenizer,
                 "with --gguf: a tokenizer.json (default: MODEL/tokenizer.json, else a placeholder vocabulary)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  app.add_option("--shape", a->shapes, "NAME=1x3x224x224: binds an input's dynamic axes; repeatable")
      ->type_name("NAME=DIMS")
      ->default_str("")
      ->allow_extra_args(false);
  app.footer(
      "--nnef imports the model and writes it as NNEF (docs/nnef.md); ops with no NNEF form are listed in one\n"
      "error. --gguf writes a Llama model for llama.cpp (docs/gguf.md).");
  return [a, &app](const Context&) {
    if (a->nnef_dir.empty() && a->gguf.empty()) throw UsageError("give --nnef DIR or --gguf FILE");
    if (!a->gguf.empty()) {
      if (!a->shapes.empty()) throw UsageError("--shape goes with --nnef");
      export_llama_gguf(a->model, a->gguf, a->gguf_type, a->tokenizer);
      return 0;
    }
    if (app.count("--gguf-type") || !a->tokenizer.empty()) throw UsageError("--gguf-type and --tokenizer go with --gguf");
    std::map<std::string, Shape> shapes;
    for (const std::string& text : a->shapes) {
      auto [name, dims] = split_eq(text, "shape");
      shapes[name] = parse_dims(dims, "--shape " + name);
    }
    if (nnef::is_nnef_path(a->model)) {
      nnef::export_graph(nnef::import_path(a->model, {.input_shapes = shapes}).graph, a->nnef_dir);
    } else {
      nnef::export_graph(onnx::import_file(a->model, {.input_shapes = shapes}).graph, a->nnef_dir);
    }
    std::fprintf(stderr, "wrote %s/graph.nnef\n", a->nnef_dir.c_str());
    return 0;
  };
}

Run declare_inspect(CLI::App& app) {
  struct Args {
    std::string model;
    bool supported_ops = false;
    bool nnef = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("MODEL", a->model, "an .onnx file, or an NNEF model (a folder with graph.nnef, or that file)")
      ->check(CLI::ExistingPath);
  app.add_flag("--supported-ops", a->supported_ops,
               "list the importable operators instead (the README's list)");
  app.add_flag("--nnef", a->nnef, "with --supported-ops: the NNEF importer's operators (docs/nnef.md)");
  app.footer(
      "Prints the opset, inputs and outputs with shapes, the op histogram (unsupported ops marked),\n"
      "and the initializer and parameter counts. An NNEF model (a folder with graph.nnef) shows its\n"
      "version, inputs, ops and variables.");
  return [a](const Context&) {
    if (a->supported_ops) {
      if (!a->model.empty()) throw UsageError("--supported-ops takes no model");
      for (const std::string& op : a->nnef ? nnef::supported_ops() : onnx::supported_ops()) std::printf("%s\n", op.c_str());
      return 0;
    }
    if (a->nnef) throw UsageError("--nnef goes with --supported-ops");
    if (a->model.empty()) throw UsageError("name an .onnx file or an NNEF model (or give --supported-ops)");
    std::fputs((nnef::is_nnef_path(a->model) ? nnef::inspect(a->model) : onnx::inspect(a->model)).c_str(), stdout);
    return 0;
  };
}

Run declare_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  app.add_option("MODEL", a->model, "an .onnx file, or an NNEF model (a folder with graph.nnef, or that file)")
      ->required()
      ->check(CLI::ExistingPath);
  app.add_option(
         "--input", a->inputs,
         "NAME=random|zeros|FILE.npy|1x3x224x224 (a shape: random values of it, binding dynamic axes); "
         "repeatable; inputs not named get random values")
      ->type_name("NAME=SPEC")
      ->default_str("")
      ->allow_extra_args(false);
  app.add_option("--shape", a->shapes, "NAME=1x3x224x224: binds the input's dynamic axes; repeatable")
      ->type_name("NAME=DIMS")
      ->default_str("")
      ->allow_extra_args(false);
  app.add_option("--seed", a->seed, "seed of the random inputs")->check(at_least(0));
  app.add_option("--save-outputs", a->save_dir, "write every output as DIR/<name>.npy (float32)")
      ->type_name("DIR");
  add_compile_flags(app, a->compile);
  app.footer("Imports the model, runs it once and prints every output (shape, min/max/mean, first values).");
  return [a](const Context& c) { return run_model(*a, c); };
}

}  // namespace mgn::tool
