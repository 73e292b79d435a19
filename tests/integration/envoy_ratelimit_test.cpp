// The envoy_ratelimit kind through the engine: every example of envoyproxy/ratelimit's README
// (its config unchanged, a request, the answer it documents), then what sluice adds or decides
// differently (refused requests cost nothing, hits_addend, overrides, shadow mode, reload
// keeping counters), and the errors a request or a rule file gets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "server/engine.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

namespace pb = envoy::service::ratelimit::v3;
using Code = pb::RateLimitResponse::Code;
using Unit = pb::RateLimitResponse::RateLimit::Unit;
using std::chrono::hours;
using std::chrono::seconds;

constexpr const char* kMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
constexpr Code kOk = pb::RateLimitResponse::OK;
constexpr Code kOver = pb::RateLimitResponse::OVER_LIMIT;

using Entries = std::vector<std::pair<std::string, std::string>>;

struct Descriptor {
  Descriptor(Entries e) : entries(std::move(e)) {}  // NOLINT(google-explicit-constructor)
  Descriptor(Entries e, std::uint64_t h) : entries(std::move(e)), hits(h) {}
  Entries entries;
  std::optional<std::uint64_t> hits;
};

// A caller that waits when the policy defers (a shared limit waiting for a lease).
class WaitingDeferral final : public Deferral<std::string> {
 public:
  Completion<std::string> defer() override {
    deferred = true;
    return shot_.setter();
  }
  StatusOr<std::string> wait() { return shot_.get(); }
  bool deferred = false;

 private:
  OneShot<StatusOr<std::string>> shot_;
};

class EnvoyRateLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-rls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    engine_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }
  std::string config(const std::string& rules_path, const std::string& extra = "") {
    return "policies:\n  edge:\n    kind: envoy_ratelimit\n    config: " + rules_path + "\n" +
           extra;
  }
  // Serves `rules` (one file's text) with the policy's `extra` fields.
  void serve(const std::string& rules, const std::string& extra = "") {
    engine_.reset();
    auto e = Engine::create(config_of(config(write("rules.yaml", rules), extra)), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }

  StatusOr<pb::RateLimitResponse> call(const pb::RateLimitRequest& req) {
    const PolicyRegistry::Method* m = engine_->kinds().method(kMethod);
    if (m == nullptr) return Status(StatusCode::kInternal, "no method");
    WaitingDeferral later;
    auto r = m->method.handle(req.SerializeAsString(), *engine_->policies_of(m->kind), later);
    if (!r) {
      EXPECT_TRUE(later.deferred) << "no answer, and the call was not deferred";
      ++deferred_;
      r = later.wait();
    }
    if (!r->ok()) return r->status();
    pb::RateLimitResponse out;
    if (!out.ParseFromString(r->value())) return Status(StatusCode::kInternal, "undecodable");
    return out;
  }
  static pb::RateLimitRequest request(const std::string& domain,
                                      const std::vector<Descriptor>& descriptors,
                                      std::uint32_t hits = 0) {
    pb::RateLimitRequest req;
    req.set_domain(domain);
    req.set_hits_addend(hits);
    for (const Descriptor& d : descriptors) {
      auto& w = *req.add_descriptors();
      for (const auto& [k, v] : d.entries) {
        auto& e = *w.add_entries();
        e.set_key(k);
        e.set_value(v);
      }
      if (d.hits) w.mutable_hits_addend()->set_value(*d.hits);
    }
    return req;
  }
  pb::RateLimitResponse ask(const std::string& domain, const std::vector<Descriptor>& d,
                            std::uint32_t hits = 0) {
    auto r = call(request(domain, d, hits));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : pb::RateLimitResponse{};
  }
  // Asks `n` times; how many were OK overall.
  int oks(int n, const std::string& domain, const std::vector<Descriptor>& d) {
    int ok = 0;
    for (int i = 0; i < n; ++i) ok += ask(domain, d).overall_code() == kOk ? 1 : 0;
    return ok;
  }
  std::string metrics() const { return engine_->metrics_text(); }
  // The value of the series of `family` whose labels include each of `labels` ("" if none).
  std::string series(const std::string& family, const std::vector<std::string>& labels) const {
    std::istringstream in(metrics());
    std::string line;
    while (std::getline(in, line)) {
      if (!line.starts_with(family + "{")) continue;
      bool all = true;
      for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
      if (all) return line.substr(line.rfind(' ') + 1);
    }
    return "";
  }
  std::string hits(const std::string& rule, const std::string& result) const {
    return series("sluice_rls_hits_total",
                  {"rule=\"" + rule + "\"", "result=\"" + result + "\"", "policy=\"edge\""});
  }
  std::string shadow_denied() const { return series("sluice_shadow_denied_total", {"edge"}); }

  std::string dir_;
  int deferred_ = 0;  // calls answered after a lease
  // A whole number of every unit (a year, 30 days, a week): windows start here.
  ManualClock clock_{hours(24 * 365 * 6 * 7)};
  std::unique_ptr<Engine> engine_;
};

