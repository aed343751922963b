#ifndef MATERIALIZER_SERVER_INIT_DERIVED_H_
#define MATERIALIZER_SERVER_INIT_DERIVED_H_

// The request-wide part of derived values (docs/init.md, "Derived
// values"): init steps that read other tensors (norm_of) and the bounds of
// programs that start from them. Runs after every tensor's steps are
// resolved, before anything is allocated:
//   - each norm_of names a tensor of the request (a tie resolves to its
//     root), whose rank holds `dim`, and the filled tensor has the shape
//     torch.norm_except_dim gives; the source's index is stored in the
//     step (ResolvedStep::source);
//   - no tensor reads itself, directly or through a chain of norms (a
//     cycle is refused, naming the tensors on it);
//   - every value a norm can produce is finite: the source's values are
//     bounded (each of its steps: the scheme's range, through its map), the
//     sum of squares must fit the accumulation type, the norm and any
//     program on it must fit the dtypes (elementwise.h);
//   - each tensor gets a depth: 0, or 1 + the largest depth of the tensors
//     it reads, so that filling by increasing depth fills every source
//     before its readers (RNG_MODE_TORCH reads the source's stored values).
// A request with no norm_of does nothing here.
//
// Thread-safe: pure functions over the caller's data. No LibTorch.

#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/steps.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

struct DerivedTensor {
  // The tensor's resolved steps (empty for a tied tensor). norm_of steps
  // get their `source` set.
  std::vector<ResolvedStep>* steps = nullptr;
  // For a module_default tensor, the scheme its module's reset draws into
  // it (its values' range); null otherwise.
  const v1::InitScheme* module_op = nullptr;
  // Filled from a checkpoint (no steps): its values are whatever the file
  // holds, so a program reading them has no finite bound to prove.
  bool loaded = false;
};

// `derived` has one entry per tensor, in tensor order. Returns each
// tensor's depth, or INVALID_ARGUMENT naming the tensor (as
// `model.tensors[i] ("name").init...norm_of`) and the reason.
absl::StatusOr<std::vector<int>> ResolveDerived(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    std::vector<DerivedTensor>& derived);

// The shape torch.norm_except_dim(source, 2, dim) returns: 1 in every
// dimension but `dim`, which keeps the source's size; [] for dim -1.
std::vector<int64_t> NormShape(const std::vector<int64_t>& source_shape,
                               int64_t dim);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_DERIVED_H_
