// Static plan tests: the CPU executor run through an aliasing memory plan equals the same graph run through a
// plan in which every tensor has memory of its own, bit for bit, on random DAGs and on Fashion-MNIST training
// steps; an independent brute-force checker proves that no two
// values overlap in memory while both are live and that no barrier group has a hazard; planning time and
// memory ratios are printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <set>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/graph.h"
#include "mgn/models.h"
#include "mgn/optim.h"
#include "plan/plan.h"
#include "support/test_util.h"
#ifdef MGN_HAVE_VULKAN
#include "backend/vulkan/graph_executor.h"
#endif

using namespace mgn;

namespace {

// ---- random DAGs of pointwise / reduction / matmul ops -------------------------------------------------

struct RandomDag {
  Graph g;
  std::vector<std::pair<std::string, Shape>> inputs;
};

RandomDag random_dag(uint64_t seed, int ops, bool gpu_safe = false, bool use_all = false) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  RandomDag r;
  Graph& g = r.g;
  const int64_t dims[] = {3, 4, 8};
  std::vector<Tensor> pool;
  std::vector<Tensor> params;
  int n_in = 2 + pick(2);
  for (int i = 0; i < n_in; ++i) {
    Shape s{dims[pick(3)], dims[pick(3)]};
    std::string name = "x" + std::to_string(i);
    pool.push_back(g.input(name, s));
    r.inputs.push_back({name, s});
  }
  int n_par = 1 + pick(3);
  for (int i = 0; i < n_par; ++i) {
    Shape s{dims[pick(3)], dims[pick(3)]};
    Tensor p = g.parameter("p" + std::to_string(i), s, Init::uniform(-1, 1, seed * 31 + uint64_t(i)));
    pool.push_back(p);
    params.push_back(p);
  }
  pool.push_back(g.full({1, 1}, 0.5));
  // Operands favour recent tensors (long chains) but reach back (long lifetimes).
  auto operand = [&]() -> Tensor {
    int n = int(pool.size());
    if (pick(3) == 0) return pool[size_t(pick(n))];
    return pool[size_t(std::max(0, n - 1 - pick(std::min(n, 6))))];
  };
  auto partner = [&](const Tensor& x) -> std::optional<Tensor> {  // something that broadcasts with x
    std::vector<Tensor> ok;
    for (const Tensor& t : pool) {
      const Shape &a = x.shape(), &b = t.shape();
      bool bc = a.size() == b.size();
      for (size_t k = 0; bc && k < a.size(); ++k) bc = a[k] == b[k] || b[k] == 1;
      if (bc) ok.push_back(t);
    }
    if (ok.empty()) return std::nullopt;
    return ok[size_t(pick(int(ok.size())))];
  };
  for (int k = 0; k < ops; ++k) {
    Tensor x = operand();
    Tensor y;
    int kind = pick(16);
    if (x.shape().size() != 2 && kind >= 9) kind = pick(9);
    switch (kind) {
      case 0: y = relu(x); break;
      case 1: y = tanh(x); break;
      case 2: y = sigmoid(x); break;
      case 3: y = neg(x); break;
      case 4: y = square(tanh(x)); break;
      case 5: y = exp(tanh(x)); break;
      case 6: y = x * 0.75; break;
      case 7:
      case 8: {
        auto p = partner(x);
        if (!p) continue;
        int op = pick(4);
        y = op == 0 ? x + *p : op == 1 ? x - *p : op == 2 ? x * *p : maximum(x, *p);
        break;
      }
      case 9: y = sum(x, {int64_t(pick(2))}, true); break;
      case 10: y = mean(x, {int64_t(pick(2))}, true); break;
      case 11: y = max(x, {1}, true); break;
      case 12: y = softmax(x, -1); break;
      case 13:
      case 14: {  // matmul with a tensor whose first dim matches
        std::vector<Tensor> ok;
        for (const Tensor& t : pool)
          if (t.shape().size() == 2 && t.shape()[0] == x.shape()[1]) ok.push_back(t);
        if (ok.empty()) continue;
        y = matmul(x, ok[size_t(pick(int(ok.size())))]);
        break;
      }
      case 15: {  // a view that is read later in its own shape
        Shape s = x.shape();
        y = reshape(x, {s[1], s[0]});
        if (pick(2)) y = reshape(tanh(y), {s[0], s[1]});
        break;
      }
    }
    pool.push_back(y);
  }
  // Outputs: the last tensor and a few others; sometimes one that shows a parameter.
  g.output("out0", pool.back());
  if (use_all) {  // every tensor nothing reads flows into one more output, so the whole graph is needed
    std::vector<int> users(size_t(g.ir().size()), 0);
    for (const ir::Node& nd : g.ir().nodes())
      for (int in : nd.inputs) users[size_t(in)]++;
    Tensor acc = g.scalar(0.0);
    for (const Tensor& t : pool)
      if (users[size_t(t.id())] == 0 && t.id() != pool.back().id()) acc = acc + sum(t);
    g.output("all", acc);
  }
  int n_out = pick(3);
  for (int i = 0; i < n_out; ++i) g.output("out" + std::to_string(i + 1), pool[size_t(pick(int(pool.size())))]);
  if (pick(3) == 0) g.output("grad.p0", tanh(pool[size_t(pick(int(pool.size())))]));
  if (!gpu_safe && pick(3) == 0) g.output("shows_p0", reshape(params[0], {-1}));
  // State updates: a parameter takes a function of itself and the graph (read before the update).
  std::set<size_t> assigned;
  for (size_t i = 0; i < params.size(); ++i) {
    if (pick(3) == 0) continue;
    assigned.insert(i);
    Tensor p = params[i];
    auto q = partner(p);
    Tensor v = q ? p * 0.9 + tanh(*q) * 0.1 : p * 0.5;
    assign(p, v);
  }
  // A parameter that takes another parameter's old value (needs a snapshot when that one is assigned too).
  if (!gpu_safe && params.size() >= 2 && params[0].shape() == params[1].shape() && !assigned.count(1) && pick(2))
    assign(params[1], params[0]);
  return r;
}

