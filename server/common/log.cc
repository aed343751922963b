#include "server/common/log.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace materializer::log {
namespace {

std::atomic<int> min_level{static_cast<int>(Level::kInfo)};
std::atomic<int> format{static_cast<int>(Format::kText)};
std::atomic<internal::Writer> writer{nullptr};

char LevelLetter(Level level) {
  switch (level) {
    case Level::kDebug:
      return 'D';
    case Level::kInfo:
      return 'I';
    case Level::kWarning:
      return 'W';
    case Level::kError:
      return 'E';
  }
  return '?';
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarning:
      return "warning";
    case Level::kError:
      return "error";
  }
  return "unknown";
}

const char* BaseName(const char* file) {
  const char* base = std::strrchr(file, '/');
  return base != nullptr ? base + 1 : file;
}

void Write(std::string text) {
  text.push_back('\n');
  if (internal::Writer w = writer.load(); w != nullptr) {
    w(text);
    return;
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
}

// The start of a line, up to the message: text "I1130 04:46:48.123456
// file.cc:42] ", or a JSON object's first members without the closing
// brace.
std::string Prefix(Level level, const char* file, int line) {
  const absl::Time now = absl::Now();
  if (CurrentFormat() == Format::kJson) {
    return absl::StrCat("{\"time\":\"", internal::Rfc3339(now),
                        "\",\"level\":\"", LevelName(level),
                        "\",\"source\":",
                        internal::JsonQuote(absl::StrCat(BaseName(file), ":",
                                                         line)));
  }
  return absl::StrCat(
      std::string(1, LevelLetter(level)),
      absl::FormatTime("%m%d %H:%M:%E6S", now, absl::LocalTimeZone()), " ",
      BaseName(file), ":", line, "] ");
}

// Length of the valid UTF-8 sequence at the start of `s`, or 0.
size_t Utf8Length(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  if (n == 0) return 0;
  if (p[0] < 0x80) return 1;
  size_t length = 0;
  uint32_t min = 0;
  uint32_t code = 0;
  if ((p[0] & 0xe0) == 0xc0) {
    length = 2, min = 0x80, code = p[0] & 0x1f;
  } else if ((p[0] & 0xf0) == 0xe0) {
    length = 3, min = 0x800, code = p[0] & 0x0f;
  } else if ((p[0] & 0xf8) == 0xf0) {
    length = 4, min = 0x10000, code = p[0] & 0x07;
  } else {
    return 0;
  }
  if (n < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    code = (code << 6) | (p[i] & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
    return 0;
  }
  return length;
}

// A text-format value: bare when it cannot be misread, else quoted.
std::string TextValue(absl::string_view value) {
  bool bare = !value.empty();
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || c == '"' || c == '=' || c == '\\' || u == 0x7f) {
      bare = false;
      break;
    }
  }
  return bare ? std::string(value) : internal::JsonQuote(value);
}

}  // namespace

void SetMinLevel(Level level) { min_level.store(static_cast<int>(level)); }

Level MinLevel() { return static_cast<Level>(min_level.load()); }

bool ParseLevel(absl::string_view text, Level* level) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") {
    *level = Level::kDebug;
  } else if (lower == "info") {
    *level = Level::kInfo;
  } else if (lower == "warning" || lower == "warn") {
    *level = Level::kWarning;
  } else if (lower == "error") {
    *level = Level::kError;
  } else {
    return false;
  }
  return true;
}

void SetFormat(Format f) { format.store(static_cast<int>(f)); }

Format CurrentFormat() { return static_cast<Format>(format.load()); }

bool ParseFormat(absl::string_view text, Format* out) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "text") {
    *out = Format::kText;
  } else if (lower == "json") {
    *out = Format::kJson;
  } else {
    return false;
  }
  return true;
}

namespace internal {

std::string JsonQuote(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  while (!text.empty()) {
    const auto c = static_cast<unsigned char>(text.front());
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\u%04x", c);
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (const size_t n = Utf8Length(text); n > 0) {
      out.append(text.data(), n);
      text.remove_prefix(n);
      continue;
    } else {
      out += "\\ufffd";
    }
    text.remove_prefix(1);
  }
  out.push_back('"');
  return out;
}

std::string Rfc3339(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6S%Ez", time,
                          absl::LocalTimeZone());
}

void SetWriterForTest(Writer w) { writer.store(w); }

LogLine::LogLine(Level level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogLine::~LogLine() {
  std::string prefix = Prefix(level_, file_, line_);
  if (CurrentFormat() == Format::kJson) {
    Write(absl::StrCat(prefix, ",\"msg\":", JsonQuote(stream_.str()), "}"));
  } else {
    Write(absl::StrCat(prefix, stream_.str()));
  }
}

EventLine::EventLine(Level level, const char* file, int line,
                     absl::string_view name)
    : level_(level), file_(file), line_(line), name_(name) {}

EventLine& EventLine::Str(absl::string_view key, absl::string_view value) {
  fields_.push_back({std::string(key), JsonQuote(value), TextValue(value)});
  return *this;
}

EventLine& EventLine::Int(absl::string_view key, int64_t value) {
  std::string number = absl::StrCat(value);
  fields_.push_back({std::string(key), number, number});
  return *this;
}

EventLine& EventLine::Uint(absl::string_view key, uint64_t value) {
  std::string number = absl::StrCat(value);
  fields_.push_back({std::string(key), number, number});
  return *this;
}

EventLine& EventLine::Double(absl::string_view key, double value) {
  // JSON has no NaN or infinity.
  std::string number =
      std::isfinite(value) ? absl::StrFormat("%.6g", value) : "null";
  fields_.push_back({std::string(key), number, number});
  return *this;
}

EventLine& EventLine::Bool(absl::string_view key, bool value) {
  const char* word = value ? "true" : "false";
  fields_.push_back({std::string(key), word, word});
  return *this;
}

EventLine& EventLine::Millis(absl::string_view key, absl::Duration value) {
  std::string number = absl::StrFormat(
      "%.3f", static_cast<double>(absl::ToInt64Microseconds(value)) / 1000.0);
  fields_.push_back({std::string(key), number, number});
  return *this;
}

EventLine& EventLine::List(absl::string_view key,
                           const std::vector<std::string>& values) {
  std::string json = "[";
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) {
      json += ",";
      text += ",";
    }
    json += JsonQuote(values[i]);
    text += values[i];
  }
  json += "]";
  fields_.push_back({std::string(key), std::move(json), TextValue(text)});
  return *this;
}

EventLine::~EventLine() {
  std::string line = Prefix(level_, file_, line_);
  if (CurrentFormat() == Format::kJson) {
    absl::StrAppend(&line, ",\"event\":", JsonQuote(name_));
    for (const Field& field : fields_) {
      absl::StrAppend(&line, ",", JsonQuote(field.key), ":", field.json);
    }
    line += "}";
  } else {
    line += name_;
    for (const Field& field : fields_) {
      absl::StrAppend(&line, " ", field.key, "=", field.text);
    }
  }
  Write(std::move(line));
}

}  // namespace internal
}  // namespace materializer::log
