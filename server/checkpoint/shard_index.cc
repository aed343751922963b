#include "server/checkpoint/shard_index.h"

#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/json.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::checkpoint {
namespace {

constexpr size_t kMaxFileNameBytes = 255;  // NAME_MAX

// Why `name` is not a plain file name, or "".
std::string FileNameProblem(absl::string_view name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "names a folder";
  if (name.find('/') != absl::string_view::npos) {
    return "has a '/' (shards are files in the index's own folder)";
  }
  if (name.find('\0') != absl::string_view::npos) return "has a NUL byte";
  if (name.size() > kMaxFileNameBytes) {
    return absl::StrCat("is longer than ", kMaxFileNameBytes, " bytes");
  }
  return "";
}

}  // namespace

absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view json,
                                           absl::string_view label) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", what));
  };
  auto json_error = [&](const absl::Status& status) {
    return invalid(absl::StrCat("shard index: ", status.message()));
  };
  JsonReader reader(json);
  {
    absl::StatusOr<JsonReader::Type> type = reader.Peek();
    if (!type.ok()) return json_error(type.status());
    if (*type != JsonReader::Type::kObject) {
      return invalid("shard index is not a JSON object");
    }
  }
  if (absl::Status s = reader.BeginObject(); !s.ok()) return json_error(s);
  ShardIndex index;
  bool has_weight_map = false;
  std::string key;
  while (true) {
    absl::StatusOr<bool> more = reader.NextMember(&key);
    if (!more.ok()) return json_error(more.status());
    if (!*more) break;
    if (key != "weight_map") {
      if (absl::Status s = reader.SkipValue(); !s.ok()) return json_error(s);
      continue;
    }
    has_weight_map = true;
    absl::StatusOr<JsonReader::Type> type = reader.Peek();
    if (!type.ok()) return json_error(type.status());
    if (*type != JsonReader::Type::kObject) {
      return invalid("weight_map is not an object");
    }
    if (absl::Status s = reader.BeginObject(); !s.ok()) return json_error(s);
    std::string tensor;
    while (true) {
      absl::StatusOr<bool> member = reader.NextMember(&tensor);
      if (!member.ok()) return json_error(member.status());
      if (!*member) break;
      type = reader.Peek();
      if (!type.ok()) return json_error(type.status());
      if (*type != JsonReader::Type::kString) {
        return invalid(absl::StrCat("weight_map: tensor ", Quote(tensor),
                                    " maps to something other than a file "
                                    "name string"));
      }
      absl::StatusOr<std::string> file = reader.ReadString();
      if (!file.ok()) return json_error(file.status());
      if (const std::string problem = FileNameProblem(*file);
          !problem.empty()) {
        return invalid(absl::StrCat("weight_map: tensor ", Quote(tensor),
                                    ": file name ", Quote(*file), " ",
                                    problem));
      }
      index.weight_map.emplace(std::move(tensor), *std::move(file));
    }
  }
  if (absl::Status s = reader.ExpectEnd(); !s.ok()) return json_error(s);
  if (!has_weight_map) return invalid("shard index has no weight_map");
  std::set<absl::string_view> files;
  for (const auto& [tensor, file] : index.weight_map) files.insert(file);
  for (absl::string_view file : files) index.files.emplace_back(file);
  return index;
}

absl::StatusOr<ShardIndex> ReadShardIndex(const RandomAccessFile& file,
                                          absl::string_view label) {
  if (file.size() > kMaxShardIndexBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": a shard index of ", file.size(),
                     " bytes is larger than the limit of ",
                     kMaxShardIndexBytes, " bytes"));
  }
  ASSIGN_OR_RETURN(const std::string json, ReadBytes(file, 0, file.size()));
  return ParseShardIndex(json, label);
}

}  // namespace materializer::checkpoint
