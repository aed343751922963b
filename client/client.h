#ifndef MATERIALIZER_CLIENT_CLIENT_H_
#define MATERIALIZER_CLIENT_CLIENT_H_

// A C++ client of the Materializer API (proto/materializer/v1): one method
// per RPC with absl::Status errors, a checked streaming fetch that verifies
// the file's digest, and FetchToFile, which writes a handle's weights to a
// file (safetensors, torch or raw) atomically and can resume an
// interrupted transfer.
//
// It speaks every identity mode of the server (credentials.h: TLS, mTLS,
// bearer tokens, or the development mode), and talks to one server or to
// several replicas: given a target with several addresses (a headless
// Service's DNS name, or "host:port,host:port"), it sends Materialize to
// the replica with the most free memory and every call naming a handle to
// the replica the handle's id names (replica_set.h, docs/api.md "Several
// replicas").
//
//   ClientOptions options;
//   options.target = "materializer.ml.svc.cluster.local:50051";
//   options.security.tls_ca_file = "ca.pem";
//   ASSIGN_OR_RETURN(options.security.token, ReadTokenFile("token"));
//   ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
//   ASSIGN_OR_RETURN(v1::MaterializeResponse made,
//                    client->Materialize(request));
//   RETURN_IF_ERROR(FetchToFile(*client, made.handle(), "gpt2.safetensors",
//                               FetchFileOptions{}));
//   RETURN_IF_ERROR(client->Release(made.handle()).status());

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/credentials.h"
#include "client/grpc_status.h"
#include "client/replica_set.h"
#include "grpcpp/client_context.h"
#include "materializer/v1/materializer.grpc.pb.h"
#include "client/fetched_chunk.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/digest.h"

namespace materializer::client {

// The call metadata key that carries the caller's identity while the server
// runs in its insecure loopback development mode. Without it the server
// treats the caller as "anonymous".
inline constexpr char kClientMetadataKey[] = "x-materializer-client";

struct ClientOptions {
  // host:port; a comma-separated list of host:port (replicas); or any gRPC
  // target ("unix:/path", "dns:///host:port"), taken as one server. A host
  // name with several addresses is a set of replicas (targets.h).
  std::string target = "127.0.0.1:50051";
  // TLS, client certificate, bearer token (credentials.h). Default: none,
  // the server's development mode.
  Security security;
  // Sent as kClientMetadataKey when non-empty (the development mode's
  // identity; a TLS server ignores it). Printable ASCII only, since it
  // travels as an HTTP/2 header value.
  std::string client_name;
  // Deadline of each unary call, measured from its start.
  absl::Duration timeout = absl::Minutes(10);
  // Deadline of a whole FetchWeights stream. None by default: a fetch takes
  // as long as its size needs, and a dead peer is detected by the transport.
  absl::Duration fetch_timeout = absl::InfiniteDuration();
  // Deadline of each GetServerInfo that finds the replicas (several
  // addresses only): a replica that does not answer within it is reported
  // as not answering.
  absl::Duration discovery_timeout = absl::Seconds(5);
  // Largest message sent or received. Must exceed the largest fetch chunk
  // (4 MiB - 4 KiB) and the largest Plan/Describe response the caller expects:
  // a plan of a million tensors runs to hundreds of MiB.
  int max_message_bytes = 256 << 20;  // the server's default too
  // Keep a session (an Attach stream) on each server this client
  // materializes on, for the client's lifetime, and bind every handle it
  // materializes to it: the handles live as long as the client, and the
  // server frees them (after its grace period) when the client goes away,
  // however it goes away. Off: handles are detached and live by their lease
  // (MaterializeRequest.ttl), as matctl's are.
  bool session = true;
  // Keepalive pings on an idle connection (the server accepts one every
  // 5 s or more), so either side notices a dead peer.
  absl::Duration keepalive = absl::Seconds(10);
};

// What a fetch delivered.
struct FetchResult {
  // Size of the whole file (WeightChunk.total_bytes).
  uint64_t total_bytes = 0;
  // The whole file's digest as the server sent it ("xxh3-128:<hex>").
  std::string digest;
  // True when the client hashed every byte of the file and found the same
  // digest (always, unless a fetch from an offset > 0 came without the
  // prefix's hasher).
  bool verified = false;
};

// One server's answer to a call made on every server.
template <typename T>
struct FromReplica {
  // The replica's name ("" for a single server or an unnamed replica) and
  // the address it was reached at (or that did not answer).
  std::string replica;
  std::string address;
  absl::StatusOr<T> result;
};

// ListHandles over every replica.
struct HandleList {
  // The handles of every replica that answered, oldest first.
  v1::ListHandlesResponse handles;
  // The replicas (or addresses) that did not answer, with why.
  std::vector<FromReplica<v1::ListHandlesResponse>> failed;
};

// A connection to one materializer server, or to a set of replicas.
//
// Thread-safe: every method may be called from several threads at once
// (gRPC channels and stubs are thread-safe, and the replica set guards its
// own state). Calls are blocking.
class Client {
 public:
  // Validates `options` (INVALID_ARGUMENT; a token without TLS is one) and
  // reads the TLS files (credentials.h). Does not wait for the server: a
  // server that is down shows up as UNAVAILABLE from the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Both go to the server or replica with the most room for
  // request.placement().
  absl::StatusOr<v1::PlanResponse> Plan(const v1::PlanRequest& request);
  absl::StatusOr<v1::MaterializeResponse> Materialize(
      const v1::MaterializeRequest& request);
  // Calls naming a handle or export go to the replica its id names. When
  // that replica has gone: NOT_FOUND if every other replica answered
  // discovery, UNAVAILABLE if it may just be unreachable; both name it.
  absl::StatusOr<v1::HandleInfo> Describe(absl::string_view handle);
  // A checkpoint under the server's roots (the replica Plan would use).
  absl::StatusOr<v1::CheckpointContents> InspectCheckpoint(
      const v1::InspectCheckpointRequest& request);
  // `force` releases an exported handle too (ReleaseRequest.force).
  absl::StatusOr<v1::ReleaseResponse> Release(absl::string_view handle,
                                              bool force = false);
  // Renews a detached handle's lease.
  absl::StatusOr<v1::RenewResponse> Renew(absl::string_view handle);
  // The layout a FetchWeights with `request` would stream.
  absl::StatusOr<v1::FileLayout> DescribeFile(const v1::FetchRequest& request);
  // Zero-copy export for a co-located process (export_import.h maps it).
  absl::StatusOr<v1::ExportResponse> ExportHandle(
      absl::string_view handle, absl::string_view importer_device_uuid = "");
  absl::StatusOr<v1::CloseExportResponse> CloseExport(
      absl::string_view export_id);

