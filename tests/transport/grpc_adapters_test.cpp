// The gRPC call-site adapters (sluice/adapters/grpc_admission.h) over real grpc::Servers on
// 127.0.0.1: a backend (the standard health service, told by the request's `service` what to
// do: "ok", "slow" 1 ms, "hold" until let go, "overload" UNAVAILABLE, "bad" INVALID_ARGUMENT) and a
// sluice server (the engine and its gRPC service). The client interceptor with a remote admitter:
// calls past the limit are refused UNAVAILABLE and never reach the backend, a chained rate
// policy's refusal is RESOURCE_EXHAUSTED with retry-after, each call's status reaches the server
// as its outcome, every lease is released, and the admitter fails open or closed as told when
// sluice does not answer; with lease reuse, a finished call's lease carries the next call of its
// key without an Admit, never two calls at once, and is released when sluice says it is over
// the limit or when it waited its hold. The same interceptor on the in-process library. The server
// interceptor: a refused call answers the refusal whatever its handler does, an admitted one is
// released with the handler's status; registered by register_admitted, a refused call's
// handler (unary or streaming) never runs. A remote rate policy: its refusal is RESOURCE_EXHAUSTED
// with retry-after, and with an allowance most calls are admitted without a Check and none past
// what the server granted, nor from a block after its hold.
#include "sluice/adapters/grpc_admission.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/testing/servers.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "sluice_test/v1/tally.grpc.pb.h"
#include "transport/grpc_service.h"

namespace sluice::adapters {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using namespace std::chrono_literals;

const char* kConfig = R"(
policies:
  backend:
    kind: adaptive
    algorithm: fixed
    limit: 2
  per-user:
    kind: rate
    strategy: fixed-window
    limit: 3
    period: 1m
  users:
    kind: adaptive
    algorithm: fixed
    limit: 100
    rate: per-user
  window:
    kind: rate
    strategy: fixed-window
    limit: 25
    period: 1h
  bucket:
    kind: rate
    strategy: gcra
    limit: 20
    period: 1s
  wide:
    kind: rate
    strategy: fixed-window
    limit: 1000000
    period: 1h
)";

// The backend: what each call does is its request's `service`.
class Backend final : public Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext* ctx, const HealthCheckRequest* req,
                     HealthCheckResponse* resp) override {
    if (check_refusal)
      if (auto refused = refusal(ctx)) return *refused;
    worked.fetch_add(1);
    const int now = active.fetch_add(1) + 1;
    for (int was = most.load(); now > was && !most.compare_exchange_weak(was, now);) {
    }
    struct Leave {
      std::atomic<int>& active;
      ~Leave() { active.fetch_sub(1); }
    } leave{active};
    if (req->service() == "slow") {
      std::this_thread::sleep_for(1ms);
    } else if (req->service() == "hold") {
      std::unique_lock lock(mu_);
      ++holding_;
      held_.notify_all();
      go_.wait(lock, [&] { return open_; });
      --holding_;
    } else if (req->service() == "overload") {
      return {grpc::StatusCode::UNAVAILABLE, "overloaded"};
    } else if (req->service() == "bad") {
      return {grpc::StatusCode::INVALID_ARGUMENT, "bad request"};
    }
    resp->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
  grpc::Status Watch(grpc::ServerContext* /*ctx*/, const HealthCheckRequest* /*req*/,
                     grpc::ServerWriter<HealthCheckResponse>* out) override {
    worked.fetch_add(1);
    HealthCheckResponse resp;
    resp.set_status(HealthCheckResponse::SERVING);
    out->Write(resp);
    return grpc::Status::OK;
  }
  void wait_holding(int n) {
    std::unique_lock lock(mu_);
    ASSERT_TRUE(held_.wait_for(lock, 10s, [&] { return holding_ == n; })) << holding_;
  }
  void let_go() {
    std::lock_guard lock(mu_);
    open_ = true;
    go_.notify_all();
  }

  std::atomic<int> worked{0};
  std::atomic<int> active{0}, most{0};  // Check calls running now, and the most at once
  bool check_refusal = true;

 private:
  std::mutex mu_;
  std::condition_variable held_, go_;
  int holding_ = 0;
  bool open_ = false;
};

grpc::Status call(Health::Stub& stub, const std::string& what, const std::string& key = "",
                  std::multimap<grpc::string_ref, grpc::string_ref>* trailers = nullptr,
                  std::string* retry_after = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  if (!key.empty()) ctx.AddMetadata("x-sluice-key", key);
  HealthCheckRequest req;
  req.set_service(what);
  HealthCheckResponse resp;
  grpc::Status s = stub.Check(&ctx, req, &resp);
  const auto& t = ctx.GetServerTrailingMetadata();
  if (trailers != nullptr) *trailers = t;
  if (retry_after != nullptr) {
    const auto it = t.find("retry-after");
    *retry_after = it == t.end() ? "" : std::string(it->second.data(), it->second.size());
  }
  return s;
}

