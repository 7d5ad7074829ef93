// Memory planner: storages (views, in-place results, scratch, snapshots), lifetimes in barrier groups, and
// offsets in one arena: pinned storages each own a block, step-local ones share memory by greedy-by-size
// best-fit placement over lifetime-intersecting neighbours.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>

#include "plan/schedule.h"

namespace mgn::plan {

uint64_t Plan::offset_of(int node) const {
  int s = storage_of.at(size_t(node));
  if (s < 0) throw Error("plan: node %" + std::to_string(node) + " has no storage");
  return storages[size_t(s)].offset;
}

namespace {

// Byte arithmetic that refuses to wrap: a shape whose bytes (or an arena whose sum) pass 2^64 is an error,
// never a small plan.
[[noreturn]] void overflow() {
  throw Error("plan: the memory plan's byte count overflows 64 bits (a tensor or the sum of them is impossibly large)");
}
std::string gib(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", double(bytes) / double(1ull << 30));
  return s;
}
uint64_t add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
uint64_t align_up(uint64_t x, uint64_t a) { return a <= 1 ? x : add(x, a - 1) / a * a; }

// First offset >= lo (aligned, not crossing a segment boundary) where `size` bytes fit below `hi`, or
// UINT64_MAX.
uint64_t fit(uint64_t lo, uint64_t size, uint64_t hi, uint64_t align, uint64_t seg) {
  uint64_t o = align_up(lo, align);
  if (seg && size > 0 && o / seg != (add(o, size) - 1) / seg) o = align_up(o, seg);
  if (hi != UINT64_MAX && add(o, size) > hi) return UINT64_MAX;
  add(o, size);
  return o;
}

struct Placed {
  int first, last;
  uint64_t offset, end;
};

// Greedy by size: the largest storage first, each into the smallest gap left by the already placed
// storages whose lifetimes intersect its own (or above them all).
void place_step_local(std::vector<Storage>& st, const std::vector<int>& ids, uint64_t base, uint64_t align,
                      uint64_t seg, bool reuse) {
  std::vector<int> order = ids;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    const Storage &a = st[size_t(x)], &b = st[size_t(y)];
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    int la = a.last_group - a.first_group, lb = b.last_group - b.first_group;
    if (la != lb) return la > lb;
    return a.first_group < b.first_group;
  });
  if (!reuse) {
    uint64_t cur = base;
    for (int id : ids) {
      st[size_t(id)].offset = fit(cur, st[size_t(id)].bytes, UINT64_MAX, align, seg);
      cur = st[size_t(id)].offset + st[size_t(id)].bytes;
    }
    return;
  }
  std::vector<Placed> placed;  // sorted by offset, so the lifetime-intersecting ones come out in order
  placed.reserve(order.size());
  for (int id : order) {
    Storage& s = st[size_t(id)];
    uint64_t cursor = base, best = UINT64_MAX, best_gap = UINT64_MAX;
    for (const Placed& p : placed) {
      if (p.first > s.last_group || s.first_group > p.last) continue;
      if (p.offset > cursor) {
        uint64_t o = fit(cursor, s.bytes, p.offset, align, seg);
        if (o != UINT64_MAX && p.offset - cursor < best_gap) {
          best = o;
          best_gap = p.offset - cursor;
        }
      }
      cursor = std::max(cursor, p.end);
    }
    if (best == UINT64_MAX) best = fit(cursor, s.bytes, UINT64_MAX, align, seg);
    s.offset = best;
    Placed np{s.first_group, s.last_group, s.offset, s.offset + s.bytes};
    auto at = std::upper_bound(placed.begin(), placed.end(), np,
                               [](const Placed& a, const Placed& b) { return a.offset < b.offset; });
    placed.insert(at, np);
  }
}

}  // namespace

