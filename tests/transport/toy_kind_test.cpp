// A policy kind that exists only in this file, registered from here, served by the real engine,
// gRPC service and HTTP server: adding a kind needs no edit to the engine, the transports or
// the lease table (the engine seam, src/server/registry.h). The kind parses its own config
// section (its errors carry their lines), answers both families, composes with a chained rate
// policy, and shows up in the policy listing, the metrics and the problem+json of a refusal.
#include <arpa/inet.h>
#include <google/protobuf/wrappers.pb.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/engine.h"
#include "server/labels.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "transport/grpc_kind_methods.h"
#include "transport/grpc_service.h"
#include "transport/http_server.h"

namespace sluice::server {
namespace {

namespace pb = sluice::v1;
using nlohmann::json;

// ---- the toy kind: its body, its policy, its parser and builder ----

struct ToySpec final : PolicyBody {
  std::uint32_t slots = 1;
  std::string coordinator;    // a coordinator it asks for the fleet interface of
  bool wants_budget = false;  // asks that coordinator for an interface no backend serves
};

// An interface no coordinator serves (a builder asking for it gets a clear error).
class ToyBudget {
 public:
  virtual ~ToyBudget() = default;
};

// Check: a key may spend `slots` hits in all; a key "cold:..." is decided later, by the toy's
// loop, once the toy is opened (its admin route). Admit: `slots` calls in flight, each naming
// the slot it took. A changed `slots` is taken in place.
class ToyPolicy final : public Policy, public RateFamily, public AdmitFamily {
 public:
  ToyPolicy(const BuildContext& c, std::uint32_t slots)
      : Policy(c.name, "toy", c.spec.rate), state_(c.runtime_state()), slots_(slots) {}
  ~ToyPolicy() override { retire(); }

  void start(const Clock& clock) {
    start_loop(clock, [this](Nanos now) { return tick(now); });
  }

  RateFamily* rate_family() noexcept override { return this; }
  AdmitFamily* admit_family() noexcept override { return this; }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    by_key_.add(key, hits);  // a client's keys, in bounded memory
    const std::lock_guard lock(mu_);
    RateDecision d = decide(key, hits, now);
    if (d.allowed) spent_[std::string(key)] += hits;
    return d;
  }
  Decided<RateDecision> check_or_defer(std::string_view key, std::uint64_t hits, Nanos now,
                                       Deferral<RateDecision>& later) override {
    if (!key.starts_with("cold:")) return check(key, hits, now);
    {
      const std::lock_guard lock(mu_);
      // Retired: on_retire() already answered what it held; nothing would answer this one.
      if (retired()) return Status(StatusCode::kUnavailable, "policy " + name() + " was retired");
      pending_.push_back(Pending{std::string(key), hits, later.defer()});
    }
    wake_loops();
    return std::nullopt;
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

  // Phase one: its own attribute, `colour` (optional, one of three), checked; phase two takes a
  // slot and answers the colour back with the slot taken. A chained rate policy runs between
  // them, and the toy knows nothing of it.
  StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& call, Nanos /*now*/) override {
    auto colour = call.single("colour");
    if (!colour.ok()) return colour.status();
    if (!colour.value().empty() && colour.value() != "red" && colour.value() != "green" &&
        colour.value() != "blue")
      return invalid("colour",
                     "must be red, green or blue, not '" + std::string(colour.value()) + "'");
    return resolved([this, colour = std::string(colour.value())](
                        Nanos /*now*/, Deferral<AdmitDecision>& /*later*/) {
      return Decided<AdmitDecision>(take(colour));
    });
  }

  AdmitDecision take(const std::string& colour) {
    AdmitDecision out;
    std::uint32_t held = held_.load();
    do {
      if (held >= slots_.load()) {
        out.refusal = toy_rejection(503, held, slots_.load());
        out.refusal_owner = shared_from_this();
        return out;
      }
    } while (!held_.compare_exchange_weak(held, held + 1));
    out.permit = LeasePermit(ToyLease{std::static_pointer_cast<ToyPolicy>(shared_from_this())});
    out.chosen = "slot-" + std::to_string(held);
    if (!colour.empty()) out.attributes.emplace_back("colour", colour);
    out.attributes.emplace_back("slot", std::to_string(held));
    return out;
  }

  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const auto* spec = c.spec.as<ToySpec>();
    if (spec->wants_budget || !spec->coordinator.empty()) return Reconfiguration{};  // rebuild
    const std::uint32_t slots = spec->slots;
    return Reconfiguration([this, slots] { slots_.store(slots); });
  }

