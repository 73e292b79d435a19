// api::why_undecodable and api::mistyped_field: the field a refused message names.
#include "api/decode_errors.h"

#include <gtest/gtest.h>

#include <string>

#include "sluice/v1/sluice.pb.h"

namespace sluice::api {
namespace {

// Field `number` as length-delimited bytes.
std::string bytes_field(int number, const std::string& value) {
  return std::string(1, static_cast<char>(number << 3 | 2)) +
         std::string(1, static_cast<char>(value.size())) + value;
}

TEST(DecodeErrors, NamesATopLevelStringThatIsNotUtf8) {
  const std::string in = bytes_field(1, "\xff");
  v1::ThrottlerCheckRequest m;
  ASSERT_FALSE(m.ParseFromString(in));
  EXPECT_EQ(why_undecodable(*v1::ThrottlerCheckRequest::descriptor(), in), "app: not valid UTF-8");
}

TEST(DecodeErrors, NamesTheEntryOfARepeatedMessage) {
  // checks[0] is fine, checks[1].key (field 2 of CheckRequest) is not UTF-8 (a lone surrogate).
  const std::string in = bytes_field(1, bytes_field(1, "p") + bytes_field(2, "k")) +
                         bytes_field(1, bytes_field(1, "p") + bytes_field(2, "\xed\xa0\x80"));
  v1::CheckManyRequest m;
  ASSERT_FALSE(m.ParseFromString(in));
  EXPECT_EQ(why_undecodable(*v1::CheckManyRequest::descriptor(), in),
            "checks[1].key: not valid UTF-8");
}

TEST(DecodeErrors, BytesThatAreNotTheMessageSaySo) {
  EXPECT_EQ(why_undecodable(*v1::CheckRequest::descriptor(),
                            "\x0a\x05"
                            "ab"),
            "request: cannot be decoded as sluice.v1.CheckRequest");
}

TEST(DecodeErrors, AFieldWithTheWrongWireTypeIsNamed) {
  v1::ThrottlerCheckRequest m;
  ASSERT_TRUE(m.ParseFromString(std::string("\x08\x01", 2)));  // app (a string) as a varint
  EXPECT_EQ(mistyped_field(m), "app: wrong wire type");
  ASSERT_TRUE(m.ParseFromString(bytes_field(1, "ok") + std::string("\xf8\x01\x01", 3)));
  EXPECT_EQ(mistyped_field(m), "") << "a field this version does not know is not mistyped";
}

}  // namespace
}  // namespace sluice::api
