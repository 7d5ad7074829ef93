#include "data_parallel_cli.h"

#include <cstdio>

#ifdef MGN_HAVE_MPI
#include "mpi_group.h"
#endif

namespace mgn::tool {

void add_data_parallel_flags(CLI::App& app, DataParallelFlags& f) {
  app.add_option(
         "--replicas", f.replicas,
         "data-parallel replicas in this process, each on a logical device of its own; --batch is split "
         "evenly among all replicas (docs/multi-device.md)")
      ->check(at_least(1));
  app.add_option(
         "--data-parallel", f.mode,
         "mpi: train across the processes of mpirun (one replica per rank unless --replicas), gradients "
         "reduced in rank order; none: this process only")
      ->check(CLI::IsMember({"none", "mpi"}));
  app.add_option(
         "--devices", f.devices,
         "comma-separated devices (index or name), one per replica of this process; with mpi, one per "
         "replica of each rank on a host, in local-rank order (default: --device for every replica)")
      ->type_name("LIST");
}

int64_t global_replicas(const DataParallelFlags& f, const DataParallelPlace& p) {
  return f.replicas * p.ranks;
}

void check_batch_split(const DataParallelFlags& f, const DataParallelPlace& p, int64_t batch,
                       const std::string& flag) {
  const int64_t replicas = global_replicas(f, p);
  if (batch % replicas != 0)
    throw UsageError(flag + " " + std::to_string(batch) + " does not split into " + std::to_string(replicas) +
                     " equal shards (" + std::to_string(p.ranks) + " process(es) x " +
                     std::to_string(f.replicas) + " replica(s)): give a multiple of " +
                     std::to_string(replicas));
}

std::vector<DeviceOptions> replica_devices(const DataParallelFlags& f, const DataParallelPlace& p,
                                           const DeviceOptions& base) {
  std::vector<DeviceOptions> devices(size_t(f.replicas), base);
  if (f.devices.empty()) return devices;
  std::vector<std::string> list;
  for (size_t start = 0;;) {
    const size_t comma = f.devices.find(',', start);
    list.push_back(f.devices.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (list.back().empty())
      throw UsageError("--devices '" + f.devices + "' has an empty entry (give DEV,DEV,...)");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!p.group && list.size() != size_t(f.replicas))
    throw UsageError("--devices names " + std::to_string(list.size()) + " device(s) but --replicas is " +
                     std::to_string(f.replicas) + ": give one device per replica (--replicas " +
                     std::to_string(list.size()) + " to use them all)");
  const size_t first = size_t(p.local_rank) * size_t(f.replicas);
  if (list.size() < first + size_t(f.replicas))
    throw UsageError("rank " + std::to_string(p.rank) + " (local rank " + std::to_string(p.local_rank) +
                     " on " + p.host + ") has no device: --devices names " + std::to_string(list.size()) +
                     " device(s), and its " + std::to_string(f.replicas) + " replica(s) need entries " +
                     std::to_string(first + 1) + ".." + std::to_string(first + size_t(f.replicas)) +
                     " (one per replica of each rank on a host, by local rank)");
  for (size_t r = 0; r < size_t(f.replicas); ++r) devices[r].device = list[first + r];
  return devices;
}

void check_ranks_agree(const DataParallelPlace& p,
                       const std::vector<std::pair<int64_t, std::string>>& values) {
  if (!p.group) return;
  for (const auto& v : values) {
    const std::vector<int64_t> all = p.group->all_gather(v.first);
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0])
        throw UsageError("the ranks disagree on " + v.second + ": rank 0 has " + std::to_string(all[0]) +
                         ", rank " + std::to_string(r) + " has " + std::to_string(all[r]) +
                         " (give every rank the same arguments and data)");
  }
}

int run_data_parallel(const DataParallelFlags& f, const std::string& command,
                      const std::function<int(const DataParallelPlace&)>& body) {
  if (f.mode != "mpi") return body(DataParallelPlace{});
#ifdef MGN_HAVE_MPI
  MpiGroup mpi;
  try {
    DataParallelPlace p{.group = &mpi,
                        .rank = mpi.rank(),
                        .ranks = mpi.size(),
                        .local_rank = mpi.local_rank(),
                        .host = mpi.host()};
    const int rc = body(p);
    mpi.barrier();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mgn %s: rank %d of %d (%s): error: %s\n", command.c_str(), mpi.rank(), mpi.size(),
                 mpi.host().c_str(), e.what());
    std::fflush(stderr);
    mpi.abort(dynamic_cast<const UsageError*>(&e) ? 2 : 1);
  }
#else
  (void)command;
  throw UsageError(
      "--data-parallel mpi: this mgn was built without MPI (install libopenmpi-dev, then configure "
      "and build again with -DMGN_MPI=ON)");
#endif
}

}  // namespace mgn::tool
