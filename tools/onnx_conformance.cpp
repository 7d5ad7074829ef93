// `mgn onnx-conformance`: runs the ONNX backend test suite's node cases (Debian's libonnx-testdata) through
// the importer and a backend, compares with the suite's expected outputs and reports per case.
//
//   mgn onnx-conformance /usr/share/libonnx-testdata/data --backend cpu
//       --report docs/onnx-conformance.md --expect-pass tests/onnx_conformance_pass.txt
//
// A case is a folder (anywhere under DIR) with model.onnx and test_data_set_*/{input,output}_N.pb. Inputs bind the model's
// dynamic axes by their shapes. When the import fails because a value must be known at import time (a
// shape, axes, repeats or scales tensor that the test feeds as an input), the case is retried with that
// input given its test value (ImportOptions::input_values) and reported as "pass (inputs folded)".
// Outputs compare as onnx's backend runner does: |got - want| <= atol + rtol * |want|, NaN matches NaN,
// same shape (rtol 1e-3, atol 1e-7 by default).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/onnx.h"
#include "mgn/session.h"
#include "mgn/types.h"

namespace mgn::tool {
namespace {

namespace fs = std::filesystem;

struct ConformanceArgs {
  std::string dir, report, expect_pass, write_pass, cases_file, filter;
  double rtol = 1e-3, atol = 1e-7;
  bool quiet = false;
  CompileFlags compile;
};

enum class Verdict { Pass, PassFolded, Mismatch, Unsupported, Error };

struct Result {
  std::string name;
  Verdict verdict = Verdict::Error;
  std::string category;  // for errors: the kind of failure
  std::string detail;    // reason, mismatch description or unsupported op types
  std::string message;   // the whole error message
  double seconds = 0;
};

// Why a failure happened, in a few words, for the per-category counts.
std::string categorize(const std::string& msg) {
  static const std::vector<std::pair<const char*, const char*>> rules = {
      {"is not supported (expected 1 to 20)", "opset"},
      {"must be known at import time", "shape input computed at run time"},
      {"empty tensors are not supported", "zero-size dimension"},
      {"empty constants", "zero-size dimension"},
      {"element type", "dtype"},
      {"does not fit the i32", "dtype"},
      {"training_mode", "training mode"},
      {"(Pad): mode", "Pad mode"},
      {"rank 7 exceeds", "rank above 6"},
      {"no default-domain (ai.onnx) opset", "not an ai.onnx model"},
      {"unsupported tensor element type", "dtype"},
      {"' is not supported", "attribute value not supported"},
      {"is not supported", "form not supported"},
      {"exponent", "Pow exponent"},
      {"an output its producer does not support", "optional output"},
  };
  for (const auto& [needle, cat] : rules)
    if (msg.find(needle) != std::string::npos) return cat;
  return "other";
}

std::string one_line(std::string s, size_t max = 160) {
  for (char& c : s)
    if (c == '\n' || c == '|') c = ' ';
  if (s.size() > max) s = s.substr(0, max - 3) + "...";
  return s;
}

// The op types named in an "unsupported ops" error ("node 'x' (OpType) [domain ...]").
std::string unsupported_ops(const std::string& msg) {
  std::set<std::string> ops;
  std::regex re(R"(\(([A-Za-z0-9_]+)\) \[domain ([^,]+),)");
  for (auto it = std::sregex_iterator(msg.begin(), msg.end(), re); it != std::sregex_iterator(); ++it) {
    std::string dom = (*it)[2];
    ops.insert(dom == "ai.onnx" ? std::string((*it)[1]) : dom + "." + std::string((*it)[1]));
  }
  std::string s;
  for (const auto& o : ops) s += (s.empty() ? "" : ", ") + o;
  return s;
}

std::vector<fs::path> sorted_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) v.push_back(e.path());
  // input_10.pb after input_9.pb
  std::sort(v.begin(), v.end(), [](const fs::path& a, const fs::path& b) {
    std::string x = a.filename().string(), y = b.filename().string();
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  return v;
}

std::string compare(const onnx::TensorFile& want, const Shape& got_shape, const std::vector<float>& got, double rtol,
                    double atol) {
  if (got_shape != want.shape)
    return "shape " + shape_str(got_shape) + ", expected " + shape_str(want.shape);
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want.values[i];
    bool ok = (std::isnan(g) && std::isnan(w)) || g == w || std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok) {
      if (!bad) first = i;
      ++bad;
      worst = std::max(worst, std::isnan(g) || std::isnan(w) ? INFINITY : std::fabs(g - w) / (atol + rtol * std::fabs(w)));
    }
  }
  if (!bad) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%zu of %zu values differ (first at %zu: %.9g, expected %.9g; worst %.3g x tolerance)",
                bad, got.size(), first, double(got[first]), want.values[first], worst);
  return buf;
}