// Example 1: two values of one key, each its own limit.
TEST_F(EnvoyRateLimitTest, ReadmeExample1) {
  serve(R"(domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
)");
  const std::vector<Descriptor> users{{{{"database", "users"}}}};
  EXPECT_EQ(oks(501, "mongo_cps", users), 500);
  const pb::RateLimitResponse r = ask("mongo_cps", {{{{"database", "default"}}}});
  EXPECT_EQ(r.overall_code(), kOk);
  ASSERT_EQ(r.statuses_size(), 1);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 500U);
  EXPECT_EQ(r.statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::SECOND);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 499U);
  EXPECT_EQ(r.statuses(0).duration_until_reset().seconds(), 1);
  // A value no rule names: no limit.
  const pb::RateLimitResponse other = ask("mongo_cps", {{{{"database", "other"}}}});
  EXPECT_EQ(other.overall_code(), kOk);
  EXPECT_FALSE(other.statuses(0).has_current_limit());
  // The next second is a new window.
  clock_.advance(seconds(1));
  EXPECT_EQ(oks(1, "mongo_cps", users), 1);
}

// Example 2: nested rules, a value-less key counted per value, two descriptors in one request.
TEST_F(EnvoyRateLimitTest, ReadmeExample2) {
  serve(R"(domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
)");
  const std::vector<Descriptor> both{{{{"message_type", "marketing"}, {"to_number", "2061111111"}}},
                                     {{{"to_number", "2061111111"}}}};
  EXPECT_EQ(oks(5, "messaging", both), 5);
  const pb::RateLimitResponse sixth = ask("messaging", both);
  EXPECT_EQ(sixth.overall_code(), kOver);
  EXPECT_EQ(sixth.statuses(0).code(), kOver);
  EXPECT_EQ(sixth.statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::DAY);
  EXPECT_EQ(sixth.statuses(1).code(), kOk);
  EXPECT_EQ(sixth.statuses(1).current_limit().requests_per_unit(), 100U);
  // The refused request added nothing: 95 of the number's 100 are left, not 94.
  EXPECT_EQ(sixth.statuses(1).limit_remaining(), 95U);
  EXPECT_EQ(ask("messaging", {{{{"to_number", "2061111111"}}}}).statuses(0).limit_remaining(), 94U);
  // Another number has its own 5.
  EXPECT_EQ(oks(6, "messaging", {{{{"message_type", "marketing"}, {"to_number", "2062222222"}}}}),
            5);
}

// Example 3: the key and value before the key alone; 0 refuses every request.
TEST_F(EnvoyRateLimitTest, ReadmeExample3) {
  serve(R"(domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
)");
  EXPECT_EQ(oks(11, "edge_proxy_per_ip", {{{{"remote_address", "50.0.0.1"}}}}), 10);
  const pb::RateLimitResponse blocked =
      ask("edge_proxy_per_ip", {{{{"remote_address", "50.0.0.5"}}}});
  EXPECT_EQ(blocked.overall_code(), kOver);
  EXPECT_EQ(blocked.statuses(0).current_limit().requests_per_unit(), 0U);
  EXPECT_EQ(blocked.statuses(0).duration_until_reset().seconds(), 1);
}

// Example 4: a descriptor matches rules of its own depth only.
TEST_F(EnvoyRateLimitTest, ReadmeExample4) {
  const std::vector<Descriptor> two{{{{"key", "value"}, {"subkey", "subvalue"}}}};
  serve(R"(domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
)");
  EXPECT_FALSE(ask("example4", two).statuses(0).has_current_limit());
  serve(R"(domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
)");
  EXPECT_EQ(ask("example4", two).statuses(0).current_limit().requests_per_unit(), 300U);
}

