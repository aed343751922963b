#ifndef MATERIALIZER_SERVER_CHECKPOINT_JSON_H_
#define MATERIALIZER_SERVER_CHECKPOINT_JSON_H_

// A strict, streaming reader of RFC 8259 JSON for the checkpoint headers
// and indexes. Strict: UTF-8 checked, no lone surrogates, no control
// characters in strings, no leading zeros, no duplicate keys in any
// object, nothing but whitespace after the value, nesting at most
// kMaxJsonDepth. Streaming: the caller pulls values and keeps what it
// needs, so a hostile 100 MB header costs memory in proportion to what the
// caller keeps, not a tree of every value.
//
//   JsonReader json(text);
//   RETURN_IF_ERROR(json.BeginObject());
//   std::string key;
//   while (true) {
//     ASSIGN_OR_RETURN(bool more, json.NextMember(&key));
//     if (!more) break;
//     if (key == "n") { ASSIGN_OR_RETURN(JsonNumber n, json.ReadNumber()); }
//     else RETURN_IF_ERROR(json.SkipValue());
//   }
//   RETURN_IF_ERROR(json.ExpectEnd());
//
// Errors are INVALID_ARGUMENT "JSON byte <offset>: <what>"; callers prefix
// the file. Not thread-safe (one reader per parse).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::checkpoint {

inline constexpr int kMaxJsonDepth = 64;

struct JsonNumber {
  // True for a number written without fraction or exponent whose magnitude
  // fits 64 bits; then `negative` and `magnitude` hold it exactly.
  bool integer = false;
  bool negative = false;
  uint64_t magnitude = 0;
};

class JsonReader {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  // `text` must outlive the reader.
  explicit JsonReader(absl::string_view text) : text_(text) {}

  JsonReader(const JsonReader&) = delete;
  JsonReader& operator=(const JsonReader&) = delete;

  // The type of the next value, without consuming it.
  absl::StatusOr<Type> Peek();

  // Consumes '{'. Then NextMember until it returns false.
  absl::Status BeginObject();
  // Reads the next member's key and its ':' (the value is next), or
  // consumes the object's '}' and returns false. A key seen before in the
  // same object is an error.
  absl::StatusOr<bool> NextMember(std::string* key);

  // Consumes '['. Then NextElement until it returns false.
  absl::Status BeginArray();
  // True if a value follows (read it next); consumes ']' and returns false
  // at the end of the array.
  absl::StatusOr<bool> NextElement();

  absl::StatusOr<std::string> ReadString();
  absl::StatusOr<JsonNumber> ReadNumber();
  absl::StatusOr<bool> ReadBool();
  absl::Status ReadNull();
  // Reads and checks one value of any type, keeping nothing.
  absl::Status SkipValue();

  // Only whitespace is left.
  absl::Status ExpectEnd();

  // Byte offset of the next unread character.
  size_t position() const { return pos_; }

 private:
  struct Level {
    bool object = false;
    bool first = true;
    absl::flat_hash_set<std::string> keys;  // objects only
  };

  absl::Status Error(absl::string_view what) const;
  void SkipSpace();
  bool Consume(char c);
  absl::Status Expect(char c, absl::string_view what);
  absl::Status Open(bool object);
  absl::Status ParseString(std::string* out);
  absl::Status ParseUtf8(std::string* out);
  absl::Status ParseHex4(uint32_t* out);

  absl::string_view text_;
  size_t pos_ = 0;
  std::vector<Level> levels_;
};

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_JSON_H_
