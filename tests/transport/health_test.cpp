// The gRPC health service (transport/grpc_health.h) over a real grpc::Server on 127.0.0.1: the
// standard protocol (Check, Watch and their answers for an unknown service), the server-wide cap
// on open Watch streams (RESOURCE_EXHAUSTED naming server.max_watch_streams), slots given back
// when clients cancel, and shutdown ending every open Watch cleanly.
#include "transport/grpc_health.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace sluice::transport {
namespace {

using grpc::health::v1::Health;
using Request = HealthService::Request;
using Response = HealthService::Response;
using ServingStatus = HealthService::ServingStatus;
using namespace std::chrono_literals;

constexpr std::size_t kCap = 3;
const std::string kSluice = "sluice.v1.Sluice";

// One Watch call from a client; its deadline ends a test that waits for a message never sent.
struct Watching {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<Response>> reader;

  // The next status the server sends; nullopt once the stream has ended.
  std::optional<ServingStatus> next() {
    Response r;
    if (!reader->Read(&r)) return std::nullopt;
    return r.status();
  }
  grpc::Status finish() { return reader->Finish(); }
};

class GrpcHealth : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&health_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    health_.set_status("", true);
    health_.set_status(kSluice, true);
    stub_ = stub(0);
  }
  void TearDown() override {
    health_.shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 5s);
  }

  // A stub on a connection of its own for each `connection` (a channel with its own subchannel
  // pool never shares a connection with another).
  std::unique_ptr<Health::Stub> stub(int connection) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("sluice.test.connection", connection);
    return Health::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                                     grpc::InsecureChannelCredentials(), args));
  }
  static std::unique_ptr<Watching> watch(Health::Stub& stub, const std::string& service) {
    auto w = std::make_unique<Watching>();
    w->ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    Request req;
    req.set_service(service);
    w->reader = stub.Watch(&w->ctx, req);
    return w;
  }
  grpc::Status check(const std::string& service, Response& out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    Request req;
    req.set_service(service);
    return stub_->Check(&ctx, req, &out);
  }
  // Waits (up to 10 s) until the service counts `n` open Watch streams.
  bool watches_become(std::size_t n) {
    for (int i = 0; i < 1000 && health_.watches() != n; ++i) std::this_thread::sleep_for(10ms);
    return health_.watches() == n;
  }

  HealthService health_{kCap};  // outlives server_ (declared first)
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(GrpcHealth, CheckAnswersAKnownServiceAndNotFoundForAnUnknownOne) {
  Response r;
  ASSERT_TRUE(check("", r).ok());
  EXPECT_EQ(r.status(), Response::SERVING);
  ASSERT_TRUE(check(kSluice, r).ok());
  EXPECT_EQ(r.status(), Response::SERVING);
  health_.set_status(kSluice, false);
  ASSERT_TRUE(check(kSluice, r).ok());
  EXPECT_EQ(r.status(), Response::NOT_SERVING);

  const grpc::Status unknown = check("no.such.Service", r);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_message(), "service: unknown service 'no.such.Service'");
}

