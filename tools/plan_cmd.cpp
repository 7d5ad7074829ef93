// `mgn kernels` (the generated GLSL of a compiled Fashion-MNIST session) and `mgn plan` (the static plan and
// memory report of a training step or a ResNet's forward).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli.h"
#include "mgn/llama.h"
#include "mgn/models.h"
#include "mgn/plan.h"

namespace mgn::tool {

namespace {

struct KernelsArgs {
  std::string model = "cnn", mode = "train", filter;
  int64_t batch = 64;
  bool list = false;
  CompileFlags compile{.backend = "vulkan"};
};

int print_kernels(const KernelsArgs& a, const Context& c) {
  const Mode m = a.mode == "train" ? Mode::Train : Mode::Infer;
  Graph g =
      models::fashion_mnist({.arch = models::fashion_arch_from_name(a.model), .batch = a.batch, .mode = m});
  Session s = compile(g, compile_options(c, a.compile, m));
  int shown = 0;
  for (const auto& [name, glsl] : s.kernel_sources()) {
    if (!a.filter.empty() && name.find(a.filter) == std::string::npos) continue;
    ++shown;
    if (a.list)
      std::printf("%s\n", name.c_str());
    else
      std::printf("// ===== %s\n%s\n", name.c_str(), glsl.c_str());
  }
  if (shown == 0) throw Error("no kernel matches --filter '" + a.filter + "'");
  return 0;
}

struct PlanArgs {
  std::string model = "cnn", mode = "train", show = "all", reuse = "on";
  std::optional<int64_t> batch;
  int64_t seq = 128, image = 224;
};

bool is_resnet(const std::string& m) {
  return m == "resnet18" || m == "resnet50";
}

int print_plan(const PlanArgs& a) {
  // Checked before any graph is built: a Llama config file is read below.
  if (a.mode == "infer" && !is_resnet(a.model))
    throw UsageError("--mode infer is for a ResNet (--model resnet18|resnet50)");
  Graph g;
  if (is_resnet(a.model)) {
    g = models::resnet({.depth = a.model == "resnet18" ? 18 : 50,
                        .batch = a.batch.value_or(4),
                        .image_size = a.image,
                        .mode = a.mode == "train" ? Mode::Train : Mode::Infer});
  } else if (a.model == "smollm2-135m" || a.model.rfind("llama:", 0) == 0) {
    // A Llama-family training step: next-token loss over [batch, seq] tokens.
    llama::Config cfg = a.model == "smollm2-135m" ? llama::Config::smollm2_135m()
                                                  : llama::Config::from_file(a.model.substr(6));
    g = llama::loss_graph(cfg, {.batch = a.batch.value_or(1), .seq = a.seq});
  } else {
    g = models::fashion_mnist({.arch = models::fashion_arch_from_name(a.model),
                               .batch = a.batch.value_or(64),
                               .mode = Mode::Train});
  }
  PlanDescribeOptions po{.dump = a.show == "all", .reuse = a.reuse == "on"};
  std::fputs(
      (a.mode == "infer" ? describe_plan(g, po) : describe_training_plan(g, "loss", AdamW{}, po)).c_str(),
      stdout);
  return 0;
}

}  // namespace

Run declare_kernels(CLI::App& app) {
  auto a = std::make_shared<KernelsArgs>();
  app.add_option("--model", a->model, "the Fashion-MNIST network")->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--mode", a->mode, "the training step (forward, backward, AdamW) or the forward alone")
      ->check(CLI::IsMember({"train", "infer"}));
  app.add_option("--batch", a->batch, "batch size")->check(at_least(1));
  app.add_option("--filter", a->filter, "only kernels whose name contains this")->type_name("SUBSTR");
  app.add_flag("--list", a->list, "kernel names only");
  add_compile_flags(app, a->compile, kDeviceFlag | kPrecisionFlag);
  app.footer("Compiles the session on the Vulkan backend and prints every dispatch's kernel in order.");
  return [a](const Context& c) { return print_kernels(*a, c); };
}

Run declare_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option(
         "--model", a->model,
         "cnn, mlp (Fashion-MNIST), smollm2-135m, llama:CONFIG.json (a Hugging Face config), resnet18, "
         "resnet50")
      ->check(CLI::Validator(
          [](std::string& m) -> std::string {
            if (m == "cnn" || m == "mlp" || m == "smollm2-135m" || is_resnet(m)) return "";
            if (m.rfind("llama:", 0) == 0)
              return std::filesystem::is_regular_file(m.substr(6)) ? ""
                                                                   : "no config file '" + m.substr(6) + "'";
            return "expected cnn, mlp, smollm2-135m, llama:CONFIG.json, resnet18 or resnet50, got '" + m +
                   "'";
          },
          "MODEL"));
  app.add_option("--batch", a->batch, "batch size (default 64 Fashion-MNIST, 1 Llama, 4 ResNet)")
      ->check(at_least(1));
  app.add_option("--seq", a->seq, "Llama: tokens per row")->check(at_least(2));
  app.add_option("--image", a->image, "ResNet: image side in pixels")->check(at_least(1));
  app.add_option("--mode", a->mode, "the AdamW training step, or (ResNet) the eval-mode forward")
      ->check(CLI::IsMember({"train", "infer"}));
  app.add_option("--show", a->show, "the whole dump, or the memory report alone")
      ->check(CLI::IsMember({"all", "report"}));
  app.add_option("--reuse", a->reuse, "off: no aliasing or in-place reuse (for comparison)")
      ->check(CLI::IsMember({"on", "off"}));
  app.footer(
      "Prints the static plan (barrier groups, buffers with lifetimes and offsets) and the memory report\n"
      "(logical vs physical bytes per class) as a GPU backend plans it: 4-byte elements, 256-byte "
      "alignment.");
  return [a](const Context&) { return print_plan(*a); };
}

}  // namespace mgn::tool
