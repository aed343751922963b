#include "server/service/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace materializer::service {
namespace {

// Bytes `c` takes in the grpc-message trailer.
size_t WireBytes(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u < 0x20 || u > 0x7e || u == '%' ? 3 : 1;
}

// The longest prefix of `text` taking at most `budget` wire bytes.
absl::string_view HeadWithin(absl::string_view text, size_t budget) {
  size_t used = 0;
  size_t i = 0;
  while (i < text.size() && used + WireBytes(text[i]) <= budget) {
    used += WireBytes(text[i++]);
  }
  return text.substr(0, i);
}

// The longest suffix of `text` taking at most `budget` wire bytes.
absl::string_view TailWithin(absl::string_view text, size_t budget) {
  size_t used = 0;
  size_t i = text.size();
  while (i > 0 && used + WireBytes(text[i - 1]) <= budget) {
    used += WireBytes(text[--i]);
  }
  return text.substr(i);
}

std::string Bounded(absl::string_view message) {
  size_t wire = 0;
  for (char c : message) wire += WireBytes(c);
  if (wire <= kMaxStatusWireBytes) return std::string(message);
  // Three quarters for the beginning (what failed), a quarter for the end
  // (what to do), minus room for the note between them.
  constexpr size_t kNote = 64;
  const absl::string_view head =
      HeadWithin(message, (kMaxStatusWireBytes - kNote) * 3 / 4);
  const absl::string_view tail = TailWithin(
      message.substr(head.size()), (kMaxStatusWireBytes - kNote) / 4);
  return absl::StrCat(head, " [... ",
                      message.size() - head.size() - tail.size(),
                      " bytes of this message cut ...] ", tail);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      Bounded(status.message()));
}

grpc::Status EndCall(absl::string_view /*method*/,
                     const absl::Status& status) {
  return ToGrpcStatus(status);
}

}  // namespace materializer::service
