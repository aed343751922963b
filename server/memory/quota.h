#ifndef MATERIALIZER_SERVER_MEMORY_QUOTA_H_
#define MATERIALIZER_SERVER_MEMORY_QUOTA_H_

// Per-client limits, checked by the pool when it admits a reservation.
//
// Loaded from a JSON file (sizes as "16GiB" strings or byte counts):
//
//   {
//     "default": {"totalBytes": "64GiB", "deviceBytes": "40GiB", "handles": 100},
//     "clients": {
//       "trainer-a": {"totalBytes": "200GiB", "devices": {"cuda:0": "80GiB"}},
//       "ci": {"totalBytes": "4GiB", "handles": 10}
//     }
//   }
//
// A client not listed gets "default"; a field left out means no limit.

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::memory {

inline constexpr uint64_t kNoByteLimit = std::numeric_limits<uint64_t>::max();
inline constexpr uint32_t kNoHandleLimit = std::numeric_limits<uint32_t>::max();

struct Quota {
  // Bytes over every device together.
  uint64_t total_bytes = kNoByteLimit;
  // Bytes on any one device, unless `devices` names it.
  uint64_t device_bytes = kNoByteLimit;
  std::map<std::string, uint64_t, std::less<>> devices;
  // Live handles (reserved or allocated).
  uint32_t handles = kNoHandleLimit;

  uint64_t BytesOn(absl::string_view device) const {
    auto it = devices.find(device);
    return it == devices.end() ? device_bytes : it->second;
  }
};

// Immutable after construction; thread-safe to read.
class QuotaBook {
 public:
  // No limits for anyone.
  QuotaBook() = default;
  explicit QuotaBook(Quota default_quota) : default_(std::move(default_quota)) {}

  // Parses the JSON format above. `base` is the default before the file's
  // "default" entry applies (e.g. from flags). INVALID_ARGUMENT naming the
  // offending key.
  static absl::StatusOr<QuotaBook> FromJson(absl::string_view json,
                                            Quota base = Quota());

  const Quota& For(absl::string_view client) const;
  const Quota& default_quota() const { return default_; }

 private:
  Quota default_;
  std::map<std::string, Quota, std::less<>> clients_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_QUOTA_H_
