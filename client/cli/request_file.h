#ifndef MATERIALIZER_CLIENT_CLI_REQUEST_FILE_H_
#define MATERIALIZER_CLIENT_CLI_REQUEST_FILE_H_

// matctl's request files: a PlanRequest or MaterializeRequest in the proto3
// JSON mapping (examples/).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client::cli {

// A MaterializeRequest is a PlanRequest plus `label`, `async` and `ttl`, so
// every file parses as a MaterializeRequest: both kinds are accepted while
// unknown fields (typos) are still refused. INVALID_ARGUMENT naming the
// file and the parser's reason; the file's errno status if unreadable.
absl::StatusOr<v1::MaterializeRequest> ReadRequestFile(const std::string& path);

// The JSON parser's reason for a syntax error without its blank lines, and
// without the caret line when there is no text around it.
std::string TidyParseError(absl::string_view reason);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_REQUEST_FILE_H_
