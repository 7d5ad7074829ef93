// Trains a two-layer classifier on XOR with the installed meganeura library, then checks the predictions of
// a fresh inference session loaded from the saved checkpoint. Exit status 0 when all four are right.
#include <cstdio>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/nn.h"
#include "mgn/session.h"

namespace {

mgn::Graph build(bool train) {
  mgn::Graph g;
  mgn::Tensor x = g.input("x", {4, 2});
  mgn::Tensor h = mgn::tanh(mgn::nn::linear(g, "fc1", x, 8));
  mgn::Tensor logits = mgn::nn::linear(g, "fc2", h, 2);
  g.output("logits", logits);
  if (train) g.output("loss", mgn::cross_entropy(logits, g.input("labels", {4}, mgn::DType::I32)));
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string ckpt = argc > 1 ? argv[1] : "xor.safetensors";
  const std::vector<float> x = {0, 0, 0, 1, 1, 0, 1, 1};
  const std::vector<int32_t> labels = {0, 1, 1, 0};
  try {
    mgn::Graph g = build(true);
    mgn::Session s = mgn::compile(g, {.mode = mgn::Mode::Train, .optimizer = mgn::AdamW{.lr = 0.05}});
    s.set_input("x", x);
    s.set_input("labels", labels);
    for (int i = 0; i < 300; ++i) s.step();
    s.save_checkpoint(ckpt);

    mgn::Graph gi = build(false);
    mgn::Session infer = mgn::compile(gi, {.mode = mgn::Mode::Infer});
    infer.load_checkpoint(ckpt);
    infer.set_input("x", x);
    infer.run();
    std::vector<float> z = infer.read("logits");
    int right = 0;
    for (int i = 0; i < 4; ++i)
      right += (z[size_t(2 * i + 1)] > z[size_t(2 * i)]) == (labels[size_t(i)] == 1);
    std::printf("backend %s: loss %.4f after 300 steps, %d of 4 right after reloading %s\n", s.backend(),
                s.read_scalar("loss"), right, ckpt.c_str());
    return right == 4 ? 0 : 1;
  } catch (const mgn::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
