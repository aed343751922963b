#include "server/checkpoint/json.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::checkpoint {
namespace {

void AppendUtf8(uint32_t code, std::string* out) {
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

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

absl::Status JsonReader::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON byte ", pos_, ": ", what));
}

void JsonReader::SkipSpace() {
  while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                 text_[pos_] == '\n' || text_[pos_] == '\r')) {
    ++pos_;
  }
}

bool JsonReader::Consume(char c) {
  SkipSpace();
  if (pos_ < text_.size() && text_[pos_] == c) {
    ++pos_;
    return true;
  }
  return false;
}

absl::Status JsonReader::Expect(char c, absl::string_view what) {
  if (Consume(c)) return absl::OkStatus();
  if (pos_ >= text_.size()) return Error(absl::StrCat(what, ", found the end"));
  return Error(what);
}

absl::StatusOr<JsonReader::Type> JsonReader::Peek() {
  SkipSpace();
  if (pos_ >= text_.size()) return Error("expected a value, found the end");
  const char c = text_[pos_];
  switch (c) {
    case '{': return Type::kObject;
    case '[': return Type::kArray;
    case '"': return Type::kString;
    case 't':
    case 'f': return Type::kBool;
    case 'n': return Type::kNull;
    default:
      if (c == '-' || IsDigit(c)) return Type::kNumber;
      return Error("expected a value");
  }
}

absl::Status JsonReader::Open(bool object) {
  if (levels_.size() >= kMaxJsonDepth) {
    return Error(absl::StrCat("nested deeper than ", kMaxJsonDepth));
  }
  RETURN_IF_ERROR(Expect(object ? '{' : '[',
                         object ? "expected an object" : "expected an array"));
  Level level;
  level.object = object;
  levels_.push_back(std::move(level));
  return absl::OkStatus();
}

absl::Status JsonReader::BeginObject() { return Open(true); }
absl::Status JsonReader::BeginArray() { return Open(false); }

absl::StatusOr<bool> JsonReader::NextMember(std::string* key) {
  if (levels_.empty() || !levels_.back().object) {
    return absl::InternalError("NextMember outside an object");
  }
  Level& level = levels_.back();
  if (Consume('}')) {
    levels_.pop_back();
    return false;
  }
  if (!level.first) RETURN_IF_ERROR(Expect(',', "expected ',' or '}'"));
  level.first = false;
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"') {
    return Error("expected a key");
  }
  const size_t key_at = pos_;
  key->clear();
  RETURN_IF_ERROR(ParseString(key));
  if (!level.keys.insert(*key).second) {
    pos_ = key_at;
    return Error(absl::StrCat("duplicate key ", Quote(*key)));
  }
  RETURN_IF_ERROR(Expect(':', "expected ':'"));
  return true;
}

absl::StatusOr<bool> JsonReader::NextElement() {
  if (levels_.empty() || levels_.back().object) {
    return absl::InternalError("NextElement outside an array");
  }
  Level& level = levels_.back();
  if (Consume(']')) {
    levels_.pop_back();
    return false;
  }
  if (!level.first) RETURN_IF_ERROR(Expect(',', "expected ',' or ']'"));
  level.first = false;
  return true;
}

