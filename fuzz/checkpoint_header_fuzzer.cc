// Fuzz target: the header readers of checkpoint files (server/checkpoint):
// the safetensors header and the shard index (model.safetensors.index.json).
// The first input byte selects what the rest is:
//   0  a safetensors header's JSON; the next two bytes first give the size
//      of the data section after it (ParseSafetensorsHeader);
//   1  a whole safetensors file (ReadSafetensorsTensors over its bytes);
//   2  a shard index (ParseShardIndex).
//
// Properties:
//   - an error is INVALID_ARGUMENT and names the file (never a crash, an
//     overflow or another code);
//   - accepted tensors have unique names, a byte count equal to their
//     element count times their dtype's size, and ranges that tile the data
//     section exactly, in file order;
//   - a header written again from what was read (names and metadata escaped
//     here) reads back to the same tensors, offsets and metadata;
//   - an accepted index maps to plain file names only (no '/', not "." or
//     ".."), and lists each distinct file once, sorted.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"
#include "server/checkpoint/safetensors_header.h"
#include "server/checkpoint/shard_index.h"
#include "server/spec/dtype.h"

namespace materializer::fuzz {
namespace {

using checkpoint::CheckpointTensor;
using checkpoint::SafetensorsMetadata;

constexpr absl::string_view kLabel = "fuzz/model.safetensors";

void CheckError(const absl::Status& status) {
  FUZZ_CHECK(absl::IsInvalidArgument(status))
      << "an error other than INVALID_ARGUMENT: " << status;
  FUZZ_CHECK(absl::StrContains(status.message(), kLabel))
      << "an error that does not name the file: " << status;
}

// A JSON string literal for `text` (valid UTF-8, as the reader returned).
std::string Quoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(u, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

// The header of the tensors as a writer would write it, in reverse order
// (the reader must not depend on the order).
std::string WriteHeader(const std::vector<CheckpointTensor>& tensors,
                        const SafetensorsMetadata& metadata,
                        uint64_t data_start) {
  std::vector<std::string> members;
  if (!metadata.empty()) {
    std::vector<std::string> pairs;
    for (const auto& [key, value] : metadata) {
      pairs.push_back(absl::StrCat(Quoted(key), ":", Quoted(value)));
    }
    members.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(pairs, ","), "}"));
  }
  for (size_t i = tensors.size(); i-- > 0;) {
    const CheckpointTensor& t = tensors[i];
    const uint64_t begin = t.offset - data_start;
    members.push_back(absl::StrCat(
        Quoted(t.name), ":{\"dtype\":\"",
        spec::Info(t.dtype).safetensors_name, "\",\"shape\":[",
        absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", begin, ",",
        begin + t.nbytes, "]}"));
  }
  return absl::StrCat("{", absl::StrJoin(members, ","), "}");
}

void CheckTensors(const std::vector<CheckpointTensor>& tensors,
                  const SafetensorsMetadata& metadata, uint64_t header_length,
                  uint64_t file_size) {
  const uint64_t data_start = 8 + header_length;
  uint64_t cursor = data_start;
  std::set<std::string> names;
  for (const CheckpointTensor& t : tensors) {
    FUZZ_CHECK(names.insert(t.name).second) << "two tensors named " << t.name;
    FUZZ_CHECK(t.name != "__metadata__") << "__metadata__ read as a tensor";
    FUZZ_CHECK(t.shape.size() <= checkpoint::kMaxCheckpointRank);
    unsigned __int128 nbytes = spec::ItemSize(t.dtype);
    for (int64_t size : t.shape) {
      FUZZ_CHECK(size >= 0) << t.name << " has a negative size";
      nbytes *= static_cast<uint64_t>(size);
      if (nbytes > (unsigned __int128){1} << 64) nbytes = 0;  // checked below
    }
    FUZZ_CHECK(nbytes == t.nbytes)
        << t.name << ": " << t.nbytes << " bytes for its shape and dtype";
    FUZZ_CHECK(t.offset == cursor)
        << t.name << " at " << t.offset << ", expected " << cursor;
    cursor = t.offset + t.nbytes;
  }
  FUZZ_CHECK(cursor == file_size)
      << "the tensors end at " << cursor << " of " << file_size;

  // Written again, read again: the same tensors.
  const std::string header = WriteHeader(tensors, metadata, data_start);
  const uint64_t new_size = 8 + header.size() + (file_size - data_start);
  SafetensorsMetadata again_metadata;
  absl::StatusOr<std::vector<CheckpointTensor>> again =
      checkpoint::ParseSafetensorsHeader(header, header.size(), new_size,
                                         kLabel, &again_metadata);
  FUZZ_CHECK(again.ok()) << "the header written again is refused: "
                         << again.status() << "\n  " << header;
  FUZZ_CHECK(again->size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& a = tensors[i];
    const CheckpointTensor& b = (*again)[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
               a.nbytes == b.nbytes &&
               a.offset - data_start == b.offset - (8 + header.size()))
        << "tensor " << i << " reads back as another: " << a.name << " / "
        << b.name;
  }
  FUZZ_CHECK(again_metadata == metadata) << "metadata reads back otherwise";
}

void FuzzHeader(absl::string_view input) {
  if (input.size() < 2) return;
  const uint64_t data_size = static_cast<unsigned char>(input[0]) |
                             static_cast<uint64_t>(
                                 static_cast<unsigned char>(input[1]))
                                 << 8;
  const absl::string_view header = input.substr(2);
  const uint64_t file_size = 8 + header.size() + data_size;
  SafetensorsMetadata metadata;
  absl::StatusOr<std::vector<CheckpointTensor>> tensors =
      checkpoint::ParseSafetensorsHeader(header, header.size(), file_size,
                                         kLabel, &metadata);
  if (!tensors.ok()) return CheckError(tensors.status());
  CheckTensors(*tensors, metadata, header.size(), file_size);
}

void FuzzFile(absl::string_view file) {
  SafetensorsMetadata metadata;
  absl::StatusOr<std::vector<CheckpointTensor>> tensors =
      checkpoint::ReadSafetensorsTensors(checkpoint::StringFile(file), kLabel,
                                         &metadata);
  if (!tensors.ok()) return CheckError(tensors.status());
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) {
    header_length = (header_length << 8) | static_cast<unsigned char>(file[i]);
  }
  CheckTensors(*tensors, metadata, header_length, file.size());
}

void FuzzIndex(absl::string_view json) {
  absl::StatusOr<checkpoint::ShardIndex> index =
      checkpoint::ParseShardIndex(json, kLabel);
  if (!index.ok()) return CheckError(index.status());
  std::set<std::string> files;
  for (const auto& [tensor, file] : index->weight_map) {
    FUZZ_CHECK(!file.empty() && file != "." && file != ".." &&
               file.find('/') == std::string::npos &&
               file.find('\0') == std::string::npos)
        << "tensor " << tensor << " maps to file " << file;
    files.insert(file);
  }
  FUZZ_CHECK(std::vector<std::string>(files.begin(), files.end()) ==
             index->files)
      << "files is not the sorted distinct file names";
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer::fuzz;
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  switch (data[0] % 3) {
    case 0: FuzzHeader(rest); break;
    case 1: FuzzFile(rest); break;
    case 2: FuzzIndex(rest); break;
  }
  return 0;
}
