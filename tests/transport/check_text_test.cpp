// The HTTP API's plain check path (transport/check_text.h) against the general one: a body the
// plain reader takes means exactly what nlohmann's document of it says (random bodies of the
// plain shape, bent in the ways a client bends them), every body it must leave to the general
// reader is left, and the plain answer is byte for byte the document's dump.
#include "transport/check_text.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "server/json_text.h"

namespace sluice::transport {
namespace {

using nlohmann::json;

// What the general reader makes of `body` when it is a plain check: nullopt otherwise (not an
// object, another field, a value of another type, a negative number).
std::optional<server::CheckCall> general(const std::string& body, json& doc) {
  doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
  server::CheckCall c;
  for (const auto& [name, value] : doc.items()) {
    if (name == "policy" && value.is_string()) {
      c.policy = value.get_ref<const std::string&>();
    } else if (name == "key" && value.is_string()) {
      c.key = value.get_ref<const std::string&>();
    } else if (name == "hits" && value.is_number_integer() && !value.is_number_float()) {
      if (value.is_number_unsigned() &&
          value.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        return std::nullopt;
      c.hits = value.get<std::int64_t>();
    } else {
      return std::nullopt;
    }
  }
  return c;
}

void expect_same(const std::string& body) {
  const std::optional<server::CheckCall> plain = plain_check_body(body);
  if (!plain) return;  // left to the general reader: always safe
  json doc;
  const std::optional<server::CheckCall> want = general(body, doc);
  ASSERT_TRUE(want) << "taken by the plain reader, but not a plain check: " << body;
  EXPECT_EQ(plain->policy, want->policy) << body;
  EXPECT_EQ(plain->key, want->key) << body;
  EXPECT_EQ(plain->hits, want->hits) << body;
}

TEST(PlainCheckBody, TakesThePlainShapeInAnyOrderWithJsonSpace) {
  const auto c = plain_check_body(R"({"policy":"api","key":"user-1","hits":3})");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->policy, "api");
  EXPECT_EQ(c->key, "user-1");
  EXPECT_EQ(c->hits, 3);
  const auto d = plain_check_body(" \r\n{ \"hits\" :\t12 , \"key\":\"\" ,\"policy\" : \"p\" }\n");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->policy, "p");
  EXPECT_EQ(d->key, "");
  EXPECT_EQ(d->hits, 12);
  const auto e = plain_check_body("{}");  // every field absent: the general defaults
  ASSERT_TRUE(e);
  EXPECT_EQ(e->policy, "");
  EXPECT_EQ(e->hits, 1);
  for (const char* b : {R"({"policy":"api","key":"user-1","hits":3})", "{}", R"({"hits":0})",
                        R"({"hits":9223372036854775807})"})
    expect_same(b);
}

TEST(PlainCheckBody, LeavesEveryOtherBodyToTheGeneralReader) {
  const std::vector<std::string> others = {
      "",
      "[]",
      "null",
      R"("policy")",
      R"({"policy":"api",})",              // a trailing comma: not JSON
      R"({"policy":"api"} x)",             // bytes after the object
      R"({"policy":"api"}{})",             // two documents
      R"({"policy":"api","policy":"b"})",  // a key twice: the general reader names it
      R"({"key":"a","key":"a"})",
      R"({"hits":1,"hits":2})",
      R"({"policy":"api","ttl":5})",  // another field: named as unknown
      R"({"Policy":"api"})",
      R"({"policy":null})",
      R"({"policy":1})",
      R"({"key":["a"]})",
      R"({"key":{"a":"b"}})",
      R"({"key":"a\"b"})",  // an escape
      R"({"key":"a\u0041"})",
      R"({"key":"caf\u00e9"})",
      "{\"key\":\"caf\xc3\xa9\"}",  // UTF-8: validated by the general reader
      "{\"key\":\"\xff\"}",         // not UTF-8
      "{\"key\":\"a\tb\"}",         // a control character: not JSON
      "{\"key\":\"a\x7f\"}",
      R"({"hits":-1})",  // negative: the engine's error, through Fields
      R"({"hits":1.0})",
      R"({"hits":1e3})",
      R"({"hits":1E3})",
      R"({"hits":01})",  // a leading zero: not JSON
      R"({"hits":+1})",
      R"({"hits":"1"})",
      R"({"hits":true})",
      R"({"hits":9223372036854775808})",  // past INT64_MAX: its own error
      R"({"hits":99999999999999999999999})",
      R"({"key":"a")",  // unterminated
      R"({"key":"a)",
      R"({"key")",
      R"({"key":})",
      R"({,})",
      R"({"key":"a",})",
      std::string("{\"key\":\"a\"}\0", 12),  // a NUL after the object
  };
  for (const std::string& b : others) EXPECT_FALSE(plain_check_body(b)) << "taken: " << b;
}

