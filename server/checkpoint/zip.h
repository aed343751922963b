#ifndef MATERIALIZER_SERVER_CHECKPOINT_ZIP_H_
#define MATERIALIZER_SERVER_CHECKPOINT_ZIP_H_

// The directory of a zip archive (APPNOTE.TXT 6.3), read with positional
// reads from the file's tail: the end of central directory record (after
// an optional comment), the zip64 end record and locator where present,
// then the central directory. Entry data is located from its local header
// on demand, so an archive of many GB costs a few small reads.
//
//   ASSIGN_OR_RETURN(ZipDirectory zip, ReadZipDirectory(file, label));
//   const ZipEntry& entry = zip.entries[0];
//   ASSIGN_OR_RETURN(uint64_t at, ZipEntryDataOffset(file, zip, entry, label));
//   // the entry's bytes: [at, at + entry.size)
//
// Refused as INVALID_ARGUMENT naming the label: a file without end
// records, multi-disk and encrypted archives, a central directory that is
// larger than kMaxZipDirectoryBytes, does not end at the end records or
// whose records overrun it, two entries of one name. Compressed entries
// are listed (method != 0); reading their data is the caller's refusal.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::checkpoint {

// The largest central directory read (about 500,000 entries of torch.save
// names).
inline constexpr uint64_t kMaxZipDirectoryBytes = uint64_t{64} << 20;

struct ZipEntry {
  std::string name;
  // Offset of the entry's local header.
  uint64_t header_offset = 0;
  uint64_t compressed_size = 0;
  // Uncompressed size (for a stored entry, equal to compressed_size).
  uint64_t size = 0;
  uint32_t crc32 = 0;
  // 0: stored.
  uint16_t method = 0;
  uint16_t flags = 0;
};

struct ZipDirectory {
  // In central directory order.
  std::vector<ZipEntry> entries;
  // Where the central directory starts; entries' data lies before it.
  uint64_t offset = 0;
};

absl::StatusOr<ZipDirectory> ReadZipDirectory(const RandomAccessFile& file,
                                              absl::string_view label);

// The file offset of a stored entry's data, from its local header (one
// read), which must agree with the central directory: same name and
// method, same CRC and sizes unless the entry has a data descriptor
// (general purpose flag bit 3, as torch.save writes: then they may be 0).
// The data must lie before the central directory. INVALID_ARGUMENT otherwise, and for a
// compressed entry.
absl::StatusOr<uint64_t> ZipEntryDataOffset(const RandomAccessFile& file,
                                            const ZipDirectory& directory,
                                            const ZipEntry& entry,
                                            absl::string_view label);

// CRC-32 (ISO-HDLC, the zip polynomial) of `data`, continuing from `crc`
// (the CRC of the bytes before it; 0 to start).
uint32_t ZipCrc32(absl::string_view data, uint32_t crc = 0);

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_ZIP_H_
