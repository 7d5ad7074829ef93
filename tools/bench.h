// `mgn bench`: whole-model phase timings (compile, inference, minimal, F+L+B, training step) and memory, and
// microbenchmarks (attention, conv2d), with the protocol of docs/benchmarks.md and the tensors of one step
// for the correctness gates of bench/compare.py.
#pragma once

// argv[1] is "bench"; the workload and flags follow. Returns the process exit status; throws mgn::Error
// for bad arguments.
int bench_command(int argc, char** argv);
