#ifndef MATERIALIZER_SERVER_REGISTRY_HANDLE_ID_H_
#define MATERIALIZER_SERVER_REGISTRY_HANDLE_ID_H_

// Handle ids, and the replica each one names.
//
// A handle id is "h-" and 32 hex digits (128 bits from the kernel's CSPRNG,
// so ids cannot be guessed). A server that is one of several replicas
// appends "@" and its replica name: "h-<32 hex>@materializer-1". Clients
// send every call naming the handle to that replica; an id without "@"
// comes from a single server and is served as before. Export ids end with
// their handle's id ("x-<32 hex>-h-<32 hex>@materializer-1"), so the
// replica is the text after the last "@" for both.
//
//   std::string id = NewHandleId("materializer-1");
//   ReplicaOfId(id) == "materializer-1"
//
// The client library (client/routing.h) parses ids with the same functions.

#include <string>

#include "absl/strings/string_view.h"

namespace materializer::registry {

inline constexpr char kReplicaSeparator = '@';

// A fresh id: "h-<32 hex>", then "@<replica>" when `replica` is not empty.
// REQUIRES: ReplicaNameProblem(replica) is "" (checked when the server
// starts).
std::string NewHandleId(absl::string_view replica = "");

// The replica a handle or export id names: the text after its last "@", or
// "" for an id without one. Never fails: an id that is not well formed
// names whatever follows its "@", and the server's NOT_FOUND answers it.
absl::string_view ReplicaOfId(absl::string_view id);

// Why `name` cannot be a replica name, or "" if it can. Replica names are
// DNS labels (RFC 1123): 1 to 63 of [a-z0-9-], starting and ending with a
// letter or digit. They travel in every handle id, so they stay short and
// need no quoting in shells, URLs or file names.
std::string ReplicaNameProblem(absl::string_view name);

}  // namespace materializer::registry

#endif  // MATERIALIZER_SERVER_REGISTRY_HANDLE_ID_H_