// Example 5: unlimited: OK with the most remaining there is, and no limit named.
TEST_F(EnvoyRateLimitTest, ReadmeExample5) {
  serve(R"(domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
)");
  const pb::RateLimitResponse r = ask("internal", {{{{"ldap", "x"}}}, {{{"azure", "y"}}}});
  EXPECT_EQ(r.overall_code(), kOk);
  EXPECT_EQ(r.statuses(0).code(), kOk);
  EXPECT_EQ(r.statuses(0).limit_remaining(), std::numeric_limits<std::uint32_t>::max());
  EXPECT_FALSE(r.statuses(0).has_current_limit());
  EXPECT_EQ(r.statuses(1).current_limit().unit(), pb::RateLimitResponse::RateLimit::MINUTE);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 99U);
}

// Example 6: shadow mode decides and counts, and never refuses.
TEST_F(EnvoyRateLimitTest, ReadmeExample6) {
  serve(R"(domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
)");
  const std::vector<Descriptor> a{{{{"service", "auth-service"}, {"user", "user-a"}}}};
  EXPECT_EQ(oks(15, "example6", a), 15);
  EXPECT_EQ(oks(21, "example6", {{{{"service", "auth-service"}, {"user", "user-b"}}}}), 20);
  EXPECT_EQ(shadow_denied(), "5") << metrics();
  EXPECT_EQ(hits("example6.service.user_user-a", "shadow_mode"), "5");
  EXPECT_EQ(hits("example6.service.user_user-a", "within_limit"), "10");
  EXPECT_EQ(hits("example6.service.user_user-b", "over_limit"), "1");
}

// Example 7: replaces.
TEST_F(EnvoyRateLimitTest, ReadmeExample7) {
  serve(R"(domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
)");
  const Descriptor one{{{"key_1", "value_1"}, {"user", "bkthomps"}}};
  const Descriptor two{{{"key_2", "value_2"}, {"user", "bkthomps"}}};
  const pb::RateLimitResponse first = ask("example7", {one, two});
  EXPECT_FALSE(first.statuses(0).has_current_limit());  // replaced: not applied, not counted
  EXPECT_EQ(first.statuses(1).current_limit().requests_per_unit(), 10U);
  EXPECT_EQ(oks(10, "example7", {one, two}), 9);
  // The 5 per second of (key_1, user) alone was never touched.
  const pb::RateLimitResponse alone = ask("example7", {one});
  EXPECT_EQ(alone.statuses(0).current_limit().name(), "specific_limit");
  EXPECT_EQ(alone.statuses(0).limit_remaining(), 4U);
}

// Example 8: detailed_metric: metrics per value, limits as usual.
TEST_F(EnvoyRateLimitTest, ReadmeExample8) {
  serve(R"(domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
)");
  EXPECT_EQ(oks(11, "example8", {{{{"key1", "unspecified_value"}}}}), 10);
  EXPECT_EQ(oks(10, "example8", {{{{"key1", "unspecified_value2"}}}}), 10);
  EXPECT_EQ(oks(21, "example8", {{{{"key1", "value1"}}}}), 20);
  EXPECT_EQ(hits("example8.key1_unspecified_value", "over_limit"), "1") << metrics();
  EXPECT_EQ(hits("example8.key1_unspecified_value2", "within_limit"), "10");
  EXPECT_EQ(hits("example8.key1_value1", "within_limit"), "20");
  EXPECT_EQ(hits("example8.key1_value1", "over_limit"), "1");
}

// Example 9: wildcards at the end, in the middle, several.
TEST_F(EnvoyRateLimitTest, ReadmeExample9) {
  serve(R"(domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
)");
  for (const auto& [k, v] : Entries{{"key1", "value1"},
                                    {"key1", "valueXYZ"},
                                    {"path", "/api/123/action"},
                                    {"path", "/api/user-id/action"},
                                    {"route", "/api/v1/resource/123/action"},
                                    {"route", "/api/v2/resource/456/action"}})
    EXPECT_EQ(ask("example9", {{{{k, v}}}}).statuses(0).current_limit().requests_per_unit(), 20U)
        << k << "=" << v;
  EXPECT_FALSE(ask("example9", {{{{"path", "/api/123/other"}}}}).statuses(0).has_current_limit());
  // Each value a wildcard matches counts apart.
  EXPECT_EQ(oks(21, "example9", {{{{"key1", "value2"}}}}), 20);
  EXPECT_EQ(oks(1, "example9", {{{{"key1", "value3"}}}}), 1);
}

