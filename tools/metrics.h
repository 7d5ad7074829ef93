// Training metrics as JSON Lines: one object per line, flushed as it is written, so a run can be plotted
// while it goes (scripts/plot-training.py) and a killed run keeps what it measured. Records (field "kind"):
//   run:   command, model, backend, device, batch, optimizer, base lr, ...   (first line)
//   step:  step, epoch, loss, accuracy (of the batch, when known), lr, samples_per_s, time_s
//   epoch: epoch, steps, mean_loss, test_accuracy (when evaluated), seconds
//   end:   final numbers (test accuracy, checkpoint, total seconds)
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace mgn::tool {

class MetricsLog {
 public:
  // Empty path: off. Creates the file's folder; throws mgn::Error when it cannot be written.
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  bool enabled() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  void write(const std::string& kind, nlohmann::json record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace mgn::tool
