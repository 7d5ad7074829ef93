// Vulkan graph executor: lowering, compile (deduplicated, parallel), storage, one recorded stream per step.
#include "backend/vulkan/graph_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "backend/vulkan/gemm_selftest.h"
#include "backend/vulkan/gemm_tune.h"
#include "support/numerics_trace.h"
#include "support/parallel.h"

namespace mgn::vk {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

constexpr uint32_t kNanBits = 0x7fc00000u;

// FLOPs of one node (2 per multiply-add) for the profile: matmuls, convolutions and their derivatives, attention
// forwards (QK^T and PV, causal not halved); 0 for every other op.
double node_flops(const ir::Graph& g, const ir::Node& n) {
  auto count = [](const Shape& s) { return double(numel(s)); };
  if (n.op == ir::Op::MatMul) {
    const Shape& a = g.node(n.inputs[0]).shape;
    const double k = double(n.attrs.i("transpose_a") != 0 ? a[a.size() - 2] : a.back());
    return 2.0 * count(n.shape) * k;
  }
  if (n.op == ir::Op::Conv2d || n.op == ir::Op::Conv2dGradInput) {  // per forward output: Cin/groups x kh x kw
    const Shape& w = g.node(n.inputs[1]).shape;
    const Shape& y = n.op == ir::Op::Conv2d ? n.shape : g.node(n.inputs[0]).shape;
    return 2.0 * count(y) * count(w) / double(w[0]);
  }
  if (n.op == ir::Op::Conv2dGradWeight) {  // (x, dy) -> the weight
    return 2.0 * count(g.node(n.inputs[1]).shape) * count(n.shape) / double(n.shape[0]);
  }
  if (n.op == ir::Op::Attention) {  // q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [.., Dv]
    const Shape &q = g.node(n.inputs[0]).shape, &k = g.node(n.inputs[1]).shape, &v = g.node(n.inputs[2]).shape;
    return 2.0 * count(q) / double(q.back()) * double(k[k.size() - 2]) * double(q.back() + v.back());
  }
  return 0.0;
}

}  // namespace

GraphExecutor::GraphExecutor(const ir::Graph& g, Context& ctx, GraphExecutorOptions options)
    : g_(g), ctx_(ctx), opt_(std::move(options)), faults_(opt_.faults) {
  const auto t0 = std::chrono::steady_clock::now();
  ir::verify(g_);
  alloc_ = std::make_unique<Allocator>(ctx_, opt_.allocator, &faults_);
  transfer_ = std::make_unique<Transfer>(ctx_, *alloc_);
  compiler_ = opt_.compiler ? opt_.compiler : std::make_shared<codegen::ShaderCompiler>(opt_.cache_dir);
  pipelines_ = opt_.pipelines ? opt_.pipelines : std::make_shared<PipelineCache>(ctx_, opt_.cache_dir);
  stream_ = std::make_unique<CommandStream>(ctx_, opt_.timestamps, &faults_);
  stream_->set_between_submissions(opt_.between_submissions);
  stats_.setup_ms = ms_since(t0);
  build();
}

GraphExecutor::~GraphExecutor() {
  stream_.reset();
  // A shared cache outlives this executor: what it created here reaches the disk now (an own one saves
  // itself; neither does on a lost device).
  if (opt_.pipelines && stats_.pipelines_created > 0) pipelines_->save();
  pipelines_.reset();
  for (Storage& s : storages_)
    if (!s.view) alloc_->free(s.buffer);
  for (Buffer& b : arena_) alloc_->free(b);
  transfer_.reset();
  alloc_.reset();
}

int GraphExecutor::new_storage(uint64_t words, int owner, const std::string& what) {
  uint64_t bytes = std::max<uint64_t>(words, 1) * 4;
  if (bytes > ctx_.limits().max_storage_buffer_range)
    throw Error(what + " needs " + std::to_string(bytes) + " bytes, more than one kernel binding can address " +
                "(maxStorageBufferRange = " + std::to_string(ctx_.limits().max_storage_buffer_range) + " bytes)");
  Storage s;
  s.buffer = alloc_->allocate(bytes, MemoryKind::Device, what);
  s.words = std::max<uint64_t>(words, 1);
  s.owner = owner;
  storages_.push_back(s);
  return int(storages_.size()) - 1;
}

// The context's caps; where an Accelerated matmul could take the f16 cooperative-matrix GEMM, with the
// device's self-test verdict for this tile option (computed once per device, kept by the Context).
codegen::DeviceCaps GraphExecutor::device_caps() {
  codegen::DeviceCaps caps = ctx_.caps();
  const codegen::CodegenOptions& co = opt_.codegen;
  if (!caps.cooperative_matrix_nv || !co.kernels.f16_gemm) return caps;
  bool accelerated_matmul = false;
  for (const ir::Node& n : g_.nodes())
    accelerated_matmul |= n.op == ir::Op::MatMul && n.precision.value_or(co.default_precision) == Precision::Accelerated;
  if (!accelerated_matmul) return caps;
  const CoopMatVerdict v = coopmat_verdict(ctx_, co.kernels.f16_tile, *compiler_);
  caps.coopmat_f16_verified = v.verified;
  caps.coopmat_mma = v.mma;
  return caps;
}