// Example 10: value_to_metric.
TEST_F(EnvoyRateLimitTest, ReadmeExample10) {
  serve(R"(domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
)");
  ask("example10", {{{{"route", "api"}, {"http_method", "GET"}, {"subject_id", "123"}}}});
  ask("example10", {{{{"route", "web"}, {"http_method", "POST"}, {"subject_id", "456"}}}});
  EXPECT_EQ(hits("example10.route_api.http_method_GET.subject_id", "within_limit"), "1")
      << metrics();
  EXPECT_EQ(hits("example10.route_web.http_method_POST.subject_id", "within_limit"), "1");
}

// Example 11: share_threshold.
TEST_F(EnvoyRateLimitTest, ReadmeExample11) {
  serve(R"(domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
)");
  EXPECT_EQ(oks(5, "example11", {{{{"files", "files/a.pdf"}}}}), 5);
  EXPECT_EQ(oks(5, "example11", {{{{"files", "files/b.csv"}}}}), 5);
  EXPECT_EQ(ask("example11", {{{{"files", "files/c.txt"}}}}).overall_code(), kOver);
  EXPECT_EQ(oks(10, "example11", {{{{"files_no_share", "files_no_share/a.pdf"}}}}), 10);
  EXPECT_EQ(oks(10, "example11", {{{{"files_no_share", "files_no_share/b.csv"}}}}), 10);
}

constexpr const char* kPerUser = R"(domain: d
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 3
)";

TEST_F(EnvoyRateLimitTest, HitsAddendPerRequestAndPerDescriptor) {
  serve(kPerUser);
  // The request's hits_addend: 4 hits, twice; a third would take 12 of 10.
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}, 4).statuses(0).limit_remaining(), 6U);
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}, 4).statuses(0).limit_remaining(), 2U);
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}, 4).overall_code(), kOver);
  // A descriptor's own hits_addend wins; 0 asks without adding.
  const pb::RateLimitResponse peek = ask("d", {{{{"user", "u"}}, 0}}, 4);
  EXPECT_EQ(peek.overall_code(), kOk);
  EXPECT_EQ(peek.statuses(0).limit_remaining(), 2U);
  EXPECT_EQ(ask("d", {{{{"user", "u"}}, 2}}, 9).statuses(0).limit_remaining(), 0U);
}

// Envoy's stream-end request (apply_on_stream_done) marked with a sluice_charge entry: its hits
// are counted whatever is left, never refused, and the limit's later checks wait out the
// overdraft; the marker is not part of the key.
TEST_F(EnvoyRateLimitTest, AStreamEndRequestMarkedSluiceChargeIsACharge) {
  serve(kPerUser);
  const pb::RateLimitResponse check = ask("d", {{{{"user", "u"}}, 0}});  // request time
  EXPECT_EQ(check.overall_code(), kOk);
  const pb::RateLimitResponse charged =
      ask("d", {{{{"user", "u"}, {"sluice_charge", "true"}}, 13}});
  EXPECT_EQ(charged.overall_code(), kOk) << "a charge is never refused";
  EXPECT_EQ(charged.statuses(0).code(), kOk);
  EXPECT_EQ(charged.statuses(0).limit_remaining(), 0U);
  // Overdrawn by 3: even a check of no hits is over until the window ends.
  EXPECT_EQ(ask("d", {{{{"user", "u"}}, 0}}).overall_code(), kOver);
  EXPECT_EQ(ask("d", {{{{"user", "v"}}}}).overall_code(), kOk) << "another user";
  clock_.advance(std::chrono::minutes(1));
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}).overall_code(), kOk);
  // A charge beside a check that is over: the check adds nothing, the charge stays.
  EXPECT_EQ(oks(3, "d", {{{{"tenant", "t"}}}}), 3);
  const pb::RateLimitResponse mixed =
      ask("d", {{{{"tenant", "t"}}}, {{{"sluice_charge", "1"}, {"user", "u"}}, 5}});
  EXPECT_EQ(mixed.overall_code(), kOver);
  EXPECT_EQ(ask("d", {{{{"user", "u"}}, 0}}).statuses(0).limit_remaining(), 4U) << "1 + 5 of 10";
  EXPECT_EQ(series("sluice_rls_charged_hits_total", {"edge"}), "18");
  // A marker alone names nothing to charge.
  const auto alone = call(request("d", {{{{"sluice_charge", "true"}}}}));
  EXPECT_EQ(alone.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(alone.status().message().find("sluice_charge"), std::string::npos);
}

