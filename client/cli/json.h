#ifndef MATERIALIZER_CLIENT_CLI_JSON_H_
#define MATERIALIZER_CLIENT_CLI_JSON_H_

// matctl's --output=json: one encoding for every command, the proto3 JSON
// mapping's. Responses print as their messages; what matctl adds (a
// fetch's result, per-replica wrappers) is built with JsonObject, whose
// typed setters follow the same rules:
//   - 64-bit integers (byte counts, seeds, fingerprints) are strings of
//     decimal digits, "1048576", so no JSON reader rounds them;
//   - 32-bit integers (counts of tensors, handles) are numbers;
//   - names are lowerCamelCase, every field is present, defaults included.
//
//   JsonObject out;
//   out.Str("handle", id).U64("totalBytes", size);
//   std::cout << PrettyJson(out.Render());

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace materializer::client::cli {

// A JSON object under construction, as compact text.
//
// Thread-compatible.
class JsonObject {
 public:
  JsonObject& Str(absl::string_view key, absl::string_view value);
  JsonObject& Bool(absl::string_view key, bool value);
  JsonObject& U64(absl::string_view key, uint64_t value);
  JsonObject& U32(absl::string_view key, uint32_t value);
  JsonObject& Object(absl::string_view key, const JsonObject& value);
  JsonObject& Array(absl::string_view key,
                    const std::vector<JsonObject>& values);
  JsonObject& Strings(absl::string_view key,
                      const std::vector<std::string>& values);
  // The message in the proto3 JSON mapping, defaults included.
  JsonObject& Message(absl::string_view key,
                      const google::protobuf::Message& value);

  // Compact JSON text.
  std::string Render() const;

 private:
  JsonObject& Raw(absl::string_view key, std::string json);

  std::vector<std::pair<std::string, std::string>> members_;
};

// The message in the proto3 JSON mapping, compact, defaults included.
std::string MessageJson(const google::protobuf::Message& message);

// Compact JSON text indented two spaces per level, one member per line,
// ending with a newline. REQUIRES: `json` is valid JSON.
std::string PrettyJson(absl::string_view json);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_JSON_H_