void GraphExecutor::build() {
  const codegen::DeviceCaps caps = device_caps();
  if (opt_.tune != TuneMode::Off) {
    const GemmTuneResult t =
        tune_gemms(ctx_, *alloc_, *transfer_, *pipelines_, *compiler_, g_, caps, opt_.codegen, opt_.tune, opt_.cache_dir);
    opt_.codegen.gemm_tuned = t.choices;
    opt_.codegen.conv_tuned = t.conv_choices;
    stats_.tune_ms = t.ms;
    stats_.tune_measured = t.measured;
    stats_.tune_cached = t.cached;
    stats_.tune_timed = t.timed;
    stats_.tune_file = tune_file_name(t.file);
  }
  lower(caps);
  compile_kernels();
  record();
}

// GLSL -> SPIR-V, identical sources once, in parallel (SPIR-V a compiled-session entry gave is used as is),
// each kernel's pipeline created by the same worker as soon as its SPIR-V is ready: pipeline creation
// overlaps the compiles of other kernels. A miss stores the session's entry.
void GraphExecutor::compile_kernels() {
  auto t0 = std::chrono::steady_clock::now();
  // Unique GLSL (views into kernels_, which stays as it is here) and every kernel's index among them.
  std::unordered_map<std::string_view, size_t> unique;
  std::vector<size_t> first_of, unique_of(kernels_.size());
  for (size_t k = 0; k < kernels_.size(); ++k) {
    auto [it, fresh] = unique.emplace(kernels_[k].glsl, first_of.size());
    if (fresh) first_of.push_back(k);
    unique_of[k] = it->second;
  }
  const size_t n = first_of.size();
  std::vector<std::vector<uint32_t>> spirv(n);
  std::vector<bool> compile(n, false);
  size_t to_compile = 0;
  for (size_t u = 0; u < n; ++u) {
    if (const std::vector<uint32_t>* w = kernel_spirv_[first_of[u]]) {
      spirv[u] = *w;
      ++stats_.spirv_from_session;
    } else {
      compile[u] = true;
      ++to_compile;
    }
  }
  const codegen::ShaderCompiler::Stats before = compiler_->stats();
  const PipelineCache::Stats pbefore = pipelines_->stats();
  std::mutex progress_mutex;
  size_t done = 0;
  if (opt_.on_compile_progress && to_compile) opt_.on_compile_progress(0, to_compile);
  std::vector<const Pipeline*> pipes(n);
  // When a compile ended; the creation's wall and thread-CPU time.
  std::vector<double> spirv_ready_ms(n, 0.0), create_ms(n, 0.0), create_cpu_ms(n, 0.0);
  std::vector<std::thread::id> creator(n);  // the thread that created kernel u's pipeline (default: none)
  // Kernels in order of first appearance (longest-GLSL-first was tried: no gain on lavapipe,
  // docs/perf-notes.md 2026-12-07); results are stored by index, whatever the order the workers finish in.
  const double loop_ms = ms_since(t0);  // dedup and SPIR-V from the session entry
  support::parallel_for(n, opt_.compile_threads, [&](size_t u) {
    const codegen::Kernel& kern = kernels_[first_of[u]];
    if (compile[u]) {
      codegen::ShaderOptions so;
      so.name = kern.name;
      so.scalar_block_layout = kern.scalar_block_layout;
      so.optimize = opt_.codegen.kernels.spirv_optimize;
      spirv[u] = compiler_->compile(kern.glsl, so).words;
      if (opt_.on_compile_progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        opt_.on_compile_progress(++done, to_compile);
      }
      spirv_ready_ms[u] = ms_since(t0);
    }
    PipelineDesc d;
    d.spirv = spirv[u];
    d.num_buffers = uint32_t(kern.bindings.size());
    d.required_subgroup_size = kern.required_subgroup_size;
    d.name = kern.name;
    bool created = false;
    pipes[u] = &pipelines_->get(d, &created, &create_ms[u], &create_cpu_ms[u]);
    if (created) creator[u] = std::this_thread::get_id();
  });
  const double total_ms = ms_since(t0);
  const codegen::ShaderCompiler::Stats after = compiler_->stats();
  stats_.compiled = after.compiled - before.compiled;
  stats_.spirv_memory_hits = after.memory_hits - before.memory_hits;
  stats_.spirv_disk_hits = after.disk_hits - before.disk_hits;
  stats_.shaderc_cpu_ms = after.compile_ms - before.compile_ms;
  stats_.validate_cpu_ms = after.validate_ms - before.validate_ms;
  // In kernel order (the compiles above run in any order): a change to the code generator shows here.
  for (const std::vector<uint32_t>& s : spirv) trace::record("vk.spirv", s.data(), s.size() * 4);
  // The phases overlap: shaderc until its last compile ended (or the loop began, if none ran), pipelines for
  // the rest.
  stats_.shaderc_ms = loop_ms;
  for (double ms : spirv_ready_ms) stats_.shaderc_ms = std::max(stats_.shaderc_ms, ms);
  stats_.pipeline_ms = total_ms - stats_.shaderc_ms;
  stats_.unique_kernels = n;
  for (size_t u = 0; u < n; ++u) {
    stats_.pipeline_cpu_ms += create_ms[u];
    stats_.pipeline_thread_cpu_ms += create_cpu_ms[u];
  }
  std::set<std::thread::id> threads(creator.begin(), creator.end());
  threads.erase(std::thread::id());
  stats_.pipeline_threads = threads.size();
  for (Step& st : steps_)
    if (st.copy_src < 0) st.pipeline = pipes[unique_of[st.kernel]];
  stats_.pipelines_created = pipelines_->stats().created - pbefore.created;

  if (store_entry_) {
    t0 = std::chrono::steady_clock::now();
    CompiledSession entry;
    entry.fusions = cached_ ? cached_->fusions : fusions_;
    entry.spirv = std::move(spirv);
    size_t k = 0;
    for (CachedDispatch& d : to_store_)
      for (size_t j = 0; j < d.lowering.kernels.size(); ++j) d.spirv.push_back(uint32_t(unique_of[k++]));
    entry.dispatches = std::move(to_store_);
    store_session(opt_.cache_dir, session_key_, entry, opt_.session_cache_bytes);
    stats_.store_ms = ms_since(t0);
  }
  to_store_.clear();
  kernel_spirv_.clear();
  cached_.reset();
}