// A body of the plain shape, its fields in any order, some absent, with space anywhere JSON
// allows; then possibly bent by one edit (a byte replaced, inserted or removed).
rc::Gen<std::string> bodies() {
  const auto space = rc::gen::container<std::string>(rc::gen::element(' ', '\t', '\n', '\r'));
  const auto text = rc::gen::container<std::string>(
      rc::gen::element('a', 'Z', '0', '-', '_', '.', ' ', '"', '\\', '/', 'u', '\xc3', '\xa9'));
  const auto number = rc::gen::oneOf(
      rc::gen::map(rc::gen::inRange<std::int64_t>(0, 1'000'000),
                   [](std::int64_t v) { return std::to_string(v); }),
      rc::gen::element<std::string>("-1", "0", "00", "1.5", "2e2", "9223372036854775807",
                                    "9223372036854775808", "true", "null", "\"3\""));
  return rc::gen::exec([=] {
    std::vector<std::string> members;
    if (*rc::gen::arbitrary<bool>())
      members.push_back("\"policy\"" + *space + ":" + *space + "\"" + *text + "\"");
    if (*rc::gen::arbitrary<bool>())
      members.push_back("\"key\"" + *space + ":" + *space + "\"" + *text + "\"");
    if (*rc::gen::arbitrary<bool>()) members.push_back("\"hits\"" + *space + ":" + *number);
    if (*rc::gen::inRange(0, 8) == 0) members.push_back(R"("key":"twice")");
    if (*rc::gen::inRange(0, 8) == 0) members.push_back(R"("other":1)");
    if (!members.empty())  // in another order
      std::rotate(members.begin(),
                  members.begin() + *rc::gen::inRange<std::ptrdiff_t>(
                                        0, static_cast<std::ptrdiff_t>(members.size())),
                  members.end());
    if (*rc::gen::arbitrary<bool>()) std::reverse(members.begin(), members.end());
    std::string body = *space + "{";
    for (std::size_t i = 0; i < members.size(); ++i)
      body += (i ? "," + *space : *space) + members[i] + *space;
    body += "}" + *space;
    switch (*rc::gen::inRange(0, 4)) {
      case 0: {
        const auto at = *rc::gen::inRange<std::size_t>(0, body.size());
        body[at] = *rc::gen::element('{', '}', '"', ',', ':', '\\', '1', 'x', '\0');
        break;
      }
      case 1:
        body.insert(*rc::gen::inRange<std::size_t>(0, body.size() + 1), 1,
                    *rc::gen::element('{', '}', '"', ',', ':', '\\', '-', '.', ' '));
        break;
      case 2:
        body.erase(*rc::gen::inRange<std::size_t>(0, body.size()), 1);
        break;
      default:
        break;
    }
    return body;
  });
}

RC_GTEST_PROP(PlainCheckBodyProperty, TakesOnlyWhatTheDocumentSays, ()) {
  const std::string body = *bodies();
  const std::optional<server::CheckCall> plain = plain_check_body(body);
  if (!plain) return;
  json doc;
  const std::optional<server::CheckCall> want = general(body, doc);
  RC_ASSERT(want.has_value());
  RC_ASSERT(plain->policy == want->policy);
  RC_ASSERT(plain->key == want->key);
  RC_ASSERT(plain->hits == want->hits);
}

TEST(CheckDecisionText, IsTheDocumentsDumpByteForByte) {
  const std::vector<Nanos> times = {Nanos{0},
                                    Nanos{1},
                                    Nanos{999},
                                    Nanos{1'000'000},
                                    Nanos{1'500'000},
                                    Nanos{123'456'789},
                                    Nanos{86'400'000'000'000},
                                    Nanos{std::numeric_limits<std::int64_t>::max()}};
  for (const Nanos reset : times)
    for (const Nanos retry : times)
      for (const bool allowed : {true, false})
        for (const bool would_deny : {false, true})
          for (const std::string_view reason :
               {std::string_view{}, std::string_view{"budget_spent"}})
            for (const std::string detail : {"", "over \"its\" limit"}) {
              RateDecision d;
              d.allowed = allowed;
              d.would_deny = would_deny;
              d.limit = allowed ? 1'000'000'000 : 0;
              d.remaining = allowed ? 18'446'744'073'709'551'615ULL : 7;
              d.reset_after = reset;
              d.retry_after = retry == times.back() ? Nanos::max() : retry;
              d.reason = reason;
              json j = decision_json(d);
              if (!detail.empty()) j["detail"] = detail;
              EXPECT_EQ(check_decision_text(d, detail), server::json_text(j));
            }
}

RC_GTEST_PROP(CheckDecisionTextProperty, AnAllowedDecisionIsTheDocumentsDump, ()) {
  RateDecision d;
  d.allowed = true;
  d.limit = *rc::gen::arbitrary<std::uint64_t>();
  d.remaining = *rc::gen::arbitrary<std::uint64_t>();
  d.reset_after = Nanos{*rc::gen::arbitrary<std::int64_t>()};
  RC_ASSERT(check_decision_text(d, "") == server::json_text(decision_json(d)));
}

}  // namespace
}  // namespace sluice::transport
