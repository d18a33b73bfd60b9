// UTF-8 validation, GPT-2's byte-level alphabet and from_utf8_lossy's replacement (utf8.h).
#include "sshsdp/text/utf8.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace sshsdp {
namespace {

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FirstInvalidUtf8("plain \u00e9\u4e2d\U0001F680"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("ab\x80"), 2u);            // stray continuation
  EXPECT_EQ(FirstInvalidUtf8("\xC0\xAF"), 0u);          // overlong
  EXPECT_EQ(FirstInvalidUtf8("x\xED\xA0\x80"), 1u);     // surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xE4\xB8"), 0u);          // truncated
}

TEST(Utf8, ByteLevelAlphabetIsGpt2s) {
  EXPECT_EQ(ToByteLevel(" "), "\u0120");   // Ġ
  EXPECT_EQ(ToByteLevel("\n"), "\u010A");  // Ċ
  EXPECT_EQ(ToByteLevel("A~!"), "A~!");
  EXPECT_EQ(ByteLevelChar(0xAD), "\u0143");  // soft hyphen: the last extra
  std::set<std::string> all;
  for (int b = 0; b < 256; ++b) all.insert(ByteLevelChar(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
  std::string every, back;
  for (int b = 0; b < 256; ++b) every.push_back(static_cast<char>(b));
  AppendFromByteLevel(ToByteLevel(every), &back);
  EXPECT_EQ(back, every);
  back.clear();
  AppendFromByteLevel("<|im start|>", &back);  // a space is not in the alphabet: raw bytes
  EXPECT_EQ(back, "<|im start|>");
}

TEST(Utf8, LossyReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("a\xF0\x9F\x9A"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");  // one U+FFFD for 3 bytes
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, CompletePrefixHoldsBackAnUnfinishedCharacter) {
  EXPECT_EQ(Utf8CompletePrefix("ab"), 2u);
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x9A"), 1u);      // 3 of a 4-byte character
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x9A\x80"), 5u);  // finished
  EXPECT_EQ(Utf8CompletePrefix("a\xC3"), 1u);
  EXPECT_EQ(Utf8CompletePrefix("a\x80"), 2u);  // invalid, not unfinished
}

}  // namespace
}  // namespace sshsdp