// Runs every data set of one case. Throws mgn::Error (import, compile) or returns a mismatch description.
constexpr int kDouble = 11, kUint16 = 4, kBfloat16 = 16;  // onnx::TensorProto::DataType

std::string run_case(const fs::path& dir, const CompileOptions& co, const ConformanceArgs& a,
                     std::set<std::string>& fold) {
  const std::string model = (dir / "model.onnx").string();
  const std::vector<onnx::GraphValue> decl_in = onnx::graph_inputs(model), decl_out = onnx::graph_outputs(model);
  std::vector<std::string> names;
  for (const auto& v : decl_in) names.push_back(v.name);
  std::vector<fs::path> sets = sorted_entries(dir, "test_data_set_");
  if (sets.empty()) throw Error(dir.string() + ": no test_data_set_* folder");
  for (const fs::path& set : sets) {
    std::vector<onnx::TensorFile> ins, outs;
    for (const fs::path& p : sorted_entries(set, "input_")) ins.push_back(onnx::read_tensor_file(p.string()));
    for (const fs::path& p : sorted_entries(set, "output_")) outs.push_back(onnx::read_tensor_file(p.string()));
    // The suite (onnx 1.12) stores bfloat16 data as uint16 bit patterns where the model declares BFLOAT16.
    auto bf16_bits = [](onnx::TensorFile& t, int declared) {
      if (declared != kBfloat16 || t.elem_type != kUint16) return;
      for (double& v : t.values) v = bf16_to_float(uint16_t(v));
      t.elem_type = kBfloat16;
    };
    for (size_t i = 0; i < ins.size() && i < decl_in.size(); ++i) bf16_bits(ins[i], decl_in[i].elem_type);
    for (size_t i = 0; i < outs.size() && i < decl_out.size(); ++i) bf16_bits(outs[i], decl_out[i].elem_type);
    if (ins.size() > names.size())
      throw Error(set.string() + ": " + std::to_string(ins.size()) + " inputs, the model has " +
                  std::to_string(names.size()));
    onnx::ImportOptions io;
    std::vector<std::string> bound(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      bound[i] = ins[i].name.empty() ? names[i] : ins[i].name;
      if (ins[i].elem_type == kDouble)
        for (double v : ins[i].values)
          if (std::isfinite(v) && std::fabs(v) > 3.4028234663852886e38)
            throw Error(set.string() + ": input '" + bound[i] + "' holds " + std::to_string(v) +
                        ", beyond the f32 range the IR's float tensors have (element type DOUBLE)");
      if (ins[i].values.empty()) fold.insert(bound[i]);  // an empty tensor can only be a known value
      if (fold.count(bound[i])) io.input_values[bound[i]] = ins[i];
      else io.input_shapes[bound[i]] = ins[i].shape;
    }
    onnx::Imported m = onnx::import_file(model, io);
    if (m.outputs.size() != outs.size())
      throw Error(dir.string() + ": the model has " + std::to_string(m.outputs.size()) + " outputs, the data " +
                  std::to_string(outs.size()));
    Session s = compile(m.graph, co);
    for (size_t i = 0; i < ins.size(); ++i) {
      if (io.input_values.count(bound[i])) continue;
      Tensor t = m.graph.get(bound[i]);
      if (t.dtype() == DType::I32 || t.dtype() == DType::Bool) {
        std::vector<int32_t> v;
        for (double d : ins[i].values) {
          if (d != std::floor(d) || d < -2147483648.0 || d > 2147483647.0)
            throw Error(set.string() + ": input '" + bound[i] + "' value " + std::to_string(d) +
                        " does not fit the i32 tensors the IR uses");
          v.push_back(int32_t(d));
        }
        s.set_input(bound[i], v);
      } else {
        s.set_input(bound[i], std::vector<float>(ins[i].values.begin(), ins[i].values.end()));
      }
    }
    s.run();
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string why = compare(outs[i], s.shape_of(m.outputs[i]), s.read(m.outputs[i]), a.rtol, a.atol);
      if (!why.empty()) return set.filename().string() + " output '" + m.outputs[i] + "': " + why;
    }
  }
  return "";
}

