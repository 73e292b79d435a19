// text.h: well-formed UTF-8 told from the rest, and repaired with U+FFFD; host:port text read.
#include "sluice/core/text.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

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

namespace sluice {
namespace {

TEST(HostPortText, NamesIPv4AndBracketedIPv6WithTheirPorts) {
  HostPort hp;
  EXPECT_EQ(parse_host_port("db.internal:6379", hp), "");
  EXPECT_EQ(hp.host, "db.internal");
  EXPECT_EQ(hp.port, 6379);
  EXPECT_EQ(parse_host_port("[::1]:7070", hp), "");
  EXPECT_EQ(hp.host, "::1");  // without its brackets: what a socket or a client library takes
  EXPECT_EQ(hp.port, 7070);
  EXPECT_EQ(parse_host_port("0.0.0.0:0", hp, /*min_port=*/0), "");
  EXPECT_EQ(hp.port, 0);
  // An optional port: the default when absent, checked when given.
  EXPECT_EQ(parse_host_port("replica-1", hp, 1, 3306), "");
  EXPECT_EQ(hp.port, 3306);
  EXPECT_EQ(parse_host_port("[fe80::1]", hp, 1, 5432), "");
  EXPECT_EQ(hp.host, "fe80::1");
  EXPECT_EQ(hp.port, 5432);
}

TEST(HostPortText, EachMalformedAddressIsRefusedSayingWhyAndLeavesTheOutputAlone) {
  HostPort hp{"kept", 1};
  const std::pair<const char*, const char*> cases[] = {
      {"127.0.0.1", "'127.0.0.1': the port must be 1..65535"},  // required
      {"127.0.0.1:", "'127.0.0.1:': the port must be 1..65535"},
      {"127.0.0.1:0", "'127.0.0.1:0': the port must be 1..65535"},
      {"127.0.0.1:65536", "'127.0.0.1:65536': the port must be 1..65535"},
      {"127.0.0.1:99999", "'127.0.0.1:99999': the port must be 1..65535"},
      {"127.0.0.1:80x", "'127.0.0.1:80x': the port must be 1..65535"},
      {"127.0.0.1:-1", "'127.0.0.1:-1': the port must be 1..65535"},
      {":80", "':80': no host"},
      {"[]:80", "'[]:80': no host"},
      {"::1:80", "'::1:80': an IPv6 address goes in brackets"},
      {"[::1:80", "'[::1:80': an unclosed '['"},
      {"[::1]80", "'[::1]80': expected ':' after ']'"},
  };
  for (const auto& [text, why] : cases) {
    EXPECT_EQ(parse_host_port(text, hp), why) << text;
    EXPECT_EQ(hp.host, "kept") << text;
  }
  EXPECT_EQ(parse_host_port("h:0", hp, 1, 80), "'h:0': the port must be 1..65535");
  EXPECT_EQ(parse_host_port("h:1", hp, 2), "'h:1': the port must be 2..65535");
}

}  // namespace
}  // namespace sluice
