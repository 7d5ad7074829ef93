// MpiGroup: MPI_Gather to rank 0 and MPI_Bcast from it, the fixed-order collectives of the data-parallel
// trainer. MPI_Allreduce is not used: the order in which it adds the ranks' values is the implementation's to
// choose, so its sum could change with the rank count, the algorithm or the message size; the trainer reduces
// on rank 0 in rank order instead (mgn/data_parallel.h).
#include "mpi_group.h"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace mgn::tool {

namespace {

constexpr size_t kChunk = size_t(1) << 28;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("MPI: ") + what + " failed: " + std::string(text, size_t(len)));
}

}  // namespace

MpiGroup::MpiGroup() {
  int initialized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    check(MPI_Init(nullptr, nullptr), "MPI_Init");
    owns_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank (host)");
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
  host_.assign(name, size_t(len));
}

MpiGroup::~MpiGroup() {
  if (owns_) MPI_Finalize();
}

std::vector<float> MpiGroup::gather_to_root(std::span<const float> send) {
  const size_t n = send.size();
  std::vector<float> all(rank_ == 0 ? n * size_t(size_) : 0);
  std::vector<float> chunk_all(rank_ == 0 ? std::min(n, kChunk) * size_t(size_) : 0);
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t len = std::min(kChunk, n - off);
    check(MPI_Gather(send.data() + off, int(len), MPI_FLOAT, rank_ == 0 ? chunk_all.data() : nullptr,
                     int(len), MPI_FLOAT, 0, MPI_COMM_WORLD),
          "MPI_Gather");
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r)
        std::copy_n(chunk_all.data() + size_t(r) * len, len, all.data() + size_t(r) * n + off);
  }
  return all;
}

void MpiGroup::broadcast_from_root(std::span<float> values) {
  for (size_t off = 0; off < values.size(); off += kChunk)
    check(MPI_Bcast(values.data() + off, int(std::min(kChunk, values.size() - off)), MPI_FLOAT, 0,
                    MPI_COMM_WORLD),
          "MPI_Bcast");
}

std::vector<int64_t> MpiGroup::all_gather(int64_t value) {
  std::vector<int64_t> all(static_cast<size_t>(size_));
  check(MPI_Allgather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  return all;
}

void MpiGroup::barrier() {
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void MpiGroup::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

}  // namespace mgn::tool