  // The caller's handles on every replica, merged. Fails only when no
  // replica answers; the others' failures are in HandleList::failed.
  absl::StatusOr<HandleList> ListHandles();
  // GetStats of each replica (one entry for a single server).
  absl::StatusOr<std::vector<FromReplica<v1::GetStatsResponse>>> GetStats();
  // Each replica's overall serving status from grpc.health.v1.Health/Check
  // (service ""), by name: "SERVING", "NOT_SERVING", ...
  absl::StatusOr<std::vector<FromReplica<std::string>>> Health();
  // GetServerInfo at every address of the target (the replicas, their
  // advertised addresses and free memory), in target order.
  absl::StatusOr<std::vector<FromReplica<v1::ServerInfo>>> Replicas();

  // Streams the file of `request.handle()` from `request.offset()` and calls
  // `on_chunk` for each chunk, in order, on the calling thread. The bytes
  // delivered are total_bytes minus request.offset().
  //
  // Every chunk is checked before `on_chunk` sees it: the first starts at
  // request.offset(), each next one where the previous ended, total_bytes
  // never changes and no chunk runs past it; and the stream must end
  // exactly at total_bytes with the file's digest. A violation cancels the
  // call and is DATA_LOSS. If `on_chunk` returns an error, the call is
  // cancelled and that error is returned unchanged.
  //
  // The digest is verified (DATA_LOSS on a mismatch, after on_chunk has
  // seen every chunk) when the fetch starts at 0, or when `prefix` holds
  // the digest state of file bytes [0, request.offset()) (a resume; see
  // FetchToFile). `prefix` is consumed.
  absl::StatusOr<FetchResult> Fetch(
      const v1::FetchRequest& request,
      const std::function<absl::Status(const FetchedChunk&)>& on_chunk,
      delivery::Hasher* prefix = nullptr);

