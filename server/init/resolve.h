#ifndef MATERIALIZER_SERVER_INIT_RESOLVE_H_
#define MATERIALIZER_SERVER_INIT_RESOLVE_H_

// Decides which init fills each tensor, before anything is allocated:
//   1. the tensor's own `init`, else
//   2. the first rule in model.init_rules whose pattern matches its name.
// A tensor that nothing covers is an error listing every such tensor, so a
// handle can never hold an uninitialized tensor.
//
//   ASSIGN_OR_RETURN(Resolution resolution, ResolveInits(model, tensors));

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

struct ResolvedInit {
  v1::InitScheme scheme;
  // e.g. `normal(mean=0, std=0.02) [rule 1 "*.weight"]` or
  // `zeros [tensor init]`.
  std::string description;
};

struct Resolution {
  // One per tensor, in tensor order.
  std::vector<ResolvedInit> inits;
  // Rules that match nothing, or only tensors already covered earlier.
  std::vector<std::string> warnings;
};

// INVALID_ARGUMENT naming the rule or tensor and the reason for: a rule with
// a bad pattern or parameters, a scheme that cannot fill its tensor's dtype,
// tensors that nothing covers (all listed, up to a message-size cap).
absl::StatusOr<Resolution> ResolveInits(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_RESOLVE_H_
