#ifndef MATERIALIZER_CLIENT_CLIENT_H_
#define MATERIALIZER_CLIENT_CLIENT_H_

// A C++ client of the Materializer API (proto/materializer/v1): one method
// per RPC with absl::Status errors, a checked streaming fetch that verifies
// the file's digest, and FetchToFile, which writes a handle's weights to a
// file (safetensors, torch or raw) atomically and can resume an
// interrupted transfer.
//
//   ClientOptions options;
//   options.target = "127.0.0.1:50051";
//   options.client_name = "alice";
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
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "materializer/v1/materializer.grpc.pb.h"
#include "materializer/v1/materializer.pb.h"
#include "client/session.h"
#include "server/delivery/digest.h"

namespace materializer::client {

// The call metadata key that carries the caller's identity while the server
// runs in its insecure loopback development mode. Without it the server
// treats the caller as "anonymous".
inline constexpr char kClientMetadataKey[] = "x-materializer-client";

struct ClientOptions {
  // host:port, or any gRPC target ("unix:/path", "dns:///host:port").
  std::string target = "127.0.0.1:50051";
  // Sent as kClientMetadataKey when non-empty. Printable ASCII only, since
  // it travels as an HTTP/2 header value.
  std::string client_name;
  // Deadline of each unary call, measured from its start.
  absl::Duration timeout = absl::Minutes(10);
  // Deadline of a whole FetchWeights stream. None by default: a fetch takes
  // as long as its size needs, and a dead peer is detected by the transport.
  absl::Duration fetch_timeout = absl::InfiniteDuration();
  // Largest message sent or received. Must exceed the largest fetch chunk
  // (4 MiB - 4 KiB) and the largest Plan/Describe response the caller expects:
  // a plan of a million tensors runs to hundreds of MiB.
  int max_message_bytes = 256 << 20;  // the server's default too
  // Keep a session (an Attach stream) for the client's lifetime and bind
  // every handle this client materializes to it: the handles live as long
  // as the client, and the server frees them (after its grace period) when
  // the client goes away, however it goes away. Off: handles are detached
  // and live by their lease (MaterializeRequest.ttl), as matctl's are.
  bool session = true;
  // Keepalive pings on an idle connection (the server accepts one every
  // 5 s or more), so either side notices a dead peer.
  absl::Duration keepalive = absl::Seconds(10);
};

// The one place that maps a gRPC status to an absl::Status: same code, same
// message.
absl::Status FromGrpcStatus(const grpc::Status& status);

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

// A connection to one materializer server.
//
// Thread-safe: every method may be called from several threads at once
// (gRPC channels and stubs are thread-safe, and the client holds no other
// mutable state). Calls are blocking.
class Client {
 public:
  // Validates `options` (INVALID_ARGUMENT) and creates the channel. Does not
  // wait for the server: a server that is down shows up as UNAVAILABLE from
  // the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<v1::PlanResponse> Plan(const v1::PlanRequest& request);
  absl::StatusOr<v1::MaterializeResponse> Materialize(
      const v1::MaterializeRequest& request);
  absl::StatusOr<v1::HandleInfo> Describe(absl::string_view handle);
  // `force` releases an exported handle too (ReleaseRequest.force).
  absl::StatusOr<v1::ReleaseResponse> Release(absl::string_view handle,
                                              bool force = false);
  absl::StatusOr<v1::ListHandlesResponse> ListHandles();
  // Renews a detached handle's lease.
  absl::StatusOr<v1::RenewResponse> Renew(absl::string_view handle);
  absl::StatusOr<v1::GetStatsResponse> GetStats();
  // The layout a FetchWeights with `request` would stream.
  absl::StatusOr<v1::FileLayout> DescribeFile(const v1::FetchRequest& request);
  // Zero-copy export for a co-located process (export_import.h maps it).
  absl::StatusOr<v1::ExportResponse> ExportHandle(
      absl::string_view handle, absl::string_view importer_device_uuid = "");
  absl::StatusOr<v1::CloseExportResponse> CloseExport(
      absl::string_view export_id);

  // The server's overall serving status from grpc.health.v1.Health/Check
  // (service ""), by name: "SERVING", "NOT_SERVING", ...
  absl::StatusOr<std::string> Health();

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
      const std::function<absl::Status(const v1::WeightChunk&)>& on_chunk,
      delivery::Hasher* prefix = nullptr);

  const ClientOptions& options() const { return options_; }

  // The session handles are bound to (ClientOptions::session), once
  // attached; the attach error otherwise.
  absl::StatusOr<std::string> SessionId(
      absl::Duration timeout = absl::Seconds(30));

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Applies the deadline and the identity metadata to a fresh context.
  void PrepareContext(grpc::ClientContext* context,
                      absl::Duration timeout) const;
  void PrepareContext(grpc::ClientContext* context) const {
    PrepareContext(context, options_.timeout);
  }

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Materializer::Stub> stub_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  // Declared last, destroyed first: ends the session while the stub lives.
  std::unique_ptr<SessionKeeper> session_;
};

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
  uint32_t chunk_bytes = 0;
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