Result run_one(const fs::path& dir, const CompileOptions& co, const ConformanceArgs& a) {
  Result r;
  r.name = dir.filename().string();
  auto t0 = std::chrono::steady_clock::now();
  std::set<std::string> fold;
  auto attempt = [&]() {
    try {
      std::string why = run_case(dir, co, a, fold);
      r.verdict = why.empty() ? (fold.empty() ? Verdict::Pass : Verdict::PassFolded) : Verdict::Mismatch;
      r.detail = why;
      r.message.clear();
      r.category.clear();
    } catch (const std::exception& e) {
      std::string msg = e.what();
      // The file path prefix says nothing the case name does not.
      const std::string prefix = (dir / "model.onnx").string() + ": ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      r.message = msg;
      if (msg.find("use unsupported ops") != std::string::npos) {
        r.verdict = Verdict::Unsupported;
        r.category = "unsupported op";
        r.detail = unsupported_ops(msg);
      } else {
        r.verdict = Verdict::Error;
        r.category = categorize(msg);
        r.detail = one_line(msg);
      }
    }
  };
  attempt();
  // A value the importer needs at import time that the test feeds as a graph input: give that input's
  // value (from the test data) and try again.
  static const std::regex needs(R"(\([A-Za-z_ ]+, '([^']+)'\) must be known at import time)");
  std::vector<std::string> names;
  try {
    for (const auto& v : onnx::graph_inputs((dir / "model.onnx").string())) names.push_back(v.name);
  } catch (const std::exception&) {
  }
  for (int tries = 0; tries < 6 && r.verdict == Verdict::Error; ++tries) {
    std::smatch m;
    if (!std::regex_search(r.message, m, needs)) break;
    std::string name = m[1];
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      if (fold.count(name)) break;
      fold.insert(name);
    } else {
      // Computed from graph inputs inside the model: give every integer input (sizes, counts) instead.
      size_t before = fold.size();
      try {
        for (const fs::path& p : sorted_entries(sorted_entries(dir, "test_data_set_").at(0), "input_")) {
          onnx::TensorFile t = onnx::read_tensor_file(p.string());
          size_t i = size_t(std::stoi(p.stem().string().substr(6)));
          if (!t.is_float() && i < names.size()) fold.insert(t.name.empty() ? names[i] : t.name);
        }
      } catch (const std::exception&) {
        break;
      }
      if (fold.size() == before) break;
    }
    attempt();
  }
  if (!fold.empty()) {
    std::string names;
    for (const auto& f : fold) names += (names.empty() ? "" : ", ") + f;
    if (r.detail.empty()) r.detail = "folded: " + names;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::PassFolded: return "pass (inputs folded)";
    case Verdict::Mismatch: return "mismatch";
    case Verdict::Unsupported: return "unsupported op";
    case Verdict::Error: return "error";
  }
  return "?";
}

bool passed(const Result& r) { return r.verdict == Verdict::Pass || r.verdict == Verdict::PassFolded; }

// Cases whose expected data the current ONNX specification contradicts: reported, not counted as failures
// of the importer.
const std::map<std::string, std::string>& known_data_differences() {
  static const std::map<std::string, std::string> m = {
      {"node/test_cast_FLOAT_to_BFLOAT16",
       "the suite's data (onnx 1.12) truncates float32 to bfloat16; the importer rounds to nearest even as "
       "current ONNX specifies"},
  };
  return m;
}

std::vector<std::string> read_list(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError("cannot open '" + path + "'");
  std::vector<std::string> v;
  for (std::string line; std::getline(f, line);) {
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (!line.empty() && line[0] != '#') v.push_back(line);
  }
  return v;
}

