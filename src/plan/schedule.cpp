// Scheduler: what a step needs, memory classes and views, the dispatch list and its dependencies, and the
// barrier groups (ASAP levels, then sinking and in-place assigns that keep the group count).
#include "plan/schedule.h"

#include <algorithm>
#include <set>

namespace mgn::plan {

const char* mem_class_name(MemClass c) {
  switch (c) {
    case MemClass::Parameter: return "parameter";
    case MemClass::State: return "state";
    case MemClass::Input: return "input";
    case MemClass::Constant: return "constant";
    case MemClass::Gradient: return "gradient";
    case MemClass::Output: return "output";
    case MemClass::Pinned: return "pinned";
    case MemClass::StepLocal: return "step-local";
  }
  return "?";
}

bool default_in_place_ok(const ir::Graph& g, const Dispatch& d, int node, int input) {
  if (d.nodes.size() != 1 || d.nodes[0] != node) return false;
  const ir::Node& n = g.node(node);
  if (ir::op_info(n.op).archetype != ir::Archetype::Pointwise || n.op == ir::Op::Rope) return false;
  const ir::Node& in = g.node(input);
  return in.shape == n.shape && dtype_size(in.dtype) == dtype_size(n.dtype);
}

}  // namespace mgn::plan

namespace mgn::plan::detail {

uint64_t default_tensor_bytes(const ir::Node& n) {
  uint64_t bytes;
  if (__builtin_mul_overflow(uint64_t(numel(n.shape)), uint64_t(dtype_size(n.dtype)), &bytes))
    throw Error("plan: tensor " + shape_str(n.shape) + " of '" + n.name + "' has more bytes than 64 bits count");
  return bytes;
}

int default_view_of(const ir::Node& n) {
  if (n.op == ir::Op::Reshape) return 0;
  if (n.op == ir::Op::Assign) return 1;
  return -1;
}

namespace {

void push_unique(std::vector<int>& v, int x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

}  // namespace

Analysis analyze(const ir::Graph& g, const PlanOptions& opt) {
  const int n = g.size();
  Analysis a;
  a.g = &g;
  a.needed.assign(size_t(n), false);
  for (auto& [name, id] : g.outputs()) a.needed[size_t(id)] = true;
  for (int id : g.assigns()) a.needed[size_t(id)] = true;
  for (int id : opt.pinned) {
    if (id < 0 || id >= n) throw Error("plan: pinned node id " + std::to_string(id) + " is not in the graph");
    a.needed[size_t(id)] = true;
  }
  for (int id : g.parameters()) a.needed[size_t(id)] = true;  // state is readable whether used or not
  for (int i = n - 1; i >= 0; --i)
    if (a.needed[size_t(i)])
      for (int in : g.node(i).inputs) a.needed[size_t(in)] = true;

  // Classes.
  a.cls.assign(size_t(n), MemClass::StepLocal);
  a.read_after_step.assign(size_t(n), false);
  a.assign_target.assign(size_t(n), false);
  for (int i = 0; i < n; ++i) {
    const ir::Node& node = g.node(i);
    // Sources own their memory by kind; every computed value starts step-local.
    if (node.op == ir::Op::Parameter) a.cls[size_t(i)] = node.trainable ? MemClass::Parameter : MemClass::State;
    if (node.op == ir::Op::Input) a.cls[size_t(i)] = MemClass::Input;
    if (node.op == ir::Op::Constant || node.op == ir::Op::Full) a.cls[size_t(i)] = MemClass::Constant;
    if (ir::op_info(node.op).archetype == ir::Archetype::Source && a.cls[size_t(i)] == MemClass::StepLocal)
      throw Error(std::string("internal: plan: no memory class for the source op ") + ir::op_name(node.op));
    if (node.op == ir::Op::Assign) a.assign_target[size_t(node.inputs[0])] = true;
  }
  std::set<int> grads;
  if (opt.gradients) {
    grads.insert(opt.gradients->begin(), opt.gradients->end());
  } else {
    for (auto& [name, id] : g.outputs())
      if (name.rfind("grad.", 0) == 0) grads.insert(id);
  }
  auto promote = [&](int id, MemClass c) {
    if (int(c) < int(a.cls[size_t(id)])) a.cls[size_t(id)] = c;
  };
  for (auto& [name, id] : g.outputs()) {
    promote(id, grads.count(id) ? MemClass::Gradient : MemClass::Output);
    a.read_after_step[size_t(id)] = true;
  }
  for (int id : grads)
    if (id >= 0 && id < n && a.needed[size_t(id)]) promote(id, MemClass::Gradient);
  for (int id : opt.pinned) {
    promote(id, MemClass::Pinned);
    a.read_after_step[size_t(id)] = true;
  }

  // Bytes and views.
  auto tensor_bytes = opt.tensor_bytes ? opt.tensor_bytes : std::function<uint64_t(const ir::Node&)>(default_tensor_bytes);
  auto view_of = opt.view_of ? opt.view_of : std::function<int(const ir::Node&)>(default_view_of);
  a.bytes.assign(size_t(n), 0);
  a.root.resize(size_t(n));
  a.is_view.assign(size_t(n), false);
  a.dispatch_of.assign(size_t(n), -1);
  std::vector<bool> covered(size_t(n), false);
  for (const Dispatch& d : opt.dispatches)
    for (int id : d.nodes)
      if (id >= 0 && id < n) covered[size_t(id)] = true;
  for (int i = 0; i < n; ++i) {
    a.root[size_t(i)] = i;
    if (!a.needed[size_t(i)]) continue;
    const ir::Node& node = g.node(i);
    a.bytes[size_t(i)] = tensor_bytes(node);
    if (a.bytes[size_t(i)] > opt.max_binding_bytes)
      throw Error("plan: " + g.describe(i) + " needs " + std::to_string(a.bytes[size_t(i)]) +
                  " bytes, more than one binding can address (" + std::to_string(opt.max_binding_bytes) + ")");
    if (ir::op_info(node.op).archetype == ir::Archetype::Source || covered[size_t(i)]) continue;
    int vi = view_of(node);
    if (vi < 0) continue;
    if (vi >= int(node.inputs.size()))
      throw Error("plan: view_of names input " + std::to_string(vi) + " of " + g.describe(i));
    int src = node.inputs[size_t(vi)];
    if (a.bytes[size_t(i)] > a.bytes[size_t(src)])
      throw Error("plan: " + g.describe(i) + " is declared a view of " + g.describe(src) + " but needs more bytes");
    a.is_view[size_t(i)] = true;
    a.root[size_t(i)] = a.root[size_t(src)];
  }

  // Dispatches.
  if (opt.dispatches.empty()) {
    for (int i = 0; i < n; ++i) {
      if (!a.needed[size_t(i)] || a.is_view[size_t(i)]) continue;
      if (ir::op_info(g.node(i).op).archetype == ir::Archetype::Source) continue;
      a.dispatches.push_back(Dispatch{{i}});
    }
  } else {
    a.dispatches = opt.dispatches;
  }
  for (size_t d = 0; d < a.dispatches.size(); ++d) {
    const std::vector<int>& nodes = a.dispatches[d].nodes;
    if (nodes.empty()) throw Error("plan: dispatch " + std::to_string(d) + " has no nodes");
    for (size_t k = 0; k < nodes.size(); ++k) {
      int id = nodes[k];
      if (id < 0 || id >= n) throw Error("plan: dispatch " + std::to_string(d) + " names node " + std::to_string(id) + ", not in the graph");
      if (k > 0 && id <= nodes[k - 1])
        throw Error("plan: dispatch " + std::to_string(d) + " lists its nodes out of order");
      if (!a.needed[size_t(id)] || a.is_view[size_t(id)] ||
          ir::op_info(g.node(id).op).archetype == ir::Archetype::Source)
        throw Error("plan: dispatch " + std::to_string(d) + " covers " + g.describe(id) +
                    ", which is a source, a view or not needed");
      if (a.dispatch_of[size_t(id)] >= 0)
        throw Error("plan: " + g.describe(id) + " is in dispatches " + std::to_string(a.dispatch_of[size_t(id)]) +
                    " and " + std::to_string(d));
      a.dispatch_of[size_t(id)] = int(d);
    }
  }
  for (int i = 0; i < n; ++i)
    if (a.needed[size_t(i)] && !a.is_view[size_t(i)] && a.dispatch_of[size_t(i)] < 0 &&
        ir::op_info(g.node(i).op).archetype != ir::Archetype::Source)
      throw Error("plan: no dispatch covers " + g.describe(i));

  // Root facts: class, read after the step, assign values.
  a.root_cls.assign(size_t(n), MemClass::StepLocal);
  a.root_read_after_step.assign(size_t(n), false);
  a.assign_viewed.assign(size_t(n), false);
  a.commit_reads.assign(size_t(n), 0);
  a.has_memory.assign(size_t(n), false);
  for (int i = 0; i < n; ++i) {
    if (!a.needed[size_t(i)]) continue;
    int r = a.root[size_t(i)];
    if (int(a.cls[size_t(i)]) < int(a.root_cls[size_t(r)])) a.root_cls[size_t(r)] = a.cls[size_t(i)];
    if (a.read_after_step[size_t(i)]) a.root_read_after_step[size_t(r)] = true;
    if (g.node(i).op == ir::Op::Assign) {
      a.assign_viewed[size_t(r)] = true;
      a.commit_reads[size_t(r)]++;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!a.needed[size_t(i)] || a.root[size_t(i)] != i) continue;
    if (is_pinned(a.root_cls[size_t(i)]) || a.assign_viewed[size_t(i)]) a.has_memory[size_t(i)] = true;
  }

  // Reads, dependencies, readers.
  const size_t nd = a.dispatches.size();
  a.deps.assign(nd, {});
  a.users.assign(nd, {});
  a.external_inputs.assign(nd, {});
  a.readers.assign(size_t(n), {});
  for (size_t d = 0; d < nd; ++d) {
    for (int id : a.dispatches[d].nodes)
      for (int in : g.node(id).inputs) {
        if (a.dispatch_of[size_t(in)] == int(d)) continue;  // produced inside the dispatch
        push_unique(a.external_inputs[d], in);
        int r = a.root[size_t(in)];
        a.has_memory[size_t(r)] = true;
        push_unique(a.readers[size_t(r)], int(d));
        int p = a.dispatch_of[size_t(r)];
        if (p >= 0 && p != int(d)) push_unique(a.deps[d], p);
      }
  }
  for (size_t d = 0; d < nd; ++d)
    for (int p : a.deps[d]) a.users[size_t(p)].push_back(int(d));

  // A dependency order (Kahn); a cycle means the caller fused nodes across another dispatch.
  std::vector<int> indeg(nd, 0);
  for (size_t d = 0; d < nd; ++d) indeg[d] = int(a.deps[d].size());
  std::vector<int> ready;
  for (size_t d = nd; d-- > 0;)
    if (indeg[d] == 0) ready.push_back(int(d));
  while (!ready.empty()) {
    int d = ready.back();
    ready.pop_back();
    a.topo.push_back(d);
    for (int u : a.users[size_t(d)])
      if (--indeg[size_t(u)] == 0) ready.push_back(u);
  }
  if (a.topo.size() != nd) throw Error("plan: the dispatch list has a dependency cycle (a fusion spans another dispatch)");
  a.in_place_assign.assign(size_t(n), -1);
  return a;
}

Schedule schedule(Analysis& a, const PlanOptions& opt) {
  const ir::Graph& g = *a.g;
  const size_t nd = a.dispatches.size();
  Schedule s;
  s.group.assign(nd, 0);
  std::vector<int>& level = s.group;
  int top = -1;
  for (int d : a.topo) {
    int l = 0;
    for (int p : a.deps[size_t(d)]) l = std::max(l, level[size_t(p)] + 1);
    level[size_t(d)] = l;
    top = std::max(top, l);
  }
  const int num_levels = top + 1;

  auto latest_for = [&](int d) {
    int latest = num_levels - 1;
    for (int u : a.users[size_t(d)]) latest = std::min(latest, level[size_t(u)] - 1);
    return latest;
  };

  // Sinking: a dispatch whose inputs are alive at a later level anyway (pinned, kept for the commits, or
  // read later by someone else) runs later, so its output lives shorter; so does one whose output is
  // larger than the inputs whose lives it would extend (a weight scaled by a scalar).
  if (opt.sink) {
    for (size_t k = nd; k-- > 0;) {
      int d = a.topo[k];
      const int latest = latest_for(d);
      if (latest <= level[size_t(d)]) continue;
      int bound = latest;
      uint64_t extended = 0, produced = 0;
      for (int in : a.external_inputs[size_t(d)]) {
        int r = a.root[size_t(in)];
        if (is_pinned(a.root_cls[size_t(r)]) || a.assign_viewed[size_t(r)]) continue;
        int other = -1;
        for (int rd : a.readers[size_t(r)])
          if (rd != d) other = std::max(other, level[size_t(rd)]);
        bound = std::min(bound, std::max(other, level[size_t(d)]));
        if (other < latest) extended += a.bytes[size_t(r)];
      }
      for (int id : a.dispatches[size_t(d)].nodes)
        if (a.root[size_t(id)] == id && a.root_cls[size_t(id)] == MemClass::StepLocal) produced += a.bytes[size_t(id)];
      if (extended < produced) bound = latest;
      level[size_t(d)] = std::max(level[size_t(d)], bound);
    }
  }

  // In-place assigns: the value's producer writes the parameter itself when no one reads the old value at
  // or after the producer's group.
  auto in_place_ok = opt.in_place_ok
                         ? opt.in_place_ok
                         : std::function<bool(const ir::Graph&, const Dispatch&, int, int)>(plan::default_in_place_ok);
  if (opt.in_place_assign) {
    std::vector<bool> taken(size_t(g.size()), false);
    for (int as : g.assigns()) {
      const ir::Node& an = g.node(as);
      int t = an.inputs[0], v = an.inputs[1];
      if (a.root[size_t(t)] != t || a.root[size_t(v)] != v || a.is_view[size_t(v)]) continue;
      int p = a.dispatch_of[size_t(v)];
      if (p < 0 || taken[size_t(v)]) continue;
      if (a.root_cls[size_t(v)] != MemClass::StepLocal || a.root_read_after_step[size_t(v)]) continue;
      if (a.bytes[size_t(v)] != a.bytes[size_t(t)]) continue;
      if (a.root_read_after_step[size_t(t)] || a.commit_reads[size_t(t)] > 0) continue;
      if (a.commit_reads[size_t(v)] != 1) continue;  // one assign takes this value
      // The producer may read the old value only element by element: every node of its dispatch that
      // reads the target must be allowed to write over it (for a fused element-wise kernel: same shape,
      // loaded before any store of that element).
      const Dispatch& pd = a.dispatches[size_t(p)];
      bool ok = true;
      for (int id : pd.nodes)
        for (int in : g.node(id).inputs)
          if (a.root[size_t(in)] == t && !in_place_ok(g, pd, id, in)) ok = false;
      if (!ok) continue;
      int need = level[size_t(p)];
      for (int rd : a.readers[size_t(t)])
        if (rd != p) need = std::max(need, level[size_t(rd)] + 1);
      if (need > level[size_t(p)]) {
        if (need > latest_for(p)) continue;  // would add a group or break a user
        level[size_t(p)] = need;
      }
      a.in_place_assign[size_t(as)] = p;
      taken[size_t(v)] = true;
    }
  }

  // Drop levels that sinking emptied (none in practice: a longest path keeps one dispatch per level).
  {
    std::vector<int> used(size_t(std::max(num_levels, 1)), 0);
    for (size_t d = 0; d < nd; ++d) used[size_t(level[d])] = 1;
    std::vector<int> renum(used.size(), 0);
    int next = 0;
    for (size_t l = 0; l < used.size(); ++l) renum[l] = used[l] ? next++ : next;
    for (size_t d = 0; d < nd; ++d) level[d] = renum[size_t(level[d])];
    top = next - 1;
  }
  const int groups = top + 1;

  // Execution order: by level, then creation order.
  s.order.resize(nd);
  for (size_t d = 0; d < nd; ++d) s.order[d] = int(d);
  std::stable_sort(s.order.begin(), s.order.end(), [&](int x, int y) { return level[size_t(x)] < level[size_t(y)]; });
  s.group_begin.assign(1, 0);
  for (int l = 0; l < groups; ++l) {
    int end = s.group_begin.back();
    while (end < int(nd) && level[size_t(s.order[size_t(end)])] == l) ++end;
    s.group_begin.push_back(end);
  }
  return s;
}

}  // namespace mgn::plan::detail
