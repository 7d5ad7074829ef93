// Fusion: which nodes of a graph share one dispatch (find_fusions), and which lowering a dispatch of several
// nodes takes (lower_dispatch: the pointwise fusion kernel is in fusion_pointwise.cpp, the two attention
// fusions in attention.cpp, the rope group in pointwise.cpp).
//
// Grouping is one pass in node (topological) order that keeps an ASAP level per group, every source at -1
// and every group above all groups it reads. A merge gives the merged group the level its outside inputs
// allow and is refused when that would make a group's value later than one of its outside readers can
// wait for (a reader whose level is not above the new one). So every dependency between two groups still
// goes strictly upwards in level: the dispatch graph stays acyclic and no dependency level is added. Merges
// are (1) a pointwise node into the groups of its same-shape pointwise producers, (2) after that, the
// same-shape pointwise groups one group reads from outside into one (the per-tensor scalars of an optimizer),
// (3) attention_grad_v with the attention_grad_k of the same inputs (and attention with attention_lse), (4)
// GEMV siblings, GEMV and tiled-GEMM epilogues and norm prologues, grouped GEMMs (kernel.h), (5) a rope
// with the head-split permute it reads through, and two ropes of the same tables, and (6) the head merge of
// an attention's o into the attention's kernel.
#include <algorithm>
#include <map>
#include <set>

#include "codegen/glsl.h"

namespace mgn::codegen {

bool pointwise_fusible(const ir::Node& n) {
  // Rope reads its input at other elements (the rotated partner), so it cannot take a register operand.
  return ir::op_info(n.op).archetype == ir::Archetype::Pointwise && n.op != ir::Op::Rope &&
         numel(n.shape) > 0;
}

namespace {

bool is_attention_grad_kv(const ir::Node& n) {
  return n.op == ir::Op::AttentionGradK || n.op == ir::Op::AttentionGradV;
}
bool is_attention_forward(const ir::Node& n) {
  return n.op == ir::Op::Attention || n.op == ir::Op::AttentionLse;
}

struct Group {
  std::vector<int> members;  // ascending after every merge
  int level = 0;
  bool pointwise = false;  // every member is pointwise_fusible (then all share one shape)
  bool epilogue = false;   // one GEMV-eligible matmul and pointwise nodes of its shape (a GEMV epilogue)
  int prologue = -1;       // the left operand its GEMV matmuls read, computed in the group (norm or pointwise)
  bool has_epilogue = false;
  size_t epilogue_room = 0;  // how many pointwise nodes its matmul's epilogue may take (when `epilogue`)
  bool alive = true;
};

class Grouper {
 public:
  Grouper(const ir::Graph& g, const std::vector<bool>& needed, const std::vector<int>& pinned,
          const DeviceCaps& caps, const FusionOptions& opt)
      : g_(g), needed_(needed), caps_(caps), opt_(opt), n_(g.size()) {
    root_.resize(size_t(n_));
    users_.assign(size_t(n_), {});
    kept_.assign(size_t(n_), false);
    gid_.assign(size_t(n_), -1);
    for (int i = 0; i < n_; ++i) {
      const ir::Node& node = g.node(i);
      root_[size_t(i)] = node.op == ir::Op::Reshape ? root_[size_t(node.inputs[0])] : i;
      if (!needed_[size_t(i)]) continue;
      for (int in : node.inputs)
        if (std::find(users_[size_t(in)].begin(), users_[size_t(in)].end(), i) == users_[size_t(in)].end())
          users_[size_t(in)].push_back(i);
    }
    for (auto& [name, id] : g.outputs()) kept_[size_t(id)] = true;
    for (int id : pinned)
      if (id >= 0 && id < n_) kept_[size_t(id)] = true;
  }

