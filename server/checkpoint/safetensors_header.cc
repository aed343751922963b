#include "server/checkpoint/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/checkpoint/json.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/spec/dtype.h"

namespace materializer::checkpoint {
namespace {

using spec::DType;

constexpr uint64_t kMaxBytes = uint64_t{std::numeric_limits<int64_t>::max()};

// A tensor as the header states it; offsets relative to the data section.
struct Entry {
  CheckpointTensor tensor;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// spec::DType values run from kFloat32 to spec::kLastDType.
std::optional<DType> DTypeOfSafetensorsName(absl::string_view name) {
  for (int i = 0; i <= static_cast<int>(spec::kLastDType); ++i) {
    const spec::DTypeInfo& info = spec::Info(static_cast<DType>(i));
    if (name == info.safetensors_name) return info.dtype;
  }
  return std::nullopt;
}

std::string HeldSafetensorsNames() {
  std::vector<const char*> names;
  for (int i = 0; i <= static_cast<int>(spec::kLastDType); ++i) {
    names.push_back(spec::Info(static_cast<DType>(i)).safetensors_name);
  }
  return absl::StrJoin(names, ", ");
}

class HeaderParser {
 public:
  HeaderParser(absl::string_view json, absl::string_view label)
      : json_(json), label_(label) {}

  absl::Status Parse(std::vector<Entry>* entries,
                     SafetensorsMetadata* metadata) {
    RETURN_IF_ERROR(Json(json_.BeginObject()));
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, Json(json_.NextMember(&key)));
      if (!more) break;
      if (key == "__metadata__") {
        RETURN_IF_ERROR(ParseMetadata(metadata));
        continue;
      }
      Entry entry;
      entry.tensor.name = key;
      RETURN_IF_ERROR(ParseTensor(&entry));
      entries->push_back(std::move(entry));
    }
    return Json(json_.ExpectEnd());
  }

