// CPU reference: batched matmul with broadcast batch axes and transpose flags (double accumulation).
#include "backend/cpu/kernels.h"

namespace mgn::cpu {

void k_MatMul(const ir::Node& n, const Inputs& in, Buffer& out) {
  const Shape &as = in[0]->shape, &bs = in[1]->shape;
  bool ta = n.attrs.i("transpose_a") != 0, tb = n.attrs.i("transpose_b") != 0;
  int64_t M = out.shape[out.shape.size() - 2], N = out.shape.back();
  int64_t K = ta ? as[as.size() - 2] : as.back();
  Shape batch(out.shape.begin(), out.shape.end() - 2);
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  // Batch index maps: use a shape of batch dims with unit matrix dims so BroadcastIndex works per matrix.
  BroadcastIndex ia(ab, batch), ib(bb, batch);
  int64_t nb = numel(batch);
  const double* A = in[0]->v.data();
  const double* B = in[1]->v.data();
  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t b = 0; b < nb; ++b) {
    const double* a = A + ia(b) * M * K;
    const double* bm = B + ib(b) * K * N;
    double* c = out.v.data() + b * M * N;
    if (tb && !ta) {  // rows of a against rows of b: both contiguous over k
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += a[i * K + k] * bm[j * K + k];
          c[i * N + j] = acc;
        }
      continue;
    }
    for (int64_t i = 0; i < M; ++i) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        double av = ta ? a[k * M + i] : a[i * K + k];
        if (tb) {
          for (int64_t j = 0; j < N; ++j) row[size_t(j)] += av * bm[j * K + k];
        } else {
          const double* br = bm + k * N;
          for (int64_t j = 0; j < N; ++j) row[size_t(j)] += av * br[j];
        }
      }
      std::copy(row.begin(), row.end(), c + i * N);
    }
  }
}

}  // namespace mgn::cpu