  std::vector<std::vector<int>> run() {
    // (inputs, attrs) -> the first node of a pair still waiting for its partner: dK / dV, and o / lse.
    std::map<std::pair<std::vector<int>, std::string>, int> attention_open, forward_open;
    std::map<std::string, int> gemv_open;  // GEMV sibling key -> a node of the group still open to siblings
    std::map<std::string, int> gemm_open;  // grouped-GEMM key -> likewise
    std::map<std::pair<int, int>, int> rope_open;  // (cos, sin) -> a rope still waiting for its partner
    for (int i = 0; i < n_; ++i) {
      if (!needed_[size_t(i)]) continue;
      const ir::Node& node = g_.node(i);
      const ir::Archetype arch = ir::op_info(node.op).archetype;
      if (arch == ir::Archetype::Source || arch == ir::Archetype::State || node.op == ir::Op::Reshape)
        continue;
      int gi = new_group(i);
      if (opt_.pointwise && groups_[size_t(gi)].pointwise) gi = join_producers(i, gi);
      if (opt_.pointwise && (opt_.gemv || opt_.gemm_epilogues) && groups_[size_t(gi)].pointwise)
        gi = join_epilogue(i, gi);
      if (opt_.attention && is_attention_grad_kv(node) && numel(node.shape) > 0)
        gi = pair_attention(i, gi, attention_open);
      if (opt_.attention && is_attention_forward(node) && numel(node.shape) > 0)
        gi = pair_attention(i, gi, forward_open);
      if (opt_.attention && node.op == ir::Op::Permute) gi = join_head_merge(i, gi);
      if (opt_.pointwise && node.op == ir::Op::Rope && numel(node.shape) > 0) {
        gi = join_rope_permute(i, gi);
        gi = pair_rope(i, gi, rope_open);
      }
      if (opt_.gemv && node.op == ir::Op::MatMul && numel(node.shape) > 0) {
        gi = join_norm_prologue(i, gi, gemv_open);
        gi = join_pointwise_prologue(i, gi, gemv_open);
        gi = join_siblings(i, gi, gemv_open, gemv_sibling_key(g_, node), kMaxGemvSiblings);
      }
      if (opt_.gemm_siblings && node.op == ir::Op::MatMul)
        gi = join_siblings(i, gi, gemm_open, gemm_sibling_key(g_, node, caps_, *opt_.gemm_siblings), kMaxGemmSiblings);
      if (opt_.pointwise) merge_siblings(gi);
    }
    split_unfinished_prologues();
    std::vector<std::vector<int>> out;
    for (const Group& gr : groups_)
      if (gr.alive && gr.members.size() > 1) out.push_back(gr.members);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  int level_of(int x) const {
    int r = root_[size_t(x)];
    return gid_[size_t(r)] < 0 ? -1 : groups_[size_t(gid_[size_t(r)])].level;
  }

  int new_group(int i) {
    Group gr;
    gr.members = {i};
    gr.pointwise = pointwise_fusible(g_.node(i));
    gr.epilogue_room = opt_.gemv && !gemv_sibling_key(g_, g_.node(i)).empty() ? opt_.max_nodes
                       : opt_.gemm_epilogues ? tiled_gemm_epilogue_room(g_, g_.node(i), caps_, *opt_.gemm_epilogues) : 0;
    gr.epilogue = gr.epilogue_room > 0;
    int lv = -1;
    for (int in : g_.node(i).inputs) lv = std::max(lv, level_of(in));
    gr.level = lv + 1;
    groups_.push_back(gr);
    gid_[size_t(i)] = int(groups_.size()) - 1;
    return gid_[size_t(i)];
  }

  // The level the union of `set` would have, or -1 when the union is not allowed: a member read inside
  // the union through a view, too many nodes or bindings, or an outside reader that could not wait.
  int merged_level(const std::set<int>& set) const {
    std::vector<int> members;
    for (int gi : set)
      members.insert(members.end(), groups_[size_t(gi)].members.begin(), groups_[size_t(gi)].members.end());
    if (members.size() > opt_.max_nodes) return -1;
    auto inside = [&](int x) { return gid_[size_t(x)] >= 0 && set.count(gid_[size_t(x)]) > 0; };
    int lv = -1;
    std::set<int> ext;
    size_t stored = 0;
    for (int m : members) {
      for (int in : g_.node(m).inputs) {
        int r = root_[size_t(in)];
        if (inside(r)) {
          if (r != in) return -1;  // a view of a member: it would read memory the same kernel writes
          continue;
        }
        lv = std::max(lv, level_of(in));
        ext.insert(in);
      }
      bool out = kept_[size_t(m)];
      for (int u : users_[size_t(m)]) out = out || !inside(u);
      stored += out;
    }
    if (ext.size() + stored + 1 > caps_.max_storage_buffers) return -1;  // + 1: a scratch buffer (dK+dV)
    const int level = lv + 1;
    // Outside readers (nodes already grouped) of a group whose value would come later must be above it.
    for (int gi : set) {
      if (groups_[size_t(gi)].level >= level) continue;
      for (int m : groups_[size_t(gi)].members)
        if (!reader_ok(m, set, level)) return -1;
    }
    return level;
  }

  // Every grouped reader of x outside `set` (through views too) has a level above `level`.
  bool reader_ok(int x, const std::set<int>& set, int level) const {
    for (int u : users_[size_t(x)]) {
      const ir::Node& un = g_.node(u);
      if (un.op == ir::Op::Reshape) {
        if (!reader_ok(u, set, level)) return false;
        continue;
      }
      int gu = gid_[size_t(u)];
      if (gu < 0 || set.count(gu)) continue;  // an assign, or not grouped yet (it will read the new level)
      if (groups_[size_t(gu)].level <= level) return false;
    }
    return true;
  }

  int merge(const std::set<int>& set, int level) {
    int into = *set.begin();
    for (int gi : set) {
      if (gi == into) continue;
      Group& from = groups_[size_t(gi)];
      for (int m : from.members) gid_[size_t(m)] = into;
      groups_[size_t(into)].members.insert(groups_[size_t(into)].members.end(), from.members.begin(),
                                           from.members.end());
      groups_[size_t(into)].pointwise = groups_[size_t(into)].pointwise && from.pointwise;
      groups_[size_t(into)].epilogue = false;  // join_epilogue sets it for the unions it makes
      if (from.prologue >= 0) groups_[size_t(into)].prologue = from.prologue;
      groups_[size_t(into)].has_epilogue = groups_[size_t(into)].has_epilogue || from.has_epilogue;
      from.members.clear();
      from.alive = false;
    }
    Group& gr = groups_[size_t(into)];
    std::sort(gr.members.begin(), gr.members.end());
    gr.level = level;
    return into;
  }

  // A pointwise node joins the groups of its producers of the same shape, highest level first.
  int join_producers(int i, int gi) {
    const ir::Node& node = g_.node(i);
    std::vector<int> cand;
    for (int in : node.inputs) {
      int gp = gid_[size_t(root_[size_t(in)])];
      if (gp < 0 || gp == gi || !groups_[size_t(gp)].pointwise) continue;
      if (g_.node(in).shape != node.shape) continue;
      if (std::find(cand.begin(), cand.end(), gp) == cand.end()) cand.push_back(gp);
    }
    std::stable_sort(cand.begin(), cand.end(),
                     [&](int a, int b) { return groups_[size_t(a)].level > groups_[size_t(b)].level; });
    std::set<int> set = {gi};
    int level = groups_[size_t(gi)].level;
    for (int gp : cand) {
      std::set<int> trial = set;
      trial.insert(gp);
      int lv = merged_level(trial);
      if (lv < 0) continue;
      set = trial;
      level = lv;
    }
    return set.size() > 1 ? merge(set, level) : gi;
  }

  // The same-shape pointwise groups that `gi` reads from outside become one.
  void merge_siblings(int gi) {
    std::map<Shape, std::vector<int>> by_shape;
    for (int m : groups_[size_t(gi)].members)
      for (int in : g_.node(m).inputs) {
        int gp = gid_[size_t(root_[size_t(in)])];
        if (gp < 0 || gp == gi || !groups_[size_t(gp)].pointwise) continue;
        std::vector<int>& v = by_shape[g_.node(groups_[size_t(gp)].members[0]).shape];
        if (std::find(v.begin(), v.end(), gp) == v.end()) v.push_back(gp);
      }
    for (auto& [shape, list] : by_shape) {
      int acc = list[0];
      for (size_t k = 1; k < list.size(); ++k) {
        std::set<int> trial = {acc, list[k]};
        int lv = merged_level(trial);
        if (lv >= 0) acc = merge(trial, lv);
      }
    }
  }

  // A matmul joins the open group of its sibling key (a GEMV fusion's, gemv_sibling_key, or a grouped GEMM's,
  // gemm_sibling_key) when that group holds matmuls only (a GEMV one may also hold the prologue computing their left
  // operand, join_*_prologue), has taken no epilogue, has room for one more (`most`) and the merge keeps the levels
  // valid; otherwise it opens a group of its own.
  int join_siblings(int i, int gi, std::map<std::string, int>& open, const std::string& key, size_t most) {
    if (key.empty()) return gi;
    auto it = open.find(key);
    if (it != open.end()) {
      const int other = gid_[size_t(it->second)];
      bool matmuls_only = other >= 0 && other != gi && groups_[size_t(other)].alive &&
                          !groups_[size_t(other)].has_epilogue && groups_[size_t(other)].members.size() < most;
      if (matmuls_only)
        for (int m : groups_[size_t(other)].members)
          matmuls_only = matmuls_only && (g_.node(m).op == ir::Op::MatMul ||
                                          groups_[size_t(other)].prologue == g_.node(i).inputs[0]);
      if (matmuls_only) {
        const std::set<int> set = {other, gi};
        const int lv = merged_level(set);
        if (lv >= 0) return merge(set, lv);
      }
    }
    open[key] = i;
    return gi;
  }

  // The first GEMV matmul of a left operand that an rms_norm computes joins the norm's (still single) group
  // when every reader of the norm is such a matmul of the same key, few enough for one fusion, and the norm is
  // not kept; its siblings then join through join_siblings. split_unfinished_prologues undoes it when a sibling
  // could not join after all.
  int join_norm_prologue(int i, int gi, const std::map<std::string, int>& open) {
    const ir::Node& mm = g_.node(i);
    const std::string key = gemv_sibling_key(g_, mm);
    if (key.empty() || open.count(key)) return gi;
    const int nid = mm.inputs[0];
    const ir::Node& norm = g_.node(nid);
    const int gn = gid_[size_t(nid)];
    if (norm.op != ir::Op::RmsNorm || kept_[size_t(nid)] || gn < 0 || gn == gi ||
        groups_[size_t(gn)].members.size() != 1 || !gemv_norm_prologue(g_, norm, mm))
      return gi;
    const std::vector<int>& readers = users_[size_t(nid)];
    if (readers.size() > kMaxGemvSiblings) return gi;
    for (int u : readers)
      if (gemv_sibling_key(g_, g_.node(u)) != key || !gemv_norm_prologue(g_, norm, g_.node(u))) return gi;
    const std::set<int> set = {gn, gi};
    const int lv = merged_level(set);
    if (lv < 0) return gi;
    const int into = merge(set, lv);
    groups_[size_t(into)].prologue = nid;
    return into;
  }

  // Likewise the pointwise group that computes the left operand of the first GEMV matmul of its key: every node
  // of it read only inside it, except that operand, read only by GEMV matmuls of this key (as their left
  // operand), nothing kept. Each workgroup then computes A(m, k) in its K loop. The union may still take the
  // matmul's epilogue (join_epilogue) or its siblings (join_siblings), not both.
  int join_pointwise_prologue(int i, int gi, const std::map<std::string, int>& open) {
    const ir::Node& mm = g_.node(i);
    const std::string key = gemv_sibling_key(g_, mm);
    const int a = mm.inputs[0];
    if (key.empty() || open.count(key) || root_[size_t(a)] != a) return gi;
    const int gp = gid_[size_t(a)];
    if (gp < 0 || gp == gi || !groups_[size_t(gp)].alive || !groups_[size_t(gp)].pointwise) return gi;
    size_t readers = 0;
    for (int m : groups_[size_t(gp)].members) {
      if (kept_[size_t(m)]) return gi;
      for (int u : users_[size_t(m)]) {
        if (gid_[size_t(u)] == gp && g_.node(u).op != ir::Op::Reshape) continue;
        const ir::Node& un = g_.node(u);
        if (m != a || un.op != ir::Op::MatMul || un.inputs[0] != a || un.inputs[1] == a ||
            gemv_sibling_key(g_, un) != key)
          return gi;
        ++readers;
      }
    }
    if (readers > kMaxGemvSiblings) return gi;
    const std::set<int> set = {gp, gi};
    const int lv = merged_level(set);
    if (lv < 0) return gi;
    const int into = merge(set, lv);
    groups_[size_t(into)].prologue = a;
    groups_[size_t(into)].epilogue = true;  // one matmul so far
    groups_[size_t(into)].epilogue_room = opt_.max_nodes;
    return into;
  }

  // A prologue whose value is read outside its group (a sibling that did not join) goes back to a group of its
  // own: the GEMV kernel never stores it. The prologue's nodes read nothing of the rest of the group (they all
  // precede its matmuls), so the dispatch graph stays acyclic.
  void split_unfinished_prologues() {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (!groups_[gi].alive || groups_[gi].prologue < 0) continue;
      const int a = groups_[gi].prologue;
      bool inside = !kept_[size_t(a)];
      for (int u : users_[size_t(a)]) inside = inside && gid_[size_t(u)] == int(gi);
      if (inside) continue;
      Group alone;
      for (int m : groups_[gi].members)
        if (m <= a) alone.members.push_back(m);  // the prologue: every member up to its value
      std::vector<int>& rest = groups_[gi].members;
      rest.erase(std::remove_if(rest.begin(), rest.end(), [a](int m) { return m <= a; }), rest.end());
      groups_[gi].prologue = -1;
      alone.pointwise = g_.node(a).op != ir::Op::RmsNorm;
      alone.level = groups_[gi].level - 1;
      groups_.push_back(alone);
      for (int m : groups_.back().members) gid_[size_t(m)] = int(groups_.size()) - 1;
    }
  }

