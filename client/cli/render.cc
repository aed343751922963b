#include "client/cli/render.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/format.h"
#include "server/common/units.h"

namespace materializer::client::cli {

std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  absl::string_view short_name = name;
  absl::ConsumePrefix(&short_name, prefix);
  return std::string(short_name);
}

std::string BytesWithCount(uint64_t bytes) {
  if (bytes < 1024) return FormatBytes(bytes);
  return absl::StrCat(FormatBytes(bytes), " (", bytes, ")");
}

std::string ShapeOf(const google::protobuf::RepeatedField<int64_t>& shape) {
  return FormatShape(absl::MakeConstSpan(shape.data(), shape.size()));
}

std::string FormatTimestamp(const google::protobuf::Timestamp& timestamp) {
  const absl::Time time = absl::FromUnixSeconds(timestamp.seconds()) +
                          absl::Nanoseconds(timestamp.nanos());
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", time, absl::UTCTimeZone());
}

void PrintWarnings(
    std::ostream& out,
    const google::protobuf::RepeatedPtrField<std::string>& warnings) {
  if (warnings.empty()) return;
  out << "\nwarnings:\n";
  for (const std::string& warning : warnings) out << "  " << warning << "\n";
}

void PrintTruncation(std::ostream& out, int shown, int total) {
  if (shown < total) {
    out << "... " << total - shown << " more (--all lists every tensor)\n";
  }
}

void PrintJson(std::ostream& out, const google::protobuf::Message& message) {
  out << PrettyJson(MessageJson(message));
}

void PrintJson(std::ostream& out, const JsonObject& object) {
  out << PrettyJson(object.Render());
}

JsonObject StatusJson(const absl::Status& status) {
  JsonObject error;
  error.Str("code", absl::StatusCodeToString(status.code()))
      .Str("message", status.message());
  return error;
}

std::string ReplicaLabel(absl::string_view replica, absl::string_view address) {
  if (replica.empty()) return absl::StrCat("the server at ", address);
  return absl::StrCat("replica ", replica, " (", address, ")");
}

}  // namespace materializer::client::cli
