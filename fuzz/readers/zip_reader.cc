#include "fuzz/readers/zip_reader.h"

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace materializer::fuzz {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr uint64_t kMax16 = 0xffff;
constexpr uint64_t kMax32 = 0xffffffff;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

// Little-endian fields at known offsets, bounds checked by the caller.
uint64_t LE(absl::string_view bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  }
  return value;
}

bool Fits(absl::string_view file, uint64_t at, uint64_t length) {
  return at <= file.size() && length <= file.size() - at;
}

// The zip64 extended information extra field (id 1): the 64-bit values of
// the fields set to their 32-bit maximum, in order.
absl::Status ReadZip64Extra(absl::string_view extra, bool want_size,
                            bool want_offset, uint64_t* size,
                            uint64_t* offset) {
  for (size_t at = 0; at + 4 <= extra.size();) {
    const uint64_t id = LE(extra, at, 2);
    const uint64_t length = LE(extra, at + 2, 2);
    if (at + 4 + length > extra.size()) return Invalid("extra field overruns");
    if (id == 1) {
      size_t field = at + 4;
      const size_t end = field + length;
      if (want_size) {
        if (field + 16 > end) return Invalid("zip64 extra lacks the sizes");
        const uint64_t uncompressed = LE(extra, field, 8);
        const uint64_t compressed = LE(extra, field + 8, 8);
        if (uncompressed != compressed) {
          return Invalid("zip64 sizes differ for a stored entry");
        }
        *size = uncompressed;
        field += 16;
      }
      if (want_offset) {
        if (field + 8 > end) return Invalid("zip64 extra lacks the offset");
        *offset = LE(extra, field, 8);
      }
      return absl::OkStatus();
    }
    at += 4 + length;
  }
  if (want_size || want_offset) return Invalid("zip64 extra field missing");
  return absl::OkStatus();
}

}  // namespace

