// Data-parallel training: one compiled replica of a training graph per device, each batch split into
// contiguous shards in replica order, the gradients reduced on the host in a fixed order, and the same
// optimizer step applied on every replica, so that the replicas' weights stay bitwise identical and the
// result does not depend on timing (docs/multi-device.md).
//
//   mgn::Graph g = build_model(/*batch=*/32);   // the graph at the per-replica batch, with a scalar "loss"
//   mgn::DataParallelTrainer dp(g, {.compile = {.optimizer = mgn::AdamW{.lr = 1e-3}},
//                                   .devices = {dev0, dev1}});     // two replicas: batches of 64
//   dp.set_input("x", images64);             // the whole batch; replica r takes rows [32 r, 32 r + 32)
//   dp.set_input("labels", labels64);
//   float loss = dp.step();                  // the full-batch loss; every replica has the same new weights
//   dp.save_checkpoint("model.safetensors"); // the format Session::save_checkpoint writes
//
// Each replica is two sessions on its device: the gradient session (the graph, its backward pass and an
// output "grad.<parameter>" per trained parameter; Mode::Infer, so running it changes no state) and the
// update session (the parameters, an input "grad.<parameter>" each, and the optimizer compile() appends: the
// same update code a single Session runs). A step runs every gradient session, reduces their gradients
// (below), feeds the result to every update session, steps them, and copies the new parameters back into the
// gradient sessions.
//
// Reduction, exactly: with R replicas over all processes, each holding a shard of b = B / R samples, replica
// r gives g_r (f32, the gradient of its shard's loss). Element by element, s = 0 (double); for r = 0, 1, ...,
// R-1 in that order: s += double(g_r); the result is float(s / R) (GradientScale::Mean) or float(s) (Sum).
// For a loss that is a mean over the batch (cross-entropy), the mean over equal shards of the shard means is
// the full-batch mean, so Mean gives the full-batch mean gradient; a loss that sums over the batch takes Sum.
// The reported loss is reduced the same way. Shards are equal: a batch that R does not divide is an error
// (unequal shards b_r would need the weights b_r / B instead of 1 / R; not offered).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mgn/session.h"

namespace mgn {

// Processes that train together (one implementation over MPI is in the mgn tool, tools/mpi_group.h). Rank 0
// is the root. Every call is collective: all ranks make the same calls in the same order.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank 0 gets every rank's `send` (equal sizes on all ranks) concatenated in rank order; the others get {}.
  virtual std::vector<float> gather_to_root(std::span<const float> send) = 0;
  // Rank 0's `values` on every rank (the same size everywhere).
  virtual void broadcast_from_root(std::span<float> values) = 0;
  // Every rank's `value` in rank order, on every rank.
  virtual std::vector<int64_t> all_gather(int64_t value) = 0;
};

enum class GradientScale : uint8_t {
  Mean,  // the loss is a mean over the batch: the reduced gradient is the mean of the replicas' gradients
  Sum,   // the loss is a sum over the batch: the reduced gradient is their sum
};

struct DataParallelOptions {
  // As for one training Session: optimizer, update options, schedule, backend, kernels, planning, cache. The
  // mode is Train by definition; `device` is not used (see devices).
  CompileOptions compile;
  // One entry per replica of this process, in replica order (at least one). Entries may name the same
  // physical device: the trainer sets DeviceOptions::instance to the replica's index so that each replica
  // gets a VkDevice of its own. Ignored by the CPU engine, which still makes one replica per entry.
  std::vector<DeviceOptions> devices;
  // Inputs split along axis 0 (their graph shape holds the per-replica batch): empty means every input of the
  // graph but those in `replicated_inputs`, which every replica gets whole.
  std::vector<std::string> split_inputs;
  std::vector<std::string> replicated_inputs;
  GradientScale scale = GradientScale::Mean;
  // Other processes (MPI): replicas are numbered rank by rank, those of rank 0 first, and every rank must
  // have the same number of replicas. Null: this process alone.
  ProcessGroup* group = nullptr;
  // Across processes the gradients travel in buckets of at most this many values (rank 0 holds ranks x bucket
  // values at a time).
  int64_t bucket_values = int64_t(1) << 22;
  // Run the replicas' forward + backward passes (and their updates) on one thread each; off: one after the
  // other. The result is the same either way.
  bool threads = true;
};

