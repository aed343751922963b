#include "server/registry/handle_id.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/common/random_hex.h"

namespace materializer::registry {

std::string NewHandleId(absl::string_view replica) {
  std::string id = absl::StrCat("h-", UnguessableHex128());
  if (!replica.empty()) absl::StrAppend(&id, "@", replica);
  return id;
}

absl::string_view ReplicaOfId(absl::string_view id) {
  const size_t at = id.rfind(kReplicaSeparator);
  if (at == absl::string_view::npos) return "";
  return id.substr(at + 1);
}

std::string ReplicaNameProblem(absl::string_view name) {
  if (name.empty() || name.size() > 63) {
    return absl::StrCat("replica name \"", name,
                        "\" must be 1 to 63 characters");
  }
  for (const char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return absl::StrCat("replica name \"", name,
                          "\" may contain only a-z, 0-9 and '-' (a DNS label)");
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return absl::StrCat("replica name \"", name,
                        "\" must start and end with a letter or digit");
  }
  return "";
}

}  // namespace materializer::registry