int GraphExecutor::arena_view(uint64_t offset, uint64_t bytes, int owner) {
  const uint64_t seg = plan_->segment_bytes;
  size_t k = seg ? size_t(offset / seg) : 0;
  uint64_t local = seg ? offset % seg : offset;
  Storage s;
  s.buffer = arena_.at(k);
  s.buffer.offset += local;
  s.buffer.size = std::max<uint64_t>(bytes, 4);
  if (s.buffer.mapped) s.buffer.mapped += local;
  s.words = s.buffer.size / 4;
  s.owner = owner;
  s.view = true;
  storages_.push_back(s);
  return int(storages_.size()) - 1;
}

// Choose the fusions, lower every dispatch whose kernels do not depend on the plan (scratch sizes feed it),
// plan, back the arena with a few allocations, and give every tensor a view at its planned offset; pointwise
// fusions are lowered once the plan says which of their nodes have memory. Steps follow the plan's dispatch
// order.
void GraphExecutor::lower(const codegen::DeviceCaps& caps) {
  auto t0 = std::chrono::steady_clock::now();
  const int n = g_.size();
  const DeviceLimits& L = ctx_.limits();
  // What the step computes (views and sources have no kernel); the plan needs every pinned node too.
  std::vector<bool> need(size_t(n), false);
  for (auto& [name, id] : g_.outputs()) need[size_t(id)] = true;
  for (int id : g_.assigns()) need[size_t(id)] = true;
  for (int id : opt_.plan.pinned)
    if (id >= 0 && id < n) need[size_t(id)] = true;
  for (int i = n - 1; i >= 0; --i)
    if (need[size_t(i)])
      for (int in : g_.node(i).inputs) need[size_t(in)] = true;
  auto has_kernel = [&](int i) {
    const ir::Node& node = g_.node(i);
    ir::Archetype arch = ir::op_info(node.op).archetype;
    return need[size_t(i)] && arch != ir::Archetype::Source && arch != ir::Archetype::State &&
           node.op != ir::Op::Reshape;
  };
  stats_.lowering_ms = ms_since(t0);
  // The compiled-session cache: a verified entry gives the fusions, every lowering and its SPIR-V.
  auto tc = std::chrono::steady_clock::now();
  if (!opt_.cache_dir.empty() && opt_.session_cache) {
    session_key_ = session_key(g_, caps, opt_.codegen, opt_.plan, ctx_.info());
    stats_.hash_ms = ms_since(tc);
    CompiledSession entry;
    stats_.session_cache = load_session(opt_.cache_dir, session_key_, &entry);
    if (stats_.session_cache == CacheResult::Hit) cached_ = std::move(entry);
    store_entry_ = stats_.session_cache != CacheResult::Hit;
  }
  std::map<std::pair<std::vector<int>, std::vector<bool>>, const CachedDispatch*> from_cache;
  if (cached_)
    for (const CachedDispatch& d : cached_->dispatches) from_cache[{d.nodes, d.stored}] = &d;
  stats_.cache_ms = ms_since(tc) - stats_.hash_ms;
  // Dispatches in node order: a fusion where its first node is, everything else alone.
  auto tf = std::chrono::steady_clock::now();
  std::vector<std::vector<int>> fusions;
  if (cached_) fusions = cached_->fusions;
  else if (opt_.codegen.kernels.fusion)
    fusions = codegen::find_fusions(
        g_, need, opt_.plan.pinned, caps,
        {.gemv = opt_.codegen.kernels.gemm != GemmKernel::Tiled,
         .gemm_epilogues = opt_.codegen.kernels.gemm_epilogue ? &opt_.codegen : nullptr,
         .gemm_siblings = opt_.codegen.kernels.gemm_siblings ? &opt_.codegen : nullptr});
  fusions_ = fusions;
  stats_.fusion_ms = ms_since(tf);
  auto te = std::chrono::steady_clock::now();
  std::vector<int> fusion_of(size_t(n), -1);
  for (size_t f = 0; f < fusions.size(); ++f)
    for (int id : fusions[f]) fusion_of[size_t(id)] = int(f);
  std::vector<plan::Dispatch> dispatches;
  for (int i = 0; i < n; ++i) {
    if (!has_kernel(i)) continue;
    int f = fusion_of[size_t(i)];
    if (f < 0) dispatches.push_back({{i}});
    else if (fusions[size_t(f)][0] == i) dispatches.push_back({fusions[size_t(f)]});
  }
  // Lowerings by the dispatch's first node. A pointwise fusion (and a GEMV epilogue, a pointwise fusion behind a
  // small matmul) waits for the plan (which nodes it writes).
  auto gemv_epilogue = [&](const plan::Dispatch& d) { return codegen::gemv_epilogue(g_, d.nodes); };
  auto pointwise_fusion = [&](const plan::Dispatch& d) {
    return d.nodes.size() > 1 && (codegen::pointwise_fusible(g_.node(d.nodes[0])) || gemv_epilogue(d));
  };
  std::map<int, codegen::Lowering> lows;
  std::map<int, const CachedDispatch*> low_cached;  // lowerings that came from the entry, by first node
  // From the entry where it has the dispatch, else emitted; the generators are pure, so they run in parallel.
  auto lower_all = [&](const std::vector<const plan::Dispatch*>& ds, const std::vector<std::vector<bool>>& stored,
                       bool keyed_by_stored) {
    std::vector<size_t> emit;
    for (size_t i = 0; i < ds.size(); ++i) {
      auto it = from_cache.find({ds[i]->nodes, keyed_by_stored ? stored[i] : std::vector<bool>{}});
      if (it != from_cache.end()) {
        lows.emplace(ds[i]->nodes[0], it->second->lowering);
        low_cached[ds[i]->nodes[0]] = it->second;
      } else {
        emit.push_back(i);
      }
    }
    std::vector<codegen::Lowering> out(emit.size());
    support::parallel_for(emit.size(), opt_.compile_threads, [&](size_t j) {
      out[j] = codegen::lower_dispatch(g_, ds[emit[j]]->nodes, stored[emit[j]], caps, opt_.codegen);
    });
    for (size_t j = 0; j < emit.size(); ++j) {
      stats_.emitted += out[j].kernels.size();
      lows.emplace(ds[emit[j]]->nodes[0], std::move(out[j]));
    }
    if (!emit.empty() && !opt_.cache_dir.empty() && opt_.session_cache) store_entry_ = true;
  };
  {
    std::vector<const plan::Dispatch*> ds;
    std::vector<std::vector<bool>> stored;
    for (const plan::Dispatch& d : dispatches)
      if (!pointwise_fusion(d)) {
        ds.push_back(&d);
        stored.emplace_back(d.nodes.size(), true);
      }
    lower_all(ds, stored, false);
  }
  stats_.lowering_ms += ms_since(te);

  auto t1 = std::chrono::steady_clock::now();
  plan::PlanOptions po = opt_.plan;
  po.dispatches = dispatches;
  po.tensor_bytes = [](const ir::Node& nd) { return uint64_t(std::max<int64_t>(numel(nd.shape), 1)) * 4; };
  po.alignment = alloc_->alignment();
  po.max_binding_bytes = L.max_storage_buffer_range;
  po.segment_bytes = alloc_->max_allocation() / po.alignment * po.alignment;
  po.scratch_bytes = [&](const ir::Graph&, const plan::Dispatch& d) {
    std::vector<uint64_t> r;
    if (gemv_epilogue(d)) {  // lowered after the plan
      for (uint64_t w : codegen::gemm_epilogue_scratch_words(g_, d.nodes, caps, opt_.codegen))
        r.push_back(std::max<uint64_t>(w, 1) * 4);
      return r;
    }
    if (pointwise_fusion(d)) return r;
    for (uint64_t w : lows.at(d.nodes[0]).scratch_words) r.push_back(std::max<uint64_t>(w, 1) * 4);
    return r;
  };
  // In place: a one-kernel pointwise node over an input of its shape (the default rule), or a node of a
  // pointwise fusion over an outside operand of the fusion's shape. The fused kernel loads every operand
  // before it stores anything, and an operand of the fusion's shape (or of its element count: any view of
  // it) is read at the invocation's own element only, so the overwrite is safe. The dK+dV kernel never.
  po.in_place_ok = [&](const ir::Graph& g, const plan::Dispatch& d, int node, int input) {
    if (d.nodes.size() > 1)  // not behind a matmul: every workgroup of it reads all of the matmul's operands
      return pointwise_fusion(d) && !gemv_epilogue(d) && g.node(input).shape == g.node(node).shape &&
             std::find(d.nodes.begin(), d.nodes.end(), node) != d.nodes.end();
    const codegen::Lowering& low = lows.at(node);
    return low.kernels.size() == 1 && low.scratch_words.empty() && !low.output_zero_filled &&
           plan::default_in_place_ok(g, d, node, input);
  };
  auto tp = std::chrono::steady_clock::now();
  plan_ = plan::make_plan(g_, po);
  stats_.plan_ms = ms_since(tp);
  const plan::Plan& p = *plan_;
  auto tl = std::chrono::steady_clock::now();
  std::map<int, std::vector<bool>> fusion_stored;  // pointwise fusions: which nodes were lowered as stored
  {
    std::vector<const plan::Dispatch*> ds;
    std::vector<std::vector<bool>> stored;
    for (const plan::Dispatch& d : p.dispatches)
      if (pointwise_fusion(d)) {
        ds.push_back(&d);
        stored.emplace_back();
        for (int id : d.nodes) stored.back().push_back(p.storage_of[size_t(id)] >= 0);
        fusion_stored[d.nodes[0]] = stored.back();
      }
    lower_all(ds, stored, true);
  }
  const double fusion_lowering_ms = ms_since(tl);
  stats_.lowering_ms += fusion_lowering_ms;

  // Arena segments, then one view per tensor (its own byte size) and per scratch buffer.
  auto ta = std::chrono::steady_clock::now();
  uint64_t seg = p.segment_bytes ? p.segment_bytes : std::max<uint64_t>(p.arena_bytes, po.alignment);
  for (uint64_t off = 0; off < std::max<uint64_t>(p.arena_bytes, 1); off += seg)
    arena_.push_back(alloc_->allocate(std::max<uint64_t>(std::min(seg, p.arena_bytes - std::min(off, p.arena_bytes)), 16),
                                      MemoryKind::Device, "plan arena segment " + std::to_string(arena_.size())));
  stats_.alloc_ms += ms_since(ta);
  stats_.arena_bytes = p.arena_bytes;
  stats_.groups = size_t(p.num_groups());
  need_ = p.needed;
  storage_of_.assign(size_t(n), -1);
  for (int i = 0; i < n; ++i)
    if (p.storage_of[size_t(i)] >= 0)
      storage_of_[size_t(i)] = arena_view(p.offset_of(i), uint64_t(std::max<int64_t>(numel(g_.node(i).shape), 1)) * 4, i);
  plan_view_.assign(p.storages.size(), -1);
  auto whole = [&](int ps) {
    if (plan_view_[size_t(ps)] < 0)
      plan_view_[size_t(ps)] = arena_view(p.storages[size_t(ps)].offset, p.storages[size_t(ps)].bytes, -1);
    return plan_view_[size_t(ps)];
  };
  for (size_t k = 0; k < g_.outputs().size(); ++k) {
    int id = g_.outputs()[k].second;
    if (p.output_storage[k] != p.storage_of[size_t(id)])
      output_copy_[id] = arena_view(p.storages[size_t(p.output_storage[k])].offset,
                                    uint64_t(std::max<int64_t>(numel(g_.node(id).shape), 1)) * 4, id);
  }
  // Poison what the step computes; never a source's memory (an in-place assign's value lives there).
  for (int i = 0; i < n; ++i) {
    int ps = p.storage_of[size_t(i)];
    if (ps < 0 || p.dispatch_of[size_t(i)] < 0) continue;
    plan::MemClass c = p.storages[size_t(ps)].cls;
    if (c == plan::MemClass::Parameter || c == plan::MemClass::State || c == plan::MemClass::Input ||
        c == plan::MemClass::Constant)
      continue;
    poison_.push_back(storage_of_[size_t(i)]);
  }
  for (auto& [id, s] : output_copy_) poison_.push_back(s);

  upload_sources();

  // One buffer of every dispatch's counters (Lowering::counter_words), zeroed now and left zero by each run.
  const uint64_t counter_align = std::max<uint64_t>(po.alignment, 4);
  uint64_t counter_total = 0, counter_at = 0;
  for (const plan::Dispatch& d : p.dispatches)
    counter_total +=
        codegen::div_up(lows.at(d.nodes[0]).counter_words * 4, counter_align) * counter_align / 4;
  int counter_storage = -1;
  if (counter_total > 0) {
    auto tz = std::chrono::steady_clock::now();
    counter_storage = new_storage(counter_total, -1, "split-K counters");
    transfer_->fill_zero(storages_[size_t(counter_storage)].buffer);
    stats_.alloc_ms += ms_since(tz);
  }
  // Steps in plan order: a barrier before every group but the first, between the kernels of one node,
  // and after a zero fill.
  int zero_storage = -1;
  for (int grp = 0; grp < p.num_groups(); ++grp) {
    bool group_start = grp > 0;
    for (int d = p.group_begin[size_t(grp)]; d < p.group_begin[size_t(grp) + 1]; ++d) {
      const std::vector<int>& nodes = p.dispatches[size_t(d)].nodes;
      int i = nodes.at(0);
      codegen::Lowering& low = lows.at(i);
      const CachedDispatch* hit = low_cached.count(i) ? low_cached.at(i) : nullptr;
      if (store_entry_) {
        CachedDispatch cd;
        cd.nodes = nodes;
        if (fusion_stored.count(i)) cd.stored = fusion_stored.at(i);
        cd.lowering = low;
        to_store_.push_back(std::move(cd));
      }
      if (low.output_zero_filled) {
        uint64_t words = storages_[size_t(storage_of_[size_t(i)])].words;
        if (zero_storage < 0 || storages_[size_t(zero_storage)].words < words) {
          auto tz = std::chrono::steady_clock::now();
          zero_storage = new_storage(words, -1, "zero fill source");
          transfer_->fill_zero(storages_[size_t(zero_storage)].buffer);
          stats_.alloc_ms += ms_since(tz);
        }
        Step z;
        z.copy_src = zero_storage;
        z.copy_dst = storage_of_[size_t(i)];
        z.barrier_before = group_start;
        z.group = grp;
        group_start = false;
        steps_.push_back(z);
      }
      // Counters (a split-K GEMM's arrivals): the dispatch's own part of one buffer zeroed once; its kernels
      // leave it zero.
      int counters = -1;
      if (low.counter_words > 0) {
        Storage s = storages_[size_t(counter_storage)];
        s.buffer.offset += counter_at * 4;
        s.buffer.size = low.counter_words * 4;
        s.words = low.counter_words;
        s.view = true;
        storages_.push_back(s);
        counters = int(storages_.size()) - 1;
        counter_at += codegen::div_up(low.counter_words * 4, counter_align) * counter_align / 4;
      }
      for (size_t k = 0; k < low.kernels.size(); ++k) {
        codegen::Kernel& kern = low.kernels[k];
        check_grid(i, kern);
        Step st;
        st.kernel = kernels_.size();
        st.barrier_before = group_start || k > 0 || (k == 0 && low.output_zero_filled);
        st.group = grp;
        group_start = false;
        for (const codegen::Binding& b : kern.bindings) {
          int sid = -1, id = nodes.at(size_t(b.node));
          switch (b.kind) {
            case codegen::BindingKind::Input: sid = storage_of_[size_t(g_.node(id).inputs.at(size_t(b.index)))]; break;
            case codegen::BindingKind::Output: sid = storage_of_[size_t(id)]; break;
            case codegen::BindingKind::Scratch: sid = whole(p.scratch_of[size_t(d)].at(size_t(b.index))); break;
            case codegen::BindingKind::Counters:
              sid = counters;
              break;
          }
          if (sid < 0) throw Error("internal: kernel " + kern.name + " binds " + g_.describe(id) + ", which has no memory");
          st.storages.push_back(sid);
          st.writes.push_back(b.written);
        }
        KernelCost cost;
        for (size_t k2 = 0; k2 < nodes.size(); ++k2) {
          cost.nodes += (k2 ? "," : "%") + std::to_string(nodes[k2]);
          cost.ops += std::string(k2 ? " " : "") + ir::op_name(g_.node(nodes[k2]).op);
          cost.group_flops += node_flops(g_, g_.node(nodes[k2]));
        }
        for (int sid : std::set<int>(st.storages.begin(), st.storages.end()))
          cost.bytes += double(storages_[size_t(sid)].words) * 4.0;
        kern.name += " " + cost.nodes;
        cost.label = kern.name;
        costs_.push_back(std::move(cost));
        kernel_spirv_.push_back(hit ? &cached_->spirv.at(hit->spirv.at(k)) : nullptr);
        kernels_.push_back(std::move(kern));
        steps_.push_back(std::move(st));
      }
    }
  }
  // End of step: snapshots, then commits (plan storages as whole views).
  for (const plan::Copy& c : p.snapshots) {
    whole(c.src_storage);
    whole(c.dst_storage);
  }
  for (const plan::Commit& c : p.commits)
    if (!c.in_place) {
      whole(c.src_storage);
      whole(c.dst_storage);
    }
  // Allocation and step building only: planning, the fusions' emission and the initial values count apart.
  stats_.record_ms += ms_since(t1) - stats_.plan_ms - fusion_lowering_ms - stats_.upload_ms;
}

