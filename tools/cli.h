// The `mgn` command line: one table of commands (tools/mgn.cpp) drives dispatch and help. Each command
// declares its positionals and options on its CLI11 subcommand, with validators, so a bad flag or value is
// a usage error (exit 2) before any compile or data load; what it returns runs once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mgn/environment.h"
#include "mgn/session.h"

namespace mgn::tool {

// What every command is given: the MGN_* variables read once by main(), and the root of the command line
// (for `mgn help`).
struct Context {
  const Environment& env;
  const CLI::App& app;
};

// A usage error found after parsing (a combination of flags, a folder the environment names): exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Run = std::function<int(const Context&)>;
// Declares the command's arguments on `app` (bound to state the returned function owns) and returns what
// runs after a successful parse.
using Declare = Run (*)(CLI::App& app);

struct Command {
  const char* name;
  const char* summary;  // one line, shown by `mgn --help` and at the top of the command's own help
  Declare declare;
  bool needs_environment = true;  // false: a malformed MGN_* value is a warning, not an error (help)
};

// ---- validators with readable messages (the value as given, and what is expected)
CLI::Validator at_least(int64_t min);                // an integer >= min
CLI::Validator number_at_least(double min);          // a number >= min
CLI::Validator positive_number();                    // a number > 0
CLI::Validator shape_text(const std::string& what);  // "MxNxK"-like dimensions, each >= 1

// Dimensions written "1x3x224x224"; throws UsageError naming `what`.
std::vector<int64_t> parse_dims(const std::string& text, const std::string& what);

// The options that say where and how a session compiles. Each given flag overrides the environment
// (MGN_DEVICE, MGN_PRECISION); the backend has no variable and defaults to auto.
struct CompileFlags {
  std::string backend = "auto";
  std::string device;     // empty: the environment's (MGN_DEVICE)
  std::string precision;  // empty: the environment's (MGN_PRECISION)
  bool tune = false;      // --tune: measured GEMM kernel choice (TuneMode::Measure, docs/tuning.md)
};
enum CompileFlag : unsigned {
  kBackendFlag = 1,
  kDeviceFlag = 2,
  kPrecisionFlag = 4,
  kTuneFlag = 8,
  kAllCompileFlags = 15
};
// `precision_names`: the flag's names ("--precision", or "--mode,--precision" where --mode came first).
void add_compile_flags(CLI::App& app, CompileFlags& flags, unsigned which = kAllCompileFlags,
                       const std::string& precision_names = "--precision");
Precision precision_from_name(const std::string& name);  // "strict", "accelerated"
// The positional MODEL_DIR of the Llama-family commands: an existing Hugging Face directory.
void add_model_dir(CLI::App& app, std::string& dir);
// The environment's options (mgn::Environment::apply), then the flags, then the mode.
CompileOptions compile_options(const Context& c, const CompileFlags& flags, Mode mode);

// Writes `text` to `path` through `path.tmp` and a rename, so a reader sees the old file or the new one whole
// (run descriptions, metrics); throws mgn::Error naming the file.
void write_text_atomic(const std::string& path, const std::string& text);

// ---- the commands (one Declare each; the table in tools/mgn.cpp names them)
Run declare_train_fashion_mnist(CLI::App& app);  // tools/train_cmd.cpp
Run declare_dump_checkpoint(CLI::App& app);      // tools/train_cmd.cpp
Run declare_kernels(CLI::App& app);              // tools/plan_cmd.cpp
Run declare_plan(CLI::App& app);                 // tools/plan_cmd.cpp
Run declare_inspect(CLI::App& app);              // tools/onnx_cmd.cpp
Run declare_run(CLI::App& app);                  // tools/onnx_cmd.cpp
Run declare_export(CLI::App& app);               // tools/onnx_cmd.cpp
Run declare_onnx_conformance(CLI::App& app);     // tools/onnx_conformance.cpp
Run declare_generate(CLI::App& app);             // tools/generate_cmd.cpp
Run declare_finetune(CLI::App& app);             // tools/finetune.cpp
Run declare_whisper_encode(CLI::App& app);       // tools/whisper_cmd.cpp
Run declare_dinov3_embed(CLI::App& app);         // tools/dinov3_cmd.cpp
Run declare_dinovision(CLI::App& app);           // tools/dinov3_cmd.cpp
Run declare_smolvla(CLI::App& app);              // tools/smolvla_cmd.cpp
Run declare_unet(CLI::App& app);                 // tools/unet_cmd.cpp
Run declare_llama_check(CLI::App& app);          // tools/llama_check.cpp
Run declare_bench(CLI::App& app);                // tools/bench.cpp
Run declare_bench_gemm(CLI::App& app);           // tools/bench_gemm.cpp
Run declare_cache(CLI::App& app);                // tools/cache_cmd.cpp
Run declare_devices(CLI::App& app);              // tools/mgn.cpp
Run declare_help(CLI::App& app);                 // tools/mgn.cpp

}  // namespace mgn::tool
