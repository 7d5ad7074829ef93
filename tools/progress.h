// Progress lines for long operations (epochs, data loading, generation, benchmarks) on stderr: on a terminal
// one line redrawn with \r a few times a second, with the rate and the time left; in a log (stderr not a
// terminal) a plain line per tenth of the work. The library reports progress through callbacks
// (mgn::TrainerOptions::on_step, ...); deciding how to show it, and the terminal check, live here.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "mgn/session.h"

namespace mgn::tool {

bool stderr_is_terminal();

class Progress {
 public:
  // `label` starts the line ("epoch 1/5"); `unit` names what `total` counts ("steps", "images").
  // Disabled: prints nothing.
  Progress(std::string label, int64_t total, std::string unit, bool enabled = true);
  // `done` of `total` finished; `extra` ends the line ("loss 0.4512").
  void update(int64_t done, const std::string& extra = "");
  // The final line (always printed when enabled), with the elapsed time.
  void finish(const std::string& extra = "");
  double seconds() const;

 private:
  void print(int64_t done, const std::string& extra, bool final);

  std::string label_, unit_;
  int64_t total_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point start_, last_print_;
  int64_t last_tenth_ = -1;
  int64_t done_ = 0;
};

// A CompileOptions::on_progress that draws a "compiling <what>" line (kernels done of total, rate, time left)
// once compiling to SPIR-V has taken longer than `after_seconds`: short and warm compiles print nothing.
std::function<void(const CompileProgress&)> compile_progress(std::string what, double after_seconds = 1.0);

// "12s", "3m05s", "1h02m".
std::string format_duration(double seconds);

}  // namespace mgn::tool
