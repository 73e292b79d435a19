// The rate limit fields of an HTTP answer (server/rate_headers.h): the draft's structured
// fields, the older X-RateLimit-* ones, Retry-After, and how names and seconds are written.
#include "server/rate_headers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

NameValues headers(RateLimitHeaders which, const std::vector<QuotaState>& limits,
                   std::optional<Nanos> retry = std::nullopt) {
  NameValues out;
  add_rate_limit_headers(which, limits, retry, out);
  return out;
}

QuotaState quota(std::string_view name, std::uint64_t q, std::optional<Nanos> w,
                 std::uint64_t remaining, Nanos reset) {
  QuotaState s;
  s.name = name;
  s.quota = q;
  s.window = w;
  s.remaining = remaining;
  s.reset = reset;
  return s;
}

TEST(RateHeaders, StructuredFieldStringsAndSeconds) {
  EXPECT_EQ(sf_string("api"), "\"api\"");
  EXPECT_EQ(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(sf_string("caf\xc3\xa9\t"), "\"caf???\"");
  EXPECT_EQ(ceil_seconds(Nanos{0}), 0U);
  EXPECT_EQ(ceil_seconds(Nanos{1}), 1U);
  EXPECT_EQ(ceil_seconds(seconds(2)), 2U);
  EXPECT_EQ(ceil_seconds(milliseconds(2001)), 3U);
  EXPECT_EQ(ceil_seconds(Nanos{-5}), 0U);
}

TEST(RateHeaders, TheDraftsFieldsListEveryLimit) {
  const std::vector<QuotaState> limits{quota("permin", 50, seconds(60), 10, milliseconds(12'500)),
                                       quota("perday", 1000, seconds(86400), 3, seconds(7200))};
  EXPECT_EQ(headers(RateLimitHeaders::kIetf, limits),
            (NameValues{{"RateLimit-Policy", "\"permin\";q=50;w=60, \"perday\";q=1000;w=86400"},
                        {"RateLimit", "\"permin\";r=10;t=13, \"perday\";r=3;t=7200"}}));
  // No window known: no w.
  EXPECT_EQ(headers(RateLimitHeaders::kIetf, {quota("p", 5, std::nullopt, 5, Nanos{0})})[0].second,
            "\"p\";q=5");
}

TEST(RateHeaders, OlderFieldsNameTheLimitWithLeastLeft) {
  const std::vector<QuotaState> limits{quota("a", 50, seconds(60), 10, seconds(30)),
                                       quota("b", 1000, seconds(86400), 3, seconds(7200))};
  EXPECT_EQ(headers(RateLimitHeaders::kXRateLimit, limits),
            (NameValues{{"X-RateLimit-Limit", "1000"},
                        {"X-RateLimit-Remaining", "3"},
                        {"X-RateLimit-Reset", "7200"}}));
  EXPECT_EQ(headers(RateLimitHeaders::kBoth, limits).size(), 5U);
  EXPECT_TRUE(headers(RateLimitHeaders::kNone, limits).empty());
}

TEST(RateHeaders, RetryAfterWhateverTheChoiceAndNeverForever) {
  EXPECT_EQ(headers(RateLimitHeaders::kNone, {}, milliseconds(1500)),
            (NameValues{{"Retry-After", "2"}}));
  EXPECT_TRUE(headers(RateLimitHeaders::kNone, {}, Nanos::max()).empty());
  EXPECT_EQ(rate_limit_headers_named("x-ratelimit"), RateLimitHeaders::kXRateLimit);
  EXPECT_EQ(rate_limit_headers_named("X-RateLimit"), std::nullopt);
}

}  // namespace
}  // namespace sluice::server