TEST_F(EnvoyRateLimitTest, ARefusedRequestAddsToNoLimit) {
  serve(kPerUser);
  const std::vector<Descriptor> both{{{{"user", "u"}}}, {{{"tenant", "t"}}}};
  EXPECT_EQ(oks(3, "d", both), 3);
  // The tenant's 3 are spent: the user's limit is checked, then given back.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ask("d", both).overall_code(), kOver);
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}).statuses(0).limit_remaining(), 6U);
}

TEST_F(EnvoyRateLimitTest, OverrideLimitsAndUnknownDomains) {
  serve(kPerUser);
  pb::RateLimitRequest req = request("d", {{{{"user", "u"}}}});
  auto* limit = req.mutable_descriptors(0)->mutable_limit();
  limit->set_requests_per_unit(2);
  limit->set_unit(envoy::type::v3::HOUR);
  for (int i = 0; i < 2; ++i) {
    auto r = call(req);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().overall_code(), kOk);
    EXPECT_EQ(r.value().statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::HOUR);
  }
  EXPECT_EQ(call(req).value().overall_code(), kOver);
  // The configured limit of the same key is its own.
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}).statuses(0).limit_remaining(), 9U);
  // A domain no file has: OK, no limit, counted.
  const pb::RateLimitResponse unknown = ask("nope", {{{{"user", "u"}}}});
  EXPECT_EQ(unknown.overall_code(), kOk);
  EXPECT_FALSE(unknown.statuses(0).has_current_limit());
  EXPECT_EQ(series("sluice_rls_unknown_domain_total", {"edge"}), "1") << metrics();
}

TEST_F(EnvoyRateLimitTest, MalformedRequestsNameTheField) {
  serve(kPerUser);
  const auto why = [&](const pb::RateLimitRequest& req) {
    auto r = call(req);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  };
  EXPECT_EQ(why(request("", {{{{"user", "u"}}}})), "domain: must not be empty");
  EXPECT_EQ(why(request("d", {})).substr(0, 12), "descriptors:");
  EXPECT_EQ(why(request("d", {{{{"user", "u"}}}, {{}}})),
            "descriptors[1].entries: must not be empty");
  pb::RateLimitRequest bad_unit = request("d", {{{{"user", "u"}}}});
  bad_unit.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(1);
  EXPECT_EQ(why(bad_unit).substr(0, 26), "descriptors[0].limit.unit:");
  EXPECT_EQ(why(request("d", {{{{"user", std::string(20000, 'x')}}}})).substr(0, 23),
            "descriptors[0].entries:");
  // Bytes that are not the message.
  WaitingDeferral later;
  const PolicyRegistry::Method* m = engine_->kinds().method(kMethod);
  auto r = m->method.handle("\xff\xff\xff", *engine_->policies_of(m->kind), later);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EnvoyRateLimitTest, GlobalShadowModeAnswersOkAndSaysOverInTheStatus) {
  serve(kPerUser, "    shadow_mode: true\n");
  const std::vector<Descriptor> tenant{{{{"tenant", "t"}}}};
  EXPECT_EQ(oks(5, "d", tenant), 5);
  const pb::RateLimitResponse r = ask("d", tenant);
  EXPECT_EQ(r.overall_code(), kOk);
  EXPECT_EQ(r.statuses(0).code(), kOver);
  EXPECT_EQ(shadow_denied(), "3") << metrics();
}

