// Datasets: the IDX format (MNIST / Fashion-MNIST, optionally gzip-compressed) and a seeded, shuffling
// batch loader. Every malformed, truncated or missing file is an mgn::Error naming the file and the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mgn/types.h"

namespace mgn {

// An IDX array of unsigned bytes (type code 0x08): its dimensions and row-major values.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads a raw or gzip-compressed IDX file (compression is detected from the content, not the name).
IdxArray read_idx(const std::string& path);
// The same from the decompressed bytes (`path` names them in errors): for fuzzing and tests.
IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& path);

// A labelled dataset: `count` samples of `sample_shape` f32 features each, with i32 labels.
struct Dataset {
  int64_t count = 0;
  Shape sample_shape;
  std::vector<float> features;  // count * numel(sample_shape)
  std::vector<int32_t> labels;  // count
  int64_t sample_size() const { return numel(sample_shape); }
};

enum class Split : uint8_t { Train, Test };

// Debian's folder of the dataset-fashion-mnist package (the tools honour MGN_FASHION_MNIST_DIR through
// mgn::read_environment).
std::string fashion_mnist_dir();
// Images scaled to [0, 1], sample shape [1, 28, 28]; `limit` > 0 keeps the first `limit` samples.
Dataset load_fashion_mnist(const std::string& dir, Split split, int64_t limit = 0);
extern const char* const kFashionMnistClasses[10];

struct Batch {
  int64_t size = 0;  // real samples; a padded last batch has size < the loader's batch size
  std::vector<float> features;  // batch * sample_size (padded with zeros)
  std::vector<int32_t> labels;  // batch (padded with 0)
  std::vector<int64_t> indices;  // dataset index of each real sample
};

struct LoaderOptions {
  int64_t batch = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = true;  // false: the last batch is padded to full size (Batch::size tells the real count)
};

// Iterates over a dataset in batches; epoch e uses a permutation determined by (seed, e) alone.
class BatchLoader {
 public:
  BatchLoader(const Dataset& data, const LoaderOptions& opt);
  void start_epoch(int64_t epoch);
  bool next(Batch& out);  // false at the end of the epoch
  int64_t batches_per_epoch() const;
  const Dataset& dataset() const { return data_; }
  const LoaderOptions& options() const { return opt_; }

 private:
  const Dataset& data_;
  LoaderOptions opt_;
  std::vector<int64_t> order_;
  int64_t pos_ = 0;
};

}  // namespace mgn
