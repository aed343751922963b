#include "server/init/glob.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace materializer::init {
namespace {

// The definition, as a dynamic program over (pattern, name) prefixes:
// slow, obviously right, and the reference for the compiled matcher.
bool ReferenceMatch(const std::string& p, const std::string& s) {
  // Items of p: '*', '?', a class (as its accepted bytes) or a literal.
  struct Item {
    bool star = false;
    std::vector<bool> accepts = std::vector<bool>(256, false);
  };
  std::vector<Item> items;
  for (size_t i = 0; i < p.size();) {
    Item item;
    if (p[i] == '*') {
      item.star = true;
      ++i;
    } else if (p[i] == '?') {
      item.accepts.assign(256, true);
      ++i;
    } else if (p[i] == '[') {
      size_t j = i + 1;
      bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
      if (negate) ++j;
      std::vector<bool> in(256, false);
      bool first = true;
      while (j < p.size() && (first || p[j] != ']')) {
        first = false;
        unsigned char lo = p[j], hi = p[j];
        if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
          hi = p[j + 2];
          j += 3;
        } else {
          ++j;
        }
        for (unsigned c = lo; c <= hi; ++c) in[c] = true;
      }
      if (j >= p.size()) return false;  // does not compile
      for (int c = 0; c < 256; ++c) item.accepts[c] = in[c] != negate;
      i = j + 1;
    } else {
      item.accepts[static_cast<unsigned char>(p[i])] = true;
      ++i;
    }
    items.push_back(item);
  }
  // can[k][j]: items[0..k) match s[0..j).
  std::vector<std::vector<bool>> can(
      items.size() + 1, std::vector<bool>(s.size() + 1, false));
  can[0][0] = true;
  for (size_t k = 1; k <= items.size(); ++k) {
    for (size_t j = 0; j <= s.size(); ++j) {
      const Item& item = items[k - 1];
      if (item.star) {
        can[k][j] = can[k - 1][j] || (j > 0 && can[k][j - 1]);
      } else {
        can[k][j] = j > 0 && can[k - 1][j - 1] &&
                    item.accepts[static_cast<unsigned char>(s[j - 1])];
      }
    }
  }
  return can[items.size()][s.size()];
}

