#ifndef MATERIALIZER_SERVER_SERVICE_LIBRARY_LOGS_H_
#define MATERIALIZER_SERVER_SERVICE_LIBRARY_LOGS_H_

// The libraries' own log lines through the server's logger
// (server/common/log.h): gRPC's (gpr_log: a failed TLS handshake, a
// certificate provider that cannot read its files, ...) and abseil's
// internal ones, so that they take the server's format (in JSON mode every
// stderr line parses) and its --log_level. gRPC still drops lines below its
// own verbosity first (GRPC_VERBOSITY, default ERROR).
//
//   log::SetFormat(log::Format::kJson);
//   RouteLibraryLogs();
//
// Process-wide; call once, before the server starts.

namespace materializer::service {

void RouteLibraryLogs();

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_LIBRARY_LOGS_H_
