#include "server/registry/handle_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace materializer::registry {

std::string NewHandleId(absl::string_view replica) {
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();  // no entropy source: unguessable ids are impossible
    }
    filled += static_cast<size_t>(n);
  }
  std::string id = "h-";
  for (unsigned char b : bytes) {
    absl::StrAppend(&id, absl::Hex(b, absl::kZeroPad2));
  }
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
