// text.h: well-formed UTF-8 told from the rest, and repaired with U+FFFD.
#include "sluice/text.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

TEST(Text, WellFormedUtf8IsToldFromTheRest) {
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("plain ascii"));
  EXPECT_TRUE(is_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // 2, 3 and 4 bytes
  EXPECT_TRUE(is_utf8("\xf4\x8f\xbf\xbf"));                      // U+10FFFF, the last
  EXPECT_EQ(first_non_utf8("ab\xff"), 2u);
  EXPECT_EQ(first_non_utf8("\xc0\xaf"), 0u);          // an overlong '/'
  EXPECT_EQ(first_non_utf8("\xe0\x80\xaf"), 0u);      // overlong in 3 bytes
  EXPECT_EQ(first_non_utf8("x\xed\xa0\x80"), 1u);     // a surrogate
  EXPECT_EQ(first_non_utf8("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(first_non_utf8("\xe2\x82"), 0u);          // cut short
  EXPECT_EQ(first_non_utf8("\xc3\x28"), 0u);          // a continuation that is not one
  EXPECT_EQ(first_non_utf8("\x80"), 0u);              // a lone continuation
}

TEST(Text, EachByteThatBeginsNoCharacterBecomesOneReplacement) {
  EXPECT_EQ(utf8_or_replaced("ok"), "ok");
  EXPECT_EQ(utf8_or_replaced("a\xff"
                             "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(utf8_or_replaced("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(utf8_or_replaced("\xc3\xa9\xfe"), "\xc3\xa9\xef\xbf\xbd");
  EXPECT_TRUE(is_utf8(utf8_or_replaced("\xc0\xaf\xed\xa0\x80\xf8")));
}

}  // namespace
}  // namespace sluice
