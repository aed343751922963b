#include "server/service/raw_message.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace materializer::service {

absl::Status ParseMessage(const grpc::ByteBuffer& raw,
                          google::protobuf::MessageLite* message) {
  grpc::ByteBuffer copy(raw);  // shares the slices; the reader consumes it
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request (", raw.Length(), " bytes) does not parse as ",
        message->GetTypeName(),
        ": it is not that message's protobuf encoding"));
  }
  return absl::OkStatus();
}

absl::Status SerializeMessage(const google::protobuf::MessageLite& message,
                              grpc::ByteBuffer* out) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT32_MAX)) {
    return absl::InternalError(absl::StrCat(
        "the ", message.GetTypeName(), " answer is ", size,
        " bytes, more than a message can hold"));
  }
  out->Clear();
  grpc::ProtoBufferWriter writer(out, grpc::kProtoBufferWriterMaxBufferLength,
                                 static_cast<int>(size));
  if (!message.SerializeToZeroCopyStream(&writer)) {
    return absl::InternalError(
        absl::StrCat("cannot serialize the ", message.GetTypeName(), " answer"));
  }
  return absl::OkStatus();
}

}  // namespace materializer::service
