// Optimizer lowering: appends the SGD / Adam / AdamW update of every trained parameter to the graph as
// ordinary ops plus assign(), mirroring torch.optim's single-tensor update order step by step.
#include <cmath>
#include <set>

#include "ir/graph.h"
#include "mgn/optim.h"

namespace mgn {

double base_lr(const Optimizer& opt) {
  return std::visit([](const auto& o) { return o.lr; }, opt);
}

const char* optimizer_name(const Optimizer& opt) {
  struct Name {
    const char* operator()(const SGD&) const { return "sgd"; }
    const char* operator()(const Adam&) const { return "adam"; }
    const char* operator()(const AdamW&) const { return "adamw"; }
  };
  return std::visit(Name{}, opt);
}

void Schedule::validate() const {
  auto bad = [](const std::string& why) { throw Error("learning-rate schedule: " + why); };
  if ((kind == Kind::LinearWarmup || kind == Kind::WarmupCosine) && warmup_steps <= 0)
    bad("warm-up needs warmup_steps > 0, got " + std::to_string(warmup_steps));
  if ((kind == Kind::Cosine || kind == Kind::WarmupCosine) && total_steps <= 0)
    bad("cosine decay needs total_steps > 0, got " + std::to_string(total_steps));
  if (kind == Kind::WarmupCosine && warmup_steps >= total_steps)
    bad("warmup_steps (" + std::to_string(warmup_steps) + ") must be below total_steps (" +
        std::to_string(total_steps) + ")");
  if (min_lr_ratio < 0 || min_lr_ratio > 1) bad("min_lr_ratio must lie in [0, 1]");
  if (warmup_start_factor < 0 || warmup_start_factor > 1) bad("warmup_start_factor must lie in [0, 1]");
}

double Schedule::lr(double base, int64_t t) const {
  const double pi = std::acos(-1.0);
  auto warm = [&](int64_t s) {
    double frac = double(std::min(s, warmup_steps)) / double(warmup_steps);
    return base * (warmup_start_factor + (1 - warmup_start_factor) * frac);
  };
  auto cosine = [&](int64_t s, int64_t span) {
    double lo = base * min_lr_ratio;
    double frac = double(std::min(s, span)) / double(span);
    return lo + (base - lo) * (1 + std::cos(pi * frac)) / 2;
  };
  switch (kind) {
    case Kind::Constant:
      return base;
    case Kind::LinearWarmup:
      return warm(t);
    case Kind::Cosine:
      return cosine(t, total_steps);
    case Kind::WarmupCosine:
      return t < warmup_steps ? warm(t) : cosine(t - warmup_steps, total_steps - warmup_steps);
  }
  return base;
}

std::vector<float> UpdatePlan::scalar_inputs(double lr, int64_t t) const {
  std::vector<float> r{float(lr)};
  double step = double(t + 1);
  auto adam_like = [&](double b1, double b2) {
    // 1 - b^n = -expm1(n log b): exact to the last digit even when b^n is close to 1.
    r.push_back(float(-std::expm1(step * std::log(b1))));
    r.push_back(float(-std::expm1(step * std::log(b2))));
  };
  if (auto* a = std::get_if<Adam>(&optimizer)) adam_like(a->beta1, a->beta2);
  if (auto* a = std::get_if<AdamW>(&optimizer)) adam_like(a->beta1, a->beta2);
  return r;
}

namespace {

double lr_scale_for(const std::string& name, const std::vector<LrMultiplier>& mults) {
  double scale = 1;
  size_t best = 0;
  bool found = false;
  for (const LrMultiplier& m : mults)
    if (name.rfind(m.prefix, 0) == 0 && (!found || m.prefix.size() > best)) {
      scale = m.scale;
      best = m.prefix.size();
      found = true;
    }
  return scale;
}

void check_hyper(const Optimizer& opt) {
  auto bad = [&](const std::string& why) { throw Error(std::string(optimizer_name(opt)) + ": " + why); };
  if (base_lr(opt) < 0) bad("lr must be >= 0");
  if (auto* s = std::get_if<SGD>(&opt)) {
    if (s->momentum < 0) bad("momentum must be >= 0");
    if (s->weight_decay < 0) bad("weight_decay must be >= 0");
    if (s->nesterov && (s->momentum <= 0 || s->dampening != 0))
      bad("Nesterov momentum requires momentum > 0 and dampening = 0 (as torch.optim.SGD)");
  }
  auto adam = [&](double b1, double b2, double eps, double wd) {
    if (!(b1 >= 0 && b1 < 1)) bad("beta1 must lie in [0, 1)");
    if (!(b2 >= 0 && b2 < 1)) bad("beta2 must lie in [0, 1)");
    if (eps < 0) bad("eps must be >= 0");
    if (wd < 0) bad("weight_decay must be >= 0");
  };
  if (auto* a = std::get_if<Adam>(&opt)) adam(a->beta1, a->beta2, a->eps, a->weight_decay);
  if (auto* a = std::get_if<AdamW>(&opt)) adam(a->beta1, a->beta2, a->eps, a->weight_decay);
}

}  // namespace

UpdatePlan append_optimizer(Graph& g, const std::map<std::string, Tensor>& grads, const Optimizer& opt,
                            const UpdateOptions& options) {
  check_hyper(opt);
  if (g.find(UpdatePlan::kLrInput) || g.find(UpdatePlan::kStepState))
    throw Error("append_optimizer: the graph already holds an optimizer (it has '" +
                std::string(UpdatePlan::kLrInput) + "')");
  if (grads.empty()) throw Error("append_optimizer: no gradients given (nothing to train)");
  if (options.clip_grad_norm < 0) throw Error("append_optimizer: clip_grad_norm must be >= 0");

  ir::Graph& ir = g.ir();
  // Parameters in graph order, so the appended ops (and the checkpoint's state) are deterministic.
  struct Item {
    std::string name;
    Tensor param, grad;
  };
  std::vector<Item> items;
  std::set<std::string> seen;
  for (int id : ir.parameters()) {
    const ir::Node& n = ir.node(id);
    auto it = grads.find(n.name);
    if (it == grads.end()) continue;
    if (!n.trainable)
      throw Error("append_optimizer: parameter '" + n.name + "' is frozen or state; it cannot be trained");
    const Tensor& gr = it->second;
    if (!gr.valid() || gr.graph() != &ir)
      throw Error("append_optimizer: the gradient of '" + n.name + "' is not a tensor of this graph");
    if (gr.shape() != n.shape)
      throw Error("append_optimizer: the gradient of '" + n.name + "' has shape " + shape_str(gr.shape()) +
                  ", the parameter has " + shape_str(n.shape));
    if (!is_float(gr.dtype()))
      throw Error("append_optimizer: the gradient of '" + n.name + "' has dtype " + dtype_name(gr.dtype()));
    items.push_back({n.name, Tensor(&ir, id), gr});
    seen.insert(n.name);
  }
  for (auto& [name, t] : grads)
    if (!seen.count(name)) throw Error("append_optimizer: the graph has no parameter named '" + name + "'");

  UpdatePlan plan;
  plan.optimizer = opt;
  Tensor lr = g.input(UpdatePlan::kLrInput, {});
  plan.inputs.push_back(UpdatePlan::kLrInput);
  Tensor bc1, bc2;
  if (!std::holds_alternative<SGD>(opt)) {
    bc1 = g.input(UpdatePlan::kBiasCorrection1Input, {});
    bc2 = g.input(UpdatePlan::kBiasCorrection2Input, {});
    plan.inputs.push_back(UpdatePlan::kBiasCorrection1Input);
    plan.inputs.push_back(UpdatePlan::kBiasCorrection2Input);
  }
  Tensor step = g.state(UpdatePlan::kStepState, {});
  plan.state_names.push_back(UpdatePlan::kStepState);

  // Every update is computed in f32; an f16/bf16 parameter is widened, updated and rounded back.
  auto f32 = [](Tensor t) { return t.dtype() == DType::F32 ? t : cast(t, DType::F32); };
  std::vector<Tensor> gs;
  for (Item& it : items) gs.push_back(f32(it.grad));

  if (options.clip_grad_norm > 0) {
    Tensor sq;
    for (Tensor& gr : gs) {
      Tensor s = sum(square(gr));
      sq = sq.valid() ? add(sq, s) : s;
    }
    Tensor norm = sqrt(sq);
    g.output(UpdatePlan::kGradNormOutput, norm);
    Tensor coef = minimum(options.clip_grad_norm / (norm + 1e-6), g.scalar(1.0));
    for (Tensor& gr : gs) gr = mul(gr, coef);
  }

  auto moment = [&](const Item& it, const char* slot) {
    std::string name = "optim." + it.name + "." + slot;
    if (g.find(name)) throw Error("append_optimizer: the graph already has a tensor named '" + name + "'");
    plan.state_names.push_back(name);
    return g.state(name, it.param.shape());
  };

  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    Tensor p = f32(it.param), d = gs[i];
    double scale = lr_scale_for(it.name, options.lr_multipliers);
    Tensor lr_p = scale == 1 ? lr : lr * scale;
    Tensor np;
    if (auto* s = std::get_if<SGD>(&opt)) {
      if (s->weight_decay != 0) d = d + p * s->weight_decay;
      if (s->momentum != 0) {
        Tensor buf = moment(it, "momentum_buffer");
        Tensor nb = buf * s->momentum + (s->dampening != 0 ? d * (1 - s->dampening) : d);
        // torch starts the buffer at the first gradient itself, undamped.
        if (s->dampening != 0) nb = where(greater(step, g.scalar(0.0)), nb, d);
        assign(buf, nb);
        d = s->nesterov ? d + nb * s->momentum : nb;
      }
      np = p - lr_p * d;
    } else {
      double b1, b2, eps;
      if (auto* a = std::get_if<Adam>(&opt)) {
        b1 = a->beta1, b2 = a->beta2, eps = a->eps;
        if (a->weight_decay != 0) d = d + p * a->weight_decay;
      } else {
        const AdamW& w = std::get<AdamW>(opt);
        b1 = w.beta1, b2 = w.beta2, eps = w.eps;
        if (w.weight_decay != 0) p = p * (1.0 - lr_p * w.weight_decay);
      }
      Tensor m = moment(it, "exp_avg"), v = moment(it, "exp_avg_sq");
      Tensor nm = m * b1 + d * (1 - b1);
      Tensor nv = v * b2 + square(d) * (1 - b2);
      assign(m, nm);
      assign(v, nv);
      Tensor step_size = lr_p / bc1;
      Tensor denom = sqrt(nv) / sqrt(bc2) + eps;
      np = p - step_size * (nm / denom);
    }
    if (np.dtype() != it.param.dtype()) np = cast(np, it.param.dtype());
    assign(it.param, np);
    plan.params.push_back(it.name);
  }
  assign(step, step + 1.0);
  return plan;
}

}  // namespace mgn