std::string markdown(const std::vector<Result>& rs, const ConformanceArgs& a, const std::string& backend) {
  std::map<std::string, int> by_verdict, by_category, by_op;
  int pass = 0;
  for (const Result& r : rs) {
    if (passed(r)) ++pass;
    by_verdict[verdict_name(r.verdict)]++;
    if (r.verdict == Verdict::Error) by_category[r.category]++;
    if (r.verdict == Verdict::Unsupported) {
      std::stringstream ss(r.detail);
      for (std::string op; std::getline(ss, op, ',');) by_op[op.substr(op.find_first_not_of(' '))]++;
    }
  }
  std::ostringstream o;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f%%", rs.empty() ? 0.0 : 100.0 * pass / double(rs.size()));
  std::map<std::string, std::pair<int, int>> by_folder;  // pass, total
  int dtype = 0;
  for (const Result& r : rs) {
    auto& f = by_folder[r.name.substr(0, r.name.find('/'))];
    f.second++;
    if (passed(r)) f.first++;
    if (r.verdict == Verdict::Error && r.category == "dtype") ++dtype;
  }
  o << "# ONNX backend test suite\n\n"
    << "Generated by `mgn onnx-conformance " << a.dir << " --backend " << a.compile.backend
    << " --report docs/onnx-conformance.md` (backend: " << backend << "), over Debian's `libonnx-testdata` "
    << "(onnx 1.12). Tolerance: |got - expected| <= " << a.atol << " + " << a.rtol << " |expected|.\n\n"
    << "**" << pass << " of " << rs.size() << " cases pass (" << pct << ").** ";
  std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * pass / double(std::max<size_t>(rs.size() - size_t(dtype), 1)));
  o << "Of the " << rs.size() - size_t(dtype) << " cases whose data types the IR can carry (not string, not "
    << "f64 beyond the f32 range): " << pct << ".\n\n| folder | pass | cases |\n|---|---|---|\n";
  for (const auto& [f, c] : by_folder) o << "| " << f << " | " << c.first << " | " << c.second << " |\n";
  o << "\n"
    << "\"pass (inputs folded)\": the case feeds a value the importer needs at import time (Reshape's shape, "
    << "Expand's shape, Tile's repeats, Resize's scales, axes...) as a graph input; the runner gives exactly "
    << "those inputs their test values (`ImportOptions::input_values`, named in the detail column) and they "
    << "fold like constants; every other input stays a runtime input.\n\n"
    << "| verdict | cases |\n|---|---|\n";
  for (const auto& [v, c] : by_verdict) o << "| " << v << " | " << c << " |\n";
  o << "\n## Errors by reason\n\n| reason | cases |\n|---|---|\n";
  for (const auto& [v, c] : by_category) o << "| " << v << " | " << c << " |\n";
  std::vector<std::pair<int, std::string>> ops;
  for (const auto& [op, c] : by_op) ops.push_back({-c, op});
  std::sort(ops.begin(), ops.end());
  o << "\n## Unsupported operators (cases that use each)\n\n| operator | cases |\n|---|---|\n";
  for (const auto& [c, op] : ops) o << "| " << op << " | " << -c << " |\n";
  o << "\n## Known data differences\n\n";
  for (const auto& [name, why] : known_data_differences()) o << "- `" << name << "`: " << why << ".\n";
  o << "\n## Every case\n\n| case | verdict | detail |\n|---|---|---|\n";
  for (const Result& r : rs) {
    std::string v = verdict_name(r.verdict);
    if (r.verdict == Verdict::Error) v += ": " + r.category;
    if (!passed(r) && known_data_differences().count(r.name)) v += " (known data difference)";
    o << "| " << r.name << " | " << v << " | " << one_line(r.detail, 200) << " |\n";
  }
  return o.str();
}