class GrpcAdapters : public ::testing::Test {
 protected:
  void SetUp() override {
    kinds_ = server::PolicyRegistry::builtin();
    ConfigLoad load = load_config(kConfig, kinds_);
    ASSERT_TRUE(load.config) << load.errors.front().to_string("test");
    auto e = server::Engine::create(*load.config, SteadyClock::instance(), kinds_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
    service_ = std::make_unique<transport::GrpcService>(*engine_);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &sluice_port_);
    b.RegisterService(service_.get());
    sluice_ = b.BuildAndStart();
    ASSERT_NE(sluice_, nullptr);
  }
  void TearDown() override {
    if (backend_server_) backend_server_->Shutdown(std::chrono::system_clock::now() + 5s);
    if (engine_) engine_->close();
    if (sluice_) sluice_->Shutdown(std::chrono::system_clock::now() + 5s);
  }

  std::shared_ptr<grpc::Channel> sluice_channel() {
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice_port_),
                               grpc::InsecureChannelCredentials());
  }
  std::shared_ptr<RemoteAdmitter> remote(const std::string& policy, bool fail_open = true,
                                         std::shared_ptr<grpc::Channel> channel = nullptr) {
    RemoteOptions o;
    o.policy = policy;
    o.fail_open = fail_open;
    return std::make_shared<RemoteAdmitter>(channel ? channel : sluice_channel(), o);
  }
  // The backend, with the server interceptor when given an admitter; gated: registered by
  // register_admitted (a refused call's handler never runs).
  void start_backend(std::shared_ptr<Admitter> server_side = nullptr, bool gated = false) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &backend_port_);
    if (gated) {
      gated_backend_ = register_admitted<Health>(b, backend_, server_side);
    } else {
      b.RegisterService(&backend_);
      if (server_side) b.experimental().SetInterceptorCreators(server_interceptors(server_side));
    }
    backend_server_ = b.BuildAndStart();
    ASSERT_NE(backend_server_, nullptr);
  }
  std::unique_ptr<Health::Stub> stub(std::shared_ptr<Admitter> client_side) {
    const std::string target = "127.0.0.1:" + std::to_string(backend_port_);
    return Health::NewStub(
        client_side ? admitted_channel(target, grpc::InsecureChannelCredentials(), client_side)
                    : grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  }
  nlohmann::json state(const std::string& policy) {
    for (const server::PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }
  // Two calls the backend holds (the "backend" policy's limit) until let_go().
  std::vector<std::future<grpc::Status>> hold_two(Health::Stub& s) {
    std::vector<std::future<grpc::Status>> holding;
    for (int i = 0; i < 2; ++i)
      holding.push_back(std::async(std::launch::async, [&s] { return call(s, "hold"); }));
    backend_.wait_holding(2);
    return holding;
  }
  // Waits for the releases sent to reach the server.
  void settle(const RemoteAdmitter& a) {
    for (int i = 0; i < 500 && a.releases_in_flight() > 0; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(a.releases_in_flight(), 0u);
  }

  server::PolicyRegistry kinds_;
  std::unique_ptr<server::Engine> engine_;
  std::unique_ptr<transport::GrpcService> service_;
  std::unique_ptr<grpc::Server> sluice_;
  int sluice_port_ = 0;
  Backend backend_;
  std::unique_ptr<grpc::Service> gated_backend_;  // outlives the server that serves it
  std::unique_ptr<grpc::Server> backend_server_;
  int backend_port_ = 0;
};

TEST_F(GrpcAdapters, ClientCallsPastTheLimitAreRefusedAndNeverSent) {
  start_backend();
  auto admitter = remote("backend");
  auto s = stub(admitter);
  std::vector<std::future<grpc::Status>> holding = hold_two(*s);
  EXPECT_EQ(state("backend")["in_flight"], 2);
  const int worked = backend_.worked.load();
  const grpc::Status refused = call(*s, "ok");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("backend"), std::string::npos) << refused.error_message();
  EXPECT_EQ(backend_.worked.load(), worked);  // never sent
  backend_.let_go();
  for (auto& f : holding) EXPECT_TRUE(f.get().ok());
  EXPECT_TRUE(call(*s, "ok").ok());
  settle(*admitter);
  const nlohmann::json st = state("backend");
  EXPECT_EQ(st["in_flight"], 0);
  EXPECT_EQ(st["admitted"], 3);
  EXPECT_EQ(st["refused_by_limit"], 1);
  EXPECT_EQ(st["released"], 3);
}

TEST_F(GrpcAdapters, AChainedRateRefusalIsResourceExhaustedWithRetryAfterPerKey) {
  start_backend();
  auto admitter = remote("users");
  auto s = stub(admitter);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(call(*s, "ok", "u1").ok()) << i;
  std::string retry_after;
  const grpc::Status refused = call(*s, "ok", "u1", nullptr, &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  ASSERT_FALSE(retry_after.empty());
  const int seconds = std::stoi(retry_after);  // whole seconds, rounded up
  EXPECT_GE(seconds, 1);
  EXPECT_LE(seconds, 60);
  EXPECT_TRUE(call(*s, "ok", "u2").ok());  // another key has its own budget
  settle(*admitter);
  EXPECT_EQ(state("users")["in_flight"], 0);
  EXPECT_EQ(state("users")["refused_by_rate"], 1);
}

TEST_F(GrpcAdapters, EachStatusReachesTheServerAsItsOutcome) {
  start_backend();
  auto admitter = remote("backend");
  auto s = stub(admitter);
  EXPECT_EQ(call(*s, "overload").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(call(*s, "bad").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(call(*s, "ok").ok());
  settle(*admitter);
  const nlohmann::json st = state("backend");
  EXPECT_EQ(st["dropped"], 1);  // UNAVAILABLE: an overload
  EXPECT_EQ(st["ignored"], 1);  // INVALID_ARGUMENT: a failure, no latency evidence
  EXPECT_EQ(st["released"], 3);
  EXPECT_EQ(st["in_flight"], 0);
}

TEST_F(GrpcAdapters, ASluiceThatDoesNotAnswerFailsOpenOrClosedAsTold) {
  start_backend();
  // Nothing listens on a port the kernel just gave back.
  auto gone = grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice::testing::free_port()),
                                  grpc::InsecureChannelCredentials());
  EXPECT_TRUE(call(*stub(remote("backend", true, gone)), "ok").ok());
  const grpc::Status closed = call(*stub(remote("backend", false, gone)), "ok");
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(closed.error_message().find("sluice admit on backend"), std::string::npos)
      << closed.error_message();
  // An unknown policy is the caller's mistake, not an outage: refused, whatever fail_open says.
  const grpc::Status unknown = call(*stub(remote("nope", true)), "ok");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
}

// A sluice that is there but cannot answer (a server draining, say): every Admit and Check
// ends UNAVAILABLE, and is counted.
class Unanswering final : public v1::Sluice::Service {
 public:
  grpc::Status Admit(grpc::ServerContext*, const v1::AdmitRequest*, v1::AdmitResponse*) override {
    asked.fetch_add(1);
    return {grpc::StatusCode::UNAVAILABLE, "draining"};
  }
  grpc::Status Check(grpc::ServerContext*, const v1::CheckRequest*, v1::CheckResponse*) override {
    asked.fetch_add(1);
    return {grpc::StatusCode::UNAVAILABLE, "draining"};
  }
  std::atomic<int> asked{0};
};

TEST_F(GrpcAdapters, ASluiceThatFailedToAnswerIsNotAskedForUnreachableRetry) {
  start_backend();
  Unanswering down;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&down);
  const std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  RemoteOptions o;
  o.policy = "backend";
  o.fail_open = false;
  o.unreachable_retry = 400ms;
  auto s = stub(std::make_shared<RemoteAdmitter>(channel, o));
  for (int i = 0; i < 3; ++i) {
    std::string retry_after;
    const grpc::Status refused = call(*s, "ok", "", nullptr, &retry_after);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_EQ(retry_after, "1") << i;  // 0.4 s, in whole seconds rounded up
  }
  EXPECT_EQ(down.asked.load(), 1);  // the two after the failure were refused unasked
  std::this_thread::sleep_for(450ms);
  EXPECT_EQ(call(*s, "ok").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(down.asked.load(), 2);  // asked again once the time passed
  // The rate admitter the same; 0 asks every time; a negative time is refused by name.
  RemoteRateOptions r;
  r.policy = "per-user";
  r.unreachable_retry = 0ms;
  auto every = stub(std::make_shared<RemoteRateAdmitter>(channel, r));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(call(*every, "ok").ok());  // failing open
  EXPECT_EQ(down.asked.load(), 4);
  r.unreachable_retry = 60s;
  auto once = stub(std::make_shared<RemoteRateAdmitter>(channel, r));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(call(*once, "ok").ok());
  EXPECT_EQ(down.asked.load(), 5);
  EXPECT_EQ(backend_.worked.load(), 4);
  o.unreachable_retry = -1ms;
  EXPECT_THROW(RemoteAdmitter(channel, o), std::invalid_argument);
  r.unreachable_retry = -1ms;
  EXPECT_THROW(RemoteRateAdmitter(channel, r), std::invalid_argument);
  server->Shutdown(std::chrono::system_clock::now() + 2s);
}

std::shared_ptr<RemoteAdmitter> reusing(std::shared_ptr<grpc::Channel> channel,
                                        const std::string& policy, std::chrono::milliseconds hold) {
  RemoteOptions o;
  o.policy = policy;
  o.lease_reuse = hold;
  return std::make_shared<RemoteAdmitter>(std::move(channel), o);
}

// Sequential calls of one key: the first is admitted, the rest ride its lease. Within one hold
// of its Admit nothing is reported; the admitter releases the waiting lease when it goes, with
// every call it carried (`earlier`), each recorded at sluice.
TEST_F(GrpcAdapters, AKeptLeaseCarriesTheNextCallsOfItsKeyWithoutAnAdmit) {
  start_backend();
  auto admitter = reusing(sluice_channel(), "backend", 10s);
  auto s = stub(admitter);
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(call(*s, "ok", "k").ok()) << i;
  EXPECT_EQ(call(*s, "overload", "k").error_code(), grpc::StatusCode::UNAVAILABLE);
  settle(*admitter);
  EXPECT_EQ(admitter->calls_on_kept_leases(), 9u);
  EXPECT_EQ(admitter->keeps_sent(), 0u);
  EXPECT_EQ(admitter->leases_waiting(), 1u);
  nlohmann::json st = state("backend");
  EXPECT_EQ(st["admitted"], 1);
  EXPECT_EQ(st["in_flight"], 1);  // the waiting lease
  EXPECT_EQ(st["renewed"], 0);    // nothing reported yet
  // Another key has a lease of its own.
  EXPECT_TRUE(call(*s, "ok", "other").ok());
  EXPECT_EQ(state("backend")["admitted"], 2);
  s.reset();
  admitter.reset();  // releases both, with the calls they carried
  st = state("backend");
  EXPECT_EQ(st["in_flight"], 0);
  EXPECT_EQ(st["released"], 2);
  EXPECT_EQ(st["renewed"], 9);
  EXPECT_EQ(st["accepted"], 11);
  EXPECT_EQ(st["dropped"], 1);
}

// A kept lease's calls are reported with keep by the admitter's thread, once a hold has passed
// since it last was and while it carries a call (never on a call's path).
TEST_F(GrpcAdapters, AKeptLeaseReportsItsCallsOncePerHoldWhileItCarriesACall) {
  start_backend();
  auto admitter = reusing(sluice_channel(), "backend", 300ms);
  auto s = stub(admitter);
  EXPECT_TRUE(call(*s, "ok", "k").ok());
  EXPECT_EQ(call(*s, "overload", "k").error_code(), grpc::StatusCode::UNAVAILABLE);
  auto held = std::async(std::launch::async, [&] { return call(*s, "hold", "k"); });
  backend_.wait_holding(1);
  for (int i = 0; i < 500 && admitter->keeps_sent() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(admitter->keeps_sent(), 1u);
  settle(*admitter);
  nlohmann::json st = state("backend");
  EXPECT_EQ(st["admitted"], 1);
  EXPECT_EQ(st["renewed"], 2);  // the two calls before the one it carries
  EXPECT_EQ(st["dropped"], 1);
  backend_.let_go();
  EXPECT_TRUE(held.get().ok());
  EXPECT_EQ(admitter->calls_on_kept_leases(), 2u);
  EXPECT_EQ(state("backend")["in_flight"], 1);
}

// Threads calling one key past the limit: kept leases carry calls, and the backend never runs
// more calls at once than the policy's limit; every call is recorded once the leases go.
TEST_F(GrpcAdapters, KeptLeasesNeverRunMoreCallsThanThePermits) {
  start_backend();
  auto admitter = reusing(sluice_channel(), "backend", 10s);
  auto s = stub(admitter);
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        const grpc::Status st = call(*s, "slow", "k");
        (st.ok() ? ok : refused).fetch_add(1);
        if (!st.ok()) {
          EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load() + refused.load(), 200);
  EXPECT_GT(admitter->calls_on_kept_leases(), 0u);
  EXPECT_LE(backend_.most.load(), 2);  // the limit
  settle(*admitter);
  EXPECT_EQ(state("backend")["in_flight"].get<std::size_t>(), admitter->leases_waiting());
  s.reset();
  admitter.reset();
  const nlohmann::json st = state("backend");
  EXPECT_EQ(st["in_flight"], 0);
  EXPECT_EQ(st["accepted"].get<int>(), ok.load());
}

// A limit lowered below the calls in flight: the keep of a lease carrying a call is answered
// not kept, and the lease is released once that call ends; the next call is admitted afresh.
TEST_F(GrpcAdapters, ALeaseOverALoweredLimitIsReleasedAfterItsCall) {
  start_backend();
  auto admitter = reusing(sluice_channel(), "backend", 300ms);
  auto s = stub(admitter);
  EXPECT_TRUE(call(*s, "ok", "k").ok());
  auto other = engine_->admit(server::AdmitCall{.policy = "backend", .key = "other"});
  ASSERT_TRUE(other.ok() && other.value().admitted);  // the limit's second permit
  std::string lower = kConfig;
  lower.replace(lower.find("limit: 2"), 8, "limit: 1");
  ConfigLoad load = load_config(lower, kinds_);
  ASSERT_TRUE(load.config);
  ASSERT_TRUE(engine_->reload(*load.config).ok());
  auto held = std::async(std::launch::async, [&] { return call(*s, "hold", "k"); });
  backend_.wait_holding(1);  // on the kept lease; its keep says it is over the limit
  for (int i = 0; i < 500 && state("backend")["renewed"] != 1; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(state("backend")["in_flight"], 2);  // kept all the same while its call runs
  backend_.let_go();
  EXPECT_TRUE(held.get().ok());
  settle(*admitter);
  EXPECT_EQ(state("backend")["in_flight"], 1);  // released after the call
  EXPECT_EQ(state("backend")["released"], 1);
  EXPECT_EQ(admitter->leases_waiting(), 0u);
  ASSERT_TRUE(
      engine_->release(other.value().lease_id, server::CallResult::kSuccess, std::nullopt).ok());
  EXPECT_TRUE(call(*s, "ok", "k").ok());  // admitted afresh
  EXPECT_EQ(state("backend")["admitted"], 3);
  EXPECT_EQ(admitter->keeps_sent(), 1u);
}

// The wire: Admit says whether a lease is reusable; a Release's `earlier` is checked entry by
// entry, naming the entry, before anything is recorded; a keep answers `kept`.
TEST_F(GrpcAdapters, AReleasesEarlierCallsAreCheckedByNameAndRecorded) {
  auto sluice = v1::Sluice::NewStub(sluice_channel());
  const auto admit = [&](const std::string& policy) {
    grpc::ClientContext ctx;
    v1::AdmitRequest req;
    req.set_policy(policy);
    req.set_key("k");
    v1::AdmitResponse resp;
    EXPECT_TRUE(sluice->Admit(&ctx, req, &resp).ok());
    return resp;
  };
  const auto release = [&](const v1::ReleaseRequest& req, v1::ReleaseResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    v1::ReleaseResponse ignored;
    return sluice->Release(&ctx, req, resp != nullptr ? resp : &ignored);
  };
  const v1::AdmitResponse a = admit("backend");
  ASSERT_TRUE(a.admitted());
  EXPECT_TRUE(a.reusable());
  EXPECT_FALSE(admit("users").reusable());  // it chains a rate policy
  v1::ReleaseRequest req;
  req.set_lease_id(a.lease_id());
  req.set_keep(true);
  req.mutable_rtt()->set_nanos(3'000'000);
  v1::CallOutcome* first = req.add_earlier();
  first->set_outcome(v1::OUTCOME_SUCCESS);
  first->mutable_rtt()->set_nanos(2'000'000);
  req.add_earlier()->set_outcome(v1::OUTCOME_DROPPED);  // no rtt
  grpc::Status s = release(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "earlier[1].rtt: required");
  req.mutable_earlier(1)->mutable_rtt()->set_nanos(1'000'000);
  req.mutable_earlier(0)->set_outcome(static_cast<v1::Outcome>(99));
  s = release(req);
  EXPECT_EQ(s.error_message(), "earlier[0].outcome: unknown value 99");
  req.mutable_earlier(0)->set_outcome(v1::OUTCOME_SUCCESS);
  v1::ReleaseRequest many = req;
  for (int i = 0; i < 1023; ++i) *many.add_earlier() = req.earlier(0);
  s = release(many);
  EXPECT_EQ(s.error_message(), "earlier: at most 1024 calls, not 1025");
  nlohmann::json st = state("backend");
  EXPECT_EQ(st["renewed"], 0);  // nothing recorded by a refused Release
  EXPECT_EQ(st["dropped"], 0);
  v1::ReleaseResponse resp;
  s = release(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.kept());
  st = state("backend");
  EXPECT_EQ(st["renewed"], 3);  // the two earlier calls and this one, each followed by another
  EXPECT_EQ(st["dropped"], 1);
  EXPECT_EQ(st["in_flight"], 1);
  v1::ReleaseRequest last;
  last.set_lease_id(a.lease_id());
  *last.add_earlier() = req.earlier(0);
  ASSERT_TRUE(release(last).ok());
  st = state("backend");
  EXPECT_EQ(st["renewed"], 4);
  EXPECT_EQ(st["released"], 1);
  EXPECT_EQ(st["in_flight"], 0);
}

// A lease that waits its hold without a call is released; a policy whose leases are not
// reusable (it chains a rate policy) admits every call; a negative hold is refused by name.
TEST_F(GrpcAdapters, AKeptLeaseIsReleasedAfterItsHoldAndOnlyAReusableOneIsKept) {
  start_backend();
  auto admitter = reusing(sluice_channel(), "backend", 50ms);
  auto s = stub(admitter);
  EXPECT_TRUE(call(*s, "ok").ok());
  for (int i = 0; i < 300 && admitter->leases_waiting() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(admitter->leases_waiting(), 0u);
  settle(*admitter);
  EXPECT_EQ(state("backend")["in_flight"], 0);
  EXPECT_EQ(state("backend")["released"], 1);
  auto rated = reusing(sluice_channel(), "users", 10s);
  auto r = stub(rated);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(call(*r, "ok", "u1").ok()) << i;
  EXPECT_EQ(call(*r, "ok", "u1").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  settle(*rated);
  EXPECT_EQ(rated->calls_on_kept_leases(), 0u);
  EXPECT_EQ(rated->leases_waiting(), 0u);
  EXPECT_EQ(state("users")["admitted"], 3);
  EXPECT_EQ(state("users")["in_flight"], 0);
  RemoteOptions o;
  o.policy = "backend";
  o.lease_reuse = -1ms;
  try {
    RemoteAdmitter bad(sluice_channel(), o);
    ADD_FAILURE() << "a negative lease_reuse was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lease_reuse"), std::string::npos) << e.what();
  }
}

std::shared_ptr<RemoteRateAdmitter> rate_admitter(std::shared_ptr<grpc::Channel> channel,
                                                  const std::string& policy,
                                                  std::uint64_t allowance = 0,
                                                  std::chrono::milliseconds hold = 50ms) {
  RemoteRateOptions o;
  o.policy = policy;
  o.allowance = allowance;
  o.allowance_hold = hold;
  return std::make_shared<RemoteRateAdmitter>(std::move(channel), o);
}

TEST_F(GrpcAdapters, ARatePolicyRefusesResourceExhaustedWithRetryAfterAndNeverSends) {
  start_backend();
  auto s = stub(rate_admitter(sluice_channel(), "per-user"));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(call(*s, "ok", "u1").ok()) << i;
  std::string retry_after;
  const grpc::Status refused = call(*s, "ok", "u1", nullptr, &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("rate policy per-user"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(refused.error_message().find("u1"), std::string::npos);  // a key may be a secret
  ASSERT_FALSE(retry_after.empty());
  EXPECT_GE(std::stoi(retry_after), 1);
  EXPECT_LE(std::stoi(retry_after), 60);
  EXPECT_EQ(backend_.worked.load(), 3);  // the refused call was never sent
  EXPECT_TRUE(call(*s, "ok", "u2").ok());
  EXPECT_EQ(state("per-user")["allowed"], 4);
  EXPECT_EQ(state("per-user")["denied"], 1);
}

TEST_F(GrpcAdapters, AnAllowanceAdmitsMostCallsHereAndNeverPastTheLimit) {
  start_backend();
  auto admitter = rate_admitter(sluice_channel(), "window", 10, 60s);
  auto s = stub(admitter);
  int ok = 0;
  for (int i = 0; i < 40; ++i) ok += call(*s, "ok", "k").ok() ? 1 : 0;
  EXPECT_EQ(ok, 25);  // the window's 25, not one more
  EXPECT_EQ(backend_.worked.load(), 25);
  const AllowanceStats st = admitter->allowance_stats();
  // Blocks of 10 (the second asked in the background when the first was half spent, or by a
  // call if that had not come back), a refused one, the 5 that remained; then refused by the
  // server once and here until its retry_after. Every call answered once.
  EXPECT_EQ(st.local_admits + st.local_refusals + st.calls_asked, 40u);
  EXPECT_GE(st.local_admits, 20u);
  EXPECT_GE(st.local_refusals, 10u);
  EXPECT_EQ(st.blocks_granted + st.refills_granted, 3u);
}

// A key's steady calls: only the first waits for a Check. Each later block is asked for in the
// background when half of the one before is spent (blocks of 20: without that, every 20th
// call would wait for one).
TEST_F(GrpcAdapters, AnAllowanceRefillsInTheBackgroundSoSteadyCallsNeverWait) {
  start_backend();
  auto admitter = rate_admitter(sluice_channel(), "wide", 20, 60s);
  auto s = stub(admitter);
  for (int i = 0; i < 400; ++i) ASSERT_TRUE(call(*s, "ok", "k").ok()) << i;
  const AllowanceStats st = admitter->allowance_stats();
  EXPECT_LE(st.calls_asked, 4u);  // 1, unless a refill came back after its 10 calls
  EXPECT_GE(st.refills_granted, 16u);
  EXPECT_EQ(st.local_admits + st.calls_asked, 400u);
  // The server answered each block once: the first call's and the refills.
  EXPECT_EQ(state("wide")["allowed"], st.calls_asked + st.refills_granted);
}

TEST_F(GrpcAdapters, AllowancesSharingAKeyAdmitNoMoreThanTheServerGrants) {
  start_backend();
  std::vector<std::shared_ptr<RemoteRateAdmitter>> admitters;
  std::vector<std::future<int>> runs;
  for (int g = 0; g < 3; ++g) admitters.push_back(rate_admitter(sluice_channel(), "window", 10));
  for (int g = 0; g < 3; ++g)
    runs.push_back(std::async(std::launch::async, [&, g] {
      auto s = stub(admitters[g]);
      int ok = 0;
      for (int i = 0; i < 30; ++i) ok += call(*s, "ok", "shared").ok() ? 1 : 0;
      return ok;
    }));
  int ok = 0;
  for (auto& r : runs) ok += r.get();
  EXPECT_LE(ok, 25);
  EXPECT_EQ(backend_.worked.load(), ok);
  // The window's 25 were all granted (a call of one hit was refused); every one of them was
  // spent by a call, dropped when its hold ran out, or is held still: none lost otherwise.
  std::uint64_t dropped = 0, held = 0;
  for (const auto& a : admitters) {
    for (int i = 0; i < 500 && a->refills_in_flight() > 0; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(a->refills_in_flight(), 0u);
    dropped += a->allowance_stats().hits_dropped;
    held += a->allowance_stats().hits_held;
  }
  EXPECT_EQ(static_cast<std::uint64_t>(ok) + dropped + held, 25u);
}

// GCRA, 20 a second: one call takes a block of 10 (9 held), the bucket refills while they
// wait; then a burst. The 9 must not come on top of the refilled bucket.
TEST_F(GrpcAdapters, HitsHeldPastTheirHoldAreNotSpentOnTheNextRefill) {
  start_backend();
  // A hold of 200 ms: long enough for a block's 9 calls to the backend on a loaded machine.
  auto admitter = rate_admitter(sluice_channel(), "bucket", 10, 200ms);
  auto s = stub(admitter);
  ASSERT_TRUE(call(*s, "ok", "k").ok());
  std::this_thread::sleep_for(1200ms);
  const auto start = std::chrono::steady_clock::now();
  int burst = 0;
  for (int i = 0; i < 60; ++i) burst += call(*s, "ok", "k").ok() ? 1 : 0;
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The bucket's 20, what it refills during the burst, and a block granted in it still held.
  EXPECT_LE(burst, 20 + 20 * (took + 0.2) + 1) << took;  // without the hold: 29 and more
  EXPECT_GE(burst, 20);
  EXPECT_GE(admitter->allowance_stats().hits_dropped, 9u);
}

TEST_F(GrpcAdapters, ARateAdmitterFailsOpenOrClosedAndRefusesBadSettings) {
  start_backend();
  auto gone = grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice::testing::free_port()),
                                  grpc::InsecureChannelCredentials());
  EXPECT_TRUE(call(*stub(rate_admitter(gone, "window", 10)), "ok").ok());
  RemoteRateOptions closed;
  closed.policy = "window";
  closed.fail_open = false;
  const grpc::Status refused =
      call(*stub(std::make_shared<RemoteRateAdmitter>(gone, closed)), "ok");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find("sluice check on window"), std::string::npos)
      << refused.error_message();
  // A concurrency policy is not checked: the server says so, and the call is refused.
  const grpc::Status wrong = call(*stub(rate_admitter(sluice_channel(), "backend")), "ok");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << wrong.error_message();
  RemoteRateOptions zero;
  zero.policy = "window";
  zero.hits = 0;
  EXPECT_THROW(RemoteRateAdmitter(sluice_channel(), zero), std::invalid_argument);
}

TEST_F(GrpcAdapters, TheInProcessLibraryAdmitsTheSame) {
  start_backend();
  AdaptiveGuard guard(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 1}),
                      SteadyClock::instance());
  auto s = stub(std::make_shared<LocalAdmitter>(guard));
  auto held = std::async(std::launch::async, [&] { return call(*s, "hold"); });
  backend_.wait_holding(1);
  const grpc::Status refused = call(*s, "ok");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find("concurrency limit reached: 1"), std::string::npos)
      << refused.error_message();
  backend_.let_go();
  EXPECT_TRUE(held.get().ok());
  EXPECT_EQ(call(*s, "overload").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(call(*s, "bad").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const AdaptiveGuardStats st = guard.stats();
  EXPECT_EQ(st.in_flight, 0u);
  EXPECT_EQ(st.accepted, 3u);
  EXPECT_EQ(st.rejected, 1u);
  EXPECT_EQ(st.dropped, 1u);
  EXPECT_EQ(st.ignored, 1u);
}

TEST_F(GrpcAdapters, TheServerInterceptorRefusesAndReleasesWithTheHandlersStatus) {
  auto admitter = remote("backend");
  start_backend(admitter);
  auto plain = stub(nullptr);
  std::vector<std::future<grpc::Status>> holding = hold_two(*plain);
  const int worked = backend_.worked.load();
  const grpc::Status refused = call(*plain, "ok");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_EQ(backend_.worked.load(), worked);  // the handler's one line returned the refusal
  // A handler that does not ask: its work is done, but the caller still gets the refusal.
  backend_.check_refusal = false;
  const grpc::Status overridden = call(*plain, "ok");
  EXPECT_EQ(overridden.error_code(), grpc::StatusCode::UNAVAILABLE);
  backend_.check_refusal = true;
  backend_.let_go();
  for (auto& f : holding) EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(call(*plain, "overload").error_code(), grpc::StatusCode::UNAVAILABLE);
  settle(*admitter);
  const nlohmann::json st = state("backend");
  EXPECT_EQ(st["in_flight"], 0);
  EXPECT_EQ(st["refused_by_limit"], 2);
  EXPECT_EQ(st["dropped"], 1);
  EXPECT_EQ(st["released"], 3);
}

// A server-streaming call through the backend's Watch: the responses read, and the status.
std::pair<int, grpc::Status> watch(Health::Stub& stub, const std::string& key = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  if (!key.empty()) ctx.AddMetadata("x-sluice-key", key);
  HealthCheckRequest req;
  req.set_service(std::string(200, 'w'));  // past the short-string buffer: a leak would show
  auto reader = stub.Watch(&ctx, req);
  HealthCheckResponse resp;
  int read = 0;
  while (reader->Read(&resp)) ++read;
  return {read, reader->Finish()};
}

TEST_F(GrpcAdapters, ARegisteredServiceNeverRunsARefusedCallsHandler) {
  auto admitter = remote("backend");
  backend_.check_refusal = false;  // no line in the handler: the registration alone refuses
  start_backend(admitter, /*gated=*/true);
  auto plain = stub(nullptr);
  std::vector<std::future<grpc::Status>> holding = hold_two(*plain);
  const int worked = backend_.worked.load();
  const grpc::Status refused = call(*plain, std::string(200, 'x'));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  const auto [read, streamed] = watch(*plain);
  EXPECT_EQ(streamed.error_code(), grpc::StatusCode::UNAVAILABLE) << streamed.error_message();
  EXPECT_EQ(read, 0);
  EXPECT_EQ(backend_.worked.load(), worked);  // neither handler ran
  backend_.let_go();
  for (auto& f : holding) EXPECT_TRUE(f.get().ok());
  // Admitted: the handlers run and are released with their status.
  const auto [served, ok] = watch(*plain);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(served, 1);
  EXPECT_EQ(call(*plain, "overload").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(backend_.worked.load(), worked + 2);
  settle(*admitter);
  const nlohmann::json st = state("backend");
  EXPECT_EQ(st["in_flight"], 0);
  EXPECT_EQ(st["refused_by_limit"], 2);
  EXPECT_EQ(st["dropped"], 1);
  EXPECT_EQ(st["released"], 4);
}

TEST_F(GrpcAdapters, ARegisteredServicesRateRefusalCarriesRetryAfter) {
  auto admitter = remote("users");  // a chained rate policy: 3 a minute per key
  backend_.check_refusal = false;
  start_backend(admitter, /*gated=*/true);
  auto plain = stub(nullptr);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(call(*plain, "ok", "ann").ok());
  const int worked = backend_.worked.load();
  std::string retry_after;
  const grpc::Status refused = call(*plain, "ok", "ann", nullptr, &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_FALSE(retry_after.empty());
  EXPECT_GE(std::stoi(retry_after), 1);
  EXPECT_EQ(watch(*plain, "ann").second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(backend_.worked.load(), worked);
  EXPECT_TRUE(call(*plain, "ok", "bob").ok());  // another key's budget
  EXPECT_EQ(backend_.worked.load(), worked + 1);
}

// A client-streaming and a bidirectional method, registered by register_admitted: a refused
// call's handler never runs (nor reads a message), an admitted one holds its permit until its
// stream ends.
class Tally final : public sluice_test::v1::Tally::Service {
 public:
  std::atomic<int> worked{0};
  grpc::Status Sum(grpc::ServerContext* /*ctx*/, grpc::ServerReader<sluice_test::v1::Number>* in,
                   sluice_test::v1::Number* total) override {
    worked.fetch_add(1);
    for (sluice_test::v1::Number n; in->Read(&n);) total->set_value(total->value() + n.value());
    return grpc::Status::OK;
  }
  grpc::Status Running(
      grpc::ServerContext* /*ctx*/,
      grpc::ServerReaderWriter<sluice_test::v1::Number, sluice_test::v1::Number>* stream) override {
    worked.fetch_add(1);
    sluice_test::v1::Number total;
    for (sluice_test::v1::Number n; stream->Read(&n);) {
      total.set_value(total.value() + n.value());
      stream->Write(total);
    }
    return grpc::Status::OK;
  }
};

TEST(GrpcAdaptersStreaming, ARegisteredServiceGatesClientStreamingAndBidirectionalCalls) {
  using sluice_test::v1::Number;
  AdaptiveGuard guard(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 1}),
                      SteadyClock::instance());
  Tally tally;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  auto gated =
      register_admitted<sluice_test::v1::Tally>(b, tally, std::make_shared<LocalAdmitter>(guard));
  auto server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = sluice_test::v1::Tally::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const auto number = [](std::int64_t v) {
    Number n;
    n.set_value(v);
    return n;
  };
  const auto sum = [&](std::vector<std::int64_t> values, Number* total) {
    grpc::ClientContext ctx;
    auto writer = stub->Sum(&ctx, total);
    for (const std::int64_t v : values)
      if (!writer->Write(number(v))) break;  // a refused call may end before its writes
    writer->WritesDone();
    return writer->Finish();
  };

  // A bidirectional call holds the one permit while its stream is open.
  grpc::ClientContext held_ctx;
  auto held = stub->Running(&held_ctx);
  ASSERT_TRUE(held->Write(number(5)));
  Number running;
  ASSERT_TRUE(held->Read(&running));
  EXPECT_EQ(running.value(), 5);
  EXPECT_EQ(guard.stats().in_flight, 1u);

  Number total;
  const grpc::Status refused = sum({1, 2, 3}, &total);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("concurrency limit reached: 1"), std::string::npos)
      << refused.error_message();
  grpc::ClientContext second_ctx;
  auto second = stub->Running(&second_ctx);
  second->Write(number(1));
  second->WritesDone();
  EXPECT_FALSE(second->Read(&running));
  const grpc::Status also = second->Finish();
  EXPECT_EQ(also.error_code(), grpc::StatusCode::UNAVAILABLE) << also.error_message();
  EXPECT_EQ(tally.worked.load(), 1);  // neither refused handler ran

  ASSERT_TRUE(held->Write(number(7)));
  ASSERT_TRUE(held->Read(&running));
  EXPECT_EQ(running.value(), 12);
  held->WritesDone();
  EXPECT_TRUE(held->Finish().ok());
  // The stream's end released its permit: the next call is admitted and runs.
  const grpc::Status ok = sum({1, 2, 3}, &total);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(total.value(), 6);
  EXPECT_EQ(tally.worked.load(), 2);
  server->Shutdown(std::chrono::system_clock::now() + 5s);
  const AdaptiveGuardStats st = guard.stats();
  EXPECT_EQ(st.in_flight, 0u);
  EXPECT_EQ(st.accepted, 2u);
  EXPECT_EQ(st.rejected, 2u);
}

// The resident set in bytes (/proc/self/statm's second field, in pages).
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

TEST_F(GrpcAdapters, ARefusedCallsRequestIsFreed) {
  // The gate destroys the request a refused handler would have: 2,000 refused calls of 64 KiB
  // each would keep 128 MiB if it did not.
  auto admitter = remote("backend");
  backend_.check_refusal = false;
  start_backend(admitter, /*gated=*/true);
  auto plain = stub(nullptr);
  std::vector<std::future<grpc::Status>> holding = hold_two(*plain);
  const std::string big(64 * 1024, 'x');
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(call(*plain, big).ok());  // the steady state first
  const std::size_t before = resident_bytes();
  for (int i = 0; i < 2000; ++i) ASSERT_FALSE(call(*plain, big).ok());
  const std::size_t grown = resident_bytes() - std::min(before, resident_bytes());
  EXPECT_LT(grown, std::size_t{32} << 20) << "resident set grew by " << grown << " bytes";
  backend_.let_go();
  for (auto& f : holding) EXPECT_TRUE(f.get().ok());
}

TEST_F(GrpcAdapters, OnlyASynchronousGeneratedServiceIsGated) {
  Health::AsyncService async;
  try {
    (void)gated_service<Health>(async);
    ADD_FAILURE() << "an async service was gated";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("grpc.health.v1.Health has async methods"),
              std::string::npos)
        << e.what();
  }
  try {
    (void)gated_service(backend_, "grpc.health.v1.Wealth");
    ADD_FAILURE() << "an unknown name was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no service named 'grpc.health.v1.Wealth'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice::adapters