void GraphExecutor::record() {
  auto t0 = std::chrono::steady_clock::now();
  const plan::Plan& p = *plan_;
  // Submission chunking: a new command buffer at the first step of every group that starts a submission.
  std::vector<bool> starts_submission(size_t(p.num_groups()) + 1, false);
  for (size_t k = 1; k + 1 < p.submission_begin.size(); ++k) starts_submission[size_t(p.submission_begin[k])] = true;
  int current_group = -1;
  std::vector<Buffer> bufs;  // one dispatch's bindings (copied by the stream)
  for (const Step& st : steps_) {
    if (st.group != current_group) {
      if (st.group > 0 && starts_submission[size_t(st.group)]) stream_->split();
      current_group = st.group;
    }
    if (st.barrier_before) stream_->barrier();
    if (st.pipeline) {
      bufs.clear();
      for (int s : st.storages) bufs.push_back(storages_[size_t(s)].buffer);
      const codegen::Kernel& kern = kernels_[st.kernel];
      if (kern.groups[0] && kern.groups[1] && kern.groups[2])
        stream_->dispatch(*st.pipeline, bufs, kern.groups, nullptr, 0, kern.name);
    } else {
      stream_->copy(storages_[size_t(st.copy_src)].buffer, storages_[size_t(st.copy_dst)].buffer,
                    storages_[size_t(st.copy_dst)].words * 4);
    }
  }
  auto view = [&](int ps) { return storages_[size_t(plan_view_[size_t(ps)])].buffer; };
  if (!p.snapshots.empty()) {
    stream_->barrier();
    for (const plan::Copy& c : p.snapshots) stream_->copy(view(c.src_storage), view(c.dst_storage), c.bytes);
  }
  bool any = false;
  for (const plan::Commit& c : p.commits) any |= !c.in_place;
  if (any) {
    stream_->barrier();
    for (const plan::Commit& c : p.commits)
      if (!c.in_place) stream_->copy(view(c.src_storage), view(c.dst_storage), c.bytes);
  }
  stream_->record();
  stats_.kernels = stream_->dispatch_count();
  stats_.barriers = stream_->barrier_count();
  stats_.commands_ms = ms_since(t0);
  stats_.record_ms += stats_.commands_ms;
}

