#include "server/common/log.h"

#include <atomic>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace materializer::log {
namespace {

std::atomic<int> min_level{static_cast<int>(Level::kInfo)};

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

namespace internal {

LogLine::LogLine(Level level, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  stream_ << LevelLetter(level)
          << absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(),
                              absl::LocalTimeZone())
          << ' ' << (base != nullptr ? base + 1 : file) << ':' << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace internal
}  // namespace materializer::log
