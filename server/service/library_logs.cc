#include "server/service/library_logs.h"

#include <cstdlib>
#include <string>

#include "absl/base/internal/raw_logging.h"
#include "absl/base/log_severity.h"
#include "grpc/support/log.h"
#include "server/common/log.h"

namespace materializer::service {
namespace {

void FromGrpc(gpr_log_func_args* args) {
  log::Level level = log::Level::kDebug;
  if (args->severity == GPR_LOG_SEVERITY_ERROR) {
    level = log::Level::kError;
  } else if (args->severity == GPR_LOG_SEVERITY_INFO) {
    level = log::Level::kInfo;
  }
  if (level < log::MinLevel()) return;
  log::internal::LogLine(level, args->file, args->line) << args->message;
}

// Abseil's ABSL_INTERNAL_LOG. A fatal message ends the process, as
// abseil's own handler would.
void FromAbseil(absl::LogSeverity severity, const char* file, int line,
                const std::string& message) {
  log::Level level = log::Level::kInfo;
  if (severity == absl::LogSeverity::kWarning) {
    level = log::Level::kWarning;
  } else if (severity >= absl::LogSeverity::kError) {
    level = log::Level::kError;
  }
  if (level >= log::MinLevel() || severity == absl::LogSeverity::kFatal) {
    log::internal::LogLine(level, file, line) << message;
  }
  if (severity == absl::LogSeverity::kFatal) std::abort();
}

}  // namespace

void RouteLibraryLogs() {
  gpr_set_log_function(FromGrpc);
  absl::raw_logging_internal::RegisterInternalLogFunction(FromAbseil);
}

}  // namespace materializer::service
