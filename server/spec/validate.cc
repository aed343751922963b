#include "server/spec/validate.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::spec {
namespace {

std::string TensorPath(int index, absl::string_view name) {
  // Valid names (at most kMaxNameLength) are shown whole.
  return absl::StrCat("model.tensors[", index, "] (",
                      Quote(name, kMaxNameLength), ")");
}

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

// Sets tie_root for every tensor with tie_to: the end of its chain, which
// must exist, have the same shape and dtype, and not lead back to itself.
// Linear in the number of tensors: each tensor's root is found once and
// remembered, so a chain of n tensors costs n steps in all, not n^2.
absl::Status ResolveTies(
    const v1::ModelSpec& model,
    const absl::flat_hash_map<absl::string_view, int>& index_of,
    std::vector<TensorDesc>& tensors) {
  enum : char { kUnseen = 0, kOnPath = 1, kDone = 2 };
  const int n = model.tensors_size();
  std::vector<char> state(n, kUnseen);
  std::vector<int> root(n, -1);
  std::vector<int> path;
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& t = model.tensors(i);
    if (t.tie_to().empty()) continue;
    if (t.has_init()) {
      return Invalid(i, t.name(),
                     absl::StrCat("has both tie_to and init; a tied tensor "
                                  "takes its values from ",
                                  Quote(t.tie_to()), ", so remove its init"));
    }
    // Follow the chain until a tensor whose root is known, or the root.
    path.clear();
    int current = i;
    int found = -1;
    while (found < 0) {
      if (state[current] == kDone) {
        found = root[current];
        break;
      }
      state[current] = kOnPath;
      path.push_back(current);
      const std::string& next_name = model.tensors(current).tie_to();
      if (next_name.empty()) {
        found = current;
        break;
      }
      auto it = index_of.find(next_name);
      if (it == index_of.end()) {
        return Invalid(current, model.tensors(current).name(),
                       absl::StrCat("tie_to ", Quote(next_name),
                                    " names no tensor of the model"));
      }
      if (state[it->second] == kOnPath) {
        return Invalid(i, t.name(),
                       absl::StrCat("tie_to forms a cycle through ",
                                    Quote(next_name)));
      }
      current = it->second;
    }
    for (int k : path) {
      root[k] = found;
      state[k] = kDone;
    }
    const TensorDesc& root_desc = tensors[found];
    TensorDesc& tied = tensors[i];
    if (root_desc.shape != tied.shape || root_desc.dtype != tied.dtype) {
      return Invalid(
          i, t.name(),
          absl::StrCat("tie_to ", Quote(root_desc.name), ": shape [",
                       absl::StrJoin(tied.shape, ", "), "] ", Name(tied.dtype),
                       " differs from the root's [",
                       absl::StrJoin(root_desc.shape, ", "), "] ",
                       Name(root_desc.dtype)));
    }
    tied.tie_root = found;
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
    const v1::ModelSpec& model, const Cancelled& cancelled) {
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
    if (i % kCancelPollInterval == 0) RETURN_IF_ERROR(CheckCancelled(cancelled));
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
              : absl::StrCat("unknown dtype ", Quote(t.dtype()),
                             "; one of: ", KnownDTypeNames()));
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
