#ifndef MATERIALIZER_SERVER_COMMON_LOG_H_
#define MATERIALIZER_SERVER_COMMON_LOG_H_

// Leveled logging to stderr (Abseil LTS 2022-06 predates absl/log), as
// free text or as structured events with named fields:
//
//   MLOG(INFO) << "listening on " << address;
//   MLOG_EVENT(INFO, "rpc").Str("method", "Plan").Uint("response_bytes", n);
//
// Two formats (SetFormat), chosen once at start-up:
//   text (default):
//     I1130 04:46:48.123456 server.cc:42] listening on ...
//     I1130 04:46:48.123456 call.cc:80] rpc method=Plan response_bytes=512
//   json (one object per line, for log collectors):
//     {"time":"2024-11-30T04:46:48.123456+01:00","level":"info",
//      "source":"server.cc:42","msg":"listening on ..."}
//     {"time":...,"level":"info","source":"call.cc:80","event":"rpc",
//      "method":"Plan","response_bytes":512}
// Every JSON line is valid UTF-8 (bytes that are not become U+FFFD), so
// whatever a client managed to put into a name cannot break a line.
//
// Thread-safe: each line is formatted privately and written with one call.

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace materializer::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class Format { kText, kJson };

// Lines below this level are dropped. Default kInfo.
void SetMinLevel(Level level);
Level MinLevel();

// Parses "debug", "info", "warning", "error".
bool ParseLevel(absl::string_view text, Level* level);

// The line format; default kText. Set it before other threads log.
void SetFormat(Format format);
Format CurrentFormat();

// Parses "text" or "json".
bool ParseFormat(absl::string_view text, Format* format);

namespace internal {

class LogLine {
 public:
  LogLine(Level level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  Level level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// One structured event; written when destroyed. Field order is kept.
class EventLine {
 public:
  EventLine(Level level, const char* file, int line, absl::string_view name);
  ~EventLine();
  EventLine(const EventLine&) = delete;
  EventLine& operator=(const EventLine&) = delete;

  EventLine& Str(absl::string_view key, absl::string_view value);
  EventLine& Int(absl::string_view key, int64_t value);
  EventLine& Uint(absl::string_view key, uint64_t value);
  EventLine& Double(absl::string_view key, double value);
  EventLine& Bool(absl::string_view key, bool value);
  // A duration as fractional milliseconds (microsecond resolution).
  EventLine& Millis(absl::string_view key, absl::Duration value);
  EventLine& List(absl::string_view key,
                  const std::vector<std::string>& values);

 private:
  struct Field {
    std::string key;
    // A JSON value: a quoted string, a number, true/false, or a list.
    std::string json;
    // The same for the text format (strings unquoted where unambiguous).
    std::string text;
  };

  Level level_;
  const char* file_;
  int line_;
  std::string name_;
  std::vector<Field> fields_;
};

// `text` as a JSON string literal, quotes included; invalid UTF-8 becomes
// U+FFFD and control characters are escaped.
std::string JsonQuote(absl::string_view text);

// `time` in RFC 3339 with microseconds and the local zone's offset:
// "2024-11-30T04:46:48.123456+01:00".
std::string Rfc3339(absl::Time time);

// Where finished lines go (default: stderr). For tests; not thread-safe
// against concurrent logging. Null restores stderr.
using Writer = void (*)(absl::string_view line);
void SetWriterForTest(Writer writer);

}  // namespace internal
}  // namespace materializer::log

#define MLOG_LEVEL_DEBUG ::materializer::log::Level::kDebug
#define MLOG_LEVEL_INFO ::materializer::log::Level::kInfo
#define MLOG_LEVEL_WARNING ::materializer::log::Level::kWarning
#define MLOG_LEVEL_ERROR ::materializer::log::Level::kError

#define MLOG(severity)                                              \
  if (MLOG_LEVEL_##severity < ::materializer::log::MinLevel()) {    \
  } else                                                            \
    ::materializer::log::internal::LogLine(MLOG_LEVEL_##severity,   \
                                           __FILE__, __LINE__)

// A structured event named `name` ("rpc", "fetch_start", ...); chain the
// fields. Nothing is formatted when the level is off.
#define MLOG_EVENT(severity, name)                                    \
  if (MLOG_LEVEL_##severity < ::materializer::log::MinLevel()) {      \
  } else                                                              \
    ::materializer::log::internal::EventLine(MLOG_LEVEL_##severity,   \
                                             __FILE__, __LINE__, name)

#endif  // MATERIALIZER_SERVER_COMMON_LOG_H_