  // Two ropes with the same cos and sin tables (q and k of one attention, or their derivatives) share one
  // dispatch when neither reads the other.
  // A rope reads its input through the permute that makes it (the head split of an attention, [B, S, H, D] ->
  // [B, H, S, D]) when the permute keeps the last axis and has no other reader: the permuted copy is not made.
  int join_rope_permute(int i, int gi) {
    const int in = g_.node(i).inputs[0];
    const int gp = gid_[size_t(in)];
    if (!rope_reads_through(g_, g_.node(in)) || kept_[size_t(in)] || users_[size_t(in)].size() != 1 || gp < 0 ||
        gp == gi || groups_[size_t(gp)].members.size() != 1)
      return gi;
    const std::set<int> set = {gi, gp};
    const int lv = merged_level(set);
    return lv < 0 ? gi : merge(set, lv);
  }

  // The head merge of an attention's o ([B, Hq, Sq, Dv] -> [B, Sq, Hq, Dv]) joins the attention (alone or
  // with its lse) when o has no other reader: the attention kernel stores o permuted and the copy is not
  // made.
  int join_head_merge(int i, int gi) {
    if (!attention_head_merge(g_, g_.node(i))) return gi;
    const int a = g_.node(i).inputs[0];
    const int ga = gid_[size_t(a)];
    if (kept_[size_t(a)] || users_[size_t(a)].size() != 1 || ga < 0 || ga == gi) return gi;
    for (int m : groups_[size_t(ga)].members)
      if (!is_attention_forward(g_.node(m))) return gi;
    const std::set<int> set = {gi, ga};
    const int lv = merged_level(set);
    return lv < 0 ? gi : merge(set, lv);
  }

