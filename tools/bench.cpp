// `mgn bench`: the benchmark harness of docs/benchmarks.md. Whole models (bench_model.cpp: compile,
// inference, minimal, F+L+B and training-step phases with memory figures and the gate tensors of one step)
// and microbenchmarks (bench_micro.cpp: attention and conv2d against the same inputs as PyTorch).
#include "bench.h"

#include "bench_common.h"

int bench_command(int argc, char** argv) {
  using namespace mgn;
  bench::Args args = bench::parse_args(argc, argv);
  if (bench::is_model_workload(args.workload)) return bench::run_model_bench(args);
  if (bench::is_micro_workload(args.workload)) return bench::run_micro_bench(args);
  throw Error(
      "bench: unknown workload '" + args.workload +
      "' (expected fashion-cnn, fashion-mlp, smollm2-135m, llama-tiny, llama --config FILE, attention or "
      "conv)");
}
