// materializerd: parses flags, starts the server, waits for SIGINT/SIGTERM
// (shutdown) and SIGHUP (credential reload).

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/log.h"
#include "server/common/units.h"
#include "server/service/library_logs.h"
#include "server/service/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve on; port 0 picks a free port (the bound "
          "address is printed on stdout)");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a second, plaintext port that serves only the gRPC "
          "health service (grpc.health.v1), for probes that cannot do TLS; "
          "empty = none");
ABSL_FLAG(std::string, devices, "auto",
          "pool devices: auto (every CUDA device, else the CPU), or a comma "
          "list such as cpu or cuda:0,cuda:2");
ABSL_FLAG(std::string, cpu_capacity, "75%",
          "bytes the CPU device may hand out: a size (16GiB) or a share of "
          "host memory (75%)");
ABSL_FLAG(std::string, cuda_reserve, "1GiB",
          "per CUDA device, memory kept out of the pool");
ABSL_FLAG(std::string, quota_file, "",
          "per-client quotas, JSON (see docs/operations.md); clients it does "
          "not list get its \"default\" entry");
ABSL_FLAG(std::string, default_quota_bytes, "",
          "total bytes a client may hold when no quota file entry says "
          "otherwise (e.g. 64GiB); empty = no limit");
ABSL_FLAG(int, default_quota_handles, 0,
          "handles a client may hold by default; 0 = no limit");
ABSL_FLAG(std::string, max_message_size, "256MiB",
          "largest request/response message");
ABSL_FLAG(int, workers, 0,
          "threads for request work; 0 = one per hardware thread, at least "
          "4");
ABSL_FLAG(int, client_workers, 0,
          "most workers one client's calls may hold at once; 0 = workers - 1");
ABSL_FLAG(int, client_queue, 256,
          "most calls of one client waiting for a worker; more are refused "
          "with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, log_format, "text",
          "text (one human-readable line per event) or json (one JSON object "
          "per line: time, level, source, and msg or event fields)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (GET /metrics); port 0 "
          "picks one (logged); empty = no metrics endpoint");
ABSL_FLAG(int, metrics_client_labels, 20,
          "per-client metrics name this many clients (those holding the most "
          "bytes); the rest are summed under client=\"(other)\"");
ABSL_FLAG(std::string, gpu_free_headroom, "256MiB",
          "CUDA admission: bytes of the driver's free memory left alone");
ABSL_FLAG(std::string, fake_gpu_driver, "",
          "testing only: a JSON file of GPU driver figures standing in for "
          "NVML, keyed by pool device name (see docs/operations.md)");
ABSL_FLAG(bool, allow_insecure_remote, false,
          "serve the development mode (client identity from unauthenticated "
          "metadata) on a non-loopback address (trusted networks only)");
ABSL_FLAG(std::string, tls_cert, "", "TLS certificate chain (PEM)");
ABSL_FLAG(std::string, tls_key, "", "TLS private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: CA bundle client certificates must chain to (PEM)");
ABSL_FLAG(std::string, token_file, "",
          "bearer tokens, one \"<token> <client name>\" per line (needs TLS)");
ABSL_FLAG(absl::Duration, credential_check_interval, absl::Seconds(1),
          "how often the token file, TLS certificate, key and client CA are "
          "checked for changes, which are then put in force without a "
          "restart (SIGHUP does it at once); 0 = on SIGHUP only");
ABSL_FLAG(std::string, admin_clients, "",
          "comma-separated identities that see every client in GetStats");
ABSL_FLAG(absl::Duration, session_grace, absl::Seconds(5),
          "how long a session outlives its Attach stream before its handles "
          "are released (0 = at once)");
ABSL_FLAG(std::string, advertise, "",
          "scale-out: host:port at which clients reach this replica, e.g. "
          "$(POD_NAME).materializer.ml.svc.cluster.local:50051 (reported by "
          "GetServerInfo; names the replica unless --replica does)");
ABSL_FLAG(std::string, replica, "",
          "scale-out: this replica's name, carried by every handle id it "
          "issues (a DNS label); default: the first label of --advertise's "
          "host, or of the host name when that is an IP address");
