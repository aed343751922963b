#ifndef MATERIALIZER_SERVER_COMMON_TORCH_GUARD_H_
#define MATERIALIZER_SERVER_COMMON_TORCH_GUARD_H_

// LibTorch reports errors by throwing. Every call into it from the server
// goes through GuardTorch, so no exception ever reaches gRPC or a client.
//
//   RETURN_IF_ERROR(GuardTorch("allocating the arena", [&] {
//     storage = at::empty({bytes}, options);
//   }));

#include <exception>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "c10/util/Exception.h"

namespace materializer {

// Runs `fn`; maps an out-of-memory error to RESOURCE_EXHAUSTED and any other
// exception to INTERNAL, prefixed with `what`.
template <typename Fn>
absl::Status GuardTorch(absl::string_view what, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return absl::OkStatus();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of host memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_TORCH_GUARD_H_
