#ifndef MATERIALIZER_SERVER_INIT_MODULE_PLAN_H_
#define MATERIALIZER_SERVER_INIT_MODULE_PLAN_H_

// module_default: what reset_parameters() of a torch.nn module does, planned
// before anything is allocated. A plan lists the module's tensors in the
// order reset_parameters() draws random numbers, each with the torch.nn.init
// call it gets (as an InitScheme: kaiming_uniform(a=sqrt(5)),
// uniform(-bound, bound), normal, xavier_uniform, zeros, ones, ...) with the
// bounds already computed from the module's shapes. server/init/apply runs
// the plan with one generator per module, seeded with
// DeriveSeed(seed, module name), so Python's
//   torch.manual_seed(derive_seed(seed, module_name));
//   module.reset_parameters()
// gives the same bits (docs/init.md lists every module type).
//
// A tensor of the module that is not module_default (another init, tied, or
// absent from the request) still has its draws consumed, into scratch
// memory, when a later tensor of the module needs the generator to be where
// reset_parameters() would have it; if its shape cannot be derived from the
// module's other tensors, planning fails naming the tensor it needs.
//
//   ASSIGN_OR_RETURN(ModulePlans plans,
//                    PlanModuleDefaults(model, tensors, is_module_default));
//
// Thread-safe: pure functions; plans are immutable once built.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// One tensor of a module's reset, in the order reset_parameters() draws.
struct ModuleSlot {
  // The tensor's name inside the module: "weight", "bias_hh_l0_reverse".
  std::string local_name;
  // Index in the model's tensor list; -1 if the request does not have it.
  int tensor = -1;
  // The tensor's shape, or the one the module's other tensors imply.
  std::vector<int64_t> shape;
  // The dtype its values are generated in (float8 tensors: float32).
  spec::DType dtype = spec::DType::kFloat32;
  // What reset_parameters() does to it, bounds included.
  v1::InitScheme op;
  // module_default covers it: the arena view is written.
  bool write = false;
  // Not written, but a later written tensor of the module needs its draws:
  // they are drawn into scratch memory of `shape` and `dtype`.
  bool consume = false;
};

struct ModulePlan {
  // Module path (the tensors' name prefix); "" for the root module.
  std::string name;
  // Canonical type name, e.g. "Linear".
  std::string type;
  std::vector<ModuleSlot> slots;
  // Embedding / EmbeddingBag: the row zeroed after the draw (normalized to
  // be non-negative, as torch does in the constructor).
  std::optional<int64_t> padding_idx;
};

struct ModulePlans {
  // Per tensor: the plan of its module if its init is module_default
  // (shared by the module's tensors), else null.
  std::vector<std::shared_ptr<const ModulePlan>> by_tensor;
  // e.g. a ModelSpec.modules entry that owns no tensor.
  std::vector<std::string> warnings;
};

// Validates model.modules (unique names; types that agree with the tensors'
// module_type; padding_idx only for embeddings) and plans every module that
// has a tensor with is_module_default[i]. INVALID_ARGUMENT naming the tensor
// or module entry and the reason: unknown or missing module type (the
// message lists the known ones), a tensor name the type does not have, a
// shape the type cannot have, a tensor whose draws are needed but whose
// shape is unknown, a random draw into an integer tensor.
absl::StatusOr<ModulePlans> PlanModuleDefaults(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const std::vector<bool>& is_module_default);

// "module_default(Linear \"fc1\": kaiming_uniform(a=2.23606797749979, ...))"
// for the tensor `tensor` of `plan`.
std::string DescribeModuleDefault(const ModulePlan& plan, int tensor);

// "Linear", "torch.nn.Linear", "nn.Linear" and
// "torch.nn.modules.linear.Linear" are all "Linear".
std::string CanonicalModuleType(absl::string_view type);

// The module types module_default knows, for messages.
std::string KnownModuleTypes();

// Whether module_default knows `type` (any spelling CanonicalModuleType
// accepts).
bool IsKnownModuleType(absl::string_view type);

// "h.0.attn.weight" -> "h.0.attn" and "weight"; "weight" -> "" and "weight".
absl::string_view ModuleOf(absl::string_view tensor_name);
absl::string_view LocalName(absl::string_view tensor_name);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_MODULE_PLAN_H_
