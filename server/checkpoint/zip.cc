#include "server/checkpoint/zip.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::checkpoint {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr uint64_t kMax16 = 0xffff;
constexpr uint64_t kMax32 = 0xffffffff;
constexpr uint64_t kEndBytes = 22;
constexpr uint64_t kLocatorBytes = 20;
constexpr uint64_t kEnd64Bytes = 56;
constexpr uint64_t kCentralBytes = 46;
constexpr uint64_t kLocalBytes = 30;
constexpr uint64_t kMaxComment = 0xffff;

// Little-endian field at a known offset, bounds checked by the caller.
uint64_t LE(absl::string_view bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  }
  return value;
}

// The values a zip64 extended information extra field (id 1) holds for
// the fields that are at their 32-bit (16-bit for the disk) maximum, in
// the order APPNOTE 4.5.3 gives.
struct Zip64Fields {
  uint64_t* size = nullptr;
  uint64_t* compressed_size = nullptr;
  uint64_t* header_offset = nullptr;
  bool disk = false;
};

absl::Status ReadZip64Extra(absl::string_view extra, const Zip64Fields& want) {
  const bool any = want.size != nullptr || want.compressed_size != nullptr ||
                   want.header_offset != nullptr || want.disk;
  for (size_t at = 0; at + 4 <= extra.size();) {
    const uint64_t id = LE(extra, at, 2);
    const uint64_t length = LE(extra, at + 2, 2);
    if (length > extra.size() - at - 4) {
      return absl::InvalidArgumentError("an extra field overruns its record");
    }
    if (id == 1) {
      absl::string_view field = extra.substr(at + 4, length);
      size_t next = 0;
      for (uint64_t* out :
           {want.size, want.compressed_size, want.header_offset}) {
        if (out == nullptr) continue;
        if (next + 8 > field.size()) {
          return absl::InvalidArgumentError("zip64 extra field too short");
        }
        *out = LE(field, next, 8);
        next += 8;
      }
      if (want.disk) {
        if (next + 4 > field.size() || LE(field, next, 4) != 0) {
          return absl::InvalidArgumentError("multi-disk archive");
        }
      }
      return absl::OkStatus();
    }
    at += 4 + length;
  }
  if (any) return absl::InvalidArgumentError("zip64 extra field missing");
  return absl::OkStatus();
}

struct EndRecords {
  uint64_t entries = 0;
  uint64_t directory_offset = 0;
  uint64_t directory_size = 0;
  // Where the end records start: the directory ends here.
  uint64_t start = 0;
};

absl::StatusOr<EndRecords> ReadEndRecords(const RandomAccessFile& file) {
  const uint64_t size = file.size();
  if (size < kEndBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", size, "-byte file is too short for a zip archive"));
  }
  // The end record, then a comment of up to 64 KiB; the zip64 locator
  // right before the end record.
  const uint64_t tail_size =
      std::min(size, kEndBytes + kMaxComment + kLocatorBytes);
  const uint64_t tail_at = size - tail_size;
  ASSIGN_OR_RETURN(const std::string tail, ReadBytes(file, tail_at, tail_size));
  uint64_t end = tail_size;  // in `tail`
  for (uint64_t i = tail_size - kEndBytes + 1; i-- > 0;) {
    if (LE(tail, i, 4) == kEnd && i + kEndBytes + LE(tail, i + 20, 2) ==
                                      tail_size) {
      end = i;
      break;
    }
  }
  if (end == tail_size) {
    return absl::InvalidArgumentError(
        "no end of central directory record (not a zip archive)");
  }
  EndRecords records;
  if (LE(tail, end + 4, 2) != 0 || LE(tail, end + 6, 2) != 0) {
    return absl::InvalidArgumentError("multi-disk archive");
  }
  records.entries = LE(tail, end + 10, 2);
  if (LE(tail, end + 8, 2) != records.entries) {
    return absl::InvalidArgumentError("the end record's entry counts differ");
  }
  records.directory_size = LE(tail, end + 12, 4);
  records.directory_offset = LE(tail, end + 16, 4);
  records.start = tail_at + end;
  const bool maxed = records.entries == kMax16 ||
                     records.directory_size == kMax32 ||
                     records.directory_offset == kMax32;
  const bool has_locator =
      end >= kLocatorBytes && LE(tail, end - kLocatorBytes, 4) == kEnd64Locator;
  if (!has_locator) {
    if (maxed) {
      return absl::InvalidArgumentError(
          "the end record holds 32-bit maxima but no zip64 locator precedes "
          "it");
    }
    return records;
  }
  const uint64_t locator = end - kLocatorBytes;  // in `tail`
  if (LE(tail, locator + 4, 4) != 0 || LE(tail, locator + 16, 4) > 1) {
    return absl::InvalidArgumentError("multi-disk archive");
  }
  const uint64_t record_at = LE(tail, locator + 8, 8);
  const uint64_t locator_at = tail_at + locator;
  if (record_at > locator_at || locator_at - record_at < kEnd64Bytes) {
    return absl::InvalidArgumentError(
        "the zip64 locator points at no zip64 end record");
  }
  char record_bytes[kEnd64Bytes];
  RETURN_IF_ERROR(file.ReadAt(record_at, kEnd64Bytes, record_bytes));
  const absl::string_view record(record_bytes, kEnd64Bytes);
  if (LE(record, 0, 4) != kEnd64) {
    return absl::InvalidArgumentError(
        "the zip64 locator points at no zip64 end record");
  }
  // The record's size field counts the bytes after its first 12.
  const uint64_t record_size = LE(record, 4, 8);
  if (record_size > locator_at - record_at - 12 ||
      record_at + 12 + record_size != locator_at) {
    return absl::InvalidArgumentError(
        "the zip64 end record does not end at its locator");
  }
  if (LE(record, 16, 4) != 0 || LE(record, 20, 4) != 0) {
    return absl::InvalidArgumentError("multi-disk archive");
  }
  records.entries = LE(record, 32, 8);
  if (LE(record, 24, 8) != records.entries) {
    return absl::InvalidArgumentError(
        "the zip64 end record's entry counts differ");
  }
  records.directory_size = LE(record, 40, 8);
  records.directory_offset = LE(record, 48, 8);
  records.start = record_at;
  return records;
}

