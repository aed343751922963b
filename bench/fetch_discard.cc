// Fetches a handle and discards the bytes (checking the digest), so
// bench/fetch_throughput.py can time the transport without a file write.
//
//   fetch_discard --server=HOST:PORT --handle=h-... [--client=NAME]
//                 [--format=safetensors]
//                 [--chunk_bytes=N]   (default: as matctl fetch, 2 MiB)

#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "client/receive_memory.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, handle, "", "handle to fetch");
ABSL_FLAG(std::string, client, "", "identity (development mode)");
ABSL_FLAG(std::string, format, "safetensors", "safetensors, torch or raw");
ABSL_FLAG(uint32_t, chunk_bytes, materializer::client::kFetchChunkBytes,
          "chunk size (0: the server's maximum; default: matctl's)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As matctl does.
  materializer::client::KeepReceiveBuffers();
  materializer::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.session = false;
  options.client_name = absl::GetFlag(FLAGS_client);
  auto client = materializer::client::Client::Connect(options);
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  materializer::v1::FetchRequest request;
  request.set_handle(absl::GetFlag(FLAGS_handle));
  request.set_chunk_bytes(absl::GetFlag(FLAGS_chunk_bytes));
  const std::string format = absl::GetFlag(FLAGS_format);
  request.set_format(format == "torch" ? materializer::v1::WEIGHT_FORMAT_TORCH
                     : format == "raw" ? materializer::v1::WEIGHT_FORMAT_RAW
                                       : materializer::v1::WEIGHT_FORMAT_SAFETENSORS);
  uint64_t received = 0;
  const auto start = std::chrono::steady_clock::now();
  auto result = (*client)->Fetch(
      request, [&](const materializer::client::FetchedChunk& chunk) {
        received += chunk.data_size();
        return absl::OkStatus();
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!result.ok()) {
    std::cerr << result.status() << "\n";
    return 1;
  }
  std::printf("%llu bytes in %.3f s, %.3f GB/s, digest %s%s\n",
              static_cast<unsigned long long>(received), seconds,
              received / seconds / 1e9, result->digest.c_str(),
              result->verified ? " (verified)" : "");
  return 0;
}
