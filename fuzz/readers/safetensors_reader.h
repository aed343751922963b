#ifndef MATERIALIZER_FUZZ_READERS_SAFETENSORS_READER_H_
#define MATERIALIZER_FUZZ_READERS_SAFETENSORS_READER_H_

// A strict reader of whole safetensors files for the fuzz targets, which
// check the writer in server/delivery against it. It is the server's own
// checkpoint reader (server/checkpoint/safetensors_header.h), written
// independently of that writer: the header is RFC 8259 JSON (no duplicate
// keys), every tensor's byte range matches its dtype and shape, and the
// ranges tile the data section exactly (no gap, no overlap, nothing after).
//
//   ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(bytes));
//   for (const SafetensorsEntry& t : contents.tensors) ...
//   // t's bytes: bytes.substr(contents.data_start + t.begin, t.end - t.begin)

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::fuzz {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the header's name, e.g. "BF16"
  std::vector<uint64_t> shape;
  // Relative to the data section.
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsContents {
  // "__metadata__", in header order.
  std::vector<std::pair<std::string, std::string>> metadata;
  // In file order (by offset).
  std::vector<SafetensorsEntry> tensors;
  // File offset of the data section (8 + header length).
  uint64_t data_start = 0;
  // The header's length field (JSON plus its padding).
  uint64_t header_length = 0;
};

// INVALID_ARGUMENT saying what is wrong with `file`.
absl::StatusOr<SafetensorsContents> ReadSafetensors(absl::string_view file);

}  // namespace materializer::fuzz

#endif  // MATERIALIZER_FUZZ_READERS_SAFETENSORS_READER_H_