  // Whether group `gi` reads node x (directly or through a view).
  bool group_reads(int gi, int x) const {
    for (int m : groups_[size_t(gi)].members)
      for (int in : g_.node(m).inputs)
        if (root_[size_t(in)] == x) return true;
    return false;
  }

  // Two ropes of the same tables (each alone, or with the permute it reads through) share one dispatch.
  int pair_rope(int i, int gi, std::map<std::pair<int, int>, int>& open) {
    const ir::Node& node = g_.node(i);
    const std::pair<int, int> key{node.inputs[1], node.inputs[2]};
    auto it = open.find(key);
    if (it == open.end()) {
      open.emplace(key, i);
      return gi;
    }
    const int other = it->second, go = gid_[size_t(other)];
    auto rope_alone = [&](int g) {
      for (int m : groups_[size_t(g)].members)
        if (g_.node(m).op != ir::Op::Rope && g_.node(m).op != ir::Op::Permute) return false;
      return true;
    };
    if (go < 0 || go == gi || !rope_alone(go) || !rope_alone(gi) || groups_[size_t(go)].members.size() > 2 ||
        group_reads(gi, other) || group_reads(go, i)) {
      it->second = i;
      return gi;
    }
    const std::set<int> set = {go, gi};
    const int lv = merged_level(set);
    if (lv < 0) {
      it->second = i;
      return gi;
    }
    open.erase(it);
    return merge(set, lv);
  }