  // What its routes and methods do.
  void open() {
    open_.store(true);
    wake_loops();
  }
  void await_open(Completion<std::uint64_t> done) {
    {
      const std::lock_guard lock(mu_);
      if (retired()) return done(Status(StatusCode::kUnavailable, "retired"));
      if (!open_.load()) {
        waiters_.push_back(std::move(done));
        return;
      }
    }
    done(ticks_.load());
  }
  // A note set at run time, kept in the server's state file.
  [[nodiscard]] Status set_note(std::string text) { return state_.put("note", std::move(text)); }
  [[nodiscard]] std::string note() const {
    auto v = state_.get("note");
    return v.ok() && v.value() ? v.value()->get<std::string>() : "";
  }
  [[nodiscard]] std::uint64_t ticks() const { return ticks_.load(); }
  [[nodiscard]] std::uint32_t slots() const { return slots_.load(); }
  [[nodiscard]] std::size_t pending() const {
    const std::lock_guard lock(mu_);
    return pending_.size();
  }

 protected:
  void describe(json& j, PolicyInfo& info) const override {
    info.in_flight = held_.load();
    info.limit = slots_.load();
    j["slots"] = info.limit;
    j["in_flight"] = info.in_flight;
    json ends = json::object();
    const std::lock_guard lock(mu_);
    for (const auto& [word, n] : ends_) ends[word] = n;
    j["ends"] = std::move(ends);
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    out.push_back(
        one("toy_slots", "Slots of the toy policy", prometheus::MetricType::Gauge, slots_.load()));
    out.push_back(
        top_k_family("toy_hits_by_key", "Hits checked, by the busiest keys", "key", by_key_));
  }
  // Whatever is still parked is answered: a retired policy finishes what it holds.
  void on_retire() noexcept override {
    for (Pending& p : take_pending())
      p.done(Status(StatusCode::kUnavailable, "policy " + name() + " was retired"));
    std::vector<Completion<std::uint64_t>> waiters;
    {
      const std::lock_guard lock(mu_);
      waiters.swap(waiters_);
    }
    for (auto& w : waiters) w(Status(StatusCode::kUnavailable, "retired"));
  }

 private:
  struct Pending {
    std::string key;
    std::uint64_t hits;
    Completion<RateDecision> done;
  };
  struct ToyLease {
    std::shared_ptr<ToyPolicy> policy;
    void finish(const CallEnd& end) noexcept {
      policy->held_.fetch_sub(1);
      policy->count_end(end);
    }
  };

  // How a call ended, in the toy's own words: every kind maps the one outcome vocabulary for
  // itself.
  void count_end(const CallEnd& end) noexcept {
    const char* word = "unsaid";
    switch (end.result) {
      case CallResult::kSuccess:
        word = "fine";
        break;
      case CallResult::kDropped:
        word = "lost";
        break;
      case CallResult::kTimeout:
        word = "late";
        break;
      case CallResult::kOverload:
        word = "swamped";
        break;
      case CallResult::kFailed:
        word = "broken";
        break;
      case CallResult::kIgnored:
        word = "unsaid";
        break;
    }
    try {
      const std::lock_guard lock(mu_);
      ++ends_[word];
    } catch (...) {  // a tally that cannot grow loses a count, never the release
    }
  }

  std::vector<Pending> take_pending() {
    const std::lock_guard lock(mu_);
    return std::exchange(pending_, {});
  }
  // One round: once open, decides every parked check and answers every waiter.
  Nanos tick(Nanos now) {
    ticks_.fetch_add(1);
    if (open_.load()) {
      for (Pending& p : take_pending()) p.done(check(p.key, p.hits, now));
      std::vector<Completion<std::uint64_t>> waiters;
      {
        const std::lock_guard lock(mu_);
        waiters.swap(waiters_);
      }
      for (auto& w : waiters) w(ticks_.load());
    }
    return now + std::chrono::milliseconds(20);
  }

