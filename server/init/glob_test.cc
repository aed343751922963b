#include "server/init/glob.h"

#include "gtest/gtest.h"

namespace materializer::init {
namespace {

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

TEST(CheckGlobTest, RejectsEmptyAndUnterminatedClass) {
  EXPECT_TRUE(CheckGlob("*.weight").ok());
  EXPECT_TRUE(CheckGlob("[ab]").ok());
  EXPECT_FALSE(CheckGlob("").ok());
  EXPECT_FALSE(CheckGlob("h.[0-3.w").ok());
}

}  // namespace
}  // namespace materializer::init