  // A pointwise group joins the epilogue-capable group (one small matmul, or one that lowers to the tiled GEMM,
  // alone or with pointwise nodes of its shape) of a producer of its shape: the residual add of a token's
  // projection, a bias, an activation. Never two matmuls, never a union in which the matmul would read a member
  // (every workgroup reads all of its left operand).
  int join_epilogue(int i, int gi) {
    const ir::Node& node = g_.node(i);
    for (int in : node.inputs) {
      const int gp = gid_[size_t(root_[size_t(in)])];
      if (gp < 0 || gp == gi || !groups_[size_t(gp)].epilogue || g_.node(in).shape != node.shape) continue;
      std::set<int> set = {gi, gp};
      if (!prologue_apart(gp, gi)) continue;
      const int mm = matmul_of(gp);
      const size_t room = groups_[size_t(gp)].epilogue_room;
      if (groups_[size_t(gp)].members.size() - 1 + groups_[size_t(gi)].members.size() > room) continue;
      bool reads_member = false;
      for (int x : g_.node(mm).inputs) reads_member = reads_member || gid_[size_t(root_[size_t(x)])] == gi;
      if (reads_member) continue;
      const int lv = merged_level(set);
      if (lv < 0) continue;
      const int into = merge(set, lv);
      groups_[size_t(into)].epilogue = true;
      groups_[size_t(into)].epilogue_room = room;
      groups_[size_t(into)].has_epilogue = true;
      return into;
    }
    return gi;
  }