// ---- the independent checker ---------------------------------------------------------------------------

// Recomputes, from the graph and the plan's dispatches, groups and offsets only, where every value lives
// and when, and fails on any overlap of two live values or any hazard inside a barrier group.
void check_plan(const plan::Plan& p, const ir::Graph& g, uint64_t elem_bytes) {
  const int n = g.size();
  const int L = p.num_groups();
  const int INF = L + 1;
  auto bytes_of = [&](int id) { return uint64_t(numel(g.node(id).shape)) * elem_bytes; };
  // Value identity: a view (no dispatch, not a source) shows its input's value.
  std::vector<int> value(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    value[size_t(i)] = i;
    if (!p.needed[size_t(i)]) continue;
    const ir::Node& node = g.node(i);
    bool source = ir::op_info(node.op).archetype == ir::Archetype::Source;
    if (!source && p.dispatch_of[size_t(i)] < 0) {
      ASSERT_TRUE(node.op == ir::Op::Reshape || node.op == ir::Op::Assign) << g.describe(i);
      value[size_t(i)] = value[size_t(node.op == ir::Op::Assign ? node.inputs[1] : node.inputs[0])];
    }
  }
  // Dispatch order: groups ascending, every read after its producer's group.
  for (int d = 0; d < p.num_dispatches(); ++d) {
    if (d > 0) {
      ASSERT_LE(p.group_of[size_t(d - 1)], p.group_of[size_t(d)]);
    }
    for (int id : p.dispatches[size_t(d)].nodes) {
      ASSERT_EQ(p.dispatch_of[size_t(id)], d);
      for (int in : g.node(id).inputs) {
        int pd = p.dispatch_of[size_t(value[size_t(in)])];
        if (pd >= 0 && pd != d) {
          ASSERT_LT(p.group_of[size_t(pd)], p.group_of[size_t(d)]) << g.describe(id);
        }
      }
    }
  }
  for (int grp = 0; grp < L; ++grp)
    for (int d = p.group_begin[size_t(grp)]; d < p.group_begin[size_t(grp) + 1]; ++d) ASSERT_EQ(p.group_of[size_t(d)], grp);
  // In-place assigns, as the plan claims them.
  std::set<int> in_place_target, in_place_value;
  for (const plan::Commit& c : p.commits)
    if (c.in_place && value[size_t(g.node(c.assign).inputs[1])] != c.target) {
      in_place_target.insert(c.target);
      in_place_value.insert(value[size_t(g.node(c.assign).inputs[1])]);
    }
  // Live ranges of values: [start, end] in groups; -1 / INF for what persists across steps.
  struct Life {
    int start = 1 << 30, end = -1;
    uint64_t off = 0, bytes = 0;
    int producer = -1;  // dispatch
    std::vector<int> reader_dispatches;
    std::string what;
  };
  std::map<int, Life> lives;
  for (int i = 0; i < n; ++i) {
    if (!p.needed[size_t(i)] || value[size_t(i)] != i || p.storage_of[size_t(i)] < 0) continue;
    Life l;
    l.off = p.storages[size_t(p.storage_of[size_t(i)])].offset;
    l.bytes = bytes_of(i);
    l.what = g.describe(i);
    const ir::Node& node = g.node(i);
    if (ir::op_info(node.op).archetype == ir::Archetype::Source) {
      l.start = -1;
      l.end = INF;
    } else {
      l.producer = p.dispatch_of[size_t(i)];
      l.start = p.group_of[size_t(l.producer)];
    }
    lives[i] = l;
  }
  for (int d = 0; d < p.num_dispatches(); ++d)
    for (int id : p.dispatches[size_t(d)].nodes)
      for (int in : g.node(id).inputs) {
        if (p.dispatch_of[size_t(in)] == d) continue;
        auto it = lives.find(value[size_t(in)]);
        ASSERT_NE(it, lives.end()) << "a read of " << g.describe(in) << " has no memory";
        it->second.end = std::max(it->second.end, p.group_of[size_t(d)]);
        it->second.reader_dispatches.push_back(d);
      }
  for (auto& [name, id] : g.outputs()) lives.at(value[size_t(id)]).end = INF;
  for (int a : g.assigns()) lives.at(value[size_t(g.node(a).inputs[1])]).end = INF;
  for (int t : in_place_target) {  // the old value dies at its last reader; the new one persists
    Life& l = lives.at(t);
    l.end = -1;
    for (int d : l.reader_dispatches) l.end = std::max(l.end, p.group_of[size_t(d)]);
  }
  for (int v : in_place_value) ASSERT_EQ(lives.at(v).end, INF);
  // Scratch and snapshots are values too.
  int extra = -1;
  for (size_t s = 0; s < p.storages.size(); ++s) {
    const plan::Storage& st = p.storages[s];
    if (st.scratch_of < 0 && st.snapshot_of < 0) continue;
    Life l;
    l.off = st.offset;
    l.bytes = st.bytes;
    l.what = "storage s" + std::to_string(s);
    if (st.scratch_of >= 0) l.start = l.end = p.group_of[size_t(st.scratch_of)];
    else l.start = L, l.end = st.cls == plan::MemClass::StepLocal ? L : INF;
    lives[extra--] = l;
  }
  // Pairwise: overlapping memory needs disjoint lives, or an in-place handover inside one dispatch.
  std::vector<std::pair<int, const Life*>> all;
  for (auto& [id, l] : lives) all.push_back({id, &l});
  for (size_t x = 0; x < all.size(); ++x)
    for (size_t y = x + 1; y < all.size(); ++y) {
      const Life &a = *all[x].second, &b = *all[y].second;
      if (!a.bytes || !b.bytes) continue;
      if (a.off + a.bytes <= b.off || b.off + b.bytes <= a.off) continue;
      if (a.end < b.start || b.end < a.start) continue;
      auto handover = [&](const Life& u, const Life& v) {  // v written over u by u's last reader
        if (u.end != v.start || v.producer < 0) return false;
        for (int d : u.reader_dispatches)
          if (p.group_of[size_t(d)] == v.start && d != v.producer) return false;
        return u.off == v.off;
      };
      EXPECT_TRUE(handover(a, b) || handover(b, a))
          << a.what << " [" << a.start << ", " << a.end << "] @" << a.off << "+" << a.bytes << " overlaps " << b.what
          << " [" << b.start << ", " << b.end << "] @" << b.off << "+" << b.bytes;
    }
  // Inside a group, no dispatch writes memory another one reads or writes.
  for (int grp = 0; grp < L; ++grp) {
    struct Range {
      uint64_t lo, hi;
      int d;
      bool write;
    };
    std::vector<Range> rs;
    for (int d = p.group_begin[size_t(grp)]; d < p.group_begin[size_t(grp) + 1]; ++d) {
      for (int id : p.dispatches[size_t(d)].nodes) {
        if (p.storage_of[size_t(id)] >= 0) rs.push_back({p.offset_of(id), p.offset_of(id) + bytes_of(id), d, true});
        for (int in : g.node(id).inputs)
          if (p.dispatch_of[size_t(in)] != d) rs.push_back({p.offset_of(in), p.offset_of(in) + bytes_of(in), d, false});
      }
      for (int s : p.scratch_of[size_t(d)])
        rs.push_back({p.storages[size_t(s)].offset, p.storages[size_t(s)].offset + p.storages[size_t(s)].bytes, d, true});
    }
    for (size_t x = 0; x < rs.size(); ++x)
      for (size_t y = x + 1; y < rs.size(); ++y) {
        const Range &a = rs[x], &b = rs[y];
        if (a.d == b.d || !(a.write || b.write) || a.hi <= b.lo || b.hi <= a.lo || a.lo == a.hi || b.lo == b.hi) continue;
        ADD_FAILURE() << "group " << grp << ": dispatches " << a.d << " and " << b.d << " touch the same memory";
      }
  }
  // The planner's own storages: intersecting lifetimes never share memory.
  for (size_t x = 0; x < p.storages.size(); ++x)
    for (size_t y = x + 1; y < p.storages.size(); ++y) {
      const plan::Storage &a = p.storages[x], &b = p.storages[y];
      int a0 = is_pinned(a.cls) ? -1 : a.first_group, a1 = is_pinned(a.cls) ? INF : a.last_group;
      int b0 = is_pinned(b.cls) ? -1 : b.first_group, b1 = is_pinned(b.cls) ? INF : b.last_group;
      if (a1 < b0 || b1 < a0 || !a.bytes || !b.bytes) continue;
      EXPECT_TRUE(a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset) << "storages " << x << " and " << y;
    }
  for (const plan::Storage& st : p.storages) {
    EXPECT_EQ(st.offset % p.alignment, 0u);
    EXPECT_LE(st.offset + st.bytes, p.arena_bytes);
    if (p.segment_bytes && st.bytes) {
      EXPECT_EQ(st.offset / p.segment_bytes, (st.offset + st.bytes - 1) / p.segment_bytes);
    }
  }
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

void expect_same_run(cpu::Executor& plain, cpu::Executor& planned, const ir::Graph& g, const std::string& what) {
  for (auto& [name, id] : g.outputs())
    EXPECT_TRUE(same_bits(plain.output(name).v, planned.output(name).v)) << what << ": output " << name;
  for (const std::string& s : plain.state_names())
    EXPECT_TRUE(same_bits(plain.state(s), planned.state(s))) << what << ": state " << s;
}

plan::PlanOptions random_options(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  plan::PlanOptions o;
  const uint64_t aligns[] = {8, 64, 256};
  o.alignment = aligns[rng() % 3];
  o.in_place = rng() % 4 != 0;
  o.in_place_assign = rng() % 4 != 0;
  o.reuse = rng() % 8 != 0;
  o.sink = rng() % 4 != 0;
  o.submissions = 1 + int(rng() % 3);
  if (rng() % 3 == 0) o.segment_bytes = 2048;
  if (rng() % 4 == 0)  // scratch for matmuls: must not collide with anything live in their group
    o.scratch_bytes = [](const ir::Graph& g, const plan::Dispatch& d) {
      return g.node(d.nodes[0]).op == ir::Op::MatMul ? std::vector<uint64_t>{96} : std::vector<uint64_t>{};
    };
  return o;
}

// Fuses single-input pointwise nodes into their producer's dispatch when the producer has no other reader.
std::vector<plan::Dispatch> fused_dispatches(const ir::Graph& g) {
  const int n = g.size();
  std::vector<bool> need(size_t(n), false);
  for (auto& [name, id] : g.outputs()) need[size_t(id)] = true;
  for (int id : g.assigns()) need[size_t(id)] = true;
  for (int id : g.parameters()) need[size_t(id)] = true;
  for (int i = n - 1; i >= 0; --i)
    if (need[size_t(i)])
      for (int in : g.node(i).inputs) need[size_t(in)] = true;
  std::vector<int> users(size_t(n), 0);
  for (int i = 0; i < n; ++i)
    if (need[size_t(i)])
      for (int in : g.node(i).inputs) users[size_t(in)]++;
  std::vector<int> disp_of(size_t(n), -1);
  std::vector<plan::Dispatch> ds;
  for (int i = 0; i < n; ++i) {
    const ir::Node& node = g.node(i);
    ir::Archetype arch = ir::op_info(node.op).archetype;
    if (!need[size_t(i)] || arch == ir::Archetype::Source || node.op == ir::Op::Reshape || node.op == ir::Op::Assign)
      continue;
    if (arch == ir::Archetype::Pointwise && node.inputs.size() == 1) {
      int in = node.inputs[0];
      if (disp_of[size_t(in)] >= 0 && users[size_t(in)] == 1) {
        ds[size_t(disp_of[size_t(in)])].nodes.push_back(i);
        disp_of[size_t(i)] = disp_of[size_t(in)];
        continue;
      }
    }
    disp_of[size_t(i)] = int(ds.size());
    ds.push_back({{i}});
  }
  return ds;
}

void feed(cpu::Executor& e, const RandomDag& r, uint64_t seed) {
  for (size_t i = 0; i < r.inputs.size(); ++i)
    e.set_input(r.inputs[i].first, test::random_normal(size_t(numel(r.inputs[i].second)), seed + i));
}

}  // namespace