absl::StatusOr<ZipDirectory> ReadDirectory(const RandomAccessFile& file) {
  ASSIGN_OR_RETURN(const EndRecords end, ReadEndRecords(file));
  if (end.directory_offset > end.start ||
      end.directory_size != end.start - end.directory_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the central directory [", end.directory_offset, ", +",
        end.directory_size, ") does not end where the end records start (",
        end.start, ")"));
  }
  if (end.directory_size > kMaxZipDirectoryBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a central directory of ", end.directory_size,
        " bytes is larger than the limit of ", kMaxZipDirectoryBytes));
  }
  if (end.entries > end.directory_size / kCentralBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        end.entries, " entries do not fit a central directory of ",
        end.directory_size, " bytes"));
  }
  ASSIGN_OR_RETURN(const std::string directory,
                   ReadBytes(file, end.directory_offset, end.directory_size));
  ZipDirectory out;
  out.offset = end.directory_offset;
  out.entries.reserve(end.entries);
  absl::flat_hash_set<absl::string_view> names;
  uint64_t at = 0;
  for (uint64_t i = 0; i < end.entries; ++i) {
    if (directory.size() - at < kCentralBytes ||
        LE(directory, at, 4) != kCentralHeader) {
      return absl::InvalidArgumentError(
          absl::StrCat("central directory record ", i, " missing"));
    }
    ZipEntry entry;
    entry.flags = static_cast<uint16_t>(LE(directory, at + 8, 2));
    entry.method = static_cast<uint16_t>(LE(directory, at + 10, 2));
    entry.crc32 = static_cast<uint32_t>(LE(directory, at + 16, 4));
    entry.compressed_size = LE(directory, at + 20, 4);
    entry.size = LE(directory, at + 24, 4);
    const uint64_t name_length = LE(directory, at + 28, 2);
    const uint64_t extra_length = LE(directory, at + 30, 2);
    const uint64_t comment_length = LE(directory, at + 32, 2);
    const uint64_t disk = LE(directory, at + 34, 2);
    entry.header_offset = LE(directory, at + 42, 4);
    if (name_length + extra_length + comment_length >
        directory.size() - at - kCentralBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("central directory record ", i, " overruns"));
    }
    entry.name = directory.substr(at + kCentralBytes, name_length);
    if ((entry.flags & 0x41) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", Quote(entry.name), " is encrypted"));
    }
    if (disk != 0 && disk != kMax16) {
      return absl::InvalidArgumentError("multi-disk archive");
    }
    Zip64Fields want;
    if (entry.size == kMax32) want.size = &entry.size;
    if (entry.compressed_size == kMax32) {
      want.compressed_size = &entry.compressed_size;
    }
    if (entry.header_offset == kMax32) want.header_offset = &entry.header_offset;
    want.disk = disk == kMax16;
    if (absl::Status s = ReadZip64Extra(
            absl::string_view(directory)
                .substr(at + kCentralBytes + name_length, extra_length),
            want);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", Quote(entry.name), ": ", s.message()));
    }
    if (entry.method == 0 && entry.compressed_size != entry.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stored entry ", Quote(entry.name), " has two sizes, ",
          entry.compressed_size, " and ", entry.size));
    }
    at += kCentralBytes + name_length + extra_length + comment_length;
    out.entries.push_back(std::move(entry));
  }
  if (at != directory.size()) {
    return absl::InvalidArgumentError(
        "the central directory has bytes after its last record");
  }
  for (const ZipEntry& entry : out.entries) {
    if (!names.insert(entry.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two entries named ", Quote(entry.name)));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ZipDirectory> ReadZipDirectory(const RandomAccessFile& file,
                                              absl::string_view label) {
  absl::StatusOr<ZipDirectory> directory = ReadDirectory(file);
  if (!directory.ok() && absl::IsInvalidArgument(directory.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", directory.status().message()));
  }
  return directory;
}

absl::StatusOr<uint64_t> ZipEntryDataOffset(const RandomAccessFile& file,
                                            const ZipDirectory& directory,
                                            const ZipEntry& entry,
                                            absl::string_view label) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": zip entry ", Quote(entry.name), ": ", what));
  };
  if (entry.method != 0) {
    return invalid(absl::StrCat("is compressed (method ", entry.method,
                                "); only stored entries are read"));
  }
  const uint64_t local = entry.header_offset;
  if (local > directory.offset || directory.offset - local < kLocalBytes) {
    return invalid(absl::StrCat("no local header at ", local));
  }
  char header_bytes[kLocalBytes];
  RETURN_IF_ERROR(file.ReadAt(local, kLocalBytes, header_bytes));
  const absl::string_view header(header_bytes, kLocalBytes);
  if (LE(header, 0, 4) != kLocalHeader) {
    return invalid(absl::StrCat("no local header at ", local));
  }
  const uint64_t flags = LE(header, 6, 2);
  const uint64_t method = LE(header, 8, 2);
  const uint64_t crc = LE(header, 14, 4);
  uint64_t compressed_size = LE(header, 18, 4);
  uint64_t size = LE(header, 22, 4);
  const uint64_t name_length = LE(header, 26, 2);
  const uint64_t extra_length = LE(header, 28, 2);
  const uint64_t data =
      local + kLocalBytes + name_length + extra_length;
  if (data > directory.offset) {
    return invalid("local header passes the central directory");
  }
  ASSIGN_OR_RETURN(
      const std::string name_and_extra,
      ReadBytes(file, local + kLocalBytes, name_length + extra_length));
  if (absl::string_view(name_and_extra).substr(0, name_length) != entry.name) {
    return invalid("the local header names another file");
  }
  if (method != entry.method || (flags & 1) != 0) {
    return invalid("the local header disagrees on method or encryption");
  }
  if (size == kMax32 || compressed_size == kMax32) {
    Zip64Fields want;
    if (size == kMax32) want.size = &size;
    if (compressed_size == kMax32) want.compressed_size = &compressed_size;
    if (absl::Status s = ReadZip64Extra(
            absl::string_view(name_and_extra).substr(name_length), want);
        !s.ok()) {
      return invalid(absl::StrCat("local header: ", s.message()));
    }
  }
  // With a data descriptor (bit 3) the local CRC and sizes may be zero.
  const bool descriptor = (flags & 8) != 0;
  auto agrees = [&](uint64_t local_value, uint64_t central_value) {
    return local_value == central_value || (descriptor && local_value == 0);
  };
  if (!agrees(crc, entry.crc32) || !agrees(size, entry.size) ||
      !agrees(compressed_size, entry.compressed_size)) {
    return invalid(absl::StrCat("the local header's CRC or sizes (", size,
                                " bytes) disagree with the central "
                                "directory's (",
                                entry.size, " bytes)"));
  }
  if (entry.size > directory.offset - data) {
    return invalid(absl::StrCat("its ", entry.size, " bytes at ", data,
                                " pass the central directory at ",
                                directory.offset));
  }
  return data;
}

uint32_t ZipCrc32(absl::string_view data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (char ch : data) {
    crc = table[(crc ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (crc >> 8);
  }
  return ~crc;
}

}  // namespace materializer::checkpoint
