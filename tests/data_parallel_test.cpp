// DataParallelTrainer: two replicas in one process (each on its own logical device) against single-device
// references, on the CPU executor and on Vulkan (lavapipe here, validation on), and the reduction's closed
// form.
//
// References:
//  * exact: one Session whose graph runs the model twice with shared parameters, once per half batch, with
//  the
//    loss 0.5 * (loss(half 0) + loss(half 1)). Its parameter gradients are g_0/2 + g_1/2 summed by autodiff,
//    where g_r is the gradient of half r's own mean loss; halving is exact in floating point (no subnormals
//    here) and a + b = b + a, so with two replicas the documented reduction float((double(g_0) + double(g_1))
//    / 2) is bit for bit that sum (the double sum of two floats rounds once to the float sum). So the weights
//    and the optimizer's moments after k steps must be bitwise equal.
//  * approximate: one Session on the whole batch (one matmul over all rows sums the per-sample products in
//    another order): equal to the f32 rounding of the gradient sums. The tolerance below was measured (see
//    the constant) and is a few ulps of the weights' scale.
#include "mgn/data_parallel.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "backend/vulkan/context.h"
#include "mgn/checkpoint.h"
#include "mgn/session.h"
#include "runtime/engine.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

constexpr int64_t kIn = 6, kHidden = 8, kClasses = 3, kShard = 4, kReplicas = 2, kBatch = kShard * kReplicas;
constexpr int kSteps = 3;

struct Params {
  Tensor w1, b1, w2, b2;
};

Params make_params(Graph& g) {
  return {g.parameter("fc1.weight", {kHidden, kIn}, Init::uniform(-0.5, 0.5, 1)),
          g.parameter("fc1.bias", {kHidden}, Init::uniform(-0.1, 0.1, 2)),
          g.parameter("fc2.weight", {kClasses, kHidden}, Init::uniform(-0.5, 0.5, 3)),
          g.parameter("fc2.bias", {kClasses}, Init::uniform(-0.1, 0.1, 4))};
}

Tensor mlp_loss(const Params& p, Tensor x, Tensor labels) {
  return cross_entropy(linear(relu(linear(x, p.w1, p.b1)), p.w2, p.b2), labels);
}

// The model at `batch` rows, inputs "x" and "labels", output "loss".
Graph plain_graph(int64_t batch) {
  Graph g;
  Params p = make_params(g);
  g.output("loss", mlp_loss(p, g.input("x", {batch, kIn}), g.input("labels", {batch}, DType::I32)));
  return g;
}

// The exact reference: two branches of kShard rows over the same parameters, loss = 0.5 (loss_0 + loss_1).
Graph two_branch_graph() {
  Graph g;
  Params p = make_params(g);
  Tensor l0 = mlp_loss(p, g.input("x0", {kShard, kIn}), g.input("labels0", {kShard}, DType::I32));
  Tensor l1 = mlp_loss(p, g.input("x1", {kShard, kIn}), g.input("labels1", {kShard}, DType::I32));
  g.output("loss", (l0 + l1) * 0.5);
  return g;
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> labels;
};

// Step s's whole batch.
Data batch_of(int s) {
  std::mt19937 rng(100 + s);
  std::uniform_real_distribution<float> u(-1, 1);
  Data d;
  for (int64_t i = 0; i < kBatch * kIn; ++i) d.x.push_back(u(rng));
  for (int64_t i = 0; i < kBatch; ++i) d.labels.push_back(int32_t(rng() % kClasses));
  return d;
}

// Step s's batch: its two halves into the two-branch reference session (x0/labels0, x1/labels1), which takes its
// step, and the whole batch into the trainer (whose step the caller takes).
void feed_step(Session& ref, DataParallelTrainer& dp, int s) {
  Data d = batch_of(s);
  const size_t half_x = size_t(kShard * kIn), half_l = size_t(kShard);
  ref.set_input("x0", std::span<const float>(d.x.data(), half_x));
  ref.set_input("x1", std::span<const float>(d.x.data() + half_x, half_x));
  ref.set_input("labels0", std::span<const int32_t>(d.labels.data(), half_l));
  ref.set_input("labels1", std::span<const int32_t>(d.labels.data() + half_l, half_l));
  ref.step();
  dp.set_input("x", d.x);
  dp.set_input("labels", d.labels);
}