TEST(Plan, RandomDagsAliasedEqualsSeparateMemoryOnCpu) {
  int in_place = 0, in_place_assigns = 0, snapshots = 0, fused = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    RandomDag r = random_dag(seed, 12 + int(seed % 40));
    const ir::Graph& g = r.g.ir();
    plan::PlanOptions po = random_options(seed);
    if (seed % 5 == 0) {
      po.dispatches = fused_dispatches(g);
      fused++;
    }
    cpu::Executor plain(g, {.plan = test::separate_memory_plan()});
    cpu::Executor planned(g, {.plan = po});
    const plan::Plan& p = planned.plan();
    SCOPED_TRACE("seed " + std::to_string(seed) + "\n" + plan::to_text(p, g));
    check_plan(p, g, sizeof(double));
    for (int step = 0; step < 3; ++step) {
      feed(plain, r, seed * 100 + uint64_t(step));
      feed(planned, r, seed * 100 + uint64_t(step));
      plain.run();
      planned.run();
      expect_same_run(plain, planned, g, "step " + std::to_string(step));
    }
    for (int i = 0; i < g.size(); ++i) in_place += p.in_place_of[size_t(i)];
    for (const plan::Commit& c : p.commits) in_place_assigns += c.in_place;
    snapshots += int(p.snapshots.size());
    if (HasFailure()) break;
  }
  std::printf("random DAGs: %d in-place results, %d in-place assigns, %d snapshots, %d fused lists\n", in_place,
              in_place_assigns, snapshots, fused);
  EXPECT_GT(in_place, 0);
  EXPECT_GT(in_place_assigns, 0);
  EXPECT_GT(snapshots, 0);
}

