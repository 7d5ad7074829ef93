// The Trainer: epochs over a BatchLoader with a progress bar on stderr (steps/s, loss), optional
// evaluation after each epoch, and a checkpoint saved after each epoch.
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

struct TrainerOptions {
  int64_t epochs = 1;
  bool progress = true;    // a progress bar on stderr
  std::string checkpoint;  // non-empty: saved (atomically) after every epoch
  std::string input = "x";
  std::string labels = "labels";
  std::string loss = "loss";
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
