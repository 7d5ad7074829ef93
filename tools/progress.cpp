// Progress lines: \r-redrawn on a terminal, one plain line per tenth of the work otherwise.
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

namespace mgn::tool {

bool stderr_is_terminal() {
  return ::isatty(2) != 0;
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  }
  return buf;
}

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& extra) {
  done_ = done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  int64_t tenth = done * 10 / total_;
  bool show = tty_ ? std::chrono::duration<double>(now - last_print_).count() > 0.2 : tenth != last_tenth_;
  if (!show || done >= total_) return;  // the last one is finish()'s
  last_print_ = now;
  last_tenth_ = tenth;
  print(done, extra, false);
}

void Progress::finish(const std::string& extra) {
  if (!enabled_) return;
  print(std::max(done_, total_), extra, true);
}

void Progress::print(int64_t done, const std::string& extra, bool final) {
  double el = seconds();
  double rate = double(done) / std::max(el, 1e-9);
  std::string when =
      final ? "in " + format_duration(el)
            : "ETA " + (done > 0 ? format_duration(double(total_ - done) / rate) : std::string("?"));
  const int width = 24;
  int filled = int(width * std::min(done, total_) / total_);
  std::string bar = std::string(size_t(filled), '=') + std::string(size_t(width - filled), ' ');
  std::fprintf(stderr, "%s%s [%s] %lld/%lld  %.1f %s/s  %s%s%s%s", tty_ ? "\r" : "", label_.c_str(),
               bar.c_str(), (long long)done, (long long)total_, rate, unit_.c_str(), when.c_str(),
               extra.empty() ? "" : "  ", extra.c_str(), tty_ ? (final ? "\033[K\n" : "\033[K") : "\n");
  std::fflush(stderr);
}

std::function<void(const CompileProgress&)> compile_progress(std::string what, double after_seconds) {
  struct State {
    std::string what;
    double after = 0;
    std::unique_ptr<Progress> line;  // from the first call, so that its rate counts the whole compile
    bool shown = false;
  };
  auto st = std::make_shared<State>();
  st->what = std::move(what);
  st->after = after_seconds;
  return [st](const CompileProgress& p) {
    if (p.done == 0 || !st->line) {
      st->line = std::make_unique<Progress>("compiling " + st->what, int64_t(p.total), "kernels");
      st->shown = false;
    }
    st->shown = st->shown || st->line->seconds() > st->after;
    if (!st->shown) return;
    st->line->update(int64_t(p.done));
    if (p.done >= p.total) {
      st->line->finish();
      st->line.reset();
    }
  };
}

}  // namespace mgn::tool
