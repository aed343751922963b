#ifndef MATERIALIZER_SERVER_CHECKPOINT_SAFETENSORS_HEADER_H_
#define MATERIALIZER_SERVER_CHECKPOINT_SAFETENSORS_HEADER_H_

// The header of a safetensors file: an 8-byte little-endian length N, then
// N bytes of JSON (padded with spaces), then the data section. Only the
// header is read; the tensors are byte ranges of the file.
//
//   ASSIGN_OR_RETURN(OpenedFile file, roots.OpenFile(resolved, ""));
//   ASSIGN_OR_RETURN(std::vector<CheckpointTensor> tensors,
//                    ReadSafetensorsTensors(file.fd(), file.size(),
//                                           file.label()));
//
// Accepted: what the format's reference implementation accepts, checked
// as strictly: the header is RFC 8259 JSON (json.h: no duplicate keys) and
// starts with '{'; each tensor is {"dtype", "shape", "data_offsets"} and
// nothing else; "__metadata__" maps strings to strings; a tensor's byte
// count is its shape's element count times its dtype's size (no
// overflow); sorted by offset, the ranges tile the data section exactly
// (no overlap, no gap, nothing after the last tensor, nothing past the
// end of the file). A dtype of the format that the service does not hold
// (U16, F8_E8M0, C64, ...) is an error naming the tensor and the dtype.
// Every error is INVALID_ARGUMENT and starts with the file's label.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::checkpoint {

// The largest header length the reference implementation accepts
// (MAX_HEADER_SIZE in huggingface/safetensors: 100,000,000 bytes).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;

// "__metadata__", in header order.
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// `header_json`: the header_length_field bytes that follow the length
// field of a file of `file_size` bytes. Tensors come in file order (by
// offset); offsets are absolute (8 + header length + data_offsets[0]).
// `metadata`, if not null, receives "__metadata__".
absl::StatusOr<std::vector<CheckpointTensor>> ParseSafetensorsHeader(
    absl::string_view header_json, uint64_t header_length_field,
    uint64_t file_size, absl::string_view label,
    SafetensorsMetadata* metadata = nullptr);

// Reads the length field and the header of `file` (two positional reads)
// and parses them.
absl::StatusOr<std::vector<CheckpointTensor>> ReadSafetensorsTensors(
    const RandomAccessFile& file, absl::string_view label,
    SafetensorsMetadata* metadata = nullptr);

// The same over an open file descriptor of a file of `file_size` bytes.
absl::StatusOr<std::vector<CheckpointTensor>> ReadSafetensorsTensors(
    int fd, uint64_t file_size, absl::string_view label,
    SafetensorsMetadata* metadata = nullptr);

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_SAFETENSORS_HEADER_H_
