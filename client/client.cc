#include "client/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/session.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "server/common/status_macros.h"

namespace materializer::client {
namespace {

absl::Status ValidateOptions(const ClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("ClientOptions.target is empty");
  }
  for (const char c : options.client_name) {
    // Outside 0x20..0x7e gRPC would fail every call with an opaque INTERNAL
    // error, so refuse the name up front and say why.
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions.client_name \"", options.client_name,
                       "\" must be printable ASCII: it is sent as the ",
                       kClientMetadataKey, " header"));
    }
  }
  if (options.timeout <= absl::ZeroDuration() ||
      options.fetch_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.timeout and fetch_timeout must be positive, got ",
        absl::FormatDuration(options.timeout), " and ",
        absl::FormatDuration(options.fetch_timeout)));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_message_bytes must be positive, got ",
                     options.max_message_bytes));
  }
  return absl::OkStatus();
}

// A server-streaming call whose messages are read as raw buffers, so a
// FetchedChunk can parse them without copying their payload (the
// generated ClientReader would parse each into a WeightChunk). It drives
// the generic stub's completion queue synchronously.
class RawServerStream {
 public:
  RawServerStream(const std::shared_ptr<grpc::Channel>& channel,
                  grpc::ClientContext* context, const std::string& method,
                  const google::protobuf::Message& request)
      : stub_(channel), call_(stub_.PrepareCall(context, method, &queue_)) {
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    // One after the other: StartCall and Write share one set of call
    // operations. A failure shows in Read and Finish, which say why.
    call_->StartCall(Tag());
    Wait();
    call_->WriteLast(buffer, grpc::WriteOptions(), Tag());
    Wait();
  }

  ~RawServerStream() {
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }

  // The next message; false when the stream has ended (then Finish).
  bool Read(grpc::ByteBuffer* message) {
    if (ended_) return false;
    call_->Read(message, Tag());
    if (!Wait()) ended_ = true;
    return !ended_;
  }

  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, Tag());
    Wait();
    return status;
  }

 private:
  static void* Tag() { return reinterpret_cast<void*>(1); }
  // Waits for the one outstanding operation; whether it succeeded.
  bool Wait() {
    void* tag;
    bool ok = false;
    if (!queue_.Next(&tag, &ok)) return false;
    return ok;
  }

  grpc::CompletionQueue queue_;
  grpc::GenericStub stub_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool ended_ = false;
};

// Checks one chunk against the stream so far (see Client::Fetch).
absl::Status CheckChunk(const v1::FetchRequest& request,
                        const FetchedChunk& chunk, bool first,
                        uint64_t expected_offset, uint64_t total_bytes) {
  if (chunk.offset() != expected_offset) {
    if (first) {
      return absl::DataLossError(absl::StrCat(
          "fetch of ", request.handle(), ": the first chunk starts at byte ",
          chunk.offset(), ", but the fetch asked for byte ", expected_offset));
    }
    return absl::DataLossError(
        absl::StrCat("fetch of ", request.handle(), ": a chunk starts at byte ",
                     chunk.offset(), ", but the previous one ended at byte ",
                     expected_offset));
  }
  if (!first && chunk.total_bytes() != total_bytes) {
    return absl::DataLossError(absl::StrCat(
        "fetch of ", request.handle(), ": total_bytes changed from ",
        total_bytes, " to ", chunk.total_bytes(), " at byte ", chunk.offset()));
  }
  if (chunk.offset() > chunk.total_bytes() ||
      chunk.data_size() > chunk.total_bytes() - chunk.offset()) {
    return absl::DataLossError(absl::StrCat(
        "fetch of ", request.handle(), ": the chunk of ", chunk.data_size(),
        " bytes at byte ", chunk.offset(), " runs past the end of the ",
        chunk.total_bytes(), "-byte file"));
  }
  return absl::OkStatus();
}

// Writes all of `data` at `offset`, retrying short writes and EINTR.
absl::Status WriteAllAt(int fd, absl::string_view data, uint64_t offset,
                        const std::string& path) {
  while (!data.empty()) {
    const ssize_t written =
        ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("writing ", path));
    }
    data.remove_prefix(static_cast<size_t>(written));
    offset += static_cast<uint64_t>(written);
  }
  return absl::OkStatus();
}

