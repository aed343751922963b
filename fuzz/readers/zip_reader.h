#ifndef MATERIALIZER_FUZZ_READERS_ZIP_READER_H_
#define MATERIALIZER_FUZZ_READERS_ZIP_READER_H_

// A strict reader of uncompressed ("stored") zip archives such as
// torch.save writes, independent of the writer in server/delivery. It
// finds the end records (zip64 where present), walks the central
// directory, and checks each entry's local header against it: same name,
// sizes and CRC, stored, data inside the file, entries not overlapping,
// CRC-32 of the data correct (computed here, not by zlib).
//
//   ASSIGN_OR_RETURN(std::vector<ZipEntryView> entries, ReadZip(bytes));
//   // entry data: bytes.substr(e.data_offset, e.size)

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::fuzz {

struct ZipEntryView {
  std::string name;
  uint64_t header_offset = 0;  // of the local header
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

// CRC-32 (ISO-HDLC, the zip polynomial) of `data`.
uint32_t ZipCrc32(absl::string_view data);

// Entries in central directory order, or INVALID_ARGUMENT saying what is
// wrong with `file`.
absl::StatusOr<std::vector<ZipEntryView>> ReadZip(absl::string_view file);

}  // namespace materializer::fuzz

#endif  // MATERIALIZER_FUZZ_READERS_ZIP_READER_H_