void GraphExecutor::upload_words(int storage, const std::vector<uint32_t>& words) {
  const Storage& s = storages_[size_t(storage)];
  if (words.empty()) return;
  transfer_->upload(s.buffer, words.data(), words.size() * 4);
}

std::vector<uint32_t> GraphExecutor::download_words(int storage) {
  const Storage& s = storages_[size_t(storage)];
  std::vector<uint32_t> w(s.words);
  transfer_->download(s.buffer, w.data(), w.size() * 4);
  return w;
}

std::vector<float> GraphExecutor::to_float(const std::vector<uint32_t>& w, DType t) const {
  std::vector<float> r(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (t == DType::I32) r[i] = float(int32_t(w[i]));
    else if (t == DType::Bool) r[i] = float(w[i]);
    else std::memcpy(&r[i], &w[i], 4);
  }
  return r;
}

std::vector<uint32_t> GraphExecutor::from_float(std::span<const float> v, DType t, const std::string& who) const {
  std::vector<uint32_t> w(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::I32 || t == DType::Bool) {
      if (v[i] != std::floor(v[i])) throw Error(who + ": non-integer value " + std::to_string(v[i]) + " for an integer tensor");
      w[i] = t == DType::Bool ? uint32_t(v[i] != 0) : uint32_t(int32_t(v[i]));
    } else {
      std::memcpy(&w[i], &v[i], 4);
    }
  }
  return w;
}