// Owns a file descriptor. Thread-compatible.
class File {
 public:
  explicit File(int fd) : fd_(fd) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }

  // Closes now, reporting the error that the destructor would swallow (on
  // some file systems a failed write-back shows up only here).
  absl::Status Close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("closing ", path));
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
};

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  return static_cast<uint64_t>(st.st_size);
}

// Makes a completed rename durable: the new directory entry lives in the
// directory, which has to be synced separately from the file.
absl::Status SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("opening ", dir));
  File file(fd);
  if (::fsync(file.fd()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fsync ", dir));
  }
  return file.Close(dir);
}

// Hashes the first `length` bytes of the open file (a resumed prefix).
absl::Status HashPrefix(int fd, uint64_t length, const std::string& path,
                        delivery::Hasher* hasher) {
  std::string buffer(std::min<uint64_t>(length, 8 << 20), '\0');
  for (uint64_t done = 0; done < length;) {
    const ssize_t n = ::pread(fd, buffer.data(),
                              std::min<uint64_t>(buffer.size(), length - done),
                              static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("reading ", path));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, " shrank while it was being read"));
    }
    hasher->Update(buffer.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// The body of FetchToFile once `partial` is open as `file`: fetch, check,
// fsync, rename.
absl::StatusOr<FetchResult> FetchIntoPartial(
    Client& client, const std::string& handle, const std::string& path,
    const std::string& partial, File& file, const FetchFileOptions& options) {
  uint64_t start = 0;
  delivery::Hasher prefix;
  if (options.resume) {
    ASSIGN_OR_RETURN(start, FileSize(file.fd(), partial));
    // The bytes on disk count toward the digest: read them back rather
    // than trust them.
    RETURN_IF_ERROR(HashPrefix(file.fd(), start, partial, &prefix));
  }

  v1::FetchRequest request;
  request.set_handle(handle);
  request.set_format(options.format);
  request.set_offset(start);
  request.set_chunk_bytes(options.chunk_bytes);
  request.set_include_non_persistent(options.include_non_persistent);
  request.set_write_ties_once(options.write_ties_once);
  for (const std::string& pattern : options.include)
    request.add_include(pattern);
  for (const std::string& pattern : options.exclude)
    request.add_exclude(pattern);

  bool started = false;
  absl::StatusOr<FetchResult> total = client.Fetch(
      request,
      [&](const FetchedChunk& chunk) -> absl::Status {
        if (!started) {
          started = true;
          if (options.progress) options.progress(start, chunk.total_bytes());
        }
        uint64_t offset = chunk.offset();
        for (absl::string_view piece : chunk.pieces()) {
          RETURN_IF_ERROR(WriteAllAt(file.fd(), piece, offset, partial));
          offset += piece.size();
        }
        if (options.progress) {
          options.progress(chunk.offset() + chunk.data_size(),
                           chunk.total_bytes());
        }
        return absl::OkStatus();
      },
      &prefix);
  if (!total.ok()) {
    if (total.status().code() == absl::StatusCode::kDataLoss &&
        absl::StrContains(total.status().message(), "the file's digest is")) {
      // Some byte on disk is wrong: a resume from it cannot succeed.
      ::unlink(partial.c_str());
      return absl::DataLossError(absl::StrCat(total.status().message(),
                                              "; removed ", partial,
                                              ", fetch again from the start"));
    }
    if (start > 0 && total.status().code() == absl::StatusCode::kOutOfRange) {
      return absl::OutOfRangeError(absl::StrCat(
          total.status().message(), " (resuming from ", partial,
          ", which holds ", start,
          " bytes: it is not a prefix of this handle's file; delete it or "
          "fetch without resume)"));
    }
    return total.status();
  }

  ASSIGN_OR_RETURN(const uint64_t size, FileSize(file.fd(), partial));
  if (size != total->total_bytes) {
    // The stream was checked to end exactly at total_bytes, so this means
    // something else wrote to the .partial file meanwhile.
    return absl::DataLossError(
        absl::StrCat(partial, " holds ", size, " bytes, but the file of ",
                     handle, " is ", total->total_bytes, " bytes"));
  }
  if (::fsync(file.fd()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fsync ", partial));
  }
  RETURN_IF_ERROR(file.Close(partial));
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("renaming ", partial, " to ", path));
  }
  RETURN_IF_ERROR(SyncParentDirectory(path));
  return *total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Client> client(new Client(options));
  ASSIGN_OR_RETURN(client->credentials_,
                   MakeChannelCredentials(options.security));
  Client* raw = client.get();
  client->replicas_ = std::make_unique<ReplicaSet>(
      options.target,
      [raw](const Endpoint& endpoint) {
        const ClientOptions& o = raw->options_;
        grpc::ChannelArguments arguments;
        arguments.SetMaxReceiveMessageSize(o.max_message_bytes);
        arguments.SetMaxSendMessageSize(o.max_message_bytes);
        arguments.SetInt(
            GRPC_ARG_KEEPALIVE_TIME_MS,
            static_cast<int>(absl::ToInt64Milliseconds(o.keepalive)));
        arguments.SetInt(
            GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
            static_cast<int>(absl::ToInt64Milliseconds(o.keepalive)));
        arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
        arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
        // The name the server's certificate must carry: the one asked for,
        // else the host name an IP address was looked up from.
        const std::string& tls_name = o.security.tls_server_name.empty()
                                          ? endpoint.tls_name
                                          : o.security.tls_server_name;
        if (o.security.UsesTls() && !tls_name.empty()) {
          arguments.SetSslTargetNameOverride(tls_name);
        }
        return grpc::CreateCustomChannel(endpoint.address, raw->credentials_,
                                         arguments);
      },
      [raw](grpc::ClientContext* context, absl::Duration timeout) {
        raw->PrepareContext(context, timeout);
      },
      options.discovery_timeout);
  return client;
}