TEST_F(EnvoyRateLimitTest, ReloadKeepsCountersOfLimitsThatStay) {
  serve(kPerUser);
  EXPECT_EQ(oks(6, "d", {{{{"user", "u"}}}}), 6);
  EXPECT_EQ(oks(3, "d", {{{{"tenant", "t"}}}}), 3);
  // user: 10 -> 8 per minute (6 spent: 2 left); tenant: per minute -> per hour (afresh).
  write("rules.yaml", R"(domain: d
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 8
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 3
)");
  auto r = engine_->reload(config_of(config(dir_ + "/rules.yaml")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"edge"});
  EXPECT_EQ(oks(3, "d", {{{{"user", "u"}}}}), 2);
  EXPECT_EQ(oks(4, "d", {{{{"tenant", "t"}}}}), 3);
}

TEST_F(EnvoyRateLimitTest, ResponseHeadersForEnvoyToAdd) {
  const auto headers = [](const pb::RateLimitResponse& r) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& h : r.response_headers_to_add()) out.emplace_back(h.key(), h.value());
    return out;
  };
  serve(kPerUser);  // none, as envoyproxy/ratelimit by default
  EXPECT_TRUE(headers(ask("d", {{{{"user", "u"}}}})).empty());
  serve(kPerUser, "    response_headers: ietf\n");
  const std::vector<Descriptor> both{{{{"user", "u"}}}, {{{"tenant", "t"}}}, {{{"none", "x"}}}};
  using H = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(headers(ask("d", both)),
            (H{{"RateLimit-Policy", "\"d.user\";q=10;w=60, \"d.tenant\";q=3;w=60"},
               {"RateLimit", "\"d.user\";r=9;t=60, \"d.tenant\";r=2;t=60"}}));
  clock_.advance(seconds(15));
  ask("d", both);
  ask("d", both);  // the tenant's last
  const pb::RateLimitResponse over = ask("d", both);
  EXPECT_EQ(over.overall_code(), kOver);
  EXPECT_EQ(headers(over), (H{{"RateLimit-Policy", "\"d.user\";q=10;w=60, \"d.tenant\";q=3;w=60"},
                              {"RateLimit", "\"d.user\";r=7;t=45, \"d.tenant\";r=0;t=45"},
                              {"Retry-After", "45"}}));
  serve(kPerUser, "    response_headers: x-ratelimit\n");
  EXPECT_EQ(
      headers(ask("d", both)),
      (H{{"X-RateLimit-Limit", "3"}, {"X-RateLimit-Remaining", "2"}, {"X-RateLimit-Reset", "45"}}));
}

