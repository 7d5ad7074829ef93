// The mgn tool's ProcessGroup over MPI (MPI_COMM_WORLD), for `--data-parallel mpi` (train-fashion-mnist,
// finetune).
// Built only where CMake found MPI (MGN_HAVE_MPI); the library itself knows nothing of MPI.
#pragma once

#include <string>

#include "mgn/data_parallel.h"

namespace mgn::tool {

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup();            // MPI_Init unless MPI is initialized already
  ~MpiGroup() override;  // MPI_Finalize when this object initialized it
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks on this host
  const std::string& host() const { return host_; }

  // Rank 0 gathers with MPI_Gather (rank order, by definition of MPI_Gather), broadcasts with MPI_Bcast; both
  // in chunks of at most 2^28 values (MPI counts are int).
  std::vector<float> gather_to_root(std::span<const float> send) override;
  void broadcast_from_root(std::span<float> values) override;
  std::vector<int64_t> all_gather(int64_t value) override;
  void barrier();
  // Ends every rank (a rank that failed must not leave the others waiting in a collective).
  [[noreturn]] void abort(int code);

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::string host_;
  bool owns_ = false;
};

}  // namespace mgn::tool