  // An epilogue group `ge` may join the GEMV group `gp` of a pointwise prologue only when all its nodes come after
  // the matmul and it reads no prologue node and no outside node the prologue reads (the two parts of the kernel
  // load their operands apart).
  bool prologue_apart(int gp, int ge) const {
    const int a = groups_[size_t(gp)].prologue;
    if (a < 0) return true;
    if (g_.node(a).op == ir::Op::RmsNorm) return false;  // the norm prologue's kernel has no epilogue
    std::set<int> pro_members, pro_reads;
    for (int m : groups_[size_t(gp)].members)
      if (m <= a) pro_members.insert(m);
    for (int m : pro_members)
      for (int x : g_.node(m).inputs)
        if (!pro_members.count(x)) pro_reads.insert(x);
    const int mm = matmul_of(gp);
    for (int m : groups_[size_t(ge)].members) {
      if (m < mm) return false;  // the kernel's prologue is every pointwise node before the matmul
      for (int x : g_.node(m).inputs)
        if (pro_members.count(x) || pro_reads.count(x)) return false;
    }
    return true;
  }

  int matmul_of(int gi) const {
    for (int m : groups_[size_t(gi)].members)
      if (g_.node(m).op == ir::Op::MatMul) return m;
    throw Error("internal: a GEMV epilogue group without its matmul");
  }