 private:
  absl::Status Json(absl::Status status) const {
    if (status.ok()) return status;
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": safetensors header: ", status.message()));
  }
  template <typename T>
  absl::StatusOr<T> Json(absl::StatusOr<T> value) const {
    if (value.ok()) return value;
    return Json(value.status());
  }

  absl::Status TensorError(const Entry& entry, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        label_, ": tensor ", Quote(entry.tensor.name), ": ", what));
  }

  absl::StatusOr<bool> Is(JsonReader::Type type) {
    ASSIGN_OR_RETURN(const JsonReader::Type next, Json(json_.Peek()));
    return next == type;
  }

  absl::Status ParseMetadata(SafetensorsMetadata* metadata) {
    ASSIGN_OR_RETURN(const bool object, Is(JsonReader::Type::kObject));
    if (!object) {
      return absl::InvalidArgumentError(
          absl::StrCat(label_, ": __metadata__ is not an object"));
    }
    RETURN_IF_ERROR(Json(json_.BeginObject()));
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, Json(json_.NextMember(&key)));
      if (!more) return absl::OkStatus();
      ASSIGN_OR_RETURN(const bool string, Is(JsonReader::Type::kString));
      if (!string) {
        return absl::InvalidArgumentError(absl::StrCat(
            label_, ": __metadata__ ", Quote(key), " is not a string"));
      }
      ASSIGN_OR_RETURN(std::string value, Json(json_.ReadString()));
      if (metadata != nullptr) metadata->emplace_back(key, std::move(value));
    }
  }

  // A non-negative integer below 2^63.
  absl::StatusOr<uint64_t> ReadCount(const Entry& entry,
                                     absl::string_view what) {
    ASSIGN_OR_RETURN(const bool number, Is(JsonReader::Type::kNumber));
    if (!number) return TensorError(entry, absl::StrCat(what, " is not a number"));
    ASSIGN_OR_RETURN(const JsonNumber n, Json(json_.ReadNumber()));
    if (!n.integer) {
      return TensorError(entry, absl::StrCat(what, " is a non-integer number "
                                                   "or out of range"));
    }
    if (n.negative) {
      return TensorError(entry, absl::StrCat(what, " is negative"));
    }
    if (n.magnitude > kMaxBytes) {
      return TensorError(entry, absl::StrCat(what, " is ", n.magnitude,
                                             ", not below 2^63"));
    }
    return n.magnitude;
  }

  absl::Status ParseShape(Entry* entry) {
    ASSIGN_OR_RETURN(const bool array, Is(JsonReader::Type::kArray));
    if (!array) return TensorError(*entry, "shape is not an array");
    RETURN_IF_ERROR(Json(json_.BeginArray()));
    while (true) {
      ASSIGN_OR_RETURN(const bool more, Json(json_.NextElement()));
      if (!more) return absl::OkStatus();
      if (entry->tensor.shape.size() == kMaxCheckpointRank) {
        return TensorError(*entry, absl::StrCat("shape has more than ",
                                                kMaxCheckpointRank,
                                                " dimensions"));
      }
      ASSIGN_OR_RETURN(
          const uint64_t size,
          ReadCount(*entry, absl::StrCat("shape[", entry->tensor.shape.size(),
                                         "]")));
      entry->tensor.shape.push_back(static_cast<int64_t>(size));
    }
  }

  absl::Status ParseOffsets(Entry* entry) {
    ASSIGN_OR_RETURN(const bool array, Is(JsonReader::Type::kArray));
    if (!array) return TensorError(*entry, "data_offsets is not an array");
    RETURN_IF_ERROR(Json(json_.BeginArray()));
    uint64_t values[2] = {0, 0};
    int count = 0;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, Json(json_.NextElement()));
      if (!more) break;
      if (count == 2) {
        return TensorError(*entry, "data_offsets has more than 2 values");
      }
      ASSIGN_OR_RETURN(values[count],
                       ReadCount(*entry, absl::StrCat("data_offsets[", count,
                                                      "]")));
      ++count;
    }
    if (count != 2) {
      return TensorError(*entry, "data_offsets is not [begin, end]");
    }
    if (values[1] < values[0]) {
      return TensorError(*entry,
                         absl::StrCat("data_offsets [", values[0], ", ",
                                      values[1], "] end before they begin"));
    }
    entry->begin = values[0];
    entry->end = values[1];
    return absl::OkStatus();
  }

  absl::Status ParseTensor(Entry* entry) {
    ASSIGN_OR_RETURN(const bool object, Is(JsonReader::Type::kObject));
    if (!object) return TensorError(*entry, "is not an object");
    RETURN_IF_ERROR(Json(json_.BeginObject()));
    bool has_dtype = false, has_shape = false, has_offsets = false;
    std::string field;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, Json(json_.NextMember(&field)));
      if (!more) break;
      if (field == "dtype") {
        has_dtype = true;
        ASSIGN_OR_RETURN(const bool string, Is(JsonReader::Type::kString));
        if (!string) return TensorError(*entry, "dtype is not a string");
        ASSIGN_OR_RETURN(const std::string name, Json(json_.ReadString()));
        const std::optional<DType> dtype = DTypeOfSafetensorsName(name);
        if (!dtype.has_value()) {
          return TensorError(
              *entry, absl::StrCat("dtype ", Quote(name),
                                   " is unknown to the service (it holds ",
                                   HeldSafetensorsNames(), ")"));
        }
        entry->tensor.dtype = *dtype;
      } else if (field == "shape") {
        has_shape = true;
        RETURN_IF_ERROR(ParseShape(entry));
      } else if (field == "data_offsets") {
        has_offsets = true;
        RETURN_IF_ERROR(ParseOffsets(entry));
      } else {
        return TensorError(*entry,
                           absl::StrCat("unknown field ", Quote(field),
                                        " (a tensor has dtype, shape and "
                                        "data_offsets)"));
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) {
      return TensorError(*entry, absl::StrCat("lacks ",
                                              !has_dtype   ? "dtype"
                                              : !has_shape ? "shape"
                                                           : "data_offsets"));
    }
    // Element count times item size, below 2^63 at every step.
    unsigned __int128 nbytes = spec::ItemSize(entry->tensor.dtype);
    bool empty = false;
    for (int64_t size : entry->tensor.shape) {
      if (size == 0) empty = true;
      nbytes *= static_cast<uint64_t>(size);
      if (nbytes > kMaxBytes) nbytes = kMaxBytes + 1;  // stays too large
    }
    if (empty) nbytes = 0;
    if (nbytes > kMaxBytes) {
      return TensorError(*entry, "shape has 2^63 bytes or more");
    }
    entry->tensor.nbytes = static_cast<uint64_t>(nbytes);
    if (entry->tensor.nbytes != entry->end - entry->begin) {
      return TensorError(
          *entry,
          absl::StrCat("data_offsets [", entry->begin, ", ", entry->end,
                       "] hold ", entry->end - entry->begin, " bytes, but ",
                       spec::Info(entry->tensor.dtype).safetensors_name,
                       " of shape [", absl::StrJoin(entry->tensor.shape, ", "),
                       "] is ", entry->tensor.nbytes, " bytes"));
    }
    return absl::OkStatus();
  }

  JsonReader json_;
  const absl::string_view label_;
};

}  // namespace

