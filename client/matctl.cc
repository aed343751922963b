// matctl: the command-line client of the materializer service. The
// commands, flags, usage and exit statuses live in client/cli/; this file
// only hands it the process's arguments, environment and streams (and sets
// the allocator up for fetches that stream gigabytes: receive_memory.h).
//
//   matctl plan examples/gpt2-small.json
//   matctl --tls_ca=ca.pem --token_file=token materialize model.json
//   matctl --server=pod-0:50051,pod-1:50051 ls
//   matctl fetch h-0123...@pod-1 -o gpt2.safetensors --resume

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/matctl_main.h"
#include "client/receive_memory.h"

int main(int argc, char** argv) {
  materializer::client::KeepReceiveBuffers();
  std::vector<std::string> args(argv + 1, argv + argc);
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
  return materializer::client::cli::MatctlMain(args, env, std::cout, std::cerr);
}