int run_conformance(const ConformanceArgs& a, const Context& c) {
  if (!fs::is_directory(a.dir)) throw UsageError("'" + a.dir + "' is not a folder");
  std::vector<fs::path> cases;
  if (!a.cases_file.empty()) {
    for (const std::string& name : read_list(a.cases_file)) {
      if (!fs::is_regular_file(fs::path(a.dir) / name / "model.onnx"))
        throw UsageError(a.cases_file + ": no case '" + name + "' in " + a.dir);
      cases.push_back(fs::path(a.dir) / name);
    }
  } else {
    for (const auto& e : fs::recursive_directory_iterator(a.dir))
      if (e.is_directory() && fs::is_regular_file(e.path() / "model.onnx")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
  }
  if (!a.filter.empty()) {
    std::regex re(a.filter);
    std::erase_if(cases, [&](const fs::path& p) { return !std::regex_search(p.filename().string(), re); });
  }
  if (cases.empty()) throw UsageError("no case (a folder with model.onnx) under '" + a.dir + "'");
  CompileOptions co = compile_options(c, a.compile, Mode::Infer);
  std::vector<Result> results;
  std::string backend = a.compile.backend;
  for (const fs::path& dir : cases) {
    results.push_back(run_one(dir, co, a));
    results.back().name = fs::relative(dir, a.dir).generic_string();
    const Result& r = results.back();
    if (!a.quiet)
      std::printf("%-60s %s%s%s\n", r.name.c_str(), verdict_name(r.verdict), r.detail.empty() ? "" : ": ",
                  one_line(r.detail, 200).c_str());
    std::fflush(stdout);
  }
  int pass = int(std::count_if(results.begin(), results.end(), passed));
  std::map<std::string, int> counts;
  for (const Result& r : results) counts[r.verdict == Verdict::Error ? "error: " + r.category : verdict_name(r.verdict)]++;
  std::printf("\n%d of %zu cases pass\n", pass, results.size());
  for (const auto& [k, n] : counts) std::printf("  %-40s %d\n", k.c_str(), n);
  if (!a.report.empty()) {
    std::ofstream f(a.report);
    f << markdown(results, a, backend);
    if (!f) throw Error(a.report + ": write failed");
  }
  if (!a.write_pass.empty()) {
    std::ofstream f(a.write_pass);
    f << "# ONNX node cases that pass (mgn onnx-conformance --write-pass-list); CI fails when one stops passing.\n";
    for (const Result& r : results)
      if (passed(r)) f << r.name << "\n";
  }
  if (!a.expect_pass.empty()) {
    std::map<std::string, const Result*> by_name;
    for (const Result& r : results) by_name[r.name] = &r;
    int lost = 0;
    for (const std::string& name : read_list(a.expect_pass)) {
      auto it = by_name.find(name);
      if (it == by_name.end()) continue;  // filtered out
      if (!passed(*it->second)) {
        std::printf("REGRESSION %s: %s %s\n", name.c_str(), verdict_name(it->second->verdict),
                    one_line(it->second->detail, 300).c_str());
        ++lost;
      }
    }
    if (lost) {
      std::printf("%d case(s) of %s no longer pass\n", lost, a.expect_pass.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

Run declare_onnx_conformance(CLI::App& app) {
  auto a = std::make_shared<ConformanceArgs>();
  app.add_option("DIR", a->dir, "the suite's data folder (/usr/share/libonnx-testdata/data; its node/ subfolder for node cases only)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--report", a->report, "write the per-case markdown report here")->type_name("FILE");
  app.add_option("--expect-pass", a->expect_pass, "fail (exit 1) when a case listed in FILE does not pass")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  app.add_option("--write-pass-list", a->write_pass, "write the names of the passing cases to FILE")
      ->type_name("FILE");
  app.add_option("--cases", a->cases_file, "run only the cases listed in FILE (one name a line)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  app.add_option("--filter", a->filter, "run only cases whose name matches this regular expression");
  app.add_option("--rtol", a->rtol, "relative tolerance")->check(number_at_least(0));
  app.add_option("--atol", a->atol, "absolute tolerance")->check(number_at_least(0));
  app.add_flag("--quiet", a->quiet, "print the totals only");
  add_compile_flags(app, a->compile, kBackendFlag | kDeviceFlag);
  app.footer("Runs every case's data sets through the importer and the backend and compares the outputs.");
  return [a](const Context& c) { return run_conformance(*a, c); };
}

}  // namespace mgn::tool
