// The data-parallel flags the training commands share (`mgn train-fashion-mnist`, `mgn finetune`):
// --replicas,
// --data-parallel none|mpi, --devices; their checks (before anything is loaded or compiled), and the MPI rank
// wrapper (MPI opened on demand, a failing rank ends every rank). docs/multi-device.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "mgn/data_parallel.h"

namespace mgn::tool {

struct DataParallelFlags {
  int64_t replicas = 1;       // replicas in this process
  std::string mode = "none";  // none | mpi
  std::string devices;        // comma-separated, one per replica (mpi: per replica of each rank on a host)
  bool enabled() const { return replicas > 1 || mode != "none" || !devices.empty(); }
};

void add_data_parallel_flags(CLI::App& app, DataParallelFlags& flags);

// Where this process stands: without MPI one process (group null, rank 0 of 1).
struct DataParallelPlace {
  ProcessGroup* group = nullptr;
  int rank = 0, ranks = 1, local_rank = 0;
  std::string host = "this host";
  bool root() const { return rank == 0; }
};

// The replicas over all processes (--replicas x ranks).
int64_t global_replicas(const DataParallelFlags& f, const DataParallelPlace& p);
// Throws UsageError unless `batch` (the value of `flag`) splits into equal shards over every replica.
void check_batch_split(const DataParallelFlags& f, const DataParallelPlace& p, int64_t batch,
                       const std::string& flag = "--batch");
// One DeviceOptions per replica of this process: `base` (--device) for each, or the --devices entries of this
// rank (without MPI: exactly --replicas entries; with MPI: entries local_rank x replicas onwards). Throws
// UsageError for a list of the wrong length, naming the rank and host under MPI.
std::vector<DeviceOptions> replica_devices(const DataParallelFlags& f, const DataParallelPlace& p,
                                           const DeviceOptions& base);

// Under MPI: throws UsageError unless every rank has the same value of each (value, what) pair, naming the
// first that differs with rank 0's and the other rank's values (ranks given different arguments or data would
// train different batches, or one would wait for the others forever). Collective; nothing without MPI.
void check_ranks_agree(const DataParallelPlace& p,
                       const std::vector<std::pair<int64_t, std::string>>& values);

// Runs body in this process (--data-parallel none) or as one rank of mpirun (mpi: MPI opened here, a barrier
// at the end; an exception prints "mgn COMMAND: rank R of N (HOST): error: ..." and aborts every rank with
// exit code 2 for a usage error, 1 otherwise). Throws UsageError for mpi in a build without MPI, before
// anything else.
int run_data_parallel(const DataParallelFlags& f, const std::string& command,
                      const std::function<int(const DataParallelPlace&)>& body);

}  // namespace mgn::tool