  const ClientOptions& options() const { return options_; }

  // The session handles are bound to (ClientOptions::session) on a single
  // server, once attached; the attach error otherwise. With several
  // replicas sessions are per replica: FAILED_PRECONDITION, use
  // SessionIdOf.
  absl::StatusOr<std::string> SessionId(
      absl::Duration timeout = absl::Seconds(30));
  // The session on the replica that holds `handle`.
  absl::StatusOr<std::string> SessionIdOf(
      absl::string_view handle, absl::Duration timeout = absl::Seconds(30));

 private:
  explicit Client(ClientOptions options);

  // Applies the deadline and the identity metadata to a fresh context.
  void PrepareContext(grpc::ClientContext* context,
                      absl::Duration timeout) const;
  void PrepareContext(grpc::ClientContext* context) const {
    PrepareContext(context, options_.timeout);
  }

  // Runs a unary `rpc(stub, context, response)` on the replica `id` names
  // (each replica in turn for an id that names none, until one knows it).
  template <typename Response, typename Rpc>
  absl::StatusOr<Response> CallFor(absl::string_view id, const Rpc& rpc);
  // Runs `rpc` on `replica` once; errors explained by the replica set.
  template <typename Response, typename Rpc>
  absl::StatusOr<Response> CallOn(Replica& replica, const Rpc& rpc);

  // Runs `call(replica)` on every replica found now, in parallel.
  template <typename T, typename Call>
  absl::StatusOr<std::vector<FromReplica<T>>> OnEveryReplica(const Call& call);

  absl::StatusOr<FetchResult> FetchFrom(
      Replica& replica, const v1::FetchRequest& request,
      const std::function<absl::Status(const FetchedChunk&)>& on_chunk,
      delivery::Hasher* prefix, bool* received);

  const ClientOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::unique_ptr<ReplicaSet> replicas_;
};

// The chunk size the C++ client asks for unless told otherwise, chosen by
// measurement: a 4 GiB fetch over loopback into this client took 0.92-1.01 s
// in 2 MiB messages against 1.17-1.20 s in the server's maximum (4 MiB
// minus 4 KiB), medians of interleaved runs on a 2-core VM; 1.12 s against
// 1.30 s with its digest check turned off, so the hashing is not why. grpcio (the Python
// client) is the other way round, so the server's default stays at its
// maximum (bench/RESULTS.md, "Fetch throughput").
inline constexpr uint32_t kFetchChunkBytes = 2 << 20;

struct FetchFileOptions {
  // Continue from the bytes already in `path + ".partial"` instead of
  // starting over (the file layout is deterministic, so the bytes on disk
  // are a prefix of the file being fetched; they are hashed again, never
  // trusted, and the final digest covers them).
  bool resume = false;
  // FetchRequest.format, .include_non_persistent, .write_ties_once,
  // .include, .exclude.
  v1::WeightFormat format = v1::WEIGHT_FORMAT_SAFETENSORS;
  bool include_non_persistent = false;
  bool write_ties_once = false;
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  // FetchRequest.chunk_bytes: 0 lets the server choose (its maximum).
  uint32_t chunk_bytes = kFetchChunkBytes;
  // Called on the fetching thread with the number of bytes of the file now
  // on disk and the file's total size: once with the starting offset when
  // the first chunk arrives (so a caller can tell resumed bytes from
  // transferred ones), then after every chunk is written.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Fetches `handle` into `path` (safetensors unless options.format says
// otherwise). Writes to `path + ".partial"` and, once every byte is there,
// checks its size against total_bytes and its digest against the server's,
// fsyncs it and renames it to `path` (replacing any file there), so `path`
// never holds a truncated or corrupted file. On a transfer failure the
// .partial file stays for a later `resume`; without `resume` an existing
// .partial file is truncated first. On a digest mismatch (DATA_LOSS) the
// .partial file is removed: some byte of it is wrong, so resuming from it
// cannot succeed.
absl::StatusOr<FetchResult> FetchToFile(Client& client,
                                        const std::string& handle,
                                        const std::string& path,
                                        const FetchFileOptions& options);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_CLIENT_H_
