// Oracle harness (C++ side): the builder registry and the case-file loader. See registry.h.
#include <algorithm>
#include <filesystem>
#include <map>

#include "ir/graph.h"
#include "oracle/registry.h"

namespace mgn::oracle {
namespace {

std::map<std::string, Builder>& registry() {
  static std::map<std::string, Builder> r;
  return r;
}

DType dtype_of_tag(const std::string& spec, const std::string& origin) {
  if (spec == "f32") return DType::F32;
  if (spec == "i32") return DType::I32;
  if (spec == "bool") return DType::Bool;
  throw Error(origin + ": unknown oracle input dtype '" + spec + "'");
}

}  // namespace

int64_t Call::i(const char* k) const {
  if (!attrs.contains(k)) throw Error(std::string("oracle case: missing attribute '") + k + "'");
  return attrs.at(k).get<int64_t>();
}
double Call::f(const char* k) const {
  if (!attrs.contains(k)) throw Error(std::string("oracle case: missing attribute '") + k + "'");
  return attrs.at(k).get<double>();
}
std::vector<int64_t> Call::ints(const char* k) const {
  if (!attrs.contains(k)) throw Error(std::string("oracle case: missing attribute '") + k + "'");
  return attrs.at(k).get<std::vector<int64_t>>();
}

bool register_builder(const std::string& key, Builder b) {
  if (!registry().emplace(key, std::move(b)).second)
    throw Error("oracle: builder '" + key + "' registered twice");
  return true;
}

const Builder* find_builder(const std::string& key) {
  auto it = registry().find(key);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> builder_keys() {
  std::vector<std::string> keys;
  for (const auto& [k, b] : registry()) keys.push_back(k);
  return keys;
}

std::vector<std::string> case_files(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error("oracle: no case directory " + dir + " (run the oracle_data target)");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

Case load_case(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::read(path);
  const auto& meta = f.metadata();
  auto get_meta = [&](const char* k) -> const std::string& {
    auto it = meta.find(k);
    if (it == meta.end()) throw Error(path + ": oracle case without metadata '" + k + "'");
    return it->second;
  };
  Case c;
  c.path = path;
  c.name = get_meta("case");
  c.key = get_meta("op");
  c.tol = std::stod(get_meta("tol"));
  c.grad_tol = std::stod(get_meta("grad_tol"));
  nlohmann::json attrs = nlohmann::json::parse(get_meta("attrs"));
  nlohmann::json dtypes = nlohmann::json::parse(get_meta("inputs"));
  const Builder* b = find_builder(c.key);
  if (!b) throw Error(path + ": no C++ oracle builder registered for '" + c.key + "'");

  c.graph = std::make_unique<Graph>();
  for (size_t i = 0; i < dtypes.size(); ++i) {
    std::string name = "in." + std::to_string(i);
    const StoredTensor& t = f.get(name);
    c.input_values.push_back(t);
    c.inputs.push_back(c.graph->input(name, t.shape, dtype_of_tag(dtypes[i].get<std::string>(), path)));
  }
  Call call{*c.graph, c.inputs, attrs};
  c.out = (*b)(call);
  c.graph->output("out", c.out);
  c.expected = f.get("out");
  if (const StoredTensor* cot = f.find("cot")) c.cot = *cot;
  for (size_t i = 0; i < dtypes.size(); ++i)
    if (const StoredTensor* g = f.find("grad." + std::to_string(i))) c.grads.emplace(int(i), *g);
  return c;
}

}  // namespace mgn::oracle