absl::Status JsonReader::ParseHex4(uint32_t* out) {
  if (text_.size() - pos_ < 4) return Error("short \\u escape");
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

absl::Status JsonReader::ParseUtf8(std::string* out) {
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
  if (text_.size() - pos_ <= static_cast<size_t>(extra)) {
    return Error("truncated UTF-8");
  }
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

absl::Status JsonReader::ParseString(std::string* out) {
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
      // Runs of plain ASCII at once; other bytes one sequence at a time.
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] != '"' &&
             text_[pos_] != '\\' &&
             static_cast<unsigned char>(text_[pos_]) >= 0x20 &&
             static_cast<unsigned char>(text_[pos_]) < 0x80) {
        ++pos_;
      }
      out->append(text_.data() + start, pos_ - start);
      if (pos_ < text_.size() &&
          static_cast<unsigned char>(text_[pos_]) >= 0x80) {
        RETURN_IF_ERROR(ParseUtf8(out));
      }
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
        RETURN_IF_ERROR(ParseHex4(&code));
        if (code >= 0xDC00 && code <= 0xDFFF) {
          return Error("lone low surrogate");
        }
        if (code >= 0xD800 && code <= 0xDBFF) {
          uint32_t low = 0;
          if (text_.substr(pos_, 2) != "\\u") {
            return Error("lone high surrogate");
          }
          pos_ += 2;
          RETURN_IF_ERROR(ParseHex4(&low));
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

absl::StatusOr<std::string> JsonReader::ReadString() {
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"') {
    return Error("expected a string");
  }
  std::string out;
  RETURN_IF_ERROR(ParseString(&out));
  return out;
}

absl::StatusOr<JsonNumber> JsonReader::ReadNumber() {
  SkipSpace();
  JsonNumber number;
  if (pos_ < text_.size() && text_[pos_] == '-') {
    number.negative = true;
    ++pos_;
  }
  const size_t start = pos_;
  bool fits = true;
  while (pos_ < text_.size() && IsDigit(text_[pos_])) {
    const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
    if (number.magnitude > (UINT64_MAX - digit) / 10) fits = false;
    if (fits) number.magnitude = number.magnitude * 10 + digit;
    ++pos_;
  }
  if (pos_ == start) return Error("expected a number");
  if (text_[start] == '0' && pos_ - start > 1) {
    return Error("number with a leading zero");
  }
  bool integer = true;
  if (pos_ < text_.size() && text_[pos_] == '.') {
    integer = false;
    ++pos_;
    const size_t digits = pos_;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    if (pos_ == digits) return Error("no digits after '.'");
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    integer = false;
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      ++pos_;
    }
    const size_t digits = pos_;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    if (pos_ == digits) return Error("no digits in an exponent");
  }
  number.integer = integer && fits;
  if (!number.integer) number.magnitude = 0;
  return number;
}

absl::StatusOr<bool> JsonReader::ReadBool() {
  SkipSpace();
  if (text_.substr(pos_, 4) == "true") {
    pos_ += 4;
    return true;
  }
  if (text_.substr(pos_, 5) == "false") {
    pos_ += 5;
    return false;
  }
  return Error("expected true or false");
}

absl::Status JsonReader::ReadNull() {
  SkipSpace();
  if (text_.substr(pos_, 4) != "null") return Error("expected null");
  pos_ += 4;
  return absl::OkStatus();
}

absl::Status JsonReader::SkipValue() {
  ASSIGN_OR_RETURN(const Type type, Peek());
  switch (type) {
    case Type::kObject: {
      RETURN_IF_ERROR(BeginObject());
      std::string key;
      while (true) {
        ASSIGN_OR_RETURN(const bool more, NextMember(&key));
        if (!more) return absl::OkStatus();
        RETURN_IF_ERROR(SkipValue());
      }
    }
    case Type::kArray: {
      RETURN_IF_ERROR(BeginArray());
      while (true) {
        ASSIGN_OR_RETURN(const bool more, NextElement());
        if (!more) return absl::OkStatus();
        RETURN_IF_ERROR(SkipValue());
      }
    }
    case Type::kString:
      return ReadString().status();
    case Type::kNumber:
      return ReadNumber().status();
    case Type::kBool:
      return ReadBool().status();
    case Type::kNull:
      return ReadNull();
  }
  return absl::InternalError("unknown JSON type");
}

absl::Status JsonReader::ExpectEnd() {
  SkipSpace();
  if (!levels_.empty()) return Error("unterminated object or array");
  if (pos_ != text_.size()) return Error("text after the JSON value");
  return absl::OkStatus();
}

}  // namespace materializer::checkpoint