// max_keys bounds the counters of every limit, those a request sets included, and a reload
// that lowers it applies to them as well.
TEST_F(EnvoyRateLimitTest, MaxKeysBoundsOverrideLimitsAcrossAReload) {
  serve(kPerUser, "    max_keys: 3\n");
  const auto with_override = [&](const std::string& user) {
    pb::RateLimitRequest req = request("d", {{{{"user", user}}}});
    auto* limit = req.mutable_descriptors(0)->mutable_limit();
    limit->set_requests_per_unit(5);
    limit->set_unit(envoy::type::v3::HOUR);
    return call(req).value().overall_code();
  };
  EXPECT_EQ(with_override("a"), kOk);
  EXPECT_EQ(with_override("b"), kOk);
  auto r = engine_->reload(config_of(config(dir_ + "/rules.yaml", "    max_keys: 2\n")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(with_override("c"), kOver);  // a third key past the new cap of 2
  EXPECT_EQ(with_override("a"), kOk);    // keys held are never refused for the cap
}

// A rule file's errors: each at its line and column in that file, through the policy's
// `config`; a directory's files are read in name order, hidden ones skipped.
TEST_F(EnvoyRateLimitTest, RuleFileErrorsCarryTheirPlace) {
  const std::string bad = write("bad.yaml", R"(domain: d
descriptors:
  - key: user
    rate_limit:
      unit: fortnight
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
    metadata:
      a: 1
    colour: blue
)");
  const ConfigLoad load = load_yaml(config(bad));
  const std::string all = errors_of(load);
  EXPECT_NE(all.find(bad + ":5:13: descriptors[0].rate_limit.unit: must be one of second"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find(bad + ":12:7: descriptors[1].metadata: is not supported"), std::string::npos)
      << all;
  EXPECT_NE(all.find(bad + ":13:5: descriptors[1].colour: unknown key"), std::string::npos) << all;
  EXPECT_NE(all.find("t.yaml:4:13: policies.edge.config: "), std::string::npos) << all;

  const std::string dup = write("dup.yaml", R"(domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
)");
  EXPECT_NE(errors_of(load_yaml(config(dup))).find(dup + ":5:5: descriptors[1]: duplicate"),
            std::string::npos)
      << errors_of(load_yaml(config(dup)));

  // A directory: two domains, a hidden file and a file of another kind left alone.
  write("dir/a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
        "requests_per_unit: 1}\n");
  write("dir/sub/b.yml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
        "requests_per_unit: 2}\n");
  write("dir/..data/c.yaml", "not: [valid\n");
  write("dir/README.md", "# notes\n");
  const ConfigLoad ok = load_yaml(config(dir_ + "/dir"));
  ASSERT_TRUE(ok.errors.empty()) << errors_of(ok);
  auto e = Engine::create(*ok.config, clock_);
  ASSERT_TRUE(e.ok());
  engine_ = std::move(e.value());
  EXPECT_EQ(ask("b", {{{{"k", "x"}}}}).statuses(0).current_limit().requests_per_unit(), 2U);
  // The same domain in two files is an error unless merge_domains.
  write("twice/a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
        "requests_per_unit: 1}\n");
  write("twice/b.yaml",
        "domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, "
        "requests_per_unit: 1}\n");
  EXPECT_NE(errors_of(load_yaml(config(dir_ + "/twice"))).find("b.yaml:1:9: domain: domain 'a'"),
            std::string::npos)
      << errors_of(load_yaml(config(dir_ + "/twice")));
  EXPECT_TRUE(load_yaml(config(dir_ + "/twice", "    merge_domains: true\n")).errors.empty());
  EXPECT_NE(errors_of(load_yaml(config(dir_ + "/none"))).find("no such file or directory"),
            std::string::npos);
}

}  // namespace
}  // namespace sluice::server

namespace sluice::server {
namespace {

constexpr const char* kShared = R"(domain: d
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: tenant
    sluice_shared: false
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: burst
    sluice_shared: false
    sluice_strategy: sliding-window
    rate_limit:
      unit: minute
      requests_per_unit: 4
)";

// With a coordinator, a limit is a federated budget: decided from escrow leased in batches (a
// request that needs a lease waits for it), never more than its limit in a window.
TEST_F(EnvoyRateLimitTest, SharedLimitsLeaseEscrowFromTheCoordinator) {
  serve(kShared, "    coordinator: memory\n    batch: 4\n    lease_timeout: 1s\n");
  EXPECT_EQ(oks(15, "d", {{{{"user", "u"}}}}), 10);
  // A check that finds no escrow waits for the lease it starts, unless the embedded coordinator
  // has granted it on its pool thread before the check looks again (then it is answered at
  // once): how many waited depends on that race, but never more than there were leases, as a
  // single caller waits for one lease at a time, and most checks wait for none.
  const int leases = std::stoi(series("sluice_rls_leases_total", {"edge"}));
  EXPECT_LE(deferred_, leases);
  EXPECT_LT(leases, 8) << "batches of 4 for 10 admissions, and the refill they start";
  const pb::RateLimitResponse over = ask("d", {{{{"user", "u"}}}});
  EXPECT_EQ(over.overall_code(), kOver);
  EXPECT_EQ(over.statuses(0).current_limit().requests_per_unit(), 10u);
  EXPECT_NE(series("sluice_rls_shared_limits", {"edge"}), "");
  EXPECT_EQ(series("sluice_rls_shared_limits", {"edge"}), "1") << metrics();
  EXPECT_NE(series("sluice_rls_leases_total", {"edge"}), "0");
  // The next window: the budget is whole again.
  clock_.advance(std::chrono::minutes(1));
  EXPECT_EQ(oks(12, "d", {{{{"user", "u"}}}}), 10);
  // A local sliding window beside it: 4 a minute, on this server.
  EXPECT_EQ(oks(6, "d", {{{{"burst", "b"}}}}), 4);
}

// A shared limit's charge: the escrow, then the global budget, leased in the background.
TEST_F(EnvoyRateLimitTest, ASharedLimitTakesAChargeFromItsBudget) {
  serve(kShared, "    coordinator: memory\n    batch: 4\n    lease_timeout: 1s\n");
  EXPECT_EQ(ask("d", {{{{"user", "u"}}}}).overall_code(), kOk);
  EXPECT_EQ(ask("d", {{{{"user", "u"}, {"sluice_charge", "true"}}, 7}}).overall_code(), kOk);
  // 8 of 10 spent once the charge's lease is in; a check waits behind it.
  EXPECT_EQ(oks(5, "d", {{{{"user", "u"}}}}), 2);
  // The request-time check of Envoy's charging pattern (hits_addend 0) is over once nothing is
  // left, as a per-server limit's is.
  EXPECT_EQ(ask("d", {{{{"user", "u"}}, 0}}).overall_code(), kOver);
  EXPECT_EQ(ask("d", {{{{"user", "v"}}, 0}}).overall_code(), kOk) << "another user";
}

// A request over any limit adds to none: a local limit's refusal gives back what a shared one
// took.
TEST_F(EnvoyRateLimitTest, ARefusalGivesBackWhatASharedLimitTook) {
  serve(kShared, "    coordinator: memory\n    batch: 4\n    lease_timeout: 1s\n");
  const std::vector<Descriptor> both{{{{"user", "u"}}}, {{{"tenant", "t"}}}};
  EXPECT_EQ(oks(5, "d", both), 2);  // the tenant's 2; 3 refused, costing the user nothing
  EXPECT_EQ(oks(10, "d", {{{{"user", "u"}}}}), 8);
}

// A reload that keeps the sharing takes the new rules in place, each shared limit as it was;
// one that changes it builds the policy anew, whose old escrow goes back to the coordinator:
// what was spent stays spent, and nothing is lost.
TEST_F(EnvoyRateLimitTest, ReloadOfSharedLimits) {
  const std::string sharing = "    coordinator: memory\n    batch: 4\n";
  serve(kShared, sharing + "    lease_timeout: 1s\n");
  const std::vector<Descriptor> user{{{{"user", "u"}}}};
  EXPECT_EQ(oks(6, "d", user), 6);
  std::string rules = kShared;
  rules.replace(rules.find("requests_per_unit: 2"), 20, "requests_per_unit: 3");
  write("rules.yaml", rules);
  auto r =
      engine_->reload(config_of(config(dir_ + "/rules.yaml", sharing + "    lease_timeout: 1s\n")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"edge"});
  EXPECT_EQ(oks(2, "d", user), 2);
  r = engine_->reload(config_of(config(dir_ + "/rules.yaml", sharing + "    lease_timeout: 2s\n")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().changed, std::vector<std::string>{"edge"});
  EXPECT_EQ(oks(5, "d", user), 2);  // 8 of 10 spent before
}

// Sharing is configured with line and column: a shared limit is a fixed window, sharing needs
// a coordinator, and the coordinator's settings need one.
TEST_F(EnvoyRateLimitTest, SharingErrorsCarryTheirPlace) {
  const std::string rules = write("s.yaml", R"(domain: d
descriptors:
  - key: a
    sluice_shared: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    sluice_strategy: gcra
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: c
    sluice_strategy: leaky
    rate_limit: {unit: minute, requests_per_unit: 1}
)");
  const std::string alone = errors_of(load_yaml(config(rules, "    batch: 4\n")));
  EXPECT_NE(alone.find(rules + ":4:20: descriptors[0].sluice_shared: shares this limit through "
                               "the policy's coordinator, and the envoy_ratelimit policy names "
                               "none"),
            std::string::npos)
      << alone;
  EXPECT_NE(alone.find("policies.edge.batch: applies to limits shared through a coordinator"),
            std::string::npos)
      << alone;
  EXPECT_NE(alone.find(rules + ":10:22: descriptors[2].sluice_strategy:"), std::string::npos)
      << alone;
  const std::string shared = errors_of(load_yaml(config(rules, "    coordinator: memory\n")));
  EXPECT_NE(shared.find(rules + ":7:22: descriptors[1].sluice_strategy: 'gcra' cannot be shared "
                                "without overshoot"),
            std::string::npos)
      << shared;
  EXPECT_EQ(shared.find("descriptors[0].sluice_shared"), std::string::npos) << shared;
}

}  // namespace
}  // namespace sluice::server
