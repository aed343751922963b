#include "server/spec/dtype.h"

#include <utility>

#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"

namespace materializer::spec {
namespace {

// Indexed by DType.
constexpr DTypeInfo kInfos[] = {
    {DType::kFloat32, "float32", 4, "F32", true},
    {DType::kFloat64, "float64", 8, "F64", true},
    {DType::kFloat16, "float16", 2, "F16", true},
    {DType::kBFloat16, "bfloat16", 2, "BF16", true},
    {DType::kInt8, "int8", 1, "I8", false},
    {DType::kInt16, "int16", 2, "I16", false},
    {DType::kInt32, "int32", 4, "I32", false},
    {DType::kInt64, "int64", 8, "I64", false},
    {DType::kUInt8, "uint8", 1, "U8", false},
    {DType::kBool, "bool", 1, "BOOL", false},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1, "F8_E4M3", true},
    {DType::kFloat8E5M2, "float8_e5m2", 1, "F8_E5M2", true},
    {DType::kComplex64, "complex64", 8, "C64", false, true},
};
static_assert(sizeof(kInfos) / sizeof(kInfos[0]) ==
                  static_cast<size_t>(kLastDType) + 1,
              "one DTypeInfo per DType, in order");

constexpr std::pair<const char*, DType> kAliases[] = {
    {"float", DType::kFloat32}, {"double", DType::kFloat64},
    {"half", DType::kFloat16},  {"short", DType::kInt16},
    {"int", DType::kInt32},     {"long", DType::kInt64},
    {"cfloat", DType::kComplex64},
};

}  // namespace

const DTypeInfo& Info(DType dtype) {
  return kInfos[static_cast<int>(dtype)];
}

std::optional<DType> ParseDType(absl::string_view text) {
  absl::ConsumePrefix(&text, "torch.");
  for (const DTypeInfo& info : kInfos) {
    if (text == info.name) return info.dtype;
  }
  for (const auto& [alias, dtype] : kAliases) {
    if (text == alias) return dtype;
  }
  return std::nullopt;
}

std::string KnownDTypeNames() {
  return absl::StrJoin(kInfos, ", ",
                       [](std::string* out, const DTypeInfo& info) {
                         out->append(info.name);
                       });
}

}  // namespace materializer::spec