CompileOptions options(Backend backend, const Optimizer& opt) {
  CompileOptions c{.mode = Mode::Train, .optimizer = opt, .backend = backend};
  c.device = test::device_options();
  return c;
}

DataParallelOptions dp_options(Backend backend, const Optimizer& opt) {
  DataParallelOptions o{.compile = options(backend, opt)};
  o.devices.assign(size_t(kReplicas), test::device_options());  // the same physical device twice
  return o;
}

const std::vector<std::string> kParams = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};

// Parameters and every optimizer state of a session, by name.
std::map<std::string, std::vector<float>> state_of(Session& s) {
  std::map<std::string, std::vector<float>> m;
  for (const std::string& n : s.state_names()) m[n] = s.read(n);
  return m;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_bitwise_equal_states(DataParallelTrainer& dp, Session& ref, const char* what) {
  std::map<std::string, std::vector<float>> want = state_of(ref);
  ASSERT_GT(want.size(), kParams.size()) << "the optimizer's state is missing from the reference";
  for (auto& [name, v] : want) {
    for (int r = 0; r < kReplicas; ++r)
      EXPECT_TRUE(bitwise_equal(dp.read(name, r), v)) << what << ": '" << name << "' of replica " << r;
  }
}

void exact_against_two_branch(Backend backend) {
  const Optimizer opt = AdamW{.lr = 0.05, .weight_decay = 0.01};
  Graph ref_g = two_branch_graph();
  Session ref = compile(ref_g, options(backend, opt));
  Graph g = plain_graph(kShard);
  DataParallelTrainer dp(g, dp_options(backend, opt));
  ASSERT_EQ(dp.replicas(), kReplicas);
  ASSERT_EQ(dp.global_batch(), kBatch);
  for (int s = 0; s < kSteps; ++s) {
    feed_step(ref, dp, s);
    float loss = dp.step();
    float ref_loss = ref.read_scalar("loss");
    EXPECT_EQ(std::memcmp(&loss, &ref_loss, sizeof loss), 0)
        << "step " << s << ": loss " << loss << " vs " << ref_loss;
  }
  EXPECT_EQ(dp.step_count(), kSteps);
  expect_bitwise_equal_states(dp, ref, "against the two-branch reference");
  // The gradient sessions run on the weights the update sessions hold.
  for (int r = 0; r < kReplicas; ++r)
    for (const std::string& p : kParams)
      EXPECT_TRUE(bitwise_equal(dp.gradient_session(r).read(p), dp.update_session(r).read(p)))
          << p << " replica " << r;
}

// Max |a - b| over every parameter after kSteps of SGD with momentum, data-parallel against one device with
// the whole batch.
double max_diff_against_full_batch(Backend backend) {
  const Optimizer opt = SGD{.lr = 0.2, .momentum = 0.9};
  Graph full_g = plain_graph(kBatch);
  Session full = compile(full_g, options(backend, opt));
  Graph g = plain_graph(kShard);
  DataParallelTrainer dp(g, dp_options(backend, opt));
  for (int s = 0; s < kSteps; ++s) {
    Data d = batch_of(s);
    full.set_input("x", d.x);
    full.set_input("labels", d.labels);
    full.step();
    dp.set_input("x", d.x);
    dp.set_input("labels", d.labels);
    float loss = dp.step();
    EXPECT_NEAR(loss, full.read_scalar("loss"), 1e-6) << "step " << s;
  }
  double worst = 0, moved = 0;
  for (const std::string& p : kParams) {
    std::vector<float> a = dp.read(p, 0), b = full.read(p), b0 = dp.read(p, 1);
    EXPECT_TRUE(bitwise_equal(a, b0)) << p << ": the replicas differ";
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    for (size_t i = 0; i < b.size(); ++i) moved = std::max(moved, double(std::fabs(b[i])));
  }
  EXPECT_GT(moved, 0.1);  // the weights are of order 1: the tolerance is relative to that
  return worst;
}

// Measured (printed by the tests): 1.5e-8 on the CPU executor, 3.0e-8 on lavapipe, i.e. under one f32 ulp at
// the weights' magnitude (~0.5: 6e-8); the bound is 5 such ulps, room for another summation order of the
// full-batch GEMM on other devices. (A 1e-7 relative error in the reduction stays under it: the bitwise tests
// catch that.)
constexpr double kFullBatchTolerance = 3e-7;

// "Ranks" on threads of this process: an independent ProcessGroup (a barrier and shared slots), so that the
// trainer's cross-process path (buckets, gather to rank 0 in rank order, broadcast) runs without MPI.
struct ThreadHub {
  explicit ThreadHub(int n) : size(n), sync(n), slots(size_t(n)), ints(size_t(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<std::vector<float>> slots;
  std::vector<float> root;
  std::vector<int64_t> ints;
};

class ThreadGroup final : public ProcessGroup {
 public:
  ThreadGroup(ThreadHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_.size; }
  std::vector<float> gather_to_root(std::span<const float> send) override {
    hub_.slots[size_t(rank_)].assign(send.begin(), send.end());
    hub_.sync.arrive_and_wait();
    std::vector<float> all;
    if (rank_ == 0)
      for (const std::vector<float>& v : hub_.slots) all.insert(all.end(), v.begin(), v.end());
    hub_.sync.arrive_and_wait();
    return all;
  }
  void broadcast_from_root(std::span<float> values) override {
    if (rank_ == 0) hub_.root.assign(values.begin(), values.end());
    hub_.sync.arrive_and_wait();
    if (rank_ != 0) std::copy(hub_.root.begin(), hub_.root.end(), values.begin());
    hub_.sync.arrive_and_wait();
  }
  std::vector<int64_t> all_gather(int64_t value) override {
    hub_.ints[size_t(rank_)] = value;
    hub_.sync.arrive_and_wait();
    std::vector<int64_t> all = hub_.ints;
    hub_.sync.arrive_and_wait();
    return all;
  }

 private:
  ThreadHub& hub_;
  int rank_;
};

}  // namespace

TEST(DataParallel, ThreadRanksEqualLocalReplicas) {
  // 2 ranks x 2 replicas (global replicas 0, 1 on rank 0 and 2, 3 on rank 1) against one trainer with 4 local
  // replicas: the same shards and the same reduction order, so bitwise the same weights and moments.
  constexpr int kRanks = 2, kPerRank = 2, kAll = kRanks * kPerRank;
  const Optimizer opt = Adam{.lr = 0.02};
  auto batch = [](int s) {
    std::mt19937 rng(7 + s);
    std::uniform_real_distribution<float> u(-1, 1);
    Data d;
    for (int64_t i = 0; i < kAll * kShard * kIn; ++i) d.x.push_back(u(rng));
    for (int64_t i = 0; i < kAll * kShard; ++i) d.labels.push_back(int32_t(rng() % kClasses));
    return d;
  };
  Graph g = plain_graph(kShard);
  DataParallelOptions lo = dp_options(Backend::Cpu, opt);
  lo.devices.assign(kAll, DeviceOptions{});
  DataParallelTrainer local(g, lo);
  std::vector<float> local_losses;
  for (int s = 0; s < kSteps; ++s) {
    Data d = batch(s);
    local.set_input("x", d.x);
    local.set_input("labels", d.labels);
    local_losses.push_back(local.step());
  }

  ThreadHub hub(kRanks);
  std::vector<std::map<std::string, std::vector<float>>> got(kRanks);
  std::vector<std::vector<float>> losses(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        ThreadGroup group(hub, rank);
        Graph rg = plain_graph(kShard);
        DataParallelOptions o = dp_options(Backend::Cpu, opt);
        o.devices.assign(kPerRank, DeviceOptions{});
        o.group = &group;
        o.bucket_values = 5;  // many buckets, the last one partial
        DataParallelTrainer dp(rg, o);
        if (dp.replicas() != kAll || dp.first_replica() != rank * kPerRank) throw Error("replica numbering");
        for (int s = 0; s < kSteps; ++s) {
          Data d = batch(s);
          dp.set_input("x", d.x);
          dp.set_input("labels", d.labels);
          losses[size_t(rank)].push_back(dp.step());
        }
        for (int r = 0; r < kPerRank; ++r)
          for (const std::string& n : dp.update_session(r).state_names()) {
            std::vector<float> v = dp.read(n, r);
            auto [it, fresh] = got[size_t(rank)].emplace(n, v);
            if (!fresh && !bitwise_equal(it->second, v)) throw Error("replicas of one rank differ in " + n);
          }
      } catch (const std::exception& e) {
        errors[size_t(rank)] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(errors[size_t(rank)], "") << "rank " << rank;
    EXPECT_EQ(losses[size_t(rank)], local_losses) << "rank " << rank;
    ASSERT_EQ(got[size_t(rank)].size(), local.update_session(0).state_names().size());
    for (auto& [n, v] : got[size_t(rank)])
      EXPECT_TRUE(bitwise_equal(v, local.read(n))) << n << " on rank " << rank;
  }
}

TEST(DataParallel, ReductionIsTheDocumentedOrderedSum) {
  // Three replicas: in f32, 1e8 + 1 - 1e8 would give 0; the documented sum accumulates in double in replica
  // order, then divides by the replica count (Mean) and rounds once.
  std::vector<float> buffers = {1e8f, 2.0f, 1.0f, 0.5f, -1e8f, 0.25f};
  std::vector<float> mean = reduce_replica_gradients(buffers, 3, 2, GradientScale::Mean);
  std::vector<float> sum = reduce_replica_gradients(buffers, 3, 2, GradientScale::Sum);
  EXPECT_EQ(mean, (std::vector<float>{float(1.0 / 3.0), float(2.75 / 3.0)}));
  EXPECT_EQ(sum, (std::vector<float>{1.0f, 2.75f}));
  EXPECT_NE(
      test::error_of([&] { reduce_replica_gradients(buffers, 4, 2, GradientScale::Mean); }).find("6 values"),
      std::string::npos);
}

TEST(DataParallel, ReductionOfModelSizedBuffersIsTheOrderedSumOnEveryElement) {
  // Sizes that take the chunked, threaded path (more than one 2048-value chunk, more than 2^20 values per
  // thread, a ragged last chunk): every element must be the documented formula, computed here element by
  // element.
  const size_t count = (size_t(5) << 20) + 1001;
  const int replicas = 3;
  std::vector<float> buffers(size_t(replicas) * count);
  uint64_t x = 88172645463325252ull;
  for (float& v : buffers) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = float(int64_t(x % 2000001) - 1000000) * (x % 3 == 0 ? 1e-3f : 1e3f);
  }
  for (GradientScale scale : {GradientScale::Mean, GradientScale::Sum}) {
    const std::vector<float> got = reduce_replica_gradients(buffers, replicas, count, scale);
    ASSERT_EQ(got.size(), count);
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      double s = 0.0;
      for (int r = 0; r < replicas; ++r) s += double(buffers[size_t(r) * count + i]);
      const float want = float(scale == GradientScale::Mean ? s / replicas : s);
      if (std::memcmp(&want, &got[i], 4) != 0 && ++bad <= 3)
        ADD_FAILURE() << "element " << i << ": " << got[i] << ", the formula gives " << want;
    }
    EXPECT_EQ(bad, 0u);
  }
}

