// The options every command compiles with: the MGN_* variables (read once), then the command's own choices.
#pragma once

#include "mgn/environment.h"

namespace mgn::tool {

inline const Environment& environment() {
  static const Environment env = read_environment();
  return env;
}

inline CompileOptions compile_options(Mode mode, Backend backend) {
  CompileOptions o;
  environment().apply(o);
  o.mode = mode;
  o.backend = backend;
  return o;
}

}  // namespace mgn::tool
