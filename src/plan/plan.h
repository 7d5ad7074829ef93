// The static plan of one step: a dispatch list grouped at barriers (schedule.cpp) and one memory arena in
// which every tensor has a fixed offset (memory.cpp). Computed once per compiled graph; a backend replays it.
//
//   plan::PlanOptions opt;                 // defaults: one dispatch per node, 256-byte alignment
//   opt.pinned = {logits_id};              // read by the caller after the step: never aliased
//   plan::Plan p = plan::make_plan(g, opt);
//   for (int grp = 0; grp < p.num_groups(); ++grp) {           // barrier before each group
//     for (int d = p.group_begin[grp]; d < p.group_begin[grp + 1]; ++d) run(p.dispatches[d]);
//   }
//   barrier; for (const plan::Copy& c : p.snapshots) copy(c);  // pre-commit values that must survive
//   barrier; for (const plan::Commit& c : p.commits) if (!c.in_place) copy(c);  // assigns
//
// Memory model. Every tensor the plan keeps lives in a Storage (a block of the arena). Several tensors
// share one storage when the backend declared that an op's output is a view of an input (reshape) or when
// a pointwise op runs in place over an input that dies there. Pinned storages (parameters, state, inputs,
// constants, gradients, outputs, caller-pinned) each own their block for the whole step; step-local
// storages share memory when their lifetimes (in barrier groups, inclusive) are disjoint, so memory reuse
// never adds a barrier. An assign's new value lives until the end of the step and is copied onto its
// target after the last group, unless the value's producer could write the target in place (no later
// reader of the old value), in which case there is nothing to copy. Such a target's memory may also hold
// a pointwise result computed from its old value where that old value dies (an optimizer's m * beta1 or
// p * (1 - lr * wd)) when nothing reads the result after the in-place write begins. A graph output that
// shows an assigned parameter (the parameter itself or a view of it), and an assign whose value is another
// assigned parameter, read a snapshot taken after the last group and before the commits, so every read
// sees the old value.
//
// Barriers. Groups are ASAP levels of the read-after-write dependencies (the fewest any order allows);
// nodes whose inputs stay alive anyway are then moved as late as their users allow, which shortens their
// outputs' lifetimes without adding a group. Write-after-read and write-after-write hazards only arise
// through shared memory (reuse, in place, commits), and the memory plan creates them only across groups.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace mgn::plan {

// A backend's unit of work: one or more nodes run by one kernel, in ascending node order.
struct Dispatch {
  std::vector<int> nodes;
};

enum class MemClass : uint8_t { Parameter, State, Input, Constant, Gradient, Output, Pinned, StepLocal };
constexpr int kMemClassCount = 8;
const char* mem_class_name(MemClass c);
inline bool is_pinned(MemClass c) { return c != MemClass::StepLocal; }

struct PlanOptions {
  // The backend's dispatches (node ids each). Empty: one dispatch per needed non-source node, except views.
  // A caller-provided list must cover every needed non-source node that is not a view, exactly once.
  std::vector<Dispatch> dispatches;
  // Bytes of one tensor as the backend stores it. Default: numel × dtype_size.
  std::function<uint64_t(const ir::Node&)> tensor_bytes;
  uint64_t alignment = 256;  // every storage offset is a multiple of this (a power of two)
  // Largest tensor one binding may address; a bigger one is an error naming the node.
  uint64_t max_binding_bytes = UINT64_MAX;
  // Nodes the caller reads after the step (besides the graph outputs): never aliased, never overwritten.
  std::vector<int> pinned;
  // Nodes of the gradient class; default: graph outputs whose name starts with "grad.".
  std::optional<std::vector<int>> gradients;
  // Which input's memory a node's output may share (a view), or -1. Only for nodes that no caller
  // dispatch covers. Default: reshape views its input; an assign views its value.
  std::function<int(const ir::Node&)> view_of;
  // Whether `node` (in `dispatch`) may write its output over the memory of its input `input` when that
  // input dies there. Default: a single-node pointwise dispatch (not rope) whose input has the output's
  // shape and byte size.
  std::function<bool(const ir::Graph&, const Dispatch&, int node, int input)> in_place_ok;
  bool in_place = true;         // pointwise ops over dying inputs
  bool in_place_assign = true;  // an assign's value written straight into its target
  bool reuse = true;            // false: every step-local storage gets its own memory (for comparison)
  bool sink = true;             // move nodes whose inputs stay alive anyway as late as their users allow
  int submissions = 1;          // split the groups into this many submissions (shared queues)
  // Scratch buffers a dispatch needs while it runs (bytes each); they live in the dispatch's group only.
  std::function<std::vector<uint64_t>(const ir::Graph&, const Dispatch&)> scratch_bytes;
  // No storage crosses a multiple of this (0: no limit), so a backend can back the arena with several
  // allocations of this size (each at most what one binding can address).
  uint64_t segment_bytes = 0;
  // Memory the arena may take (the device's budget, a host's memory, or a caller's limit): a plan that needs
  // more is an error at planning time giving both figures and `available_what`, the limit's source.
  uint64_t available_bytes = UINT64_MAX;
  std::string available_what;
};