Client::Client(ClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::string> Client::SessionId(absl::Duration timeout) {
  if (!options_.session) {
    return absl::FailedPreconditionError(
        "this client keeps no session (ClientOptions::session is off)");
  }
  if (!replicas_->single()) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.target,
        " has several replicas, and a session on each replica this client "
        "materializes on: ask for the one of a handle (SessionIdOf)"));
  }
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Replica>> replicas,
                   replicas_->ForId(""));
  return replicas.front()->session().WaitForSession(timeout);
}

absl::StatusOr<std::string> Client::SessionIdOf(absl::string_view handle,
                                                absl::Duration timeout) {
  if (!options_.session) {
    return absl::FailedPreconditionError(
        "this client keeps no session (ClientOptions::session is off)");
  }
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Replica>> replicas,
                   replicas_->ForId(handle));
  return replicas.front()->session().WaitForSession(timeout);
}

void Client::PrepareContext(grpc::ClientContext* context,
                            absl::Duration timeout) const {
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(timeout));
  }
  if (!options_.client_name.empty()) {
    context->AddMetadata(kClientMetadataKey, options_.client_name);
  }
}

template <typename Response, typename Rpc>
absl::StatusOr<Response> Client::CallOn(Replica& replica, const Rpc& rpc) {
  grpc::ClientContext context;
  PrepareContext(&context);
  Response response;
  const absl::Status status =
      FromGrpcStatus(rpc(replica.stub(), &context, &response));
  if (!status.ok()) return replicas_->Explain(replica, status);
  return response;
}

template <typename Response, typename Rpc>
absl::StatusOr<Response> Client::CallFor(absl::string_view id, const Rpc& rpc) {
  ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<Replica>> replicas,
                   replicas_->ForId(id));
  // One replica, unless the id names none and there are several: then the
  // first that knows the id answers; NOT_FOUND only if every one said so.
  absl::Status unavailable;
  absl::Status not_found;
  for (const std::shared_ptr<Replica>& replica : replicas) {
    absl::StatusOr<Response> response = CallOn<Response>(*replica, rpc);
    if (replicas.size() == 1 && !response.ok()) {
      return replicas_->ExplainNotFound(*replica, id, response.status());
    }
    if (replicas.size() == 1 || response.ok()) return response;
    switch (response.status().code()) {
      case absl::StatusCode::kNotFound:
        not_found = response.status();
        break;
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
        unavailable = response.status();
        break;
      default:
        return response;
    }
  }
  return unavailable.ok() ? not_found : unavailable;
}

