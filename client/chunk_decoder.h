#ifndef MATERIALIZER_CLIENT_CHUNK_DECODER_H_
#define MATERIALIZER_CLIENT_CHUNK_DECODER_H_

// Decodes a FetchWeights message (v1::WeightChunk) as gRPC received it,
// without copying its data: protobuf's parser would copy every weight byte
// out of the received slices into the `data` string, a whole extra pass
// over the file on the client. Here `data` stays a list of views into the
// slices, and only the small fields go through protobuf.
//
//   grpc::ByteBuffer received;             // from ClientReader::Read
//   DecodedChunk chunk;
//   RETURN_IF_ERROR(DecodeWeightChunk(received, &chunk));
//   for (absl::string_view piece : chunk.data) ...   // valid while
//                                                    // `received` lives

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client {

struct DecodedChunk {
  // Every field but `data` (fields.data() is empty). Unknown fields are
  // kept, as protobuf's parser keeps them.
  v1::WeightChunk fields;
  // The data, in order: views into `slices`. As protobuf does for a
  // singular field, the last occurrence of field 2 wins.
  std::vector<absl::string_view> data;
  uint64_t data_size = 0;
  // The received message's slices (references, not copies), which `data`
  // views.
  std::vector<grpc::Slice> slices;
};

// Decodes `received` into *chunk (replacing what it held). INVALID_ARGUMENT
// when the bytes are not a WeightChunk's encoding (truncated, a length past
// the end, a wire type the message cannot have).
absl::Status DecodeWeightChunk(const grpc::ByteBuffer& received,
                               DecodedChunk* chunk);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_CHUNK_DECODER_H_