TEST(Plan, ChainRunsInPlaceAndUpdatesInPlace) {
  Graph g;
  Tensor x = g.input("x", {4, 8});
  Tensor w = g.parameter("w", {8, 8}, Init::uniform(-1, 1, 3));
  Tensor h = sigmoid(tanh(relu(matmul(x, w))));
  g.output("y", h);
  assign(w, w - sum(h, {0}, false) * 0.1);  // broadcast [8] over [8, 8]
  plan::Plan p = plan::make_plan(g.ir());
  check_plan(p, g.ir(), 4);
  EXPECT_TRUE(p.in_place_of[size_t(h.id())] == false);  // an output is pinned: never written in place
  int in_place = 0;
  for (bool b : p.in_place_of) in_place += b;
  EXPECT_EQ(in_place, 3);  // relu over matmul, tanh over relu, the update's scale over the sum; sigmoid is an output
  ASSERT_EQ(p.commits.size(), 1u);
  EXPECT_TRUE(p.commits[0].in_place);
  std::string text = plan::to_text(p, g.ir());
  for (const char* want : {"group 0", "storages", "in place", "memory", "parameter", "step-local"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  EXPECT_LT(p.report.per_class[int(plan::MemClass::StepLocal)].physical,
            p.report.per_class[int(plan::MemClass::StepLocal)].logical);
}

TEST(Plan, OutputShowingAnAssignedParameterReadsTheOldValue) {
  Graph g;
  Tensor w = g.parameter("w", {3, 4}, Init::uniform(-1, 1, 5));
  Tensor v = g.parameter("v", {3, 4}, Init::uniform(-1, 1, 6));
  g.output("w_flat", reshape(w, {-1}));
  g.output("v", v);
  assign(w, w * 2.0);
  assign(v, w);  // takes w's old value while w changes too
  cpu::Executor plain(g.ir(), {.plan = test::separate_memory_plan()});
  cpu::Executor planned(g.ir(), {.plan = plan::PlanOptions{}});
  check_plan(planned.plan(), g.ir(), sizeof(double));
  EXPECT_EQ(planned.plan().snapshots.size(), 3u);  // w for the output, v for the output, w for v's commit
  for (int i = 0; i < 2; ++i) {
    plain.run();
    planned.run();
    expect_same_run(plain, planned, g.ir(), "step " + std::to_string(i));
  }
}

TEST(Plan, ErrorsNameTheProblem) {
  Graph g;
  Tensor x = g.input("x", {64, 64});
  g.output("y", relu(x));
  plan::PlanOptions o;
  o.max_binding_bytes = 1024;
  try {
    plan::make_plan(g.ir(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("binding"), std::string::npos) << e.what();
  }
  plan::PlanOptions bad;
  bad.dispatches = {{{x.id()}}};
  EXPECT_THROW(plan::make_plan(g.ir(), bad), Error);  // a source in a dispatch
  bad.dispatches = {};
  bad.alignment = 48;
  EXPECT_THROW(plan::make_plan(g.ir(), bad), Error);
}

namespace {

struct TrainGraph {
  Graph g;
  UpdatePlan update;
};

TrainGraph fashion_train(models::FashionArch arch, int64_t batch, const Optimizer& opt) {
  TrainGraph t;
  t.g = models::fashion_mnist({.arch = arch, .batch = batch, .mode = Mode::Train, .seed = 7});
  Tensor loss(&t.g.ir(), *t.g.ir().find_output("loss"));
  Gradients grads = backward(t.g, loss);
  t.update = append_optimizer(t.g, grads.params, opt);
  t.g.verify();
  return t;
}

void feed_train(cpu::Executor& e, const TrainGraph& t, int64_t batch, int step) {
  e.set_input("x", test::random_uniform(size_t(batch * 28 * 28), 11 + uint64_t(step), 0, 1));
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) labels[size_t(i)] = int32_t((i * 7 + step) % 10);
  e.set_input("labels", labels);
  std::vector<float> sc = t.update.scalar_inputs(1e-3, step);
  for (size_t i = 0; i < sc.size(); ++i) e.set_input(t.update.inputs[i], std::vector<double>{sc[i]});
}

void print_ratio(const char* what, const plan::Plan& p) {
  const plan::MemoryReport& r = p.report;
  const auto& sl = r.per_class[int(plan::MemClass::StepLocal)];
  std::printf("%s: %d dispatches, %d groups; physical/logical total %.3f (%llu / %llu bytes), step-local %.3f "
              "(peak live %llu), planned in %.2f ms\n",
              what, p.num_dispatches(), p.num_groups(), double(r.physical) / double(r.logical),
              (unsigned long long)r.physical, (unsigned long long)r.logical, double(sl.physical) / double(sl.logical),
              (unsigned long long)r.step_local_peak_live, p.planning_ms);
}

}  // namespace

TEST(Plan, FashionMnistTrainingStepsAliasedEqualsSeparateMemory) {
  struct Case {
    models::FashionArch arch;
    int64_t batch;
    Optimizer opt;
  };
  for (const Case& c : {Case{models::FashionArch::Mlp, 16, AdamW{.lr = 1e-3}},
                        Case{models::FashionArch::Mlp, 8, SGD{.lr = 0.1, .momentum = 0.9}},
                        Case{models::FashionArch::Cnn, 4, AdamW{.lr = 1e-3}}}) {
    TrainGraph t = fashion_train(c.arch, c.batch, c.opt);
    const ir::Graph& g = t.g.ir();
    std::string what = std::string(models::fashion_arch_name(c.arch)) + " " + optimizer_name(c.opt) + " batch " +
                       std::to_string(c.batch);
    cpu::Executor plain(g, {.plan = test::separate_memory_plan()});
    cpu::Executor planned(g, {.plan = plan::PlanOptions{}});
    check_plan(planned.plan(), g, sizeof(double));
    for (int step = 0; step < 2; ++step) {
      feed_train(plain, t, c.batch, step);
      feed_train(planned, t, c.batch, step);
      plain.run();
      planned.run();
      expect_same_run(plain, planned, g, what + " step " + std::to_string(step));
    }
    print_ratio((what + " (CPU plan, f64 slots)").c_str(), planned.plan());
  }
}

TEST(Plan, FashionMnistTrainingMemoryReport) {
  // The plan a GPU backend gets: 4-byte elements, 256-byte alignment, batch 64.
  for (models::FashionArch arch : {models::FashionArch::Mlp, models::FashionArch::Cnn}) {
    TrainGraph t = fashion_train(arch, 64, AdamW{.lr = 1e-3});
    plan::PlanOptions o;
    o.tensor_bytes = [](const ir::Node& n) { return uint64_t(std::max<int64_t>(numel(n.shape), 1)) * 4; };
    plan::Plan p = plan::make_plan(t.g.ir(), o);
    check_plan(p, t.g.ir(), 4);
    std::string what = std::string("fashion-mnist ") + models::fashion_arch_name(arch) + " AdamW batch 64";
    print_ratio(what.c_str(), p);
    std::printf("%s", plan::report_text(p).c_str());
    plan::PlanOptions none = o;
    none.reuse = none.in_place = none.in_place_assign = false;
    plan::Plan q = plan::make_plan(t.g.ir(), none);
    print_ratio((what + ", no reuse").c_str(), q);
    EXPECT_LT(p.arena_bytes, q.arena_bytes);
  }
}

TEST(Plan, PlanningTimeOf5000NodeGraphs) {
  // A random DAG and a deep MLP training step (backward + AdamW), both over 5,000 nodes.
  RandomDag r = random_dag(12345, 2800, false, true);
  Graph deep;
  {
    Tensor x = deep.input("x", {32, 64});
    Tensor labels = deep.input("labels", {32}, DType::I32);
    Tensor h = x;
    for (int l = 0; l < 120; ++l) {
      Tensor w = deep.parameter("w" + std::to_string(l), {64, 64}, Init::uniform(-0.1, 0.1, uint64_t(l)));
      Tensor b = deep.parameter("b" + std::to_string(l), {64}, Init::zeros());
      h = gelu(matmul(h, w) + b) + h;
    }
    Tensor loss = cross_entropy(h, labels);
    deep.output("loss", loss);
    Gradients grads = backward(deep, loss);
    append_optimizer(deep, grads.params, AdamW{.lr = 1e-3});
  }
  for (auto* gp : {&r.g.ir(), &deep.ir()}) {
    const ir::Graph& g = *gp;
    EXPECT_GE(g.size(), 5000);
    plan::Plan p = plan::make_plan(g);  // warm
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      p = plan::make_plan(g);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("planning %d nodes (%s): %.2f ms (best of 5), %d dispatches in %d groups, %zu storages, "
                "physical/logical %.3f\n",
                g.size(), gp == &deep.ir() ? "deep MLP training step" : "random DAG", best, p.num_dispatches(),
                p.num_groups(), p.storages.size(), double(p.report.physical) / double(p.report.logical));
    check_plan(p, g, 0);  // offsets/lifetimes only (bytes 0 skips the value overlap check: too many pairs)
  }
}

#ifdef MGN_HAVE_VULKAN
// The Vulkan executor from the plan (one arena, in place, barriers only between groups) against its
// one-buffer-per-tensor path: the same kernels on the same inputs, so results must be bitwise equal.
TEST(PlanVulkan, RandomDagsAliasedEqualsSeparateMemory) {
  std::unique_ptr<vk::Context> ctx;
  try {
    ctx = std::make_unique<vk::Context>(test::device_options());
  } catch (const Error& e) {
    GTEST_SKIP() << "no Vulkan device: " << e.what();
  }
  size_t barriers_planned = 0, barriers_separate = 0;
  uint64_t arena = 0, separate_bytes = 0;
  int in_place = 0, in_place_assigns = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    RandomDag r = random_dag(seed + 1000, 10 + int(seed % 20));
    const ir::Graph& g = r.g.ir();
    SCOPED_TRACE("seed " + std::to_string(seed + 1000) + "\n" + ir::to_text(g));
    vk::GraphExecutorOptions po;
    po.poison = true;
    plan::PlanOptions ro = random_options(seed);
    po.plan.in_place = ro.in_place;
    po.plan.in_place_assign = ro.in_place_assign;
    po.plan.reuse = ro.reuse;
    po.plan.sink = ro.sink;
    vk::GraphExecutorOptions uo = po;
    uo.plan = test::separate_memory_plan();
    vk::GraphExecutor planned(g, *ctx, po), plain(g, *ctx, uo);
    check_plan(planned.plan(), g, 4);
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        std::vector<double> v = test::random_normal(size_t(numel(r.inputs[i].second)), seed * 100 + uint64_t(step) + i);
        std::vector<float> f(v.begin(), v.end());
        planned.set_input(r.inputs[i].first, f);
        plain.set_input(r.inputs[i].first, f);
      }
      planned.run();
      plain.run();
      auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      };
      for (auto& [name, id] : g.outputs())
        EXPECT_TRUE(same(planned.read_output(name), plain.read_output(name))) << "step " << step << " output " << name;
      for (const std::string& s : plain.state_names())
        EXPECT_TRUE(same(planned.read_state(s), plain.read_state(s))) << "step " << step << " state " << s;
    }
    barriers_planned += planned.compile_stats().barriers;
    barriers_separate += plain.compile_stats().barriers;
    arena += planned.compile_stats().arena_bytes;
    for (int i = 0; i < g.size(); ++i) {
      if (planned.plan().storage_of[size_t(i)] >= 0 && planned.plan().dispatch_of[size_t(i)] >= 0)
        separate_bytes += uint64_t(numel(g.node(i).shape)) * 4;
      in_place += planned.plan().in_place_of[size_t(i)];
    }
    for (const plan::Commit& c : planned.plan().commits) in_place_assigns += c.in_place;
    EXPECT_EQ(ctx->validation_message_count(), 0u);
    for (const auto& m : ctx->validation_messages()) ADD_FAILURE() << m;
    ctx->clear_validation_messages();
    if (HasFailure()) break;
  }
  std::printf("vulkan random DAGs: %zu barriers aliased vs %zu with separate memory; %d in-place results, %d in-place "
              "assigns; arenas %llu bytes in all (computed tensors alone %llu bytes)\n",
              barriers_planned, barriers_separate, in_place, in_place_assigns, (unsigned long long)arena,
              (unsigned long long)separate_bytes);
}

