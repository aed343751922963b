#include "fuzz/readers/zip_reader.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::fuzz {

absl::StatusOr<std::vector<ZipEntryView>> ReadZip(absl::string_view file) {
  const checkpoint::StringFile reader(file);
  absl::StatusOr<checkpoint::ZipDirectory> directory =
      checkpoint::ReadZipDirectory(reader, "zip");
  if (!directory.ok()) return directory.status();
  std::vector<ZipEntryView> out;
  for (size_t i = 0; i < directory->entries.size(); ++i) {
    const checkpoint::ZipEntry& entry = directory->entries[i];
    if (entry.method != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", i, " is compressed"));
    }
    absl::StatusOr<uint64_t> data =
        checkpoint::ZipEntryDataOffset(reader, *directory, entry, "zip");
    if (!data.ok()) return data.status();
    ZipEntryView view;
    view.name = entry.name;
    view.header_offset = entry.header_offset;
    view.data_offset = *data;
    view.size = entry.size;
    view.crc32 = entry.crc32;
    if (ZipCrc32(file.substr(view.data_offset, view.size)) != view.crc32) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry \"", view.name, "\": CRC mismatch"));
    }
    out.push_back(std::move(view));
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
      return absl::InvalidArgumentError(
          absl::StrCat("entries \"", before->name, "\" and \"",
                       by_offset[i]->name, "\" overlap"));
    }
  }
  return out;
}

}  // namespace materializer::fuzz
