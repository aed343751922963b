#include "server/init/glob.h"

#include <bitset>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"

namespace materializer::init {
namespace {

using ByteSet = std::bitset<256>;

// Parses the class starting at pattern[p] == '['. Sets *set and *end (the
// index after ']'); false if there is no closing ']'.
bool ParseClass(absl::string_view pattern, size_t p, ByteSet* set,
                size_t* end) {
  size_t i = p + 1;
  bool negated = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negated = true;
    ++i;
  }
  ByteSet found;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    const unsigned char lo = static_cast<unsigned char>(pattern[i]);
    unsigned char hi = lo;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' &&
        pattern[i + 2] != ']') {
      hi = static_cast<unsigned char>(pattern[i + 2]);
      i += 3;
    } else {
      ++i;
    }
    for (unsigned c = lo; c <= hi; ++c) found.set(c);
  }
  if (i >= pattern.size()) return false;  // no closing ']'
  *end = i + 1;
  *set = negated ? ~found : found;
  return true;
}

// One non-star item of a pattern: a literal byte or a set.
struct Item {
  bool literal = false;
  char byte = 0;
  ByteSet set;
};

// The pattern as items, and for each state 0..items whether a star sits
// there. INVALID_ARGUMENT for an unterminated class.
absl::Status Parse(absl::string_view pattern, std::vector<Item>* items,
                   std::vector<bool>* loops) {
  loops->assign(1, false);
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '*') {
      loops->back() = true;
      ++i;
      continue;
    }
    Item item;
    if (c == '?') {
      item.set.set();
      ++i;
    } else if (c == '[') {
      size_t end = 0;
      if (!ParseClass(pattern, i, &item.set, &end)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pattern ", Quote(pattern), " has a '[' at ", i, " without a ']'"));
      }
      i = end;
    } else {
      item.literal = true;
      item.byte = c;
      item.set.set(static_cast<unsigned char>(c));
      ++i;
    }
    items->push_back(item);
    loops->push_back(false);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Glob> Glob::Compile(absl::string_view pattern) {
  if (pattern.empty()) {
    return absl::InvalidArgumentError(
        "pattern is empty; use \"*\" to match every tensor");
  }
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern ", Quote(pattern), " is ", pattern.size(),
                     " bytes; the limit is ", kMaxPatternBytes));
  }
  std::vector<Item> items;
  std::vector<bool> loops;
  if (absl::Status s = Parse(pattern, &items, &loops); !s.ok()) return s;

  Glob glob;
  const int n = static_cast<int>(items.size());
  int stars = 0;
  bool all_literal = true;
  for (int k = 0; k <= n; ++k) stars += loops[k] ? 1 : 0;
  for (const Item& item : items) all_literal = all_literal && item.literal;
  if (n == 0) {
    glob.kind_ = Kind::kAll;
    return glob;
  }
  if (all_literal && stars <= 1 && (stars == 0 || loops[0] || loops[n])) {
    for (const Item& item : items) glob.literal_.push_back(item.byte);
    glob.kind_ = stars == 0 ? Kind::kExact
                 : loops[n] ? Kind::kPrefix
                            : Kind::kSuffix;
    return glob;
  }
  glob.kind_ = Kind::kAutomaton;
  glob.items_ = n;
  glob.words_ = (n + 1 + 63) / 64;
  const int words = glob.words_;
  glob.accept_.assign(static_cast<size_t>(256) * words, 0);
  glob.loops_.assign(words, 0);
  for (int k = 0; k < n; ++k) {
    const int state = k + 1;  // reached by reading item k
    const uint64_t bit = uint64_t{1} << (state % 64);
    const Item& item = items[k];
    if (item.literal) {  // most items: one byte, no scan of the set
      glob.accept_[static_cast<unsigned char>(item.byte) * words + state / 64] |= bit;
      continue;
    }
    for (int c = 0; c < 256; ++c) {
      if (item.set.test(c)) glob.accept_[c * words + state / 64] |= bit;
    }
  }
  for (int state = 0; state <= n; ++state) {
    if (loops[state]) glob.loops_[state / 64] |= uint64_t{1} << (state % 64);
  }
  return glob;
}

bool Glob::Matches(absl::string_view name) const {
  switch (kind_) {
    case Kind::kAll:
      return true;
    case Kind::kExact:
      return name == literal_;
    case Kind::kPrefix:
      return name.size() >= literal_.size() &&
             name.substr(0, literal_.size()) == literal_;
    case Kind::kSuffix:
      return name.size() >= literal_.size() &&
             name.substr(name.size() - literal_.size()) == literal_;
    case Kind::kAutomaton:
      break;
  }
  if (name.size() < static_cast<size_t>(items_)) return false;
  if (words_ == 1) {
    const uint64_t loops = loops_[0];
    uint64_t state = 1;  // state 0: nothing read
    for (const char c : name) {
      state = ((state << 1) & accept_[static_cast<unsigned char>(c)]) |
              (state & loops);
      if (state == 0) return false;
    }
    return (state >> items_) & 1;
  }
  // Up to kMaxPatternBytes + 1 states.
  constexpr int kMaxWords = (kMaxPatternBytes + 1 + 63) / 64;
  uint64_t state[kMaxWords] = {1};
  for (const char c : name) {
    const uint64_t* accept = &accept_[static_cast<unsigned char>(c) * words_];
    uint64_t carry = 0;
    uint64_t any = 0;
    for (int w = 0; w < words_; ++w) {
      const uint64_t s = state[w];
      state[w] = (((s << 1) | carry) & accept[w]) | (s & loops_[w]);
      carry = s >> 63;
      any |= state[w];
    }
    if (any == 0) return false;
  }
  return (state[items_ / 64] >> (items_ % 64)) & 1;
}

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  absl::StatusOr<Glob> glob = Glob::Compile(pattern);
  return glob.ok() && glob->Matches(name);
}

absl::Status CheckGlob(absl::string_view pattern) {
  return Glob::Compile(pattern).status();
}

}  // namespace materializer::init
