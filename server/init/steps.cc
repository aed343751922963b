#include "server/init/steps.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/schemes.h"
#include "server/init/value_range.h"
#include "server/spec/field_path.h"
#include "server/spec/limits.h"

namespace materializer::init {
namespace {

// Steps shown in full in a one-line summary before it is abbreviated.
constexpr size_t kStepsInSummary = 4;

std::string StepPath(int index, absl::string_view name, int step) {
  return absl::StrCat(spec::TensorPath(index, name), ".init_steps[", step, "]");
}

absl::Status Invalid(const std::string& path, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", reason));
}

// The region of step `k`, checked against the full shape; none when it
// is empty or covers the whole tensor.
absl::StatusOr<std::optional<portable::Box>> ParseRegion(
    const v1::InitStep& step, const std::vector<int64_t>& shape,
    const std::string& path) {
  if (step.region_size() == 0) return std::optional<portable::Box>();
  if (step.region_size() != static_cast<int>(shape.size())) {
    return Invalid(
        path, absl::StrCat("region has ", step.region_size(),
                           " ranges for a tensor of ", shape.size(),
                           " dimensions (shape [", absl::StrJoin(shape, ", "),
                           "]); give one per dimension, or none "
                           "for the whole tensor"));
  }
  portable::Box box;
  bool whole = true;
  for (int d = 0; d < step.region_size(); ++d) {
    const int64_t offset = step.region(d).offset();
    const int64_t length = step.region(d).length();
    if (offset < 0 || length < 0 || offset > shape[d] ||
        length > shape[d] - offset) {
      return Invalid(
          path,
          absl::StrCat("region[", d, "] is offset ", offset, " length ", length,
                       "; it must lie inside the dimension's size ", shape[d],
                       " (0 <= offset <= offset + length "
                       "<= size)"));
    }
    whole = whole && offset == 0 && length == shape[d];
    box.offset.push_back(offset);
    box.length.push_back(length);
  }
  if (whole) return std::optional<portable::Box>();
  return std::optional<portable::Box>(std::move(box));
}

// Strides of a contiguous tensor of `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return strides;
}

// torch.nn.init.orthogonal_ ends with `tensor.view_as(q)`, q of shape
// (rows, numel / rows): on a slice whose trailing dimensions do not merge
// torch raises ("view size is not compatible with input tensor's size and
// stride"). The service fills float32 and float64 in place, as torch does
// (other dtypes go through a contiguous float32 copy).
absl::Status CheckOrthogonalView(const spec::TensorDesc& tensor,
                                 const ResolvedStep& step,
                                 const std::string& path) {
  if (!step.scheme->has_orthogonal() || !step.region.has_value()) {
    return absl::OkStatus();
  }
  if (tensor.dtype != spec::DType::kFloat32 &&
      tensor.dtype != spec::DType::kFloat64) {
    return absl::OkStatus();
  }
  const std::vector<int64_t>& sizes = step.region->length;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel == 0) return absl::OkStatus();  // nothing is drawn
  const std::vector<int64_t> matrix = {sizes[0], numel / sizes[0]};
  if (internal::CanView(sizes, ContiguousStrides(tensor.full_shape()),
                        matrix)) {
    return absl::OkStatus();
  }
  return Invalid(
      path,
      absl::StrCat("orthogonal on region ", RegionText(*step.region),
                   ": torch.nn.init.orthogonal_ views the slice as a [",
                   matrix[0], ", ", matrix[1],
                   "] matrix, which this slice's strides do not allow (torch "
                   "raises \"view size is not compatible\"); use a region "
                   "whose trailing dimensions are whole"));
}

uint64_t ValuesBytes(const v1::InitScheme& scheme) {
  return scheme.has_values() ? scheme.values().data().size() : 0;
}

}  // namespace

