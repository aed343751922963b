#ifndef MATERIALIZER_CLIENT_REQUEST_FILE_H_
#define MATERIALIZER_CLIENT_REQUEST_FILE_H_

// matctl's request files: a PlanRequest or MaterializeRequest in the proto3
// JSON mapping (see examples/). A MaterializeRequest is a PlanRequest plus
// a few fields, so every file parses as a MaterializeRequest, which accepts
// both kinds while still rejecting unknown fields (typos).
//
//   ASSIGN_OR_RETURN(v1::MaterializeRequest request,
//                    ReadRequestFile("examples/mlp.json"));

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client {

// Parses the text of a request file. INVALID_ARGUMENT naming `path` and
// the parser's reason (with the text around the error) when it is not one.
absl::StatusOr<v1::MaterializeRequest> ParseRequestFile(
    absl::string_view text, absl::string_view path);

// Reads and parses the request file at `path`.
absl::StatusOr<v1::MaterializeRequest> ReadRequestFile(const std::string& path);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_REQUEST_FILE_H_