class DataParallelTrainer {
 public:
  // `g` is the training graph at the per-replica batch with a scalar output `compile.loss`; its backward pass
  // is appended to `g` (compile it once). Throws mgn::Error for an empty device list, a graph whose forward
  // pass assigns state (batch-norm running statistics: each replica would keep its own), inputs whose first
  // axis cannot be split, ranks that disagree on the model or the replica count, and replicas on different
  // kinds of device (Session::backend() differs: they could round the update differently and part).
  DataParallelTrainer(Graph& g, DataParallelOptions opt);
  ~DataParallelTrainer();
  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;

  int replicas() const;          // over all processes
  int local_replicas() const;    // in this process
  int first_replica() const;     // the global index of this process's first replica
  int64_t shard_batch() const;   // per replica (the graph's)
  int64_t global_batch() const;  // shard_batch() * replicas(): what set_input takes for a split input

  // A whole batch (global_batch() rows for a split input; the graph's shape for a replicated one); this
  // process's replicas take their shards now. Throws naming the input and the counts expected.
  void set_input(const std::string& name, std::span<const float> values);
  void set_input(const std::string& name, std::span<const int32_t> values);
  void set_input(const std::string& name, const std::vector<float>& v) {
    set_input(name, std::span<const float>(v));
  }
  void set_input(const std::string& name, const std::vector<int32_t>& v) {
    set_input(name, std::span<const int32_t>(v));
  }

  // One optimizer step over the whole batch; returns its loss (the replicas' losses reduced as the
  // gradients).
  float step();

  // Wall time of this process's steps so far, by phase (seconds): the replicas' forward + backward passes
  // with the gradients' readback; the reduction (across processes: the gathers, the sum on rank 0, the
  // broadcasts, and the wait for the slowest rank); the update sessions' steps with the uploads of the
  // reduced gradients and the copies of the new weights into the gradient sessions.
  struct Timing {
    double gradients_s = 0, reduce_s = 0, update_s = 0;
    int64_t steps = 0;
  };
  const Timing& timing() const;

  // Writes a parameter into every replica of this process (pretrained weights after construction; the
  // constructor gave every replica rank 0's initial values). Every process must write the same values (each
  // reads the same file), or the replicas part; the trainer does not compare them. Throws for a name that is
  // not a parameter of the graph or values of the wrong size (Session::write_parameter's errors).
  void write_parameter(const std::string& name, std::span<const float> values);

  // A parameter or optimizer state of a replica of this process (they are all equal).
  std::vector<float> read(const std::string& name, int local_replica = 0);
  // An output of the last step on one replica of this process (its shard's rows).
  std::vector<float> read_output(const std::string& name, int local_replica = 0);
  std::vector<std::string> parameter_names() const;  // trained parameters, in graph order

  double lr() const;
  void set_lr(double base);
  int64_t step_count() const;

  // The parameters, optimizer state and step, as Session::save_checkpoint writes them (a training Session of
  // the same graph loads the file). Written atomically by rank 0 only; other ranks write nothing.
  void save_checkpoint(const std::string& path);
  // Every replica of this process loads the file.
  void load_checkpoint(const std::string& path);

  // The two sessions of a replica of this process (tests, diagnostics).
  Session& gradient_session(int local_replica);
  Session& update_session(int local_replica);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The reduction the trainer applies (above): `buffers` holds R buffers of `count` values one after the other,
// in replica order; returns the `count` reduced values. Public so that a test can check it against a closed
// form.
std::vector<float> reduce_replica_gradients(std::span<const float> buffers, int replicas, size_t count,
                                            GradientScale scale);

}  // namespace mgn
