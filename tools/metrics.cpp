// JSON Lines metrics of the training commands.
#include "metrics.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "mgn/types.h"

namespace mgn::tool {

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error("cannot write the metrics file " + path + ": " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const std::string& kind, nlohmann::json record) {
  if (!f_) return;
  nlohmann::json line = {{"kind", kind}};
  line.update(record);
  line["unix_time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), f_);
  std::fflush(f_);
}

}  // namespace mgn::tool
