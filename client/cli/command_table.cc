// Every matctl command, once: its arguments, what it does, its own flags
// and the function that runs it. Usage and flag checks come from here.

#include <vector>

#include "client/cli/command.h"

namespace materializer::client::cli {

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"plan",
       {"FILE.json"},
       "validate a model and show its memory plan",
       "Reads a PlanRequest (or MaterializeRequest) in the proto3 JSON "
       "mapping, and prints the bytes per tensor and dtype, the init each "
       "tensor gets, and which devices it fits on now. Allocates nothing. "
       "With several replicas, asks the one with the most room.",
       {"all"},
       RunPlan},
      {"materialize",
       {"FILE.json"},
       "materialize a model; prints its handle",
       "Reads a MaterializeRequest in the proto3 JSON mapping (--async, "
       "--label and --ttl override its fields) and prints the handle, its "
       "device, bytes and phase timings. The handle is detached: it lives "
       "until released or unused for its ttl. With several replicas it goes "
       "to the one with the most free memory on the requested device kind, "
       "and its id names that replica.",
       {"async", "label", "ttl", "checkpoint"},
       RunMaterialize},
      {"inspect",
       {"PATH"},
       "list a checkpoint's tensors (a path under the server's roots)",
       "The files and tensors (key, dtype, shape, bytes, file, offset) of "
       "the checkpoint at ROOT/relative/path as the server reads it for "
       "materialize --checkpoint, without reading the tensors' bytes; "
       "--digest adds each file's XXH3-128.",
       {"digest", "all"},
       RunInspect},
      {"session",
       {"FILE.json"},
       "materialize in a session and hold it until Ctrl-C or end of input",
       "Materializes FILE bound to a session (an Attach stream) and prints "
       "the handle; when matctl ends, however it ends, the server releases "
       "the handle after its grace period.",
       {"label"},
       RunSession},
      {"renew",
       {"HANDLE"},
       "renew a detached handle's lease",
       "Prints when the lease now expires.",
       {},
       RunRenew},
      {"describe",
       {"HANDLE"},
       "show a handle and its tensors",
       "State, owner, device, bytes, seed, digest and fingerprint, and each "
       "tensor's shape, dtype, device and init.",
       {"all"},
       RunDescribe},
      {"release",
       {"HANDLE"},
       "free a handle's memory",
       "Idempotent for the owner: a second release says the handle was "
       "already released. An exported handle needs --force.",
       {"force"},
       RunRelease},
      {"ls",
       {},
       "list your handles (on every replica)",
       "With several replicas, lists the handles of every replica that "
       "answers, warns about those that do not and then exits with the "
       "unavailable status.",
       {},
       RunList},
      {"stats",
       {},
       "memory per device and per client, quotas",
       "The ledger of each device, your own use per device (everyone's for "
       "an admin identity) and quotas; one section per replica.",
       {},
       RunStats},
      {"doctor",
       {},
       "per GPU: driver figures, this server's bytes, other processes",
       "For each CUDA device of each replica: total, used and free memory as "
       "the driver sees it, the bytes the server holds (its ledger, the "
       "process as the driver counts it, LibTorch's caching allocator), and "
       "every other process holding memory, flagging defunct (zombie) and "
       "gone processes whose memory the driver still counts. The process "
       "list is shown to admin identities only. On a server without a GPU it "
       "says so.",
       {},
       RunDoctor},
      {"health",
       {},
       "the serving status of the server (of every replica)",
       "Prints SERVING, or each replica's status; exits with the unavailable "
       "status unless every one is SERVING.",
       {},
       RunHealth},
      {"replicas",
       {},
       "the replicas behind --server and their free memory",
       "Asks GetServerInfo at every address of --server: each replica's "
       "name, advertised address and free bytes per device, and the "
       "addresses that did not answer (then exits with the unavailable "
       "status).",
       {},
       RunReplicas},
      {"fetch",
       {"HANDLE"},
       "write a handle's weights to a file and verify its digest",
       "Streams the file into OUT.partial, checks its size and XXH3-128 "
       "digest, fsyncs it and renames it to OUT, so OUT never holds a "
       "truncated or corrupted file. Draws progress on a terminal.",
       {"o", "format", "include", "exclude", "resume", "include_non_persistent",
        "write_ties_once", "chunk_bytes", "fetch_timeout"},
       RunFetch,
       {"o"}},
      {"export",
       {"HANDLE"},
       "zero-copy export for a co-located process",
       "Prints the shared-memory file (CPU) or CUDA IPC handle to map, and "
       "the export id to close it with.",
       {"importer_device_uuid"},
       RunExport},
      {"close-export",
       {"EXPORT_ID"},
       "end an export",
       "Prints how many exports of the handle remain.",
       {},
       RunCloseExport},
  };
  return *commands;
}

const Command* FindCommand(absl::string_view name) {
  for (const Command& command : Commands()) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

}  // namespace materializer::client::cli
