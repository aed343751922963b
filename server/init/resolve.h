#ifndef MATERIALIZER_SERVER_INIT_RESOLVE_H_
#define MATERIALIZER_SERVER_INIT_RESOLVE_H_

// Decides which init fills each tensor, before anything is allocated:
//   1. the tensor's own `init` or `init_steps`, else
//   2. the first rule in model.init_rules whose pattern matches its name,
//      else
//   3. the default of its module type (module_default).
// A tensor that nothing covers is an error listing every such tensor, so a
// handle can never hold an uninitialized tensor. A tied tensor (tie_root >=
// 0) has no init of its own: its values are its root's. module_default
// tensors get their module's plan (module_plan.h). Every check that could
// fail while filling is made here (value_range.h; in RNG_MODE_PORTABLE the
// kernels' own checks on the requests the fill will make), so Plan and
// Materialize refuse the same requests with the same message.
//
//   ASSIGN_OR_RETURN(Resolution resolution, ResolveInits(model, tensors));

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/cancel.h"
#include "server/init/module_plan.h"
#include "server/init/steps.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Bounds on the matching work a request can ask for (docs/api.md): at most
// kMaxInitRules rules, patterns of at most init::kMaxPatternBytes, and
// (bytes of all tensor names) x (the rules' glob words, glob.h) at most
// kMaxRuleMatchWork: each unit is one step of one match, so the bound is
// on the time itself (a few seconds of one core).
inline constexpr int kMaxInitRules = 1024;
inline constexpr uint64_t kMaxRuleMatchWork = uint64_t{1} << 30;

struct ResolvedInit {
  // What fills the tensor, in order: one step for a plain init, a rule or a
  // module default (module_default, with `module` set); the tensor's
  // init_steps; none for a tied tensor (its storage is its root's).
  std::vector<ResolvedStep> steps;
  // e.g. `normal(mean=0, std=0.02) [rule 1 "*.weight"]`,
  // `zeros [tensor init]`, `normal(mean=0, std=0.02) then zeros on
  // [1:2, 0:768] [tensor init_steps]` or `tied to transformer.wte.weight`.
  std::string description;
  // module_default: the plan of the tensor's module, shared by every
  // module_default tensor of that module; null otherwise.
  std::shared_ptr<const ModulePlan> module;
  // One per step, for Plan and Describe (TensorPlan.steps).
  std::vector<v1::InitStepInfo> step_infos;
  // 0, or 1 + the largest depth of the tensors its steps read (norm_of):
  // filling by increasing depth fills every source first (derived.h).
  int depth = 0;
};

struct Resolution {
  // One per tensor, in tensor order.
  std::vector<ResolvedInit> inits;
  // Rules that match nothing, or only tensors already covered earlier;
  // model.modules entries that own no tensor.
  std::vector<std::string> warnings;
};

// INVALID_ARGUMENT naming the rule or tensor and the reason for: a rule with
// a bad pattern or parameters (or literal values, which belong to one
// tensor), a scheme that cannot fill its tensor or step region (dtype,
// shape, finite range, values size), bad init steps (steps.h), the request
// limits on steps and values, tensors that nothing covers (all listed, up
// to a message-size cap), a module_default that cannot be planned, a bad
// model.modules entry, a scheme without a portable definition in
// RNG_MODE_PORTABLE, more rules or matching work than the bounds above.
// CANCELLED once `cancelled` says the caller is gone (polled between
// tensors).
//
// `loaded`, when given, has one entry per tensor: a non-empty entry says
// the tensor's bytes come from a checkpoint (server/load) and is its
// description; such a tensor needs no init and gets none.
absl::StatusOr<Resolution> ResolveInits(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const Cancelled& cancelled = {},
    const std::vector<std::string>* loaded = nullptr);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_RESOLVE_H_
