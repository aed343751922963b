#ifndef MATERIALIZER_SERVER_COMMON_CANCEL_H_
#define MATERIALIZER_SERVER_COMMON_CANCEL_H_

// Long request work polls whether its caller is still there. The service
// passes a predicate that turns true once the client has cancelled, its
// connection broke, or its deadline passed; work that loops over tensors
// checks it every few thousand steps and stops with CANCELLED, so a
// cancelled call stops using its worker within milliseconds.
//
//   for (size_t i = 0; i < tensors.size(); ++i) {
//     if (i % kCancelPollInterval == 0) RETURN_IF_ERROR(CheckCancelled(cancelled));
//     ...
//   }

#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace materializer {

// True once the caller is gone. An empty function means "never".
using Cancelled = std::function<bool()>;

// How many cheap steps (one tensor, one glob match row) between polls.
inline constexpr size_t kCancelPollInterval = 1024;

// CANCELLED if `cancelled` says the caller is gone, else OK.
inline absl::Status CheckCancelled(const Cancelled& cancelled) {
  if (cancelled && cancelled()) {
    return absl::CancelledError(
        "the caller went away (it cancelled, or its deadline passed); the "
        "work stopped and nothing was kept");
  }
  return absl::OkStatus();
}

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_CANCEL_H_
