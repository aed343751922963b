#include "server/service/call_observer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "server/common/log.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

// The message's string field "handle", or "".
std::string HandleOf(const google::protobuf::Message& message) {
  const google::protobuf::FieldDescriptor* field =
      message.GetDescriptor()->FindFieldByName("handle");
  if (field == nullptr || field->is_repeated() ||
      field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  return message.GetReflection()->GetString(message, field).substr(
      0, kMaxIdBytes);
}

}  // namespace

CallObserver::CallObserver(metrics::Metrics* metrics,
                           const grpc::CallbackServerContext& context,
                           const char* method)
    : metrics_(metrics),
      method_(method),
      peer_(context.peer()),
      start_(absl::Now()) {}

void CallObserver::SetCaller(const engine::Caller& caller) {
  client_ = caller.identity;
  if (session_.empty()) session_ = caller.session.substr(0, kMaxIdBytes);
}

void CallObserver::SetRequest(const google::protobuf::Message& request) {
  handle_ = HandleOf(request);
}

void CallObserver::SetResponse(const google::protobuf::Message& response,
                               uint64_t bytes) {
  response_bytes_ = bytes;
  if (handle_.empty()) handle_ = HandleOf(response);
}

void CallObserver::FetchOpened(uint64_t offset, uint64_t total_bytes) {
  fetching_ = true;
  fetch_offset_ = offset;
  fetch_total_ = total_bytes;
  const bool resumed = offset > 0;
  if (metrics_ != nullptr) metrics_->RecordFetchStart(resumed);
  MLOG_EVENT(INFO, resumed ? "fetch_resume" : "fetch_start")
      .Str("client", client_)
      .Str("handle", handle_)
      .Uint("offset", offset)
      .Uint("total_bytes", total_bytes);
}

void CallObserver::FetchChunk(uint64_t data_bytes, uint64_t wire_bytes,
                              bool has_digest) {
  fetch_sent_ += data_bytes;
  response_bytes_ += wire_bytes;
  digest_sent_ = digest_sent_ || has_digest;
  if (metrics_ != nullptr) metrics_->AddFetchBytes(data_bytes);
}

grpc::Status CallObserver::End(const absl::Status& result) {
  const grpc::Status status = EndCall(method_, result);
  const absl::Duration duration = absl::Now() - start_;
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  const std::string code_name = absl::StatusCodeToString(code);
  if (metrics_ != nullptr) metrics_->RecordRpc(method_, code, duration);
  if (fetching_) {
    MLOG_EVENT(INFO, "fetch_end")
        .Str("client", client_)
        .Str("handle", handle_)
        .Uint("offset", fetch_offset_)
        .Uint("bytes", fetch_sent_)
        .Uint("total_bytes", fetch_total_)
        .Bool("complete", fetch_offset_ + fetch_sent_ == fetch_total_ &&
                              digest_sent_)
        .Bool("digest_sent", digest_sent_)
        .Str("code", code_name)
        .Millis("duration_ms", duration);
  }
  // The line is built only if INFO is on.
  MLOG_EVENT(INFO, "rpc")
      .Str("peer", peer_)
      .Str("client", client_)
      .Str("method", method_)
      .Str("session", session_)
      .Str("handle", handle_)
      .Str("code", code_name)
      .Millis("duration_ms", duration)
      .Uint("request_bytes", request_bytes_)
      .Uint("response_bytes", response_bytes_)
      .Str("error", status.ok() ? std::string()
                                : status.error_message().substr(
                                      0, kMaxErrorBytes));
  return status;
}

}  // namespace materializer::service
