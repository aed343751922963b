#include "server/init/values.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace materializer::init {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "values are little-endian; a big-endian host would swap them");

using spec::DType;

template <typename Word>
Word Load(const char* data, uint64_t index) {
  Word word;
  std::memcpy(&word, data + index * sizeof(Word), sizeof(Word));
  return word;
}

// Whether element `i` is a NaN of `dtype` (by its bits: an exponent of all
// ones with a non-zero mantissa; float8_e4m3fn has only S.1111.111).
bool IsNaN(DType dtype, const char* data, uint64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return (Load<uint32_t>(data, i) & 0x7fffffffu) > 0x7f800000u;
    case DType::kFloat64:
      return (Load<uint64_t>(data, i) & 0x7fffffffffffffffu) >
             0x7ff0000000000000u;
    case DType::kFloat16:
      return (Load<uint16_t>(data, i) & 0x7fffu) > 0x7c00u;
    case DType::kBFloat16:
      return (Load<uint16_t>(data, i) & 0x7fffu) > 0x7f80u;
    case DType::kFloat8E4M3FN:
      return (Load<uint8_t>(data, i) & 0x7fu) == 0x7fu;
    case DType::kFloat8E5M2:
      return (Load<uint8_t>(data, i) & 0x7fu) > 0x7cu;
    case DType::kComplex64:  // either float32 of the pair
      return (Load<uint32_t>(data, 2 * i) & 0x7fffffffu) > 0x7f800000u ||
             (Load<uint32_t>(data, 2 * i + 1) & 0x7fffffffu) > 0x7f800000u;
    default:
      return false;
  }
}

}  // namespace

absl::Status CheckValues(const v1::Values& values,
                         const spec::TensorDesc& target) {
  const std::string& data = values.data();
  const spec::DTypeInfo& info = spec::Info(target.dtype);
  const uint64_t numel = target.full_numel();
  // numel * itemsize < 2^63: validation checked the tensor's bytes, and a
  // region is smaller.
  const uint64_t expected = numel * info.itemsize;
  if (data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values.data has ", data.size(), " bytes; shape [",
        absl::StrJoin(target.full_shape(), ", "), "] of ", info.name, " needs ",
        expected, " (", numel, " elements x ", info.itemsize,
        " bytes, little-endian, row-major)"));
  }
  if (target.dtype == DType::kBool) {
    for (uint64_t i = 0; i < numel; ++i) {
      const unsigned char byte = static_cast<unsigned char>(data[i]);
      if (byte > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "values.data element ", i, " is ", static_cast<int>(byte),
            "; bool values are one byte each, 0 or 1"));
      }
    }
    return absl::OkStatus();
  }
  if (info.is_floating_point || info.is_complex) {
    for (uint64_t i = 0; i < numel; ++i) {
      if (IsNaN(target.dtype, data.data(), i)) {
        return absl::InvalidArgumentError(
            absl::StrCat("values.data element ", i, " is NaN; ", info.name,
                         " values may be finite or infinite, not NaN"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace materializer::init
