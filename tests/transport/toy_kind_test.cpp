// A policy kind that exists only in this file, registered from here, served by the real engine,
// gRPC service and HTTP server: adding a kind needs no edit to the engine, the transports or
// the lease table (the engine seam, src/server/registry.h). The kind parses its own config
// section (its errors carry their lines), answers both families, composes with a chained rate
// policy, and shows up in the policy listing, the metrics and the problem+json of a refusal.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "transport/grpc_service.h"
#include "transport/http_server.h"

namespace sluice::server {
namespace {

namespace pb = sluice::v1;
using nlohmann::json;

// ---- the toy kind: its body, its policy, its parser and builder ----

struct ToySpec final : PolicyBody {
  std::uint32_t slots = 1;
};

// Check: a key may spend `slots` hits in all. Admit: `slots` calls in flight.
class ToyPolicy final : public Policy, public RateFamily, public AdmitFamily {
 public:
  ToyPolicy(const BuildContext& c, std::uint32_t slots)
      : Policy(c.name, "toy", c.identity, c.spec.rate), slots_(slots) {}

  RateFamily* rate_family() noexcept override { return this; }
  AdmitFamily* admit_family() noexcept override { return this; }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    const std::lock_guard lock(mu_);
    RateDecision d = decide(key, hits, now);
    if (d.allowed) spent_[std::string(key)] += hits;
    return d;
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    const std::lock_guard lock(mu_);
    return decide(key, hits, now);
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos /*now*/) override {
    const std::lock_guard lock(mu_);
    spent_[std::string(key)] -= hits;
  }
  Rejection refusal(std::string_view /*key*/, const RateDecision& d) const override {
    return toy_rejection(429, d.limit - d.remaining, d.limit);
  }

  StatusOr<AdmitDecision> admit(const AdmitCall& call, Nanos now, AdmitGate* gate) override {
    AdmitDecision out;
    if (gate != nullptr) {
      auto refused = gate->pass(call, now, out.refusal_owner);
      if (!refused.ok()) return refused.status();
      if (refused.value()) {
        out.refusal = *refused.value();
        return out;
      }
    }
    std::uint32_t held = held_.load();
    do {
      if (held >= slots_) {
        out.refusal = toy_rejection(503, held, slots_);
        out.refusal_owner = shared_from_this();
        return out;
      }
    } while (!held_.compare_exchange_weak(held, held + 1));
    out.permit = LeasePermit(ToyLease{std::static_pointer_cast<ToyPolicy>(shared_from_this())});
    return out;
  }

 protected:
  void describe(json& j, PolicyInfo& info) const override {
    info.in_flight = held_.load();
    info.limit = slots_;
    j["slots"] = slots_;
    j["in_flight"] = info.in_flight;
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    out.push_back(
        one("toy_slots", "Slots of the toy policy", prometheus::MetricType::Gauge, slots_));
  }

 private:
  struct ToyLease {
    std::shared_ptr<ToyPolicy> policy;
    void finish(const CallEnd& /*end*/) noexcept { policy->held_.fetch_sub(1); }
  };

  RateDecision decide(std::string_view key, std::uint64_t hits, Nanos /*now*/) const {
    auto it = spent_.find(std::string(key));
    const std::uint64_t spent = it == spent_.end() ? 0 : it->second;
    RateDecision d;
    d.limit = slots_;
    d.allowed = spent + hits <= slots_;
    d.remaining = slots_ - std::min<std::uint64_t>(slots_, spent + (d.allowed ? hits : 0));
    d.retry_after = d.allowed ? Nanos{0} : Nanos::max();
    return d;
  }
  Rejection toy_rejection(std::uint16_t status, std::uint64_t used, std::uint64_t limit) const {
    Rejection r;
    r.source = "toy";
    r.limit_type = "toy";
    r.status = status;
    r.type = "urn:sluice:problem:toy-full";
    r.title = "Toy Full";
    r.policy = name();
    r.current_in_flight = used;
    r.max_concurrent = limit;
    r.detail_text = "the toy is full";
    return r;
  }