namespace internal {

// A transcription of ATen's computeStride (TensorUtils.cpp), reduced to
// whether the view exists.
bool CanView(const std::vector<int64_t>& sizes,
             const std::vector<int64_t>& strides,
             const std::vector<int64_t>& new_shape) {
  if (sizes.empty()) return true;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel == 0) return true;
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(sizes.size()) - 1; tensor_d >= 0;
       --tensor_d) {
    tensor_numel *= sizes[tensor_d];
    if (tensor_d == 0 ||
        (sizes[tensor_d - 1] != 1 &&
         strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 &&
             (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace internal

spec::TensorDesc StepTarget(const spec::TensorDesc& tensor,
                            const ResolvedStep& step) {
  spec::TensorDesc target;
  target.name = tensor.name;
  target.dtype = tensor.dtype;
  target.is_buffer = tensor.is_buffer;
  target.persistent = tensor.persistent;
  target.module_type = tensor.module_type;
  target.shape =
      step.region.has_value() ? step.region->length : tensor.full_shape();
  target.numel = 1;
  for (int64_t s : target.shape) target.numel *= static_cast<uint64_t>(s);
  target.nbytes = target.numel * spec::ItemSize(target.dtype);
  return target;
}

std::string RegionText(const portable::Box& region) {
  std::vector<std::string> ranges;
  for (size_t d = 0; d < region.offset.size(); ++d) {
    ranges.push_back(absl::StrCat(region.offset[d], ":",
                                  region.offset[d] + region.length[d]));
  }
  return absl::StrCat("[", absl::StrJoin(ranges, ", "), "]");
}

std::string DescribeStep(const ResolvedStep& step) {
  std::string text = DescribeScheme(*step.scheme);
  if (step.map != nullptr) {
    absl::StrAppend(&text, " then ", DescribeElementwise(*step.map));
  }
  if (step.region.has_value()) {
    absl::StrAppend(&text, " on ", RegionText(*step.region));
  }
  return text;
}

std::string DescribeSteps(const std::vector<ResolvedStep>& steps) {
  std::vector<std::string> parts;
  const size_t shown =
      steps.size() > kStepsInSummary ? kStepsInSummary - 1 : steps.size();
  for (size_t k = 0; k < shown; ++k) parts.push_back(DescribeStep(steps[k]));
  std::string text = absl::StrJoin(parts, " then ");
  if (shown < steps.size()) {
    absl::StrAppend(&text, " then ... (", steps.size(), " steps)");
  }
  return text;
}

std::vector<v1::InitStepInfo> StepInfos(
    const std::vector<ResolvedStep>& steps) {
  std::vector<v1::InitStepInfo> infos;
  infos.reserve(steps.size());
  for (const ResolvedStep& step : steps) {
    v1::InitStepInfo& info = infos.emplace_back();
    info.set_init(step.map == nullptr
                      ? DescribeScheme(*step.scheme)
                      : absl::StrCat(DescribeScheme(*step.scheme), " then ",
                                     DescribeElementwise(*step.map)));
    if (step.region.has_value()) {
      for (size_t d = 0; d < step.region->offset.size(); ++d) {
        v1::DimRange* range = info.add_region();
        range->set_offset(step.region->offset[d]);
        range->set_length(step.region->length[d]);
      }
    }
  }
  return infos;
}

absl::StatusOr<std::vector<ResolvedStep>> ResolveInitSteps(
    int index, const v1::TensorSpec& spec, const spec::TensorDesc& tensor,
    v1::RngMode rng) {
  if (spec.init_steps_size() > spec::kMaxInitStepsPerTensor) {
    return Invalid(
        absl::StrCat(spec::TensorPath(index, tensor.name), ".init_steps"),
        absl::StrCat(spec.init_steps_size(), " steps; the limit is ",
                     spec::kMaxInitStepsPerTensor, " per tensor"));
  }
  std::vector<ResolvedStep> steps;
  steps.reserve(spec.init_steps_size());
  for (int k = 0; k < spec.init_steps_size(); ++k) {
    const v1::InitStep& step = spec.init_steps(k);
    const std::string path = StepPath(index, tensor.name, k);
    const v1::InitScheme& scheme = step.init();
    if (scheme.has_module_default()) {
      return Invalid(
          path,
          "module_default cannot be a step: steps are explicit schemes, and "
          "module_default stands for a whole module's reset_parameters() "
          "drawn from the module's generator. Leave the tensor without an "
          "init to get its module default, or send the calls "
          "reset_parameters() makes as steps");
    }
    if (absl::Status s = CheckSchemeParameters(scheme); !s.ok()) {
      return Invalid(absl::StrCat(path, ".init"), s.message());
    }
    if (scheme.has_empty() && k > 0) {
      return Invalid(path,
                     "empty writes nothing, so it may only be the first "
                     "step (where it leaves fresh memory)");
    }
    absl::StatusOr<std::optional<portable::Box>> region =
        ParseRegion(step, tensor.full_shape(), path);
    if (!region.ok()) return region.status();
    if (k == 0 && region->has_value()) {
      return Invalid(
          path,
          absl::StrCat("the first step covers region ", RegionText(**region),
                       " only; it must cover the whole tensor (no "
                       "region), so no element is left "
                       "uninitialized"));
    }
    ResolvedStep resolved{std::make_shared<const v1::InitScheme>(scheme),
                          *std::move(region)};
    if (scheme.has_norm_of() && resolved.region.has_value()) {
      return Invalid(absl::StrCat(path, ".init"),
                     "norm_of fills the whole tensor; give it no region");
    }
    // With a map, the init makes the program's leaf in the compute dtype,
    // so its values are checked against that dtype (and the program's
    // result against the tensor's).
    spec::TensorDesc target = StepTarget(tensor, resolved);
    if (step.has_map()) {
      absl::StatusOr<ParsedElementwise> map =
          ParseElementwise(step.map(), tensor.dtype);
      if (!map.ok()) return Invalid(path, map.status().message());
      if (scheme.has_empty() || scheme.has_values()) {
        return Invalid(path, absl::StrCat("map starts from ",
                                          DescribeScheme(scheme),
                                          ": a program starts from a draw, a "
                                          "fill, arange, eye, dirac, "
                                          "rope_inv_freq or norm_of; send "
                                          "values you computed as they are"));
      }
      target.dtype = map->compute;
      resolved.map = std::make_shared<const ParsedElementwise>(*std::move(map));
    }
    if (absl::Status s = CheckSchemeFits(*resolved.scheme, target); !s.ok()) {
      return Invalid(
          absl::StrCat(path, ".init"),
          resolved.region.has_value()
              ? absl::StrCat("on region ", RegionText(*resolved.region), ": ",
                             s.message())
              : std::string(s.message()));
    }
    if (resolved.map != nullptr && !scheme.has_norm_of()) {
      absl::StatusOr<Interval> leaf = LeafBounds(scheme, target);
      absl::Status s = leaf.ok() ? CheckElementwiseBounds(*resolved.map, *leaf,
                                                          tensor.dtype)
                                       .status()
                                 : leaf.status();
      if (!s.ok()) return Invalid(path, s.message());
    }
    if (rng == v1::RNG_MODE_TORCH && resolved.map == nullptr) {
      if (absl::Status s = CheckOrthogonalView(tensor, resolved, path);
          !s.ok()) {
        return s;
      }
    }
    steps.push_back(std::move(resolved));
  }
  return steps;
}

absl::Status CheckInitLimits(const v1::ModelSpec& model) {
  // (Rules carry no values: ResolveInits refuses them.)
  int64_t steps = 0;
  uint64_t values_bytes = 0;
  for (int i = 0; i < model.tensors_size(); ++i) {
    const v1::TensorSpec& t = model.tensors(i);
    if (t.init_steps_size() > spec::kMaxInitStepsPerTensor) {
      return Invalid(absl::StrCat(spec::TensorPath(i, t.name()), ".init_steps"),
                     absl::StrCat(t.init_steps_size(), " steps; the limit is ",
                                  spec::kMaxInitStepsPerTensor, " per tensor"));
    }
    steps += t.init_steps_size();
    if (steps > spec::kMaxInitStepsPerRequest) {
      return Invalid(absl::StrCat(spec::TensorPath(i, t.name()), ".init_steps"),
                     absl::StrCat("the request has more than ",
                                  spec::kMaxInitStepsPerRequest,
                                  " init steps in all, the limit per request"));
    }
    uint64_t bytes = ValuesBytes(t.init());
    for (const v1::InitStep& step : t.init_steps()) {
      bytes += ValuesBytes(step.init());
    }
    values_bytes += bytes;
    if (bytes > 0 && values_bytes > spec::kMaxValuesBytesPerRequest) {
      return Invalid(
          spec::TensorPath(i, t.name()),
          absl::StrCat("its values bring the request's literal "
                       "values to ",
                       values_bytes, " bytes; the limit is ",
                       spec::kMaxValuesBytesPerRequest, " bytes per request"));
    }
  }
  return absl::OkStatus();
}

}  // namespace materializer::init
