// Text dump of a plan: dispatches by barrier group, storages with lifetimes and offsets, end-of-step copies,
// and the memory report (logical vs physical bytes per class).
#include <cstdio>

#include "plan/plan.h"

namespace mgn::plan {

namespace {

std::string human(uint64_t b) {
  char buf[64];
  if (b < 10 * 1024) std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  else if (b < 10ull * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else if (b < 10ull * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string hex(uint64_t x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%08llx", (unsigned long long)x);
  return buf;
}

std::string node_label(const ir::Graph& g, int id) {
  const ir::Node& n = g.node(id);
  std::string s = "%" + std::to_string(id) + " " + ir::op_name(n.op);
  if (!n.name.empty()) s += " '" + n.name + "'";
  return s;
}

std::string group_str(int grp, int num_groups) { return grp >= num_groups ? "end" : std::to_string(grp); }

}  // namespace

std::string report_text(const Plan& p) {
  const MemoryReport& r = p.report;
  std::string s = "memory (logical = sum of tensors, physical = arena after aliasing)\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "  %-11s %14s %14s %7s\n", "class", "logical", "physical", "ratio");
  s += buf;
  auto line = [&](const char* name, uint64_t lo, uint64_t ph) {
    char ratio[16] = "-";
    if (lo) std::snprintf(ratio, sizeof ratio, "%.3f", double(ph) / double(lo));
    std::snprintf(buf, sizeof buf, "  %-11s %14s %14s %7s\n", name, human(lo).c_str(), human(ph).c_str(), ratio);
    s += buf;
  };
  for (int c = 0; c < kMemClassCount; ++c)
    if (r.per_class[c].logical || r.per_class[c].physical)
      line(mem_class_name(MemClass(c)), r.per_class[c].logical, r.per_class[c].physical);
  line("total", r.logical, r.physical);
  s += "  step-local peak live " + human(r.step_local_peak_live) + " (lower bound for step-local physical)\n";
  return s;
}

std::string to_text(const Plan& p, const ir::Graph& g) {
  std::string s;
  const int L = p.num_groups();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "plan: %d dispatches in %d barrier groups, %d submission(s), %zu storages, arena %s "
                "(alignment %llu), planned in %.2f ms\n",
                p.num_dispatches(), L, int(p.submission_begin.size()) - 1, p.storages.size(),
                human(p.arena_bytes).c_str(), (unsigned long long)p.alignment, p.planning_ms);
  s += buf;
  size_t sub = 0;
  for (int grp = 0; grp < L; ++grp) {
    if (sub + 1 < p.submission_begin.size() && p.submission_begin[sub] == grp && p.submission_begin.size() > 2)
      s += "submission " + std::to_string(sub++) + "\n";
    s += "group " + std::to_string(grp) + "\n";
    for (int d = p.group_begin[size_t(grp)]; d < p.group_begin[size_t(grp) + 1]; ++d) {
      const Dispatch& disp = p.dispatches[size_t(d)];
      for (size_t k = 0; k < disp.nodes.size(); ++k) {
        int id = disp.nodes[k];
        const ir::Node& n = g.node(id);
        std::string head = k == 0 ? "d" + std::to_string(d) : "";
        std::string ins;
        for (int in : n.inputs) ins += (ins.empty() ? "" : ", ") + ("%" + std::to_string(in));
        std::string where = "(internal)";
        int st = p.storage_of[size_t(id)];
        if (st >= 0)
          where = "s" + std::to_string(st) + " @" + hex(p.storages[size_t(st)].offset) +
                  (p.in_place_of[size_t(id)] ? " in place" : "");
        std::snprintf(buf, sizeof buf, "  %-6s %s (%s) %s %s -> %s\n", head.c_str(), node_label(g, id).c_str(),
                      ins.c_str(), shape_str(n.shape).c_str(), dtype_name(n.dtype), where.c_str());
        s += buf;
      }
      for (int sc : p.scratch_of[size_t(d)])
        s += "         scratch s" + std::to_string(sc) + " @" + hex(p.storages[size_t(sc)].offset) + " " +
             human(p.storages[size_t(sc)].bytes) + "\n";
    }
  }
  s += "end of step\n";
  for (const Copy& c : p.snapshots)
    s += "  snapshot s" + std::to_string(c.src_storage) + " -> s" + std::to_string(c.dst_storage) + " (" +
         human(c.bytes) + ")\n";
  for (const Commit& c : p.commits) {
    s += "  commit " + node_label(g, c.assign) + " -> '" + g.node(c.target).name + "': ";
    s += c.in_place ? std::string("in place, no copy\n")
                    : "copy s" + std::to_string(c.src_storage) + " -> s" + std::to_string(c.dst_storage) + " (" +
                          human(c.bytes) + ")\n";
  }
  s += "storages (lifetimes in groups, inclusive; end = through the commits)\n";
  for (size_t i = 0; i < p.storages.size(); ++i) {
    const Storage& st = p.storages[i];
    std::string life = is_pinned(st.cls) ? "whole step" : "[" + group_str(st.first_group, L) + ", " +
                                                              group_str(st.last_group, L) + "]";
    std::string what;
    if (st.scratch_of >= 0) what = "scratch of d" + std::to_string(st.scratch_of);
    if (st.snapshot_of >= 0) what = "snapshot of %" + std::to_string(st.snapshot_of);
    for (int t : st.tensors) {
      if (!what.empty()) what += ", ";
      what += "%" + std::to_string(t);
      const ir::Node& n = g.node(t);
      if (!n.name.empty() && (n.op == ir::Op::Parameter || n.op == ir::Op::Input)) what += " '" + n.name + "'";
      if (p.in_place_of[size_t(t)]) what += " (in place)";
      else if (p.dispatch_of[size_t(t)] < 0 && ir::op_info(n.op).archetype != ir::Archetype::Source) what += " (view)";
    }
    std::snprintf(buf, sizeof buf, "  s%-4zu %-10s @%s %10s  %-14s ", i, mem_class_name(st.cls),
                  hex(st.offset).c_str(), human(st.bytes).c_str(), life.c_str());
    s += buf + what + "\n";
  }
  s += report_text(p);
  return s;
}

}  // namespace mgn::plan