  const std::uint32_t slots_;
  std::atomic<std::uint32_t> held_{0};
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> spent_;
};

PolicyKind toy_kind() {
  const auto parse = [](const std::string&, ConfigSection& s, PolicySpec&) {
    s.keys({"kind", "slots", "rate"});
    auto body = std::make_shared<ToySpec>();
    if (auto v = s.u32("slots", 1)) body->slots = *v;
    return std::shared_ptr<const PolicyBody>(body);
  };
  const auto build = [](const BuildContext& c) -> StatusOr<std::shared_ptr<Policy>> {
    return std::shared_ptr<Policy>(std::make_shared<ToyPolicy>(c, c.spec.as<ToySpec>()->slots));
  };
  return PolicyKind("toy", PolicyKind::kRate | PolicyKind::kAdmit, parse, build);
}

// ---- a plain HTTP/1.1 client over a socket ----

struct Reply {
  int status = 0;
  std::string head, body;
};

Reply http(int port, const std::string& method, const std::string& target,
           const std::string& body = {}) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  Reply r;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  const std::string req = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!write(fd, req.data(), req.size());
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;)
    raw.append(buf, static_cast<std::size_t>(n));
  close(fd);
  const std::size_t split = raw.find("\r\n\r\n");
  r.head = raw.substr(0, split);
  r.body = split == std::string::npos ? "" : raw.substr(split + 4);
  if (raw.size() > 12) r.status = std::stoi(raw.substr(9, 3));
  return r;
}

const char* kConfig = R"(
policies:
  per-key:
    kind: rate
    strategy: fixed-window
    limit: 2
    period: 1h
  play:
    kind: toy
    slots: 2
  chained:
    kind: toy
    slots: 5
    rate: per-key
)";

class ToyKind : public ::testing::Test {
 protected:
  void SetUp() override {
    kinds_ = PolicyRegistry::builtin();   // the built-in kinds ...
    ASSERT_TRUE(kinds_.add(toy_kind()));  // ... and the toy: its one registration line
    ConfigLoad load = load_config(kConfig, kinds_);
    ASSERT_TRUE(load.config) << load.errors.front().to_string("test");
    auto e = Engine::create(*load.config, clock_, kinds_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
    service_ = std::make_unique<transport::GrpcService>(*engine_);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port_);
    b.RegisterService(service_.get());
    grpc_ = b.BuildAndStart();
    ASSERT_NE(grpc_, nullptr);
    stub_ = pb::Sluice::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_),
                                                    grpc::InsecureChannelCredentials()));
    http_ = std::make_unique<transport::HttpServer>(*engine_, nullptr);
    auto port = http_->start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    http_port_ = port.value();
  }
  void TearDown() override {
    if (http_) http_->stop();
    if (grpc_) grpc_->Shutdown();
  }
  grpc::Status admit(const std::string& policy, const std::string& key, pb::AdmitResponse& r) {
    grpc::ClientContext ctx;
    pb::AdmitRequest req;
    req.set_policy(policy);
    req.set_key(key);
    return stub_->Admit(&ctx, req, &r);
  }

  PolicyRegistry kinds_;
  ManualClock clock_{std::chrono::seconds(100)};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<transport::GrpcService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  int grpc_port_ = 0;
  std::unique_ptr<pb::Sluice::Stub> stub_;
  std::unique_ptr<transport::HttpServer> http_;
  int http_port_ = 0;
};

TEST_F(ToyKind, IsServedOverGrpcAsBothFamilies) {
  grpc::ClientContext c1;
  pb::CheckRequest check;
  check.set_policy("play");
  check.set_key("k");
  check.set_hits(2);
  pb::CheckResponse cr;
  ASSERT_TRUE(stub_->Check(&c1, check, &cr).ok());
  EXPECT_TRUE(cr.decision().allowed());
  grpc::ClientContext c2;
  ASSERT_TRUE(stub_->Check(&c2, check, &cr).ok());
  EXPECT_FALSE(cr.decision().allowed());  // the key spent its 2

  pb::AdmitResponse a1, a2, a3;
  ASSERT_TRUE(admit("play", "x", a1).ok());
  ASSERT_TRUE(admit("play", "x", a2).ok());
  ASSERT_TRUE(admit("play", "x", a3).ok());
  EXPECT_TRUE(a1.admitted());
  EXPECT_TRUE(a2.admitted());
  ASSERT_FALSE(a3.admitted());  // 2 slots
  EXPECT_EQ(a3.rejection().status(), 503);
  EXPECT_EQ(a3.rejection().level(), "toy");
  EXPECT_EQ(json::parse(a3.rejection().problem_json())["type"], "urn:sluice:problem:toy-full");

  grpc::ClientContext c3;
  pb::ReleaseRequest rel;
  rel.set_lease_id(a1.lease_id());
  rel.set_outcome(pb::OUTCOME_FAILED);
  pb::ReleaseResponse rr;
  ASSERT_TRUE(stub_->Release(&c3, rel, &rr).ok());
  pb::AdmitResponse a4;
  ASSERT_TRUE(admit("play", "x", a4).ok());
  EXPECT_TRUE(a4.admitted());  // the released slot is free again

  grpc::ClientContext c4;
  pb::ListPoliciesResponse list;
  ASSERT_TRUE(stub_->ListPolicies(&c4, pb::ListPoliciesRequest{}, &list).ok());
  bool found = false;
  for (const auto& p : list.policies()) {
    if (p.name() != "play") continue;
    found = true;
    EXPECT_EQ(p.kind(), "toy");
    EXPECT_EQ(p.in_flight(), 2u);
    EXPECT_EQ(p.limit(), 2u);
  }
  EXPECT_TRUE(found);
}

