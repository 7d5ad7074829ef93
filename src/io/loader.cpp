// The batch loader: a seeded per-epoch permutation (splitmix64 + Fisher-Yates, identical on every
// platform, unlike std::shuffle) and batches copied out in that order.
#include <algorithm>
#include <numeric>

#include "mgn/data.h"

namespace mgn {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

BatchLoader::BatchLoader(const Dataset& data, const LoaderOptions& opt) : data_(data), opt_(opt) {
  if (opt_.batch <= 0) throw Error("BatchLoader: batch size must be positive, got " + std::to_string(opt_.batch));
  if (data_.count <= 0) throw Error("BatchLoader: the dataset is empty");
  if (int64_t(data_.features.size()) != data_.count * data_.sample_size() || int64_t(data_.labels.size()) != data_.count)
    throw Error("BatchLoader: the dataset's features/labels do not match its count and sample shape");
  if (opt_.drop_last && data_.count < opt_.batch)
    throw Error("BatchLoader: " + std::to_string(data_.count) + " samples make no full batch of " +
                std::to_string(opt_.batch) + " (use drop_last = false)");
  start_epoch(0);
}

void BatchLoader::start_epoch(int64_t epoch) {
  order_.resize(size_t(data_.count));
  std::iota(order_.begin(), order_.end(), int64_t(0));
  if (opt_.shuffle) {
    uint64_t s = opt_.seed * 0x100000001B3ull + uint64_t(epoch) + 1;
    for (int64_t i = data_.count - 1; i > 0; --i) {
      int64_t j = int64_t(splitmix64(s) % uint64_t(i + 1));
      std::swap(order_[size_t(i)], order_[size_t(j)]);
    }
  }
  pos_ = 0;
}

int64_t BatchLoader::batches_per_epoch() const {
  return opt_.drop_last ? data_.count / opt_.batch : (data_.count + opt_.batch - 1) / opt_.batch;
}

bool BatchLoader::next(Batch& out) {
  int64_t left = data_.count - pos_;
  if (left <= 0 || (opt_.drop_last && left < opt_.batch)) return false;
  int64_t n = std::min(left, opt_.batch), ss = data_.sample_size();
  out.size = n;
  out.features.assign(size_t(opt_.batch * ss), 0.0f);
  out.labels.assign(size_t(opt_.batch), 0);
  out.indices.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t k = order_[size_t(pos_ + i)];
    out.indices[size_t(i)] = k;
    std::copy_n(data_.features.begin() + k * ss, ss, out.features.begin() + i * ss);
    out.labels[size_t(i)] = data_.labels[size_t(k)];
  }
  pos_ += n;
  return true;
}

}  // namespace mgn