  RateDecision decide(std::string_view key, std::uint64_t hits, Nanos /*now*/) const {
    auto it = spent_.find(std::string(key));
    const std::uint64_t spent = it == spent_.end() ? 0 : it->second;
    const std::uint64_t slots = slots_.load();
    RateDecision d;
    d.limit = slots;
    d.allowed = spent + hits <= slots;
    d.remaining = slots - std::min<std::uint64_t>(slots, spent + (d.allowed ? hits : 0));
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

  RuntimeState state_;
  TopK by_key_{2};
  std::atomic<std::uint32_t> slots_;
  std::atomic<std::uint32_t> held_{0};
  std::atomic<bool> open_{false};
  std::atomic<std::uint64_t> ticks_{0};
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> spent_;
  std::map<std::string, std::uint64_t> ends_;  // releases by the toy's word for their outcome
  std::vector<Pending> pending_;
  std::vector<Completion<std::uint64_t>> waiters_;
};

std::shared_ptr<ToyPolicy> toy_named(const KindPolicies& ps, std::string_view name) {
  for (const auto& p : ps)
    if (p->name() == name) return std::static_pointer_cast<ToyPolicy>(p);
  return nullptr;
}

// The toy a route or method names: NOT_FOUND naming it when there is none.
StatusOr<std::shared_ptr<ToyPolicy>> find_toy(const KindPolicies& ps, std::string_view name) {
  if (auto toy = toy_named(ps, name)) return toy;
  return Status(StatusCode::kNotFound, "policy: no toy named '" + std::string(name) + "'");
}

constexpr const char* kAwaitMethod = "/sluice.toy.v1.Toy/AwaitOpen";

PolicyKind toy_kind() {
  const auto parse = [](const std::string&, ConfigSection& s, PolicySpec& spec) {
    s.keys({"kind", "slots", "rate", "coordinator", "wants_budget"});
    auto body = std::make_shared<ToySpec>();
    if (auto v = s.u32("slots", 1)) body->slots = *v;
    if (auto v = s.str("coordinator")) {
      body->coordinator = *v;
      spec.coordinators = {*v};
    }
    if (auto b = s.boolean("wants_budget")) body->wants_budget = *b;
    return std::shared_ptr<const PolicyBody>(body);
  };
  const auto build = [](const BuildContext& c) -> StatusOr<std::shared_ptr<Policy>> {
    const ToySpec& spec = *c.spec.as<ToySpec>();
    if (!spec.coordinator.empty()) {
      auto fleet = c.coordinator<ConcurrencyCoordinator>(spec.coordinator, "a fleet interface");
      if (!fleet.ok()) return fleet.status();
      if (spec.wants_budget) {
        auto budget = c.coordinator<ToyBudget>(spec.coordinator, "a toy budget");
        if (!budget.ok()) return budget.status();
      }
    }
    auto p = std::make_shared<ToyPolicy>(c, spec.slots);
    p->start(c.clock);
    return std::shared_ptr<Policy>(std::move(p));
  };
  PolicyKind kind("toy", PolicyKind::kRate | PolicyKind::kAdmit, parse, build);
  // GET /toy/{policy}?field=slots|ticks|pending: one number.
  kind.routes.push_back(HttpRoute{{"GET", "HEAD"},
                                  "/toy/{policy}",
                                  false,
                                  [](const RouteRequest& req, const KindPolicies& ps,
                                     Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                                    auto toy = find_toy(ps, req.param("policy"));
                                    if (!toy.ok()) return toy.status();
                                    const std::string_view field =
                                        req.arg("field").value_or("slots");
                                    RouteReply r;
                                    if (field == "slots")
                                      r.body = std::to_string(toy.value()->slots());
                                    else if (field == "ticks")
                                      r.body = std::to_string(toy.value()->ticks());
                                    else if (field == "pending")
                                      r.body = std::to_string(toy.value()->pending());
                                    else if (field == "note")
                                      r.body = toy.value()->note();
                                    else
                                      return Status(StatusCode::kInvalidArgument,
                                                    "field: unknown '" + std::string(field) + "'");
                                    r.content_type = "text/plain";
                                    return r;
                                  }});
  // POST /toy/{policy}/open (admin): parked checks are decided.
  kind.routes.push_back(
      HttpRoute{{"POST"},
                "/toy/{policy}/open",
                true,
                [](const RouteRequest& req, const KindPolicies& ps,
                   Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                  auto toy = find_toy(ps, req.param("policy"));
                  if (!toy.ok()) return toy.status();
                  toy.value()->open();
                  return RouteReply{200, "application/json", R"({"opened":true})", {}};
                }});
  // PUT /toy/{policy}/note?text=... (admin): a rule set at run time, persisted.
  kind.routes.push_back(HttpRoute{
      {"PUT"},
      "/toy/{policy}/note",
      true,
      [](const RouteRequest& req, const KindPolicies& ps,
         Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        auto toy = find_toy(ps, req.param("policy"));
        if (!toy.ok()) return toy.status();
        if (Status s = toy.value()->set_note(std::string(req.arg("text").value_or(""))); !s.ok())
          return s;
        return RouteReply{204, "text/plain", "", {}};
      }});
  // GET /toy/{policy}/await: answers once the toy is open (a route decided later).
  kind.routes.push_back(HttpRoute{
      {"GET"},
      "/toy/{policy}/await",
      false,
      [](const RouteRequest& req, const KindPolicies& ps,
         Deferral<RouteReply>& later) -> Decided<RouteReply> {
        auto toy = find_toy(ps, req.param("policy"));
        if (!toy.ok()) return toy.status();
        toy.value()->await_open([done = later.defer()](StatusOr<std::uint64_t> ticks) mutable {
          if (!ticks.ok()) return done(ticks.status());
          done(RouteReply{200, "text/plain", "open after " + std::to_string(ticks.value()), {}});
        });
        return std::nullopt;
      }});
  // gRPC AwaitOpen(StringValue policy) -> UInt64Value ticks, once the toy is open.
  kind.methods.push_back(GrpcMethod{
      kAwaitMethod,
      [](std::string_view request, const KindPolicies& ps,
         Deferral<std::string>& later) -> Decided<std::string> {
        google::protobuf::StringValue name;
        if (!name.ParseFromArray(request.data(), static_cast<int>(request.size())))
          return Status(StatusCode::kInvalidArgument, "request: not a StringValue");
        auto toy = find_toy(ps, name.value());
        if (!toy.ok()) return toy.status();
        toy.value()->await_open([done = later.defer()](StatusOr<std::uint64_t> ticks) mutable {
          if (!ticks.ok()) return done(ticks.status());
          google::protobuf::UInt64Value v;
          v.set_value(ticks.value());
          done(v.SerializeAsString());
        });
        return std::nullopt;
      }});
  return kind;
}

// ---- a plain HTTP/1.1 client over a socket ----

struct Reply {
  int status = 0;
  std::string head, body;
};

Reply http(int port, const std::string& method, const std::string& target,
           const std::string& body = {}, const std::string& extra_headers = {}) {
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
                          extra_headers + "Content-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body;
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
server:
  admin_token: s3cret
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
    methods_ = std::make_unique<transport::GrpcKindMethods>(*engine_);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port_);
    b.RegisterService(service_.get());
    b.RegisterCallbackGenericService(methods_.get());
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
    if (engine_) engine_->close();  // retired toys answer whatever they still hold
    if (grpc_) grpc_->Shutdown();
  }
  // Polls the toy's own route until `field` reads `want` (or 5 s pass).
  bool toy_reads(const std::string& policy, const std::string& field, const std::string& want) {
    for (int i = 0; i < 500; ++i) {
      if (http(http_port_, "GET", "/toy/" + policy + "?field=" + field).body == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  Reply open_toy(const std::string& policy) {
    return http(http_port_, "POST", "/toy/" + policy + "/open", "",
                "Authorization: Bearer s3cret\r\n");
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
  std::unique_ptr<transport::GrpcKindMethods> methods_;
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

TEST_F(ToyKind, ItsPerKeyMetricHasBoundedCardinality) {
  // Any number of client keys; the metric keeps the 2 busiest (Space-Saving) and no more.
  for (int i = 0; i < 50; ++i)
    ASSERT_TRUE(engine_->check(CheckCall{"play", "k" + std::to_string(i), 1}).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine_->check(CheckCall{"play", "busy", 1}).ok());
  const std::string text = engine_->metrics_text();
  std::size_t series = 0;
  for (std::size_t at = text.find("toy_hits_by_key{"); at != std::string::npos;
       at = text.find("toy_hits_by_key{", at + 1))
    ++series;
  EXPECT_EQ(series, 2u) << text;
  EXPECT_NE(text.find("toy_hits_by_key{policy=\"play\",key=\"busy\"}"), std::string::npos) << text;
}

TEST_F(ToyKind, ADeferredCheckParksItsHttpSessionWithoutHoldingAThread) {
  // The HTTP server runs one thread: while the cold check waits, that thread still serves.
  auto parked = std::async(std::launch::async, [&] {
    return http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"cold:a"})");
  });
  ASSERT_TRUE(toy_reads("play", "pending", "1"));
  EXPECT_EQ(http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"hot"})").status, 200);
  EXPECT_EQ(parked.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // The toy's admin route needs the admin token; with it, the loop decides the parked check.
  EXPECT_EQ(http(http_port_, "POST", "/toy/play/open").status, 401);
  EXPECT_EQ(open_toy("play").status, 200);
  const Reply r = parked.get();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["remaining"], 1);
  // Decided later, spent for real: the key has 1 of its 2 left.
  const Reply over =
      http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"cold:a","hits":2})");
  EXPECT_EQ(over.status, 429) << over.body;
}