template <typename T, typename Call>
absl::StatusOr<std::vector<FromReplica<T>>> Client::OnEveryReplica(
    const Call& call) {
  ASSIGN_OR_RETURN(
      const std::vector<Discovered> found,
      replicas_->single()
          ? absl::StatusOr<std::vector<Discovered>>(std::vector<Discovered>{})
          : replicas_->Reachable());
  std::vector<std::shared_ptr<Replica>> targets;
  std::vector<FromReplica<T>> results;
  if (replicas_->single()) {
    ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Replica>> only,
                     replicas_->ForId(""));
    targets = std::move(only);
    results.resize(1);
  } else {
    results.resize(found.size());
    for (size_t i = 0; i < found.size(); ++i) {
      targets.push_back(found[i].replica);
      results[i].address = found[i].address;
      if (found[i].replica == nullptr) results[i].result = found[i].status;
    }
  }
  std::vector<std::thread> callers;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == nullptr) continue;
    results[i].replica = targets[i]->name();
    results[i].address = targets[i]->address();
    callers.emplace_back([&, i] { results[i].result = call(*targets[i]); });
  }
  for (std::thread& caller : callers) caller.join();
  return results;
}

absl::StatusOr<v1::PlanResponse> Client::Plan(const v1::PlanRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Replica> replica,
                   replicas_->ForPlacement(request.placement()));
  return CallOn<v1::PlanResponse>(
      *replica, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                    v1::PlanResponse* response) {
        return stub.Plan(context, request, response);
      });
}

absl::StatusOr<v1::CheckpointContents> Client::InspectCheckpoint(
    const v1::InspectCheckpointRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Replica> replica,
                   replicas_->ForPlacement(v1::Placement()));
  return CallOn<v1::CheckpointContents>(
      *replica, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                    v1::CheckpointContents* response) {
        return stub.InspectCheckpoint(context, request, response);
      });
}

absl::StatusOr<v1::MaterializeResponse> Client::Materialize(
    const v1::MaterializeRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Replica> replica,
                   replicas_->ForPlacement(request.placement()));
  std::string session;
  if (options_.session) {
    // Bind the handle to this client's session on that replica.
    absl::StatusOr<std::string> id =
        replica->session().WaitForSession(absl::Seconds(30));
    if (!id.ok()) return replicas_->Explain(*replica, id.status());
    session = *std::move(id);
  }
  return CallOn<v1::MaterializeResponse>(
      *replica, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                    v1::MaterializeResponse* response) {
        if (!session.empty())
          context->AddMetadata(kSessionMetadataKey, session);
        return stub.Materialize(context, request, response);
      });
}

absl::StatusOr<v1::HandleInfo> Client::Describe(absl::string_view handle) {
  v1::DescribeRequest request;
  request.set_handle(std::string(handle));
  return CallFor<v1::HandleInfo>(
      handle, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                  v1::HandleInfo* response) {
        return stub.Describe(context, request, response);
      });
}

absl::StatusOr<v1::ReleaseResponse> Client::Release(absl::string_view handle,
                                                    bool force) {
  v1::ReleaseRequest request;
  request.set_handle(std::string(handle));
  request.set_force(force);
  return CallFor<v1::ReleaseResponse>(
      handle, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                  v1::ReleaseResponse* response) {
        return stub.Release(context, request, response);
      });
}

absl::StatusOr<v1::RenewResponse> Client::Renew(absl::string_view handle) {
  v1::RenewRequest request;
  request.set_handle(std::string(handle));
  return CallFor<v1::RenewResponse>(
      handle, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                  v1::RenewResponse* response) {
        return stub.Renew(context, request, response);
      });
}

absl::StatusOr<v1::FileLayout> Client::DescribeFile(
    const v1::FetchRequest& request) {
  return CallFor<v1::FileLayout>(
      request.handle(),
      [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
          v1::FileLayout* response) {
        return stub.DescribeFile(context, request, response);
      });
}

absl::StatusOr<v1::ExportResponse> Client::ExportHandle(
    absl::string_view handle, absl::string_view importer_device_uuid) {
  v1::ExportRequest request;
  request.set_handle(std::string(handle));
  request.set_importer_device_uuid(std::string(importer_device_uuid));
  return CallFor<v1::ExportResponse>(
      handle, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                  v1::ExportResponse* response) {
        return stub.ExportHandle(context, request, response);
      });
}

absl::StatusOr<v1::CloseExportResponse> Client::CloseExport(
    absl::string_view export_id) {
  v1::CloseExportRequest request;
  request.set_export_id(std::string(export_id));
  // An export id ends with its handle's id, so it names the same replica.
  return CallFor<v1::CloseExportResponse>(
      export_id, [&](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                     v1::CloseExportResponse* response) {
        return stub.CloseExport(context, request, response);
      });
}

