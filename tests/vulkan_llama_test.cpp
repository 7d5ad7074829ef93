// The Llama builder (include/mgn/llama.h) on Vulkan against the CPU reference executor, both in f32, from the
// same random weights (the tiny config, lavapipe in CI): prefill logits, the loss and every parameter
// gradient of one F+L+B (tied and untied lm_head, a padded row), and 32 greedy tokens decoded with the KV
// cache on Vulkan vs the prefill-only path on Vulkan vs the KV cache on the CPU executor.
#include <gtest/gtest.h>

#ifdef MGN_HAVE_VULKAN
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/llama.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

std::vector<double> to_f64(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return test::rel_l2(to_f64(got), to_f64(want));
}

// As llama_test: matrices wider than HF's 0.02 init so that the logits are far from uniform (greedy choices
// with clear leads), norm weights away from one so that a dropped weight would show.
std::map<std::string, std::vector<float>> random_weights(const llama::Config& c, uint64_t seed) {
  std::map<std::string, std::vector<float>> w;
  uint64_t k = seed;
  for (auto& [name, shape] : llama::parameter_shapes(c)) {
    bool norm = shape.size() == 1;
    std::vector<double> r = test::random_normal(size_t(numel(shape)), ++k, norm ? 0.2 : 0.15);
    std::vector<float> f(r.size());
    for (size_t i = 0; i < r.size(); ++i) f[i] = float(norm ? 1.0 + r[i] : r[i]);
    w[name] = f;
  }
  return w;
}

std::vector<int32_t> random_ids(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<double> u = test::random_uniform(n, seed, 0.0, double(vocab));
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = std::min(int32_t(vocab - 1), int32_t(u[i]));
  return ids;
}

Session make(Graph& g, Backend b, const std::map<std::string, std::vector<float>>& w) {
  Session s = compile(g, {.mode = Mode::Infer, .backend = b, .device = test::device_options()});
  if (b == Backend::Vulkan) {
    EXPECT_STRNE(s.backend(), "cpu");
  }
  llama::load_weights(s, w);
  return s;
}

// The loss graph with every parameter's gradient as an output "grad.<name>" (F+L+B, no optimizer).
Graph flb_graph(const llama::Config& c, int64_t batch, int64_t seq) {
  Graph g = llama::loss_graph(c, {.batch = batch, .seq = seq});
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  EXPECT_EQ(grads.params.size(), llama::parameter_shapes(c).size());
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  return g;
}

int32_t argmax(const std::vector<float>& v, size_t begin, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (v[begin + i] > v[begin + best]) best = i;
  return int32_t(best);
}

}  // namespace

TEST(VulkanLlama, PrefillLogitsMatchCpu) {
  llama::Config c = llama::Config::tiny();
  const int64_t B = 2, S = 9;
  auto w = random_weights(c, 11);
  std::vector<int32_t> ids = random_ids(size_t(B * S), c.vocab_size, 3);
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    Graph g = llama::prefill_graph(c, {.batch = B, .seq = S});
    Session s = make(g, i ? Backend::Vulkan : Backend::Cpu, w);
    s.set_input("ids", ids);
    s.run();
    logits[i] = s.read("logits");
  }
  ASSERT_EQ(logits[0].size(), size_t(B * S * c.vocab_size));
  EXPECT_LT(rel(logits[1], logits[0]), 1e-4);
}

class VulkanLlamaFlb : public ::testing::TestWithParam<bool> {};  // param: untied lm_head

TEST_P(VulkanLlamaFlb, LossAndEveryGradientMatchCpu) {
  llama::Config c = llama::Config::tiny();
  c.tie_word_embeddings = !GetParam();
  const int64_t B = 2, S = 7;
  auto w = random_weights(c, 100);
  std::vector<int32_t> ids = random_ids(size_t(B * S), c.vocab_size, 5);
  // Row 1 is padded at its last two positions (label -100 there, HF convention before the shift).
  std::vector<int32_t> hf_labels = ids;
  hf_labels[size_t(S + S - 1)] = hf_labels[size_t(S + S - 2)] = -100;
  const std::vector<int32_t> labels = llama::next_token_labels(hf_labels, B, S);

  Graph gc = flb_graph(c, B, S), gv = flb_graph(c, B, S);
  Session cpu = make(gc, Backend::Cpu, w), gpu = make(gv, Backend::Vulkan, w);
  for (Session* s : {&cpu, &gpu}) {
    s->set_input("ids", ids);
    s->set_input("labels", labels);
    s->run();
  }
  float lc = cpu.read_scalar("loss"), lv = gpu.read_scalar("loss");
  EXPECT_LT(std::fabs(lv - lc) / std::fabs(lc), 1e-4) << lv << " vs " << lc;
  for (auto& [name, shape] : llama::parameter_shapes(c)) {
    std::vector<float> a = cpu.read("grad." + name), g = gpu.read("grad." + name);
    ASSERT_EQ(a.size(), size_t(numel(shape))) << name;
    EXPECT_LT(rel(g, a), 1e-3) << name;
  }
  EXPECT_LT(rel(gpu.read("logits"), cpu.read("logits")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, VulkanLlamaFlb, ::testing::Values(false, true));

TEST(VulkanLlama, GreedyKvCacheDecodeMatchesPrefillOnlyAndCpu) {
  llama::Config c = llama::Config::tiny();
  auto w = random_weights(c, 300);
  const std::vector<int32_t> prompt = {17, 402, 3, 99, 250};
  const int64_t N = 32, P = int64_t(prompt.size()), V = c.vocab_size;

  // KV cache on both backends, through the public generate().
  std::vector<int32_t> kv[2];
  std::vector<float> first_logits[2];
  for (int i = 0; i < 2; ++i) {
    Graph g = llama::decode_graph(c, {.batch = 1, .seq = P + N});
    Session s = make(g, i ? Backend::Vulkan : Backend::Cpu, w);
    kv[i] = llama::generate(s, c, prompt, {.max_new_tokens = N});
    // One step of the decode graph itself: position 0 of a fresh prompt, logits against the other backend.
    s.set_input("ids", std::vector<int32_t>{prompt[0]});
    s.set_input("pos", std::vector<int32_t>{0});
    s.run();
    first_logits[i] = s.read("logits");
  }
  EXPECT_LT(rel(first_logits[1], first_logits[0]), 1e-4);
  ASSERT_EQ(kv[0].size(), size_t(N));
  EXPECT_EQ(kv[1], kv[0]);
  // Not a degenerate continuation (zero logits would give token 0 every time and pass the comparisons).
  EXPECT_GE(std::set<int32_t>(kv[0].begin(), kv[0].end()).size(), 8u) << testing::PrintToString(kv[0]);

  // Prefill only on Vulkan: one graph of length P + N - 1, the whole prefix again for each token; causal
  // attention makes row t independent of the (zero) tokens after it.
  Graph pg = llama::prefill_graph(c, {.batch = 1, .seq = P + N - 1});
  Session pre = make(pg, Backend::Vulkan, w);
  std::vector<int32_t> seq(size_t(P + N - 1), 0), prefill_only;
  std::copy(prompt.begin(), prompt.end(), seq.begin());
  for (int64_t t = 0; t < N; ++t) {
    pre.set_input("ids", seq);
    pre.run();
    int32_t next = argmax(pre.read("logits"), size_t((P - 1 + t) * V), size_t(V));
    prefill_only.push_back(next);
    if (t + 1 < N) seq[size_t(P + t)] = next;
  }
  EXPECT_EQ(prefill_only, kv[0]);
  EXPECT_EQ(kv[1], prefill_only);
}

#endif  // MGN_HAVE_VULKAN
