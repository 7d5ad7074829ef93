// The MGN_* environment variables: the one place they are read and mapped onto typed options. Library code
// never reads the environment (a program that embeds meganeura passes CompileOptions); the command-line
// tools and the benchmarks call read_environment() once at start and pass what it returns down.
//
//   mgn::Environment env = mgn::read_environment();    // throws naming the variable on a malformed value
//   mgn::CompileOptions opt{.mode = mgn::Mode::Infer};
//   env.apply(opt);                                     // kernels, device, cache folder, profiling
//
// docs/environment.md is generated from environment_variables() (`mgn help environment --markdown`), and a
// test keeps the two equal.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mgn/session.h"

namespace mgn {

struct EnvironmentVariable {
  const char* name;
  const char* section;  // "device", "compiler" or "tests"
  const char* values;   // accepted values, the default in parentheses
  const char* effect;   // what it does, and the option it sets
};

// Every MGN_* variable meganeura and its tests read, in documentation order.
const std::vector<EnvironmentVariable>& environment_variables();
// The tables of docs/environment.md, one per section, rendered from environment_variables().
std::string environment_markdown();

// What the environment asks for; unset variables leave the defaults.
struct Environment {
  KernelOptions kernels;
  PlanningOptions planning;
  DeviceOptions device;
  Precision default_precision = Precision::Strict;
  // MGN_CACHE_DIR, else $XDG_CACHE_HOME/meganeura, else $HOME/.cache/meganeura, else "" (memory only).
  std::string cache_dir;
  bool profile = false;
  // MGN_FASHION_MNIST_DIR, else Debian's dataset-fashion-mnist folder.
  std::string fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";
  // MGN_* names that are set but not in environment_variables() (probably typos); the tools warn about them.
  std::vector<std::string> unknown;

  // Copies what compiling depends on into `o`: kernels, planning, device, default precision, cache folder,
  // profiling.
  void apply(CompileOptions& o) const;
};

// Maps variables onto an Environment through `lookup` (name -> value, nullptr when unset); `names` lists the
// MGN_* names that are set, for the unknown-name check. Throws mgn::Error naming the variable and the
// accepted values for a malformed one.
Environment environment_from(const std::function<const char*(const char*)>& lookup,
                             const std::vector<std::string>& names = {});
// environment_from the process environment.
Environment read_environment();

}  // namespace mgn