std::vector<float> GraphExecutor::download_floats(int storage, DType t, size_t count) {
  if (t != DType::F32) {
    std::vector<float> r = to_float(download_words(storage), t);
    r.resize(count);
    return r;
  }
  std::vector<float> r(count);
  if (count) transfer_->download(storages_[size_t(storage)].buffer, r.data(), count * 4);
  return r;
}

void GraphExecutor::upload_floats(int storage, std::span<const float> v, DType t, const std::string& who) {
  if (t != DType::F32) return upload_words(storage, from_float(v, t, who));
  if (!v.empty()) transfer_->upload(storages_[size_t(storage)].buffer, v.data(), v.size() * 4);
}

void GraphExecutor::set_input_words(const std::string& name, size_t count, const std::vector<uint32_t>& words) {
  upload_words(storage_of_[size_t(*g_.find_named(name))], words);
  (void)count;
}

namespace {
const ir::Node& input_node(const ir::Graph& g, const std::string& name, size_t count) {
  auto id = g.find_named(name);
  if (!id || g.node(*id).op != ir::Op::Input) throw Error("set_input: the graph has no input named '" + name + "'");
  const ir::Node& n = g.node(*id);
  if (int64_t(count) != numel(n.shape))
    throw Error("set_input '" + name + "': got " + std::to_string(count) + " values, shape " + shape_str(n.shape) +
                " needs " + std::to_string(numel(n.shape)));
  return n;
}
}  // namespace

