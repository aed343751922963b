#include "client/request_file.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/status_macros.h"

namespace materializer::client {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  return text.str();
}

// The JSON parser's reason for a syntax error is the message, then the
// text around the error and a line with a caret under it, with blank lines
// between. Drops the blank lines, and the caret when there is no text
// around it (an error at the end of the file).
std::string TidyParseError(absl::string_view reason) {
  std::vector<absl::string_view> lines;
  for (absl::string_view line : absl::StrSplit(reason, '\n')) {
    if (!absl::StripAsciiWhitespace(line).empty()) lines.push_back(line);
  }
  if (lines.size() == 2 && absl::StripAsciiWhitespace(lines[1]) == "^") {
    lines.pop_back();
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace

absl::StatusOr<v1::MaterializeRequest> ParseRequestFile(
    absl::string_view text, absl::string_view path) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  v1::MaterializeRequest request;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &request,
      options);
  if (!status.ok()) {
    const auto reason = status.message();
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a PlanRequest or MaterializeRequest in proto3 JSON: ",
        TidyParseError(absl::string_view(reason.data(), reason.size()))));
  }
  return request;
}

absl::StatusOr<v1::MaterializeRequest> ReadRequestFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ParseRequestFile(text, path);
}

}  // namespace materializer::client
