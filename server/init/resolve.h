#ifndef MATERIALIZER_SERVER_INIT_RESOLVE_H_
#define MATERIALIZER_SERVER_INIT_RESOLVE_H_

// Decides which init fills each tensor, before anything is allocated:
//   1. the tensor's own `init`, else
//   2. the first rule in model.init_rules whose pattern matches its name.
// A tensor that nothing covers is an error listing every such tensor, so a
// handle can never hold an uninitialized tensor. A tied tensor (tie_root >= 0)
// has no init of its own: its values are its root's. module_default tensors
// get their module's plan (module_plan.h).
//
//   ASSIGN_OR_RETURN(Resolution resolution, ResolveInits(model, tensors));

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/cancel.h"
#include "server/init/module_plan.h"
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
  // Unset for a tied tensor (nothing to write: its storage is its root's).
  v1::InitScheme scheme;
  // e.g. `normal(mean=0, std=0.02) [rule 1 "*.weight"]`,
  // `zeros [tensor init]` or `tied to transformer.wte.weight`.
  std::string description;
  // module_default: the plan of the tensor's module, shared by every
  // module_default tensor of that module; null otherwise.
  std::shared_ptr<const ModulePlan> module;
};

struct Resolution {
  // One per tensor, in tensor order.
  std::vector<ResolvedInit> inits;
  // Rules that match nothing, or only tensors already covered earlier;
  // model.modules entries that own no tensor.
  std::vector<std::string> warnings;
};

// INVALID_ARGUMENT naming the rule or tensor and the reason for: a rule with
// a bad pattern or parameters, a scheme that cannot fill its tensor (dtype,
// shape), tensors that nothing covers (all listed, up to a message-size
// cap), a module_default that cannot be planned, a bad model.modules entry,
// more rules or matching work than the bounds above. CANCELLED once
// `cancelled` says the caller is gone (polled between tensors).
absl::StatusOr<Resolution> ResolveInits(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const Cancelled& cancelled = {});

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_RESOLVE_H_