void GraphExecutor::set_input(const std::string& name, std::span<const float> values) {
  ctx_.require_device("set_input");
  const ir::Node& n = input_node(g_, name, values.size());
  if (!need_[size_t(n.id)]) return;  // an input nothing reads
  upload_floats(storage_of_[size_t(n.id)], values, n.dtype, "set_input '" + name + "'");
}

void GraphExecutor::set_input(const std::string& name, const std::vector<int32_t>& values) {
  ctx_.require_device("set_input");
  const ir::Node& n = input_node(g_, name, values.size());
  if (!need_[size_t(n.id)]) return;
  std::vector<uint32_t> w(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (n.dtype == DType::I32) w[i] = uint32_t(values[i]);
    else if (n.dtype == DType::Bool) w[i] = values[i] != 0;
    else {
      float f = float(values[i]);
      std::memcpy(&w[i], &f, 4);
    }
  }
  set_input_words(name, values.size(), w);
}

// Initial contents of the sources the step reads: parameters (now, or lazily), constants, fills.
void GraphExecutor::upload_sources() {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < g_.size(); ++i) {
    if (!need_[size_t(i)] || storage_of_[size_t(i)] < 0) continue;
    const ir::Node& node = g_.node(i);
    if (node.op == ir::Op::Parameter) {
      init_parameter(i);
    } else if (node.op == ir::Op::Constant) {
      std::vector<float> v(node.data->begin(), node.data->end());
      upload_words(storage_of_[size_t(i)], from_float(v, node.dtype, g_.describe(i)));
    } else if (node.op == ir::Op::Full) {
      std::vector<float> v(size_t(numel(node.shape)), float(node.attrs.f("value")));
      upload_words(storage_of_[size_t(i)], from_float(v, node.dtype, g_.describe(i)));
    }
  }
  stats_.upload_ms = ms_since(t0);
}

