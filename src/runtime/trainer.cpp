// Trainer and classifier evaluation: the host loop around Session::step / run.
#include "mgn/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace mgn {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_batch_input(Session& s, const std::string& input, const Dataset& data, int64_t* batch) {
  Shape in = s.shape_of(input);
  if (in.empty()) throw Error("input '" + input + "' is a scalar; expected [batch, ...]");
  Shape sample(in.begin() + 1, in.end());
  if (numel(sample) != data.sample_size())
    throw Error("input '" + input + "' has shape " + shape_str(in) + ", which does not take samples of shape " +
                shape_str(data.sample_shape));
  *batch = in[0];
}

// The share of rows whose argmax (lowest index on ties) equals the label.
double batch_accuracy(const std::vector<float>& logits, const std::vector<int32_t>& labels) {
  size_t rows = labels.size(), classes = rows ? logits.size() / rows : 0;
  if (classes == 0) return -1;
  int64_t correct = 0;
  for (size_t i = 0; i < rows; ++i) {
    size_t best = 0;
    for (size_t c = 1; c < classes; ++c)
      if (logits[i * classes + c] > logits[i * classes + best]) best = c;
    correct += int32_t(best) == labels[i];
  }
  return double(correct) / double(rows);
}

}  // namespace

Trainer::Trainer(Session& session, TrainerOptions opt) : s_(session), opt_(std::move(opt)) {
  if (s_.mode() != Mode::Train) throw Error("Trainer: the session was compiled for inference");
  if (opt_.epochs <= 0) throw Error("Trainer: epochs must be positive");
  if (opt_.accuracy_every <= 0) throw Error("Trainer: accuracy_every must be positive");
}

EpochReport Trainer::train_epoch(BatchLoader& loader, int64_t epoch) {
  int64_t batch = 0;
  check_batch_input(s_, opt_.input, loader.dataset(), &batch);
  if (batch != loader.options().batch)
    throw Error("Trainer: the loader's batch size " + std::to_string(loader.options().batch) +
                " differs from the graph's " + std::to_string(batch));
  if (!loader.options().drop_last)
    throw Error("Trainer: training needs full batches (LoaderOptions::drop_last = true)");
  EpochReport r;
  r.epoch = epoch;
  int64_t total = loader.batches_per_epoch();
  loader.start_epoch(epoch);
  Batch b;
  double sum = 0;
  auto t0 = Clock::now();
  while (loader.next(b)) {
    double lr = s_.lr();
    s_.set_input(opt_.input, b.features);
    s_.set_input(opt_.labels, b.labels);
    s_.step();
    float loss = s_.read_scalar(opt_.loss);
    if (!std::isfinite(loss))
      throw Error("Trainer: the loss became " + std::to_string(loss) + " at step " + std::to_string(s_.step_count()) +
                  " (epoch " + std::to_string(epoch + 1) + "); lower the learning rate?");
    losses_.push_back(loss);
    if (r.steps == 0) r.first_loss = loss;
    r.last_loss = loss;
    sum += loss;
    ++r.steps;
    if (opt_.on_step) {
      StepReport sr;
      sr.epoch = epoch;
      sr.epochs = opt_.epochs;
      sr.step_in_epoch = r.steps;
      sr.steps_in_epoch = total;
      sr.step = s_.step_count();
      sr.loss = loss;
      sr.mean_loss = sum / double(r.steps);
      sr.lr = lr;
      if (!opt_.logits.empty() && sr.step % opt_.accuracy_every == 0)
        sr.batch_accuracy = batch_accuracy(s_.read(opt_.logits), b.labels);
      sr.epoch_seconds = seconds_since(t0);
      sr.samples_per_second = double(r.steps * batch) / std::max(sr.epoch_seconds, 1e-9);
      opt_.on_step(sr);
    }
  }
  r.seconds = seconds_since(t0);
  r.mean_loss = r.steps ? sum / double(r.steps) : 0;
  r.steps_per_second = double(r.steps) / std::max(r.seconds, 1e-9);
  if (!opt_.checkpoint.empty()) s_.save_checkpoint(opt_.checkpoint);
  return r;
}

std::vector<EpochReport> Trainer::fit(BatchLoader& loader, const std::function<double()>& evaluate) {
  std::vector<EpochReport> out;
  for (int64_t e = 0; e < opt_.epochs; ++e) {
    EpochReport r = train_epoch(loader, e);
    if (evaluate) {
      r.eval_accuracy = evaluate();
    }
    out.push_back(r);
  }
  return out;
}

EvalResult evaluate_classifier(Session& infer, const Dataset& data, const std::string& input,
                               const std::string& logits) {
  if (infer.mode() != Mode::Infer) throw Error("evaluate_classifier: the session was compiled for training");
  int64_t batch = 0;
  check_batch_input(infer, input, data, &batch);
  Shape ls = infer.shape_of(logits);
  if (ls.size() != 2 || ls[0] != batch)
    throw Error("evaluate_classifier: output '" + logits + "' has shape " + shape_str(ls) + ", expected [" +
                std::to_string(batch) + ", classes]");
  int64_t classes = ls[1];
  BatchLoader loader(data, {.batch = batch, .shuffle = false, .drop_last = false});
  EvalResult r;
  r.predictions.reserve(size_t(data.count));
  int64_t correct = 0;
  Batch b;
  while (loader.next(b)) {
    infer.set_input(input, b.features);
    infer.run();
    std::vector<float> z = infer.read(logits);
    for (int64_t i = 0; i < b.size; ++i) {
      int32_t best = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (z[size_t(i * classes + c)] > z[size_t(i * classes + best)]) best = int32_t(c);
      r.predictions.push_back(best);
      correct += best == data.labels[size_t(b.indices[size_t(i)])];
    }
  }
  r.accuracy = double(correct) / double(data.count);
  return r;
}

}  // namespace mgn
