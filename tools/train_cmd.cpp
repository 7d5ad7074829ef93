// `mgn train-fashion-mnist` (the main job: train, checkpoint, reload into a fresh inference graph, test
// accuracy) and `mgn dump-checkpoint`.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "data_parallel_cli.h"
#include "metrics.h"
#include "mgn/checkpoint.h"
#include "mgn/data.h"
#include "mgn/models.h"
#include "mgn/train.h"
#include "progress.h"

namespace mgn::tool {

namespace {

struct TrainArgs {
  std::string model = "cnn";
  std::optional<int64_t> epochs, limit_train;
  int64_t batch = 64, eval_batch = 500, limit_test = 0;
  uint64_t seed = 0;
  double lr = 1e-3;
  std::string out, data, metrics;
  bool no_progress = false, full = false;
  CompileFlags compile;
  DataParallelFlags dp;  // --replicas, --data-parallel, --devices
};

// Keeps the first n samples.
void truncate(Dataset& d, int64_t n) {
  if (n <= 0 || n >= d.count) return;
  d.count = n;
  d.features.resize(size_t(n * d.sample_size()));
  d.labels.resize(size_t(n));
}

// The checkpoint path (--out, or fashion_mnist_<arch>.safetensors) and the data folder: --data is checked by
// its validator; the environment's folder (MGN_FASHION_MNIST_DIR or Debian's) here, before anything is loaded
// or compiled.
struct FashionPaths {
  std::string out, dir;
};
FashionPaths fashion_paths(const TrainArgs& a, const Context& c, models::FashionArch arch) {
  FashionPaths p;
  p.out = a.out.empty() ? std::string("fashion_mnist_") + models::fashion_arch_name(arch) + ".safetensors" : a.out;
  p.dir = a.data.empty() ? c.env.fashion_mnist_dir : a.data;
  if (!std::filesystem::is_directory(p.dir))
    throw UsageError(
        "the Fashion-MNIST folder " + p.dir +
        " does not exist (install dataset-fashion-mnist, or give --data DIR or MGN_FASHION_MNIST_DIR)");
  return p;
}

int train_fashion_mnist(const TrainArgs& a, const Context& c) {
  const models::FashionArch arch = models::fashion_arch_from_name(a.model);
  const FashionPaths paths = fashion_paths(a, c, arch);
  const std::string &out = paths.out, &dir = paths.dir;  // references, not bindings: lambdas capture them

  check_output_path(out);  // before any data is loaded or any step trained
  auto t0 = std::chrono::steady_clock::now();
  // The data first, so a folder without the files fails before any compile. The short version (below)
  // needs the device, so the training set is cut afterwards.
  std::fprintf(stderr, "loading Fashion-MNIST from %s ...", dir.c_str());
  Dataset train = load_fashion_mnist(dir, Split::Train, a.limit_train.value_or(0));
  Dataset test = load_fashion_mnist(dir, Split::Test, a.limit_test);
  std::fprintf(stderr, " %.1f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  Graph g = models::fashion_mnist({.arch = arch, .batch = a.batch, .mode = Mode::Train, .seed = a.seed});
  CompileOptions copt = compile_options(c, a.compile, Mode::Train);
  copt.optimizer = AdamW{.lr = a.lr};
  Session session = compile(g, copt);
  std::fprintf(stderr, "model %s, batch %lld, AdamW lr %g, backend %s (%s)\n",
               models::fashion_arch_name(arch), (long long)a.batch, a.lr, session.backend(),
               session.device_type());
  int64_t epochs = a.epochs.value_or(5);
  const std::string dev = session.device_type();
  if ((dev == "CPU" || dev == "host") && !a.full && !a.epochs && !a.limit_train) {
    epochs = 1;
    truncate(train, 6400);
    std::fprintf(stderr,
                 "no GPU: running the short version (1 epoch over %lld images); --full runs all 5 epochs\n",
                 (long long)train.count);
  }
  std::fprintf(stderr, "Fashion-MNIST: %lld training and %lld test images\n", (long long)train.count,
               (long long)test.count);
  // The deploy path: a fresh inference graph knows nothing of the training run but the checkpoint, which it
  // reloads after every epoch to measure the test accuracy.
  Graph gi =
      models::fashion_mnist({.arch = arch, .batch = a.eval_batch, .mode = Mode::Infer, .seed = a.seed + 1});
  Session infer = compile(gi, compile_options(c, a.compile, Mode::Infer));

  const std::string metrics_path =
      a.metrics == "none" ? std::string()
      : a.metrics.empty() ? std::filesystem::path(out).replace_extension(".metrics.jsonl").string()
                          : a.metrics;
  MetricsLog metrics(metrics_path);
  metrics.write("run", {{"command", "train-fashion-mnist"},
                        {"model", models::fashion_arch_name(arch)},
                        {"backend", session.backend()},
                        {"device_type", dev},
                        {"batch", a.batch},
                        {"optimizer", "AdamW"},
                        {"lr", a.lr},
                        {"epochs", epochs},
                        {"train_images", train.count},
                        {"test_images", test.count},
                        {"checkpoint", out}});
  BatchLoader loader(train, {.batch = a.batch, .shuffle = true, .seed = a.seed});
  std::unique_ptr<Progress> bar;
  const bool show = !a.no_progress;
  auto on_step = [&](const StepReport& r) {
    if (r.step_in_epoch == 1)
      bar =
          std::make_unique<Progress>("epoch " + std::to_string(r.epoch + 1) + "/" + std::to_string(r.epochs),
                                     r.steps_in_epoch, "steps", show);
    char extra[64];
    std::snprintf(extra, sizeof extra, "loss %.4f (mean %.4f)", r.loss, r.mean_loss);
    if (r.step_in_epoch == r.steps_in_epoch)
      bar->finish(extra);
    else
      bar->update(r.step_in_epoch, extra);
    nlohmann::json rec = {
        {"step", r.step},
        {"epoch", r.epoch + 1},
        {"loss", r.loss},
        {"lr", r.lr},
        {"samples_per_s", r.samples_per_second},
        {"time_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    if (r.batch_accuracy >= 0) rec["accuracy"] = r.batch_accuracy;
    metrics.write("step", rec);
  };
  // The batch accuracy costs a read of the logits: about 100 points per epoch are enough for a curve.
  Trainer trainer(session, {.epochs = epochs,
                            .checkpoint = out,
                            .logits = "logits",
                            .accuracy_every = std::max<int64_t>(1, loader.batches_per_epoch() / 100),
                            .on_step = on_step});
  EvalResult ev;
  int64_t epoch = 0;
  std::vector<EpochReport> reports = trainer.fit(loader, [&] {
    auto e0 = std::chrono::steady_clock::now();
    infer.load_checkpoint(out);
    ev = evaluate_classifier(infer, test);
    double eval_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    ++epoch;
    std::fprintf(stderr, "epoch %lld: test accuracy %.2f%% (checkpoint reloaded, %.1f s)\n", (long long)epoch,
                 100 * ev.accuracy, eval_s);
    return ev.accuracy;
  });
  for (const EpochReport& r : reports)
    metrics.write("epoch", {{"epoch", r.epoch + 1},
                            {"step", (r.epoch + 1) * loader.batches_per_epoch()},
                            {"steps", r.steps},
                            {"mean_loss", r.mean_loss},
                            {"test_accuracy", r.eval_accuracy},
                            {"seconds", r.seconds},
                            {"steps_per_s", r.steps_per_second}});
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics.write("end",
                {{"test_accuracy", ev.accuracy}, {"steps", session.step_count()}, {"seconds", total_s}});
  for (const EpochReport& r : reports)
    std::printf(
        "epoch %lld: mean loss %.4f (first batch %.4f, last %.4f), %.1f s, %.1f steps/s, test accuracy "
        "%.2f%%\n",
        (long long)r.epoch + 1, r.mean_loss, r.first_loss, r.last_loss, r.seconds, r.steps_per_second,
        100 * r.eval_accuracy);
  std::printf("checkpoint: %s (%lld steps)\n", out.c_str(), (long long)session.step_count());
  if (metrics.enabled())
    std::printf("metrics: %s (scripts/plot-training.py %s draws them)\n", metrics.path().c_str(),
                metrics.path().c_str());
  std::printf("test accuracy: %.2f%% on %lld images (fresh inference graph, checkpoint reloaded)\n",
              100 * ev.accuracy, (long long)test.count);
  std::printf("time: %.1f s total (data loading, compiling, training, evaluating)\n", total_s);
  return 0;
}

// The data-parallel path: --replicas N in this process, and/or --data-parallel mpi across the processes of
// mpirun. Every rank loads the same data and draws the same shuffled batches; replica r of R takes rows
// [r B/R, (r+1) B/R) of each batch. Rank 0 alone prints, writes the metrics and the checkpoint, and
// evaluates.
int train_data_parallel(const TrainArgs& a, const Context& c, const DataParallelPlace& place) {
  ProcessGroup* group = place.group;
  const int ranks = place.ranks;
  const bool root = place.root();
  const int64_t replicas = global_replicas(a.dp, place);
  check_batch_split(a.dp, place, a.batch);
  CompileOptions copt = compile_options(c, a.compile, Mode::Train);
  copt.optimizer = AdamW{.lr = a.lr};
  const std::vector<DeviceOptions> devices = replica_devices(a.dp, place, copt.device);

  const models::FashionArch arch = models::fashion_arch_from_name(a.model);
  const FashionPaths paths = fashion_paths(a, c, arch);
  const std::string &out = paths.out, &dir = paths.dir;  // references, not bindings: lambdas capture them
  if (root) check_output_path(out);
  auto t0 = std::chrono::steady_clock::now();
  Dataset train = load_fashion_mnist(dir, Split::Train, a.limit_train.value_or(0));
  Dataset test = root ? load_fashion_mnist(dir, Split::Test, a.limit_test) : Dataset{};

  const int64_t shard = a.batch / replicas;
  Graph g = models::fashion_mnist({.arch = arch, .batch = shard, .mode = Mode::Train, .seed = a.seed});
  DataParallelTrainer dp(g, {.compile = copt, .devices = devices, .group = group});
  Session& first = dp.gradient_session(0);
  int64_t epochs = a.epochs.value_or(5);
  const std::string dev = first.device_type();
  if ((dev == "CPU" || dev == "host") && !a.full && !a.epochs && !a.limit_train) {
    epochs = 1;
    truncate(train, 6400);
  }
  if (root)
    std::fprintf(
        stderr,
        "model %s, batch %lld = %lld replicas x %lld (%d process(es) x %lld), AdamW lr %g, backend %s (%s); "
        "%lld training images, %lld epoch(s)\n",
        models::fashion_arch_name(arch), (long long)a.batch, (long long)replicas, (long long)shard, ranks,
        (long long)a.dp.replicas, a.lr, first.backend(), dev.c_str(), (long long)train.count,
        (long long)epochs);
  std::optional<Session> infer;
  Graph gi;
  if (root) {
    gi =
        models::fashion_mnist({.arch = arch, .batch = a.eval_batch, .mode = Mode::Infer, .seed = a.seed + 1});
    infer.emplace(compile(gi, compile_options(c, a.compile, Mode::Infer)));
  }
  const std::string metrics_path =
      !root || a.metrics == "none" ? std::string()
      : a.metrics.empty()          ? std::filesystem::path(out).replace_extension(".metrics.jsonl").string()
                                   : a.metrics;
  MetricsLog metrics(metrics_path);
  metrics.write("run", {{"command", "train-fashion-mnist"},
                        {"model", models::fashion_arch_name(arch)},
                        {"backend", first.backend()},
                        {"device_type", dev},
                        {"batch", a.batch},
                        {"replicas", replicas},
                        {"processes", ranks},
                        {"optimizer", "AdamW"},
                        {"lr", a.lr},
                        {"epochs", epochs},
                        {"train_images", train.count},
                        {"checkpoint", out}});
  BatchLoader loader(train, {.batch = a.batch, .shuffle = true, .seed = a.seed});
  const int64_t steps_per_epoch = loader.batches_per_epoch();
  if (steps_per_epoch == 0)
    throw UsageError("--batch " + std::to_string(a.batch) + " is larger than the " +
                     std::to_string(train.count) + " training images");
  // Every rank must draw the same batches for as many steps, or one would wait for the others forever.
  if (group)
    for (auto [value, what] : {std::pair<int64_t, const char*>{steps_per_epoch, "steps per epoch"},
                               {epochs, "epochs"},
                               {int64_t(a.seed), "--seed"},
                               {train.count, "training images"}}) {
      std::vector<int64_t> all = group->all_gather(value);
      for (size_t r = 1; r < all.size(); ++r)
        if (all[r] != all[0])
          throw UsageError(std::string("the ranks disagree on ") + what + ": rank 0 has " +
                           std::to_string(all[0]) + ", rank " + std::to_string(r) + " has " +
                           std::to_string(all[r]) + " (give every rank the same arguments and data)");
    }
  EvalResult ev;
  Batch b;
  for (int64_t e = 0; e < epochs; ++e) {
    Progress bar("epoch " + std::to_string(e + 1) + "/" + std::to_string(epochs), steps_per_epoch, "steps",
                 root && !a.no_progress);
    loader.start_epoch(e);
    double sum = 0;
    int64_t steps = 0;
    auto te = std::chrono::steady_clock::now();
    while (loader.next(b)) {
      const double lr = dp.lr();
      dp.set_input("x", b.features);
      dp.set_input("labels", b.labels);
      const float loss = dp.step();  // the same value on every rank
      if (!std::isfinite(loss))
        throw Error("the loss became " + std::to_string(loss) + " at step " +
                    std::to_string(dp.step_count()) + "; lower the learning rate?");
      sum += loss;
      ++steps;
      char extra[64];
      std::snprintf(extra, sizeof extra, "loss %.4f (mean %.4f)", loss, sum / double(steps));
      if (steps == steps_per_epoch)
        bar.finish(extra);
      else
        bar.update(steps, extra);
      const double es = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
      metrics.write(
          "step", {{"step", dp.step_count()},
                   {"epoch", e + 1},
                   {"loss", loss},
                   {"lr", lr},
                   {"samples_per_s", double(steps * a.batch) / std::max(es, 1e-9)},
                   {"time_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
    }
    dp.save_checkpoint(out);  // rank 0 only, atomically
    if (root) {
      infer->load_checkpoint(out);
      ev = evaluate_classifier(*infer, test);
      std::fprintf(stderr, "epoch %lld: mean loss %.4f, test accuracy %.2f%% (checkpoint reloaded)\n",
                   (long long)e + 1, sum / double(std::max<int64_t>(steps, 1)), 100 * ev.accuracy);
      metrics.write("epoch", {{"epoch", e + 1},
                              {"steps", steps},
                              {"mean_loss", sum / double(std::max<int64_t>(steps, 1))},
                              {"test_accuracy", ev.accuracy}});
    }
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics.write("end", {{"test_accuracy", ev.accuracy}, {"steps", dp.step_count()}, {"seconds", total_s}});
  if (root) {
    std::printf("checkpoint: %s (%lld steps, %lld replicas)\n", out.c_str(), (long long)dp.step_count(),
                (long long)replicas);
    std::printf("test accuracy: %.2f%% on %lld images (fresh inference graph, checkpoint reloaded)\n",
                100 * ev.accuracy, (long long)test.count);
    std::printf("time: %.1f s total (data loading, compiling, training, evaluating)\n", total_s);
    const DataParallelTrainer::Timing& t = dp.timing();
    const double step_s = t.gradients_s + t.reduce_s + t.update_s;
    std::printf(
        "data-parallel steps (rank 0): forward+backward %.2f s, gradient reduction %.2f s (%.1f%%), update "
        "and weight copy %.2f s\n",
        t.gradients_s, t.reduce_s, 100 * t.reduce_s / std::max(step_s, 1e-12), t.update_s);
  }
  return 0;
}

}  // namespace

Run declare_train_fashion_mnist(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  app.add_option("--model", a->model, "the network")->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--epochs", a->epochs, "passes over the training set (default 5)")->check(at_least(1));
  app.add_option("--batch", a->batch, "training batch size")->check(at_least(1));
  app.add_option("--eval-batch", a->eval_batch, "batch size of the inference session that measures accuracy")
      ->check(at_least(1));
  app.add_option("--lr", a->lr, "AdamW learning rate")->check(positive_number());
  app.add_option("--limit-train", a->limit_train, "use the first N training images (0: all; default all)")
      ->check(at_least(0));
  app.add_option("--limit-test", a->limit_test, "use the first N test images (0: all)")->check(at_least(0));
  app.add_option("--out", a->out, "checkpoint file (default fashion_mnist_<model>.safetensors)")
      ->type_name("FILE");
  app.add_option("--seed", a->seed, "initialization and shuffling seed");
  app.add_option(
         "--data", a->data,
         "folder of the IDX files (default MGN_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--metrics", a->metrics,
                 "JSON Lines metrics file (default: the checkpoint's name with .metrics.jsonl; none: off)")
      ->type_name("FILE");
  app.add_flag("--no-progress", a->no_progress, "no progress line");
  app.add_flag("--full", a->full, "the whole job even without a GPU");
  add_compile_flags(app, a->compile);
  add_data_parallel_flags(app, a->dp);
  app.footer(
      "Trains with AdamW (default: the CNN, 5 epochs), saves the checkpoint after each epoch, loads it\n"
      "into a fresh inference graph and reports the test accuracy; every step's loss, batch accuracy, lr\n"
      "and throughput go to the metrics file (scripts/plot-training.py draws them). Without a GPU\n"
      "(lavapipe, or the CPU executor) and without --epochs or --limit-train it runs a short version\n"
      "(1 epoch over 6400 images) unless --full is given.");
  return [a](const Context& c) {
    if (!a->dp.enabled()) return train_fashion_mnist(*a, c);
    return run_data_parallel(a->dp, "train-fashion-mnist",
                             [&](const DataParallelPlace& p) { return train_data_parallel(*a, c, p); });
  };
}

Run declare_dump_checkpoint(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  app.add_option("FILE", *file, "a .safetensors file, or a sharded index (.json)")
      ->required()
      ->check(CLI::ExistingFile);
  return [file](const Context&) {
    TensorSet ts = read_tensor_set(*file, /*header_only=*/true);
    for (auto& [k, v] : ts.metadata) std::printf("metadata %s = %s\n", k.c_str(), v.c_str());
    for (auto& [name, t] : ts.tensors)
      std::printf("%-48s %-5s %s\n", name.c_str(), t.dtype.c_str(), shape_str(t.shape).c_str());
    return 0;
  };
}

}  // namespace mgn::tool