Plan make_plan(const ir::Graph& g, const PlanOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)))
    throw Error("plan: alignment must be a power of two, got " + std::to_string(opt.alignment));
  if (opt.segment_bytes && opt.segment_bytes % opt.alignment)
    throw Error("plan: segment_bytes must be a multiple of the alignment");
  detail::Analysis a = detail::analyze(g, opt);
  detail::Schedule sch = detail::schedule(a, opt);
  const int n = g.size();
  const int L = sch.num_groups();
  const uint64_t align = opt.alignment, seg = opt.segment_bytes;

  Plan p;
  p.alignment = align;
  p.segment_bytes = seg;
  p.needed = a.needed;
  p.in_place_of.assign(size_t(n), false);
  p.group_begin = sch.group_begin;
  p.dispatch_of.assign(size_t(n), -1);
  std::vector<int> exec_of(a.dispatches.size());  // analysis index -> execution index
  for (size_t k = 0; k < sch.order.size(); ++k) {
    int d = sch.order[k];
    exec_of[size_t(d)] = int(k);
    p.dispatches.push_back(a.dispatches[size_t(d)]);
    p.group_of.push_back(sch.group[size_t(d)]);
    for (int id : a.dispatches[size_t(d)].nodes) p.dispatch_of[size_t(id)] = int(k);
  }
  const int nd = p.num_dispatches();
  auto group_of_analysis = [&](int d) { return sch.group[size_t(d)]; };

  // Storages of pinned roots: one each, the whole step.
  p.storage_of.assign(size_t(n), -1);
  auto new_storage = [&](MemClass c, uint64_t bytes, int first, int last) {
    Storage s;
    s.cls = c;
    if (bytes > opt.max_binding_bytes)
      throw Error("plan: a storage of " + std::to_string(bytes) + " bytes exceeds the binding limit");
    s.bytes = align_up(bytes, align);
    if (seg && s.bytes > seg) throw Error("plan: a storage of " + std::to_string(bytes) + " bytes exceeds segment_bytes");
    s.first_group = first;
    s.last_group = last;
    p.storages.push_back(s);
    return int(p.storages.size()) - 1;
  };
  for (int c = 0; c < kMemClassCount; ++c) {
    if (MemClass(c) == MemClass::StepLocal) continue;
    for (int i = 0; i < n; ++i)
      if (a.needed[size_t(i)] && a.root[size_t(i)] == i && a.has_memory[size_t(i)] && int(a.root_cls[size_t(i)]) == c)
        p.storage_of[size_t(i)] = new_storage(MemClass(c), a.bytes[size_t(i)], 0, L);
  }
  std::vector<int> in_place_value_target(size_t(n), -1);  // value node -> parameter it is written into
  std::vector<int> in_place_assign_of(size_t(n), -1);     // parameter -> its in-place assign
  for (int as : g.assigns())
    if (a.in_place_assign[size_t(as)] >= 0) {
      in_place_value_target[size_t(g.node(as).inputs[1])] = g.node(as).inputs[0];
      in_place_assign_of[size_t(g.node(as).inputs[0])] = as;
    }
  std::vector<int> into_target(size_t(n), -1);  // step-local node -> the parameter whose memory it borrows

  // Step-local storages in execution order: in place over a dying input where allowed, else new.
  auto in_place_ok = opt.in_place_ok ? opt.in_place_ok
                                     : std::function<bool(const ir::Graph&, const Dispatch&, int, int)>(
                                           plan::default_in_place_ok);
  std::vector<int> content(p.storages.size(), -1);  // per storage: the root whose value it holds now
  for (int i = 0; i < n; ++i)
    if (p.storage_of[size_t(i)] >= 0) content[size_t(p.storage_of[size_t(i)])] = i;
  // A pointwise step-local result may also be written over an assigned parameter whose new value its
  // producer writes in place (in_place_value_target), between the last read of the old value and that
  // write: the update's intermediates (m * beta1, p * (1 - lr * wd)) then need no memory of their own.
  // Conditions: the old value dies here (every other reader in an earlier group, nobody reads it after
  // the step, no assign takes it as its value), the parameter's memory still holds it, and the result
  // is read only before the group of the in-place write, or by the in-place writer itself element by
  // element.
  auto borrowable_target = [&](int id, int d, int grp) -> int {
    const Dispatch& disp = a.dispatches[size_t(d)];
    if (disp.nodes.size() != 1 || a.root_read_after_step[size_t(id)] || a.assign_viewed[size_t(id)]) return -1;
    for (int in : g.node(id).inputs) {
      int t = a.root[size_t(in)];
      int as = in_place_assign_of[size_t(t)];
      if (as < 0 || a.dispatch_of[size_t(in)] == d) continue;
      int s = p.storage_of[size_t(t)];
      if (s < 0 || content[size_t(s)] != t || a.bytes[size_t(id)] != a.bytes[size_t(t)]) continue;
      if (a.root_read_after_step[size_t(t)] || a.commit_reads[size_t(t)] > 0) continue;
      if (!in_place_ok(g, disp, id, in)) continue;
      bool dies = true;
      for (int rd : a.readers[size_t(t)])
        if (rd != d && group_of_analysis(rd) >= grp) dies = false;
      if (!dies) continue;
      const int pd = a.in_place_assign[size_t(as)];
      const int v = g.node(as).inputs[1];
      const int gv = group_of_analysis(pd);
      if (gv <= grp) continue;
      bool ok = true;
      for (int rd : a.readers[size_t(id)]) {
        if (group_of_analysis(rd) < gv) continue;
        if (rd != pd) {
          ok = false;
          break;
        }
        for (int pn : a.dispatches[size_t(pd)].nodes)
          for (int pin : g.node(pn).inputs)
            if (a.root[size_t(pin)] == id && (pn != v || !in_place_ok(g, a.dispatches[size_t(pd)], v, pin))) ok = false;
      }
      if (ok) return t;
    }
    return -1;
  };
  p.scratch_of.assign(size_t(nd), {});
  for (int k = 0; k < nd; ++k) {
    int d = sch.order[size_t(k)];
    int grp = sch.group[size_t(d)];
    const Dispatch& disp = a.dispatches[size_t(d)];
    for (int id : disp.nodes) {
      if (a.root[size_t(id)] != id || !a.has_memory[size_t(id)] || a.root_cls[size_t(id)] != MemClass::StepLocal)
        continue;
      if (in_place_value_target[size_t(id)] >= 0) {
        int s = p.storage_of[size_t(in_place_value_target[size_t(id)])];
        p.storage_of[size_t(id)] = s;
        content[size_t(s)] = id;
        continue;
      }
      int chosen = -1;
      if (opt.in_place) {
        int t = borrowable_target(id, d, grp);
        if (t >= 0) {
          int s = p.storage_of[size_t(t)];
          p.storage_of[size_t(id)] = s;
          content[size_t(s)] = id;
          p.in_place_of[size_t(id)] = true;
          into_target[size_t(id)] = t;
          continue;
        }
        for (int in : g.node(id).inputs) {
          int r = a.root[size_t(in)];
          int s = p.storage_of[size_t(r)];
          if (s < 0 || p.storages[size_t(s)].cls != MemClass::StepLocal || content[size_t(s)] != r) continue;
          if (a.assign_viewed[size_t(r)] || p.storages[size_t(s)].bytes < align_up(a.bytes[size_t(id)], align)) continue;
          if (a.dispatch_of[size_t(in)] == d) continue;
          bool dies = true;
          for (int rd : a.readers[size_t(r)])
            if (rd != d && group_of_analysis(rd) >= grp) dies = false;
          if (!dies || !in_place_ok(g, disp, id, in)) continue;
          chosen = s;
          break;
        }
      }
      if (chosen >= 0) {
        p.in_place_of[size_t(id)] = true;
      } else {
        chosen = new_storage(MemClass::StepLocal, a.bytes[size_t(id)], grp, grp);
        content.push_back(-1);
      }
      p.storage_of[size_t(id)] = chosen;
      content[size_t(chosen)] = id;
    }
    if (opt.scratch_bytes)
      for (uint64_t b : opt.scratch_bytes(g, disp)) {
        int s = new_storage(MemClass::StepLocal, b, grp, grp);
        content.push_back(-1);
        p.storages[size_t(s)].scratch_of = k;
        p.scratch_of[size_t(k)].push_back(s);
      }
  }
  // Views live in their root's storage; tensor lists in node order (= production order).
  for (int i = 0; i < n; ++i) {
    if (!a.needed[size_t(i)]) continue;
    if (a.root[size_t(i)] != i) p.storage_of[size_t(i)] = p.storage_of[size_t(a.root[size_t(i)])];
    if (p.storage_of[size_t(i)] >= 0) p.storages[size_t(p.storage_of[size_t(i)])].tensors.push_back(i);
  }

  // Lifetimes of step-local storages: from the first production to the last read (commits: L).
  for (int i = 0; i < n; ++i) {
    int s = p.storage_of[size_t(i)];
    if (s < 0 || a.root[size_t(i)] != i) continue;
    Storage& st = p.storages[size_t(s)];
    if (st.cls != MemClass::StepLocal) continue;
    for (int rd : a.readers[size_t(i)]) st.last_group = std::max(st.last_group, group_of_analysis(rd));
    if (a.assign_viewed[size_t(i)]) st.last_group = L;
  }

  // Snapshots: outputs that show an assigned parameter, and assign values that are assigned parameters.
  p.output_storage.assign(g.outputs().size(), -1);
  std::map<int, int> out_snap, val_snap;  // root -> snapshot storage
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    int id = g.outputs()[k].second;
    int r = a.root[size_t(id)];
    if (!a.assign_target[size_t(r)]) {
      p.output_storage[k] = p.storage_of[size_t(id)];
      continue;
    }
    auto it = out_snap.find(r);
    if (it == out_snap.end()) {
      int s = new_storage(MemClass::Output, a.bytes[size_t(r)], 0, L);
      p.storages[size_t(s)].snapshot_of = r;
      p.snapshots.push_back({p.storage_of[size_t(r)], s, p.storages[size_t(s)].bytes});
      it = out_snap.emplace(r, s).first;
    }
    p.output_storage[k] = it->second;
  }
  for (int as : g.assigns()) {
    const ir::Node& an = g.node(as);
    int t = an.inputs[0], v = an.inputs[1];
    Commit c;
    c.assign = as;
    c.target = t;
    c.dst_storage = p.storage_of[size_t(t)];
    c.bytes = a.bytes[size_t(t)];
    int r = a.root[size_t(v)];
    if (a.in_place_assign[size_t(as)] >= 0 || p.storage_of[size_t(v)] == c.dst_storage) {
      c.src_storage = c.dst_storage;
      c.in_place = true;
    } else if (a.assign_target[size_t(r)]) {
      auto it = val_snap.find(r);
      if (it == val_snap.end()) {
        int s = new_storage(MemClass::StepLocal, a.bytes[size_t(r)], L, L);
        p.storages[size_t(s)].snapshot_of = r;
        p.snapshots.push_back({p.storage_of[size_t(r)], s, p.storages[size_t(s)].bytes});
        it = val_snap.emplace(r, s).first;
      }
      c.src_storage = it->second;
    } else {
      c.src_storage = p.storage_of[size_t(v)];
    }
    p.commits.push_back(c);
  }

  // Offsets: pinned storages in class order at the bottom, step-local ones above.
  uint64_t cur = 0;
  std::vector<int> step_local, pinned_order;
  for (size_t s = 0; s < p.storages.size(); ++s)
    (p.storages[s].cls == MemClass::StepLocal ? step_local : pinned_order).push_back(int(s));
  std::stable_sort(pinned_order.begin(), pinned_order.end(),
                   [&](int x, int y) { return int(p.storages[size_t(x)].cls) < int(p.storages[size_t(y)].cls); });
  for (int s : pinned_order) {
    Storage& st = p.storages[size_t(s)];
    st.offset = fit(cur, st.bytes, UINT64_MAX, align, seg);
    cur = add(st.offset, st.bytes);
  }
  p.step_local_base = align_up(cur, align);
  place_step_local(p.storages, step_local, p.step_local_base, align, seg, opt.reuse);
  uint64_t end = p.step_local_base;
  for (const Storage& st : p.storages) end = std::max(end, add(st.offset, st.bytes));
  p.arena_bytes = align_up(end, align);
  if (p.arena_bytes > opt.available_bytes)
    throw Error("plan: the step needs " + std::to_string(p.arena_bytes) + " bytes (" + gib(p.arena_bytes) +
                ") of memory, more than the " + std::to_string(opt.available_bytes) + " bytes (" +
                gib(opt.available_bytes) + ") available" +
                (opt.available_what.empty() ? std::string() : " (" + opt.available_what + ")") +
                "; use a smaller batch or model");

  // Report.
  MemoryReport& rep = p.report;
  for (int i = 0; i < n; ++i) {
    int s = p.storage_of[size_t(i)];
    if (s < 0 || a.is_view[size_t(i)]) continue;
    MemClass c = in_place_value_target[size_t(i)] >= 0 || into_target[size_t(i)] >= 0 ? MemClass::StepLocal
                                                                                       : p.storages[size_t(s)].cls;
    rep.per_class[int(c)].logical += a.bytes[size_t(i)];
  }
  for (const Storage& st : p.storages) {
    if (st.tensors.empty()) rep.per_class[int(st.cls)].logical += st.bytes;  // scratch, snapshots
    if (st.cls != MemClass::StepLocal) rep.per_class[int(st.cls)].physical += st.bytes;
  }
  rep.per_class[int(MemClass::StepLocal)].physical = p.arena_bytes - p.step_local_base;
  for (const ClassBytes& cb : rep.per_class) rep.logical += cb.logical;
  rep.physical = p.arena_bytes;
  std::vector<int64_t> live(size_t(L) + 2, 0);
  for (const Storage& st : p.storages)
    if (st.cls == MemClass::StepLocal) {
      live[size_t(st.first_group)] += int64_t(st.bytes);
      live[size_t(st.last_group) + 1] -= int64_t(st.bytes);
    }
  int64_t run = 0;
  for (size_t gi = 0; gi + 1 < live.size(); ++gi) {
    run += live[gi];
    rep.step_local_peak_live = std::max(rep.step_local_peak_live, uint64_t(run));
  }

  // Submissions: consecutive groups with about the same number of dispatches each, and as many as asked when the
  // step has that many groups (a boundary leaves a group for each submission after it, even when the last
  // groups hold most of the dispatches).
  int subs = std::max(1, std::min(opt.submissions, std::max(L, 1)));
  p.submission_begin.assign(1, 0);
  for (int s = 1; s < subs; ++s) {
    int target = int(int64_t(nd) * s / subs);
    int grp = p.submission_begin.back() + 1;
    while (grp < L && p.group_begin[size_t(grp)] < target) ++grp;
    grp = std::min(grp, L - (subs - s));
    p.submission_begin.push_back(grp);
  }
  p.submission_begin.push_back(L);
  p.planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace mgn::plan
