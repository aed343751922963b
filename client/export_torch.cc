#include "client/export_torch.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/strides.h>

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace materializer::client {
namespace {

absl::StatusOr<at::ScalarType> ScalarTypeOf(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> kTypes[] = {
      {"float32", at::kFloat},           {"float64", at::kDouble},
      {"float16", at::kHalf},            {"bfloat16", at::kBFloat16},
      {"int8", at::kChar},               {"int16", at::kShort},
      {"int32", at::kInt},               {"int64", at::kLong},
      {"uint8", at::kByte},              {"bool", at::kBool},
      {"float8_e4m3fn", at::kFloat8_e4m3fn},
      {"float8_e5m2", at::kFloat8_e5m2},
      {"complex64", at::kComplexFloat},
  };
  for (const auto& [name, type] : kTypes) {
    if (dtype == name) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", dtype, "\" in the export"));
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ViewAsTensors(
    std::shared_ptr<const ExportImport> import) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(import->tensors().size());
  at::TensorOptions base = at::TensorOptions();
  if (import->on_cuda()) {
    base = base.device(at::Device(
        at::kCUDA, static_cast<c10::DeviceIndex>(import->cuda_device())));
  }
  for (const ExportImport::TensorView& view : import->tensors()) {
    auto type = ScalarTypeOf(view.dtype);
    if (!type.ok()) return type.status();
    try {
      // The deleter holds the import: the mapping outlives every view.
      at::Tensor tensor = at::from_blob(
          view.data, view.shape, c10::contiguous_strides(view.shape),
          [import](void*) {}, base.dtype(*type));
      out.emplace_back(view.name, std::move(tensor));
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("viewing ", view.name, " as a tensor: ", e.what()));
    }
  }
  return out;
}

}  // namespace materializer::client
