// Fuzz target: matctl's request-file parsing (client/request_file.h), the
// proto3 JSON mapping of MaterializeRequest.
//
// Input: the file's text.
//
// Properties:
//   - a refused file is INVALID_ARGUMENT naming the file, without blank
//     lines (the message is printed as is);
//   - an accepted file is a request matctl can send: it serializes, and
//     the bytes parse back to the same request (no field the wire form
//     loses or refuses, such as a string that is not UTF-8);
//   - printing it as JSON and parsing that again gives the same request.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/request_file.h"
#include "fuzz/check.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::fuzz {
namespace {

constexpr absl::string_view kPath = "request.json";

// Deterministic wire bytes (map entries sorted), so equal messages compare
// equal byte for byte, NaNs included.
std::string WireBytes(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  FUZZ_CHECK(message.SerializeToCodedStream(&coded))
      << "the accepted request does not serialize";
  coded.Trim();
  return out;
}

std::string Show(absl::string_view bytes) {
  return absl::StrCat("\"", absl::CHexEscape(bytes.substr(0, 300)), "\"",
                      bytes.size() > 300 ? "..." : "");
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer;
  using namespace materializer::fuzz;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<v1::MaterializeRequest> request =
      client::ParseRequestFile(text, kPath);
  if (!request.ok()) {
    const absl::string_view message = request.status().message();
    FUZZ_CHECK(request.status().code() == absl::StatusCode::kInvalidArgument)
        << request.status();
    FUZZ_CHECK(absl::StartsWith(message, kPath)) << request.status();
    FUZZ_CHECK(message.find("\n\n") == absl::string_view::npos)
        << "blank line in " << Show(message);
    return 0;
  }

  // What matctl sends.
  const std::string wire = WireBytes(*request);
  v1::MaterializeRequest received;
  FUZZ_CHECK(received.ParseFromString(wire))
      << "the server could not parse the request matctl sends for "
      << Show(text) << " (" << request->ShortDebugString().substr(0, 300)
      << ")";
  FUZZ_CHECK(WireBytes(received) == wire)
      << "the request changes on the wire: " << Show(text);

  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  const auto printed =
      google::protobuf::util::MessageToJsonString(*request, &json, print);
  FUZZ_CHECK(printed.ok()) << "cannot print the request as JSON: "
                           << printed.ToString();
  const absl::StatusOr<v1::MaterializeRequest> again =
      client::ParseRequestFile(json, kPath);
  FUZZ_CHECK(again.ok()) << "the printed request does not parse: "
                         << again.status() << "\n  " << Show(json);
  // Equal as values, not as bytes: proto3 JSON omits a field equal to its
  // default, and -0.0 == 0.0, so a -0.0 is printed as nothing and comes
  // back as +0.0 (same values; the wire differs by the sign bit). A NaN
  // comes back as a NaN. Every other change is a bug.
  google::protobuf::util::DefaultFieldComparator values;
  values.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&values);
  FUZZ_CHECK(differ.Compare(*again, *request))
      << "JSON round trip changes the request: " << Show(text) << " -> "
      << Show(json);
  return 0;
}
