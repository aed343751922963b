#include "server/spec/validate.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/spec/field_path.h"

namespace materializer::spec {
namespace {

absl::Status Invalid(int index, absl::string_view name,
                     absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat(TensorPath(index, name), ": ", reason));
}

// a * b, or false on overflow past `limit`.
bool MulWithin(uint64_t a, uint64_t b, uint64_t limit, uint64_t* out) {
  if (a != 0 && b > limit / a) return false;
  *out = a * b;
  return true;
}

// Whether every stride of a contiguous tensor of `shape` fits in
// kMaxTensorBytes. torch computes stride[d] as the product of the sizes
// after d, each at least 1, so a tensor without elements can still have
// strides that overflow int64 ([0, 2^32, 2^32]).
bool StridesFit(const v1::TensorSpec& t) {
  uint64_t stride = 1;
  for (int d = t.shape_size() - 1; d > 0; --d) {
    const uint64_t size =
        std::max<uint64_t>(static_cast<uint64_t>(t.shape(d)), 1);
    if (!MulWithin(stride, size, kMaxTensorBytes, &stride)) return false;
  }
  return true;
}

// Sets tie_root for every tensor with tie_to: the end of its chain, which
// must exist, have the same shape and dtype, and not lead back to itself.
absl::Status ResolveTies(
    const v1::ModelSpec& model,
    const absl::flat_hash_map<absl::string_view, int>& index_of,
    std::vector<TensorDesc>& tensors) {
  for (int i = 0; i < model.tensors_size(); ++i) {
    const v1::TensorSpec& t = model.tensors(i);
    if (t.tie_to().empty()) continue;
    if (t.has_init()) {
      return Invalid(i, t.name(),
                     absl::StrCat("has both tie_to and init; a tied tensor "
                                  "takes its values from \"",
                                  t.tie_to(), "\", so remove its init"));
    }
    // Follow the chain; more steps than tensors means a cycle.
    int current = i;
    for (int steps = 0;; ++steps) {
      const std::string& next_name = model.tensors(current).tie_to();
      if (next_name.empty()) break;
      auto it = index_of.find(next_name);
      if (it == index_of.end()) {
        return Invalid(
            current, model.tensors(current).name(),
            absl::StrCat("tie_to \"", next_name, "\" names no tensor of the model"));
      }
      if (it->second == i || steps > model.tensors_size()) {
        return Invalid(i, t.name(),
                       absl::StrCat("tie_to forms a cycle through \"",
                                    next_name, "\""));
      }
      current = it->second;
    }
    const TensorDesc& root = tensors[current];
    TensorDesc& tied = tensors[i];
    if (root.shape != tied.shape || root.dtype != tied.dtype) {
      return Invalid(
          i, t.name(),
          absl::StrCat("tie_to \"", root.name, "\": shape [",
                       absl::StrJoin(tied.shape, ", "), "] ", Name(tied.dtype),
                       " differs from the root's [",
                       absl::StrJoin(root.shape, ", "), "] ", Name(root.dtype)));
    }
    tied.tie_root = current;
  }
  return absl::OkStatus();
}

}  // namespace

std::string NameProblem(absl::string_view name) {
  if (name.empty()) return "name is empty";
  if (name.size() > kMaxNameLength) {
    return absl::StrCat("name is ", name.size(), " bytes; the limit is ",
                        kMaxNameLength);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      return absl::StrCat(
          "name has character 0x", absl::Hex(c, absl::kZeroPad2),
          " at byte ", i,
          "; names are printable ASCII without spaces, quotes or "
          "backslashes");
    }
  }
  if (name.front() == '.' || name.back() == '.' ||
      name.find("..") != absl::string_view::npos) {
    return "name has an empty dot-separated component";
  }
  if (name == "__metadata__") {
    return "\"__metadata__\" is reserved by the safetensors format";
  }
  return "";
}