TEST_F(ToyKind, ADeferredCheckFinishesItsGrpcCallLater) {
  auto parked = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    pb::CheckRequest req;
    req.set_policy("play");
    req.set_key("cold:g");
    pb::CheckResponse resp;
    const grpc::Status st = stub_->Check(&ctx, req, &resp);
    return std::make_pair(st.ok(), resp.decision().allowed());
  });
  ASSERT_TRUE(toy_reads("play", "pending", "1"));
  EXPECT_EQ(parked.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(open_toy("play").status, 200);
  const auto [ok, allowed] = parked.get();
  EXPECT_TRUE(ok);
  EXPECT_TRUE(allowed);
}

TEST_F(ToyKind, CheckManyWithADeferredCheckIsAllOrNothing) {
  // The cold check is deferred; the hot one is denied inline (3 > 2): the whole call is
  // denied once the cold one is in, and the cold key's hit is given back.
  auto denied = std::async(std::launch::async, [&] {
    return http(http_port_, "POST", "/v1/check_many",
                R"({"checks":[{"policy":"play","key":"cold:m"},)"
                R"({"policy":"play","key":"hot","hits":3}]})");
  });
  ASSERT_TRUE(toy_reads("play", "pending", "1"));
  ASSERT_EQ(open_toy("play").status, 200);
  const Reply r = denied.get();
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(json::parse(r.body)["denied_index"], 1);
  EXPECT_EQ(json::parse(r.body)["decisions"].size(), 2u);
  const Reply peek =
      http(http_port_, "POST", "/v1/peek", R"({"policy":"play","key":"cold:m","hits":2})");
  EXPECT_EQ(json::parse(peek.body)["allowed"], true) << "the deferred hit was not refunded";
  // All allowed (the toy is open now, so the cold one is decided by its loop at once).
  const Reply ok = http(http_port_, "POST", "/v1/check_many",
                        R"({"checks":[{"policy":"play","key":"cold:n"},)"
                        R"({"policy":"play","key":"hot2","hits":2}]})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["allowed"], true);
  // In-process callers wait on their own thread for the same answer.
  const std::vector<CheckCall> calls = {{"play", "cold:p", 1}, {"play", "hot3", 1}};
  auto many = engine_->check_many(calls);
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  EXPECT_TRUE(many.value().allowed);
}

TEST_F(ToyKind, ItsRoutesParsePathAndQueryAndMayAnswerLater) {
  Reply r = http(http_port_, "GET", "/toy/play?field=slots");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "2");
  EXPECT_EQ(http(http_port_, "GET", "/toy/chained?x=1&field=slots").body, "5");
  r = http(http_port_, "GET", "/toy/play?field=bogus");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("field: unknown 'bogus'"), std::string::npos) << r.body;
  r = http(http_port_, "GET", "/toy/pl%61y?field=sl%6fts");  // percent-decoded
  EXPECT_EQ(r.body, "2");
  r = http(http_port_, "GET", "/toy/no%20such");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("no toy named 'no such'"), std::string::npos) << r.body;
  r = http(http_port_, "GET", "/toy/play?field=%zz");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("malformed percent-escape"), std::string::npos) << r.body;
  r = http(http_port_, "POST", "/toy/play");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: GET, HEAD"), std::string::npos) << r.head;
  // A route decided later.
  auto waiting =
      std::async(std::launch::async, [&] { return http(http_port_, "GET", "/toy/play/await"); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(open_toy("play").status, 200);
  r = waiting.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.rfind("open after ", 0), 0u) << r.body;
}

