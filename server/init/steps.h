#ifndef MATERIALIZER_SERVER_INIT_STEPS_H_
#define MATERIALIZER_SERVER_INIT_STEPS_H_

// Init steps (TensorSpec.init_steps): a tensor's init as a sequence of
// schemes run in order, each over a region (a box of the full tensor) or
// the whole tensor, the way a module's own init code runs
// (`weight.normal_(0, 0.02)`, then `weight[padding_idx].zero_()`). A plain
// `init`, a rule and a module default are one step over the whole tensor.
// docs/init.md ("Init steps") gives the exact Python equivalent in torch
// mode; docs/portable-rng.md how steps are keyed in portable mode.
//
//   ASSIGN_OR_RETURN(std::vector<ResolvedStep> steps,
//                    ResolveInitSteps(i, model.tensors(i), tensors[i], rng));
//
// Thread-safe: pure functions; resolved steps are immutable. No LibTorch.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/elementwise.h"
#include "server/init/portable/box.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

struct ResolvedStep {
  // Never null. Shared: a rule gives one scheme to many tensors, and a
  // values scheme carries its bytes (kept alive here for an async
  // materialization, after the request is gone).
  std::shared_ptr<const v1::InitScheme> scheme;
  // The box of the full tensor the step fills; none for the whole tensor
  // (a region that is the whole tensor is stored as none).
  std::optional<portable::Box> region;
  // InitStep.map, parsed: the step writes the program's result over its
  // leaf (the scheme's values); null for none.
  std::shared_ptr<const ParsedElementwise> map = nullptr;
  // norm_of: the index of the source tensor (its tie root), set when the
  // request is resolved (derived.h); -1 for every other scheme.
  int source = -1;
};

// The step's region as a tensor of its own (name and dtype of `tensor`,
// shape = the region's lengths, or the full shape): what its scheme is
// checked against and what fans come from, as torch computes them for the
// slice `t[region]`.
spec::TensorDesc StepTarget(const spec::TensorDesc& tensor,
                            const ResolvedStep& step);

// The region in Python slice notation: "[1:2, 0:768]".
std::string RegionText(const portable::Box& region);

// "normal(mean=0, std=0.02)", "zeros on [1:2, 0:768]".
std::string DescribeStep(const ResolvedStep& step);

// One line for the whole sequence: the step itself for a single step,
// else the steps joined with " then " (the first three and a count when
// there are more than four).
std::string DescribeSteps(const std::vector<ResolvedStep>& steps);

// InitStepInfo of each step, for Plan and Describe.
std::vector<v1::InitStepInfo> StepInfos(const std::vector<ResolvedStep>& steps);

// Validates TensorSpec.init_steps of tensor `index` (which has some) and
// resolves them (a step's map is parsed and, unless it starts from
// norm_of, whose source is known only with the request, its bounds
// checked: elementwise.h): at most kMaxInitStepsPerTensor; each step sets a scheme
// other than module_default with valid parameters; its region has the
// tensor's rank and lies inside it; the first step covers the whole
// tensor; `empty` only as the first step; the scheme fits the region
// (CheckSchemeFits, values sizes included); in RNG_MODE_TORCH, orthogonal
// over a region torch cannot view as a matrix is refused as torch refuses
// it. INVALID_ARGUMENT naming `model.tensors[i] ("name").init_steps[k]`.
absl::StatusOr<std::vector<ResolvedStep>> ResolveInitSteps(
    int index, const v1::TensorSpec& spec, const spec::TensorDesc& tensor,
    v1::RngMode rng);

// The request-wide limits (spec/limits.h): init steps per tensor and per
// request, and bytes of literal values per request. Cheap (one pass over
// the tensors, no scheme is checked), so it runs first.
absl::Status CheckInitLimits(const v1::ModelSpec& model);

namespace internal {

// torch's view rule (ATen computeStride): whether a tensor of `sizes` with
// `strides` can be viewed as `new_shape` without a copy.
bool CanView(const std::vector<int64_t>& sizes,
             const std::vector<int64_t>& strides,
             const std::vector<int64_t>& new_shape);

}  // namespace internal

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_STEPS_H_
