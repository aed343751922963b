#ifndef MATERIALIZER_FUZZ_READERS_ZIP_READER_H_
#define MATERIALIZER_FUZZ_READERS_ZIP_READER_H_

// A strict reader of whole uncompressed ("stored") zip archives such as
// torch.save writes, for the fuzz targets, which check the writer in
// server/delivery against it. It is the server's own zip reader
// (server/checkpoint/zip.h: end records, zip64 where present, the central
// directory, each entry's local header agreeing with it), written
// independently of that writer, plus what only a whole-file reader can
// check: every entry stored, entries not overlapping, the CRC-32 of every
// entry's data.
//
//   ASSIGN_OR_RETURN(std::vector<ZipEntryView> entries, ReadZip(bytes));
//   // entry data: bytes.substr(e.data_offset, e.size)

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/zip.h"

namespace materializer::fuzz {

struct ZipEntryView {
  std::string name;
  uint64_t header_offset = 0;  // of the local header
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

// CRC-32 (ISO-HDLC, the zip polynomial).
using checkpoint::ZipCrc32;

// Entries in central directory order, or INVALID_ARGUMENT saying what is
// wrong with `file`.
absl::StatusOr<std::vector<ZipEntryView>> ReadZip(absl::string_view file);

}  // namespace materializer::fuzz

#endif  // MATERIALIZER_FUZZ_READERS_ZIP_READER_H_