TEST(DataParallel, TwoReplicasEqualTwoBranchReferenceBitwiseCpu) {
  exact_against_two_branch(Backend::Cpu);
}
TEST(DataParallel, TwoReplicasEqualTwoBranchReferenceBitwiseVulkan) {
  exact_against_two_branch(Backend::Vulkan);
}

TEST(DataParallel, TwoReplicasMatchFullBatchCpu) {
  double d = max_diff_against_full_batch(Backend::Cpu);
  std::printf("CPU executor: max |data-parallel - full batch| = %.3g\n", d);
  EXPECT_LE(d, kFullBatchTolerance);
}

TEST(DataParallel, TwoReplicasMatchFullBatchVulkan) {
  double d = max_diff_against_full_batch(Backend::Vulkan);
  std::printf("Vulkan: max |data-parallel - full batch| = %.3g\n", d);
  EXPECT_LE(d, kFullBatchTolerance);
}

TEST(DataParallel, ThreadsOrNotTheSameBits) {
  // The replicas' passes on one thread each, or one after the other: the reduction order is fixed, so the
  // weights and moments are bitwise the same (Vulkan, validation on, two logical devices working at once).
  const Optimizer opt = Adam{.lr = 0.05};
  std::map<std::string, std::vector<float>> results[2];
  for (int threads = 0; threads < 2; ++threads) {
    Graph g = plain_graph(kShard);
    DataParallelOptions o = dp_options(Backend::Vulkan, opt);
    o.threads = threads == 1;
    DataParallelTrainer dp(g, o);
    for (int s = 0; s < 2; ++s) {
      Data d = batch_of(s);
      dp.set_input("x", d.x);
      dp.set_input("labels", d.labels);
      dp.step();
    }
    for (const std::string& n : dp.update_session(0).state_names()) results[threads][n] = dp.read(n, 1);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (auto& [n, v] : results[0]) EXPECT_TRUE(bitwise_equal(v, results[1][n])) << n;
}

TEST(DataParallel, ReplicatedInputGoesWholeToEveryReplica) {
  // A per-class weight vector fed whole to every replica (not split), against the two-branch reference whose
  // branches share it: bitwise, as in the test above.
  auto weighted_loss = [](const Params& p, Tensor x, Tensor labels, Tensor w) {
    Tensor logits = linear(relu(linear(x, p.w1, p.b1)), p.w2, p.b2) * w;
    return cross_entropy(logits, labels);
  };
  const Optimizer opt = SGD{.lr = 0.3, .momentum = 0.5};
  Graph ref_g;
  {
    Params p = make_params(ref_g);
    Tensor w = ref_g.input("w", {kClasses});
    Tensor l0 = weighted_loss(p, ref_g.input("x0", {kShard, kIn}), ref_g.input("labels0", {kShard}, DType::I32), w);
    Tensor l1 = weighted_loss(p, ref_g.input("x1", {kShard, kIn}), ref_g.input("labels1", {kShard}, DType::I32), w);
    ref_g.output("loss", (l0 + l1) * 0.5);
  }
  Session ref = compile(ref_g, options(Backend::Cpu, opt));
  Graph g;
  {
    Params p = make_params(g);
    Tensor w = g.input("w", {kClasses});
    g.output("loss", weighted_loss(p, g.input("x", {kShard, kIn}), g.input("labels", {kShard}, DType::I32), w));
  }
  DataParallelOptions o = dp_options(Backend::Cpu, opt);
  o.replicated_inputs = {"w"};
  DataParallelTrainer dp(g, o);
  const std::vector<float> w = {0.5f, 2.0f, 1.5f};
  EXPECT_NE(test::error_of([&] { dp.set_input("w", std::vector<float>(6)); }).find("(replicated)"),
            std::string::npos);
  for (int s = 0; s < kSteps; ++s) {
    Data d = batch_of(s);
    const size_t hx = size_t(kShard * kIn), hl = size_t(kShard);
    ref.set_input("w", w);
    ref.set_input("x0", std::span<const float>(d.x.data(), hx));
    ref.set_input("x1", std::span<const float>(d.x.data() + hx, hx));
    ref.set_input("labels0", std::span<const int32_t>(d.labels.data(), hl));
    ref.set_input("labels1", std::span<const int32_t>(d.labels.data() + hl, hl));
    ref.step();
    dp.set_input("w", w);
    dp.set_input("x", d.x);
    dp.set_input("labels", d.labels);
    dp.step();
  }
  expect_bitwise_equal_states(dp, ref, "with a replicated input");
}

TEST(DataParallel, ReplicasHaveTheirOwnLogicalDevice) {
  // DeviceOptions that differ only in `instance` open separate VkDevices on one physical device; equal ones
  // share one.
  DeviceOptions d0 = test::device_options(), d1 = d0;
  d1.instance = 1;
  vk::Context& c0 = *detail::shared_context(d0);
  vk::Context& c1 = *detail::shared_context(d1);
  EXPECT_NE(&c0, &c1);
  EXPECT_NE(c0.device(), c1.device());
  EXPECT_EQ(c0.info().index,
            c1.info().index);  // the same physical device (each Context has its own VkInstance)
  EXPECT_EQ(c0.info().name, c1.info().name);
  EXPECT_EQ(detail::shared_context(d0).get(), &c0);

  // The trainer opens instance r for replica r: both replicas name lavapipe, and after the trainer exists a
  // session on instance 3 (replica 3) opens its device, one on instance 1 (replica 1) finds it open already.
  Graph g = plain_graph(kShard);
  DataParallelOptions o = dp_options(Backend::Vulkan, SGD{});
  o.devices.assign(4, test::device_options());
  DataParallelTrainer dp(g, o);
  CompileOptions c = options(Backend::Vulkan, SGD{});
  c.mode = Mode::Infer;
  auto device_ms = [&](int instance) {
    c.device.instance = instance;
    Graph gi = plain_graph(kShard);
    return compile(gi, c).compile_report().device_ms;
  };
  const double fresh = device_ms(9), opened = device_ms(3);
  std::printf("opening a device: %.3f ms; finding replica 3's: %.3f ms\n", fresh, opened);
  EXPECT_LT(opened * 10, fresh);
}

TEST(DataParallel, CheckpointLoadsIntoASession) {
  const std::string dir = test::make_temp_dir("data_parallel_ckpt");
  const std::string path = dir + "/dp.safetensors";
  const Optimizer opt = Adam{.lr = 0.01};
  Graph g = plain_graph(kShard);
  DataParallelTrainer dp(g, dp_options(Backend::Cpu, opt));
  Data d = batch_of(0);
  dp.set_input("x", d.x);
  dp.set_input("labels", d.labels);
  dp.step();
  dp.step();
  dp.save_checkpoint(path);
  Graph sg = plain_graph(kBatch);
  Session s = compile(sg, options(Backend::Cpu, opt));
  s.load_checkpoint(path);  // every parameter and optimizer state by name, or it throws
  EXPECT_EQ(s.step_count(), 2);
  for (const std::string& n : s.state_names()) EXPECT_TRUE(bitwise_equal(s.read(n), dp.read(n))) << n;
  // And back into a fresh trainer.
  Graph g2 = plain_graph(kShard);
  DataParallelTrainer dp2(g2, dp_options(Backend::Cpu, opt));
  dp2.load_checkpoint(path);
  EXPECT_EQ(dp2.step_count(), 2);
  for (int r = 0; r < kReplicas; ++r)
    for (const std::string& p : kParams) {
      EXPECT_TRUE(bitwise_equal(dp2.read(p, r), dp.read(p))) << p;
      EXPECT_TRUE(bitwise_equal(dp2.gradient_session(r).read(p), dp.read(p))) << p;
    }
  std::filesystem::remove_all(dir);
}

// Weights written after construction (a pretrained model: `mgn finetune`) reach both sessions of every
// replica: 3 AdamW steps from them are bitwise those of the two-branch reference given the same weights.
TEST(DataParallel, WrittenWeightsReachEveryReplica) {
  const Optimizer opt = AdamW{.lr = 0.05, .weight_decay = 0.01};
  Graph ref_g = two_branch_graph();
  Session ref = compile(ref_g, options(Backend::Cpu, opt));
  Graph g = plain_graph(kShard);
  DataParallelTrainer dp(g, dp_options(Backend::Cpu, opt));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-0.8f, 0.8f);
  for (const std::string& p : kParams) {
    std::vector<float> v(ref.read(p).size());
    for (float& x : v) x = u(rng);
    ASSERT_FALSE(bitwise_equal(v, dp.read(p))) << p;  // differs from the initialization
    dp.write_parameter(p, v);
    ref.write_parameter(p, v);
  }
  for (int r = 0; r < kReplicas; ++r)
    for (const std::string& p : kParams) {
      EXPECT_TRUE(bitwise_equal(dp.update_session(r).read(p), ref.read(p))) << p << " replica " << r;
      EXPECT_TRUE(bitwise_equal(dp.gradient_session(r).read(p), ref.read(p))) << p << " replica " << r;
    }
  for (int s = 0; s < kSteps; ++s) {
    feed_step(ref, dp, s);
    dp.step();
  }
  expect_bitwise_equal_states(dp, ref, "from written weights, against the two-branch reference");
  // A wrong size or an unknown name is the session's clear error.
  std::string e = test::error_of([&] { dp.write_parameter("fc1.bias", std::vector<float>(3)); });
  EXPECT_NE(e.find("fc1.bias"), std::string::npos) << e;
  e = test::error_of([&] { dp.write_parameter("fc9.weight", std::vector<float>(3)); });
  EXPECT_NE(e.find("fc9.weight"), std::string::npos) << e;
}