TEST_F(ToyKind, ItsGrpcMethodIsServedAndMayAnswerLater) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const auto call = [&](const std::string& method, const std::string& policy) {
    google::protobuf::StringValue req;
    req.set_value(policy);
    grpc::Slice slice(req.SerializeAsString());
    grpc::ByteBuffer in(&slice, 1), out;
    grpc::ClientContext ctx;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &in, &out,
                   [&](grpc::Status st) { done.set_value(std::move(st)); });
    grpc::Status st = done.get_future().get();
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (st.ok() && out.Dump(&slices).ok())
      for (const auto& sl : slices)
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    google::protobuf::UInt64Value v;
    v.ParseFromString(bytes);
    return std::make_pair(st, v.value());
  };
  auto waiting = std::async(std::launch::async, [&] { return call(kAwaitMethod, "play"); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(open_toy("play").status, 200);
  const auto [st, ticks] = waiting.get();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_GE(ticks, 1u);
  EXPECT_EQ(call(kAwaitMethod, "nope").first.error_code(), grpc::StatusCode::NOT_FOUND);
  const auto unknown = call("/sluice.toy.v1.Toy/Nope", "play").first;
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(unknown.error_message().find("/sluice.toy.v1.Toy/Nope"), std::string::npos);
}

TEST_F(ToyKind, AnAdmitNamesWhatItChose) {
  pb::AdmitResponse a1, a2;
  ASSERT_TRUE(admit("play", "x", a1).ok());
  EXPECT_EQ(a1.chosen(), "slot-0");
  const Reply r = http(http_port_, "POST", "/v1/admit", R"({"policy":"play"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["chosen"], "slot-1");
}

// The sluice CLI (a user's shell): its stdout, and its exit code.
struct CliRun {
  int code = -1;
  std::string out;
};
CliRun cli(const std::string& args) {
  CliRun r;
  FILE* p = popen((std::string(SLUICE_CLI_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The toy reads an attribute of its own (`colour`) and answers with its own (`colour`, `slot`),
// and maps every release outcome to a word of its own: over gRPC, HTTP and the CLI, with no
// field, flag or route for either anywhere but this file.
TEST_F(ToyKind, ItsOwnAttributeAndOutcomesAreServedOverEveryTransportAndTheCli) {
  const auto answered = [](const pb::AdmitResponse& r) {
    std::map<std::string, std::string> out;
    for (const pb::Attribute& a : r.attributes()) out[a.name()] += a.value();
    return out;
  };
  // gRPC: the attribute read, checked (by the kind: the engine knows no colour) and answered.
  grpc::ClientContext c1;
  pb::AdmitRequest req;
  req.set_policy("play");
  pb::Attribute* colour = req.add_attributes();
  colour->set_name("colour");
  colour->set_value("red");
  pb::AdmitResponse red;
  ASSERT_TRUE(stub_->Admit(&c1, req, &red).ok());
  ASSERT_TRUE(red.admitted());
  EXPECT_EQ(answered(red), (std::map<std::string, std::string>{{"colour", "red"}, {"slot", "0"}}));
  colour->set_value("pink");
  grpc::ClientContext c2;
  pb::AdmitResponse bad;
  grpc::Status st = stub_->Admit(&c2, req, &bad);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "colour: must be red, green or blue, not 'pink'");
  colour->set_value("red");
  pb::Attribute* again = req.add_attributes();
  again->set_name("colour");
  again->set_value("blue");
  grpc::ClientContext c3;
  st = stub_->Admit(&c3, req, &bad);
  EXPECT_EQ(st.error_message(), "colour: takes one value, given 2");
  EXPECT_EQ(engine_->leases(), 1u) << "a refused attribute costs nothing";

  // HTTP: the same attribute in the body's `attributes`, answered in the JSON's.
  Reply h =
      http(http_port_, "POST", "/v1/admit", R"({"policy":"play","attributes":{"colour":"green"}})");
  ASSERT_EQ(h.status, 200) << h.body;
  const json green = json::parse(h.body);
  EXPECT_EQ(green["attributes"], json({{"colour", "green"}, {"slot", "1"}})) << h.body;
  h = http(http_port_, "POST", "/v1/admit", R"({"policy":"play","attributes":{"colour":"grey"}})");
  EXPECT_EQ(h.status, 400);
  EXPECT_EQ(json::parse(h.body)["error"]["message"],
            "colour: must be red, green or blue, not 'grey'");

  // Outcomes: released with timeout over gRPC and overload over HTTP, in the toy's words.
  grpc::ClientContext c4;
  pb::ReleaseRequest rel;
  rel.set_lease_id(red.lease_id());
  rel.set_outcome(pb::OUTCOME_TIMEOUT);
  pb::ReleaseResponse rr;
  ASSERT_TRUE(stub_->Release(&c4, rel, &rr).ok());
  h = http(
      http_port_, "POST", "/v1/release",
      R"({"lease_id":")" + green["lease_id"].get<std::string>() + R"(","outcome":"overload"})");
  ASSERT_EQ(h.status, 200) << h.body;

  // The CLI: --attribute in, the answer's attributes out; released as failed.
  const std::string server = " -s 127.0.0.1:" + std::to_string(grpc_port_);
  CliRun run = cli("admit play -a colour=blue --json" + server);
  ASSERT_EQ(run.code, 0) << run.out;
  const json blue = json::parse(run.out);
  EXPECT_EQ(blue["attributes"], json({{"colour", "blue"}, {"slot", "0"}})) << run.out;
  EXPECT_EQ(cli("admit play -a colour=pink" + server).code, 2);
  EXPECT_EQ(cli("admit play -a colour" + server).code, 2) << "not name=value";
  run = cli("release " + blue["lease_id"].get<std::string>() + " --outcome failed" + server);
  EXPECT_EQ(run.code, 0) << run.out;

  const std::shared_ptr<ToyPolicy> toy = toy_named(*engine_->policies_of("toy"), "play");
  ASSERT_NE(toy, nullptr);
  EXPECT_EQ(toy->state()["ends"], json({{"late", 1}, {"swamped", 1}, {"broken", 1}}));
  EXPECT_EQ(engine_->leases(), 0u);
}

TEST_F(ToyKind, AReloadOfTheSameKindTakesTheNewSpecInPlace) {
  pb::AdmitResponse a1, a2;
  ASSERT_TRUE(admit("play", "x", a1).ok());
  ASSERT_TRUE(admit("play", "x", a2).ok());
  ASSERT_TRUE(a2.admitted());
  ASSERT_TRUE(engine_->check(CheckCall{"play", "k", 2}).value().allowed);
  const std::shared_ptr<ToyPolicy> before = toy_named(*engine_->policies_of("toy"), "play");

  std::string next = kConfig;
  next.replace(next.find("slots: 2"), 8, "slots: 1");
  ConfigLoad load = load_config(next, kinds_);
  ASSERT_TRUE(load.config);
  auto summary = engine_->reload(*load.config);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  EXPECT_EQ(summary.value().reconfigured, std::vector<std::string>{"play"});
  EXPECT_TRUE(summary.value().changed.empty());
  EXPECT_EQ(toy_named(*engine_->policies_of("toy"), "play"), before);  // the same object
  EXPECT_EQ(http(http_port_, "GET", "/toy/play?field=slots").body, "1");
  // Its two leases still count against the new limit of one; its rate state is kept.
  pb::AdmitResponse a3;
  ASSERT_TRUE(admit("play", "x", a3).ok());
  EXPECT_FALSE(a3.admitted());
  EXPECT_FALSE(engine_->check(CheckCall{"play", "k", 1}).value().allowed);
  ASSERT_TRUE(engine_->release(a1.lease_id(), CallResult::kSuccess, std::nullopt).ok());
  ASSERT_TRUE(admit("play", "x", a3).ok());
  EXPECT_FALSE(a3.admitted());  // 1 held of 1
  ASSERT_TRUE(engine_->release(a2.lease_id(), CallResult::kSuccess, std::nullopt).ok());
  ASSERT_TRUE(admit("play", "x", a3).ok());
  EXPECT_TRUE(a3.admitted());

  // A reload that fails elsewhere applies nothing: play keeps slots 1.
  std::string bad = next;
  bad.replace(bad.find("slots: 1"), 8, "slots: 7");
  bad += "  broken:\n    kind: toy\n    coordinator: memory\n    wants_budget: true\n";
  ConfigLoad bad_load = load_config(bad, kinds_);
  ASSERT_TRUE(bad_load.config);
  auto failed = engine_->reload(*bad_load.config);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(http(http_port_, "GET", "/toy/play?field=slots").body, "1");
}

TEST_F(ToyKind, RetiringStopsItsLoopAndAnswersWhatItHolds) {
  const auto toy = toy_named(*engine_->policies_of("toy"), "play");
  ASSERT_NE(toy, nullptr);
  // Its loop runs: it ticks every 20 ms.
  for (int i = 0; i < 500 && toy->ticks() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(toy->ticks(), 3u);
  auto parked = std::async(std::launch::async, [&] {
    return http(http_port_, "POST", "/v1/check", R"({"policy":"play","key":"cold:r"})");
  });
  ASSERT_TRUE(toy_reads("play", "pending", "1"));
  std::string next = kConfig;
  next.erase(next.find("  play:"), std::string("  play:\n    kind: toy\n    slots: 2\n").size());
  ConfigLoad load = load_config(next, kinds_);
  ASSERT_TRUE(load.config) << load.errors.front().to_string("next");
  auto summary = engine_->reload(*load.config);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary.value().removed, std::vector<std::string>{"play"});
  const Reply r = parked.get();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("policy play was retired"), std::string::npos) << r.body;
  const std::uint64_t ticks = toy->ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(toy->ticks(), ticks) << "its loop still runs after retire";
  EXPECT_TRUE(toy->retired());
}

TEST(ToyKindState, RulesSetAtRunTimeSurviveARestart) {
  char dir_template[] = "/tmp/sluice-toy-state-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string file = std::string(dir_template) + "/state.json";
  PolicyRegistry kinds = PolicyRegistry::builtin();
  ASSERT_TRUE(kinds.add(toy_kind()));
  const std::string yaml =
      "server:\n  state_file: " + file + "\npolicies:\n  p:\n    kind: toy\n    slots: 3\n";
  ConfigLoad load = load_config(yaml, kinds);
  ASSERT_TRUE(load.config) << load.errors.front().to_string("yaml");
  ManualClock clock{std::chrono::seconds(1)};
  {
    auto engine = Engine::create(*load.config, clock, kinds);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    transport::HttpExchange put{
        "PUT", "/toy/p/note?text=keep+me%21", "", "", "127.0.0.1:5000", 0, "", "", {}};
    transport::handle_http(*engine.value(), nullptr, put);
    EXPECT_EQ(put.status, 204u) << put.response;
  }
  auto restarted = Engine::create(*load.config, clock, kinds);
  ASSERT_TRUE(restarted.ok());
  transport::HttpExchange get{"GET", "/toy/p?field=note", "", "", "", 0, "", "", {}};
  transport::handle_http(*restarted.value(), nullptr, get);
  EXPECT_EQ(get.response, "keep me!");
  // A state file the store did not write is an error at start, naming the setting.
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not json", f);
  std::fclose(f);
  auto refused = Engine::create(*load.config, clock, kinds);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().rfind("server.state_file: ", 0), 0u)
      << refused.status().message();
  std::remove(file.c_str());
  rmdir(dir_template);
}

TEST(ToyKindCoordinators, AKindAsksANamedCoordinatorForEachInterfaceItUses) {
  PolicyRegistry kinds = PolicyRegistry::builtin();
  ASSERT_TRUE(kinds.add(toy_kind()));
  ManualClock clock{std::chrono::seconds(1)};
  ConfigLoad fleet =
      load_config("policies:\n  p:\n    kind: toy\n    coordinator: memory\n", kinds);
  ASSERT_TRUE(fleet.config);
  auto ok = Engine::create(*fleet.config, clock, kinds);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  ConfigLoad budget = load_config(
      "policies:\n  p:\n    kind: toy\n    coordinator: memory\n    wants_budget: true\n", kinds);
  ASSERT_TRUE(budget.config);
  auto refused = Engine::create(*budget.config, clock, kinds);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "policy p: coordinator memory (memory) does not serve a toy budget");
}

TEST(ToyKindRoutes, ARouteOrMethodTakenByAnotherKindIsRefused) {
  PolicyRegistry kinds = PolicyRegistry::builtin();
  ASSERT_TRUE(kinds.add(toy_kind()));
  PolicyKind twin = toy_kind();
  twin.name = "twin";
  twin.methods.clear();
  EXPECT_FALSE(kinds.add(twin));  // /toy/{policy} is the toy's (whatever the parameter's name)
  twin.routes = {HttpRoute{{"GET"}, "/twin/{a}/{a}", false, twin.routes.front().handle}};
  EXPECT_FALSE(kinds.add(twin));  // malformed: a parameter named twice
  twin.routes.front().pattern = "/twin/{a}";
  twin.methods = {GrpcMethod{kAwaitMethod, toy_kind().methods.front().handle}};
  EXPECT_FALSE(kinds.add(twin));  // the method is the toy's
  twin.methods.front().name = "/sluice.toy.v1.Twin/AwaitOpen";
  EXPECT_TRUE(kinds.add(twin));
  EXPECT_NE(kinds.router().match("/twin/x").entry, nullptr);
  EXPECT_EQ(kinds.router().match("/twin/x").entry->kind, "twin");
}

TEST(ToyKindConfig, ItsParserReportsItsOwnErrorsWithTheirLines) {
  PolicyRegistry kinds = PolicyRegistry::builtin();
  ASSERT_TRUE(kinds.add(toy_kind()));
  EXPECT_FALSE(kinds.add(toy_kind()));  // one kind per name
  const ConfigLoad bad = load_config("policies:\n  p:\n    kind: toy\n    slot: 3\n", kinds);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0].to_string("f"),
            "f:4:5: policies.p.slot: unknown key (expected one of: kind, slots, rate, coordinator, "
            "wants_budget)");
  // An unknown kind lists every kind the loader knows, the toy among them.
  const ConfigLoad unknown = load_config("policies:\n  p:\n    kind: tyo\n", kinds);
  ASSERT_EQ(unknown.errors.size(), 1u);
  EXPECT_NE(unknown.errors[0].message.find(
                "rate, adaptive, fleet, concurrency, federated, throttler, cascade, "
                "envoy_ratelimit, toy"),
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