TEST(GlobMatchTest, StarCrossesDots) {
  EXPECT_TRUE(GlobMatch("*", "a.b.c"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("*.bias", "h.0.attn.bias"));
  EXPECT_FALSE(GlobMatch("*.bias", "h.0.attn.bias_scale"));
  EXPECT_TRUE(GlobMatch("h.*.attn.*", "h.11.attn.c_proj.weight"));
  EXPECT_TRUE(GlobMatch("*attn*", "h.0.attn.bias"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXXbYYbZZc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXXbYYbZZ"));
}

TEST(GlobMatchTest, LiteralsMustMatchWholeName) {
  EXPECT_TRUE(GlobMatch("wte.weight", "wte.weight"));
  EXPECT_FALSE(GlobMatch("wte.weight", "wte.weight2"));
  EXPECT_FALSE(GlobMatch("wte", "wte.weight"));
}

TEST(GlobMatchTest, QuestionMarkIsOneCharacter) {
  EXPECT_TRUE(GlobMatch("ln_?.weight", "ln_1.weight"));
  EXPECT_FALSE(GlobMatch("ln_?.weight", "ln_12.weight"));
  EXPECT_FALSE(GlobMatch("?", ""));
}

TEST(GlobMatchTest, CharacterClasses) {
  EXPECT_TRUE(GlobMatch("h.[0-3].w", "h.2.w"));
  EXPECT_FALSE(GlobMatch("h.[0-3].w", "h.4.w"));
  EXPECT_TRUE(GlobMatch("[!a]x", "bx"));
  EXPECT_FALSE(GlobMatch("[!a]x", "ax"));
  EXPECT_TRUE(GlobMatch("[^a]x", "bx"));
  EXPECT_TRUE(GlobMatch("[qkv]_proj", "k_proj"));
  EXPECT_FALSE(GlobMatch("[qkv]_proj", "o_proj"));
  EXPECT_TRUE(GlobMatch("[]]", "]"));
}

TEST(GlobMatchTest, PathologicalPatternStaysFast) {
  const std::string name(5000, 'a');
  EXPECT_FALSE(GlobMatch("*a*a*a*a*a*a*a*a*b", name));
}

TEST(GlobTest, AgreesWithTheDefinitionOnRandomPatterns) {
  std::mt19937 rng(7);
  const std::string atoms = "ab.*?";
  const std::vector<std::string> classes = {"[ab]", "[!a]", "[a-c]", "[]]",
                                            "[^.]"};
  int matched = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string pattern;
    const int len = 1 + rng() % 8;
    for (int i = 0; i < len; ++i) {
      if (rng() % 5 == 0) {
        pattern += classes[rng() % classes.size()];
      } else {
        pattern += atoms[rng() % atoms.size()];
      }
    }
    std::string name;
    const int n = rng() % 10;
    for (int i = 0; i < n; ++i) name += "ab.c]"[rng() % 5];
    absl::StatusOr<Glob> glob = Glob::Compile(pattern);
    ASSERT_TRUE(glob.ok()) << pattern;
    const bool expected = ReferenceMatch(pattern, name);
    EXPECT_EQ(glob->Matches(name), expected) << pattern << " vs " << name;
    matched += expected;
  }
  EXPECT_GT(matched, 1000);  // the rounds exercise both answers
}

TEST(GlobTest, ManyStatesUseSeveralWords) {
  // 300 items: 5 words per state set, carries across word boundaries.
  std::string pattern;
  std::string name;
  for (int i = 0; i < 150; ++i) {
    pattern += "a?";
    name += "ab";
  }
  pattern = "*" + pattern + "*";
  absl::StatusOr<Glob> glob = Glob::Compile(pattern);
  ASSERT_TRUE(glob.ok());
  EXPECT_EQ(glob->words(), 5);
  EXPECT_TRUE(glob->Matches("xx" + name + "yy"));
  EXPECT_EQ(glob->Matches(name.substr(0, 299) + "c"),
            ReferenceMatch(pattern, name.substr(0, 299) + "c"));
  EXPECT_FALSE(glob->Matches(name.substr(1)));
}

TEST(GlobTest, HostilePatternsAreRefusedOrCheap) {
  // A class of 2 MiB: refused by size, with a bounded message.
  const std::string hostile = "*[" + std::string(2 << 20, 'b') + "]c";
  absl::Status s = CheckGlob(hostile);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bytes; the limit is 512"), std::string::npos);
  EXPECT_LT(s.message().size(), 400u);
  // The same shape within the limit compiles and matches long names
  // (here 100,000 bytes: far past the name limit) in one pass.
  absl::StatusOr<Glob> glob =
      Glob::Compile("*[" + std::string(500, 'b') + "]c");
  ASSERT_TRUE(glob.ok());
  const std::string name(100000, 'a');
  EXPECT_FALSE(glob->Matches(name));
  EXPECT_TRUE(glob->Matches(name + "bc"));
}

TEST(GlobTest, FastPathsAgreeWithTheAutomaton) {
  for (const char* pattern : {"*.bias", "h.0.*", "wte.weight", "*", "**"}) {
    absl::StatusOr<Glob> glob = Glob::Compile(pattern);
    ASSERT_TRUE(glob.ok());
    for (const char* name :
         {"h.0.bias", "h.0.attn", "wte.weight", "", "h.0.", ".bias"}) {
      EXPECT_EQ(glob->Matches(name), ReferenceMatch(pattern, name))
          << pattern << " vs " << name;
    }
  }
}

TEST(CheckGlobTest, RejectsEmptyAndUnterminatedClass) {
  EXPECT_TRUE(CheckGlob("*.weight").ok());
  EXPECT_TRUE(CheckGlob("[ab]").ok());
  EXPECT_FALSE(CheckGlob("").ok());
  EXPECT_FALSE(CheckGlob("h.[0-3.w").ok());
}

}  // namespace
}  // namespace materializer::init
