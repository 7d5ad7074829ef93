// Planner internals, step 1 and 2: which nodes the step needs, their memory classes and views, the
// dispatch list with its dependencies, and the schedule (dispatch order and barrier groups).
#pragma once

#include <vector>

#include "plan/plan.h"

namespace mgn::plan::detail {

// Facts about the graph and the dispatch list that the schedule and the memory plan both use.
struct Analysis {
  const ir::Graph* g = nullptr;
  std::vector<bool> needed;            // per node
  std::vector<MemClass> cls;           // per node: its own class (StepLocal unless pinned)
  std::vector<bool> read_after_step;   // per node: an output or caller-pinned (sources included)
  std::vector<uint64_t> bytes;         // per node, unaligned
  std::vector<int> root;               // per node: the node whose memory it lives in through views
  std::vector<bool> is_view;           // per node: lives in an input's memory, no dispatch
  std::vector<bool> has_memory;        // per node (roots only): read outside its dispatch, or pinned
  std::vector<MemClass> root_cls;      // per root: the strongest class of the root and its views
  std::vector<bool> root_read_after_step;  // per root: it or a view of it is read after the step
  std::vector<bool> assign_viewed;     // per root: an assign's value lives here (until the commits)
  std::vector<int> commit_reads;       // per root: how many assigns take their value from here
  std::vector<bool> assign_target;     // per node: a parameter some assign writes
  std::vector<Dispatch> dispatches;    // creation order (indices used by dispatch_of, deps, readers)
  std::vector<int> dispatch_of;        // per node
  std::vector<std::vector<int>> deps;  // per dispatch: the dispatches producing what it reads
  std::vector<std::vector<int>> users; // per dispatch: the dispatches reading what it produces
  std::vector<std::vector<int>> external_inputs;  // per dispatch: nodes it reads from outside (unique)
  std::vector<std::vector<int>> readers;  // per root node: dispatches reading its memory (through views too)
  std::vector<int> topo;               // dispatch indices in a dependency order
  // Assigns whose value's producer writes the target directly: per Assign node, the producing dispatch.
  std::vector<int> in_place_assign;    // per node: dispatch index, or -1
};

// Needed nodes, classes, views, dispatches and dependencies; throws mgn::Error on a bad dispatch list.
Analysis analyze(const ir::Graph& g, const PlanOptions& opt);

struct Schedule {
  std::vector<int> order;        // dispatch indices (into Analysis::dispatches) in execution order
  std::vector<int> group;        // per dispatch index: its barrier group
  std::vector<int> group_begin;  // positions in `order`; size num_groups + 1
  int num_groups() const { return int(group_begin.size()) - 1; }
};

// Orders the dispatches by ASAP level (every level is one barrier group, the fewest groups any order
// allows for these dependencies), sinks nodes whose inputs stay alive anyway, and chooses the in-place
// assigns (recorded in `a`), raising a producer's level when that needs no extra group.
Schedule schedule(Analysis& a, const PlanOptions& opt);

// Default policies (also used by callers that extend them).
uint64_t default_tensor_bytes(const ir::Node& n);
int default_view_of(const ir::Node& n);

}  // namespace mgn::plan::detail
