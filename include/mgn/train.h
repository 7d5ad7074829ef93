// The Trainer: epochs over a BatchLoader, optional evaluation after each epoch, and a checkpoint saved after
// each epoch. It prints nothing: every step is reported to TrainerOptions::on_step (a progress line, a
// metrics file; the mgn tool draws its progress line from it).
//
//   mgn::Trainer trainer(train_session, {.epochs = 5, .checkpoint = "mlp.safetensors"});
//   trainer.fit(loader, [&] { infer.load_checkpoint("mlp.safetensors"); return mgn::evaluate_classifier(infer, test).accuracy; });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mgn/data.h"
#include "mgn/session.h"

namespace mgn {

// One training step as the Trainer saw it, passed to TrainerOptions::on_step.
struct StepReport {
  int64_t epoch = 0;           // 0-based
  int64_t epochs = 0;          // of the fit (TrainerOptions::epochs)
  int64_t step_in_epoch = 0;   // 1-based: steps done in this epoch
  int64_t steps_in_epoch = 0;  // batches per epoch
  int64_t step = 0;            // optimizer steps completed by the session (Session::step_count)
  double loss = 0;
  double mean_loss = 0;          // over the epoch so far
  double batch_accuracy = -1;    // of this step's batch (TrainerOptions::logits), -1 when not measured
  double lr = 0;                 // the learning rate this step used
  double epoch_seconds = 0;      // since the epoch started
  double samples_per_second = 0; // over the epoch so far
};

struct TrainerOptions {
  int64_t epochs = 1;
  std::string checkpoint;  // non-empty: saved (atomically) after every epoch
  std::string input = "x";
  std::string labels = "labels";
  std::string loss = "loss";
  // Non-empty: an output [batch, classes] whose argmax gives StepReport::batch_accuracy, on the steps whose
  // number (Session::step_count) is a multiple of accuracy_every: each costs one more read from the device.
  std::string logits;
  int64_t accuracy_every = 1;
  // Called on the host after every step (the loss is read); exceptions propagate out of fit().
  std::function<void(const StepReport&)> on_step;
};

struct EpochReport {
  int64_t epoch = 0;
  int64_t steps = 0;
  double first_loss = 0;  // of the epoch's first batch
  double last_loss = 0;
  double mean_loss = 0;
  double seconds = 0;
  double steps_per_second = 0;
  double eval_accuracy = -1;  // -1: not evaluated
};

class Trainer {
 public:
  // The session must be in Train mode with inputs `input` [batch, ...] and `labels` [batch].
  Trainer(Session& session, TrainerOptions opt);
  EpochReport train_epoch(BatchLoader& loader, int64_t epoch);
  // All epochs; `evaluate` (optional) runs after each epoch's checkpoint and returns an accuracy.
  std::vector<EpochReport> fit(BatchLoader& loader, const std::function<double()>& evaluate = {});
  // Every step's loss so far, in order.
  const std::vector<float>& losses() const { return losses_; }

 private:
  Session& s_;
  TrainerOptions opt_;
  std::vector<float> losses_;
};

struct EvalResult {
  double accuracy = 0;
  std::vector<int32_t> predictions;  // argmax class per sample, in dataset order
};

// Runs an inference session over a whole dataset in batches of its input's batch size (the last batch is
// padded; the padding's predictions are dropped) and compares the argmax of `logits` with the labels.
EvalResult evaluate_classifier(Session& infer, const Dataset& data, const std::string& input = "x",
                               const std::string& logits = "logits");

}  // namespace mgn