TEST_F(GrpcHealth, WatchSendsTheStatusAtOnceAndEachChange) {
  auto w = watch(*stub_, "");
  EXPECT_EQ(w->next(), Response::SERVING);
  health_.set_status("", true);        // unchanged: nothing sent
  health_.set_status(kSluice, false);  // another service: nothing sent on this stream
  health_.set_status("", false);
  EXPECT_EQ(w->next(), Response::NOT_SERVING);
  health_.set_status("", true);
  EXPECT_EQ(w->next(), Response::SERVING);
  w->ctx.TryCancel();
  EXPECT_EQ(w->finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GrpcHealth, WatchOfAnUnknownServiceSaysSoAndStaysOpenUntilTheServiceIsKnown) {
  auto w = watch(*stub_, "later.Service");
  EXPECT_EQ(w->next(), Response::SERVICE_UNKNOWN);
  health_.set_status("later.Service", true);
  EXPECT_EQ(w->next(), Response::SERVING);
  w->ctx.TryCancel();
  EXPECT_EQ(w->finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GrpcHealth, AWatchOverTheServerWideCapIsRefusedAndCancelledWatchesGiveTheirSlotsBack) {
  // The cap is the server's, not a connection's: the watches are on two connections and the
  // refused one on a third.
  auto a = stub(1), b = stub(2), c = stub(3);
  std::vector<std::unique_ptr<Watching>> open;
  open.push_back(watch(*a, ""));
  open.push_back(watch(*a, kSluice));
  open.push_back(watch(*b, ""));
  for (auto& w : open) ASSERT_EQ(w->next(), Response::SERVING);
  EXPECT_EQ(health_.watches(), kCap);

  auto refused = watch(*c, "");
  EXPECT_EQ(refused->next(), std::nullopt);
  const grpc::Status s = refused->finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "health: 3 Watch streams are open (server.max_watch_streams); try again later or use "
            "Check");
  EXPECT_EQ(health_.watches(), kCap);
  Response r;  // Check still answers
  ASSERT_TRUE(check("", r).ok());
  EXPECT_EQ(r.status(), Response::SERVING);

  // The clients cancel: every slot comes back, and a new Watch is served.
  for (auto& w : open) {
    w->ctx.TryCancel();
    EXPECT_EQ(w->finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(watches_become(0)) << health_.watches() << " still counted";
  EXPECT_EQ(health_.watches_ended(), kCap);  // served ones only, not the refused one
  auto again = watch(*c, "");
  EXPECT_EQ(again->next(), Response::SERVING);
  auto more = watch(*c, kSluice);
  EXPECT_EQ(more->next(), Response::SERVING);
  EXPECT_EQ(health_.watches(), 2U);
  again->ctx.TryCancel();
  more->ctx.TryCancel();
  (void)again->finish();
  (void)more->finish();
}

TEST_F(GrpcHealth, AWatchNamingAServiceLongerThanTheBoundIsRefused) {
  auto w = watch(*stub_, std::string(HealthService::kMaxServiceName + 1, 'x'));
  EXPECT_EQ(w->next(), std::nullopt);
  const grpc::Status s = w->finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "service: longer than 1024 bytes");
  EXPECT_EQ(health_.watches(), 0U);
}

TEST_F(GrpcHealth, ShutdownTellsEveryWatchNotServingAndEndsItCleanly) {
  auto serving = watch(*stub_, "");
  auto unknown = watch(*stub_, "no.such.Service");
  ASSERT_EQ(serving->next(), Response::SERVING);
  ASSERT_EQ(unknown->next(), Response::SERVICE_UNKNOWN);

  health_.shutdown();
  EXPECT_EQ(serving->next(), Response::NOT_SERVING);
  EXPECT_EQ(serving->next(), std::nullopt);
  EXPECT_TRUE(serving->finish().ok());
  EXPECT_EQ(unknown->next(), std::nullopt);
  EXPECT_TRUE(unknown->finish().ok());
  EXPECT_TRUE(watches_become(0));

  // Afterwards: statuses stay NOT_SERVING, and a Watch gets the status and ends at once.
  health_.set_status("", true);
  Response r;
  ASSERT_TRUE(check("", r).ok());
  EXPECT_EQ(r.status(), Response::NOT_SERVING);
  auto late = watch(*stub_, kSluice);
  EXPECT_EQ(late->next(), Response::NOT_SERVING);
  EXPECT_EQ(late->next(), std::nullopt);
  EXPECT_TRUE(late->finish().ok());
}

// Statuses flipping while messages are on their way: a Watch never sees the same status twice in
// a row, and shutdown's NOT_SERVING is its last message before a clean end.
TEST_F(GrpcHealth, ChangesFasterThanTheStreamAreCoalescedToTheLatest) {
  auto w = watch(*stub_, "");
  ASSERT_EQ(w->next(), Response::SERVING);
  for (int i = 0; i < 2000; ++i) health_.set_status("", i % 2 == 1);  // ends SERVING
  health_.shutdown();
  std::vector<ServingStatus> seen = {Response::SERVING};
  while (auto s = w->next()) seen.push_back(*s);
  EXPECT_TRUE(w->finish().ok());
  for (std::size_t i = 1; i < seen.size(); ++i) ASSERT_NE(seen[i], seen[i - 1]) << "at " << i;
  EXPECT_EQ(seen.back(), Response::NOT_SERVING);
}

}  // namespace
}  // namespace sluice::transport