absl::StatusOr<HandleList> Client::ListHandles() {
  ASSIGN_OR_RETURN(
      std::vector<FromReplica<v1::ListHandlesResponse>> each,
      OnEveryReplica<v1::ListHandlesResponse>([this](Replica& replica) {
        return CallOn<v1::ListHandlesResponse>(
            replica,
            [](v1::Materializer::Stub& stub, grpc::ClientContext* context,
               v1::ListHandlesResponse* response) {
              return stub.ListHandles(context, v1::ListHandlesRequest(),
                                      response);
            });
      }));
  HandleList list;
  bool any = false;
  for (FromReplica<v1::ListHandlesResponse>& entry : each) {
    if (!entry.result.ok()) {
      list.failed.push_back(std::move(entry));
      continue;
    }
    any = true;
    for (v1::HandleSummary& handle : *entry.result->mutable_handles()) {
      *list.handles.add_handles() = std::move(handle);
    }
  }
  if (!any) return list.failed.front().result.status();
  auto& handles = *list.handles.mutable_handles();
  std::stable_sort(handles.begin(), handles.end(),
                   [](const v1::HandleSummary& a, const v1::HandleSummary& b) {
                     const auto& x = a.created_at();
                     const auto& y = b.created_at();
                     if (x.seconds() != y.seconds()) {
                       return x.seconds() < y.seconds();
                     }
                     if (x.nanos() != y.nanos()) return x.nanos() < y.nanos();
                     return a.handle() < b.handle();
                   });
  return list;
}

absl::StatusOr<std::vector<FromReplica<v1::GetStatsResponse>>>
Client::GetStats() {
  return OnEveryReplica<v1::GetStatsResponse>([this](Replica& replica) {
    return CallOn<v1::GetStatsResponse>(
        replica, [](v1::Materializer::Stub& stub, grpc::ClientContext* context,
                    v1::GetStatsResponse* response) {
          return stub.GetStats(context, v1::GetStatsRequest(), response);
        });
  });
}

absl::StatusOr<std::vector<FromReplica<std::string>>> Client::Health() {
  return OnEveryReplica<std::string>(
      [this](Replica& replica) -> absl::StatusOr<std::string> {
        grpc::ClientContext context;
        PrepareContext(&context);
        grpc::health::v1::HealthCheckRequest request;
        request.set_service("");
        grpc::health::v1::HealthCheckResponse response;
        const absl::Status status = FromGrpcStatus(
            replica.health().Check(&context, request, &response));
        if (!status.ok()) return replicas_->Explain(replica, status);
        return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
            response.status());
      });
}

absl::StatusOr<std::vector<FromReplica<v1::ServerInfo>>> Client::Replicas() {
  ASSIGN_OR_RETURN(const std::vector<Discovered> found, replicas_->Discover());
  std::vector<FromReplica<v1::ServerInfo>> out;
  for (const Discovered& entry : found) {
    FromReplica<v1::ServerInfo> one;
    one.address = entry.address;
    if (entry.replica == nullptr) {
      one.result = entry.status;
    } else {
      one.replica = entry.info.replica();
      one.result = entry.info;
    }
    out.push_back(std::move(one));
  }
  return out;
}

absl::StatusOr<FetchResult> Client::Fetch(
    const v1::FetchRequest& request,
    const std::function<absl::Status(const FetchedChunk&)>& on_chunk,
    delivery::Hasher* prefix) {
  ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<Replica>> replicas,
                   replicas_->ForId(request.handle()));
  // As CallFor: an id that names no replica is tried on each until one
  // knows it (before any chunk arrives).
  absl::Status last;
  for (const std::shared_ptr<Replica>& replica : replicas) {
    bool received = false;
    absl::StatusOr<FetchResult> result =
        FetchFrom(*replica, request, on_chunk, prefix, &received);
    if (replicas.size() == 1 && !result.ok() && !received) {
      return replicas_->ExplainNotFound(*replica, request.handle(),
                                        result.status());
    }
    if (result.ok() || received || replicas.size() == 1) return result;
    const absl::StatusCode code = result.status().code();
    if (code != absl::StatusCode::kNotFound &&
        code != absl::StatusCode::kUnavailable) {
      return result;
    }
    if (last.ok() || code == absl::StatusCode::kUnavailable) {
      last = result.status();
    }
  }
  return last;
}