ABSL_FLAG(absl::Duration, default_ttl, absl::Hours(1),
          "lease of handles created outside a session when the request "
          "sets no ttl");
ABSL_FLAG(std::string, checkpoint_roots, "",
          "folders whose checkpoints requests may name, NAME=PATH,... (a "
          "bare PATH is named after its last component); a request's "
          "checkpoint.path is NAME/relative/path (docs/checkpoints.md)");
ABSL_FLAG(std::string, checkpoint_readers, "",
          "which identities may read which root, NAME=ID|ID;NAME=*;...; "
          "empty: every identity, every root");
ABSL_FLAG(std::string, checkpoint_cache_bytes, "2GiB",
          "checkpoint bytes kept after a load (least recently used go "
          "first), so the ranks and jobs of a node read a file once; not "
          "charged to any client's quota; 0 keeps none");

ABSL_FLAG(std::string, shm_pool_bytes, "auto",
          "shared memory kept resident while the server is idle, so that "
          "an exportable CPU arena (a co-located trainer's) does not wait "
          "for fresh pages: auto (as much as the largest burst of exports "
          "asked for, up to half of the smaller of /dev/shm and RAM), "
          "a fixed size, or 0 (none); always within the CPU capacity no "
          "client holds, and charged to no client (docs/operations.md)");
ABSL_FLAG(std::string, shm_dir, "/dev/shm",
          "tmpfs directory for the files of exportable CPU arenas (a "
          "co-located trainer maps them); one mounted with "
          "huge=within_size makes fresh pages several times cheaper "
          "(docs/operations.md)");
ABSL_FLAG(absl::Duration, shm_pool_quiet, absl::Seconds(1),
          "how long after the last Materialize the shared-memory pool may "
          "start refilling");
ABSL_FLAG(absl::Duration, shm_pool_release_after, absl::Minutes(15),
          "an adaptive shared-memory pool (--shm_pool_bytes=auto) unused "
          "for this long frees all it holds");

namespace {

// Words of `text` in lines of at most `width` characters, each starting
// with `indent`.
std::string Wrap(absl::string_view text, absl::string_view indent,
                 size_t width) {
  std::string out;
  std::string line(indent);
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > indent.size() && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, line, "\n");
      line = std::string(indent);
    }
    absl::StrAppend(&line, line.size() > indent.size() ? " " : "", word);
  }
  absl::StrAppend(&out, line, "\n");
  return out;
}

// --help: the usage and this file's flags, on stdout. (absl's own --help
// exits with status 1.)
void PrintHelp() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "server/main.cc")) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::cout << absl::ProgramUsageMessage() << "\n\nFlags "
            << "(docs/operations.md explains them):\n";
  for (const absl::CommandLineFlag* flag : flags) {
    std::cout << "  --" << flag->Name() << " (default: \""
              << flag->DefaultValue() << "\")\n"
              << Wrap(flag->Help(), "      ", 78);
  }
}

bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Materializes PyTorch meta modules into initialized weights over gRPC.\n"
      "Usage: materializerd [--listen=127.0.0.1:50051] [--devices=auto] ...");
  if (AsksForHelp(argc, argv)) {
    PrintHelp();
    return 0;
  }
  // --help lists the flags of this file (absl's default looks for a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  materializer::log::Level level;
  if (!materializer::log::ParseLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::cerr << "materializerd: --log_level must be debug, info, warning or "
                 "error\n";
    return 2;
  }
  materializer::log::SetMinLevel(level);
  materializer::log::Format format;
  if (!materializer::log::ParseFormat(absl::GetFlag(FLAGS_log_format),
                                      &format)) {
    std::cerr << "materializerd: --log_format must be text or json\n";
    return 2;
  }
  materializer::log::SetFormat(format);
  // From here on every stderr line has this format, gRPC's included.
  materializer::service::RouteLibraryLogs();

  materializer::service::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.pool.devices = absl::GetFlag(FLAGS_devices);
  options.pool.cpu_capacity = absl::GetFlag(FLAGS_cpu_capacity);
  options.pool.cuda_reserve = absl::GetFlag(FLAGS_cuda_reserve);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.client_workers = absl::GetFlag(FLAGS_client_workers);
  options.client_queue = absl::GetFlag(FLAGS_client_queue);
  options.quota_file = absl::GetFlag(FLAGS_quota_file);
  options.default_quota_bytes = absl::GetFlag(FLAGS_default_quota_bytes);
  options.default_quota_handles = absl::GetFlag(FLAGS_default_quota_handles);
  options.allow_insecure_remote = absl::GetFlag(FLAGS_allow_insecure_remote);
  options.auth.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.auth.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.auth.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth.token_file = absl::GetFlag(FLAGS_token_file);
  options.credential_check_interval =
      absl::GetFlag(FLAGS_credential_check_interval);
  options.auth.admin_clients =
      absl::StrSplit(absl::GetFlag(FLAGS_admin_clients), ',',
                     absl::SkipWhitespace());
  options.session_grace = absl::GetFlag(FLAGS_session_grace);
  options.default_ttl = absl::GetFlag(FLAGS_default_ttl);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics_client_labels = absl::GetFlag(FLAGS_metrics_client_labels);
  options.gpu_free_headroom = absl::GetFlag(FLAGS_gpu_free_headroom);
  options.fake_gpu_driver_file = absl::GetFlag(FLAGS_fake_gpu_driver);
  options.checkpoint_roots = absl::GetFlag(FLAGS_checkpoint_roots);
  options.checkpoint_readers = absl::GetFlag(FLAGS_checkpoint_readers);
  options.checkpoint_cache_bytes = absl::GetFlag(FLAGS_checkpoint_cache_bytes);
  options.shm_pool_bytes = absl::GetFlag(FLAGS_shm_pool_bytes);
  options.shm_pool_quiet = absl::GetFlag(FLAGS_shm_pool_quiet);
  options.shm_pool_release_after =
      absl::GetFlag(FLAGS_shm_pool_release_after);
  options.shm_dir = absl::GetFlag(FLAGS_shm_dir);
  if (options.metrics_client_labels < 0) {
    std::cerr << "materializerd: --metrics_client_labels must be >= 0\n";
    return 2;
  }
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.replica = absl::GetFlag(FLAGS_replica);
  if (options.session_grace < absl::ZeroDuration() ||
      options.default_ttl <= absl::ZeroDuration() ||
      options.credential_check_interval < absl::ZeroDuration()) {
    std::cerr << "materializerd: --session_grace and "
                 "--credential_check_interval must be >= 0 and "
                 "--default_ttl > 0\n";
    return 2;
  }
  absl::StatusOr<uint64_t> max_message =
      materializer::ParseBytes(absl::GetFlag(FLAGS_max_message_size));
  if (!max_message.ok() || *max_message == 0 || *max_message > (1u << 31) - 1) {
    std::cerr << "materializerd: --max_message_size must be a size between 1 "
                 "byte and 2GiB-1\n";
    return 2;
  }
  options.max_message_bytes = static_cast<int>(*max_message);

  // Signals are taken by a dedicated thread with sigwait, so shutdown and
  // reloads run as ordinary code rather than inside a signal handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<materializer::service::Server>> server =
      materializer::service::Server::Start(options);
  if (!server.ok()) {
    // Through the logger: in JSON mode this line parses too.
    MLOG(ERROR) << "materializerd: " << server.status();
    return 1;
  }
  std::cout << "materializerd listening on " << (*server)->address()
            << std::endl;

  std::thread signal_thread([&signals, &server] {
    while (true) {
      int signal = 0;
      sigwait(&signals, &signal);
      if (signal == SIGHUP) {
        MLOG(INFO) << "SIGHUP: reloading the credential files";
        (*server)->ReloadCredentials().IgnoreError();  // each one is logged
        continue;
      }
      MLOG(INFO) << "signal " << signal << ": shutting down";
      (*server)->Shutdown(absl::Seconds(10));
      return;
    }
  });
  (*server)->Wait();
  // Wake the signal thread if shutdown came from elsewhere.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  return 0;
}
