// Sharded Hugging Face checkpoints: model.safetensors.index.json maps each tensor to the shard holding it.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mgn/checkpoint.h"

namespace mgn {

namespace {

TensorSet read_index(const std::string& index_path, const std::string& text, bool header_only);

}  // namespace

TensorSet read_safetensors_index(const std::string& index_path, bool header_only) {
  std::error_code ec;
  if (std::filesystem::is_directory(index_path, ec))
    throw Error("safetensors index '" + index_path + "' is a folder, expected a JSON file");
  std::ifstream f(index_path, std::ios::binary);
  if (!f) throw Error("cannot open safetensors index '" + index_path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return read_index(index_path, ss.str(), header_only);
}

TensorSet parse_safetensors_index(const std::string& text, const std::string& index_path) {
  return read_index(index_path, text, true);
}

namespace {

TensorSet read_index(const std::string& index_path, const std::string& text, bool header_only) {
  auto fail = [&](const std::string& msg) { return Error("safetensors index '" + index_path + "': " + msg); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw fail("expected an object with a \"weight_map\" object");
  TensorSet ts;
  ts.origin = index_path;
  if (j.contains("metadata") && j["metadata"].is_object())
    for (auto it = j["metadata"].begin(); it != j["metadata"].end(); ++it)
      ts.metadata[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();

  std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw fail("weight_map entry '" + it.key() + "' is not a file name");
    std::string shard = it.value().get<std::string>();
    // Shards live beside the index; a path that climbs out of the folder is refused.
    std::filesystem::path rel(shard);
    if (shard.empty() || rel.is_absolute() || shard.find("..") != std::string::npos)
      throw fail("weight_map entry '" + it.key() + "' names an unsafe shard path '" + shard + "'");
    shard_of[it.key()] = shard;
    shards.insert(shard);
  }
  for (const std::string& shard : shards) {
    std::string path = (dir / shard).string();
    SafetensorsFile sf = header_only ? SafetensorsFile::read_header(path) : SafetensorsFile::read(path);
    for (const std::string& name : sf.names()) {
      auto m = shard_of.find(name);
      if (m == shard_of.end() || m->second != shard)
        throw fail("shard '" + shard + "' holds tensor '" + name + "', which the weight_map " +
                   (m == shard_of.end() ? "does not list" : "assigns to '" + m->second + "'"));
      ts.tensors[name] = sf.get(name);
      ts.file_of[name] = path;
    }
  }
  for (auto& [name, shard] : shard_of)
    if (!ts.tensors.count(name)) throw fail("tensor '" + name + "' is not in its shard '" + shard + "'");
  return ts;
}

}  // namespace

}  // namespace mgn
