#include "fuzz/readers/safetensors_reader.h"

#include <algorithm>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace materializer::fuzz {
namespace {

// A JSON value: just what a safetensors header can hold.
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  // kNumber: integers only (a header has no other numbers); `negative` and
  // `magnitude` hold it exactly.
  bool negative = false;
  uint64_t magnitude = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // in order
};

// Recursive descent over RFC 8259, with a depth limit.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    Json value;
    if (absl::Status s = ParseValue(0, &value); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("header JSON, byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' ||
            text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  absl::Status ParseValue(int depth, Json* out) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out->kind = Json::Kind::kString;
      return ParseString(&out->string);
    }
    if (Consume("true")) {
      out->kind = Json::Kind::kBool;
      out->boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      out->kind = Json::Kind::kBool;
      return absl::OkStatus();
    }
    if (Consume("null")) return absl::OkStatus();
    return ParseInteger(out);
  }

  absl::Status ParseInteger(Json* out) {
    out->kind = Json::Kind::kNumber;
    if (pos_ < text_.size() && text_[pos_] == '-') {
      out->negative = true;
      ++pos_;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (out->magnitude > (UINT64_MAX - digit) / 10) {
        return Error("integer out of range");
      }
      out->magnitude = out->magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return Error("expected a value");
    if (text_[start] == '0' && pos_ - start > 1) {
      return Error("integer with a leading zero");
    }
    if (pos_ < text_.size() &&
        (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return Error("a non-integer number");
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Error("short \\u escape");
    *out = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      uint32_t v = 0;
      if (h >= '0' && h <= '9') {
        v = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("bad hex digit in a \\u escape");
      }
      *out = *out * 16 + v;
    }
    return absl::OkStatus();
  }

  // Checks one UTF-8 sequence starting at pos_ and appends it.
  absl::Status ParseUtf8(std::string* out) {
    const unsigned char lead = static_cast<unsigned char>(text_[pos_]);
    int extra;
    uint32_t code;
    if (lead < 0x80) {
      extra = 0;
      code = lead;
    } else if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      code = lead & 0x07;
    } else {
      return Error("invalid UTF-8");
    }
    if (pos_ + extra >= text_.size()) return Error("truncated UTF-8");
    for (int i = 1; i <= extra; ++i) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_ + i]);
      if ((c & 0xC0) != 0x80) return Error("invalid UTF-8");
      code = (code << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMin[extra] || code > 0x10FFFF ||
        (code >= 0xD800 && code <= 0xDFFF)) {
      return Error("invalid UTF-8");
    }
    out->append(text_.data() + pos_, extra + 1);
    pos_ += extra + 1;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("unescaped control character in a string");
      }
      if (c != '\\') {
        if (absl::Status s = ParseUtf8(out); !s.ok()) return s;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t code = 0;
          if (absl::Status s = ParseHex4(&code); !s.ok()) return s;
          if (code >= 0xDC00 && code <= 0xDFFF) {
            return Error("lone low surrogate");
          }
          if (code >= 0xD800 && code <= 0xDBFF) {
            uint32_t low = 0;
            if (!Consume("\\u")) return Error("lone high surrogate");
            if (absl::Status s = ParseHex4(&low); !s.ok()) return s;
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error("high surrogate without a low one");
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Error("unknown escape");
      }
    }
  }

  absl::Status ParseArray(int depth, Json* out) {
    out->kind = Json::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      Json item;
      if (absl::Status s = ParseValue(depth + 1, &item); !s.ok()) return s;
      out->array.push_back(std::move(item));
      SkipSpace();
      if (Consume("]")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or ']'");
    }
  }

  absl::Status ParseObject(int depth, Json* out) {
    out->kind = Json::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a key");
      }
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      for (const auto& [existing, unused] : out->object) {
        if (existing == key) return Error(absl::StrCat("duplicate key ", key));
      }
      SkipSpace();
      if (!Consume(":")) return Error("expected ':'");
      Json value;
      if (absl::Status s = ParseValue(depth + 1, &value); !s.ok()) return s;
      out->object.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume("}")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or '}'");
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

absl::StatusOr<uint64_t> NonNegative(const Json& value,
                                     absl::string_view what) {
  if (value.kind != Json::Kind::kNumber || value.negative) {
    return Invalid(absl::StrCat(what, " is not a non-negative integer"));
  }
  return value.magnitude;
}

