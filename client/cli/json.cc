#include "client/cli/json.h"

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "google/protobuf/util/json_util.h"

namespace materializer::client::cli {

JsonObject& JsonObject::Raw(absl::string_view key, std::string json) {
  members_.emplace_back(std::string(key), std::move(json));
  return *this;
}

JsonObject& JsonObject::Str(absl::string_view key, absl::string_view value) {
  return Raw(key, JsonQuote(value));
}

JsonObject& JsonObject::Bool(absl::string_view key, bool value) {
  return Raw(key, value ? "true" : "false");
}

JsonObject& JsonObject::U64(absl::string_view key, uint64_t value) {
  return Raw(key, absl::StrCat("\"", value, "\""));
}

JsonObject& JsonObject::U32(absl::string_view key, uint32_t value) {
  return Raw(key, absl::StrCat(value));
}

JsonObject& JsonObject::Object(absl::string_view key, const JsonObject& value) {
  return Raw(key, value.Render());
}

JsonObject& JsonObject::Array(absl::string_view key,
                              const std::vector<JsonObject>& values) {
  std::string json = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) json += ",";
    json += values[i].Render();
  }
  return Raw(key, json + "]");
}

JsonObject& JsonObject::Strings(absl::string_view key,
                                const std::vector<std::string>& values) {
  std::string json = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) json += ",";
    json += JsonQuote(values[i]);
  }
  return Raw(key, json + "]");
}

JsonObject& JsonObject::Message(absl::string_view key,
                                const google::protobuf::Message& value) {
  return Raw(key, MessageJson(value));
}

std::string JsonObject::Render() const {
  std::string json = "{";
  for (size_t i = 0; i < members_.size(); ++i) {
    if (i > 0) json += ",";
    absl::StrAppend(&json, JsonQuote(members_[i].first), ":",
                    members_[i].second);
  }
  return json + "}";
}

std::string MessageJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing fails only for an Any whose type cannot be resolved; the API
  // has none.
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    return "{}";
  }
  return json;
}

std::string PrettyJson(absl::string_view json) {
  std::string out;
  int depth = 0;
  bool in_string = false;
  auto newline = [&] {
    out += '\n';
    out.append(static_cast<size_t>(2 * depth), ' ');
  };
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < json.size()) {
        out += json[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        out += c;
        break;
      case '{':
      case '[': {
        const char close = c == '{' ? '}' : ']';
        if (i + 1 < json.size() && json[i + 1] == close) {
          out += c;
          out += close;
          ++i;
          break;
        }
        out += c;
        ++depth;
        newline();
        break;
      }
      case '}':
      case ']':
        --depth;
        newline();
        out += c;
        break;
      case ',':
        out += c;
        newline();
        break;
      case ':':
        out += ": ";
        break;
      case ' ':
      case '\n':
      case '\t':
      case '\r':
        break;
      default:
        out += c;
    }
  }
  return out + "\n";
}

}  // namespace materializer::client::cli