TEST_F(ToyKind, ComposesWithAChainedRatePolicy) {
  // chained passes per-key (2 per hour per key) before its own 5 slots: the third admit of a
  // key is the rate policy's 429, and takes no slot.
  pb::AdmitResponse r;
  ASSERT_TRUE(admit("chained", "alice", r).ok());
  EXPECT_TRUE(r.admitted());
  ASSERT_TRUE(admit("chained", "alice", r).ok());
  EXPECT_TRUE(r.admitted());
  ASSERT_TRUE(admit("chained", "alice", r).ok());
  ASSERT_FALSE(r.admitted());
  EXPECT_EQ(r.rejection().status(), 429);
  EXPECT_EQ(r.rejection().policy(), "per-key");
  ASSERT_TRUE(admit("chained", "bob", r).ok());
  EXPECT_TRUE(r.admitted());
  for (const PolicyInfo& p : engine_->policies()) {
    if (p.name == "chained") {
      EXPECT_EQ(p.in_flight, 3u);
    }
  }
}

TEST_F(ToyKind, IsServedOverHttp) {
  Reply r = http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"h","hits":2})");
  EXPECT_EQ(r.status, 200) << r.head << r.body;
  r = http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"h"})");
  EXPECT_EQ(r.status, 429) << r.body;

  r = http(http_port_, "POST", "/v1/admit", R"({"policy":"play"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string lease = json::parse(r.body)["lease_id"];
  ASSERT_EQ(http(http_port_, "POST", "/v1/admit", R"({"policy":"play"})").status, 200);
  r = http(http_port_, "POST", "/v1/admit", R"({"policy":"play"})");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.head.find("X-Sluice-Error-Source: toy"), std::string::npos) << r.head;
  EXPECT_EQ(json::parse(r.body)["title"], "Toy Full");
  r = http(http_port_, "POST", "/v1/release", R"({"lease_id":")" + lease + R"("})");
  EXPECT_EQ(r.status, 200) << r.body;

  r = http(http_port_, "GET", "/v1/policies");
  ASSERT_EQ(r.status, 200);
  bool found = false;
  const json listing = json::parse(r.body);
  for (const json& p : listing["policies"])
    if (p["name"] == "play") {
      found = true;
      EXPECT_EQ(p["kind"], "toy");
      EXPECT_EQ(p["slots"], 2);
      EXPECT_EQ(p["in_flight"], 1);
    }
  EXPECT_TRUE(found) << r.body;
  r = http(http_port_, "GET", "/metrics");
  EXPECT_NE(r.body.find("sluice_policy_info{policy=\"play\",kind=\"toy\"} 1"), std::string::npos)
      << r.body.substr(0, 2000);
  EXPECT_NE(r.body.find("toy_slots{policy=\"play\"} 2"), std::string::npos);
}

TEST(ToyKindConfig, ItsParserReportsItsOwnErrorsWithTheirLines) {
  PolicyRegistry kinds = PolicyRegistry::builtin();
  ASSERT_TRUE(kinds.add(toy_kind()));
  EXPECT_FALSE(kinds.add(toy_kind()));  // one kind per name
  const ConfigLoad bad = load_config("policies:\n  p:\n    kind: toy\n    slot: 3\n", kinds);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0].to_string("f"),
            "f:4:5: policies.p.slot: unknown key (expected one of: kind, slots, rate)");
  // An unknown kind lists every kind the loader knows, the toy among them.
  const ConfigLoad unknown = load_config("policies:\n  p:\n    kind: tyo\n", kinds);
  ASSERT_EQ(unknown.errors.size(), 1u);
  EXPECT_NE(unknown.errors[0].message.find("rate, adaptive, fleet, concurrency, toy"),
            std::string::npos)
      << unknown.errors[0].message;
  // Without its registration the loader does not know it.
  const ConfigLoad builtin =
      load_config("policies:\n  p:\n    kind: toy\n", PolicyRegistry::builtin());
  ASSERT_EQ(builtin.errors.size(), 1u);
  EXPECT_NE(builtin.errors[0].message.find("not 'toy'"), std::string::npos);
}

}  // namespace
}  // namespace sluice::server