absl::StatusOr<std::vector<TensorDesc>> ValidateTensors(
    const v1::ModelSpec& model) {
  if (model.tensors_size() == 0) {
    // A handle holds at least one tensor; an empty model is a client bug
    // (a filter that left nothing), better reported than materialized.
    return absl::InvalidArgumentError(
        "model.tensors: the model has no tensors");
  }
  if (model.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.tensors: ", model.tensors_size(),
                     " tensors; the limit is ", kMaxTensors));
  }
  std::vector<TensorDesc> out;
  out.reserve(model.tensors_size());
  absl::flat_hash_map<absl::string_view, int> seen;
  seen.reserve(model.tensors_size());

  for (int i = 0; i < model.tensors_size(); ++i) {
    const v1::TensorSpec& t = model.tensors(i);
    if (std::string problem = NameProblem(t.name()); !problem.empty()) {
      return Invalid(i, t.name(), problem);
    }
    if (auto [it, inserted] = seen.emplace(t.name(), i); !inserted) {
      return Invalid(i, t.name(),
                     absl::StrCat("duplicate name; model.tensors[", it->second,
                                  "] has the same name"));
    }
    if (t.shape_size() > kMaxRank) {
      return Invalid(i, t.name(),
                     absl::StrCat("shape has ", t.shape_size(),
                                  " dimensions; the limit is ", kMaxRank));
    }
    const std::optional<DType> dtype = ParseDType(t.dtype());
    if (!dtype.has_value()) {
      return Invalid(
          i, t.name(),
          t.dtype().empty()
              ? absl::StrCat("dtype is missing; one of: ", KnownDTypeNames())
              : absl::StrCat("unknown dtype \"", t.dtype(),
                             "\"; one of: ", KnownDTypeNames()));
    }
    if (!v1::TensorKind_IsValid(t.kind())) {
      return Invalid(i, t.name(), absl::StrCat("unknown kind ", t.kind()));
    }

    TensorDesc desc;
    desc.name = t.name();
    desc.dtype = *dtype;
    desc.is_buffer = t.kind() == v1::TENSOR_KIND_BUFFER;
    if (t.has_persistent() && !t.persistent() && !desc.is_buffer) {
      return Invalid(i, t.name(),
                     "persistent=false is only meaningful for buffers "
                     "(kind BUFFER); parameters are always in the state_dict");
    }
    desc.persistent = !t.has_persistent() || t.persistent();
    desc.module_type = t.module_type();

    uint64_t numel = 1;
    for (int d = 0; d < t.shape_size(); ++d) {
      const int64_t size = t.shape(d);
      if (size < 0) {
        return Invalid(i, t.name(),
                       absl::StrCat("shape[", d, "] is ", size,
                                    "; sizes must be >= 0"));
      }
      if (!MulWithin(numel, static_cast<uint64_t>(size), kMaxTensorBytes,
                     &numel)) {
        return Invalid(
            i, t.name(),
            absl::StrCat("shape [", absl::StrJoin(t.shape(), ", "),
                         "] has more than 2^63-1 elements"));
      }
    }
    if (!StridesFit(t)) {
      return Invalid(
          i, t.name(),
          absl::StrCat("shape [", absl::StrJoin(t.shape(), ", "),
                       "] has strides of more than 2^63-1 elements (a "
                       "stride is the product of the later sizes, each "
                       "counted as at least 1, as torch computes it)"));
    }
    uint64_t nbytes = 0;
    if (!MulWithin(numel, ItemSize(*dtype), kMaxTensorBytes, &nbytes)) {
      return Invalid(i, t.name(),
                     absl::StrCat("shape [", absl::StrJoin(t.shape(), ", "),
                                  "] of ", Name(*dtype),
                                  " is more than 2^63-1 bytes"));
    }
    desc.shape.assign(t.shape().begin(), t.shape().end());
    desc.numel = numel;
    desc.nbytes = nbytes;
    out.push_back(std::move(desc));
  }
  RETURN_IF_ERROR(ResolveTies(model, seen, out));
  return out;
}

}  // namespace materializer::spec