TEST(PlanVulkan, FashionTrainingStepsAliasedEqualsSeparateMemory) {
  std::unique_ptr<vk::Context> ctx;
  try {
    ctx = std::make_unique<vk::Context>(test::device_options());
  } catch (const Error& e) {
    GTEST_SKIP() << "no Vulkan device: " << e.what();
  }
  for (models::FashionArch arch : {models::FashionArch::Mlp, models::FashionArch::Cnn}) {
    const int64_t batch = arch == models::FashionArch::Mlp ? 16 : 4;
    TrainGraph t = fashion_train(arch, batch, AdamW{.lr = 1e-3});
    const ir::Graph& g = t.g.ir();
    vk::GraphExecutorOptions po;
    po.poison = true;
    vk::GraphExecutorOptions uo = po;
    uo.plan = test::separate_memory_plan();
    vk::GraphExecutor planned(g, *ctx, po), plain(g, *ctx, uo);
    check_plan(planned.plan(), g, 4);
    for (int step = 0; step < 2; ++step) {
      std::vector<double> x = test::random_uniform(size_t(batch * 28 * 28), 11 + uint64_t(step), 0, 1);
      std::vector<float> xf(x.begin(), x.end());
      std::vector<int32_t> labels(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) labels[size_t(i)] = int32_t((i * 7 + step) % 10);
      std::vector<float> sc = t.update.scalar_inputs(1e-3, step);
      for (vk::GraphExecutor* e : {&planned, &plain}) {
        e->set_input("x", xf);
        e->set_input("labels", labels);
        for (size_t i = 0; i < sc.size(); ++i) e->set_input(t.update.inputs[i], std::vector<float>{sc[i]});
        e->run();
      }
      for (auto& [name, id] : g.outputs()) EXPECT_EQ(planned.read_output(name), plain.read_output(name)) << name;
      for (const std::string& s : plain.state_names()) EXPECT_EQ(planned.read_state(s), plain.read_state(s)) << s;
    }
    EXPECT_EQ(ctx->validation_message_count(), 0u);
    for (const auto& m : ctx->validation_messages()) ADD_FAILURE() << m;
    ctx->clear_validation_messages();
    std::printf("vulkan %s training step: %zu barriers aliased (%zu groups) vs %zu with separate memory; arena %llu bytes\n",
                models::fashion_arch_name(arch), planned.compile_stats().barriers, planned.compile_stats().groups,
                plain.compile_stats().barriers, (unsigned long long)planned.compile_stats().arena_bytes);
  }
}
#endif