absl::StatusOr<FetchResult> Client::FetchFrom(
    Replica& replica, const v1::FetchRequest& request,
    const std::function<absl::Status(const FetchedChunk&)>& on_chunk,
    delivery::Hasher* prefix, bool* received) {
  grpc::ClientContext context;
  PrepareContext(&context, options_.fetch_timeout);
  RawServerStream reader(
      replica.channel(), &context,
      absl::StrCat("/", v1::Materializer::service_full_name(), "/FetchWeights"),
      request);

  // The whole file's digest, when every byte before the offset is in
  // `prefix` (or there is none).
  delivery::Hasher own;
  delivery::Hasher* hasher = nullptr;
  if (request.offset() == 0) {
    hasher = &own;
  } else if (prefix != nullptr && prefix->length() == request.offset()) {
    hasher = prefix;
  }
  grpc::ByteBuffer message;
  FetchedChunk chunk;
  bool first = true;
  uint64_t next_offset = request.offset();
  uint64_t total_bytes = 0;
  std::string digest;
  // Why we stopped reading before the server finished, if we did.
  absl::Status stopped;
  while (reader.Read(&message)) {
    *received = true;
    stopped = chunk.Parse(message);
    if (stopped.ok()) {
      stopped = CheckChunk(request, chunk, first, next_offset, total_bytes);
    }
    if (stopped.ok()) stopped = on_chunk(chunk);
    if (!stopped.ok()) break;
    // Hashed here, on the thread that receives the next chunk: hashing on
    // a thread of its own measured slower on two cores (1.04 s against
    // 0.95 s for 4 GiB, medians of 7).
    if (hasher != nullptr) {
      for (absl::string_view piece : chunk.pieces()) hasher->Update(piece);
    }
    first = false;
    total_bytes = chunk.total_bytes();
    next_offset = chunk.offset() + chunk.data_size();
    if (!chunk.digest().empty()) digest = chunk.digest();
  }
  if (!stopped.ok()) {
    context.TryCancel();
    // Finish may only follow the last Read; after the cancel the remaining
    // reads fail fast, and Finish reports CANCELLED, which says less than
    // the reason we already have.
    while (reader.Read(&message)) {
    }
    reader.Finish().IgnoreError();
    return stopped;
  }
  if (absl::Status finished = FromGrpcStatus(reader.Finish());
      !finished.ok()) {
    return replicas_->Explain(replica, finished);
  }
  if (first) {
    return absl::DataLossError(
        absl::StrCat("fetch of ", request.handle(),
                     ": the server ended the stream without sending a chunk"));
  }
  if (next_offset != total_bytes) {
    return absl::DataLossError(absl::StrCat("fetch of ", request.handle(),
                                            ": the stream ended at byte ",
                                            next_offset, " of ", total_bytes));
  }
  if (digest.empty()) {
    return absl::DataLossError(absl::StrCat(
        "fetch of ", request.handle(),
        ": the server sent no digest of the file, so it cannot be checked"));
  }
  FetchResult result;
  result.total_bytes = total_bytes;
  result.digest = digest;
  if (hasher != nullptr) {
    const std::string computed = delivery::FormatDigest(hasher->Finish());
    if (computed != digest) {
      return absl::DataLossError(
          absl::StrCat("fetch of ", request.handle(), ": the file's digest is ",
                       computed, " but the server's is ", digest,
                       ": some byte was corrupted on the way or on disk"));
    }
    result.verified = true;
  }
  return result;
}

absl::StatusOr<FetchResult> FetchToFile(Client& client,
                                        const std::string& handle,
                                        const std::string& path,
                                        const FetchFileOptions& options) {
  const std::string partial = path + ".partial";
  const int flags =
      O_RDWR | O_CREAT | O_CLOEXEC | (options.resume ? 0 : O_TRUNC);
  const int fd = ::open(partial.c_str(), flags, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("opening ", partial));
  }
  File file(fd);
  absl::StatusOr<FetchResult> result =
      FetchIntoPartial(client, handle, path, partial, file, options);
  if (!result.ok()) {
    // An empty .partial file holds nothing to resume from (say the handle
    // was mistyped); leave no litter behind.
    struct stat st;
    if (::stat(partial.c_str(), &st) == 0 && st.st_size == 0) {
      ::unlink(partial.c_str());
    }
  }
  return result;
}

}  // namespace materializer::client