void GraphExecutor::check_grid(int node, const codegen::Kernel& kern) const {
  const DeviceLimits& L = ctx_.limits();
  for (int d = 0; d < 3; ++d)
    if (kern.groups[size_t(d)] > L.max_workgroup_count[size_t(d)])
      throw Error(g_.describe(node) + ": kernel " + kern.name + " needs " + std::to_string(kern.groups[size_t(d)]) +
                  " workgroups in dimension " + std::to_string(d) + ", the device allows " +
                  std::to_string(L.max_workgroup_count[size_t(d)]));
}

void GraphExecutor::init_parameter(int id) {
  if (opt_.lazy_parameters) {
    pending_init_.insert(id);
    return;
  }
  const ir::Node& node = g_.node(id);
  upload_words(storage_of_[size_t(id)],
               from_float(materialize(node.init, node.shape, node.name), node.dtype, "parameter '" + node.name + "'"));
}

void GraphExecutor::flush_pending_init() {
  std::set<int> pending;
  pending.swap(pending_init_);
  const bool lazy = opt_.lazy_parameters;
  opt_.lazy_parameters = false;
  for (int id : pending) init_parameter(id);
  opt_.lazy_parameters = lazy;
}

void GraphExecutor::run() {
  ctx_.require_device("run");
  flush_pending_init();
  if (opt_.poison)
    for (int s : poison_) upload_words(s, std::vector<uint32_t>(storages_[size_t(s)].words, kNanBits));
  stream_->submit();
}

std::vector<float> GraphExecutor::read_output(const std::string& name) {
  ctx_.require_device("read_output");
  auto id = g_.find_output(name);
  if (!id) throw Error("read_output: the graph has no output named '" + name + "'");
  auto it = output_copy_.find(*id);
  int sid = it != output_copy_.end() ? it->second : storage_of_[size_t(*id)];
  const ir::Node& n = g_.node(*id);
  return download_floats(sid, n.dtype, size_t(numel(n.shape)));
}

const ir::Node& GraphExecutor::named_state(const std::string& name) const {
  auto id = g_.find_named(name);
  if (!id || g_.node(*id).op != ir::Op::Parameter)
    throw Error("the graph has no parameter or state named '" + name + "'");
  return g_.node(*id);
}

std::vector<float> GraphExecutor::read_state(const std::string& name) {
  ctx_.require_device("read_state");
  const ir::Node& n = named_state(name);
  flush_pending_init();
  return download_floats(storage_of_[size_t(n.id)], n.dtype, size_t(numel(n.shape)));
}

void GraphExecutor::write_state(const std::string& name, std::span<const float> values) {
  ctx_.require_device("write_state");
  const ir::Node& n = named_state(name);
  if (int64_t(values.size()) != numel(n.shape))
    throw Error("write_state '" + name + "': got " + std::to_string(values.size()) + " values, expected " +
                std::to_string(numel(n.shape)));
  upload_floats(storage_of_[size_t(n.id)], values, n.dtype, "write_state '" + name + "'");
  pending_init_.erase(n.id);  // its initializer is never needed now
}

std::vector<std::string> GraphExecutor::state_names() const {
  std::vector<std::string> r;
  for (int id : g_.parameters()) r.push_back(g_.node(id).name);
  return r;
}

std::vector<std::pair<std::string, std::string>> GraphExecutor::kernel_sources() const {
  std::vector<std::pair<std::string, std::string>> r;
  for (const auto& k : kernels_) r.push_back({k.name, k.glsl});
  return r;
}

std::vector<DispatchTiming> GraphExecutor::timings() const { return stream_->timings(); }

SessionMemory GraphExecutor::memory() const {
  const MemoryStats m = alloc_->stats();
  SessionMemory r;
  r.device_bytes = m.reserved[size_t(MemoryKind::Device)];
  r.staging_bytes = m.reserved[size_t(MemoryKind::Upload)] + m.reserved[size_t(MemoryKind::Readback)];
  r.arena_bytes = plan_ ? plan_->arena_bytes : 0;
  r.submissions = int(stream_->submission_count());
  return r;
}

}  // namespace mgn::vk
