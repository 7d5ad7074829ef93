// The `mgn` command line: the table of commands, which drives both dispatch and help, and main(), which
// parses the arguments (every flag and value is checked before any work), reads the MGN_* variables once
// and hands them to the command. Exit status: 0 ok, 1 runtime error, 2 usage error.
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "mgn/device.h"
#include "mgn/environment.h"

#ifndef MGN_VERSION
#define MGN_VERSION "unknown"
#endif

namespace mgn::tool {

namespace {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"train-fashion-mnist", "the main job: train a Fashion-MNIST CNN or MLP, save, reload, test accuracy",
       declare_train_fashion_mnist},
      {"dump-checkpoint", "list the tensors and metadata of a safetensors file or sharded index",
       declare_dump_checkpoint},
      {"kernels", "print the generated GLSL of a compiled Fashion-MNIST session", declare_kernels},
      {"plan", "print the static plan and memory report of a training step", declare_plan},
      {"inspect", "describe an ONNX or NNEF model: opset, inputs and outputs, ops, parameters", declare_inspect},
      {"run", "import an ONNX or NNEF model, run it once, print or save its outputs", declare_run},
      {"export", "write an ONNX or NNEF model as an NNEF folder, or a Llama model as GGUF for llama.cpp", declare_export},
      {"onnx-conformance", "run the ONNX backend test suite (libonnx-testdata) and report per case",
       declare_onnx_conformance},
      {"generate", "continue a prompt with a Hugging Face Llama-family model", declare_generate},
      {"finetune", "train a Llama-family model on a text file, save it as a model directory",
       declare_finetune},
      {"whisper-encode", "encode sound files with a Hugging Face Whisper encoder (states per file)",
       declare_whisper_encode},
      {"dinov3-embed", "embed images with a Hugging Face DINOv3 ViT (CLS + patch features per image)",
       declare_dinov3_embed},
      {"dinovision", "train a decoder on frozen DINOv3 features to reconstruct images, or reconstruct with it",
       declare_dinovision},
      {"smolvla", "train the SmolVLA action expert by flow matching on VLM K/V tensors, or sample actions",
       declare_smolvla},
      {"unet", "train the paper's conditioned U-Net as a diffusion model on Fashion-MNIST, or sample from it",
       declare_unet},
      {"llama-check", "gate and time a Llama-family model against a PyTorch reference directory",
       declare_llama_check},
      {"bench", "time a workload phase by phase and write the tensors of the correctness gates",
       declare_bench},
      {"bench-gemm", "time one-matmul sessions per MxNxK shape (one JSON line each)", declare_bench_gemm},
      {"cache", "show or clear the compiled-session, SPIR-V and pipeline caches", declare_cache},
      {"devices", "list the Vulkan devices (--verbose: features, f16 GEMM self-test)", declare_devices},
      {"help", "help on a command (mgn help CMD) or the MGN_* variables (mgn help environment)", declare_help,
       false},
  };
  return table;
}

// Markdown of environment_variables() as plain text: no backticks or bold, wrapped under each name.
std::string plain(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') continue;
    if (s.compare(i, 2, "**") == 0) {
      ++i;
      continue;
    }
    out += s[i];
  }
  return out;
}

void print_wrapped(const std::string& text, size_t indent, size_t width) {
  std::string line;
  size_t p = 0;
  while (p < text.size()) {
    size_t q = text.find(' ', p);
    if (q == std::string::npos) q = text.size();
    const std::string word = text.substr(p, q - p);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      std::printf("%*s%s\n", int(indent), "", line.c_str());
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    p = q + 1;
  }
  if (!line.empty()) std::printf("%*s%s\n", int(indent), "", line.c_str());
}

