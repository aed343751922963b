// Every matctl flag, once: its type, value name, help, default and
// environment variable. command_table.cc says which commands take which.

#include <cstdint>
#include <limits>
#include <vector>

#include "client/cli/command.h"

namespace materializer::client::cli {

const std::vector<FlagSpec>& FlagTable() {
  static const auto* table = new std::vector<FlagSpec>{
      // Connection and identity (global).
      {"server", FlagType::kString, "HOST:PORT[,...]",
       "the server; several addresses, or a name with several (a headless "
       "Service), are replicas",
       "127.0.0.1:50051", "MATERIALIZER_SERVER"},
      {"tls", FlagType::kBool, "",
       "use TLS, trusting the system's root certificates", "",
       "MATERIALIZER_TLS"},
      {"tls_ca", FlagType::kString, "FILE",
       "TLS: CA bundle (PEM) the server's certificate must chain to", "",
       "MATERIALIZER_TLS_CA"},
      {"tls_cert", FlagType::kString, "FILE",
       "mTLS: the client certificate (PEM), the identity; with --tls_key", "",
       "MATERIALIZER_TLS_CERT"},
      {"tls_key", FlagType::kString, "FILE", "mTLS: the client's private key",
       "", "MATERIALIZER_TLS_KEY"},
      {"tls_server_name", FlagType::kString, "NAME",
       "TLS: the name the server's certificate carries, when it is not the "
       "host in --server",
       "", "MATERIALIZER_TLS_SERVER_NAME"},
      {"token_file", FlagType::kString, "FILE",
       "a file holding a bearer token (TLS only; never printed); or "
       "MATERIALIZER_TOKEN holds the token itself",
       "", "MATERIALIZER_TOKEN_FILE"},
      {"client", FlagType::kString, "NAME",
       "your name in the server's development mode (no TLS)", "",
       "MATERIALIZER_CLIENT"},
      // Output and deadlines (global).
      {"output",
       FlagType::kChoice,
       "table|json",
       "json: the response in the proto3 JSON mapping (64-bit integers as "
       "strings)",
       "table",
       "",
       {"table", "json"}},
      {"timeout", FlagType::kDuration, "DURATION",
       "deadline of each call except a fetch, e.g. 30s, 1h", "10m"},
      {"verbose", FlagType::kBool, "",
       "print the connection settings to stderr (tokens never)"},
      // Commands' own flags.
      {"all", FlagType::kBool, "", "list every tensor, not the first 20"},
      {"async", FlagType::kBool, "",
       "return once the memory is reserved (poll describe for READY)"},
      {"label", FlagType::kString, "TEXT", "a free-text label for the handle"},
      {"checkpoint", FlagType::kString, "ROOT/PATH",
       "fill the tensors a checkpoint under the server's --checkpoint_roots "
       "holds from it (the others from their inits)"},
      {"digest", FlagType::kBool, "",
       "also each file's XXH3-128 (reads every byte)"},
      {"ttl", FlagType::kDuration, "DURATION",
       "lease of the handle: released when unused this long", "server's, 1h"},
      {"force", FlagType::kBool, "", "release even while exported"},
      {"o", FlagType::kString, "OUT", "the file to write (required)"},
      {"format",
       FlagType::kChoice,
       "safetensors|torch|raw",
       "file format",
       "safetensors",
       "",
       {"safetensors", "torch", "raw"}},
      {"include", FlagType::kList, "GLOBS",
       "write only tensors matching one of these globs (comma-separated)"},
      {"exclude", FlagType::kList, "GLOBS",
       "leave out tensors matching any of these globs (comma-separated)"},
      {"resume", FlagType::kBool, "",
       "continue from OUT.partial (its bytes are hashed again, not trusted)"},
      {"include_non_persistent", FlagType::kBool, "",
       "also write non-persistent buffers"},
      {"write_ties_once", FlagType::kBool, "",
       "safetensors: write each group of tied tensors once"},
      {"chunk_bytes",
       FlagType::kBytes,
       "N",
       "largest chunk (0: the server's maximum, 4 MiB minus 4 KiB)",
       "2MiB",
       "",
       {},
       std::numeric_limits<uint32_t>::max()},
      {"fetch_timeout", FlagType::kDuration, "DURATION",
       "deadline of the whole fetch", "none"},
      {"importer_device_uuid", FlagType::kString, "GPU-...",
       "the importer's CUDA device, checked by the server"},
  };
  return *table;
}

const std::vector<const char*>& GlobalFlags() {
  static const auto* flags = new std::vector<const char*>{
      "server",          "tls",        "tls_ca", "tls_cert", "tls_key",
      "tls_server_name", "token_file", "client", "output",   "timeout",
      "verbose"};
  return *flags;
}

}  // namespace materializer::client::cli
