// describe_plan: the public window onto the static plan (src/plan) of any graph.
#include "mgn/plan.h"

#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "plan/plan.h"

namespace mgn {

namespace {

plan::Plan plan_graph(const Graph& g, const PlanDescribeOptions& opt, const char* who) {
  const uint64_t eb = opt.element_bytes;
  if (eb == 0) throw Error(std::string(who) + ": element_bytes must be positive");
  plan::PlanOptions po;
  po.tensor_bytes = [eb](const ir::Node& n) { return uint64_t(std::max<int64_t>(numel(n.shape), 1)) * eb; };
  po.alignment = opt.alignment;
  po.reuse = po.in_place = po.in_place_assign = opt.reuse;
  return plan::make_plan(g.ir(), po);
}

}  // namespace

std::string describe_plan(const Graph& g, const PlanDescribeOptions& opt) {
  plan::Plan p = plan_graph(g, opt, "describe_plan");
  return opt.dump ? plan::to_text(p, g.ir()) : plan::report_text(p);
}

PlanSummary summarize_plan(const Graph& g, const PlanDescribeOptions& opt) {
  const plan::Plan p = plan_graph(g, opt, "summarize_plan");
  return {.logical_bytes = p.report.logical,
          .physical_bytes = p.report.physical,
          .peak_live_bytes = p.report.step_local_peak_live,
          .dispatches = int(p.dispatches.size()),
          .barrier_groups = p.num_groups()};
}

std::string describe_training_plan(Graph& g, const std::string& loss, const Optimizer& optimizer,
                                   const PlanDescribeOptions& opt) {
  auto id = g.ir().find_output(loss);
  if (!id) throw Error("describe_training_plan: the graph has no output named '" + loss + "'");
  Gradients grads = backward(g, Tensor(&g.ir(), *id));
  append_optimizer(g, grads.params, optimizer);
  g.verify();
  return describe_plan(g, opt);
}

}  // namespace mgn
