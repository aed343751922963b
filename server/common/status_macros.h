#ifndef MATERIALIZER_SERVER_COMMON_STATUS_MACROS_H_
#define MATERIALIZER_SERVER_COMMON_STATUS_MACROS_H_

// The project's one pair of early-return helpers for absl::Status and
// absl::StatusOr<T>.
//
//   RETURN_IF_ERROR(pool.Check(request));
//   ASSIGN_OR_RETURN(Layout layout, ComputeLayout(spec));

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MATERIALIZER_CONCAT_INNER_(a, b) a##b
#define MATERIALIZER_CONCAT_(a, b) MATERIALIZER_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                         \
  do {                                                                \
    ::absl::Status materializer_status_ = (expr);                     \
    if (!materializer_status_.ok()) return materializer_status_;      \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr)                                       \
  MATERIALIZER_ASSIGN_OR_RETURN_IMPL_(                                    \
      MATERIALIZER_CONCAT_(materializer_statusor_, __LINE__), lhs, expr)

#define MATERIALIZER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                        \
  if (!statusor.ok()) return std::move(statusor).status();       \
  lhs = std::move(statusor).value()

#endif  // MATERIALIZER_SERVER_COMMON_STATUS_MACROS_H_