void print_environment() {
  static const std::pair<const char*, const char*> kSections[] = {
      {"device", "Device, caches and diagnostics"},
      {"compiler", "Compiler and kernel choices (for benchmarking and for working around a driver)"},
      {"tests", "Tests only (read by the test programs, never by the library)"}};
  std::printf(
      "The MGN_* environment variables (docs/environment.md). None is needed; a malformed value is an "
      "error,\n"
      "an unknown MGN_* name a warning. Command-line flags (--device, --precision) override them.\n");
  for (const auto& [key, title] : kSections) {
    std::printf("\n%s:\n", title);
    for (const EnvironmentVariable& v : environment_variables()) {
      if (std::string(v.section) != key) continue;
      std::printf("  %s\n", v.name);
      print_wrapped("values: " + plain(v.values), 6, 110);
      print_wrapped(plain(v.effect), 6, 110);
    }
  }
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace

Run declare_help(CLI::App& app) {
  struct Args {
    std::string topic;
    bool markdown = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("TOPIC", a->topic, "a command, or `environment` for the MGN_* variables");
  app.add_flag("--markdown", a->markdown, "with `environment`: the tables of docs/environment.md, verbatim");
  return [a](const Context& c) {
    if (a->markdown && a->topic != "environment")
      throw UsageError("--markdown goes with the topic environment");
    if (a->topic.empty()) {
      std::fputs(c.app.get_formatter()->make_help(&c.app, "mgn", CLI::AppFormatMode::Normal).c_str(), stdout);
    } else if (a->topic == "environment") {
      if (a->markdown)
        std::fputs(environment_markdown().c_str(), stdout);
      else
        print_environment();
    } else if (find_command(a->topic)) {
      std::fputs(c.app.get_subcommand(a->topic)->help("mgn").c_str(), stdout);
    } else {
      throw UsageError("no command or topic '" + a->topic + "' (mgn --help lists the commands)");
    }
    return 0;
  };
}

Run declare_devices(CLI::App& app) {
  struct Args {
    bool verbose = false;
  };
  auto a = std::make_shared<Args>();
  app.add_flag("--verbose,-v", a->verbose,
               "also open each device: the features meganeura uses and the f16 GEMM self-test verdict");
  app.footer(
      "Sessions open the device MGN_DEVICE or --device names, else the first of Vulkan >= 1.2,\n"
      "discrete before integrated before virtual before CPU.");
  return [a](const Context& c) {
    const std::vector<DeviceDescription> list = list_devices();
    if (list.empty()) {
      std::printf("no Vulkan backend in this build: sessions run on the CPU reference executor\n");
      return 0;
    }
    for (const DeviceDescription& d : list) {
      if (!a->verbose) {
        std::printf("%u: %s (%s), Vulkan %s, %s\n", d.index, d.name.c_str(), d.type.c_str(),
                    d.api_version.c_str(), d.driver.c_str());
        continue;
      }
      DeviceOptions o = c.env.device;
      o.device = std::to_string(d.index);
      try {
        const DeviceDescription full = describe_device(o, c.env.kernels);
        std::fputs(full.features.c_str(), stdout);  // starts with the device's line
        if (!full.features.empty() && full.features.back() != '\n') std::printf("\n");
        std::printf("  f16 GEMM: %s\n\n", full.f16_gemm.c_str());
      } catch (const Error& e) {
        std::printf("%u: %s (%s): not usable: %s\n\n", d.index, d.name.c_str(), d.type.c_str(), e.what());
      }
    }
    if (a->verbose) {
      try {
        const DeviceDescription chosen = describe_device(c.env.device, c.env.kernels);
        std::printf("sessions open device %u (%s)\n", chosen.index, chosen.name.c_str());
      } catch (const Error& e) {
        std::printf("sessions open no device: %s\n", e.what());
      }
    }
    return 0;
  };
}

}  // namespace mgn::tool

namespace {

int run_main(int argc, char** argv) {
  using namespace mgn::tool;
  CLI::App app{"meganeura: trains and runs neural networks on Vulkan GPUs", "mgn"};
  app.option_defaults()->always_capture_default();
  // One command per call: its arguments are never taken for another command's name (`mgn help bench`).
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "mgn " MGN_VERSION);
  std::vector<std::pair<const Command*, Run>> runs;
  for (const Command& c : commands())
    runs.emplace_back(&c, c.declare(*app.add_subcommand(c.name, c.summary)));
  // After the subcommands, which would inherit it.
  app.footer(
      "mgn CMD --help (or mgn help CMD) describes a command; mgn help environment lists the MGN_* "
      "variables.\n"
      "Exit status: 0 ok, 1 runtime error, 2 usage error.");

  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> subs = app.get_subcommands();
    if (!subs.empty())
      std::fprintf(stderr, "mgn %s: %s\n", subs[0]->get_name().c_str(), e.what());
    else if (argv[1][0] != '-')
      std::fprintf(stderr, "mgn: unknown command '%s' (mgn --help lists the commands)\n", argv[1]);
    else
      std::fprintf(stderr, "mgn: %s (mgn --help lists the commands)\n", e.what());
    return 2;
  }
  const std::vector<CLI::App*> subs = app.get_subcommands();
  if (subs.empty()) {  // options of mgn itself only (none runs anything)
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  const std::string name = subs[0]->get_name();
  const Command* cmd = nullptr;
  const Run* run = nullptr;
  for (const auto& [c, r] : runs)
    if (name == c->name) cmd = c, run = &r;

  // The MGN_* variables, once; commands get them through the Context and never read the environment.
  mgn::Environment env;
  try {
    env = mgn::read_environment();
  } catch (const std::exception& e) {
    if (cmd->needs_environment) {
      std::fprintf(stderr, "mgn %s: %s\n", name.c_str(), e.what());
      return 2;
    }
    std::fprintf(stderr, "mgn: warning: %s\n", e.what());
  }
  for (const std::string& v : env.unknown)
    std::fprintf(stderr,
                 "mgn: warning: %s is set but is no meganeura variable (mgn help environment lists them)\n",
                 v.c_str());

  try {
    return (*run)(Context{env, app});
  } catch (const UsageError& e) {
    std::fprintf(stderr, "mgn %s: %s\n", name.c_str(), e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mgn %s: out of host memory\n", name.c_str());
  } catch (const std::exception& e) {  // mgn::Error, and anything the standard library throws
    std::fprintf(stderr, "mgn %s: %s\n", name.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "mgn %s: stopped by an exception of unknown type\n", name.c_str());
  }
  return 1;
}

}  // namespace

// Whatever escapes (from parsing, the environment or a command) becomes one line and exit 1, never an abort.
int main(int argc, char** argv) {
  const char* cmd = argc > 1 && argv[1][0] != '-' ? argv[1] : "";
  const std::string who = std::string("mgn") + (*cmd ? " " : "") + cmd;
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of host memory\n", who.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: stopped by an exception of unknown type\n", who.c_str());
  }
  return 1;
}