absl::StatusOr<std::vector<CheckpointTensor>> ParseSafetensorsHeader(
    absl::string_view header_json, uint64_t header_length_field,
    uint64_t file_size, absl::string_view label,
    SafetensorsMetadata* metadata) {
  if (header_length_field > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": safetensors header length ", header_length_field,
        " is more than the format's limit of ", kMaxSafetensorsHeaderBytes,
        " bytes (not a safetensors file?)"));
  }
  if (file_size < 8 || header_length_field > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": safetensors header length ", header_length_field,
        " passes the end of a ", file_size,
        "-byte file (truncated, or not a safetensors file)"));
  }
  if (header_json.size() != header_length_field) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": ", header_json.size(), " header bytes given for a length "
        "field of ", header_length_field));
  }
  if (header_json.empty() || header_json[0] != '{') {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": safetensors header does not start with '{' (not a "
        "safetensors file?)"));
  }
  std::vector<Entry> entries;
  SafetensorsMetadata found_metadata;
  RETURN_IF_ERROR(
      HeaderParser(header_json, label).Parse(&entries, &found_metadata));

  // The ranges must tile the data section, as the reference requires.
  const uint64_t data_start = 8 + header_length_field;
  const uint64_t data_size = file_size - data_start;
  // File order; empty tensors sharing an offset by name, so the list is the
  // same whatever order the JSON members came in (names are unique here).
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) {
              return std::tie(a.begin, a.end, a.tensor.name) <
                     std::tie(b.begin, b.end, b.tensor.name);
            });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    const std::string where =
        absl::StrCat(label, ": tensor ", Quote(e.tensor.name),
                     ": data_offsets [", e.begin, ", ", e.end, "]");
    if (e.end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " run past the end of the ", data_size,
          "-byte data section (a ", file_size, "-byte file: truncated?)"));
    }
    if (e.begin < cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " overlap tensor ", Quote(previous->tensor.name), "'s [",
          previous->begin, ", ", previous->end, "]"));
    }
    if (e.begin > cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " leave a gap of ", e.begin - cursor,
          " bytes before them (the format's tensors are back to back)"));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": the tensors cover ", cursor, " bytes of the ", data_size,
        "-byte data section (bytes after the last tensor)"));
  }
  std::vector<CheckpointTensor> out;
  out.reserve(entries.size());
  for (Entry& e : entries) {
    e.tensor.offset = data_start + e.begin;
    out.push_back(std::move(e.tensor));
  }
  if (metadata != nullptr) *metadata = std::move(found_metadata);
  return out;
}

absl::StatusOr<std::vector<CheckpointTensor>> ReadSafetensorsTensors(
    const RandomAccessFile& file, absl::string_view label,
    SafetensorsMetadata* metadata) {
  const uint64_t file_size = file.size();
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": a ", file_size, "-byte file is too short for safetensors "
        "(an 8-byte header length comes first)"));
  }
  char length_bytes[8];
  RETURN_IF_ERROR(file.ReadAt(0, 8, length_bytes));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) {
    length = (length << 8) | static_cast<unsigned char>(length_bytes[i]);
  }
  // Checked before anything is allocated for the header.
  if (length > kMaxSafetensorsHeaderBytes || length > file_size - 8) {
    return ParseSafetensorsHeader("", length, file_size, label, metadata);
  }
  ASSIGN_OR_RETURN(const std::string header, ReadBytes(file, 8, length));
  return ParseSafetensorsHeader(header, length, file_size, label, metadata);
}

absl::StatusOr<std::vector<CheckpointTensor>> ReadSafetensorsTensors(
    int fd, uint64_t file_size, absl::string_view label,
    SafetensorsMetadata* metadata) {
  const FdFile file(fd, file_size, std::string(label));
  return ReadSafetensorsTensors(file, label, metadata);
}

}  // namespace materializer::checkpoint