TEST(DataParallel, BadInputIsAClearError) {
  Graph g = plain_graph(kShard);
  DataParallelTrainer dp(g, dp_options(Backend::Cpu, SGD{}));
  // A batch the replicas cannot share evenly.
  std::vector<float> x(size_t((kBatch + 1) * kIn));
  std::string e = test::error_of([&] { dp.set_input("x", x); });
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("2 replicas"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(kBatch * kIn)), std::string::npos) << e;
  e = test::error_of([&] { dp.set_input("nope", x); });
  EXPECT_NE(e.find("no input named 'nope'"), std::string::npos) << e;
  e = test::error_of([&] { dp.step(); });
  EXPECT_NE(e.find("never set"), std::string::npos) << e;

  Graph g1 = plain_graph(kShard);
  e = test::error_of([&] { DataParallelTrainer none(g1, {.compile = options(Backend::Cpu, SGD{})}); });
  EXPECT_NE(e.find("no devices"), std::string::npos) << e;

  // A forward pass that assigns state (running statistics) is refused.
  Graph g2 = plain_graph(kShard);
  Tensor running = g2.state("running", {kIn});
  g2.output("loss2", g2.get("x"));
  assign(running, mean(g2.get("x"), {0}));
  e = test::error_of([&] { DataParallelTrainer bad(g2, dp_options(Backend::Cpu, SGD{})); });
  EXPECT_NE(e.find("'running'"), std::string::npos) << e;

  // Replicas on different kinds of device could round the update differently: refused.
  Graph g4 = plain_graph(kShard);
  // Auto: replica 1 names no device, so it falls back to the CPU executor while replica 0 runs on lavapipe.
  DataParallelOptions mixed = dp_options(Backend::Auto, SGD{});
  mixed.devices[1].device = "no such device";
  e = test::error_of([&] { DataParallelTrainer bad(g4, mixed); });
  EXPECT_NE(e.find("replica 1 on cpu; replicas must run on the same kind of device"), std::string::npos) << e;

  Graph g3 = plain_graph(kShard);
  DataParallelOptions o = dp_options(Backend::Cpu, SGD{});
  o.split_inputs = {"x"};
  e = test::error_of([&] { DataParallelTrainer bad(g3, o); });
  EXPECT_NE(e.find("'labels' is neither split nor replicated"), std::string::npos) << e;
}
