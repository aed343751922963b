#ifndef MATERIALIZER_CLIENT_FETCHED_CHUNK_H_
#define MATERIALIZER_CLIENT_FETCHED_CHUNK_H_

// A WeightChunk read straight from gRPC's receive buffers.
//
// The generated reader parses a chunk into v1::WeightChunk, which copies
// its payload (4 MiB by default) into a std::string: a fifth of the
// client's CPU time on a loopback fetch, where the client's core is what
// limits the transfer. FetchedChunk keeps the payload where gRPC received
// it and lists it as pieces, so the client hashes and writes the bytes
// without that copy.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client {

class FetchedChunk {
 public:
  // Every field of the chunk except `data` (whose bytes are in pieces()).
  const v1::WeightChunk& fields() const { return fields_; }
  uint64_t offset() const { return fields_.offset(); }
  uint64_t total_bytes() const { return fields_.total_bytes(); }
  const std::string& digest() const { return fields_.digest(); }

  // The payload, in order, as views into the received buffers: valid as
  // long as this FetchedChunk is neither destroyed nor parsed into again.
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  // The payload's length in bytes.
  uint64_t data_size() const { return data_size_; }
  // The payload as one string (a copy; for tests and small chunks).
  std::string CopyData() const;

  // Parses `buffer` (a serialized WeightChunk) into this chunk, keeping
  // references to its slices rather than copying the payload. Accepts
  // what protobuf's parser accepts, except groups (wire types 3 and 4),
  // which no WeightChunk carries; anything malformed is DATA_LOSS.
  absl::Status Parse(const grpc::ByteBuffer& buffer);

 private:
  v1::WeightChunk fields_;
  std::vector<grpc::Slice> slices_;  // keeps pieces_ alive
  std::vector<absl::string_view> pieces_;
  uint64_t data_size_ = 0;
};

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_FETCHED_CHUNK_H_