const Json* Field(const Json& object, absl::string_view key) {
  for (const auto& [name, value] : object.object) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsEntry> ReadEntry(const std::string& name,
                                           const Json& value) {
  const std::string where = absl::StrCat("tensor \"", name, "\"");
  if (value.kind != Json::Kind::kObject) {
    return Invalid(absl::StrCat(where, " is not an object"));
  }
  if (value.object.size() != 3) {
    return Invalid(absl::StrCat(where, " has ", value.object.size(),
                                " fields; expected dtype, shape, data_offsets"));
  }
  const Json* dtype = Field(value, "dtype");
  const Json* shape = Field(value, "shape");
  const Json* offsets = Field(value, "data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return Invalid(absl::StrCat(where, " lacks dtype, shape or data_offsets"));
  }
  SafetensorsEntry entry;
  entry.name = name;
  if (dtype->kind != Json::Kind::kString ||
      SafetensorsItemSize(dtype->string) == 0) {
    return Invalid(absl::StrCat(where, " has an unknown dtype"));
  }
  entry.dtype = dtype->string;
  if (shape->kind != Json::Kind::kArray) {
    return Invalid(absl::StrCat(where, ": shape is not an array"));
  }
  unsigned __int128 numel = 1;
  for (const Json& size : shape->array) {
    absl::StatusOr<uint64_t> s = NonNegative(size, where + " shape");
    if (!s.ok()) return s.status();
    entry.shape.push_back(*s);
    numel *= *s;
    if (numel > UINT64_MAX) numel = UINT64_MAX;  // caught below
  }
  if (offsets->kind != Json::Kind::kArray || offsets->array.size() != 2) {
    return Invalid(absl::StrCat(where, ": data_offsets is not [begin, end]"));
  }
  absl::StatusOr<uint64_t> begin = NonNegative(offsets->array[0], where);
  absl::StatusOr<uint64_t> end = NonNegative(offsets->array[1], where);
  if (!begin.ok()) return begin.status();
  if (!end.ok()) return end.status();
  if (*end < *begin) return Invalid(absl::StrCat(where, ": end < begin"));
  entry.begin = *begin;
  entry.end = *end;
  const unsigned __int128 nbytes = numel * SafetensorsItemSize(entry.dtype);
  if (nbytes != *end - *begin) {
    return Invalid(absl::StrCat(where, ": ", *end - *begin,
                                " bytes for its dtype and shape"));
  }
  return entry;
}

}  // namespace

uint32_t SafetensorsItemSize(absl::string_view dtype) {
  static const auto* sizes = new std::map<std::string, uint32_t, std::less<>>{
      {"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},
      {"I64", 8}, {"I32", 4},  {"I16", 2},     {"I8", 1},
      {"U64", 8}, {"U32", 4},  {"U16", 2},     {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes->find(dtype);
  return it == sizes->end() ? 0 : it->second;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(absl::string_view file) {
  if (file.size() < 8) return Invalid("shorter than the 8-byte length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  }
  if (n > file.size() - 8) {
    return Invalid(absl::StrCat("header length ", n, " passes the end of a ",
                                file.size(), "-byte file"));
  }
  SafetensorsContents contents;
  contents.header_length = n;
  contents.data_start = 8 + n;
  absl::string_view header = file.substr(8, n);
  if (header.empty() || header[0] != '{') {
    return Invalid("header does not start with '{'");
  }
  // Trailing spaces pad the header (to a multiple of 8 bytes).
  absl::StatusOr<Json> json = JsonParser(header).ParseDocument();
  if (!json.ok()) return json.status();
  if (json->kind != Json::Kind::kObject) {
    return Invalid("header is not a JSON object");
  }
  for (const auto& [key, value] : json->object) {
    if (key == "__metadata__") {
      if (value.kind != Json::Kind::kObject) {
        return Invalid("__metadata__ is not an object");
      }
      for (const auto& [k, v] : value.object) {
        if (v.kind != Json::Kind::kString) {
          return Invalid(absl::StrCat("__metadata__ \"", k,
                                      "\" is not a string"));
        }
        contents.metadata.emplace_back(k, v.string);
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> entry = ReadEntry(key, value);
    if (!entry.ok()) return entry.status();
    contents.tensors.push_back(std::move(*entry));
  }
  // The ranges must tile the data section.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& t : contents.tensors) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
                     return a->begin < b->begin ||
                            (a->begin == b->begin && a->end < b->end);
                   });
  uint64_t cursor = 0;
  for (const SafetensorsEntry* t : by_offset) {
    if (t->begin != cursor) {
      return Invalid(absl::StrCat("tensor \"", t->name, "\" starts at ",
                                  t->begin, ", expected ", cursor,
                                  " (a gap or an overlap)"));
    }
    cursor = t->end;
  }
  if (cursor != file.size() - contents.data_start) {
    return Invalid(absl::StrCat("the tensors cover ", cursor,
                                " bytes of a ",
                                file.size() - contents.data_start,
                                "-byte data section"));
  }
  return contents;
}

}  // namespace materializer::fuzz
