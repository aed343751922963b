#ifndef MATERIALIZER_SERVER_SERVICE_RAW_MESSAGE_H_
#define MATERIALIZER_SERVER_SERVICE_RAW_MESSAGE_H_

// Messages of the raw (ByteBuffer) callback methods. The service takes
// every request as bytes and parses it itself, on a worker: gRPC's typed
// handlers would parse on a callback thread and answer bytes that do not
// parse with UNIMPLEMENTED and no message.
//
//   v1::PlanRequest request;
//   RETURN_IF_ERROR(ParseMessage(*raw, &request));
//   ...
//   RETURN_IF_ERROR(SerializeMessage(response, raw_response));

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace materializer::service {

// Parses `raw` into *message. INVALID_ARGUMENT naming the message type
// (e.g. "materializer.v1.PlanRequest") when the bytes are not its
// encoding. `raw` is not changed (its slices are shared, not copied).
absl::Status ParseMessage(const grpc::ByteBuffer& raw,
                          google::protobuf::MessageLite* message);

// Serializes `message` into *out (replacing what it held). INTERNAL if
// protobuf cannot (a message over 2 GiB).
absl::Status SerializeMessage(const google::protobuf::MessageLite& message,
                              grpc::ByteBuffer* out);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_RAW_MESSAGE_H_