struct Storage {
  MemClass cls = MemClass::StepLocal;
  uint64_t bytes = 0;   // aligned size
  uint64_t offset = 0;  // in the arena, a multiple of PlanOptions::alignment
  // Lifetime in groups, inclusive; last_group == num_groups() means "until the commits after the last group".
  int first_group = 0, last_group = 0;
  std::vector<int> tensors;  // node ids living here, in production order (views and in-place results too)
  int scratch_of = -1;       // a scratch buffer of this dispatch (tensors empty), or -1
  int snapshot_of = -1;      // a pre-commit snapshot of this node (tensors empty), or -1
};

// A copy between storages after the last group and before the commits (whole storage bytes).
struct Copy {
  int src_storage = -1, dst_storage = -1;
  uint64_t bytes = 0;
};

// An assign's commit after the last group: the target takes the value. In-place assigns copy nothing.
struct Commit {
  int assign = -1;        // the Assign node
  int target = -1;        // the Parameter node
  int src_storage = -1, dst_storage = -1;
  uint64_t bytes = 0;
  bool in_place = false;  // the value was written into the target by its producer; no copy
};

struct ClassBytes {
  uint64_t logical = 0;   // sum of the bytes of every tensor of the class
  uint64_t physical = 0;  // memory the class occupies in the arena
};

struct MemoryReport {
  ClassBytes per_class[kMemClassCount];
  uint64_t logical = 0, physical = 0;  // totals; physical == arena_bytes
  uint64_t step_local_peak_live = 0;   // most step-local bytes live in one group (lower bound on reuse)
};

struct Plan {
  std::vector<Dispatch> dispatches;  // execution order
  std::vector<int> group_begin;      // dispatches [group_begin[g], group_begin[g+1]) form group g
  std::vector<int> submission_begin; // groups [submission_begin[s], submission_begin[s+1]) form submission s
  std::vector<int> dispatch_of;      // per node: its dispatch index, or -1 (source, view, unneeded)
  std::vector<int> group_of;         // per dispatch: its group
  std::vector<int> storage_of;       // per node: its storage, or -1 (unneeded, or internal to a fusion)
  std::vector<std::vector<int>> scratch_of;  // per dispatch: its scratch storages, in PlanOptions order
  std::vector<int> output_storage;   // per graph output (g.outputs() order): the storage to read after the step
  std::vector<bool> needed;          // per node: the step computes or reads it
  std::vector<bool> in_place_of;     // per node: it overwrote a dying input's storage
  std::vector<Storage> storages;
  std::vector<Copy> snapshots;       // after the last group, before the commits (barrier between)
  std::vector<Commit> commits;
  uint64_t alignment = 0;
  uint64_t segment_bytes = 0;        // as planned (0: one segment)
  uint64_t arena_bytes = 0;
  uint64_t step_local_base = 0;      // pinned storages lie below, step-local ones from here
  MemoryReport report;
  double planning_ms = 0;

  int num_groups() const { return int(group_begin.size()) - 1; }
  int num_dispatches() const { return int(dispatches.size()); }
  // Offset of a node's memory; the node must have a storage.
  uint64_t offset_of(int node) const;
};

// Plans one step of `g`; throws mgn::Error on a bad dispatch list or a tensor over the binding limit.
Plan make_plan(const ir::Graph& g, const PlanOptions& opt = {});

// The default in-place policy (PlanOptions::in_place_ok), for backends that narrow it.
bool default_in_place_ok(const ir::Graph& g, const Dispatch& d, int node, int input);

// A readable dump: dispatches by group, storages with lifetimes and offsets, commits, memory report.
std::string to_text(const Plan& p, const ir::Graph& g);
// The memory report alone, one class a line.
std::string report_text(const Plan& p);

}  // namespace mgn::plan
