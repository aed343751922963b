#ifndef MATERIALIZER_CLIENT_CLI_RENDER_H_
#define MATERIALIZER_CLIENT_CLI_RENDER_H_

// Small pieces the commands print with: cells of tables, JSON to stdout,
// and how a replica is named.

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/cli/json.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_field.h"
#include "google/protobuf/timestamp.pb.h"

namespace materializer::client::cli {

// Tensor tables stop here unless --all.
inline constexpr int kMaxTensorRows = 20;

// "HANDLE_STATE_READY" -> "READY": the enum prefix is noise in a table.
std::string ShortEnumName(const std::string& name, absl::string_view prefix);

// "8.00 KiB (8192)": readable, and still exact.
std::string BytesWithCount(uint64_t bytes);

std::string ShapeOf(const google::protobuf::RepeatedField<int64_t>& shape);

// "2024-05-01 12:00:00 UTC".
std::string FormatTimestamp(const google::protobuf::Timestamp& timestamp);

void PrintWarnings(
    std::ostream& out,
    const google::protobuf::RepeatedPtrField<std::string>& warnings);

// "... N more (--all lists every tensor)" under a truncated tensor table.
void PrintTruncation(std::ostream& out, int shown, int total);

// Prints pretty JSON (json.h) of a message or an object.
void PrintJson(std::ostream& out, const google::protobuf::Message& message);
void PrintJson(std::ostream& out, const JsonObject& object);

// {"code": "UNAVAILABLE", "message": "..."} for a failed replica.
JsonObject StatusJson(const absl::Status& status);

// "replica r1 (10.0.0.5:50051)"; "the server at ADDRESS" without a name.
std::string ReplicaLabel(absl::string_view replica, absl::string_view address);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_RENDER_H_