  // attention_grad_k and attention_grad_v of the same inputs and attributes share one dispatch, and so do
  // attention and attention_lse.
  int pair_attention(int i, int gi, std::map<std::pair<std::vector<int>, std::string>, int>& open) {
    const ir::Node& node = g_.node(i);
    std::string attrs = gl::flit(node.attrs.f("scale")) + " " + std::to_string(node.attrs.i("causal"));
    auto key = std::make_pair(node.inputs, attrs);
    auto it = open.find(key);
    if (it == open.end() || g_.node(it->second).op == node.op) {
      if (it == open.end()) open.emplace(key, i);
      return gi;
    }
    int other = it->second;
    open.erase(it);
    if (is_attention_grad_kv(node)) {
      int gk = node.op == ir::Op::AttentionGradK ? i : other,
          gv = node.op == ir::Op::AttentionGradV ? i : other;
      if (!attention_grad_kv_fits(g_, gk, gv, caps_)) return gi;
    }
    // The forward pair needs no more shared memory than attention alone, which lowers on its own anyway.
    std::set<int> set = {gid_[size_t(other)], gi};
    int lv = merged_level(set);
    return lv < 0 ? gi : merge(set, lv);
  }

  const ir::Graph& g_;
  const std::vector<bool>& needed_;
  const DeviceCaps& caps_;
  const FusionOptions& opt_;
  const int n_;
  std::vector<int> root_;                // through reshape views to the node that owns the memory
  std::vector<std::vector<int>> users_;  // needed readers, once each
  std::vector<bool> kept_;               // outputs and pinned nodes: always written
  std::vector<int> gid_;                 // per node: its group, or -1 (source, view, assign, unneeded)
  std::vector<Group> groups_;
};

}  // namespace

std::vector<std::vector<int>> find_fusions(const ir::Graph& g, const std::vector<bool>& needed,
                                           const std::vector<int>& pinned, const DeviceCaps& caps,
                                           const FusionOptions& opt) {
  return Grouper(g, needed, pinned, caps, opt).run();
}

Lowering lower_dispatch(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                        const DeviceCaps& caps, const CodegenOptions& options) {
  if (nodes.size() == 1) return lower_node({g, g.node(nodes[0]), caps, options});
  if (nodes.size() == 2 && is_attention_grad_kv(g.node(nodes[0])) && is_attention_grad_kv(g.node(nodes[1])))
    return lower_attention_grad_kv(g, nodes, caps, options);
  if (std::any_of(nodes.begin(), nodes.end(), [&](int id) { return g.node(id).op == ir::Op::Attention; }))
    return lower_attention_fused(g, nodes, caps, options);
  if (std::all_of(nodes.begin(), nodes.end(), [&](int id) {
        return g.node(id).op == ir::Op::Rope || g.node(id).op == ir::Op::Permute;
      }))
    return lower_rope_group(g, nodes, caps);
  if (gemv_pointwise_prologue(g, nodes)) return lower_gemv_pointwise_prologue(g, nodes, stored, caps);
  if (gemv_epilogue(g, nodes)) return lower_tiled_gemm_epilogue(g, nodes, stored, caps, options);
  if (g.node(nodes[0]).op == ir::Op::MatMul) {
    if (!gemm_sibling_key(g, g.node(nodes[0]), caps, options).empty())
      return lower_gemm_siblings(g, nodes, caps, options);
    return lower_gemv_siblings(g, nodes, caps);
  }
  if (g.node(nodes[0]).op == ir::Op::RmsNorm) return lower_gemv_norm_siblings(g, nodes, caps);
  return lower_pointwise_fusion(g, nodes, stored, caps);
}

}  // namespace mgn::codegen
