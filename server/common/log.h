#ifndef MATERIALIZER_SERVER_COMMON_LOG_H_
#define MATERIALIZER_SERVER_COMMON_LOG_H_

// Minimal leveled logging to stderr (Abseil LTS 2022-06 predates absl/log).
//
//   MLOG(INFO) << "listening on " << address;
//
// Lines look like `I1130 04:46:48.123456 server.cc:42] listening on ...`.
// Thread-safe: each line is formatted privately and written with one call.

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace materializer::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Lines below this level are dropped. Default kInfo.
void SetMinLevel(Level level);
Level MinLevel();

// Parses "debug", "info", "warning", "error".
bool ParseLevel(absl::string_view text, Level* level);

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
  std::ostringstream stream_;
};

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

#endif  // MATERIALIZER_SERVER_COMMON_LOG_H_