uint32_t ZipCrc32(absl::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (char ch : data) {
    crc = table[(crc ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::vector<ZipEntryView>> ReadZip(absl::string_view file) {
  // The classic end record sits at the very end (we write no comment).
  if (file.size() < 22) return Invalid("too short for an end record");
  const uint64_t end_at = file.size() - 22;
  if (LE(file, end_at, 4) != kEnd) return Invalid("no end record at the end");
  if (LE(file, end_at + 20, 2) != 0) return Invalid("unexpected comment");
  if (LE(file, end_at + 4, 2) != 0 || LE(file, end_at + 6, 2) != 0) {
    return Invalid("multi-disk archive");
  }
  uint64_t entries = LE(file, end_at + 10, 2);
  if (LE(file, end_at + 8, 2) != entries) {
    return Invalid("entry counts differ");
  }
  uint64_t cd_size = LE(file, end_at + 12, 4);
  uint64_t cd_offset = LE(file, end_at + 16, 4);
  uint64_t cd_end_limit = end_at;
  if (entries == kMax16 || cd_size == kMax32 || cd_offset == kMax32) {
    // zip64: a locator right before the end record, pointing at the zip64
    // end record.
    if (end_at < 20) return Invalid("no room for a zip64 locator");
    const uint64_t locator = end_at - 20;
    if (LE(file, locator, 4) != kEnd64Locator) {
      return Invalid("32-bit maxima without a zip64 locator");
    }
    const uint64_t record = LE(file, locator + 8, 8);
    if (!Fits(file, record, 56) || LE(file, record, 4) != kEnd64) {
      return Invalid("the zip64 locator points at no zip64 end record");
    }
    if (record + 56 != locator) {
      return Invalid("bytes between the zip64 end record and its locator");
    }
    entries = LE(file, record + 32, 8);
    if (LE(file, record + 24, 8) != entries) {
      return Invalid("zip64 entry counts differ");
    }
    cd_size = LE(file, record + 40, 8);
    cd_offset = LE(file, record + 48, 8);
    cd_end_limit = record;
  }
  if (!Fits(file, cd_offset, cd_size) || cd_offset + cd_size != cd_end_limit) {
    return Invalid(absl::StrCat("central directory [", cd_offset, ", +",
                                cd_size, ") does not end at the end records"));
  }

  std::vector<ZipEntryView> out;
  uint64_t at = cd_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (!Fits(file, at, 46) || at + 46 > cd_offset + cd_size ||
        LE(file, at, 4) != kCentralHeader) {
      return Invalid(absl::StrCat("central header ", i, " missing"));
    }
    if (LE(file, at + 10, 2) != 0) {
      return Invalid(absl::StrCat("entry ", i, " is compressed"));
    }
    if (LE(file, at + 8, 2) & 1) {
      return Invalid(absl::StrCat("entry ", i, " is encrypted"));
    }
    ZipEntryView entry;
    entry.crc32 = static_cast<uint32_t>(LE(file, at + 16, 4));
    const uint64_t compressed = LE(file, at + 20, 4);
    const uint64_t uncompressed = LE(file, at + 24, 4);
    const uint64_t name_length = LE(file, at + 28, 2);
    const uint64_t extra_length = LE(file, at + 30, 2);
    const uint64_t comment_length = LE(file, at + 32, 2);
    entry.header_offset = LE(file, at + 42, 4);
    const uint64_t record_end = at + 46 + name_length + extra_length +
                                comment_length;
    if (record_end > cd_offset + cd_size) {
      return Invalid(absl::StrCat("central header ", i, " overruns"));
    }
    if (compressed != uncompressed) {
      return Invalid(absl::StrCat("entry ", i, " sizes differ"));
    }
    entry.size = uncompressed;
    entry.name = std::string(file.substr(at + 46, name_length));
    if (absl::Status s = ReadZip64Extra(
            file.substr(at + 46 + name_length, extra_length),
            entry.size == kMax32, entry.header_offset == kMax32, &entry.size,
            &entry.header_offset);
        !s.ok()) {
      return Invalid(absl::StrCat("entry \"", entry.name, "\": ", s.message()));
    }
    at = record_end;

    // The local header must agree.
    const uint64_t local = entry.header_offset;
    if (!Fits(file, local, 30) || LE(file, local, 4) != kLocalHeader) {
      return Invalid(absl::StrCat("entry \"", entry.name,
                                  "\": no local header at ", local));
    }
    const uint64_t local_name_length = LE(file, local + 26, 2);
    const uint64_t local_extra_length = LE(file, local + 28, 2);
    if (!Fits(file, local + 30, local_name_length + local_extra_length) ||
        file.substr(local + 30, local_name_length) != entry.name) {
      return Invalid(absl::StrCat("entry \"", entry.name,
                                  "\": local header names another file"));
    }
    if (LE(file, local + 8, 2) != 0 || (LE(file, local + 6, 2) & 1) ||
        LE(file, local + 14, 4) != entry.crc32) {
      return Invalid(absl::StrCat("entry \"", entry.name,
                                  "\": local header disagrees (method, "
                                  "flags or CRC)"));
    }
    uint64_t local_size = LE(file, local + 22, 4);
    if (LE(file, local + 18, 4) != local_size) {
      return Invalid(absl::StrCat("entry \"", entry.name,
                                  "\": local sizes differ"));
    }
    if (local_size == kMax32) {
      uint64_t unused = 0;
      if (absl::Status s = ReadZip64Extra(
              file.substr(local + 30 + local_name_length, local_extra_length),
              true, false, &local_size, &unused);
          !s.ok()) {
        return Invalid(absl::StrCat("entry \"", entry.name,
                                    "\" local: ", s.message()));
      }
    }
    if (local_size != entry.size) {
      return Invalid(absl::StrCat("entry \"", entry.name, "\": local size ",
                                  local_size, ", central ", entry.size));
    }
    entry.data_offset = local + 30 + local_name_length + local_extra_length;
    if (!Fits(file, entry.data_offset, entry.size) ||
        entry.data_offset + entry.size > cd_offset) {
      return Invalid(absl::StrCat("entry \"", entry.name,
                                  "\": data passes the central directory"));
    }
    if (ZipCrc32(file.substr(entry.data_offset, entry.size)) != entry.crc32) {
      return Invalid(absl::StrCat("entry \"", entry.name, "\": CRC mismatch"));
    }
    out.push_back(std::move(entry));
  }
  if (at != cd_offset + cd_size) {
    return Invalid("central directory has bytes after its last entry");
  }
  // Entries must not overlap.
  std::vector<const ZipEntryView*> by_offset;
  for (const ZipEntryView& e : out) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipEntryView* a, const ZipEntryView* b) {
              return a->header_offset < b->header_offset;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipEntryView* before = by_offset[i - 1];
    if (before->data_offset + before->size > by_offset[i]->header_offset) {
      return Invalid(absl::StrCat("entries \"", before->name, "\" and \"",
                                  by_offset[i]->name, "\" overlap"));
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (out[i].name == out[j].name) {
        return Invalid(absl::StrCat("two entries named \"", out[i].name, "\""));
      }
    }
  }
  return out;
}

}  // namespace materializer::fuzz
